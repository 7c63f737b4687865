use super::*;

struct FakeNet {
    ifaces: Vec<InterfaceInfo>,
    /// (destination network, source address); longest prefix wins.
    routes: Vec<(Cidr, IpAddr)>,
}

impl NetView for FakeNet {
    fn interfaces(&self) -> io::Result<Vec<InterfaceInfo>> {
        Ok(self.ifaces.clone())
    }
    fn route_source(&self, dest: IpAddr) -> io::Result<IpAddr> {
        self.routes
            .iter()
            .filter(|(n, _)| n.contains(dest))
            .max_by_key(|(n, _)| n.prefix())
            .map(|(_, s)| *s)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NetworkUnreachable, "unreachable"))
    }
}

fn iface(index: u32, name: &str, addrs: &[&str]) -> InterfaceInfo {
    InterfaceInfo {
        name: name.to_string(),
        index,
        up: true,
        addrs: addrs.iter().map(|a| Cidr::parse(a).unwrap()).collect(),
    }
}

fn net(ifaces: Vec<InterfaceInfo>) -> FakeNet {
    FakeNet {
        ifaces,
        routes: Vec::new(),
    }
}

fn detect(m: &str, family: Family, n: &FakeNet) -> Result<Detection, AutodetectError> {
    autodetect(&Method::parse(m).unwrap(), family, n, &[])
}

fn ok(m: &str, family: Family, n: &FakeNet) -> (String, String) {
    let d = detect(m, family, n).unwrap();
    (d.interface, d.address.to_string())
}

fn s(a: &str, b: &str) -> (String, String) {
    (a.to_string(), b.to_string())
}

/// A typical host: lo, two NICs, and the interfaces Calico must skip, all holding addresses.
fn host() -> FakeNet {
    net(vec![
        iface(1, "lo", &["127.0.0.1/8", "::1/128"]),
        iface(
            2,
            "eth0",
            &["10.0.0.5/24", "2001:db8:0:1::5/64", "fe80::1/64"],
        ),
        iface(3, "eth1", &["192.168.50.7/24", "fe80::2/64"]),
        iface(4, "docker0", &["172.17.0.1/16"]),
        iface(5, "cali12345abcd", &["10.9.9.9/32"]),
        iface(6, "veth0abc", &["10.8.8.8/24"]),
        iface(7, "vxlan.calico", &["10.244.1.0/32"]),
        iface(8, "tunl0", &["10.244.2.1/32"]),
        iface(9, "br-1a2b3c4d", &["172.18.0.1/16"]),
        iface(10, "kube-ipvs0", &["10.96.0.1/32"]),
        iface(11, "wireguard.cali", &["10.244.3.1/32"]),
        iface(12, "nodelocaldns", &["169.254.20.10/32"]),
        iface(13, "cni0", &["10.244.0.1/24"]),
        iface(14, "flannel.1", &["10.244.0.0/32"]),
        iface(15, "lo2", &["10.1.1.1/32"]),
    ])
}

#[test]
fn parse_methods() {
    assert_eq!(Method::parse("").unwrap(), Method::FirstFound);
    assert_eq!(Method::parse("first-found").unwrap(), Method::FirstFound);
    assert_eq!(
        Method::parse("interface=eth0, ens.* ,bond0").unwrap(),
        Method::Interface(vec!["eth0".into(), "ens.*".into(), "bond0".into()])
    );
    assert_eq!(
        Method::parse("skip-interface=eth1").unwrap(),
        Method::SkipInterface(vec!["eth1".into()])
    );
    assert_eq!(
        Method::parse("cidr=10.0.0.0/8 , 2001:db8::/32").unwrap(),
        Method::Cidr(vec![
            Cidr::parse("10.0.0.0/8").unwrap(),
            Cidr::parse("2001:db8::/32").unwrap()
        ])
    );
    assert_eq!(
        Method::parse("can-reach=www.example.com").unwrap(),
        Method::CanReach("www.example.com".into())
    );
    assert_eq!(
        Method::parse("kubernetes-internal-ip").unwrap(),
        Method::KubernetesInternalIp
    );
    // Calico matches this one by prefix.
    assert_eq!(
        Method::parse("kubernetes-internal-ip-whatever").unwrap(),
        Method::KubernetesInternalIp
    );
    // An empty regex item is kept (it matches everything), like Calico.
    assert_eq!(
        Method::parse("interface=").unwrap(),
        Method::Interface(vec![String::new()])
    );
    for m in [
        "first-found",
        "interface=eth0,eth1",
        "skip-interface=eth1",
        "cidr=10.0.0.0/8,192.168.0.0/16",
        "can-reach=8.8.8.8",
        "kubernetes-internal-ip",
    ] {
        assert_eq!(Method::parse(m).unwrap().to_string(), m);
    }
}

