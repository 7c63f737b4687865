//! `margay kube-controllers`: run the controllers, or check the status file as Calico's
//! `check-status` does.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::config::parse_log_level;
use crate::daemon::{Daemon, DaemonOptions, LogLevelSetter};
use crate::status::{DEFAULT_STATUS_FILE, StatusFile};

pub const EXIT_OK: u8 = 0;
pub const EXIT_FAILED: u8 = 1;
pub const EXIT_USAGE: u8 = 2;

/// margay kube-controllers: Calico's calico-kube-controllers.
#[derive(Debug, Args)]
#[command(after_help = "\
Controllers (ENABLED_CONTROLLERS, or the KubeControllersConfiguration \"default\"):
  node              IPAM garbage collection: an address whose pod is gone (or no longer holds it)
                    is released once it stayed so for longer than leakGracePeriod (default 15m;
                    0 reports candidates without releasing; unset turns this off); an address on
                    a deleted Kubernetes Node is released at once once its pod is gone; a deleted
                    node's tunnel addresses, block affinities and empty blocks go once it holds
                    no address in use; empty blocks of live nodes lose their affinity after the
                    grace period (never a node's last one). Addresses of unknown origin (no pod
                    or tunnel attributes) are never released. Full scans every leakGracePeriod/2
                    and after pod/node deletions. In etcd mode it also deletes Calico Nodes whose
                    Kubernetes Node is gone.
  policy            (etcd) Kubernetes NetworkPolicies -> NetworkPolicies knp.default.<name>
  namespace         (etcd) Namespaces -> Profiles kns.<namespace>
  serviceaccount    (etcd) ServiceAccounts -> Profiles ksa.<namespace>.<name>
  workloadendpoint  (etcd) Pod labels and service accounts -> WorkloadEndpoints
  loadbalancer      LoadBalancer IPAM (allowedUses: [LoadBalancer] pools)
Pods and nodes always come from the Kubernetes API (KUBECONFIG, K8S_API_ENDPOINT, … or the
in-cluster service account).

Settings: the KubeControllersConfiguration \"default\" (created with Calico's defaults when missing;
its status shows the running configuration), overridden by LOG_LEVEL, ENABLED_CONTROLLERS,
RECONCILER_PERIOD (mirror controllers), COMPACTION_PERIOD (etcd), HEALTH_ENABLED, SYNC_NODE_LABELS
and AUTO_HOST_ENDPOINTS. DATASTORE_TYPE defaults to etcdv3 here (as Calico's kube-controllers):
etcdv3 needs ETCD_ENDPOINTS; kubernetes reads Calico's custom resources. A change of the running
configuration restarts the controllers.

Health: the status file (--status-file, read by `check-status -r`), and with --health-port
/liveness, /readiness and /status/status.json. Metrics (Calico's ipam_* names) on the resource's
prometheusMetricsPort (unset or 0: none).")]
pub struct KubeControllersArgs {
    #[command(subcommand)]
    pub command: Option<KubeControllersCommand>,
    /// Where the readiness status is written (Calico's --status-file).
    #[arg(long, value_name = "FILE", default_value = DEFAULT_STATUS_FILE, global = true)]
    pub status_file: PathBuf,
    /// Serve /liveness and /readiness on this port (0: no health server, Calico's default).
    #[arg(long, value_name = "PORT", default_value_t = 0, global = true)]
    pub health_port: u16,
}

#[derive(Debug, Subcommand)]
pub enum KubeControllersCommand {
    /// Run the controllers (the default).
    Run,
    /// Exit 0 if the status file says ready (Calico's check-status; -l and -r both check
    /// readiness, as Calico's do).
    CheckStatus(CheckStatusArgs),
}

#[derive(Debug, Args)]
pub struct CheckStatusArgs {
    /// Check readiness.
    #[arg(short = 'r', long = "ready")]
    pub ready: bool,
    /// Check liveness.
    #[arg(short = 'l', long = "live")]
    pub live: bool,
    /// The status file.
    #[arg(short = 'f', long = "file", value_name = "FILE", default_value = DEFAULT_STATUS_FILE)]
    pub file: PathBuf,
}

/// Whether the command runs the daemon (for log set-up).
pub fn runs_daemon(args: &KubeControllersArgs) -> bool {
    matches!(args.command, None | Some(KubeControllersCommand::Run))
}

/// The log level the daemon starts with (LOG_LEVEL, Calico's names; info by default).
pub fn log_level_from_env() -> String {
    std::env::var("LOG_LEVEL")
        .ok()
        .and_then(|v| parse_log_level(&v))
        .map_or("info", |(l, _)| l)
        .to_string()
}

/// Runs a `margay kube-controllers` command; returns the exit code. `set_level`: applies the
/// running configuration's log level (None when the command line fixed it).
pub fn run_kube_controllers(
    args: KubeControllersArgs,
    set_level: Option<LogLevelSetter>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    match args.command {
        Some(KubeControllersCommand::CheckStatus(c)) => check_status(&c, out),
        None | Some(KubeControllersCommand::Run) => {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = writeln!(err, "error: cannot start the runtime: {e}");
                    return EXIT_FAILED;
                }
            };
            let code = rt.block_on(run(args, set_level, err));
            rt.shutdown_timeout(Duration::from_secs(2));
            code
        }
    }
}

