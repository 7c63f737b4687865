//! Node and endpoint resources: Node, HostEndpoint, WorkloadEndpoint.

use serde::{Deserialize, Serialize};

use crate::numorstring::{AsNumber, Dscp, Protocol};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<NodeBgpSpec>,
    #[serde(
        default,
        rename = "ipv4VXLANTunnelAddr",
        skip_serializing_if = "String::is_empty"
    )]
    pub ipv4_vxlan_tunnel_addr: String,
    #[serde(
        default,
        rename = "vxlanTunnelMACAddr",
        skip_serializing_if = "String::is_empty"
    )]
    pub vxlan_tunnel_mac_addr: String,
    #[serde(
        default,
        rename = "ipv6VXLANTunnelAddr",
        skip_serializing_if = "String::is_empty"
    )]
    pub ipv6_vxlan_tunnel_addr: String,
    #[serde(
        default,
        rename = "vxlanTunnelMACAddrV6",
        skip_serializing_if = "String::is_empty"
    )]
    pub vxlan_tunnel_mac_addr_v6: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orch_refs: Vec<OrchRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wireguard: Option<NodeWireguardSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<NodeAddress>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<NodeInterface>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeBgpSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_number: Option<AsNumber>,
    #[serde(
        default,
        rename = "ipv4Address",
        skip_serializing_if = "String::is_empty"
    )]
    pub ipv4_address: String,
    #[serde(
        default,
        rename = "ipv6Address",
        skip_serializing_if = "String::is_empty"
    )]
    pub ipv6_address: String,
    #[serde(
        default,
        rename = "ipv4IPIPTunnelAddr",
        skip_serializing_if = "String::is_empty"
    )]
    pub ipv4_ipip_tunnel_addr: String,
    #[serde(
        default,
        rename = "routeReflectorClusterID",
        skip_serializing_if = "String::is_empty"
    )]
    pub route_reflector_cluster_id: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeWireguardSpec {
    #[serde(
        default,
        rename = "interfaceIPv4Address",
        skip_serializing_if = "String::is_empty"
    )]
    pub interface_ipv4_address: String,
    #[serde(
        default,
        rename = "interfaceIPv6Address",
        skip_serializing_if = "String::is_empty"
    )]
    pub interface_ipv6_address: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeAddress {
    #[serde(default)]
    pub address: String,
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub type_: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeInterface {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OrchRef {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    #[serde(default)]
    pub orchestrator: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeStatus {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub wireguard_public_key: String,
    #[serde(
        default,
        rename = "wireguardPublicKeyV6",
        skip_serializing_if = "String::is_empty"
    )]
    pub wireguard_public_key_v6: String,
    #[serde(default, rename = "podCIDRs", skip_serializing_if = "Vec::is_empty")]
    pub pod_cidrs: Vec<String>,
}

impl NodeStatus {
    pub fn is_empty(&self) -> bool {
        self == &NodeStatus::default()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostEndpointSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub interface_name: String,
    #[serde(default, rename = "expectedIPs", skip_serializing_if = "Vec::is_empty")]
    pub expected_ips: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub profiles: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<EndpointPort>,
}

/// A named port of a host endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointPort {
    #[serde(default)]
    pub name: String,
    pub protocol: Protocol,
    #[serde(default)]
    pub port: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadEndpointSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub orchestrator: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub workload: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    #[serde(
        default,
        rename = "containerID",
        skip_serializing_if = "String::is_empty"
    )]
    pub container_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_account_name: String,
    #[serde(default, rename = "ipNetworks", skip_serializing_if = "Vec::is_empty")]
    pub ip_networks: Vec<String>,
    #[serde(default, rename = "ipNATs", skip_serializing_if = "Vec::is_empty")]
    pub ip_nats: Vec<IpNat>,
    #[serde(
        default,
        rename = "ipv4Gateway",
        skip_serializing_if = "String::is_empty"
    )]
    pub ipv4_gateway: String,
    #[serde(
        default,
        rename = "ipv6Gateway",
        skip_serializing_if = "String::is_empty"
    )]
    pub ipv6_gateway: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub profiles: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub interface_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<WorkloadEndpointPort>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_spoofed_source_prefixes: Vec<String>,
    #[serde(
        default,
        rename = "qosControls",
        skip_serializing_if = "Option::is_none"
    )]
    pub qos_controls: Option<QosControls>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadEndpointPort {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub protocol: Protocol,
    #[serde(default)]
    pub port: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_port: i64,
    #[serde(default, rename = "hostIP", skip_serializing_if = "String::is_empty")]
    pub host_ip: String,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpNat {
    #[serde(default, rename = "internalIP")]
    pub internal_ip: String,
    #[serde(default, rename = "externalIP")]
    pub external_ip: String,
}

/// Bandwidth, packet-rate and connection limits for a workload (CNI bandwidth annotations).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QosControls {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ingress_bandwidth: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ingress_burst: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ingress_peakrate: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ingress_minburst: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_bandwidth: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_burst: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_peakrate: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_minburst: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ingress_packet_rate: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ingress_packet_burst: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_packet_rate: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_packet_burst: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ingress_max_connections: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_max_connections: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dscp: Option<Dscp>,
}

