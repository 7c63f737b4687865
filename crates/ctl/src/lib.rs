//! `margay ctl`: the operator's command-line interface (calicoctl's counterpart).
//!
//! Commands write to the given output streams and return the process exit code, so the binary
//! stays a thin dispatcher and tests can run commands in-process.
#![forbid(unsafe_code)]

use std::io::Write;

use clap::{Args, Subcommand};

mod selector_cmd;
mod validate_cmd;

/// Exit code of a successful command.
pub const EXIT_OK: u8 = 0;
/// The input was read but something in it is invalid (e.g. a resource fails validation).
pub const EXIT_INVALID: u8 = 1;
/// The command could not run as asked (bad arguments, unreadable file, invalid selector).
pub const EXIT_USAGE: u8 = 2;

/// Operate on margay/Calico resources and selectors.
#[derive(Debug, Args)]
pub struct CtlArgs {
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Evaluate and canonicalise label selectors.
    #[command(subcommand)]
    Selector(selector_cmd::SelectorCommand),
    /// Check projectcalico.org/v3 resource files without applying them.
    ///
    /// Every document of every file is decoded and validated; each problem is printed on its
    /// own line as `FILE [document N] KIND/NAME: FIELD.PATH: what is wrong`. Exits 1 if any
    /// document is invalid, 0 if all are valid, 2 if a file cannot be read.
    Validate(validate_cmd::ValidateArgs),
}

/// Runs one `margay ctl` command.
pub fn run(
    args: CtlArgs,
    stdin: &mut dyn std::io::Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let result = match args.command {
        CtlCommand::Selector(cmd) => selector_cmd::run(cmd, out, err),
        CtlCommand::Validate(a) => validate_cmd::run(&a, stdin, out, err),
    };
    // A broken pipe (e.g. `| head`) is not worth a panic or a second error message.
    result.unwrap_or(EXIT_USAGE)
}