#[test]
fn unknown_method_lists_valid_ones() {
    for m in [
        "bogus",
        "First-Found",
        " first-found",
        "first-found=x",
        "interface",
    ] {
        let e = Method::parse(m).unwrap_err();
        assert!(matches!(e, AutodetectError::UnknownMethod { .. }), "{m}");
        let msg = e.to_string();
        assert!(msg.contains(&format!("{m:?}")), "{msg}");
        for v in [
            "first-found",
            "interface=",
            "skip-interface=",
            "cidr=",
            "can-reach=",
            "kubernetes-internal-ip",
        ] {
            assert!(msg.contains(v), "{msg} lacks {v}");
        }
    }
}

#[test]
fn bad_regex_and_cidr_name_the_item() {
    let e = Method::parse("interface=eth0,eth[").unwrap_err();
    assert!(matches!(&e, AutodetectError::InvalidRegex { regex, .. } if regex == "eth["));
    assert!(e.to_string().contains("\"eth[\""), "{e}");
    let e = Method::parse("skip-interface=(x").unwrap_err();
    assert!(e.to_string().contains("\"(x\""), "{e}");
    for (m, bad) in [
        ("cidr=10.0.0.0/8,10.0.0.300/8", "10.0.0.300/8"),
        ("cidr=10.0.0.1", "10.0.0.1"),
        ("cidr=10.0.0.0/33", "10.0.0.0/33"),
        ("cidr=", ""),
    ] {
        let e = Method::parse(m).unwrap_err();
        assert!(
            matches!(&e, AutodetectError::InvalidCidr { cidr, .. } if cidr == bad),
            "{m}: {e}"
        );
        assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
    }
    assert!(matches!(
        Method::parse("can-reach=").unwrap_err(),
        AutodetectError::MissingDestination
    ));
}

#[test]
fn first_found_skips_excluded_names_and_picks_highest_index() {
    let n = host();
    // eth1 has the highest index of the eligible interfaces: Calico walks backwards.
    assert_eq!(
        ok("first-found", Family::V4, &n),
        s("eth1", "192.168.50.7/24")
    );
    assert_eq!(ok("", Family::V4, &n), s("eth1", "192.168.50.7/24"));
    let d = detect("first-found", Family::V4, &n).unwrap();
    let all = d.decisions.join("\n");
    for (name, pat) in [
        ("docker0", "^docker.*"),
        ("cali12345abcd", "^cali.*"),
        ("veth0abc", "^veth.*"),
        ("vxlan.calico", "^vxlan\\.calico.*"),
        ("tunl0", "^tunl.*"),
        ("br-1a2b3c4d", "^br-.*"),
        ("kube-ipvs0", "^kube-ipvs.*"),
        ("wireguard.cali", "^wireguard\\.cali.*"),
        ("nodelocaldns", "^nodelocaldns.*"),
        ("cni0", "^cni.*"),
        ("flannel.1", "^flannel.*"),
        ("lo2", "^lo"),
    ] {
        let line = d
            .decisions
            .iter()
            .find(|l| l.contains(&format!("interface {name} ")))
            .unwrap_or_else(|| panic!("no decision for {name}:\n{all}"));
        assert!(line.contains("skipped"), "{line}");
        assert!(line.contains(pat), "{line}");
        assert!(line.contains("default exclusion list"), "{line}");
    }
    assert!(
        all.contains("interface eth1 (index 3): chose 192.168.50.7/24"),
        "{all}"
    );
    assert!(
        all.contains("not examined, an address was already chosen: eth0"),
        "{all}"
    );
}

