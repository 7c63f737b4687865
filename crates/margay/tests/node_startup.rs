//! `margay node startup` and `margay node health`, run as the real binary inside a network
//! namespace with real interfaces (veth pairs) and a private embedded datastore.
//! Needs root (CI runs as root); MARGAY_SKIP_ROOT_TESTS=1 skips it elsewhere.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Output;

use margay_testkit::netns::{Netns, is_root};

struct Host {
    ns: Netns,
    dir: tempfile::TempDir,
}

/// A namespace with two NICs and decoys: eth0 10.77.0.5/24, eth1 192.168.50.5/24,
/// docker0 172.17.0.1/16, cali0 (no address).
fn host() -> Option<Host> {
    if !is_root() {
        if std::env::var("MARGAY_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
            eprintln!("skipped: needs root (MARGAY_SKIP_ROOT_TESTS=1)");
            return None;
        }
        panic!(
            "needs root (creates network namespaces); run as root or set MARGAY_SKIP_ROOT_TESTS=1"
        );
    }
    let ns = Netns::new("node").unwrap();
    ns.add_veth("eth0", "eth0-peer", &["10.77.0.5/24"]).unwrap();
    ns.add_veth("eth1", "eth1-peer", &["192.168.50.5/24"])
        .unwrap();
    ns.add_veth("docker0", "docker0-peer", &["172.17.0.1/16"])
        .unwrap();
    ns.add_veth("cali0", "cali0-peer", &[]).unwrap();
    Some(Host {
        ns,
        dir: tempfile::tempdir().unwrap(),
    })
}

impl Host {
    fn margay(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let exe = assert_cmd::cargo::cargo_bin("margay");
        let mut cmd = self.ns.exec(&exe);
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATASTORE_TYPE", "local")
            .env("DATASTORE_PATH", self.store());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    fn startup(&self, root: &str, env: &[(&str, &str)]) -> Output {
        let root = self.dir.path().join(root);
        self.margay(&["node", "startup", "--root", root.to_str().unwrap()], env)
    }

    fn store(&self) -> String {
        self.dir.path().join("ds.db").display().to_string()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn registers_a_node_from_real_interfaces_and_is_idempotent() {
    let Some(h) = host() else { return };
    let out = h.startup(
        "n1",
        &[
            ("NODENAME", "node-1"),
            ("IP_AUTODETECTION_METHOD", "interface=eth0"),
        ],
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("node \"node-1\" registered") && stdout.contains("IPv4 10.77.0.5/24"),
        "{stdout}"
    );
    assert!(stdout.contains("node written"), "{stdout}");
    // The default pool avoids 192.168.0.0/16, which holds eth1's address.
    let pools = h.margay(&["ctl", "get", "ippools", "-o", "wide"], &[]);
    let pools = text(&pools.stdout);
    assert!(
        pools.contains("default-ipv4-ippool") && pools.contains("172.16.0.0/16"),
        "{pools}"
    );
    let node = text(
        &h.margay(&["ctl", "get", "node", "node-1", "-o", "yaml"], &[])
            .stdout,
    );
    assert!(node.contains("ipv4Address: 10.77.0.5/24"), "{node}");
    assert_eq!(
        std::fs::read_to_string(h.dir.path().join("n1/var/lib/calico/nodename")).unwrap(),
        "node-1"
    );

    // Second run: nothing to change. Its log also goes to a file (MARGAY_LOG_FILE, any role),
    // at the screen's level, in the text layout.
    let log_file = h.dir.path().join("log/startup.log");
    let again = h.startup(
        "n1",
        &[
            ("NODENAME", "node-1"),
            ("IP_AUTODETECTION_METHOD", "interface=eth0"),
            ("MARGAY_LOG_FILE", log_file.to_str().unwrap()),
        ],
    );
    assert!(again.status.success(), "{}", text(&again.stderr));
    let logged = std::fs::read_to_string(&log_file).unwrap();
    assert!(
        !logged.is_empty()
            && logged
                .lines()
                .all(|l| l.starts_with("20") && l.contains("Z  INFO ") || l.contains("Z  WARN ")),
        "{logged}"
    );
    assert!(
        text(&again.stdout).contains("node unchanged"),
        "{}",
        text(&again.stdout)
    );
    assert!(
        !text(&again.stdout).contains("created"),
        "{}",
        text(&again.stdout)
    );

    // first-found skips docker0 and cali0 and takes the NIC with the highest index.
    let ff = h.startup("n2", &[("NODENAME", "node-2"), ("IP", "autodetect")]);
    assert!(ff.status.success(), "{}", text(&ff.stderr));
    assert!(
        text(&ff.stdout).contains("IPv4 192.168.50.5/24"),
        "{}",
        text(&ff.stdout)
    );
}

#[test]
fn conflicts_and_bad_settings_exit_1_with_what_to_fix() {
    let Some(h) = host() else { return };
    let first = h.startup("a", &[("NODENAME", "node-a"), ("IP", "10.77.0.5")]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let clash = h.startup(
        "b",
        &[
            ("NODENAME", "node-b"),
            ("IP", "autodetect"),
            ("IP_AUTODETECTION_METHOD", "cidr=10.77.0.0/16"),
        ],
    );
    assert_eq!(clash.status.code(), Some(1));
    let err = text(&clash.stderr);
    assert!(
        err.contains("\"node-a\"") && err.contains("\"node-b\"") && err.contains("10.77.0.5"),
        "{err}"
    );

    let bad = h.startup(
        "c",
        &[
            ("NODENAME", "node-c"),
            ("IP_AUTODETECTION_METHOD", "best-guess"),
        ],
    );
    assert_eq!(bad.status.code(), Some(1));
    let err = text(&bad.stderr);
    assert!(
        err.contains("IP_AUTODETECTION_METHOD")
            && err.contains("first-found")
            && err.contains("can-reach"),
        "{err}"
    );

    let pool = h.startup(
        "d",
        &[
            ("NODENAME", "node-d"),
            ("CALICO_IPV4POOL_IPIP", "sometimes"),
        ],
    );
    assert_eq!(pool.status.code(), Some(1));
    assert!(
        text(&pool.stderr).contains("CALICO_IPV4POOL_IPIP"),
        "{}",
        text(&pool.stderr)
    );
    assert!(
        !Path::new(&h.dir.path().join("d/var/lib/calico/nodename")).exists(),
        "no node name file after a failure"
    );
}

#[test]
fn health_reports_an_unreachable_felix() {
    let Some(h) = host() else { return };
    let out = h.margay(
        &["node", "health", "-felix-live", "-felix-ready"],
        &[("FELIX_HEALTHPORT", "9")],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot reach felix's health endpoint") && err.contains("FELIX_HEALTHENABLED"),
        "{err}"
    );
    let bird = h.margay(
        &[
            "node",
            "health",
            "-bird-live",
            "--bird-socket",
            "/nonexistent/margay-bird.ctl",
        ],
        &[],
    );
    assert_eq!(bird.status.code(), Some(1));
    let err = text(&bird.stderr);
    assert!(
        err.contains(
            "BIRD is not live: cannot connect to BIRD's control socket /nonexistent/margay-bird.ctl"
        ),
        "{err}"
    );
}
