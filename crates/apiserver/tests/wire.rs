//! Wire-level behaviour through a real HTTPS client: watch semantics, paging, discovery,
//! authentication, input bounds and injected faults.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{WatchReader, raw, raw_json};
use margay_apiserver::{FaultMatcher, Gvr, PatchType, ServerOptions};
use serde_json::{Value, json};

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
const SEC: Duration = Duration::from_secs(5);

fn rv_of(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn watch_from_zero_from_a_revision_and_expired() {
    let server = common::server(ServerOptions {
        event_history: 50,
        ..Default::default()
    });
    let s = server.store();
    let a = s
        .create(Gvr::core("pods"), "default", common::pod("a", json!({})))
        .unwrap();
    let c = common::kube_client(&server).await;

    // resourceVersion unset: synthetic ADDED for the current state first, then changes.
    let mut w = WatchReader::open(&c, "/api/v1/namespaces/default/pods?watch=true", None).await;
    assert_eq!(w.status, 200);
    let e = w.next(SEC).await.unwrap();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("a"))
    );
    assert_eq!(e["object"]["kind"], "Pod");
    s.create(Gvr::core("pods"), "default", common::pod("b", json!({})))
        .unwrap();
    let e = w.next(SEC).await.unwrap();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("b"))
    );
    let d = s.delete(Gvr::core("pods"), "default", "a").unwrap();
    let e = w.next(SEC).await.unwrap();
    assert_eq!(e["type"], "DELETED");
    assert_eq!(
        rv_of(&e["object"]),
        rv_of(&d),
        "a deletion has its own revision"
    );
    assert!(rv_of(&d) > rv_of(&a));
    assert_eq!(server.stats().watches("", "pods"), 1);

    // resourceVersion=N: exactly the events after N, in order, nothing synthetic.
    let mut w2 = WatchReader::open(
        &c,
        &format!("/api/v1/pods?watch=true&resourceVersion={}", rv_of(&a)),
        None,
    )
    .await;
    let e1 = w2.next(SEC).await.unwrap();
    let e2 = w2.next(SEC).await.unwrap();
    assert_eq!(
        (
            e1["type"].as_str(),
            e1["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("b"))
    );
    assert_eq!(
        (
            e2["type"].as_str(),
            e2["object"]["metadata"]["name"].as_str()
        ),
        (Some("DELETED"), Some("a"))
    );
    assert!(w2.next(Duration::from_millis(200)).await.is_none());

    // Older than the retained history: 200 with one ERROR event (410 Expired), then the end.
    for i in 0..60 {
        s.create(
            Gvr::core("configmaps"),
            "default",
            json!({"metadata": {"name": format!("c{i}")}}),
        )
        .unwrap();
    }
    let mut w3 = WatchReader::open(
        &c,
        &format!("/api/v1/pods?watch=true&resourceVersion={}", rv_of(&a)),
        None,
    )
    .await;
    assert_eq!(w3.status, 200);
    let e = w3.next(SEC).await.unwrap();
    assert_eq!(e["type"], "ERROR");
    assert_eq!(
        (e["object"]["code"].as_u64(), e["object"]["reason"].as_str()),
        (Some(410), Some("Expired"))
    );
    assert!(
        e["object"]["message"]
            .as_str()
            .unwrap()
            .starts_with("too old resource version: ")
    );
    assert!(w3.ended(SEC).await);
    // The same for a list page token or an Exact list from before the history.
    let (code, body) = raw_json(
        &c,
        "GET",
        &format!(
            "/api/v1/pods?resourceVersion={}&resourceVersionMatch=Exact",
            rv_of(&a)
        ),
        None,
        Value::Null,
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (410, Some("Expired")));

    // close_watches ends open streams cleanly.
    server.close_watches();
    assert!(w.ended(SEC).await);
    assert!(w2.ended(SEC).await);
    assert!(common::eventually(SEC, || server.stats().watches("", "pods") == 0).await);
}

#[tokio::test]
async fn watch_selectors_transitions_bookmarks_timeouts_and_tables() {
    let server = common::server(ServerOptions {
        bookmark_interval: Duration::from_millis(100),
        ..Default::default()
    });
    let s = server.store();
    s.create(
        Gvr::core("pods"),
        "default",
        common::pod("a", json!({"app": "web"})),
    )
    .unwrap();
    s.create(
        Gvr::core("pods"),
        "default",
        common::pod("b", json!({"app": "db"})),
    )
    .unwrap();
    let c = common::kube_client(&server).await;
    let mut w = WatchReader::open(
        &c,
        "/api/v1/namespaces/default/pods?watch=true&labelSelector=app%3Dweb&resourceVersion=0",
        None,
    )
    .await;
    assert_eq!(
        w.next(SEC).await.unwrap()["object"]["metadata"]["name"],
        "a"
    );
    // b starts matching → ADDED; a stops matching → DELETED; a non-matching change → nothing.
    s.patch(
        Gvr::core("pods"),
        "default",
        "b",
        PatchType::Merge,
        &json!({"metadata": {"labels": {"app": "web"}}}),
    )
    .unwrap();
    s.patch(
        Gvr::core("pods"),
        "default",
        "a",
        PatchType::Merge,
        &json!({"metadata": {"labels": {"app": "db"}}}),
    )
    .unwrap();
    s.patch(
        Gvr::core("pods"),
        "default",
        "a",
        PatchType::Merge,
        &json!({"metadata": {"labels": {"x": "1"}}}),
    )
    .unwrap();
    s.patch(
        Gvr::core("pods"),
        "default",
        "b",
        PatchType::Merge,
        &json!({"metadata": {"labels": {"x": "1"}}}),
    )
    .unwrap();
    let types: Vec<(String, String)> = [
        w.next(SEC).await.unwrap(),
        w.next(SEC).await.unwrap(),
        w.next(SEC).await.unwrap(),
    ]
    .iter()
    .map(|e| {
        (
            e["type"].as_str().unwrap().to_string(),
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        )
    })
    .collect();
    assert_eq!(
        types,
        [
            ("ADDED".into(), "b".into()),
            ("DELETED".into(), "a".into()),
            ("MODIFIED".into(), "b".into())
        ]
    );

    // Bookmarks only when asked for: a kind and only metadata.resourceVersion.
    assert!(
        w.next(Duration::from_millis(400)).await.is_none(),
        "no bookmarks unless allowed"
    );
    let mut wb = WatchReader::open(&c, "/api/v1/pods?watch=true&allowWatchBookmarks=true&resourceVersion=0&fieldSelector=metadata.name%3Dnone", None).await;
    let e = wb.next(SEC).await.unwrap();
    assert_eq!(e["type"], "BOOKMARK");
    assert_eq!(
        e["object"],
        json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": s.resource_version().to_string()}})
    );

    // timeoutSeconds ends the stream.
    let mut wt = WatchReader::open(&c, "/api/v1/pods?watch=true&timeoutSeconds=1", None).await;
    let start = std::time::Instant::now();
    assert!(wt.ended(SEC).await);
    assert!(start.elapsed() >= Duration::from_millis(900));

    // A Table watch carries one-row tables.
    let mut wtab = WatchReader::open(
        &c,
        "/api/v1/namespaces/default/pods?watch=true&fieldSelector=metadata.name%3Da",
        Some(TABLE),
    )
    .await;
    let e = wtab.next(SEC).await.unwrap();
    assert_eq!(e["object"]["kind"], "Table");
    assert_eq!(e["object"]["rows"].as_array().unwrap().len(), 1);
    assert_eq!(e["object"]["rows"][0]["cells"][0], "a");
    assert_eq!(
        e["object"]["rows"][0]["object"]["metadata"]["namespace"],
        "default"
    );

    // sendInitialEvents: the state, then a bookmark marking its end.
    let mut wi = WatchReader::open(&c, "/api/v1/pods?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan", None).await;
    assert_eq!(wi.next(SEC).await.unwrap()["type"], "ADDED");
    assert_eq!(wi.next(SEC).await.unwrap()["type"], "ADDED");
    let e = wi.next(SEC).await.unwrap();
    assert_eq!(e["type"], "BOOKMARK");
    assert_eq!(
        e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
}

#[tokio::test]
async fn a_slow_watcher_is_cut_off_not_buffered() {
    let server = common::server(ServerOptions {
        event_history: 500,
        ..Default::default()
    });
    let s = server.store();
    let c = common::kube_client(&server).await;
    let mut w = WatchReader::open(&c, "/api/v1/configmaps?watch=true", None).await;
    // Far more than the history holds and more than socket buffers take, while not reading.
    let big = "x".repeat(2000);
    let total = 8000;
    for chunk in 0..(total / 500) {
        s.create_many(
            Gvr::core("configmaps"),
            "default",
            (0..500).map(
                |i| json!({"metadata": {"name": format!("c{chunk}-{i}")}, "data": {"k": big}}),
            ),
        )
        .unwrap();
    }
    let mut got = 0;
    while w.next(SEC).await.is_some() {
        got += 1;
    }
    assert!(
        got < total,
        "the watcher was closed once behind the history (got {got} of {total})"
    );
    assert!(w.ended(SEC).await);
}

#[tokio::test]
async fn paging_with_continue_tokens() {
    let server = common::server(ServerOptions::default());
    let s = server.store();
    s.create_many(
        Gvr::core("pods"),
        "default",
        (0..25).map(|i| {
            common::pod(
                &format!("p{i:02}"),
                json!({"even": (i % 2 == 0).to_string()}),
            )
        }),
    )
    .unwrap();
    let c = common::kube_client(&server).await;
    let (code, first) = raw_json(&c, "GET", "/api/v1/pods?limit=10", None, Value::Null).await;
    assert_eq!(code, 200);
    assert_eq!(
        (first["kind"].as_str(), first["apiVersion"].as_str()),
        (Some("PodList"), Some("v1"))
    );
    assert_eq!(first["items"].as_array().unwrap().len(), 10);
    assert_eq!(first["metadata"]["remainingItemCount"], 15);
    let list_rv = first["metadata"]["resourceVersion"].clone();
    s.create(Gvr::core("pods"), "default", common::pod("p99", json!({})))
        .unwrap();
    let mut names: Vec<String> = vec![];
    let mut page = first;
    for _ in 0..10 {
        names.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["metadata"]["name"].as_str().unwrap().to_string()),
        );
        assert_eq!(
            page["metadata"]["resourceVersion"], list_rv,
            "every page reads the first page's revision"
        );
        let Some(tok) = page["metadata"]["continue"].as_str() else {
            break;
        };
        let (code, next) = raw_json(
            &c,
            "GET",
            &format!("/api/v1/pods?limit=10&continue={tok}"),
            None,
            Value::Null,
        )
        .await;
        assert_eq!(code, 200);
        page = next;
    }
    assert_eq!(
        names,
        (0..25).map(|i| format!("p{i:02}")).collect::<Vec<_>>()
    );
    // Selectors with paging.
    let (_, p) = raw_json(
        &c,
        "GET",
        "/api/v1/namespaces/default/pods?limit=5&labelSelector=even%3Dtrue",
        None,
        Value::Null,
    )
    .await;
    assert_eq!(p["items"].as_array().unwrap().len(), 5);
    assert!(p["metadata"]["continue"].is_string());
    // A token from before a compaction is expired; a garbled one is a bad request.
    let (_, p) = raw_json(&c, "GET", "/api/v1/pods?limit=5", None, Value::Null).await;
    s.create(Gvr::core("pods"), "default", common::pod("p100", json!({})))
        .unwrap();
    server.compact();
    let tok = p["metadata"]["continue"].as_str().unwrap();
    let (code, e) = raw_json(
        &c,
        "GET",
        &format!("/api/v1/pods?limit=5&continue={tok}"),
        None,
        Value::Null,
    )
    .await;
    assert_eq!((code, e["reason"].as_str()), (410, Some("Expired")));
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .starts_with("The provided continue parameter is too old")
    );
    let (code, e) = raw_json(
        &c,
        "GET",
        "/api/v1/pods?limit=5&continue=garbage",
        None,
        Value::Null,
    )
    .await;
    assert_eq!((code, e["reason"].as_str()), (400, Some("BadRequest")));
    // A Table list.
    let (code, ct, body) = raw(
        &c,
        "GET",
        "/api/v1/namespaces/default/pods?limit=3",
        None,
        Some(TABLE),
        vec![],
    )
    .await;
    assert_eq!(code, 200);
    assert!(ct.starts_with("application/json"));
    let t: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["rows"].as_array().unwrap().len(), 3);
    assert!(t["metadata"]["continue"].is_string());
    // deletecollection with a selector.
    let (code, _) = raw_json(
        &c,
        "DELETE",
        "/api/v1/namespaces/default/pods?labelSelector=even%3Dtrue",
        None,
        Value::Null,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        s.list(Gvr::core("pods"), Some("default"), "even=true")
            .unwrap()
            .len(),
        0
    );
    assert_eq!(
        s.list(Gvr::core("pods"), Some("default"), "even=false")
            .unwrap()
            .len(),
        12
    );
}

