//! What the controllers need to know about a Kubernetes Pod (pure): its addresses as Calico's
//! WorkloadEndpoint conversion sees them (for the IPAM garbage collector) and its endpoint
//! labels and service account (for the etcd-mode workload endpoint controller).

use std::collections::BTreeMap;
use std::net::IpAddr;

use margay_api::Resource;
use margay_api::net::Cidr;
use serde_json::Value;

/// `<namespace>/<name>`: the key pods (and other namespaced objects) are stored under.
pub fn object_key(obj: &Value) -> Option<String> {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str)?;
    match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() => Some(format!("{ns}/{name}")),
        _ => Some(name.to_string()),
    }
}

pub fn pod_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// A pod, reduced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    /// `spec.nodeName` ("" while unscheduled).
    pub node: String,
    pub host_network: bool,
    /// `status.podIP` is set (Calico's pod controller acts only on such pods).
    pub has_pod_ip: bool,
    /// Both `status.podIP` and `status.podIPs` are set: the kubelet reported the addresses
    /// (until then the garbage collector takes any allocation of the pod as valid).
    pub ips_reported: bool,
    /// Phase Failed with reason Evicted: its addresses are free, whatever the status says.
    pub evicted: bool,
    /// The addresses of the pod's WorkloadEndpoint (none for finished pods); None when the
    /// pod does not convert (then its allocations count as valid, as in Calico).
    pub endpoint_ips: Option<Vec<IpAddr>>,
    /// The WorkloadEndpoint the pod makes, when it makes one: name, labels and service
    /// account (Calico's WorkloadEndpointData).
    pub endpoint: Option<EndpointData>,
}

/// The part of a WorkloadEndpoint the pod controller keeps in step with the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointData {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub service_account: String,
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

/// Reduces a pod as the API server sends it; None for an object without name or namespace.
pub fn pod_view(pod: &Value, interface_prefix: &str) -> Option<PodView> {
    let name = str_at(pod, "/metadata/name");
    let namespace = str_at(pod, "/metadata/namespace");
    if name.is_empty() || namespace.is_empty() {
        return None;
    }
    let pod_ip = str_at(pod, "/status/podIP");
    let pod_ips = pod
        .pointer("/status/podIPs")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let evicted =
        str_at(pod, "/status/phase") == "Failed" && str_at(pod, "/status/reason") == "Evicted";
    let (endpoint_ips, endpoint) =
        match margay_kdd::pod::pod_to_workload_endpoint(pod, interface_prefix) {
            Ok(Some(Resource::WorkloadEndpoint(w))) => {
                let ips = w
                    .spec
                    .ip_networks
                    .iter()
                    .filter_map(|n| Cidr::parse_cidr_or_ip(n).ok().map(|c| c.addr()))
                    .collect();
                let data = EndpointData {
                    name: w.metadata.name.clone(),
                    labels: w.metadata.labels.clone(),
                    service_account: w.spec.service_account_name.clone(),
                };
                (Some(ips), Some(data))
            }
            // Host-networked or unscheduled: no endpoint, so no Calico address is its.
            Ok(_) => (Some(Vec::new()), None),
            Err(e) => {
                tracing::debug!(pod = %pod_key(namespace, name), "pod does not convert: {e}");
                (None, None)
            }
        };
    Some(PodView {
        namespace: namespace.to_string(),
        name: name.to_string(),
        node: str_at(pod, "/spec/nodeName").to_string(),
        host_network: pod
            .pointer("/spec/hostNetwork")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        has_pod_ip: !pod_ip.is_empty(),
        ips_reported: !pod_ip.is_empty() && pod_ips,
        evicted,
        endpoint_ips,
        endpoint,
    })
}

