//! Renders the desired dataplane state into nftables objects (pure).
//!
//! One table (`inet margay`). Packets from and to workload interfaces are dispatched through
//! verdict maps keyed by interface name (O(1)); each endpoint has a to-workload (`tw-`) and a
//! from-workload (`fw-`) chain that runs its tiers (one sub-chain per tier) and then its
//! profiles; each active policy and profile has a chain per direction. Policy chains report a
//! decision in two mark bits (accept, pass) and return, so the two endpoints of a
//! workload-to-workload flow are both checked in the one forward hook:
//!
//! ```text
//! forward: ct established/related accept ─► from-wl (fw-<if>: egress) ─► to-wl (tw-<if>: ingress)
//! input:   from a workload ─► wl-to-host (fw-<if>, then DefaultEndpointToHostAction)
//! fw-<if>: clear marks ─► fw-<if>-<tier>… ([guard] jump po-*; [accept/pass bit ⇒ return])
//!          ─► (accept bit ⇒ return) ─► pro-* (accept bit ⇒ return) ─► drop
//! tw-<if>: clear marks ─► tw-<if>-<tier>… ([guard] jump pi-*; [pass bit ⇒ return]) ─► pri-* ─► drop
//! ```
//!
//! Every new connection walks these chains (established ones are accepted first), so the tier
//! chains keep the per-policy cost low, without changing any verdict:
//!
//! - **Guards**: the jump to a policy's chain carries a condition every one of its rules (for
//!   that direction) implies — the union of their protocols, and of their destination ports
//!   when every rule lists ports and no named port (`jump_guard`). A packet that fails it
//!   would match no rule, get no verdict and come back, so it skips the chain with one
//!   comparison. A policy without rules in the direction is not jumped to at all.
//! - **Ingress accepts directly**: `tw-<if>` runs last in the forward hook (the sender's
//!   egress ran before, and nothing in `forward` follows `to-wl`: keep it so), so an Allow in
//!   an ingress chain (`pi-`/`pri-`) sets the accept bit and accepts instead of returning.
//!   Egress chains still return with the bit, because the receiver's ingress (forward hook)
//!   or DefaultEndpointToHostAction (input hook) comes after them.
//! - **Mark tests only where a mark can be set**: after a jump, the tier chain tests only the
//!   bits that policy's chain can return with (accept: an egress Allow; pass: a Pass), and
//!   nothing for a chain that only drops, accepts or falls through. Ingress endpoint chains
//!   test nothing after tiers and profiles: those return only without the accept bit.
//!
//! Unknown workload interfaces are dropped (fail closed); an endpoint without an accepting
//! policy or profile drops.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;

use margay_api::net::Cidr;
use margay_calc::{
    DataplaneModel, EncapMode, IpSetKind, IpSetMember, PolicyId, ResolvedMatch, ResolvedPolicy,
    ResolvedProfile, ResolvedRule, RuleAction, TierInfo, WorkloadEndpointData, WorkloadEndpointId,
};

mod rules;
pub use rules::*;

mod base;
pub use base::*;

mod services;
pub use services::*;

/// What to do with traffic from a workload to its own host once its egress policy allowed it
/// (FelixConfiguration `defaultEndpointToHostAction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointToHostAction {
    Drop,
    Accept,
    /// Let the host's own rules decide.
    Return,
}

/// The verdict for traffic a policy allows (FilterAllowAction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllowVerdict {
    /// Accept at once (Calico's ACCEPT): ingress chains accept, which ends margay's base
    /// chain for the packet.
    Accept,
    /// Hand the packet back (Calico's RETURN): every policy chain returns with the accept
    /// mark and margay's base chain goes on to its end (service-loop prevention, then the
    /// chain's policy).
    Return,
}

/// The verdict for traffic policy denies, and for everything else margay refuses
/// (FilterDenyAction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyVerdict {
    Drop,
    /// Refuse with an ICMP/ICMPv6 "port unreachable" (a TCP client fails at once).
    Reject,
}

impl DenyVerdict {
    pub fn as_nft(self) -> &'static str {
        match self {
            DenyVerdict::Drop => "drop",
            DenyVerdict::Reject => "reject",
        }
    }
}

/// Outgoing NAT for pools with `natOutgoing` (NATOutgoingExclusions, NATPortRange,
/// NATOutgoingAddress, IptablesNATOutgoingInterfaceFilter).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatOutgoing {
    /// IPPoolsAndHostIPs: traffic to the cluster's hosts is not NATed either.
    pub exclude_hosts: bool,
    /// Only NAT traffic leaving through interfaces matching this nft pattern (`eth*`).
    pub oif: Option<String>,
    /// Source ports for TCP and UDP (other protocols keep the kernel's choice).
    pub port_range: Option<(u16, u16)>,
    /// SNAT to this address instead of masquerading to the outgoing interface's.
    pub address: Option<std::net::Ipv4Addr>,
}

