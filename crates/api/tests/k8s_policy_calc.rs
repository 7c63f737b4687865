//! Converted Kubernetes NetworkPolicies mean the right thing: margay's calculation graph, given
//! endpoints in two namespaces (with `kns.<ns>` profiles carrying `pcns.` namespace labels, as
//! the CNI plugin and Calico set them up) and converted policies, applies each policy to the
//! right endpoints and fills its IP sets with the right addresses.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use margay_api::{Resource, decode_one};
use margay_calc::{
    CalcConfig, CalcGraph, DataplaneModel, IpSetMember, PolicyId, PortProtocol, ResolvedMatch,
    RouteSource,
};

const HOST: &str = "host1";

fn res(yaml: &str) -> Resource {
    let r = decode_one(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    if let Err(e) = r.validate() {
        panic!("does not validate: {e}\n{yaml}");
    }
    r
}

fn namespace(ns: &str, env: &str) -> Resource {
    res(&format!(
        "apiVersion: projectcalico.org/v3
kind: Profile
metadata: {{name: kns.{ns}}}
spec:
  labelsToApply:
    pcns.projectcalico.org/name: {ns}
    pcns.env: {env}
  ingress: [{{action: Allow}}]
  egress: [{{action: Allow}}]"
    ))
}

/// A pod's endpoint as the CNI plugin writes it (orchestrator k8s, namespace and orchestrator
/// labels, the namespace profile).
fn pod(ns: &str, pod: &str, ip: &str, labels: &str, extra: &str) -> Resource {
    res(&format!(
        "apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: {HOST}-k8s-{pod}-eth0
  namespace: {ns}
  labels:
    projectcalico.org/namespace: {ns}
    projectcalico.org/orchestrator: k8s
    {labels}
spec:
  orchestrator: k8s
  node: {HOST}
  pod: {pod}
  endpoint: eth0
  interfaceName: cali{pod}
  ipNetworks: [{ip}/32]
  profiles: [kns.{ns}]
{extra}"
    ))
}

/// An endpoint of a plain CNI container (orchestrator cni) that happens to sit in `prod` with
/// the same labels as a pod there: Kubernetes policies must not select it.
fn plain_container() -> Resource {
    res(&format!(
        "apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: {HOST}-cni-c0ffee-eth0
  namespace: prod
  labels: {{app: web}}
spec:
  orchestrator: cni
  node: {HOST}
  containerID: c0ffee
  endpoint: eth0
  interfaceName: calic0ffee
  ipNetworks: [10.0.0.99/32]
  profiles: [kns.prod]"
    ))
}

fn k8s_policy(ns: &str, name: &str, spec: &str) -> Resource {
    res(&format!(
        "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: {name}, namespace: {ns}}}
spec:
{spec}"
    ))
}

fn world() -> Vec<Resource> {
    vec![
        namespace("prod", "prod"),
        namespace("dev", "dev"),
        pod(
            "prod",
            "web",
            "10.0.0.1",
            "app: web",
            "  ports:\n  - {name: http, protocol: TCP, port: 8080}",
        ),
        pod(
            "prod",
            "db",
            "10.0.0.2",
            "app: db",
            "  ports:\n  - {name: postgres, protocol: TCP, port: 5432}",
        ),
        pod("dev", "web", "10.0.1.1", "app: web", ""),
        pod("dev", "client", "10.0.1.2", "app: client", ""),
        plain_container(),
        // Web pods in prod take traffic from client pods of their own namespace (there are
        // none: the client is in dev).
        k8s_policy(
            "prod",
            "web-from-clients",
            "  podSelector: {matchLabels: {app: web}}
  ingress:
  - from:
    - podSelector: {matchLabels: {app: client}}",
        ),
        // The database takes postgres (a named port) from pods of namespaces labelled env=dev.
        k8s_policy(
            "prod",
            "db-from-dev",
            "  podSelector: {matchLabels: {app: db}}
  ingress:
  - ports: [{port: postgres}]
    from:
    - namespaceSelector: {matchLabels: {env: dev}}",
        ),
        // Every pod in dev takes traffic from anywhere in the cluster, and web pods of prod
        // (both selectors of one peer); egress only to 10.0.0.0/24 except 10.0.0.2.
        k8s_policy(
            "dev",
            "all-pods",
            "  podSelector: {}
  ingress:
  - from:
    - namespaceSelector: {}
  - from:
    - namespaceSelector: {matchLabels: {env: prod}}
      podSelector: {matchLabels: {app: web}}
  egress:
  - to:
    - ipBlock: {cidr: 10.0.0.0/24, except: [10.0.0.2/32]}",
        ),
    ]
}

fn model_of(resources: &[Resource]) -> DataplaneModel {
    let mut graph = CalcGraph::new(CalcConfig {
        hostname: HOST.to_string(),
        route_source: RouteSource::CalicoIpam,
    });
    for r in resources {
        graph.on_update(&r.key(), Some(r.clone()));
    }
    graph.on_in_sync();
    let mut model = DataplaneModel::default();
    model.apply_all(&graph.flush()).unwrap();
    assert!(
        graph.problems().is_empty(),
        "the graph could not use: {:?}",
        graph.problems()
    );
    model
}

fn id(ns: &str, name: &str) -> PolicyId {
    PolicyId {
        tier: "default".to_string(),
        namespace: ns.to_string(),
        name: format!("knp.default.{name}"),
    }
}

/// Endpoint name → (ingress policies, egress policies).
fn applied(model: &DataplaneModel) -> BTreeMap<String, (Vec<PolicyId>, Vec<PolicyId>)> {
    model
        .workload_endpoints
        .values()
        .map(|w| {
            let (mut i, mut e) = (Vec::new(), Vec::new());
            for t in &w.tiers {
                i.extend(t.ingress_policies.iter().cloned());
                e.extend(t.egress_policies.iter().cloned());
            }
            (format!("{}/{}", w.namespace, w.name), (i, e))
        })
        .collect()
}

fn ips(list: &[&str]) -> BTreeSet<IpSetMember> {
    list.iter()
        .map(|ip| {
            let ip: IpAddr = ip.parse().unwrap();
            IpSetMember::Net(margay_api::net::Cidr::host(ip))
        })
        .collect()
}

/// The members of the one IP set of a rule's source.
fn source_members(model: &DataplaneModel, m: &ResolvedMatch) -> BTreeSet<IpSetMember> {
    let sets: Vec<&String> = m
        .ip_set_ids
        .iter()
        .chain(&m.named_port_ip_set_ids)
        .collect();
    assert_eq!(sets.len(), 1, "{m:?}");
    model.members(sets[0]).unwrap().clone()
}

#[test]
fn converted_policies_select_the_right_endpoints_and_addresses() {
    let model = model_of(&world());

    // Each policy applies to the pods its podSelector picks in its own namespace only: not to
    // the same labels in another namespace, nor to a non-Kubernetes endpoint.
    let applied = applied(&model);
    let ingress = |wep: &str| applied[wep].0.clone();
    let egress = |wep: &str| applied[wep].1.clone();
    assert_eq!(
        ingress("prod/host1-k8s-web-eth0"),
        vec![id("prod", "web-from-clients")]
    );
    assert_eq!(
        ingress("prod/host1-k8s-db-eth0"),
        vec![id("prod", "db-from-dev")]
    );
    assert_eq!(
        ingress("dev/host1-k8s-web-eth0"),
        vec![id("dev", "all-pods")]
    );
    assert_eq!(
        ingress("dev/host1-k8s-client-eth0"),
        vec![id("dev", "all-pods")]
    );
    assert_eq!(ingress("prod/host1-cni-c0ffee-eth0"), vec![]);
    // Egress types only where the policy has them.
    assert_eq!(egress("prod/host1-k8s-web-eth0"), vec![]);
    assert_eq!(
        egress("dev/host1-k8s-web-eth0"),
        vec![id("dev", "all-pods")]
    );

    // podSelector in a peer: the policy's namespace only (the client is in dev).
    let web = &model.policies[&id("prod", "web-from-clients")];
    assert_eq!(web.inbound.len(), 1);
    assert_eq!(source_members(&model, &web.inbound[0].src), ips(&[]));

    // namespaceSelector: pods of namespaces whose labels match, with the named port resolved.
    let db = &model.policies[&id("prod", "db-from-dev")];
    assert_eq!(db.inbound.len(), 1);
    assert_eq!(db.inbound[0].protocol, Some(6));
    assert_eq!(
        source_members(&model, &db.inbound[0].src),
        ips(&["10.0.1.1", "10.0.1.2"])
    );
    let named = &db.inbound[0].dst.named_port_ip_set_ids;
    assert_eq!(named.len(), 1);
    assert_eq!(
        model.members(&named[0]).unwrap(),
        &BTreeSet::from([IpSetMember::IpPort {
            ip: "10.0.0.2".parse().unwrap(),
            protocol: PortProtocol::Tcp,
            port: 5432,
        }])
    );

    // An empty namespaceSelector: every pod of every namespace (not the plain container);
    // namespaceSelector AND podSelector: web pods of prod only.
    let all = &model.policies[&id("dev", "all-pods")];
    assert_eq!(all.inbound.len(), 2);
    assert_eq!(
        source_members(&model, &all.inbound[0].src),
        ips(&["10.0.0.1", "10.0.0.2", "10.0.1.1", "10.0.1.2"])
    );
    assert_eq!(
        source_members(&model, &all.inbound[1].src),
        ips(&["10.0.0.1"])
    );
    // ipBlock: nets and notNets, no IP set.
    assert_eq!(all.outbound.len(), 1);
    let dst = &all.outbound[0].dst;
    assert_eq!(dst.nets, vec!["10.0.0.0/24".parse().unwrap()]);
    assert_eq!(dst.not_nets, vec!["10.0.0.2/32".parse().unwrap()]);
    assert!(dst.ip_set_ids.is_empty());
}

#[test]
fn relabelling_a_namespace_moves_its_pods_in_and_out_of_a_namespace_selector() {
    let mut resources = world();
    // dev becomes env=prod: the database no longer takes traffic from it...
    resources.retain(|r| r.name() != "kns.dev");
    resources.push(namespace("dev", "prod"));
    let model = model_of(&resources);
    let db = &model.policies[&id("prod", "db-from-dev")];
    assert_eq!(source_members(&model, &db.inbound[0].src), ips(&[]));
    // ...and dev's web pod now counts as a prod web pod for all-pods' second rule.
    let all = &model.policies[&id("dev", "all-pods")];
    assert_eq!(
        source_members(&model, &all.inbound[1].src),
        ips(&["10.0.0.1", "10.0.1.1"])
    );
}
