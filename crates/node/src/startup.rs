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

/// Applies IP / IP6 and autodetection to the Node. Returns whether an address or the
/// interface list changed (then conflicts with other nodes are checked).
fn configure_addresses(
    cfg: &StartupConfig,
    node: &mut Node,
    net: &dyn NetView,
    facts: &ClusterFacts,
    outcome: &mut Outcome,
) -> Result<bool, StartupError> {
    if cfg.backend == NetworkingBackend::None {
        return Ok(false);
    }
    let mut bgp = node.spec.bgp.take().unwrap_or_default();
    let (old4, old6, old_ifaces) = (
        bgp.ipv4_address.clone(),
        bgp.ipv6_address.clone(),
        node.spec.interfaces.clone(),
    );

    // kubernetes-internal-ip reads the Kubernetes Node's InternalIPs: the Node read from the
    // cluster (CALICO_K8S_NODE_REF's, or this node's), else the Node's addresses of type
    // InternalIP, which the Kubernetes datastore derives from the same Kubernetes Node.
    let internal_ips: Vec<IpAddr> = if facts.kubernetes {
        facts.internal_ips.clone()
    } else {
        node.spec
            .addresses
            .iter()
            .filter(|a| a.type_ == "InternalIP")
            .filter_map(|a| a.address.parse().ok())
            .collect()
    };
    let v4_auto = matches!(cfg.ipv4, AddressSetting::Autodetect)
        || (cfg.ipv4 == AddressSetting::Unset && bgp.ipv4_address.is_empty());
    bgp.ipv4_address = choose(
        Family::V4,
        "IP",
        v4_auto,
        &cfg.ipv4,
        &cfg.ipv4_method,
        "IP_AUTODETECTION_METHOD",
        &bgp.ipv4_address,
        net,
        &internal_ips,
        outcome,
    )?;
    let v6_auto = matches!(cfg.ipv6, AddressSetting::Autodetect);
    bgp.ipv6_address = choose(
        Family::V6,
        "IP6",
        v6_auto,
        &cfg.ipv6,
        &cfg.ipv6_method,
        "IP6_AUTODETECTION_METHOD",
        &bgp.ipv6_address,
        net,
        &internal_ips,
        outcome,
    )?;

    // With IP or IP6 set, record the host's (non-excluded) interfaces on the Node, as Calico
    // does; otherwise the list is cleared.
    let explicit =
        |s: &AddressSetting| !matches!(s, AddressSetting::Unset | AddressSetting::Disabled);
    let mut families = Vec::new();
    if explicit(&cfg.ipv4) {
        families.push(true);
    }
    if explicit(&cfg.ipv6) {
        families.push(false);
    }
    let mut ifaces: Vec<NodeInterface> = Vec::new();
    if !families.is_empty() {
        let all = net.interfaces().map_err(|e| {
            StartupError::Address(format!("cannot list the host's interfaces: {e}"))
        })?;
        // Interfaces without an address of the families are listed too, as Calico does.
        for i in all
            .iter()
            .filter(|i| !autodetect::excluded_by_default(&i.name))
        {
            let addresses: Vec<String> = i
                .addrs
                .iter()
                .filter(|a| families.contains(&a.is_ipv4()))
                .map(|a| a.addr().to_string())
                .collect();
            ifaces.push(NodeInterface {
                name: i.name.clone(),
                addresses,
            });
        }
        ifaces.sort_by(|a, b| a.name.cmp(&b.name));
    }
    node.spec.interfaces = ifaces;

    if bgp.ipv4_address.is_empty() && bgp.ipv6_address.is_empty() {
        return Err(StartupError::Address(
            "no IPv4 or IPv6 address was configured or detected, and Calico networking needs one: set IP (or IP6) to an address or to autodetect, choose another IP_AUTODETECTION_METHOD, or set CALICO_NETWORKING_BACKEND=none".into(),
        ));
    }
    let changed =
        bgp.ipv4_address != old4 || bgp.ipv6_address != old6 || node.spec.interfaces != old_ifaces;
    node.spec.bgp = Some(bgp);
    Ok(changed)
}

