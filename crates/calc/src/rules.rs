//! Rule scanning: v3 rules in, dataplane rules and the IP sets they need out.
//!
//! Follows Calico's conversion facts: a namespaced policy's rule selectors are limited to the
//! policy's namespace unless the rule has a namespaceSelector (rewritten onto the endpoints'
//! `pcns.` labels; `all()` means "any namespaced endpoint", `global()` "any non-namespaced
//! one"); service-account matches become selectors on `pcsa.` labels and on
//! `projectcalico.org/serviceaccount`; a negated selector is folded into the positive one when
//! there is one; named ports become IP sets of (address, protocol, port) filtered by the
//! positive selector.

use std::collections::BTreeMap;

use base64::Engine as _;
use margay_api::net::Cidr;
use margay_api::numorstring::{Port, Protocol};
use margay_api::policy::{Action, EntityRule, Rule, ServiceAccountMatch};
use margay_selector::Selector;
use sha2::{Digest, Sha224};

use crate::messages::{
    IcmpMatch, IpSetKind, PortProtocol, PortRange, ResolvedMatch, ResolvedRule, RuleAction,
};

/// Label every namespaced endpoint carries: its namespace.
pub const LABEL_NAMESPACE: &str = "projectcalico.org/namespace";
/// Label carrying a workload's orchestrator.
pub const LABEL_ORCHESTRATOR: &str = "projectcalico.org/orchestrator";
/// Label carrying a workload's service account.
pub const LABEL_SERVICE_ACCOUNT: &str = "projectcalico.org/serviceaccount";
/// Prefix of namespace labels as endpoints inherit them from `kns.<ns>` profiles.
pub const NAMESPACE_LABEL_PREFIX: &str = "pcns.";
/// Prefix of service-account labels as endpoints inherit them from `ksa.` profiles.
pub const SERVICE_ACCOUNT_LABEL_PREFIX: &str = "pcsa.";
/// Profile that carries a namespace's labels and default rules.
pub const NAMESPACE_PROFILE_PREFIX: &str = "kns.";
/// Profile that carries a service account's labels.
pub const SERVICE_ACCOUNT_PROFILE_PREFIX: &str = "ksa.";

/// Why a rule or selector could not be used. The resource is then treated as absent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("{field}: bad selector {selector:?}: {reason}")]
    Selector {
        field: String,
        selector: String,
        reason: String,
    },
    #[error("{field}: {value:?} is not a valid network")]
    Net { field: String, value: String },
    #[error("{field}: {reason}")]
    Other { field: String, reason: String },
}

/// Where an IP set's members come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpSetSource {
    /// Addresses of every endpoint and network set the selector matches.
    Selector(Selector),
    /// (address, protocol, port) of every endpoint the selector matches that has a port of this
    /// name (and protocol, when given).
    NamedPort {
        selector: Selector,
        protocol: Option<PortProtocol>,
        port: String,
    },
    /// A Kubernetes Service's endpoints (address, protocol, port), from its EndpointSlices
    /// (`services::ServiceIndex::ip_set_members`); empty while the service or its slices are
    /// unknown: a rule naming it then matches no traffic, as in Calico.
    Service { namespace: String, name: String },
}

impl IpSetSource {
    pub fn kind(&self) -> IpSetKind {
        match self {
            IpSetSource::Selector(_) => IpSetKind::Net,
            IpSetSource::NamedPort { .. } | IpSetSource::Service { .. } => IpSetKind::IpAndPort,
        }
    }

    pub fn selector(&self) -> Option<&Selector> {
        match self {
            IpSetSource::Selector(s) | IpSetSource::NamedPort { selector: s, .. } => Some(s),
            IpSetSource::Service { .. } => None,
        }
    }

    /// Calico's IP-set id: the selector's UniqueID, or a hash of it with the named port.
    pub fn id(&self) -> String {
        match self {
            IpSetSource::Selector(s) => s.unique_id().to_string(),
            IpSetSource::NamedPort {
                selector,
                protocol,
                port,
            } => {
                let proto = protocol.map_or("any".to_string(), |p| p.to_string());
                unique_id("n", &format!("{},{proto},{port}", selector.unique_id()))
            }
            IpSetSource::Service { namespace, name } => {
                unique_id("svc", &format!("{namespace}/{name}"))
            }
        }
    }

    /// A human description, for the status API.
    pub fn describe(&self) -> String {
        match self {
            IpSetSource::Selector(s) => s.canonical().to_string(),
            IpSetSource::NamedPort {
                selector,
                protocol,
                port,
            } => {
                let proto = protocol.map_or("any".to_string(), |p| p.to_string());
                format!("{} port {proto}:{port}", selector.canonical())
            }
            IpSetSource::Service { namespace, name } => format!("service {namespace}/{name}"),
        }
    }
}