/// What to do with traffic to service CIDRs that kube-proxy did not translate
/// (ServiceLoopPrevention).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceLoop {
    Drop,
    Reject,
    Disabled,
}

#[derive(Debug, Clone)]
pub struct NftConfig {
    pub table: String,
    pub workload_prefixes: Vec<String>,
    pub endpoint_to_host: EndpointToHostAction,
    /// Mark bit a policy sets when it accepts.
    pub mark_accept: u32,
    /// Mark bit a policy sets when it passes to the next tier.
    pub mark_pass: u32,
    pub ipv6: bool,
    /// Set when VXLAN is on: only known hosts may send VXLAN to this host.
    pub vxlan_port: Option<u16>,
    /// VXLAN packets (to this UDP port) from workloads are refused (None:
    /// AllowVXLANPacketsFromWorkloads).
    pub workload_vxlan_port: Option<u16>,
    /// IP-in-IP packets from workloads are refused (not AllowIPIPPacketsFromWorkloads).
    pub drop_ipip_from_workloads: bool,
    /// LogPrefix, with Calico's `%t` (tier), `%k` (kind), `%n` (name) and `%p`
    /// (namespace/name) filled in per policy.
    pub log_prefix: String,
    /// LogActionRateLimit (`10/second`) and LogActionRateLimitBurst.
    pub log_rate: Option<(String, u32)>,
    pub allow: AllowVerdict,
    pub deny: DenyVerdict,
    /// Refuse packets conntrack classifies as invalid (not DisableConntrackInvalidCheck).
    pub conntrack_invalid_drop: bool,
    pub nat: NatOutgoing,
    /// ExternalNodesCIDRList: non-Calico nodes, treated as hosts (their VXLAN is accepted;
    /// with IPPoolsAndHostIPs they are not NATed).
    pub external_nodes: Vec<Cidr>,
    pub service_loop: ServiceLoop,
    /// NFTablesFlowTableOffload: established flows are offloaded to the flowtable
    /// [`FLOWTABLE`] (the driver declares it and adds the interfaces).
    pub flow_offload: bool,
    /// Flow logs (FlowLogsLocalReporter): every verdict of a policy or profile rule, each
    /// tier's end and each endpoint's final drop first hands the packet to NFLOG group 1
    /// (ingress) or 2 (egress) with a prefix naming the rule (`margay_flows::RuleRef`).
    pub flow_logs: bool,
}

impl Default for NftConfig {
    fn default() -> Self {
        NftConfig {
            table: "margay".into(),
            workload_prefixes: vec!["cali".into()],
            endpoint_to_host: EndpointToHostAction::Drop,
            mark_accept: 0x10000,
            mark_pass: 0x20000,
            ipv6: true,
            vxlan_port: None,
            workload_vxlan_port: Some(4789),
            drop_ipip_from_workloads: true,
            log_prefix: "calico-packet".into(),
            log_rate: None,
            allow: AllowVerdict::Accept,
            deny: DenyVerdict::Drop,
            conntrack_invalid_drop: true,
            nat: NatOutgoing::default(),
            external_nodes: Vec::new(),
            service_loop: ServiceLoop::Drop,
            flow_offload: false,
            flow_logs: false,
        }
    }
}

impl NftConfig {
    /// The deny verdict as nft writes it.
    fn deny(&self) -> &'static str {
        self.deny.as_nft()
    }

    /// Ingress chains accept directly (see `render_rule`) only with the ACCEPT verdict.
    fn ingress_accepts(&self) -> bool {
        self.allow == AllowVerdict::Accept
    }
}

