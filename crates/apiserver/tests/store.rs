//! The HTTP-free store handle, fixture loading, the standalone entry point, status
//! subresources as Calico uses them, and graceful pod deletion.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use margay_apiserver::{ApiServer, Gvr, PatchType, ServerOptions, run_until};
use serde_json::json;

const FIXTURE: &str = "
apiVersion: example.com/v1
kind: Gadget
metadata:
  name: g1
  namespace: lab
spec: {size: 2}
---
apiVersion: v1
kind: Namespace
metadata:
  name: lab
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: a, namespace: lab}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: b, namespace: lab}
";

#[test]
fn load_fixtures_crds_first() {
    let server = common::server(ServerOptions::default());
    let s = server.store();
    // The Gadget comes before its namespace and its CRD in the text.
    assert_eq!(s.load(FIXTURE).unwrap(), 5);
    assert_eq!(
        s.get(Gvr::new("example.com", "v1", "gadgets"), "lab", "g1")
            .unwrap()["spec"]["size"],
        2
    );
    assert_eq!(
        s.list(Gvr::core("configmaps"), Some("lab"), "")
            .unwrap()
            .len(),
        2
    );
    let err = s
        .load("apiVersion: nope/v1\nkind: Thing\nmetadata: {name: x}\n")
        .unwrap_err();
    assert!(
        err.to_string().contains("no resource serves nope/v1 Thing"),
        "{err}"
    );
}

#[test]
fn store_handle_semantics() {
    let server = common::calico_server();
    let s = server.store();
    let rv0 = s.resource_version();
    let p = s
        .create(
            Gvr::calico("ippools"),
            "ignored-for-cluster-scope",
            json!({"metadata": {"name": "p"}, "spec": {"cidr": "10.0.0.0/16"}}),
        )
        .unwrap();
    assert_eq!(s.resource_version(), rv0 + 1);
    assert!(p["metadata"].get("namespace").is_none());
    let mut stale = p.clone();
    s.patch(
        Gvr::calico("ippools"),
        "",
        "p",
        PatchType::Merge,
        &json!({"spec": {"disabled": true}}),
    )
    .unwrap();
    stale["spec"]["blockSize"] = json!(26);
    assert_eq!(
        s.update(Gvr::calico("ippools"), "", stale)
            .unwrap_err()
            .code,
        409
    );
    // Status of a custom resource with a status subresource.
    let cur = s.get(Gvr::calico("ippools"), "", "p").unwrap();
    let mut st = cur.clone();
    st["status"] = json!({"conditions": [{"type": "Allocatable", "status": "True"}]});
    st["spec"]["cidr"] = json!("1.0.0.0/8");
    let after = s.update_status(Gvr::calico("ippools"), "", st).unwrap();
    assert_eq!(after["spec"]["cidr"], "10.0.0.0/16");
    assert_eq!(after["status"]["conditions"][0]["type"], "Allocatable");
    // No-op writes do not move the revision.
    let rv = s.resource_version();
    s.patch(
        Gvr::calico("ippools"),
        "",
        "p",
        PatchType::Merge,
        &json!({"spec": {"disabled": true}}),
    )
    .unwrap();
    assert_eq!(s.resource_version(), rv);
    assert_eq!(
        s.get(Gvr::new("crd.projectcalico.org", "v2", "ippools"), "", "p")
            .unwrap_err()
            .code,
        404
    );
    s.delete(Gvr::calico("ippools"), "", "p").unwrap();
    assert_eq!(
        s.get(Gvr::calico("ippools"), "", "p").unwrap_err().code,
        404
    );
    assert_eq!(
        server.stats().objects,
        s.list(Gvr::core("namespaces"), None, "").unwrap().len() + 22
    );
}

