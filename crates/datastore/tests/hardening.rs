//! Issue 17 against the datastore: a maximum value size on every backend (with errors that
//! name the key or the resource, and nothing written), stored keys and values that do not
//! decode skipped and reported instead of failing a list or a watch, a value that no longer
//! decodes still deletable, and secrets kept out of Debug output.
#![allow(clippy::unwrap_used)]
#![cfg(all(feature = "etcd", feature = "local"))]

use std::time::Duration;

use margay_api::{Kind, ResourceKey};
use margay_datastore::kv::{DEFAULT_MAX_VALUE_SIZE, TxnOp, skipped_entries};
use margay_datastore::local::{LocalBackend, LocalOptions};
use margay_datastore::{Client, DatastoreConfig, DatastoreError, KvBackend, MemBackend};

const GNS: &str = "/calico/resources/v3/projectcalico.org/globalnetworksets/";

fn gns_json(name: &str, nets: usize) -> serde_json::Value {
    let nets: Vec<String> = (0..nets)
        .map(|n| {
            format!(
                "10.{}.{}.{}/32",
                (n >> 16) & 0xff,
                (n >> 8) & 0xff,
                n & 0xff
            )
        })
        .collect();
    serde_json::json!({
        "apiVersion": "projectcalico.org/v3",
        "kind": "GlobalNetworkSet",
        "metadata": {"name": name},
        "spec": {"nets": nets},
    })
}

fn local(dir: &tempfile::TempDir) -> LocalBackend {
    LocalBackend::open(LocalOptions::new(dir.path().join("ds.db"))).unwrap()
}

/// Every write path of a backend refuses a value over the limit, naming the key; nothing is
/// written (the revision does not move). Before the fix any size was stored (47 MB).
async fn refuses_oversized_values<B: KvBackend>(b: &B) {
    let key = format!("{GNS}big");
    let big = vec![b'x'; DEFAULT_MAX_VALUE_SIZE + 1];
    let before = b.revision().await.unwrap();
    fn check<T: std::fmt::Debug>(key: &str, r: Result<T, DatastoreError>) {
        let e = r.unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, DatastoreError::Invalid { .. }), "{e:?}");
        assert!(
            msg.contains(key) && msg.contains("DATASTORE_MAX_VALUE_SIZE"),
            "{msg}"
        );
    }
    check(&key, b.create(&key, big.clone(), None).await);
    b.create(&key, b"{}".to_vec(), None).await.unwrap();
    let after_create = b.revision().await.unwrap();
    assert!(after_create > before);
    check(&key, b.update(&key, big.clone(), None, None).await);
    check(
        &key,
        b.txn(
            vec![],
            vec![TxnOp::Put {
                key: key.clone(),
                value: big,
            }],
        )
        .await
        .map(|_| ()),
    );
    assert_eq!(
        b.revision().await.unwrap(),
        after_create,
        "something was written"
    );
    // The limit itself is allowed.
    b.update(&key, vec![b'y'; DEFAULT_MAX_VALUE_SIZE], None, None)
        .await
        .unwrap();
}

#[tokio::test]
async fn every_backend_refuses_values_over_the_limit() {
    refuses_oversized_values(&MemBackend::new()).await;
    let dir = tempfile::tempdir().unwrap();
    refuses_oversized_values(&local(&dir)).await;
    let server = margay_testkit::etcd::EtcdServer::start().unwrap();
    let cfg = margay_datastore::config::EtcdConfig {
        endpoints: vec![server.endpoint()],
        ..Default::default()
    };
    refuses_oversized_values(
        &margay_datastore::etcd::EtcdBackend::connect(&cfg)
            .await
            .unwrap(),
    )
    .await;
}

/// The typed client names the resource, not its storage path.
#[tokio::test]
async fn an_oversized_resource_is_named() {
    let client = Client::new(MemBackend::new());
    // About 16 bytes per net: 120,000 nets is about 1.9 MB.
    let r = margay_api::codec::decode_value(gns_json("huge-set", 120_000)).unwrap();
    let Err(e) = client.create(r).await.map(|_| ()) else {
        panic!("a 1.9 MB resource was stored");
    };
    let e = e.to_string();
    assert!(
        e.contains("GlobalNetworkSet") && e.contains("huge-set"),
        "{e}"
    );
    assert!(e.contains("split it"), "{e}");
    let listed = client.list(Kind::GlobalNetworkSet, None, "").await.unwrap();
    assert!(listed.items.is_empty());
}

#[test]
fn the_limit_is_configurable() {
    let cfg = |v: &str| {
        DatastoreConfig::from_lookup(|k| (k == "DATASTORE_MAX_VALUE_SIZE").then(|| v.to_string()))
    };
    assert_eq!(cfg("").unwrap().max_value_size, DEFAULT_MAX_VALUE_SIZE);
    assert_eq!(cfg("4194304").unwrap().max_value_size, 4 << 20);
    for bad in ["12", "x", "-1", "99999999999999999999"] {
        let e = cfg(bad).unwrap_err().to_string();
        assert!(e.contains("DATASTORE_MAX_VALUE_SIZE"), "{e}");
    }
    assert_eq!(DEFAULT_MAX_VALUE_SIZE, 1536 * 1024 - 4096);
}

