//! The parameter table itself: complete, consistent, and in step with the v3 resource model.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::collections::BTreeSet;

use margay_api::felix::FelixConfigurationSpec;
use margay_felix_config::{AssumeFilesExist, Config, Group, Kind, PARAMS, ParamId, Value};

#[test]
fn every_calico_parameter_is_in_the_table_once() {
    // Calico's Config struct has 218 tagged fields; margay also reads Calico Enterprise's
    // four flow-log file settings (FlowLogsFile*).
    assert_eq!(PARAMS.len(), 218 + 4);
    assert_eq!(ParamId::ALL.len(), PARAMS.len());
    let mut names = BTreeSet::new();
    let mut fields = BTreeSet::new();
    for (i, p) in PARAMS.iter().enumerate() {
        assert_eq!(p.id as usize, i, "{} is out of place", p.name);
        assert!(
            names.insert(p.name.to_ascii_lowercase()),
            "{} twice",
            p.name
        );
        assert!(fields.insert(p.field), "field {} twice", p.field);
        assert!(!p.description.is_empty(), "{} has no description", p.name);
        assert_eq!(ParamId::from_name(p.name), Some(p.id));
        assert_eq!(ParamId::from_name(&p.name.to_uppercase()), Some(p.id));
        assert_eq!(ParamId::from_name(&p.name.to_lowercase()), Some(p.id));
    }
    assert_eq!(ParamId::from_name("NoSuchParam"), None);
}

#[test]
fn every_kind_parses_and_every_default_fits_its_field() {
    let defaults = Config::defaults();
    for p in PARAMS {
        let kind = Kind::from_spec(p.kind).unwrap_or_else(|e| panic!("{}: {e}", p.name));
        if !p.default.is_empty() && !p.flags.skip_default_validation {
            kind.parse(p.default, &AssumeFilesExist)
                .unwrap_or_else(|e| panic!("default of {} does not parse: {e}", p.name));
        }
        // The default has the field's shape, and so has the zero value `none` stands for.
        let c = Config::default();
        assert_eq!(c.get(p.id), p.default_value(), "{}", p.name);
        assert_eq!(defaults.get(p.id), p.default_value(), "{}", p.name);
        assert_eq!(
            std::mem::discriminant(&c.get(p.id)),
            std::mem::discriminant(&kind.zero()),
            "{}: field type {} does not hold its kind's values",
            p.name,
            p.rust_type
        );
    }
}

