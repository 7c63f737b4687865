//! `patch KIND NAME -p PATCH`: calicoctl's patch. Calico's resources carry no list merge keys,
//! so its strategic merge patch is a JSON merge patch (RFC 7386): mappings merge, `null`
//! removes, lists and scalars are replaced.

use std::io::Write;
use std::path::Path;

use clap::Args;
use margay_api::Resource;
use serde_json::Value;

use crate::datastore::{Access, Connector, connect_or_report};
use crate::input::clip_line;
use crate::kinds::{key_of, namespace_or_default, parse_kind_arg};
use crate::{EXIT_INVALID, EXIT_OK, EXIT_USAGE};

#[derive(Debug, Args)]
pub struct PatchArgs {
    /// The kind (singular, plural or short form: ippool, gnp, node, ...).
    #[arg(value_name = "KIND")]
    pub kind: String,
    /// The resource's name.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The patch: a JSON (or YAML) mapping of the fields to change.
    #[arg(short = 'p', long = "patch", value_name = "PATCH", required = true)]
    pub patch: String,
    /// strategic (the default) or merge: both are a JSON merge patch for Calico's resources.
    #[arg(
        short = 't',
        long = "type",
        value_name = "TYPE",
        default_value = "strategic"
    )]
    pub patch_type: String,
    /// Namespace of a namespaced kind (default: `default`).
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

/// The largest patch accepted on the command line.
const MAX_PATCH: usize = 1 << 20;

/// Applies a JSON merge patch (RFC 7386) to `target`.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = Value::Object(serde_json::Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in fields {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn usage(err: &mut dyn Write, message: &str) -> std::io::Result<u8> {
    writeln!(err, "error: {}", clip_line(message))?;
    Ok(EXIT_USAGE)
}

pub(crate) async fn run<C: Connector>(
    a: &PatchArgs,
    config: Option<&Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
) -> std::io::Result<u8> {
    let kind_arg = match parse_kind_arg(&a.kind) {
        Ok(k) => k,
        Err(e) => return usage(err, &e),
    };
    let kind = kind_arg.kind;
    if !matches!(a.patch_type.as_str(), "strategic" | "merge") {
        return usage(
            err,
            &format!(
                "--type {:?} is not supported: use strategic or merge (both are a JSON merge patch for Calico's resources)",
                a.patch_type
            ),
        );
    }
    if a.name.is_empty() {
        return usage(err, "resource name may not be empty");
    }
    let namespace = a.namespace.as_deref().filter(|n| !n.is_empty());
    if !kind.is_namespaced() && namespace.is_some() {
        return usage(err, &format!("{kind} is not namespaced"));
    }
    if a.patch.len() > MAX_PATCH {
        return usage(err, "the patch is larger than 1 MiB");
    }
    let patch = match margay_api::codec::parse_patch_document(&a.patch) {
        Ok(Value::Object(m)) => Value::Object(m),
        Ok(_) => {
            return usage(
                err,
                "the patch must be a mapping of fields, e.g. '{\"spec\":{...}}'",
            );
        }
        Err(e) => return usage(err, &format!("the patch is not JSON or YAML: {e}")),
    };
    let conn = match connect_or_report(connector, config, Access::Existing, err).await? {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let name = kind_arg.stored_name(&a.name);
    if let Some(why) = crate::write_cmd::derived_refusal_for(
        conn.kubernetes,
        crate::write_cmd::Action::Replace,
        kind,
        &name,
    ) {
        writeln!(
            err,
            "hit error: {}",
            why.replacen("cannot replace", "cannot patch", 1)
        )?;
        return Ok(EXIT_INVALID);
    }
    let key = key_of(kind, namespace_or_default(namespace), &name);
    let current = match conn.client.get(&key).await {
        Ok(r) => r,
        Err(e) => {
            writeln!(err, "hit error: resource does not exist: {key}: {e}")?;
            return Ok(EXIT_INVALID);
        }
    };
    let version = current.metadata().resource_version.clone();
    let mut value = match serde_json::to_value(&current) {
        Ok(v) => v,
        Err(e) => {
            writeln!(err, "hit error: cannot encode {key}: {e}")?;
            return Ok(EXIT_INVALID);
        }
    };
    merge_patch(&mut value, &patch);
    let patched = match margay_api::codec::decode_value(value) {
        Ok(r) => r,
        Err(e) => {
            for m in e.messages() {
                writeln!(
                    err,
                    "hit error: creating resource from patched data: {}",
                    clip_line(&m)
                )?;
            }
            return Ok(EXIT_INVALID);
        }
    };
    // What the patch may not change: which resource this is.
    if patched.kind() != current.kind()
        || patched.name() != current.name()
        || patched.metadata().namespace != current.metadata().namespace
    {
        writeln!(
            err,
            "hit error: a patch cannot change a resource's kind, name or namespace (create a new resource instead)"
        )?;
        return Ok(EXIT_INVALID);
    }
    if let Err(errors) = patched.validate() {
        for e in errors.iter() {
            writeln!(err, "hit error: {}", clip_line(&e.to_string()))?;
        }
        return Ok(EXIT_INVALID);
    }
    let mut patched: Resource = patched;
    // A compare-and-swap on the version read: a change made meanwhile is not overwritten.
    patched.metadata_mut().resource_version = version;
    match conn.client.update(patched).await {
        Ok(_) => {
            writeln!(out, "Successfully patched 1 '{kind}' resource")?;
            Ok(EXIT_OK)
        }
        Err(e) => {
            writeln!(err, "hit error: updating existing resource: {e}")?;
            Ok(EXIT_INVALID)
        }
    }
}
