//! Datastore resources as configuration: FelixConfiguration fields → parameters, selector-
//! scoped and per-host configurations, annotations, ClusterInformation and the Node.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

mod common;

use common::{annotated, base, felix_config, node, selector_config, spec_log_severity};
use margay_api::duration::Duration;
use margay_api::felix::{
    BpfConntrackTimeouts, FelixConfigurationSpec, HealthTimeoutOverride, ProtoPort, RouteTableRange,
};
use margay_api::ippool::ClusterInformationSpec;
use margay_api::numorstring::{Dscp, Port};
use margay_api::{ClusterInformation, ObjectMeta};
use margay_felix_config::{ConfigInputs, ConfigWarning, Loaded, ParamId, Source, load};

fn d(s: &str) -> Option<Duration> {
    Some(Duration::new(s))
}

fn raw_of<'a>(l: &'a Loaded, source: Source, name: &str) -> Option<&'a str> {
    l.raw
        .get(&source)?
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.value.as_str())
}

fn load_global(spec: FelixConfigurationSpec) -> Loaded {
    let mut inputs = base();
    inputs.global = Some(felix_config("default", spec));
    load(&inputs).unwrap()
}

#[test]
fn v3_fields_become_calicos_v1_strings() {
    let spec = FelixConfigurationSpec {
        route_refresh_interval: d("12.345s"),
        iptables_lock_probe_interval: d("54.321ms"),
        endpoint_reporting_delay: d("0s"),
        ipsets_refresh_interval: d("100ms"),
        usage_reporting_interval: d("24h"),
        usage_reporting_initial_delay: d("300h"),
        reporting_ttl: d("1m30s"),
        wireguard_keep_alive: d("25s"),
        interface_prefix: Some("califoobar".into()),
        ipip_enabled: Some(false),
        ipv6_support: Some(false),
        xdp_enabled: Some(false),
        iptables_mark_mask: Some(1313),
        failsafe_inbound_host_ports: Some(vec![]),
        failsafe_outbound_host_ports: Some(vec![
            ProtoPort {
                protocol: "TCP".into(),
                port: 1234,
                net: "0.0.0.0/0".into(),
            },
            ProtoPort {
                protocol: "UDP".into(),
                port: 22,
                net: "0.0.0.0/0".into(),
            },
            ProtoPort {
                protocol: "TCP".into(),
                port: 65535,
                net: "0.0.0.0/0".into(),
            },
            ProtoPort {
                protocol: "UDP".into(),
                port: 53,
                net: "fd00::/8".into(),
            },
            ProtoPort {
                protocol: "TCP".into(),
                port: 179,
                net: String::new(),
            },
        ]),
        external_nodes_list: Some(vec!["1.1.1.1".into(), "2.2.2.2".into()]),
        iptables_nat_outgoing_interface_filter: Some("cali-123".into()),
        route_table_ranges: Some(vec![RouteTableRange { min: 43, max: 211 }]),
        route_table_range: Some(RouteTableRange { min: 1, max: 250 }),
        nftables_mark_mask: Some(1313),
        nftables_filter_deny_action: Some("Reject".into()),
        health_timeout_overrides: Some(vec![
            HealthTimeoutOverride {
                name: "Foo".into(),
                timeout: Duration::new("20s"),
            },
            HealthTimeoutOverride {
                name: "Bar".into(),
                timeout: Duration::new("90s"),
            },
        ]),
        bpf_conntrack_timeouts: Some(BpfConntrackTimeouts {
            tcp_established: Some("2h".into()),
            udp_timeout: Some("Auto".into()),
            ..BpfConntrackTimeouts::default()
        }),
        bpf_log_filters: Some([("all".to_string(), "tcp".to_string())].into()),
        nat_port_range: Some(Port::Range(32768, 65535)),
        bpf_psnat_ports: Some(Port::Single(20000)),
        kube_node_port_ranges: Some(vec![Port::Single(30000), Port::Range(31000, 32000)]),
        istio_dscp_mark: Some(Dscp::Name("EF".into())),
        bpf_maglev_max_services: Some(3),
        log_severity_screen: Some("Debug".into()),
        log_debug_filename_regex: Some(String::new()),
        ..FelixConfigurationSpec::default()
    };
    let l = load_global(spec);
    let g = Source::DatastoreGlobal;
    #[rustfmt::skip]
    let cases: &[(&str, &str, &str)] = &[
        // (parameter, raw string as Calico writes it, effective value)
        ("RouteRefreshInterval", "12.345", "12.345s"),
        ("IptablesLockProbeIntervalMillis", "54.321", "54.321ms"),
        ("EndpointReportingDelaySecs", "0", "0s"),
        ("IpsetsRefreshInterval", "0.1", "100ms"),
        ("UsageReportingIntervalSecs", "86400", "24h0m0s"),
        ("UsageReportingInitialDelaySecs", "1.08e+06", "300h0m0s"),
        ("ReportingTTLSecs", "90", "1m30s"),
        ("WireguardPersistentKeepAlive", "25", "25s"),
        ("InterfacePrefix", "califoobar", "califoobar"),
        ("IpInIpEnabled", "false", "false"),
        ("Ipv6Support", "false", "false"),
        ("XDPEnabled", "false", "false"),
        ("IptablesMarkMask", "1313", "0x00000521"),
        ("FailsafeInboundHostPorts", "none", ""),
        ("FailsafeOutboundHostPorts",
            "tcp:0.0.0.0/0:1234,udp:0.0.0.0/0:22,tcp:0.0.0.0/0:65535,udp:[fd00::/8]:53,tcp:179",
            "tcp:0.0.0.0/0:1234,udp:0.0.0.0/0:22,tcp:0.0.0.0/0:65535,udp:[fd00::/8]:53,tcp:179"),
        ("ExternalNodesCIDRList", "1.1.1.1,2.2.2.2", "1.1.1.1/32,2.2.2.2/32"),
        ("IptablesNATOutgoingInterfaceFilter", "cali-123", "cali-123"),
        ("RouteTableRanges", "43-211", "43-211"),
        ("RouteTableRange", "1-250", "1-250"),
        ("NftablesMarkMask", "1313", "0x00000521"),
        ("NftablesFilterDenyAction", "Reject", "REJECT"),
        ("HealthTimeoutOverrides", "Foo=20s,Bar=1m30s", "Bar=1m30s,Foo=20s"),
        ("BPFConntrackTimeouts", "TCPEstablished=2h,UDPTimeout=Auto", "TCPEstablished=2h,UDPTimeout=Auto"),
        ("BPFLogFilters", "all=tcp,", "all=tcp"),
        ("NATPortRange", "32768:65535", "32768:65535"),
        ("BPFPSNATPorts", "20000", "20000"),
        ("KubeNodePortRanges", "30000,31000:32000", "30000,31000:32000"),
        ("IstioDSCPMark", "EF", "46"),
        ("BPFMaglevMaxServices", "3", "3"),
        ("LogSeverityScreen", "Debug", "DEBUG"),
    ];
    for (name, raw, value) in cases {
        assert_eq!(raw_of(&l, g, name), Some(*raw), "raw {name}");
        let id = ParamId::from_name(name).unwrap();
        assert_eq!(l.config.get(id).to_string(), *value, "value of {name}");
        let eff = l.source_of(id);
        assert_eq!(eff.source, g, "{name}");
        assert!(
            eff.origin
                .starts_with("FelixConfiguration \"default\" spec."),
            "{}",
            eff.origin
        );
    }
    // An empty string field counts as unset.
    assert_eq!(raw_of(&l, g, "LogDebugFilenameRegex"), None);
    assert!(
        l.warnings
            .iter()
            .all(|w| !matches!(w, ConfigWarning::InvalidValue { .. })),
        "{:?}",
        l.warnings
    );
}

