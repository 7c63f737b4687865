//! Felix's parameters as the Linux dataplane's settings (pure): which verdicts, marks, NAT,
//! logging and encapsulation rules the nftables renderer gets, and which routing, sysctl and
//! interface settings the driver gets. Each parameter margay acts on is read here and nowhere
//! else, so the tests below show that each one reaches the dataplane.

use std::net::IpAddr;

use margay_dataplane::linux::routing::RoutingConfig;
use margay_dataplane::nft::render::FailsafePort;
use margay_dataplane::nft::{
    AllowVerdict, DenyVerdict, EndpointToHostAction, NatOutgoing, NftConfig, ServiceLoop,
};
use margay_felix_config::Config;

/// The encapsulation in use (from the pools, or IpInIpEnabled/VXLANEnabled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encap {
    pub ipip: bool,
    pub vxlan: bool,
    pub vxlan_v6: bool,
}

/// Calico's interface wildcard (`+`, as in iptables) in nft's spelling (`*`).
pub fn nft_iface_pattern(p: &str) -> String {
    match p.strip_suffix('+') {
        Some(head) => format!("{head}*"),
        None => p.to_string(),
    }
}

/// The nftables renderer's settings. Fails on a mark mask with fewer than two bits.
pub fn nft_config(config: &Config, encap: Encap) -> Result<NftConfig, String> {
    // Two mark bits for policy verdicts: the lowest two of the mask.
    let mask = config.mark_mask();
    let accept = mask & mask.wrapping_neg();
    let rest = mask & !accept;
    let pass = rest & rest.wrapping_neg();
    if accept == 0 || pass == 0 {
        return Err(format!(
            "{} {mask:#x} must have at least two bits set (margay needs an accept and a pass bit)",
            if config.nftables_mode() {
                "NftablesMarkMask"
            } else {
                "IptablesMarkMask"
            }
        ));
    }
    let vxlan_port = u16::try_from(config.vxlan_port).unwrap_or(4789);
    Ok(NftConfig {
        table: "margay".into(),
        workload_prefixes: config
            .interface_prefixes()
            .into_iter()
            .map(str::to_string)
            .collect(),
        endpoint_to_host: match config
            .default_endpoint_to_host_action
            .to_ascii_uppercase()
            .as_str()
        {
            "ACCEPT" => EndpointToHostAction::Accept,
            "RETURN" => EndpointToHostAction::Return,
            _ => EndpointToHostAction::Drop,
        },
        mark_accept: accept,
        mark_pass: pass,
        ipv6: config.ipv6_support,
        vxlan_port: (encap.vxlan || encap.vxlan_v6).then_some(vxlan_port),
        workload_vxlan_port: (!config.allow_vxlan_packets_from_workloads).then_some(vxlan_port),
        drop_ipip_from_workloads: !config.allow_ipip_packets_from_workloads,
        log_prefix: config.log_prefix.clone(),
        log_rate: (!config.log_action_rate_limit.is_empty()).then(|| {
            (
                config.log_action_rate_limit.clone(),
                u32::try_from(config.log_action_rate_limit_burst).unwrap_or(5),
            )
        }),
        allow: if config.filter_allow_action().eq_ignore_ascii_case("RETURN") {
            AllowVerdict::Return
        } else {
            AllowVerdict::Accept
        },
        deny: if config.filter_deny_action().eq_ignore_ascii_case("REJECT") {
            DenyVerdict::Reject
        } else {
            DenyVerdict::Drop
        },
        conntrack_invalid_drop: !config.disable_conntrack_invalid_check,
        nat: NatOutgoing {
            exclude_hosts: config
                .nat_outgoing_exclusions
                .eq_ignore_ascii_case("IPPoolsAndHostIPs"),
            oif: (!config.iptables_nat_outgoing_interface_filter.is_empty())
                .then(|| nft_iface_pattern(&config.iptables_nat_outgoing_interface_filter)),
            port_range: config
                .nat_port_range
                .filter(|r| r.max > 0)
                .map(|r| (r.min, r.max)),
            address: match config.nat_outgoing_address {
                Some(IpAddr::V4(a)) => Some(a),
                _ => None,
            },
        },
        external_nodes: config.external_nodes_cidr_list.clone(),
        service_loop: match config.service_loop_prevention.to_ascii_lowercase().as_str() {
            "reject" => ServiceLoop::Reject,
            "disabled" => ServiceLoop::Disabled,
            _ => ServiceLoop::Drop,
        },
        // Turned on by the driver once it knows the kernel has flowtables.
        flow_offload: false,
        // FlowLogsLocalReporter: Felix keeps the flows for `margay flows` (the NFLOG rules
        // are rendered only then, as Calico renders none with flow logs off).
        flow_logs: config
            .flow_logs_local_reporter
            .eq_ignore_ascii_case("enabled")
            || config.flow_logs_file_enabled,
        failsafe_in: failsafe_ports(&config.failsafe_inbound_host_ports),
        failsafe_out: failsafe_ports(&config.failsafe_outbound_host_ports),
    })
}

