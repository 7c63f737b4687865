//! The four PATCH flavours the API server accepts: JSON merge patch (RFC 7386), JSON patch
//! (RFC 6902), strategic merge patch (built-in kinds; merge keys from a small table), and the
//! merge server-side apply performs here (no field ownership). Pure.

use serde_json::{Map, Value};

/// Most operations in one JSON patch (the real server's limit).
pub const MAX_JSON_PATCH_OPS: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The patch document itself is malformed (400).
    #[error("{0}")]
    Bad(String),
    /// The patch is well formed but cannot be applied to this object (422).
    #[error("{0}")]
    Unapplicable(String),
}

/// RFC 7386: objects merge, `null` deletes, everything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

// ---------------------------------------------------------------- JSON patch (RFC 6902)

fn parse_pointer(p: &str) -> Result<Vec<String>, PatchError> {
    if p.is_empty() {
        return Ok(vec![]);
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err(PatchError::Bad(format!(
            "JSON pointer must start with '/': {p:?}"
        )));
    };
    Ok(rest
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn array_index(tok: &str, len: usize, allow_end: bool) -> Result<usize, PatchError> {
    if allow_end && tok == "-" {
        return Ok(len);
    }
    if tok.is_empty()
        || (tok.len() > 1 && tok.starts_with('0'))
        || !tok.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(PatchError::Unapplicable(format!(
            "invalid array index {tok:?}"
        )));
    }
    let i: usize = tok
        .parse()
        .map_err(|_| PatchError::Unapplicable(format!("invalid array index {tok:?}")))?;
    let max = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    if i > max || (!allow_end && len == 0) {
        return Err(PatchError::Unapplicable(format!(
            "array index {i} out of bounds"
        )));
    }
    Ok(i)
}

fn parent_mut<'a>(
    doc: &'a mut Value,
    path: &[String],
    whole: &str,
) -> Result<&'a mut Value, PatchError> {
    let mut cur = doc;
    for tok in path {
        cur = match cur {
            Value::Object(m) => m.get_mut(tok).ok_or_else(|| {
                PatchError::Unapplicable(format!("doc is missing path: {whole:?}"))
            })?,
            Value::Array(a) => {
                let i = array_index(tok, a.len(), false)?;
                &mut a[i]
            }
            _ => {
                return Err(PatchError::Unapplicable(format!(
                    "doc is missing path: {whole:?}"
                )));
            }
        };
    }
    Ok(cur)
}

fn get_at(doc: &Value, path: &[String], whole: &str) -> Result<Value, PatchError> {
    let mut cur = doc;
    for tok in path {
        cur = match cur {
            Value::Object(m) => m.get(tok),
            Value::Array(a) => a.get(array_index(tok, a.len(), false)?),
            _ => None,
        }
        .ok_or_else(|| PatchError::Unapplicable(format!("doc is missing path: {whole:?}")))?;
    }
    Ok(cur.clone())
}

fn add_at(doc: &mut Value, path: &[String], v: Value, whole: &str) -> Result<(), PatchError> {
    let Some((last, parent)) = path.split_last() else {
        *doc = v;
        return Ok(());
    };
    match parent_mut(doc, parent, whole)? {
        Value::Object(m) => {
            m.insert(last.clone(), v);
        }
        Value::Array(a) => {
            let i = array_index(last, a.len(), true)?;
            a.insert(i, v);
        }
        _ => {
            return Err(PatchError::Unapplicable(format!(
                "doc is missing path: {whole:?}"
            )));
        }
    }
    Ok(())
}

fn remove_at(doc: &mut Value, path: &[String], whole: &str) -> Result<Value, PatchError> {
    let Some((last, parent)) = path.split_last() else {
        return Err(PatchError::Unapplicable(
            "cannot remove the document root".into(),
        ));
    };
    match parent_mut(doc, parent, whole)? {
        Value::Object(m) => m.remove(last).ok_or_else(|| {
            PatchError::Unapplicable(format!(
                "unable to remove nonexistent key: {last}: missing value"
            ))
        }),
        Value::Array(a) => {
            let i = array_index(last, a.len(), false)?;
            Ok(a.remove(i))
        }
        _ => Err(PatchError::Unapplicable(format!(
            "doc is missing path: {whole:?}"
        ))),
    }
}

