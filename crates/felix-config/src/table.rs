//! The parameter table: every parameter of Calico's Felix, in one declaration.
//!
//! Each row gives Calico's name (also the `ParamId` variant), the Rust field of [`Config`],
//! its type, the kind (as in Calico's tags), the default as Calico's raw string, the flags,
//! the group `margay felix config` lists it under, the FelixConfiguration (v3) field that sets
//! it (empty if none), whether margay acts on it, and a one-line description. The typed
//! [`Config`] struct, the [`ParamId`] enum and the [`PARAMS`] metadata are generated from it.
//!
//! Row order is Calico's declaration order. Durations of kind `seconds`/`millis` default to a
//! number of seconds/milliseconds, written as Calico writes it.

// Calico's names are the variant names (`VXLANVNI`, `IPv4VXLANTunnelAddr`) so that a parameter
// reads the same in code, in felix.cfg and in FELIX_* variables.
#![allow(clippy::upper_case_acronyms)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use margay_api::net::Cidr;
use serde::Serialize;

use crate::kinds::{AssumeFilesExist, Kind};
use crate::value::{ParamType, PortRange, ProtoPort, RouteTableRange, Value};

/// Calico's parameter flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Flags {
    /// Only accepted from local sources (defaults, config file, environment, internal
    /// overrides); datastore values are ignored with a warning.
    pub local: bool,
    /// The raw value `none` (the zero value) is refused, and the refusal is fatal.
    pub non_zero: bool,
    /// A value that does not parse is fatal instead of falling back to the default.
    pub die_on_fail: bool,
    /// The default is taken as is, without parsing (it may name a file that need not exist).
    pub skip_default_validation: bool,
}

/// One flag, as written in table rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    Local,
    NonZero,
    DieOnFail,
    SkipDefaultValidation,
}

impl Flags {
    const fn of(list: &[Flag]) -> Flags {
        let mut f = Flags {
            local: false,
            non_zero: false,
            die_on_fail: false,
            skip_default_validation: false,
        };
        let mut i = 0;
        while i < list.len() {
            match list[i] {
                Flag::Local => f.local = true,
                Flag::NonZero => f.non_zero = true,
                Flag::DieOnFail => f.die_on_fail = true,
                Flag::SkipDefaultValidation => f.skip_default_validation = true,
            }
            i += 1;
        }
        f
    }
}

/// The groups parameters are listed under, in listing order (Calico's documentation groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Group {
    Datastore,
    Features,
    GoRuntime,
    Health,
    Logging,
    Prometheus,
    Common,
    Iptables,
    Nftables,
    Bpf,
    Windows,
    OpenStack,
    Xdp,
    Vxlan,
    IpInIp,
    Wireguard,
    FlowLogs,
    Aws,
    Debug,
    ClusterIdentity,
    NodeIdentity,
    UsageReporting,
}

impl Group {
    pub const ALL: [Group; 22] = [
        Group::Datastore,
        Group::Features,
        Group::GoRuntime,
        Group::Health,
        Group::Logging,
        Group::Prometheus,
        Group::Common,
        Group::Iptables,
        Group::Nftables,
        Group::Bpf,
        Group::Windows,
        Group::OpenStack,
        Group::Xdp,
        Group::Vxlan,
        Group::IpInIp,
        Group::Wireguard,
        Group::FlowLogs,
        Group::Aws,
        Group::Debug,
        Group::ClusterIdentity,
        Group::NodeIdentity,
        Group::UsageReporting,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Group::Datastore => "Datastore connection",
            Group::Features => "Process: Feature detection/overrides",
            Group::GoRuntime => "Process: Go runtime",
            Group::Health => "Process: Health port and timeouts",
            Group::Logging => "Process: Logging",
            Group::Prometheus => "Process: Prometheus metrics",
            Group::Common => "Dataplane: Common",
            Group::Iptables => "Dataplane: iptables",
            Group::Nftables => "Dataplane: nftables",
            Group::Bpf => "Dataplane: eBPF",
            Group::Windows => "Dataplane: Windows",
            Group::OpenStack => "Dataplane: OpenStack support",
            Group::Xdp => "Dataplane: XDP acceleration for iptables dataplane",
            Group::Vxlan => "Overlay: VXLAN overlay",
            Group::IpInIp => "Overlay: IP-in-IP",
            Group::Wireguard => "Overlay: Wireguard",
            Group::FlowLogs => "Flow logs",
            Group::Aws => "AWS integration",
            Group::Debug => "Debug/test-only (generally unsupported)",
            Group::ClusterIdentity => "Cluster identity (from ClusterInformation)",
            Group::NodeIdentity => "Node identity (from the Node resource)",
            Group::UsageReporting => "Usage reporting",
        }
    }
}

/// Metadata of one parameter (a row of the table).
#[derive(Debug, Clone, Copy)]
pub struct ParamMeta {
    pub id: ParamId,
    /// Calico's name, as used in felix.cfg and (case-insensitively) in `FELIX_<Name>`.
    pub name: &'static str,
    /// The field of [`Config`] holding the value.
    pub field: &'static str,
    /// The kind, as in Calico's tags: `int(0:65535)`, `oneof(DROP,RETURN,ACCEPT)`, ...
    pub kind: &'static str,
    /// The default, as Calico's raw string ("" means the zero value).
    pub default: &'static str,
    pub flags: Flags,
    pub group: Group,
    /// The FelixConfiguration (v3) JSON field that sets the parameter, "" if none.
    pub v3_field: &'static str,
    /// Whether margay acts on the parameter. Unsupported parameters are accepted; a value
    /// other than the default is reported once as unsupported.
    pub supported: bool,
    pub description: &'static str,
    /// The Rust type of the [`Config`] field.
    pub rust_type: &'static str,
}

impl ParamMeta {
    /// The parsed kind. Every kind in the table parses (checked by the tests).
    pub fn kind(&self) -> Kind {
        Kind::from_spec(self.kind).unwrap_or(Kind::Str)
    }

    /// The FelixConfiguration field, if the parameter has one.
    pub fn v3_field(&self) -> Option<&'static str> {
        (!self.v3_field.is_empty()).then_some(self.v3_field)
    }

    /// Whether a change of this parameter is applied without restarting Felix (Calico handles
    /// exactly these four live; every other change makes Felix exit so it restarts).
    pub fn live(&self) -> bool {
        matches!(
            self.id,
            ParamId::CalicoVersion
                | ParamId::ClusterGUID
                | ParamId::ClusterType
                | ParamId::HealthTimeoutOverrides
        )
    }

    /// The default value, parsed.
    pub fn default_value(&self) -> Value {
        let kind = self.kind();
        if self.default.is_empty() {
            kind.zero()
        } else if self.flags.skip_default_validation {
            Value::Str(self.default.to_string())
        } else {
            kind.parse(self.default, &AssumeFilesExist)
                .map(|p| p.value)
                .unwrap_or_else(|_| kind.zero())
        }
    }
}

impl ParamId {
    pub fn meta(self) -> &'static ParamMeta {
        &PARAMS[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.meta().name
    }

    /// The parameter called `name`, compared case-insensitively as Calico does.
    pub fn from_name(name: &str) -> Option<ParamId> {
        if name.is_ascii() {
            PARAMS
                .iter()
                .find(|p| p.name.eq_ignore_ascii_case(name))
                .map(|p| p.id)
        } else {
            let lower = name.to_lowercase();
            PARAMS
                .iter()
                .find(|p| p.name.to_ascii_lowercase() == lower)
                .map(|p| p.id)
        }
    }
}

