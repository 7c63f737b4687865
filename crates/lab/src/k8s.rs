//! What the lab writes to the Kubernetes API in `--datastore kubernetes` mode, where it plays
//! the parts of a cluster that are not margay's: the installer (kubeadm's ConfigMap), the
//! service-account controller (each namespace's `default` ServiceAccount) and the kubelet
//! (the Node it registers, the pods it runs, their status, the CNI arguments it passes).
//! Pure: values in, values out.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::topology::{NamespaceSpec, PodSpec};

/// The image named in the lab's pod specs (nothing pulls it: the lab runs `margay lab serve`
/// in the pod's namespace itself).
pub const SERVE_IMAGE: &str = "margay.invalid/lab-serve:latest";
/// The service account every lab pod runs as (the namespace's default, as in Kubernetes).
pub const SERVICE_ACCOUNT: &str = "default";

/// The Kubernetes Node a kubelet registers: its name, the usual node labels and its
/// addresses (the lab's fabric address is the InternalIP). `ready` is the kubelet's Ready
/// condition, which stays False until a CNI network configuration is installed.
pub fn node(name: &str, internal_ip: &str, ready: bool) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": arch(),
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": arch(),
            },
        },
        "spec": {},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": internal_ip},
                {"type": "Hostname", "address": name},
            ],
            "conditions": [ready_condition(ready)],
            "nodeInfo": {
                "architecture": arch(),
                "operatingSystem": "linux",
                "kubeletVersion": "v1.32.0",
                "containerRuntimeVersion": "margay-lab://0",
            },
        },
    })
}

/// The merge patch (on `nodes/<n>/status`) a kubelet writes when the node's readiness changes.
pub fn node_ready_patch(ready: bool) -> Value {
    json!({"status": {"conditions": [ready_condition(ready)]}})
}

fn ready_condition(ready: bool) -> Value {
    if ready {
        json!({"type": "Ready", "status": "True", "reason": "KubeletReady",
               "message": "kubelet is posting ready status"})
    } else {
        json!({"type": "Ready", "status": "False", "reason": "KubeletNotReady",
               "message": "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"})
    }
}

/// Kubernetes' name for this machine's architecture.
fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// A Namespace with the topology's labels (the API server adds `kubernetes.io/metadata.name`).
pub fn namespace(ns: &NamespaceSpec) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": ns.name, "labels": ns.labels},
    })
}

/// The namespace's `default` ServiceAccount (kube-controller-manager makes it in a cluster).
pub fn service_account(namespace: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": SERVICE_ACCOUNT, "namespace": namespace},
    })
}

/// kubeadm's `kubeadm-config` ConfigMap in kube-system, whose ClusterConfiguration names the
/// cluster's pod CIDR (calico-node's start-up reads it for its default pool).
pub fn kubeadm_config(pod_cidr: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
        "data": {
            "ClusterConfiguration": format!(
                "apiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\nkubernetesVersion: v1.32.0\nnetworking:\n  dnsDomain: cluster.local\n  podSubnet: {pod_cidr}\n  serviceSubnet: 10.96.0.0/12\n"
            ),
        },
    })
}

/// The name of a served port, as Kubernetes' network-policy tests name them
/// (`serve-80-tcp`; at most 15 characters, as container port names must be).
pub fn port_name(port: u16, protocol: &str) -> String {
    format!("serve-{port}-{}", protocol.to_ascii_lowercase())
}

/// A pod scheduled on `node`: the topology's labels, the namespace's default service account,
/// one container whose named ports are what the pod serves (the source of named-port policy).
pub fn pod(spec: &PodSpec, node: &str) -> Value {
    let ports: Vec<Value> = spec
        .tcp
        .iter()
        .map(|p| (p, "TCP"))
        .chain(spec.udp.iter().map(|p| (p, "UDP")))
        .map(|(p, proto)| {
            json!({"name": port_name(*p, proto), "containerPort": p, "protocol": proto})
        })
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": spec.labels},
        "spec": {
            "nodeName": node,
            "serviceAccountName": SERVICE_ACCOUNT,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "serve",
                "image": SERVE_IMAGE,
                "command": ["margay", "lab", "serve"],
                "ports": ports,
            }],
        },
    })
}

/// The merge patch (on `pods/<n>/status`) a kubelet writes once the pod's sandbox is wired and
/// its container runs: phase Running, the address the CNI plugin returned, the node's, the
/// container ready. A dual-stack pod's IPv6 address (`pod_ip6`) is its second `podIPs` entry,
/// as a dual-stack kubelet reports it; Calico's endpoints take their networks from there.
pub fn pod_running_patch(
    pod_ip: &str,
    pod_ip6: Option<&str>,
    host_ip: &str,
    container_id: &str,
) -> Value {
    let pod_ips: Vec<Value> = std::iter::once(pod_ip)
        .chain(pod_ip6)
        .map(|ip| json!({"ip": ip}))
        .collect();
    let condition = |t: &str| json!({"type": t, "status": "True"});
    json!({"status": {
        "containerStatuses": [{
            "name": "serve",
            "image": SERVE_IMAGE,
            "imageID": "",
            "containerID": format!("margay-lab://{container_id}"),
            "ready": true,
            "started": true,
            "restartCount": 0,
            "state": {"running": {}},
        }],
        "phase": "Running",
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": pod_ips,
        "conditions": [
            condition("PodReadyToStartContainers"),
            condition("Initialized"),
            condition("Ready"),
            condition("ContainersReady"),
            condition("PodScheduled"),
        ],
    }})
}

