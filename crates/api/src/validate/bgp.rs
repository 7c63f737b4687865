//! Rules of BGPConfiguration, BGPPeer and BGPFilter.

use crate::bgp::{
    BGPConfigurationSpec, BGPFilterSpec, BGPPeerSpec, BgpFilterAction, BgpFilterRule, BgpPassword,
};

use super::{Path, Validator};

const ROUTE_PRIORITY_MAX: i64 = 2_147_483_646;

pub(super) fn bgp_configuration(
    v: &mut Validator,
    p: Path<'_>,
    name: &str,
    s: &BGPConfigurationSpec,
) {
    v.one_of_ci(
        Some(s.log_severity_screen.as_str()),
        p.field("logSeverityScreen"),
        &["Trace", "Debug", "Info", "Warning", "Error", "Fatal"],
    );
    for (field, blocks) in [
        ("serviceLoadBalancerIPs", &s.service_load_balancer_ips),
        ("serviceExternalIPs", &s.service_external_ips),
        ("serviceClusterIPs", &s.service_cluster_ips),
    ] {
        let fp = p.field(field);
        for (i, b) in blocks.iter().enumerate() {
            if !b.cidr.is_empty() {
                v.network(&b.cidr, fp.index(i).field("cidr"), None);
            }
        }
    }
    let cp = p.field("communities");
    if s.communities.len() > 500 {
        v.err(cp, "at most 500 communities");
    }
    for (i, c) in s.communities.iter().enumerate() {
        let ip = cp.index(i);
        if c.name.is_empty() {
            v.err(
                ip.field("name"),
                "required: a name to refer to this community by",
            );
        } else {
            v.dns_name(&c.name, ip.field("name"));
        }
        if c.value.is_empty() {
            v.err(
                ip.field("value"),
                "required: e.g. \"64512:100\" or \"64512:100:200\"",
            );
        } else if let Err(e) = community_value(&c.value) {
            v.err(ip.field("value"), e);
        }
    }
    let pp = p.field("prefixAdvertisements");
    for (i, pa) in s.prefix_advertisements.iter().enumerate() {
        let ip = pp.index(i);
        if pa.cidr.is_empty() {
            v.err(ip.field("cidr"), "required");
        } else {
            v.network(&pa.cidr, ip.field("cidr"), None);
        }
        if pa.communities.is_empty() {
            v.err(
                ip.field("communities"),
                "required: at least one community value or name",
            );
        }
        for (j, c) in pa.communities.iter().enumerate() {
            let defined = s.communities.iter().any(|d| &d.name == c);
            if !defined && community_value(c).is_err() {
                v.err(
                    ip.field("communities").index(j),
                    format!("{c:?} is neither a community value (\"AA:NN\" or \"AA:NN:MM\") nor the name of one in spec.communities"),
                );
            }
        }
    }
    if !s.communities.is_empty() && s.prefix_advertisements.is_empty() {
        v.err(
            cp,
            "communities are defined but no prefixAdvertisements use them",
        );
    }
    v.range(s.listen_port, p.field("listenPort"), 1, 65535);
    let mesh_disabled = s.node_to_node_mesh_enabled == Some(false);
    if let Some(pw) = &s.node_mesh_password {
        password(v, p.field("nodeMeshPassword"), pw);
        if mesh_disabled {
            v.err(
                p.field("nodeMeshPassword"),
                "cannot be set when nodeToNodeMeshEnabled is false",
            );
        }
    }
    if s.node_mesh_max_restart_time.is_some() && mesh_disabled {
        v.err(
            p.field("nodeMeshMaxRestartTime"),
            "cannot be set when nodeToNodeMeshEnabled is false",
        );
    }
    v.duration(
        &s.node_mesh_max_restart_time,
        p.field("nodeMeshMaxRestartTime"),
    );
    let ip = p.field("ignoredInterfaces");
    for (i, iface) in s.ignored_interfaces.iter().enumerate() {
        let ok = iface != "*"
            && !iface.is_empty()
            && iface.len() <= 15
            && iface
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'*' | b'-'));
        if !ok {
            v.err(
                ip.index(i),
                format!("{iface:?} is not a valid interface name or pattern (1-15 of letters, digits, '_', '.', '-', '*'; not just \"*\")"),
            );
        }
    }
    v.ip(
        &s.local_workload_peering_ipv4,
        p.field("localWorkloadPeeringIPV4"),
        Some(4),
    );
    v.ip(
        &s.local_workload_peering_ipv6,
        p.field("localWorkloadPeeringIPV6"),
        Some(6),
    );
    v.range(
        s.ipv4_normal_route_priority,
        p.field("ipv4NormalRoutePriority"),
        1,
        ROUTE_PRIORITY_MAX,
    );
    v.range(
        s.ipv6_normal_route_priority,
        p.field("ipv6NormalRoutePriority"),
        1,
        ROUTE_PRIORITY_MAX,
    );

    if name != "default" {
        let only_default = [
            (
                "nodeToNodeMeshEnabled",
                s.node_to_node_mesh_enabled.is_some(),
            ),
            ("asNumber", s.as_number.is_some()),
            (
                "serviceLoadBalancerIPs",
                !s.service_load_balancer_ips.is_empty(),
            ),
            ("serviceExternalIPs", !s.service_external_ips.is_empty()),
            ("serviceClusterIPs", !s.service_cluster_ips.is_empty()),
            ("nodeMeshPassword", s.node_mesh_password.is_some()),
            (
                "nodeMeshMaxRestartTime",
                s.node_mesh_max_restart_time.is_some(),
            ),
        ];
        for (field, set) in only_default {
            if set {
                v.err(
                    p.field(field),
                    format!(
                        "can only be set in the BGPConfiguration named \"default\", not {name:?}"
                    ),
                );
            }
        }
    }
}

