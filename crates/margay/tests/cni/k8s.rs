//! Kubernetes: the pod (and namespace) from the API.

use super::*;

//
// The plugin reads its pod (and namespace) from an API server double that serves inside the
// node's host namespace (the plugin runs there and reaches it on that namespace's loopback).
// With the embedded store the pod supplies labels and annotations; with the Kubernetes
// datastore (`datastore_type: kubernetes`) the endpoint *is* the pod and IPAM lives in
// Calico's custom resources on the same server.

use margay_apiserver::{ApiServer, Gvr, ServerOptions};

const PODS: Gvr<'static> = Gvr::core("pods");
const NAMESPACES: Gvr<'static> = Gvr::core("namespaces");
const NODES: Gvr<'static> = Gvr::core("nodes");

/// The API server double of one test, in the node's host namespace; dropped (stopped) before
/// the node's namespaces go.
struct Api {
    server: ApiServer,
    kubeconfig: PathBuf,
}

impl Api {
    fn start(node: &Node) -> Api {
        let ns =
            margay_netlink::netns::open(Path::new(&format!("/run/netns/{}", node.host().name())))
                .unwrap();
        let server = margay_netlink::netns::run_in(&ns, || {
            ApiServer::start(ServerOptions {
                calico_crds: true,
                ..ServerOptions::default()
            })
            .map_err(std::io::Error::other)
        })
        .unwrap();
        let kubeconfig = node.dir().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let api = Api { server, kubeconfig };
        api.namespace("default", json!({}));
        api
    }

    fn namespace(&self, name: &str, annotations: Value) {
        let s = self.server.store();
        let obj = json!({"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": name, "annotations": annotations}});
        if s.get(NAMESPACES, "", name).is_ok() {
            s.delete(NAMESPACES, "", name).unwrap();
        }
        s.create(NAMESPACES, "", obj).unwrap();
    }

    /// A pod scheduled on `node` (node-a is the test node's name).
    fn pod(
        &self,
        ns: &str,
        name: &str,
        node: &str,
        labels: Value,
        annotations: Value,
        spec: Value,
    ) {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}});
        merge(&mut pod["spec"], spec);
        self.server.store().create(PODS, ns, pod).unwrap();
    }

    fn annotations(&self, ns: &str, name: &str) -> Value {
        let pod = self.server.store().get(PODS, ns, name).unwrap();
        pod["metadata"]["annotations"].clone()
    }

    /// Calico's IPAM custom resources of a kind (`ipamhandles`, `ipamblocks`, `blockaffinities`).
    fn crs(&self, plural: &str) -> Vec<Value> {
        self.server
            .store()
            .list(Gvr::calico(plural), None, "")
            .unwrap()
    }

    fn requests(&self) -> std::collections::BTreeMap<(String, String, String), u64> {
        self.server.stats().requests
    }

    /// `margay ctl` against this server, from the host namespace (where it listens).
    fn ctl(&self, node: &Node, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = node.host().exec(exe());
        c.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATASTORE_TYPE", "kubernetes")
            .env("KUBECONFIG", &self.kubeconfig)
            .arg("ctl")
            .args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    }

    /// The network configuration: the node's, reading pods through this server, with
    /// Calico's policy handler (so no network profile is made).
    fn conf(&self, node: &Node, extra: Value) -> Value {
        let mut c = node.conf(json!({
            "policy": {"type": "k8s"},
            "kubernetes": {"kubeconfig": self.kubeconfig},
        }));
        merge(&mut c, extra);
        c
    }

    /// The configuration of the Kubernetes datastore (IPAM and endpoints in this server),
    /// with its pools and the Kubernetes Node of node-a.
    fn kdd_conf(&self, node: &Node, pools: &[String]) -> Value {
        let f = node.dir().join("kdd-pools.yaml");
        std::fs::write(&f, pools.join("---\n")).unwrap();
        let o = self.ctl(node, &["apply", "-f", f.to_str().unwrap()], &[]);
        assert!(o.status.success(), "{}", show(&o));
        let _ = self.server.store().create(
            NODES,
            "",
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": "node-a", "labels": {"kubernetes.io/hostname": "node-a"}}}),
        );
        self.conf(node, json!({"datastore_type": "kubernetes"}))
    }

    /// Nothing of any pod left in the Kubernetes datastore: no handle, no address in a block,
    /// no pod with addresses, no host interface.
    fn assert_kdd_clean(&self, node: &Node) {
        let handles = self.crs("ipamhandles");
        assert!(handles.is_empty(), "handles left: {handles:?}");
        for b in self.crs("ipamblocks") {
            let allocated = b["spec"]["allocations"]
                .as_array()
                .map_or(0, |a| a.iter().filter(|x| !x.is_null()).count());
            assert_eq!(allocated, 0, "addresses left in {b}");
        }
        for p in self.server.store().list(PODS, None, "").unwrap() {
            let ip = &p["metadata"]["annotations"]["cni.projectcalico.org/podIP"];
            assert!(ip.is_null() || ip == "", "pod still has addresses: {p}");
        }
        let links = node.host().ip(&["-o", "link"]).unwrap();
        assert!(!links.contains("cali"), "host interfaces left: {links}");
    }
}

