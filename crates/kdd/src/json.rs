//! Reading Kubernetes objects (JSON values) with errors that name the field.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::{KddError, Result};

/// `Kind ns/name` or `Kind "name"`, for messages.
pub(crate) fn label(kind: &str, namespace: &str, name: &str) -> String {
    match (namespace.is_empty(), name.is_empty()) {
        (true, true) => format!("{kind} <no name>"),
        (true, false) => format!("{kind} {name:?}"),
        // Namespaced objects read as kubectl names them: `Pod shop/web-0`.
        (false, true) => format!("{kind} {namespace}/<no name>"),
        (false, false) => format!("{kind} {namespace}/{name}"),
    }
}

/// The label of a Kubernetes object value, read leniently (for messages only).
pub(crate) fn value_label(kind: &str, v: &Value) -> String {
    let text = |k: &str| {
        v.get("metadata")
            .and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    label(kind, text("namespace"), text("name"))
}

/// Decodes `value` into `T`, naming the field that does not fit.
pub(crate) fn decode<T: DeserializeOwned>(value: &Value, object: &str) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = render_path(e.path());
        KddError::new(object, field, e.inner().to_string())
    })
}

/// Decodes the JSON text held by a string field (an annotation), naming that field.
pub(crate) fn decode_str<T: DeserializeOwned>(text: &str, object: &str, field: &str) -> Result<T> {
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let inner = render_path(e.path());
        let message = if inner.is_empty() || inner == "<object>" {
            e.inner().to_string()
        } else {
            format!("{inner}: {}", e.inner())
        };
        KddError::new(object, field, message)
    })
}

/// `metadata.annotations["cni.projectcalico.org/podIP"]`-style paths: keys that are not plain
/// identifiers are quoted in brackets.
pub(crate) fn render_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } => push_key(&mut out, key),
            Segment::Enum { variant } => push_key(&mut out, variant),
            Segment::Unknown => {}
        }
    }
    if out.is_empty() || out == "." {
        "<object>".to_string()
    } else {
        out
    }
}

fn push_key(out: &mut String, key: &str) {
    let plain = !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if plain {
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(key);
    } else {
        out.push_str(&format!("[{key:?}]"));
    }
}

/// The path of an annotation, for messages.
pub(crate) fn annotation_path(key: &str) -> String {
    format!("metadata.annotations[{key:?}]")
}

/// Go writes nil slices and maps as `null`; read them as empty.
pub(crate) fn null_as_default<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
