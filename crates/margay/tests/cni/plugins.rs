//! Bad input, static addresses, the IPAM plugin alone, GC, and chaining with the reference
//! plugins (portmap, bandwidth).

use super::*;

#[test]
fn bad_input_is_a_cni_error_and_writes_nothing() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.86.0.0/24", 28)]);
    let pod = node.pod("bad-0");
    let conf = node.conf(json!({}));
    let run_raw = |stdin: &str, env: &[(&str, &str)]| {
        let mut c = node.host().exec(exe());
        node.env(&mut c);
        c.env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", &pod.id)
            .env("CNI_NETNS", pod.netns_path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .env("CNI_ARGS", pod.cni_args());
        for (k, v) in env {
            if v.is_empty() {
                c.env_remove(k);
            } else {
                c.env(k, v);
            }
        }
        let child = spawn_with_input(c, stdin.as_bytes());
        output_within("a plugin run", child, RUN_TIMEOUT)
    };
    let good = conf.to_string();
    let e = error_of(&run_raw("{\"cniVersion\": \"1.0.0\", \"name\": ", &[]));
    assert_eq!(e["code"], 6, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("not valid JSON"), "{e}");

    let mut v = conf.clone();
    v["cniVersion"] = json!("7.0.0");
    let e = error_of(&run_raw(&v.to_string(), &[]));
    assert_eq!(e["code"], 1, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("7.0.0"), "{e}");

    let e = error_of(&run_raw(&good, &[("CNI_NETNS", "")]));
    assert_eq!(e["code"], 4, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("CNI_NETNS"), "{e}");

    let e = error_of(&run_raw(&good, &[("CNI_CONTAINERID", "")]));
    assert_eq!(e["code"], 4, "{e}");
    assert!(
        e["msg"].as_str().unwrap().contains("CNI_CONTAINERID"),
        "{e}"
    );

    let e = error_of(&run_raw(&good, &[("CNI_COMMAND", "ADDD")]));
    assert_eq!(e["code"], 4, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("CNI_COMMAND"), "{e}");

    let e = error_of(&run_raw(
        &good,
        &[(
            "CNI_ARGS",
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=bad-0;IP=10.86.0.300",
        )],
    ));
    assert_eq!(e["code"], 4, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("10.86.0.300"), "{e}");

    let mut v = conf.clone();
    v["mtu"] = json!("big");
    let e = error_of(&run_raw(&v.to_string(), &[]));
    assert_eq!(e["code"], 7, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("mtu"), "{e}");

    let e = error_of(&run_raw(
        &good,
        &[("CNI_NETNS", "/run/netns/mgy-does-not-exist")],
    ));
    assert_eq!(e["code"], 3, "{e}");

    let not_ns = node.dir().join("nodename");
    let e = error_of(&run_raw(&good, &[("CNI_NETNS", not_ns.to_str().unwrap())]));
    assert_eq!(e["code"], 4, "{e}");
    assert!(
        e["msg"].as_str().unwrap().contains("not a namespace"),
        "{e}"
    );

    let mut v = conf.clone();
    v["nodename_file"] = json!(node.dir().join("missing-nodename"));
    let e = error_of(&run_raw(&v.to_string(), &[]));
    assert_eq!(e["code"], 106, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("margay node"), "{e}");

    // A static address outside every pool.
    let e = error_of(&run_raw(
        &good,
        &[(
            "CNI_ARGS",
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=bad-0;IP=172.31.0.1",
        )],
    ));
    assert_eq!(e["code"], 103, "{e}");

    node.assert_clean();
    assert!(!pod.ns.ip(&["-o", "link"]).unwrap().contains("eth0"));
}

