//! The pure core: a [`DataplaneModel`] in, the maps' contents out (no kernel access).
//!
//! Each policy's and profile's rules per hook become one **block**, stored once however
//! many endpoints use it; per workload endpoint and hook, an ordered list of **steps**
//! (blocks and tier-end denies) gives the nftables dataplane's semantics
//! (crates/dataplane/src/nft/render.rs): from the workload, anti-spoofing and the
//! encapsulation drops first (the endpoint's own guard block); then each tier that has
//! policies for the direction (its policies in order, a Pass continues past the tier, the
//! tier's default action at its end); then the profiles (a Pass moves on to the next
//! profile); no verdict means deny. IP sets, and every rule's network lists, become entries
//! of one LPM trie keyed by a numeric set id.
//!
//! IPv4 only in this milestone: IPv6 rules, networks and members are left out (the program
//! drops IPv6).
//!
//! A policy beyond the fixed limits is refused for the endpoints it applies to, whole: the
//! affected hook gets an empty list (deny everything) and the error names policy, rule and
//! limit. Nothing is half-loaded.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use margay_api::net::Cidr;
use margay_calc::{
    DataplaneModel, IpSetMember, PolicyId, PortProtocol, PortRange, ResolvedMatch, ResolvedPolicy,
    ResolvedProfile, ResolvedRule, RuleAction, WorkloadEndpointData, WorkloadEndpointId,
};

use crate::layout::*;

/// Settings that change what the rules say (from Felix's configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileConfig {
    /// Drop VXLAN to this port from workloads (unless AllowVXLANPacketsFromWorkloads).
    pub workload_vxlan_port: Option<u16>,
    /// Drop IP-in-IP from workloads (unless AllowIPIPPacketsFromWorkloads).
    pub drop_ipip_from_workloads: bool,
}

impl Default for CompileConfig {
    fn default() -> Self {
        CompileConfig {
            workload_vxlan_port: Some(4789),
            drop_ipip_from_workloads: true,
        }
    }
}

/// A policy or endpoint the eBPF dataplane cannot hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    #[error(
        "endpoint {endpoint} ({hook}): {count} rules exceed the eBPF dataplane's limit of {limit} \
         per endpoint and direction; its traffic in that direction is denied until fewer \
         policies apply to it (or use the nftables dataplane: BPFEnabled=false)"
    )]
    TooManyRules {
        endpoint: String,
        hook: &'static str,
        count: usize,
        limit: usize,
    },
    #[error(
        "{owner}, {direction} rule {index}: {what} has {count} entries, more than the eBPF \
         dataplane's limit of {limit}; split the rule into several (the endpoints it applies \
         to deny that direction until then)"
    )]
    RuleTooLarge {
        owner: String,
        direction: &'static str,
        index: usize,
        what: String,
        count: usize,
        limit: usize,
    },
}

/// Numeric ids for IP sets (the model's, by id, and synthetic ones for rule networks and
/// endpoints' own addresses), kept stable while a set stays referenced so an unchanged rule
/// encodes the same.
#[derive(Debug, Default)]
pub struct SetIds {
    by_name: HashMap<String, u32>,
    next: u32,
    free: Vec<u32>,
}

impl SetIds {
    fn get(&mut self, name: &str) -> u32 {
        if let Some(id) = self.by_name.get(name) {
            return *id;
        }
        let id = self.free.pop().unwrap_or_else(|| {
            // 0 stays unused: an all-zero key is never a real entry.
            self.next += 1;
            self.next
        });
        self.by_name.insert(name.to_string(), id);
        id
    }

    /// Never hands out ids up to `max`: after a restart they may still be referenced by the
    /// rules the previous run left in the maps, until those are replaced.
    fn reserve_up_to(&mut self, max: u32) {
        self.next = self.next.max(max);
        self.free.retain(|id| *id > max);
    }

    /// Names `name` with `id` (a restored set with the same entries), unless either is
    /// taken or the id is 0.
    fn preassign(&mut self, name: &str, id: u32, taken: &mut HashSet<u32>) -> bool {
        if id == 0 || self.by_name.contains_key(name) || !taken.insert(id) {
            return false;
        }
        self.free.retain(|f| *f != id);
        self.by_name.insert(name.to_string(), id);
        true
    }

