//! Kubernetes `networking.k8s.io/v1` NetworkPolicy, read and converted into the
//! `projectcalico.org/v3` NetworkPolicy Calico makes of it.
//!
//! The conversion follows Calico's for Kubernetes policies (its facts, not its code):
//!
//! - name `knp.default.<name>` (the prefix kube-controllers uses when it writes Kubernetes
//!   policies into etcd), same namespace, tier `default`, order 1000;
//! - the selector is `projectcalico.org/orchestrator == 'k8s'` followed by the pod selector's
//!   terms: `matchLabels` sorted by key (`key == 'value'`), then `matchExpressions` in order
//!   (`key in { 'a', 'b' }`, `key not in { ... }`, `has(key)`, `! has(key)`), joined by ` && `;
//! - a peer's podSelector becomes the rule's selector the same way (an absent podSelector still
//!   gives the orchestrator term); its namespaceSelector becomes the rule's namespaceSelector
//!   without the orchestrator term (absent = the policy's namespace, empty = `all()`), which the
//!   calculation graph matches against the endpoints' `pcns.` namespace labels; an ipBlock
//!   becomes `nets` (masked) with its `except` as `notNets`;
//! - every ingress/egress rule becomes Allow rules: ports are grouped by protocol (default
//!   TCP; a port entry without `port` allows every port of its protocol; no ports at all means
//!   any protocol), protocols in sorted order, and for each protocol one rule per peer (or a
//!   single rule without a peer when `from`/`to` is empty); contiguous numeric ports of a
//!   protocol are merged into ranges (named ports first) when there is more than one port
//!   number; `port` + `endPort` is the range `port:endPort`;
//! - `policyTypes` is defaulted as the Kubernetes API server does before Calico sees the
//!   policy: when absent or empty, `Ingress`, plus `Egress` if the policy has egress rules.
//!   The converted types list Ingress before Egress.
//!
//! Where Calico drops a rule it cannot convert (a bad port) or silently makes a bad ipBlock
//! match everything, margay refuses the document and names the field, as the Kubernetes API
//! server would: every problem is reported at once, each with its path
//! (`spec.ingress[0].from[1].ipBlock.cidr: ...`).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::meta::ObjectMeta;
use crate::net::Cidr;
use crate::numorstring::{Port, Protocol};
use crate::policy::{Action, DEFAULT_TIER, EntityRule, NetworkPolicySpec, PolicyType, Rule};
use crate::resource::NetworkPolicy;
use crate::validate::syntax::{label_value, port_name, qualified_name};
use crate::validate::{FieldError, ValidationErrors};

/// `apiVersion` of a Kubernetes NetworkPolicy.
pub const API_VERSION: &str = "networking.k8s.io/v1";
/// `kind` of a Kubernetes NetworkPolicy.
pub const KIND: &str = "NetworkPolicy";
/// `kind` of a list of Kubernetes NetworkPolicies.
pub const LIST_KIND: &str = "NetworkPolicyList";
/// Prefix of the name of the v3 NetworkPolicy made from a Kubernetes one (Calico's
/// kube-controllers `KubernetesNetworkPolicyEtcdPrefix`).
pub const NAME_PREFIX: &str = "knp.default.";
/// Order of every converted Kubernetes policy (Calico's value).
pub const ORDER: f64 = 1000.0;
/// The selector term every converted pod selector starts with.
pub const ORCHESTRATOR_SELECTOR: &str = "projectcalico.org/orchestrator == 'k8s'";

/// The name of the v3 policy made from the Kubernetes policy `name`.
pub fn policy_name(name: &str) -> String {
    format!("{NAME_PREFIX}{name}")
}

