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
///
/// `ingress`: the rule is in an ingress (`pi-`/`pri-`) chain. Those chains run only inside
/// `tw-<if>`, the last thing the forward hook does for a packet (the sender's egress ran
/// before), so with the ACCEPT allow verdict an Allow there sets the accept bit (the packet's
/// mark stays as it was) and accepts at once instead of returning for the callers to test the
/// bit. With RETURN every Allow returns with the bit.
pub fn render_rule(
    r: &ResolvedRule,
    cfg: &NftConfig,
    owner: &LogOwner<'_>,
    ingress: bool,
) -> Vec<String> {
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
        RuleAction::Allow => format!(
            "meta mark set meta mark | {:#x} {}",
            cfg.mark_accept,
            if ingress && cfg.ingress_accepts() {
                "accept"
            } else {
                "return"
            }
        ),
        RuleAction::Deny => cfg.deny().to_string(),
        RuleAction::Pass => format!("meta mark set meta mark | {:#x} return", cfg.mark_pass),
        RuleAction::Log => {
            let limit = match &cfg.log_rate {
                Some((rate, 0)) => format!("limit rate {rate} "),
                Some((rate, burst)) => format!("limit rate {rate} burst {burst} packets "),
                None => String::new(),
            };
            format!(
                "{limit}log prefix \"{}\" level info",
                log_prefix(&cfg.log_prefix, owner)
            )
        }
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

fn rules_chain(
    rules: &[ResolvedRule],
    cfg: &NftConfig,
    owner: &LogOwner<'_>,
    ingress: bool,
) -> ChainSpec {
    ChainSpec {
        base: None,
        rules: rules
            .iter()
            .flat_map(|r| render_rule(r, cfg, owner, ingress))
            .map(NftRule::new)
            .collect(),
    }
}

/// Protocols whose transport header starts with the source and destination ports (what
/// `th dport` reads): TCP, UDP, SCTP, UDP-Lite.
fn has_ports(protocol: u8) -> bool {
    matches!(protocol, 6 | 17 | 132 | 136)
}

/// Sorted, with overlapping and adjacent ranges merged: the kernel refuses overlapping
/// intervals in a set.
fn merge_ports(mut ports: Vec<margay_calc::PortRange>) -> Vec<margay_calc::PortRange> {
    ports.sort_by_key(|p| (p.first, p.last));
    let mut out: Vec<margay_calc::PortRange> = Vec::with_capacity(ports.len());
    for p in ports {
        match out.last_mut() {
            Some(last) if u32::from(p.first) <= u32::from(last.last) + 1 => {
                last.last = last.last.max(p.last);
            }
            _ => out.push(p),
        }
    }
    out
}

/// A condition every packet that any of `rules` matches satisfies (None when there is no
/// useful one), put on the tier chain's jump to the policy's chain: a packet failing it would
/// run through the chain without matching a rule, i.e. without a verdict, so skipping the
/// chain is the same. It must be *necessary* for every rule (Allow, Deny, Pass and Log alike):
///
/// - the protocol part exists only when every rule names a protocol (`notProtocol` and
///   ICMP matches only narrow a rule, so they do not matter; a rule without a protocol
///   matches any, so there is no guard at all);
/// - the destination-port part only when, in addition, every rule's protocol has ports and
///   every rule lists destination ports and no named port (a named port is an alternative to
///   the numeric ports: the rule matches ports outside them).
///
/// Several protocols or port sets make the union, which is still necessary for each rule.
pub fn jump_guard(rules: &[ResolvedRule]) -> Option<String> {
    let mut protocols = BTreeSet::new();
    let mut ports = Vec::new();
    let mut port_guard = true;
    for r in rules {
        let p = r.protocol?;
        protocols.insert(p);
        if has_ports(p) && !r.dst.ports.is_empty() && r.dst.named_port_ip_set_ids.is_empty() {
            ports.extend(r.dst.ports.iter().copied());
        } else {
            port_guard = false;
        }
    }
    let list: Vec<String> = protocols.iter().map(u8::to_string).collect();
    let mut guard = match list.as_slice() {
        [] => return None,
        [one] => format!("meta l4proto {one}"),
        many => format!("meta l4proto {{ {} }}", many.join(", ")),
    };
    if port_guard {
        let _ = write!(guard, " th dport {}", ports_list(&merge_ports(ports)));
    }
    Some(guard)
}

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
    rules.push(match tier.default_action {
        RuleAction::Pass => format!("meta mark set meta mark | {:#x} return", cfg.mark_pass),
        _ => format!(
            "{} comment \"end of tier {}\"",
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
    rules.push(format!(
        "{deny} comment \"no policy or profile allowed the packet\""
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

/// The postrouting rules that NAT traffic from `natOutgoing` pools leaving the pools (and,
/// with IPPoolsAndHostIPs, not going to a host), as Calico's NAT-outgoing chain: with a port
/// range, TCP and UDP get the range and everything else the plain translation.
pub fn nat_outgoing_rules(nat: &NatOutgoing, family: u8) -> Vec<String> {
    let fam = fam_prefix(family);
    let mut m = format!("{fam} saddr @masq-pools-{family} {fam} daddr != @all-pools-{family}");
    if nat.exclude_hosts {
        let _ = write!(m, " {fam} daddr != @all-hosts-{family}");
    }
    if let Some(oif) = &nat.oif {
        let _ = write!(m, " oifname \"{}\"", oif.replace('"', ""));
    }
    let ports = nat.port_range.map(|(lo, hi)| format!(":{lo}-{hi}"));
    // NATOutgoingAddress is an IPv4 address: IPv6 masquerades.
    let address = nat.address.filter(|_| family == 4);
    let action = |ports: Option<&str>| match address {
        Some(a) => format!("snat ip to {a}{} fully-random", ports.unwrap_or("")),
        None => match ports {
            Some(p) => format!("masquerade to {p} fully-random"),
            None => "masquerade fully-random".to_string(),
        },
    };
    let mut out = Vec::new();
    if let Some(p) = &ports {
        for proto in ["tcp", "udp"] {
            out.push(format!("{m} meta l4proto {proto} {}", action(Some(p))));
        }
    }
    out.push(format!("{m} {}", action(None)));
    out
}

fn base_chains(st: &mut NftState, cfg: &NftConfig, masquerade: bool, service_cidrs: bool) {
    let deny = cfg.deny();
    let wl_match = |dir: &str| -> Vec<String> {
        cfg.workload_prefixes
            .iter()
            .map(|p| format!("{dir} \"{p}*\""))
            .collect()
    };
    // Established flows first: it is the one rule most packets evaluate. With offload on,
    // they go to the flowtable first (a flow only gets there once policy accepted it).
    let mut forward = Vec::new();
    if cfg.flow_offload {
        forward.push(format!(
            "ct state established,related flow add @{FLOWTABLE} comment \"offload established flows\""
        ));
    }
    forward.push("ct state established,related accept".to_string());
    if cfg.conntrack_invalid_drop {
        forward.push(format!("ct state invalid {deny}"));
    }
    for m in wl_match("iifname") {
        forward.push(format!("{m} jump from-wl"));
    }
    for m in wl_match("oifname") {
        forward.push(format!("{m} jump to-wl"));
    }
    // Service-loop prevention comes last: traffic to a service address that kube-proxy did
    // not translate would otherwise bounce between this host and its default route.
    if service_cidrs && cfg.service_loop != ServiceLoop::Disabled {
        let verdict = match cfg.service_loop {
            ServiceLoop::Reject => "reject",
            _ => "drop",
        };
        forward.push(format!(
            "ip daddr @{SET_SERVICE_CIDRS}-4 {verdict} comment \"service address not translated\""
        ));
        if cfg.ipv6 {
            forward.push(format!(
                "ip6 daddr @{SET_SERVICE_CIDRS}-6 {verdict} comment \"service address not translated\""
            ));
        }
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
            format!("iifname != @{SET_WL_IFACES} {deny} comment \"unknown workload interface\""),
            format!("iifname vmap @{MAP_EGRESS}"),
        ]),
    );
    st.chains.insert(
        "to-wl".into(),
        chain(vec![
            format!("oifname != @{SET_WL_IFACES} {deny} comment \"unknown workload interface\""),
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
        "iifname != @{SET_WL_IFACES} {deny} comment \"unknown workload interface\""
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
        if cfg.conntrack_invalid_drop {
            input.push(format!("{m} ct state invalid {deny}"));
        }
        input.push(format!("{m} ct state established,related accept"));
        input.push(format!("{m} jump wl-to-host"));
    }
    if let Some(port) = cfg.vxlan_port {
        // VXLAN only from the cluster's hosts (and ExternalNodesCIDRList).
        input.push(format!(
            "udp dport {port} ip saddr != @all-hosts-4 {deny} comment \"VXLAN from an unknown host\""
        ));
        if cfg.ipv6 {
            input.push(format!(
                "udp dport {port} ip6 saddr != @all-hosts-6 {deny} comment \"VXLAN from an unknown host\""
            ));
        } else {
            input.push(format!(
                "meta nfproto ipv6 udp dport {port} {deny} comment \"VXLAN from an unknown host\""
            ));
        }
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
        post.extend(nat_outgoing_rules(&cfg.nat, 4));
        if cfg.ipv6 {
            post.extend(nat_outgoing_rules(&cfg.nat, 6));
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

#[cfg(test)]
mod tests {
    use super::*;
    use margay_calc::PortRange;

    fn rule(action: RuleAction, protocol: Option<u8>, ports: &[(u16, u16)]) -> ResolvedRule {
        ResolvedRule {
            action,
            ip_version: None,
            protocol,
            not_protocol: None,
            icmp: None,
            not_icmp: None,
            src: ResolvedMatch::default(),
            dst: ResolvedMatch {
                ports: ports
                    .iter()
                    .map(|&(first, last)| PortRange { first, last })
                    .collect(),
                ..ResolvedMatch::default()
            },
            rule_id: String::new(),
        }
    }

    fn allow(protocol: Option<u8>, ports: &[(u16, u16)]) -> ResolvedRule {
        rule(RuleAction::Allow, protocol, ports)
    }

    #[test]
    fn guard_of_one_protocol_and_port() {
        assert_eq!(
            jump_guard(&[allow(Some(6), &[(80, 80)])]).as_deref(),
            Some("meta l4proto 6 th dport 80")
        );
    }

    #[test]
    fn no_guard_for_no_rules_or_a_rule_without_protocol() {
        assert_eq!(jump_guard(&[]), None);
        assert_eq!(jump_guard(&[allow(None, &[])]), None);
        // One rule without a protocol matches any packet: no guard, whatever the others say.
        assert_eq!(
            jump_guard(&[allow(Some(6), &[(80, 80)]), allow(None, &[(80, 80)])]),
            None
        );
    }

    #[test]
    fn not_protocol_alone_gives_no_guard() {
        let mut r = allow(None, &[]);
        r.not_protocol = Some(17);
        assert_eq!(jump_guard(&[r.clone()]), None);
        // With a protocol as well, the protocol is still necessary.
        r.protocol = Some(6);
        assert_eq!(jump_guard(&[r]).as_deref(), Some("meta l4proto 6"));
    }

    #[test]
    fn icmp_gets_a_protocol_guard_only() {
        let mut r = rule(RuleAction::Deny, Some(1), &[]);
        r.icmp = Some(margay_calc::IcmpMatch {
            icmp_type: 8,
            code: None,
        });
        assert_eq!(jump_guard(&[r.clone()]).as_deref(), Some("meta l4proto 1"));
        // Mixed with TCP on a port: the union of protocols, no port part (ICMP has no ports).
        assert_eq!(
            jump_guard(&[r, allow(Some(6), &[(80, 80)])]).as_deref(),
            Some("meta l4proto { 1, 6 }")
        );
    }

    #[test]
    fn named_ports_drop_the_port_part() {
        let mut r = allow(Some(6), &[(80, 80)]);
        r.dst.named_port_ip_set_ids = vec!["n:abc".into()];
        // The named port is an alternative to port 80: the rule matches other ports too.
        assert_eq!(jump_guard(&[r]).as_deref(), Some("meta l4proto 6"));
    }

    #[test]
    fn a_rule_without_ports_drops_the_port_part() {
        assert_eq!(
            jump_guard(&[allow(Some(6), &[(80, 80)]), allow(Some(6), &[])]).as_deref(),
            Some("meta l4proto 6")
        );
        // Not-ports only narrow the rule; they say nothing about the ports it matches.
        let mut r = allow(Some(6), &[]);
        r.dst.not_ports = vec![PortRange {
            first: 22,
            last: 22,
        }];
        assert_eq!(jump_guard(&[r]).as_deref(), Some("meta l4proto 6"));
        // Source ports are not destination ports.
        let mut r = allow(Some(6), &[]);
        r.src.ports = vec![PortRange {
            first: 22,
            last: 22,
        }];
        assert_eq!(jump_guard(&[r]).as_deref(), Some("meta l4proto 6"));
    }

    #[test]
    fn mixed_protocols_and_ports_make_the_union() {
        let rules = [
            allow(Some(6), &[(443, 443), (80, 80)]),
            rule(RuleAction::Deny, Some(17), &[(53, 53)]),
            rule(
                RuleAction::Pass,
                Some(6),
                &[(1000, 2000), (1500, 2500), (2501, 2600)],
            ),
            rule(RuleAction::Log, Some(132), &[(80, 80)]),
        ];
        assert_eq!(
            jump_guard(&rules).as_deref(),
            Some("meta l4proto { 6, 17, 132 } th dport { 53, 80, 443, 1000-2600 }")
        );
    }

    #[test]
    fn a_protocol_without_ports_drops_the_port_part() {
        // Validation refuses ports with such a protocol; the guard must not rely on it.
        assert_eq!(
            jump_guard(&[allow(Some(6), &[(80, 80)]), allow(Some(47), &[(80, 80)])]).as_deref(),
            Some("meta l4proto { 6, 47 }")
        );
    }

    fn rendered(
        cfg: &NftConfig,
        policies: &[(&str, Vec<ResolvedRule>)],
    ) -> (Vec<PolicyId>, HashMap<PolicyId, RenderedPolicy>) {
        let mut ids = Vec::new();
        let mut map = HashMap::new();
        for (name, inbound) in policies {
            let id = PolicyId {
                tier: "default".into(),
                namespace: "ns".into(),
                name: (*name).into(),
            };
            let pol = ResolvedPolicy {
                inbound: inbound.clone(),
                outbound: inbound.clone(),
                ..ResolvedPolicy::default()
            };
            let entry = (
                Arc::new(pol.clone()),
                (
                    rules_chain(&pol.inbound, cfg, &LogOwner::profile(name), true),
                    PolicyCall::new(&pol.inbound, cfg, true),
                ),
                (
                    rules_chain(&pol.outbound, cfg, &LogOwner::profile(name), false),
                    PolicyCall::new(&pol.outbound, cfg, false),
                ),
            );
            map.insert(id.clone(), entry);
            ids.push(id);
        }
        (ids, map)
    }

    fn texts(c: &ChainSpec) -> Vec<String> {
        c.rules.iter().map(|r| r.text.clone()).collect()
    }

    #[test]
    fn tier_chain_guards_jumps_and_tests_marks_only_when_a_policy_can_set_them() {
        let cfg = NftConfig::default();
        let (ids, map) = rendered(
            &cfg,
            &[
                ("web", vec![allow(Some(6), &[(80, 80)])]),
                ("empty", vec![]),
                ("pass", vec![rule(RuleAction::Pass, Some(17), &[(53, 53)])]),
                ("deny", vec![rule(RuleAction::Deny, None, &[])]),
            ],
        );
        let tier = TierInfo {
            name: "default".into(),
            default_action: RuleAction::Deny,
            ingress_policies: ids.clone(),
            egress_policies: ids.clone(),
        };
        let ch = |ingress| texts(&tier_chain(&tier, &ids, ingress, &cfg, &map));
        let (web, pass, deny) = (0, 2, 3);
        let ingress = ch(true);
        assert_eq!(
            ingress,
            vec![
                "meta mark set meta mark and 0xfffcffff".to_string(),
                format!(
                    "meta l4proto 6 th dport 80 jump {}",
                    policy_chain(&ids[web], true)
                ),
                format!(
                    "meta l4proto 17 th dport 53 jump {}",
                    policy_chain(&ids[pass], true)
                ),
                "meta mark and 0x20000 != 0 return".to_string(),
                format!("jump {}", policy_chain(&ids[deny], true)),
                "drop comment \"end of tier default\"".to_string(),
            ]
        );
        let egress = ch(false);
        assert_eq!(
            egress,
            vec![
                "meta mark set meta mark and 0xfffcffff".to_string(),
                format!(
                    "meta l4proto 6 th dport 80 jump {}",
                    policy_chain(&ids[web], false)
                ),
                "meta mark and 0x10000 != 0 return".to_string(),
                format!(
                    "meta l4proto 17 th dport 53 jump {}",
                    policy_chain(&ids[pass], false)
                ),
                "meta mark and 0x20000 != 0 return".to_string(),
                format!("jump {}", policy_chain(&ids[deny], false)),
                "drop comment \"end of tier default\"".to_string(),
            ]
        );
    }

    #[test]
    fn an_unknown_policy_is_jumped_to_unguarded_and_tested() {
        let cfg = NftConfig::default();
        let id = PolicyId {
            tier: "default".into(),
            namespace: String::new(),
            name: "gone".into(),
        };
        let tier = TierInfo {
            name: "default".into(),
            default_action: RuleAction::Pass,
            ingress_policies: vec![id.clone()],
            egress_policies: vec![],
        };
        assert_eq!(
            texts(&tier_chain(
                &tier,
                &tier.ingress_policies,
                true,
                &cfg,
                &HashMap::new()
            )),
            vec![
                "meta mark set meta mark and 0xfffcffff".to_string(),
                format!("jump {}", policy_chain(&id, true)),
                "meta mark and 0x30000 != 0 return".to_string(),
                "meta mark set meta mark | 0x20000 return".to_string(),
            ]
        );
    }

    #[test]
    fn allow_accepts_in_ingress_and_returns_in_egress() {
        let cfg = NftConfig::default();
        let r = allow(Some(6), &[(80, 80)]);
        let ingress = render_rule(&r, &cfg, &LogOwner::profile("p"), true);
        let egress = render_rule(&r, &cfg, &LogOwner::profile("p"), false);
        assert!(
            ingress
                .iter()
                .all(|t| t.ends_with("meta mark set meta mark | 0x10000 accept")),
            "{ingress:?}"
        );
        assert!(
            egress
                .iter()
                .all(|t| t.ends_with("meta mark set meta mark | 0x10000 return")),
            "{egress:?}"
        );
        // Pass returns in both directions: the tier chain must skip the rest of the tier.
        let p = rule(RuleAction::Pass, Some(6), &[]);
        assert!(
            render_rule(&p, &cfg, &LogOwner::profile("p"), true)
                .iter()
                .all(|t| t.ends_with("| 0x20000 return"))
        );
    }

    fn workload(ifname: &str, tiers: Vec<TierInfo>) -> WorkloadEndpointData {
        WorkloadEndpointData {
            interface: ifname.into(),
            mac: String::new(),
            ipv4_nets: vec![Cidr::parse("10.65.0.5/32").unwrap()],
            ipv6_nets: Vec::new(),
            profile_ids: vec!["prof".into()],
            tiers,
            name: "w".into(),
            namespace: "ns".into(),
            allow_spoofed_source_prefixes: Vec::new(),
        }
    }

    fn ep_rules(
        cfg: &NftConfig,
        ingress: bool,
        rendered: &HashMap<PolicyId, RenderedPolicy>,
        tiers: Vec<TierInfo>,
    ) -> Vec<String> {
        let id = WorkloadEndpointId {
            orchestrator: "k8s".into(),
            workload: "ns/w".into(),
            endpoint: "eth0".into(),
        };
        let chains = endpoint_chains(&id, &workload("cali1", tiers), ingress, cfg, rendered);
        chains.iter().flat_map(|(_, c)| texts(c)).collect()
    }

    fn base(cfg: &NftConfig, model: &DataplaneModel) -> NftState {
        Renderer::new().render(model, cfg).0
    }

    #[test]
    fn the_deny_verdict_is_used_wherever_margay_refuses() {
        let cfg = NftConfig {
            deny: DenyVerdict::Reject,
            ..NftConfig::default()
        };
        let (ids, map) = rendered(&cfg, &[("d", vec![rule(RuleAction::Deny, None, &[])])]);
        let tier = TierInfo {
            name: "default".into(),
            default_action: RuleAction::Deny,
            ingress_policies: ids.clone(),
            egress_policies: ids.clone(),
        };
        let tier_rules = texts(&tier_chain(&tier, &ids, true, &cfg, &map));
        assert!(
            tier_rules
                .iter()
                .any(|r| r == "reject comment \"end of tier default\""),
            "{tier_rules:?}"
        );
        let policy = texts(&map[&ids[0]].1.0);
        assert!(policy.iter().all(|r| r.ends_with(" reject")), "{policy:?}");
        let egress = ep_rules(&cfg, false, &map, vec![tier.clone()]);
        assert!(
            egress.contains(
                &"reject comment \"no policy or profile allowed the packet\"".to_string()
            ),
            "{egress:?}"
        );
        assert!(
            egress
                .iter()
                .any(|r| r.starts_with("ip saddr != { 10.65.0.5 } reject")),
            "{egress:?}"
        );
        let st = base(&cfg, &DataplaneModel::default());
        let chain = |n: &str| texts(&st.chains[n]);
        assert!(chain("forward").contains(&"ct state invalid reject".to_string()));
        assert!(chain("from-wl")[0].starts_with("iifname != @wl-ifaces reject"));
        // Nothing drops with REJECT configured.
        let dropping: Vec<String> = st
            .chains
            .iter()
            .filter(|(n, _)| *n != "wl-to-host")
            .flat_map(|(_, c)| texts(c))
            .filter(|r| r.contains("drop"))
            .collect();
        assert!(dropping.is_empty(), "{dropping:?}");
        // DROP (the default) drops.
        let st = base(&NftConfig::default(), &DataplaneModel::default());
        assert!(texts(&st.chains["forward"]).contains(&"ct state invalid drop".to_string()));
    }

    #[test]
    fn the_return_allow_verdict_returns_from_ingress_too() {
        let cfg = NftConfig {
            allow: AllowVerdict::Return,
            ..NftConfig::default()
        };
        let r = allow(Some(6), &[(80, 80)]);
        let ingress = render_rule(&r, &cfg, &LogOwner::profile("p"), true);
        assert!(
            ingress
                .iter()
                .all(|t| t.ends_with("meta mark set meta mark | 0x10000 return")),
            "{ingress:?}"
        );
        let (ids, map) = rendered(&cfg, &[("web", vec![allow(Some(6), &[(80, 80)])])]);
        let tier = TierInfo {
            name: "default".into(),
            default_action: RuleAction::Deny,
            ingress_policies: ids.clone(),
            egress_policies: ids.clone(),
        };
        // The tier and endpoint chains test the accept bit after ingress jumps as well.
        let t = texts(&tier_chain(&tier, &ids, true, &cfg, &map));
        assert!(
            t.contains(&"meta mark and 0x10000 != 0 return".to_string()),
            "{t:?}"
        );
        let e = ep_rules(&cfg, true, &map, vec![tier]);
        assert_eq!(
            e.iter()
                .filter(|r| *r == "meta mark and 0x10000 != 0 return")
                .count(),
            3,
            "{e:?}"
        );
        // ACCEPT: ingress accepts directly and nothing is tested after it.
        let acc = NftConfig::default();
        let (ids, map) = rendered(&acc, &[("web", vec![allow(Some(6), &[(80, 80)])])]);
        let tier = TierInfo {
            name: "default".into(),
            default_action: RuleAction::Deny,
            ingress_policies: ids.clone(),
            egress_policies: ids.clone(),
        };
        let e = ep_rules(&acc, true, &map, vec![tier]);
        assert!(
            !e.iter().any(|r| r.contains("0x10000 != 0 return")),
            "{e:?}"
        );
    }

    #[test]
    fn log_prefix_specifiers_and_rate_limit_are_calicos() {
        let id = PolicyId {
            tier: "security".into(),
            namespace: "prod".into(),
            name: "web".into(),
        };
        let owner = LogOwner::policy(&id);
        assert_eq!(
            log_prefix("drop %t/%k/%n %p %x", &owner),
            "drop security/np/web prod/web %x"
        );
        assert_eq!(log_prefix("", &owner), "calico-packet");
        let g = PolicyId {
            tier: "default".into(),
            namespace: String::new(),
            name: "g".into(),
        };
        assert_eq!(log_prefix("%k %p", &LogOwner::policy(&g)), "gnp g");
        let k = PolicyId {
            tier: "default".into(),
            namespace: "ns".into(),
            name: "knp.default.x".into(),
        };
        assert_eq!(log_prefix("%k", &LogOwner::policy(&k)), "knp");
        assert_eq!(
            log_prefix("%k:%n", &LogOwner::profile("kns.a")),
            "pro:kns.a"
        );
        assert_eq!(log_prefix(&"x".repeat(300), &owner).len(), 127);
        assert_eq!(log_prefix("a\"b", &owner), "ab");
        let cfg = NftConfig {
            log_prefix: "p-%n".into(),
            log_rate: Some(("10/second".into(), 3)),
            ..NftConfig::default()
        };
        let log = render_rule(&rule(RuleAction::Log, None, &[]), &cfg, &owner, false);
        assert_eq!(
            log[0],
            "meta nfproto ipv4 limit rate 10/second burst 3 packets log prefix \"p-web\" level info"
        );
        let cfg = NftConfig {
            log_rate: Some(("1/minute".into(), 0)),
            ..cfg
        };
        let log = render_rule(&rule(RuleAction::Log, None, &[]), &cfg, &owner, false);
        assert!(
            log[0].contains(" limit rate 1/minute log prefix"),
            "{log:?}"
        );
    }

    #[test]
    fn encapsulated_packets_from_workloads_are_refused_unless_allowed() {
        let cfg = NftConfig::default();
        let e = ep_rules(&cfg, false, &HashMap::new(), Vec::new());
        assert!(
            e.contains(&"udp dport 4789 drop comment \"VXLAN from a workload\"".to_string()),
            "{e:?}"
        );
        assert!(
            e.contains(&"meta l4proto 4 drop comment \"IP-in-IP from a workload\"".to_string()),
            "{e:?}"
        );
        let allowed = NftConfig {
            workload_vxlan_port: None,
            drop_ipip_from_workloads: false,
            ..NftConfig::default()
        };
        let e = ep_rules(&allowed, false, &HashMap::new(), Vec::new());
        assert!(!e.iter().any(|r| r.contains("from a workload")), "{e:?}");
    }

    #[test]
    fn the_conntrack_invalid_check_can_be_disabled() {
        let cfg = NftConfig {
            conntrack_invalid_drop: false,
            ..NftConfig::default()
        };
        let st = base(&cfg, &DataplaneModel::default());
        let all: Vec<String> = st.chains.values().flat_map(texts).collect();
        assert!(
            !all.iter().any(|r| r.contains("ct state invalid")),
            "{all:?}"
        );
    }

    fn masq_model() -> DataplaneModel {
        let mut m = DataplaneModel::default();
        m.pools.insert(
            "p".into(),
            margay_calc::PoolData {
                cidr: Cidr::parse("10.65.0.0/16").unwrap(),
                masquerade: true,
                ipip: EncapMode::Never,
                vxlan: EncapMode::Never,
                disabled: false,
            },
        );
        m
    }

    #[test]
    fn nat_outgoing_follows_exclusions_interface_ports_and_address() {
        let plain = nat_outgoing_rules(&NatOutgoing::default(), 4);
        assert_eq!(
            plain,
            vec![
                "ip saddr @masq-pools-4 ip daddr != @all-pools-4 masquerade fully-random"
                    .to_string()
            ]
        );
        let nat = NatOutgoing {
            exclude_hosts: true,
            oif: Some("eth*".into()),
            port_range: Some((40000, 41000)),
            address: None,
        };
        let m = "ip saddr @masq-pools-4 ip daddr != @all-pools-4 ip daddr != @all-hosts-4 oifname \"eth*\"";
        assert_eq!(
            nat_outgoing_rules(&nat, 4),
            vec![
                format!("{m} meta l4proto tcp masquerade to :40000-41000 fully-random"),
                format!("{m} meta l4proto udp masquerade to :40000-41000 fully-random"),
                format!("{m} masquerade fully-random"),
            ]
        );
        let snat = NatOutgoing {
            address: Some("192.0.2.9".parse().unwrap()),
            port_range: Some((40000, 41000)),
            ..NatOutgoing::default()
        };
        let r = nat_outgoing_rules(&snat, 4);
        assert!(
            r[0].ends_with("meta l4proto tcp snat ip to 192.0.2.9:40000-41000 fully-random"),
            "{r:?}"
        );
        assert!(
            r[2].ends_with("ip daddr != @all-pools-4 snat ip to 192.0.2.9 fully-random"),
            "{r:?}"
        );
        // NATOutgoingAddress is IPv4: IPv6 still masquerades.
        assert!(nat_outgoing_rules(&snat, 6)[2].ends_with("masquerade fully-random"));
        let st = base(
            &NftConfig {
                nat,
                ipv6: false,
                ..NftConfig::default()
            },
            &masq_model(),
        );
        assert_eq!(texts(&st.chains["postrouting"]).len(), 3);
    }

    #[test]
    fn service_cidrs_and_external_nodes_fill_their_sets() {
        let model = DataplaneModel {
            service_cidrs: margay_calc::ServiceCidrs {
                cluster: vec![Cidr::parse("10.96.0.0/12").unwrap()],
                external: vec![Cidr::parse("fd00:96::/108").unwrap()],
                load_balancer: vec![Cidr::parse("198.51.100.0/24").unwrap()],
            },
            ..DataplaneModel::default()
        };
        let cfg = NftConfig {
            external_nodes: vec![Cidr::parse("203.0.113.0/24").unwrap()],
            vxlan_port: Some(4789),
            ..NftConfig::default()
        };
        let st = base(&cfg, &model);
        let elems = |n: &str| st.sets[n].elements.iter().cloned().collect::<Vec<_>>();
        assert_eq!(
            elems("svc-cidrs-4"),
            vec!["10.96.0.0/12".to_string(), "198.51.100.0/24".to_string()]
        );
        assert_eq!(elems("svc-cidrs-6"), vec!["fd00:96::/108".to_string()]);
        assert_eq!(elems("all-hosts-4"), vec!["203.0.113.0/24".to_string()]);
        let fwd = texts(&st.chains["forward"]);
        assert_eq!(
            fwd.last().unwrap(),
            "ip6 daddr @svc-cidrs-6 drop comment \"service address not translated\""
        );
        let input = texts(&st.chains["input"]);
        assert!(input.contains(&"udp dport 4789 ip saddr != @all-hosts-4 drop comment \"VXLAN from an unknown host\"".to_string()), "{input:?}");
        let rej = base(
            &NftConfig {
                service_loop: ServiceLoop::Reject,
                ..cfg.clone()
            },
            &model,
        );
        assert!(
            texts(&rej.chains["forward"])
                .iter()
                .any(|r| r.starts_with("ip daddr @svc-cidrs-4 reject"))
        );
        let off = base(
            &NftConfig {
                service_loop: ServiceLoop::Disabled,
                ..cfg.clone()
            },
            &model,
        );
        assert!(
            !texts(&off.chains["forward"])
                .iter()
                .any(|r| r.contains("svc-cidrs"))
        );
        // No service CIDRs: no rule.
        let none = base(&cfg, &DataplaneModel::default());
        assert!(
            !texts(&none.chains["forward"])
                .iter()
                .any(|r| r.contains("svc-cidrs"))
        );
    }

    #[test]
    fn flow_offload_adds_the_flowtable_rule_first() {
        let on = base(
            &NftConfig {
                flow_offload: true,
                ..NftConfig::default()
            },
            &DataplaneModel::default(),
        );
        let fwd = texts(&on.chains["forward"]);
        assert_eq!(
            fwd[0],
            "ct state established,related flow add @ft comment \"offload established flows\""
        );
        assert_eq!(fwd[1], "ct state established,related accept");
        let off = base(&NftConfig::default(), &DataplaneModel::default());
        assert!(
            !texts(&off.chains["forward"])
                .iter()
                .any(|r| r.contains("flow add"))
        );
        assert_eq!(
            flowtable_decl("margay", &[]),
            "add flowtable inet margay ft { hook ingress priority filter; }"
        );
        assert_eq!(
            flowtable_decl("margay", &["cali1".into(), "eth0".into()]),
            "add flowtable inet margay ft { hook ingress priority filter; devices = { \"cali1\", \"eth0\" }; }"
        );
    }
}