/// FailsafeInboundHostPorts / FailsafeOutboundHostPorts as the renderer's entries.
fn failsafe_ports(ports: &[margay_felix_config::ProtoPort]) -> Vec<FailsafePort> {
    ports
        .iter()
        .map(|p| FailsafePort {
            protocol: match p.protocol {
                margay_felix_config::Protocol::Tcp => 6,
                margay_felix_config::Protocol::Udp => 17,
            },
            port: p.port,
            net: p.net,
        })
        .collect()
}

/// The MTUs Felix derives at start (Calico's MTU auto-detection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mtus {
    /// The smallest MTU of the host interfaces MTUIfacePattern matches.
    pub host: u32,
    pub vxlan: u32,
    pub vxlan_v6: u32,
    /// What pods get (written to the MTU file for the CNI plugin).
    pub pod: u32,
}

/// Which host interfaces count for the host MTU (MTUIfacePattern; unset matches none).
pub fn mtu_iface_matcher(config: &Config) -> Result<Option<regex::Regex>, String> {
    config
        .mtu_iface_pattern
        .as_deref()
        .map(|p| {
            regex::Regex::new(p)
                .map_err(|e| format!("MTUIfacePattern {p:?} is not a regular expression: {e}"))
        })
        .transpose()
}

/// The MTUs from the host's links (Calico: VXLANMTU/VXLANMTUV6 0 means the host's MTU minus
/// the overhead; pods get the smallest MTU of the encapsulations in use, or the host's).
pub fn mtus(
    config: &Config,
    encap: Encap,
    links: &[margay_dataplane::linux::netlink::Link],
) -> Result<(Mtus, Vec<String>), String> {
    use margay_dataplane::linux::mtu;
    let matcher = mtu_iface_matcher(config)?;
    let (host, used) = mtu::host_mtu(links, |n| matcher.as_ref().is_some_and(|r| r.is_match(n)));
    let configured = |v: i64| u32::try_from(v).unwrap_or(0);
    let vxlan = mtu::encap_mtu(configured(config.vxlan_mtu), host, mtu::VXLAN_OVERHEAD);
    let vxlan_v6 = mtu::encap_mtu(
        configured(config.vxlan_mtu_v6),
        host,
        mtu::VXLAN_V6_OVERHEAD,
    );
    let ipip = mtu::encap_mtu(configured(config.ip_in_ip_mtu), host, mtu::IPIP_OVERHEAD);
    let pod = mtu::pod_mtu(
        host,
        &[
            (encap.ipip, ipip),
            (encap.vxlan, vxlan),
            (encap.vxlan_v6, vxlan_v6),
        ],
    );
    Ok((
        Mtus {
            host,
            vxlan,
            vxlan_v6,
            pod,
        },
        used,
    ))
}

