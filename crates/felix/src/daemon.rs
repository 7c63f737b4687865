//! The Felix daemon: start-up sequence, the processing pipeline and shutdown.
//!
//! ```text
//! tokio: syncer ──(SyncerEvent)──► [validation thread] ──► [calc thread] ──► [dataplane thread]
//!        health / metrics HTTP      validation filter,      CalcGraph,         the driver
//!        status socket, signals     config watch            10 ms flush tick
//! ```
//!
//! Shutdown reasons arrive on one channel: SIGTERM/SIGINT end Felix at once with exit code 0
//! and leave the dataplane as it is; a configuration or encapsulation change that cannot be
//! applied live (and SIGHUP) ends it with 129 after a 2 s pause, so a supervisor restarts it
//! without spinning; fatal errors end it with 1 after the same pause.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc as smpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use margay_api::{Kind, Resource, ResourceKey};
use margay_calc::{CalcConfig, CalcCounts, CalcGraph, IpSetStatus, Message, Problem};
use margay_dataplane::{DataplaneDriver, DataplaneError, Recording, RecordingDriver, StatusUpdate};
use margay_datastore::{Client, SyncStatus, SyncerEvent, SyncerOptions, WatcherSyncer};
use margay_felix_config::{Config, Loaded, PARAMS, WarnOnce, load};
use tokio::sync::{mpsc, oneshot, watch};

use crate::bootstrap::Bootstrap;
use crate::health::{
    CALC_GRAPH_HEALTH_INTERVAL, CALC_GRAPH_TIMEOUT, CALCULATION_GRAPH, FELIX_STARTUP,
    HealthAggregator, INTERNAL_DATAPLANE, SystemClock,
};
use crate::http::{self, Handler, Response};
use crate::inputs::{DatastoreInputs, LocalInputs, datastore_config, read_datastore_inputs};
use crate::metrics::Metrics;
use crate::status::{
    BootstrapView, ConnLimits, DataplaneView, EndpointView, IpSetView, ProblemView, REQUESTS,
    StatusDoc, StatusSocket, TierView,
};
use crate::typha_feed::{FeedItem, TYPHA_CONNECTION, TyphaFeed, TyphaTarget};
use crate::{LogLevelSetter, calico_level};
use margay_typha::ConnectionState;

/// Calico's calculation-graph flush tick.
const FLUSH_INTERVAL: Duration = Duration::from_millis(10);
/// How long to wait before retrying a failed start-up step (Calico: 1 s).
const RETRY: Duration = Duration::from_secs(1);
/// The kinds Felix syncs (Calico's felixsyncer, less what margay does not model); Typha's
/// `felix` syncer type carries the same list.
pub const FELIX_KINDS: &[Kind] = margay_typha::syncers::FELIX_KINDS;

/// How to run Felix.
#[derive(Clone)]
pub struct DaemonOptions {
    /// The environment (`FELIX_*`, the datastore variables, `HOSTNAME`).
    pub env: BTreeMap<String, String>,
    /// felix.cfg (a missing file is fine).
    pub config_file: PathBuf,
    /// Where to serve the status API; None: nowhere.
    pub status_socket: Option<PathBuf>,
    /// The kernel's hostname (FelixHostname's default).
    pub kernel_hostname: Option<String>,
    /// Applies LogSeverityScreen once configuration is loaded (None: leave levels alone,
    /// e.g. because `--log-level` was given).
    pub log_level: Option<LogLevelSetter>,
    /// Applies LogSeveritySys once configuration is loaded (None: no syslog destination, e.g.
    /// Felix running inside another process).
    pub syslog_level: Option<LogLevelSetter>,
    /// The pause before exiting for a restart (Calico: 2 s).
    pub restart_delay: Duration,
    /// Listen for SIGTERM, SIGINT and SIGHUP.
    pub handle_signals: bool,
}

impl DaemonOptions {
    /// Options from this process: its environment and kernel hostname.
    pub fn from_process(config_file: PathBuf, status_socket: Option<PathBuf>) -> Self {
        let (env, skipped) = margay_felix_config::utf8_env(std::env::vars_os());
        if let Some(w) = margay_felix_config::skipped_warning(&skipped) {
            tracing::warn!("{w}");
        }
        DaemonOptions {
            env,
            config_file,
            status_socket,
            kernel_hostname: crate::inputs::kernel_hostname(),
            log_level: None,
            syslog_level: None,
            restart_delay: Duration::from_secs(2),
            handle_signals: true,
        }
    }
}

/// How Felix ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// Asked to stop (SIGTERM, SIGINT): exit code 0, dataplane left in place.
    Stopped,
    /// Needs a restart (configuration change, SIGHUP): exit code 129.
    Restart(String),
    /// Could not go on: exit code 1.
    Failed(String),
}

impl Exit {
    pub fn code(&self) -> u8 {
        match self {
            Exit::Stopped => 0,
            Exit::Restart(_) => 129,
            Exit::Failed(_) => 1,
        }
    }
}

/// Why Felix is stopping.
#[derive(Debug, Clone)]
enum Reason {
    Signal(&'static str),
    Stop,
    SigHup,
    ConfigChanged(String),
    EncapChanged(String),
    DatastoreNotReady,
    Fatal(String),
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Signal(s) => write!(f, "received {s}"),
            Reason::Stop => f.write_str("asked to stop"),
            Reason::SigHup => f.write_str("received SIGHUP (reload configuration)"),
            Reason::ConfigChanged(c) => write!(f, "config changed: {c}"),
            Reason::EncapChanged(c) => write!(f, "encapsulation changed: {c}"),
            Reason::DatastoreNotReady => f.write_str("datastore became unready"),
            Reason::Fatal(e) => write!(f, "fatal error: {e}"),
        }
    }
}

/// A handle on a running daemon (for embedding Felix, e.g. in benchmarks).
#[derive(Clone)]
pub struct Control {
    health: HealthAggregator,
    bootstrap: Arc<Mutex<Bootstrap>>,
    metrics: Arc<Mutex<Option<Arc<Metrics>>>>,
    reasons: mpsc::UnboundedSender<Reason>,
}

impl Control {
    /// Stops Felix as SIGTERM does.
    pub fn stop(&self) {
        let _ = self.reasons.send(Reason::Stop);
    }

    pub fn health(&self) -> &HealthAggregator {
        &self.health
    }

    /// The start-up phases completed so far.
    pub fn bootstrap(&self) -> Bootstrap {
        lock(&self.bootstrap).clone()
    }

