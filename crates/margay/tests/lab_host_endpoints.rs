#![allow(clippy::unwrap_used)]
//! Host endpoints on `margay lab`. With `--backend bird` (2 nodes, real BIRD 2, Felix's nftables):
//! a HostEndpoint on node1's lab uplink (`eth0`) with a policy that allows nothing leaves the
//! failsafe ports (an SSH-like listener on tcp:22 inside node1's namespace, BGP on tcp:179:
//! the sessions stay Established and a new connection to BIRD still opens), Felix's health and
//! pod traffic through the node (forwarded: normal policy does not apply) working, while
//! another port on the node is closed; a policy opens that port; an `applyOnForward` policy
//! then polices the pod traffic forwarded through the uplink. With `--datastore kubernetes`,
//! kube-controllers' automatic `*` host endpoints leave the cluster working and a policy on
//! them closes a port on the nodes.
//!
//! Root only (skipped otherwise), and needs bird2 (scripts/setup). The lab is removed on drop,
//! pass or fail; every wait is bounded.

use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lab_common::Lab;
use margay_testkit::netns::is_root;
use serde_json::Value;

mod lab_common;

/// The labs run one at a time: two at once on a loaded 2-core machine only make the bounded
/// waits tighter.
static ONE_LAB_AT_A_TIME: Mutex<()> = Mutex::new(());

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
    let _one = ONE_LAB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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

/// Every pod reaches every pod on TCP 80 (no policy), within 60 s.
fn wait_full_matrix(lab: &Lab, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let blocked: Vec<String> = lab
            .matrix(80, "tcp")
            .iter()
            .flat_map(|(a, row)| {
                row.iter()
                    .filter(|(_, ok)| !**ok)
                    .map(move |(b, _)| format!("{a}->{b}"))
            })
            .collect();
        if blocked.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: blocked {blocked:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// kube-controllers' automatic host endpoints (`*`, the default-allow profile) on a Kubernetes
/// lab (VXLAN): every interface of every node, `lo` and `vxlan.calico` included, now has host
/// endpoint chains, and the cluster keeps working (pods across nodes, Felix ready); a policy
/// selecting the managed endpoints then closes one port on the nodes, failsafe ports stay.
#[test]
fn automatic_host_endpoints_keep_a_kubernetes_lab_working() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let _one = ONE_LAB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::new("ahep");
    lab.build(&["--datastore", "kubernetes", "--nodes", "2"]);
    let h = Hosts { lab: &lab };
    let node1 = h.netns("node1");
    let mut listeners = Listeners(Vec::new());
    for port in ["22", "8080", "9090"] {
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
    wait_full_matrix(&lab, "before");

    lab.apply_raw(
        "apiVersion: projectcalico.org/v3
kind: KubeControllersConfiguration
metadata: {name: default}
spec:
  controllers:
    node:
      hostEndpoint: {autoCreate: Enabled}
",
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let heps = lab.ctl(&["get", "hostendpoints"]);
        if heps.contains("node1-auto-hep") && heps.contains("node2-auto-hep") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no automatic host endpoints: {heps}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !h.ruleset("node1").contains("chain hi_any") {
        assert!(
            Instant::now() < deadline,
            "node1 has no `*` host endpoint chains"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    wait_full_matrix(&lab, "with automatic host endpoints");
    h.expect(
        "default-allow profile",
        &[
            ("node2", "node1", 8080, true),
            ("node2", "node1", 9090, true),
        ],
    );
    for node in ["node1", "node2"] {
        assert_eq!(
            h.node_status(node)["ready"],
            Value::Bool(true),
            "{node}: Felix not ready"
        );
    }

    lab.apply_raw(
        "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: nodes-no-8080}
spec:
  selector: projectcalico.org/created-by == 'calico-kube-controllers'
  types: [Ingress]
  ingress:
  - action: Deny
    protocol: TCP
    destination: {ports: [8080, 22]}
  - action: Allow
",
    );
    h.expect(
        "a policy on the automatic endpoints",
        &[
            ("node2", "node1", 8080, false),
            ("node2", "node1", 9090, true),
            // Failsafe: the policy's Deny never sees it.
            ("node2", "node1", 22, true),
        ],
    );
    wait_full_matrix(&lab, "with a policy on the automatic host endpoints");
    drop(listeners);
}
