//! The watcher syncer against the in-memory backend: status sequence, live updates,
//! difference-only resyncs after compaction, undecodable values.
#![allow(clippy::unwrap_used)]

mod syncer_common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use margay_api::{Kind, ObjectMeta, Resource, Tier};
use margay_datastore::keys::{RESOURCE_ROOT, resource_path};
use margay_datastore::{
    Client, KvBackend, MemBackend, SyncStatus, SyncerEvent, SyncerOptions, WatcherSyncer,
};
use syncer_common::{View, pool};
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(10);

fn start<B: KvBackend + Clone>(
    b: &B,
    kinds: &[Kind],
    buffer: usize,
) -> (
    mpsc::Receiver<SyncerEvent>,
    std::sync::Arc<margay_datastore::syncer::SyncerStats>,
) {
    let mut opts = SyncerOptions::new(kinds.to_vec());
    opts.retry_delay = Duration::from_millis(20);
    let syncer = WatcherSyncer::new(b.clone(), opts);
    let stats = syncer.stats();
    let (tx, rx) = mpsc::channel(buffer);
    tokio::spawn(syncer.run(tx));
    (rx, stats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_then_reports_in_sync_then_streams_changes() {
    let b = MemBackend::new();
    let c = Client::new(b.clone());
    for i in 0..20 {
        c.create(pool(&format!("p{i}"), i)).await.unwrap();
    }
    let (mut rx, _) = start(&b, &[Kind::IPPool, Kind::Tier], 16);
    let mut view = View::default();
    view.until(&mut rx, T, View::in_sync).await;
    assert_eq!(
        view.statuses,
        vec![
            SyncStatus::WaitForDatastore,
            SyncStatus::ResyncInProgress,
            SyncStatus::InSync
        ]
    );
    assert_eq!(view.items.len(), 20);

    // Live changes after in-sync.
    let tier = Resource::Tier(Tier::new(ObjectMeta::named("security"), Default::default()));
    c.create(tier).await.unwrap();
    let p0 = c.get(&pool("p0", 0).key()).await.unwrap();
    let mut changed = p0.clone();
    if let Resource::IPPool(p) = &mut changed {
        p.spec.nat_outgoing = true;
    }
    c.update(changed).await.unwrap();
    c.delete(&pool("p1", 1).key(), None).await.unwrap();
    view.until(&mut rx, T, |v| {
        v.items.len() == 20 && v.items.keys().any(|k| k.kind == Kind::Tier)
    })
    .await;
    view.until(&mut rx, T, |v| {
        v.items
            .get(&pool("p0", 0).key())
            .is_some_and(|(_, r)| matches!(r, Resource::IPPool(p) if p.spec.nat_outgoing))
    })
    .await;
    assert_eq!(
        view.statuses.len(),
        3,
        "in-sync is never withdrawn or repeated"
    );
    for kind in [Kind::IPPool, Kind::Tier] {
        view.matches_list(&c, kind).await.unwrap();
    }
    assert_eq!(view.redundant, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_past_the_watcher_causes_a_difference_only_resync() {
    compaction_resync(MemBackend::new()).await;
}

#[cfg(feature = "local")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_resync_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let opts = margay_datastore::local::LocalOptions::new(dir.path().join("ds.db"));
    compaction_resync(margay_datastore::local::LocalBackend::open(opts).unwrap()).await;
}

async fn compaction_resync<B: KvBackend + Clone>(b: B) {
    let c = Client::new(b.clone());
    for i in 0..50 {
        c.create(pool(&format!("keep{i}"), i)).await.unwrap();
    }
    // A tiny output buffer: while the test does not read, the syncer (and its watch) stall.
    let (mut rx, stats) = start(&b, &[Kind::IPPool], 1);
    let mut view = View::default();
    view.until(&mut rx, T, View::in_sync).await;
    let resyncs_before = stats.resyncs.load(Ordering::Relaxed);

    // Many changes while the consumer sleeps (each its own watch batch, so the stalled
    // pipeline fills up and the watch falls behind), then compact past all of them.
    for i in 0..2000u32 {
        c.create(pool(&format!("new{i}"), 1000 + i)).await.unwrap();
        tokio::task::yield_now().await;
    }
    for i in 0..1800u32 {
        c.delete(&pool(&format!("new{i}"), 0).key(), None)
            .await
            .unwrap();
    }
    c.delete(&pool("keep0", 0).key(), None).await.unwrap();
    let rev = b.revision().await.unwrap();
    b.compact(rev).await.unwrap();

    view.until(&mut rx, T, |v| v.items.len() == 49 + 200).await;
    // Settle: drain anything still queued.
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {
        view.apply(ev);
    }
    view.matches_list(&c, Kind::IPPool).await.unwrap();
    assert!(
        stats.resyncs.load(Ordering::Relaxed) > resyncs_before,
        "no resync happened"
    );
    assert_eq!(view.redundant, 0, "unchanged keys were re-sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_values_are_reported_once_and_skipped() {
    let b = MemBackend::new();
    let c = Client::new(b.clone());
    c.create(pool("good", 1)).await.unwrap();
    // A corrupted value and a value of the wrong kind, written behind the client's back.
    let bad_key = resource_path(&pool("bad", 2).key());
    b.create(&bad_key, b"{not json".to_vec(), None)
        .await
        .unwrap();
    let wrong_kind = format!("{RESOURCE_ROOT}ippools/wrong");
    b.create(
        &wrong_kind,
        br#"{"apiVersion":"projectcalico.org/v3","kind":"Tier","metadata":{"name":"wrong"}}"#
            .to_vec(),
        None,
    )
    .await
    .unwrap();
    let (mut rx, stats) = start(&b, &[Kind::IPPool], 16);
    let mut view = View::default();
    view.until(&mut rx, T, View::in_sync).await;
    assert_eq!(view.items.len(), 1);
    assert_eq!(stats.undecodable.load(Ordering::Relaxed), 2);

    // The good key turns bad: it is gone for the consumer, the syncer carries on.
    let good_key = resource_path(&pool("good", 1).key());
    b.update(&good_key, b"garbage".to_vec(), None, None)
        .await
        .unwrap();
    view.until(&mut rx, T, |v| v.items.is_empty()).await;
    // A valid value for the bad key is picked up.
    b.update(
        &bad_key,
        serde_json::to_vec(&pool("bad", 2)).unwrap(),
        None,
        None,
    )
    .await
    .unwrap();
    c.create(pool("later", 3)).await.unwrap();
    view.until(&mut rx, T, |v| v.items.len() == 2).await;
    assert_eq!(stats.undecodable.load(Ordering::Relaxed), 3);
}
