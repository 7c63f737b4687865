#![allow(clippy::unwrap_used)]
// The counting allocator below needs `unsafe impl GlobalAlloc`; the workspace lint is "deny"
// (not "forbid") so that a test binary can opt in.
#![allow(unsafe_code)]
//! Hostile clients against a live Typha (issue 17): what a stranger on the network can make
//! the server hold is bounded, measured with a counting allocator (bytes in use on the heap,
//! process-wide, and their high-water mark), and healthy clients stay in sync throughout.
//! The tests of this binary run one at a time (a lock) so that each measures only itself.
//! The full-size soak (1,000 connections of each kind, 100 clients) is `examples/soak.rs`.

mod common;
#[path = "common/hostile.rs"]
mod hostile;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use hostile::Hostile;
use margay_datastore::{KvBackend, MemBackend};
use margay_typha::TyphaConfig;
use margay_typha::daemon::Embedded;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// ---------------------------------------------------------------------------------------
// Counting allocator (process-wide).

struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let now = IN_USE.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the system allocator; only sizes are noted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                IN_USE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Starts a measurement: the high-water mark is reset to what is in use now.
fn heap_baseline() -> usize {
    let now = IN_USE.load(Ordering::Relaxed);
    PEAK.store(now, Ordering::Relaxed);
    now
}

fn heap_peak_since(base: usize) -> usize {
    PEAK.load(Ordering::Relaxed).saturating_sub(base)
}

/// One test at a time: each measures the whole process's heap.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MIB: usize = 1 << 20;

// ---------------------------------------------------------------------------------------

fn big_value(i: usize, nets: usize) -> Vec<u8> {
    let list: Vec<String> = (0..nets)
        .map(|n| format!("\"10.{}.{}.{}/32\"", i % 250, (n >> 8) & 0xff, n & 0xff))
        .collect();
    format!(
        r#"{{"apiVersion":"projectcalico.org/v3","kind":"NetworkSet","metadata":{{"name":"big-{i}","namespace":"ns"}},"spec":{{"nets":[{}]}}}}"#,
        list.join(",")
    )
    .into_bytes()
}

/// A Typha over a MemBackend holding `big` values of about 20 KB (plus 10 small ones) and
/// one healthy client in sync.
async fn typha_with(cfg: &TyphaConfig, big: usize) -> (MemBackend, Embedded, TestClient) {
    let kv = MemBackend::new();
    for i in 0..10 {
        put(&kv, i, 0).await;
    }
    for i in 0..big {
        kv.create(
            &format!("/calico/resources/v3/projectcalico.org/networksets/ns/big-{i}"),
            big_value(i, 1100),
            None,
        )
        .await
        .unwrap();
    }
    let typha = Embedded::start(kv.clone(), cfg, None, "127.0.0.1:0")
        .await
        .unwrap();
    let good = TestClient::start(client_opts(vec![typha.addr.to_string()], "healthy"));
    converge(&kv, &[&good], Duration::from_secs(20)).await;
    (kv, typha, good)
}

async fn converge(kv: &MemBackend, clients: &[&TestClient], bound: Duration) {
    let t = Instant::now();
    loop {
        let want = store_view(kv).await;
        if clients.iter().all(|c| c.view() == want) {
            return;
        }
        assert!(
            t.elapsed() < bound,
            "healthy clients did not converge within {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn spawn_hostile(
    kind: Hostile,
    addr: std::net::SocketAddr,
    n: usize,
    hold: Duration,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| tokio::spawn(hostile::run(kind, addr, i, hold)))
        .collect()
}

// ---------------------------------------------------------------------------------------

/// 500 connections that each declare a 1 MiB frame before their hello, and 200 that declare
/// a frame within the limit and send none of it: before the fix the server allocated every
/// declared body up front (500 MiB); now a frame over 16 KiB is refused on its header and a
/// body grows only with the bytes that arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_declared_before_the_hello_cost_no_memory() {
    let _serial = SERIAL.lock().await;
    let _ = margay_typha::bench::raise_fd_limit(8192);
    let cfg = TyphaConfig {
        server_max_pending_handshakes: 1000,
        ..fast_config()
    };
    let (kv, typha, good) = typha_with(&cfg, 0).await;
    let base = heap_baseline();
    let mut conns = Vec::new();
    for (n, declared) in [(500usize, MIB), (200, 12 << 10)] {
        for _ in 0..n {
            let mut c = TcpStream::connect(typha.addr).await.unwrap();
            let mut h = ((declared + 2) as u32).to_be_bytes().to_vec();
            h.extend_from_slice(&[1, 0]);
            c.write_all(&h).await.unwrap();
            conns.push(c);
        }
    }
    // Let the server read every header.
    tokio::time::sleep(Duration::from_millis(500)).await;
    put(&kv, 1, 7).await;
    converge(&kv, &[&good], Duration::from_secs(5)).await;
    let peak = heap_peak_since(base);
    eprintln!(
        "700 connections declaring frames: peak heap growth {:.1} MiB",
        peak as f64 / MIB as f64
    );
    assert!(
        peak < 24 * MIB,
        "declared-but-unsent frames cost {peak} bytes of heap"
    );
    // The oversized ones were refused at once.
    let mut closed = 0;
    for c in conns.iter_mut().take(500) {
        let mut buf = [0u8; 256];
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                match c.read(&mut buf).await {
                    Ok(0) | Err(_) => return Ok::<(), ()>(()),
                    Ok(_) => {}
                }
            }
        })
        .await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 500);
}

