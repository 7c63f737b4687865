//! The calculation graph: datastore resources in, this node's dataplane messages out.
//!
//! Updates are applied at once to the indexes (label index, IP-set membership, policy
//! matches); what they changed is recorded in dirty sets, and [`CalcGraph::flush`] turns the
//! dirty sets into messages in the dependency order the dataplane relies on. The graph
//! remembers what it sent, so a flush emits only real changes and a value that changes and
//! changes back between flushes emits nothing.

// The graph's stages, one module each (as Calico's calc graph has them); each adds methods
// to `CalcGraph`, whose state stays here.
mod flush;
mod ipsets;
mod items;
mod policy;
mod profiles;
mod routes;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use margay_api::endpoint::{HostEndpointSpec, NodeSpec, WorkloadEndpointSpec};
use margay_api::ippool::{EncapMode as ApiEncapMode, IPPoolSpec};
use margay_api::net::Cidr;
use margay_api::policy::{Action, DEFAULT_TIER, DEFAULT_TIER_ORDER, PolicyType, Rule, TierSpec};
use margay_api::resource::{Kind, Resource, ResourceKey};
use margay_selector::Selector;
use serde::Serialize;

use crate::labels::{ItemId, LabelIndex, LabelMap, MatchChange, SelId};
use crate::messages::*;
use crate::rules::{
    self, IpSetSource, LABEL_NAMESPACE, LABEL_ORCHESTRATOR, LABEL_SERVICE_ACCOUNT,
    NAMESPACE_LABEL_PREFIX, NAMESPACE_PROFILE_PREFIX, SERVICE_ACCOUNT_LABEL_PREFIX,
    SERVICE_ACCOUNT_PROFILE_PREFIX, ScannedRules,
};
use crate::services::{KubeEndpointSlice, KubeService, ServiceChange, ServiceIndex};

/// Where routes to remote workloads come from (FelixConfiguration `routeSource`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum RouteSource {
    /// IPAM blocks and their affinity; per-workload routes only for borrowed addresses.
    #[default]
    CalicoIpam,
    /// One route per remote workload address.
    WorkloadIps,
}

#[derive(Debug, Clone, Default)]
pub struct CalcConfig {
    /// This node's name: endpoints on it are local.
    pub hostname: String,
    pub route_source: RouteSource,
}

/// Something labelled that selectors can match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum ItemKey {
    Wep { namespace: String, name: String },
    Hep { name: String },
    NetworkSet { namespace: String, name: String },
    GlobalNetworkSet { name: String },
}

/// What an item contributes to IP sets.
#[derive(Debug, Clone, Default, PartialEq)]
struct Payload {
    nets: Vec<Cidr>,
    named_ports: Vec<(String, PortProtocol, u16)>,
}

impl Payload {
    fn members_for(&self, source: &IpSetSource, out: &mut Vec<IpSetMember>) {
        out.clear();
        match source {
            IpSetSource::Selector(_) => {
                out.extend(self.nets.iter().map(|n| IpSetMember::Net(*n)));
            }
            IpSetSource::NamedPort { protocol, port, .. } => {
                for (name, proto, number) in &self.named_ports {
                    if name == port && protocol.is_none_or(|p| p == *proto) {
                        for net in &self.nets {
                            out.push(IpSetMember::IpPort {
                                ip: net.addr(),
                                protocol: *proto,
                                port: *number,
                            });
                        }
                    }
                }
            }
            // Filled from the service index (`CalcGraph::refresh_service_ip_sets`).
            IpSetSource::Service { .. } => {}
        }
    }
}

#[derive(Debug)]
struct IpSetState {
    source: IpSetSource,
    sel: Option<SelId>,
    refs: u32,
    members: HashMap<IpSetMember, u32>,
    sent: bool,
    resend_full: bool,
    added: HashSet<IpSetMember>,
    removed: HashSet<IpSetMember>,
}

/// A policy's identity as a resource (its tier may change; its name and namespace cannot).
type PolicyRef = (String, String);

