#![allow(clippy::unwrap_used, dead_code)]
//! Helpers for Typha's tests: fast timers, embedded Typhas over a MemBackend, and a client
//! whose view is checked against the datastore.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use margay_datastore::{KvBackend, MemBackend, SyncStatus};
use margay_typha::client::{self, ClientEvent, ClientOptions, ClientStats, ConnectionState};
use margay_typha::proto::UpdateKind;
use margay_typha::{SyncerType, TyphaConfig};
use tokio::sync::mpsc;

pub fn fast_config() -> TyphaConfig {
    TyphaConfig {
        server_ping_interval: Duration::from_millis(200),
        server_pong_timeout: Duration::from_secs(3),
        server_handshake_timeout: Duration::from_secs(2),
        server_write_timeout: Duration::from_secs(2),
        connection_drop_interval: Duration::from_millis(20),
        migration_grace: Duration::from_secs(10),
        shutdown_timeout: Duration::from_secs(10),
        ..TyphaConfig::default()
    }
}

pub async fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn key(i: usize) -> String {
    format!("/calico/resources/v3/projectcalico.org/networksets/ns/set-{i}")
}

pub fn value(i: usize, generation: u64) -> Vec<u8> {
    format!(
        r#"{{"apiVersion":"projectcalico.org/v3","kind":"NetworkSet","metadata":{{"name":"set-{i}","namespace":"ns","labels":{{"gen":"g{generation}"}}}},"spec":{{"nets":["10.0.{}.{}/32"]}}}}"#,
        (i >> 8) & 0xff,
        i & 0xff
    )
    .into_bytes()
}

/// Writes key i (create or update).
pub async fn put(kv: &MemBackend, i: usize, generation: u64) {
    let k = key(i);
    if kv.get(&k).await.unwrap().is_some() {
        kv.update(&k, value(i, generation), None, None)
            .await
            .unwrap();
    } else {
        kv.create(&k, value(i, generation), None).await.unwrap();
    }
}

/// The datastore's view of what the felix syncer carries: key → (value, revision).
pub async fn store_view(kv: &MemBackend) -> BTreeMap<String, (Bytes, i64)> {
    kv.list("/calico/")
        .await
        .unwrap()
        .kvs
        .into_iter()
        .filter(|k| SyncerType::Felix.classify(&k.key).is_some())
        .map(|k| (k.key, (Bytes::from(k.value), k.mod_revision)))
        .collect()
}

/// What a client saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub view: BTreeMap<String, (Bytes, i64)>,
    pub statuses: Vec<SyncStatus>,
    pub connections: Vec<ConnectionState>,
    pub deletes: Vec<String>,
    /// Updates that took a key back to an older revision.
    pub regressions: Vec<String>,
    /// Updates whose value and revision equal what the client already had.
    pub duplicates: usize,
    pub events: usize,
}

pub struct TestClient {
    pub seen: Arc<Mutex<Seen>>,
    pub stats: Arc<ClientStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestClient {
    pub fn start(opts: ClientOptions) -> TestClient {
        let (tx, mut rx) = mpsc::channel(64);
        let stats = Arc::new(ClientStats::default());
        let seen = Arc::new(Mutex::new(Seen::default()));
        let client = tokio::spawn(client::run(opts, tx, stats.clone()));
        let s = seen.clone();
        let task = tokio::spawn(async move {
            let _client = Abort(client);
            while let Some(ev) = rx.recv().await {
                let mut s = s.lock().unwrap();
                s.events += 1;
                match ev {
                    ClientEvent::Status(st) => s.statuses.push(st),
                    ClientEvent::Connection(c) => s.connections.push(c),
                    ClientEvent::Kvs(kvs) => {
                        for kv in kvs {
                            match kv.value {
                                Some(v) => {
                                    assert_ne!(kv.kind, UpdateKind::Deleted);
                                    let (regressed, duplicate) = match s.view.get(&kv.key) {
                                        Some((old, rev)) => {
                                            (*rev > kv.revision, *rev == kv.revision && *old == v)
                                        }
                                        None => (false, false),
                                    };
                                    if regressed {
                                        s.regressions.push(kv.key.clone());
                                    }
                                    if duplicate {
                                        s.duplicates += 1;
                                    }
                                    s.view.insert(kv.key, (v, kv.revision));
                                }
                                None => {
                                    s.view.remove(&kv.key);
                                    s.deletes.push(kv.key);
                                }
                            }
                        }
                    }
                }
            }
        });
        TestClient { seen, stats, task }
    }

    pub fn in_sync(&self) -> bool {
        self.seen
            .lock()
            .unwrap()
            .statuses
            .contains(&SyncStatus::InSync)
    }

    pub fn view(&self) -> BTreeMap<String, (Bytes, i64)> {
        self.seen.lock().unwrap().view.clone()
    }
}

struct Abort(tokio::task::JoinHandle<()>);
impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub fn client_opts(addrs: Vec<String>, host: &str) -> ClientOptions {
    let mut o = ClientOptions::new(addrs, host, SyncerType::Felix);
    o.read_timeout = Duration::from_secs(3);
    o.backoff = Duration::from_millis(20);
    o.max_backoff = Duration::from_millis(200);
    o.connect_timeout = Duration::from_secs(2);
    o
}
