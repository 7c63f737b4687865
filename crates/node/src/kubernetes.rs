//! What calico-node reads from and writes to the Kubernetes cluster it runs in, beyond the
//! datastore: kubeadm's and Rancher's ConfigMaps in kube-system (the default pools' CIDRs and
//! the cluster type), the Kubernetes Node (its InternalIPs), and the Node's
//! `NetworkUnavailable` condition.
//!
//! The decisions are pure ([`kubeadm_pod_subnets`], [`cluster_types`], [`internal_ips`],
//! [`network_condition`], [`condition_patch`], [`kubernetes_api_configured`]); [`KubeCluster`]
//! is the thin edge that makes the requests, each bounded by [`API_TIMEOUT`] as Calico's are.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use margay_api::net::Cidr;
use margay_datastore::kube::KubeBackend;
use margay_datastore::kube::api::{ApiError, KubeApi};
use margay_datastore::kube::route::{ApiResource, NODES};
use margay_datastore::{AnyBackend, DatastoreConfig, DatastoreType};
use serde_json::{Value, json};

/// kubeadm's ClusterConfiguration (its `podSubnet` is the cluster's pod CIDR).
pub const KUBEADM_CONFIG: &str = "kubeadm-config";
/// Rancher's cluster state; its presence marks a Rancher cluster.
pub const RANCHER_STATE: &str = "full-cluster-state";
pub const KUBE_SYSTEM: &str = "kube-system";
/// Calico's client timeout for these reads: kube-proxy may not be up yet, and a start-up that
/// waits 30 s for nothing helps nobody.
pub const API_TIMEOUT: Duration = Duration::from_secs(2);
/// How long clearing the condition is retried (Calico's).
pub const CLEAR_RETRY: Duration = Duration::from_secs(30);

const CONFIGMAPS: ApiResource = ApiResource {
    group: "",
    version: "v1",
    plural: "configmaps",
    kind: "ConfigMap",
    namespaced: true,
};

/// The Kubernetes node this node is: CALICO_K8S_NODE_REF when set, else the node name.
pub fn k8s_node_name<'a>(node_name: &'a str, node_ref: Option<&'a str>) -> &'a str {
    node_ref.filter(|r| !r.is_empty()).unwrap_or(node_name)
}

/// Where a pod's service-account token is (client-go's in-cluster configuration needs it).
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// Whether a Kubernetes API is there to read, as Calico decides it: always on the Kubernetes
/// datastore; with etcd, when KUBECONFIG is set or the process runs in a pod (the in-cluster
/// service variables and a service-account token, `token_exists`). Without either calico-node
/// runs outside Kubernetes and reads nothing from it. margay's embedded store (`local`) is a
/// single machine's and never reads a cluster, whatever the environment says.
pub fn kubernetes_api_configured(
    ds: &DatastoreConfig,
    get: &dyn Fn(&str) -> Option<String>,
    token_exists: &dyn Fn() -> bool,
) -> bool {
    let set = |k: &str| get(k).is_some_and(|v| !v.trim().is_empty());
    match ds.datastore_type {
        DatastoreType::Kubernetes => true,
        DatastoreType::Local => false,
        DatastoreType::Etcd => {
            !ds.kube.kubeconfig.is_empty()
                || ds.kube.kubeconfig_inline.is_some()
                || (set("KUBERNETES_SERVICE_HOST")
                    && set("KUBERNETES_SERVICE_PORT")
                    && token_exists())
        }
    }
}

/// [`kubernetes_api_configured`] for this process.
pub fn kubernetes_api_configured_here(
    ds: &DatastoreConfig,
    get: &dyn Fn(&str) -> Option<String>,
) -> bool {
    kubernetes_api_configured(ds, get, &|| {
        std::path::Path::new(SERVICE_ACCOUNT_TOKEN).exists()
    })
}

