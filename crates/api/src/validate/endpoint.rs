//! Rules of Node, HostEndpoint and WorkloadEndpoint.

use crate::endpoint::{HostEndpointSpec, NodeSpec, WorkloadEndpointSpec};
use crate::net::Cidr;
use crate::numorstring::Protocol;

use super::syntax::{is_container_id, is_interface_name, is_mac, port_name};
use super::{Path, Validator};

pub(super) fn node(v: &mut Validator, p: Path<'_>, s: &NodeSpec) {
    if let Some(bgp) = &s.bgp {
        let bp = p.field("bgp");
        if bgp == &crate::endpoint::NodeBgpSpec::default() {
            v.err(
                bp,
                "must not be empty (remove it, or set ipv4Address/ipv6Address)",
            );
        }
        cidr_of_family(v, &bgp.ipv4_address, bp.field("ipv4Address"), 4);
        cidr_of_family(v, &bgp.ipv6_address, bp.field("ipv6Address"), 6);
        v.ip(
            &bgp.ipv4_ipip_tunnel_addr,
            bp.field("ipv4IPIPTunnelAddr"),
            Some(4),
        );
        v.ip(
            &bgp.route_reflector_cluster_id,
            bp.field("routeReflectorClusterID"),
            Some(4),
        );
    }
    v.ip(
        &s.ipv4_vxlan_tunnel_addr,
        p.field("ipv4VXLANTunnelAddr"),
        Some(4),
    );
    v.ip(
        &s.ipv6_vxlan_tunnel_addr,
        p.field("ipv6VXLANTunnelAddr"),
        Some(6),
    );
    mac(v, &s.vxlan_tunnel_mac_addr, p.field("vxlanTunnelMACAddr"));
    mac(
        v,
        &s.vxlan_tunnel_mac_addr_v6,
        p.field("vxlanTunnelMACAddrV6"),
    );
    if let Some(wg) = &s.wireguard {
        let wp = p.field("wireguard");
        v.ip(
            &wg.interface_ipv4_address,
            wp.field("interfaceIPv4Address"),
            Some(4),
        );
        v.ip(
            &wg.interface_ipv6_address,
            wp.field("interfaceIPv6Address"),
            Some(6),
        );
    }
    let ap = p.field("addresses");
    for (i, a) in s.addresses.iter().enumerate() {
        let ip = ap.index(i);
        if a.address.is_empty() {
            v.err(ip.field("address"), "required");
        } else if let Err(e) = Cidr::parse_cidr_or_ip(&a.address) {
            // Addresses carry the interface's prefix (10.0.0.5/24), so host bits are expected.
            v.err(ip.field("address"), e);
        }
        v.one_of(
            (!a.type_.is_empty()).then_some(a.type_.as_str()),
            ip.field("type"),
            &["CalicoNodeIP", "InternalIP", "ExternalIP"],
        );
    }
    let ip = p.field("interfaces");
    for (i, iface) in s.interfaces.iter().enumerate() {
        if !iface.name.is_empty() && !is_interface_name(&iface.name) {
            v.err(
                ip.index(i).field("name"),
                super::syntax::interface_name_message(&iface.name),
            );
        }
        for (j, a) in iface.addresses.iter().enumerate() {
            if let Err(e) = Cidr::parse_cidr_or_ip(a) {
                v.err(ip.index(i).field("addresses").index(j), e);
            }
        }
    }
}

fn cidr_of_family(v: &mut Validator, value: &str, p: Path<'_>, version: u8) {
    if value.is_empty() {
        return;
    }
    match Cidr::parse_cidr_or_ip(value) {
        Ok(c) if c.version() == version => {}
        Ok(_) => v.err(p, format!("{value:?} is not an IPv{version} address")),
        Err(e) => v.err(p, e),
    }
}

