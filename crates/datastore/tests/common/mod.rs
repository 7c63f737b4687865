//! The backend conformance suite: every KvBackend must pass every check here. Each check works
//! under its own key prefix so one store can run them all.
//!
//! A [`Fx`] (fixture) says how the checks' keys and payloads are stored: raw bytes under any
//! key (etcd, SQLite, mem), or Calico resources under keys a backend that only stores Calico's
//! data can hold (the Kubernetes datastore: GlobalNetworkSets carrying the payload in an
//! annotation). It also says which contract points a backend does not offer, each with why.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use margay_datastore::{Compare, DatastoreError, KvBackend, KvEvent, TxnOp, TxnOpResult};

/// What a backend offers beyond the common core.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub ttl: bool,
    pub compaction: bool,
    /// Put events carry the previous value.
    pub put_prev: bool,
    /// Keys remember the revision they were created at.
    pub create_revision: bool,
    /// Transactions are atomic (no torn reads between their writes).
    pub atomic_txn: bool,
}

#[derive(Debug, Clone)]
pub enum Layout {
    /// Keys and values as given.
    Raw,
    /// Keys become GlobalNetworkSet names under `root` (`/` → `.`), payloads an annotation.
    GlobalNetworkSets { root: String },
}

#[derive(Debug, Clone)]
pub struct Fx {
    pub layout: Layout,
    pub caps: Caps,
}

const PAYLOAD: &str = "conformance.margay.dev/payload";

impl Fx {
    pub fn raw() -> Fx {
        Fx {
            layout: Layout::Raw,
            caps: Caps {
                ttl: true,
                compaction: true,
                put_prev: true,
                create_revision: true,
                atomic_txn: true,
            },
        }
    }

    /// The stored key of a check's path.
    pub fn k(&self, path: &str) -> String {
        match &self.layout {
            Layout::Raw => path.to_string(),
            Layout::GlobalNetworkSets { root } => {
                let rest = path.strip_prefix(root.as_str()).unwrap_or(path);
                format!("{root}{}", rest.replace('/', "."))
            }
        }
    }

    /// The stored value of a payload at `key`.
    pub fn v(&self, key: &str, payload: &[u8]) -> Vec<u8> {
        match &self.layout {
            Layout::Raw => payload.to_vec(),
            Layout::GlobalNetworkSets { .. } => {
                let name = key.rsplit('/').next().unwrap();
                serde_json::to_vec(&serde_json::json!({
                    "apiVersion": "projectcalico.org/v3",
                    "kind": "GlobalNetworkSet",
                    "metadata": {
                        "name": name,
                        "annotations": {PAYLOAD: String::from_utf8(payload.to_vec()).unwrap()},
                    },
                    "spec": {},
                }))
                .unwrap()
            }
        }
    }

    /// The payload a stored value holds.
    pub fn read(&self, value: &[u8]) -> Vec<u8> {
        match &self.layout {
            Layout::Raw => value.to_vec(),
            Layout::GlobalNetworkSets { .. } => {
                let v: serde_json::Value = serde_json::from_slice(value).unwrap();
                v.pointer(&format!(
                    "/metadata/annotations/{}",
                    PAYLOAD.replace('/', "~1")
                ))
                .and_then(|p| p.as_str())
                .unwrap_or_else(|| panic!("no payload in {v}"))
                .as_bytes()
                .to_vec()
            }
        }
    }
}

/// Runs every check against `b`, with keys under `root` (e.g. "/conformance/<unique>/").
pub async fn run_all<B: KvBackend + Clone>(b: &B, root: &str) {
    run_all_with(b, root, &Fx::raw()).await;
}