fn k8s_args(ns: &str, pod: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod}")
}

/// The WorkloadEndpoint of a pod of node-a in the embedded store, as JSON.
fn local_wep(node: &Node, ns: &str, pod: &str) -> Value {
    let name = format!("node--a-k8s-{}-eth0", pod.replace('-', "--"));
    let o = node.ctl(&["get", "wep", "-n", ns, &name, "-o", "json"]);
    assert!(o.status.success(), "{}", show(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn count(
    reqs: &std::collections::BTreeMap<(String, String, String), u64>,
    before: &std::collections::BTreeMap<(String, String, String), u64>,
    verb: &str,
    resource: &str,
) -> u64 {
    let k = (verb.to_string(), String::new(), resource.to_string());
    reqs.get(&k).copied().unwrap_or(0) - before.get(&k).copied().unwrap_or(0)
}

/// The embedded store, the pod read from the API: its labels and service account (not the
/// network config's `args.cni`) reach the WorkloadEndpoint, with Calico's profiles and the
/// pod's named ports; the plugin asks the API exactly one pod and one namespace, and writes
/// no pod annotation (Calico writes them only in the Kubernetes datastore).
#[test]
fn k8s_pod_labels_reach_the_workload_endpoint() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.60.0.0/24", 28)]);
    let api = Api::start(&node);
    let pod = node.pod("lbl-0");
    api.pod(
        "default",
        "lbl-0",
        "node-a",
        json!({"app": "web", "tier": "frontend"}),
        json!({}),
        json!({"serviceAccountName": "web-sa",
               "containers": [{"name": "c", "image": "busybox",
                               "ports": [{"name": "http", "containerPort": 8080}]}]}),
    );
    let conf = api.conf(
        &node,
        json!({"args": {"cni": {"labels": [{"key": "app", "value": "from-args"}]}}}),
    );
    let before = api.requests();
    let result = node.add(&pod, &conf);
    let after = api.requests();
    assert_eq!(count(&after, &before, "get", "pods"), 1, "{after:?}");
    assert_eq!(count(&after, &before, "get", "namespaces"), 1, "{after:?}");
    let all: u64 = after.values().sum::<u64>() - before.values().sum::<u64>();
    assert_eq!(all, 2, "only the pod and its namespace: {after:?}");
    let wep = local_wep(&node, "default", "lbl-0");
    let labels = &wep["metadata"]["labels"];
    assert_eq!(labels["app"], "web", "{wep}");
    assert_eq!(labels["tier"], "frontend", "{wep}");
    assert_eq!(
        labels["projectcalico.org/serviceaccount"], "web-sa",
        "{wep}"
    );
    assert_eq!(labels["projectcalico.org/namespace"], "default", "{wep}");
    assert_eq!(
        wep["spec"]["profiles"],
        json!(["kns.default", "ksa.default.web-sa"]),
        "{wep}"
    );
    assert_eq!(wep["spec"]["serviceAccountName"], "web-sa", "{wep}");
    assert_eq!(wep["spec"]["ports"][0]["name"], "http", "{wep}");
    assert_eq!(wep["spec"]["ports"][0]["port"], 8080, "{wep}");
    assert_eq!(
        wep["spec"]["ipNetworks"][0],
        format!("{}/32", ips_of(&result)[0])
    );
    assert!(
        api.annotations("default", "lbl-0")
            .get("cni.projectcalico.org/podIP")
            .is_none(),
        "no pod annotations outside the Kubernetes datastore"
    );
    node.del(&pod, &conf);
    node.assert_clean();
    drop(api);
}

/// `cni.projectcalico.org/ipv4pools` on the pod picks the pool, by name or by CIDR; a pool
/// that does not exist or a value that is not a JSON list is a CNI error naming the annotation
/// and its value, and nothing is allocated for it.
#[test]
fn k8s_ipv4pools_annotation_picks_the_pool() {
    if skip() {
        return;
    }
    let node = Node::new(&[
        pool("p-a", "10.61.1.0/24", 28),
        pool("p-b", "10.61.2.0/24", 28),
        pool("p-c", "10.61.3.0/24", 28),
    ]);
    let api = Api::start(&node);
    let conf = api.conf(&node, json!({}));
    let cases = [
        ("byname-0", "[\"p-b\"]", "10.61.2."),
        ("bycidr-0", "[\"10.61.3.0/24\"]", "10.61.3."),
    ];
    let mut pods = Vec::new();
    for (name, pools, prefix) in cases {
        api.pod(
            "default",
            name,
            "node-a",
            json!({}),
            json!({"cni.projectcalico.org/ipv4pools": pools}),
            json!({}),
        );
        let pod = node.pod(name);
        let ip = ips_of(&node.add(&pod, &conf)).remove(0);
        assert!(ip.starts_with(prefix), "{name}: {ip} not from {pools}");
        pods.push(pod);
    }
    for (name, value, needle) in [
        ("nopool-0", "[\"nope\"]", "nope"),
        ("notjson-0", "p-b", "'p-b'"),
        ("v6cidr-0", "[\"fd00::/64\"]", "fd00::/64"),
    ] {
        api.pod(
            "default",
            name,
            "node-a",
            json!({}),
            json!({"cni.projectcalico.org/ipv4pools": value}),
            json!({}),
        );
        let pod = node.pod(name);
        let e = error_of(&node.run("ADD", &pod, &conf, &[]));
        assert_eq!(e["code"], 107, "{name}: {e}");
        let msg = e["msg"].as_str().unwrap();
        assert!(
            msg.contains("cni.projectcalico.org/ipv4pools") && msg.contains(needle),
            "{name}: {e}"
        );
        assert!(!pod.ns.ip(&["-o", "link"]).unwrap().contains("eth0"));
        pods.push(pod);
    }
    let (clean, out) = node.ipam_check();
    assert!(clean, "{out}");
    assert!(out.contains("IPAM blocks record 2 allocations"), "{out}");
    for p in &pods {
        node.del(p, &conf);
    }
    node.assert_clean();
    drop(api);
}

/// A namespace's ipv4pools annotation applies to its pods; a pod's own wins.
#[test]
fn k8s_namespace_ipv4pools_annotation() {
    if skip() {
        return;
    }
    let node = Node::new(&[
        pool("p-a", "10.62.1.0/24", 28),
        pool("p-b", "10.62.2.0/24", 28),
        pool("p-c", "10.62.3.0/24", 28),
    ]);
    let api = Api::start(&node);
    api.namespace(
        "team",
        json!({"cni.projectcalico.org/ipv4pools": "[\"p-b\"]"}),
    );
    let conf = api.conf(&node, json!({}));
    let cases = [
        ("nsdefault-0", json!({}), "10.62.2."),
        (
            "podwins-0",
            json!({"cni.projectcalico.org/ipv4pools": "[\"p-c\"]"}),
            "10.62.3.",
        ),
    ];
    let mut pods = Vec::new();
    for (name, annotations, prefix) in cases {
        api.pod("team", name, "node-a", json!({}), annotations, json!({}));
        let pod = node.pod(name);
        let args = k8s_args("team", name);
        let o = node.run("ADD", &pod, &conf, &[("CNI_ARGS", &args)]);
        assert!(o.status.success(), "{}", show(&o));
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        let ip = ips_of(&r).remove(0);
        assert!(ip.starts_with(prefix), "{name}: {ip}, expected {prefix}*");
        pods.push((pod, args));
    }
    for (pod, args) in &pods {
        let o = node.run("DEL", pod, &conf, &[("CNI_ARGS", args)]);
        assert!(o.status.success(), "{}", show(&o));
    }
    node.assert_clean();
    drop(api);
}

/// `cni.projectcalico.org/ipAddrs` assigns exactly the requested address through IPAM; the
/// same address for another pod is refused naming the annotation; an invalid value is refused
/// before anything is allocated; a new sandbox of the same pod gets the address its previous
/// sandbox held (Calico releases the old endpoint's addresses first).
#[test]
fn k8s_ip_addrs_assigns_the_requested_address() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.63.0.0/24", 28)]);
    let api = Api::start(&node);
    let conf = api.conf(&node, json!({}));
    api.pod(
        "default",
        "fixed-0",
        "node-a",
        json!({}),
        json!({"cni.projectcalico.org/ipAddrs": "[\"10.63.0.77\"]"}),
        json!({}),
    );
    let pod = node.pod("fixed-0");
    let r = node.add(&pod, &conf);
    assert_eq!(ips_of(&r), vec!["10.63.0.77".to_string()]);
    ping(&pod.ns, "192.0.2.1");
    let shown = node.ctl(&["ipam", "show", "--ip", "10.63.0.77"]);
    assert!(
        String::from_utf8_lossy(&shown.stdout)
            .contains(&format!("Handle ID: k8s-pod-network.{}", pod.id)),
        "{}",
        show(&shown)
    );
    // Another pod asking for the same address.
    api.pod(
        "default",
        "fixed-1",
        "node-a",
        json!({}),
        json!({"cni.projectcalico.org/ipAddrs": "[\"10.63.0.77\"]"}),
        json!({}),
    );
    let other = node.pod("fixed-1");
    let e = error_of(&node.run("ADD", &other, &conf, &[]));
    assert_eq!(e["code"], 103, "{e}");
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("default/fixed-1") && msg.contains("ipAddrs") && msg.contains("10.63.0.77"),
        "{e}"
    );
    // Two IPv4 addresses: refused before IPAM.
    api.pod(
        "default",
        "fixed-2",
        "node-a",
        json!({}),
        json!({"cni.projectcalico.org/ipAddrs": "[\"10.63.0.8\", \"10.63.0.9\"]"}),
        json!({}),
    );
    let two = node.pod("fixed-2");
    let e = error_of(&node.run("ADD", &two, &conf, &[]));
    assert_eq!(e["code"], 107, "{e}");
    assert!(
        e["msg"].as_str().unwrap().contains("more than one IPv4"),
        "{e}"
    );
    let (clean, out) = node.ipam_check();
    assert!(clean, "{out}");
    assert!(out.contains("IPAM blocks record 1 allocations"), "{out}");
    // The pod's sandbox is re-created (a new container) before the old one's DEL came.
    let again = Pod {
        ns: Netns::new("cni-pod").unwrap(),
        id: format!("{}x2", pod.id),
        name: pod.name.clone(),
    };
    let r2 = node.add(&again, &conf);
    assert_eq!(ips_of(&r2), vec!["10.63.0.77".to_string()]);
    let shown = node.ctl(&["ipam", "show", "--ip", "10.63.0.77"]);
    assert!(
        String::from_utf8_lossy(&shown.stdout)
            .contains(&format!("Handle ID: k8s-pod-network.{}", again.id)),
        "{}",
        show(&shown)
    );
    // The old sandbox's DEL leaves the new one's endpoint and address alone.
    node.del(&pod, &conf);
    assert_eq!(
        local_wep(&node, "default", "fixed-0")["spec"]["containerID"],
        again.id.as_str()
    );
    for p in [&again, &other, &two] {
        node.del(p, &conf);
    }
    node.assert_clean();
    drop(api);
}

