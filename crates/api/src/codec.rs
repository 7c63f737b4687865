//! Reading and writing resources as YAML (multi-document) and JSON, including list kinds.

use serde::Serialize;
use serde::de::DeserializeSeed;
use serde_json::Value;

use crate::bounded::{self, BoundedValue, Exceeded};

use crate::k8s;
use crate::resource::{API_GROUP, API_VERSION, Kind, Resource};
use crate::suggest::closest;
use crate::validate::{FieldError, ValidationErrors};

/// Where a document sits in its input: the document number (1-based) and, for an item of a
/// list kind, its index in `items`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DocPosition {
    pub document: usize,
    pub item: Option<usize>,
}

impl std::fmt::Display for DocPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.item {
            Some(i) => write!(f, "document {} item {}", self.document, i),
            None => write!(f, "document {}", self.document),
        }
    }
}

/// One document of an input, decoded or not.
#[derive(Debug, Clone)]
pub struct Decoded {
    pub position: DocPosition,
    /// `kind` as written, when the document has one.
    pub kind: Option<String>,
    /// `metadata.name` as written, when present.
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub result: Result<Resource, DecodeError>,
}

impl Decoded {
    /// `Kind/name` (or `Kind/namespace/name`) for messages, with placeholders for what is missing.
    pub fn label(&self) -> String {
        let kind = self.kind.as_deref().unwrap_or("<no kind>");
        let name = self.name.as_deref().unwrap_or("<no name>");
        match self.namespace.as_deref() {
            Some(ns) if !ns.is_empty() => format!("{kind}/{ns}/{name}"),
            _ => format!("{kind}/{name}"),
        }
    }
}

/// Why a document could not be decoded into a resource.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    #[error("the document is not a mapping (expected apiVersion, kind, metadata, spec)")]
    NotAMapping,
    #[error("kind: missing (expected one of the projectcalico.org/v3 kinds, e.g. kind: IPPool)")]
    MissingKind,
    #[error("kind: unknown kind {kind:?}{}", hint(.suggestion))]
    UnknownKind {
        kind: String,
        suggestion: Option<String>,
    },
    #[error("apiVersion: {found:?} is not supported (use apiVersion: projectcalico.org/v3)")]
    ApiVersion { found: String },
    #[error("{path}: {message}")]
    Field { path: String, message: String },
    /// A Kubernetes document (NetworkPolicy) that cannot be converted: every problem, each
    /// with its field path.
    #[error("{0}")]
    Invalid(ValidationErrors),
}

impl DecodeError {
    /// One line per problem (`path: what is wrong`), for reports that list problems one by
    /// one.
    pub fn messages(&self) -> Vec<String> {
        match self {
            DecodeError::Invalid(errors) => errors.iter().map(ToString::to_string).collect(),
            other => vec![other.to_string()],
        }
    }
}

fn hint(suggestion: &Option<String>) -> String {
    match suggestion {
        Some(s) => format!(" (did you mean {s:?}?)"),
        None => String::new(),
    }
}

/// The input is not well-formed YAML or JSON, so its documents cannot be told apart.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct SyntaxError {
    pub message: String,
}

/// Splits `input` (YAML, possibly several `---`-separated documents, or JSON, possibly several
/// concatenated objects) into documents and decodes each. List kinds (`IPPoolList`, `List`)
/// are expanded into their items. Empty documents are skipped. A Kubernetes
/// `networking.k8s.io/v1` NetworkPolicy (also in a `NetworkPolicyList` or a kubectl `List`)
/// decodes into the v3 NetworkPolicy Calico makes of it ([`crate::k8s`]).
pub fn decode_documents(input: &str) -> Result<Vec<Decoded>, SyntaxError> {
    let values = parse_values(input)?;
    let mut out = Vec::new();
    for (i, value) in values.into_iter().enumerate() {
        let document = i + 1;
        if value.is_null() {
            continue;
        }
        decode_document(value, document, &mut out);
    }
    Ok(out)
}

