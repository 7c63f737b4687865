//! 4. `margay confd`: the mesh and peers rendered from Kubernetes Nodes and BGPPeers.

use super::*;

#[test]
fn confd_renders_mesh_and_peers_from_kubernetes_nodes_and_bgppeer_crs() {
    let k = Cluster::start();
    let s = k.store();
    for (name, ip) in [
        ("node1", "10.0.0.1"),
        ("node2", "10.0.0.2"),
        ("node3", "10.0.0.3"),
    ] {
        s.create(
            NODES,
            "",
            k8s_node(
                name,
                ip,
                json!({
                    "projectcalico.org/IPv4Address": format!("{ip}/24"),
                    "projectcalico.org/ASNumber": "64512",
                }),
            ),
        )
        .unwrap();
    }
    // A node without Calico's annotations (calico-node not started there) is not meshed with.
    s.create(NODES, "", k8s_node("node4", "10.0.0.4", json!({})))
        .unwrap();
    // node1's rack is a Kubernetes label; a node-specific peering selects on it.
    s.patch(
        NODES,
        "",
        "node1",
        PatchType::Merge,
        &json!({"metadata": {"labels": {"rack": "r1"}}}),
    )
    .unwrap();
    s.create(
        Gvr::calico("bgppeers"),
        "",
        json!({
            "apiVersion": "crd.projectcalico.org/v1", "kind": "BGPPeer",
            "metadata": {"name": "rack-r1", "annotations": {
                METADATA_ANNOTATION: "{\"creationTimestamp\":null}"}},
            "spec": {"peerIP": "10.0.0.253", "asNumber": 65001, "nodeSelector": "rack == 'r1'"},
        }),
    )
    .unwrap();
    // A BGPPeer and a pool as Calico's own calicoctl writes them (custom resources with the
    // metadata annotation), and this node's block affinity as Calico's IPAM writes it.
    s.create(
        Gvr::calico("bgppeers"),
        "",
        json!({
            "apiVersion": "crd.projectcalico.org/v1", "kind": "BGPPeer",
            "metadata": {"name": "tor", "annotations": {
                METADATA_ANNOTATION: "{\"creationTimestamp\":\"2024-05-01T10:00:00Z\"}"}},
            "spec": {"peerIP": "10.0.0.254", "asNumber": 65000},
        }),
    )
    .unwrap();
    s.create(
        Gvr::calico("ippools"),
        "",
        json!({
            "apiVersion": "crd.projectcalico.org/v1", "kind": "IPPool",
            "metadata": {"name": "pool", "annotations": {METADATA_ANNOTATION: "{\"creationTimestamp\":null}"}},
            "spec": {"cidr": "10.65.0.0/16", "blockSize": 26, "ipipMode": "Never", "vxlanMode": "Never", "natOutgoing": true},
        }),
    )
    .unwrap();
    s.create(
        Gvr::calico("blockaffinities"),
        "",
        affinity_cr("node1", "10.65.0.0/26"),
    )
    .unwrap();

    let cfg = k.path("confd");
    let once = || {
        let mut c = k.margay();
        c.args([
            "confd",
            "--once",
            "--nodename",
            "node1",
            "--no-reload",
            "--config-dir",
        ])
        .arg(&cfg);
        run(c)
    };
    let r = once();
    assert_eq!(r.code, 0, "{r:?}");
    let bird = std::fs::read_to_string(cfg.join("bird.cfg")).unwrap();
    assert!(bird.contains("router id 10.0.0.1;"), "{bird}");
    for peer in ["Mesh_10_0_0_2", "Mesh_10_0_0_3"] {
        assert!(
            bird.contains(&format!("protocol bgp {peer} from bgp_template")),
            "{peer}: {bird}"
        );
    }
    assert!(
        !bird.contains("Mesh_10_0_0_1 "),
        "no session to itself: {bird}"
    );
    assert!(
        !bird.contains("10_0_0_4"),
        "node4 has no BGP address: {bird}"
    );
    assert!(
        bird.contains("protocol bgp Global_10_0_0_254 from bgp_template"),
        "{bird}"
    );
    assert!(bird.contains("neighbor 10.0.0.254 as 65000;"), "{bird}");
    assert!(
        bird.contains("protocol bgp Node_10_0_0_253 from bgp_template"),
        "the rack peering selects node1 by its Kubernetes label: {bird}"
    );
    assert!(bird.contains("local as 64512;"), "{bird}");
    assert!(bird.contains("route 10.65.0.0/26 blackhole;"), "{bird}");
    bird_accepts(&cfg.join("bird.cfg"));
    let status: Value =
        serde_json::from_slice(&std::fs::read(cfg.join("confd-status.json")).unwrap()).unwrap();
    assert_eq!(status["in_sync"], true, "{status}");
    assert_eq!(status["peers_v4"], 4, "{status}");

    // confd as a daemon: changes made in the API server are rendered as they come, through an
    // API server restart too. node2's block is not this node's: no route for it.
    let log = k.path("confd.log");
    let mut c = k.margay();
    c.args([
        "confd",
        "--nodename",
        "node1",
        "--no-reload",
        "--config-dir",
    ])
    .arg(&cfg);
    let confd = Role::spawn("confd", c, log);
    s.delete(Gvr::calico("bgppeers"), "", "tor").unwrap();
    s.patch(
        NODES,
        "",
        "node4",
        PatchType::Merge,
        &json!({"metadata": {"annotations": {"projectcalico.org/IPv4Address": "10.0.0.4/24"}}}),
    )
    .unwrap();
    for (node, cidr) in [("node1", "10.65.0.64/26"), ("node2", "10.65.1.0/26")] {
        s.create(Gvr::calico("blockaffinities"), "", affinity_cr(node, cidr))
            .unwrap();
    }
    let bird = || std::fs::read_to_string(cfg.join("bird.cfg")).unwrap_or_default();
    wait_for("confd to render the changes", WAIT, || {
        confd.assert_alive();
        let b = bird();
        if !b.contains("Global_10_0_0_254")
            && b.contains("protocol bgp Mesh_10_0_0_4 from bgp_template")
            && b.contains("route 10.65.0.64/26 blackhole;")
        {
            Ok(())
        } else {
            Err(format!("{b}\nlog: {}", tail(&confd.log(), 10)))
        }
    });
    assert!(bird().contains("route 10.65.0.0/26 blackhole;"));
    assert!(!bird().contains("10.65.1.0/26"), "{}", bird());
    bird_accepts(&cfg.join("bird.cfg"));

    k.api.stop();
    std::thread::sleep(Duration::from_millis(500));
    s.patch(
        NODES,
        "",
        "node3",
        PatchType::Merge,
        &json!({"metadata": {"annotations": {"projectcalico.org/IPv4Address": null}}}),
    )
    .unwrap();
    k.api.start_again().unwrap();
    wait_for(
        "node3 to leave the mesh after the API server restart",
        WAIT,
        || {
            confd.assert_alive();
            let b = bird();
            if b.contains("Mesh_10_0_0_3") {
                Err(format!("{b}\nlog: {}", tail(&confd.log(), 10)))
            } else {
                Ok(())
            }
        },
    );
    assert!(bird().contains("Mesh_10_0_0_2"), "{}", bird());
}

fn affinity_cr(node: &str, cidr: &str) -> Value {
    json!({
        "apiVersion": "crd.projectcalico.org/v1", "kind": "BlockAffinity",
        "metadata": {"name": format!("{node}-{}", cidr.replace(['.', '/'], "-")), "labels": {
            "projectcalico.org/affinity-type": "host",
            "projectcalico.org/hostname-hash": margay_kdd::names::hostname_hash(node),
            "projectcalico.org/ip-version": "4"}},
        "spec": {"state": "confirmed", "node": node, "type": "host", "cidr": cidr, "deleted": "false"},
    })
}
