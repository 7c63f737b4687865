//! Many simultaneous ADDs, etcd from the network configuration, help, delegated IPAM,
//! random kills, and the network's profile for other runtimes.

use super::*;

/// A storm: 100 ADDs for 100 pods started at once on one node, then 100 DELs at once. All
/// succeed well within their time limit, with 100 different addresses.
#[test]
fn a_hundred_simultaneous_adds() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.91.0.0/24", 26)]);
    let conf = node.conf(json!({"log_level": "warn"}));
    let pods: Vec<Pod> = (0..100).map(|i| node.pod(&format!("storm-{i}"))).collect();
    let started = Instant::now();
    let children: Vec<Child> = pods
        .iter()
        .map(|p| node.spawn(&exe(), "ADD", p, &conf, &[]))
        .collect();
    let mut ips = std::collections::BTreeSet::new();
    for c in children {
        let o = output_within("a plugin run", c, RUN_TIMEOUT);
        assert!(o.status.success(), "{}", show(&o));
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        ips.insert(ips_of(&r).remove(0));
    }
    let took = started.elapsed();
    eprintln!("100 simultaneous ADDs took {took:?}");
    assert_eq!(ips.len(), 100);
    let (clean, out) = node.ipam_check();
    assert!(clean, "{out}");
    let children: Vec<Child> = pods
        .iter()
        .map(|p| node.spawn(&exe(), "DEL", p, &conf, &[]))
        .collect();
    for c in children {
        let o = output_within("a plugin run", c, RUN_TIMEOUT);
        assert!(o.status.success(), "{}", show(&o));
    }
    node.assert_clean();
}

