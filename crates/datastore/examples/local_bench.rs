//! Benchmarks the embedded SQLite datastore on a fresh temporary database:
//!
//! - sequential single-key creates per second (~600-byte WorkloadEndpoint-like JSON values),
//! - listing every key (`--keys`, default 100000) in one call,
//! - the process RSS after that list,
//! - cross-process watch latency: a child process (this binary, re-executed) writes
//!   `--latency-writes` keys with its send time inside each value while this process watches;
//!   latency is receive time minus send time.
//!
//! ```text
//! cargo run --release -p margay-datastore --example local_bench \
//!     --no-default-features --features local -- [--keys 100000] [--latency-writes 2000]
//! ```

#[cfg(not(feature = "local"))]
fn main() {
    eprintln!("local_bench needs the \"local\" feature");
    std::process::exit(2);
}

#[cfg(feature = "local")]
fn main() -> std::process::ExitCode {
    match bench::main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("local_bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "local")]
mod bench {
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command};
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use margay_datastore::local::{LocalBackend, LocalOptions};
    use margay_datastore::{KvBackend, KvEvent};

    type Error = Box<dyn std::error::Error + Send + Sync>;

    /// Tells a re-executed copy of this binary to be the latency writer, on this database.
    const CHILD_DB: &str = "MARGAY_LOCAL_BENCH_CHILD_DB";
    const CHILD_WRITES: &str = "MARGAY_LOCAL_BENCH_CHILD_WRITES";
    const CHILD_INTERVAL_US: &str = "MARGAY_LOCAL_BENCH_CHILD_INTERVAL_US";
    const LATENCY_PREFIX: &str = "/bench/latency/";
    const KEY_PREFIX: &str = "/calico/resources/v3/projectcalico.org/workloadendpoints/default/";

    struct Args {
        keys: usize,
        latency_writes: usize,
        interval: Duration,
        synchronous_full: bool,
    }

    fn parse_args() -> Result<Args, Error> {
        let mut args = Args {
            keys: 100_000,
            latency_writes: 2000,
            interval: Duration::from_millis(1),
            synchronous_full: false,
        };
        let mut it = std::env::args().skip(1);
        while let Some(a) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
            match a.as_str() {
                "--keys" => args.keys = value()?.parse()?,
                "--latency-writes" => args.latency_writes = value()?.parse()?,
                "--interval-us" => args.interval = Duration::from_micros(value()?.parse()?),
                "--sync-full" => args.synchronous_full = true,
                other => {
                    return Err(format!(
                        "unknown argument {other:?} (--keys N, --latency-writes N, \
                         --interval-us N, --sync-full)"
                    )
                    .into());
                }
            }
        }
        Ok(args)
    }

    fn unix_nanos() -> u128 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    }

    /// A WorkloadEndpoint-shaped JSON value of about 600 bytes.
    fn endpoint_value(i: usize, sent_at: u128) -> Vec<u8> {
        let v = serde_json::json!({
            "kind": "WorkloadEndpoint",
            "apiVersion": "projectcalico.org/v3",
            "metadata": {
                "name": format!("node1-k8s-pod{i}-eth0"),
                "namespace": "default",
                "uid": format!("8c2f0d4e-1b7a-4c3e-9f10-{i:012}"),
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {
                    "app": "frontend",
                    "projectcalico.org/namespace": "default",
                    "projectcalico.org/orchestrator": "k8s"
                }
            },
            "spec": {
                "orchestrator": "k8s",
                "node": "node1",
                "containerID": format!("{i:064x}"),
                "pod": format!("pod{i}"),
                "endpoint": "eth0",
                "ipNetworks": [format!("10.{}.{}.{}/32", (i >> 16) & 255, (i >> 8) & 255, i & 255)],
                "profiles": ["kns.default", "ksa.default.default"],
                "interfaceName": format!("cali{i:011x}"),
                "mac": "ee:ee:ee:ee:ee:ee"
            },
            "sentAt": sent_at.to_string(),
        });
        serde_json::to_vec(&v).unwrap_or_default()
    }

    fn rss_kib() -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    fn percentile(sorted: &[f64], p: f64) -> f64 {
        if sorted.is_empty() {
            return f64::NAN;
        }
        let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    }

    /// Kills the writer child if the parent gives up early.
    struct ChildGuard(Option<Child>);

    impl Drop for ChildGuard {
        fn drop(&mut self) {
            if let Some(mut c) = self.0.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    pub fn main() -> Result<(), Error> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        if let Ok(db) = std::env::var(CHILD_DB) {
            return rt.block_on(child(PathBuf::from(db)));
        }
        let args = parse_args()?;
        rt.block_on(parent(args))
    }

    async fn child(db: PathBuf) -> Result<(), Error> {
        let writes: usize = std::env::var(CHILD_WRITES)?.parse()?;
        let interval = Duration::from_micros(std::env::var(CHILD_INTERVAL_US)?.parse()?);
        let b = LocalBackend::open(LocalOptions::new(db))?;
        let start = Instant::now();
        for i in 0..writes {
            // Paced, so the parent measures delivery latency rather than a backlog.
            let due = start + interval * u32::try_from(i)?;
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                tokio::time::sleep(wait).await;
            }
            let key = format!("{LATENCY_PREFIX}{i:08}");
            b.create(&key, endpoint_value(i, unix_nanos()), None)
                .await?;
        }
        Ok(())
    }

    async fn parent(args: Args) -> Result<(), Error> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("datastore.db");
        let mut opts = LocalOptions::new(&path);
        opts.synchronous_full = args.synchronous_full;
        // Retention must not compact the latency watcher's history mid-run.
        opts.retain_revisions = 0;
        let b = LocalBackend::open(opts)?;
        println!(
            "database: {} (synchronous={})",
            path.display(),
            if args.synchronous_full {
                "FULL"
            } else {
                "NORMAL"
            }
        );

        // 1. Sequential single-key creates.
        let start = Instant::now();
        let mut bytes = 0usize;
        for i in 0..args.keys {
            let value = endpoint_value(i, 0);
            bytes += value.len();
            b.create(&format!("{KEY_PREFIX}pod{i:08}"), value, None)
                .await?;
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "creates: {} keys in {:.2} s = {:.0} creates/s (mean value {} bytes)",
            args.keys,
            secs,
            args.keys as f64 / secs,
            bytes / args.keys.max(1)
        );

        // 2. List everything, and the RSS while holding the result.
        let rss_before = rss_kib();
        let start = Instant::now();
        let listed = b.list(KEY_PREFIX).await?;
        let first = start.elapsed();
        if listed.kvs.len() != args.keys {
            return Err(format!("listed {} keys, wrote {}", listed.kvs.len(), args.keys).into());
        }
        let rss_after = rss_kib();
        drop(listed);
        let mut best = first;
        for _ in 0..3 {
            let start = Instant::now();
            let listed = b.list(KEY_PREFIX).await?;
            best = best.min(start.elapsed());
            drop(listed);
        }
        println!(
            "list: {} keys in {:.0} ms (first), {:.0} ms (best of 4)",
            args.keys,
            first.as_secs_f64() * 1e3,
            best.as_secs_f64() * 1e3
        );
        println!(
            "rss: {} MiB before the list, {} MiB holding the listed keys",
            rss_before.map_or_else(|| "?".into(), |k| (k / 1024).to_string()),
            rss_after.map_or_else(|| "?".into(), |k| (k / 1024).to_string()),
        );
        if let Ok(m) = std::fs::metadata(&path) {
            println!("file: {} MiB", m.len() / (1024 * 1024));
        }

        // 3. Cross-process watch latency.
        latency(&b, &path, &args).await?;
        Ok(())
    }

    async fn latency(b: &LocalBackend, path: &Path, args: &Args) -> Result<(), Error> {
        let from = b.revision().await?;
        let mut w = b.watch(LATENCY_PREFIX, from).await?;
        let child = Command::new(std::env::current_exe()?)
            .env(CHILD_DB, path)
            .env(CHILD_WRITES, args.latency_writes.to_string())
            .env(CHILD_INTERVAL_US, args.interval.as_micros().to_string())
            .spawn()?;
        let mut guard = ChildGuard(Some(child));
        let mut lat_ms = Vec::with_capacity(args.latency_writes);
        let mut expect = from + 1;
        let deadline = Instant::now()
            + Duration::from_secs(60)
            + args.interval * u32::try_from(args.latency_writes)?;
        while lat_ms.len() < args.latency_writes {
            let left = deadline.saturating_duration_since(Instant::now());
            let batch = match tokio::time::timeout(left, w.next()).await {
                Ok(Some(batch)) => batch?,
                Ok(None) => return Err("watch closed".into()),
                Err(_) => {
                    return Err(format!("timed out after {} events", lat_ms.len()).into());
                }
            };
            let now = unix_nanos();
            for e in batch {
                if e.revision() != expect {
                    return Err(format!("gap: expected revision {expect}, got {e:?}").into());
                }
                expect += 1;
                let KvEvent::Put { kv, .. } = e else {
                    return Err("unexpected delete".into());
                };
                let v: serde_json::Value = serde_json::from_slice(&kv.value)?;
                let sent: u128 = v["sentAt"].as_str().ok_or("no sentAt")?.parse()?;
                lat_ms.push(now.saturating_sub(sent) as f64 / 1e6);
            }
        }
        if let Some(mut c) = guard.0.take() {
            let status = c.wait()?;
            if !status.success() {
                return Err(format!("writer child failed: {status}").into());
            }
        }
        lat_ms.sort_by(f64::total_cmp);
        println!(
            "cross-process watch latency over {} writes ({} µs apart): p50 {:.2} ms, p99 {:.2} ms, \
             max {:.2} ms",
            lat_ms.len(),
            args.interval.as_micros(),
            percentile(&lat_ms, 50.0),
            percentile(&lat_ms, 99.0),
            lat_ms.last().copied().unwrap_or(f64::NAN)
        );
        Ok(())
    }
}
