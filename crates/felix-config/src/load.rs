//! Loading: every source's raw settings merged in Calico's priority order into a [`Config`].

use std::collections::{BTreeMap, HashMap};

use margay_api::{ClusterInformation, FelixConfiguration, Node};
use serde::Serialize;

use crate::config::ActedOn;
use crate::datastore::{DatastoreInputs, datastore_settings};
use crate::ini::parse_ini;
use crate::kinds::{AssumeFilesExist, HostProbe};
use crate::sources::{RawSetting, Source, env_settings, file_settings};
use crate::table::{Config, PARAMS, ParamId};
use crate::warnings::{ConfigWarning, FatalConfigError};

/// Where Felix reads its config file unless told otherwise (`-c/--config-file`).
pub const DEFAULT_CONFIG_FILE: &str = "/etc/calico/felix.cfg";

/// Everything configuration is made from. The caller gathers it (reads the file, lists the
/// resources); loading itself does no I/O.
#[derive(Debug, Clone, Default)]
pub struct ConfigInputs {
    /// The process environment, all of it: `FELIX_<Name>` variables (prefix matched
    /// case-insensitively) are read, and `HOSTNAME` if `hostname` is `None`.
    pub env: BTreeMap<String, String>,
    /// The text of the config file, if it exists (a missing file is not an error).
    pub config_file: Option<String>,
    /// The kernel's hostname: FelixHostname's default (lower-cased and trimmed).
    pub hostname: Option<String>,
    /// ClusterInformation `default`.
    pub cluster_info: Option<ClusterInformation>,
    /// FelixConfiguration `default`.
    pub global: Option<FelixConfiguration>,
    /// Every other FelixConfiguration (those named `default` and `node.*` are skipped);
    /// the oldest one whose `nodeSelector` matches the Node's labels applies.
    pub per_selector: Vec<FelixConfiguration>,
    /// FelixConfiguration `node.<hostname>`.
    pub per_host: Option<FelixConfiguration>,
    /// The Node `<hostname>`.
    pub node: Option<Node>,
    /// Felix's own overrides, the highest priority (e.g. `BPFEnabled=false` when the kernel
    /// cannot do it).
    pub overrides: BTreeMap<String, String>,
}

/// Where a parameter's effective value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Effective {
    pub source: Source,
    /// The raw value as the source gave it (the default's raw string for defaults).
    pub raw: String,
    /// Where exactly: `FELIX_LOGSEVERITYSCREEN`, `line 3 [global]`, `default`, ...
    pub origin: String,
    /// Set when the value is not simply the parsed raw value (invalid and replaced by the
    /// default, or adjusted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A setting whose name is not a Felix parameter (the highest-priority one per name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnknownSetting {
    pub name: String,
    pub value: String,
    pub source: Source,
    pub origin: String,
}

/// The result of loading.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The effective configuration.
    pub config: Config,
    effective: Vec<Effective>,
    /// Settings with unknown names (kept, as Calico keeps them for external drivers).
    pub unknown: Vec<UnknownSetting>,
    /// Everything worth telling the operator, in the order found.
    pub warnings: Vec<ConfigWarning>,
    /// Every source's settings as merged (empty values dropped).
    pub raw: BTreeMap<Source, Vec<RawSetting>>,
    /// ClusterInformation's `datastoreReady` (`None` when no ClusterInformation was given).
    /// Calico waits at start-up until it is true, and restarts if it becomes false.
    pub datastore_ready: Option<bool>,
    /// The selector-scoped FelixConfiguration that applies to this node, if any.
    pub selector_config: Option<String>,
}

impl Loaded {
    /// Where the parameter's value came from.
    pub fn source_of(&self, id: ParamId) -> &Effective {
        &self.effective[id as usize]
    }

    /// Every parameter with where its value came from, in table order.
    pub fn sources(&self) -> impl Iterator<Item = (ParamId, &Effective)> {
        ParamId::ALL.iter().copied().zip(self.effective.iter())
    }

    /// Whether `source` gave a (non-empty) value for the parameter, used or not. Names are
    /// compared case-insensitively. (Calico's own check compares exactly, so in Calico a
    /// `FELIX_ETCDENDPOINTS` variable, lower-cased by its loader, never counts as "set in the
    /// environment" when it builds the datastore connection; see DESIGN.md.)
    pub fn set_by(&self, id: ParamId, source: Source) -> bool {
        self.raw.get(&source).is_some_and(|settings| {
            settings
                .iter()
                .any(|s| ParamId::from_name(&s.name) == Some(id))
        })
    }
}

/// Loads configuration without consulting the host: `file(must-exist)` parameters are taken
/// to exist. See [`load_with_probe`].
pub fn load(inputs: &ConfigInputs) -> Result<Loaded, FatalConfigError> {
    load_with_probe(inputs, &AssumeFilesExist)
}

