//! Finding Typha through Kubernetes, with the real binaries: `margay typha` serves the
//! embedded store, the Kubernetes API double holds only Typha's EndpointSlices, and
//! `margay felix` / `margay confd --once` are given nothing but FELIX_TYPHAK8SSERVICENAME and
//! a kubeconfig — no Typha address, and a datastore path that does not exist.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use margay_apiserver::{ApiServer, Gvr, ServerOptions};
use margay_testkit::roles::{Node, Role, http_get};
use serde_json::{Value, json};

const HOST: &str = "node1";
const SLICES: Gvr<'static> = Gvr::new("discovery.k8s.io", "v1", "endpointslices");

const SEED: &str = "apiVersion: projectcalico.org/v3
kind: Node
metadata: {name: node2}
spec: {bgp: {ipv4Address: 10.0.0.2/24}}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: default-pool}
spec: {cidr: 10.65.0.0/16, vxlanMode: Always, natOutgoing: true, blockSize: 26}
---
apiVersion: projectcalico.org/v3
kind: Profile
metadata: {name: kns.ns1}
spec:
  ingress: [{action: Allow}]
  egress: [{action: Allow}]
---
apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata: {name: node1-k8s-web1-eth0, namespace: ns1, labels: {app: web}}
spec: {orchestrator: k8s, node: node1, pod: web1, endpoint: eth0, interfaceName: caliweb1, ipNetworks: [10.65.0.2/32], profiles: [kns.ns1]}
---
apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata: {name: node1-k8s-web2-eth0, namespace: ns1, labels: {app: web}}
spec: {orchestrator: k8s, node: node1, pod: web2, endpoint: eth0, interfaceName: caliweb2, ipNetworks: [10.65.0.3/32], profiles: [kns.ns1]}
";

/// `margay` with only the given datastore and no kernel access (recording dataplane).
fn margay(store: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_margay"));
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATASTORE_TYPE", "local")
        .env("DATASTORE_PATH", store)
        .env("MARGAY_DATAPLANE", "recording");
    c
}

fn run_ok(mut c: Command) -> String {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{c:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// node1 registered as `margay node startup` does, node2, a pool and two local workloads.
fn seed(store: &Path, dir: &Path) {
    let mut c = margay(store);
    c.args(["node", "startup", "--root"])
        .arg(dir.join("root"))
        .env("NODENAME", HOST)
        .env("IP", "10.0.0.1/24")
        .env("NO_DEFAULT_POOLS", "true");
    run_ok(c);
    let file = dir.join("seed.yaml");
    std::fs::write(&file, SEED).unwrap();
    let mut c = margay(store);
    c.args(["ctl", "apply", "-f"]).arg(&file);
    run_ok(c);
}

/// `margay typha` over the embedded store, on 127.0.0.1:`port`.
fn start_typha(store: &Path, dir: &Path, port: u16) -> Role {
    let mut c = margay(store);
    c.args(["typha", "run", "-c"])
        .arg(dir.join("typha.cfg"))
        .env("TYPHA_LOGFILEPATH", "none")
        .env("TYPHA_SERVERHOST", "127.0.0.1")
        .env("TYPHA_SERVERPORT", port.to_string());
    Role::spawn("typha", c, dir.join("typha.log"))
}

/// The API double (holding only Typha's EndpointSlices) and a kubeconfig for it.
fn api(dir: &Path) -> (ApiServer, PathBuf) {
    let api = ApiServer::start(ServerOptions::default()).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    (api, kubeconfig)
}

fn slice(name: &str, ports: Value, endpoints: Value) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "kube-system",
                     "labels": {"kubernetes.io/service-name": "calico-typha"}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": endpoints,
    })
}

/// Typha's slices: the real one on this node; an unready one and one on another port, both
/// at ports where nothing listens (a client that tried them would not get in sync from them).
fn publish_typha(api: &ApiServer, typha_port: u16) {
    let dead = margay_testkit::free_port().unwrap();
    let store = api.store();
    store
        .create(
            SLICES,
            "kube-system",
            slice(
                "calico-typha-main",
                json!([{"name": "calico-typha", "port": typha_port, "protocol": "TCP"}]),
                json!([
                    {"addresses": ["127.0.0.1"], "nodeName": HOST, "conditions": {"ready": true}},
                ]),
            ),
        )
        .unwrap();
    store
        .create(
            SLICES,
            "kube-system",
            slice(
                "calico-typha-unready",
                json!([{"name": "calico-typha", "port": dead, "protocol": "TCP"}]),
                json!([
                    {"addresses": ["127.0.0.3"], "nodeName": HOST, "conditions": {"ready": false}},
                ]),
            ),
        )
        .unwrap();
    store
        .create(
            SLICES,
            "kube-system",
            slice(
                "calico-typha-metrics",
                json!([{"name": "metrics", "port": dead, "protocol": "TCP"}]),
                json!([{"addresses": ["127.0.0.4"], "nodeName": HOST}]),
            ),
        )
        .unwrap();
}

