//! Datapath cost of margay's policy (needs root; everything in throw-away namespaces).
//!
//! `cargo run --release -p margay-dataplane --example datapath_bench -- [--policies 1000]
//!  [--members 10000] [--secs 5] [--bpf]`
//!
//! Two pods behind a node namespace, wired as the CNI plugin wires them. Measures pod-to-pod
//! TCP throughput (iperf3) and TCP connection rate, first with no margay table, then with
//! `--policies` policies applying to the two pods (their allow rule last) and `--members`
//! IP-set members programmed.
//!
//! `--bpf`: the same policy in the eBPF dataplane's programs and maps (crates/bpf) instead of
//! nftables, measured with flow events off, then on with a reader draining the ring buffer and
//! naming each event's rule (as Felix's flow logs do).
//!
//! Internal: `--connect-loop ADDR SECS` (run inside the client pod) opens and closes TCP
//! connections for SECS seconds and prints how many succeeded.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use margay_api::endpoint::WorkloadEndpointSpec;
use margay_api::numorstring::{Port, Protocol};
use margay_api::policy::{Action, EntityRule, GlobalNetworkPolicySpec, ProfileSpec, Rule};
use margay_api::{GlobalNetworkPolicy, ObjectMeta, Profile, Resource, WorkloadEndpoint};
use margay_calc::{CalcConfig, CalcGraph, DataplaneModel};
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

struct Kill(Vec<Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn connect_loop(addr: &str, secs: u64) {
    let addr: SocketAddr = addr.parse().unwrap();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut ok = 0u64;
    while Instant::now() < end {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
            ok += 1;
        }
    }
    println!("{ok}");
}

fn accept_loop(port: u16) {
    let listener = std::net::TcpListener::bind(("0.0.0.0", port)).unwrap();
    for conn in listener.incoming() {
        drop(conn);
    }
}

