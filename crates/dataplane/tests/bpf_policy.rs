//! The eBPF driver against the nftables driver: the same resources, through the same
//! calculation graph, into two identical node namespaces (root; every namespace is the test's
//! own), one driven by each driver; after every step the probe matrices (every pod to every
//! pod on tcp/80, tcp/8080 and ping, and the node itself to every pod) must be equal. The steps cover allow/deny by port, by
//! selector (IP set), by named port, by net, namespace selectors, tiers with Pass, ICMP,
//! notSelector, Log, profile fallback and default deny; each step is one incremental apply,
//! probed at once.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use margay_api::{Resource, ResourceKey, decode_one};
use margay_bpf::compile::CompileConfig;
use margay_calc::{CalcConfig, CalcGraph, Message};
use margay_dataplane::DataplaneDriver;
use margay_dataplane::bpf_driver::{BpfDriver, BpfDriverConfig};
use margay_dataplane::nft::{NftConfig, NftRunner};
use margay_dataplane::nft_driver::{NftDriver, NftDriverConfig};
use margay_testkit::netns::{Netns, is_root};

const NODE: &str = "nodea";

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

/// A bpffs instance of the test's own, unmounted on drop.
struct PrivateBpffs(tempfile::TempDir);

impl Drop for PrivateBpffs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

struct Listeners(Vec<Child>);

impl Drop for Listeners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
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

fn profile(ns: &str, env: &str, allow: bool) -> Resource {
    let rules = if allow { "[{action: Allow}]" } else { "[]" };
    res(&format!(
        "apiVersion: projectcalico.org/v3
kind: Profile
metadata: {{name: kns.{ns}}}
spec:
  labelsToApply: {{pcns.env: {env}, pcns.projectcalico.org/name: {ns}}}
  ingress: {rules}
  egress: [{{action: Allow}}]"
    ))
}

const PODS: [(&str, &str, &str); 3] = [
    ("web", "10.65.0.1", "caliweb0"),
    ("db", "10.65.0.2", "calidb00"),
    ("client", "10.65.0.3", "calicli0"),
];

