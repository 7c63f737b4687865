//! `margay felix`, run as the real binary against the embedded store (and etcd): start-up to
//! ready, the status API, metrics, the validation filter, restart on a configuration change,
//! SIGTERM.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use margay_testkit::roles::{Node, Role, http_get};
use serde_json::Value;

const HOST: &str = "node1";

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_margay")
}

/// Where the datastore is, as environment variables.
#[derive(Clone)]
enum Store {
    Local(PathBuf),
    Etcd(String),
}

impl Store {
    fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Store::Local(p) => vec![
                ("DATASTORE_TYPE", "local".into()),
                ("DATASTORE_PATH", p.display().to_string()),
            ],
            Store::Etcd(e) => vec![
                ("DATASTORE_TYPE", "etcdv3".into()),
                ("ETCD_ENDPOINTS", e.clone()),
            ],
        }
    }
}

fn margay(store: &Store) -> Command {
    let mut c = Command::new(bin());
    c.env_clear();
    for (k, v) in store.env() {
        c.env(k, v);
    }
    // These tests run Felix in the machine's own namespace: it must not program the kernel.
    c.env("MARGAY_DATAPLANE", "recording");
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

fn apply(store: &Store, dir: &Path, name: &str, yaml: &str) {
    let file = dir.join(name);
    std::fs::write(&file, yaml).unwrap();
    let mut c = margay(store);
    c.args(["ctl", "apply", "-f"]).arg(&file);
    run_ok(c);
}

/// Registers node1 as `margay node startup` does (ClusterInformation ready, default
/// FelixConfigurations, tiers), then the workloads and policy.
fn seed(store: &Store, dir: &Path) {
    let mut c = margay(store);
    c.args(["node", "startup", "--root"])
        .arg(dir.join("root"))
        .env("NODENAME", HOST)
        .env("IP", "10.0.0.1/24")
        .env("NO_DEFAULT_POOLS", "true");
    run_ok(c);
    apply(store, dir, "seed.yaml", SEED);
}

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
  labelsToApply: {pcns.name: ns1}
  ingress: [{action: Allow}]
  egress: [{action: Allow}]
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: allow-web}
spec:
  order: 100
  selector: app == 'web'
  ingress:
  - action: Allow
    protocol: TCP
    source: {selector: app == 'client'}
    destination: {ports: [80]}
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
---
apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata: {name: node2-k8s-client1-eth0, namespace: ns1, labels: {app: client}}
spec: {orchestrator: k8s, node: node2, pod: client1, endpoint: eth0, interfaceName: caliclient1, ipNetworks: [10.65.1.2/32], profiles: [kns.ns1]}
";

/// A running `margay felix` (a supervised testkit role: killed when dropped, its log shown
/// when a test fails).
struct Felix {
    role: Role,
    socket: PathBuf,
    health_port: u16,
    metrics_port: u16,
    store: Store,
}

impl Felix {
    fn start(store: &Store, dir: &Path, extra_env: &[(&str, &str)]) -> Felix {
        let health_port = margay_testkit::free_port().unwrap();
        let metrics_port = margay_testkit::free_port().unwrap();
        let socket = dir.join("run/felix.sock");
        let log = dir.join(format!("felix-{health_port}.log"));
        let cfg = dir.join("felix.cfg");
        std::fs::write(&cfg, "[global]\nLogSeverityScreen = Info\n").unwrap();
        let mut c = margay(store);
        c.args(["felix", "run", "-c"])
            .arg(&cfg)
            .arg("--status-socket")
            .arg(&socket)
            .env("FELIX_FELIXHOSTNAME", HOST)
            .env("FELIX_HEALTHENABLED", "true")
            .env("FELIX_HEALTHHOST", "127.0.0.1")
            .env("FELIX_HEALTHPORT", health_port.to_string())
            .env("FELIX_PROMETHEUSMETRICSENABLED", "true")
            .env("FELIX_PROMETHEUSMETRICSHOST", "127.0.0.1")
            .env("FELIX_PROMETHEUSMETRICSPORT", metrics_port.to_string())
            // The machine's own syslog is none of the test's business.
            .env("FELIX_LOGFILEPATH", "none")
            .env("FELIX_LOGSEVERITYSYS", "none");
        for (k, v) in extra_env {
            c.env(k, v);
        }
        Felix {
            role: Role::spawn("felix", c, log),
            socket,
            health_port,
            metrics_port,
            store: store.clone(),
        }
    }

