//! Kubernetes Services on the eBPF dataplane, with real connections (root; every network
//! namespace and the bpffs are the test's own and are removed on drop, also when it fails).
//!
//! A "node" namespace plays the host, with three backend pods and a client pod on `cali*`
//! veths, and a "remote" namespace behind its uplink plays another node with a backend at
//! 10.66.0.1 (routed, as a pod on another node is over VXLAN). Each backend answers every TCP
//! connection on port 8080 with its name. A Service and its EndpointSlice go through the
//! calculation graph; the eBPF driver programs the node namespace.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use margay_api::{Resource, ResourceKey, decode_one};
use margay_bpf::compile::CompileConfig;
use margay_calc::services::{KubeEndpointSlice, KubeService};
use margay_calc::{CalcConfig, CalcGraph, Message};
use margay_dataplane::DataplaneDriver;
use margay_dataplane::bpf_driver::{BpfDriver, BpfDriverConfig};
use margay_dataplane::nft::NftConfig;
use margay_testkit::netns::{Netns, is_root};
use serde_json::json;

const NODE: &str = "nodea";
const CLUSTER_IP: &str = "10.96.0.10";
const REMOTE: &str = "10.66.0.1";
const BACKENDS: [(&str, &str, &str); 3] = [
    ("b1", "10.65.0.1", "calib1"),
    ("b2", "10.65.0.2", "calib2"),
    ("b3", "10.65.0.3", "calib3"),
];

fn enter(ns: &str) {
    margay_testkit::netns::enter(ns).unwrap();
}

