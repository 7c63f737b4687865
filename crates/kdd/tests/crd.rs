//! v3 resources ↔ `crd.projectcalico.org/v1` custom resources: round trips over every
//! CRD-backed document of margay-api's fixtures, the exact body Calico writes, and custom
//! resources as `kubectl get -o yaml` shows them in Calico clusters (tests/fixtures/crs: each
//! file holds the custom resource, then the v3 resource Calico reads from it).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use margay_api::meta::OwnerReference;
use margay_api::{Kind, Resource};
use margay_kdd::crd::{
    CALICO_CRDS, cr_to_resource, crd_by_kind, crd_by_plural, crd_for, resource_to_cr,
    set_resource_version,
};
use serde_json::{Value, json};

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn files(dir: &str) -> Vec<(String, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "json")
            )
        })
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Every resource of margay-api's documentation fixtures.
fn api_fixture_resources() -> Vec<(String, Resource)> {
    let mut out = Vec::new();
    for (name, text) in files("../api/tests/fixtures/docs") {
        for d in margay_api::decode_documents(&text).unwrap() {
            out.push((name.clone(), d.result.unwrap()));
        }
    }
    out
}

fn decode_v3(v: &Value) -> Resource {
    margay_api::codec::decode_value(v.clone()).unwrap()
}

#[test]
fn crd_table() {
    assert_eq!(CALICO_CRDS.len(), 22);
    let ipam = crd_for(Kind::IPAMConfiguration).unwrap();
    assert_eq!((ipam.kind, ipam.plural), ("IPAMConfig", "ipamconfigs"));
    assert_eq!(
        (ipam.v3_kind, ipam.v3_plural),
        ("IPAMConfiguration", "ipamconfigurations")
    );
    assert_eq!(ipam.crd_name(), "ipamconfigs.crd.projectcalico.org");
    for (kind, ns) in [
        ("NetworkPolicy", true),
        ("NetworkSet", true),
        ("StagedNetworkPolicy", true),
        ("StagedKubernetesNetworkPolicy", true),
        ("StagedGlobalNetworkPolicy", false),
        ("IPAMBlock", false),
        ("BlockAffinity", false),
        ("IPAMHandle", false),
        ("CalicoNodeStatus", false),
    ] {
        assert_eq!(crd_by_kind(kind).unwrap().namespaced, ns, "{kind}");
    }
    let with_status: Vec<&str> = CALICO_CRDS
        .iter()
        .filter(|c| c.has_status)
        .map(|c| c.plural)
        .collect();
    assert_eq!(
        with_status,
        [
            "caliconodestatuses",
            "ippools",
            "kubecontrollersconfigurations",
            "tiers"
        ]
    );
    for derived in [Kind::Node, Kind::WorkloadEndpoint, Kind::Profile] {
        assert!(crd_for(derived).is_none());
    }
    assert_eq!(crd_by_plural("ipamhandles").unwrap().kind, "IPAMHandle");
    let np = crd_for(Kind::NetworkPolicy).unwrap();
    assert_eq!(
        np.object_path("kube-system", "security.allow-dns"),
        "/apis/crd.projectcalico.org/v1/namespaces/kube-system/networkpolicies/security.allow-dns"
    );
    assert_eq!(
        np.collection_path(""),
        "/apis/crd.projectcalico.org/v1/networkpolicies"
    );
    assert_eq!(
        crd_for(Kind::IPPool).unwrap().object_path("x", "p"),
        "/apis/crd.projectcalico.org/v1/ippools/p"
    );
}