/// JSON values (in order of preference) that set a parameter of this kind to something
/// other than its default.
fn samples(p: &margay_felix_config::ParamMeta) -> Vec<serde_json::Value> {
    use margay_felix_config::{Kind, Value};
    use serde_json::json;
    let default = p.default_value();
    match p.kind() {
        Kind::Bool => vec![json!(default != Value::Bool(true))],
        Kind::OptBool => vec![json!(true)],
        Kind::Int { .. } => match default {
            Value::Int(i) => vec![json!(i + 1)],
            _ => vec![],
        },
        Kind::MarkBitmask => vec![json!(0xff00_0000u32)],
        Kind::Seconds { .. } | Kind::Millis => vec![json!("7s")],
        Kind::OneOf(options) => options
            .iter()
            .rev()
            .filter(|o| Value::Str(o.to_string()) != default)
            .map(|o| json!(o))
            .take(1)
            .collect(),
        Kind::IfaceList | Kind::IfaceListRegexp | Kind::IfaceParam => vec![json!("eth9")],
        Kind::Hostname | Kind::HostAddress => vec![json!("example.com")],
        Kind::Region => vec![json!("r1")],
        Kind::File { .. } => vec![json!("/tmp/x")],
        Kind::Str => vec![json!("x")],
        Kind::LogRate => vec![json!("5/second")],
        Kind::Regexp { .. } => vec![json!("^x$")],
        Kind::Ipv4 => vec![json!("10.1.2.3")],
        Kind::Ipv6 => vec![json!("fd00::9")],
        Kind::CidrList => vec![json!(["10.0.0.0/8"])],
        Kind::PortList => vec![json!([{"protocol": "TCP", "port": 99}])],
        Kind::PortRange => vec![json!("1000:2000")],
        Kind::PortRangeList => vec![json!([1000, "2000:3000"])],
        Kind::RouteTableRange => vec![json!({"min": 2, "max": 3})],
        Kind::RouteTableRanges => vec![json!([{"min": 2, "max": 3}])],
        Kind::KeyValueList => vec![
            json!({"tcpSynSent": "5s"}),
            json!({"all": "x"}),
            json!("A=b"),
        ],
        Kind::KeyDurationList => vec![json!([{"name": "X", "timeout": "5s"}])],
        Kind::Dscp => vec![json!(10)],
        Kind::IfaceFilterSlice | Kind::StringSlice | Kind::InterfaceNameSlice => {
            vec![json!(["eth0"])]
        }
        _ => vec![],
    }
}

