//! Kubernetes pods as the plugin sees them (pure): the Pod and Namespace the API returned, and
//! what Calico's `cni.projectcalico.org/*` annotations on them ask of ADD. Everything is
//! checked here, before anything is allocated; every problem is a [`CniError`] naming the pod,
//! the annotation and its value.
//!
//! Sources (facts, not code): Calico's `cni-plugin/pkg/k8s/k8s.go` (which annotations, where
//! they are read, which feature flags they need) and its Pod → WorkloadEndpoint conversion,
//! which margay has in `margay_kdd::pod` and uses as is, so the labels, ports and names the
//! plugin writes are the ones the Kubernetes datastore derives from the same pod.

use std::collections::BTreeMap;
use std::net::IpAddr;

use margay_api::Resource;
use margay_api::WorkloadEndpoint;
use margay_api::endpoint::IpNat;
use margay_api::net::Cidr;
use serde_json::Value;

use crate::config::NetConf;
use crate::spec::{CniError, code};

/// IPv4 pools (names or CIDRs, a JSON list) for the pod; on the namespace, for its pods.
pub const ANNOTATION_IPV4_POOLS: &str = "cni.projectcalico.org/ipv4pools";
/// IPv6 pools, as [`ANNOTATION_IPV4_POOLS`].
pub const ANNOTATION_IPV6_POOLS: &str = "cni.projectcalico.org/ipv6pools";
/// The families to assign (`["IPv4"]`, `["IPv4","IPv6"]`); pod or namespace.
pub const ANNOTATION_IP_FAMILIES: &str = "cni.projectcalico.org/ipFamilies";
/// Addresses the pod asks IPAM for (at most one per family).
pub const ANNOTATION_IP_ADDRS: &str = "cni.projectcalico.org/ipAddrs";
/// Addresses the pod gets without IPAM (feature_control.ip_addrs_no_ipam).
pub const ANNOTATION_IP_ADDRS_NO_IPAM: &str = "cni.projectcalico.org/ipAddrsNoIpam";
/// External addresses NATed to the pod's (feature_control.floating_ips).
pub const ANNOTATION_FLOATING_IPS: &str = margay_kdd::pod::ANNOTATION_FLOATING_IPS;

/// The pod, as far as ADD needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.nodeName`: the node the pod is scheduled on.
    pub node_name: String,
    /// `spec.hostNetwork`: the pod shares the host's network; nothing to wire.
    pub host_network: bool,
    pub annotations: BTreeMap<String, String>,
    /// The WorkloadEndpoint the Kubernetes datastore derives from this pod (labels with
    /// Calico's, profiles, ports, service account, names); None for a host-network or
    /// unscheduled pod.
    pub endpoint: Option<WorkloadEndpoint>,
}

/// Which families a pod gets addresses of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Families {
    pub v4: bool,
    pub v6: bool,
}

/// Pools a pod is restricted to, and where that was said (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pools {
    pub pools: Vec<String>,
    pub origin: String,
}

/// How the pod's addresses are had, as its (and its namespace's) annotations say. Empty
/// (the default) when they say nothing: the network configuration decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPlan {
    pub v4_pools: Option<Pools>,
    pub v6_pools: Option<Pools>,
    /// `ipFamilies`: overrides the configuration's assign_ipv4/assign_ipv6.
    pub families: Option<Families>,
    /// `ipAddrs`: requested from IPAM, one per family at most.
    pub ips: Vec<IpAddr>,
    /// `ipAddrsNoIpam`: used as they are, IPAM not asked.
    pub no_ipam: Vec<IpAddr>,
    /// `floatingIPs`: NATed to the pod's address of their family.
    pub floating_ips: Vec<IpAddr>,
}

