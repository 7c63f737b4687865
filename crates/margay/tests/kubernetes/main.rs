//! Every role on the Kubernetes datastore, end to end: the real `margay` binary (ctl, node
//! startup, felix, confd, typha) against margay's in-process Kubernetes API server double
//! (`margay_apiserver`, TLS with a bearer token, Calico's CRDs installed), holding real
//! Kubernetes objects — Namespaces with labels, a ServiceAccount, Pods scheduled on nodes with
//! their IPs in `status.podIPs` or Calico's `cni.projectcalico.org/podIP` annotation, Nodes with
//! Calico's `projectcalico.org/*` annotations, `networking.k8s.io/v1` NetworkPolicies — and
//! Calico's custom resources. What the roles write is checked in the double itself, with
//! Calico's layout. Section 6 is start-up in a kubeadm cluster (kube-system's ConfigMaps, also
//! with etcd as the datastore) and `margay node network-condition` on the Node's conditions.
//! No root needed: Felix uses the recording dataplane, node start-up gets its address from
//! `IP=` (or from the Node's InternalIP on lo), confd does not reload BIRD.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use margay_apiserver::{ApiServer, Gvr, PatchType, ServerOptions, StoreHandle};
use margay_testkit::roles::Role;
use serde_json::{Value, json};

const PODS: Gvr = Gvr::core("pods");
const NAMESPACES: Gvr = Gvr::core("namespaces");
const SERVICE_ACCOUNTS: Gvr = Gvr::core("serviceaccounts");
const NODES: Gvr = Gvr::core("nodes");
const K8S_NETPOLS: Gvr = Gvr::new("networking.k8s.io", "v1", "networkpolicies");
const METADATA_ANNOTATION: &str = "projectcalico.org/metadata";

/// How long any one thing may take before the test fails.
const WAIT: Duration = Duration::from_secs(30);

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_margay")
}

