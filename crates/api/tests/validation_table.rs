//! Table-driven validation cases (tests/fixtures/validation/*.yaml), derived from Calico's
//! validator, CRD schema rules and client checks. Each case is a document that must be valid,
//! or invalid with an error at a given field path.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::path::PathBuf;

use margay_api::codec::decode_documents;
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    valid: bool,
    #[serde(default)]
    error_path: Option<String>,
    doc: Value,
}

fn cases() -> Vec<(String, Case)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/validation");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let list: Vec<Case> =
            serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let file = f.file_name().unwrap().to_string_lossy().into_owned();
        out.extend(list.into_iter().map(|c| (file.clone(), c)));
    }
    out
}

/// Every error the document produces, as (path, message).
fn errors_of(doc: &Value) -> Vec<(String, String)> {
    let text = serde_json::to_string(doc).unwrap();
    let decoded = decode_documents(&text).unwrap();
    assert_eq!(decoded.len(), 1);
    match &decoded[0].result {
        Err(margay_api::DecodeError::Field { path, message }) => {
            vec![(path.clone(), message.clone())]
        }
        Err(margay_api::DecodeError::ApiVersion { .. }) => {
            vec![(
                "apiVersion".into(),
                decoded[0].result.as_ref().unwrap_err().to_string(),
            )]
        }
        Err(
            e
            @ (margay_api::DecodeError::UnknownKind { .. } | margay_api::DecodeError::MissingKind),
        ) => {
            vec![("kind".into(), e.to_string())]
        }
        Err(e) => vec![("<document>".into(), e.to_string())],
        Ok(r) => match r.validate() {
            Ok(()) => Vec::new(),
            Err(errs) => errs
                .iter()
                .map(|e| (e.path.clone(), e.message.clone()))
                .collect(),
        },
    }
}

#[test]
fn validation_table() {
    let cases = cases();
    let mut failures = Vec::new();
    let (mut valid, mut invalid) = (0, 0);
    let mut names = std::collections::BTreeSet::new();
    for (file, case) in &cases {
        assert!(
            names.insert(case.name.clone()),
            "duplicate case name {:?}",
            case.name
        );
        let errors = errors_of(&case.doc);
        if case.valid {
            valid += 1;
            if !errors.is_empty() {
                failures.push(format!(
                    "{file}: {:?} should be valid, got {errors:?}",
                    case.name
                ));
            }
        } else {
            invalid += 1;
            let want = case
                .error_path
                .as_deref()
                .unwrap_or_else(|| panic!("{:?}: no error_path", case.name));
            if !errors.iter().any(|(p, _)| p == want) {
                failures.push(format!(
                    "{file}: {:?} should fail at {want}, got {errors:?}",
                    case.name
                ));
            }
            for (p, m) in &errors {
                assert!(
                    !m.is_empty() && !p.is_empty(),
                    "{:?}: empty error",
                    case.name
                );
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert!(valid + invalid >= 150, "only {} cases", valid + invalid);
}
