use super::*;

fn c(s: &str) -> Cidr {
    Cidr::parse(s).unwrap()
}
fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn pool(cidr: &str, vxlan: EncapMode, ipip: EncapMode) -> PoolData {
    PoolData {
        cidr: c(cidr),
        masquerade: false,
        ipip,
        vxlan,
        disabled: false,
    }
}

fn route(dst: &str, types: u8, pool_type: PoolType, node: &str, node_ip: &str) -> Route {
    Route {
        dst: c(dst),
        types,
        pool_type,
        dst_node_name: node.into(),
        dst_node_ip: if node_ip.is_empty() {
            None
        } else {
            Some(ip(node_ip))
        },
        same_subnet: false,
        nat_outgoing: false,
        local_workload: false,
    }
}

fn vtep(node: &str, tunnel: &str, parent: &str) -> Vtep {
    Vtep {
        node: node.into(),
        mac: margay_calc::vxlan_mac_for_node(node),
        ipv4_addr: Some(ip(tunnel)),
        parent_device_ip: Some(ip(parent)),
        mac_v6: String::new(),
        ipv6_addr: None,
        parent_device_ipv6: None,
    }
}

fn gw(dst: &str, dev: &str, via: &str) -> KernelRoute {
    KernelRoute {
        dst: c(dst),
        target: RouteTarget::Gateway {
            ifname: dev.into(),
            gateway: ip(via),
            onlink: true,
        },
        priority: 0,
        src: None,
    }
}

fn dev(dst: &str, dev: &str, priority: u32) -> KernelRoute {
    KernelRoute {
        dst: c(dst),
        target: RouteTarget::Interface { ifname: dev.into() },
        priority,
        src: None,
    }
}

use route_type::{LOCAL_WORKLOAD, REMOTE_HOST, REMOTE_TUNNEL, REMOTE_WORKLOAD};

