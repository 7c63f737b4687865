use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn spec() -> DeviceSpec {
    DeviceSpec {
        name: "vxlan.calico".into(),
        vni: 4096,
        port: 4789,
        mac: [0x66, 1, 2, 3, 4, 5],
        parent_index: 2,
        local: ip("192.168.1.1"),
        mtu: 1450,
        address: Cidr::parse("10.65.0.1/32").unwrap(),
    }
}

fn state() -> DeviceState {
    DeviceState {
        index: 9,
        is_vxlan: true,
        vni: Some(4096),
        port: Some(4789),
        parent_index: Some(2),
        local: Some(ip("192.168.1.1")),
        learning: Some(false),
        mac: vec![0x66, 1, 2, 3, 4, 5],
        mtu: 1450,
        up: true,
        addresses: vec![Cidr::parse("10.65.0.1/32").unwrap()],
    }
}

#[test]
fn a_missing_device_is_created_with_its_address() {
    assert_eq!(
        device_actions(&spec(), None),
        vec![
            DeviceAction::Create,
            DeviceAction::AddAddress(spec().address)
        ]
    );
}

#[test]
fn a_correct_device_is_left_alone() {
    assert!(device_actions(&spec(), Some(&state())).is_empty());
}

#[test]
fn mtu_state_and_addresses_are_fixed_in_place() {
    let mut s = state();
    s.mtu = 1300;
    s.up = false;
    s.addresses = vec![Cidr::parse("10.65.9.9/32").unwrap()];
    assert_eq!(
        device_actions(&spec(), Some(&s)),
        vec![
            DeviceAction::SetMtu(1450),
            DeviceAction::SetUp,
            DeviceAction::RemoveAddress(Cidr::parse("10.65.9.9/32").unwrap()),
            DeviceAction::AddAddress(spec().address),
        ]
    );
}

#[test]
fn identity_changes_recreate_the_device() {
    type Change = Box<dyn Fn(&mut DeviceState)>;
    let cases: Vec<(&str, Change)> = vec![
        ("VNI", Box::new(|s| s.vni = Some(1))),
        ("UDP port", Box::new(|s| s.port = Some(8472))),
        ("parent", Box::new(|s| s.parent_index = Some(3))),
        (
            "local address",
            Box::new(|s| s.local = Some(ip("192.168.1.9"))),
        ),
        ("learning", Box::new(|s| s.learning = Some(true))),
        ("MAC", Box::new(|s| s.mac = vec![0x66, 0, 0, 0, 0, 0])),
        ("not a VXLAN", Box::new(|s| s.is_vxlan = false)),
    ];
    for (what, change) in cases {
        let mut s = state();
        change(&mut s);
        let actions = device_actions(&spec(), Some(&s));
        assert!(
            matches!(&actions[0], DeviceAction::Delete { reason } if reason.contains(what)),
            "{what}: {actions:?}"
        );
        assert_eq!(actions[1], DeviceAction::Create, "{what}");
    }
}

fn vtep(node: &str, mac: &str, tunnel: &str, parent: &str) -> Vtep {
    Vtep {
        node: node.into(),
        mac: mac.into(),
        ipv4_addr: Some(ip(tunnel)),
        parent_device_ip: Some(ip(parent)),
        mac_v6: String::new(),
        ipv6_addr: None,
        parent_device_ipv6: None,
    }
}

#[test]
fn l2_entries_for_remote_vteps_only() {
    let vteps = vec![
        vtep("a", "66:00:00:00:00:0a", "10.65.0.1", "192.168.1.1"),
        vtep("b", "66:00:00:00:00:0b", "10.65.1.1", "192.168.1.2"),
        vtep("c", "not-a-mac", "10.65.2.1", "192.168.1.3"),
        vtep("d", "66:00:00:00:00:0b", "10.65.3.1", "192.168.1.4"),
        vtep("e", "66:00:00:00:00:0e", "10.65.1.1", "192.168.1.5"),
    ];
    let d = desired_l2(&vteps, "a", IpFamily::V4);
    let mac_b = [0x66, 0, 0, 0, 0, 0x0b];
    assert_eq!(
        d.arp,
        vec![ArpEntry {
            ip: ip("10.65.1.1"),
            mac: mac_b
        }]
    );
    assert_eq!(
        d.fdb,
        vec![FdbEntry {
            mac: mac_b,
            dst: ip("192.168.1.2")
        }]
    );
    let nodes: Vec<&str> = d.problems.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(nodes, vec!["c", "d", "e"]);
    // No IPv6 VTEPs here.
    assert_eq!(desired_l2(&vteps, "a", IpFamily::V6), L2Desired::default());
}