/// ipAddrsNoIpam: refused unless feature_control.ip_addrs_no_ipam, and together with ipAddrs;
/// with the flag the pod gets the address without IPAM holding anything.
#[test]
fn k8s_ip_addrs_no_ipam_needs_the_feature_flag() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.64.0.0/24", 28)]);
    let api = Api::start(&node);
    api.pod(
        "default",
        "noipam-0",
        "node-a",
        json!({}),
        json!({"cni.projectcalico.org/ipAddrsNoIpam": "[\"10.64.9.9\"]"}),
        json!({}),
    );
    let pod = node.pod("noipam-0");
    let off = api.conf(&node, json!({}));
    let e = error_of(&node.run("ADD", &pod, &off, &[]));
    assert_eq!(e["code"], 107, "{e}");
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("ipAddrsNoIpam") && msg.contains("feature_control.ip_addrs_no_ipam"),
        "{e}"
    );
    assert!(!pod.ns.ip(&["-o", "link"]).unwrap().contains("eth0"));
    node.assert_clean();

    let on = api.conf(
        &node,
        json!({"feature_control": {"ip_addrs_no_ipam": true}}),
    );
    let r = node.add(&pod, &on);
    assert_eq!(ips_of(&r), vec!["10.64.9.9".to_string()]);
    let addrs = pod.ns.ip(&["-o", "addr", "show", "dev", "eth0"]).unwrap();
    assert!(addrs.contains("10.64.9.9/32"), "{addrs}");
    ping(&pod.ns, "192.0.2.1");
    let (clean, out) = node.ipam_check();
    assert!(clean, "{out}");
    assert!(out.contains("IPAM blocks record 0 allocations"), "{out}");
    assert_eq!(
        local_wep(&node, "default", "noipam-0")["spec"]["ipNetworks"],
        json!(["10.64.9.9/32"])
    );
    node.del(&pod, &on);
    node.assert_clean();

    api.pod(
        "default",
        "both-0",
        "node-a",
        json!({}),
        json!({"cni.projectcalico.org/ipAddrsNoIpam": "[\"10.64.9.8\"]",
               "cni.projectcalico.org/ipAddrs": "[\"10.64.0.8\"]"}),
        json!({}),
    );
    let both = node.pod("both-0");
    let e = error_of(&node.run("ADD", &both, &on, &[]));
    assert_eq!(e["code"], 107, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("together"), "{e}");
    node.assert_clean();
    drop(api);
}