impl WorkloadEndpointSpec {
    /// The name Calico gives this endpoint: `<node>-<orchestrator>-<id>-<endpoint>`, where `id`
    /// is the pod (orchestrator `k8s`), the container ID (`cni`), the orchestrator again
    /// (`libnetwork`) or the workload (anything else), and every '-' inside a part is doubled
    /// so the parts can be told apart. Errors name the spec field that is missing or malformed.
    /// The workload id Felix's dataplane knows the endpoint by (Calico's WorkloadID):
    /// `<namespace>/<pod>` for Kubernetes pods, else the `workload` field, else the name.
    pub fn workload_id(&self, namespace: &str, name: &str) -> String {
        if self.orchestrator == "k8s" && !self.pod.is_empty() {
            format!("{namespace}/{}", self.pod)
        } else if !self.workload.is_empty() {
            self.workload.clone()
        } else {
            name.to_string()
        }
    }

    /// The endpoint id (`eth0` when unset).
    pub fn endpoint_id(&self) -> String {
        if self.endpoint.is_empty() {
            "eth0".to_string()
        } else {
            self.endpoint.clone()
        }
    }

    pub fn expected_name(&self) -> Result<String, (&'static str, String)> {
        let id = match self.orchestrator.as_str() {
            "k8s" => ("pod", &self.pod),
            "cni" => ("containerID", &self.container_id),
            "libnetwork" => ("orchestrator", &self.orchestrator),
            _ => ("workload", &self.workload),
        };
        let parts = [
            ("node", &self.node),
            ("orchestrator", &self.orchestrator),
            id,
            ("endpoint", &self.endpoint),
        ];
        let mut name = String::new();
        for (field, value) in parts {
            if value.is_empty() {
                return Err((
                    field,
                    "required: it is part of the endpoint's name".to_string(),
                ));
            }
            if value.starts_with('-') || value.ends_with('-') {
                return Err((field, format!("{value:?} must not start or end with '-'")));
            }
            if !name.is_empty() {
                name.push('-');
            }
            name.push_str(&value.replace('-', "--"));
        }
        Ok(name)
    }
}

/// The name of an endpoint's status file (Felix writes it once the endpoint's policy is in;
/// the CNI plugin can wait for it): orchestrator, workload id and endpoint id, each
/// percent-encoded as Go's `url.PathEscape` does, joined by spaces (Calico's names).
pub fn endpoint_status_file_name(orchestrator: &str, workload: &str, endpoint: &str) -> String {
    fn path_escape(s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        for b in s.bytes() {
            let keep = b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'-' | b'_' | b'.' | b'~' | b':' | b'@' | b'&' | b'=' | b'+' | b'$'
                );
            if keep {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    }
    format!(
        "{} {} {}",
        path_escape(orchestrator),
        path_escape(workload),
        path_escape(endpoint)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_endpoint_names() {
        let spec = WorkloadEndpointSpec {
            orchestrator: "k8s".into(),
            node: "worker-2".into(),
            pod: "web-0".into(),
            endpoint: "eth0".into(),
            ..Default::default()
        };
        assert_eq!(spec.expected_name().unwrap(), "worker--2-k8s-web--0-eth0");
        let cni = WorkloadEndpointSpec {
            orchestrator: "cni".into(),
            node: "n1".into(),
            container_id: "abc123".into(),
            endpoint: "eth0".into(),
            ..Default::default()
        };
        assert_eq!(cni.expected_name().unwrap(), "n1-cni-abc123-eth0");
        let missing = WorkloadEndpointSpec {
            orchestrator: "k8s".into(),
            node: "n1".into(),
            endpoint: "eth0".into(),
            ..Default::default()
        };
        assert_eq!(missing.expected_name().unwrap_err().0, "pod");
    }
}
