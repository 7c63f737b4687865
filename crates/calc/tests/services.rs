//! Kubernetes Services through the calculation graph: service ports as dataplane messages
//! and Calico's `destination.services` IP sets filled from EndpointSlices.

mod common;

use common::*;
use margay_api::Resource;
use margay_calc::services::{KubeEndpointSlice, KubeService};
use margay_calc::{IpSetMember, Message};
use serde_json::json;

fn service() -> KubeService {
    serde_json::from_value(json!({
        "metadata": {"name": "dns", "namespace": "kube-system"},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "dns", "protocol": "UDP", "port": 53}]}
    }))
    .expect("service")
}

fn slice(addrs: &[&str]) -> KubeEndpointSlice {
    let eps: Vec<_> = addrs
        .iter()
        .map(|a| json!({"addresses": [a], "nodeName": HOST}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "dns-abc", "namespace": "kube-system",
                     "labels": {"kubernetes.io/service-name": "dns"}},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "dns", "protocol": "UDP", "port": 5353}]
    }))
    .expect("slice")
}

fn local_wep() -> Resource {
    res("apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: host1-k8s-a-eth0
  namespace: ns1
spec:
  orchestrator: k8s
  node: host1
  pod: a
  endpoint: eth0
  interfaceName: calia
  ipNetworks: [10.65.0.1/32]
  profiles: [kns.ns1]")
}

fn to_dns_policy() -> Resource {
    res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: to-dns, namespace: ns1}
spec:
  selector: all()
  types: [Egress]
  egress:
  - action: Allow
    destination: {services: {name: dns, namespace: kube-system}}")
}

fn service_set(h: &Harness) -> Vec<IpSetMember> {
    let (_, members) = h
        .model
        .ip_sets
        .iter()
        .find(|(id, _)| id.starts_with("svc:"))
        .map(|(_, v)| v.clone())
        .expect("a service IP set");
    members.into_iter().collect()
}

#[test]
fn service_ports_reach_the_dataplane_and_follow_endpoints() {
    let mut h = Harness::new(config());
    h.graph
        .on_kube_service("kube-system", "dns", Some(&service()));
    h.flush();
    assert_eq!(h.model.services.len(), 1);
    let port = h.model.services.values().next().expect("port");
    assert!(
        port.cluster_backends.is_empty(),
        "no slice yet: no backends"
    );

    h.graph.on_endpoint_slice(
        "kube-system",
        "dns-abc",
        Some(&slice(&["10.65.0.7", "10.65.0.8"])),
    );
    let msgs = h.flush();
    assert!(
        matches!(&msgs[..], [Message::ServiceUpdate { .. }]),
        "{msgs:?}"
    );
    let port = h.model.services.values().next().expect("port");
    assert_eq!(port.cluster_backends.len(), 2);
    assert_eq!(port.local_backends.len(), 2);

    h.graph.on_kube_service("kube-system", "dns", None);
    h.flush();
    assert!(h.model.services.is_empty());
    assert!(h.flush().is_empty(), "idle flush");
}

#[test]
fn destination_services_sets_are_filled_in_any_order() {
    // Service and slice before the policy that uses them.
    let mut a = Harness::new(config());
    a.graph
        .on_kube_service("kube-system", "dns", Some(&service()));
    a.graph
        .on_endpoint_slice("kube-system", "dns-abc", Some(&slice(&["10.65.0.7"])));
    a.apply(&local_wep().key(), Some(local_wep()));
    a.apply(&to_dns_policy().key(), Some(to_dns_policy()));
    a.flush();
    let want = vec![IpSetMember::IpPort {
        ip: "10.65.0.7".parse().expect("ip"),
        protocol: margay_calc::PortProtocol::Udp,
        port: 5353,
    }];
    assert_eq!(service_set(&a), want);

    // The policy first, then the service and its slice.
    let mut b = Harness::new(config());
    b.apply(&local_wep().key(), Some(local_wep()));
    b.apply(&to_dns_policy().key(), Some(to_dns_policy()));
    b.flush();
    assert!(
        service_set(&b).is_empty(),
        "no service yet: nothing matches"
    );
    b.graph
        .on_endpoint_slice("kube-system", "dns-abc", Some(&slice(&["10.65.0.7"])));
    b.graph
        .on_kube_service("kube-system", "dns", Some(&service()));
    let msgs = b.flush();
    assert!(
        msgs.iter()
            .any(|m| matches!(m, Message::IpSetDeltaUpdate { .. })),
        "a delta, not a rewrite: {msgs:?}"
    );
    assert_eq!(service_set(&b), want);
    assert_eq!(a.model.ip_sets, b.model.ip_sets);

    // Endpoints move: the set follows; the slice goes: the set empties.
    b.graph
        .on_endpoint_slice("kube-system", "dns-abc", Some(&slice(&["10.65.0.9"])));
    b.flush();
    assert_eq!(service_set(&b).len(), 1);
    assert_ne!(service_set(&b), want);
    b.graph.on_endpoint_slice("kube-system", "dns-abc", None);
    b.flush();
    assert!(service_set(&b).is_empty());
}

#[test]
fn an_unusable_service_is_a_problem_and_absent() {
    let mut h = Harness::new(config());
    let mut bad = service();
    bad.spec.cluster_ips = vec!["not-an-ip".into()];
    h.graph.on_kube_service("kube-system", "dns", Some(&bad));
    h.flush();
    assert!(h.model.services.is_empty());
    let problems = h.graph.problems();
    assert!(
        problems
            .iter()
            .any(|p| p.resource == "Service kube-system/dns"
                && p.reason.contains("spec.clusterIPs[0]")),
        "{problems:?}"
    );
    h.graph
        .on_kube_service("kube-system", "dns", Some(&service()));
    h.flush();
    assert_eq!(h.model.services.len(), 1);
    assert!(h.graph.problems().is_empty());
}
