//! `margay ctl selector check|canonical`.

use std::collections::BTreeMap;
use std::io::Write;

use clap::Subcommand;
use margay_selector::Selector;

use crate::{EXIT_OK, EXIT_USAGE};

#[derive(Debug, Subcommand)]
pub enum SelectorCommand {
    /// Print `true` if the labels match the selector, `false` otherwise.
    ///
    /// Example: margay ctl selector check 'app == "web" && has(tier)' --label app=web --label tier=fe
    ///
    /// Exits 0 either way; exits 2 with the parse error (position and what was expected) on
    /// stderr if the selector is invalid.
    Check {
        /// The selector, in Calico's syntax (quote it for the shell).
        selector: String,
        /// A label of the set to test, as KEY=VALUE; repeat for more labels.
        #[arg(short, long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
        labels: Vec<(String, String)>,
    },
    /// Print the selector's canonical form (line 1) and its UniqueID (line 2).
    ///
    /// The canonical form is what Calico stores and compares; the UniqueID (`s:` + base64url
    /// of SHA-224) names the selector's IP set. Exits 2 if the selector is invalid.
    Canonical {
        /// The selector, in Calico's syntax (quote it for the shell).
        selector: String,
    },
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE (e.g. --label app=web)")),
    }
}

pub fn run(cmd: SelectorCommand, out: &mut dyn Write, err: &mut dyn Write) -> std::io::Result<u8> {
    match cmd {
        SelectorCommand::Check { selector, labels } => {
            let sel = match Selector::parse(&selector) {
                Ok(s) => s,
                Err(e) => {
                    writeln!(err, "error: {e}")?;
                    return Ok(EXIT_USAGE);
                }
            };
            let labels: BTreeMap<String, String> = labels.into_iter().collect();
            writeln!(out, "{}", sel.matches(&labels))?;
            Ok(EXIT_OK)
        }
        SelectorCommand::Canonical { selector } => match Selector::parse(&selector) {
            Ok(sel) => {
                writeln!(out, "{}", sel.canonical())?;
                writeln!(out, "{}", sel.unique_id())?;
                Ok(EXIT_OK)
            }
            Err(e) => {
                writeln!(err, "error: {e}")?;
                Ok(EXIT_USAGE)
            }
        },
    }
}