impl Pod {
    /// `namespace/name`, as messages name the pod.
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The pod from the API's JSON. `interface_prefix` is the one the datastore uses
    /// (FELIX_INTERFACEPREFIX), so the derived endpoint's interface is Felix's.
    pub fn from_api(obj: &Value, interface_prefix: &str) -> Result<Pod, CniError> {
        let text = |path: &str| {
            obj.pointer(path)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let namespace = text("/metadata/namespace");
        let name = text("/metadata/name");
        let label = format!("{namespace}/{name}");
        let annotations = annotations_of(obj).map_err(|e| {
            CniError::new(code::POD, format!("pod {label}: metadata.annotations: {e}"))
        })?;
        let host_network = obj
            .pointer("/spec/hostNetwork")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        // The conversion reports bad pod IPs, floatingIPs and allowedSourcePrefixes by field.
        let endpoint = match margay_kdd::pod::pod_to_workload_endpoint(obj, interface_prefix) {
            Ok(Some(Resource::WorkloadEndpoint(w))) => Some(w),
            Ok(_) => None,
            Err(e) => {
                return Err(CniError::new(
                    code::POD,
                    format!("pod {label} cannot be wired: {e}"),
                ));
            }
        };
        Ok(Pod {
            uid: text("/metadata/uid"),
            node_name: text("/spec/nodeName"),
            namespace,
            name,
            host_network,
            annotations,
            endpoint,
        })
    }

    /// Whether the namespace's annotations can matter: the built-in IPAM assigns, the pod asks
    /// for no fixed addresses, and it does not set all three of the keys a namespace may set.
    pub fn needs_namespace(&self, builtin_ipam: bool) -> bool {
        let set = |k: &str| self.annotations.get(k).is_some_and(|v| !v.is_empty());
        let fixed = set(ANNOTATION_IP_ADDRS) || set(ANNOTATION_IP_ADDRS_NO_IPAM);
        let all_own = [
            ANNOTATION_IPV4_POOLS,
            ANNOTATION_IPV6_POOLS,
            ANNOTATION_IP_FAMILIES,
        ]
        .iter()
        .all(|k| set(k));
        builtin_ipam && !fixed && !all_own
    }
}

/// `metadata.annotations` of an API object (strings only, as the API server keeps them).
pub fn annotations_of(obj: &Value) -> Result<BTreeMap<String, String>, String> {
    match obj.pointer("/metadata/annotations") {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(format!("{k:?} is {other}, not a string")),
            })
            .collect(),
        Some(other) => Err(format!("expected an object of strings, got {other}")),
    }
}

/// An annotation's problem, naming where it is and what it says.
fn bad(whose: &str, key: &str, value: &str, why: impl std::fmt::Display) -> CniError {
    CniError::new(
        code::POD,
        format!("{whose}: annotation {key}='{value}': {why}"),
    )
}

/// A JSON list of strings.
fn string_list(whose: &str, key: &str, value: &str) -> Result<Vec<String>, CniError> {
    serde_json::from_str::<Vec<String>>(value).map_err(|e| {
        bad(
            whose,
            key,
            value,
            format!("not a JSON list of strings ({e}); write it as [\"a\", \"b\"]"),
        )
    })
}

/// A JSON list of addresses, at most one per family (Calico's rule for ipAddrs and
/// ipAddrsNoIpam: CNI results carry one address of each family per interface).
fn address_list(whose: &str, key: &str, value: &str) -> Result<Vec<IpAddr>, CniError> {
    let items = string_list(whose, key, value)?;
    if items.is_empty() {
        return Err(bad(
            whose,
            key,
            value,
            "the list is empty; name an address or remove the annotation",
        ));
    }
    let mut out: Vec<IpAddr> = Vec::new();
    for item in &items {
        let ip: IpAddr = item.trim().parse().map_err(|_| {
            bad(
                whose,
                key,
                value,
                format!("{item:?} is not an IP address (write it without a prefix length)"),
            )
        })?;
        if out.iter().any(|o| o.is_ipv4() == ip.is_ipv4()) {
            return Err(bad(
                whose,
                key,
                value,
                format!(
                    "more than one IPv{} address; a pod gets at most one of each family",
                    if ip.is_ipv4() { 4 } else { 6 }
                ),
            ));
        }
        out.push(ip);
    }
    Ok(out)
}

