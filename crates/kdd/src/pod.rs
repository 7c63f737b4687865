//! WorkloadEndpoints derived from Pods, and the pod annotations Calico's CNI plugin writes
//! instead of storing WorkloadEndpoints.
//!
//! Sources: `lk8s/conversion/{conversion,workload_endpoint_default,constants}.go` (the
//! conversion), `lk8s/resources/workloadendpoint.go` (the CNI plugin's pod patches).

use std::collections::BTreeMap;

use margay_api::endpoint::{IpNat, QosControls, WorkloadEndpointPort, WorkloadEndpointSpec};
use margay_api::net::Cidr;
use margay_api::numorstring::{DSCP_NAMES, Dscp, Protocol};
use margay_api::{ObjectMeta, Resource, WorkloadEndpoint};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::json::{annotation_path, decode, decode_str, label, null_as_default, value_label};
use crate::meta::K8sMeta;
use crate::names::{k8s_interface_name, workload_endpoint_name};
use crate::quantity::clamped;
use crate::{KddError, Result};

/// The pod's first IP as a CIDR, written by the CNI plugin (`""` once DEL released it).
pub const ANNOTATION_POD_IP: &str = "cni.projectcalico.org/podIP";
/// All of the pod's IPs as comma-separated CIDRs, written by the CNI plugin.
pub const ANNOTATION_POD_IPS: &str = "cni.projectcalico.org/podIPs";
/// The pod's IPs as written by the Amazon VPC CNI plugin.
pub const ANNOTATION_AWS_POD_IPS: &str = "vpc.amazonaws.com/pod-ips";
/// The CNI container ID of the pod's current sandbox (kept after DEL).
pub const ANNOTATION_CONTAINER_ID: &str = "cni.projectcalico.org/containerID";
/// External IPs to NAT to the pod's IPs (JSON list).
pub const ANNOTATION_FLOATING_IPS: &str = "cni.projectcalico.org/floatingIPs";
/// Source prefixes the pod may send from besides its own IPs (JSON list of CIDRs).
pub const ANNOTATION_ALLOWED_SOURCE_PREFIXES: &str = "cni.projectcalico.org/allowedSourcePrefixes";
/// Multus' network status, copied onto the endpoint.
pub const ANNOTATION_NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";

/// Labels Calico adds to every pod's endpoint.
pub const LABEL_NAMESPACE: &str = "projectcalico.org/namespace";
pub const LABEL_ORCHESTRATOR: &str = "projectcalico.org/orchestrator";
pub const LABEL_SERVICE_ACCOUNT: &str = "projectcalico.org/serviceaccount";

/// Orchestrator and endpoint of every pod's endpoint.
pub const ORCHESTRATOR_K8S: &str = "k8s";
pub const ENDPOINT_ETH0: &str = "eth0";

/// Profile name prefixes: `kns.<namespace>` and `ksa.<namespace>.<service account>`.
pub const NAMESPACE_PROFILE_PREFIX: &str = "kns.";
pub const SERVICE_ACCOUNT_PROFILE_PREFIX: &str = "ksa.";

/// The profile of a service account: `ksa.<namespace>.<name>` (namespace `default` if empty).
pub fn service_account_profile_name(namespace: &str, service_account: &str) -> String {
    let namespace = if namespace.is_empty() {
        "default"
    } else {
        namespace
    };
    format!("{SERVICE_ACCOUNT_PROFILE_PREFIX}{namespace}.{service_account}")
}