/// The pod CIDRs of a kubeadm cluster, from the `data` of its `kubeadm-config` ConfigMap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodSubnets {
    pub v4: Option<Cidr>,
    pub v6: Option<Cidr>,
}

/// Calico's reading of kubeadm's `podSubnet`: the first value holding `podSubnet: <rest of the
/// line>` (values in key order: Go visits a map in random order, margay in a fixed one), split
/// on `,`; the first IPv4 and the first IPv6 CIDR win, and the first item that is not a CIDR
/// ends the list. Items are trimmed (Calico would stop at `a, b`'s second item). CIDRs are
/// returned as networks (host bits cleared), as Calico's pool creation makes them.
pub fn kubeadm_pod_subnets(data: &BTreeMap<String, String>) -> PodSubnets {
    let mut out = PodSubnets::default();
    let Ok(re) = regex::Regex::new(r"podSubnet: (.*)") else {
        return out;
    };
    let Some(line) = data
        .values()
        .find_map(|v| re.captures(v).and_then(|c| c.get(1)))
    else {
        return out;
    };
    for item in line.as_str().split(',') {
        let Ok(cidr) = Cidr::parse(item.trim()) else {
            break;
        };
        let slot = if cidr.is_ipv4() {
            &mut out.v4
        } else {
            &mut out.v6
        };
        if slot.is_none() {
            *slot = Some(cidr.network());
        }
        if out.v4.is_some() && out.v6.is_some() {
            break;
        }
    }
    out
}

/// The cluster types start-up records in ClusterInformation: CLUSTER_TYPE's, then `kubeadm`
/// and `rancher` when their ConfigMaps exist, then `kdd` on the Kubernetes datastore (Calico's
/// order; Calico adds the OS off Linux, and margay runs on Linux only). Empty items and
/// repeats are dropped.
pub fn cluster_types(env: &str, kubeadm: bool, rancher: bool, kdd: bool) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let extra = [("kubeadm", kubeadm), ("rancher", rancher), ("kdd", kdd)];
    let wanted = env
        .split(',')
        .map(str::trim)
        .chain(extra.iter().filter(|(_, on)| *on).map(|(t, _)| *t));
    for t in wanted {
        if !t.is_empty() && !out.iter().any(|o| o == t) {
            out.push(t.to_string());
        }
    }
    out
}

