//! The VXLAN manager keeps the device and its neighbours.

use super::*;

#[test]
fn vxlan_manager_maintains_the_device_and_its_neighbours() {
    if !root() {
        return;
    }
    let ns = Netns::new("vxlan").unwrap();
    ns.add_veth("eth0", "eth0-peer", &["192.168.60.1/24"])
        .unwrap();
    let mut vteps = vec![
        vtep("a", "10.70.0.1", "192.168.60.1"),
        vtep("b", "10.70.1.1", "192.168.60.2"),
        vtep("c", "10.70.2.1", "192.168.60.3"),
    ];
    let (mac_a, mac_b, mac_c) = (
        vxlan_mac_for_node("a"),
        vxlan_mac_for_node("b"),
        vxlan_mac_for_node("c"),
    );
    let apply = |ns: &Netns, mgr: VxlanManager, enabled: bool, vteps: &[Vtep]| {
        let vteps = vteps.to_vec();
        in_ns(ns, move || {
            let mut mgr = mgr;
            (mgr.apply(enabled, "a", &vteps).unwrap(), mgr)
        })
    };
    let neighbours = |ns: &Netns| {
        (
            ns.ip(&["neigh", "show", "dev", "vxlan.calico"]).unwrap(),
            sh(ns, "bridge", &["fdb", "show", "dev", "vxlan.calico"]),
        )
    };

    let (r, mgr) = apply(&ns, VxlanManager::new(VxlanConfig::v4()), true, &vteps);
    assert_eq!(r.device, DeviceChange::Created, "{r:#?}");
    assert_eq!((r.parent.as_deref(), r.mtu), (Some("eth0"), 1450));
    assert_eq!((r.arp_added, r.fdb_added), (2, 2), "{r:#?}");
    let link = ns.ip(&["-d", "link", "show", "vxlan.calico"]).unwrap();
    for want in [
        "mtu 1450",
        &format!("link/ether {mac_a}"),
        "vxlan id 4096 local 192.168.60.1 dev eth0",
        "dstport 4789",
        "nolearning",
        "state UNKNOWN",
    ] {
        assert!(link.contains(want), "{want:?} in\n{link}");
    }
    let addr = ns.ip(&["-4", "addr", "show", "vxlan.calico"]).unwrap();
    assert!(addr.contains("inet 10.70.0.1/32"), "{addr}");
    let (arp, fdb) = neighbours(&ns);
    assert!(
        has_line(&arp, &format!("10.70.1.1 lladdr {mac_b} PERMANENT")),
        "{arp}"
    );
    assert!(
        has_line(&arp, &format!("10.70.2.1 lladdr {mac_c} PERMANENT")),
        "{arp}"
    );
    assert!(
        has_line(&fdb, &format!("{mac_b} dst 192.168.60.2 self permanent")),
        "{fdb}"
    );
    assert!(
        has_line(&fdb, &format!("{mac_c} dst 192.168.60.3 self permanent")),
        "{fdb}"
    );

    // Again: nothing to do.
    let (r, mgr) = apply(&ns, mgr, true, &vteps);
    assert_eq!(r.device, DeviceChange::Unchanged, "{r:#?}");
    assert_eq!((r.arp_added, r.fdb_added, r.l2_unchanged), (0, 0, 4));

    // Node c goes away: its entries go.
    vteps.pop();
    let (r, mgr) = apply(&ns, mgr, true, &vteps);
    assert_eq!((r.arp_removed, r.fdb_removed), (1, 1), "{r:#?}");
    let (arp, fdb) = neighbours(&ns);
    assert!(
        !arp.contains("10.70.2.1") && !fdb.contains(&mac_c),
        "{arp}{fdb}"
    );

    // Drift: deleted entries, MTU, a stray address, and the device down (which also flushes
    // its neighbours) are all repaired.
    ns.ip(&["neigh", "del", "10.70.1.1", "dev", "vxlan.calico"])
        .unwrap();
    sh(
        &ns,
        "bridge",
        &[
            "fdb",
            "del",
            &mac_b,
            "dev",
            "vxlan.calico",
            "dst",
            "192.168.60.2",
        ],
    );
    ns.ip(&["link", "set", "vxlan.calico", "mtu", "1300"])
        .unwrap();
    ns.ip(&["addr", "add", "10.70.9.9/32", "dev", "vxlan.calico"])
        .unwrap();
    ns.ip(&["link", "set", "vxlan.calico", "down"]).unwrap();
    let (r, mgr) = apply(&ns, mgr, true, &vteps);
    assert!(
        matches!(&r.device, DeviceChange::Updated { changes } if changes.len() == 3),
        "{r:#?}"
    );
    assert_eq!((r.arp_added, r.fdb_added), (1, 1), "{r:#?}");
    let link = ns.ip(&["link", "show", "vxlan.calico"]).unwrap();
    assert!(link.contains("mtu 1450") && link.contains(",UP"), "{link}");
    let addr = ns.ip(&["-4", "addr", "show", "vxlan.calico"]).unwrap();
    assert!(!addr.contains("10.70.9.9"), "{addr}");
    let (arp, fdb) = neighbours(&ns);
    assert!(arp.contains(&mac_b) && fdb.contains(&mac_b), "{arp}{fdb}");

    // A different VNI: the device is made again.
    drop(mgr);
    let cfg = VxlanConfig {
        vni: 4097,
        ..VxlanConfig::v4()
    };
    let (r, mgr) = apply(&ns, VxlanManager::new(cfg), true, &vteps);
    assert!(
        matches!(&r.device, DeviceChange::Recreated { reason } if reason.contains("VNI")),
        "{r:#?}"
    );
    assert!(
        ns.ip(&["-d", "link", "show", "vxlan.calico"])
            .unwrap()
            .contains("vxlan id 4097")
    );
    let (arp, _) = neighbours(&ns);
    assert!(arp.contains(&mac_b), "{arp}");

    // VXLAN no longer used: the device goes.
    let (r, _) = apply(&ns, mgr, false, &vteps);
    assert_eq!(r.device, DeviceChange::Removed);
    assert!(ns.ip(&["link", "show", "vxlan.calico"]).is_err());
}
