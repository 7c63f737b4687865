//! `margay node allocate-tunnel-addrs`, run as the real binary against a private embedded
//! datastore (its own temp directory; the datastore variables are reset, so nothing outside
//! the test is read or written).
#![allow(clippy::unwrap_used)]

use std::process::Output;

use assert_cmd::Command;

struct Store {
    dir: tempfile::TempDir,
}

impl Store {
    fn new() -> Store {
        Store {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn margay(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::cargo_bin("margay").unwrap();
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATASTORE_TYPE", "local")
            .env("DATASTORE_PATH", self.dir.path().join("ds.db"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    fn apply(&self, yaml: &str) {
        let f = self.dir.path().join("in.yaml");
        std::fs::write(&f, yaml).unwrap();
        let out = self.margay(&["ctl", "apply", "-f", f.to_str().unwrap()], &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }

    fn allocate(&self, node: &str) -> Output {
        let root = self.dir.path().join("root");
        self.margay(
            &[
                "node",
                "allocate-tunnel-addrs",
                "--root",
                root.to_str().unwrap(),
            ],
            &[("NODENAME", node)],
        )
    }

    fn node_yaml(&self, node: &str) -> String {
        text(
            &self
                .margay(&["ctl", "get", "node", node, "-o", "yaml"], &[])
                .stdout,
        )
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn pool(mode: &str) -> String {
    format!(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: vx\nspec:\n  cidr: 10.244.0.0/16\n  vxlanMode: {mode}\n"
    )
}

#[test]
fn allocates_keeps_and_releases_the_vxlan_tunnel_address() {
    let s = Store::new();
    s.apply(
        "apiVersion: projectcalico.org/v3\nkind: Node\nmetadata:\n  name: node-1\nspec:\n  bgp:\n    ipv4Address: 10.0.0.5/24\n",
    );
    s.apply(&pool("Always"));

    let out = s.allocate("node-1");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("VXLAN tunnel IPv4 10.244.") && stdout.contains("node written"),
        "{stdout}"
    );
    let yaml = s.node_yaml("node-1");
    let addr = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("ipv4VXLANTunnelAddr: "))
        .unwrap_or_else(|| panic!("no tunnel address in\n{yaml}"))
        .to_string();
    assert!(addr.starts_with("10.244."), "{yaml}");
    assert!(yaml.contains("vxlanTunnelMACAddr: 66:"), "{yaml}");

    // Idempotent.
    let out = s.allocate("node-1");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains(&format!("IPv4 {addr}")) && stdout.contains("node unchanged"),
        "{stdout}"
    );

    // The pool stops using VXLAN: the address is released and cleared.
    s.apply(&pool("Never"));
    let out = s.allocate("node-1");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("VXLAN tunnel IPv4 -") && stdout.contains(&format!("released [{addr}]")),
        "{stdout}"
    );
    assert!(
        !s.node_yaml("node-1").contains("ipv4VXLANTunnelAddr"),
        "{}",
        s.node_yaml("node-1")
    );
}

#[test]
fn an_unregistered_node_says_to_run_startup() {
    let s = Store::new();
    s.apply(&pool("Always"));
    let out = s.allocate("ghost");
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("margay node startup"), "{stderr}");
}
