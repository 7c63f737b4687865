//! The `margay kube-controllers` daemon (edge): connects to the datastore and the Kubernetes
//! API, keeps the KubeControllersConfiguration `default` (created when missing, its status
//! reporting the running configuration), and runs the controllers it enables; a change of the
//! running configuration restarts them in place (Calico re-executes itself). Health: the
//! status file and `/liveness`, `/readiness`, `/status/status.json` on the health port;
//! metrics on the resource's prometheusMetricsPort.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use margay_api::{Kind, KubeControllersConfiguration, ObjectMeta, Resource};
use margay_datastore::kube::KubeBackend;
use margay_datastore::kube::api::KubeApi;
use margay_datastore::kube::route::{
    ApiResource, K8S_NETWORK_POLICIES, NAMESPACES, NODES, PODS, SERVICE_ACCOUNTS,
};
use margay_datastore::{AnyBackend, Client, DatastoreConfig, DatastoreError, KvBackend};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::config::{
    ConfigError, DEFAULT_NAME, DatastoreKind, EnvSettings, Merged, RunConfig, default_spec, merge,
};
use crate::informer::Informer;
use crate::ipam_controller::{
    IpamController, IpamGcOptions, KubeView, node_projection, pod_projection,
};
use crate::metrics::Metrics;
use crate::mirrors::{
    EndpointMirror, MirrorKind, ResourceMirror, namespace_projection, policy_projection,
    run_endpoint_mirror, run_resource_mirror, service_account_projection,
};
use crate::status::{CALICO_DATASTORE, KUBE_API_SERVER, STARTUP, Status};
use margay_daemon_http::{Handler, Health, Limits, Response, Router};

/// Changes the process's log level (the binary's subscriber).
pub type LogLevelSetter = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// How long start-up waits for the datastore (Calico: 60 s, then it exits).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// The loadbalancer controller's full pass, besides the one after each Service change.
const LB_RESYNC: Duration = Duration::from_secs(300);
/// Between health checks (and their timeout).
const HEALTH_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("datastore: {0}")]
    Datastore(#[from] DatastoreError),
    #[error("cannot listen on {addr} for {what}: {source}; choose another port")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the daemon task failed: {0}")]
    Task(String),
}

/// Everything the daemon runs with.
#[derive(Clone)]
pub struct DaemonOptions {
    pub datastore: DatastoreConfig,
    pub kind: DatastoreKind,
    pub env: EnvSettings,
    /// Calico's `--status-file` (None: no file).
    pub status_file: Option<PathBuf>,
    /// Calico's `--health-port` (None: no health server).
    pub health_listen: Option<SocketAddr>,
    /// Overrides the resource's prometheusMetricsPort (port 0: any free port).
    pub metrics_listen: Option<SocketAddr>,
    /// Applies the running configuration's log level (None: the command line fixed it).
    pub log_level: Option<LogLevelSetter>,
    /// Least time between event-triggered IPAM syncs.
    pub gc_min_interval: Duration,
    /// Between passes of the automatic host endpoint controller.
    pub auto_hep_period: Duration,
}

impl DaemonOptions {
    /// From environment variables: Calico's datastore settings with DATASTORE_TYPE defaulting
    /// to `etcdv3` (kube-controllers' default), and the overrides of [`crate::config`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<DaemonOptions, DaemonError> {
        let set = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let ds_type = set("CALICO_DATASTORE_TYPE").or_else(|| set("DATASTORE_TYPE"));
        let kind = DatastoreKind::from_env(ds_type.as_deref())?;
        let datastore = DatastoreConfig::from_lookup(|k| {
            if k == "DATASTORE_TYPE" || k == "CALICO_DATASTORE_TYPE" {
                return Some(kind.env_value().to_string());
            }
            get(k)
        })?;
        Ok(DaemonOptions {
            datastore,
            kind,
            env: EnvSettings::from_lookup(&get),
            status_file: None,
            health_listen: None,
            metrics_listen: None,
            log_level: None,
            gc_min_interval: Duration::from_secs(1),
            auto_hep_period: Duration::from_secs(5),
        })
    }
}

/// A running daemon.
pub struct Daemon {
    pub status: Arc<Status>,
    pub metrics: Arc<Metrics>,
    health_addr: Option<SocketAddr>,
    metrics_addr: watch::Receiver<Option<SocketAddr>>,
    running: watch::Receiver<Option<RunConfig>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), DaemonError>>,
}