/// Decodes exactly one resource (the common case for programmatic use).
pub fn decode_one(input: &str) -> Result<Resource, String> {
    let docs = decode_documents(input).map_err(|e| e.to_string())?;
    match docs.len() {
        1 => docs
            .into_iter()
            .next()
            .map(|d| d.result.map_err(|e| e.to_string()))
            .unwrap_or_else(|| Err("no document found".to_string())),
        0 => Err("no document found".to_string()),
        n => Err(format!("expected one document, found {n}")),
    }
}

/// Reads one JSON or YAML document as a plain value (a patch), with the same bounds on size,
/// nesting and aliases as resources.
pub fn parse_patch_document(input: &str) -> Result<Value, SyntaxError> {
    let mut values = parse_values(input)?;
    values.retain(|v| !v.is_null());
    match values.len() {
        1 => Ok(values.remove(0)),
        0 => Err(SyntaxError {
            message: "it is empty".into(),
        }),
        n => Err(SyntaxError {
            message: format!("expected one document, found {n}"),
        }),
    }
}

/// Decodes a resource from a JSON value (as stored in the datastore).
pub fn decode_value(value: Value) -> Result<Resource, DecodeError> {
    let kind_name = match value.get("kind") {
        Some(Value::String(k)) => k.clone(),
        Some(_) | None => return Err(DecodeError::MissingKind),
    };
    decode_with_kind(value, &kind_name, "")
}

fn parse_values(input: &str) -> Result<Vec<Value>, SyntaxError> {
    match parse_stream(input) {
        Ok(v) => Ok(v),
        // Not one YAML stream or one JSON stream: split it where calicoctl does (every line
        // starting with `---`) and read each document on its own, so JSON documents between
        // `---` lines work as they do with calicoctl.
        Err(e) if has_separator(input) => {
            let mut values = Vec::new();
            for (i, doc) in split_documents(input).into_iter().enumerate() {
                if doc.trim().is_empty() {
                    // An empty document still counts, as in a YAML stream.
                    values.push(Value::Null);
                    continue;
                }
                let parsed = parse_stream(doc).map_err(|d| SyntaxError {
                    message: format!("document {}: {}", i + 1, d.message),
                })?;
                values.extend(parsed);
            }
            if values.is_empty() {
                return Err(e);
            }
            Ok(values)
        }
        Err(e) => Err(e),
    }
}

/// A line starting with `---`: calicoctl's (and Kubernetes') document separator.
fn has_separator(input: &str) -> bool {
    input.lines().any(|l| l.starts_with("---"))
}

/// The documents between separator lines (a separator line's rest is dropped, as calicoctl
/// does); a separator on the first line opens the first document.
fn split_documents(input: &str) -> Vec<&str> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut first = true;
    let mut offset = 0;
    for line in input.split_inclusive('\n') {
        if line.starts_with("---") {
            if !(first && input[start..offset].trim().is_empty()) {
                docs.push(&input[start..offset]);
            }
            start = offset + line.len();
        }
        first = false;
        offset += line.len();
    }
    docs.push(&input[start..]);
    docs
}

/// One YAML stream (documents separated by `---`) or one JSON stream (concatenated values; a
/// top-level array is a list of resources).
fn parse_stream(input: &str) -> Result<Vec<Value>, SyntaxError> {
    let trimmed = input.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let mut values = Vec::new();
        for v in serde_json::Deserializer::from_str(input).into_iter::<Value>() {
            let v = v.map_err(|e| SyntaxError {
                message: format!("invalid JSON: {}", clip(&e.to_string())),
            })?;
            // A top-level JSON array is a list of resources.
            match v {
                Value::Array(items) => values.extend(items),
                other => values.push(other),
            }
        }
        return Ok(values);
    }
    let text = match bounded::precheck_yaml(input) {
        Ok(scanned) => return parse_yaml(input, Some(scanned)),
        Err(Exceeded::Syntax { message, at }) => {
            // The scan stopped at a syntax error; libyaml's message for it is the familiar
            // one. Only the checked part (and a little beyond, to reach the offending token)
            // is handed over, so nothing unchecked reaches libyaml.
            let end = syntax_context_end(input, at);
            match parse_yaml(&input[..end], None) {
                Err(e) => return Err(e),
                Ok(_) => clip(&message),
            }
        }
        Err(other) => other.message(),
    };
    Err(SyntaxError {
        message: format!("invalid YAML: {text}"),
    })
}

