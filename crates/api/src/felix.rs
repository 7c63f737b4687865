//! FelixConfiguration: the full documented field set of Calico's FelixConfigurationSpec.
//!
//! Every field is optional: unset means "take the value from a lower-priority source or the
//! default" (see the felix-config crate for how sources are merged). Enumerated string fields
//! stay strings here, because several of them are case-insensitive in Calico; validation checks
//! their values.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::duration::Duration;
use crate::numorstring::{Dscp, Port};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FelixConfigurationSpec {
    #[serde(
        rename = "allowIPIPPacketsFromWorkloads",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_ipip_packets_from_workloads: Option<bool>,
    #[serde(
        rename = "allowVXLANPacketsFromWorkloads",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_vxlan_packets_from_workloads: Option<bool>,
    #[serde(
        rename = "awsSrcDstCheck",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub aws_src_dst_check: Option<String>,
    #[serde(
        rename = "bpfAttachType",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_attach_type: Option<String>,
    #[serde(
        rename = "bpfCTLBLogFilter",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_ctlb_log_filter: Option<String>,
    #[serde(
        rename = "bpfConnectTimeLoadBalancing",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_connect_time_load_balancing: Option<String>,
    #[serde(
        rename = "bpfConnectTimeLoadBalancingEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_connect_time_load_balancing_enabled: Option<bool>,
    #[serde(
        rename = "bpfConntrackLogLevel",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_conntrack_log_level: Option<String>,
    #[serde(
        rename = "bpfConntrackMode",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_conntrack_mode: Option<String>,
    #[serde(
        rename = "bpfConntrackTimeouts",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_conntrack_timeouts: Option<BpfConntrackTimeouts>,
    #[serde(
        rename = "bpfDSROptoutCIDRs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_dsr_optout_cidrs: Option<Vec<String>>,
    #[serde(
        rename = "bpfDataIfacePattern",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_data_iface_pattern: Option<String>,
    #[serde(
        rename = "bpfDisableGROForIfaces",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_disable_gro_for_ifaces: Option<String>,
    #[serde(
        rename = "bpfDisableUnprivileged",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_disable_unprivileged: Option<bool>,
    #[serde(
        rename = "bpfEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_enabled: Option<bool>,
    #[serde(
        rename = "bpfEnforceRPF",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_enforce_rpf: Option<String>,
    #[serde(
        rename = "bpfExcludeCIDRsFromNAT",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_exclude_cidrs_from_nat: Option<Vec<String>>,
    #[serde(
        rename = "bpfExportBufferSizeMB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_export_buffer_size_mb: Option<i64>,
    #[serde(
        rename = "bpfExtToServiceConnmark",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_ext_to_service_connmark: Option<i64>,
    #[serde(
        rename = "bpfExternalServiceMode",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_external_service_mode: Option<String>,
    #[serde(
        rename = "bpfForceTrackPacketsFromIfaces",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_force_track_packets_from_ifaces: Option<Vec<String>>,
    #[serde(
        rename = "bpfHostConntrackBypass",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_host_conntrack_bypass: Option<bool>,
    #[serde(
        rename = "bpfHostNetworkedNATWithoutCTLB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_host_networked_nat_without_ctlb: Option<String>,
    #[serde(
        rename = "bpfIPFragTimeout",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_ip_frag_timeout: Option<Duration>,
    #[serde(
        rename = "bpfIPFragmentReassemblyEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_ip_fragment_reassembly_enabled: Option<bool>,
    #[serde(
        rename = "bpfJITHardening",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_jit_hardening: Option<String>,
    #[serde(
        rename = "bpfKubeProxyHealthzPort",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_kube_proxy_healthz_port: Option<i64>,
    #[serde(
        rename = "bpfKubeProxyIptablesCleanupEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_kube_proxy_iptables_cleanup_enabled: Option<bool>,
    #[serde(
        rename = "bpfKubeProxyMinSyncPeriod",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_kube_proxy_min_sync_period: Option<Duration>,
    #[serde(
        rename = "bpfL3IfacePattern",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_l3_iface_pattern: Option<String>,
    #[serde(
        rename = "bpfLogFilters",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_log_filters: Option<BTreeMap<String, String>>,
    #[serde(
        rename = "bpfLogLevel",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_log_level: Option<String>,
    #[serde(
        rename = "bpfMaglevMaxEndpointsPerService",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_maglev_max_endpoints_per_service: Option<i64>,
    #[serde(
        rename = "bpfMaglevMaxServices",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_maglev_max_services: Option<i64>,
    #[serde(
        rename = "bpfMapSizeConntrack",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_map_size_conntrack: Option<i64>,
    #[serde(
        rename = "bpfMapSizeConntrackCleanupQueue",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_map_size_conntrack_cleanup_queue: Option<i64>,
    #[serde(
        rename = "bpfMapSizeConntrackScaling",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_map_size_conntrack_scaling: Option<String>,
    #[serde(
        rename = "bpfMapSizeIPSets",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_map_size_ip_sets: Option<i64>,
    #[serde(
        rename = "bpfMapSizeIfState",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_map_size_if_state: Option<i64>,
    #[serde(
        rename = "bpfMapSizeNATAffinity",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_map_size_nat_affinity: Option<i64>,
    #[serde(
        rename = "bpfMapSizeNATBackend",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_map_size_nat_backend: Option<i64>,
    #[serde(
        rename = "bpfMapSizeNATFrontend",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_map_size_nat_frontend: Option<i64>,
    #[serde(
        rename = "bpfMapSizePerCpuConntrack",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_map_size_per_cpu_conntrack: Option<i64>,
    #[serde(
        rename = "bpfMapSizeRoute",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_map_size_route: Option<i64>,
    #[serde(
        rename = "bpfOverlayHostSourceIP",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_overlay_host_source_ip: Option<String>,
    #[serde(
        rename = "bpfPSNATPorts",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_psnat_ports: Option<Port>,
    #[serde(
        rename = "bpfPolicyDebugEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_policy_debug_enabled: Option<bool>,
    #[serde(
        rename = "bpfProfiling",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_profiling: Option<String>,
    #[serde(
        rename = "bpfRedirectToPeer",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bpf_redirect_to_peer: Option<String>,
    #[serde(
        rename = "cgroupV2Path",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cgroup_v2_path: Option<String>,
    #[serde(
        rename = "chainInsertMode",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub chain_insert_mode: Option<String>,
    #[serde(
        rename = "dataplaneDriver",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub dataplane_driver: Option<String>,
    #[serde(
        rename = "dataplaneWatchdogTimeout",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub dataplane_watchdog_timeout: Option<Duration>,
    #[serde(
        rename = "debugDisableLogDropping",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub debug_disable_log_dropping: Option<bool>,
    #[serde(rename = "debugHost", default, skip_serializing_if = "Option::is_none")]
    pub debug_host: Option<String>,
    #[serde(
        rename = "debugMemoryProfilePath",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub debug_memory_profile_path: Option<String>,
    #[serde(rename = "debugPort", default, skip_serializing_if = "Option::is_none")]
    pub debug_port: Option<i64>,
    #[serde(
        rename = "debugSimulateCalcGraphHangAfter",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub debug_simulate_calc_graph_hang_after: Option<Duration>,
    #[serde(
        rename = "debugSimulateDataplaneApplyDelay",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub debug_simulate_dataplane_apply_delay: Option<Duration>,
    #[serde(
        rename = "debugSimulateDataplaneHangAfter",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub debug_simulate_dataplane_hang_after: Option<Duration>,
    #[serde(
        rename = "defaultEndpointToHostAction",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub default_endpoint_to_host_action: Option<String>,
    #[serde(
        rename = "deviceRouteProtocol",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub device_route_protocol: Option<i64>,
    #[serde(
        rename = "deviceRouteSourceAddress",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub device_route_source_address: Option<String>,
    #[serde(
        rename = "deviceRouteSourceAddressIPv6",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub device_route_source_address_ipv6: Option<String>,
    #[serde(
        rename = "disableConntrackInvalidCheck",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub disable_conntrack_invalid_check: Option<bool>,
    #[serde(
        rename = "endpointReportingDelay",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub endpoint_reporting_delay: Option<Duration>,
    #[serde(
        rename = "endpointReportingEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub endpoint_reporting_enabled: Option<bool>,
    #[serde(
        rename = "endpointStatusPathPrefix",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub endpoint_status_path_prefix: Option<String>,
    #[serde(
        rename = "externalNodesList",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub external_nodes_list: Option<Vec<String>>,
    #[serde(
        rename = "failsafeInboundHostPorts",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub failsafe_inbound_host_ports: Option<Vec<ProtoPort>>,
    #[serde(
        rename = "failsafeOutboundHostPorts",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub failsafe_outbound_host_ports: Option<Vec<ProtoPort>>,
    #[serde(
        rename = "featureDetectOverride",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub feature_detect_override: Option<String>,
    #[serde(
        rename = "featureGates",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub feature_gates: Option<String>,
    #[serde(
        rename = "floatingIPs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub floating_ips: Option<String>,
    #[serde(
        rename = "flowLogsCollectorDebugTrace",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub flow_logs_collector_debug_trace: Option<bool>,
    #[serde(
        rename = "flowLogsFlushInterval",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub flow_logs_flush_interval: Option<Duration>,
    #[serde(
        rename = "flowLogsGoldmaneServer",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub flow_logs_goldmane_server: Option<String>,
    #[serde(
        rename = "flowLogsLocalReporter",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub flow_logs_local_reporter: Option<String>,
    /// Calico Enterprise's flow log file settings, which margay also reads.
    #[serde(
        rename = "flowLogsFileEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub flow_logs_file_enabled: Option<bool>,
    #[serde(
        rename = "flowLogsFileDirectory",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub flow_logs_file_directory: Option<String>,
    #[serde(
        rename = "flowLogsFileMaxFiles",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub flow_logs_file_max_files: Option<i64>,
    #[serde(
        rename = "flowLogsFileMaxFileSizeMB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub flow_logs_file_max_file_size_mb: Option<i64>,
    #[serde(
        rename = "flowLogsPolicyEvaluationMode",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub flow_logs_policy_evaluation_mode: Option<String>,
    #[serde(
        rename = "genericXDPEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub generic_xdp_enabled: Option<bool>,
    #[serde(
        rename = "goGCThreshold",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub go_gc_threshold: Option<i64>,
    #[serde(
        rename = "goMaxProcs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub go_max_procs: Option<i64>,
    #[serde(
        rename = "goMemoryLimitMB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub go_memory_limit_mb: Option<i64>,
    #[serde(
        rename = "healthEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub health_enabled: Option<bool>,
    #[serde(
        rename = "healthHost",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub health_host: Option<String>,
    #[serde(
        rename = "healthPort",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub health_port: Option<i64>,
    #[serde(
        rename = "healthTimeoutOverrides",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub health_timeout_overrides: Option<Vec<HealthTimeoutOverride>>,
    #[serde(
        rename = "interfaceExclude",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub interface_exclude: Option<String>,
    #[serde(
        rename = "interfacePrefix",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub interface_prefix: Option<String>,
    #[serde(
        rename = "interfaceRefreshInterval",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub interface_refresh_interval: Option<Duration>,
    #[serde(
        rename = "ipForwarding",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ip_forwarding: Option<String>,
    #[serde(
        rename = "ipipEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ipip_enabled: Option<bool>,
    #[serde(rename = "ipipMTU", default, skip_serializing_if = "Option::is_none")]
    pub ipip_mtu: Option<i64>,
    #[serde(
        rename = "ipsetsRefreshInterval",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ipsets_refresh_interval: Option<Duration>,
    #[serde(
        rename = "iptablesBackend",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub iptables_backend: Option<String>,
    #[serde(
        rename = "iptablesFilterAllowAction",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub iptables_filter_allow_action: Option<String>,
    #[serde(
        rename = "iptablesFilterDenyAction",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub iptables_filter_deny_action: Option<String>,
    #[serde(
        rename = "iptablesLockProbeInterval",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub iptables_lock_probe_interval: Option<Duration>,
    #[serde(
        rename = "iptablesMangleAllowAction",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub iptables_mangle_allow_action: Option<String>,
    #[serde(
        rename = "iptablesMarkMask",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub iptables_mark_mask: Option<i64>,
    #[serde(
        rename = "iptablesNATOutgoingInterfaceFilter",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub iptables_nat_outgoing_interface_filter: Option<String>,
    #[serde(
        rename = "iptablesPostWriteCheckInterval",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub iptables_post_write_check_interval: Option<Duration>,
    #[serde(
        rename = "iptablesRefreshInterval",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub iptables_refresh_interval: Option<Duration>,
    #[serde(
        rename = "ipv4ElevatedRoutePriority",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ipv4_elevated_route_priority: Option<i64>,
    #[serde(
        rename = "ipv4NormalRoutePriority",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ipv4_normal_route_priority: Option<i64>,
    #[serde(
        rename = "ipv6ElevatedRoutePriority",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ipv6_elevated_route_priority: Option<i64>,
    #[serde(
        rename = "ipv6NormalRoutePriority",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ipv6_normal_route_priority: Option<i64>,
    #[serde(
        rename = "ipv6Support",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ipv6_support: Option<bool>,
    #[serde(
        rename = "istioAmbientMode",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub istio_ambient_mode: Option<String>,
    #[serde(
        rename = "istioDSCPMark",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub istio_dscp_mark: Option<Dscp>,
    #[serde(
        rename = "kubeNodePortRanges",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub kube_node_port_ranges: Option<Vec<Port>>,
    #[serde(
        rename = "liveMigrationRouteConvergenceTime",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub live_migration_route_convergence_time: Option<Duration>,
    #[serde(
        rename = "localSubnetL2Reachability",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub local_subnet_l2_reachability: Option<String>,
    #[serde(
        rename = "localSubnetL2ReachabilityRefreshInterval",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub local_subnet_l2_reachability_refresh_interval: Option<Duration>,
    #[serde(
        rename = "logActionRateLimit",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub log_action_rate_limit: Option<String>,
    #[serde(
        rename = "logActionRateLimitBurst",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub log_action_rate_limit_burst: Option<i64>,
    #[serde(
        rename = "logDebugFilenameRegex",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub log_debug_filename_regex: Option<String>,
    #[serde(
        rename = "logFilePath",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub log_file_path: Option<String>,
    #[serde(rename = "logPrefix", default, skip_serializing_if = "Option::is_none")]
    pub log_prefix: Option<String>,
    #[serde(
        rename = "logSeverityFile",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub log_severity_file: Option<String>,
    #[serde(
        rename = "logSeverityScreen",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub log_severity_screen: Option<String>,
    #[serde(
        rename = "logSeveritySys",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub log_severity_sys: Option<String>,
    #[serde(
        rename = "maxIpsetSize",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_ipset_size: Option<i64>,
    #[serde(
        rename = "metadataAddr",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub metadata_addr: Option<String>,
    #[serde(
        rename = "metadataPort",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub metadata_port: Option<i64>,
    #[serde(
        rename = "mtuIfacePattern",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub mtu_iface_pattern: Option<String>,
    #[serde(
        rename = "natOutgoingAddress",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub nat_outgoing_address: Option<String>,
    #[serde(
        rename = "natOutgoingExclusions",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub nat_outgoing_exclusions: Option<String>,
    #[serde(
        rename = "natPortRange",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub nat_port_range: Option<Port>,
    #[serde(
        rename = "netlinkTimeout",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub netlink_timeout: Option<Duration>,
    #[serde(
        rename = "nftablesFilterAllowAction",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub nftables_filter_allow_action: Option<String>,
    #[serde(
        rename = "nftablesFilterDenyAction",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub nftables_filter_deny_action: Option<String>,
    #[serde(
        rename = "nftablesFlowTableDataIfacePattern",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub nftables_flow_table_data_iface_pattern: Option<String>,
    #[serde(
        rename = "nftablesFlowTableOffload",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub nftables_flow_table_offload: Option<String>,
    #[serde(
        rename = "nftablesMangleAllowAction",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub nftables_mangle_allow_action: Option<String>,
    #[serde(
        rename = "nftablesMarkMask",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub nftables_mark_mask: Option<i64>,
    #[serde(
        rename = "nftablesMode",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub nftables_mode: Option<String>,
    #[serde(
        rename = "nftablesRefreshInterval",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub nftables_refresh_interval: Option<Duration>,
    #[serde(
        rename = "nodeSelector",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub node_selector: Option<String>,
    #[serde(
        rename = "openstackRegion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub openstack_region: Option<String>,
    #[serde(
        rename = "policySyncPathPrefix",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub policy_sync_path_prefix: Option<String>,
    #[serde(
        rename = "programClusterRoutes",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub program_cluster_routes: Option<String>,
    #[serde(
        rename = "prometheusGoMetricsEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prometheus_go_metrics_enabled: Option<bool>,
    #[serde(
        rename = "prometheusMetricsCAFile",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prometheus_metrics_ca_file: Option<String>,
    #[serde(
        rename = "prometheusMetricsCertFile",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prometheus_metrics_cert_file: Option<String>,
    #[serde(
        rename = "prometheusMetricsClientAuth",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prometheus_metrics_client_auth: Option<String>,
    #[serde(
        rename = "prometheusMetricsEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prometheus_metrics_enabled: Option<bool>,
    #[serde(
        rename = "prometheusMetricsHost",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prometheus_metrics_host: Option<String>,
    #[serde(
        rename = "prometheusMetricsKeyFile",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prometheus_metrics_key_file: Option<String>,
    #[serde(
        rename = "prometheusMetricsPort",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prometheus_metrics_port: Option<i64>,
    #[serde(
        rename = "prometheusProcessMetricsEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prometheus_process_metrics_enabled: Option<bool>,
    #[serde(
        rename = "prometheusWireGuardMetricsEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prometheus_wire_guard_metrics_enabled: Option<bool>,
    #[serde(
        rename = "removeExternalRoutes",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub remove_external_routes: Option<bool>,
    #[serde(
        rename = "reportingInterval",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub reporting_interval: Option<Duration>,
    #[serde(
        rename = "reportingTTL",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub reporting_ttl: Option<Duration>,
    #[serde(
        rename = "requireMTUFile",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub require_mtu_file: Option<bool>,
    #[serde(
        rename = "routeRefreshInterval",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub route_refresh_interval: Option<Duration>,
    #[serde(
        rename = "routeSource",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub route_source: Option<String>,
    #[serde(
        rename = "routeSyncDisabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub route_sync_disabled: Option<bool>,
    #[serde(
        rename = "routeTableRange",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub route_table_range: Option<RouteTableRange>,
    #[serde(
        rename = "routeTableRanges",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub route_table_ranges: Option<Vec<RouteTableRange>>,
    #[serde(
        rename = "serviceLoopPrevention",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub service_loop_prevention: Option<String>,
    #[serde(
        rename = "sidecarAccelerationEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub sidecar_acceleration_enabled: Option<bool>,
    #[serde(
        rename = "usageReportingEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub usage_reporting_enabled: Option<bool>,
    #[serde(
        rename = "usageReportingInitialDelay",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub usage_reporting_initial_delay: Option<Duration>,
    #[serde(
        rename = "usageReportingInterval",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub usage_reporting_interval: Option<Duration>,
    #[serde(
        rename = "useInternalDataplaneDriver",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub use_internal_dataplane_driver: Option<bool>,
    #[serde(
        rename = "vxlanEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub vxlan_enabled: Option<bool>,
    #[serde(rename = "vxlanMTU", default, skip_serializing_if = "Option::is_none")]
    pub vxlan_mtu: Option<i64>,
    #[serde(
        rename = "vxlanMTUV6",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub vxlan_mtu_v6: Option<i64>,
    #[serde(rename = "vxlanPort", default, skip_serializing_if = "Option::is_none")]
    pub vxlan_port: Option<i64>,
    #[serde(rename = "vxlanVNI", default, skip_serializing_if = "Option::is_none")]
    pub vxlan_vni: Option<i64>,
    #[serde(
        rename = "windowsManageFirewallRules",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub windows_manage_firewall_rules: Option<String>,
    #[serde(
        rename = "wireguardEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub wireguard_enabled: Option<bool>,
    #[serde(
        rename = "wireguardEnabledV6",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub wireguard_enabled_v6: Option<bool>,
    #[serde(
        rename = "wireguardHostEncryptionEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub wireguard_host_encryption_enabled: Option<bool>,
    #[serde(
        rename = "wireguardInterfaceName",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub wireguard_interface_name: Option<String>,
    #[serde(
        rename = "wireguardInterfaceNameV6",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub wireguard_interface_name_v6: Option<String>,
    #[serde(
        rename = "wireguardKeepAlive",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub wireguard_keep_alive: Option<Duration>,
    #[serde(
        rename = "wireguardListeningPort",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub wireguard_listening_port: Option<i64>,
    #[serde(
        rename = "wireguardListeningPortV6",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub wireguard_listening_port_v6: Option<i64>,
    #[serde(
        rename = "wireguardMTU",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub wireguard_mtu: Option<i64>,
    #[serde(
        rename = "wireguardMTUV6",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub wireguard_mtu_v6: Option<i64>,
    #[serde(
        rename = "wireguardRoutingRulePriority",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub wireguard_routing_rule_priority: Option<i64>,
    #[serde(
        rename = "wireguardThreadingEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub wireguard_threading_enabled: Option<bool>,
    #[serde(
        rename = "workloadSourceSpoofing",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub workload_source_spoofing: Option<String>,
    #[serde(
        rename = "xdpEnabled",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub xdp_enabled: Option<bool>,
    #[serde(
        rename = "xdpRefreshInterval",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub xdp_refresh_interval: Option<Duration>,
}

