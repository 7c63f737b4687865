//! `margay felix` with the Linux dataplane, inside a test "node" namespace with pod
//! namespaces behind `cali*` veths: policy from the datastore is enforced (real probes), the
//! status shows the nft chains, and a Felix killed and restarted keeps established connections
//! and never drops new allowed ones. Root only; everything lives in namespaces the test made.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use margay_testkit::netns::{Netns, is_root};
use serde_json::Value;

const NODE: &str = "nodea";

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_margay")
}

struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Env {
    dir: TempDir,
    node: Netns,
    pods: Vec<(Netns, &'static str)>,
    procs: Procs,
}

impl Env {
    fn db(&self) -> PathBuf {
        self.dir.0.join("store.db")
    }

    fn socket(&self) -> PathBuf {
        self.dir.0.join("felix.sock")
    }

    fn margay(&self) -> Command {
        let mut c = Command::new(bin());
        c.env_clear()
            .env("DATASTORE_TYPE", "local")
            .env("DATASTORE_PATH", self.db());
        c
    }

    fn apply(&self, name: &str, yaml: &str) {
        let file = self.dir.0.join(name);
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

    fn delete(&self, kind: &str, name: &str, ns: Option<&str>) {
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

    /// Starts Felix inside the node namespace (appended to `procs`; returns its index).
    fn start_felix(&mut self) -> usize {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.0.join("felix.log"))
            .unwrap();
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                self.node.name(),
                bin(),
                "felix",
                "run",
                "--status-socket",
            ])
            .arg(self.socket())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATASTORE_TYPE", "local")
            .env("DATASTORE_PATH", self.db())
            .env("FELIX_FELIXHOSTNAME", NODE)
            .env("FELIX_HEALTHENABLED", "false")
            .env("FELIX_LOGSEVERITYSCREEN", "Info")
            .env("MARGAY_DATAPLANE", "linux")
            .env("FELIX_ENDPOINTSTATUSPATHPREFIX", self.dir.0.join("status"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.procs.0.push(child);
        self.procs.0.len() - 1
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

    fn wait_in_sync(&self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.status()
                && s["dataplane"]["in_sync"] == Value::Bool(true)
            {
                return s;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.0.join("felix.log")).unwrap_or_default();
                panic!("felix did not get its dataplane in sync in 30 s; log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn tcp(&self, from: usize, to: usize, port: u16, timeout: &str) -> bool {
        self.pods[from]
            .0
            .exec("timeout")
            .args([
                timeout,
                "nc",
                "-z",
                "-w",
                "1",
                self.pods[to].1,
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    /// Polls until the probe gives `want`; returns how long it took.
    fn until(&self, from: usize, to: usize, port: u16, want: bool, limit: Duration) -> Duration {
        let t = Instant::now();
        loop {
            if self.tcp(from, to, port, "0.3") == want {
                return t.elapsed();
            }
            assert!(
                t.elapsed() < limit,
                "probe {from}->{to}:{port} still not {want} after {limit:?}"
            );
        }
    }
}

fn pod(node: &Netns, name: &str, ip: &'static str, iface: &str) -> Netns {
    node.add_pod(&format!("fl-{name}"), ip, iface).unwrap()
}

fn setup() -> Env {
    let dir = std::env::temp_dir().join(format!(
        "margay-felix-linux-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let node = Netns::new("fl-node").unwrap();
    node.sysctl("net.ipv4.ip_forward", "1").unwrap();
    node.add_veth("uplink0", "uplink1", &["192.0.2.1/24"])
        .unwrap();
    node.ip(&[
        "route",
        "add",
        "default",
        "via",
        "192.0.2.254",
        "dev",
        "uplink0",
    ])
    .unwrap();
    let web = pod(&node, "web", "10.65.0.1", "caliweb0");
    let db = pod(&node, "db", "10.65.0.2", "calidb00");
    let mut procs = Procs(Vec::new());
    for ns in [&web, &db] {
        for port in ["80", "81", "82"] {
            procs.0.push(
                ns.exec("nc")
                    .args(["-l", "-k", "-p", port])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
    }
    let env = Env {
        dir: TempDir(dir),
        node,
        pods: vec![(web, "10.65.0.1"), (db, "10.65.0.2")],
        procs,
    };
    // Registered as `margay node startup` does (ClusterInformation ready, the Node).
    let out = env
        .margay()
        .args(["node", "startup", "--root"])
        .arg(env.dir.0.join("root"))
        .env("NODENAME", NODE)
        .env("IP", "192.0.2.1/24")
        .env("NO_DEFAULT_POOLS", "true")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    env.apply(
        "seed.yaml",
        &format!(
            "apiVersion: projectcalico.org/v3
kind: Profile
metadata: {{name: kns.prod}}
spec:
  ingress: [{{action: Allow}}]
  egress: [{{action: Allow}}]
---
apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: {NODE}-k8s-web-eth0
  namespace: prod
  labels: {{app: web}}
spec: {{orchestrator: k8s, node: {NODE}, pod: web, endpoint: eth0, interfaceName: caliweb0, ipNetworks: [10.65.0.1/32], profiles: [kns.prod]}}
---
apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: {NODE}-k8s-db-eth0
  namespace: prod
  labels: {{app: db}}
spec: {{orchestrator: k8s, node: {NODE}, pod: db, endpoint: eth0, interfaceName: calidb00, ipNetworks: [10.65.0.2/32], profiles: [kns.prod]}}
"
        ),
    );
    // Listeners up before any probe.
    let deadline = Instant::now() + Duration::from_secs(10);
    for (ns, _) in &env.pods {
        loop {
            let out = ns.exec("ss").args(["-ltn"]).output().unwrap();
            let t = String::from_utf8_lossy(&out.stdout);
            if t.contains(":80 ") && t.contains(":81 ") && t.contains(":82 ") {
                break;
            }
            assert!(Instant::now() < deadline, "listeners did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    env
}

const DENY_DB: &str = "apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: db-only-81, namespace: prod}
spec:
  selector: app == 'db'
  ingress:
  - action: Allow
    protocol: TCP
    destination: {ports: [81, 82]}
";

#[test]
fn felix_enforces_datastore_policy_and_survives_a_restart() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let mut env = setup();
    let felix = env.start_felix();
    let status = env.wait_in_sync();
    assert_eq!(status["dataplane"]["driver"], "linux");
    let eps = status["dataplane"]["nft"]["endpoints"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(eps.len(), 2, "{status:#}");
    assert!(env.tcp(0, 1, 80, "1"), "profiles allow web -> db:80");
    // The CNI plugin can wait for these: one status file per programmed endpoint.
    let status_dir = env.dir.0.join("status/endpoint-status");
    let mut files: Vec<String> = std::fs::read_dir(&status_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, vec!["k8s prod%2Fdb eth0", "k8s prod%2Fweb eth0"]);
    let web: Value =
        serde_json::from_slice(&std::fs::read(status_dir.join("k8s prod%2Fweb eth0")).unwrap())
            .unwrap();
    assert_eq!(web["ifaceName"], "caliweb0");

    // A policy arrives through the datastore: enforced within a bounded time.
    env.apply("deny.yaml", DENY_DB);
    let took = env.until(0, 1, 80, false, Duration::from_secs(5));
    eprintln!("policy enforced {took:?} after the datastore write (probe resolution ~0.3 s)");
    assert!(env.tcp(0, 1, 81, "1"), "db:81 stays allowed");
    let text = env
        .margay()
        .args(["felix", "status", "--socket"])
        .arg(env.socket())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("nftables:") && text.contains("tw-calidb00"),
        "{text}"
    );

    // An established connection survives Felix being killed and restarted.
    let mut conn = env.pods[0]
        .0
        .exec("nc")
        .args(["10.65.0.2", "82"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin: ChildStdin = conn.stdin.take().unwrap();
    stdin.write_all(b"before\n").unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    env.procs.0[felix].kill().unwrap();
    env.procs.0[felix].wait().unwrap();
    // Felix is down: the kernel keeps enforcing (nothing was flushed).
    assert!(
        !env.tcp(0, 1, 80, "0.5"),
        "policy must stay while Felix is down"
    );
    assert!(
        env.tcp(0, 1, 81, "1"),
        "allowed traffic must flow while Felix is down"
    );
    let _second = env.start_felix();
    // New allowed connections keep working throughout the restart.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        assert!(
            env.tcp(0, 1, 81, "1"),
            "an allowed probe failed during the restart"
        );
    }
    env.wait_in_sync();
    stdin.write_all(b"after\n").unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        conn.try_wait().unwrap().is_none(),
        "the established connection was cut"
    );
    let _ = conn.kill();
    let _ = conn.wait();
    // The restarted Felix read the table back and found nothing to rewrite.
    let s = env.status().unwrap();
    assert_eq!(
        s["dataplane"]["nft"]["transactions"].as_u64().unwrap(),
        0,
        "a restarted Felix found the table as it wants it: {s:#}"
    );

    // Removing the policy restores the profile's allow.
    env.delete("networkpolicy", "db-only-81", Some("prod"));
    env.until(0, 1, 80, true, Duration::from_secs(5));
}