    /// Forgets every name not in `live`; their ids become reusable.
    fn retain(&mut self, live: &BTreeSet<String>) {
        let free = &mut self.free;
        self.by_name.retain(|n, id| {
            let keep = live.contains(n);
            if !keep {
                free.push(*id);
            }
            keep
        });
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

/// What a set's entries come from.
#[derive(Debug, Clone)]
enum SetSource {
    Model(String),
    Nets(Vec<Cidr>),
}

/// A block of rules stored once in the maps and shared by every endpoint that uses it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockKey {
    /// A policy's rules for a hook.
    Policy(PolicyId, usize),
    /// A profile's rules for a hook.
    Profile(String, usize),
    /// An endpoint's own guards (anti-spoofing, encapsulation drops; egress).
    Guard(WorkloadEndpointId),
}

/// One step of an endpoint hook's evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Evaluate the block; a Pass rule in it continues at step `pass_to`.
    Block { key: Arc<BlockKey>, pass_to: u32 },
    /// A tier's default action: deny (the tier's name, for flow events).
    Deny(Arc<str>),
}

/// One endpoint's compiled policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointRules {
    pub id: WorkloadEndpointId,
    /// Indexed by [`HOOK_FROM_WL`] and [`HOOK_TO_WL`]. Shared with the compiler's cache: an
    /// endpoint whose steps did not change gets the same `Arc` as last time. Empty: deny.
    pub steps: [Arc<Vec<Step>>; 2],
}

/// Everything the maps should hold.
#[derive(Debug, Default)]
pub struct Compiled {
    /// By host-side interface name.
    pub endpoints: BTreeMap<String, EndpointRules>,
    /// Every block the endpoints' steps reference (and possibly a few unused ones).
    pub blocks: HashMap<Arc<BlockKey>, Arc<Vec<Rule>>>,
    /// Entries of every referenced set, by set id.
    pub sets: BTreeMap<u32, BTreeSet<IpSetEntry>>,
    /// Refused policies and endpoints (their hooks hold no rules: deny).
    pub errors: Vec<CompileError>,
    /// Endpoints with a refused hook.
    pub refused_endpoints: BTreeSet<WorkloadEndpointId>,
}

impl Compiled {
    /// Rules stored (each block once).
    pub fn num_rules(&self) -> usize {
        self.blocks.values().map(|b| b.len()).sum()
    }

    pub fn num_set_entries(&self) -> usize {
        self.sets.values().map(BTreeSet::len).sum()
    }