/// Whose rule a Log action belongs to, for Calico's log prefix specifiers.
#[derive(Debug, Clone, Copy)]
pub struct LogOwner<'a> {
    pub tier: &'a str,
    /// `np`, `gnp`, `knp` or `pro`.
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl<'a> LogOwner<'a> {
    pub fn policy(id: &'a PolicyId) -> LogOwner<'a> {
        let kind = if id.namespace.is_empty() {
            "gnp"
        } else if id.name.starts_with("knp.default.") {
            "knp"
        } else {
            "np"
        };
        LogOwner {
            tier: &id.tier,
            kind,
            namespace: &id.namespace,
            name: &id.name,
        }
    }

    pub fn profile(id: &'a str) -> LogOwner<'a> {
        LogOwner {
            tier: "",
            kind: "pro",
            namespace: "",
            name: id,
        }
    }
}

/// The kernel keeps at most 127 bytes of a log prefix.
const MAX_LOG_PREFIX: usize = 127;

/// Calico's log prefix: LogPrefix with `%t`, `%k`, `%n` and `%p` replaced (other `%`
/// sequences stay as written), without characters nft cannot quote, cut to what the kernel
/// keeps.
pub fn log_prefix(format: &str, owner: &LogOwner<'_>) -> String {
    let format = if format.is_empty() {
        "calico-packet"
    } else {
        format
    };
    let mut out = String::with_capacity(format.len());
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '%' {
            let spec = chars.peek().copied();
            let value = match spec {
                Some('t') => Some(owner.tier.to_string()),
                Some('k') => Some(owner.kind.to_string()),
                Some('n') => Some(owner.name.to_string()),
                Some('p') => Some(if owner.namespace.is_empty() {
                    owner.name.to_string()
                } else {
                    format!("{}/{}", owner.namespace, owner.name)
                }),
                _ => None,
            };
            if let Some(v) = value {
                chars.next();
                out.push_str(&v);
                continue;
            }
        }
        out.push(c);
    }
    let mut out: String = out.chars().filter(|c| *c != '"' && *c != '\\').collect();
    while out.len() > MAX_LOG_PREFIX {
        out.pop();
    }
    out
}

/// One rule: its text (after `add rule inet <table> <chain> `) and a short hash of it, which
/// is written as the rule's comment so the kernel's copy can be recognised when read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftRule {
    pub hash: String,
    pub text: String,
}

