//! Shared by the lab's end-to-end suites (`lab_e2e.rs`, `lab_kube.rs`, `lab_bgp.rs`,
//! `lab_reliability.rs`): a lab per test, removed on drop (pass or fail), its commands (a suite
//! adds its own in an `impl Lab` of its own), and the policy scenarios with the
//! reachability each expects. Scenario YAML is read by margay ctl (YAML 1.2) and by kubectl
//! (YAML 1.1, where a bare `y` is a boolean): namespace `y` is always quoted.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_margay")
}

/// `lab matrix`'s answer: from pod → to pod → reached.
pub type Matrix = BTreeMap<String, BTreeMap<String, bool>>;

/// A lab for this test, removed on drop.
pub struct Lab {
    pub name: String,
    pub dir: PathBuf,
}

impl Lab {
    pub fn up() -> Lab {
        Lab::up_with("e", &[])
    }

    /// A lab named `<tag><pid>` (tags tell a binary's labs apart; at most 5 letters), not
    /// built yet ([`Lab::build`]); removed on drop all the same.
    pub fn new(tag: &str) -> Lab {
        let name = format!("{tag}{}", std::process::id() % 100_000);
        let dir = std::env::temp_dir().join(format!("margay-lab-{name}"));
        Lab { name, dir }
    }

    /// `lab up ARGS` for a lab named `<tag><pid>`.
    pub fn up_with(tag: &str, args: &[&str]) -> Lab {
        let lab = Lab::new(tag);
        let (out, _) = lab.build(args);
        eprintln!("{out}");
        lab
    }

