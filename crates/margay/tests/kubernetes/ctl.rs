//! 1. `margay ctl`: Calico's custom resources written and the derived objects shown.

use super::*;

const CALICO_RESOURCES: &str = "apiVersion: projectcalico.org/v3
kind: IPPool
metadata:
  name: pool-a
  labels: {env: test}
spec: {cidr: 10.65.0.0/16, vxlanMode: Always, natOutgoing: true, blockSize: 26}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: allow-dns}
spec:
  order: 100
  selector: all()
  types: [Egress]
  egress:
  - action: Allow
    protocol: UDP
    destination: {ports: [53]}
---
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: allow-web, namespace: shop}
spec:
  selector: app == 'web'
  types: [Ingress]
  ingress:
  - action: Allow
    protocol: TCP
    destination: {ports: [443]}
---
apiVersion: projectcalico.org/v3
kind: FelixConfiguration
metadata: {name: default}
spec: {logSeverityScreen: Info, reportingInterval: 0s}
---
apiVersion: projectcalico.org/v3
kind: BGPPeer
metadata: {name: tor}
spec: {peerIP: 10.0.0.254, asNumber: 65000}
";

#[test]
fn ctl_writes_calico_custom_resources_and_shows_derived_objects() {
    let k = Cluster::start();
    k.seed();
    let s = k.store();
    let file = k.file("resources.yaml", CALICO_RESOURCES);

    // create, through DATASTORE_TYPE=kubernetes + KUBECONFIG.
    let r = k.ctl(&["create", "-f", &file]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.out.contains("Successfully created 5 resource(s)"),
        "{r:?}"
    );

    // Each is a crd.projectcalico.org/v1 custom resource with Calico's layout.
    for (plural, ns, name, kind) in [
        ("ippools", "", "pool-a", "IPPool"),
        (
            "globalnetworkpolicies",
            "",
            "allow-dns",
            "GlobalNetworkPolicy",
        ),
        ("networkpolicies", "shop", "allow-web", "NetworkPolicy"),
        ("felixconfigurations", "", "default", "FelixConfiguration"),
        ("bgppeers", "", "tor", "BGPPeer"),
    ] {
        let cr = s
            .get(Gvr::calico(plural), ns, name)
            .unwrap_or_else(|e| panic!("{plural} {ns}/{name} not in the API server: {e}"));
        assert_eq!(cr["apiVersion"], "crd.projectcalico.org/v1", "{cr}");
        assert_eq!(cr["kind"], kind, "{cr}");
        let meta = stored_metadata(&cr);
        assert!(
            meta["creationTimestamp"].is_string(),
            "{plural}/{name}: {meta}"
        );
        // Only policies keep their v3 name in the annotation (Calico's rule).
        let is_policy = plural.ends_with("networkpolicies");
        assert_eq!(meta.get("name").is_some(), is_policy, "{plural}: {meta}");
        assert!(meta.get("namespace").is_none() && meta.get("resourceVersion").is_none());
    }
    let pool = s.get(Gvr::calico("ippools"), "", "pool-a").unwrap();
    assert_eq!(pool["spec"]["cidr"], "10.65.0.0/16");
    assert_eq!(pool["spec"]["vxlanMode"], "Always");
    // A label of the operator's lives in the annotation, not on the custom resource.
    assert_eq!(stored_metadata(&pool)["labels"], json!({"env": "test"}));
    assert!(pool["metadata"]["labels"].get("env").is_none(), "{pool}");
    let policy = s
        .get(Gvr::calico("globalnetworkpolicies"), "", "allow-dns")
        .unwrap();
    assert_eq!(
        policy["spec"]["egress"][0]["destination"]["ports"],
        json!([53])
    );
    let peer = s.get(Gvr::calico("bgppeers"), "", "tor").unwrap();
    assert_eq!(peer["spec"]["peerIP"], "10.0.0.254");

    // get shows the custom resource, its resourceVersion the API object's (quoted as
    // calicoctl's go-yaml v2 quotes a numeric string).
    let yaml = k.ctl_ok(&["get", "ippool", "pool-a", "-o", "yaml"]);
    assert!(
        yaml.contains(&format!("resourceVersion: \"{}\"", rv(&pool))),
        "{yaml}\n{pool}"
    );
    assert!(
        yaml.contains("env: test") && yaml.contains("cidr: 10.65.0.0/16"),
        "{yaml}"
    );

    // create again: already exists, nothing written.
    let before = s.resource_version();
    let again = k.ctl(&["create", "-f", &file]);
    assert_eq!(again.code, 1, "{again:?}");
    assert!(again.err.contains("already exists"), "{again:?}");
    assert_eq!(
        s.resource_version(),
        before,
        "a failed create wrote something"
    );

    // replace changes the custom resource.
    let changed = k.file(
        "pool.yaml",
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: pool-a, labels: {env: test}}\nspec: {cidr: 10.65.0.0/16, vxlanMode: Always, natOutgoing: false, blockSize: 26}\n",
    );
    k.ctl_ok(&["replace", "-f", &changed]);
    let pool2 = s.get(Gvr::calico("ippools"), "", "pool-a").unwrap();
    // natOutgoing false is left out, as Calico's omitempty leaves it out.
    assert!(pool2["spec"].get("natOutgoing").is_none(), "{pool2}");
    assert_ne!(rv(&pool2), rv(&pool));
    // replace of something that does not exist fails.
    let missing = k.file(
        "missing.yaml",
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: nope}\nspec: {cidr: 10.99.0.0/16}\n",
    );
    let r = k.ctl(&["replace", "-f", &missing]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("does not exist"), "{r:?}");

    // label: in the annotation, and selectable.
    k.ctl_ok(&["label", "ippool", "pool-a", "color=red"]);
    let pool3 = s.get(Gvr::calico("ippools"), "", "pool-a").unwrap();
    assert_eq!(
        stored_metadata(&pool3)["labels"],
        json!({"env": "test", "color": "red"})
    );
    let listed = k.ctl_ok(&["get", "ippools", "-l", "color == 'red'"]);
    assert!(listed.contains("pool-a"), "{listed}");
    let listed = k.ctl_ok(&["get", "ippools", "-l", "color == 'blue'"]);
    assert!(!listed.contains("pool-a"), "{listed}");
    k.ctl_ok(&["label", "ippool", "pool-a", "color", "--remove"]);
    let pool4 = s.get(Gvr::calico("ippools"), "", "pool-a").unwrap();
    assert_eq!(stored_metadata(&pool4)["labels"], json!({"env": "test"}));

    // apply: unchanged writes nothing; a change is an update.
    let before = s.resource_version();
    let r = k.ctl(&["apply", "-f", &changed]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        s.resource_version(),
        before,
        "an unchanged apply wrote: {r:?}"
    );

    // A Calico NetworkPolicy and the converted Kubernetes one, side by side.
    let nps = k.ctl_ok(&["get", "networkpolicies", "-n", "shop"]);
    assert!(
        nps.contains("allow-web") && nps.contains("knp.default.allow-client"),
        "{nps}"
    );

    // delete: gone from the API server.
    k.ctl_ok(&["delete", "globalnetworkpolicy", "allow-dns"]);
    assert!(
        s.get(Gvr::calico("globalnetworkpolicies"), "", "allow-dns")
            .is_err()
    );
    let peer_file = k.file(
        "peer.yaml",
        "apiVersion: projectcalico.org/v3\nkind: BGPPeer\nmetadata: {name: tor}\nspec: {peerIP: 10.0.0.254, asNumber: 65000}\n",
    );
    k.ctl_ok(&["delete", "-f", &peer_file]);
    assert!(s.get(Gvr::calico("bgppeers"), "", "tor").is_err());
    let r = k.ctl(&["delete", "bgppeer", "tor"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("does not exist"), "{r:?}");

    // A policy edited (with kubectl) into something margay cannot read can still be deleted,
    // as an undecodable etcd value can; why it could not be read is reported.
    let gnp_file = k.file(
        "gnp.yaml",
        "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: allow-dns}\nspec: {selector: all(), egress: [{action: Allow}]}\n",
    );
    k.ctl_ok(&["create", "-f", &gnp_file]);
    s.patch(
        Gvr::calico("globalnetworkpolicies"),
        "",
        "allow-dns",
        PatchType::Merge,
        &json!({"spec": {"egress": [{"action": "Allowed"}]}}),
    )
    .unwrap();
    let r = k.ctl(&["get", "globalnetworkpolicy", "allow-dns"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("unknown variant `Allowed`"), "{r:?}");
    let r = k.ctl(&["delete", "globalnetworkpolicy", "allow-dns"]);
    assert!(r.err.contains("unknown variant `Allowed`"), "{r:?}");
    assert!(
        s.get(Gvr::calico("globalnetworkpolicies"), "", "allow-dns")
            .is_err(),
        "the unreadable policy is still there: {r:?}"
    );

    // --- The derived kinds, through calicoctl's config file. ---
    let weps = k.ctl_with_config_file(&["get", "workloadendpoints", "-A", "-o", "wide"]);
    assert_eq!(weps.code, 0, "{weps:?}");
    for needle in [
        "node1-k8s-web--1-eth0",
        "node1-k8s-web--2-eth0",
        "node2-k8s-client--1-eth0",
        "10.65.0.2/32",
        "10.65.0.3/32",
        "10.65.1.2/32",
    ] {
        assert!(weps.out.contains(needle), "{needle} missing: {weps:?}");
    }
    assert!(
        !weps.out.contains("node-agent"),
        "a host-network pod has no endpoint: {weps:?}"
    );
    let wep = k.ctl_with_config_file(&[
        "get",
        "workloadendpoint",
        "node1-k8s-web--1-eth0",
        "-n",
        "shop",
        "-o",
        "json",
    ]);
    assert_eq!(wep.code, 0, "{wep:?}");
    let wep: Value = serde_json::from_str(&wep.out).unwrap();
    assert_eq!(
        wep["spec"]["profiles"],
        json!(["kns.shop", "ksa.shop.web-sa"])
    );
    assert_eq!(wep["spec"]["ipNetworks"], json!(["10.65.0.2/32"]));
    assert_eq!(wep["spec"]["node"], "node1");
    assert_eq!(wep["spec"]["pod"], "web-1");
    assert_eq!(wep["metadata"]["labels"]["app"], "web");
    assert_eq!(
        wep["metadata"]["labels"]["projectcalico.org/namespace"],
        "shop"
    );
    assert_eq!(
        wep["metadata"]["labels"]["projectcalico.org/serviceaccount"],
        "web-sa"
    );
    assert_eq!(
        wep["spec"]["ports"],
        json!([{"name": "http", "port": 80, "protocol": "TCP"}])
    );
    let live_pod = s.get(PODS, "shop", "web-1").unwrap();
    assert_eq!(
        wep["metadata"]["resourceVersion"],
        live_pod["metadata"]["resourceVersion"]
    );

    let profiles = k.ctl_with_config_file(&["get", "profiles"]);
    assert_eq!(profiles.code, 0, "{profiles:?}");
    for needle in [
        "kns.shop",
        "kns.default",
        "ksa.shop.web-sa",
        "projectcalico-default-allow",
    ] {
        assert!(profiles.out.contains(needle), "{needle}: {profiles:?}");
    }
    let ns_profile = k.ctl_with_config_file(&["get", "profile", "kns.shop", "-o", "json"]);
    let ns_profile: Value = serde_json::from_str(&ns_profile.out).unwrap();
    assert_eq!(ns_profile["spec"]["labelsToApply"]["pcns.team"], "shop");
    let sa_profile = k.ctl_with_config_file(&["get", "profile", "ksa.shop.web-sa", "-o", "json"]);
    let sa_profile: Value = serde_json::from_str(&sa_profile.out).unwrap();
    assert_eq!(sa_profile["spec"]["labelsToApply"]["pcsa.role"], "frontend");

    let nodes = k.ctl_with_config_file(&["get", "nodes", "-o", "wide"]);
    assert_eq!(nodes.code, 0, "{nodes:?}");
    assert!(
        nodes.out.contains("node1") && nodes.out.contains("node2"),
        "{nodes:?}"
    );
    assert!(nodes.out.contains("10.0.0.2/24"), "{nodes:?}");

    let knp = k.ctl_with_config_file(&[
        "get",
        "networkpolicy",
        "knp.default.allow-client",
        "-n",
        "shop",
        "-o",
        "json",
    ]);
    assert_eq!(knp.code, 0, "{knp:?}");
    let knp: Value = serde_json::from_str(&knp.out).unwrap();
    assert_eq!(knp["spec"]["tier"], "default");
    assert_eq!(knp["spec"]["order"], 1000);
    let sel = knp["spec"]["selector"].as_str().unwrap();
    assert!(
        sel.contains("projectcalico.org/orchestrator == 'k8s'") && sel.contains("app == 'web'"),
        "{sel}"
    );

    // Writes to derived kinds fail, saying what to do instead; the objects stay as they were.
    let before = s.resource_version();
    let wep_file = k.file(
        "wep.yaml",
        "apiVersion: projectcalico.org/v3\nkind: WorkloadEndpoint\nmetadata: {name: node1-k8s-web--1-eth0, namespace: shop}\nspec: {orchestrator: k8s, node: node1, pod: web-1, endpoint: eth0, interfaceName: cali0, ipNetworks: [10.65.9.9/32]}\n",
    );
    for (args, needle) in [
        (
            vec!["apply", "-f", wep_file.as_str()],
            "WorkloadEndpoints are derived from Pods",
        ),
        (
            vec!["delete", "profile", "kns.shop"],
            "Profiles are derived from Namespaces",
        ),
        (
            vec!["label", "profile", "kns.shop", "x=y"],
            "Profiles are derived from Namespaces",
        ),
        (
            vec![
                "delete",
                "networkpolicy",
                "knp.default.allow-client",
                "-n",
                "shop",
            ],
            "Kubernetes NetworkPolicies",
        ),
        (vec!["delete", "node", "node2"], "Kubernetes Nodes"),
    ] {
        let r = k.ctl_with_config_file(&args);
        assert_eq!(r.code, 1, "{args:?} should fail: {r:?}");
        assert!(r.err.contains(needle), "{args:?}: {r:?}");
        assert!(r.err.contains("kubectl"), "{args:?} says how: {r:?}");
    }
    let node_file = k.file(
        "node.yaml",
        "apiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {name: node9}\nspec: {bgp: {ipv4Address: 10.0.0.9/24}}\n",
    );
    let r = k.ctl_with_config_file(&["create", "-f", &node_file]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("Kubernetes Nodes"), "{r:?}");
    assert_eq!(
        s.resource_version(),
        before,
        "a refused write wrote something"
    );
    assert!(s.get(NODES, "", "node2").is_ok());
    assert!(s.get(K8S_NETPOLS, "shop", "allow-client").is_ok());

    // Labelling a Calico Node writes Calico's labels annotation on the Kubernetes Node and
    // leaves its Kubernetes labels alone.
    let r = k.ctl_with_config_file(&["label", "node", "node1", "rack=r1"]);
    assert_eq!(r.code, 0, "{r:?}");
    let n1 = s.get(NODES, "", "node1").unwrap();
    let calico_labels: Value = serde_json::from_str(
        n1["metadata"]["annotations"]["projectcalico.org/labels"]
            .as_str()
            .unwrap_or_else(|| panic!("no Calico labels annotation: {n1}")),
    )
    .unwrap();
    assert_eq!(calico_labels, json!({"rack": "r1"}));
    assert_eq!(
        n1["metadata"]["labels"],
        json!({"kubernetes.io/hostname": "node1", "kubernetes.io/os": "linux"})
    );
    let node_yaml = k.ctl_with_config_file(&["get", "node", "node1", "-o", "yaml"]);
    assert!(
        node_yaml.out.contains("rack: r1")
            && node_yaml.out.contains("kubernetes.io/hostname: node1"),
        "{node_yaml:?}"
    );

    // ipam show reads the pools and the (empty) IPAM custom resources.
    let ipam = k.ctl_with_config_file(&["ipam", "show"]);
    assert_eq!(ipam.code, 0, "{ipam:?}");
    assert!(
        ipam.out
            .contains("| IP Pool  | 10.65.0.0/16 |     65536 |     0 (0%) |"),
        "{ipam:?}"
    );
}
