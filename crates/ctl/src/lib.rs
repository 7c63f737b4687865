//! `margay ctl`: the operator's command-line interface (calicoctl's counterpart).
//!
//! Commands write to the given output streams and return the process exit code, so the binary
//! stays a thin dispatcher and tests can run commands in-process.
//!
//! The resource commands (`create`, `apply`, `replace`, `delete`, `get`, `label`, `ipam`) talk to the
//! datastore through a tokio current-thread runtime created here for the one command;
//! `selector` and `validate` never start one.
#![forbid(unsafe_code)]

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::{Args, Subcommand};

mod cluster_cmd;
mod datastore;
mod get_cmd;
mod input;
mod ipam_cmd;
mod ipam_report;
mod ipam_split;
mod kinds;
mod label_cmd;
mod migrate_cmd;
mod node_cmd;
mod node_system;
mod patch_cmd;
mod report;
mod selector_cmd;
mod table;
mod validate_cmd;
mod write_cmd;

#[cfg(test)]
mod tests;

pub use cluster_cmd::set_git_commit;
use datastore::{Connector, EnvConnector};

/// Exit code of a successful command.
pub const EXIT_OK: u8 = 0;
/// The input was read but something in it is invalid (e.g. a resource fails validation), or
/// an operation on the datastore failed (not found, already exists, conflict, unreachable).
pub const EXIT_INVALID: u8 = 1;
/// The command could not run as asked (bad arguments, unreadable file, invalid selector,
/// unknown kind, unusable datastore configuration).
pub const EXIT_USAGE: u8 = 2;

