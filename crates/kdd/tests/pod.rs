//! Pods → WorkloadEndpoints (calico-kdd.md §4a) and the CNI plugin's pod patches, with
//! expected values from Calico's conversion tests (`lk8s/conversion/conversion_test.go`)
//! where it has them, and pods as `kubectl get pod -o json` shows them
//! (tests/fixtures/k8s/pod-*.json, each with its `.expected.yaml` endpoint).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use margay_api::endpoint::QosControls;
use margay_api::numorstring::Dscp;
use margay_api::{Resource, WorkloadEndpoint};
use margay_kdd::pod::*;
use serde_json::{Value, json};

fn wep(pod: &Value) -> WorkloadEndpoint {
    match pod_to_workload_endpoint(pod, "cali").unwrap() {
        Some(Resource::WorkloadEndpoint(w)) => w,
        other => panic!("expected an endpoint, got {other:?}"),
    }
}

/// Calico's test pod (conversion_test.go "should parse a Pod with an IP to a
/// WorkloadEndpoint"), extended by `extra` (merged into the JSON).
fn pod_a(extra: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "podA", "namespace": "default", "resourceVersion": "1234",
            "annotations": {"arbitrary": "annotation"},
            "labels": {"labelA": "valueA", "labelB": "valueB"}
        },
        "spec": {
            "nodeName": "nodeA",
            "containers": [{"ports": [
                {"name": "no-proto", "containerPort": 1234},
                {"name": "tcp-proto", "protocol": "TCP", "containerPort": 1024},
                {"name": "tcp-proto-with-host-port", "protocol": "TCP", "containerPort": 8080, "hostPort": 5678},
                {"name": "tcp-proto-with-host-port-and-ip", "protocol": "TCP", "containerPort": 8081, "hostPort": 6789, "hostIP": "1.2.3.4"},
                {"protocol": "TCP", "containerPort": 500, "hostPort": 5000},
                {"protocol": "TCP", "containerPort": 600},
                {"name": "udp-proto", "protocol": "UDP", "containerPort": 432},
                {"name": "sctp-proto", "protocol": "SCTP", "containerPort": 891},
                {"name": "unkn-proto", "protocol": "unknown", "containerPort": 567}
            ]}],
            "initContainers": [{"ports": [{"name": "init-port", "containerPort": 3000}]}]
        },
        "status": {"podIP": "192.168.0.1"}
    });
    merge(&mut pod, extra);
    pod
}

fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(&k);
                } else {
                    merge(t.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p,
    }
}

#[test]
fn calicos_pod_a() {
    let w = wep(&pod_a(json!({})));
    assert_eq!(w.metadata.name, "nodeA-k8s-podA-eth0");
    assert_eq!(w.metadata.namespace, "default");
    assert_eq!(w.metadata.resource_version, "1234");
    assert_eq!(
        (
            w.spec.pod.as_str(),
            w.spec.node.as_str(),
            w.spec.endpoint.as_str(),
            w.spec.orchestrator.as_str()
        ),
        ("podA", "nodeA", "eth0", "k8s")
    );
    assert_eq!(w.spec.ip_networks, ["192.168.0.1/32"]);
    assert_eq!(w.spec.profiles, ["kns.default"]);
    assert_eq!(
        w.metadata.labels,
        [
            ("labelA", "valueA"),
            ("labelB", "valueB"),
            ("projectcalico.org/namespace", "default"),
            ("projectcalico.org/orchestrator", "k8s"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    );
    let ports: Vec<(String, String, i64, i64, String)> = w
        .spec
        .ports
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                p.protocol.to_string(),
                p.port,
                p.host_port,
                p.host_ip.clone(),
            )
        })
        .collect();
    let want: Vec<(String, String, i64, i64, String)> = [
        ("no-proto", "TCP", 1234, 0, ""),
        ("tcp-proto", "TCP", 1024, 0, ""),
        ("tcp-proto-with-host-port", "TCP", 8080, 5678, ""),
        (
            "tcp-proto-with-host-port-and-ip",
            "TCP",
            8081,
            6789,
            "1.2.3.4",
        ),
        ("", "TCP", 500, 5000, ""),
        ("udp-proto", "UDP", 432, 0, ""),
        ("sctp-proto", "SCTP", 891, 0, ""),
        ("init-port", "TCP", 3000, 0, ""),
    ]
    .into_iter()
    .map(|(n, p, port, hp, ip)| (n.into(), p.into(), port, hp, ip.into()))
    .collect();
    assert_eq!(ports, want);
    // "If this fails, fix the code not this expect!"
    assert_eq!(w.spec.interface_name, "cali7f94ce7c295");
    assert!(w.metadata.annotations.is_empty());
    assert!(w.spec.qos_controls.is_none());
    // (Calico's test pod is not a valid Kubernetes pod, upper-case names and all, so it is not
    // validated here; the kubectl fixtures below are.)
}