    fn log(&self) -> String {
        self.role.log()
    }

    /// Waits (bounded) for the process to exit.
    fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        self.role.wait_exit(within)
    }

    fn wait_ready(&mut self, within: Duration) {
        self.role
            .wait_http_ok(self.health_port, "/readiness", within);
    }

    fn status(&self, args: &[&str]) -> String {
        let mut c = margay(&self.store);
        c.args(["felix", "status", "--status-socket"])
            .arg(&self.socket)
            .args(args);
        run_ok(c)
    }

    fn status_json(&self) -> Value {
        serde_json::from_str(&self.status(&["--json"])).unwrap()
    }

    fn terminate(&self) {
        self.role.terminate().unwrap();
    }
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

/// Stores a GlobalNetworkPolicy that decodes but fails validation (a broken selector), as
/// an older or foreign writer could; the typed client would refuse to write it.
fn store_invalid_policy(db: &Path) {
    use margay_datastore::KvBackend;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cfg = margay_datastore::DatastoreConfig {
            datastore_type: margay_datastore::DatastoreType::Local,
            local_path: db.to_path_buf(),
            ..Default::default()
        };
        let b = cfg.connect_existing().await.unwrap();
        let value = br#"{"apiVersion":"projectcalico.org/v3","kind":"GlobalNetworkPolicy","metadata":{"name":"broken"},"spec":{"selector":"app == ","ingress":[{"action":"Allow"}]}}"#;
        b.create(
            "/calico/resources/v3/projectcalico.org/globalnetworkpolicies/broken",
            value.to_vec(),
            None,
        )
        .await
        .unwrap();
    });
}