/// floatingIPs: refused (before anything is allocated) unless feature_control.floating_ips;
/// with it the endpoint NATs each to the pod's address.
#[test]
fn k8s_floating_ips_become_ip_nats() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.65.0.0/24", 28)]);
    let api = Api::start(&node);
    api.pod(
        "default",
        "float-0",
        "node-a",
        json!({}),
        json!({"cni.projectcalico.org/floatingIPs": "[\"203.0.113.7\"]"}),
        json!({}),
    );
    let pod = node.pod("float-0");
    let off = api.conf(&node, json!({}));
    let e = error_of(&node.run("ADD", &pod, &off, &[]));
    assert_eq!(e["code"], 107, "{e}");
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("floatingIPs")
            && msg.contains("203.0.113.7")
            && msg.contains("feature_control.floating_ips"),
        "{e}"
    );
    node.assert_clean();
    let on = api.conf(&node, json!({"feature_control": {"floating_ips": true}}));
    let r = node.add(&pod, &on);
    let ip = ips_of(&r).remove(0);
    let wep = local_wep(&node, "default", "float-0");
    assert_eq!(
        wep["spec"]["ipNATs"],
        json!([{"internalIP": ip, "externalIP": "203.0.113.7"}]),
        "{wep}"
    );
    node.del(&pod, &on);
    node.assert_clean();
    drop(api);
}