/// Applies an RFC 6902 patch document (a JSON array of operations).
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Some(ops) = patch.as_array() else {
        return Err(PatchError::Bad(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch".into(),
        ));
    };
    if ops.len() > MAX_JSON_PATCH_OPS {
        return Err(PatchError::Bad(format!(
            "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPS}, got {}",
            ops.len()
        )));
    }
    for op in ops {
        let kind = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or_else(|| PatchError::Bad("missing 'op' in JSON patch operation".into()))?;
        let path_s = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| PatchError::Bad(format!("missing 'path' in {kind} operation")))?;
        let path = parse_pointer(path_s)?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| PatchError::Bad(format!("missing 'value' in {kind} operation")))
        };
        let from = || -> Result<(String, Vec<String>), PatchError> {
            let f = op
                .get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| PatchError::Bad(format!("missing 'from' in {kind} operation")))?;
            Ok((f.to_string(), parse_pointer(f)?))
        };
        match kind {
            "add" => add_at(doc, &path, value()?, path_s)?,
            "remove" => {
                remove_at(doc, &path, path_s)?;
            }
            "replace" => {
                let v = value()?;
                if path.is_empty() {
                    *doc = v;
                } else {
                    let slot = parent_mut(doc, &path, path_s)?;
                    *slot = v;
                }
            }
            "move" => {
                let (fs, fp) = from()?;
                if path.len() > fp.len() && path[..fp.len()] == fp[..] {
                    return Err(PatchError::Unapplicable(
                        "cannot move a value into one of its children".into(),
                    ));
                }
                let v = remove_at(doc, &fp, &fs)?;
                add_at(doc, &path, v, path_s)?;
            }
            "copy" => {
                let (fs, fp) = from()?;
                let v = get_at(doc, &fp, &fs)?;
                add_at(doc, &path, v, path_s)?;
            }
            "test" => {
                let want = value()?;
                let got = get_at(doc, &path, path_s)?;
                if got != want {
                    return Err(PatchError::Unapplicable(format!(
                        "testing value {path_s} failed: test failed"
                    )));
                }
            }
            other => return Err(PatchError::Bad(format!("Unexpected kind: {other}"))),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- strategic merge patch

/// How a list field of a built-in kind merges (its `patchStrategy`/`patchMergeKey`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// A list of objects merged element by element on this key.
    Key(&'static str),
    /// A list of scalars merged as a set (e.g. `metadata.finalizers`).
    PrimitiveMerge,
    /// Replaced whole.
    Atomic,
}

const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];

/// The merge strategy of the list at `path` (map keys from the root; list positions are not
/// part of it) in an object of `kind`. Follows the Kubernetes type definitions for the fields
/// margay and kubectl touch; everything else is atomic, as unknown lists are there.
pub fn list_strategy(kind: &str, path: &[&str]) -> ListStrategy {
    let last = path.last().copied().unwrap_or("");
    let parent = if path.len() >= 2 {
        path[path.len() - 2]
    } else {
        ""
    };
    let in_container = CONTAINER_LISTS.contains(&parent);
    match last {
        "containers" | "initContainers" | "ephemeralContainers" => ListStrategy::Key("name"),
        "ports" if in_container => ListStrategy::Key("containerPort"),
        "ports" if kind == "Service" && path == ["spec", "ports"] => ListStrategy::Key("port"),
        "env" if in_container => ListStrategy::Key("name"),
        "volumeMounts" if in_container => ListStrategy::Key("mountPath"),
        "volumeDevices" if in_container => ListStrategy::Key("devicePath"),
        "volumes" if parent == "spec" => ListStrategy::Key("name"),
        "imagePullSecrets" => ListStrategy::Key("name"),
        "hostAliases" => ListStrategy::Key("ip"),
        "topologySpreadConstraints" => ListStrategy::Key("topologyKey"),
        "resourceClaims" | "schedulingGates" if parent == "spec" => ListStrategy::Key("name"),
        "conditions" if parent == "status" => ListStrategy::Key("type"),
        "podIPs" | "hostIPs" if parent == "status" => ListStrategy::Key("ip"),
        "addresses" if kind == "Node" && parent == "status" => ListStrategy::Key("type"),
        "ownerReferences" if parent == "metadata" => ListStrategy::Key("uid"),
        "finalizers" if parent == "metadata" => ListStrategy::PrimitiveMerge,
        "podCIDRs" if kind == "Node" && parent == "spec" => ListStrategy::PrimitiveMerge,
        _ => ListStrategy::Atomic,
    }
}