#[derive(Debug)]
struct PolicyState {
    id: PolicyId,
    selector: Selector,
    order: f64,
    ingress: bool,
    egress: bool,
    do_not_track: bool,
    pre_dnat: bool,
    apply_on_forward: bool,
    resolved: Arc<ResolvedPolicy>,
    ip_sets: BTreeMap<String, IpSetSource>,
    matched: BTreeSet<ItemKey>,
}

impl PolicyState {
    fn applies_to_workloads(&self) -> bool {
        !self.do_not_track && !self.pre_dnat
    }
}

#[derive(Debug, Default)]
struct ProfileState {
    labels: LabelMap,
    /// None when the profile does not exist (or is invalid): endpoints using it get deny-all.
    rules: Option<(Arc<ResolvedProfile>, BTreeMap<String, IpSetSource>)>,
    /// Local endpoints referencing it.
    refs: u32,
}

#[derive(Debug, Clone, PartialEq)]
enum LocalKind {
    Wep {
        id: WorkloadEndpointId,
        data: WorkloadEndpointData,
    },
    Hep {
        data: HostEndpointData,
    },
}

#[derive(Debug)]
struct LocalEndpoint {
    kind: LocalKind,
    profiles: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Default)]
struct NodeInfo {
    ipv4: Option<Cidr>,
    ipv6: Option<Cidr>,
    vxlan_v4: Option<IpAddr>,
    vxlan_v6: Option<IpAddr>,
    vxlan_mac: String,
    vxlan_mac_v6: String,
    ipip_addr: Option<IpAddr>,
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default)]
struct CidrSources {
    pool: Option<PoolData>,
    block: Option<String>,
    /// Workloads with this address, and their nodes.
    weps: BTreeMap<ItemKey, String>,
    hosts: BTreeSet<String>,
    tunnels: BTreeSet<String>,
}

impl CidrSources {
    fn is_empty(&self) -> bool {
        self.pool.is_none()
            && self.block.is_none()
            && self.weps.is_empty()
            && self.hosts.is_empty()
            && self.tunnels.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Encap {
    ipip: bool,
    vxlan: bool,
    vxlan_v6: bool,
}

/// Counters and gauges for metrics and the status API.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CalcCounts {
    pub labelled_items: usize,
    pub workload_endpoints: usize,
    pub local_endpoints: usize,
    pub policies: usize,
    pub active_policies: usize,
    pub profiles: usize,
    pub active_profiles: usize,
    pub active_ip_sets: usize,
    pub ip_set_members: usize,
    pub selectors: usize,
    pub selector_evaluations: u64,
    pub hosts: usize,
    pub pools: usize,
    pub routes: usize,
    pub vteps: usize,
    pub ignored_updates: u64,
    pub invalid_resources: u64,
}

/// One IP set as the status API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct IpSetStatus {
    pub id: String,
    pub kind: IpSetKind,
    pub members: usize,
    pub source: String,
    pub users: u32,
}

/// Why the graph treated a resource as absent.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    pub resource: String,
    pub reason: String,
}

/// See the module documentation.
pub struct CalcGraph {
    config: CalcConfig,
    labels: LabelIndex,
    item_ids: HashMap<ItemKey, ItemId>,
    payloads: HashMap<ItemId, Payload>,
    ip_sets: HashMap<String, IpSetState>,
    sel_users: HashMap<SelId, Vec<String>>,
    policies: HashMap<PolicyRef, PolicyState>,
    tiers: HashMap<String, TierSpec>,
    profiles: HashMap<String, ProfileState>,
    local: BTreeMap<ItemKey, LocalEndpoint>,
    /// Local endpoint → policies matching it.
    local_policies: HashMap<ItemKey, BTreeSet<PolicyRef>>,
    nodes: HashMap<String, NodeInfo>,
    pools: HashMap<String, PoolData>,
    route_sources: HashMap<Cidr, CidrSources>,
    /// Per node, the route CIDRs with a source on it (counted: a CIDR can have several).
    node_cidrs: HashMap<String, HashMap<Cidr, u32>>,
    blocks: HashMap<Cidr, String>,
    problems: BTreeMap<String, String>,