/// NFTablesFlowTableOffload `All`: the host interfaces to offload besides the workload
/// interfaces (NFTablesFlowTableDataIfacePattern matches); None when offload is off.
pub fn flowtable_devices(
    config: &Config,
    links: &[margay_dataplane::linux::netlink::Link],
) -> Result<Option<Vec<String>>, String> {
    if !config
        .nftables_flow_table_offload
        .eq_ignore_ascii_case("All")
    {
        return Ok(None);
    }
    let Some(p) = config.nftables_flow_table_data_iface_pattern.as_deref() else {
        return Ok(Some(Vec::new()));
    };
    let re = regex::Regex::new(p).map_err(|e| {
        format!("NFTablesFlowTableDataIfacePattern {p:?} is not a regular expression: {e}")
    })?;
    Ok(Some(
        links
            .iter()
            .filter(|l| re.is_match(&l.name))
            .map(|l| l.name.clone())
            .collect(),
    ))
}

/// Routes and VXLAN (None with RouteSyncDisabled: Felix then touches no route at all).
pub fn routing_config(config: &Config, hostname: &str) -> Option<RoutingConfig> {
    if config.route_sync_disabled {
        return None;
    }
    let mut routing = RoutingConfig::new(hostname);
    routing.ipv6 = config.ipv6_support;
    routing.vxlan.vni = u32::try_from(config.vxlan_vni).unwrap_or(4096);
    routing.vxlan.port = u16::try_from(config.vxlan_port).unwrap_or(4789);
    routing.vxlan.mtu = u32::try_from(config.vxlan_mtu).unwrap_or(0);
    routing.vxlan_v6.vni = routing.vxlan.vni;
    routing.vxlan_v6.port = routing.vxlan.port;
    routing.vxlan_v6.mtu = u32::try_from(config.vxlan_mtu_v6).unwrap_or(0);
    // Calico's ProgramNoEncapClusterRoutes: otherwise BIRD installs them.
    routing.program_noencap_routes = matches!(
        config.program_cluster_routes.as_str(),
        "Enabled" | "EnabledNoEncapOnly"
    );
    routing.source_v4 = config.device_route_source_address;
    routing.source_v6 = config.device_route_source_address_ipv6;
    Some(routing)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use margay_api::net::Cidr;
    use margay_felix_config::PortRange;

    use super::*;

    const NO_ENCAP: Encap = Encap {
        ipip: false,
        vxlan: false,
        vxlan_v6: false,
    };

    fn nft(f: impl FnOnce(&mut Config)) -> NftConfig {
        let mut c = Config::defaults().clone();
        f(&mut c);
        nft_config(&c, NO_ENCAP).unwrap()
    }

    #[test]
    fn defaults_are_calicos() {
        let n = nft(|_| {});
        assert_eq!(n.allow, AllowVerdict::Accept);
        assert_eq!(n.deny, DenyVerdict::Drop);
        assert_eq!((n.mark_accept, n.mark_pass), (0x10000, 0x20000));
        assert_eq!(n.workload_vxlan_port, Some(4789));
        assert!(n.drop_ipip_from_workloads);
        assert!(n.conntrack_invalid_drop);
        assert_eq!(n.log_prefix, "calico-packet");
        assert_eq!(n.log_rate, None);
        assert_eq!(n.nat, NatOutgoing::default());
        assert_eq!(n.service_loop, ServiceLoop::Drop);
        assert!(n.external_nodes.is_empty());
        assert_eq!(n.vxlan_port, None);
        assert_eq!(
            n.failsafe_in,
            margay_dataplane::nft::render::DEFAULT_FAILSAFE_IN.to_vec()
        );
        assert_eq!(
            n.failsafe_out,
            margay_dataplane::nft::render::DEFAULT_FAILSAFE_OUT.to_vec()
        );
    }

    #[test]
    fn failsafe_ports_reach_the_renderer() {
        let n = nft(|c| {
            c.failsafe_inbound_host_ports = vec![margay_felix_config::ProtoPort {
                protocol: margay_felix_config::Protocol::Udp,
                port: 4000,
                net: Some(Cidr::parse("10.0.0.0/8").unwrap()),
            }];
            c.failsafe_outbound_host_ports = Vec::new();
        });
        assert_eq!(
            n.failsafe_in,
            vec![FailsafePort {
                protocol: 17,
                port: 4000,
                net: Some(Cidr::parse("10.0.0.0/8").unwrap()),
            }]
        );
        assert!(n.failsafe_out.is_empty());
    }

    #[test]
    fn verdicts_follow_the_mode_calico_would_be_in() {
        // NFTablesMode Auto: the iptables parameters, as Calico in iptables mode.
        let n = nft(|c| {
            c.iptables_filter_deny_action = "REJECT".into();
            c.iptables_filter_allow_action = "RETURN".into();
        });
        assert_eq!(
            (n.allow, n.deny),
            (AllowVerdict::Return, DenyVerdict::Reject)
        );
        // ... and the nftables ones are not used then.
        let n = nft(|c| {
            c.nftables_filter_deny_action = "REJECT".into();
            c.nftables_filter_allow_action = "RETURN".into();
        });
        assert_eq!((n.allow, n.deny), (AllowVerdict::Accept, DenyVerdict::Drop));
        // NFTablesMode Enabled: the nftables ones.
        let n = nft(|c| {
            c.nftables_mode = "Enabled".into();
            c.nftables_filter_deny_action = "REJECT".into();
            c.iptables_filter_deny_action = "DROP".into();
            c.nftables_mark_mask = 0xc;
        });
        assert_eq!(n.deny, DenyVerdict::Reject);
        assert_eq!((n.mark_accept, n.mark_pass), (0x4, 0x8));
        let mut c = Config::defaults().clone();
        c.iptables_mark_mask = 0x100;
        assert!(
            nft_config(&c, NO_ENCAP)
                .unwrap_err()
                .contains("IptablesMarkMask")
        );
    }

    #[test]
    fn logging_parameters_reach_the_renderer() {
        let n = nft(|c| {
            c.log_prefix = "blocked %n".into();
            c.log_action_rate_limit = "10/second".into();
            c.log_action_rate_limit_burst = 3;
        });
        assert_eq!(n.log_prefix, "blocked %n");
        assert_eq!(n.log_rate, Some(("10/second".into(), 3)));
    }

    #[test]
    fn encapsulation_and_conntrack_switches_reach_the_renderer() {
        let n = nft(|c| {
            c.allow_vxlan_packets_from_workloads = true;
            c.allow_ipip_packets_from_workloads = true;
            c.disable_conntrack_invalid_check = true;
            c.vxlan_port = 8472;
        });
        assert_eq!(n.workload_vxlan_port, None);
        assert!(!n.drop_ipip_from_workloads);
        assert!(!n.conntrack_invalid_drop);
        let mut c = Config::defaults().clone();
        c.vxlan_port = 8472;
        let n = nft_config(
            &c,
            Encap {
                vxlan: true,
                ..NO_ENCAP
            },
        )
        .unwrap();
        assert_eq!(
            (n.vxlan_port, n.workload_vxlan_port),
            (Some(8472), Some(8472))
        );
    }

    #[test]
    fn nat_and_host_parameters_reach_the_renderer() {
        let n = nft(|c| {
            c.nat_outgoing_exclusions = "IPPoolsAndHostIPs".into();
            c.iptables_nat_outgoing_interface_filter = "eth+".into();
            c.nat_port_range = Some(PortRange {
                min: 40000,
                max: 41000,
            });
            c.nat_outgoing_address = Some("192.0.2.9".parse().unwrap());
            c.external_nodes_cidr_list = vec![Cidr::parse("198.51.100.0/24").unwrap()];
            c.service_loop_prevention = "Reject".into();
        });
        assert_eq!(
            n.nat,
            NatOutgoing {
                exclude_hosts: true,
                oif: Some("eth*".into()),
                port_range: Some((40000, 41000)),
                address: Some("192.0.2.9".parse().unwrap()),
            }
        );
        assert_eq!(n.external_nodes.len(), 1);
        assert_eq!(n.service_loop, ServiceLoop::Reject);
        assert_eq!(
            nft(|c| c.service_loop_prevention = "Disabled".into()).service_loop,
            ServiceLoop::Disabled
        );
    }

    #[test]
    fn route_parameters_reach_the_routing() {
        let mut c = Config::defaults().clone();
        c.device_route_source_address = Some("192.0.2.1".parse().unwrap());
        c.device_route_source_address_ipv6 = Some("2001:db8::1".parse().unwrap());
        let r = routing_config(&c, "n").unwrap();
        assert_eq!(r.source_v4, Some("192.0.2.1".parse().unwrap()));
        assert_eq!(r.source_v6, Some("2001:db8::1".parse().unwrap()));
        c.route_sync_disabled = true;
        assert!(routing_config(&c, "n").is_none());
        let _ = Duration::ZERO;
    }

    fn link(name: &str, mtu: u32) -> margay_dataplane::linux::netlink::Link {
        margay_dataplane::linux::netlink::Link {
            index: 1,
            name: name.into(),
            up: true,
            running: true,
            mtu,
            mac: Vec::new(),
            kind: None,
            vxlan: Vec::new(),
        }
    }

    #[test]
    fn mtu_follows_mtu_iface_pattern_and_the_encapsulation() {
        let links = [
            link("eth0", 1500),
            link("ens5", 1400),
            link("uplink0", 1300),
        ];
        let mut c = Config::defaults().clone();
        // The default pattern matches eth0 and ens5, not uplink0.
        let (m, used) = mtus(&c, NO_ENCAP, &links).unwrap();
        assert_eq!(used, vec!["eth0".to_string(), "ens5".to_string()]);
        assert_eq!(
            (m.host, m.pod, m.vxlan, m.vxlan_v6),
            (1400, 1400, 1350, 1330)
        );
        c.mtu_iface_pattern = Some("^uplink".into());
        let (m, _) = mtus(
            &c,
            Encap {
                vxlan: true,
                ..NO_ENCAP
            },
            &links,
        )
        .unwrap();
        assert_eq!((m.host, m.pod), (1300, 1250));
        // A configured VXLAN MTU wins; nothing matching gives Calico's 1460.
        c.mtu_iface_pattern = Some("^nothing$".into());
        c.vxlan_mtu = 1200;
        let (m, _) = mtus(
            &c,
            Encap {
                vxlan: true,
                ..NO_ENCAP
            },
            &links,
        )
        .unwrap();
        assert_eq!((m.host, m.vxlan, m.pod), (1460, 1200, 1200));
        c.mtu_iface_pattern = Some("(".into());
        assert!(
            mtus(&c, NO_ENCAP, &links)
                .unwrap_err()
                .contains("MTUIfacePattern")
        );
    }

    #[test]
    fn flowtable_offload_follows_its_parameters() {
        let links = [link("eth0", 1500), link("ens5", 1400), link("cali1", 1400)];
        let mut c = Config::defaults().clone();
        assert_eq!(flowtable_devices(&c, &links), Ok(None));
        c.nftables_flow_table_offload = "All".into();
        assert_eq!(flowtable_devices(&c, &links), Ok(Some(Vec::new())));
        c.nftables_flow_table_data_iface_pattern = Some("^e".into());
        assert_eq!(
            flowtable_devices(&c, &links),
            Ok(Some(vec!["eth0".to_string(), "ens5".to_string()]))
        );
    }

    #[test]
    fn iface_patterns_use_nfts_wildcard() {
        assert_eq!(nft_iface_pattern("eth+"), "eth*");
        assert_eq!(nft_iface_pattern("eth0"), "eth0");
    }
}
