//! 6. Node start-up in a kubeadm cluster; the Node's NetworkUnavailable condition.

use super::*;

const CONFIGMAPS: Gvr = Gvr::core("configmaps");

/// kube-system/kubeadm-config as kubeadm writes it (ClusterConfiguration as YAML text).
fn kubeadm_config(pod_subnet: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
        "data": {"ClusterConfiguration": format!(
            "apiServer: {{}}\napiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\nkubernetesVersion: v1.30.0\nnetworking:\n  dnsDomain: cluster.local\n  podSubnet: {pod_subnet}\n  serviceSubnet: 10.96.0.0/12\n"
        )},
    })
}

/// `margay node startup` for `node` as calico-node runs it, with no pool variables but `env`.
fn plain_startup(k: &Cluster, node: &str, env: &[(&str, &str)]) -> Run {
    let mut c = k.margay();
    c.args(["node", "startup", "--root"])
        .arg(k.path(&format!("root-{node}")))
        .env("NODENAME", node);
    for (key, v) in env {
        c.env(key, v);
    }
    run(c)
}

/// The Kubernetes Node's condition of `type` (Null when it has none).
fn node_condition(s: &StoreHandle, node: &str, kind: &str) -> Value {
    let n = s.get(NODES, "", node).unwrap();
    n["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .cloned()
        .unwrap_or(Value::Null)
}

/// What the kubelet and a cloud's route controller leave on a new Node: Ready, and
/// NetworkUnavailable until the network plugin says otherwise.
fn set_kubelet_conditions(s: &StoreHandle, node: &str) {
    s.patch_status(
        NODES,
        "",
        node,
        PatchType::Merge,
        &json!({"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "message": "kubelet is posting ready status",
             "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "NetworkUnavailable", "status": "True", "reason": "NoRouteCreated",
             "message": "Node created without a route",
             "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ]}}),
    )
    .unwrap();
}

/// `margay node network-condition` (the DaemonSet's sidecar) for NODENAME `node`.
fn network_condition(k: &Cluster, node: &str, env: &[(&str, &str)]) -> Role {
    let log = k.path(&format!("network-condition-{node}.log"));
    let mut c = k.margay();
    c.args([
        "node",
        "network-condition",
        "--ready-timeout",
        "60s",
        "--root",
    ])
    .arg(k.path(&format!("root-{node}")))
    .env("NODENAME", node)
    .env("MARGAY_LOG", "info");
    for (key, v) in env {
        c.env(key, v);
    }
    Role::spawn("network-condition", c, log)
}

#[test]
fn node_startup_reads_the_pod_cidr_from_kubeadm_config_and_clears_network_unavailable() {
    let k = Cluster::start();
    k.seed();
    let s = k.store();
    set_kubelet_conditions(&s, "node1");
    s.create(
        CONFIGMAPS,
        "kube-system",
        kubeadm_config("10.244.0.0/16,fd00:10::/56"),
    )
    .unwrap();

    // No CALICO_IPV4POOL_CIDR / CALICO_IPV6POOL_CIDR: the default pools are kubeadm's.
    let r = plain_startup(&k, "node1", &[("IP", "10.0.0.1/24")]);
    assert_eq!(r.code, 0, "{r:?}");
    let pool = |name: &str| {
        s.get(Gvr::calico("ippools"), "", name)
            .map(|p| p["spec"]["cidr"].clone())
    };
    assert_eq!(pool("default-ipv4-ippool").unwrap(), "10.244.0.0/16");
    if std::path::Path::new("/proc/sys/net/ipv6").exists() {
        assert_eq!(pool("default-ipv6-ippool").unwrap(), "fd00:10::/56");
    }
    let ci = s
        .get(Gvr::calico("clusterinformations"), "", "default")
        .unwrap();
    assert_eq!(ci["spec"]["clusterType"], "kubeadm,kdd", "{ci}");
    // Start-up leaves the condition to the process beside Felix.
    assert_eq!(
        node_condition(&s, "node1", "NetworkUnavailable")["reason"],
        "NoRouteCreated"
    );

    // The DaemonSet's sidecar, started before Felix is: it waits for Felix's readiness.
    let health_port = margay_testkit::free_port().unwrap().to_string();
    let mut cond = network_condition(
        &k,
        "node1",
        &[
            ("CALICO_NETWORKING_BACKEND", "vxlan"),
            ("FELIX_HEALTHENABLED", "true"),
            ("FELIX_HEALTHPORT", &health_port),
        ],
    );
    std::thread::sleep(Duration::from_secs(2));
    cond.assert_alive();
    assert_eq!(
        node_condition(&s, "node1", "NetworkUnavailable")["reason"],
        "NoRouteCreated",
        "cleared before Felix was ready; log:\n{}",
        cond.log()
    );
    let _felix = Felix::start(
        &k,
        "node1",
        &[
            ("FELIX_HEALTHENABLED", "true"),
            ("FELIX_HEALTHPORT", &health_port),
        ],
    );
    let up = wait_for("NetworkUnavailable False once Felix is ready", WAIT, || {
        cond.assert_alive();
        let c = node_condition(&s, "node1", "NetworkUnavailable");
        if c["status"] == "False" {
            Ok(c)
        } else {
            Err(format!("{c}\nlog: {}", tail(&cond.log(), 10)))
        }
    });
    assert_eq!(up["reason"], "CalicoIsUp", "{up}");
    assert_eq!(up["message"], "Calico is running on this node", "{up}");
    for t in ["lastTransitionTime", "lastHeartbeatTime"] {
        let v = up[t].as_str().unwrap_or_default();
        assert!(
            v.len() == 20 && v.ends_with('Z') && v > "2026-01-01",
            "{t}: {up}"
        );
    }
    // The kubelet's condition is untouched.
    assert_eq!(
        node_condition(&s, "node1", "Ready")["reason"],
        "KubeletReady"
    );
    cond.assert_alive();

    // The pod going away: SIGTERM sets it again, and the process exits 0.
    assert_eq!(cond.stop(WAIT), Some(0), "{}", cond.log());
    let down = node_condition(&s, "node1", "NetworkUnavailable");
    assert_eq!(
        (&down["status"], &down["reason"], &down["message"]),
        (
            &json!("True"),
            &json!("CalicoIsDown"),
            &json!("Calico is shutting down on this node")
        ),
        "{down}"
    );
    assert_eq!(
        node_condition(&s, "node1", "Ready")["reason"],
        "KubeletReady"
    );
}

#[test]
fn node_startup_explicit_pool_cidr_wins_and_unreadable_configmaps_are_absent() {
    // An explicit CALICO_IPV4POOL_CIDR wins over kubeadm's podSubnet.
    let k = Cluster::start();
    k.seed();
    let s = k.store();
    s.create(CONFIGMAPS, "kube-system", kubeadm_config("10.244.0.0/16"))
        .unwrap();
    let r = plain_startup(
        &k,
        "node1",
        &[
            ("IP", "10.0.0.1/24"),
            ("CALICO_IPV4POOL_CIDR", "10.65.0.0/16"),
            ("CALICO_IPV6POOL_CIDR", "none"),
            ("CLUSTER_TYPE", "k8s"),
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let pool = s
        .get(Gvr::calico("ippools"), "", "default-ipv4-ippool")
        .unwrap();
    assert_eq!(pool["spec"]["cidr"], "10.65.0.0/16", "{pool}");
    let ci = s
        .get(Gvr::calico("clusterinformations"), "", "default")
        .unwrap();
    assert_eq!(ci["spec"]["clusterType"], "k8s,kubeadm,kdd", "{ci}");

    // 403 on both ConfigMaps (RBAC without configmaps get): not a kubeadm cluster, so no
    // kubeadm CIDR and no kubeadm cluster type; start-up succeeds.
    let k = Cluster::start();
    k.seed();
    let s = k.store();
    s.create(CONFIGMAPS, "kube-system", kubeadm_config("10.244.0.0/16"))
        .unwrap();
    let gets = || k.api.stats().request_count("get", "", "configmaps");
    let before = gets();
    k.api.fail_next(
        margay_apiserver::FaultMatcher::any()
            .verb("get")
            .resource("configmaps"),
        403,
        2,
    );
    let r = plain_startup(
        &k,
        "node1",
        &[("IP", "10.0.0.1/24"), ("CALICO_IPV6POOL_CIDR", "none")],
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(gets() - before, 2, "both ConfigMaps asked for once");
    let pool = s
        .get(Gvr::calico("ippools"), "", "default-ipv4-ippool")
        .unwrap();
    assert_ne!(pool["spec"]["cidr"], "10.244.0.0/16", "{pool}");
    let ci = s
        .get(Gvr::calico("clusterinformations"), "", "default")
        .unwrap();
    assert_eq!(ci["spec"]["clusterType"], "kdd", "{ci}");

    // Any other failure stops start-up, saying which ConfigMap and what to check.
    k.api.fail_next(
        margay_apiserver::FaultMatcher::any()
            .verb("get")
            .resource("configmaps")
            .name("kubeadm-config"),
        500,
        1,
    );
    let r = plain_startup(&k, "node2", &[("IP", "10.0.0.2/24")]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.err.contains("ConfigMap kube-system/kubeadm-config") && r.err.contains("reachable"),
        "{r:?}"
    );
    assert!(!k.path("root-node2/var/lib/calico/nodename").exists());

    // CALICO_K8S_NODE_REF naming a Node the cluster lacks is fatal, naming the variable.
    let r = plain_startup(
        &k,
        "node2",
        &[("IP", "10.0.0.2/24"), ("CALICO_K8S_NODE_REF", "ghost")],
    );
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("CALICO_K8S_NODE_REF=\"ghost\""), "{r:?}");
}

#[test]
fn network_condition_follows_the_node_ref_and_writes_nothing_without_calico_networking() {
    let k = Cluster::start();
    k.seed();
    let s = k.store();
    set_kubelet_conditions(&s, "node1");
    set_kubelet_conditions(&s, "node2");
    let patches = || k.api.stats().request_count("patch", "", "nodes");

    // CALICO_NETWORKING_BACKEND=none: nothing is written, not even on SIGTERM. (Nothing to
    // wait for either, so a process that ignored it would clear the condition at once.)
    let (version, before) = (rv(&s.get(NODES, "", "node1").unwrap()), patches());
    let mut none = network_condition(&k, "node1", &[("CALICO_NETWORKING_BACKEND", "none")]);
    std::thread::sleep(Duration::from_millis(1500));
    none.assert_alive();
    assert_eq!(none.stop(WAIT), Some(0), "{}", none.log());
    assert_eq!(rv(&s.get(NODES, "", "node1").unwrap()), version);
    assert_eq!(patches(), before);
    assert!(
        none.log().contains("CALICO_NETWORKING_BACKEND=none"),
        "{}",
        none.log()
    );

    // The condition is the Kubernetes Node's named by CALICO_K8S_NODE_REF (the Calico node
    // name may differ); with nothing to wait for it is cleared at once.
    let mut cond = network_condition(
        &k,
        "calico-name",
        &[
            ("CALICO_NETWORKING_BACKEND", "vxlan"),
            ("CALICO_K8S_NODE_REF", "node2"),
        ],
    );
    wait_for("node2's NetworkUnavailable cleared", WAIT, || {
        cond.assert_alive();
        let c = node_condition(&s, "node2", "NetworkUnavailable");
        if c["reason"] == "CalicoIsUp" {
            Ok(())
        } else {
            Err(format!("{c}\nlog: {}", tail(&cond.log(), 10)))
        }
    });
    assert_eq!(cond.stop(WAIT), Some(0), "{}", cond.log());
    assert_eq!(
        node_condition(&s, "node2", "NetworkUnavailable")["reason"],
        "CalicoIsDown"
    );
    assert_eq!(
        node_condition(&s, "node1", "NetworkUnavailable")["reason"],
        "NoRouteCreated"
    );
}

/// etcd as the datastore with a KUBECONFIG (calico-node in a cluster that keeps Calico's data
/// in etcd): start-up still reads the cluster as Calico's does — kubeadm's podSubnet for the
/// pool, the Kubernetes Node's InternalIP for kubernetes-internal-ip — and writes to etcd.
#[test]
fn node_startup_on_etcd_with_a_kubeconfig_reads_the_cluster() {
    let mut etcd = margay_testkit::etcd::EtcdServer::start().unwrap();
    etcd.wait_healthy().unwrap();
    let k = Cluster::start();
    let s = k.store();
    s.create(NODES, "", k8s_node("node-lo", "127.0.0.1", json!({})))
        .unwrap();
    s.create(CONFIGMAPS, "kube-system", kubeadm_config("10.244.0.0/16"))
        .unwrap();
    let on_etcd = |c: &mut Command| {
        c.env("DATASTORE_TYPE", "etcdv3")
            .env("ETCD_ENDPOINTS", etcd.endpoint());
    };
    let mut c = k.margay();
    on_etcd(&mut c);
    c.args(["node", "startup", "--root"])
        .arg(k.path("root-node-lo"))
        .env("NODENAME", "node-lo")
        .env("IP", "autodetect")
        .env("IP_AUTODETECTION_METHOD", "kubernetes-internal-ip")
        .env("CALICO_IPV6POOL_CIDR", "none");
    let r = run(c);
    assert_eq!(r.code, 0, "{r:?}");
    let ctl = |args: &[&str]| {
        let mut c = k.margay();
        on_etcd(&mut c);
        c.arg("ctl").args(args);
        let r = run(c);
        assert_eq!(r.code, 0, "{r:?}");
        serde_json::from_str::<Value>(&r.out).unwrap()
    };
    let pool = ctl(&["get", "ippool", "default-ipv4-ippool", "-o", "json"]);
    assert_eq!(pool["spec"]["cidr"], "10.244.0.0/16", "{pool}");
    let node = ctl(&["get", "node", "node-lo", "-o", "json"]);
    assert_eq!(node["spec"]["bgp"]["ipv4Address"], "127.0.0.1/8", "{node}");
    let ci = ctl(&["get", "clusterinformation", "default", "-o", "json"]);
    assert_eq!(ci["spec"]["clusterType"], "kubeadm", "{ci}");
    // Nothing of Calico's was written to the API server: it is etcd's.
    assert!(
        s.list(Gvr::calico("ippools"), None, "").unwrap().is_empty()
            && s.get(NODES, "", "node-lo").unwrap()["metadata"]["annotations"]
                .as_object()
                .is_none_or(|a| a.keys().all(|k| !k.starts_with("projectcalico.org/")))
    );
}