/// The API server double, a temp directory with its kubeconfig, and the objects of a small
/// cluster.
struct Cluster {
    api: ApiServer,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Cluster {
    fn start() -> Cluster {
        let api = ApiServer::start(ServerOptions {
            calico_crds: true,
            ..ServerOptions::default()
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).unwrap();
        Cluster {
            api,
            dir,
            kubeconfig,
        }
    }

    fn store(&self) -> StoreHandle {
        self.api.store()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn file(&self, name: &str, text: &str) -> String {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    /// `margay` with nothing from the test's environment but PATH, pointed at the double
    /// through DATASTORE_TYPE and KUBECONFIG. HOME is the temp dir, so no ~/.kube/config or
    /// /etc/calico/calicoctl.cfg of the machine is read.
    fn margay(&self) -> Command {
        let mut c = Command::new(bin());
        c.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .env("DATASTORE_TYPE", "kubernetes")
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::null());
        c
    }

    /// `margay ctl ARGS` through the environment variables.
    fn ctl(&self, args: &[&str]) -> Run {
        let mut c = self.margay();
        c.arg("ctl").args(args);
        run(c)
    }

    /// `margay ctl --config FILE ARGS` with calicoctl's config file (`datastoreType:
    /// kubernetes`, `kubeconfig: PATH`) and no datastore variables at all.
    fn ctl_with_config_file(&self, args: &[&str]) -> Run {
        let cfg = self.path("calicoctl.cfg");
        std::fs::write(
            &cfg,
            format!(
                "apiVersion: projectcalico.org/v3\nkind: CalicoAPIConfig\nmetadata: {{}}\nspec:\n  datastoreType: kubernetes\n  kubeconfig: {}\n",
                self.kubeconfig.display()
            ),
        )
        .unwrap();
        let mut c = self.margay();
        c.env_remove("DATASTORE_TYPE").env_remove("KUBECONFIG");
        c.arg("ctl").arg("--config").arg(&cfg).args(args);
        run(c)
    }

    fn ctl_ok(&self, args: &[&str]) -> String {
        let r = self.ctl(args);
        assert_eq!(r.code, 0, "margay ctl {args:?}: {r:?}");
        r.out
    }

    /// `margay node startup` for `node` with an explicit address (no autodetection, so no
    /// namespace or root is needed), as calico-node runs it on that node; the default pool is
    /// the pods' 10.65.0.0/16 with VXLAN, so start-up also allocates a tunnel address.
    fn node_startup(&self, node: &str, ip: &str) -> Run {
        self.node_startup_with(node, &[("IP", ip)])
    }

    fn node_startup_with(&self, node: &str, env: &[(&str, &str)]) -> Run {
        let mut c = self.margay();
        c.args(["node", "startup", "--root"])
            .arg(self.path(&format!("root-{node}")))
            .env("NODENAME", node)
            .env("CALICO_IPV4POOL_CIDR", "10.65.0.0/16")
            .env("CALICO_IPV4POOL_VXLAN", "Always");
        for (k, v) in env {
            c.env(k, v);
        }
        run(c)
    }

    /// A namespace with labels, a service account, Nodes node1 (10.0.0.1) and node2
    /// (10.0.0.2, already annotated by calico-node), pods on both, a host-network pod, and a
    /// Kubernetes NetworkPolicy letting clients reach the web pods.
    fn seed(&self) {
        let s = self.store();
        s.create(
            NAMESPACES,
            "",
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "shop", "labels": {"team": "shop", "kubernetes.io/metadata.name": "shop"}}}),
        )
        .unwrap();
        s.create(
            SERVICE_ACCOUNTS,
            "shop",
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "web-sa", "namespace": "shop", "labels": {"role": "frontend"}}}),
        )
        .unwrap();
        s.create(NODES, "", k8s_node("node1", "10.0.0.1", json!({})))
            .unwrap();
        s.create(
            NODES,
            "",
            k8s_node(
                "node2",
                "10.0.0.2",
                json!({"projectcalico.org/IPv4Address": "10.0.0.2/24"}),
            ),
        )
        .unwrap();
        for p in [
            pod(
                "web-1",
                "node1",
                "web",
                Some("web-sa"),
                IpVia::Status("10.65.0.2"),
            ),
            pod(
                "web-2",
                "node1",
                "web",
                None,
                IpVia::Annotation("10.65.0.3/32"),
            ),
            pod(
                "client-1",
                "node2",
                "client",
                None,
                IpVia::Status("10.65.1.2"),
            ),
        ] {
            s.create(PODS, "shop", p).unwrap();
        }
        let mut host = pod(
            "node-agent",
            "node1",
            "agent",
            None,
            IpVia::Status("10.0.0.1"),
        );
        host["spec"]["hostNetwork"] = json!(true);
        s.create(PODS, "shop", host).unwrap();
        s.create(K8S_NETPOLS, "shop", allow_clients_to_web())
            .unwrap();
    }
}

fn k8s_node(name: &str, ip: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
            "annotations": annotations,
        },
        "spec": {},
        "status": {"addresses": [
            {"type": "InternalIP", "address": ip},
            {"type": "Hostname", "address": name},
        ]},
    })
}

/// Where a pod's address is: the kubelet's `status.podIPs`, or the annotation Calico's CNI
/// plugin writes.
enum IpVia<'a> {
    Status(&'a str),
    Annotation(&'a str),
}

fn pod(name: &str, node: &str, app: &str, sa: Option<&str>, ip: IpVia) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "labels": {"app": app}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "nginx",
                            "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}]}],
        },
        "status": {"phase": "Running"},
    });
    if let Some(sa) = sa {
        p["spec"]["serviceAccountName"] = json!(sa);
    }
    match ip {
        IpVia::Status(ip) => {
            p["status"]["podIP"] = json!(ip);
            p["status"]["podIPs"] = json!([{"ip": ip}]);
        }
        IpVia::Annotation(cidr) => {
            p["metadata"]["annotations"] = json!({
                "cni.projectcalico.org/podIP": cidr,
                "cni.projectcalico.org/podIPs": cidr,
                "cni.projectcalico.org/containerID": "0123456789abcdef",
            });
        }
    }
    p
}

fn allow_clients_to_web() -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "allow-client", "namespace": "shop"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "web"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                         "ports": [{"protocol": "TCP", "port": 80}]}],
        },
    })
}

