//! Kubernetes label and field selectors (the query-string forms), parsed into values and
//! matched against JSON objects. Pure.

use serde_json::Value;

/// Longest selector string accepted (the real server is bounded by its URL limit).
pub const MAX_SELECTOR_LEN: usize = 16 * 1024;
/// Most requirements (terms) in one selector.
pub const MAX_REQUIREMENTS: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelOp {
    Eq,
    NotEq,
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: LabelOp,
    pub values: Vec<String>,
}

/// A parsed label selector: every requirement must hold (an empty one matches everything).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub reqs: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Eq,
    DoubleEq,
    NotEq,
    Bang,
    Open,
    Close,
    Comma,
}

fn lex(s: &str) -> Result<Vec<Tok>, SelectorError> {
    let mut out = Vec::new();
    let b: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            ' ' | '\t' | '\n' | '\r' => i += 1,
            ',' => {
                out.push(Tok::Comma);
                i += 1
            }
            '(' => {
                out.push(Tok::Open);
                i += 1
            }
            ')' => {
                out.push(Tok::Close);
                i += 1
            }
            '=' => {
                if b.get(i + 1) == Some(&'=') {
                    out.push(Tok::DoubleEq);
                    i += 2
                } else {
                    out.push(Tok::Eq);
                    i += 1
                }
            }
            '!' => {
                if b.get(i + 1) == Some(&'=') {
                    out.push(Tok::NotEq);
                    i += 2
                } else {
                    out.push(Tok::Bang);
                    i += 1
                }
            }
            _ => {
                let start = i;
                while i < b.len()
                    && !matches!(b[i], ' ' | '\t' | '\n' | '\r' | ',' | '(' | ')' | '=' | '!')
                {
                    i += 1;
                }
                out.push(Tok::Ident(b[start..i].iter().collect()));
            }
        }
        if out.len() > MAX_REQUIREMENTS * 64 {
            return Err(SelectorError("label selector too long".into()));
        }
    }
    Ok(out)
}

fn valid_name_part(s: &str, max: usize) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= max
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn valid_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// A qualified label key: `[prefix/]name`.
pub fn valid_label_key(k: &str) -> bool {
    match k.split_once('/') {
        Some((p, n)) => valid_dns_subdomain(p) && valid_name_part(n, 63),
        None => valid_name_part(k, 63),
    }
}

/// A label value: empty, or up to 63 name characters.
pub fn valid_label_value(v: &str) -> bool {
    v.is_empty() || valid_name_part(v, 63)
}

