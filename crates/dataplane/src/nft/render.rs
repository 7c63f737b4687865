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
//! tw-<if>: clear marks ─► tw-<if>-<tier>… (jump pi-*; accept/pass bit ⇒ return) ─► pri-* ─► drop
//! ```
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

/// What to do with traffic from a workload to its own host once its egress policy allowed it
/// (FelixConfiguration `defaultEndpointToHostAction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointToHostAction {
    Drop,
    Accept,
    /// Let the host's own rules decide.
    Return,
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
    /// Set when VXLAN is on: workloads may not send VXLAN, and only known hosts may.
    pub vxlan_port: Option<u16>,
    pub log_prefix: String,
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
            log_prefix: "calico-packet".into(),
        }
    }
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
}

impl NftState {
    pub fn num_rules(&self) -> usize {
        self.chains.values().map(|c| c.rules.len()).sum()
    }

    pub fn num_elements(&self) -> usize {
        self.sets.values().map(|s| s.elements.len()).sum::<usize>()
            + self.maps.values().map(|m| m.elements.len()).sum::<usize>()
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

fn fam_prefix(family: u8) -> &'static str {
    if family == 4 { "ip" } else { "ip6" }
}

fn cidr_elem(c: &Cidr) -> String {
    let full = if c.is_ipv4() { 32 } else { 128 };
    if c.prefix() == full {
        c.addr().to_string()
    } else {
        c.network().to_string()
    }
}

/// Members of an interval set must not overlap: keep only CIDRs not covered by another.
pub fn normalize_cidrs(cidrs: impl IntoIterator<Item = Cidr>) -> Vec<Cidr> {
    let mut v: Vec<Cidr> = cidrs.into_iter().map(|c| c.network()).collect();
    // Shorter prefixes first, then by address: a covering CIDR comes before what it covers.
    v.sort_by(|a, b| a.prefix().cmp(&b.prefix()).then(a.addr().cmp(&b.addr())));
    v.dedup();
    let mut kept: Vec<Cidr> = Vec::with_capacity(v.len());
    let mut by_prefix: HashMap<u8, std::collections::HashSet<Cidr>> = HashMap::new();
    for c in v {
        let covered = by_prefix.iter().any(|(len, set)| {
            *len <= c.prefix()
                && Cidr::new(c.addr(), *len)
                    .map(|p| set.contains(&p.network()))
                    .unwrap_or(false)
        });
        if !covered {
            by_prefix.entry(c.prefix()).or_default().insert(c);
            kept.push(c);
        }
    }
    kept.sort();
    kept
}

fn ports_list(ports: &[margay_calc::PortRange]) -> String {
    // One port or range: a plain comparison, cheaper than an anonymous set.
    if let [p] = ports {
        return if p.first == p.last {
            p.first.to_string()
        } else {
            format!("{}-{}", p.first, p.last)
        };
    }
    let items: Vec<String> = ports
        .iter()
        .map(|p| {
            if p.first == p.last {
                p.first.to_string()
            } else {
                format!("{}-{}", p.first, p.last)
            }
        })
        .collect();
    format!("{{ {} }}", items.join(", "))
}

fn nets_list(nets: &[Cidr]) -> String {
    let items: Vec<String> = normalize_cidrs(nets.iter().copied())
        .iter()
        .map(cidr_elem)
        .collect();
    format!("{{ {} }}", items.join(", "))
}

fn of_family(nets: &[Cidr], family: u8) -> Vec<Cidr> {
    nets.iter()
        .filter(|c| c.version() == family)
        .copied()
        .collect()
}

/// Matches for one side of a rule in one family, and the alternatives for its ports (any one
/// of numeric ports or a named-port set suffices, so each alternative becomes its own rule).
/// None when this side can never match in this family.
fn side(m: &ResolvedMatch, family: u8, src: bool) -> Option<(Vec<String>, Vec<String>)> {
    let fam = fam_prefix(family);
    let addr = if src { "saddr" } else { "daddr" };
    let port = if src { "sport" } else { "dport" };
    let mut parts = Vec::new();
    let nets = of_family(&m.nets, family);
    if !m.nets.is_empty() && nets.is_empty() {
        return None;
    }
    if !nets.is_empty() {
        parts.push(format!("{fam} {addr} {}", nets_list(&nets)));
    }
    let not_nets = of_family(&m.not_nets, family);
    if !not_nets.is_empty() {
        parts.push(format!("{fam} {addr} != {}", nets_list(&not_nets)));
    }
    for id in &m.ip_set_ids {
        parts.push(format!("{fam} {addr} @{}", set_name(id, family)));
    }
    for id in &m.not_ip_set_ids {
        parts.push(format!("{fam} {addr} != @{}", set_name(id, family)));
    }
    if !m.not_ports.is_empty() {
        parts.push(format!("th {port} != {}", ports_list(&m.not_ports)));
    }
    for id in &m.not_named_port_ip_set_ids {
        parts.push(format!(
            "{fam} {addr} . meta l4proto . th {port} != @{}",
            set_name(id, family)
        ));
    }
    let mut alternatives = Vec::new();
    if !m.ports.is_empty() {
        alternatives.push(format!("th {port} {}", ports_list(&m.ports)));
    }
    for id in &m.named_port_ip_set_ids {
        alternatives.push(format!(
            "{fam} {addr} . meta l4proto . th {port} @{}",
            set_name(id, family)
        ));
    }
    if alternatives.is_empty() {
        alternatives.push(String::new());
    }
    Some((parts, alternatives))
}

fn icmp_parts(r: &ResolvedRule, family: u8) -> Vec<String> {
    let kw = if family == 4 { "icmp" } else { "icmpv6" };
    let mut out = Vec::new();
    if let Some(i) = r.icmp {
        out.push(format!("{kw} type {}", i.icmp_type));
        if let Some(c) = i.code {
            out.push(format!("{kw} code {c}"));
        }
    }
    if let Some(i) = r.not_icmp {
        match i.code {
            None => out.push(format!("{kw} type != {}", i.icmp_type)),
            Some(c) => out.push(format!(
                "{kw} type . {kw} code != {{ {} . {c} }}",
                i.icmp_type
            )),
        }
    }
    out
}

/// The nft rules one policy rule becomes (several when it has alternatives or both families).
pub fn render_rule(r: &ResolvedRule, cfg: &NftConfig, owner: &str) -> Vec<String> {
    let mut families: Vec<u8> = match r.ip_version {
        Some(4) => vec![4],
        Some(6) => vec![6],
        _ => vec![4, 6],
    };
    match r.protocol {
        Some(1) => families.retain(|f| *f == 4),
        Some(58) => families.retain(|f| *f == 6),
        _ => {}
    }
    if !cfg.ipv6 {
        families.retain(|f| *f == 4);
    }
    let action = match r.action {
        RuleAction::Allow => format!("meta mark set meta mark | {:#x} return", cfg.mark_accept),
        RuleAction::Deny => "drop".to_string(),
        RuleAction::Pass => format!("meta mark set meta mark | {:#x} return", cfg.mark_pass),
        RuleAction::Log => format!(
            "log prefix \"{}: {owner}: \" level info",
            cfg.log_prefix.replace('"', "")
        ),
    };
    let mut out = Vec::new();
    for family in families {
        let (Some((src, src_alts)), Some((dst, dst_alts))) =
            (side(&r.src, family, true), side(&r.dst, family, false))
        else {
            continue;
        };
        let mut common = Vec::new();
        if let Some(p) = r.protocol {
            common.push(format!("meta l4proto {p}"));
        }
        if let Some(p) = r.not_protocol {
            common.push(format!("meta l4proto != {p}"));
        }
        common.extend(icmp_parts(r, family));
        common.extend(src);
        common.extend(dst);
        for sa in &src_alts {
            for da in &dst_alts {
                let mut parts = common.clone();
                if !sa.is_empty() {
                    parts.push(sa.clone());
                }
                if !da.is_empty() {
                    parts.push(da.clone());
                }
                // Cheapest and most selective first: a packet is usually rejected by the
                // protocol or port test before any set lookup.
                parts.sort_by_key(|p| match p {
                    p if p.starts_with("meta l4proto") => 0,
                    p if p.starts_with("th ") && !p.contains('@') => 1,
                    p if p.starts_with("icmp") => 2,
                    p if !p.contains('@') => 3,
                    _ => 4,
                });
                // The family first: it is the cheapest test, and it sends packets of the
                // other family past this rule before any lookup.
                parts.insert(
                    0,
                    format!("meta nfproto {}", if family == 4 { "ipv4" } else { "ipv6" }),
                );
                parts.push(action.clone());
                out.push(parts.join(" "));
            }
        }
    }
    out
}

fn rules_chain(rules: &[ResolvedRule], cfg: &NftConfig, owner: &str) -> ChainSpec {
    ChainSpec {
        base: None,
        rules: rules
            .iter()
            .flat_map(|r| render_rule(r, cfg, owner))
            .map(NftRule::new)
            .collect(),
    }
}

/// Renders policies and profiles, reusing the previous render of anything unchanged.
#[derive(Debug, Default)]
pub struct Renderer {
    policies: HashMap<PolicyId, (Arc<ResolvedPolicy>, ChainSpec, ChainSpec)>,
    profiles: HashMap<String, (Arc<ResolvedProfile>, ChainSpec, ChainSpec)>,
    cfg_key: String,
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
            self.cfg_key = cfg_key;
        }
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
                Some((_, i, o)) => (i.clone(), o.clone()),
                None => {
                    let owner = id.to_string();
                    let i = rules_chain(&pol.inbound, cfg, &owner);
                    let o = rules_chain(&pol.outbound, cfg, &owner);
                    self.policies
                        .insert(id.clone(), (pol.clone(), i.clone(), o.clone()));
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
                    let i = rules_chain(&prof.inbound, cfg, id);
                    let o = rules_chain(&prof.outbound, cfg, id);
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
                let chains = endpoint_chains(id, ep, ingress, cfg);
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

        base_chains(&mut st, cfg, !model.pools.values().all(|p| !p.masquerade));
        (st, summaries)
    }
}

