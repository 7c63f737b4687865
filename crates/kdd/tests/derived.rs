//! Profiles from Namespaces and ServiceAccounts, Nodes from Kubernetes Nodes (and back as a
//! patch), NetworkPolicies from networking.k8s.io/v1 NetworkPolicies: objects as
//! `kubectl get -o json` shows them (tests/fixtures/k8s, each with its `.expected.yaml`) and
//! table tests of each rule.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use margay_api::{Kind, Resource};
use margay_kdd::netpol::k8s_network_policy_to_calico;
use margay_kdd::node::*;
use margay_kdd::profile::*;
use serde_json::{Value, json};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/k8s")
}

fn load(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join(name)).unwrap()).unwrap()
}

fn expected(name: &str) -> Resource {
    margay_api::decode_one(&std::fs::read_to_string(dir().join(name)).unwrap()).unwrap()
}

#[test]
fn kubectl_objects_convert_to_the_expected_resources() {
    type Convert = fn(&Value) -> margay_kdd::Result<Resource>;
    let cases: [(&str, Convert); 4] = [
        ("namespace-shop", namespace_to_profile),
        ("serviceaccount-cart-api", service_account_to_profile),
        ("node-kind-worker", k8s_node_to_calico),
        ("networkpolicy-allow-frontend", k8s_network_policy_to_calico),
    ];
    for (stem, convert) in cases {
        let got = convert(&load(&format!("{stem}.json"))).unwrap();
        assert_eq!(got, expected(&format!("{stem}.expected.yaml")), "{stem}");
        got.validate().unwrap_or_else(|e| panic!("{stem}: {e}"));
    }
}

#[test]
fn namespace_profiles() {
    let p = namespace_to_profile(&json!({"metadata": {"name": "dev", "resourceVersion": "7"}}))
        .unwrap();
    let Resource::Profile(p) = p else {
        unreachable!()
    };
    assert_eq!(p.metadata.name, "kns.dev");
    assert_eq!(p.metadata.resource_version, "7");
    assert_eq!(p.metadata.uid, "");
    assert_eq!(
        p.spec.labels_to_apply.into_iter().collect::<Vec<_>>(),
        [("pcns.projectcalico.org/name".to_string(), "dev".to_string())]
    );
    // Calico's converted uid (conversion_test.go's pair).
    let p = namespace_to_profile(
        &json!({"metadata": {"name": "dev", "uid": "30316465-6365-4463-ad63-3564622d3638"}}),
    )
    .unwrap();
    assert_eq!(p.metadata().uid, "0c8c26a6-c6a6-44c6-adc6-ac2646b46c1c");
    let err = namespace_to_profile(&json!({"metadata": {"name": "dev", "uid": "x"}})).unwrap_err();
    assert_eq!(
        (err.object.as_str(), err.field.as_str()),
        ("Namespace \"dev\"", "metadata.uid")
    );
    assert_eq!(
        namespace_to_profile(&json!({"metadata": {}}))
            .unwrap_err()
            .field,
        "metadata.name"
    );
    assert_eq!(
        namespace_to_profile(&json!({"metadata": {"name": "a", "labels": {"x": 1}}}))
            .unwrap_err()
            .field,
        "metadata.labels.x"
    );
}

#[test]
fn service_account_profiles() {
    let p =
        service_account_to_profile(&json!({"metadata": {"name": "builder.v2", "namespace": "ci"}}))
            .unwrap();
    let Resource::Profile(p) = p else {
        unreachable!()
    };
    assert_eq!(p.metadata.name, "ksa.ci.builder.v2");
    assert!(p.spec.ingress.is_empty() && p.spec.egress.is_empty());
    assert_eq!(
        p.spec.labels_to_apply["pcsa.projectcalico.org/name"],
        "builder.v2"
    );
    // No namespace: Calico's "default".
    let p = service_account_to_profile(&json!({"metadata": {"name": "x"}})).unwrap();
    assert_eq!(p.name(), "ksa.default.x");
}