    /// Felix's metrics, once configuration is loaded.
    pub fn metrics(&self) -> Option<Arc<Metrics>> {
        lock(&self.metrics).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Felix. `Daemon::new(options).run()`.
pub struct Daemon {
    opts: DaemonOptions,
    control: Control,
    reasons_rx: mpsc::UnboundedReceiver<Reason>,
}

/// What the calculation thread is asked.
enum CalcInput {
    Updates(Vec<(ResourceKey, Option<Resource>)>),
    Status(SyncStatus),
    /// IPAM blocks (for routes), from their own watch.
    Block(crate::blocks::BlockEvent),
    Query(oneshot::Sender<GraphSnapshot>),
}

struct GraphSnapshot {
    counts: CalcCounts,
    ip_sets: Vec<IpSetStatus>,
    problems: Vec<Problem>,
    in_sync: bool,
    sync: SyncStatus,
}

/// The encapsulation Felix started with, and the overrides that decide it with the pools.
use crate::dataplane_config::Encap;

#[derive(Debug, Clone, Copy)]
struct EncapPolicy {
    ipip_override: Option<bool>,
    vxlan_override: Option<bool>,
    startup: Encap,
}

impl EncapPolicy {
    fn effective(&self, from_pools: Encap) -> Encap {
        Encap {
            ipip: self.ipip_override.unwrap_or(from_pools.ipip),
            vxlan: self.vxlan_override.unwrap_or(from_pools.vxlan),
            vxlan_v6: from_pools.vxlan_v6,
        }
    }
}

/// A driver, the model it keeps, and (Linux) its nftables counters.
type DriverParts = (
    Box<dyn DataplaneDriver>,
    Recording,
    Option<margay_dataplane::nft_driver::NftStatsHandle>,
);

/// The dataplane driver: the Linux one (nftables) unless `MARGAY_DATAPLANE=recording` asks for
/// the recording driver (computes and records, programs nothing: tests and dry runs).
fn make_driver(
    env: &BTreeMap<String, String>,
    config: &margay_felix_config::Config,
    hostname: &str,
    encap: Encap,
) -> Result<DriverParts, StartError> {
    use margay_dataplane::linux_driver::{LinuxDriver, LinuxDriverConfig};
    use margay_dataplane::nft::NftRunner;
    use margay_dataplane::nft_driver::NftDriverConfig;
    let mode = env
        .get("MARGAY_DATAPLANE")
        .map(|s| s.trim().to_ascii_lowercase())
        .unwrap_or_else(|| "linux".into());
    match mode.as_str() {
        "recording" => {
            let (driver, recording) = RecordingDriver::new(false);
            tracing::info!(
                driver = driver.name(),
                "Starting the recording dataplane driver (MARGAY_DATAPLANE=recording): it keeps \
                 what the calculation graph asks for (see margay felix status) and programs \
                 nothing in the kernel"
            );
            Ok((Box::new(driver), recording, None))
        }
        "linux" => {
            if !config.nftables_mode.eq_ignore_ascii_case("enabled")
                && !config.nftables_mode.eq_ignore_ascii_case("auto")
            {
                tracing::warn!(
                    mode = %config.nftables_mode,
                    "NFTablesMode is not Enabled/Auto, but margay programs policy with nftables only"
                );
            }
            let nft =
                crate::dataplane_config::nft_config(config, encap).map_err(StartError::Fatal)?;
            let mut routing = crate::dataplane_config::routing_config(config, hostname);
            let links = margay_dataplane::linux::netlink::Netlink::open()
                .and_then(|mut nl| nl.links())
                .map_err(|e| {
                    StartError::Fatal(format!(
                        "cannot list the host's interfaces: {e} (Felix needs CAP_NET_ADMIN in \
                         the node's network namespace)"
                    ))
                })?;
            let mtus = detect_mtus(env, config, encap, &links)?;
            let flowtable = crate::dataplane_config::flowtable_devices(config, &links)
                .map_err(StartError::Fatal)?;
            if let Some(r) = &mut routing {
                r.vxlan.mtu = mtus.vxlan;
                r.vxlan_v6.mtu = mtus.vxlan_v6;
            }
            if config.route_sync_disabled {
                tracing::info!(
                    "RouteSyncDisabled: Felix programs no routes and no VXLAN device (policy only)"
                );
            }
            // Calico reads the host's default reverse-path filter once, for the workload
            // interfaces (strict when it cannot be read).
            let sys = margay_dataplane::linux::sysctl::ProcSys::default();
            let default_rp_filter = sys.read("net/ipv4/conf/default/rp_filter").unwrap_or_else(
                |e| {
                    tracing::warn!(
                        "could not determine the default rp_filter setting ({e}); using strict (1)"
                    );
                    margay_dataplane::linux::sysctl::DEFAULT_RP_FILTER.to_string()
                },
            );
            let (driver, recording, stats) = LinuxDriver::new(LinuxDriverConfig {
                nft: NftDriverConfig {
                    nft,
                    runner: NftRunner::default(),
                    refresh_interval: config.policy_refresh_interval(),
                    flowtable_extra_devices: flowtable,
                },
                routing,
                route_refresh_interval: config.route_refresh_interval,
                status_prefix: (!config.endpoint_status_path_prefix.is_empty())
                    .then(|| std::path::PathBuf::from(&config.endpoint_status_path_prefix)),
                global_sysctls: margay_dataplane::linux::sysctl::global_sysctls(
                    config.ip_forwarding.eq_ignore_ascii_case("Enabled"),
                    config.ipv6_support,
                ),
                interfaces: Some(margay_dataplane::linux::interfaces::InterfaceConfig {
                    ipv6: config.ipv6_support,
                    default_rp_filter,
                    refresh_interval: config.interface_refresh_interval,
                }),
            });
            tracing::info!(
                driver = driver.name(),
                "Starting the Linux dataplane driver: nftables table inet margay (nothing is \
                 written before the datastore is in sync)"
            );
            Ok((Box::new(driver), recording, Some(stats)))
        }
        other => Err(StartError::Fatal(format!(
            "MARGAY_DATAPLANE={other:?} is not a dataplane driver: use linux (the default) or recording"
        ))),
    }
}

/// Overrides where Felix writes the pod MTU (Calico's fixed `/var/lib/calico/mtu`): for tests
/// and for several nodes on one machine (the lab).
pub const ENV_MTU_FILE: &str = "MARGAY_MTU_FILE";

/// Calico's MTU auto-detection at start: the host MTU from the interfaces MTUIfacePattern
/// matches, the VXLAN MTUs, and the pod MTU written for the CNI plugin (a write failure stops
/// Felix with RequireMTUFile, else it is logged).
fn detect_mtus(
    env: &BTreeMap<String, String>,
    config: &Config,
    encap: Encap,
    links: &[margay_dataplane::linux::netlink::Link],
) -> Result<crate::dataplane_config::Mtus, StartError> {
    let (mtus, used) =
        crate::dataplane_config::mtus(config, encap, links).map_err(StartError::Fatal)?;
    if used.is_empty() {
        tracing::warn!(
            pattern = config.mtu_iface_pattern.as_deref().unwrap_or(""),
            host_mtu = mtus.host,
            "No up interface matches MTUIfacePattern; assuming the host MTU is 1460. To detect \
             it, set mtuIfacePattern to match your host's interfaces"
        );
    }
    tracing::info!(host_mtu = mtus.host, pod_mtu = mtus.pod, vxlan_mtu = mtus.vxlan, interfaces = ?used, "Determined MTUs");
    let file = env
        .get(ENV_MTU_FILE)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(margay_dataplane::linux::mtu::MTU_FILE));
    let written = file
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&file, mtus.pod.to_string()));
    match written {
        Ok(()) => tracing::debug!(file = %file.display(), mtu = mtus.pod, "wrote the pod MTU"),
        Err(e) if config.require_mtu_file => {
            return Err(StartError::Fatal(format!(
                "cannot write the MTU file {}: {e}, and RequireMTUFile is set (fix the \
                 directory's permissions or unset RequireMTUFile)",
                file.display()
            )));
        }
        Err(e) => tracing::error!(
            file = %file.display(),
            "cannot write the MTU file: {e}; pods may not get the right MTU"
        ),
    }
    Ok(mtus)
}

/// The encapsulation the pools call for, decided exactly as the calculation graph decides it
/// (by asking a scratch graph), so that start-up and run time never disagree.
fn pool_encap(pools: &[Resource]) -> Encap {
    let mut g = CalcGraph::new(CalcConfig::default());
    for p in pools.iter().filter(|p| p.validate().is_ok()) {
        g.on_update(&p.key(), Some(p.clone()));
    }
    g.on_in_sync();
    g.flush()
        .into_iter()
        .find_map(|m| match m {
            Message::Encapsulation {
                ipip,
                vxlan,
                vxlan_v6,
            } => Some(Encap {
                ipip,
                vxlan,
                vxlan_v6,
            }),
            _ => None,
        })
        .unwrap_or(Encap {
            ipip: false,
            vxlan: false,
            vxlan_v6: false,
        })
}

/// State shared by the threads and servers.
struct Shared {
    start: Instant,
    hostname: String,
    health: HealthAggregator,
    metrics: Arc<Metrics>,
    bootstrap: Arc<Mutex<Bootstrap>>,
    /// Resources the validation filter turned into deletions, and why.
    invalid: Mutex<BTreeMap<String, String>>,
    config_json: Mutex<serde_json::Value>,
    recording: Recording,
    /// The nftables driver's counters and per-endpoint chains (Linux dataplane only).
    nft_stats: Option<margay_dataplane::nft_driver::NftStatsHandle>,
    driver_name: &'static str,
    datastore: String,
    dp_in_sync: AtomicBool,
    messages_applied: AtomicU64,
    calc_tx: Mutex<Option<smpsc::Sender<CalcInput>>>,
    reasons: mpsc::UnboundedSender<Reason>,
}

impl Shared {
    fn mark(&self, phase: &str) {
        if let Some(t) = lock(&self.bootstrap).mark(phase, Instant::now()) {
            self.metrics.set_bootstrap_phase(&t.phase, t.seconds);
            tracing::debug!(phase, seconds = t.seconds, "start-up phase complete");
        }
    }

    fn stop_with(&self, r: Reason) {
        let _ = self.reasons.send(r);
    }
}

/// Starts the health server, moves it, or stops it, as configuration says (Calico's
/// `ServeHTTP(enabled, host, port)`).
#[derive(Default)]
struct HealthServer {
    running: Option<(String, u16, watch::Sender<bool>)>,
}

