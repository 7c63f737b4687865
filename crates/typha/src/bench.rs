//! `margay typha bench`: a real `margay typha` process on loopback, fed by an embedded store,
//! and many lean clients in this process (one tokio runtime; they decode frames but keep no
//! copy of the state, so a thousand of them fit on a small machine).
//!
//! Runs: (1) clients joining a snapshot: time until every client is in sync, Typha's RSS and
//! its growth per idle connected client; (2) updates at a fixed rate fanned out to every
//! client: delivery latency percentiles (the value carries its send time).

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use margay_datastore::{KvBackend, SyncStatus};
use tokio::net::TcpStream;

use crate::proto::{self, ClientHello, Message};
use crate::wire;

/// Resident memory of a process, from /proc.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU time (user + system) a process has used, from /proc (USER_HZ is 100 on Linux).
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at state (field 3).
    let rest = s.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// join: clients joining a snapshot; fanout: update latency; all: the issue's runs
    /// (1,000 clients × 10k resources, 200 × 100k, 1,000 updates/s to 1,000 clients).
    #[arg(long, default_value = "all")]
    pub scenario: String,
    /// Clients (join and fanout).
    #[arg(long)]
    pub clients: Option<usize>,
    /// Resources in the snapshot.
    #[arg(long)]
    pub resources: Option<usize>,
    /// Updates per second (fanout).
    #[arg(long, default_value_t = 1000)]
    pub rate: u32,
    /// Seconds of updates (fanout).
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// The margay binary to run as Typha (default: this one).
    #[arg(long)]
    pub typha_bin: Option<PathBuf>,
    /// Small numbers, for a smoke test.
    #[arg(long)]
    pub quick: bool,
}