pub(super) fn bgp_peer(v: &mut Validator, p: Path<'_>, s: &BGPPeerSpec) {
    if !s.node.is_empty() {
        v.dns_name(&s.node, p.field("node"));
    }
    v.selector(&s.node_selector, p.field("nodeSelector"));
    v.selector(&s.peer_selector, p.field("peerSelector"));
    v.selector(&s.local_workload_selector, p.field("localWorkloadSelector"));
    if !s.node.is_empty() && !s.node_selector.is_empty() {
        v.err(
            p.field("nodeSelector"),
            "node and nodeSelector cannot both be set",
        );
    }
    let peer_ip = if s.peer_ip.is_empty() {
        None
    } else {
        match parse_ip_port(&s.peer_ip) {
            Ok(ip) => Some(ip),
            Err(e) => {
                v.err(p.field("peerIP"), e);
                None
            }
        }
    };
    if !s.peer_ip.is_empty() && !s.peer_selector.is_empty() {
        v.err(
            p.field("peerSelector"),
            "peerIP and peerSelector cannot both be set",
        );
    }
    let as_set = s.as_number.is_some_and(|a| a.0 != 0);
    if !s.peer_selector.is_empty() && as_set {
        v.err(
            p.field("asNumber"),
            "must be empty when peerSelector is set (the selected nodes' AS numbers are used)",
        );
    }
    if !s.local_workload_selector.is_empty() {
        if !s.peer_ip.is_empty() {
            v.err(
                p.field("peerIP"),
                "must be empty when localWorkloadSelector is set",
            );
        }
        if !s.peer_selector.is_empty() {
            v.err(
                p.field("peerSelector"),
                "must be empty when localWorkloadSelector is set",
            );
        }
        if !as_set {
            v.err(
                p.field("asNumber"),
                "required when localWorkloadSelector is set",
            );
        }
    }
    if !s.reachable_by.is_empty() {
        let rp = p.field("reachableBy");
        match s.reachable_by.parse::<std::net::IpAddr>() {
            Err(_) => v.err(
                rp,
                format!("{:?} is not a valid IP address", s.reachable_by),
            ),
            Ok(r) => {
                if s.peer_ip.is_empty() {
                    v.err(rp, "must be empty when peerIP is empty");
                } else if let Some(peer) = peer_ip
                    && peer.is_ipv4() != r.is_ipv4()
                {
                    v.err(rp, "reachableBy and peerIP must be of the same IP family");
                }
            }
        }
    }
    if s.keep_original_next_hop && s.next_hop_mode.is_some() {
        v.err(
            p.field("nextHopMode"),
            "keepOriginalNextHop and nextHopMode cannot both be set (keepOriginalNextHop is deprecated; use nextHopMode: Keep)",
        );
    }
    if let Some(pw) = &s.password {
        password(v, p.field("password"), pw);
    }
    v.duration(&s.max_restart_time, p.field("maxRestartTime"));
    v.duration(&s.keepalive_time, p.field("keepaliveTime"));
    v.range(s.ttl_security, p.field("ttlSecurity"), 0, 255);
    v.range(
        s.num_allowed_local_as_numbers,
        p.field("numAllowedLocalASNumbers"),
        0,
        i64::from(i32::MAX),
    );
    let fp = p.field("filters");
    for (i, f) in s.filters.iter().enumerate() {
        v.dns_name(f, fp.index(i));
    }
}

