#![allow(clippy::unwrap_used)]
use super::*;

fn pod(name: &str, labels: Value) -> Value {
    json!({"metadata": {"name": name, "labels": labels}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
}

fn opts() -> WriteOpts {
    WriteOpts::default()
}

#[test]
fn one_revision_per_write_and_history_positions() {
    let mut s = State::new(100, false);
    let start = s.rv;
    let a = s
        .create("/pods", "default", pod("a", json!({})), &opts())
        .unwrap();
    assert_eq!(a.rv, start + 1);
    assert_eq!(
        meta_str(&a.value, "resourceVersion"),
        (start + 1).to_string()
    );
    let b = s
        .create("/pods", "default", pod("b", json!({})), &opts())
        .unwrap();
    assert_eq!(b.rv, start + 2);
    let (evs, next) = s
        .events_since("/pods", &s.resources["/pods"].def.clone(), start + 1, 100)
        .unwrap();
    assert_eq!(evs.len(), 2);
    assert_eq!(next, start + 3);
    // A no-op update writes nothing.
    let same = s
        .update(
            "/pods",
            "default",
            "a",
            a.value.clone(),
            Sub::Main,
            &opts(),
            false,
        )
        .unwrap();
    assert_eq!(same.rv, a.rv);
    assert_eq!(s.rv, start + 2);
}

#[test]
fn history_bound_and_compaction_expire_old_revisions() {
    let mut s = State::new(3, false);
    let def = s.resources["/pods"].def.clone();
    for i in 0..5 {
        s.create(
            "/pods",
            "default",
            pod(&format!("p{i}"), json!({})),
            &opts(),
        )
        .unwrap();
    }
    assert_eq!(s.history.len(), 3);
    assert_eq!(s.floor, s.rv - 3);
    assert!(
        s.events_since("/pods", &def, s.floor, 10).is_none(),
        "needs the event at floor, which is gone"
    );
    assert_eq!(
        s.events_since("/pods", &def, s.floor + 1, 10)
            .unwrap()
            .0
            .len(),
        3
    );
    let err = s
        .watch_start("/pods", Some(s.floor - 1), false, &|_, _| true)
        .err()
        .unwrap();
    assert_eq!((err.code, err.reason), (410, "Expired"));
    assert!(
        s.watch_start("/pods", Some(s.floor), false, &|_, _| true)
            .is_ok()
    );
    s.compact();
    assert!(
        s.watch_start("/pods", Some(s.rv - 1), false, &|_, _| true)
            .is_err()
    );
    assert!(
        s.watch_start("/pods", Some(s.rv), false, &|_, _| true)
            .is_ok()
    );
}

#[test]
fn continue_tokens_read_a_consistent_snapshot() {
    let mut s = State::new(1000, false);
    for i in 0..10 {
        s.create(
            "/pods",
            "default",
            pod(&format!("p{i}"), json!({})),
            &opts(),
        )
        .unwrap();
    }
    let q = ListQuery {
        limit: Some(4),
        ..Default::default()
    };
    let r1 = s.list("/pods", &q).unwrap();
    assert_eq!(r1.items.len(), 4);
    assert_eq!(r1.remaining, Some(6));
    // Changes after the first page do not show in later pages.
    s.delete("/pods", "default", "p5", &DeleteOpts::default())
        .unwrap();
    s.create("/pods", "default", pod("p99", json!({})), &opts())
        .unwrap();
    let mut p7 = s.get("/pods", "default", "p7").unwrap().value.clone();
    p7["metadata"]["labels"] = json!({"x": "y"});
    s.update("/pods", "default", "p7", p7, Sub::Main, &opts(), false)
        .unwrap();
    let mut names = vec![];
    let mut tok = r1.cont.clone();
    names.extend(r1.items.iter().map(|o| name_of(&o.value).to_string()));
    while let Some(t) = tok {
        let r = s
            .list(
                "/pods",
                &ListQuery {
                    limit: Some(4),
                    cont: Some(t),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(r.rv, r1.rv);
        for o in &r.items {
            if name_of(&o.value) == "p7" {
                assert!(
                    o.value["metadata"]
                        .get("labels")
                        .is_none_or(|l| l.get("x").is_none())
                );
            }
        }
        names.extend(r.items.iter().map(|o| name_of(&o.value).to_string()));
        tok = r.cont;
    }
    assert_eq!(names, (0..10).map(|i| format!("p{i}")).collect::<Vec<_>>());
    // Compaction expires the token.
    let r = s.list("/pods", &q).unwrap();
    s.create("/pods", "default", pod("late", json!({})), &opts())
        .unwrap();
    s.compact();
    let err = s
        .list(
            "/pods",
            &ListQuery {
                limit: Some(4),
                cont: r.cont,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!((err.code, err.reason), (410, "Expired"));
}

#[test]
fn namespaces_and_preconditions() {
    let mut s = State::new(100, false);
    let e = s
        .create("/pods", "nope", pod("a", json!({})), &opts())
        .unwrap_err();
    assert_eq!(e.message, "namespaces \"nope\" not found");
    let a = s
        .create("/pods", "default", pod("a", json!({})), &opts())
        .unwrap();
    let e = s
        .create("/pods", "default", pod("a", json!({})), &opts())
        .unwrap_err();
    assert_eq!(e.reason, "AlreadyExists");
    let e = s
        .delete(
            "/pods",
            "default",
            "a",
            &DeleteOpts {
                uid: Some("x".into()),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        e.message
            .contains("Precondition failed: UID in precondition: x, UID in object meta: "),
        "{}",
        e.message
    );
    let e = s
        .delete(
            "/pods",
            "default",
            "a",
            &DeleteOpts {
                rv: Some("1".into()),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        e.message
            .contains("Precondition failed: ResourceVersion in precondition: 1"),
        "{}",
        e.message
    );
    let mut stale = a.value.clone();
    s.patch(
        "/pods",
        "default",
        "a",
        PatchType::Merge,
        &json!({"metadata": {"labels": {"x": "1"}}}),
        Sub::Main,
        &opts(),
    )
    .unwrap();
    stale["metadata"]["labels"] = json!({"y": "2"});
    let e = s
        .update("/pods", "default", "a", stale, Sub::Main, &opts(), false)
        .unwrap_err();
    assert_eq!(e.reason, "Conflict");
    let e = s
        .patch(
            "/pods",
            "default",
            "a",
            PatchType::Merge,
            &json!({"metadata": {"resourceVersion": "1"}}),
            Sub::Main,
            &opts(),
        )
        .unwrap_err();
    assert_eq!(e.reason, "Conflict");
    // Deleting the namespace deletes the pod.
    s.delete("/namespaces", "", "default", &DeleteOpts::default())
        .unwrap();
    assert_eq!(s.get("/pods", "default", "a").unwrap_err().code, 404);
}

#[test]
fn finalizers_delay_deletion() {
    let mut s = State::new(100, false);
    s.create(
        "/configmaps",
        "default",
        json!({"metadata": {"name": "c", "finalizers": ["x/y"]}}),
        &opts(),
    )
    .unwrap();
    let d = s
        .delete("/configmaps", "default", "c", &DeleteOpts::default())
        .unwrap();
    assert!(d.value["metadata"]["deletionTimestamp"].is_string());
    assert!(s.get("/configmaps", "default", "c").is_ok());
    s.patch(
        "/configmaps",
        "default",
        "c",
        PatchType::Merge,
        &json!({"metadata": {"finalizers": null}}),
        Sub::Main,
        &opts(),
    )
    .unwrap();
    assert_eq!(s.get("/configmaps", "default", "c").unwrap_err().code, 404);
    assert_eq!(s.history.back().unwrap().etype, EventType::Deleted);
}

#[test]
fn crds_serve_and_unserve_resources() {
    let mut s = State::new(100, false);
    for c in crate::resources::calico_crds() {
        s.create(
            "apiextensions.k8s.io/customresourcedefinitions",
            "",
            c,
            &opts(),
        )
        .unwrap();
    }
    let key = gr_key("crd.projectcalico.org", "ippools");
    s.create(
        &key,
        "",
        json!({"metadata": {"name": "p"}, "spec": {"cidr": "10.0.0.0/16"}, "status": {"x": 1}}),
        &opts(),
    )
    .unwrap();
    let p = s.get(&key, "", "p").unwrap();
    assert!(
        p.value.get("status").is_none(),
        "status is dropped on create with a status subresource"
    );
    assert_eq!(p.value["metadata"]["generation"], 1);
    // A CR update without resourceVersion is refused.
    let mut v = p.value.clone();
    v["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    assert_eq!(
        s.update(&key, "", "p", v, Sub::Main, &opts(), false)
            .unwrap_err()
            .code,
        422
    );
    // Strategic merge patch is refused for custom resources.
    let e = s
        .patch(
            &key,
            "",
            "p",
            PatchType::Strategic,
            &json!({}),
            Sub::Main,
            &opts(),
        )
        .unwrap_err();
    assert_eq!(e.code, 415);
    // Status writes change only status.
    let mut v = p.value.clone();
    v["spec"]["cidr"] = json!("1.0.0.0/8");
    v["status"] = json!({"conditions": []});
    let u = s
        .update(&key, "", "p", v, Sub::Status, &opts(), false)
        .unwrap();
    assert_eq!(u.value["spec"]["cidr"], "10.0.0.0/16");
    assert_eq!(u.value["status"], json!({"conditions": []}));
    assert_eq!(u.value["metadata"]["generation"], 1);
    s.delete(
        "apiextensions.k8s.io/customresourcedefinitions",
        "",
        "ippools.crd.projectcalico.org",
        &DeleteOpts::default(),
    )
    .unwrap();
    assert!(s.lookup("crd.projectcalico.org", "v1", "ippools").is_err());
}

#[test]
fn crd_deletion_delivers_its_objects_deletions_then_ends_watches() {
    let mut s = State::new(100, false);
    let crds = "apiextensions.k8s.io/customresourcedefinitions";
    s.create(
        crds,
        "",
        crate::resources::calico_crds().remove(13),
        &opts(),
    )
    .unwrap();
    let key = gr_key("crd.projectcalico.org", "ippools");
    s.create(
        &key,
        "",
        json!({"metadata": {"name": "a"}, "spec": {}}),
        &opts(),
    )
    .unwrap();
    let def = s.resources[&key].def.clone();
    let from = s.rv + 1;
    s.delete(
        crds,
        "",
        "ippools.crd.projectcalico.org",
        &DeleteOpts::default(),
    )
    .unwrap();
    let (evs, next) = s.events_since(&key, &def, from, 100).unwrap();
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].etype, EventType::Deleted);
    assert!(
        s.events_since(&key, &def, next, 100).is_none(),
        "then the watch ends"
    );
}

#[test]
fn node_status_keeps_metadata_and_spec() {
    let mut s = State::new(100, false);
    s.create(
        "/nodes",
        "",
        json!({"metadata": {"name": "n"}, "spec": {"podCIDR": "10.0.0.0/24"}}),
        &opts(),
    )
    .unwrap();
    let (n, _) = s
            .patch(
                "/nodes",
                "",
                "n",
                PatchType::Strategic,
                &json!({"metadata": {"annotations": {"projectcalico.org/IPv4Address": "10.0.0.5/24"}}, "spec": {"podCIDR": "x"}, "status": {"conditions": [{"type": "NetworkUnavailable", "status": "False"}]}}),
                Sub::Status,
                &opts(),
            )
            .unwrap();
    assert_eq!(
        n.value["metadata"]["annotations"]["projectcalico.org/IPv4Address"],
        "10.0.0.5/24"
    );
    assert_eq!(n.value["spec"]["podCIDR"], "10.0.0.0/24");
    assert_eq!(n.value["status"]["conditions"][0]["status"], "False");
}
