//! Typha on the Kubernetes datastore with many Felix clients: how long they take to reach
//! in-sync, and how many watches the API server sees (Typha must be its only watcher: one
//! watch per API resource, whatever the number of clients). Prints numbers.
//!
//! `cargo run --release -p margay-typha --example kube_watches [CLIENTS] [PODS]`
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use margay_apiserver::{ApiServer, Gvr, ServerOptions};
use margay_datastore::KubeSettings;
use margay_datastore::kube::KubeBackend;
use margay_typha::config::TyphaConfig;
use margay_typha::daemon::Embedded;
use serde_json::json;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let clients: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let pods: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2000);
    // Both ends of every connection live in this process.
    let want = (clients * 2 + 1024) as u64;
    let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, want, want);

    let api = ApiServer::start(ServerOptions {
        calico_crds: true,
        ..ServerOptions::default()
    })
    .unwrap();
    let s = api.store();
    s.create(
        Gvr::core("namespaces"),
        "",
        json!({"metadata": {"name": "app"}}),
    )
    .unwrap();
    s.create_many(
        Gvr::core("nodes"),
        "",
        (0..100).map(|n| json!({"metadata": {"name": format!("node-{n}")}})),
    )
    .unwrap();
    s.create_many(
        Gvr::core("pods"),
        "app",
        (0..pods).map(|i| {
            json!({"metadata": {"name": format!("p-{i}"), "namespace": "app", "labels": {"app": "web"},
                   "annotations": {"cni.projectcalico.org/podIP": format!("10.1.{}.{}/32", i / 256, i % 256)}},
                   "spec": {"nodeName": format!("node-{}", i % 100), "containers": [{"name": "c", "image": "x"}]}})
        }),
    )
    .unwrap();

    let backend = KubeBackend::connect(&KubeSettings {
        kubeconfig_inline: Some(api.kubeconfig_yaml()),
        ..KubeSettings::default()
    })
    .await
    .unwrap();
    let config = TyphaConfig::default();
    let typha = Embedded::start(backend, &config, None, "127.0.0.1:0")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !typha.in_sync() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let watches_before = api.stats().open_watches;

    let epoch = Instant::now();
    let until = Arc::new(AtomicU64::new(120_000));
    let synced = Arc::new(AtomicU64::new(0));
    let addr = typha.addr.to_string();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        tasks.push(tokio::spawn(margay_typha::bench::lean_client(
            addr.clone(),
            epoch,
            until.clone(),
            epoch,
            false,
            synced.clone(),
        )));
    }
    while synced.load(Ordering::Relaxed) < clients as u64
        && epoch.elapsed() < Duration::from_secs(120)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let all_in_sync = epoch.elapsed();
    let stats = api.stats();
    until.store(0, Ordering::Relaxed);
    let mut errors = 0;
    for t in tasks {
        if t.await.unwrap().error.is_some() {
            errors += 1;
        }
    }
    println!(
        "{} of {clients} clients in sync with Typha ({pods} pods) in {all_in_sync:?}; {errors} client errors",
        synced.load(Ordering::Relaxed)
    );
    let total: usize = stats.open_watches.values().sum();
    let most = stats.open_watches.values().copied().max().unwrap_or(0);
    println!(
        "API watches open: {total} across {} resources (at most {most} per resource; before the clients: {})",
        stats.open_watches.len(),
        watches_before.values().sum::<usize>()
    );
    for ((group, resource), n) in &stats.open_watches {
        println!("  {n} × {resource}.{group}");
    }
}