pub(super) fn bgp_filter(v: &mut Validator, p: Path<'_>, s: &BGPFilterSpec) {
    for (field, rules, version) in [
        ("exportV4", &s.export_v4, 4u8),
        ("importV4", &s.import_v4, 4),
        ("exportV6", &s.export_v6, 6),
        ("importV6", &s.import_v6, 6),
    ] {
        let lp = p.field(field);
        for (i, r) in rules.iter().enumerate() {
            filter_rule(v, lp.index(i), r, version);
        }
    }
}

fn filter_rule(v: &mut Validator, p: Path<'_>, r: &BgpFilterRule, version: u8) {
    let max_len: i64 = if version == 4 { 32 } else { 128 };
    if !r.cidr.is_empty() {
        v.network(&r.cidr, p.field("cidr"), Some(version));
    }
    if r.cidr.is_empty() != r.match_operator.is_none() {
        let field = if r.cidr.is_empty() {
            "cidr"
        } else {
            "matchOperator"
        };
        v.err(
            p.field(field),
            "cidr and matchOperator must both be set or both be empty",
        );
    }
    if let Some(pl) = &r.prefix_length {
        let pp = p.field("prefixLength");
        if r.cidr.is_empty() {
            v.err(p.field("cidr"), "required when prefixLength is set");
        }
        v.range(pl.min, pp.field("min"), 0, max_len);
        v.range(pl.max, pp.field("max"), 0, max_len);
        if let (Some(lo), Some(hi)) = (pl.min, pl.max)
            && lo > hi
        {
            v.err(pp, format!("min {lo} is greater than max {hi}"));
        }
    }
    if !r.interface.is_empty() {
        let ok = r.interface == "*"
            || (r.interface.len() <= 15
                && r.interface
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'*' | b'-')));
        if !ok {
            v.err(
                p.field("interface"),
                format!("{:?} is not a valid interface name or pattern (1-15 of letters, digits, '_', '.', '-', '*')", r.interface),
            );
        }
    }
    if let Some(c) = &r.communities {
        let cm = p.field("communities");
        let cp = cm.field("values");
        if c.values.is_empty() {
            v.err(cp, "required: one community value");
        }
        if c.values.len() > 1 {
            v.err(cp, "at most one community value");
        }
        for (i, val) in c.values.iter().enumerate() {
            if let Err(e) = community_value(val) {
                v.err(cp.index(i), e);
            }
        }
    }
    v.range(r.priority, p.field("priority"), 1, ROUTE_PRIORITY_MAX);
    let op = p.field("operations");
    if r.operations.len() > 10 {
        v.err(op, "at most 10 operations");
    }
    if !r.operations.is_empty() && r.action != BgpFilterAction::Accept {
        v.err(op, "operations may only be used with action Accept");
    }
    for (i, o) in r.operations.iter().enumerate() {
        let ip = op.index(i);
        let set = usize::from(o.add_community.is_some())
            + usize::from(o.prepend_as_path.is_some())
            + usize::from(o.set_priority.is_some());
        if set != 1 {
            v.err(
                ip,
                "each operation must set exactly one of addCommunity, prependASPath, setPriority",
            );
        }
        if let Some(ac) = &o.add_community {
            match &ac.value {
                None => v.err(ip.field("addCommunity").field("value"), "required"),
                Some(val) => {
                    if let Err(e) = community_value(val) {
                        v.err(ip.field("addCommunity").field("value"), e);
                    }
                }
            }
        }
        if let Some(pa) = &o.prepend_as_path {
            let pa_path = ip.field("prependASPath");
            let pp = pa_path.field("prefix");
            if pa.prefix.is_empty() {
                v.err(pp, "required: at least one AS number to prepend");
            }
            if pa.prefix.len() > 10 {
                v.err(pp, "at most 10 AS numbers");
            }
        }
        if let Some(sp) = &o.set_priority {
            let sp_path = ip.field("setPriority");
            let vp = sp_path.field("value");
            match sp.value {
                None => v.err(vp, "required"),
                Some(n) => v.range(Some(n), vp, 1, ROUTE_PRIORITY_MAX),
            }
        }
    }
}

