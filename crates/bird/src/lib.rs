//! BIRD's control socket, the one place margay talks to it: `margay node health
//! --bird-live/--bird-ready`, `margay ctl node status` and the lab use this crate.
//!
//! BIRD answers every command with lines `CODE-text` (more follows), `CODE text` (the last
//! line) or ` text` (continues the previous code). Codes: `0001` greeting, `0xxx` done,
//! `1xxx` table rows (`1002` the protocol table, `1006` protocol details, `1000`/`1011`
//! status), `2xxx` table headings, `8xxx` run-time errors, `9xxx` parse errors.
//!
//! `reply`, `protocols` and `status` are pure (text in, values out) and unit-tested from
//! replies captured from BIRD 2.0.12; `client` is the thin unix-socket adapter.
#![forbid(unsafe_code)]

pub mod client;
pub mod protocols;
pub mod reply;
pub mod status;

pub use client::{Client, DEFAULT_TIMEOUT, default_socket};
pub use protocols::{BgpPeer, PeerType, Protocol, ProtocolDetail, bgp_peers};
pub use reply::{Reply, ReplyLine, split_replies};
pub use status::Status;

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong talking to BIRD; each message names the socket or the
/// command and says what to check.
#[derive(Debug, thiserror::Error)]
pub enum BirdError {
    #[error(
        "cannot connect to BIRD's control socket {}: {source} (is BIRD running with `-s {}`? a different socket is chosen with --bird-socket)",
        path.display(),
        path.display()
    )]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("BIRD's control socket {}: {what}: {source}", path.display())]
    Io {
        path: PathBuf,
        what: String,
        source: std::io::Error,
    },
    #[error(
        "BIRD did not finish answering {command:?} within {timeout:?} on {} (is it stuck or overloaded?)",
        path.display()
    )]
    Timeout {
        path: PathBuf,
        command: String,
        timeout: Duration,
    },
    #[error("BIRD closed its control socket {} before finishing its answer to {command:?}", path.display())]
    Closed { path: PathBuf, command: String },
    #[error("BIRD refused {command:?}: {code:04} {text}")]
    Refused {
        command: String,
        code: u16,
        text: String,
    },
    #[error(
        "unexpected line in BIRD's reply: {line:?} (expected `NNNN-text`, `NNNN text` or ` text`)"
    )]
    Malformed { line: String },
    #[error(
        "BIRD's protocol table has the columns {found:?}; margay understands Name Proto Table State Since Info (BIRD 2)"
    )]
    Headings { found: Vec<String> },
    #[error("BIRD's greeting was {line:?}, not `0001 BIRD ... ready.`: is {} BIRD's control socket?", path.display())]
    Greeting { path: PathBuf, line: String },
    #[error("protocol name {0:?} is not a BIRD symbol (letters, digits and '_' only)")]
    BadName(String),
}