#[test]
fn calicos_rules() {
    let pools = vec![
        pool("10.65.0.0/16", EncapMode::Always, EncapMode::Never),
        pool("10.66.0.0/16", EncapMode::CrossSubnet, EncapMode::Never),
        pool("10.67.0.0/16", EncapMode::Never, EncapMode::Never),
        pool("10.68.0.0/16", EncapMode::Never, EncapMode::Always),
    ];
    let mut same_subnet_always = route(
        "10.65.3.0/26",
        REMOTE_WORKLOAD,
        PoolType::Vxlan,
        "b",
        "192.168.1.2",
    );
    same_subnet_always.same_subnet = true;
    let mut cross_same = route(
        "10.66.1.0/26",
        REMOTE_WORKLOAD,
        PoolType::Vxlan,
        "b",
        "192.168.1.2",
    );
    cross_same.same_subnet = true;
    let mut local_wep = route(
        "10.65.0.5/32",
        LOCAL_WORKLOAD,
        PoolType::Vxlan,
        "a",
        "192.168.1.1",
    );
    local_wep.local_workload = true;
    let routes = vec![
        // Remote block in an Always VXLAN pool, even on the same subnet: via the VTEP.
        route(
            "10.65.1.0/26",
            REMOTE_WORKLOAD,
            PoolType::Vxlan,
            "b",
            "192.168.1.2",
        ),
        same_subnet_always,
        // The remote VTEP's own address: directly over the tunnel.
        route(
            "10.65.1.1/32",
            REMOTE_TUNNEL | REMOTE_WORKLOAD,
            PoolType::Vxlan,
            "b",
            "192.168.1.2",
        ),
        // CrossSubnet: via the VTEP across subnets, direct within one.
        route(
            "10.66.2.0/26",
            REMOTE_WORKLOAD,
            PoolType::Vxlan,
            "c",
            "192.168.2.3",
        ),
        cross_same,
        // No encapsulation: via the node.
        route(
            "10.67.1.0/26",
            REMOTE_WORKLOAD,
            PoolType::NoEncap,
            "b",
            "192.168.1.2",
        ),
        // IPIP: unsupported.
        route(
            "10.68.1.0/26",
            REMOTE_WORKLOAD,
            PoolType::Ipip,
            "b",
            "192.168.1.2",
        ),
        // Local block: blackhole; local workload: from the endpoint.
        route(
            "10.65.0.0/26",
            LOCAL_WORKLOAD,
            PoolType::Vxlan,
            "a",
            "192.168.1.1",
        ),
        local_wep,
        // Next hop unknown: skipped.
        route(
            "10.65.9.0/26",
            REMOTE_WORKLOAD,
            PoolType::Vxlan,
            "novtep",
            "192.168.1.9",
        ),
        route(
            "10.67.9.0/26",
            REMOTE_WORKLOAD,
            PoolType::NoEncap,
            "noaddr",
            "",
        ),
        // Hosts and routes outside pools: not margay's.
        route(
            "192.168.1.2/32",
            REMOTE_HOST,
            PoolType::None,
            "b",
            "192.168.1.2",
        ),
        route(
            "172.20.0.0/26",
            REMOTE_WORKLOAD,
            PoolType::None,
            "b",
            "192.168.1.2",
        ),
    ];
    let vteps = vec![
        vtep("a", "10.65.0.1", "192.168.1.1"),
        vtep("b", "10.65.1.1", "192.168.1.2"),
        vtep("c", "10.66.2.1", "192.168.2.3"),
    ];
    let endpoints = vec![("cali12345".to_string(), vec![c("10.65.0.5/32")])];
    let mut ctx = RouteContext::new("a", &pools);
    ctx.parent_device = Some("eth0");
    // By default a no-encap pool's remote blocks are BIRD's: nothing of margay's.
    let bird = desired_routes(&routes, &endpoints, &vteps, &ctx);
    assert!(
        !bird
            .routes
            .iter()
            .any(|r| r.dst == c("10.67.1.0/26") || r.dst == c("10.67.9.0/26")),
        "{:#?}",
        bird.routes
    );
    assert!(!bird.skipped.iter().any(|(d, _)| *d == c("10.67.9.0/26")));
    // The local no-encap block is still blackholed (addresses no workload holds).
    ctx.program_noencap = true;
    let got = desired_routes(&routes, &endpoints, &vteps, &ctx);
    assert_eq!(
        bird.routes.len() + 1,
        got.routes.len(),
        "only the no-encap remote block differs"
    );
    let mut want = vec![
        dev("10.65.0.5/32", "cali12345", 1024),
        gw("10.65.1.0/26", "vxlan.calico", "10.65.1.1"),
        gw("10.65.3.0/26", "vxlan.calico", "10.65.1.1"),
        dev("10.65.1.1/32", "vxlan.calico", 0),
        gw("10.66.2.0/26", "vxlan.calico", "10.66.2.1"),
        gw("10.66.1.0/26", "eth0", "192.168.1.2"),
        gw("10.67.1.0/26", "eth0", "192.168.1.2"),
        KernelRoute {
            dst: c("10.65.0.0/26"),
            target: RouteTarget::Blackhole,
            priority: 0,
            src: None,
        },
    ];
    want.sort_by_key(KernelRoute::key);
    assert_eq!(got.routes, want, "{:#?}", got.routes);
    assert_eq!(
        got.skipped,
        vec![
            (c("10.68.1.0/26"), SkipReason::IpipUnsupported),
            (
                c("10.65.9.0/26"),
                SkipReason::NoVtep {
                    node: "novtep".into()
                }
            ),
            (
                c("10.67.9.0/26"),
                SkipReason::NoNodeAddress {
                    node: "noaddr".into()
                }
            ),
        ]
    );

    // Without a parent device, the direct routes wait.
    let mut ctx = RouteContext::new("a", &pools);
    ctx.program_noencap = true;
    let got = desired_routes(&routes, &endpoints, &vteps, &ctx);
    assert!(
        got.skipped
            .contains(&(c("10.67.1.0/26"), SkipReason::NoParentDevice))
    );
    assert!(!got.routes.iter().any(|r| r.dst == c("10.67.1.0/26")));
}

#[test]
fn ipv6_routes_use_the_v6_device_and_addresses() {
    let pools = vec![pool("fd00:65::/48", EncapMode::Always, EncapMode::Never)];
    let routes = vec![route(
        "fd00:65:0:1::/122",
        REMOTE_WORKLOAD,
        PoolType::Vxlan,
        "b",
        "fd00:1::2",
    )];
    let mut v = vtep("b", "10.65.1.1", "192.168.1.2");
    v.ipv6_addr = Some(ip("fd00:65:0:1::"));
    v.parent_device_ipv6 = Some(ip("fd00:1::2"));
    v.mac_v6 = "66:00:00:00:00:02".into();
    let endpoints = vec![("cali1".to_string(), vec![c("fd00:65::5/128")])];
    let ctx = RouteContext::new("a", &pools);
    let got = desired_routes(&routes, &endpoints, &[v], &ctx);
    assert_eq!(
        got.routes,
        vec![
            dev("fd00:65::5/128", "cali1", 1024),
            gw("fd00:65:0:1::/122", "vxlan-v6.calico", "fd00:65:0:1::"),
        ]
    );
    // IPv6 metric 0 is filed by the kernel as 1024.
    assert_eq!(got.routes[1].key().priority, 1024);
}

