//! The backend conformance suite: every KvBackend must pass every check here. Each check works
//! under its own key prefix so one store can run them all.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use margay_datastore::{DatastoreError, KvBackend, KvEvent};

/// Runs every check against `b`, with keys under `root` (e.g. "/conformance/<unique>/").
pub async fn run_all<B: KvBackend + Clone>(b: &B, root: &str) {
    create_get_and_exists(b, &format!("{root}create/")).await;
    update_compare_and_swap(b, &format!("{root}update/")).await;
    delete_semantics(b, &format!("{root}delete/")).await;
    list_by_prefix(b, &format!("{root}list/")).await;
    watch_order_and_resume(b, &format!("{root}watch/")).await;
    watch_ignores_other_prefixes(b, &format!("{root}watchpfx/")).await;
    concurrent_read_modify_write(b, &format!("{root}rmw/")).await;
    ttl_expiry(b, &format!("{root}ttl/")).await;
    // Compaction affects the whole store, so it runs last.
    compaction(b, &format!("{root}compact/")).await;
}

pub async fn create_get_and_exists<B: KvBackend>(b: &B, p: &str) {
    let k = format!("{p}a");
    assert_eq!(b.get(&k).await.unwrap(), None);
    let kv = b.create(&k, b"one".to_vec(), None).await.unwrap();
    assert_eq!(kv.value, b"one");
    assert_eq!(kv.create_revision, kv.mod_revision);
    let got = b.get(&k).await.unwrap().unwrap();
    assert_eq!(got, kv);
    let err = b.create(&k, b"two".to_vec(), None).await.unwrap_err();
    assert!(
        matches!(err, DatastoreError::AlreadyExists { .. }),
        "{err:?}"
    );
    assert_eq!(b.get(&k).await.unwrap().unwrap().value, b"one");
    assert!(b.revision().await.unwrap() >= kv.mod_revision);
}

