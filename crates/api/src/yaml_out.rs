//! YAML output laid out as calicoctl's (Go's `sigs.k8s.io/yaml`, i.e. go-yaml v2 on the JSON
//! form): keys sorted, two-space indentation, a list under a key not indented further, empty
//! mappings and lists as `{}` and `[]`, and a string quoted only when it would otherwise read
//! as something else — double quotes when it would read as another type (`"1"`, `"true"`,
//! `""`, a timestamp), single quotes when plain YAML cannot hold it (`': x'`). Tools that
//! compare `get -o yaml` output with calicoctl's see the same bytes.

use std::fmt::Write;

use serde_json::Value;

/// `value` as a YAML document (no `---`), ending with a newline.
pub fn to_yaml_string(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(m) if !m.is_empty() => emit_map(value, 0, &mut out),
        Value::Array(a) if !a.is_empty() => emit_seq(value, 0, &mut out),
        other => {
            out.push_str(&inline(other));
            out.push('\n');
        }
    }
    out
}

/// A value that fits on the line of its key or dash: scalars and empty collections.
fn inline(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => scalar(s),
        Value::Array(_) => "[]".into(),
        Value::Object(_) => "{}".into(),
    }
}

fn is_block(v: &Value) -> bool {
    match v {
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => false,
    }
}

fn emit_map(v: &Value, indent: usize, out: &mut String) {
    let Value::Object(m) = v else { return };
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort();
    for k in keys {
        let child = &m[k];
        let _ = write!(out, "{:indent$}{}:", "", scalar(k));
        match child {
            Value::Object(_) if is_block(child) => {
                out.push('\n');
                emit_map(child, indent + 2, out);
            }
            // go-yaml does not indent a list under its key.
            Value::Array(_) if is_block(child) => {
                out.push('\n');
                emit_seq(child, indent, out);
            }
            other => {
                out.push(' ');
                out.push_str(&inline(other));
                out.push('\n');
            }
        }
    }
}

fn emit_seq(v: &Value, indent: usize, out: &mut String) {
    let Value::Array(items) = v else { return };
    for item in items {
        if is_block(item) {
            // The item's first line goes after the dash; the rest keeps its indentation.
            let mut nested = String::new();
            match item {
                Value::Object(_) => emit_map(item, indent + 2, &mut nested),
                _ => emit_seq(item, indent + 2, &mut nested),
            }
            let _ = write!(out, "{:indent$}- ", "");
            out.push_str(nested.get(indent + 2..).unwrap_or_default());
        } else {
            let _ = writeln!(out, "{:indent$}- {}", "", inline(item));
        }
    }
}

/// A string as go-yaml v2 writes it.
pub(crate) fn scalar(s: &str) -> String {
    if s.chars().any(|c| c.is_control() && c != '\t') || s.contains('\t') {
        return double_quoted(s);
    }
    if resolves_to_non_string(s) {
        return double_quoted(s);
    }
    if plain_allowed(s) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "''"))
}

fn double_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Whether a plain scalar would read back as something other than this string (YAML 1.1 as
/// go-yaml v2 resolves it: null, booleans, numbers, timestamps, the merge key).
fn resolves_to_non_string(s: &str) -> bool {
    const SPECIAL: [&str; 32] = [
        "", "~", "null", "Null", "NULL", "y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "n", "N",
        "no", "No", "NO", "off", "Off", "OFF", "true", "True", "TRUE", "false", "False", "FALSE",
        ".inf", ".Inf", ".INF", ".nan", "<<",
    ];
    if SPECIAL.contains(&s) || matches!(s, ".NaN" | ".NAN") {
        return true;
    }
    let first = s.chars().next().unwrap_or(' ');
    if !(first.is_ascii_digit() || matches!(first, '+' | '-' | '.')) {
        return false;
    }
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    if matches!(unsigned, ".inf" | ".Inf" | ".INF") {
        return true;
    }
    let digits: String = s.chars().filter(|c| *c != '_').collect();
    looks_numeric(&digits) || looks_like_timestamp(s)
}

/// Go's ParseInt (base 0) or ParseFloat would accept it.
fn looks_numeric(s: &str) -> bool {
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    let radix = |prefix: [&str; 2], radix: u32| {
        prefix
            .iter()
            .find_map(|p| unsigned.strip_prefix(p))
            .is_some_and(|d| !d.is_empty() && u128::from_str_radix(d, radix).is_ok())
    };
    if radix(["0x", "0X"], 16) || radix(["0o", "0O"], 8) || radix(["0b", "0B"], 2) {
        return true;
    }
    if !unsigned.is_empty() && unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    // Decimal floats only: Rust also takes "inf"/"nan", which go-yaml never tries here.
    unsigned.bytes().any(|b| b.is_ascii_digit())
        && unsigned
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
        && s.parse::<f64>().is_ok()
}

/// `2006-1-2`, optionally followed by a time (`T` or spaces) — YAML 1.1 timestamps.
fn looks_like_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |from: usize, min: usize, max: usize| -> Option<usize> {
        let n = b[from.min(b.len())..]
            .iter()
            .take(max)
            .take_while(|c| c.is_ascii_digit())
            .count();
        (n >= min).then_some(from + n)
    };
    let Some(i) = digits(0, 4, 4) else {
        return false;
    };
    if b.get(i) != Some(&b'-') {
        return false;
    }
    let Some(i) = digits(i + 1, 1, 2) else {
        return false;
    };
    if b.get(i) != Some(&b'-') {
        return false;
    }
    let Some(i) = digits(i + 1, 1, 2) else {
        return false;
    };
    match b.get(i) {
        None => true,
        Some(b'T' | b't' | b' ' | b'\t') => {
            let rest = s[i + 1..].trim_start();
            let rb = rest.as_bytes();
            let n = rb.iter().take_while(|c| c.is_ascii_digit()).count();
            (1..=2).contains(&n) && rb.get(n) == Some(&b':')
        }
        Some(_) => false,
    }
}