    // What the dataplane was told.
    sent_eps: HashMap<ItemKey, Message>,
    sent_policies: HashMap<PolicyRef, (PolicyId, Arc<ResolvedPolicy>)>,
    sent_profiles: HashMap<String, Arc<ResolvedProfile>>,
    sent_routes: HashMap<Cidr, Route>,
    sent_vteps: HashMap<String, Vtep>,
    sent_hosts: HashMap<String, Message>,
    sent_pools: HashMap<String, PoolData>,
    sent_namespaces: HashMap<String, BTreeMap<String, String>>,
    sent_service_accounts: HashMap<String, BTreeMap<String, String>>,
    sent_encap: Option<Encap>,
    /// The service CIDRs of BGPConfiguration `default` (none when it is absent).
    service_cidrs: ServiceCidrs,
    sent_service_cidrs: Option<ServiceCidrs>,
    /// Kubernetes Services and EndpointSlices (and what the dataplane has of them).
    services: ServiceIndex,

    // What changed since the last flush.
    dirty_eps: BTreeSet<ItemKey>,
    dirty_policies: BTreeSet<PolicyRef>,
    dirty_profiles: BTreeSet<String>,
    dirty_ip_sets: BTreeSet<String>,
    dirty_cidrs: HashSet<Cidr>,
    dirty_nodes: BTreeSet<String>,
    dirty_pools: BTreeSet<String>,
    in_sync_pending: bool,
    in_sync_sent: bool,

    scratch_changes: Vec<MatchChange>,
    scratch_members: Vec<IpSetMember>,
    counts_ignored: u64,
    counts_invalid: u64,
}

fn pool_id(cidr: &Cidr) -> String {
    cidr.to_string().replace('/', "-")
}

fn encap(mode: Option<ApiEncapMode>) -> EncapMode {
    match mode.unwrap_or_default() {
        ApiEncapMode::Never => EncapMode::Never,
        ApiEncapMode::Always => EncapMode::Always,
        ApiEncapMode::CrossSubnet => EncapMode::CrossSubnet,
    }
}

/// A VXLAN device MAC derived from the node name, for nodes that have not published one
/// (locally administered, unicast; the Linux dataplane gives its device the same address).
pub fn vxlan_mac_for_node(node: &str) -> String {
    let id = rules::unique_id("mac", node);
    let b = id.as_bytes();
    let byte = |i: usize| b.get(4 + i).copied().unwrap_or(0);
    format!(
        "66:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        byte(0),
        byte(1),
        byte(2),
        byte(3),
        byte(4)
    )
}

fn policy_types(types: &[PolicyType], ingress: &[Rule], egress: &[Rule]) -> (bool, bool) {
    if types.is_empty() {
        // Calico's defaulting: ingress unless there are only egress rules.
        if egress.is_empty() {
            (true, false)
        } else if ingress.is_empty() {
            (false, true)
        } else {
            (true, true)
        }
    } else {
        (
            types.contains(&PolicyType::Ingress),
            types.contains(&PolicyType::Egress),
        )
    }
}

fn parse_selector_or_all(s: &str) -> Result<Selector, String> {
    if s.trim().is_empty() {
        Ok(Selector::all())
    } else {
        Selector::parse(s).map_err(|e| e.to_string())
    }
}

fn prefix_and_append(current: String, extra: &str, prefix: &str) -> Result<String, String> {
    if extra.is_empty() {
        return Ok(current);
    }
    let prefixed = margay_selector::prefix_labels(extra, prefix).map_err(|e| e.to_string())?;
    Ok(if current.is_empty() {
        prefixed
    } else {
        format!("({current}) && {prefixed}")
    })
}