/// A pod the API does not have: ADD fails with "unknown container" naming namespace/pod, and
/// nothing is allocated in the Kubernetes datastore (no handle, block, affinity), no interface
/// made. An unreachable API server is "try again later", also leaving nothing.
#[test]
fn k8s_unknown_pod_fails_add_with_nothing_leaked() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("unused", "10.66.9.0/24", 28)]);
    let api = Api::start(&node);
    let conf = api.kdd_conf(&node, &[pool("p4", "10.66.0.0/24", 28)]);
    let pod = node.pod("ghost-0");
    let e = error_of(&node.run("ADD", &pod, &conf, &[]));
    assert_eq!(e["code"], 3, "{e}");
    assert!(
        e["msg"].as_str().unwrap().contains("default/ghost-0"),
        "{e}"
    );
    for plural in ["ipamhandles", "ipamblocks", "blockaffinities"] {
        assert!(
            api.crs(plural).is_empty(),
            "{plural}: {:?}",
            api.crs(plural)
        );
    }
    assert!(!pod.ns.ip(&["-o", "link"]).unwrap().contains("eth0"));
    api.assert_kdd_clean(&node);
    // The runtime's DEL after the failed ADD is fine.
    node.del(&pod, &conf);

    // The embedded store, the API server down: try again later, nothing allocated.
    api.pod(
        "default",
        "down-0",
        "node-a",
        json!({}),
        json!({}),
        json!({}),
    );
    let local = api.conf(&node, json!({}));
    let down = node.pod("down-0");
    api.server.stop();
    let e = error_of(&node.run("ADD", &down, &local, &[]));
    assert_eq!(e["code"], 11, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("default/down-0"), "{e}");
    node.assert_clean();
    // Bound in the node's host namespace, where the plugin dials it.
    let host_ns =
        margay_netlink::netns::open(Path::new(&format!("/run/netns/{}", node.host().name())))
            .unwrap();
    margay_netlink::netns::run_in(&host_ns, || {
        api.server.start_again().map_err(std::io::Error::other)
    })
    .unwrap();
    node.add(&down, &local);
    node.del(&down, &local);
    node.assert_clean();
    drop(api);
}

