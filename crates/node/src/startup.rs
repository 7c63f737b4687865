//! `margay node startup`: register this node the way calico-node's start-up does.
//!
//! Order (Calico's): node name → datastore (optionally waiting for it) → the cluster's
//! kubeadm-config and full-cluster-state ConfigMaps and the Kubernetes Node, when a Kubernetes
//! API is configured ([`ClusterSource`], [`crate::kubernetes`]) → read or build the Node →
//! addresses (given or autodetected) and conflict check → AS number → node reference → create
//! or update the Node (compare-and-swap, retried) → directories → default IP pools (kubeadm's
//! pod CIDRs when CALICO_IPV4POOL_CIDR / CALICO_IPV6POOL_CIDR are unset) → VXLAN tunnel
//! addresses (calico-node's allocate-tunnel-addrs, see [`crate::tunnel`]) → default cluster
//! configuration → node name file. Every step only writes what is missing or changed, so
//! running start-up twice changes nothing the second time.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use margay_api::endpoint::{NodeBgpSpec, NodeInterface, OrchRef};
use margay_api::ippool::{IPAMConfigurationSpec, IPPoolSpec, VmAddressPersistence};
use margay_api::net::Cidr;
use margay_api::policy::{Action, TierSpec};
use margay_api::{
    BGPConfiguration, ClusterInformation, FelixConfiguration, IPAMConfiguration, IPPool, Kind,
    Node, ObjectMeta, Resource, ResourceKey, Tier,
};
use margay_datastore::{Client, DatastoreError, KvBackend};

use crate::autodetect::{self, Family, InterfaceInfo, Method, NetView};
use crate::config::{
    AddressSetting, DEFAULT_IPV4_POOL_CIDR, DEFAULT_IPV4_POOL_NAME, DEFAULT_IPV6_POOL_NAME,
    NetworkingBackend, PoolParams, PoolSetting, StartupConfig,
};
use crate::kubernetes::{
    ClusterFacts, KUBEADM_CONFIG, KubeCluster, RANCHER_STATE, cluster_types, internal_ips,
    k8s_node_name, kubeadm_pod_subnets,
};

mod addresses;
use addresses::*;

mod defaults;
use defaults::*;

/// Why start-up failed; each message says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot determine the node name: {0}")]
    NodeName(String),
    #[error("datastore: {0}")]
    Datastore(#[from] DatastoreError),
    #[error("{0}")]
    Address(String),
    #[error("address conflict: {0}")]
    Conflict(String),
    #[error("{path}: {error} (run as root, or use --root to place margay's directories elsewhere)")]
    Filesystem { path: PathBuf, error: String },
    #[error(transparent)]
    Tunnel(#[from] crate::tunnel::TunnelError),
    /// Creating the Node found nothing to create it on: in the Kubernetes datastore a Calico
    /// Node is the cluster's Kubernetes Node, which only the kubelet registers.
    #[error(
        "there is no node {0:?} to register: in the Kubernetes datastore Calico's Nodes are the cluster's Kubernetes Nodes, which only the kubelet creates; check that this host joined the cluster and that NODENAME (or the hostname) is its Kubernetes node name"
    )]
    NoSuchNode(String),
    /// CALICO_K8S_NODE_REF names a Kubernetes Node the cluster does not have.
    #[error(
        "CALICO_K8S_NODE_REF={0:?}: the cluster has no Kubernetes Node of that name; set it to this host's Kubernetes node name (or unset it to use the node name)"
    )]
    NoSuchNodeRef(String),
    /// Reading the cluster (ConfigMaps, the Kubernetes Node) failed.
    #[error(transparent)]
    Kubernetes(#[from] crate::kubernetes::KubeError),
    #[error("default IPv{version} pool: {var}: {message}")]
    Pool {
        version: u8,
        var: &'static str,
        message: String,
    },
}

/// Where start-up keeps its files. `root` prefixes the default paths so tests (and unusual
/// installs) never touch the real ones.
#[derive(Debug, Clone)]
pub struct Paths {
    pub root: PathBuf,
}

impl Paths {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Paths { root: root.into() }
    }

    fn under(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }

    pub fn run_dir(&self) -> PathBuf {
        self.under("/var/run/calico")
    }

    pub fn lib_dir(&self) -> PathBuf {
        self.under("/var/lib/calico")
    }

    pub fn log_dir(&self) -> PathBuf {
        self.under("/var/log/calico")
    }

    /// CALICO_NODENAME_FILE as given, else the default under `root`.
    pub fn nodename_file(&self, cfg: &StartupConfig) -> PathBuf {
        if cfg.nodename_file == Path::new(crate::config::DEFAULT_NODENAME_FILE) {
            self.under(crate::config::DEFAULT_NODENAME_FILE)
        } else {
            cfg.nodename_file.clone()
        }
    }
}