#[test]
fn device_route_source_address_goes_on_routes_through_interfaces() {
    let pools = vec![pool("10.65.0.0/16", EncapMode::Always, EncapMode::Never)];
    let routes = vec![
        route(
            "10.65.1.0/26",
            REMOTE_WORKLOAD,
            PoolType::Vxlan,
            "b",
            "192.168.1.2",
        ),
        route(
            "10.65.0.0/26",
            LOCAL_WORKLOAD,
            PoolType::Vxlan,
            "a",
            "192.168.1.1",
        ),
    ];
    let endpoints = vec![
        ("cali1".to_string(), vec![c("10.65.0.5/32")]),
        ("cali2".to_string(), vec![c("fd00:65::5/128")]),
    ];
    let mut ctx = RouteContext::new("a", &pools);
    ctx.source_v4 = Some(ip("192.168.1.1"));
    ctx.source_v6 = Some(ip("fd00:1::1"));
    let got = desired_routes(
        &routes,
        &endpoints,
        &[vtep("b", "10.65.1.1", "192.168.1.2")],
        &ctx,
    );
    let src = |dst: &str| got.routes.iter().find(|r| r.dst == c(dst)).unwrap().src;
    assert_eq!(src("10.65.0.5/32"), Some(ip("192.168.1.1")));
    assert_eq!(src("fd00:65::5/128"), Some(ip("fd00:1::1")));
    assert_eq!(src("10.65.1.0/26"), Some(ip("192.168.1.1")));
    assert_eq!(src("10.65.0.0/26"), None, "a blackhole has no source");
    // Unset: no hint at all (the kernel chooses).
    let plain = desired_routes(&[], &endpoints, &[], &RouteContext::new("a", &[]));
    assert!(plain.routes.iter().all(|r| r.src.is_none()));
}

#[test]
fn duplicates_keep_the_first_and_are_reported() {
    let endpoints = vec![
        ("cali1".to_string(), vec![c("10.65.0.5/32")]),
        (
            "cali2".to_string(),
            vec![c("10.65.0.5/32"), c("10.65.0.6/32")],
        ),
        (String::new(), vec![c("10.65.0.7/32")]),
    ];
    let got = desired_routes(&[], &endpoints, &[], &RouteContext::new("a", &[]));
    assert_eq!(
        got.routes,
        vec![
            dev("10.65.0.5/32", "cali1", 1024),
            dev("10.65.0.6/32", "cali2", 1024)
        ]
    );
    assert_eq!(
        got.skipped,
        vec![(c("10.65.0.5/32"), SkipReason::Duplicate)]
    );
}

#[test]
fn state_follows_messages() {
    use std::sync::Arc;
    let mut st = RoutingState::new("a");
    let r = route(
        "10.65.1.0/26",
        REMOTE_WORKLOAD,
        PoolType::Vxlan,
        "b",
        "192.168.1.2",
    );
    assert!(st.on_message(&Message::RouteUpdate(r.clone())));
    assert!(st.on_message(&Message::VtepUpdate(vtep("b", "10.65.1.1", "192.168.1.2"))));
    assert!(st.on_message(&Message::VtepUpdate(vtep("a", "10.65.0.1", "192.168.1.1"))));
    let id = WorkloadEndpointId {
        orchestrator: "k8s".into(),
        workload: "ns/pod".into(),
        endpoint: "eth0".into(),
    };
    let ep = margay_calc::WorkloadEndpointData {
        interface: "cali1".into(),
        mac: String::new(),
        ipv4_nets: vec![c("10.65.0.5/32")],
        ipv6_nets: vec![],
        profile_ids: vec![],
        tiers: vec![],
        name: "pod".into(),
        namespace: "ns".into(),
        allow_spoofed_source_prefixes: vec![],
    };
    assert!(st.on_message(&Message::WorkloadEndpointUpdate {
        id: id.clone(),
        endpoint: Arc::new(ep),
    }));
    assert!(!st.on_message(&Message::IpSetRemove { id: "x".into() }));
    assert!(st.on_message(&Message::Encapsulation {
        ipip: false,
        vxlan: true,
        vxlan_v6: false
    }));
    assert!(!st.in_sync());
    st.on_message(&Message::InSync);
    assert!(st.in_sync() && st.vxlan_enabled());
    assert_eq!(st.my_ipv4(), Some(ip("192.168.1.1")));
    let d = st.desired_routes(&RouteContext::new("ignored", &[]));
    assert_eq!(
        d.routes,
        vec![
            dev("10.65.0.5/32", "cali1", 1024),
            gw("10.65.1.0/26", "vxlan.calico", "10.65.1.1"),
        ]
    );
    st.on_message(&Message::WorkloadEndpointRemove { id });
    st.on_message(&Message::RouteRemove { dst: r.dst });
    assert!(
        st.desired_routes(&RouteContext::new("a", &[]))
            .routes
            .is_empty()
    );
}