#[test]
fn every_crd_backed_fixture_round_trips() {
    let mut seen = std::collections::BTreeSet::new();
    for (file, r) in api_fixture_resources() {
        let Some(crd) = crd_for(r.kind()) else {
            assert!(
                resource_to_cr(&r).is_err(),
                "{file}: derived kinds have no CR"
            );
            continue;
        };
        seen.insert(r.kind());
        let cr = resource_to_cr(&r).unwrap();
        assert_eq!(cr["apiVersion"], "crd.projectcalico.org/v1", "{file}");
        assert_eq!(cr["kind"], crd.kind, "{file}");
        assert_eq!(cr["metadata"]["name"], r.name(), "{file}");
        let back = cr_to_resource(r.kind(), &cr).unwrap();
        assert_eq!(back, r, "{file}");

        // Again with everything metadata can hold.
        let mut rich = r.clone();
        let m = rich.metadata_mut();
        m.uid = "41cb1fde-57e7-42c1-a73b-0acaf38c7737".into();
        m.resource_version = "4711".into();
        m.creation_timestamp = Some("2024-05-02T09:14:31Z".into());
        m.generation = Some(3);
        m.labels.insert("app".into(), "web".into());
        m.labels
            .insert("projectcalico.org/tier".into(), "default".into());
        m.annotations
            .insert("note".into(), "kept in the annotation".into());
        m.annotations
            .insert("operator.tigera.io/owned".into(), "true".into());
        m.finalizers.push("example.com/cleanup".into());
        m.owner_references.push(OwnerReference {
            api_version: "projectcalico.org/v3".into(),
            kind: "Tier".into(),
            name: "default".into(),
            uid: "30316465-6365-4463-ad63-3564622d3638".into(),
            controller: Some(true),
            block_owner_deletion: None,
        });
        m.owner_references.push(OwnerReference {
            api_version: "v1".into(),
            kind: "Namespace".into(),
            name: "shop".into(),
            uid: "not-converted".into(),
            controller: None,
            block_owner_deletion: Some(false),
        });
        let cr = resource_to_cr(&rich).unwrap();
        let meta = &cr["metadata"];
        assert_eq!(
            meta["uid"], "82d3f87b-eae7-4283-a7dc-5053cf31eeec",
            "{file}"
        );
        assert_eq!(meta["resourceVersion"], "4711");
        // Only Calico's own labels and annotations sit on the custom resource.
        assert_eq!(meta["labels"], json!({"projectcalico.org/tier": "default"}));
        let ann = meta["annotations"].as_object().unwrap();
        assert_eq!(ann.len(), 2, "{file}: {ann:?}");
        assert_eq!(ann["operator.tigera.io/owned"], "true");
        let stored: Value =
            serde_json::from_str(ann["projectcalico.org/metadata"].as_str().unwrap()).unwrap();
        assert_eq!(
            stored["ownerReferences"][0]["apiVersion"],
            "crd.projectcalico.org/v1"
        );
        assert_eq!(
            stored["ownerReferences"][0]["uid"],
            "0c8c26a6-c6a6-44c6-adc6-ac2646b46c1c"
        );
        assert_eq!(stored["ownerReferences"][1]["uid"], "not-converted");
        for absent in ["namespace", "uid", "resourceVersion"] {
            assert!(stored.get(absent).is_none(), "{file}: {absent}");
        }
        let policy = matches!(r.kind(), Kind::NetworkPolicy | Kind::GlobalNetworkPolicy);
        assert_eq!(stored.get("name").is_some(), policy, "{file}");
        assert_eq!(cr_to_resource(r.kind(), &cr).unwrap(), rich, "{file}");
    }
    // The fixtures cover every CRD-backed kind.
    let all: std::collections::BTreeSet<Kind> = Kind::ALL
        .iter()
        .copied()
        .filter(|k| crd_for(*k).is_some())
        .collect();
    assert_eq!(seen, all);
}