#[test]
fn felix_runs_against_the_embedded_store_and_restarts_on_config_change() {
    let dir = Node::new("felix").unwrap();
    let db = dir.path().join("datastore.db");
    let store = Store::Local(db.clone());
    seed(&store, dir.path());
    store_invalid_policy(&db);

    let mut felix = Felix::start(&store, dir.path(), &[]);
    felix.wait_ready(Duration::from_secs(20));

    // Health, Calico's way: 200 with the detail table.
    let (code, body) = http_get(felix.health_port, "/liveness").unwrap();
    assert_eq!(code, 200);
    for reporter in [
        "FelixStartup",
        "CalculationGraph",
        "InternalDataplaneMainLoop",
    ] {
        assert!(body.contains(reporter), "{body}");
    }
    let socket_mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&felix.socket).unwrap().permissions(),
    );
    assert_eq!(socket_mode & 0o777, 0o600);

    // The status API: the local endpoints with the policy, in order.
    let st = felix.status_json();
    assert_eq!(st["hostname"], HOST);
    assert_eq!(st["ready"], true);
    assert_eq!(st["in_sync"], true);
    assert_eq!(st["sync_status"], "in-sync");
    assert_eq!(st["dataplane"]["driver"], "recording");
    let eps = st["endpoints"].as_array().unwrap();
    let ids: Vec<&str> = eps.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["k8s/ns1/web1/eth0", "k8s/ns1/web2/eth0"]);
    for e in eps {
        assert_eq!(e["profiles"], serde_json::json!(["kns.ns1"]));
        let tier = &e["tiers"][0];
        assert_eq!(tier["name"], "default");
        assert_eq!(tier["ingress"], serde_json::json!(["allow-web"]));
    }
    assert_eq!(st["counts"]["local_endpoints"], 2);
    assert_eq!(st["counts"]["workload_endpoints"], 3);
    // The client selector became an IP set holding the remote client.
    let sets = st["ip_sets"].as_array().unwrap();
    assert_eq!(sets.len(), 1, "{sets:?}");
    assert_eq!(sets[0]["members"], 1);
    // The invalid policy was treated as deleted and reported.
    let problems = st["problems"].as_array().unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p["resource"].as_str().unwrap().contains("broken")
                && p["stage"] == "validation"),
        "{problems:?}"
    );
    let phases: Vec<&str> = st["bootstrap"]["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(
        phases,
        [
            "config_load",
            "datastore_connect",
            "datastore_config",
            "dataplane_start",
            "first_in_sync",
            "first_apply",
            "ready"
        ]
    );
    assert!(st["bootstrap"]["ready_after_seconds"].as_f64().unwrap() > 0.0);
    let text = felix.status(&[]);
    assert!(text.contains("live, ready"), "{text}");
    assert!(text.contains("allow-web"), "{text}");
    let config = felix.status(&["config"]);
    assert!(config.contains("\"LogSeverityScreen\""), "{config}");
    assert!(
        felix
            .log()
            .contains("Resource failed validation; treating it as deleted"),
        "{}",
        felix.log()
    );

    // Metrics with Felix's names and plausible values.
    let (code, m) = http_get(felix.metrics_port, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert_eq!(metric(&m, "felix_active_local_endpoints"), 2.0);
    assert_eq!(metric(&m, "felix_active_local_policies"), 1.0);
    assert_eq!(metric(&m, "felix_active_local_selectors"), 1.0);
    assert_eq!(metric(&m, "felix_ipsets_calico{ip_version=\"4\"}"), 1.0);
    assert_eq!(metric(&m, "felix_cluster_num_hosts"), 2.0);
    assert_eq!(metric(&m, "felix_cluster_num_workload_endpoints"), 3.0);
    assert_eq!(metric(&m, "felix_cluster_num_policies"), 1.0);
    assert_eq!(metric(&m, "felix_resync_state"), 3.0);
    assert_eq!(metric(&m, "felix_resyncs_started"), 1.0);
    assert_eq!(
        metric(&m, "felix_invalid_resources{kind=\"GlobalNetworkPolicy\"}"),
        1.0
    );
    assert_eq!(
        metric(
            &m,
            "felix_calc_graph_updates_processed{type=\"WorkloadEndpoint\"}"
        ),
        3.0
    );
    assert!(metric(&m, "felix_calc_graph_output_events") >= 5.0);
    assert!(metric(&m, "felix_calc_graph_update_time_seconds_count") >= 10.0);
    assert!(metric(&m, "felix_int_dataplane_apply_time_seconds_count") >= 1.0);
    assert!(metric(&m, "felix_bootstrap_phase_seconds{phase=\"first_in_sync\"}") > 0.0);

    // `margay felix config` computes the same configuration, with sources.
    let mut c = margay(&store);
    c.args(["felix", "config", "-c"])
        .arg(dir.path().join("felix.cfg"))
        .env("FELIX_FELIXHOSTNAME", HOST)
        .env("FELIX_HEALTHENABLED", "true")
        .env("FELIX_MYSTERY", "1");
    let cfg = run_ok(c);
    assert!(
        cfg.contains("LogSeverityScreen") && cfg.contains("config file"),
        "{cfg}"
    );
    assert!(
        cfg.contains("HealthEnabled") && cfg.contains("FELIX_HEALTHENABLED"),
        "{cfg}"
    );
    assert!(cfg.contains("DefaultEndpointToHostAction"), "{cfg}"); // from node.node1
    assert!(
        cfg.contains("unknown configuration parameter \"mystery\""),
        "{cfg}"
    );

    // A change that cannot be applied live: exit 129, naming the parameter.
    apply(
        &store,
        dir.path(),
        "change.yaml",
        "apiVersion: projectcalico.org/v3
kind: FelixConfiguration
metadata: {name: default}
spec: {logSeverityScreen: Info, reportingInterval: 0s, routeRefreshInterval: 77s}
",
    );
    let status = felix.wait_exit(Duration::from_secs(20));
    let log = felix.log();
    assert_eq!(status.code(), Some(129), "log:\n{log}");
    assert!(
        log.contains("RouteRefreshInterval changed from \"1m30s\" to \"1m17s\""),
        "{log}"
    );
    assert!(
        !felix.socket.exists(),
        "the status socket is removed on exit"
    );
}

