//! What the calculation graph tells the dataplane (Calico's felixbackend "ToDataplane"
//! messages, in margay's own types). Members and lists are sorted, so equal state always
//! produces equal messages.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use margay_api::net::Cidr;
use serde::Serialize;

/// Identifies an active policy: its tier, name and (for NetworkPolicy) namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct PolicyId {
    pub tier: String,
    /// Empty for global policies.
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for PolicyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}", self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// Identifies a workload endpoint as Calico's dataplane does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct WorkloadEndpointId {
    pub orchestrator: String,
    /// `<namespace>/<pod>` for Kubernetes workloads.
    pub workload: String,
    pub endpoint: String,
}

impl fmt::Display for WorkloadEndpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.orchestrator, self.workload, self.endpoint
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum IpSetKind {
    /// Members are networks (single addresses as /32 or /128).
    Net,
    /// Members are `address,protocol:port` (named ports).
    IpAndPort,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum PortProtocol {
    Tcp,
    Udp,
    Sctp,
}

impl fmt::Display for PortProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PortProtocol::Tcp => "tcp",
            PortProtocol::Udp => "udp",
            PortProtocol::Sctp => "sctp",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum IpSetMember {
    Net(Cidr),
    IpPort {
        ip: IpAddr,
        protocol: PortProtocol,
        port: u16,
    },
}

impl IpSetMember {
    pub fn is_ipv4(&self) -> bool {
        match self {
            IpSetMember::Net(c) => c.is_ipv4(),
            IpSetMember::IpPort { ip, .. } => ip.is_ipv4(),
        }
    }
}

impl fmt::Display for IpSetMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpSetMember::Net(c) => write!(f, "{c}"),
            IpSetMember::IpPort { ip, protocol, port } => write!(f, "{ip},{protocol}:{port}"),
        }
    }
}

/// What a rule does when it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum RuleAction {
    Allow,
    Deny,
    Log,
    /// Skip the rest of this tier (Calico's `next-tier`).
    Pass,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct IcmpMatch {
    pub icmp_type: u8,
    pub code: Option<u8>,
}

/// One side of a rule, resolved: networks, ports, and the IP sets its selectors became.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct ResolvedMatch {
    pub nets: Vec<Cidr>,
    pub not_nets: Vec<Cidr>,
    pub ports: Vec<PortRange>,
    pub not_ports: Vec<PortRange>,
    /// Selector IP sets the address must be in (all of them).
    pub ip_set_ids: Vec<String>,
    /// Selector IP sets the address must not be in.
    pub not_ip_set_ids: Vec<String>,
    /// Named-port IP sets (address and port); matching any one suffices.
    pub named_port_ip_set_ids: Vec<String>,
    pub not_named_port_ip_set_ids: Vec<String>,
    /// The selectors as written in the policy, for diagnostics.
    pub original_selector: String,
    pub original_not_selector: String,
    pub original_namespace_selector: String,
}

/// A rule ready for the dataplane.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ResolvedRule {
    pub action: RuleAction,
    pub ip_version: Option<u8>,
    pub protocol: Option<u8>,
    pub not_protocol: Option<u8>,
    pub icmp: Option<IcmpMatch>,
    pub not_icmp: Option<IcmpMatch>,
    pub src: ResolvedMatch,
    pub dst: ResolvedMatch,
    /// Stable id of the rule (hash of its content and position), for logs and counters.
    pub rule_id: String,
}