/// `<prefix>:<base64url(SHA-224("<prefix>:<content>"))>`, Calico's hash.MakeUniqueID.
pub fn unique_id(prefix: &str, content: &str) -> String {
    let mut hasher = Sha224::new();
    hasher.update(prefix.as_bytes());
    hasher.update(b":");
    hasher.update(content.as_bytes());
    let digest = hasher.finalize();
    format!(
        "{prefix}:{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest)
    )
}

/// Rules resolved for the dataplane, with the IP sets they reference (by id).
#[derive(Debug, Clone, Default)]
pub struct ScannedRules {
    pub inbound: Vec<ResolvedRule>,
    pub outbound: Vec<ResolvedRule>,
    pub ip_sets: BTreeMap<String, IpSetSource>,
}

/// Resolves a policy's or profile's rules. `namespace` is the policy's namespace ("" for
/// global policies and profiles).
pub fn scan_rules(
    ingress: &[Rule],
    egress: &[Rule],
    namespace: &str,
    owner: &str,
) -> Result<ScannedRules, RuleError> {
    let mut out = ScannedRules::default();
    for (dir, rules, field) in [(0, ingress, "spec.ingress"), (1, egress, "spec.egress")] {
        for (i, rule) in rules.iter().enumerate() {
            let field = format!("{field}[{i}]");
            let resolved = scan_rule(rule, namespace, &field, &mut out.ip_sets, owner, i)?;
            if dir == 0 {
                out.inbound.push(resolved);
            } else {
                out.outbound.push(resolved);
            }
        }
    }
    Ok(out)
}

fn parse_selector(field: &str, s: &str) -> Result<Selector, RuleError> {
    Selector::parse(s).map_err(|e| RuleError::Selector {
        field: field.to_string(),
        selector: s.to_string(),
        reason: e.to_string(),
    })
}

fn prefixed(field: &str, s: &str, prefix: &str) -> Result<String, RuleError> {
    margay_selector::prefix_labels(s, prefix).map_err(|e| RuleError::Selector {
        field: field.to_string(),
        selector: s.to_string(),
        reason: e.to_string(),
    })
}

/// The selector a service-account match stands for.
fn service_account_selector(field: &str, sam: &ServiceAccountMatch) -> Result<String, RuleError> {
    let mut by_labels = String::new();
    if !sam.selector.is_empty() {
        by_labels = prefixed(field, &sam.selector, SERVICE_ACCOUNT_LABEL_PREFIX)?;
    }
    if sam.names.is_empty() {
        return Ok(by_labels);
    }
    let quoted: Vec<String> = sam.names.iter().map(|n| format!("'{n}'")).collect();
    let by_names = format!("{LABEL_SERVICE_ACCOUNT} in {{ {} }}", quoted.join(", "));
    // Normalise as Calico does (it parses and re-renders the names selector).
    let by_names = parse_selector(field, &by_names)?.canonical().to_string();
    if by_labels.is_empty() {
        Ok(by_names)
    } else {
        Ok(format!("({by_labels}) && ({by_names})"))
    }
}