#[test]
fn body_is_what_calico_writes() {
    let r = decode_v3(&json!({
        "apiVersion": "projectcalico.org/v3",
        "kind": "GlobalNetworkPolicy",
        "metadata": {
            "name": "allow-dns",
            "labels": {"projectcalico.org/tier": "default", "team": "net"},
            "creationTimestamp": "2025-01-02T03:04:05Z",
            "resourceVersion": "77"
        },
        "spec": {"tier": "default", "order": 100, "selector": "all()", "types": ["Egress"],
                 "egress": [{"action": "Allow", "protocol": "UDP", "destination": {"ports": [53]}}]}
    }));
    let cr = resource_to_cr(&r).unwrap();
    assert_eq!(
        cr,
        json!({
            "apiVersion": "crd.projectcalico.org/v1",
            "kind": "GlobalNetworkPolicy",
            "metadata": {
                "name": "allow-dns",
                "resourceVersion": "77",
                "labels": {"projectcalico.org/tier": "default"},
                "annotations": {
                    "projectcalico.org/metadata": "{\"name\":\"allow-dns\",\"creationTimestamp\":\"2025-01-02T03:04:05Z\",\"labels\":{\"projectcalico.org/tier\":\"default\",\"team\":\"net\"}}"
                }
            },
            "spec": {"tier": "default", "order": 100, "selector": "all()", "types": ["Egress"],
                     "egress": [{"action": "Allow", "protocol": "UDP", "destination": {"ports": [53]}}]}
        })
    );
    // Not a policy: no name in the annotation, and Go writes creationTimestamp null.
    let pool = decode_v3(&json!({
        "apiVersion": "projectcalico.org/v3", "kind": "IPPool",
        "metadata": {"name": "default-ipv4-ippool"},
        "spec": {"cidr": "192.168.0.0/16"},
        "status": {"conditions": [{"type": "Allocatable", "status": "True"}]}
    }));
    let cr = resource_to_cr(&pool).unwrap();
    assert_eq!(
        cr["metadata"],
        json!({"name": "default-ipv4-ippool",
               "annotations": {"projectcalico.org/metadata": "{\"creationTimestamp\":null}"}})
    );
    assert_eq!(cr["status"]["conditions"][0]["type"], "Allocatable");
    let ipam = decode_v3(&json!({
        "apiVersion": "projectcalico.org/v3", "kind": "IPAMConfiguration",
        "metadata": {"name": "default"}, "spec": {"strictAffinity": true, "maxBlocksPerHost": 4}
    }));
    let cr = resource_to_cr(&ipam).unwrap();
    assert_eq!(cr["kind"], "IPAMConfig");
    assert_eq!(
        cr["spec"],
        json!({"strictAffinity": true, "autoAllocateBlocks": true, "maxBlocksPerHost": 4})
    );
    let np = decode_v3(&json!({
        "apiVersion": "projectcalico.org/v3", "kind": "NetworkPolicy",
        "metadata": {"name": "security.allow-dns", "namespace": "kube-system"},
        "spec": {"tier": "security", "selector": "all()"}
    }));
    let cr = resource_to_cr(&np).unwrap();
    assert_eq!(cr["metadata"]["namespace"], "kube-system");
    assert_eq!(cr["metadata"]["name"], "security.allow-dns");
}

#[test]
fn bad_resources_are_refused_naming_the_field() {
    let mut r = decode_v3(&json!({
        "apiVersion": "projectcalico.org/v3", "kind": "IPPool",
        "metadata": {"name": "p", "uid": "abc"}, "spec": {"cidr": "10.0.0.0/16"}
    }));
    let err = resource_to_cr(&r).unwrap_err();
    assert_eq!(
        (err.object.as_str(), err.field.as_str()),
        ("IPPool \"p\"", "metadata.uid")
    );
    r.metadata_mut().uid.clear();
    r.metadata_mut().owner_references.push(OwnerReference {
        api_version: "projectcalico.org/v3".into(),
        uid: "zzz".into(),
        ..OwnerReference::default()
    });
    assert_eq!(
        resource_to_cr(&r).unwrap_err().field,
        "metadata.ownerReferences[0].uid"
    );
    let node = decode_v3(&json!({
        "apiVersion": "projectcalico.org/v3", "kind": "Node", "metadata": {"name": "n"}, "spec": {}
    }));
    assert_eq!(resource_to_cr(&node).unwrap_err().field, "kind");
    let np = decode_v3(&json!({
        "apiVersion": "projectcalico.org/v3", "kind": "NetworkPolicy",
        "metadata": {"name": "p"}, "spec": {}
    }));
    assert_eq!(resource_to_cr(&np).unwrap_err().field, "metadata.namespace");
}