fn mac(v: &mut Validator, value: &str, p: Path<'_>) {
    if !value.is_empty() && !is_mac(value) {
        v.err(
            p,
            format!("{value:?} is not a valid MAC address (expected e.g. ee:ee:ee:ee:ee:ee)"),
        );
    }
}

fn ports_protocol(v: &mut Validator, p: Path<'_>, proto: &Protocol) {
    if !proto.is_known() {
        v.err(
            p,
            format!("{proto} is not a protocol (use TCP, UDP or SCTP)"),
        );
    } else if !proto.supports_ports() {
        v.err(
            p,
            format!("protocol {proto} has no ports (use TCP, UDP or SCTP)"),
        );
    }
}

pub(super) fn host_endpoint(v: &mut Validator, p: Path<'_>, s: &HostEndpointSpec) {
    if s.node.is_empty() {
        v.err(
            p.field("node"),
            "required: the node this endpoint belongs to",
        );
    } else {
        v.dns_name(&s.node, p.field("node"));
    }
    if s.interface_name.is_empty() && s.expected_ips.is_empty() {
        v.err(
            p.field("interfaceName"),
            "set interfaceName (or \"*\" for all host interfaces) or expectedIPs, or both",
        );
    }
    if !s.interface_name.is_empty()
        && s.interface_name != "*"
        && !is_interface_name(&s.interface_name)
    {
        v.err(
            p.field("interfaceName"),
            super::syntax::interface_name_message(&s.interface_name),
        );
    }
    let ep = p.field("expectedIPs");
    for (i, ip) in s.expected_ips.iter().enumerate() {
        v.ip(ip, ep.index(i), None);
    }
    let pp = p.field("profiles");
    for (i, prof) in s.profiles.iter().enumerate() {
        v.dns_name(prof, pp.index(i));
    }
    let portp = p.field("ports");
    for (i, port) in s.ports.iter().enumerate() {
        let ip = portp.index(i);
        if let Err(e) = port_name(&port.name) {
            v.err(ip.field("name"), e);
        }
        ports_protocol(v, ip.field("protocol"), &port.protocol);
        v.range(Some(port.port), ip.field("port"), 1, 65535);
    }
}