/// Where the node name came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameSource {
    NodenameEnv,
    File(PathBuf),
    HostnameEnv,
    KernelHostname,
}

/// Calico's order: NODENAME, then the node name file, then HOSTNAME (lower-cased), then the
/// kernel's host name (lower-cased).
pub fn node_name(
    get: &dyn Fn(&str) -> Option<String>,
    nodename_file: &Path,
    kernel_hostname: &dyn Fn() -> std::io::Result<String>,
) -> Result<(String, NameSource), StartupError> {
    if let Some(n) = get("NODENAME")
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
    {
        return Ok((n, NameSource::NodenameEnv));
    }
    match std::fs::read_to_string(nodename_file) {
        Ok(text) if !text.trim().is_empty() => {
            return Ok((
                text.trim().to_string(),
                NameSource::File(nodename_file.to_path_buf()),
            ));
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(StartupError::NodeName(format!(
                "cannot read {}: {e} (set NODENAME, or fix CALICO_NODENAME_FILE)",
                nodename_file.display()
            )));
        }
    }
    if let Some(h) = get("HOSTNAME")
        .map(|v| v.trim().to_lowercase())
        .filter(|v| !v.is_empty())
    {
        return Ok((h, NameSource::HostnameEnv));
    }
    let h = kernel_hostname().map_err(|e| {
        StartupError::NodeName(format!("cannot read the host name: {e} (set NODENAME)"))
    })?;
    let h = h.trim().to_lowercase();
    if h.is_empty() {
        return Err(StartupError::NodeName(
            "the host name is empty (set NODENAME)".into(),
        ));
    }
    Ok((h, NameSource::KernelHostname))
}

/// The kernel's host name.
pub fn kernel_hostname() -> std::io::Result<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
}

/// What start-up did, for the summary line and for tests.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub node_name: String,
    /// The Node was created or changed.
    pub node_written: bool,
    pub ipv4: Option<String>,
    pub ipv6: Option<String>,
    /// Resources start-up created or completed (e.g. `IPPool "default-ipv4-ippool"`).
    pub created: Vec<String>,
    /// Why each address was chosen.
    pub decisions: Vec<String>,
    /// The VXLAN tunnel address step.
    pub tunnel: crate::tunnel::TunnelOutcome,
}

/// Options that are not Calico settings.
#[derive(Debug, Clone)]
pub struct StartupOptions {
    /// Reported in ClusterInformation.calicoVersion.
    pub version: String,
    /// With WAIT_FOR_DATASTORE=true: give up after this long (None: wait forever, as Calico).
    pub wait_timeout: Option<Duration>,
    /// Whether /proc/sys/net/ipv6 exists (IPv6 pools need it).
    pub kernel_has_ipv6: bool,
    /// The datastore is the Kubernetes API, where Calico's start-up leaves per-node Felix
    /// configuration to the DaemonSet's FELIX_* variables (no FelixConfiguration `node.<name>`).
    pub kubernetes_datastore: bool,
}

/// A snapshot of the host's interfaces for the duration of start-up; route lookups are made
/// live (a UDP `connect`, which sends nothing).
pub struct NetSnapshot {
    pub interfaces: Vec<InterfaceInfo>,
}

impl NetView for NetSnapshot {
    fn interfaces(&self) -> std::io::Result<Vec<InterfaceInfo>> {
        Ok(self.interfaces.clone())
    }

    fn route_source(&self, dest: IpAddr) -> std::io::Result<IpAddr> {
        let bind: std::net::SocketAddr = if dest.is_ipv4() {
            "0.0.0.0:0".parse().map_err(std::io::Error::other)?
        } else {
            "[::]:0".parse().map_err(std::io::Error::other)?
        };
        let sock = std::net::UdpSocket::bind(bind)?;
        sock.connect((dest, 9))?;
        Ok(sock.local_addr()?.ip())
    }
}

const WRITE_ATTEMPTS: usize = 5;

/// Where start-up learns about the Kubernetes cluster it runs in.
pub enum ClusterSource<'a> {
    /// No Kubernetes API is configured: nothing is read.
    None,
    /// Facts known already (tests).
    Known(ClusterFacts),
    /// Read from the API, after the datastore is ready.
    Api(&'a KubeCluster),
}

