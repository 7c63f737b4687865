//! Configuration sources and the raw settings they provide.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::ini::IniFile;

/// Where a value came from. Later variants have higher priority: a value from a higher
/// source overrides one from a lower source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    /// The table default.
    Default,
    /// FelixConfiguration `default` (and ClusterInformation `default`).
    DatastoreGlobal,
    /// The oldest FelixConfiguration whose `nodeSelector` matches this node's labels.
    DatastorePerSelector,
    /// FelixConfiguration `node.<hostname>` and the Node resource.
    DatastorePerHost,
    /// felix.cfg.
    ConfigFile,
    /// `FELIX_<Name>` environment variables.
    EnvironmentVariable,
    /// Overrides Felix applies itself (e.g. turning off a feature the kernel lacks).
    InternalOverride,
}

impl Source {
    /// Every source that provides settings, highest priority first.
    pub const DESCENDING: [Source; 6] = [
        Source::InternalOverride,
        Source::EnvironmentVariable,
        Source::ConfigFile,
        Source::DatastorePerHost,
        Source::DatastorePerSelector,
        Source::DatastoreGlobal,
    ];

    /// Whether `local` parameters are accepted from this source.
    pub fn is_local(self) -> bool {
        matches!(
            self,
            Source::Default
                | Source::ConfigFile
                | Source::EnvironmentVariable
                | Source::InternalOverride
        )
    }
}

impl fmt::Display for Source {
    /// Calico's names for the sources, as its logs print them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Default => "<default>",
            Source::DatastoreGlobal => "datastore (global)",
            Source::DatastorePerSelector => "datastore (per-node-selector)",
            Source::DatastorePerHost => "datastore (per-host)",
            Source::ConfigFile => "config file",
            Source::EnvironmentVariable => "environment variable",
            Source::InternalOverride => "internal override",
        })
    }
}

/// One setting as a source provided it: the name as written, the raw value, and where
/// exactly it was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RawSetting {
    pub name: String,
    pub value: String,
    /// E.g. `FELIX_LOGSEVERITYSCREEN`, `line 12 [global]`,
    /// `FelixConfiguration "default" spec.logSeverityScreen`.
    pub origin: String,
}

impl RawSetting {
    pub fn new(
        name: impl Into<String>,
        value: impl Into<String>,
        origin: impl Into<String>,
    ) -> Self {
        RawSetting {
            name: name.into(),
            value: value.into(),
            origin: origin.into(),
        }
    }
}

/// The `FELIX_*` variables of an environment: the prefix is matched case-insensitively and
/// the rest of the variable name, lower-cased, is the parameter name.
pub fn env_settings(env: &BTreeMap<String, String>) -> Vec<RawSetting> {
    env.iter()
        .filter_map(|(key, value)| {
            let lower = key.to_lowercase();
            let name = lower.strip_prefix("felix_")?;
            Some(RawSetting::new(name, value.clone(), key.clone()))
        })
        .collect()
}

/// The settings of a parsed felix.cfg, in Felix's flattening order.
pub fn file_settings(file: &IniFile) -> Vec<RawSetting> {
    file.entries
        .iter()
        .map(|e| {
            RawSetting::new(
                e.key.clone(),
                e.value.clone(),
                format!("line {} [{}]", e.line, e.section),
            )
        })
        .collect()
}