    /// The endpoint hook's steps with their blocks' rules (for the simulator and tests).
    pub fn resolved(&self, iface: &str, hook: usize) -> Vec<(Step, Arc<Vec<Rule>>)> {
        self.endpoints
            .get(iface)
            .map(|e| {
                e.steps[hook]
                    .iter()
                    .map(|s| {
                        let rules = match s {
                            Step::Block { key, .. } => {
                                self.blocks.get(key).cloned().unwrap_or_default()
                            }
                            Step::Deny(_) => Arc::default(),
                        };
                        (s.clone(), rules)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// One policy's or profile's rules for one hook, compiled once and shared by every endpoint
/// it applies to.
#[derive(Debug)]
struct Frag {
    key: Arc<BlockKey>,
    rules: Result<Arc<Vec<Rule>>, CompileError>,
    refs: BTreeMap<String, SetSource>,
}

/// What an endpoint hook's list was built from: reused while none of it changed.
#[derive(Debug)]
struct EpCache {
    ep: Arc<WorkloadEndpointData>,
    frags: [Vec<Arc<Frag>>; 2],
    steps: [Result<Arc<Vec<Step>>, CompileError>; 2],
    /// An upper bound of the loop iterations per hook (rules + steps): exact when built,
    /// raised by the growth of policies replaced since (see `compile`).
    total: [usize; 2],
    guard: (Arc<BlockKey>, Arc<Vec<Rule>>),
    refs: BTreeMap<String, SetSource>,
}

/// The compiler: keeps set ids stable from one compile to the next, and caches compiled
/// policies, profiles and endpoint lists so that a batch costs what it changed.
#[derive(Debug, Default)]
pub struct Compiler {
    pub cfg: CompileConfig,
    ids: SetIds,
    policies: HashMap<(PolicyId, usize), (Arc<ResolvedPolicy>, Arc<Frag>)>,
    profiles: HashMap<(String, usize), (Arc<ResolvedProfile>, Arc<Frag>)>,
    endpoints: HashMap<WorkloadEndpointId, EpCache>,
    /// The model's policies and profiles at the last compile: when none changed, an endpoint
    /// whose own data did not change is reused without looking at its policies.
    last_policies: BTreeMap<PolicyId, Arc<ResolvedPolicy>>,
    last_profiles: BTreeMap<String, Arc<ResolvedProfile>>,
}

fn hook_name(hook: usize) -> &'static str {
    if hook == HOOK_FROM_WL {
        "egress (from the workload)"
    } else {
        "ingress (to the workload)"
    }
}

/// Sorted, overlapping and adjacent ranges merged.
fn merge_ports(ports: &[PortRange]) -> Vec<(u16, u16)> {
    let mut v: Vec<(u16, u16)> = ports.iter().map(|p| (p.first, p.last)).collect();
    v.sort_unstable();
    let mut out: Vec<(u16, u16)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(last) if u32::from(a) <= u32::from(last.1) + 1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

fn v4(nets: &[Cidr]) -> Vec<Cidr> {
    let mut v: Vec<Cidr> = nets
        .iter()
        .filter(|c| c.is_ipv4())
        .map(|c| c.network())
        .collect();
    v.sort();
    v.dedup();
    v
}

fn proto_num(p: PortProtocol) -> u8 {
    match p {
        PortProtocol::Tcp => 6,
        PortProtocol::Udp => 17,
        PortProtocol::Sctp => 132,
    }
}

/// A model set's trie entries (IPv4 members only).
fn model_entries<'a>(
    id: u32,
    members: impl IntoIterator<Item = &'a IpSetMember>,
) -> BTreeSet<IpSetEntry> {
    members
        .into_iter()
        .filter_map(|m| match m {
            IpSetMember::Net(c) => entries_of_nets(id, &[*c]).pop_first(),
            IpSetMember::IpPort {
                ip: IpAddr::V4(a),
                protocol,
                port,
            } => Some(IpSetEntry {
                set_id: id,
                addr: *a,
                prefix: None,
                port: *port,
                proto: proto_num(*protocol),
            }),
            IpSetMember::IpPort { .. } => None,
        })
        .collect()
}

/// A set's entries without their id: what two sets with equal members share.
type SetContent = Vec<(std::net::Ipv4Addr, Option<u8>, u16, u8)>;

fn content(entries: &BTreeSet<IpSetEntry>) -> SetContent {
    let mut c: SetContent = entries
        .iter()
        .map(|e| (e.addr, e.prefix, e.port, e.proto))
        .collect();
    c.sort_unstable();
    c
}

fn entries_of_nets(id: u32, nets: &[Cidr]) -> BTreeSet<IpSetEntry> {
    nets.iter()
        .filter_map(|c| match c.network().addr() {
            IpAddr::V4(a) => Some(IpSetEntry {
                set_id: id,
                addr: a,
                prefix: Some(c.prefix()),
                port: 0,
                proto: 0,
            }),
            IpAddr::V6(_) => None,
        })
        .collect()
}

/// Where in the model a rule comes from, for errors.
struct RuleCtx<'a> {
    owner: &'a str,
    direction: &'static str,
    index: usize,
}

impl Compiler {
    pub fn new(cfg: CompileConfig) -> Compiler {
        Compiler {
            cfg,
            ..Compiler::default()
        }
    }

    pub fn set_ids(&self) -> &SetIds {
        &self.ids
    }

    /// See [`SetIds::reserve_up_to`].
    pub fn reserve_set_ids(&mut self, max: u32) {
        self.ids.reserve_up_to(max);
    }

    /// After a restart, before the first compile: gives each restored set id (with its
    /// entries) to the set the model would fill with exactly those entries — a model set
    /// (`m:`), or rule networks (`n:`, named by their sorted networks as `nets_ref` names
    /// them) — so that blocks and steps referencing it encode as the restored ones and are
    /// claimed, not rewritten. A restored id nothing claims keeps its reservation; one
    /// given to a name no rule uses is released at the end of the compile (its old rules
    /// are retired by then, before any new set could get it). Returns how many were matched.
    pub fn match_restored_sets(
        &mut self,
        model: &DataplaneModel,
        restored: &BTreeMap<u32, BTreeSet<IpSetEntry>>,
    ) -> usize {
        let mut by_content: HashMap<SetContent, Vec<u32>> = HashMap::new();
        for (id, entries) in restored {
            if !entries.is_empty() {
                by_content.entry(content(entries)).or_default().push(*id);
            }
        }
        let mut taken: HashSet<u32> = self.ids.by_name.values().copied().collect();
        let mut matched = 0;
        for (mid, (_, members)) in &model.ip_sets {
            let c = content(&model_entries(0, members));
            if let Some(id) = by_content.get_mut(&c).and_then(Vec::pop)
                && self.ids.preassign(&format!("m:{mid}"), id, &mut taken)
            {
                matched += 1;
            }
        }
        for (c, ids) in by_content {
            let nets: Option<Vec<Cidr>> = c
                .iter()
                .map(|(a, p, _, _)| p.and_then(|p| Cidr::new(IpAddr::V4(*a), p).ok()))
                .collect();
            let (Some(nets), Some(id)) = (nets, ids.first()) else {
                continue;
            };
            let nets = v4(&nets);
            let name = format!(
                "n:{}",
                nets.iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            );
            if self.ids.preassign(&name, *id, &mut taken) {
                matched += 1;
            }
        }
        matched
    }

    /// Compiles the whole model. Set ids of sets no longer referenced are released. What did
    /// not change since the last compile (same `Arc`s in the model) is reused, not rebuilt.
    pub fn compile(&mut self, model: &DataplaneModel) -> Compiled {
        let mut out = Compiled::default();
        let mut used_policies = HashSet::new();
        let mut used_profiles = HashSet::new();
        let mut endpoints = HashMap::with_capacity(model.workload_endpoints.len());
        let mut live: BTreeMap<String, SetSource> = BTreeMap::new();
        // A batch that replaced no policy or profile (membership, endpoints): endpoints with
        // the same data are reused at once.
        let same_policies = model.policies.len() == self.last_policies.len()
            && model
                .policies
                .iter()
                .zip(&self.last_policies)
                .all(|((a, x), (b, y))| a == b && Arc::ptr_eq(x, y));
        let same_profiles = model.profiles.len() == self.last_profiles.len()
            && model
                .profiles
                .iter()
                .zip(&self.last_profiles)
                .all(|((a, x), (b, y))| a == b && Arc::ptr_eq(x, y));
        let fast = same_policies && same_profiles;
        // Policies replaced in place (the common policy edit): an endpoint's steps name
        // blocks, so they stay the same unless a replaced policy appeared, disappeared,
        // became empty or non-empty, was refused, or grew the endpoint past the limit.
        let grow = if fast || !same_profiles {
            None
        } else {
            self.replaced_policies_growth(model)
        };
        for (id, ep) in &model.workload_endpoints {
            if (fast || grow.is_some())
                && let Some(mut c) = self.endpoints.remove(id)
            {
                let fits = grow.is_none_or(|g| (0..2).all(|h| c.total[h] + g[h] <= MAX_RULES));
                if Arc::ptr_eq(&c.ep, ep) && fits {
                    if let Some(g) = grow {
                        for (t, g) in c.total.iter_mut().zip(g) {
                            *t += g;
                        }
                    }
                    self.reuse(id, ep, c, &mut out, &mut live, &mut endpoints);
                    continue;
                }
                self.endpoints.insert(id.clone(), c);
            }
            let mut frags: [Vec<Arc<Frag>>; 2] = [Vec::new(), Vec::new()];
            for (hook, list) in frags.iter_mut().enumerate() {
                for tier in &ep.tiers {
                    let policies = if hook == HOOK_TO_WL {
                        &tier.ingress_policies
                    } else {
                        &tier.egress_policies
                    };
                    for pid in policies {
                        if let Some(f) = self.policy_frag(model, pid, hook) {
                            used_policies.insert((pid.clone(), hook));
                            list.push(f);
                        }
                    }
                }
                for p in &ep.profile_ids {
                    if let Some(f) = self.profile_frag(model, p, hook) {
                        used_profiles.insert((p.clone(), hook));
                        list.push(f);
                    }
                }
            }
            let removed = self.endpoints.remove(id);
            let old = removed.as_ref().map(|c| c.steps.clone());
            let cached = removed.filter(|c| {
                Arc::ptr_eq(&c.ep, ep)
                    && (0..2).all(|h| {
                        c.frags[h].len() == frags[h].len()
                            && c.frags[h]
                                .iter()
                                .zip(&frags[h])
                                .all(|(a, b)| Arc::ptr_eq(a, b))
                    })
            });
            let entry = match cached {
                Some(c) => c,
                None => {
                    let mut e = self.build_endpoint(model, id, ep, frags);
                    // Steps name blocks, not rules: a policy whose rules changed leaves the
                    // steps of the endpoints using it as they were (same `Arc`: nothing to
                    // write for them).
                    if let Some(old) = old {
                        for (new, old) in e.steps.iter_mut().zip(old) {
                            if let (Ok(n), Ok(o)) = (&*new, &old)
                                && n == o
                            {
                                *new = Ok(o.clone());
                            }
                        }
                    }
                    e
                }
            };
            self.reuse(id, ep, entry, &mut out, &mut live, &mut endpoints);
        }
        self.endpoints = endpoints;
        if !fast && grow.is_none() {
            // (On the fast paths most endpoints were not looked at: what one that left no
            // longer uses is dropped at the next full pass.)
            self.policies.retain(|k, _| used_policies.contains(k));
            self.profiles.retain(|k, _| used_profiles.contains(k));
        }
        if !fast {
            self.last_policies = model.policies.clone();
            self.last_profiles = model.profiles.clone();
        }
        out.blocks
            .reserve(self.policies.len() + self.profiles.len() + out.endpoints.len());
        for f in self
            .policies
            .values()
            .map(|(_, f)| f)
            .chain(self.profiles.values().map(|(_, f)| f))
        {
            live.extend(f.refs.iter().map(|(k, v)| (k.clone(), v.clone())));
            // (An empty block is never a step.)
            if let Ok(rules) = &f.rules
                && !rules.is_empty()
            {
                out.blocks.insert(f.key.clone(), rules.clone());
            }
        }
        for c in self.endpoints.values() {
            out.blocks.insert(c.guard.0.clone(), c.guard.1.clone());
        }
        for (name, src) in &live {
            let id = self.ids.get(name);
            let entries = match src {
                SetSource::Nets(nets) => entries_of_nets(id, nets),
                SetSource::Model(mid) => match model.ip_sets.get(mid) {
                    None => BTreeSet::new(),
                    Some((_, members)) => model_entries(id, members),
                },
            };
            out.sets.insert(id, entries);
        }
        let live: BTreeSet<String> = live.into_keys().collect();
        self.ids.retain(&live);
        out
    }

    /// When the model differs from the last compile only by policies replaced in place, and
    /// each replaced policy's blocks keep their shape (compiled before and now, not refused,
    /// empty before iff empty now): recompiles those blocks and returns by how many rules
    /// they grew per hook at most. None: the endpoints must be looked at.
    fn replaced_policies_growth(&mut self, model: &DataplaneModel) -> Option<[usize; 2]> {
        if model.policies.len() != self.last_policies.len() {
            return None;
        }
        let mut replaced = Vec::new();
        for ((a, x), (b, y)) in model.policies.iter().zip(&self.last_policies) {
            if a != b {
                return None;
            }
            if !Arc::ptr_eq(x, y) {
                replaced.push(a.clone());
            }
        }
        let mut grow = [0usize; 2];
        for pid in replaced {
            for (hook, g) in grow.iter_mut().enumerate() {
                let shape = |f: &Frag| f.rules.as_ref().ok().map(|r| r.len());
                // Not compiled for this hook: no endpoint that is reused uses it there (each
                // compiled its policies when it was built, and a full pass keeps what any
                // endpoint uses).
                let Some((_, old)) = self.policies.get(&(pid.clone(), hook)) else {
                    continue;
                };
                let old = shape(old)?;
                let new = self
                    .policy_frag(model, &pid, hook)
                    .and_then(|f| shape(&f))?;
                if (old == 0) != (new == 0) {
                    return None;
                }
                *g += new.saturating_sub(old);
            }
        }
        Some(grow)
    }

    /// Puts an endpoint's (cached or fresh) lists into the output.
    fn reuse(
        &self,
        id: &WorkloadEndpointId,
        ep: &WorkloadEndpointData,
        entry: EpCache,
        out: &mut Compiled,
        live: &mut BTreeMap<String, SetSource>,
        endpoints: &mut HashMap<WorkloadEndpointId, EpCache>,
    ) {
        let mut steps: [Arc<Vec<Step>>; 2] = [Arc::default(), Arc::default()];
        for (hook, slot) in steps.iter_mut().enumerate() {
            match &entry.steps[hook] {
                Ok(list) => *slot = list.clone(),
                Err(e) => {
                    out.errors.push(e.clone());
                    out.refused_endpoints.insert(id.clone());
                }
            }
        }
        live.extend(entry.refs.iter().map(|(k, v)| (k.clone(), v.clone())));
        out.endpoints.insert(
            ep.interface.clone(),
            EndpointRules {
                id: id.clone(),
                steps,
            },
        );
        endpoints.insert(id.clone(), entry);
    }

    /// A policy's rules for a hook: from the cache while the model holds the same policy.
    fn policy_frag(
        &mut self,
        model: &DataplaneModel,
        pid: &PolicyId,
        hook: usize,
    ) -> Option<Arc<Frag>> {
        // The model's contract guarantees the policy exists; a missing one has no rules.
        let pol = model.policies.get(pid)?;
        let key = (pid.clone(), hook);
        if let Some((p, f)) = self.policies.get(&key)
            && Arc::ptr_eq(p, pol)
        {
            return Some(f.clone());
        }
        let list = if hook == HOOK_TO_WL {
            &pol.inbound
        } else {
            &pol.outbound
        };
        let owner = format!("policy {} (tier {})", pid, pid.tier);
        let block = Arc::new(BlockKey::Policy(pid.clone(), hook));
        let f = Arc::new(self.frag(block, list, &owner, hook));
        self.policies.insert(key, (pol.clone(), f.clone()));
        Some(f)
    }

    fn profile_frag(&mut self, model: &DataplaneModel, id: &str, hook: usize) -> Option<Arc<Frag>> {
        let prof = model.profiles.get(id)?;
        let key = (id.to_string(), hook);
        if let Some((p, f)) = self.profiles.get(&key)
            && Arc::ptr_eq(p, prof)
        {
            return Some(f.clone());
        }
        let list = if hook == HOOK_TO_WL {
            &prof.inbound
        } else {
            &prof.outbound
        };
        let block = Arc::new(BlockKey::Profile(id.to_string(), hook));
        let f = Arc::new(self.frag(block, list, &format!("profile {id}"), hook));
        self.profiles.insert(key, (prof.clone(), f.clone()));
        Some(f)
    }

    fn frag(
        &mut self,
        key: Arc<BlockKey>,
        list: &[ResolvedRule],
        owner: &str,
        hook: usize,
    ) -> Frag {
        let mut refs = BTreeMap::new();
        let mut rules = Vec::new();
        let r = self.rules(list, owner, hook, &mut refs, &mut rules);
        Frag {
            key,
            rules: r.map(|()| Arc::new(rules)),
            refs,
        }
    }

    fn build_endpoint(
        &mut self,
        model: &DataplaneModel,
        id: &WorkloadEndpointId,
        ep: &Arc<WorkloadEndpointData>,
        frags: [Vec<Arc<Frag>>; 2],
    ) -> EpCache {
        let mut refs = BTreeMap::new();
        let mut guard = Vec::new();
        self.workload_egress_guards(ep, &mut refs, &mut guard);
        let guard = (Arc::new(BlockKey::Guard(id.clone())), Arc::new(guard));
        let mut steps: [Result<Arc<Vec<Step>>, CompileError>; 2] =
            [Ok(Arc::default()), Ok(Arc::default())];
        let mut total = [0usize; 2];
        for (hook, slot) in steps.iter_mut().enumerate() {
            let r = self.endpoint_hook(model, id, ep, hook, &guard);
            match &r {
                Ok((_, n)) => total[hook] = *n,
                Err(e) => {
                    // Refused: the next full pass looks at it again.
                    total[hook] = MAX_RULES + 1;
                    tracing::error!(endpoint = %id, "{e}");
                }
            }
            *slot = r.map(|(s, _)| Arc::new(s));
        }
        EpCache {
            ep: ep.clone(),
            frags,
            steps,
            total,
            guard,
            refs,
        }
    }

    fn set_ref(&mut self, refs: &mut BTreeMap<String, SetSource>, model_id: &str) -> u32 {
        let name = format!("m:{model_id}");
        refs.entry(name.clone())
            .or_insert_with(|| SetSource::Model(model_id.to_string()));
        self.ids.get(&name)
    }

    fn nets_ref(&mut self, refs: &mut BTreeMap<String, SetSource>, nets: Vec<Cidr>) -> u32 {
        let name = format!(
            "n:{}",
            nets.iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        refs.entry(name.clone())
            .or_insert_with(|| SetSource::Nets(nets));
        self.ids.get(&name)
    }

    /// The endpoint hook's steps: (from the workload) its guards; each tier with policies
    /// for the direction (a Pass continues after the tier; a Deny step ends it unless its
    /// default action is Pass); then the profiles (a Pass continues at the next profile).
    /// The end of the list denies. Blocks without rules are left out.
    fn endpoint_hook(
        &mut self,
        model: &DataplaneModel,
        id: &WorkloadEndpointId,
        ep: &WorkloadEndpointData,
        hook: usize,
        guard: &(Arc<BlockKey>, Arc<Vec<Rule>>),
    ) -> Result<(Vec<Step>, usize), CompileError> {
        /// A Pass target not known yet (the end of the tier).
        const PENDING: u32 = u32::MAX;
        let mut steps = Vec::new();
        let mut rules = 0usize;
        if hook == HOOK_FROM_WL && !guard.1.is_empty() {
            rules += guard.1.len();
            steps.push(Step::Block {
                key: guard.0.clone(),
                pass_to: 1,
            });
        }
        for tier in &ep.tiers {
            let policies = if hook == HOOK_TO_WL {
                &tier.ingress_policies
            } else {
                &tier.egress_policies
            };
            if policies.is_empty() {
                continue;
            }
            let start = steps.len();
            for pid in policies {
                if let Some(f) = self.policy_frag(model, pid, hook) {
                    let list = f.rules.as_ref().map_err(Clone::clone)?;
                    if !list.is_empty() {
                        rules += list.len();
                        steps.push(Step::Block {
                            key: f.key.clone(),
                            pass_to: PENDING,
                        });
                    }
                }
            }
            if tier.default_action != RuleAction::Pass {
                steps.push(Step::Deny(Arc::from(tier.name.as_str())));
            }
            let end = steps.len() as u32;
            for s in &mut steps[start..] {
                if let Step::Block { pass_to, .. } = s
                    && *pass_to == PENDING
                {
                    *pass_to = end;
                }
            }
        }
        for p in &ep.profile_ids {
            if let Some(f) = self.profile_frag(model, p, hook) {
                let list = f.rules.as_ref().map_err(Clone::clone)?;
                if !list.is_empty() {
                    rules += list.len();
                    let next = steps.len() as u32 + 1;
                    steps.push(Step::Block {
                        key: f.key.clone(),
                        pass_to: next,
                    });
                }
            }
        }
        let count = rules + steps.len();
        if count > MAX_RULES {
            return Err(CompileError::TooManyRules {
                endpoint: id.to_string(),
                hook: hook_name(hook),
                count,
                limit: MAX_RULES,
            });
        }
        Ok((steps, count))
    }

    /// Anti-spoofing and the encapsulation drops, as the nft endpoint chain starts.
    fn workload_egress_guards(
        &mut self,
        ep: &WorkloadEndpointData,
        refs: &mut BTreeMap<String, SetSource>,
        rules: &mut Vec<Rule>,
    ) {
        let deny = |f: &dyn Fn(&mut Rule)| {
            let mut r = Rule {
                action: ACT_DENY,
                ..Rule::default()
            };
            f(&mut r);
            r
        };
        if let Some(port) = self.cfg.workload_vxlan_port {
            rules.push(deny(&|r| {
                r.flags = F_PROTO;
                r.proto = 17;
                r.dst.ports = vec![(port, port)];
            }));
        }
        if self.cfg.drop_ipip_from_workloads {
            rules.push(deny(&|r| {
                r.flags = F_PROTO;
                r.proto = 4;
            }));
        }
        let mut own = ep.ipv4_nets.clone();
        own.extend(ep.allow_spoofed_source_prefixes.iter().copied());
        let own = v4(&own);
        if own.is_empty() {
            rules.push(deny(&|_| {}));
        } else {
            let set = self.nets_ref(refs, own);
            rules.push(deny(&|r| r.src.not_sets = vec![set]));
        }
    }

    fn rules(
        &mut self,
        list: &[ResolvedRule],
        owner: &str,
        hook: usize,
        refs: &mut BTreeMap<String, SetSource>,
        out: &mut Vec<Rule>,
    ) -> Result<(), CompileError> {
        let direction = if hook == HOOK_TO_WL {
            "ingress"
        } else {
            "egress"
        };
        for (index, r) in list.iter().enumerate() {
            let ctx = RuleCtx {
                owner,
                direction,
                index,
            };
            if let Some(mut rule) = self.rule(r, &ctx, refs)? {
                rule.rule_index = u32::try_from(index).unwrap_or(u32::MAX);
                out.push(rule);
            }
        }
        Ok(())
    }

    /// One rule, or None when it can never match an IPv4 packet.
    fn rule(
        &mut self,
        r: &ResolvedRule,
        ctx: &RuleCtx<'_>,
        refs: &mut BTreeMap<String, SetSource>,
    ) -> Result<Option<Rule>, CompileError> {
        if r.ip_version == Some(6) || r.protocol == Some(58) {
            return Ok(None);
        }
        let mut out = Rule {
            action: match r.action {
                RuleAction::Allow => ACT_ALLOW,
                RuleAction::Deny => ACT_DENY,
                RuleAction::Pass => ACT_PASS,
                RuleAction::Log => ACT_LOG,
            },
            ..Rule::default()
        };
        if let Some(p) = r.protocol {
            out.flags |= F_PROTO;
            out.proto = p;
        }
        if let Some(p) = r.not_protocol {
            out.flags |= F_NOT_PROTO;
            out.not_proto = p;
        }
        if let Some(i) = r.icmp {
            out.flags |= F_ICMP_TYPE;
            out.icmp_type = i.icmp_type;
            if let Some(c) = i.code {
                out.flags |= F_ICMP_CODE;
                out.icmp_code = c;
            }
        }
        if let Some(i) = r.not_icmp {
            out.flags |= F_NOT_ICMP_TYPE;
            out.not_icmp_type = i.icmp_type;
            if let Some(c) = i.code {
                out.flags |= F_NOT_ICMP_CODE;
                out.not_icmp_code = c;
            }
        }
        let Some(src) = self.side(&r.src, ctx, "source", refs)? else {
            return Ok(None);
        };
        let Some(dst) = self.side(&r.dst, ctx, "destination", refs)? else {
            return Ok(None);
        };
        out.src = src;
        out.dst = dst;
        Ok(Some(out))
    }

    fn side(
        &mut self,
        m: &ResolvedMatch,
        ctx: &RuleCtx<'_>,
        which: &'static str,
        refs: &mut BTreeMap<String, SetSource>,
    ) -> Result<Option<Side>, CompileError> {
        let too_large = |what: &str, count: usize, limit: usize| {
            if count > limit {
                Err(CompileError::RuleTooLarge {
                    owner: ctx.owner.to_string(),
                    direction: ctx.direction,
                    index: ctx.index,
                    what: format!("the {which} side's {what}"),
                    count,
                    limit,
                })
            } else {
                Ok(())
            }
        };
        let mut s = Side::default();
        let nets = v4(&m.nets);
        if !m.nets.is_empty() && nets.is_empty() {
            return Ok(None);
        }
        if !nets.is_empty() {
            s.sets.push(self.nets_ref(refs, nets));
        }
        let not_nets = v4(&m.not_nets);
        if !not_nets.is_empty() {
            s.not_sets.push(self.nets_ref(refs, not_nets));
        }
        for id in &m.ip_set_ids {
            s.sets.push(self.set_ref(refs, id));
        }
        for id in &m.not_ip_set_ids {
            s.not_sets.push(self.set_ref(refs, id));
        }
        for id in &m.named_port_ip_set_ids {
            s.named.push(self.set_ref(refs, id));
        }
        for id in &m.not_named_port_ip_set_ids {
            s.not_named.push(self.set_ref(refs, id));
        }
        s.ports = merge_ports(&m.ports);
        s.not_ports = merge_ports(&m.not_ports);
        too_large("selectors and networks to match", s.sets.len(), MAX_SETS)?;
        too_large(
            "selectors and networks to exclude",
            s.not_sets.len(),
            MAX_SETS,
        )?;
        too_large("named ports to match", s.named.len(), MAX_NAMED)?;
        too_large("named ports to exclude", s.not_named.len(), MAX_NAMED)?;
        too_large("port ranges to match", s.ports.len(), MAX_PORTS)?;
        too_large("port ranges to exclude", s.not_ports.len(), MAX_PORTS)?;
        Ok(Some(s))
    }
}
