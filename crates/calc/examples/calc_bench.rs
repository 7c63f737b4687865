//! Calculation-graph benchmark at the scale.
//!
//! `cargo run --release -p margay-calc --example calc_bench -- [--endpoints N] [--local N]
//!  [--policies N] [--updates N]`
//!
//! 1. Initial calculation: N endpoints across 1,000 nodes (`--local` of them on this node),
//!    `--policies` policies (namespaced and global, with selector and namespace-selector
//!    rules), 100 namespaces; everything fed to a fresh graph and flushed once. Prints the
//!    time, RSS, and the size of the result (active policies, IP sets, members).
//! 2. Steady state: `--updates` remote endpoint updates (label and address changes that move
//!    endpoints in and out of IP sets), each followed by a flush; prints throughput and the
//!    latency distribution from input to emitted messages.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use margay_api::endpoint::{NodeBgpSpec, NodeSpec, WorkloadEndpointSpec};
use margay_api::ippool::IPPoolSpec;
use margay_api::policy::{
    EntityRule, GlobalNetworkPolicySpec, NetworkPolicySpec, ProfileSpec, Rule,
};
use margay_api::{
    GlobalNetworkPolicy, IPPool, NetworkPolicy, Node, ObjectMeta, Profile, Resource,
    WorkloadEndpoint,
};
use margay_calc::{CalcConfig, CalcGraph, Message, RouteSource};

const NODES: usize = 1000;
const NAMESPACES: usize = 100;
const APPS: usize = 2000;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let get = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    };
    (get("VmRSS:"), get("VmHWM:"))
}

fn node_name(i: usize) -> String {
    if i == 0 {
        "local-node".to_string()
    } else {
        format!("node-{i}")
    }
}

fn wep(i: usize, local: usize, app_shift: usize) -> WorkloadEndpoint {
    // The first `local` endpoints live on this node; the rest spread over the others.
    let node = if i < local { 0 } else { 1 + i % (NODES - 1) };
    let ns = format!("ns{}", i % NAMESPACES);
    let pod = format!("pod-{i}");
    let mut meta =
        ObjectMeta::namespaced(ns.clone(), format!("{}-k8s-{pod}-eth0", node_name(node)));
    meta.labels = BTreeMap::from([
        ("app".to_string(), format!("app{}", (i + app_shift) % APPS)),
        (
            "tier".to_string(),
            ["frontend", "backend", "db"][i % 3].to_string(),
        ),
        ("version".to_string(), format!("v{}", i % 5)),
    ]);
    let ip = format!("10.{}.{}.{}", 64 + i / 65536, (i / 256) % 256, i % 256);
    WorkloadEndpoint::new(
        meta,
        WorkloadEndpointSpec {
            orchestrator: "k8s".into(),
            node: node_name(node),
            pod,
            endpoint: "eth0".into(),
            interface_name: format!("cali{i:011x}"),
            ip_networks: vec![format!("{ip}/32")],
            profiles: vec![format!("kns.{ns}")],
            ..WorkloadEndpointSpec::default()
        },
    )
}

fn policies(n: usize) -> Vec<Resource> {
    let mut out = Vec::new();
    for i in 0..n {
        // Every app lives in one namespace (app j in ns j % 100), so each namespaced policy
        // selects its app's endpoints and its peers in the same namespace.
        let app_n = (i * 7) % APPS;
        let app = format!("app{app_n}");
        let peer = format!("app{}", (app_n + NAMESPACES * (1 + i % 19)) % APPS);
        if i % 10 == 0 {
            // Global: tier-wide rules with namespace selectors.
            let mut ingress = Rule::new(margay_api::policy::Action::Allow);
            ingress.source = EntityRule {
                selector: format!("tier == 'frontend' && version == 'v{}'", i % 5),
                namespace_selector: format!("team == 't{}'", i % 10),
                ..EntityRule::default()
            };
            out.push(Resource::from(GlobalNetworkPolicy::new(
                ObjectMeta::named(format!("gnp-{i}")),
                GlobalNetworkPolicySpec {
                    order: Some(i as f64),
                    selector: format!("tier == 'db' && app == '{app}'"),
                    ingress: vec![ingress],
                    ..GlobalNetworkPolicySpec::default()
                },
            )));
        } else {
            let ns = format!("ns{}", app_n % NAMESPACES);
            let mut ingress = Rule::new(margay_api::policy::Action::Allow);
            ingress.source = EntityRule {
                selector: format!("app == '{peer}'"),
                ..EntityRule::default()
            };
            let mut egress = Rule::new(margay_api::policy::Action::Allow);
            egress.destination = EntityRule {
                selector: format!("app == '{peer}' && tier == 'db'"),
                namespace_selector: "all()".into(),
                ..EntityRule::default()
            };
            out.push(Resource::from(NetworkPolicy::new(
                ObjectMeta::namespaced(ns, format!("np-{i}")),
                NetworkPolicySpec {
                    order: Some((i % 100) as f64),
                    selector: format!("app == '{app}'"),
                    ingress: vec![ingress],
                    egress: if i % 3 == 0 { vec![egress] } else { Vec::new() },
                    ..NetworkPolicySpec::default()
                },
            )));
        }
    }
    out
}

