//! Rules of policies, profiles, tiers and network sets.

use crate::net::Cidr;
use crate::numorstring::{Port, Protocol};
use crate::policy::{
    Action, EntityRule, GlobalNetworkPolicySpec, HttpMatch, IcmpFields, NetworkPolicySpec,
    NetworkSetSpec, PolicyType, ProfileSpec, Rule, TierSpec,
};
use crate::policy::{
    DEFAULT_TIER, DEFAULT_TIER_ORDER, KUBE_ADMIN_TIER, KUBE_ADMIN_TIER_ORDER, KUBE_BASELINE_TIER,
    KUBE_BASELINE_TIER_ORDER,
};

use super::syntax::{port_name, rule_port_name};
use super::{Path, Validator};

const MAX_RULES: usize = 1024;
const MAX_NETS: usize = 256;
const MAX_PORTS: usize = 50;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

/// What kind of resource the rules belong to: global policies require a namespace on
/// service matches, profiles have no spec-level restrictions.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owner {
    Namespaced,
    Global,
    Profile,
}

pub(super) fn network_policy(v: &mut Validator, p: Path<'_>, s: &NetworkPolicySpec) {
    tier_ref(v, p.field("tier"), &s.tier);
    v.selector_without_global(&s.selector, p.field("selector"), "a policy selector");
    v.selector_without_global(
        &s.service_account_selector,
        p.field("serviceAccountSelector"),
        "a serviceAccountSelector",
    );
    types(v, p.field("types"), &s.types);
    no_duplicates(v, p.field("performanceHints"), &s.performance_hints);
    rules(v, p, Owner::Namespaced, &s.ingress, &s.egress);
    order(v, p.field("order"), s.order);
}

pub(super) fn global_network_policy(v: &mut Validator, p: Path<'_>, s: &GlobalNetworkPolicySpec) {
    tier_ref(v, p.field("tier"), &s.tier);
    v.selector_without_global(&s.selector, p.field("selector"), "a policy selector");
    v.selector_without_global(
        &s.service_account_selector,
        p.field("serviceAccountSelector"),
        "a serviceAccountSelector",
    );
    v.selector_without_global(
        &s.namespace_selector,
        p.field("namespaceSelector"),
        "a policy namespaceSelector",
    );
    types(v, p.field("types"), &s.types);
    no_duplicates(v, p.field("performanceHints"), &s.performance_hints);
    rules(v, p, Owner::Global, &s.ingress, &s.egress);
    order(v, p.field("order"), s.order);
    if s.pre_dnat && s.do_not_track {
        v.err(
            p.field("doNotTrack"),
            "preDNAT and doNotTrack cannot both be true",
        );
    }
    if s.pre_dnat && !s.egress.is_empty() {
        v.err(
            p.field("egress"),
            "a preDNAT policy cannot have egress rules",
        );
    }
    if s.pre_dnat && s.types.contains(&PolicyType::Egress) {
        v.err(
            p.field("types"),
            "a preDNAT policy cannot have the Egress type",
        );
    }
    if (s.pre_dnat || s.do_not_track) && !s.apply_on_forward {
        let field = if s.pre_dnat { "preDNAT" } else { "doNotTrack" };
        v.err(
            p.field("applyOnForward"),
            format!("must be true when {field} is true"),
        );
    }
}

pub(super) fn profile(v: &mut Validator, p: Path<'_>, s: &ProfileSpec) {
    rules(v, p, Owner::Profile, &s.ingress, &s.egress);
    v.labels(&s.labels_to_apply, p.field("labelsToApply"));
}

pub(super) fn tier(v: &mut Validator, p: Path<'_>, name: &str, s: &TierSpec) {
    order(v, p.field("order"), s.order);
    if let Some(action) = s.default_action
        && !matches!(action, Action::Deny | Action::Pass)
    {
        v.err(
            p.field("defaultAction"),
            format!("{action:?} is not allowed (a tier's defaultAction is Deny or Pass)"),
        );
    }
    let required = match name {
        DEFAULT_TIER => Some((DEFAULT_TIER_ORDER, Action::Deny)),
        KUBE_ADMIN_TIER => Some((KUBE_ADMIN_TIER_ORDER, Action::Pass)),
        KUBE_BASELINE_TIER => Some((KUBE_BASELINE_TIER_ORDER, Action::Pass)),
        _ => None,
    };
    if let Some((want_order, want_action)) = required {
        if s.order != Some(want_order) {
            v.err(
                p.field("order"),
                format!("the {name:?} tier must have order {want_order}"),
            );
        }
        // Calico defaults defaultAction to Deny before checking the reserved tiers.
        if s.default_action.unwrap_or(Action::Deny) != want_action {
            v.err(
                p.field("defaultAction"),
                format!("the {name:?} tier must have defaultAction {want_action:?}"),
            );
        }
    }
}