/// Runs every check the fixture's backend offers.
pub async fn run_all_with<B: KvBackend + Clone>(b: &B, root: &str, fx: &Fx) {
    create_get_and_exists(b, &format!("{root}create/"), fx).await;
    update_compare_and_swap(b, &format!("{root}update/"), fx).await;
    delete_semantics(b, &format!("{root}delete/"), fx).await;
    list_by_prefix(b, &format!("{root}list/"), fx).await;
    watch_order_and_resume(b, &format!("{root}watch/"), fx).await;
    watch_ignores_other_prefixes(b, &format!("{root}watchpfx/"), fx).await;
    concurrent_read_modify_write(b, &format!("{root}rmw/"), fx).await;
    if fx.caps.ttl {
        ttl_expiry(b, &format!("{root}ttl/")).await;
    }
    txn_success_mixed_ops(b, &format!("{root}txn/"), fx).await;
    txn_compare_failure_changes_nothing(b, &format!("{root}txnfail/"), fx).await;
    txn_reads_only(b, &format!("{root}txnread/"), fx).await;
    if fx.caps.atomic_txn {
        txn_concurrent_pairs_stay_equal(b, &format!("{root}txnpair/")).await;
    }
    // Compaction affects the whole store, so it runs last.
    if fx.caps.compaction {
        compaction(b, &format!("{root}compact/")).await;
    }
}

pub async fn create_get_and_exists<B: KvBackend>(b: &B, p: &str, fx: &Fx) {
    let k = fx.k(&format!("{p}a"));
    assert_eq!(b.get(&k).await.unwrap(), None);
    let kv = b.create(&k, fx.v(&k, b"one"), None).await.unwrap();
    assert_eq!(fx.read(&kv.value), b"one");
    assert_eq!(kv.create_revision, kv.mod_revision);
    let got = b.get(&k).await.unwrap().unwrap();
    assert_eq!(got, kv);
    let err = b.create(&k, fx.v(&k, b"two"), None).await.unwrap_err();
    assert!(
        matches!(err, DatastoreError::AlreadyExists { .. }),
        "{err:?}"
    );
    assert_eq!(fx.read(&b.get(&k).await.unwrap().unwrap().value), b"one");
    assert!(b.revision().await.unwrap() >= kv.mod_revision);
}

pub async fn update_compare_and_swap<B: KvBackend>(b: &B, p: &str, fx: &Fx) {
    let k = fx.k(&format!("{p}a"));
    let err = b.update(&k, fx.v(&k, b"x"), None, None).await.unwrap_err();
    assert!(matches!(err, DatastoreError::NotFound { .. }), "{err:?}");
    let v1 = b.create(&k, fx.v(&k, b"1"), None).await.unwrap();
    let v2 = b
        .update(&k, fx.v(&k, b"2"), Some(v1.mod_revision), None)
        .await
        .unwrap();
    assert!(v2.mod_revision > v1.mod_revision);
    if fx.caps.create_revision {
        assert_eq!(v2.create_revision, v1.create_revision);
    }
    // A stale revision loses and reports the current one; nothing is written.
    match b
        .update(&k, fx.v(&k, b"3"), Some(v1.mod_revision), None)
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
    assert_eq!(fx.read(&b.get(&k).await.unwrap().unwrap().value), b"2");
    // Unconditional update.
    let v3 = b.update(&k, fx.v(&k, b"3"), None, None).await.unwrap();
    assert!(v3.mod_revision > v2.mod_revision);
}

pub async fn delete_semantics<B: KvBackend>(b: &B, p: &str, fx: &Fx) {
    let k = fx.k(&format!("{p}a"));
    let err = b.delete(&k, None).await.unwrap_err();
    assert!(matches!(err, DatastoreError::NotFound { .. }), "{err:?}");
    let v1 = b.create(&k, fx.v(&k, b"1"), None).await.unwrap();
    let v2 = b.update(&k, fx.v(&k, b"2"), None, None).await.unwrap();
    let err = b.delete(&k, Some(v1.mod_revision)).await.unwrap_err();
    assert!(
        matches!(err, DatastoreError::Conflict { current: Some(c), .. } if c == v2.mod_revision),
        "{err:?}"
    );
    let gone = b.delete(&k, Some(v2.mod_revision)).await.unwrap();
    assert_eq!(fx.read(&gone.value), b"2");
    assert_eq!(b.get(&k).await.unwrap(), None);
    // Re-creating starts a new life: a new create revision.
    let again = b.create(&k, fx.v(&k, b"3"), None).await.unwrap();
    assert!(again.create_revision > v1.create_revision);
}

