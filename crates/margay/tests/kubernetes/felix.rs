//! 3. `margay felix`: this node's pods programmed with Kubernetes and Calico policy.

use super::*;

fn ingress_policies(ep: &Value) -> Vec<String> {
    ep["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["ingress"].as_array().unwrap().iter())
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

fn egress_policies(ep: &Value) -> Vec<String> {
    ep["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["egress"].as_array().unwrap().iter())
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

/// Namespaced policies are `<namespace>/<name>` in Felix's status.
fn has_policy(list: &[String], name: &str) -> bool {
    list.iter().any(|p| p == name)
}

#[test]
fn felix_programs_this_nodes_pods_with_kubernetes_and_calico_policy() {
    let k = Cluster::start();
    k.seed();
    let s = k.store();
    let r = k.node_startup("node1", "10.0.0.1/24");
    assert_eq!(r.code, 0, "{r:?}");
    let gnp = k.file(
        "gnp.yaml",
        "apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: allow-dns}
spec:
  order: 100
  selector: projectcalico.org/namespace == 'shop'
  types: [Egress]
  egress:
  - action: Allow
    protocol: UDP
    destination: {ports: [53]}
",
    );
    k.ctl_ok(&["apply", "-f", &gnp]);
    // Egress to the pods' named port: the port names come from the pods' containers.
    s.create(
        K8S_NETPOLS,
        "shop",
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "egress-http", "namespace": "shop"},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                     "egress": [{"to": [{"podSelector": {}}], "ports": [{"port": "http"}]}]},
        }),
    )
    .unwrap();

    let mut felix = Felix::start(&k, "node1", &[]);
    let st = felix.wait("node1's two pods", |st| {
        let eps = endpoints(st);
        let ids: Vec<&String> = eps.keys().collect();
        if ids != ["k8s/shop/web-1/eth0", "k8s/shop/web-2/eth0"] {
            return Err(format!("endpoints {ids:?}"));
        }
        Ok(())
    });
    let eps = endpoints(&st);
    let web1 = &eps["k8s/shop/web-1/eth0"];
    let web2 = &eps["k8s/shop/web-2/eth0"];
    assert_eq!(
        web1["profiles"],
        json!(["kns.shop", "ksa.shop.web-sa"]),
        "{web1}"
    );
    assert_eq!(web2["profiles"], json!(["kns.shop"]), "{web2}");
    assert_eq!(web1["addresses"], json!(["10.65.0.2/32"]), "{web1}");
    assert_eq!(web2["addresses"], json!(["10.65.0.3/32"]), "{web2}");
    for ep in [web1, web2] {
        assert!(
            has_policy(&ingress_policies(ep), "shop/knp.default.allow-client"),
            "{ep}"
        );
        assert!(has_policy(&egress_policies(ep), "allow-dns"), "{ep}");
    }
    assert_eq!(st["counts"]["local_endpoints"], 2, "{st}");
    assert_eq!(st["counts"]["workload_endpoints"], 3, "{st}");
    // The Kubernetes policy's client selector became an IP set holding client-1.
    let sets = st["ip_sets"].as_array().unwrap();
    assert!(
        sets.iter().any(|s| s["members"] == 1),
        "an IP set with the client: {sets:?}"
    );
    assert_eq!(st["problems"], json!([]), "{st}");
    // The named port: every pod of the namespace with a port named http (web-1, web-2,
    // client-1; the host-network pod has no endpoint).
    let named = sets
        .iter()
        .find(|s| {
            s["source"]
                .as_str()
                .unwrap_or_default()
                .ends_with("port tcp:http")
        })
        .unwrap_or_else(|| panic!("no named-port IP set: {sets:?}"));
    assert_eq!(named["members"], 3, "{named}");
    for ep in [web1, web2] {
        assert!(
            has_policy(&egress_policies(ep), "shop/knp.default.egress-http"),
            "{ep}"
        );
    }

    // node2 starts up: its Calico annotations (VXLAN tunnel address, MAC) and its IPAM block
    // reach Felix as a VTEP and a route.
    let vteps_before = st["counts"]["vteps"].as_u64().unwrap();
    let routes_before = st["counts"]["routes"].as_u64().unwrap();
    let r = k.node_startup("node2", "10.0.0.2/24");
    assert_eq!(r.code, 0, "{r:?}");
    felix.wait("node2's VTEP and block route", |st| {
        let (vteps, routes) = (
            st["counts"]["vteps"].as_u64().unwrap(),
            st["counts"]["routes"].as_u64().unwrap(),
        );
        if vteps == vteps_before + 1 && routes > routes_before {
            Ok(())
        } else {
            Err(format!(
                "vteps {vteps} (was {vteps_before}), routes {routes} (was {routes_before})"
            ))
        }
    });

    // A Kubernetes Node deleted: its VTEP goes.
    s.delete(NODES, "", "node2").unwrap();
    felix.wait("node2's VTEP to go", |st| {
        let vteps = st["counts"]["vteps"].as_u64().unwrap();
        if vteps == vteps_before {
            Ok(())
        } else {
            Err(format!("vteps {vteps} (want {vteps_before})"))
        }
    });

    // A pod's labels change in the API server: it leaves the Kubernetes policy.
    s.patch(
        PODS,
        "shop",
        "web-2",
        PatchType::Merge,
        &json!({"metadata": {"labels": {"app": "cache"}}}),
    )
    .unwrap();
    felix.wait("web-2 to leave the web policy", |st| {
        let eps = endpoints(st);
        let web2 = eps.get("k8s/shop/web-2/eth0").ok_or("web-2 gone")?;
        if has_policy(&ingress_policies(web2), "shop/knp.default.allow-client") {
            return Err("web-2 still has knp.default.allow-client".into());
        }
        Ok(())
    });

    // A new Kubernetes NetworkPolicy selecting it shows up.
    let mut np = allow_clients_to_web();
    np["metadata"]["name"] = json!("allow-cache");
    np["spec"]["podSelector"] = json!({"matchLabels": {"app": "cache"}});
    s.create(K8S_NETPOLS, "shop", np).unwrap();
    felix.wait("knp.default.allow-cache on web-2", |st| {
        let eps = endpoints(st);
        let web2 = eps.get("k8s/shop/web-2/eth0").ok_or("web-2 gone")?;
        if !has_policy(&ingress_policies(web2), "shop/knp.default.allow-cache") {
            return Err("no knp.default.allow-cache".into());
        }
        Ok(())
    });

    // The API server restarts; Felix keeps its state and picks up what changed meanwhile and
    // after.
    k.api.stop();
    std::thread::sleep(Duration::from_millis(500));
    s.create(
        PODS,
        "shop",
        pod("web-3", "node1", "web", None, IpVia::Status("10.65.0.4")),
    )
    .unwrap();
    k.api.start_again().unwrap();
    felix.wait("web-3 after the API server restart", |st| {
        let eps = endpoints(st);
        let web3 = eps.get("k8s/shop/web-3/eth0").ok_or("no web-3")?;
        if !has_policy(&ingress_policies(web3), "shop/knp.default.allow-client") {
            return Err(format!("web-3 without its policy: {web3}"));
        }
        Ok(())
    });
    s.delete(PODS, "shop", "web-1").unwrap();
    felix.wait("web-1 to go", |st| {
        let eps = endpoints(st);
        if eps.contains_key("k8s/shop/web-1/eth0") {
            return Err("web-1 still there".into());
        }
        Ok(())
    });

    // Namespace labels reach the endpoints through the kns. profile: a policy admitting
    // namespaces labelled team=ops gets ops' pod in its IP set once the namespace has the label.
    s.create(
        NAMESPACES,
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ops"}}),
    )
    .unwrap();
    let mut ops_pod = pod("probe", "node2", "probe", None, IpVia::Status("10.65.1.9"));
    ops_pod["metadata"]["namespace"] = json!("ops");
    s.create(PODS, "ops", ops_pod).unwrap();
    let mut np = allow_clients_to_web();
    np["metadata"]["name"] = json!("allow-ops");
    np["spec"]["ingress"] =
        json!([{"from": [{"namespaceSelector": {"matchLabels": {"team": "ops"}}}]}]);
    s.create(K8S_NETPOLS, "shop", np).unwrap();
    let ops_set_members = |st: &Value| -> Result<u64, String> {
        st["ip_sets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|set| {
                set["source"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("pcns.team")
            })
            .map(|set| set["members"].as_u64().unwrap())
            .ok_or_else(|| format!("no pcns.team IP set in {}", st["ip_sets"]))
    };
    felix.wait("the ops IP set, empty", |st| match ops_set_members(st)? {
        0 => Ok(()),
        n => Err(format!("{n} members")),
    });
    s.patch(
        NAMESPACES,
        "",
        "ops",
        PatchType::Merge,
        &json!({"metadata": {"labels": {"team": "ops"}}}),
    )
    .unwrap();
    felix.wait("ops' pod in the IP set", |st| match ops_set_members(st)? {
        1 => Ok(()),
        n => Err(format!("{n} members")),
    });

    // The API server's history is compacted (410 Gone for every watch behind it): Felix lists
    // again and misses nothing made meanwhile.
    k.api.compact();
    s.create(
        PODS,
        "shop",
        pod("web-4", "node1", "web", None, IpVia::Status("10.65.0.5")),
    )
    .unwrap();
    felix.wait("web-4 after compaction", |st| {
        if endpoints(st).contains_key("k8s/shop/web-4/eth0") {
            Ok(())
        } else {
            Err("no web-4".into())
        }
    });
    let st = felix.status().unwrap();
    assert_eq!(st["ready"], true, "{st}");
    assert_eq!(st["problems"], json!([]), "{st}");

    // An object edited into something margay cannot read (a policy action Calico does not
    // have, a pod address that is no address) no longer applies, as when it is read afresh:
    // Felix must not keep enforcing its previous version.
    s.patch(
        Gvr::calico("globalnetworkpolicies"),
        "",
        "allow-dns",
        PatchType::Merge,
        &json!({"spec": {"egress": [{"action": "Allowed"}]}}),
    )
    .unwrap();
    s.patch(
        PODS,
        "shop",
        "web-2",
        PatchType::Merge,
        &json!({"metadata": {"annotations": {
            "cni.projectcalico.org/podIP": "not-an-ip",
            "cni.projectcalico.org/podIPs": "not-an-ip"}}}),
    )
    .unwrap();
    felix.wait("the unreadable policy and pod to stop applying", |st| {
        let eps = endpoints(st);
        if eps.contains_key("k8s/shop/web-2/eth0") {
            return Err("web-2 is still programmed".into());
        }
        let web3 = eps.get("k8s/shop/web-3/eth0").ok_or("no web-3")?;
        if has_policy(&egress_policies(web3), "allow-dns") {
            return Err("allow-dns still applies".into());
        }
        Ok(())
    });
    // Readable again: back.
    s.patch(
        Gvr::calico("globalnetworkpolicies"),
        "",
        "allow-dns",
        PatchType::Merge,
        &json!({"spec": {"egress": [{"action": "Allow", "protocol": "UDP",
                                     "destination": {"ports": [53]}}]}}),
    )
    .unwrap();
    s.patch(
        PODS,
        "shop",
        "web-2",
        PatchType::Merge,
        &json!({"metadata": {"annotations": {
            "cni.projectcalico.org/podIP": "10.65.0.3/32",
            "cni.projectcalico.org/podIPs": "10.65.0.3/32"}}}),
    )
    .unwrap();
    felix.wait("the policy and pod back", |st| {
        let eps = endpoints(st);
        let web2 = eps.get("k8s/shop/web-2/eth0").ok_or("no web-2")?;
        if !has_policy(&egress_policies(web2), "allow-dns") {
            return Err("allow-dns missing".into());
        }
        Ok(())
    });

    // The kubelet's heartbeats change the Node object all the time; that is no configuration
    // change (Felix stays up), and what follows is still seen.
    for i in 0..3 {
        s.patch_status(
            NODES,
            "",
            "node1",
            PatchType::Merge,
            &json!({"status": {"conditions": [{"type": "Ready", "status": "True",
                "lastHeartbeatTime": format!("2024-05-01T10:00:0{i}Z")}]}}),
        )
        .unwrap();
    }
    s.create(
        PODS,
        "shop",
        pod("web-5", "node1", "web", None, IpVia::Status("10.65.0.6")),
    )
    .unwrap();
    felix.wait("web-5 after the heartbeats", |st| {
        if endpoints(st).contains_key("k8s/shop/web-5/eth0") {
            Ok(())
        } else {
            Err("no web-5".into())
        }
    });
    // A restart would follow a changed parameter within 2 s.
    std::thread::sleep(Duration::from_millis(2500));
    felix.status().unwrap();

    // A FelixConfiguration custom resource change that needs a restart: Felix exits 129,
    // naming the parameter, as it does on every datastore.
    s.patch(
        Gvr::calico("felixconfigurations"),
        "",
        "default",
        PatchType::Merge,
        &json!({"spec": {"routeRefreshInterval": "77s"}}),
    )
    .unwrap();
    let status = wait_for("felix to restart", WAIT, || {
        felix
            .role
            .exited()
            .ok_or_else(|| "still running".to_string())
    });
    let log = felix.log();
    assert_eq!(status.code(), Some(129), "{}", tail(&log, 30));
    assert!(
        log.contains("RouteRefreshInterval changed"),
        "{}",
        tail(&log, 30)
    );
}
