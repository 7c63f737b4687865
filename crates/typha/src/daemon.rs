//! `margay typha`: configuration, one upstream pipeline per syncer type, the server, health
//! (9098) and metrics (9093), and graceful shutdown (SIGTERM: every client is asked to migrate,
//! spread over the drain period).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use margay_datastore::{DatastoreConfig, SyncStatus};
use tokio::sync::watch;

use crate::cache::{Cache, CacheReader};
use crate::config::{RebalancingMode, TyphaConfig};
use crate::discovery::{RebalanceSettings, run_rebalancer};
use crate::server::{Server, ServerOptions};
use crate::syncers::SyncerType;
use crate::tls::{ServerTls, TYPHA_PARAMS, TlsFiles};
use crate::upstream::{self, PipelineOptions, UpstreamStats};
use margay_daemon_http::metrics::{Kind, Registry, SampleWriter};
use margay_daemon_http::{Health, Limits, Router};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

#[derive(Clone)]
pub struct DaemonOptions {
    pub env: BTreeMap<String, String>,
    pub config_file: PathBuf,
    pub handle_signals: bool,
    /// Applies LogFilePath + LogSeverityFile (None: no file destination to manage).
    pub log_file: Option<margay_logging::FileSetter>,
}

impl std::fmt::Debug for DaemonOptions {
    /// The environment's names only: its values include secrets (ETCD_PASSWORD,
    /// K8S_API_TOKEN, KUBECONFIG_INLINE).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaemonOptions")
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("config_file", &self.config_file)
            .field("handle_signals", &self.handle_signals)
            .finish()
    }
}

impl DaemonOptions {
    pub fn from_process(config_file: PathBuf) -> DaemonOptions {
        // `vars()` would panic on an entry that is not UTF-8: leave such entries out, by name.
        let (env, skipped) = crate::config::env_from_os(std::env::vars_os());
        for name in skipped {
            tracing::warn!(variable = %crate::server::shown(&name), "ignoring an environment variable whose name or value is not UTF-8");
        }
        DaemonOptions {
            env,
            config_file,
            handle_signals: true,
            log_file: None,
        }
    }
}

/// Runs Typha on its own runtime; returns the exit code (0 after a clean stop, 1 on a fatal
/// error, 2 on invalid configuration).
pub fn run(opts: DaemonOptions) -> u8 {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("typha")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return 1;
        }
    };
    let code = rt.block_on(run_async(opts));
    rt.shutdown_timeout(Duration::from_millis(500));
    code
}