/// CNI_ARGS as a kubelet passes them.
pub fn cni_args(namespace: &str, pod: &str, container_id: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={container_id}"
    )
}

/// `k=v,k2=v2` (as `kubectl label` takes them) → labels. Keys and values are checked the way
/// the API server would check them, so a mistake is reported before anything is built.
pub fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((k, v)) = item.split_once('=') else {
            return Err(format!("label {item:?}: write it as key=value"));
        };
        let (k, v) = (k.trim(), v.trim());
        label_key(k)?;
        label_value(k, v)?;
        if out.insert(k.to_string(), v.to_string()).is_some() {
            return Err(format!("label {k:?} is given twice"));
        }
    }
    Ok(out)
}

fn name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

fn label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    if prefix_ok && name_part(name) {
        Ok(())
    } else {
        Err(format!(
            "label key {k:?}: an optional DNS prefix and '/', then 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ))
    }
}

fn label_value(k: &str, v: &str) -> Result<(), String> {
    if v.is_empty() || name_part(v) {
        Ok(())
    } else {
        Err(format!(
            "label {k}={v:?}: a value is empty or 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PodSpec {
        PodSpec {
            name: "a".into(),
            namespace: "x".into(),
            node: "node1".into(),
            labels: BTreeMap::from([("pod".to_string(), "a".to_string())]),
            tcp: vec![80, 81],
            udp: vec![81],
        }
    }

    #[test]
    fn a_pod_is_scheduled_with_named_ports() {
        let p = pod(&spec(), "node1");
        assert_eq!(p["spec"]["nodeName"], "node1");
        assert_eq!(p["spec"]["serviceAccountName"], "default");
        assert_eq!(p["metadata"]["labels"]["pod"], "a");
        let ports = p["spec"]["containers"][0]["ports"].as_array().unwrap();
        let names: Vec<&str> = ports.iter().map(|p| p["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["serve-80-tcp", "serve-81-tcp", "serve-81-udp"]);
        assert_eq!(ports[2]["protocol"], "UDP");
        assert_eq!(ports[2]["containerPort"], 81);
        assert!(port_name(65535, "UDP").len() <= 15);
    }

    #[test]
    fn the_kubelet_reports_the_pod_and_node() {
        let s = pod_running_patch("10.244.1.2", None, "172.30.0.11", "c1");
        assert_eq!(s["status"]["containerStatuses"][0]["ready"], true);
        assert_eq!(s["status"]["phase"], "Running");
        assert_eq!(s["status"]["podIPs"], json!([{"ip": "10.244.1.2"}]));
        let s = pod_running_patch("10.244.1.2", Some("fd00::2"), "172.30.0.11", "c1");
        assert_eq!(
            s["status"]["podIPs"],
            json!([{"ip": "10.244.1.2"}, {"ip": "fd00::2"}])
        );
        assert_eq!(s["status"]["podIP"], "10.244.1.2");
        assert_eq!(s["status"]["hostIP"], "172.30.0.11");
        let n = node("node1", "172.30.0.11", false);
        assert_eq!(n["status"]["addresses"][0]["type"], "InternalIP");
        assert_eq!(n["status"]["addresses"][0]["address"], "172.30.0.11");
        assert_eq!(n["status"]["conditions"][0]["status"], "False");
        assert_eq!(
            node_ready_patch(true)["status"]["conditions"][0]["status"],
            "True"
        );
        assert_eq!(
            cni_args("x", "a", "c1"),
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=x;K8S_POD_NAME=a;K8S_POD_INFRA_CONTAINER_ID=c1"
        );
        assert!(
            kubeadm_config("10.244.0.0/16")["data"]["ClusterConfiguration"]
                .as_str()
                .unwrap()
                .contains("  podSubnet: 10.244.0.0/16\n")
        );
    }

    #[test]
    fn labels_parse_as_kubectl_label_takes_them() {
        assert_eq!(
            parse_labels("pod=d, app.kubernetes.io/name=web,empty=").unwrap(),
            BTreeMap::from([
                ("app.kubernetes.io/name".to_string(), "web".to_string()),
                ("empty".to_string(), String::new()),
                ("pod".to_string(), "d".to_string()),
            ])
        );
        assert!(parse_labels("").unwrap().is_empty());
        for bad in ["pod", "-a=b", "a=-b", "a=b,a=c", "Bad_/x=1", "a=b c"] {
            assert!(parse_labels(bad).is_err(), "{bad}");
        }
    }
}
