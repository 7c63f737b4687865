//! `get KIND [NAME...]`: resources as a table, YAML, JSON or names.

use std::io::Write;
use std::path::Path;

use clap::Args;
use margay_api::codec::{to_json, to_yaml};
use margay_api::resource::API_VERSION;
use margay_api::{Kind, Resource};
use margay_datastore::{Client, DatastoreError, KvBackend};
use margay_selector::Selector;
use serde_json::{Value, json};

use crate::datastore::{Access, Connector, connect_or_report};
use crate::kinds::{key_of, namespace_or_default, parse_kind_arg};
use crate::report::reason;
use crate::table::{TableContext, check_headings, default_headings, render};
use crate::{EXIT_INVALID, EXIT_OK, EXIT_USAGE};

#[derive(Debug, Args)]
pub struct GetArgs {
    /// The kind to show (singular, plural or short form: ippools, gnp, networkpolicy, wep, ...).
    /// `networkpolicies.networking.k8s.io` (or `netpol`) shows the policies converted from
    /// Kubernetes NetworkPolicies, and takes their Kubernetes names.
    #[arg(value_name = "KIND", required_unless_present = "filename")]
    pub kind: Option<String>,
    /// Show only these resources (default: all of the kind).
    #[arg(value_name = "NAME")]
    pub names: Vec<String>,
    /// Namespace of namespaced kinds (default: `default`); adds a NAMESPACE column.
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// List namespaced kinds across all namespaces (with a NAMESPACE column).
    #[arg(short = 'A', long, short_alias = 'a', conflicts_with = "namespace")]
    pub all_namespaces: bool,
    /// Output format: ps (a table, the default), wide (a table with more columns), yaml, json,
    /// name (`kind.projectcalico.org/NAME` per line) or custom-columns=COL1,COL2,...
    #[arg(short = 'o', long, value_name = "FORMAT", default_value = "ps")]
    pub output: String,
    /// Show only resources whose labels match this selector (Calico syntax, e.g.
    /// `app == "web" && has(tier)`).
    #[arg(short = 'l', long = "selector", value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// Leave out cluster-specific metadata (uid, resourceVersion, creationTimestamp,
    /// namespace) of named resources, to copy them elsewhere.
    #[arg(long)]
    pub export: bool,
    /// Show the resources a file names (calicoctl's `get -f`): each document with a name is
    /// read by that name, one without is a listing of its kind. `-` reads standard input; a
    /// directory's .yaml, .yml and .json files are read (with -R, its subdirectories' too).
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "FILE",
        conflicts_with_all = ["kind", "names", "all_namespaces", "selector"]
    )]
    pub filename: Vec<std::path::PathBuf>,
    /// With -f DIR: read subdirectories too.
    #[arg(short = 'R', long, requires = "filename")]
    pub recursive: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Output {
    Table { wide: bool },
    Columns(Vec<String>),
    Yaml,
    Json,
    Name,
}

fn parse_output(s: &str) -> Result<Output, String> {
    match s {
        "ps" => Ok(Output::Table { wide: false }),
        "wide" => Ok(Output::Table { wide: true }),
        "yaml" | "yml" => Ok(Output::Yaml),
        "json" => Ok(Output::Json),
        "name" => Ok(Output::Name),
        _ => match s.split_once('=') {
            Some(("custom-columns", cols)) => {
                let cols: Vec<String> = cols
                    .split(',')
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(str::to_ascii_uppercase)
                    .collect();
                if cols.is_empty() {
                    Err("need to specify at least one column".to_string())
                } else {
                    Ok(Output::Columns(cols))
                }
            }
            Some(("go-template" | "go-template-file", _)) => Err(format!(
                "output format '{s}' is not supported by margay (use yaml or json with a tool such as jq)"
            )),
            _ => Err(format!(
                "unrecognized output format '{s}' (use ps, wide, yaml, json, name or custom-columns=...)"
            )),
        },
    }
}