impl CalcGraph {
    pub fn new(config: CalcConfig) -> CalcGraph {
        let services = ServiceIndex::new(&config.hostname);
        CalcGraph {
            config,
            labels: LabelIndex::new(),
            item_ids: HashMap::new(),
            payloads: HashMap::new(),
            ip_sets: HashMap::new(),
            sel_users: HashMap::new(),
            policies: HashMap::new(),
            tiers: HashMap::new(),
            profiles: HashMap::new(),
            local: BTreeMap::new(),
            local_policies: HashMap::new(),
            nodes: HashMap::new(),
            pools: HashMap::new(),
            route_sources: HashMap::new(),
            node_cidrs: HashMap::new(),
            blocks: HashMap::new(),
            problems: BTreeMap::new(),
            sent_eps: HashMap::new(),
            sent_policies: HashMap::new(),
            sent_profiles: HashMap::new(),
            sent_routes: HashMap::new(),
            sent_vteps: HashMap::new(),
            sent_hosts: HashMap::new(),
            sent_pools: HashMap::new(),
            sent_namespaces: HashMap::new(),
            sent_service_accounts: HashMap::new(),
            sent_encap: None,
            service_cidrs: ServiceCidrs::default(),
            sent_service_cidrs: None,
            services,
            dirty_eps: BTreeSet::new(),
            dirty_policies: BTreeSet::new(),
            dirty_profiles: BTreeSet::new(),
            dirty_ip_sets: BTreeSet::new(),
            dirty_cidrs: HashSet::new(),
            dirty_nodes: BTreeSet::new(),
            dirty_pools: BTreeSet::new(),
            in_sync_pending: false,
            in_sync_sent: false,
            scratch_changes: Vec::new(),
            scratch_members: Vec::new(),
            counts_ignored: 0,
            counts_invalid: 0,
        }
    }

    pub fn config(&self) -> &CalcConfig {
        &self.config
    }

