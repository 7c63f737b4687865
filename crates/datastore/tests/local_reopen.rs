//! Reopening the datastore file: data, revisions and history survive; the revision never
//! goes backwards, even once compaction has emptied the log.
#![cfg(feature = "local")]
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use margay_datastore::local::{LocalBackend, LocalOptions};
use margay_datastore::{DatastoreError, KvBackend, KvEvent, Watch};

async fn drain(w: &mut Watch, want: usize) -> Vec<KvEvent> {
    let mut out = Vec::new();
    while out.len() < want {
        let batch = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .expect("timed out")
            .expect("watch closed")
            .expect("watch failed");
        out.extend(batch);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_sees_the_same_data_revisions_and_history() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dir/datastore.db");
    let open = || LocalBackend::open(LocalOptions::new(&path)).unwrap();

    let b = open();
    let a1 = b.create("/r/a", b"1".to_vec(), None).await.unwrap();
    b.create("/r/b", b"b".to_vec(), None).await.unwrap();
    b.update("/r/a", b"2".to_vec(), Some(a1.mod_revision), None)
        .await
        .unwrap();
    b.delete("/r/b", None).await.unwrap();
    b.create("/r/c", b"c".to_vec(), Some(Duration::from_secs(3600)))
        .await
        .unwrap();
    let listed = b.list("/r/").await.unwrap();
    let revision = b.revision().await.unwrap();
    let mut w = b.watch("/r/", 0).await.unwrap();
    let history = drain(&mut w, 5).await;
    drop(w);
    drop(b);

    let b = open();
    assert_eq!(b.list("/r/").await.unwrap(), listed);
    assert_eq!(b.revision().await.unwrap(), revision);
    let mut w = b.watch("/r/", 0).await.unwrap();
    assert_eq!(drain(&mut w, 5).await, history);
    drop(w);
    let next = b.update("/r/a", b"3".to_vec(), None, None).await.unwrap();
    assert_eq!(next.mod_revision, revision + 1);
    assert_eq!(next.create_revision, a1.create_revision);
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revision_never_goes_backwards_after_compaction_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("datastore.db");
    let open = || LocalBackend::open(LocalOptions::new(&path)).unwrap();

    let b = open();
    for i in 0..20 {
        b.create(&format!("/c/k{i}"), b"x".to_vec(), None)
            .await
            .unwrap();
    }
    for i in 0..20 {
        b.delete(&format!("/c/k{i}"), None).await.unwrap();
    }
    let revision = b.revision().await.unwrap();
    // Everything is compacted: the log is empty and no key is live.
    b.compact(revision).await.unwrap();
    assert_eq!(b.compacted_revision().await.unwrap(), revision);
    assert!(b.list("").await.unwrap().kvs.is_empty());
    drop(b);

    let b = open();
    assert_eq!(b.revision().await.unwrap(), revision);
    assert_eq!(b.compacted_revision().await.unwrap(), revision);
    assert_eq!(b.list("").await.unwrap().revision, revision);
    let err = b.watch("/c/", revision - 1).await.unwrap_err();
    assert!(
        matches!(err, DatastoreError::Compacted { requested, compacted } if requested == revision - 1 && compacted == revision),
        "{err:?}"
    );
    let mut w = b.watch("/c/", revision).await.unwrap();
    let kv = b.create("/c/again", b"y".to_vec(), None).await.unwrap();
    assert_eq!(kv.mod_revision, revision + 1);
    assert_eq!(kv.create_revision, revision + 1);
    let events = drain(&mut w, 1).await;
    assert_eq!(events[0].revision(), revision + 1);
    // Compacting beyond the store's revision is refused; compacting backwards is a no-op.
    let err = b.compact(revision + 5).await.unwrap_err();
    assert!(matches!(err, DatastoreError::Invalid { .. }), "{err:?}");
    b.compact(1).await.unwrap();
    assert_eq!(b.compacted_revision().await.unwrap(), revision);
    drop(w);
    drop(b);

    let b = open();
    assert_eq!(b.revision().await.unwrap(), revision + 1);
}
