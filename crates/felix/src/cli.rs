//! The `margay felix` command line.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use margay_datastore::Client;
use margay_felix_config::{DEFAULT_CONFIG_FILE, load};

use crate::daemon::{Daemon, DaemonOptions};
use crate::inputs::{LocalInputs, datastore_config, kernel_hostname, read_datastore_inputs};
use crate::status::{DEFAULT_SOCKET, StatusDoc, render, request};
use crate::{FelixError, LogSetters};

#[derive(Debug, Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "Configuration, as Calico's Felix: FELIX_<Parameter> environment variables, the config \
file (INI, -c), and the datastore's FelixConfiguration resources (`default`, node-selector scoped, \
`node.<hostname>`) and this node's Node. The datastore is the one DATASTORE_TYPE / DATASTORE_PATH / \
ETCD_ENDPOINTS name (the embedded store by default). Health: FELIX_HEALTHENABLED=true serves \
/liveness and /readiness on FELIX_HEALTHHOST:FELIX_HEALTHPORT (localhost:9099). Metrics: \
FELIX_PROMETHEUSMETRICSENABLED=true serves /metrics on port 9091. Logging: FELIX_LOGSEVERITYSCREEN \
(or --log-level, which wins).

Exit codes: 0 stopped by SIGTERM/SIGINT (the dataplane is left in place); 129 a configuration \
change needs a restart; 1 a fatal error.

Examples:
  # Run against the embedded store, with health and metrics.
  FELIX_HEALTHENABLED=true FELIX_PROMETHEUSMETRICSENABLED=true margay felix

  # What is Felix doing? Which policies apply to each local endpoint?
  margay felix status

  # Every configuration value that is set, and where it came from.
  margay felix config"
)]
pub struct FelixArgs {
    #[command(subcommand)]
    pub command: Option<FelixCommand>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum FelixCommand {
    /// Run the Felix daemon (the default when no command is given).
    Run(RunArgs),
    /// Print the effective configuration and where each value came from, computed as the
    /// daemon computes it (environment, config file, datastore).
    Config(ConfigArgs),
    /// Ask the running Felix what it is doing: health, sync, start-up timings, each local
    /// endpoint with its tiers and policies in order, IP sets, and resources it rejected.
    Status(StatusArgs),
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Felix's config file (INI; every section is read).
    #[arg(short = 'c', long = "config-file", value_name = "FILE", default_value = DEFAULT_CONFIG_FILE)]
    pub config_file: PathBuf,
    /// Where to serve the status API (`margay felix status`); `none` serves nothing.
    #[arg(long, value_name = "PATH", env = "MARGAY_FELIX_STATUS_SOCKET", default_value = DEFAULT_SOCKET)]
    pub status_socket: PathBuf,
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Felix's config file (INI; every section is read).
    #[arg(short = 'c', long = "config-file", value_name = "FILE", default_value = DEFAULT_CONFIG_FILE)]
    pub config_file: PathBuf,
    /// Show every parameter, not only those set by a source other than the defaults.
    #[arg(long)]
    pub all: bool,
    /// Print JSON (every parameter, with its source, default and description).
    #[arg(long)]
    pub json: bool,
    /// Leave the datastore out: only the environment and the config file.
    #[arg(long)]
    pub no_datastore: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The running Felix's status socket.
    #[arg(long, alias = "socket", value_name = "PATH", env = "MARGAY_FELIX_STATUS_SOCKET", default_value = DEFAULT_SOCKET)]
    pub status_socket: PathBuf,
    /// Print the raw JSON answer.
    #[arg(long)]
    pub json: bool,
    /// Ask for one part only: status, all (with the configuration), config, endpoints, ipsets,
    /// problems, bootstrap, health. Implies --json unless it is status or all.
    #[arg(value_name = "WHAT", default_value = "status")]
    pub what: String,
    /// Seconds to wait for the answer.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub timeout: u64,
}

/// Runs `margay felix ...`; returns the exit code.
pub fn run_felix(
    args: FelixArgs,
    logs: LogSetters,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    match args.command {
        None => run_daemon(args.run, logs, err),
        Some(FelixCommand::Run(run)) => run_daemon(run, logs, err),
        Some(FelixCommand::Config(c)) => run_config(c, out, err),
        Some(FelixCommand::Status(s)) => run_status(s, out, err),
    }
}

fn run_daemon(args: RunArgs, logs: LogSetters, err: &mut dyn Write) -> u8 {
    let socket = (args.status_socket.as_os_str() != "none").then_some(args.status_socket);
    let mut opts = DaemonOptions::from_process(args.config_file, socket);
    opts.log_level = logs.screen;
    opts.syslog_level = logs.syslog;
    opts.log_file = logs.file;
    let exit = Daemon::new(opts).run();
    if let crate::daemon::Exit::Failed(msg) = &exit {
        let _ = writeln!(err, "margay felix: {msg}");
    }
    exit.code()
}

fn run_status(args: StatusArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let what = args.what.to_ascii_lowercase();
    let answer = match request(
        &args.status_socket,
        &what,
        Duration::from_secs(args.timeout.max(1)),
    ) {
        Ok(a) => a,
        Err(e) => {
            let _ = writeln!(err, "margay felix status: {e}");
            return 2;
        }
    };
    let value: serde_json::Value = match serde_json::from_str(&answer) {
        Ok(v) => v,
        Err(e) => {
            let _ = writeln!(
                err,
                "margay felix status: the answer from {} is not JSON ({e}); is that socket Felix's?",
                args.status_socket.display()
            );
            return 2;
        }
    };
    // Still starting: say what it waits for (exit 1: not running yet).
    if value.get("starting").and_then(|v| v.as_bool()) == Some(true) {
        if args.json {
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&value).unwrap_or_default()
            );
        } else {
            match serde_json::from_value::<crate::status::StartingDoc>(value) {
                Ok(doc) => {
                    let _ = write!(out, "{}", crate::status::render_starting(&doc));
                }
                Err(e) => {
                    let _ = writeln!(
                        err,
                        "margay felix status: unexpected answer ({e}); try --json"
                    );
                }
            }
        }
        return 1;
    }
    if let Some(msg) = value.get("error").and_then(|e| e.as_str()) {
        let _ = writeln!(err, "margay felix status: felix answered: {msg}");
        return 1;
    }
    let raw = args.json || !(what == "status" || what == "all");
    if raw {
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
        return 0;
    }
    match serde_json::from_value::<StatusDoc>(value) {
        Ok(doc) => {
            let _ = write!(out, "{}", render(&doc));
            0
        }
        Err(e) => {
            let _ = writeln!(
                err,
                "margay felix status: unexpected answer ({e}); is felix the same version? try --json"
            );
            2
        }
    }
}

