//! BGP resources: BGPConfiguration, BGPPeer, BGPFilter.

use serde::{Deserialize, Serialize};

use crate::duration::Duration;
use crate::meta::SecretKeySelector;
use crate::numorstring::AsNumber;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BindMode {
    None,
    #[serde(rename = "NodeIP")]
    NodeIp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EnabledDisabled {
    Enabled,
    Disabled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProgramClusterRoutes {
    Enabled,
    Disabled,
    #[serde(rename = "EnabledIPIPOnly")]
    EnabledIpipOnly,
    EnabledNoEncapOnly,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BGPConfigurationSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub log_severity_screen: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_to_node_mesh_enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_number: Option<AsNumber>,
    #[serde(
        default,
        rename = "serviceLoadBalancerIPs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub service_load_balancer_ips: Vec<CidrBlock>,
    #[serde(
        default,
        rename = "serviceExternalIPs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub service_external_ips: Vec<CidrBlock>,
    #[serde(
        default,
        rename = "serviceClusterIPs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub service_cluster_ips: Vec<CidrBlock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_load_balancer_aggregation: Option<EnabledDisabled>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub communities: Vec<Community>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefix_advertisements: Vec<PrefixAdvertisement>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen_port: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_mesh_password: Option<BgpPassword>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_mesh_max_restart_time: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind_mode: Option<BindMode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored_interfaces: Vec<String>,
    #[serde(
        default,
        rename = "localWorkloadPeeringIPV4",
        skip_serializing_if = "String::is_empty"
    )]
    pub local_workload_peering_ipv4: String,
    #[serde(
        default,
        rename = "localWorkloadPeeringIPV6",
        skip_serializing_if = "String::is_empty"
    )]
    pub local_workload_peering_ipv6: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program_cluster_routes: Option<ProgramClusterRoutes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4_normal_route_priority: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_normal_route_priority: Option<i64>,
}

/// A `{cidr: ...}` entry of the service IP advertisement lists.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CidrBlock {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cidr: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Community {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrefixAdvertisement {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cidr: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub communities: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BgpPassword {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<SecretKeySelector>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SourceAddress {
    #[serde(rename = "UseNodeIP")]
    UseNodeIp,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NextHopMode {
    Auto,
    #[serde(rename = "Self")]
    Self_,
    Keep,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReversePeering {
    Auto,
    Manual,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BGPPeerSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_selector: String,
    #[serde(default, rename = "peerIP", skip_serializing_if = "String::is_empty")]
    pub peer_ip: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_number: Option<AsNumber>,
    #[serde(
        default,
        rename = "localASNumber",
        skip_serializing_if = "Option::is_none"
    )]
    pub local_as_number: Option<AsNumber>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub peer_selector: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_original_next_hop: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop_mode: Option<NextHopMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<BgpPassword>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_address: Option<SourceAddress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restart_time: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive_time: Option<Duration>,
    #[serde(
        default,
        rename = "numAllowedLocalASNumbers",
        skip_serializing_if = "Option::is_none"
    )]
    pub num_allowed_local_as_numbers: Option<i64>,
    #[serde(
        default,
        rename = "ttlSecurity",
        skip_serializing_if = "Option::is_none"
    )]
    pub ttl_security: Option<i64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reachable_by: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub local_workload_selector: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverse_peering: Option<ReversePeering>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BGPFilterSpec {
    #[serde(default, rename = "exportV4", skip_serializing_if = "Vec::is_empty")]
    pub export_v4: Vec<BgpFilterRule>,
    #[serde(default, rename = "importV4", skip_serializing_if = "Vec::is_empty")]
    pub import_v4: Vec<BgpFilterRule>,
    #[serde(default, rename = "exportV6", skip_serializing_if = "Vec::is_empty")]
    pub export_v6: Vec<BgpFilterRule>,
    #[serde(default, rename = "importV6", skip_serializing_if = "Vec::is_empty")]
    pub import_v6: Vec<BgpFilterRule>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BgpFilterAction {
    Accept,
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MatchOperator {
    Equal,
    NotEqual,
    In,
    NotIn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BgpFilterSource {
    RemotePeers,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BgpPeerType {
    #[serde(rename = "eBGP")]
    Ebgp,
    #[serde(rename = "iBGP")]
    Ibgp,
}

/// One BGPFilter rule; the same shape serves the v4 and v6 lists (the family is checked by
/// validation, since the field names are identical).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BgpFilterRule {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cidr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_length: Option<PrefixLength>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<BgpFilterSource>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub interface: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_operator: Option<MatchOperator>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_type: Option<BgpPeerType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub communities: Option<CommunityMatch>,
    #[serde(
        default,
        rename = "asPathPrefix",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub as_path_prefix: Vec<AsNumber>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    pub action: BgpFilterAction,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operations: Vec<BgpFilterOperation>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrefixLength {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommunityMatch {
    #[serde(default)]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BgpFilterOperation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_community: Option<AddCommunity>,
    #[serde(
        default,
        rename = "prependASPath",
        skip_serializing_if = "Option::is_none"
    )]
    pub prepend_as_path: Option<PrependAsPath>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_priority: Option<SetPriority>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddCommunity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrependAsPath {
    #[serde(default)]
    pub prefix: Vec<AsNumber>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetPriority {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<i64>,
}