#[test]
fn default_allow() {
    let Resource::Profile(p) = default_allow_profile() else {
        unreachable!()
    };
    assert_eq!(p.metadata.name, "projectcalico-default-allow");
    assert_eq!(p.metadata.resource_version, "1");
    assert_eq!(p.spec.ingress.len(), 1);
    assert_eq!(p.spec.egress.len(), 1);
    Resource::Profile(p).validate().unwrap();
}

#[test]
fn profile_sources() {
    assert_eq!(
        profile_source("kns.shop"),
        Some(ProfileSource::Namespace("shop"))
    );
    assert_eq!(
        profile_source("ksa.shop.cart.api"),
        Some(ProfileSource::ServiceAccount {
            namespace: "shop",
            name: "cart.api"
        })
    );
    assert_eq!(
        profile_source("projectcalico-default-allow"),
        Some(ProfileSource::DefaultAllow)
    );
    for none in ["kns.", "ksa.shop", "ksa..x", "ksa.shop.", "other"] {
        assert_eq!(profile_source(none), None, "{none}");
    }
}

fn node(annotations: Value, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": "n1", "resourceVersion": "5", "annotations": annotations, "labels": labels},
           "spec": {"podCIDR": "10.244.3.0/24"}})
}

fn calico(v: &Value) -> margay_api::Node {
    match k8s_node_to_calico(v).unwrap() {
        Resource::Node(n) => n,
        _ => unreachable!(),
    }
}

#[test]
fn node_annotations_are_validated_one_by_one() {
    for (key, value, kept) in [
        (ANNOTATION_IPV4_ADDRESS, "10.0.0.5/24", true),
        (ANNOTATION_IPV4_ADDRESS, "10.0.0.5", true),
        (ANNOTATION_IPV4_ADDRESS, "fd00::5/64", false),
        (ANNOTATION_IPV6_ADDRESS, "fd00::5/64", true),
        (ANNOTATION_IPV6_ADDRESS, "10.0.0.5/24", false),
        (ANNOTATION_IPV4_IPIP_TUNNEL_ADDR, "10.0.0.1", true),
        (ANNOTATION_IPV4_IPIP_TUNNEL_ADDR, "10.0.0.1/24", false),
        (ANNOTATION_RR_CLUSTER_ID, "244.0.0.1", true),
        (ANNOTATION_RR_CLUSTER_ID, "cluster-1", false),
        (ANNOTATION_IPV4_VXLAN_TUNNEL_ADDR, "10.0.0.2", true),
        (ANNOTATION_IPV4_VXLAN_TUNNEL_ADDR, "fd00::2", false),
        (ANNOTATION_IPV6_VXLAN_TUNNEL_ADDR, "fd00::2", true),
        (ANNOTATION_VXLAN_TUNNEL_MAC, "66:7e:2b:a4:3f:01", true),
        (ANNOTATION_VXLAN_TUNNEL_MAC, "66-7E-2B-A4-3F-01", true),
        (ANNOTATION_VXLAN_TUNNEL_MAC, "667e.2ba4.3f01", true),
        (ANNOTATION_VXLAN_TUNNEL_MAC, "66:7e:2b:a4:3f", false),
        (
            ANNOTATION_VXLAN_TUNNEL_MAC_V6,
            "66:7e:2b:a4:3f:01:02:03",
            true,
        ),
        (ANNOTATION_IPV4_WIREGUARD_ADDR, "10.0.0.3", true),
        (ANNOTATION_IPV6_WIREGUARD_ADDR, "fd00::3", true),
        (ANNOTATION_IPV6_WIREGUARD_ADDR, "10.0.0.3", false),
        (ANNOTATION_AS_NUMBER, "64512", true),
        (ANNOTATION_AS_NUMBER, "1.10", true),
        (ANNOTATION_AS_NUMBER, "AS64512", false),
    ] {
        let n = calico(&node(json!({key: value}), json!({})));
        // Written back, a kept value stays under its annotation; an ignored one is removed.
        let patch = calico_node_patch(
            &Resource::Node(n.clone()),
            &node(json!({key: value}), json!({})),
        )
        .unwrap();
        let change = patch["metadata"]
            .get("annotations")
            .and_then(|a| a.get(key));
        if kept {
            // (Dotted AS numbers come back as plain numbers, as Calico writes them.)
            if value != "1.10" {
                assert_eq!(change, None, "{key}={value} should be kept as is");
            }
            Resource::Node(n)
                .validate()
                .unwrap_or_else(|e| panic!("{key}={value}: {e}"));
        } else {
            assert_eq!(
                change,
                Some(&Value::Null),
                "{key}={value} should be ignored"
            );
        }
    }
    let n = calico(&node(json!({ANNOTATION_AS_NUMBER: "1.10"}), json!({})));
    assert_eq!(n.spec.bgp.unwrap().as_number.unwrap().0, 65536 + 10);
}

