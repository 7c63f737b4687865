//! `create`, `apply`, `replace` and `delete`: resources from files (or, for delete, named on
//! the command line) written to the datastore one by one, with calicoctl's reporting.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use margay_api::{Kind, Resource, ResourceKey};
use margay_datastore::{Client, DatastoreError, KvBackend};

use crate::datastore::{Access, Connector, connect_or_report};
use crate::input::{Item, Loaded, Sources, load};
use crate::kinds::{ident, key_of, namespace_or_default, parse_kind_arg};
use crate::report::{Progress, reason, stale};
use crate::{EXIT_INVALID, EXIT_OK, EXIT_USAGE, Ui};

/// How often a read-modify-write is retried when another writer gets in between.
const ATTEMPTS: usize = 5;

/// The input options shared by create, apply and replace.
#[derive(Debug, Args)]
pub struct FileArgs {
    /// A YAML or JSON file of resources (several documents and list kinds are fine), a
    /// directory of .yaml/.yml/.json files, or `-` for standard input. Repeat for more.
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// Read directories given with -f recursively.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// Do not fail on files (or directories) that contain no resources.
    #[arg(long)]
    pub skip_empty: bool,
    /// Namespace for namespaced resources that do not name one (default: `default`). A
    /// document whose metadata.namespace differs is an error.
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub input: FileArgs,
    /// Skip over (and count as done) resources that already exist.
    #[arg(long)]
    pub skip_exists: bool,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub input: FileArgs,
}

#[derive(Debug, Args)]
pub struct ReplaceArgs {
    #[command(flatten)]
    pub input: FileArgs,
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// The kind of the resources to delete (singular, plural or short form: ippool, gnp,
    /// networkpolicies, ...). Not used with -f. `networkpolicies.networking.k8s.io` (or
    /// `netpol`) deletes policies converted from Kubernetes ones by their Kubernetes names.
    #[arg(value_name = "KIND", required_unless_present = "files")]
    pub kind: Option<String>,
    /// The names of the resources to delete.
    #[arg(value_name = "NAME", requires = "kind")]
    pub names: Vec<String>,
    /// Delete the resources described in a file, a directory of files, or `-` (standard
    /// input). Repeat for more. A document with metadata.resourceVersion set is only deleted
    /// if the stored resource still has that version.
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "FILE",
        conflicts_with = "kind"
    )]
    pub files: Vec<PathBuf>,
    /// Read directories given with -f recursively.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// Do not fail on files (or directories) that contain no resources.
    #[arg(long)]
    pub skip_empty: bool,
    /// Namespace of namespaced resources (default: `default`).
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Skip over (and count as done) resources that do not exist.
    #[arg(short = 's', long)]
    pub skip_not_exists: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Create { skip_exists: bool },
    Apply,
    Replace,
    Delete { skip_not_exists: bool },
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Action::Create { .. } => "create",
            Action::Apply => "apply",
            Action::Replace => "replace",
            Action::Delete { .. } => "delete",
        }
    }

    fn past(self) -> &'static str {
        match self {
            Action::Create { .. } => "created",
            Action::Apply => "applied",
            Action::Replace => "replaced",
            Action::Delete { .. } => "deleted",
        }
    }

    fn progressive(self) -> &'static str {
        match self {
            Action::Create { .. } => "creating",
            Action::Apply => "applying",
            Action::Replace => "replacing",
            Action::Delete { .. } => "deleting",
        }
    }
}

/// What happened to one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Created,
    Updated,
    Unchanged,
    Replaced,
    Deleted,
    /// Already there (create --skip-exists) or already gone (delete --skip-not-exists).
    Skipped,
}

/// Why one resource failed.
#[derive(Debug)]
pub(crate) enum OpError {
    Store(DatastoreError),
    /// The input's resourceVersion is not the stored one.
    Stale {
        given: String,
        latest: String,
    },
    Refused(String),
}

impl OpError {
    fn message(&self, key: &ResourceKey) -> String {
        match self {
            OpError::Store(e) => reason(e, key),
            OpError::Stale { given, latest } => stale(key, given, latest),
            OpError::Refused(m) => m.clone(),
        }
    }

    fn is_unavailable(&self) -> bool {
        matches!(self, OpError::Store(DatastoreError::Unavailable { .. }))
    }
}

#[derive(Debug, Default)]
struct Tally {
    created: usize,
    updated: usize,
    unchanged: usize,
    done: usize,
    skipped: usize,
    failed: usize,
}