/// Most nesting a strategic merge patch may have (serde_json already stops at 128).
const MAX_DEPTH: usize = 128;

fn directive(m: &Map<String, Value>) -> Result<Option<&str>, PatchError> {
    match m.get("$patch") {
        None => Ok(None),
        Some(Value::String(s)) if matches!(s.as_str(), "replace" | "delete" | "merge") => {
            Ok(Some(s.as_str()))
        }
        Some(other) => Err(PatchError::Bad(format!("Unknown patch type: {other}"))),
    }
}

/// Removes `$`-directives from a patch value that is inserted as is (no original to merge with).
fn strip(v: &Value, depth: usize) -> Value {
    if depth > MAX_DEPTH {
        return v.clone();
    }
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, v)| !k.starts_with('$') && !v.is_null())
                .map(|(k, v)| (k.clone(), strip(v, depth + 1)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|e| {
                    !e.get("$patch")
                        .is_some_and(|p| p == "delete" || p == "replace")
                })
                .map(|e| strip(e, depth + 1))
                .collect(),
        ),
        _ => v.clone(),
    }
}

/// Applies a strategic merge patch to `orig` (an object of built-in `kind`).
pub fn strategic_merge(orig: &mut Value, patch: &Value, kind: &str) -> Result<(), PatchError> {
    let Value::Object(p) = patch else {
        return Err(PatchError::Bad(
            "strategic merge patch must be a JSON object".into(),
        ));
    };
    if !orig.is_object() {
        *orig = Value::Object(Map::new());
    }
    let mut path = Vec::new();
    if let Value::Object(o) = orig {
        if directive(p)? == Some("delete") {
            o.clear();
            return Ok(());
        }
        smp_map(o, p, &mut path, kind, 0)?;
    }
    Ok(())
}

fn smp_map<'p>(
    orig: &mut Map<String, Value>,
    patch: &'p Map<String, Value>,
    path: &mut Vec<&'p str>,
    kind: &str,
    depth: usize,
) -> Result<(), PatchError> {
    if depth > MAX_DEPTH {
        return Err(PatchError::Bad("patch nested too deeply".into()));
    }
    if directive(patch)? == Some("replace") {
        *orig = match strip(&Value::Object(patch.clone()), depth) {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        return Ok(());
    }
    let mut orders: Vec<(&str, &Value)> = Vec::new();
    let mut prim_deletes: Vec<(&str, &Value)> = Vec::new();
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$setElementOrder/") {
            orders.push((field, v));
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            prim_deletes.push((field, v));
            continue;
        }
        if k == "$patch" || k == "$retainKeys" {
            continue;
        }
        if v.is_null() {
            orig.remove(k);
            continue;
        }
        path.push(k.as_str());
        match (orig.get_mut(k), v) {
            (Some(Value::Object(o)), Value::Object(pm)) => {
                if directive(pm)? == Some("delete") {
                    orig.remove(k);
                } else {
                    smp_map(o, pm, path, kind, depth + 1)?;
                }
            }
            (None, Value::Object(pm)) => {
                if directive(pm)? != Some("delete") {
                    let mut fresh = Map::new();
                    smp_map(&mut fresh, pm, path, kind, depth + 1)?;
                    orig.insert(k.clone(), Value::Object(fresh));
                }
            }
            (Some(Value::Array(o)), Value::Array(pa)) => {
                let merged = smp_list(o, pa, path, kind, depth + 1)?;
                *o = merged;
            }
            (None, Value::Array(pa)) => {
                let merged = smp_list(&[], pa, path, kind, depth + 1)?;
                orig.insert(k.clone(), Value::Array(merged));
            }
            (_, v) => {
                orig.insert(k.clone(), strip(v, depth));
            }
        }
        path.pop();
    }
    for (field, vals) in prim_deletes {
        let Some(del) = vals.as_array() else {
            return Err(PatchError::Bad(format!(
                "$deleteFromPrimitiveList/{field} must be a list"
            )));
        };
        if let Some(Value::Array(a)) = orig.get_mut(field) {
            a.retain(|x| !del.contains(x));
        }
    }
    for (field, order) in orders {
        let Some(order) = order.as_array() else {
            return Err(PatchError::Bad(format!(
                "$setElementOrder/{field} must be a list"
            )));
        };
        path.push(field);
        let strategy = list_strategy(kind, path);
        path.pop();
        if let Some(Value::Array(a)) = orig.get_mut(field) {
            reorder(a, order, strategy);
        }
    }
    if let Some(retain) = patch.get("$retainKeys") {
        let Some(keep) = retain.as_array() else {
            return Err(PatchError::Bad("$retainKeys must be a list".into()));
        };
        orig.retain(|k, _| {
            keep.iter().any(|x| x.as_str() == Some(k.as_str())) || patch.contains_key(k)
        });
    }
    Ok(())
}