    /// Applies one datastore change. `value: None` is a deletion. Kinds the graph does not
    /// use (configuration, BGP) are ignored; the caller handles them.
    pub fn on_update(&mut self, key: &ResourceKey, value: Option<Resource>) {
        let problem_key = key.to_string();
        let result = match (key.kind, value) {
            (Kind::WorkloadEndpoint, v) => {
                let spec = v.and_then(|r| match r {
                    Resource::WorkloadEndpoint(w) => Some((w.metadata.labels, w.spec)),
                    _ => None,
                });
                self.update_wep(&key.namespace, &key.name, spec)
            }
            (Kind::HostEndpoint, v) => {
                let spec = v.and_then(|r| match r {
                    Resource::HostEndpoint(h) => Some((h.metadata.labels, h.spec)),
                    _ => None,
                });
                self.update_hep(&key.name, spec)
            }
            (Kind::NetworkSet, v) => {
                let spec = v.and_then(|r| match r {
                    Resource::NetworkSet(n) => Some((n.metadata.labels, n.spec.nets)),
                    _ => None,
                });
                let item = ItemKey::NetworkSet {
                    namespace: key.namespace.clone(),
                    name: key.name.clone(),
                };
                self.update_network_set(item, Some(&key.namespace), spec)
            }
            (Kind::GlobalNetworkSet, v) => {
                let spec = v.and_then(|r| match r {
                    Resource::GlobalNetworkSet(n) => Some((n.metadata.labels, n.spec.nets)),
                    _ => None,
                });
                let item = ItemKey::GlobalNetworkSet {
                    name: key.name.clone(),
                };
                self.update_network_set(item, None, spec)
            }
            (Kind::NetworkPolicy, v) => {
                let p = v.and_then(|r| match r {
                    Resource::NetworkPolicy(p) => Some(p),
                    _ => None,
                });
                let state = p.map(|p| {
                    let spec = &p.spec;
                    let mut selector = spec.selector.clone();
                    if !key.namespace.is_empty() {
                        let ns_sel = format!("{LABEL_NAMESPACE} == '{}'", key.namespace);
                        selector = if selector.is_empty() {
                            ns_sel
                        } else {
                            format!("({selector}) && {ns_sel}")
                        };
                    }
                    let selector = prefix_and_append(
                        selector,
                        &spec.service_account_selector,
                        SERVICE_ACCOUNT_LABEL_PREFIX,
                    )?;
                    self.build_policy(
                        &key.namespace,
                        &key.name,
                        PolicyInput {
                            tier: &spec.tier,
                            order: spec.order,
                            selector: &selector,
                            types: &spec.types,
                            ingress: &spec.ingress,
                            egress: &spec.egress,
                            do_not_track: false,
                            pre_dnat: false,
                            apply_on_forward: false,
                        },
                    )
                });
                self.update_policy((key.namespace.clone(), key.name.clone()), state)
            }
            (Kind::GlobalNetworkPolicy, v) => {
                let p = v.and_then(|r| match r {
                    Resource::GlobalNetworkPolicy(p) => Some(p),
                    _ => None,
                });
                let state = p.map(|p| {
                    let spec = &p.spec;
                    let mut selector = spec.selector.clone();
                    if !spec.namespace_selector.is_empty() {
                        selector = prefix_and_append(
                            selector,
                            &spec.namespace_selector,
                            NAMESPACE_LABEL_PREFIX,
                        )?
                        .replace("all()", &format!("has({LABEL_NAMESPACE})"));
                    }
                    if !spec.service_account_selector.is_empty() {
                        selector = prefix_and_append(
                            selector,
                            &spec.service_account_selector,
                            SERVICE_ACCOUNT_LABEL_PREFIX,
                        )?
                        .replace("all()", &format!("has({LABEL_SERVICE_ACCOUNT})"));
                    }
                    self.build_policy(
                        "",
                        &key.name,
                        PolicyInput {
                            tier: &spec.tier,
                            order: spec.order,
                            selector: &selector,
                            types: &spec.types,
                            ingress: &spec.ingress,
                            egress: &spec.egress,
                            do_not_track: spec.do_not_track,
                            pre_dnat: spec.pre_dnat,
                            apply_on_forward: spec.apply_on_forward,
                        },
                    )
                });
                self.update_policy((String::new(), key.name.clone()), state)
            }
            (Kind::Tier, v) => {
                let spec = v.and_then(|r| match r {
                    Resource::Tier(t) => Some(t.spec),
                    _ => None,
                });
                self.update_tier(&key.name, spec);
                Ok(())
            }
            (Kind::Profile, v) => {
                let spec = v.and_then(|r| match r {
                    Resource::Profile(p) => Some(p.spec),
                    _ => None,
                });
                self.update_profile(&key.name, spec)
            }
            (Kind::Node, v) => {
                let spec = v.and_then(|r| match r {
                    Resource::Node(n) => Some((n.metadata.labels, n.spec)),
                    _ => None,
                });
                self.update_node(&key.name, spec);
                Ok(())
            }
            (Kind::BGPConfiguration, v) => {
                // Only the cluster-wide `default` carries the service addresses Felix uses.
                if key.name != "default" {
                    Ok(())
                } else {
                    let parsed = match v {
                        Some(Resource::BGPConfiguration(b)) => ServiceCidrs::of(&b.spec),
                        _ => Ok(ServiceCidrs::default()),
                    };
                    // One that cannot be used counts as absent (and is reported).
                    self.service_cidrs = parsed.clone().unwrap_or_default();
                    parsed.map(drop)
                }
            }
            (Kind::IPPool, v) => {
                let spec = v.and_then(|r| match r {
                    Resource::IPPool(p) => Some(p.spec),
                    _ => None,
                });
                self.update_pool(&key.name, spec)
            }
            _ => {
                self.counts_ignored += 1;
                Ok(())
            }
        };
        match result {
            Ok(()) => {
                self.problems.remove(&problem_key);
            }
            Err(reason) => {
                self.counts_invalid += 1;
                tracing::warn!(resource = %problem_key, %reason, "treating resource as absent");
                self.problems.insert(problem_key, reason);
            }
        }
    }