impl Tally {
    fn record(&mut self, o: Outcome) {
        match o {
            Outcome::Created => self.created += 1,
            Outcome::Updated => self.updated += 1,
            Outcome::Unchanged => self.unchanged += 1,
            Outcome::Replaced | Outcome::Deleted => self.done += 1,
            Outcome::Skipped => self.skipped += 1,
        }
    }

    fn handled(&self) -> usize {
        self.created + self.updated + self.unchanged + self.done + self.skipped
    }
}

pub(crate) async fn run_create<C: Connector>(
    a: &CreateArgs,
    config: Option<&Path>,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
    ui: Ui,
) -> std::io::Result<u8> {
    let action = Action::Create {
        skip_exists: a.skip_exists,
    };
    run_files(action, &a.input, config, stdin, out, err, connector, ui).await
}

pub(crate) async fn run_apply<C: Connector>(
    a: &ApplyArgs,
    config: Option<&Path>,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
    ui: Ui,
) -> std::io::Result<u8> {
    run_files(
        Action::Apply,
        &a.input,
        config,
        stdin,
        out,
        err,
        connector,
        ui,
    )
    .await
}

pub(crate) async fn run_replace<C: Connector>(
    a: &ReplaceArgs,
    config: Option<&Path>,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
    ui: Ui,
) -> std::io::Result<u8> {
    run_files(
        Action::Replace,
        &a.input,
        config,
        stdin,
        out,
        err,
        connector,
        ui,
    )
    .await
}

