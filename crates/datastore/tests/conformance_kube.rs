//! The backend conformance suite against the Kubernetes datastore, over margay's API-server
//! double (TLS, bearer token, Calico's CRDs), where the contract's semantics carry over:
//! create/update/delete with compare-and-swap on resourceVersions, listing, watching from a
//! revision (and resuming), concurrent read-modify-write, transactions whose compares fail
//! before anything is written. What the Kubernetes API cannot offer is skipped, each with why:
//! - TTL keys: the API has no time-to-live;
//! - compaction: the API server's etcd compacts, not margay (410 Gone is tested separately);
//! - previous values on Put events: watch events carry only the new object;
//! - create revisions: objects do not record the revision they were created at;
//! - atomic multi-object transactions: writes are applied one by one (compares checked first,
//!   earlier writes undone when a later one fails), so concurrent readers can see a torn pair.
#![allow(clippy::unwrap_used)]

mod common;

use margay_apiserver::{ApiServer, ServerOptions};
use margay_datastore::kube::KubeBackend;
use margay_datastore::{KubeSettings, KvBackend};

pub fn server() -> ApiServer {
    ApiServer::start(ServerOptions {
        calico_crds: true,
        ..ServerOptions::default()
    })
    .unwrap()
}

pub async fn backend(api: &ApiServer) -> KubeBackend {
    KubeBackend::connect(&KubeSettings {
        kubeconfig_inline: Some(api.kubeconfig_yaml()),
        ..KubeSettings::default()
    })
    .await
    .unwrap()
}

fn fixture() -> common::Fx {
    common::Fx {
        layout: common::Layout::GlobalNetworkSets {
            root: "/calico/resources/v3/projectcalico.org/globalnetworksets/conf-".into(),
        },
        caps: common::Caps {
            ttl: false,
            compaction: false,
            put_prev: false,
            create_revision: false,
            atomic_txn: false,
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_backend_conforms() {
    let api = server();
    let b = backend(&api).await;
    common::run_all_with(
        &b,
        "/calico/resources/v3/projectcalico.org/globalnetworksets/conf-",
        &fixture(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_outside_calicos_layout_are_refused_and_absent() {
    let api = server();
    let b = backend(&api).await;
    assert_eq!(b.get("/conformance/x").await.unwrap(), None);
    assert_eq!(b.get("/calico/ipam/v2/config").await.unwrap(), None);
    let err = b
        .create("/conformance/x", b"1".to_vec(), None)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no place in the Kubernetes datastore"),
        "{err}"
    );
    assert!(b.list("/calico/felix/").await.unwrap().kvs.is_empty());
    let err = b
        .create(
            "/calico/resources/v3/projectcalico.org/globalnetworksets/t",
            b"{}".to_vec(),
            Some(std::time::Duration::from_secs(5)),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("time to live"), "{err}");
}
