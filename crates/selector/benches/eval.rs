//! Evaluation and parse cost of a typical 4-term selector against a 10-label set.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use margay_selector::Selector;

const SELECTOR: &str = r#"app == "web" && tier in {"fe","be"} && has(env) && version != "v1""#;

fn labels(overrides: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = [
        ("app", "web"),
        ("tier", "fe"),
        ("env", "prod"),
        ("version", "v2"),
        ("projectcalico.org/namespace", "default"),
        ("projectcalico.org/orchestrator", "k8s"),
        ("pod-template-hash", "5d4f8c7b9"),
        ("team", "payments"),
        ("region", "eu-west-1"),
        ("zone", "eu-west-1a"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for (k, v) in overrides {
        labels.insert((*k).to_owned(), (*v).to_owned());
    }
    assert_eq!(labels.len(), 10);
    labels
}

fn eval(c: &mut Criterion) {
    let sel = Selector::parse(SELECTOR).unwrap();
    let matching = labels(&[]);
    // Fails on the last term: every term is evaluated.
    let non_matching_last = labels(&[("version", "v1")]);
    // Fails on the first term: short-circuits immediately.
    let non_matching_first = labels(&[("app", "db")]);
    assert!(sel.matches(&matching));
    assert!(!sel.matches(&non_matching_last));
    assert!(!sel.matches(&non_matching_first));

    let mut g = c.benchmark_group("eval");
    g.bench_function("match", |b| {
        b.iter(|| black_box(&sel).matches(black_box(&matching)))
    });
    g.bench_function("non_match_last_term", |b| {
        b.iter(|| black_box(&sel).matches(black_box(&non_matching_last)))
    });
    g.bench_function("non_match_first_term", |b| {
        b.iter(|| black_box(&sel).matches(black_box(&non_matching_first)))
    });
    // Lower bound: the four BTreeMap lookups alone, hand-coded.
    g.bench_function("baseline_4_lookups_match", |b| {
        b.iter(|| {
            let l = black_box(&matching);
            l.get("app").is_some_and(|v| v == "web")
                && l.get("tier").is_some_and(|v| v == "fe" || v == "be")
                && l.contains_key("env")
                && l.get("version").is_none_or(|v| v != "v1")
        })
    });
    g.finish();

    let mut g = c.benchmark_group("parse");
    g.bench_function("4_term", |b| {
        b.iter(|| Selector::parse(black_box(SELECTOR)))
    });
    g.bench_function("4_term_restrictions", |b| {
        b.iter(|| Selector::parse(black_box(SELECTOR)).map(|s| s.restrictions().labels.len()))
    });
    g.finish();
}

criterion_group!(benches, eval);
criterion_main!(benches);
