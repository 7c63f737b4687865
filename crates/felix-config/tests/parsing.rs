//! Parsing of every kind of parameter, table-driven. Most cases are facts from Calico's
//! config_params_test.go / param_types_test.go; the rest follow its parsers' rules.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

mod common;

use common::{load_one, with_env};
use margay_felix_config::{
    ConfigWarning, FatalConfigError, HostProbe, PARAMS, ParamId, Source, load, load_with_probe,
};

#[derive(Debug, Clone, Copy)]
enum Want {
    /// Parses to this value (as displayed).
    Ok(&'static str),
    /// Does not parse: a warning, and this value (the default) is used.
    Warn(&'static str),
    /// Parses with an adjustment (a warning note), to this value.
    Note(&'static str),
    /// Does not parse and the parameter is die-on-fail (or `none` on a non-zero one).
    Fatal,
    /// Parses, but the configuration as a whole is invalid.
    Invalid,
}
use Want::*;

const FAILSAFE_IN: &str =
    "tcp:22,udp:68,tcp:179,tcp:2379,tcp:2380,tcp:5473,tcp:6443,tcp:6666,tcp:6667";

#[rustfmt::skip]
const CASES: &[(&str, &str, Want)] = &[
    // Empty raw values are ignored: the default stays.
    ("NetlinkTimeoutSecs", "", Ok("10s")),
    ("EndpointStatusPathPrefix", "", Ok("/var/run/calico")),
    ("EndpointStatusPathPrefix", "none", Ok("")),
    // hostname
    ("FelixHostname", "hostname", Ok("hostname")),
    ("FelixHostname", "hostname.foo.bar.com", Ok("hostname.foo.bar.com")),
    ("FelixHostname", "1.2.3.4", Ok("1.2.3.4")),
    ("FelixHostname", "bad host", Invalid),
    ("FelixHostname", "none", Fatal),
    // authority, oneof, endpoint-list
    ("EtcdAddr", "10.0.0.1:1234", Ok("10.0.0.1:1234")),
    ("EtcdAddr", "host:1234", Ok("host:1234")),
    ("EtcdAddr", "", Ok("127.0.0.1:2379")),
    ("EtcdAddr", "host", Warn("127.0.0.1:2379")),
    ("EtcdAddr", "host:port", Warn("127.0.0.1:2379")),
    ("EtcdAddr", "http://host:1", Warn("127.0.0.1:2379")),
    // margay: TyphaAddr takes one or several authorities.
    ("TyphaAddr", "10.0.0.1:5473", Ok("10.0.0.1:5473")),
    ("TyphaAddr", "t1:5473,t2:5473", Ok("t1:5473,t2:5473")),
    ("TyphaAddr", "t1:5473,t2", Warn("")),
    ("EtcdScheme", "https", Ok("https")),
    ("EtcdScheme", "HTTPS", Ok("https")),
    ("EtcdScheme", "ftp", Warn("http")),
    ("EtcdEndpoints", "http://127.0.0.1:1234, http://host:2345", Ok("http://127.0.0.1:1234/,http://host:2345/")),
    ("EtcdEndpoints", "https://127.0.0.1:1234/, https://host:2345", Ok("https://127.0.0.1:1234/,https://host:2345/")),
    ("EtcdEndpoints", ",http://etcd:1234,,http://etcd2:2345,", Ok("http://etcd:1234/,http://etcd2:2345/")),
    ("EtcdEndpoints", "HTTP://[fd00::1]:2379", Ok("http://[fd00::1]:2379/")),
    ("EtcdEndpoints", "http://user:pw@host:2379", Warn("")),
    ("EtcdEndpoints", "http://host:2379/path", Warn("")),
    ("EtcdEndpoints", "http://host:2379?x=1", Warn("")),
    ("EtcdEndpoints", "127.0.0.1:2379", Warn("")),
    ("TyphaAddr", "", Ok("")),
    ("TyphaAddr", "foo:1234", Ok("foo:1234")),
    ("TyphaAddr", "foo", Warn("")),
    ("TyphaK8sServiceName", "calico-typha", Ok("calico-typha")),
    ("TyphaK8sNamespace", "", Ok("kube-system")),
    ("TyphaK8sNamespace", "default", Ok("default")),
    ("TyphaK8sNamespace", "none", Fatal),
    ("TyphaReadTimeout", "45", Ok("45s")),
    ("DatastoreType", "kubernetes", Ok("kubernetes")),
    ("DatastoreType", "Kubernetes", Ok("kubernetes")),
    ("DatastoreType", "k8s", Fatal),
    // iface-list, iface-list-regexp
    ("InterfacePrefix", "tap", Ok("tap")),
    ("InterfacePrefix", "tap,cali", Ok("tap,cali")),
    ("InterfacePrefix", "tap,", Fatal),
    ("InterfacePrefix", "none", Fatal),
    ("InterfaceExclude", "kube-ipvs0", Ok("^kube-ipvs0$")),
    ("InterfaceExclude", "kube-ipvs0,dummy", Ok("^kube-ipvs0$,^dummy$")),
    ("InterfaceExclude", "/kube-ipvs/", Ok("kube-ipvs")),
    ("InterfaceExclude", "kube-ipvs0,dummy,/^veth.*$/", Ok("^kube-ipvs0$,^dummy$,^veth.*$")),
    ("InterfaceExclude", "/^kube.*/,/veth/", Ok("^kube.*,veth")),
    ("InterfaceExclude", "kube,//", Warn("^kube-ipvs0$")),
    ("InterfaceExclude", "/kube,/,dummy", Warn("^kube-ipvs0$")),
    (r"InterfaceExclude", r"/^kube\K/", Warn("^kube-ipvs0$")),
    ("InterfaceExclude", "not.a.valid.interf@e!!", Warn("^kube-ipvs0$")),
    ("InterfaceExclude", "none", Ok("")),
    // oneof: case-insensitive, canonical spelling
    ("ChainInsertMode", "append", Ok("append")),
    ("ChainInsertMode", "Append", Ok("append")),
    ("ChainInsertMode", "prepend", Fatal),
    ("DefaultEndpointToHostAction", "RETURN", Ok("RETURN")),
    ("DefaultEndpointToHostAction", "accept", Ok("ACCEPT")),
    ("DefaultEndpointToHostAction", "REJECT", Fatal),
    ("IptablesFilterAllowAction", "RETURN", Ok("RETURN")),
    ("IptablesMangleAllowAction", "RETURN", Ok("RETURN")),
    ("IptablesFilterDenyAction", "DROP", Ok("DROP")),
    ("IptablesFilterDenyAction", "REJECT", Ok("REJECT")),
    ("NftablesFilterDenyAction", "reject", Ok("REJECT")),
    ("NFTablesMode", "enabled", Ok("Enabled")),
    ("NFTablesMode", "yes", Warn("Auto")),
    ("IptablesBackend", "Auto", Ok("auto")),
    ("ProgramClusterRoutes", "enabledipiponly", Ok("EnabledIPIPOnly")),
    ("ProgramClusterRoutes", "NotAValue", Warn("EnabledIPIPOnly")),
    ("LogSeverityFile", "debug", Ok("DEBUG")),
    ("LogSeverityFile", "warning", Ok("WARNING")),
    ("LogSeverityFile", "error", Ok("ERROR")),
    ("LogSeverityFile", "fatal", Ok("FATAL")),
    ("LogSeverityScreen", "debug", Ok("DEBUG")),
    ("LogSeverityScreen", "Warning", Ok("WARNING")),
    ("LogSeverityScreen", "warn", Warn("INFO")),
    ("LogSeveritySys", "error", Ok("ERROR")),
    ("LogSeveritySys", "none", Ok("")),
    ("BPFLogLevel", "none", Fatal),
    // seconds / millis
    ("IptablesPostWriteCheckIntervalSecs", "1.5", Ok("1.5s")),
    ("IptablesLockProbeIntervalMillis", "123", Ok("123ms")),
    ("IptablesLockProbeIntervalMillis", "garbage", Warn("50ms")),
    ("IptablesLockProbeIntervalMillis", "0.5", Ok("500µs")),
    ("ReportingIntervalSecs", "31", Ok("31s")),
    ("ReportingTTLSecs", "91", Ok("1m31s")),
    ("ReportingIntervalSecs", "0", Ok("0s")),
    ("ReportingIntervalSecs", "1e3", Ok("16m40s")),
    ("ReportingIntervalSecs", "1e+06", Ok("277h46m40s")),
    ("ReportingIntervalSecs", "-5", Note("0s")),
    ("ReportingIntervalSecs", "30s", Warn("30s")),
    ("ReportingIntervalSecs", "inf", Warn("30s")),
    ("EndpointReportingDelaySecs", "10", Ok("10s")),
    ("RouteRefreshInterval", "none", Ok("0s")),
    // bool and *bool
    ("EndpointReportingEnabled", "true", Ok("true")),
    ("EndpointReportingEnabled", "yes", Ok("true")),
    ("EndpointReportingEnabled", "T", Ok("true")),
    ("EndpointReportingEnabled", "0", Ok("false")),
    ("EndpointReportingEnabled", "maybe", Warn("false")),
    ("HealthEnabled", "true", Ok("true")),
    ("PrometheusGoMetricsEnabled", "false", Ok("false")),
    ("PrometheusProcessMetricsEnabled", "n", Ok("false")),
    ("RequireMTUFile", "true", Ok("true")),
    ("RequireMTUFile", "y", Ok("true")),
    ("RequireMTUFile", "True", Ok("true")),
    ("IpInIpEnabled", "true", Ok("true")),
    ("IpInIpEnabled", "y", Ok("true")),
    ("IpInIpEnabled", "False", Ok("false")),
    ("IpInIpEnabled", "none", Ok("<unset>")),
    ("VXLANEnabled", "nope", Warn("<unset>")),
    // int
    ("IpInIpMtu", "1234", Ok("1234")),
    ("MaxIpsetSize", "12345", Ok("12345")),
    ("MaxIpsetSize", "none", Fatal),
    ("MaxIpsetSize", "1.5", Warn("1048576")),
    ("VXLANVNI", "0x10", Ok("16")),
    ("VXLANVNI", "010", Ok("8")),
    ("VXLANVNI", "1_000", Ok("1000")),
    ("HealthPort", "1234", Ok("1234")),
    ("HealthPort", "65536", Warn("9099")),
    ("HealthPort", "-1", Warn("9099")),
    ("PrometheusMetricsPort", "1234", Ok("1234")),
    ("MetadataPort", "99999", Fatal),
    ("GoMaxProcs", "", Ok("-1")),
    ("GoMaxProcs", "-2", Warn("-1")),
    ("GoMaxProcs", "1000", Ok("1000")),
    ("LogActionRateLimitBurst", "-1", Warn("5")),
    // Calico's `int(0,9999)` is two open-ended ranges, so anything >= 0 passes.
    ("LogActionRateLimitBurst", "100000", Ok("100000")),
    ("BPFMaglevMaxServices", "0", Warn("100")),
    ("BPFMaglevMaxServices", "3000", Ok("3000")),
    ("IPv4NormalRoutePriority", "2147483647", Warn("1024")),
    ("DeviceRouteProtocol", "80", Ok("80")),
    // mark-bitmask
    ("IptablesMarkMask", "0xf0f0", Ok("0x0000f0f0")),
    ("IptablesMarkMask", "4294901760", Ok("0xffff0000")),
    ("IptablesMarkMask", "0x1", Fatal),
    ("IptablesMarkMask", "0x1ffffffff", Fatal),
    ("NftablesMarkMask", "0xff000000", Ok("0xff000000")),
    // host-address, ipv4, ipv6
    ("HealthHost", "127.0.0.1", Ok("127.0.0.1")),
    ("HealthHost", "::", Ok("::")),
    ("HealthHost", "my host", Warn("localhost")),
    ("PrometheusMetricsHost", "10.0.0.1", Ok("10.0.0.1")),
    ("IpInIpTunnelAddr", "10.0.0.1", Ok("10.0.0.1")),
    ("DeviceRouteSourceAddress", "10.1.1.2", Ok("10.1.1.2")),
    ("DeviceRouteSourceAddress", "::ffff:10.1.1.2", Ok("10.1.1.2")),
    ("DeviceRouteSourceAddress", "aabc::1111", Warn("<unset>")),
    ("DeviceRouteSourceAddress", " ", Warn("<unset>")),
    ("DeviceRouteSourceAddressIPv6", "aabc::1111", Ok("aabc::1111")),
    ("DeviceRouteSourceAddressIPv6", "10.1.1.2", Warn("<unset>")),
    ("NATOutgoingAddress", "192.168.0.1", Ok("192.168.0.1")),
    // port-list
    ("FailsafeInboundHostPorts", "1,2,3,4", Ok("tcp:1,tcp:2,tcp:3,tcp:4")),
    ("FailsafeOutboundHostPorts", "1,2,3,4", Ok("tcp:1,tcp:2,tcp:3,tcp:4")),
    ("FailsafeInboundHostPorts", "tcp:1,udp:2", Ok("tcp:1,udp:2")),
    ("FailsafeInboundHostPorts", "TCP:1, UDP:2", Ok("tcp:1,udp:2")),
    ("FailsafeInboundHostPorts", "tcp:0.0.0.0/0:1,udp:0.0.0.0/0:2", Ok("tcp:0.0.0.0/0:1,udp:0.0.0.0/0:2")),
    ("FailsafeOutboundHostPorts", "tcp:[::/0]:1,udp:[::/0]:2", Ok("tcp:[::/0]:1,udp:[::/0]:2")),
    ("FailsafeInboundHostPorts", "1,udp:2", Ok("tcp:1,udp:2")),
    ("FailsafeInboundHostPorts", "1,udp:0.0.0.0/0:2", Ok("tcp:1,udp:0.0.0.0/0:2")),
    ("FailsafeInboundHostPorts", "tcp:10.1.2.3/8:22", Ok("tcp:10.0.0.0/8:22")),
    ("FailsafeInboundHostPorts", "udp:10.1.2.3:53", Ok("udp:10.1.2.3/32:53")),
    ("FailsafeInboundHostPorts", "foo:1", Fatal),
    ("FailsafeInboundHostPorts", "tcp:0.0.0.0/0:1:bar", Fatal),
    ("FailsafeInboundHostPorts", "tcp:65536", Fatal),
    ("FailsafeInboundHostPorts", "tcp:[::/0:1", Fatal),
    ("FailsafeInboundHostPorts", "sctp:1", Fatal),
    ("FailsafeInboundHostPorts", "none", Ok("")),
    ("FailsafeOutboundHostPorts", "none", Ok("")),
    ("FailsafeInboundHostPorts", "", Ok(FAILSAFE_IN)),
    // portrange, portrange-list
    ("KubeNodePortRanges", "30001:30002,30030:30040,30500:30600", Ok("30001:30002,30030:30040,30500:30600")),
    ("KubeNodePortRanges", "30001:30002, 30030:30040", Warn("30000:32767")),
    ("KubeNodePortRanges", "http", Warn("30000:32767")),
    ("NATPortRange", "32768:65535", Ok("32768:65535")),
    ("NATPortRange", "80", Ok("80")),
    ("NATPortRange", "80:80", Ok("80")),
    ("NATPortRange", "100:50", Warn("<unset>")),
    ("NATPortRange", "http", Warn("<unset>")),
    ("BPFPSNATPorts", "none", Ok("<unset>")),
    // iface-param, iface-filter-slice
    ("IptablesNATOutgoingInterfaceFilter", "cali-123", Ok("cali-123")),
    ("IptablesNATOutgoingInterfaceFilter", "eth+", Ok("eth+")),
    ("IptablesNATOutgoingInterfaceFilter", "cali@123", Warn("")),
    ("WireguardInterfaceName", "wg@0", Warn("wireguard.cali")),
    ("WireguardInterfaceName", "none", Fatal),
    ("BPFForceTrackPacketsFromIfaces", "", Ok("docker+")),
    ("BPFForceTrackPacketsFromIfaces", "docker0", Ok("docker0")),
    ("BPFForceTrackPacketsFromIfaces", "cali-123", Ok("cali-123")),
    ("BPFForceTrackPacketsFromIfaces", "docker+", Ok("docker+")),
    ("BPFForceTrackPacketsFromIfaces", "docker0,docker1", Ok("docker0,docker1")),
    ("BPFForceTrackPacketsFromIfaces", "cali@123", Warn("docker+")),
    ("BPFForceTrackPacketsFromIfaces", "cali-123,cali@123", Warn("docker+")),
    // keyvaluelist, keydurationlist
    ("HealthTimeoutOverrides", "", Ok("")),
    ("HealthTimeoutOverrides", "a=90s", Ok("a=1m30s")),
    ("HealthTimeoutOverrides", "a=90s, b=10ms", Ok("a=1m30s,b=10ms")),
    ("HealthTimeoutOverrides", "a=0", Ok("a=0s")),
    ("HealthTimeoutOverrides", ",  key=1s,", Ok("key=1s")),
    ("HealthTimeoutOverrides", "foo=bar", Warn("")),
    ("HealthTimeoutOverrides", "key=1s, none=", Warn("")),
    ("FeatureDetectOverride", "SNATFullyRandom=true,MASQFullyRandom=false", Ok("MASQFullyRandom=false,SNATFullyRandom=true")),
    ("FeatureDetectOverride", "  key=value,  v2= x ,,,,", Ok("key=value,v2= x ")),
    ("FeatureDetectOverride", "key=key = value,v2=7", Ok("key=key = value,v2=7")),
    ("FeatureDetectOverride", "key=value,malformed", Warn("")),
    ("FeatureGates", "a-b=c", Ok("b=c")),
    // regexp
    ("LogDebugFilenameRegex", ".*", Ok(".*")),
    ("LogDebugFilenameRegex", "(", Warn("<unset>")),
    ("BPFDataIfacePattern", "^eth0$", Ok("^eth0$")),
    ("BPFDataIfacePattern", "[", Warn("^((en|wl|ww|sl|ib)[Popsx].*|(eth|wlan|wwan|bond).*)")),
    // log-rate
    ("LogActionRateLimit", "10/second", Ok("10/second")),
    ("LogActionRateLimit", "9999/day", Ok("9999/day")),
    ("LogActionRateLimit", "0/second", Warn("")),
    ("LogActionRateLimit", "10000/hour", Warn("")),
    ("LogActionRateLimit", "10/week", Warn("")),
    // region (die-on-fail)
    ("OpenstackRegion", "region1", Ok("region1")),
    ("OpenstackRegion", "RegionOne", Fatal),
    ("OpenstackRegion", "us/east", Fatal),
    ("OpenstackRegion", "my_region", Fatal),
    ("OpenstackRegion", "my-region-has-a-very-long-and-extremely-interesting-name", Fatal),
    // route-table-range(s) (die-on-fail)
    ("RouteTableRange", "1-250", Ok("1-250")),
    ("RouteTableRange", "1-255", Fatal),
    ("RouteTableRange", "0-10", Fatal),
    ("RouteTableRanges", "1-10000", Ok("1-10000")),
    ("RouteTableRanges", "1-250,300-400", Ok("1-250,300-400")),
    ("RouteTableRanges", "1-250 300-400", Ok("1-250,300-400")),
    ("RouteTableRanges", "250-260", Note("250-260")),
    ("RouteTableRanges", "4294967295-4294967296", Fatal),
    ("RouteTableRanges", "1-100000000", Fatal),
    ("RouteTableRanges", "1-65535,99999-99999", Fatal),
    ("RouteTableRanges", "1-65535,1-2147483647", Fatal),
    ("RouteTableRanges", "abcde", Fatal),
    ("RouteTableRanges", "0-10", Fatal),
    ("RouteTableRanges", "10-5", Fatal),
    // cidr-list
    ("ExternalNodesCIDRList", "1.1.1.1", Ok("1.1.1.1/32")),
    ("ExternalNodesCIDRList", "1.1.1.1/24, 2.2.2.2", Ok("1.1.1.0/24,2.2.2.2/32")),
    ("ExternalNodesCIDRList", "fd00::1/64", Ok("fd00::/64")),
    ("ExternalNodesCIDRList", "1.1.1.1/33", Fatal),
    ("BPFExcludeCIDRsFromNAT", "nope", Warn("")),
    // string, file
    ("LogFilePath", "/tmp/felix.log", Ok("/tmp/felix.log")),
    ("LogFilePath", "none", Ok("")),
    ("LogPrefix", "multi\nline", Warn("calico-packet")),
    ("ClusterType", "k8s,bgp", Ok("k8s,bgp")),
    ("MetadataAddr", "bad host", Fatal),
    ("MetadataAddr", "none", Ok("")),
    // dscp
    ("IstioDSCPMark", "EF", Ok("46")),
    ("IstioDSCPMark", " af11 ", Ok("10")),
    ("IstioDSCPMark", "63", Ok("63")),
    ("IstioDSCPMark", "64", Warn("23")),
    ("IstioDSCPMark", "AF99", Warn("23")),
];

#[test]
fn parsing_table() {
    assert!(CASES.len() >= 200, "{} cases", CASES.len());
    let mut failures = Vec::new();
    for (name, raw, want) in CASES {
        let id = ParamId::from_name(name).unwrap_or_else(|| panic!("no parameter {name}"));
        let result = load_one(name, raw);
        let invalid_warned = |l: &margay_felix_config::Loaded| {
            l.warnings
                .iter()
                .any(|w| matches!(w, ConfigWarning::InvalidValue { param, .. } if param == name))
        };
        let noted = |l: &margay_felix_config::Loaded| {
            l.warnings
                .iter()
                .any(|w| matches!(w, ConfigWarning::Adjusted { param, .. } if param == name))
        };
        let problem = match (want, &result) {
            (Ok(v), Result::Ok(l)) => {
                let got = l.config.get(id).to_string();
                if got != *v {
                    Some(format!("got {got:?}, want {v:?}"))
                } else if invalid_warned(l) {
                    Some("unexpected invalid-value warning".into())
                } else {
                    None
                }
            }
            (Warn(v), Result::Ok(l)) => {
                let got = l.config.get(id).to_string();
                if got != *v {
                    Some(format!("got {got:?}, want fallback {v:?}"))
                } else if !invalid_warned(l) {
                    Some("no invalid-value warning".into())
                } else {
                    None
                }
            }
            (Note(v), Result::Ok(l)) => {
                let got = l.config.get(id).to_string();
                if got != *v {
                    Some(format!("got {got:?}, want {v:?}"))
                } else if !noted(l) {
                    Some("no adjustment warning".into())
                } else {
                    None
                }
            }
            (Fatal, Err(e)) if e.param() == Some(id.name()) => None,
            (Invalid, Err(FatalConfigError::Invalid(_))) => None,
            (_, r) => Some(format!("unexpected result {r:?}")),
        };
        if let Some(p) = problem {
            failures.push(format!("{name}={raw:?} ({want:?}): {p}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn none_sets_the_zero_value_unless_non_zero() {
    for p in PARAMS {
        let r = load_one(p.name, "none");
        if p.flags.non_zero {
            assert!(
                matches!(&r, Err(FatalConfigError::NoneNotAllowed { param, .. }) if *param == p.name),
                "{}: {r:?}",
                p.name
            );
            continue;
        }
        if matches!(p.name, "EtcdAddr" | "EtcdScheme") {
            // Without EtcdEndpoints, etcdv3 needs both.
            assert!(matches!(r, Err(FatalConfigError::Invalid(_))), "{}", p.name);
            continue;
        }
        let l = r.unwrap_or_else(|e| panic!("{}: {e}", p.name));
        assert_eq!(l.config.get(p.id), p.kind().zero(), "{}", p.name);
        assert_eq!(l.source_of(p.id).source, Source::EnvironmentVariable);
        // "None" in any case.
        let upper = load_one(p.name, "NONE").unwrap();
        assert_eq!(upper.config.get(p.id), p.kind().zero(), "{}", p.name);
    }
}

#[test]
fn every_default_raw_value_parses_back_to_the_default() {
    for p in PARAMS.iter().filter(|p| !p.default.is_empty()) {
        if p.flags.skip_default_validation {
            continue;
        }
        let l = load_one(p.name, p.default).unwrap_or_else(|e| panic!("{}: {e}", p.name));
        assert_eq!(l.config.get(p.id), p.default_value(), "{}", p.name);
    }
}

struct Probe {
    files: &'static [&'static str],
    executables: &'static [&'static str],
}

impl HostProbe for Probe {
    fn file_exists(&self, path: &str) -> bool {
        self.files.contains(&path)
    }
    fn find_executable(&self, name: &str) -> Option<String> {
        self.executables
            .contains(&name)
            .then(|| format!("/usr/local/bin/{name}"))
    }
}

#[test]
fn files_are_checked_through_the_probe() {
    let probe = Probe {
        files: &["/etc/etcd/key.pem"],
        executables: &["my-driver"],
    };
    let cases: &[(&str, &str, Result<&str, ()>)] = &[
        (
            "EtcdKeyFile",
            "/etc/etcd/key.pem",
            Result::Ok("/etc/etcd/key.pem"),
        ),
        // Not die-on-fail: a missing file falls back to the default (no key).
        ("EtcdKeyFile", "/missing.pem", Result::Ok("")),
        // Existence is only checked for must-exist files.
        (
            "LogFilePath",
            "/missing/felix.log",
            Result::Ok("/missing/felix.log"),
        ),
        (
            "DataplaneDriver",
            "my-driver",
            Result::Ok("/usr/local/bin/my-driver"),
        ),
        ("DataplaneDriver", "other-driver", Err(())),
    ];
    for (name, raw, want) in cases {
        let inputs = with_env(&[(&format!("FELIX_{name}"), raw)]);
        let r = load_with_probe(&inputs, &probe);
        let id = ParamId::from_name(name).unwrap();
        match want {
            Result::Ok(v) => {
                let l = r.unwrap_or_else(|e| panic!("{name}={raw}: {e}"));
                assert_eq!(l.config.get(id).to_string(), *v, "{name}={raw}");
            }
            Err(()) => assert!(r.is_err(), "{name}={raw} should be fatal"),
        }
    }
    // The default DataplaneDriver is not validated (skip-default-validation): no probe
    // failure without a setting.
    let l = load_with_probe(&common::base(), &probe).unwrap();
    assert_eq!(l.config.dataplane_driver, "calico-iptables-plugin");
}

#[test]
fn an_invalid_value_is_reported_with_its_source_and_fallback() {
    let l = load_one("LogSeverityScreen", "loud").unwrap();
    let w = l
        .warnings
        .iter()
        .find(|w| matches!(w, ConfigWarning::InvalidValue { .. }))
        .unwrap();
    assert_eq!(
        w,
        &ConfigWarning::InvalidValue {
            param: "LogSeverityScreen",
            raw: "loud".into(),
            source: Source::EnvironmentVariable,
            origin: "FELIX_LogSeverityScreen".into(),
            reason: "unknown option".into(),
            fallback: Some("INFO".into()),
        }
    );
    assert_eq!(
        w.to_string(),
        "invalid value \"loud\" for LogSeverityScreen from environment variable \
         (FELIX_LogSeverityScreen): unknown option; using the default \"INFO\""
    );
    // The source is the one that gave the bad value; the value is the default.
    let eff = l.source_of(ParamId::LogSeverityScreen);
    assert_eq!(eff.source, Source::EnvironmentVariable);
    assert_eq!(eff.raw, "loud");
    assert!(eff.note.is_some());
}

#[test]
fn fatal_errors_name_parameter_value_and_source() {
    let e = load(&with_env(&[("FELIX_CHAININSERTMODE", "sideways")])).unwrap_err();
    assert_eq!(
        e,
        FatalConfigError::InvalidValue {
            param: "ChainInsertMode",
            raw: "sideways".into(),
            from: Source::EnvironmentVariable,
            origin: "FELIX_CHAININSERTMODE".into(),
            reason: "unknown option".into(),
        }
    );
    assert_eq!(
        e.to_string(),
        "invalid value \"sideways\" for ChainInsertMode from environment variable \
         (FELIX_CHAININSERTMODE): unknown option"
    );
    let e = load(&with_env(&[("FELIX_INTERFACEPREFIX", "None")])).unwrap_err();
    assert!(
        e.to_string().contains("InterfacePrefix cannot be \"none\""),
        "{e}"
    );
}
