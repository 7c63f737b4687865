#![allow(clippy::unwrap_used)]
//! Address autodetection against real interfaces, read through netlink by `SystemNet`, inside
//! throw-away network namespaces.
//!
//! Needs root (CI runs as root). Without root each test fails, unless MARGAY_SKIP_ROOT_TESTS=1.
//!
//! How it works: the test (outside) creates a namespace `mgy-autodetect-<pid>-<n>`, builds the
//! interfaces in it (veth pairs, both ends inside), then re-runs this test binary inside the
//! namespace with `ip netns exec NS <exe> <test> --exact` and [`INNER_ENV`] set; that run (inside)
//! does the detection and the assertions. The namespace is deleted when the test ends, pass or
//! fail. Nothing is configured outside the namespaces.

use std::fs::File;
use std::io::{self, Read, Seek};
use std::net::IpAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use margay_api::net::Cidr;
use margay_node::autodetect::{
    AutodetectError, Detection, Family, Method, NetView, autodetect, interface_holding,
};
use margay_node::system_net::SystemNet;
use margay_testkit::netns::{Netns, is_root};

/// Set (to the test's name) in the run inside the namespace.
const INNER_ENV: &str = "MARGAY_AUTODETECT_NETNS_INNER";
/// How long the run inside the namespace may take.
const INNER_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `inner` inside a fresh namespace prepared by `setup` (see the module docs).
fn in_netns(test: &str, setup: impl FnOnce(&Netns) -> io::Result<()>, inner: impl FnOnce()) {
    if let Ok(which) = std::env::var(INNER_ENV) {
        if which == test {
            inner();
        }
        return;
    }
    if !is_root() {
        if std::env::var("MARGAY_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
            eprintln!("{test}: skipped, needs root (MARGAY_SKIP_ROOT_TESTS=1)");
            return;
        }
        panic!(
            "{test} needs root (it creates network namespaces); run as root, or set \
             MARGAY_SKIP_ROOT_TESTS=1 to skip it"
        );
    }
    let ns = Netns::new("autodetect").unwrap();
    setup(&ns).unwrap_or_else(|e| panic!("setting up {}: {e}", ns.name()));

    let mut stdout = tempfile::tempfile().unwrap();
    let mut stderr = tempfile::tempfile().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = ns
        .exec(&exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(INNER_ENV, test)
        .stdin(Stdio::null())
        .stdout(stdout.try_clone().unwrap())
        .stderr(stderr.try_clone().unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + INNER_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |f: &mut File| {
        let mut s = String::new();
        f.rewind().unwrap();
        f.read_to_string(&mut s).unwrap();
        s
    };
    let (out, err) = (read(&mut stdout), read(&mut stderr));
    // Captured by the harness: shown on failure or with --nocapture.
    println!("--- inside {}:\n{out}{err}", ns.name());
    let addrs = ns.ip(&["addr"]).unwrap_or_default();
    match status {
        None => panic!(
            "{test}: the run inside {} timed out after {INNER_TIMEOUT:?}\n--- stdout\n{out}\n--- \
             stderr\n{err}",
            ns.name()
        ),
        Some(s) if !s.success() => panic!(
            "{test}: the run inside {} failed ({s})\n--- stdout\n{out}\n--- stderr\n{err}\n--- \
             ip addr in the namespace\n{addrs}",
            ns.name()
        ),
        Some(_) => assert!(
            out.contains("1 passed"),
            "{test}: the run inside the namespace did not run the test\n{out}\n{err}"
        ),
    }
}

/// Two NICs, plus interfaces Calico must skip, all holding addresses. Creation order sets the
/// interface indexes: eth0 < eth1 < the decoys. Every veth peer is named `veth-*` (excluded by
/// first-found, address-less otherwise).
fn multi_nic(ns: &Netns) -> io::Result<()> {
    ns.add_veth("eth0", "veth-eth0", &["10.0.0.5/24", "2001:db8:1::5/64"])?;
    ns.add_veth("eth1", "veth-eth1", &["192.168.50.7/24"])?;
    ns.add_veth("docker0", "veth-dk", &["172.17.0.1/16"])?;
    ns.add_veth(
        "cali1234abcd",
        "veth-ca",
        &["10.9.9.9/32", "2001:db8:9::9/128"],
    )?;
    ns.add_veth("veth0abc", "veth-ve", &["10.8.8.8/24"])?;
    ns.add_veth("br-1a2b3c4d", "veth-br", &["172.18.0.1/16"])?;
    ns.add_veth("vxlan.calico", "veth-vx", &["10.244.1.0/32"])?;
    ns.add_veth("kube-ipvs0", "veth-kv", &["10.96.0.1/32"])?;
    ns.add_veth("tunl0", "veth-tu", &["10.244.2.1/32"])?;
    Ok(())
}

fn detect(method: &str, family: Family) -> Result<Detection, AutodetectError> {
    let m = Method::parse(method).unwrap();
    let r = autodetect(&m, family, &SystemNet, &[]);
    match &r {
        Ok(d) => println!(
            "{method} {family}: {} on {}\n  {}",
            d.address,
            d.interface,
            d.decisions.join("\n  ")
        ),
        Err(e) => println!(
            "{method} {family}: error: {e}\n  {}",
            e.decisions().join("\n  ")
        ),
    }
    r
}

#[track_caller]
fn expect(method: &str, family: Family, iface: &str, addr: &str) -> Detection {
    let d = detect(method, family).unwrap_or_else(|e| panic!("{method}: {e}"));
    assert_eq!(
        (d.interface.as_str(), d.address.to_string().as_str()),
        (iface, addr),
        "{method} {family}"
    );
    d
}

fn index_of(name: &str) -> u32 {
    SystemNet
        .interfaces()
        .unwrap()
        .into_iter()
        .find(|i| i.name == name)
        .unwrap_or_else(|| panic!("no interface {name}"))
        .index
}

#[test]
fn system_net_lists_namespace_interfaces() {
    in_netns("system_net_lists_namespace_interfaces", multi_nic, || {
        let ifaces = SystemNet.interfaces().unwrap();
        assert!(
            ifaces.windows(2).all(|w| w[0].index < w[1].index),
            "{ifaces:?}"
        );
        let names: Vec<&str> = ifaces.iter().map(|i| i.name.as_str()).collect();
        for n in [
            "lo",
            "eth0",
            "veth-eth0",
            "eth1",
            "docker0",
            "cali1234abcd",
            "vxlan.calico",
        ] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        let eth0 = ifaces.iter().find(|i| i.name == "eth0").unwrap();
        assert!(eth0.up);
        let a: Vec<String> = eth0.addrs.iter().map(Cidr::to_string).collect();
        assert!(a.contains(&"10.0.0.5/24".to_string()), "{a:?}");
        assert!(a.contains(&"2001:db8:1::5/64".to_string()), "{a:?}");
        assert!(a.iter().any(|c| c.starts_with("fe80:")), "{a:?}");
        let lo = ifaces.iter().find(|i| i.name == "lo").unwrap();
        assert!(
            lo.addrs.iter().any(|c| c.to_string() == "127.0.0.1/8"),
            "{lo:?}"
        );
    });
}

#[test]
fn first_found_skips_decoys() {
    in_netns("first_found_skips_decoys", multi_nic, || {
        assert!(index_of("eth1") > index_of("eth0"));
        // Calico examines interfaces from the highest index down: eth1 comes before eth0, and
        // every decoy (higher indexes still) is skipped by name.
        let d = expect("first-found", Family::V4, "eth1", "192.168.50.7/24");
        expect("", Family::V4, "eth1", "192.168.50.7/24");
        for (name, pat) in [
            ("docker0", "^docker.*"),
            ("cali1234abcd", "^cali.*"),
            ("veth0abc", "^veth.*"),
            ("br-1a2b3c4d", "^br-.*"),
            ("vxlan.calico", "^vxlan\\.calico.*"),
            ("kube-ipvs0", "^kube-ipvs.*"),
            ("tunl0", "^tunl.*"),
        ] {
            assert!(
                d.decisions
                    .iter()
                    .any(|l| l.contains(&format!("interface {name} "))
                        && l.contains(pat)
                        && l.contains("skipped")),
                "no skip decision for {name}: {:?}",
                d.decisions
            );
        }
    });
}

#[test]
fn first_found_ipv6_prefers_global_over_link_local() {
    in_netns(
        "first_found_ipv6_prefers_global_over_link_local",
        multi_nic,
        || {
            // eth1 (higher index) has only its fe80:: address; cali* holds a global one but is
            // excluded.
            let d = expect("first-found", Family::V6, "eth0", "2001:db8:1::5/64");
            assert!(
                d.decisions
                    .iter()
                    .any(|l| l.contains("interface eth1 ") && l.contains("link-local")),
                "{:?}",
                d.decisions
            );
        },
    );
}

#[test]
fn interface_method() {
    in_netns("interface_method", multi_nic, || {
        expect("interface=^eth0$", Family::V4, "eth0", "10.0.0.5/24");
        expect(
            "interface=^eth0$,^eth1$",
            Family::V4,
            "eth1",
            "192.168.50.7/24",
        );
        expect("interface=^eth", Family::V6, "eth0", "2001:db8:1::5/64");
        // No exclusion list with interface=.
        expect("interface=docker", Family::V4, "docker0", "172.17.0.1/16");
        let e = detect("interface=eth9", Family::V4).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, AutodetectError::NoInterface { .. }), "{msg}");
        assert!(msg.contains("interface=eth9"), "{msg}");
        assert!(
            msg.contains("eth0") && msg.contains("eth1") && msg.contains("lo"),
            "{msg}"
        );
    });
}