/// Whether the pod still holds `ip`, allocated for it on Kubernetes node `knode` (None: the
/// node is gone). Calico's rules (`allocationIsValid`), in order: a pod that moved to another
/// node no longer holds it; one whose addresses are not reported yet holds it; an evicted one
/// does not; otherwise it holds it iff its endpoint lists it. A pod that does not convert
/// holds it (when in doubt, valid).
pub fn pod_holds(pod: &PodView, ip: IpAddr, knode: Option<&str>) -> bool {
    if let Some(k) = knode
        && !pod.node.is_empty()
        && pod.node != k
    {
        return false;
    }
    if !pod.ips_reported {
        return true;
    }
    if pod.evicted {
        return false;
    }
    match &pod.endpoint_ips {
        None => true,
        Some(ips) => ips.contains(&ip),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn pod(status: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop", "uid": "5b1b4a2e-1111-4222-8333-444455556666",
                         "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "serviceAccountName": "sa1", "containers": [{"name": "c"}]},
            "status": status,
        })
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn running_pod_holds_its_reported_addresses_only() {
        let v = pod_view(
            &pod(json!({"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}]})),
            "cali",
        )
        .unwrap();
        assert!(v.ips_reported && v.has_pod_ip);
        assert!(pod_holds(&v, ip("10.0.0.5"), Some("n1")));
        assert!(pod_holds(&v, ip("fd00::5"), Some("n1")));
        assert!(!pod_holds(&v, ip("10.0.0.6"), Some("n1")));
        // Moved to another node: the old node's allocation is not its.
        assert!(!pod_holds(&v, ip("10.0.0.5"), Some("n2")));
        // The node is gone: only the address counts.
        assert!(pod_holds(&v, ip("10.0.0.5"), None));
        let ep = v.endpoint.unwrap();
        assert_eq!(ep.name, "n1-k8s-web-eth0");
        assert_eq!(ep.labels["app"], "web");
        assert_eq!(ep.labels["projectcalico.org/namespace"], "shop");
        assert_eq!(ep.service_account, "sa1");
    }

    #[test]
    fn pod_without_reported_addresses_holds_anything() {
        for status in [
            json!({"phase": "Pending"}),
            json!({"phase": "Running", "podIP": "10.0.0.5"}),
        ] {
            let v = pod_view(&pod(status), "cali").unwrap();
            assert!(!v.ips_reported);
            assert!(pod_holds(&v, ip("10.9.9.9"), Some("n1")));
        }
    }

    #[test]
    fn finished_and_evicted_pods_hold_nothing() {
        let done = pod_view(
            &pod(
                json!({"phase": "Succeeded", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]}),
            ),
            "cali",
        )
        .unwrap();
        assert!(!pod_holds(&done, ip("10.0.0.5"), Some("n1")));
        let evicted = pod_view(
            &pod(json!({"phase": "Failed", "reason": "Evicted", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]})),
            "cali",
        )
        .unwrap();
        assert!(evicted.evicted);
        assert!(!pod_holds(&evicted, ip("10.0.0.5"), Some("n1")));
    }

    #[test]
    fn unconvertible_pod_holds_its_allocations() {
        let mut p =
            pod(json!({"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]}));
        p["metadata"]["annotations"] = json!({"cni.projectcalico.org/floatingIPs": "not json"});
        let v = pod_view(&p, "cali").unwrap();
        assert_eq!(v.endpoint_ips, None);
        assert!(pod_holds(&v, ip("10.1.1.1"), Some("n1")));
    }

    #[test]
    fn host_network_pod_holds_no_calico_address() {
        let mut p = pod(
            json!({"phase": "Running", "podIP": "192.168.0.1", "podIPs": [{"ip": "192.168.0.1"}]}),
        );
        p["spec"]["hostNetwork"] = json!(true);
        let v = pod_view(&p, "cali").unwrap();
        assert!(v.host_network && v.endpoint.is_none());
        assert!(!pod_holds(&v, ip("10.0.0.5"), Some("n1")));
    }

    #[test]
    fn keys() {
        assert_eq!(object_key(&pod(json!({}))).unwrap(), "shop/web");
        assert_eq!(
            object_key(&json!({"metadata": {"name": "n1"}})).unwrap(),
            "n1"
        );
        assert_eq!(object_key(&json!({})), None);
        assert!(pod_view(&json!({"metadata": {"name": "x"}}), "cali").is_none());
    }
}
