//! Rules of FelixConfiguration: the schema's enumerations, ranges and patterns, and Calico's
//! cross-field checks.

use crate::felix::FelixConfigurationSpec;
use crate::net::Cidr;
use crate::numorstring::Port;

use super::syntax::{dns1123_label, is_interface_name};
use super::{Path, Validator};

pub(super) fn felix_configuration(
    v: &mut Validator,
    p: Path<'_>,
    name: &str,
    s: &FelixConfigurationSpec,
) {
    schema_rules(v, p, s);
    cross_field_rules(v, p, s);
    // `default` applies to every node and `node.<name>` to one: a selector would contradict that.
    if s.node_selector.is_some() && (name == "default" || name.starts_with("node.")) {
        v.err(
            p.field("nodeSelector"),
            format!("not allowed in the FelixConfiguration {name:?} (only in configurations that are neither \"default\" nor \"node.<name>\")"),
        );
    }
}

/// Enumerations, ranges, durations and patterns of the FelixConfiguration schema.
fn schema_rules(v: &mut Validator, p: Path<'_>, s: &FelixConfigurationSpec) {
    v.one_of(
        s.aws_src_dst_check.as_deref(),
        p.field("awsSrcDstCheck"),
        &["DoNothing", "Enable", "Disable"],
    );
    v.one_of(
        s.bpf_attach_type.as_deref(),
        p.field("bpfAttachType"),
        &["TC", "TCX", "Netkit"],
    );
    v.one_of(
        s.bpf_connect_time_load_balancing.as_deref(),
        p.field("bpfConnectTimeLoadBalancing"),
        &["TCP", "Enabled", "Disabled"],
    );
    v.one_of(
        s.bpf_conntrack_log_level.as_deref(),
        p.field("bpfConntrackLogLevel"),
        &["Off", "Debug"],
    );
    v.one_of(
        s.bpf_conntrack_mode.as_deref(),
        p.field("bpfConntrackMode"),
        &["Auto", "Userspace", "BPFProgram"],
    );
    v.cidr_list(
        s.bpf_dsr_optout_cidrs.as_deref(),
        p.field("bpfDSROptoutCIDRs"),
    );
    v.regex(
        s.bpf_data_iface_pattern.as_deref(),
        p.field("bpfDataIfacePattern"),
    );
    v.regex(
        s.bpf_disable_gro_for_ifaces.as_deref(),
        p.field("bpfDisableGROForIfaces"),
    );
    v.one_of_ci(
        s.bpf_enforce_rpf.as_deref(),
        p.field("bpfEnforceRPF"),
        &["Disabled", "Strict", "Loose"],
    );
    v.cidr_list(
        s.bpf_exclude_cidrs_from_nat.as_deref(),
        p.field("bpfExcludeCIDRsFromNAT"),
    );
    v.range(
        s.bpf_ext_to_service_connmark,
        p.field("bpfExtToServiceConnmark"),
        0,
        4294967295,
    );
    v.one_of_ci(
        s.bpf_external_service_mode.as_deref(),
        p.field("bpfExternalServiceMode"),
        &["Tunnel", "DSR"],
    );
    v.one_of(
        s.bpf_host_networked_nat_without_ctlb.as_deref(),
        p.field("bpfHostNetworkedNATWithoutCTLB"),
        &["Enabled", "Disabled"],
    );
    v.duration(&s.bpf_ip_frag_timeout, p.field("bpfIPFragTimeout"));
    v.one_of(
        s.bpf_jit_hardening.as_deref(),
        p.field("bpfJITHardening"),
        &["Auto", "Strict"],
    );
    v.range(
        s.bpf_kube_proxy_healthz_port,
        p.field("bpfKubeProxyHealthzPort"),
        0,
        65535,
    );
    v.duration(
        &s.bpf_kube_proxy_min_sync_period,
        p.field("bpfKubeProxyMinSyncPeriod"),
    );
    v.regex(
        s.bpf_l3_iface_pattern.as_deref(),
        p.field("bpfL3IfacePattern"),
    );
    v.one_of_ci(
        s.bpf_log_level.as_deref(),
        p.field("bpfLogLevel"),
        &["Off", "Info", "Debug"],
    );
    v.range(
        s.bpf_maglev_max_endpoints_per_service,
        p.field("bpfMaglevMaxEndpointsPerService"),
        1,
        3000,
    );
    v.range(
        s.bpf_maglev_max_services,
        p.field("bpfMaglevMaxServices"),
        1,
        3000,
    );
    v.range(
        s.bpf_map_size_conntrack_cleanup_queue,
        p.field("bpfMapSizeConntrackCleanupQueue"),
        1,
        i64::MAX,
    );
    v.one_of_ci(
        s.bpf_map_size_conntrack_scaling.as_deref(),
        p.field("bpfMapSizeConntrackScaling"),
        &["Disabled", "DoubleIfFull"],
    );
    v.one_of(
        s.bpf_overlay_host_source_ip.as_deref(),
        p.field("bpfOverlayHostSourceIP"),
        &["TunnelAddress", "HostAddress"],
    );
    v.one_of(
        s.bpf_profiling.as_deref(),
        p.field("bpfProfiling"),
        &["Enabled", "Disabled"],
    );
    v.one_of(
        s.bpf_redirect_to_peer.as_deref(),
        p.field("bpfRedirectToPeer"),
        &["Enabled", "Disabled"],
    );
    v.one_of_ci(
        s.chain_insert_mode.as_deref(),
        p.field("chainInsertMode"),
        &["Insert", "Append"],
    );
    v.duration(
        &s.dataplane_watchdog_timeout,
        p.field("dataplaneWatchdogTimeout"),
    );
    v.range(s.debug_port, p.field("debugPort"), 0, 65535);
    v.duration(
        &s.debug_simulate_calc_graph_hang_after,
        p.field("debugSimulateCalcGraphHangAfter"),
    );
    v.duration(
        &s.debug_simulate_dataplane_apply_delay,
        p.field("debugSimulateDataplaneApplyDelay"),
    );
    v.duration(
        &s.debug_simulate_dataplane_hang_after,
        p.field("debugSimulateDataplaneHangAfter"),
    );
    v.one_of_ci(
        s.default_endpoint_to_host_action.as_deref(),
        p.field("defaultEndpointToHostAction"),
        &["Drop", "Accept", "Return"],
    );
    v.duration(
        &s.endpoint_reporting_delay,
        p.field("endpointReportingDelay"),
    );
    v.feature_detect_override(
        s.feature_detect_override.as_deref(),
        p.field("featureDetectOverride"),
    );
    v.key_value_list(s.feature_gates.as_deref(), p.field("featureGates"));
    v.one_of(
        s.floating_ips.as_deref(),
        p.field("floatingIPs"),
        &["Enabled", "Disabled"],
    );
    v.duration(
        &s.flow_logs_flush_interval,
        p.field("flowLogsFlushInterval"),
    );
    v.one_of(
        s.flow_logs_local_reporter.as_deref(),
        p.field("flowLogsLocalReporter"),
        &["Disabled", "Enabled"],
    );
    v.one_of(
        s.flow_logs_policy_evaluation_mode.as_deref(),
        p.field("flowLogsPolicyEvaluationMode"),
        &["None", "Continuous"],
    );
    v.range(s.go_gc_threshold, p.field("goGCThreshold"), -1, i64::MAX);
    v.range(s.go_max_procs, p.field("goMaxProcs"), -1, i64::MAX);
    v.range(
        s.go_memory_limit_mb,
        p.field("goMemoryLimitMB"),
        -1,
        i64::MAX,
    );
    v.duration(
        &s.interface_refresh_interval,
        p.field("interfaceRefreshInterval"),
    );
    v.one_of(
        s.ip_forwarding.as_deref(),
        p.field("ipForwarding"),
        &["Enabled", "Disabled"],
    );
    v.duration(&s.ipsets_refresh_interval, p.field("ipsetsRefreshInterval"));
    v.one_of(
        s.iptables_backend.as_deref(),
        p.field("iptablesBackend"),
        &["Legacy", "NFT", "Auto"],
    );
    v.one_of_ci(
        s.iptables_filter_allow_action.as_deref(),
        p.field("iptablesFilterAllowAction"),
        &["Accept", "Return"],
    );
    v.one_of_ci(
        s.iptables_filter_deny_action.as_deref(),
        p.field("iptablesFilterDenyAction"),
        &["Drop", "Reject"],
    );
    v.duration(
        &s.iptables_lock_probe_interval,
        p.field("iptablesLockProbeInterval"),
    );
    v.one_of_ci(
        s.iptables_mangle_allow_action.as_deref(),
        p.field("iptablesMangleAllowAction"),
        &["Accept", "Return"],
    );
    v.range(
        s.iptables_mark_mask,
        p.field("iptablesMarkMask"),
        0,
        4294967295,
    );
    v.duration(
        &s.iptables_post_write_check_interval,
        p.field("iptablesPostWriteCheckInterval"),
    );
    v.duration(
        &s.iptables_refresh_interval,
        p.field("iptablesRefreshInterval"),
    );
    v.range(
        s.ipv4_elevated_route_priority,
        p.field("ipv4ElevatedRoutePriority"),
        1,
        2147483646,
    );
    v.range(
        s.ipv4_normal_route_priority,
        p.field("ipv4NormalRoutePriority"),
        1,
        2147483646,
    );
    v.range(
        s.ipv6_elevated_route_priority,
        p.field("ipv6ElevatedRoutePriority"),
        1,
        2147483646,
    );
    v.range(
        s.ipv6_normal_route_priority,
        p.field("ipv6NormalRoutePriority"),
        1,
        2147483646,
    );
    v.one_of(
        s.istio_ambient_mode.as_deref(),
        p.field("istioAmbientMode"),
        &["Enabled", "Disabled"],
    );
    v.duration(
        &s.live_migration_route_convergence_time,
        p.field("liveMigrationRouteConvergenceTime"),
    );
    v.one_of(
        s.local_subnet_l2_reachability.as_deref(),
        p.field("localSubnetL2Reachability"),
        &["Disabled", "PodsAndLoadBalancers"],
    );
    v.duration(
        &s.local_subnet_l2_reachability_refresh_interval,
        p.field("localSubnetL2ReachabilityRefreshInterval"),
    );
    v.range(
        s.log_action_rate_limit_burst,
        p.field("logActionRateLimitBurst"),
        0,
        9999,
    );
    v.regex(
        s.log_debug_filename_regex.as_deref(),
        p.field("logDebugFilenameRegex"),
    );
    v.one_of_ci(
        s.log_severity_file.as_deref(),
        p.field("logSeverityFile"),
        &["Trace", "Debug", "Info", "Warning", "Error", "Fatal"],
    );
    v.one_of_ci(
        s.log_severity_screen.as_deref(),
        p.field("logSeverityScreen"),
        &["Trace", "Debug", "Info", "Warning", "Error", "Fatal"],
    );
    v.one_of_ci(
        s.log_severity_sys.as_deref(),
        p.field("logSeveritySys"),
        &["Trace", "Debug", "Info", "Warning", "Error", "Fatal"],
    );
    v.regex(s.mtu_iface_pattern.as_deref(), p.field("mtuIfacePattern"));
    v.one_of(
        s.nat_outgoing_exclusions.as_deref(),
        p.field("natOutgoingExclusions"),
        &["IPPoolsOnly", "IPPoolsAndHostIPs"],
    );
    v.duration(&s.netlink_timeout, p.field("netlinkTimeout"));
    v.one_of_ci(
        s.nftables_filter_allow_action.as_deref(),
        p.field("nftablesFilterAllowAction"),
        &["Accept", "Return"],
    );
    v.one_of_ci(
        s.nftables_filter_deny_action.as_deref(),
        p.field("nftablesFilterDenyAction"),
        &["Drop", "Reject"],
    );
    v.regex(
        s.nftables_flow_table_data_iface_pattern.as_deref(),
        p.field("nftablesFlowTableDataIfacePattern"),
    );
    v.one_of(
        s.nftables_flow_table_offload.as_deref(),
        p.field("nftablesFlowTableOffload"),
        &["All", "Disabled"],
    );
    v.one_of_ci(
        s.nftables_mangle_allow_action.as_deref(),
        p.field("nftablesMangleAllowAction"),
        &["Accept", "Return"],
    );
    v.range(
        s.nftables_mark_mask,
        p.field("nftablesMarkMask"),
        0,
        4294967295,
    );
    v.one_of(
        s.nftables_mode.as_deref(),
        p.field("nftablesMode"),
        &["Disabled", "Enabled", "Auto"],
    );
    v.duration(
        &s.nftables_refresh_interval,
        p.field("nftablesRefreshInterval"),
    );
    v.one_of(
        s.program_cluster_routes.as_deref(),
        p.field("programClusterRoutes"),
        &[
            "Enabled",
            "Disabled",
            "EnabledIPIPOnly",
            "EnabledNoEncapOnly",
        ],
    );
    v.one_of(
        s.prometheus_metrics_client_auth.as_deref(),
        p.field("prometheusMetricsClientAuth"),
        &[
            "RequireAndVerifyClientCert",
            "RequireAnyClientCert",
            "VerifyClientCertIfGiven",
            "NoClientCert",
        ],
    );
    v.prometheus_host(
        s.prometheus_metrics_host.as_deref(),
        p.field("prometheusMetricsHost"),
    );
    v.duration(&s.reporting_interval, p.field("reportingInterval"));
    v.duration(&s.reporting_ttl, p.field("reportingTTL"));
    v.duration(&s.route_refresh_interval, p.field("routeRefreshInterval"));
    v.one_of_ci(
        s.route_source.as_deref(),
        p.field("routeSource"),
        &["WorkloadIPs", "CalicoIPAM"],
    );
    v.one_of(
        s.service_loop_prevention.as_deref(),
        p.field("serviceLoopPrevention"),
        &["Drop", "Reject", "Disabled"],
    );
    v.duration(
        &s.usage_reporting_initial_delay,
        p.field("usageReportingInitialDelay"),
    );
    v.duration(
        &s.usage_reporting_interval,
        p.field("usageReportingInterval"),
    );
    v.one_of(
        s.windows_manage_firewall_rules.as_deref(),
        p.field("windowsManageFirewallRules"),
        &["Enabled", "Disabled"],
    );
    v.interface_name(
        s.wireguard_interface_name.as_deref(),
        p.field("wireguardInterfaceName"),
    );
    v.interface_name(
        s.wireguard_interface_name_v6.as_deref(),
        p.field("wireguardInterfaceNameV6"),
    );
    v.duration(&s.wireguard_keep_alive, p.field("wireguardKeepAlive"));
    v.range(
        s.wireguard_listening_port,
        p.field("wireguardListeningPort"),
        1,
        65535,
    );
    v.range(
        s.wireguard_listening_port_v6,
        p.field("wireguardListeningPortV6"),
        1,
        65535,
    );
    v.range(
        s.wireguard_routing_rule_priority,
        p.field("wireguardRoutingRulePriority"),
        1,
        32765,
    );
    v.one_of(
        s.workload_source_spoofing.as_deref(),
        p.field("workloadSourceSpoofing"),
        &["Disabled", "Any"],
    );
    v.duration(&s.xdp_refresh_interval, p.field("xdpRefreshInterval"));
}