/// Connections that never finish their hello are capped: over the cap, a new connection
/// closes the oldest silent one (before the fix there was no cap: every one held a task and
/// a buffer until the handshake timeout). A flood of silent connections cannot lock a real
/// client out: it sends its hello at once and is served while the flood goes on. The
/// connected client is not disturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_without_a_hello_are_capped() {
    let _serial = SERIAL.lock().await;
    let cfg = TyphaConfig {
        server_max_pending_handshakes: 20,
        server_handshake_timeout: Duration::from_secs(30),
        ..fast_config()
    };
    let (kv, typha, good) = typha_with(&cfg, 0).await;
    let mut idle = Vec::new();
    for _ in 0..50 {
        idle.push(TcpStream::connect(typha.addr).await.unwrap());
    }
    let stats = &typha.server.stats;
    wait_for("30 connections evicted", Duration::from_secs(5), || {
        stats.evicted_pending.load(Ordering::Relaxed) >= 30
    })
    .await;
    assert_eq!(stats.pending_handshakes.load(Ordering::Relaxed), 20);
    // The oldest were closed at once; the newest are still open.
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(1), idle[0].read(&mut buf))
        .await
        .expect("an evicted connection is closed at once");
    assert!(matches!(n, Ok(0) | Err(_)));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), idle[49].read(&mut buf))
            .await
            .is_err(),
        "the newest silent connection is still open"
    );
    put(&kv, 2, 1).await;
    converge(&kv, &[&good], Duration::from_secs(5)).await;
    // While silent connections keep coming, a real client still gets in.
    let flood_addr = typha.addr;
    let flood = tokio::spawn(async move {
        let mut held = std::collections::VecDeque::new();
        loop {
            if let Ok(c) = TcpStream::connect(flood_addr).await {
                held.push_back(c);
            }
            if held.len() > 100 {
                held.pop_front();
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let late = TestClient::start(client_opts(vec![typha.addr.to_string()], "late"));
    converge(&kv, &[&good, &late], Duration::from_secs(10)).await;
    flood.abort();
    assert_eq!(late.stats.connects.load(Ordering::Relaxed), 1);
    assert!(stats.pending_handshakes.load(Ordering::Relaxed) <= 20);
}

/// Clients that never read, joining one after another (each more than the 1 s reuse window
/// after the last): before the fix each pinned an encoded snapshot of its own (every crumb
/// kept its encoding for as long as the chain lived); now they share the one being sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_share_one_snapshot() {
    let _serial = SERIAL.lock().await;
    let cfg = TyphaConfig {
        server_write_timeout: Duration::from_secs(60),
        server_pong_timeout: Duration::from_secs(60),
        ..fast_config()
    };
    // About 10 MB of snapshot.
    let (kv, typha, good) = typha_with(&cfg, 500).await;
    let snapshot: usize = store_view(&kv).await.values().map(|(v, _)| v.len()).sum();
    let base = heap_baseline();
    let addr = typha.addr;
    let mut stuck = Vec::new();
    for i in 0..6 {
        stuck.push(tokio::spawn(hostile::run(
            Hostile::NeverReads,
            addr,
            i,
            Duration::from_secs(60),
        )));
        // Updates in between, so that each joiner finds a newer crumb.
        put(&kv, 3, i as u64).await;
        tokio::time::sleep(Duration::from_millis(1300)).await;
    }
    converge(&kv, &[&good], Duration::from_secs(5)).await;
    assert_eq!(typha.server.connections(), 7);
    let peak = heap_peak_since(base);
    eprintln!(
        "6 stuck clients, snapshot {:.1} MiB: peak heap growth {:.1} MiB, encoded {} shared {}",
        snapshot as f64 / MIB as f64,
        peak as f64 / MIB as f64,
        typha.server.stats.snapshots_encoded.load(Ordering::Relaxed),
        typha.server.stats.snapshots_shared.load(Ordering::Relaxed),
    );
    assert!(
        peak < 3 * snapshot,
        "6 stuck clients cost {peak} bytes for a {snapshot}-byte snapshot"
    );
    for t in stuck {
        t.abort();
    }
}

/// A client that reads just enough to keep every write call alive: before the fix it was
/// never dropped during its snapshot (the write timeout applied per call); now the whole
/// snapshot has one deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_has_one_deadline() {
    let _serial = SERIAL.lock().await;
    let cfg = TyphaConfig {
        server_write_timeout: Duration::from_secs(2),
        server_pong_timeout: Duration::from_secs(60),
        ..fast_config()
    };
    let (kv, typha, good) = typha_with(&cfg, 500).await;
    let t = Instant::now();
    let slow = tokio::spawn(hostile::run(
        Hostile::SlowReader,
        typha.addr,
        0,
        Duration::from_secs(30),
    ));
    let server = typha.server.clone();
    wait_for("the slow reader connected", Duration::from_secs(5), || {
        server.connections() == 2
    })
    .await;
    wait_for(
        "the slow reader dropped",
        cfg.server_write_timeout + Duration::from_secs(5),
        || server.connections() == 1,
    )
    .await;
    assert!(t.elapsed() >= cfg.server_write_timeout - Duration::from_millis(100));
    assert_eq!(
        server
            .stats
            .dropped_snapshot_deadline
            .load(Ordering::Relaxed),
        1
    );
    put(&kv, 4, 1).await;
    converge(&kv, &[&good], Duration::from_secs(5)).await;
    slow.abort();
}

/// The issue's soak, at CI size: every kind of hostile connection at once (100 of each)
/// while 20 healthy clients follow a stream of updates. Typha's heap stays under a stated
/// bound, no healthy client reconnects, and every one converges. (Full size: the
/// `soak` example.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_hostile_connections_while_healthy_clients_stay_in_sync() {
    let _serial = SERIAL.lock().await;
    let _ = margay_typha::bench::raise_fd_limit(8192);
    const EACH: usize = 100;
    const HEALTHY: usize = 20;
    // Heap bound for the whole process (Typha, the healthy clients' views, the hostile
    // tasks): the snapshot is ~2 MB; what matters is that it does not grow per connection.
    const BOUND: usize = 64 * MIB;
    let cfg = TyphaConfig {
        server_max_pending_handshakes: 256,
        ..fast_config()
    };
    let (kv, typha, good) = typha_with(&cfg, 100).await;
    let mut healthy = vec![good];
    for i in 1..HEALTHY {
        healthy.push(TestClient::start(client_opts(
            vec![typha.addr.to_string()],
            &format!("healthy-{i}"),
        )));
    }
    converge(
        &kv,
        &healthy.iter().collect::<Vec<_>>(),
        Duration::from_secs(30),
    )
    .await;
    let base = heap_baseline();
    let t = Instant::now();
    let mut tasks = Vec::new();
    for kind in Hostile::ALL {
        tasks.extend(spawn_hostile(
            kind,
            typha.addr,
            EACH,
            Duration::from_secs(6),
        ));
    }
    // Updates throughout.
    let mut generation = 1;
    while t.elapsed() < Duration::from_secs(6) {
        for i in 0..10 {
            put(&kv, i, generation).await;
        }
        generation += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    converge(
        &kv,
        &healthy.iter().collect::<Vec<_>>(),
        Duration::from_secs(10),
    )
    .await;
    let peak = heap_peak_since(base);
    let st = &typha.server.stats;
    eprintln!(
        "soak: {} hostile connections, {HEALTHY} healthy clients, {generation} update rounds: peak heap growth {:.1} MiB; evicted pending {}, snapshot deadline drops {}, write timeouts {}, bad frames {}",
        EACH * Hostile::ALL.len(),
        peak as f64 / MIB as f64,
        st.evicted_pending.load(Ordering::Relaxed),
        st.dropped_snapshot_deadline.load(Ordering::Relaxed),
        st.dropped_write_timeout.load(Ordering::Relaxed),
        st.bad_frames.load(Ordering::Relaxed),
    );
    assert!(peak < BOUND, "peak heap growth {peak} bytes");
    for c in &healthy {
        assert_eq!(
            c.stats.connects.load(Ordering::Relaxed),
            1,
            "a healthy client reconnected"
        );
    }
    for t in tasks {
        t.abort();
    }
}