impl HealthServer {
    fn ensure(&mut self, enabled: bool, host: &str, port: u16, health: &HealthAggregator) {
        if let Some((h, p, _)) = &self.running {
            if enabled && h == host && *p == port {
                return;
            }
            tracing::info!("Health server settings changed; stopping the old server");
            if let Some((_, _, stop)) = self.running.take() {
                let _ = stop.send(true);
            }
        }
        if !enabled {
            return;
        }
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let agg = health.clone();
        let handler: Handler = Arc::new(move |path: &str| match path {
            "/liveness" | "/readiness" => {
                let (status, body) = agg.summary().response(path == "/readiness");
                Response::text(status, body)
            }
            _ => Response::text(404, "404 page not found\n"),
        });
        let host_s = host.to_string();
        tokio::spawn(async move {
            loop {
                match http::bind(&host_s, port).await {
                    Ok(l) => {
                        tracing::info!(host = %host_s, port, "Health enabled. Starting server.");
                        http::serve(l, handler, stop_rx).await;
                        return;
                    }
                    Err(e) => {
                        tracing::error!(host = %host_s, port, error = %e, "Health endpoint failed, trying to restart it...");
                        tokio::select! {
                            _ = tokio::time::sleep(RETRY) => {}
                            _ = stop_rx.changed() => return,
                        }
                    }
                }
            }
        });
        self.running = Some((host.to_string(), port, stop_tx));
    }
}

/// What start-up hands to the running phase.
struct Started {
    shared: Arc<Shared>,
    _health_server: HealthServer,
    servers: Vec<tokio::task::JoinHandle<()>>,
    syncer: tokio::task::JoinHandle<()>,
    blocks: tokio::task::JoinHandle<()>,
    stop_servers: watch::Sender<bool>,
}

enum StartError {
    Reason(Reason),
    Fatal(String),
}

impl Daemon {
    pub fn new(opts: DaemonOptions) -> Daemon {
        let (reasons, reasons_rx) = mpsc::unbounded_channel();
        let health = HealthAggregator::new(Arc::new(SystemClock));
        let control = Control {
            health,
            bootstrap: Arc::new(Mutex::new(Bootstrap::new(Instant::now()))),
            metrics: Arc::new(Mutex::new(None)),
            reasons,
        };
        Daemon {
            opts,
            control,
            reasons_rx,
        }
    }

    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// Runs Felix on its own runtime until it stops; returns how it ended.
    pub fn run(self) -> Exit {
        let rt = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("felix-io")
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => return Exit::Failed(format!("cannot start the async runtime: {e}")),
        };
        let exit = rt.block_on(self.run_async());
        rt.shutdown_timeout(Duration::from_millis(500));
        exit
    }

    pub async fn run_async(mut self) -> Exit {
        let control = self.control.clone();
        let health = control.health.clone();
        health.register(FELIX_STARTUP, true, true, Duration::ZERO);
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            pid = std::process::id(),
            "Felix starting up"
        );
        if self.opts.handle_signals {
            spawn_signal_listener(control.reasons.clone());
        }
        let opts = self.opts.clone();
        let started = tokio::select! {
            r = startup(&opts, &control) => r,
            r = self.reasons_rx.recv() => Err(StartError::Reason(r.unwrap_or(Reason::Stop))),
        };
        let mut started = match started {
            Ok(s) => s,
            Err(StartError::Fatal(msg)) => {
                tracing::error!("{msg}");
                return Exit::Failed(msg);
            }
            Err(StartError::Reason(r)) => {
                tracing::warn!(reason = %r, "Felix is shutting down");
                return finish(r, &mut self.reasons_rx, self.opts.restart_delay).await;
            }
        };
        let reason = self.reasons_rx.recv().await.unwrap_or(Reason::Stop);
        tracing::warn!(reason = %reason, "Felix is shutting down");
        // Stop the syncer and the servers (the status socket is removed as its server ends);
        // the pipeline threads run down as their channels close.
        started.syncer.abort();
        started.blocks.abort();
        let _ = started.stop_servers.send(true);
        lock(&started.shared.calc_tx).take();
        for s in started.servers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(1), s).await;
        }
        finish(reason, &mut self.reasons_rx, self.opts.restart_delay).await
    }
}

/// Logs the reason and turns it into an exit, pausing before a restart as Calico does.
async fn finish(
    reason: Reason,
    reasons: &mut mpsc::UnboundedReceiver<Reason>,
    delay: Duration,
) -> Exit {
    let exit = match &reason {
        Reason::Signal(_) | Reason::Stop => {
            tracing::info!("Exiting; the dataplane is left as it is");
            return Exit::Stopped;
        }
        Reason::SigHup | Reason::ConfigChanged(_) | Reason::EncapChanged(_) => {
            Exit::Restart(reason.to_string())
        }
        Reason::DatastoreNotReady | Reason::Fatal(_) => Exit::Failed(reason.to_string()),
    };
    tracing::info!("Sleeping {delay:?} to avoid a tight restart loop");
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut sleep => break,
            r = reasons.recv() => match r {
                Some(Reason::Signal(s)) => {
                    tracing::warn!(signal = s, "Signal received while shutting down, exiting immediately");
                    break;
                }
                Some(other) => tracing::info!(reason = %other, "Shutdown request received while already shutting down, ignoring"),
                None => {
                    (&mut sleep).await;
                    break;
                }
            }
        }
    }
    match &exit {
        Exit::Restart(_) => tracing::info!(rc = 129, "Exiting for config change"),
        _ => tracing::error!(rc = 1, "Exiting"),
    }
    exit
}

fn spawn_signal_listener(tx: mpsc::UnboundedSender<Reason>) {
    use tokio::signal::unix::{SignalKind, signal};
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) else {
            tracing::error!("cannot install signal handlers; SIGTERM will not stop Felix cleanly");
            return;
        };
        loop {
            let r = tokio::select! {
                _ = term.recv() => Reason::Signal("SIGTERM"),
                _ = int.recv() => Reason::Signal("SIGINT"),
                _ = hup.recv() => Reason::SigHup,
            };
            if tx.send(r).is_err() {
                return;
            }
        }
    });
}

fn log_warnings(once: &mut WarnOnce, loaded: &Loaded) {
    for w in once.fresh(&loaded.warnings) {
        tracing::warn!("{w}");
    }
}

