//! Benchmark of the API server double; prints numbers (no assertions).
//!
//! `cargo run --release -p margay-apiserver --example bench [PODS] [EVENTS]`
//!
//! - memory with PODS pods + PODS/10 nodes (RSS of this process, server and client together),
//! - a full paged list of the pods (limit 500) over HTTPS, as a client pager does,
//! - one watcher receiving EVENTS modifications live, and the same events replayed from history.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use margay_apiserver::{ApiServer, Gvr, PatchType, ServerOptions};
use serde_json::{Value, json};

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
        "metadata": {"name": format!("pod-{i:05}"), "labels": {"app": format!("app-{}", i % 50), "tier": "backend", "pod-template-hash": "7d9f8c6b5"},
                     "annotations": {"cni.projectcalico.org/podIP": format!("10.244.{}.{}/32", i / 250, i % 250), "cni.projectcalico.org/containerID": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}},
        "spec": {"nodeName": format!("node-{:04}", i % 1000), "serviceAccountName": "default",
                 "containers": [{"name": "app", "image": "registry.example/app:1.2.3", "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
                                 "env": [{"name": "MODE", "value": "production"}], "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]},
        "status": {"phase": "Running", "podIP": format!("10.244.{}.{}", i / 250, i % 250), "podIPs": [{"ip": format!("10.244.{}.{}", i / 250, i % 250)}],
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

async fn client(s: &ApiServer) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&s.kubeconfig_yaml()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

async fn get(c: &kube::Client, path: &str) -> bytes::Bytes {
    let req = http::Request::get(path)
        .body(kube::client::Body::from(Vec::new()))
        .unwrap();
    c.send(req)
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
}

/// Reads a watch until `n` events arrived; returns the time it took.
async fn drain_watch(c: &kube::Client, path: &str, n: usize, start: impl FnOnce()) -> Duration {
    let req = http::Request::get(path)
        .body(kube::client::Body::from(Vec::new()))
        .unwrap();
    let mut body = c.send(req).await.unwrap().into_body();
    let t = Instant::now();
    start();
    let mut seen = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while seen < n {
        let Ok(Some(Ok(f))) = tokio::time::timeout_at(deadline, body.frame()).await else {
            println!("  watch ended early after {seen} events");
            break;
        };
        if let Ok(d) = f.into_data() {
            seen += d.iter().filter(|b| **b == b'\n').count();
        }
    }
    t.elapsed()
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let pods = args.first().copied().unwrap_or(10_000);
    let events = args.get(1).copied().unwrap_or(50_000);
    let rss0 = rss_mib();
    let server = ApiServer::start(ServerOptions {
        event_history: 2 * events + 2 * pods + pods / 10 + 100,
        ..Default::default()
    })
    .unwrap();
    let s = server.store();
    let t = Instant::now();
    s.create_many(Gvr::core("pods"), "default", (0..pods).map(pod))
        .unwrap();
    s.create_many(Gvr::core("nodes"), "", (0..pods / 10).map(|i| json!({"metadata": {"name": format!("node-{i:04}"), "labels": {"kubernetes.io/hostname": format!("node-{i:04}")}, "annotations": {"projectcalico.org/IPv4Address": "10.0.0.1/24"}}, "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}))).unwrap();
    let created = t.elapsed();
    let rss1 = rss_mib();
    println!(
        "store: {pods} pods + {} nodes created in {:.0} ms ({:.0} objects/s)",
        pods / 10,
        created.as_secs_f64() * 1e3,
        (pods + pods / 10) as f64 / created.as_secs_f64()
    );
    println!(
        "memory: RSS {rss0:.0} MiB -> {rss1:.0} MiB (+{:.0} MiB, history included)",
        rss1 - rss0
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = client(&server).await;
        // Warm the connection.
        get(&c, "/api/v1/namespaces/default/pods?limit=1").await;
        for round in 0..3 {
            let t = Instant::now();
            let mut cont: Option<String> = None;
            let (mut pages, mut items, mut bytes) = (0, 0, 0);
            loop {
                let path = match &cont {
                    Some(c) => format!("/api/v1/pods?limit=500&continue={c}"),
                    None => "/api/v1/pods?limit=500".to_string(),
                };
                let b = get(&c, &path).await;
                bytes += b.len();
                let v: Value = serde_json::from_slice(&b).unwrap();
                items += v["items"].as_array().map_or(0, Vec::len);
                pages += 1;
                cont = v["metadata"]["continue"].as_str().map(String::from);
                if cont.is_none() {
                    break;
                }
            }
            let e = t.elapsed();
            println!(
                "list #{round}: {items} pods in {pages} pages of 500 in {:.0} ms ({:.1} ms/page, {:.1} MiB, client JSON decode included)",
                e.as_secs_f64() * 1e3,
                e.as_secs_f64() * 1e3 / pages as f64,
                bytes as f64 / 1048576.0
            );
        }

        // The writer alone (no watcher): the ceiling for the live numbers below.
        let t = Instant::now();
        for i in 0..pods {
            s.patch(Gvr::core("pods"), "default", &format!("pod-{i:05}"), PatchType::Merge, &json!({"metadata": {"labels": {"warm": "1"}}})).unwrap();
        }
        let e = t.elapsed();
        println!("writer alone: {pods} merge patches in {:.0} ms = {:.0} writes/s", e.as_secs_f64() * 1e3, pods as f64 / e.as_secs_f64());

        // Live: one watcher, a writer thread modifying pods as fast as it can.
        let from = s.resource_version();
        let writer_store = s.clone();
        let n = events;
        let live = drain_watch(&c, &format!("/api/v1/pods?watch=true&resourceVersion={from}"), n, move || {
            std::thread::spawn(move || {
                for i in 0..n {
                    let name = format!("pod-{:05}", i % pods);
                    writer_store.patch(Gvr::core("pods"), "default", &name, PatchType::Merge, &json!({"metadata": {"labels": {"gen": i.to_string()}}})).unwrap();
                }
            });
        })
        .await;
        println!("watch (live, one patch per write): {n} events in {:.0} ms = {:.0} events/s (writer and watcher concurrent)", live.as_secs_f64() * 1e3, n as f64 / live.as_secs_f64());
        // Live, bulk writer: creates in batches of 1000 under one lock, watcher reading meanwhile.
        let from2 = s.resource_version();
        let bulk_store = s.clone();
        let bulk = drain_watch(&c, &format!("/api/v1/configmaps?watch=true&resourceVersion={from2}"), n, move || {
            std::thread::spawn(move || {
                for b in 0..n.div_ceil(1000) {
                    let k = 1000.min(n - b * 1000);
                    bulk_store.create_many(Gvr::core("configmaps"), "default", (0..k).map(|i| json!({"metadata": {"name": format!("cm-{b}-{i}"), "labels": {"b": b.to_string()}}, "data": {"key": "value"}}))).unwrap();
                }
            });
        })
        .await;
        println!("watch (live, bulk writer): {n} events in {:.0} ms = {:.0} events/s", bulk.as_secs_f64() * 1e3, n as f64 / bulk.as_secs_f64());
        // Replay: the same events from history.
        let replay = drain_watch(&c, &format!("/api/v1/pods?watch=true&resourceVersion={from}"), n, || {}).await;
        println!("watch (replay from history): {n} events in {:.0} ms = {:.0} events/s", replay.as_secs_f64() * 1e3, n as f64 / replay.as_secs_f64());
        let sel = drain_watch(&c, &format!("/api/v1/pods?watch=true&resourceVersion={from}&labelSelector=app%3Dapp-7"), n / 50, || {}).await;
        println!("watch (replay, label selector matching 1/50): {} events in {:.0} ms", n / 50, sel.as_secs_f64() * 1e3);
    });
    println!(
        "memory at the end: RSS {:.0} MiB; {:?}",
        rss_mib(),
        server.stats().objects
    );
}