#[test]
fn skipped_pods() {
    for extra in [
        json!({"spec": {"hostNetwork": true}}),
        json!({"spec": {"nodeName": null}}),
        json!({"spec": {"nodeName": ""}}),
    ] {
        assert_eq!(
            pod_to_workload_endpoint(&pod_a(extra.clone()), "cali").unwrap(),
            None,
            "{extra}"
        );
    }
    // Not yet with an IP, but scheduled: an endpoint without addresses.
    let w = wep(&pod_a(json!({"status": {"podIP": null}})));
    assert!(w.spec.ip_networks.is_empty());
}

#[test]
fn ip_sources_in_calicos_order() {
    let ann = |a: Value| json!({"metadata": {"annotations": a}});
    for (extra, want) in [
        (
            json!({"status": {"podIPs": [{"ip": "192.168.0.1"}, {"ip": "fd5f:65af::2"}]}}),
            vec!["192.168.0.1/32", "fd5f:65af::2/128"],
        ),
        // podIPs win over podIP and the annotations.
        (
            json!({"status": {"podIPs": [{"ip": "10.0.0.9"}], "podIP": "192.168.0.1"},
                "metadata": {"annotations": {"cni.projectcalico.org/podIP": "10.1.1.1/32"}}}),
            vec!["10.0.0.9/32"],
        ),
        (
            json!({"status": {"podIP": null},
                "metadata": {"annotations": {
                    "cni.projectcalico.org/podIPs": "192.168.0.1/32,fd5f:65af::2/128",
                    "cni.projectcalico.org/podIP": "10.9.9.9/32"}}}),
            vec!["192.168.0.1/32", "fd5f:65af::2/128"],
        ),
        (
            merge_all(
                json!({"status": {"podIP": null}}),
                ann(
                    json!({"cni.projectcalico.org/podIPs": "", "cni.projectcalico.org/podIP": "172.18.0.4/32"}),
                ),
            ),
            vec!["172.18.0.4/32"],
        ),
        (
            merge_all(
                json!({"status": {"podIP": null}}),
                ann(json!({"vpc.amazonaws.com/pod-ips": "10.2.0.5,10.2.0.6"})),
            ),
            vec!["10.2.0.5/32", "10.2.0.6/32"],
        ),
        // A CIDR is masked, as Calico's ParseCIDROrIP does.
        (
            merge_all(
                json!({"status": {"podIP": null}}),
                ann(json!({"cni.projectcalico.org/podIP": "10.3.0.7/24"})),
            ),
            vec!["10.3.0.0/24"],
        ),
    ] {
        assert_eq!(wep(&pod_a(extra.clone())).spec.ip_networks, want, "{extra}");
    }
}

fn merge_all(mut a: Value, b: Value) -> Value {
    merge(&mut a, b);
    a
}

