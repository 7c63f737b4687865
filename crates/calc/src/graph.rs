//! The calculation graph: datastore resources in, this node's dataplane messages out.
//!
//! Updates are applied at once to the indexes (label index, IP-set membership, policy
//! matches); what they changed is recorded in dirty sets, and [`CalcGraph::flush`] turns the
//! dirty sets into messages in the dependency order the dataplane relies on. The graph
//! remembers what it sent, so a flush emits only real changes and a value that changes and
//! changes back between flushes emits nothing.

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

    /// The datastore has delivered its complete state: the next flush ends with `InSync`.
    pub fn on_in_sync(&mut self) {
        if !self.in_sync_sent {
            self.in_sync_pending = true;
        }
    }

    pub fn in_sync(&self) -> bool {
        self.in_sync_sent
    }

    // ---- labelled items -------------------------------------------------------------------

    fn item_id(&mut self, key: &ItemKey) -> ItemId {
        if let Some(id) = self.item_ids.get(key) {
            return *id;
        }
        let id = self.labels.new_item_id();
        self.item_ids.insert(key.clone(), id);
        id
    }

    /// Adds, updates or (with `None`) removes a labelled item, keeping IP sets right.
    fn set_item(&mut self, key: &ItemKey, value: Option<(LabelMap, Vec<String>, Payload)>) -> bool {
        let existing = self.item_ids.get(key).copied();
        // Take the item's members out of every set it is in; they go back below with the new
        // payload. Reference counts make this exact and the delta tracking nets it out.
        if let Some(id) = existing {
            self.item_members_changed(id, false);
        }
        let mut changes = std::mem::take(&mut self.scratch_changes);
        changes.clear();
        let labels_changed = match value {
            None => {
                if let Some(id) = existing {
                    self.labels.remove_item(id, &mut changes);
                    self.payloads.remove(&id);
                    self.item_ids.remove(key);
                }
                true
            }
            Some((labels, parents, payload)) => {
                let id = self.item_id(key);
                let changed = self.labels.update_item(id, labels, parents, &mut changes);
                self.payloads.insert(id, payload);
                self.item_members_changed(id, true);
                changed
            }
        };
        // The match changes only concern this item, whose members were handled above.
        changes.clear();
        self.scratch_changes = changes;
        labels_changed
    }

    /// Adds (or removes) one item's members to every IP set whose selector matches it.
    fn item_members_changed(&mut self, id: ItemId, add: bool) {
        let sels: Vec<SelId> = self.labels.item_matches(id).to_vec();
        for sel in sels {
            self.apply_match(sel, id, add);
        }
    }

    fn apply_match(&mut self, sel: SelId, item: ItemId, add: bool) {
        let Some(users) = self.sel_users.get(&sel) else {
            return;
        };
        let Some(payload) = self.payloads.get(&item) else {
            return;
        };
        let mut members = std::mem::take(&mut self.scratch_members);
        for set_id in users {
            let Some(st) = self.ip_sets.get_mut(set_id) else {
                continue;
            };
            payload.members_for(&st.source, &mut members);
            let mut touched = false;
            for m in members.drain(..) {
                touched |= if add {
                    add_member(st, m)
                } else {
                    remove_member(st, m)
                };
            }
            if touched {
                self.dirty_ip_sets.insert(set_id.clone());
            }
        }
        self.scratch_members = members;
    }

    fn apply_changes(&mut self, changes: &[MatchChange]) {
        for c in changes {
            self.apply_match(c.selector, c.item, c.matched);
        }
    }

    fn update_wep(
        &mut self,
        namespace: &str,
        name: &str,
        value: Option<(BTreeMap<String, String>, WorkloadEndpointSpec)>,
    ) -> Result<(), String> {
        let key = ItemKey::Wep {
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        // A workload without addresses cannot have rules rendered yet: treated as absent.
        let value = value.filter(|(_, spec)| !spec.ip_networks.is_empty());
        let Some((raw_labels, spec)) = value else {
            self.remove_wep(&key);
            return Ok(());
        };
        let parsed = (|| -> Result<_, String> {
            let mut v4 = Vec::new();
            let mut v6 = Vec::new();
            for n in &spec.ip_networks {
                let c = Cidr::parse_cidr_or_ip(n).map_err(|e| format!("spec.ipNetworks: {e}"))?;
                let c = c.network();
                if c.is_ipv4() {
                    v4.push(c);
                } else {
                    v6.push(c);
                }
            }
            let mut spoof = Vec::new();
            for n in &spec.allow_spoofed_source_prefixes {
                spoof.push(
                    Cidr::parse_cidr_or_ip(n)
                        .map_err(|e| format!("spec.allowSpoofedSourcePrefixes: {e}"))?
                        .network(),
                );
            }
            Ok((v4, v6, spoof))
        })();
        let (v4, v6, spoof) = match parsed {
            Ok(p) => p,
            Err(e) => {
                self.remove_wep(&key);
                return Err(e);
            }
        };
        // Labels as Calico's syncer presents them: no forged namespace or service-account
        // labels; namespace, orchestrator and service account from the resource itself.
        let mut labels: LabelMap = raw_labels
            .into_iter()
            .filter(|(k, _)| {
                !k.starts_with(NAMESPACE_LABEL_PREFIX)
                    && !k.starts_with(SERVICE_ACCOUNT_LABEL_PREFIX)
            })
            .collect();
        labels.insert(LABEL_NAMESPACE.to_string(), namespace.to_string());
        if !spec.orchestrator.is_empty() {
            labels.insert(LABEL_ORCHESTRATOR.to_string(), spec.orchestrator.clone());
        }
        if !spec.service_account_name.is_empty() {
            labels.insert(
                LABEL_SERVICE_ACCOUNT.to_string(),
                spec.service_account_name.clone(),
            );
        }
        let named_ports = spec
            .ports
            .iter()
            .filter(|p| !p.name.is_empty())
            .filter_map(|p| {
                let proto = match p.protocol.number()? {
                    6 => PortProtocol::Tcp,
                    17 => PortProtocol::Udp,
                    132 => PortProtocol::Sctp,
                    _ => return None,
                };
                Some((p.name.clone(), proto, u16::try_from(p.port).ok()?))
            })
            .collect();
        let nets: Vec<Cidr> = v4.iter().chain(&v6).copied().collect();
        let payload = Payload {
            nets: nets.clone(),
            named_ports,
        };
        let is_local = spec.node == self.config.hostname;
        let node = spec.node.clone();
        // Routes: every workload address is a route source (see `compute_route`).
        let old_cidrs = self.wep_route_cidrs(&key);
        let labels_changed = self.set_item(&key, Some((labels, spec.profiles.clone(), payload)));
        for c in &old_cidrs {
            if !nets.contains(c) {
                self.modify_sources(*c, |s| NodeDelta {
                    removed: s.weps.remove(&key),
                    added: None,
                });
            }
        }
        for c in &nets {
            self.modify_sources(*c, |s| NodeDelta {
                removed: s.weps.insert(key.clone(), node.clone()),
                added: Some(node.clone()),
            });
        }

        if is_local {
            let id = WorkloadEndpointId {
                orchestrator: spec.orchestrator.clone(),
                workload: spec.workload_id(namespace, name),
                endpoint: spec.endpoint_id(),
            };
            let data = WorkloadEndpointData {
                interface: spec.interface_name.clone(),
                mac: spec.mac.clone(),
                ipv4_nets: v4,
                ipv6_nets: v6,
                profile_ids: spec.profiles.clone(),
                tiers: Vec::new(),
                name: name.to_string(),
                namespace: namespace.to_string(),
                allow_spoofed_source_prefixes: spoof,
            };
            self.set_local(
                key,
                LocalKind::Wep { id, data },
                spec.profiles,
                labels_changed,
            );
        } else {
            self.clear_local(&key);
        }
        Ok(())
    }

    fn wep_route_cidrs(&self, key: &ItemKey) -> Vec<Cidr> {
        let Some(id) = self.item_ids.get(key) else {
            return Vec::new();
        };
        self.payloads
            .get(id)
            .map(|p| p.nets.clone())
            .unwrap_or_default()
    }

    fn remove_wep(&mut self, key: &ItemKey) {
        for c in self.wep_route_cidrs(key) {
            self.modify_sources(c, |s| NodeDelta {
                removed: s.weps.remove(key),
                added: None,
            });
        }
        self.set_item(key, None);
        self.clear_local(key);
    }

    fn update_hep(
        &mut self,
        name: &str,
        value: Option<(BTreeMap<String, String>, HostEndpointSpec)>,
    ) -> Result<(), String> {
        let key = ItemKey::Hep {
            name: name.to_string(),
        };
        let Some((labels, spec)) = value else {
            self.set_item(&key, None);
            self.clear_local(&key);
            return Ok(());
        };
        let mut ips = Vec::new();
        for ip in &spec.expected_ips {
            match ip.parse::<IpAddr>() {
                Ok(a) => ips.push(a),
                Err(_) => {
                    self.set_item(&key, None);
                    self.clear_local(&key);
                    return Err(format!("spec.expectedIPs: {ip:?} is not an IP address"));
                }
            }
        }
        let named_ports = spec
            .ports
            .iter()
            .filter_map(|p| {
                let proto = match p.protocol.number()? {
                    6 => PortProtocol::Tcp,
                    17 => PortProtocol::Udp,
                    132 => PortProtocol::Sctp,
                    _ => return None,
                };
                Some((p.name.clone(), proto, u16::try_from(p.port).ok()?))
            })
            .collect();
        let payload = Payload {
            nets: ips.iter().map(|ip| Cidr::host(*ip)).collect(),
            named_ports,
        };
        let labels_changed = self.set_item(&key, Some((labels, spec.profiles.clone(), payload)));
        if spec.node == self.config.hostname {
            let data = HostEndpointData {
                interface: spec.interface_name.clone(),
                expected_ipv4: ips.iter().filter(|i| i.is_ipv4()).copied().collect(),
                expected_ipv6: ips.iter().filter(|i| i.is_ipv6()).copied().collect(),
                profile_ids: spec.profiles.clone(),
                tiers: Vec::new(),
                untracked_tiers: Vec::new(),
                pre_dnat_tiers: Vec::new(),
                forward_tiers: Vec::new(),
            };
            self.set_local(key, LocalKind::Hep { data }, spec.profiles, labels_changed);
        } else {
            self.clear_local(&key);
        }
        Ok(())
    }

    fn update_network_set(
        &mut self,
        key: ItemKey,
        namespace: Option<&str>,
        value: Option<(BTreeMap<String, String>, Vec<String>)>,
    ) -> Result<(), String> {
        let Some((mut labels, nets)) = value else {
            self.set_item(&key, None);
            return Ok(());
        };
        let mut cidrs = Vec::new();
        for n in &nets {
            match Cidr::parse_cidr_or_ip(n) {
                Ok(c) => cidrs.push(c.network()),
                Err(e) => {
                    self.set_item(&key, None);
                    return Err(format!("spec.nets: {e}"));
                }
            }
        }
        let mut parents = Vec::new();
        if let Some(ns) = namespace {
            labels.insert(LABEL_NAMESPACE.to_string(), ns.to_string());
            parents.push(format!("{NAMESPACE_PROFILE_PREFIX}{ns}"));
        }
        self.set_item(
            &key,
            Some((
                labels,
                parents,
                Payload {
                    nets: cidrs,
                    named_ports: Vec::new(),
                },
            )),
        );
        Ok(())
    }

    // ---- local endpoints and policy matching ------------------------------------------

    fn set_local(
        &mut self,
        key: ItemKey,
        kind: LocalKind,
        profiles: Vec<String>,
        labels_changed: bool,
    ) {
        let old_profiles = self.local.get(&key).map(|l| l.profiles.clone());
        let is_new = old_profiles.is_none();
        if old_profiles.as_ref() != Some(&profiles) {
            for p in &profiles {
                self.profile_ref(p, 1);
            }
            for p in old_profiles.iter().flatten() {
                self.profile_ref(p, -1);
            }
        }
        self.local
            .insert(key.clone(), LocalEndpoint { kind, profiles });
        if is_new || labels_changed {
            self.rematch_local(&key);
        }
        self.dirty_eps.insert(key);
    }

    fn clear_local(&mut self, key: &ItemKey) {
        let Some(old) = self.local.remove(key) else {
            return;
        };
        for p in &old.profiles {
            self.profile_ref(p, -1);
        }
        if let Some(pols) = self.local_policies.remove(key) {
            for p in pols {
                self.policy_unmatch(&p, key);
            }
        }
        self.dirty_eps.insert(key.clone());
    }

    /// Re-evaluates every policy's selector against one local endpoint.
    fn rematch_local(&mut self, key: &ItemKey) {
        let Some(id) = self.item_ids.get(key).copied() else {
            return;
        };
        let is_hep = matches!(key, ItemKey::Hep { .. });
        let Some(labels) = self.labels.effective_labels(id) else {
            return;
        };
        let now: BTreeSet<PolicyRef> = self
            .policies
            .iter()
            .filter(|(_, p)| (is_hep || p.applies_to_workloads()) && p.selector.matches(labels))
            .map(|(r, _)| r.clone())
            .collect();
        let before = self.local_policies.remove(key).unwrap_or_default();
        if before != now {
            for p in before.difference(&now) {
                self.policy_unmatch(p, key);
            }
            for p in now.difference(&before) {
                self.policy_match(p, key);
            }
            self.dirty_eps.insert(key.clone());
        }
        self.local_policies.insert(key.clone(), now);
    }

    fn policy_match(&mut self, policy: &PolicyRef, ep: &ItemKey) {
        let Some(st) = self.policies.get_mut(policy) else {
            return;
        };
        let was_active = !st.matched.is_empty();
        st.matched.insert(ep.clone());
        if !was_active {
            let sets: Vec<(String, IpSetSource)> = st
                .ip_sets
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for (id, src) in sets {
                self.acquire_ip_set(&id, &src);
            }
            self.dirty_policies.insert(policy.clone());
        }
    }

    fn policy_unmatch(&mut self, policy: &PolicyRef, ep: &ItemKey) {
        let Some(st) = self.policies.get_mut(policy) else {
            return;
        };
        if !st.matched.remove(ep) {
            return;
        }
        if st.matched.is_empty() {
            let ids: Vec<String> = st.ip_sets.keys().cloned().collect();
            for id in ids {
                self.release_ip_set(&id);
            }
            self.dirty_policies.insert(policy.clone());
        }
    }

    fn build_policy(
        &self,
        namespace: &str,
        name: &str,
        input: PolicyInput<'_>,
    ) -> Result<PolicyState, String> {
        let tier = if input.tier.is_empty() {
            DEFAULT_TIER.to_string()
        } else {
            input.tier.to_string()
        };
        let selector =
            parse_selector_or_all(input.selector).map_err(|e| format!("spec.selector: {e}"))?;
        let owner = format!("{tier}/{namespace}/{name}");
        let ScannedRules {
            inbound,
            outbound,
            ip_sets,
        } = rules::scan_rules(input.ingress, input.egress, namespace, &owner)
            .map_err(|e| e.to_string())?;
        let (ingress, egress) = policy_types(input.types, input.ingress, input.egress);
        let resolved = ResolvedPolicy {
            namespace: namespace.to_string(),
            tier: tier.clone(),
            // A policy that does not govern a direction has no rules for it.
            inbound: if ingress { inbound } else { Vec::new() },
            outbound: if egress { outbound } else { Vec::new() },
            untracked: input.do_not_track,
            pre_dnat: input.pre_dnat,
            apply_on_forward: input.apply_on_forward,
            original_selector: input.selector.to_string(),
        };
        let used: BTreeSet<&String> = resolved.ip_set_ids();
        let ip_sets = ip_sets
            .into_iter()
            .filter(|(id, _)| used.contains(id))
            .collect();
        Ok(PolicyState {
            id: PolicyId {
                tier,
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
            selector,
            order: input.order.unwrap_or(f64::INFINITY),
            ingress,
            egress,
            do_not_track: input.do_not_track,
            pre_dnat: input.pre_dnat,
            apply_on_forward: input.apply_on_forward,
            resolved: Arc::new(resolved),
            ip_sets,
            matched: BTreeSet::new(),
        })
    }

    fn update_policy(
        &mut self,
        pref: PolicyRef,
        state: Option<Result<PolicyState, String>>,
    ) -> Result<(), String> {
        let (new, err) = match state {
            None => (None, None),
            Some(Ok(s)) => (Some(s), None),
            Some(Err(e)) => (None, Some(e)),
        };
        let old = self.policies.remove(&pref);
        // Endpoints whose tier lists this policy is in (before or after) must be recomputed.
        if let Some(old) = &old {
            for ep in &old.matched {
                self.dirty_eps.insert(ep.clone());
                if let Some(set) = self.local_policies.get_mut(ep) {
                    set.remove(&pref);
                }
            }
        }
        if let Some(mut new) = new {
            let matched: Vec<ItemKey> = self
                .local
                .keys()
                .filter(|key| {
                    let is_hep = matches!(key, ItemKey::Hep { .. });
                    (is_hep || new.applies_to_workloads())
                        && self
                            .item_ids
                            .get(key)
                            .and_then(|id| self.labels.effective_labels(*id))
                            .is_some_and(|labels| new.selector.matches(labels))
                })
                .cloned()
                .collect();
            for key in matched {
                new.matched.insert(key.clone());
                self.local_policies
                    .entry(key.clone())
                    .or_default()
                    .insert(pref.clone());
                self.dirty_eps.insert(key);
            }
            // Acquire the new sets before releasing the old ones so shared sets survive.
            if !new.matched.is_empty() {
                for (id, src) in &new.ip_sets {
                    self.acquire_ip_set(id, src);
                }
            }
            self.policies.insert(pref.clone(), new);
        }
        if let Some(old) = old
            && !old.matched.is_empty()
        {
            for id in old.ip_sets.keys() {
                self.release_ip_set(id);
            }
        }
        self.dirty_policies.insert(pref);
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn update_tier(&mut self, name: &str, spec: Option<TierSpec>) {
        let changed = match spec {
            Some(s) => self.tiers.insert(name.to_string(), s.clone()) != Some(s),
            None => self.tiers.remove(name).is_some(),
        };
        if !changed {
            return;
        }
        // Tier order and default action are part of every endpoint's data using the tier.
        for (pref, st) in &self.policies {
            if st.id.tier == name {
                let _ = pref;
                self.dirty_eps.extend(st.matched.iter().cloned());
            }
        }
    }

    // ---- profiles ---------------------------------------------------------------------

    fn profile_ref(&mut self, name: &str, delta: i32) {
        let st = self.profiles.entry(name.to_string()).or_default();
        let was = st.refs;
        st.refs = if delta > 0 {
            st.refs + 1
        } else {
            st.refs.saturating_sub(1)
        };
        let now = st.refs;
        let sets: Vec<(String, IpSetSource)> = st
            .rules
            .as_ref()
            .map(|(_, s)| s.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        if was == 0 && now > 0 {
            for (id, src) in &sets {
                self.acquire_ip_set(id, src);
            }
            self.dirty_profiles.insert(name.to_string());
        } else if was > 0 && now == 0 {
            for (id, _) in &sets {
                self.release_ip_set(id);
            }
            self.dirty_profiles.insert(name.to_string());
        }
        self.gc_profile(name);
    }

    fn gc_profile(&mut self, name: &str) {
        if self
            .profiles
            .get(name)
            .is_some_and(|p| p.refs == 0 && p.rules.is_none() && p.labels.is_empty())
        {
            self.profiles.remove(name);
        }
    }

    fn update_profile(
        &mut self,
        name: &str,
        spec: Option<margay_api::policy::ProfileSpec>,
    ) -> Result<(), String> {
        let mut err = None;
        let (labels, rules) = match spec {
            None => (LabelMap::new(), None),
            Some(spec) => match rules::scan_rules(&spec.ingress, &spec.egress, "", name) {
                Ok(scanned) => {
                    let profile = ResolvedProfile {
                        inbound: scanned.inbound,
                        outbound: scanned.outbound,
                    };
                    (
                        spec.labels_to_apply,
                        Some((Arc::new(profile), scanned.ip_sets)),
                    )
                }
                Err(e) => {
                    err = Some(e.to_string());
                    (LabelMap::new(), None)
                }
            },
        };
        let st = self.profiles.entry(name.to_string()).or_default();
        let active = st.refs > 0;
        let old_rules = std::mem::replace(&mut st.rules, rules.clone());
        let labels_changed = st.labels != labels;
        st.labels = labels.clone();
        if active {
            if let Some((_, sets)) = &rules {
                for (id, src) in sets {
                    self.acquire_ip_set(id, src);
                }
            }
            if let Some((_, sets)) = &old_rules {
                for id in sets.keys() {
                    self.release_ip_set(id);
                }
            }
            self.dirty_profiles.insert(name.to_string());
        }
        if labels_changed {
            let mut changes = std::mem::take(&mut self.scratch_changes);
            changes.clear();
            let label_opt = if labels.is_empty() {
                None
            } else {
                Some(labels)
            };
            let changed_items = self.labels.update_parent(name, label_opt, &mut changes);
            self.apply_changes(&changes);
            changes.clear();
            self.scratch_changes = changes;
            let id_to_key: HashMap<ItemId, ItemKey> = if changed_items.is_empty() {
                HashMap::new()
            } else {
                self.local
                    .keys()
                    .filter_map(|k| self.item_ids.get(k).map(|id| (*id, k.clone())))
                    .collect()
            };
            for item in changed_items {
                if let Some(key) = id_to_key.get(&item) {
                    self.rematch_local(key);
                }
            }
        }
        // Namespace and service-account views of the Kubernetes profiles.
        if name.starts_with(NAMESPACE_PROFILE_PREFIX)
            || name.starts_with(SERVICE_ACCOUNT_PROFILE_PREFIX)
        {
            self.dirty_profiles.insert(name.to_string());
        }
        self.gc_profile(name);
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    // ---- IP sets ----------------------------------------------------------------------

    fn acquire_ip_set(&mut self, id: &str, source: &IpSetSource) {
        if let Some(st) = self.ip_sets.get_mut(id)
            && st.refs > 0
        {
            st.refs += 1;
            return;
        }
        let mut changes = std::mem::take(&mut self.scratch_changes);
        changes.clear();
        let sel = source
            .selector()
            .map(|s| self.labels.acquire(s, &mut changes));
        // A brand-new selector reports its initial matches; they are applied from `matches`
        // below instead, for this set only.
        changes.clear();
        self.scratch_changes = changes;
        let mut members: HashMap<IpSetMember, u32> = HashMap::new();
        if let Some(sel) = sel {
            let mut buf = Vec::new();
            for item in self.labels.matches(sel) {
                if let Some(p) = self.payloads.get(&item) {
                    p.members_for(source, &mut buf);
                    for m in buf.drain(..) {
                        *members.entry(m).or_insert(0) += 1;
                    }
                }
            }
            self.sel_users.entry(sel).or_default().push(id.to_string());
        }
        match self.ip_sets.get_mut(id) {
            // Released but not yet removed from the dataplane: revive it with a full update.
            Some(st) => {
                st.refs = 1;
                st.sel = sel;
                st.members = members;
                st.resend_full = true;
                st.added.clear();
                st.removed.clear();
            }
            None => {
                self.ip_sets.insert(
                    id.to_string(),
                    IpSetState {
                        source: source.clone(),
                        sel,
                        refs: 1,
                        members,
                        sent: false,
                        resend_full: false,
                        added: HashSet::new(),
                        removed: HashSet::new(),
                    },
                );
            }
        }
        self.dirty_ip_sets.insert(id.to_string());
    }

    fn release_ip_set(&mut self, id: &str) {
        let Some(st) = self.ip_sets.get_mut(id) else {
            return;
        };
        st.refs = st.refs.saturating_sub(1);
        if st.refs > 0 {
            return;
        }
        if let Some(sel) = st.sel.take() {
            if let Some(users) = self.sel_users.get_mut(&sel) {
                users.retain(|u| u != id);
                if users.is_empty() {
                    self.sel_users.remove(&sel);
                }
            }
            self.labels.release(sel);
        }
        st.members = HashMap::new();
        st.added.clear();
        st.removed.clear();
        if st.sent {
            self.dirty_ip_sets.insert(id.to_string());
        } else {
            self.ip_sets.remove(id);
        }
    }

    // ---- nodes, pools, routes ---------------------------------------------------------

    /// Changes one CIDR's route sources; `f` reports which node (if any) it added and
    /// removed a source for.
    fn modify_sources(&mut self, cidr: Cidr, f: impl FnOnce(&mut CidrSources) -> NodeDelta) {
        let entry = self.route_sources.entry(cidr).or_default();
        let delta = f(entry);
        if entry.is_empty() {
            self.route_sources.remove(&cidr);
        }
        if delta.added != delta.removed {
            if let Some(n) = delta.removed
                && let Some(counts) = self.node_cidrs.get_mut(&n)
            {
                if let Some(c) = counts.get_mut(&cidr) {
                    *c -= 1;
                    if *c == 0 {
                        counts.remove(&cidr);
                    }
                }
                if counts.is_empty() {
                    self.node_cidrs.remove(&n);
                }
            }
            if let Some(n) = delta.added {
                match self.node_cidrs.get_mut(&n) {
                    Some(counts) => *counts.entry(cidr).or_insert(0) += 1,
                    None => {
                        self.node_cidrs.insert(n, HashMap::from([(cidr, 1)]));
                    }
                }
            }
        }
        self.dirty_cidrs.insert(cidr);
    }

    fn update_node(&mut self, name: &str, value: Option<(BTreeMap<String, String>, NodeSpec)>) {
        let info = value.map(|(labels, spec)| {
            let bgp = spec.bgp.clone().unwrap_or_default();
            let cidr = |s: &str| {
                if s.is_empty() {
                    None
                } else {
                    Cidr::parse_cidr_or_ip(s).ok()
                }
            };
            let ip = |s: &str| cidr(s).map(|c| c.addr());
            NodeInfo {
                ipv4: cidr(&bgp.ipv4_address).filter(Cidr::is_ipv4),
                ipv6: cidr(&bgp.ipv6_address).filter(|c| !c.is_ipv4()),
                vxlan_v4: ip(&spec.ipv4_vxlan_tunnel_addr),
                vxlan_v6: ip(&spec.ipv6_vxlan_tunnel_addr),
                vxlan_mac: spec.vxlan_tunnel_mac_addr.clone(),
                vxlan_mac_v6: spec.vxlan_tunnel_mac_addr_v6.clone(),
                ipip_addr: ip(&bgp.ipv4_ipip_tunnel_addr),
                labels,
            }
        });
        let old = match &info {
            Some(i) => self.nodes.insert(name.to_string(), i.clone()),
            None => self.nodes.remove(name),
        };
        if old == info {
            return;
        }
        let old = old.unwrap_or_default();
        let new = info.unwrap_or_default();
        let host_cidrs = |i: &NodeInfo| -> Vec<Cidr> {
            [
                i.ipv4.map(|c| Cidr::host(c.addr())),
                i.ipv6.map(|c| Cidr::host(c.addr())),
            ]
            .into_iter()
            .flatten()
            .collect()
        };
        let tunnel_cidrs = |i: &NodeInfo| -> Vec<Cidr> {
            [i.vxlan_v4, i.vxlan_v6, i.ipip_addr]
                .into_iter()
                .flatten()
                .map(Cidr::host)
                .collect()
        };
        for c in host_cidrs(&old) {
            self.modify_sources(c, |s| NodeDelta {
                removed: s.hosts.remove(name).then(|| name.to_string()),
                added: None,
            });
        }
        for c in tunnel_cidrs(&old) {
            self.modify_sources(c, |s| NodeDelta {
                removed: s.tunnels.remove(name).then(|| name.to_string()),
                added: None,
            });
        }
        for c in host_cidrs(&new) {
            self.modify_sources(c, |s| NodeDelta {
                removed: None,
                added: s.hosts.insert(name.to_string()).then(|| name.to_string()),
            });
        }
        for c in tunnel_cidrs(&new) {
            self.modify_sources(c, |s| NodeDelta {
                removed: None,
                added: s.tunnels.insert(name.to_string()).then(|| name.to_string()),
            });
        }
        // Routes towards the node carry its address.
        if let Some(cidrs) = self.node_cidrs.get(name) {
            self.dirty_cidrs.extend(cidrs.keys().copied());
        }
        if name == self.config.hostname && old.ipv4 != new.ipv4 {
            // "Same subnet" is judged against this node's own address.
            self.dirty_cidrs.extend(self.route_sources.keys().copied());
        }
        self.dirty_nodes.insert(name.to_string());
    }

    fn update_pool(&mut self, name: &str, spec: Option<IPPoolSpec>) -> Result<(), String> {
        let mut err = None;
        let pool = spec.and_then(|spec| match Cidr::parse(&spec.cidr) {
            Ok(c) => Some(PoolData {
                cidr: c.network(),
                masquerade: spec.nat_outgoing,
                ipip: encap(spec.ipip_mode),
                vxlan: encap(spec.vxlan_mode),
                disabled: spec.disabled,
            }),
            Err(e) => {
                err = Some(format!("spec.cidr: {e}"));
                None
            }
        });
        let old = match &pool {
            Some(p) => self.pools.insert(name.to_string(), p.clone()),
            None => self.pools.remove(name),
        };
        if old == pool {
            return err.map_or(Ok(()), Err);
        }
        if let Some(old) = &old {
            self.modify_sources(old.cidr, |s| {
                s.pool = None;
                NodeDelta::default()
            });
        }
        if let Some(new) = &pool {
            let p = new.clone();
            self.modify_sources(new.cidr, |s| {
                s.pool = Some(p);
                NodeDelta::default()
            });
        }
        // Every route inside the old or new pool takes its encapsulation and NAT from it.
        let ranges: Vec<Cidr> = old.iter().chain(pool.iter()).map(|p| p.cidr).collect();
        let inside: Vec<Cidr> = self
            .route_sources
            .keys()
            .filter(|c| {
                ranges
                    .iter()
                    .any(|r| r.prefix() <= c.prefix() && r.contains(c.addr()))
            })
            .copied()
            .collect();
        self.dirty_cidrs.extend(inside);
        // Pools with the same CIDR under another name still count.
        for (other_name, p) in &self.pools {
            if other_name != name && ranges.contains(&p.cidr) {
                let p = p.clone();
                let cidr = p.cidr;
                let entry = self.route_sources.entry(cidr).or_default();
                entry.pool = Some(p);
            }
        }
        self.dirty_pools.insert(name.to_string());
        err.map_or(Ok(()), Err)
    }

    fn containing_pool(&self, cidr: &Cidr) -> Option<&PoolData> {
        self.pools
            .values()
            .filter(|p| {
                p.cidr.is_ipv4() == cidr.is_ipv4()
                    && p.cidr.prefix() <= cidr.prefix()
                    && p.cidr.contains(cidr.addr())
            })
            .max_by(|a, b| {
                a.cidr
                    .prefix()
                    .cmp(&b.cidr.prefix())
                    .then_with(|| b.cidr.cmp(&a.cidr))
            })
    }

    fn block_owner(&self, ip: IpAddr) -> Option<&String> {
        let max = if ip.is_ipv4() { 32 } else { 128 };
        (0..=max).rev().find_map(|len| {
            let c = Cidr::new(ip, len).ok()?.network();
            self.blocks.get(&c)
        })
    }

    fn compute_route(&self, cidr: &Cidr) -> Option<Route> {
        let src = self.route_sources.get(cidr)?;
        let me = &self.config.hostname;
        let mut types = route_type::CIDR_INFO;
        let mut dst_node: Option<&String> = None;
        let mut local_workload = false;
        // Workloads first: they are the most specific owner of an address.
        let wep_node = src
            .weps
            .values()
            .find(|n| *n == me)
            .or_else(|| src.weps.values().next());
        if let Some(node) = wep_node {
            let borrowed_or_listed = node == me
                || self.config.route_source == RouteSource::WorkloadIps
                || self.block_owner(cidr.addr()) != Some(node);
            if borrowed_or_listed {
                if node == me {
                    types |= route_type::LOCAL_WORKLOAD;
                    local_workload = true;
                } else {
                    types |= route_type::REMOTE_WORKLOAD;
                }
                dst_node = Some(node);
            }
        }
        if let Some(node) = &src.block {
            types |= if node == me {
                route_type::LOCAL_WORKLOAD
            } else {
                route_type::REMOTE_WORKLOAD
            };
            dst_node = dst_node.or(Some(node));
        }
        if let Some(node) = src.tunnels.iter().next() {
            types |= if node == me {
                route_type::LOCAL_TUNNEL
            } else {
                route_type::REMOTE_TUNNEL
            };
            dst_node = dst_node.or(Some(node));
        }
        if let Some(node) = src.hosts.iter().next() {
            types |= if node == me {
                route_type::LOCAL_HOST
            } else {
                route_type::REMOTE_HOST
            };
            dst_node = dst_node.or(Some(node));
        }
        let pool = self.containing_pool(cidr);
        if dst_node.is_none() && src.pool.is_none() {
            return None;
        }
        let pool_type = match pool {
            None => PoolType::None,
            Some(p) if p.vxlan != EncapMode::Never => PoolType::Vxlan,
            Some(p) if p.ipip != EncapMode::Never => PoolType::Ipip,
            Some(_) => PoolType::NoEncap,
        };
        let dst_info = dst_node.and_then(|n| self.nodes.get(n));
        let dst_node_ip = dst_info.and_then(|i| {
            if cidr.is_ipv4() {
                i.ipv4.map(|c| c.addr())
            } else {
                i.ipv6.map(|c| c.addr())
            }
        });
        let same_subnet = match (dst_node, dst_node_ip, self.nodes.get(me)) {
            (Some(n), Some(ip), Some(mine)) if n != me => {
                let my = if ip.is_ipv4() { mine.ipv4 } else { mine.ipv6 };
                my.is_some_and(|c| c.contains(ip))
            }
            _ => false,
        };
        Some(Route {
            dst: *cidr,
            types,
            pool_type,
            dst_node_name: dst_node.cloned().unwrap_or_default(),
            dst_node_ip,
            same_subnet,
            nat_outgoing: pool.is_some_and(|p| p.masquerade),
            local_workload,
        })
    }

    fn compute_vtep(&self, name: &str) -> Option<Vtep> {
        let n = self.nodes.get(name)?;
        let v4 = n.vxlan_v4.zip(n.ipv4.map(|c| c.addr()));
        let v6 = n.vxlan_v6.zip(n.ipv6.map(|c| c.addr()));
        if v4.is_none() && v6.is_none() {
            return None;
        }
        let mac = |m: &str, suffix: &str| {
            if m.is_empty() {
                vxlan_mac_for_node(&format!("{name}{suffix}"))
            } else {
                m.to_string()
            }
        };
        Some(Vtep {
            node: name.to_string(),
            mac: if v4.is_some() {
                mac(&n.vxlan_mac, "")
            } else {
                String::new()
            },
            ipv4_addr: v4.map(|(a, _)| a),
            parent_device_ip: v4.map(|(_, p)| p),
            mac_v6: if v6.is_some() {
                mac(&n.vxlan_mac_v6, "/v6")
            } else {
                String::new()
            },
            ipv6_addr: v6.map(|(a, _)| a),
            parent_device_ipv6: v6.map(|(_, p)| p),
        })
    }

    fn compute_encap(&self) -> Encap {
        let mut e = Encap {
            ipip: false,
            vxlan: false,
            vxlan_v6: false,
        };
        for p in self.pools.values() {
            if p.cidr.is_ipv4() {
                e.ipip |= p.ipip != EncapMode::Never;
                e.vxlan |= p.vxlan != EncapMode::Never;
            } else {
                e.vxlan_v6 |= p.vxlan != EncapMode::Never;
            }
        }
        e
    }

    // ---- tiers and endpoint data --------------------------------------------------------

    fn tier_sort_key(&self, tier: &str) -> (bool, f64, String) {
        match self.tiers.get(tier) {
            Some(spec) => (false, spec.order.unwrap_or(f64::INFINITY), tier.to_string()),
            None if tier == DEFAULT_TIER => (false, DEFAULT_TIER_ORDER, tier.to_string()),
            // A tier without its resource sorts after every valid tier (fail closed).
            None => (true, f64::INFINITY, tier.to_string()),
        }
    }

    fn tier_default_action(&self, tier: &str) -> RuleAction {
        match self.tiers.get(tier).and_then(|t| t.default_action) {
            Some(Action::Pass) => RuleAction::Pass,
            _ => RuleAction::Deny,
        }
    }

    /// Tiers (ordered) with the given policies (ordered within each tier).
    fn tiers_for(&self, policies: &[&PolicyState]) -> Vec<TierInfo> {
        let mut by_tier: BTreeMap<&str, Vec<&PolicyState>> = BTreeMap::new();
        for p in policies {
            by_tier.entry(p.id.tier.as_str()).or_default().push(p);
        }
        let mut tiers: Vec<(&str, Vec<&PolicyState>)> = by_tier.into_iter().collect();
        tiers.sort_by(|a, b| {
            let ka = self.tier_sort_key(a.0);
            let kb = self.tier_sort_key(b.0);
            ka.0.cmp(&kb.0)
                .then(ka.1.total_cmp(&kb.1))
                .then_with(|| ka.2.cmp(&kb.2))
        });
        tiers
            .into_iter()
            .map(|(name, mut pols)| {
                pols.sort_by(|a, b| {
                    a.order
                        .total_cmp(&b.order)
                        .then_with(|| a.id.name.cmp(&b.id.name))
                        .then_with(|| a.id.namespace.cmp(&b.id.namespace))
                });
                TierInfo {
                    name: name.to_string(),
                    default_action: self.tier_default_action(name),
                    ingress_policies: pols
                        .iter()
                        .filter(|p| p.ingress)
                        .map(|p| p.id.clone())
                        .collect(),
                    egress_policies: pols
                        .iter()
                        .filter(|p| p.egress)
                        .map(|p| p.id.clone())
                        .collect(),
                }
            })
            .collect()
    }

    fn endpoint_message(&self, key: &ItemKey) -> Option<Message> {
        let ep = self.local.get(key)?;
        let pols: Vec<&PolicyState> = self
            .local_policies
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|r| self.policies.get(r))
            .collect();
        Some(match &ep.kind {
            LocalKind::Wep { id, data } => {
                let mut data = data.clone();
                data.tiers = self.tiers_for(&pols);
                Message::WorkloadEndpointUpdate {
                    id: id.clone(),
                    endpoint: Arc::new(data),
                }
            }
            LocalKind::Hep { data } => {
                let mut data = data.clone();
                let pick = |f: &dyn Fn(&PolicyState) -> bool| -> Vec<&PolicyState> {
                    pols.iter().copied().filter(|p| f(p)).collect()
                };
                data.tiers = self.tiers_for(&pick(&|p| !p.do_not_track && !p.pre_dnat));
                data.untracked_tiers = self.tiers_for(&pick(&|p| p.do_not_track));
                data.pre_dnat_tiers = self.tiers_for(&pick(&|p| p.pre_dnat));
                data.forward_tiers = self.tiers_for(&pick(&|p| {
                    p.apply_on_forward && !p.do_not_track && !p.pre_dnat
                }));
                let name = match key {
                    ItemKey::Hep { name } => name.clone(),
                    _ => String::new(),
                };
                Message::HostEndpointUpdate {
                    id: name,
                    endpoint: Arc::new(data),
                }
            }
        })
    }

    // ---- flush ------------------------------------------------------------------------

    /// Emits everything that changed since the last flush, in the dataplane's dependency
    /// order: IP sets, policies, profiles, endpoints; then removals in reverse; then
    /// namespaces and service accounts; route removals, VTEP removals, VTEP additions,
    /// route additions; hosts, pools, encapsulation; and `InSync` last, once.
    pub fn flush(&mut self) -> Vec<Message> {
        let mut out = Vec::new();
        let mut ip_set_removes = Vec::new();
        let mut policy_removes = Vec::new();
        let mut profile_removes = Vec::new();
        let mut ep_removes = Vec::new();

        // IP sets.
        for id in std::mem::take(&mut self.dirty_ip_sets) {
            let Some(st) = self.ip_sets.get_mut(&id) else {
                continue;
            };
            if st.refs == 0 {
                if st.sent {
                    ip_set_removes.push(Message::IpSetRemove { id: id.clone() });
                }
                self.ip_sets.remove(&id);
                continue;
            }
            if !st.sent || st.resend_full {
                let mut members: Vec<IpSetMember> = st.members.keys().copied().collect();
                members.sort_unstable();
                out.push(Message::IpSetUpdate {
                    id: id.clone(),
                    kind: st.source.kind(),
                    members,
                });
                st.sent = true;
                st.resend_full = false;
            } else if !st.added.is_empty() || !st.removed.is_empty() {
                let mut added: Vec<IpSetMember> = st.added.iter().copied().collect();
                let mut removed: Vec<IpSetMember> = st.removed.iter().copied().collect();
                added.sort_unstable();
                removed.sort_unstable();
                out.push(Message::IpSetDeltaUpdate {
                    id: id.clone(),
                    added,
                    removed,
                });
            }
            st.added.clear();
            st.removed.clear();
        }

        // Policies.
        for pref in std::mem::take(&mut self.dirty_policies) {
            let desired = self
                .policies
                .get(&pref)
                .filter(|p| !p.matched.is_empty())
                .map(|p| (p.id.clone(), p.resolved.clone()));
            let sent = self.sent_policies.get(&pref);
            match (desired, sent) {
                (Some((id, pol)), sent) => {
                    if let Some((sent_id, _)) = sent
                        && *sent_id != id
                    {
                        policy_removes.push(Message::ActivePolicyRemove {
                            id: sent_id.clone(),
                        });
                    }
                    if sent.is_none_or(|(sid, spol)| *sid != id || **spol != *pol) {
                        out.push(Message::ActivePolicyUpdate {
                            id: id.clone(),
                            policy: pol.clone(),
                        });
                    }
                    self.sent_policies.insert(pref, (id, pol));
                }
                (None, Some(_)) => {
                    if let Some((id, _)) = self.sent_policies.remove(&pref) {
                        policy_removes.push(Message::ActivePolicyRemove { id });
                    }
                }
                (None, None) => {}
            }
        }

        // Profiles (and their namespace / service-account views).
        let mut ns_msgs = Vec::new();
        for name in std::mem::take(&mut self.dirty_profiles) {
            let st = self.profiles.get(&name);
            let desired = st.filter(|p| p.refs > 0).map(|p| match &p.rules {
                Some((profile, _)) => profile.clone(),
                None => {
                    let deny = rules::deny_all();
                    Arc::new(ResolvedProfile {
                        inbound: deny.inbound,
                        outbound: deny.outbound,
                    })
                }
            });
            match desired {
                Some(profile) => {
                    if self.sent_profiles.get(&name) != Some(&profile) {
                        out.push(Message::ActiveProfileUpdate {
                            id: name.clone(),
                            profile: profile.clone(),
                        });
                        self.sent_profiles.insert(name.clone(), profile);
                    }
                }
                None => {
                    if self.sent_profiles.remove(&name).is_some() {
                        profile_removes.push(Message::ActiveProfileRemove { id: name.clone() });
                    }
                }
            }
            let exists = st.is_some_and(|p| p.rules.is_some());
            let labels = st.map(|p| p.labels.clone()).unwrap_or_default();
            if let Some(ns) = name.strip_prefix(NAMESPACE_PROFILE_PREFIX) {
                let labels: BTreeMap<String, String> = labels
                    .into_iter()
                    .filter_map(|(k, v)| {
                        k.strip_prefix(NAMESPACE_LABEL_PREFIX)
                            .map(|k| (k.to_string(), v))
                    })
                    .collect();
                diff_labels(
                    &mut self.sent_namespaces,
                    ns,
                    exists.then_some(labels),
                    &mut ns_msgs,
                    |id, labels| Message::NamespaceUpdate { id, labels },
                    |id| Message::NamespaceRemove { id },
                );
            } else if let Some(rest) = name.strip_prefix(SERVICE_ACCOUNT_PROFILE_PREFIX) {
                let id = rest.replacen('.', "/", 1);
                let labels: BTreeMap<String, String> = labels
                    .into_iter()
                    .filter_map(|(k, v)| {
                        k.strip_prefix(SERVICE_ACCOUNT_LABEL_PREFIX)
                            .map(|k| (k.to_string(), v))
                    })
                    .collect();
                diff_labels(
                    &mut self.sent_service_accounts,
                    &id,
                    exists.then_some(labels),
                    &mut ns_msgs,
                    |id, labels| Message::ServiceAccountUpdate { id, labels },
                    |id| Message::ServiceAccountRemove { id },
                );
            }
        }

        // Endpoints.
        for key in std::mem::take(&mut self.dirty_eps) {
            let desired = self.endpoint_message(&key);
            let sent = self.sent_eps.get(&key);
            if desired.as_ref() == sent {
                continue;
            }
            if let Some(old) = sent {
                let remove = removal_for(old);
                let replaced = desired.as_ref().map(removal_for);
                // A workload whose identity changed: remove the old one.
                if replaced.as_ref() != Some(&remove) {
                    ep_removes.push(remove);
                }
            }
            match desired {
                Some(m) => {
                    out.push(m.clone());
                    self.sent_eps.insert(key, m);
                }
                None => {
                    self.sent_eps.remove(&key);
                }
            }
        }

        out.extend(ep_removes);
        out.extend(profile_removes);
        out.extend(policy_removes);
        out.extend(ip_set_removes);
        out.extend(ns_msgs);

        // Routes and VTEPs: removals, then VTEP changes, then additions.
        let mut route_removes = Vec::new();
        let mut route_adds = Vec::new();
        let mut dirty: Vec<Cidr> = std::mem::take(&mut self.dirty_cidrs).into_iter().collect();
        dirty.sort_unstable();
        for cidr in dirty {
            let desired = self.compute_route(&cidr);
            match desired {
                Some(r) => {
                    if self.sent_routes.get(&cidr) != Some(&r) {
                        self.sent_routes.insert(cidr, r.clone());
                        route_adds.push(Message::RouteUpdate(r));
                    }
                }
                None => {
                    if self.sent_routes.remove(&cidr).is_some() {
                        route_removes.push(Message::RouteRemove { dst: cidr });
                    }
                }
            }
        }
        let mut vtep_removes = Vec::new();
        let mut vtep_adds = Vec::new();
        let mut host_msgs = Vec::new();
        for name in std::mem::take(&mut self.dirty_nodes) {
            let desired = self.compute_vtep(&name);
            match desired {
                Some(v) => {
                    if self.sent_vteps.get(&name) != Some(&v) {
                        if self.sent_vteps.contains_key(&name) {
                            // Calico's dataplane expects a remove before a changed VTEP.
                            vtep_removes.push(Message::VtepRemove { node: name.clone() });
                        }
                        self.sent_vteps.insert(name.clone(), v.clone());
                        vtep_adds.push(Message::VtepUpdate(v));
                    }
                }
                None => {
                    if self.sent_vteps.remove(&name).is_some() {
                        vtep_removes.push(Message::VtepRemove { node: name.clone() });
                    }
                }
            }
            let host = self.nodes.get(&name).and_then(|n| {
                (n.ipv4.is_some() || n.ipv6.is_some()).then(|| Message::HostMetadataUpdate {
                    hostname: name.clone(),
                    ipv4: n.ipv4,
                    ipv6: n.ipv6,
                    labels: n.labels.clone(),
                })
            });
            match host {
                Some(m) => {
                    if self.sent_hosts.get(&name) != Some(&m) {
                        self.sent_hosts.insert(name.clone(), m.clone());
                        host_msgs.push(m);
                    }
                }
                None => {
                    if self.sent_hosts.remove(&name).is_some() {
                        host_msgs.push(Message::HostMetadataRemove {
                            hostname: name.clone(),
                        });
                    }
                }
            }
        }
        out.extend(route_removes);
        out.extend(vtep_removes);
        out.extend(vtep_adds);
        out.extend(route_adds);
        out.extend(host_msgs);

        for name in std::mem::take(&mut self.dirty_pools) {
            match self.pools.get(&name) {
                Some(p) => {
                    if self.sent_pools.get(&name) != Some(p) {
                        if let Some(old) = self.sent_pools.get(&name)
                            && old.cidr != p.cidr
                        {
                            out.push(Message::IpamPoolRemove {
                                id: pool_id(&old.cidr),
                            });
                        }
                        out.push(Message::IpamPoolUpdate {
                            id: pool_id(&p.cidr),
                            pool: p.clone(),
                        });
                        self.sent_pools.insert(name, p.clone());
                    }
                }
                None => {
                    if let Some(old) = self.sent_pools.remove(&name) {
                        out.push(Message::IpamPoolRemove {
                            id: pool_id(&old.cidr),
                        });
                    }
                }
            }
        }
        let encap = self.compute_encap();
        if self.sent_encap != Some(encap)
            && (self.sent_encap.is_some() || self.in_sync_pending || !self.pools.is_empty())
        {
            out.push(Message::Encapsulation {
                ipip: encap.ipip,
                vxlan: encap.vxlan,
                vxlan_v6: encap.vxlan_v6,
            });
            self.sent_encap = Some(encap);
        }
        if self.sent_service_cidrs.as_ref() != Some(&self.service_cidrs)
            && (self.sent_service_cidrs.is_some() || !self.service_cidrs.is_empty())
        {
            out.push(Message::GlobalBgpConfig(self.service_cidrs.clone()));
            self.sent_service_cidrs = Some(self.service_cidrs.clone());
        }
        if self.in_sync_pending {
            self.in_sync_pending = false;
            self.in_sync_sent = true;
            out.push(Message::InSync);
        }
        out
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
