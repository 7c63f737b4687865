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
use crate::http::{self, Handler, Response};
use crate::server::{Server, ServerOptions};
use crate::syncers::SyncerType;
use crate::tls::{ServerTls, TYPHA_PARAMS, TlsFiles};
use crate::upstream::{self, PipelineOptions, UpstreamStats};

#[derive(Clone)]
pub struct DaemonOptions {
    pub env: BTreeMap<String, String>,
    pub config_file: PathBuf,
    pub handle_signals: bool,
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
        match http::bind(&config.health_host, config.health_port).await {
            Ok(l) => {
                tracing::info!(host = %config.health_host, port = config.health_port, "Health enabled. Starting server.");
                side.push(tokio::spawn(http::serve(
                    l,
                    health_handler(server.clone(), pipelines.clone()),
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
        match http::bind(
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
                side.push(tokio::spawn(http::serve(
                    l,
                    metrics_handler(server.clone(), pipelines.clone()),
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

fn health_handler(server: Arc<Server>, pipelines: Arc<HashMap<SyncerType, Pipeline>>) -> Handler {
    Arc::new(move |path: &str| match path {
        "/liveness" => Response::text(200, "live\n"),
        "/readiness" => {
            let mut body = String::new();
            let mut ready = true;
            let mut types: Vec<_> = pipelines.keys().copied().collect();
            types.sort();
            for t in types {
                let s = server.status(t);
                let ok = s == Some(SyncStatus::InSync);
                ready &= ok;
                let _ = writeln!(body, "syncer {t}: {s:?}");
            }
            Response::text(if ready { 200 } else { 503 }, body)
        }
        _ => Response::text(404, "404 page not found\n"),
    })
}

fn metrics_handler(server: Arc<Server>, pipelines: Arc<HashMap<SyncerType, Pipeline>>) -> Handler {
    Arc::new(move |path: &str| {
        if path != "/metrics" && path != "/" {
            return Response::text(404, "404 page not found\n");
        }
        Response {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: render_metrics(&server, &pipelines).into_bytes(),
        }
    })
}

fn render_metrics(server: &Server, pipelines: &HashMap<SyncerType, Pipeline>) -> String {
    let st = &server.stats;
    let mut out = String::new();
    let mut counter = |name: &str, help: &str, v: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
        );
    };
    counter(
        "typha_connections_accepted",
        "Connections accepted.",
        st.accepted.load(Ordering::Relaxed),
    );
    counter(
        "typha_connections_dropped",
        "Connections dropped for falling behind (MaxFallBehind).",
        st.dropped_fall_behind.load(Ordering::Relaxed),
    );
    counter(
        "typha_connections_write_timeouts",
        "Connections dropped because a write timed out.",
        st.dropped_write_timeout.load(Ordering::Relaxed),
    );
    counter(
        "typha_connections_pong_timeouts",
        "Connections dropped because no pong arrived in time.",
        st.dropped_pong_timeout.load(Ordering::Relaxed),
    );
    counter(
        "typha_handshake_failures",
        "Connections that failed the hello.",
        st.handshake_failures.load(Ordering::Relaxed),
    );
    counter(
        "typha_tls_failures",
        "Connections refused by TLS (no or wrong client certificate).",
        st.tls_failures.load(Ordering::Relaxed),
    );
    counter(
        "typha_version_mismatches",
        "Clients refused for their protocol version.",
        st.version_mismatches.load(Ordering::Relaxed),
    );
    counter(
        "typha_bad_frames",
        "Malformed, oversized or truncated frames received.",
        st.bad_frames.load(Ordering::Relaxed),
    );
    counter(
        "typha_migrations_requested",
        "Clients asked to move to another Typha.",
        st.migrations_requested.load(Ordering::Relaxed),
    );
    counter(
        "typha_closed_after_grace",
        "Clients closed after not migrating within the grace period.",
        st.closed_after_grace.load(Ordering::Relaxed),
    );
    counter(
        "typha_refused_full",
        "Migrating clients refused because this Typha is at its limit.",
        st.refused_full.load(Ordering::Relaxed),
    );
    counter(
        "typha_snapshots_generated",
        "Snapshots encoded.",
        st.snapshots_encoded.load(Ordering::Relaxed),
    );
    counter(
        "typha_snapshots_reused",
        "Clients that shared an already encoded snapshot.",
        st.snapshots_shared.load(Ordering::Relaxed),
    );
    counter(
        "typha_connections_evicted_pending",
        "Connections without a hello closed to make room for newer ones (ServerMaxPendingHandshakes).",
        st.evicted_pending.load(Ordering::Relaxed),
    );
    counter(
        "typha_snapshot_deadline_drops",
        "Clients closed because their snapshot was not sent within the write timeout.",
        st.dropped_snapshot_deadline.load(Ordering::Relaxed),
    );
    counter(
        "typha_datastore_skipped_entries",
        "Keys or values the datastore could not decode and skipped.",
        margay_datastore::kv::skipped_entries(),
    );
    counter(
        "typha_frames_sent",
        "Frames written to clients.",
        st.frames_sent.load(Ordering::Relaxed),
    );
    let _ = writeln!(
        out,
        "# HELP typha_connections_active Connected clients.\n# TYPE typha_connections_active gauge"
    );
    for (t, n) in server.connections_by_type() {
        let _ = writeln!(out, "typha_connections_active{{syncer=\"{t}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP typha_pending_handshakes Connections that have not finished their hello.\n# TYPE typha_pending_handshakes gauge\ntypha_pending_handshakes {}",
        st.pending_handshakes.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP typha_snapshot_bytes Bytes of encoded snapshots being sent or kept for sharing.\n# TYPE typha_snapshot_bytes gauge\ntypha_snapshot_bytes {}",
        st.snapshot_bytes.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP typha_connection_limit Connections above which clients are asked to migrate.\n# TYPE typha_connection_limit gauge\ntypha_connection_limit {}",
        server.connection_limit()
    );
    let mut types: Vec<_> = pipelines.keys().copied().collect();
    types.sort();
    let _ = writeln!(
        out,
        "# HELP typha_breadcrumb_seq_number Sequence number of the newest breadcrumb.\n# TYPE typha_breadcrumb_seq_number gauge"
    );
    for t in &types {
        let c = pipelines[t].reader.latest();
        let _ = writeln!(
            out,
            "typha_breadcrumb_seq_number{{syncer=\"{t}\"}} {}",
            c.seq
        );
    }
    let _ = writeln!(
        out,
        "# HELP typha_cache_size Keys in the snapshot cache.\n# TYPE typha_cache_size gauge"
    );
    for t in &types {
        let c = pipelines[t].reader.latest();
        let _ = writeln!(
            out,
            "typha_cache_size{{syncer=\"{t}\"}} {}",
            c.snapshot.len()
        );
    }
    let _ = writeln!(
        out,
        "# HELP typha_in_sync Whether the syncer type's upstream is in sync.\n# TYPE typha_in_sync gauge"
    );
    for t in &types {
        let c = pipelines[t].reader.latest();
        let _ = writeln!(
            out,
            "typha_in_sync{{syncer=\"{t}\"}} {}",
            u8::from(c.status == SyncStatus::InSync)
        );
    }
    let _ = writeln!(
        out,
        "# HELP typha_updates_total Updates read from the datastore.\n# TYPE typha_updates_total counter"
    );
    for t in &types {
        let s = &pipelines[t].stats;
        let _ = writeln!(
            out,
            "typha_updates_total{{syncer=\"{t}\"}} {}",
            s.updates.load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP typha_invalid_resources Values the validation filter served as deletions.\n# TYPE typha_invalid_resources counter"
    );
    for t in &types {
        let s = &pipelines[t].stats;
        let _ = writeln!(
            out,
            "typha_invalid_resources{{syncer=\"{t}\"}} {}",
            s.invalid.load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP typha_oversized_values Values larger than a client accepts, served as deletions.\n# TYPE typha_oversized_values counter"
    );
    for t in &types {
        let s = &pipelines[t].stats;
        let _ = writeln!(
            out,
            "typha_oversized_values{{syncer=\"{t}\"}} {}",
            s.oversized.load(Ordering::Relaxed)
        );
    }
    if let Some(rss) = crate::bench::rss_bytes(std::process::id()) {
        let _ = writeln!(
            out,
            "# HELP process_resident_memory_bytes Resident memory.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {rss}"
        );
    }
    out
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
}