#[test]
fn finished_pods_keep_the_endpoint_without_addresses() {
    for phase in ["Failed", "Succeeded", "Completed"] {
        let w = wep(&pod_a(json!({"status": {"phase": phase}})));
        assert!(w.spec.ip_networks.is_empty(), "{phase}");
    }
    for (extra, finished) in [
        (
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z",
                              "annotations": {"cni.projectcalico.org/podIP": ""}}}),
            true,
        ),
        (
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z",
                              "annotations": {"vpc.amazonaws.com/pod-ips": ""}}}),
            true,
        ),
        // Being deleted but the CNI plugin has not released the address yet.
        (
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z",
                              "annotations": {"cni.projectcalico.org/podIP": "192.168.0.1/32"}}}),
            false,
        ),
        (
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            false,
        ),
        // Released but not being deleted (a restarted sandbox): still running.
        (
            json!({"metadata": {"annotations": {"cni.projectcalico.org/podIP": ""}}}),
            false,
        ),
        (json!({"status": {"phase": "Running"}}), false),
    ] {
        let w = wep(&pod_a(extra.clone()));
        assert_eq!(w.spec.ip_networks.is_empty(), finished, "{extra}");
    }
    // Floating IPs need addresses: none on a finished pod.
    let w = wep(&pod_a(json!({"status": {"phase": "Succeeded"},
        "metadata": {"annotations": {"cni.projectcalico.org/floatingIPs": "[\"1.1.1.1\"]"}}})));
    assert!(w.spec.ip_nats.is_empty());
}

#[test]
fn service_accounts() {
    let w = wep(&pod_a(json!({"spec": {"serviceAccountName": "sa-test"}})));
    assert_eq!(w.spec.profiles, ["kns.default", "ksa.default.sa-test"]);
    assert_eq!(w.spec.service_account_name, "sa-test");
    assert_eq!(
        w.metadata.labels["projectcalico.org/serviceaccount"],
        "sa-test"
    );
    let long = "s".repeat(63);
    let w = wep(&pod_a(json!({"spec": {"serviceAccountName": long}})));
    assert!(
        !w.metadata
            .labels
            .contains_key("projectcalico.org/serviceaccount")
    );
    assert_eq!(w.spec.profiles[1], format!("ksa.default.{long}"));
    let short = "s".repeat(62);
    let w = wep(&pod_a(json!({"spec": {"serviceAccountName": short}})));
    assert_eq!(w.metadata.labels["projectcalico.org/serviceaccount"], short);
    assert_eq!(service_account_profile_name("", "x"), "ksa.default.x");
}

#[test]
fn metadata_comes_from_the_pod() {
    let w = wep(&pod_a(json!({"metadata": {
        "uid": "6f1c2e4a-8b3d-4c5e-9f70-1a2b3c4d5e6f",
        "creationTimestamp": "2026-03-02T10:11:14Z",
        "generateName": "podA-",
        "annotations": {"k8s.v1.cni.cncf.io/network-status": "[]",
                        "cni.projectcalico.org/containerID": "abc123"}
    }})));
    // The pod's uid unconverted (only Profiles and Kubernetes policies get converted uids).
    assert_eq!(w.metadata.uid, "6f1c2e4a-8b3d-4c5e-9f70-1a2b3c4d5e6f");
    assert_eq!(
        w.metadata.creation_timestamp.as_deref(),
        Some("2026-03-02T10:11:14Z")
    );
    assert_eq!(w.metadata.generate_name, "podA-");
    assert_eq!(w.spec.container_id, "abc123");
    assert_eq!(
        w.metadata.annotations.into_iter().collect::<Vec<_>>(),
        [(
            "k8s.v1.cni.cncf.io/network-status".to_string(),
            "[]".to_string()
        )]
    );
    let w = pod_to_workload_endpoint(&pod_a(json!({})), "tap")
        .unwrap()
        .unwrap();
    match w {
        Resource::WorkloadEndpoint(w) => assert_eq!(w.spec.interface_name, "tap7f94ce7c295"),
        _ => unreachable!(),
    }
}