pub(super) fn network_set(v: &mut Validator, p: Path<'_>, s: &NetworkSetSpec) {
    let nets = p.field("nets");
    for (i, n) in s.nets.iter().enumerate() {
        if let Err(e) = Cidr::parse_cidr_or_ip(n) {
            v.err(nets.index(i), e);
        }
    }
}

fn order(v: &mut Validator, p: Path<'_>, order: Option<f64>) {
    if let Some(o) = order
        && !o.is_finite()
    {
        v.err(p, "order must be a finite number");
    }
}

fn tier_ref(v: &mut Validator, p: Path<'_>, tier: &str) {
    if !tier.is_empty()
        && let Err(e) = super::syntax::dns1123_label(tier)
    {
        v.err(p, format!("tier name {e}"));
    }
}

fn types(v: &mut Validator, p: Path<'_>, types: &[PolicyType]) {
    no_duplicates(v, p, types);
}

fn no_duplicates<T: PartialEq + std::fmt::Debug>(v: &mut Validator, p: Path<'_>, items: &[T]) {
    for (i, t) in items.iter().enumerate() {
        if items[..i].contains(t) {
            v.err(p.index(i), format!("{t:?} is listed more than once"));
        }
    }
}

fn rules(v: &mut Validator, p: Path<'_>, owner: Owner, ingress: &[Rule], egress: &[Rule]) {
    for (field, list, dir) in [
        ("ingress", ingress, Direction::Ingress),
        ("egress", egress, Direction::Egress),
    ] {
        let lp = p.field(field);
        if list.len() > MAX_RULES {
            v.err(lp, format!("{} rules (max {MAX_RULES})", list.len()));
        }
        for (i, r) in list.iter().enumerate() {
            rule(v, lp.index(i), owner, dir, r);
        }
    }
}

fn rule(v: &mut Validator, p: Path<'_>, owner: Owner, dir: Direction, r: &Rule) {
    if let Some(ver) = r.ip_version
        && ver != 4
        && ver != 6
    {
        v.err(
            p.field("ipVersion"),
            format!("{ver} is not an IP version (use 4 or 6)"),
        );
    }
    let version_path = p.field("ipVersion");
    protocol(
        v,
        p.field("protocol"),
        version_path,
        r.protocol.as_ref(),
        r.ip_version,
    );
    protocol(
        v,
        p.field("notProtocol"),
        version_path,
        r.not_protocol.as_ref(),
        r.ip_version,
    );
    if let Some(icmp) = &r.icmp {
        if !r
            .protocol
            .as_ref()
            .is_some_and(|pr| pr.is_icmp_v4() || pr.is_icmp_v6())
        {
            v.err(
                p.field("icmp"),
                "icmp requires protocol ICMP or ICMPv6 in the same rule",
            );
        }
        icmp_fields(v, p.field("icmp"), icmp);
    }
    if let Some(icmp) = &r.not_icmp {
        icmp_fields(v, p.field("notICMP"), icmp);
    }

    // Ports only mean something for protocols that carry them; numeric ports need one.
    let src = p.field("source");
    let dst = p.field("destination");
    for (ep, e) in [(src, &r.source), (dst, &r.destination)] {
        for (field, ports) in [("ports", &e.ports), ("notPorts", &e.not_ports)] {
            let pp = ep.field(field);
            match &r.protocol {
                None => {
                    if ports.iter().any(|x| !x.is_named()) {
                        v.err(
                            pp,
                            "numeric ports and port ranges need protocol TCP, UDP or SCTP in the same rule",
                        );
                    }
                }
                Some(proto) if !proto.supports_ports() && !ports.is_empty() => {
                    v.err(
                        pp,
                        format!(
                            "protocol {proto} has no ports; ports need protocol TCP, UDP or SCTP"
                        ),
                    );
                }
                Some(_) => {}
            }
        }
    }

    // nets: valid, masked CIDRs; one IP family per rule, agreeing with ipVersion.
    let mut families = (false, false);
    for (ep, e) in [(src, &r.source), (dst, &r.destination)] {
        for (field, nets, negated) in [("nets", &e.nets, false), ("notNets", &e.not_nets, true)] {
            nets_field(
                v,
                ep.field(field),
                nets,
                negated,
                r.ip_version,
                &mut families,
            );
        }
    }

    entity(v, src, &r.source);
    entity(v, dst, &r.destination);

    // services appear only on the remote side: source for ingress, destination for egress.
    let ((remote_name, remote_path, remote), (local_name, local_path, local)) = match dir {
        Direction::Ingress => (
            ("source", src, &r.source),
            ("destination", dst, &r.destination),
        ),
        Direction::Egress => (
            ("destination", dst, &r.destination),
            ("source", src, &r.source),
        ),
    };
    let direction = if dir == Direction::Ingress {
        "an ingress"
    } else {
        "an egress"
    };
    if local.services.is_some() {
        v.err(
            local_path.field("services"),
            format!("not allowed in {direction} rule's {local_name} (use {remote_name})"),
        );
    }
    if owner == Owner::Global
        && let Some(svc) = &remote.services
        && svc.namespace.is_empty()
    {
        let sp = remote_path.field("services");
        v.err(
            sp.field("namespace"),
            "required in a global policy (which namespace is the service in?)",
        );
    }
    if dir == Direction::Egress && r.http.is_some() && owner != Owner::Profile {
        v.err(
            p.field("http"),
            "HTTP matches are only allowed in ingress rules",
        );
    }
    if r.destination.services.is_some()
        && (!r.destination.ports.is_empty() || !r.destination.not_ports.is_empty())
    {
        v.err(
            dst.field("ports"),
            "ports and notPorts cannot be combined with services (the service defines its ports)",
        );
    }

    if let Some(http) = &r.http {
        http_match(v, p.field("http"), http);
        if r.action != Action::Allow {
            v.err(
                p.field("http"),
                "HTTP matches are only valid in Allow rules",
            );
        }
        if let Some(proto) = &r.protocol
            && proto.number() != Some(6)
        {
            v.err(
                p.field("http"),
                format!("an HTTP match needs protocol TCP or no protocol, not {proto}"),
            );
        }
    }
    if let Some(meta) = &r.metadata {
        super::meta::annotations(
            v,
            p.field("metadata").field("annotations"),
            &meta.annotations,
        );
    }
}

