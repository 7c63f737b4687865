//! Typha in Kubernetes (Calico's `typha/pkg/discovery` and `typha/pkg/k8s`, facts only):
//! clients find Typha through the EndpointSlices of its Service, and Typha counts its
//! replicas there to size its connection limit.
//!
//! - Pure: [`choose_typhas`] (EndpointSlice JSON + node name + a random source → the ordered
//!   addresses to try, this node's first, each group shuffled), [`count_typhas`] (distinct
//!   IPs behind the port), [`count_nodes`] (Node keys in a syncer snapshot).
//! - Edge: [`Discovery::discover`] (one list of the slices), [`run_client`] (the Typha
//!   client over discovered addresses, looked up again when none answers) and
//!   [`run_rebalancer`] (TYPHA_CONNECTIONREBALANCINGMODE=kubernetes).

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use margay_api::Kind;
use margay_datastore::kube::KubeBackend;
use margay_datastore::kube::api::KubeApi;
use margay_datastore::kube::route::ENDPOINT_SLICES;
use margay_datastore::{KubeSettings, SyncStatus};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::cache::{CacheReader, Snapshot};
use crate::client::{self, ClientEvent, ClientOptions, ClientStats, ConnectionState};
use crate::config::{TyphaConfig, rebalanced_limit};
use crate::server::Server;

/// The label Kubernetes puts on every EndpointSlice of a Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Calico's defaults: the Service, its namespace and the name of Typha's port.
pub const DEFAULT_SERVICE_NAME: &str = "calico-typha";
pub const DEFAULT_NAMESPACE: &str = "kube-system";
pub const DEFAULT_PORT_NAME: &str = "calico-typha";

/// Pause between lookups that found nothing usable.
const RETRY: Duration = Duration::from_secs(1);

/// Typha's Service: where its EndpointSlices are and which of their ports is Typha's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    pub port_name: String,
}

impl ServiceRef {
    /// `name` in `namespace` (empty: kube-system), Typha's port named `calico-typha`.
    pub fn new(namespace: &str, name: &str) -> ServiceRef {
        let namespace = namespace.trim();
        ServiceRef {
            namespace: if namespace.is_empty() {
                DEFAULT_NAMESPACE.to_string()
            } else {
                namespace.to_string()
            },
            name: name.trim().to_string(),
            port_name: DEFAULT_PORT_NAME.to_string(),
        }
    }

    /// The label selector of the Service's EndpointSlices.
    pub fn label_selector(&self) -> String {
        format!("{SERVICE_NAME_LABEL}={}", self.name)
    }
}

impl std::fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why Typha could not be found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    #[error(
        "cannot talk to the Kubernetes API to find Typha (service {service}): {reason} (the \
         Kubernetes settings are the datastore's: KUBECONFIG, K8S_API_ENDPOINT, K8S_CA_FILE, …, \
         or the pod's service account)"
    )]
    Client { service: String, reason: String },
    #[error(
        "cannot list the EndpointSlices of service {service} (label {SERVICE_NAME_LABEL}={name} \
         in namespace {namespace}): {reason}"
    )]
    List {
        service: String,
        name: String,
        namespace: String,
        reason: String,
    },
    #[error(
        "no ready endpoints for service {service} with a port named {port_name}: {seen}; check \
         that Typha's pods are running and ready and that its Service names the port \
         {port_name}"
    )]
    NoReadyEndpoints {
        service: String,
        port_name: String,
        seen: String,
    },
}

/// One Typha a client may connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TyphaEndpoint {
    /// `host:port` (`[v6]:port`).
    pub addr: String,
    pub ip: String,
    /// The endpoint's `nodeName`.
    pub node: Option<String>,
    /// On the client's own node.
    pub local: bool,
}

/// The result of one lookup: the addresses in the order to try them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    pub service: ServiceRef,
    pub typhas: Vec<TyphaEndpoint>,
}

impl Discovered {
    pub fn addrs(&self) -> Vec<String> {
        self.typhas.iter().map(|t| t.addr.clone()).collect()
    }