/// A Kubernetes object name (DNS subdomain), which pool names are.
fn is_resource_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// A pools annotation: pool names or CIDRs of the right family. `[]` means no restriction.
fn pool_list(whose: &str, key: &str, value: &str, version: u8) -> Result<Option<Pools>, CniError> {
    let items = string_list(whose, key, value)?;
    for item in &items {
        if item.contains('/') {
            let cidr = Cidr::parse(item).map_err(|e| {
                bad(
                    whose,
                    key,
                    value,
                    format!("{item:?} is neither a pool name nor a CIDR: {e}"),
                )
            })?;
            if cidr.version() != version {
                return Err(bad(
                    whose,
                    key,
                    value,
                    format!(
                        "{item:?} is an IPv{} CIDR in the IPv{version} pools",
                        cidr.version()
                    ),
                ));
            }
        } else if !is_resource_name(item) {
            return Err(bad(
                whose,
                key,
                value,
                format!(
                    "{item:?} is neither a pool name (lower-case letters, digits, '-' and '.') nor a CIDR"
                ),
            ));
        }
    }
    Ok((!items.is_empty()).then(|| Pools {
        pools: items,
        origin: format!("{whose}'s annotation {key}='{value}'"),
    }))
}

fn families(whose: &str, value: &str) -> Result<Families, CniError> {
    let key = ANNOTATION_IP_FAMILIES;
    let mut f = Families {
        v4: false,
        v6: false,
    };
    for item in string_list(whose, key, value)? {
        match item.as_str() {
            "IPv4" => f.v4 = true,
            "IPv6" => f.v6 = true,
            other => {
                return Err(bad(
                    whose,
                    key,
                    value,
                    format!("{other:?} is not a family (use \"IPv4\" and/or \"IPv6\")"),
                ));
            }
        }
    }
    if !f.v4 && !f.v6 {
        return Err(bad(
            whose,
            key,
            value,
            "names no family, so the pod would get no address",
        ));
    }
    Ok(f)
}