#[test]
fn floating_ips_and_source_prefixes() {
    let w = wep(&pod_a(json!({
        "status": {"podIP": null, "podIPs": [{"ip": "192.168.0.1"}, {"ip": "fd5f:65af::2"}]},
        "metadata": {"annotations": {
            "cni.projectcalico.org/floatingIPs": "[\"1.1.1.1\", \"2.2.2.2\", \"fd5f::1\"]",
            "cni.projectcalico.org/allowedSourcePrefixes": "[\"8.8.8.8/32\", \"10.0.0.5/8\"]"
        }}
    })));
    let nats: Vec<(&str, &str)> = w
        .spec
        .ip_nats
        .iter()
        .map(|n| (n.internal_ip.as_str(), n.external_ip.as_str()))
        .collect();
    assert_eq!(
        nats,
        [
            ("192.168.0.1", "1.1.1.1"),
            ("192.168.0.1", "2.2.2.2"),
            ("fd5f:65af::2", "fd5f::1")
        ]
    );
    assert_eq!(
        w.spec.allow_spoofed_source_prefixes,
        ["8.8.8.8/32", "10.0.0.0/8"]
    );
    // Only IPv4 on the pod: IPv6 externals are dropped.
    let w = wep(&pod_a(json!({"metadata": {"annotations": {
        "cni.projectcalico.org/floatingIPs": "[\"1.1.1.1\", \"fd5f::1\"]"}}})));
    assert_eq!(w.spec.ip_nats.len(), 1);
    // An empty allowedSourcePrefixes annotation is ignored.
    let w = wep(&pod_a(json!({"metadata": {"annotations": {
        "cni.projectcalico.org/allowedSourcePrefixes": ""}}})));
    assert!(w.spec.allow_spoofed_source_prefixes.is_empty());
}

#[test]
fn malformed_pods_are_errors_naming_the_field() {
    for (extra, field) in [
        (
            json!({"metadata": {"annotations": {"cni.projectcalico.org/floatingIPs": "1.1.1.1"}}}),
            "metadata.annotations[\"cni.projectcalico.org/floatingIPs\"]",
        ),
        (
            json!({"metadata": {"annotations": {"cni.projectcalico.org/floatingIPs": "[\"1.1.1.1\"]",
                                              "cni.projectcalico.org/podIP": "10.0.0.0/24"}},
                "status": {"podIP": null}}),
            "metadata.annotations[\"cni.projectcalico.org/floatingIPs\"]",
        ),
        (
            json!({"metadata": {"annotations": {"cni.projectcalico.org/allowedSourcePrefixes": "[\"8.8.8.8\"]"}}}),
            "metadata.annotations[\"cni.projectcalico.org/allowedSourcePrefixes\"]",
        ),
        (
            json!({"metadata": {"annotations": {"cni.projectcalico.org/allowedSourcePrefixes": "{}"}}}),
            "metadata.annotations[\"cni.projectcalico.org/allowedSourcePrefixes\"]",
        ),
        (json!({"status": {"podIP": "not-an-ip"}}), "status.podIP"),
        (
            json!({"status": {"podIPs": [{"ip": "10.0.0.1"}, {"ip": "bad"}]}}),
            "status.podIPs[1].ip",
        ),
        (
            json!({"status": {"podIP": null}, "metadata": {"annotations": {"cni.projectcalico.org/podIPs": "10.0.0.1/32, fd00::1/128"}}}),
            "metadata.annotations[\"cni.projectcalico.org/podIPs\"]",
        ),
        (json!({"metadata": {"name": null}}), "metadata.name"),
        (json!({"metadata": {"namespace": ""}}), "metadata.namespace"),
        (
            json!({"spec": {"containers": [{"ports": [{"containerPort": "80"}]}]}}),
            "spec.containers[0].ports[0].containerPort",
        ),
        (json!({"spec": {"nodeName": "-bad"}}), "spec.nodeName"),
    ] {
        let err = pod_to_workload_endpoint(&pod_a(extra.clone()), "cali").unwrap_err();
        assert_eq!(err.field, field, "{extra}: {err}");
        assert!(err.object.starts_with("Pod "), "{err}");
    }
    let err =
        pod_to_workload_endpoint(&pod_a(json!({"status": {"podIP": "x"}})), "cali").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("Pod default/podA: status.podIP: "),
        "{err}"
    );
}

fn qos(annotations: Value) -> Option<QosControls> {
    wep(&pod_a(json!({"metadata": {"annotations": annotations}})))
        .spec
        .qos_controls
}