/// One family's address: autodetected, given, kept or none.
#[allow(clippy::too_many_arguments)]
fn choose(
    family: Family,
    var: &'static str,
    autodetect_now: bool,
    setting: &AddressSetting,
    method: &str,
    method_var: &'static str,
    existing: &str,
    net: &dyn NetView,
    internal_ips: &[IpAddr],
    outcome: &mut Outcome,
) -> Result<String, StartupError> {
    let version = if matches!(family, Family::V4) { 4 } else { 6 };
    if autodetect_now {
        // An unknown method is fatal; a bad regex or CIDR only makes detection fail (a Node
        // that already has an address keeps it), as in Calico.
        let detected = match Method::parse(method) {
            Ok(m) => autodetect::autodetect(&m, family, net, internal_ips),
            Err(e @ autodetect::AutodetectError::UnknownMethod { .. }) => {
                return Err(StartupError::Config(crate::config::ConfigError {
                    var: method_var,
                    value: method.to_string(),
                    problem: e.to_string(),
                }));
            }
            Err(e) => Err(e),
        };
        return match detected {
            Ok(d) => {
                outcome.decisions.extend(d.decisions.iter().cloned());
                tracing::info!(address = %d.address, interface = %d.interface, "autodetected the IPv{version} address");
                Ok(d.address.to_string())
            }
            Err(e) if existing.is_empty() => Err(StartupError::Address(format!(
                "cannot autodetect an IPv{version} address: {e} (choose another {method_var}, or set {var} to the address)"
            ))),
            Err(e) => {
                tracing::warn!(error = %e, kept = existing, "IPv{version} autodetection failed; keeping the Node's current address");
                Ok(existing.to_string())
            }
        };
    }
    match setting {
        AddressSetting::Given(value) => {
            let given = if value.contains('/') {
                Cidr::parse(value)
                    .map_err(|e| StartupError::Address(format!("{var}={value:?}: {e}")))?
            } else {
                let ip: IpAddr = value.parse().map_err(|_| {
                    StartupError::Address(format!("{var}={value:?} is not an IP address or CIDR"))
                })?;
                // A bare address takes its prefix length from the interface that holds it.
                match autodetect::interface_holding(ip, net) {
                    Ok(Some((iface, cidr))) => {
                        outcome
                            .decisions
                            .push(format!("{var}={value}: found on {iface} as {cidr}"));
                        cidr
                    }
                    _ => {
                        tracing::warn!(
                            "{var}={value} is not assigned to any interface of this host"
                        );
                        Cidr::host(ip)
                    }
                }
            };
            if given.version() != version {
                return Err(StartupError::Address(format!(
                    "{var}={value:?} is not an IPv{version} address"
                )));
            }
            Ok(given.to_string())
        }
        // Unset (with an address already on the Node) or none: keep what is there.
        _ => Ok(existing.to_string()),
    }
}

/// Another node using one of our addresses is a conflict: returns the message naming both.
async fn check_conflicts_with_others<B: KvBackend>(
    client: &Client<B>,
    node: &Node,
) -> Result<Result<(), String>, StartupError> {
    let ours = |s: &str| Cidr::parse_cidr_or_ip(s).ok().map(|c| c.addr());
    let bgp = node.spec.bgp.clone().unwrap_or_default();
    let (our4, our6) = (ours(&bgp.ipv4_address), ours(&bgp.ipv6_address));
    let nodes = client.list(Kind::Node, None, "").await?;
    for other in nodes.items {
        let Resource::Node(other) = other else {
            continue;
        };
        if other.metadata.name == node.metadata.name {
            continue;
        }
        let Some(theirs) = &other.spec.bgp else {
            continue;
        };
        for (mine, their) in [
            (our4, ours(&theirs.ipv4_address)),
            (our6, ours(&theirs.ipv6_address)),
        ] {
            if let (Some(m), Some(t)) = (mine, their)
                && m == t
            {
                return Ok(Err(format!(
                    "node {:?} is already using {m}, which this node {:?} would use: give each node its own address (IP / IP6), pick another interface with IP_AUTODETECTION_METHOD, or set DISABLE_NODE_IP_CHECK=true if this is intended",
                    other.metadata.name, node.metadata.name
                )));
            }
        }
    }
    Ok(Ok(()))
}