impl Daemon {
    /// Binds the health port and starts the daemon on the current runtime.
    pub async fn start(opts: DaemonOptions) -> Result<Daemon, DaemonError> {
        // Environment errors before anything is contacted.
        merge(&opts.env, opts.kind, &default_spec())?;
        let status = Arc::new(Status::new(opts.status_file.clone()));
        status.set(STARTUP, false, "initialized to false");
        let metrics = Arc::new(Metrics::default());
        let (stop, stop_rx) = watch::channel(false);
        let mut health_addr = None;
        if let Some(addr) = opts.health_listen {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| DaemonError::Bind {
                    what: "health",
                    addr,
                    source,
                })?;
            health_addr = l.local_addr().ok();
            tokio::spawn(margay_daemon_http::serve(
                l,
                health_handler(status.clone()),
                None,
                Limits::default(),
                stop_rx.clone(),
            ));
        }
        let (maddr_tx, maddr_rx) = watch::channel(None);
        let (run_tx, run_rx) = watch::channel(None);
        let task = tokio::spawn(main(
            opts,
            status.clone(),
            metrics.clone(),
            stop_rx,
            maddr_tx,
            run_tx,
        ));
        Ok(Daemon {
            status,
            metrics,
            health_addr,
            metrics_addr: maddr_rx,
            running: run_rx,
            stop,
            task,
        })
    }

    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health_addr
    }

    /// The metrics server's address, once one runs (waits up to `timeout`).
    pub async fn metrics_addr(&self, timeout: Duration) -> Option<SocketAddr> {
        let mut rx = self.metrics_addr.clone();
        tokio::time::timeout(timeout, rx.wait_for(|a| a.is_some()))
            .await
            .ok()
            .and_then(|r| r.ok().and_then(|a| *a))
    }

    /// The running configuration, once there is one (waits up to `timeout`).
    pub async fn run_config(&self, timeout: Duration) -> Option<RunConfig> {
        let mut rx = self.running.clone();
        tokio::time::timeout(timeout, rx.wait_for(|a| a.is_some()))
            .await
            .ok()
            .and_then(|r| r.ok().and_then(|a| a.clone()))
    }

    /// Stops the controllers and waits for them.
    pub async fn stop(self) -> Result<(), DaemonError> {
        let _ = self.stop.send(true);
        self.wait().await
    }

    /// Waits until the daemon ends (an error, or a stop).
    pub async fn wait(self) -> Result<(), DaemonError> {
        match self.task.await {
            Ok(r) => r,
            Err(e) => Err(DaemonError::Task(e.to_string())),
        }
    }

    /// A handle that stops the daemon (for signal handlers).
    pub fn stopper(&self) -> watch::Sender<bool> {
        self.stop.clone()
    }
}

/// kube-controllers' health: always live; ready once every controller reported ready
/// (Calico's status file), the body naming those that are not.
struct ControllersHealth(Arc<Status>);

impl Health for ControllersHealth {
    fn liveness(&self) -> (u16, String) {
        (200, "live\n".into())
    }

    fn readiness(&self) -> (u16, String) {
        let s = self.0.snapshot();
        if s.ready() {
            (200, "ready\n".into())
        } else {
            (503, format!("not ready: {}\n", s.not_ready()))
        }
    }
}

/// `/liveness`, `/readiness` (and Calico's `/live`, `/ready` aliases) and the status file as
/// JSON at `/status/status.json` (and `/status`).
fn health_handler(status: Arc<Status>) -> Handler {
    let health = Arc::new(ControllersHealth(status.clone()));
    let (live, ready) = (health.clone(), health.clone());
    let json = move || {
        Response::json(
            200,
            serde_json::to_vec(&status.snapshot()).unwrap_or_default(),
        )
    };
    Router::new()
        .health(health)
        .route("/live", move || {
            let (c, b) = live.liveness();
            Response::text(c, b)
        })
        .route("/ready", move || {
            let (c, b) = ready.readiness();
            Response::text(c, b)
        })
        .route("/status/status.json", json.clone())
        .route("/status", json)
        .into_handler()
}

