//! The watcher syncer on the Kubernetes datastore: time to in-sync and memory with a cluster of
//! 10k pods, 1k nodes, 1k policies and 500 namespaces, then the rate at which it applies a burst
//! of pod updates. Prints numbers; asserts nothing.
//!
//! `cargo run --release -p margay-datastore --example kube_bench [PODS] [BURST]`
//!
//! The API server double runs in a child process (this binary with `--serve`), so the memory
//! reported is the syncer's alone and the two share the machine's cores as they would.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use margay_api::Kind;
use margay_datastore::kube::KubeBackend;
use margay_datastore::{KubeSettings, SyncStatus, SyncerEvent, SyncerOptions, WatcherSyncer};
use serde_json::{Value, json};

const NODES: usize = 1000;
const NAMESPACES: usize = 500;
const K8S_POLICIES: usize = 500;
const CALICO_POLICIES: usize = 500;

fn rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map_or(0.0, |k| k / 1024.0)
}

fn pod(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{i:05}"), "namespace": format!("ns-{}", i % NAMESPACES),
                     "labels": {"app": format!("app-{}", i % 50), "tier": "backend", "pod-template-hash": "7d9f8c6b5"},
                     "annotations": {"cni.projectcalico.org/podIP": format!("10.{}.{}.{}/32", 64 + i / 65536, (i / 256) % 256, i % 256),
                                     "cni.projectcalico.org/containerID": "0123456789abcdef0123456789abcdef"}},
        "spec": {"nodeName": format!("node-{:04}", i % NODES), "serviceAccountName": "default",
                 "containers": [{"name": "app", "image": "registry.example/app:1.2.3",
                                 "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}]}]},
        "status": {"phase": "Running"},
    })
}

