//! Choosing and reaching the datastore: `--config FILE`, else calicoctl's default config file
//! if it exists, else the environment.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use margay_datastore::config::DEFAULT_CTL_CONFIG;
use margay_datastore::{AnyBackend, Client, DatastoreConfig, DatastoreError, KvBackend};

use crate::{EXIT_INVALID, EXIT_USAGE};

/// How long connecting and the first request may take before the datastore is reported
/// unreachable (the etcd client has its own, shorter, timeouts; this is the last resort).
const REACH_TIMEOUT: Duration = Duration::from_secs(30);

/// A connected client and a description of where it points, for messages.
pub(crate) struct Connection<B> {
    pub client: Client<B>,
    pub describe: String,
    /// The Kubernetes datastore, where some kinds are derived from Kubernetes objects and
    /// `margay ctl` must not write them.
    pub kubernetes: bool,
    /// Something the operator should know about where the data came from (stderr).
    pub note: Option<String>,
}

/// Why no connection could be made, and the exit code to report it with.
#[derive(Debug)]
pub(crate) struct ConnectFailure {
    pub message: String,
    pub code: u8,
}

/// What a command does to the store: only `create` and `apply` may bring a new embedded
/// store into being; reading or changing existing resources needs one that exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    MayCreate,
    Existing,
    /// Reading only (`get`): an embedded store nothing has been written to yet reads as an
    /// empty one, as a fresh etcd does.
    Read,
}

/// Opens the datastore for a command. The real implementation reads the configuration; tests
/// hand out an in-memory store.
pub(crate) trait Connector {
    type Backend: KvBackend + Clone;

    async fn connect(
        &self,
        config: Option<&Path>,
        access: Access,
    ) -> Result<Connection<Self::Backend>, ConnectFailure>;
}

/// The datastore named by `--config`, /etc/calico/calicoctl.cfg or the environment.
pub(crate) struct EnvConnector;

impl Connector for EnvConnector {
    type Backend = AnyBackend;

    async fn connect(
        &self,
        config: Option<&Path>,
        access: Access,
    ) -> Result<Connection<AnyBackend>, ConnectFailure> {
        let cfg = resolve(config).map_err(|message| ConnectFailure {
            message,
            code: EXIT_USAGE,
        })?;
        let describe = cfg.describe();
        let kubernetes = cfg.datastore_type == margay_datastore::DatastoreType::Kubernetes;
        let unreachable = |reason: String| ConnectFailure {
            message: format!("cannot reach the datastore ({describe}): {reason}"),
            code: EXIT_INVALID,
        };
        if access == Access::Read
            && cfg.datastore_type == margay_datastore::DatastoreType::Local
            && could_be_created(&cfg.local_path)
        {
            return Ok(Connection {
                client: Client::new(AnyBackend::Mem(margay_datastore::MemBackend::new())),
                note: Some(format!(
                    "note: nothing has been stored at {} yet (DATASTORE_PATH); it reads as empty",
                    cfg.local_path.display()
                )),
                describe,
                kubernetes,
            });
        }
        let open = async {
            match access {
                Access::MayCreate => cfg.connect().await,
                Access::Existing | Access::Read => cfg.connect_existing().await,
            }
        };
        let backend = match tokio::time::timeout(REACH_TIMEOUT, open).await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => return Err(unreachable(why(e))),
            Err(_) => return Err(unreachable(format!("no answer within {REACH_TIMEOUT:?}"))),
        };
        // Connecting may be lazy: one cheap request tells now, with a clear message, whether
        // the store answers, instead of a failure per resource later.
        match tokio::time::timeout(REACH_TIMEOUT, backend.revision()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(unreachable(why(e))),
            Err(_) => return Err(unreachable(format!("no answer within {REACH_TIMEOUT:?}"))),
        }
        Ok(Connection {
            client: Client::new(backend),
            describe,
            kubernetes,
            note: None,
        })
    }
}

/// An embedded store that does not exist yet but could (its nearest existing ancestor is a
/// directory): nothing has been written to it. A path that can never hold a store (under a
/// regular file) is not one: opening it reports why.
fn could_be_created(path: &Path) -> bool {
    if path.exists() {
        return false;
    }
    path.ancestors()
        .skip(1)
        .find(|a| a.exists())
        .is_some_and(Path::is_dir)
}

/// The reason without the "datastore unavailable"/"invalid" prefix the message already says.
fn why(e: DatastoreError) -> String {
    match e {
        DatastoreError::Unavailable { reason } | DatastoreError::Invalid { reason } => reason,
        other => other.to_string(),
    }
}

/// The largest datastore config file read: a CalicoAPIConfig is a few settings (an inline
/// kubeconfig with certificates is tens of KB).
const MAX_CONFIG_FILE: u64 = 1 << 20;

/// Reads a CalicoAPIConfig file, refusing a regular file over [`MAX_CONFIG_FILE`] unread.
fn from_file(path: &Path) -> Result<DatastoreConfig, String> {
    if std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() > MAX_CONFIG_FILE) {
        return Err(format!(
            "the datastore config file {} is larger than {} MiB; is it the right file?",
            path.display(),
            MAX_CONFIG_FILE >> 20
        ));
    }
    DatastoreConfig::from_file(path).map_err(why)
}

/// The datastore configuration, as calicoctl finds it.
fn resolve(config: Option<&Path>) -> Result<DatastoreConfig, String> {
    if let Some(path) = config {
        if !path.exists() {
            return Err(format!(
                "the datastore config file {} does not exist",
                path.display()
            ));
        }
        return from_file(path);
    }
    let default = Path::new(DEFAULT_CTL_CONFIG);
    if default.exists() {
        return from_file(default);
    }
    DatastoreConfig::from_env().map_err(|e| format!("datastore configuration: {}", why(e)))
}

/// A current-thread runtime for one command, or None after reporting why there is none.
pub(crate) fn runtime(err: &mut dyn Write) -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            let _ = writeln!(err, "error: cannot start the async runtime: {e}");
            None
        }
    }
}

/// Connects, or reports why not and returns the exit code.
pub(crate) async fn connect_or_report<C: Connector>(
    connector: &C,
    config: Option<&Path>,
    access: Access,
    err: &mut dyn Write,
) -> std::io::Result<Result<Connection<C::Backend>, u8>> {
    match connector.connect(config, access).await {
        Ok(c) => {
            if let Some(note) = &c.note {
                writeln!(err, "{note}")?;
            }
            Ok(Ok(c))
        }
        Err(f) => {
            writeln!(err, "error: {}", f.message)?;
            Ok(Err(f.code))
        }
    }
}