fn protocol(
    v: &mut Validator,
    p: Path<'_>,
    version_path: Path<'_>,
    proto: Option<&Protocol>,
    ip_version: Option<i64>,
) {
    let Some(proto) = proto else { return };
    protocol_value(v, p, proto);
    if proto.is_icmp_v4() && ip_version.is_some_and(|v| v != 4) {
        v.err(
            version_path,
            format!("protocol {proto} is IPv4-only: use ipVersion 4 (or ICMPv6 for IPv6)"),
        );
    }
    if proto.is_icmp_v6() && ip_version.is_some_and(|v| v != 6) {
        v.err(
            version_path,
            format!("protocol {proto} is IPv6-only: use ipVersion 6 (or ICMP for IPv4)"),
        );
    }
}

/// A protocol name in Calico's exact spelling, or a number 1-255.
pub(super) fn protocol_value(v: &mut Validator, p: Path<'_>, proto: &Protocol) {
    match proto {
        Protocol::Number(0) => v.err(p, "protocol number 0 is not valid (use 1-255)"),
        Protocol::Name(n) if !proto.is_known() => match Protocol::canonical_spelling(n) {
            Some(c) => v.err(p, format!("{n:?} is not a protocol name: protocol names are case-sensitive (use {c:?})")),
            None => v.err(
                p,
                format!("{n:?} is not a protocol (use TCP, UDP, ICMP, ICMPv6, SCTP, UDPLite or a number 1-255)"),
            ),
        },
        _ => {}
    }
}

fn icmp_fields(v: &mut Validator, p: Path<'_>, icmp: &IcmpFields) {
    v.range(icmp.type_, p.field("type"), 0, 254);
    v.range(icmp.code, p.field("code"), 0, 255);
    if icmp.code.is_some() && icmp.type_.is_none() {
        v.err(p.field("type"), "required when an ICMP code is given");
    }
}

fn nets_field(
    v: &mut Validator,
    p: Path<'_>,
    nets: &[String],
    negated: bool,
    ip_version: Option<i64>,
    families: &mut (bool, bool),
) {
    if nets.len() > MAX_NETS {
        v.err(p, format!("{} entries (max {MAX_NETS})", nets.len()));
    }
    let (mut v4, mut v6) = (false, false);
    for (i, n) in nets.iter().enumerate() {
        let ip = p.index(i);
        let cidr = match Cidr::parse(n) {
            Ok(c) => c,
            Err(e) => {
                v.err(ip, e);
                continue;
            }
        };
        if !cidr.is_masked() {
            v.err(
                ip,
                format!("{n:?} has host bits set (did you mean {}?)", cidr.network()),
            );
        }
        if negated && cidr.prefix() == 0 {
            v.err(
                ip,
                format!("{n:?} in notNets matches everything, so the rule could never match"),
            );
        }
        v4 |= cidr.is_ipv4();
        v6 |= !cidr.is_ipv4();
    }
    if let Some(ver) = ip_version
        && ((v4 && ver != 4) || (v6 && ver != 6))
    {
        v.err(
            p,
            format!("contains a network of the wrong family for ipVersion {ver}"),
        );
    }
    let seen_other = (v4 && families.1) || (v6 && families.0);
    if (v4 && v6) || seen_other {
        v.err(p, "a rule cannot mix IPv4 and IPv6 networks");
    }
    families.0 |= v4;
    families.1 |= v6;
}