    /// `lab up ARGS`, which must succeed: its output and how long it took.
    pub fn build(&self, args: &[&str]) -> (String, Duration) {
        let mut up = vec!["up"];
        up.extend_from_slice(args);
        let started = Instant::now();
        let out = self.cmd(&up).output().unwrap();
        let took = started.elapsed();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "lab up failed:\n{text}");
        (text, took)
    }

    /// A lab command that must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args).output().unwrap();
        assert!(
            out.status.success(),
            "lab {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `lab probe FROM TO` on TCP port 80 (true: reached).
    pub fn probe(&self, from: &str, to: &str, timeout_ms: u64) -> bool {
        let out = self
            .cmd(&["probe", from, to, "--timeout-ms", &timeout_ms.to_string()])
            .output()
            .unwrap();
        match out.status.code() {
            Some(0) => true,
            Some(1) => false,
            _ => panic!(
                "lab probe {from} {to}: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        // `--name` belongs to the leaf command: after `pod add`, `node stop`, ….
        let leaf = match args {
            ["pod" | "node", _, ..] => 2,
            _ => 1,
        };
        let mut c = Command::new(bin());
        c.arg("lab")
            .args(&args[..leaf])
            .args(["--name", &self.name, "--state-dir"])
            .arg(&self.dir)
            .args(&args[leaf..])
            .stdin(Stdio::null());
        c
    }

    pub fn ctl(&self, args: &[&str]) -> String {
        let out = Command::new(bin())
            .args(["lab", "ctl", "--name", &self.name, "--state-dir"])
            .arg(&self.dir)
            .arg("--")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ctl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `{ip:ns/pod}` in the YAML becomes that pod's address.
    pub fn expand(&self, yaml: &str) -> String {
        let mut out = yaml.to_string();
        for (id, ip) in self.ips() {
            out = out.replace(&format!("{{ip:{id}}}"), &ip);
        }
        out
    }

    /// Applies `yaml` after [`Lab::expand`].
    pub fn apply(&self, yaml: &str) {
        self.apply_raw(&self.expand(yaml));
    }

    /// Applies `yaml` as it is.
    pub fn apply_raw(&self, yaml: &str) {
        let f = self.dir.join("scenario.yaml");
        std::fs::write(&f, yaml).unwrap();
        self.ctl(&["apply", "-f", f.to_str().unwrap()]);
    }

    /// `lab status --json`.
    pub fn status(&self) -> Value {
        let out = self.cmd(&["status", "--json"]).output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn delete(&self, yaml: &str) {
        let yaml = self.expand(yaml);
        let f = self.dir.join("scenario.yaml");
        std::fs::write(&f, yaml).unwrap();
        self.ctl(&["delete", "-f", f.to_str().unwrap()]);
    }

    pub fn ips(&self) -> BTreeMap<String, String> {
        let out = self.cmd(&["status", "--json"]).output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["pods"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["id"].as_str().unwrap().to_string(),
                    p["ip"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    pub fn matrix(&self, port: u16, protocol: &str) -> Matrix {
        let port = port.to_string();
        self.matrix_with(&[
            "--port",
            &port,
            "--protocol",
            protocol,
            "--timeout-ms",
            "400",
        ])
    }

    /// `lab matrix ARGS -o json`: who reaches whom.
    pub fn matrix_with(&self, args: &[&str]) -> Matrix {
        let mut all = vec!["matrix"];
        all.extend_from_slice(args);
        all.extend(["-o", "json"]);
        let out = self.cmd(&all).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.cmd(&["down"]).output();
    }
}

pub type Expect = fn(&str, &str, &str, &str) -> bool;

pub struct Scenario {
    pub name: &'static str,
    pub yaml: &'static str,
    pub port: u16,
    pub protocol: &'static str,
    /// (from ns, from pod, to ns, to pod) → reachable.
    pub expect: Expect,
}

/// Waits (10 s at most) until the matrix is what `expect` says, then checks it once more.
/// Ok(how long it took) or Err(what was wrong).
pub fn converge(lab: &Lab, port: u16, protocol: &str, expect: Expect) -> Result<Duration, String> {
    let t = Instant::now();
    let mut last = Vec::new();
    while t.elapsed() < Duration::from_secs(10) {
        last = diff(&lab.matrix(port, protocol), expect);
        if last.is_empty() {
            let took = t.elapsed();
            let again = diff(&lab.matrix(port, protocol), expect);
            return if again.is_empty() {
                Ok(took)
            } else {
                Err(format!("did not stay: {again:?}"))
            };
        }
    }
    Err(format!("{last:?}"))
}

/// Every scenario in turn: applied with `apply`, the matrix converged, removed with `delete`.
/// Returns the failures and the slowest convergence.
pub fn run_scenarios(
    lab: &Lab,
    apply: &dyn Fn(&Scenario),
    delete: &dyn Fn(&Scenario),
) -> (Vec<String>, Duration) {
    let mut failures = Vec::new();
    let mut slowest = Duration::ZERO;
    for s in scenarios() {
        if !s.yaml.is_empty() {
            apply(&s);
        }
        let t = Instant::now();
        let result = converge(lab, s.port, s.protocol, s.expect);
        match &result {
            Ok(took) => {
                slowest = slowest.max(*took);
                if let Err(e) = check_flows(lab, s.port, s.protocol) {
                    failures.push(format!("{} (flow logs): {e}", s.name));
                }
            }
            Err(e) => failures.push(format!("{}: {e}", s.name)),
        }
        eprintln!(
            "{} {:<70} {:?}",
            if result.is_ok() { "ok  " } else { "FAIL" },
            s.name,
            t.elapsed()
        );
        if !s.yaml.is_empty() {
            delete(&s);
        }
    }
    (failures, slowest)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Flow logs agree with the matrix: one more matrix, then every probe between two pods has a
/// flow record on some node — a denied probe a denied flow naming what denied it, an allowed
/// probe an allowed flow (and no denied one). On both dataplanes: NFLOG prefixes with
/// nftables, the program's ring-buffer events with eBPF (`MARGAY_LAB_DATAPLANE=bpf`).
pub fn check_flows(lab: &Lab, port: u16, protocol: &str) -> Result<(), String> {
    let since = now_ms();
    let m = lab.matrix(port, protocol);
    let ips = lab.ips();
    let proto = if protocol == "udp" { 17 } else { 6 };
    let t = Instant::now();
    loop {
        // Each node's Felix directly: `lab flows` leaves out a node whose answer failed, and
        // a full ring's answer (4095 flows) can miss the status socket's deadline on a
        // loaded machine; this matrix's flows are far fewer than the last 1000.
        let (all, node_errors) = node_flows(lab, 1000);
        let flows: Vec<&Value> = all
            .iter()
            .filter(|f| f["end_ms"].as_u64().unwrap_or(0) >= since)
            .collect();
        let mut wrong = Vec::new();
        let mut wrong_pairs = Vec::new();
        for (from, row) in &m {
            for (to, ok) in row {
                if from == to {
                    continue;
                }
                let of = |f: &Value| {
                    f["tuple"]["src"] == ips[from].as_str()
                        && f["tuple"]["dst"] == ips[to].as_str()
                        && f["tuple"]["proto"] == proto
                        && f["tuple"]["dst_port"] == port
                };
                let denied = flows.iter().find(|f| of(f) && f["action"] == "deny");
                let allowed = flows.iter().any(|f| of(f) && f["action"] == "allow");
                // Both ends are named as the pods they are, whichever node reported the
                // flow (a peer on another node is named from the datastore).
                let name = |p: &Value| {
                    format!(
                        "{}/{}",
                        p["namespace"].as_str().unwrap_or(""),
                        p["name"].as_str().unwrap_or("")
                    )
                };
                if let Some(f) = flows.iter().find(|f| {
                    of(f)
                        && (f["source"]["type"] != "wep"
                            || f["dest"]["type"] != "wep"
                            || name(&f["source"]) != *from
                            || name(&f["dest"]) != *to)
                }) {
                    wrong.push(format!(
                        "{from} -> {to}: ends misnamed: {} -> {}",
                        f["source"], f["dest"]
                    ));
                }
                if !matches!((ok, denied), (false, Some(_)) | (true, None)) || (*ok && !allowed) {
                    wrong_pairs.push((ips[from].clone(), ips[to].clone()));
                }
                match (ok, denied) {
                    (false, Some(f)) if f["rule"]["origin"]["type"].is_string() => {}
                    (false, _) => wrong.push(format!("{from} -> {to}: denied, but no denied flow")),
                    (true, Some(f)) => wrong.push(format!(
                        "{from} -> {to}: allowed, but a denied flow: {}",
                        f["policy"]
                    )),
                    (true, None) if !allowed => {
                        wrong.push(format!("{from} -> {to}: allowed, but no allowed flow"))
                    }
                    (true, None) => {}
                }
            }
        }
        if wrong.is_empty() && node_errors.is_empty() {
            return Ok(());
        }
        if wrong.is_empty() {
            wrong = node_errors;
        }
        // Flows are closed every second; a starved Felix (a loaded machine) is given longer.
        if t.elapsed() > Duration::from_secs(15) {
            // Each node's counters (shed, unknown rules, kernel drops) say where flows went.
            let mut counters = Vec::new();
            for dir in std::fs::read_dir(lab.dir.join("nodes"))
                .into_iter()
                .flatten()
            {
                let Ok(dir) = dir else { continue };
                let out = Command::new(bin())
                    .args(["felix", "status", "--socket"])
                    .arg(dir.path().join("felix.sock"))
                    .arg("flows?last=0")
                    .output();
                if let Ok(o) = out {
                    let text = String::from_utf8_lossy(&o.stdout).replace(['\n', ' '], "");
                    counters.push(format!("{}: {text}", dir.file_name().to_string_lossy()));
                }
            }
            // What the nodes have for the first wrong pairs, whatever their time (after a
            // longer wait: late records are a slow reader, none at all no events).
            std::thread::sleep(Duration::from_secs(5));
            let (all, node_errors) = node_flows(lab, 1000);
            let all: Vec<Value> = all
                .into_iter()
                .filter(|f: &Value| f["end_ms"].as_u64().unwrap_or(0) + 60_000 >= since)
                .collect();
            let mut logs = Vec::new();
            for dir in std::fs::read_dir(lab.dir.join("nodes"))
                .into_iter()
                .flatten()
            {
                let Ok(dir) = dir else { continue };
                let text =
                    std::fs::read_to_string(dir.path().join("felix.log")).unwrap_or_default();
                logs.extend(
                    text.lines()
                        .filter(|l| {
                            l.contains("WARN") || l.contains("ERROR") || l.contains("shutting")
                        })
                        .map(|l| format!("{}: {l}", dir.file_name().to_string_lossy()))
                        .take(20),
                );
            }
            let mut seen = vec![format!("felix warnings: {logs:?}; {node_errors:?}")];
            for (src, dst) in wrong_pairs.iter().take(3) {
                for f in all.iter().filter(|f| {
                    f["tuple"]["src"] == src.as_str() && f["tuple"]["dst"] == dst.as_str()
                }) {
                    seen.push(format!(
                        "{src}:{} -> {dst}:{} {} {} {} end {} (since {since})",
                        f["tuple"]["src_port"],
                        f["tuple"]["dst_port"],
                        f["action"],
                        f["reporter"],
                        f["node"],
                        f["end_ms"]
                    ));
                }
            }
            return Err(format!(
                "{wrong:?}; {counters:?}; records of those pairs: {seen:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Every node's last `last` flows (`margay flows -o json` against its Felix's socket), and
/// the nodes whose Felix did not answer.
fn node_flows(lab: &Lab, last: usize) -> (Vec<Value>, Vec<String>) {
    let (mut flows, mut errors) = (Vec::new(), Vec::new());
    for dir in std::fs::read_dir(lab.dir.join("nodes"))
        .into_iter()
        .flatten()
    {
        let Ok(dir) = dir else { continue };
        let node = dir.file_name().to_string_lossy().into_owned();
        let out = Command::new(bin())
            .args(["flows", "-o", "json", "--last", &last.to_string()])
            .arg("--status-socket")
            .arg(dir.path().join("felix.sock"))
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => flows.extend(
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok()),
            ),
            Ok(o) => errors.push(format!(
                "{node}: margay flows failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => errors.push(format!("{node}: {e}")),
        }
    }
    (flows, errors)
}

pub fn diff(got: &BTreeMap<String, BTreeMap<String, bool>>, expect: Expect) -> Vec<String> {
    let mut wrong = Vec::new();
    for (from, row) in got {
        for (to, ok) in row {
            let (fns, fpod) = from.split_once('/').unwrap();
            let (tns, tpod) = to.split_once('/').unwrap();
            // A pod always reaches itself (the packet never leaves it).
            let want = from == to || expect(fns, fpod, tns, tpod);
            if *ok != want {
                wrong.push(format!(
                    "{from} -> {to}: expected {}, got {}",
                    if want { "allowed" } else { "denied" },
                    if *ok { "allowed" } else { "denied" }
                ));
            }
        }
    }
    wrong
}

pub fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "no policy: everything reaches everything",
            yaml: "",
            port: 80,
            protocol: "tcp",
            expect: |_, _, _, _| true,
        },
        Scenario {
            name: "deny all ingress in y",
            yaml: "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: 'y'}
spec:
  podSelector: {}
  policyTypes: [Ingress]",
            port: 80,
            protocol: "tcp",
            expect: |_, _, t, _| t != "y",
        },
        Scenario {
            name: "allow y ingress only from namespace x (namespace label)",
            yaml: "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-x, namespace: 'y'}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {ns: x}",
            port: 80,
            protocol: "tcp",
            expect: |f, _, t, _| t != "y" || f == "x",
        },
        Scenario {
            name: "allow y/a ingress only from pods b in any namespace",
            yaml: "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-from-b, namespace: 'y'}
spec:
  podSelector:
    matchLabels: {pod: a}
  ingress:
  - from:
    - namespaceSelector: {}
      podSelector:
        matchLabels: {pod: b}",
            port: 80,
            protocol: "tcp",
            expect: |_, fp, t, tp| !(t == "y" && tp == "a") || fp == "b",
        },
        Scenario {
            name: "allow ingress to x only from x itself",
            yaml: "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: same-ns, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - podSelector: {}",
            port: 80,
            protocol: "tcp",
            expect: |f, _, t, _| t != "x" || f == "x",
        },
        Scenario {
            name: "egress: x may only reach z",
            yaml: "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-to-z, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - ports:
    - {protocol: UDP, port: 53}
  - to:
    - namespaceSelector:
        matchExpressions:
        - {key: ns, operator: In, values: [z]}",
            port: 80,
            protocol: "tcp",
            expect: |f, _, t, _| f != "x" || t == "z",
        },
        Scenario {
            name: "egress deny all from z/c (DNS allowed)",
            yaml: "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: zc-egress, namespace: z}
spec:
  podSelector:
    matchLabels: {pod: c}
  policyTypes: [Egress]
  egress:
  - ports:
    - {protocol: UDP, port: 53}",
            port: 80,
            protocol: "tcp",
            expect: |f, fp, _, _| !(f == "z" && fp == "c"),
        },
        Scenario {
            name: "named port serve-81-tcp: probing 80 is denied",
            yaml: "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: named, namespace: 'y'}
spec:
  podSelector: {}
  ingress:
  - ports:
    - {protocol: TCP, port: serve-81-tcp}",
            port: 80,
            protocol: "tcp",
            expect: |_, _, t, _| t != "y",
        },
        Scenario {
            name: "named port serve-81-tcp: probing 81 is allowed",
            yaml: "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: named, namespace: 'y'}
spec:
  podSelector: {}
  ingress:
  - ports:
    - {protocol: TCP, port: serve-81-tcp}",
            port: 81,
            protocol: "tcp",
            expect: |_, _, _, _| true,
        },
        Scenario {
            name: "port range 80:81 allows 80",
            yaml: "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: range, namespace: z}
spec:
  podSelector: {}
  ingress:
  - ports:
    - {protocol: TCP, port: 80, endPort: 81}",
            port: 80,
            protocol: "tcp",
            expect: |_, _, _, _| true,
        },
        Scenario {
            name: "port range 81:82 denies 80",
            yaml: "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: range, namespace: z}
spec:
  podSelector: {}
  ingress:
  - ports:
    - {protocol: TCP, port: 81, endPort: 82}",
            port: 80,
            protocol: "tcp",
            expect: |_, _, t, _| t != "z",
        },
        Scenario {
            // Calico scopes a namespaced rule with a notSelector to the policy's namespace.
            name: "nets with notSelector in a namespaced policy: only y's own pods",
            yaml: "apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: cidr, namespace: 'y'}
spec:
  selector: all()
  ingress:
  - action: Allow
    source:
      nets: [10.244.0.0/16]
      notSelector: projectcalico.org/namespace == 'x'",
            port: 80,
            protocol: "tcp",
            expect: |f, _, t, _| t != "y" || f == "y",
        },
        Scenario {
            name: "ipBlock with except (nets, notNets): all but x/a reach z",
            yaml: "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: cidr-except, namespace: z}
spec:
  podSelector: {}
  ingress:
  - from:
    - ipBlock:
        cidr: 10.244.0.0/16
        except: ['{ip:x/a}/32']",
            port: 80,
            protocol: "tcp",
            expect: |f, fp, t, _| t != "z" || !(f == "x" && fp == "a"),
        },
        Scenario {
            name: "multiple policies combine (union of allows)",
            yaml: "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-x, namespace: 'y'}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {ns: x}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-zb, namespace: 'y'}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {ns: z}
      podSelector:
        matchLabels: {pod: b}",
            port: 80,
            protocol: "tcp",
            expect: |f, fp, t, _| t != "y" || f == "x" || (f == "z" && fp == "b"),
        },
        Scenario {
            name: "UDP: deny all ingress to x for UDP only",
            yaml: "apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: no-udp, namespace: x}
spec:
  selector: all()
  ingress:
  - action: Deny
    protocol: UDP
  - action: Allow",
            port: 81,
            protocol: "udp",
            expect: |_, _, t, _| t != "x",
        },
        Scenario {
            name: "UDP policy leaves TCP alone",
            yaml: "apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: no-udp, namespace: x}
spec:
  selector: all()
  ingress:
  - action: Deny
    protocol: UDP
  - action: Allow",
            port: 81,
            protocol: "tcp",
            expect: |_, _, _, _| true,
        },
        Scenario {
            name: "GlobalNetworkPolicy: deny from z everywhere",
            yaml: "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: deny-z}
spec:
  selector: all()
  ingress:
  - action: Deny
    source: {namespaceSelector: ns == 'z'}
  - action: Allow",
            port: 80,
            protocol: "tcp",
            expect: |f, _, _, _| f != "z",
        },
        Scenario {
            name: "order: a lower order deny wins over an allow",
            yaml: "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: allow-all}
spec:
  order: 200
  selector: all()
  ingress: [{action: Allow}]
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: deny-a}
spec:
  order: 100
  selector: pod == 'c'
  ingress:
  - action: Deny
    source: {selector: pod == 'a'}",
            port: 80,
            protocol: "tcp",
            expect: |_, fp, _, tp| !(tp == "c" && fp == "a"),
        },
        Scenario {
            name: "tiers: security tier denies x->z and passes the rest; default tier allows",
            yaml: "apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: security}
spec: {order: 100}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: security.gate}
spec:
  tier: security
  selector: all()
  types: [Ingress]
  ingress:
  - action: Deny
    source: {namespaceSelector: ns == 'x'}
    destination: {namespaceSelector: ns == 'z'}
  - action: Pass",
            port: 80,
            protocol: "tcp",
            expect: |f, _, t, _| !(f == "x" && t == "z"),
        },
        Scenario {
            name: "tier default action: a tier whose policies match nothing drops",
            yaml: "apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: strict}
spec: {order: 50}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: strict.only-y}
spec:
  tier: strict
  selector: projectcalico.org/namespace == 'y'
  types: [Ingress]
  ingress:
  - action: Pass
    source: {namespaceSelector: ns == 'y'}",
            port: 80,
            protocol: "tcp",
            expect: |f, _, t, _| t != "y" || f == "y",
        },
        Scenario {
            name: "GlobalNetworkSet: deny sources in a labelled set of nets",
            yaml: "apiVersion: projectcalico.org/v3
kind: GlobalNetworkSet
metadata:
  name: blocked
  labels: {blocked: 'true'}
spec:
  nets: [10.244.0.0/16]
---
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: block-set, namespace: z}
spec:
  selector: pod == 'a'
  ingress:
  - action: Deny
    source: {selector: blocked == 'true', namespaceSelector: global()}
  - action: Allow",
            port: 80,
            protocol: "tcp",
            expect: |_, _, t, tp| !(t == "z" && tp == "a"),
        },
        Scenario {
            name: "NetworkSet in a namespace, selected from a namespaced policy",
            yaml: "apiVersion: projectcalico.org/v3
kind: NetworkSet
metadata:
  name: everything
  namespace: 'y'
  labels: {role: anyone}
spec:
  nets: [0.0.0.0/0]
---
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: via-set, namespace: 'y'}
spec:
  selector: pod == 'b'
  ingress:
  - action: Allow
    source: {selector: role == 'anyone'}",
            port: 80,
            protocol: "tcp",
            expect: |_, _, _, _| true,
        },
        Scenario {
            name: "egress Deny action to y/c, allow the rest",
            yaml: "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: no-yc}
spec:
  selector: all()
  types: [Egress]
  egress:
  - action: Deny
    destination: {selector: pod == 'c', namespaceSelector: ns == 'y'}
  - action: Allow",
            port: 80,
            protocol: "tcp",
            expect: |_, _, t, tp| !(t == "y" && tp == "c"),
        },
        Scenario {
            name: "Log then Allow from b only, into a",
            yaml: "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: log-then-allow}
spec:
  selector: pod == 'a'
  types: [Ingress]
  ingress:
  - action: Log
  - action: Allow
    source: {selector: pod == 'b'}",
            port: 80,
            protocol: "tcp",
            expect: |_, fp, _, tp| tp != "a" || fp == "b",
        },
        Scenario {
            name: "ingress and egress together: y/b talks only to x",
            yaml: "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: yb, namespace: 'y'}
spec:
  podSelector:
    matchLabels: {pod: b}
  policyTypes: [Ingress, Egress]
  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {ns: x}
  egress:
  - to:
    - namespaceSelector:
        matchLabels: {ns: x}",
            port: 80,
            protocol: "tcp",
            expect: |f, fp, t, tp| {
                let from_yb = f == "y" && fp == "b";
                let to_yb = t == "y" && tp == "b";
                (!from_yb || t == "x") && (!to_yb || f == "x")
            },
        },
        Scenario {
            name: "deny all ingress and egress cluster-wide",
            yaml: "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: lockdown}
spec:
  selector: all()
  types: [Ingress, Egress]",
            port: 80,
            protocol: "tcp",
            expect: |_, _, _, _| false,
        },
        Scenario {
            name: "service-account-free notSelector on destination",
            yaml: "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: not-a}
spec:
  selector: all()
  types: [Egress]
  egress:
  - action: Allow
    destination: {notSelector: pod == 'a'}",
            port: 80,
            protocol: "tcp",
            expect: |_, _, _, tp| tp != "a",
        },
    ]
}
