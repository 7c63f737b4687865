//! Felix finding Typha through Kubernetes (TyphaK8sServiceName) against the API double: the
//! choice of endpoints, the errors, and the client that looks Typha up again — before it
//! delivered anything when no Typha answers, and by stopping once every Typha it knew has left
//! the Service.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use margay_apiserver::{ApiServer, Gvr, PatchType, ServerOptions};
use margay_datastore::{MemBackend, SyncStatus, SyncerEvent};
use margay_felix::inputs::LocalInputs;
use margay_felix::typha_feed::{
    FeedItem, TyphaFeed, TyphaTarget, client_options, discovery, typha_target,
};
use margay_typha::ConnectionState;
use margay_typha::daemon::Embedded;
use margay_typha::discovery::{Discovery, Rng};
use serde_json::{Value, json};

const SLICES: Gvr<'static> = Gvr::new("discovery.k8s.io", "v1", "endpointslices");

struct Api {
    server: ApiServer,
    _dir: tempfile::TempDir,
    kubeconfig: String,
}

fn api() -> Api {
    let server = ApiServer::start(ServerOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();
    Api {
        server,
        kubeconfig: path.display().to_string(),
        _dir: dir,
    }
}

fn endpoint(ip: &str, node: &str, ready: Option<bool>) -> Value {
    let mut e = json!({"addresses": [ip], "nodeName": node});
    if let Some(r) = ready {
        e["conditions"] = json!({"ready": r});
    }
    e
}

fn slice(name: &str, service: &str, ports: Value, endpoints: Vec<Value>) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "kube-system",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": endpoints,
    })
}

fn typha_port(port: u16) -> Value {
    json!([{"name": "calico-typha", "port": port, "protocol": "TCP"}])
}