/// Connects, retrying transient failures for up to a minute (Calico's start-up wait).
async fn connect(
    cfg: &DatastoreConfig,
    status: &Status,
    stop: &mut watch::Receiver<bool>,
) -> Result<Option<AnyBackend>, DaemonError> {
    let deadline = tokio::time::Instant::now() + STARTUP_TIMEOUT;
    let mut attempt = 0u32;
    loop {
        let err = match cfg.connect().await {
            Ok(b) => match b.revision().await {
                Ok(_) => return Ok(Some(b)),
                Err(e) => e,
            },
            // A setting that is wrong will not get better.
            Err(e @ DatastoreError::Invalid { .. }) => return Err(e.into()),
            Err(e) => e,
        };
        status.set(
            STARTUP,
            false,
            format!("Error initializing datastore: {err}"),
        );
        if tokio::time::Instant::now() >= deadline {
            return Err(err.into());
        }
        attempt += 1;
        tracing::info!("cannot reach the datastore yet ({}): {err}", cfg.describe());
        tokio::select! {
            _ = tokio::time::sleep(KubeApi::backoff(attempt)) => {}
            _ = stop.changed() => return Ok(None),
        }
    }
}

async fn main(
    opts: DaemonOptions,
    status: Arc<Status>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
    metrics_addr: watch::Sender<Option<SocketAddr>>,
    running: watch::Sender<Option<RunConfig>>,
) -> Result<(), DaemonError> {
    tracing::info!(datastore = %opts.datastore.describe(), "starting kube-controllers");
    let Some(backend) = connect(&opts.datastore, &status, &mut stop).await? else {
        return Ok(());
    };
    // Pods and nodes come from the Kubernetes API in both modes.
    let api = match &backend {
        AnyBackend::Kube(k) => k.api().clone(),
        _ => KubeBackend::connect(&opts.datastore.kube)
            .await?
            .api()
            .clone(),
    };
    status.set(STARTUP, true, "");
    tracing::info!("datastore reached");

    let client = Client::new(backend.clone());
    let (cfg_tx, mut cfg_rx) = watch::channel::<Option<Merged>>(None);
    // In the Kubernetes datastore the status lives behind the custom resource's /status.
    let status_api = (opts.kind == DatastoreKind::Kubernetes).then(|| api.clone());
    let mut kcc = tokio::spawn(kcc_loop(
        client.clone(),
        status_api,
        opts.env.clone(),
        opts.kind,
        cfg_tx,
        stop.clone(),
    ));
    let mut generation: Option<Generation> = None;
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            r = &mut kcc => {
                if let Some(g) = generation.take() { g.stop().await; }
                return match r {
                    Ok(r) => r,
                    Err(e) => Err(DaemonError::Task(e.to_string())),
                };
            }
            changed = cfg_rx.changed() => {
                if changed.is_err() { break; }
            }
        }
        let Some(merged) = cfg_rx.borrow_and_update().clone() else {
            continue;
        };
        if running.borrow().as_ref() == Some(&merged.run) {
            continue;
        }
        if let Some(g) = generation.take() {
            tracing::info!("the running configuration changed; restarting the controllers");
            g.stop().await;
        }
        if let Some(set) = &opts.log_level
            && let Err(e) = set(merged.run.log_level)
        {
            tracing::warn!("cannot change the log level: {e}");
        }
        generation = Some(
            Generation::start(
                &opts,
                &merged.run,
                backend.clone(),
                api.clone(),
                status.clone(),
                metrics.clone(),
                &metrics_addr,
            )
            .await,
        );
        running.send_replace(Some(merged.run));
    }
    kcc.abort();
    if let Some(g) = generation {
        g.stop().await;
    }
    tracing::info!("kube-controllers stopped");
    Ok(())
}