impl NftRule {
    pub fn new(text: String) -> NftRule {
        NftRule {
            hash: short_hash(&text),
            text,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSpec {
    /// `type filter hook forward priority filter; policy accept;` for base chains.
    pub base: Option<String>,
    pub rules: Vec<NftRule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetSpec {
    /// `type ipv4_addr; flags interval;`
    pub decl: String,
    pub elements: BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapSpec {
    /// `type ifname : verdict;`
    pub decl: String,
    /// key → verdict (`"cali123"` → `jump tw-cali123`).
    pub elements: BTreeMap<String, String>,
}

/// The complete desired table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NftState {
    pub sets: BTreeMap<String, SetSpec>,
    pub maps: BTreeMap<String, MapSpec>,
    pub chains: BTreeMap<String, ChainSpec>,
    /// The service ports, kept apart from the rest (their chains, sets and elements are not
    /// in the fields above) so that a change is planned per service port: with 10k services,
    /// comparing everything on every endpoint change would cost more than the change.
    /// [`NftState::flattened`] merges them in. (The pick chains they share are in `chains`.)
    pub services: ServiceSection,
}

/// Every service port's rendering, and what changed since the renderer's previous state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceSection {
    /// Every service port (in no particular order).
    pub all: Vec<Arc<RenderedService>>,
    /// The renderer's count of states: `changed` leads from state `generation - 1` here.
    pub generation: u64,
    /// (before, after) per service port whose rendering changed, appeared or went.
    pub changed: Vec<ServiceChange>,
    /// UDP flows the change leaves pointing at the wrong place (deleted after the write).
    pub stale_udp: Vec<crate::conntrack::StaleUdp>,
}

/// One service port's rendering before and after a change (None: absent).
pub type ServiceChange = (Option<Arc<RenderedService>>, Option<Arc<RenderedService>>);

impl NftState {
    pub fn num_rules(&self) -> usize {
        self.chains.values().map(|c| c.rules.len()).sum::<usize>()
            + self
                .services
                .all
                .iter()
                .flat_map(|r| &r.chains)
                .map(|(_, c)| c.rules.len())
                .sum::<usize>()
    }

    pub fn num_chains(&self) -> usize {
        self.chains.len()
            + self
                .services
                .all
                .iter()
                .map(|r| r.chains.len())
                .sum::<usize>()
    }

    pub fn num_elements(&self) -> usize {
        self.sets.values().map(|s| s.elements.len()).sum::<usize>()
            + self.maps.values().map(|m| m.elements.len()).sum::<usize>()
            + self
                .services
                .all
                .iter()
                .map(|r| r.elements.len() + r.set_elements.len())
                .sum::<usize>()
    }

    /// The same table with the service ports merged into sets, maps and chains.
    pub fn flattened(&self) -> NftState {
        let mut st = NftState {
            sets: self.sets.clone(),
            maps: self.maps.clone(),
            chains: self.chains.clone(),
            services: ServiceSection::default(),
        };
        for r in &self.services.all {
            add_service(&mut st, r);
        }
        st
    }
}

/// For the status API: what one endpoint compiled to.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct EndpointChains {
    pub interface: String,
    pub chains: Vec<String>,
    pub rules: usize,
}

/// FNV-1a, 64 bits, as 16 hex digits: stable across runs (chain names and rule comments must
/// be recognisable after a restart).
pub fn short_hash(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The nft set holding an IP set's members of one family.
pub fn set_name(id: &str, family: u8) -> String {
    match id.split_once(':') {
        Some((prefix, rest)) => format!("{prefix}{family}-{rest}"),
        None => format!("x{family}-{}", short_hash(id)),
    }
}

pub fn policy_chain(id: &PolicyId, ingress: bool) -> String {
    let key = format!("{}/{}/{}", id.tier, id.namespace, id.name);
    format!("{}-{}", if ingress { "pi" } else { "po" }, short_hash(&key))
}

pub fn profile_chain(id: &str, ingress: bool) -> String {
    format!("{}-{}", if ingress { "pri" } else { "pro" }, short_hash(id))
}

pub fn endpoint_chain(iface: &str, ingress: bool) -> String {
    format!("{}-{iface}", if ingress { "tw" } else { "fw" })
}

pub const MAP_INGRESS: &str = "wl-ingress";
pub const MAP_EGRESS: &str = "wl-egress";
pub const SET_WL_IFACES: &str = "wl-ifaces";
/// The flowtable established flows are offloaded to (NFTablesFlowTableOffload).
pub const FLOWTABLE: &str = "ft";

/// The declaration of [`FLOWTABLE`] with `devices` (none: an empty flowtable the rules can
/// refer to; devices are added as workload interfaces appear).
pub fn flowtable_decl(table: &str, devices: &[String]) -> String {
    let mut s = format!("add flowtable inet {table} {FLOWTABLE} {{ hook ingress priority filter;");
    if !devices.is_empty() {
        let quoted: Vec<String> = devices.iter().map(|d| format!("\"{d}\"")).collect();
        let _ = write!(s, " devices = {{ {} }};", quoted.join(", "));
    }
    s.push_str(" }");
    s
}

/// Service CIDRs (BGPConfiguration `default`), per family: `svc-cidrs-4`, `svc-cidrs-6`.
pub const SET_SERVICE_CIDRS: &str = "svc-cidrs";

/// How a tier chain calls one direction of a policy (derived once per policy render).
#[derive(Debug, Clone, PartialEq, Eq)]
struct PolicyCall {
    /// The chain has no rules: it can never give a verdict, so it is not jumped to.
    empty: bool,
    /// See `jump_guard`.
    guard: Option<String>,
    /// Mark bits the chain can return with, which the tier chain must test after the jump
    /// (0: it only drops, accepts or falls through, so there is nothing to test).
    returns_marks: u32,
}

impl PolicyCall {
    fn new(rules: &[ResolvedRule], cfg: &NftConfig, ingress: bool) -> PolicyCall {
        let returns_marks = rules.iter().fold(0, |bits, r| match r.action {
            // Ingress chains accept directly (see `render_rule`), with the ACCEPT verdict.
            RuleAction::Allow if !ingress || !cfg.ingress_accepts() => bits | cfg.mark_accept,
            RuleAction::Pass => bits | cfg.mark_pass,
            _ => bits,
        });
        PolicyCall {
            empty: rules.is_empty(),
            guard: jump_guard(rules),
            returns_marks,
        }
    }

    /// A policy the renderer does not know: jump unconditionally and test both bits (what
    /// every call was before guards; the model never references a missing policy).
    fn unknown(cfg: &NftConfig) -> PolicyCall {
        PolicyCall {
            empty: false,
            guard: None,
            returns_marks: cfg.mark_accept | cfg.mark_pass,
        }
    }
}

/// A rendered policy: its value (to recognise it unchanged), then per direction (ingress,
/// egress) its chain and how tier chains call it.
type RenderedPolicy = (
    Arc<ResolvedPolicy>,
    (ChainSpec, PolicyCall),
    (ChainSpec, PolicyCall),
);

/// Renders policies and profiles, reusing the previous render of anything unchanged.
#[derive(Debug, Default)]
pub struct Renderer {
    policies: HashMap<PolicyId, RenderedPolicy>,
    profiles: HashMap<String, (Arc<ResolvedProfile>, ChainSpec, ChainSpec)>,
    /// Service ports, rendered once per value (a backend change re-renders one service),
    /// found by the address of the model's `Arc<ServicePort>`: an unchanged port is one
    /// cheap lookup, no hashing or comparing of its identity (10k of them per change). The
    /// entry holds that `Arc`, so the address cannot be reused while it is a key.
    services: HashMap<usize, CachedService, PtrHash>,
    /// The cache key of each port's current entry, for the ports that changed.
    service_keys: HashMap<margay_calc::services::ServicePortId, usize>,
    /// The highest backend count seen per pick chain since services appeared: the chain
    /// has a rule (and a set) for every count up to it, so a service's count changing is
    /// only set elements moving (a rule written into a chain makes the kernel walk the
    /// whole backend map it uses: 20–50 ms with 10k services).
    picks: BTreeMap<(u8, margay_calc::PortProtocol, char), usize>,
    /// Renders so far (see [`ServiceSection::generation`]).
    generation: u64,
    cfg_key: String,
}

/// A hasher for pointer-sized keys (a multiplicative hash; the keys are addresses).
#[derive(Debug, Default, Clone, Copy)]
struct PtrHash;

impl std::hash::BuildHasher for PtrHash {
    type Hasher = PtrHasher;
    fn build_hasher(&self) -> PtrHasher {
        PtrHasher(0)
    }
}

#[derive(Debug, Default)]
struct PtrHasher(u64);

impl std::hash::Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
}

#[derive(Debug)]
struct CachedService {
    id: margay_calc::services::ServicePortId,
    port: Arc<margay_calc::services::ServicePort>,
    rendered: Arc<RenderedService>,
    /// The generation that last saw the port in the model.
    seen: u64,
}

impl Renderer {
    pub fn new() -> Renderer {
        Renderer::default()
    }

    /// The full desired table for the model.
    pub fn render(
        &mut self,
        model: &DataplaneModel,
        cfg: &NftConfig,
    ) -> (NftState, Vec<EndpointChains>) {
        let cfg_key = format!("{cfg:?}");
        if cfg_key != self.cfg_key {
            self.policies.clear();
            self.profiles.clear();
            self.services.clear();
            self.service_keys.clear();
            self.picks.clear();
            self.cfg_key = cfg_key;
            // What was rendered before is forgotten: no delta leads to this state.
            self.generation += 1;
        }
        self.generation += 1;
        let mut st = NftState::default();
        let families: &[u8] = if cfg.ipv6 { &[4, 6] } else { &[4] };

        // IP sets.
        for (id, (kind, members)) in &model.ip_sets {
            for &family in families {
                let (decl, elements): (String, BTreeSet<String>) = match kind {
                    IpSetKind::Net => {
                        let cidrs = members.iter().filter_map(|m| match m {
                            IpSetMember::Net(c) if c.version() == family => Some(*c),
                            _ => None,
                        });
                        (
                            format!(
                                "type {}; flags interval;",
                                if family == 4 {
                                    "ipv4_addr"
                                } else {
                                    "ipv6_addr"
                                }
                            ),
                            normalize_cidrs(cidrs).iter().map(cidr_elem).collect(),
                        )
                    }
                    IpSetKind::IpAndPort => (
                        format!(
                            "type {} . inet_proto . inet_service;",
                            if family == 4 {
                                "ipv4_addr"
                            } else {
                                "ipv6_addr"
                            }
                        ),
                        members
                            .iter()
                            .filter_map(|m| match m {
                                IpSetMember::IpPort { ip, protocol, port }
                                    if (ip.is_ipv4()) == (family == 4) =>
                                {
                                    Some(format!("{ip} . {protocol} . {port}"))
                                }
                                _ => None,
                            })
                            .collect(),
                    ),
                };
                st.sets
                    .insert(set_name(id, family), SetSpec { decl, elements });
            }
        }

        // Policies and profiles (cached by identity of the shared value).
        let mut live_policies = BTreeSet::new();
        for (id, pol) in &model.policies {
            live_policies.insert(id.clone());
            let cached = self
                .policies
                .get(id)
                .filter(|(p, _, _)| Arc::ptr_eq(p, pol) || **p == **pol);
            let (ci, co) = match cached {
                Some((_, (i, _), (o, _))) => (i.clone(), o.clone()),
                None => {
                    let owner = LogOwner::policy(id);
                    let i = rules_chain(&pol.inbound, cfg, &owner, true);
                    let o = rules_chain(&pol.outbound, cfg, &owner, false);
                    let calls = (
                        PolicyCall::new(&pol.inbound, cfg, true),
                        PolicyCall::new(&pol.outbound, cfg, false),
                    );
                    self.policies.insert(
                        id.clone(),
                        (pol.clone(), (i.clone(), calls.0), (o.clone(), calls.1)),
                    );
                    (i, o)
                }
            };
            st.chains.insert(policy_chain(id, true), ci);
            st.chains.insert(policy_chain(id, false), co);
        }
        self.policies.retain(|id, _| live_policies.contains(id));
        let mut live_profiles = BTreeSet::new();
        for (id, prof) in &model.profiles {
            live_profiles.insert(id.clone());
            let cached = self
                .profiles
                .get(id)
                .filter(|(p, _, _)| Arc::ptr_eq(p, prof) || **p == **prof);
            let (ci, co) = match cached {
                Some((_, i, o)) => (i.clone(), o.clone()),
                None => {
                    let owner = LogOwner::profile(id);
                    let i = rules_chain(&prof.inbound, cfg, &owner, true);
                    let o = rules_chain(&prof.outbound, cfg, &owner, false);
                    self.profiles
                        .insert(id.clone(), (prof.clone(), i.clone(), o.clone()));
                    (i, o)
                }
            };
            st.chains.insert(profile_chain(id, true), ci);
            st.chains.insert(profile_chain(id, false), co);
        }
        self.profiles.retain(|id, _| live_profiles.contains(id));

        // Endpoints.
        let mut ingress_map = BTreeMap::new();
        let mut egress_map = BTreeMap::new();
        let mut ifaces = BTreeSet::new();
        let mut summaries = Vec::new();
        for (id, ep) in &model.workload_endpoints {
            if ep.interface.is_empty() {
                continue;
            }
            let iface = &ep.interface;
            let mut summary = EndpointChains {
                interface: iface.clone(),
                ..EndpointChains::default()
            };
            for ingress in [true, false] {
                let chains = endpoint_chains(id, ep, ingress, cfg, &self.policies);
                for (name, chain) in chains {
                    summary.rules += chain.rules.len();
                    summary.chains.push(name.clone());
                    st.chains.insert(name, chain);
                }
            }
            summaries.push(summary);
            ifaces.insert(format!("\"{iface}\""));
            ingress_map.insert(
                format!("\"{iface}\""),
                format!("jump {}", endpoint_chain(iface, true)),
            );
            egress_map.insert(
                format!("\"{iface}\""),
                format!("jump {}", endpoint_chain(iface, false)),
            );
        }
        st.maps.insert(
            MAP_INGRESS.into(),
            MapSpec {
                decl: "type ifname : verdict;".into(),
                elements: ingress_map,
            },
        );
        st.maps.insert(
            MAP_EGRESS.into(),
            MapSpec {
                decl: "type ifname : verdict;".into(),
                elements: egress_map,
            },
        );
        st.sets.insert(
            SET_WL_IFACES.into(),
            SetSpec {
                decl: "type ifname;".into(),
                elements: ifaces,
            },
        );

        // Pools and hosts.
        for &family in families {
            let pools: Vec<Cidr> = model
                .pools
                .values()
                .map(|p| p.cidr)
                .filter(|c| c.version() == family)
                .collect();
            let masq: Vec<Cidr> = model
                .pools
                .values()
                .filter(|p| p.masquerade)
                .map(|p| p.cidr)
                .filter(|c| c.version() == family)
                .collect();
            let hosts: Vec<Cidr> = model
                .hosts
                .values()
                .filter_map(|(v4, v6)| if family == 4 { *v4 } else { *v6 })
                .map(|c| Cidr::host(c.addr()))
                .chain(
                    cfg.external_nodes
                        .iter()
                        .filter(|c| c.version() == family)
                        .copied(),
                )
                .collect();
            let services: Vec<Cidr> = model
                .service_cidrs
                .all()
                .filter(|c| c.version() == family)
                .copied()
                .collect();
            let addr_type = if family == 4 {
                "ipv4_addr"
            } else {
                "ipv6_addr"
            };
            for (name, cidrs) in [
                (format!("all-pools-{family}"), pools),
                (format!("masq-pools-{family}"), masq),
                (format!("all-hosts-{family}"), hosts),
                (format!("{SET_SERVICE_CIDRS}-{family}"), services),
            ] {
                st.sets.insert(
                    name,
                    SetSpec {
                        decl: format!("type {addr_type}; flags interval;"),
                        elements: normalize_cidrs(cidrs).iter().map(cidr_elem).collect(),
                    },
                );
            }
        }
        let _ = EncapMode::Never;

        base_chains(
            &mut st,
            cfg,
            !model.pools.values().all(|p| !p.masquerade),
            !model.service_cidrs.is_empty(),
        );

        // Services (only while there are any).
        let generation = self.generation;
        let mut section = ServiceSection {
            all: Vec::with_capacity(model.services.len()),
            generation,
            changed: Vec::new(),
            stale_udp: Vec::new(),
        };
        for (id, sp) in &model.services {
            let key = Arc::as_ptr(sp) as usize;
            if let Some(c) = self.services.get_mut(&key) {
                c.seen = generation;
                section.all.push(c.rendered.clone());
                continue;
            }
            // New or changed: the port's previous entry, if any, is found by its identity.
            let old = self
                .service_keys
                .insert(id.clone(), key)
                .and_then(|old_key| self.services.remove(&old_key));
            let r = match &old {
                Some(c) if *c.port == **sp => c.rendered.clone(),
                _ => Arc::new(render_service(id, sp, cfg)),
            };
            section.stale_udp.extend(crate::conntrack::stale_udp(
                id.protocol,
                old.as_ref().map(|c| &*c.port),
                Some(sp),
            ));
            self.services.insert(
                key,
                CachedService {
                    id: id.clone(),
                    port: sp.clone(),
                    rendered: r.clone(),
                    seen: generation,
                },
            );
            let before = old.map(|c| c.rendered);
            if before.as_deref() != Some(&*r) {
                for p in &r.picks {
                    let high = self
                        .picks
                        .entry((p.family, p.proto, p.variant))
                        .or_default();
                    *high = (*high).max(p.backends);
                }
                section.changed.push((before, Some(r.clone())));
            }
            section.all.push(r);
        }
        let keys = &mut self.service_keys;
        self.services.retain(|key, c| {
            if c.seen != generation {
                section.changed.push((Some(c.rendered.clone()), None));
                section.stale_udp.extend(crate::conntrack::stale_udp(
                    c.id.protocol,
                    Some(&c.port),
                    None,
                ));
                if keys.get(&c.id) == Some(key) {
                    keys.remove(&c.id);
                }
            }
            c.seen == generation
        });
        if model.services.is_empty() {
            self.picks.clear();
        } else {
            service_base(&mut st, cfg);
            let all = self
                .picks
                .iter()
                .flat_map(|(&(family, proto, variant), &high)| {
                    (1..=high).map(move |backends| Pick {
                        family,
                        proto,
                        variant,
                        backends,
                    })
                });
            add_picks(&mut st, all);
        }
        st.services = section;
        (st, summaries)
    }
}

/// One tier's chain for one endpoint and direction. Per policy, in order: the jump, guarded
/// when the policy's rules allow it (`jump_guard`) and left out for a policy without rules in
/// this direction; after it, the test of the mark bits the policy can return with, only when
/// it can return with any (an ingress policy without Pass rules cannot: it accepts, drops or
/// falls through).
fn tier_chain(
    tier: &TierInfo,
    policies: &[PolicyId],
    ingress: bool,
    cfg: &NftConfig,
    rendered: &HashMap<PolicyId, RenderedPolicy>,
) -> ChainSpec {
    let both = cfg.mark_accept | cfg.mark_pass;
    let unknown = PolicyCall::unknown(cfg);
    // The marks are cleared so that a bit found after a jump was set by that policy.
    let mut rules = vec![format!("meta mark set meta mark and {:#x}", !both)];
    for p in policies {
        let call = rendered
            .get(p)
            .map(|(_, i, o)| if ingress { &i.1 } else { &o.1 })
            .unwrap_or(&unknown);
        if call.empty {
            continue;
        }
        let chain = policy_chain(p, ingress);
        rules.push(match &call.guard {
            Some(guard) => format!("{guard} jump {chain}"),
            None => format!("jump {chain}"),
        });
        if call.returns_marks != 0 {
            rules.push(format!(
                "meta mark and {:#x} != 0 return",
                call.returns_marks
            ));
        }
    }
    let end_log = |action: margay_flows::Action| -> String {
        if !cfg.flow_logs {
            return String::new();
        }
        let rule = margay_flows::RuleRef {
            action,
            direction: if ingress {
                margay_flows::Direction::Ingress
            } else {
                margay_flows::Direction::Egress
            },
            origin: margay_flows::Origin::EndOfTier {
                tier: tier.name.clone(),
            },
            rule_index: None,
        };
        format!("{} ", flow_log_statement(&rule))
    };
    rules.push(match tier.default_action {
        RuleAction::Pass => format!(
            "{}meta mark set meta mark | {:#x} return",
            end_log(margay_flows::Action::Pass),
            cfg.mark_pass
        ),
        _ => format!(
            "{}{} comment \"end of tier {}\"",
            end_log(margay_flows::Action::Deny),
            cfg.deny(),
            tier.name.replace('"', "")
        ),
    });
    ChainSpec {
        base: None,
        rules: rules.into_iter().map(NftRule::new).collect(),
    }
}

fn endpoint_chains(
    _id: &WorkloadEndpointId,
    ep: &WorkloadEndpointData,
    ingress: bool,
    cfg: &NftConfig,
    rendered: &HashMap<PolicyId, RenderedPolicy>,
) -> Vec<(String, ChainSpec)> {
    let main = endpoint_chain(&ep.interface, ingress);
    let both = cfg.mark_accept | cfg.mark_pass;
    let mut out = Vec::new();
    let mut rules: Vec<String> = Vec::new();
    let deny = cfg.deny();
    if !ingress {
        // Encapsulated packets from a workload could carry traffic past its egress policy
        // (unless AllowVXLANPacketsFromWorkloads / AllowIPIPPacketsFromWorkloads).
        if let Some(port) = cfg.workload_vxlan_port {
            rules.push(format!(
                "udp dport {port} {deny} comment \"VXLAN from a workload\""
            ));
        }
        if cfg.drop_ipip_from_workloads {
            rules.push(format!(
                "meta l4proto 4 {deny} comment \"IP-in-IP from a workload\""
            ));
        }
        // Anti-spoofing: a workload sends only from its own addresses (or those it may spoof).
        for family in [4u8, 6] {
            if family == 6 && !cfg.ipv6 {
                rules.push(format!("meta nfproto ipv6 {deny}"));
                continue;
            }
            let own: Vec<Cidr> = if family == 4 {
                ep.ipv4_nets.clone()
            } else {
                ep.ipv6_nets.clone()
            };
            let mut allowed = own;
            allowed.extend(
                ep.allow_spoofed_source_prefixes
                    .iter()
                    .filter(|c| c.version() == family),
            );
            let fam = fam_prefix(family);
            if allowed.is_empty() {
                rules.push(format!(
                    "meta nfproto {} {deny}",
                    if family == 4 { "ipv4" } else { "ipv6" }
                ));
            } else {
                rules.push(format!("{fam} saddr != {} {deny}", nets_list(&allowed)));
            }
        }
    }
    rules.push(format!("meta mark set meta mark and {:#x}", !both));
    for (i, tier) in ep.tiers.iter().enumerate() {
        let policies = if ingress {
            &tier.ingress_policies
        } else {
            &tier.egress_policies
        };
        if policies.is_empty() {
            continue;
        }
        let name = format!("{main}-{i}");
        out.push((
            name.clone(),
            tier_chain(tier, policies, ingress, cfg, rendered),
        ));
        rules.push(format!("jump {name}"));
        // With the ACCEPT verdict an ingress tier or profile returns only without the accept
        // bit (an Allow there accepts at once), so only egress needs the test.
        if !ingress || !cfg.ingress_accepts() {
            rules.push(format!("meta mark and {:#x} != 0 return", cfg.mark_accept));
        }
    }
    for p in &ep.profile_ids {
        rules.push(format!("jump {}", profile_chain(p, ingress)));
        if !ingress || !cfg.ingress_accepts() {
            rules.push(format!("meta mark and {:#x} != 0 return", cfg.mark_accept));
        }
    }
    let final_log = if cfg.flow_logs {
        let rule = margay_flows::RuleRef {
            action: margay_flows::Action::Deny,
            direction: if ingress {
                margay_flows::Direction::Ingress
            } else {
                margay_flows::Direction::Egress
            },
            origin: margay_flows::Origin::NoProfile,
            rule_index: None,
        };
        format!("{} ", flow_log_statement(&rule))
    } else {
        String::new()
    };
    rules.push(format!(
        "{final_log}{deny} comment \"no policy or profile allowed the packet\""
    ));
    out.push((
        main,
        ChainSpec {
            base: None,
            rules: rules.into_iter().map(NftRule::new).collect(),
        },
    ));
    out
}

/// Renders `add rule` lines with the hash comment.
pub fn rule_line(table: &str, chain: &str, rule: &NftRule) -> String {
    let mut s = String::with_capacity(rule.text.len() + 64);
    // A rule that already carries a comment keeps it; the hash goes first in that case.
    if let Some(idx) = rule.text.find(" comment \"") {
        let (head, tail) = rule.text.split_at(idx);
        let existing = tail.trim_start_matches(" comment \"").trim_end_matches('"');
        let _ = write!(
            s,
            "add rule inet {table} {chain} {head} comment \"{} {existing}\"",
            rule.hash
        );
    } else {
        let _ = write!(
            s,
            "add rule inet {table} {chain} {} comment \"{}\"",
            rule.text, rule.hash
        );
    }
    s
}

/// IP addresses of a rendered element list (for tests and diagnostics).
pub fn parse_addr_elements(elements: &BTreeSet<String>) -> Vec<IpAddr> {
    elements
        .iter()
        .filter_map(|e| e.split('/').next()?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests;