/// A Kubernetes NetworkPolicy (the fields margay reads; every field of the Kubernetes type is
/// known, anything else is an error).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct K8sNetworkPolicy {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: K8sNetworkPolicySpec,
    /// Written by some Kubernetes versions; ignored.
    #[serde(default)]
    pub status: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct K8sNetworkPolicySpec {
    /// Absent or empty: every pod of the namespace.
    #[serde(default)]
    pub pod_selector: Option<LabelSelector>,
    #[serde(default)]
    pub ingress: Option<Vec<IngressRule>>,
    #[serde(default)]
    pub egress: Option<Vec<EgressRule>>,
    #[serde(default)]
    pub policy_types: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IngressRule {
    #[serde(default)]
    pub ports: Option<Vec<NetworkPolicyPort>>,
    #[serde(default)]
    pub from: Option<Vec<NetworkPolicyPeer>>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressRule {
    #[serde(default)]
    pub ports: Option<Vec<NetworkPolicyPort>>,
    #[serde(default)]
    pub to: Option<Vec<NetworkPolicyPeer>>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicyPeer {
    #[serde(default)]
    pub pod_selector: Option<LabelSelector>,
    #[serde(default)]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default)]
    pub ip_block: Option<IpBlock>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpBlock {
    pub cidr: String,
    #[serde(default)]
    pub except: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicyPort {
    /// TCP (the default), UDP or SCTP.
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub port: Option<IntOrString>,
    #[serde(default)]
    pub end_port: Option<i64>,
}

/// Kubernetes' `intstr.IntOrString`: a port number or a port name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntOrString {
    Int(i64),
    String(String),
}

impl<'de> Deserialize<'de> for IntOrString {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = IntOrString;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a port number or a port name")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<IntOrString, E> {
                Ok(IntOrString::Int(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<IntOrString, E> {
                Ok(IntOrString::Int(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<IntOrString, E> {
                Ok(IntOrString::String(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// Kubernetes' `metav1.LabelSelector`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(default)]
    pub match_labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub match_expressions: Option<Vec<LabelSelectorRequirement>>,
}

impl LabelSelector {
    fn is_empty(&self) -> bool {
        self.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
            && self.match_expressions.as_ref().is_none_or(Vec::is_empty)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelectorRequirement {
    pub key: String,
    /// In, NotIn, Exists or DoesNotExist.
    pub operator: String,
    #[serde(default)]
    pub values: Option<Vec<String>>,
}

/// Collects problems with their paths.
#[derive(Default)]
struct Problems(Vec<FieldError>);

impl Problems {
    fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }
}

/// Whether a selector is a pod selector (gets the orchestrator term) or a namespace selector.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SelectorKind {
    Pod,
    Namespace,
}

/// Converts a Kubernetes NetworkPolicy into the v3 NetworkPolicy Calico makes of it, or reports
/// every problem of the Kubernetes policy (paths relative to the document).
pub fn convert(np: &K8sNetworkPolicy) -> Result<NetworkPolicy, ValidationErrors> {
    let mut problems = Problems::default();
    if np.metadata.name.is_empty() {
        let hint = if np.metadata.generate_name.is_empty() {
            ""
        } else {
            " (generateName is not supported: give the policy a name)"
        };
        problems.add(
            "metadata.name",
            format!("required: the policy is stored as {NAME_PREFIX}<name>{hint}"),
        );
    }
    let spec = &np.spec;
    let selector = calico_selector(
        spec.pod_selector.as_ref(),
        SelectorKind::Pod,
        "spec.podSelector",
        &mut problems,
    );

    let mut ingress = Vec::new();
    for (i, r) in spec.ingress.iter().flatten().enumerate() {
        let path = format!("spec.ingress[{i}]");
        ingress.extend(rules(
            r.from.as_deref().unwrap_or_default(),
            r.ports.as_deref().unwrap_or_default(),
            &path,
            "from",
            PolicyType::Ingress,
            &mut problems,
        ));
    }
    let mut egress = Vec::new();
    for (i, r) in spec.egress.iter().flatten().enumerate() {
        let path = format!("spec.egress[{i}]");
        egress.extend(rules(
            r.to.as_deref().unwrap_or_default(),
            r.ports.as_deref().unwrap_or_default(),
            &path,
            "to",
            PolicyType::Egress,
            &mut problems,
        ));
    }
    let has_egress_rules = spec.egress.as_ref().is_some_and(|e| !e.is_empty());
    let types = policy_types(
        spec.policy_types.as_deref().unwrap_or_default(),
        has_egress_rules,
        &mut problems,
    );

    if !problems.0.is_empty() {
        return Err(ValidationErrors(problems.0));
    }
    let metadata = ObjectMeta::namespaced(
        np.metadata.namespace.clone(),
        policy_name(&np.metadata.name),
    );
    Ok(NetworkPolicy::new(
        metadata,
        NetworkPolicySpec {
            tier: DEFAULT_TIER.to_string(),
            order: Some(ORDER),
            ingress,
            egress,
            selector,
            types,
            ..NetworkPolicySpec::default()
        },
    ))
}

/// `policyTypes`, defaulted as the Kubernetes API server does.
fn policy_types(listed: &[String], has_egress_rules: bool, p: &mut Problems) -> Vec<PolicyType> {
    if listed.len() > 2 {
        p.add(
            "spec.policyTypes",
            format!("{} entries: list at most Ingress and Egress", listed.len()),
        );
    }
    let (mut ingress, mut egress) = (false, false);
    for (i, t) in listed.iter().enumerate() {
        match t.as_str() {
            "Ingress" => ingress = true,
            "Egress" => egress = true,
            other => {
                let hint = ["Ingress", "Egress"]
                    .into_iter()
                    .find(|v| v.eq_ignore_ascii_case(other))
                    .map(|v| format!(" (values are case-sensitive: use {v:?})"))
                    .unwrap_or_else(|| " (use Ingress or Egress)".to_string());
                p.add(
                    format!("spec.policyTypes[{i}]"),
                    format!("{other:?} is not a policy type{hint}"),
                );
            }
        }
    }
    if listed.is_empty() {
        ingress = true;
        egress = has_egress_rules;
    }
    let mut types = Vec::new();
    if ingress {
        types.push(PolicyType::Ingress);
    }
    if egress {
        types.push(PolicyType::Egress);
    }
    if types.is_empty() {
        types.push(PolicyType::Ingress);
    }
    types
}

/// The ports of one protocol: all of them, or the listed ones.
enum Ports {
    All,
    Listed(Vec<Port>),
}

/// One Kubernetes rule as Calico rules.
fn rules(
    peers: &[NetworkPolicyPeer],
    ports: &[NetworkPolicyPort],
    path: &str,
    peers_field: &str,
    direction: PolicyType,
    p: &mut Problems,
) -> Vec<Rule> {
    // Ports by protocol name; "" (no protocol) only when the rule lists no ports at all.
    let mut by_protocol: BTreeMap<String, Ports> = BTreeMap::new();
    if ports.is_empty() {
        by_protocol.insert(String::new(), Ports::All);
    }
    for (i, port) in ports.iter().enumerate() {
        let pp = format!("{path}.ports[{i}]");
        let protocol = protocol(port.protocol.as_deref(), &format!("{pp}.protocol"), p);
        let converted = port_value(port, &pp, p);
        let entry = by_protocol
            .entry(protocol.to_string())
            .or_insert_with(|| Ports::Listed(Vec::new()));
        match (converted, entry) {
            // A bad port was reported; the rules are not used.
            (Err(()), _) => {}
            (Ok(None), entry) => *entry = Ports::All,
            (Ok(Some(_)), Ports::All) => {}
            (Ok(Some(port)), Ports::Listed(list)) => list.push(port),
        }
    }

    let mut converted_peers = Vec::new();
    for (i, peer) in peers.iter().enumerate() {
        let pp = format!("{path}.{peers_field}[{i}]");
        if let Some(e) = peer_fields(peer, &pp, p) {
            converted_peers.push(e);
        }
    }
    if peers.is_empty() {
        converted_peers.push(EntityRule::default());
    }

    let mut out = Vec::new();
    for (protocol, ports) in by_protocol {
        let protocol = (!protocol.is_empty()).then_some(Protocol::Name(protocol));
        let ports = match ports {
            Ports::All => Vec::new(),
            Ports::Listed(list) => simplify_ports(list),
        };
        for peer in &converted_peers {
            let mut rule = Rule::new(Action::Allow);
            rule.protocol = protocol.clone();
            match direction {
                PolicyType::Ingress => {
                    rule.source = peer.clone();
                    rule.destination.ports = ports.clone();
                }
                PolicyType::Egress => {
                    rule.destination = EntityRule {
                        ports: ports.clone(),
                        ..peer.clone()
                    };
                }
            }
            out.push(rule);
        }
    }
    out
}

/// TCP, UDP or SCTP, TCP when absent.
fn protocol(value: Option<&str>, path: &str, p: &mut Problems) -> &'static str {
    const ALLOWED: [&str; 3] = ["TCP", "UDP", "SCTP"];
    let Some(v) = value else { return "TCP" };
    if let Some(ok) = ALLOWED.iter().find(|a| **a == v) {
        return ok;
    }
    let hint = match ALLOWED.iter().find(|a| a.eq_ignore_ascii_case(v)) {
        Some(c) => format!(" (protocol names are case-sensitive: use {c:?})"),
        None => " (use TCP, UDP or SCTP)".to_string(),
    };
    p.add(path, format!("{v:?} is not a supported protocol{hint}"));
    "TCP"
}

/// The destination port (range) of a port entry: Ok(None) when it names no port.
fn port_value(port: &NetworkPolicyPort, path: &str, p: &mut Problems) -> Result<Option<Port>, ()> {
    let end_path = format!("{path}.endPort");
    let Some(value) = &port.port else {
        if port.end_port.is_some() {
            p.add(end_path, "may not be set without port");
            return Err(());
        }
        return Ok(None);
    };
    match value {
        IntOrString::Int(n) => {
            let Some(start) = u16::try_from(*n).ok().filter(|n| *n != 0) else {
                p.add(
                    format!("{path}.port"),
                    format!("{n} is out of range (ports are 1-65535)"),
                );
                return Err(());
            };
            let Some(end) = port.end_port else {
                return Ok(Some(Port::Single(start)));
            };
            match u16::try_from(end).ok().filter(|e| *e != 0) {
                None => {
                    p.add(
                        end_path,
                        format!("{end} is out of range (ports are 1-65535)"),
                    );
                    Err(())
                }
                Some(e) if e < start => {
                    p.add(
                        end_path,
                        format!("{e} is less than port {start}: endPort must be at least port"),
                    );
                    Err(())
                }
                Some(e) if e == start => Ok(Some(Port::Single(start))),
                Some(e) => Ok(Some(Port::Range(start, e))),
            }
        }
        IntOrString::String(name) => {
            if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
                p.add(
                    format!("{path}.port"),
                    format!(
                        "{name:?} is a port name, and port names need a letter: write the number without quotes (port: {name})"
                    ),
                );
                return Err(());
            }
            if let Err(e) = port_name(name) {
                p.add(format!("{path}.port"), e);
                return Err(());
            }
            if port.end_port.is_some() {
                p.add(
                    end_path,
                    format!("may not be set when port is a named port ({name:?})"),
                );
                return Err(());
            }
            Ok(Some(Port::Named(name.clone())))
        }
    }
}

/// Calico's port simplification: with more than one port number, contiguous and overlapping
/// numbers are merged into ranges, listed after the named ports in ascending order.
fn simplify_ports(ports: Vec<Port>) -> Vec<Port> {
    let mut named = Vec::new();
    let mut ranges: Vec<(u16, u16)> = Vec::new();
    let mut numbers: u32 = 0;
    for p in &ports {
        match p {
            Port::Named(_) => named.push(p.clone()),
            Port::Single(n) => ranges.push((*n, *n)),
            Port::Range(lo, hi) => ranges.push((*lo, *hi)),
        }
    }
    for (lo, hi) in &ranges {
        numbers += u32::from(hi.saturating_sub(*lo)) + 1;
    }
    if numbers <= 1 {
        return ports;
    }
    ranges.sort_unstable();
    let mut merged: Vec<(u16, u16)> = Vec::new();
    for (lo, hi) in ranges {
        match merged.last_mut() {
            Some(last) if u32::from(lo) <= u32::from(last.1) + 1 => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    named.extend(merged.into_iter().map(|(lo, hi)| {
        if lo == hi {
            Port::Single(lo)
        } else {
            Port::Range(lo, hi)
        }
    }));
    named
}

/// A peer's selector, namespaceSelector, nets and notNets; None if the peer is invalid.
fn peer_fields(peer: &NetworkPolicyPeer, path: &str, p: &mut Problems) -> Option<EntityRule> {
    let selectors = peer.pod_selector.is_some() || peer.namespace_selector.is_some();
    if let Some(block) = &peer.ip_block {
        if selectors {
            p.add(
                path,
                "ipBlock cannot be combined with podSelector or namespaceSelector in one peer (list them as separate peers)",
            );
            return None;
        }
        return ip_block(block, &format!("{path}.ipBlock"), p);
    }
    if !selectors {
        p.add(
            path,
            "empty peer: set podSelector, namespaceSelector or ipBlock (to allow every peer, leave the list out)",
        );
        return None;
    }
    let before = p.0.len();
    let selector = calico_selector(
        peer.pod_selector.as_ref(),
        SelectorKind::Pod,
        &format!("{path}.podSelector"),
        p,
    );
    let namespace_selector = calico_selector(
        peer.namespace_selector.as_ref(),
        SelectorKind::Namespace,
        &format!("{path}.namespaceSelector"),
        p,
    );
    (p.0.len() == before).then(|| EntityRule {
        selector,
        namespace_selector,
        ..EntityRule::default()
    })
}

fn ip_block(block: &IpBlock, path: &str, p: &mut Problems) -> Option<EntityRule> {
    let cidr = match Cidr::parse(&block.cidr) {
        Ok(c) => c.network(),
        Err(e) => {
            p.add(format!("{path}.cidr"), e);
            return None;
        }
    };
    let mut not_nets = Vec::new();
    let mut ok = true;
    for (i, ex) in block.except.iter().flatten().enumerate() {
        let ep = format!("{path}.except[{i}]");
        match Cidr::parse(ex) {
            Err(e) => {
                p.add(ep, e);
                ok = false;
            }
            Ok(c) => {
                let c = c.network();
                if c.is_ipv4() != cidr.is_ipv4()
                    || c.prefix() <= cidr.prefix()
                    || !cidr.contains(c.addr())
                {
                    p.add(ep, format!("{ex:?} must be a strict subset of cidr {cidr}"));
                    ok = false;
                } else {
                    not_nets.push(c.to_string());
                }
            }
        }
    }
    ok.then(|| EntityRule {
        nets: vec![cidr.to_string()],
        not_nets,
        ..EntityRule::default()
    })
}

/// A Kubernetes label selector in Calico's syntax. An absent pod selector is the orchestrator
/// term alone; an absent namespace selector is "" (the policy's namespace), an empty one
/// `all()`.
fn calico_selector(
    s: Option<&LabelSelector>,
    kind: SelectorKind,
    path: &str,
    p: &mut Problems,
) -> String {
    let mut terms = Vec::new();
    if kind == SelectorKind::Pod {
        terms.push(ORCHESTRATOR_SELECTOR.to_string());
    }
    let Some(s) = s else {
        return terms.join(" && ");
    };
    if kind == SelectorKind::Namespace && s.is_empty() {
        return "all()".to_string();
    }
    let before = p.0.len();
    for (k, v) in s.match_labels.iter().flatten() {
        let lp = format!("{path}.matchLabels[{k:?}]");
        if let Err(e) = qualified_name(k) {
            p.add(&lp, format!("label key {k:?} is invalid: {e}"));
        }
        if let Err(e) = label_value(v) {
            p.add(&lp, format!("label value {v:?} is invalid: {e}"));
        }
        terms.push(format!("{k} == '{v}'"));
    }
    for (i, e) in s.match_expressions.iter().flatten().enumerate() {
        let ep = format!("{path}.matchExpressions[{i}]");
        if let Err(err) = qualified_name(&e.key) {
            p.add(
                format!("{ep}.key"),
                format!("label key {:?} is invalid: {err}", e.key),
            );
        }
        let values = e.values.as_deref().unwrap_or_default();
        for (j, v) in values.iter().enumerate() {
            if let Err(err) = label_value(v) {
                p.add(
                    format!("{ep}.values[{j}]"),
                    format!("label value {v:?} is invalid: {err}"),
                );
            }
        }
        let list = || {
            values
                .iter()
                .map(|v| format!("'{v}'"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let key = &e.key;
        match e.operator.as_str() {
            op @ ("In" | "NotIn") => {
                if values.is_empty() {
                    p.add(
                        format!("{ep}.values"),
                        format!("must list at least one value for operator {op}"),
                    );
                }
                let not = if op == "NotIn" { " not" } else { "" };
                terms.push(format!("{key}{not} in {{ {} }}", list()));
            }
            op @ ("Exists" | "DoesNotExist") => {
                if !values.is_empty() {
                    p.add(
                        format!("{ep}.values"),
                        format!("must be empty for operator {op}"),
                    );
                }
                let not = if op == "DoesNotExist" { "! " } else { "" };
                terms.push(format!("{not}has({key})"));
            }
            other => {
                const OPS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];
                let hint = match OPS.iter().find(|o| o.eq_ignore_ascii_case(other)) {
                    Some(o) => format!(" (operators are case-sensitive: use {o:?})"),
                    None => " (use In, NotIn, Exists or DoesNotExist)".to_string(),
                };
                p.add(
                    format!("{ep}.operator"),
                    format!("{other:?} is not a label selector operator{hint}"),
                );
            }
        }
    }
    let joined = terms.join(" && ");
    // Valid Kubernetes keys and values always make a valid Calico selector; check anyway so
    // that nothing unparsable is ever produced.
    if p.0.len() == before
        && let Err(e) = margay_selector::Selector::parse(&joined)
    {
        p.add(
            path,
            format!("cannot be expressed as a Calico selector ({joined:?}: {e})"),
        );
    }
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simplify_ports_like_calico() {
        let p = |v: &[Port]| simplify_ports(v.to_vec());
        let named = Port::Named("foo".into());
        // One port number: unchanged, in input order.
        assert_eq!(
            p(&[Port::Single(80), named.clone()]),
            vec![Port::Single(80), named.clone()]
        );
        assert_eq!(
            p(&[
                Port::Single(82),
                Port::Single(80),
                Port::Single(81),
                named.clone(),
                Port::Single(9090)
            ]),
            vec![named.clone(), Port::Range(80, 82), Port::Single(9090)]
        );
        // Duplicates and overlaps merge; a lone range is re-emitted after named ports.
        assert_eq!(
            p(&[Port::Range(100, 200), named.clone()]),
            vec![named, Port::Range(100, 200)]
        );
        assert_eq!(
            p(&[Port::Single(80), Port::Single(80)]),
            vec![Port::Single(80)]
        );
        assert_eq!(
            p(&[Port::Range(1, 10), Port::Range(5, 20), Port::Single(21)]),
            vec![Port::Range(1, 21)]
        );
        assert_eq!(
            p(&[Port::Single(65535), Port::Range(65530, 65534)]),
            vec![Port::Range(65530, 65535)]
        );
    }
}