#[test]
fn skip_interface_method() {
    in_netns("skip_interface_method", multi_nic, || {
        let d = expect("skip-interface=^eth1$", Family::V4, "eth0", "10.0.0.5/24");
        assert!(
            d.decisions
                .iter()
                .any(|l| l.contains("interface eth1 ") && l.contains("skip-interface=")),
            "{:?}",
            d.decisions
        );
        let e = detect("skip-interface=^eth", Family::V4).unwrap_err();
        assert!(matches!(e, AutodetectError::NoInterface { .. }), "{e}");
    });
}

#[test]
fn cidr_method_across_interfaces() {
    in_netns("cidr_method_across_interfaces", multi_nic, || {
        expect("cidr=10.0.0.0/16", Family::V4, "eth0", "10.0.0.5/24");
        expect(
            "cidr=10.0.0.0/16,192.168.0.0/16",
            Family::V4,
            "eth1",
            "192.168.50.7/24",
        );
        expect(
            "cidr=192.168.50.0/24",
            Family::V4,
            "eth1",
            "192.168.50.7/24",
        );
        // Like Calico, cidr= has no exclusion list.
        expect("cidr=172.17.0.0/16", Family::V4, "docker0", "172.17.0.1/16");
        expect(
            "cidr=2001:db8:1::/48",
            Family::V6,
            "eth0",
            "2001:db8:1::5/64",
        );
        let e = detect("cidr=203.0.113.0/24", Family::V4).unwrap_err();
        assert!(matches!(e, AutodetectError::NoAddress { .. }), "{e}");
    });
}