#[test]
fn selected_defaults_match_calico() {
    let c = Config::defaults();
    let cases: &[(ParamId, &str)] = &[
        (ParamId::DatastoreType, "etcdv3"),
        (ParamId::EtcdAddr, "127.0.0.1:2379"),
        (ParamId::TyphaK8sNamespace, "kube-system"),
        (ParamId::TyphaReadTimeout, "30s"),
        (ParamId::TyphaWriteTimeout, "10s"),
        (ParamId::HealthHost, "localhost"),
        (ParamId::HealthPort, "9099"),
        (ParamId::PrometheusMetricsPort, "9091"),
        (ParamId::NFTablesMode, "Auto"),
        (ParamId::IptablesBackend, "auto"),
        (ParamId::DefaultEndpointToHostAction, "DROP"),
        (ParamId::ChainInsertMode, "insert"),
        (ParamId::IptablesMarkMask, "0xffff0000"),
        (ParamId::InterfacePrefix, "cali"),
        (ParamId::InterfaceExclude, "^kube-ipvs0$"),
        (ParamId::IptablesRefreshInterval, "3m0s"),
        (ParamId::RouteRefreshInterval, "1m30s"),
        (ParamId::MaxIpsetSize, "1048576"),
        (ParamId::IpInIpEnabled, "<unset>"),
        (ParamId::VXLANPort, "4789"),
        (ParamId::VXLANVNI, "4096"),
        (ParamId::WireguardListeningPort, "51820"),
        (ParamId::ProgramClusterRoutes, "EnabledIPIPOnly"),
        (ParamId::RouteSource, "CalicoIPAM"),
        (ParamId::RouteTableRanges, ""),
        (ParamId::DeviceRouteProtocol, "3"),
        (ParamId::RemoveExternalRoutes, "true"),
        (
            ParamId::FailsafeInboundHostPorts,
            "tcp:22,udp:68,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667",
        ),
        (
            ParamId::FailsafeOutboundHostPorts,
            "udp:53,udp:67,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667",
        ),
        (ParamId::ReportingIntervalSecs, "30s"),
        (ParamId::ReportingTTLSecs, "1m30s"),
        (ParamId::EndpointStatusPathPrefix, "/var/run/calico"),
        (ParamId::DataplaneWatchdogTimeout, "1m30s"),
        (ParamId::LogSeverityScreen, "INFO"),
        (ParamId::LogFilePath, "/var/log/calico/felix.log"),
        (ParamId::Ipv6Support, "true"),
        (ParamId::KubeNodePortRanges, "30000:32767"),
        (ParamId::IptablesLockProbeIntervalMillis, "50ms"),
        (ParamId::IstioDSCPMark, "23"),
        (ParamId::BPFPSNATPorts, "20000:29999"),
        (ParamId::GoMaxProcs, "-1"),
        (ParamId::ClusterGUID, "baddecaf"),
        (ParamId::Variant, "Calico"),
        (ParamId::DataplaneDriver, "calico-iptables-plugin"),
        (ParamId::UsageReportingIntervalSecs, "24h0m0s"),
        (
            ParamId::BPFConntrackTimeouts,
            "CreationGracePeriod=10s,GenericTimeout=10m,ICMPTimeout=5s,TCPEstablished=1h,\
             TCPFinsSeen=Auto,TCPResetSeen=40s,TCPSynSent=20s,UDPTimeout=60s",
        ),
    ];
    for (id, want) in cases {
        assert_eq!(c.get(*id).to_string(), *want, "default of {}", id.name());
    }
}

#[test]
fn flags_match_calico() {
    let local: Vec<&str> = PARAMS
        .iter()
        .filter(|p| p.flags.local)
        .map(|p| p.name)
        .collect();
    assert_eq!(
        local,
        [
            "DebugBPFCgroupV2",
            "DatastoreType",
            "FelixHostname",
            "EtcdAddr",
            "EtcdScheme",
            "EtcdKeyFile",
            "EtcdCertFile",
            "EtcdCaFile",
            "EtcdEndpoints",
            "TyphaAddr",
            "TyphaK8sServiceName",
            "TyphaK8sNamespace",
            "TyphaReadTimeout",
            "TyphaWriteTimeout",
            "TyphaKeyFile",
            "TyphaCertFile",
            "TyphaCAFile",
            "TyphaCN",
            "TyphaURISAN",
        ]
    );
    let die: BTreeSet<&str> = PARAMS
        .iter()
        .filter(|p| p.flags.die_on_fail)
        .map(|p| p.name)
        .collect();
    for name in [
        "DataplaneDriver",
        "DatastoreType",
        "MetadataAddr",
        "MetadataPort",
        "OpenstackRegion",
        "InterfacePrefix",
        "ChainInsertMode",
        "DefaultEndpointToHostAction",
        "IptablesFilterAllowAction",
        "IptablesMangleAllowAction",
        "IptablesFilterDenyAction",
        "LogFilePath",
        "IptablesMarkMask",
        "FailsafeInboundHostPorts",
        "FailsafeOutboundHostPorts",
        "ExternalNodesCIDRList",
        "RouteTableRange",
        "RouteTableRanges",
        "NftablesFilterAllowAction",
        "NftablesMangleAllowAction",
        "NftablesFilterDenyAction",
        "NftablesMarkMask",
    ] {
        assert!(die.contains(name), "{name} should be die-on-fail");
    }
    assert_eq!(die.len(), 22);
    let skip: Vec<&str> = PARAMS
        .iter()
        .filter(|p| p.flags.skip_default_validation)
        .map(|p| p.name)
        .collect();
    assert_eq!(skip, ["DataplaneDriver"]);
    assert_eq!(PARAMS.iter().filter(|p| p.flags.non_zero).count(), 40);
}