/// A protocol/port pair (with optional network) of the failsafe port lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProtoPort {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    pub port: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub net: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthTimeoutOverride {
    #[serde(default)]
    pub name: String,
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteTableRange {
    pub min: i64,
    pub max: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BpfConntrackTimeouts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_grace_period: Option<String>,
    #[serde(
        default,
        rename = "tcpSynSent",
        skip_serializing_if = "Option::is_none"
    )]
    pub tcp_syn_sent: Option<String>,
    #[serde(
        default,
        rename = "tcpEstablished",
        skip_serializing_if = "Option::is_none"
    )]
    pub tcp_established: Option<String>,
    #[serde(
        default,
        rename = "tcpFinsSeen",
        skip_serializing_if = "Option::is_none"
    )]
    pub tcp_fins_seen: Option<String>,
    #[serde(
        default,
        rename = "tcpResetSeen",
        skip_serializing_if = "Option::is_none"
    )]
    pub tcp_reset_seen: Option<String>,
    #[serde(
        default,
        rename = "udpTimeout",
        skip_serializing_if = "Option::is_none"
    )]
    pub udp_timeout: Option<String>,
    #[serde(
        default,
        rename = "genericTimeout",
        skip_serializing_if = "Option::is_none"
    )]
    pub generic_timeout: Option<String>,
    #[serde(
        default,
        rename = "icmpTimeout",
        skip_serializing_if = "Option::is_none"
    )]
    pub icmp_timeout: Option<String>,
}

impl BpfConntrackTimeouts {
    /// Each set timeout with its JSON field name.
    pub fn entries(&self) -> [(&'static str, Option<&str>); 8] {
        [
            ("creationGracePeriod", self.creation_grace_period.as_deref()),
            ("tcpSynSent", self.tcp_syn_sent.as_deref()),
            ("tcpEstablished", self.tcp_established.as_deref()),
            ("tcpFinsSeen", self.tcp_fins_seen.as_deref()),
            ("tcpResetSeen", self.tcp_reset_seen.as_deref()),
            ("udpTimeout", self.udp_timeout.as_deref()),
            ("genericTimeout", self.generic_timeout.as_deref()),
            ("icmpTimeout", self.icmp_timeout.as_deref()),
        ]
    }
}