struct Pipeline {
    reader: CacheReader,
    stats: Arc<UpstreamStats>,
    _task: AbortOnDrop,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// LogFilePath + LogSeverityFile, as Calico's Typha: no file when the path is `none`; a file
/// that cannot be opened stops Typha (the parameter is die-on-fail).
fn apply_log_file(set: &margay_logging::FileSetter, config: &TyphaConfig) -> Result<(), String> {
    let level = margay_logging::calico_level(&config.log_severity_file).unwrap_or("info");
    if config.log_file_path.is_empty() || level == "off" {
        return set(None, "off");
    }
    let path = std::path::Path::new(&config.log_file_path);
    set(Some(path), level).map_err(|e| {
        format!(
            "LogFilePath: {e}; fix the path or its permissions, or set TYPHA_LOGFILEPATH=none \
             to log only to the screen"
        )
    })?;
    tracing::info!(path = %path.display(), level = %config.log_severity_file, "Logging to file");
    Ok(())
}

pub async fn run_async(opts: DaemonOptions) -> u8 {
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        pid = std::process::id(),
        "Typha starting up"
    );
    let file_text = match std::fs::read_to_string(&opts.config_file) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::error!(path = %opts.config_file.display(), "cannot read the config file: {e} (fix its permissions or point --config-file elsewhere)");
            return 2;
        }
    };
    let config = match TyphaConfig::load(&opts.env, file_text.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e}");
            return 2;
        }
    };
    if let Some(set) = &opts.log_file
        && let Err(e) = apply_log_file(set, &config)
    {
        tracing::error!("{e}");
        return 1;
    }
    let tls = if config.tls_configured() {
        let files = TlsFiles {
            key_file: config.server_key_file.clone(),
            cert_file: config.server_cert_file.clone(),
            ca_file: config.ca_file.clone(),
            expected: crate::tls::ExpectedPeer {
                cn: config.client_cn.clone(),
                uri_san: config.client_uri_san.clone(),
            },
        };
        match ServerTls::from_files(&files, TYPHA_PARAMS) {
            Ok(t) => {
                tracing::info!(client_cn = %config.client_cn, client_uri_san = %config.client_uri_san, "TLS enabled: clients must present a certificate signed by CAFile");
                Some(t)
            }
            Err(e) => {
                tracing::error!("{e}");
                return 2;
            }
        }
    } else {
        match config.plaintext_warning() {
            Some(w) => tracing::warn!("{w}"),
            None => tracing::info!("TLS not configured: serving plain TCP on loopback"),
        }
        None
    };
    let env = opts.env.clone();
    let ds = match DatastoreConfig::from_lookup(|k| env.get(k).cloned()) {
        Ok(d) => d,
        Err(e) => {
            tracing::error!("datastore configuration: {e}");
            return 2;
        }
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let (sig_tx, mut sig_rx) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
    if opts.handle_signals {
        spawn_signals(sig_tx);
    }
    tracing::info!(datastore = %ds.describe(), "Connecting to the datastore");
    let backend = loop {
        let attempt = tokio::time::timeout(Duration::from_secs(10), ds.connect());
        tokio::select! {
            r = attempt => match r {
                Ok(Ok(b)) => break b,
                Ok(Err(e)) => tracing::error!(datastore = %ds.describe(), "cannot connect to the datastore: {e}; retrying in 1s"),
                Err(_) => tracing::error!(datastore = %ds.describe(), "connecting to the datastore timed out; retrying"),
            },
            s = sig_rx.recv() => {
                tracing::info!(signal = ?s, "stopping before the datastore was reached");
                return 0;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };

    let mut pipelines: HashMap<SyncerType, Pipeline> = HashMap::new();
    for name in &config.syncer_types {
        let Some(ty) = SyncerType::parse(name) else {
            continue;
        };
        let cache = Cache::new(Instant::now());
        let reader = cache.reader();
        let stats = Arc::new(UpstreamStats::default());
        let p = PipelineOptions {
            max_batch: config.snapshot_cache_max_batch_size,
            batching_age: config.server_min_batching_age,
            kubernetes_services: matches!(backend, margay_datastore::AnyBackend::Kube(_)),
            ..PipelineOptions::default()
        };
        let task = tokio::spawn(upstream::run(backend.clone(), ty, cache, p, stats.clone()));
        pipelines.insert(
            ty,
            Pipeline {
                reader,
                stats,
                _task: AbortOnDrop(task),
            },
        );
    }

    let host = if config.server_host.is_empty() {
        "0.0.0.0"
    } else {
        config.server_host.as_str()
    };
    let listener = match tokio::net::TcpListener::bind((host, config.server_port)).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(
                host,
                port = config.server_port,
                "cannot listen for clients: {e} (free the port or set TYPHA_SERVERPORT / TYPHA_SERVERHOST)"
            );
            return 1;
        }
    };
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let server_id = format!("{local}/{}", std::process::id());
    let caches: HashMap<SyncerType, CacheReader> = pipelines
        .iter()
        .map(|(t, p)| (*t, p.reader.clone()))
        .collect();
    let server = Server::new(
        ServerOptions::from_config(&config, server_id),
        caches.clone(),
        tls,
    );
    tracing::info!(
        addr = %local,
        syncer_types = ?config.syncer_types,
        connection_limit = server.connection_limit(),
        rebalancing = config.connection_rebalancing_mode.name(),
        "Typha listening for clients"
    );
    let serve = tokio::spawn(server.clone().serve(listener, stop_rx.clone()));
    let _rebalancer = start_rebalancing(&config, &server, &caches, &ds.kube);

    let pipelines = Arc::new(pipelines);
    let mut side = Vec::new();
    if config.health_enabled {
        match margay_daemon_http::bind(&config.health_host, config.health_port).await {
            Ok(l) => {
                tracing::info!(host = %config.health_host, port = config.health_port, "Health enabled. Starting server.");
                let health = TyphaHealth {
                    server: server.clone(),
                    pipelines: pipelines.clone(),
                };
                side.push(tokio::spawn(margay_daemon_http::serve(
                    l,
                    Router::new().health(Arc::new(health)).into_handler(),
                    None,
                    Limits::default(),
                    stop_rx.clone(),
                )));
            }
            Err(e) => {
                tracing::error!(
                    port = config.health_port,
                    "cannot serve health: {e} (free the port or set TYPHA_HEALTHPORT)"
                );
                return 1;
            }
        }
    }
    if config.prometheus_metrics_enabled {
        match margay_daemon_http::bind(
            &config.prometheus_metrics_host,
            config.prometheus_metrics_port,
        )
        .await
        {
            Ok(l) => {
                tracing::info!(
                    port = config.prometheus_metrics_port,
                    "Prometheus metrics enabled. Starting server."
                );
                let registry = metrics_registry(&server, &pipelines);
                side.push(tokio::spawn(margay_daemon_http::serve(
                    l,
                    Router::new().metrics(Arc::new(registry)).into_handler(),
                    None,
                    Limits::default(),
                    stop_rx.clone(),
                )));
            }
            Err(e) => {
                tracing::error!(
                    port = config.prometheus_metrics_port,
                    "cannot serve metrics: {e} (free the port or set TYPHA_PROMETHEUSMETRICSPORT)"
                );
                return 1;
            }
        }
    }

    let signal = sig_rx.recv().await;
    tracing::info!(signal = ?signal, drain = ?config.shutdown_timeout, "Shutting down gracefully: no new clients; moving the connected ones to other Typhas");
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(1), serve).await;
    tokio::select! {
        _ = server.drain() => tracing::info!("Every client has moved; exiting"),
        s = sig_rx.recv() => tracing::warn!(signal = ?s, "Second signal: exiting without waiting for clients to move"),
    }
    for s in side {
        s.abort();
    }
    0
}