/// Builds the documents of a YAML stream, each charged to one budget for the input.
fn parse_yaml(input: &str, scanned: Option<bounded::Scanned>) -> Result<Vec<Value>, SyntaxError> {
    let scanned = scanned.unwrap_or(bounded::Scanned { nodes: input.len() });
    let mut budget = bounded::Budget::for_input(input.len(), scanned);
    let mut values = Vec::new();
    for doc in serde_norway::Deserializer::from_str(input) {
        let v = BoundedValue(&mut budget)
            .deserialize(doc)
            .map_err(|e| SyntaxError {
                message: if budget.exceeded {
                    format!("invalid YAML: {}", Exceeded::Aliases.message())
                } else {
                    format!("invalid YAML: {}", clip(&e.to_string()))
                },
            })?;
        values.push(v);
    }
    Ok(values)
}

/// A little past `at` (to the end of the next line, at most 4 KiB), on a char boundary.
fn syntax_context_end(input: &str, at: usize) -> usize {
    let mut end = at.min(input.len());
    let limit = end.saturating_add(4096).min(input.len());
    let mut newlines = 0;
    for (i, c) in input[end..limit].char_indices() {
        if c == '\n' {
            newlines += 1;
            if newlines == 2 {
                return end + i + 1;
            }
        }
    }
    end = limit;
    while !input.is_char_boundary(end) {
        end -= 1;
    }
    end
}

/// At most [`MAX_QUOTED`] bytes of a message that may quote its input, marked where cut.
pub fn clip(message: &str) -> String {
    clip_to(message, MAX_QUOTED)
}

/// At most `max` bytes of `message` (cut on a character boundary), marked where cut.
pub fn clip_to(message: &str, max: usize) -> String {
    if message.len() <= max {
        return message.to_string();
    }
    let mut end = max;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes)", &message[..end], message.len() - end)
}

/// How much of an error message (which may quote the input) is kept.
pub const MAX_QUOTED: usize = 300;

