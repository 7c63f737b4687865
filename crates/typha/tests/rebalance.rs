//! The connection limit while Typha runs: a limit lowered at run time moves clients away, and
//! TYPHA_CONNECTIONREBALANCINGMODE=kubernetes computes it from the EndpointSlices of Typha's
//! Service and the Nodes in the Kubernetes API (the API double), following both.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{TestClient, client_opts, fast_config, put, wait_for};
use margay_apiserver::{ApiServer, FaultMatcher, Gvr, ServerOptions};
use margay_datastore::MemBackend;
use margay_typha::daemon::{DaemonOptions, Embedded, run_async};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn reserve_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The housekeeping acts on the limit in force, not the one Typha started with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_lowered_while_running_moves_clients_away() {
    let kv = MemBackend::new();
    for i in 0..20 {
        put(&kv, i, 0).await;
    }
    let cfg = fast_config();
    let addr_a = format!("127.0.0.1:{}", reserve_port());
    let addr_b = format!("127.0.0.1:{}", reserve_port());
    let a = Embedded::start(kv.clone(), &cfg, None, &addr_a)
        .await
        .unwrap();
    assert_eq!(a.server.connection_limit(), 10_000);
    // B is not up yet: every client lands on A.
    let addrs = vec![addr_a.clone(), addr_b.clone()];
    let clients: Vec<TestClient> = (0..6)
        .map(|i| TestClient::start(client_opts(addrs.clone(), &format!("node-{i}"))))
        .collect();
    wait_for("clients in sync on A", Duration::from_secs(10), || {
        clients.iter().all(|c| c.in_sync()) && a.server.connections() == 6
    })
    .await;
    let b = Embedded::start(kv.clone(), &cfg, None, &addr_b)
        .await
        .unwrap();
    // Well under the limit: nobody is asked to move.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        a.server.stats.migrations_requested.load(Ordering::Relaxed),
        0
    );
    a.server.set_connection_limit(2);
    assert_eq!(a.server.connection_limit(), 2);
    wait_for("A down to its new limit", Duration::from_secs(20), || {
        a.server.connections() == 2 && b.server.connections() == 4
    })
    .await;
    assert_eq!(
        a.server.stats.migrations_requested.load(Ordering::Relaxed),
        4
    );
}

const SLICES: Gvr<'static> = Gvr::new("discovery.k8s.io", "v1", "endpointslices");

fn typha_slice(name: &str, service: &str, port_name: &str, ips: &[&str]) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "kube-system",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": port_name, "port": 5473, "protocol": "TCP"}],
        "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect::<Vec<_>>(),
    })
}

/// One GET of Typha's metrics; None while nothing answers.
async fn metrics(port: u16) -> Option<String> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.ok()?;
        Some(String::from_utf8_lossy(&raw).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .ok()
        .flatten()
}

fn gauge(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Waits (bounded) until Typha's `typha_connection_limit` is `want`.
async fn wait_limit(port: u16, want: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(text) = metrics(port).await {
            last = gauge(&text, "typha_connection_limit");
            if last == Some(want) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: typha_connection_limit is {last:?}, expected {want} within 30 s");
}

/// `margay typha` in the kubernetes mode over the API double, as its own datastore: T from
/// the EndpointSlices of its Service with the port calico-typha, N from the Nodes its felix
/// syncer sees, S = 2 (felix, bgp).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_mode_follows_typhas_and_nodes() {
    let api = ApiServer::start(ServerOptions {
        calico_crds: true,
        bookmark_interval: Duration::from_millis(200),
        ..Default::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let store = api.store();
    for n in ["n1", "n2", "n3"] {
        store
            .create(
                Gvr::core("nodes"),
                "",
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}),
            )
            .unwrap();
    }
    store
        .create(
            SLICES,
            "kube-system",
            typha_slice(
                "typha-a",
                "calico-typha",
                "calico-typha",
                &["10.0.0.1", "10.0.0.2"],
            ),
        )
        .unwrap();
    // Neither another service's slice nor a slice without Typha's port counts.
    store
        .create(
            SLICES,
            "kube-system",
            typha_slice("other", "other", "calico-typha", &["10.0.0.7", "10.0.0.8"]),
        )
        .unwrap();
    store
        .create(
            SLICES,
            "kube-system",
            typha_slice("typha-metrics", "calico-typha", "metrics", &["10.0.0.9"]),
        )
        .unwrap();

    let metrics_port = reserve_port();
    let env: BTreeMap<String, String> = [
        ("DATASTORE_TYPE", "kubernetes".to_string()),
        ("KUBECONFIG", kubeconfig.display().to_string()),
        ("TYPHA_SERVERHOST", "127.0.0.1".into()),
        ("TYPHA_SERVERPORT", reserve_port().to_string()),
        ("TYPHA_PROMETHEUSMETRICSENABLED", "true".into()),
        ("TYPHA_PROMETHEUSMETRICSHOST", "127.0.0.1".into()),
        ("TYPHA_PROMETHEUSMETRICSPORT", metrics_port.to_string()),
        ("TYPHA_CONNECTIONREBALANCINGMODE", "kubernetes".into()),
        ("TYPHA_K8SSERVICEPOLLINTERVALSECS", "0.2".into()),
        ("TYPHA_MAXCONNECTIONSLOWERLIMIT", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let typha = tokio::spawn(run_async(DaemonOptions {
        env,
        config_file: dir.path().join("typha.cfg"),
        handle_signals: false,
        log_file: None,
    }));
    struct Abort(tokio::task::JoinHandle<u8>);
    impl Drop for Abort {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let typha = Abort(typha);

    // T = 2, N = 3: 2 × (1 + 3×120/1/100) = 8.
    wait_limit(metrics_port, 8, "two Typhas, three nodes").await;
    // A third Typha in another slice of the service: 2 × (1 + 3×120/2/100) = 4.
    store
        .create(
            SLICES,
            "kube-system",
            typha_slice("typha-b", "calico-typha", "calico-typha", &["10.0.0.3"]),
        )
        .unwrap();
    wait_limit(metrics_port, 4, "three Typhas, three nodes").await;
    // A fourth node: 2 × (1 + 4×120/2/100) = 6.
    store
        .create(
            Gvr::core("nodes"),
            "",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n4"}}),
        )
        .unwrap();
    wait_limit(metrics_port, 6, "three Typhas, four nodes").await;
    // The API failing: the upper limit, and Typha keeps running.
    api.fail_next(
        FaultMatcher::any().resource("endpointslices"),
        500,
        1_000_000,
    );
    wait_limit(metrics_port, 10_000, "the API failing").await;
    assert!(!typha.0.is_finished(), "Typha must survive API errors");
}
