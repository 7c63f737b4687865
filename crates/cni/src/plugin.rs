//! The plugins' commands: ADD, DEL, CHECK, STATUS, GC and VERSION for `margay` (the main
//! plugin) and `margay-ipam` (IPAM only).
//!
//! ADD writes in this order, so a crash at any point leaves nothing DEL cannot remove:
//! IPAM (handle `<network>.<containerID>`, which DEL releases) → interfaces → the
//! WorkloadEndpoint. A failure after the allocation releases the handle and removes the
//! interfaces before the error is reported. DEL removes everything it can (endpoint,
//! interfaces, both handle forms), treats what is already gone as done, and reports every
//! error it met.

use std::collections::{BTreeSet, HashSet};
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use margay_api::{Kind, Resource, ResourceKey, WorkloadEndpoint};
use margay_datastore::kube::KubeBackend;
use margay_datastore::kube::api::ApiError;
use margay_datastore::kube::route::{NAMESPACES, PODS};
use margay_datastore::{AnyBackend, Client, DatastoreError, KvBackend};
use margay_ipam::{AssignArgs, AssignedIp, HostLock, Ipam, IpamError};
use serde_json::Value;

use crate::config::{
    self, CmdArgs, Command, DEFAULT_MTU, DEFAULT_NODENAME_FILE, Env, NetConf, WorkloadArgs,
};
use crate::dataplane::{self, DataplaneError};
use crate::k8s::{self, AddressPlan};
use crate::spec::{CniError, CniResult, Interface, IpConfig, Version, code, version_info};
use crate::storm::Slot;
use crate::workload::Identity;

/// Which plugin this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginKind {
    /// `margay` (Calico's `calico`): interfaces, routes, IPAM and the WorkloadEndpoint.
    Main,
    /// `margay-ipam` (Calico's `calico-ipam`): addresses only.
    Ipam,
}

/// How long one call may take in total before it reports "try again later".
const CALL_TIMEOUT: Duration = Duration::from_secs(90);
/// How long to wait for the node name file (margay node writes it when it has started).
const NODENAME_WAIT: Duration = Duration::from_secs(2);
/// How long the pod lookup (pod and namespace) may take before ADD says "try again later".
const POD_LOOKUP_TIMEOUT: Duration = Duration::from_secs(20);
/// Test-only: `MARGAY_CNI_TEST_PAUSE=<stage>:<ms>` pauses ADD after a stage (`ipam`, `veth`),
/// so tests can kill the plugin at a known point. Never set it in production.
pub const ENV_TEST_PAUSE: &str = "MARGAY_CNI_TEST_PAUSE";

/// Runs one plugin call: reads the command from `env` and the configuration from `stdin`,
/// writes the result (or a CNI error object) on `out`, returns the exit code.
pub fn run(kind: PluginKind, env: &Env, stdin: &[u8], out: &mut dyn Write) -> u8 {
    let (answer, version) = answer(kind, env, stdin);
    let text = match &answer {
        Ok(Some(v)) => Some(v.to_string()),
        Ok(None) => None,
        Err(e) => {
            tracing::error!(code = e.code, "{e}");
            Some(e.to_json(&version).to_string())
        }
    };
    if let Some(t) = text {
        let _ = writeln!(out, "{t}");
    }
    let _ = out.flush();
    u8::from(answer.is_err())
}

/// The JSON to print (None for commands that print nothing) and the version to answer in.
fn answer(kind: PluginKind, env: &Env, stdin: &[u8]) -> (Result<Option<Value>, CniError>, String) {
    let sniffed = config::sniff_version(stdin);
    let cmd = match config::command(env) {
        Ok(c) => c,
        Err(e) => return (Err(e), sniffed),
    };
    if cmd == Command::Version {
        let requested = serde_json::from_slice::<Value>(stdin)
            .ok()
            .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
            .filter(|v| Version::parse(v).is_some())
            .unwrap_or_else(|| crate::spec::LATEST.to_string());
        return (Ok(Some(version_info(&requested))), requested);
    }
    let parsed = match config::parse_netconf(stdin) {
        Ok(p) => p,
        Err(e) => return (Err(e), sniffed),
    };
    let version = parsed.version;
    let vs = version.to_string();
    let allowed = match cmd {
        Command::Check => version.has_check(),
        Command::Status | Command::Gc => version.has_status_and_gc(),
        _ => true,
    };
    if !allowed {
        return (
            Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!(
                    "config version {version} does not allow {cmd:?} (set cniVersion to 1.1.0 or later for STATUS/GC, 0.4.0 or later for CHECK)"
                ),
            )),
            vs,
        );
    }
    let args = match config::cmd_args(env, cmd) {
        Ok(a) => a,
        Err(e) => return (Err(e), vs),
    };
    let call = Call {
        kind,
        cmd,
        conf: parsed.conf,
        raw: parsed.raw,
        stdin: stdin.to_vec(),
        version,
        args,
        env: env.clone(),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return (
                Err(CniError::new(code::PLUGIN, "cannot start the async runtime").with_details(e)),
                vs,
            );
        }
    };
    let result = rt.block_on(async {
        match tokio::time::timeout(CALL_TIMEOUT, call.dispatch()).await {
            Ok(r) => r,
            Err(_) => Err(CniError::new(
                code::TRY_AGAIN_LATER,
                format!("{cmd:?} did not finish within {CALL_TIMEOUT:?}; try again later"),
            )),
        }
    });
    (result, vs)
}

/// One plugin call.
struct Call {
    kind: PluginKind,
    cmd: Command,
    conf: NetConf,
    raw: Value,
    /// The configuration as received (passed on to a delegated IPAM plugin).
    stdin: Vec<u8>,
    version: Version,
    args: CmdArgs,
    env: Env,
}

/// The datastore, IPAM and resource client of one call.
struct Store {
    client: Client<AnyBackend>,
    ipam: Ipam<AnyBackend>,
    describe: String,
}

impl Store {
    /// The Kubernetes datastore's backend (its client also serves the pod lookups).
    fn kube(&self) -> Option<&KubeBackend> {
        match self.client.backend() {
            AnyBackend::Kube(k) => Some(k),
            _ => None,
        }
    }
}

/// What one ADD asks IPAM for, and where the pod's annotations said so (for errors).
struct Request {
    /// Specific addresses (assign_ip), else `v4`/`v6` from the pools (auto_assign).
    ips: Vec<IpAddr>,
    ips_origin: Option<String>,
    v4: bool,
    v6: bool,
    v4_pools: Vec<String>,
    v6_pools: Vec<String>,
    /// The pools annotations (IPv4, IPv6) the pool lists came from.
    pools_origin: [Option<k8s::Pools>; 2],
}

impl Request {
    /// An IPAM error, naming the annotation that led to it when one did.
    fn error(&self, e: IpamError) -> CniError {
        let pools_origin = match &e {
            IpamError::NoSuchPool { version, .. } => {
                self.pools_origin[usize::from(*version == 6)].as_ref()
            }
            IpamError::PoolUnusable { pool, .. } => self
                .pools_origin
                .iter()
                .flatten()
                .find(|p| p.pools.contains(pool)),
            _ => None,
        };
        if let Some(p) = pools_origin {
            return CniError::new(code::POD, format!("{}: {e}", p.origin));
        }
        ipam_error(e)
    }

