//! Sources and their priority, Calico's flags, environment variables and felix.cfg.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

mod common;

use std::collections::BTreeMap;

use common::{annotated, base, felix_config, node, selector_config, spec_log_severity, with_env};
use margay_felix_config::ini::parse_ini;
use margay_felix_config::{
    ConfigInputs, ConfigWarning, FatalConfigError, ParamId, Source, WarnOnce, load,
};

/// Inputs where `source` sets LogSeverityScreen to `level`.
fn set_in(inputs: &mut ConfigInputs, source: Source, level: &str) {
    match source {
        Source::Default => {}
        Source::DatastoreGlobal => {
            inputs.global = Some(felix_config("default", spec_log_severity(level)));
        }
        Source::DatastorePerSelector => {
            let mut fc = selector_config("by-role", "role == 'worker'", None);
            fc.spec.log_severity_screen = Some(level.into());
            inputs.per_selector = vec![fc];
            inputs.node = Some(node("node-1", &[("role", "worker")]));
        }
        Source::DatastorePerHost => {
            inputs.per_host = Some(felix_config("node.node-1", spec_log_severity(level)));
        }
        Source::ConfigFile => {
            inputs.config_file = Some(format!("[global]\nLogSeverityScreen = {level}\n"));
        }
        Source::EnvironmentVariable => {
            inputs
                .env
                .insert("FELIX_LOGSEVERITYSCREEN".into(), level.into());
        }
        Source::InternalOverride => {
            inputs
                .overrides
                .insert("LogSeverityScreen".into(), level.into());
        }
    }
}

const ALL: [Source; 7] = [
    Source::Default,
    Source::DatastoreGlobal,
    Source::DatastorePerSelector,
    Source::DatastorePerHost,
    Source::ConfigFile,
    Source::EnvironmentVariable,
    Source::InternalOverride,
];

#[test]
fn each_source_alone_sets_the_value() {
    for source in ALL {
        let mut inputs = base();
        set_in(&mut inputs, source, "debug");
        let l = load(&inputs).unwrap();
        let eff = l.source_of(ParamId::LogSeverityScreen);
        assert_eq!(eff.source, source);
        let want = if source == Source::Default {
            "INFO"
        } else {
            "DEBUG"
        };
        assert_eq!(l.config.log_severity_screen, want, "{source}");
    }
}

#[test]
fn higher_source_wins_for_every_pair() {
    let mut pairs = 0;
    for (i, low) in ALL.iter().enumerate() {
        for high in &ALL[i + 1..] {
            let mut inputs = base();
            set_in(&mut inputs, *low, "warning");
            set_in(&mut inputs, *high, "error");
            let l = load(&inputs).unwrap();
            assert_eq!(l.config.log_severity_screen, "ERROR", "{low} vs {high}");
            assert_eq!(
                l.source_of(ParamId::LogSeverityScreen).source,
                *high,
                "{low} vs {high}"
            );
            assert!(l.set_by(ParamId::LogSeverityScreen, *high));
            if *low != Source::Default {
                assert!(l.set_by(ParamId::LogSeverityScreen, *low));
            }
            pairs += 1;
        }
    }
    assert_eq!(pairs, 21);
}

#[test]
fn source_order_and_names_are_calicos() {
    let mut sorted = ALL;
    sorted.sort();
    assert_eq!(sorted, ALL);
    let names: Vec<String> = ALL.iter().map(ToString::to_string).collect();
    assert_eq!(
        names,
        [
            "<default>",
            "datastore (global)",
            "datastore (per-node-selector)",
            "datastore (per-host)",
            "config file",
            "environment variable",
            "internal override"
        ]
    );
    let local: Vec<bool> = ALL.iter().map(|s| s.is_local()).collect();
    assert_eq!(local, [true, false, false, false, true, true, true]);
}

