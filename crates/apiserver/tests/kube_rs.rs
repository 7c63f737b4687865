//! kube-rs against the double: a reflector over pods stays equal to the server through writes,
//! compaction (410 → relist), closed watches and a restart; DynamicObject CRUD on a Calico CRD
//! with conflicts.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use margay_apiserver::{FaultMatcher, Gvr, PatchType, ServerOptions};
use serde_json::json;

/// name → resourceVersion of every pod the server holds.
fn server_pods(s: &margay_apiserver::StoreHandle) -> BTreeMap<String, String> {
    s.list(Gvr::core("pods"), None, "")
        .unwrap()
        .into_iter()
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap().to_string(),
                p["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect()
}

fn cached_pods(r: &reflector::Store<Pod>) -> BTreeMap<String, String> {
    r.state()
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap(),
                p.metadata.resource_version.clone().unwrap(),
            )
        })
        .collect()
}

async fn converges(s: &margay_apiserver::StoreHandle, r: &reflector::Store<Pod>, what: &str) {
    let ok = common::eventually(Duration::from_secs(30), || cached_pods(r) == server_pods(s)).await;
    assert!(
        ok,
        "{what}: reflector {:?} != server {:?}",
        cached_pods(r),
        server_pods(s)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflector_follows_writes_compaction_closed_watches_and_restart() {
    // Long bookmark interval: the watcher's revision then only moves with pod events, so a
    // compaction after writes to other resources leaves it behind (410 on re-watch).
    let server = common::server(ServerOptions {
        bookmark_interval: Duration::from_secs(3600),
        ..Default::default()
    });
    let s = server.store();
    for i in 0..30 {
        s.create(
            Gvr::core("pods"),
            "default",
            common::pod(&format!("p{i}"), json!({"i": i.to_string()})),
        )
        .unwrap();
    }
    let client = common::kube_client(&server).await;
    let api: Api<Pod> = Api::all(client.clone());
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(api, watcher::Config::default().page_size(7)),
    );
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream.applied_objects());
        while stream.next().await.is_some() {}
    });
    reader.wait_until_ready().await.unwrap();
    converges(&s, &reader, "initial paged list").await;
    // The watch follows the list; give it a moment to be open, then it must be the only one.
    assert!(
        common::eventually(Duration::from_secs(10), || server
            .stats()
            .watches("", "pods")
            == 1)
        .await
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.stats().watches("", "pods"), 1, "exactly one watch");
    assert!(
        server.stats().request_count("list", "", "pods") >= 5,
        "30 pods in pages of 7"
    );

    // Creates, updates, deletes.
    s.create(Gvr::core("pods"), "default", common::pod("new", json!({})))
        .unwrap();
    s.patch(
        Gvr::core("pods"),
        "default",
        "p3",
        PatchType::Merge,
        &json!({"metadata": {"labels": {"x": "y"}}}),
    )
    .unwrap();
    s.delete(Gvr::core("pods"), "default", "p4").unwrap();
    converges(&s, &reader, "after writes").await;

    // Compaction: while the watcher is cut off (server stopped), the store moves on and is
    // compacted. Its re-watch from its last pod revision gets 410 Expired and it lists again.
    let lists_before = server.stats().request_count("list", "", "pods");
    server.stop();
    for i in 0..5 {
        s.create(
            Gvr::core("configmaps"),
            "default",
            json!({"metadata": {"name": format!("cm{i}")}}),
        )
        .unwrap();
    }
    s.delete(Gvr::core("pods"), "default", "p5").unwrap();
    s.create(
        Gvr::core("pods"),
        "default",
        common::pod("after-compaction", json!({})),
    )
    .unwrap();
    server.compact();
    server.start_again().unwrap();
    converges(&s, &reader, "after compaction").await;
    assert!(
        server.stats().request_count("list", "", "pods") > lists_before,
        "410 made the watcher relist"
    );

    // A closed watch alone: re-watch from the last revision, no relist needed.
    let watches_before = server.stats().request_count("watch", "", "pods");
    server.close_watches();
    s.delete(Gvr::core("pods"), "default", "p6").unwrap();
    converges(&s, &reader, "after closed watches").await;
    assert!(
        common::eventually(Duration::from_secs(10), || server
            .stats()
            .request_count("watch", "", "pods")
            > watches_before)
        .await,
        "the closed watch was re-opened"
    );

    // Restart on the same port with state kept: the client reconnects and catches up.
    let rv_before = s.resource_version();
    server.stop();
    s.delete(Gvr::core("pods"), "default", "p7").unwrap();
    s.create(
        Gvr::core("pods"),
        "default",
        common::pod("while-down", json!({})),
    )
    .unwrap();
    server.start_again().unwrap();
    assert!(s.resource_version() > rv_before, "revisions survive");
    converges(&s, &reader, "after restart").await;
    assert!(
        common::eventually(Duration::from_secs(10), || server
            .stats()
            .watches("", "pods")
            == 1)
        .await
    );

    // An injected 500 on the next watch is survived too.
    server.fail_next(FaultMatcher::any().verb("watch").resource("pods"), 500, 1);
    server.close_watches();
    s.delete(Gvr::core("pods"), "default", "p8").unwrap();
    converges(&s, &reader, "after an injected 500").await;
    task.abort();
}