#[test]
fn felix_stops_on_sigterm_and_waits_for_a_ready_datastore() {
    let dir = Node::new("felix").unwrap();
    let store = Store::Local(dir.path().join("datastore.db"));
    // An empty store: no ClusterInformation yet, so Felix waits (live) for it.
    let mut felix = Felix::start(&store, dir.path(), &[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !felix
        .log()
        .contains("Waiting for datastore to be initialized")
    {
        assert!(Instant::now() < deadline, "log:\n{}", felix.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, _) = http_get(felix.health_port, "/liveness").unwrap();
    assert_eq!(code, 200);
    // While it waits Felix reports ready, as Calico does (a datastore being migrated must not
    // make every node unready).
    let (code, _) = http_get(felix.health_port, "/readiness").unwrap();
    assert_eq!(code, 200);
    // calico-node start-up marks the datastore ready; Felix then starts.
    seed(&store, dir.path());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !felix.log().contains("Felix is ready") {
        assert!(Instant::now() < deadline, "log:\n{}", felix.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    felix.wait_ready(Duration::from_secs(20));
    assert_eq!(
        felix.status_json()["endpoints"].as_array().unwrap().len(),
        2
    );

    felix.terminate();
    let status = felix.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "log:\n{}", felix.log());
    assert!(felix.log().contains("received SIGTERM"));
    assert!(
        !felix.socket.exists(),
        "the status socket is removed on exit"
    );

    // Without a running Felix, status says what is wrong and how to fix it.
    let out = margay(&store)
        .args(["felix", "status", "--status-socket"])
        .arg(&felix.socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("socket not found") && err.contains("is felix running?"),
        "{err}"
    );
}

#[test]
fn felix_syncs_through_typha_without_datastore_access() {
    let dir = Node::new("felix").unwrap();
    let store = Store::Local(dir.path().join("datastore.db"));
    seed(&store, dir.path());
    let port = margay_testkit::free_port().unwrap();
    let typha_log = dir.path().join("typha.log");
    // Typha's own log file (LogFilePath), as JSON lines for a log shipper.
    let typha_file = dir.path().join("log/typha.json");
    let mut c = margay(&store);
    c.args(["typha", "run", "-c"])
        .arg(dir.path().join("typha.cfg"))
        .env("TYPHA_LOGFILEPATH", &typha_file)
        .env("MARGAY_LOG_FORMAT", "json")
        .env("TYPHA_SERVERHOST", "127.0.0.1")
        .env("TYPHA_SERVERPORT", port.to_string())
        .env("TYPHA_HEALTHENABLED", "false")
        .env("TYPHA_PROMETHEUSMETRICSENABLED", "false");
    let typha = Role::spawn("typha", c, typha_log);
    // Felix is pointed at a datastore path that does not exist: with TyphaAddr set it must
    // read everything from Typha and never open the store.
    let unused = Store::Local(dir.path().join("not-there/datastore.db"));
    let addr = format!("127.0.0.1:{port}");
    let mut felix = Felix::start(&unused, dir.path(), &[("FELIX_TYPHAADDR", addr.as_str())]);
    felix.wait_ready(Duration::from_secs(30));
    let st = felix.status_json();
    assert_eq!(
        st["endpoints"].as_array().unwrap().len(),
        2,
        "{st}\ntypha log:\n{}",
        typha.log()
    );
    assert!(!dir.path().join("not-there").exists());
    let text = std::fs::read_to_string(&typha_file).unwrap();
    let records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        records
            .iter()
            .all(|r| r["time"].is_string() && r["level"].is_string() && r["msg"].is_string()),
        "{text}"
    );
    assert!(
        records.iter().any(|r| r["msg"] == "Logging to file"),
        "{text}"
    );
}

#[test]
fn felix_syncs_from_etcd() {
    let etcd = margay_testkit::etcd::EtcdServer::start().unwrap();
    let dir = Node::new("felix").unwrap();
    let store = Store::Etcd(etcd.endpoint());
    seed(&store, dir.path());
    let mut felix = Felix::start(&store, dir.path(), &[]);
    felix.wait_ready(Duration::from_secs(30));
    let st = felix.status_json();
    assert_eq!(st["endpoints"].as_array().unwrap().len(), 2);
    assert!(st["datastore"].as_str().unwrap().contains("etcd"), "{st}");
    felix.terminate();
    assert_eq!(felix.wait_exit(Duration::from_secs(10)).code(), Some(0));
}

#[test]
fn felix_restarts_when_the_pools_change_the_encapsulation() {
    let dir = Node::new("felix").unwrap();
    let store = Store::Local(dir.path().join("datastore.db"));
    seed(&store, dir.path());
    let mut felix = Felix::start(&store, dir.path(), &[]);
    felix.wait_ready(Duration::from_secs(20));
    assert!(felix.log().contains("vxlan=true"), "{}", felix.log());
    apply(
        &store,
        dir.path(),
        "pool.yaml",
        "apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: default-pool}
spec: {cidr: 10.65.0.0/16, ipipMode: Always, vxlanMode: Never, natOutgoing: true, blockSize: 26}
",
    );
    let status = felix.wait_exit(Duration::from_secs(20));
    let log = felix.log();
    assert_eq!(status.code(), Some(129), "log:\n{log}");
    assert!(log.contains("encapsulation changed"), "{log}");
}

/// Every datagram that arrives on `sock` within `within`.
fn datagrams(sock: &std::os::unix::net::UnixDatagram, within: Duration) -> Vec<String> {
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    while Instant::now() < deadline {
        if let Ok(n) = sock.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    out
}

const SPOOFING_WEP: &str = "apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata: {name: node1-k8s-spoofer-eth0, namespace: ns1}
spec: {orchestrator: k8s, node: node1, pod: spoofer, endpoint: eth0, interfaceName: calispoof, ipNetworks: [10.65.0.9/32], allowSpoofedSourcePrefixes: [10.99.0.0/24]}
";

/// The status socket answers from Felix's first second: while Felix waits for a datastore
/// nobody has initialised, `margay felix status` says so (exit 1), and once `margay node
/// startup` has run, it gives the full status.
#[test]
fn felix_status_says_what_start_up_waits_for() {
    let dir = Node::new("felix").unwrap();
    let store = Store::Local(dir.path().join("ds.db"));
    let mut felix = Felix::start(&store, dir.path(), &[]);
    let status = |args: &[&str]| {
        let mut c = margay(&store);
        c.args(["felix", "status", "--status-socket"])
            .arg(&felix.socket)
            .args(args);
        c.output().unwrap()
    };
    // The first answers may still say "configuration to load": wait for the datastore phase.
    let out =
        margay_testkit::roles::wait_until("a starting answer", Duration::from_secs(20), || {
            let out = status(&[]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if text.contains("Felix is starting") && text.contains("waiting for: the datastore") {
                Ok(out)
            } else {
                Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)))
            }
        });
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("waiting for: the datastore"), "{text}");
    let json: Value = serde_json::from_slice(&status(&["--json"]).stdout).unwrap();
    assert_eq!(json["starting"], true);
    assert!(
        json["waiting_for"].as_str().unwrap().contains("datastore"),
        "{json}"
    );
    // Health answers as it does later.
    let health: Value = serde_json::from_slice(&status(&["health"]).stdout).unwrap();
    assert_eq!(health["live"], true, "{health}");

    // Initialised: Felix starts, and the same socket gives the full status.
    seed(&store, dir.path());
    margay_testkit::roles::wait_until("the full status", Duration::from_secs(30), || {
        let out = status(&["--json"]);
        let st: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
        if out.status.success() && st["sync_status"] == "in-sync" {
            Ok(())
        } else {
            Err(st.to_string())
        }
    });
    felix.wait_ready(Duration::from_secs(30));
}

/// LogSeveritySys: Felix logs to the local syslog socket at that level, as Calico's Felix
/// (facility user, tag calico-felix), and not at all with `none`.
#[test]
fn felix_logs_to_syslog_at_log_severity_sys() {
    let dir = Node::new("felix").unwrap();
    let store = Store::Local(dir.path().join("ds.db"));
    seed(&store, dir.path());
    let path = dir.path().join("syslog.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    let start = |level: &str| {
        let mut f = Felix::start(
            &store,
            dir.path(),
            &[
                ("MARGAY_SYSLOG_SOCKET", path.to_str().unwrap()),
                ("FELIX_LOGSEVERITYSYS", level),
            ],
        );
        f.wait_ready(Duration::from_secs(30));
        f
    };

    // Warning: warnings arrive (an endpoint that fails Felix's checks makes one), info does not.
    let felix = start("Warning");
    apply(&store, dir.path(), "spoof.yaml", SPOOFING_WEP);
    let got = datagrams(&sock, Duration::from_secs(2));
    drop(felix);
    assert!(
        got.iter().any(|m| m.starts_with("<12>")
            && m.contains(" calico-felix[")
            && m.contains("failed validation")),
        "no warning reached syslog: {got:#?}"
    );
    assert!(
        !got.iter().any(|m| m.starts_with("<14>")),
        "info reached syslog at Warning: {got:#?}"
    );

    // Info (Calico's default): the start-up's info lines arrive too.
    let felix = start("Info");
    let got = datagrams(&sock, Duration::from_secs(1));
    drop(felix);
    assert!(
        got.iter().any(|m| m.starts_with("<14>")),
        "no info line at Info: {got:#?}"
    );

    // none: nothing.
    let felix = start("none");
    let got = datagrams(&sock, Duration::from_secs(1));
    drop(felix);
    assert!(got.is_empty(), "syslog got lines with none: {got:#?}");
}

/// LogFilePath + LogSeverityFile: Felix writes its log file at that level (the directory
/// created), in the layout `--log-format`/MARGAY_LOG_FORMAT chose, rotated by size; a path that
/// cannot be opened stops Felix with an error naming it (the parameter is die-on-fail).
#[test]
fn felix_writes_its_log_file_in_calicos_layout_and_rotates_it() {
    let dir = Node::new("felix").unwrap();
    let store = Store::Local(dir.path().join("ds.db"));
    seed(&store, dir.path());
    let file = dir.path().join("var/log/calico/felix.log");
    let mut felix = Felix::start(
        &store,
        dir.path(),
        &[
            ("FELIX_LOGFILEPATH", file.to_str().unwrap()),
            ("FELIX_LOGSEVERITYFILE", "Debug"),
            ("MARGAY_LOG_FORMAT", "calico"),
            ("MARGAY_LOG_FILE_MAX_BYTES", "4096"),
            ("MARGAY_LOG_FILE_KEEP", "2"),
        ],
    );
    felix.wait_ready(Duration::from_secs(30));
    // Twenty endpoints failing Felix's checks make twenty warnings: enough to rotate 4 KiB.
    let many: Vec<String> = (0..20)
        .map(|i| SPOOFING_WEP.replace("spoofer", &format!("spoofer{i}")))
        .collect();
    apply(&store, dir.path(), "spoof.yaml", &many.join("---\n"));
    let rotated = dir.path().join("var/log/calico/felix.log.1");
    margay_testkit::roles::wait_until("the log file rotated", Duration::from_secs(20), || {
        if rotated.exists() {
            Ok(())
        } else {
            Err(format!("no {}", rotated.display()))
        }
    });
    felix.terminate();
    felix.role.wait_exit(Duration::from_secs(20));
    let text =
        std::fs::read_to_string(&file).unwrap() + &std::fs::read_to_string(&rotated).unwrap();
    assert!(!dir.path().join("var/log/calico/felix.log.3").exists());
    for f in [&file, &rotated] {
        assert!(std::fs::metadata(f).unwrap().len() <= 4096);
    }
    // Calico's layout: `2026-11-25 06:40:00.123 [INFO][pid] file.rs 12: message k="v"`.
    let calico_line = |l: &str| {
        let b = l.as_bytes();
        l.len() > 30
            && b.get(4) == Some(&b'-')
            && b.get(10) == Some(&b' ')
            && b.get(19) == Some(&b'.')
            && l[23..].starts_with(" [")
            && l.contains("][")
            && l.contains(".rs ")
    };
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.is_empty());
    assert!(
        lines.iter().all(|l| calico_line(l)),
        "not Calico's layout:\n{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("[WARNING][") && l.contains("spoofer19")),
        "the last warning is not in the newest files:\n{text}"
    );
    // The screen (LogSeverityScreen Info) has the same layout, without the file's debug lines.
    let screen = felix.log();
    assert!(
        screen
            .lines()
            .any(|l| calico_line(l) && l.contains("[INFO][")),
        "{screen}"
    );
    assert!(
        !screen.contains("[DEBUG]["),
        "debug on the screen:\n{screen}"
    );

    // An unopenable path: Felix stops and says which parameter and path.
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "").unwrap();
    let bad = blocker.join("felix.log");
    let mut felix = Felix::start(
        &store,
        dir.path(),
        &[("FELIX_LOGFILEPATH", bad.to_str().unwrap())],
    );
    let status = felix.role.wait_exit(Duration::from_secs(30));
    assert!(!status.success());
    let log = felix.log();
    assert!(
        log.contains("LogFilePath") && log.contains("not-a-dir") && log.contains("none"),
        "{log}"
    );
}