#[test]
fn local_parameters_are_ignored_from_the_datastore() {
    for source in [
        Source::DatastoreGlobal,
        Source::DatastorePerSelector,
        Source::DatastorePerHost,
    ] {
        let mut inputs = base();
        let fc = annotated(
            "x",
            &[("DatastoreType", "kubernetes"), ("TyphaAddr", "typha:5473")],
        );
        match source {
            Source::DatastoreGlobal => {
                let mut fc = fc;
                fc.metadata.name = "default".into();
                inputs.global = Some(fc);
            }
            Source::DatastorePerSelector => {
                let mut fc = fc;
                fc.metadata.name = "sel".into();
                fc.spec.node_selector = Some("all()".into());
                inputs.per_selector = vec![fc];
                inputs.node = Some(node("node-1", &[("a", "b")]));
            }
            _ => {
                let mut fc = fc;
                fc.metadata.name = "node.node-1".into();
                inputs.per_host = Some(fc);
            }
        }
        let l = load(&inputs).unwrap();
        assert_eq!(l.config.datastore_type, "etcdv3", "{source}");
        assert_eq!(l.config.typha_addr, "", "{source}");
        assert_eq!(l.source_of(ParamId::DatastoreType).source, Source::Default);
        let local_warnings: Vec<_> = l
            .warnings
            .iter()
            .filter(|w| matches!(w, ConfigWarning::LocalOnly { source: s, .. } if *s == source))
            .collect();
        assert_eq!(local_warnings.len(), 2, "{source}: {:?}", l.warnings);
    }
    // Accepted from local sources.
    for inputs in [
        with_env(&[("FELIX_DATASTORETYPE", "kubernetes")]),
        ConfigInputs {
            config_file: Some("DatastoreType=kubernetes".into()),
            ..base()
        },
        ConfigInputs {
            overrides: [("DatastoreType".to_string(), "kubernetes".to_string())].into(),
            ..base()
        },
    ] {
        assert_eq!(load(&inputs).unwrap().config.datastore_type, "kubernetes");
    }
}

#[test]
fn a_local_value_in_the_datastore_is_ignored_even_if_invalid_or_none() {
    // The local check comes before parsing: a value that would be fatal is only a warning.
    let mut inputs = base();
    inputs.global = Some(annotated(
        "default",
        &[("DatastoreType", "garbage"), ("TyphaK8sNamespace", "none")],
    ));
    let l = load(&inputs).unwrap();
    assert_eq!(l.config.datastore_type, "etcdv3");
    assert_eq!(l.config.typha_k8s_namespace, "kube-system");
}

#[test]
fn none_for_a_non_zero_parameter_is_fatal_from_any_source() {
    for source in &ALL[1..] {
        let mut inputs = base();
        match source {
            Source::DatastoreGlobal => {
                inputs.global = Some(annotated("default", &[("InterfacePrefix", "none")]))
            }
            Source::DatastorePerSelector => {
                let mut fc = annotated("sel", &[("InterfacePrefix", "none")]);
                fc.spec.node_selector = Some("all()".into());
                inputs.per_selector = vec![fc];
                inputs.node = Some(node("node-1", &[("a", "b")]));
            }
            Source::DatastorePerHost => {
                inputs.per_host = Some(annotated("node.node-1", &[("InterfacePrefix", "none")]))
            }
            Source::ConfigFile => inputs.config_file = Some("InterfacePrefix=none".into()),
            Source::EnvironmentVariable => {
                inputs
                    .env
                    .insert("FELIX_INTERFACEPREFIX".into(), "None".into());
            }
            _ => {
                inputs
                    .overrides
                    .insert("InterfacePrefix".into(), "NONE".into());
            }
        }
        let e = load(&inputs).unwrap_err();
        assert!(
            matches!(&e, FatalConfigError::NoneNotAllowed { param: "InterfacePrefix", from, .. } if from == source),
            "{source}: {e:?}"
        );
    }
}

#[test]
fn die_on_fail_is_fatal_even_when_a_higher_source_overrides() {
    // Calico parses every source before picking the winner.
    let mut inputs = with_env(&[("FELIX_DEFAULTENDPOINTTOHOSTACTION", "ACCEPT")]);
    inputs.global = Some(annotated(
        "default",
        &[("DefaultEndpointToHostAction", "MAYBE")],
    ));
    let e = load(&inputs).unwrap_err();
    assert_eq!(e.param(), Some("DefaultEndpointToHostAction"));
    assert!(matches!(
        e,
        FatalConfigError::InvalidValue {
            from: Source::DatastoreGlobal,
            ..
        }
    ));
}