impl ResolvedRule {
    /// Every IP set the rule needs.
    pub fn ip_set_ids(&self) -> impl Iterator<Item = &String> {
        [&self.src, &self.dst].into_iter().flat_map(|m| {
            m.ip_set_ids
                .iter()
                .chain(&m.not_ip_set_ids)
                .chain(&m.named_port_ip_set_ids)
                .chain(&m.not_named_port_ip_set_ids)
        })
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct ResolvedPolicy {
    pub namespace: String,
    pub tier: String,
    pub inbound: Vec<ResolvedRule>,
    pub outbound: Vec<ResolvedRule>,
    /// doNotTrack: applied before connection tracking.
    pub untracked: bool,
    pub pre_dnat: bool,
    pub apply_on_forward: bool,
    pub original_selector: String,
}

impl ResolvedPolicy {
    pub fn ip_set_ids(&self) -> BTreeSet<&String> {
        self.inbound
            .iter()
            .chain(&self.outbound)
            .flat_map(ResolvedRule::ip_set_ids)
            .collect()
    }
}

/// A profile's rules (a namespace's or service account's default rules, or a plain profile).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct ResolvedProfile {
    pub inbound: Vec<ResolvedRule>,
    pub outbound: Vec<ResolvedRule>,
}

/// The policies of one tier that apply to an endpoint, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct TierInfo {
    pub name: String,
    /// What happens to traffic that no policy of the tier decided (Deny or Pass).
    pub default_action: RuleAction,
    pub ingress_policies: Vec<PolicyId>,
    pub egress_policies: Vec<PolicyId>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct WorkloadEndpointData {
    /// The host-side interface.
    pub interface: String,
    pub mac: String,
    pub ipv4_nets: Vec<Cidr>,
    pub ipv6_nets: Vec<Cidr>,
    pub profile_ids: Vec<String>,
    pub tiers: Vec<TierInfo>,
    /// The WorkloadEndpoint resource's name and namespace (for status and diagnostics).
    pub name: String,
    pub namespace: String,
    pub allow_spoofed_source_prefixes: Vec<Cidr>,
}

impl WorkloadEndpointData {
    pub fn policy_ids(&self) -> impl Iterator<Item = &PolicyId> {
        self.tiers
            .iter()
            .flat_map(|t| t.ingress_policies.iter().chain(&t.egress_policies))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct HostEndpointData {
    /// Interface name, or empty when matched by expected IPs only; `*` for all interfaces.
    pub interface: String,
    pub expected_ipv4: Vec<IpAddr>,
    pub expected_ipv6: Vec<IpAddr>,
    pub profile_ids: Vec<String>,
    pub tiers: Vec<TierInfo>,
    pub untracked_tiers: Vec<TierInfo>,
    pub pre_dnat_tiers: Vec<TierInfo>,
    pub forward_tiers: Vec<TierInfo>,
}

impl HostEndpointData {
    pub fn policy_ids(&self) -> impl Iterator<Item = &PolicyId> {
        self.tiers
            .iter()
            .chain(&self.untracked_tiers)
            .chain(&self.pre_dnat_tiers)
            .chain(&self.forward_tiers)
            .flat_map(|t| t.ingress_policies.iter().chain(&t.egress_policies))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum EncapMode {
    Never,
    Always,
    CrossSubnet,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct PoolData {
    pub cidr: Cidr,
    pub masquerade: bool,
    pub ipip: EncapMode,
    pub vxlan: EncapMode,
    pub disabled: bool,
}

/// Route kinds (Calico's RouteType bitmap).
pub mod route_type {
    pub const CIDR_INFO: u8 = 0;
    pub const REMOTE_WORKLOAD: u8 = 1;
    pub const REMOTE_HOST: u8 = 2;
    pub const LOCAL_WORKLOAD: u8 = 4;
    pub const LOCAL_HOST: u8 = 8;
    pub const REMOTE_TUNNEL: u8 = 16;
    pub const LOCAL_TUNNEL: u8 = 32;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum PoolType {
    None,
    NoEncap,
    Vxlan,
    Ipip,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Route {
    pub dst: Cidr,
    /// A combination of [`route_type`] bits.
    pub types: u8,
    pub pool_type: PoolType,
    pub dst_node_name: String,
    pub dst_node_ip: Option<IpAddr>,
    /// The destination node shares this node's subnet (CrossSubnet decides by this).
    pub same_subnet: bool,
    pub nat_outgoing: bool,
    pub local_workload: bool,
}

/// A VXLAN tunnel endpoint: another node's tunnel device.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Vtep {
    pub node: String,
    pub mac: String,
    pub ipv4_addr: Option<IpAddr>,
    pub parent_device_ip: Option<IpAddr>,
    pub mac_v6: String,
    pub ipv6_addr: Option<IpAddr>,
    pub parent_device_ipv6: Option<IpAddr>,
}

/// One instruction for the dataplane.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Message {
    /// Every earlier message describes the complete datastore state: the dataplane may now
    /// remove what it owns and nobody asked for.
    InSync,
    ConfigUpdate {
        config: BTreeMap<String, String>,
    },
    IpSetUpdate {
        id: String,
        kind: IpSetKind,
        members: Vec<IpSetMember>,
    },
    IpSetDeltaUpdate {
        id: String,
        added: Vec<IpSetMember>,
        removed: Vec<IpSetMember>,
    },
    IpSetRemove {
        id: String,
    },
    ActiveProfileUpdate {
        id: String,
        profile: Arc<ResolvedProfile>,
    },
    ActiveProfileRemove {
        id: String,
    },
    ActivePolicyUpdate {
        id: PolicyId,
        policy: Arc<ResolvedPolicy>,
    },
    ActivePolicyRemove {
        id: PolicyId,
    },
    WorkloadEndpointUpdate {
        id: WorkloadEndpointId,
        endpoint: Arc<WorkloadEndpointData>,
    },
    WorkloadEndpointRemove {
        id: WorkloadEndpointId,
    },
    HostEndpointUpdate {
        id: String,
        endpoint: Arc<HostEndpointData>,
    },
    HostEndpointRemove {
        id: String,
    },
    HostMetadataUpdate {
        hostname: String,
        ipv4: Option<Cidr>,
        ipv6: Option<Cidr>,
        labels: BTreeMap<String, String>,
    },
    HostMetadataRemove {
        hostname: String,
    },
    IpamPoolUpdate {
        id: String,
        pool: PoolData,
    },
    IpamPoolRemove {
        id: String,
    },
    NamespaceUpdate {
        id: String,
        labels: BTreeMap<String, String>,
    },
    NamespaceRemove {
        id: String,
    },
    ServiceAccountUpdate {
        id: String,
        labels: BTreeMap<String, String>,
    },
    ServiceAccountRemove {
        id: String,
    },
    RouteUpdate(Route),
    RouteRemove {
        dst: Cidr,
    },
    VtepUpdate(Vtep),
    VtepRemove {
        node: String,
    },
    Encapsulation {
        ipip: bool,
        vxlan: bool,
        vxlan_v6: bool,
    },
    /// The service addresses of BGPConfiguration `default` (Calico's GlobalBGPConfigUpdate):
    /// what ServiceLoopPrevention protects.
    GlobalBgpConfig(ServiceCidrs),
    /// One port of a Kubernetes Service: its frontends and usable backends (Calico's
    /// ServiceUpdate carries the Service; margay sends what a proxy programs, per port).
    ServiceUpdate {
        id: crate::services::ServicePortId,
        service: Arc<crate::services::ServicePort>,
    },
    ServiceRemove {
        id: crate::services::ServicePortId,
    },
}

/// Service address ranges a cluster advertises (BGPConfiguration `serviceClusterIPs`,
/// `serviceExternalIPs`, `serviceLoadBalancerIPs`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct ServiceCidrs {
    pub cluster: Vec<Cidr>,
    pub external: Vec<Cidr>,
    pub load_balancer: Vec<Cidr>,
}

impl ServiceCidrs {
    /// The ranges of a BGPConfiguration spec; a CIDR that does not parse is an error naming it.
    pub fn of(spec: &margay_api::bgp::BGPConfigurationSpec) -> Result<ServiceCidrs, String> {
        let parse = |field: &str, blocks: &[margay_api::bgp::CidrBlock]| {
            blocks
                .iter()
                .map(|b| {
                    Cidr::parse(&b.cidr)
                        .map(|c| c.network())
                        .map_err(|e| format!("{field}: {:?}: {e}", b.cidr))
                })
                .collect::<Result<Vec<Cidr>, String>>()
        };
        Ok(ServiceCidrs {
            cluster: parse("serviceClusterIPs", &spec.service_cluster_ips)?,
            external: parse("serviceExternalIPs", &spec.service_external_ips)?,
            load_balancer: parse("serviceLoadBalancerIPs", &spec.service_load_balancer_ips)?,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.cluster.is_empty() && self.external.is_empty() && self.load_balancer.is_empty()
    }

    /// Every range.
    pub fn all(&self) -> impl Iterator<Item = &Cidr> {
        self.cluster
            .iter()
            .chain(&self.external)
            .chain(&self.load_balancer)
    }
}

impl Message {
    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::InSync => "InSync",
            Message::ConfigUpdate { .. } => "ConfigUpdate",
            Message::IpSetUpdate { .. } => "IPSetUpdate",
            Message::IpSetDeltaUpdate { .. } => "IPSetDeltaUpdate",
            Message::IpSetRemove { .. } => "IPSetRemove",
            Message::ActiveProfileUpdate { .. } => "ActiveProfileUpdate",
            Message::ActiveProfileRemove { .. } => "ActiveProfileRemove",
            Message::ActivePolicyUpdate { .. } => "ActivePolicyUpdate",
            Message::ActivePolicyRemove { .. } => "ActivePolicyRemove",
            Message::WorkloadEndpointUpdate { .. } => "WorkloadEndpointUpdate",
            Message::WorkloadEndpointRemove { .. } => "WorkloadEndpointRemove",
            Message::HostEndpointUpdate { .. } => "HostEndpointUpdate",
            Message::HostEndpointRemove { .. } => "HostEndpointRemove",
            Message::HostMetadataUpdate { .. } => "HostMetadataUpdate",
            Message::HostMetadataRemove { .. } => "HostMetadataRemove",
            Message::IpamPoolUpdate { .. } => "IPAMPoolUpdate",
            Message::IpamPoolRemove { .. } => "IPAMPoolRemove",
            Message::NamespaceUpdate { .. } => "NamespaceUpdate",
            Message::NamespaceRemove { .. } => "NamespaceRemove",
            Message::ServiceAccountUpdate { .. } => "ServiceAccountUpdate",
            Message::ServiceAccountRemove { .. } => "ServiceAccountRemove",
            Message::RouteUpdate(_) => "RouteUpdate",
            Message::RouteRemove { .. } => "RouteRemove",
            Message::VtepUpdate(_) => "VXLANTunnelEndpointUpdate",
            Message::VtepRemove { .. } => "VXLANTunnelEndpointRemove",
            Message::Encapsulation { .. } => "Encapsulation",
            Message::GlobalBgpConfig(_) => "GlobalBGPConfigUpdate",
            Message::ServiceUpdate { .. } => "ServiceUpdate",
            Message::ServiceRemove { .. } => "ServiceRemove",
        }
    }
}
