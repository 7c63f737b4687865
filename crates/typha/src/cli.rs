//! `margay typha` commands.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::bench::BenchArgs;
use crate::config::DEFAULT_CONFIG_FILE;

/// margay typha: the fan-out cache between the datastore and Felix (like calico-typha).
#[derive(Debug, Args)]
#[command(
    after_help = "Typha reads TYPHA_* variables (Calico's names: TYPHA_SERVERPORT, TYPHA_HEALTHENABLED, \
TYPHA_SERVERKEYFILE, TYPHA_CLIENTCN, …) over /etc/calico/typha.cfg, and reaches the datastore like every \
other role (DATASTORE_TYPE, DATASTORE_PATH, ETCD_ENDPOINTS, KUBECONFIG, …). It serves clients on port \
5473, health on 9098 and metrics on 9093. SIGTERM moves every client to another Typha before it exits.

Connection limit: over it, clients are asked to move to another Typha. TYPHA_MAXCONNECTIONS fixes it \
(margay's); otherwise TYPHA_CONNECTIONREBALANCINGMODE=kubernetes recomputes it every \
TYPHA_K8SSERVICEPOLLINTERVALSECS (30) with Calico's formula from the Typhas in its own Service (the \
EndpointSlices of TYPHA_K8SSERVICENAME, default calico-typha, in TYPHA_K8SNAMESPACE, default \
kube-system, with a port named TYPHA_K8SPORTNAME, default calico-typha; reached with the datastore's \
Kubernetes settings, or in-cluster) and the nodes its syncer sees, between \
TYPHA_MAXCONNECTIONSLOWERLIMIT (400) and TYPHA_MAXCONNECTIONSUPPERLIMIT (10000). The default mode, \
none, uses TYPHA_CLUSTERNODES and TYPHA_REPLICAS (margay's) when both are known, else the upper \
limit. Felix and confd find Typha through the same Service with FELIX_TYPHAK8SSERVICENAME."
)]
pub struct TyphaArgs {
    /// The config file (INI; missing is fine).
    #[arg(long, short = 'c', value_name = "FILE", env = "TYPHA_CONFIG_FILE", default_value = DEFAULT_CONFIG_FILE, global = true)]
    pub config_file: PathBuf,
    #[command(subcommand)]
    pub command: Option<TyphaCommand>,
}

#[derive(Debug, Subcommand)]
pub enum TyphaCommand {
    /// Run Typha (the default).
    Run,
    /// Benchmark a real Typha process on loopback: clients joining a snapshot, update fan-out
    /// latency, memory per client.
    Bench(BenchArgs),
}

/// The screen log level Typha starts with (TYPHA_LOGSEVERITYSCREEN, Calico's names).
pub fn log_level_from_env() -> String {
    match std::env::var("TYPHA_LOGSEVERITYSCREEN")
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
        .as_str()
    {
        "debug" => "debug",
        "warning" | "warn" => "warn",
        "error" | "critical" | "fatal" | "panic" => "error",
        "none" => "off",
        _ => "info",
    }
    .to_string()
}

/// Whether the command runs the daemon (for log set-up).
pub fn runs_daemon(args: &TyphaArgs) -> bool {
    matches!(args.command, None | Some(TyphaCommand::Run))
}

/// Runs a `margay typha` command; returns the exit code.
pub fn run_typha(
    args: TyphaArgs,
    log_file: Option<margay_logging::FileSetter>,
    out: &mut dyn std::io::Write,
) -> u8 {
    match args.command {
        None | Some(TyphaCommand::Run) => {
            let mut opts = crate::daemon::DaemonOptions::from_process(args.config_file);
            opts.log_file = log_file;
            crate::daemon::run(opts)
        }
        Some(TyphaCommand::Bench(b)) => crate::bench::run(b, out),
    }
}
