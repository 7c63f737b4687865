//! Property tests: no panics, canonical round-trips, evaluation against a
//! reference interpreter, and soundness of label restrictions.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::collections::BTreeMap;

use margay_selector::Selector;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::select;

/// A generated selector: both its syntax (with formatting choices) and a
/// reference semantics independent of the crate's compiler.
#[derive(Debug, Clone)]
enum G {
    Has(&'static str),
    All,
    Global,
    Cmp(&'static str, Op, &'static str, &'static str),
    Set(&'static str, &'static str, Vec<&'static str>, bool),
    Not(usize, Box<G>),
    Paren(Box<G>),
    And(Vec<G>),
    Or(Vec<G>),
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Eq,
    Ne,
    Contains,
    StartsWith,
    EndsWith,
}

const LABELS: &[&str] = &["a", "b", "c", "app", "k8s-app", "x/y.z"];
const VALUES: &[&str] = &["", "x", "y", "xy", "yx", "a'b", "q\"r", "ü"];
const WS: &[&str] = &["", " ", "  ", "\t"];

type LabelSet = BTreeMap<&'static str, &'static str>;

impl G {
    fn eval(&self, l: &LabelSet) -> bool {
        match self {
            G::Has(k) => l.contains_key(k),
            G::All | G::Global => true,
            G::Cmp(k, op, _, v) => match (l.get(k), op) {
                (None, Op::Ne) => true,
                (None, _) => false,
                (Some(x), Op::Eq) => x == v,
                (Some(x), Op::Ne) => x != v,
                (Some(x), Op::Contains) => x.contains(v),
                (Some(x), Op::StartsWith) => x.starts_with(v),
                (Some(x), Op::EndsWith) => x.ends_with(v),
            },
            G::Set(k, spelling, vs, _) => {
                let negated = spelling.starts_with('n');
                match l.get(k) {
                    None => negated,
                    Some(x) => vs.contains(x) != negated,
                }
            }
            G::Not(n, g) => g.eval(l) ^ (n % 2 == 1),
            G::Paren(g) => g.eval(l),
            G::And(gs) => gs.iter().all(|g| g.eval(l)),
            G::Or(gs) => gs.iter().any(|g| g.eval(l)),
        }
    }

    /// Whether the parse tree's top node is a `!`.
    fn top_not(&self) -> bool {
        match self {
            G::Not(n, g) => n % 2 == 1 || g.top_not(),
            G::Paren(g) => g.top_not(),
            _ => false,
        }
    }

    /// Whether the parse tree contains `!` directly applied to `!` — the
    /// Calico quirk where the canonical form is not a fixed point.
    fn double_not(&self) -> bool {
        match self {
            G::Not(n, g) => (n % 2 == 1 && g.top_not()) || g.double_not(),
            G::Paren(g) => g.double_not(),
            G::And(gs) | G::Or(gs) => gs.iter().any(G::double_not),
            _ => false,
        }
    }

    fn render(&self, ws: &mut impl Iterator<Item = &'static str>, out: &mut String) {
        match self {
            G::Has(k) => {
                out.push_str("has(");
                w(ws, out);
                out.push_str(k);
                w(ws, out);
                out.push(')');
            }
            G::All | G::Global => {
                out.push_str(if matches!(self, G::All) {
                    "all("
                } else {
                    "global("
                });
                w(ws, out);
                out.push(')');
            }
            G::Cmp(k, _, spelling, v) => {
                out.push_str(k);
                // Word operators need a separator after the label.
                if spelling.starts_with(|c: char| c.is_ascii_alphabetic()) {
                    out.push(' ');
                }
                w(ws, out);
                out.push_str(spelling);
                w(ws, out);
                quote(v, out);
            }
            G::Set(k, spelling, vs, trailing_comma) => {
                out.push_str(k);
                out.push(' ');
                out.push_str(spelling);
                w(ws, out);
                out.push('{');
                for (i, v) in vs.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    w(ws, out);
                    quote(v, out);
                    w(ws, out);
                }
                if *trailing_comma && !vs.is_empty() {
                    out.push(',');
                }
                out.push('}');
            }
            G::Not(n, g) => {
                for _ in 0..*n {
                    out.push('!');
                    w(ws, out);
                }
                g.render(ws, out);
            }
            G::Paren(g) => {
                out.push('(');
                w(ws, out);
                g.render(ws, out);
                w(ws, out);
                out.push(')');
            }
            G::And(gs) | G::Or(gs) => {
                let op = if matches!(self, G::And(_)) {
                    "&&"
                } else {
                    "||"
                };
                for (i, g) in gs.iter().enumerate() {
                    if i > 0 {
                        w(ws, out);
                        out.push_str(op);
                        w(ws, out);
                    }
                    g.render(ws, out);
                }
            }
        }
    }
}

fn w(ws: &mut impl Iterator<Item = &'static str>, out: &mut String) {
    out.push_str(ws.next().unwrap_or(""));
}

fn quote(v: &str, out: &mut String) {
    let q = if v.contains('"') {
        '\''
    } else if v.contains('\'') {
        '"'
    } else if v.len().is_multiple_of(2) {
        '\''
    } else {
        '"'
    };
    out.push(q);
    out.push_str(v);
    out.push(q);
}

/// `!` directly before `!` would merge into one chain, and `!` / `&&` bind
/// tighter than `||`, so wrap where needed to keep syntax and tree aligned.
fn not(n: usize, g: G) -> G {
    match g {
        G::Not(m, inner) => G::Not(n + m, inner),
        G::And(_) | G::Or(_) => G::Not(n, Box::new(G::Paren(Box::new(g)))),
        _ => G::Not(n, Box::new(g)),
    }
}

fn and(gs: Vec<G>) -> G {
    G::And(
        gs.into_iter()
            .map(|g| match g {
                G::Or(_) => G::Paren(Box::new(g)),
                g => g,
            })
            .collect(),
    )
}

fn leaf() -> impl Strategy<Value = G> {
    let label = select(LABELS);
    let value = select(VALUES);
    prop_oneof![
        2 => label.clone().prop_map(G::Has),
        1 => Just(G::All),
        1 => Just(G::Global),
        4 => (label.clone(), select(&[
            (Op::Eq, "=="),
            (Op::Ne, "!="),
            (Op::Contains, "contains"),
            (Op::StartsWith, "starts with"),
            (Op::StartsWith, "startswith"),
            (Op::StartsWith, "starts\t with"),
            (Op::EndsWith, "ends with"),
            (Op::EndsWith, "endswith"),
        ][..]), value.clone())
            .prop_map(|(k, (op, s), v)| G::Cmp(k, op, s, v)),
        3 => (label, select(&["in", "not in", "notin"][..]), vec(value, 0..5), any::<bool>())
            .prop_map(|(k, s, vs, c)| G::Set(k, s, vs, c)),
    ]
}

fn selector() -> impl Strategy<Value = G> {
    leaf().prop_recursive(5, 48, 4, |inner| {
        prop_oneof![
            (1usize..4, inner.clone()).prop_map(|(n, g)| not(n, g)),
            // Negated parenthesised negation: exercises Calico's `!!` quirk.
            (1usize..3, 1usize..3, inner.clone())
                .prop_map(|(n, m, g)| not(n, G::Paren(Box::new(not(m, g))))),
            inner.clone().prop_map(|g| G::Paren(Box::new(g))),
            vec(inner.clone(), 2..4).prop_map(and),
            vec(inner, 2..4).prop_map(G::Or),
        ]
    })
}

/// A generated selector rendered with random whitespace.
fn rendered() -> impl Strategy<Value = (G, String)> {
    (selector(), vec(select(WS), 1..16), select(WS), select(WS)).prop_map(|(g, ws, pre, post)| {
        let mut out = String::from(pre);
        g.render(&mut ws.into_iter().cycle(), &mut out);
        out.push_str(post);
        (g, out)
    })
}

fn label_sets() -> impl Strategy<Value = Vec<LabelSet>> {
    vec(btree_map(select(LABELS), select(VALUES), 0..5), 1..10)
}

/// Fragments of the language, so that random concatenations get deep into
/// the parser rather than failing at the first character.
const TOKENS: &[&str] = &[
    "a",
    "b",
    "k8s-app",
    " ",
    "\t",
    "\n",
    "==",
    "!=",
    "!",
    "=",
    "&&",
    "||",
    "&",
    "|",
    "(",
    ")",
    "{",
    "}",
    ",",
    "\"x\"",
    "'y'",
    "\"",
    "'",
    "has(",
    "has(a)",
    "all()",
    "all(",
    "global()",
    "in",
    "not",
    "not in",
    "notin",
    "contains",
    "starts",
    "with",
    "startswith",
    "ends with",
    "endswith",
    "ü",
    "%",
];

fn check_no_panic(input: &str) {
    match Selector::parse(input) {
        Ok(sel) => {
            let again = Selector::parse(sel.canonical()).unwrap();
            let third = Selector::parse(again.canonical()).unwrap();
            assert_eq!(third.canonical(), again.canonical());
            let _ = sel.restrictions();
            sel.matches(&[("a", "x"), ("b", "y")]);
        }
        Err(e) => {
            assert!(e.position <= input.len(), "{e}");
            assert!(input.is_char_boundary(e.position), "{e}");
            assert!(!e.to_string().contains('\n'));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parser_never_panics_on_arbitrary_strings(input in any::<String>()) {
        check_no_panic(&input);
    }

    #[test]
    fn parser_never_panics_on_token_soup(parts in vec(select(TOKENS), 0..24)) {
        check_no_panic(&parts.concat());
    }

    #[test]
    fn evaluation_and_canonical_round_trip((g, text) in rendered(), sets in label_sets()) {
        let sel = Selector::parse(&text)
            .map_err(|e| TestCaseError::fail(format!("{text:?} should parse: {e}")))?;
        for l in &sets {
            prop_assert_eq!(sel.matches(l), g.eval(l), "{:?} on {:?}", text, l);
        }
        let again = Selector::parse(sel.canonical()).unwrap();
        for l in &sets {
            prop_assert_eq!(again.matches(l), g.eval(l), "canonical {} on {:?}", sel, l);
        }
        if g.double_not() {
            // Calico quirk: `!(!x)` renders as `!!x`, which re-parses as `x`;
            // one more round is a fixed point.
            let third = Selector::parse(again.canonical()).unwrap();
            prop_assert_eq!(third.canonical(), again.canonical());
            prop_assert_eq!(third.unique_id(), again.unique_id());
        } else {
            prop_assert_eq!(again.canonical(), sel.canonical());
            prop_assert_eq!(again.unique_id(), sel.unique_id());
            prop_assert_eq!(&again, &sel);
        }
    }

    #[test]
    fn restrictions_are_sound((g, text) in rendered(), sets in label_sets()) {
        let sel = Selector::parse(&text).unwrap();
        let r = &sel.restrictions();
        for l in &sets {
            if g.eval(l) {
                prop_assert!(sel.matches(l));
                prop_assert!(!r.impossible, "{} matched {:?} but is 'impossible'", sel, l);
                for (label, restriction) in &r.labels {
                    prop_assert!(
                        restriction.allows(l.get(label.as_str()).copied()),
                        "{} matched {:?} but violates {}: {:?}", sel, l, label, restriction
                    );
                }
                prop_assert!(r.allows(l));
            }
        }
        // Internal consistency of what the analysis reports.
        for restriction in r.labels.values() {
            prop_assert!(!(restriction.must_be_present && restriction.must_be_absent));
            if let Some(values) = &restriction.must_have_one_of_values {
                prop_assert!(restriction.must_be_present && !values.is_empty());
            }
        }
    }
}
