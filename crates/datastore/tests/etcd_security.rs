//! etcd with TLS client certificates, and with username/password authentication: margay
//! connects with Calico's settings, and fails with a clear message without them.
#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used)]

use margay_datastore::config::EtcdConfig;
use margay_datastore::etcd::EtcdBackend;
use margay_datastore::{DatastoreConfig, KvBackend};
use margay_testkit::etcd::{EtcdServer, TestPki};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path()).unwrap();
    let server = EtcdServer::start_tls(&pki).unwrap();
    assert!(server.endpoint().starts_with("https://"));

    // The way an operator configures it: Calico's environment variables.
    let vars = [
        ("ETCD_ENDPOINTS", server.endpoint()),
        ("ETCD_CA_CERT_FILE", pki.ca.display().to_string()),
        ("ETCD_CERT_FILE", pki.client_cert.display().to_string()),
        ("ETCD_KEY_FILE", pki.client_key.display().to_string()),
    ];
    let cfg = DatastoreConfig::from_lookup(|k| {
        vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    })
    .unwrap();
    let b = cfg.connect().await.unwrap();
    b.create("/tls/a", b"secret".to_vec(), None).await.unwrap();
    assert_eq!(b.get("/tls/a").await.unwrap().unwrap().value, b"secret");

    // Without a client certificate the server refuses: a clear, transient error.
    let no_cert = EtcdBackend::connect(&EtcdConfig {
        endpoints: vec![server.endpoint()],
        ca_cert_file: Some(pki.ca.clone()),
        ..EtcdConfig::default()
    })
    .await
    .unwrap();
    let err = no_cert.get("/tls/a").await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");

    // A missing certificate file is named.
    let err = EtcdBackend::connect(&EtcdConfig {
        endpoints: vec![server.endpoint()],
        ca_cert_file: Some(dir.path().join("nope.pem")),
        ..EtcdConfig::default()
    })
    .await
    .err()
    .unwrap();
    assert!(
        err.to_string().contains("ETCD_CA_CERT_FILE") && err.to_string().contains("nope.pem"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn username_and_password() {
    let server = EtcdServer::start().unwrap();
    // Turn on authentication with a root user, as an operator would with etcdctl.
    let mut admin = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    admin.user_add("root", "s3cret", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();

    let cfg = |password: &str| EtcdConfig {
        endpoints: vec![server.endpoint()],
        username: Some("root".into()),
        password: Some(password.into()),
        ..EtcdConfig::default()
    };
    let b = EtcdBackend::connect(&cfg("s3cret")).await.unwrap();
    b.create("/auth/a", b"x".to_vec(), None).await.unwrap();
    assert!(b.get("/auth/a").await.unwrap().is_some());

    let err = EtcdBackend::connect(&cfg("wrong")).await.err().unwrap();
    assert!(err.to_string().contains(&server.endpoint()), "{err}");

    // Without credentials every request is refused.
    let anonymous = EtcdBackend::connect(&EtcdConfig {
        endpoints: vec![server.endpoint()],
        ..EtcdConfig::default()
    })
    .await
    .unwrap();
    let err = anonymous.get("/auth/a").await.unwrap_err();
    assert!(err.to_string().contains("ETCD_USERNAME"), "{err}");
}
