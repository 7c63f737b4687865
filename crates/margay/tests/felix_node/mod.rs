//! A test "node" for running `margay felix` with the Linux dataplane: a testkit [`Node`] in
//! its own network namespace (work directory kept and logs shown when a test fails), the
//! embedded datastore in its work directory, and the commands the Felix tests share —
//! `margay ctl` against that store, `margay node startup`, Felix started as the node runs it,
//! its status and the node's ruleset.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use margay_testkit::netns::Netns;
use margay_testkit::roles::{Node, Role};
use serde_json::Value;

/// The node's name.
pub const NODE: &str = "nodea";

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_margay")
}

pub struct FelixNode {
    pub node: Node,
}

impl FelixNode {
    /// A node in a new namespace named after `prefix`.
    pub fn new(prefix: &str) -> FelixNode {
        FelixNode {
            node: Node::in_netns(prefix).unwrap(),
        }
    }

    /// The node's namespace.
    pub fn ns(&self) -> &Netns {
        self.node.netns().unwrap()
    }

    pub fn db(&self) -> PathBuf {
        self.node.file("store.db")
    }

    pub fn socket(&self) -> PathBuf {
        self.node.file("felix.sock")
    }

    pub fn mtu_file(&self) -> PathBuf {
        self.node.file("mtu")
    }

    /// `margay` against the node's datastore, with nothing else from the environment.
    pub fn margay(&self) -> Command {
        let mut c = Command::new(bin());
        c.env_clear()
            .env("DATASTORE_TYPE", "local")
            .env("DATASTORE_PATH", self.db());
        c
    }

    /// Registers the node as `margay node startup` does (ClusterInformation ready, the Node
    /// with `ip_cidr`), without default pools.
    pub fn startup(&self, ip_cidr: &str) {
        let out = self
            .margay()
            .args(["node", "startup", "--root"])
            .arg(self.node.file("root"))
            .env("NODENAME", NODE)
            .env("IP", ip_cidr)
            .env("NO_DEFAULT_POOLS", "true")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `margay ctl apply` of `yaml` (kept in the work directory as `name`).
    pub fn apply(&self, name: &str, yaml: &str) {
        let file = self.node.file(name);
        std::fs::write(&file, yaml).unwrap();
        let out = self
            .margay()
            .args(["ctl", "apply", "-f"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn delete(&self, kind: &str, name: &str, ns: Option<&str>) {
        let mut c = self.margay();
        c.args(["ctl", "delete", kind, name]);
        if let Some(ns) = ns {
            c.args(["-n", ns]);
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Felix as the node runs it, with `extra` FELIX_* settings.
    pub fn felix_command(&self, extra: &[(&str, &str)]) -> Command {
        let mut c = self.node.command(bin().as_ref());
        c.args(["felix", "run", "--status-socket"])
            .arg(self.socket())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATASTORE_TYPE", "local")
            .env("DATASTORE_PATH", self.db())
            .env("FELIX_FELIXHOSTNAME", NODE)
            .env("FELIX_HEALTHENABLED", "false")
            .env("FELIX_LOGSEVERITYSCREEN", "Info")
            // The machine's own syslog is none of the test's business.
            .env("FELIX_LOGFILEPATH", "none")
            .env("FELIX_LOGSEVERITYSYS", "none")
            .env("MARGAY_DATAPLANE", "linux")
            .env("MARGAY_MTU_FILE", self.mtu_file())
            .env("FELIX_ENDPOINTSTATUSPATHPREFIX", self.node.file("status"));
        for (k, v) in extra {
            c.env(k, v);
        }
        c
    }

    /// Starts Felix inside the node namespace as the role `name` (its log `<name>.log`; a
    /// restarted Felix gets a name of its own, so each log is kept).
    pub fn start_felix(&self, name: &str, extra: &[(&str, &str)]) -> Role {
        self.node.spawn(name, self.felix_command(extra))
    }

    pub fn status(&self) -> Option<Value> {
        let out = self
            .margay()
            .args(["felix", "status", "--json", "--socket"])
            .arg(self.socket())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Waits (30 s at most) until `felix` reports its dataplane in sync; fails with its log
    /// if it exits first.
    pub fn wait_in_sync(&self, felix: &mut Role) -> Value {
        felix.wait_for(
            "the dataplane in sync",
            Duration::from_secs(30),
            || match self.status() {
                Some(s) if s["dataplane"]["in_sync"] == Value::Bool(true) => Ok(s),
                Some(s) => Err(format!("status {}", s["dataplane"])),
                None => Err("no status".into()),
            },
        )
    }

    /// The node's nftables ruleset.
    pub fn ruleset(&self) -> String {
        let out = self
            .ns()
            .exec("nft")
            .args(["list", "ruleset"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