#[test]
fn an_invalid_value_uses_the_default_not_a_lower_sources_value() {
    let mut inputs = with_env(&[("FELIX_LOGSEVERITYSCREEN", "loud")]);
    inputs.global = Some(felix_config("default", spec_log_severity("Debug")));
    let l = load(&inputs).unwrap();
    assert_eq!(l.config.log_severity_screen, "INFO");
    assert_eq!(
        l.source_of(ParamId::LogSeverityScreen).source,
        Source::EnvironmentVariable
    );
    // A bad value in a lower source that is overridden: warned, no fallback announced.
    let mut inputs = with_env(&[("FELIX_LOGSEVERITYSCREEN", "error")]);
    inputs.global = Some(felix_config("default", spec_log_severity("loud")));
    let l = load(&inputs).unwrap();
    assert_eq!(l.config.log_severity_screen, "ERROR");
    assert!(l.warnings.iter().any(|w| matches!(
        w,
        ConfigWarning::InvalidValue {
            param: "LogSeverityScreen",
            fallback: None,
            ..
        }
    )));
}

#[test]
fn environment_variables_are_case_insensitive() {
    let cases: &[(&str, bool)] = &[
        ("FELIX_LOGSEVERITYSCREEN", true),
        ("felix_logseverityscreen", true),
        ("FeLIX_LoGSEVERITYSCREEN", true),
        ("FELIX_LogSeverityScreen", true),
        ("FELIXLOGSEVERITYSCREEN", false),
        ("XFELIX_LOGSEVERITYSCREEN", false),
        ("CALICO_LOGSEVERITYSCREEN", false),
        ("LOGSEVERITYSCREEN", false),
    ];
    for (key, applies) in cases {
        let l = load(&with_env(&[(key, "debug")])).unwrap();
        let want = if *applies { "DEBUG" } else { "INFO" };
        assert_eq!(l.config.log_severity_screen, want, "{key}");
        if *applies {
            assert_eq!(l.source_of(ParamId::LogSeverityScreen).origin, *key);
        }
    }
    // Values keep their case and any '='.
    let l = load(&with_env(&[("FELIX_FOO", "bar=baz"), ("PATH", "/usr/bin")])).unwrap();
    assert_eq!(l.unknown.len(), 1);
    assert_eq!(l.unknown[0].name, "foo");
    assert_eq!(l.unknown[0].value, "bar=baz");
}

#[test]
fn hostname_defaults_to_kernel_then_hostname_variable() {
    let inputs = ConfigInputs {
        hostname: Some("  Node-A.Example \n".into()),
        ..ConfigInputs::default()
    };
    let l = load(&inputs).unwrap();
    assert_eq!(l.config.felix_hostname, "node-a.example");
    assert_eq!(
        l.source_of(ParamId::FelixHostname).origin,
        "kernel hostname"
    );

    let mut inputs = ConfigInputs::default();
    inputs.env.insert("HOSTNAME".into(), "Node-B".into());
    assert_eq!(load(&inputs).unwrap().config.felix_hostname, "node-b");

    let e = load(&ConfigInputs::default()).unwrap_err();
    assert!(
        matches!(e, FatalConfigError::Invalid(ref m) if m.contains("hostname")),
        "{e}"
    );

    let mut inputs = with_env(&[("FELIX_FELIXHOSTNAME", "explicit")]);
    inputs.hostname = Some("kernel".into());
    assert_eq!(load(&inputs).unwrap().config.felix_hostname, "explicit");
}

#[test]
fn empty_values_are_ignored_with_a_warning() {
    let mut inputs = with_env(&[("FELIX_LOGSEVERITYSCREEN", "")]);
    inputs.global = Some(felix_config("default", spec_log_severity("Debug")));
    let l = load(&inputs).unwrap();
    assert_eq!(l.config.log_severity_screen, "DEBUG");
    assert!(l.warnings.iter().any(|w| matches!(
        w,
        ConfigWarning::EmptyValue {
            source: Source::EnvironmentVariable,
            ..
        }
    )));
    assert!(!l.set_by(ParamId::LogSeverityScreen, Source::EnvironmentVariable));
}

