//! The base chains every ruleset has (filter hooks, workload dispatch, NAT) and NAT-outgoing.

use super::*;

/// The postrouting rules that NAT traffic from `natOutgoing` pools leaving the pools (and,
/// with IPPoolsAndHostIPs, not going to a host), as Calico's NAT-outgoing chain: with a port
/// range, TCP and UDP get the range and everything else the plain translation.
pub fn nat_outgoing_rules(nat: &NatOutgoing, family: u8) -> Vec<String> {
    let fam = fam_prefix(family);
    let mut m = format!("{fam} saddr @masq-pools-{family} {fam} daddr != @all-pools-{family}");
    if nat.exclude_hosts {
        let _ = write!(m, " {fam} daddr != @all-hosts-{family}");
    }
    if let Some(oif) = &nat.oif {
        let _ = write!(m, " oifname \"{}\"", oif.replace('"', ""));
    }
    let ports = nat.port_range.map(|(lo, hi)| format!(":{lo}-{hi}"));
    // NATOutgoingAddress is an IPv4 address: IPv6 masquerades.
    let address = nat.address.filter(|_| family == 4);
    let action = |ports: Option<&str>| match address {
        Some(a) => format!("snat ip to {a}{} fully-random", ports.unwrap_or("")),
        None => match ports {
            Some(p) => format!("masquerade to {p} fully-random"),
            None => "masquerade fully-random".to_string(),
        },
    };
    let mut out = Vec::new();
    if let Some(p) = &ports {
        for proto in ["tcp", "udp"] {
            out.push(format!("{m} meta l4proto {proto} {}", action(Some(p))));
        }
    }
    out.push(format!("{m} {}", action(None)));
    out
}

