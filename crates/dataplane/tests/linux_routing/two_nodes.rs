//! Two nodes wired by the routing driver: pods reach each other over VXLAN; a thousand
//! routes apply fast.

use super::*;

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
