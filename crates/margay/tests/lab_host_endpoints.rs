#![allow(clippy::unwrap_used)]
//! Host endpoints on `margay lab --backend bird` (2 nodes, real BIRD 2, Felix's nftables):
//! a HostEndpoint on node1's lab uplink (`eth0`) with a policy that allows nothing leaves the
//! failsafe ports (an SSH-like listener on tcp:22 inside node1's namespace, BGP on tcp:179:
//! the sessions stay Established and a new connection to BIRD still opens), Felix's health and
//! pod traffic through the node (forwarded: normal policy does not apply) working, while
//! another port on the node is closed; a policy opens that port; an `applyOnForward` policy
//! then polices the pod traffic forwarded through the uplink.
//!
//! Root only (skipped otherwise), and needs bird2 (scripts/setup). The lab is removed on drop,
//! pass or fail; every wait is bounded.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lab_common::Lab;
use margay_testkit::netns::is_root;
use serde_json::Value;

mod lab_common;

fn can_run() -> bool {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return false;
    }
    if Command::new("bird").arg("--version").output().is_err() {
        eprintln!("skipped: bird is not installed (scripts/setup installs bird2)");
        return false;
    }
    true
}

/// Listeners inside a node's namespace, killed on drop (before the lab goes).
struct Listeners(Vec<Child>);

impl Drop for Listeners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Hosts<'a> {
    lab: &'a Lab,
}

impl Hosts<'_> {
    fn netns(&self, node: &str) -> String {
        format!("mgy-{}-{node}", self.lab.name)
    }

    fn node_ip(&self, node: &str) -> String {
        let st = self.lab.status();
        st["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == node)
            .and_then(|n| n["ip"].as_str())
            .unwrap()
            .to_string()
    }

    /// A TCP connection from `from`'s namespace to `to`'s address.
    fn tcp(&self, from: &str, to: &str, port: u16) -> bool {
        let ip = self.node_ip(to);
        Command::new("ip")
            .args(["netns", "exec", &self.netns(from)])
            .args([
                "timeout",
                "1.5",
                "nc",
                "-z",
                "-w",
                "1",
                &ip,
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    fn node_status(&self, node: &str) -> Value {
        let st = self.lab.status();
        st["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == node)
            .cloned()
            .unwrap()
    }

    fn ruleset(&self, node: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.netns(node), "nft", "list", "ruleset"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits (30 s at most) until every (from, to, port, wanted) probe holds in one round.
    fn expect(&self, scenario: &str, probes: &[(&str, &str, u16, bool)]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let wrong: Vec<String> = probes
                .iter()
                .filter(|(from, to, port, want)| self.tcp(from, to, *port) != *want)
                .map(|(from, to, port, want)| format!("{from}->{to}:{port} not {want}"))
                .collect();
            if wrong.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{scenario}: {wrong:?}\n{}",
                self.ruleset("node1")
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Pod probe (TCP 80), retried until it gives `want` (30 s at most).
    fn expect_pod(&self, scenario: &str, from: &str, to: &str, want: bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.lab.probe(from, to, 1000) != want {
            assert!(
                Instant::now() < deadline,
                "{scenario}: {from} -> {to} not {want}\n{}",
                self.ruleset("node1")
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

#[test]
fn host_endpoint_on_a_lab_node_keeps_failsafe_bgp_and_health() {
    if !can_run() {
        return;
    }
    let lab = Lab::new("hep");
    lab.build(&["--backend", "bird", "--nodes", "2"]);
    let h = Hosts { lab: &lab };
    let node1 = h.netns("node1");
    let mut listeners = Listeners(Vec::new());
    for port in ["22", "8080"] {
        listeners.0.push(
            Command::new("ip")
                .args(["netns", "exec", &node1, "nc", "-l", "-k", "-p", port])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    // A pod on each node: traffic between them is forwarded through node1's uplink.
    let st = lab.status();
    let pod_on = |node: &str| -> String {
        st["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["node"] == node)
            .and_then(|p| p["id"].as_str())
            .unwrap_or_else(|| panic!("no pod on {node}: {st}"))
            .to_string()
    };
    let (p1, p2) = (pod_on("node1"), pod_on("node2"));

    h.expect(
        "no host endpoint",
        &[("node2", "node1", 22, true), ("node2", "node1", 8080, true)],
    );

    lab.apply_raw(
        "apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata:
  name: node1-eth0
  labels: {hep: node1}
spec:
  node: node1
  interfaceName: eth0
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: hep-deny-all}
spec:
  selector: has(hep)
  types: [Ingress, Egress]
",
    );
    h.expect(
        "deny all: failsafe ports only",
        &[
            ("node2", "node1", 8080, false),
            ("node2", "node1", 22, true),
            // A new BGP connection to node1's BIRD: failsafe tcp:179.
            ("node2", "node1", 179, true),
        ],
    );
    assert!(h.ruleset("node1").contains("chain hi-eth0"));
    // Forwarded pod traffic is not host traffic.
    h.expect_pod("deny all, forwarded", &p2, &p1, true);
    // Some time under the policy: BGP keepalives and Felix's health keep flowing.
    std::thread::sleep(Duration::from_secs(5));
    for node in ["node1", "node2"] {
        let s = h.node_status(node);
        let sessions = s["bgp"].as_array().cloned().unwrap_or_default();
        assert!(
            !sessions.is_empty() && sessions.iter().all(|p| p["bgpState"] == "Established"),
            "{node}: BGP sessions {sessions:?}"
        );
        assert_eq!(
            s["ready"],
            Value::Bool(true),
            "{node}: Felix not ready: {s}"
        );
    }

    lab.apply_raw(
        "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: hep-allow-8080}
spec:
  selector: has(hep)
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: TCP
    destination: {ports: [8080]}
",
    );
    h.expect(
        "allow a port",
        &[("node2", "node1", 8080, true), ("node2", "node1", 22, true)],
    );

    lab.apply_raw(
        "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: hep-forward-no-80}
spec:
  selector: has(hep)
  applyOnForward: true
  types: [Ingress]
  ingress:
  - action: Deny
    protocol: TCP
    destination: {ports: [80]}
  - action: Allow
",
    );
    h.expect_pod("applyOnForward", &p2, &p1, false);
    h.expect(
        "applyOnForward leaves host traffic to normal policy",
        &[("node2", "node1", 8080, true), ("node2", "node1", 22, true)],
    );
    drop(listeners);
}
