//! Connection rate through a ClusterIP against straight to the pods, on the nftables
//! dataplane (root; everything happens in namespaces of its own, deleted at the end).
//!
//! `cargo run --release -p margay-dataplane --example svc_conn_bench -- [--rounds 5]
//!  [--seconds 2] [--services 1000] [--bpf]`
//!
//! `--bpf`: the eBPF driver programs the node instead (policy and Services in its programs,
//! a private bpffs).
//!
//! A node namespace with a client pod and three backend pods (each answers every TCP
//! connection on 8080 with its name and closes it) behind `cali*` veths, programmed by the
//! `NftDriver` from a Service with the three pods as endpoints plus `--services` other
//! services (so the lookups run against maps of a realistic size). In each round the client
//! opens and reads as many connections as it can for `--seconds`, once to a backend's own
//! address (round-robin over the three) and once to the ClusterIP, in alternating order; the
//! figures are connections per second, min/median/max over the rounds, and the ratio of the
//! medians (issue 19's target: ≥ 0.9).
#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use margay_api::{Resource, ResourceKey, decode_one};
use margay_calc::services::{KubeEndpointSlice, KubeService};
use margay_calc::{CalcConfig, CalcGraph, DataplaneModel};
use margay_dataplane::nft::{NftConfig, NftRunner};
use margay_dataplane::nft_driver::{NftDriver, NftDriverConfig};
use margay_testkit::netns::{NameServers, Netns, enter, is_root};
use serde_json::json;

const NODE: &str = "nodea";
const CLUSTER_IP: &str = "10.96.0.10";
const BACKENDS: [(&str, &str, &str); 3] = [
    ("b1", "10.65.0.1", "calib1"),
    ("b2", "10.65.0.2", "calib2"),
    ("b3", "10.65.0.3", "calib3"),
];

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn res(yaml: &str) -> Resource {
    decode_one(yaml).unwrap()
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

fn service(name: &str, ip: &str) -> KubeService {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "prod"},
        "spec": {"clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    }))
    .unwrap()
}

fn slice(service: &str, backends: &[String]) -> KubeEndpointSlice {
    let eps: Vec<_> = backends
        .iter()
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": NODE}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{service}-x1"), "namespace": "prod",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]
    }))
    .unwrap()
}

/// Connections opened and read from inside `ns` to `targets` (round-robin) for `length`.
fn rate(ns: &str, targets: &[SocketAddr], length: Duration) -> f64 {
    let ns = ns.to_string();
    let targets = targets.to_vec();
    std::thread::spawn(move || {
        enter(&ns).unwrap();
        let started = Instant::now();
        let (mut ok, mut failed) = (0u64, 0u64);
        let mut buf = [0u8; 16];
        while started.elapsed() < length {
            let t = targets[(ok + failed) as usize % targets.len()];
            match TcpStream::connect_timeout(&t, Duration::from_secs(1)) {
                Ok(mut s) => {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                    match s.read(&mut buf) {
                        Ok(n) if n > 0 => ok += 1,
                        _ => failed += 1,
                    }
                }
                Err(_) => failed += 1,
            }
        }
        if failed > 0 {
            eprintln!("  ({failed} connections failed)");
        }
        ok as f64 / started.elapsed().as_secs_f64()
    })
    .join()
    .unwrap()
}