#[test]
fn every_settable_field_reaches_its_parameter() {
    let mut checked = 0;
    for p in margay_felix_config::PARAMS
        .iter()
        .filter(|p| !p.v3_field.is_empty())
    {
        let spec = samples(p).into_iter().find_map(|v| {
            let mut obj = serde_json::Map::new();
            obj.insert(p.v3_field.into(), v);
            serde_json::from_value::<FelixConfigurationSpec>(obj.into()).ok()
        });
        let spec = spec.unwrap_or_else(|| panic!("no sample value for spec.{}", p.v3_field));
        let l = load_global(spec);
        let eff = l.source_of(p.id);
        assert_eq!(
            eff.source,
            Source::DatastoreGlobal,
            "{} ({:?})",
            p.name,
            l.warnings
        );
        assert_ne!(
            l.config.get(p.id),
            p.default_value(),
            "{} stayed at its default",
            p.name
        );
        assert!(
            !l.warnings
                .iter()
                .any(|w| matches!(w, ConfigWarning::InvalidValue { .. })),
            "{}: {:?}",
            p.name,
            l.warnings
        );
        checked += 1;
    }
    // 187 of Calico's and the four FlowLogsFile* (Calico Enterprise's).
    assert_eq!(checked, 187 + 4);
}

#[test]
fn an_unparsable_duration_in_a_resource_is_reported_and_skipped() {
    let spec = FelixConfigurationSpec {
        route_refresh_interval: d("soon"),
        ..FelixConfigurationSpec::default()
    };
    let l = load_global(spec);
    assert_eq!(l.config.route_refresh_interval.as_secs(), 90);
    assert!(l.warnings.iter().any(|w| matches!(
        w,
        ConfigWarning::InvalidResourceValue { field, .. } if field == "spec.routeRefreshInterval"
    )));
}

