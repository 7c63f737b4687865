//! IPAM assign + release against a private local etcd, one host.
//!
//! `cargo run --release -p margay-ipam --example ipam_bench -- [--n 2000] [--concurrency 16]`
//!
//! Prints assignments per second and the latency distribution of single assignments, first
//! one at a time, then with `--concurrency` callers sharing the host lock (as parallel CNI
//! ADDs on one node do): assignments alone, then assign+release pairs (a pod's ADD and DEL).
//!
//! The sequential phase also breaks the time down: the backend is wrapped in `Timed`, which
//! counts datastore round trips per kind and the time spent waiting for them; what is left of
//! an operation's time is CPU (JSON, resource decoding) and the host lock. The block's JSON
//! encode/decode cost is measured on its own at the end.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use margay_datastore::{Compare, KeyValue, KvBackend, ListResult, TxnOp, TxnResponse, Watch};

use margay_api::ippool::IPPoolSpec;
use margay_api::{IPPool, ObjectMeta, Resource};
use margay_datastore::Client;
use margay_datastore::config::EtcdConfig;
use margay_datastore::etcd::EtcdBackend;
use margay_ipam::block::AllocationBlock;
use margay_ipam::{AssignArgs, HostLock, Ipam};
use margay_testkit::etcd::EtcdServer;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted
        .get(((sorted.len().max(1) - 1) as f64 * p).round() as usize)
        .copied()
        .unwrap_or_default()
}