/// The string values of a ConfigMap's `data`.
pub fn configmap_data(cm: &Value) -> BTreeMap<String, String> {
    cm.get("data")
        .and_then(Value::as_object)
        .map(|d| {
            d.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// A Kubernetes Node's InternalIP addresses, in the order the kubelet lists them (addresses
/// that do not parse are skipped, as Calico's family check skips them).
pub fn internal_ips(node: &Value) -> Vec<IpAddr> {
    node.pointer("/status/addresses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|a| a.get("type").and_then(Value::as_str) == Some("InternalIP"))
        .filter_map(|a| a.get("address").and_then(Value::as_str))
        .filter_map(|a| a.trim().parse().ok())
        .collect()
}

/// What start-up learned from the cluster (all empty when no Kubernetes API is configured).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    /// A Kubernetes API was configured and read; the fields below come from it.
    pub kubernetes: bool,
    /// `data` of kube-system/kubeadm-config: None when it does not exist or may not be read.
    pub kubeadm_config: Option<BTreeMap<String, String>>,
    /// kube-system/full-cluster-state exists (and may be read).
    pub rancher_state: bool,
    /// The Kubernetes Node's InternalIPs.
    pub internal_ips: Vec<IpAddr>,
}

/// The NetworkUnavailable condition Calico writes: False/CalicoIsUp once networking is up,
/// True/CalicoIsDown when it shuts down; both times are `now`, as Calico sets them.
pub fn network_condition(unavailable: bool, now: &str) -> Value {
    let (status, reason, message) = if unavailable {
        (
            "True",
            "CalicoIsDown",
            "Calico is shutting down on this node",
        )
    } else {
        ("False", "CalicoIsUp", "Calico is running on this node")
    };
    json!({
        "type": "NetworkUnavailable",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    })
}

/// A JSON merge patch of `nodes/<n>/status` that sets `condition` and keeps every other
/// condition of `node` as read, conditional on the resourceVersion read. (A merge patch
/// replaces lists whole, so the list is written complete; the precondition makes sure no
/// concurrent change of another condition is lost. Calico sends a strategic merge patch
/// instead, which the datastore's API layer does not offer.)
pub fn condition_patch(node: &Value, condition: &Value) -> Value {
    let kind = condition.get("type").cloned().unwrap_or(Value::Null);
    let mut conditions: Vec<Value> = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    match conditions.iter_mut().find(|c| c.get("type") == Some(&kind)) {
        Some(c) => *c = condition.clone(),
        None => conditions.push(condition.clone()),
    }
    let mut patch = json!({"status": {"conditions": conditions}});
    if let Some(rv) = node.pointer("/metadata/resourceVersion") {
        patch["metadata"] = json!({"resourceVersion": rv});
    }
    patch
}

/// A failed request to the Kubernetes API, with what was asked and what to check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KubeError(pub String);

/// The Kubernetes API, for the reads and writes above.
#[derive(Clone)]
pub struct KubeCluster {
    api: KubeApi,
}

impl KubeCluster {
    pub fn new(api: KubeApi) -> Self {
        KubeCluster { api }
    }

    /// The API when one is configured ([`kubernetes_api_configured`]): the datastore's own
    /// connection on the Kubernetes datastore, else one made from KUBECONFIG or the pod's
    /// service account. None when there is none to use.
    pub async fn connect(
        ds: &DatastoreConfig,
        backend: Option<&AnyBackend>,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<KubeCluster>, KubeError> {
        if let Some(AnyBackend::Kube(k)) = backend {
            return Ok(Some(KubeCluster::new(k.api().clone())));
        }
        if !kubernetes_api_configured_here(ds, get) {
            return Ok(None);
        }
        let backend = KubeBackend::connect(&ds.kube).await.map_err(|e| {
            KubeError(format!(
                "cannot connect to the Kubernetes API: {e} (KUBECONFIG, or the pod's service account, says where it is)"
            ))
        })?;
        Ok(Some(KubeCluster::new(backend.api().clone())))
    }

    async fn get(
        &self,
        res: &ApiResource,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, ApiError> {
        match tokio::time::timeout(API_TIMEOUT, self.api.get(res, ns, name)).await {
            Ok(r) => r,
            Err(_) => Err(ApiError::Unavailable(format!(
                "no answer within {} s",
                API_TIMEOUT.as_secs()
            ))),
        }
    }

    /// A kube-system ConfigMap's data; None when it does not exist or may not be read (both
    /// mean "not this kind of cluster" to Calico). Any other failure is an error.
    pub async fn optional_configmap(
        &self,
        name: &str,
        what: &str,
    ) -> Result<Option<BTreeMap<String, String>>, KubeError> {
        match self.get(&CONFIGMAPS, Some(KUBE_SYSTEM), name).await {
            Ok(Some(cm)) => Ok(Some(configmap_data(&cm))),
            Ok(None) => Ok(None),
            Err(ApiError::Denied(m)) => {
                tracing::info!(configmap = name, reason = %m, "may not read ConfigMap {KUBE_SYSTEM}/{name}; assuming this is not {what}");
                Ok(None)
            }
            Err(e) => Err(KubeError(format!(
                "cannot read ConfigMap {KUBE_SYSTEM}/{name} (to learn whether this is {what}): {e}; check that the Kubernetes API server is reachable from this node"
            ))),
        }
    }

    /// The Kubernetes Node `name`; None when there is no such Node.
    pub async fn node(&self, name: &str) -> Result<Option<Value>, KubeError> {
        self.get(&NODES, None, name).await.map_err(|e| {
            KubeError(format!(
                "cannot read the Kubernetes Node {name:?}: {e}; check that the Kubernetes API server is reachable from this node"
            ))
        })
    }

    /// Sets this node's NetworkUnavailable condition (read, then patch `nodes/<n>/status`
    /// conditional on what was read), retrying every failure for `retry_for`.
    pub async fn set_network_unavailable(
        &self,
        node: &str,
        unavailable: bool,
        retry_for: Duration,
    ) -> Result<(), KubeError> {
        let deadline = tokio::time::Instant::now() + retry_for;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let last = match self.try_set(node, unavailable).await {
                Ok(()) => {
                    tracing::info!(
                        node,
                        unavailable,
                        attempt,
                        "set the Node's NetworkUnavailable condition"
                    );
                    return Ok(());
                }
                Err(e) => e,
            };
            let pause = Duration::from_millis(200 * u64::from(attempt.min(5)));
            if tokio::time::Instant::now() + pause >= deadline {
                return Err(KubeError(format!(
                    "cannot set NetworkUnavailable={} on the Kubernetes Node {node:?} within {} s: {last}",
                    if unavailable { "True" } else { "False" },
                    retry_for.as_secs()
                )));
            }
            tracing::warn!(node, attempt, error = %last, "failed to set NetworkUnavailable; will retry");
            tokio::time::sleep(pause).await;
        }
    }

    async fn try_set(&self, node: &str, unavailable: bool) -> Result<(), String> {
        let current = match self.get(&NODES, None, node).await {
            Ok(Some(n)) => n,
            Ok(None) => {
                return Err(format!(
                    "there is no Kubernetes Node {node:?} (check NODENAME / CALICO_K8S_NODE_REF)"
                ));
            }
            Err(e) => return Err(e.to_string()),
        };
        let cond = network_condition(unavailable, &margay_datastore::util::now_rfc3339());
        let patch = condition_patch(&current, &cond);
        let write = self
            .api
            .merge_patch(&NODES, None, node, Some("status"), &patch);
        match tokio::time::timeout(API_TIMEOUT, write).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(ApiError::Conflict(_))) => Err("the Node changed meanwhile".into()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {} s", API_TIMEOUT.as_secs())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn subnets(pairs: &[(&str, &str)]) -> (String, String) {
        let s = kubeadm_pod_subnets(&data(pairs));
        let show = |c: Option<Cidr>| c.map(|c| c.to_string()).unwrap_or_default();
        (show(s.v4), show(s.v6))
    }

    const CLUSTER_CONFIGURATION: &str = "apiServer:\n  timeoutForControlPlane: 4m0s\napiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\nnetworking:\n  dnsDomain: cluster.local\n  podSubnet: 10.244.0.0/16,fd00:10::/56\n  serviceSubnet: 10.96.0.0/12\n";

    /// Calico's table (startup_test.go) plus the cases margay decides.
    #[test]
    #[allow(clippy::type_complexity)] // a table of (name, data, v4, v6)
    fn kubeadm_pod_subnet_table() {
        let cases: &[(&str, &[(&str, &str)], &str, &str)] = &[
            (
                "v4 only",
                &[("ClusterConfiguration", "podSubnet: 192.168.0.0/16")],
                "192.168.0.0/16",
                "",
            ),
            (
                "two v4: the first",
                &[(
                    "ClusterConfiguration",
                    "podSubnet: 192.168.0.0/16,10.10.0.0/16",
                )],
                "192.168.0.0/16",
                "",
            ),
            (
                "v6 only",
                &[(
                    "ClusterConfiguration",
                    "podSubnet: fdff:ffff:ffff:ffff:ffff::/80",
                )],
                "",
                "fdff:ffff:ffff:ffff:ffff::/80",
            ),
            (
                "two v6: the first",
                &[(
                    "ClusterConfiguration",
                    "podSubnet: fdff:ffff:ffff:ffff:ffff::/80,fdff:ffff:ffff:ffff:fffe::/80",
                )],
                "",
                "fdff:ffff:ffff:ffff:ffff::/80",
            ),
            (
                "dual stack",
                &[(
                    "ClusterConfiguration",
                    "podSubnet: 192.168.0.0/16,fdff:ffff:ffff:ffff:ffff::/80",
                )],
                "192.168.0.0/16",
                "fdff:ffff:ffff:ffff:ffff::/80",
            ),
            (
                "dual stack, v6 first",
                &[("ClusterConfiguration", "podSubnet: fd00::/48,10.1.0.0/16")],
                "10.1.0.0/16",
                "fd00::/48",
            ),
            (
                "a whole ClusterConfiguration",
                &[("ClusterConfiguration", CLUSTER_CONFIGURATION)],
                "10.244.0.0/16",
                "fd00:10::/56",
            ),
            (
                "host bits are cleared",
                &[("ClusterConfiguration", "podSubnet: 10.244.3.7/16")],
                "10.244.0.0/16",
                "",
            ),
            (
                "spaces and CR around items",
                &[(
                    "ClusterConfiguration",
                    "podSubnet: 10.1.0.0/16 , fd00::/48\r",
                )],
                "10.1.0.0/16",
                "fd00::/48",
            ),
            (
                "a bad item ends the list",
                &[(
                    "ClusterConfiguration",
                    "podSubnet: 10.1.0.0/16,bogus,fd00::/48",
                )],
                "10.1.0.0/16",
                "",
            ),
            (
                "a bad first item: nothing",
                &[("ClusterConfiguration", "podSubnet: \"10.1.0.0/16\"")],
                "",
                "",
            ),
            (
                "no podSubnet",
                &[(
                    "ClusterConfiguration",
                    "networking:\n  serviceSubnet: 10.96.0.0/12",
                )],
                "",
                "",
            ),
            ("empty map", &[], "", ""),
            (
                "the first value (in key order) with a match",
                &[
                    ("A", "nothing here"),
                    ("B", "podSubnet: 10.2.0.0/16"),
                    ("C", "podSubnet: 10.3.0.0/16"),
                ],
                "10.2.0.0/16",
                "",
            ),
            (
                "a match with no CIDR ends the search",
                &[("A", "podSubnet: none"), ("B", "podSubnet: 10.3.0.0/16")],
                "",
                "",
            ),
            (
                "unanchored: a commented-out line counts too",
                &[("X", "  # podSubnet: 10.9.0.0/16")],
                "10.9.0.0/16",
                "",
            ),
        ];
        for (name, pairs, v4, v6) in cases {
            assert_eq!(subnets(pairs), (v4.to_string(), v6.to_string()), "{name}");
        }
    }

    #[test]
    fn cluster_type_table() {
        let cases: &[(&str, bool, bool, bool, &str)] = &[
            ("", false, false, false, ""),
            ("k8s", false, false, false, "k8s"),
            ("k8s,bgp", true, false, false, "k8s,bgp,kubeadm"),
            ("k8s", false, true, false, "k8s,rancher"),
            ("", true, true, false, "kubeadm,rancher"),
            ("k8s,bgp", true, true, true, "k8s,bgp,kubeadm,rancher,kdd"),
            ("", false, false, true, "kdd"),
            ("k8s,", false, false, true, "k8s,kdd"),
            ("k8s, kubeadm", true, false, false, "k8s,kubeadm"),
        ];
        for (env, kubeadm, rancher, kdd, want) in cases {
            assert_eq!(
                cluster_types(env, *kubeadm, *rancher, *kdd).join(","),
                *want,
                "{env:?} kubeadm={kubeadm} rancher={rancher} kdd={kdd}"
            );
        }
    }

    #[test]
    fn node_names() {
        assert_eq!(k8s_node_name("node-a", None), "node-a");
        assert_eq!(k8s_node_name("node-a", Some("")), "node-a");
        assert_eq!(k8s_node_name("node-a", Some("k8s-a")), "k8s-a");
    }

    #[test]
    fn api_configured_as_calico_decides() {
        let configured = |vars: &[(&str, &str)], token: bool| {
            let v: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let get = move |k: &str| v.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            let cfg = DatastoreConfig::from_lookup(&get).unwrap_or_else(|e| panic!("{e}"));
            kubernetes_api_configured(&cfg, &get, &|| token)
        };
        let etcd = [
            ("DATASTORE_TYPE", "etcdv3"),
            ("ETCD_ENDPOINTS", "http://127.0.0.1:1"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = etcd.to_vec();
            v.extend_from_slice(extra);
            v
        };
        let in_pod = [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
        ];
        assert!(configured(&[("DATASTORE_TYPE", "kubernetes")], false));
        assert!(!configured(&etcd, true));
        assert!(configured(
            &with(&[("KUBECONFIG", "/etc/kubeconfig")]),
            false
        ));
        assert!(configured(&with(&in_pod), true));
        assert!(!configured(&with(&in_pod), false), "no token: not in a pod");
        assert!(!configured(&with(&in_pod[..1]), true));
        // The embedded store never reads a cluster.
        assert!(!configured(
            &[
                ("DATASTORE_TYPE", "local"),
                ("KUBECONFIG", "/etc/kubeconfig"),
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                ("KUBERNETES_SERVICE_PORT", "443"),
            ],
            true
        ));
    }

    #[test]
    fn configmap_data_and_internal_ips() {
        let cm = json!({"data": {"a": "x", "b": 5}});
        assert_eq!(configmap_data(&cm), data(&[("a", "x")]));
        assert!(configmap_data(&json!({})).is_empty());
        let node = json!({"status": {"addresses": [
            {"type": "ExternalIP", "address": "203.0.113.9"},
            {"type": "InternalIP", "address": "fd00::5"},
            {"type": "InternalIP", "address": "not-an-ip"},
            {"type": "InternalIP", "address": "10.0.0.5"},
            {"type": "Hostname", "address": "n"},
        ]}});
        let ips: Vec<String> = internal_ips(&node).iter().map(|a| a.to_string()).collect();
        assert_eq!(ips, ["fd00::5", "10.0.0.5"]);
        assert!(internal_ips(&json!({"status": {}})).is_empty());
    }

    #[test]
    fn conditions_are_calicos_and_others_are_kept() {
        let up = network_condition(false, "2026-01-02T03:04:05Z");
        assert_eq!(
            up,
            json!({"type": "NetworkUnavailable", "status": "False", "reason": "CalicoIsUp",
                   "message": "Calico is running on this node",
                   "lastTransitionTime": "2026-01-02T03:04:05Z",
                   "lastHeartbeatTime": "2026-01-02T03:04:05Z"})
        );
        let down = network_condition(true, "t");
        assert_eq!(
            (&down["status"], &down["reason"], &down["message"]),
            (
                &json!("True"),
                &json!("CalicoIsDown"),
                &json!("Calico is shutting down on this node")
            )
        );
        let ready = json!({"type": "Ready", "status": "True", "reason": "KubeletReady"});
        let node = json!({
            "metadata": {"name": "n", "resourceVersion": "42"},
            "status": {"conditions": [
                ready.clone(),
                {"type": "NetworkUnavailable", "status": "True", "reason": "NoRouteCreated"},
            ]},
        });
        assert_eq!(
            condition_patch(&node, &up),
            json!({"metadata": {"resourceVersion": "42"},
                   "status": {"conditions": [ready.clone(), up.clone()]}})
        );
        // No condition yet: appended.
        let fresh = json!({"metadata": {"resourceVersion": "7"}, "status": {"conditions": [ready.clone()]}});
        assert_eq!(
            condition_patch(&fresh, &down)["status"]["conditions"],
            json!([ready, down])
        );
        assert_eq!(
            condition_patch(&json!({}), &up),
            json!({"status": {"conditions": [up]}})
        );
    }
}