/// Everything up to the running pipeline (Calico's `daemon.Run` up to
/// `monitorAndManageShutdown`).
async fn startup(opts: &DaemonOptions, control: &Control) -> Result<Started, StartError> {
    let health = &control.health;
    let mark = |phase: &str| {
        lock(&control.bootstrap).mark(phase, Instant::now());
    };
    let mut warn_once = WarnOnce::new();
    let mut health_server = HealthServer::default();
    let mut waiting_since: Option<(Instant, Instant)> = None;
    let mut said_no_file = false;

    tracing::info!("Loading configuration...");
    let (local, ds_desc, source, ds_inputs, loaded) = 'config: loop {
        health.report(FELIX_STARTUP, true, false);
        let local = match LocalInputs::read(
            opts.env.clone(),
            &opts.config_file,
            opts.kernel_hostname.clone(),
        ) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("{e}; retrying");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        if local.config_text.is_none() && !said_no_file {
            said_no_file = true;
            tracing::info!(path = %opts.config_file.display(), "No config file; using the environment and the datastore");
        }
        let local_loaded = match load(&local.config_inputs()) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "Failed to load configuration from the environment and config file; retrying in 1s");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        let c = &local_loaded.config;
        health_server.ensure(c.health_enabled, &c.health_host, c.health_port, health);
        if let Some(target) = crate::typha_feed::typha_target(c) {
            // Through Typha: everything, configuration included, comes from Typha's felix
            // syncer; Felix never connects to the datastore.
            let (addrs, discovered) = match target {
                TyphaTarget::Addrs(addrs) => (addrs, None),
                TyphaTarget::Kubernetes(service) => {
                    let d = crate::typha_feed::discovery(&opts.env, c, service)
                        .map_err(|e| StartError::Fatal(e.to_string()))?;
                    // Looked up on every retry of the loop, so a Typha that moved is found.
                    let mut rng = margay_typha::discovery::Rng::from_entropy();
                    match d.discover(&mut rng).await {
                        Ok(found) => {
                            tracing::info!(service = %found.service, typhas = %found.describe(), "Found Typha through Kubernetes (TyphaK8sServiceName)");
                            (found.addrs(), Some((d, found)))
                        }
                        Err(e) => {
                            tracing::error!("{e}; retrying in 1s");
                            tokio::time::sleep(RETRY).await;
                            continue;
                        }
                    }
                }
            };
            let topts = crate::typha_feed::client_options(c, addrs)
                .map_err(|e| StartError::Fatal(e.to_string()))?;
            mark("config_load");
            let desc = match &discovered {
                None => {
                    let addrs = topts.addrs.join(",");
                    tracing::info!(typha = %addrs, "Syncing through Typha (TyphaAddr): Felix does not connect to the datastore");
                    format!("typha {addrs}")
                }
                Some((_, found)) => {
                    tracing::info!(service = %found.service, "Syncing through Typha (TyphaK8sServiceName): Felix does not connect to the datastore");
                    format!(
                        "typha {} (Kubernetes service {})",
                        found.describe(),
                        found.service
                    )
                }
            };
            health.register(TYPHA_CONNECTION, false, true, Duration::ZERO);
            health.report(TYPHA_CONNECTION, true, false);
            let mut feed = match discovered {
                None => TyphaFeed::start(topts),
                Some((d, found)) => TyphaFeed::start_discovered(topts, d, found),
            };
            let hostname = c.felix_hostname.clone();
            let started = typha_startup(&mut feed, &local, health, &hostname).await?;
            mark("datastore_connect");
            let TyphaStart {
                buffered,
                inputs,
                loaded,
                pools,
            } = started;
            break 'config (
                local,
                desc,
                Source::Typha {
                    feed,
                    buffered,
                    pools,
                },
                inputs,
                loaded,
            );
        }
        mark("config_load");

        let ds_cfg = datastore_config(&opts.env, &local_loaded)
            .map_err(|e| StartError::Fatal(e.to_string()))?;
        tracing::info!(datastore = %ds_cfg.describe(), "Connecting to datastore");
        let backend = match tokio::time::timeout(Duration::from_secs(10), ds_cfg.connect()).await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                tracing::error!(datastore = %ds_cfg.describe(), error = %e, "Failed to create datastore client; retrying in 1s");
                tokio::time::sleep(RETRY).await;
                continue;
            }
            Err(_) => {
                tracing::error!(datastore = %ds_cfg.describe(), "Connecting to the datastore timed out after 10s; retrying");
                continue;
            }
        };
        tracing::info!("Created datastore client");
        mark("datastore_connect");
        let client = Client::new(backend.clone());
        let hostname = local_loaded.config.felix_hostname.clone();
        loop {
            let ds = match read_datastore_inputs(&client, &hostname).await {
                Ok(ds) => ds,
                Err(e) => {
                    tracing::error!(error = %e, "Failed to get config from datastore; retrying in 1s");
                    tokio::time::sleep(RETRY).await;
                    continue 'config;
                }
            };
            let loaded = match load(&ds.config_inputs(&local, &hostname)) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(error = %e, "Failed to parse/validate configuration from datastore; retrying in 1s");
                    tokio::time::sleep(RETRY).await;
                    continue 'config;
                }
            };
            if loaded.datastore_ready != Some(true) {
                // Calico reports ready while it waits: a datastore being migrated must not
                // make every node unready.
                health.report(FELIX_STARTUP, true, true);
                let now = Instant::now();
                match waiting_since {
                    None => {
                        waiting_since = Some((now, now));
                        tracing::warn!(
                            "Waiting for datastore to be initialized: ClusterInformation \"default\" \
                             does not have datastoreReady: true (margay node startup sets it)"
                        );
                    }
                    Some((first, last)) if now.duration_since(last) >= Duration::from_secs(30) => {
                        waiting_since = Some((first, now));
                        tracing::warn!(waited = ?now.duration_since(first), "Still waiting for the datastore to be initialized (ClusterInformation \"default\" datastoreReady)");
                    }
                    Some(_) => {}
                }
                tokio::time::sleep(RETRY).await;
                continue;
            }
            break 'config (
                local,
                ds_cfg.describe(),
                Source::Datastore(backend),
                ds,
                loaded,
            );
        }
    };
    mark("datastore_config");
    let config = loaded.config.clone();
    let hostname = config.felix_hostname.clone();

    // The encapsulation the pools call for, unless configuration forces it.
    let pools = match &source {
        Source::Datastore(backend) => {
            let client = Client::new(backend.clone());
            loop {
                match client.list(Kind::IPPool, None, "").await {
                    Ok(l) => break l.items,
                    Err(e) => {
                        tracing::error!(error = %e, "Failed to list IP pools; retrying in 1s");
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
        }
        Source::Typha { pools, .. } => pools.clone(),
    };
    let encap = EncapPolicy {
        ipip_override: config.ip_in_ip_enabled,
        vxlan_override: config.vxlan_enabled,
        startup: Encap {
            ipip: false,
            vxlan: false,
            vxlan_v6: false,
        },
    };
    let encap = EncapPolicy {
        startup: encap.effective(pool_encap(&pools)),
        ..encap
    };
    tracing::info!(
        ipip = encap.startup.ipip,
        vxlan = encap.startup.vxlan,
        vxlan_v6 = encap.startup.vxlan_v6,
        "Encapsulation (from the IP pools unless IpInIpEnabled/VXLANEnabled are set)"
    );

    // Logging as configured (unless --log-level decided it).
    if let Some(set) = &opts.log_level {
        match calico_level(&config.log_severity_screen) {
            Some(level) => {
                if let Err(e) = set(level) {
                    tracing::warn!(error = %e, "cannot apply LogSeverityScreen");
                }
            }
            None => {
                tracing::warn!(value = %config.log_severity_screen, "LogSeverityScreen is not a level; keeping the current one")
            }
        }
    }
    if let Some(set) = &opts.syslog_level {
        match calico_level(&config.log_severity_sys) {
            Some(level) => {
                if let Err(e) = set(level) {
                    // Not fatal, as in Calico: syslog is often absent in containers.
                    tracing::error!(
                        error = %e,
                        "Failed to connect to syslog. To prevent this error, either set config \
                         parameter LogSeveritySys=none or configure a local syslog service."
                    );
                }
            }
            None => {
                tracing::warn!(value = %config.log_severity_sys, "LogSeveritySys is not a level; not logging to syslog")
            }
        }
    }
    let set_count = loaded
        .sources()
        .filter(|(_, e)| e.source != margay_felix_config::Source::Default)
        .count();
    tracing::info!(
        hostname = %hostname,
        datastore = %ds_desc,
        parameters_set = set_count,
        selector_config = loaded.selector_config.as_deref().unwrap_or("-"),
        "Successfully loaded configuration (margay felix config shows every value and its source)"
    );
    log_warnings(&mut warn_once, &loaded);
    health.set_overrides(config.health_timeout_overrides.clone());
    health_server.ensure(
        config.health_enabled,
        &config.health_host,
        config.health_port,
        health,
    );

    let metrics = Arc::new(Metrics::new(&hostname, config.ipv6_support));
    *lock(&control.metrics) = Some(metrics.clone());
    for p in lock(&control.bootstrap).phases() {
        metrics.set_bootstrap_phase(&p.phase, p.seconds);
    }

    // The dataplane driver.
    let (driver, recording, nft_stats) = make_driver(&opts.env, &config, &hostname, encap.startup)?;
    let driver_name = driver.name();
    health.register(
        INTERNAL_DATAPLANE,
        true,
        true,
        config.dataplane_watchdog_timeout,
    );
    let (reasons_tx, _) = (control.reasons.clone(), ());
    let shared = Arc::new(Shared {
        start: lock(&control.bootstrap).start(),
        hostname: hostname.clone(),
        health: health.clone(),
        metrics: metrics.clone(),
        bootstrap: control.bootstrap.clone(),
        invalid: Mutex::new(BTreeMap::new()),
        config_json: Mutex::new(loaded.to_json()),
        recording,
        nft_stats,
        driver_name,
        datastore: ds_desc,
        dp_in_sync: AtomicBool::new(false),
        messages_applied: AtomicU64::new(0),
        calc_tx: Mutex::new(None),
        reasons: reasons_tx,
    });
    let (dp_tx, dp_rx) = smpsc::channel::<Vec<Message>>();
    // The driver's first message is its configuration (Calico's ConfigUpdate).
    let raw: BTreeMap<String, String> = PARAMS
        .iter()
        .map(|p| (p.name.to_string(), config.get(p.id).to_string()))
        .collect();
    let _ = dp_tx.send(vec![Message::ConfigUpdate { config: raw }]);
    {
        let shared = shared.clone();
        let driver: Box<dyn DataplaneDriver> = driver;
        std::thread::Builder::new()
            .name("felix-dataplane".into())
            .spawn(move || dataplane_loop(dp_rx, driver, shared))
            .map_err(|e| StartError::Fatal(format!("cannot start the dataplane thread: {e}")))?;
    }
    shared.mark("dataplane_start");
    health.report(FELIX_STARTUP, true, true);

    // The calculation graph.
    health.register(CALCULATION_GRAPH, true, true, CALC_GRAPH_TIMEOUT);
    let (calc_tx, calc_rx) = smpsc::channel::<CalcInput>();
    *lock(&shared.calc_tx) = Some(calc_tx.clone());
    {
        let shared = shared.clone();
        let graph = CalcGraph::new(CalcConfig {
            hostname: hostname.clone(),
            route_source: if config.route_source.eq_ignore_ascii_case("WorkloadIPs") {
                margay_calc::RouteSource::WorkloadIps
            } else {
                margay_calc::RouteSource::CalicoIpam
            },
        });
        std::thread::Builder::new()
            .name("felix-calc".into())
            .spawn(move || calc_loop(calc_rx, graph, dp_tx, shared, encap))
            .map_err(|e| StartError::Fatal(format!("cannot start the calculation thread: {e}")))?;
    }

    // The syncer (or Typha) and the validation filter.
    let (sync_tx, sync_rx) = mpsc::channel::<SyncerEvent>(16);
    let (syncer_task, blocks_task) = match source {
        Source::Datastore(backend) => {
            let syncer =
                WatcherSyncer::new(backend.clone(), SyncerOptions::new(FELIX_KINDS.to_vec()));
            tracing::info!("Starting the datastore Syncer");
            let syncer_task = tokio::spawn(syncer.run(sync_tx));
            // IPAM blocks, for routes to remote blocks.
            let blocks_task = {
                let calc_tx = calc_tx.clone();
                tokio::spawn(async move {
                    let (block_tx, mut block_rx) = mpsc::channel(64);
                    let watcher = tokio::spawn(crate::blocks::run(backend, block_tx));
                    while let Some(ev) = block_rx.recv().await {
                        if calc_tx.send(CalcInput::Block(ev)).is_err() {
                            break;
                        }
                    }
                    watcher.abort();
                })
            };
            (syncer_task, blocks_task)
        }
        Source::Typha { feed, buffered, .. } => {
            tracing::info!("Feeding the pipeline from Typha");
            let task = tokio::spawn(run_typha_feed(
                feed,
                buffered,
                sync_tx,
                calc_tx.clone(),
                shared.clone(),
            ));
            (task, tokio::spawn(async {}))
        }
    };
    {
        let shared = shared.clone();
        let watch = ConfigWatch {
            local,
            inputs: ds_inputs,
            hostname: hostname.clone(),
            startup: config.clone(),
            current: config.clone(),
            in_sync: false,
            stopping: false,
            warn_once,
        };
        std::thread::Builder::new()
            .name("felix-validation".into())
            .spawn(move || validation_loop(sync_rx, calc_tx, shared, watch))
            .map_err(|e| StartError::Fatal(format!("cannot start the validation thread: {e}")))?;
    }
    tracing::info!("Started the processing graph");

    // Metrics, the status socket, and the start-up summary once ready.
    let (stop_servers, stop_rx) = watch::channel(false);
    let mut servers = Vec::new();
    metrics
        .process_metrics
        .store(config.prometheus_process_metrics_enabled, Ordering::Relaxed);
    if config.prometheus_metrics_enabled {
        let host = config.prometheus_metrics_host.clone();
        let port = config.prometheus_metrics_port;
        let tls = crate::metrics_tls::MetricsTls::from_config(&config)
            .map_err(|e| StartError::Fatal(format!("Prometheus metrics: {e}")))?;
        if let Some(t) = &tls {
            // Catch unusable files at start; they are read again per connection.
            t.server_config()
                .map_err(|e| StartError::Fatal(format!("Prometheus metrics over TLS: {e}")))?;
        }
        match http::bind(&host, port).await {
            Ok(l) => {
                tracing::info!(host = %host, port, tls = tls.is_some(), "Prometheus metrics enabled. Starting metrics http server.");
                let m = metrics.clone();
                let handler: Handler = Arc::new(move |path: &str| match path {
                    "/metrics" | "/" => Response {
                        status: 200,
                        content_type: "text/plain; version=0.0.4; charset=utf-8",
                        body: m.render().into_bytes(),
                    },
                    _ => Response::text(404, "404 page not found\n"),
                });
                servers.push(match tls {
                    Some(t) => tokio::spawn(http::serve_tls(l, handler, t, stop_rx.clone())),
                    None => tokio::spawn(http::serve(l, handler, stop_rx.clone())),
                });
            }
            Err(e) => {
                return Err(StartError::Fatal(format!(
                    "cannot serve Prometheus metrics on {host:?} port {port}: {e} (free the port or \
                     set PrometheusMetricsPort / PrometheusMetricsHost)"
                )));
            }
        }
    }
    if let Some(path) = &opts.status_socket {
        let sock = StatusSocket::bind(path).map_err(|e| StartError::Fatal(e.to_string()))?;
        tracing::info!(path = %path.display(), "Serving the status API (margay felix status)");
        servers.push(tokio::spawn(serve_status(
            sock,
            shared.clone(),
            stop_rx.clone(),
        )));
    }
    {
        let shared = shared.clone();
        let mut ready = health.watch_ready();
        let mut stop = stop_rx;
        servers.push(tokio::spawn(async move {
            loop {
                if *ready.borrow_and_update() && shared.dp_in_sync.load(Ordering::SeqCst) {
                    shared.mark("ready");
                    let b = lock(&shared.bootstrap).clone();
                    tracing::info!(
                        "Felix is ready {:.3}s after start: {}",
                        b.ready_after().unwrap_or_default(),
                        b.summary_line()
                    );
                    return;
                }
                tokio::select! {
                    r = ready.changed() => if r.is_err() { return },
                    _ = stop.changed() => return,
                    // Readiness can also follow the dataplane flag alone.
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
        }));
    }
    Ok(Started {
        shared,
        _health_server: health_server,
        servers,
        syncer: syncer_task,
        blocks: blocks_task,
        stop_servers,
    })
}

// ---- Typha ---------------------------------------------------------------------------------------

/// Where Felix's inputs come from.
enum Source {
    Datastore(margay_datastore::AnyBackend),
    /// Typha: the running client, what it delivered during start-up (replayed into the
    /// pipeline first) and the pools in it.
    Typha {
        feed: TyphaFeed,
        buffered: Vec<FeedItem>,
        pools: Vec<Resource>,
    },
}

struct TyphaStart {
    buffered: Vec<FeedItem>,
    inputs: DatastoreInputs,
    loaded: Loaded,
    pools: Vec<Resource>,
}

/// Start-up through Typha: consumes the stream until it is in sync and the configuration it
/// carries loads with ClusterInformation ready (Calico's wait for datastoreReady), keeping
/// everything for the pipeline.
async fn typha_startup(
    feed: &mut TyphaFeed,
    local: &LocalInputs,
    health: &HealthAggregator,
    hostname: &str,
) -> Result<TyphaStart, StartError> {
    let mut buffered = Vec::new();
    let mut inputs = DatastoreInputs::default();
    let mut pools: BTreeMap<String, Resource> = BTreeMap::new();
    let mut in_sync = false;
    let mut last_wait_log: Option<Instant> = None;
    loop {
        let Some(items) = feed.next().await else {
            return Err(StartError::Fatal(feed.stop_reason()));
        };
        let mut changed = false;
        for item in &items {
            match item {
                FeedItem::Syncer(SyncerEvent::Updates(us)) => {
                    for u in us {
                        changed |= inputs.apply(&u.key, u.value.as_ref(), hostname);
                        if u.key.kind == Kind::IPPool {
                            match &u.value {
                                Some(v) => pools.insert(u.key.name.clone(), v.clone()),
                                None => pools.remove(&u.key.name),
                            };
                        }
                    }
                }
                FeedItem::Syncer(SyncerEvent::Status(SyncStatus::InSync)) => {
                    in_sync = true;
                    changed = true;
                }
                FeedItem::Connection(c) => report_typha(health, c),
                _ => {}
            }
        }
        buffered.extend(items);
        if !in_sync || !changed {
            continue;
        }
        let loaded = match load(&inputs.config_inputs(local, hostname)) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "Failed to parse/validate configuration from Typha; waiting for a change");
                continue;
            }
        };
        if loaded.datastore_ready != Some(true) {
            health.report(FELIX_STARTUP, true, true);
            if last_wait_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                last_wait_log = Some(Instant::now());
                tracing::warn!(
                    "Waiting for datastore to be initialized: ClusterInformation \"default\" \
                     does not have datastoreReady: true (margay node startup sets it)"
                );
            }
            continue;
        }
        return Ok(TyphaStart {
            buffered,
            inputs,
            loaded,
            pools: pools.into_values().collect(),
        });
    }
}