/// After a conflict, remove autodetected addresses from the stored Node so it does not keep
/// claiming another node's address.
async fn clear_autodetected<B: KvBackend>(cfg: &StartupConfig, client: &Client<B>, stored: &Node) {
    let mut node = stored.clone();
    let Some(bgp) = node.spec.bgp.as_mut() else {
        return;
    };
    let mut changed = false;
    if cfg.ipv4 == AddressSetting::Autodetect && !bgp.ipv4_address.is_empty() {
        bgp.ipv4_address.clear();
        changed = true;
    }
    if cfg.ipv6 == AddressSetting::Autodetect && !bgp.ipv6_address.is_empty() {
        bgp.ipv6_address.clear();
        changed = true;
    }
    if node
        .spec
        .bgp
        .as_ref()
        .is_some_and(|b| b == &NodeBgpSpec::default())
    {
        node.spec.bgp = None;
    }
    if changed && let Err(e) = client.update(Resource::Node(node)).await {
        tracing::warn!(error = %e, "could not clear the conflicting address from the Node");
    }
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

async fn ensure_pools<B: KvBackend>(
    cfg: &StartupConfig,
    client: &Client<B>,
    net: &dyn NetView,
    opts: &StartupOptions,
    facts: &ClusterFacts,
    outcome: &mut Outcome,
) -> Result<(), StartupError> {
    if cfg.ipv4_pool.is_none() && cfg.ipv6_pool.is_none() {
        tracing::info!("NO_DEFAULT_POOLS=true: not creating IP pools");
        return Ok(());
    }
    let pools = client.list(Kind::IPPool, None, "").await?;
    let present = |v4: bool| {
        pools.items.iter().any(|p| match p {
            Resource::IPPool(p) => Cidr::parse(&p.spec.cidr).is_ok_and(|c| c.is_ipv4() == v4),
            _ => false,
        })
    };
    // kubeadm's pod CIDRs stand in for CALICO_IPV4POOL_CIDR / CALICO_IPV6POOL_CIDR when
    // those are unset (Calico's rule).
    let kubeadm = facts
        .kubeadm_config
        .as_ref()
        .map(kubeadm_pod_subnets)
        .unwrap_or_default();
    let choose = |given: Option<Cidr>, from_kubeadm: Option<Cidr>, var: &'static str| match (
        given,
        from_kubeadm,
    ) {
        (Some(c), _) => Some((c.network(), var)),
        (None, Some(c)) => {
            tracing::info!(cidr = %c, "using the pod CIDR of ConfigMap kube-system/kubeadm-config ({var} is unset)");
            Some((c, KUBEADM_SOURCE))
        }
        (None, None) => None,
    };
    if let Some(PoolSetting::Create(params)) = &cfg.ipv4_pool {
        if present(true) {
            tracing::info!("an IPv4 pool exists; not creating the default one");
        } else {
            let (cidr, source) = choose(params.cidr, kubeadm.v4, "CALICO_IPV4POOL_CIDR")
                .unwrap_or_else(|| (default_ipv4_pool(net), "CALICO_IPV4POOL_CIDR"));
            create_pool(
                client,
                4,
                DEFAULT_IPV4_POOL_NAME,
                cidr,
                source,
                params,
                outcome,
            )
            .await?;
        }
    }
    if let Some(PoolSetting::Create(params)) = &cfg.ipv6_pool {
        if present(false) {
            tracing::info!("an IPv6 pool exists; not creating the default one");
        } else if !cfg.ipv6_support || !opts.kernel_has_ipv6 {
            tracing::info!(
                "IPv6 is not supported here (FELIX_IPV6SUPPORT or kernel); no default IPv6 pool"
            );
        } else {
            let (cidr, source) = choose(params.cidr, kubeadm.v6, "CALICO_IPV6POOL_CIDR")
                .unwrap_or_else(|| (random_ula_48(), "CALICO_IPV6POOL_CIDR"));
            create_pool(
                client,
                6,
                DEFAULT_IPV6_POOL_NAME,
                cidr,
                source,
                params,
                outcome,
            )
            .await?;
        }
    }
    Ok(())
}

/// Names kubeadm's ConfigMap as the source of a default pool's CIDR in errors.
const KUBEADM_SOURCE: &str = "podSubnet of ConfigMap kube-system/kubeadm-config (set CALICO_IPV4POOL_CIDR / CALICO_IPV6POOL_CIDR to override it)";

/// Calico's default IPv4 pool: 192.168.0.0/16, unless a host address is inside it, then the
/// first of 172.16-31.0.0/16 that holds none.
fn default_ipv4_pool(net: &dyn NetView) -> Cidr {
    let host: Vec<IpAddr> = net
        .interfaces()
        .unwrap_or_default()
        .iter()
        .flat_map(|i| i.addrs.iter().map(Cidr::addr))
        .filter(IpAddr::is_ipv4)
        .collect();
    let free = |c: &Cidr| !host.iter().any(|a| c.contains(*a));
    let preferred = Cidr::parse(DEFAULT_IPV4_POOL_CIDR)
        .unwrap_or_else(|_| Cidr::host(IpAddr::from([192, 168, 0, 0])));
    if free(&preferred) {
        return preferred;
    }
    for second in 16..=31u8 {
        if let Ok(c) = Cidr::new(IpAddr::from([172, second, 0, 0]), 16)
            && free(&c)
        {
            tracing::info!(pool = %c, "192.168.0.0/16 overlaps a host address; using a fallback");
            return c;
        }
    }
    preferred
}