pub(crate) async fn run_delete<C: Connector>(
    a: &DeleteArgs,
    config: Option<&Path>,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
    ui: Ui,
) -> std::io::Result<u8> {
    let action = Action::Delete {
        skip_not_exists: a.skip_not_exists,
    };
    let namespace = a.namespace.as_deref().filter(|n| !n.is_empty());
    if !a.files.is_empty() {
        let sources = Sources {
            files: &a.files,
            recursive: a.recursive,
            skip_empty: a.skip_empty,
        };
        let Some(loaded) = load(&sources, stdin, err)? else {
            return Ok(EXIT_USAGE);
        };
        return run_loaded(action, loaded, namespace, config, out, err, connector, ui).await;
    }
    let Some(kind_arg) = a.kind.as_deref() else {
        writeln!(err, "error: give a KIND and NAMEs, or -f FILE")?;
        return Ok(EXIT_USAGE);
    };
    let kind_arg = match parse_kind_arg(kind_arg) {
        Ok(k) => k,
        Err(e) => {
            writeln!(err, "error: {e}")?;
            return Ok(EXIT_USAGE);
        }
    };
    let kind = kind_arg.kind;
    if a.names.is_empty() {
        writeln!(
            err,
            "error: no resources specified: name the {kind} resources to delete after the kind (or use -f FILE)"
        )?;
        return Ok(EXIT_USAGE);
    }
    if let Some(e) = check_names(&a.names) {
        writeln!(err, "error: {e}")?;
        return Ok(EXIT_USAGE);
    }
    if !kind.is_namespaced() && namespace.is_some() {
        writeln!(err, "error: {kind} is not namespaced")?;
        return Ok(EXIT_USAGE);
    }
    let ns = namespace_or_default(namespace);
    let keys: Vec<ResourceKey> = a
        .names
        .iter()
        .map(|n| key_of(kind, ns, &kind_arg.stored_name(n)))
        .collect();
    let conn = match connect_or_report(connector, config, Access::Existing, err).await? {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let progress = Progress::new(keys.len(), ui.progress, action.progressive());
    let mut tally = Tally::default();
    for (i, key) in keys.iter().enumerate() {
        let refusal = derived_refusal_for(conn.kubernetes, action, key.kind, &key.name);
        let result = match refusal {
            Some(why) => Err(OpError::Refused(why)),
            None => delete(&conn.client, key, None, a.skip_not_exists).await,
        };
        progress.inc();
        match result {
            Ok(o) => tally.record(o),
            Err(e) => {
                tally.failed += 1;
                progress.line(err, &failure_line(action, key.kind, &e.message(key)))?;
                if e.is_unavailable() {
                    tally.failed += keys.len() - i - 1;
                    progress.line(err, &abandoned(&conn.describe, keys.len() - i - 1))?;
                    break;
                }
            }
        }
    }
    progress.finish();
    summarise(action, &tally, 0, keys.len(), Some(kind), out, err)
}

/// Empty names and names with `/` cannot be keys.
fn check_names(names: &[String]) -> Option<String> {
    if names.iter().any(String::is_empty) {
        return Some("resource name may not be empty".to_string());
    }
    names
        .iter()
        .find(|n| n.contains('/'))
        .map(|n| format!("{n:?} is not a valid resource name (names cannot contain '/')"))
}

#[allow(clippy::too_many_arguments)]
async fn run_files<C: Connector>(
    action: Action,
    a: &FileArgs,
    config: Option<&Path>,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
    ui: Ui,
) -> std::io::Result<u8> {
    let sources = Sources {
        files: &a.files,
        recursive: a.recursive,
        skip_empty: a.skip_empty,
    };
    let Some(loaded) = load(&sources, stdin, err)? else {
        return Ok(EXIT_USAGE);
    };
    let namespace = a.namespace.as_deref().filter(|n| !n.is_empty());
    run_loaded(action, loaded, namespace, config, out, err, connector, ui).await
}

/// Writes the valid resources of `loaded`, reports each failure, and sums up.
#[allow(clippy::too_many_arguments)]
async fn run_loaded<C: Connector>(
    action: Action,
    loaded: Loaded,
    namespace: Option<&str>,
    config: Option<&Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
    ui: Ui,
) -> std::io::Result<u8> {
    let total = loaded.total();
    let kind = loaded.single_kind();
    if total == 0 {
        writeln!(out, "No resources specified")?;
        return Ok(EXIT_OK);
    }
    let mut tally = Tally::default();
    if !loaded.items.is_empty() {
        let access = match action {
            Action::Create { .. } | Action::Apply => Access::MayCreate,
            Action::Replace | Action::Delete { .. } => Access::Existing,
        };
        let conn = match connect_or_report(connector, config, access, err).await? {
            Ok(c) => c,
            Err(code) => return Ok(code),
        };
        let n = loaded.items.len();
        let progress = Progress::new(n, ui.progress, action.progressive());
        for (i, Item { resource, .. }) in loaded.items.into_iter().enumerate() {
            let result = match derived_refusal(conn.kubernetes, action, &resource) {
                Some(why) => Err((resource.key(), OpError::Refused(why))),
                None => process(&conn.client, action, resource, namespace).await,
            };
            progress.inc();
            match result {
                Ok(o) => tally.record(o),
                Err((key, e)) => {
                    tally.failed += 1;
                    progress.line(err, &failure_line(action, key.kind, &e.message(&key)))?;
                    if e.is_unavailable() {
                        tally.failed += n - i - 1;
                        progress.line(err, &abandoned(&conn.describe, n - i - 1))?;
                        break;
                    }
                }
            }
        }
        progress.finish();
    }
    summarise(action, &tally, loaded.invalid, total, kind, out, err)
}

fn failure_line(action: Action, kind: Kind, message: &str) -> String {
    format!("Failed to {} '{kind}' resource: {message}", action.verb())
}

fn abandoned(describe: &str, left: usize) -> String {
    format!("error: lost the datastore ({describe}); {left} resource(s) not processed")
}

/// calicoctl's closing line(s); returns the exit code.
fn summarise(
    action: Action,
    tally: &Tally,
    invalid: usize,
    total: usize,
    kind: Option<Kind>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<u8> {
    let kind_txt = kind.map(|k| format!("'{k}' ")).unwrap_or_default();
    let handled = tally.handled();
    let (verb, past) = (action.verb(), action.past());
    if handled > 0 {
        if tally.failed == 0 && invalid == 0 {
            writeln!(out, "Successfully {past} {handled} {kind_txt}resource(s)")?;
        } else {
            writeln!(
                out,
                "Partial success: {past} {handled} out of {total} {kind_txt}resources"
            )?;
        }
        if action == Action::Apply && tally.created < handled {
            writeln!(
                err,
                "{} created, {} updated, {} unchanged",
                tally.created, tally.updated, tally.unchanged
            )?;
        }
        if tally.skipped > 0 {
            let why = match action {
                Action::Delete { .. } => "did not exist",
                _ => "already existed",
            };
            writeln!(err, "{} {why} and were skipped", tally.skipped)?;
        }
    } else if total > 1 {
        writeln!(err, "Failed to {verb} any {kind_txt}resources")?;
    }
    if invalid > 0 {
        writeln!(
            err,
            "{invalid} of {total} documents are invalid; nothing was {past} from them"
        )?;
    }
    Ok(if tally.failed == 0 && invalid == 0 {
        EXIT_OK
    } else {
        EXIT_INVALID
    })
}

/// One resource: namespace rules, then the action.
async fn process<B: KvBackend>(
    client: &Client<B>,
    action: Action,
    mut resource: Resource,
    namespace: Option<&str>,
) -> Result<Outcome, (ResourceKey, OpError)> {
    if let Err(m) = set_namespace(&mut resource, namespace) {
        let key = resource.key();
        let m = format!("{}: {m}", ident(&key));
        return Err((key, OpError::Refused(m)));
    }
    // A workload endpoint may leave its name to be derived from its spec, as Calico does.
    if let Resource::WorkloadEndpoint(w) = &mut resource
        && w.metadata.name.is_empty()
        && let Ok(name) = w.spec.expected_name()
    {
        w.metadata.name = name;
    }
    let key = resource.key();
    let result = match action {
        Action::Create { skip_exists } => create(client, resource, skip_exists).await,
        Action::Apply => apply(client, resource).await,
        Action::Replace => replace(client, resource).await,
        Action::Delete { skip_not_exists } => {
            let rv = resource.metadata().resource_version.clone();
            let rv = (!rv.is_empty()).then_some(rv.as_str());
            delete(client, &key, rv, skip_not_exists).await
        }
    };
    result.map_err(|e| (key, e))
}

/// In the Kubernetes datastore some kinds are views of Kubernetes objects: WorkloadEndpoints
/// (Pods), Profiles (Namespaces, ServiceAccounts), `knp.default.*` NetworkPolicies (Kubernetes
/// NetworkPolicies) and Nodes (Kubernetes Nodes, whose Calico fields may be updated but which
/// are neither created nor deleted here). Writing them is refused with what to do instead.
pub(crate) fn derived_refusal(kubernetes: bool, action: Action, r: &Resource) -> Option<String> {
    derived_refusal_for(kubernetes, action, r.kind(), r.name())
}

pub(crate) fn derived_refusal_for(
    kubernetes: bool,
    action: Action,
    kind: Kind,
    name: &str,
) -> Option<String> {
    if !kubernetes {
        return None;
    }
    let verb = action.verb();
    match kind {
        Kind::WorkloadEndpoint => Some(format!(
            "cannot {verb} WorkloadEndpoint {name:?}: in the Kubernetes datastore WorkloadEndpoints are derived from Pods and are read-only (change the Pod with kubectl)"
        )),
        Kind::Profile => Some(format!(
            "cannot {verb} Profile {name:?}: in the Kubernetes datastore Profiles are derived from Namespaces (kns.*) and ServiceAccounts (ksa.*) and are read-only (change those with kubectl)"
        )),
        Kind::NetworkPolicy if name.starts_with("knp.default.") => Some(format!(
            "cannot {verb} NetworkPolicy {name:?}: in the Kubernetes datastore knp.default.* policies are Kubernetes NetworkPolicies (networking.k8s.io/v1); manage them with kubectl"
        )),
        Kind::Node if matches!(action, Action::Create { .. } | Action::Delete { .. }) => {
            Some(format!(
                "cannot {verb} Node {name:?}: in the Kubernetes datastore Calico Nodes are the cluster's Kubernetes Nodes (registered by the kubelet, removed with kubectl delete node); apply or replace updates their Calico fields"
            ))
        }
        _ => None,
    }
}

/// calicoctl's namespace rules for a resource from a file: `-n` fills in a missing namespace
/// (else `default`), a different one is an error, and cluster-scoped kinds take none.
pub(crate) fn set_namespace(r: &mut Resource, cli: Option<&str>) -> Result<(), String> {
    let kind = r.kind();
    let own = r.namespace().to_string();
    if kind.is_namespaced() {
        match (own.is_empty(), cli) {
            (true, ns) => r.metadata_mut().namespace = namespace_or_default(ns).to_string(),
            (false, Some(ns)) if ns != own => {
                return Err(format!(
                    "resource namespace does not match client namespace. {own} != {ns}"
                ));
            }
            (false, _) => {}
        }
        Ok(())
    } else if !own.is_empty() {
        Err(format!(
            "namespace should not be specified for a non-namespaced resource. {kind} is not a namespaced resource"
        ))
    } else if cli.is_some() {
        Err(format!("{kind} is not namespaced"))
    } else {
        Ok(())
    }
}

/// Only the metadata an operator may set survives into a create: name, namespace,
/// resourceVersion, labels and annotations (uid, timestamps and the rest are the store's).
fn strip_for_create(mut r: Resource) -> Resource {
    let m = r.metadata_mut();
    let kept = margay_api::ObjectMeta {
        name: std::mem::take(&mut m.name),
        namespace: std::mem::take(&mut m.namespace),
        resource_version: std::mem::take(&mut m.resource_version),
        labels: std::mem::take(&mut m.labels),
        annotations: std::mem::take(&mut m.annotations),
        ..margay_api::ObjectMeta::default()
    };
    *m = kept;
    r
}

/// The stored metadata, with the labels and annotations of the update (the only metadata an
/// update may change), and the update's spec and status.
fn merge_for_update(current: &Resource, update: &Resource) -> Resource {
    let mut merged = update.clone();
    let mut meta = current.metadata().clone();
    meta.labels = update.metadata().labels.clone();
    meta.annotations = update.metadata().annotations.clone();
    *merged.metadata_mut() = meta;
    merged
}

async fn create<B: KvBackend>(
    client: &Client<B>,
    r: Resource,
    skip_exists: bool,
) -> Result<Outcome, OpError> {
    match client.create(strip_for_create(r)).await {
        Ok(_) => Ok(Outcome::Created),
        Err(DatastoreError::AlreadyExists { .. }) if skip_exists => Ok(Outcome::Skipped),
        Err(e) => Err(OpError::Store(e)),
    }
}

/// Create, or update what exists. With a resourceVersion in the input the update only goes
/// ahead if the stored resource still has that version; without one, a concurrent change
/// is re-read and the update tried again.
pub(crate) async fn apply<B: KvBackend>(
    client: &Client<B>,
    r: Resource,
) -> Result<Outcome, OpError> {
    if r.kind() == Kind::ClusterInformation {
        return Err(OpError::Refused(
            "operation apply is not supported on ClusterInformation: resource is readonly"
                .to_string(),
        ));
    }
    let given = r.metadata().resource_version.clone();
    let key = r.key();
    let mut last = None;
    for _ in 0..ATTEMPTS {
        match client.get(&key).await {
            Err(DatastoreError::NotFound { .. }) => {
                let mut c = strip_for_create(r.clone());
                c.metadata_mut().resource_version.clear();
                match client.create(c).await {
                    Ok(_) => return Ok(Outcome::Created),
                    Err(e @ DatastoreError::AlreadyExists { .. }) => last = Some(e),
                    Err(e) => return Err(OpError::Store(e)),
                }
            }
            Err(e) => return Err(OpError::Store(e)),
            Ok(current) => {
                let latest = current.metadata().resource_version.clone();
                if !given.is_empty() && given != latest {
                    return Err(OpError::Stale { given, latest });
                }
                let merged = merge_for_update(&current, &r);
                if merged == current {
                    return Ok(Outcome::Unchanged);
                }
                match client.update(merged).await {
                    Ok(_) => return Ok(Outcome::Updated),
                    Err(e @ DatastoreError::Conflict { .. }) if given.is_empty() => last = Some(e),
                    Err(e @ DatastoreError::NotFound { .. }) if given.is_empty() => last = Some(e),
                    Err(e) => return Err(OpError::Store(e)),
                }
            }
        }
    }
    Err(gave_up(last))
}

fn gave_up(last: Option<DatastoreError>) -> OpError {
    match last {
        Some(e @ DatastoreError::Conflict { .. }) => OpError::Store(e),
        _ => OpError::Refused(format!(
            "gave up after {ATTEMPTS} attempts: the resource keeps changing"
        )),
    }
}

/// Replace what exists (never creates). See [`apply`] for the resourceVersion rules.
pub(crate) async fn replace<B: KvBackend>(
    client: &Client<B>,
    r: Resource,
) -> Result<Outcome, OpError> {
    let given = r.metadata().resource_version.clone();
    let key = r.key();
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let current = client.get(&key).await.map_err(OpError::Store)?;
        let latest = current.metadata().resource_version.clone();
        if !given.is_empty() && given != latest {
            return Err(OpError::Stale { given, latest });
        }
        match client.update(merge_for_update(&current, &r)).await {
            Ok(_) => return Ok(Outcome::Replaced),
            Err(e @ DatastoreError::Conflict { .. }) if given.is_empty() => last = Some(e),
            Err(e) => return Err(OpError::Store(e)),
        }
    }
    Err(gave_up(last))
}

async fn delete<B: KvBackend>(
    client: &Client<B>,
    key: &ResourceKey,
    resource_version: Option<&str>,
    skip_not_exists: bool,
) -> Result<Outcome, OpError> {
    match client.delete(key, resource_version).await {
        Ok(_) => Ok(Outcome::Deleted),
        Err(DatastoreError::NotFound { .. }) if skip_not_exists => Ok(Outcome::Skipped),
        Err(e) => Err(OpError::Store(e)),
    }
}
