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

// ---------------------------------------------------------------------------------------------
// 1. margay ctl
// ---------------------------------------------------------------------------------------------

const CALICO_RESOURCES: &str = "apiVersion: projectcalico.org/v3
kind: IPPool
metadata:
  name: pool-a
  labels: {env: test}
spec: {cidr: 10.65.0.0/16, vxlanMode: Always, natOutgoing: true, blockSize: 26}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: allow-dns}
spec:
  order: 100
  selector: all()
  types: [Egress]
  egress:
  - action: Allow
    protocol: UDP
    destination: {ports: [53]}
---
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: allow-web, namespace: shop}
spec:
  selector: app == 'web'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: TCP
    destination: {ports: [443]}
---
apiVersion: projectcalico.org/v3
kind: FelixConfiguration
metadata: {name: default}
spec: {logSeverityScreen: Info, reportingInterval: 0s}
---
apiVersion: projectcalico.org/v3
kind: BGPPeer
metadata: {name: tor}
spec: {peerIP: 10.0.0.254, asNumber: 65000}
";

#[test]
fn ctl_writes_calico_custom_resources_and_shows_derived_objects() {
    let k = Cluster::start();
    k.seed();
    let s = k.store();
    let file = k.file("resources.yaml", CALICO_RESOURCES);

    // create, through DATASTORE_TYPE=kubernetes + KUBECONFIG.
    let r = k.ctl(&["create", "-f", &file]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.out.contains("Successfully created 5 resource(s)"),
        "{r:?}"
    );

    // Each is a crd.projectcalico.org/v1 custom resource with Calico's layout.
    for (plural, ns, name, kind) in [
        ("ippools", "", "pool-a", "IPPool"),
        (
            "globalnetworkpolicies",
            "",
            "allow-dns",
            "GlobalNetworkPolicy",
        ),
        ("networkpolicies", "shop", "allow-web", "NetworkPolicy"),
        ("felixconfigurations", "", "default", "FelixConfiguration"),
        ("bgppeers", "", "tor", "BGPPeer"),
    ] {
        let cr = s
            .get(Gvr::calico(plural), ns, name)
            .unwrap_or_else(|e| panic!("{plural} {ns}/{name} not in the API server: {e}"));
        assert_eq!(cr["apiVersion"], "crd.projectcalico.org/v1", "{cr}");
        assert_eq!(cr["kind"], kind, "{cr}");
        let meta = stored_metadata(&cr);
        assert!(
            meta["creationTimestamp"].is_string(),
            "{plural}/{name}: {meta}"
        );
        // Only policies keep their v3 name in the annotation (Calico's rule).
        let is_policy = plural.ends_with("networkpolicies");
        assert_eq!(meta.get("name").is_some(), is_policy, "{plural}: {meta}");
        assert!(meta.get("namespace").is_none() && meta.get("resourceVersion").is_none());
    }
    let pool = s.get(Gvr::calico("ippools"), "", "pool-a").unwrap();
    assert_eq!(pool["spec"]["cidr"], "10.65.0.0/16");
    assert_eq!(pool["spec"]["vxlanMode"], "Always");
    // A label of the operator's lives in the annotation, not on the custom resource.
    assert_eq!(stored_metadata(&pool)["labels"], json!({"env": "test"}));
    assert!(pool["metadata"]["labels"].get("env").is_none(), "{pool}");
    let policy = s
        .get(Gvr::calico("globalnetworkpolicies"), "", "allow-dns")
        .unwrap();
    assert_eq!(
        policy["spec"]["egress"][0]["destination"]["ports"],
        json!([53])
    );
    let peer = s.get(Gvr::calico("bgppeers"), "", "tor").unwrap();
    assert_eq!(peer["spec"]["peerIP"], "10.0.0.254");

    // get shows the custom resource, its resourceVersion the API object's.
    let yaml = k.ctl_ok(&["get", "ippool", "pool-a", "-o", "yaml"]);
    assert!(
        yaml.contains(&format!("resourceVersion: \"{}\"", rv(&pool))),
        "{yaml}\n{pool}"
    );
    assert!(
        yaml.contains("env: test") && yaml.contains("cidr: 10.65.0.0/16"),
        "{yaml}"
    );

    // create again: already exists, nothing written.
    let before = s.resource_version();
    let again = k.ctl(&["create", "-f", &file]);
    assert_eq!(again.code, 1, "{again:?}");
    assert!(again.err.contains("already exists"), "{again:?}");
    assert_eq!(
        s.resource_version(),
        before,
        "a failed create wrote something"
    );

    // replace changes the custom resource.
    let changed = k.file(
        "pool.yaml",
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: pool-a, labels: {env: test}}\nspec: {cidr: 10.65.0.0/16, vxlanMode: Always, natOutgoing: false, blockSize: 26}\n",
    );
    k.ctl_ok(&["replace", "-f", &changed]);
    let pool2 = s.get(Gvr::calico("ippools"), "", "pool-a").unwrap();
    // natOutgoing false is left out, as Calico's omitempty leaves it out.
    assert!(pool2["spec"].get("natOutgoing").is_none(), "{pool2}");
    assert_ne!(rv(&pool2), rv(&pool));
    // replace of something that does not exist fails.
    let missing = k.file(
        "missing.yaml",
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: nope}\nspec: {cidr: 10.99.0.0/16}\n",
    );
    let r = k.ctl(&["replace", "-f", &missing]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("does not exist"), "{r:?}");

    // label: in the annotation, and selectable.
    k.ctl_ok(&["label", "ippool", "pool-a", "color=red"]);
    let pool3 = s.get(Gvr::calico("ippools"), "", "pool-a").unwrap();
    assert_eq!(
        stored_metadata(&pool3)["labels"],
        json!({"env": "test", "color": "red"})
    );
    let listed = k.ctl_ok(&["get", "ippools", "-l", "color == 'red'"]);
    assert!(listed.contains("pool-a"), "{listed}");
    let listed = k.ctl_ok(&["get", "ippools", "-l", "color == 'blue'"]);
    assert!(!listed.contains("pool-a"), "{listed}");
    k.ctl_ok(&["label", "ippool", "pool-a", "color", "--remove"]);
    let pool4 = s.get(Gvr::calico("ippools"), "", "pool-a").unwrap();
    assert_eq!(stored_metadata(&pool4)["labels"], json!({"env": "test"}));

    // apply: unchanged writes nothing; a change is an update.
    let before = s.resource_version();
    let r = k.ctl(&["apply", "-f", &changed]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        s.resource_version(),
        before,
        "an unchanged apply wrote: {r:?}"
    );

    // A Calico NetworkPolicy and the converted Kubernetes one, side by side.
    let nps = k.ctl_ok(&["get", "networkpolicies", "-n", "shop"]);
    assert!(
        nps.contains("allow-web") && nps.contains("knp.default.allow-client"),
        "{nps}"
    );

    // delete: gone from the API server.
    k.ctl_ok(&["delete", "globalnetworkpolicy", "allow-dns"]);
    assert!(
        s.get(Gvr::calico("globalnetworkpolicies"), "", "allow-dns")
            .is_err()
    );
    let peer_file = k.file(
        "peer.yaml",
        "apiVersion: projectcalico.org/v3\nkind: BGPPeer\nmetadata: {name: tor}\nspec: {peerIP: 10.0.0.254, asNumber: 65000}\n",
    );
    k.ctl_ok(&["delete", "-f", &peer_file]);
    assert!(s.get(Gvr::calico("bgppeers"), "", "tor").is_err());
    let r = k.ctl(&["delete", "bgppeer", "tor"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("does not exist"), "{r:?}");

    // A policy edited (with kubectl) into something margay cannot read can still be deleted,
    // as an undecodable etcd value can; why it could not be read is reported.
    let gnp_file = k.file(
        "gnp.yaml",
        "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: allow-dns}\nspec: {selector: all(), egress: [{action: Allow}]}\n",
    );
    k.ctl_ok(&["create", "-f", &gnp_file]);
    s.patch(
        Gvr::calico("globalnetworkpolicies"),
        "",
        "allow-dns",
        PatchType::Merge,
        &json!({"spec": {"egress": [{"action": "Allowed"}]}}),
    )
    .unwrap();
    let r = k.ctl(&["get", "globalnetworkpolicy", "allow-dns"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("unknown variant `Allowed`"), "{r:?}");
    let r = k.ctl(&["delete", "globalnetworkpolicy", "allow-dns"]);
    assert!(r.err.contains("unknown variant `Allowed`"), "{r:?}");
    assert!(
        s.get(Gvr::calico("globalnetworkpolicies"), "", "allow-dns")
            .is_err(),
        "the unreadable policy is still there: {r:?}"
    );

    // --- The derived kinds, through calicoctl's config file. ---
    let weps = k.ctl_with_config_file(&["get", "workloadendpoints", "-A", "-o", "wide"]);
    assert_eq!(weps.code, 0, "{weps:?}");
    for needle in [
        "node1-k8s-web--1-eth0",
        "node1-k8s-web--2-eth0",
        "node2-k8s-client--1-eth0",
        "10.65.0.2/32",
        "10.65.0.3/32",
        "10.65.1.2/32",
    ] {
        assert!(weps.out.contains(needle), "{needle} missing: {weps:?}");
    }
    assert!(
        !weps.out.contains("node-agent"),
        "a host-network pod has no endpoint: {weps:?}"
    );
    let wep = k.ctl_with_config_file(&[
        "get",
        "workloadendpoint",
        "node1-k8s-web--1-eth0",
        "-n",
        "shop",
        "-o",
        "json",
    ]);
    assert_eq!(wep.code, 0, "{wep:?}");
    let wep: Value = serde_json::from_str(&wep.out).unwrap();
    assert_eq!(
        wep["spec"]["profiles"],
        json!(["kns.shop", "ksa.shop.web-sa"])
    );
    assert_eq!(wep["spec"]["ipNetworks"], json!(["10.65.0.2/32"]));
    assert_eq!(wep["spec"]["node"], "node1");
    assert_eq!(wep["spec"]["pod"], "web-1");
    assert_eq!(wep["metadata"]["labels"]["app"], "web");
    assert_eq!(
        wep["metadata"]["labels"]["projectcalico.org/namespace"],
        "shop"
    );
    assert_eq!(
        wep["metadata"]["labels"]["projectcalico.org/serviceaccount"],
        "web-sa"
    );
    assert_eq!(
        wep["spec"]["ports"],
        json!([{"name": "http", "port": 80, "protocol": "TCP"}])
    );
    let live_pod = s.get(PODS, "shop", "web-1").unwrap();
    assert_eq!(
        wep["metadata"]["resourceVersion"],
        live_pod["metadata"]["resourceVersion"]
    );

    let profiles = k.ctl_with_config_file(&["get", "profiles"]);
    assert_eq!(profiles.code, 0, "{profiles:?}");
    for needle in [
        "kns.shop",
        "kns.default",
        "ksa.shop.web-sa",
        "projectcalico-default-allow",
    ] {
        assert!(profiles.out.contains(needle), "{needle}: {profiles:?}");
    }
    let ns_profile = k.ctl_with_config_file(&["get", "profile", "kns.shop", "-o", "json"]);
    let ns_profile: Value = serde_json::from_str(&ns_profile.out).unwrap();
    assert_eq!(ns_profile["spec"]["labelsToApply"]["pcns.team"], "shop");
    let sa_profile = k.ctl_with_config_file(&["get", "profile", "ksa.shop.web-sa", "-o", "json"]);
    let sa_profile: Value = serde_json::from_str(&sa_profile.out).unwrap();
    assert_eq!(sa_profile["spec"]["labelsToApply"]["pcsa.role"], "frontend");

    let nodes = k.ctl_with_config_file(&["get", "nodes", "-o", "wide"]);
    assert_eq!(nodes.code, 0, "{nodes:?}");
    assert!(
        nodes.out.contains("node1") && nodes.out.contains("node2"),
        "{nodes:?}"
    );
    assert!(nodes.out.contains("10.0.0.2/24"), "{nodes:?}");

    let knp = k.ctl_with_config_file(&[
        "get",
        "networkpolicy",
        "knp.default.allow-client",
        "-n",
        "shop",
        "-o",
        "json",
    ]);
    assert_eq!(knp.code, 0, "{knp:?}");
    let knp: Value = serde_json::from_str(&knp.out).unwrap();
    assert_eq!(knp["spec"]["tier"], "default");
    assert_eq!(knp["spec"]["order"], 1000);
    let sel = knp["spec"]["selector"].as_str().unwrap();
    assert!(
        sel.contains("projectcalico.org/orchestrator == 'k8s'") && sel.contains("app == 'web'"),
        "{sel}"
    );

    // Writes to derived kinds fail, saying what to do instead; the objects stay as they were.
    let before = s.resource_version();
    let wep_file = k.file(
        "wep.yaml",
        "apiVersion: projectcalico.org/v3\nkind: WorkloadEndpoint\nmetadata: {name: node1-k8s-web--1-eth0, namespace: shop}\nspec: {orchestrator: k8s, node: node1, pod: web-1, endpoint: eth0, interfaceName: cali0, ipNetworks: [10.65.9.9/32]}\n",
    );
    for (args, needle) in [
        (
            vec!["apply", "-f", wep_file.as_str()],
            "WorkloadEndpoints are derived from Pods",
        ),
        (
            vec!["delete", "profile", "kns.shop"],
            "Profiles are derived from Namespaces",
        ),
        (
            vec!["label", "profile", "kns.shop", "x=y"],
            "Profiles are derived from Namespaces",
        ),
        (
            vec![
                "delete",
                "networkpolicy",
                "knp.default.allow-client",
                "-n",
                "shop",
            ],
            "Kubernetes NetworkPolicies",
        ),
        (vec!["delete", "node", "node2"], "Kubernetes Nodes"),
    ] {
        let r = k.ctl_with_config_file(&args);
        assert_eq!(r.code, 1, "{args:?} should fail: {r:?}");
        assert!(r.err.contains(needle), "{args:?}: {r:?}");
        assert!(r.err.contains("kubectl"), "{args:?} says how: {r:?}");
    }
    let node_file = k.file(
        "node.yaml",
        "apiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {name: node9}\nspec: {bgp: {ipv4Address: 10.0.0.9/24}}\n",
    );
    let r = k.ctl_with_config_file(&["create", "-f", &node_file]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("Kubernetes Nodes"), "{r:?}");
    assert_eq!(
        s.resource_version(),
        before,
        "a refused write wrote something"
    );
    assert!(s.get(NODES, "", "node2").is_ok());
    assert!(s.get(K8S_NETPOLS, "shop", "allow-client").is_ok());

    // Labelling a Calico Node writes Calico's labels annotation on the Kubernetes Node and
    // leaves its Kubernetes labels alone.
    let r = k.ctl_with_config_file(&["label", "node", "node1", "rack=r1"]);
    assert_eq!(r.code, 0, "{r:?}");
    let n1 = s.get(NODES, "", "node1").unwrap();
    let calico_labels: Value = serde_json::from_str(
        n1["metadata"]["annotations"]["projectcalico.org/labels"]
            .as_str()
            .unwrap_or_else(|| panic!("no Calico labels annotation: {n1}")),
    )
    .unwrap();
    assert_eq!(calico_labels, json!({"rack": "r1"}));
    assert_eq!(
        n1["metadata"]["labels"],
        json!({"kubernetes.io/hostname": "node1", "kubernetes.io/os": "linux"})
    );
    let node_yaml = k.ctl_with_config_file(&["get", "node", "node1", "-o", "yaml"]);
    assert!(
        node_yaml.out.contains("rack: r1")
            && node_yaml.out.contains("kubernetes.io/hostname: node1"),
        "{node_yaml:?}"
    );

    // ipam show reads the pools and the (empty) IPAM custom resources.
    let ipam = k.ctl_with_config_file(&["ipam", "show"]);
    assert_eq!(ipam.code, 0, "{ipam:?}");
    assert!(
        ipam.out
            .contains("| IP Pool  | 10.65.0.0/16 |     65536 |     0 (0%) |"),
        "{ipam:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. margay node startup
// ---------------------------------------------------------------------------------------------

/// resourceVersions of what start-up owns in the API server.
fn startup_state(s: &StoreHandle, node: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert(
        format!("nodes/{node}"),
        rv(&s.get(NODES, "", node).unwrap()),
    );
    for plural in [
        "ippools",
        "felixconfigurations",
        "clusterinformations",
        "bgpconfigurations",
        "ipamconfigs",
        "tiers",
        "ipamblocks",
        "blockaffinities",
        "ipamhandles",
    ] {
        for o in s.list(Gvr::calico(plural), None, "").unwrap() {
            out.insert(
                format!("{plural}/{}", o["metadata"]["name"].as_str().unwrap()),
                rv(&o),
            );
        }
    }
    out
}

#[test]
fn node_startup_annotates_the_kubernetes_node_and_creates_the_defaults_once() {
    let k = Cluster::start();
    k.seed();
    let s = k.store();

    let r = k.node_startup("node1", "10.0.0.1/24");
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.out.contains("node written"), "{r:?}");

    // Calico's annotations on the Kubernetes Node; its labels and addresses untouched.
    let n1 = s.get(NODES, "", "node1").unwrap();
    let ann = &n1["metadata"]["annotations"];
    assert_eq!(ann["projectcalico.org/IPv4Address"], "10.0.0.1/24", "{n1}");
    assert_eq!(
        n1["metadata"]["labels"],
        json!({"kubernetes.io/hostname": "node1", "kubernetes.io/os": "linux"})
    );
    assert_eq!(n1["status"]["addresses"][0]["address"], "10.0.0.1");
    // The VXLAN tunnel address, from IPAM in the default pool, and the VTEP MAC.
    let tunnel = ann["projectcalico.org/IPv4VXLANTunnelAddr"]
        .as_str()
        .unwrap_or_else(|| panic!("no tunnel address: {n1}"));
    assert!(tunnel.starts_with("10.65."), "{tunnel}");
    assert!(
        ann["projectcalico.org/VXLANTunnelMACAddr"].is_string(),
        "{n1}"
    );

    // IPAM as Calico's custom resources: the node's block, its affinity (labelled so one
    // host's can be listed) and the tunnel address's handle.
    let blocks = s.list(Gvr::calico("ipamblocks"), None, "").unwrap();
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    let block = &blocks[0];
    assert_eq!(block["spec"]["affinity"], "host:node1", "{block}");
    let cidr = block["spec"]["cidr"].as_str().unwrap();
    assert_eq!(
        block["metadata"]["name"],
        cidr.replace(['.', '/'], "-"),
        "{block}"
    );
    let affinity = s
        .get(
            Gvr::calico("blockaffinities"),
            "",
            &format!("node1-{}", cidr.replace(['.', '/'], "-")),
        )
        .unwrap();
    assert_eq!(
        affinity["metadata"]["labels"],
        json!({
            "projectcalico.org/affinity-type": "host",
            "projectcalico.org/hostname-hash": margay_kdd::names::hostname_hash("node1"),
            "projectcalico.org/ip-version": "4",
        })
    );
    assert_eq!(
        (&affinity["spec"]["state"], &affinity["spec"]["deleted"]),
        (&json!("confirmed"), &json!("false")),
        "{affinity}"
    );
    let handle = s
        .get(Gvr::calico("ipamhandles"), "", "vxlan-tunnel-addr-node1")
        .unwrap();
    assert_eq!(handle["spec"]["handleID"], "vxlan-tunnel-addr-node1");
    assert_eq!(handle["spec"]["block"], json!({cidr: 1}), "{handle}");
    // ipam check sees the tunnel address as allocated, and the seeded pods' addresses (which
    // no IPAM handed out) as what they are.
    let check = k.ctl(&["ipam", "check"]);
    assert_eq!(check.code, 1, "{check:?}");
    assert!(
        check.out.contains("Found 1 node tunnel IPs.")
            && check.out.contains(
                "found 3 problems: 0 leaked, 3 not allocated, 0 duplicate, 0 stale handles"
            ),
        "{check:?}"
    );

    // The default pool, FelixConfiguration and ClusterInformation as custom resources.
    let pool = s
        .get(Gvr::calico("ippools"), "", "default-ipv4-ippool")
        .unwrap();
    assert_eq!(pool["spec"]["cidr"], "10.65.0.0/16", "{pool}");
    assert_eq!(pool["spec"]["vxlanMode"], "Always", "{pool}");
    stored_metadata(&pool);
    let fc = s
        .get(Gvr::calico("felixconfigurations"), "", "default")
        .unwrap();
    assert_eq!(fc["spec"]["logSeverityScreen"], "Info", "{fc}");
    // Calico's start-up writes no per-node FelixConfiguration in the Kubernetes datastore.
    assert!(
        s.get(Gvr::calico("felixconfigurations"), "", "node.node1")
            .is_err()
    );
    let ci = s
        .get(Gvr::calico("clusterinformations"), "", "default")
        .unwrap();
    assert_eq!(ci["spec"]["datastoreReady"], true, "{ci}");
    assert!(
        !ci["spec"]["clusterGUID"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{ci}"
    );
    s.get(Gvr::calico("ipamconfigs"), "", "default").unwrap();
    s.get(Gvr::calico("tiers"), "", "default").unwrap();
    assert!(
        k.path("root-node1/var/lib/calico/nodename").exists(),
        "the node name file is written last"
    );

    // A second start-up with the same inputs writes nothing: same resourceVersions, and the
    // store's revision did not move.
    let state = startup_state(&s, "node1");
    let revision = s.resource_version();
    let again = k.node_startup("node1", "10.0.0.1/24");
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.out.contains("node unchanged"), "{again:?}");
    assert_eq!(startup_state(&s, "node1"), state, "{again:?}");
    assert_eq!(s.resource_version(), revision, "{again:?}");

    // Another node's start-up with an address node1 has is refused, naming both nodes.
    let clash = k.node_startup("node2", "10.0.0.1/24");
    assert_eq!(clash.code, 1, "{clash:?}");
    assert!(
        clash.err.contains("\"node1\"") && clash.err.contains("\"node2\""),
        "{clash:?}"
    );

    // IP_AUTODETECTION_METHOD=kubernetes-internal-ip: the Kubernetes Node's InternalIP with
    // the prefix of the interface holding it. (127.0.0.1 is the one address every test host
    // has on an interface: lo, 127.0.0.1/8.)
    s.create(NODES, "", k8s_node("node-lo", "127.0.0.1", json!({})))
        .unwrap();
    let r = k.node_startup_with(
        "node-lo",
        &[
            ("IP", "autodetect"),
            ("IP_AUTODETECTION_METHOD", "kubernetes-internal-ip"),
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let lo = s.get(NODES, "", "node-lo").unwrap();
    assert_eq!(
        lo["metadata"]["annotations"]["projectcalico.org/IPv4Address"], "127.0.0.1/8",
        "{lo}"
    );

    // A node the cluster does not have: Calico's start-up fails (the kubelet registers
    // Nodes, calico-node only annotates them), saying so.
    let ghost = k.node_startup("node9", "10.0.0.9/24");
    assert_eq!(ghost.code, 1, "{ghost:?}");
    assert!(
        ghost.err.contains("there is no node \"node9\" to register")
            && ghost.err.contains("kubelet")
            && ghost.err.contains("NODENAME"),
        "{ghost:?}"
    );
    assert!(s.get(NODES, "", "node9").is_err());
}

// ---------------------------------------------------------------------------------------------
// 3. margay felix
// ---------------------------------------------------------------------------------------------

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

fn ingress_policies(ep: &Value) -> Vec<String> {
    ep["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["ingress"].as_array().unwrap().iter())
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

fn egress_policies(ep: &Value) -> Vec<String> {
    ep["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["egress"].as_array().unwrap().iter())
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

/// Namespaced policies are `<namespace>/<name>` in Felix's status.
fn has_policy(list: &[String], name: &str) -> bool {
    list.iter().any(|p| p == name)
}

#[test]
fn felix_programs_this_nodes_pods_with_kubernetes_and_calico_policy() {
    let k = Cluster::start();
    k.seed();
    let s = k.store();
    let r = k.node_startup("node1", "10.0.0.1/24");
    assert_eq!(r.code, 0, "{r:?}");
    let gnp = k.file(
        "gnp.yaml",
        "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: allow-dns}
spec:
  order: 100
  selector: projectcalico.org/namespace == 'shop'
  types: [Egress]
  egress:
  - action: Allow
    protocol: UDP
    destination: {ports: [53]}
",
    );
    k.ctl_ok(&["apply", "-f", &gnp]);
    // Egress to the pods' named port: the port names come from the pods' containers.
    s.create(
        K8S_NETPOLS,
        "shop",
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "egress-http", "namespace": "shop"},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                     "egress": [{"to": [{"podSelector": {}}], "ports": [{"port": "http"}]}]},
        }),
    )
    .unwrap();

    let mut felix = Felix::start(&k, "node1", &[]);
    let st = felix.wait("node1's two pods", |st| {
        let eps = endpoints(st);
        let ids: Vec<&String> = eps.keys().collect();
        if ids != ["k8s/shop/web-1/eth0", "k8s/shop/web-2/eth0"] {
            return Err(format!("endpoints {ids:?}"));
        }
        Ok(())
    });
    let eps = endpoints(&st);
    let web1 = &eps["k8s/shop/web-1/eth0"];
    let web2 = &eps["k8s/shop/web-2/eth0"];
    assert_eq!(
        web1["profiles"],
        json!(["kns.shop", "ksa.shop.web-sa"]),
        "{web1}"
    );
    assert_eq!(web2["profiles"], json!(["kns.shop"]), "{web2}");
    assert_eq!(web1["addresses"], json!(["10.65.0.2/32"]), "{web1}");
    assert_eq!(web2["addresses"], json!(["10.65.0.3/32"]), "{web2}");
    for ep in [web1, web2] {
        assert!(
            has_policy(&ingress_policies(ep), "shop/knp.default.allow-client"),
            "{ep}"
        );
        assert!(has_policy(&egress_policies(ep), "allow-dns"), "{ep}");
    }
    assert_eq!(st["counts"]["local_endpoints"], 2, "{st}");
    assert_eq!(st["counts"]["workload_endpoints"], 3, "{st}");
    // The Kubernetes policy's client selector became an IP set holding client-1.
    let sets = st["ip_sets"].as_array().unwrap();
    assert!(
        sets.iter().any(|s| s["members"] == 1),
        "an IP set with the client: {sets:?}"
    );
    assert_eq!(st["problems"], json!([]), "{st}");
    // The named port: every pod of the namespace with a port named http (web-1, web-2,
    // client-1; the host-network pod has no endpoint).
    let named = sets
        .iter()
        .find(|s| {
            s["source"]
                .as_str()
                .unwrap_or_default()
                .ends_with("port tcp:http")
        })
        .unwrap_or_else(|| panic!("no named-port IP set: {sets:?}"));
    assert_eq!(named["members"], 3, "{named}");
    for ep in [web1, web2] {
        assert!(
            has_policy(&egress_policies(ep), "shop/knp.default.egress-http"),
            "{ep}"
        );
    }

    // node2 starts up: its Calico annotations (VXLAN tunnel address, MAC) and its IPAM block
    // reach Felix as a VTEP and a route.
    let vteps_before = st["counts"]["vteps"].as_u64().unwrap();
    let routes_before = st["counts"]["routes"].as_u64().unwrap();
    let r = k.node_startup("node2", "10.0.0.2/24");
    assert_eq!(r.code, 0, "{r:?}");
    felix.wait("node2's VTEP and block route", |st| {
        let (vteps, routes) = (
            st["counts"]["vteps"].as_u64().unwrap(),
            st["counts"]["routes"].as_u64().unwrap(),
        );
        if vteps == vteps_before + 1 && routes > routes_before {
            Ok(())
        } else {
            Err(format!(
                "vteps {vteps} (was {vteps_before}), routes {routes} (was {routes_before})"
            ))
        }
    });

    // A Kubernetes Node deleted: its VTEP goes.
    s.delete(NODES, "", "node2").unwrap();
    felix.wait("node2's VTEP to go", |st| {
        let vteps = st["counts"]["vteps"].as_u64().unwrap();
        if vteps == vteps_before {
            Ok(())
        } else {
            Err(format!("vteps {vteps} (want {vteps_before})"))
        }
    });

    // A pod's labels change in the API server: it leaves the Kubernetes policy.
    s.patch(
        PODS,
        "shop",
        "web-2",
        PatchType::Merge,
        &json!({"metadata": {"labels": {"app": "cache"}}}),
    )
    .unwrap();
    felix.wait("web-2 to leave the web policy", |st| {
        let eps = endpoints(st);
        let web2 = eps.get("k8s/shop/web-2/eth0").ok_or("web-2 gone")?;
        if has_policy(&ingress_policies(web2), "shop/knp.default.allow-client") {
            return Err("web-2 still has knp.default.allow-client".into());
        }
        Ok(())
    });

    // A new Kubernetes NetworkPolicy selecting it shows up.
    let mut np = allow_clients_to_web();
    np["metadata"]["name"] = json!("allow-cache");
    np["spec"]["podSelector"] = json!({"matchLabels": {"app": "cache"}});
    s.create(K8S_NETPOLS, "shop", np).unwrap();
    felix.wait("knp.default.allow-cache on web-2", |st| {
        let eps = endpoints(st);
        let web2 = eps.get("k8s/shop/web-2/eth0").ok_or("web-2 gone")?;
        if !has_policy(&ingress_policies(web2), "shop/knp.default.allow-cache") {
            return Err("no knp.default.allow-cache".into());
        }
        Ok(())
    });

    // The API server restarts; Felix keeps its state and picks up what changed meanwhile and
    // after.
    k.api.stop();
    std::thread::sleep(Duration::from_millis(500));
    s.create(
        PODS,
        "shop",
        pod("web-3", "node1", "web", None, IpVia::Status("10.65.0.4")),
    )
    .unwrap();
    k.api.start_again().unwrap();
    felix.wait("web-3 after the API server restart", |st| {
        let eps = endpoints(st);
        let web3 = eps.get("k8s/shop/web-3/eth0").ok_or("no web-3")?;
        if !has_policy(&ingress_policies(web3), "shop/knp.default.allow-client") {
            return Err(format!("web-3 without its policy: {web3}"));
        }
        Ok(())
    });
    s.delete(PODS, "shop", "web-1").unwrap();
    felix.wait("web-1 to go", |st| {
        let eps = endpoints(st);
        if eps.contains_key("k8s/shop/web-1/eth0") {
            return Err("web-1 still there".into());
        }
        Ok(())
    });

    // Namespace labels reach the endpoints through the kns. profile: a policy admitting
    // namespaces labelled team=ops gets ops' pod in its IP set once the namespace has the label.
    s.create(
        NAMESPACES,
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ops"}}),
    )
    .unwrap();
    let mut ops_pod = pod("probe", "node2", "probe", None, IpVia::Status("10.65.1.9"));
    ops_pod["metadata"]["namespace"] = json!("ops");
    s.create(PODS, "ops", ops_pod).unwrap();
    let mut np = allow_clients_to_web();
    np["metadata"]["name"] = json!("allow-ops");
    np["spec"]["ingress"] =
        json!([{"from": [{"namespaceSelector": {"matchLabels": {"team": "ops"}}}]}]);
    s.create(K8S_NETPOLS, "shop", np).unwrap();
    let ops_set_members = |st: &Value| -> Result<u64, String> {
        st["ip_sets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|set| {
                set["source"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("pcns.team")
            })
            .map(|set| set["members"].as_u64().unwrap())
            .ok_or_else(|| format!("no pcns.team IP set in {}", st["ip_sets"]))
    };
    felix.wait("the ops IP set, empty", |st| match ops_set_members(st)? {
        0 => Ok(()),
        n => Err(format!("{n} members")),
    });
    s.patch(
        NAMESPACES,
        "",
        "ops",
        PatchType::Merge,
        &json!({"metadata": {"labels": {"team": "ops"}}}),
    )
    .unwrap();
    felix.wait("ops' pod in the IP set", |st| match ops_set_members(st)? {
        1 => Ok(()),
        n => Err(format!("{n} members")),
    });

    // The API server's history is compacted (410 Gone for every watch behind it): Felix lists
    // again and misses nothing made meanwhile.
    k.api.compact();
    s.create(
        PODS,
        "shop",
        pod("web-4", "node1", "web", None, IpVia::Status("10.65.0.5")),
    )
    .unwrap();
    felix.wait("web-4 after compaction", |st| {
        if endpoints(st).contains_key("k8s/shop/web-4/eth0") {
            Ok(())
        } else {
            Err("no web-4".into())
        }
    });
    let st = felix.status().unwrap();
    assert_eq!(st["ready"], true, "{st}");
    assert_eq!(st["problems"], json!([]), "{st}");

    // An object edited into something margay cannot read (a policy action Calico does not
    // have, a pod address that is no address) no longer applies, as when it is read afresh:
    // Felix must not keep enforcing its previous version.
    s.patch(
        Gvr::calico("globalnetworkpolicies"),
        "",
        "allow-dns",
        PatchType::Merge,
        &json!({"spec": {"egress": [{"action": "Allowed"}]}}),
    )
    .unwrap();
    s.patch(
        PODS,
        "shop",
        "web-2",
        PatchType::Merge,
        &json!({"metadata": {"annotations": {
            "cni.projectcalico.org/podIP": "not-an-ip",
            "cni.projectcalico.org/podIPs": "not-an-ip"}}}),
    )
    .unwrap();
    felix.wait("the unreadable policy and pod to stop applying", |st| {
        let eps = endpoints(st);
        if eps.contains_key("k8s/shop/web-2/eth0") {
            return Err("web-2 is still programmed".into());
        }
        let web3 = eps.get("k8s/shop/web-3/eth0").ok_or("no web-3")?;
        if has_policy(&egress_policies(web3), "allow-dns") {
            return Err("allow-dns still applies".into());
        }
        Ok(())
    });
    // Readable again: back.
    s.patch(
        Gvr::calico("globalnetworkpolicies"),
        "",
        "allow-dns",
        PatchType::Merge,
        &json!({"spec": {"egress": [{"action": "Allow", "protocol": "UDP",
                                     "destination": {"ports": [53]}}]}}),
    )
    .unwrap();
    s.patch(
        PODS,
        "shop",
        "web-2",
        PatchType::Merge,
        &json!({"metadata": {"annotations": {
            "cni.projectcalico.org/podIP": "10.65.0.3/32",
            "cni.projectcalico.org/podIPs": "10.65.0.3/32"}}}),
    )
    .unwrap();
    felix.wait("the policy and pod back", |st| {
        let eps = endpoints(st);
        let web2 = eps.get("k8s/shop/web-2/eth0").ok_or("no web-2")?;
        if !has_policy(&egress_policies(web2), "allow-dns") {
            return Err("allow-dns missing".into());
        }
        Ok(())
    });

    // The kubelet's heartbeats change the Node object all the time; that is no configuration
    // change (Felix stays up), and what follows is still seen.
    for i in 0..3 {
        s.patch_status(
            NODES,
            "",
            "node1",
            PatchType::Merge,
            &json!({"status": {"conditions": [{"type": "Ready", "status": "True",
                "lastHeartbeatTime": format!("2024-05-01T10:00:0{i}Z")}]}}),
        )
        .unwrap();
    }
    s.create(
        PODS,
        "shop",
        pod("web-5", "node1", "web", None, IpVia::Status("10.65.0.6")),
    )
    .unwrap();
    felix.wait("web-5 after the heartbeats", |st| {
        if endpoints(st).contains_key("k8s/shop/web-5/eth0") {
            Ok(())
        } else {
            Err("no web-5".into())
        }
    });
    // A restart would follow a changed parameter within 2 s.
    std::thread::sleep(Duration::from_millis(2500));
    felix.status().unwrap();

    // A FelixConfiguration custom resource change that needs a restart: Felix exits 129,
    // naming the parameter, as it does on every datastore.
    s.patch(
        Gvr::calico("felixconfigurations"),
        "",
        "default",
        PatchType::Merge,
        &json!({"spec": {"routeRefreshInterval": "77s"}}),
    )
    .unwrap();
    let status = wait_for("felix to restart", WAIT, || {
        felix
            .role
            .exited()
            .ok_or_else(|| "still running".to_string())
    });
    let log = felix.log();
    assert_eq!(status.code(), Some(129), "{}", tail(&log, 30));
    assert!(
        log.contains("RouteRefreshInterval changed"),
        "{}",
        tail(&log, 30)
    );
}

// ---------------------------------------------------------------------------------------------
// 4. margay confd
// ---------------------------------------------------------------------------------------------

#[test]
fn confd_renders_mesh_and_peers_from_kubernetes_nodes_and_bgppeer_crs() {
    let k = Cluster::start();
    let s = k.store();
    for (name, ip) in [
        ("node1", "10.0.0.1"),
        ("node2", "10.0.0.2"),
        ("node3", "10.0.0.3"),
    ] {
        s.create(
            NODES,
            "",
            k8s_node(
                name,
                ip,
                json!({
                    "projectcalico.org/IPv4Address": format!("{ip}/24"),
                    "projectcalico.org/ASNumber": "64512",
                }),
            ),
        )
        .unwrap();
    }
    // A node without Calico's annotations (calico-node not started there) is not meshed with.
    s.create(NODES, "", k8s_node("node4", "10.0.0.4", json!({})))
        .unwrap();
    // node1's rack is a Kubernetes label; a node-specific peering selects on it.
    s.patch(
        NODES,
        "",
        "node1",
        PatchType::Merge,
        &json!({"metadata": {"labels": {"rack": "r1"}}}),
    )
    .unwrap();
    s.create(
        Gvr::calico("bgppeers"),
        "",
        json!({
            "apiVersion": "crd.projectcalico.org/v1", "kind": "BGPPeer",
            "metadata": {"name": "rack-r1", "annotations": {
                METADATA_ANNOTATION: "{\"creationTimestamp\":null}"}},
            "spec": {"peerIP": "10.0.0.253", "asNumber": 65001, "nodeSelector": "rack == 'r1'"},
        }),
    )
    .unwrap();
    // A BGPPeer and a pool as Calico's own calicoctl writes them (custom resources with the
    // metadata annotation), and this node's block affinity as Calico's IPAM writes it.
    s.create(
        Gvr::calico("bgppeers"),
        "",
        json!({
            "apiVersion": "crd.projectcalico.org/v1", "kind": "BGPPeer",
            "metadata": {"name": "tor", "annotations": {
                METADATA_ANNOTATION: "{\"creationTimestamp\":\"2024-05-01T10:00:00Z\"}"}},
            "spec": {"peerIP": "10.0.0.254", "asNumber": 65000},
        }),
    )
    .unwrap();
    s.create(
        Gvr::calico("ippools"),
        "",
        json!({
            "apiVersion": "crd.projectcalico.org/v1", "kind": "IPPool",
            "metadata": {"name": "pool", "annotations": {METADATA_ANNOTATION: "{\"creationTimestamp\":null}"}},
            "spec": {"cidr": "10.65.0.0/16", "blockSize": 26, "ipipMode": "Never", "vxlanMode": "Never", "natOutgoing": true},
        }),
    )
    .unwrap();
    s.create(
        Gvr::calico("blockaffinities"),
        "",
        affinity_cr("node1", "10.65.0.0/26"),
    )
    .unwrap();

    let cfg = k.path("confd");
    let once = || {
        let mut c = k.margay();
        c.args([
            "confd",
            "--once",
            "--nodename",
            "node1",
            "--no-reload",
            "--config-dir",
        ])
        .arg(&cfg);
        run(c)
    };
    let r = once();
    assert_eq!(r.code, 0, "{r:?}");
    let bird = std::fs::read_to_string(cfg.join("bird.cfg")).unwrap();
    assert!(bird.contains("router id 10.0.0.1;"), "{bird}");
    for peer in ["Mesh_10_0_0_2", "Mesh_10_0_0_3"] {
        assert!(
            bird.contains(&format!("protocol bgp {peer} from bgp_template")),
            "{peer}: {bird}"
        );
    }
    assert!(
        !bird.contains("Mesh_10_0_0_1 "),
        "no session to itself: {bird}"
    );
    assert!(
        !bird.contains("10_0_0_4"),
        "node4 has no BGP address: {bird}"
    );
    assert!(
        bird.contains("protocol bgp Global_10_0_0_254 from bgp_template"),
        "{bird}"
    );
    assert!(bird.contains("neighbor 10.0.0.254 as 65000;"), "{bird}");
    assert!(
        bird.contains("protocol bgp Node_10_0_0_253 from bgp_template"),
        "the rack peering selects node1 by its Kubernetes label: {bird}"
    );
    assert!(bird.contains("local as 64512;"), "{bird}");
    assert!(bird.contains("route 10.65.0.0/26 blackhole;"), "{bird}");
    bird_accepts(&cfg.join("bird.cfg"));
    let status: Value =
        serde_json::from_slice(&std::fs::read(cfg.join("confd-status.json")).unwrap()).unwrap();
    assert_eq!(status["in_sync"], true, "{status}");
    assert_eq!(status["peers_v4"], 4, "{status}");

    // confd as a daemon: changes made in the API server are rendered as they come, through an
    // API server restart too. node2's block is not this node's: no route for it.
    let log = k.path("confd.log");
    let mut c = k.margay();
    c.args([
        "confd",
        "--nodename",
        "node1",
        "--no-reload",
        "--config-dir",
    ])
    .arg(&cfg);
    let confd = Role::spawn("confd", c, log);
    s.delete(Gvr::calico("bgppeers"), "", "tor").unwrap();
    s.patch(
        NODES,
        "",
        "node4",
        PatchType::Merge,
        &json!({"metadata": {"annotations": {"projectcalico.org/IPv4Address": "10.0.0.4/24"}}}),
    )
    .unwrap();
    for (node, cidr) in [("node1", "10.65.0.64/26"), ("node2", "10.65.1.0/26")] {
        s.create(Gvr::calico("blockaffinities"), "", affinity_cr(node, cidr))
            .unwrap();
    }
    let bird = || std::fs::read_to_string(cfg.join("bird.cfg")).unwrap_or_default();
    wait_for("confd to render the changes", WAIT, || {
        confd.assert_alive();
        let b = bird();
        if !b.contains("Global_10_0_0_254")
            && b.contains("protocol bgp Mesh_10_0_0_4 from bgp_template")
            && b.contains("route 10.65.0.64/26 blackhole;")
        {
            Ok(())
        } else {
            Err(format!("{b}\nlog: {}", tail(&confd.log(), 10)))
        }
    });
    assert!(bird().contains("route 10.65.0.0/26 blackhole;"));
    assert!(!bird().contains("10.65.1.0/26"), "{}", bird());
    bird_accepts(&cfg.join("bird.cfg"));

    k.api.stop();
    std::thread::sleep(Duration::from_millis(500));
    s.patch(
        NODES,
        "",
        "node3",
        PatchType::Merge,
        &json!({"metadata": {"annotations": {"projectcalico.org/IPv4Address": null}}}),
    )
    .unwrap();
    k.api.start_again().unwrap();
    wait_for(
        "node3 to leave the mesh after the API server restart",
        WAIT,
        || {
            confd.assert_alive();
            let b = bird();
            if b.contains("Mesh_10_0_0_3") {
                Err(format!("{b}\nlog: {}", tail(&confd.log(), 10)))
            } else {
                Ok(())
            }
        },
    );
    assert!(bird().contains("Mesh_10_0_0_2"), "{}", bird());
}

fn affinity_cr(node: &str, cidr: &str) -> Value {
    json!({
        "apiVersion": "crd.projectcalico.org/v1", "kind": "BlockAffinity",
        "metadata": {"name": format!("{node}-{}", cidr.replace(['.', '/'], "-")), "labels": {
            "projectcalico.org/affinity-type": "host",
            "projectcalico.org/hostname-hash": margay_kdd::names::hostname_hash(node),
            "projectcalico.org/ip-version": "4"}},
        "spec": {"state": "confirmed", "node": node, "type": "host", "cidr": cidr, "deleted": "false"},
    })
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

// ---------------------------------------------------------------------------------------------
// 5. Typha
// ---------------------------------------------------------------------------------------------

/// What one Typha client saw: key → revision, and whether it is in sync.
#[derive(Default)]
struct Seen {
    keys: BTreeMap<String, i64>,
    in_sync: bool,
}

/// The API resources the felix syncer needs on the Kubernetes datastore.
fn felix_syncer_resources() -> Vec<(&'static str, &'static str)> {
    let mut v = vec![
        ("", "pods"),
        ("", "namespaces"),
        ("", "serviceaccounts"),
        ("", "nodes"),
        ("networking.k8s.io", "networkpolicies"),
    ];
    for plural in [
        "clusterinformations",
        "felixconfigurations",
        "ippools",
        "tiers",
        "globalnetworkpolicies",
        "networkpolicies",
        "hostendpoints",
        "networksets",
        "globalnetworksets",
        "ipamblocks",
        // Service CIDRs for ServiceLoopPrevention (Calico's felix syncer has it too).
        "bgpconfigurations",
    ] {
        v.push(("crd.projectcalico.org", plural));
    }
    v
}

#[test]
fn typha_is_the_only_api_watcher_for_fifty_felix_clients() {
    use margay_typha::SyncerType;
    use margay_typha::client::{self, ClientEvent, ClientOptions, ClientStats};

    let k = Cluster::start();
    k.seed();
    let s = k.store();
    let r = k.node_startup("node1", "10.0.0.1/24");
    assert_eq!(r.code, 0, "{r:?}");
    // Enough pods that a snapshot is more than a handful of keys.
    for i in 0..100 {
        s.create(
            PODS,
            "shop",
            pod(
                &format!("load-{i}"),
                if i % 2 == 0 { "node1" } else { "node2" },
                "load",
                None,
                IpVia::Status(&format!("10.66.{}.{}", i / 200, i % 200 + 1)),
            ),
        )
        .unwrap();
    }

    let port = margay_testkit::free_port().unwrap();
    let log = k.path("typha.log");
    let mut c = k.margay();
    c.args(["typha", "run", "-c"])
        .arg(k.path("typha.cfg"))
        .env("TYPHA_SERVERHOST", "127.0.0.1")
        .env("TYPHA_SERVERPORT", port.to_string())
        .env("TYPHA_SYNCERTYPES", "felix")
        .env("TYPHA_HEALTHENABLED", "false")
        .env("TYPHA_PROMETHEUSMETRICSENABLED", "false");
    let typha = Role::spawn("typha", c, log);

    // What the datastore holds for the felix syncer, as the binary sees it.
    let expected_weps = 103; // web-1, web-2, client-1 and 100 load pods

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let clients: Vec<(Arc<Mutex<Seen>>, Arc<ClientStats>)> = (0..50)
        .map(|i| {
            let seen = Arc::new(Mutex::new(Seen::default()));
            let stats = Arc::new(ClientStats::default());
            let mut opts =
                ClientOptions::new(vec![addr.clone()], format!("felix-{i}"), SyncerType::Felix);
            opts.backoff = Duration::from_millis(100);
            opts.max_backoff = Duration::from_millis(500);
            let (tx, mut rx) = tokio::sync::mpsc::channel(64);
            rt.spawn(client::run(opts, tx, stats.clone()));
            let sink = seen.clone();
            rt.spawn(async move {
                while let Some(ev) = rx.recv().await {
                    let mut s = sink.lock().unwrap();
                    match ev {
                        ClientEvent::Status(margay_datastore::SyncStatus::InSync) => {
                            s.in_sync = true
                        }
                        ClientEvent::Kvs(kvs) => {
                            for kv in kvs {
                                match kv.value {
                                    Some(_) => {
                                        s.keys.insert(kv.key, kv.revision);
                                    }
                                    None => {
                                        s.keys.remove(&kv.key);
                                    }
                                }
                            }
                        }
                        _ => {}
                    }
                }
            });
            (seen, stats)
        })
        .collect();

    let weps_of = |seen: &Seen| {
        seen.keys
            .keys()
            .filter(|k| k.contains("/workloadendpoints/"))
            .count()
    };
    wait_for("50 clients in sync with every pod", WAIT * 2, || {
        typha.assert_alive();
        let lagging: Vec<usize> = clients
            .iter()
            .enumerate()
            .filter(|(_, (seen, _))| {
                let s = seen.lock().unwrap();
                !s.in_sync || weps_of(&s) != expected_weps
            })
            .map(|(i, _)| i)
            .collect();
        if lagging.is_empty() {
            Ok(())
        } else {
            Err(format!("{} clients not there yet", lagging.len()))
        }
    });
    // Every client has the same, complete view: profiles, nodes, policies and config too.
    let first = clients[0].0.lock().unwrap().keys.clone();
    for needle in [
        "/profiles/kns.shop",
        "/profiles/ksa.shop.web-sa",
        "/profiles/projectcalico-default-allow",
        "/nodes/node1",
        "/nodes/node2",
        "/networkpolicies/shop/knp.default.allow-client",
        "/clusterinformations/default",
        "/felixconfigurations/default",
        "/ippools/default-ipv4-ippool",
    ] {
        assert!(
            first.keys().any(|k| k.ends_with(needle)),
            "{needle} missing from {:?}",
            first.keys().collect::<Vec<_>>()
        );
    }
    for (i, (seen, _)) in clients.iter().enumerate() {
        assert_eq!(seen.lock().unwrap().keys, first, "client {i} differs");
    }

    // Exactly one watch per API resource the felix syncer needs, whatever the number of
    // clients, and nothing else watched: Typha is the API server's only watcher. (Typha
    // serves its snapshot before its watches are all open, so they are waited for.)
    let want: BTreeMap<(String, String), usize> = felix_syncer_resources()
        .into_iter()
        .map(|(g, r)| ((g.to_string(), r.to_string()), 1))
        .collect();
    let open_watches = || -> BTreeMap<(String, String), usize> {
        k.api
            .stats()
            .open_watches
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect()
    };
    wait_for("Typha's watches", WAIT, || {
        let open = open_watches();
        if open == want {
            Ok(())
        } else {
            Err(format!("open watches {open:?}"))
        }
    });
    let stats = k.api.stats();
    // Each resource was listed by Typha once (the node start-up before it listed some too).
    let lists_before = stats.request_count("list", "", "pods");

    // A change reaches all 50 clients, through that one watch.
    s.create(
        PODS,
        "shop",
        pod("late", "node1", "web", None, IpVia::Status("10.65.0.99")),
    )
    .unwrap();
    wait_for("the new pod at every client", WAIT, || {
        let missing = clients
            .iter()
            .filter(|(seen, _)| weps_of(&seen.lock().unwrap()) != expected_weps + 1)
            .count();
        if missing == 0 {
            Ok(())
        } else {
            Err(format!("{missing} clients without it"))
        }
    });
    let stats = k.api.stats();
    assert_eq!(
        stats.request_count("list", "", "pods"),
        lists_before,
        "no client made Typha list again"
    );
    assert_eq!(
        open_watches(),
        want,
        "open watches; log:\n{}",
        tail(&typha.log(), 30)
    );
    // Not one watch request more than those: nothing watched per client, nothing re-watched.
    for (g, r) in want.keys() {
        assert_eq!(
            stats.request_count("watch", g, r),
            1,
            "watch requests on {g}/{r}"
        );
    }

    // The API server restarts: Typha watches again (still one watch per resource, the old
    // ones gone), and what changed meanwhile reaches every client without a client resync.
    k.api.stop();
    std::thread::sleep(Duration::from_millis(300));
    s.delete(PODS, "shop", "late").unwrap();
    k.api.start_again().unwrap();
    wait_for("the deletion at every client", WAIT, || {
        typha.assert_alive();
        let behind = clients
            .iter()
            .filter(|(seen, _)| weps_of(&seen.lock().unwrap()) != expected_weps)
            .count();
        if behind == 0 {
            Ok(())
        } else {
            Err(format!("{behind} clients still have it"))
        }
    });
    wait_for("Typha's watches after the restart", WAIT, || {
        let open = open_watches();
        if open == want {
            Ok(())
        } else {
            Err(format!("open watches {open:?}"))
        }
    });
    for (_, cs) in &clients {
        assert_eq!(
            cs.resyncs.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "a client resynced"
        );
    }
    drop(rt);
}

/// The API resources the bgp syncer needs that the felix syncer does not.
const BGP_ONLY_RESOURCES: [&str; 3] = ["bgppeers", "bgpfilters", "blockaffinities"];

#[test]
fn felix_and_confd_sync_through_typha_which_alone_watches_the_api() {
    let k = Cluster::start();
    k.seed();
    let s = k.store();
    for (node, ip) in [("node1", "10.0.0.1/24"), ("node2", "10.0.0.2/24")] {
        let r = k.node_startup(node, ip);
        assert_eq!(r.code, 0, "{r:?}");
    }
    let port = margay_testkit::free_port().unwrap();
    let log = k.path("typha.log");
    let mut c = k.margay();
    c.args(["typha", "run", "-c"])
        .arg(k.path("typha.cfg"))
        .env("TYPHA_SERVERHOST", "127.0.0.1")
        .env("TYPHA_SERVERPORT", port.to_string())
        .env("TYPHA_HEALTHENABLED", "false")
        .env("TYPHA_PROMETHEUSMETRICSENABLED", "false");
    let typha = Role::spawn("typha", c, log);
    let addr = format!("127.0.0.1:{port}");

    // Felix and confd get everything from Typha: their kubeconfig leads nowhere.
    let nowhere = k.path("no-such-kubeconfig");
    let mut felix = Felix::start(
        &k,
        "node1",
        &[
            ("FELIX_TYPHAADDR", addr.as_str()),
            ("KUBECONFIG", nowhere.to_str().unwrap()),
        ],
    );
    let cfg = k.path("confd");
    let log = k.path("confd.log");
    let mut c = k.margay();
    c.args([
        "confd",
        "--nodename",
        "node1",
        "--no-reload",
        "--config-dir",
    ])
    .arg(&cfg)
    .env("FELIX_TYPHAADDR", &addr)
    .env("KUBECONFIG", &nowhere);
    let confd = Role::spawn("confd", c, log);

    felix.wait("node1's pods through Typha", |st| {
        let ids: Vec<String> = endpoints(st).into_keys().collect();
        if ids == ["k8s/shop/web-1/eth0", "k8s/shop/web-2/eth0"] {
            Ok(())
        } else {
            Err(format!("endpoints {ids:?}"))
        }
    });
    let bird = || std::fs::read_to_string(cfg.join("bird.cfg")).unwrap_or_default();
    let own_block = s
        .list(Gvr::calico("blockaffinities"), None, "")
        .unwrap()
        .into_iter()
        .find(|a| a["spec"]["node"] == "node1")
        .map(|a| a["spec"]["cidr"].as_str().unwrap().to_string())
        .unwrap();
    wait_for("confd's config through Typha", WAIT, || {
        confd.assert_alive();
        typha.assert_alive();
        let b = bird();
        if b.contains("protocol bgp Mesh_10_0_0_2 from bgp_template")
            && b.contains(&format!("route {own_block} blackhole;"))
        {
            Ok(())
        } else {
            Err(format!("{b}\nconfd log: {}", tail(&confd.log(), 10)))
        }
    });

    // Typha is the only watcher: one watch per API resource and syncer type (nodes, pools and
    // BGP configurations are in both the felix and the bgp syncer, as in Calico's Typha), none
    // from Felix or confd.
    let mut want: BTreeMap<(String, String), usize> = felix_syncer_resources()
        .into_iter()
        .map(|(g, r)| ((g.to_string(), r.to_string()), 1))
        .collect();
    for r in BGP_ONLY_RESOURCES {
        want.insert(("crd.projectcalico.org".into(), r.into()), 1);
    }
    for r in [
        ("", "nodes"),
        ("crd.projectcalico.org", "ippools"),
        ("crd.projectcalico.org", "bgpconfigurations"),
    ] {
        want.insert((r.0.into(), r.1.into()), 2);
    }
    wait_for("Typha's watches", WAIT, || {
        let open: BTreeMap<(String, String), usize> = k
            .api
            .stats()
            .open_watches
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect();
        if open == want {
            Ok(())
        } else {
            Err(format!("open watches {open:?}"))
        }
    });

    // Changes reach both through Typha.
    s.create(
        PODS,
        "shop",
        pod("web-3", "node1", "web", None, IpVia::Status("10.65.0.4")),
    )
    .unwrap();
    let peer = k.file(
        "peer.yaml",
        "apiVersion: projectcalico.org/v3\nkind: BGPPeer\nmetadata: {name: tor}\nspec: {peerIP: 10.0.0.254, asNumber: 65000}\n",
    );
    k.ctl_ok(&["apply", "-f", &peer]);
    felix.wait("web-3 through Typha", |st| {
        if endpoints(st).contains_key("k8s/shop/web-3/eth0") {
            Ok(())
        } else {
            Err("no web-3".into())
        }
    });
    wait_for("the BGPPeer through Typha", WAIT, || {
        confd.assert_alive();
        let b = bird();
        if b.contains("protocol bgp Global_10_0_0_254 from bgp_template") {
            Ok(())
        } else {
            Err(format!("{b}\nconfd log: {}", tail(&confd.log(), 10)))
        }
    });
    bird_accepts(&cfg.join("bird.cfg"));
}

// ---------------------------------------------------------------------------------------------
// 6. Node start-up in a kubeadm cluster; the Node's NetworkUnavailable condition
// ---------------------------------------------------------------------------------------------

const CONFIGMAPS: Gvr = Gvr::core("configmaps");

/// kube-system/kubeadm-config as kubeadm writes it (ClusterConfiguration as YAML text).
fn kubeadm_config(pod_subnet: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
        "data": {"ClusterConfiguration": format!(
            "apiServer: {{}}\napiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\nkubernetesVersion: v1.30.0\nnetworking:\n  dnsDomain: cluster.local\n  podSubnet: {pod_subnet}\n  serviceSubnet: 10.96.0.0/12\n"
        )},
    })
}

/// `margay node startup` for `node` as calico-node runs it, with no pool variables but `env`.
fn plain_startup(k: &Cluster, node: &str, env: &[(&str, &str)]) -> Run {
    let mut c = k.margay();
    c.args(["node", "startup", "--root"])
        .arg(k.path(&format!("root-{node}")))
        .env("NODENAME", node);
    for (key, v) in env {
        c.env(key, v);
    }
    run(c)
}

/// The Kubernetes Node's condition of `type` (Null when it has none).
fn node_condition(s: &StoreHandle, node: &str, kind: &str) -> Value {
    let n = s.get(NODES, "", node).unwrap();
    n["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .cloned()
        .unwrap_or(Value::Null)
}

/// What the kubelet and a cloud's route controller leave on a new Node: Ready, and
/// NetworkUnavailable until the network plugin says otherwise.
fn set_kubelet_conditions(s: &StoreHandle, node: &str) {
    s.patch_status(
        NODES,
        "",
        node,
        PatchType::Merge,
        &json!({"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "message": "kubelet is posting ready status",
             "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "NetworkUnavailable", "status": "True", "reason": "NoRouteCreated",
             "message": "Node created without a route",
             "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ]}}),
    )
    .unwrap();
}

/// `margay node network-condition` (the DaemonSet's sidecar) for NODENAME `node`.
fn network_condition(k: &Cluster, node: &str, env: &[(&str, &str)]) -> Role {
    let log = k.path(&format!("network-condition-{node}.log"));
    let mut c = k.margay();
    c.args([
        "node",
        "network-condition",
        "--ready-timeout",
        "60s",
        "--root",
    ])
    .arg(k.path(&format!("root-{node}")))
    .env("NODENAME", node)
    .env("MARGAY_LOG", "info");
    for (key, v) in env {
        c.env(key, v);
    }
    Role::spawn("network-condition", c, log)
}

#[test]
fn node_startup_reads_the_pod_cidr_from_kubeadm_config_and_clears_network_unavailable() {
    let k = Cluster::start();
    k.seed();
    let s = k.store();
    set_kubelet_conditions(&s, "node1");
    s.create(
        CONFIGMAPS,
        "kube-system",
        kubeadm_config("10.244.0.0/16,fd00:10::/56"),
    )
    .unwrap();

    // No CALICO_IPV4POOL_CIDR / CALICO_IPV6POOL_CIDR: the default pools are kubeadm's.
    let r = plain_startup(&k, "node1", &[("IP", "10.0.0.1/24")]);
    assert_eq!(r.code, 0, "{r:?}");
    let pool = |name: &str| {
        s.get(Gvr::calico("ippools"), "", name)
            .map(|p| p["spec"]["cidr"].clone())
    };
    assert_eq!(pool("default-ipv4-ippool").unwrap(), "10.244.0.0/16");
    if std::path::Path::new("/proc/sys/net/ipv6").exists() {
        assert_eq!(pool("default-ipv6-ippool").unwrap(), "fd00:10::/56");
    }
    let ci = s
        .get(Gvr::calico("clusterinformations"), "", "default")
        .unwrap();
    assert_eq!(ci["spec"]["clusterType"], "kubeadm,kdd", "{ci}");
    // Start-up leaves the condition to the process beside Felix.
    assert_eq!(
        node_condition(&s, "node1", "NetworkUnavailable")["reason"],
        "NoRouteCreated"
    );

    // The DaemonSet's sidecar, started before Felix is: it waits for Felix's readiness.
    let health_port = margay_testkit::free_port().unwrap().to_string();
    let mut cond = network_condition(
        &k,
        "node1",
        &[
            ("CALICO_NETWORKING_BACKEND", "vxlan"),
            ("FELIX_HEALTHENABLED", "true"),
            ("FELIX_HEALTHPORT", &health_port),
        ],
    );
    std::thread::sleep(Duration::from_secs(2));
    cond.assert_alive();
    assert_eq!(
        node_condition(&s, "node1", "NetworkUnavailable")["reason"],
        "NoRouteCreated",
        "cleared before Felix was ready; log:\n{}",
        cond.log()
    );
    let _felix = Felix::start(
        &k,
        "node1",
        &[
            ("FELIX_HEALTHENABLED", "true"),
            ("FELIX_HEALTHPORT", &health_port),
        ],
    );
    let up = wait_for("NetworkUnavailable False once Felix is ready", WAIT, || {
        cond.assert_alive();
        let c = node_condition(&s, "node1", "NetworkUnavailable");
        if c["status"] == "False" {
            Ok(c)
        } else {
            Err(format!("{c}\nlog: {}", tail(&cond.log(), 10)))
        }
    });
    assert_eq!(up["reason"], "CalicoIsUp", "{up}");
    assert_eq!(up["message"], "Calico is running on this node", "{up}");
    for t in ["lastTransitionTime", "lastHeartbeatTime"] {
        let v = up[t].as_str().unwrap_or_default();
        assert!(
            v.len() == 20 && v.ends_with('Z') && v > "2026-01-01",
            "{t}: {up}"
        );
    }
    // The kubelet's condition is untouched.
    assert_eq!(
        node_condition(&s, "node1", "Ready")["reason"],
        "KubeletReady"
    );
    cond.assert_alive();

    // The pod going away: SIGTERM sets it again, and the process exits 0.
    assert_eq!(cond.stop(WAIT), Some(0), "{}", cond.log());
    let down = node_condition(&s, "node1", "NetworkUnavailable");
    assert_eq!(
        (&down["status"], &down["reason"], &down["message"]),
        (
            &json!("True"),
            &json!("CalicoIsDown"),
            &json!("Calico is shutting down on this node")
        ),
        "{down}"
    );
    assert_eq!(
        node_condition(&s, "node1", "Ready")["reason"],
        "KubeletReady"
    );
}

#[test]
fn node_startup_explicit_pool_cidr_wins_and_unreadable_configmaps_are_absent() {
    // An explicit CALICO_IPV4POOL_CIDR wins over kubeadm's podSubnet.
    let k = Cluster::start();
    k.seed();
    let s = k.store();
    s.create(CONFIGMAPS, "kube-system", kubeadm_config("10.244.0.0/16"))
        .unwrap();
    let r = plain_startup(
        &k,
        "node1",
        &[
            ("IP", "10.0.0.1/24"),
            ("CALICO_IPV4POOL_CIDR", "10.65.0.0/16"),
            ("CALICO_IPV6POOL_CIDR", "none"),
            ("CLUSTER_TYPE", "k8s"),
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let pool = s
        .get(Gvr::calico("ippools"), "", "default-ipv4-ippool")
        .unwrap();
    assert_eq!(pool["spec"]["cidr"], "10.65.0.0/16", "{pool}");
    let ci = s
        .get(Gvr::calico("clusterinformations"), "", "default")
        .unwrap();
    assert_eq!(ci["spec"]["clusterType"], "k8s,kubeadm,kdd", "{ci}");

    // 403 on both ConfigMaps (RBAC without configmaps get): not a kubeadm cluster, so no
    // kubeadm CIDR and no kubeadm cluster type; start-up succeeds.
    let k = Cluster::start();
    k.seed();
    let s = k.store();
    s.create(CONFIGMAPS, "kube-system", kubeadm_config("10.244.0.0/16"))
        .unwrap();
    let gets = || k.api.stats().request_count("get", "", "configmaps");
    let before = gets();
    k.api.fail_next(
        margay_apiserver::FaultMatcher::any()
            .verb("get")
            .resource("configmaps"),
        403,
        2,
    );
    let r = plain_startup(
        &k,
        "node1",
        &[("IP", "10.0.0.1/24"), ("CALICO_IPV6POOL_CIDR", "none")],
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(gets() - before, 2, "both ConfigMaps asked for once");
    let pool = s
        .get(Gvr::calico("ippools"), "", "default-ipv4-ippool")
        .unwrap();
    assert_ne!(pool["spec"]["cidr"], "10.244.0.0/16", "{pool}");
    let ci = s
        .get(Gvr::calico("clusterinformations"), "", "default")
        .unwrap();
    assert_eq!(ci["spec"]["clusterType"], "kdd", "{ci}");

    // Any other failure stops start-up, saying which ConfigMap and what to check.
    k.api.fail_next(
        margay_apiserver::FaultMatcher::any()
            .verb("get")
            .resource("configmaps")
            .name("kubeadm-config"),
        500,
        1,
    );
    let r = plain_startup(&k, "node2", &[("IP", "10.0.0.2/24")]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.err.contains("ConfigMap kube-system/kubeadm-config") && r.err.contains("reachable"),
        "{r:?}"
    );
    assert!(!k.path("root-node2/var/lib/calico/nodename").exists());

    // CALICO_K8S_NODE_REF naming a Node the cluster lacks is fatal, naming the variable.
    let r = plain_startup(
        &k,
        "node2",
        &[("IP", "10.0.0.2/24"), ("CALICO_K8S_NODE_REF", "ghost")],
    );
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("CALICO_K8S_NODE_REF=\"ghost\""), "{r:?}");
}

#[test]
fn network_condition_follows_the_node_ref_and_writes_nothing_without_calico_networking() {
    let k = Cluster::start();
    k.seed();
    let s = k.store();
    set_kubelet_conditions(&s, "node1");
    set_kubelet_conditions(&s, "node2");
    let patches = || k.api.stats().request_count("patch", "", "nodes");

    // CALICO_NETWORKING_BACKEND=none: nothing is written, not even on SIGTERM. (Nothing to
    // wait for either, so a process that ignored it would clear the condition at once.)
    let (version, before) = (rv(&s.get(NODES, "", "node1").unwrap()), patches());
    let mut none = network_condition(&k, "node1", &[("CALICO_NETWORKING_BACKEND", "none")]);
    std::thread::sleep(Duration::from_millis(1500));
    none.assert_alive();
    assert_eq!(none.stop(WAIT), Some(0), "{}", none.log());
    assert_eq!(rv(&s.get(NODES, "", "node1").unwrap()), version);
    assert_eq!(patches(), before);
    assert!(
        none.log().contains("CALICO_NETWORKING_BACKEND=none"),
        "{}",
        none.log()
    );

    // The condition is the Kubernetes Node's named by CALICO_K8S_NODE_REF (the Calico node
    // name may differ); with nothing to wait for it is cleared at once.
    let mut cond = network_condition(
        &k,
        "calico-name",
        &[
            ("CALICO_NETWORKING_BACKEND", "vxlan"),
            ("CALICO_K8S_NODE_REF", "node2"),
        ],
    );
    wait_for("node2's NetworkUnavailable cleared", WAIT, || {
        cond.assert_alive();
        let c = node_condition(&s, "node2", "NetworkUnavailable");
        if c["reason"] == "CalicoIsUp" {
            Ok(())
        } else {
            Err(format!("{c}\nlog: {}", tail(&cond.log(), 10)))
        }
    });
    assert_eq!(cond.stop(WAIT), Some(0), "{}", cond.log());
    assert_eq!(
        node_condition(&s, "node2", "NetworkUnavailable")["reason"],
        "CalicoIsDown"
    );
    assert_eq!(
        node_condition(&s, "node1", "NetworkUnavailable")["reason"],
        "NoRouteCreated"
    );
}

/// etcd as the datastore with a KUBECONFIG (calico-node in a cluster that keeps Calico's data
/// in etcd): start-up still reads the cluster as Calico's does — kubeadm's podSubnet for the
/// pool, the Kubernetes Node's InternalIP for kubernetes-internal-ip — and writes to etcd.
#[test]
fn node_startup_on_etcd_with_a_kubeconfig_reads_the_cluster() {
    let mut etcd = margay_testkit::etcd::EtcdServer::start().unwrap();
    etcd.wait_healthy().unwrap();
    let k = Cluster::start();
    let s = k.store();
    s.create(NODES, "", k8s_node("node-lo", "127.0.0.1", json!({})))
        .unwrap();
    s.create(CONFIGMAPS, "kube-system", kubeadm_config("10.244.0.0/16"))
        .unwrap();
    let on_etcd = |c: &mut Command| {
        c.env("DATASTORE_TYPE", "etcdv3")
            .env("ETCD_ENDPOINTS", etcd.endpoint());
    };
    let mut c = k.margay();
    on_etcd(&mut c);
    c.args(["node", "startup", "--root"])
        .arg(k.path("root-node-lo"))
        .env("NODENAME", "node-lo")
        .env("IP", "autodetect")
        .env("IP_AUTODETECTION_METHOD", "kubernetes-internal-ip")
        .env("CALICO_IPV6POOL_CIDR", "none");
    let r = run(c);
    assert_eq!(r.code, 0, "{r:?}");
    let ctl = |args: &[&str]| {
        let mut c = k.margay();
        on_etcd(&mut c);
        c.arg("ctl").args(args);
        let r = run(c);
        assert_eq!(r.code, 0, "{r:?}");
        serde_json::from_str::<Value>(&r.out).unwrap()
    };
    let pool = ctl(&["get", "ippool", "default-ipv4-ippool", "-o", "json"]);
    assert_eq!(pool["spec"]["cidr"], "10.244.0.0/16", "{pool}");
    let node = ctl(&["get", "node", "node-lo", "-o", "json"]);
    assert_eq!(node["spec"]["bgp"]["ipv4Address"], "127.0.0.1/8", "{node}");
    let ci = ctl(&["get", "clusterinformation", "default", "-o", "json"]);
    assert_eq!(ci["spec"]["clusterType"], "kubeadm", "{ci}");
    // Nothing of Calico's was written to the API server: it is etcd's.
    assert!(
        s.list(Gvr::calico("ippools"), None, "").unwrap().is_empty()
            && s.get(NODES, "", "node-lo").unwrap()["metadata"]["annotations"]
                .as_object()
                .is_none_or(|a| a.keys().all(|k| !k.starts_with("projectcalico.org/")))
    );
}