/// The TyphaConnection reporter, whose detail says which Typha Felix uses (or why none).
fn report_typha(health: &HealthAggregator, c: &ConnectionState) {
    match c {
        ConnectionState::Connected { addr, server_id } => {
            tracing::info!(addr = %addr, server = %server_id, "Typha connection up");
            health.report_detail(
                TYPHA_CONNECTION,
                true,
                true,
                &format!("connected to Typha at {addr} ({server_id})"),
            );
        }
        ConnectionState::Disconnected { reason } => {
            tracing::warn!(reason = %reason, "No Typha connection; retrying");
            health.report_detail(TYPHA_CONNECTION, true, false, reason);
        }
    }
}

/// Feeds the pipeline from Typha: first what start-up consumed, then the live stream. A
/// client that stops (every Typha it knew left the Service) stops Felix, so its restart
/// looks Typha up again.
async fn run_typha_feed(
    mut feed: TyphaFeed,
    buffered: Vec<FeedItem>,
    sync_tx: mpsc::Sender<SyncerEvent>,
    calc_tx: smpsc::Sender<CalcInput>,
    shared: Arc<Shared>,
) {
    let health = shared.health.clone();
    let mut pending = Some(buffered);
    loop {
        let items = match pending.take() {
            Some(b) => b,
            None => match feed.next().await {
                Some(i) => i,
                None => {
                    let why = feed.stop_reason();
                    tracing::error!("{why}");
                    shared.stop_with(Reason::Fatal(why));
                    return;
                }
            },
        };
        for item in items {
            match item {
                FeedItem::Syncer(ev) => {
                    if sync_tx.send(ev).await.is_err() {
                        return;
                    }
                }
                FeedItem::Block(ev) => {
                    if calc_tx.send(CalcInput::Block(ev)).is_err() {
                        return;
                    }
                }
                FeedItem::Connection(c) => report_typha(&health, &c),
            }
        }
    }
}

