//! Tokenizer edge cases, error reporting, semantics of missing labels, `!`
//! chains, nesting and whitespace.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::collections::{BTreeMap, HashMap};

use margay_selector::{Labels, MAX_LABEL_LEN, ParseError, Selector, validate};

fn canon(input: &str) -> String {
    match Selector::parse(input) {
        Ok(sel) => sel.canonical().to_owned(),
        Err(e) => panic!("{input:?} should parse: {e}"),
    }
}

fn err(input: &str) -> ParseError {
    let e = Selector::parse(input).expect_err(input);
    assert_eq!(validate(input), Err(e.clone()));
    e
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn matches(sel: &str, pairs: &[(&str, &str)]) -> bool {
    Selector::parse(sel).unwrap().matches(&labels(pairs))
}

#[test]
fn operator_spellings() {
    for (input, expected) in [
        (r#"a=="b""#, r#"a == "b""#),
        (r#"a!="b""#, r#"a != "b""#),
        (r#"(a=="b")"#, r#"a == "b""#),
        (r#"label contains"value""#, r#"label contains "value""#),
        (r#"label startswith "v""#, r#"label starts with "v""#),
        (r#"label starts  with "v""#, r#"label starts with "v""#),
        ("label starts\twith 'v'", r#"label starts with "v""#),
        (r#"label endswith "v""#, r#"label ends with "v""#),
        (r#"label ends  with"v""#, r#"label ends with "v""#),
        (r#"a notin {"x"}"#, r#"a not in {"x"}"#),
        (r#"a not  in{"x"}"#, r#"a not in {"x"}"#),
        (r#"a in{"x"}"#, r#"a in {"x"}"#),
        (r#"a in {"x",}"#, r#"a in {"x"}"#),
        (r#"a in {"y" , 'x' ,}"#, r#"a in {"x", "y"}"#),
        ("a in {}", "a in {}"),
        ("a not in { }", "a not in {}"),
        ("has( foo )", "has(foo)"),
        ("all( )", "all()"),
        ("global( )", "global()"),
        ("!global()", "!global()"),
    ] {
        assert_eq!(canon(input), expected, "input {input:?}");
    }
}

#[test]
fn keywords_are_valid_labels() {
    for (input, expected) in [
        (
            r#"contains contains "contains""#,
            r#"contains contains "contains""#,
        ),
        (
            r#"startswith starts with "x""#,
            r#"startswith starts with "x""#,
        ),
        (r#"endswith ends with "x""#, r#"endswith ends with "x""#),
        (r#"all == "x""#, r#"all == "x""#),
        (r#"has == "x""#, r#"has == "x""#),
        (r#"global != "x""#, r#"global != "x""#),
        (r#"in in {"in"}"#, r#"in in {"in"}"#),
        (r#"not not in {"x"}"#, r#"not not in {"x"}"#),
    ] {
        assert_eq!(canon(input), expected, "input {input:?}");
    }
}

#[test]
fn label_characters() {
    for label in [
        "calico/k8s_NS-.1/role",
        "-a",
        "/",
        "..",
        "123",
        "_",
        "k8s-app",
    ] {
        assert_eq!(canon(&format!("has({label})")), format!("has({label})"));
        assert_eq!(
            canon(&format!("{label} == 'x'")),
            format!("{label} == \"x\"")
        );
        assert!(matches(&format!("{label} == 'x'"), &[(label, "x")]));
    }
    // Non-ASCII is not a label character.
    let e = err("ä == \"x\"");
    assert_eq!(e.position, 0);
    assert_eq!(e.found, "\"ä\"");
}

#[test]
fn label_length_limit() {
    let ok = "a".repeat(MAX_LABEL_LEN);
    assert_eq!(MAX_LABEL_LEN, 512);
    assert!(Selector::parse(&format!("{ok} == \"v\"")).is_ok());
    assert!(Selector::parse(&format!("has({ok})")).is_ok());

    let long = "a".repeat(MAX_LABEL_LEN + 1);
    let e = err(&format!("{long} == \"v\""));
    assert_eq!(e.position, 0);
    assert_eq!(e.expected, "a label of at most 512 characters");
    assert_eq!(e.found, "a label of 513 characters");
    let e = err(&format!("has( {long})"));
    assert_eq!(e.position, 5);
    // Values have no limit.
    assert!(Selector::parse(&format!("a == \"{}\"", "v".repeat(10_000))).is_ok());
}

#[test]
fn strings() {
    assert_eq!(canon(r#"a == "'""#), r#"a == "'""#);
    assert_eq!(canon(r#"a == '"'"#), r#"a == '"'"#);
    assert_eq!(canon("a == ''"), r#"a == """#);
    // Anything but the closing quote, including newlines, tabs and non-ASCII.
    assert_eq!(canon("a == 'x\ny\tü'"), "a == \"x\ny\tü\"");
    assert!(matches("a == 'x\ny'", &[("a", "x\ny")]));
    // Mixed quotes in one set.
    assert_eq!(canon(r#"a in {'"', "'"}"#), r#"a in {'"', "'"}"#);
    // No escapes: a backslash is an ordinary character.
    assert_eq!(canon(r#"a == "x\""#), r#"a == "x\""#);
}

#[test]
fn rejected() {
    for bad in [
        r#"a = "b""#,
        r#"label == "value"#,
        "label == 'value",
        "all(",
        "global(",
        "has()",
        "has(foo",
        "has( foo ",
        r#"a == "b" & has(foo)"#,
        r#"a == "b" | has(foo)"#,
        r#"label starts foo "value""#,
        r#"label inf "value""#,
        r#"label ends foo "value""#,
        r#"label ends withs "value""#,
        r#"label squiggles "value""#,
        r#"label containsx "value""#,
        r#"a not in "bar""#,
        "b in c",
        "has (a)",
        "all ()",
        "global ()",
        "a in {,}",
        r#"a in {"x" "y"}"#,
        r#"a in {"x",,}"#,
        r#"a in {"x""#,
        r#"a in ("x")"#,
        r#"a ! = "b""#,
        r#"a == "b" b == "c""#,
        r#"(a == "b"))"#,
        r#"!=a == "b""#,
        r#"!!= "b""#,
        "a ==",
        r#"&& a == "b""#,
        r#"a == "b" &&"#,
        r#"a == "b" ||"#,
        r#"a == "b" && || c == "d""#,
        r#"a == "b" "c""#,
        "!()",
        "(())",
        "all() all()",
        "has(a)has(b)",
        "has(a) == \"b\"",
        "a\n== \"b\"",
        "a == \"b\"\n",
        "\n",
        "a == \"b\"\r",
        "\u{a0}all()",
    ] {
        let e = err(bad);
        assert!(e.position <= bad.len(), "{bad:?}: {e}");
        assert!(bad.is_char_boundary(e.position));
    }
}

#[test]
fn error_messages() {
    let e = err("a === b");
    assert_eq!(
        e.to_string(),
        r#"invalid selector "a === b": at position 4: expected a string, found "=""#
    );
    assert_eq!((e.position, e.expected.as_str()), (4, "a string"));

    let e = err(r#"a == "b" && %"#);
    assert_eq!(e.position, 12);
    assert_eq!(e.found, r#""%""#);
    assert_eq!(
        e.expected,
        r#"a label, "has(", "all()", "global()", "!" or "(""#
    );

    let e = err(r#"(a == "foo""#);
    assert_eq!(e.position, 11);
    assert_eq!(e.found, "end of input");
    assert_eq!(
        e.expected,
        r#""&&", "||" or ")" (to close the "(" at position 0)"#
    );

    let e = err(")");
    assert_eq!((e.position, e.found.as_str()), (0, r#"")""#));

    let e = err(r#"a == "b")"#);
    assert_eq!(e.position, 8);
    assert_eq!(e.expected, r#""&&", "||" or end of input"#);

    let e = err(r#"a == "FOO"#);
    assert_eq!(e.position, 5);
    assert_eq!(e.found, "end of input");
    assert!(e.expected.contains("closing \""), "{e}");

    let e = err("a b");
    assert_eq!(e.position, 2);
    assert_eq!(e.found, r#""b""#);
    assert!(e.expected.starts_with("an operator"), "{e}");

    let e = err("a ");
    assert_eq!((e.position, e.found.as_str()), (2, "end of input"));

    let e = err(r#"foo in """#);
    assert_eq!(e.position, 7);
    assert_eq!(e.expected, r#""{""#);
    assert_eq!(e.found, r#""\"\"""#);

    let e = err(r#"foo in {"a" "b"}"#);
    assert_eq!((e.position, e.expected.as_str()), (12, r#""," or "}""#));
    let e = err("foo in {,}");
    assert_eq!((e.position, e.expected.as_str()), (8, r#"a string or "}""#));

    let e = err("has(a");
    assert_eq!(e.expected, r#"")" to close "has(""#);
    let e = err(r#"a == "b" & c"#);
    assert_eq!((e.position, e.found.as_str()), (9, r#""&""#));
    let e = err(r#"a == "b" && && c"#);
    assert_eq!((e.position, e.found.as_str()), (12, r#""&&""#));

    // One line even when the input has newlines; long input is truncated.
    let e = err("a == \"b\"\n");
    assert_eq!(e.position, 8);
    assert!(!e.to_string().contains('\n'), "{e}");
    let long = format!("{}%", "has(a) && ".repeat(100));
    let e = err(&long);
    assert_eq!(e.position, long.len() - 1);
    assert!(e.to_string().len() < 400, "{e}");
    assert!(e.to_string().contains("..."), "{e}");
}

#[test]
fn missing_label_semantics() {
    let empty: &[(&str, &str)] = &[];
    for (sel, expected) in [
        (r#"a == "x""#, false),
        (r#"a != "x""#, true),
        (r#"a in {"x"}"#, false),
        (r#"a not in {"x"}"#, true),
        ("a in {}", false),
        ("a not in {}", true),
        (r#"a contains "x""#, false),
        (r#"a contains """#, false),
        (r#"a starts with """#, false),
        (r#"a ends with """#, false),
        ("has(a)", false),
        ("!has(a)", true),
        (r#"!a == "x""#, true),
        (r#"!a != "x""#, false),
        ("all()", true),
        ("global()", true),
        ("!all()", false),
        ("", true),
    ] {
        assert_eq!(matches(sel, empty), expected, "{sel:?} on no labels");
        assert_eq!(matches(sel, &[("b", "x")]), expected, "{sel:?} on b=x");
    }
    // Present but empty value.
    assert!(matches(r#"a == """#, &[("a", "")]));
    assert!(!matches(r#"a != """#, &[("a", "")]));
    assert!(matches(r#"a contains """#, &[("a", "")]));
    assert!(matches(r#"a starts with """#, &[("a", "x")]));
    assert!(matches(r#"a in {""}"#, &[("a", "")]));
    assert!(matches("has(a)", &[("a", "")]));
}

#[test]
fn string_operators() {
    assert!(matches(r#"a contains "b""#, &[("a", "abc")]));
    assert!(!matches(r#"a contains "d""#, &[("a", "abc")]));
    assert!(matches(r#"a starts with "ab""#, &[("a", "abc")]));
    assert!(!matches(r#"a starts with "bc""#, &[("a", "abc")]));
    assert!(matches(r#"a ends with "bc""#, &[("a", "abc")]));
    assert!(!matches(r#"a ends with "ab""#, &[("a", "abc")]));
    // Byte-wise, case-sensitive.
    assert!(!matches(r#"a == "X""#, &[("a", "x")]));
    assert!(matches(r#"a in {"x", "ü", "z"}"#, &[("a", "ü")]));
    assert!(!matches(r#"a not in {"x", "ü", "z"}"#, &[("a", "ü")]));
}

#[test]
fn not_chains() {
    assert_eq!(canon("!!!has(a)"), "!has(a)");
    assert_eq!(canon("!!has(a)"), "has(a)");
    assert_eq!(canon("! ! has(a)"), "has(a)");
    assert_eq!(canon("!\t!\t!has(a)"), "!has(a)");
    assert_eq!(
        canon(r#"!!(a == "b" || c == "d")"#),
        r#"(a == "b" || c == "d")"#
    );
    assert_eq!(canon(r#"!(a == "b")"#), r#"!a == "b""#);
    assert_eq!(
        canon(r#"!a == "b" && !b != "c""#),
        r#"(!a == "b" && !b != "c")"#
    );
    // Calico quirk: `!` chains collapse only when adjacent, so negating a
    // parenthesised negation renders `!!`, which re-parses to the positive form.
    // The canonical form is then not a fixed point (kept for UniqueID parity).
    assert_eq!(canon("!(!has(a))"), "!!has(a)");
    assert_eq!(canon("!!has(a)"), "has(a)");
    let quirk = Selector::parse("!(!has(a))").unwrap();
    assert!(quirk.matches(&labels(&[("a", "")])));
    assert!(!quirk.matches(&labels(&[])));

    assert!(!matches("!!!has(a)", &[("a", "x")]));
    assert!(matches("!!has(a)", &[("a", "x")]));
    assert!(matches("!(has(a) && has(b))", &[("a", "x")]));
    assert!(!matches("!(has(a) || has(b))", &[("b", "x")]));
}

#[test]
fn nesting_and_precedence() {
    assert_eq!(canon(r#"((((a == "b"))))"#), r#"a == "b""#);
    assert_eq!(
        canon(r#"(a == "b" && (c == "d" || (e == "f")))"#),
        r#"(a == "b" && (c == "d" || e == "f"))"#
    );
    // Groups are not flattened (Calico doesn't either).
    assert_eq!(
        canon(r#"a == "1" && (b == "2" && c == "3")"#),
        r#"(a == "1" && (b == "2" && c == "3"))"#
    );
    // && binds tighter than ||.
    assert_eq!(
        canon(r#"a == "1" || b == "2" && c == "3""#),
        r#"(a == "1" || (b == "2" && c == "3"))"#
    );
    assert_eq!(
        canon(r#"a == "1" && b == "2" || c == "3""#),
        r#"((a == "1" && b == "2") || c == "3")"#
    );
    assert!(matches(
        r#"a == "1" || b == "2" && c == "3""#,
        &[("a", "1")]
    ));
    assert!(!matches(
        r#"a == "1" && b == "2" || c == "3""#,
        &[("a", "1")]
    ));
    assert_eq!(
        canon("has(a) && all() || !global()"),
        "((has(a) && all()) || !global())"
    );
}

#[test]
fn deep_nesting_does_not_overflow() {
    let depth = 100_000;
    let input = format!("{}has(a){}", "(".repeat(depth), ")".repeat(depth));
    assert_eq!(canon(&input), "has(a)");

    let depth = 20_000;
    let input = format!("{}has(a){}", "!(".repeat(depth), ")".repeat(depth));
    let sel = Selector::parse(&input).unwrap();
    assert_eq!(sel.canonical(), format!("{}has(a)", "!".repeat(depth)));
    assert!(sel.matches(&labels(&[("a", "1")])));

    let input = format!("{}has(b){}", "(has(a) && ".repeat(depth), ")".repeat(depth));
    let sel = Selector::parse(&input).unwrap();
    assert!(sel.matches(&labels(&[("a", "1"), ("b", "2")])));
    assert!(!sel.matches(&labels(&[("a", "1")])));
    assert!(!sel.restrictions().impossible);
    assert_eq!(sel.restrictions().required_labels().count(), 2);
}

#[test]
fn whitespace() {
    assert_eq!(canon(""), "all()");
    assert_eq!(canon(" \t "), "all()");
    assert_eq!(canon("\tall()\t"), "all()");
    assert_eq!(canon(" ( all( ) ) "), "all()");
    assert_eq!(
        canon("\ta\t==\t'b'\t&&\thas(\tc\t)"),
        r#"(a == "b" && has(c))"#
    );
    assert_eq!(canon("!\thas(a)"), "!has(a)");
    assert_eq!(
        canon(r#"a=="b"&&c!="d"||!has(e)"#),
        r#"((a == "b" && c != "d") || !has(e))"#
    );
    // Only space and tab are whitespace.
    for bad in ["\n", "\r\n", "has(a)\n", "\x0b", "\x0c"] {
        err(bad);
    }
}

#[test]
fn identity_and_traits() {
    let a: Selector = r#"a=="b" && c in {'y','x','x'}"#.parse().unwrap();
    let b = Selector::parse(r#"(a == 'b' && c in {"x", "y"})"#).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.unique_id(), b.unique_id());
    assert_eq!(a.to_string(), r#"(a == "b" && c in {"x", "y"})"#);
    assert_eq!(
        format!("{a:?}"),
        r#"Selector("(a == \"b\" && c in {\"x\", \"y\"})")"#
    );
    assert!(a.unique_id().starts_with("s:"));
    assert_eq!(a.unique_id().len(), 40);
    let set: std::collections::HashSet<Selector> = [a.clone(), b.clone()].into_iter().collect();
    assert_eq!(set.len(), 1);

    assert_eq!(Selector::all(), Selector::parse("").unwrap());
    assert_eq!(
        Selector::all().unique_id(),
        "s:5y5I3VdRZfDU01O--xXAPx2yxCQQqMf0M6IWug"
    );
    assert_eq!(Selector::default(), Selector::all());
    let none = Selector::none();
    assert_eq!(none, Selector::parse("!all()").unwrap());
    assert_eq!(
        none.unique_id(),
        Selector::parse("!all()").unwrap().unique_id()
    );
    assert!(!none.matches(&labels(&[])));
    assert!(none.restrictions().impossible);
    assert!(Selector::all().matches(&labels(&[])));
    assert_ne!(Selector::parse("global()").unwrap(), Selector::all());
}

#[test]
fn selector_is_a_plain_shareable_value() {
    fn assert_traits<T: Send + Sync + Clone + Eq + std::hash::Hash + Ord + 'static>() {}
    fn assert_error<T: std::error::Error + Send + Sync + Clone + Eq + 'static>() {}
    assert_traits::<Selector>();
    assert_error::<ParseError>();
}

#[test]
fn labels_impls() {
    let sel = Selector::parse(r#"a == "1" && b in {"2"}"#).unwrap();
    let btree = labels(&[("a", "1"), ("b", "2")]);
    assert!(sel.matches(&btree));
    assert!(sel.matches(&&btree));
    let borrowed: BTreeMap<&str, &str> = BTreeMap::from([("a", "1"), ("b", "2")]);
    assert!(sel.matches(&borrowed));
    let hash: HashMap<String, String> = btree.clone().into_iter().collect();
    assert!(sel.matches(&hash));
    let hash_str: HashMap<&str, &str> = HashMap::from([("a", "1"), ("b", "2")]);
    assert!(sel.matches(&hash_str));
    assert!(sel.matches(&[("a", "1"), ("b", "2")]));
    assert!(sel.matches(&[("a", "1"), ("b", "2")][..]));
    assert!(sel.matches(&vec![
        ("a".to_owned(), "1".to_owned()),
        ("b".to_owned(), "2".to_owned())
    ]));
    let boxed: Box<dyn Labels> = Box::new(btree);
    assert!(sel.matches(&boxed));
    assert!(sel.matches(&*boxed));
    assert!(!sel.matches(&[("a", "1")]));
    // First pair wins for duplicate keys in a slice.
    assert!(sel.matches(&[("a", "1"), ("b", "2"), ("a", "3")]));
}

#[test]
fn label_prefixing_for_namespace_selectors() {
    use margay_selector::prefix_labels;
    assert_eq!(
        prefix_labels("env == 'prod'", "pcns.").unwrap(),
        r#"pcns.env == "prod""#
    );
    assert_eq!(
        prefix_labels("has(a) && b in {'x'} || !c starts with 'y'", "pcsa.").unwrap(),
        r#"((has(pcsa.a) && pcsa.b in {"x"}) || !pcsa.c starts with "y")"#
    );
    assert_eq!(prefix_labels("all()", "pcns.").unwrap(), "all()");
    assert!(prefix_labels("a ==", "pcns.").is_err());
}