fn key_of<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.as_object().and_then(|m| m.get(key))
}

fn smp_list<'p>(
    orig: &[Value],
    patch: &'p [Value],
    path: &mut Vec<&'p str>,
    kind: &str,
    depth: usize,
) -> Result<Vec<Value>, PatchError> {
    if depth > MAX_DEPTH {
        return Err(PatchError::Bad("patch nested too deeply".into()));
    }
    // A `{"$patch": "replace"}` element replaces the whole list with the other elements.
    if patch
        .iter()
        .any(|e| e.get("$patch").is_some_and(|p| p == "replace"))
    {
        return Ok(patch
            .iter()
            .filter(|e| e.get("$patch").is_none())
            .map(|e| strip(e, depth))
            .collect());
    }
    match list_strategy(kind, path) {
        ListStrategy::Atomic => Ok(patch.iter().map(|e| strip(e, depth)).collect()),
        ListStrategy::PrimitiveMerge => {
            let mut out = orig.to_vec();
            for e in patch {
                if !out.contains(e) {
                    out.push(e.clone());
                }
            }
            Ok(out)
        }
        ListStrategy::Key(key) => {
            let mut out = orig.to_vec();
            for e in patch {
                let Value::Object(pm) = e else {
                    return Err(PatchError::Bad(format!(
                        "list {} elements must be objects keyed by {key}",
                        path.join(".")
                    )));
                };
                let Some(kv) = pm.get(key) else {
                    return Err(PatchError::Bad(format!(
                        "map: {e} does not contain declared merge key: {key}"
                    )));
                };
                let pos = out.iter().position(|o| key_of(o, key) == Some(kv));
                match directive(pm)? {
                    Some("delete") => {
                        out.retain(|o| key_of(o, key) != Some(kv));
                    }
                    _ => match pos {
                        Some(i) => {
                            if let Value::Object(om) = &mut out[i] {
                                smp_map(om, pm, path, kind, depth + 1)?;
                            }
                        }
                        None => {
                            let mut fresh = Map::new();
                            smp_map(&mut fresh, pm, path, kind, depth + 1)?;
                            out.push(Value::Object(fresh));
                        }
                    },
                }
            }
            Ok(out)
        }
    }
}

/// `$setElementOrder`: the listed elements in the given order, then the others as they were.
fn reorder(list: &mut Vec<Value>, order: &[Value], strategy: ListStrategy) {
    let ident = |v: &Value| -> Option<Value> {
        match strategy {
            ListStrategy::Key(k) => key_of(v, k).cloned(),
            _ => Some(v.clone()),
        }
    };
    let wanted: Vec<Value> = order.iter().filter_map(ident).collect();
    let mut rest = std::mem::take(list);
    for w in &wanted {
        if let Some(i) = rest.iter().position(|e| ident(e).as_ref() == Some(w)) {
            list.push(rest.remove(i));
        }
    }
    list.append(&mut rest);
}