#[test]
fn run_until_serves_until_shutdown() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (url_tx, url_rx) = std::sync::mpsc::channel();
    let kc2 = kc.clone();
    rt.block_on(async move {
        let serve = run_until(
            ServerOptions::default(),
            move |s: &ApiServer| {
                s.write_kubeconfig(&kc2).unwrap();
                s.store().load("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: fixture, namespace: default}\n")?;
                url_tx.send(s.url()).unwrap();
                Ok(())
            },
            async move {
                let _ = rx.await;
            },
        );
        let check = async move {
            let text = std::fs::read_to_string(&kc).unwrap();
            let cfg = kube::Config::from_custom_kubeconfig(kube::config::Kubeconfig::from_yaml(&text).unwrap(), &Default::default()).await.unwrap();
            let client = kube::Client::try_from(cfg).unwrap();
            let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client, "default");
            assert!(cms.get("fixture").await.is_ok());
            tx.send(()).unwrap();
        };
        let (r, ()) = tokio::join!(serve, check);
        r.unwrap();
    });
    // The port is closed once run_until returned.
    let url = url_rx.recv().unwrap();
    let addr = url.trim_start_matches("https://");
    assert!(
        std::net::TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_millis(500))
            .is_err()
    );
}

#[tokio::test]
async fn calico_status_writes_keep_metadata_and_spec() {
    let server = common::server(ServerOptions::default());
    let client = common::kube_client(&server).await;
    // The CNI plugin's pod annotations go through pods/<n>/status (strategic merge).
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut p: Pod = serde_json::from_value(common::pod("web", json!({"app": "web"}))).unwrap();
    p.spec.as_mut().unwrap().node_name = Some("n1".into());
    let created = pods.create(&PostParams::default(), &p).await.unwrap();
    assert_eq!(
        created.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    let patched = pods
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"annotations": {"cni.projectcalico.org/podIP": "10.244.0.5/32"}, "uid": created.metadata.uid}, "spec": {"nodeName": "other"}, "status": {"podIP": "10.244.0.5"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.metadata.annotations.unwrap()["cni.projectcalico.org/podIP"],
        "10.244.0.5/32"
    );
    assert_eq!(
        patched.spec.unwrap().node_name.as_deref(),
        Some("n1"),
        "status writes never change the spec"
    );
    assert_eq!(
        patched.status.unwrap().pod_ip.as_deref(),
        Some("10.244.0.5")
    );
    // A stale UID in the patch is a conflict naming it.
    let e = pods
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"uid": "nope"}})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 409 && s.message.contains("UID in precondition: nope")),
        "{e:?}"
    );
    // calico-node's Node update: PUT nodes/<n>/status with the fresh revision.
    let nodes: Api<Node> = Api::all(client);
    let mut n = Node::default();
    n.metadata.name = Some("n1".into());
    nodes.create(&PostParams::default(), &n).await.unwrap();
    let mut live = nodes.get("n1").await.unwrap();
    live.metadata.annotations = Some(
        [(
            "projectcalico.org/IPv4Address".to_string(),
            "10.0.0.5/24".to_string(),
        )]
        .into(),
    );
    let put = nodes
        .replace_status("n1", &PostParams::default(), &live)
        .await
        .unwrap();
    assert_eq!(
        put.metadata.annotations.unwrap()["projectcalico.org/IPv4Address"],
        "10.0.0.5/24"
    );
    let e = nodes
        .replace_status("n1", &PostParams::default(), &live)
        .await
        .unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 409 && s.reason == "Conflict"),
        "{e:?}"
    );
}

#[tokio::test]
async fn graceful_pod_deletion_when_asked_for() {
    let server = common::server(ServerOptions {
        graceful_pod_deletion: true,
        ..Default::default()
    });
    let client = common::kube_client(&server).await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(common::pod("p", json!({}))).unwrap(),
    )
    .await
    .unwrap();
    pods.delete("p", &DeleteParams::default()).await.unwrap();
    let p = pods.get("p").await.unwrap();
    assert!(p.metadata.deletion_timestamp.is_some());
    assert_eq!(p.metadata.deletion_grace_period_seconds, Some(30));
    pods.delete(
        "p",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(pods.get_opt("p").await.unwrap().is_none());
    // Without the option pods go at once.
    let server = common::server(ServerOptions::default());
    let pods: Api<Pod> = Api::namespaced(common::kube_client(&server).await, "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(common::pod("p", json!({}))).unwrap(),
    )
    .await
    .unwrap();
    pods.delete("p", &DeleteParams::default()).await.unwrap();
    assert!(pods.get_opt("p").await.unwrap().is_none());
}