/// Runs start-up for `node_name` against `client`, outside Kubernetes.
pub async fn run<B: KvBackend + Clone>(
    cfg: &StartupConfig,
    node_name: &str,
    client: &Client<B>,
    net: &dyn NetView,
    paths: &Paths,
    opts: &StartupOptions,
) -> Result<Outcome, StartupError> {
    run_in_cluster(
        cfg,
        node_name,
        client,
        net,
        paths,
        opts,
        ClusterSource::None,
    )
    .await
}

/// Runs start-up for `node_name` against `client`, with what `cluster` says about the
/// Kubernetes cluster.
pub async fn run_in_cluster<B: KvBackend + Clone>(
    cfg: &StartupConfig,
    node_name: &str,
    client: &Client<B>,
    net: &dyn NetView,
    paths: &Paths,
    opts: &StartupOptions,
    cluster: ClusterSource<'_>,
) -> Result<Outcome, StartupError> {
    let mut outcome = Outcome {
        node_name: node_name.to_string(),
        ..Outcome::default()
    };
    if cfg.wait_for_datastore {
        wait_for_datastore(client, opts.wait_timeout).await?;
    }
    let k8s_node = k8s_node_name(node_name, cfg.k8s_node_ref.as_deref());
    let facts = match cluster {
        ClusterSource::None => ClusterFacts::default(),
        ClusterSource::Known(f) => f,
        ClusterSource::Api(api) => read_cluster(api, k8s_node, node_name).await?,
    };
    register_node(cfg, node_name, client, net, &facts, &mut outcome).await?;
    ensure_directories(cfg, paths)?;
    ensure_pools(cfg, client, net, opts, &facts, &mut outcome).await?;
    let ipam = margay_ipam::Ipam::new(client.backend().clone());
    outcome.tunnel = crate::tunnel::allocate_tunnel_addrs(client, &ipam, node_name).await?;
    ensure_defaults(cfg, node_name, client, opts, &facts, &mut outcome).await?;
    let file = paths.nodename_file(cfg);
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(|e| StartupError::Filesystem {
            path: dir.to_path_buf(),
            error: e.to_string(),
        })?;
    }
    // Written last: its presence tells the CNI plugin start-up completed.
    if std::fs::read_to_string(&file).ok().as_deref() != Some(node_name) {
        std::fs::write(&file, node_name).map_err(|e| StartupError::Filesystem {
            path: file.clone(),
            error: e.to_string(),
        })?;
    }
    Ok(outcome)
}

/// Calico's reads, in its order: kubeadm's and Rancher's ConfigMaps (absent or forbidden =
/// not that kind of cluster), then the Kubernetes Node (which must exist).
async fn read_cluster(
    api: &KubeCluster,
    k8s_node: &str,
    node_name: &str,
) -> Result<ClusterFacts, StartupError> {
    let kubeadm_config = api
        .optional_configmap(KUBEADM_CONFIG, "a kubeadm cluster")
        .await?;
    let rancher_state = api
        .optional_configmap(RANCHER_STATE, "a Rancher cluster")
        .await?
        .is_some();
    let node = match api.node(k8s_node).await? {
        Some(n) => n,
        None if k8s_node == node_name => {
            return Err(StartupError::NoSuchNode(k8s_node.to_string()));
        }
        None => return Err(StartupError::NoSuchNodeRef(k8s_node.to_string())),
    };
    tracing::info!(
        kubeadm = kubeadm_config.is_some(),
        rancher = rancher_state,
        k8s_node,
        "read the Kubernetes cluster's configuration"
    );
    Ok(ClusterFacts {
        kubernetes: true,
        kubeadm_config,
        rancher_state,
        internal_ips: internal_ips(&node),
    })
}