#[test]
fn messages_carry_protocol_80_and_the_right_shape() {
    let m = route_message(&gw("10.65.1.0/26", "vxlan.calico", "10.65.1.1"), Some(7));
    assert_eq!(u8::from(m.header.protocol), 80);
    assert_eq!(m.header.table, RouteHeader::RT_TABLE_MAIN);
    assert!(m.header.flags.contains(RouteFlags::Onlink));
    assert_eq!(m.header.scope, RouteScope::Universe);
    assert!(m.attributes.contains(&RouteAttribute::Oif(7)));
    let m = route_message(&dev("10.65.0.5/32", "cali1", 1024), Some(3));
    assert_eq!(m.header.scope, RouteScope::Link);
    assert!(m.attributes.contains(&RouteAttribute::Priority(1024)));
    let o = parse_route(&m).unwrap();
    assert!(same(&dev("10.65.0.5/32", "cali1", 1024), Some(3), &o));
    assert!(!same(&dev("10.65.0.5/32", "cali1", 1024), Some(4), &o));
    // DeviceRouteSourceAddress: the source hint goes into the message and is compared.
    let mut with_src = dev("10.65.0.5/32", "cali1", 1024);
    with_src.src = Some(ip("192.0.2.1"));
    assert!(
        !same(&with_src, Some(3), &o),
        "a route without the hint is not the wanted one"
    );
    let o2 = parse_route(&route_message(&with_src, Some(3))).unwrap();
    assert_eq!(o2.src, Some(ip("192.0.2.1")));
    assert!(same(&with_src, Some(3), &o2));
    assert!(
        with_src.to_string().contains(" src 192.0.2.1 "),
        "{with_src}"
    );
    let d = delete_message(&o);
    assert_eq!(u8::from(d.header.protocol), 80);
}

fn obs(dst: &str, priority: u32, protocol: u8, oif: u32) -> Observed {
    Observed {
        key: RouteKey {
            dst: c(dst),
            priority,
        },
        tos: 0,
        protocol,
        kind: RouteType::Unicast,
        scope: RouteScope::Link,
        oif: Some(oif),
        gateway: None,
        onlink: false,
        src: None,
    }
}

const BOOT: u8 = 3;

