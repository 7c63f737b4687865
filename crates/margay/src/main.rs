//! The `margay` multi-call binary: dispatches to a role by subcommand (or by the name it was
//! invoked as, e.g. a `calicoctl` symlink). No logic of its own lives here.
#![forbid(unsafe_code)]

mod bpf_cmd;
mod docs;

use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// `margay --version`: the release, the commit it was built from and that commit's date.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("MARGAY_GIT_COMMIT"),
    ", ",
    env!("MARGAY_COMMIT_DATE"),
    ")"
);

/// margay: Kubernetes node networking and network policy, compatible with Project Calico.
#[derive(Debug, Parser)]
#[command(
    name = "margay",
    version = VERSION,
    about = "margay: Kubernetes node networking and network policy, compatible with Project Calico",
    long_about = None,
    propagate_version = true
)]
struct Cli {
    /// Log level for diagnostics on stderr: panic, fatal, error, warning, info, debug, trace or
    /// none (Calico's names, any case), or a filter like `info,margay_felix=debug`. Defaults
    /// to the role's own setting (calico-node's CALICO_STARTUP_LOGLEVEL for `node`), else warn.
    #[arg(long, global = true, value_name = "LEVEL", env = "MARGAY_LOG_LEVEL")]
    log_level: Option<String>,

    /// Layout of log lines: `text` (the default), `calico` (Calico's
    /// `2026-11-25 06:40:00.123 [INFO][pid] file.rs 12: message key="value"`, for parsers written
    /// for Calico's logs) or `json` (one object per line: time, level, msg, file, line, fields).
    /// Applies to the screen and the log file. Times are UTC.
    #[arg(long, global = true, value_name = "FORMAT", env = "MARGAY_LOG_FORMAT")]
    log_format: Option<String>,

    /// Also write the log to this file, at the screen's level, rotated by size
    /// (MARGAY_LOG_FILE_MAX_BYTES, default 10000000; MARGAY_LOG_FILE_KEEP old files, default
    /// 5) and reopened if logrotate moves it. For Felix and Typha it replaces their own
    /// LogFilePath / LogSeverityFile settings.
    #[arg(long, global = true, value_name = "PATH", env = "MARGAY_LOG_FILE")]
    log_file: Option<std::path::PathBuf>,