#[test]
fn felix_finds_typha_through_its_endpoint_slices_and_syncs() {
    let dir = Node::new("typha-k8s").unwrap();
    let store = dir.path().join("datastore.db");
    seed(&store, dir.path());
    let typha_port = margay_testkit::free_port().unwrap();
    let mut typha = start_typha(&store, dir.path(), typha_port);
    typha.wait_log("Typha listening for clients", Duration::from_secs(20));
    let (api, kubeconfig) = api(dir.path());

    // Felix reads nothing from the datastore with Typha: a path that does not exist proves it.
    let unused = dir.path().join("not-there/datastore.db");
    let health_port = margay_testkit::free_port().unwrap();
    let socket = dir.path().join("run/felix.sock");
    let mut c = margay(&unused);
    c.args(["felix", "run", "-c"])
        .arg(dir.path().join("felix.cfg"))
        .arg("--status-socket")
        .arg(&socket)
        .env("FELIX_FELIXHOSTNAME", HOST)
        // The machine's own syslog is none of the test's business.
        .env("FELIX_LOGFILEPATH", "none")
        .env("FELIX_LOGSEVERITYSYS", "none")
        .env("FELIX_HEALTHENABLED", "true")
        .env("FELIX_HEALTHHOST", "127.0.0.1")
        .env("FELIX_HEALTHPORT", health_port.to_string())
        .env("FELIX_TYPHAK8SSERVICENAME", "calico-typha")
        .env("KUBECONFIG", &kubeconfig);
    let mut felix = Role::spawn("felix", c, dir.path().join("felix.log"));

    // No EndpointSlice yet: Felix says why it cannot start, and keeps looking.
    felix.wait_log(
        "no ready endpoints for service kube-system/calico-typha with a port named calico-typha",
        Duration::from_secs(20),
    );
    assert_eq!(
        http_get(health_port, "/readiness").map(|(code, _)| code),
        Some(503)
    );
    publish_typha(&api, typha_port);

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((200, _)) = http_get(health_port, "/readiness") {
            break;
        }
        if let Some(s) = felix.exited() {
            panic!("felix exited ({s}); log:\n{}", felix.log());
        }
        assert!(
            Instant::now() < deadline,
            "felix not ready within 30 s; log:\n{}\ntypha log:\n{}",
            felix.log(),
            typha.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut c = margay(&unused);
    c.args(["felix", "status", "--json", "--status-socket"])
        .arg(&socket);
    let st: Value = serde_json::from_str(&run_ok(c)).unwrap();
    assert_eq!(st["endpoints"].as_array().unwrap().len(), 2, "{st}");
    let addr = format!("127.0.0.1:{typha_port}");
    // Which Typha it found (only the ready endpoint with Typha's port), and uses.
    assert_eq!(
        st["datastore"],
        format!("typha {addr} (this node) (Kubernetes service kube-system/calico-typha)"),
        "{st}"
    );
    let conn = st["health"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["name"] == "TyphaConnection")
        .unwrap_or_else(|| panic!("no TyphaConnection reporter: {st}"));
    assert!(
        conn["detail"]
            .as_str()
            .unwrap()
            .starts_with(&format!("connected to Typha at {addr} (")),
        "{conn}"
    );
    assert!(!dir.path().join("not-there").exists());
}

#[test]
fn confd_renders_through_typha_found_in_kubernetes() {
    let dir = Node::new("typha-k8s").unwrap();
    let store = dir.path().join("datastore.db");
    seed(&store, dir.path());
    let typha_port = margay_testkit::free_port().unwrap();
    let mut typha = start_typha(&store, dir.path(), typha_port);
    typha.wait_log("Typha listening for clients", Duration::from_secs(20));
    let (api, kubeconfig) = api(dir.path());
    publish_typha(&api, typha_port);

    let cfg = dir.path().join("confd");
    let mut c = margay(&dir.path().join("not-there/datastore.db"));
    c.args([
        "confd",
        "--once",
        "--no-reload",
        "--nodename",
        HOST,
        "--config-dir",
    ])
    .arg(&cfg)
    .env("CALICO_TYPHAK8SSERVICENAME", "calico-typha")
    .env("KUBECONFIG", &kubeconfig);
    let (status, stderr) = run_bounded(c, &dir.path().join("confd.log"), Duration::from_secs(60));
    assert!(status.success(), "{stderr}\ntypha log:\n{}", typha.log());
    assert!(stderr.contains("found through Kubernetes"), "{stderr}");
    let bird = std::fs::read_to_string(cfg.join("bird.cfg")).unwrap();
    assert!(
        bird.contains("protocol bgp Mesh_10_0_0_2 from bgp_template"),
        "{bird}"
    );
    assert!(!dir.path().join("not-there").exists());
}

/// Runs `c` to completion (killed after `within`); its exit status and its stderr, which goes
/// to `log` (a file, so a chatty child never blocks on a full pipe).
fn run_bounded(mut c: Command, log: &Path, within: Duration) -> (std::process::ExitStatus, String) {
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    let mut child = c.spawn().unwrap();
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, std::fs::read_to_string(log).unwrap_or_default());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{c:?} did not finish within {within:?}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---- Services for the service proxy ----------------------------------------------------------

const SERVICES: Gvr<'static> = Gvr::new("", "v1", "services");

/// A ClusterIP Service ns1/web (port 80 → 8080, named `http`) and its one EndpointSlice
/// holding the two local web pods.
fn create_web_service(api: &ApiServer) {
    let store = api.store();
    store
        .create(
            Gvr::new("", "v1", "namespaces"),
            "",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns1"}}),
        )
        .unwrap();
    store
        .create(
            SERVICES,
            "ns1",
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": "ns1"},
                "spec": {"selector": {"app": "web"}, "clusterIP": "10.96.7.7",
                         "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
            }),
        )
        .unwrap();
    store
        .create(
            SLICES,
            "ns1",
            json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "web-abcde", "namespace": "ns1",
                             "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": [
                    {"addresses": ["10.65.0.2"], "nodeName": HOST, "conditions": {"ready": true}},
                    {"addresses": ["10.65.0.3"], "nodeName": HOST, "conditions": {"ready": true}},
                ],
            }),
        )
        .unwrap();
}