/// TYPHA_CONNECTIONREBALANCINGMODE=kubernetes: the poll that keeps the server's connection
/// limit in step with the Typhas in the Service and the nodes the syncer sees (the felix
/// syncer's Nodes, or the bgp syncer's when felix is not served). None when the mode is off,
/// or when MaxConnections fixes the limit.
fn start_rebalancing(
    config: &TyphaConfig,
    server: &Arc<Server>,
    caches: &HashMap<SyncerType, CacheReader>,
    kube: &margay_datastore::KubeSettings,
) -> Option<AbortOnDrop> {
    if config.connection_rebalancing_mode != RebalancingMode::Kubernetes {
        return None;
    }
    if config.max_connections > 0 {
        tracing::info!(
            max_connections = config.max_connections,
            "MaxConnections fixes the connection limit; not polling Kubernetes for it"
        );
        return None;
    }
    let Some(nodes) = caches
        .get(&SyncerType::Felix)
        .or_else(|| caches.get(&SyncerType::Bgp))
        .cloned()
    else {
        tracing::warn!("no syncer serves Nodes; the connection limit stays at the upper limit");
        return None;
    };
    Some(AbortOnDrop(tokio::spawn(run_rebalancer(
        server.clone(),
        kube.clone(),
        nodes,
        RebalanceSettings::from_config(config),
    ))))
}

/// A Typha inside this process (tests, benchmarks): the pipelines and the server on the
/// caller's runtime, listening on `listen`.
pub struct Embedded {
    pub addr: std::net::SocketAddr,
    pub server: Arc<Server>,
    pub caches: HashMap<SyncerType, CacheReader>,
    pub upstream: HashMap<SyncerType, Arc<UpstreamStats>>,
    stop: watch::Sender<bool>,
    tasks: Vec<AbortOnDrop>,
}