/// A host-network pod is never wired: ADD succeeds with an empty result, makes no interface,
/// assigns no address, writes nothing on the pod; CHECK and DEL of it succeed.
#[test]
fn k8s_host_network_pods_are_never_wired() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("unused", "10.67.9.0/24", 28)]);
    let api = Api::start(&node);
    let conf = api.kdd_conf(&node, &[pool("p4", "10.67.0.0/24", 28)]);
    api.pod(
        "default",
        "hostnet-0",
        "node-a",
        json!({"app": "agent"}),
        json!({}),
        json!({"hostNetwork": true}),
    );
    let pod = node.pod("hostnet-0");
    let result = node.add(&pod, &conf);
    assert_eq!(result["ips"], json!([]), "{result}");
    assert!(result.get("interfaces").is_none(), "{result}");
    assert!(!pod.ns.ip(&["-o", "link"]).unwrap().contains("eth0"));
    assert!(api.crs("ipamhandles").is_empty());
    assert!(api.crs("blockaffinities").is_empty(), "no block claimed");
    assert!(
        api.annotations("default", "hostnet-0")
            .get("cni.projectcalico.org/podIP")
            .is_none()
    );
    let o = node.check(&pod, &conf, &result);
    assert!(o.status.success(), "{}", show(&o));
    node.del(&pod, &conf);
    api.assert_kdd_clean(&node);
    // The embedded store too.
    let local = api.conf(&node, json!({}));
    let r = node.add(&pod, &local);
    assert_eq!(r["ips"], json!([]), "{r}");
    node.assert_clean();
    drop(api);
}

