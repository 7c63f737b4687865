//! Services without kube-proxy, in the lab on the Kubernetes API, on both dataplanes (the
//! same scenarios with nftables and with `--dataplane bpf`):
//! Services made with `kubectl apply` (the API server allocates ClusterIPs and NodePorts), the
//! lab's EndpointSlice controller filling their slices from the pods' labels and readiness,
//! Felix programming them — kube-proxy's behaviour, scenario by scenario:
//! - a ClusterIP spreads over every ready endpoint (named target port resolved);
//! - sessionAffinity ClientIP sticks;
//! - NodePort from another node: externalTrafficPolicy Cluster answers on every node;
//!   Local only on nodes with a local endpoint, and the backend sees the client's address;
//! - policy through a Service: a NetworkPolicy denying the backend denies via the ClusterIP,
//!   one allowing it allows — the same verdicts as direct pod traffic;
//! - a LoadBalancer Service gets an address from kube-controllers (a pool allowing
//!   LoadBalancer) and answers on it, under the same policy;
//! - scaled to zero endpoints: refused at once (a reset), not a timeout.
//!
//! Root and kubectl needed (skipped otherwise). The lab is removed on drop, pass or fail;
//! every wait is bounded.
#![allow(clippy::unwrap_used)]

mod lab_common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use lab_common::Lab;
use margay_testkit::netns::is_root;
use serde_json::Value;

fn kubectl_bin() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
}

fn can_run() -> bool {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return false;
    }
    if kubectl_bin().is_none() {
        eprintln!(
            "SKIPPED: no kubectl on PATH (scripts/setup installs Debian's kubernetes-client)"
        );
        return false;
    }
    true
}

fn show(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs a command to completion within `limit` (killed and failed otherwise).
fn finish(mut c: Command, limit: Duration) -> Output {
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{c:?} did not finish within {limit:?}: {}", show(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// kubectl with the lab's kubeconfig.
struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    home: PathBuf,
}

impl Kubectl {
    fn for_lab(lab: &Lab) -> Kubectl {
        let kubeconfig = PathBuf::from(lab.ok(&["kubeconfig"]).trim());
        let home = lab.dir.join("kubectl-home");
        std::fs::create_dir_all(&home).unwrap();
        Kubectl {
            bin: kubectl_bin().unwrap(),
            kubeconfig,
            home,
        }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.home.join("cache"))
            .args(args)
            .env("HOME", &self.home)
            .env_remove("KUBECONFIG");
        c
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = finish(self.cmd(args), Duration::from_secs(60));
        assert!(out.status.success(), "kubectl {args:?}: {}", show(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn apply(&self, yaml: &str) {
        let mut c = self.cmd(&["apply", "-f", "-"]);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(yaml.as_bytes())
                .unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl apply: {}\n{yaml}",
            show(&out)
        );
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&a)).unwrap()
    }
}

/// `lab probe FROM TO --show`: the answer (`<pod> <client address>`), or None when not reached.
fn probe(lab: &Lab, from: &str, to: &str, extra: &[&str]) -> Option<(String, String)> {
    let mut args = vec!["probe", from, to, "--show", "--timeout-ms", "1500"];
    args.extend_from_slice(extra);
    let out = lab.cmd(&args).output().unwrap();
    match out.status.code() {
        Some(0) => {
            let text = String::from_utf8_lossy(&out.stdout);
            // `<from> -> <to> tcp/<port>: allowed (<pod> <address>)`
            let inner = text
                .split_once("allowed (")
                .and_then(|(_, r)| r.trim().strip_suffix(')'))
                .unwrap_or_else(|| panic!("unexpected probe output {text:?}"));
            let (pod, addr) = inner.split_once(' ').unwrap_or((inner, ""));
            Some((pod.to_string(), addr.to_string()))
        }
        Some(1) => None,
        _ => panic!("lab probe {from} {to}: {}", show(&out)),
    }
}