#[test]
fn the_plan_takes_over_workload_routes_and_nothing_else() {
    let index_of: HashMap<&str, u32> = [("eth0", 2), ("cali1", 3), ("cali2", 4), ("caliother", 5)]
        .into_iter()
        .collect();
    let workloads = vec![
        (
            "cali1".to_string(),
            vec![c("10.65.0.5/32"), c("fd00:65::5/128")],
        ),
        (
            "cali2".to_string(),
            vec![c("10.65.0.6/32"), c("10.65.0.8/32")],
        ),
    ];
    let desired = vec![
        dev("10.65.0.5/32", "cali1", 1024),
        dev("10.65.0.6/32", "cali2", 1024),
        dev("10.65.0.8/32", "cali2", 1024),
        dev("fd00:65::5/128", "cali1", 1024),
    ];
    let cni_v4 = obs("10.65.0.5/32", 0, BOOT, 3);
    let cni_v4_b = obs("10.65.0.6/32", 0, BOOT, 4);
    let cni_blocked = obs("10.65.0.8/32", 0, BOOT, 4);
    // IPv6 stores the CNI plugin's metric 0 as 1024: margay's key.
    let cni_v6 = obs("fd00:65::5/128", 1024, BOOT, 3);
    let stale_mine = obs("10.65.0.5/32", 512, ROUTE_PROTOCOL, 3);
    let kernel = vec![
        cni_v4.clone(),
        // Same destination through an interface that is no local workload's, even
        // though its name looks like one: someone else's.
        obs("10.65.0.5/32", 7, BOOT, 5),
        obs("10.65.0.5/32", 9, BOOT, 2),
        // BIRD's and protocol 0 are never taken over, even through a workload interface.
        obs("10.65.0.5/32", 33, BIRD_PROTOCOL, 3),
        obs("10.65.0.5/32", 44, 0, 3),
        // Through a workload interface, but not to that workload's address.
        obs("10.65.9.9/32", 0, BOOT, 3),
        obs("10.65.0.6/32", 5, BOOT, 3),
        obs("10.65.0.6/32", 1024, ROUTE_PROTOCOL, 4),
        cni_v4_b.clone(),
        // Someone else holds margay's key for 10.65.0.8 elsewhere: a conflict, and the
        // CNI plugin's route to it must stay (margay's cannot go in).
        obs("10.65.0.8/32", 1024, BOOT, 2),
        cni_blocked.clone(),
        cni_v6.clone(),
        stale_mine.clone(),
    ];
    let plan = plan_routes(&desired, &kernel, &index_of, &workloads, true);
    let key = |d: &str, p: u32| RouteKey {
        dst: c(d),
        priority: p,
    };
    assert_eq!(
        plan.unchanged,
        [key("10.65.0.6/32", 1024)].into_iter().collect()
    );
    assert_eq!(
        plan.writes,
        vec![
            RouteWrite {
                route: dev("10.65.0.5/32", "cali1", 1024),
                oif: Some(3),
                replacing: false,
            },
            RouteWrite {
                route: dev("fd00:65::5/128", "cali1", 1024),
                oif: Some(3),
                replacing: true,
            },
        ]
    );
    assert_eq!(plan.conflicts, vec![dev("10.65.0.8/32", "cali2", 1024)]);
    assert_eq!(
        plan.removals,
        vec![
            Removal {
                route: stale_mine,
                kind: RemovalKind::Unwanted
            },
            Removal {
                route: cni_v4,
                kind: RemovalKind::TakenOver(c("10.65.0.5/32"))
            },
            Removal {
                route: cni_v4_b,
                kind: RemovalKind::TakenOver(c("10.65.0.6/32"))
            },
            Removal {
                route: cni_blocked,
                kind: RemovalKind::TakenOver(c("10.65.0.8/32"))
            },
            Removal {
                route: cni_v6.clone(),
                kind: RemovalKind::TakenOver(c("fd00:65::5/128"))
            },
        ]
    );
    assert!(plan.missing_interfaces.is_empty() && plan.waiting == 0);
    // The delete carries the taken-over route's own protocol, so the kernel cannot match
    // margay's route (or BIRD's) to the same destination with it.
    let del = delete_message(&plan.removals[1].route);
    assert_eq!(u8::from(del.header.protocol), BOOT);

    // Add first, then delete: a taken-over route goes only once margay's route to its
    // destination is in (unchanged, or written by this apply).
    let in_place: BTreeSet<Cidr> = [c("10.65.0.6/32"), c("10.65.0.5/32")].into_iter().collect();
    let written: BTreeSet<RouteKey> = [key("10.65.0.5/32", 1024)].into_iter().collect();
    let due: Vec<bool> = plan
        .removals
        .iter()
        .map(|r| removal_due(r.kind, &written, &in_place))
        .collect();
    // The IPv6 write failed: its taken-over route stays too.
    assert_eq!(due, [true, true, true, false, false]);
    let replaced = key("10.65.0.7/32", 0);
    assert!(!removal_due(
        RemovalKind::ReplacedBy(replaced),
        &[replaced].into_iter().collect(),
        &in_place
    ));
    assert!(removal_due(
        RemovalKind::ReplacedBy(replaced),
        &BTreeSet::new(),
        &in_place
    ));

    // Without IPv6, IPv6 routes are neither written nor taken over.
    let plan = plan_routes(&desired, &kernel, &index_of, &workloads, false);
    assert_eq!(plan.writes.len(), 1);
    assert!(!plan.removals.iter().any(|r| r.route == cni_v6));

    // Not a local workload (no endpoint for it): its interface is no one's to take over.
    let plan = plan_routes(&desired, &kernel, &index_of, &workloads[1..], true);
    assert!(
        !plan
            .removals
            .iter()
            .any(|r| r.route.oif == Some(3) && r.kind != RemovalKind::Unwanted),
        "{:#?}",
        plan.removals
    );
    assert!(
        plan.writes
            .iter()
            .any(|w| w.route.dst == c("10.65.0.5/32") && !w.replacing)
    );
    // fd00:65::5 now has a foreign route with margay's key: a conflict, as before.
    assert!(
        plan.conflicts
            .contains(&dev("fd00:65::5/128", "cali1", 1024))
    );
}

#[test]
fn display_reads_like_ip_route() {
    assert_eq!(
        gw("10.65.1.0/26", "vxlan.calico", "10.65.1.1").to_string(),
        "10.65.1.0/26 via 10.65.1.1 dev vxlan.calico onlink proto 80 metric 0"
    );
    assert_eq!(
        dev("10.65.0.5/32", "cali1", 1024).to_string(),
        "10.65.0.5/32 dev cali1 scope link proto 80 metric 1024"
    );
}
