//! Dual-stack IPv6 on `margay lab up --ipv6` (VXLAN backend, nftables dataplane): every pod has
//! one address of each family from the real CNI plugin and IPAM, nodes detect their IPv6
//! address and Felix programs `vxlan-v6.calico`, and NetworkPolicy scenarios give the same
//! verdicts over IPv4 and IPv6, across nodes. A CIDR rule naming only IPv4 nets admits
//! nothing over IPv6 (nets are per family). Root only; the lab is removed even on failure.
#![allow(clippy::unwrap_used)]

mod lab_common;

use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use lab_common::{Expect, Lab, Matrix, diff};
use margay_testkit::netns::is_root;
use serde_json::Value;

/// The matrix of one family.
fn matrix(lab: &Lab, family: u8) -> Matrix {
    let family = family.to_string();
    lab.matrix_with(&[
        "--port",
        "80",
        "--protocol",
        "tcp",
        "--timeout-ms",
        "500",
        "--family",
        &family,
    ])
}

/// Waits (15 s at most) until both families' matrices are what `expect` says; the wrong cells
/// of each family otherwise.
fn converge_both(lab: &Lab, expect: Expect) -> Result<Duration, String> {
    let t = Instant::now();
    let mut last = String::new();
    while t.elapsed() < Duration::from_secs(15) {
        let (w4, w6) = (diff(&matrix(lab, 4), expect), diff(&matrix(lab, 6), expect));
        if w4.is_empty() && w6.is_empty() {
            return Ok(t.elapsed());
        }
        last = format!("IPv4: {w4:?}; IPv6: {w6:?}");
    }
    Err(last)
}

/// `{ip:ns/pod}` and `{ip6:ns/pod}` become that pod's addresses.
fn expand(pods: &[Value], yaml: &str) -> String {
    let mut out = yaml.to_string();
    for p in pods {
        let id = p["id"].as_str().unwrap();
        out = out.replace(&format!("{{ip:{id}}}"), p["ip"].as_str().unwrap());
        out = out.replace(&format!("{{ip6:{id}}}"), p["ip6"].as_str().unwrap());
    }
    out
}

