//! Kubernetes Services on the nftables dataplane, with real connections (root; every network
//! namespace is the test's own and is deleted on drop, also when the test fails).
//!
//! A "node" namespace plays the host, with three backend pods and a client pod on `cali*`
//! veths. Each backend answers every TCP connection on port 8080 with its name (a thread of
//! this test inside the pod's namespace). A Service and its EndpointSlice go through the
//! calculation graph; the driver programs `inet margay` in the node namespace.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use margay_api::{Resource, ResourceKey, decode_one};
use margay_calc::services::{KubeEndpointSlice, KubeService};
use margay_calc::{CalcConfig, CalcGraph, DataplaneModel};
use margay_dataplane::nft::{NftConfig, NftRunner};
use margay_dataplane::nft_driver::{NftDriver, NftDriverConfig};
use margay_testkit::netns::{NameServers, Netns, is_root};
use serde_json::json;

const NODE: &str = "nodea";
const CLUSTER_IP: &str = "10.96.0.10";
const BACKENDS: [(&str, &str, &str); 3] = [
    ("b1", "10.65.0.1", "calib1"),
    ("b2", "10.65.0.2", "calib2"),
    ("b3", "10.65.0.3", "calib3"),
];

fn enter(ns: &str) {
    margay_testkit::netns::enter(ns).unwrap();
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
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": NODE}))
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
    // Field order is drop order: servers stop before their namespaces go.
    _servers: NameServers,
    client: Netns,
    _backends: Vec<Netns>,
    node: Netns,
    graph: CalcGraph,
    driver: NftDriver,
    model: DataplaneModel,
    current: BTreeMap<ResourceKey, Resource>,
}

