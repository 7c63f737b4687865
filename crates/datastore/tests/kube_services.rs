//! Services and EndpointSlices watched for the service proxy, against margay's API-server
//! double: the initial listing ends in InSync, changes and deletions follow in order, and a
//! compaction (410 Gone) re-lists without spurious deletes.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use margay_apiserver::{ApiServer, Gvr, ServerOptions};
use margay_datastore::KubeSettings;
use margay_datastore::kube::KubeBackend;
use margay_datastore::kube::services::{ServiceEvent, ServiceObjectKind, watch_services};
use serde_json::{Value, json};
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(20);
const SERVICES: Gvr = Gvr::core("services");
const SLICES: Gvr = Gvr::new("discovery.k8s.io", "v1", "endpointslices");

fn service(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"clusterIP": "10.96.0.20", "ports": [{"port": 80}]}})
}

fn slice(name: &str, ip: &str) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": name, "namespace": "default",
                        "labels": {"kubernetes.io/service-name": "web"}},
           "addressType": "IPv4",
           "endpoints": [{"addresses": [ip]}],
           "ports": [{"name": "", "protocol": "TCP", "port": 8080}]})
}

async fn next(rx: &mut mpsc::Receiver<Vec<ServiceEvent>>) -> Vec<ServiceEvent> {
    tokio::time::timeout(T, rx.recv()).await.unwrap().unwrap()
}

/// (kind, name, present) of the updates until (and without) `until` holds.
async fn collect(
    rx: &mut mpsc::Receiver<Vec<ServiceEvent>>,
    until: impl Fn(&[(ServiceObjectKind, String, bool)]) -> bool,
) -> Vec<(ServiceObjectKind, String, bool)> {
    let mut out = Vec::new();
    while !until(&out) {
        for ev in next(rx).await {
            if let ServiceEvent::Update {
                kind, name, object, ..
            } = ev
            {
                out.push((kind, name, object.is_some()));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_and_slices_are_listed_watched_and_relisted() {
    let api = ApiServer::start(ServerOptions::default()).unwrap();
    api.store()
        .create(SERVICES, "default", service("web"))
        .unwrap();
    api.store()
        .create(SLICES, "default", slice("web-1", "10.65.0.1"))
        .unwrap();
    let backend = KubeBackend::connect(&KubeSettings {
        kubeconfig_inline: Some(api.kubeconfig_yaml()),
        ..KubeSettings::default()
    })
    .await
    .unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let task = tokio::spawn(watch_services(backend.api().clone(), tx));

    // The listing, then InSync.
    let mut listed = Vec::new();
    loop {
        let batch = next(&mut rx).await;
        if batch.contains(&ServiceEvent::InSync) {
            break;
        }
        listed.extend(batch);
    }
    let mut names: Vec<String> = listed
        .iter()
        .filter_map(|e| match e {
            ServiceEvent::Update {
                name,
                object: Some(o),
                ..
            } => {
                assert_eq!(o["metadata"]["namespace"], "default");
                Some(name.clone())
            }
            _ => None,
        })
        .collect();
    names.sort();
    assert_eq!(names, vec!["web", "web-1"]);

    // A change and a deletion arrive as they happen.
    let mut s = api.store().get(SLICES, "default", "web-1").unwrap();
    s["endpoints"][0]["addresses"][0] = json!("10.65.0.2");
    api.store().update(SLICES, "default", s).unwrap();
    api.store().delete(SERVICES, "default", "web").unwrap();
    // (The two resources are watched separately: no order between them.)
    let mut got = collect(&mut rx, |v| v.len() >= 2).await;
    got.sort();
    assert_eq!(
        got,
        vec![
            (ServiceObjectKind::Service, "web".into(), false),
            (ServiceObjectKind::EndpointSlice, "web-1".into(), true),
        ]
    );

    // History compacted and the watches closed while a slice is added: the re-list sends
    // the new slice only (nothing unchanged again, no spurious delete).
    api.compact();
    api.store()
        .create(SLICES, "default", slice("web-2", "10.65.0.3"))
        .unwrap();
    api.compact();
    api.close_watches();
    let got = collect(&mut rx, |v| !v.is_empty()).await;
    assert_eq!(
        got,
        vec![(ServiceObjectKind::EndpointSlice, "web-2".into(), true)]
    );

    // The consumer gone, the watch ends at once (not at the server's watch timeout).
    drop(rx);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}