/// Keeps the KubeControllersConfiguration `default` (creating it when missing), publishes the
/// merged configuration on every change and writes its status. Ends only on a configuration
/// the environment makes impossible.
async fn kcc_loop<B: KvBackend>(
    client: Client<B>,
    status_api: Option<KubeApi>,
    env: EnvSettings,
    kind: DatastoreKind,
    out: watch::Sender<Option<Merged>>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), DaemonError> {
    let mut written_status = None;
    let mut warned: Vec<String> = Vec::new();
    let mut failures = 0u32;
    loop {
        if failures > 0 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1).min(KubeApi::backoff(failures))) => {}
                _ = stop.changed() => return Ok(()),
            }
        }
        // A list first: its revision is where the watch below starts.
        let listed = match client
            .list(Kind::KubeControllersConfiguration, None, "")
            .await
        {
            Ok(l) => l,
            Err(e) => {
                failures += 1;
                tracing::warn!("cannot list KubeControllersConfigurations: {e}");
                continue;
            }
        };
        let found = listed.items.into_iter().find_map(|r| match r {
            Resource::KubeControllersConfiguration(k) if k.metadata.name == DEFAULT_NAME => Some(k),
            _ => None,
        });
        let Some(mut kcc) = found else {
            let r =
                KubeControllersConfiguration::new(ObjectMeta::named(DEFAULT_NAME), default_spec());
            match client.create(Resource::from(r)).await {
                Ok(_) => tracing::info!("created KubeControllersConfiguration default"),
                Err(DatastoreError::AlreadyExists { .. }) => {}
                Err(e) => {
                    failures += 1;
                    tracing::warn!("cannot create KubeControllersConfiguration default: {e}");
                }
            }
            continue;
        };
        let merged = merge(&env, kind, &kcc.spec)?;
        if merged.warnings != warned {
            for w in &merged.warnings {
                tracing::warn!("{w}");
            }
            warned = merged.warnings.clone();
        }
        // Our own status write comes back as a change: write only what we have not written.
        if kcc.status.as_ref() != Some(&merged.status)
            && written_status.as_ref() != Some(&merged.status)
        {
            let written = match &status_api {
                Some(api) => write_kcc_status(api, &merged.status).await,
                None => {
                    kcc.status = Some(merged.status.clone());
                    client
                        .update(Resource::from(kcc))
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
            };
            match written {
                Ok(()) => written_status = Some(merged.status.clone()),
                Err(e) => {
                    tracing::debug!("cannot write the KubeControllersConfiguration status: {e}");
                    failures += 1;
                    continue;
                }
            }
        }
        out.send_if_modified(|cur| {
            if cur.as_ref() == Some(&merged) {
                false
            } else {
                *cur = Some(merged);
                true
            }
        });
        failures = 0;
        let mut w = match client
            .watch(Kind::KubeControllersConfiguration, None, listed.revision)
            .await
        {
            Ok(w) => w,
            Err(e) => {
                failures += 1;
                tracing::warn!("cannot watch KubeControllersConfigurations: {e}");
                continue;
            }
        };
        tokio::select! {
            _ = stop.changed() => return Ok(()),
            ev = w.next() => match ev {
                Some(Ok(_)) => {}
                // A watch that ends without news is tried again after a pause, not at once.
                Some(Err(e)) => {
                    tracing::debug!("KubeControllersConfiguration watch ended: {e}");
                    failures += 1;
                }
                None => failures += 1,
            }
        }
    }
}

/// The custom resource behind KubeControllersConfiguration `default` (Calico's v1 CRD).
const KCC_CRD: ApiResource = ApiResource {
    group: "crd.projectcalico.org",
    version: "v1",
    plural: "kubecontrollersconfigurations",
    kind: "KubeControllersConfiguration",
    namespaced: false,
};