// ---- validation filter and configuration watch ------------------------------------------------

struct ConfigWatch {
    local: LocalInputs,
    inputs: DatastoreInputs,
    hostname: String,
    startup: Config,
    current: Config,
    in_sync: bool,
    stopping: bool,
    warn_once: WarnOnce,
}

impl ConfigWatch {
    /// Reloads configuration from the synced resources; a change that cannot be applied live
    /// stops Felix for a restart.
    fn recheck(&mut self, shared: &Shared) {
        if self.stopping {
            return;
        }
        let inputs = self.inputs.config_inputs(&self.local, &self.hostname);
        let new = match load(&inputs) {
            Ok(l) => l,
            Err(e) => {
                self.stopping = true;
                tracing::error!(error = %e, "Configuration from the datastore no longer loads");
                shared.stop_with(Reason::Fatal(format!(
                    "configuration update failed: {e} (fix the FelixConfiguration or Node resource)"
                )));
                return;
            }
        };
        for w in self.warn_once.fresh(&new.warnings) {
            tracing::warn!("{w}");
        }
        if new.datastore_ready != Some(true) {
            self.stopping = true;
            tracing::warn!(
                "Datastore became unready (ClusterInformation \"default\" no longer has \
                 datastoreReady: true), need to restart."
            );
            shared.stop_with(Reason::DatastoreNotReady);
            return;
        }
        let restart = self.startup.restart_required(&new.config);
        if !restart.is_empty() {
            self.stopping = true;
            for c in &restart {
                tracing::warn!(
                    param = c.name,
                    old = %c.old,
                    new = %c.new,
                    "Configuration value changed; change DOES require Felix to restart: {} changed from {:?} to {:?}",
                    c.name,
                    c.old,
                    c.new
                );
            }
            let summary: Vec<String> = restart
                .iter()
                .map(|c| format!("{} {:?} -> {:?}", c.name, c.old, c.new))
                .collect();
            shared.stop_with(Reason::ConfigChanged(summary.join(", ")));
            return;
        }
        for c in self.current.changed_params(&new.config) {
            tracing::info!(
                param = c.name,
                old = %c.old,
                new = %c.new,
                "Configuration value changed; change DOES NOT require Felix to restart"
            );
        }
        if self.current.health_timeout_overrides != new.config.health_timeout_overrides {
            shared
                .health
                .set_overrides(new.config.health_timeout_overrides.clone());
        }
        self.current = new.config.clone();
        *lock(&shared.config_json) = new.to_json();
    }
}

fn validation_loop(
    mut rx: mpsc::Receiver<SyncerEvent>,
    calc_tx: smpsc::Sender<CalcInput>,
    shared: Arc<Shared>,
    mut watch: ConfigWatch,
) {
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            SyncerEvent::Status(s) => {
                if calc_tx.send(CalcInput::Status(s)).is_err() {
                    return;
                }
                if s == SyncStatus::InSync && !watch.in_sync {
                    tracing::info!("Datastore now in sync");
                    watch.in_sync = true;
                    watch.recheck(&shared);
                }
            }
            SyncerEvent::Updates(updates) => {
                let mut out = Vec::with_capacity(updates.len());
                let mut config_touched = false;
                for u in updates {
                    let key = u.key;
                    let value = match u.value {
                        Some(r) => match r
                            .validate()
                            .map_err(|e| e.to_string())
                            .and_then(|()| felix_checks(&r, &watch.startup))
                        {
                            Ok(()) => {
                                clear_invalid(&shared, &key);
                                Some(r)
                            }
                            Err(reason) => {
                                tracing::warn!(
                                    resource = %key,
                                    reason = %reason,
                                    "Resource failed validation; treating it as deleted"
                                );
                                shared.metrics.invalid_resources.add(key.kind.name(), 1);
                                lock(&shared.invalid).insert(key.to_string(), reason);
                                None
                            }
                        },
                        None => {
                            clear_invalid(&shared, &key);
                            None
                        }
                    };
                    config_touched |= watch.inputs.apply(&key, value.as_ref(), &watch.hostname);
                    out.push((key, value));
                }
                if calc_tx.send(CalcInput::Updates(out)).is_err() {
                    return;
                }
                if config_touched && watch.in_sync {
                    watch.recheck(&shared);
                }
            }
        }
    }
}

/// Felix's own checks on top of each resource's validation (Calico's validation filter): a
/// WorkloadEndpoint that asks to send from addresses other than its own is refused unless
/// WorkloadSourceSpoofing is `Any` (then it reaches the dataplane, which lets those sources
/// through and turns the interface's reverse-path filter off).
pub fn felix_checks(r: &Resource, config: &Config) -> Result<(), String> {
    if let Resource::WorkloadEndpoint(w) = r
        && !w.spec.allow_spoofed_source_prefixes.is_empty()
        && !config.workload_source_spoofing.eq_ignore_ascii_case("Any")
    {
        return Err(
            "spec.allowSpoofedSourcePrefixes: source address spoofing is requested but not \
             enabled in Felix's configuration (set WorkloadSourceSpoofing to Any)"
                .into(),
        );
    }
    Ok(())
}

fn clear_invalid(shared: &Shared, key: &ResourceKey) {
    let mut invalid = lock(&shared.invalid);
    if !invalid.is_empty() {
        invalid.remove(&key.to_string());
    }
}

// ---- calculation graph --------------------------------------------------------------------

fn sync_gauge(s: SyncStatus) -> f64 {
    match s {
        SyncStatus::WaitForDatastore => 1.0,
        SyncStatus::ResyncInProgress => 2.0,
        SyncStatus::InSync => 3.0,
    }
}

