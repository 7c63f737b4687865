//! The binary edge: `margay cni …` for people, and the plugin entry points the multi-call
//! binary calls when a runtime executes it as `margay` / `margay-ipam`.

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::Value;

use crate::config::env_from_process;
use crate::plugin::{self, PluginKind};

/// CNI plugins: margay (veth, routes, IPAM, WorkloadEndpoint) and margay-ipam (addresses only).
#[derive(Debug, Args)]
#[command(
    arg_required_else_help = true,
    after_help = "The margay binary is also the CNI plugin. Installed into the runtime's CNI binary
directory (`margay cni install`), a runtime executes it as `margay` (the main plugin, like
Calico's `calico`) or `margay-ipam` (IPAM only, like `calico-ipam`), with CNI_COMMAND and the
other CNI_* variables set and the network configuration on stdin. Results and errors are CNI
JSON on stdout; logs go to the config's log_file_path, else stderr.

An existing Calico conflist works with \"type\": \"margay\" (the IPAM type may stay
\"calico-ipam\" or become \"margay-ipam\"). The datastore is the one the rest of margay uses
(DATASTORE_TYPE, DATASTORE_PATH, ETCD_* variables), or the config's datastore_type and etcd_*
fields. The node name is the config's nodename, else /var/lib/calico/nodename (written by
`margay node startup`, and required unless nodename_file_optional), else the host name.
Addresses are serialised per host by /var/run/calico/ipam.lock (ipam_lock_file).

Example conflist (/etc/cni/net.d/10-margay.conflist):
  {
    \"cniVersion\": \"1.0.0\",
    \"name\": \"k8s-pod-network\",
    \"plugins\": [
      {\"type\": \"margay\", \"mtu\": 1450, \"log_file_path\": \"/var/log/calico/cni/cni.log\",
       \"ipam\": {\"type\": \"margay-ipam\", \"assign_ipv4\": \"true\", \"assign_ipv6\": \"false\"}},
      {\"type\": \"portmap\", \"capabilities\": {\"portMappings\": true}, \"snat\": true},
      {\"type\": \"bandwidth\", \"capabilities\": {\"bandwidth\": true}}
    ]
  }

Try it by hand:
  echo '{\"cniVersion\":\"1.1.0\"}' | CNI_COMMAND=VERSION margay"
)]
pub struct CniArgs {
    #[command(subcommand)]
    pub command: CniCommand,
}

#[derive(Debug, Subcommand)]
pub enum CniCommand {
    /// Install this binary as the `margay` and `margay-ipam` plugins (atomic, idempotent).
    Install(InstallArgs),
    /// Act as the main plugin (as if executed as `margay` by a runtime; reads CNI_* and stdin).
    Plugin,
    /// Act as the IPAM plugin (as if executed as `margay-ipam`).
    Ipam,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The runtime's CNI binary directory.
    #[arg(long, value_name = "DIR", default_value = crate::install::DEFAULT_BIN_DIR)]
    pub dir: PathBuf,
}

/// Runs `margay cni …`.
pub fn run_cni(args: CniArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    match args.command {
        CniCommand::Install(a) => crate::install::run(&a.dir, out, err),
        CniCommand::Plugin => plugin_main(PluginKind::Main),
        CniCommand::Ipam => plugin_main(PluginKind::Ipam),
    }
}

/// Calico's log level names as a tracing filter.
fn level_filter(level: &str) -> &'static str {
    match level.trim().to_ascii_lowercase().as_str() {
        "panic" | "fatal" | "error" => "error",
        "warning" | "warn" => "warn",
        "debug" => "debug",
        "trace" => "trace",
        "none" => "off",
        _ => "info",
    }
}

/// Sends logs where the network configuration says (log_file_path, else stderr); never to
/// stdout, which carries the result.
fn init_logging(stdin: &[u8]) {
    let v: Value = serde_json::from_slice(stdin).unwrap_or(Value::Null);
    let level = v
        .get("log_level")
        .and_then(Value::as_str)
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .or_else(|| std::env::var("MARGAY_LOG_LEVEL").ok())
        .unwrap_or_else(|| "info".to_string());
    let filter = tracing_subscriber::EnvFilter::new(level_filter(&level));
    let file = v
        .get("log_file_path")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .and_then(|p| {
            let path = std::path::Path::new(p);
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .ok()
        });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_target(false);
    let _ = match file {
        Some(f) => builder.with_writer(std::sync::Mutex::new(f)).try_init(),
        None => builder.with_writer(std::io::stderr).try_init(),
    };
}

/// The plugin's entry point: reads stdin and the environment, answers on stdout.
pub fn plugin_main(kind: PluginKind) -> u8 {
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        let err = crate::spec::CniError::new(
            crate::spec::code::IO_FAILURE,
            "cannot read the network configuration from stdin",
        )
        .with_details(e);
        println!("{}", err.to_json(&crate::spec::LATEST.to_string()));
        return 1;
    }
    init_logging(&stdin);
    let env = env_from_process();
    let span = tracing::info_span!(
        "cni",
        cmd = env.get("CNI_COMMAND").map(String::as_str).unwrap_or(""),
        container = env
            .get("CNI_CONTAINERID")
            .map(|c| c.chars().take(12).collect::<String>())
            .unwrap_or_default()
    );
    let _entered = span.enter();
    let mut out = std::io::stdout().lock();
    plugin::run(kind, &env, &stdin, &mut out)
}

/// How the multi-call binary should treat an invocation, from argv[0] and the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invocation {
    Plugin(PluginKind),
    /// Not a plugin call: parse the command line.
    Cli,
}

/// `margay-ipam` / `calico-ipam` → the IPAM plugin; `margay` / `calico` with CNI_COMMAND set
/// and no arguments → the main plugin; anything else is the normal command line.
pub fn invocation(argv0: &str, extra_args: usize, cni_command_set: bool) -> Invocation {
    let name = std::path::Path::new(argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match name.as_str() {
        "margay-ipam" | "calico-ipam" => Invocation::Plugin(PluginKind::Ipam),
        "margay" | "calico" if cni_command_set && extra_args == 0 => {
            Invocation::Plugin(PluginKind::Main)
        }
        _ => Invocation::Cli,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatch_by_name_and_environment() {
        assert_eq!(
            invocation("/opt/cni/bin/margay-ipam", 0, true),
            Invocation::Plugin(PluginKind::Ipam)
        );
        assert_eq!(
            invocation("calico-ipam", 3, false),
            Invocation::Plugin(PluginKind::Ipam)
        );
        assert_eq!(
            invocation("/opt/cni/bin/margay", 0, true),
            Invocation::Plugin(PluginKind::Main)
        );
        assert_eq!(invocation("margay", 0, false), Invocation::Cli);
        // A person running `margay ctl get …` with CNI_COMMAND left in the environment.
        assert_eq!(invocation("margay", 2, true), Invocation::Cli);
        assert_eq!(invocation("calicoctl", 0, true), Invocation::Cli);
        assert_eq!(level_filter("Warning"), "warn");
        assert_eq!(level_filter(""), "info");
    }
}