pub async fn update_compare_and_swap<B: KvBackend>(b: &B, p: &str) {
    let k = format!("{p}a");
    let err = b.update(&k, b"x".to_vec(), None, None).await.unwrap_err();
    assert!(matches!(err, DatastoreError::NotFound { .. }), "{err:?}");
    let v1 = b.create(&k, b"1".to_vec(), None).await.unwrap();
    let v2 = b
        .update(&k, b"2".to_vec(), Some(v1.mod_revision), None)
        .await
        .unwrap();
    assert!(v2.mod_revision > v1.mod_revision);
    assert_eq!(v2.create_revision, v1.create_revision);
    // A stale revision loses and reports the current one; nothing is written.
    match b
        .update(&k, b"3".to_vec(), Some(v1.mod_revision), None)
        .await
        .unwrap_err()
    {
        DatastoreError::Conflict {
            current, expected, ..
        } => {
            assert_eq!(current, Some(v2.mod_revision));
            assert_eq!(expected, v1.mod_revision);
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(b.get(&k).await.unwrap().unwrap().value, b"2");
    // Unconditional update.
    let v3 = b.update(&k, b"3".to_vec(), None, None).await.unwrap();
    assert!(v3.mod_revision > v2.mod_revision);
}

pub async fn delete_semantics<B: KvBackend>(b: &B, p: &str) {
    let k = format!("{p}a");
    let err = b.delete(&k, None).await.unwrap_err();
    assert!(matches!(err, DatastoreError::NotFound { .. }), "{err:?}");
    let v1 = b.create(&k, b"1".to_vec(), None).await.unwrap();
    let v2 = b.update(&k, b"2".to_vec(), None, None).await.unwrap();
    let err = b.delete(&k, Some(v1.mod_revision)).await.unwrap_err();
    assert!(
        matches!(err, DatastoreError::Conflict { current: Some(c), .. } if c == v2.mod_revision),
        "{err:?}"
    );
    let gone = b.delete(&k, Some(v2.mod_revision)).await.unwrap();
    assert_eq!(gone.value, b"2");
    assert_eq!(b.get(&k).await.unwrap(), None);
    // Re-creating starts a new life: a new create revision.
    let again = b.create(&k, b"3".to_vec(), None).await.unwrap();
    assert!(again.create_revision > v1.create_revision);
}

pub async fn list_by_prefix<B: KvBackend>(b: &B, p: &str) {
    for name in ["c", "a", "b", "ab"] {
        b.create(&format!("{p}x/{name}"), name.as_bytes().to_vec(), None)
            .await
            .unwrap();
    }
    b.create(&format!("{p}y/z"), b"z".to_vec(), None)
        .await
        .unwrap();
    // A key that merely shares the textual prefix "x" but is not under "x/".
    b.create(&format!("{p}xx"), b"xx".to_vec(), None)
        .await
        .unwrap();
    let listed = b.list(&format!("{p}x/")).await.unwrap();
    let keys: Vec<_> = listed
        .kvs
        .iter()
        .map(|kv| kv.key.trim_start_matches(p).to_string())
        .collect();
    assert_eq!(keys, vec!["x/a", "x/ab", "x/b", "x/c"]);
    assert!(
        listed
            .kvs
            .iter()
            .all(|kv| kv.mod_revision <= listed.revision)
    );
    assert!(listed.revision <= b.revision().await.unwrap());
    assert_eq!(b.list(&format!("{p}none/")).await.unwrap().kvs.len(), 0);
    // Many keys.
    for i in 0..500 {
        b.create(&format!("{p}many/{i:04}"), vec![b'v'; 100], None)
            .await
            .unwrap();
    }
    assert_eq!(b.list(&format!("{p}many/")).await.unwrap().kvs.len(), 500);
}

async fn next_events(w: &mut margay_datastore::Watch, want: usize) -> Vec<KvEvent> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, w.next()).await {
            Ok(Some(Ok(batch))) => {
                assert!(!batch.is_empty(), "watch delivered an empty batch");
                out.extend(batch);
            }
            Ok(Some(Err(e))) => panic!("watch failed: {e}"),
            Ok(None) => panic!("watch closed after {} of {want} events", out.len()),
            Err(_) => panic!("timed out after {} of {want} events: {out:?}", out.len()),
        }
    }
    out
}

pub async fn watch_order_and_resume<B: KvBackend>(b: &B, p: &str) {
    let start = b.revision().await.unwrap();
    let mut w = b.watch(p, start).await.unwrap();
    let k = format!("{p}a");
    let c = b.create(&k, b"1".to_vec(), None).await.unwrap();
    let u = b
        .update(&k, b"2".to_vec(), Some(c.mod_revision), None)
        .await
        .unwrap();
    b.create(&format!("{p}b"), b"b".to_vec(), None)
        .await
        .unwrap();
    let d = b.delete(&k, None).await.unwrap();
    assert_eq!(d.value, b"2");
    let events = next_events(&mut w, 4).await;
    assert_eq!(events.len(), 4, "{events:?}");
    let revs: Vec<i64> = events.iter().map(KvEvent::revision).collect();
    assert!(
        revs.windows(2).all(|w| w[0] < w[1]),
        "not in order: {revs:?}"
    );
    match &events[0] {
        KvEvent::Put { kv, prev } => {
            assert_eq!(kv.value, b"1");
            assert!(prev.is_none());
        }
        e => panic!("{e:?}"),
    }
    match &events[1] {
        KvEvent::Put { kv, prev } => {
            assert_eq!(kv.mod_revision, u.mod_revision);
            assert_eq!(prev.as_ref().map(|p| p.value.clone()), Some(b"1".to_vec()));
        }
        e => panic!("{e:?}"),
    }
    match &events[3] {
        KvEvent::Delete { key, prev, .. } => {
            assert_eq!(key, &k);
            assert_eq!(prev.as_ref().map(|p| p.value.clone()), Some(b"2".to_vec()));
        }
        e => panic!("{e:?}"),
    }
    // Resuming from the first event's revision replays exactly the rest.
    let mut resumed = b.watch(p, revs[0]).await.unwrap();
    let again = next_events(&mut resumed, 3).await;
    assert_eq!(again, events[1..].to_vec());
}