/// Retries until the probe's answer satisfies `want` (bounded: 40 s).
fn eventually(
    lab: &Lab,
    from: &str,
    to: &str,
    extra: &[&str],
    what: &str,
    want: impl Fn(&Option<(String, String)>) -> bool,
) -> Option<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let got = probe(lab, from, to, extra);
        if want(&got) {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "{from} -> {to}: {what} not within 40 s (last answer {got:?}); felix logs:\n{}",
            felix_logs(lab)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn felix_logs(lab: &Lab) -> String {
    let mut s = String::new();
    for node in ["node1", "node2"] {
        let path = lab.dir.join(format!("nodes/{node}/felix.log"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        s.push_str(&format!("--- {}\n", path.display()));
        for l in tail.into_iter().rev() {
            s.push_str(l);
            s.push('\n');
        }
    }
    s
}

const SERVICES: &str = "
apiVersion: v1
kind: Service
metadata: {name: web, namespace: x}
spec:
  selector: {app: web}
  ports: [{name: http, port: 8080, targetPort: serve-80-tcp}]
---
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: x}
spec:
  selector: {app: web}
  sessionAffinity: ClientIP
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: np-cluster, namespace: x}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: np-local, namespace: x}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  selector: {only: b}
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: only-b, namespace: x}
spec:
  selector: {only: b}
  ports: [{port: 80}]
";

#[test]
fn services_behave_as_with_kube_proxy_on_a_kubernetes_lab() {
    services_behave_as_with_kube_proxy("ksvc", "linux");
}

#[test]
fn services_behave_as_with_kube_proxy_on_a_kubernetes_lab_on_ebpf() {
    services_behave_as_with_kube_proxy("ksvb", "bpf");
}

