//! Loading never panics, whatever the environment or the config file holds.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

mod common;

use std::collections::BTreeMap;

use margay_felix_config::ini::parse_ini;
use margay_felix_config::{PARAMS, ParamId, Source, load};
use proptest::prelude::*;

/// A FELIX_ variable for a real parameter in random case, or any name at all.
fn env_key() -> impl Strategy<Value = String> {
    prop_oneof![
        (0..PARAMS.len(), any::<bool>()).prop_map(|(i, upper)| {
            let name = PARAMS[i].name;
            if upper {
                format!("FELIX_{}", name.to_uppercase())
            } else {
                format!("felix_{name}")
            }
        }),
        "[A-Za-z_]{0,12}".prop_map(|s| format!("FELIX_{s}")),
        any::<String>(),
    ]
}

/// Values that hit the interesting paths: none, empty, numbers, lists, junk.
fn env_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("none".to_string()),
        Just(String::new()),
        Just("true".to_string()),
        "-?[0-9]{1,25}(\\.[0-9]{0,3})?(e[+-]?[0-9]{1,3})?",
        "(tcp|udp|foo)?:?(\\[[0-9a-f:/]{0,10}\\]|[0-9./]{0,12})?:?[0-9]{0,6}(,[a-z0-9:]{0,8}){0,3}",
        "[0-9]{1,12}-[0-9]{1,12}( ?,[0-9]{1,6}-[0-9]{1,12}){0,3}",
        "([a-zA-Z_ ]{0,6}=[a-z0-9 ]{0,6},?){0,4}",
        "/[^/]{0,8}/(,[a-z0-9-]{0,16}){0,2}",
        "(https?|ftp)://[a-z0-9.:\\[\\]@]{0,20}(/[a-z?#]{0,5})?",
        any::<String>(),
    ]
}

fn ini_text() -> impl Strategy<Value = String> {
    let line = prop_oneof![
        "\\[[a-z ]{0,8}\\]?",
        "[#;][^\n]{0,20}",
        "[A-Za-z\"`-]{0,12}[ ]?[=:]?[ ]?[^\n]{0,20}",
        "[^\n]{0,30}\\\\",
        "\"\"\"[^\n]{0,10}",
        Just(String::new()),
    ];
    prop::collection::vec(line, 0..12).prop_map(|lines| lines.join("\n"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn load_never_panics_on_any_environment(
        env in prop::collection::btree_map(env_key(), env_value(), 0..8),
        hostname in prop::option::of("[a-zA-Z0-9.-]{0,10}"),
    ) {
        let inputs = margay_felix_config::ConfigInputs {
            env: env.clone(),
            hostname,
            ..Default::default()
        };
        if let Ok(l) = load(&inputs) {
            // Every FELIX_ variable that names a parameter and was used is attributed
            // to the environment.
            for (k, v) in &env {
                let Some(name) = k.to_lowercase().strip_prefix("felix_").map(str::to_string) else {
                    continue;
                };
                if let Some(id) = ParamId::from_name(&name)
                    && !v.is_empty()
                    && !id.meta().flags.local
                    && env.keys().filter(|k2| k2.to_lowercase() == k.to_lowercase()).count() == 1
                {
                    prop_assert_eq!(l.source_of(id).source, Source::EnvironmentVariable);
                }
            }
            let _ = l.render_table(false);
            let _ = l.to_json();
        }
    }

    #[test]
    fn load_never_panics_on_any_config_file(text in prop_oneof![ini_text(), any::<String>()]) {
        let _ = parse_ini(&text);
        let inputs = margay_felix_config::ConfigInputs {
            config_file: Some(text),
            ..common::base()
        };
        let _ = load(&inputs);
    }

    #[test]
    fn any_value_for_any_parameter_is_handled(
        i in 0..PARAMS.len(),
        value in env_value(),
        via_file in any::<bool>(),
    ) {
        let p = &PARAMS[i];
        let mut inputs = common::base();
        if via_file {
            // Values with newlines or comment characters are not representable in INI.
            let v: String = value.chars().filter(|c| !"\n\r#;\\\"'`".contains(*c)).collect();
            inputs.config_file = Some(format!("{} = {v}\n", p.name));
        } else {
            inputs.env = BTreeMap::from([(format!("FELIX_{}", p.name), value)]);
        }
        if let Ok(l) = load(&inputs) {
            // The value always has the field's shape.
            prop_assert_eq!(
                std::mem::discriminant(&l.config.get(p.id)),
                std::mem::discriminant(&p.kind().zero())
            );
        }
    }
}