fn decode_document(value: Value, document: usize, out: &mut Vec<Decoded>) {
    let position = DocPosition {
        document,
        item: None,
    };
    let Value::Object(map) = &value else {
        out.push(failed(position, &value, DecodeError::NotAMapping));
        return;
    };
    let kind_name = match map.get("kind") {
        Some(Value::String(k)) => k.clone(),
        _ => {
            out.push(failed(position, &value, DecodeError::MissingKind));
            return;
        }
    };
    let api_version = map.get("apiVersion").and_then(Value::as_str);
    // What the items of a list default to: (kind, apiVersion); None for the generic `List`.
    let item_defaults: Option<Option<(&str, &str)>> = if kind_name == "List" {
        Some(None)
    } else if kind_name == k8s::LIST_KIND && api_version == Some(k8s::API_VERSION) {
        Some(Some((k8s::KIND, k8s::API_VERSION)))
    } else {
        Kind::from_list_name(&kind_name).map(|k| Some((k.name(), API_VERSION)))
    };
    let Some(item_defaults) = item_defaults else {
        let result = decode_item(value.clone(), &kind_name, "");
        out.push(decoded(position, &value, result));
        return;
    };
    // A list: check the list's own apiVersion, then decode every item. kubectl writes the
    // generic list as `apiVersion: v1`.
    let list_version_ok = match item_defaults {
        Some((_, v)) if v == k8s::API_VERSION => Ok(()),
        None if api_version == Some("v1") => Ok(()),
        _ => check_api_version(map.get("apiVersion"), ""),
    };
    if let Err(e) = list_version_ok {
        out.push(failed(position, &value, e));
        return;
    }
    if let Some(unknown) = map
        .keys()
        .find(|k| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "items"))
    {
        out.push(failed(
            position,
            &value,
            DecodeError::Field {
                path: unknown.clone(),
                message: format!("unknown field {unknown:?} in a list (expected apiVersion, kind, metadata, items)"),
            },
        ));
        return;
    }
    let items = match map.get("items") {
        Some(Value::Array(items)) => items.clone(),
        None | Some(Value::Null) => Vec::new(),
        Some(_) => {
            out.push(failed(
                position,
                &value,
                DecodeError::Field {
                    path: "items".into(),
                    message: "must be a list of resources".into(),
                },
            ));
            return;
        }
    };
    for (i, mut item) in items.into_iter().enumerate() {
        let position = DocPosition {
            document,
            item: Some(i),
        };
        let prefix = format!("items[{i}].");
        // Items of a typed list may leave out their kind and apiVersion.
        if let (Some((kind, version)), Value::Object(m)) = (item_defaults, &mut item) {
            m.entry("kind")
                .or_insert_with(|| Value::String(kind.to_string()));
            m.entry("apiVersion")
                .or_insert_with(|| Value::String(version.to_string()));
        }
        let result = match item.get("kind") {
            Some(Value::String(k)) => {
                let k = k.clone();
                decode_item(item.clone(), &k, &prefix)
            }
            _ if item.is_object() => Err(DecodeError::MissingKind),
            _ => Err(DecodeError::NotAMapping),
        };
        out.push(decoded(position, &item, result));
    }
}

/// One document or list item: a Kubernetes NetworkPolicy (converted) or a v3 resource.
fn decode_item(value: Value, kind_name: &str, prefix: &str) -> Result<Resource, DecodeError> {
    if value.get("apiVersion").and_then(Value::as_str) == Some(k8s::API_VERSION) {
        return decode_k8s(value, kind_name, prefix);
    }
    decode_with_kind(value, kind_name, prefix)
}

/// A `networking.k8s.io/v1` document: only NetworkPolicy, converted as Calico converts it.
fn decode_k8s(value: Value, kind_name: &str, prefix: &str) -> Result<Resource, DecodeError> {
    if kind_name != k8s::KIND {
        return Err(DecodeError::Field {
            path: format!("{prefix}kind"),
            message: format!(
                "{kind_name:?} of {} is not supported (margay reads only NetworkPolicy from {}; other documents use apiVersion: {API_VERSION})",
                k8s::API_VERSION,
                k8s::API_VERSION
            ),
        });
    }
    check_sections(&value, prefix)?;
    let policy: k8s::K8sNetworkPolicy =
        serde_path_to_error::deserialize(value).map_err(|e| field_error(&e, prefix))?;
    match k8s::convert(&policy) {
        Ok(p) => Ok(Resource::NetworkPolicy(p)),
        Err(errors) => Err(DecodeError::Invalid(ValidationErrors(
            errors
                .0
                .into_iter()
                .map(|e| FieldError {
                    path: format!("{prefix}{}", e.path),
                    message: e.message,
                })
                .collect(),
        ))),
    }
}

fn decode_with_kind(value: Value, kind_name: &str, prefix: &str) -> Result<Resource, DecodeError> {
    let kind = Kind::from_name(kind_name).ok_or_else(|| DecodeError::UnknownKind {
        kind: kind_name.to_string(),
        suggestion: suggest_kind(kind_name),
    })?;
    check_api_version(value.get("apiVersion"), prefix)?;
    check_sections(&value, prefix)?;
    match Resource::from_value_of_kind(kind, value.clone()) {
        Ok(r) => Ok(r),
        Err(first) => Err(every_field_error(kind, value, &first, prefix)),
    }
}