/// The Kubernetes datastore: DEL of an old sandbox (another container ID) leaves the pod's
/// addresses alone; DEL of the current one clears podIP/podIPs and keeps containerID, as
/// Calico does.
#[test]
fn kdd_del_clears_the_pods_addresses_only_for_its_own_container() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("unused", "10.68.9.0/24", 28)]);
    let api = Api::start(&node);
    let conf = api.kdd_conf(&node, &[pool("p4", "10.68.0.0/24", 28)]);
    api.pod(
        "default",
        "del-0",
        "node-a",
        json!({}),
        json!({}),
        json!({}),
    );
    let pod = node.pod("del-0");
    let ip = ips_of(&node.add(&pod, &conf)).remove(0);
    let a = api.annotations("default", "del-0");
    assert_eq!(a["cni.projectcalico.org/podIP"], format!("{ip}/32"), "{a}");
    assert_eq!(a["cni.projectcalico.org/podIPs"], format!("{ip}/32"), "{a}");
    assert_eq!(
        a["cni.projectcalico.org/containerID"],
        pod.id.as_str(),
        "{a}"
    );
    // DEL for an old sandbox of the same pod.
    let old = Pod {
        ns: Netns::new("cni-pod").unwrap(),
        id: format!("{}old", pod.id),
        name: pod.name.clone(),
    };
    node.del(&old, &conf);
    let a = api.annotations("default", "del-0");
    assert_eq!(a["cni.projectcalico.org/podIP"], format!("{ip}/32"), "{a}");
    assert_eq!(
        a["cni.projectcalico.org/containerID"],
        pod.id.as_str(),
        "{a}"
    );
    // DEL for the current one.
    node.del(&pod, &conf);
    let a = api.annotations("default", "del-0");
    assert_eq!(a["cni.projectcalico.org/podIP"], "", "{a}");
    assert_eq!(a["cni.projectcalico.org/podIPs"], "", "{a}");
    assert_eq!(
        a["cni.projectcalico.org/containerID"],
        pod.id.as_str(),
        "{a}"
    );
    api.assert_kdd_clean(&node);
    drop(api);
}

