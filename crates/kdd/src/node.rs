//! Calico Nodes derived from Kubernetes Nodes, and written back as annotations on them
//! (calico-kdd.md §4d; `lk8s/resources/node.go`, `lk8s/resources/resources.go`).
//!
//! Reading: the Calico-only labels and annotations come from the annotations
//! `projectcalico.org/labels` and `projectcalico.org/annotations`, overlaid by the Kubernetes
//! labels (which win); the Kubernetes labels are also kept, as JSON, in the annotation
//! `projectcalico.org/kube-labels`, so that a write can tell them apart again. BGP, VXLAN and
//! WireGuard fields come from `projectcalico.org/…` annotations; values that do not validate
//! are ignored, as in Calico.
//!
//! Writing ([`calico_node_patch`]): every Calico annotation is set or removed; the
//! Kubernetes labels are never touched (a Calico label shadowed by a Kubernetes label is lost,
//! as in Calico).

use std::collections::BTreeMap;

use margay_api::endpoint::{
    NodeAddress, NodeBgpSpec, NodeInterface, NodeSpec, NodeStatus, NodeWireguardSpec, OrchRef,
};
use margay_api::net::Cidr;
use margay_api::numorstring::AsNumber;
use margay_api::{Node, ObjectMeta, Resource};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::json::{annotation_path, decode, decode_str, label, null_as_default, value_label};
use crate::meta::K8sMeta;
use crate::{KddError, Result};

/// Calico's annotations on Kubernetes Nodes.
pub const ANNOTATION_IPV4_ADDRESS: &str = "projectcalico.org/IPv4Address";
pub const ANNOTATION_IPV6_ADDRESS: &str = "projectcalico.org/IPv6Address";
pub const ANNOTATION_AS_NUMBER: &str = "projectcalico.org/ASNumber";
pub const ANNOTATION_RR_CLUSTER_ID: &str = "projectcalico.org/RouteReflectorClusterID";
pub const ANNOTATION_IPV4_IPIP_TUNNEL_ADDR: &str = "projectcalico.org/IPv4IPIPTunnelAddr";
pub const ANNOTATION_IPV4_VXLAN_TUNNEL_ADDR: &str = "projectcalico.org/IPv4VXLANTunnelAddr";
pub const ANNOTATION_VXLAN_TUNNEL_MAC: &str = "projectcalico.org/VXLANTunnelMACAddr";
pub const ANNOTATION_IPV6_VXLAN_TUNNEL_ADDR: &str = "projectcalico.org/IPv6VXLANTunnelAddr";
pub const ANNOTATION_VXLAN_TUNNEL_MAC_V6: &str = "projectcalico.org/VXLANTunnelMACAddrV6";
pub const ANNOTATION_IPV4_WIREGUARD_ADDR: &str = "projectcalico.org/IPv4WireguardInterfaceAddr";
pub const ANNOTATION_IPV6_WIREGUARD_ADDR: &str = "projectcalico.org/IPv6WireguardInterfaceAddr";
pub const ANNOTATION_WIREGUARD_PUBLIC_KEY: &str = "projectcalico.org/WireguardPublicKey";
pub const ANNOTATION_WIREGUARD_PUBLIC_KEY_V6: &str = "projectcalico.org/WireguardPublicKeyV6";
pub const ANNOTATION_INTERFACES: &str = "projectcalico.org/Interfaces";
/// The Calico-only labels and annotations of the Node (JSON maps).
pub const ANNOTATION_LABELS: &str = "projectcalico.org/labels";
pub const ANNOTATION_ANNOTATIONS: &str = "projectcalico.org/annotations";
/// The Kubernetes labels as they were when the Node was read (JSON), on the Calico Node only.
pub const ANNOTATION_KUBE_LABELS: &str = "projectcalico.org/kube-labels";

/// Node address types.
pub const ADDRESS_CALICO_NODE_IP: &str = "CalicoNodeIP";
pub const ADDRESS_INTERNAL_IP: &str = "InternalIP";
pub const ADDRESS_EXTERNAL_IP: &str = "ExternalIP";