fn run_config(args: ConfigArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let (env, skipped) = margay_felix_config::utf8_env(std::env::vars_os());
    if let Some(w) = margay_felix_config::skipped_warning(&skipped) {
        let _ = writeln!(err, "margay felix config: warning: {w}");
    }
    match effective_config(&args, env) {
        Ok(loaded) => {
            if args.json {
                let _ = writeln!(
                    out,
                    "{}",
                    serde_json::to_string_pretty(&loaded.to_json()).unwrap_or_default()
                );
            } else {
                let _ = write!(out, "{}", loaded.render_table(!args.all));
            }
            0
        }
        Err((code, e)) => {
            let _ = writeln!(err, "margay felix config: {e}");
            code
        }
    }
}

/// The configuration as the daemon would load it now.
fn effective_config(
    args: &ConfigArgs,
    env: std::collections::BTreeMap<String, String>,
) -> Result<margay_felix_config::Loaded, (u8, String)> {
    let local = LocalInputs::read(env, &args.config_file, kernel_hostname())
        .map_err(|e| (2, e.to_string()))?;
    let local_loaded = load(&local.config_inputs()).map_err(|e| (1, e.to_string()))?;
    if args.no_datastore {
        return Ok(local_loaded);
    }
    let ds_cfg = datastore_config(&local.env, &local_loaded).map_err(|e| (2, e.to_string()))?;
    let hostname = local_loaded.config.felix_hostname.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| (2, FelixError::Runtime(e.to_string()).to_string()))?;
    let ds = rt.block_on(async {
        let backend = tokio::time::timeout(Duration::from_secs(10), ds_cfg.connect_existing())
            .await
            .map_err(|_| "no answer within 10s".to_string())?
            .map_err(|e| e.to_string())?;
        read_datastore_inputs(&Client::new(backend), &hostname)
            .await
            .map_err(|e| e.to_string())
    });
    let ds = ds.map_err(|e| {
        (
            2,
            format!(
                "cannot read configuration from the {}: {e} (fix the datastore settings, or pass \
                 --no-datastore to show the environment and config file only)",
                ds_cfg.describe()
            ),
        )
    })?;
    load(&ds.config_inputs(&local, &hostname)).map_err(|e| (1, e.to_string()))
}