pub(super) fn base_chains(
    st: &mut NftState,
    cfg: &NftConfig,
    masquerade: bool,
    service_cidrs: bool,
    heps: HepHooks,
) {
    let deny = cfg.deny();
    let wl_match = |dir: &str| -> Vec<String> {
        cfg.workload_prefixes
            .iter()
            .map(|p| format!("{dir} \"{p}*\""))
            .collect()
    };
    // Established flows first: it is the one rule most packets evaluate. With offload on,
    // they go to the flowtable first (a flow only gets there once policy accepted it).
    let mut forward = Vec::new();
    if cfg.flow_offload {
        forward.push(format!(
            "ct state established,related flow add @{FLOWTABLE} comment \"offload established flows\""
        ));
    }
    forward.push("ct state established,related accept".to_string());
    if cfg.conntrack_invalid_drop {
        forward.push(format!("ct state invalid {deny}"));
    }
    // Host endpoints' applyOnForward policy: the ingress side before the workloads' chains
    // (to-wl accepts), the egress side after them (see host_endpoints.rs).
    if heps.any {
        forward.push("jump hep-fwd-in".to_string());
    }
    for m in wl_match("iifname") {
        forward.push(format!("{m} jump from-wl"));
    }
    for m in wl_match("oifname") {
        forward.push(format!("{m} jump to-wl"));
    }
    if heps.any {
        forward.push("jump hep-fwd-out".to_string());
    }
    // Service-loop prevention comes last: traffic to a service address that kube-proxy did
    // not translate would otherwise bounce between this host and its default route.
    if service_cidrs && cfg.service_loop != ServiceLoop::Disabled {
        let verdict = match cfg.service_loop {
            ServiceLoop::Reject => "reject",
            _ => "drop",
        };
        forward.push(format!(
            "ip daddr @{SET_SERVICE_CIDRS}-4 {verdict} comment \"service address not translated\""
        ));
        if cfg.ipv6 {
            forward.push(format!(
                "ip6 daddr @{SET_SERVICE_CIDRS}-6 {verdict} comment \"service address not translated\""
            ));
        }
    }
    st.chains.insert(
        "forward".into(),
        ChainSpec {
            base: Some("type filter hook forward priority filter; policy accept;".into()),
            rules: forward.into_iter().map(NftRule::new).collect(),
        },
    );
    let chain = |rules: Vec<String>| ChainSpec {
        base: None,
        rules: rules.into_iter().map(NftRule::new).collect(),
    };
    st.chains.insert(
        "from-wl".into(),
        chain(vec![
            format!("iifname != @{SET_WL_IFACES} {deny} comment \"unknown workload interface\""),
            format!("iifname vmap @{MAP_EGRESS}"),
        ]),
    );
    st.chains.insert(
        "to-wl".into(),
        chain(vec![
            format!("oifname != @{SET_WL_IFACES} {deny} comment \"unknown workload interface\""),
            format!("oifname vmap @{MAP_INGRESS}"),
        ]),
    );
    let mut to_host = Vec::new();
    if cfg.ipv6 {
        // Neighbour discovery and router solicitation must reach the host for IPv6 to work.
        to_host.push(
            "icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } accept"
                .to_string(),
        );
    }
    to_host.push(format!(
        "iifname != @{SET_WL_IFACES} {deny} comment \"unknown workload interface\""
    ));
    to_host.push(format!("iifname vmap @{MAP_EGRESS}"));
    to_host.push(
        match cfg.endpoint_to_host {
            EndpointToHostAction::Drop => "drop comment \"DefaultEndpointToHostAction\"",
            EndpointToHostAction::Accept => "accept",
            EndpointToHostAction::Return => "return",
        }
        .to_string(),
    );
    st.chains.insert("wl-to-host".into(), chain(to_host));
    let mut input = Vec::new();
    for m in wl_match("iifname") {
        if cfg.conntrack_invalid_drop {
            input.push(format!("{m} ct state invalid {deny}"));
        }
        input.push(format!("{m} ct state established,related accept"));
        input.push(format!("{m} jump wl-to-host"));
    }
    if let Some(port) = cfg.vxlan_port {
        // VXLAN only from the cluster's hosts (and ExternalNodesCIDRList).
        input.push(format!(
            "udp dport {port} ip saddr != @all-hosts-4 {deny} comment \"VXLAN from an unknown host\""
        ));
        if cfg.ipv6 {
            input.push(format!(
                "udp dport {port} ip6 saddr != @all-hosts-6 {deny} comment \"VXLAN from an unknown host\""
            ));
        } else {
            input.push(format!(
                "meta nfproto ipv6 udp dport {port} {deny} comment \"VXLAN from an unknown host\""
            ));
        }
    }
    let accepted = format!(
        "meta mark and {:#x} != 0 accept comment \"allowed by doNotTrack or preDNAT policy\"",
        cfg.mark_accept
    );
    if heps.any {
        // Host endpoint policy last: workloads, VXLAN from known hosts and what raw or mangle
        // accepted never reach it.
        if let Some(port) = cfg.vxlan_port {
            input.push(format!(
                "udp dport {port} accept comment \"VXLAN from a known host\""
            ));
        }
        input.push(accepted.clone());
        input.push("jump hep-in".to_string());
        let mut output = vec![accepted];
        for m in wl_match("oifname") {
            output.push(format!("{m} return"));
        }
        if let Some(port) = cfg.vxlan_port {
            output.push(format!(
                "udp dport {port} ip daddr @all-hosts-4 accept comment \"VXLAN to a known host\""
            ));
            if cfg.ipv6 {
                output.push(format!(
                    "udp dport {port} ip6 daddr @all-hosts-6 accept comment \"VXLAN to a known host\""
                ));
            }
        }
        output.push("jump hep-out".to_string());
        st.chains.insert(
            "output".into(),
            ChainSpec {
                base: Some("type filter hook output priority filter; policy accept;".into()),
                rules: output.into_iter().map(NftRule::new).collect(),
            },
        );
    }
    st.chains.insert(
        "input".into(),
        ChainSpec {
            base: Some("type filter hook input priority filter; policy accept;".into()),
            rules: input.into_iter().map(NftRule::new).collect(),
        },
    );
    let mut post = Vec::new();
    if masquerade {
        post.extend(nat_outgoing_rules(&cfg.nat, 4));
        if cfg.ipv6 {
            post.extend(nat_outgoing_rules(&cfg.nat, 6));
        }
    }
    st.chains.insert(
        "postrouting".into(),
        ChainSpec {
            base: Some("type nat hook postrouting priority srcnat; policy accept;".into()),
            rules: post.into_iter().map(NftRule::new).collect(),
        },
    );
}