#[test]
fn node_defaults() {
    let n = calico(&json!({"metadata": {"name": "bare"}}));
    assert_eq!(n.spec.bgp, None);
    assert_eq!(n.spec.wireguard, None);
    assert_eq!(n.status, None);
    assert_eq!(n.spec.orch_refs[0].node_name, "bare");
    assert_eq!(n.spec.orch_refs[0].orchestrator, "k8s");
    // No Kubernetes labels: Go marshals the nil map as null.
    assert_eq!(n.metadata.annotations[ANNOTATION_KUBE_LABELS], "null");
    let n = calico(&node(json!({}), json!({})));
    assert_eq!(n.metadata.annotations[ANNOTATION_KUBE_LABELS], "{}");
    // A labels annotation that is not a JSON map is ignored, as in Calico.
    let n = calico(&node(
        json!({ANNOTATION_LABELS: "[1]", ANNOTATION_INTERFACES: "{"}),
        json!({"a": "b"}),
    ));
    assert_eq!(n.metadata.labels.len(), 1);
    assert!(n.spec.interfaces.is_empty());
    assert!(k8s_node_to_calico(&json!({"metadata": {}})).is_err());
}

#[test]
fn host_local_ipam_tunnel_address() {
    let n = match k8s_node_to_calico_with(
        &node(
            json!({ANNOTATION_IPV4_IPIP_TUNNEL_ADDR: "10.9.9.9"}),
            json!({}),
        ),
        true,
    )
    .unwrap()
    {
        Resource::Node(n) => n,
        _ => unreachable!(),
    };
    assert_eq!(n.spec.bgp.unwrap().ipv4_ipip_tunnel_addr, "10.244.3.1");
    assert_eq!(n.spec.wireguard, None);
    let with_key = node(
        json!({ANNOTATION_WIREGUARD_PUBLIC_KEY: "jlkVyQYooZYzI2wFfNhSZez5eWh44yfq1wKVjLvSXgY="}),
        json!({}),
    );
    let Resource::Node(n) = k8s_node_to_calico_with(&with_key, true).unwrap() else {
        unreachable!()
    };
    assert_eq!(
        n.spec.wireguard.unwrap().interface_ipv4_address,
        "10.244.3.1"
    );
    let mut v6 = node(json!({}), json!({}));
    v6["spec"]["podCIDR"] = json!("fd00:10:244:3::/64");
    let Resource::Node(n) = k8s_node_to_calico_with(&v6, true).unwrap() else {
        unreachable!()
    };
    assert_eq!(n.spec.bgp, None);
    let mut bad = node(json!({}), json!({}));
    bad["spec"]["podCIDR"] = json!("10.244.3.0");
    assert_eq!(
        k8s_node_to_calico_with(&bad, true).unwrap_err().field,
        "spec.podCIDR"
    );
    // Without USE_POD_CIDR the annotation is used.
    assert_eq!(calico(&bad).spec.bgp, None);
}