fn services_behave_as_with_kube_proxy(tag: &str, dataplane: &str) {
    if !can_run() {
        return;
    }
    let lab = Lab::up_with(
        tag,
        &["--datastore", "kubernetes", "--dataplane", dataplane],
    );
    let k = Kubectl::for_lab(&lab);
    // x/a and x/c run on node1, x/b on node2 (the default topology).
    k.ok(&["label", "pod", "-n", "x", "a", "b", "c", "app=web"]);
    k.ok(&["label", "pod", "-n", "x", "b", "only=b"]);
    k.apply(SERVICES);

    // The API server allocated the addresses; the lab's controller made the slices.
    let web = k.json(&["get", "service", "-n", "x", "web"]);
    assert!(
        web["spec"]["clusterIP"]
            .as_str()
            .unwrap()
            .starts_with("10."),
        "{web}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let slices = k.json(&[
            "get",
            "endpointslices",
            "-n",
            "x",
            "-l",
            "kubernetes.io/service-name=web",
        ]);
        let items = slices["items"].as_array().unwrap();
        let eps = items
            .first()
            .and_then(|s| s["endpoints"].as_array())
            .map_or(0, Vec::len);
        if eps == 3 {
            let s = &items[0];
            assert_eq!(
                s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"],
                "endpointslice-controller.k8s.io"
            );
            // The named target port, resolved from the pods' container ports.
            assert_eq!(s["ports"][0]["port"], 80, "{s}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "web's slice not filled: {slices}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // ClusterIP: 30 connections reach every ready endpoint.
    eventually(&lab, "y/a", "svc/x/web", &[], "reached", Option::is_some);
    let mut seen = BTreeSet::new();
    for _ in 0..30 {
        if let Some((pod, _)) = probe(&lab, "y/a", "svc/x/web", &[]) {
            seen.insert(pod);
        }
    }
    assert_eq!(
        seen,
        BTreeSet::from(["x/a".to_string(), "x/b".to_string(), "x/c".to_string()]),
        "every backend answers through the ClusterIP"
    );

    // sessionAffinity ClientIP: one client, one backend.
    let (first, _) =
        eventually(&lab, "y/b", "svc/x/sticky", &[], "reached", Option::is_some).unwrap();
    for _ in 0..10 {
        let (pod, _) = probe(&lab, "y/b", "svc/x/sticky", &[]).unwrap();
        assert_eq!(pod, first, "ClientIP affinity sticks");
    }

    // NodePort, externalTrafficPolicy Cluster: node1 reaches it on node2's address.
    let st = lab.status();
    let node_ip = |name: &str| -> String {
        st["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .and_then(|n| n["ip"].as_str())
            .unwrap_or_else(|| panic!("no {name} in {st}"))
            .to_string()
    };
    let (ip1, ip2) = (node_ip("node1"), node_ip("node2"));
    let np = |svc: &str| {
        k.json(&["get", "service", "-n", "x", svc])["spec"]["ports"][0]["nodePort"]
            .as_u64()
            .unwrap()
            .to_string()
    };
    let (np_cluster, np_local) = (np("np-cluster"), np("np-local"));
    eventually(
        &lab,
        "node/node1",
        "node/node2",
        &["--port", &np_cluster],
        "NodePort (Cluster) answered",
        Option::is_some,
    );
    // Local: node2 has the only endpoint (x/b), which sees node1's own address.
    let (pod, client) = eventually(
        &lab,
        "node/node1",
        "node/node2",
        &["--port", &np_local],
        "NodePort (Local) answered on node2",
        Option::is_some,
    )
    .unwrap();
    assert_eq!(pod, "x/b");
    assert_eq!(
        client, ip1,
        "externalTrafficPolicy Local keeps the source address"
    );
    // node1 has no local endpoint: it does not answer.
    assert_eq!(
        probe(&lab, "node/node2", "node/node1", &["--port", &np_local]),
        None,
        "a node without a local endpoint answers no Local NodePort"
    );
    let _ = ip2;

    // Policy through a Service: the same verdicts as direct pod traffic.
    eventually(&lab, "y/a", "svc/x/only-b", &[], "reached", Option::is_some);
    k.apply(
        "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
",
    );
    eventually(&lab, "y/a", "svc/x/only-b", &[], "denied", Option::is_none);
    assert!(!lab.probe("y/a", "x/b", 1500), "direct traffic denied too");
    k.apply(
        "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-y, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: 'y'}}}]}]
",
    );
    eventually(&lab, "y/a", "svc/x/only-b", &[], "allowed", Option::is_some);
    assert!(lab.probe("y/a", "x/b", 1500), "direct traffic allowed too");
    assert!(
        probe(&lab, "z/a", "svc/x/only-b", &[]).is_none(),
        "z is still denied through the Service"
    );

    // LoadBalancer: kube-controllers' loadbalancer controller gives it an address from the
    // pool that allows LoadBalancer; Felix serves it on every node like the ClusterIP.
    lab.apply(
        "apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: lb-pool}
spec: {cidr: 10.250.0.0/24, blockSize: 28, allowedUses: [LoadBalancer]}
",
    );
    k.apply(
        "apiVersion: v1
kind: Service
metadata: {name: lb, namespace: x}
spec:
  type: LoadBalancer
  selector: {only: b}
  ports: [{port: 80}]
",
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    let lb_ip = loop {
        let s = k.json(&["get", "service", "-n", "x", "lb"]);
        if let Some(ip) = s
            .pointer("/status/loadBalancer/ingress/0/ip")
            .and_then(Value::as_str)
        {
            break ip.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no LoadBalancer address within 40 s: {s}\n{}",
            std::fs::read_to_string(lab.dir.join("kube-controllers/kube-controllers.log"))
                .unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(lb_ip.starts_with("10.250.0."), "{lb_ip}");
    let (pod, _) = eventually(
        &lab,
        "y/a",
        &lb_ip,
        &["--port", "80"],
        "the LoadBalancer address reached",
        Option::is_some,
    )
    .unwrap();
    assert_eq!(pod, "x/b");
    assert!(
        probe(&lab, "z/a", &lb_ip, &["--port", "80"]).is_none(),
        "policy holds through the LoadBalancer address too"
    );

    // Scaled to zero: refused at once, not a timeout.
    k.ok(&["label", "pod", "-n", "x", "a", "b", "c", "app-"]);
    eventually(&lab, "y/a", "svc/x/web", &[], "refused", Option::is_none);
    let started = Instant::now();
    let out = lab
        .cmd(&["probe", "y/a", "svc/x/web", "--timeout-ms", "5000"])
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(
        took < Duration::from_secs(2),
        "a Service without endpoints is refused, not left to time out ({took:?})"
    );

    // The matrix takes Services as columns.
    let m = lab.ok(&["matrix", "-o", "json", "--service", "svc/x/only-b"]);
    let m: Value = serde_json::from_str(&m).unwrap();
    assert_eq!(m["y/a"]["svc/x/only-b"], true, "{m}");
    assert_eq!(m["z/a"]["svc/x/only-b"], false, "{m}");
}