fn check_key(k: &str) -> Result<(), SelectorError> {
    if valid_label_key(k) {
        Ok(())
    } else {
        Err(SelectorError(format!(
            "unable to parse requirement: invalid label key \"{k}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )))
    }
}

fn check_value(v: &str) -> Result<(), SelectorError> {
    if valid_label_value(v) {
        Ok(())
    } else {
        Err(SelectorError(format!(
            "unable to parse requirement: invalid label value: \"{v}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )))
    }
}

impl LabelSelector {
    /// Parses the `labelSelector` query form (`a=b,c!=d,e in (f,g),!h,i`).
    pub fn parse(s: &str) -> Result<LabelSelector, SelectorError> {
        if s.len() > MAX_SELECTOR_LEN {
            return Err(SelectorError("label selector too long".into()));
        }
        let toks = lex(s)?;
        let mut reqs = Vec::new();
        let mut i = 0;
        while i < toks.len() {
            if reqs.len() >= MAX_REQUIREMENTS {
                return Err(SelectorError(
                    "too many requirements in label selector".into(),
                ));
            }
            let req = match &toks[i] {
                Tok::Bang => {
                    let Some(Tok::Ident(k)) = toks.get(i + 1) else {
                        return Err(SelectorError("found '!', expected: identifier".into()));
                    };
                    check_key(k)?;
                    i += 2;
                    Requirement {
                        key: k.clone(),
                        op: LabelOp::DoesNotExist,
                        values: vec![],
                    }
                }
                Tok::Ident(k) => {
                    check_key(k)?;
                    i += 1;
                    match toks.get(i) {
                        None | Some(Tok::Comma) => Requirement {
                            key: k.clone(),
                            op: LabelOp::Exists,
                            values: vec![],
                        },
                        Some(t @ (Tok::Eq | Tok::DoubleEq | Tok::NotEq)) => {
                            let op = if *t == Tok::NotEq {
                                LabelOp::NotEq
                            } else {
                                LabelOp::Eq
                            };
                            i += 1;
                            let v = match toks.get(i) {
                                Some(Tok::Ident(v)) => {
                                    i += 1;
                                    v.clone()
                                }
                                // `a=` selects the empty value.
                                None | Some(Tok::Comma) => String::new(),
                                Some(t) => {
                                    return Err(SelectorError(format!(
                                        "found '{t:?}', expected: identifier"
                                    )));
                                }
                            };
                            check_value(&v)?;
                            Requirement {
                                key: k.clone(),
                                op,
                                values: vec![v],
                            }
                        }
                        Some(Tok::Ident(w)) if w == "in" || w == "notin" => {
                            let op = if w == "in" {
                                LabelOp::In
                            } else {
                                LabelOp::NotIn
                            };
                            i += 1;
                            if toks.get(i) != Some(&Tok::Open) {
                                return Err(SelectorError(format!(
                                    "found '{:?}', expected: '('",
                                    toks.get(i)
                                )));
                            }
                            i += 1;
                            let mut values = Vec::new();
                            loop {
                                match toks.get(i) {
                                    Some(Tok::Ident(v)) => {
                                        check_value(v)?;
                                        values.push(v.clone());
                                        i += 1;
                                    }
                                    Some(Tok::Comma) | Some(Tok::Close) => {
                                        values.push(String::new())
                                    }
                                    _ => {
                                        return Err(SelectorError(
                                            "unterminated set in label selector".into(),
                                        ));
                                    }
                                }
                                match toks.get(i) {
                                    Some(Tok::Comma) => i += 1,
                                    Some(Tok::Close) => {
                                        i += 1;
                                        break;
                                    }
                                    _ => {
                                        return Err(SelectorError(
                                            "found end of input, expected: ',' or ')'".into(),
                                        ));
                                    }
                                }
                                if values.len() > MAX_REQUIREMENTS {
                                    return Err(SelectorError(
                                        "too many values in label selector set".into(),
                                    ));
                                }
                            }
                            Requirement {
                                key: k.clone(),
                                op,
                                values,
                            }
                        }
                        Some(t) => {
                            return Err(SelectorError(format!(
                                "unable to parse requirement: found '{t:?}', expected: in, notin, =, ==, !=, gt, lt"
                            )));
                        }
                    }
                }
                t => {
                    return Err(SelectorError(format!(
                        "found '{t:?}', expected: !, identifier, or 'end of string'"
                    )));
                }
            };
            reqs.push(req);
            match toks.get(i) {
                None => break,
                Some(Tok::Comma) => {
                    i += 1;
                    if i == toks.len() {
                        return Err(SelectorError(
                            "found end of string, expected: !, identifier".into(),
                        ));
                    }
                }
                Some(t) => {
                    return Err(SelectorError(format!(
                        "found '{t:?}', expected: ',' or 'end of string'"
                    )));
                }
            }
        }
        Ok(LabelSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        self.reqs.iter().all(|r| {
            let v = labels.and_then(|l| l.get(&r.key)).and_then(Value::as_str);
            match r.op {
                LabelOp::Eq => v == Some(r.values[0].as_str()),
                LabelOp::NotEq => v != Some(r.values[0].as_str()),
                LabelOp::In => v.is_some_and(|v| r.values.iter().any(|x| x == v)),
                LabelOp::NotIn => v.is_none_or(|v| !r.values.iter().any(|x| x == v)),
                LabelOp::Exists => v.is_some(),
                LabelOp::DoesNotExist => v.is_none(),
            }
        })
    }
}

/// One `field=value` / `field!=value` term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldTerm {
    pub field: String,
    pub equal: bool,
    pub value: String,
}

/// A parsed field selector; every term must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    pub terms: Vec<FieldTerm>,
}

/// Splits on unescaped `sep`, keeping escapes for the second pass.
fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut esc = false;
    for c in s.chars() {
        if esc {
            if let Some(last) = out.last_mut() {
                last.push('\\');
                last.push(c);
            }
            esc = false;
        } else if c == '\\' {
            esc = true;
        } else if c == sep {
            out.push(String::new());
        } else if let Some(last) = out.last_mut() {
            last.push(c);
        }
    }
    out
}

fn unescape(s: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(s.len());
    let mut esc = false;
    for c in s.chars() {
        if esc {
            if !matches!(c, '\\' | ',' | '=') {
                return Err(SelectorError(format!(
                    "invalid field selector: invalid escape sequence: \\{c}"
                )));
            }
            out.push(c);
            esc = false;
        } else if c == '\\' {
            esc = true;
        } else {
            out.push(c);
        }
    }
    if esc {
        return Err(SelectorError(
            "invalid field selector: unterminated escape".into(),
        ));
    }
    Ok(out)
}

impl FieldSelector {
    /// Parses `a=b,c!=d` (values may escape `\`, `,` and `=` with a backslash).
    pub fn parse(s: &str) -> Result<FieldSelector, SelectorError> {
        if s.len() > MAX_SELECTOR_LEN {
            return Err(SelectorError("field selector too long".into()));
        }
        let mut terms = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector { terms });
        }
        for part in split_unescaped(s, ',') {
            if terms.len() >= MAX_REQUIREMENTS {
                return Err(SelectorError("too many terms in field selector".into()));
            }
            // The operator is the first unescaped `!=`, `==` or `=`.
            let bytes = part.as_bytes();
            let mut j = 0;
            let mut found = None;
            while j < bytes.len() {
                match bytes[j] {
                    b'\\' => j += 2,
                    b'!' if bytes.get(j + 1) == Some(&b'=') => {
                        found = Some((j, 2, false));
                        break;
                    }
                    b'=' => {
                        let len = if bytes.get(j + 1) == Some(&b'=') {
                            2
                        } else {
                            1
                        };
                        found = Some((j, len, true));
                        break;
                    }
                    _ => j += 1,
                }
            }
            let Some((at, len, equal)) = found else {
                return Err(SelectorError(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let field = part[..at].trim().to_string();
            let value = unescape(&part[at + len..])?;
            if field.is_empty() {
                return Err(SelectorError(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            }
            terms.push(FieldTerm {
                field,
                equal,
                value,
            });
        }
        Ok(FieldSelector { terms })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Rejects fields the resource does not index, with the real server's message.
    pub fn check_supported(&self, supported: &dyn Fn(&str) -> bool) -> Result<(), SelectorError> {
        for t in &self.terms {
            if !supported(&t.field) {
                return Err(SelectorError(format!(
                    "field label not supported: {}",
                    t.field
                )));
            }
        }
        Ok(())
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.terms
            .iter()
            .all(|t| (field_value(obj, &t.field) == t.value) == t.equal)
    }
}

/// The string a field selector compares: strings as they are, booleans and numbers printed,
/// a missing field as "" (booleans as "false", as the real server's field sets do).
pub fn field_value(obj: &Value, field: &str) -> String {
    let mut cur = obj;
    for part in field.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => {
                return if matches!(field, "spec.hostNetwork" | "spec.unschedulable") {
                    "false".into()
                } else {
                    String::new()
                };
            }
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn label_operators() {
        let o = obj(json!({"app": "web", "tier": "fe", "example.com/x": "1"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(m(""));
        assert!(m("app=web"));
        assert!(m("app==web"));
        assert!(!m("app=db"));
        assert!(m("app!=db"));
        assert!(m("missing!=x"), "!= matches a missing key");
        assert!(m("app in (web, db)"));
        assert!(!m("app in (db)"));
        assert!(m("app notin (db)"));
        assert!(m("missing notin (db)"), "notin matches a missing key");
        assert!(!m("app notin (web)"));
        assert!(m("tier"));
        assert!(!m("missing"));
        assert!(m("!missing"));
        assert!(!m("!tier"));
        assert!(m("example.com/x=1,app=web, tier in (fe)"));
        assert!(!m("example.com/x=1,app=db"));
    }

    #[test]
    fn label_empty_value() {
        let o = obj(json!({"a": ""}));
        assert!(LabelSelector::parse("a=").unwrap().matches(&o));
        assert!(LabelSelector::parse("a in (,x)").unwrap().matches(&o));
    }

    #[test]
    fn label_errors() {
        for bad in [
            "=x",
            "app in web",
            "app in (a",
            "a,",
            "!",
            "a b",
            "-a=b",
            "a=b c",
            "app=-x-",
        ] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad} should fail");
        }
        let long = "a,".repeat(MAX_REQUIREMENTS + 1) + "a";
        assert!(LabelSelector::parse(&long).is_err());
    }

    #[test]
    fn field_selectors() {
        let o = obj(json!({}));
        let m = |s: &str| FieldSelector::parse(s).unwrap().matches(&o);
        assert!(m("metadata.name=a"));
        assert!(m("metadata.name==a"));
        assert!(!m("metadata.name!=a"));
        assert!(m("metadata.namespace=ns,spec.nodeName=n1"));
        assert!(!m("spec.nodeName=n2"));
        assert!(m("spec.nodeName!=n2"));
        assert!(m("status.phase="), "missing fields compare as empty");
        assert!(m("spec.hostNetwork=false"));
        let f = FieldSelector::parse("metadata.name=a\\,b").unwrap();
        assert_eq!(f.terms[0].value, "a,b");
        assert!(FieldSelector::parse("nonsense").is_err());
        let f = FieldSelector::parse("spec.foo=1").unwrap();
        let err = f
            .check_supported(&|f| f.starts_with("metadata."))
            .unwrap_err();
        assert_eq!(err.0, "field label not supported: spec.foo");
    }
}