/// Operate on margay/Calico resources and selectors.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// Datastore connection file (calicoctl's `CalicoAPIConfig`, YAML or JSON). Without it,
    /// /etc/calico/calicoctl.cfg is read if it exists, else the environment (DATASTORE_TYPE,
    /// DATASTORE_PATH, ETCD_ENDPOINTS, ETCD_CA_CERT_FILE, ...).
    #[arg(short = 'c', long = "config", value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,

    /// Accepted for calicoctl compatibility; margay has no client/cluster version check.
    #[arg(long, global = true, hide = true)]
    pub allow_version_mismatch: bool,

    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Create resources from files or standard input; fails for resources that already exist.
    ///
    /// Every document of every file is decoded and validated before anything is written; an
    /// invalid document is reported (`FILE [document N] KIND/NAME: FIELD.PATH: problem`) and
    /// skipped, the others are created. Exits 1 if anything failed.
    #[command(after_help = "Examples:
  # Create the resources in a file.
  margay ctl create -f ./pools.yaml

  # Create from standard input, ignoring resources that already exist.
  cat policy.json | margay ctl create -f - --skip-exists")]
    Create(write_cmd::CreateArgs),
    /// Create resources, or update the ones that already exist.
    ///
    /// Reports how many resources were applied; a note on stderr says how many of them were
    /// updated or already up to date. A document with metadata.resourceVersion set is only
    /// applied if the stored resource still has that version.
    ///
    /// Kubernetes NetworkPolicies (apiVersion networking.k8s.io/v1) are accepted by every
    /// command that reads files (create, apply, replace, delete, validate): each is converted
    /// as Calico converts it and stored as the NetworkPolicy knp.default.<name> (tier default,
    /// order 1000).
    #[command(after_help = "Examples:
  # Apply the resources in a file.
  margay ctl apply -f ./policy.yaml

  # Apply a Kubernetes NetworkPolicy, then show what it became.
  margay ctl apply -f ./k8s-netpol.yaml
  margay ctl get networkpolicies.networking.k8s.io -n prod -o yaml

  # Apply every .yaml, .yml and .json file under a directory tree.
  margay ctl apply -f ./calico/ -R")]
    Apply(write_cmd::ApplyArgs),
    /// Replace existing resources; fails for resources that do not exist.
    ///
    /// Only the labels and annotations of the given metadata are used; the rest is kept from
    /// the stored resource. With metadata.resourceVersion set (as `get -o yaml` prints it) the
    /// replace fails if the resource was modified since it was read.
    #[command(after_help = "Examples:
  # Edit a pool and write it back, failing if someone else changed it meanwhile.
  margay ctl get ippool default-ipv4-ippool -o yaml > pool.yaml
  $EDITOR pool.yaml
  margay ctl replace -f pool.yaml")]
    Replace(write_cmd::ReplaceArgs),
    /// Delete resources by kind and name, or those described in files.
    #[command(after_help = "Examples:
  # Delete two network policies in namespace prod.
  margay ctl delete networkpolicy allow-dns deny-all -n prod

  # Delete the resources described in a file, ignoring the ones already gone.
  margay ctl delete -f ./policy.yaml --skip-not-exists")]
    Delete(write_cmd::DeleteArgs),
    /// Show resources of a kind: all of them, or the named ones.
    ///
    /// The default output is a table with calicoctl's columns (`-o wide` for more); `-o yaml`
    /// and `-o json` print one named resource as itself, and a listing or several names as a
    /// `<Kind>List` that `apply`/`replace` accept back.
    #[command(after_help = "Examples:
  # List IP pools with all their columns.
  margay ctl get ippools -o wide

  # Network policies labelled app=web in every namespace, as YAML.
  margay ctl get networkpolicies -A -l 'app == \"web\"' -o yaml

  # One global network policy as JSON.
  margay ctl get gnp deny-all -o json")]
    Get(get_cmd::GetArgs),
    /// Add, change or remove one label of a resource.
    ///
    /// An existing label is only changed with --overwrite. The update is a compare-and-swap
    /// on the version that was read, so a concurrent change is never lost.
    #[command(after_help = "Examples:
  # Label a node.
  margay ctl label nodes node1 cluster=frontend

  # Change an existing label.
  margay ctl label nodes node1 cluster=backend --overwrite

  # Remove a label.
  margay ctl label nodes node1 cluster --remove")]
    Label(label_cmd::LabelArgs),
    /// Evaluate and canonicalise label selectors.
    #[command(subcommand)]
    Selector(selector_cmd::SelectorCommand),
    /// Check projectcalico.org/v3 resource files (and Kubernetes NetworkPolicies) without
    /// applying them.
    ///
    /// Every document of every file is decoded and validated, and every problem of each is
    /// reported in one pass (type errors, up to 20 per document, then the validation
    /// problems), each on its own line as `FILE [document N] KIND/NAME: FIELD.PATH: what is
    /// wrong`. Exits 1 if any document is invalid, 0 if all are valid, 2 if a file cannot be
    /// read.
    #[command(after_help = "Examples:
  margay ctl validate -f ./pools.yaml -f ./policies.yaml

  # Every .yaml, .yml and .json file under a directory tree.
  margay ctl validate -f ./calico/ -R")]
    Validate(validate_cmd::ValidateArgs),
    /// IP address management: utilization, consistency check, releasing an address.
    #[command(subcommand)]
    Ipam(ipam_cmd::IpamCommand),
    /// This node: its BGP sessions (`node status`), whether it can run margay
    /// (`node checksystem`), a diagnostics bundle (`node diags`).
    #[command(subcommand)]
    Node(node_cmd::NodeCommand),
    /// Change fields of one resource with a JSON merge patch (calicoctl's strategic merge
    /// patch: Calico's resources have no list merge keys, so lists are replaced whole).
    ///
    /// The resource is read, patched, validated and written back as a compare-and-swap on
    /// the version read: a concurrent change is never lost.
    #[command(after_help = "Examples:
  margay ctl patch ippool default-ipv4-ippool -p '{\"spec\":{\"natOutgoing\":false}}'
  margay ctl patch node node1 -p '{\"spec\":{\"bgp\":{\"routeReflectorClusterID\":\"224.0.0.1\"}}}'
  margay ctl patch networkpolicy allow-dns -n prod -p '{\"spec\":{\"order\":100}}'")]
    Patch(patch_cmd::PatchArgs),
    /// This client's version and commit, and the cluster's (ClusterInformation
    /// `calicoVersion` and `clusterType`).
    Version(cluster_cmd::VersionArgs),
    /// The datastore as a whole: `migrate lock|unlock|export|import` (moving from etcd to the
    /// Kubernetes datastore, as calicoctl does).
    #[command(subcommand)]
    Datastore(cluster_cmd::DatastoreCommand),
}