/// The Kubernetes datastore end to end: the WorkloadEndpoint Felix would see (`margay ctl get
/// workloadendpoints -o yaml`, through the datastore) has the pod's labels, the addresses ADD
/// returned and the name of the veth actually created, also with FELIX_INTERFACEPREFIX; the
/// plugin's identity must match the pod's (node, interface), or nothing is done.
#[test]
fn kdd_end_to_end_the_endpoint_felix_sees() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("unused", "10.69.9.0/24", 28)]);
    let api = Api::start(&node);
    let conf = api.kdd_conf(&node, &[pool("p4", "10.69.0.0/24", 28)]);
    for (name, prefix) in [("e2e-0", None), ("e2e-1", Some("tap,cali"))] {
        api.pod(
            "default",
            name,
            "node-a",
            json!({"app": "shop", "version": "v2"}),
            json!({}),
            json!({"serviceAccountName": "shop-sa"}),
        );
        let pod = node.pod(name);
        let env: Vec<(&str, &str)> = prefix
            .map(|p| vec![("FELIX_INTERFACEPREFIX", p)])
            .unwrap_or_default();
        let before = api.requests();
        let o = node.run("ADD", &pod, &conf, &env);
        assert!(o.status.success(), "{}", show(&o));
        let after = api.requests();
        let result: Value = serde_json::from_slice(&o.stdout).unwrap();
        eprintln!(
            "{name}: ADD asked the API server {} requests: {:?}",
            after.values().sum::<u64>() - before.values().sum::<u64>(),
            after
                .iter()
                .filter_map(|(k, v)| {
                    let d = v - before.get(k).copied().unwrap_or(0);
                    (d > 0).then(|| format!("{} {}: {d}", k.0, k.2))
                })
                .collect::<Vec<_>>()
        );
        assert_eq!(count(&after, &before, "get", "namespaces"), 1);
        assert_eq!(count(&after, &before, "patch", "pods"), 1);
        let ip = ips_of(&result).remove(0);
        let veth = result["interfaces"][0]["name"]
            .as_str()
            .unwrap()
            .to_string();
        let want_prefix = prefix.map_or("cali", |p| &p[..3]);
        assert!(veth.starts_with(want_prefix), "{veth}");
        let links = node.host().ip(&["-o", "link", "show", &veth]).unwrap();
        assert!(links.contains(&veth), "{links}");
        let wep_name = format!("node--a-k8s-{}-eth0", name.replace('-', "--"));
        let o = api.ctl(
            &node,
            &[
                "get",
                "workloadendpoints",
                "-n",
                "default",
                &wep_name,
                "-o",
                "yaml",
            ],
            &env,
        );
        assert!(o.status.success(), "{}", show(&o));
        let wep: Value = serde_norway::from_slice(&o.stdout).unwrap();
        assert_eq!(wep["metadata"]["labels"]["app"], "shop", "{wep}");
        assert_eq!(wep["metadata"]["labels"]["version"], "v2", "{wep}");
        assert_eq!(
            wep["metadata"]["labels"]["projectcalico.org/serviceaccount"], "shop-sa",
            "{wep}"
        );
        assert_eq!(
            wep["spec"]["ipNetworks"],
            json!([format!("{ip}/32")]),
            "{wep}"
        );
        assert_eq!(wep["spec"]["interfaceName"], veth.as_str(), "{wep}");
        assert_eq!(wep["spec"]["containerID"], pod.id.as_str(), "{wep}");
        assert_eq!(wep["spec"]["node"], "node-a", "{wep}");
        // The runtime gives CHECK the same environment as ADD.
        let mut checked = conf.clone();
        checked["prevResult"] = result.clone();
        let o = node.run("CHECK", &pod, &checked, &env);
        assert!(o.status.success(), "{}", show(&o));
        ping(&pod.ns, "192.0.2.1");
        let o = node.run("DEL", &pod, &conf, &env);
        assert!(o.status.success(), "{}", show(&o));
    }
    api.assert_kdd_clean(&node);

    // A pod scheduled on another node, and another interface than eth0: refused, nothing done.
    api.pod(
        "default",
        "elsewhere-0",
        "node-b",
        json!({}),
        json!({}),
        json!({}),
    );
    let pod = node.pod("elsewhere-0");
    let e = error_of(&node.run("ADD", &pod, &conf, &[]));
    assert_eq!(e["code"], 106, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("node-b"), "{e}");
    api.pod(
        "default",
        "net1-0",
        "node-a",
        json!({}),
        json!({}),
        json!({}),
    );
    let pod = node.pod("net1-0");
    let e = error_of(&node.run("ADD", &pod, &conf, &[("CNI_IFNAME", "net1")]));
    assert_eq!(e["code"], 4, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("net1"), "{e}");
    assert!(api.crs("ipamhandles").is_empty());
    api.assert_kdd_clean(&node);
    drop(api);
}