#[tokio::test]
async fn typed_api_crud_from_a_current_thread_runtime() {
    let server = common::server(ServerOptions::default());
    let client = common::kube_client(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("c1".into());
    cm.data = Some([("k".to_string(), "v".to_string())].into());
    let created = cms.create(&PostParams::default(), &cm).await.unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    let got = cms.get("c1").await.unwrap();
    assert_eq!(got.data.unwrap()["k"], "v");
    let e = cms.create(&PostParams::default(), &cm).await.unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{e:?}"
    );
    let e = cms.get("nope").await.unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 404 && s.message == "configmaps \"nope\" not found"),
        "{e:?}"
    );
    // Strategic merge and apply through kube's Patch types.
    cms.patch(
        "c1",
        &PatchParams::default(),
        &Patch::Strategic(json!({"data": {"k2": "v2"}})),
    )
    .await
    .unwrap();
    cms.patch("c1", &PatchParams::apply("test").force(), &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1"}, "data": {"k3": "v3"}})))
        .await
        .unwrap();
    let got = cms.get("c1").await.unwrap();
    assert_eq!(got.data.unwrap().len(), 3);
    // Server-side apply creates.
    cms.patch(
        "c2",
        &PatchParams::apply("test"),
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c2"}})),
    )
    .await
    .unwrap();
    let names: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.metadata.name.unwrap())
        .collect();
    assert_eq!(names, ["c1", "c2"]);
    // Metadata-only lists and gets (PartialObjectMetadata), as metadata informers use.
    let metas = cms.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(
        metas
            .items
            .iter()
            .map(|m| m.metadata.name.clone().unwrap())
            .collect::<Vec<_>>(),
        ["c1", "c2"]
    );
    assert!(metas.metadata.resource_version.is_some());
    assert_eq!(
        cms.get_metadata("c1")
            .await
            .unwrap()
            .metadata
            .name
            .as_deref(),
        Some("c1")
    );
    let lp = ListParams::default().fields("metadata.name=c2");
    assert_eq!(cms.list(&lp).await.unwrap().items.len(), 1);
    let e = cms
        .list(&ListParams::default().fields("data.k=v"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 400 && s.message == "field label not supported: data.k"),
        "{e:?}"
    );
    cms.delete("c2", &DeleteParams::default()).await.unwrap();
    assert!(cms.get_opt("c2").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_calico_crud_with_conflicts() {
    let server = common::calico_server();
    let client = common::kube_client(&server).await;
    let gvk = GroupVersionKind::gvk("crd.projectcalico.org", "v1", "IPPool");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "ippools");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let mut pool = DynamicObject::new("pool-a", &ar)
        .data(json!({"spec": {"cidr": "10.0.0.0/16", "blockSize": 26}}));
    pool.metadata.labels = Some([("tier".to_string(), "a".to_string())].into());
    let created = api.create(&PostParams::default(), &pool).await.unwrap();
    let rv1 = created.metadata.resource_version.clone().unwrap();

    // A replace with the read revision wins; a second one with the same (stale) one is a 409.
    let mut upd = created.clone();
    upd.data["spec"]["blockSize"] = json!(28);
    let updated = api
        .replace("pool-a", &PostParams::default(), &upd)
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version.as_deref(),
        Some(rv1.as_str())
    );
    let e = api
        .replace("pool-a", &PostParams::default(), &upd)
        .await
        .unwrap_err();
    match e {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
            assert_eq!(
                s.message,
                "Operation cannot be fulfilled on ippools.crd.projectcalico.org \"pool-a\": the object has been modified; please apply your changes to the latest version and try again"
            );
        }
        other => panic!("{other:?}"),
    }
    // A merge patch carrying a stale resourceVersion is a compare-and-swap that fails.
    let e = api
        .patch(
            "pool-a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"resourceVersion": rv1}, "spec": {"disabled": true}}),
            ),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 409),
        "{e:?}"
    );
    let cur = updated.metadata.resource_version.clone().unwrap();
    api.patch(
        "pool-a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"resourceVersion": cur}, "spec": {"disabled": true}})),
    )
    .await
    .unwrap();
    // Status is a subresource for IPPool: spec writes through it are ignored.
    let live = api.get("pool-a").await.unwrap();
    let st = api
        .patch_status("pool-a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"cidr": "1.0.0.0/8"}, "status": {"conditions": [{"type": "Allocatable"}]}})))
        .await
        .unwrap();
    assert_eq!(st.data["spec"]["cidr"], "10.0.0.0/16");
    assert_eq!(st.data["status"]["conditions"][0]["type"], "Allocatable");
    assert_eq!(
        st.metadata.generation, live.metadata.generation,
        "status writes do not bump generation"
    );
    // Label selectors.
    api.create(
        &PostParams::default(),
        &DynamicObject::new("pool-b", &ar).data(json!({"spec": {"cidr": "10.1.0.0/16"}})),
    )
    .await
    .unwrap();
    assert_eq!(
        api.list(&ListParams::default().labels("tier=a"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        api.list(&ListParams::default().labels("!tier"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );
    // Delete with a UID precondition (Calico's delete): wrong UID is a 409 naming it.
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("0000".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let e = api.delete("pool-a", &dp).await.unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 409 && s.message.contains("Precondition failed: UID in precondition: 0000")),
        "{e:?}"
    );
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: live.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    api.delete("pool-a", &dp).await.unwrap();
    assert!(api.get_opt("pool-a").await.unwrap().is_none());
    // Namespaced Calico kind in a missing namespace.
    let npr = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("crd.projectcalico.org", "v1", "NetworkPolicy"),
        "networkpolicies",
    );
    let nps: Api<DynamicObject> = Api::namespaced_with(client, "ghost", &npr);
    let e = nps
        .create(
            &PostParams::default(),
            &DynamicObject::new("np", &npr).data(json!({"spec": {}})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 404 && s.message == "namespaces \"ghost\" not found"),
        "{e:?}"
    );
}