    /// An error of assigning one of `ips`.
    fn ip_error(&self, e: IpamError) -> CniError {
        let mut err = ipam_error(e);
        if let Some(origin) = &self.ips_origin {
            err.msg = format!("{origin}: {}", err.msg);
        }
        err
    }
}

/// A Kubernetes pod read from the API for ADD, and what its annotations ask for.
struct PodFacts {
    pod: k8s::Pod,
    plan: AddressPlan,
}

/// The pod lookup within [`POD_LOOKUP_TIMEOUT`] (a hung API server is "try again later").
async fn bounded_lookup<T>(
    ident: &Identity,
    lookup: impl std::future::Future<Output = Result<T, CniError>>,
) -> Result<T, CniError> {
    match tokio::time::timeout(POD_LOOKUP_TIMEOUT, lookup).await {
        Ok(r) => r,
        Err(_) => Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!(
                "the Kubernetes API did not answer the lookup of pod {}/{} within {POD_LOOKUP_TIMEOUT:?}; try again later",
                ident.namespace, ident.pod
            ),
        )),
    }
}

/// A failed Kubernetes API request of the pod lookup, as a CNI error.
fn api_error(what: &str, e: ApiError) -> CniError {
    match e {
        ApiError::Unavailable(m) | ApiError::Gone(m) => CniError::new(
            code::TRY_AGAIN_LATER,
            format!("{what}: the Kubernetes API did not answer ({m}); try again later"),
        ),
        ApiError::Denied(m) => CniError::new(
            code::PLUGIN,
            format!("{what}: {m} (the plugin needs get on pods and namespaces)"),
        ),
        other => CniError::new(code::PLUGIN, format!("{what}: {other}")),
    }
}

fn ipam_error(e: IpamError) -> CniError {
    let c = match &e {
        IpamError::NoPools { .. }
        | IpamError::Exhausted { .. }
        | IpamError::PoolUnusable { .. } => code::NO_ADDRESS,
        IpamError::NotInPool { .. } | IpamError::InUse { .. } | IpamError::Reserved { .. } => {
            code::ADDRESS_REFUSED
        }
        IpamError::NoSuchPool { .. } => code::INVALID_CONFIG,
        IpamError::TooManyRetries { .. } | IpamError::BadSequenceNumber { .. } => {
            code::TRY_AGAIN_LATER
        }
        IpamError::Lock { .. } => code::IO_FAILURE,
        IpamError::Datastore(d) if d.is_transient() => code::TRY_AGAIN_LATER,
        _ => code::DATASTORE,
    };
    CniError::new(c, e.to_string())
}

fn datastore_error(what: &str, e: DatastoreError) -> CniError {
    let c = if e.is_transient() {
        code::TRY_AGAIN_LATER
    } else {
        code::DATASTORE
    };
    CniError::new(c, format!("{what}: {e}"))
}

fn dataplane_error(e: DataplaneError) -> CniError {
    match &e {
        DataplaneError::Netns { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            CniError::new(
                code::UNKNOWN_CONTAINER,
                format!("{e} (CNI_NETNS must name the container's network namespace)"),
            )
        }
        DataplaneError::Netns { source, .. }
            if source.kind() == std::io::ErrorKind::InvalidInput =>
        {
            CniError::new(code::INVALID_ENV, format!("CNI_NETNS: {e}"))
        }
        _ => CniError::new(code::DATAPLANE, e.to_string()),
    }
}

/// Runs blocking dataplane work off the runtime thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DataplaneError> + Send + 'static,
) -> Result<T, CniError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(dataplane_error),
        Err(e) => Err(CniError::new(code::PLUGIN, "dataplane task failed").with_details(e)),
    }
}

fn test_pause(env: &Env, stage: &str) {
    let Some(spec) = env.get(ENV_TEST_PAUSE) else {
        return;
    };
    let Some((s, ms)) = spec.split_once(':') else {
        return;
    };
    if s != stage {
        return;
    }
    let ms: u64 = ms.parse().unwrap_or(0);
    // Straight to stderr, whatever the log settings: tests wait for this line.
    eprintln!("margay-cni test hook: pausing {ms} ms after {stage}");
    std::thread::sleep(Duration::from_millis(ms));
}

impl Call {
    async fn dispatch(&self) -> Result<Option<Value>, CniError> {
        match self.cmd {
            Command::Add => self.add().await.map(|r| Some(r.to_json(self.version))),
            Command::Del => self.del().await.map(|()| None),
            Command::Check => self.check().await.map(|()| None),
            Command::Status => self.status().await.map(|()| None),
            Command::Gc => self.gc().await.map(|()| None),
            Command::Version => Ok(Some(version_info(&self.version.to_string()))),
        }
    }

    /// Whether margay assigns the addresses itself (`margay-ipam`, or `calico-ipam`, which
    /// margay serves), rather than delegating to another IPAM plugin in CNI_PATH.
    fn builtin_ipam(&self) -> bool {
        self.kind == PluginKind::Ipam
            || matches!(
                self.conf.ipam.ipam_type.as_str(),
                "" | "margay-ipam" | "calico-ipam"
            )
    }

    /// Runs the delegated IPAM plugin for `command` (off the runtime thread).
    async fn delegate(&self, command: &'static str) -> Result<Option<Value>, CniError> {
        let (plugin, env, stdin) = (
            self.conf.ipam.ipam_type.clone(),
            self.env.clone(),
            self.stdin.clone(),
        );
        match tokio::task::spawn_blocking(move || {
            crate::delegate::exec(&plugin, command, &env, &stdin)
        })
        .await
        {
            Ok(r) => r,
            Err(e) => {
                Err(CniError::new(code::PLUGIN, "IPAM delegation task failed").with_details(e))
            }
        }
    }

