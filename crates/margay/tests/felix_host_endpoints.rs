//! `margay felix` with the Linux dataplane enforcing HostEndpoints from the datastore: a
//! "node" namespace with an uplink to an "outside" namespace; the node's own listeners are
//! probed from outside (real TCP). The graph takes only this node's host endpoints, the
//! failsafe ports come from FailsafeInboundHostPorts, a policy opens one port, and removing
//! the endpoint opens the host again. Root only; everything lives in namespaces the test made.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use margay_testkit::netns::{Netns, is_root};
use margay_testkit::roles::{Node, Role};
use serde_json::Value;

const NODE: &str = "nodea";
const NODE_IP: &str = "192.0.2.1";
const OUTSIDE_IP: &str = "192.0.2.254";

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_margay")
}

/// Fields drop in order: the listeners before the namespaces they run in.
struct Env {
    _listeners: Vec<Role>,
    outside: Netns,
    node: Node,
}

impl Env {
    fn ns(&self) -> &Netns {
        self.node.netns().unwrap()
    }

    fn db(&self) -> PathBuf {
        self.node.file("store.db")
    }

    fn socket(&self) -> PathBuf {
        self.node.file("felix.sock")
    }

    fn margay(&self) -> Command {
        let mut c = Command::new(bin());
        c.env_clear()
            .env("DATASTORE_TYPE", "local")
            .env("DATASTORE_PATH", self.db());
        c
    }

    fn apply(&self, name: &str, yaml: &str) {
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

    fn delete(&self, kind: &str, name: &str) {
        let out = self
            .margay()
            .args(["ctl", "delete", kind, name])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn start_felix(&self) -> Role {
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
            .env("FELIX_LOGFILEPATH", "none")
            .env("FELIX_LOGSEVERITYSYS", "none")
            .env("MARGAY_DATAPLANE", "linux")
            .env("MARGAY_MTU_FILE", self.node.file("mtu"))
            .env("FELIX_ENDPOINTSTATUSPATHPREFIX", self.node.file("status"))
            // 22 as Calico's default, and 8080 to show the parameter reaches the rules.
            .env("FELIX_FAILSAFEINBOUNDHOSTPORTS", "tcp:22,tcp:8080");
        self.node.spawn("felix", c)
    }

    fn status(&self) -> Option<Value> {
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

    fn ruleset(&self) -> String {
        let out = self
            .ns()
            .exec("nft")
            .args(["list", "ruleset"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
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
    let host = Node::in_netns("fh-node").unwrap();
    let node = host.netns().unwrap();
    let outside = Netns::new("fh-out").unwrap();
    node.link_to("uplink0", &outside, "eth0").unwrap();
    node.add_addr("uplink0", &format!("{NODE_IP}/24")).unwrap();
    node.set_up("uplink0").unwrap();
    outside
        .add_addr("eth0", &format!("{OUTSIDE_IP}/24"))
        .unwrap();
    outside.set_up("eth0").unwrap();
    let mut listeners = Vec::new();
    for port in ["22", "80", "8080", "9090"] {
        let mut c = node.exec("nc");
        c.args(["-l", "-k", "-p", port]);
        listeners.push(host.spawn(&format!("nc-{port}"), c));
    }
    let env = Env {
        _listeners: listeners,
        outside,
        node: host,
    };
    let out = env
        .margay()
        .args(["node", "startup", "--root"])
        .arg(env.node.file("root"))
        .env("NODENAME", NODE)
        .env("IP", format!("{NODE_IP}/24"))
        .env("NO_DEFAULT_POOLS", "true")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    felix.wait_for(
        "the dataplane in sync",
        Duration::from_secs(30),
        || match env.status() {
            Some(s) if s["dataplane"]["in_sync"] == Value::Bool(true) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
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

    env.delete("hostendpoint", "nodea-uplink0");
    env.expect(
        &mut felix,
        "the host endpoint removed: the host is open again",
        &[(80, true), (9090, true)],
    );
    felix.assert_running();
}