/// The datastore named by the network configuration (datastore_type/etcd_endpoints, as in a
/// Calico conflist) wins over the environment: here etcd, while the environment says local.
/// The IPAM plugin is used, run outside any namespace: it touches no interface (only the
/// datastore, a private etcd on loopback), so it needs no test namespace.
#[test]
fn etcd_datastore_from_the_network_config() {
    if skip() {
        return;
    }
    let mut etcd = margay_testkit::etcd::EtcdServer::start().unwrap();
    etcd.wait_healthy().unwrap();
    let node = Node::build(&[pool("p4", "10.92.0.0/24", 28)], Some(etcd.endpoint()));
    let bin = node.dir().join("bin");
    let o = Command::new(exe())
        .args(["cni", "install", "--dir", bin.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let pod = node.pod("etcd-0");
    let conf = node.conf(json!({"datastore_type": "etcdv3", "etcd_endpoints": etcd.endpoint()}));
    let run = |cmd: &str| {
        let mut c = Command::new(bin.join("margay-ipam"));
        node.env(&mut c);
        c.env("CNI_COMMAND", cmd)
            .env("CNI_CONTAINERID", &pod.id)
            .env("CNI_NETNS", pod.netns_path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .env("CNI_ARGS", pod.cni_args());
        let child = spawn_with_input(c, conf.to_string().as_bytes());
        output_within("a plugin run", child, RUN_TIMEOUT)
    };
    let o = run("ADD");
    assert!(o.status.success(), "{}", show(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let ip = ips_of(&r).remove(0);
    assert!(ip.starts_with("10.92.0."), "{r}");
    assert!(
        !node.store().exists(),
        "the embedded store must not be used"
    );
    let shown = node.ctl(&["ipam", "show", "--ip", &ip]);
    assert!(
        String::from_utf8_lossy(&shown.stdout)
            .contains(&format!("Handle ID: k8s-pod-network.{}", pod.id)),
        "{}",
        show(&shown)
    );
    let o = run("DEL");
    assert!(o.status.success(), "{}", show(&o));
    node.assert_clean();
}

#[test]
fn cni_help_explains_the_plugins() {
    let o = Command::new(exe())
        .args(["cni", "--help"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "install",
        "CNI_COMMAND",
        "margay-ipam",
        "nodename",
        "portmap",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
}

/// Another IPAM plugin (the reference host-local, from CNI_PATH) assigns the address; margay
/// does the rest, as Calico's plugin does with `"ipam": {"type": "host-local"}`.
#[test]
fn delegates_to_another_ipam_plugin() {
    if skip() {
        return;
    }
    if !Path::new("/usr/lib/cni/host-local").exists() {
        eprintln!(
            "skipped: /usr/lib/cni/host-local is missing (scripts/setup installs containernetworking-plugins)"
        );
        return;
    }
    let node = Node::new(&[pool("unused", "10.94.0.0/24", 28)]);
    let pod = node.pod("hl-0");
    let conf = node.conf(json!({"ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.93.0.0/24"}]],
        "dataDir": node.dir().join("host-local"),
    }}));
    let result = node.add(&pod, &conf);
    let ip = ips_of(&result).remove(0);
    assert!(ip.starts_with("10.93.0."), "{result}");
    assert_eq!(result["ips"][0]["address"], format!("{ip}/32"));
    ping(&pod.ns, "192.0.2.1");
    let o = node.check(&pod, &conf, &result);
    assert!(o.status.success(), "{}", show(&o));
    // margay's own IPAM was not used.
    let (_, out) = node.ipam_check();
    assert!(out.contains("IPAM blocks record 0 allocations"), "{out}");
    node.del(&pod, &conf);
    node.assert_clean();
    // host-local released it too: its data directory holds no address file any more.
    let left: Vec<String> = std::fs::read_dir(node.dir().join("host-local/k8s-pod-network"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("10."))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

/// SIGKILL at pseudo-random moments of ADD (from before IPAM to after the endpoint write),
/// each followed by the runtime's DEL: nothing may be left, whichever step was interrupted.
#[test]
fn killed_at_random_moments_then_del_leaks_nothing() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.95.0.0/24", 28)]);
    let conf = node.conf(json!({"log_level": "warn"}));
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    for round in 0..12 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_micros(seed % 15_000);
        let pod = node.pod(&format!("rnd-{round}"));
        let mut child = node.spawn(&exe(), "ADD", &pod, &conf, &[]);
        std::thread::sleep(delay);
        let _ = child.kill();
        child.wait().unwrap();
        node.del(&pod, &conf);
        node.assert_clean();
        assert!(
            !pod.ns.ip(&["-o", "link"]).unwrap().contains("eth0"),
            "round {round} ({delay:?}): the container interface survived DEL"
        );
    }
}

/// A runtime that is not Kubernetes (orchestrator `cni`, as podman: only K8S_POD_NAME in
/// CNI_ARGS) gets the network's profile made for it, as Calico's plugin makes it: created once
/// even by simultaneous ADDs, egress allowed, ingress from the network's own endpoints. With a
/// policy handler (`policy.type`) no profile is made.
#[test]
fn the_networks_profile_is_made_for_other_runtimes() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.92.0.0/24", 26)]);
    let conf = node.conf(json!({"name": "margaynet", "log_level": "warn"}));
    let pods: Vec<Pod> = (0..6).map(|i| node.pod(&format!("net-{i}"))).collect();
    let children: Vec<Child> = pods
        .iter()
        .map(|p| {
            let args = format!("IgnoreUnknown=1;K8S_POD_NAME={}", p.name);
            node.spawn(&exe(), "ADD", p, &conf, &[("CNI_ARGS", &args)])
        })
        .collect();
    for c in children {
        let o = output_within("a plugin run", c, RUN_TIMEOUT);
        assert!(o.status.success(), "{}", show(&o));
    }
    let o = node.ctl(&["get", "profile", "margaynet", "-o", "json"]);
    assert!(o.status.success(), "{}", show(&o));
    let p: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(p["spec"]["egress"], json!([{"action": "Allow"}]));
    assert_eq!(
        p["spec"]["ingress"],
        json!([{"action": "Allow", "source": {"selector": "has(margaynet)"}}])
    );
    assert_eq!(p["spec"]["labelsToApply"], json!({"margaynet": ""}));
    let o = node.ctl(&["get", "workloadendpoints", "-n", "default", "-o", "json"]);
    let weps: Value = serde_json::from_slice(&o.stdout).unwrap();
    let items = weps["items"].as_array().unwrap();
    assert_eq!(items.len(), 6, "{weps}");
    assert!(
        items
            .iter()
            .all(|w| w["spec"]["orchestrator"] == "cni"
                && w["spec"]["profiles"] == json!(["margaynet"])),
        "{weps}"
    );
    for p in &pods {
        let args = format!("IgnoreUnknown=1;K8S_POD_NAME={}", p.name);
        let o = node.run("DEL", p, &conf, &[("CNI_ARGS", &args)]);
        assert!(o.status.success(), "{}", show(&o));
    }

    // A policy handler: no profile.
    let k8s = node.conf(json!({"name": "othernet", "policy": {"type": "k8s"}}));
    let pod = node.pod("net-k8s");
    node.add(&pod, &k8s);
    assert!(!node.ctl(&["get", "profile", "othernet"]).status.success());
    node.del(&pod, &k8s);
    node.assert_clean();
}