fn spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn main() {
    if !is_root() {
        println!("svc_conn_bench needs root (network namespaces): skipped");
        return;
    }
    let rounds = arg("--rounds", 5).max(1);
    let seconds = arg("--seconds", 2).max(1);
    let others = arg("--services", 1000);

    let node = Netns::new("svcconn-node").unwrap();
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
    let client = node.add_pod("svcconn-cl", "10.65.0.10", "calicl").unwrap();
    // The benchmark client's own tuning: without it, the run measures port exhaustion.
    client
        .sysctl("net.ipv4.ip_local_port_range", "1024 65000")
        .unwrap();
    client.sysctl("net.ipv4.tcp_tw_reuse", "1").unwrap();
    let mut pods = Vec::new();
    let mut backend_ns = Vec::new();
    for (pod, ip, iface) in BACKENDS {
        let ns = node.add_pod(&format!("svcconn-{pod}"), ip, iface).unwrap();
        pods.push((ns.name().to_string(), pod.to_string()));
        backend_ns.push(ns);
    }
    let _servers = NameServers::start(&pods, 8080).unwrap();

    let mut graph = CalcGraph::new(CalcConfig {
        hostname: NODE.into(),
        ..CalcConfig::default()
    });
    let mut resources = vec![
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
        resources.push(wep(pod, ip, iface, "web"));
    }
    for r in &resources {
        let key: ResourceKey = r.key();
        graph.on_update(&key, Some(r.clone()));
    }
    let backends: Vec<String> = BACKENDS.iter().map(|(_, ip, _)| ip.to_string()).collect();
    graph.on_kube_service("prod", "web", Some(&service("web", CLUSTER_IP)));
    graph.on_endpoint_slice("prod", "web-x1", Some(&slice("web", &backends)));
    for i in 0..others {
        let name = format!("other{i}");
        let ip = format!("10.97.{}.{}", i / 250, 1 + i % 250);
        let eps: Vec<String> = (0..3)
            .map(|e| format!("10.66.{}.{}", (i * 3 + e) / 250, 1 + (i * 3 + e) % 250))
            .collect();
        graph.on_kube_service("prod", &name, Some(&service(&name, &ip)));
        graph.on_endpoint_slice("prod", &format!("{name}-x1"), Some(&slice(&name, &eps)));
    }
    graph.on_in_sync();
    let msgs = graph.flush();
    let mut kept_bpf = None;
    if std::env::args().any(|a| a == "--bpf") {
        use margay_dataplane::DataplaneDriver;
        use margay_dataplane::bpf_driver::{BpfDriver, BpfDriverConfig};
        let fs = tempfile::tempdir().unwrap();
        let name = node.name().to_string();
        let t = Instant::now();
        let driver = std::thread::scope(|sc| {
            sc.spawn(|| {
                enter(&name).unwrap();
                let (mut d, _) = BpfDriver::new(BpfDriverConfig {
                    pin_dir: fs.path().join(NODE),
                    bpffs_mount: Some(fs.path().to_path_buf()),
                    compile: Default::default(),
                    workload_prefixes: vec!["cali".into()],
                    routing: None,
                    route_refresh_interval: Duration::ZERO,
                    status_prefix: None,
                    global_sysctls: vec![],
                    interfaces: None,
                    host_nft: None,
                })
                .unwrap();
                d.apply(&msgs).unwrap();
                d
            })
            .join()
            .unwrap()
        });
        println!(
            "eBPF: loaded and programmed {} services ({} frontends) in {:.2} s",
            others + 1,
            driver.status().service_frontends,
            t.elapsed().as_secs_f64()
        );
        kept_bpf = Some((driver, fs));
    }
    let mut model = DataplaneModel::default();
    model.apply_all(&msgs).unwrap();
    let (mut driver, stats) = NftDriver::new(NftDriverConfig {
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
    if kept_bpf.is_none() {
        driver.mark_dirty();
        driver.sync(&model).unwrap();
    }
    if kept_bpf.is_none() {
        let s = stats.lock();
        println!(
            "programmed {} services ({} elements) in {:.2} s",
            others + 1,
            s.elements,
            s.last_apply_seconds
        );
    }

    let direct: Vec<SocketAddr> = backends
        .iter()
        .map(|ip| format!("{ip}:8080").parse().unwrap())
        .collect();
    let via_service: Vec<SocketAddr> = vec![format!("{CLUSTER_IP}:80").parse().unwrap()];
    let length = Duration::from_secs(seconds as u64);
    // Warm-up (ARP, conntrack, caches), not counted.
    rate(client.name(), &direct, Duration::from_millis(300));
    rate(client.name(), &via_service, Duration::from_millis(300));
    let (mut d, mut s) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round % 2 == 0 {
            d.push(rate(client.name(), &direct, length));
            s.push(rate(client.name(), &via_service, length));
        } else {
            s.push(rate(client.name(), &via_service, length));
            d.push(rate(client.name(), &direct, length));
        }
    }
    let (dmin, dmed, dmax) = spread(&mut d);
    let (smin, smed, smax) = spread(&mut s);
    println!(
        "direct to the pods:  {dmed:.0} conn/s (min {dmin:.0}, max {dmax:.0}) over {rounds} rounds of {seconds} s"
    );
    println!("through the ClusterIP: {smed:.0} conn/s (min {smin:.0}, max {smax:.0})");
    println!(
        "ratio ClusterIP / direct (medians): {:.2} (target >= 0.90)",
        smed / dmed
    );
    if let Some((driver, fs)) = kept_bpf {
        drop(driver);
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(fs.path())
            .status();
    }
}
