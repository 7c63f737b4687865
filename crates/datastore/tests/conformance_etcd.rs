//! The backend conformance suite against a real etcd (started privately on loopback).
#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used)]

mod common;

use margay_datastore::config::EtcdConfig;
use margay_datastore::etcd::EtcdBackend;
use margay_testkit::etcd::EtcdServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_backend_conforms() {
    let server = EtcdServer::start().unwrap();
    let cfg = EtcdConfig {
        endpoints: vec![server.endpoint()],
        ..EtcdConfig::default()
    };
    let b = EtcdBackend::connect(&cfg).await.unwrap();
    common::run_all(&b, "/conformance/etcd/").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_etcd_is_unavailable_not_a_hang() {
    let port = margay_testkit::free_port().unwrap();
    let cfg = EtcdConfig {
        endpoints: vec![format!("http://127.0.0.1:{port}")],
        ..EtcdConfig::default()
    };
    let b = EtcdBackend::connect(&cfg).await.unwrap();
    let started = std::time::Instant::now();
    let err = margay_datastore::KvBackend::get(&b, "/x")
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}
