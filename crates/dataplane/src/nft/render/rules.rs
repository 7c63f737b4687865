//! One resolved rule as nft text: matches per family, ports, ICMP, and a policy's jump guard.

use super::*;

pub(super) fn fam_prefix(family: u8) -> &'static str {
    if family == 4 { "ip" } else { "ip6" }
}

pub(super) fn cidr_elem(c: &Cidr) -> String {
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

pub(super) fn ports_list(ports: &[margay_calc::PortRange]) -> String {
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

pub(super) fn nets_list(nets: &[Cidr]) -> String {
    let items: Vec<String> = normalize_cidrs(nets.iter().copied())
        .iter()
        .map(cidr_elem)
        .collect();
    format!("{{ {} }}", items.join(", "))
}

pub(super) fn of_family(nets: &[Cidr], family: u8) -> Vec<Cidr> {
    nets.iter()
        .filter(|c| c.version() == family)
        .copied()
        .collect()
}

/// Matches for one side of a rule in one family, and the alternatives for its ports (any one
/// of numeric ports or a named-port set suffices, so each alternative becomes its own rule).
/// None when this side can never match in this family.
pub(super) fn side(m: &ResolvedMatch, family: u8, src: bool) -> Option<(Vec<String>, Vec<String>)> {
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

pub(super) fn icmp_parts(r: &ResolvedRule, family: u8) -> Vec<String> {
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
    render_rule_with(r, cfg, owner, ingress, None)
}

/// NFLOG group of flow logs for ingress rules (Calico's 1) and egress rules (2).
pub const FLOW_LOG_GROUP_INGRESS: u16 = 1;
pub const FLOW_LOG_GROUP_EGRESS: u16 = 2;
/// Bytes of each logged packet handed to Felix: the headers, as Calico's `snaplen 80`.
pub const FLOW_LOG_SNAPLEN: u16 = 80;

/// The rule a flow-log prefix names for rule `index` of `owner` in one direction.
pub fn flow_rule_ref(
    owner: &LogOwner<'_>,
    ingress: bool,
    index: usize,
    action: RuleAction,
) -> Option<margay_flows::RuleRef> {
    use margay_flows::{Action, Direction, Origin, RuleRef};
    let action = match action {
        RuleAction::Allow => Action::Allow,
        RuleAction::Deny => Action::Deny,
        RuleAction::Pass => Action::Pass,
        RuleAction::Log => return None,
    };
    let origin = if owner.kind == "pro" {
        Origin::Profile {
            name: owner.name.to_string(),
        }
    } else {
        Origin::Policy {
            kind: owner.kind.to_string(),
            namespace: owner.namespace.to_string(),
            name: owner.name.to_string(),
        }
    };
    Some(RuleRef {
        action,
        direction: if ingress {
            Direction::Ingress
        } else {
            Direction::Egress
        },
        origin,
        rule_index: u32::try_from(index).ok(),
    })
}

/// Every flow-log prefix the renderer writes for `model`, with what each names: how Felix
/// reads back the prefixes the kernel had to shorten.
pub fn flow_prefix_table(model: &margay_calc::DataplaneModel) -> margay_flows::PrefixTable {
    use margay_flows::{Action, Direction, Origin, RuleRef};
    let mut t = margay_flows::PrefixTable::default();
    let mut add_rules =
        |owner: &LogOwner<'_>, inbound: &[ResolvedRule], outbound: &[ResolvedRule]| {
            for (ingress, rules) in [(true, inbound), (false, outbound)] {
                for (i, r) in rules.iter().enumerate() {
                    if let Some(rule) = flow_rule_ref(owner, ingress, i, r.action) {
                        let tier = if owner.kind == "pro" {
                            "__PROFILE__"
                        } else {
                            owner.tier
                        };
                        t.insert(rule, tier);
                    }
                }
            }
        };
    for (id, pol) in &model.policies {
        add_rules(&LogOwner::policy(id), &pol.inbound, &pol.outbound);
    }
    for (id, prof) in &model.profiles {
        add_rules(&LogOwner::profile(id), &prof.inbound, &prof.outbound);
    }
    for dir in [Direction::Ingress, Direction::Egress] {
        for ep in model.workload_endpoints.values() {
            for tier in &ep.tiers {
                for action in [Action::Deny, Action::Pass] {
                    let rule = RuleRef {
                        action,
                        direction: dir,
                        origin: Origin::EndOfTier {
                            tier: tier.name.clone(),
                        },
                        rule_index: None,
                    };
                    t.insert(rule, &tier.name);
                }
            }
        }
        let none = RuleRef {
            action: Action::Deny,
            direction: dir,
            origin: Origin::NoProfile,
            rule_index: None,
        };
        t.insert(none, "__PROFILE__");
    }
    t
}

/// The nft statement that hands a packet to Felix's flow logs, naming `rule`.
pub fn flow_log_statement(rule: &margay_flows::RuleRef) -> String {
    let group = match rule.direction {
        margay_flows::Direction::Ingress => FLOW_LOG_GROUP_INGRESS,
        margay_flows::Direction::Egress => FLOW_LOG_GROUP_EGRESS,
    };
    // Prefixes are made of names Calico allows (no quotes); strip any to stay parseable.
    format!(
        "log prefix \"{}\" group {group} snaplen {FLOW_LOG_SNAPLEN}",
        rule.prefix().replace(['"', '\\'], "")
    )
}

/// [`render_rule`], with `flow_log` (a [`flow_log_statement`]) before the verdict.
pub fn render_rule_with(
    r: &ResolvedRule,
    cfg: &NftConfig,
    owner: &LogOwner<'_>,
    ingress: bool,
    flow_log: Option<&str>,
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
    let action = match flow_log {
        Some(log) if r.action != RuleAction::Log => format!("{log} {action}"),
        _ => action,
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

pub(super) fn rules_chain(
    rules: &[ResolvedRule],
    cfg: &NftConfig,
    owner: &LogOwner<'_>,
    ingress: bool,
) -> ChainSpec {
    ChainSpec {
        base: None,
        rules: rules
            .iter()
            .enumerate()
            .flat_map(|(i, r)| {
                let log = cfg
                    .flow_logs
                    .then(|| flow_rule_ref(owner, ingress, i, r.action))
                    .flatten()
                    .map(|rule| flow_log_statement(&rule));
                render_rule_with(r, cfg, owner, ingress, log.as_deref())
            })
            .map(NftRule::new)
            .collect(),
    }
}

/// Protocols whose transport header starts with the source and destination ports (what
/// `th dport` reads): TCP, UDP, SCTP, UDP-Lite.
pub(super) fn has_ports(protocol: u8) -> bool {
    matches!(protocol, 6 | 17 | 132 | 136)
}

/// Sorted, with overlapping and adjacent ranges merged: the kernel refuses overlapping
/// intervals in a set.
pub(super) fn merge_ports(mut ports: Vec<margay_calc::PortRange>) -> Vec<margay_calc::PortRange> {
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