    /// `10.0.0.5:5473 (this node), 10.0.0.6:5473 (node n2)`.
    pub fn describe(&self) -> String {
        self.typhas
            .iter()
            .map(|t| match (&t.node, t.local) {
                (_, true) => format!("{} (this node)", t.addr),
                (Some(n), false) => format!("{} (node {n})", t.addr),
                (None, false) => t.addr.clone(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether none of `other`'s addresses is among these.
    pub fn disjoint(&self, other: &Discovered) -> bool {
        let ours: HashSet<&str> = self.typhas.iter().map(|t| t.addr.as_str()).collect();
        !other.typhas.iter().any(|t| ours.contains(t.addr.as_str()))
    }
}

/// Where the order of equally good Typhas comes from (tests pass a fixed one).
pub trait RandomSource {
    /// A number in `0..n` (`n` ≥ 1).
    fn below(&mut self, n: usize) -> usize;
}

/// splitmix64: plenty for spreading clients over Typhas.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Seeded from the process's hash keys (random per process), its pid and the time.
    pub fn from_entropy() -> Rng {
        use std::hash::BuildHasher;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        Rng(std::collections::hash_map::RandomState::new().hash_one((std::process::id(), now)))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl RandomSource for Rng {
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

fn shuffle<T>(v: &mut [T], rng: &mut dyn RandomSource) {
    for i in (1..v.len()).rev() {
        let j = rng.below(i + 1).min(i);
        v.swap(i, j);
    }
}

// The parts of a discovery.k8s.io/v1 EndpointSlice discovery reads; the rest is ignored.
#[derive(Deserialize)]
struct Slice {
    #[serde(default)]
    ports: Option<Vec<SlicePort>>,
    #[serde(default)]
    endpoints: Option<Vec<SliceEndpoint>>,
}

#[derive(Deserialize)]
struct SlicePort {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    port: Option<i64>,
}

#[derive(Deserialize)]
struct SliceEndpoint {
    #[serde(default)]
    addresses: Option<Vec<String>>,
    #[serde(default)]
    conditions: Option<Conditions>,
    #[serde(default, rename = "nodeName")]
    node_name: Option<String>,
}

#[derive(Deserialize)]
struct Conditions {
    #[serde(default)]
    ready: Option<bool>,
}

fn parse_slice(v: &Value) -> Option<Slice> {
    Slice::deserialize(v).ok()
}

/// The port named `name`: None when the slice has no such port, `Some(None)` when its number
/// is missing or not a port number.
fn named_port(slice: &Slice, name: &str) -> Option<Option<u16>> {
    slice
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .map(|p| {
            p.port
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n != 0)
        })
}

fn join_host_port(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port).to_string(),
        Err(_) if host.contains(':') => format!("[{host}]:{port}"),
        Err(_) => format!("{host}:{port}"),
    }
}

/// The Typhas to try, in order: the Service's EndpointSlices (`slices`), the port named
/// `service.port_name` of each, every address of an endpoint that is not explicitly unready
/// (`conditions.ready: false`; absent counts as ready, as in Calico). Those on `node` (the
/// endpoint's `nodeName`) come first; both groups are shuffled, so clients spread over the
/// Typhas. The same address twice is tried once.
pub fn choose_typhas(
    slices: &[Value],
    service: &ServiceRef,
    node: &str,
    rng: &mut dyn RandomSource,
) -> Result<Vec<TyphaEndpoint>, DiscoveryError> {
    let mut local = Vec::new();
    let mut remote = Vec::new();
    let mut seen_addrs = HashSet::new();
    let (mut unreadable, mut without_port, mut bad_port, mut unready, mut with_port) =
        (0, 0, 0, 0, 0);
    let mut other_ports: Vec<String> = Vec::new();
    for v in slices {
        let Some(slice) = parse_slice(v) else {
            unreadable += 1;
            continue;
        };
        let port = match named_port(&slice, &service.port_name) {
            Some(Some(port)) => port,
            Some(None) => {
                bad_port += 1;
                continue;
            }
            None => {
                without_port += 1;
                for p in slice.ports.iter().flatten() {
                    let name = p.name.clone().unwrap_or_else(|| "(unnamed)".into());
                    if !other_ports.contains(&name) {
                        other_ports.push(name);
                    }
                }
                continue;
            }
        };
        with_port += 1;
        for ep in slice.endpoints.iter().flatten() {
            if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                unready += 1;
                continue;
            }
            for ip in ep.addresses.iter().flatten() {
                let addr = join_host_port(ip, port);
                if !seen_addrs.insert(addr.clone()) {
                    continue;
                }
                let is_local = !node.is_empty() && ep.node_name.as_deref() == Some(node);
                let t = TyphaEndpoint {
                    addr,
                    ip: ip.clone(),
                    node: ep.node_name.clone(),
                    local: is_local,
                };
                if is_local {
                    local.push(t);
                } else {
                    remote.push(t);
                }
            }
        }
    }
    if local.is_empty() && remote.is_empty() {
        let mut seen = Vec::new();
        if slices.is_empty() {
            seen.push(format!(
                "no EndpointSlice in namespace {} is labelled {}",
                service.namespace,
                service.label_selector()
            ));
        } else {
            seen.push(format!("{} EndpointSlice(s)", slices.len()));
        }
        if without_port > 0 {
            seen.push(format!(
                "{without_port} without a port named {} (ports: {})",
                service.port_name,
                if other_ports.is_empty() {
                    "none".to_string()
                } else {
                    other_ports.join(", ")
                }
            ));
        }
        if bad_port > 0 {
            seen.push(format!(
                "{bad_port} whose port {} has no valid number",
                service.port_name
            ));
        }
        if unreadable > 0 {
            seen.push(format!("{unreadable} unreadable"));
        }
        if unready > 0 {
            seen.push(format!("{unready} endpoint(s) not ready"));
        } else if with_port > 0 {
            seen.push("no endpoint addresses".to_string());
        }
        return Err(DiscoveryError::NoReadyEndpoints {
            service: service.to_string(),
            port_name: service.port_name.clone(),
            seen: seen.join(", "),
        });
    }
    shuffle(&mut local, rng);
    shuffle(&mut remote, rng);
    local.append(&mut remote);
    Ok(local)
}

/// Typha's count of Typhas (Calico's): the distinct IPs of every endpoint, ready or not, in
/// the slices that have a port named `port_name`.
pub fn count_typhas(slices: &[Value], port_name: &str) -> usize {
    let mut ips = HashSet::new();
    for slice in slices.iter().filter_map(parse_slice) {
        let has_port = slice
            .ports
            .iter()
            .flatten()
            .any(|p| p.name.as_deref() == Some(port_name));
        if !has_port {
            continue;
        }
        for ep in slice.endpoints.iter().flatten() {
            ips.extend(ep.addresses.iter().flatten().cloned());
        }
    }
    ips.len()
}

/// The Nodes in a syncer's snapshot.
pub fn count_nodes(snapshot: &Snapshot) -> usize {
    let prefix = margay_datastore::keys::kind_prefix(Kind::Node, None, "");
    snapshot
        .range::<_, str>((
            std::ops::Bound::Included(prefix.as_str()),
            std::ops::Bound::Unbounded,
        ))
        .take_while(|(k, _)| k.starts_with(prefix.as_str()))
        .count()
}

// ---- edge ---------------------------------------------------------------------------------------

/// The Service's EndpointSlices, through `api`, within `timeout`.
pub async fn list_slices(
    api: &KubeApi,
    service: &ServiceRef,
    timeout: Duration,
) -> Result<Vec<Value>, DiscoveryError> {
    let list_err = |reason: String| DiscoveryError::List {
        service: service.to_string(),
        name: service.name.clone(),
        namespace: service.namespace.clone(),
        reason,
    };
    let selector = service.label_selector();
    match tokio::time::timeout(
        timeout,
        api.list_all(&ENDPOINT_SLICES, Some(&service.namespace), Some(&selector)),
    )
    .await
    {
        Ok(Ok(listing)) => Ok(listing.items),
        Ok(Err(e)) => Err(list_err(e.to_string())),
        Err(_) => Err(list_err(format!(
            "the API server did not answer within {timeout:?}"
        ))),
    }
}

async fn connect(kube: &KubeSettings, service: &ServiceRef) -> Result<KubeApi, DiscoveryError> {
    KubeBackend::connect(kube)
        .await
        .map(|b| b.api().clone())
        .map_err(|e| DiscoveryError::Client {
            service: service.to_string(),
            reason: e.to_string(),
        })
}

/// How a client finds Typha through Kubernetes.
#[derive(Debug, Clone)]
pub struct Discovery {
    /// The Kubernetes connection (the datastore's settings).
    pub kube: KubeSettings,
    pub service: ServiceRef,
    /// This node's name (endpoints with this `nodeName` are tried first).
    pub node: String,
    /// One lookup's time limit.
    pub timeout: Duration,
    /// While no Typha answers after data was delivered: how often to check whether the
    /// Typhas known have left the Service.
    pub recheck: Duration,
}

impl Discovery {
    pub fn new(kube: KubeSettings, service: ServiceRef, node: impl Into<String>) -> Discovery {
        Discovery {
            kube,
            service,
            node: node.into(),
            timeout: Duration::from_secs(10),
            recheck: Duration::from_secs(10),
        }
    }

    /// One lookup.
    pub async fn discover(
        &self,
        rng: &mut (dyn RandomSource + Send),
    ) -> Result<Discovered, DiscoveryError> {
        let api = connect(&self.kube, &self.service).await?;
        let slices = list_slices(&api, &self.service, self.timeout).await?;
        let typhas = choose_typhas(&slices, &self.service, &self.node, rng)?;
        Ok(Discovered {
            service: self.service.clone(),
            typhas,
        })
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the Typha client over the addresses `first` found, forwarding its events to `out`.
///
/// While nothing has been delivered yet (start-up), a round in which no Typha answered means
/// a new lookup and a new client over what it finds, so a Typha that moved is found (as
/// Calico's client re-lists on every attempt). Once data was delivered a new client cannot
/// take over (its snapshot would not say what was deleted meanwhile), so the client's own
/// failover carries on; but when every Typha it knows has left the Service, this ends with a
/// `Disconnected` event saying so, for the caller to restart and look Typha up afresh.
pub async fn run_client(
    mut opts: ClientOptions,
    discovery: Discovery,
    first: Discovered,
    out: mpsc::Sender<ClientEvent>,
    stats: Arc<ClientStats>,
) {
    let mut rng = Rng::from_entropy();
    let mut found = first;
    loop {
        opts.addrs = found.addrs();
        let (tx, mut rx) = mpsc::channel(16);
        let client = AbortOnDrop(tokio::spawn(client::run(opts.clone(), tx, stats.clone())));
        let mut delivered = false;
        let mut next_check: Option<tokio::time::Instant> = None;
        loop {
            let check = async {
                match next_check {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = rx.recv() => {
                    let Some(ev) = ev else { return };
                    let restart = match &ev {
                        ClientEvent::Connection(ConnectionState::Disconnected { reason }) => {
                            if delivered {
                                next_check.get_or_insert(tokio::time::Instant::now() + discovery.recheck);
                                false
                            } else {
                                tracing::warn!(service = %found.service, tried = %found.describe(), "No Typha found through Kubernetes answered ({reason}); looking the service up again");
                                true
                            }
                        }
                        ClientEvent::Connection(ConnectionState::Connected { .. }) => {
                            next_check = None;
                            false
                        }
                        ClientEvent::Kvs(_) | ClientEvent::Status(_) => {
                            delivered = true;
                            false
                        }
                    };
                    if out.send(ev).await.is_err() {
                        return;
                    }
                    if restart {
                        break;
                    }
                }
                () = check => {
                    next_check = Some(tokio::time::Instant::now() + discovery.recheck);
                    match discovery.discover(&mut rng).await {
                        Ok(now) if now.disjoint(&found) => {
                            let reason = format!(
                                "none of the Typhas this client knew ({}) is in service {} any more (now: {}); exiting so that a restart connects to them",
                                found.describe(),
                                found.service,
                                now.describe()
                            );
                            tracing::error!("{reason}");
                            let _ = out
                                .send(ClientEvent::Connection(ConnectionState::Disconnected { reason }))
                                .await;
                            return;
                        }
                        Ok(now) => tracing::debug!(typhas = %now.describe(), "Typhas this client knows are still in the service; the client keeps retrying them"),
                        Err(e) => tracing::warn!("{e}"),
                    }
                }
                () = out.closed() => return,
            }
        }
        drop(client);
        let mut last_error = String::new();
        found = loop {
            tokio::select! {
                () = tokio::time::sleep(RETRY) => {}
                () = out.closed() => return,
            }
            match discovery.discover(&mut rng).await {
                Ok(f) => {
                    tracing::info!(service = %f.service, typhas = %f.describe(), "Found Typha through Kubernetes");
                    break f;
                }
                Err(e) => {
                    // Once per distinct problem: the lookup repeats every second.
                    let text = e.to_string();
                    if text != last_error {
                        tracing::error!("{text}; retrying every {RETRY:?}");
                        last_error = text;
                    }
                }
            }
        };
    }
}

// ---- connection rebalancing (TYPHA_CONNECTIONREBALANCINGMODE=kubernetes) ----------------------

/// What the rebalancing poll needs from Typha's configuration.
#[derive(Debug, Clone)]
pub struct RebalanceSettings {
    pub service: ServiceRef,
    pub interval: Duration,
    /// Connections a node opens: one per syncer type served.
    pub syncer_types: usize,
    pub lower: usize,
    pub upper: usize,
}

impl RebalanceSettings {
    pub fn from_config(c: &TyphaConfig) -> RebalanceSettings {
        RebalanceSettings {
            service: ServiceRef {
                namespace: c.k8s_namespace.clone(),
                name: c.k8s_service_name.clone(),
                port_name: c.k8s_port_name.clone(),
            },
            interval: c.k8s_service_poll_interval,
            syncer_types: c.syncer_types.len(),
            lower: c.max_connections_lower_limit,
            upper: c.max_connections_upper_limit,
        }
    }
}

/// Every poll interval: T = Typhas in the Service (`count_typhas`), N = Nodes in `nodes`' cache
/// (once it is in sync), and the server's limit set to [`rebalanced_limit`]. What cannot be
/// known (an API error, a cache not yet in sync) makes the limit the upper limit; each problem
/// is logged when it appears and when it goes, never fatal.
pub async fn run_rebalancer(
    server: Arc<Server>,
    kube: KubeSettings,
    nodes: CacheReader,
    settings: RebalanceSettings,
) {
    tracing::info!(
        service = %settings.service,
        port = %settings.service.port_name,
        interval = ?settings.interval,
        "Connection rebalancing from Kubernetes: the limit follows the Typhas in the service and the nodes in the cluster"
    );
    let mut tick = tokio::time::interval(settings.interval.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut api: Option<KubeApi> = None;
    let mut last_problem: Option<String> = None;
    loop {
        tick.tick().await;
        let started = Instant::now();
        let typhas = async {
            if api.is_none() {
                api = Some(connect(&kube, &settings.service).await?);
            }
            let Some(a) = &api else {
                return Err(DiscoveryError::Client {
                    service: settings.service.to_string(),
                    reason: "no client".into(),
                });
            };
            let timeout = settings
                .interval
                .clamp(Duration::from_secs(1), Duration::from_secs(30));
            let slices = list_slices(a, &settings.service, timeout).await?;
            Ok(count_typhas(&slices, &settings.service.port_name))
        }
        .await;
        let latest = nodes.latest();
        let node_count =
            (latest.status == SyncStatus::InSync).then(|| count_nodes(&latest.snapshot));
        let problem = match (&typhas, node_count) {
            (Err(e), _) => Some(format!("cannot count the Typhas: {e}")),
            (Ok(_), None) => {
                Some("the syncer is not in sync yet, so the number of nodes is unknown".to_string())
            }
            _ => None,
        };
        if problem != last_problem {
            match &problem {
                Some(p) => {
                    tracing::warn!("{p}; using the upper connection limit ({})", settings.upper)
                }
                None => tracing::info!("Typha and node counts available again"),
            }
            last_problem = problem;
        }
        let (limit, reason) = rebalanced_limit(
            settings.syncer_types,
            node_count,
            typhas.as_ref().ok().copied(),
            settings.lower,
            settings.upper,
        );
        let old = server.connection_limit();
        if limit != old {
            tracing::info!(
                typhas = ?typhas.as_ref().ok(),
                nodes = ?node_count,
                syncer_types = settings.syncer_types,
                old,
                new = limit,
                reason,
                took = ?started.elapsed(),
                "Calculated new connection limit"
            );
            server.set_connection_limit(limit);
        }
        // A failed client is rebuilt on the next poll (credentials may have been rotated).
        if typhas.is_err() {
            api = None;
        }
    }
}

#[cfg(test)]
mod tests;