#[test]
fn down_interface_is_not_skipped() {
    in_netns(
        "down_interface_is_not_skipped",
        |ns| {
            ns.add_veth("eth0", "veth-eth0", &["10.0.0.5/24"])?;
            ns.add_veth("eth1", "veth-eth1", &["10.0.1.5/24"])?;
            ns.set_down("eth1")
        },
        || {
            // Calico never looks at the link state: the down eth1 still wins.
            let d = expect("first-found", Family::V4, "eth1", "10.0.1.5/24");
            assert!(
                d.decisions.iter().any(|l| l.contains("down")),
                "{:?}",
                d.decisions
            );
        },
    );
}

#[test]
fn only_loopback_fails_clearly() {
    in_netns(
        "only_loopback_fails_clearly",
        |_| Ok(()),
        || {
            let e = detect("first-found", Family::V4).unwrap_err();
            assert!(matches!(e, AutodetectError::NoInterface { .. }), "{e}");
            assert!(e.to_string().contains("interfaces seen: lo"), "{e}");
        },
    );
}

fn routed(ns: &Netns) -> io::Result<()> {
    multi_nic(ns)?;
    ns.add_addr("eth1", "2001:db8:2::7/64")?;
    ns.ip(&["route", "add", "default", "via", "10.0.0.1", "dev", "eth0"])?;
    ns.ip(&[
        "route",
        "add",
        "203.0.113.0/24",
        "via",
        "192.168.50.1",
        "dev",
        "eth1",
    ])?;
    ns.ip(&[
        "-6",
        "route",
        "add",
        "default",
        "via",
        "2001:db8:1::1",
        "dev",
        "eth0",
    ])?;
    ns.ip(&[
        "-6",
        "route",
        "add",
        "2001:db8:99::/48",
        "via",
        "2001:db8:2::1",
        "dev",
        "eth1",
    ])?;
    Ok(())
}