fn report(what: &str, n: usize, elapsed: Duration, mut lat: Vec<Duration>) {
    lat.sort_unstable();
    println!(
        "{what}: {n} in {:.2} s = {:.0}/s; latency p50 {:.2} ms p99 {:.2} ms max {:.2} ms",
        elapsed.as_secs_f64(),
        n as f64 / elapsed.as_secs_f64(),
        pct(&lat, 0.5).as_secs_f64() * 1e3,
        pct(&lat, 0.99).as_secs_f64() * 1e3,
        lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
}

/// Round trips and the time spent in them, per kind of backend call.
#[derive(Default)]
struct Stats {
    calls: BTreeMap<&'static str, (u64, Duration)>,
    /// Wall-clock time with at least one call in flight (concurrent reads overlap).
    busy: Duration,
    in_flight: usize,
    since: Option<Instant>,
}

impl Stats {
    fn add(&mut self, other: Stats) {
        for (k, (c, d)) in other.calls {
            let e = self.calls.entry(k).or_default();
            e.0 += c;
            e.1 += d;
        }
        self.busy += other.busy;
    }
}

/// A backend that times every call of the one it wraps.
#[derive(Clone)]
struct Timed<B> {
    inner: B,
    stats: Arc<Mutex<Stats>>,
}

impl<B> Timed<B> {
    async fn time<T>(&self, kind: &'static str, f: impl Future<Output = T>) -> T {
        let t = Instant::now();
        {
            let mut s = self.stats.lock().unwrap();
            s.in_flight += 1;
            if s.in_flight == 1 {
                s.since = Some(t);
            }
        }
        let out = f.await;
        let d = t.elapsed();
        let mut s = self.stats.lock().unwrap();
        let e = s.calls.entry(kind).or_default();
        e.0 += 1;
        e.1 += d;
        s.in_flight -= 1;
        if s.in_flight == 0
            && let Some(since) = s.since.take()
        {
            s.busy += since.elapsed();
        }
        out
    }

    fn take(&self) -> Stats {
        std::mem::take(&mut *self.stats.lock().unwrap())
    }
}

impl<B: KvBackend + Clone> KvBackend for Timed<B> {
    async fn get(&self, key: &str) -> margay_datastore::Result<Option<KeyValue>> {
        self.time("get", self.inner.get(key)).await
    }
    async fn list(&self, prefix: &str) -> margay_datastore::Result<ListResult> {
        self.time("list", self.inner.list(prefix)).await
    }
    async fn create(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> margay_datastore::Result<KeyValue> {
        self.time("create", self.inner.create(key, value, ttl))
            .await
    }
    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Option<i64>,
        ttl: Option<Duration>,
    ) -> margay_datastore::Result<KeyValue> {
        self.time("update", self.inner.update(key, value, expected, ttl))
            .await
    }
    async fn delete(&self, key: &str, expected: Option<i64>) -> margay_datastore::Result<KeyValue> {
        self.time("delete", self.inner.delete(key, expected)).await
    }
    async fn txn(
        &self,
        compares: Vec<Compare>,
        ops: Vec<TxnOp>,
    ) -> margay_datastore::Result<TxnResponse> {
        let kind = if ops.iter().any(TxnOp::is_write) {
            "txn write"
        } else {
            "txn read"
        };
        self.time(kind, self.inner.txn(compares, ops)).await
    }
    async fn watch(&self, prefix: &str, after: i64) -> margay_datastore::Result<Watch> {
        self.inner.watch(prefix, after).await
    }
    async fn compact(&self, revision: i64) -> margay_datastore::Result<()> {
        self.inner.compact(revision).await
    }
    async fn revision(&self) -> margay_datastore::Result<i64> {
        self.inner.revision().await
    }
}

/// Per operation: round trips of each kind and their mean latency, and the time not spent
/// waiting for the datastore.
fn breakdown(what: &str, n: usize, total: Duration, stats: &Stats) {
    let n32 = u32::try_from(n.max(1)).unwrap();
    let waited = stats.busy;
    let mut parts = Vec::new();
    for (kind, (count, time)) in &stats.calls {
        parts.push(format!(
            "{kind} {:.2}x {:.3} ms",
            *count as f64 / n as f64,
            time.as_secs_f64() * 1e3 / (*count).max(1) as f64
        ));
    }
    println!(
        "  {what}: {:.3} ms/op = datastore {:.3} ms ({}) + other {:.3} ms",
        (total / n32).as_secs_f64() * 1e3,
        (waited / n32).as_secs_f64() * 1e3,
        parts.join(", "),
        (total.saturating_sub(waited) / n32).as_secs_f64() * 1e3,
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = arg("--n", 2000);
    let concurrency = arg("--concurrency", 16);
    let server = EtcdServer::start().unwrap();
    let etcd = EtcdBackend::connect(&EtcdConfig {
        endpoints: vec![server.endpoint()],
        ..EtcdConfig::default()
    })
    .await
    .unwrap();
    let kv = Timed {
        inner: etcd,
        stats: Arc::default(),
    };
    Client::new(kv.clone())
        .create(Resource::from(IPPool::new(
            ObjectMeta::named("pool"),
            IPPoolSpec {
                cidr: "10.0.0.0/16".into(),
                block_size: Some(24),
                ..IPPoolSpec::default()
            },
        )))
        .await
        .unwrap();
    let lock_dir = std::env::temp_dir().join(format!("margay-ipam-bench-{}", std::process::id()));
    let ipam = Arc::new(
        Ipam::new(kv.clone()).with_host_lock(Arc::new(HostLock::new(lock_dir.join("ipam.lock")))),
    );

    // Warm up: connections, the host's first block.
    ipam.auto_assign(&AssignArgs::new("k8s-pod-network.warm", "bench-node"))
        .await
        .unwrap();
    ipam.release_by_handle("k8s-pod-network.warm")
        .await
        .unwrap();
    kv.take();

    // One at a time.
    let mut assign_lat = Vec::new();
    let mut release_lat = Vec::new();
    let (mut assign_stats, mut release_stats) = (Stats::default(), Stats::default());
    let start = Instant::now();
    for i in 0..n {
        let handle = format!("k8s-pod-network.seq-{i}");
        let t = Instant::now();
        ipam.auto_assign(&AssignArgs::new(handle.clone(), "bench-node"))
            .await
            .unwrap();
        assign_lat.push(t.elapsed());
        assign_stats.add(kv.take());
        let t = Instant::now();
        ipam.release_by_handle(&handle).await.unwrap();
        release_lat.push(t.elapsed());
        release_stats.add(kv.take());
    }
    let elapsed = start.elapsed();
    let assign_total: Duration = assign_lat.iter().sum();
    let release_total: Duration = release_lat.iter().sum();
    report("sequential assign", n, elapsed, assign_lat);
    breakdown("assign", n, assign_total, &assign_stats);
    report("sequential release", n, elapsed, release_lat);
    breakdown("release", n, release_total, &release_stats);
    println!(
        "sequential assign+release pairs: {:.0}/s",
        n as f64 / elapsed.as_secs_f64()
    );

    // Concurrent callers on one host (serialised by the host lock): assignments alone, then
    // assign+release pairs (ADD then DEL of a pod).
    for pairs in [false, true] {
        let start = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..concurrency {
            let ipam = ipam.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                for i in (c..n).step_by(concurrency) {
                    let handle = format!("k8s-pod-network.par-{pairs}-{i}");
                    let t = Instant::now();
                    ipam.auto_assign(&AssignArgs::new(handle.clone(), "bench-node"))
                        .await
                        .unwrap();
                    if pairs {
                        ipam.release_by_handle(&handle).await.unwrap();
                    }
                    lat.push(t.elapsed());
                }
                lat
            }));
        }
        let mut lat = Vec::new();
        for t in tasks {
            lat.extend(t.await.unwrap());
        }
        let what = if pairs {
            "assign+release pairs"
        } else {
            "assign"
        };
        let elapsed = start.elapsed();
        report(
            &format!(
                "{concurrency} concurrent callers, {what} (queueing for the host lock included)"
            ),
            n,
            elapsed,
            lat,
        );
        // Callers are serialised by the host lock, so wall-clock time is time inside it.
        breakdown(what, n, elapsed, &kv.take());
    }

    // CPU cost of one block round trip through JSON, at the fill the bench left it.
    let blocks = ipam.blocks().await.unwrap();
    if let Some(block) = blocks.iter().max_by_key(|b| b.in_use()) {
        let rounds = 2000u32;
        let t = Instant::now();
        for _ in 0..rounds {
            let bytes = serde_json::to_vec(block).unwrap();
            let back: AllocationBlock = serde_json::from_slice(&bytes).unwrap();
            std::hint::black_box(back);
        }
        println!(
            "block JSON decode+encode ({} of {} in use, {} bytes): {:.3} ms",
            block.in_use(),
            block.size(),
            serde_json::to_vec(block).unwrap().len(),
            (t.elapsed() / rounds).as_secs_f64() * 1e3
        );
    }
    // The host lock alone (in-process mutex, open, flock via spawn_blocking).
    let lock = HostLock::new(lock_dir.join("ipam.lock"));
    let rounds = 2000u32;
    let t = Instant::now();
    for _ in 0..rounds {
        drop(lock.lock().await.unwrap());
    }
    println!(
        "host lock acquire+release: {:.3} ms",
        (t.elapsed() / rounds).as_secs_f64() * 1e3
    );
    let _ = std::fs::remove_dir_all(lock_dir);
}