pub async fn watch_ignores_other_prefixes<B: KvBackend>(b: &B, p: &str) {
    let start = b.revision().await.unwrap();
    let mut w = b.watch(&format!("{p}mine/"), start).await.unwrap();
    b.create(&format!("{p}other/a"), b"x".to_vec(), None)
        .await
        .unwrap();
    b.create(&format!("{p}mine/a"), b"y".to_vec(), None)
        .await
        .unwrap();
    let events = next_events(&mut w, 1).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].key(), format!("{p}mine/a"));
}

/// Eight writers increment one counter by read-modify-write with CAS: every increment survives.
pub async fn concurrent_read_modify_write<B: KvBackend + Clone>(b: &B, p: &str) {
    const WRITERS: usize = 8;
    const EACH: usize = 25;
    let k = Arc::new(format!("{p}counter"));
    b.create(&k, b"0".to_vec(), None).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let (b, k) = (b.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0u32;
            for _ in 0..EACH {
                loop {
                    let cur = b.get(&k).await.unwrap().unwrap();
                    let n: u64 = std::str::from_utf8(&cur.value).unwrap().parse().unwrap();
                    match b
                        .update(
                            &k,
                            (n + 1).to_string().into_bytes(),
                            Some(cur.mod_revision),
                            None,
                        )
                        .await
                    {
                        Ok(_) => break,
                        Err(DatastoreError::Conflict { .. }) => {
                            conflicts += 1;
                            assert!(conflicts < 100_000, "livelock");
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let v = b.get(&k).await.unwrap().unwrap();
    assert_eq!(
        std::str::from_utf8(&v.value).unwrap(),
        (WRITERS * EACH).to_string()
    );
}

pub async fn ttl_expiry<B: KvBackend>(b: &B, p: &str) {
    let start = b.revision().await.unwrap();
    let mut w = b.watch(p, start).await.unwrap();
    let k = format!("{p}status");
    b.create(&k, b"alive".to_vec(), Some(Duration::from_secs(1)))
        .await
        .unwrap();
    b.create(&format!("{p}keep"), b"keep".to_vec(), None)
        .await
        .unwrap();
    let events = next_events(&mut w, 3).await;
    assert!(
        matches!(&events[2], KvEvent::Delete { key, .. } if *key == k),
        "{events:?}"
    );
    assert_eq!(b.get(&k).await.unwrap(), None);
    assert!(b.get(&format!("{p}keep")).await.unwrap().is_some());
}

pub async fn compaction<B: KvBackend>(b: &B, p: &str) {
    let k = format!("{p}a");
    let first = b.create(&k, b"1".to_vec(), None).await.unwrap();
    let second = b.update(&k, b"2".to_vec(), None, None).await.unwrap();
    b.compact(second.mod_revision).await.unwrap();
    let err = b.watch(p, first.mod_revision - 1).await.map(|_| ()).err();
    let err = match err {
        Some(e) => e,
        // Some backends report compaction as the watch's first item.
        None => {
            let mut w = b.watch(p, first.mod_revision - 1).await.unwrap();
            tokio::time::timeout(Duration::from_secs(10), w.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap_err()
        }
    };
    assert!(matches!(err, DatastoreError::Compacted { .. }), "{err:?}");
    // Watching from the compacted revision itself is fine.
    let mut w = b.watch(p, second.mod_revision).await.unwrap();
    b.update(&k, b"3".to_vec(), None, None).await.unwrap();
    let events = next_events(&mut w, 1).await;
    assert!(matches!(&events[0], KvEvent::Put { kv, .. } if kv.value == b"3"));
}