/// libyaml's rule for a plain scalar in block context.
fn plain_allowed(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if s.starts_with(' ') || s.ends_with(' ') || s.starts_with("---") || s.starts_with("...") {
        return false;
    }
    let second = s.chars().nth(1);
    match first {
        ',' | '[' | ']' | '{' | '}' | '#' | '&' | '*' | '!' | '|' | '>' | '\'' | '"' | '%'
        | '@' | '`' => return false,
        // An indicator only when a space (or nothing) follows.
        '-' | '?' | ':' if second.is_none_or(|c| c == ' ') => return false,
        _ => {}
    }
    !(s.contains(": ") || s.contains(" #") || s.ends_with(':'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_quoted_as_go_yaml_quotes_them() {
        for (s, want) in [
            ("web", "web"),
            ("foo == 'bar'", "foo == 'bar'"),
            ("10.0.0.0/16", "10.0.0.0/16"),
            ("1", "\"1\""),
            ("1.5", "\"1.5\""),
            ("0x1F", "\"0x1F\""),
            ("1_000", "\"1_000\""),
            ("1e3", "\"1e3\""),
            ("true", "\"true\""),
            ("Yes", "\"Yes\""),
            ("off", "\"off\""),
            ("", "\"\""),
            ("~", "\"~\""),
            ("null", "\"null\""),
            ("2024-01-02T03:04:05Z", "\"2024-01-02T03:04:05Z\""),
            ("2024-01-02", "\"2024-01-02\""),
            ("1.2.3", "1.2.3"),
            ("10.0.0.1", "10.0.0.1"),
            ("v3.32.1", "v3.32.1"),
            ("a: b", "'a: b'"),
            ("- x", "'- x'"),
            ("-x", "-x"),
            (":80", ":80"),
            ("*", "'*'"),
            ("it's", "it's"),
            ("'q'", "'''q'''"),
            ("#x", "'#x'"),
            ("a #b", "'a #b'"),
            (" lead", "' lead'"),
            ("line\nbreak", "\"line\\nbreak\""),
            ("tab\there", "\"tab\\there\""),
            ("all()", "all()"),
            ("has(app)", "has(app)"),
            ("!has(a)", "'!has(a)'"),
        ] {
            assert_eq!(scalar(s), want, "{s:?}");
        }
    }

    proptest::proptest! {
        /// Whatever the string, what is written reads back as the same string (as a value
        /// and as a key), whether plain, single- or double-quoted.
        #[test]
        fn any_string_reads_back_unchanged(s in "[ -~\\t\\n\u{e9}\u{2603}]{0,12}") {
            let v = json!({"k": s.clone(), "list": [s.clone()], s.clone(): 1});
            let text = to_yaml_string(&v);
            let back = crate::codec::parse_patch_document(&text).map_err(|e| {
                proptest::test_runner::TestCaseError::fail(format!("{e}\n{text}"))
            })?;
            proptest::prop_assert_eq!(back, v, "{}", text);
        }
    }

    #[test]
    fn layout_is_calicoctls() {
        let v = json!({
            "kind": "IPPoolList",
            "apiVersion": "projectcalico.org/v3",
            "metadata": {"resourceVersion": "12"},
            "items": [
                {"metadata": {"name": "p", "labels": {}}, "spec": {"cidr": "10.0.0.0/16", "blockSize": 26, "natOutgoing": true}},
            ],
            "empty": [],
            "nested": [[1, 2], []],
        });
        let want = "apiVersion: projectcalico.org/v3\nempty: []\nitems:\n- metadata:\n    labels: {}\n    name: p\n  spec:\n    blockSize: 26\n    cidr: 10.0.0.0/16\n    natOutgoing: true\nkind: IPPoolList\nmetadata:\n  resourceVersion: \"12\"\nnested:\n- - 1\n  - 2\n- []\n";
        assert_eq!(to_yaml_string(&v), want);
    }
}