    /// An IPAM block and the node it is affine to (`None`: the block is gone or unaffine).
    pub fn on_ipam_block(&mut self, cidr: Cidr, affinity: Option<String>) {
        let cidr = cidr.network();
        let old = match &affinity {
            Some(node) => self.blocks.insert(cidr, node.clone()),
            None => self.blocks.remove(&cidr),
        };
        if old == affinity {
            return;
        }
        self.modify_sources(cidr, |s| NodeDelta {
            removed: std::mem::replace(&mut s.block, affinity.clone()),
            added: affinity.clone(),
        });
        // Workload routes inside the block may now be (or no longer be) borrowed addresses.
        if self.config.route_source == RouteSource::CalicoIpam {
            let inside: Vec<Cidr> = self
                .route_sources
                .iter()
                .filter(|(c, s)| !s.weps.is_empty() && cidr.contains(c.addr()))
                .map(|(c, _)| *c)
                .collect();
            self.dirty_cidrs.extend(inside);
        }
    }

    /// A Kubernetes Service created or changed (`Some`) or deleted (`None`). One the proxy
    /// cannot use counts as deleted and is listed by `problems()`.
    pub fn on_kube_service(&mut self, namespace: &str, name: &str, svc: Option<&KubeService>) {
        let result = self.services.on_service(namespace, name, svc);
        self.refresh_service_ip_sets(&[(namespace.to_string(), name.to_string())]);
        self.note_problem(
            format!("Service {namespace}/{name}"),
            result.map_err(|e| e.to_string()),
        );
    }

    /// A `discovery.k8s.io/v1` EndpointSlice created or changed (`Some`) or deleted (`None`).
    pub fn on_endpoint_slice(
        &mut self,
        namespace: &str,
        name: &str,
        slice: Option<&KubeEndpointSlice>,
    ) {
        let result = self.services.on_endpoint_slice(namespace, name, slice);
        if let Ok(touched) = &result {
            self.refresh_service_ip_sets(touched);
        }
        self.note_problem(
            format!("EndpointSlice {namespace}/{name}"),
            result.map(drop).map_err(|e| e.to_string()),
        );
    }

    /// The service ports the dataplane should have for one Service (for status and tests).
    pub fn service_ports(
        &self,
        namespace: &str,
        name: &str,
    ) -> BTreeMap<crate::services::ServicePortId, crate::services::ServicePort> {
        self.services.ports_of(namespace, name)
    }

    fn note_problem(&mut self, key: String, result: Result<(), String>) {
        match result {
            Ok(()) => {
                self.problems.remove(&key);
            }
            Err(reason) => {
                self.counts_invalid += 1;
                tracing::warn!(resource = %key, %reason, "treating resource as absent");
                self.problems.insert(key, reason);
            }
        }
    }

    /// Brings the active `destination.services` IP sets of these services up to date.
    fn refresh_service_ip_sets(&mut self, services: &[(String, String)]) {
        for (ns, name) in services {
            let want = self.services.ip_set_members(ns, name);
            let id = IpSetSource::Service {
                namespace: ns.clone(),
                name: name.clone(),
            }
            .id();
            let Some(st) = self.ip_sets.get_mut(&id) else {
                continue;
            };
            if st.refs == 0 {
                continue;
            }
            let stale: Vec<IpSetMember> = st
                .members
                .keys()
                .filter(|m| !want.contains(m))
                .copied()
                .collect();
            let mut changed = false;
            for m in stale {
                // Service members are counted once: drop the whole count.
                while st.members.contains_key(&m) {
                    changed |= remove_member(st, m);
                }
            }
            for m in want {
                if !st.members.contains_key(&m) {
                    changed |= add_member(st, m);
                }
            }
            if changed {
                self.dirty_ip_sets.insert(id);
            }
        }
    }

    /// The datastore has delivered its complete state: the next flush ends with `InSync`.
    pub fn on_in_sync(&mut self) {
        if !self.in_sync_sent {
            self.in_sync_pending = true;
        }
    }

    pub fn in_sync(&self) -> bool {
        self.in_sync_sent
    }

    // ---- introspection ----------------------------------------------------------------