/// Loads configuration: parses every source, merges them in priority order (internal
/// overrides > environment > config file > per-host > per-selector > global > defaults), and
/// checks the result.
///
/// As in Calico, every source's value is parsed even when a higher source overrides it, so a
/// bad `die-on-fail` value anywhere is fatal; a bad value elsewhere is replaced by the
/// parameter's default (not by a lower source's value) with a warning.
pub fn load_with_probe(
    inputs: &ConfigInputs,
    probe: &dyn HostProbe,
) -> Result<Loaded, FatalConfigError> {
    let mut raw: BTreeMap<Source, Vec<RawSetting>> = BTreeMap::new();
    let mut file_warnings = Vec::new();
    raw.insert(Source::EnvironmentVariable, env_settings(&inputs.env));
    if let Some(text) = &inputs.config_file {
        let file = parse_ini(text).map_err(|e| FatalConfigError::ConfigFile {
            line: e.line,
            message: e.message,
        })?;
        for (key, lines) in &file.duplicates {
            file_warnings.push(ConfigWarning::DuplicateSetting {
                name: key.clone(),
                source: Source::ConfigFile,
                origins: lines.iter().map(|l| format!("line {l}")).collect(),
            });
        }
        raw.insert(Source::ConfigFile, file_settings(&file));
    }
    raw.insert(
        Source::InternalOverride,
        inputs
            .overrides
            .iter()
            .map(|(k, v)| RawSetting::new(k.clone(), v.clone(), "internal override"))
            .collect(),
    );
    let default_hostname = default_hostname(inputs);

    // The local sources decide FelixHostname (it is a local-only parameter), which says
    // which datastore resources are this node's.
    let mut ignored = Vec::new();
    let local = clean(&raw, &mut ignored);
    let hostname = resolve(&local, &default_hostname, probe)?
        .config
        .felix_hostname;

    let ds = datastore_settings(
        &DatastoreInputs {
            cluster_info: inputs.cluster_info.as_ref(),
            global: inputs.global.as_ref(),
            per_selector: &inputs.per_selector,
            per_host: inputs.per_host.as_ref(),
            node: inputs.node.as_ref(),
        },
        &hostname,
    );
    raw.insert(Source::DatastoreGlobal, ds.global);
    raw.insert(Source::DatastorePerSelector, ds.per_selector);
    raw.insert(Source::DatastorePerHost, ds.per_host);

    let mut warnings = file_warnings;
    warnings.extend(ds.warnings);
    let raw = clean(&raw, &mut warnings);
    let resolved = resolve(&raw, &default_hostname, probe)?;
    warnings.extend(resolved.warnings);

    for p in PARAMS {
        let eff = &resolved.effective[p.id as usize];
        if eff.source == Source::Default {
            continue;
        }
        let value = resolved.config.get(p.id);
        match resolved.config.acted_on(p.id) {
            ActedOn::Yes => {}
            ActedOn::No { behaves_as } => {
                if value.to_string() != behaves_as {
                    warnings.push(ConfigWarning::Unsupported {
                        param: p.name,
                        value: value.to_string(),
                        default: behaves_as,
                        source: eff.source,
                    });
                }
            }
            ActedOn::NotNow { reason } => {
                if value != Config::defaults().get(p.id) {
                    warnings.push(ConfigWarning::NotUsed {
                        param: p.name,
                        value: value.to_string(),
                        source: eff.source,
                        reason,
                    });
                }
            }
        }
    }

    resolved
        .config
        .validate()
        .map_err(FatalConfigError::Invalid)?;

    Ok(Loaded {
        config: resolved.config,
        effective: resolved.effective,
        unknown: resolved.unknown,
        warnings,
        raw,
        datastore_ready: ds.datastore_ready,
        selector_config: ds.selector_winner,
    })
}

/// FelixHostname's default and where it came from: the kernel hostname, else `$HOSTNAME`.
fn default_hostname(inputs: &ConfigInputs) -> (String, String) {
    match &inputs.hostname {
        Some(h) => (h.trim().to_lowercase(), "kernel hostname".into()),
        None => match inputs.env.get("HOSTNAME") {
            Some(h) => (h.to_lowercase(), "HOSTNAME".into()),
            None => (String::new(), "default".into()),
        },
    }
}

/// Drops empty values and reports names a source gives more than once.
fn clean(
    raw: &BTreeMap<Source, Vec<RawSetting>>,
    warnings: &mut Vec<ConfigWarning>,
) -> BTreeMap<Source, Vec<RawSetting>> {
    let mut out = BTreeMap::new();
    for (source, settings) in raw {
        let mut kept: Vec<RawSetting> = Vec::new();
        for s in settings {
            if s.value.is_empty() {
                warnings.push(ConfigWarning::EmptyValue {
                    name: s.name.clone(),
                    source: *source,
                    origin: s.origin.clone(),
                });
            } else {
                kept.push(s.clone());
            }
        }
        let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for s in &kept {
            by_name
                .entry(s.name.to_lowercase())
                .or_default()
                .push(s.origin.clone());
        }
        for s in &kept {
            if let Some(origins) = by_name.remove(&s.name.to_lowercase())
                && origins.len() > 1
            {
                warnings.push(ConfigWarning::DuplicateSetting {
                    name: s.name.clone(),
                    source: *source,
                    origins,
                });
            }
        }
        out.insert(*source, kept);
    }
    out
}

