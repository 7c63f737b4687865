//! Configuration changes (restart or live) and the `margay felix config` output.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

mod common;

use common::{base, felix_config, spec_log_severity, with_env};
use margay_api::ObjectMeta;
use margay_api::ippool::ClusterInformationSpec;
use margay_felix_config::{Change, Config, PARAMS, ParamId, RESTART_EXIT_CODE, Source, load};

fn loaded(vars: &[(&str, &str)]) -> Config {
    load(&with_env(vars)).unwrap().config
}

#[test]
fn restart_logic_table() {
    #[rustfmt::skip]
    type Vars = &'static [(&'static str, &'static str)];
    let cases: &[(Vars, Vars, &[&str], &[&str])] = &[
        // (old env, new env, changed, needing a restart)
        (&[], &[], &[], &[]),
        (
            &[],
            &[("FELIX_LOGSEVERITYSCREEN", "debug")],
            &["LogSeverityScreen"],
            &["LogSeverityScreen"],
        ),
        (
            &[("FELIX_LOGSEVERITYSCREEN", "debug")],
            &[("FELIX_LOGSEVERITYSCREEN", "DEBUG")],
            &[],
            &[],
        ),
        (&[], &[("FELIX_CLUSTERGUID", "abc")], &["ClusterGUID"], &[]),
        (
            &[],
            &[("FELIX_CLUSTERTYPE", "k8s,bgp")],
            &["ClusterType"],
            &[],
        ),
        (
            &[],
            &[("FELIX_CALICOVERSION", "v3.31.0")],
            &["CalicoVersion"],
            &[],
        ),
        (
            &[],
            &[("FELIX_HEALTHTIMEOUTOVERRIDES", "a=5s")],
            &["HealthTimeoutOverrides"],
            &[],
        ),
        (
            &[("FELIX_HEALTHTIMEOUTOVERRIDES", "a=5s")],
            &[("FELIX_HEALTHTIMEOUTOVERRIDES", "a=5000ms")],
            &[],
            &[],
        ),
        (
            &[],
            &[("FELIX_CLUSTERGUID", "abc"), ("FELIX_VXLANVNI", "5000")],
            &["VXLANVNI", "ClusterGUID"],
            &["VXLANVNI"],
        ),
        (
            &[],
            &[("FELIX_VARIANT", "Enterprise")],
            &["Variant"],
            &["Variant"],
        ),
        // Same value, different source or spelling: no change.
        (&[("FELIX_ROUTEREFRESHINTERVAL", "90")], &[], &[], &[]),
        (
            &[("FELIX_ROUTEREFRESHINTERVAL", "60")],
            &[("FELIX_ROUTEREFRESHINTERVAL", "60.0")],
            &[],
            &[],
        ),
        (
            &[("FELIX_FAILSAFEINBOUNDHOSTPORTS", "tcp:22")],
            &[("FELIX_FAILSAFEINBOUNDHOSTPORTS", "22")],
            &[],
            &[],
        ),
        (
            &[("FELIX_FAILSAFEINBOUNDHOSTPORTS", "tcp:22")],
            &[("FELIX_FAILSAFEINBOUNDHOSTPORTS", "udp:22")],
            &["FailsafeInboundHostPorts"],
            &["FailsafeInboundHostPorts"],
        ),
        (
            &[("FELIX_BPFENABLED", "true")],
            &[],
            &["BPFEnabled"],
            &["BPFEnabled"],
        ),
    ];
    for (old, new, changed, restart) in cases {
        let (a, b) = (loaded(old), loaded(new));
        let got: Vec<&str> = a.changed_params(&b).iter().map(|c| c.name).collect();
        assert_eq!(got, *changed, "{old:?} -> {new:?}");
        let got: Vec<&str> = a.restart_required(&b).iter().map(|c| c.name).collect();
        assert_eq!(got, *restart, "{old:?} -> {new:?}");
    }
}

#[test]
fn a_change_says_from_what_to_what() {
    let a = loaded(&[]);
    let b = loaded(&[
        ("FELIX_ROUTEREFRESHINTERVAL", "30"),
        ("FELIX_CLUSTERGUID", "x"),
    ]);
    let changes = a.changed_params(&b);
    assert_eq!(
        changes[0],
        Change {
            id: ParamId::RouteRefreshInterval,
            name: "RouteRefreshInterval",
            old: "1m30s".into(),
            new: "30s".into(),
            live: false,
        }
    );
    assert_eq!(
        changes[0].to_string(),
        "RouteRefreshInterval changed from \"1m30s\" to \"30s\" (needs a restart)"
    );
    assert_eq!(
        changes[1].to_string(),
        "ClusterGUID changed from \"baddecaf\" to \"x\" (applied live)"
    );
    assert_eq!(RESTART_EXIT_CODE, 129);
}

#[test]
fn a_datastore_update_that_changes_a_parameter_needs_a_restart() {
    let mut inputs = base();
    let before = load(&inputs).unwrap().config;
    inputs.global = Some(felix_config("default", spec_log_severity("Debug")));
    let after = load(&inputs).unwrap().config;
    let restart = before.restart_required(&after);
    assert_eq!(restart.len(), 1);
    assert_eq!(restart[0].old, "INFO");
    assert_eq!(restart[0].new, "DEBUG");

    // ClusterInformation updates are live.
    let mut ci_inputs = inputs.clone();
    ci_inputs.cluster_info = Some(margay_api::ClusterInformation::new(
        ObjectMeta::named("default"),
        ClusterInformationSpec {
            cluster_guid: "new-guid".into(),
            calico_version: "v3.31.1".into(),
            ..Default::default()
        },
    ));
    let updated = load(&ci_inputs).unwrap().config;
    assert_eq!(after.changed_params(&updated).len(), 2);
    assert!(after.restart_required(&updated).is_empty());
}