fn calc_loop(
    rx: smpsc::Receiver<CalcInput>,
    mut graph: CalcGraph,
    dp_tx: smpsc::Sender<Vec<Message>>,
    shared: Arc<Shared>,
    encap: EncapPolicy,
) {
    let m = shared.metrics.clone();
    let mut sync = SyncStatus::WaitForDatastore;
    let mut dirty = false;
    let mut flush_now = false;
    let mut last_flush = Instant::now();
    let mut last_health = Instant::now();
    let mut last_counts: Option<Instant> = None;
    let mut latest_encap: Option<Encap> = None;
    let mut encap_reported = false;
    // In sync means the resources and the IPAM blocks have both been listed: routes computed
    // before the blocks are known would be wrong (per-workload instead of per-block).
    let mut blocks_in_sync = false;
    shared.health.report(CALCULATION_GRAPH, true, false);
    loop {
        let now = Instant::now();
        let wait = if dirty {
            (last_flush + FLUSH_INTERVAL).saturating_duration_since(now)
        } else {
            CALC_GRAPH_HEALTH_INTERVAL.saturating_sub(now.duration_since(last_health))
        };
        match rx.recv_timeout(wait) {
            Ok(CalcInput::Updates(updates)) => {
                let mut kinds: BTreeMap<&'static str, u64> = BTreeMap::new();
                for (key, value) in updates {
                    let t = Instant::now();
                    graph.on_update(&key, value);
                    m.calc_update_time.observe_duration(t.elapsed());
                    *kinds.entry(key.kind.name()).or_default() += 1;
                }
                for (k, n) in kinds {
                    m.calc_updates_processed.add(k, n);
                }
                dirty = true;
                shared
                    .health
                    .report(CALCULATION_GRAPH, true, sync == SyncStatus::InSync);
                last_health = Instant::now();
            }
            Ok(CalcInput::Status(s)) => {
                m.resync_state.set(sync_gauge(s));
                if s == SyncStatus::ResyncInProgress {
                    m.resyncs_started.inc();
                }
                sync = s;
                if s == SyncStatus::InSync && blocks_in_sync && !graph.in_sync() {
                    tracing::info!("First time we've been in sync");
                    graph.on_in_sync();
                    dirty = true;
                    flush_now = true;
                }
                shared
                    .health
                    .report(CALCULATION_GRAPH, true, sync == SyncStatus::InSync);
                last_health = Instant::now();
            }
            Ok(CalcInput::Block(ev)) => {
                match ev {
                    crate::blocks::BlockEvent::Block(cidr, host) => graph.on_ipam_block(cidr, host),
                    crate::blocks::BlockEvent::InSync => {
                        blocks_in_sync = true;
                        if sync == SyncStatus::InSync && !graph.in_sync() {
                            tracing::info!("First time we've been in sync");
                            graph.on_in_sync();
                            flush_now = true;
                        }
                    }
                }
                dirty = true;
            }
            Ok(CalcInput::Query(reply)) => {
                let _ = reply.send(GraphSnapshot {
                    counts: graph.counts(),
                    ip_sets: graph.ip_set_status(),
                    problems: graph.problems(),
                    in_sync: graph.in_sync(),
                    sync,
                });
            }
            Err(smpsc::RecvTimeoutError::Timeout) => {}
            Err(smpsc::RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        if dirty && (flush_now || now >= last_flush + FLUSH_INTERVAL) {
            let t = Instant::now();
            let msgs = graph.flush();
            let took = t.elapsed();
            if took > Duration::from_secs(1) {
                tracing::info!(?took, "Flush took over 1s");
            }
            dirty = false;
            flush_now = false;
            last_flush = now;
            if !msgs.is_empty() {
                m.calc_output_events.add(msgs.len() as u64);
                let mut has_in_sync = false;
                for msg in &msgs {
                    match msg {
                        Message::Encapsulation {
                            ipip,
                            vxlan,
                            vxlan_v6,
                        } => {
                            latest_encap = Some(Encap {
                                ipip: *ipip,
                                vxlan: *vxlan,
                                vxlan_v6: *vxlan_v6,
                            })
                        }
                        Message::InSync => has_in_sync = true,
                        _ => {}
                    }
                }
                // Pools are only complete once in sync: compare then, never before.
                if graph.in_sync()
                    && !encap_reported
                    && let Some(e) = latest_encap
                {
                    let eff = encap.effective(e);
                    if eff != encap.startup {
                        encap_reported = true;
                        tracing::warn!(
                            old = ?encap.startup,
                            new = ?eff,
                            "IPIP, VXLAN and/or noencap encapsulation changed, need to restart."
                        );
                        shared.stop_with(Reason::EncapChanged(format!(
                            "{:?} -> {:?}",
                            encap.startup, eff
                        )));
                    }
                }
                if has_in_sync {
                    tracing::info!("First flush after becoming in sync, sending InSync message.");
                    shared.mark("first_in_sync");
                    last_counts = None;
                }
                if dp_tx.send(msgs).is_err() {
                    return;
                }
            }
        }
        if last_counts.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
            m.set_counts(&graph.counts());
            last_counts = Some(now);
        }
        if now.duration_since(last_health) >= CALC_GRAPH_HEALTH_INTERVAL {
            shared
                .health
                .report(CALCULATION_GRAPH, true, sync == SyncStatus::InSync);
            last_health = now;
        }
    }
}

// ---- dataplane ------------------------------------------------------------------------------

fn dataplane_loop(
    rx: smpsc::Receiver<Vec<Message>>,
    mut driver: Box<dyn DataplaneDriver>,
    shared: Arc<Shared>,
) {
    let m = shared.metrics.clone();
    let started = Instant::now();
    let mut in_sync = false;
    let tick = Duration::from_secs(1);
    shared.health.report(INTERNAL_DATAPLANE, true, false);
    loop {
        // Retries of failed writes and drift refreshes, between batches.
        match driver.housekeeping() {
            Ok(status) => {
                if !in_sync && status.contains(&StatusUpdate::DataplaneInSync) {
                    in_sync = true;
                    shared.dp_in_sync.store(true, Ordering::SeqCst);
                    m.dataplane_initial_resync_time
                        .set(started.elapsed().as_secs_f64());
                    shared.mark("first_apply");
                    tracing::info!(driver = driver.name(), "Dataplane in sync");
                }
            }
            Err(e) => {
                m.dataplane_failures.inc();
                tracing::warn!(error = %e, "Dataplane housekeeping failed; will retry");
            }
        }
        match rx.recv_timeout(tick) {
            Ok(mut batch) => {
                // Coalesce what is already queued: consecutive batches keep their order.
                while batch.len() < 100_000 {
                    match rx.try_recv() {
                        Ok(more) => batch.extend(more),
                        Err(_) => break,
                    }
                }
                let t = Instant::now();
                match driver.apply(&batch) {
                    Ok(status) => {
                        m.dataplane_apply_time.observe_duration(t.elapsed());
                        let mut kinds: BTreeMap<&'static str, u64> = BTreeMap::new();
                        for msg in &batch {
                            *kinds.entry(msg.kind()).or_default() += 1;
                        }
                        for (k, n) in kinds {
                            m.dataplane_messages.add(k, n);
                        }
                        shared
                            .messages_applied
                            .fetch_add(batch.len() as u64, Ordering::Relaxed);
                        if !in_sync && status.contains(&StatusUpdate::DataplaneInSync) {
                            in_sync = true;
                            shared.dp_in_sync.store(true, Ordering::SeqCst);
                            m.dataplane_initial_resync_time
                                .set(started.elapsed().as_secs_f64());
                            shared.mark("first_apply");
                            tracing::info!(driver = driver.name(), "Dataplane in sync");
                        }
                    }
                    Err(DataplaneError::Contract(e)) => {
                        tracing::error!(error = %e, "The dataplane driver refused a batch: a bug in the calculation graph");
                        shared.stop_with(Reason::Fatal(format!("dataplane contract broken: {e}")));
                        shared.health.report(INTERNAL_DATAPLANE, false, false);
                        return;
                    }
                    Err(e) => {
                        m.dataplane_failures.inc();
                        tracing::warn!(error = %e, "Applying dataplane updates failed; will retry");
                    }
                }
            }
            Err(smpsc::RecvTimeoutError::Timeout) => {}
            Err(smpsc::RecvTimeoutError::Disconnected) => return,
        }
        shared.health.report(INTERNAL_DATAPLANE, true, in_sync);
    }
}

// ---- status API -----------------------------------------------------------------------------

fn sync_name(s: SyncStatus) -> &'static str {
    match s {
        SyncStatus::WaitForDatastore => "wait-for-datastore",
        SyncStatus::ResyncInProgress => "resync-in-progress",
        SyncStatus::InSync => "in-sync",
    }
}