struct Resolved {
    config: Config,
    effective: Vec<Effective>,
    unknown: Vec<UnknownSetting>,
    warnings: Vec<ConfigWarning>,
}

/// Calico's merge: sources from the highest priority down; a name is taken from the first
/// source that sets it (later settings of the same name in one source win).
fn resolve(
    raw: &BTreeMap<Source, Vec<RawSetting>>,
    default_hostname: &(String, String),
    probe: &dyn HostProbe,
) -> Result<Resolved, FatalConfigError> {
    let mut config = Config::defaults().clone();
    let mut effective: Vec<Effective> = PARAMS
        .iter()
        .map(|p| Effective {
            source: Source::Default,
            raw: p.default.to_string(),
            origin: "default".into(),
            note: None,
        })
        .collect();
    config.felix_hostname = default_hostname.0.clone();
    effective[ParamId::FelixHostname as usize].raw = default_hostname.0.clone();
    effective[ParamId::FelixHostname as usize].origin = default_hostname.1.clone();

    let mut warnings = Vec::new();
    let mut current: HashMap<String, Source> = HashMap::new();
    let mut unknown: BTreeMap<String, UnknownSetting> = BTreeMap::new();
    let mut unknown_seen: Vec<(String, String, Vec<Source>)> = Vec::new();

    for source in Source::DESCENDING {
        let Some(settings) = raw.get(&source) else {
            continue;
        };
        for s in settings {
            let lname = s.name.to_lowercase();
            let cur = current.get(&lname).copied().unwrap_or(Source::Default);
            let Some(id) = ParamId::from_name(&s.name) else {
                match unknown_seen.iter_mut().find(|(l, _, _)| *l == lname) {
                    Some((_, _, sources)) => {
                        if !sources.contains(&source) {
                            sources.push(source);
                        }
                    }
                    None => unknown_seen.push((lname.clone(), s.name.clone(), vec![source])),
                }
                if source >= cur {
                    unknown.insert(
                        lname.clone(),
                        UnknownSetting {
                            name: s.name.clone(),
                            value: s.value.clone(),
                            source,
                            origin: s.origin.clone(),
                        },
                    );
                    current.insert(lname, source);
                }
                continue;
            };
            let meta = id.meta();
            if meta.flags.local && !source.is_local() {
                warnings.push(ConfigWarning::LocalOnly {
                    param: meta.name,
                    raw: s.value.clone(),
                    source,
                    origin: s.origin.clone(),
                });
                continue;
            }
            let used = source >= cur;
            let kind = meta.kind();
            let mut note = None;
            let value = if s.value.to_lowercase() == "none" {
                if meta.flags.non_zero {
                    return Err(FatalConfigError::NoneNotAllowed {
                        param: meta.name,
                        raw: s.value.clone(),
                        from: source,
                        origin: s.origin.clone(),
                    });
                }
                kind.zero()
            } else {
                match kind.parse(&s.value, probe) {
                    Ok(parsed) => {
                        if let Some(n) = parsed.note
                            && used
                        {
                            warnings.push(ConfigWarning::Adjusted {
                                param: meta.name,
                                raw: s.value.clone(),
                                source,
                                note: n.clone(),
                            });
                            note = Some(n);
                        }
                        parsed.value
                    }
                    Err(reason) => {
                        if meta.flags.die_on_fail {
                            return Err(FatalConfigError::InvalidValue {
                                param: meta.name,
                                raw: s.value.clone(),
                                from: source,
                                origin: s.origin.clone(),
                                reason,
                            });
                        }
                        let fallback = Config::defaults().get(id);
                        warnings.push(ConfigWarning::InvalidValue {
                            param: meta.name,
                            raw: s.value.clone(),
                            source,
                            origin: s.origin.clone(),
                            reason: reason.clone(),
                            fallback: used.then(|| fallback.to_string()),
                        });
                        note = Some(format!("invalid ({reason}); default used"));
                        fallback
                    }
                }
            };
            if !used {
                continue;
            }
            let ok = config.set(id, value);
            debug_assert!(ok, "value of the wrong shape for {}", meta.name);
            effective[id as usize] = Effective {
                source,
                raw: s.value.clone(),
                origin: s.origin.clone(),
                note,
            };
            current.insert(lname, source);
        }
    }

    for (_, name, sources) in unknown_seen {
        warnings.push(ConfigWarning::UnknownParameter { name, sources });
    }
    Ok(Resolved {
        config,
        effective,
        unknown: unknown.into_values().collect(),
        warnings,
    })
}