/// Server-side apply without field ownership: built-in kinds merge as a strategic merge patch
/// would, custom resources as a merge patch (explicit `null`s are ignored, not deletions).
pub fn apply_merge(
    orig: &mut Value,
    applied: &Value,
    builtin: bool,
    kind: &str,
) -> Result<(), PatchError> {
    if builtin {
        strategic_merge(orig, applied, kind)
    } else {
        fn no_null_merge(t: &mut Value, p: &Value) {
            match p {
                Value::Object(pm) => {
                    if !t.is_object() {
                        *t = Value::Object(Map::new());
                    }
                    if let Value::Object(tm) = t {
                        for (k, v) in pm {
                            if !v.is_null() {
                                no_null_merge(tm.entry(k.clone()).or_insert(Value::Null), v);
                            }
                        }
                    }
                }
                _ => *t = p.clone(),
            }
        }
        no_null_merge(orig, applied);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386_examples() {
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (mut t, p, want) in cases {
            merge_patch(&mut t, &p);
            assert_eq!(t, want, "patch {p}");
        }
    }

    #[test]
    fn json_patch_ops() {
        let mut d = json!({"foo": ["bar", "baz"], "m": {"a": 1}});
        json_patch(
            &mut d,
            &json!([
                {"op": "add", "path": "/foo/1", "value": "qux"},
                {"op": "add", "path": "/foo/-", "value": "end"},
                {"op": "remove", "path": "/foo/0"},
                {"op": "replace", "path": "/m/a", "value": 2},
                {"op": "add", "path": "/m/b~1c", "value": true},
                {"op": "copy", "from": "/m/a", "path": "/n"},
                {"op": "move", "from": "/n", "path": "/m/moved"},
                {"op": "test", "path": "/m/moved", "value": 2}
            ]),
        )
        .unwrap();
        assert_eq!(
            d,
            json!({"foo": ["qux", "baz", "end"], "m": {"a": 2, "b/c": true, "moved": 2}})
        );
        let mut d = json!({"a": 1});
        assert!(matches!(
            json_patch(&mut d, &json!([{"op": "test", "path": "/a", "value": 2}])),
            Err(PatchError::Unapplicable(_))
        ));
        assert!(matches!(
            json_patch(&mut d, &json!([{"op": "remove", "path": "/zz"}])),
            Err(PatchError::Unapplicable(_))
        ));
        assert!(matches!(
            json_patch(
                &mut d,
                &json!([{"op": "replace", "path": "/zz", "value": 1}])
            ),
            Err(PatchError::Unapplicable(_))
        ));
        assert!(matches!(
            json_patch(&mut d, &json!([{"op": "add", "path": "/x/y", "value": 1}])),
            Err(PatchError::Unapplicable(_))
        ));
        assert!(matches!(
            json_patch(&mut d, &json!([{"op": "bogus", "path": "/a"}])),
            Err(PatchError::Bad(_))
        ));
        assert!(matches!(
            json_patch(&mut d, &json!({"op": "add"})),
            Err(PatchError::Bad(_))
        ));
        assert!(matches!(
            json_patch(&mut d, &json!([{"op": "add", "path": "a", "value": 1}])),
            Err(PatchError::Bad(_))
        ));
        assert_eq!(
            d,
            json!({"a": 1}),
            "failed ops before the first success leave nothing behind here"
        );
    }

    fn pod(containers: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}}, "spec": {"containers": containers}})
    }

    #[test]
    fn smp_keeps_container_ports_and_merges_by_name() {
        let mut live = pod(json!([
            {"name": "c", "image": "busybox:1", "ports": [{"containerPort": 80, "name": "http"}], "args": ["a", "b"]},
            {"name": "c2", "image": "nginx"}
        ]));
        // What kubectl apply sends when only the image of c changed and c2 was removed.
        let patch = json!({
            "metadata": {"labels": {"b": null, "c": "3"}},
            "spec": {
                "$setElementOrder/containers": [{"name": "c"}],
                "containers": [{"image": "busybox:2", "name": "c", "args": ["z"]}, {"$patch": "delete", "name": "c2"}]
            }
        });
        strategic_merge(&mut live, &patch, "Pod").unwrap();
        assert_eq!(
            live["spec"]["containers"],
            json!([{"name": "c", "image": "busybox:2", "ports": [{"containerPort": 80, "name": "http"}], "args": ["z"]}])
        );
        assert_eq!(live["metadata"]["labels"], json!({"a": "1", "c": "3"}));
    }

    #[test]
    fn smp_ports_env_and_order() {
        let mut live = pod(
            json!([{"name": "c", "ports": [{"containerPort": 80}, {"containerPort": 443}], "env": [{"name": "A", "value": "1"}]}]),
        );
        let patch = json!({"spec": {
            "containers": [{"name": "c", "ports": [{"containerPort": 443, "protocol": "TCP"}, {"containerPort": 8080}], "env": [{"name": "B", "value": "2"}],
                            "$setElementOrder/ports": [{"containerPort": 8080}, {"containerPort": 443}, {"containerPort": 80}]}],
            "$setElementOrder/containers": [{"name": "c"}, {"name": "new"}],
        }});
        let mut patch = patch;
        patch["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "new", "image": "x", "$patch": "merge"}));
        strategic_merge(&mut live, &patch, "Pod").unwrap();
        let c = &live["spec"]["containers"];
        assert_eq!(
            c[0]["ports"],
            json!([{"containerPort": 8080}, {"containerPort": 443, "protocol": "TCP"}, {"containerPort": 80}])
        );
        assert_eq!(
            c[0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}])
        );
        assert_eq!(c[1], json!({"name": "new", "image": "x"}));
    }

    #[test]
    fn smp_directives() {
        // $patch: replace on a map.
        let mut o = json!({"spec": {"selector": {"a": "1", "b": "2"}}});
        strategic_merge(
            &mut o,
            &json!({"spec": {"selector": {"$patch": "replace", "c": "3"}}}),
            "Service",
        )
        .unwrap();
        assert_eq!(o, json!({"spec": {"selector": {"c": "3"}}}));
        // $patch: delete on a map.
        strategic_merge(
            &mut o,
            &json!({"spec": {"selector": {"$patch": "delete"}}}),
            "Service",
        )
        .unwrap();
        assert_eq!(o, json!({"spec": {}}));
        // $patch: replace inside a keyed list.
        let mut p = pod(json!([{"name": "a"}, {"name": "b"}]));
        strategic_merge(
            &mut p,
            &json!({"spec": {"containers": [{"name": "z"}, {"$patch": "replace"}]}}),
            "Pod",
        )
        .unwrap();
        assert_eq!(p["spec"]["containers"], json!([{"name": "z"}]));
        // finalizers merge as a set; $deleteFromPrimitiveList removes.
        let mut o = json!({"metadata": {"finalizers": ["a", "b"]}});
        strategic_merge(
            &mut o,
            &json!({"metadata": {"finalizers": ["b", "c"]}}),
            "ConfigMap",
        )
        .unwrap();
        assert_eq!(o["metadata"]["finalizers"], json!(["a", "b", "c"]));
        strategic_merge(
            &mut o,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
            "ConfigMap",
        )
        .unwrap();
        assert_eq!(o["metadata"]["finalizers"], json!(["b", "c"]));
        // Atomic lists are replaced.
        let mut np = json!({"spec": {"policyTypes": ["Ingress"], "ingress": [{"from": [1]}, {"from": [2]}]}});
        strategic_merge(
            &mut np,
            &json!({"spec": {"ingress": [{"from": [3]}]}}),
            "NetworkPolicy",
        )
        .unwrap();
        assert_eq!(np["spec"]["ingress"], json!([{"from": [3]}]));
        // $retainKeys drops keys not listed.
        let mut o = json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}});
        strategic_merge(
            &mut o,
            &json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
            "Deployment",
        )
        .unwrap();
        assert_eq!(o, json!({"spec": {"strategy": {"type": "Recreate"}}}));
        // Unknown directive values are rejected.
        assert!(strategic_merge(&mut o, &json!({"spec": {"$patch": "explode"}}), "Pod").is_err());
        // A keyed list element without its key is rejected.
        assert!(
            strategic_merge(
                &mut p,
                &json!({"spec": {"containers": [{"image": "x"}]}}),
                "Pod"
            )
            .is_err()
        );
    }

    #[test]
    fn smp_conditions_by_type_and_service_ports_by_port() {
        let mut n = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "NetworkUnavailable", "status": "True"}]}});
        strategic_merge(
            &mut n,
            &json!({"status": {"conditions": [{"type": "NetworkUnavailable", "status": "False", "reason": "CalicoIsUp"}]}}),
            "Node",
        )
        .unwrap();
        assert_eq!(
            n["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "NetworkUnavailable", "status": "False", "reason": "CalicoIsUp"}])
        );
        let mut s = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}]}});
        strategic_merge(
            &mut s,
            &json!({"spec": {"ports": [{"port": 443}]}}),
            "Service",
        )
        .unwrap();
        assert_eq!(
            s["spec"]["ports"],
            json!([{"port": 80, "targetPort": 8080}, {"port": 443}])
        );
    }

    #[test]
    fn apply_merge_for_custom_resources_ignores_nulls() {
        let mut o = json!({"spec": {"cidr": "10.0.0.0/16", "natOutgoing": true}});
        apply_merge(
            &mut o,
            &json!({"spec": {"cidr": "10.1.0.0/16", "natOutgoing": null}}),
            false,
            "IPPool",
        )
        .unwrap();
        assert_eq!(
            o,
            json!({"spec": {"cidr": "10.1.0.0/16", "natOutgoing": true}})
        );
    }
}