#[test]
fn qos_from_calicos_tests() {
    let q = qos(json!({
        "qos.projectcalico.org/ingressBandwidth": "1M",
        "qos.projectcalico.org/egressBandwidth": "2M",
        "qos.projectcalico.org/ingressBurst": "3M",
        "qos.projectcalico.org/egressBurst": "4M",
        "qos.projectcalico.org/ingressPeakrate": "5M",
        "qos.projectcalico.org/egressPeakrate": "6M",
        "qos.projectcalico.org/ingressMinburst": "7M",
        "qos.projectcalico.org/egressMinburst": "8M",
        "qos.projectcalico.org/ingressPacketRate": "2k",
        "qos.projectcalico.org/egressPacketRate": "9k",
        "qos.projectcalico.org/ingressPacketBurst": "1k",
        "qos.projectcalico.org/egressPacketBurst": "10k",
        "qos.projectcalico.org/ingressMaxConnections": "13M",
        "qos.projectcalico.org/egressMaxConnections": "14M",
        "qos.projectcalico.org/dscp": "cs5"
    }))
    .unwrap();
    assert_eq!(
        q,
        QosControls {
            ingress_bandwidth: 1_000_000,
            egress_bandwidth: 2_000_000,
            ingress_burst: 3_000_000,
            egress_burst: 4_000_000,
            ingress_peakrate: 5_000_000,
            egress_peakrate: 6_000_000,
            ingress_minburst: 7_000_000,
            egress_minburst: 8_000_000,
            ingress_packet_rate: 2000,
            egress_packet_rate: 9000,
            ingress_packet_burst: 1000,
            egress_packet_burst: 10000,
            ingress_max_connections: 13_000_000,
            egress_max_connections: 14_000_000,
            dscp: Some(Dscp::Name("CS5".into())),
        }
    );
    let capped = qos(json!({
        "qos.projectcalico.org/ingressBandwidth": "1",
        "qos.projectcalico.org/egressBandwidth": "20P",
        "qos.projectcalico.org/ingressBurst": "3",
        "qos.projectcalico.org/egressBurst": "40P",
        "qos.projectcalico.org/ingressPeakrate": "5",
        "qos.projectcalico.org/egressPeakrate": "50P",
        "qos.projectcalico.org/ingressMinburst": "7",
        "qos.projectcalico.org/egressMinburst": "8Gi",
        "qos.projectcalico.org/ingressPacketRate": "0",
        "qos.projectcalico.org/egressPacketRate": "60P",
        "qos.projectcalico.org/ingressPacketBurst": "0",
        "qos.projectcalico.org/egressPacketBurst": "70P",
        "qos.projectcalico.org/ingressMaxConnections": "0",
        "qos.projectcalico.org/egressMaxConnections": "80P"
    }))
    .unwrap();
    assert_eq!(
        capped,
        QosControls {
            ingress_bandwidth: 1000,
            egress_bandwidth: 1_000_000_000_000_000,
            ingress_burst: 1000,
            egress_burst: 34_359_738_360,
            ingress_peakrate: 1010,
            egress_peakrate: 1_010_000_000_000_000,
            ingress_minburst: 1000,
            egress_minburst: 100_000_000,
            ingress_packet_rate: 1,
            egress_packet_rate: 10000,
            ingress_packet_burst: 1,
            egress_packet_burst: 10000,
            ingress_max_connections: 1,
            egress_max_connections: 4_294_967_295,
            dscp: None,
        }
    );
    // Dependent limits without what they depend on are dropped (Calico's four "should ignore"
    // tests), leaving nothing.
    for a in [
        json!({"qos.projectcalico.org/ingressBurst": "3M", "qos.projectcalico.org/egressBurst": "4M"}),
        json!({"qos.projectcalico.org/ingressPeakrate": "3M", "qos.projectcalico.org/egressPeakrate": "4M"}),
        json!({"qos.projectcalico.org/ingressMinburst": "3M", "qos.projectcalico.org/egressMinburst": "4M"}),
        json!({"qos.projectcalico.org/ingressPacketBurst": "3M", "qos.projectcalico.org/egressPacketBurst": "4M"}),
        json!({"qos.projectcalico.org/dscp": "64"}),
        json!({"qos.projectcalico.org/dscp": "XX1"}),
        json!({"qos.projectcalico.org/ingressBandwidth": "lots"}),
    ] {
        assert_eq!(qos(a.clone()), None, "{a}");
    }
}