fn base_resources() -> Vec<Resource> {
    vec![
        profile("prod", "prod", true),
        profile("dev", "dev", true),
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

enum Driver {
    Nft(Box<(NftDriver, margay_calc::DataplaneModel)>),
    /// The bpffs is unmounted after the driver is dropped (fields drop in order).
    Bpf(Box<BpfDriver>, #[allow(dead_code)] PrivateBpffs),
}

/// One node namespace with three pods and one driver.
struct Node {
    node: Netns,
    pods: Vec<Netns>,
    graph: CalcGraph,
    driver: Driver,
    current: BTreeMap<ResourceKey, Resource>,
    _listeners: Listeners,
}

impl Node {
    fn new(bpf: bool) -> Node {
        let tag = if bpf { "bpfd" } else { "nftd" };
        let node = Netns::new(&format!("{tag}-node")).unwrap();
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
        let mut listeners = Vec::new();
        for (name, ip, iface) in PODS {
            let ns = node.add_pod(&format!("{tag}-{name}"), ip, iface).unwrap();
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
            pods.push(ns);
        }
        let driver = if bpf {
            let fs = PrivateBpffs(tempfile::tempdir().unwrap());
            let (d, _rec) = BpfDriver::new(BpfDriverConfig {
                pin_dir: fs.0.path().join(NODE),
                bpffs_mount: Some(fs.0.path().to_path_buf()),
                compile: CompileConfig::default(),
                routing: None,
                route_refresh_interval: Duration::ZERO,
                status_prefix: None,
                global_sysctls: vec![],
                interfaces: None,
                workload_prefixes: vec!["cali".into()],
                host_nft: Some(margay_dataplane::bpf_host_nft::HostNftConfig {
                    workload_prefixes: vec!["cali".into()],
                    endpoint_to_host: NftConfig::default().endpoint_to_host,
                    nat: Default::default(),
                }),
            })
            .unwrap();
            Driver::Bpf(Box::new(d), fs)
        } else {
            let (d, _stats) = NftDriver::new(NftDriverConfig {
                nft: NftConfig {
                    ipv6: false,
                    ..NftConfig::default()
                },
                runner: NftRunner {
                    netns: Some(node.name().to_string()),
                    ..NftRunner::default()
                },
                refresh_interval: Duration::ZERO,
                flowtable_extra_devices: None,
            });
            Driver::Nft(Box::new((d, margay_calc::DataplaneModel::default())))
        };
        let graph = CalcGraph::new(CalcConfig {
            hostname: NODE.into(),
            ..CalcConfig::default()
        });
        let mut n = Node {
            node,
            pods,
            graph,
            driver,
            current: BTreeMap::new(),
            _listeners: Listeners(listeners),
        };
        n.set(&[], true);
        let deadline = Instant::now() + Duration::from_secs(10);
        for pod in &n.pods {
            loop {
                let out = pod.exec("ss").args(["-ltn"]).output().unwrap();
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                if text.contains(":80 ") && text.contains(":8080 ") {
                    break;
                }
                assert!(Instant::now() < deadline, "listeners did not start");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        n
    }

    /// Moves the datastore to base + `extra` and applies the result as one batch.
    fn set(&mut self, extra: &[Resource], first: bool) {
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
        if first {
            self.graph.on_in_sync();
        }
        let msgs: Vec<Message> = self.graph.flush();
        match &mut self.driver {
            Driver::Nft(b) => {
                let (d, model) = &mut **b;
                model.apply_all(&msgs).unwrap();
                d.mark_dirty();
                d.sync(model).unwrap();
            }
            Driver::Bpf(d, _) => {
                let node = &self.node;
                in_ns(node, || d.apply(&msgs).unwrap());
            }
        }
    }

    /// Every pod to every other pod (tcp/80, tcp/8080, ping) and the node to every pod (tcp/80,
    /// ping), probed in parallel.
    fn matrix(&self) -> BTreeMap<String, bool> {
        let mut probes = Vec::new();
        for (i, (from, _, _)) in PODS.iter().enumerate() {
            for (j, (to, to_ip, _)) in PODS.iter().enumerate() {
                if i == j {
                    continue;
                }
                for port in [80u16, 8080, 0] {
                    probes.push((format!("{from}->{to}:{port}"), i, *to_ip, port));
                }
            }
        }
        // The host itself to every pod.
        for (to, to_ip, _) in PODS {
            for port in [80u16, 0] {
                probes.push((format!("node->{to}:{port}"), usize::MAX, to_ip, port));
            }
        }
        // A listener (`nc -l -k`) takes one connection at a time with a tiny backlog:
        // probes to one address and port run one after the other, the groups in parallel.
        type Probe<'a> = (String, usize, &'a str, u16);
        let mut groups: BTreeMap<(&str, u16), Vec<&Probe>> = BTreeMap::new();
        for p in &probes {
            groups.entry((p.2, p.3)).or_default().push(p);
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = groups
                .values()
                .map(|group| {
                    s.spawn(move || {
                        let mut out = Vec::new();
                        for (name, i, ip, port) in group.iter().copied() {
                            let pod = self.pods.get(*i).unwrap_or(&self.node);
                            let mut cmd = if *port == 0 {
                                let mut c = pod.exec("ping");
                                c.args(["-c", "1", "-W", "1", ip]);
                                c
                            } else {
                                let mut c = pod.exec("timeout");
                                c.args(["2", "nc", "-z", "-w", "1", ip, &port.to_string()]);
                                c
                            };
                            let ok = cmd
                                .stdout(Stdio::null())
                                .stderr(Stdio::null())
                                .status()
                                .unwrap()
                                .success();
                            out.push((name.clone(), ok));
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        })
    }
}

fn steps() -> Vec<(&'static str, Vec<Resource>)> {
    vec![
        ("no policy: profiles allow", vec![]),
        (
            "default deny ingress to db",
            vec![res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: db-default-deny, namespace: prod}
spec:
  selector: app == 'db'
  types: [Ingress]")],
        ),
        (
            "allow web to db on tcp/80 only (selector IP set, port)",
            vec![res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: web-to-db, namespace: prod}
spec:
  selector: app == 'db'
  ingress:
  - action: Allow
    protocol: TCP
    source: {selector: app == 'web'}
    destination: {ports: [80]}")],
        ),
        (
            "named port",
            vec![res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: db-named-port, namespace: prod}
spec:
  selector: app == 'db'
  ingress:
  - action: Allow
    protocol: TCP
    destination: {ports: [http]}")],
        ),
        (
            "namespace selector",
            vec![res("apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: db-from-dev}
spec:
  selector: app == 'db'
  ingress:
  - action: Allow
    source: {namespaceSelector: env == 'dev'}")],
        ),
        (
            "egress deny by net",
            vec![res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: web-egress, namespace: prod}
spec:
  selector: app == 'web'
  types: [Egress]
  egress:
  - action: Deny
    destination: {nets: [10.65.0.3/32]}
  - action: Allow")],
        ),
        (
            "tiers with Pass",
            vec![
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
            ],
        ),
        (
            "ICMP echo only",
            vec![res("apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: web-icmp-only}
spec:
  selector: app == 'web'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: ICMP
    icmp: {type: 8}")],
        ),
        (
            "notSelector after a Log rule",
            vec![res("apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: web-not-client}
spec:
  selector: app == 'web'
  types: [Ingress]
  ingress:
  - action: Log
  - action: Allow
    source: {notSelector: app == 'client'}")],
        ),
        (
            "profile without ingress rules: default deny into prod",
            vec![profile("prod", "prod", false)],
        ),
        ("back to nothing", vec![]),
    ]
}

#[test]
fn bpf_and_nftables_drivers_agree_on_every_probe() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let mut nft = Node::new(false);
    let mut bpf = Node::new(true);
    let (mut allowed, mut denied) = (0, 0);
    for (name, extra) in steps() {
        nft.set(&extra, false);
        bpf.set(&extra, false);
        let want = nft.matrix();
        let got = bpf.matrix();
        let diff: Vec<String> = want
            .iter()
            .filter(|(k, v)| got.get(*k) != Some(v))
            .map(|(k, v)| format!("{k}: nftables {v}, bpf {:?}", got.get(k)))
            .collect();
        assert!(
            diff.is_empty(),
            "step {name:?}: drivers disagree:\n{}",
            diff.join("\n")
        );
        allowed += want.values().filter(|v| **v).count();
        denied += want.values().filter(|v| !**v).count();
    }
    // The comparison means something only if both outcomes occurred.
    assert!(
        allowed > 20 && denied > 20,
        "allowed {allowed}, denied {denied}"
    );
    if let Driver::Bpf(d, _) = &bpf.driver {
        assert_eq!(d.attached().len(), 3);
    }
    // The nftables companion (endpoint-to-host) is in the node's namespace, not the machine's.
    let out = bpf
        .node
        .exec("nft")
        .args(["list", "table", "inet", "margay-bpf"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("DefaultEndpointToHostAction"), "{text}");
}

/// One apply, and the new policy holds for the next probe; only the endpoint it selects is
/// rewritten.
#[test]
fn bpf_policy_change_is_enforced_after_one_apply_and_rewrites_one_endpoint() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let mut bpf = Node::new(true);
    let deny_db = res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: db-default-deny, namespace: prod}
spec:
  selector: app == 'db'
  types: [Ingress]");
    let probe = |n: &Node| n.matrix()["web->db:80"];
    assert!(probe(&bpf));
    let started = Instant::now();
    bpf.set(std::slice::from_ref(&deny_db), false);
    let apply = started.elapsed();
    assert!(!probe(&bpf));
    eprintln!("policy change applied in {apply:?}");
    if let Driver::Bpf(d, _) = &bpf.driver {
        let r = d.last_report();
        // Only db's ingress hook changed.
        assert_eq!(r.endpoints_flipped, 1, "{r:?}");
    }
    bpf.set(&[], false);
    assert!(probe(&bpf));

    // A pod whose endpoint the datastore does not know: after one housekeeping its
    // interface has programs and no entry, so it is dropped.
    let ghost = bpf
        .node
        .add_pod("bpfd-ghost", "10.65.0.9", "caligho0")
        .unwrap();
    let Driver::Bpf(d, _) = &mut bpf.driver else {
        unreachable!()
    };
    in_ns(&bpf.node, || d.housekeeping().unwrap());
    assert!(d.attached().iter().any(|(n, _)| n == "caligho0"));
    let to_web = ghost
        .exec("timeout")
        .args(["2", "nc", "-z", "-w", "1", "10.65.0.1", "80"])
        .status()
        .unwrap();
    assert!(
        !to_web.success(),
        "an unknown cali interface must be dropped"
    );
    assert!(probe(&bpf), "known pods unaffected");
}