/// The most type errors reported for one document: enough for any file a person wrote,
/// and a bound on the decode attempts a hostile one costs.
const MAX_FIELD_ERRORS: usize = 20;

/// Every type error of a document that does not decode, not just serde's first: the field
/// at fault is taken out and the document decoded again, until it decodes (then its
/// validation problems outside the removed fields are added) or a problem cannot be taken
/// out (a missing field). Paths name the fields as written, even after list items before them
/// were taken out.
fn every_field_error(
    kind: Kind,
    mut value: Value,
    first: &serde_path_to_error::Error<serde_json::Error>,
    prefix: &str,
) -> DecodeError {
    let mut errors = Vec::new();
    let mut removed = RemovedItems::default();
    let mut removed_paths: Vec<String> = Vec::new();
    let mut current = Some(first_error_parts(first));
    while let Some((segments, error)) = current.take() {
        let original = removed.original(&segments);
        let error = field_error_at(&error, &original, prefix);
        let DecodeError::Field { path, message } = &error else {
            return error;
        };
        let is_missing = message == "required field is missing";
        // A required field taken out for its wrong type: already reported.
        let taken_out = |p: &str| removed_paths.iter().any(|r| format!("{prefix}{r}") == p);
        if is_missing && taken_out(path) {
            break;
        }
        errors.push(FieldError {
            path: path.clone(),
            message: message.clone(),
        });
        if is_missing || errors.len() >= MAX_FIELD_ERRORS || !remove_at(&mut value, &segments) {
            break;
        }
        removed.record(&original);
        removed_paths.push(render_segments(&original));
        match Resource::from_value_of_kind(kind, value.clone()) {
            Err(next) => current = Some(first_error_parts(&next)),
            Ok(resource) => {
                if let Err(invalid) = resource.validate() {
                    let shifted = removed.shifted_lists();
                    errors.extend(invalid.0.into_iter().filter(|e| {
                        let p = e.path.strip_prefix(prefix).unwrap_or(&e.path);
                        !removed_paths.iter().chain(&shifted).any(|r| {
                            p == r
                                || p.strip_prefix(r.as_str())
                                    .is_some_and(|rest| rest.starts_with(['.', '[']))
                        })
                    }));
                }
            }
        }
    }
    if errors.len() == 1 {
        let FieldError { path, message } = errors.remove(0);
        return DecodeError::Field { path, message };
    }
    DecodeError::Invalid(ValidationErrors(errors))
}

/// One step of a path into a document.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

fn first_error_parts(e: &serde_path_to_error::Error<serde_json::Error>) -> (Vec<Seg>, String) {
    use serde_path_to_error::Segment;
    let segments = e
        .path()
        .iter()
        .filter_map(|s| match s {
            Segment::Seq { index } => Some(Seg::Index(*index)),
            Segment::Map { key } => Some(Seg::Key(key.clone())),
            Segment::Enum { variant } => Some(Seg::Key(variant.clone())),
            Segment::Unknown => None,
        })
        .collect();
    (segments, e.inner().to_string())
}

/// Takes the value at `path` out of `value` (a list item, or a mapping's key). False when
/// there is nothing there to take out.
fn remove_at(value: &mut Value, path: &[Seg]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut v = value;
    for seg in parents {
        v = match (seg, v) {
            (Seg::Key(k), Value::Object(m)) => match m.get_mut(k) {
                Some(next) => next,
                None => return false,
            },
            (Seg::Index(i), Value::Array(a)) => match a.get_mut(*i) {
                Some(next) => next,
                None => return false,
            },
            _ => return false,
        };
    }
    match (last, v) {
        (Seg::Key(k), Value::Object(m)) => m.remove(k).is_some(),
        (Seg::Index(i), Value::Array(a)) if *i < a.len() => {
            a.remove(*i);
            true
        }
        _ => false,
    }
}