#[test]
fn debug_output_redacts_secrets() {
    let cfg = DatastoreConfig::from_lookup(|k| match k {
        "ETCD_ENDPOINTS" => Some("https://127.0.0.1:2379".into()),
        "ETCD_USERNAME" => Some("root".into()),
        "ETCD_PASSWORD" => Some("s3cret-etcd-pass".into()),
        "K8S_API_TOKEN" => Some("s3cret-token".into()),
        _ => None,
    })
    .unwrap();
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(
        shown.contains("<redacted>") && shown.contains("root"),
        "{shown}"
    );
}

/// A key that is not UTF-8 (written by another tool) is skipped and counted; the listing
/// and the watch go on. Before the fix the whole list failed (and Typha's syncer with it).
#[tokio::test]
async fn undecodable_keys_do_not_fail_a_local_list_or_watch() {
    let dir = tempfile::tempdir().unwrap();
    let b = local(&dir);
    b.create(&format!("{GNS}a"), b"{}".to_vec(), None)
        .await
        .unwrap();
    let rev = b.revision().await.unwrap();
    let mut watch = b.watch(GNS, rev).await.unwrap();
    {
        let conn = rusqlite::Connection::open(dir.path().join("ds.db")).unwrap();
        let mut bad = GNS.as_bytes().to_vec();
        bad.extend_from_slice(&[0xff, 0xfe]);
        conn.execute(
            "INSERT INTO log (key, deleted, value, create_revision) VALUES (CAST(?1 AS TEXT), 0, x'7b7d', 0)",
            [&bad],
        )
        .unwrap();
        let r = conn.last_insert_rowid();
        conn.execute(
            "INSERT INTO kv (key, value, create_revision, mod_revision) VALUES (CAST(?1 AS TEXT), x'7b7d', ?2, ?2)",
            rusqlite::params![&bad, r],
        )
        .unwrap();
    }
    let skipped = skipped_entries();
    let listed = b.list(GNS).await.unwrap();
    assert_eq!(listed.kvs.len(), 1);
    assert_eq!(listed.kvs[0].key, format!("{GNS}a"));
    assert!(skipped_entries() > skipped);
    // The watch skips it and delivers what comes next.
    b.create(&format!("{GNS}b"), b"{}".to_vec(), None)
        .await
        .unwrap();
    let events = tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("the watch delivers the next change")
        .unwrap()
        .unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].key(), format!("{GNS}b"));
}

/// The same against etcd: a key written by another client as raw bytes.
#[tokio::test]
async fn undecodable_keys_do_not_fail_an_etcd_list_or_watch() {
    let server = margay_testkit::etcd::EtcdServer::start().unwrap();
    let cfg = margay_datastore::config::EtcdConfig {
        endpoints: vec![server.endpoint()],
        ..Default::default()
    };
    let b = margay_datastore::etcd::EtcdBackend::connect(&cfg)
        .await
        .unwrap();
    b.create(&format!("{GNS}a"), b"{}".to_vec(), None)
        .await
        .unwrap();
    let rev = b.revision().await.unwrap();
    let mut watch = b.watch(GNS, rev).await.unwrap();
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let mut bad = GNS.as_bytes().to_vec();
    bad.extend_from_slice(&[0xff, 0xfe]);
    raw.put(bad, "{}", None).await.unwrap();
    b.create(&format!("{GNS}b"), b"{}".to_vec(), None)
        .await
        .unwrap();
    let listed = b.list(GNS).await.unwrap();
    let keys: Vec<&str> = listed.kvs.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, [format!("{GNS}a"), format!("{GNS}b")]);
    let mut got = Vec::new();
    while got.is_empty() {
        let events = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .expect("the watch goes on")
            .unwrap()
            .unwrap();
        got.extend(events.iter().map(|e| e.key().to_string()));
    }
    assert_eq!(got, [format!("{GNS}b")]);
}

/// A stored value that no longer decodes can be deleted through the typed client (what
/// `margay ctl delete` calls): the delete succeeds and the key is gone. Before the fix the
/// delete reported the decode error.
#[tokio::test]
async fn a_value_that_does_not_decode_can_be_deleted() {
    let kv = MemBackend::new();
    kv.create(&format!("{GNS}broken"), b"{not json".to_vec(), None)
        .await
        .unwrap();
    let client = Client::new(kv.clone());
    let listed = client.list(Kind::GlobalNetworkSet, None, "").await.unwrap();
    assert_eq!(listed.undecodable.len(), 1);
    let key = ResourceKey {
        kind: Kind::GlobalNetworkSet,
        namespace: String::new(),
        name: "broken".into(),
    };
    let deleted = client.delete(&key, None).await.unwrap();
    assert_eq!(deleted.name(), "broken");
    assert!(kv.get(&format!("{GNS}broken")).await.unwrap().is_none());
}