/// Kills the Typha process when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A NetworkSet's stored JSON; `sent` (Unix µs) lets clients measure delivery latency.
pub fn network_set_json(i: usize, generation: u64, sent: Option<u64>) -> Vec<u8> {
    let ann = match sent {
        Some(t) => format!(r#","annotations":{{"margay.bench/sent":"{t}"}}"#),
        None => String::new(),
    };
    format!(
        r#"{{"apiVersion":"projectcalico.org/v3","kind":"NetworkSet","metadata":{{"name":"set-{i}","namespace":"bench","labels":{{"app":"app-{}","generation":"g{generation}"}}{ann}}},"spec":{{"nets":["10.{}.{}.{}/32"]}}}}"#,
        i % 50,
        (i >> 16) & 0xff,
        (i >> 8) & 0xff,
        i & 0xff
    )
    .into_bytes()
}

pub fn network_set_key(i: usize) -> String {
    format!("/calico/resources/v3/projectcalico.org/networksets/bench/set-{i}")
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or_default()
}

const MARKER: &[u8] = b"\"margay.bench/sent\":\"";

fn sent_of(value: &[u8]) -> Option<u64> {
    let at = value.windows(MARKER.len()).position(|w| w == MARKER)? + MARKER.len();
    let digits = value[at..].iter().take_while(|b| b.is_ascii_digit());
    let mut v: u64 = 0;
    for d in digits {
        v = v * 10 + u64::from(d - b'0');
    }
    Some(v)
}

/// What one lean client saw.
#[derive(Debug, Default)]
pub struct ClientResult {
    pub in_sync_after: Option<Duration>,
    pub snapshot_kvs: usize,
    pub latencies_us: Vec<u32>,
    pub error: Option<String>,
}

/// A lean client: handshake, count the snapshot, then (optionally) measure latencies until
/// `until` (milliseconds after `epoch`).
pub async fn lean_client(
    addr: String,
    start: Instant,
    until: Arc<AtomicU64>,
    epoch: Instant,
    measure: bool,
    synced: Arc<AtomicU64>,
) -> ClientResult {
    let mut r = ClientResult::default();
    let stream = match TcpStream::connect(&addr).await {
        Ok(s) => s,
        Err(e) => {
            r.error = Some(format!("connect: {e}"));
            return r;
        }
    };
    let _ = stream.set_nodelay(true);
    let (rd, mut wr) = stream.into_split();
    // Buffered as the real client is (one read for a burst of frames).
    let mut rd = tokio::io::BufReader::with_capacity(64 << 10, rd);
    let hello = Message::ClientHello(ClientHello {
        min_version: proto::MIN_PROTOCOL_VERSION,
        max_version: proto::PROTOCOL_VERSION,
        hostname: "bench".into(),
        info: "margay typha bench".into(),
        syncer_type: "felix".into(),
        compression: vec![proto::COMPRESSION_SNAPPY.into()],
        capabilities: vec![],
    });
    if let Err(e) = wire::write_frame(
        &mut wr,
        &proto::encode(&hello, false),
        Duration::from_secs(30),
    )
    .await
    {
        r.error = Some(e.to_string());
        return r;
    }
    let max = proto::DEFAULT_MAX_CLIENT_INBOUND;
    loop {
        let deadline = until.load(Ordering::Relaxed);
        let left = Duration::from_millis(deadline)
            .saturating_sub(epoch.elapsed())
            .max(Duration::from_millis(1));
        let msg = match tokio::time::timeout(left, wire::read_frame(&mut rd, max)).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => {
                r.error = Some(e.to_string());
                return r;
            }
            Err(_) => {
                if epoch.elapsed() >= Duration::from_millis(until.load(Ordering::Relaxed)) {
                    return r;
                }
                continue;
            }
        };
        match msg {
            Message::Kvs(kvs) => {
                if r.in_sync_after.is_none() {
                    r.snapshot_kvs += kvs.len();
                } else if measure {
                    let now = now_us();
                    for kv in &kvs {
                        if let Some(sent) = kv.value.as_deref().and_then(sent_of) {
                            r.latencies_us
                                .push(now.saturating_sub(sent).min(u64::from(u32::MAX)) as u32);
                        }
                    }
                }
            }
            Message::SyncStatus { status, .. }
                if status == SyncStatus::InSync && r.in_sync_after.is_none() =>
            {
                r.in_sync_after = Some(start.elapsed());
                synced.fetch_add(1, Ordering::Relaxed);
            }
            Message::Ping(t) => {
                let _ = wire::write_frame(
                    &mut wr,
                    &proto::encode(&Message::Pong(t), false),
                    Duration::from_secs(10),
                )
                .await;
            }
            _ => {}
        }
    }
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i.min(sorted.len() - 1)]) / 1000.0
}

struct Env {
    _dir: tempfile::TempDir,
    store: PathBuf,
    _typha: Proc,
    pid: u32,
    addr: String,
}

fn spawn_typha(bin: &Path, store: &Path) -> Result<(Proc, u32, String, u16), String> {
    let port = free_port().map_err(|e| e.to_string())?;
    let hport = free_port().map_err(|e| e.to_string())?;
    let child = Command::new(bin)
        .arg("typha")
        .env("TYPHA_LOGFILEPATH", "none")
        .env("DATASTORE_TYPE", "local")
        .env("DATASTORE_PATH", store)
        .env("TYPHA_SERVERHOST", "127.0.0.1")
        .env("TYPHA_SERVERPORT", port.to_string())
        .env("TYPHA_HEALTHENABLED", "true")
        .env("TYPHA_HEALTHHOST", "127.0.0.1")
        .env("TYPHA_HEALTHPORT", hport.to_string())
        .env("TYPHA_SYNCERTYPES", "felix")
        .env("TYPHA_LOGSEVERITYSCREEN", "warning")
        .env("TYPHA_CONFIG_FILE", "/nonexistent/typha.cfg")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let pid = child.id();
    Ok((Proc(child), pid, format!("127.0.0.1:{port}"), hport))
}

