//! What the routing driver leaves alone or takes over: other interface kinds, BIRD's
//! routes, the CNI plugin's routes.

use super::*;

#[test]
fn an_interface_of_another_kind_under_the_vxlan_name_is_never_deleted() {
    if !root() {
        return;
    }
    let ns = Netns::new("vxlanname").unwrap();
    ns.add_veth("eth0", "eth0-peer", &["192.168.61.1/24"])
        .unwrap();
    ns.add_veth("vxlan.calico", "vxlan-peer", &[]).unwrap();
    let vteps = vec![vtep("a", "10.70.0.1", "192.168.61.1")];
    let errors = in_ns(&ns, move || {
        let mut mgr = VxlanManager::new(VxlanConfig::v4());
        [true, false].map(|enabled| {
            mgr.apply(enabled, "a", &vteps)
                .map(|r| format!("{r:?}"))
                .unwrap_err()
                .to_string()
        })
    });
    for e in errors {
        assert!(e.contains("not a VXLAN device"), "{e}");
    }
    assert!(
        ns.ip(&["-d", "link", "show", "vxlan.calico"])
            .unwrap()
            .contains("veth")
    );
}

/// Route ownership with BIRD: a no-encap pool's remote block is BIRD's (`proto bird`, as BIRD
/// installs what it learns over BGP). Felix neither programs it nor deletes BIRD's route —
/// not on the first apply, not on a forced refresh, not when the block's route goes away —
/// while its own VXLAN routes are programmed and cleaned as usual.
#[test]
fn felix_leaves_bird_routes_of_no_encap_pools_alone() {
    if !root() {
        return;
    }
    let ns = Netns::new("birdown").unwrap();
    ns.add_veth("eth0", "eth0-peer", &["192.168.72.1/24"])
        .unwrap();
    // What BIRD installs for the other node's block and for a prefix it learned elsewhere
    // (protocol 12 is "bird" in /etc/iproute2/rt_protos).
    for (dst, via) in [
        ("10.72.1.0/26", "192.168.72.2"),
        ("10.99.0.0/24", "192.168.72.3"),
    ] {
        ns.ip(&[
            "route", "add", dst, "via", via, "proto", "bird", "metric", "32",
        ])
        .unwrap();
    }
    let node = |name: &str, ip: &str| {
        res(&format!(
            "apiVersion: projectcalico.org/v3\nkind: Node\nmetadata:\n  name: {name}\nspec:\n  bgp:\n    ipv4Address: {ip}\n"
        ))
    };
    let noencap = res(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: flat}\nspec: {cidr: 10.72.0.0/16, vxlanMode: Never, ipipMode: Never, blockSize: 26}",
    );
    let mut graph = CalcGraph::new(CalcConfig {
        hostname: "nodea".into(),
        route_source: RouteSource::CalicoIpam,
    });
    for r in [
        node("nodea", "192.168.72.1/24"),
        node("nodeb", "192.168.72.2/24"),
        noencap.clone(),
    ] {
        graph.on_update(&r.key(), Some(r));
    }
    graph.on_ipam_block(c("10.72.0.0/26"), Some("nodea".into()));
    graph.on_ipam_block(c("10.72.1.0/26"), Some("nodeb".into()));
    graph.on_in_sync();
    let batch = graph.flush();
    let mut routing = Routing::new(RoutingConfig::new("nodea"));
    // Calico's default (ProgramClusterRoutes EnabledIPIPOnly): no-encap routes are BIRD's.
    assert!(!RoutingConfig::new("nodea").program_noencap_routes);
    let (report, mut routing) = in_ns(&ns, move || {
        routing.on_messages(&batch);
        (routing.apply().unwrap(), routing)
    });
    assert!(
        report.applied && !report.routes.needs_retry(),
        "{report:#?}"
    );
    let bird = |ns: &Netns| ns.ip(&["route", "show", "proto", "bird"]).unwrap();
    let ours = |ns: &Netns| ns.ip(&["route", "show", "proto", "80"]).unwrap();
    let want_bird = [
        "10.72.1.0/26 via 192.168.72.2 dev eth0 metric 32",
        "10.99.0.0/24 via 192.168.72.3 dev eth0 metric 32",
    ];
    for w in want_bird {
        assert!(has_line(&bird(&ns), w), "{w:?} in\n{}", bird(&ns));
    }
    // Felix has only the local block's blackhole: the remote no-encap block is not its.
    assert!(!ours(&ns).contains("10.72.1.0/26"), "{}", ours(&ns));
    assert!(
        has_line(&ours(&ns), "blackhole 10.72.0.0/26"),
        "{}",
        ours(&ns)
    );
    assert!(
        !report.skipped.iter().any(|(d, _)| *d == c("10.72.1.0/26")),
        "a BIRD-owned block is not a skipped route: {:?}",
        report.skipped
    );

    // The block goes away and the pool becomes VXLAN and back: every apply (including the
    // cleanup of Felix's own routes) leaves BIRD's routes in place.
    graph.on_ipam_block(c("10.72.1.0/26"), None);
    let vx = res(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: flat}\nspec: {cidr: 10.72.0.0/16, vxlanMode: Always, blockSize: 26}",
    );
    graph.on_update(&vx.key(), Some(vx));
    let b1 = graph.flush();
    graph.on_update(&noencap.key(), Some(noencap.clone()));
    let b2 = graph.flush();
    let (reports, _) = in_ns(&ns, move || {
        let mut out = Vec::new();
        for b in [b1, b2] {
            routing.on_messages(&b);
            out.push(routing.apply().unwrap());
        }
        (out, routing)
    });
    for r in &reports {
        assert!(r.applied, "{r:#?}");
    }
    for w in want_bird {
        assert!(
            has_line(&bird(&ns), w),
            "{w:?} after cleanup in\n{}",
            bird(&ns)
        );
    }
}