#[test]
fn interfaces_are_ordered_by_index_whatever_the_view_returns() {
    let mut n = host();
    n.ifaces.reverse();
    assert_eq!(
        ok("first-found", Family::V4, &n),
        s("eth1", "192.168.50.7/24")
    );
}

#[test]
fn exclusion_list_is_anchored_at_start_only() {
    // "ibmveth" must not be skipped by ^veth.*; "mycali" not by ^cali.*.
    let n = net(vec![
        iface(1, "lo", &["127.0.0.1/8"]),
        iface(2, "ibmvetha", &["10.0.0.2/24"]),
        iface(3, "mycali", &["10.0.0.3/24"]),
    ]);
    assert_eq!(
        ok("first-found", Family::V4, &n),
        s("mycali", "10.0.0.3/24")
    );
    let n = net(vec![
        iface(1, "lo", &["127.0.0.1/8"]),
        iface(2, "ibmvetha", &["10.0.0.2/24"]),
    ]);
    assert_eq!(
        ok("first-found", Family::V4, &n),
        s("ibmvetha", "10.0.0.2/24")
    );
}

#[test]
fn first_found_passes_over_loopback_link_local_and_multicast() {
    let n = net(vec![
        iface(1, "eth0", &["10.0.0.5/24"]),
        iface(
            2,
            "eth1",
            &["169.254.3.3/16", "127.0.0.2/8", "224.0.0.5/32", "0.0.0.0/0"],
        ),
    ]);
    let d = detect("first-found", Family::V4, &n).unwrap();
    assert_eq!(
        (d.interface.as_str(), d.address.to_string()),
        ("eth0", "10.0.0.5/24".into())
    );
    let all = d.decisions.join("\n");
    assert!(
        all.contains("passed over 169.254.3.3/16: link-local address"),
        "{all}"
    );
    assert!(
        all.contains("passed over 127.0.0.2/8: loopback address"),
        "{all}"
    );
    assert!(
        all.contains("passed over 224.0.0.5/32: multicast address"),
        "{all}"
    );
    assert!(
        all.contains("passed over 0.0.0.0/0: unspecified address"),
        "{all}"
    );
}

#[test]
fn down_interfaces_are_not_skipped_like_calico() {
    let mut n = net(vec![
        iface(2, "eth0", &["10.0.0.5/24"]),
        iface(3, "eth1", &["10.0.1.5/24"]),
    ]);
    n.ifaces[1].up = false;
    let d = detect("first-found", Family::V4, &n).unwrap();
    assert_eq!(d.interface, "eth1");
    assert!(
        d.decisions.iter().any(|l| l.contains("is down")),
        "{:?}",
        d.decisions
    );
}

#[test]
fn interface_without_family_address_is_skipped() {
    let n = host();
    // eth1 has only a link-local IPv6 address; eth0 has a global one.
    let d = detect("first-found", Family::V6, &n).unwrap();
    assert_eq!(
        (d.interface.as_str(), d.address.to_string()),
        ("eth0", "2001:db8:0:1::5/64".into())
    );
    let all = d.decisions.join("\n");
    assert!(
        all.contains("interface eth1 (index 3): passed over fe80::2/64: link-local"),
        "{all}"
    );
    let n = net(vec![
        iface(2, "eth0", &["10.0.0.5/24"]),
        iface(3, "eth1", &["2001:db8::1/64"]),
    ]);
    let d = detect("first-found", Family::V4, &n).unwrap();
    assert_eq!(d.interface, "eth0");
    assert!(
        d.decisions
            .iter()
            .any(|l| l == "interface eth1 (index 3): skipped: no IPv4 address"),
        "{:?}",
        d.decisions
    );
}

