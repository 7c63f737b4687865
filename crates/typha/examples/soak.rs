//! The issue-17 soak at full size: a live Typha (in this process, on loopback) with healthy
//! Felix clients following a stream of updates while thousands of hostile connections of
//! every kind (`tests/common/hostile.rs`) come in. Prints the process's RSS before and
//! during the wave, Typha's counters, and how far behind the slowest healthy client ever
//! was (the time from an update's write until every healthy client had it).
//!
//!   cargo run --release -p margay-typha --example soak -- [EACH] [HEALTHY] [SECONDS]
//!
//! Defaults: 1000 connections of each kind, 100 healthy clients, 30 s. The CI-size version
//! with assertions is `tests/hostile.rs` (soak_hostile_connections_while_healthy_clients_…).
#![allow(clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/common/hostile.rs"]
mod hostile;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{TestClient, client_opts, key, put, store_view, value};
use hostile::Hostile;
use margay_datastore::MemBackend;
use margay_typha::TyphaConfig;
use margay_typha::bench::rss_bytes;
use margay_typha::daemon::Embedded;

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn rss() -> u64 {
    rss_bytes(std::process::id()).unwrap_or(0)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let each = args.first().copied().unwrap_or(1000);
    let healthy = args.get(1).copied().unwrap_or(100);
    let secs = args.get(2).copied().unwrap_or(30) as u64;
    let want_fds = (each * Hostile::ALL.len() + healthy) as u64 * 2 + 1024;
    if let Err(e) = margay_typha::bench::raise_fd_limit(want_fds) {
        eprintln!("{e}");
        std::process::exit(1);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(soak(each, healthy, Duration::from_secs(secs)));
}

async fn soak(each: usize, n_healthy: usize, wave: Duration) {
    let kv = MemBackend::new();
    for i in 0..2000 {
        put(&kv, i, 0).await;
    }
    // Calico's defaults for every timeout (10 s handshake, 120 s write, 60 s pong).
    let cfg = TyphaConfig::default();
    let typha = Embedded::start(kv.clone(), &cfg, None, "127.0.0.1:0")
        .await
        .unwrap();
    let t = Instant::now();
    let clients: Vec<TestClient> = (0..n_healthy)
        .map(|i| {
            let mut o = client_opts(vec![typha.addr.to_string()], &format!("felix-{i}"));
            // Felix's own (FELIX_TYPHAREADTIMEOUT), not the tests' 3 s.
            o.read_timeout = Duration::from_secs(30);
            TestClient::start(o)
        })
        .collect();
    let want = store_view(&kv).await;
    while !clients
        .iter()
        .all(|c| c.seen.lock().unwrap().view.len() == want.len())
    {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "healthy clients did not sync"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let base = rss();
    println!(
        "soak: {n_healthy} healthy clients in sync with {} keys after {:?}; RSS {:.1} MiB",
        want.len(),
        t.elapsed(),
        mib(base)
    );

    let t = Instant::now();
    // Those that finish a hello first, so that they are not just refused by the cap on
    // pending hellos; 100 at a time, 20 ms apart (a flood, not one burst the listen backlog
    // would drop).
    let order = [
        Hostile::ForgedHost,
        Hostile::NeverReads,
        Hostile::SlowReader,
        Hostile::Garbage,
        Hostile::BigHeader,
        Hostile::Trickle,
        Hostile::Idle,
    ];
    let mut tasks = Vec::new();
    for kind in order {
        for i in 0..each {
            tasks.push(tokio::spawn(hostile::run(kind, typha.addr, i, wave)));
            if i % 100 == 99 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    println!(
        "soak: {} hostile connections ({each} of each of {} kinds) started in {:?}",
        each * Hostile::ALL.len(),
        Hostile::ALL.len(),
        t.elapsed()
    );
    // One update round every 200 ms; the lag of a round is the time until every healthy
    // client holds its value of the probe key.
    let (mut peak, mut worst_lag, mut rounds) = (base, Duration::ZERO, 0u64);
    let probe = key(0);
    while t.elapsed() < wave {
        rounds += 1;
        for i in 0..10 {
            put(&kv, i, rounds).await;
        }
        let wrote = Instant::now();
        let expect = value(0, rounds);
        loop {
            peak = peak.max(rss());
            let done = clients.iter().all(|c| {
                c.seen
                    .lock()
                    .unwrap()
                    .view
                    .get(&probe)
                    .is_some_and(|(v, _)| *v == expect[..])
            });
            if done {
                break;
            }
            if wrote.elapsed() > Duration::from_secs(60) {
                println!(
                    "soak: FAIL: round {rounds} not delivered to every healthy client in 60 s"
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        worst_lag = worst_lag.max(wrote.elapsed());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let reconnected = clients
        .iter()
        .filter(|c| c.stats.connects.load(Ordering::Relaxed) != 1)
        .count();
    let st = &typha.server.stats;
    println!(
        "soak: {rounds} update rounds over {:?}; slowest healthy client at most {:?} behind; {reconnected} of {n_healthy} healthy clients reconnected",
        t.elapsed(),
        worst_lag
    );
    println!(
        "soak: RSS before the wave {:.1} MiB, peak during it {:.1} MiB (+{:.1} MiB, {:.1} KiB per hostile connection)",
        mib(base),
        mib(peak),
        mib(peak.saturating_sub(base)),
        peak.saturating_sub(base) as f64 / 1024.0 / (each * Hostile::ALL.len()) as f64
    );
    println!(
        "soak: Typha accepted {}, connected at the end {}, handshake failures {}, bad frames {}, write timeouts {}",
        st.accepted.load(Ordering::Relaxed),
        typha.server.connections(),
        st.handshake_failures.load(Ordering::Relaxed),
        st.bad_frames.load(Ordering::Relaxed),
        st.dropped_write_timeout.load(Ordering::Relaxed),
    );
    println!(
        "soak: closed without a hello to keep at most {} pending: {}; snapshot deadline drops {}; snapshots encoded {} shared {}",
        cfg.server_max_pending_handshakes,
        st.evicted_pending.load(Ordering::Relaxed),
        st.dropped_snapshot_deadline.load(Ordering::Relaxed),
        st.snapshots_encoded.load(Ordering::Relaxed),
        st.snapshots_shared.load(Ordering::Relaxed),
    );
    for t in tasks {
        t.abort();
    }
}