#[test]
fn undecodable_custom_resources_name_object_and_field() {
    let cr = json!({
        "apiVersion": "crd.projectcalico.org/v1", "kind": "IPPool",
        "metadata": {"name": "pool-1", "resourceVersion": "9"},
        "spec": {"cidr": "10.0.0.0/16", "natOutgoing": "yes"}
    });
    let err = cr_to_resource(Kind::IPPool, &cr).unwrap_err();
    assert_eq!(err.object, "IPPool \"pool-1\"");
    assert_eq!(err.field, "spec.natOutgoing");
    assert!(
        err.to_string()
            .starts_with("IPPool \"pool-1\": spec.natOutgoing: "),
        "{err}"
    );

    let cr = json!({
        "apiVersion": "crd.projectcalico.org/v1", "kind": "IPPool",
        "metadata": {"name": "pool-1", "annotations": {"projectcalico.org/metadata": "{not json"}},
        "spec": {"cidr": "10.0.0.0/16"}
    });
    let err = cr_to_resource(Kind::IPPool, &cr).unwrap_err();
    assert_eq!(
        err.field,
        "metadata.annotations[\"projectcalico.org/metadata\"]"
    );

    let cr = json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "Tier",
                    "metadata": {"name": "x"}, "spec": {}});
    assert_eq!(cr_to_resource(Kind::IPPool, &cr).unwrap_err().field, "kind");
    let cr = json!({"apiVersion": "projectcalico.org/v3", "kind": "IPPool",
                    "metadata": {"name": "x"}, "spec": {}});
    assert_eq!(
        cr_to_resource(Kind::IPPool, &cr).unwrap_err().field,
        "apiVersion"
    );
    let cr = json!({"kind": "IPPool", "metadata": {"name": "x", "uid": "nope"}, "spec": {}});
    assert_eq!(
        cr_to_resource(Kind::IPPool, &cr).unwrap_err().field,
        "metadata.uid"
    );
    let cr = json!({"kind": "IPPool", "metadata": {"name": 7}, "spec": {}});
    assert_eq!(
        cr_to_resource(Kind::IPPool, &cr).unwrap_err().field,
        "metadata.name"
    );
    assert!(cr_to_resource(Kind::Profile, &json!({})).is_err());
}

#[test]
fn default_tier_prefix_is_dropped_only_for_default_tier_policies_without_a_stored_name() {
    let gnp = |name: &str, tier: Option<&str>, annotation: Option<&str>| {
        let mut spec = json!({"selector": "all()"});
        if let Some(t) = tier {
            spec["tier"] = json!(t);
        }
        let mut cr = json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "GlobalNetworkPolicy",
                            "metadata": {"name": name}, "spec": spec});
        if let Some(a) = annotation {
            cr["metadata"]["annotations"] = json!({"projectcalico.org/metadata": a});
        }
        cr_to_resource(Kind::GlobalNetworkPolicy, &cr)
            .unwrap()
            .name()
            .to_string()
    };
    let bare = Some(r#"{"creationTimestamp":null}"#);
    assert_eq!(gnp("default.allow-dns", Some("default"), bare), "allow-dns");
    assert_eq!(gnp("default.allow-dns", None, bare), "allow-dns");
    assert_eq!(
        gnp("default.allow-dns", Some("security"), bare),
        "default.allow-dns"
    );
    assert_eq!(
        gnp(
            "default.allow-dns",
            Some("default"),
            Some(r#"{"name":"default.allow-dns"}"#)
        ),
        "default.allow-dns"
    );
    // No annotation at all (applied with kubectl): the custom resource's own metadata.
    assert_eq!(
        gnp("default.allow-dns", Some("default"), None),
        "default.allow-dns"
    );
    // Other kinds never lose a prefix.
    let cr = json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "GlobalNetworkSet",
                    "metadata": {"name": "default.x", "annotations": {"projectcalico.org/metadata": "{}"}},
                    "spec": {}});
    assert_eq!(
        cr_to_resource(Kind::GlobalNetworkSet, &cr).unwrap().name(),
        "default.x"
    );
}

#[test]
fn custom_resources_from_calico_clusters() {
    let fixtures = files("tests/fixtures/crs");
    assert!(fixtures.len() >= 10);
    for (file, text) in fixtures {
        let docs = yaml_docs(&text);
        assert_eq!(
            docs.len(),
            2,
            "{file}: a custom resource, then the expected v3 resource"
        );
        let expected = decode_v3(&docs[1]);
        let got =
            cr_to_resource(expected.kind(), &docs[0]).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(got, expected, "{file}");
        // Written back, it reads the same (the annotation now holds all of the metadata).
        let again = cr_to_resource(expected.kind(), &resource_to_cr(&got).unwrap()).unwrap();
        assert_eq!(again, expected, "{file}");
    }
}

#[test]
fn resource_versions_are_set_for_updates() {
    let mut body = json!({"metadata": {"name": "x"}});
    set_resource_version(&mut body, "12");
    assert_eq!(
        body["metadata"],
        json!({"name": "x", "resourceVersion": "12"})
    );
    let mut bare = json!({});
    set_resource_version(&mut bare, "3");
    assert_eq!(bare, json!({"metadata": {"resourceVersion": "3"}}));
}