#[test]
fn ipv6_link_local_only_fails_with_explanation() {
    let n = net(vec![
        iface(1, "lo", &["127.0.0.1/8", "::1/128"]),
        iface(2, "eth0", &["10.0.0.5/24", "fe80::1/64"]),
    ]);
    let e = detect("first-found", Family::V6, &n).unwrap_err();
    assert!(matches!(e, AutodetectError::NoAddress { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("no usable IPv6 address on interfaces eth0"),
        "{msg}"
    );
    assert!(
        e.decisions()
            .iter()
            .any(|l| l.contains("fe80::1/64: link-local")),
        "{:?}",
        e.decisions()
    );
}

#[test]
fn ipv6_ula_and_global_are_usable() {
    let n = net(vec![iface(2, "eth0", &["fe80::1/64", "fd00:1::5/64"])]);
    assert_eq!(ok("first-found", Family::V6, &n), s("eth0", "fd00:1::5/64"));
}

fn n2_only_eth() -> FakeNet {
    net(vec![
        iface(1, "lo", &["127.0.0.1/8"]),
        iface(2, "eth0", &["10.0.0.5/24"]),
    ])
}

#[test]
fn interface_regexes() {
    let n = host();
    assert_eq!(
        ok("interface=^eth0$", Family::V4, &n),
        s("eth0", "10.0.0.5/24")
    );
    // A list: any may match; the highest index wins.
    assert_eq!(
        ok("interface=^eth0$,^eth1$", Family::V4, &n),
        s("eth1", "192.168.50.7/24")
    );
    assert_eq!(
        ok("interface=^eth.*", Family::V4, &n),
        s("eth1", "192.168.50.7/24")
    );
    // Unanchored, as in Calico: "eth0" also matches veth0abc (index 6 > 2), which wins.
    assert_eq!(
        ok("interface=eth0", Family::V4, &n),
        s("veth0abc", "10.8.8.8/24")
    );
    assert_eq!(
        ok("interface=h0", Family::V4, &n2_only_eth()),
        s("eth0", "10.0.0.5/24")
    );
    // No default exclusion list with interface=.
    assert_eq!(
        ok("interface=docker", Family::V4, &n),
        s("docker0", "172.17.0.1/16")
    );
    // "eth0" also matches "veth0abc" (unanchored) and that one has a higher index.
    let n2 = net(vec![
        iface(2, "eth0", &["10.0.0.5/24"]),
        iface(3, "veth0abc", &["10.8.8.8/24"]),
    ]);
    assert_eq!(
        ok("interface=eth0", Family::V4, &n2),
        s("veth0abc", "10.8.8.8/24")
    );
    assert_eq!(
        ok("interface=^eth0$", Family::V4, &n2),
        s("eth0", "10.0.0.5/24")
    );
    // Link-local still never chosen.
    let d = detect("interface=eth1", Family::V6, &n).unwrap_err();
    assert!(matches!(d, AutodetectError::NoAddress { .. }), "{d}");
    let d = detect("interface=^eth0$", Family::V4, &n).unwrap();
    assert!(
        d.decisions
            .iter()
            .any(|l| l.contains("eth1")
                && l.contains("does not match any interface= regex (^eth0$)")),
        "{:?}",
        d.decisions
    );
}

#[test]
fn interface_regex_matching_nothing_lists_interfaces_seen() {
    let n = net(vec![
        iface(1, "lo", &["127.0.0.1/8"]),
        iface(2, "eth0", &["10.0.0.5/24"]),
    ]);
    let e = detect("interface=eth9", Family::V4, &n).unwrap_err();
    assert!(matches!(e, AutodetectError::NoInterface { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("interface=eth9"), "{msg}");
    assert!(msg.contains("interfaces seen: eth0, lo"), "{msg}");
}

#[test]
fn skip_interface() {
    let n = host();
    assert_eq!(
        ok("skip-interface=eth1", Family::V4, &n),
        s("eth0", "10.0.0.5/24")
    );
    assert_eq!(
        ok("skip-interface=eth2, eth1", Family::V4, &n),
        s("eth0", "10.0.0.5/24")
    );
    let d = detect("skip-interface=eth1", Family::V4, &n).unwrap();
    let all = d.decisions.join("\n");
    assert!(
        all.contains("eth1 (index 3): skipped: name matches skip-interface= regex eth1"),
        "{all}"
    );
    // The default list still applies.
    assert!(
        all.contains("docker0 (index 4): skipped: name matches ^docker.*"),
        "{all}"
    );
    // Skipping everything eligible.
    let e = detect("skip-interface=eth", Family::V4, &n).unwrap_err();
    assert!(matches!(e, AutodetectError::NoInterface { .. }), "{e}");
}

#[test]
fn cidr_across_interfaces() {
    let n = host();
    assert_eq!(
        ok("cidr=10.0.0.0/16", Family::V4, &n),
        s("eth0", "10.0.0.5/24")
    );
    assert_eq!(
        ok("cidr=10.0.0.0/16,192.168.0.0/16", Family::V4, &n),
        s("eth1", "192.168.50.7/24")
    );
    // cidr= has no exclusion list: docker0 is found (Calico does the same).
    assert_eq!(
        ok("cidr=172.17.0.0/16", Family::V4, &n),
        s("docker0", "172.17.0.1/16")
    );
    // Picks the matching address on an interface with several.
    let n2 = net(vec![iface(2, "eth0", &["10.0.0.5/24", "192.168.7.7/24"])]);
    assert_eq!(
        ok("cidr=192.168.0.0/16", Family::V4, &n2),
        s("eth0", "192.168.7.7/24")
    );
    // IPv6.
    assert_eq!(
        ok("cidr=2001:db8::/32", Family::V6, &n),
        s("eth0", "2001:db8:0:1::5/64")
    );
    // Link-local addresses are never chosen, even when inside the CIDR.
    let e = detect("cidr=fe80::/10", Family::V6, &n).unwrap_err();
    assert!(matches!(e, AutodetectError::NoAddress { .. }), "{e}");
    let e = detect("cidr=203.0.113.0/24", Family::V4, &n).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("inside 203.0.113.0/24"), "{msg}");
    assert!(
        e.decisions()
            .iter()
            .any(|l| l.contains("passed over 192.168.50.7/24: not inside any of 203.0.113.0/24")),
        "{:?}",
        e.decisions()
    );
}

#[test]
fn first_found_with_everything_excluded() {
    let n = net(vec![
        iface(1, "lo", &["127.0.0.1/8"]),
        iface(2, "docker0", &["172.17.0.1/16"]),
    ]);
    let e = detect("first-found", Family::V4, &n).unwrap_err();
    assert!(matches!(e, AutodetectError::NoInterface { .. }), "{e}");
    assert!(
        e.to_string().contains("interfaces seen: docker0, lo"),
        "{e}"
    );
}

fn routed_host() -> FakeNet {
    let mut n = host();
    n.routes = vec![
        (
            Cidr::parse("0.0.0.0/0").unwrap(),
            "10.0.0.5".parse().unwrap(),
        ),
        (
            Cidr::parse("203.0.113.0/24").unwrap(),
            "192.168.50.7".parse().unwrap(),
        ),
        (
            Cidr::parse("127.0.0.0/8").unwrap(),
            "127.0.0.1".parse().unwrap(),
        ),
        (
            Cidr::parse("2001:db8::/32").unwrap(),
            "2001:db8:0:1::5".parse().unwrap(),
        ),
        (Cidr::parse("::1/128").unwrap(), "::1".parse().unwrap()),
    ];
    n
}

#[test]
fn can_reach_uses_interface_of_route_source() {
    let n = routed_host();
    assert_eq!(
        ok("can-reach=203.0.113.9", Family::V4, &n),
        s("eth1", "192.168.50.7/24")
    );
    assert_eq!(
        ok("can-reach=8.8.8.8", Family::V4, &n),
        s("eth0", "10.0.0.5/24")
    );
    assert_eq!(
        ok("can-reach=2001:db8:ffff::1", Family::V6, &n),
        s("eth0", "2001:db8:0:1::5/64")
    );
    let d = detect("can-reach=203.0.113.9", Family::V4, &n).unwrap();
    let all = d.decisions.join("\n");
    assert!(
        all.contains("the kernel would send to 203.0.113.9 from 192.168.50.7"),
        "{all}"
    );
    assert!(
        all.contains("interface eth1 (index 3): chose 192.168.50.7/24"),
        "{all}"
    );
    // No global-unicast filter and no exclusion list: loopback is found on lo.
    assert_eq!(
        ok("can-reach=127.0.0.1", Family::V4, &n),
        s("lo", "127.0.0.1/8")
    );
}

#[test]
fn can_reach_resolves_hostnames() {
    let n = routed_host();
    // "localhost" resolves without DNS (/etc/hosts or the resolver's built-in).
    match detect("can-reach=localhost", Family::V4, &n) {
        Ok(d) => assert_eq!(
            (d.interface.as_str(), d.address.to_string()),
            ("lo", "127.0.0.1/8".into())
        ),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn can_reach_errors() {
    let n = routed_host();
    let e = detect("can-reach=2001:db8::1", Family::V4, &n).unwrap_err();
    assert!(
        matches!(e, AutodetectError::NoAddressOfFamily { .. }),
        "{e}"
    );
    assert!(
        e.to_string().contains("2001:db8::1 is an IPv6 address"),
        "{e}"
    );
    let e = detect("can-reach=fd00::1", Family::V6, &n).unwrap_err();
    assert!(matches!(e, AutodetectError::NoRoute { .. }), "{e}");
    let e = detect("can-reach=no-such-host.invalid", Family::V4, &n).unwrap_err();
    assert!(matches!(e, AutodetectError::Resolve { .. }), "{e}");
    let mut n2 = routed_host();
    n2.routes = vec![(
        Cidr::parse("0.0.0.0/0").unwrap(),
        "10.77.0.1".parse().unwrap(),
    )];
    let e = detect("can-reach=8.8.8.8", Family::V4, &n2).unwrap_err();
    assert!(matches!(e, AutodetectError::SourceNotLocal { .. }), "{e}");
    assert!(e.to_string().contains("10.77.0.1"), "{e}");
}

#[test]
fn kubernetes_internal_ip_takes_the_interface_prefix_of_the_nodes_internal_ip() {
    let n = host();
    let ips: Vec<IpAddr> = vec![
        "2001:db8:0:1::5".parse().unwrap(),
        "192.168.50.7".parse().unwrap(),
        "10.0.0.5".parse().unwrap(),
    ];
    let m = Method::parse("kubernetes-internal-ip").unwrap();
    // The first of the family, even when another interface comes first in Calico's order.
    let d = autodetect(&m, Family::V4, &n, &ips).unwrap();
    assert_eq!(
        (d.interface.as_str(), d.address.to_string().as_str()),
        ("eth1", "192.168.50.7/24")
    );
    let d = autodetect(&m, Family::V6, &n, &ips).unwrap();
    assert_eq!(d.address.to_string(), "2001:db8:0:1::5/64");
    // Interfaces Calico's other methods skip are searched too.
    let d = autodetect(&m, Family::V4, &n, &["172.17.0.1".parse().unwrap()]).unwrap();
    assert_eq!(
        (d.interface.as_str(), d.address.to_string().as_str()),
        ("docker0", "172.17.0.1/16")
    );
}

#[test]
fn kubernetes_internal_ip_fails_without_a_local_internal_ip_of_the_family() {
    let n = host();
    let m = Method::parse("kubernetes-internal-ip").unwrap();
    let e = autodetect(&m, Family::V6, &n, &["10.0.0.5".parse().unwrap()]).unwrap_err();
    assert!(matches!(e, AutodetectError::NoInternalIp { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("no IPv6 InternalIP (it has: 10.0.0.5)")
            && msg.contains("DATASTORE_TYPE=kubernetes"),
        "{msg}"
    );
    let e = autodetect(&m, Family::V4, &n, &[]).unwrap_err();
    assert!(e.to_string().contains("it has: none"), "{e}");
    let e = autodetect(&m, Family::V4, &n, &["10.1.2.3".parse().unwrap()]).unwrap_err();
    assert!(
        matches!(e, AutodetectError::InternalIpNotLocal { .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("InternalIP 10.1.2.3 is on none of this host's interfaces"),
        "{e}"
    );
}

#[test]
fn interface_holding_finds_prefix() {
    let n = host();
    let got = interface_holding("192.168.50.7".parse().unwrap(), &n).unwrap();
    assert_eq!(
        got,
        Some(("eth1".to_string(), Cidr::parse("192.168.50.7/24").unwrap()))
    );
    let got = interface_holding("2001:db8:0:1::5".parse().unwrap(), &n).unwrap();
    assert_eq!(
        got,
        Some((
            "eth0".to_string(),
            Cidr::parse("2001:db8:0:1::5/64").unwrap()
        ))
    );
    // Any interface, excluded names included.
    let got = interface_holding("172.17.0.1".parse().unwrap(), &n).unwrap();
    assert_eq!(got.unwrap().0, "docker0");
    assert_eq!(
        interface_holding("10.99.0.1".parse().unwrap(), &n).unwrap(),
        None
    );
}

#[test]
fn default_exclusions_compile_and_match() {
    assert_eq!(
        default_exclusions().len(),
        DEFAULT_INTERFACES_TO_EXCLUDE.len()
    );
    assert!(excluded_by_default("docker0"));
    assert!(excluded_by_default("lo"));
    assert!(excluded_by_default("vxlan-v6.calico"));
    assert!(excluded_by_default("wg-v6.cali"));
    assert!(excluded_by_default("podman1"));
    assert!(excluded_by_default("virbr0"));
    assert!(excluded_by_default("lxcbr0"));
    assert!(excluded_by_default("cbr0"));
    assert!(excluded_by_default("dummy0"));
    assert!(!excluded_by_default("eth0"));
    assert!(!excluded_by_default("ibmveth0"));
    assert!(!excluded_by_default("vxlan0calico"));
    assert!(!excluded_by_default("ens3"));
    assert_eq!(default_exclusion_match("cali1"), Some("^cali.*"));
}

#[test]
fn split_list_like_calico() {
    assert_eq!(split_list("a"), vec!["a"]);
    assert_eq!(split_list("a , b,\tc"), vec!["a", "b", "c"]);
    assert_eq!(split_list(" a ,b "), vec![" a", "b "]);
    assert_eq!(split_list("a,,b"), vec!["a", "", "b"]);
    assert_eq!(split_list(""), vec![""]);
}

#[test]
fn global_unicast_classification() {
    let g = |s: &str| not_global_unicast(s.parse().unwrap());
    assert_eq!(g("10.0.0.1"), None);
    assert_eq!(g("100.64.0.1"), None);
    assert_eq!(g("255.255.255.255"), Some("broadcast address"));
    assert_eq!(g("fe80::1"), Some("link-local address"));
    assert_eq!(g("febf::1"), Some("link-local address"));
    assert_eq!(g("fec0::1"), None);
    assert_eq!(g("ff02::1"), Some("multicast address"));
    assert_eq!(g("::"), Some("unspecified address"));
    assert_eq!(g("::ffff:127.0.0.1"), Some("loopback address"));
}