    #[command(subcommand)]
    role: Role,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// The operator's CLI (like calicoctl): selectors, validation, resources.
    Ctl(margay_ctl::CtlArgs),
    /// Node registration and health (like calico-node -startup / -felix-live).
    Node(margay_node::cli::NodeArgs),
    /// The per-node policy daemon (like calico-node -felix): run it, see its status and its
    /// configuration.
    Felix(margay_felix::cli::FelixArgs),
    /// The recent connections Felix saw on this node and the rule that decided each (like
    /// `hubble observe`; needs FlowLogsLocalReporter=Enabled).
    Flows(margay_felix::flows_cli::FlowsArgs),
    /// The CNI plugins (like calico / calico-ipam): install them, or see how they are used.
    Cni(margay_cni::cli::CniArgs),
    /// A real multi-node cluster on this machine, in network namespaces: the demo and the
    /// end-to-end test bed.
    Lab(margay_lab::LabArgs),
    /// The fan-out cache between the datastore and Felix (like calico-typha): run it, or
    /// benchmark it.
    Typha(margay_typha::cli::TyphaArgs),
    /// Keeps BIRD's BGP configuration in step with the datastore (like confd with Calico's
    /// BIRD templates): renders bird.cfg / bird6.cfg, checks them, reconfigures BIRD.
    Confd(margay_confd::cli::ConfdArgs),
    /// Cluster-wide controllers (like calico-kube-controllers): IPAM garbage collection, clean-up
    /// of deleted nodes, and in etcd mode the copies of Kubernetes policies, namespaces, service
    /// accounts and pod labels.
    KubeControllers(margay_kube_controllers::cli::KubeControllersArgs),
    /// Inspect the eBPF dataplane's pinned programs and maps (like calico-node -bpf).
    Bpf(bpf_cmd::BpfArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(after_help = "Examples:\n  \
        margay completion bash > /etc/bash_completion.d/margay\n  \
        margay completion zsh > \"${fpath[1]}/_margay\"\n  \
        margay completion fish > ~/.config/fish/completions/margay.fish")]
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write man pages for every command (margay(1), margay-felix(8), margay-ctl-get(1), ...).
    #[command(after_help = "Example:\n  margay man --dir /usr/local/share/man/man8 \
        (daemons' pages end in .8, the others in .1; install each in its section's directory)")]
    Man {
        /// Directory to write the pages to (created if missing).
        #[arg(long, value_name = "DIR", default_value = ".")]
        dir: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    margay_ctl::set_git_commit(env!("MARGAY_GIT_COMMIT"));
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Executed by a container runtime as a CNI plugin (`margay-ipam`, or `margay` with
    // CNI_COMMAND set and no arguments): the plugin sets up its own logging (never stdout).
    let argv0 = args.first().map(|a| a.to_string_lossy().into_owned());
    if let margay_cni::cli::Invocation::Plugin(kind) = margay_cni::cli::invocation(
        argv0.as_deref().unwrap_or_default(),
        args.len().saturating_sub(1),
        std::env::var_os("CNI_COMMAND").is_some(),
    ) {
        return ExitCode::from(margay_cni::cli::plugin_main(kind));
    }
    // Invoked through a `calicoctl` link: behave as `margay ctl`.
    let invoked_as = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if invoked_as == "calicoctl" {
        args.insert(1, "ctl".into());
    }
    // Kubernetes probes call `-felix-live -felix-ready` with single dashes.
    if args.get(1).is_some_and(|a| a == "node") && args.get(2).is_some_and(|a| a == "health") {
        margay_node::cli::normalize_health_args(&mut args[3..]);
    }
    let cli = Cli::parse_from(args);
    // `margay cni plugin|ipam` log as the plugin does; `install` only prints.
    let cli = match cli {
        Cli {
            role: Role::Cni(cni),
            ..
        } => {
            let code =
                margay_cni::cli::run_cni(cni, &mut io::stdout().lock(), &mut io::stderr().lock());
            let _ = io::stdout().flush();
            return ExitCode::from(code);
        }
        other => other,
    };
    let explicit_level = cli.log_level.is_some();
    let given_level = match cli
        .log_level
        .as_deref()
        .map(margay_logging::log_filter)
        .transpose()
    {
        Ok(level) => level,
        Err(e) => {
            eprintln!("margay: {e}");
            return ExitCode::from(2);
        }
    };
    let format: margay_logging::Format = match cli.log_format.as_deref().unwrap_or("").parse() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("margay: {e}");
            return ExitCode::from(2);
        }
    };
    let rotation = match margay_logging::Rotation::from_env() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("margay: {e}");
            return ExitCode::from(2);
        }
    };
    let level = given_level.unwrap_or_else(|| match &cli.role {
        Role::Ctl(_) => "warn".to_string(),
        Role::Node(_) => calico_level(std::env::var("CALICO_STARTUP_LOGLEVEL").ok(), "info"),
        // Felix's early logging comes from the environment (Calico's
        // ConfigureEarlyLoggingFromEnv); its commands other than the daemon are quiet.
        Role::Felix(f) if felix_runs_daemon(f) => {
            calico_level(std::env::var("FELIX_LOGSEVERITYSCREEN").ok(), "info")
        }
        Role::Typha(t) if margay_typha::cli::runs_daemon(t) => {
            margay_typha::cli::log_level_from_env()
        }
        // confd's log is its record of every render (one line each).
        Role::Confd(_) => "info".to_string(),
        Role::KubeControllers(k) if margay_kube_controllers::cli::runs_daemon(k) => {
            margay_kube_controllers::cli::log_level_from_env()
        }
        Role::Felix(_)
        | Role::Flows(_)
        | Role::Completion { .. }
        | Role::Man { .. }
        | Role::Cni(_)
        | Role::Lab(_)
        | Role::Typha(_)
        | Role::KubeControllers(_)
        | Role::Bpf(_) => "warn".to_string(),
    });
    let logs = match margay_logging::install(margay_logging::Settings {
        screen_level: level,
        format,
        file: cli.log_file.clone(),
        rotation,
    }) {
        Ok(handles) => handles,
        Err(e) => {
            eprintln!("margay: {e}");
            return ExitCode::from(1);
        }
    };
    let code = match cli.role {
        Role::Ctl(ctl) => margay_ctl::run(
            ctl,
            &mut io::stdin().lock(),
            &mut io::stdout().lock(),
            &mut io::stderr().lock(),
        ),
        Role::Node(node) => {
            margay_node::cli::run_node(node, &mut io::stdout().lock(), &mut io::stderr().lock())
        }
        // Once configuration is loaded, Felix applies LogSeverityScreen, unless the level was
        // given on the command line.
        Role::Felix(felix) => margay_felix::cli::run_felix(
            felix,
            margay_felix::LogSetters {
                screen: (!explicit_level).then_some(logs.screen),
                syslog: Some(logs.syslog),
                file: logs.file,
            },
            &mut io::stdout(),
            &mut io::stderr(),
        ),
        Role::Cni(cni) => {
            margay_cni::cli::run_cni(cni, &mut io::stdout().lock(), &mut io::stderr().lock())
        }
        Role::Lab(lab) => margay_lab::run(lab, &mut io::stdout(), &mut io::stderr()),
        Role::Flows(f) => {
            margay_felix::flows_cli::run_flows(f, &mut io::stdout().lock(), &mut io::stderr())
        }
        Role::Typha(typha) => margay_typha::cli::run_typha(typha, logs.file, &mut io::stdout()),
        Role::Confd(confd) => margay_confd::cli::run_confd(confd, &mut io::stderr()),
        Role::Bpf(b) => bpf_cmd::run(b, &mut io::stdout().lock(), &mut io::stderr().lock()),
        // The running configuration's log level applies unless --log-level fixed it.
        Role::Completion { shell } => {
            match docs::completion(Cli::command(), shell, &mut io::stdout().lock()) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("margay completion: cannot write the script: {e}");
                    1
                }
            }
        }
        Role::Man { dir } => match docs::man_pages(Cli::command(), &dir) {
            Ok(pages) => {
                println!("wrote {} man pages to {}", pages.len(), dir.display());
                0
            }
            Err(e) => {
                eprintln!("margay man: {e}");
                1
            }
        },
        Role::KubeControllers(k) => margay_kube_controllers::cli::run_kube_controllers(
            k,
            (!explicit_level).then_some(logs.screen),
            &mut io::stdout(),
            &mut io::stderr(),
        ),
    };
    let _ = io::stdout().flush();
    ExitCode::from(code)
}

/// A Calico level name from the environment as a tracing filter, `default` when unset or
/// not a level.
fn calico_level(value: Option<String>, default: &str) -> String {
    value
        .as_deref()
        .and_then(margay_logging::calico_level)
        .unwrap_or(default)
        .to_string()
}

fn felix_runs_daemon(f: &margay_felix::cli::FelixArgs) -> bool {
    matches!(
        f.command,
        None | Some(margay_felix::cli::FelixCommand::Run(_))
    )
}
