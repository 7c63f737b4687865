//! The `margay` multi-call binary: dispatches to a role by subcommand (or by the name it was
//! invoked as, e.g. a `calicoctl` symlink). No logic of its own lives here.
#![forbid(unsafe_code)]

use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// margay: Kubernetes node networking and network policy, compatible with Project Calico.
#[derive(Debug, Parser)]
#[command(
    name = "margay",
    version,
    about = "margay: Kubernetes node networking and network policy, compatible with Project Calico",
    long_about = None,
    propagate_version = true
)]
struct Cli {
    /// Log level for diagnostics on stderr: error, warn, info, debug or trace.
    #[arg(
        long,
        global = true,
        value_name = "LEVEL",
        default_value = "warn",
        env = "MARGAY_LOG_LEVEL"
    )]
    log_level: String,

    #[command(subcommand)]
    role: Role,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// The operator's CLI (like calicoctl): selectors, validation, resources.
    Ctl(margay_ctl::CtlArgs),
}

fn main() -> ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Invoked through a `calicoctl` link: behave as `margay ctl`.
    let invoked_as = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if invoked_as == "calicoctl" {
        args.insert(1, "ctl".into());
    }
    let cli = Cli::parse_from(args);
    init_logging(&cli.log_level);
    let code = match cli.role {
        Role::Ctl(ctl) => margay_ctl::run(
            ctl,
            &mut io::stdin().lock(),
            &mut io::stdout().lock(),
            &mut io::stderr().lock(),
        ),
    };
    let _ = io::stdout().flush();
    ExitCode::from(code)
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level).unwrap_or_else(|e| {
        eprintln!("warning: invalid --log-level {level:?} ({e}); using warn");
        tracing_subscriber::EnvFilter::new("warn")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_target(false)
        .init();
}
