//! `label KIND NAME KEY=VALUE [--overwrite]` and `label KIND NAME KEY --remove`.

use std::io::Write;
use std::path::Path;

use clap::Args;
use margay_api::ResourceKey;
use margay_datastore::{Client, DatastoreError, KvBackend};

use crate::datastore::{Access, Connector, connect_or_report};
use crate::kinds::{key_of, namespace_or_default, parse_kind};
use crate::report::reason;
use crate::{EXIT_INVALID, EXIT_OK, EXIT_USAGE};

/// How often the read-modify-write is retried when another writer gets in between.
const ATTEMPTS: usize = 5;

#[derive(Debug, Args)]
pub struct LabelArgs {
    /// The kind of the resource (singular, plural or short form: node, ippool, gnp, ...).
    #[arg(value_name = "KIND")]
    pub kind: String,
    /// The resource's name.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// KEY=VALUE to set the label, or KEY with --remove.
    #[arg(value_name = "KEY=VALUE|KEY")]
    pub label: String,
    /// Replace the value when the label is already present.
    #[arg(long)]
    pub overwrite: bool,
    /// Remove the label KEY.
    #[arg(long, conflicts_with = "overwrite")]
    pub remove: bool,
    /// Namespace of a namespaced resource (default: `default`).
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

/// What the label command did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Set,
    Updated,
    Removed,
}

pub(crate) async fn run<C: Connector>(
    a: &LabelArgs,
    config: Option<&Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
) -> std::io::Result<u8> {
    let kind = match parse_kind(&a.kind) {
        Ok(k) => k,
        Err(e) => {
            writeln!(err, "error: {e}")?;
            return Ok(EXIT_USAGE);
        }
    };
    let (key_name, value) = if a.remove {
        (a.label.clone(), None)
    } else {
        match a.label.split_once('=') {
            Some((k, v)) if !k.is_empty() => (k.to_string(), Some(v.to_string())),
            _ => {
                writeln!(
                    err,
                    "error: invalid label {} (use KEY=VALUE, or KEY with --remove)",
                    a.label
                )?;
                return Ok(EXIT_USAGE);
            }
        }
    };
    let namespace = a.namespace.as_deref().filter(|n| !n.is_empty());
    if !kind.is_namespaced() && namespace.is_some() {
        writeln!(err, "error: {kind} is not namespaced")?;
        return Ok(EXIT_USAGE);
    }
    if a.name.is_empty() {
        writeln!(err, "error: resource name may not be empty")?;
        return Ok(EXIT_USAGE);
    }
    let conn = match connect_or_report(connector, config, Access::Existing, err).await? {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let key = key_of(kind, namespace_or_default(namespace), &a.name);
    // Labels are written with an update, which the Kubernetes datastore allows for Nodes only
    // among the kinds it derives from Kubernetes objects.
    if let Some(why) = crate::write_cmd::derived_refusal_for(
        conn.kubernetes,
        crate::write_cmd::Action::Replace,
        kind,
        &a.name,
    ) {
        writeln!(
            err,
            "error: {}",
            why.replacen("cannot replace", "cannot label", 1)
        )?;
        return Ok(EXIT_INVALID);
    }
    let (what, name) = (&a.kind, &a.name);
    match relabel(&conn.client, &key, &key_name, value.as_deref(), a.overwrite).await {
        Ok(Change::Removed) => {
            writeln!(
                out,
                "Successfully removed label {key_name} from {what} {name}"
            )?;
            Ok(EXIT_OK)
        }
        Ok(Change::Updated) => {
            writeln!(
                out,
                "Successfully updated label {key_name} on {what} {name}"
            )?;
            Ok(EXIT_OK)
        }
        Ok(Change::Set) => {
            writeln!(out, "Successfully set label {key_name} on {what} {name}")?;
            Ok(EXIT_OK)
        }
        Err(LabelError::Get(e)) => {
            writeln!(err, "failed to get {what} {name}: {}", reason(&e, &key))?;
            Ok(EXIT_INVALID)
        }
        Err(LabelError::Missing) => {
            writeln!(
                err,
                "cannot remove label of {what} {name}, key {key_name} does not exist"
            )?;
            Ok(EXIT_INVALID)
        }
        Err(LabelError::Present) => {
            writeln!(
                err,
                "failed to update label of {what} {name}, key {key_name} is already present. please use '--overwrite' to set a new value"
            )?;
            Ok(EXIT_INVALID)
        }
        Err(LabelError::Update(e)) => {
            writeln!(
                err,
                "failed to update {what} {name}, label not changed: {}",
                reason(&e, &key)
            )?;
            Ok(EXIT_INVALID)
        }
    }
}

#[derive(Debug)]
enum LabelError {
    Get(DatastoreError),
    /// --remove of a label that is not there.
    Missing,
    /// A different value is there and --overwrite was not given.
    Present,
    Update(DatastoreError),
}

/// Reads the resource, changes the one label, and writes it back with a compare-and-swap on
/// the version read; a concurrent change means reading and deciding again.
async fn relabel<B: KvBackend>(
    client: &Client<B>,
    key: &ResourceKey,
    label: &str,
    value: Option<&str>,
    overwrite: bool,
) -> Result<Change, LabelError> {
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let mut r = client.get(key).await.map_err(LabelError::Get)?;
        let labels = &mut r.metadata_mut().labels;
        let change = match value {
            None => {
                if labels.remove(label).is_none() {
                    return Err(LabelError::Missing);
                }
                Change::Removed
            }
            Some(v) => match labels.get(label) {
                // Setting the value a label already has is an update, as calicoctl says.
                Some(old) if old == v || overwrite => {
                    labels.insert(label.to_string(), v.to_string());
                    Change::Updated
                }
                Some(_) => return Err(LabelError::Present),
                None => {
                    labels.insert(label.to_string(), v.to_string());
                    Change::Set
                }
            },
        };
        // `r` carries the version it was read at: the update is a compare-and-swap.
        match client.update(r).await {
            Ok(_) => return Ok(change),
            Err(e @ DatastoreError::Conflict { .. }) => last = Some(e),
            Err(e) => return Err(LabelError::Update(e)),
        }
    }
    Err(LabelError::Update(last.unwrap_or_else(|| {
        DatastoreError::unavailable("the resource keeps changing")
    })))
}
