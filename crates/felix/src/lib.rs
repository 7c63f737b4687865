//! `margay felix`: Felix, the per-node policy daemon.
//!
//! Start-up follows Calico's `daemon.Run`: configuration from the environment, the config
//! file and the datastore (retried until it loads and the datastore is ready), the
//! encapsulation the IP pools call for, the dataplane driver, the syncer, the validation
//! filter, the calculation graph and the connector to the driver; health, metrics and the
//! status API alongside. See `DESIGN.md` in this crate and the Felix section of
//! ARCHITECTURE.md for the threads and the invariants.
#![forbid(unsafe_code)]

pub mod blocks;
pub mod bootstrap;
pub mod cli;
pub mod daemon;
pub mod dataplane_config;
pub mod flows;
pub mod flows_cli;
pub mod health;
pub mod inputs;
pub mod metrics;
pub mod metrics_tls;
pub mod status;
pub mod typha_feed;

use std::path::PathBuf;

/// Why Felix (or one of its commands) could not do what was asked. Every message says what
/// is wrong and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum FelixError {
    #[error("cannot read the config file {}: {reason} (fix its permissions or point -c/--config-file elsewhere)", path.display())]
    ConfigFile { path: PathBuf, reason: String },
    #[error("invalid Felix configuration: {0}")]
    Config(String),
    #[error("datastore: {0}")]
    Datastore(String),
    #[error("status socket {}: {reason}", path.display())]
    StatusSocket { path: PathBuf, reason: String },
    #[error("cannot ask felix for its status: {reason} at {} (is felix running? point --status-socket or MARGAY_FELIX_STATUS_SOCKET at its socket)", path.display())]
    StatusClient { path: PathBuf, reason: String },
    #[error("{0}")]
    Unsupported(String),
    #[error("cannot start: {0}")]
    Runtime(String),
}

/// Sets the screen log level (a tracing filter such as `info`); the binary provides it, since
/// only the binary owns the subscriber.
pub type LogLevelSetter = std::sync::Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// The log destinations Felix configures once its configuration is loaded.
#[derive(Clone, Default)]
pub struct LogSetters {
    /// LogSeverityScreen (None: leave the screen level alone, e.g. `--log-level` was given).
    pub screen: Option<LogLevelSetter>,
    /// LogSeveritySys: `off` disconnects; any other level connects to the local syslog
    /// socket, failing when there is none.
    pub syslog: Option<LogLevelSetter>,
    /// LogFilePath + LogSeverityFile (None: `--log-file` fixed the file).
    pub file: Option<margay_logging::FileSetter>,
}

pub use margay_logging::calico_level;