fn tier_chain(
    name: &str,
    tier: &TierInfo,
    policies: &[PolicyId],
    ingress: bool,
    cfg: &NftConfig,
) -> ChainSpec {
    let both = cfg.mark_accept | cfg.mark_pass;
    let mut rules = vec![format!("meta mark set meta mark and {:#x}", !both)];
    for p in policies {
        rules.push(format!("jump {}", policy_chain(p, ingress)));
        rules.push(format!("meta mark and {both:#x} != 0 return"));
    }
    rules.push(match tier.default_action {
        RuleAction::Pass => format!("meta mark set meta mark | {:#x} return", cfg.mark_pass),
        _ => format!(
            "drop comment \"end of tier {}\"",
            tier.name.replace('"', "")
        ),
    });
    let _ = name;
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
) -> Vec<(String, ChainSpec)> {
    let main = endpoint_chain(&ep.interface, ingress);
    let both = cfg.mark_accept | cfg.mark_pass;
    let mut out = Vec::new();
    let mut rules: Vec<String> = Vec::new();
    if !ingress {
        if let Some(port) = cfg.vxlan_port {
            rules.push(format!("udp dport {port} drop"));
        }
        // Anti-spoofing: a workload sends only from its own addresses (or those it may spoof).
        for family in [4u8, 6] {
            if family == 6 && !cfg.ipv6 {
                rules.push("meta nfproto ipv6 drop".into());
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
                    "meta nfproto {} drop",
                    if family == 4 { "ipv4" } else { "ipv6" }
                ));
            } else {
                rules.push(format!("{fam} saddr != {} drop", nets_list(&allowed)));
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
            tier_chain(&name, tier, policies, ingress, cfg),
        ));
        rules.push(format!("jump {name}"));
        rules.push(format!("meta mark and {:#x} != 0 return", cfg.mark_accept));
    }
    for p in &ep.profile_ids {
        rules.push(format!("jump {}", profile_chain(p, ingress)));
        rules.push(format!("meta mark and {:#x} != 0 return", cfg.mark_accept));
    }
    rules.push("drop comment \"no policy or profile allowed the packet\"".into());
    out.push((
        main,
        ChainSpec {
            base: None,
            rules: rules.into_iter().map(NftRule::new).collect(),
        },
    ));
    out
}