#[test]
fn live_parameters_are_calicos_four() {
    let live: Vec<&str> = PARAMS.iter().filter(|p| p.live()).map(|p| p.name).collect();
    assert_eq!(
        live,
        [
            "HealthTimeoutOverrides",
            "ClusterGUID",
            "ClusterType",
            "CalicoVersion"
        ]
    );
}

#[test]
fn groups_cover_the_table() {
    for g in Group::ALL {
        assert!(PARAMS.iter().any(|p| p.group == g), "group {g:?} is empty");
    }
    let count = |g| PARAMS.iter().filter(|p| p.group == g).count();
    assert_eq!(count(Group::Datastore), 18);
    assert_eq!(count(Group::Bpf), 46);
    assert_eq!(count(Group::NodeIdentity), 5);
    assert_eq!(count(Group::ClusterIdentity), 4);
}

#[test]
fn supported_parameters() {
    let supported: BTreeSet<&str> = PARAMS
        .iter()
        .filter(|p| p.supported)
        .map(|p| p.name)
        .collect();
    for name in [
        "DatastoreType",
        "FelixHostname",
        "EtcdEndpoints",
        "TyphaAddr",
        "HealthEnabled",
        "HealthTimeoutOverrides",
        "PrometheusMetricsEnabled",
        "LogSeverityScreen",
        "DefaultEndpointToHostAction",
        "InterfacePrefix",
        "NftablesMarkMask",
        "NFTablesMode",
        "VXLANVNI",
        "RouteRefreshInterval",
        "NATPortRange",
        "IPForwarding",
        "WorkloadSourceSpoofing",
        "ServiceLoopPrevention",
        "PrometheusMetricsCertFile",
        "Ipv6Support",
        "RouteSource",
        "BPFEnabled",
    ] {
        assert!(supported.contains(name), "{name} should be supported");
    }
    for name in [
        "WireguardEnabled",
        "IpInIpEnabled",
        "XDPEnabled",
        // Host endpoints and extra routing tables do not exist in margay yet.
        "FailsafeInboundHostPorts",
        "RouteTableRanges",
        "DeviceRouteProtocol",
        "ReportingIntervalSecs",
    ] {
        assert!(!supported.contains(name), "{name} is not supported");
    }
}