#[test]
fn annotations_are_settings_and_override_the_spec() {
    let mut fc = felix_config("default", spec_log_severity("Debug"));
    fc.metadata.annotations = [
        ("config.projectcalico.org/LogSeverityScreen", "Error"),
        ("config.projectcalico.org/VXLANVNI", "5000"),
        ("config.projectcalico.org/NotAParam", "x"),
        ("other.io/LogSeveritySys", "debug"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut inputs = base();
    inputs.global = Some(fc);
    let l = load(&inputs).unwrap();
    assert_eq!(l.config.log_severity_screen, "ERROR");
    assert_eq!(
        l.source_of(ParamId::LogSeverityScreen).origin,
        "FelixConfiguration \"default\" annotation config.projectcalico.org/LogSeverityScreen"
    );
    assert_eq!(l.config.vxlan_vni, 5000);
    assert_eq!(l.config.log_severity_sys, "INFO");
    assert!(l.unknown.iter().any(|u| u.name == "NotAParam"));
    // Only one LogSeverityScreen setting: the annotation replaced the spec's.
    let n = l.raw[&Source::DatastoreGlobal]
        .iter()
        .filter(|s| s.name == "LogSeverityScreen")
        .count();
    assert_eq!(n, 1);

    // Annotations are not validated by the API: a bad one falls back to the default.
    let mut inputs = base();
    inputs.per_host = Some(annotated("node.node-1", &[("LogSeverityScreen", "chatty")]));
    let l = load(&inputs).unwrap();
    assert_eq!(l.config.log_severity_screen, "INFO");
    assert!(l.warnings.iter().any(|w| matches!(
        w,
        ConfigWarning::InvalidValue {
            source: Source::DatastorePerHost,
            ..
        }
    )));
}

#[test]
fn per_host_overrides_global() {
    let mut inputs = base();
    inputs.global = Some(felix_config("default", spec_log_severity("Debug")));
    inputs.per_host = Some(felix_config("node.node-1", spec_log_severity("Error")));
    let l = load(&inputs).unwrap();
    assert_eq!(l.config.log_severity_screen, "ERROR");
    assert_eq!(
        l.source_of(ParamId::LogSeverityScreen).source,
        Source::DatastorePerHost
    );

    // Another node's configuration does not apply.
    inputs.per_host = Some(felix_config("node.node-2", spec_log_severity("Error")));
    let l = load(&inputs).unwrap();
    assert_eq!(l.config.log_severity_screen, "DEBUG");
    assert!(
        l.warnings
            .iter()
            .any(|w| matches!(w, ConfigWarning::IgnoredResource { .. }))
    );

    // The hostname comes from the local sources, and picks the per-host resource.
    let mut inputs = base();
    inputs
        .env
        .insert("FELIX_FELIXHOSTNAME".into(), "node-2".into());
    inputs.per_host = Some(felix_config("node.node-2", spec_log_severity("Error")));
    assert_eq!(load(&inputs).unwrap().config.log_severity_screen, "ERROR");
}

fn selector_inputs(
    configs: Vec<margay_api::FelixConfiguration>,
    labels: &[(&str, &str)],
) -> ConfigInputs {
    let mut inputs = base();
    inputs.global = Some(felix_config("default", spec_log_severity("Debug")));
    inputs.per_selector = configs;
    inputs.node = Some(node("node-1", labels));
    inputs
}

fn with_level(
    mut fc: margay_api::FelixConfiguration,
    level: &str,
) -> margay_api::FelixConfiguration {
    fc.spec.log_severity_screen = Some(level.into());
    fc
}

#[test]
fn node_selector_configs() {
    let t1 = Some("2024-01-01T00:00:00Z");
    let t2 = Some("2024-06-01T00:00:00Z");
    #[rustfmt::skip]
    type Case = (
        &'static str,
        Vec<margay_api::FelixConfiguration>,
        &'static [(&'static str, &'static str)],
        &'static str,
        Option<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            "match",
            vec![with_level(
                selector_config("workers", "role == 'worker'", t1),
                "Error",
            )],
            &[("role", "worker")],
            "ERROR",
            Some("workers"),
        ),
        (
            "no match",
            vec![with_level(
                selector_config("workers", "role == 'worker'", t1),
                "Error",
            )],
            &[("role", "master")],
            "DEBUG",
            None,
        ),
        (
            "no labels, has()",
            vec![with_level(
                selector_config("workers", "has(role)", t1),
                "Error",
            )],
            &[],
            "DEBUG",
            None,
        ),
        (
            "all() matches a node without labels",
            vec![with_level(
                selector_config("everyone", "all()", t1),
                "Error",
            )],
            &[],
            "ERROR",
            Some("everyone"),
        ),
        (
            "oldest of two wins",
            vec![
                with_level(selector_config("newer", "all()", t2), "Warning"),
                with_level(selector_config("older", "all()", t1), "Error"),
            ],
            &[("a", "b")],
            "ERROR",
            Some("older"),
        ),
        (
            "same age: name breaks the tie",
            vec![
                with_level(selector_config("b-config", "all()", t1), "Warning"),
                with_level(selector_config("a-config", "all()", t1), "Error"),
            ],
            &[],
            "ERROR",
            Some("a-config"),
        ),
        (
            "no timestamp counts as oldest",
            vec![
                with_level(selector_config("dated", "all()", t1), "Warning"),
                with_level(selector_config("undated", "all()", None), "Error"),
            ],
            &[],
            "ERROR",
            Some("undated"),
        ),
        (
            "the older one does not match",
            vec![
                with_level(selector_config("older", "role == 'x'", t1), "Warning"),
                with_level(selector_config("newer", "role == 'worker'", t2), "Error"),
            ],
            &[("role", "worker")],
            "ERROR",
            Some("newer"),
        ),
        (
            "empty selector is not selector-scoped",
            vec![with_level(selector_config("empty", "", t1), "Error")],
            &[],
            "DEBUG",
            None,
        ),
        (
            "default and node.* in the list are skipped",
            vec![
                with_level(selector_config("default", "all()", t1), "Error"),
                with_level(selector_config("node.node-1", "all()", t1), "Error"),
            ],
            &[],
            "DEBUG",
            None,
        ),
        (
            "invalid selector is skipped",
            vec![
                with_level(selector_config("bad", "role ==", t1), "Warning"),
                with_level(selector_config("good", "all()", t2), "Error"),
            ],
            &[],
            "ERROR",
            Some("good"),
        ),
    ];
    for (name, configs, labels, want, winner) in cases {
        let l = load(&selector_inputs(configs, labels)).unwrap();
        assert_eq!(l.config.log_severity_screen, want, "{name}");
        assert_eq!(l.selector_config.as_deref(), winner, "{name}");
        let src = l.source_of(ParamId::LogSeverityScreen).source;
        let want_src = if winner.is_some() {
            Source::DatastorePerSelector
        } else {
            Source::DatastoreGlobal
        };
        assert_eq!(src, want_src, "{name}");
    }
}

#[test]
fn several_matching_selector_configs_are_reported() {
    let configs = vec![
        with_level(
            selector_config("b", "all()", Some("2024-01-02T00:00:00Z")),
            "Warning",
        ),
        with_level(
            selector_config("a", "all()", Some("2024-01-01T00:00:00Z")),
            "Error",
        ),
        selector_config("c", "x == 'y'", None),
    ];
    let l = load(&selector_inputs(configs, &[])).unwrap();
    assert!(
        l.warnings
            .contains(&ConfigWarning::MultipleSelectorMatches {
                matching: vec!["a".into(), "b".into()],
                winner: "a".into(),
            })
    );
    let invalid = vec![selector_config("bad", "role ==", None)];
    let l = load(&selector_inputs(invalid, &[])).unwrap();
    assert!(l.warnings.iter().any(|w| matches!(
        w,
        ConfigWarning::InvalidResourceValue { field, .. } if field == "spec.nodeSelector"
    )));
}

#[test]
fn selector_configs_need_the_node() {
    let mut inputs = selector_inputs(
        vec![with_level(
            selector_config("everyone", "all()", None),
            "Error",
        )],
        &[],
    );
    inputs.node = None;
    assert_eq!(load(&inputs).unwrap().config.log_severity_screen, "DEBUG");
    // Another node's resource does not count either.
    inputs.node = Some(node("node-9", &[]));
    let l = load(&inputs).unwrap();
    assert_eq!(l.config.log_severity_screen, "DEBUG");
    assert!(
        l.warnings
            .iter()
            .any(|w| matches!(w, ConfigWarning::IgnoredResource { .. }))
    );
}

#[test]
fn selector_sits_between_global_and_per_host() {
    let mut inputs = selector_inputs(
        vec![with_level(
            selector_config("everyone", "all()", None),
            "Warning",
        )],
        &[],
    );
    inputs.per_host = Some(felix_config("node.node-1", spec_log_severity("Error")));
    let l = load(&inputs).unwrap();
    assert_eq!(l.config.log_severity_screen, "ERROR");
    // Selector annotations apply too.
    let mut fc = annotated("everyone", &[("VXLANVNI", "4242")]);
    fc.spec.node_selector = Some("all()".into());
    let l = load(&selector_inputs(vec![fc], &[])).unwrap();
    assert_eq!(l.config.vxlan_vni, 4242);
    assert_eq!(
        l.source_of(ParamId::VXLANVNI).source,
        Source::DatastorePerSelector
    );
}

#[test]
fn the_node_provides_tunnel_addresses() {
    let mut n = node("node-1", &[]);
    n.spec.ipv4_vxlan_tunnel_addr = "10.244.1.0".into();
    n.spec.vxlan_tunnel_mac_addr = "66:2b:7f:01:02:03".into();
    n.spec.ipv6_vxlan_tunnel_addr = "fd00:0:0::1".into();
    n.spec.bgp = Some(margay_api::endpoint::NodeBgpSpec {
        ipv4_ipip_tunnel_addr: "not-an-ip".into(),
        ..Default::default()
    });
    let mut inputs = base();
    inputs.node = Some(n);
    let l = load(&inputs).unwrap();
    assert_eq!(
        l.config.get(ParamId::IPv4VXLANTunnelAddr).to_string(),
        "10.244.1.0"
    );
    assert_eq!(
        l.config.get(ParamId::IPv6VXLANTunnelAddr).to_string(),
        "fd00::1"
    );
    assert_eq!(l.config.vxlan_tunnel_mac_addr, "66:2b:7f:01:02:03");
    assert_eq!(
        l.source_of(ParamId::IPv4VXLANTunnelAddr).source,
        Source::DatastorePerHost
    );
    assert_eq!(
        l.source_of(ParamId::IPv4VXLANTunnelAddr).origin,
        "Node \"node-1\" spec.ipv4VXLANTunnelAddr"
    );
    assert_eq!(l.config.ip_in_ip_tunnel_addr, None);
    assert!(l.warnings.iter().any(|w| matches!(
        w,
        ConfigWarning::InvalidResourceValue { field, .. } if field == "spec.bgp.ipv4IPIPTunnelAddr"
    )));
    // The Node's addresses and labels are not configuration.
    assert!(l.unknown.is_empty());
}

#[test]
fn cluster_information_sets_identity_and_readiness() {
    let ci = ClusterInformation::new(
        ObjectMeta::named("default"),
        ClusterInformationSpec {
            cluster_guid: "abcedfg".into(),
            cluster_type: "Mesos,K8s".into(),
            calico_version: "v3.31.0".into(),
            datastore_ready: Some(true),
            variant: String::new(),
        },
    );
    let mut inputs = base();
    inputs.cluster_info = Some(ci.clone());
    let l = load(&inputs).unwrap();
    assert_eq!(l.config.cluster_guid, "abcedfg");
    assert_eq!(l.config.cluster_type, "Mesos,K8s");
    assert_eq!(l.config.calico_version, "v3.31.0");
    assert_eq!(l.config.variant, "Calico");
    assert_eq!(l.datastore_ready, Some(true));
    assert_eq!(
        l.source_of(ParamId::ClusterGUID).source,
        Source::DatastoreGlobal
    );

    let mut not_ready = ci;
    not_ready.spec.datastore_ready = None;
    inputs.cluster_info = Some(not_ready);
    assert_eq!(load(&inputs).unwrap().datastore_ready, Some(false));
    assert_eq!(load(&base()).unwrap().datastore_ready, None);
}

#[test]
fn the_global_resource_must_be_named_default() {
    let mut inputs = base();
    inputs.global = Some(felix_config("global", spec_log_severity("Error")));
    let l = load(&inputs).unwrap();
    assert_eq!(l.config.log_severity_screen, "INFO");
    assert!(
        l.warnings
            .iter()
            .any(|w| matches!(w, ConfigWarning::IgnoredResource { .. }))
    );
}