#[test]
fn unknown_names_warn_once_across_sources_and_spellings() {
    let mut inputs = with_env(&[("FELIX_NOSUCHTHING", "1"), ("FELIX_OTHERTHING", "x")]);
    inputs.config_file = Some("NoSuchThing = 2\nnosuchthing = 3\n".into());
    inputs.global = Some(annotated("default", &[("NoSuchThing", "4")]));
    let l = load(&inputs).unwrap();
    let unknown: Vec<&ConfigWarning> = l
        .warnings
        .iter()
        .filter(|w| matches!(w, ConfigWarning::UnknownParameter { .. }))
        .collect();
    assert_eq!(unknown.len(), 2, "{unknown:?}");
    assert!(unknown.iter().any(|w| matches!(
        w,
        ConfigWarning::UnknownParameter { name, sources }
            if name == "nosuchthing"
                && *sources == [Source::EnvironmentVariable, Source::ConfigFile, Source::DatastoreGlobal]
    )));
    // The highest-priority raw value is kept.
    let kept = l.unknown.iter().find(|u| u.name == "nosuchthing").unwrap();
    assert_eq!(
        (kept.value.as_str(), kept.source),
        ("1", Source::EnvironmentVariable)
    );

    // Reloading reports nothing new through WarnOnce.
    let mut once = WarnOnce::new();
    assert_eq!(once.fresh(&l.warnings).len(), l.warnings.len());
    let again = load(&inputs).unwrap();
    assert!(once.fresh(&again.warnings).is_empty());
}

#[test]
fn unsupported_parameters_warn_only_when_not_at_their_default() {
    let cases: &[(&str, &str, bool)] = &[
        // The eBPF dataplane is margay's too: BPFEnabled is acted on.
        ("BPFEnabled", "true", false),
        ("WireguardEnabled", "false", false),
        ("WireguardEnabled", "true", true),
        ("XDPEnabled", "false", true),
        ("IptablesBackend", "AUTO", false),
        ("LogSeverityScreen", "debug", false),
        ("VXLANEnabled", "true", false),
    ];
    for (name, value, warns) in cases {
        let l = common::load_one(name, value).unwrap();
        let got = l
            .warnings
            .iter()
            .any(|w| matches!(w, ConfigWarning::Unsupported { param, .. } if param == name));
        assert_eq!(got, *warns, "{name}={value}");
    }
    let l = common::load_one("WireguardEnabled", "true").unwrap();
    let w = l
        .warnings
        .iter()
        .find(|w| matches!(w, ConfigWarning::Unsupported { .. }))
        .unwrap();
    assert_eq!(
        w.to_string(),
        "WireguardEnabled=\"true\" (from environment variable) is not supported by margay; it \
         behaves as if WireguardEnabled were \"false\""
    );
}

#[test]
fn parameters_of_the_other_rule_mode_warn_when_set_and_the_report_marks_them() {
    // NFTablesMode Auto: the nftables verdict is not used (Calico would use the iptables one).
    let l = common::load_one("NftablesFilterDenyAction", "REJECT").unwrap();
    let w = l
        .warnings
        .iter()
        .find(|w| matches!(w, ConfigWarning::NotUsed { .. }))
        .unwrap();
    assert_eq!(
        w.to_string(),
        "NftablesFilterDenyAction=\"REJECT\" (from environment variable) has no effect: \
         NFTablesMode is Auto, so (as in Calico) IptablesFilterDenyAction is used instead"
    );
    let table = l.render_table(false);
    assert!(table.contains("*NftablesFilterDenyAction"), "{table}");
    assert!(table.contains(" IptablesFilterDenyAction"), "{table}");
    // In nftables mode the roles swap.
    let l = load(&with_env(&[
        ("FELIX_NFTABLESMODE", "Enabled"),
        ("FELIX_IPTABLESFILTERDENYACTION", "REJECT"),
    ]))
    .unwrap();
    assert!(l.warnings.iter().any(
        |w| matches!(w, ConfigWarning::NotUsed { param, .. } if *param == "IptablesFilterDenyAction")
    ));
    let table = l.render_table(false);
    assert!(table.contains("*IptablesFilterDenyAction"), "{table}");
    // What margay acts on now is not marked, and does not warn.
    let l = common::load_one("IPForwarding", "Disabled").unwrap();
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    assert!(l.render_table(false).contains(" IPForwarding "));
    // Reporting is off in margay: 0 (what node start-up writes) is no news, 30 s is.
    assert!(
        common::load_one("ReportingIntervalSecs", "0")
            .unwrap()
            .warnings
            .is_empty()
    );
    assert!(
        common::load_one("ReportingIntervalSecs", "30")
            .unwrap()
            .warnings
            .iter()
            .any(|w| matches!(w, ConfigWarning::Unsupported { .. }))
    );
}