pub async fn list_by_prefix<B: KvBackend>(b: &B, p: &str, fx: &Fx) {
    for name in ["c", "a", "b", "ab"] {
        let k = fx.k(&format!("{p}x/{name}"));
        b.create(&k, fx.v(&k, name.as_bytes()), None).await.unwrap();
    }
    let k = fx.k(&format!("{p}y/z"));
    b.create(&k, fx.v(&k, b"z"), None).await.unwrap();
    // A key that merely shares the textual prefix "x" but is not under "x/".
    let k = fx.k(&format!("{p}xx"));
    b.create(&k, fx.v(&k, b"xx"), None).await.unwrap();
    let listed = b.list(&fx.k(&format!("{p}x/"))).await.unwrap();
    let payloads: Vec<Vec<u8>> = listed.kvs.iter().map(|kv| fx.read(&kv.value)).collect();
    assert_eq!(
        payloads,
        vec![b"a".to_vec(), b"ab".to_vec(), b"b".to_vec(), b"c".to_vec()]
    );
    let keys: Vec<String> = listed.kvs.iter().map(|kv| kv.key.clone()).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "a listing is in key order");
    assert!(
        listed
            .kvs
            .iter()
            .all(|kv| kv.mod_revision <= listed.revision)
    );
    assert!(listed.revision <= b.revision().await.unwrap());
    assert_eq!(
        b.list(&fx.k(&format!("{p}none/"))).await.unwrap().kvs.len(),
        0
    );
    // Many keys.
    for i in 0..500 {
        let k = fx.k(&format!("{p}many/{i:04}"));
        b.create(&k, fx.v(&k, &[b'v'; 100]), None).await.unwrap();
    }
    assert_eq!(
        b.list(&fx.k(&format!("{p}many/"))).await.unwrap().kvs.len(),
        500
    );
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

pub async fn watch_order_and_resume<B: KvBackend>(b: &B, p: &str, fx: &Fx) {
    let start = b.revision().await.unwrap();
    let mut w = b.watch(&fx.k(p), start).await.unwrap();
    let k = fx.k(&format!("{p}a"));
    let c = b.create(&k, fx.v(&k, b"1"), None).await.unwrap();
    let u = b
        .update(&k, fx.v(&k, b"2"), Some(c.mod_revision), None)
        .await
        .unwrap();
    let kb = fx.k(&format!("{p}b"));
    b.create(&kb, fx.v(&kb, b"b"), None).await.unwrap();
    let d = b.delete(&k, None).await.unwrap();
    assert_eq!(fx.read(&d.value), b"2");
    let events = next_events(&mut w, 4).await;
    assert_eq!(events.len(), 4, "{events:?}");
    let revs: Vec<i64> = events.iter().map(KvEvent::revision).collect();
    assert!(
        revs.windows(2).all(|w| w[0] < w[1]),
        "not in order: {revs:?}"
    );
    match &events[0] {
        KvEvent::Put { kv, prev } => {
            assert_eq!(fx.read(&kv.value), b"1");
            assert!(prev.is_none());
        }
        e => panic!("{e:?}"),
    }
    match &events[1] {
        KvEvent::Put { kv, prev } => {
            assert_eq!(kv.mod_revision, u.mod_revision);
            if fx.caps.put_prev {
                assert_eq!(
                    prev.as_ref().map(|p| fx.read(&p.value)),
                    Some(b"1".to_vec())
                );
            }
        }
        e => panic!("{e:?}"),
    }
    match &events[3] {
        KvEvent::Delete { key, prev, .. } => {
            assert_eq!(key, &k);
            assert_eq!(
                prev.as_ref().map(|p| fx.read(&p.value)),
                Some(b"2".to_vec())
            );
        }
        e => panic!("{e:?}"),
    }
    // Resuming from the first event's revision replays exactly the rest.
    let mut resumed = b.watch(&fx.k(p), revs[0]).await.unwrap();
    let again = next_events(&mut resumed, 3).await;
    assert_eq!(again, events[1..].to_vec());
}

