//! Policy scenarios enforced by the nftables driver, checked with real TCP and ICMP probes
//! between pod namespaces behind a "node" namespace (root; every namespace is the test's own).
//!
//! The node namespace plays the host: pods hang off `cali*` veths with /32 addresses and
//! link routes, as the CNI plugin wires them. The calculation graph turns resources into
//! messages; the driver programs `inet margay` inside the node namespace. Scenarios run one
//! after the other on the same topology, so every change is also an incremental update.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use margay_api::{Resource, ResourceKey, decode_one};
use margay_calc::{CalcConfig, CalcGraph};
use margay_dataplane::nft::{NftConfig, NftRunner};
use margay_dataplane::nft_driver::{NftDriver, NftDriverConfig};
use margay_testkit::netns::{Netns, is_root};

const NODE: &str = "nodea";

struct Pod {
    ns: Netns,
    ip: &'static str,
}

/// Runs `f` on a thread that joined `ns` (and checked that it did): /proc/sys/net and netlink
/// opened there belong to the test's namespace, never the machine's.
fn in_ns<R: Send>(ns: &Netns, f: impl FnOnce() -> R + Send) -> R {
    use std::os::unix::fs::MetadataExt;
    let path = format!("/run/netns/{}", ns.name());
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let want = std::fs::metadata(&path).unwrap().ino();
            let have = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
            assert_eq!(want, have, "setns into {path} did not take effect");
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Background listeners, killed on drop.
struct Listeners(Vec<Child>);

impl Drop for Listeners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Cluster {
    node: Netns,
    pods: BTreeMap<&'static str, Pod>,
    graph: CalcGraph,
    driver: NftDriver,
    model: margay_calc::DataplaneModel,
    current: BTreeMap<ResourceKey, Resource>,
    stats: margay_dataplane::nft_driver::NftStatsHandle,
    _listeners: Listeners,
}

fn res(yaml: &str) -> Resource {
    let r = decode_one(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    r.validate().unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    r
}

fn wep(pod: &str, ns: &str, ip: &str, labels: &str, iface: &str, ports: &str) -> Resource {
    res(&format!(
        "apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: {NODE}-k8s-{pod}-eth0
  namespace: {ns}
  labels: {{{labels}}}
spec:
  orchestrator: k8s
  node: {NODE}
  pod: {pod}
  endpoint: eth0
  interfaceName: {iface}
  ipNetworks: [{ip}/32]
  profiles: [kns.{ns}]
{ports}"
    ))
}

fn profile(ns: &str, env: &str) -> Resource {
    // As Kubernetes namespaces become profiles: labels for namespace selectors, allow-all.
    res(&format!(
        "apiVersion: projectcalico.org/v3
kind: Profile
metadata: {{name: kns.{ns}}}
spec:
  labelsToApply: {{pcns.env: {env}, pcns.projectcalico.org/name: {ns}}}
  ingress: [{{action: Allow}}]
  egress: [{{action: Allow}}]"
    ))
}

fn base_resources() -> Vec<Resource> {
    vec![
        profile("prod", "prod"),
        profile("dev", "dev"),
        wep("web", "prod", "10.65.0.1", "app: web", "caliweb0", ""),
        wep(
            "db",
            "prod",
            "10.65.0.2",
            "app: db",
            "calidb00",
            "  ports: [{name: http, protocol: TCP, port: 8080}]",
        ),
        wep("client", "dev", "10.65.0.3", "app: client", "calicli0", ""),
    ]
}

impl Cluster {
    fn new() -> Cluster {
        Cluster::with(
            NftConfig {
                ipv6: false,
                ..NftConfig::default()
            },
            None,
        )
    }

    fn with(nft: NftConfig, flowtable: Option<Vec<String>>) -> Cluster {
        let node = Netns::new("nft-node").unwrap();
        // Forwarding, as Felix turns it on (this test drives the nftables driver alone).
        in_ns(&node, || {
            let sys = margay_dataplane::linux::sysctl::ProcSys::default();
            let r = sys.apply(&margay_dataplane::linux::sysctl::global_sysctls(
                true, false,
            ));
            assert!(r.failed.is_empty(), "{:?}", r.failed);
        });
        // A default route, as every real node has: proxy ARP answers for 169.254.1.1 only
        // when the host can route it.
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
        let mut pods = BTreeMap::new();
        let mut listeners = Vec::new();
        for (name, ip, iface) in [
            ("web", "10.65.0.1", "caliweb0"),
            ("db", "10.65.0.2", "calidb00"),
            ("client", "10.65.0.3", "calicli0"),
        ] {
            let ns = node.add_pod(&format!("nft-{name}"), ip, iface).unwrap();
            for port in ["80", "8080"] {
                listeners.push(
                    ns.exec("nc")
                        .args(["-l", "-k", "-p", port])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .unwrap(),
                );
            }
            pods.insert(name, Pod { ns, ip });
        }
        let (driver, stats) = NftDriver::new(NftDriverConfig {
            nft,
            runner: NftRunner {
                netns: Some(node.name().to_string()),
                ..NftRunner::default()
            },
            refresh_interval: Duration::ZERO,
            flowtable_extra_devices: flowtable,
        });
        let mut graph = CalcGraph::new(CalcConfig {
            hostname: NODE.into(),
            ..CalcConfig::default()
        });
        graph.on_in_sync();
        let mut c = Cluster {
            node,
            pods,
            graph,
            driver,
            model: margay_calc::DataplaneModel::default(),
            current: BTreeMap::new(),
            stats,
            _listeners: Listeners(listeners),
        };
        c.set(&[]);
        c.wait_for_listeners();
        c
    }

    fn wait_for_listeners(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for pod in self.pods.values() {
            loop {
                let out = pod.ns.exec("ss").args(["-ltn"]).output().unwrap();
                let text = String::from_utf8_lossy(&out.stdout);
                if text.contains(":80 ") && text.contains(":8080 ") {
                    break;
                }
                assert!(Instant::now() < deadline, "listeners did not start");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Moves the datastore to base + `extra` and programs the result.
    fn set(&mut self, extra: &[Resource]) {
        let mut target: BTreeMap<ResourceKey, Resource> = BTreeMap::new();
        for r in base_resources().into_iter().chain(extra.iter().cloned()) {
            target.insert(r.key(), r);
        }
        for (k, v) in &target {
            if self.current.get(k) != Some(v) {
                self.graph.on_update(k, Some(v.clone()));
            }
        }
        for k in self.current.keys() {
            if !target.contains_key(k) {
                self.graph.on_update(k, None);
            }
        }
        self.current = target;
        let msgs = self.graph.flush();
        self.model.apply_all(&msgs).unwrap();
        self.driver.mark_dirty();
        self.driver.sync(&self.model).unwrap();
    }

    fn tcp(&self, from: &str, to: &str, port: u16) -> bool {
        let to_ip = self.pods[to].ip;
        let status = self.pods[from]
            .ns
            .exec("timeout")
            .args(["0.7", "nc", "-z", "-w", "1", to_ip, &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        status.success()
    }

    fn ping(&self, from: &str, to: &str) -> bool {
        let to_ip = self.pods[to].ip;
        self.pods[from]
            .ns
            .exec("ping")
            .args(["-c", "1", "-W", "1", to_ip])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    fn expect(&self, scenario: &str, probes: &[(&str, &str, u16, bool)]) {
        for (from, to, port, allowed) in probes {
            let got = if *port == 0 {
                self.ping(from, to)
            } else {
                self.tcp(from, to, *port)
            };
            let what = if *port == 0 {
                "ping".to_string()
            } else {
                format!("tcp/{port}")
            };
            if got != *allowed {
                let table = Command::new("ip")
                    .args([
                        "netns",
                        "exec",
                        self.node.name(),
                        "nft",
                        "list",
                        "table",
                        "inet",
                        "margay",
                    ])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                panic!(
                    "scenario {scenario:?}: {from} -> {to} {what}: expected {}, got {}\n{table}",
                    if *allowed { "allowed" } else { "denied" },
                    if got { "allowed" } else { "denied" }
                );
            }
        }
    }
}

#[test]
fn policy_scenarios_with_real_probes() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let mut c = Cluster::new();

    c.expect(
        "no policy: the namespaces' profiles allow",
        &[
            ("web", "db", 80, true),
            ("client", "db", 8080, true),
            ("db", "web", 80, true),
            ("client", "web", 0, true),
        ],
    );

    c.set(&[res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: db-default-deny, namespace: prod}
spec:
  selector: app == 'db'
  types: [Ingress]")]);
    c.expect(
        "default deny ingress to db",
        &[
            ("web", "db", 80, false),
            ("client", "db", 80, false),
            ("db", "web", 80, true),
            ("web", "client", 80, true),
        ],
    );

    c.set(&[res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: web-to-db, namespace: prod}
spec:
  selector: app == 'db'
  ingress:
  - action: Allow
    protocol: TCP
    source: {selector: app == 'web'}
    destination: {ports: [80]}")]);
    c.expect(
        "allow web to db on tcp/80 only",
        &[
            ("web", "db", 80, true),
            ("web", "db", 8080, false),
            ("client", "db", 80, false),
            ("web", "db", 0, false),
        ],
    );

    c.set(&[res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: db-named-port, namespace: prod}
spec:
  selector: app == 'db'
  ingress:
  - action: Allow
    protocol: TCP
    destination: {ports: [http]}")]);
    c.expect(
        "named port: db's http (8080) only",
        &[
            ("web", "db", 8080, true),
            ("web", "db", 80, false),
            // A rule without any source selector matches every source (Calico scopes only
            // rules that have a selector to the policy's namespace).
            ("client", "db", 8080, true),
        ],
    );

    c.set(&[res("apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: db-from-dev}
spec:
  selector: app == 'db'
  ingress:
  - action: Allow
    source: {namespaceSelector: env == 'dev'}")]);
    c.expect(
        "namespace selector: only the dev namespace reaches db",
        &[
            ("client", "db", 80, true),
            ("client", "db", 0, true),
            ("web", "db", 80, false),
        ],
    );

    c.set(&[res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: web-egress, namespace: prod}
spec:
  selector: app == 'web'
  types: [Egress]
  egress:
  - action: Deny
    destination: {nets: [10.65.0.3/32]}
  - action: Allow")]);
    c.expect(
        "egress: web may not reach client's net",
        &[
            ("web", "client", 80, false),
            ("web", "client", 0, false),
            ("web", "db", 80, true),
            ("client", "web", 80, true),
        ],
    );

    c.set(&[
        res("apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: security}
spec: {order: 100}"),
        res("apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: security.gate}
spec:
  tier: security
  selector: all()
  types: [Ingress]
  ingress:
  - action: Deny
    source: {selector: app == 'client'}
  - action: Pass"),
        res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: db-only-web, namespace: prod}
spec:
  selector: app == 'db'
  ingress:
  - action: Allow
    source: {selector: app == 'web'}"),
    ]);
    c.expect(
        "tiers: security denies client everywhere, passes the rest to default",
        &[
            ("client", "web", 80, false),
            ("client", "db", 80, false),
            // Passed; db's default-tier policy allows web.
            ("web", "db", 80, true),
            // Passed; no default-tier policy for web: its profile allows.
            ("db", "web", 80, true),
        ],
    );

    c.set(&[res("apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: web-icmp-only}
spec:
  selector: app == 'web'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: ICMP
    icmp: {type: 8}")]);
    c.expect(
        "ICMP echo only",
        &[("db", "web", 0, true), ("db", "web", 80, false)],
    );

    c.set(&[res("apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: web-not-client}
spec:
  selector: app == 'web'
  types: [Ingress]
  ingress:
  - action: Log
  - action: Allow
    source: {notSelector: app == 'client'}")]);
    c.expect(
        "notSelector (after a Log rule)",
        &[("db", "web", 80, true), ("client", "web", 80, false)],
    );

    // Back to nothing: everything flows again, and the table holds no policy chains.
    c.set(&[]);
    c.expect(
        "policies removed",
        &[("client", "db", 80, true), ("web", "client", 0, true)],
    );
    let listing = Command::new("ip")
        .args([
            "netns",
            "exec",
            c.node.name(),
            "nft",
            "list",
            "table",
            "inet",
            "margay",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&listing.stdout);
    assert!(!text.contains("chain pi-"), "stale policy chains:\n{text}");
}

#[test]
fn unknown_workload_interfaces_are_dropped() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let c = Cluster::new();
    // A pod whose endpoint the datastore does not know (yet): its traffic is dropped.
    let ghost = Netns::new("nft-ghost").unwrap();
    c.node.link_to("caligho0", &ghost, "eth0").unwrap();
    ghost.add_addr("eth0", "10.65.0.9/32").unwrap();
    ghost.set_up("eth0").unwrap();
    ghost
        .ip(&[
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ])
        .unwrap();
    ghost
        .ip(&[
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
            "dev",
            "eth0",
        ])
        .unwrap();
    c.node.set_up("caligho0").unwrap();
    c.node
        .sysctl("net.ipv4.conf.caligho0.proxy_arp", "1")
        .unwrap();
    c.node
        .sysctl("net.ipv4.neigh.caligho0.proxy_delay", "0")
        .unwrap();
    c.node
        .ip(&[
            "route",
            "add",
            "10.65.0.9/32",
            "dev",
            "caligho0",
            "scope",
            "link",
        ])
        .unwrap();
    let to_web = ghost
        .exec("timeout")
        .args(["0.7", "nc", "-z", "-w", "1", "10.65.0.1", "80"])
        .status()
        .unwrap();
    assert!(
        !to_web.success(),
        "an unknown cali interface must be dropped"
    );
    c.expect("known pods unaffected", &[("web", "db", 80, true)]);
}

fn nft(node: &Netns, args: &[&str]) -> String {
    let out = node.exec("nft").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn drift_is_repaired_by_a_refresh() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let mut c = Cluster::new();
    c.set(&[res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: db-only-web, namespace: prod}
spec:
  selector: app == 'db'
  ingress:
  - action: Allow
    source: {selector: app == 'web'}")]);
    c.expect(
        "before drift",
        &[("web", "db", 80, true), ("client", "db", 80, false)],
    );
    // Someone deletes the drop at the end of db's ingress chain and empties the IP set.
    let listing = nft(
        &c.node,
        &["-a", "list", "chain", "inet", "margay", "tw-calidb00"],
    );
    let handle = listing
        .lines()
        .find(|l| l.contains("no policy or profile allowed"))
        .and_then(|l| l.rsplit("handle ").next())
        .map(|h| h.trim().to_string())
        .unwrap();
    nft(
        &c.node,
        &[
            "delete",
            "rule",
            "inet",
            "margay",
            "tw-calidb00",
            "handle",
            &handle,
        ],
    );
    let sets = nft(&c.node, &["list", "table", "inet", "margay"]);
    let set = sets
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("set s4-")
                .map(|s| format!("s4-{}", s.trim_end_matches(" {")))
        })
        .unwrap();
    nft(&c.node, &["flush", "set", "inet", "margay", &set]);
    c.expect("drifted", &[("web", "db", 80, false)]);
    assert!(
        c.driver.refresh(&c.model).unwrap(),
        "the refresh must find the drift"
    );
    c.expect(
        "repaired",
        &[("web", "db", 80, true), ("client", "db", 80, false)],
    );
    assert!(
        !c.driver.refresh(&c.model).unwrap(),
        "nothing left to repair"
    );
}

#[test]
fn a_burst_of_policy_updates_ends_equal_to_a_fresh_render() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let mut c = Cluster::new();
    let policy = |i: usize| {
        res(&format!(
            "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {{name: churn-{}}}
spec:
  order: {}
  selector: app == '{}'
  ingress:
  - action: Allow
    protocol: TCP
    source: {{selector: app == '{}'}}
    destination: {{ports: [{}]}}",
            i % 50,
            i,
            ["web", "db", "client"][i % 3],
            ["web", "db", "client"][(i + 1) % 3],
            1000 + i
        ))
    };
    // 1,000 updates over 50 policies, flushed to the kernel every 25 updates.
    let mut live: BTreeMap<String, Resource> = BTreeMap::new();
    for i in 0..1000 {
        let p = policy(i);
        live.insert(p.name().to_string(), p.clone());
        c.graph.on_update(&p.key(), Some(p));
        if i % 25 == 24 {
            let msgs = c.graph.flush();
            c.model.apply_all(&msgs).unwrap();
            c.driver.mark_dirty();
            c.driver.sync(&c.model).unwrap();
        }
    }
    let msgs = c.graph.flush();
    c.model.apply_all(&msgs).unwrap();
    c.driver.mark_dirty();
    c.driver.sync(&c.model).unwrap();
    // A fresh driver for the same state, reading the kernel back, finds nothing to change.
    let mut graph = CalcGraph::new(CalcConfig {
        hostname: NODE.into(),
        ..CalcConfig::default()
    });
    for r in base_resources().into_iter().chain(live.into_values()) {
        graph.on_update(&r.key(), Some(r));
    }
    graph.on_in_sync();
    let (mut fresh, stats) = NftDriver::new(NftDriverConfig {
        nft: NftConfig {
            ipv6: false,
            ..NftConfig::default()
        },
        runner: NftRunner {
            netns: Some(c.node.name().to_string()),
            ..NftRunner::default()
        },
        refresh_interval: Duration::ZERO,
        flowtable_extra_devices: None,
    });
    let mut fresh_model = margay_calc::DataplaneModel::default();
    fresh_model.apply_all(&graph.flush()).unwrap();
    fresh.mark_dirty();
    let tx = fresh.sync(&fresh_model).unwrap();
    assert!(
        tx.is_empty(),
        "the kernel differs from a fresh render: {tx:?}"
    );
    assert_eq!(stats.lock().transactions, 0);
    assert!(stats.lock().rules > 100);
}

fn table_text(c: &Cluster) -> String {
    Command::new("ip")
        .args(["netns", "exec", c.node.name(), "nft", "list", "ruleset"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// IptablesFilterDenyAction / NftablesFilterDenyAction REJECT: a denied TCP connection is
/// refused at once instead of timing out; NFTablesFlowTableOffload on a kernel without
/// flowtables (this one) is reported and the table works without it, or, on a kernel with
/// them, established flows go to the flowtable.
#[test]
fn reject_refuses_at_once_and_flow_offload_follows_the_kernel() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let mut c = Cluster::with(
        NftConfig {
            ipv6: false,
            deny: margay_dataplane::nft::DenyVerdict::Reject,
            ..NftConfig::default()
        },
        Some(Vec::new()),
    );
    c.set(&[res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: db-default-deny, namespace: prod}
spec:
  selector: app == 'db'
  types: [Ingress]")]);
    let started = Instant::now();
    let refused = !c.pods["web"]
        .ns
        .exec("nc")
        .args(["-z", "-w", "4", c.pods["db"].ip, "80"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    let took = started.elapsed();
    assert!(refused, "the policy denies web -> db:80");
    assert!(
        took < Duration::from_millis(1500),
        "REJECT refuses at once; the connection took {took:?} to fail (a DROP times out)\n{}",
        table_text(&c)
    );
    c.expect(
        "reject keeps allowed traffic",
        &[("client", "web", 80, true)],
    );

    let offload = c.stats.lock().flow_offload.clone().unwrap_or_default();
    let text = table_text(&c);
    assert!(
        !text.contains("margay-ftprobe"),
        "the probe table is gone:\n{text}"
    );
    if offload.starts_with("unavailable") {
        assert!(
            !text.contains("flow add"),
            "no offload rule without flowtables:\n{text}"
        );
    } else {
        assert_eq!(offload, "enabled");
        assert!(text.contains("flowtable ft"), "{text}");
        assert!(text.contains("flow add @ft"), "{text}");
    }
    eprintln!("flow offload: {offload}");
}
