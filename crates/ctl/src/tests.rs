//! In-process tests of the resource commands against the in-memory datastore: the same code
//! paths as the binary, with `MemBackend` in place of etcd or the local store.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::path::{Path, PathBuf};

use clap::Parser;
use margay_api::{Kind, Resource, ResourceKey};
use margay_datastore::{Client, KvBackend, MemBackend};

use crate::datastore::{Access, ConnectFailure, Connection, Connector};
use crate::table::go_float;
use crate::{CtlArgs, EXIT_INVALID, EXIT_OK, EXIT_USAGE, Ui, run_with};

/// Hands out one shared in-memory store.
struct MemConnector {
    client: Client<MemBackend>,
}

impl Connector for MemConnector {
    type Backend = MemBackend;

    async fn connect(
        &self,
        _: Option<&Path>,
        _: Access,
    ) -> Result<Connection<MemBackend>, ConnectFailure> {
        Ok(Connection {
            client: self.client.clone(),
            describe: "in-memory datastore".to_string(),
            kubernetes: false,
            note: None,
        })
    }
}

/// A datastore that cannot be reached.
struct Unreachable;

impl Connector for Unreachable {
    type Backend = MemBackend;

    async fn connect(
        &self,
        _: Option<&Path>,
        _: Access,
    ) -> Result<Connection<MemBackend>, ConnectFailure> {
        Err(ConnectFailure {
            message: "cannot reach the datastore (etcd at http://127.0.0.1:1): connection refused"
                .to_string(),
            code: EXIT_INVALID,
        })
    }
}

#[derive(Parser)]
#[command(name = "ctl")]
struct TestCli {
    #[command(flatten)]
    ctl: CtlArgs,
}

struct Outcome {
    code: u8,
    out: String,
    err: String,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.out, self.err
        )
    }
}

struct Ctl {
    conn: MemConnector,
    dir: tempfile::TempDir,
}

impl Ctl {
    fn new() -> Ctl {
        Ctl {
            conn: MemConnector {
                client: Client::new(MemBackend::default()),
            },
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn run(&self, args: &[&str]) -> Outcome {
        self.run_stdin(args, "")
    }

    fn run_stdin(&self, args: &[&str], stdin: &str) -> Outcome {
        run_args(args, stdin, &self.conn)
    }

    fn file(&self, name: &str, text: &str) -> String {
        let path: PathBuf = self.dir.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    fn stored(&self, kind: Kind, namespace: &str, name: &str) -> Option<Resource> {
        let key = ResourceKey {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        block_on(self.conn.client.get(&key)).ok()
    }

    fn count(&self, kind: Kind) -> usize {
        block_on(self.conn.client.list(kind, None, ""))
            .unwrap()
            .items
            .len()
    }
}

fn run_args<C: Connector>(args: &[&str], stdin: &str, connector: &C) -> Outcome {
    let argv = std::iter::once("ctl").chain(args.iter().copied());
    let cli = TestCli::try_parse_from(argv).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_with(
        cli.ctl,
        &mut stdin.as_bytes(),
        &mut out,
        &mut err,
        connector,
        Ui::default(),
    );
    Outcome {
        code,
        out: String::from_utf8(out).unwrap(),
        err: String::from_utf8(err).unwrap(),
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn pool(name: &str, cidr: &str) -> String {
    format!(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: {name}\nspec:\n  cidr: {cidr}\n"
    )
}

fn pool_labelled(name: &str, cidr: &str, labels: &str) -> String {
    format!(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: {name}\n  labels: {labels}\nspec:\n  cidr: {cidr}\n"
    )
}

fn policy(name: &str, namespace: Option<&str>, selector: &str) -> String {
    let ns = namespace
        .map(|n| format!("  namespace: {n}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata:\n  name: {name}\n{ns}spec:\n  selector: {selector}\n  types: [Ingress]\n  ingress:\n  - action: Allow\n"
    )
}

fn three_pools() -> String {
    [
        pool("pool-a", "10.1.0.0/16"),
        pool("pool-b", "10.2.0.0/16"),
        pool("pool-c", "10.3.0.0/16"),
    ]
    .join("---\n")
}

mod config;
mod ipam;
mod k8s_policy;
mod read;
mod write;
