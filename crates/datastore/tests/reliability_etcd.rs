//! Reliability against real etcd: kill -9 and restart under load, a 3-member cluster losing
//! its leader, concurrent read-modify-write, corrupted values.
#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used)]

mod syncer_common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use margay_api::{GlobalNetworkSet, Kind, ObjectMeta, Resource};
use margay_datastore::config::EtcdConfig;
use margay_datastore::etcd::EtcdBackend;
use margay_datastore::keys::resource_path;
use margay_datastore::{Client, DatastoreError, KvBackend, SyncerOptions, WatcherSyncer};
use margay_testkit::etcd::{EtcdCluster, EtcdServer};
use syncer_common::View;
use tokio::sync::mpsc;

fn netset(i: usize) -> Resource {
    let mut meta = ObjectMeta::named(format!("set-{i:05}"));
    meta.labels.insert("batch".into(), "reliability".into());
    let spec = margay_api::policy::NetworkSetSpec {
        nets: vec![format!("10.{}.{}.0/24", i / 256, i % 256)],
    };
    Resource::GlobalNetworkSet(GlobalNetworkSet::new(meta, spec))
}

async fn backend(endpoints: Vec<String>) -> EtcdBackend {
    EtcdBackend::connect(&EtcdConfig {
        endpoints,
        ..EtcdConfig::default()
    })
    .await
    .unwrap()
}

/// Creates `n` resources, retrying through outages. A create whose outcome was unknown
/// (connection lost) and that then reports AlreadyExists counts as done. Returns the
/// acknowledged indexes.
async fn write_all(
    client: Client<EtcdBackend>,
    n: usize,
    progress: Arc<AtomicUsize>,
) -> BTreeSet<usize> {
    let mut acked = BTreeSet::new();
    for i in 0..n {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match client.create(netset(i)).await {
                Ok(_) => {
                    acked.insert(i);
                    break;
                }
                Err(DatastoreError::AlreadyExists { .. }) => break,
                Err(e) if e.is_transient() => {
                    assert!(Instant::now() < deadline, "etcd never came back: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("create {i}: {e}"),
            }
        }
        progress.store(i + 1, Ordering::Relaxed);
    }
    acked
}

fn syncer(b: EtcdBackend) -> mpsc::Receiver<margay_datastore::SyncerEvent> {
    let mut opts = SyncerOptions::new(vec![Kind::GlobalNetworkSet]);
    opts.retry_delay = Duration::from_millis(100);
    opts.max_retry_delay = Duration::from_secs(1);
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(WatcherSyncer::new(b, opts).run(tx));
    rx
}

async fn wait_for(progress: &AtomicUsize, at_least: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while progress.load(Ordering::Relaxed) < at_least {
        assert!(
            Instant::now() < deadline,
            "writer stuck at {}",
            progress.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_restart_during_5000_creates_loses_nothing() {
    const N: usize = 5000;
    let mut server = EtcdServer::start().unwrap();
    let b = backend(vec![server.endpoint()]).await;
    let client = Client::new(b.clone());
    let mut rx = syncer(b.clone());
    let mut view = View::default();
    view.until(&mut rx, Duration::from_secs(20), View::in_sync)
        .await;

    let progress = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn(write_all(client.clone(), N, progress.clone()));
    // Consume concurrently while we kill and restart etcd in the middle of the writes.
    let consumer = tokio::spawn(async move {
        view.until(&mut rx, Duration::from_secs(180), |v| v.items.len() == N)
            .await;
        (view, rx)
    });
    wait_for(&progress, 1500).await;
    server.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.restart().unwrap();
    server.wait_healthy().unwrap();

    let acked = writer.await.unwrap();
    let (mut view, mut rx) = consumer.await.unwrap();
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
        view.apply(ev);
    }
    view.matches_list(&client, Kind::GlobalNetworkSet)
        .await
        .unwrap();
    assert_eq!(view.items.len(), N);
    for i in acked {
        client.get(&netset(i).key()).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_member_cluster_survives_losing_its_leader() {
    const N: usize = 1500;
    let mut cluster = EtcdCluster::start(3).unwrap();
    let b = backend(cluster.endpoints()).await;
    let client = Client::new(b.clone());
    let mut rx = syncer(b.clone());
    let mut view = View::default();
    view.until(&mut rx, Duration::from_secs(20), View::in_sync)
        .await;

    let progress = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn(write_all(client.clone(), N, progress.clone()));
    let consumer = tokio::spawn(async move {
        view.until(&mut rx, Duration::from_secs(180), |v| v.items.len() == N)
            .await;
        (view, rx)
    });
    wait_for(&progress, 400).await;
    let leader = cluster.leader().expect("a leader");
    cluster.members[leader].kill();

    let acked = writer.await.unwrap();
    let (mut view, mut rx) = consumer.await.unwrap();
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
        view.apply(ev);
    }
    view.matches_list(&client, Kind::GlobalNetworkSet)
        .await
        .unwrap();
    // Every acknowledged write is there.
    for i in &acked {
        client.get(&netset(*i).key()).await.unwrap();
    }
    assert!(
        acked.len() > N / 2,
        "only {} writes acknowledged",
        acked.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_read_modify_writers_lose_no_increment() {
    const WRITERS: usize = 8;
    const EACH: usize = 25;
    let server = EtcdServer::start().unwrap();
    let client = Client::new(backend(vec![server.endpoint()]).await);
    let mut counter = netset(0);
    counter
        .metadata_mut()
        .labels
        .insert("count".into(), "0".into());
    client.create(counter.clone()).await.unwrap();
    let key = counter.key();
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let (client, key) = (client.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..EACH {
                for attempt in 0.. {
                    assert!(attempt < 10_000, "livelock");
                    let mut r = client.get(&key).await.unwrap();
                    let n: u64 = r.metadata().labels["count"].parse().unwrap();
                    r.metadata_mut()
                        .labels
                        .insert("count".into(), (n + 1).to_string());
                    match client.update(r).await {
                        Ok(_) => break,
                        Err(DatastoreError::Conflict { .. }) => continue,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let r = client.get(&key).await.unwrap();
    assert_eq!(r.metadata().labels["count"], (WRITERS * EACH).to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_values_in_etcd_are_skipped_not_fatal() {
    let server = EtcdServer::start().unwrap();
    let b = backend(vec![server.endpoint()]).await;
    let client = Client::new(b.clone());
    client.create(netset(1)).await.unwrap();
    b.create(
        &resource_path(&netset(2).key()),
        b"\x00\x01not json".to_vec(),
        None,
    )
    .await
    .unwrap();
    let mut rx = syncer(b.clone());
    let mut view = View::default();
    view.until(&mut rx, Duration::from_secs(20), View::in_sync)
        .await;
    assert_eq!(view.items.len(), 1);
    client.create(netset(3)).await.unwrap();
    view.until(&mut rx, Duration::from_secs(20), |v| v.items.len() == 2)
        .await;
    let listed = client.list(Kind::GlobalNetworkSet, None, "").await.unwrap();
    assert_eq!(listed.items.len(), 2);
    assert_eq!(listed.undecodable.len(), 1);
}