/// Every field name of FelixConfigurationSpec, from serde's "unknown field" message (which
/// lists the expected fields).
fn spec_fields() -> BTreeSet<String> {
    let err = serde_json::from_str::<FelixConfigurationSpec>(r#"{"noSuchFieldXyz": 1}"#)
        .expect_err("unknown field must be rejected")
        .to_string();
    let list = err.split("expected one of").nth(1).expect("field list");
    list.split(',')
        .map(|f| {
            f.trim()
                .trim_matches(|c: char| c == '`' || c.is_whitespace())
                .split('`')
                .next()
                .unwrap_or("")
                .to_string()
        })
        .filter(|f| !f.is_empty())
        .collect()
}

#[test]
fn every_felixconfiguration_field_maps_to_one_parameter() {
    let fields = spec_fields();
    assert!(fields.len() > 180, "parsed {} fields", fields.len());
    for f in &fields {
        if f == "nodeSelector" {
            continue;
        }
        let n = PARAMS.iter().filter(|p| p.v3_field == f).count();
        assert_eq!(n, 1, "spec.{f} maps to {n} parameters");
    }
    for p in PARAMS.iter().filter(|p| !p.v3_field.is_empty()) {
        assert!(
            fields.contains(p.v3_field),
            "{}: no spec.{}",
            p.name,
            p.v3_field
        );
    }
    // 187 of Calico's parameters can be set in a FelixConfiguration (the other 31 are local,
    // node or cluster identity, or debug-only), and the four FlowLogsFile* margay adds.
    assert_eq!(
        PARAMS.iter().filter(|p| !p.v3_field.is_empty()).count(),
        187 + 4
    );
    assert_eq!(fields.len(), 188 + 4);
}

#[test]
fn kind_specs() {
    let k = Kind::from_spec("int(0:65535)").unwrap();
    assert_eq!(
        k,
        Kind::Int {
            ranges: vec![(0, 65535)]
        }
    );
    assert_eq!(
        Kind::from_spec("int").unwrap(),
        Kind::Int {
            ranges: vec![(i64::MIN, i64::MAX)]
        }
    );
    assert_eq!(
        Kind::from_spec("int(-1)").unwrap(),
        Kind::Int {
            ranges: vec![(-1, i64::MAX)]
        }
    );
    // Calico's odd `int(0,9999)`: two ranges, >= 0 and >= 9999.
    assert_eq!(
        Kind::from_spec("int(0,9999)").unwrap(),
        Kind::Int {
            ranges: vec![(0, i64::MAX), (9999, i64::MAX)]
        }
    );
    assert_eq!(
        Kind::from_spec("int(10:22,15:,:63)").unwrap(),
        Kind::Int {
            ranges: vec![(10, 22), (15, i64::MAX), (i64::MIN, 63)]
        }
    );
    assert_eq!(
        Kind::from_spec("oneof(a,B)").unwrap(),
        Kind::OneOf(vec!["a", "B"])
    );
    assert_eq!(
        Kind::from_spec("file(must-exist,executable)").unwrap(),
        Kind::File {
            must_exist: true,
            executable: true
        }
    );
    assert_eq!(
        Kind::from_spec("seconds(1:10)").unwrap(),
        Kind::Seconds { min: 1, max: 10 }
    );
    assert!(Kind::from_spec("nonsense").is_err());
    assert!(Kind::from_spec("int(1").is_err());
    assert_eq!(Kind::from_spec("bool").unwrap().zero(), Value::Bool(false));
}

#[test]
fn verdict_mark_and_refresh_parameters_follow_calicos_mode() {
    use margay_felix_config::{ActedOn, Config, ParamId};
    let mut c = Config::defaults().clone();
    // NFTablesMode Auto (Calico: iptables without kube-proxy in nftables mode).
    assert_eq!(c.nftables_mode, "Auto");
    c.iptables_filter_deny_action = "REJECT".into();
    c.nftables_filter_deny_action = "DROP".into();
    c.iptables_refresh_interval = std::time::Duration::from_secs(7);
    c.iptables_mark_mask = 0xf0;
    assert_eq!(c.filter_deny_action(), "REJECT");
    assert_eq!(
        c.policy_refresh_interval(),
        std::time::Duration::from_secs(7)
    );
    assert_eq!(c.mark_mask(), 0xf0);
    assert!(c.acted_on(ParamId::IptablesFilterDenyAction).yes());
    assert!(matches!(
        c.acted_on(ParamId::NftablesFilterDenyAction),
        ActedOn::NotNow { .. }
    ));
    c.nftables_mode = "Enabled".into();
    assert_eq!(c.filter_deny_action(), "DROP");
    assert_eq!(c.mark_mask(), 0xffff_0000);
    assert!(c.acted_on(ParamId::NftablesRefreshInterval).yes());
    assert!(!c.acted_on(ParamId::IptablesRefreshInterval).yes());
    // Never acted on: margay behaves as the value says.
    assert_eq!(
        c.acted_on(ParamId::ReportingIntervalSecs),
        ActedOn::No {
            behaves_as: "0s".into()
        }
    );
}
