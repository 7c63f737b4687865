//! 2. `margay node startup`: the Kubernetes Node annotated, the defaults created once.

use super::*;

/// resourceVersions of what start-up owns in the API server.
fn startup_state(s: &StoreHandle, node: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert(
        format!("nodes/{node}"),
        rv(&s.get(NODES, "", node).unwrap()),
    );
    for plural in [
        "ippools",
        "felixconfigurations",
        "clusterinformations",
        "bgpconfigurations",
        "ipamconfigs",
        "tiers",
        "ipamblocks",
        "blockaffinities",
        "ipamhandles",
    ] {
        for o in s.list(Gvr::calico(plural), None, "").unwrap() {
            out.insert(
                format!("{plural}/{}", o["metadata"]["name"].as_str().unwrap()),
                rv(&o),
            );
        }
    }
    out
}

#[test]
fn node_startup_annotates_the_kubernetes_node_and_creates_the_defaults_once() {
    let k = Cluster::start();
    k.seed();
    let s = k.store();

    let r = k.node_startup("node1", "10.0.0.1/24");
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.out.contains("node written"), "{r:?}");

    // Calico's annotations on the Kubernetes Node; its labels and addresses untouched.
    let n1 = s.get(NODES, "", "node1").unwrap();
    let ann = &n1["metadata"]["annotations"];
    assert_eq!(ann["projectcalico.org/IPv4Address"], "10.0.0.1/24", "{n1}");
    assert_eq!(
        n1["metadata"]["labels"],
        json!({"kubernetes.io/hostname": "node1", "kubernetes.io/os": "linux"})
    );
    assert_eq!(n1["status"]["addresses"][0]["address"], "10.0.0.1");
    // The VXLAN tunnel address, from IPAM in the default pool, and the VTEP MAC.
    let tunnel = ann["projectcalico.org/IPv4VXLANTunnelAddr"]
        .as_str()
        .unwrap_or_else(|| panic!("no tunnel address: {n1}"));
    assert!(tunnel.starts_with("10.65."), "{tunnel}");
    assert!(
        ann["projectcalico.org/VXLANTunnelMACAddr"].is_string(),
        "{n1}"
    );

    // IPAM as Calico's custom resources: the node's block, its affinity (labelled so one
    // host's can be listed) and the tunnel address's handle.
    let blocks = s.list(Gvr::calico("ipamblocks"), None, "").unwrap();
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    let block = &blocks[0];
    assert_eq!(block["spec"]["affinity"], "host:node1", "{block}");
    let cidr = block["spec"]["cidr"].as_str().unwrap();
    assert_eq!(
        block["metadata"]["name"],
        cidr.replace(['.', '/'], "-"),
        "{block}"
    );
    let affinity = s
        .get(
            Gvr::calico("blockaffinities"),
            "",
            &format!("node1-{}", cidr.replace(['.', '/'], "-")),
        )
        .unwrap();
    assert_eq!(
        affinity["metadata"]["labels"],
        json!({
            "projectcalico.org/affinity-type": "host",
            "projectcalico.org/hostname-hash": margay_kdd::names::hostname_hash("node1"),
            "projectcalico.org/ip-version": "4",
        })
    );
    assert_eq!(
        (&affinity["spec"]["state"], &affinity["spec"]["deleted"]),
        (&json!("confirmed"), &json!("false")),
        "{affinity}"
    );
    let handle = s
        .get(Gvr::calico("ipamhandles"), "", "vxlan-tunnel-addr-node1")
        .unwrap();
    assert_eq!(handle["spec"]["handleID"], "vxlan-tunnel-addr-node1");
    assert_eq!(handle["spec"]["block"], json!({cidr: 1}), "{handle}");
    // ipam check sees the tunnel address as allocated, and the seeded pods' addresses (which
    // no IPAM handed out) as what they are.
    let check = k.ctl(&["ipam", "check"]);
    assert_eq!(check.code, 1, "{check:?}");
    assert!(
        check.out.contains("Found 1 node tunnel IPs.")
            && check.out.contains(
                "found 3 problems: 0 leaked, 3 not allocated, 0 duplicate, 0 stale handles"
            ),
        "{check:?}"
    );

    // The default pool, FelixConfiguration and ClusterInformation as custom resources.
    let pool = s
        .get(Gvr::calico("ippools"), "", "default-ipv4-ippool")
        .unwrap();
    assert_eq!(pool["spec"]["cidr"], "10.65.0.0/16", "{pool}");
    assert_eq!(pool["spec"]["vxlanMode"], "Always", "{pool}");
    stored_metadata(&pool);
    let fc = s
        .get(Gvr::calico("felixconfigurations"), "", "default")
        .unwrap();
    assert_eq!(fc["spec"]["logSeverityScreen"], "Info", "{fc}");
    // Calico's start-up writes no per-node FelixConfiguration in the Kubernetes datastore.
    assert!(
        s.get(Gvr::calico("felixconfigurations"), "", "node.node1")
            .is_err()
    );
    let ci = s
        .get(Gvr::calico("clusterinformations"), "", "default")
        .unwrap();
    assert_eq!(ci["spec"]["datastoreReady"], true, "{ci}");
    assert!(
        !ci["spec"]["clusterGUID"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{ci}"
    );
    s.get(Gvr::calico("ipamconfigs"), "", "default").unwrap();
    s.get(Gvr::calico("tiers"), "", "default").unwrap();
    assert!(
        k.path("root-node1/var/lib/calico/nodename").exists(),
        "the node name file is written last"
    );

    // A second start-up with the same inputs writes nothing: same resourceVersions, and the
    // store's revision did not move.
    let state = startup_state(&s, "node1");
    let revision = s.resource_version();
    let again = k.node_startup("node1", "10.0.0.1/24");
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.out.contains("node unchanged"), "{again:?}");
    assert_eq!(startup_state(&s, "node1"), state, "{again:?}");
    assert_eq!(s.resource_version(), revision, "{again:?}");

    // Another node's start-up with an address node1 has is refused, naming both nodes.
    let clash = k.node_startup("node2", "10.0.0.1/24");
    assert_eq!(clash.code, 1, "{clash:?}");
    assert!(
        clash.err.contains("\"node1\"") && clash.err.contains("\"node2\""),
        "{clash:?}"
    );

    // IP_AUTODETECTION_METHOD=kubernetes-internal-ip: the Kubernetes Node's InternalIP with
    // the prefix of the interface holding it. (127.0.0.1 is the one address every test host
    // has on an interface: lo, 127.0.0.1/8.)
    s.create(NODES, "", k8s_node("node-lo", "127.0.0.1", json!({})))
        .unwrap();
    let r = k.node_startup_with(
        "node-lo",
        &[
            ("IP", "autodetect"),
            ("IP_AUTODETECTION_METHOD", "kubernetes-internal-ip"),
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let lo = s.get(NODES, "", "node-lo").unwrap();
    assert_eq!(
        lo["metadata"]["annotations"]["projectcalico.org/IPv4Address"], "127.0.0.1/8",
        "{lo}"
    );

    // A node the cluster does not have: Calico's start-up fails (the kubelet registers
    // Nodes, calico-node only annotates them), saying so.
    let ghost = k.node_startup("node9", "10.0.0.9/24");
    assert_eq!(ghost.code, 1, "{ghost:?}");
    assert!(
        ghost.err.contains("there is no node \"node9\" to register")
            && ghost.err.contains("kubelet")
            && ghost.err.contains("NODENAME"),
        "{ghost:?}"
    );
    assert!(s.get(NODES, "", "node9").is_err());
}