/// The route-ownership invariant for workload interfaces: the CNI plugin's route to a pod
/// (`ip route add <pod>/32 dev caliX`: metric 0, protocol boot) is replaced by Felix's
/// (metric 1024, protocol 80), so the node holds exactly one route to the pod through its
/// interface — and nothing else is touched: the same destination through an interface that is
/// no local workload's, another destination through the workload's interface, BIRD's routes.
#[test]
fn cni_route_is_taken_over_through_workload_interfaces_only() {
    if !root() {
        return;
    }
    let ns = Netns::new("cnitake").unwrap();
    ns.add_veth("eth0", "eth0-peer", &["192.168.73.1/24"])
        .unwrap();
    ns.add_veth("calia", "calia-peer", &[]).unwrap();
    // Named like a workload interface, but no local endpoint uses it.
    ns.add_veth("caliother", "caliother-peer", &[]).unwrap();
    let cni_add = |ns: &Netns| {
        // Exactly what the CNI plugin does (ip's defaults are the plugin's: proto boot,
        // metric 0, scope link); IPv6 stores metric 0 as 1024.
        ns.ip(&["route", "add", "10.73.0.5/32", "dev", "calia"])
            .unwrap();
    };
    cni_add(&ns);
    ns.ip(&["-6", "route", "add", "fd00:73::5/128", "dev", "calia"])
        .unwrap();
    for args in [
        // The pod's address through interfaces that are no local workload's.
        &[
            "route",
            "add",
            "10.73.0.5/32",
            "dev",
            "caliother",
            "metric",
            "7",
        ][..],
        &[
            "route",
            "add",
            "10.73.0.5/32",
            "via",
            "192.168.73.9",
            "dev",
            "eth0",
            "metric",
            "9",
        ],
        // Another destination through the workload's interface.
        &["route", "add", "10.73.9.9/32", "dev", "calia"],
        // BIRD's: the other node's block and the same /32 (learned over BGP).
        &[
            "route",
            "add",
            "10.73.1.0/26",
            "via",
            "192.168.73.2",
            "proto",
            "bird",
            "metric",
            "32",
        ],
        &[
            "route",
            "add",
            "10.73.0.5/32",
            "via",
            "192.168.73.2",
            "proto",
            "bird",
            "metric",
            "32",
        ],
    ] {
        ns.ip(args).unwrap();
    }
    let untouched = |ns: &Netns| {
        let main = ns.ip(&["route", "show"]).unwrap();
        for want in [
            "10.73.0.5 dev caliother scope link metric 7",
            "10.73.0.5 via 192.168.73.9 dev eth0 metric 9",
            "10.73.9.9 dev calia scope link",
            "10.73.1.0/26 via 192.168.73.2 dev eth0 proto bird metric 32",
            "10.73.0.5 via 192.168.73.2 dev eth0 proto bird metric 32",
        ] {
            assert!(has_line(&main, want), "{want:?} in\n{main}");
        }
    };
    let through_calia = |ns: &Netns| -> (Vec<String>, Vec<String>) {
        let pick = |text: String, dst: &str| -> Vec<String> {
            text.lines()
                .map(str::trim)
                .filter(|l| l.starts_with(&format!("{dst} ")) && l.contains(" dev calia "))
                .map(String::from)
                .collect()
        };
        (
            pick(ns.ip(&["route", "show"]).unwrap(), "10.73.0.5"),
            pick(ns.ip(&["-6", "route", "show"]).unwrap(), "fd00:73::5"),
        )
    };
    let (v4, v6) = through_calia(&ns);
    assert_eq!(v4, ["10.73.0.5 dev calia scope link"]);
    assert_eq!(v6, ["fd00:73::5 dev calia metric 1024 pref medium"]);

    let node = res(
        "apiVersion: projectcalico.org/v3\nkind: Node\nmetadata:\n  name: nodea\nspec:\n  bgp:\n    ipv4Address: 192.168.73.1/24\n",
    );
    let pool = res(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: flat}\nspec: {cidr: 10.73.0.0/16, vxlanMode: Never, ipipMode: Never, blockSize: 26}",
    );
    let wep = res("apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: nodea-k8s-poda-eth0
  namespace: default
spec:
  orchestrator: k8s
  node: nodea
  pod: poda
  endpoint: eth0
  interfaceName: calia
  ipNetworks: [10.73.0.5/32, fd00:73::5/128]
  profiles: [kns.default]");
    let mut graph = CalcGraph::new(CalcConfig {
        hostname: "nodea".into(),
        route_source: RouteSource::CalicoIpam,
    });
    for r in [node, pool, wep] {
        graph.on_update(&r.key(), Some(r));
    }
    graph.on_ipam_block(c("10.73.0.0/26"), Some("nodea".into()));
    graph.on_in_sync();
    let batch = graph.flush();
    let mut cfg = RoutingConfig::new("nodea");
    cfg.ipv6 = true;
    let routing = Routing::new(cfg);
    let apply = |ns: &Netns, mut routing: Routing, batch: Vec<Message>| {
        in_ns(ns, move || {
            routing.on_messages(&batch);
            (routing.apply().unwrap(), routing)
        })
    };
    let (report, routing) = apply(&ns, routing, batch);
    let r = &report.routes;
    assert!(report.applied && !r.needs_retry(), "{report:#?}");
    // Added: the pod's IPv4 route and the block's blackhole; the IPv6 CNI route has Felix's
    // key, so it is replaced in place; the IPv4 one is taken over (deleted) after the add.
    assert_eq!(
        (r.added, r.replaced, r.taken_over, r.removed, r.errors),
        (2, 1, 1, 0, 0),
        "{r:#?}"
    );
    assert!(r.conflicts.is_empty(), "{r:#?}");
    let (v4, v6) = through_calia(&ns);
    assert_eq!(v4, ["10.73.0.5 dev calia proto 80 scope link metric 1024"]);
    assert_eq!(
        v6,
        ["fd00:73::5 dev calia proto 80 metric 1024 pref medium"]
    );
    untouched(&ns);

    // Converged: the next apply changes nothing.
    let (report, routing) = apply(&ns, routing, vec![]);
    let r = &report.routes;
    assert!(!r.changed() && r.unchanged == 3, "{r:#?}");

    // The CNI plugin adds its route again (a repeated ADD): taken over again.
    cni_add(&ns);
    let (report, _) = apply(&ns, routing, vec![]);
    let r = &report.routes;
    assert_eq!(
        (r.added, r.replaced, r.taken_over, r.removed, r.unchanged),
        (0, 0, 1, 0, 3),
        "{r:#?}"
    );
    let (v4, v6) = through_calia(&ns);
    assert_eq!(v4, ["10.73.0.5 dev calia proto 80 scope link metric 1024"]);
    assert_eq!(v6.len(), 1, "{v6:?}");
    untouched(&ns);
}