fn endpoint_views(model: &margay_calc::DataplaneModel) -> Vec<EndpointView> {
    let tier_views = |tiers: &[margay_calc::TierInfo], stage: &str| -> Vec<TierView> {
        tiers
            .iter()
            .map(|t| TierView {
                name: t.name.clone(),
                stage: stage.to_string(),
                default_action: format!("{:?}", t.default_action),
                ingress: t.ingress_policies.iter().map(ToString::to_string).collect(),
                egress: t.egress_policies.iter().map(ToString::to_string).collect(),
            })
            .collect()
    };
    let mut out = Vec::new();
    for (id, ep) in &model.workload_endpoints {
        out.push(EndpointView {
            kind: "workload".into(),
            id: id.to_string(),
            name: ep.name.clone(),
            namespace: ep.namespace.clone(),
            interface: ep.interface.clone(),
            addresses: ep
                .ipv4_nets
                .iter()
                .chain(&ep.ipv6_nets)
                .map(ToString::to_string)
                .collect(),
            profiles: ep.profile_ids.clone(),
            tiers: tier_views(&ep.tiers, "normal"),
        });
    }
    for (id, ep) in &model.host_endpoints {
        let mut tiers = tier_views(&ep.untracked_tiers, "untracked");
        tiers.extend(tier_views(&ep.pre_dnat_tiers, "pre-dnat"));
        tiers.extend(tier_views(&ep.tiers, "normal"));
        tiers.extend(tier_views(&ep.forward_tiers, "forward"));
        out.push(EndpointView {
            kind: "host".into(),
            id: id.clone(),
            name: id.clone(),
            namespace: String::new(),
            interface: ep.interface.clone(),
            addresses: ep
                .expected_ipv4
                .iter()
                .chain(&ep.expected_ipv6)
                .map(ToString::to_string)
                .collect(),
            profiles: ep.profile_ids.clone(),
            tiers,
        });
    }
    out
}

async fn status_doc(shared: &Shared, with_config: bool) -> Result<StatusDoc, String> {
    let (tx, rx) = oneshot::channel();
    let sent = lock(&shared.calc_tx)
        .as_ref()
        .map(|c| c.send(CalcInput::Query(tx)).is_ok())
        .unwrap_or(false);
    if !sent {
        return Err("the calculation graph has stopped (Felix is shutting down)".into());
    }
    let snap = match tokio::time::timeout(Duration::from_secs(5), rx).await {
        Ok(Ok(s)) => s,
        Ok(Err(_)) => return Err("the calculation graph has stopped".into()),
        Err(_) => {
            return Err(
                "the calculation graph did not answer within 5s (it is busy); try again".into(),
            );
        }
    };
    let summary = shared.health.summary();
    let counts: BTreeMap<String, u64> = match serde_json::to_value(&snap.counts) {
        Ok(serde_json::Value::Object(o)) => o
            .into_iter()
            .filter_map(|(k, v)| v.as_u64().map(|n| (k, n)))
            .collect(),
        _ => BTreeMap::new(),
    };
    let (endpoints, in_sync_dp) = {
        let rec = shared.recording.lock();
        (endpoint_views(&rec.model), rec.model.in_sync)
    };
    let mut problems: Vec<ProblemView> = lock(&shared.invalid)
        .iter()
        .map(|(r, why)| ProblemView {
            resource: r.clone(),
            stage: "validation".into(),
            reason: why.clone(),
        })
        .collect();
    problems.extend(snap.problems.into_iter().map(|p| ProblemView {
        resource: p.resource,
        stage: "graph".into(),
        reason: p.reason,
    }));
    let b = lock(&shared.bootstrap).clone();
    Ok(StatusDoc {
        hostname: shared.hostname.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        uptime_seconds: shared.start.elapsed().as_secs_f64(),
        live: summary.live,
        ready: summary.ready,
        health: summary.components,
        sync_status: sync_name(snap.sync).into(),
        in_sync: snap.in_sync,
        datastore: shared.datastore.clone(),
        dataplane: DataplaneView {
            driver: shared.driver_name.into(),
            in_sync: in_sync_dp && shared.dp_in_sync.load(Ordering::SeqCst),
            messages_applied: shared.messages_applied.load(Ordering::Relaxed),
            nft: shared
                .nft_stats
                .as_ref()
                .and_then(|h| serde_json::to_value(&*h.lock()).ok()),
        },
        counts,
        bootstrap: BootstrapView {
            phases: b.phases().to_vec(),
            ready_after_seconds: b.ready_after(),
        },
        endpoints,
        ip_sets: snap
            .ip_sets
            .into_iter()
            .map(|s| IpSetView {
                id: s.id,
                kind: format!("{:?}", s.kind),
                members: s.members,
                users: s.users,
                source: s.source,
            })
            .collect(),
        problems,
        config: with_config.then(|| lock(&shared.config_json).clone()),
    })
}

/// The JSON answer to one request.
async fn answer(shared: &Shared, what: &str) -> (u16, serde_json::Value) {
    let err = |code: u16, msg: String| (code, serde_json::json!({ "error": msg }));
    if what == "config" {
        return (200, lock(&shared.config_json).clone());
    }
    if !REQUESTS.contains(&what) {
        return err(
            404,
            format!(
                "unknown request {what:?}; ask for one of: {}",
                REQUESTS.join(", ")
            ),
        );
    }
    let doc = match status_doc(shared, what == "all").await {
        Ok(d) => d,
        Err(e) => return err(503, e),
    };
    let v = match what {
        "endpoints" => serde_json::to_value(&doc.endpoints),
        "ipsets" => serde_json::to_value(&doc.ip_sets),
        "problems" => serde_json::to_value(&doc.problems),
        "bootstrap" => serde_json::to_value(&doc.bootstrap),
        "health" => serde_json::to_value(shared.health.summary()),
        _ => serde_json::to_value(&doc),
    };
    match v {
        Ok(v) => (200, v),
        Err(e) => err(500, format!("cannot encode the answer: {e}")),
    }
}

async fn serve_status(sock: StatusSocket, shared: Arc<Shared>, stop: watch::Receiver<bool>) {
    let respond = move |what: String| {
        let shared = shared.clone();
        async move { answer(&shared, &what).await }
    };
    crate::status::serve(&sock.listener, ConnLimits::default(), respond, stop).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn spoofing_endpoints_need_workload_source_spoofing_any() {
        let wep = margay_api::decode_one(
            "apiVersion: projectcalico.org/v3\nkind: WorkloadEndpoint\nmetadata: {name: n-k8s-p-eth0, namespace: ns}\nspec: {orchestrator: k8s, node: n, pod: p, endpoint: eth0, interfaceName: calip, ipNetworks: [10.65.0.1/32], allowSpoofedSourcePrefixes: [10.99.0.0/24]}",
        )
        .unwrap();
        let mut c = Config::defaults().clone();
        let e = felix_checks(&wep, &c).unwrap_err();
        assert!(e.contains("WorkloadSourceSpoofing"), "{e}");
        c.workload_source_spoofing = "Any".into();
        assert_eq!(felix_checks(&wep, &c), Ok(()));
        assert_eq!(
            felix_checks(&pool("{cidr: 10.0.0.0/16}"), &Config::defaults().clone()),
            Ok(())
        );
    }

    fn pool(yaml_spec: &str) -> Resource {
        margay_api::decode_one(&format!(
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: p}}\nspec: {yaml_spec}"
        ))
        .unwrap()
    }

    #[test]
    fn encapsulation_follows_pools_unless_forced() {
        let none = pool_encap(&[]);
        assert_eq!(
            none,
            Encap {
                ipip: false,
                vxlan: false,
                vxlan_v6: false
            }
        );
        let vx = pool_encap(&[pool("{cidr: 10.0.0.0/16, vxlanMode: Always}")]);
        assert!(vx.vxlan && !vx.ipip);
        let ip = pool_encap(&[pool("{cidr: 10.0.0.0/16, ipipMode: CrossSubnet}")]);
        assert!(ip.ipip && !ip.vxlan);
        let p = EncapPolicy {
            ipip_override: Some(false),
            vxlan_override: None,
            startup: none,
        };
        assert_eq!(p.effective(ip), none);
        assert!(p.effective(vx).vxlan);
    }

    #[test]
    fn exit_codes() {
        assert_eq!(Exit::Stopped.code(), 0);
        assert_eq!(Exit::Restart(String::new()).code(), 129);
        assert_eq!(Exit::Failed(String::new()).code(), 1);
    }
}