/// Writes the status through the custom resource's status subresource (a write of the
/// resource itself leaves the status alone, as the API server does for such CRDs); the
/// status is stored as the v3 resource has it.
async fn write_kcc_status(
    api: &KubeApi,
    status: &margay_api::kubecontrollers::KubeControllersConfigurationStatus,
) -> Result<(), String> {
    let patch = serde_json::json!({ "status": status });
    api.merge_patch(&KCC_CRD, None, DEFAULT_NAME, Some("status"), &patch)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The controllers (and the checks and servers that depend on the configuration) of one
/// running configuration.
struct Generation {
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl Generation {
    async fn stop(mut self) {
        let _ = self.stop.send(true);
        let drain = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(10), drain)
            .await
            .is_err()
        {
            self.tasks.abort_all();
        }
    }

    async fn start(
        opts: &DaemonOptions,
        run: &RunConfig,
        backend: AnyBackend,
        api: KubeApi,
        status: Arc<Status>,
        metrics: Arc<Metrics>,
        metrics_addr: &watch::Sender<Option<SocketAddr>>,
    ) -> Generation {
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let c = &run.controllers;
        let prefix = opts.datastore.kube.interface_prefix.clone();

        // Metrics.
        let listen = opts.metrics_listen.or_else(|| {
            (run.prometheus_port != 0)
                .then(|| SocketAddr::from(([0, 0, 0, 0], run.prometheus_port)))
        });
        metrics_addr.send_replace(None);
        if let Some(addr) = listen {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => {
                    let bound = l.local_addr().ok();
                    tracing::info!(addr = ?bound, "serving Prometheus metrics");
                    metrics_addr.send_replace(bound);
                    tasks.spawn(margay_daemon_http::serve(
                        l,
                        Router::new().metrics(metrics.clone()).into_handler(),
                        None,
                        Limits::default(),
                        stop_rx.clone(),
                    ));
                }
                Err(e) => {
                    tracing::error!(
                        "cannot serve metrics on {addr}: {e}; choose another prometheusMetricsPort"
                    );
                }
            }
        }

        // Health checks.
        if run.health_enabled {
            tasks.spawn(health_checks(
                backend.clone(),
                api.clone(),
                status.clone(),
                stop_rx.clone(),
            ));
        } else {
            status.remove(CALICO_DATASTORE);
            status.remove(KUBE_API_SERVER);
        }

        // etcd compaction.
        if opts.kind == DatastoreKind::Etcd && !run.etcd_compaction_period.is_zero() {
            tasks.spawn(compaction(
                backend.clone(),
                run.etcd_compaction_period,
                stop_rx.clone(),
            ));
        }

        let mirrors_wanted = c.policy.is_some()
            || c.namespace.is_some()
            || c.service_account.is_some()
            || c.workload_endpoint.is_some();
        let mirrors = opts.kind == DatastoreKind::Etcd;
        if mirrors_wanted && !mirrors {
            tracing::warn!(
                "the policy, namespace, serviceaccount and workloadendpoint controllers only run with the etcdv3 datastore (the Kubernetes datastore derives those resources itself); not starting them"
            );
        }
        if c.load_balancer {
            tracing::info!("starting the loadbalancer controller (LoadBalancer IPAM)");
            tasks.spawn(crate::loadbalancer::run(
                api.clone(),
                backend.clone(),
                LB_RESYNC,
                stop_rx.clone(),
            ));
        }
        if let Some(node) = &c.node {
            // Off, one pass removes the endpoints it made before.
            tasks.spawn(crate::auto_hep::run(
                Client::new(backend.clone()),
                node.auto_host_endpoints,
                opts.auto_hep_period,
                stop_rx.clone(),
            ));
        }
        if c.node.as_ref().is_some_and(|n| n.sync_labels) {
            tracing::info!(
                "node label sync is not implemented by margay (etcd); Calico Node labels are left as they are"
            );
        }

        // Informers, with their subscribers.
        let (gc_pods_tx, gc_pods_rx) = mpsc::unbounded_channel();
        let (gc_nodes_tx, gc_nodes_rx) = mpsc::unbounded_channel();
        let (wep_tx, wep_rx) = mpsc::unbounded_channel();
        let want_wep = mirrors && c.workload_endpoint.is_some();
        let mut pod_subs = Vec::new();
        if c.node.is_some() {
            pod_subs.push(gc_pods_tx);
        }
        if want_wep {
            pod_subs.push(wep_tx);
        }
        let pods = (c.node.is_some() || want_wep).then(|| {
            Arc::new(Informer::spawn(
                api.clone(),
                PODS,
                pod_projection(prefix.clone()),
                pod_subs,
            ))
        });

        if let (Some(node), Some(pods)) = (&c.node, &pods) {
            let nodes = Arc::new(Informer::spawn(
                api.clone(),
                NODES,
                node_projection(),
                vec![gc_nodes_tx],
            ));
            let mut o = IpamGcOptions::new(opts.kind, node.leak_grace_period);
            o.delete_nodes = node.delete_nodes;
            o.min_interval = opts.gc_min_interval;
            o.interface_prefix = prefix.clone();
            let ctl = IpamController::new(
                backend.clone(),
                KubeView {
                    api: api.clone(),
                    pods: pods.clone(),
                    nodes,
                },
                o,
                metrics.clone(),
            );
            tasks.spawn(ctl.run(gc_pods_rx, gc_nodes_rx, stop_rx.clone()));
        }

        if mirrors {
            let client = Client::new(backend.clone());
            for (kind, cfg, res, project) in [
                (
                    MirrorKind::Policy,
                    c.policy,
                    K8S_NETWORK_POLICIES,
                    policy_projection(),
                ),
                (
                    MirrorKind::Namespace,
                    c.namespace,
                    NAMESPACES,
                    namespace_projection(),
                ),
                (
                    MirrorKind::ServiceAccount,
                    c.service_account,
                    SERVICE_ACCOUNTS,
                    service_account_projection(),
                ),
            ] {
                let Some(cfg) = cfg else { continue };
                let (tx, rx) = mpsc::unbounded_channel();
                let informer = Arc::new(Informer::spawn(api.clone(), res, project, vec![tx]));
                let m = ResourceMirror {
                    kind,
                    informer,
                    client: client.clone(),
                    metrics: metrics.clone(),
                };
                tasks.spawn(run_resource_mirror(
                    m,
                    rx,
                    cfg.reconciler_period,
                    stop_rx.clone(),
                ));
            }
            if let (Some(cfg), Some(pods)) = (c.workload_endpoint, &pods) {
                let m = EndpointMirror {
                    pods: pods.clone(),
                    client,
                    metrics: metrics.clone(),
                };
                tasks.spawn(run_endpoint_mirror(
                    m,
                    wep_rx,
                    cfg.reconciler_period,
                    stop_rx.clone(),
                ));
            }
        }
        let enabled: BTreeMap<&str, bool> = BTreeMap::from([
            ("node", c.node.is_some()),
            ("policy", mirrors && c.policy.is_some()),
            ("namespace", mirrors && c.namespace.is_some()),
            ("serviceaccount", mirrors && c.service_account.is_some()),
            ("workloadendpoint", want_wep),
        ]);
        let on: Vec<&str> = enabled
            .iter()
            .filter(|(_, v)| **v)
            .map(|(k, _)| *k)
            .collect();
        tracing::info!(controllers = ?on, "controllers started");
        Generation { stop, tasks }
    }
}