fn base_chains(st: &mut NftState, cfg: &NftConfig, masquerade: bool) {
    let wl_match = |dir: &str| -> Vec<String> {
        cfg.workload_prefixes
            .iter()
            .map(|p| format!("{dir} \"{p}*\""))
            .collect()
    };
    // Established flows first: it is the one rule most packets evaluate.
    let mut forward = vec![
        "ct state established,related accept".to_string(),
        "ct state invalid drop".to_string(),
    ];
    for m in wl_match("iifname") {
        forward.push(format!("{m} jump from-wl"));
    }
    for m in wl_match("oifname") {
        forward.push(format!("{m} jump to-wl"));
    }
    st.chains.insert(
        "forward".into(),
        ChainSpec {
            base: Some("type filter hook forward priority filter; policy accept;".into()),
            rules: forward.into_iter().map(NftRule::new).collect(),
        },
    );
    let chain = |rules: Vec<String>| ChainSpec {
        base: None,
        rules: rules.into_iter().map(NftRule::new).collect(),
    };
    st.chains.insert(
        "from-wl".into(),
        chain(vec![
            format!("iifname != @{SET_WL_IFACES} drop comment \"unknown workload interface\""),
            format!("iifname vmap @{MAP_EGRESS}"),
        ]),
    );
    st.chains.insert(
        "to-wl".into(),
        chain(vec![
            format!("oifname != @{SET_WL_IFACES} drop comment \"unknown workload interface\""),
            format!("oifname vmap @{MAP_INGRESS}"),
        ]),
    );
    let mut to_host = Vec::new();
    if cfg.ipv6 {
        // Neighbour discovery and router solicitation must reach the host for IPv6 to work.
        to_host.push(
            "icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } accept"
                .to_string(),
        );
    }
    to_host.push(format!(
        "iifname != @{SET_WL_IFACES} drop comment \"unknown workload interface\""
    ));
    to_host.push(format!("iifname vmap @{MAP_EGRESS}"));
    to_host.push(
        match cfg.endpoint_to_host {
            EndpointToHostAction::Drop => "drop comment \"DefaultEndpointToHostAction\"",
            EndpointToHostAction::Accept => "accept",
            EndpointToHostAction::Return => "return",
        }
        .to_string(),
    );
    st.chains.insert("wl-to-host".into(), chain(to_host));
    let mut input = Vec::new();
    for m in wl_match("iifname") {
        input.push(format!("{m} ct state invalid drop"));
        input.push(format!("{m} ct state established,related accept"));
        input.push(format!("{m} jump wl-to-host"));
    }
    if let Some(port) = cfg.vxlan_port {
        input.push(format!("udp dport {port} ip saddr @all-hosts-4 accept"));
        if cfg.ipv6 {
            input.push(format!("udp dport {port} ip6 saddr @all-hosts-6 accept"));
        }
        input.push(format!(
            "udp dport {port} drop comment \"VXLAN from an unknown host\""
        ));
    }
    st.chains.insert(
        "input".into(),
        ChainSpec {
            base: Some("type filter hook input priority filter; policy accept;".into()),
            rules: input.into_iter().map(NftRule::new).collect(),
        },
    );
    let mut post = Vec::new();
    if masquerade {
        post.push(
            "ip saddr @masq-pools-4 ip daddr != @all-pools-4 masquerade fully-random".to_string(),
        );
        if cfg.ipv6 {
            post.push(
                "ip6 saddr @masq-pools-6 ip6 daddr != @all-pools-6 masquerade fully-random"
                    .to_string(),
            );
        }
    }
    st.chains.insert(
        "postrouting".into(),
        ChainSpec {
            base: Some("type nat hook postrouting priority srcnat; policy accept;".into()),
            rules: post.into_iter().map(NftRule::new).collect(),
        },
    );
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