macro_rules! params {
    ($(
        $id:ident $field:ident : $ty:ty = $kind:literal, $default:literal,
            [$($flag:ident),*], $group:ident, $v3:literal, $sup:literal,
            $desc:literal;
    )*) => {
        /// Identifies a parameter; the variants are Calico's names.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum ParamId {
            $($id),*
        }

        impl ParamId {
            /// Every parameter, in table order.
            pub const ALL: &'static [ParamId] = &[$(ParamId::$id),*];
        }

        /// Metadata of every parameter, in table order (indexed by `ParamId as usize`).
        pub static PARAMS: &[ParamMeta] = &[$(
            ParamMeta {
                id: ParamId::$id,
                name: stringify!($id),
                field: stringify!($field),
                kind: $kind,
                default: $default,
                flags: Flags::of(&[$(Flag::$flag),*]),
                group: Group::$group,
                v3_field: $v3,
                supported: $sup,
                description: $desc,
                rust_type: stringify!($ty),
            }
        ),*];

        /// The effective configuration: one typed field per parameter.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Config {
            $(
                #[doc = $desc]
                pub $field: $ty,
            )*
        }

        impl Config {
            /// Every field at its type's zero value (not the defaults).
            pub(crate) fn zeroed() -> Config {
                Config {
                    $($field: <$ty as Default>::default(),)*
                }
            }

            /// The value of a parameter.
            pub fn get(&self, id: ParamId) -> Value {
                match id {
                    $(ParamId::$id => ParamType::to_value(&self.$field),)*
                }
            }

            /// Sets a parameter; false if the value has the wrong shape for the field (a bug
            /// in the table, caught by the tests).
            pub(crate) fn set(&mut self, id: ParamId, value: Value) -> bool {
                match id {
                    $(ParamId::$id => match <$ty as ParamType>::from_value(value) {
                        Some(v) => {
                            self.$field = v;
                            true
                        }
                        None => false,
                    },)*
                }
            }
        }
    };
}