/// The fields of a Pod the conversion reads (everything else is ignored, as Go's decoder does).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Pod {
    #[serde(deserialize_with = "null_as_default")]
    metadata: K8sMeta,
    #[serde(deserialize_with = "null_as_default")]
    spec: PodSpec,
    #[serde(deserialize_with = "null_as_default")]
    status: PodStatus,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PodSpec {
    #[serde(deserialize_with = "null_as_default")]
    node_name: String,
    #[serde(deserialize_with = "null_as_default")]
    host_network: bool,
    #[serde(deserialize_with = "null_as_default")]
    service_account_name: String,
    #[serde(deserialize_with = "null_as_default")]
    containers: Vec<Container>,
    #[serde(deserialize_with = "null_as_default")]
    init_containers: Vec<Container>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Container {
    #[serde(deserialize_with = "null_as_default")]
    ports: Vec<ContainerPort>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ContainerPort {
    #[serde(deserialize_with = "null_as_default")]
    name: String,
    #[serde(deserialize_with = "null_as_default")]
    container_port: i64,
    #[serde(deserialize_with = "null_as_default")]
    host_port: i64,
    #[serde(deserialize_with = "null_as_default")]
    protocol: String,
    #[serde(rename = "hostIP", deserialize_with = "null_as_default")]
    host_ip: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodStatus {
    #[serde(deserialize_with = "null_as_default")]
    phase: String,
    #[serde(rename = "podIP", deserialize_with = "null_as_default")]
    pod_ip: String,
    #[serde(rename = "podIPs", deserialize_with = "null_as_default")]
    pod_ips: Vec<PodIp>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodIp {
    #[serde(deserialize_with = "null_as_default")]
    ip: String,
}

/// Whether a pod no longer owns its IPs (Calico's IsFinished): phase Failed, Succeeded or
/// Completed, or being deleted with the podIP annotation (Calico's CNI) or
/// `vpc.amazonaws.com/pod-ips` (AWS's) present and empty, which the CNI plugin's DEL writes.
fn is_finished(pod: &Pod) -> bool {
    let a = &pod.metadata.annotations;
    let released = pod.metadata.deletion_timestamp.is_some()
        && (a.get(ANNOTATION_POD_IP).is_some_and(String::is_empty)
            || a.get(ANNOTATION_AWS_POD_IPS).is_some_and(String::is_empty));
    released
        || matches!(
            pod.status.phase.as_str(),
            "Failed" | "Succeeded" | "Completed"
        )
}

/// The WorkloadEndpoint Calico derives from a Pod (calico-kdd.md §4a); None for pods that
/// have none: host-networked pods and pods not yet scheduled (no `spec.nodeName`).
///
/// - name `<node>-k8s-<pod>-eth0` (dashes doubled), the pod's namespace;
/// - ipNetworks from the first non-empty of `status.podIPs`, `status.podIP`, the annotations
///   `cni.projectcalico.org/podIPs` (comma-separated), `cni.projectcalico.org/podIP` and
///   `vpc.amazonaws.com/pod-ips`; bare IPs become /32 or /128, CIDRs are masked; none for a
///   finished pod (the endpoint stays, without addresses, so watchers see no deletion);
/// - labels: the pod's plus `projectcalico.org/namespace`, `projectcalico.org/orchestrator:
///   k8s` and `projectcalico.org/serviceaccount` (when set and shorter than 63 characters);
/// - profiles `kns.<namespace>` and `ksa.<namespace>.<service account>` (when set);
/// - ports: named or host ports of containers, then init containers (TCP when unset, UDP,
///   SCTP; others skipped); ipNATs from `floatingIPs` (IPv4 externals to the pod's IPv4, IPv6
///   to IPv6); allowSpoofedSourcePrefixes from `allowedSourcePrefixes`; qosControls from the
///   bandwidth annotations, clamped as Calico clamps them (a bad value is left out, as Calico
///   only logs it); containerID from `cni.projectcalico.org/containerID`; interfaceName
///   [`k8s_interface_name`]`(interface_prefix, namespace, pod)`;
/// - uid, creationTimestamp and generateName of the pod, resourceVersion the pod's, and the
///   annotation `k8s.v1.cni.cncf.io/network-status` copied.
///
/// Errors (naming the pod and the field) for a malformed pod IP, `floatingIPs` or
/// `allowedSourcePrefixes`, as in Calico, and for a pod without name or namespace.
pub fn pod_to_workload_endpoint(pod: &Value, interface_prefix: &str) -> Result<Option<Resource>> {
    let object = value_label("Pod", pod);
    let pod: Pod = decode(pod, &object)?;
    if pod.spec.host_network || pod.spec.node_name.is_empty() {
        return Ok(None);
    }
    let meta = &pod.metadata;
    let object = label("Pod", &meta.namespace, &meta.name);
    for (field, value) in [
        ("metadata.name", &meta.name),
        ("metadata.namespace", &meta.namespace),
    ] {
        if value.is_empty() {
            return Err(KddError::new(&object, field, "required"));
        }
    }
    let name = workload_endpoint_name(
        &pod.spec.node_name,
        ORCHESTRATOR_K8S,
        &meta.name,
        ENDPOINT_ETH0,
    )
    .map_err(|e| {
        let field = match e.field.as_str() {
            "node" => "spec.nodeName",
            _ => "metadata.name",
        };
        KddError::new(&object, field, e.message)
    })?;

    let mut networks = pod_ips(&pod, &object)?;
    if is_finished(&pod) {
        networks.clear();
    }
    let annotations = &meta.annotations;

    let mut labels = meta.labels.clone().unwrap_or_default();
    labels.insert(LABEL_NAMESPACE.into(), meta.namespace.clone());
    labels.insert(LABEL_ORCHESTRATOR.into(), ORCHESTRATOR_K8S.into());
    let sa = &pod.spec.service_account_name;
    if !sa.is_empty() && sa.len() < 63 {
        labels.insert(LABEL_SERVICE_ACCOUNT.into(), sa.clone());
    }

    let mut profiles = vec![format!("{NAMESPACE_PROFILE_PREFIX}{}", meta.namespace)];
    if !sa.is_empty() {
        profiles.push(service_account_profile_name(&meta.namespace, sa));
    }

    let ip_nats = match annotations.get(ANNOTATION_FLOATING_IPS) {
        Some(text) if !networks.is_empty() => floating_ips(text, &networks, &object)?,
        _ => Vec::new(),
    };
    let allow_spoofed_source_prefixes = match annotations.get(ANNOTATION_ALLOWED_SOURCE_PREFIXES) {
        Some(text) if !text.is_empty() => source_prefixes(text, &object)?,
        _ => Vec::new(),
    };

    let mut ports = Vec::new();
    for c in pod.spec.containers.iter().chain(&pod.spec.init_containers) {
        for p in &c.ports {
            if p.container_port == 0 || (p.host_port == 0 && p.name.is_empty()) {
                continue;
            }
            // Kubernetes' default protocol is TCP; Calico skips protocols it has no name for.
            let protocol = match p.protocol.as_str() {
                "" | "TCP" => "TCP",
                "UDP" => "UDP",
                "SCTP" => "SCTP",
                _ => continue,
            };
            ports.push(WorkloadEndpointPort {
                name: p.name.clone(),
                protocol: Protocol::Name(protocol.to_string()),
                port: p.container_port,
                host_port: p.host_port,
                host_ip: p.host_ip.clone(),
            });
        }
    }

    let mut wep_annotations = BTreeMap::new();
    if let Some(v) = annotations.get(ANNOTATION_NETWORK_STATUS) {
        wep_annotations.insert(ANNOTATION_NETWORK_STATUS.to_string(), v.clone());
    }
    let metadata = ObjectMeta {
        name,
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        creation_timestamp: meta.creation_timestamp.clone(),
        generate_name: meta.generate_name.clone(),
        labels,
        annotations: wep_annotations,
        ..ObjectMeta::default()
    };
    let spec = WorkloadEndpointSpec {
        orchestrator: ORCHESTRATOR_K8S.into(),
        node: pod.spec.node_name.clone(),
        pod: meta.name.clone(),
        container_id: annotations
            .get(ANNOTATION_CONTAINER_ID)
            .cloned()
            .unwrap_or_default(),
        endpoint: ENDPOINT_ETH0.into(),
        interface_name: k8s_interface_name(interface_prefix, &meta.namespace, &meta.name),
        profiles,
        ip_networks: networks.iter().map(ToString::to_string).collect(),
        ports,
        ip_nats,
        service_account_name: sa.clone(),
        allow_spoofed_source_prefixes,
        qos_controls: qos_controls(annotations),
        ..WorkloadEndpointSpec::default()
    };
    Ok(Some(Resource::WorkloadEndpoint(WorkloadEndpoint::new(
        metadata, spec,
    ))))
}

/// The pod's networks from the first source that has any, with the field they came from.
fn pod_ips(pod: &Pod, object: &str) -> Result<Vec<Cidr>> {
    let a = &pod.metadata.annotations;
    let non_empty = |k: &str| a.get(k).filter(|v| !v.is_empty());
    let sources: Vec<(String, &str)> = if !pod.status.pod_ips.is_empty() {
        pod.status
            .pod_ips
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("status.podIPs[{i}].ip"), p.ip.as_str()))
            .collect()
    } else if !pod.status.pod_ip.is_empty() {
        vec![("status.podIP".to_string(), pod.status.pod_ip.as_str())]
    } else if let Some(v) = non_empty(ANNOTATION_POD_IPS) {
        v.split(',')
            .map(|ip| (annotation_path(ANNOTATION_POD_IPS), ip))
            .collect()
    } else if let Some(v) = non_empty(ANNOTATION_POD_IP) {
        vec![(annotation_path(ANNOTATION_POD_IP), v.as_str())]
    } else if let Some(v) = non_empty(ANNOTATION_AWS_POD_IPS) {
        v.split(',')
            .map(|ip| (annotation_path(ANNOTATION_AWS_POD_IPS), ip))
            .collect()
    } else {
        Vec::new()
    };
    sources
        .into_iter()
        .map(|(field, ip)| {
            Cidr::parse_cidr_or_ip(ip)
                .map(|c| c.network())
                .map_err(|e| KddError::new(object, field, e))
        })
        .collect()
}

/// `floatingIPs`: each external IP NATed to the pod's address of its family.
fn floating_ips(text: &str, networks: &[Cidr], object: &str) -> Result<Vec<IpNat>> {
    let field = annotation_path(ANNOTATION_FLOATING_IPS);
    let externals: Vec<String> = decode_str(text, object, &field)?;
    let (mut v4, mut v6) = (None, None);
    for n in networks {
        let (slot, full) = if n.is_ipv4() {
            (&mut v4, 32)
        } else {
            (&mut v6, 128)
        };
        if n.prefix() != full {
            return Err(KddError::new(
                object,
                &field,
                format!(
                    "the pod's IP {n} is not a single address (/{full}), so it cannot be a NAT target"
                ),
            ));
        }
        *slot = Some(n.addr());
    }
    Ok(externals
        .into_iter()
        .filter_map(|external| {
            // Calico tells the families apart by the colon alone.
            let internal = if external.contains(':') { v6 } else { v4 }?;
            Some(IpNat {
                internal_ip: internal.to_string(),
                external_ip: external,
            })
        })
        .collect())
}

/// `allowedSourcePrefixes`: CIDRs (a prefix length is required), masked.
fn source_prefixes(text: &str, object: &str) -> Result<Vec<String>> {
    let field = annotation_path(ANNOTATION_ALLOWED_SOURCE_PREFIXES);
    let prefixes: Vec<String> = decode_str(text, object, &field)?;
    prefixes
        .iter()
        .map(|p| {
            Cidr::parse(p)
                .map(|c| c.network().to_string())
                .map_err(|e| KddError::new(object, &field, e))
        })
        .collect()
}

/// QoS annotations: Kubernetes' bandwidth annotations, overridden by Calico's.
pub const ANNOTATION_K8S_INGRESS_BANDWIDTH: &str = "kubernetes.io/ingress-bandwidth";
pub const ANNOTATION_K8S_EGRESS_BANDWIDTH: &str = "kubernetes.io/egress-bandwidth";
/// Prefix of Calico's QoS annotations (`qos.projectcalico.org/ingressBandwidth`, …, `dscp`).
pub const QOS_ANNOTATION_PREFIX: &str = "qos.projectcalico.org/";

// Calico's clamp ranges (workload_endpoint_default.go).
const BANDWIDTH: (i64, i64) = (1_000, 1_000_000_000_000_000);
const BURST: (i64, i64) = (1_000, 34_359_738_360);
const DEFAULT_BURST: i64 = 4 << 30;
const PEAKRATE: (i64, i64) = (1_010, 1_010_000_000_000_000);
const MINBURST: (i64, i64) = (1_000, 100_000_000);
const PACKET_RATE: (i64, i64) = (1, 10_000);
const PACKET_BURST: (i64, i64) = (1, 10_000);
const DEFAULT_PACKET_BURST: i64 = 5;
const CONNECTIONS: (i64, i64) = (1, 4_294_967_295);

/// Calico's handleQoSControlsAnnotations: each value clamped to its range (0 when it is not a
/// quantity), then the dependent limits dropped when what they depend on is missing (burst
/// without bandwidth, peakrate not above bandwidth, minburst without peakrate, packet burst
/// without packet rate), then defaults (burst 4Gi with a bandwidth, packet burst 5 with a
/// packet rate). None when nothing is set.
fn qos_controls(a: &BTreeMap<String, String>) -> Option<QosControls> {
    let value = |key: &str, range: (i64, i64)| -> Option<i64> {
        a.get(key).map(|s| clamped(s, range.0, range.1).0)
    };
    let calico = |name: &str, range: (i64, i64)| -> i64 {
        value(&format!("{QOS_ANNOTATION_PREFIX}{name}"), range).unwrap_or(0)
    };
    let bandwidth = |k8s: &str, name: &str| -> i64 {
        value(&format!("{QOS_ANNOTATION_PREFIX}{name}"), BANDWIDTH)
            .or_else(|| value(k8s, BANDWIDTH))
            .unwrap_or(0)
    };
    let mut q = QosControls {
        ingress_bandwidth: bandwidth(ANNOTATION_K8S_INGRESS_BANDWIDTH, "ingressBandwidth"),
        egress_bandwidth: bandwidth(ANNOTATION_K8S_EGRESS_BANDWIDTH, "egressBandwidth"),
        ingress_burst: calico("ingressBurst", BURST),
        egress_burst: calico("egressBurst", BURST),
        ingress_peakrate: calico("ingressPeakrate", PEAKRATE),
        egress_peakrate: calico("egressPeakrate", PEAKRATE),
        ingress_minburst: calico("ingressMinburst", MINBURST),
        egress_minburst: calico("egressMinburst", MINBURST),
        ingress_packet_rate: calico("ingressPacketRate", PACKET_RATE),
        egress_packet_rate: calico("egressPacketRate", PACKET_RATE),
        ingress_packet_burst: calico("ingressPacketBurst", PACKET_BURST),
        egress_packet_burst: calico("egressPacketBurst", PACKET_BURST),
        ingress_max_connections: calico("ingressMaxConnections", CONNECTIONS),
        egress_max_connections: calico("egressMaxConnections", CONNECTIONS),
        dscp: None,
    };
    for (bw, burst, peak, minburst, rate, pburst) in [
        (
            q.ingress_bandwidth,
            &mut q.ingress_burst,
            &mut q.ingress_peakrate,
            &mut q.ingress_minburst,
            q.ingress_packet_rate,
            &mut q.ingress_packet_burst,
        ),
        (
            q.egress_bandwidth,
            &mut q.egress_burst,
            &mut q.egress_peakrate,
            &mut q.egress_minburst,
            q.egress_packet_rate,
            &mut q.egress_packet_burst,
        ),
    ] {
        if *burst != 0 && bw == 0 {
            *burst = 0;
        }
        if *peak != 0 && (bw == 0 || bw >= *peak) {
            *peak = 0;
        }
        if *minburst != 0 && *peak == 0 {
            *minburst = 0;
        }
        if *pburst != 0 && rate == 0 {
            *pburst = 0;
        }
        if bw != 0 && *burst == 0 {
            *burst = DEFAULT_BURST;
        }
        if rate != 0 && *pburst == 0 {
            *pburst = DEFAULT_PACKET_BURST;
        }
    }
    if let Some(s) = a.get(&format!("{QOS_ANNOTATION_PREFIX}dscp")) {
        q.dscp = dscp(s);
    }
    (q != QosControls::default()).then_some(q)
}

/// A DSCP annotation: a known name in any case (written in Calico's canonical upper case) or
/// a number 0–63; anything else is left out, as Calico only logs it.
fn dscp(s: &str) -> Option<Dscp> {
    if let Some((name, _)) = DSCP_NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(s)) {
        return Some(Dscp::Name((*name).to_string()));
    }
    s.parse::<u8>().ok().filter(|n| *n <= 63).map(Dscp::Number)
}

/// The merge-patch body Calico's CNI plugin applies to the pod (PATCH `pods/<name>/status`)
/// when it "creates" the endpoint in the Kubernetes datastore: the annotations podIP (the
/// first ipNetwork), podIPs (all, comma-separated) and containerID (when set), and the
/// endpoint's uid (the pod's) as a precondition when set, so a pod re-created under the same
/// name is not patched. No resourceVersion: the kubelet runs one ADD per pod at a time.
/// Without ipNetworks there is nothing to write (`{"metadata":{}}` plus the uid; just
/// `{"metadata":{}}` for a resource that is not a WorkloadEndpoint).
pub fn workload_endpoint_patch(wep: &Resource) -> Value {
    let (spec, meta) = match wep {
        Resource::WorkloadEndpoint(w) => (&w.spec, &w.metadata),
        // Only endpoints have addresses to write.
        _ => return json!({ "metadata": {} }),
    };
    let mut annotations = serde_json::Map::new();
    if let Some(first) = spec.ip_networks.first() {
        annotations.insert(ANNOTATION_POD_IP.into(), json!(first));
        annotations.insert(ANNOTATION_POD_IPS.into(), json!(spec.ip_networks.join(",")));
        if !spec.container_id.is_empty() {
            annotations.insert(ANNOTATION_CONTAINER_ID.into(), json!(spec.container_id));
        }
    }
    let mut metadata = serde_json::Map::new();
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }
    if !meta.uid.is_empty() {
        metadata.insert("uid".into(), json!(meta.uid));
    }
    json!({ "metadata": metadata })
}

/// The merge-patch body of the CNI plugin's DEL: podIP and podIPs set to `""` (the signal
/// that the pod no longer owns its addresses; containerID is kept so a repeated DEL can tell
/// which sandbox it sees), with the endpoint's resourceVersion (the pod's) and the pod's uid as
/// preconditions when not empty. Calico skips the patch when the pod's containerID annotation
/// names another container, and retries it on conflict.
pub fn workload_endpoint_release_patch(resource_version: &str, pod_uid: &str) -> Value {
    let mut metadata = serde_json::Map::new();
    metadata.insert(
        "annotations".into(),
        json!({ ANNOTATION_POD_IP: "", ANNOTATION_POD_IPS: "" }),
    );
    if !resource_version.is_empty() {
        metadata.insert("resourceVersion".into(), json!(resource_version));
    }
    if !pod_uid.is_empty() {
        metadata.insert("uid".into(), json!(pod_uid));
    }
    json!({ "metadata": metadata })
}