    pub fn counts(&self) -> CalcCounts {
        let active_sets = self.ip_sets.values().filter(|s| s.refs > 0);
        CalcCounts {
            labelled_items: self.labels.num_items(),
            workload_endpoints: self
                .item_ids
                .keys()
                .filter(|k| matches!(k, ItemKey::Wep { .. }))
                .count(),
            local_endpoints: self.local.len(),
            policies: self.policies.len(),
            active_policies: self
                .policies
                .values()
                .filter(|p| !p.matched.is_empty())
                .count(),
            profiles: self.profiles.values().filter(|p| p.rules.is_some()).count(),
            active_profiles: self.profiles.values().filter(|p| p.refs > 0).count(),
            active_ip_sets: self.ip_sets.values().filter(|s| s.refs > 0).count(),
            ip_set_members: active_sets.map(|s| s.members.len()).sum(),
            selectors: self.labels.num_selectors(),
            selector_evaluations: self.labels.evaluations,
            hosts: self.nodes.len(),
            pools: self.pools.len(),
            routes: self.sent_routes.len(),
            vteps: self.sent_vteps.len(),
            ignored_updates: self.counts_ignored,
            invalid_resources: self.counts_invalid,
        }
    }

    /// The active IP sets, by id.
    pub fn ip_set_status(&self) -> Vec<IpSetStatus> {
        let mut v: Vec<IpSetStatus> = self
            .ip_sets
            .iter()
            .filter(|(_, s)| s.refs > 0)
            .map(|(id, s)| IpSetStatus {
                id: id.clone(),
                kind: s.source.kind(),
                members: s.members.len(),
                source: s.source.describe(),
                users: s.refs,
            })
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// Resources the graph treated as absent, and why.
    pub fn problems(&self) -> Vec<Problem> {
        self.problems
            .iter()
            .map(|(r, why)| Problem {
                resource: r.clone(),
                reason: why.clone(),
            })
            .collect()
    }
}

#[derive(Default)]
struct NodeDelta {
    added: Option<String>,
    removed: Option<String>,
}

struct PolicyInput<'a> {
    tier: &'a str,
    order: Option<f64>,
    selector: &'a str,
    types: &'a [PolicyType],
    ingress: &'a [Rule],
    egress: &'a [Rule],
    do_not_track: bool,
    pre_dnat: bool,
    apply_on_forward: bool,
}

fn removal_for(m: &Message) -> Message {
    match m {
        Message::WorkloadEndpointUpdate { id, .. } => {
            Message::WorkloadEndpointRemove { id: id.clone() }
        }
        Message::HostEndpointUpdate { id, .. } => Message::HostEndpointRemove { id: id.clone() },
        other => other.clone(),
    }
}

fn diff_labels(
    sent: &mut HashMap<String, BTreeMap<String, String>>,
    id: &str,
    desired: Option<BTreeMap<String, String>>,
    out: &mut Vec<Message>,
    update: impl Fn(String, BTreeMap<String, String>) -> Message,
    remove: impl Fn(String) -> Message,
) {
    match desired {
        Some(labels) => {
            if sent.get(id) != Some(&labels) {
                sent.insert(id.to_string(), labels.clone());
                out.push(update(id.to_string(), labels));
            }
        }
        None => {
            if sent.remove(id).is_some() {
                out.push(remove(id.to_string()));
            }
        }
    }
}

/// Returns whether the set's content changed.
fn add_member(st: &mut IpSetState, m: IpSetMember) -> bool {
    let count = st.members.entry(m).or_insert(0);
    *count += 1;
    if *count != 1 {
        return false;
    }
    if st.sent && !st.resend_full && !st.removed.remove(&m) {
        st.added.insert(m);
    }
    true
}

fn remove_member(st: &mut IpSetState, m: IpSetMember) -> bool {
    let Some(count) = st.members.get_mut(&m) else {
        return false;
    };
    *count -= 1;
    if *count > 0 {
        return false;
    }
    st.members.remove(&m);
    if st.sent && !st.resend_full && !st.added.remove(&m) {
        st.removed.insert(m);
    }
    true
}