/// The list items taken out so far, by the list's path as written, so that later paths (which
/// serde reports in the shortened document) can be told as written.
#[derive(Debug, Default)]
struct RemovedItems(Vec<(Vec<Seg>, Vec<usize>)>);

impl RemovedItems {
    fn original(&self, current: &[Seg]) -> Vec<Seg> {
        let mut out: Vec<Seg> = Vec::with_capacity(current.len());
        for seg in current {
            match seg {
                Seg::Index(i) => {
                    let mut index = *i;
                    if let Some((_, gone)) = self.0.iter().find(|(list, _)| *list == out) {
                        // `gone` is in the order taken out, each as written: every one at or
                        // before this item's written position shifted it down by one.
                        let mut sorted = gone.clone();
                        sorted.sort_unstable();
                        for g in sorted {
                            if g <= index {
                                index += 1;
                            }
                        }
                    }
                    out.push(Seg::Index(index));
                }
                key => out.push(key.clone()),
            }
        }
        out
    }

    fn record(&mut self, original: &[Seg]) {
        if let Some((Seg::Index(i), list)) = original.split_last() {
            match self.0.iter_mut().find(|(l, _)| l.as_slice() == list) {
                Some((_, gone)) => gone.push(*i),
                None => self.0.push((list.to_vec(), vec![*i])),
            }
        }
    }

    /// The lists that lost items: validation paths inside them are numbered differently.
    fn shifted_lists(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|(list, _)| render_segments(list))
            .collect()
    }
}

fn render_segments(segments: &[Seg]) -> String {
    let mut out = String::new();
    let mut parent: Option<&str> = None;
    for seg in segments {
        match seg {
            Seg::Index(index) => {
                out.push_str(&format!("[{index}]"));
                parent = None;
            }
            Seg::Key(key) => {
                let data_key = parent.is_some_and(|p| FREE_FORM_MAPS.contains(&p));
                parent = Some(key.as_str());
                let plain = !data_key
                    && !key.is_empty()
                    && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                if plain {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(key);
                } else {
                    out.push_str(&format!("[{key:?}]"));
                }
            }
        }
    }
    out
}

