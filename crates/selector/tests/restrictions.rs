//! Label-restriction analysis on hand-picked selectors (Calico's table plus
//! cases where negation is pushed through).
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::collections::{BTreeMap, BTreeSet};

use margay_selector::{LabelRestriction, LabelRestrictions, Selector};

fn present(values: Option<&[&str]>) -> LabelRestriction {
    LabelRestriction {
        must_be_present: true,
        must_be_absent: false,
        must_have_one_of_values: values.map(|vs| vs.iter().map(|v| (*v).to_owned()).collect()),
    }
}

fn absent() -> LabelRestriction {
    LabelRestriction {
        must_be_absent: true,
        ..LabelRestriction::default()
    }
}

fn restrictions(sel: &str) -> LabelRestrictions {
    Selector::parse(sel).unwrap().restrictions()
}

fn expect(sel: &str, expected: &[(&str, LabelRestriction)]) {
    let want = LabelRestrictions {
        labels: expected
            .iter()
            .map(|(k, r)| ((*k).to_owned(), r.clone()))
            .collect::<BTreeMap<_, _>>(),
        impossible: false,
    };
    assert_eq!(restrictions(sel), want, "selector {sel:?}");
    // Wrapping in `all() && (...)` changes nothing (as in Calico's test).
    if !sel.is_empty() {
        assert_eq!(
            restrictions(&format!("all() && ({sel})")),
            want,
            "all() && ({sel})"
        );
    }
}

fn expect_impossible(sel: &str) {
    let r = restrictions(sel);
    assert!(r.impossible, "{sel:?}: {r:?}");
    assert!(!r.can_match());
    assert!(r.labels.is_empty());
}

#[test]
fn calico_base_cases() {
    expect("", &[]);
    expect("all()", &[]);
    expect("global()", &[]);
    expect("a == 'value'", &[("a", present(Some(&["value"])))]);
    expect("has(a)", &[("a", present(None))]);
    expect("a in {'v1','v2'}", &[("a", present(Some(&["v1", "v2"])))]);
    expect("a not in {'v1','v2'}", &[]);
    expect("a contains 'foo'", &[("a", present(None))]);
    expect("a ends with 'foo'", &[("a", present(None))]);
    expect("a starts with 'foo'", &[("a", present(None))]);
    expect("a != 'value'", &[]);
}

#[test]
fn calico_and_cases() {
    expect("a == 'v1' && a == 'v1'", &[("a", present(Some(&["v1"])))]);
    expect_impossible("a == 'v1' && a == 'v2'");
    expect("a == 'v1' && has(a)", &[("a", present(Some(&["v1"])))]);
    expect(
        "a in {'v1','v2'} && a in {'v2','v3'} ",
        &[("a", present(Some(&["v2"])))],
    );
    expect(
        "a in {'v1','v2', 'v3'} && a in {'v2','v3'} ",
        &[("a", present(Some(&["v2", "v3"])))],
    );
    expect("has(a) && a == 'v1'", &[("a", present(Some(&["v1"])))]);
    expect_impossible("has(a) && !has(a)");
    expect(
        "a == 'v1' && b == 'v2'",
        &[("a", present(Some(&["v1"]))), ("b", present(Some(&["v2"])))],
    );
    expect("a == 'v1' && all()", &[("a", present(Some(&["v1"])))]);
    expect("all() && a == 'v1'", &[("a", present(Some(&["v1"])))]);
}

#[test]
fn calico_or_cases() {
    expect(
        "a == 'v1' || a == 'v2'",
        &[("a", present(Some(&["v1", "v2"])))],
    );
    expect("has(a) || a == 'v2'", &[("a", present(None))]);
    expect("a=='v2' || has(a)", &[("a", present(None))]);
    expect("a=='v2' || has(b)", &[]);
    expect("a=='v2' || (has(b) && has(a))", &[("a", present(None))]);
    expect("a == 'v1' || b == 'v2'", &[]);
    expect("a == 'v1' || all()", &[]);
    expect("all() || b == 'v2'", &[]);
}

#[test]
fn calico_not_cases() {
    expect("!(a == 'value')", &[]);
    expect("!has(a)", &[("a", absent())]);
    expect("!!has(a)", &[("a", present(None))]);
}

#[test]
fn negation_pushed_through() {
    expect("!(a != 'x')", &[("a", present(Some(&["x"])))]);
    expect(
        "!(a not in {'x', 'y'})",
        &[("a", present(Some(&["x", "y"])))],
    );
    expect("!(has(a) || has(b))", &[("a", absent()), ("b", absent())]);
    expect(
        "!(has(a) || b != 'x')",
        &[("a", absent()), ("b", present(Some(&["x"])))],
    );
    expect("!(!has(a))", &[("a", present(None))]);
    // !(x && y) = !x || !y: nothing common.
    expect("!(has(a) && has(b))", &[]);
    expect(
        "!(has(a) && has(b)) && has(a)",
        &[("a", present(None)), ("b", absent())],
    );
    expect("!has(a) || !has(a)", &[("a", absent())]);
    expect("!has(a) || a == 'x'", &[]);
    expect("a contains 'x' || a in {'y'}", &[("a", present(None))]);
}

#[test]
fn impossible_selectors() {
    expect_impossible("!all()");
    expect_impossible("!global()");
    expect_impossible("a in {}");
    expect_impossible("a in {'x'} && a in {'y'}");
    expect_impossible("(a == 'x' || a == 'y') && a == 'z'");
    expect_impossible("!has(a) && a contains 'x'");
    expect_impossible("!all() || (has(a) && !has(a))");
    // An impossible branch of || contributes nothing.
    expect("a == 'x' || !all()", &[("a", present(Some(&["x"])))]);
    expect(
        "(a == 'x' || a == 'y') && has(b)",
        &[("a", present(Some(&["x", "y"]))), ("b", present(None))],
    );
}

#[test]
fn helpers() {
    let sel = Selector::parse("a in {'x','y'} && has(b) && !has(c) && d != 'z'").unwrap();
    let r = &sel.restrictions();
    assert!(r.can_match());
    assert_eq!(r.required_labels().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(r.excluded_labels().collect::<Vec<_>>(), ["c"]);
    assert_eq!(
        r.get("a").unwrap().must_have_one_of_values,
        Some(BTreeSet::from(["x".to_owned(), "y".to_owned()]))
    );
    assert!(r.get("d").is_none());
    assert!(r.allows(&[("a", "x"), ("b", "")]));
    assert!(!r.allows(&[("a", "z"), ("b", "")]));
    assert!(!r.allows(&[("a", "x")]));
    assert!(!r.allows(&[("a", "x"), ("b", ""), ("c", "")]));
    assert_eq!(&sel.restrictions(), r);
    assert!(
        !LabelRestrictions {
            impossible: true,
            ..LabelRestrictions::default()
        }
        .allows(&[("a", "x")])
    );
}

#[test]
fn large_selectors() {
    // Long chains must not copy ever-growing state maps (quadratic blow-up).
    let n = 20_000;
    let chain = (0..n)
        .map(|i| format!("l{i} == 'x'"))
        .collect::<Vec<_>>()
        .join(" && ");
    let r = restrictions(&chain);
    assert_eq!(r.labels.len(), n);
    assert_eq!(r.required_labels().count(), n);
    let r = restrictions(&format!("({chain}) || has(z)"));
    assert_eq!(r, LabelRestrictions::default());
    let r = restrictions(&format!("({chain}) || (l7 == 'y' && has(z))"));
    assert_eq!(r.labels.len(), 1);
    assert_eq!(r.labels["l7"], present(Some(&["x", "y"])));
}