impl Embedded {
    pub async fn start<B: margay_datastore::KvBackend + Clone>(
        backend: B,
        config: &TyphaConfig,
        tls: Option<ServerTls>,
        listen: &str,
    ) -> std::io::Result<Embedded> {
        let mut caches = HashMap::new();
        let mut upstream_stats = HashMap::new();
        let mut tasks = Vec::new();
        for name in &config.syncer_types {
            let Some(ty) = SyncerType::parse(name) else {
                continue;
            };
            let cache = Cache::new(Instant::now());
            caches.insert(ty, cache.reader());
            let stats = Arc::new(UpstreamStats::default());
            upstream_stats.insert(ty, stats.clone());
            let p = PipelineOptions {
                max_batch: config.snapshot_cache_max_batch_size,
                batching_age: config.server_min_batching_age,
                ..PipelineOptions::default()
            };
            tasks.push(AbortOnDrop(tokio::spawn(upstream::run(
                backend.clone(),
                ty,
                cache,
                p,
                stats,
            ))));
        }
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let server = Server::new(
            ServerOptions::from_config(config, format!("{addr}/embedded")),
            caches.clone(),
            tls,
        );
        let (stop, stop_rx) = watch::channel(false);
        tasks.push(AbortOnDrop(tokio::spawn(
            server.clone().serve(listener, stop_rx),
        )));
        Ok(Embedded {
            addr,
            server,
            caches,
            upstream: upstream_stats,
            stop,
            tasks,
        })
    }

    /// Whether every pipeline is in sync.
    pub fn in_sync(&self) -> bool {
        self.caches
            .values()
            .all(|c| c.latest().status == SyncStatus::InSync)
    }

    /// Stops like a killed process: the listener closes, every connection drops at once.
    pub fn kill(self) {
        let _ = self.stop.send(true);
        self.server.abort_all();
        drop(self.tasks);
    }

    /// Stops gracefully: no new clients, every client asked to migrate (drain period).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        self.server.drain().await;
        drop(self.tasks);
    }
}

fn spawn_signals(tx: tokio::sync::mpsc::UnboundedSender<&'static str>) {
    use tokio::signal::unix::{SignalKind, signal};
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers; SIGTERM will not drain clients");
            return;
        };
        loop {
            let s = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            if tx.send(s).is_err() {
                return;
            }
        }
    });
}

/// Typha's health: always live; ready once every syncer type's upstream is in sync, the
/// body listing each one's status.
struct TyphaHealth {
    server: Arc<Server>,
    pipelines: Arc<HashMap<SyncerType, Pipeline>>,
}

impl Health for TyphaHealth {
    fn liveness(&self) -> (u16, String) {
        (200, "live\n".into())
    }

    fn readiness(&self) -> (u16, String) {
        let mut body = String::new();
        let mut ready = true;
        let mut types: Vec<_> = self.pipelines.keys().copied().collect();
        types.sort();
        for t in types {
            let s = self.server.status(t);
            ready &= s == Some(SyncStatus::InSync);
            let _ = writeln!(body, "syncer {t}: {s:?}");
        }
        (if ready { 200 } else { 503 }, body)
    }
}