fn in_ns<R: Send>(ns: &Netns, f: impl FnOnce() -> R + Send) -> R {
    let name = ns.name().to_string();
    std::thread::scope(|s| {
        s.spawn(|| {
            enter(&name);
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

// The fields are read through Debug in failure messages.
#[allow(dead_code)]
#[derive(Debug)]
enum Outcome {
    Answered(String),
    Refused(Duration),
    Failed(std::io::ErrorKind, Duration),
}

fn res(yaml: &str) -> Resource {
    let r = decode_one(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    r.validate().unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    r
}

fn wep(pod: &str, ip: &str, iface: &str, app: &str) -> Resource {
    res(&format!(
        "apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: {NODE}-k8s-{pod}-eth0
  namespace: prod
  labels: {{app: {app}}}
spec:
  orchestrator: k8s
  node: {NODE}
  pod: {pod}
  endpoint: eth0
  interfaceName: {iface}
  ipNetworks: [{ip}/32]
  profiles: [kns.prod]"
    ))
}

fn base_resources() -> Vec<Resource> {
    let mut v = vec![
        res("apiVersion: projectcalico.org/v3
kind: Profile
metadata: {name: kns.prod}
spec:
  labelsToApply: {pcns.projectcalico.org/name: prod}
  ingress: [{action: Allow}]
  egress: [{action: Allow}]"),
        res("apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: pods}
spec: {cidr: 10.65.0.0/16}"),
        wep("client", "10.65.0.10", "calicl", "client"),
    ];
    for (pod, ip, iface) in BACKENDS {
        v.push(wep(pod, ip, iface, "web"));
    }
    v
}

fn service() -> KubeService {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "prod"},
        "spec": {"clusterIP": CLUSTER_IP, "clusterIPs": [CLUSTER_IP],
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    }))
    .unwrap()
}

fn slice(backends: &[&str]) -> KubeEndpointSlice {
    let eps: Vec<_> = backends
        .iter()
        .map(|ip| {
            let node = if *ip == REMOTE { "nodeb" } else { NODE };
            json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": node})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "web-x1", "namespace": "prod",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]
    }))
    .unwrap()
}

struct Node {
    // Field order is drop order: servers stop before their namespaces go, the driver goes
    // before its bpffs.
    _servers: PeerServers,
    driver: Box<BpfDriver>,
    _fs: PrivateBpffs,
    client: Netns,
    _backends: Vec<Netns>,
    _remote: Netns,
    node: Netns,
    graph: CalcGraph,
    current: BTreeMap<ResourceKey, Resource>,
}

impl Node {
    fn new() -> Node {
        let node = Netns::new("bsvc-node").unwrap();
        node.sysctl("net.ipv4.ip_forward", "1").unwrap();
        // Another node behind the uplink, with a "pod" address routed to it.
        let remote = Netns::new("bsvc-remote").unwrap();
        node.link_to("uplink0", &remote, "eth0").unwrap();
        node.add_addr("uplink0", "192.0.2.1/24").unwrap();
        node.set_up("uplink0").unwrap();
        remote.add_addr("eth0", "192.0.2.2/24").unwrap();
        remote.set_up("eth0").unwrap();
        remote.add_addr("lo", &format!("{REMOTE}/32")).unwrap();
        remote
            .ip(&["route", "add", "10.65.0.0/16", "via", "192.0.2.1"])
            .unwrap();
        node.ip(&["route", "add", "10.66.0.0/24", "via", "192.0.2.2"])
            .unwrap();
        node.ip(&["route", "add", "default", "via", "192.0.2.254"])
            .unwrap();
        let client = node.add_pod("bsvc-cl", "10.65.0.10", "calicl").unwrap();
        let mut backends = Vec::new();
        let mut pods = vec![(remote.name().to_string(), "r1".to_string())];
        for (pod, ip, iface) in BACKENDS {
            let ns = node.add_pod(&format!("bsvc-{pod}"), ip, iface).unwrap();
            pods.push((ns.name().to_string(), pod.to_string()));
            backends.push(ns);
        }
        let servers = PeerServers::start(&pods, 8080);
        let fs = PrivateBpffs(tempfile::tempdir().unwrap());
        let (driver, _rec) = BpfDriver::new(BpfDriverConfig {
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
        let mut driver = driver;
        driver.set_data_interfaces("^uplink0$").unwrap();
        let mut graph = CalcGraph::new(CalcConfig {
            hostname: NODE.into(),
            ..CalcConfig::default()
        });
        graph.on_in_sync();
        let mut n = Node {
            _servers: servers,
            driver: Box::new(driver),
            _fs: fs,
            client,
            _backends: backends,
            _remote: remote,
            node,
            graph,
            current: BTreeMap::new(),
        };
        n.set(&[]);
        n
    }

    /// Moves the datastore to base + `extra` and programs the result.
    fn set(&mut self, extra: &[Resource]) {
        let mut target = BTreeMap::new();
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
        self.program();
    }

    fn program(&mut self) -> Duration {
        let started = Instant::now();
        let msgs: Vec<Message> = self.graph.flush();
        let d = &mut self.driver;
        in_ns(&self.node, || d.apply(&msgs).unwrap());
        started.elapsed()
    }

    fn endpoints(&mut self, backends: &[&str]) -> Duration {
        self.graph
            .on_endpoint_slice("prod", "web-x1", Some(&slice(backends)));
        self.program()
    }

    fn connect(&self, addr: &str, n: usize, timeout: Duration) -> Vec<Outcome> {
        connect_from(self.client.name(), addr, n, timeout)
    }

    fn ruleset(&self) -> String {
        self.node
            .exec("nft")
            .args(["list", "ruleset"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

/// TCP servers answering every connection with "<name> <the client address they saw>";
/// stopped and joined on drop.
struct PeerServers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl PeerServers {
    fn start(pods: &[(String, String)], port: u16) -> PeerServers {
        use std::io::Write;
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let threads = pods
            .iter()
            .map(|(ns, name)| {
                let (ns, name, stop, tx) = (ns.clone(), name.clone(), stop.clone(), tx.clone());
                std::thread::spawn(move || {
                    enter(&ns);
                    let l = std::net::TcpListener::bind(("0.0.0.0", port)).unwrap();
                    l.set_nonblocking(true).unwrap();
                    tx.send(()).unwrap();
                    while !stop.load(Ordering::Relaxed) {
                        match l.accept() {
                            Ok((mut s, peer)) => {
                                let _ = s.set_nonblocking(false);
                                let _ = s.write_all(format!("{name} {}", peer.ip()).as_bytes());
                            }
                            Err(_) => std::thread::sleep(Duration::from_micros(200)),
                        }
                    }
                })
            })
            .collect();
        for _ in pods {
            rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        PeerServers { stop, threads }
    }
}

impl Drop for PeerServers {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// `n` connections from the pod in namespace `ns` to `addr`, each bounded by `timeout`.
fn connect_from(ns: &str, addr: &str, n: usize, timeout: Duration) -> Vec<Outcome> {
    let ns = ns.to_string();
    let addr: SocketAddr = addr.parse().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            enter(&ns);
            (0..n)
                .map(|_| {
                    let started = Instant::now();
                    match TcpStream::connect_timeout(&addr, timeout) {
                        Ok(mut s) => {
                            s.set_read_timeout(Some(timeout)).unwrap();
                            let mut name = String::new();
                            match s.read_to_string(&mut name) {
                                Ok(_) => Outcome::Answered(name),
                                Err(e) => Outcome::Failed(e.kind(), started.elapsed()),
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                            Outcome::Refused(started.elapsed())
                        }
                        Err(e) => Outcome::Failed(e.kind(), started.elapsed()),
                    }
                })
                .collect()
        })
        .join()
        .unwrap()
    })
}

/// The backends' names that answered.
fn answered(outcomes: &[Outcome]) -> BTreeSet<String> {
    peers(outcomes)
        .into_iter()
        .filter_map(|a| a.split(' ').next().map(str::to_string))
        .collect()
}

/// "<name> <client address seen>" of every answer.
fn peers(outcomes: &[Outcome]) -> BTreeSet<String> {
    outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Answered(n) => Some(n.clone()),
            _ => None,
        })
        .collect()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn bpf_cluster_ip_spreads_reaches_other_nodes_rejects_when_empty_and_policy_sees_the_backend() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let mut n = Node::new();
    let svc_addr = format!("{CLUSTER_IP}:80");

    // Direct pod traffic works before any service exists, and to the other node.
    let direct = n.connect("10.65.0.2:8080", 1, Duration::from_secs(2));
    assert_eq!(answered(&direct), names(&["b2"]), "{direct:?}");
    let direct = n.connect(&format!("{REMOTE}:8080"), 1, Duration::from_secs(2));
    assert_eq!(answered(&direct), names(&["r1"]), "{direct:?}");

    // A ClusterIP with three ready endpoints: 60 connections reach every one, all answered.
    n.graph.on_kube_service("prod", "web", Some(&service()));
    let took = n.endpoints(&["10.65.0.1", "10.65.0.2", "10.65.0.3"]);
    eprintln!("service with 3 endpoints programmed in {took:?}");
    let r = n.driver.last_service_report().clone();
    assert_eq!((r.backends_written, r.frontends_written), (3, 1), "{r:?}");
    let out = n.connect(&svc_addr, 60, Duration::from_secs(2));
    assert_eq!(answered(&out), names(&["b1", "b2", "b3"]), "{out:?}");
    assert!(
        out.iter().all(|o| matches!(o, Outcome::Answered(_))),
        "{out:?}"
    );
    // The program's NAT conntrack holds both directions of those flows.
    let nat = n.driver.service_nat_entries();
    assert!(
        nat.iter().any(|e| !e.reverse
            && e.dst.to_string() == CLUSTER_IP
            && e.to.port == 8080
            && e.src.to_string() == "10.65.0.10"),
        "{nat:?}"
    );
    assert!(
        nat.iter()
            .any(|e| e.reverse && e.sport == 8080 && e.to.addr.to_string() == CLUSTER_IP),
        "{nat:?}"
    );
    // No nftables service NAT in this mode: the programs do it all.
    let rules = n.ruleset();
    assert!(
        !rules.contains("svc") && !rules.contains("dnat"),
        "nftables service chains in eBPF mode:\n{rules}"
    );

    // An endpoint on another node: reached (routed there and back, the reply translated
    // back to the ClusterIP on its way into the client).
    let took = n.endpoints(&[REMOTE]);
    eprintln!("one endpoint change programmed in {took:?}");
    let out = n.connect(&svc_addr, 5, Duration::from_secs(2));
    assert_eq!(answered(&out), names(&["r1"]), "{out:?}");

    // Scaled to zero: refused at once (ICMP port unreachable from the program), not a
    // timeout.
    n.endpoints(&[]);
    let out = n.connect(&svc_addr, 3, Duration::from_secs(3));
    for o in &out {
        match o {
            Outcome::Refused(t) => assert!(*t < Duration::from_secs(1), "refused after {t:?}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    // Back to three; a policy denying ingress to the backends blocks them through the
    // ClusterIP, one allowing the client to port 8080 (the backend's port, after DNAT)
    // lets it through.
    n.endpoints(&["10.65.0.1", "10.65.0.2", "10.65.0.3"]);
    n.set(&[res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: deny-web, namespace: prod}
spec:
  selector: app == 'web'
  types: [Ingress]
  ingress: [{action: Deny}]")]);
    let out = n.connect(&svc_addr, 3, Duration::from_millis(700));
    assert!(
        answered(&out).is_empty(),
        "denied backends answered: {out:?}"
    );
    n.set(&[res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: allow-client, namespace: prod}
spec:
  selector: app == 'web'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: TCP
    source: {selector: app == 'client'}
    destination: {ports: [8080]}")]);
    let out = n.connect(&svc_addr, 30, Duration::from_secs(2));
    assert_eq!(answered(&out).len(), 3, "{out:?}");
    // The client's egress policy sees the backend too: denying egress to port 8080 blocks
    // the ClusterIP's port 80.
    n.set(&[res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: client-no-8080, namespace: prod}
spec:
  selector: app == 'client'
  types: [Egress]
  egress:
  - {action: Deny, protocol: TCP, destination: {ports: [8080]}}
  - {action: Allow}")]);
    let out = n.connect(&svc_addr, 3, Duration::from_millis(700));
    assert!(answered(&out).is_empty(), "egress to 8080 allowed: {out:?}");
    n.set(&[]);

    // ClientIP affinity: every connection of the client sticks to one backend.
    let mut sticky = service();
    sticky.spec.session_affinity = Some("ClientIP".into());
    n.graph.on_kube_service("prod", "web", Some(&sticky));
    n.program();
    let out = n.connect(&svc_addr, 20, Duration::from_secs(2));
    assert_eq!(answered(&out).len(), 1, "affinity did not stick: {out:?}");

    // Removing the service removes its frontend: the ClusterIP no longer answers.
    n.graph.on_kube_service("prod", "web", None);
    n.program();
    assert_eq!(n.driver.status().service_frontends, 0);
    let out = n.connect(&svc_addr, 1, Duration::from_millis(500));
    assert!(answered(&out).is_empty(), "{out:?}");
}

#[test]
fn bpf_node_ports_from_outside_cluster_snats_local_keeps_the_source() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let mut n = Node::new();
    let remote = n._remote.name().to_string();
    let mut np = service();
    np.spec.type_ = Some("NodePort".into());
    np.spec.ports[0].node_port = Some(30080);
    n.graph.on_kube_service("prod", "web", Some(&np));
    n.endpoints(&["10.65.0.1", "10.65.0.2", "10.65.0.3"]);
    assert_eq!(
        n.driver
            .attached()
            .iter()
            .filter(|(i, _)| i.starts_with("cali"))
            .count(),
        4
    );

    // externalTrafficPolicy Cluster: from the other node's address to this node's NodePort,
    // spread over the backends, which see the node's address (kube-proxy's masquerade).
    let out = connect_from(&remote, "192.0.2.1:30080", 30, Duration::from_secs(2));
    assert_eq!(answered(&out), names(&["b1", "b2", "b3"]), "{out:?}");
    assert!(
        peers(&out).iter().all(|p| p.ends_with(" 192.0.2.1")),
        "{:?}",
        peers(&out)
    );
    // A backend on another node: there and back through this node.
    n.endpoints(&[REMOTE]);
    let out = connect_from(&remote, "192.0.2.1:30080", 3, Duration::from_secs(2));
    assert_eq!(answered(&out), names(&["r1"]), "{out:?}");

    // externalTrafficPolicy Local: this node's endpoints only, the client's address kept.
    np.spec.external_traffic_policy = Some("Local".into());
    n.graph.on_kube_service("prod", "web", Some(&np));
    n.endpoints(&["10.65.0.1", "10.65.0.2", REMOTE]);
    let out = connect_from(&remote, "192.0.2.1:30080", 30, Duration::from_secs(2));
    assert_eq!(answered(&out), names(&["b1", "b2"]), "{out:?}");
    assert!(
        peers(&out).iter().all(|p| p.ends_with(" 192.0.2.2")),
        "{:?}",
        peers(&out)
    );
    // No local endpoint: refused at once.
    n.endpoints(&[REMOTE]);
    let out = connect_from(&remote, "192.0.2.1:30080", 2, Duration::from_secs(3));
    for o in &out {
        match o {
            Outcome::Refused(t) => assert!(*t < Duration::from_secs(1), "refused after {t:?}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    // Pods still reach the ClusterIP with every endpoint (internal traffic policy Cluster).
    let out = n.connect(&format!("{CLUSTER_IP}:80"), 3, Duration::from_secs(2));
    assert_eq!(answered(&out), names(&["r1"]), "{out:?}");
}