/// fdXX:XXXX:XXXX::/48 with 40 random bits (RFC 4193), as Calico generates.
fn random_ula_48() -> Cidr {
    let uid = margay_datastore::util::new_uid().replace('-', "");
    let byte =
        |i: usize| u8::from_str_radix(uid.get(2 * i..2 * i + 2).unwrap_or("00"), 16).unwrap_or(0);
    let mut octets = [0u8; 16];
    octets[0] = 0xfd;
    for (i, o) in octets.iter_mut().enumerate().take(6).skip(1) {
        *o = byte(i);
    }
    Cidr::new(IpAddr::from(octets), 48).unwrap_or_else(|_| Cidr::host(IpAddr::from(octets)))
}

async fn create_pool<B: KvBackend>(
    client: &Client<B>,
    version: u8,
    name: &str,
    cidr: Cidr,
    source: &'static str,
    params: &PoolParams,
    outcome: &mut Outcome,
) -> Result<(), StartupError> {
    let spec = IPPoolSpec {
        cidr: cidr.to_string(),
        ipip_mode: Some(params.ipip),
        vxlan_mode: Some(params.vxlan),
        nat_outgoing: params.nat_outgoing,
        block_size: Some(params.block_size),
        node_selector: params.node_selector.clone(),
        disable_bgp_export: params.disable_bgp_export,
        ..IPPoolSpec::default()
    };
    let pool = Resource::IPPool(IPPool::new(ObjectMeta::named(name), spec));
    match client.create(pool).await {
        Ok(_) => {
            tracing::info!(pool = name, %cidr, nat_outgoing = params.nat_outgoing, ipip = ?params.ipip, vxlan = ?params.vxlan, "created the default IPv{version} pool");
            outcome.created.push(format!("IPPool {name:?} ({cidr})"));
            Ok(())
        }
        // Another node got there first.
        Err(DatastoreError::AlreadyExists { .. }) => Ok(()),
        Err(DatastoreError::Validation { errors, .. }) => Err(StartupError::Pool {
            version,
            var: source,
            message: format!("the pool {cidr} would be invalid: {errors}"),
        }),
        Err(e) => Err(e.into()),
    }
}

async fn ensure_defaults<B: KvBackend>(
    cfg: &StartupConfig,
    node_name: &str,
    client: &Client<B>,
    opts: &StartupOptions,
    facts: &ClusterFacts,
    outcome: &mut Outcome,
) -> Result<(), StartupError> {
    ensure_cluster_information(cfg, client, opts, facts, outcome).await?;
    for (name, order, action) in [
        (
            margay_api::policy::DEFAULT_TIER,
            margay_api::policy::DEFAULT_TIER_ORDER,
            Action::Deny,
        ),
        (
            margay_api::policy::KUBE_ADMIN_TIER,
            margay_api::policy::KUBE_ADMIN_TIER_ORDER,
            Action::Pass,
        ),
        (
            margay_api::policy::KUBE_BASELINE_TIER,
            margay_api::policy::KUBE_BASELINE_TIER_ORDER,
            Action::Pass,
        ),
    ] {
        let tier = Resource::Tier(Tier::new(
            ObjectMeta::named(name),
            TierSpec {
                order: Some(order),
                default_action: Some(action),
            },
        ));
        create_missing(client, tier, outcome).await?;
    }

    // FelixConfiguration "default": reporting off and Info logging unless set.
    complete_or_create(client, Kind::FelixConfiguration, "default", outcome, |r| {
        let Resource::FelixConfiguration(f) = r else {
            return false;
        };
        let mut changed = false;
        if f.spec.reporting_interval.is_none() {
            f.spec.reporting_interval = Some(margay_api::duration::Duration::new("0s"));
            changed = true;
        }
        if f.spec
            .log_severity_screen
            .as_deref()
            .unwrap_or_default()
            .is_empty()
        {
            f.spec.log_severity_screen = Some("Info".into());
            changed = true;
        }
        changed
    })
    .await?;
    // FelixConfiguration "node.<name>": workload-to-host traffic returns to the host's
    // chains unless set (Calico does this for non-Kubernetes datastores only).
    if !opts.kubernetes_datastore {
        complete_or_create(
            client,
            Kind::FelixConfiguration,
            &format!("node.{node_name}"),
            outcome,
            |r| {
                let Resource::FelixConfiguration(f) = r else {
                    return false;
                };
                if f.spec
                    .default_endpoint_to_host_action
                    .as_deref()
                    .unwrap_or_default()
                    .is_empty()
                {
                    f.spec.default_endpoint_to_host_action = Some("Return".into());
                    true
                } else {
                    false
                }
            },
        )
        .await?;
    }
    create_missing(
        client,
        Resource::BGPConfiguration(BGPConfiguration::new(
            ObjectMeta::named("default"),
            Default::default(),
        )),
        outcome,
    )
    .await?;
    let ipam = IPAMConfigurationSpec {
        strict_affinity: false,
        max_blocks_per_host: None,
        auto_allocate_blocks: true,
        kube_virt_vm_address_persistence: Some(VmAddressPersistence::Enabled),
        ip_cooldown_seconds: None,
    };
    create_missing(
        client,
        Resource::IPAMConfiguration(IPAMConfiguration::new(ObjectMeta::named("default"), ipam)),
        outcome,
    )
    .await?;
    let _ = cfg;
    Ok(())
}