#[test]
fn node_patches_write_only_calico_annotations() {
    let live = load("node-kind-worker.json");
    let n = k8s_node_to_calico(&live).unwrap();
    // Read and written back unchanged, as Calico does it: what was ignored on read (invalid
    // values, the shadowed Calico label, the interface address that is not an IP) is cleaned
    // up; compare-and-swap on the revision read.
    assert_eq!(
        calico_node_patch(&n, &live).unwrap(),
        json!({"metadata": {
            "annotations": {
                "projectcalico.org/IPv6VXLANTunnelAddr": null,
                "projectcalico.org/VXLANTunnelMACAddrV6": null,
                "projectcalico.org/Interfaces": "[{\"name\":\"eth0\",\"addresses\":[\"172.18.0.3\",\"fc00:f853:ccd:e793::3\"]},{\"name\":\"vxlan.calico\",\"addresses\":[\"192.168.82.131\"]}]",
                "projectcalico.org/labels": "{\"rack\":\"r1\"}"
            },
            "resourceVersion": "20455"
        }})
    );
    // Once cleaned up, there is nothing left to change.
    let mut clean = live.clone();
    for (k, v) in calico_node_patch(&n, &live).unwrap()["metadata"]["annotations"]
        .as_object()
        .unwrap()
    {
        let a = clean["metadata"]["annotations"].as_object_mut().unwrap();
        if v.is_null() {
            a.remove(k);
        } else {
            a.insert(k.clone(), v.clone());
        }
    }
    let n = k8s_node_to_calico(&clean).unwrap();
    assert_eq!(
        calico_node_patch(&n, &clean).unwrap(),
        json!({"metadata": {"resourceVersion": "20455"}})
    );

    let Resource::Node(mut changed) = n else {
        unreachable!()
    };
    let bgp = changed.spec.bgp.as_mut().unwrap();
    bgp.ipv4_address = "172.18.0.4/16".into();
    bgp.route_reflector_cluster_id.clear();
    changed.spec.wireguard = None;
    changed.status = None;
    changed.spec.ipv6_vxlan_tunnel_addr = "fd00::1".into();
    changed.metadata.labels.insert("rack".into(), "r2".into());
    // A new value for a Kubernetes label cannot be written (it is shadowed).
    changed
        .metadata
        .labels
        .insert("kubernetes.io/os".into(), "plan9".into());
    changed
        .metadata
        .annotations
        .remove("ops.example.com/contact");
    changed.metadata.resource_version.clear();
    let mut live_now = live.clone();
    live_now["metadata"]["resourceVersion"] = json!("20460");
    let patch = calico_node_patch(&Resource::Node(changed), &live_now).unwrap();
    assert_eq!(
        patch,
        json!({"metadata": {
            "annotations": {
                "projectcalico.org/IPv4Address": "172.18.0.4/16",
                "projectcalico.org/RouteReflectorClusterID": null,
                "projectcalico.org/IPv4WireguardInterfaceAddr": null,
                "projectcalico.org/WireguardPublicKey": null,
                "projectcalico.org/IPv6VXLANTunnelAddr": "fd00::1",
                "projectcalico.org/VXLANTunnelMACAddrV6": null,
                "projectcalico.org/Interfaces": "[{\"name\":\"eth0\",\"addresses\":[\"172.18.0.3\",\"fc00:f853:ccd:e793::3\"]},{\"name\":\"vxlan.calico\",\"addresses\":[\"192.168.82.131\"]}]",
                // Only the Calico labels; the shadowed kubernetes.io/os is gone, as in Calico.
                "projectcalico.org/labels": "{\"rack\":\"r2\"}",
                "projectcalico.org/annotations": null
            },
            // No revision on the Calico Node: the live node's.
            "resourceVersion": "20460"
        }})
    );
    // The Kubernetes labels are never in the patch.
    assert!(patch["metadata"].get("labels").is_none());
}

