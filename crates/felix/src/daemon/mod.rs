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

//!
//! The modules: `startup` (configuration, datastore or Typha, the driver and the threads),
//! `typha` (start-up and feeding through Typha), `validation` (the validation filter and
//! the configuration watch), `pipeline` (the calculation and dataplane threads), `driver`
//! (which driver, MTUs, encapsulation), `servers` (health, metrics, status socket) and
//! `status_api` (the status socket's answers). This file holds what they share and the
//! shutdown logic.

mod driver;
mod pipeline;
mod servers;
pub mod services;
mod startup;
mod status_api;
mod typha;
mod validation;

pub use driver::ENV_MTU_FILE;
pub use validation::felix_checks;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::mpsc as smpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use margay_api::{Kind, Resource, ResourceKey};
use margay_calc::{CalcCounts, IpSetStatus, Problem};
use margay_dataplane::Recording;
use margay_datastore::SyncStatus;
use tokio::sync::{mpsc, oneshot, watch};

use crate::LogLevelSetter;
use crate::bootstrap::Bootstrap;
use crate::dataplane_config::Encap;
use crate::health::{FELIX_STARTUP, HealthAggregator, SystemClock};
use crate::metrics::Metrics;
use startup::startup;

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
    /// Applies LogFilePath + LogSeverityFile (None: no file destination to manage).
    pub log_file: Option<margay_logging::FileSetter>,
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
            log_file: None,
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
    /// What start-up waits for now (the status socket says it before the pipeline runs).
    waiting: Arc<Mutex<Waiting>>,
    /// The running pipeline's state, once start-up is done (the status socket's full answers).
    running: Arc<Mutex<Option<Arc<Shared>>>>,
}

/// Start-up's current wait, for the status socket.
#[derive(Debug, Clone)]
pub(crate) struct Waiting {
    pub what: String,
    pub since: Instant,
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

    /// Records what start-up waits for now (kept until the next call).
    fn waiting_for(&self, what: impl Into<String>) {
        let what = what.into();
        let mut w = lock(&self.waiting);
        if w.what != what {
            *w = Waiting {
                what,
                since: Instant::now(),
            };
        }
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
    /// Kubernetes Services and EndpointSlices (their own watch, or Typha's stream).
    Services(Vec<services::ServiceInput>),
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
    nft_stats: Option<driver::DriverStats>,
    /// Flow logs (FlowLogsLocalReporter=Enabled, Linux dataplane).
    flows: Option<Arc<crate::flows::FlowLogs>>,
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

/// What start-up hands to the running phase.
struct Started {
    shared: Arc<Shared>,
    _health_server: servers::HealthServer,
    servers: Vec<tokio::task::JoinHandle<()>>,
    syncer: tokio::task::JoinHandle<()>,
    blocks: tokio::task::JoinHandle<()>,
    /// The Services watch (None: none runs, or they come through Typha).
    services: Option<tokio::task::JoinHandle<()>>,
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
            waiting: Arc::new(Mutex::new(Waiting {
                what: "configuration to load".into(),
                since: Instant::now(),
            })),
            running: Arc::new(Mutex::new(None)),
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
        // The status socket answers from the first second: while start-up waits it says for
        // what, then it gives the full status.
        let (stop_status, status_stop_rx) = watch::channel(false);
        let status_server = match &opts.status_socket {
            Some(path) => match crate::status::StatusSocket::bind(path) {
                Ok(sock) => {
                    tracing::info!(path = %path.display(), "Serving the status API (margay felix status)");
                    Some(tokio::spawn(status_api::serve_status(
                        sock,
                        control.clone(),
                        status_stop_rx,
                    )))
                }
                Err(e) => {
                    tracing::error!("{e}");
                    return Exit::Failed(e.to_string());
                }
            },
            None => None,
        };
        let stop_status_server = |server: Option<tokio::task::JoinHandle<()>>| async move {
            let _ = stop_status.send(true);
            if let Some(s) = server {
                let _ = tokio::time::timeout(Duration::from_secs(1), s).await;
            }
        };
        let started = tokio::select! {
            r = startup(&opts, &control) => r,
            r = self.reasons_rx.recv() => Err(StartError::Reason(r.unwrap_or(Reason::Stop))),
        };
        let mut started = match started {
            Ok(s) => s,
            Err(StartError::Fatal(msg)) => {
                tracing::error!("{msg}");
                stop_status_server(status_server).await;
                return Exit::Failed(msg);
            }
            Err(StartError::Reason(r)) => {
                tracing::warn!(reason = %r, "Felix is shutting down");
                stop_status_server(status_server).await;
                return finish(r, &mut self.reasons_rx, self.opts.restart_delay).await;
            }
        };
        *lock(&control.running) = Some(started.shared.clone());
        let reason = self.reasons_rx.recv().await.unwrap_or(Reason::Stop);
        tracing::warn!(reason = %reason, "Felix is shutting down");
        // Stop the syncer and the servers (the status socket is removed as its server ends);
        // the pipeline threads run down as their channels close.
        started.syncer.abort();
        started.blocks.abort();
        if let Some(s) = &started.services {
            s.abort();
        }
        let _ = started.stop_servers.send(true);
        lock(&control.running).take();
        if let Some(f) = &started.shared.flows {
            f.stop();
        }
        stop_status_server(status_server).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert_eq!(Exit::Stopped.code(), 0);
        assert_eq!(Exit::Restart(String::new()).code(), 129);
        assert_eq!(Exit::Failed(String::new()).code(), 1);
    }
}