async fn ensure_cluster_information<B: KvBackend>(
    cfg: &StartupConfig,
    client: &Client<B>,
    opts: &StartupOptions,
    facts: &ClusterFacts,
    outcome: &mut Outcome,
) -> Result<(), StartupError> {
    let version = opts.version.clone();
    let wanted_types = cluster_types(
        &cfg.cluster_type,
        facts.kubeadm_config.is_some(),
        facts.rancher_state,
        opts.kubernetes_datastore,
    );
    complete_or_create(client, Kind::ClusterInformation, "default", outcome, |r| {
        let Resource::ClusterInformation(ci) = r else {
            return false;
        };
        let s = &mut ci.spec;
        let mut changed = false;
        if !version.is_empty() && s.calico_version != version {
            s.calico_version = version.clone();
            changed = true;
        }
        if s.cluster_guid.is_empty() {
            s.cluster_guid = margay_datastore::util::new_uid().replace('-', "");
            changed = true;
        }
        if s.datastore_ready.is_none() {
            s.datastore_ready = Some(true);
            changed = true;
        }
        let mut types: Vec<String> = s
            .cluster_type
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect();
        for t in &wanted_types {
            if !types.contains(t) {
                types.push(t.clone());
                changed = true;
            }
        }
        s.cluster_type = types.join(",");
        changed
    })
    .await
}

/// Creates `r` unless a resource with its key exists (never overwrites).
async fn create_missing<B: KvBackend>(
    client: &Client<B>,
    r: Resource,
    outcome: &mut Outcome,
) -> Result<(), StartupError> {
    let label = format!("{} {:?}", r.kind(), r.name());
    match client.create(r).await {
        Ok(_) => {
            tracing::info!(resource = %label, "created default");
            outcome.created.push(label);
            Ok(())
        }
        Err(DatastoreError::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Creates the named resource (empty, then completed by `complete`), or completes an
/// existing one: `complete` fills in what is missing and says whether it changed anything.
async fn complete_or_create<B: KvBackend>(
    client: &Client<B>,
    kind: Kind,
    name: &str,
    outcome: &mut Outcome,
    complete: impl Fn(&mut Resource) -> bool,
) -> Result<(), StartupError> {
    let key = ResourceKey {
        kind,
        namespace: String::new(),
        name: name.to_string(),
    };
    for _ in 0..WRITE_ATTEMPTS {
        match client.get(&key).await {
            Ok(mut r) => {
                if !complete(&mut r) {
                    return Ok(());
                }
                match client.update(r).await {
                    Ok(_) => {
                        outcome.created.push(format!("{kind} {name:?} (completed)"));
                        return Ok(());
                    }
                    Err(DatastoreError::Conflict { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Err(DatastoreError::NotFound { .. }) => {
                let mut r = empty(kind, name);
                complete(&mut r);
                match client.create(r).await {
                    Ok(_) => {
                        tracing::info!(resource = %format!("{kind} {name:?}"), "created default");
                        outcome.created.push(format!("{kind} {name:?}"));
                        return Ok(());
                    }
                    Err(DatastoreError::AlreadyExists { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn empty(kind: Kind, name: &str) -> Resource {
    let meta = ObjectMeta::named(name);
    match kind {
        Kind::ClusterInformation => {
            Resource::ClusterInformation(ClusterInformation::new(meta, Default::default()))
        }
        _ => Resource::FelixConfiguration(FelixConfiguration::new(meta, Default::default())),
    }
}