#[test]
fn arp_diff_replaces_wrong_entries_and_removes_only_permanent_strays() {
    let mac_b = [0x66, 0, 0, 0, 0, 0x0b];
    let want = vec![
        ArpEntry {
            ip: ip("10.65.1.1"),
            mac: mac_b,
        },
        ArpEntry {
            ip: ip("10.65.2.1"),
            mac: [0x66, 0, 0, 0, 0, 0x0c],
        },
        ArpEntry {
            ip: ip("10.65.3.1"),
            mac: [0x66, 0, 0, 0, 0, 0x0d],
        },
    ];
    let seen = vec![
        // Right.
        ObservedArp {
            ip: ip("10.65.1.1"),
            mac: mac_b.to_vec(),
            permanent: true,
        },
        // Wrong MAC.
        ObservedArp {
            ip: ip("10.65.2.1"),
            mac: mac_b.to_vec(),
            permanent: true,
        },
        // Learned by the kernel, not permanent.
        ObservedArp {
            ip: ip("10.65.3.1"),
            mac: vec![0x66, 0, 0, 0, 0, 0x0d],
            permanent: false,
        },
        // A VTEP that went away.
        ObservedArp {
            ip: ip("10.65.9.1"),
            mac: mac_b.to_vec(),
            permanent: true,
        },
        // The kernel's own, not ours to delete.
        ObservedArp {
            ip: ip("10.65.8.1"),
            mac: vec![],
            permanent: false,
        },
    ];
    let (add, remove) = diff_arp(&want, &seen);
    assert_eq!(add, want[1..].to_vec());
    assert_eq!(remove, vec![ip("10.65.9.1")]);
}

#[test]
fn fdb_diff_moves_entries() {
    let mac = [0x66, 0, 0, 0, 0, 0x0b];
    let want = vec![FdbEntry {
        mac,
        dst: ip("192.168.1.2"),
    }];
    let seen = vec![
        FdbEntry {
            mac,
            dst: ip("192.168.1.7"),
        },
        FdbEntry {
            mac: [0x66, 0, 0, 0, 0, 0x0f],
            dst: ip("192.168.1.9"),
        },
    ];
    let (add, remove) = diff_fdb(&want, &seen);
    assert_eq!(add, want);
    assert_eq!(remove, seen);
    let (add, remove) = diff_fdb(&want, &want);
    assert!(add.is_empty() && remove.is_empty());
}

#[test]
fn local_vtep_picks_the_family() {
    let mut v = vtep("a", "66:00:00:00:00:0a", "10.65.0.1", "192.168.1.1");
    assert_eq!(
        local_vtep(std::slice::from_ref(&v), "a", IpFamily::V4),
        Some((
            ip("10.65.0.1"),
            "66:00:00:00:00:0a".into(),
            ip("192.168.1.1")
        ))
    );
    assert_eq!(
        local_vtep(std::slice::from_ref(&v), "a", IpFamily::V6),
        None
    );
    v.ipv6_addr = Some(ip("fd00:65::1"));
    v.parent_device_ipv6 = Some(ip("fd00:1::1"));
    v.mac_v6 = "66:00:00:00:01:0a".into();
    assert_eq!(
        local_vtep(&[v], "a", IpFamily::V6),
        Some((
            ip("fd00:65::1"),
            "66:00:00:00:01:0a".into(),
            ip("fd00:1::1")
        ))
    );
}

#[test]
fn the_link_message_says_what_calico_configures() {
    let m = vxlan_link_message(&spec());
    let infos = m
        .attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::LinkInfo(i) => Some(i),
            _ => None,
        })
        .unwrap();
    let data = infos
        .iter()
        .find_map(|i| match i {
            LinkInfo::Data(InfoData::Vxlan(d)) => Some(d),
            _ => None,
        })
        .unwrap();
    for want in [
        InfoVxlan::Id(4096),
        InfoVxlan::Port(4789),
        InfoVxlan::Learning(false),
        InfoVxlan::Link(2),
        InfoVxlan::Local("192.168.1.1".parse().unwrap()),
    ] {
        assert!(data.contains(&want), "{want:?} in {data:?}");
    }
    assert!(m.attributes.contains(&LinkAttribute::Mtu(1450)));
    assert!(m.header.flags.contains(LinkFlags::Up));
}
