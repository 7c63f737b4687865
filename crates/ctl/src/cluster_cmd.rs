//! `version` and `datastore migrate lock|unlock`: the cluster-wide facts ClusterInformation
//! `default` holds (calicoctl's commands of the same names).

use std::io::Write;
use std::path::Path;

use clap::{Args, Subcommand};
use margay_api::{Kind, Resource, ResourceKey};
use margay_datastore::{Client, DatastoreError, KvBackend};

use crate::datastore::{Access, Connector, connect_or_report};
use crate::{EXIT_INVALID, EXIT_OK};

#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Only this client's version: no datastore is contacted.
    #[arg(long)]
    pub client: bool,
}

#[derive(Debug, Subcommand)]
pub enum DatastoreCommand {
    /// Moving between datastores (calicoctl's `datastore migrate`).
    #[command(subcommand)]
    Migrate(MigrateCommand),
}

#[derive(Debug, Subcommand)]
pub enum MigrateCommand {
    /// Mark the datastore not ready (ClusterInformation `datastoreReady: false`): Felix and
    /// the CNI plugin hold off, so IPAM and policy stay still while you migrate or clean up
    /// (the IPAM-leak runbook's `ipam release --from-report` wants it locked).
    #[command(after_help = "Example:
  margay ctl datastore migrate lock
  margay ctl ipam check -o report.json
  margay ctl ipam release --from-report report.json
  margay ctl datastore migrate unlock")]
    Lock,
    /// Mark the datastore ready again (`datastoreReady: true`).
    Unlock,
    /// Write the locked datastore's resources, ClusterInformation and IPAM state to standard
    /// output in calicoctl's migration format (from etcd or the embedded store).
    #[command(after_help = "Moving from etcd to the Kubernetes datastore:
  margay ctl datastore migrate lock
  margay ctl datastore migrate export > cluster.migrate
  DATASTORE_TYPE=kubernetes margay ctl datastore migrate import -f cluster.migrate
  # switch every component to DATASTORE_TYPE=kubernetes, check, then:
  DATASTORE_TYPE=kubernetes margay ctl datastore migrate unlock")]
    Export,
    /// Load an export into a Kubernetes datastore that has no Calico data yet; it is locked
    /// first and left locked (`unlock` once checked).
    Import(crate::migrate_cmd::ImportArgs),
}

/// The label width calicoctl pads `version`'s lines to (values start at column 20).
const LABEL: usize = 19;

fn version_line(out: &mut dyn Write, label: &str, value: &str) -> std::io::Result<()> {
    writeln!(out, "{:<LABEL$}{value}", format!("{label}:"))
}

/// This client's version (`margay --version` says the same).
pub(crate) fn client_version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The commit the binary was built from, as the binary recorded it ([`set_git_commit`]).
static GIT_COMMIT: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Called once by the binary, whose build knows the commit.
pub fn set_git_commit(commit: &'static str) {
    let _ = GIT_COMMIT.set(commit);
}

pub(crate) async fn version<C: Connector>(
    a: &VersionArgs,
    config: Option<&Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
) -> std::io::Result<u8> {
    version_line(out, "Client Version", &format!("v{}", client_version()))?;
    version_line(
        out,
        "Git commit",
        GIT_COMMIT.get().copied().unwrap_or("unknown"),
    )?;
    if a.client {
        return Ok(EXIT_OK);
    }
    let conn = match connect_or_report(connector, config, Access::Existing, err).await? {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    match cluster_information(&conn.client).await {
        Ok(ci) => {
            let (version, kind) = ci
                .as_ref()
                .map(|ci| (ci.spec.calico_version.clone(), ci.spec.cluster_type.clone()))
                .unwrap_or_default();
            let or_unknown = |s: String| if s.is_empty() { "unknown".into() } else { s };
            version_line(out, "Cluster Version", &or_unknown(version))?;
            version_line(out, "Cluster Type", &or_unknown(kind))?;
            Ok(EXIT_OK)
        }
        Err(e) => {
            writeln!(
                err,
                "error: unable to retrieve Cluster Version or Type: {e}"
            )?;
            Ok(EXIT_INVALID)
        }
    }
}

/// ClusterInformation `default`, or None where nothing has registered a node yet.
pub(crate) async fn cluster_information<B: KvBackend>(
    client: &Client<B>,
) -> Result<Option<margay_api::ClusterInformation>, DatastoreError> {
    let key = ResourceKey {
        kind: Kind::ClusterInformation,
        namespace: String::new(),
        name: "default".into(),
    };
    match client.get(&key).await {
        Ok(Resource::ClusterInformation(ci)) => Ok(Some(ci)),
        Ok(_) => Ok(None),
        Err(DatastoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

pub(crate) async fn migrate<C: Connector>(
    cmd: &MigrateCommand,
    config: Option<&Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
) -> std::io::Result<u8> {
    let conn = match connect_or_report(connector, config, Access::Existing, err).await? {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let (ready, what) = match cmd {
        MigrateCommand::Lock => (false, "locking"),
        MigrateCommand::Unlock => (true, "unlocking"),
        MigrateCommand::Export | MigrateCommand::Import(_) => return Ok(crate::EXIT_USAGE),
    };
    let ci = match cluster_information(&conn.client).await {
        Ok(Some(ci)) => ci,
        Ok(None) => {
            writeln!(
                err,
                "error: ClusterInformation \"default\" does not exist in {}: run `margay node startup` on a node first (it creates it)",
                conn.describe
            )?;
            return Ok(EXIT_INVALID);
        }
        Err(e) => {
            writeln!(err, "error retrieving ClusterInformation for {what}: {e}")?;
            return Ok(EXIT_INVALID);
        }
    };
    let mut ci = ci;
    ci.spec.datastore_ready = Some(ready);
    // A compare-and-swap on the version read: a concurrent change is never overwritten.
    if let Err(e) = conn.client.update(Resource::ClusterInformation(ci)).await {
        writeln!(err, "error updating ClusterInformation for {what}: {e}")?;
        return Ok(EXIT_INVALID);
    }
    writeln!(
        out,
        "{}",
        if ready {
            "Datastore unlocked."
        } else {
            "Datastore locked."
        }
    )?;
    Ok(EXIT_OK)
}