pub async fn watch_ignores_other_prefixes<B: KvBackend>(b: &B, p: &str, fx: &Fx) {
    let start = b.revision().await.unwrap();
    let mut w = b.watch(&fx.k(&format!("{p}mine/")), start).await.unwrap();
    let other = fx.k(&format!("{p}other/a"));
    b.create(&other, fx.v(&other, b"x"), None).await.unwrap();
    let mine = fx.k(&format!("{p}mine/a"));
    b.create(&mine, fx.v(&mine, b"y"), None).await.unwrap();
    let events = next_events(&mut w, 1).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].key(), mine);
}

/// Eight writers increment one counter by read-modify-write with CAS: every increment survives.
pub async fn concurrent_read_modify_write<B: KvBackend + Clone>(b: &B, p: &str, fx: &Fx) {
    const WRITERS: usize = 8;
    const EACH: usize = 25;
    let k = Arc::new(fx.k(&format!("{p}counter")));
    b.create(&k, fx.v(&k, b"0"), None).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let (b, k, fx) = (b.clone(), k.clone(), fx.clone());
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0u32;
            for _ in 0..EACH {
                loop {
                    let cur = b.get(&k).await.unwrap().unwrap();
                    let n: u64 = std::str::from_utf8(&fx.read(&cur.value))
                        .unwrap()
                        .parse()
                        .unwrap();
                    match b
                        .update(
                            &k,
                            fx.v(&k, (n + 1).to_string().as_bytes()),
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
        String::from_utf8(fx.read(&v.value)).unwrap(),
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

/// All compares hold: puts (create and replace), a delete, a delete of a missing key, and
/// reads that see the transaction's own earlier writes, applied at once; a watcher sees the
/// writes in op order, and nothing else in between.
pub async fn txn_success_mixed_ops<B: KvBackend>(b: &B, p: &str, fx: &Fx) {
    let (ka, kb, kc, kd) = (
        fx.k(&format!("{p}x/a")),
        fx.k(&format!("{p}x/b")),
        fx.k(&format!("{p}x/c")),
        fx.k(&format!("{p}x/d")),
    );
    let vb = b.create(&kb, fx.v(&kb, b"b1"), None).await.unwrap();
    let vc = b.create(&kc, fx.v(&kc, b"c1"), None).await.unwrap();
    let before = b.revision().await.unwrap();
    let mut w = b.watch(&fx.k(p), before).await.unwrap();
    let resp = b
        .txn(
            vec![
                Compare::Absent(ka.clone()),
                Compare::ModRevision(kb.clone(), vb.mod_revision),
                Compare::Exists(kc.clone()),
            ],
            vec![
                TxnOp::put(&ka, fx.v(&ka, b"a1")),
                TxnOp::put(&kb, fx.v(&kb, b"b2")),
                TxnOp::delete(&kc),
                TxnOp::delete(&kd),
                TxnOp::get(&kb),
                TxnOp::list(fx.k(&format!("{p}x/"))),
            ],
        )
        .await
        .unwrap();
    assert!(resp.revision > before);
    assert_eq!(resp.revision, b.revision().await.unwrap());
    assert_eq!(resp.results.len(), 6);
    let TxnOpResult::Put(a) = &resp.results[0] else {
        panic!("{:?}", resp.results[0])
    };
    assert_eq!(
        (a.key.as_str(), fx.read(&a.value).as_slice()),
        (ka.as_str(), &b"a1"[..])
    );
    assert_eq!(a.create_revision, a.mod_revision);
    assert!(a.mod_revision > before);
    let TxnOpResult::Put(bb) = &resp.results[1] else {
        panic!("{:?}", resp.results[1])
    };
    if fx.caps.create_revision {
        assert_eq!(bb.create_revision, vb.create_revision);
    }
    assert!(bb.mod_revision > vb.mod_revision);
    assert_eq!(resp.results[2], TxnOpResult::Delete(Some(vc.clone())));
    assert_eq!(resp.results[3], TxnOpResult::Delete(None));
    // Reads see the writes before them.
    assert_eq!(resp.results[4], TxnOpResult::Get(Some(bb.clone())));
    assert_eq!(
        resp.results[5],
        TxnOpResult::List(vec![a.clone(), bb.clone()])
    );
    assert_eq!(b.get(&ka).await.unwrap().as_ref(), Some(a));
    assert_eq!(b.get(&kb).await.unwrap().as_ref(), Some(bb));
    assert_eq!(b.get(&kc).await.unwrap(), None);
    // The next write comes after every write of the transaction.
    let kl = fx.k(&format!("{p}later"));
    let later = b.create(&kl, fx.v(&kl, b"l"), None).await.unwrap();
    assert!(later.mod_revision > resp.revision);
    let events = next_events(&mut w, 4).await;
    let keys: Vec<&str> = events.iter().map(KvEvent::key).collect();
    assert_eq!(
        keys,
        vec![ka.as_str(), kb.as_str(), kc.as_str(), kl.as_str()]
    );
    let revs: Vec<i64> = events.iter().map(KvEvent::revision).collect();
    assert!(revs.windows(2).all(|w| w[0] <= w[1]), "{revs:?}");
    assert!(revs[2] < revs[3]);
    assert!(
        matches!(&events[2], KvEvent::Delete { prev: Some(prev), .. } if fx.read(&prev.value) == b"c1")
    );
    // A key may be written only once per transaction.
    let err = b
        .txn(
            vec![],
            vec![TxnOp::put(&ka, fx.v(&ka, b"1")), TxnOp::delete(&ka)],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, DatastoreError::Invalid { .. }), "{err:?}");
    assert_eq!(b.get(&ka).await.unwrap().as_ref(), Some(a));
}

/// Any compare that does not hold: nothing is written, no revision is used, and the error is
/// the one the single-key write would give, naming the key.
pub async fn txn_compare_failure_changes_nothing<B: KvBackend>(b: &B, p: &str, fx: &Fx) {
    let (ka, kb, missing) = (
        fx.k(&format!("{p}a")),
        fx.k(&format!("{p}b")),
        fx.k(&format!("{p}missing")),
    );
    let va1 = b.create(&ka, fx.v(&ka, b"a1"), None).await.unwrap();
    let va2 = b.update(&ka, fx.v(&ka, b"a2"), None, None).await.unwrap();
    let vb = b.create(&kb, fx.v(&kb, b"b1"), None).await.unwrap();
    let before = b.revision().await.unwrap();
    let writes = || {
        vec![
            TxnOp::put(&kb, fx.v(&kb, b"b2")),
            TxnOp::delete(&ka),
            TxnOp::put(&missing, fx.v(&missing, b"new")),
        ]
    };
    let cases: Vec<(Vec<Compare>, &str)> = vec![
        // Stale revision (the second compare; the first holds).
        (
            vec![
                Compare::ModRevision(kb.clone(), vb.mod_revision),
                Compare::ModRevision(ka.clone(), va1.mod_revision),
            ],
            "conflict",
        ),
        (vec![Compare::Absent(ka.clone())], "exists"),
        (vec![Compare::Exists(missing.clone())], "missing"),
        (
            vec![Compare::ModRevision(missing.clone(), vb.mod_revision)],
            "missing",
        ),
    ];
    for (compares, want) in cases {
        let err = b.txn(compares.clone(), writes()).await.unwrap_err();
        match (want, &err) {
            (
                "conflict",
                DatastoreError::Conflict {
                    key,
                    expected,
                    current,
                },
            ) => {
                assert_eq!(key, &ka);
                assert_eq!(*expected, va1.mod_revision);
                assert_eq!(*current, Some(va2.mod_revision));
            }
            ("exists", DatastoreError::AlreadyExists { key }) => assert_eq!(key, &ka),
            ("missing", DatastoreError::NotFound { key }) => assert_eq!(key, &missing),
            _ => panic!("{compares:?}: expected {want}, got {err:?}"),
        }
        assert_eq!(b.revision().await.unwrap(), before, "{compares:?} wrote");
        assert_eq!(b.get(&ka).await.unwrap(), Some(va2.clone()));
        assert_eq!(b.get(&kb).await.unwrap(), Some(vb.clone()));
        assert_eq!(b.get(&missing).await.unwrap(), None);
    }
    // The same transaction with conditions that hold goes through.
    b.txn(
        vec![
            Compare::ModRevision(ka.clone(), va2.mod_revision),
            Compare::Absent(missing.clone()),
        ],
        writes(),
    )
    .await
    .unwrap();
    assert_eq!(b.get(&ka).await.unwrap(), None);
    assert_eq!(
        fx.read(&b.get(&missing).await.unwrap().unwrap().value),
        b"new"
    );
}

/// Reads only: one consistent view, no new revision; compares still apply.
pub async fn txn_reads_only<B: KvBackend>(b: &B, p: &str, fx: &Fx) {
    let ka = fx.k(&format!("{p}a"));
    let va = b.create(&ka, fx.v(&ka, b"a"), None).await.unwrap();
    for n in ["1", "2"] {
        let k = fx.k(&format!("{p}l/{n}"));
        b.create(&k, fx.v(&k, n.as_bytes()), None).await.unwrap();
    }
    let before = b.revision().await.unwrap();
    let resp = b
        .txn(
            vec![Compare::ModRevision(ka.clone(), va.mod_revision)],
            vec![
                TxnOp::get(&ka),
                TxnOp::get(fx.k(&format!("{p}none"))),
                TxnOp::list(fx.k(&format!("{p}l/"))),
                TxnOp::list(fx.k(&format!("{p}empty/"))),
            ],
        )
        .await
        .unwrap();
    assert_eq!(resp.revision, before);
    assert_eq!(b.revision().await.unwrap(), before);
    assert_eq!(resp.results[0], TxnOpResult::Get(Some(va.clone())));
    assert_eq!(resp.results[1], TxnOpResult::Get(None));
    let TxnOpResult::List(l) = &resp.results[2] else {
        panic!("{:?}", resp.results[2])
    };
    assert_eq!(
        l.iter().map(|kv| fx.read(&kv.value)).collect::<Vec<_>>(),
        vec![b"1".to_vec(), b"2".to_vec()]
    );
    assert_eq!(resp.results[3], TxnOpResult::List(vec![]));
    let err = b
        .txn(vec![Compare::Absent(ka.clone())], vec![TxnOp::get(&ka)])
        .await
        .unwrap_err();
    assert!(
        matches!(err, DatastoreError::AlreadyExists { .. }),
        "{err:?}"
    );
    // No compares, no ops: the current revision.
    assert_eq!(b.txn(vec![], vec![]).await.unwrap().revision, before);
}

/// Writers move one unit between two keys with read-both, CAS-both transactions: with every
/// transaction atomic, the sum never changes and every move lands.
pub async fn txn_concurrent_pairs_stay_equal<B: KvBackend + Clone>(b: &B, p: &str) {
    const WRITERS: usize = 6;
    const EACH: usize = 15;
    let (ka, kb) = (format!("{p}a"), format!("{p}b"));
    b.create(&ka, b"1000".to_vec(), None).await.unwrap();
    b.create(&kb, b"0".to_vec(), None).await.unwrap();
    let num = |v: &[u8]| -> i64 { std::str::from_utf8(v).unwrap().parse().unwrap() };
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let (b, ka, kb) = (b.clone(), ka.clone(), kb.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..EACH {
                let mut conflicts = 0u32;
                loop {
                    let read = b
                        .txn(vec![], vec![TxnOp::get(&ka), TxnOp::get(&kb)])
                        .await
                        .unwrap();
                    let [TxnOpResult::Get(Some(a)), TxnOpResult::Get(Some(bv))] = &read.results[..]
                    else {
                        panic!("{read:?}")
                    };
                    assert_eq!(num(&a.value) + num(&bv.value), 1000, "torn read");
                    match b
                        .txn(
                            vec![
                                Compare::ModRevision(ka.clone(), a.mod_revision),
                                Compare::ModRevision(kb.clone(), bv.mod_revision),
                            ],
                            vec![
                                TxnOp::put(&ka, (num(&a.value) - 1).to_string().into_bytes()),
                                TxnOp::put(&kb, (num(&bv.value) + 1).to_string().into_bytes()),
                            ],
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
    let moved = (WRITERS * EACH) as i64;
    assert_eq!(num(&b.get(&ka).await.unwrap().unwrap().value), 1000 - moved);
    assert_eq!(num(&b.get(&kb).await.unwrap().unwrap().value), moved);
}