/// What the annotations of `pod` (and of its namespace, `namespace`; the pod's win key by key)
/// ask of ADD, checked against the configuration. `builtin_ipam`: margay assigns the
/// addresses (Calico's `calico-ipam`); the pool, family and address annotations are Calico
/// IPAM's, so with another IPAM plugin the pools and families are ignored (as Calico does) and
/// ipAddrs/ipAddrsNoIpam are refused.
pub fn address_plan(
    pod: &Pod,
    namespace: &BTreeMap<String, String>,
    conf: &NetConf,
    builtin_ipam: bool,
) -> Result<AddressPlan, CniError> {
    let pod_whose = format!("pod {}", pod.label());
    let ns_whose = format!("namespace {}", pod.namespace);
    let get = |m: &BTreeMap<String, String>, k: &str| m.get(k).filter(|v| !v.is_empty()).cloned();
    // The pod's value, else the namespace's, with whose it is.
    let either = |k: &str| -> Option<(String, String)> {
        get(&pod.annotations, k)
            .map(|v| (pod_whose.clone(), v))
            .or_else(|| get(namespace, k).map(|v| (ns_whose.clone(), v)))
    };
    let mut plan = AddressPlan::default();
    let ip_addrs = get(&pod.annotations, ANNOTATION_IP_ADDRS);
    let no_ipam = get(&pod.annotations, ANNOTATION_IP_ADDRS_NO_IPAM);
    if let (Some(a), Some(_)) = (&ip_addrs, &no_ipam) {
        return Err(bad(
            &pod_whose,
            ANNOTATION_IP_ADDRS,
            a,
            format!("cannot be used together with {ANNOTATION_IP_ADDRS_NO_IPAM}; keep one of them"),
        ));
    }
    if let Some(v) = &ip_addrs {
        if !builtin_ipam {
            return Err(bad(
                &pod_whose,
                ANNOTATION_IP_ADDRS,
                v,
                format!(
                    "needs margay's IPAM (ipam.type margay-ipam or calico-ipam), not {:?}",
                    conf.ipam.ipam_type
                ),
            ));
        }
        plan.ips = address_list(&pod_whose, ANNOTATION_IP_ADDRS, v)?;
    }
    if let Some(v) = &no_ipam {
        if !builtin_ipam {
            return Err(bad(
                &pod_whose,
                ANNOTATION_IP_ADDRS_NO_IPAM,
                v,
                format!(
                    "needs margay's IPAM (ipam.type margay-ipam or calico-ipam), not {:?}",
                    conf.ipam.ipam_type
                ),
            ));
        }
        if !conf.feature_control.ip_addrs_no_ipam {
            return Err(bad(
                &pod_whose,
                ANNOTATION_IP_ADDRS_NO_IPAM,
                v,
                "the feature is not enabled: set feature_control.ip_addrs_no_ipam to true in the network configuration",
            ));
        }
        plan.no_ipam = address_list(&pod_whose, ANNOTATION_IP_ADDRS_NO_IPAM, v)?;
    }
    if builtin_ipam {
        if let Some((whose, v)) = either(ANNOTATION_IPV4_POOLS) {
            plan.v4_pools = pool_list(&whose, ANNOTATION_IPV4_POOLS, &v, 4)?;
        }
        if let Some((whose, v)) = either(ANNOTATION_IPV6_POOLS) {
            plan.v6_pools = pool_list(&whose, ANNOTATION_IPV6_POOLS, &v, 6)?;
        }
        if let Some((whose, v)) = either(ANNOTATION_IP_FAMILIES) {
            plan.families = Some(families(&whose, &v)?);
        }
    }
    if let Some(v) = get(&pod.annotations, ANNOTATION_FLOATING_IPS) {
        if !conf.feature_control.floating_ips {
            return Err(bad(
                &pod_whose,
                ANNOTATION_FLOATING_IPS,
                &v,
                "the feature is not enabled: set feature_control.floating_ips to true in the network configuration",
            ));
        }
        let items = string_list(&pod_whose, ANNOTATION_FLOATING_IPS, &v)?;
        for item in &items {
            let ip: IpAddr = item.trim().parse().map_err(|_| {
                bad(
                    &pod_whose,
                    ANNOTATION_FLOATING_IPS,
                    &v,
                    format!("{item:?} is not an IP address"),
                )
            })?;
            plan.floating_ips.push(ip);
        }
        // Each needs a pod address of its family to be NATed to; known now unless another
        // IPAM plugin assigns (then checked once its result is in).
        if let Some(f) = plan.assigned_families(conf, builtin_ipam)
            && let Some(ip) = plan
                .floating_ips
                .iter()
                .find(|ip| !(if ip.is_ipv4() { f.v4 } else { f.v6 }))
        {
            return Err(bad(
                &pod_whose,
                ANNOTATION_FLOATING_IPS,
                &v,
                format!(
                    "{ip} needs an IPv{} address on the pod to be NATed to, and the pod gets none",
                    if ip.is_ipv4() { 4 } else { 6 }
                ),
            ));
        }
    }
    Ok(plan)
}

impl AddressPlan {
    /// The families the pod will have addresses of, when known before IPAM runs.
    pub fn assigned_families(&self, conf: &NetConf, builtin_ipam: bool) -> Option<Families> {
        let of = |ips: &[IpAddr]| Families {
            v4: ips.iter().any(IpAddr::is_ipv4),
            v6: ips.iter().any(IpAddr::is_ipv6),
        };
        if !self.ips.is_empty() {
            return Some(of(&self.ips));
        }
        if !self.no_ipam.is_empty() {
            return Some(of(&self.no_ipam));
        }
        builtin_ipam.then(|| {
            self.families.unwrap_or(Families {
                v4: conf.ipam.v4(),
                v6: conf.ipam.v6(),
            })
        })
    }
}

