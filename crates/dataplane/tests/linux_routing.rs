#![allow(clippy::unwrap_used)]
//! The route and VXLAN managers against the real kernel, inside throw-away network namespaces.
//!
//! Needs root (CI runs as root); MARGAY_SKIP_ROOT_TESTS=1 skips these tests elsewhere.
//!
//! Network safety: every interface, address, route and neighbour is made inside namespaces
//! the test creates (`mgy-` prefix, deleted on drop, pass or fail). The managers run on a
//! thread that has joined the test namespace (`setns`) and checked that it did before doing
//! anything, so their netlink sockets can only see and change that namespace. Every wait is
//! bounded.

use std::os::unix::fs::MetadataExt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use margay_api::net::Cidr;
use margay_api::{Resource, decode_one};
use margay_calc::{CalcConfig, CalcGraph, Message, RouteSource, Vtep, vxlan_mac_for_node};
use margay_dataplane::linux::routes::{KernelRoute, RouteKey, RouteManager, RouteTarget};
use margay_dataplane::linux::routing::{Routing, RoutingConfig, RoutingReport};
use margay_dataplane::linux::vxlan::{DeviceChange, VxlanConfig, VxlanManager};
use margay_testkit::netns::{Netns, is_root};

/// How long one piece of work inside a namespace may take.
const IN_NS_TIMEOUT: Duration = Duration::from_secs(60);

fn root() -> bool {
    if is_root() {
        return true;
    }
    if std::env::var("MARGAY_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
        eprintln!("skipped: needs root (MARGAY_SKIP_ROOT_TESTS=1)");
        return false;
    }
    panic!("needs root (creates network namespaces); run as root or set MARGAY_SKIP_ROOT_TESTS=1");
}

/// Runs `f` on a fresh thread inside `ns`'s network namespace and returns its result; a panic
/// in `f` is re-raised here. The thread checks it really is in `ns` before calling `f`.
fn in_ns<R: Send + 'static>(ns: &Netns, f: impl FnOnce() -> R + Send + 'static) -> R {
    let path = format!("/run/netns/{}", ns.name());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let result = catch_unwind(AssertUnwindSafe(|| {
            let file = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            // Never run the managers anywhere but in the test namespace.
            let want = std::fs::metadata(&path).unwrap().ino();
            let have = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
            assert_eq!(want, have, "setns into {path} did not take effect");
            f()
        }));
        let _ = tx.send(result);
    });
    match rx.recv_timeout(IN_NS_TIMEOUT) {
        Ok(Ok(r)) => r,
        Ok(Err(panic)) => resume_unwind(panic),
        Err(_) => panic!(
            "work inside {} did not finish in {IN_NS_TIMEOUT:?}",
            ns.name()
        ),
    }
}