/// `margay felix run` with a status socket and health on; `extra` env on top.
fn start_felix(store: &Path, dir: &Path, extra: &[(&str, &str)]) -> (Role, PathBuf, u16) {
    let health_port = margay_testkit::free_port().unwrap();
    let socket = dir.join("run/felix.sock");
    let mut c = margay(store);
    c.args(["felix", "run", "-c"])
        .arg(dir.join("felix.cfg"))
        .arg("--status-socket")
        .arg(&socket)
        .env("FELIX_FELIXHOSTNAME", HOST)
        .env("FELIX_LOGFILEPATH", "none")
        .env("FELIX_LOGSEVERITYSYS", "none")
        .env("FELIX_HEALTHENABLED", "true")
        .env("FELIX_HEALTHHOST", "127.0.0.1")
        .env("FELIX_HEALTHPORT", health_port.to_string());
    for (k, v) in extra {
        c.env(k, v);
    }
    (
        Role::spawn("felix", c, dir.join("felix.log")),
        socket,
        health_port,
    )
}

/// Polls the status until `pred` holds (30 s at most).
fn wait_status(
    felix: &mut Role,
    store: &Path,
    socket: &Path,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if socket.exists() {
            let mut c = margay(store);
            c.args(["felix", "status", "--json", "--status-socket"])
                .arg(socket);
            if let Ok(out) = c.output()
                && out.status.success()
                && let Ok(st) = serde_json::from_slice::<Value>(&out.stdout)
                && pred(&st)
            {
                return st;
            }
        }
        if let Some(s) = felix.exited() {
            panic!("felix exited ({s}); log:\n{}", felix.log());
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within 30 s; log:\n{}",
            felix.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The service port ns1/web `http` as the dataplane has it.
fn web_port(st: &Value) -> Option<&Value> {
    st["services"]
        .as_object()?
        .iter()
        .find(|(k, _)| k.starts_with("ns1/web/") && k.ends_with("/http"))
        .map(|(_, v)| v)
}

fn backends(port: &Value) -> Vec<String> {
    port["cluster_backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| format!("{}:{}", b["addr"].as_str().unwrap(), b["port"]))
        .collect()
}

#[test]
fn felix_proxies_services_from_the_kubernetes_api_beside_the_embedded_store() {
    let dir = Node::new("felix-svc").unwrap();
    let store = dir.path().join("datastore.db");
    seed(&store, dir.path());
    // The web pods may reach the Service's backends only: a `destination.services` rule.
    let pol = dir.path().join("svc-policy.yaml");
    std::fs::write(
        &pol,
        "apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: to-web, namespace: ns1}
spec:
  selector: app == 'web'
  types: [Egress]
  egress:
  - action: Allow
    destination: {services: {name: web, namespace: ns1}}
",
    )
    .unwrap();
    let mut c = margay(&store);
    c.args(["ctl", "apply", "-f"]).arg(&pol);
    run_ok(c);
    let (api, kubeconfig) = api(dir.path());
    let kubeconfig = kubeconfig.to_str().unwrap().to_string();
    let (mut felix, socket, health_port) =
        start_felix(&store, dir.path(), &[("KUBECONFIG", kubeconfig.as_str())]);
    let st = wait_status(&mut felix, &store, &socket, "in sync", |st| {
        st["in_sync"] == true
    });
    assert!(
        st["services"].as_object().unwrap().is_empty(),
        "no Services yet: {st}"
    );
    assert!(
        felix
            .log()
            .contains("Watching Kubernetes Services and EndpointSlices"),
        "{}",
        felix.log()
    );

    create_web_service(&api);
    let st = wait_status(
        &mut felix,
        &store,
        &socket,
        "the Service programmed",
        |st| web_port(st).is_some_and(|p| p["cluster_backends"].as_array().unwrap().len() == 2),
    );
    let port = web_port(&st).unwrap();
    assert_eq!(
        port["frontends"],
        json!([{"kind": "ClusterIp", "addr": "10.96.7.7", "port": 80}]),
        "{st}"
    );
    assert_eq!(backends(port), ["10.65.0.2:8080", "10.65.0.3:8080"]);
    // The `destination.services` IP set holds the two endpoints (address and port each).
    let svc_set = st["ip_sets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"].as_str().unwrap_or_default().contains("web"))
        .unwrap_or_else(|| panic!("no service IP set: {st}"))
        .clone();
    assert_eq!(svc_set["members"], 2, "{svc_set}");
    let health = st["health"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["name"] == "KubernetesServices")
        .unwrap_or_else(|| panic!("no KubernetesServices reporter: {st}"))
        .clone();
    assert_eq!(health["readiness"], "reporting ready", "{health}");

    // The Service deleted: the dataplane loses it; the watch stays healthy.
    api.store().delete(SERVICES, "ns1", "web").unwrap();
    wait_status(&mut felix, &store, &socket, "the Service removed", |st| {
        web_port(st).is_none()
    });
    assert_eq!(
        http_get(health_port, "/readiness").map(|(code, _)| code),
        Some(200)
    );
}

#[test]
fn felix_through_typha_on_the_kubernetes_api_sees_services() {
    let dir = Node::new("typha-svc").unwrap();
    let api = ApiServer::start(ServerOptions {
        calico_crds: true,
        ..ServerOptions::default()
    })
    .unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let kubeconfig = kubeconfig.to_str().unwrap().to_string();
    // Felix waits for datastoreReady, which Typha carries like everything else.
    api.store()
        .create(
            Gvr::new("crd.projectcalico.org", "v1", "clusterinformations"),
            "",
            json!({
                "apiVersion": "crd.projectcalico.org/v1", "kind": "ClusterInformation",
                "metadata": {"name": "default"},
                "spec": {"datastoreReady": true, "clusterType": "k8s"},
            }),
        )
        .unwrap();
    create_web_service(&api);
    let typha_port = margay_testkit::free_port().unwrap();
    let mut c = margay(&dir.path().join("unused.db"));
    c.args(["typha", "run", "-c"])
        .arg(dir.path().join("typha.cfg"))
        .env("DATASTORE_TYPE", "kubernetes")
        .env("KUBECONFIG", &kubeconfig)
        .env("TYPHA_LOGFILEPATH", "none")
        .env("TYPHA_SERVERHOST", "127.0.0.1")
        .env("TYPHA_SERVERPORT", typha_port.to_string());
    let mut typha = Role::spawn("typha", c, dir.path().join("typha.log"));
    typha.wait_log("Typha listening for clients", Duration::from_secs(20));

    let unused = dir.path().join("not-there/datastore.db");
    let addr = format!("127.0.0.1:{typha_port}");
    let (mut felix, socket, _) =
        start_felix(&unused, dir.path(), &[("FELIX_TYPHAADDR", addr.as_str())]);
    let st = wait_status(
        &mut felix,
        &unused,
        &socket,
        "the Service via Typha",
        |st| st["in_sync"] == true && web_port(st).is_some(),
    );
    assert_eq!(
        backends(web_port(&st).unwrap()),
        ["10.65.0.2:8080", "10.65.0.3:8080"],
        "{st}\ntypha log:\n{}",
        typha.log()
    );
    // A slice change travels as a delta.
    let mut slice = api.store().get(SLICES, "ns1", "web-abcde").unwrap();
    slice["endpoints"][1]["conditions"]["ready"] = json!(false);
    api.store().update(SLICES, "ns1", slice).unwrap();
    wait_status(&mut felix, &unused, &socket, "one backend left", |st| {
        web_port(st).is_some_and(|p| backends(p) == ["10.65.0.2:8080"])
    });
    api.store().delete(SERVICES, "ns1", "web").unwrap();
    wait_status(&mut felix, &unused, &socket, "the Service removed", |st| {
        web_port(st).is_none()
    });
    assert!(!dir.path().join("not-there").exists());
}