/// The endpoint selector an entity rule stands for, namespace scoping included ("" = none).
pub fn entity_selector(er: &EntityRule, namespace: &str, field: &str) -> Result<String, RuleError> {
    let sa = match &er.service_accounts {
        Some(sam) => service_account_selector(field, sam)?,
        None => String::new(),
    };
    let ns_selector = if !er.namespace_selector.is_empty() {
        prefixed(
            &format!("{field}.namespaceSelector"),
            &er.namespace_selector,
            NAMESPACE_LABEL_PREFIX,
        )?
        .replace("all()", &format!("has({LABEL_NAMESPACE})"))
        .replace("global()", &format!("!has({LABEL_NAMESPACE})"))
    } else if !namespace.is_empty() {
        format!("{LABEL_NAMESPACE} == '{namespace}'")
    } else {
        String::new()
    };
    let parts: Vec<&str> = [sa.as_str(), er.selector.as_str()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    let mut selector = match parts.as_slice() {
        [] => String::new(),
        [one] => (*one).to_string(),
        many => format!("({})", many.join(") && (")),
    };
    let scoped =
        !selector.is_empty() || !er.not_selector.is_empty() || !er.namespace_selector.is_empty();
    if !ns_selector.is_empty() && scoped {
        selector = if selector.is_empty() {
            ns_selector
        } else {
            format!("({ns_selector}) && ({selector})")
        };
    }
    Ok(selector)
}

fn port_protocol(p: &Protocol) -> Option<PortProtocol> {
    match p.number() {
        Some(6) => Some(PortProtocol::Tcp),
        Some(17) => Some(PortProtocol::Udp),
        Some(132) => Some(PortProtocol::Sctp),
        _ => None,
    }
}

/// Splits a port list into numeric ranges and names.
fn split_ports(ports: &[Port]) -> (Vec<PortRange>, Vec<String>) {
    let mut numeric = Vec::new();
    let mut named = Vec::new();
    for p in ports {
        match p {
            Port::Single(n) => numeric.push(PortRange {
                first: *n,
                last: *n,
            }),
            Port::Range(a, b) => numeric.push(PortRange {
                first: *a,
                last: *b,
            }),
            Port::Named(name) => named.push(name.clone()),
        }
    }
    (numeric, named)
}

fn nets(field: &str, values: &[String]) -> Result<Vec<Cidr>, RuleError> {
    values
        .iter()
        .map(|v| {
            Cidr::parse_cidr_or_ip(v)
                .map(|c| c.network())
                .map_err(|_| RuleError::Net {
                    field: field.to_string(),
                    value: v.clone(),
                })
        })
        .collect()
}

fn icmp(
    field: &str,
    f: &Option<margay_api::policy::IcmpFields>,
) -> Result<Option<IcmpMatch>, RuleError> {
    let Some(f) = f else { return Ok(None) };
    let Some(t) = f.type_ else {
        return Ok(None);
    };
    let icmp_type = u8::try_from(t).map_err(|_| RuleError::Other {
        field: format!("{field}.type"),
        reason: format!("{t} is not an ICMP type (0-255)"),
    })?;
    let code = f
        .code
        .map(|c| {
            u8::try_from(c).map_err(|_| RuleError::Other {
                field: format!("{field}.code"),
                reason: format!("{c} is not an ICMP code (0-255)"),
            })
        })
        .transpose()?;
    Ok(Some(IcmpMatch { icmp_type, code }))
}

struct Side {
    matched: ResolvedMatch,
}

/// Resolves one side of a rule and records the IP sets it needs.
fn scan_side(
    er: &EntityRule,
    namespace: &str,
    field: &str,
    named_port_proto: Option<PortProtocol>,
    ip_sets: &mut BTreeMap<String, IpSetSource>,
) -> Result<Side, RuleError> {
    let positive = entity_selector(er, namespace, field)?;
    let (positive, negative) = if !positive.is_empty() && !er.not_selector.is_empty() {
        (
            format!("({positive}) && (!({}))", er.not_selector),
            String::new(),
        )
    } else {
        (positive, er.not_selector.clone())
    };
    let positive = if positive.is_empty() {
        None
    } else {
        Some(parse_selector(&format!("{field}.selector"), &positive)?)
    };
    let negative = if negative.is_empty() {
        None
    } else {
        Some(parse_selector(&format!("{field}.notSelector"), &negative)?)
    };
    let (ports, named) = split_ports(&er.ports);
    let (not_ports, not_named) = split_ports(&er.not_ports);

    let mut m = ResolvedMatch {
        nets: nets(&format!("{field}.nets"), &er.nets)?,
        not_nets: nets(&format!("{field}.notNets"), &er.not_nets)?,
        ports,
        not_ports,
        original_selector: er.selector.clone(),
        original_not_selector: er.not_selector.clone(),
        original_namespace_selector: er.namespace_selector.clone(),
        ..ResolvedMatch::default()
    };
    let mut add = |source: IpSetSource| -> String {
        let id = source.id();
        ip_sets.entry(id.clone()).or_insert(source);
        id
    };
    let named_sel = positive.clone().unwrap_or_else(Selector::all);
    for port in &named {
        m.named_port_ip_set_ids.push(add(IpSetSource::NamedPort {
            selector: named_sel.clone(),
            protocol: named_port_proto,
            port: port.clone(),
        }));
    }
    for port in &not_named {
        m.not_named_port_ip_set_ids
            .push(add(IpSetSource::NamedPort {
                selector: named_sel.clone(),
                protocol: named_port_proto,
                port: port.clone(),
            }));
    }
    // The named-port sets are already filtered by the positive selector; a separate selector
    // set is only needed when numeric ports (or no ports) are matched too.
    if let Some(sel) = positive
        && (!m.ports.is_empty() || named.is_empty())
    {
        m.ip_set_ids.push(add(IpSetSource::Selector(sel)));
    }
    if let Some(sel) = negative {
        m.not_ip_set_ids.push(add(IpSetSource::Selector(sel)));
    }
    if let Some(svc) = &er.services {
        let ns = if svc.namespace.is_empty() {
            namespace.to_string()
        } else {
            svc.namespace.clone()
        };
        m.ip_set_ids.push(add(IpSetSource::Service {
            namespace: ns,
            name: svc.name.clone(),
        }));
    }
    Ok(Side { matched: m })
}

fn scan_rule(
    rule: &Rule,
    namespace: &str,
    field: &str,
    ip_sets: &mut BTreeMap<String, IpSetSource>,
    owner: &str,
    index: usize,
) -> Result<ResolvedRule, RuleError> {
    let action = match rule.action {
        Action::Allow => RuleAction::Allow,
        Action::Deny => RuleAction::Deny,
        Action::Log => RuleAction::Log,
        Action::Pass => RuleAction::Pass,
    };
    let ip_version = match rule.ip_version {
        None => None,
        Some(v @ (4 | 6)) => Some(v as u8),
        Some(v) => {
            return Err(RuleError::Other {
                field: format!("{field}.ipVersion"),
                reason: format!("{v} is not 4 or 6"),
            });
        }
    };
    let proto_num = |p: &Option<Protocol>, f: &str| -> Result<Option<u8>, RuleError> {
        match p {
            None => Ok(None),
            Some(p) => p.number().map(Some).ok_or_else(|| RuleError::Other {
                field: format!("{field}.{f}"),
                reason: format!("unknown protocol {p}"),
            }),
        }
    };
    let protocol = proto_num(&rule.protocol, "protocol")?;
    let not_protocol = proto_num(&rule.not_protocol, "notProtocol")?;
    let named_port_proto = rule.protocol.as_ref().and_then(port_protocol);
    let src = scan_side(
        &rule.source,
        namespace,
        &format!("{field}.source"),
        named_port_proto,
        ip_sets,
    )?;
    let dst = scan_side(
        &rule.destination,
        namespace,
        &format!("{field}.destination"),
        named_port_proto,
        ip_sets,
    )?;
    let mut resolved = ResolvedRule {
        action,
        ip_version,
        protocol,
        not_protocol,
        icmp: icmp(&format!("{field}.icmp"), &rule.icmp)?,
        not_icmp: icmp(&format!("{field}.notICMP"), &rule.not_icmp)?,
        src: src.matched,
        dst: dst.matched,
        rule_id: String::new(),
    };
    // The id names the rule by its owner, position and content, so a changed rule gets a new
    // id (counters restart) and an unchanged one keeps it.
    resolved.rule_id = unique_id("r", &format!("{owner}/{field}/{index}/{resolved:?}"))
        .chars()
        .take(18)
        .collect();
    Ok(resolved)
}

/// Rules that drop everything: what an endpoint gets for a profile that does not exist.
pub fn deny_all() -> ScannedRules {
    let deny = ResolvedRule {
        action: RuleAction::Deny,
        ip_version: None,
        protocol: None,
        not_protocol: None,
        icmp: None,
        not_icmp: None,
        src: ResolvedMatch::default(),
        dst: ResolvedMatch::default(),
        rule_id: "missing-profile".to_string(),
    };
    ScannedRules {
        inbound: vec![deny.clone()],
        outbound: vec![deny],
        ip_sets: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use margay_api::policy::ServiceMatch;

    fn er(selector: &str, ns_selector: &str, not_selector: &str) -> EntityRule {
        EntityRule {
            selector: selector.into(),
            namespace_selector: ns_selector.into(),
            not_selector: not_selector.into(),
            ..EntityRule::default()
        }
    }

    #[test]
    fn namespaced_rule_selectors_are_scoped_to_the_namespace() {
        assert_eq!(
            entity_selector(&er("app == 'db'", "", ""), "prod", "f").unwrap(),
            "(projectcalico.org/namespace == 'prod') && (app == 'db')"
        );
        // No selector at all: no IP set, any source.
        assert_eq!(entity_selector(&er("", "", ""), "prod", "f").unwrap(), "");
        // Only a notSelector: scoped to the namespace.
        assert_eq!(
            entity_selector(&er("", "", "app == 'x'"), "prod", "f").unwrap(),
            "projectcalico.org/namespace == 'prod'"
        );
        // Global policy: unscoped.
        assert_eq!(
            entity_selector(&er("app == 'db'", "", ""), "", "f").unwrap(),
            "app == 'db'"
        );
    }

    #[test]
    fn namespace_selectors_use_pcns_labels() {
        let s = entity_selector(&er("", "team == 'a'", ""), "prod", "f").unwrap();
        assert_eq!(s, "pcns.team == \"a\"");
        let s = entity_selector(&er("app == 'x'", "all()", ""), "", "f").unwrap();
        assert_eq!(s, "(has(projectcalico.org/namespace)) && (app == 'x')");
        let s = entity_selector(&er("", "global()", ""), "", "f").unwrap();
        assert_eq!(s, "!has(projectcalico.org/namespace)");
    }

    #[test]
    fn service_accounts_become_selectors() {
        let mut e = er("app == 'x'", "", "");
        e.service_accounts = Some(ServiceAccountMatch {
            names: vec!["sa1".into(), "sa2".into()],
            selector: "role == 'admin'".into(),
        });
        let s = entity_selector(&e, "", "f").unwrap();
        let sel = Selector::parse(&s).unwrap();
        let labels = BTreeMap::from([
            ("app", "x"),
            ("pcsa.role", "admin"),
            (LABEL_SERVICE_ACCOUNT, "sa2"),
        ]);
        assert!(sel.matches(&labels), "{s}");
        let wrong_sa = BTreeMap::from([
            ("app", "x"),
            ("pcsa.role", "admin"),
            (LABEL_SERVICE_ACCOUNT, "sa3"),
        ]);
        assert!(!sel.matches(&wrong_sa));
    }

    #[test]
    fn named_ports_become_ip_port_sets_filtered_by_the_selector() {
        let mut rule = Rule::new(Action::Allow);
        rule.protocol = Some(Protocol::Name("TCP".into()));
        rule.destination = EntityRule {
            selector: "app == 'web'".into(),
            ports: vec![Port::Named("http".into())],
            ..EntityRule::default()
        };
        let scanned = scan_rules(&[rule], &[], "", "p").unwrap();
        let r = &scanned.inbound[0];
        assert_eq!(r.dst.named_port_ip_set_ids.len(), 1);
        // Named port covers the selector: no separate selector set.
        assert!(r.dst.ip_set_ids.is_empty());
        let id = &r.dst.named_port_ip_set_ids[0];
        assert!(id.starts_with("n:"));
        match &scanned.ip_sets[id] {
            IpSetSource::NamedPort {
                selector,
                protocol,
                port,
            } => {
                assert_eq!(selector.canonical(), "app == \"web\"");
                assert_eq!(*protocol, Some(PortProtocol::Tcp));
                assert_eq!(port, "http");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn not_selector_folds_into_positive_selector() {
        let mut rule = Rule::new(Action::Deny);
        rule.source = er("app == 'a'", "", "env == 'dev'");
        let scanned = scan_rules(&[rule], &[], "", "p").unwrap();
        let r = &scanned.inbound[0];
        assert!(r.src.not_ip_set_ids.is_empty());
        assert_eq!(r.src.ip_set_ids.len(), 1);
        let IpSetSource::Selector(sel) = &scanned.ip_sets[&r.src.ip_set_ids[0]] else {
            panic!()
        };
        assert!(sel.matches(&BTreeMap::from([("app", "a"), ("env", "prod")])));
        assert!(!sel.matches(&BTreeMap::from([("app", "a"), ("env", "dev")])));
        // Alone, a notSelector is its own set.
        let mut rule = Rule::new(Action::Deny);
        rule.source = er("", "", "env == 'dev'");
        let scanned = scan_rules(&[rule], &[], "", "p").unwrap();
        assert_eq!(scanned.inbound[0].src.not_ip_set_ids.len(), 1);
        assert!(scanned.inbound[0].src.ip_set_ids.is_empty());
    }

    #[test]
    fn services_get_empty_sets_and_ids_are_stable() {
        let mut rule = Rule::new(Action::Allow);
        rule.destination.services = Some(ServiceMatch {
            name: "kube-dns".into(),
            namespace: "kube-system".into(),
        });
        let a = scan_rules(std::slice::from_ref(&rule), &[], "", "p").unwrap();
        let b = scan_rules(&[rule], &[], "", "p").unwrap();
        assert_eq!(a.inbound, b.inbound);
        assert!(
            a.ip_sets
                .values()
                .any(|s| matches!(s, IpSetSource::Service { .. }))
        );
    }

    #[test]
    fn unique_id_matches_calico_format() {
        let id = unique_id("n", "x");
        assert!(id.starts_with("n:"));
        // SHA-224 is 28 bytes: 38 base64url characters without padding.
        assert_eq!(id.len(), 2 + 38);
    }
}