#[test]
fn qos_defaults_and_overrides() {
    let q = qos(json!({
        "kubernetes.io/ingress-bandwidth": "10M",
        "kubernetes.io/egress-bandwidth": "10M",
        "qos.projectcalico.org/egressBandwidth": "30M",
        "qos.projectcalico.org/egressPacketRate": "100",
        // Not above the bandwidth: dropped, and the minburst with it.
        "qos.projectcalico.org/ingressPeakrate": "10M",
        "qos.projectcalico.org/ingressMinburst": "2k",
        "qos.projectcalico.org/dscp": "46"
    }))
    .unwrap();
    assert_eq!(q.ingress_bandwidth, 10_000_000);
    assert_eq!(q.egress_bandwidth, 30_000_000);
    assert_eq!((q.ingress_burst, q.egress_burst), (4 << 30, 4 << 30));
    assert_eq!((q.ingress_peakrate, q.ingress_minburst), (0, 0));
    assert_eq!((q.egress_packet_rate, q.egress_packet_burst), (100, 5));
    assert_eq!(q.dscp, Some(Dscp::Number(46)));
}

#[test]
fn pods_from_kubectl_convert_to_the_expected_endpoints() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/k8s");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(stem) = file
            .strip_prefix("pod-")
            .and_then(|f| f.strip_suffix(".json"))
        else {
            continue;
        };
        let pod: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let expected = margay_api::decode_one(
            &std::fs::read_to_string(dir.join(format!("pod-{stem}.expected.yaml"))).unwrap(),
        )
        .unwrap();
        let got = pod_to_workload_endpoint(&pod, "cali").unwrap().unwrap();
        assert_eq!(got, expected, "{file}");
        got.validate().unwrap_or_else(|e| panic!("{file}: {e}"));
        n += 1;
    }
    assert_eq!(n, 4);
}

#[test]
fn cni_patches() {
    let w = wep(&pod_a(json!({
        "status": {"podIP": null, "podIPs": [{"ip": "192.168.0.1"}, {"ip": "fd5f:65af::2"}]},
        "metadata": {"uid": "6f1c2e4a-8b3d-4c5e-9f70-1a2b3c4d5e6f",
                     "annotations": {"cni.projectcalico.org/containerID": "abc123"}}
    })));
    let w = Resource::WorkloadEndpoint(w);
    assert_eq!(
        workload_endpoint_patch(&w),
        json!({"metadata": {
            "annotations": {
                "cni.projectcalico.org/podIP": "192.168.0.1/32",
                "cni.projectcalico.org/podIPs": "192.168.0.1/32,fd5f:65af::2/128",
                "cni.projectcalico.org/containerID": "abc123"
            },
            "uid": "6f1c2e4a-8b3d-4c5e-9f70-1a2b3c4d5e6f"
        }})
    );
    // Nothing to write without addresses.
    let bare = wep(&pod_a(json!({"status": {"podIP": null}})));
    assert_eq!(
        workload_endpoint_patch(&Resource::WorkloadEndpoint(bare)),
        json!({"metadata": {}})
    );
    assert_eq!(
        workload_endpoint_release_patch("884213", "6f1c2e4a-8b3d-4c5e-9f70-1a2b3c4d5e6f"),
        json!({"metadata": {
            "annotations": {"cni.projectcalico.org/podIP": "", "cni.projectcalico.org/podIPs": ""},
            "resourceVersion": "884213",
            "uid": "6f1c2e4a-8b3d-4c5e-9f70-1a2b3c4d5e6f"
        }})
    );
    assert_eq!(
        workload_endpoint_release_patch("", ""),
        json!({"metadata": {"annotations": {"cni.projectcalico.org/podIP": "", "cni.projectcalico.org/podIPs": ""}}})
    );
    // Patched and read back, the endpoint has the addresses (the pod's own status aside).
    let mut pod = pod_a(json!({"status": {"podIP": null}}));
    merge(
        &mut pod,
        workload_endpoint_patch(&Resource::WorkloadEndpoint(wep(&pod_a(json!({}))))),
    );
    assert_eq!(wep(&pod).spec.ip_networks, ["192.168.0.1/32"]);
    merge(&mut pod, workload_endpoint_release_patch("", ""));
    merge(
        &mut pod,
        json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
    );
    assert!(wep(&pod).spec.ip_networks.is_empty());
}
