//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;

use margay_api::felix::FelixConfigurationSpec;
use margay_api::{FelixConfiguration, Node, ObjectMeta};
use margay_felix_config::{ConfigInputs, FatalConfigError, Loaded, load};

/// Inputs with a hostname (so validation passes) and nothing else.
pub fn base() -> ConfigInputs {
    ConfigInputs {
        hostname: Some("node-1".into()),
        ..ConfigInputs::default()
    }
}

/// Inputs with the given environment variables.
pub fn with_env(vars: &[(&str, &str)]) -> ConfigInputs {
    let mut inputs = base();
    inputs.env = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<BTreeMap<_, _>>();
    inputs
}

/// Loads with one parameter set through the environment.
pub fn load_one(name: &str, value: &str) -> Result<Loaded, FatalConfigError> {
    load(&with_env(&[(&format!("FELIX_{name}"), value)]))
}

pub fn felix_config(name: &str, spec: FelixConfigurationSpec) -> FelixConfiguration {
    FelixConfiguration::new(ObjectMeta::named(name), Box::new(spec))
}

pub fn annotated(name: &str, annotations: &[(&str, &str)]) -> FelixConfiguration {
    let mut fc = felix_config(name, FelixConfigurationSpec::default());
    fc.metadata.annotations = annotations
        .iter()
        .map(|(k, v)| (format!("config.projectcalico.org/{k}"), v.to_string()))
        .collect();
    fc
}

pub fn selector_config(name: &str, selector: &str, created: Option<&str>) -> FelixConfiguration {
    let spec = FelixConfigurationSpec {
        node_selector: Some(selector.into()),
        ..FelixConfigurationSpec::default()
    };
    let mut fc = felix_config(name, spec);
    fc.metadata.creation_timestamp = created.map(str::to_string);
    fc
}

pub fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    let mut meta = ObjectMeta::named(name);
    meta.labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Node::new(meta, Default::default())
}

pub fn spec_log_severity(level: &str) -> FelixConfigurationSpec {
    FelixConfigurationSpec {
        log_severity_screen: Some(level.into()),
        ..FelixConfigurationSpec::default()
    }
}
