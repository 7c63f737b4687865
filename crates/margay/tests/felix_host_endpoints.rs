//! `margay felix` with the Linux dataplane enforcing HostEndpoints from the datastore: a
//! "node" namespace with an uplink to an "outside" namespace; the node's own listeners are
//! probed from outside (real TCP). The graph takes only this node's host endpoints, the
//! failsafe ports come from FailsafeInboundHostPorts, a policy opens one port, and removing
//! the endpoint opens the host again. Root only; everything lives in namespaces the test made.
#![allow(clippy::unwrap_used)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use margay_testkit::netns::{Netns, is_root};
use margay_testkit::roles::Role;

mod felix_node;
use felix_node::FelixNode;

const NODE_IP: &str = "192.0.2.1";
const OUTSIDE_IP: &str = "192.0.2.254";

/// Fields drop in order: the listeners before the namespaces they run in.
struct Env {
    _listeners: Vec<Role>,
    outside: Netns,
    fx: FelixNode,
}

impl std::ops::Deref for Env {
    type Target = FelixNode;
    fn deref(&self) -> &FelixNode {
        &self.fx
    }
}

impl Env {
    fn start_felix(&self) -> Role {
        // 22 as Calico's default, and 8080 to show the parameter reaches the rules.
        self.fx.start_felix(
            "felix",
            &[("FELIX_FAILSAFEINBOUNDHOSTPORTS", "tcp:22,tcp:8080")],
        )
    }

    /// A TCP connection from outside to the node's `port`.
    fn probe(&self, port: u16) -> bool {
        self.outside
            .exec("timeout")
            .args(["1", "nc", "-z", "-w", "1", NODE_IP, &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    /// Waits (20 s at most) until every probe gives what it should, all in one round.
    fn expect(&self, felix: &mut Role, scenario: &str, probes: &[(u16, bool)]) {
        felix.wait_for(scenario, Duration::from_secs(20), || {
            for (port, want) in probes {
                if self.probe(*port) != *want {
                    return Err(format!(
                        "tcp/{port} not {}\n{}",
                        if *want { "allowed" } else { "denied" },
                        self.ruleset()
                    ));
                }
            }
            Ok(())
        });
    }
}

fn setup() -> Env {
    let fx = FelixNode::new("fh-node");
    let outside = Netns::new("fh-out").unwrap();
    let mut listeners = Vec::new();
    {
        let node = fx.ns();
        node.link_to("uplink0", &outside, "eth0").unwrap();
        node.add_addr("uplink0", &format!("{NODE_IP}/24")).unwrap();
        node.set_up("uplink0").unwrap();
        outside
            .add_addr("eth0", &format!("{OUTSIDE_IP}/24"))
            .unwrap();
        outside.set_up("eth0").unwrap();
        for port in ["22", "80", "8080", "9090"] {
            let mut c = node.exec("nc");
            c.args(["-l", "-k", "-p", port]);
            listeners.push(fx.node.spawn(&format!("nc-{port}"), c));
        }
    }
    let env = Env {
        _listeners: listeners,
        outside,
        fx,
    };
    env.startup(&format!("{NODE_IP}/24"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = env.ns().exec("ss").args(["-ltn"]).output().unwrap();
        let t = String::from_utf8_lossy(&out.stdout);
        if [":22 ", ":80 ", ":8080 ", ":9090 "]
            .iter()
            .all(|w| t.contains(w))
        {
            break;
        }
        assert!(Instant::now() < deadline, "listeners did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    env
}

const HEP: &str = "apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata:
  name: nodea-uplink0
  labels: {role: edge}
spec:
  node: nodea
  interfaceName: uplink0
  expectedIPs: [192.0.2.1]
---
# Another node's endpoint: this node must not apply it (it would cover every interface).
apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata:
  name: nodeb-all
  labels: {role: edge}
spec:
  node: nodeb
  interfaceName: \"*\"
";

const ALLOW_80: &str = "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: edge-allow-80}
spec:
  selector: role == 'edge'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: TCP
    destination: {ports: [80]}
";

#[test]
fn felix_enforces_host_endpoints_from_the_datastore() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let env = setup();
    let mut felix = env.start_felix();
    env.wait_in_sync(&mut felix);
    env.expect(
        &mut felix,
        "no host endpoint: the host is open",
        &[(80, true), (9090, true)],
    );

    env.apply("hep.yaml", HEP);
    env.expect(
        &mut felix,
        "a host endpoint without policy: only failsafe ports",
        &[(80, false), (9090, false), (22, true), (8080, true)],
    );
    let rules = env.ruleset();
    assert!(rules.contains("chain hi-uplink0"), "{rules}");
    assert!(
        !rules.contains("hi_any"),
        "another node's host endpoint was applied here\n{rules}"
    );

    env.apply("allow.yaml", ALLOW_80);
    env.expect(
        &mut felix,
        "a policy opens one port",
        &[(80, true), (9090, false), (22, true)],
    );

    env.delete("hostendpoint", "nodea-uplink0", None);
    env.expect(
        &mut felix,
        "the host endpoint removed: the host is open again",
        &[(80, true), (9090, true)],
    );
    felix.assert_running();
}