#[test]
fn default_config_has_no_changes_against_itself() {
    let a = Config::default();
    assert!(a.changed_params(&Config::default()).is_empty());
    // Every parameter is compared.
    let b = Config {
        vxlan_vni: 1,
        interface_exclude: vec![],
        nat_port_range: Some(margay_felix_config::PortRange { min: 1, max: 2 }),
        ..Config::default()
    };
    assert_eq!(a.changed_params(&b).len(), 3);
}

#[test]
fn derived_values() {
    let c = loaded(&[
        ("FELIX_INTERFACEPREFIX", "cali,tap"),
        ("FELIX_INTERFACEEXCLUDE", "kube-ipvs0,/^veth/"),
    ]);
    assert_eq!(c.interface_prefixes(), ["cali", "tap"]);
    let re = c.interface_exclude_regexes();
    assert!(re[0].is_match("kube-ipvs0") && !re[0].is_match("kube-ipvs01"));
    assert!(re[1].is_match("veth123"));
    let rt = |vars: &[(&str, &str)]| {
        loaded(vars)
            .route_table_indices()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(rt(&[]), ["1-250"]);
    assert_eq!(rt(&[("FELIX_ROUTETABLERANGE", "10-20")]), ["10-20"]);
    assert_eq!(
        rt(&[
            ("FELIX_ROUTETABLERANGE", "10-20"),
            ("FELIX_ROUTETABLERANGES", "1-5,300-400")
        ]),
        ["1-5", "300-400"]
    );
    // Linux's reserved tables are never handed out.
    assert_eq!(
        rt(&[("FELIX_ROUTETABLERANGES", "250-260,253-255,100-300")]),
        ["250-252", "256-260", "100-252", "256-300"]
    );
}

#[test]
fn render_table_lists_every_parameter_with_its_source() {
    let mut inputs = with_env(&[
        ("FELIX_LOGSEVERITYSCREEN", "debug"),
        ("FELIX_WIREGUARDENABLED", "true"),
        ("FELIX_MYSTERY", "42"),
    ]);
    inputs.config_file = Some("[global]\nHealthEnabled = true\n".into());
    let l = load(&inputs).unwrap();
    let text = l.render_table(false);
    for p in PARAMS {
        assert!(
            text.lines().any(|line| line
                .get(1..)
                .is_some_and(|l| l.starts_with(&format!("{} ", p.name)))),
            "{} missing",
            p.name
        );
    }
    let line = |name: &str| {
        text.lines()
            .find(|l| {
                l.get(1..)
                    .is_some_and(|l| l.starts_with(&format!("{name} ")))
            })
            .unwrap()
            .to_string()
    };
    let ls = line("LogSeverityScreen");
    assert!(
        ls.contains("DEBUG") && ls.contains("environment variable (FELIX_LOGSEVERITYSCREEN)"),
        "{ls}"
    );
    let he = line("HealthEnabled");
    assert!(
        he.contains("true") && he.contains("config file (line 2 [global])"),
        "{he}"
    );
    let fh = line("FelixHostname");
    assert!(
        fh.contains("node-1") && fh.contains("<default> (kernel hostname)"),
        "{fh}"
    );
    // `*` marks parameters margay does not act on.
    assert!(line("WireguardEnabled").starts_with('*'));
    assert!(line("BPFEnabled").starts_with(' '));
    assert!(line("LogSeverityScreen").starts_with(' '));
    assert!(text.contains("[Datastore connection]"));
    assert!(text.contains("[Dataplane: eBPF]"));
    assert!(text.contains("[Unknown parameters (ignored)]"));
    assert!(text.contains("mystery"));
    assert!(text.contains("[Warnings]"));
    assert!(text.contains("WireguardEnabled=\"true\""));

    let only = l.render_table(true);
    assert!(only.contains("LogSeverityScreen"));
    assert!(only.contains("HealthEnabled"));
    assert!(!only.contains("VXLANVNI"));
}

#[test]
fn json_report() {
    let l = load(&with_env(&[("FELIX_VXLANVNI", "4097")])).unwrap();
    let json = l.to_json();
    let params = json["params"].as_array().unwrap();
    assert_eq!(params.len(), PARAMS.len());
    let vni = params.iter().find(|p| p["name"] == "VXLANVNI").unwrap();
    assert_eq!(vni["value"], "4097");
    assert_eq!(vni["raw"], "4097");
    assert_eq!(vni["source"], "environmentVariable");
    assert_eq!(vni["origin"], "FELIX_VXLANVNI");
    assert_eq!(vni["default"], "4096");
    assert_eq!(vni["group"], "Overlay: VXLAN overlay");
    assert_eq!(vni["supported"], true);
    assert_eq!(vni["live"], false);
    let report = l.report();
    assert_eq!(
        report.params[ParamId::VXLANVNI as usize].source,
        Source::EnvironmentVariable
    );
    // Warnings serialize with their kind.
    let l = load(&with_env(&[("FELIX_NOPE", "1")])).unwrap();
    assert_eq!(l.to_json()["warnings"][0]["kind"], "unknownParameter");
}
