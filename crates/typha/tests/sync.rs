#![allow(clippy::unwrap_used)]
//! Conformance of what clients see through Typha: random updates, reconnects and Typha
//! restarts (bounded in time); migration over the connection limit; graceful drain.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use margay_datastore::{KvBackend, MemBackend};
use margay_typha::client::ConnectionState;
use margay_typha::daemon::Embedded;

fn reserve_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// Starts a Typha on an address a killed one just left (its listener closes asynchronously).
async fn restart(kv: &MemBackend, cfg: &margay_typha::TyphaConfig, addr: &str) -> Embedded {
    let t = Instant::now();
    loop {
        match Embedded::start(kv.clone(), cfg, None, addr).await {
            Ok(e) => return e,
            Err(e) if t.elapsed() < Duration::from_secs(5) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("cannot restart Typha on {addr}: {e}"),
        }
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

async fn converged(kv: &MemBackend, clients: &[TestClient], timeout: Duration) {
    let t = Instant::now();
    loop {
        let want = store_view(kv).await;
        let bad: Vec<usize> = clients
            .iter()
            .enumerate()
            .filter(|(_, c)| c.view() != want)
            .map(|(i, _)| i)
            .collect();
        if bad.is_empty() {
            return;
        }
        if t.elapsed() > timeout {
            let c = &clients[bad[0]];
            let v = c.view();
            let missing: Vec<_> = want
                .keys()
                .filter(|k| !v.contains_key(*k))
                .take(5)
                .collect();
            let extra: Vec<_> = v
                .keys()
                .filter(|k| !want.contains_key(*k))
                .take(5)
                .collect();
            let stale: Vec<_> = want
                .iter()
                .filter(|(k, w)| v.get(*k).is_some_and(|x| x != *w))
                .map(|(k, _)| k)
                .take(5)
                .collect();
            panic!(
                "clients {bad:?} differ from the datastore after {timeout:?}: missing {missing:?}, extra {extra:?}, stale {stale:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_updates_reconnects_and_restarts_converge() {
    let kv = MemBackend::new();
    for i in 0..100 {
        put(&kv, i, 0).await;
    }
    let cfg = fast_config();
    let addr_a = reserve_port();
    let addr_b = reserve_port();
    let mut a = Some(restart(&kv, &cfg, &addr_a).await);
    let mut b = Some(restart(&kv, &cfg, &addr_b).await);
    let addrs = vec![addr_a.clone(), addr_b.clone()];
    let mut clients: Vec<TestClient> = (0..6)
        .map(|i| TestClient::start(client_opts(addrs.clone(), &format!("node-{i}"))))
        .collect();
    wait_for("clients in sync", Duration::from_secs(10), || {
        clients.iter().all(|c| c.in_sync())
    })
    .await;
    converged(&kv, &clients, Duration::from_secs(10)).await;

    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("seed {seed}");
    let mut rng = Rng(seed);
    let mut generation = 1;
    let (mut kills, mut restarts, mut reconnects) = (0, 0, 0);
    let end = Instant::now() + Duration::from_secs(8);
    while Instant::now() < end {
        generation += 1;
        match rng.below(100) {
            0..=59 => put(&kv, rng.below(150) as usize, generation).await,
            60..=84 => {
                let k = key(rng.below(150) as usize);
                let _ = kv.delete(&k, None).await;
            }
            85..=89 => {
                // Kill one Typha (never both at once for long) and bring it back later.
                if a.is_some() && b.is_some() {
                    if rng.below(2) == 0 {
                        a.take().unwrap().kill();
                    } else {
                        b.take().unwrap().kill();
                    }
                    kills += 1;
                } else if a.is_none() {
                    a = Some(restart(&kv, &cfg, &addr_a).await);
                    restarts += 1;
                } else {
                    b = Some(restart(&kv, &cfg, &addr_b).await);
                    restarts += 1;
                }
            }
            90..=91 => {
                // A client restarts from nothing.
                let i = rng.below(clients.len() as u64) as usize;
                clients[i] = TestClient::start(client_opts(
                    addrs.clone(),
                    &format!("node-{i}-{generation}"),
                ));
                reconnects += 1;
            }
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
        }
        if rng.below(10) == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    if a.is_none() {
        a = Some(restart(&kv, &cfg, &addr_a).await);
    }
    if b.is_none() {
        b = Some(restart(&kv, &cfg, &addr_b).await);
    }
    eprintln!(
        "kills {kills}, restarts {restarts}, client restarts {reconnects}, last generation {generation}"
    );
    converged(&kv, &clients, Duration::from_secs(15)).await;
    for (i, c) in clients.iter().enumerate() {
        let s = c.seen.lock().unwrap();
        assert!(
            s.regressions.is_empty(),
            "client {i} went back in time on {:?}",
            s.regressions
        );
        assert_eq!(s.duplicates, 0, "client {i} received unchanged values");
        assert_eq!(
            s.statuses
                .iter()
                .filter(|st| **st == margay_datastore::SyncStatus::InSync)
                .count(),
            1,
            "InSync exactly once"
        );
    }
    drop((a, b));
}

/// Kills the Typha every client is on while updates flow (no deletes): each client moves to
/// the other Typha, the dedupe buffer emits no delete at all, and the views converge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_typha_under_load_causes_no_spurious_deletes() {
    let kv = MemBackend::new();
    for i in 0..300 {
        put(&kv, i, 0).await;
    }
    let cfg = fast_config();
    let addr_a = reserve_port();
    let addr_b = reserve_port();
    let a = Embedded::start(kv.clone(), &cfg, None, &addr_a)
        .await
        .unwrap();
    // Clients start on A (B is not up yet).
    let addrs = vec![addr_a.clone(), addr_b.clone()];
    let clients: Vec<TestClient> = (0..10)
        .map(|i| TestClient::start(client_opts(addrs.clone(), &format!("node-{i}"))))
        .collect();
    wait_for("clients in sync", Duration::from_secs(10), || {
        clients.iter().all(|c| c.in_sync())
    })
    .await;
    let b = Embedded::start(kv.clone(), &cfg, None, &addr_b)
        .await
        .unwrap();
    wait_for("B in sync", Duration::from_secs(5), || b.in_sync()).await;
    assert_eq!(a.server.connections(), 10);

    let writer_kv = kv.clone();
    let writer = tokio::spawn(async move {
        let mut generation = 1;
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            for i in 0..20 {
                put(
                    &writer_kv,
                    (generation as usize * 7 + i * 13) % 400,
                    generation,
                )
                .await;
            }
            generation += 1;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    a.kill();
    writer.await.unwrap();
    converged(&kv, &clients, Duration::from_secs(15)).await;
    assert_eq!(b.server.connections(), 10);
    for (i, c) in clients.iter().enumerate() {
        let s = c.seen.lock().unwrap();
        assert!(
            s.deletes.is_empty(),
            "client {i} emitted spurious deletes {:?}",
            &s.deletes[..s.deletes.len().min(5)]
        );
        assert!(
            s.regressions.is_empty(),
            "client {i} regressed on {:?}",
            s.regressions
        );
        assert_eq!(s.duplicates, 0);
        assert_eq!(c.stats.resyncs.load(Ordering::Relaxed), 1);
    }
}

/// Over the limit, clients are asked to migrate: they move to the other Typha with no gap
/// (never without a delivering connection, nothing missed, nothing going back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_limit_clients_migrate_without_gaps() {
    let kv = MemBackend::new();
    for i in 0..200 {
        put(&kv, i, 0).await;
    }
    let mut cfg_a = fast_config();
    cfg_a.max_connections = 3;
    let cfg_b = fast_config();
    let addr_a = reserve_port();
    let addr_b = reserve_port();
    let a = Embedded::start(kv.clone(), &cfg_a, None, &addr_a)
        .await
        .unwrap();
    let addrs = vec![addr_a.clone(), addr_b.clone()];
    // While B is down, everyone lands on A, which is over its limit of 3: the clients asked
    // to migrate find no other Typha yet and stay (no error, no gap).
    let clients: Vec<TestClient> = (0..8)
        .map(|i| TestClient::start(client_opts(addrs.clone(), &format!("node-{i}"))))
        .collect();
    wait_for("clients in sync", Duration::from_secs(10), || {
        clients.iter().all(|c| c.in_sync())
    })
    .await;
    let writer_kv = kv.clone();
    let writer = tokio::spawn(async move {
        let mut generation = 1;
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(4) {
            put(&writer_kv, (generation as usize) % 250, generation).await;
            generation += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = Embedded::start(kv.clone(), &cfg_b, None, &addr_b)
        .await
        .unwrap();
    wait_for("A back within its limit", Duration::from_secs(20), || {
        a.server.connections() <= 3 && b.server.connections() == 5
    })
    .await;
    writer.await.unwrap();
    converged(&kv, &clients, Duration::from_secs(15)).await;
    let migrated: u64 = clients
        .iter()
        .map(|c| c.stats.migrations.load(Ordering::Relaxed))
        .sum();
    assert_eq!(migrated, 5);
    for (i, c) in clients.iter().enumerate() {
        let s = c.seen.lock().unwrap();
        assert!(
            !s.connections
                .iter()
                .any(|c| matches!(c, ConnectionState::Disconnected { .. })),
            "client {i} was without a connection: {:?}",
            s.connections
        );
        assert!(
            s.deletes.is_empty(),
            "client {i}: spurious deletes {:?}",
            s.deletes
        );
        assert!(
            s.regressions.is_empty(),
            "client {i}: regressions {:?}",
            s.regressions
        );
        assert_eq!(s.duplicates, 0);
    }
    assert_eq!(a.server.stats.closed_after_grace.load(Ordering::Relaxed), 0);
}

/// SIGTERM-style drain: every client moves to the other Typha, spread over the drain period,
/// and the draining Typha ends with no connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_moves_every_client() {
    let kv = MemBackend::new();
    for i in 0..100 {
        put(&kv, i, 0).await;
    }
    let mut cfg = fast_config();
    cfg.shutdown_timeout = Duration::from_secs(4);
    let addr_a = reserve_port();
    let addr_b = reserve_port();
    let a = Embedded::start(kv.clone(), &cfg, None, &addr_a)
        .await
        .unwrap();
    let addrs = vec![addr_a.clone(), addr_b.clone()];
    let clients: Vec<TestClient> = (0..6)
        .map(|i| TestClient::start(client_opts(addrs.clone(), &format!("node-{i}"))))
        .collect();
    wait_for("clients in sync", Duration::from_secs(10), || {
        clients.iter().all(|c| c.in_sync())
    })
    .await;
    let b = Embedded::start(kv.clone(), &cfg, None, &addr_b)
        .await
        .unwrap();
    wait_for("B in sync", Duration::from_secs(5), || b.in_sync()).await;
    let server_a = a.server.clone();
    let t = Instant::now();
    let drain = tokio::spawn(a.shutdown());
    for g in 1..50 {
        put(&kv, g % 120, g as u64).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .unwrap()
        .unwrap();
    eprintln!("drained in {:?}", t.elapsed());
    assert_eq!(server_a.connections(), 0);
    assert_eq!(b.server.connections(), 6);
    converged(&kv, &clients, Duration::from_secs(10)).await;
    for c in &clients {
        let s = c.seen.lock().unwrap();
        assert!(
            !s.connections
                .iter()
                .any(|c| matches!(c, ConnectionState::Disconnected { .. }))
        );
        assert!(s.deletes.is_empty());
        assert!(s.regressions.is_empty());
    }
}
