//! Felix start-up to ready against an embedded store holding ~10k resources (target: ≤ 1 s).
//!
//! Seeds a temporary embedded datastore with 50 nodes, 9,000 workload endpoints (200 of them
//! on this node), 700 policies (500 namespaced, 200 global, some in a second tier), 20
//! namespace profiles and 150 network sets, then starts Felix in-process on it and measures
//! the time from start to ready (the health aggregator's overall readiness), printing the
//! start-up phases.
//!
//! `cargo run --release -p margay-felix --example startup_bench [-- --runs N]`
#![allow(clippy::unwrap_used, clippy::vec_init_then_push)] // a development tool: fail loudly

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use margay_api::{Resource, decode_one};
use margay_datastore::{Client, DatastoreConfig, DatastoreType};
use margay_felix::daemon::{Daemon, DaemonOptions};

const NODES: usize = 50;
const WEPS: usize = 9_000;
const LOCAL_WEPS: usize = 200;
const NAMESPACES: usize = 20;
const NS_POLICIES: usize = 500;
const GLOBAL_POLICIES: usize = 200;
const NETSETS: usize = 100;
const GLOBAL_NETSETS: usize = 50;

fn res(yaml: &str) -> Resource {
    let r = decode_one(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    r.validate().unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    r
}

fn resources() -> Vec<Resource> {
    let mut v = Vec::new();
    v.push(res(
        "apiVersion: projectcalico.org/v3
kind: ClusterInformation
metadata: {name: default}
spec: {datastoreReady: true, clusterGUID: bench, calicoVersion: v3.30.0}",
    ));
    v.push(res("apiVersion: projectcalico.org/v3
kind: FelixConfiguration
metadata: {name: default}
spec: {logSeverityScreen: Info, reportingInterval: 0s}"));
    v.push(res(
        "apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: default-pool}
spec: {cidr: 10.64.0.0/10, vxlanMode: Always, natOutgoing: true, blockSize: 26}",
    ));
    v.push(res("apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: security}
spec: {order: 10}"));
    v.push(res("apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: default}
spec: {order: 1000000}"));
    for n in 0..NODES {
        v.push(res(&format!(
            "apiVersion: projectcalico.org/v3
kind: Node
metadata: {{name: node{n}, labels: {{rack: r{}}}}}
spec: {{bgp: {{ipv4Address: 10.0.{}.{}/16}}}}",
            n % 5,
            n / 200,
            n % 200 + 1
        )));
    }
    for ns in 0..NAMESPACES {
        v.push(res(&format!(
            "apiVersion: projectcalico.org/v3
kind: Profile
metadata: {{name: kns.ns{ns}}}
spec:
  labelsToApply: {{pcns.projectcalico.org/name: ns{ns}, pcns.team: t{}}}
  ingress: [{{action: Allow}}]
  egress: [{{action: Allow}}]",
            ns % 4
        )));
    }
    for i in 0..WEPS {
        // The first LOCAL_WEPS on node0 (this Felix), the rest spread over the other nodes.
        let node = if i < LOCAL_WEPS {
            0
        } else {
            1 + (i - LOCAL_WEPS) % (NODES - 1)
        };
        let ns = i % NAMESPACES;
        let ip = format!("10.{}.{}.{}", 64 + i / 65_536, (i / 256) % 256, i % 256);
        v.push(res(&format!(
            "apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: node{node}-k8s-pod{i}-eth0
  namespace: ns{ns}
  labels: {{app: app{}, role: role{}, tier: {}}}
spec:
  orchestrator: k8s
  node: node{node}
  pod: pod{i}
  endpoint: eth0
  interfaceName: cali{i:011}
  ipNetworks: [{ip}/32]
  profiles: [kns.ns{ns}]
  ports: [{{name: http, port: 8080, protocol: TCP}}]",
            i % 100,
            i % 10,
            if i % 2 == 0 { "fe" } else { "be" }
        )));
    }
    for i in 0..NS_POLICIES {
        let ns = i % NAMESPACES;
        v.push(res(&format!(
            "apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {{name: np{i}, namespace: ns{ns}}}
spec:
  order: {}
  selector: app == 'app{}'
  types: [Ingress, Egress]
  ingress:
  - action: Allow
    protocol: TCP
    source: {{selector: role == 'role{}'}}
    destination: {{ports: [http, 443]}}
  egress:
  - action: Allow
    destination: {{selector: tier == 'be' && app == 'app{}'}}",
            i % 50,
            i % 100,
            i % 10,
            (i * 7) % 100
        )));
    }
    for i in 0..GLOBAL_POLICIES {
        let tier = if i % 4 == 0 { "security" } else { "default" };
        let name = if tier == "default" {
            format!("gnp{i}")
        } else {
            format!("security.gnp{i}")
        };
        v.push(res(&format!(
            "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {{name: {name}}}
spec:
  tier: {tier}
  order: {i}
  selector: role == 'role{}'
  namespaceSelector: team == 't{}'
  ingress:
  - action: {}
    source: {{selector: netset == 'ns{}'}}
  - action: Allow
    protocol: UDP
    destination: {{ports: [53]}}
  egress:
  - action: Allow
    destination: {{nets: [10.{}.0.0/16]}}",
            i % 10,
            i % 4,
            if tier == "security" { "Pass" } else { "Allow" },
            i % 20,
            i % 200
        )));
    }
    for i in 0..NETSETS {
        v.push(res(&format!(
            "apiVersion: projectcalico.org/v3
kind: NetworkSet
metadata: {{name: netset{i}, namespace: ns{}, labels: {{netset: ns{}}}}}
spec: {{nets: [192.168.{}.0/24, 172.16.{}.0/24]}}",
            i % NAMESPACES,
            i % 20,
            i % 256,
            i % 256
        )));
    }
    for i in 0..GLOBAL_NETSETS {
        v.push(res(&format!(
            "apiVersion: projectcalico.org/v3
kind: GlobalNetworkSet
metadata: {{name: gns{i}, labels: {{netset: ns{}}}}}
spec: {{nets: [198.51.{}.0/24]}}",
            i % 20,
            i % 256
        )));
    }
    v
}

fn main() {
    let runs: usize = std::env::args()
        .skip_while(|a| a != "--runs")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("datastore.db");
    let resources = resources();
    let n = resources.len();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t = Instant::now();
    rt.block_on(async {
        let cfg = DatastoreConfig {
            datastore_type: DatastoreType::Local,
            local_path: db.clone(),
            ..Default::default()
        };
        let client = Client::new(cfg.connect().await.unwrap());
        for r in resources {
            client.create(r).await.unwrap();
        }
    });
    drop(rt);
    println!(
        "seeded {n} resources ({WEPS} workload endpoints on {NODES} nodes, {LOCAL_WEPS} local; {} policies; {NAMESPACES} profiles; {} network sets) in {:.2}s",
        NS_POLICIES + GLOBAL_POLICIES,
        NETSETS + GLOBAL_NETSETS,
        t.elapsed().as_secs_f64()
    );

    let mut readies = Vec::new();
    for run in 1..=runs {
        let env: BTreeMap<String, String> = [
            ("DATASTORE_TYPE", "local".to_string()),
            ("DATASTORE_PATH", db.display().to_string()),
            ("FELIX_FELIXHOSTNAME", "node0".to_string()),
            // Runs in the machine's own namespace: measure the control plane only.
            ("MARGAY_DATAPLANE", "recording".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let opts = DaemonOptions {
            env,
            config_file: dir.path().join("absent-felix.cfg"),
            status_socket: None,
            kernel_hostname: None,
            log_level: None,
            syslog_level: None,
            log_file: None,
            restart_delay: Duration::ZERO,
            handle_signals: false,
        };
        let daemon = Daemon::new(opts);
        let control = daemon.control();
        let handle = std::thread::spawn(move || daemon.run());
        let deadline = Instant::now() + Duration::from_secs(120);
        let boot = loop {
            let b = control.bootstrap();
            if b.ready_after().is_some() {
                break b;
            }
            assert!(Instant::now() < deadline, "felix not ready within 120s");
            std::thread::sleep(Duration::from_millis(2));
        };
        if run == 1
            && let Some(m) = control.metrics()
        {
            println!(
                "state: {} local endpoints, {} active policies, {} active selectors, {} IP sets; \
                 {} hosts, {} workload endpoints, {} policies in the cluster; {} messages to the dataplane",
                m.active_local_endpoints.get(),
                m.active_local_policies.get(),
                m.active_local_selectors.get(),
                m.ipsets.get(),
                m.cluster_hosts.get(),
                m.cluster_workload_endpoints.get(),
                m.cluster_policies.get(),
                m.calc_output_events.get(),
            );
        }
        control.stop();
        let exit = handle.join().unwrap();
        assert_eq!(exit.code(), 0, "{exit:?}");
        let ready = boot.ready_after().unwrap_or_default();
        readies.push(ready);
        println!("\nrun {run}: ready {ready:.3}s after start");
        println!("  {:<18} {:>10} {:>10}", "PHASE", "TOOK", "DONE AT");
        for p in boot.phases() {
            println!(
                "  {:<18} {:>8.1}ms {:>8.1}ms",
                p.phase,
                p.seconds * 1000.0,
                p.at_seconds * 1000.0
            );
        }
    }
    readies.sort_by(f64::total_cmp);
    let median = readies[readies.len() / 2];
    println!(
        "\nstart-up to ready with {n} resources: median {median:.3}s over {runs} runs (target ≤ 1s): {}",
        if median <= 1.0 { "met" } else { "NOT met" }
    );
}
