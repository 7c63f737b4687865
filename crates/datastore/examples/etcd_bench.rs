//! Syncer and watch throughput against a private etcd.
//!
//!     cargo run --release -p margay-datastore --example etcd_bench [-- --endpoints 100000]
//!
//! Prints: time to load N WorkloadEndpoints, the syncer's time to in-sync over them, the
//! syncer process's RSS growth for the cached set, and sustained watch delivery (updates/s).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: fail loudly

use std::sync::Arc;
use std::time::{Duration, Instant};

use margay_api::endpoint::{WorkloadEndpointPort, WorkloadEndpointSpec};
use margay_api::numorstring::Protocol;
use margay_api::{Kind, ObjectMeta, Resource, WorkloadEndpoint};
use margay_datastore::config::EtcdConfig;
use margay_datastore::etcd::EtcdBackend;
use margay_datastore::{Client, SyncStatus, SyncerEvent, SyncerOptions, WatcherSyncer};
use margay_testkit::etcd::EtcdServer;
use tokio::sync::{Semaphore, mpsc};

fn wep(i: usize, generation: u32) -> Resource {
    let node = format!("node-{:04}", i % 1000);
    let pod = format!("web-{i:06}");
    let spec = WorkloadEndpointSpec {
        orchestrator: "k8s".into(),
        node: node.clone(),
        pod: pod.clone(),
        endpoint: "eth0".into(),
        container_id: format!("{:064x}", i),
        interface_name: format!("cali{:011x}", i),
        mac: "ee:ee:ee:ee:ee:ee".into(),
        ip_networks: vec![format!(
            "10.{}.{}.{}/32",
            (i >> 16) & 255,
            (i >> 8) & 255,
            i & 255
        )],
        profiles: vec!["kns.default".into(), "ksa.default.default".into()],
        service_account_name: "default".into(),
        ports: vec![WorkloadEndpointPort {
            name: "http".into(),
            protocol: Protocol::Name("TCP".into()),
            port: 8080,
            host_port: 0,
            host_ip: String::new(),
        }],
        ..Default::default()
    };
    let mut meta = ObjectMeta::namespaced("default", spec.expected_name().unwrap());
    for (k, v) in [
        ("app", "web"),
        ("tier", "frontend"),
        ("version", "v1"),
        ("generation", &generation.to_string()),
    ] {
        meta.labels.insert(k.into(), v.into());
    }
    meta.labels
        .insert("projectcalico.org/namespace".into(), "default".into());
    meta.labels
        .insert("projectcalico.org/orchestrator".into(), "k8s".into());
    Resource::WorkloadEndpoint(WorkloadEndpoint::new(meta, spec))
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

async fn write_all(client: &Client<EtcdBackend>, n: usize, generation: u32, concurrency: usize) {
    let sem = Arc::new(Semaphore::new(concurrency));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let permit = sem.clone().acquire_owned().await.unwrap();
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let r = wep(i, generation);
            if generation == 0 {
                client.create(r).await.unwrap();
            } else {
                client.update(r).await.unwrap();
            }
            drop(permit);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let n: usize = std::env::args()
        .skip_while(|a| a != "--endpoints")
        .nth(1)
        .map_or(100_000, |v| v.parse().expect("--endpoints N"));
    let server = EtcdServer::start().expect("start etcd (install it with scripts/setup)");
    let backend = EtcdBackend::connect(&EtcdConfig {
        endpoints: vec![server.endpoint()],
        ..EtcdConfig::default()
    })
    .await
    .unwrap();
    let client = Client::new(backend.clone());

    let t = Instant::now();
    write_all(&client, n, 0, 128).await;
    let load = t.elapsed();
    println!(
        "load: {n} WorkloadEndpoints created in {:.2} s ({:.0}/s)",
        load.as_secs_f64(),
        n as f64 / load.as_secs_f64()
    );

    // Initial sync.
    let rss_before = rss_kib();
    let (tx, mut rx) = mpsc::channel(16);
    let syncer = WatcherSyncer::new(
        backend.clone(),
        SyncerOptions::new(vec![Kind::WorkloadEndpoint]),
    );
    let t = Instant::now();
    tokio::spawn(syncer.run(tx));
    // The consumer keeps only the keys, so the growth is the syncer's own state plus what the
    // initial list needed transiently.
    let mut keys = std::collections::HashSet::new();
    loop {
        match rx.recv().await.unwrap() {
            SyncerEvent::Status(SyncStatus::InSync) => break,
            SyncerEvent::Status(_) => {}
            SyncerEvent::Updates(us) => {
                for u in us {
                    keys.insert(u.key);
                }
            }
        }
    }
    let sync = t.elapsed();
    assert_eq!(keys.len(), n);
    let rss_after = rss_kib();
    println!(
        "syncer: in-sync over {n} WorkloadEndpoints in {:.2} s (target <= 5 s)",
        sync.as_secs_f64()
    );
    println!(
        "memory: syncer process RSS {:.1} MiB after syncing {n} resources ({:.1} MiB before; the syncer caches key -> revision)",
        rss_after as f64 / 1024.0,
        rss_before as f64 / 1024.0,
    );
    let listed = client.list(Kind::WorkloadEndpoint, None, "").await.unwrap();
    let rss_full = rss_kib();
    println!(
        "memory: holding all {} decoded WorkloadEndpoints as well: RSS {:.1} MiB ({:.1} KiB per resource)",
        listed.items.len(),
        rss_full as f64 / 1024.0,
        (rss_full.saturating_sub(rss_after)) as f64 / listed.items.len().max(1) as f64
    );
    drop(listed);

    // Sustained watch delivery, live: rewrite every endpoint in etcd transactions of 100 puts
    // (one revision each, as a busy cluster's many writers would produce) while the syncer
    // runs, and measure what it delivers.
    let updates = n.min(50_000);
    let rev0 = margay_datastore::KvBackend::revision(&backend)
        .await
        .unwrap();
    let endpoint = server.endpoint();
    let writer = tokio::spawn(async move {
        let started = Instant::now();
        let mut raw = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        for chunk in (0..updates).collect::<Vec<_>>().chunks(100) {
            let ops: Vec<etcd_client::TxnOp> = chunk
                .iter()
                .map(|i| {
                    let r = wep(*i, 1);
                    let path = margay_datastore::keys::resource_path(&r.key());
                    etcd_client::TxnOp::put(path, serde_json::to_vec(&r).unwrap(), None)
                })
                .collect();
            raw.txn(etcd_client::Txn::new().and_then(ops))
                .await
                .unwrap();
        }
        started.elapsed()
    });
    let mut received = 0usize;
    let t = Instant::now();
    let deadline = t + Duration::from_secs(600);
    while received < updates && Instant::now() < deadline {
        if let Ok(Some(SyncerEvent::Updates(us))) =
            tokio::time::timeout(Duration::from_secs(30), rx.recv()).await
        {
            received += us.len();
        }
    }
    let written_in = writer.await.unwrap();
    let live = t.elapsed();
    println!(
        "watch (live): {received} updates delivered to the syncer's consumer in {:.2} s = {:.0} updates/s (target >= 10000/s); etcd took {:.2} s to accept them",
        live.as_secs_f64(),
        received as f64 / live.as_secs_f64().max(1e-9),
        written_in.as_secs_f64()
    );

    // Raw delivery from etcd (no decoding), for comparison.
    let mut raw =
        margay_datastore::KvBackend::watch(&backend, margay_datastore::keys::RESOURCE_ROOT, rev0)
            .await
            .unwrap();
    let t = Instant::now();
    let mut n_raw = 0usize;
    while n_raw < updates {
        match tokio::time::timeout(Duration::from_secs(30), raw.next()).await {
            Ok(Some(Ok(events))) => n_raw += events.len(),
            _ => break,
        }
    }
    let raw_time = t.elapsed();
    println!(
        "watch (etcd raw): {n_raw} events received in {:.2} s = {:.0} events/s",
        raw_time.as_secs_f64(),
        n_raw as f64 / raw_time.as_secs_f64().max(1e-9)
    );

    // Catch-up: replay the same changes from etcd's history through a fresh watch, decoding
    // every value as the syncer does (etcd reads history from disk, so this is slower).
    let mut watch = client
        .watch(Kind::WorkloadEndpoint, None, rev0)
        .await
        .unwrap();
    let t = Instant::now();
    let mut replayed = 0usize;
    while replayed < updates {
        match tokio::time::timeout(Duration::from_secs(30), watch.next()).await {
            Ok(Some(Ok(events))) => replayed += events.len(),
            other => panic!(
                "watch ended early after {replayed}: {:?}",
                other.map(|o| o.map(|r| r.map(|v| v.len())))
            ),
        }
    }
    let replay = t.elapsed();
    println!(
        "watch (catch-up): {replayed} historical updates decoded in {:.2} s = {:.0} updates/s",
        replay.as_secs_f64(),
        replayed as f64 / replay.as_secs_f64().max(1e-9)
    );
    drop(server);
}