fn serve(dir: &str, pods: usize) {
    use margay_apiserver::{ApiServer, Gvr, PatchType, ServerOptions};
    let api = ApiServer::start(ServerOptions {
        calico_crds: true,
        event_history: 200_000,
        ..ServerOptions::default()
    })
    .unwrap();
    let s = api.store();
    s.create_many(
        Gvr::core("namespaces"),
        "",
        (0..NAMESPACES).map(|n| json!({"metadata": {"name": format!("ns-{n}"), "labels": {"team": format!("t{}", n % 20)}}})),
    )
    .unwrap();
    s.create_many(
        Gvr::core("nodes"),
        "",
        (0..NODES).map(|n| {
            json!({"metadata": {"name": format!("node-{n:04}"), "labels": {"kubernetes.io/hostname": format!("node-{n:04}")},
                   "annotations": {"projectcalico.org/IPv4Address": format!("172.16.{}.{}/16", n / 250, n % 250 + 1)}},
                   "spec": {"podCIDR": format!("10.{}.{}.0/24", 200 + n / 256, n % 256)}})
        }),
    )
    .unwrap();
    for n in 0..NAMESPACES {
        s.create_many(
            Gvr::new("networking.k8s.io", "v1", "networkpolicies"),
            &format!("ns-{n}"),
            (0..K8S_POLICIES / NAMESPACES).map(|p| json!({"metadata": {"name": format!("np-{p}"), "namespace": format!("ns-{n}")},
                "spec": {"podSelector": {"matchLabels": {"app": format!("app-{}", p % 50)}}, "policyTypes": ["Ingress"],
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"tier": "frontend"}}}], "ports": [{"port": 8080}]}]}})),
        )
        .unwrap();
    }
    s.create_many(
        Gvr::calico("globalnetworkpolicies"),
        "",
        (0..CALICO_POLICIES).map(|p| json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "GlobalNetworkPolicy",
            "metadata": {"name": format!("gnp-{p}")},
            "spec": {"tier": "default", "order": p, "selector": format!("app == 'app-{}'", p % 50), "types": ["Ingress"],
                     "ingress": [{"action": "Allow", "protocol": "TCP", "source": {"selector": "tier == 'frontend'"}, "destination": {"ports": [80, 443]}}]}})),
    )
    .unwrap();
    let per_ns: Vec<Vec<Value>> = (0..NAMESPACES)
        .map(|n| (0..pods).filter(|i| i % NAMESPACES == n).map(pod).collect())
        .collect();
    for (n, objs) in per_ns.into_iter().enumerate() {
        s.create_many(Gvr::core("pods"), &format!("ns-{n}"), objs)
            .unwrap();
    }
    let path = std::path::Path::new(dir).join("kubeconfig");
    api.write_kubeconfig(&path).unwrap();
    println!("ready");
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let Some(n) = line
            .strip_prefix("burst ")
            .and_then(|n| n.parse::<usize>().ok())
        else {
            break;
        };
        let t = Instant::now();
        for i in 0..n {
            let p = i % pods;
            s.patch(
                Gvr::core("pods"),
                &format!("ns-{}", p % NAMESPACES),
                &format!("pod-{p:05}"),
                PatchType::Merge,
                &json!({"metadata": {"labels": {"version": format!("v{i}")}}}),
            )
            .unwrap();
        }
        println!("written {:?}", t.elapsed());
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--serve") {
        serve(&args[2], args[3].parse().unwrap());
        return;
    }
    let pods: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let burst: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let dir = std::env::temp_dir().join(format!("margay-kube-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = Instant::now();
    let mut server = Command::new(std::env::current_exe().unwrap())
        .args(["--serve", dir.to_str().unwrap(), &pods.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut server_out = BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    server_out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    println!(
        "cluster: {pods} pods, {NODES} nodes, {NAMESPACES} namespaces, {K8S_POLICIES} Kubernetes + {CALICO_POLICIES} Calico policies (set up in {:?})",
        t.elapsed()
    );

    let rss_before = rss_mib();
    let b = KubeBackend::connect(&KubeSettings {
        kubeconfig: vec![dir.join("kubeconfig")],
        ..KubeSettings::default()
    })
    .await
    .unwrap();
    let kinds = vec![
        Kind::ClusterInformation,
        Kind::FelixConfiguration,
        Kind::Node,
        Kind::IPPool,
        Kind::Tier,
        Kind::GlobalNetworkPolicy,
        Kind::NetworkPolicy,
        Kind::Profile,
        Kind::WorkloadEndpoint,
        Kind::HostEndpoint,
        Kind::NetworkSet,
        Kind::GlobalNetworkSet,
    ];
    let syncer = WatcherSyncer::new(b, SyncerOptions::new(kinds));
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let started = Instant::now();
    let task = tokio::spawn(syncer.run(tx));
    // The consumer keeps what a Felix would: every resource, decoded.
    let mut held: std::collections::HashMap<margay_api::ResourceKey, margay_api::Resource> =
        std::collections::HashMap::new();
    let mut updates = 0usize;
    loop {
        match rx.recv().await.unwrap() {
            SyncerEvent::Status(SyncStatus::InSync) => break,
            SyncerEvent::Status(_) => {}
            SyncerEvent::Updates(us) => {
                updates += us.len();
                for u in us {
                    match u.value {
                        Some(v) => held.insert(u.key, v),
                        None => held.remove(&u.key),
                    };
                }
            }
        }
    }
    let in_sync = started.elapsed();
    println!(
        "in sync: {in_sync:?} ({updates} resources); syncer process RSS {:.0} MiB → {:.0} MiB (+{:.0} MiB, holding every decoded resource)",
        rss_before,
        rss_mib(),
        rss_mib() - rss_before
    );

    // A burst of pod updates: the writer (the API server process) and the syncer run at once.
    let mut stdin = server.stdin.take().unwrap();
    writeln!(stdin, "burst {burst}").unwrap();
    let mut first: Option<Instant> = None;
    let mut seen = 0usize;
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen < burst && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Some(SyncerEvent::Updates(us))) => {
                first.get_or_insert_with(Instant::now);
                seen += us.len();
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    let elapsed = first.map(|f| f.elapsed()).unwrap_or_default();
    let mut written = String::new();
    server_out.read_line(&mut written).unwrap();
    println!(
        "burst: {seen} of {burst} pod updates applied in {elapsed:?} = {:.0} updates/s (the API server wrote them in {})",
        seen as f64 / elapsed.as_secs_f64().max(1e-9),
        written.trim().trim_start_matches("written ")
    );
    task.abort();
    drop(stdin);
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