/// serde would read a list as a struct's fields in order and report a confusing error inside
/// it; say plainly that a mapping was expected.
fn check_sections(value: &Value, prefix: &str) -> Result<(), DecodeError> {
    for section in ["metadata", "spec", "status"] {
        if let Some(v) = value.get(section)
            && !(v.is_object() || v.is_null())
        {
            return Err(DecodeError::Field {
                path: format!("{prefix}{section}"),
                message: format!("must be a mapping of fields, found {}", json_type(v)),
            });
        }
    }
    Ok(())
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn check_api_version(found: Option<&Value>, prefix: &str) -> Result<(), DecodeError> {
    match found {
        Some(Value::String(v)) if v == API_VERSION => Ok(()),
        Some(Value::String(v)) => Err(DecodeError::ApiVersion { found: v.clone() }),
        Some(other) => Err(DecodeError::Field {
            path: format!("{prefix}apiVersion"),
            message: format!("must be the string {API_VERSION:?}, found {other}"),
        }),
        None => Err(DecodeError::Field {
            path: format!("{prefix}apiVersion"),
            message: format!("missing (add apiVersion: {API_VERSION})"),
        }),
    }
}

fn suggest_kind(name: &str) -> Option<String> {
    if let Some(k) = Kind::from_alias(name) {
        return Some(k.name().to_string());
    }
    if name.starts_with(API_GROUP) {
        return None;
    }
    closest(name, Kind::ALL.iter().map(|k| k.name())).map(str::to_string)
}

/// Turns serde's error for a field into a path and a message an operator can act on.
fn field_error(e: &serde_path_to_error::Error<serde_json::Error>, prefix: &str) -> DecodeError {
    let (segments, raw) = first_error_parts(e);
    field_error_at(&raw, &segments, prefix)
}

fn field_error_at(raw: &str, segments: &[Seg], prefix: &str) -> DecodeError {
    let mut path = String::from(prefix);
    path.push_str(&render_segments(segments));
    let raw = raw.to_string();
    // serde says "unknown field `x`, expected one of `a`, `b`": name the field in the path and
    // suggest the closest valid name.
    if let Some(rest) = raw.strip_prefix("unknown field `")
        && let Some((field, expected)) = rest.split_once('`')
    {
        let candidates: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        // serde_path_to_error already ends the path with the unknown key.
        let named = path == field || path.ends_with(&format!(".{field}"));
        if !named {
            if !path.is_empty() && !path.ends_with('.') {
                path.push('.');
            }
            path.push_str(field);
        }
        let message = match closest(field, candidates.iter().copied()) {
            Some(s) => format!("unknown field {field:?} (did you mean {s:?}?)"),
            None => format!("unknown field {field:?}"),
        };
        return DecodeError::Field { path, message };
    }
    if let Some(rest) = raw.strip_prefix("missing field `")
        && let Some((field, _)) = rest.split_once('`')
    {
        if !path.is_empty() && !path.ends_with('.') {
            path.push('.');
        }
        path.push_str(field);
        return DecodeError::Field {
            path,
            message: "required field is missing".into(),
        };
    }
    if path.is_empty() {
        path.push_str("<document>");
    }
    DecodeError::Field { path, message: raw }
}

/// Fields whose keys are data (label names), not field names: their keys render as `["key"]`.
const FREE_FORM_MAPS: [&str; 6] = [
    "labels",
    "matchLabels",
    "annotations",
    "labelsToApply",
    "bpfLogFilters",
    "environmentVars",
];

fn failed(position: DocPosition, value: &Value, error: DecodeError) -> Decoded {
    decoded(position, value, Err(error))
}

fn decoded(position: DocPosition, value: &Value, result: Result<Resource, DecodeError>) -> Decoded {
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    Decoded {
        position,
        kind: text(value.get("kind")),
        name: text(value.get("metadata").and_then(|m| m.get("name"))),
        namespace: text(value.get("metadata").and_then(|m| m.get("namespace"))),
        result,
    }
}

/// Could not serialise a resource (not expected for well-formed values).
#[derive(Debug, thiserror::Error)]
#[error("cannot encode resource: {0}")]
pub struct EncodeError(String);

/// One resource (or any document) as YAML, laid out and quoted as calicoctl's
/// ([`crate::yaml_out`]).
pub fn to_yaml<T: Serialize>(resource: &T) -> Result<String, EncodeError> {
    let value = serde_json::to_value(resource).map_err(|e| EncodeError(e.to_string()))?;
    Ok(crate::yaml_out::to_yaml_string(&value))
}

/// One resource as JSON, indented when `pretty`.
pub fn to_json<T: Serialize>(resource: &T, pretty: bool) -> Result<String, EncodeError> {
    let r = if pretty {
        serde_json::to_string_pretty(resource)
    } else {
        serde_json::to_string(resource)
    };
    r.map_err(|e| EncodeError(e.to_string()))
}

/// Several resources of one kind as a list document (`kind: IPPoolList`), as calicoctl prints
/// them; mixed kinds use the generic `List`.
pub fn to_list_value(resources: &[Resource]) -> Result<Value, EncodeError> {
    let first = resources.first().map(Resource::kind);
    let same_kind = first.is_some_and(|k| resources.iter().all(|r| r.kind() == k));
    let kind = match first {
        Some(k) if same_kind => k.list_name(),
        _ => "List",
    };
    let items = resources
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| EncodeError(e.to_string()))?;
    Ok(serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": kind,
        "items": items,
        "metadata": {},
    }))
}