/// Typha's metrics, read from the server's and the pipelines' counters at each scrape. The
/// counters Calico exports without `_total` are Calico-named families; the gauges,
/// `typha_updates_total` and the resident memory are prometheus-client collectors.
fn metrics_registry(
    server: &Arc<Server>,
    pipelines: &Arc<HashMap<SyncerType, Pipeline>>,
) -> Registry {
    type Stat = fn(&crate::server::ServerStats) -> u64;
    let counters: [(&str, &str, Stat); 15] = [
        ("typha_connections_accepted", "Connections accepted.", |s| {
            s.accepted.load(Ordering::Relaxed)
        }),
        (
            "typha_connections_dropped",
            "Connections dropped for falling behind (MaxFallBehind).",
            |s| s.dropped_fall_behind.load(Ordering::Relaxed),
        ),
        (
            "typha_connections_write_timeouts",
            "Connections dropped because a write timed out.",
            |s| s.dropped_write_timeout.load(Ordering::Relaxed),
        ),
        (
            "typha_connections_pong_timeouts",
            "Connections dropped because no pong arrived in time.",
            |s| s.dropped_pong_timeout.load(Ordering::Relaxed),
        ),
        (
            "typha_handshake_failures",
            "Connections that failed the hello.",
            |s| s.handshake_failures.load(Ordering::Relaxed),
        ),
        (
            "typha_tls_failures",
            "Connections refused by TLS (no or wrong client certificate).",
            |s| s.tls_failures.load(Ordering::Relaxed),
        ),
        (
            "typha_version_mismatches",
            "Clients refused for their protocol version.",
            |s| s.version_mismatches.load(Ordering::Relaxed),
        ),
        (
            "typha_bad_frames",
            "Malformed, oversized or truncated frames received.",
            |s| s.bad_frames.load(Ordering::Relaxed),
        ),
        (
            "typha_migrations_requested",
            "Clients asked to move to another Typha.",
            |s| s.migrations_requested.load(Ordering::Relaxed),
        ),
        (
            "typha_closed_after_grace",
            "Clients closed after not migrating within the grace period.",
            |s| s.closed_after_grace.load(Ordering::Relaxed),
        ),
        (
            "typha_refused_full",
            "Migrating clients refused because this Typha is at its limit.",
            |s| s.refused_full.load(Ordering::Relaxed),
        ),
        ("typha_snapshots_generated", "Snapshots encoded.", |s| {
            s.snapshots_encoded.load(Ordering::Relaxed)
        }),
        (
            "typha_snapshots_reused",
            "Clients that shared an already encoded snapshot.",
            |s| s.snapshots_shared.load(Ordering::Relaxed),
        ),
        (
            "typha_connections_evicted_pending",
            "Connections without a hello closed to make room for newer ones (ServerMaxPendingHandshakes).",
            |s| s.evicted_pending.load(Ordering::Relaxed),
        ),
        (
            "typha_snapshot_deadline_drops",
            "Clients closed because their snapshot was not sent within the write timeout.",
            |s| s.dropped_snapshot_deadline.load(Ordering::Relaxed),
        ),
    ];
    let mut r = Registry::new();
    for (name, help, stat) in counters {
        let server = server.clone();
        r.register_calico(
            name,
            help,
            Kind::Counter,
            move |w: &mut SampleWriter<'_>| {
                w.sample_u64(&[], stat(&server.stats));
            },
        );
    }
    r.register_calico(
        "typha_datastore_skipped_entries",
        "Keys or values the datastore could not decode and skipped.",
        Kind::Counter,
        |w: &mut SampleWriter<'_>| w.sample_u64(&[], margay_datastore::kv::skipped_entries()),
    );
    {
        let server = server.clone();
        r.register_calico(
            "typha_frames_sent",
            "Frames written to clients.",
            Kind::Counter,
            move |w: &mut SampleWriter<'_>| {
                w.sample_u64(&[], server.stats.frames_sent.load(Ordering::Relaxed));
            },
        );
    }
    let part = |part| {
        Box::new(TyphaCollector {
            server: server.clone(),
            pipelines: pipelines.clone(),
            part,
        })
    };
    r.register_collector(part(Part::Gauges));
    r.register_collector(part(Part::Updates));
    type PerSyncer = fn(&UpstreamStats) -> u64;
    let per_syncer: [(&str, &str, PerSyncer); 2] = [
        (
            "typha_invalid_resources",
            "Values the validation filter served as deletions.",
            |s| s.invalid.load(Ordering::Relaxed),
        ),
        (
            "typha_oversized_values",
            "Values larger than a client accepts, served as deletions.",
            |s| s.oversized.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, stat) in per_syncer {
        let pipelines = pipelines.clone();
        r.register_calico(
            name,
            help,
            Kind::Counter,
            move |w: &mut SampleWriter<'_>| {
                for (t, p) in sorted(&pipelines) {
                    w.sample_u64(&[("syncer", &t.to_string())], stat(&p.stats));
                }
            },
        );
    }
    r.register_collector(part(Part::Memory));
    r
}

fn sorted(pipelines: &HashMap<SyncerType, Pipeline>) -> Vec<(SyncerType, &Pipeline)> {
    let mut v: Vec<_> = pipelines.iter().map(|(t, p)| (*t, p)).collect();
    v.sort_by_key(|(t, _)| *t);
    v
}

