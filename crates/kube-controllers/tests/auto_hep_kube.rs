//! Automatic host endpoints against the Kubernetes API server double with the Kubernetes
//! datastore: with AUTO_HOST_ENDPOINTS=enabled every Node gets `<node>-auto-hep` (`*`, the
//! node's labels, its InternalIP), a label change reaches it, a deleted Node takes its
//! endpoint along, and a hand-made host endpoint is never touched.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use margay_api::{Kind, Resource, ResourceKey};
use margay_datastore::{AnyBackend, Client};
use margay_kube_controllers::config::DatastoreKind;
use margay_kube_controllers::daemon::Daemon;
use serde_json::json;

fn key(name: &str) -> ResourceKey {
    ResourceKey {
        kind: Kind::HostEndpoint,
        namespace: String::new(),
        name: name.into(),
    }
}

async fn hep(kv: &AnyBackend, name: &str) -> Option<margay_api::HostEndpoint> {
    match Client::new(kv.clone()).get(&key(name)).await {
        Ok(Resource::HostEndpoint(h)) => Some(h),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_get_automatic_host_endpoints() {
    let c = Cluster::start();
    let kv = connect(&c.kube_datastore()).await;
    let node = |name: &str, zone: &str, ip: &str| {
        json!({
            "metadata": {"name": name, "labels": {"zone": zone}},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}]}
        })
    };
    c.store()
        .create(NODES, "", node("n1", "a", "10.0.0.1"))
        .unwrap();
    // A host endpoint someone made by hand: never the controller's business.
    Client::new(kv.clone())
        .create(
            margay_api::decode_one(
                "apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata: {name: n1-eth0}
spec: {node: n1, interfaceName: eth0}",
            )
            .unwrap(),
        )
        .await
        .unwrap();

    let d = Daemon::start(daemon_options(
        c.kube_datastore(),
        DatastoreKind::Kubernetes,
        &[
            ("ENABLED_CONTROLLERS", "node"),
            ("AUTO_HOST_ENDPOINTS", "enabled"),
        ],
        c.dir.path(),
    ))
    .await
    .unwrap();

    let h = wait_for("n1-auto-hep", Duration::from_secs(30), || async {
        hep(&kv, "n1-auto-hep").await
    })
    .await;
    assert_eq!(h.spec.interface_name, "*");
    assert_eq!(h.spec.node, "n1");
    assert_eq!(
        h.spec.profiles,
        vec!["projectcalico-default-allow".to_string()]
    );
    assert!(
        h.spec.expected_ips.contains(&"10.0.0.1".to_string()),
        "{:?}",
        h.spec.expected_ips
    );
    assert_eq!(h.metadata.labels["zone"], "a");
    assert_eq!(
        h.metadata.labels["projectcalico.org/created-by"],
        "calico-kube-controllers"
    );

    // A new node, a label change, a deleted node.
    c.store()
        .create(NODES, "", node("n2", "b", "10.0.0.2"))
        .unwrap();
    wait_for("n2-auto-hep", Duration::from_secs(30), || async {
        hep(&kv, "n2-auto-hep").await
    })
    .await;
    let mut n2 = c.store().get(NODES, "", "n2").unwrap();
    n2["metadata"]["labels"]["zone"] = json!("c");
    c.store().update(NODES, "", n2).unwrap();
    wait_for("n2's new label", Duration::from_secs(30), || async {
        hep(&kv, "n2-auto-hep")
            .await
            .filter(|h| h.metadata.labels.get("zone").map(String::as_str) == Some("c"))
    })
    .await;
    c.delete_node("n1");
    wait_for("n1-auto-hep gone", Duration::from_secs(30), || async {
        hep(&kv, "n1-auto-hep").await.is_none().then_some(())
    })
    .await;
    assert!(
        hep(&kv, "n1-eth0").await.is_some(),
        "a hand-made host endpoint was deleted"
    );
    d.stop().await.unwrap();
}