fn http_get(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.split_whitespace().nth(1)?.parse().ok()
}

async fn setup(bin: &Path, resources: usize, out: &mut dyn std::io::Write) -> Result<Env, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let store = dir.path().join("store.db");
    let backend = margay_datastore::local::LocalBackend::open(
        margay_datastore::local::LocalOptions::new(&store),
    )
    .map_err(|e| e.to_string())?;
    let t = Instant::now();
    for i in 0..resources {
        backend
            .create(&network_set_key(i), network_set_json(i, 0, None), None)
            .await
            .map_err(|e| e.to_string())?;
    }
    let _ = writeln!(
        out,
        "  store: {resources} NetworkSets written in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    drop(backend);
    let (typha, pid, addr, hport) = spawn_typha(bin, &store)?;
    let t = Instant::now();
    loop {
        if http_get(hport, "/readiness") == Some(200) {
            break;
        }
        if t.elapsed() > Duration::from_secs(120) {
            return Err("Typha did not become ready within 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = writeln!(
        out,
        "  typha: in sync {:.2}s after start, RSS {:.1} MiB",
        t.elapsed().as_secs_f64(),
        rss_bytes(pid).unwrap_or(0) as f64 / 1048576.0
    );
    Ok(Env {
        _dir: dir,
        store,
        _typha: typha,
        pid,
        addr,
    })
}

/// Results of a join run.
#[derive(Debug, Clone)]
pub struct JoinResult {
    pub clients: usize,
    pub resources: usize,
    pub all_in_sync: Duration,
    pub rss_before: u64,
    pub rss_after: u64,
    pub per_client_bytes: i64,
    pub errors: usize,
}

async fn join(
    bin: &Path,
    clients: usize,
    resources: usize,
    out: &mut dyn std::io::Write,
) -> Result<JoinResult, String> {
    let _ = writeln!(
        out,
        "join: {clients} clients, {resources}-resource snapshot"
    );
    let env = setup(bin, resources, out).await?;
    // Warm up: one client takes the snapshot path once, so the baseline includes the code
    // and allocator state a connection needs.
    let epoch = Instant::now();
    let until = Arc::new(AtomicU64::new(u64::MAX));
    {
        let stop = Arc::new(AtomicU64::new(
            epoch.elapsed().as_millis() as u64 + 2000 + resources as u64 / 20,
        ));
        let one = Arc::new(AtomicU64::new(0));
        let _ = lean_client(env.addr.clone(), Instant::now(), stop, epoch, false, one).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_before = rss_bytes(env.pid).unwrap_or(0);
    let start = Instant::now();
    let synced = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            tokio::spawn(lean_client(
                env.addr.clone(),
                start,
                until.clone(),
                epoch,
                false,
                synced.clone(),
            ))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut all_in_sync = None;
    let mut errors = 0;
    while Instant::now() < deadline && synced.load(Ordering::Relaxed) < clients as u64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the idle clients sit, measure memory, then stop them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_after = rss_bytes(env.pid).unwrap_or(0);
    until.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    let mut worst = Duration::ZERO;
    let mut snap_ok = 0;
    for h in handles {
        match h.await {
            Ok(r) => {
                if let Some(t) = r.in_sync_after {
                    worst = worst.max(t);
                    if r.snapshot_kvs == resources {
                        snap_ok += 1;
                    }
                } else {
                    errors += 1;
                    if errors <= 3 {
                        let _ = writeln!(out, "  client error: {:?}", r.error);
                    }
                }
            }
            Err(_) => errors += 1,
        }
    }
    if errors == 0 {
        all_in_sync = Some(worst);
    }
    let per_client = (rss_after as i64 - rss_before as i64) / clients.max(1) as i64;
    let _ = writeln!(
        out,
        "  all {clients} clients in sync after {:.2}s ({snap_ok} received exactly {resources} KVs; {errors} errors)",
        worst.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "  typha RSS: {:.1} MiB before, {:.1} MiB with {clients} idle clients: {:.1} KiB per client",
        rss_before as f64 / 1048576.0,
        rss_after as f64 / 1048576.0,
        per_client as f64 / 1024.0
    );
    drop(env);
    Ok(JoinResult {
        clients,
        resources,
        all_in_sync: all_in_sync.unwrap_or(worst),
        rss_before,
        rss_after,
        per_client_bytes: per_client,
        errors,
    })
}

#[derive(Debug, Clone)]
pub struct FanoutResult {
    pub clients: usize,
    pub rate: u32,
    pub sent: u64,
    pub delivered: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub rss: u64,
}

async fn fanout(
    bin: &Path,
    clients: usize,
    resources: usize,
    rate: u32,
    secs: u64,
    out: &mut dyn std::io::Write,
) -> Result<FanoutResult, String> {
    let _ = writeln!(
        out,
        "fanout: {rate} updates/s for {secs}s to {clients} clients ({resources}-resource snapshot)"
    );
    let env = setup(bin, resources, out).await?;
    let epoch = Instant::now();
    let until = Arc::new(AtomicU64::new(u64::MAX));
    let start = Instant::now();
    let synced = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            tokio::spawn(lean_client(
                env.addr.clone(),
                start,
                until.clone(),
                epoch,
                true,
                synced.clone(),
            ))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline && synced.load(Ordering::Relaxed) < clients as u64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The writer: its own thread and runtime, paced.
    let store = env.store.clone();
    let n = resources.max(1);
    let writer = std::thread::spawn(move || -> Result<u64, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let b = margay_datastore::local::LocalBackend::open(
                margay_datastore::local::LocalOptions::new(&store),
            )
            .map_err(|e| e.to_string())?;
            let total = u64::from(rate) * secs;
            let t0 = Instant::now();
            for k in 0..total {
                let due = t0 + Duration::from_secs_f64(k as f64 / f64::from(rate));
                tokio::time::sleep_until(due.into()).await;
                let i = (k as usize) % n;
                b.update(
                    &network_set_key(i),
                    network_set_json(i, k + 1, Some(now_us())),
                    None,
                    None,
                )
                .await
                .map_err(|e| e.to_string())?;
            }
            Ok(total)
        })
    });
    // CPU used while the updates flow: Typha's, and this process's (the clients and the
    // writer), which share the machine's cores with it.
    let typha_pid = env.pid.to_string();
    let cpu0 = (cpu_seconds(&typha_pid), cpu_seconds("self"));
    let t_updates = Instant::now();
    let sent = tokio::task::spawn_blocking(move || writer.join())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|_| "writer panicked".to_string())??;
    let wall = t_updates.elapsed().as_secs_f64().max(0.001);
    if let ((Some(t0), Some(b0)), Some(t1), Some(b1)) =
        (cpu0, cpu_seconds(&typha_pid), cpu_seconds("self"))
    {
        let _ = writeln!(
            out,
            "  CPU while updating ({wall:.1}s): typha {:.0}% of a core, bench clients + writer {:.0}%",
            (t1 - t0) / wall * 100.0,
            (b1 - b0) / wall * 100.0
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = rss_bytes(env.pid).unwrap_or(0);
    until.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut errors = 0;
    for h in handles {
        match h.await {
            Ok(r) => {
                if r.error.is_some() {
                    errors += 1;
                }
                all.extend(r.latencies_us);
            }
            Err(_) => errors += 1,
        }
    }
    all.sort_unstable();
    let res = FanoutResult {
        clients,
        rate,
        sent,
        delivered: all.len() as u64,
        p50_ms: percentile(&all, 0.50),
        p99_ms: percentile(&all, 0.99),
        max_ms: all.last().map(|v| f64::from(*v) / 1000.0).unwrap_or(0.0),
        rss,
    };
    let _ = writeln!(
        out,
        "  delivered {} of {} updates × clients ({errors} client errors); latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; typha RSS {:.1} MiB",
        res.delivered,
        res.sent * clients as u64,
        res.p50_ms,
        res.p99_ms,
        res.max_ms,
        rss as f64 / 1048576.0
    );
    drop(env);
    Ok(res)
}

/// Raises this process's open-file limit (inherited by the Typha it starts) to `want` file
/// descriptors: both sides hold one socket per client. Fails with what to do when the hard
/// limit is lower and cannot be raised (not root).
pub fn raise_fd_limit(want: u64) -> Result<u64, String> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) =
        getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| format!("getrlimit(NOFILE): {e}"))?;
    if soft >= want {
        return Ok(soft);
    }
    let new_hard = hard.max(want);
    setrlimit(Resource::RLIMIT_NOFILE, want, new_hard).map_err(|e| {
        format!(
            "{want} open files are needed (one socket per client on each side), but the limit is {soft} (hard {hard}) and raising it failed ({e}): run `ulimit -n {want}` as root first, or use fewer --clients"
        )
    })?;
    Ok(want)
}

