//! Dropping the last handle stops the poller thread. Alone in its test binary, because it
//! counts this process's poller threads.
#![cfg(feature = "local")]
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use margay_datastore::KvBackend;
use margay_datastore::local::{LocalBackend, LocalOptions};

/// Threads of this process named like the poller ("margay-ds-poll").
fn pollers() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "margay-ds-poll")
        .count()
}

async fn wait_for_pollers(want: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pollers() != want {
        assert!(
            Instant::now() < deadline,
            "{} poller threads, want {want}",
            pollers()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poller_stops_when_the_last_handle_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("datastore.db");
    assert_eq!(pollers(), 0);
    let b = LocalBackend::open(LocalOptions::new(&path)).unwrap();
    // The thread names itself once it runs.
    wait_for_pollers(1).await;
    let c = b.clone();
    drop(b);
    assert_eq!(pollers(), 1);
    // A watch keeps the backend (and its cross-process wake-ups) alive.
    let w = c.watch("/", 0).await.unwrap();
    drop(c);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(pollers(), 1);
    drop(w);
    wait_for_pollers(0).await;
    // Dropping a plain handle joins the thread (the kernel may list it a moment longer).
    let b = LocalBackend::open(LocalOptions::new(&path)).unwrap();
    b.create("/k", b"v".to_vec(), None).await.unwrap();
    wait_for_pollers(1).await;
    drop(b);
    wait_for_pollers(0).await;
}