fn entity(v: &mut Validator, p: Path<'_>, e: &EntityRule) {
    v.selector_without_global(&e.selector, p.field("selector"), "a rule selector");
    v.selector_without_global(
        &e.not_selector,
        p.field("notSelector"),
        "a rule notSelector",
    );
    if e.namespace_selector.contains("global(") && e.namespace_selector.trim() != "global()" {
        v.err(
            p.field("namespaceSelector"),
            "global() cannot be combined with other selector terms",
        );
    } else {
        v.selector(&e.namespace_selector, p.field("namespaceSelector"));
    }
    for (field, ports) in [("ports", &e.ports), ("notPorts", &e.not_ports)] {
        let pp = p.field(field);
        if ports.len() > MAX_PORTS {
            v.err(pp, format!("{} entries (max {MAX_PORTS})", ports.len()));
        }
        for (i, port) in ports.iter().enumerate() {
            port_value(v, pp.index(i), port);
        }
    }
    if let Some(sa) = &e.service_accounts {
        v.selector(&sa.selector, p.field("serviceAccounts").field("selector"));
    }
    if let Some(svc) = &e.services {
        let sp = p.field("services");
        if svc.name.is_empty() {
            v.err(sp.field("name"), "required: services must name a service");
        } else {
            v.dns_name(&svc.name, sp.field("name"));
        }
        v.dns_name(&svc.namespace, sp.field("namespace"));
        let conflicts = [
            ("namespaceSelector", !e.namespace_selector.is_empty()),
            ("serviceAccounts", e.service_accounts.is_some()),
            ("selector", !e.selector.is_empty()),
            ("notSelector", !e.not_selector.is_empty()),
            ("nets", !e.nets.is_empty()),
            ("notNets", !e.not_nets.is_empty()),
        ];
        for (field, set) in conflicts {
            if set {
                v.err(
                    p.field(field),
                    "cannot be combined with services in the same rule",
                );
            }
        }
    }
}

/// A port in a rule: 1-65535, a range with min ≤ max, or a valid port name.
pub(super) fn port_value(v: &mut Validator, p: Path<'_>, port: &Port) {
    match port {
        Port::Single(0) => v.err(p, "port 0 is not valid (use 1-65535)"),
        Port::Range(lo, hi) if *lo == 0 || *hi == 0 => v.err(
            p,
            format!("port range \"{lo}:{hi}\" includes 0 (ports are 1-65535)"),
        ),
        Port::Range(lo, hi) if lo > hi => v.err(
            p,
            format!("port range \"{lo}:{hi}\": the minimum is greater than the maximum"),
        ),
        Port::Named(name) => {
            // Calico parses [a-zA-Z0-9_.-]{1,128}, then applies the Kubernetes port-name rule.
            if let Err(e) = rule_port_name(name).and_then(|()| port_name(name)) {
                v.err(p, e);
            }
        }
        _ => {}
    }
}

fn http_match(v: &mut Validator, p: Path<'_>, h: &HttpMatch) {
    if let Some(dup) = h
        .methods
        .iter()
        .enumerate()
        .find_map(|(i, m)| h.methods[..i].contains(m).then_some(m))
    {
        v.err(
            p.field("methods"),
            format!("method {dup:?} is listed more than once"),
        );
    }
    if h.methods.len() > 20 {
        v.err(p.field("methods"), "at most 20 methods");
    }
    if h.paths.len() > 20 {
        v.err(p.field("paths"), "at most 20 paths");
    }
    let pp = p.field("paths");
    for (i, path) in h.paths.iter().enumerate() {
        let ip = pp.index(i);
        match (path.exact.is_empty(), path.prefix.is_empty()) {
            (false, false) => v.err(ip, "set either exact or prefix, not both"),
            (true, true) => v.err(ip, "set one of exact or prefix"),
            (exact_empty, _) => {
                let (field, value) = if exact_empty {
                    ("prefix", &path.prefix)
                } else {
                    ("exact", &path.exact)
                };
                if !value.starts_with('/') || value.contains(['?', ' ', '#']) {
                    v.err(
                        ip.field(field),
                        format!("{value:?} is not a valid path (must start with '/' and contain no '?', '#' or space)"),
                    );
                }
            }
        }
    }
}