/// How the command may talk to the operator beyond its output streams.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ui {
    /// Draw a progress bar on the terminal's stderr for long batches.
    pub progress: bool,
}

/// Runs one `margay ctl` command.
pub fn run(
    args: CtlArgs,
    stdin: &mut dyn std::io::Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let ui = Ui {
        progress: std::io::stderr().is_terminal(),
    };
    run_with(args, stdin, out, err, &EnvConnector, ui)
}

/// Runs one command with the datastore reached through `connector`.
pub(crate) fn run_with<C: Connector>(
    args: CtlArgs,
    stdin: &mut dyn std::io::Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
    ui: Ui,
) -> u8 {
    let config = args.config.as_deref();
    let result = match args.command {
        CtlCommand::Selector(cmd) => selector_cmd::run(cmd, out, err),
        CtlCommand::Validate(a) => validate_cmd::run(&a, stdin, out, err),
        CtlCommand::Node(c) => node_cmd::run(&c, out, err),
        CtlCommand::Create(a) => datastore::runtime(err).map_or(Ok(EXIT_USAGE), |rt| {
            rt.block_on(write_cmd::run_create(
                &a, config, stdin, out, err, connector, ui,
            ))
        }),
        CtlCommand::Apply(a) => datastore::runtime(err).map_or(Ok(EXIT_USAGE), |rt| {
            rt.block_on(write_cmd::run_apply(
                &a, config, stdin, out, err, connector, ui,
            ))
        }),
        CtlCommand::Replace(a) => datastore::runtime(err).map_or(Ok(EXIT_USAGE), |rt| {
            rt.block_on(write_cmd::run_replace(
                &a, config, stdin, out, err, connector, ui,
            ))
        }),
        CtlCommand::Delete(a) => datastore::runtime(err).map_or(Ok(EXIT_USAGE), |rt| {
            rt.block_on(write_cmd::run_delete(
                &a, config, stdin, out, err, connector, ui,
            ))
        }),
        CtlCommand::Get(a) => datastore::runtime(err).map_or(Ok(EXIT_USAGE), |rt| {
            rt.block_on(get_cmd::run(&a, config, out, err, connector))
        }),
        CtlCommand::Label(a) => datastore::runtime(err).map_or(Ok(EXIT_USAGE), |rt| {
            rt.block_on(label_cmd::run(&a, config, out, err, connector))
        }),
        CtlCommand::Patch(a) => datastore::runtime(err).map_or(Ok(EXIT_USAGE), |rt| {
            rt.block_on(patch_cmd::run(&a, config, out, err, connector))
        }),
        CtlCommand::Version(a) => datastore::runtime(err).map_or(Ok(EXIT_USAGE), |rt| {
            rt.block_on(cluster_cmd::version(&a, config, out, err, connector))
        }),
        CtlCommand::Datastore(cluster_cmd::DatastoreCommand::Migrate(
            cluster_cmd::MigrateCommand::Export,
        )) => datastore::runtime(err).map_or(Ok(EXIT_USAGE), |rt| {
            rt.block_on(migrate_cmd::export(config, out, err, connector))
        }),
        CtlCommand::Datastore(cluster_cmd::DatastoreCommand::Migrate(
            cluster_cmd::MigrateCommand::Import(a),
        )) => datastore::runtime(err).map_or(Ok(EXIT_USAGE), |rt| {
            rt.block_on(migrate_cmd::import(&a, config, stdin, out, err, connector))
        }),
        CtlCommand::Datastore(cluster_cmd::DatastoreCommand::Migrate(m)) => datastore::runtime(err)
            .map_or(Ok(EXIT_USAGE), |rt| {
                rt.block_on(cluster_cmd::migrate(&m, config, out, err, connector))
            }),
        CtlCommand::Ipam(c) => datastore::runtime(err).map_or(Ok(EXIT_USAGE), |rt| {
            rt.block_on(ipam_cmd::run(&c, config, out, err, connector))
        }),
    };
    // A broken pipe (e.g. `| head`) is not worth a panic or a second error message.
    result.unwrap_or(EXIT_USAGE)
}
