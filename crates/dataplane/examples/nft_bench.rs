//! nftables programming benchmark (needs root; works inside a throw-away namespace).
//!
//! `cargo run --release -p margay-dataplane --example nft_bench -- [--policies 1000]
//!  [--endpoints 100] [--members 10000] [--changes 50]`
//!
//! 1. Cold programming: the calculation graph's output for `--policies` policies over
//!    `--endpoints` local endpoints and `--members` remote endpoints (IP-set members), written
//!    into an empty table: render, diff and `nft -f` timed separately.
//! 2. One policy change at a time: datastore update → graph → render → diff → nft, the
//!    latency distribution over `--changes` changes.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use margay_api::endpoint::WorkloadEndpointSpec;
use margay_api::numorstring::{Port, Protocol};
use margay_api::policy::{Action, EntityRule, GlobalNetworkPolicySpec, ProfileSpec, Rule};
use margay_api::{GlobalNetworkPolicy, ObjectMeta, Profile, Resource, WorkloadEndpoint};
use margay_calc::{CalcConfig, CalcGraph};
use margay_dataplane::nft::{NftConfig, NftRunner};
use margay_dataplane::nft_driver::{NftDriver, NftDriverConfig};
use margay_testkit::netns::Netns;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn wep(i: usize, local: bool) -> Resource {
    let node = if local {
        "bench-node".to_string()
    } else {
        format!("remote-{}", i % 50)
    };
    let pod = format!("pod{i}");
    let mut meta = ObjectMeta::namespaced(
        "default",
        format!("{node}-k8s-{pod}-eth0")
            .replace("bench-node", "bench--node")
            .replace("remote-", "remote--"),
    );
    meta.labels = BTreeMap::from([
        ("app".to_string(), format!("app{}", i % 100)),
        ("role".to_string(), format!("r{}", i % 100)),
    ]);
    Resource::from(WorkloadEndpoint::new(
        meta,
        WorkloadEndpointSpec {
            orchestrator: "k8s".into(),
            node,
            pod,
            endpoint: "eth0".into(),
            interface_name: format!("cali{i:011}"),
            ip_networks: vec![format!(
                "10.{}.{}.{}/32",
                64 + i / 65536,
                (i / 256) % 256,
                i % 256
            )],
            profiles: vec!["kns.default".into()],
            ..WorkloadEndpointSpec::default()
        },
    ))
}

fn policy(i: usize, port: u16) -> Resource {
    let mut ingress = Rule::new(Action::Allow);
    ingress.protocol = Some(Protocol::Name("TCP".into()));
    ingress.source = EntityRule {
        selector: format!("role == 'r{}'", (i * 7) % 100),
        ..EntityRule::default()
    };
    ingress.destination = EntityRule {
        ports: vec![Port::Single(port), Port::Range(9000, 9100)],
        ..EntityRule::default()
    };
    let mut egress = Rule::new(Action::Allow);
    egress.destination = EntityRule {
        nets: vec!["192.168.0.0/16".into()],
        ..EntityRule::default()
    };
    Resource::from(GlobalNetworkPolicy::new(
        ObjectMeta::named(format!("pol-{i}")),
        GlobalNetworkPolicySpec {
            order: Some(i as f64),
            selector: format!("app == 'app{}'", i % 100),
            ingress: vec![ingress],
            egress: vec![egress],
            ..GlobalNetworkPolicySpec::default()
        },
    ))
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted
        .get(((sorted.len().max(1) - 1) as f64 * p).round() as usize)
        .copied()
        .unwrap_or_default()
}