/// Calico's runHealthChecks: the datastore and the Kubernetes API, every 10 s.
async fn health_checks(
    backend: AnyBackend,
    api: KubeApi,
    status: Arc<Status>,
    mut stop: watch::Receiver<bool>,
) {
    status.set(CALICO_DATASTORE, false, "initialized to false");
    status.set(KUBE_API_SERVER, false, "initialized to false");
    loop {
        let ds = tokio::time::timeout(HEALTH_INTERVAL, backend.revision()).await;
        match ds {
            Ok(Ok(_)) => status.set(CALICO_DATASTORE, true, ""),
            Ok(Err(e)) => status.set(
                CALICO_DATASTORE,
                false,
                format!("Error verifying datastore: {e}"),
            ),
            Err(_) => status.set(
                CALICO_DATASTORE,
                false,
                "Error verifying datastore: timed out",
            ),
        }
        let k = tokio::time::timeout(HEALTH_INTERVAL, api.current_revision(&NODES)).await;
        match k {
            Ok(Ok(_)) => status.set(KUBE_API_SERVER, true, ""),
            Ok(Err(e)) => status.set(
                KUBE_API_SERVER,
                false,
                format!("Error reaching apiserver: {e}"),
            ),
            Err(_) => status.set(
                KUBE_API_SERVER,
                false,
                "Error reaching apiserver: timed out",
            ),
        }
        tokio::select! {
            _ = tokio::time::sleep(HEALTH_INTERVAL) => {}
            _ = stop.changed() => return,
        }
    }
}

/// etcd: compacts the history older than one period, every period (Calico's compactor).
async fn compaction(backend: AnyBackend, period: Duration, mut stop: watch::Receiver<bool>) {
    tracing::info!(period = ?period, "periodic etcd compaction");
    let mut previous: Option<i64> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.changed() => return,
        }
        if let Some(rev) = previous
            && let Err(e) = backend.compact(rev).await
        {
            tracing::warn!(revision = rev, "etcd compaction failed: {e}");
        }
        match backend.revision().await {
            Ok(r) => previous = Some(r),
            Err(e) => tracing::warn!("cannot read the etcd revision for compaction: {e}"),
        }
    }
}