params! {
    UseInternalDataplaneDriver use_internal_dataplane_driver: bool = "bool", "true", [], Common, "useInternalDataplaneDriver", false,
        "Program the dataplane in-process; false means launch the external driver named by DataplaneDriver.";
    DataplaneDriver dataplane_driver: String = "file(must-exist,executable)", "calico-iptables-plugin", [NonZero, DieOnFail, SkipDefaultValidation], Common, "dataplaneDriver", false,
        "Executable of the external dataplane driver, used only when UseInternalDataplaneDriver is false.";
    DataplaneWatchdogTimeout dataplane_watchdog_timeout: Duration = "seconds", "90", [], Common, "dataplaneWatchdogTimeout", true,
        "Liveness timeout of the internal dataplane driver (superseded by HealthTimeoutOverrides).";
    WireguardEnabled wireguard_enabled: bool = "bool", "false", [], Wireguard, "wireguardEnabled", false,
        "Encrypt IPv4 pod traffic between nodes with WireGuard.";
    WireguardEnabledV6 wireguard_enabled_v6: bool = "bool", "false", [], Wireguard, "wireguardEnabledV6", false,
        "Encrypt IPv6 pod traffic between nodes with WireGuard.";
    WireguardListeningPort wireguard_listening_port: i64 = "int", "51820", [], Wireguard, "wireguardListeningPort", false,
        "UDP port of the IPv4 WireGuard device.";
    WireguardListeningPortV6 wireguard_listening_port_v6: i64 = "int", "51821", [], Wireguard, "wireguardListeningPortV6", false,
        "UDP port of the IPv6 WireGuard device.";
    WireguardRoutingRulePriority wireguard_routing_rule_priority: i64 = "int", "99", [], Wireguard, "wireguardRoutingRulePriority", false,
        "Priority of the policy-routing rule that steers traffic into WireGuard.";
    WireguardInterfaceName wireguard_interface_name: String = "iface-param", "wireguard.cali", [NonZero], Wireguard, "wireguardInterfaceName", false,
        "Name of the IPv4 WireGuard device.";
    WireguardInterfaceNameV6 wireguard_interface_name_v6: String = "iface-param", "wg-v6.cali", [NonZero], Wireguard, "wireguardInterfaceNameV6", false,
        "Name of the IPv6 WireGuard device.";
    WireguardMTU wireguard_mtu: i64 = "int", "0", [], Wireguard, "wireguardMTU", false,
        "MTU of the IPv4 WireGuard device (0: detect).";
    WireguardMTUV6 wireguard_mtu_v6: i64 = "int", "0", [], Wireguard, "wireguardMTUV6", false,
        "MTU of the IPv6 WireGuard device (0: detect).";
    WireguardHostEncryptionEnabled wireguard_host_encryption_enabled: bool = "bool", "false", [], Wireguard, "wireguardHostEncryptionEnabled", false,
        "Also encrypt host-to-host traffic with WireGuard.";
    WireguardPersistentKeepAlive wireguard_persistent_keep_alive: Duration = "seconds", "0", [], Wireguard, "wireguardKeepAlive", false,
        "WireGuard persistent keepalive interval (0 turns it off).";
    WireguardThreadingEnabled wireguard_threading_enabled: bool = "bool", "false", [], Wireguard, "wireguardThreadingEnabled", false,
        "Turn on threaded NAPI for the WireGuard devices.";
    NFTablesMode nftables_mode: String = "oneof(Enabled,Disabled,Auto)", "Auto", [], Common, "nftablesMode", true,
        "Whether to program nftables rather than iptables: Enabled, Disabled or Auto (follow kube-proxy).";
    NFTablesFlowTableOffload nftables_flow_table_offload: String = "oneof(All,Disabled)", "Disabled", [], Common, "nftablesFlowTableOffload", true,
        "Offload established, policy-accepted flows to an nftables flowtable (All) or not (Disabled).";
    NFTablesFlowTableDataIfacePattern nftables_flow_table_data_iface_pattern: Option<String> = "regexp(nil-on-empty)", "", [], Common, "nftablesFlowTableDataIfacePattern", true,
        "Regular expression of host interfaces to add to the flowtable besides workload interfaces.";
    BPFEnabled bpf_enabled: bool = "bool", "false", [], Bpf, "bpfEnabled", true,
        "Use the eBPF dataplane instead of iptables/nftables.";
    BPFOverlayHostSourceIP bpf_overlay_host_source_ip: String = "oneof(TunnelAddress,HostAddress)", "TunnelAddress", [NonZero], Bpf, "bpfOverlayHostSourceIP", false,
        "eBPF: source address of host traffic sent into an overlay tunnel (TunnelAddress or HostAddress).";
    BPFDisableUnprivileged bpf_disable_unprivileged: bool = "bool", "true", [], Bpf, "bpfDisableUnprivileged", false,
        "eBPF: set kernel.unprivileged_bpf_disabled so unprivileged users cannot use BPF.";
    BPFJITHardening bpf_jit_hardening: String = "oneof(Auto,Strict)", "Auto", [NonZero], Bpf, "bpfJITHardening", false,
        "eBPF: relax the BPF JIT hardening sysctl from 2 to 1 (Auto) or leave it alone (Strict).";
    BPFLogLevel bpf_log_level: String = "oneof(off,info,debug)", "off", [NonZero], Bpf, "bpfLogLevel", false,
        "eBPF: log level of the BPF programs, written to the kernel trace pipe.";
    BPFConntrackLogLevel bpf_conntrack_log_level: String = "oneof(off,debug)", "off", [NonZero], Bpf, "bpfConntrackLogLevel", false,
        "eBPF: log level of the BPF conntrack cleaner.";
    BPFConntrackCleanupMode bpf_conntrack_cleanup_mode: String = "oneof(Auto,Userspace,BPFProgram)", "Auto", [], Bpf, "bpfConntrackMode", false,
        "eBPF: how expired conntrack entries are removed (Auto, Userspace or BPFProgram).";
    BPFConntrackTimeouts bpf_conntrack_timeouts: BTreeMap<String, String> = "keyvaluelist", "CreationGracePeriod=10s,TCPSynSent=20s,TCPEstablished=1h,TCPFinsSeen=Auto,TCPResetSeen=40s,UDPTimeout=60s,GenericTimeout=10m,ICMPTimeout=5s", [], Bpf, "bpfConntrackTimeouts", false,
        "eBPF: conntrack timers as Name=duration pairs (or Auto to follow the kernel).";
    BPFIPFragTimeout bpf_ip_frag_timeout: Duration = "seconds", "0", [], Bpf, "bpfIPFragTimeout", false,
        "eBPF: how long to wait for all fragments of a packet (0: the kernel's ipfrag_time).";
    BPFLogFilters bpf_log_filters: BTreeMap<String, String> = "keyvaluelist", "", [], Bpf, "bpfLogFilters", false,
        "eBPF: per-interface pcap filter expressions selecting which packets are logged.";
    BPFCTLBLogFilter bpf_ctlb_log_filter: String = "oneof(all)", "", [], Bpf, "bpfCTLBLogFilter", false,
        "eBPF: what the connect-time load balancer logs at debug level.";
    BPFDataIfacePattern bpf_data_iface_pattern: Option<String> = "regexp", "^((en|wl|ww|sl|ib)[Popsx].*|(eth|wlan|wwan|bond).*)", [], Bpf, "bpfDataIfacePattern", false,
        "eBPF: regular expression of the host interfaces that carry cluster and external traffic.";
    BPFL3IfacePattern bpf_l3_iface_pattern: Option<String> = "regexp", "", [], Bpf, "bpfL3IfacePattern", false,
        "eBPF: regular expression of extra L3 (tunnel) interfaces to attach programs to.";
    BPFConnectTimeLoadBalancingEnabled bpf_connect_time_load_balancing_enabled: bool = "bool", "", [], Bpf, "bpfConnectTimeLoadBalancingEnabled", false,
        "eBPF: deprecated switch for the connect-time load balancer.";
    BPFConnectTimeLoadBalancing bpf_connect_time_load_balancing: String = "oneof(TCP,Enabled,Disabled)", "TCP", [NonZero], Bpf, "bpfConnectTimeLoadBalancing", false,
        "eBPF: connect-time load balancing for TCP services only, for all, or none.";
    BPFHostNetworkedNATWithoutCTLB bpf_host_networked_nat_without_ctlb: String = "oneof(Enabled,Disabled)", "Enabled", [NonZero], Bpf, "bpfHostNetworkedNATWithoutCTLB", false,
        "eBPF: NAT host-networked traffic to services without the connect-time load balancer.";
    BPFExternalServiceMode bpf_external_service_mode: String = "oneof(tunnel,dsr)", "tunnel", [NonZero], Bpf, "bpfExternalServiceMode", false,
        "eBPF: forward external service traffic through a tunnel or reply directly (DSR).";
    BPFDSROptoutCIDRs bpf_dsr_optout_cidrs: Vec<Cidr> = "cidr-list", "", [], Bpf, "bpfDSROptoutCIDRs", false,
        "eBPF: client CIDRs that never get direct server return.";
    BPFKubeProxyIptablesCleanupEnabled bpf_kube_proxy_iptables_cleanup_enabled: bool = "bool", "true", [], Bpf, "bpfKubeProxyIptablesCleanupEnabled", false,
        "eBPF: remove kube-proxy's iptables chains.";
    BPFKubeProxyMinSyncPeriod bpf_kube_proxy_min_sync_period: Duration = "seconds", "1", [], Bpf, "bpfKubeProxyMinSyncPeriod", false,
        "eBPF: minimum interval between service dataplane updates.";
    BPFKubeProxyHealthzPort bpf_kube_proxy_healthz_port: i64 = "int", "10256", [], Bpf, "bpfKubeProxyHealthzPort", false,
        "eBPF: port of the embedded kube-proxy health server (0 turns it off).";
    BPFExtToServiceConnmark bpf_ext_to_service_connmark: i64 = "int", "0", [], Bpf, "bpfExtToServiceConnmark", false,
        "eBPF: connmark set on connections from external clients to local services.";
    BPFPSNATPorts bpf_psnat_ports: Option<PortRange> = "portrange", "20000:29999", [], Bpf, "bpfPSNATPorts", false,
        "eBPF: port range used to resolve source-port collisions when NATing.";
    BPFMapSizeNATFrontend bpf_map_size_nat_frontend: i64 = "int", "65536", [NonZero], Bpf, "bpfMapSizeNATFrontend", false,
        "eBPF: entries in the NAT frontend map.";
    BPFMapSizeNATBackend bpf_map_size_nat_backend: i64 = "int", "262144", [NonZero], Bpf, "bpfMapSizeNATBackend", false,
        "eBPF: entries in the NAT backend map.";
    BPFMapSizeNATAffinity bpf_map_size_nat_affinity: i64 = "int", "65536", [NonZero], Bpf, "bpfMapSizeNATAffinity", false,
        "eBPF: entries in the NAT session-affinity map.";
    BPFMapSizeRoute bpf_map_size_route: i64 = "int", "262144", [NonZero], Bpf, "bpfMapSizeRoute", false,
        "eBPF: entries in the routes map.";
    BPFMapSizeConntrack bpf_map_size_conntrack: i64 = "int", "512000", [NonZero], Bpf, "bpfMapSizeConntrack", false,
        "eBPF: entries in the conntrack map.";
    BPFMapSizePerCPUConntrack bpf_map_size_per_cpu_conntrack: i64 = "int", "0", [], Bpf, "bpfMapSizePerCpuConntrack", false,
        "eBPF: conntrack map entries per CPU; overrides BPFMapSizeConntrack when non-zero.";
    BPFMapSizeConntrackScaling bpf_map_size_conntrack_scaling: String = "oneof(Disabled,DoubleIfFull)", "DoubleIfFull", [NonZero], Bpf, "bpfMapSizeConntrackScaling", false,
        "eBPF: grow the conntrack map when it fills up (DoubleIfFull) or not.";
    BPFMapSizeConntrackCleanupQueue bpf_map_size_conntrack_cleanup_queue: i64 = "int", "100000", [NonZero], Bpf, "bpfMapSizeConntrackCleanupQueue", false,
        "eBPF: entries in the queue of NAT conntrack entries awaiting cleanup.";
    BPFMapSizeIPSets bpf_map_size_ip_sets: i64 = "int", "1048576", [NonZero], Bpf, "bpfMapSizeIPSets", false,
        "eBPF: entries in the IP sets map.";
    BPFMapSizeIfState bpf_map_size_if_state: i64 = "int", "1000", [NonZero], Bpf, "bpfMapSizeIfState", false,
        "eBPF: entries in the interface state map.";
    BPFHostConntrackBypass bpf_host_conntrack_bypass: bool = "bool", "false", [], Bpf, "bpfHostConntrackBypass", false,
        "eBPF: bypass Linux conntrack for workload and service traffic.";
    BPFIPFragmentReassemblyEnabled bpf_ip_fragment_reassembly_enabled: bool = "bool", "true", [], Bpf, "bpfIPFragmentReassemblyEnabled", false,
        "eBPF: load the program that reassembles IP fragments from outside the cluster.";
    BPFEnforceRPF bpf_enforce_rpf: String = "oneof(Disabled,Strict,Loose)", "Loose", [NonZero], Bpf, "bpfEnforceRPF", false,
        "eBPF: reverse-path filtering on host interfaces (Disabled, Strict or Loose).";
    BPFPolicyDebugEnabled bpf_policy_debug_enabled: bool = "bool", "true", [], Bpf, "bpfPolicyDebugEnabled", false,
        "eBPF: record policy program details for calico-bpf.";
    BPFForceTrackPacketsFromIfaces bpf_force_track_packets_from_ifaces: Vec<String> = "iface-filter-slice", "docker+", [], Bpf, "bpfForceTrackPacketsFromIfaces", false,
        "eBPF: interfaces whose traffic is always tracked by Linux conntrack (+ is a wildcard).";
    BPFDisableGROForIfaces bpf_disable_gro_for_ifaces: Option<String> = "regexp", "", [], Bpf, "bpfDisableGROForIfaces", false,
        "eBPF: regular expression of interfaces on which to turn off GRO.";
    BPFExcludeCIDRsFromNAT bpf_exclude_cidrs_from_nat: Vec<Cidr> = "cidr-list", "", [], Bpf, "bpfExcludeCIDRsFromNAT", false,
        "eBPF: CIDRs left to the host instead of service NAT.";
    BPFRedirectToPeer bpf_redirect_to_peer: String = "oneof(Disabled,Enabled,L2Only)", "Enabled", [NonZero], Bpf, "bpfRedirectToPeer", false,
        "eBPF: forward traffic straight to the peer side of workload devices.";
    BPFAttachType bpf_attach_type: String = "oneof(Netkit,TCX,TC)", "Netkit", [NonZero], Bpf, "bpfAttachType", false,
        "eBPF: how programs are attached to interfaces (Netkit, TCX or TC).";
    BPFExportBufferSizeMB bpf_export_buffer_size_mb: i64 = "int", "1", [NonZero], Bpf, "bpfExportBufferSizeMB", false,
        "eBPF: size in MB of the buffer carrying BPF events to Felix.";
    BPFProfiling bpf_profiling: String = "oneof(Disabled,Enabled)", "Disabled", [NonZero], Bpf, "bpfProfiling", false,
        "eBPF: profile the BPF programs.";
    IstioAmbientMode istio_ambient_mode: String = "oneof(Disabled,Enabled)", "Disabled", [], Common, "istioAmbientMode", false,
        "Cooperate with Istio ambient mode.";
    IstioDSCPMark istio_dscp_mark: u8 = "dscp", "23", [], Common, "istioDSCPMark", false,
        "DSCP value marking traffic redirected to Istio's ztunnel.";
    CgroupV2Path cgroup_v2_path: String = "string", "", [], Common, "cgroupV2Path", false,
        "Where the cgroup v2 hierarchy is mounted (used by Calico's init container).";
    DebugBPFCgroupV2 debug_bpf_cgroup_v2: String = "string", "", [Local], Debug, "", false,
        "Development only: cgroup v2 path the connect-time load balancer attaches to.";
    DatastoreType datastore_type: String = "oneof(kubernetes,etcdv3)", "etcdv3", [NonZero, DieOnFail, Local], Datastore, "", true,
        "Datastore driver: kubernetes or etcdv3.";
    FelixHostname felix_hostname: String = "hostname", "", [Local, NonZero], Datastore, "", true,
        "This node's name in the datastore (defaults to the lower-cased kernel hostname).";
    EtcdAddr etcd_addr: String = "authority", "127.0.0.1:2379", [Local], Datastore, "", true,
        "etcd host:port, used when EtcdEndpoints is not set.";
    EtcdScheme etcd_scheme: String = "oneof(http,https)", "http", [Local], Datastore, "", true,
        "URL scheme (http or https) used with EtcdAddr.";
    EtcdKeyFile etcd_key_file: String = "file(must-exist)", "", [Local], Datastore, "", true,
        "Client private key for TLS to etcd.";
    EtcdCertFile etcd_cert_file: String = "file(must-exist)", "", [Local], Datastore, "", true,
        "Client certificate for TLS to etcd.";
    EtcdCaFile etcd_ca_file: String = "file(must-exist)", "", [Local], Datastore, "", true,
        "CA bundle used to verify etcd.";
    EtcdEndpoints etcd_endpoints: Vec<String> = "endpoint-list", "", [Local], Datastore, "", true,
        "Comma-separated etcd URLs; replaces EtcdAddr and EtcdScheme.";
    TyphaAddr typha_addr: String = "authority-list", "", [Local], Datastore, "", true,
        "Connect to Typha at this host:port (takes precedence over TyphaK8sServiceName); margay accepts several, comma-separated, and fails over between them.";
    TyphaK8sServiceName typha_k8s_service_name: String = "string", "", [Local], Datastore, "", true,
        "Find Typha through the endpoints of this Kubernetes service.";
    TyphaK8sNamespace typha_k8s_namespace: String = "string", "kube-system", [NonZero, Local], Datastore, "", true,
        "Namespace of the Typha service.";
    TyphaReadTimeout typha_read_timeout: Duration = "seconds", "30", [Local], Datastore, "", true,
        "Restart if Typha sends nothing for this long.";
    TyphaWriteTimeout typha_write_timeout: Duration = "seconds", "10", [Local], Datastore, "", true,
        "Timeout of writes to Typha.";
    TyphaKeyFile typha_key_file: String = "file(must-exist)", "", [Local], Datastore, "", true,
        "Client private key for TLS to Typha.";
    TyphaCertFile typha_cert_file: String = "file(must-exist)", "", [Local], Datastore, "", true,
        "Client certificate for TLS to Typha.";
    TyphaCAFile typha_ca_file: String = "file(must-exist)", "", [Local], Datastore, "", true,
        "CA bundle used to verify Typha.";
    TyphaCN typha_cn: String = "string", "", [Local], Datastore, "", true,
        "Common name Typha's certificate must carry.";
    TyphaURISAN typha_uri_san: String = "string", "", [Local], Datastore, "", true,
        "URI SAN Typha's certificate must carry.";
    Ipv6Support ipv6_support: bool = "bool", "true", [], Common, "ipv6Support", true,
        "Program IPv6 as well as IPv4.";
    IptablesBackend iptables_backend: String = "oneof(legacy,nft,auto)", "auto", [], Iptables, "iptablesBackend", false,
        "iptables backend: legacy, nft or auto (detect).";
    RouteRefreshInterval route_refresh_interval: Duration = "seconds", "90", [], Common, "routeRefreshInterval", true,
        "How often routes are re-checked and repaired (0 turns it off).";
    InterfaceRefreshInterval interface_refresh_interval: Duration = "seconds", "90", [], Common, "interfaceRefreshInterval", true,
        "How often host interfaces are rescanned (0 turns it off).";
    DeviceRouteSourceAddress device_route_source_address: Option<IpAddr> = "ipv4", "", [], Common, "deviceRouteSourceAddress", true,
        "IPv4 source hint on routes to local workloads.";
    DeviceRouteSourceAddressIPv6 device_route_source_address_ipv6: Option<IpAddr> = "ipv6", "", [], Common, "deviceRouteSourceAddressIPv6", true,
        "IPv6 source hint on routes to local workloads.";
    DeviceRouteProtocol device_route_protocol: i64 = "int", "3", [], Common, "deviceRouteProtocol", false,
        "Routing protocol number that marks the routes Felix owns.";
    RemoveExternalRoutes remove_external_routes: bool = "bool", "true", [], Common, "removeExternalRoutes", false,
        "Delete routes to workload interfaces that Felix did not program.";
    ProgramClusterRoutes program_cluster_routes: String = "oneof(Enabled,Disabled,EnabledIPIPOnly,EnabledNoEncapOnly)", "EnabledIPIPOnly", [], Common, "programClusterRoutes", true,
        "Which routes to remote workloads Felix programs itself rather than leaving to BGP.";
    IPForwarding ip_forwarding: String = "oneof(Enabled,Disabled)", "Enabled", [], Common, "ipForwarding", true,
        "Turn on IP forwarding sysctls.";
    IptablesRefreshInterval iptables_refresh_interval: Duration = "seconds", "180", [], Iptables, "iptablesRefreshInterval", true,
        "How often iptables rules are re-checked (0 turns it off).";
    IptablesPostWriteCheckIntervalSecs iptables_post_write_check_interval_secs: Duration = "seconds", "5", [], Iptables, "iptablesPostWriteCheckInterval", false,
        "Delay before reading iptables back after a write, to detect clobbering.";
    IptablesLockProbeIntervalMillis iptables_lock_probe_interval_millis: Duration = "millis", "50", [], Iptables, "iptablesLockProbeInterval", false,
        "Interval between attempts to take the xtables lock.";
    FeatureDetectOverride feature_detect_override: BTreeMap<String, String> = "keyvaluelist", "", [], Features, "featureDetectOverride", false,
        "Force detected kernel features on or off (Feature=true|false pairs).";
    FeatureGates feature_gates: BTreeMap<String, String> = "keyvaluelist", "", [], Features, "featureGates", false,
        "Turn tech-preview features on or off (Feature=value pairs).";
    IpsetsRefreshInterval ipsets_refresh_interval: Duration = "seconds", "90", [], Iptables, "ipsetsRefreshInterval", false,
        "How often IP sets are re-checked (0 turns it off).";
    MaxIpsetSize max_ipset_size: i64 = "int", "1048576", [NonZero], Iptables, "maxIpsetSize", false,
        "Maximum number of members of one IP set.";
    XDPRefreshInterval xdp_refresh_interval: Duration = "seconds", "90", [], Xdp, "xdpRefreshInterval", false,
        "How often XDP programs and maps are re-checked (0 turns it off).";
    PolicySyncPathPrefix policy_sync_path_prefix: String = "file", "", [], Common, "policySyncPathPrefix", false,
        "Directory of the policy sync API sockets for external agents (empty turns it off).";
    NetlinkTimeoutSecs netlink_timeout_secs: Duration = "seconds", "10", [], Common, "netlinkTimeout", false,
        "Timeout of netlink requests to the kernel.";
    MetadataAddr metadata_addr: String = "hostname", "127.0.0.1", [DieOnFail], OpenStack, "metadataAddr", false,
        "OpenStack: address of the metadata server (none: no metadata NAT).";
    MetadataPort metadata_port: u16 = "int(0:65535)", "8775", [DieOnFail], OpenStack, "metadataPort", false,
        "OpenStack: port of the metadata server.";
    OpenstackRegion openstack_region: String = "region", "", [DieOnFail], OpenStack, "openstackRegion", false,
        "OpenStack: region this node belongs to.";
    InterfacePrefix interface_prefix: String = "iface-list", "cali", [NonZero, DieOnFail], Common, "interfacePrefix", true,
        "Comma-separated prefixes of workload interface names.";
    InterfaceExclude interface_exclude: Vec<String> = "iface-list-regexp", "kube-ipvs0", [], Common, "interfaceExclude", true,
        "Interfaces ignored when matching host endpoints: names, or /regexps/.";
    ChainInsertMode chain_insert_mode: String = "oneof(insert,append)", "insert", [NonZero, DieOnFail], Common, "chainInsertMode", false,
        "Hook Felix's chains at the top (insert) or bottom (append) of the kernel chains.";
    DefaultEndpointToHostAction default_endpoint_to_host_action: String = "oneof(DROP,RETURN,ACCEPT)", "DROP", [NonZero, DieOnFail], Common, "defaultEndpointToHostAction", true,
        "Verdict for workload traffic to the host itself after policy: DROP, RETURN or ACCEPT.";
    IptablesFilterAllowAction iptables_filter_allow_action: String = "oneof(ACCEPT,RETURN)", "ACCEPT", [NonZero, DieOnFail], Iptables, "iptablesFilterAllowAction", true,
        "iptables verdict for policy-allowed traffic in the filter table (ACCEPT or RETURN).";
    IptablesMangleAllowAction iptables_mangle_allow_action: String = "oneof(ACCEPT,RETURN)", "ACCEPT", [NonZero, DieOnFail], Iptables, "iptablesMangleAllowAction", false,
        "iptables verdict for policy-allowed traffic in the mangle table (ACCEPT or RETURN).";
    IptablesFilterDenyAction iptables_filter_deny_action: String = "oneof(DROP,REJECT)", "DROP", [NonZero, DieOnFail], Iptables, "iptablesFilterDenyAction", true,
        "iptables verdict for policy-denied traffic (DROP or REJECT).";
    LogPrefix log_prefix: String = "string", "calico-packet", [], Logging, "logPrefix", true,
        "Prefix of the kernel log lines written by Log rules (%t, %k, %n, %p expand).";
    LogActionRateLimit log_action_rate_limit: String = "log-rate", "", [], Logging, "logActionRateLimit", true,
        "Rate limit of Log rules, N/second|minute|hour|day (empty: unlimited).";
    LogActionRateLimitBurst log_action_rate_limit_burst: i64 = "int(0,9999)", "5", [], Logging, "logActionRateLimitBurst", true,
        "Burst allowed by LogActionRateLimit.";
    LogFilePath log_file_path: String = "file", "/var/log/calico/felix.log", [DieOnFail], Logging, "logFilePath", true,
        "Log file path (none: no log file).";
    LogSeverityFile log_severity_file: String = "oneof(TRACE,DEBUG,INFO,WARNING,ERROR,FATAL)", "INFO", [], Logging, "logSeverityFile", true,
        "Minimum severity written to the log file.";
    LogSeverityScreen log_severity_screen: String = "oneof(TRACE,DEBUG,INFO,WARNING,ERROR,FATAL)", "INFO", [], Logging, "logSeverityScreen", true,
        "Minimum severity written to stdout/stderr.";
    LogSeveritySys log_severity_sys: String = "oneof(TRACE,DEBUG,INFO,WARNING,ERROR,FATAL)", "INFO", [], Logging, "logSeveritySys", true,
        "Minimum severity sent to syslog.";
    LogDebugFilenameRegex log_debug_filename_regex: Option<String> = "regexp(nil-on-empty)", "", [], Logging, "logDebugFilenameRegex", false,
        "Only debug logs from source files matching this regular expression are kept.";
    VXLANEnabled vxlan_enabled: Option<bool> = "*bool", "", [], Vxlan, "vxlanEnabled", true,
        "Force the IPv4 VXLAN device on or off (unset: follow the IP pools).";
    VXLANPort vxlan_port: i64 = "int", "4789", [], Vxlan, "vxlanPort", true,
        "UDP port of VXLAN traffic.";
    VXLANVNI vxlan_vni: i64 = "int", "4096", [], Vxlan, "vxlanVNI", true,
        "VXLAN network identifier.";
    VXLANMTU vxlan_mtu: i64 = "int", "0", [], Vxlan, "vxlanMTU", true,
        "MTU of the IPv4 VXLAN device (0: detect).";
    VXLANMTUV6 vxlan_mtu_v6: i64 = "int", "0", [], Vxlan, "vxlanMTUV6", true,
        "MTU of the IPv6 VXLAN device (0: detect).";
    IPv4VXLANTunnelAddr ipv4_vxlan_tunnel_addr: Option<IpAddr> = "ipv4", "", [], NodeIdentity, "", true,
        "IPv4 address of this node's VXLAN device (from the Node resource).";
    IPv6VXLANTunnelAddr ipv6_vxlan_tunnel_addr: Option<IpAddr> = "ipv6", "", [], NodeIdentity, "", true,
        "IPv6 address of this node's VXLAN device (from the Node resource).";
    VXLANTunnelMACAddr vxlan_tunnel_mac_addr: String = "string", "", [], NodeIdentity, "", true,
        "MAC address of this node's IPv4 VXLAN device (from the Node resource).";
    VXLANTunnelMACAddrV6 vxlan_tunnel_mac_addr_v6: String = "string", "", [], NodeIdentity, "", true,
        "MAC address of this node's IPv6 VXLAN device (from the Node resource).";
    IpInIpEnabled ip_in_ip_enabled: Option<bool> = "*bool", "", [], IpInIp, "ipipEnabled", false,
        "Force the IPIP device on or off (unset: follow the IP pools).";
    IpInIpMtu ip_in_ip_mtu: i64 = "int", "0", [], IpInIp, "ipipMTU", true,
        "MTU of IP-in-IP traffic (0: the host MTU minus 20); margay uses it only for the pod MTU (it has no IP-in-IP dataplane).";
    IpInIpTunnelAddr ip_in_ip_tunnel_addr: Option<IpAddr> = "ipv4", "", [], NodeIdentity, "", false,
        "IPv4 address of this node's IPIP device (from the Node resource).";
    FloatingIPs floating_ips: String = "oneof(Enabled,Disabled)", "Disabled", [], Common, "floatingIPs", false,
        "Program floating IPs requested through Kubernetes annotations.";
    LocalSubnetL2Reachability local_subnet_l2_reachability: String = "oneof(Disabled,PodsAndLoadBalancers)", "Disabled", [], Common, "localSubnetL2Reachability", false,
        "Answer ARP/NDP on host interfaces for local pods and load-balancer VIPs on the host subnet.";
    LocalSubnetL2ReachabilityRefreshInterval local_subnet_l2_reachability_refresh_interval: Duration = "seconds", "120", [], Common, "localSubnetL2ReachabilityRefreshInterval", false,
        "How often proxied ARP/NDP addresses are re-announced (0: only once).";
    WindowsManageFirewallRules windows_manage_firewall_rules: String = "oneof(Enabled,Disabled)", "Disabled", [], Windows, "windowsManageFirewallRules", false,
        "Windows: open the metrics ports in Windows Firewall.";
    AllowVXLANPacketsFromWorkloads allow_vxlan_packets_from_workloads: bool = "bool", "false", [], Common, "allowVXLANPacketsFromWorkloads", true,
        "Accept VXLAN-encapsulated packets sent by workloads.";
    AllowIPIPPacketsFromWorkloads allow_ipip_packets_from_workloads: bool = "bool", "false", [], Common, "allowIPIPPacketsFromWorkloads", true,
        "Accept IPIP-encapsulated packets sent by workloads.";
    AWSSrcDstCheck aws_src_dst_check: String = "oneof(DoNothing,Enable,Disable)", "DoNothing", [NonZero], Aws, "awsSrcDstCheck", false,
        "AWS: set the EC2 source/destination check (DoNothing, Enable or Disable).";
    ServiceLoopPrevention service_loop_prevention: String = "oneof(Drop,Reject,Disabled)", "Drop", [], Common, "serviceLoopPrevention", true,
        "Drop or reject traffic to advertised service IPs that no service uses (or allow it: Disabled).";
    WorkloadSourceSpoofing workload_source_spoofing: String = "oneof(Disabled,Any)", "Disabled", [], Common, "workloadSourceSpoofing", true,
        "Let pods send from prefixes listed in their allowedSourcePrefixes annotation (Any) or not.";
    ReportingIntervalSecs reporting_interval_secs: Duration = "seconds", "30", [], OpenStack, "reportingInterval", false,
        "How often Felix writes its status to the datastore (0 turns it off).";
    ReportingTTLSecs reporting_ttl_secs: Duration = "seconds", "90", [], OpenStack, "reportingTTL", false,
        "Time-to-live of the status reports.";
    EndpointReportingEnabled endpoint_reporting_enabled: bool = "bool", "false", [], OpenStack, "endpointReportingEnabled", false,
        "Write per-endpoint status to the datastore.";
    EndpointReportingDelaySecs endpoint_reporting_delay_secs: Duration = "seconds", "1", [], OpenStack, "endpointReportingDelay", false,
        "Delay before endpoint status is written.";
    EndpointStatusPathPrefix endpoint_status_path_prefix: String = "file", "/var/run/calico", [], Common, "endpointStatusPathPrefix", true,
        "Directory of per-endpoint status files (empty turns them off).";
    IptablesMarkMask iptables_mark_mask: u32 = "mark-bitmask", "0xffff0000", [NonZero, DieOnFail], Iptables, "iptablesMarkMask", true,
        "Packet mark bits Felix may use with iptables (at least 2 bits).";
    DisableConntrackInvalidCheck disable_conntrack_invalid_check: bool = "bool", "false", [], Common, "disableConntrackInvalidCheck", true,
        "Do not drop packets that conntrack classifies as invalid.";
    HealthEnabled health_enabled: bool = "bool", "false", [], Health, "healthEnabled", true,
        "Serve the liveness and readiness endpoints.";
    HealthPort health_port: u16 = "int(0:65535)", "9099", [], Health, "healthPort", true,
        "TCP port of the health server.";
    HealthHost health_host: String = "host-address", "localhost", [], Health, "healthHost", true,
        "Address the health server listens on.";
    HealthTimeoutOverrides health_timeout_overrides: BTreeMap<String, Duration> = "keydurationlist", "", [], Health, "healthTimeoutOverrides", true,
        "Per-component liveness timeouts, Name=duration pairs.";
    PrometheusMetricsEnabled prometheus_metrics_enabled: bool = "bool", "false", [], Prometheus, "prometheusMetricsEnabled", true,
        "Serve Prometheus metrics.";
    PrometheusMetricsHost prometheus_metrics_host: String = "host-address", "", [], Prometheus, "prometheusMetricsHost", true,
        "Address the metrics server listens on (empty: all).";
    PrometheusMetricsPort prometheus_metrics_port: u16 = "int(0:65535)", "9091", [], Prometheus, "prometheusMetricsPort", true,
        "TCP port of the metrics server.";
    PrometheusGoMetricsEnabled prometheus_go_metrics_enabled: bool = "bool", "true", [], Prometheus, "prometheusGoMetricsEnabled", false,
        "Export Go runtime metrics.";
    PrometheusProcessMetricsEnabled prometheus_process_metrics_enabled: bool = "bool", "true", [], Prometheus, "prometheusProcessMetricsEnabled", true,
        "Export process metrics.";
    PrometheusWireGuardMetricsEnabled prometheus_wireguard_metrics_enabled: bool = "bool", "true", [], Prometheus, "prometheusWireGuardMetricsEnabled", false,
        "Export WireGuard metrics.";
    PrometheusMetricsCAFile prometheus_metrics_ca_file: String = "string", "", [], Prometheus, "prometheusMetricsCAFile", true,
        "CA bundle for verifying metrics clients (TLS).";
    PrometheusMetricsCertFile prometheus_metrics_cert_file: String = "string", "", [], Prometheus, "prometheusMetricsCertFile", true,
        "Certificate of the metrics server (TLS).";
    PrometheusMetricsKeyFile prometheus_metrics_key_file: String = "string", "", [], Prometheus, "prometheusMetricsKeyFile", true,
        "Private key of the metrics server (TLS).";
    PrometheusMetricsClientAuth prometheus_metrics_client_auth: String = "oneof(RequireAndVerifyClientCert,RequireAnyClientCert,VerifyClientCertIfGiven,NoClientCert)", "NoClientCert", [], Prometheus, "prometheusMetricsClientAuth", true,
        "How the metrics server checks client certificates.";
    FailsafeInboundHostPorts failsafe_inbound_host_ports: Vec<ProtoPort> = "port-list", "tcp:22,udp:68,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667", [DieOnFail], Common, "failsafeInboundHostPorts", false,
        "Inbound `proto:cidr:port` entries (protocol and CIDR optional) always allowed to host endpoints.";
    FailsafeOutboundHostPorts failsafe_outbound_host_ports: Vec<ProtoPort> = "port-list", "udp:53,udp:67,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667", [DieOnFail], Common, "failsafeOutboundHostPorts", false,
        "Outbound `proto:cidr:port` entries (protocol and CIDR optional) always allowed from host endpoints.";
    FlowLogsFlushInterval flow_logs_flush_interval: Duration = "seconds", "300", [], FlowLogs, "flowLogsFlushInterval", true,
        "How often flow logs are exported.";
    FlowLogsCollectorDebugTrace flow_logs_collector_debug_trace: bool = "bool", "false", [], FlowLogs, "flowLogsCollectorDebugTrace", false,
        "Log flow-log collector activity in full.";
    FlowLogsGoldmaneServer flow_logs_goldmane_server: String = "string", "", [], FlowLogs, "flowLogsGoldmaneServer", false,
        "Address of the flow server that receives flow logs.";
    FlowLogsLocalReporter flow_logs_local_reporter: String = "oneof(Enabled,Disabled)", "Disabled", [], FlowLogs, "flowLogsLocalReporter", true,
        "Report flows on a local unix socket.";
    FlowLogsPolicyEvaluationMode flow_logs_policy_evaluation_mode: String = "oneof(None,Continuous)", "Continuous", [], FlowLogs, "flowLogsPolicyEvaluationMode", false,
        "Keep re-evaluating active flows against policy changes (Continuous) or not (None).";
    FlowLogsFileEnabled flow_logs_file_enabled: bool = "bool", "false", [], FlowLogs, "flowLogsFileEnabled", true,
        "Write flow logs as JSON lines to FlowLogsFileDirectory/flows.log (a Calico Enterprise setting margay also reads).";
    FlowLogsFileDirectory flow_logs_file_directory: String = "string", "/var/log/calico/flowlogs", [], FlowLogs, "flowLogsFileDirectory", true,
        "Directory of the flow log file (Calico Enterprise setting).";
    FlowLogsFileMaxFiles flow_logs_file_max_files: i64 = "int(1,1000)", "5", [], FlowLogs, "flowLogsFileMaxFiles", true,
        "Flow log files kept, the current one included (Calico Enterprise setting).";
    FlowLogsFileMaxFileSizeMB flow_logs_file_max_file_size_mb: i64 = "int(1,100000)", "100", [], FlowLogs, "flowLogsFileMaxFileSizeMB", true,
        "Size at which the flow log file is rotated, in MB (Calico Enterprise setting).";
    KubeNodePortRanges kube_node_port_ranges: Vec<PortRange> = "portrange-list", "30000:32767", [], Iptables, "kubeNodePortRanges", false,
        "Service node-port ranges (used with kube-proxy in IPVS mode).";
    NATPortRange nat_port_range: Option<PortRange> = "portrange", "", [], Common, "natPortRange", true,
        "Source port range for outgoing NAT (unset: the kernel's choice).";
    NATOutgoingAddress nat_outgoing_address: Option<IpAddr> = "ipv4", "", [], Common, "natOutgoingAddress", true,
        "Source address for outgoing NAT (unset: masquerade to the egress interface's address).";
    NATOutgoingExclusions nat_outgoing_exclusions: String = "oneof(IPPoolsOnly,IPPoolsAndHostIPs)", "IPPoolsOnly", [], Common, "natOutgoingExclusions", true,
        "Destinations not NATed for natOutgoing pools: IP pools only, or IP pools and hosts.";
    UsageReportingEnabled usage_reporting_enabled: bool = "bool", "true", [], UsageReporting, "usageReportingEnabled", false,
        "Send anonymous version and cluster-size reports to the Calico project.";
    UsageReportingInitialDelaySecs usage_reporting_initial_delay_secs: Duration = "seconds", "300", [], UsageReporting, "usageReportingInitialDelay", false,
        "Delay before the first usage report.";
    UsageReportingIntervalSecs usage_reporting_interval_secs: Duration = "seconds", "86400", [], UsageReporting, "usageReportingInterval", false,
        "Interval between usage reports.";
    ClusterGUID cluster_guid: String = "string", "baddecaf", [], ClusterIdentity, "", true,
        "Cluster identifier (from ClusterInformation).";
    ClusterType cluster_type: String = "string", "", [], ClusterIdentity, "", true,
        "Comma-separated cluster type tags (from ClusterInformation).";
    CalicoVersion calico_version: String = "string", "", [], ClusterIdentity, "", true,
        "Calico version recorded in ClusterInformation.";
    ExternalNodesCIDRList external_nodes_cidr_list: Vec<Cidr> = "cidr-list", "", [DieOnFail], Common, "externalNodesList", true,
        "CIDRs of non-Calico nodes whose overlay traffic is accepted.";
    DebugMemoryProfilePath debug_memory_profile_path: String = "file", "", [], Debug, "debugMemoryProfilePath", false,
        "Debug: where to write a heap profile on signal.";
    DebugCPUProfilePath debug_cpu_profile_path: String = "file", "/tmp/felix-cpu-<timestamp>.pprof", [], Debug, "", false,
        "Debug: where to write a CPU profile on signal.";
    DebugDisableLogDropping debug_disable_log_dropping: bool = "bool", "false", [], Debug, "debugDisableLogDropping", false,
        "Debug: block rather than drop log lines when the log buffer is full.";
    DebugSimulateCalcGraphHangAfter debug_simulate_calc_graph_hang_after: Duration = "seconds", "0", [], Debug, "debugSimulateCalcGraphHangAfter", false,
        "Test only: hang the calculation graph after this long.";
    DebugSimulateDataplaneHangAfter debug_simulate_dataplane_hang_after: Duration = "seconds", "0", [], Debug, "debugSimulateDataplaneHangAfter", false,
        "Test only: hang the dataplane after this long.";
    DebugSimulateDataplaneApplyDelay debug_simulate_dataplane_apply_delay: Duration = "seconds", "0", [], Debug, "debugSimulateDataplaneApplyDelay", false,
        "Test only: delay every dataplane apply by this long.";
    DebugPanicAfter debug_panic_after: Duration = "seconds", "0", [], Debug, "", false,
        "Test only: panic after this long.";
    DebugSimulateDataRace debug_simulate_data_race: bool = "bool", "false", [], Debug, "", false,
        "Test only: run deliberately racy code.";
    DebugHost debug_host: String = "host-address", "localhost", [], Debug, "debugHost", false,
        "Address of the debug (profiling) server.";
    DebugPort debug_port: u16 = "int(0:65535)", "", [], Debug, "debugPort", false,
        "Port of the debug (profiling) server (0: off).";
    RouteSource route_source: String = "oneof(WorkloadIPs,CalicoIPAM)", "CalicoIPAM", [], Common, "routeSource", true,
        "Where routes to workloads come from: CalicoIPAM blocks or WorkloadIPs.";
    RouteTableRange route_table_range: Option<RouteTableRange> = "route-table-range", "", [DieOnFail], Common, "routeTableRange", false,
        "Deprecated single range of routing table indices (see RouteTableRanges).";
    RouteTableRanges route_table_ranges: Vec<RouteTableRange> = "route-table-ranges", "", [DieOnFail], Common, "routeTableRanges", false,
        "Ranges of routing table indices Felix may use, e.g. 1-250,300-400.";
    RouteSyncDisabled route_sync_disabled: bool = "bool", "false", [], Common, "routeSyncDisabled", true,
        "Do not touch routes at all (policy-only mode).";
    IPv4NormalRoutePriority ipv4_normal_route_priority: i64 = "int(1:2147483646)", "1024", [], Common, "ipv4NormalRoutePriority", false,
        "Metric of normal IPv4 workload routes (higher is less preferred).";
    IPv4ElevatedRoutePriority ipv4_elevated_route_priority: i64 = "int(1:2147483646)", "512", [], Common, "ipv4ElevatedRoutePriority", false,
        "Metric of IPv4 routes preferred during VM live migration.";
    IPv6NormalRoutePriority ipv6_normal_route_priority: i64 = "int(1:2147483646)", "1024", [], Common, "ipv6NormalRoutePriority", false,
        "Metric of normal IPv6 workload routes (higher is less preferred).";
    IPv6ElevatedRoutePriority ipv6_elevated_route_priority: i64 = "int(1:2147483646)", "512", [], Common, "ipv6ElevatedRoutePriority", false,
        "Metric of IPv6 routes preferred during VM live migration.";
    LiveMigrationRouteConvergenceTime live_migration_route_convergence_time: Duration = "seconds", "30", [], Common, "liveMigrationRouteConvergenceTime", false,
        "How long elevated route priority stays after a VM live migration.";
    IptablesNATOutgoingInterfaceFilter iptables_nat_outgoing_interface_filter: String = "iface-param", "", [], Iptables, "iptablesNATOutgoingInterfaceFilter", true,
        "Only NAT outgoing traffic leaving through interfaces matching this name (+ is a wildcard).";
    SidecarAccelerationEnabled sidecar_acceleration_enabled: bool = "bool", "false", [], Common, "sidecarAccelerationEnabled", false,
        "Experimental sidecar acceleration.";
    XDPEnabled xdp_enabled: bool = "bool", "true", [], Xdp, "xdpEnabled", false,
        "Accelerate untracked deny rules with XDP.";
    GenericXDPEnabled generic_xdp_enabled: bool = "bool", "false", [], Xdp, "genericXDPEnabled", false,
        "Allow generic (driverless) XDP.";
    Variant variant: String = "string", "Calico", [], ClusterIdentity, "", true,
        "Product variant (Calico).";
    GoGCThreshold go_gc_threshold: i64 = "int(-1)", "40", [], GoRuntime, "goGCThreshold", false,
        "Go GC percentage (-1 turns GC off).";
    GoMemoryLimitMB go_memory_limit_mb: i64 = "int(-1)", "-1", [], GoRuntime, "goMemoryLimitMB", false,
        "Go soft memory limit in MB (-1: none).";
    GoMaxProcs go_max_procs: i64 = "int(-1)", "-1", [], GoRuntime, "goMaxProcs", false,
        "Go GOMAXPROCS (-1: runtime default).";
    MTUIfacePattern mtu_iface_pattern: Option<String> = "regexp", "^((en|wl|ww|sl|ib)[Pcopsvx].*|(eth|wlan|wwan).*)", [], Common, "mtuIfacePattern", true,
        "Regular expression of host interfaces scanned to detect the MTU.";
    NftablesRefreshInterval nftables_refresh_interval: Duration = "seconds", "180", [], Nftables, "nftablesRefreshInterval", true,
        "How often nftables rules are re-checked (0 turns it off).";
    NftablesFilterAllowAction nftables_filter_allow_action: String = "oneof(ACCEPT,RETURN)", "ACCEPT", [NonZero, DieOnFail], Nftables, "nftablesFilterAllowAction", true,
        "nftables verdict for policy-allowed traffic in the filter table (ACCEPT or RETURN).";
    NftablesMangleAllowAction nftables_mangle_allow_action: String = "oneof(ACCEPT,RETURN)", "ACCEPT", [NonZero, DieOnFail], Nftables, "nftablesMangleAllowAction", false,
        "nftables verdict for policy-allowed traffic in the mangle table (ACCEPT or RETURN).";
    NftablesFilterDenyAction nftables_filter_deny_action: String = "oneof(DROP,REJECT)", "DROP", [NonZero, DieOnFail], Nftables, "nftablesFilterDenyAction", true,
        "nftables verdict for policy-denied traffic (DROP or REJECT).";
    NftablesMarkMask nftables_mark_mask: u32 = "mark-bitmask", "0xffff0000", [NonZero, DieOnFail], Nftables, "nftablesMarkMask", true,
        "Packet mark bits Felix may use with nftables (at least 2 bits).";
    RequireMTUFile require_mtu_file: bool = "bool", "false", [], Common, "requireMTUFile", true,
        "Refuse to start until the MTU file written by the CNI plugin exists.";
    BPFMaglevMaxEndpointsPerService bpf_maglev_max_endpoints_per_service: i64 = "int(1:3000)", "100", [], Bpf, "bpfMaglevMaxEndpointsPerService", false,
        "eBPF: most endpoints expected in one Maglev service.";
    BPFMaglevMaxServices bpf_maglev_max_services: i64 = "int(1:3000)", "100", [], Bpf, "bpfMaglevMaxServices", false,
        "eBPF: most Maglev services expected.";
}