impl Node {
    fn new() -> Node {
        let node = Netns::new("svc-node").unwrap();
        node.sysctl("net.ipv4.ip_forward", "1").unwrap();
        // A default route, as every real node has (proxy ARP answers only for what the host
        // can route; the ClusterIP itself is routed out of it until it is translated).
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
        let client = node.add_pod("svc-cl", "10.65.0.10", "calicl").unwrap();
        let mut backends = Vec::new();
        let mut pods = Vec::new();
        for (pod, ip, iface) in BACKENDS {
            let ns = node.add_pod(&format!("svc-{pod}"), ip, iface).unwrap();
            pods.push((ns.name().to_string(), pod.to_string()));
            backends.push(ns);
        }
        let servers = NameServers::start(&pods, 8080).unwrap();
        let (driver, _stats) = NftDriver::new(NftDriverConfig {
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
        let mut graph = CalcGraph::new(CalcConfig {
            hostname: NODE.into(),
            ..CalcConfig::default()
        });
        graph.on_in_sync();
        let mut n = Node {
            _servers: servers,
            client,
            _backends: backends,
            node,
            graph,
            driver,
            model: DataplaneModel::default(),
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
        let msgs = self.graph.flush();
        self.model.apply_all(&msgs).unwrap();
        self.driver.mark_dirty();
        if let Err(e) = self.driver.sync(&self.model) {
            panic!("{e}\n{}", self.table());
        }
        started.elapsed()
    }

    fn endpoints(&mut self, backends: &[&str]) -> Duration {
        self.graph
            .on_endpoint_slice("prod", "web-x1", Some(&slice(backends)));
        self.program()
    }

    /// `n` connections from the client pod to `addr`, each bounded by `timeout`.
    fn connect(&self, addr: &str, n: usize, timeout: Duration) -> Vec<Outcome> {
        self.connect_from(self.client.name(), addr, n, timeout)
    }

    /// `n` connections from the pod in namespace `ns` to `addr`.
    fn connect_from(&self, ns: &str, addr: &str, n: usize, timeout: Duration) -> Vec<Outcome> {
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

    fn table(&self) -> String {
        self.node
            .exec("nft")
            .args(["list", "table", "inet", "margay"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

fn answered(outcomes: &[Outcome]) -> BTreeSet<String> {
    outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Answered(n) => Some(n.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn cluster_ip_spreads_rejects_when_empty_policy_sees_the_backend_affinity_and_node_ports() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let mut n = Node::new();
    let svc_addr = format!("{CLUSTER_IP}:80");

    // Direct pod traffic works before any service exists.
    let direct = n.connect("10.65.0.2:8080", 1, Duration::from_secs(2));
    assert_eq!(
        answered(&direct),
        BTreeSet::from(["b2".to_string()]),
        "{direct:?}"
    );

    // A ClusterIP with three ready endpoints: 60 connections reach every one.
    n.graph.on_kube_service("prod", "web", Some(&service()));
    let took = n.endpoints(&["10.65.0.1", "10.65.0.2", "10.65.0.3"]);
    eprintln!("service with 3 endpoints programmed in {took:?}");
    let out = n.connect(&svc_addr, 60, Duration::from_secs(2));
    let names = answered(&out);
    assert_eq!(
        names,
        BTreeSet::from(["b1".to_string(), "b2".to_string(), "b3".to_string()]),
        "{out:?}\n{}",
        n.table()
    );
    assert!(
        out.iter().all(|o| matches!(o, Outcome::Answered(_))),
        "{out:?}"
    );

    // What was written reads back as written: a driver starting afresh (a restarted Felix)
    // finds nothing to change.
    let (mut fresh, _) = NftDriver::new(NftDriverConfig {
        nft: NftConfig {
            ipv6: false,
            ..NftConfig::default()
        },
        runner: NftRunner {
            netns: Some(n.node.name().to_string()),
            ..NftRunner::default()
        },
        refresh_interval: Duration::ZERO,
        flowtable_extra_devices: None,
    });
    fresh.mark_dirty();
    let tx = fresh.sync(&n.model).unwrap();
    assert!(tx.is_empty(), "a read-back differs: {tx:?}\n{}", n.table());

    // One endpoint left: only it answers.
    n.endpoints(&["10.65.0.3"]);
    let out = n.connect(&svc_addr, 10, Duration::from_secs(2));
    assert_eq!(
        answered(&out),
        BTreeSet::from(["b3".to_string()]),
        "{out:?}"
    );
    // Hairpin: the endpoint reaches itself through its own service (masqueraded, or its
    // reply would go straight back to itself and never match the connection).
    let b3 = n._backends[2].name().to_string();
    let out = n.connect_from(&b3, &svc_addr, 3, Duration::from_secs(2));
    assert_eq!(
        answered(&out),
        BTreeSet::from(["b3".to_string()]),
        "{out:?}\n{}",
        n.table()
    );

    // Scaled to zero: refused at once (a TCP reset), not a timeout.
    n.endpoints(&[]);
    let out = n.connect(&svc_addr, 3, Duration::from_secs(3));
    for o in &out {
        match o {
            Outcome::Refused(t) => assert!(*t < Duration::from_secs(1), "refused after {t:?}"),
            other => panic!("expected a refusal, got {other:?}\n{}", n.table()),
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
    assert_eq!(answered(&out).len(), 3, "{out:?}\n{}", n.table());

    // ClientIP affinity: every connection of the client sticks to one backend.
    let mut sticky = service();
    sticky.spec.session_affinity = Some("ClientIP".into());
    n.graph.on_kube_service("prod", "web", Some(&sticky));
    n.program();
    let out = n.connect(&svc_addr, 20, Duration::from_secs(2));
    assert_eq!(
        answered(&out).len(),
        1,
        "affinity did not stick: {out:?}\n{}",
        n.table()
    );

    // A NodePort on the node's own address reaches the backends too.
    let mut np = service();
    np.spec.type_ = Some("NodePort".into());
    np.spec.ports[0].node_port = Some(30080);
    n.graph.on_kube_service("prod", "web", Some(&np));
    n.program();
    let out = n.connect("192.0.2.1:30080", 30, Duration::from_secs(2));
    assert_eq!(answered(&out).len(), 3, "{out:?}\n{}", n.table());
    // ... and is refused at once without endpoints.
    n.endpoints(&[]);
    let out = n.connect("192.0.2.1:30080", 1, Duration::from_secs(3));
    assert!(
        matches!(out[..], [Outcome::Refused(t)] if t < Duration::from_secs(1)),
        "{out:?}"
    );

    // Removing the service removes the section; the ClusterIP no longer answers.
    n.graph.on_kube_service("prod", "web", None);
    n.program();
    assert!(!n.table().contains("svc-ips-4"), "{}", n.table());
}

/// UDP servers answering every datagram with their name, stopped and joined on drop.
struct UdpNames {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl UdpNames {
    fn start(pods: &[(String, &'static str)], port: u16) -> UdpNames {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let threads = pods
            .iter()
            .map(|(ns, name)| {
                let (ns, name, stop, tx) = (ns.clone(), *name, stop.clone(), tx.clone());
                std::thread::spawn(move || {
                    enter(&ns);
                    let s = std::net::UdpSocket::bind(("0.0.0.0", port)).unwrap();
                    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                    tx.send(()).unwrap();
                    let mut buf = [0u8; 64];
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok((_, from)) = s.recv_from(&mut buf) {
                            let _ = s.send_to(name.as_bytes(), from);
                        }
                    }
                })
            })
            .collect();
        for _ in pods {
            rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        UdpNames { stop, threads }
    }
}

impl Drop for UdpNames {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn udp_service() -> KubeService {
    serde_json::from_value(json!({
        "metadata": {"name": "dns", "namespace": "prod"},
        "spec": {"clusterIP": "10.96.0.53", "clusterIPs": ["10.96.0.53"],
                 "ports": [{"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 5353}]}
    }))
    .unwrap()
}

fn udp_slice(backends: &[&str]) -> KubeEndpointSlice {
    let eps: Vec<_> = backends
        .iter()
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": NODE}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "dns-x1", "namespace": "prod",
                     "labels": {"kubernetes.io/service-name": "dns"}},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "dns", "protocol": "UDP", "port": 5353}]
    }))
    .unwrap()
}

/// Datagrams from one fixed client port (as a DNS client reusing its socket), each answer's
/// sender name or None.
fn ask(client_ns: &str, count: usize) -> Vec<Option<String>> {
    let ns = client_ns.to_string();
    std::thread::spawn(move || {
        enter(&ns);
        let s = std::net::UdpSocket::bind("10.65.0.10:40053").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        (0..count)
            .map(|_| {
                s.send_to(b"?", "10.96.0.53:53").unwrap();
                let mut buf = [0u8; 64];
                s.recv_from(&mut buf)
                    .ok()
                    .map(|(n, _)| String::from_utf8_lossy(&buf[..n]).into_owned())
            })
            .collect()
    })
    .join()
    .unwrap()
}

#[test]
fn a_udp_backend_leaving_the_service_loses_its_flows() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let mut n = Node::new();
    let pods: Vec<(String, &'static str)> = n
        ._backends
        .iter()
        .zip(BACKENDS)
        .map(|(ns, (pod, _, _))| (ns.name().to_string(), pod))
        .collect();
    let _udp = UdpNames::start(&pods, 5353);
    n.graph.on_kube_service("prod", "dns", Some(&udp_service()));
    n.graph.on_endpoint_slice(
        "prod",
        "dns-x1",
        Some(&udp_slice(&["10.65.0.1", "10.65.0.2"])),
    );
    n.program();
    // One flow (same client port): conntrack keeps it on the backend chosen first.
    let first = ask(n.client.name(), 3);
    let chosen = first[0]
        .clone()
        .unwrap_or_else(|| panic!("{first:?}\n{}", n.table()));
    assert!(
        first.iter().all(|a| a.as_deref() == Some(&chosen)),
        "{first:?}"
    );
    // That backend leaves the service (its pod still answers, as a terminating pod would):
    // the flow's entry is deleted, so the next datagram goes to the one left.
    let (left, remaining) = if chosen == "b1" {
        ("10.65.0.1", "b2")
    } else {
        ("10.65.0.2", "b1")
    };
    let keep = if left == "10.65.0.1" {
        "10.65.0.2"
    } else {
        "10.65.0.1"
    };
    n.graph
        .on_endpoint_slice("prod", "dns-x1", Some(&udp_slice(&[keep])));
    n.program();
    let after = ask(n.client.name(), 2);
    assert_eq!(
        after,
        vec![Some(remaining.to_string()), Some(remaining.to_string())],
        "the flow stayed on the backend that left\n{}",
        n.node
            .exec("conntrack")
            .args(["-L", "-p", "udp"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    );
}