fn wep(name: &str, node: &str, ip: &str, iface: &str, app: &str, role: &str) -> Resource {
    let mut meta = ObjectMeta::namespaced("default", format!("{node}-k8s-{name}-eth0"));
    meta.labels = BTreeMap::from([
        ("app".to_string(), app.to_string()),
        ("role".to_string(), role.to_string()),
    ]);
    Resource::from(WorkloadEndpoint::new(
        meta,
        WorkloadEndpointSpec {
            orchestrator: "k8s".into(),
            node: node.into(),
            pod: name.into(),
            endpoint: "eth0".into(),
            interface_name: iface.into(),
            ip_networks: vec![format!("{ip}/32")],
            profiles: vec!["kns.default".into()],
            ..WorkloadEndpointSpec::default()
        },
    ))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--accept-loop") {
        accept_loop(args[i + 1].parse().unwrap());
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--connect-loop") {
        connect_loop(&args[i + 1], args[i + 2].parse().unwrap());
        return;
    }
    let policies = arg("--policies", 1000);
    let members = arg("--members", 10_000);
    let secs = arg("--secs", 5) as u64;

    let node = Netns::new("dp-node").expect("a namespace (run as root)");
    node.sysctl("net.ipv4.ip_forward", "1").unwrap();
    node.add_veth("uplink0", "uplink1", &["192.0.2.1/24"])
        .unwrap();
    node.ip(&[
        "route",
        "add",
        "default",
        "via",
        "192.0.2.254",
        "dev",
        "uplink0",
    ])
    .unwrap();
    let mut pods = Vec::new();
    for (name, ip, iface) in [
        ("a", "10.65.0.1", "calibencha0"),
        ("b", "10.65.0.2", "calibenchb0"),
    ] {
        let ns = node.add_pod(&format!("dp-{name}"), ip, iface).unwrap();
        pods.push(ns);
    }
    // Each connection leaves the client a socket in TIME_WAIT for 60 s: without these the
    // ports run out within seconds and the next run measures port exhaustion, not the
    // datapath (both settings are the client namespace's own).
    pods[0]
        .sysctl("net.ipv4.ip_local_port_range", "1024 65535")
        .unwrap();
    pods[0].sysctl("net.ipv4.tcp_tw_reuse", "1").unwrap();
    let mut servers = Kill(Vec::new());
    servers.0.push(
        pods[1]
            .exec("iperf3")
            .args(["-s", "-p", "5201"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    servers.0.push(
        pods[1]
            .exec(std::env::current_exe().unwrap())
            .args(["--accept-loop", "80"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));

    let measure = |label: &str| {
        let out = pods[0]
            .exec("iperf3")
            .args([
                "-c",
                "10.65.0.2",
                "-p",
                "5201",
                "-t",
                &secs.to_string(),
                "-J",
            ])
            .output()
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let gbps = json["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0)
            / 1e9;
        let exe = std::env::current_exe().unwrap();
        let out = pods[0]
            .exec(exe)
            .args(["--connect-loop", "10.65.0.2:80", &secs.to_string()])
            .output()
            .unwrap();
        let conns: f64 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0.0);
        let rate = conns / secs as f64;
        println!("{label}: TCP throughput {gbps:.2} Gbit/s, connection rate {rate:.0}/s");
        (gbps, rate)
    };
    let (base_tput, base_rate) = measure("no margay rules");
    let (b2, r2) = measure("no margay rules (again)");
    let (base_tput, base_rate) = ((base_tput + b2) / 2.0, (base_rate + r2) / 2.0);

    // Program the policy: many policies select both pods; the one allowing traffic is last.
    let mut graph = CalcGraph::new(CalcConfig {
        hostname: "dpnode".into(),
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
    for r in [
        wep("a", "dpnode", "10.65.0.1", "calibencha0", "bench", "client"),
        wep("b", "dpnode", "10.65.0.2", "calibenchb0", "bench", "server"),
    ] {
        graph.on_update(&r.key(), Some(r));
    }
    for i in 0..members {
        let r = wep(
            &format!("m{i}"),
            &format!("remote{}", i % 50),
            &format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256),
            &format!("calim{i}"),
            &format!("app{}", i % 100),
            &format!("r{}", i % 100),
        );
        graph.on_update(&r.key(), Some(r));
    }
    for i in 0..policies {
        let mut ingress = Rule::new(Action::Allow);
        ingress.protocol = Some(Protocol::Name("TCP".into()));
        ingress.source = EntityRule {
            selector: format!("role == 'r{}'", i % 100),
            ..EntityRule::default()
        };
        ingress.destination = EntityRule {
            ports: vec![Port::Single(8000 + (i % 1000) as u16)],
            ..EntityRule::default()
        };
        let last = i + 1 == policies;
        let rules = if last {
            vec![Rule::new(Action::Allow)]
        } else {
            vec![ingress]
        };
        let r = Resource::from(GlobalNetworkPolicy::new(
            ObjectMeta::named(format!("p{i}")),
            GlobalNetworkPolicySpec {
                order: Some(i as f64),
                selector: "app == 'bench'".into(),
                ingress: rules.clone(),
                egress: rules,
                ..GlobalNetworkPolicySpec::default()
            },
        ));
        graph.on_update(&r.key(), Some(r));
    }
    graph.on_in_sync();
    let mut model = DataplaneModel::default();
    model.apply_all(&graph.flush()).unwrap();
    if args.iter().any(|a| a == "--bpf") {
        bpf_bench(&node, &model, &measure, (base_tput, base_rate));
        return;
    }
    let (mut driver, stats) = NftDriver::new(NftDriverConfig {
        nft: NftConfig::default(),
        runner: NftRunner {
            netns: Some(node.name().to_string()),
            ..NftRunner::default()
        },
        refresh_interval: Duration::ZERO,
        flowtable_extra_devices: None,
    });
    driver.mark_dirty();
    driver.sync(&model).unwrap();
    {
        let s = stats.lock();
        let counts = graph.counts();
        println!(
            "programmed: {} policies on each pod, {} IP sets with {} members, {} rules",
            counts.active_policies, counts.active_ip_sets, counts.ip_set_members, s.rules
        );
    }
    let (tput, rate) = measure("with margay policy");
    let (t2, q2) = measure("with margay policy (again)");
    let (tput, rate) = ((tput + t2) / 2.0, (rate + q2) / 2.0);
    println!(
        "ratio: throughput {:.0}%, connection rate {:.0}% of no-rules",
        100.0 * tput / base_tput.max(f64::MIN_POSITIVE),
        100.0 * rate / base_rate.max(f64::MIN_POSITIVE)
    );

    // The same policy with flow logs on (FlowLogsLocalReporter): every verdict logs to NFLOG
    // and a reader (as Felix's) drains groups 1 and 2 in the node's namespace.
    drop(driver);
    let (mut driver, _) = NftDriver::new(NftDriverConfig {
        nft: NftConfig {
            flow_logs: true,
            ..NftConfig::default()
        },
        runner: NftRunner {
            netns: Some(node.name().to_string()),
            ..NftRunner::default()
        },
        refresh_interval: Duration::ZERO,
        flowtable_extra_devices: None,
    });
    driver.mark_dirty();
    driver.sync(&model).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let logged = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let ns_file = std::fs::File::open(format!("/var/run/netns/{}", node.name())).unwrap();
    let mut readers = Vec::new();
    for group in [1u16, 2] {
        let (stop, logged) = (stop.clone(), logged.clone());
        let ns_file = ns_file.try_clone().unwrap();
        readers.push(std::thread::spawn(move || {
            margay_netlink::netns::run_in(&ns_file, || {
                let mut log = margay_netlink::nflog::Nflog::bind(group, 80)?;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let n = log.recv(Duration::from_millis(100))?.len();
                    logged.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(())
            })
        }));
    }
    let (ftput, frate) = measure("with margay policy and flow logs");
    let (f2, g2) = measure("with margay policy and flow logs (again)");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        let _ = r.join();
    }
    let (ftput, frate) = ((ftput + f2) / 2.0, (frate + g2) / 2.0);
    println!(
        "flow logs: {} packets logged; throughput {:.0}%, connection rate {:.0}% of the same policy without flow logs",
        logged.load(std::sync::atomic::Ordering::Relaxed),
        100.0 * ftput / tput.max(f64::MIN_POSITIVE),
        100.0 * frate / rate.max(f64::MIN_POSITIVE)
    );
}

/// Runs `f` on a thread that joined `ns` (the programs attach in the caller's namespace).
fn in_ns<R: Send>(ns: &Netns, f: impl FnOnce() -> R + Send) -> R {
    let path = format!("/run/netns/{}", ns.name());
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
        .join()
        .unwrap()
    })
}

/// A bpffs of the benchmark's own on a temporary directory, unmounted on drop.
struct Bpffs(tempfile::TempDir);

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

type Measure<'a> = &'a dyn Fn(&str) -> (f64, f64);

fn bpf_bench(node: &Netns, model: &DataplaneModel, measure: Measure<'_>, base: (f64, f64)) {
    use margay_bpf::flows::FlowReader;
    use margay_dataplane::bpf_driver::BpfFlowSource;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let fs = Bpffs(tempfile::tempdir().unwrap());
    margay_bpf::loader::ensure_bpffs(fs.0.path()).unwrap();
    let pins = fs.0.path().join("bench");
    let mut syncer = margay_bpf::sync::Syncer::new(Default::default());
    let (maps, names) = in_ns(node, || {
        let mut maps = margay_bpf::loader::BpfMaps::load(&pins).unwrap();
        let r = syncer.sync(model, &mut maps).unwrap();
        let (blocks, rules) = syncer.num_blocks();
        println!(
            "eBPF: {blocks} blocks, {rules} rules, {} steps written, {} set entries",
            r.steps_written,
            syncer.num_set_entries()
        );
        (maps, syncer.flow_names())
    });
    // Flow events off and on in alternating rounds (the machine's load drifts): a reader
    // drains the ring buffer throughout and names each event's rule, as Felix's flow logs do.
    let stop = Arc::new(AtomicBool::new(false));
    let (read, named) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut reader = FlowReader::open_with(&pins, false).unwrap();
    let mut switch = FlowReader::open_with(&pins, false).unwrap();
    let names = Arc::new(names);
    let t = {
        let (stop, read, named) = (stop.clone(), read.clone(), named.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                reader.poll(Duration::from_millis(100), 10_000, |e| {
                    read.fetch_add(1, Ordering::Relaxed);
                    if BpfFlowSource::resolve(&names, &e).is_some() {
                        named.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            reader.drops()
        })
    };
    let rounds = arg("--rounds", 3);
    let (mut off, mut on) = ((0.0, 0.0), (0.0, 0.0));
    for i in 0..rounds {
        switch.set_enabled(false).unwrap();
        let (t, r) = measure(&format!("eBPF policy, flow events off (round {})", i + 1));
        off = (off.0 + t, off.1 + r);
        switch.set_enabled(true).unwrap();
        let (t, r) = measure(&format!("eBPF policy, flow events on (round {})", i + 1));
        on = (on.0 + t, on.1 + r);
    }
    switch.set_enabled(false).unwrap();
    stop.store(true, Ordering::Relaxed);
    let drops = t.join().unwrap();
    let n = rounds.max(1) as f64;
    let (tput, rate) = (off.0 / n, off.1 / n);
    let (ftput, frate) = (on.0 / n, on.1 / n);
    println!(
        "eBPF policy: throughput {:.0}%, connection rate {:.0}% of no-rules",
        100.0 * tput / base.0.max(f64::MIN_POSITIVE),
        100.0 * rate / base.1.max(f64::MIN_POSITIVE)
    );
    println!(
        "eBPF flow events: {} read ({} named a rule), {drops} dropped (ring buffer full); throughput {:.0}%, connection rate {:.0}% of the same policy without flow events",
        read.load(Ordering::Relaxed),
        named.load(Ordering::Relaxed),
        100.0 * ftput / tput.max(f64::MIN_POSITIVE),
        100.0 * frate / rate.max(f64::MIN_POSITIVE)
    );
    // Detach: removing the pins removes the links.
    drop(maps);
    let _ = margay_bpf::inspect::remove_pins(&pins);
}
