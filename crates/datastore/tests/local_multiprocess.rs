//! Several processes sharing one datastore file. The test binary re-executes itself
//! (`child_process`, told what to do by environment variables) to get real second processes.
#![cfg(feature = "local")]
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use margay_datastore::local::{LocalBackend, LocalOptions};
use margay_datastore::{DatastoreError, KvBackend, KvEvent, Watch};

const ROLE: &str = "MARGAY_LOCAL_MP_ROLE";
const DB: &str = "MARGAY_LOCAL_MP_DB";
const COUNT: &str = "MARGAY_LOCAL_MP_COUNT";

/// The writer child's workload: `n` creates, then updates and deletes of every tenth key.
fn writer_script(n: usize) -> Vec<(String, Option<Vec<u8>>)> {
    let mut ops: Vec<(String, Option<Vec<u8>>)> = (0..n)
        .map(|i| {
            (
                format!("/mp/watch/k{i:05}"),
                Some(format!("v{i}").into_bytes()),
            )
        })
        .collect();
    for i in (0..n).step_by(10) {
        ops.push((
            format!("/mp/watch/k{i:05}"),
            Some(format!("u{i}").into_bytes()),
        ));
    }
    for i in (0..n).step_by(10) {
        ops.push((format!("/mp/watch/k{i:05}"), None));
    }
    ops
}