/// Felix's configuration and environment for a node.
fn felix_discovery(api: &Api, node: &str) -> Discovery {
    let env: BTreeMap<String, String> = [
        ("FELIX_TYPHAK8SSERVICENAME", "calico-typha"),
        ("FELIX_FELIXHOSTNAME", node),
        ("KUBECONFIG", api.kubeconfig.as_str()),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let local = LocalInputs {
        env: env.clone(),
        config_file: "/nonexistent/felix.cfg".into(),
        config_text: None,
        kernel_hostname: None,
    };
    let config = margay_felix_config::load(&local.config_inputs())
        .unwrap()
        .config;
    let Some(TyphaTarget::Kubernetes(service)) = typha_target(&config) else {
        panic!("TyphaK8sServiceName should select the Kubernetes lookup")
    };
    assert_eq!(service.to_string(), "kube-system/calico-typha");
    discovery(&env, &config, service).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_prefers_this_node_and_skips_what_is_not_typha() {
    let api = api();
    let store = api.server.store();
    store
        .create(
            SLICES,
            "kube-system",
            slice(
                "calico-typha-v4",
                "calico-typha",
                json!([{"name": "metrics", "port": 9093}, {"name": "calico-typha", "port": 5473}]),
                vec![
                    endpoint("10.0.0.2", "n2", Some(true)),
                    endpoint("10.0.0.1", "n1", None),
                    // Unready (a Typha that is starting or draining), even on this node.
                    endpoint("10.0.0.11", "n1", Some(false)),
                    endpoint("10.0.0.3", "n3", Some(true)),
                ],
            ),
        )
        .unwrap();
    // Another port of the service (no calico-typha port) and another service.
    store
        .create(
            SLICES,
            "kube-system",
            slice(
                "calico-typha-metrics",
                "calico-typha",
                json!([{"name": "metrics", "port": 9093}]),
                vec![endpoint("10.0.0.21", "n1", None)],
            ),
        )
        .unwrap();
    store
        .create(
            SLICES,
            "kube-system",
            slice(
                "other",
                "other-service",
                typha_port(5473),
                vec![endpoint("10.0.0.31", "n1", None)],
            ),
        )
        .unwrap();
    let d = felix_discovery(&api, "n1");
    let mut rng = Rng::from_entropy();
    let mut seconds = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let found = d.discover(&mut rng).await.unwrap();
        let addrs = found.addrs();
        assert_eq!(addrs.len(), 3, "{addrs:?}");
        assert_eq!(
            addrs[0], "10.0.0.1:5473",
            "this node's Typha first: {addrs:?}"
        );
        assert!(found.typhas[0].local && !found.typhas[1].local);
        let mut rest = addrs[1..].to_vec();
        rest.sort();
        assert_eq!(rest, ["10.0.0.2:5473", "10.0.0.3:5473"]);
        seconds.insert(addrs[1].clone());
        assert!(
            found.describe().starts_with("10.0.0.1:5473 (this node), "),
            "{}",
            found.describe()
        );
    }
    // The remote ones are shuffled, so clients spread over them.
    assert_eq!(seconds.len(), 2, "{seconds:?}");

    // From another node, nothing is local.
    let found = felix_discovery(&api, "n9")
        .discover(&mut rng)
        .await
        .unwrap();
    assert!(found.typhas.iter().all(|t| !t.local));
    assert_eq!(found.typhas.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_errors_say_what_is_wrong() {
    let api = api();
    let d = felix_discovery(&api, "n1");
    let mut rng = Rng::seeded(1);
    let e = d.discover(&mut rng).await.unwrap_err().to_string();
    assert!(
        e.starts_with(
            "no ready endpoints for service kube-system/calico-typha with a port named calico-typha: "
        ) && e.contains("no EndpointSlice in namespace kube-system is labelled kubernetes.io/service-name=calico-typha"),
        "{e}"
    );
    api.server
        .store()
        .create(
            SLICES,
            "kube-system",
            slice(
                "calico-typha-x",
                "calico-typha",
                typha_port(5473),
                vec![endpoint("10.0.0.1", "n1", Some(false))],
            ),
        )
        .unwrap();
    let e = d.discover(&mut rng).await.unwrap_err().to_string();
    assert!(
        e.starts_with("no ready endpoints for service kube-system/calico-typha")
            && e.contains("1 endpoint(s) not ready"),
        "{e}"
    );
    api.server.stop();
    let e = d.discover(&mut rng).await.unwrap_err().to_string();
    assert!(
        e.contains("cannot list the EndpointSlices of service kube-system/calico-typha"),
        "{e}"
    );
}

/// Waits (bounded) for the feed's first in-sync; returns every connection state seen.
async fn until_in_sync(feed: &mut TyphaFeed, within: Duration) -> Vec<ConnectionState> {
    let deadline = Instant::now() + within;
    let mut states = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let items = tokio::time::timeout(left, feed.next())
            .await
            .unwrap_or_else(|_| panic!("not in sync within {within:?}; states: {states:?}"))
            .expect("the feed stopped");
        for i in items {
            match i {
                FeedItem::Syncer(SyncerEvent::Status(SyncStatus::InSync)) => return states,
                FeedItem::Connection(c) => states.push(c),
                _ => {}
            }
        }
    }
}

fn set_slice_endpoint(api: &Api, port: u16) {
    api.server
        .store()
        .patch(
            SLICES,
            "kube-system",
            "calico-typha-x",
            PatchType::Merge,
            &json!({"ports": typha_port(port), "endpoints": [endpoint("127.0.0.1", "n1", Some(true))]}),
        )
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_looks_typha_up_again_when_it_moved() {
    let api = api();
    // The service points at a port nothing listens on: a Typha that has moved.
    let gone = margay_testkit::free_port().unwrap();
    api.server
        .store()
        .create(
            SLICES,
            "kube-system",
            slice(
                "calico-typha-x",
                "calico-typha",
                typha_port(gone),
                vec![endpoint("127.0.0.1", "n1", Some(true))],
            ),
        )
        .unwrap();
    let mut d = felix_discovery(&api, "n1");
    d.recheck = Duration::from_millis(200);
    let mut rng = Rng::seeded(3);
    let found = d.discover(&mut rng).await.unwrap();
    assert_eq!(found.addrs(), [format!("127.0.0.1:{gone}")]);

    let kv = MemBackend::new();
    let typha = Embedded::start(
        kv.clone(),
        &margay_typha::TyphaConfig::default(),
        None,
        "127.0.0.1:0",
    )
    .await
    .unwrap();
    let mut opts = client_options(&margay_felix_config::Config::default(), found.addrs()).unwrap();
    opts.hostname = "n1".into();
    opts.backoff = Duration::from_millis(20);
    opts.max_backoff = Duration::from_millis(100);
    opts.connect_timeout = Duration::from_secs(2);
    let mut feed = TyphaFeed::start_discovered(opts, d, found);
    // Nothing answers at first; the Service then names the real Typha.
    tokio::time::sleep(Duration::from_millis(300)).await;
    set_slice_endpoint(&api, typha.addr.port());
    let states = until_in_sync(&mut feed, Duration::from_secs(20)).await;
    assert!(
        matches!(states.first(), Some(ConnectionState::Disconnected { .. })),
        "{states:?}"
    );
    assert!(
        matches!(states.last(), Some(ConnectionState::Connected { addr, .. }) if *addr == typha.addr.to_string()),
        "{states:?}"
    );

    // Once in sync, the Typha goes away and the Service names only another one: the feed
    // stops, saying why, for Felix to restart and find it.
    typha.kill();
    let elsewhere = margay_testkit::free_port().unwrap();
    set_slice_endpoint(&api, elsewhere);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, feed.next()).await {
            Err(_) => panic!("the feed did not stop within 20 s"),
            Ok(None) => break,
            Ok(Some(_)) => {}
        }
    }
    let why = feed.stop_reason();
    assert!(
        why.contains("is in service kube-system/calico-typha any more")
            && why.contains(&format!("127.0.0.1:{elsewhere}")),
        "{why}"
    );
}
