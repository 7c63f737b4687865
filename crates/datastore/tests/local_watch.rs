//! Watch behaviour specific to the SQLite backend: batching of a backlog, compaction
//! overtaking a slow watcher, and the automatic retention policy.
#![cfg(feature = "local")]
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use margay_datastore::kv::WatchItem;
use margay_datastore::local::{LocalBackend, LocalOptions, WATCH_BATCH};
use margay_datastore::{DatastoreError, KvBackend};

async fn next(w: &mut margay_datastore::Watch) -> WatchItem {
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("timed out")
        .expect("watch closed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_arrives_in_bounded_batches_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let b = LocalBackend::open(LocalOptions::new(dir.path().join("datastore.db"))).unwrap();
    let start = b.revision().await.unwrap();
    let n = usize::try_from(WATCH_BATCH).unwrap() * 2 + 500;
    for i in 0..n {
        b.create(&format!("/backlog/k{i:05}"), vec![b'v'; 50], None)
            .await
            .unwrap();
        // Writes elsewhere take revisions too; the watcher must skip them.
        if i % 100 == 0 {
            b.create(&format!("/elsewhere/k{i:05}"), Vec::new(), None)
                .await
                .unwrap();
        }
    }
    let mut w = b.watch("/backlog/", start).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < n {
        let batch = next(&mut w).await.unwrap();
        assert!(!batch.is_empty());
        assert!(batch.len() <= usize::try_from(WATCH_BATCH).unwrap());
        seen.extend(batch);
    }
    assert_eq!(seen.len(), n);
    for (i, e) in seen.iter().enumerate() {
        assert_eq!(e.key(), format!("/backlog/k{i:05}"));
    }
    assert!(seen.windows(2).all(|p| p[0].revision() < p[1].revision()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_overtaking_a_slow_watcher_ends_it_with_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let b = LocalBackend::open(LocalOptions::new(dir.path().join("datastore.db"))).unwrap();
    let start = b.revision().await.unwrap();
    let mut w = b.watch("/slow/", start).await.unwrap();
    // Paced writes arrive as separate batches, so the watch's queue fills up and its reader
    // falls behind the store.
    for i in 0..60 {
        b.create(&format!("/slow/k{i:03}"), b"x".to_vec(), None)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    let current = b.revision().await.unwrap();
    b.compact(current).await.unwrap();
    let mut expect = start + 1;
    loop {
        match next(&mut w).await {
            Ok(batch) => {
                for e in batch {
                    assert_eq!(e.revision(), expect, "gap or duplicate before the error");
                    expect += 1;
                }
                assert!(
                    expect <= current + 1,
                    "every event arrived: compaction never overtook"
                );
            }
            Err(DatastoreError::Compacted {
                requested,
                compacted,
            }) => {
                assert_eq!(requested, expect - 1);
                assert_eq!(compacted, current);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    // The watch is over.
    let end = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .unwrap();
    assert!(end.is_none(), "{end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_compacts_old_history_automatically() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = LocalOptions::new(dir.path().join("datastore.db"));
    opts.retain_revisions = 10;
    let b = LocalBackend::open(opts).unwrap();
    for i in 0..50 {
        b.create(&format!("/ret/k{i:03}"), b"x".to_vec(), None)
            .await
            .unwrap();
    }
    let current = b.revision().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.compacted_revision().await.unwrap() < current - 10 {
        assert!(Instant::now() < deadline, "retention did not compact");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(b.compacted_revision().await.unwrap(), current - 10);
    let err = b.watch("/ret/", 0).await.unwrap_err();
    assert!(matches!(err, DatastoreError::Compacted { .. }), "{err:?}");
    // The retained history is all there.
    let mut w = b.watch("/ret/", current - 10).await.unwrap();
    let batch = next(&mut w).await.unwrap();
    assert_eq!(batch.len(), 10);
    assert_eq!(batch[0].key(), "/ret/k040");
    // Live keys are untouched by compaction.
    assert_eq!(b.list("/ret/").await.unwrap().kvs.len(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_can_be_cleared_by_an_update_and_expired_keys_can_be_recreated() {
    let dir = tempfile::tempdir().unwrap();
    let b = LocalBackend::open(LocalOptions::new(dir.path().join("datastore.db"))).unwrap();
    let ttl = Some(Duration::from_millis(300));
    b.create("/ttl/kept", b"1".to_vec(), ttl).await.unwrap();
    b.update("/ttl/kept", b"2".to_vec(), None, None)
        .await
        .unwrap();
    let gone = b.create("/ttl/gone", b"1".to_vec(), ttl).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Invisible at once, whether or not the sweeper has run yet.
    assert_eq!(b.get("/ttl/gone").await.unwrap(), None);
    assert_eq!(b.list("/ttl/").await.unwrap().kvs.len(), 1);
    let again = b.create("/ttl/gone", b"2".to_vec(), None).await.unwrap();
    assert!(again.create_revision > gone.create_revision);
    assert_eq!(b.get("/ttl/kept").await.unwrap().unwrap().value, b"2");
    // The expiry appears in the history as a Delete before the re-create.
    let mut w = b.watch("/ttl/gone", gone.mod_revision).await.unwrap();
    let batch = next(&mut w).await.unwrap();
    assert!(
        matches!(&batch[0], margay_datastore::KvEvent::Delete { .. }),
        "{batch:?}"
    );
    assert!(
        matches!(&batch[1], margay_datastore::KvEvent::Put { prev: None, .. }),
        "{batch:?}"
    );
}