    /// The node name: the config's `nodename`, else the node name file, else the host name.
    /// Unless `nodename_file_optional`, the node name file must exist (margay node has
    /// started), as Calico requires; it is waited for briefly.
    async fn nodename(&self) -> Result<String, CniError> {
        let path = if self.conf.nodename_file.is_empty() {
            PathBuf::from(DEFAULT_NODENAME_FILE)
        } else {
            PathBuf::from(&self.conf.nodename_file)
        };
        let mut from_file = None;
        let deadline = tokio::time::Instant::now() + NODENAME_WAIT;
        loop {
            match std::fs::read_to_string(&path) {
                Ok(s) => {
                    from_file = Some(s.trim().to_string()).filter(|s| !s.is_empty());
                    break;
                }
                Err(e) if self.conf.nodename_file_optional => {
                    tracing::debug!(path = %path.display(), "no node name file: {e}");
                    break;
                }
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(CniError::new(
                        code::NODENAME,
                        format!(
                            "{}: {e}: check that margay node (calico-node) is running and has written it (or set nodename_file_optional)",
                            path.display()
                        ),
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        if !self.conf.nodename.is_empty() {
            return Ok(self.conf.nodename.clone());
        }
        if let Some(n) = from_file {
            return Ok(n);
        }
        if !self.conf.kubernetes.node_name.is_empty() {
            return Ok(self.conf.kubernetes.node_name.clone());
        }
        if !self.conf.hostname.is_empty() {
            return Ok(self.conf.hostname.clone());
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_lowercase())
            .unwrap_or_default();
        if host.is_empty() {
            return Err(CniError::new(
                code::NODENAME,
                "cannot determine the node name: set nodename in the network configuration",
            ));
        }
        Ok(host)
    }

    fn mtu(&self) -> u32 {
        if self.conf.mtu > 0 {
            return self.conf.mtu;
        }
        std::fs::read_to_string(config::mtu_file(&self.env))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .filter(|m| *m > 0)
            .unwrap_or(DEFAULT_MTU)
    }

    async fn connect(&self) -> Result<Store, CniError> {
        let cfg = config::datastore_config(&self.conf, &self.env)?;
        let describe = cfg.describe();
        let backend =
            match tokio::time::timeout(Duration::from_secs(30), cfg.connect_existing()).await {
                Ok(Ok(b)) => b,
                Ok(Err(e)) => {
                    return Err(CniError::new(
                        code::TRY_AGAIN_LATER,
                        format!("cannot reach the datastore ({describe}); try again later"),
                    )
                    .with_details(e));
                }
                Err(_) => {
                    return Err(CniError::new(
                        code::TRY_AGAIN_LATER,
                        format!(
                            "the datastore ({describe}) did not answer within 30s; try again later"
                        ),
                    ));
                }
            };
        let lock = Arc::new(HostLock::new(config::lock_path(&self.conf, &self.env)));
        Ok(Store {
            client: Client::new(backend.clone()),
            ipam: Ipam::new(backend).with_host_lock(lock),
            describe,
        })
    }

    fn workload(&self) -> Result<WorkloadArgs, CniError> {
        config::workload_args(&self.args.args, &self.conf)
    }

    fn identity(&self, w: &WorkloadArgs, node: &str) -> Identity {
        Identity::new(&self.args, w, node, &self.conf.name)
            .with_interface_prefix(&config::interface_prefix(&self.env))
    }

    // ---- Kubernetes: the pod from the API ----------------------------------------------------

    /// Whether this call reads its pod from the Kubernetes API: the main plugin, a Kubernetes
    /// pod (K8S_POD_NAMESPACE/K8S_POD_NAME), and an API to ask — the Kubernetes datastore, or
    /// one the network configuration names (`kubernetes.kubeconfig`, `k8s_api_root`), as in
    /// Calico's conflists. Without one the call works as for any runtime (labels from
    /// `args.cni`).
    fn looks_up_pods(&self, ident: &Identity, store: &Store) -> bool {
        self.kind == PluginKind::Main
            && ident.is_k8s()
            && (store.kube().is_some() || config::names_kubernetes_api(&self.conf))
    }

    /// The API client of the lookups: the Kubernetes datastore's own, else one made from the
    /// network configuration (`kubernetes.kubeconfig`, the `policy` block's overrides).
    async fn kube_client(&self, store: &Store) -> Result<KubeBackend, CniError> {
        if let Some(k) = store.kube() {
            return Ok(k.clone());
        }
        let settings = config::datastore_config(&self.conf, &self.env)?.kube;
        if settings.cert_file.is_some() != settings.key_file.is_some() {
            return Err(CniError::new(
                code::INVALID_CONFIG,
                "network configuration: policy.k8s_client_certificate and policy.k8s_client_key go together; set both or neither",
            ));
        }
        KubeBackend::connect(&settings).await.map_err(|e| {
            CniError::new(
                code::INVALID_CONFIG,
                "cannot set up the Kubernetes API client for the pod lookup (network config kubernetes.kubeconfig, policy.k8s_*)",
            )
            .with_details(e)
        })
    }

    /// Reads the pod (and, when its annotations can matter, its namespace) and checks what
    /// they ask for. None when this call does not look pods up.
    async fn pod_facts(
        &self,
        store: &Store,
        ident: &Identity,
    ) -> Result<Option<PodFacts>, CniError> {
        if !self.looks_up_pods(ident, store) {
            return Ok(None);
        }
        let lookup = async {
            let kube = self.kube_client(store).await?;
            let pod = self.read_pod(&kube, ident).await?;
            if pod.host_network {
                return Ok(PodFacts {
                    pod,
                    plan: AddressPlan::default(),
                });
            }
            let ns = if pod.needs_namespace(self.builtin_ipam()) {
                match kube
                    .api()
                    .get(&NAMESPACES, None, &ident.namespace)
                    .await
                    .map_err(|e| api_error(&format!("reading namespace {}", ident.namespace), e))?
                {
                    Some(n) => k8s::annotations_of(&n).map_err(|e| {
                        CniError::new(
                            code::POD,
                            format!("namespace {}: metadata.annotations: {e}", ident.namespace),
                        )
                    })?,
                    None => Default::default(),
                }
            } else {
                Default::default()
            };
            let plan = k8s::address_plan(&pod, &ns, &self.conf, self.builtin_ipam())?;
            Ok(PodFacts { pod, plan })
        };
        bounded_lookup(ident, lookup).await.map(Some)
    }

    /// GET the pod; a pod that does not exist is "unknown container" (nothing to clean up).
    async fn read_pod(&self, kube: &KubeBackend, ident: &Identity) -> Result<k8s::Pod, CniError> {
        let label = format!("{}/{}", ident.namespace, ident.pod);
        let obj = kube
            .api()
            .get(&PODS, Some(&ident.namespace), &ident.pod)
            .await
            .map_err(|e| api_error(&format!("reading pod {label}"), e))?
            .ok_or_else(|| {
                CniError::new(
                    code::UNKNOWN_CONTAINER,
                    format!(
                        "pod {label} does not exist in the Kubernetes API (deleted, or K8S_POD_NAMESPACE/K8S_POD_NAME name another cluster's pod); nothing was set up"
                    ),
                )
            })?;
        k8s::Pod::from_api(&obj, &ident.interface_prefix)
    }

    /// In the Kubernetes datastore the endpoint *is* the pod: its name and interface are
    /// derived from it (`<spec.nodeName>-k8s-<pod>-eth0`, prefix + hash), and Felix sees only
    /// that. The plugin's own names must be those, or its write would land on no endpoint
    /// Felix knows (and DEL would miss it).
    fn check_kdd_names(&self, ident: &Identity, pod: &k8s::Pod) -> Result<(), CniError> {
        if pod.node_name != ident.node {
            return Err(CniError::new(
                code::NODENAME,
                format!(
                    "pod {} is scheduled on node {:?} (spec.nodeName) but this plugin's node name is {:?}: in the Kubernetes datastore they must be the same; set nodename (or the node name file) to the Kubernetes node's name",
                    pod.label(),
                    pod.node_name,
                    ident.node
                ),
            ));
        }
        if ident.endpoint != margay_kdd::pod::ENDPOINT_ETH0 {
            return Err(CniError::new(
                code::INVALID_ENV,
                format!(
                    "CNI_IFNAME is {:?}: in the Kubernetes datastore a pod's endpoint is its {} interface (the WorkloadEndpoint is derived from the pod), so margay wires only that one",
                    ident.endpoint,
                    margay_kdd::pod::ENDPOINT_ETH0
                ),
            ));
        }
        if let Some(derived) = &pod.endpoint {
            let name = ident.endpoint_name()?;
            if derived.metadata.name != name
                || derived.spec.interface_name != ident.host_veth_name()
            {
                return Err(CniError::new(
                    code::PLUGIN,
                    format!(
                        "the endpoint of pod {} would be {name} on {}, but the Kubernetes datastore derives {} on {}",
                        pod.label(),
                        ident.host_veth_name(),
                        derived.metadata.name,
                        derived.spec.interface_name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `ipAddrs` on a pod whose endpoint still names another (old) sandbox's addresses: they
    /// are released first, as Calico does, so the pod can have them again.
    async fn release_previous_sandbox(
        &self,
        store: &Store,
        ident: &Identity,
    ) -> Result<(), CniError> {
        let key = self.endpoint_key(ident)?;
        let wep = match store.client.get(&key).await {
            Ok(Resource::WorkloadEndpoint(w)) => w,
            Ok(_) | Err(DatastoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(datastore_error("reading the pod's WorkloadEndpoint", e)),
        };
        if wep.spec.container_id == self.args.container_id {
            return Ok(()); // this container's own: its handle keeps them
        }
        let old: Vec<margay_ipam::ReleaseIp> = wep
            .spec
            .ip_networks
            .iter()
            .filter_map(|n| crate::spec::parse_cidr(n).map(|(ip, _)| ip))
            .map(|ip| margay_ipam::ReleaseIp {
                ip,
                sequence_number: None,
            })
            .collect();
        if old.is_empty() {
            return Ok(());
        }
        let released = store.ipam.release_ips(&old).await.map_err(ipam_error)?;
        tracing::info!(previous = %wep.spec.container_id, ?released, "ipAddrs: released the addresses of the pod's previous sandbox");
        Ok(())
    }

    // ---- ADD --------------------------------------------------------------------------------

    async fn add(&self) -> Result<CniResult, CniError> {
        let started = std::time::Instant::now();
        if !self.builtin_ipam() {
            crate::delegate::find(&self.conf.ipam.ipam_type, &self.args.path)?;
        }
        let w = self.workload()?;
        let node = self.nodename().await?;
        let ident = self.identity(&w, &node);
        let _slot = Slot::acquire(&config::lock_path(&self.conf, &self.env), &self.env).await;
        tracing::debug!(elapsed = ?started.elapsed(), "node name known, slot held");
        let store = self.connect().await?;
        tracing::info!(container = %self.args.container_id, handle = %ident.handle(), datastore = %store.describe, "ADD");
        tracing::debug!(elapsed = ?started.elapsed(), "datastore open");
        // The pod first: whatever it says is checked before anything is written.
        let facts = self.pod_facts(&store, &ident).await?;
        if let Some(f) = &facts {
            tracing::debug!(elapsed = ?started.elapsed(), pod = %f.pod.label(), "pod read");
            if f.pod.host_network {
                // The pod shares the host's network namespace: nothing of its own to wire,
                // no address to assign (runtimes do not call CNI plugins for such pods).
                tracing::info!(pod = %f.pod.label(), "the pod uses the host's network (spec.hostNetwork); nothing to wire");
                return Ok(CniResult::default());
            }
            if store.kube().is_some() {
                self.check_kdd_names(&ident, &f.pod)?;
            }
        } else if self.conf.feature_control.floating_ips
            || self.conf.feature_control.ip_addrs_no_ipam
        {
            tracing::info!(
                "feature_control floating_ips / ip_addrs_no_ipam act on Kubernetes pods' annotations, which this call does not read"
            );
        }
        let plan = facts.as_ref().map(|f| f.plan.clone()).unwrap_or_default();
        if self.kind == PluginKind::Main {
            // First, so that a failure leaves nothing behind.
            self.ensure_network_profile(&store, &ident).await?;
        }

        let assigned = if !plan.no_ipam.is_empty() {
            // ipAddrsNoIpam: the addresses as given; IPAM holds nothing for them.
            tracing::info!(ips = ?plan.no_ipam, "ipAddrsNoIpam: using the pod's addresses without IPAM");
            plan.no_ipam
                .iter()
                .map(|ip| AssignedIp {
                    ip: *ip,
                    block: margay_api::net::Cidr::host(*ip),
                })
                .collect()
        } else if self.builtin_ipam() {
            if !plan.ips.is_empty() {
                self.release_previous_sandbox(&store, &ident).await?;
            }
            let req = self.request(&w, &plan, facts.as_ref().map(|f| f.pod.label()));
            self.addresses(&store, &ident, &req).await?.0
        } else {
            let answer = self.delegate("ADD").await?.ok_or_else(|| {
                CniError::new(
                    code::PLUGIN,
                    format!(
                        "the IPAM plugin {} printed no result",
                        self.conf.ipam.ipam_type
                    ),
                )
            })?;
            let r = CniResult::from_json(&answer).map_err(|e| {
                CniError::new(
                    code::PLUGIN,
                    format!(
                        "the IPAM plugin {} answered with an unusable result: {e}",
                        self.conf.ipam.ipam_type
                    ),
                )
            })?;
            let mut out = Vec::new();
            for ip in r.ips {
                if out
                    .iter()
                    .any(|a: &AssignedIp| a.ip.is_ipv4() == ip.ip.is_ipv4())
                {
                    continue; // one address per family, as Calico takes
                }
                let block = margay_api::net::Cidr::new(ip.ip, ip.prefix)
                    .map_err(|e| CniError::new(code::PLUGIN, format!("IPAM result: {e}")))?
                    .network();
                out.push(AssignedIp { ip: ip.ip, block });
            }
            if out.is_empty() {
                let _ = self.delegate("DEL").await;
                return Err(CniError::new(
                    code::NO_ADDRESS,
                    format!(
                        "the IPAM plugin {} assigned no address",
                        self.conf.ipam.ipam_type
                    ),
                ));
            }
            out
        };
        test_pause(&self.env, "ipam");
        if self.kind == PluginKind::Ipam {
            return Ok(CniResult {
                ips: assigned
                    .iter()
                    .map(|a| IpConfig {
                        ip: a.ip,
                        prefix: a.block.prefix(),
                        gateway: None,
                        interface: None,
                    })
                    .collect(),
                ..CniResult::default()
            });
        }
        tracing::debug!(elapsed = ?started.elapsed(), "addresses ready");
        let ips: Vec<IpAddr> = assigned.iter().map(|a| a.ip).collect();
        let done = async {
            let pod = facts.as_ref().map(|f| &f.pod);
            let nats = match pod {
                Some(p) => k8s::ip_nats(p, &plan.floating_ips, &ips)?,
                None => Vec::new(),
            };
            self.add_networking(&store, &ident, &w, pod, &nats, &ips, started)
                .await
        };
        match done.await {
            Ok(r) => Ok(r),
            Err(e) => {
                self.roll_back(&store, &ident).await;
                Err(e)
            }
        }
    }

    /// What to ask IPAM for: the configuration, overridden by the pod's annotations
    /// (`ipAddrs` over `IP=`/`args.cni.ips`, `ipFamilies` over assign_ipv4/6, the pools).
    fn request(&self, w: &WorkloadArgs, plan: &AddressPlan, pod: Option<String>) -> Request {
        if !plan.ips.is_empty() && !w.ips.is_empty() {
            tracing::warn!(annotation = ?plan.ips, args = ?w.ips, "the pod's ipAddrs annotation wins over the addresses in CNI_ARGS/args/runtimeConfig");
        }
        let pools = |p: &Option<k8s::Pools>, conf: &Vec<String>| {
            p.as_ref().map_or_else(|| conf.clone(), |p| p.pools.clone())
        };
        Request {
            ips: if plan.ips.is_empty() {
                w.ips.clone()
            } else {
                plan.ips.clone()
            },
            ips_origin: (!plan.ips.is_empty()).then(|| {
                format!(
                    "pod {}'s annotation {}",
                    pod.unwrap_or_default(),
                    k8s::ANNOTATION_IP_ADDRS
                )
            }),
            v4: plan.families.map_or(self.conf.ipam.v4(), |f| f.v4),
            v6: plan.families.map_or(self.conf.ipam.v6(), |f| f.v6),
            v4_pools: pools(&plan.v4_pools, &self.conf.ipam.ipv4_pools),
            v6_pools: pools(&plan.v6_pools, &self.conf.ipam.ipv6_pools),
            pools_origin: [plan.v4_pools.clone(), plan.v6_pools.clone()],
        }
    }

    /// Calico's profile handling: unless the config names a policy handler (`policy.type`),
    /// the network's profile (`workload::network_profile`) is created when it does not exist,
    /// and never updated. Two ADDs racing to create it both succeed.
    async fn ensure_network_profile(
        &self,
        store: &Store,
        ident: &Identity,
    ) -> Result<(), CniError> {
        if !self.conf.policy.policy_type.is_empty() {
            return Ok(());
        }
        let key = ResourceKey {
            kind: Kind::Profile,
            namespace: String::new(),
            name: self.conf.name.clone(),
        };
        match store.client.get(&key).await {
            Ok(_) => return Ok(()),
            Err(DatastoreError::NotFound { .. }) => {}
            Err(e) => return Err(datastore_error("reading the network's profile", e)),
        }
        let profile = crate::workload::network_profile(&self.conf.name, ident.is_k8s());
        match store.client.create(Resource::Profile(profile)).await {
            Ok(_) => {
                tracing::info!(profile = %self.conf.name, "created the network's profile");
                Ok(())
            }
            Err(DatastoreError::AlreadyExists { .. }) => Ok(()),
            Err(e @ DatastoreError::Validation { .. }) => Err(CniError::new(
                code::INVALID_CONFIG,
                format!(
                    "the network name {:?} cannot name its profile: {e} (use a name of lower-case letters, digits, '-' and '.', or set policy.type to manage policy elsewhere)",
                    self.conf.name
                ),
            )),
            Err(e) => Err(datastore_error("creating the network's profile", e)),
        }
    }

    /// The container's addresses: the ones its handle already holds (a repeated ADD gets the
    /// same addresses), completed by new ones. Returns all of them and the new ones.
    async fn addresses(
        &self,
        store: &Store,
        ident: &Identity,
        req: &Request,
    ) -> Result<(Vec<AssignedIp>, Vec<AssignedIp>), CniError> {
        let handle = ident.handle();
        let held = store
            .ipam
            .ips_by_handle(&handle)
            .await
            .map_err(ipam_error)?;
        let attrs = ident.ipam_attrs(&margay_datastore::util::now_rfc3339());
        let mut fresh = Vec::new();
        let mut out: Vec<AssignedIp> = Vec::new();
        if !req.ips.is_empty() {
            for ip in &req.ips {
                if let Some(h) = held.iter().find(|h| h.ip == *ip) {
                    out.push(*h);
                    continue;
                }
                match store
                    .ipam
                    .assign_ip(*ip, &handle, &attrs, &node_of(ident))
                    .await
                {
                    Ok(a) => {
                        fresh.push(a);
                        out.push(a);
                    }
                    Err(e) => {
                        self.release_fresh(store, &fresh).await;
                        return Err(req.ip_error(e));
                    }
                }
            }
            return Ok((out, fresh));
        }
        let (want4, want6) = (req.v4, req.v6);
        let have4 = held.iter().find(|a| a.ip.is_ipv4()).copied();
        let have6 = held.iter().find(|a| a.ip.is_ipv6()).copied();
        let mut args = AssignArgs::new(handle.clone(), node_of(ident));
        args.num_v4 = usize::from(want4 && have4.is_none());
        args.num_v6 = usize::from(want6 && have6.is_none());
        args.attrs = attrs;
        args.v4_pools = req.v4_pools.clone();
        args.v6_pools = req.v6_pools.clone();
        if args.num_v4 + args.num_v6 > 0 {
            let got = store
                .ipam
                .auto_assign(&args)
                .await
                .map_err(|e| req.error(e))?;
            fresh.extend(got.all().copied());
        }
        if want4 {
            out.extend(have4.or_else(|| fresh.iter().find(|a| a.ip.is_ipv4()).copied()));
        }
        if want6 {
            out.extend(have6.or_else(|| fresh.iter().find(|a| a.ip.is_ipv6()).copied()));
        }
        if held.is_empty() {
            tracing::info!(ips = ?out.iter().map(|a| a.ip).collect::<Vec<_>>(), "assigned");
        } else {
            tracing::info!(ips = ?out.iter().map(|a| a.ip).collect::<Vec<_>>(), "reusing the addresses this container already holds");
        }
        Ok((out, fresh))
    }

    async fn release_fresh(&self, store: &Store, fresh: &[AssignedIp]) {
        if fresh.is_empty() {
            return;
        }
        let ips: Vec<margay_ipam::ReleaseIp> = fresh
            .iter()
            .map(|a| margay_ipam::ReleaseIp {
                ip: a.ip,
                sequence_number: None,
            })
            .collect();
        if let Err(e) = store.ipam.release_ips(&ips).await {
            tracing::error!("releasing addresses after a failed ADD: {e}");
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn add_networking(
        &self,
        store: &Store,
        ident: &Identity,
        w: &WorkloadArgs,
        pod: Option<&k8s::Pod>,
        nats: &[margay_api::endpoint::IpNat],
        ips: &[IpAddr],
        started: std::time::Instant,
    ) -> Result<CniResult, CniError> {
        let host_veth = ident.host_veth_name();
        let mtu = self.mtu();
        if self.conf.device_type == "netkit" {
            tracing::info!("device_type netkit is not supported by margay yet; using veth");
        }
        let set_up = {
            let (hv, ifname, netns, ips) = (
                host_veth.clone(),
                self.args.ifname.clone(),
                PathBuf::from(&self.args.netns),
                ips.to_vec(),
            );
            let fwd = self.conf.container_settings.allow_ip_forwarding;
            blocking(move || {
                dataplane::set_up(&dataplane::Spec {
                    host_veth: &hv,
                    ifname: &ifname,
                    netns: &netns,
                    mtu,
                    ips: &ips,
                    allow_ip_forwarding: fwd,
                })
            })
            .await?
        };
        tracing::debug!(elapsed = ?started.elapsed(), "interfaces ready");
        test_pause(&self.env, "veth");
        let mut wep = ident.endpoint(
            w,
            pod.and_then(|p| p.endpoint.as_ref()),
            &host_veth,
            &set_up.container_mac,
            ips,
        )?;
        wep.spec.ip_nats = nats.to_vec();
        if let Some(p) = pod
            && store.kube().is_some()
        {
            // The write is a patch of this pod: its uid makes it a precondition, so a pod
            // re-created under the same name meanwhile is not patched.
            wep.metadata.uid = p.uid.clone();
        }
        let status_file = margay_api::endpoint::endpoint_status_file_name(
            &wep.spec.orchestrator,
            &wep.spec
                .workload_id(&wep.metadata.namespace, &wep.metadata.name),
            &wep.spec.endpoint_id(),
        );
        store
            .client
            .apply(Resource::WorkloadEndpoint(wep))
            .await
            .map_err(|e| datastore_error("writing the WorkloadEndpoint", e))?;
        tracing::debug!(elapsed = ?started.elapsed(), "endpoint written");
        if self.conf.policy_setup_timeout_seconds > 0 {
            // Wait (bounded) for Felix to report the endpoint's policy in place, as Calico's
            // plugin does; a timeout lets the pod start anyway.
            let dir = if self.conf.endpoint_status_dir.is_empty() {
                PathBuf::from("/var/run/calico/endpoint-status")
            } else {
                PathBuf::from(&self.conf.endpoint_status_dir)
            };
            let path = dir.join(&status_file);
            let limit = std::time::Duration::from_secs(
                u64::try_from(self.conf.policy_setup_timeout_seconds).unwrap_or(0),
            );
            let waited = std::time::Instant::now();
            loop {
                if path.exists() {
                    tracing::info!(elapsed = ?waited.elapsed(), "policy for the endpoint is in place");
                    break;
                }
                if waited.elapsed() >= limit {
                    tracing::warn!(
                        file = %path.display(),
                        "Felix did not report the endpoint's policy within policy_setup_timeout_seconds; unblocking pod creation"
                    );
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        let mut result = CniResult {
            interfaces: vec![
                Interface {
                    name: host_veth,
                    ..Interface::default()
                },
                Interface {
                    name: self.args.ifname.clone(),
                    mac: set_up.container_mac,
                    mtu: Some(mtu),
                    sandbox: self.args.netns.clone(),
                },
            ],
            ..CniResult::default()
        };
        // The default routes set up in the container.
        if ips.iter().any(IpAddr::is_ipv4) {
            result.routes.push(crate::spec::Route {
                dst: "0.0.0.0/0".into(),
                gw: Some(IpAddr::V4(crate::workload::GATEWAY_V4)),
            });
        }
        if let Some(gw) = set_up.gateway_v6 {
            result.routes.push(crate::spec::Route {
                dst: "::/0".into(),
                gw: Some(IpAddr::V6(gw)),
            });
        }
        result.ips = ips
            .iter()
            .map(|ip| IpConfig {
                ip: *ip,
                prefix: if ip.is_ipv4() { 32 } else { 128 },
                gateway: None,
                interface: Some(1),
            })
            .collect();
        Ok(result)
    }

    /// Undoes a failed ADD: the container's addresses, its interfaces and its endpoint.
    async fn roll_back(&self, store: &Store, ident: &Identity) {
        if self.builtin_ipam() {
            if let Err(e) = store.ipam.release_by_handle(&ident.handle()).await {
                tracing::error!(handle = %ident.handle(), "releasing the addresses of a failed ADD: {e}");
            }
        } else if let Err(e) = self.delegate("DEL").await {
            tracing::error!("releasing the addresses of a failed ADD: {e}");
        }
        let hv = ident.host_veth_name();
        if let Err(e) = blocking(move || dataplane::delete_host_link(&hv)).await {
            tracing::error!("removing the interfaces of a failed ADD: {e}");
        }
        if let Ok(key) = self.endpoint_key(ident)
            && let Ok(Resource::WorkloadEndpoint(wep)) = store.client.get(&key).await
            && wep.spec.container_id == self.args.container_id
            && let Err(e) = store
                .client
                .delete(&key, Some(&wep.metadata.resource_version))
                .await
        {
            tracing::error!("removing the endpoint of a failed ADD: {e}");
        }
    }

    fn endpoint_key(&self, ident: &Identity) -> Result<ResourceKey, CniError> {
        Ok(ResourceKey {
            kind: Kind::WorkloadEndpoint,
            namespace: ident.namespace.clone(),
            name: ident.endpoint_name()?,
        })
    }

    // ---- DEL --------------------------------------------------------------------------------

    async fn del(&self) -> Result<(), CniError> {
        let w = self.workload()?;
        let node = self.nodename().await?;
        let ident = self.identity(&w, &node);
        let _slot = Slot::acquire(&config::lock_path(&self.conf, &self.env), &self.env).await;
        let mut errors: Vec<CniError> = Vec::new();
        let store = match self.connect().await {
            Ok(s) => Some(s),
            Err(e) => {
                errors.push(e);
                None
            }
        };
        tracing::info!(container = %self.args.container_id, handle = %ident.handle(), "DEL");
        let mut host_veth_from_wep = None;
        if self.kind == PluginKind::Main
            && let Some(store) = &store
        {
            match self.delete_endpoint(store, &ident).await {
                Ok(iface) => host_veth_from_wep = iface,
                Err(e) => errors.push(e),
            }
        }
        if self.kind == PluginKind::Main {
            if self.args.netns.is_empty() {
                // No namespace to clean: remove the host side the endpoint named, if it was ours.
                if let Some(hv) = host_veth_from_wep
                    && let Err(e) = blocking(move || dataplane::delete_host_link(&hv)).await
                {
                    errors.push(e);
                }
            } else {
                let (netns, ifname) = (PathBuf::from(&self.args.netns), self.args.ifname.clone());
                match blocking(move || dataplane::tear_down(&netns, &ifname)).await {
                    Ok(true) => tracing::info!("deleted the container's interface"),
                    Ok(false) => {
                        tracing::info!("the container's interface or namespace was already gone")
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
        if !self.builtin_ipam() {
            if let Err(e) = self.delegate("DEL").await {
                errors.push(e);
            }
        } else if let Some(store) = &store {
            for handle in [ident.handle(), ident.legacy_handle()] {
                match store.ipam.release_by_handle(&handle).await {
                    Ok(ips) if !ips.is_empty() => {
                        tracing::info!(%handle, ?ips, "released");
                    }
                    Ok(_) => tracing::debug!(%handle, "nothing held by the handle"),
                    Err(e) => errors.push(ipam_error(e)),
                }
            }
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            n => {
                let first = errors[0].code;
                let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
                Err(CniError::new(
                    first,
                    format!("DEL met {n} errors; everything else was cleaned up"),
                )
                .with_details(all.join("; ")))
            }
        }
    }

    /// Deletes the container's WorkloadEndpoint if it belongs to this container (a DEL for
    /// an old sandbox of a pod leaves the current one's endpoint alone). Returns the
    /// endpoint's host interface when it was this container's.
    async fn delete_endpoint(
        &self,
        store: &Store,
        ident: &Identity,
    ) -> Result<Option<String>, CniError> {
        let key = self.endpoint_key(ident)?;
        for _ in 0..5 {
            let wep: WorkloadEndpoint = match store.client.get(&key).await {
                Ok(Resource::WorkloadEndpoint(w)) => w,
                Ok(_) | Err(DatastoreError::NotFound { .. }) => {
                    tracing::info!(endpoint = %key, "no WorkloadEndpoint to delete");
                    return Ok(None);
                }
                Err(e) => return Err(datastore_error("reading the WorkloadEndpoint", e)),
            };
            if !wep.spec.container_id.is_empty() && wep.spec.container_id != self.args.container_id
            {
                tracing::warn!(endpoint = %key, current = %wep.spec.container_id, "the endpoint belongs to another container of the pod; keeping it");
                return Ok(None);
            }
            match store
                .client
                .delete(&key, Some(&wep.metadata.resource_version))
                .await
            {
                Ok(_) | Err(DatastoreError::NotFound { .. }) => {
                    return Ok(Some(wep.spec.interface_name));
                }
                Err(DatastoreError::Conflict { .. }) => continue,
                Err(e) => return Err(datastore_error("deleting the WorkloadEndpoint", e)),
            }
        }
        Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!("{key} kept changing while it was being deleted; try again later"),
        ))
    }

    // ---- CHECK ------------------------------------------------------------------------------

    async fn check(&self) -> Result<(), CniError> {
        let prev = self
            .conf
            .prev_result
            .as_ref()
            .filter(|v| !v.is_null())
            .ok_or_else(|| {
                CniError::new(
                    code::INVALID_CONFIG,
                    "CHECK needs prevResult in the network configuration (the result of ADD)",
                )
            })?;
        let prev = CniResult::from_json(prev)
            .map_err(|e| CniError::new(code::INVALID_CONFIG, format!("prevResult: {e}")))?;
        let w = self.workload()?;
        let node = self.nodename().await?;
        let ident = self.identity(&w, &node);
        let store = self.connect().await?;
        if prev.ips.is_empty() && prev.interfaces.is_empty() && self.looks_up_pods(&ident, &store) {
            // The empty result ADD gives a host-network pod: nothing to check.
            let pod = bounded_lookup(&ident, async {
                let kube = self.kube_client(&store).await?;
                self.read_pod(&kube, &ident).await
            })
            .await?;
            if pod.host_network {
                return Ok(());
            }
        }
        let mut problems = Vec::new();
        let expected: BTreeSet<IpAddr> = prev.ips.iter().map(|i| i.ip).collect();
        if expected.is_empty() {
            problems.push("prevResult has no addresses".to_string());
        }
        if self.builtin_ipam() {
            let held: BTreeSet<IpAddr> = store
                .ipam
                .ips_by_handle(&ident.handle())
                .await
                .map_err(ipam_error)?
                .iter()
                .map(|a| a.ip)
                .collect();
            if held != expected {
                problems.push(format!(
                    "IPAM handle {} holds {:?}, prevResult says {:?}",
                    ident.handle(),
                    held,
                    expected
                ));
            }
        } else if let Err(e) = self.delegate("CHECK").await {
            problems.push(e.to_string());
        }
        if self.kind == PluginKind::Main {
            let host_veth = ident.host_veth_name();
            let key = self.endpoint_key(&ident)?;
            match store.client.get(&key).await {
                Ok(Resource::WorkloadEndpoint(wep)) => {
                    if wep.spec.container_id != self.args.container_id {
                        problems.push(format!(
                            "WorkloadEndpoint {key} belongs to container {}",
                            wep.spec.container_id
                        ));
                    }
                    if wep.spec.interface_name != host_veth {
                        problems.push(format!(
                            "WorkloadEndpoint {key} names interface {}, expected {host_veth}",
                            wep.spec.interface_name
                        ));
                    }
                    let nets: BTreeSet<IpAddr> = wep
                        .spec
                        .ip_networks
                        .iter()
                        .filter_map(|n| crate::spec::parse_cidr(n).map(|(ip, _)| ip))
                        .collect();
                    if nets != expected {
                        problems.push(format!(
                            "WorkloadEndpoint {key} has ipNetworks {:?}, expected {:?}",
                            wep.spec.ip_networks, expected
                        ));
                    }
                }
                Ok(_) | Err(DatastoreError::NotFound { .. }) => {
                    problems.push(format!("WorkloadEndpoint {key} does not exist"));
                }
                Err(e) => return Err(datastore_error("reading the WorkloadEndpoint", e)),
            }
            let (netns, ifname, ips) = (
                PathBuf::from(&self.args.netns),
                self.args.ifname.clone(),
                expected.iter().copied().collect::<Vec<_>>(),
            );
            let hv = host_veth.clone();
            let mtu = self.mtu();
            let found = blocking(move || {
                dataplane::check(&dataplane::Spec {
                    host_veth: &hv,
                    ifname: &ifname,
                    netns: &netns,
                    mtu,
                    ips: &ips,
                    allow_ip_forwarding: false,
                })
            })
            .await?;
            problems.extend(found);
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(CniError::new(
                code::CHECK_FAILED,
                format!(
                    "CHECK found {} problem(s) with container {}",
                    problems.len(),
                    self.args.container_id
                ),
            )
            .with_details(problems.join("; ")))
        }
    }

    // ---- STATUS -----------------------------------------------------------------------------

    async fn status(&self) -> Result<(), CniError> {
        let unavailable = |e: CniError| CniError {
            code: code::NOT_AVAILABLE,
            ..e
        };
        let store = self.connect().await.map_err(unavailable)?;
        store
            .client
            .backend()
            .revision()
            .await
            .map_err(|e| unavailable(datastore_error("the datastore does not answer", e)))?;
        if !self.builtin_ipam() {
            return Ok(()); // the delegated IPAM plugin's pools are its own business
        }
        let node = self.nodename().await.ok();
        let pools = store
            .ipam
            .pools()
            .await
            .map_err(|e| unavailable(ipam_error(e)))?;
        let blocks = store
            .ipam
            .blocks()
            .await
            .map_err(|e| unavailable(ipam_error(e)))?;
        let reservations = store
            .ipam
            .reservations()
            .await
            .map_err(|e| unavailable(ipam_error(e)))?;
        let labels = match &node {
            Some(n) => match store
                .client
                .get(&ResourceKey {
                    kind: Kind::Node,
                    namespace: String::new(),
                    name: n.clone(),
                })
                .await
            {
                Ok(r) => r.metadata().labels.clone(),
                Err(_) => Default::default(),
            },
            None => Default::default(),
        };
        for (version, wanted, requested) in [
            (4u8, self.conf.ipam.v4(), &self.conf.ipam.ipv4_pools),
            (6u8, self.conf.ipam.v6(), &self.conf.ipam.ipv6_pools),
        ] {
            if !wanted {
                continue;
            }
            let usable = margay_ipam::pools::select_pools(
                &pools,
                version,
                requested,
                &labels,
                margay_api::ippool::AllowedUse::Workload,
            )
            .map_err(|e| unavailable(ipam_error(e)))?;
            if usable.is_empty() {
                return Err(CniError::new(
                    code::NOT_AVAILABLE,
                    format!(
                        "no enabled IPv{version} pool can be used by this node; create one with `margay ctl apply`"
                    ),
                ));
            }
            let free: u128 = usable
                .iter()
                .map(|p| margay_ipam::usage::pool_usage(p, &blocks, &reservations).free())
                .sum();
            if free == 0 {
                let names: Vec<&str> = usable.iter().map(|p| p.name.as_str()).collect();
                return Err(CniError::new(
                    code::NOT_AVAILABLE,
                    format!(
                        "the IPv{version} pools {names:?} have no free address; add a pool or free addresses"
                    ),
                ));
            }
        }
        Ok(())
    }

    // ---- GC ---------------------------------------------------------------------------------

    /// Releases what this node holds for attachments of this network that the runtime no
    /// longer lists in `cni.dev/valid-attachments`.
    async fn gc(&self) -> Result<(), CniError> {
        if !self.builtin_ipam() {
            tracing::info!(
                "GC: addresses belong to the delegated IPAM plugin; nothing for margay to collect"
            );
            return Ok(());
        }
        let valid: HashSet<(String, String)> = self
            .conf_value("cni.dev/valid-attachments")
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|a| {
                Some((
                    a.get("containerID")?.as_str()?.to_string(),
                    a.get("ifname")?.as_str()?.to_string(),
                ))
            })
            .collect();
        let valid_ids: HashSet<&str> = valid.iter().map(|(c, _)| c.as_str()).collect();
        let node = self.nodename().await?;
        let store = self.connect().await?;
        let prefix = format!("{}.", self.conf.name);
        let blocks = store.ipam.blocks().await.map_err(ipam_error)?;
        let mut stale: BTreeSet<String> = BTreeSet::new();
        for b in &blocks {
            for a in b.allocated() {
                let Some(h) = a.attribute.handle_id.as_deref() else {
                    continue;
                };
                let Some(cid) = h.strip_prefix(&prefix) else {
                    continue;
                };
                if a.attribute.attrs.get("node").map(String::as_str) == Some(node.as_str())
                    && !valid_ids.contains(cid)
                {
                    stale.insert(h.to_string());
                }
            }
        }
        let mut errors = Vec::new();
        for h in &stale {
            match store.ipam.release_by_handle(h).await {
                Ok(ips) => tracing::info!(handle = %h, ?ips, "GC released"),
                Err(e) => errors.push(ipam_error(e).to_string()),
            }
        }
        if self.kind == PluginKind::Main {
            let listed = store
                .client
                .list(Kind::WorkloadEndpoint, None, "")
                .await
                .map_err(|e| datastore_error("listing WorkloadEndpoints", e))?;
            for r in listed.items {
                let Resource::WorkloadEndpoint(wep) = r else {
                    continue;
                };
                // Only endpoints whose addresses this GC just released: endpoints of other
                // networks on this node are not in this network's valid attachments.
                let handle = margay_ipam::workload_handle(&self.conf.name, &wep.spec.container_id);
                if wep.spec.node != node
                    || wep.spec.container_id.is_empty()
                    || valid_ids.contains(wep.spec.container_id.as_str())
                    || !stale.contains(&handle)
                {
                    continue;
                }
                let key = ResourceKey {
                    kind: Kind::WorkloadEndpoint,
                    namespace: wep.metadata.namespace.clone(),
                    name: wep.metadata.name.clone(),
                };
                match store
                    .client
                    .delete(&key, Some(&wep.metadata.resource_version))
                    .await
                {
                    Ok(_) | Err(DatastoreError::NotFound { .. }) => {
                        tracing::info!(endpoint = %key, "GC deleted the endpoint");
                        let hv = wep.spec.interface_name.clone();
                        if !hv.is_empty()
                            && let Err(e) = blocking(move || dataplane::delete_host_link(&hv)).await
                        {
                            errors.push(e.to_string());
                        }
                    }
                    Err(e) => errors.push(format!("{key}: {e}")),
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(
                CniError::new(code::PLUGIN, format!("GC met {} error(s)", errors.len()))
                    .with_details(errors.join("; ")),
            )
        }
    }

    fn conf_value(&self, field: &str) -> Option<Value> {
        self.raw.get(field).cloned()
    }
}

fn node_of(ident: &Identity) -> String {
    ident.node.clone()
}

/// Helper for tests and tools: the nodename file path a config resolves to.
pub fn nodename_file(conf: &NetConf) -> &Path {
    if conf.nodename_file.is_empty() {
        Path::new(DEFAULT_NODENAME_FILE)
    } else {
        Path::new(&conf.nodename_file)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn call(kind: PluginKind, env: &[(&str, &str)], stdin: &str) -> (u8, Value) {
        let env: Env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut out = Vec::new();
        let code = run(kind, &env, stdin.as_bytes(), &mut out);
        let v = if out.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&out).unwrap()
        };
        (code, v)
    }

    const ENV: &[(&str, &str)] = &[
        ("CNI_CONTAINERID", "abc"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_NETNS", "/run/netns/mgy-nowhere"),
        ("CNI_PATH", "/opt/cni/bin"),
    ];

    fn with(cmd: &str) -> Vec<(&str, &str)> {
        let mut e = ENV.to_vec();
        e.push(("CNI_COMMAND", cmd));
        e
    }

    #[test]
    fn version_answers_in_the_requested_version() {
        let (code, v) = call(
            PluginKind::Main,
            &[("CNI_COMMAND", "VERSION")],
            r#"{"cniVersion":"0.4.0"}"#,
        );
        assert_eq!(code, 0);
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(v["supportedVersions"].as_array().unwrap().len(), 5);
        let (_, v) = call(PluginKind::Ipam, &[("CNI_COMMAND", "VERSION")], "");
        assert_eq!(v["cniVersion"], "1.1.0");
    }

    #[test]
    fn commands_the_config_version_does_not_have_are_refused() {
        let (code, v) = call(
            PluginKind::Main,
            &with("CHECK"),
            r#"{"cniVersion":"0.3.1","name":"n","type":"margay"}"#,
        );
        assert_eq!(code, 1);
        assert_eq!(v["code"], 1);
        assert_eq!(v["cniVersion"], "0.3.1");
        let (_, v) = call(
            PluginKind::Main,
            &with("STATUS"),
            r#"{"cniVersion":"1.0.0","name":"n","type":"margay"}"#,
        );
        assert_eq!(v["code"], 1, "{v}");
        assert!(v["msg"].as_str().unwrap().contains("STATUS"), "{v}");
    }

    #[test]
    fn input_errors_come_back_as_cni_errors() {
        let (code, v) = call(PluginKind::Main, &with("ADD"), "{]");
        assert_eq!((code, v["code"].as_u64()), (1, Some(6)));
        let (_, v) = call(
            PluginKind::Main,
            &[("CNI_COMMAND", "ADD")],
            r#"{"cniVersion":"1.0.0","name":"n"}"#,
        );
        assert_eq!(v["code"], 4);
        assert!(
            v["msg"].as_str().unwrap().contains("CNI_CONTAINERID"),
            "{v}"
        );
        let (_, v) = call(
            PluginKind::Main,
            &with("ADD"),
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"host-local"}}"#,
        );
        assert_eq!(v["code"], 7);
        assert!(v["msg"].as_str().unwrap().contains("host-local"), "{v}");
        assert!(v["msg"].as_str().unwrap().contains("CNI_PATH"), "{v}");
        let (_, v) = call(
            PluginKind::Main,
            &with("ADD"),
            r#"{"cniVersion":"0.2.0","name":"n"}"#,
        );
        assert_eq!(v["code"], 1);
    }

    #[test]
    fn a_missing_nodename_file_is_explained() {
        let dir = tempfile::tempdir().unwrap();
        let conf = serde_json::json!({
            "cniVersion": "1.0.0", "name": "n", "type": "margay",
            "nodename_file": dir.path().join("nodename"),
        });
        let t = std::time::Instant::now();
        let (code, v) = call(PluginKind::Main, &with("DEL"), &conf.to_string());
        assert_eq!(code, 1);
        assert_eq!(v["code"], code::NODENAME);
        assert!(v["msg"].as_str().unwrap().contains("margay node"), "{v}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn an_unreachable_datastore_means_try_again_later() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nodename"), "n1").unwrap();
        let conf = serde_json::json!({
            "cniVersion": "1.0.0", "name": "n", "type": "margay",
            "nodename_file": dir.path().join("nodename"),
            "datastore_type": "local",
            "datastore_path": dir.path().join("no-such-store.db"),
            "ipam_lock_file": dir.path().join("ipam.lock"),
        });
        let (code, v) = call(PluginKind::Ipam, &with("ADD"), &conf.to_string());
        assert_eq!(code, 1);
        assert_eq!(v["code"], code::TRY_AGAIN_LATER, "{v}");
        assert!(!dir.path().join("no-such-store.db").exists());
    }
}