fn sh(ns: &Netns, program: &str, args: &[&str]) -> String {
    let out = ns.exec(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?} in {}: {}",
        ns.name(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn c(s: &str) -> Cidr {
    Cidr::parse(s).unwrap()
}

fn dev(dst: &str, ifname: &str, priority: u32) -> KernelRoute {
    KernelRoute {
        dst: c(dst),
        target: RouteTarget::Interface {
            ifname: ifname.into(),
        },
        priority,
        src: None,
    }
}

fn via(dst: &str, ifname: &str, gw: &str) -> KernelRoute {
    KernelRoute {
        dst: c(dst),
        target: RouteTarget::Gateway {
            ifname: ifname.into(),
            gateway: gw.parse().unwrap(),
            onlink: true,
        },
        priority: 0,
        src: None,
    }
}

fn has_line(text: &str, want: &str) -> bool {
    text.lines().any(|l| l.trim() == want)
}

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

fn vtep(node: &str, tunnel: &str, parent: &str) -> Vtep {
    Vtep {
        node: node.into(),
        mac: vxlan_mac_for_node(node),
        ipv4_addr: Some(tunnel.parse().unwrap()),
        parent_device_ip: Some(parent.parse().unwrap()),
        mac_v6: String::new(),
        ipv6_addr: None,
        parent_device_ipv6: None,
    }
}

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

// ---- two nodes, a pod on each, VXLAN between them ------------------------------------------

fn res(yaml: &str) -> Resource {
    let r = decode_one(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    r.validate().unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    r
}

fn node_res(name: &str, ip: &str, tunnel: &str, mac: &str) -> Resource {
    let mac = if mac.is_empty() {
        String::new()
    } else {
        format!("  vxlanTunnelMACAddr: {mac}\n")
    };
    res(&format!(
        "apiVersion: projectcalico.org/v3\nkind: Node\nmetadata:\n  name: {name}\nspec:\n  bgp:\n    ipv4Address: {ip}\n  ipv4VXLANTunnelAddr: {tunnel}\n{mac}"
    ))
}

fn pool_res(mode: &str) -> Resource {
    res(&format!(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: pool}}\nspec: {{cidr: 10.71.0.0/16, vxlanMode: {mode}, blockSize: 26}}"
    ))
}

fn wep_res(node: &str, pod: &str, iface: &str, ip: &str) -> Resource {
    res(&format!(
        "apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: {node}-k8s-{pod}-eth0
  namespace: default
spec:
  orchestrator: k8s
  node: {node}
  pod: {pod}
  endpoint: eth0
  interfaceName: {iface}
  ipNetworks: [{ip}/32]
  profiles: [kns.default]"
    ))
}

struct TestNode {
    name: &'static str,
    ns: Netns,
    pod: Netns,
    graph: CalcGraph,
    routing: Option<Routing>,
}

impl TestNode {
    /// Applies the graph's pending messages in the node's namespace.
    fn sync(&mut self) -> RoutingReport {
        let batch: Vec<Message> = self.graph.flush();
        let mut routing = self.routing.take().unwrap();
        let (report, routing) = in_ns(&self.ns, move || {
            routing.on_messages(&batch);
            (routing.apply().unwrap(), routing)
        });
        self.routing = Some(routing);
        report
    }
}

/// Pings `dst` from `from` until it answers, for at most 10 s.
fn ping(from: &Netns, dst: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let ok = from
            .exec("ping")
            .args(["-c", "1", "-W", "1", dst])
            .output()
            .unwrap()
            .status
            .success();
        if ok {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Prints what the kernel has in each namespace (for a failed connectivity check).
fn diagnose(all: &[&Netns]) {
    for ns in all {
        eprintln!("==== {}", ns.name());
        for args in [&["-d", "link"][..], &["addr"], &["route"], &["neigh"]] {
            eprintln!(
                "$ ip {}\n{}",
                args.join(" "),
                ns.ip(args).unwrap_or_else(|e| e.to_string())
            );
        }
        let fdb = ns.exec("bridge").args(["fdb", "show"]).output().unwrap();
        eprintln!(
            "$ bridge fdb show\n{}",
            String::from_utf8_lossy(&fdb.stdout)
        );
    }
}

fn tx_packets(ns: &Netns, dev: &str) -> u64 {
    let out = ns.ip(&["-s", "-o", "link", "show", dev]).unwrap();
    // "... TX: bytes packets ...\    <bytes> <packets> ..." in one line with -o.
    let after = out.split("TX:").nth(1).unwrap_or_default();
    let nums: Vec<u64> = after
        .split(|c: char| c.is_whitespace() || c == '\\')
        .filter_map(|w| w.parse().ok())
        .collect();
    nums.get(1).copied().unwrap_or(0)
}

#[test]
fn pods_on_two_nodes_reach_each_other_over_vxlan() {
    if !root() {
        return;
    }
    // Topology: nodea eth0 192.168.70.1/24 <-> nodeb eth0 192.168.70.2/24 (the underlay);
    // poda (10.71.0.5) behind nodea's calia; podb (10.71.1.5) behind nodeb's calib.
    let mk = |name: &'static str, pod_ip: &str, iface: &str| -> TestNode {
        let ns = Netns::new(&format!("vx{name}")).unwrap();
        let pod = Netns::new(&format!("vx{name}pod")).unwrap();
        ns.ip(&[
            "link", "add", iface, "type", "veth", "peer", "name", "podeth",
        ])
        .unwrap();
        ns.ip(&["link", "set", "podeth", "netns", pod.name()])
            .unwrap();
        ns.set_up(iface).unwrap();
        // The host settings Felix makes (forwarding; the workload interface's sysctls, which
        // include the CNI plugin's proxy ARP), made by margay's own code inside the node.
        let (iface_owned, sysctls) = (
            iface.to_string(),
            margay_dataplane::linux::sysctl::global_sysctls(true, false),
        );
        let failed = in_ns(&ns, move || {
            let sys = margay_dataplane::linux::sysctl::ProcSys::default();
            let mut want = sysctls;
            want.extend(margay_dataplane::linux::sysctl::workload_sysctls(
                &iface_owned,
                false,
                "0",
            ));
            sys.apply(&want)
                .failed
                .into_iter()
                .filter(|(s, _)| !s.best_effort)
                .map(|(s, e)| format!("{}: {e}", s.dotted()))
                .collect::<Vec<_>>()
        });
        assert!(failed.is_empty(), "{failed:?}");
        pod.ip(&["link", "set", "podeth", "name", "eth0"]).unwrap();
        pod.add_addr("eth0", &format!("{pod_ip}/32")).unwrap();
        pod.set_up("eth0").unwrap();
        pod.ip(&[
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ])
        .unwrap();
        pod.ip(&[
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
            "dev",
            "eth0",
        ])
        .unwrap();
        TestNode {
            name,
            ns,
            pod,
            graph: CalcGraph::new(CalcConfig {
                hostname: name.into(),
                route_source: RouteSource::CalicoIpam,
            }),
            routing: Some(Routing::new(RoutingConfig::new(name))),
        }
    };
    let mut a = mk("nodea", "10.71.0.5", "calia");
    let mut b = mk("nodeb", "10.71.1.5", "calib");
    a.ns.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "eth0b",
    ])
    .unwrap();
    a.ns.ip(&["link", "set", "eth0b", "netns", b.ns.name()])
        .unwrap();
    b.ns.ip(&["link", "set", "eth0b", "name", "eth0"]).unwrap();
    a.ns.add_addr("eth0", "192.168.70.1/24").unwrap();
    b.ns.add_addr("eth0", "192.168.70.2/24").unwrap();
    a.ns.set_up("eth0").unwrap();
    b.ns.set_up("eth0").unwrap();
    // Like real hosts, the nodes have a default route (proxy ARP for the pods' gateway
    // 169.254.1.1 answers only for addresses the node can route).
    for n in [&a, &b] {
        n.ns.ip(&[
            "route",
            "add",
            "default",
            "via",
            "192.168.70.254",
            "dev",
            "eth0",
        ])
        .unwrap();
    }

    // The cluster as the datastore has it: node a publishes a VTEP MAC, node b relies on the
    // deterministic one; tunnel addresses come from each node's block, as IPAM assigns them.
    let resources = [
        node_res("nodea", "192.168.70.1/24", "10.71.0.1", "66:aa:00:00:00:01"),
        node_res("nodeb", "192.168.70.2/24", "10.71.1.1", ""),
        pool_res("Always"),
        wep_res("nodea", "poda", "calia", "10.71.0.5"),
        wep_res("nodeb", "podb", "calib", "10.71.1.5"),
    ];
    for n in [&mut a, &mut b] {
        for r in &resources {
            n.graph.on_update(&r.key(), Some(r.clone()));
        }
        n.graph
            .on_ipam_block(c("10.71.0.0/26"), Some("nodea".into()));
        n.graph
            .on_ipam_block(c("10.71.1.0/26"), Some("nodeb".into()));
        n.graph.on_in_sync();
    }
    let ra = a.sync();
    let rb = b.sync();
    for (n, r) in [(&a, &ra), (&b, &rb)] {
        assert!(r.applied && r.errors.is_empty(), "{}: {r:#?}", n.name);
        assert_eq!(r.vxlan.device, DeviceChange::Created, "{}: {r:#?}", n.name);
        assert!(!r.routes.needs_retry(), "{}: {r:#?}", n.name);
    }
    let mac_b = vxlan_mac_for_node("nodeb");
    let link_a = a.ns.ip(&["link", "show", "vxlan.calico"]).unwrap();
    assert!(link_a.contains("66:aa:00:00:00:01"), "{link_a}");
    let link_b = b.ns.ip(&["link", "show", "vxlan.calico"]).unwrap();
    assert!(link_b.contains(&mac_b), "{link_b}");
    let routes_a = a.ns.ip(&["route", "show", "proto", "80"]).unwrap();
    for want in [
        "blackhole 10.71.0.0/26",
        "10.71.0.5 dev calia scope link metric 1024",
        "10.71.1.0/26 via 10.71.1.1 dev vxlan.calico onlink",
    ] {
        assert!(has_line(&routes_a, want), "{want:?} in\n{routes_a}");
    }
    let arp_a = a.ns.ip(&["neigh", "show", "dev", "vxlan.calico"]).unwrap();
    assert!(
        has_line(&arp_a, &format!("10.71.1.1 lladdr {mac_b} PERMANENT")),
        "{arp_a}"
    );

    let before = tx_packets(&a.ns, "vxlan.calico");
    if !ping(&a.pod, "10.71.1.5") {
        diagnose(&[&a.ns, &a.pod, &b.ns, &b.pod]);
        panic!("poda cannot reach podb over VXLAN");
    }
    assert!(
        ping(&b.pod, "10.71.0.5"),
        "podb cannot reach poda over VXLAN"
    );
    assert!(
        tx_packets(&a.ns, "vxlan.calico") > before,
        "the pods' traffic did not go through vxlan.calico"
    );

    // The pool becomes CrossSubnet: the nodes share a subnet, so the routes go straight to
    // the other node over the underlay, and the pods still reach each other.
    for n in [&mut a, &mut b] {
        let p = pool_res("CrossSubnet");
        n.graph.on_update(&p.key(), Some(p));
    }
    let ra = a.sync();
    b.sync();
    assert!(ra.routes.replaced >= 1, "{ra:#?}");
    let routes_a = a.ns.ip(&["route", "show", "proto", "80"]).unwrap();
    assert!(
        has_line(&routes_a, "10.71.1.0/26 via 192.168.70.2 dev eth0 onlink"),
        "{routes_a}"
    );
    let before = tx_packets(&a.ns, "vxlan.calico");
    assert!(ping(&a.pod, "10.71.1.5"), "poda cannot reach podb directly");
    assert_eq!(tx_packets(&a.ns, "vxlan.calico"), before, "still tunnelled");

    // Node b's workload goes away: its route on a goes too (the block stays: blackhole on b).
    let gone = wep_res("nodeb", "podb", "calib", "10.71.1.5");
    for n in [&mut a, &mut b] {
        n.graph.on_update(&gone.key(), None);
    }
    let rb = b.sync();
    assert_eq!(rb.routes.removed, 1, "{rb:#?}");
    assert!(
        !b.ns
            .ip(&["route", "show", "proto", "80"])
            .unwrap()
            .contains("calib")
    );
}