fn main() {
    let policies = arg("--policies", 1000);
    let endpoints = arg("--endpoints", 100);
    let members = arg("--members", 10_000);
    let changes = arg("--changes", 50);
    let ns = Netns::new("nft-bench").expect("a network namespace (run as root)");

    let mut graph = CalcGraph::new(CalcConfig {
        hostname: "bench-node".into(),
        ..CalcConfig::default()
    });
    let profile = Resource::from(Profile::new(
        ObjectMeta::named("kns.default"),
        ProfileSpec {
            ingress: vec![Rule::new(Action::Allow)],
            egress: vec![Rule::new(Action::Allow)],
            ..ProfileSpec::default()
        },
    ));
    graph.on_update(&profile.key(), Some(profile));
    for i in 0..endpoints {
        let r = wep(i, true);
        graph.on_update(&r.key(), Some(r));
    }
    for i in 0..members {
        let r = wep(endpoints + i, false);
        graph.on_update(&r.key(), Some(r));
    }
    for i in 0..policies {
        let r = policy(i, 80);
        graph.on_update(&r.key(), Some(r));
    }
    graph.on_in_sync();
    let msgs = graph.flush();
    let counts = graph.counts();
    println!(
        "model: {} local endpoints, {} active policies, {} IP sets with {} members",
        counts.local_endpoints,
        counts.active_policies,
        counts.active_ip_sets,
        counts.ip_set_members
    );

    let (mut driver, stats) = NftDriver::new(NftDriverConfig {
        nft: NftConfig::default(),
        runner: NftRunner {
            netns: Some(ns.name().to_string()),
            ..NftRunner::default()
        },
        refresh_interval: Duration::ZERO,
        flowtable_extra_devices: None,
    });
    let mut model = margay_calc::DataplaneModel::default();
    model.apply_all(&msgs).unwrap();
    driver.mark_dirty();
    let t = Instant::now();
    let tx = driver.sync(&model).unwrap();
    let cold = t.elapsed();
    {
        let s = stats.lock();
        println!(
            "cold programming: {:.3} s for {} chains, {} rules, {} set/map elements ({tx:?})",
            cold.as_secs_f64(),
            s.chains,
            s.rules,
            s.elements
        );
    }

    // Refresh (read-back and compare) cost, with nothing to repair.
    let t = Instant::now();
    let repaired = driver.refresh(&model).unwrap();
    println!(
        "refresh (read back and compare): {:.3} s, repaired: {repaired}",
        t.elapsed().as_secs_f64()
    );

    // What does nft itself cost on a table this size?
    let runner = NftRunner {
        netns: Some(ns.name().to_string()),
        ..NftRunner::default()
    };
    for (what, script) in [
        ("no-op", "add table inet margay\n".to_string()),
        ("one small chain", "add table inet margay\nadd chain inet margay probe\nflush chain inet margay probe\nadd rule inet margay probe accept\n".to_string()),
        ("one chain with a set reference", "add table inet margay\nadd chain inet margay probe2\nadd rule inet margay probe2 ip saddr @all-pools-4 accept\n".to_string()),
        ("declare a new set", "add set inet margay probe-set { type ipv4_addr; flags interval; }\n".to_string()),
        ("delete a chain", "delete chain inet margay probe2\n".to_string()),
        ("one set element", "add element inet margay all-pools-4 { 10.99.0.0/16 }\n".to_string()),
        ("one non-interval set element", "add element inet margay wl-ifaces { \"calizzz\" }\n".to_string()),
        ("delete one set element", "delete element inet margay all-pools-4 { 10.99.0.0/16 }\n".to_string()),
        ("one map element", "add element inet margay wl-ingress { \"calizzz\" : jump probe }\n".to_string()),
    ] {
        let t = Instant::now();
        runner.apply(&script).unwrap();
        println!("nft -f on this table, {what}: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    }

    let mut lat = Vec::new();
    for c in 0..changes {
        let r = policy(c % policies.max(1), 81 + c as u16);
        let t = Instant::now();
        graph.on_update(&r.key(), Some(r));
        let msgs = graph.flush();
        model.apply_all(&msgs).unwrap();
        driver.mark_dirty();
        driver.sync(&model).unwrap();
        lat.push(t.elapsed());
        if c == changes - 1 {
            let s = stats.lock();
            println!(
                "last change: render {:.1} ms, diff {:.1} ms, nft {:.1} ms",
                s.last_render_seconds * 1e3,
                s.last_diff_seconds * 1e3,
                s.last_nft_seconds * 1e3
            );
        }
    }
    lat.sort_unstable();
    println!(
        "one policy change, datastore update to kernel: p50 {:.1} ms p99 {:.1} ms max {:.1} ms ({changes} changes)",
        pct(&lat, 0.5).as_secs_f64() * 1e3,
        pct(&lat, 0.99).as_secs_f64() * 1e3,
        lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
}
