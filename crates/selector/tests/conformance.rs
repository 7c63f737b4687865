//! Every case of Calico's parser test table (tests/data/calico-selector-cases.json).
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::collections::BTreeMap;

use margay_selector::{Selector, validate};
use serde::Deserialize;

#[derive(Deserialize)]
struct Cases {
    match_tests: Vec<MatchTest>,
    bad_selectors: Vec<String>,
    canonicalisation: Vec<Canon>,
}

#[derive(Deserialize)]
struct MatchTest {
    selector: String,
    matches: Vec<BTreeMap<String, String>>,
    non_matches: Vec<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
struct Canon {
    input: String,
    canonical: String,
    /// Empty when Calico's table gives no expected UID.
    uid: String,
}

fn cases() -> Cases {
    serde_json::from_str(include_str!("data/calico-selector-cases.json")).unwrap()
}

#[test]
fn match_tests() {
    let cases = cases();
    assert_eq!(cases.match_tests.len(), 58);
    let mut checks = 0;
    for t in &cases.match_tests {
        let sel = Selector::parse(&t.selector).unwrap();
        validate(&t.selector).unwrap();
        // Calico also checks the canonical form evaluates the same.
        let canon = Selector::parse(sel.canonical()).unwrap();
        for labels in &t.matches {
            assert!(
                sel.matches(labels),
                "{:?} should match {labels:?}",
                t.selector
            );
            assert!(canon.matches(labels), "{canon} should match {labels:?}");
            checks += 1;
        }
        for labels in &t.non_matches {
            assert!(
                !sel.matches(labels),
                "{:?} should not match {labels:?}",
                t.selector
            );
            assert!(
                !canon.matches(labels),
                "{canon} should not match {labels:?}"
            );
            checks += 1;
        }
        assert_eq!(sel.unique_id(), canon.unique_id(), "{:?}", t.selector);
    }
    assert_eq!(checks, 98);
}

#[test]
fn bad_selectors_are_rejected() {
    let cases = cases();
    assert_eq!(cases.bad_selectors.len(), 26);
    for bad in &cases.bad_selectors {
        let err = Selector::parse(bad).expect_err(bad);
        assert!(validate(bad).is_err(), "{bad:?}");
        assert!(err.position <= bad.len(), "{bad:?}: {err}");
        assert_eq!(err.input, *bad);
    }
}

#[test]
fn canonicalisation() {
    let cases = cases();
    assert_eq!(cases.canonicalisation.len(), 17);
    for t in &cases.canonicalisation {
        let sel = Selector::parse(&t.input).unwrap();
        assert_eq!(sel.canonical(), t.canonical, "input {:?}", t.input);
        assert_eq!(sel.to_string(), t.canonical);
        if !t.uid.is_empty() {
            assert_eq!(sel.unique_id(), t.uid, "input {:?}", t.input);
        }
        let again = Selector::parse(sel.canonical()).unwrap();
        assert_eq!(again.canonical(), sel.canonical());
        assert_eq!(again.unique_id(), sel.unique_id());
        assert_eq!(again, sel);
    }
}