#[test]
fn a_thousand_routes_apply_in_tens_of_milliseconds() {
    if !root() {
        return;
    }
    let ns = Netns::new("routebench").unwrap();
    ns.add_veth("eth0", "eth0-peer", &["192.168.80.1/24"])
        .unwrap();
    let desired: Vec<KernelRoute> = (0..1000u32)
        .map(|i| {
            via(
                &format!("10.{}.{}.0/26", 100 + i / 256, i % 256),
                "eth0",
                "192.168.80.2",
            )
        })
        .collect();
    let (add, noop, remove) = in_ns(&ns, move || {
        let mut mgr = RouteManager::new(false);
        let add = mgr.apply(&desired, &[]).unwrap();
        let noop = mgr.apply(&desired, &[]).unwrap();
        let remove = mgr.apply(&[], &[]).unwrap();
        (add, noop, remove)
    });
    assert_eq!(add.added, 1000, "{add:#?}");
    assert_eq!(noop.unchanged, 1000);
    assert_eq!(remove.removed, 1000);
    println!(
        "1000 routes: add {:?}, re-apply (no change) {:?}, remove {:?}",
        add.duration, noop.duration, remove.duration
    );
    // Generous bound for slow CI machines and debug builds.
    assert!(add.duration < Duration::from_secs(2), "{:?}", add.duration);
}

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