#[derive(Debug, Clone, Copy)]
enum Part {
    Gauges,
    Updates,
    Memory,
}

/// Typha's prometheus-client families, read at each scrape.
struct TyphaCollector {
    server: Arc<Server>,
    pipelines: Arc<HashMap<SyncerType, Pipeline>>,
    part: Part,
}

impl std::fmt::Debug for TyphaCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TyphaCollector")
            .field("part", &self.part)
            .finish()
    }
}

fn to_i64(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

impl Collector for TyphaCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let st = &self.server.stats;
        match self.part {
            Part::Gauges => {
                let mut m = e.encode_descriptor(
                    "typha_connections_active",
                    "Connected clients.",
                    None,
                    MetricType::Gauge,
                )?;
                for (t, n) in self.server.connections_by_type() {
                    let labels = [("syncer", t.to_string())];
                    ConstGauge::new(to_i64(n)).encode(m.encode_family(&labels)?)?;
                }
                for (name, help, v) in [
                    (
                        "typha_pending_handshakes",
                        "Connections that have not finished their hello.",
                        to_i64(st.pending_handshakes.load(Ordering::Relaxed)),
                    ),
                    (
                        "typha_snapshot_bytes",
                        "Bytes of encoded snapshots being sent or kept for sharing.",
                        to_i64(st.snapshot_bytes.load(Ordering::Relaxed)),
                    ),
                    (
                        "typha_connection_limit",
                        "Connections above which clients are asked to migrate.",
                        to_i64(self.server.connection_limit()),
                    ),
                ] {
                    let m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
                    ConstGauge::new(v).encode(m)?;
                }
                let latest: Vec<_> = sorted(&self.pipelines)
                    .into_iter()
                    .map(|(t, p)| (t.to_string(), p.reader.latest()))
                    .collect();
                type Value = fn(&crate::cache::Crumb) -> i64;
                let per_syncer: [(&str, &str, Value); 3] = [
                    (
                        "typha_breadcrumb_seq_number",
                        "Sequence number of the newest breadcrumb.",
                        |c| to_i64(c.seq),
                    ),
                    ("typha_cache_size", "Keys in the snapshot cache.", |c| {
                        to_i64(c.snapshot.len())
                    }),
                    (
                        "typha_in_sync",
                        "Whether the syncer type's upstream is in sync.",
                        |c| i64::from(c.status == SyncStatus::InSync),
                    ),
                ];
                for (name, help, value) in per_syncer {
                    let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
                    for (t, c) in &latest {
                        let labels = [("syncer", t.as_str())];
                        ConstGauge::new(value(c)).encode(m.encode_family(&labels)?)?;
                    }
                }
            }
            Part::Updates => {
                // The encoder appends `_total`: typha_updates_total.
                let mut m = e.encode_descriptor(
                    "typha_updates",
                    "Updates read from the datastore.",
                    None,
                    MetricType::Counter,
                )?;
                for (t, p) in sorted(&self.pipelines) {
                    let labels = [("syncer", t.to_string())];
                    ConstCounter::new(p.stats.updates.load(Ordering::Relaxed))
                        .encode(m.encode_family(&labels)?)?;
                }
            }
            Part::Memory => {
                if let Some(rss) = margay_daemon_http::metrics::rss_bytes() {
                    let m = e.encode_descriptor(
                        "process_resident_memory_bytes",
                        "Resident memory.",
                        None,
                        MetricType::Gauge,
                    )?;
                    ConstGauge::new(to_i64(rss)).encode(m)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn opts(pairs: &[(&str, &str)]) -> DaemonOptions {
        DaemonOptions {
            env: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            config_file: PathBuf::from("/nonexistent/typha.cfg"),
            handle_signals: false,
            log_file: None,
        }
    }

    #[test]
    fn debug_output_shows_no_environment_values() {
        let o = opts(&[("ETCD_PASSWORD", "s3cret"), ("K8S_API_TOKEN", "t0ken")]);
        let shown = format!("{o:?}");
        assert!(shown.contains("ETCD_PASSWORD"), "{shown}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("t0ken"),
            "{shown}"
        );
    }

    /// Each of issue 17's start-up panics is now exit code 2 (invalid configuration), before
    /// anything is opened; a stray multi-byte name is simply not a Typha variable.
    #[tokio::test]
    async fn hostile_settings_exit_with_a_configuration_error() {
        for (k, v) in [
            ("TYPHA_SERVERPINGINTERVALSECS", "0"),
            ("TYPHA_SHUTDOWNTIMEOUTSECS", "1e300"),
            ("TYPHA_SERVERMAXFALLBEHINDSECS", "1e20"),
            ("TYPHA_SERVERWRITETIMEOUTSECS", "0"),
        ] {
            assert_eq!(run_async(opts(&[(k, v)])).await, 2, "{k}={v}");
        }
        // Valid otherwise: fails later, on the datastore, not on the name.
        let o = opts(&[("TYPHAé_SERVERPORT", "x"), ("DATASTORE_TYPE", "nonsense")]);
        assert_eq!(run_async(o).await, 2);
    }

    /// The full list of families (name and type) Typha exported before its metrics moved
    /// to prometheus-client, captured from the hand-written exposition: not one may change.
    #[tokio::test]
    async fn metric_families_are_unchanged() {
        let cache = Cache::new(Instant::now());
        let reader = cache.reader();
        let server = Server::new(
            ServerOptions::from_config(&TyphaConfig::default(), "test".into()),
            HashMap::from([(SyncerType::Felix, reader.clone())]),
            None,
        );
        let stats = Arc::new(UpstreamStats::default());
        stats.updates.fetch_add(4, Ordering::Relaxed);
        stats.invalid.fetch_add(1, Ordering::Relaxed);
        server.stats.accepted.fetch_add(2, Ordering::Relaxed);
        let pipelines = Arc::new(HashMap::from([(
            SyncerType::Felix,
            Pipeline {
                reader,
                stats,
                _task: AbortOnDrop(tokio::spawn(async {})),
            },
        )]));
        let text = metrics_registry(&server, &pipelines).render();
        let got = margay_daemon_http::metrics::families(&text);
        let want = [
            ("typha_connections_accepted", "counter"),
            ("typha_connections_dropped", "counter"),
            ("typha_connections_write_timeouts", "counter"),
            ("typha_connections_pong_timeouts", "counter"),
            ("typha_handshake_failures", "counter"),
            ("typha_tls_failures", "counter"),
            ("typha_version_mismatches", "counter"),
            ("typha_bad_frames", "counter"),
            ("typha_migrations_requested", "counter"),
            ("typha_closed_after_grace", "counter"),
            ("typha_refused_full", "counter"),
            ("typha_snapshots_generated", "counter"),
            ("typha_snapshots_reused", "counter"),
            ("typha_connections_evicted_pending", "counter"),
            ("typha_snapshot_deadline_drops", "counter"),
            ("typha_datastore_skipped_entries", "counter"),
            ("typha_frames_sent", "counter"),
            ("typha_connections_active", "gauge"),
            ("typha_pending_handshakes", "gauge"),
            ("typha_snapshot_bytes", "gauge"),
            ("typha_connection_limit", "gauge"),
            ("typha_breadcrumb_seq_number", "gauge"),
            ("typha_cache_size", "gauge"),
            ("typha_in_sync", "gauge"),
            ("typha_updates_total", "counter"),
            ("typha_invalid_resources", "counter"),
            ("typha_oversized_values", "counter"),
            ("process_resident_memory_bytes", "gauge"),
        ]
        .map(|(n, k)| (n.to_string(), k.to_string()));
        assert_eq!(got, want, "{text}");
        for series in [
            "typha_connections_accepted 2",
            "typha_updates_total{syncer=\"felix\"} 4",
            "typha_invalid_resources{syncer=\"felix\"} 1",
            "typha_cache_size{syncer=\"felix\"} 0",
            "typha_in_sync{syncer=\"felix\"} 0",
        ] {
            assert!(
                text.contains(&format!("{series}\n")),
                "missing {series} in\n{text}"
            );
        }
    }
}