pub(crate) async fn run<C: Connector>(
    a: &GetArgs,
    config: Option<&Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
) -> std::io::Result<u8> {
    let usage = |err: &mut dyn Write, m: &str| -> std::io::Result<u8> {
        writeln!(err, "error: {m}")?;
        Ok(EXIT_USAGE)
    };
    let Some(kind_name) = a.kind.as_deref() else {
        return Box::pin(run_files(a, config, out, err, connector)).await;
    };
    let kind_arg = match parse_kind_arg(kind_name) {
        Ok(k) => k,
        Err(e) => return usage(err, &e),
    };
    let kind = kind_arg.kind;
    let output = match parse_output(&a.output) {
        Ok(o) => o,
        Err(e) => return usage(err, &e),
    };
    if let Output::Columns(cols) = &output
        && let Err(e) = check_headings(kind, cols)
    {
        return usage(err, &e);
    }
    let selector = match a.selector.as_deref().map(Selector::parse).transpose() {
        Ok(s) => s,
        Err(e) => return usage(err, &format!("invalid selector: {e}")),
    };
    let namespace = a.namespace.as_deref().filter(|n| !n.is_empty());
    if !kind.is_namespaced() && namespace.is_some() {
        return usage(err, &format!("{kind} is not namespaced"));
    }
    let all_namespaces = a.all_namespaces && kind.is_namespaced();
    if all_namespaces && !a.names.is_empty() {
        return usage(
            err,
            "cannot use --all-namespaces to get resources by name (use -n NAMESPACE)",
        );
    }
    if a.names.iter().any(String::is_empty) {
        return usage(err, "resource name may not be empty");
    }
    let conn = match connect_or_report(connector, config, Access::Read, err).await? {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let client = &conn.client;
    let ns = namespace_or_default(namespace);
    let mut problems = Vec::new();
    let mut revision = None;
    let mut resources = Vec::new();
    if a.names.is_empty() {
        let scope = (!all_namespaces).then_some(ns);
        match client.list(kind, scope, "").await {
            Ok(list) => {
                revision = Some(list.revision);
                resources = list.items;
                resources.retain(|r| kind_arg.lists(r));
                for (key, e) in list.undecodable {
                    problems.push(format!("cannot decode the stored value at {key}: {e}"));
                }
            }
            Err(e) => {
                writeln!(
                    err,
                    "failed to get resources: {}",
                    list_reason(&e, &conn.describe)
                )?;
                return Ok(EXIT_INVALID);
            }
        }
    } else {
        for name in &a.names {
            let key = key_of(kind, ns, &kind_arg.stored_name(name));
            match client.get(&key).await {
                Ok(r) => resources.push(r),
                Err(e @ DatastoreError::Unavailable { .. }) => {
                    writeln!(
                        err,
                        "failed to get resources: {}",
                        list_reason(&e, &conn.describe)
                    )?;
                    return Ok(EXIT_INVALID);
                }
                Err(e) => problems.push(reason(&e, &key)),
            }
        }
    }
    if let Some(sel) = &selector {
        resources.retain(|r| sel.matches(&r.metadata().labels));
    }
    if a.export && !a.names.is_empty() {
        for r in &mut resources {
            export(r);
        }
    }
    let print_namespace = all_namespaces || namespace.is_some();
    let listing = a.names.is_empty();
    match output {
        Output::Table { wide } => {
            let headings: Vec<String> = default_headings(kind, wide)
                .iter()
                .map(|h| h.to_string())
                .collect();
            let ctx = table_context(client, kind, &headings).await;
            if listing || !resources.is_empty() {
                write!(
                    out,
                    "{}",
                    render(kind, &headings, print_namespace, &resources, &ctx)
                )?;
            }
        }
        Output::Columns(headings) => {
            let ctx = table_context(client, kind, &headings).await;
            if listing || !resources.is_empty() {
                write!(out, "{}", render(kind, &headings, false, &resources, &ctx))?;
            }
        }
        Output::Name => {
            for r in &resources {
                writeln!(
                    out,
                    "{}.projectcalico.org/{}",
                    kind.name().to_ascii_lowercase(),
                    r.name()
                )?;
            }
        }
        Output::Json => {
            // calicoctl's `json.MarshalIndent` of the Go types: keys in struct order (kind,
            // apiVersion, metadata, spec / items), no newline at the end.
            let text = if !listing && resources.len() == 1 {
                Some(to_json(&resources[0], true).map_err(|e| e.to_string()))
            } else if listing || resources.len() > 1 {
                Some(
                    to_json(&GoList::new(kind, &resources, revision), true)
                        .map_err(|e| e.to_string()),
                )
            } else {
                None
            };
            match text {
                Some(Ok(t)) => write!(out, "{t}")?,
                Some(Err(e)) => problems.push(format!("cannot encode the output: {e}")),
                None => {}
            }
        }
        Output::Yaml => {
            let value = if !listing && resources.len() == 1 {
                serde_json::to_value(&resources[0])
            } else if listing || resources.len() > 1 {
                list_value(kind, &resources, revision)
            } else {
                Ok(Value::Null)
            };
            let text = match value {
                Ok(Value::Null) => None,
                Ok(v) => Some(to_yaml(&v).map_err(|e| e.to_string())),
                Err(e) => Some(Err(e.to_string())),
            };
            match text {
                Some(Ok(t)) => write!(out, "{t}")?,
                Some(Err(e)) => problems.push(format!("cannot encode the output: {e}")),
                None => {}
            }
        }
    }
    for p in &problems {
        writeln!(err, "{p}")?;
    }
    Ok(if problems.is_empty() {
        EXIT_OK
    } else {
        EXIT_INVALID
    })
}

/// `get -f`: one get per document, printed as calicoctl prints several results: a table (or
/// names) per document, and for YAML and JSON one sequence of them (a single result as itself).
async fn run_files<C: Connector>(
    a: &GetArgs,
    config: Option<&Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
) -> std::io::Result<u8> {
    let mut requests = Vec::new();
    let mut code = EXIT_OK;
    let mut texts = Vec::new();
    for file in &a.filename {
        if file.as_os_str() == "-" {
            let mut stdin = std::io::stdin().lock();
            match crate::input::read_bounded(&mut stdin) {
                Ok(t) => texts.push(("<stdin>".to_string(), t)),
                Err(e) => {
                    writeln!(err, "error: cannot read standard input: {e}")?;
                    return Ok(EXIT_USAGE);
                }
            }
            continue;
        }
        let paths = match crate::input::expand(file, a.recursive) {
            Ok(p) => p,
            Err(e) => {
                writeln!(err, "error: cannot read {}: {e}", file.display())?;
                return Ok(EXIT_USAGE);
            }
        };
        for p in paths {
            match crate::input::read_file(&p) {
                Ok(t) => texts.push((p.display().to_string(), t)),
                Err(e) => {
                    writeln!(err, "error: cannot read {}: {e}", p.display())?;
                    return Ok(EXIT_USAGE);
                }
            }
        }
    }
    for (label, text) in &texts {
        let docs = match margay_api::codec::decode_documents(text) {
            Ok(d) => d,
            Err(e) => {
                writeln!(err, "{}", crate::input::clip_line(&format!("{label}: {e}")))?;
                return Ok(EXIT_USAGE);
            }
        };
        if docs.is_empty() {
            writeln!(err, "error: no resources specified in file {label}")?;
            code = EXIT_INVALID;
        }
        // Only the kind, name and namespace matter: a document need not be valid to name one.
        for d in docs {
            let Some(kind) = d.kind.clone() else {
                writeln!(err, "{label} [{}]: kind: missing", d.position)?;
                code = EXIT_INVALID;
                continue;
            };
            let namespace = match (
                d.namespace.as_deref().filter(|n| !n.is_empty()),
                a.namespace.as_deref(),
            ) {
                (Some(doc), Some(flag)) if doc != flag => {
                    writeln!(
                        err,
                        "{label} [{}]: resource namespace does not match client namespace. {doc} != {flag}",
                        d.position
                    )?;
                    code = EXIT_INVALID;
                    continue;
                }
                (Some(doc), _) => Some(doc.to_string()),
                (None, flag) => flag.map(str::to_string),
            };
            requests.push(GetArgs {
                kind: Some(kind),
                names: d
                    .name
                    .clone()
                    .into_iter()
                    .filter(|n| !n.is_empty())
                    .collect(),
                namespace,
                all_namespaces: false,
                output: a.output.clone(),
                selector: None,
                export: a.export,
                filename: Vec::new(),
                recursive: false,
            });
        }
    }
    let structured = matches!(parse_output(&a.output), Ok(Output::Yaml | Output::Json));
    let mut results = Vec::new();
    for r in &requests {
        let mut buf = Vec::new();
        let c = run(r, config, &mut buf, err, connector).await?;
        if c == EXIT_USAGE {
            return Ok(c);
        }
        if c != EXIT_OK {
            code = EXIT_INVALID;
        }
        results.push(buf);
    }
    if !structured || results.len() == 1 {
        for r in results {
            out.write_all(&r)?;
        }
        return Ok(code);
    }
    // Several results: one sequence of them. JSON is joined as written (keeping calicoctl's
    // key order): an array of the documents, indented as `MarshalIndent` indents it.
    if parse_output(&a.output) == Ok(Output::Json) {
        let items: Vec<String> = results
            .iter()
            .filter(|r| !r.is_empty())
            .map(|r| {
                String::from_utf8_lossy(r)
                    .trim_end()
                    .lines()
                    .map(|l| format!("  {l}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .collect();
        write!(out, "[\n{}\n]", items.join(",\n"))?;
        return Ok(code);
    }
    let mut values = Vec::new();
    for r in &results {
        if r.is_empty() {
            continue;
        }
        match margay_api::codec::parse_patch_document(&String::from_utf8_lossy(r)) {
            Ok(v) => values.push(v),
            Err(e) => {
                writeln!(err, "cannot encode the output: {e}")?;
                return Ok(EXIT_INVALID);
            }
        }
    }
    let seq = Value::Array(values);
    let text = if parse_output(&a.output) == Ok(Output::Yaml) {
        to_yaml(&seq).map_err(|e| e.to_string())
    } else {
        to_json(&seq, true)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string())
    };
    match text {
        Ok(t) => write!(out, "{t}")?,
        Err(e) => {
            writeln!(err, "cannot encode the output: {e}")?;
            code = EXIT_INVALID;
        }
    }
    Ok(code)
}

fn list_reason(e: &DatastoreError, describe: &str) -> String {
    match e {
        DatastoreError::Unavailable { reason } => {
            format!("cannot reach the datastore ({describe}): {reason}")
        }
        other => other.to_string(),
    }
}

/// Several resources of one kind as calicoctl prints a listing: a `<Kind>List` with the
/// revision it was read at.
fn list_value(
    kind: Kind,
    resources: &[Resource],
    revision: Option<i64>,
) -> Result<Value, serde_json::Error> {
    let items = resources
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()?;
    let metadata = match revision {
        Some(r) => json!({ "resourceVersion": r.to_string() }),
        None => json!({}),
    };
    Ok(json!({
        "apiVersion": API_VERSION,
        "kind": kind.list_name(),
        "items": items,
        "metadata": metadata,
    }))
}

/// calicoctl's list object as Go marshals it: `kind`, `apiVersion`, `metadata`, `items`.
#[derive(serde::Serialize)]
struct GoList<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: GoListMeta,
    items: &'a [Resource],
}

#[derive(serde::Serialize)]
struct GoListMeta {
    #[serde(rename = "resourceVersion", skip_serializing_if = "Option::is_none")]
    resource_version: Option<String>,
}

impl<'a> GoList<'a> {
    fn new(kind: Kind, items: &'a [Resource], revision: Option<i64>) -> Self {
        GoList {
            kind: kind.list_name(),
            api_version: API_VERSION,
            metadata: GoListMeta {
                resource_version: revision.map(|r| r.to_string()),
            },
            items,
        }
    }
}

/// `--export`: drop what ties the resource to this cluster.
fn export(r: &mut Resource) {
    let m = r.metadata_mut();
    m.namespace.clear();
    m.uid.clear();
    m.resource_version.clear();
    m.creation_timestamp = None;
    m.deletion_timestamp = None;
    m.deletion_grace_period_seconds = None;
}

/// What the table needs besides the resources: the default AS number for nodes.
async fn table_context<B: KvBackend>(
    client: &Client<B>,
    kind: Kind,
    headings: &[String],
) -> TableContext {
    let mut ctx = TableContext::default();
    if kind == Kind::Node && headings.iter().any(|h| h == "ASN") {
        let key = key_of(Kind::BGPConfiguration, "", "default");
        ctx.default_asn = Some(match client.get(&key).await {
            Ok(Resource::BGPConfiguration(c)) => c
                .spec
                .as_number
                .map_or_else(|| "64512".to_string(), |a| a.to_string()),
            Ok(_) => "unknown".to_string(),
            Err(DatastoreError::NotFound { .. }) => "64512".to_string(),
            Err(_) => "unknown".to_string(),
        });
    }
    ctx
}