#[test]
fn static_ip_from_cni_args() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.87.0.0/24", 28)]);
    let pod = node.pod("static-0");
    let conf = node.conf(json!({}));
    let o = node.run(
        "ADD",
        &pod,
        &conf,
        &[(
            "CNI_ARGS",
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=static-0;IP=10.87.0.77",
        )],
    );
    assert!(o.status.success(), "{}", show(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(ips_of(&r), vec!["10.87.0.77".to_string()]);
    // The same address for another pod is refused.
    let other = node.pod("static-1");
    let o = node.run(
        "ADD",
        &other,
        &conf,
        &[(
            "CNI_ARGS",
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=static-1;IP=10.87.0.77",
        )],
    );
    let e = error_of(&o);
    assert_eq!(e["code"], 103, "{e}");
    assert!(
        e["msg"].as_str().unwrap().contains("already allocated"),
        "{e}"
    );
    node.del(&pod, &conf);
    node.del(&other, &conf);
    node.assert_clean();
}

#[test]
fn ipam_plugin_installed_and_used_alone() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.88.0.0/24", 26)]);
    let bin = node.dir().join("bin");
    let mut c = Command::new(exe());
    c.args(["cni", "install", "--dir", bin.to_str().unwrap()]);
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("installed"),
        "{}",
        show(&o)
    );
    let o = Command::new(exe())
        .args(["cni", "install", "--dir", bin.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("up to date"),
        "{}",
        show(&o)
    );
    let ipam = bin.join("margay-ipam");
    let pod = node.pod("ipam-0");
    let conf = node.conf(json!({"type": "bridge"}));
    let o = output_within(
        "a plugin run",
        node.spawn(&ipam, "ADD", &pod, &conf, &[]),
        RUN_TIMEOUT,
    );
    assert!(o.status.success(), "{}", show(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let addr = r["ips"][0]["address"].as_str().unwrap();
    assert!(addr.starts_with("10.88.0.") && addr.ends_with("/26"), "{r}");
    assert!(r.get("interfaces").is_none(), "{r}");
    // No interfaces, no endpoint: only the address.
    assert!(!node.host().ip(&["-o", "link"]).unwrap().contains("cali"));
    let o = output_within(
        "a plugin run",
        node.spawn(&ipam, "DEL", &pod, &conf, &[]),
        RUN_TIMEOUT,
    );
    assert!(o.status.success(), "{}", show(&o));
    node.assert_clean();
    // VERSION through the installed name.
    let o = output_within(
        "a plugin run",
        node.spawn(&ipam, "VERSION", &pod, &json!({"cniVersion": "0.3.1"}), &[]),
        RUN_TIMEOUT,
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cniVersion"], "0.3.1");
    assert!(
        v["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!("1.1.0"))
    );
}

#[test]
fn gc_releases_attachments_the_runtime_no_longer_has() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.89.0.0/24", 28)]);
    let conf = node.conf(json!({"cniVersion": "1.1.0"}));
    let (keep, drop_) = (node.pod("keep-0"), node.pod("drop-0"));
    node.add(&keep, &conf);
    node.add(&drop_, &conf);
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": keep.id, "ifname": "eth0"}]);
    let o = node.run(
        "GC",
        &keep,
        &gc,
        &[
            ("CNI_CONTAINERID", ""),
            ("CNI_IFNAME", ""),
            ("CNI_NETNS", ""),
        ],
    );
    assert!(o.status.success(), "{}", show(&o));
    let (clean, out) = node.ipam_check();
    assert!(clean, "{out}");
    assert!(out.contains("IPAM blocks record 1 allocations"), "{out}");
    let weps = node.ctl(&["get", "wep", "-A", "-o", "name"]);
    let names = String::from_utf8_lossy(&weps.stdout);
    assert!(names.contains("keep") && !names.contains("drop"), "{names}");
    node.del(&keep, &conf);
    node.del(&drop_, &conf);
    node.assert_clean();
}

/// Chained after margay: the reference portmap and bandwidth plugins (Debian's
/// containernetworking-plugins), with prevResult passed along as a runtime does.
#[test]
fn chained_with_portmap_and_bandwidth() {
    if skip() {
        return;
    }
    let plugins = Path::new("/usr/lib/cni");
    if !plugins.join("portmap").exists() || !plugins.join("bandwidth").exists() {
        eprintln!(
            "skipped: /usr/lib/cni/portmap or bandwidth is missing (scripts/setup installs containernetworking-plugins)"
        );
        return;
    }
    let node = Node::new(&[pool("p4", "10.90.0.0/24", 28)]);
    let pod = node.pod("chain-0");
    let name = "k8s-pod-network";
    let margay_conf = node.conf(json!({}));
    let runtime = json!({
        "portMappings": [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 1000000, "ingressBurst": 100000, "egressRate": 1000000, "egressBurst": 100000}
    });
    let portmap = json!({"cniVersion": "1.0.0", "name": name, "type": "portmap",
        "capabilities": {"portMappings": true}, "snat": true,
        "runtimeConfig": {"portMappings": runtime["portMappings"]}});
    let bandwidth = json!({"cniVersion": "1.0.0", "name": name, "type": "bandwidth",
        "capabilities": {"bandwidth": true},
        "runtimeConfig": {"bandwidth": runtime["bandwidth"]}});
    let chain: Vec<(PathBuf, Value)> = vec![
        (exe(), margay_conf),
        (plugins.join("portmap"), portmap),
        (plugins.join("bandwidth"), bandwidth),
    ];
    // portmap 1.1.1 (Debian 12) checks the IPv6 DNAT chain on CHECK even for an IPv4-only
    // pod whenever ip6tables is usable, and then fails. Give it a PATH with iptables but
    // without ip6tables, so it manages (and checks) IPv4 only, as it should.
    let v4bin = node.dir().join("v4bin");
    std::fs::create_dir_all(&v4bin).unwrap();
    for tool in ["iptables", "iptables-save", "iptables-restore"] {
        std::os::unix::fs::symlink(Path::new("/usr/sbin").join(tool), v4bin.join(tool)).unwrap();
    }
    let v4path = format!("{}:/usr/bin:/bin", v4bin.display());
    let env_for = |program: &Path| -> Vec<(&'static str, String)> {
        if program.ends_with("portmap") {
            vec![("PATH", v4path.clone())]
        } else {
            Vec::new()
        }
    };
    // ADD in order, each plugin getting the previous result.
    let mut prev: Option<Value> = None;
    for (program, conf) in &chain {
        let mut c = conf.clone();
        if let Some(p) = &prev {
            c["prevResult"] = p.clone();
        }
        let env = env_for(program);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let o = output_within(
            "a plugin run",
            node.spawn(program, "ADD", &pod, &c, &env),
            RUN_TIMEOUT,
        );
        assert!(
            o.status.success(),
            "ADD {}: {}",
            program.display(),
            show(&o)
        );
        prev = Some(serde_json::from_slice(&o.stdout).unwrap());
    }
    let result = prev.unwrap();
    assert_eq!(ips_of(&result).len(), 1, "{result}");
    // The bandwidth plugin shaped the host side (it found it through the result).
    let host_veth = result["interfaces"][0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let q = node
        .host()
        .exec("tc")
        .args(["qdisc", "show", "dev", &host_veth])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&q.stdout).contains("tbf"),
        "{}",
        show(&q)
    );
    // CHECK in order with the final result.
    for (program, conf) in &chain {
        let mut c = conf.clone();
        c["prevResult"] = result.clone();
        let env = env_for(program);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let o = output_within(
            "a plugin run",
            node.spawn(program, "CHECK", &pod, &c, &env),
            RUN_TIMEOUT,
        );
        assert!(
            o.status.success(),
            "CHECK {}: {}",
            program.display(),
            show(&o)
        );
    }
    // DEL in reverse order.
    for (program, conf) in chain.iter().rev() {
        let mut c = conf.clone();
        c["prevResult"] = result.clone();
        let env = env_for(program);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let o = output_within(
            "a plugin run",
            node.spawn(program, "DEL", &pod, &c, &env),
            RUN_TIMEOUT,
        );
        assert!(
            o.status.success(),
            "DEL {}: {}",
            program.display(),
            show(&o)
        );
    }
    node.assert_clean();
}
