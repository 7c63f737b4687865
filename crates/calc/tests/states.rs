//! State-sequence tests in the style of Calico's calc-graph tests: named datastore states,
//! each with the dataplane state it must produce; every sequence of states is replayed in
//! several orders and must reach the same output, equal to a from-scratch computation.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::net::IpAddr;

use common::*;
use margay_api::net::Cidr;
use margay_calc::{
    DataplaneModel, IpSetMember, PolicyId, PortProtocol, RuleAction, WorkloadEndpointId, route_type,
};

fn node(name: &str, ip: &str, vxlan: &str) -> margay_api::Resource {
    let vx = if vxlan.is_empty() {
        String::new()
    } else {
        format!(
            "  ipv4VXLANTunnelAddr: {vxlan}\n  vxlanTunnelMACAddr: 66:00:00:00:00:0{}\n",
            &name[name.len() - 1..]
        )
    };
    res(&format!(
        "apiVersion: projectcalico.org/v3\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    rack: r1\nspec:\n  bgp:\n    ipv4Address: {ip}\n{vx}"
    ))
}

fn pool() -> margay_api::Resource {
    res("apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: default-pool}
spec: {cidr: 192.168.0.0/16, vxlanMode: Always, natOutgoing: true, blockSize: 26}")
}

fn wep(node: &str, pod: &str, ip: &str, labels: &str, extra: &str) -> margay_api::Resource {
    res(&format!(
        "apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: {node}-k8s-{pod}-eth0
  namespace: ns1
  labels: {{{labels}}}
spec:
  orchestrator: k8s
  node: {node}
  pod: {pod}
  endpoint: eth0
  interfaceName: cali{pod}
  ipNetworks: [{ip}/32]
  profiles: [kns.ns1]
{extra}"
    ))
}

fn ns_profile(labels: &str) -> margay_api::Resource {
    res(&format!(
        "apiVersion: projectcalico.org/v3
kind: Profile
metadata: {{name: kns.ns1}}
spec:
  labelsToApply: {{{labels}}}
  ingress: [{{action: Allow}}]
  egress: [{{action: Allow}}]"
    ))
}

fn base() -> Vec<margay_api::Resource> {
    vec![
        node(HOST, "10.0.0.1/24", "192.168.10.0"),
        node("host2", "10.0.0.2/24", "192.168.20.0"),
        node("host3", "10.0.1.3/24", ""),
        pool(),
        ns_profile("pcns.env: prod"),
        wep(HOST, "web1", "192.168.10.5", "app: web", ""),
        wep("host2", "db1", "192.168.20.7", "role: db", ""),
    ]
}

fn gnp_allow_db() -> margay_api::Resource {
    res("apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: allow-db}
spec:
  order: 100
  selector: app == 'web'
  ingress:
  - action: Allow
    source: {selector: role == 'db'}")
}

fn np_egress_prod() -> margay_api::Resource {
    res("apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: egress-prod, namespace: ns1}
spec:
  order: 10
  selector: all()
  types: [Egress]
  egress:
  - action: Allow
    destination: {namespaceSelector: env == 'prod'}")
}

fn security_tier() -> Vec<margay_api::Resource> {
    vec![
        res("apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: security}
spec: {order: 100, defaultAction: Pass}"),
        res("apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: security.block-bad}
spec:
  tier: security
  selector: has(app)
  ingress:
  - action: Deny
    source: {nets: [10.66.0.0/16]}
  egress:
  - action: Deny
    destination: {selector: bad == 'true'}"),
    ]
}

fn named_port_state() -> Vec<margay_api::Resource> {
    vec![
        wep(
            "host2",
            "api1",
            "192.168.20.9",
            "app: api",
            "  ports:\n  - {name: http, protocol: TCP, port: 8080}\n  - {name: http, protocol: UDP, port: 8081}",
        ),
        res("apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: to-api}
spec:
  selector: app == 'web'
  types: [Egress]
  egress:
  - action: Allow
    protocol: TCP
    destination: {selector: app == 'api', ports: [http]}"),
    ]
}

fn netset_state() -> Vec<margay_api::Resource> {
    vec![res("apiVersion: projectcalico.org/v3
kind: GlobalNetworkSet
metadata:
  name: external-dbs
  labels: {role: db}
spec:
  nets: [10.9.0.0/16, 10.10.1.1]")]
}

fn missing_profile_state() -> Vec<margay_api::Resource> {
    vec![
        wep(
            HOST,
            "lonely",
            "192.168.10.9",
            "app: lonely",
            "  serviceAccountName: sa1",
        )
        .with_profiles(&["kns.ns1", "does-not-exist"]),
    ]
}

fn hep_state() -> Vec<margay_api::Resource> {
    vec![
        res("apiVersion: projectcalico.org/v3
kind: HostEndpoint
metadata:
  name: host1-eth0
  labels: {hostendpoint: 'true'}
spec:
  node: host1
  interfaceName: eth0
  expectedIPs: [10.0.0.1]"),
        res("apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: untracked-hep}
spec:
  selector: has(hostendpoint)
  doNotTrack: true
  applyOnForward: true
  ingress: [{action: Allow, source: {selector: role == 'db'}}]
  egress: [{action: Allow}]"),
        res("apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: hep-normal}
spec:
  selector: has(hostendpoint)
  ingress: [{action: Allow}]"),
    ]
}

trait WithProfiles {
    fn with_profiles(self, profiles: &[&str]) -> Self;
}

impl WithProfiles for margay_api::Resource {
    fn with_profiles(mut self, profiles: &[&str]) -> Self {
        if let margay_api::Resource::WorkloadEndpoint(w) = &mut self {
            w.spec.profiles = profiles.iter().map(|p| p.to_string()).collect();
        }
        self
    }
}

fn web1_id() -> WorkloadEndpointId {
    WorkloadEndpointId {
        orchestrator: "k8s".into(),
        workload: "ns1/web1".into(),
        endpoint: "eth0".into(),
    }
}

fn net(s: &str) -> IpSetMember {
    IpSetMember::Net(Cidr::parse_cidr_or_ip(s).unwrap())
}

fn members(model: &DataplaneModel, selector: &str) -> BTreeSet<IpSetMember> {
    let id = sel_id(selector);
    model
        .members(&id)
        .unwrap_or_else(|| {
            panic!(
                "no IP set for {selector} ({id}); sets: {:?}",
                model.ip_sets.keys()
            )
        })
        .clone()
}

/// (tier, ingress policy names, egress policy names) for an endpoint.
fn tiers_of(
    model: &DataplaneModel,
    id: &WorkloadEndpointId,
) -> Vec<(String, Vec<String>, Vec<String>)> {
    let ep = model
        .workload_endpoints
        .get(id)
        .unwrap_or_else(|| panic!("endpoint {id} missing"));
    ep.tiers
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.ingress_policies.iter().map(|p| p.name.clone()).collect(),
                t.egress_policies.iter().map(|p| p.name.clone()).collect(),
            )
        })
        .collect()
}

struct Named {
    name: &'static str,
    resources: Vec<margay_api::Resource>,
    check: fn(&DataplaneModel),
}

fn states() -> Vec<Named> {
    let with = |extra: Vec<margay_api::Resource>| {
        let mut v = base();
        v.extend(extra);
        v
    };
    vec![
        Named {
            name: "empty",
            resources: vec![],
            check: |m| {
                assert!(m.ip_sets.is_empty());
                assert!(m.policies.is_empty());
                assert!(m.profiles.is_empty());
                assert!(m.workload_endpoints.is_empty());
                assert!(m.routes.is_empty());
                assert!(m.vteps.is_empty());
                assert!(m.hosts.is_empty());
            },
        },
        Named {
            name: "local endpoint, no policy",
            resources: base(),
            check: |m| {
                assert_eq!(tiers_of(m, &web1_id()), vec![]);
                assert_eq!(m.profiles.keys().collect::<Vec<_>>(), vec!["kns.ns1"]);
                assert!(m.policies.is_empty());
                assert!(m.ip_sets.is_empty());
                assert_eq!(m.namespaces["ns1"]["env"], "prod");
                // Routes: the local workload, the remote workload (no IPAM blocks known, so
                // the workload's own address), hosts, tunnels and the pool.
                let local = &m.routes[&Cidr::parse("192.168.10.5/32").unwrap()];
                assert_eq!(local.types, route_type::LOCAL_WORKLOAD);
                assert!(local.local_workload);
                let remote = &m.routes[&Cidr::parse("192.168.20.7/32").unwrap()];
                assert_eq!(remote.types, route_type::REMOTE_WORKLOAD);
                assert_eq!(remote.dst_node_name, "host2");
                assert_eq!(
                    remote.dst_node_ip,
                    Some("10.0.0.2".parse::<IpAddr>().unwrap())
                );
                assert!(remote.same_subnet);
                assert!(remote.nat_outgoing);
                assert_eq!(remote.pool_type, margay_calc::PoolType::Vxlan);
                let h3 = &m.routes[&Cidr::parse("10.0.1.3/32").unwrap()];
                assert_eq!(h3.types, route_type::REMOTE_HOST);
                assert!(!h3.same_subnet);
                let tunnel = &m.routes[&Cidr::parse("192.168.20.0/32").unwrap()];
                assert_eq!(tunnel.types, route_type::REMOTE_TUNNEL);
                assert!(
                    m.routes
                        .contains_key(&Cidr::parse("192.168.0.0/16").unwrap())
                );
                assert_eq!(m.vteps.len(), 2);
                assert_eq!(
                    m.vteps["host2"].ipv4_addr,
                    Some("192.168.20.0".parse().unwrap())
                );
                assert_eq!(
                    m.vteps["host2"].parent_device_ip,
                    Some("10.0.0.2".parse().unwrap())
                );
                assert_eq!(m.hosts.len(), 3);
                assert_eq!(m.encapsulation, Some((false, true, false)));
                assert_eq!(m.pools.len(), 1);
            },
        },
        Named {
            name: "global policy selecting the local endpoint",
            resources: with(vec![gnp_allow_db()]),
            check: |m| {
                assert_eq!(
                    tiers_of(m, &web1_id()),
                    vec![("default".into(), vec!["allow-db".into()], vec![])]
                );
                assert_eq!(
                    members(m, "role == 'db'"),
                    BTreeSet::from([net("192.168.20.7")])
                );
                let pol = &m.policies[&PolicyId {
                    tier: "default".into(),
                    namespace: String::new(),
                    name: "allow-db".into(),
                }];
                assert_eq!(pol.inbound.len(), 1);
                assert!(pol.outbound.is_empty());
            },
        },
        Named {
            name: "namespaced egress policy with a namespace selector",
            resources: with(vec![gnp_allow_db(), np_egress_prod()]),
            check: |m| {
                // Order 10 before order 100; the NetworkPolicy governs egress only.
                assert_eq!(
                    tiers_of(m, &web1_id()),
                    vec![(
                        "default".into(),
                        vec!["allow-db".into()],
                        vec!["egress-prod".into()]
                    )]
                );
                // Both workloads inherit pcns.env=prod from kns.ns1.
                assert_eq!(
                    members(m, "pcns.env == 'prod'"),
                    BTreeSet::from([net("192.168.10.5"), net("192.168.20.7")])
                );
            },
        },
        Named {
            name: "namespace labels change",
            resources: {
                let mut v = with(vec![gnp_allow_db(), np_egress_prod()]);
                v.retain(|r| r.name() != "kns.ns1");
                v.push(ns_profile("pcns.env: dev"));
                v
            },
            check: |m| {
                assert_eq!(members(m, "pcns.env == 'prod'"), BTreeSet::new());
                assert_eq!(m.namespaces["ns1"]["env"], "dev");
            },
        },
        Named {
            name: "tiers in order",
            resources: {
                let mut v = with(vec![gnp_allow_db()]);
                v.extend(security_tier());
                v
            },
            check: |m| {
                assert_eq!(
                    tiers_of(m, &web1_id()),
                    vec![
                        (
                            "security".into(),
                            vec!["security.block-bad".into()],
                            vec!["security.block-bad".into()]
                        ),
                        ("default".into(), vec!["allow-db".into()], vec![]),
                    ]
                );
                let ep = &m.workload_endpoints[&web1_id()];
                assert_eq!(ep.tiers[0].default_action, RuleAction::Pass);
                assert_eq!(ep.tiers[1].default_action, RuleAction::Deny);
                assert_eq!(members(m, "bad == 'true'"), BTreeSet::new());
            },
        },
        Named {
            name: "named ports",
            resources: with(named_port_state()),
            check: |m| {
                let pol = &m.policies[&PolicyId {
                    tier: "default".into(),
                    namespace: String::new(),
                    name: "to-api".into(),
                }];
                let rule = &pol.outbound[0];
                assert!(rule.dst.ip_set_ids.is_empty());
                assert_eq!(rule.dst.named_port_ip_set_ids.len(), 1);
                let set = m.members(&rule.dst.named_port_ip_set_ids[0]).unwrap();
                assert_eq!(
                    set,
                    &BTreeSet::from([IpSetMember::IpPort {
                        ip: "192.168.20.9".parse().unwrap(),
                        protocol: PortProtocol::Tcp,
                        port: 8080,
                    }])
                );
            },
        },
        Named {
            name: "network sets are selected like endpoints",
            resources: with({
                let mut v = vec![gnp_allow_db()];
                v.extend(netset_state());
                v
            }),
            check: |m| {
                assert_eq!(
                    members(m, "role == 'db'"),
                    BTreeSet::from([net("192.168.20.7"), net("10.9.0.0/16"), net("10.10.1.1/32")])
                );
            },
        },
        Named {
            name: "a missing profile fails closed",
            resources: with(missing_profile_state()),
            check: |m| {
                let p = &m.profiles["does-not-exist"];
                assert_eq!(p.inbound.len(), 1);
                assert_eq!(p.inbound[0].action, RuleAction::Deny);
                assert_eq!(p.outbound[0].action, RuleAction::Deny);
                assert_eq!(m.profiles["kns.ns1"].inbound[0].action, RuleAction::Allow);
            },
        },
        Named {
            name: "host endpoint with untracked and normal policies",
            resources: with(hep_state()),
            check: |m| {
                let hep = &m.host_endpoints["host1-eth0"];
                let names = |t: &[margay_calc::TierInfo]| -> Vec<String> {
                    t.iter()
                        .flat_map(|t| t.ingress_policies.iter().map(|p| p.name.clone()))
                        .collect()
                };
                assert_eq!(names(&hep.untracked_tiers), vec!["untracked-hep"]);
                // Untracked tiers never drop at their end (Calico forces Pass).
                assert!(
                    hep.untracked_tiers
                        .iter()
                        .all(|t| t.default_action == RuleAction::Pass)
                );
                assert!(
                    hep.tiers
                        .iter()
                        .all(|t| t.default_action == RuleAction::Deny)
                );
                assert_eq!(names(&hep.tiers), vec!["hep-normal"]);
                assert!(names(&hep.forward_tiers).is_empty());
                assert_eq!(
                    members(m, "role == 'db'"),
                    BTreeSet::from([net("192.168.20.7")])
                );
                // Untracked policies never apply to workloads.
                assert_eq!(tiers_of(m, &web1_id()), vec![]);
            },
        },
    ]
}

fn run_sequence(seq: &[&Named], order: Order) {
    let mut h = Harness::new(config());
    for s in seq {
        let target = state(&s.resources);
        h.go_to(&target, order);
        (s.check)(&h.model);
        let scratch = from_scratch(config(), &target);
        assert_eq!(
            h.model, scratch,
            "state {:?} reached via {order:?} differs from a from-scratch computation",
            s.name
        );
        // Nothing pending after a flush.
        assert!(
            h.graph.flush().is_empty(),
            "state {:?}: idle flush not empty",
            s.name
        );
    }
}

#[test]
fn each_state_from_empty_and_back() {
    let all = states();
    let empty = &all[0];
    for s in &all[1..] {
        for order in [Order::Forwards, Order::Backwards, Order::DeletesFirst] {
            run_sequence(&[s, empty, s, empty], order);
        }
    }
}

#[test]
fn every_pair_of_states_in_every_order() {
    let all = states();
    for a in &all {
        for b in &all {
            for order in [Order::Forwards, Order::Backwards, Order::DeletesFirst] {
                run_sequence(&[a, b, a], order);
            }
        }
    }
}

#[test]
fn all_states_forwards_and_backwards_with_spurious_deletes() {
    let all = states();
    let forwards: Vec<&Named> = all.iter().collect();
    let backwards: Vec<&Named> = all.iter().rev().collect();
    for order in [
        Order::Forwards,
        Order::Backwards,
        Order::DeletesFirst,
        Order::WithSpuriousDeletes,
    ] {
        run_sequence(&forwards, order);
        run_sequence(&backwards, order);
    }
}

#[test]
fn ipam_blocks_replace_per_workload_routes_except_borrowed_addresses() {
    let mut h = Harness::new(config());
    h.go_to(&state(&base()), Order::Forwards);
    let remote = Cidr::parse("192.168.20.7/32").unwrap();
    assert!(h.model.routes.contains_key(&remote));
    // host2 owns the block: its workload needs no /32 route of its own.
    h.graph.on_ipam_block(
        Cidr::parse("192.168.20.0/26").unwrap(),
        Some("host2".into()),
    );
    h.flush();
    assert!(!h.model.routes.contains_key(&remote));
    let block = &h.model.routes[&Cidr::parse("192.168.20.0/26").unwrap()];
    assert_eq!(block.types, route_type::REMOTE_WORKLOAD);
    assert_eq!(block.dst_node_name, "host2");
    // The block moves to host3: host2's workload address is now borrowed.
    h.graph.on_ipam_block(
        Cidr::parse("192.168.20.0/26").unwrap(),
        Some("host3".into()),
    );
    h.flush();
    assert_eq!(h.model.routes[&remote].dst_node_name, "host2");
    assert_eq!(
        h.model.routes[&Cidr::parse("192.168.20.0/26").unwrap()].dst_node_name,
        "host3"
    );
    h.graph
        .on_ipam_block(Cidr::parse("192.168.20.0/26").unwrap(), None);
    h.flush();
    assert!(
        !h.model
            .routes
            .contains_key(&Cidr::parse("192.168.20.0/26").unwrap())
    );
}

#[test]
fn in_sync_is_sent_once_and_last() {
    let mut graph = margay_calc::CalcGraph::new(config());
    for r in base() {
        graph.on_update(&r.key(), Some(r.clone()));
    }
    let before = graph.flush();
    assert!(!before.contains(&margay_calc::Message::InSync));
    graph.on_in_sync();
    let msgs = graph.flush();
    assert_eq!(msgs.last(), Some(&margay_calc::Message::InSync));
    graph.on_in_sync();
    assert!(graph.flush().is_empty());
}

#[test]
fn invalid_values_are_treated_as_deleted() {
    let mut h = Harness::new(config());
    let mut resources = base();
    resources.push(gnp_allow_db());
    h.go_to(&state(&resources), Order::Forwards);
    assert_eq!(h.model.policies.len(), 1);
    // A selector the graph cannot parse (validation would normally catch it first).
    let mut bad = gnp_allow_db();
    if let margay_api::Resource::GlobalNetworkPolicy(p) = &mut bad {
        p.spec.selector = "app == ".into();
    }
    h.graph.on_update(&bad.key(), Some(bad.clone()));
    h.flush();
    assert!(h.model.policies.is_empty());
    assert_eq!(tiers_of(&h.model, &web1_id()), vec![]);
    assert_eq!(h.graph.problems().len(), 1);
    h.graph.on_update(&bad.key(), Some(gnp_allow_db()));
    h.flush();
    assert_eq!(h.model.policies.len(), 1);
    assert!(h.graph.problems().is_empty());
}