pub(super) fn workload_endpoint(
    v: &mut Validator,
    p: Path<'_>,
    name_path: Path<'_>,
    name: &str,
    s: &WorkloadEndpointSpec,
) {
    // An empty name is allowed: the datastore layer assigns the expected one.
    match s.expected_name() {
        Err((field, reason)) => v.err(p.field(field), reason),
        Ok(expected) if !name.is_empty() && name != expected => v.err(
            name_path,
            format!("{name:?} does not match the endpoint's node, orchestrator, pod/workload and endpoint (expected {expected:?}, or leave the name out)"),
        ),
        Ok(_) => {}
    }
    for (field, value) in [
        ("orchestrator", &s.orchestrator),
        ("workload", &s.workload),
        ("node", &s.node),
        ("pod", &s.pod),
        ("endpoint", &s.endpoint),
        ("serviceAccountName", &s.service_account_name),
    ] {
        v.dns_name(value, p.field(field));
    }
    if !s.container_id.is_empty() && !is_container_id(&s.container_id) {
        v.err(
            p.field("containerID"),
            format!("{:?} is not a valid container ID (letters, digits and '-', starting and ending alphanumeric)", s.container_id),
        );
    }
    let np = p.field("ipNetworks");
    let mut networks = Vec::new();
    for (i, n) in s.ip_networks.iter().enumerate() {
        match Cidr::parse_cidr_or_ip(n) {
            Ok(c) => {
                if !c.is_masked() {
                    v.err(np.index(i), format!("{n:?} has host bits set"));
                } else if c.size() != 1 {
                    v.err(
                        np.index(i),
                        format!("{n:?} holds more than one address (a workload's networks are /32 or /128)"),
                    );
                }
                networks.push(c);
            }
            Err(e) => v.err(np.index(i), e),
        }
    }
    let natp = p.field("ipNATs");
    for (i, nat) in s.ip_nats.iter().enumerate() {
        let ip = natp.index(i);
        let internal = nat.internal_ip.parse::<std::net::IpAddr>();
        let external = nat.external_ip.parse::<std::net::IpAddr>();
        match &internal {
            Err(_) => v.err(
                ip.field("internalIP"),
                format!("{:?} is not a valid IP address", nat.internal_ip),
            ),
            Ok(addr) if !networks.iter().any(|c| c.contains(*addr)) => v.err(
                ip.field("internalIP"),
                format!("{addr} is not one of the endpoint's ipNetworks"),
            ),
            Ok(_) => {}
        }
        match (&internal, &external) {
            (_, Err(_)) => v.err(
                ip.field("externalIP"),
                format!("{:?} is not a valid IP address", nat.external_ip),
            ),
            (Ok(a), Ok(b)) if a.is_ipv4() != b.is_ipv4() => v.err(
                ip.field("externalIP"),
                "internalIP and externalIP must be of the same IP family",
            ),
            _ => {}
        }
    }
    v.ip(&s.ipv4_gateway, p.field("ipv4Gateway"), Some(4));
    v.ip(&s.ipv6_gateway, p.field("ipv6Gateway"), Some(6));
    let pp = p.field("profiles");
    for (i, prof) in s.profiles.iter().enumerate() {
        v.dns_name(prof, pp.index(i));
    }
    if s.interface_name.is_empty() {
        v.err(
            p.field("interfaceName"),
            "required: the host-side interface of the workload, e.g. cali1234567890a",
        );
    } else if !is_interface_name(&s.interface_name) {
        v.err(
            p.field("interfaceName"),
            super::syntax::interface_name_message(&s.interface_name),
        );
    }
    mac(v, &s.mac, p.field("mac"));
    let portp = p.field("ports");
    for (i, port) in s.ports.iter().enumerate() {
        let ip = portp.index(i);
        if port.name.is_empty() {
            if port.host_port == 0 {
                v.err(ip.field("name"), "required unless hostPort is set");
            }
        } else if let Err(e) = port_name(&port.name) {
            v.err(ip.field("name"), e);
        }
        ports_protocol(v, ip.field("protocol"), &port.protocol);
        v.range(Some(port.port), ip.field("port"), 1, 65535);
        v.range(Some(port.host_port), ip.field("hostPort"), 0, 65535);
        if !port.host_ip.is_empty() {
            v.network(&port.host_ip, ip.field("hostIP"), None);
        }
    }
    v.cidr_list(
        Some(&s.allow_spoofed_source_prefixes),
        p.field("allowSpoofedSourcePrefixes"),
    );
    if let Some(q) = &s.qos_controls
        && let Some(d) = &q.dscp
        && d.value().is_none()
    {
        v.err(
            p.field("qosControls").field("dscp"),
            "not a valid DSCP value (0-63, or a name such as EF, AF11, CS1)",
        );
    }
}

pub(super) fn node_status(v: &mut Validator, p: Path<'_>, s: &crate::endpoint::NodeStatus) {
    for (field, key) in [
        ("wireguardPublicKey", &s.wireguard_public_key),
        ("wireguardPublicKeyV6", &s.wireguard_public_key_v6),
    ] {
        if !key.is_empty() && !is_wireguard_key(key) {
            v.err(
                p.field(field),
                format!("{key:?} is not a WireGuard public key (base64 of 32 bytes)"),
            );
        }
    }
    let cp = p.field("podCIDRs");
    for (i, c) in s.pod_cidrs.iter().enumerate() {
        if let Err(e) = Cidr::parse_cidr_or_ip(c) {
            v.err(cp.index(i), e);
        }
    }
}

fn is_wireguard_key(key: &str) -> bool {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(key)
        .is_ok_and(|bytes| bytes.len() == 32)
}