#[tokio::test]
async fn discovery_and_openapi() {
    let server = common::calico_server();
    let c = common::kube_client(&server).await;
    let agg = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
    let (code, ct, body) = raw(&c, "GET", "/apis", None, Some(agg), vec![]).await;
    assert_eq!(code, 200);
    assert_eq!(
        ct,
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    );
    let v: Value = serde_json::from_slice(&body).unwrap();
    let groups: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        groups,
        [
            "apps",
            "networking.k8s.io",
            "policy",
            "rbac.authorization.k8s.io",
            "discovery.k8s.io",
            "coordination.k8s.io",
            "apiextensions.k8s.io",
            "crd.projectcalico.org"
        ]
    );
    // A client that knows only v2beta1 gets the legacy form.
    let (_, ct, body) = raw(&c, "GET", "/apis", None, Some("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"), vec![]).await;
    assert_eq!(ct, "application/json");
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["kind"],
        "APIGroupList"
    );
    let (_, v1) = raw_json(&c, "GET", "/api/v1", None, Value::Null).await;
    let pods = v1["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "pods")
        .unwrap();
    assert_eq!(pods["shortNames"], json!(["po"]));
    assert!(
        v1["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "pods/status")
    );
    let (_, cal) = raw_json(
        &c,
        "GET",
        "/apis/crd.projectcalico.org/v1",
        None,
        Value::Null,
    )
    .await;
    assert_eq!(
        cal["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| !r["name"].as_str().unwrap().contains('/'))
            .count(),
        22
    );
    let (_, ver) = raw_json(&c, "GET", "/version", None, Value::Null).await;
    assert_eq!(
        (ver["major"].as_str(), ver["minor"].as_str()),
        (Some("1"), Some("32"))
    );
    let (_, idx) = raw_json(&c, "GET", "/openapi/v3", None, Value::Null).await;
    let url = idx["paths"]["apis/crd.projectcalico.org/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, doc) = raw_json(&c, "GET", &url, None, Value::Null).await;
    assert_eq!(code, 200);
    assert_eq!(
        doc["paths"]["/apis/crd.projectcalico.org/v1/namespaces/{namespace}/networkpolicies/{name}"]
            ["patch"]["x-kubernetes-group-version-kind"]["kind"],
        "NetworkPolicy"
    );
    // The CRDs are real objects.
    let (_, crds) = raw_json(
        &c,
        "GET",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        None,
        Value::Null,
    )
    .await;
    assert_eq!(crds["items"].as_array().unwrap().len(), 22);
    // Unknown paths are 404 Status objects.
    let (code, e) = raw_json(&c, "GET", "/apis/nope.io/v1/things", None, Value::Null).await;
    assert_eq!((code, e["kind"].as_str()), (404, Some("Status")));
}

#[tokio::test]
async fn authentication_and_plain_http() {
    let server = common::server(ServerOptions::default());
    let bad = common::kube_client_with_token(&server, "not-the-token").await;
    let (code, e) = raw_json(&bad, "GET", "/api/v1/pods", None, Value::Null).await;
    assert_eq!(code, 401);
    assert_eq!(
        e,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
    );
    let plain = common::server(ServerOptions {
        tls: false,
        ..Default::default()
    });
    assert!(plain.url().starts_with("http://127.0.0.1:"));
    let c = common::kube_client(&plain).await;
    let (code, _) = raw_json(&c, "GET", "/api/v1/namespaces", None, Value::Null).await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn bounded_inputs_and_clear_errors() {
    let server = common::calico_server();
    let c = common::kube_client(&server).await;
    let (code, _, e) = raw(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some("application/json"),
        None,
        b"{not json".to_vec(),
    )
    .await;
    assert_eq!(code, 400);
    let e: Value = serde_json::from_slice(&e).unwrap();
    assert!(e["message"].as_str().unwrap().contains("JSON"), "{e}");
    let huge = json!({"metadata": {"name": "big"}, "data": {"k": "x".repeat(4 * 1024 * 1024)}});
    let (code, e) = raw_json(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some("application/json"),
        huge,
    )
    .await;
    assert_eq!(
        (code, e["reason"].as_str()),
        (413, Some("RequestEntityTooLarge"))
    );
    let long = format!("/api/v1/pods?labelSelector={}", "a".repeat(40_000));
    let (code, _, _) = raw(&c, "GET", &long, None, None, vec![]).await;
    assert!(code == 414 || code == 431 || code == 400, "{code}");
    let (code, e) = raw_json(
        &c,
        "GET",
        "/api/v1/pods?labelSelector=a%20in%20(",
        None,
        Value::Null,
    )
    .await;
    assert_eq!((code, e["reason"].as_str()), (400, Some("BadRequest")));
    server
        .store()
        .create(
            Gvr::calico("ippools"),
            "",
            json!({"metadata": {"name": "p"}, "spec": {}}),
        )
        .unwrap();
    let (code, e) = raw_json(
        &c,
        "PATCH",
        "/apis/crd.projectcalico.org/v1/ippools/p",
        Some("text/plain"),
        json!({}),
    )
    .await;
    assert_eq!(
        (code, e["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
    let (code, e) = raw_json(
        &c,
        "PATCH",
        "/apis/crd.projectcalico.org/v1/ippools/p",
        Some("application/strategic-merge-patch+json"),
        json!({}),
    )
    .await;
    assert_eq!(
        (code, e["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
    let (code, e) = raw_json(&c, "PUT", "/apis/crd.projectcalico.org/v1/ippools/p", Some("application/json"), json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "IPPool", "metadata": {"name": "q"}})).await;
    assert_eq!(
        (code, e["message"].as_str()),
        (
            400,
            Some("the name of the object (q) does not match the name on the URL (p)")
        )
    );
    let (code, e) = raw_json(&c, "POST", "/api/v1/namespaces/default/pods", Some("application/json"), json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "Bad_Name"}, "spec": {"containers": [{"name": "c", "image": "i"}]}})).await;
    assert_eq!((code, e["reason"].as_str()), (422, Some("Invalid")));
    let (code, _) = raw_json(
        &c,
        "POST",
        "/api/v1/namespaces/default/pods/x",
        Some("application/json"),
        json!({}),
    )
    .await;
    assert_eq!(code, 405);
    // generateName.
    let (code, o) = raw_json(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some("application/json"),
        json!({"metadata": {"generateName": "gen-"}}),
    )
    .await;
    assert_eq!(code, 201);
    let name = o["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    // dryRun=All writes nothing.
    let rv = server.store().resource_version();
    let (code, _) = raw_json(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps?dryRun=All",
        Some("application/json"),
        json!({"metadata": {"name": "dry"}}),
    )
    .await;
    assert_eq!(code, 201);
    assert_eq!(server.store().resource_version(), rv);
    assert_eq!(
        server
            .store()
            .get(Gvr::core("configmaps"), "default", "dry")
            .unwrap_err()
            .code,
        404
    );
}

#[tokio::test]
async fn injected_faults() {
    let server = common::server(ServerOptions::default());
    let c = common::kube_client(&server).await;
    // 429 carries Retry-After; kube-rs retries it by itself and then succeeds.
    server.fail_next(FaultMatcher::any().verb("list").resource("pods"), 429, 2);
    let (code, _, _) = raw(&c, "GET", "/api/v1/pods", None, None, vec![]).await;
    assert_eq!(code, 200);
    assert_eq!(
        server.stats().request_count("list", "", "pods"),
        3,
        "two 429s, then the retry that worked"
    );
    server.fail_next(FaultMatcher::any().verb("list").resource("nodes"), 500, 1);
    let (code, h, body) = raw(&c, "GET", "/api/v1/nodes", None, None, vec![]).await;
    assert_eq!(code, 500);
    assert!(h.starts_with("application/json"));
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["reason"],
        "InternalError"
    );
    assert_eq!(
        raw(&c, "GET", "/api/v1/nodes", None, None, vec![]).await.0,
        200
    );
    server.fail_next(FaultMatcher::any().verb("watch"), 410, 1);
    let mut w = WatchReader::open(&c, "/api/v1/pods?watch=true&resourceVersion=1", None).await;
    let e = w.next(SEC).await.unwrap();
    assert_eq!(
        (e["type"].as_str(), e["object"]["code"].as_u64()),
        (Some("ERROR"), Some(410))
    );
    server.fail_next(
        FaultMatcher::any().verb("create").namespace("default"),
        500,
        1,
    );
    let (code, e) = raw_json(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some("application/json"),
        json!({"metadata": {"name": "x"}}),
    )
    .await;
    assert_eq!((code, e["reason"].as_str()), (500, Some("InternalError")));
    let st = server.stats();
    assert_eq!(st.request_count("list", "", "pods"), 3);
    assert_eq!(st.request_count("create", "", "configmaps"), 1);
}

#[tokio::test]
async fn hostile_requests_get_statuses_and_the_server_survives() {
    let server = common::calico_server();
    let s = server.store();
    s.create(Gvr::core("pods"), "default", common::pod("p", json!({})))
        .unwrap();
    s.create(
        Gvr::calico("ippools"),
        "",
        json!({"metadata": {"name": "pool"}, "spec": {}}),
    )
    .unwrap();
    let c = common::kube_client(&server).await;
    let paths = [
        "/api/v1/namespaces/default/pods/p",
        "/api/v1/namespaces/default/pods/p/status",
        "/api/v1/namespaces/default/pods",
        "/apis/crd.projectcalico.org/v1/ippools/pool",
        "/apis/crd.projectcalico.org/v1/ippools/pool/status",
        "/api/v1/namespaces/default",
        "/api/v1/namespaces/%zz/pods/%00",
        "/api/v1/namespaces//pods",
        "/api/v1/pods/p",
        "/apis/crd.projectcalico.org/v1/namespaces/default/ippools",
        "/api/v1/namespaces/default/pods/p/status/extra/more",
        "/api/v1/watch/namespaces/default/pods?resourceVersion=-1",
        "/api/v1/pods?limit=-5&continue=%FF%FE",
        "/api/v1/pods?resourceVersion=99999999999999999999",
        "/api/v1/pods?resourceVersionMatch=Exact&resourceVersion=0",
        "/api/v1/pods?fieldSelector=%5C",
        "/api/v1/pods?labelSelector=a%20notin%20()",
        "/api/v1/pods?watch=true&timeoutSeconds=abc&resourceVersion=18446744073709551615",
        "/openapi/v3/apis/x",
        "/apis/a/b/c/d/e/f/g/h",
    ];
    let bodies: [&[u8]; 9] = [
        b"",
        b"null",
        b"[]",
        b"{\"metadata\": 5}",
        b"{\"metadata\": {\"name\": [1], \"labels\": {\"a\": 1}, \"annotations\": [\"x\"]}}",
        b"{\"kind\": 7, \"apiVersion\": {}}",
        b"[{\"op\": \"move\", \"from\": \"/metadata\", \"path\": \"/metadata/x\"}, {\"op\": \"add\", \"path\": \"/spec/containers/99\", \"value\": 1}]",
        b"{\"spec\": {\"containers\": [{\"$patch\": \"delete\"}], \"$setElementOrder/containers\": 5, \"$retainKeys\": {}}}",
        b"\xff\xfe\x00garbage",
    ];
    let cts = [
        "application/json",
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
        "application/yaml",
        "application/vnd.kubernetes.protobuf",
    ];
    let mut n = 0;
    for path in paths {
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
            for body in bodies {
                for ct in cts {
                    if method == "GET" && (ct != "application/json" || !body.is_empty()) {
                        continue;
                    }
                    let fut = raw(&c, method, path, Some(ct), None, body.to_vec());
                    let (code, rct, b) = tokio::time::timeout(Duration::from_secs(10), fut)
                        .await
                        .unwrap();
                    n += 1;
                    if code >= 400 {
                        let v: Value = serde_json::from_slice(&b)
                            .unwrap_or_else(|_| panic!("{method} {path}: {code} body is not JSON"));
                        assert_eq!(v["kind"], "Status", "{method} {path} {ct}: {v}");
                        assert!(rct.starts_with("application/json"));
                    }
                }
            }
        }
    }
    assert!(n > 1000, "{n} requests");
    // Still serving, and the state is still sane.
    let (code, list) = raw_json(&c, "GET", "/api/v1/namespaces", None, Value::Null).await;
    assert_eq!(code, 200);
    assert!(list["items"].as_array().unwrap().len() >= 3);
}
