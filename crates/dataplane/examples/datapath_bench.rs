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
//! `--bpf [--rounds 3]`: the same policy in the eBPF dataplane's programs and maps
//! (crates/bpf), side by side with no rules and with the nftables table in every round:
//! flow events off, then on with a reader draining the ring buffer and naming each event's
//! rule (as Felix's flow logs do). `--linear`: also the programs without the per-hook index
//! (every step walked, as before it existed).
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
    let bpf = args.iter().any(|a| a == "--bpf");
    // (The eBPF comparison measures its own baseline in every round.)
    let ((base_tput, base_rate), (b2, r2)) = if bpf {
        ((0.0, 0.0), (0.0, 0.0))
    } else {
        (
            measure("no margay rules"),
            measure("no margay rules (again)"),
        )
    };
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
    if bpf {
        bpf_bench(&node, &model, &measure);
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

/// Rounds of: no margay rules, the eBPF programs with flow events off, on (a reader
/// draining the ring buffer and naming each event's rule, as Felix's flow logs do), and the
/// nftables dataplane's table for the same model: all four side by side in every round, so
/// the machine's drifting load weighs on each alike. The programs are attached and detached
/// (pins removed) within each round.
fn bpf_bench(node: &Netns, model: &DataplaneModel, measure: Measure<'_>) {
    use margay_bpf::flows::FlowReader;
    use margay_dataplane::bpf_driver::BpfFlowSource;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let fs = Bpffs(tempfile::tempdir().unwrap());
    margay_bpf::loader::ensure_bpffs(fs.0.path()).unwrap();
    let pins = fs.0.path().join("bench");
    let rounds = arg("--rounds", 3);
    let (read, named) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut drops = 0;
    // (throughput, rate) sums: none, eBPF off, eBPF on, nftables, eBPF without the index.
    let linear = std::env::args().any(|a| a == "--linear");
    let mut sum = [(0.0, 0.0); 5];
    let mut add = |i: usize, (t, r): (f64, f64)| {
        sum[i].0 += t;
        sum[i].1 += r;
    };
    // Warm-up: the client's first seconds of connections (no TIME_WAIT sockets yet) run
    // faster than every later measurement.
    measure("warm-up (not counted)");
    for i in 0..rounds {
        add(0, measure(&format!("no margay rules (round {})", i + 1)));
        let mut syncer = margay_bpf::sync::Syncer::new(Default::default());
        let (maps, names) = in_ns(node, || {
            let mut maps = margay_bpf::loader::BpfMaps::load(&pins).unwrap();
            let t = Instant::now();
            let r = syncer.sync(model, &mut maps).unwrap();
            let (blocks, rules) = syncer.num_blocks();
            if i == 0 {
                println!(
                    "eBPF: {blocks} blocks, {rules} rules, {} steps written (index included), {} set entries, sync {:.0} ms",
                    r.steps_written,
                    syncer.num_set_entries(),
                    t.elapsed().as_secs_f64() * 1e3
                );
            }
            (maps, syncer.flow_names())
        });
        let stop = Arc::new(AtomicBool::new(false));
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
        switch.set_enabled(false).unwrap();
        add(
            1,
            measure(&format!("eBPF policy, flow events off (round {})", i + 1)),
        );
        switch.set_enabled(true).unwrap();
        add(
            2,
            measure(&format!("eBPF policy, flow events on (round {})", i + 1)),
        );
        switch.set_enabled(false).unwrap();
        stop.store(true, Ordering::Relaxed);
        drops += t.join().unwrap();
        drop(switch);
        // Detach: removing the pins removes the links.
        drop(maps);
        margay_bpf::inspect::remove_pins(&pins).unwrap();

        let (mut driver, _) = NftDriver::new(NftDriverConfig {
            nft: NftConfig::default(),
            runner: NftRunner {
                netns: Some(node.name().to_string()),
                ..NftRunner::default()
            },
            refresh_interval: Duration::ZERO,
            flowtable_extra_devices: None,
        });
        driver.mark_dirty();
        driver.sync(model).unwrap();
        add(3, measure(&format!("nftables policy (round {})", i + 1)));
        drop(driver);
        node.exec("nft")
            .args(["delete", "table", "inet", &NftConfig::default().table])
            .status()
            .unwrap();
        if linear {
            // The programs walking every step (no index): how the first milestones ran.
            let mut syncer = margay_bpf::sync::Syncer::new(Default::default());
            syncer.set_index(false);
            let maps = in_ns(node, || {
                let mut maps = margay_bpf::loader::BpfMaps::load(&pins).unwrap();
                syncer.sync(model, &mut maps).unwrap();
                maps
            });
            add(
                4,
                measure(&format!("eBPF policy without the index (round {})", i + 1)),
            );
            drop(maps);
            margay_bpf::inspect::remove_pins(&pins).unwrap();
        }
    }
    let n = rounds.max(1) as f64;
    let avg = sum.map(|(t, r)| (t / n, r / n));
    let pct = |a: f64, b: f64| 100.0 * a / b.max(f64::MIN_POSITIVE);
    println!(
        "averages over {rounds} rounds: no rules {:.2} Gbit/s {:.0}/s; eBPF {:.2} Gbit/s {:.0}/s; eBPF + flow events {:.2} Gbit/s {:.0}/s; nftables {:.2} Gbit/s {:.0}/s",
        avg[0].0, avg[0].1, avg[1].0, avg[1].1, avg[2].0, avg[2].1, avg[3].0, avg[3].1
    );
    println!(
        "eBPF policy: throughput {:.0}%, connection rate {:.0}% of no-rules; vs nftables: throughput {:.0}%, connection rate {:.0}%",
        pct(avg[1].0, avg[0].0),
        pct(avg[1].1, avg[0].1),
        pct(avg[1].0, avg[3].0),
        pct(avg[1].1, avg[3].1)
    );
    if linear {
        println!(
            "eBPF without the index: {:.2} Gbit/s {:.0}/s (throughput {:.0}%, connection rate {:.0}% of no-rules)",
            avg[4].0,
            avg[4].1,
            pct(avg[4].0, avg[0].0),
            pct(avg[4].1, avg[0].1)
        );
    }
    println!(
        "eBPF flow events: {} read ({} named a rule), {drops} dropped (ring buffer full); throughput {:.0}%, connection rate {:.0}% of the same policy without flow events",
        read.load(Ordering::Relaxed),
        named.load(Ordering::Relaxed),
        pct(avg[2].0, avg[1].0),
        pct(avg[2].1, avg[1].1)
    );
}