async fn increment(b: &LocalBackend, key: &str, times: usize) {
    for _ in 0..times {
        let mut conflicts = 0u32;
        loop {
            let cur = b.get(key).await.unwrap().unwrap();
            let n: u64 = std::str::from_utf8(&cur.value).unwrap().parse().unwrap();
            let next = (n + 1).to_string().into_bytes();
            match b.update(key, next, Some(cur.mod_revision), None).await {
                Ok(_) => break,
                Err(DatastoreError::Conflict { .. }) => {
                    conflicts += 1;
                    assert!(conflicts < 100_000, "livelock");
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
}

/// Not a test on its own: the body of the child processes the other tests start. Without
/// the role variable it does nothing.
#[test]
fn child_process() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let db = std::env::var(DB).unwrap();
    let count: usize = std::env::var(COUNT).unwrap().parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let b = LocalBackend::open(LocalOptions::new(db)).unwrap();
        match role.as_str() {
            "writer" => {
                for (key, value) in writer_script(count) {
                    match value {
                        Some(v) if v.starts_with(b"v") => {
                            b.create(&key, v, None).await.unwrap();
                        }
                        Some(v) => {
                            b.update(&key, v, None, None).await.unwrap();
                        }
                        None => {
                            b.delete(&key, None).await.unwrap();
                        }
                    }
                }
            }
            "incrementer" => increment(&b, "/mp/cas/counter", count).await,
            "ttl" => {
                b.create(
                    "/mp/ttl/lease",
                    b"alive".to_vec(),
                    Some(Duration::from_millis(500)),
                )
                .await
                .unwrap();
            }
            other => panic!("unknown role {other}"),
        }
    });
}

/// Kills the child if the test fails before it finished.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl ChildGuard {
    fn spawn(role: &str, db: &Path, count: usize) -> ChildGuard {
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_process",
                "--nocapture",
                "--test-threads=1",
                "-q",
            ])
            .env(ROLE, role)
            .env(DB, db)
            .env(COUNT, count.to_string())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        ChildGuard(Some(child))
    }

    /// Waits (bounded) for the child to exit and asserts it succeeded.
    async fn finish(mut self, within: Duration) {
        let deadline = Instant::now() + within;
        let child = self.0.as_mut().unwrap();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.0 = None;
                assert!(status.success(), "child failed: {status}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "child did not finish within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn collect(w: &mut Watch, want: usize, within: Duration) -> Vec<KvEvent> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    while out.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, w.next()).await {
            Ok(Some(Ok(batch))) => {
                assert!(!batch.is_empty(), "empty batch");
                out.extend(batch);
            }
            Ok(Some(Err(e))) => panic!("watch failed: {e}"),
            Ok(None) => panic!("watch closed after {} of {want} events", out.len()),
            Err(_) => panic!("timed out after {} of {want} events", out.len()),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_sees_every_write_of_another_process_in_order() {
    const N: usize = 1000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("datastore.db");
    let b = LocalBackend::open(LocalOptions::new(&path)).unwrap();
    let start = b.revision().await.unwrap();
    let mut w = b.watch("/mp/watch/", start).await.unwrap();
    let child = ChildGuard::spawn("writer", &path, N);
    let script = writer_script(N);
    let events = collect(&mut w, script.len(), Duration::from_secs(120)).await;
    child.finish(Duration::from_secs(30)).await;
    assert_eq!(events.len(), script.len());
    // Only the child writes, so its writes took consecutive revisions: no gap, no duplicate.
    for (i, (e, (key, value))) in events.iter().zip(&script).enumerate() {
        assert_eq!(e.revision(), start + 1 + i64::try_from(i).unwrap(), "{e:?}");
        assert_eq!(e.key(), key);
        match (e, value) {
            (KvEvent::Put { kv, prev }, Some(v)) => {
                assert_eq!(&kv.value, v);
                assert_eq!(prev.is_some(), v.starts_with(b"u"));
            }
            (KvEvent::Delete { prev, .. }, None) => {
                assert!(prev.as_ref().unwrap().value.starts_with(b"u"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // Nothing more arrives.
    let extra = tokio::time::timeout(Duration::from_millis(200), w.next()).await;
    assert!(extra.is_err(), "unexpected extra item {extra:?}");
    assert_eq!(
        b.revision().await.unwrap(),
        start + i64::try_from(script.len()).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_swap_increments_from_three_processes_all_survive() {
    const EACH: usize = 150;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("datastore.db");
    let b = LocalBackend::open(LocalOptions::new(&path)).unwrap();
    b.create("/mp/cas/counter", b"0".to_vec(), None)
        .await
        .unwrap();
    let c1 = ChildGuard::spawn("incrementer", &path, EACH);
    let c2 = ChildGuard::spawn("incrementer", &path, EACH);
    let local = tokio::time::timeout(
        Duration::from_secs(120),
        increment(&b, "/mp/cas/counter", EACH),
    );
    local.await.expect("local increments timed out");
    c1.finish(Duration::from_secs(120)).await;
    c2.finish(Duration::from_secs(120)).await;
    let v = b.get("/mp/cas/counter").await.unwrap().unwrap();
    assert_eq!(
        std::str::from_utf8(&v.value).unwrap(),
        (3 * EACH).to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_key_of_an_exited_process_expires_with_a_delete_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("datastore.db");
    let b = LocalBackend::open(LocalOptions::new(&path)).unwrap();
    let start = b.revision().await.unwrap();
    let mut w = b.watch("/mp/ttl/", start).await.unwrap();
    ChildGuard::spawn("ttl", &path, 0)
        .finish(Duration::from_secs(30))
        .await;
    let events = collect(&mut w, 2, Duration::from_secs(10)).await;
    assert!(
        matches!(&events[0], KvEvent::Put { kv, .. } if kv.value == b"alive"),
        "{events:?}"
    );
    match &events[1] {
        KvEvent::Delete { key, prev, .. } => {
            assert_eq!(key, "/mp/ttl/lease");
            assert_eq!(prev.as_ref().unwrap().value, b"alive");
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(b.get("/mp/ttl/lease").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_backends_in_one_process_see_each_others_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("datastore.db");
    let a = LocalBackend::open(LocalOptions::new(&path)).unwrap();
    let b = LocalBackend::open(LocalOptions::new(&path)).unwrap();
    let start = a.revision().await.unwrap();
    let mut w = a.watch("/two/", start).await.unwrap();
    let kv = b.create("/two/x", b"from b".to_vec(), None).await.unwrap();
    let events = collect(&mut w, 1, Duration::from_secs(10)).await;
    assert!(matches!(&events[0], KvEvent::Put { kv: got, .. } if *got == kv));
    assert_eq!(a.get("/two/x").await.unwrap(), Some(kv));
}