#[test]
fn internal_overrides_beat_everything() {
    let mut inputs = with_env(&[("FELIX_BPFENABLED", "true")]);
    inputs.overrides = BTreeMap::from([("BPFEnabled".to_string(), "false".to_string())]);
    let l = load(&inputs).unwrap();
    assert!(!l.config.bpf_enabled);
    assert_eq!(
        l.source_of(ParamId::BPFEnabled).source,
        Source::InternalOverride
    );
    assert_eq!(l.source_of(ParamId::BPFEnabled).origin, "internal override");
}

#[test]
fn cross_field_validation() {
    let cases: &[(&[(&str, &str)], bool)] = &[
        (&[], true),
        (&[("TyphaKeyFile", "/usr")], false),
        (
            &[
                ("TyphaKeyFile", "/usr"),
                ("TyphaCertFile", "/usr"),
                ("TyphaCAFile", "/usr"),
            ],
            false,
        ),
        (
            &[
                ("TyphaKeyFile", "/usr"),
                ("TyphaCertFile", "/usr"),
                ("TyphaCAFile", "/usr"),
                ("TyphaCN", "typha-peer"),
            ],
            true,
        ),
        (
            &[
                ("TyphaKeyFile", "/usr"),
                ("TyphaCertFile", "/usr"),
                ("TyphaCAFile", "/usr"),
                ("TyphaURISAN", "spiffe://k8s.example.com/typha-peer"),
            ],
            true,
        ),
        (
            &[
                ("TyphaKeyFile", "/usr"),
                ("TyphaCertFile", "/usr"),
                ("TyphaCAFile", "/usr"),
                ("TyphaCN", "typha-peer"),
                ("TyphaURISAN", "spiffe://x"),
            ],
            true,
        ),
        (&[("TyphaCN", "typha-peer")], false),
        (&[("EtcdAddr", "none")], false),
        (
            &[("EtcdAddr", "none"), ("EtcdEndpoints", "http://etcd:2379")],
            true,
        ),
        (
            &[("EtcdAddr", "none"), ("DatastoreType", "kubernetes")],
            true,
        ),
    ];
    for (settings, ok) in cases {
        let vars: Vec<(String, &str)> = settings
            .iter()
            .map(|(k, v)| (format!("FELIX_{k}"), *v))
            .collect();
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let r = load(&with_env(&vars));
        assert_eq!(r.is_ok(), *ok, "{settings:?}: {r:?}");
        if !ok {
            assert!(matches!(r, Err(FatalConfigError::Invalid(_))));
        }
    }
}

// ---- felix.cfg ----

type Pairs = &'static [(&'static str, &'static str)];

#[rustfmt::skip]
const INI_CASES: &[(&str, &str, Pairs)] = &[
    ("empty", "", &[]),
    ("single param, no newline", "[ignored]\nFelixHostname=hostname", &[("FelixHostname", "hostname")]),
    ("default block", "[default]\nFelixHostname=hostname", &[("FelixHostname", "hostname")]),
    ("multi block", "[ignored]\nFelixHostname=hostname\n[logging]\nLogSeverityScreen=INFO\nLogSeveritySys=DEBUG",
        &[("FelixHostname", "hostname"), ("LogSeverityScreen", "INFO"), ("LogSeveritySys", "DEBUG")]),
    ("none value", "[default]\nEndpointStatusPathPrefix=none\n", &[("EndpointStatusPathPrefix", "none")]),
    ("no section", "a = 1\nb=2", &[("a", "1"), ("b", "2")]),
    ("spaces and tabs", "  \t key \t =  value with spaces  \n", &[("key", "value with spaces")]),
    ("colon delimiter", "LogFilePath: /tmp/x.log", &[("LogFilePath", "/tmp/x.log")]),
    ("first delimiter wins", "EtcdEndpoints = http://a:2379", &[("EtcdEndpoints", "http://a:2379")]),
    ("comments", "# comment\n; other\n  # indented\nk=v", &[("k", "v")]),
    ("inline comment", "k = v # trailing\nj = w;x", &[("k", "v"), ("j", "w")]),
    ("double quotes", "k = \"quoted value\"", &[("k", "quoted value")]),
    ("single quotes", "k = 'quoted'", &[("k", "quoted")]),
    ("inner quote kept", "k = \"a\"b\"", &[("k", "\"a\"b\"")]),
    ("backtick value", "k = `a # not a comment`", &[("k", "a # not a comment")]),
    ("triple quotes multi-line", "k = \"\"\"line1\nline2\"\"\"\nj=1", &[("k", "line1\nline2"), ("j", "1")]),
    ("continuation", "k = a,\\\n    b,\\\n    c\nj=1", &[("k", "a,b,c"), ("j", "1")]),
    ("empty value", "k =", &[("k", "")]),
    ("crlf", "[s]\r\nk = v\r\nj=w\r\n", &[("k", "v"), ("j", "w")]),
    ("bom", "\u{feff}k=v", &[("k", "v")]),
    ("later section wins", "[a]\nk=1\n[b]\nk=2", &[("k", "2")]),
    ("same section twice", "[a]\nk=1\n[b]\nk=2\n[a]\nk=3", &[("k", "2")]),
    ("key overwritten in section", "k=1\nk=2", &[("k", "2")]),
    ("quoted key", "\"my key\" = v", &[("my key", "v")]),
    ("section comment", "[s] ; comment\nk=v", &[("k", "v")]),
];