#[test]
fn node_patches_from_nodes_not_read_from_kubernetes() {
    // A Node built by hand (e.g. by node start-up) has no kube-labels: all its labels are
    // Calico's.
    let n: Resource = margay_api::decode_one(
        r#"{"apiVersion": "projectcalico.org/v3", "kind": "Node",
            "metadata": {"name": "n1", "labels": {"zone": "a"}},
            "spec": {"bgp": {"ipv4Address": "10.0.0.1/24", "asNumber": 65001},
                     "interfaces": [{"name": "eth0", "addresses": ["10.0.0.1"]}]}}"#,
    )
    .unwrap();
    let patch =
        calico_node_patch(&n, &node(json!({"other": "kept"}), json!({"zone": "k8s"}))).unwrap();
    assert_eq!(
        patch,
        json!({"metadata": {
            "annotations": {
                "projectcalico.org/IPv4Address": "10.0.0.1/24",
                "projectcalico.org/ASNumber": "65001",
                "projectcalico.org/Interfaces": "[{\"name\":\"eth0\",\"addresses\":[\"10.0.0.1\"]}]",
                "projectcalico.org/labels": "{\"zone\":\"a\"}"
            },
            "resourceVersion": "5"
        }})
    );
    let bad = Resource::Node({
        let Resource::Node(mut n) = n else {
            unreachable!()
        };
        n.metadata
            .annotations
            .insert(ANNOTATION_KUBE_LABELS.into(), "[".into());
        n
    });
    let err = calico_node_patch(&bad, &node(json!({}), json!({}))).unwrap_err();
    assert_eq!(
        err.field,
        "metadata.annotations[\"projectcalico.org/kube-labels\"]"
    );
    assert!(calico_node_patch(&margay_kdd::profile::default_allow_profile(), &json!({})).is_err());
}

#[test]
fn nodes_round_trip_through_patches() {
    // Applying the patch to the live node and reading it again gives the written Node back
    // (resourceVersion aside, which the API server assigns).
    let live = load("node-kind-worker.json");
    let Resource::Node(mut n) = k8s_node_to_calico(&live).unwrap() else {
        unreachable!()
    };
    n.spec.vxlan_tunnel_mac_addr_v6 = "66:7e:2b:a4:3f:02".into();
    n.metadata.labels.insert("rack".into(), "r9".into());
    n.metadata
        .annotations
        .insert("ops.example.com/pager".into(), "42".into());
    n.spec.bgp.as_mut().unwrap().as_number = None;
    let patch = calico_node_patch(&Resource::Node(n.clone()), &live).unwrap();
    let mut applied = live.clone();
    for (k, v) in patch["metadata"]["annotations"].as_object().unwrap() {
        let a = applied["metadata"]["annotations"].as_object_mut().unwrap();
        if v.is_null() {
            a.remove(k);
        } else {
            a.insert(k.clone(), v.clone());
        }
    }
    let Resource::Node(again) = k8s_node_to_calico(&applied).unwrap() else {
        unreachable!()
    };
    assert_eq!(again, n);
}

#[test]
fn kubernetes_network_policies() {
    let np = load("networkpolicy-allow-frontend.json");
    let r = k8s_network_policy_to_calico(&np).unwrap();
    assert_eq!(r.kind(), Kind::NetworkPolicy);
    assert_eq!(r.name(), "knp.default.allow-frontend");
    // The uid converts back to the Kubernetes policy's.
    assert_eq!(
        margay_kdd::names::convert_uid(&r.metadata().uid).unwrap(),
        "2c3d4e5f-6a7b-4c8d-9e0f-1a2b3c4d5e6f"
    );
    let mut bad = np.clone();
    bad["spec"]["ingress"][0]["ports"][0]["port"] = json!(70000);
    bad["spec"]["policyTypes"] = json!(["ingress"]);
    let err = k8s_network_policy_to_calico(&bad).unwrap_err();
    assert_eq!(
        err.object,
        "NetworkPolicy (networking.k8s.io/v1) shop/allow-frontend"
    );
    assert!(err.field.starts_with("spec."), "{err}");
    assert!(
        err.message.contains("; "),
        "every problem is reported: {err}"
    );
    let mut unknown = np.clone();
    unknown["spec"]["podSelectr"] = json!({});
    assert_eq!(
        k8s_network_policy_to_calico(&unknown).unwrap_err().field,
        "spec.podSelectr"
    );
    let mut wrong = np.clone();
    wrong["apiVersion"] = json!("projectcalico.org/v3");
    assert_eq!(
        k8s_network_policy_to_calico(&wrong).unwrap_err().field,
        "apiVersion"
    );
    let mut bad_uid = np;
    bad_uid["metadata"]["uid"] = json!("nope");
    assert_eq!(
        k8s_network_policy_to_calico(&bad_uid).unwrap_err().field,
        "metadata.uid"
    );
}
