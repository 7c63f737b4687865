//! IPAM assign + release against a private local etcd, one host.
//!
//! `cargo run --release -p margay-ipam --example ipam_bench -- [--n 2000] [--concurrency 16]`
//!
//! Prints assignments per second and the latency distribution of single assignments, first
//! one at a time, then with `--concurrency` callers sharing the host lock (as parallel CNI
//! ADDs on one node do).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use margay_api::ippool::IPPoolSpec;
use margay_api::{IPPool, ObjectMeta, Resource};
use margay_datastore::Client;
use margay_datastore::config::EtcdConfig;
use margay_datastore::etcd::EtcdBackend;
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = arg("--n", 2000);
    let concurrency = arg("--concurrency", 16);
    let server = EtcdServer::start().unwrap();
    let kv = EtcdBackend::connect(&EtcdConfig {
        endpoints: vec![server.endpoint()],
        ..EtcdConfig::default()
    })
    .await
    .unwrap();
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
    let ipam =
        Arc::new(Ipam::new(kv).with_host_lock(Arc::new(HostLock::new(lock_dir.join("ipam.lock")))));

    // One at a time.
    let mut assign_lat = Vec::new();
    let mut release_lat = Vec::new();
    let start = Instant::now();
    for i in 0..n {
        let handle = format!("k8s-pod-network.seq-{i}");
        let t = Instant::now();
        ipam.auto_assign(&AssignArgs::new(handle.clone(), "bench-node"))
            .await
            .unwrap();
        assign_lat.push(t.elapsed());
        let t = Instant::now();
        ipam.release_by_handle(&handle).await.unwrap();
        release_lat.push(t.elapsed());
    }
    let elapsed = start.elapsed();
    report("sequential assign", n, elapsed, assign_lat);
    report("sequential release", n, elapsed, release_lat);
    println!(
        "sequential assign+release pairs: {:.0}/s",
        n as f64 / elapsed.as_secs_f64()
    );

    // Concurrent callers on one host (serialised by the host lock).
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..concurrency {
        let ipam = ipam.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            for i in (c..n).step_by(concurrency) {
                let t = Instant::now();
                ipam.auto_assign(&AssignArgs::new(
                    format!("k8s-pod-network.par-{i}"),
                    "bench-node",
                ))
                .await
                .unwrap();
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    report(
        &format!("{concurrency} concurrent callers, assign (queueing for the host lock included)"),
        n,
        start.elapsed(),
        lat,
    );
    let _ = std::fs::remove_dir_all(lock_dir);
}