/// A sysctl as the node's namespace sees it.
fn node_sysctl(netns: &str, path: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "cat", path])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn node_cmd(netns: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["-n", netns])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn dual_stack_lab_policy_in_both_families() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let lab = Lab::up_with("six", &["--ipv6"]);
    let status = lab.status();
    assert_eq!(status["ipv6"], true, "{status}");
    let pods = status["pods"].as_array().unwrap().clone();
    assert_eq!(pods.len(), 9);
    // Each pod: one address of each family, the IPv6 one from the lab's IPv6 pool.
    let mut v6s = Vec::new();
    for p in &pods {
        let v4: IpAddr = p["ip"].as_str().unwrap().parse().unwrap();
        let v6: IpAddr = p["ip6"].as_str().unwrap_or("").parse().unwrap_or_else(|e| {
            panic!("pod {} has no IPv6 address ({e}): {p}", p["id"]);
        });
        assert!(v4.is_ipv4() && v6.is_ipv6(), "{p}");
        assert!(v6.to_string().starts_with("fd00:10:244:"), "{p}");
        v6s.push(v6);
    }
    v6s.sort();
    v6s.dedup();
    assert_eq!(v6s.len(), 9, "every pod has its own IPv6 address");
    // Inside a pod: the /128 and the default route through the host side's link-local
    // address, as Calico's CNI plugin wires it.
    let x_a = pods.iter().find(|p| p["id"] == "x/a").unwrap();
    let netns = x_a["netns"].as_str().unwrap();
    let addrs = node_cmd(netns, &["-6", "addr", "show", "dev", "eth0"]);
    assert!(
        addrs.contains(&format!("{}/128", x_a["ip6"].as_str().unwrap())),
        "{addrs}"
    );
    let routes = node_cmd(netns, &["-6", "route"]);
    assert!(
        routes.contains("default via fe80::ecee:eeff:feee:eeee dev eth0"),
        "{routes}"
    );
    // Each node: its IPv6 address detected, vxlan-v6.calico up with an IPv6 tunnel address,
    // IPv6 forwarding turned on by Felix (the lab never sets it), routes to the other node's
    // IPv6 block through the VXLAN device.
    for n in status["nodes"].as_array().unwrap() {
        let netns = n["netns"].as_str().unwrap();
        let link = node_cmd(netns, &["-d", "link", "show", "vxlan-v6.calico"]);
        assert!(
            link.contains("vxlan id 4096") && link.contains("dstport 4789"),
            "{}: {link}",
            n["name"]
        );
        let addr = node_cmd(netns, &["-6", "addr", "show", "dev", "vxlan-v6.calico"]);
        assert!(addr.contains("inet6 fd00:10:244:"), "{}: {addr}", n["name"]);
        assert_eq!(
            node_sysctl(netns, "/proc/sys/net/ipv6/conf/all/forwarding"),
            "1",
            "{}",
            n["name"]
        );
        let routes = node_cmd(netns, &["-6", "route", "show", "proto", "80"]);
        assert!(
            routes.contains("dev vxlan-v6.calico"),
            "{}: no IPv6 route through vxlan-v6.calico:\n{routes}",
            n["name"]
        );
    }
    // A single IPv6 probe across nodes (x/a is on node1, x/b on node2).
    assert!(
        lab.cmd(&["probe", "x/a", "x/b", "--family", "6"])
            .status()
            .unwrap()
            .success(),
        "x/a does not reach x/b over IPv6"
    );

    // Flow logs: both nodes record the IPv6 connection with both ends named as the pods.
    let x_a6 = x_a["ip6"].as_str().unwrap();
    let t = Instant::now();
    let named = loop {
        let flows = lab.ok(&["flows", "--last", "200", "-o", "json"]);
        let reporters: Vec<String> = flows
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|f| {
                f["tuple"]["src"] == x_a6
                    && f["source"]["name"] == "a"
                    && f["source"]["namespace"] == "x"
                    && f["dest"]["name"] == "b"
                    && f["dest"]["namespace"] == "x"
                    && f["tuple"]["dst_port"] == 80
            })
            .map(|f| f["reporter"].as_str().unwrap_or("").to_string())
            .collect();
        if reporters.iter().any(|r| r == "src") && reporters.iter().any(|r| r == "dst") {
            break true;
        }
        if t.elapsed() > Duration::from_secs(15) {
            eprintln!("flows seen: {flows}");
            break false;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(named, "no IPv6 flow x/a -> x/b:80 from both nodes");
    // Pods get the smallest MTU of the encapsulations in use: VXLAN over IPv6 costs 70 bytes,
    // so 1430 on a 1500 fabric; a full-size IPv6 packet (no fragmentation allowed) crosses
    // to the other node's pod.
    let mtu = node_cmd(netns, &["link", "show", "dev", "eth0"]);
    assert!(mtu.contains("mtu 1430"), "{mtu}");
    let x_b6 = pods.iter().find(|p| p["id"] == "x/b").unwrap()["ip6"]
        .as_str()
        .unwrap()
        .to_string();
    let out = lab
        .cmd(&[
            "exec", "x/a", "--", "ping", "-6", "-c", "1", "-W", "2", "-M", "do", "-s", "1382",
            &x_b6,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "a 1430-byte IPv6 packet x/a -> x/b: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let scenarios: Vec<(&str, &str, Expect)> = vec![
        (
            "no policy: everything reaches everything",
            "",
            |_, _, _, _| true,
        ),
        (
            "deny all ingress in y",
            "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: 'y'}
spec:
  podSelector: {}
  policyTypes: [Ingress]",
            |_, _, t, _| t != "y",
        ),
        (
            "allow y ingress only from namespace x (namespace selector)",
            "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-x, namespace: 'y'}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {ns: x}",
            |f, _, t, _| t != "y" || f == "x",
        ),
        (
            "allow y/a ingress only from pods b (pod selector, any namespace)",
            "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-from-b, namespace: 'y'}
spec:
  podSelector:
    matchLabels: {pod: a}
  ingress:
  - from:
    - namespaceSelector: {}
      podSelector:
        matchLabels: {pod: b}",
            |_, fp, t, tp| !(t == "y" && tp == "a") || fp == "b",
        ),
        (
            "egress: x may only reach z",
            "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-to-z, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector:
        matchLabels: {ns: z}",
            |f, _, t, _| f != "x" || t == "z",
        ),
        (
            "CIDR rule: z admits only x/a (its IPv4 /32 and its IPv6 /128)",
            "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: z-from-cidr, namespace: z}
spec:
  podSelector: {}
  ingress:
  - from:
    - ipBlock: {cidr: '{ip:x/a}/32'}
    - ipBlock: {cidr: '{ip6:x/a}/128'}",
            |f, fp, t, _| t != "z" || (f == "x" && fp == "a"),
        ),
    ];
    let mut failures = Vec::new();
    for (name, yaml, expect) in &scenarios {
        if !yaml.is_empty() {
            lab.apply_raw(&expand(&pods, yaml));
        }
        let result = converge_both(&lab, *expect);
        eprintln!(
            "{} {name:<70} {:?}",
            if result.is_ok() { "ok  " } else { "FAIL" },
            result
        );
        if let Err(e) = result {
            failures.push(format!("{name}: {e}"));
        }
        if !yaml.is_empty() {
            lab.delete(&expand(&pods, yaml));
        }
    }

    // Nets are per family: a rule with only IPv6 nets says nothing about IPv4 traffic and
    // the reverse. y denies the IPv6 pool, so y is reached over IPv4 only.
    let yaml = "apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: y-v6-nets, namespace: 'y'}
spec:
  selector: all()
  ingress:
  - action: Deny
    source: {nets: ['fd00:10:244::/64']}
  - action: Allow";
    lab.apply_raw(yaml);
    let want4: Expect = |_, _, _, _| true;
    let want6: Expect = |_, _, t, _| t != "y";
    let t = Instant::now();
    let mut last = String::new();
    let mut ok = false;
    while t.elapsed() < Duration::from_secs(15) {
        let (w4, w6) = (diff(&matrix(&lab, 4), want4), diff(&matrix(&lab, 6), want6));
        if w4.is_empty() && w6.is_empty() {
            ok = true;
            break;
        }
        last = format!("IPv4: {w4:?}; IPv6: {w6:?}");
    }
    eprintln!(
        "{} {:<70} {:?}",
        if ok { "ok  " } else { "FAIL" },
        "IPv6 nets deny y over IPv6 only",
        t.elapsed()
    );
    if !ok {
        failures.push(format!("IPv6 nets deny y over IPv6 only: {last}"));
    }
    lab.delete(yaml);

    assert!(
        failures.is_empty(),
        "scenarios failed:\n{}",
        failures.join("\n")
    );
}

/// `lab up --ipv6 --backend bird --tor`: confd renders bird6.cfg, a second BIRD 2 per node
/// meshes over IPv6 (and peers with the ToR's IPv6 BIRD, which learns every node's IPv6
/// block) and routes the other node's IPv6 block unencapsulated (no VXLAN device at all);
/// pods reach each other over IPv6 and a policy gives the same verdicts in both families.
#[test]
fn dual_stack_bird_routes_ipv6_unencapsulated() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    if Command::new("bird").arg("--version").output().is_err() {
        eprintln!("skipped: bird is not installed (scripts/setup installs bird2)");
        return;
    }
    let lab = Lab::up_with("sixb", &["--ipv6", "--backend", "bird", "--tor"]);
    let status = lab.status();
    let nodes = status["nodes"].as_array().unwrap().clone();
    // The ToR learns both nodes' IPv6 blocks over its IPv6 sessions (which node it picks as
    // next hop is BGP's choice: each node also re-advertises what the mesh taught it).
    let tor = status["tor"]["netns"].as_str().unwrap();
    let tor_routes = node_cmd(tor, &["-6", "route", "show", "proto", "bird"]);
    let blocks = tor_routes
        .lines()
        .filter(|l| l.starts_with("fd00:10:244:") && l.contains("/122 via fd00:172:30::1"))
        .count();
    assert_eq!(blocks, 2, "ToR's IPv6 BIRD routes:\n{tor_routes}");
    for n in &nodes {
        let netns = n["netns"].as_str().unwrap();
        let others: Vec<&str> = nodes
            .iter()
            .filter(|o| o["name"] != n["name"])
            .map(|o| o["ip6"].as_str().unwrap())
            .collect();
        let routes = node_cmd(netns, &["-6", "route", "show", "proto", "bird"]);
        for ip6 in others {
            assert!(
                routes.contains(&format!("via {ip6} dev eth0")),
                "{}: no IPv6 BIRD route via {ip6}:\n{routes}",
                n["name"]
            );
        }
        let links = node_cmd(netns, &["link"]);
        assert!(!links.contains("vxlan"), "{}: {links}", n["name"]);
    }
    let text = String::from_utf8_lossy(&lab.cmd(&["status"]).output().unwrap().stdout).into_owned();
    assert!(
        text.contains("fd00:172:30::") && text.contains("Established"),
        "lab status lists the IPv6 sessions: {text}"
    );
    let mut failures = Vec::new();
    for (name, yaml, expect) in [
        ("no policy", "", (|_, _, _, _| true) as Expect),
        (
            "allow y ingress only from namespace x",
            "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-x, namespace: 'y'}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {ns: x}",
            |f, _, t, _| t != "y" || f == "x",
        ),
    ] {
        if !yaml.is_empty() {
            lab.apply_raw(yaml);
        }
        let result = converge_both(&lab, expect);
        eprintln!(
            "{} {name:<70} {result:?}",
            if result.is_ok() { "ok  " } else { "FAIL" }
        );
        if let Err(e) = result {
            failures.push(format!("{name}: {e}"));
        }
        if !yaml.is_empty() {
            lab.delete(yaml);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A node's roles stopped and started again (both BIRDs among them): its IPv6 sessions come
    // back (`node start` waits for them), and a pod added then is reached over IPv6.
    let stopped = lab.ok(&["node", "stop", "node2"]);
    assert!(stopped.contains("bird6"), "{stopped}");
    lab.ok(&["node", "start", "node2"]);
    let added = lab.ok(&["pod", "add", "w/d", "--node", "node2"]);
    assert!(added.contains(" and fd00:10:244:"), "{added}");
    let t = Instant::now();
    while !lab
        .cmd(&["probe", "x/a", "w/d", "--family", "6"])
        .status()
        .unwrap()
        .success()
    {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "x/a never reached the new pod w/d over IPv6"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `lab up --ipv6 --datastore kubernetes`: the lab's kubelet reports both addresses in the
/// Pod's `status.podIPs`, from which Calico's endpoints take their networks, so a Kubernetes
/// NetworkPolicy applied with kubectl gives the same verdicts in both families.
#[test]
fn dual_stack_kubernetes_lab() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let lab = Lab::up_with("sixk", &["--ipv6", "--datastore", "kubernetes"]);
    let pod = lab.ok(&["kubectl", "--", "get", "pod", "-n", "x", "a", "-o", "json"]);
    let pod: Value = serde_json::from_str(&pod).unwrap();
    let ips: Vec<&str> = pod["status"]["podIPs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["ip"].as_str().unwrap())
        .collect();
    assert!(
        ips.len() == 2 && ips[1].starts_with("fd00:10:244:"),
        "{ips:?}"
    );
    let f = lab.dir.join("np.yaml");
    std::fs::write(
        &f,
        "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-x, namespace: 'y'}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {ns: x}",
    )
    .unwrap();
    lab.ok(&["kubectl", "--", "apply", "-f", f.to_str().unwrap()]);
    let result = converge_both(&lab, |f, _, t, _| t != "y" || f == "x");
    assert!(result.is_ok(), "{result:?}");
}
