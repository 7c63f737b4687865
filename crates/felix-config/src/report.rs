//! What `margay felix config` prints, and the same as JSON for the status API.

use std::fmt::Write as _;

use serde::Serialize;

use crate::load::{Loaded, UnknownSetting};
use crate::sources::Source;
use crate::table::{Group, PARAMS};
use crate::warnings::ConfigWarning;

/// One parameter in the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ParamReport {
    pub name: &'static str,
    pub group: &'static str,
    /// The effective value, as `margay felix config` prints it.
    pub value: String,
    /// The raw value it came from.
    pub raw: String,
    pub source: Source,
    pub origin: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The default, as Calico writes it.
    pub default: &'static str,
    pub kind: &'static str,
    /// margay acts on the parameter with this configuration.
    pub supported: bool,
    pub local: bool,
    pub live: bool,
    pub description: &'static str,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigReport {
    pub params: Vec<ParamReport>,
    pub unknown: Vec<UnknownSetting>,
    pub warnings: Vec<ConfigWarning>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub datastore_ready: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector_config: Option<String>,
}

impl Loaded {
    /// Every parameter with its value and source, in table order.
    pub fn report(&self) -> ConfigReport {
        let params = PARAMS
            .iter()
            .map(|p| {
                let eff = self.source_of(p.id);
                ParamReport {
                    name: p.name,
                    group: p.group.title(),
                    value: self.config.get(p.id).to_string(),
                    raw: eff.raw.clone(),
                    source: eff.source,
                    origin: eff.origin.clone(),
                    note: eff.note.clone(),
                    default: p.default,
                    kind: p.kind,
                    supported: self.config.acted_on(p.id).yes(),
                    local: p.flags.local,
                    live: p.live(),
                    description: p.description,
                }
            })
            .collect();
        ConfigReport {
            params,
            unknown: self.unknown.clone(),
            warnings: self.warnings.clone(),
            datastore_ready: self.datastore_ready,
            selector_config: self.selector_config.clone(),
        }
    }

    /// The report as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self.report()).unwrap_or(serde_json::Value::Null)
    }

    /// The text `margay felix config` prints: the parameters grouped, each with its value and
    /// source; `only_set` leaves out parameters at their defaults. Parameters margay does not
    /// act on are marked `*`.
    pub fn render_table(&self, only_set: bool) -> String {
        let mut out = String::new();
        let rows: Vec<(Group, [String; 3])> = PARAMS
            .iter()
            .filter(|p| !only_set || self.source_of(p.id).source != Source::Default)
            .map(|p| {
                let eff = self.source_of(p.id);
                let mut value = self.config.get(p.id).to_string();
                if value.is_empty() {
                    value = "\"\"".into();
                }
                let mut source = eff.source.to_string();
                if eff.source != Source::Default || eff.origin != "default" {
                    source = format!("{source} ({})", eff.origin);
                }
                if let Some(note) = &eff.note {
                    source = format!("{source}; {note}");
                }
                let mark = if self.config.acted_on(p.id).yes() {
                    " "
                } else {
                    "*"
                };
                (p.group, [format!("{mark}{}", p.name), value, source])
            })
            .collect();
        let name_w = rows.iter().map(|r| r.1[0].len()).max().unwrap_or(0);
        let value_w = rows
            .iter()
            .map(|r| r.1[1].chars().count())
            .max()
            .unwrap_or(0)
            .min(48);
        let _ = writeln!(
            out,
            "# Felix configuration: value and source of every parameter{}.",
            if only_set {
                " set by a source other than the defaults"
            } else {
                ""
            }
        );
        let _ = writeln!(
            out,
            "# * = accepted but not acted on by margay (with this configuration)."
        );
        for group in Group::ALL {
            let in_group: Vec<&[String; 3]> =
                rows.iter().filter(|r| r.0 == group).map(|r| &r.1).collect();
            if in_group.is_empty() {
                continue;
            }
            let _ = writeln!(out, "\n[{}]", group.title());
            for [name, value, source] in in_group {
                let _ = writeln!(out, "{name:<name_w$}  {value:<value_w$}  {source}");
            }
        }
        if !self.unknown.is_empty() {
            let _ = writeln!(out, "\n[Unknown parameters (ignored)]");
            for u in &self.unknown {
                let _ = writeln!(
                    out,
                    " {}  {:?}  {} ({})",
                    u.name, u.value, u.source, u.origin
                );
            }
        }
        if !self.warnings.is_empty() {
            let _ = writeln!(out, "\n[Warnings]");
            for w in &self.warnings {
                let _ = writeln!(out, " - {w}");
            }
        }
        out
    }
}