/// One GET over TLS (with a client certificate when given); Err says how the TLS or HTTP
/// exchange failed.
fn https_get(
    port: u16,
    ca: &Path,
    client: Option<(&Path, &Path)>,
) -> Result<(u16, String), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use std::sync::Arc;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(cert)
                    .unwrap()
                    .map(|c| c.unwrap())
                    .collect(),
                PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let tcp = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(tls, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").map_err(|e| e.to_string())?;
    let mut raw = String::new();
    tls.read_to_string(&mut raw).map_err(|e| e.to_string())?;
    let code = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not HTTP: {raw:?}"))?;
    Ok((code, raw))
}

/// PrometheusMetricsCertFile/KeyFile/CAFile/ClientAuth: the metrics are served over TLS and
/// only to clients with a certificate the CA signed; PrometheusProcessMetricsEnabled false
/// leaves out the process's metrics.
#[test]
fn felix_serves_metrics_over_tls_to_verified_clients() {
    let dir = Node::new("felix").unwrap();
    let pki = margay_testkit::etcd::TestPki::generate(&dir.path().join("pki").tap_mkdir()).unwrap();
    let store = Store::Local(dir.path().join("ds.db"));
    seed(&store, dir.path());
    let mut felix = Felix::start(
        &store,
        dir.path(),
        &[
            (
                "FELIX_PROMETHEUSMETRICSCERTFILE",
                pki.server_cert.to_str().unwrap(),
            ),
            (
                "FELIX_PROMETHEUSMETRICSKEYFILE",
                pki.server_key.to_str().unwrap(),
            ),
            ("FELIX_PROMETHEUSMETRICSCAFILE", pki.ca.to_str().unwrap()),
            (
                "FELIX_PROMETHEUSMETRICSCLIENTAUTH",
                "RequireAndVerifyClientCert",
            ),
            ("FELIX_PROMETHEUSPROCESSMETRICSENABLED", "false"),
        ],
    );
    felix.wait_ready(Duration::from_secs(30));
    let port = felix.metrics_port;
    // Plain HTTP gets no metrics.
    assert!(
        !matches!(http_get(port, "/metrics"), Some((200, _))),
        "metrics served in the clear"
    );
    // TLS without a client certificate is refused.
    let e = https_get(port, &pki.ca, None);
    assert!(e.is_err(), "served without a client certificate: {e:?}");
    // With one the CA signed: the metrics, without the process's own.
    let (code, body) = https_get(port, &pki.ca, Some((&pki.client_cert, &pki.client_key)))
        .unwrap_or_else(|e| panic!("{e}; log:\n{}", felix.log()));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("felix_resync_state"), "{body}");
    assert!(!body.contains("process_start_time_seconds"), "{body}");
}

trait TapMkdir {
    fn tap_mkdir(self) -> Self;
}

impl TapMkdir for PathBuf {
    fn tap_mkdir(self) -> Self {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}