fn password(v: &mut Validator, p: Path<'_>, pw: &BgpPassword) {
    if let Some(r) = &pw.secret_key_ref
        && r.key.is_empty()
    {
        v.err(
            p.field("secretKeyRef").field("key"),
            "required: the key of the Secret that holds the password",
        );
    }
}

/// A standard community `AA:NN` (16-bit parts) or a large community `AA:NN:MM` (32-bit parts).
pub(super) fn community_value(s: &str) -> Result<(), String> {
    let parts: Vec<&str> = s.split(':').collect();
    let bad = || {
        format!(
            "{s:?} is not a valid BGP community (expected \"AA:NN\" with 16-bit parts or \"AA:NN:MM\" with 32-bit parts)"
        )
    };
    let all_digits = parts
        .iter()
        .all(|x| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit()));
    if !all_digits {
        return Err(bad());
    }
    match parts.len() {
        2 if parts.iter().all(|x| x.parse::<u16>().is_ok()) => Ok(()),
        3 if parts.iter().all(|x| x.parse::<u32>().is_ok()) => Ok(()),
        _ => Err(bad()),
    }
}

/// `IP`, `IPv4:port` or `[IPv6]:port` (port 1-65535).
fn parse_ip_port(s: &str) -> Result<std::net::IpAddr, String> {
    let bad =
        || format!("{s:?} is not a valid peer address (expected an IP, IPv4:port or [IPv6]:port)");
    if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        return Ok(ip);
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once("]:").ok_or_else(bad)?;
        let ip: std::net::Ipv6Addr = h.parse().map_err(|_| bad())?;
        (std::net::IpAddr::V6(ip), p)
    } else {
        let (h, p) = s.rsplit_once(':').ok_or_else(bad)?;
        let ip: std::net::Ipv4Addr = h.parse().map_err(|_| bad())?;
        (std::net::IpAddr::V4(ip), p)
    };
    match port.parse::<u16>() {
        Ok(n) if n >= 1 => Ok(host),
        _ => Err(format!(
            "{s:?}: port {port:?} is not a valid port (1-65535)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn communities() {
        assert!(community_value("64512:100").is_ok());
        assert!(community_value("4200000000:1:2").is_ok());
        assert!(community_value("70000:1").is_err());
        assert!(community_value("1:2:3:4").is_err());
        assert!(community_value("a:b").is_err());
    }

    #[test]
    fn peer_addresses() {
        assert!(parse_ip_port("10.0.0.1").is_ok());
        assert!(parse_ip_port("10.0.0.1:179").is_ok());
        assert!(parse_ip_port("[fd00::1]:179").is_ok());
        assert!(parse_ip_port("fd00::1").is_ok());
        assert!(parse_ip_port("10.0.0.1:0").is_err());
        assert!(parse_ip_port("host:179").is_err());
    }
}