#[derive(Deserialize, Default)]
#[serde(default)]
struct K8sNode {
    #[serde(deserialize_with = "null_as_default")]
    metadata: K8sMeta,
    #[serde(deserialize_with = "null_as_default")]
    spec: K8sNodeSpec,
    #[serde(deserialize_with = "null_as_default")]
    status: K8sNodeStatus,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct K8sNodeSpec {
    #[serde(rename = "podCIDR", deserialize_with = "null_as_default")]
    pod_cidr: String,
    #[serde(rename = "podCIDRs", deserialize_with = "null_as_default")]
    pod_cidrs: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct K8sNodeStatus {
    #[serde(deserialize_with = "null_as_default")]
    addresses: Vec<K8sNodeAddress>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct K8sNodeAddress {
    #[serde(rename = "type", deserialize_with = "null_as_default")]
    type_: String,
    #[serde(deserialize_with = "null_as_default")]
    address: String,
}

/// An element of the Interfaces annotation, read leniently.
#[derive(Deserialize, Default)]
#[serde(default)]
struct InterfaceAnnotation {
    #[serde(deserialize_with = "null_as_default")]
    name: String,
    #[serde(deserialize_with = "null_as_default")]
    addresses: Vec<String>,
}

/// What a validator accepts: Calico's `ValidateCIDRv4/v6` (an address or CIDR, host bits
/// allowed) and `ValidateIPv4Network/IPv6Network` (an address, or a CIDR without host bits).
#[derive(Clone, Copy)]
enum Check {
    CidrV4,
    CidrV6,
    NetworkV4,
    NetworkV6,
    Mac,
}

impl Check {
    fn accepts(self, value: &str) -> bool {
        let cidr = || Cidr::parse_cidr_or_ip(value).ok();
        match self {
            Check::CidrV4 => cidr().is_some_and(|c| c.is_ipv4()),
            Check::CidrV6 => cidr().is_some_and(|c| !c.is_ipv4()),
            Check::NetworkV4 => cidr().is_some_and(|c| c.is_ipv4() && c.is_masked()),
            Check::NetworkV6 => cidr().is_some_and(|c| !c.is_ipv4() && c.is_masked()),
            Check::Mac => is_go_mac(value),
        }
    }
}

/// Go's net.ParseMAC: 6, 8 or 20 octets as `xx:xx…`, `xx-xx…` or `xxxx.xxxx…`.
fn is_go_mac(s: &str) -> bool {
    let hex = |g: &str, n: usize| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit());
    let octets_ok = |n: usize| matches!(n, 6 | 8 | 20);
    for sep in [':', '-'] {
        if s.contains(sep) {
            let groups: Vec<&str> = s.split(sep).collect();
            return octets_ok(groups.len()) && groups.iter().all(|g| hex(g, 2));
        }
    }
    if s.contains('.') {
        let groups: Vec<&str> = s.split('.').collect();
        return octets_ok(groups.len() * 2) && groups.iter().all(|g| hex(g, 4));
    }
    false
}

/// The annotation's value when it is present, not empty and valid; "" otherwise.
fn annotation(a: &BTreeMap<String, String>, key: &str, check: Check) -> String {
    match a.get(key) {
        Some(v) if !v.is_empty() && check.accepts(v) => v.clone(),
        _ => String::new(),
    }
}

/// The IPIP tunnel address Calico assigns with host-local IPAM (USE_POD_CIDR): the pod
/// CIDR's address with its last octet incremented (IPv4 only; none for IPv6).
fn static_tunnel_address(pod_cidr: &str) -> Option<Result<String, String>> {
    let cidr = match Cidr::parse(pod_cidr) {
        Ok(c) => c,
        Err(e) => return Some(Err(e)),
    };
    match cidr.addr() {
        std::net::IpAddr::V4(a) => {
            let mut o = a.octets();
            // Go increments the byte, wrapping.
            o[3] = o[3].wrapping_add(1);
            Some(Ok(std::net::Ipv4Addr::from(o).to_string()))
        }
        std::net::IpAddr::V6(_) => None,
    }
}

/// The Calico Node of a Kubernetes Node (calico-kdd.md §4d), with Calico's IPAM (not
/// USE_POD_CIDR; see [`k8s_node_to_calico_with`]).
pub fn k8s_node_to_calico(node: &Value) -> Result<Resource> {
    k8s_node_to_calico_with(node, false)
}

/// The Calico Node of a Kubernetes Node:
///
/// - name, creationTimestamp, uid and resourceVersion of the Kubernetes Node;
/// - labels: the Calico labels (annotation `projectcalico.org/labels`) overlaid by the
///   Kubernetes labels; annotations: the Calico annotations (`projectcalico.org/annotations`)
///   plus `projectcalico.org/kube-labels` (the Kubernetes labels as JSON, `null` when none);
///   an annotation that is not a JSON map is ignored, as in Calico;
/// - spec.bgp from IPv4Address, IPv6Address, ASNumber, RouteReflectorClusterID and
///   IPv4IPIPTunnelAddr (left out when all are empty), spec.wireguard from the WireGuard
///   interface addresses, the VXLAN tunnel addresses and MACs, each ignored when invalid;
/// - with `use_pod_cidr` (host-local IPAM) and a spec.podCIDR, the IPIP tunnel address is the
///   pod CIDR's address + 1 (IPv4), also the WireGuard IPv4 address when a public key is set;
/// - spec.orchRefs `[{nodeName: <name>, orchestrator: k8s}]`; spec.addresses: the BGP
///   addresses (CalicoNodeIP), then the Kubernetes InternalIP and ExternalIP addresses;
///   spec.interfaces from `projectcalico.org/Interfaces` (addresses that are not IPs dropped);
/// - status: the WireGuard public keys, and podCIDRs from spec.podCIDRs.
pub fn k8s_node_to_calico_with(node: &Value, use_pod_cidr: bool) -> Result<Resource> {
    let object = value_label("Node", node);
    let n: K8sNode = decode(node, &object)?;
    let m = &n.metadata;
    let object = label("Node", "", &m.name);
    if m.name.is_empty() {
        return Err(KddError::new(&object, "metadata.name", "required"));
    }
    let a = &m.annotations;

    let json_map = |key: &str| -> BTreeMap<String, String> {
        a.get(key)
            .and_then(|text| serde_json::from_str::<Option<BTreeMap<String, String>>>(text).ok())
            .flatten()
            .unwrap_or_default()
    };
    let mut labels = json_map(ANNOTATION_LABELS);
    let mut annotations = json_map(ANNOTATION_ANNOTATIONS);
    labels.extend(m.labels.clone().unwrap_or_default());
    // Go marshals a nil map as null.
    let kube_labels = serde_json::to_string(&m.labels)
        .map_err(|e| KddError::new(&object, "metadata.labels", e.to_string()))?;
    annotations.insert(ANNOTATION_KUBE_LABELS.to_string(), kube_labels);

    let mut bgp = NodeBgpSpec {
        ipv4_address: annotation(a, ANNOTATION_IPV4_ADDRESS, Check::CidrV4),
        ipv6_address: annotation(a, ANNOTATION_IPV6_ADDRESS, Check::CidrV6),
        route_reflector_cluster_id: annotation(a, ANNOTATION_RR_CLUSTER_ID, Check::NetworkV4),
        as_number: a
            .get(ANNOTATION_AS_NUMBER)
            .and_then(|s| AsNumber::parse(s).ok()),
        ..NodeBgpSpec::default()
    };
    let mut wireguard = NodeWireguardSpec::default();
    if use_pod_cidr && !n.spec.pod_cidr.is_empty() {
        if let Some(addr) = static_tunnel_address(&n.spec.pod_cidr) {
            let addr = addr.map_err(|e| KddError::new(&object, "spec.podCIDR", e))?;
            if a.get(ANNOTATION_WIREGUARD_PUBLIC_KEY)
                .is_some_and(|k| !k.is_empty())
            {
                wireguard.interface_ipv4_address = addr.clone();
            }
            bgp.ipv4_ipip_tunnel_addr = addr;
        }
    } else {
        bgp.ipv4_ipip_tunnel_addr =
            annotation(a, ANNOTATION_IPV4_IPIP_TUNNEL_ADDR, Check::NetworkV4);
        wireguard.interface_ipv4_address =
            annotation(a, ANNOTATION_IPV4_WIREGUARD_ADDR, Check::NetworkV4);
        wireguard.interface_ipv6_address =
            annotation(a, ANNOTATION_IPV6_WIREGUARD_ADDR, Check::NetworkV6);
    }

    let mut addresses = Vec::new();
    for ip in [&bgp.ipv4_address, &bgp.ipv6_address] {
        if !ip.is_empty() {
            addresses.push(NodeAddress {
                address: ip.clone(),
                type_: ADDRESS_CALICO_NODE_IP.into(),
            });
        }
    }
    for k in &n.status.addresses {
        if matches!(k.type_.as_str(), ADDRESS_INTERNAL_IP | ADDRESS_EXTERNAL_IP) {
            addresses.push(NodeAddress {
                address: k.address.clone(),
                type_: k.type_.clone(),
            });
        }
    }

    let interfaces = a
        .get(ANNOTATION_INTERFACES)
        .and_then(|text| serde_json::from_str::<Vec<InterfaceAnnotation>>(text).ok())
        .unwrap_or_default()
        .into_iter()
        .map(|i| NodeInterface {
            name: i.name,
            addresses: i
                .addresses
                .into_iter()
                .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
                .collect(),
        })
        .collect();

    let spec = NodeSpec {
        bgp: (bgp != NodeBgpSpec::default()).then_some(bgp),
        ipv4_vxlan_tunnel_addr: annotation(a, ANNOTATION_IPV4_VXLAN_TUNNEL_ADDR, Check::NetworkV4),
        vxlan_tunnel_mac_addr: annotation(a, ANNOTATION_VXLAN_TUNNEL_MAC, Check::Mac),
        ipv6_vxlan_tunnel_addr: annotation(a, ANNOTATION_IPV6_VXLAN_TUNNEL_ADDR, Check::NetworkV6),
        vxlan_tunnel_mac_addr_v6: annotation(a, ANNOTATION_VXLAN_TUNNEL_MAC_V6, Check::Mac),
        orch_refs: vec![OrchRef {
            node_name: m.name.clone(),
            orchestrator: "k8s".into(),
        }],
        wireguard: (wireguard != NodeWireguardSpec::default()).then_some(wireguard),
        addresses,
        interfaces,
    };
    let status = NodeStatus {
        wireguard_public_key: a
            .get(ANNOTATION_WIREGUARD_PUBLIC_KEY)
            .cloned()
            .unwrap_or_default(),
        wireguard_public_key_v6: a
            .get(ANNOTATION_WIREGUARD_PUBLIC_KEY_V6)
            .cloned()
            .unwrap_or_default(),
        pod_cidrs: n.spec.pod_cidrs.clone(),
    };
    let metadata = ObjectMeta {
        name: m.name.clone(),
        uid: m.uid.clone(),
        resource_version: m.resource_version.clone(),
        creation_timestamp: m.creation_timestamp.clone(),
        labels,
        annotations,
        ..ObjectMeta::default()
    };
    let mut node = Node::new(metadata, spec);
    node.status = (!status.is_empty()).then_some(status);
    Ok(Resource::Node(node))
}

/// The merge-patch body that writes a Calico Node onto its Kubernetes Node (Calico's
/// mergeCalicoNodeIntoK8sNode; Calico PUTs `nodes/<name>/status`, and a PATCH of the same
/// subresource writes the same metadata): under `metadata.annotations`, each Calico annotation
/// whose value changes from `live_k8s_node`'s, set to its new value or to null (removed).
///
/// - The labels the Calico Node got from Kubernetes (listed in its
///   `projectcalico.org/kube-labels`) are dropped; the rest go, as JSON, into
///   `projectcalico.org/labels` (removed when none). Its annotations other than kube-labels
///   go into `projectcalico.org/annotations` likewise. Kubernetes labels are never written.
/// - BGP, VXLAN, WireGuard and Interfaces annotations are set from the spec and status, and
///   removed when empty.
/// - `metadata.resourceVersion` is the Calico Node's when set (compare-and-swap against the
///   revision it was read at), else the live node's, so a node changed since it was read is
///   not overwritten blindly (the API server answers 409).
///
/// Errors when `calico` is not a Node or its kube-labels annotation is not a JSON map.
pub fn calico_node_patch(calico: &Resource, live_k8s_node: &Value) -> Result<Value> {
    let Resource::Node(node) = calico else {
        return Err(KddError::new(
            label(calico.kind().name(), calico.namespace(), calico.name()),
            "kind",
            "only Nodes are written onto Kubernetes Nodes",
        ));
    };
    let object = label("Node", "", &node.metadata.name);
    let live_object = value_label("Node", live_k8s_node);
    let live: K8sNode = decode(live_k8s_node, &live_object)?;

    let mut labels = node.metadata.labels.clone();
    let mut annotations = node.metadata.annotations.clone();
    if let Some(raw) = annotations
        .remove(ANNOTATION_KUBE_LABELS)
        .filter(|r| !r.is_empty())
    {
        let field = annotation_path(ANNOTATION_KUBE_LABELS);
        let k8s: Option<BTreeMap<String, String>> = decode_str(&raw, &object, &field)?;
        for key in k8s.unwrap_or_default().keys() {
            labels.remove(key);
        }
    }

    let mut want: BTreeMap<&str, Option<String>> = BTreeMap::new();
    let json_text = |m: &BTreeMap<String, String>| {
        // Maps of strings always serialise.
        (!m.is_empty()).then(|| serde_json::to_string(m).unwrap_or_default())
    };
    want.insert(ANNOTATION_LABELS, json_text(&labels));
    want.insert(ANNOTATION_ANNOTATIONS, json_text(&annotations));

    let set = |v: &str| (!v.is_empty()).then(|| v.to_string());
    let spec = &node.spec;
    want.insert(
        ANNOTATION_IPV4_VXLAN_TUNNEL_ADDR,
        set(&spec.ipv4_vxlan_tunnel_addr),
    );
    want.insert(
        ANNOTATION_VXLAN_TUNNEL_MAC,
        set(&spec.vxlan_tunnel_mac_addr),
    );
    want.insert(
        ANNOTATION_IPV6_VXLAN_TUNNEL_ADDR,
        set(&spec.ipv6_vxlan_tunnel_addr),
    );
    want.insert(
        ANNOTATION_VXLAN_TUNNEL_MAC_V6,
        set(&spec.vxlan_tunnel_mac_addr_v6),
    );
    let bgp = spec.bgp.clone().unwrap_or_default();
    want.insert(ANNOTATION_IPV4_ADDRESS, set(&bgp.ipv4_address));
    want.insert(
        ANNOTATION_IPV4_IPIP_TUNNEL_ADDR,
        set(&bgp.ipv4_ipip_tunnel_addr),
    );
    want.insert(ANNOTATION_IPV6_ADDRESS, set(&bgp.ipv6_address));
    want.insert(ANNOTATION_AS_NUMBER, bgp.as_number.map(|a| a.to_string()));
    want.insert(
        ANNOTATION_RR_CLUSTER_ID,
        set(&bgp.route_reflector_cluster_id),
    );
    let wg = spec.wireguard.clone().unwrap_or_default();
    want.insert(
        ANNOTATION_IPV4_WIREGUARD_ADDR,
        set(&wg.interface_ipv4_address),
    );
    want.insert(
        ANNOTATION_IPV6_WIREGUARD_ADDR,
        set(&wg.interface_ipv6_address),
    );
    let status = node.status.clone().unwrap_or_default();
    want.insert(
        ANNOTATION_WIREGUARD_PUBLIC_KEY,
        set(&status.wireguard_public_key),
    );
    want.insert(
        ANNOTATION_WIREGUARD_PUBLIC_KEY_V6,
        set(&status.wireguard_public_key_v6),
    );
    let interfaces = (!spec.interfaces.is_empty())
        .then(|| serde_json::to_string(&spec.interfaces))
        .transpose()
        .map_err(|e| KddError::new(&object, "spec.interfaces", e.to_string()))?;
    want.insert(ANNOTATION_INTERFACES, interfaces);

    let current = &live.metadata.annotations;
    let mut changes = Map::new();
    for (key, value) in want {
        if current.get(key) != value.as_ref() {
            changes.insert(key.to_string(), value.map_or(Value::Null, Value::String));
        }
    }
    let mut metadata = Map::new();
    if !changes.is_empty() {
        metadata.insert("annotations".into(), Value::Object(changes));
    }
    let rv = if node.metadata.resource_version.is_empty() {
        &live.metadata.resource_version
    } else {
        &node.metadata.resource_version
    };
    if !rv.is_empty() {
        metadata.insert("resourceVersion".into(), json!(rv));
    }
    Ok(json!({ "metadata": metadata }))
}