#[test]
fn can_reach_follows_routes() {
    in_netns("can_reach_follows_routes", routed, || {
        let d = expect(
            "can-reach=203.0.113.10",
            Family::V4,
            "eth1",
            "192.168.50.7/24",
        );
        assert!(
            d.decisions.iter().any(|l| l.contains("from 192.168.50.7")),
            "{:?}",
            d.decisions
        );
        expect("can-reach=198.51.100.1", Family::V4, "eth0", "10.0.0.5/24");
        expect(
            "can-reach=2001:db8:99::1",
            Family::V6,
            "eth1",
            "2001:db8:2::7/64",
        );
        expect(
            "can-reach=2001:db8:ffff::1",
            Family::V6,
            "eth0",
            "2001:db8:1::5/64",
        );
        // A hostname, resolved without DNS.
        expect("can-reach=localhost", Family::V4, "lo", "127.0.0.1/8");
        let e = detect("can-reach=2001:db8:99::1", Family::V4).unwrap_err();
        assert!(
            matches!(e, AutodetectError::NoAddressOfFamily { .. }),
            "{e}"
        );
    });
}

#[test]
fn can_reach_without_route_fails() {
    in_netns(
        "can_reach_without_route_fails",
        |ns| ns.add_veth("eth0", "veth-eth0", &["10.0.0.5/24"]),
        || {
            let e = detect("can-reach=198.51.100.1", Family::V4).unwrap_err();
            assert!(matches!(e, AutodetectError::NoRoute { .. }), "{e}");
        },
    );
}

#[test]
fn bare_address_gets_prefix_from_interface() {
    in_netns("bare_address_gets_prefix_from_interface", multi_nic, || {
        let got = |s: &str| interface_holding(s.parse::<IpAddr>().unwrap(), &SystemNet).unwrap();
        assert_eq!(
            got("192.168.50.7"),
            Some(("eth1".to_string(), Cidr::parse("192.168.50.7/24").unwrap()))
        );
        assert_eq!(
            got("2001:db8:1::5"),
            Some(("eth0".to_string(), Cidr::parse("2001:db8:1::5/64").unwrap()))
        );
        assert_eq!(
            got("172.17.0.1"),
            Some(("docker0".to_string(), Cidr::parse("172.17.0.1/16").unwrap()))
        );
        assert_eq!(got("10.99.0.1"), None);
    });
}
