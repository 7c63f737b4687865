//! Round-trip tests on resource documents modeled on Calico's documentation
//! (tests/fixtures/docs): each must decode, validate, and survive YAML and JSON round trips
//! with every value intact.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::path::PathBuf;

use margay_api::codec::{decode_documents, to_json, to_yaml};
use margay_api::{Kind, Resource};
use serde_json::Value;

fn fixtures() -> Vec<(String, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/docs");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "json")
            )
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read fixture");
            (p.file_name().unwrap().to_string_lossy().into_owned(), text)
        })
        .collect()
}

/// The input documents as plain values, list items expanded, in decode order.
fn raw_documents(text: &str) -> Vec<Value> {
    let values: Vec<Value> = if text.trim_start().starts_with('{') {
        vec![serde_json::from_str(text).unwrap()]
    } else {
        serde_norway::Deserializer::from_str(text)
            .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
            .filter(|v| !v.is_null())
            .collect()
    };
    let mut out = Vec::new();
    for v in values {
        let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
        if kind == "List" || Kind::from_list_name(kind).is_some() {
            for mut item in v["items"].as_array().cloned().unwrap_or_default() {
                if let (Some(k), Value::Object(m)) = (Kind::from_list_name(kind), &mut item) {
                    m.entry("kind").or_insert(Value::String(k.name().into()));
                    m.entry("apiVersion")
                        .or_insert(Value::String("projectcalico.org/v3".into()));
                }
                out.push(item);
            }
        } else {
            out.push(v);
        }
    }
    out
}

/// Drops values Go's encoder omits (null, "", false, empty lists and maps) and compares
/// numbers as floats, so "1" vs "1.0" and omitted-vs-empty do not count as differences.
fn normalize(v: &Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::Bool(false) => None,
        Value::String(s) if s.is_empty() => None,
        Value::Number(n) => Some(Value::from(n.as_f64().unwrap())),
        Value::Array(a) => {
            let items: Vec<Value> = a
                .iter()
                .map(|x| normalize(x).unwrap_or(Value::Null))
                .collect();
            if items.is_empty() {
                None
            } else {
                Some(Value::Array(items))
            }
        }
        Value::Object(m) => {
            let out: serde_json::Map<String, Value> = m
                .iter()
                // Go always writes a workload port's hostPort, even 0; margay omits 0.
                .filter(|(k, x)| !(k.as_str() == "hostPort" && x.as_f64() == Some(0.0)))
                .filter_map(|(k, x)| normalize(x).map(|x| (k.clone(), x)))
                .collect();
            if out.is_empty() {
                None
            } else {
                Some(Value::Object(out))
            }
        }
        other => Some(other.clone()),
    }
}

#[test]
fn documentation_examples_decode_validate_and_round_trip() {
    let mut count = 0;
    let mut kinds = std::collections::BTreeSet::new();
    for (file, text) in fixtures() {
        let decoded = decode_documents(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        let raw = raw_documents(&text);
        assert_eq!(decoded.len(), raw.len(), "{file}: document count");
        for (d, original) in decoded.iter().zip(raw.iter()) {
            let r: &Resource = d
                .result
                .as_ref()
                .unwrap_or_else(|e| panic!("{file} {}: {e}", d.position));
            if let Err(errs) = r.validate() {
                panic!("{file} {}: invalid: {errs}", d.position);
            }
            kinds.insert(r.kind());
            count += 1;

            // Every value of the input survives serialisation.
            let out = serde_json::to_value(r).unwrap();
            assert_eq!(
                normalize(&out),
                normalize(original),
                "{file} {}: JSON output differs from input",
                d.position
            );

            // YAML and JSON output decode back to the same resource.
            for encoded in [to_yaml(r).unwrap(), to_json(r, true).unwrap()] {
                let again = decode_documents(&encoded).unwrap();
                assert_eq!(again.len(), 1);
                assert_eq!(
                    again[0].result.as_ref().unwrap(),
                    r,
                    "{file}: re-decode differs"
                );
            }
        }
    }
    assert!(count >= 25, "only {count} documentation documents");
    assert_eq!(kinds.len(), Kind::ALL.len(), "kinds covered: {kinds:?}");
}
