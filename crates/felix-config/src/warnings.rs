//! What loading reports: warnings (data for the caller to log) and fatal errors.

use std::collections::BTreeSet;
use std::fmt;

use serde::Serialize;

use crate::sources::Source;

/// A problem that does not stop Felix; the caller logs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ConfigWarning {
    /// A name that is not a Felix parameter (reported once, with every source that set it).
    /// The raw value is kept for external dataplane drivers, as Calico does.
    #[serde(rename_all = "camelCase")]
    UnknownParameter { name: String, sources: Vec<Source> },
    /// A value that does not parse. `fallback` is the value used instead (the default), or
    /// `None` when a higher-priority source sets the parameter anyway.
    #[serde(rename_all = "camelCase")]
    InvalidValue {
        param: &'static str,
        raw: String,
        source: Source,
        origin: String,
        reason: String,
        fallback: Option<String>,
    },
    /// A `local` parameter found in the datastore, where it is not accepted.
    #[serde(rename_all = "camelCase")]
    LocalOnly {
        param: &'static str,
        raw: String,
        source: Source,
        origin: String,
    },
    /// An empty value, which is ignored (`none` is how to clear a parameter).
    #[serde(rename_all = "camelCase")]
    EmptyValue {
        name: String,
        source: Source,
        origin: String,
    },
    /// The same parameter given more than once by one source; the last one is used.
    #[serde(rename_all = "camelCase")]
    DuplicateSetting {
        name: String,
        source: Source,
        origins: Vec<String>,
    },
    /// A parameter margay accepts but does not act on, set to something other than its
    /// default. margay behaves as if it had its default.
    #[serde(rename_all = "camelCase")]
    Unsupported {
        param: &'static str,
        value: String,
        default: String,
        source: Source,
    },
    /// A parameter margay acts on, but not with this configuration (another parameter takes
    /// its role), set to something other than its default.
    #[serde(rename_all = "camelCase")]
    NotUsed {
        param: &'static str,
        value: String,
        source: Source,
        reason: String,
    },
    /// A value that was used with an adjustment or caveat.
    #[serde(rename_all = "camelCase")]
    Adjusted {
        param: &'static str,
        raw: String,
        source: Source,
        note: String,
    },
    /// A field of a datastore resource that could not be turned into a setting.
    #[serde(rename_all = "camelCase")]
    InvalidResourceValue {
        resource: String,
        field: String,
        reason: String,
    },
    /// A datastore resource that was passed in but does not apply to this node.
    #[serde(rename_all = "camelCase")]
    IgnoredResource { resource: String, reason: String },
    /// Several selector-scoped FelixConfigurations match this node; only the oldest is used.
    #[serde(rename_all = "camelCase")]
    MultipleSelectorMatches {
        matching: Vec<String>,
        winner: String,
    },
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigWarning::UnknownParameter { name, sources } => {
                let s: Vec<String> = sources.iter().map(ToString::to_string).collect();
                write!(
                    f,
                    "unknown configuration parameter {name:?} (set by {}), ignored",
                    s.join(", ")
                )
            }
            ConfigWarning::InvalidValue {
                param,
                raw,
                source,
                origin,
                reason,
                fallback,
            } => {
                write!(
                    f,
                    "invalid value {raw:?} for {param} from {source} ({origin}): {reason}; "
                )?;
                match fallback {
                    Some(v) => write!(f, "using the default {v:?}"),
                    None => f.write_str("ignored (a higher-priority source sets it)"),
                }
            }
            ConfigWarning::LocalOnly {
                param,
                raw,
                source,
                origin,
            } => write!(
                f,
                "{param}={raw:?} from {source} ({origin}) ignored: {param} can only be set in \
                 the config file or the environment"
            ),
            ConfigWarning::EmptyValue {
                name,
                source,
                origin,
            } => write!(
                f,
                "empty value for {name} from {source} ({origin}) ignored; use \"none\" to clear \
                 a parameter"
            ),
            ConfigWarning::DuplicateSetting {
                name,
                source,
                origins,
            } => write!(
                f,
                "{name} is set more than once by {source} ({}); the last one is used",
                origins.join(", ")
            ),
            ConfigWarning::Unsupported {
                param,
                value,
                default,
                source,
            } => write!(
                f,
                "{param}={value:?} (from {source}) is not supported by margay; it behaves as if \
                 {param} were {default:?}"
            ),
            ConfigWarning::NotUsed {
                param,
                value,
                source,
                reason,
            } => write!(
                f,
                "{param}={value:?} (from {source}) has no effect: {reason}"
            ),
            ConfigWarning::Adjusted {
                param,
                raw,
                source,
                note,
            } => write!(f, "{param}={raw:?} from {source}: {note}"),
            ConfigWarning::InvalidResourceValue {
                resource,
                field,
                reason,
            } => write!(f, "{resource} {field}: {reason}; ignored"),
            ConfigWarning::IgnoredResource { resource, reason } => {
                write!(f, "{resource} ignored: {reason}")
            }
            ConfigWarning::MultipleSelectorMatches { matching, winner } => write!(
                f,
                "several selector-scoped FelixConfigurations match this node ({}); using the \
                 oldest, {winner:?}",
                matching.join(", ")
            ),
        }
    }
}

/// Remembers which warnings were already reported, so that a caller reloading configuration
/// (on every datastore update) logs each problem once.
#[derive(Debug, Clone, Default)]
pub struct WarnOnce {
    seen: BTreeSet<String>,
}

impl WarnOnce {
    pub fn new() -> Self {
        WarnOnce::default()
    }

    /// The warnings not reported before; marks them reported.
    pub fn fresh<'a>(&mut self, warnings: &'a [ConfigWarning]) -> Vec<&'a ConfigWarning> {
        warnings
            .iter()
            .filter(|w| self.seen.insert(w.to_string()))
            .collect()
    }
}

/// A configuration Felix cannot run with. Calico retries loading at start-up and exits at
/// run time on these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FatalConfigError {
    /// A `die-on-fail` parameter whose value does not parse (even if a higher-priority source
    /// overrides it: Calico parses every source).
    #[error("invalid value {raw:?} for {param} from {from} ({origin}): {reason}")]
    InvalidValue {
        param: &'static str,
        raw: String,
        from: Source,
        origin: String,
        reason: String,
    },
    /// `none` given for a `non-zero` parameter.
    #[error("{param} cannot be \"none\" (from {from}, {origin}): it requires a value")]
    NoneNotAllowed {
        param: &'static str,
        raw: String,
        from: Source,
        origin: String,
    },
    /// felix.cfg does not parse.
    #[error("config file line {line}: {message}")]
    ConfigFile { line: usize, message: String },
    /// Parameters that are valid one by one but not together.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl FatalConfigError {
    /// The parameter the error is about, if any.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            FatalConfigError::InvalidValue { param, .. }
            | FatalConfigError::NoneNotAllowed { param, .. } => Some(param),
            _ => None,
        }
    }
}