async fn wait_for_datastore<B: KvBackend>(
    client: &Client<B>,
    limit: Option<Duration>,
) -> Result<(), StartupError> {
    let start = tokio::time::Instant::now();
    let mut delay = Duration::from_millis(500);
    let probe = ResourceKey {
        kind: Kind::Node,
        namespace: String::new(),
        name: "margay-datastore-probe".into(),
    };
    for attempt in 1u64.. {
        match client.get(&probe).await {
            Ok(_) | Err(DatastoreError::NotFound { .. }) => {
                tracing::info!(attempt, "datastore is ready");
                return Ok(());
            }
            Err(e) if e.is_transient() => {
                if limit.is_some_and(|l| start.elapsed() + delay > l) {
                    return Err(StartupError::Datastore(e));
                }
                tracing::info!(attempt, retry_in = ?delay, error = %e, "waiting for the datastore");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            Err(e) => return Err(StartupError::Datastore(e)),
        }
    }
    Ok(())
}

/// Reads the Node (or starts a new one), applies the environment and autodetection to it,
/// and writes it if anything changed, retrying on concurrent changes.
async fn register_node<B: KvBackend>(
    cfg: &StartupConfig,
    node_name: &str,
    client: &Client<B>,
    net: &dyn NetView,
    facts: &ClusterFacts,
    outcome: &mut Outcome,
) -> Result<(), StartupError> {
    let key = ResourceKey {
        kind: Kind::Node,
        namespace: String::new(),
        name: node_name.to_string(),
    };
    let interfaces = net
        .interfaces()
        .map_err(|e| StartupError::Address(format!("cannot list the host's interfaces: {e}")))?;
    let snapshot = NetSnapshot { interfaces };
    for attempt in 1..=WRITE_ATTEMPTS {
        let (mut node, exists) = match client.get(&key).await {
            Ok(Resource::Node(n)) => (n, true),
            Ok(other) => {
                return Err(StartupError::Datastore(DatastoreError::invalid(format!(
                    "{key} holds a {}",
                    other.kind()
                ))));
            }
            Err(DatastoreError::NotFound { .. }) => {
                tracing::info!(node = node_name, "building a new Node resource");
                (
                    Node::new(ObjectMeta::named(node_name), Default::default()),
                    false,
                )
            }
            Err(e) => return Err(e.into()),
        };
        let before = node.clone();
        outcome.decisions.clear();
        let check_conflicts = configure_addresses(cfg, &mut node, &snapshot, facts, outcome)?;
        if check_conflicts
            && !cfg.disable_node_ip_check
            && let Err(conflict) = check_conflicts_with_others(client, &node).await?
        {
            if exists {
                clear_autodetected(cfg, client, &before).await;
            }
            return Err(StartupError::Conflict(conflict));
        }
        if cfg.backend != NetworkingBackend::None
            && let Some(asn) = cfg.as_number
        {
            node.spec
                .bgp
                .get_or_insert_with(NodeBgpSpec::default)
                .as_number = Some(asn);
        }
        if let Some(node_ref) = &cfg.k8s_node_ref {
            node.spec.orch_refs = vec![OrchRef {
                node_name: node_ref.clone(),
                orchestrator: "k8s".into(),
            }];
        }
        outcome.ipv4 = node
            .spec
            .bgp
            .as_ref()
            .map(|b| b.ipv4_address.clone())
            .filter(|a| !a.is_empty());
        outcome.ipv6 = node
            .spec
            .bgp
            .as_ref()
            .map(|b| b.ipv6_address.clone())
            .filter(|a| !a.is_empty());
        if exists && node == before {
            tracing::info!(node = node_name, "Node resource is up to date");
            return Ok(());
        }
        let result = if exists {
            client.update(Resource::Node(node)).await
        } else {
            client.create(Resource::Node(node)).await
        };
        match result {
            Ok(_) => {
                outcome.node_written = true;
                tracing::info!(node = node_name, created = !exists, "Node resource written");
                return Ok(());
            }
            // A create can only miss its target where Nodes are views of other objects.
            Err(DatastoreError::NotFound { .. }) if !exists => {
                return Err(StartupError::NoSuchNode(node_name.to_string()));
            }
            Err(DatastoreError::Conflict { .. } | DatastoreError::AlreadyExists { .. })
                if attempt < WRITE_ATTEMPTS =>
            {
                tracing::info!(
                    node = node_name,
                    attempt,
                    "Node changed concurrently; re-reading"
                );
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(StartupError::Datastore(DatastoreError::unavailable(
        format!("{key}: gave up after {WRITE_ATTEMPTS} concurrent changes"),
    )))
}

fn ensure_directories(cfg: &StartupConfig, paths: &Paths) -> Result<(), StartupError> {
    let mut dirs = vec![paths.lib_dir()];
    if cfg.backend == NetworkingBackend::Bird {
        dirs.push(paths.run_dir());
    }
    if !cfg.disable_file_logging {
        dirs.push(paths.log_dir());
    }
    for d in dirs {
        if !d.is_dir() {
            std::fs::create_dir_all(&d).map_err(|e| StartupError::Filesystem {
                path: d.clone(),
                error: e.to_string(),
            })?;
            tracing::info!(dir = %d.display(), "created directory");
        }
    }
    Ok(())
}