struct Run {
    code: i32,
    out: String,
    err: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.out, self.err
        )
    }
}

/// Runs a command to completion, killed after a minute.
fn run(c: Command) -> Run {
    let o = assert_cmd::Command::from_std(c)
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    Run {
        code: o.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// The JSON in a custom resource's `projectcalico.org/metadata` annotation.
fn stored_metadata(cr: &Value) -> Value {
    let text = cr["metadata"]["annotations"][METADATA_ANNOTATION]
        .as_str()
        .unwrap_or_else(|| panic!("no {METADATA_ANNOTATION} annotation on {cr}"));
    serde_json::from_str(text).unwrap()
}

fn rv(obj: &Value) -> String {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Polls `f` until it returns Ok, failing with `what` (and the last Err) after `within`.
fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + within;
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("timed out after {within:?} waiting for {what}; last: {last}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Felix's local endpoints by id (`k8s/<namespace>/<pod>/eth0`).
fn endpoints(st: &Value) -> BTreeMap<String, Value> {
    st["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["id"].as_str().unwrap().to_string(), e.clone()))
        .collect()
}

/// BIRD itself accepts the file (`bird -p -c`; scripts/setup installs bird2, as confd.rs needs).
fn bird_accepts(path: &std::path::Path) {
    let out = Command::new("bird")
        .arg("-p")
        .arg("-c")
        .arg(path)
        .output()
        .expect("`bird` must be installed (scripts/setup installs bird2)");
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running `margay felix` (a supervised testkit role).
struct Felix {
    role: Role,
    socket: PathBuf,
}

impl Felix {
    fn start(k: &Cluster, host: &str, extra_env: &[(&str, &str)]) -> Felix {
        let socket = k.path(&format!("run-{host}/felix.sock"));
        let log = k.path(&format!("felix-{host}.log"));
        let cfg = k.path("felix.cfg");
        std::fs::write(&cfg, "[global]\nLogSeverityScreen = Info\n").unwrap();
        let mut c = k.margay();
        c.env_remove("DATASTORE_TYPE")
            .env("FELIX_DATASTORETYPE", "kubernetes")
            .env("MARGAY_DATAPLANE", "recording")
            .env("FELIX_FELIXHOSTNAME", host)
            // The machine's own syslog is none of the test's business.
            .env("FELIX_LOGFILEPATH", "none")
            .env("FELIX_LOGSEVERITYSYS", "none")
            .env("FELIX_HEALTHENABLED", "false")
            .env("FELIX_PROMETHEUSMETRICSENABLED", "false")
            .args(["felix", "run", "-c"])
            .arg(&cfg)
            .arg("--status-socket")
            .arg(&socket);
        for (key, v) in extra_env {
            c.env(key, v);
        }
        Felix {
            role: Role::spawn("felix", c, log),
            socket,
        }
    }

    fn log(&self) -> String {
        self.role.log()
    }

    /// `margay felix status --json`; Err while Felix is not answering yet.
    fn status(&mut self) -> Result<Value, String> {
        self.role.assert_running();
        let mut c = Command::new(bin());
        c.env_clear()
            .args(["felix", "status", "--json", "--status-socket"])
            .arg(&self.socket);
        let r = run(c);
        if r.code != 0 {
            return Err(format!("{r:?}"));
        }
        serde_json::from_str(&r.out).map_err(|e| format!("{e}: {}", r.out))
    }

    /// Waits until Felix is in sync and `check` accepts its status.
    fn wait(&mut self, what: &str, check: impl Fn(&Value) -> Result<(), String>) -> Value {
        wait_for(what, WAIT, || {
            let st = self.status()?;
            if st["in_sync"] != true {
                return Err(format!("not in sync: {}", st["sync_status"]));
            }
            check(&st)
                .map(|()| st.clone())
                .map_err(|e| format!("{e}\nstatus: {st}\nlog tail: {}", tail(&self.log(), 20)))
        })
    }
}

mod confd;
mod ctl;
mod felix;
mod kubeadm;
mod startup;
mod typha;