/// The endpoint's ipNATs: each floating IP to the pod's address of its family.
pub fn ip_nats(pod: &Pod, floating: &[IpAddr], ips: &[IpAddr]) -> Result<Vec<IpNat>, CniError> {
    floating
        .iter()
        .map(|ext| {
            let internal = ips
                .iter()
                .find(|ip| ip.is_ipv4() == ext.is_ipv4())
                .ok_or_else(|| {
                    CniError::new(
                        code::POD,
                        format!(
                            "pod {}: annotation {ANNOTATION_FLOATING_IPS}: {ext} needs an IPv{} address on the pod to be NATed to, and the pod got none",
                            pod.label(),
                            if ext.is_ipv4() { 4 } else { 6 }
                        ),
                    )
                })?;
            Ok(IpNat {
                internal_ip: internal.to_string(),
                external_ip: ext.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod_with(annotations: Value) -> Pod {
        Pod::from_api(
            &json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web-0", "namespace": "shop", "uid": "u-1",
                             "labels": {"app": "web"}, "annotations": annotations},
                "spec": {"nodeName": "node-1", "serviceAccountName": "sa1",
                         "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 80}]}]}
            }),
            "cali",
        )
        .unwrap()
    }

    fn conf(extra: Value) -> NetConf {
        let mut base = json!({"cniVersion": "1.0.0", "name": "k8s-pod-network",
                              "ipam": {"type": "calico-ipam"}});
        if let (Value::Object(b), Value::Object(e)) = (&mut base, extra) {
            for (k, v) in e {
                b.insert(k, v);
            }
        }
        serde_json::from_value(base).unwrap()
    }

    fn ns(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_pod_gives_the_datastores_endpoint() {
        let p = pod_with(json!({}));
        assert_eq!(p.label(), "shop/web-0");
        assert_eq!((p.uid.as_str(), p.node_name.as_str()), ("u-1", "node-1"));
        assert!(!p.host_network);
        let w = p.endpoint.unwrap();
        assert_eq!(w.metadata.name, "node--1-k8s-web--0-eth0");
        assert_eq!(w.metadata.labels["app"], "web");
        assert_eq!(w.metadata.labels["projectcalico.org/serviceaccount"], "sa1");
        assert_eq!(w.spec.profiles, vec!["kns.shop", "ksa.shop.sa1"]);
        assert_eq!(w.spec.ports.len(), 1);
        assert!(w.spec.interface_name.starts_with("cali"));
        // Host-network pods have no endpoint.
        let h = Pod::from_api(
            &json!({"metadata": {"name": "h", "namespace": "n"},
                    "spec": {"nodeName": "node-1", "hostNetwork": true}}),
            "cali",
        )
        .unwrap();
        assert!(h.host_network && h.endpoint.is_none());
        // A broken annotation the conversion reads is named.
        let e = Pod::from_api(
            &json!({"metadata": {"name": "p", "namespace": "n",
                    "annotations": {"cni.projectcalico.org/allowedSourcePrefixes": "nope"}},
                    "spec": {"nodeName": "node-1"}}),
            "cali",
        )
        .unwrap_err();
        assert_eq!(e.code, code::POD);
        assert!(
            e.msg.contains("n/p") && e.msg.contains("allowedSourcePrefixes"),
            "{e}"
        );
        let e = Pod::from_api(
            &json!({"metadata": {"name": "p", "namespace": "n", "annotations": {"a": 1}}}),
            "cali",
        )
        .unwrap_err();
        assert!(e.msg.contains("annotations"), "{e}");
    }

    /// Every annotation, valid and invalid: the plan, or an error naming the annotation and
    /// the value.
    #[test]
    fn annotations_table() {
        let plain = conf(json!({}));
        let flags =
            conf(json!({"feature_control": {"floating_ips": true, "ip_addrs_no_ipam": true}}));
        let dual = conf(
            json!({"ipam": {"type": "calico-ipam", "assign_ipv6": "true"},
                               "feature_control": {"floating_ips": true}}),
        );
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let pools = |v: &[&str], origin: &str| Pools {
            pools: v.iter().map(|s| s.to_string()).collect(),
            origin: origin.to_string(),
        };
        type Case<'a> = (
            &'a str,
            Value,
            BTreeMap<String, String>,
            &'a NetConf,
            Result<AddressPlan, &'a [&'a str]>,
        );
        let cases: Vec<Case> = vec![
            (
                "nothing",
                json!({}),
                ns(&[]),
                &plain,
                Ok(AddressPlan::default()),
            ),
            (
                "empty values are absent",
                json!({ANNOTATION_IP_ADDRS: "", ANNOTATION_IPV4_POOLS: ""}),
                ns(&[]),
                &plain,
                Ok(AddressPlan::default()),
            ),
            (
                "v4 pools by name and CIDR",
                json!({ANNOTATION_IPV4_POOLS: "[\"pool-a\", \"10.1.0.0/16\"]"}),
                ns(&[]),
                &plain,
                Ok(AddressPlan {
                    v4_pools: Some(pools(
                        &["pool-a", "10.1.0.0/16"],
                        "pod shop/web-0's annotation cni.projectcalico.org/ipv4pools='[\"pool-a\", \"10.1.0.0/16\"]'",
                    )),
                    ..AddressPlan::default()
                }),
            ),
            (
                "namespace pools",
                json!({}),
                ns(&[(ANNOTATION_IPV6_POOLS, "[\"fd00::/64\"]")]),
                &plain,
                Ok(AddressPlan {
                    v6_pools: Some(pools(
                        &["fd00::/64"],
                        "namespace shop's annotation cni.projectcalico.org/ipv6pools='[\"fd00::/64\"]'",
                    )),
                    ..AddressPlan::default()
                }),
            ),
            (
                "the pod wins over the namespace",
                json!({ANNOTATION_IPV4_POOLS: "[\"mine\"]"}),
                ns(&[
                    (ANNOTATION_IPV4_POOLS, "[\"theirs\"]"),
                    (ANNOTATION_IP_FAMILIES, "[\"IPv6\"]"),
                ]),
                &plain,
                Ok(AddressPlan {
                    v4_pools: Some(pools(
                        &["mine"],
                        "pod shop/web-0's annotation cni.projectcalico.org/ipv4pools='[\"mine\"]'",
                    )),
                    families: Some(Families {
                        v4: false,
                        v6: true,
                    }),
                    ..AddressPlan::default()
                }),
            ),
            (
                "[] pools are no restriction",
                json!({ANNOTATION_IPV4_POOLS: "[]"}),
                ns(&[]),
                &plain,
                Ok(AddressPlan::default()),
            ),
            (
                "families",
                json!({ANNOTATION_IP_FAMILIES: "[\"IPv4\",\"IPv6\"]"}),
                ns(&[]),
                &plain,
                Ok(AddressPlan {
                    families: Some(Families { v4: true, v6: true }),
                    ..AddressPlan::default()
                }),
            ),
            (
                "ipAddrs",
                json!({ANNOTATION_IP_ADDRS: "[\"10.0.0.7\", \"fd00::7\"]"}),
                ns(&[]),
                &plain,
                Ok(AddressPlan {
                    ips: vec![ip("10.0.0.7"), ip("fd00::7")],
                    ..AddressPlan::default()
                }),
            ),
            (
                "ipAddrsNoIpam with the flag",
                json!({ANNOTATION_IP_ADDRS_NO_IPAM: "[\"192.0.2.9\"]"}),
                ns(&[]),
                &flags,
                Ok(AddressPlan {
                    no_ipam: vec![ip("192.0.2.9")],
                    ..AddressPlan::default()
                }),
            ),
            (
                "floatingIPs with the flag",
                json!({ANNOTATION_FLOATING_IPS: "[\"203.0.113.5\"]"}),
                ns(&[]),
                &flags,
                Ok(AddressPlan {
                    floating_ips: vec![ip("203.0.113.5")],
                    ..AddressPlan::default()
                }),
            ),
            (
                "v6 floating IP on a dual-stack pod",
                json!({ANNOTATION_FLOATING_IPS: "[\"203.0.113.5\", \"2001:db8::5\"]"}),
                ns(&[]),
                &dual,
                Ok(AddressPlan {
                    floating_ips: vec![ip("203.0.113.5"), ip("2001:db8::5")],
                    ..AddressPlan::default()
                }),
            ),
            // Errors: each message must contain these.
            (
                "pools not JSON",
                json!({ANNOTATION_IPV4_POOLS: "pool-a"}),
                ns(&[]),
                &plain,
                Err(&[
                    "pod shop/web-0",
                    ANNOTATION_IPV4_POOLS,
                    "'pool-a'",
                    "JSON list",
                ]),
            ),
            (
                "namespace pools not JSON",
                json!({}),
                ns(&[(ANNOTATION_IPV4_POOLS, "{")]),
                &plain,
                Err(&["namespace shop", ANNOTATION_IPV4_POOLS, "'{'"]),
            ),
            (
                "v6 CIDR in v4 pools",
                json!({ANNOTATION_IPV4_POOLS: "[\"fd00::/64\"]"}),
                ns(&[]),
                &plain,
                Err(&[ANNOTATION_IPV4_POOLS, "fd00::/64", "IPv6 CIDR"]),
            ),
            (
                "bad CIDR",
                json!({ANNOTATION_IPV4_POOLS: "[\"10.0.0.0/33\"]"}),
                ns(&[]),
                &plain,
                Err(&[ANNOTATION_IPV4_POOLS, "10.0.0.0/33", "CIDR"]),
            ),
            (
                "bad pool name",
                json!({ANNOTATION_IPV4_POOLS: "[\"Pool_A\"]"}),
                ns(&[]),
                &plain,
                Err(&[ANNOTATION_IPV4_POOLS, "Pool_A", "pool name"]),
            ),
            (
                "bad family",
                json!({ANNOTATION_IP_FAMILIES: "[\"IPv5\"]"}),
                ns(&[]),
                &plain,
                Err(&[ANNOTATION_IP_FAMILIES, "IPv5"]),
            ),
            (
                "no family",
                json!({ANNOTATION_IP_FAMILIES: "[]"}),
                ns(&[]),
                &plain,
                Err(&[ANNOTATION_IP_FAMILIES, "no family"]),
            ),
            (
                "two v4 ipAddrs",
                json!({ANNOTATION_IP_ADDRS: "[\"10.0.0.1\",\"10.0.0.2\"]"}),
                ns(&[]),
                &plain,
                Err(&[ANNOTATION_IP_ADDRS, "10.0.0.2", "more than one IPv4"]),
            ),
            (
                "ipAddrs with a prefix",
                json!({ANNOTATION_IP_ADDRS: "[\"10.0.0.1/32\"]"}),
                ns(&[]),
                &plain,
                Err(&[ANNOTATION_IP_ADDRS, "not an IP address"]),
            ),
            (
                "empty ipAddrs",
                json!({ANNOTATION_IP_ADDRS: "[]"}),
                ns(&[]),
                &plain,
                Err(&[ANNOTATION_IP_ADDRS, "empty"]),
            ),
            (
                "ipAddrs and ipAddrsNoIpam",
                json!({ANNOTATION_IP_ADDRS: "[\"10.0.0.1\"]",
                ANNOTATION_IP_ADDRS_NO_IPAM: "[\"10.0.0.1\"]"}),
                ns(&[]),
                &flags,
                Err(&[ANNOTATION_IP_ADDRS, ANNOTATION_IP_ADDRS_NO_IPAM, "together"]),
            ),
            (
                "ipAddrsNoIpam without the flag",
                json!({ANNOTATION_IP_ADDRS_NO_IPAM: "[\"10.0.0.1\"]"}),
                ns(&[]),
                &plain,
                Err(&[
                    ANNOTATION_IP_ADDRS_NO_IPAM,
                    "feature_control.ip_addrs_no_ipam",
                ]),
            ),
            (
                "floatingIPs without the flag",
                json!({ANNOTATION_FLOATING_IPS: "[\"203.0.113.5\"]"}),
                ns(&[]),
                &plain,
                Err(&[
                    ANNOTATION_FLOATING_IPS,
                    "203.0.113.5",
                    "feature_control.floating_ips",
                ]),
            ),
            (
                "floatingIPs not addresses",
                json!({ANNOTATION_FLOATING_IPS: "[\"example.com\"]"}),
                ns(&[]),
                &flags,
                Err(&[ANNOTATION_FLOATING_IPS, "example.com", "not an IP"]),
            ),
            (
                "v6 floating IP, v4-only pod",
                json!({ANNOTATION_FLOATING_IPS: "[\"2001:db8::5\"]"}),
                ns(&[]),
                &flags,
                Err(&[ANNOTATION_FLOATING_IPS, "2001:db8::5", "IPv6"]),
            ),
        ];
        for (name, ann, ns_ann, conf, want) in cases {
            let got = address_plan(&pod_with(ann), &ns_ann, conf, true);
            match (got, want) {
                (Ok(p), Ok(w)) => assert_eq!(p, w, "{name}"),
                (Err(e), Err(needles)) => {
                    assert_eq!(e.code, code::POD, "{name}: {e}");
                    for n in needles {
                        assert!(e.msg.contains(n), "{name}: {n:?} not in {e}");
                    }
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn other_ipam_plugins_ignore_pools_and_refuse_addresses() {
        let c = conf(json!({"ipam": {"type": "host-local"}}));
        let p = pod_with(
            json!({ANNOTATION_IPV4_POOLS: "[\"x\"]", ANNOTATION_IP_FAMILIES: "[\"IPv6\"]"}),
        );
        assert_eq!(
            address_plan(&p, &ns(&[]), &c, false).unwrap(),
            AddressPlan::default()
        );
        assert!(!p.needs_namespace(false));
        let p = pod_with(json!({ANNOTATION_IP_ADDRS: "[\"10.0.0.1\"]"}));
        let e = address_plan(&p, &ns(&[]), &c, false).unwrap_err();
        assert!(e.msg.contains("host-local"), "{e}");
    }

    #[test]
    fn the_namespace_is_read_only_when_it_can_matter() {
        assert!(pod_with(json!({})).needs_namespace(true));
        assert!(pod_with(json!({ANNOTATION_IPV4_POOLS: "[\"a\"]"})).needs_namespace(true));
        assert!(!pod_with(json!({ANNOTATION_IP_ADDRS: "[\"10.0.0.1\"]"})).needs_namespace(true));
        assert!(
            !pod_with(
                json!({ANNOTATION_IPV4_POOLS: "[\"a\"]", ANNOTATION_IPV6_POOLS: "[\"b\"]",
                             ANNOTATION_IP_FAMILIES: "[\"IPv4\"]"})
            )
            .needs_namespace(true)
        );
    }

    #[test]
    fn floating_ips_become_nats_to_the_pods_address_of_their_family() {
        let p = pod_with(json!({}));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let nats = ip_nats(
            &p,
            &[ip("203.0.113.5"), ip("2001:db8::5")],
            &[ip("10.0.0.7"), ip("fd00::7")],
        )
        .unwrap();
        assert_eq!(nats[0].internal_ip, "10.0.0.7");
        assert_eq!(nats[0].external_ip, "203.0.113.5");
        assert_eq!(nats[1].internal_ip, "fd00::7");
        let e = ip_nats(&p, &[ip("2001:db8::5")], &[ip("10.0.0.7")]).unwrap_err();
        assert!(e.msg.contains("IPv6"), "{e}");
    }
}