/// Runs the benchmark; returns the exit code.
pub fn run(args: BenchArgs, out: &mut dyn std::io::Write) -> u8 {
    let most_clients = args.clients.unwrap_or(if args.quick { 50 } else { 1000 }) as u64;
    match raise_fd_limit(most_clients * 2 + 1024) {
        Ok(n) => {
            let _ = writeln!(out, "open-file limit: {n}");
        }
        Err(e) => {
            let _ = writeln!(out, "{e}");
            return 2;
        }
    }
    let bin = match args
        .typha_bin
        .clone()
        .map(Ok)
        .unwrap_or_else(std::env::current_exe)
    {
        Ok(b) => b,
        Err(e) => {
            let _ = writeln!(out, "cannot find the margay binary: {e} (pass --typha-bin)");
            return 2;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(out, "cannot start a runtime: {e}");
            return 1;
        }
    };
    let q = args.quick;
    let result = rt.block_on(async {
        let mut ok = true;
        if args.scenario == "join" || args.scenario == "all" {
            let runs: Vec<(usize, usize, f64)> = match (args.clients, args.resources) {
                (Some(c), Some(r)) => vec![(c, r, f64::INFINITY)],
                _ if q => vec![(50, 1000, 10.0)],
                _ => vec![(1000, 10_000, 10.0), (200, 100_000, 30.0)],
            };
            for (c, r, limit) in runs {
                let j = join(&bin, c, r, out).await?;
                let pass = j.errors == 0 && j.all_in_sync.as_secs_f64() <= limit;
                ok &= pass;
                let _ = writeln!(
                    out,
                    "  => {} (target ≤ {limit} s)",
                    if pass { "PASS" } else { "FAIL" }
                );
                let mem_ok = j.per_client_bytes <= 64 * 1024;
                ok &= mem_ok;
                let _ = writeln!(
                    out,
                    "  => memory per idle client {} (target ≤ 64 KiB)",
                    if mem_ok { "PASS" } else { "FAIL" }
                );
            }
        }
        if args.scenario == "fanout" || args.scenario == "all" {
            let clients = args.clients.unwrap_or(if q { 50 } else { 1000 });
            let resources = args.resources.unwrap_or(if q { 200 } else { 1000 });
            let secs = if q { 2 } else { args.duration };
            let f = fanout(&bin, clients, resources, args.rate, secs, out).await?;
            let pass = f.p99_ms <= 100.0 && f.delivered >= f.sent * clients as u64;
            ok &= pass;
            let _ = writeln!(
                out,
                "  => {} (target p99 ≤ 100 ms, every update delivered)",
                if pass { "PASS" } else { "FAIL" }
            );
        }
        Ok::<bool, String>(ok)
    });
    match result {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            let _ = writeln!(out, "benchmark failed: {e}");
            1
        }
    }
}
