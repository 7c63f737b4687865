//! The route manager owns protocol-80 routes only.

use super::*;

#[test]
fn route_manager_owns_only_protocol_80_routes() {
    if !root() {
        return;
    }
    let ns = Netns::new("routes").unwrap();
    ns.add_veth("eth0", "eth0-peer", &["192.168.50.1/24", "fd00:50::1/64"])
        .unwrap();
    ns.add_veth("cali1", "cali1-peer", &[]).unwrap();
    // Routes margay does not own, some on the very prefixes it will want.
    ns.ip(&[
        "route",
        "add",
        "10.65.1.0/26",
        "via",
        "192.168.50.2",
        "table",
        "100",
    ])
    .unwrap();
    ns.ip(&[
        "route",
        "add",
        "10.65.2.0/26",
        "via",
        "192.168.50.3",
        "proto",
        "static",
    ])
    .unwrap();
    // cali1 is not given to the manager as a local workload's interface here, so this route
    // is someone else's (taking over workload routes: `cni_route_is_taken_over_…`).
    ns.ip(&[
        "route",
        "add",
        "10.65.0.5/32",
        "dev",
        "cali1",
        "proto",
        "boot",
    ])
    .unwrap();
    ns.ip(&["route", "add", "10.99.0.0/24", "via", "192.168.50.4"])
        .unwrap();
    // A stale route of margay's (protocol 80) that nobody wants any more.
    ns.ip(&[
        "route",
        "add",
        "10.98.0.0/24",
        "via",
        "192.168.50.5",
        "proto",
        "80",
    ])
    .unwrap();
    let foreign = |ns: &Netns| {
        let main = ns.ip(&["route", "show"]).unwrap();
        assert!(
            has_line(&main, "10.65.2.0/26 via 192.168.50.3 dev eth0 proto static"),
            "{main}"
        );
        assert!(has_line(&main, "10.65.0.5 dev cali1 scope link"), "{main}");
        assert!(
            has_line(&main, "10.99.0.0/24 via 192.168.50.4 dev eth0"),
            "{main}"
        );
        let t100 = ns.ip(&["route", "show", "table", "100"]).unwrap();
        assert!(
            has_line(&t100, "10.65.1.0/26 via 192.168.50.2 dev eth0"),
            "{t100}"
        );
    };

    let desired = vec![
        dev("10.65.0.5/32", "cali1", 1024),
        via("10.65.1.0/26", "eth0", "192.168.50.2"),
        // Same destination and metric as the foreign `proto static` route: a conflict.
        via("10.65.2.0/26", "eth0", "192.168.50.2"),
        KernelRoute {
            dst: c("10.65.0.0/26"),
            target: RouteTarget::Blackhole,
            priority: 0,
            src: None,
        },
        // Its interface does not exist yet.
        dev("10.65.0.6/32", "cali2", 1024),
        dev("fd00:65::5/128", "cali1", 1024),
        via("fd00:65:0:1::/122", "eth0", "fd00:50::2"),
    ];
    let mut mgr = RouteManager::new(true);
    let (r, mut mgr) = in_ns(&ns, {
        let desired = desired.clone();
        move || (mgr.apply(&desired, &[]).unwrap(), mgr)
    });
    assert_eq!(
        (r.added, r.replaced, r.removed, r.unchanged, r.errors),
        (5, 0, 1, 0, 0),
        "{r:#?}"
    );
    assert_eq!(
        r.conflicts,
        vec![RouteKey {
            dst: c("10.65.2.0/26"),
            priority: 0
        }]
    );
    assert_eq!(r.missing_interfaces.iter().collect::<Vec<_>>(), ["cali2"]);
    assert_eq!(r.waiting, 1);
    assert!(r.needs_retry());
    let ours = ns.ip(&["route", "show", "proto", "80"]).unwrap();
    for want in [
        "blackhole 10.65.0.0/26",
        "10.65.0.5 dev cali1 scope link metric 1024",
        "10.65.1.0/26 via 192.168.50.2 dev eth0 onlink",
    ] {
        assert!(has_line(&ours, want), "{want:?} in\n{ours}");
    }
    assert_eq!(ours.lines().count(), 3, "{ours}");
    let ours6 = ns.ip(&["-6", "route", "show", "proto", "80"]).unwrap();
    assert!(
        has_line(&ours6, "fd00:65::5 dev cali1 metric 1024 pref medium"),
        "{ours6}"
    );
    assert!(
        has_line(
            &ours6,
            "fd00:65:0:1::/122 via fd00:50::2 dev eth0 metric 1024 onlink pref medium"
        ),
        "{ours6}"
    );
    foreign(&ns);

    // Nothing changed: nothing to do (IPv6's metric 0 reads back as 1024 and still matches).
    let (r, mut mgr) = in_ns(&ns, {
        let desired = desired.clone();
        move || (mgr.apply(&desired, &[]).unwrap(), mgr)
    });
    assert_eq!(
        (r.added, r.replaced, r.removed, r.unchanged),
        (0, 0, 0, 5),
        "{r:#?}"
    );

    // The missing interface appears: its route goes in.
    ns.add_veth("cali2", "cali2-peer", &[]).unwrap();
    let (r, mut mgr) = in_ns(&ns, {
        let desired = desired.clone();
        move || (mgr.apply(&desired, &[]).unwrap(), mgr)
    });
    assert_eq!((r.added, r.waiting), (1, 0), "{r:#?}");
    assert!(r.missing_interfaces.is_empty());

    // A next hop changes (replaced in place), the blackhole is no longer wanted, and a
    // route is deleted behind margay's back (drift: put back).
    ns.ip(&[
        "route",
        "del",
        "10.65.0.5/32",
        "dev",
        "cali1",
        "proto",
        "80",
        "metric",
        "1024",
    ])
    .unwrap();
    let mut changed: Vec<KernelRoute> = desired
        .iter()
        .filter(|r| r.target != RouteTarget::Blackhole)
        .cloned()
        .collect();
    changed[1] = via("10.65.1.0/26", "eth0", "192.168.50.9");
    let (r, mut mgr) = in_ns(&ns, move || (mgr.apply(&changed, &[]).unwrap(), mgr));
    assert_eq!(
        (r.added, r.replaced, r.removed, r.unchanged),
        (1, 1, 1, 3),
        "{r:#?}"
    );
    let ours = ns.ip(&["route", "show", "proto", "80"]).unwrap();
    assert!(
        has_line(&ours, "10.65.1.0/26 via 192.168.50.9 dev eth0 onlink"),
        "{ours}"
    );
    assert!(!ours.contains("blackhole"), "{ours}");
    foreign(&ns);

    // Nothing wanted: every protocol-80 route goes, nothing else does.
    let (r, _) = in_ns(&ns, move || (mgr.apply(&[], &[]).unwrap(), mgr));
    assert_eq!(r.removed, 5, "{r:#?}");
    assert_eq!(ns.ip(&["route", "show", "proto", "80"]).unwrap(), "");
    assert_eq!(ns.ip(&["-6", "route", "show", "proto", "80"]).unwrap(), "");
    foreign(&ns);
}