fn cross_field_rules(v: &mut Validator, p: Path<'_>, s: &FelixConfigurationSpec) {
    if let Some(sel) = &s.node_selector {
        v.selector(sel, p.field("nodeSelector"));
    }
    for (field, port) in [
        ("healthPort", s.health_port),
        ("prometheusMetricsPort", s.prometheus_metrics_port),
        ("metadataPort", s.metadata_port),
        ("vxlanPort", s.vxlan_port),
    ] {
        v.range(port, p.field(field), 0, 65535);
    }
    v.range(s.vxlan_vni, p.field("vxlanVNI"), 0, 16_777_215);
    v.range(
        s.device_route_protocol,
        p.field("deviceRouteProtocol"),
        0,
        255,
    );
    for (field, mtu) in [
        ("ipipMTU", s.ipip_mtu),
        ("vxlanMTU", s.vxlan_mtu),
        ("vxlanMTUV6", s.vxlan_mtu_v6),
        ("wireguardMTU", s.wireguard_mtu),
        ("wireguardMTUV6", s.wireguard_mtu_v6),
    ] {
        v.range(mtu, p.field(field), 0, 65535);
    }

    for (field, list) in [
        ("failsafeInboundHostPorts", &s.failsafe_inbound_host_ports),
        ("failsafeOutboundHostPorts", &s.failsafe_outbound_host_ports),
    ] {
        let lp = p.field(field);
        for (i, pp) in list.as_deref().unwrap_or_default().iter().enumerate() {
            let ip = lp.index(i);
            if !pp.protocol.is_empty()
                && !["TCP", "UDP", "SCTP"]
                    .iter()
                    .any(|x| x.eq_ignore_ascii_case(&pp.protocol))
            {
                v.err(
                    ip.field("protocol"),
                    format!("{:?} is not one of \"TCP\", \"UDP\", \"SCTP\"", pp.protocol),
                );
            }
            v.range(Some(pp.port), ip.field("port"), 0, 65535);
            if !pp.net.is_empty()
                && let Err(e) = Cidr::parse_cidr_or_ip(&pp.net)
            {
                v.err(ip.field("net"), e);
            }
        }
    }

    let hp = p.field("healthTimeoutOverrides");
    for (i, o) in s
        .health_timeout_overrides
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let ip = hp.index(i);
        let name_ok = !o.name.is_empty()
            && o.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b' ' | b'-'));
        if !name_ok {
            v.err(
                ip.field("name"),
                format!(
                    "{:?} is not a health reporter name (letters, digits, '_', '-', space)",
                    o.name
                ),
            );
        }
        v.duration_value(&o.timeout, ip.field("timeout"));
    }

    let rp = p.field("routeTableRanges");
    let mut tables: i64 = 0;
    for (i, r) in s
        .route_table_ranges
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let ip = rp.index(i);
        if r.min < 1 {
            v.err(
                ip,
                format!("min {} is out of range (route tables start at 1)", r.min),
            );
        }
        if r.min > r.max {
            v.err(ip, format!("min {} is greater than max {}", r.min, r.max));
        }
        if r.max > i64::from(u32::MAX) {
            v.err(
                ip,
                format!(
                    "max {} is above the highest route table {}",
                    r.max,
                    u32::MAX
                ),
            );
        }
        tables = tables.saturating_add((r.max - r.min + 1).max(0));
    }
    if tables > 0xffff {
        v.err(
            rp,
            format!("the ranges designate {tables} tables (max 65535)"),
        );
    }
    if s.route_table_range.is_some() && s.route_table_ranges.is_some() {
        v.err(
            p.field("routeTableRange"),
            "set routeTableRanges or the deprecated routeTableRange, not both",
        );
    }
    if let Some(r) = &s.route_table_range
        && !(r.min >= 1 && r.max >= r.min && r.max <= 250)
    {
        v.err(
            p.field("routeTableRange"),
            format!(
                "{}-{} is not a range of route table indices within 1..250",
                r.min, r.max
            ),
        );
    }

    if let Some(ranges) = &s.kube_node_port_ranges {
        let kp = p.field("kubeNodePortRanges");
        if ranges.len() > 7 {
            v.err(kp, format!("{} ranges (max 7)", ranges.len()));
        }
        for (i, port) in ranges.iter().enumerate() {
            if port.is_named() {
                v.err(kp.index(i), "node port ranges cannot be named ports");
            } else {
                super::policy::port_value(v, kp.index(i), port);
            }
        }
    }
    for (field, port) in [
        ("natPortRange", &s.nat_port_range),
        ("bpfPSNATPorts", &s.bpf_psnat_ports),
    ] {
        if let Some(port) = port {
            if let Port::Named(n) = port {
                v.err(
                    p.field(field),
                    format!("{n:?} is not a port range (expected \"min:max\")"),
                );
            } else {
                super::policy::port_value(v, p.field(field), port);
            }
        }
    }

    let ep = p.field("externalNodesList");
    for (i, c) in s
        .external_nodes_list
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        match Cidr::parse_cidr_or_ip(c) {
            Ok(cidr) if !cidr.is_ipv4() => v.err(
                ep.index(i),
                format!("{c:?} is IPv6; only IPv4 CIDRs are supported here"),
            ),
            Ok(_) => {}
            Err(e) => v.err(ep.index(i), e),
        }
    }
    if let Some(region) = s.openstack_region.as_deref().filter(|r| !r.is_empty()) {
        let max = 63 - "openstack-region-".len();
        if region.len() > max {
            v.err(
                p.field("openstackRegion"),
                format!("must be at most {max} characters"),
            );
        } else if let Err(e) = dns1123_label(region) {
            v.err(
                p.field("openstackRegion"),
                format!("must be a DNS label: {e}"),
            );
        }
    }
    for (field, value, version) in [
        ("natOutgoingAddress", &s.nat_outgoing_address, 4),
        (
            "deviceRouteSourceAddress",
            &s.device_route_source_address,
            4,
        ),
        (
            "deviceRouteSourceAddressIPv6",
            &s.device_route_source_address_ipv6,
            6,
        ),
    ] {
        if let Some(addr) = value {
            v.ip(addr, p.field(field), Some(version));
        }
    }
    if let Some(limit) = s.log_action_rate_limit.as_deref()
        && !log_rate_limit_ok(limit)
    {
        v.err(
            p.field("logActionRateLimit"),
            format!("{limit:?} is not a rate (expected N/second, N/minute, N/hour or N/day with N 1-9999)"),
        );
    }
    if let Some(prefix) = s.log_prefix.as_deref()
        && !prefix.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'%' | b':' | b' ' | b'/' | b'_' | b'-')
        })
    {
        v.err(
            p.field("logPrefix"),
            format!("{prefix:?} may only contain letters, digits and % : / _ - and space"),
        );
    }
    if let Some(filters) = &s.bpf_log_filters {
        let fp = p.field("bpfLogFilters");
        for k in filters.keys() {
            if !is_interface_name(k) {
                v.err(fp.key(k), super::syntax::interface_name_message(k));
            }
        }
    }
    if let Some(t) = &s.bpf_conntrack_timeouts {
        let tp = p.field("bpfConntrackTimeouts");
        for (field, value) in t.entries() {
            if let Some(val) = value
                && val != "Auto"
                && crate::duration::parse_go_duration(val).is_err()
            {
                v.err(
                    tp.field(field),
                    format!("{val:?} is not a duration or \"Auto\""),
                );
            }
        }
    }
    if let Some(d) = &s.istio_dscp_mark
        && d.value().is_none()
    {
        v.err(
            p.field("istioDSCPMark"),
            "not a valid DSCP value (0-63, or a name such as EF, AF11, CS1)",
        );
    }
    let iface_filter = |s: &str| {
        !s.is_empty()
            && s.len() <= 15
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'.' | b'_' | b'+' | b'-'))
    };
    if let Some(f) = s.iptables_nat_outgoing_interface_filter.as_deref()
        && !f.is_empty()
        && !iface_filter(f)
    {
        v.err(
            p.field("iptablesNATOutgoingInterfaceFilter"),
            format!("{f:?} is not an interface filter (1-15 of letters, digits, ':', '.', '_', '+', '-')"),
        );
    }
    let tp = p.field("bpfForceTrackPacketsFromIfaces");
    for (i, f) in s
        .bpf_force_track_packets_from_ifaces
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        if !iface_filter(f) {
            v.err(
                tp.index(i),
                format!("{f:?} is not an interface filter (1-15 of letters, digits, ':', '.', '_', '+', '-')"),
            );
        }
    }
}

/// `N/second|minute|hour|day` with N from 1 to 9999.
fn log_rate_limit_ok(s: &str) -> bool {
    let Some((n, unit)) = s.split_once('/') else {
        return false;
    };
    let n_ok = !n.is_empty()
        && n.len() <= 4
        && !n.starts_with('0')
        && n.bytes().all(|b| b.is_ascii_digit());
    n_ok && matches!(unit, "second" | "minute" | "hour" | "day")
}