#[test]
fn ini_files_parse_like_calicos_loader() {
    for (name, text, want) in INI_CASES {
        let file = parse_ini(text).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let got: Vec<(&str, &str)> = file
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        let mut got_sorted = got.clone();
        got_sorted.sort();
        let mut want_sorted = want.to_vec();
        want_sorted.sort();
        assert_eq!(got_sorted, want_sorted, "{name}");
    }
}

#[test]
fn ini_errors_have_line_numbers() {
    let cases: &[(&str, usize, &str)] = &[
        (
            "[global]\nLogSeverityScreen INFO\n",
            2,
            "delimiter not found",
        ),
        ("k=v\n\n[unclosed\n", 3, "unclosed section"),
        ("[]\nk=v", 1, "empty section name"),
        ("= value", 1, "key name cannot be empty"),
        ("k = \"\"\"never closed\nmore", 1, "missing closing quote"),
        ("\"key = v", 1, "missing closing key quote"),
    ];
    for (text, line, msg) in cases {
        let e = parse_ini(text).unwrap_err();
        assert_eq!(e.line, *line, "{text:?}");
        assert!(e.message.contains(msg), "{text:?}: {}", e.message);
        let fatal = load(&ConfigInputs {
            config_file: Some(text.to_string()),
            ..base()
        })
        .unwrap_err();
        assert!(
            matches!(&fatal, FatalConfigError::ConfigFile { line: l, .. } if l == line),
            "{fatal:?}"
        );
        assert!(
            fatal
                .to_string()
                .starts_with(&format!("config file line {line}:"))
        );
    }
}

#[test]
fn config_file_values_feed_the_configuration() {
    let text = "\
# felix.cfg
[global]
MetadataAddr = None
LogFilePath = none
LogSeverityScreen = debug
[logging]
logseverityscreen = error
FailsafeInboundHostPorts = tcp:22, udp:68
";
    let inputs = ConfigInputs {
        config_file: Some(text.into()),
        ..base()
    };
    let l = load(&inputs).unwrap();
    assert_eq!(l.config.metadata_addr, "");
    assert_eq!(l.config.log_file_path, "");
    // Two spellings of one parameter in one source: the later one is used, with a warning.
    assert_eq!(l.config.log_severity_screen, "ERROR");
    assert!(l.warnings.iter().any(|w| matches!(
        w,
        ConfigWarning::DuplicateSetting { source: Source::ConfigFile, origins, .. }
            if origins.len() == 2
    )));
    assert_eq!(
        l.source_of(ParamId::LogSeverityScreen).origin,
        "line 7 [logging]"
    );

    assert_eq!(
        l.config.get(ParamId::FailsafeInboundHostPorts).to_string(),
        "tcp:22,udp:68"
    );
    // A file value loses to the environment.
    let mut inputs = inputs;
    inputs
        .env
        .insert("FELIX_LOGFILEPATH".into(), "/tmp/f.log".into());
    assert_eq!(load(&inputs).unwrap().config.log_file_path, "/tmp/f.log");
    // The same key in two sections is reported with both lines.
    let l2 = load(&ConfigInputs {
        config_file: Some("[a]\nVXLANVNI=1\n[b]\nVXLANVNI=2\n".into()),
        ..base()
    })
    .unwrap();
    assert_eq!(l2.config.vxlan_vni, 2);
    assert!(l2.warnings.contains(&ConfigWarning::DuplicateSetting {
        name: "VXLANVNI".into(),
        source: Source::ConfigFile,
        origins: vec!["line 2".into(), "line 4".into()],
    }));
}