async fn run(
    args: KubeControllersArgs,
    set_level: Option<LogLevelSetter>,
    err: &mut dyn Write,
) -> u8 {
    let mut opts = match DaemonOptions::from_lookup(|k| std::env::var(k).ok()) {
        Ok(o) => o,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            return EXIT_USAGE;
        }
    };
    opts.status_file = Some(args.status_file);
    if args.health_port != 0 {
        opts.health_listen = Some(SocketAddr::from(([0, 0, 0, 0], args.health_port)));
    }
    opts.log_level = set_level;
    let daemon = match Daemon::start(opts).await {
        Ok(d) => d,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            return EXIT_USAGE;
        }
    };
    let stopper = daemon.stopper();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        let s = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!("{s}: stopping");
        let _ = stopper.send(true);
    });
    match daemon.wait().await {
        Ok(()) => EXIT_OK,
        Err(e) => {
            tracing::error!("{e}");
            let _ = writeln!(err, "error: {e}");
            EXIT_FAILED
        }
    }
}

fn check_status(c: &CheckStatusArgs, out: &mut dyn Write) -> u8 {
    if !c.ready && !c.live {
        let _ = writeln!(out, "No command specified to check-status (use -r or -l)");
        return EXIT_FAILED;
    }
    let st: StatusFile = match std::fs::read(&c.file)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(out, "Failed to read status file {}: {e}", c.file.display());
            return EXIT_FAILED;
        }
    };
    if st.ready() {
        let _ = writeln!(out, "Ready");
        EXIT_OK
    } else {
        let _ = writeln!(out, "{}", st.not_ready());
        EXIT_FAILED
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::DatastoreKind;

    #[test]
    fn check_status_reads_calicos_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("status.json");
        let args = |ready| CheckStatusArgs {
            ready,
            live: !ready,
            file: f.clone(),
        };
        let mut out = Vec::new();
        assert_eq!(check_status(&args(true), &mut out), EXIT_FAILED);
        assert!(String::from_utf8_lossy(&out).contains("Failed to read status file"));
        std::fs::write(
            &f,
            r#"{"Readiness":{"Startup":{"Ready":true,"Reason":""},"KubeAPIServer":{"Ready":false,"Reason":"Error reaching apiserver"}}}"#,
        )
        .unwrap();
        let mut out = Vec::new();
        assert_eq!(check_status(&args(false), &mut out), EXIT_FAILED);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "KubeAPIServer: Error reaching apiserver\n"
        );
        std::fs::write(
            &f,
            r#"{"Readiness":{"Startup":{"Ready":true,"Reason":""}}}"#,
        )
        .unwrap();
        let mut out = Vec::new();
        assert_eq!(check_status(&args(true), &mut out), EXIT_OK);
        assert_eq!(String::from_utf8_lossy(&out), "Ready\n");
    }

    #[test]
    fn environment_is_checked_before_anything_runs() {
        let e = DaemonOptions::from_lookup(|k| (k == "DATASTORE_TYPE").then(|| "local".into()))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("DATASTORE_TYPE"), "{e}");
        let e = DaemonOptions::from_lookup(|k| (k == "DATASTORE_TYPE").then(|| "etcdv3".into()))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("ETCD_ENDPOINTS"), "{e}");
        let o = DaemonOptions::from_lookup(|k| match k {
            "ETCD_ENDPOINTS" => Some("http://127.0.0.1:2379".into()),
            _ => None,
        })
        .ok()
        .unwrap();
        assert_eq!(o.kind, DatastoreKind::Etcd);
        let o = DaemonOptions::from_lookup(|k| match k {
            "DATASTORE_TYPE" => Some("kubernetes".into()),
            _ => None,
        })
        .ok()
        .unwrap();
        assert_eq!(o.kind, DatastoreKind::Kubernetes);
        assert_eq!(
            o.datastore.datastore_type,
            margay_datastore::DatastoreType::Kubernetes
        );
    }
}