fn scenario(endpoints: usize, local: usize, n_policies: usize) -> Vec<Resource> {
    let mut out = Vec::new();
    for n in 0..NODES {
        out.push(Resource::from(Node::new(
            ObjectMeta::named(node_name(n)),
            NodeSpec {
                bgp: Some(NodeBgpSpec {
                    ipv4_address: format!("172.16.{}.{}/16", n / 256, n % 256),
                    ..NodeBgpSpec::default()
                }),
                ipv4_vxlan_tunnel_addr: format!("10.200.{}.{}", n / 256, n % 256),
                ..NodeSpec::default()
            },
        )));
    }
    out.push(Resource::from(IPPool::new(
        ObjectMeta::named("default-ipv4-ippool"),
        IPPoolSpec {
            cidr: "10.64.0.0/10".into(),
            vxlan_mode: Some(margay_api::ippool::EncapMode::Always),
            nat_outgoing: true,
            ..IPPoolSpec::default()
        },
    )));
    for ns in 0..NAMESPACES {
        out.push(Resource::from(Profile::new(
            ObjectMeta::named(format!("kns.ns{ns}")),
            ProfileSpec {
                labels_to_apply: BTreeMap::from([
                    ("pcns.team".to_string(), format!("t{}", ns % 10)),
                    ("pcns.projectcalico.org/name".to_string(), format!("ns{ns}")),
                ]),
                ingress: vec![Rule::new(margay_api::policy::Action::Allow)],
                egress: vec![Rule::new(margay_api::policy::Action::Allow)],
            },
        )));
    }
    for i in 0..endpoints {
        out.push(Resource::from(wep(i, local, 0)));
    }
    out.extend(policies(n_policies));
    out
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn main() {
    let endpoints = arg("--endpoints", 100_000);
    let local = arg("--local", 200);
    let n_policies = arg("--policies", 2_000);
    let updates = arg("--updates", 20_000);

    let resources = scenario(endpoints, local, n_policies);
    let (rss_before, _) = rss_mib();
    println!(
        "scenario: {} resources ({endpoints} endpoints, {local} local, {n_policies} policies, {NODES} nodes, {NAMESPACES} namespaces); RSS before graph {rss_before:.0} MiB",
        resources.len()
    );

    let mut graph = CalcGraph::new(CalcConfig {
        hostname: node_name(0),
        route_source: RouteSource::CalicoIpam,
    });
    let start = Instant::now();
    for r in resources {
        let key = r.key();
        graph.on_update(&key, Some(r));
    }
    let fed = start.elapsed();
    graph.on_in_sync();
    let msgs = graph.flush();
    let total = start.elapsed();
    let (rss, hwm) = rss_mib();
    let counts = graph.counts();
    let members: usize = msgs
        .iter()
        .map(|m| match m {
            Message::IpSetUpdate { members, .. } => members.len(),
            _ => 0,
        })
        .sum();
    println!(
        "initial calculation: {:.3} s (updates {:.3} s, flush {:.3} s); {} messages; RSS {rss:.0} MiB (peak {hwm:.0} MiB)",
        total.as_secs_f64(),
        fed.as_secs_f64(),
        (total - fed).as_secs_f64(),
        msgs.len()
    );
    println!(
        "  result: {} local endpoints, {} active policies of {}, {} active profiles, {} IP sets with {members} members, {} routes, {} VTEPs, {} selector evaluations",
        counts.local_endpoints,
        counts.active_policies,
        counts.policies,
        counts.active_profiles,
        counts.active_ip_sets,
        counts.routes,
        counts.vteps,
        counts.selector_evaluations
    );
    drop(msgs);

    // Steady state: remote endpoints change labels (moving between IP sets) and addresses.
    let mut latencies = Vec::with_capacity(updates);
    let mut emitted = 0usize;
    let start = Instant::now();
    for u in 0..updates {
        let i = local + (u * 7919) % (endpoints - local).max(1);
        let mut w = wep(i, local, 1 + u % 3);
        if u % 2 == 0 {
            w.spec.ip_networks = vec![format!(
                "10.{}.{}.{}/32",
                100 + u / 65536,
                (u / 256) % 256,
                u % 256
            )];
        }
        let r = Resource::from(w);
        let key = r.key();
        let t = Instant::now();
        graph.on_update(&key, Some(r));
        emitted += graph.flush().len();
        latencies.push(t.elapsed());
    }
    let elapsed = start.elapsed();
    latencies.sort_unstable();
    println!(
        "steady state: {updates} remote endpoint updates in {:.3} s = {:.0} updates/s (each flushed alone); latency p50 {:?} p90 {:?} p99 {:?} max {:?}; {emitted} messages",
        elapsed.as_secs_f64(),
        updates as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.9),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default(),
    );

    // Batched, as Felix runs it (one flush per ~100 updates).
    let start = Instant::now();
    let mut flushes = 0;
    for u in 0..updates {
        let i = local + (u * 104_729) % (endpoints - local).max(1);
        let r = Resource::from(wep(i, local, 2 + u % 5));
        let key = r.key();
        graph.on_update(&key, Some(r));
        if u % 100 == 99 {
            graph.flush();
            flushes += 1;
        }
    }
    graph.flush();
    let elapsed = start.elapsed();
    println!(
        "batched: {updates} updates in {:.3} s = {:.0} updates/s ({flushes} flushes)",
        elapsed.as_secs_f64(),
        updates as f64 / elapsed.as_secs_f64()
    );
    let (rss, hwm) = rss_mib();
    println!("final RSS {rss:.0} MiB (peak {hwm:.0} MiB)");
}
