//! The CNI plugins run as the real binary, as a runtime runs them: CNI_* variables, the
//! network configuration on stdin, the result on stdout.
//!
//! Network safety: every test makes a *host* namespace and *container* namespaces
//! (margay_testkit::netns, `mgy-` prefix, deleted on drop) and runs the plugin inside the host
//! namespace (`ip netns exec`), with CNI_NETNS naming a container namespace; every link,
//! route and sysctl the plugin touches is in a namespace the test made. The datastore is a
//! private embedded store, the node name file and the IPAM lock live in a temp directory.
//! Needs root (CI runs as root); MARGAY_SKIP_ROOT_TESTS=1 skips it elsewhere.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use margay_testkit::netns::{Netns, is_root};
use margay_testkit::roles::{self, output_within};
use serde_json::{Value, json};

/// Upper bound for one plugin run (the plugin's own bound is 90 s; a healthy call takes ms).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

fn skip() -> bool {
    if is_root() {
        return false;
    }
    if std::env::var("MARGAY_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
        eprintln!("skipped: needs root (MARGAY_SKIP_ROOT_TESTS=1)");
        return true;
    }
    panic!("needs root (creates network namespaces); run as root or set MARGAY_SKIP_ROOT_TESTS=1");
}

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_margay"))
}

/// One node: a host namespace with an uplink and a default route (as a real host has; proxy
/// ARP only answers for destinations the host can route), a private datastore with pools, a
/// node name file and an IPAM lock.
struct Node {
    /// The testkit node: the work directory (kept, with the plugin's logs, when a test fails)
    /// and the host namespace.
    base: roles::Node,
    /// The etcd endpoint `margay ctl` uses, when the node's store is etcd.
    etcd: Option<String>,
}

/// A container: its namespace and the identifiers the runtime passes.
struct Pod {
    ns: Netns,
    id: String,
    name: String,
}

impl Pod {
    fn netns_path(&self) -> String {
        format!("/run/netns/{}", self.ns.name())
    }
    fn cni_args(&self) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={}",
            self.name, self.id
        )
    }
}

fn pool(name: &str, cidr: &str, block: u8) -> String {
    format!(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: {name}\nspec:\n  cidr: \"{cidr}\"\n  blockSize: {block}\n"
    )
}

impl Node {
    fn new(pools: &[String]) -> Node {
        Node::build(pools, None)
    }

    fn build(pools: &[String], etcd: Option<String>) -> Node {
        let base = roles::Node::in_netns("cni-host").unwrap();
        std::fs::write(base.file("nodename"), "node-a\n").unwrap();
        let host = base.netns().unwrap();
        host.add_veth(
            "uplink",
            "uplink-peer",
            &["192.0.2.1/32", "2001:db8::1/128"],
        )
        .unwrap();
        host.ip(&["route", "add", "default", "dev", "uplink"])
            .unwrap();
        host.ip(&["-6", "route", "add", "default", "dev", "uplink"])
            .unwrap();
        // Pods on this node reach each other through the host (Felix's job on a real host).
        let out = host
            .exec("sh")
            .args([
                "-c",
                "echo 1 > /proc/sys/net/ipv6/conf/all/forwarding && echo 1 > /proc/sys/net/ipv4/ip_forward",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let node = Node { base, etcd };
        let f = node.dir().join("pools.yaml");
        std::fs::write(&f, pools.join("---\n")).unwrap();
        let o = node.ctl(&["apply", "-f", f.to_str().unwrap()]);
        assert!(o.status.success(), "{o:?}");
        node
    }

    /// The work directory.
    fn dir(&self) -> &Path {
        self.base.path()
    }

    /// The host namespace the plugin runs in.
    fn host(&self) -> &Netns {
        self.base.netns().unwrap()
    }

    fn store(&self) -> PathBuf {
        self.dir().join("ds.db")
    }

    fn env(&self, cmd: &mut Command) {
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATASTORE_TYPE", "local")
            .env("DATASTORE_PATH", self.store())
            .env("MARGAY_IPAM_LOCK_FILE", self.dir().join("ipam.lock"));
    }

    /// `margay ctl ARGS` against this node's datastore (outside any namespace: it only reads
    /// and writes the store file).
    fn ctl(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(exe());
        cmd.arg("ctl").args(args);
        self.env(&mut cmd);
        if let Some(e) = &self.etcd {
            cmd.env("DATASTORE_TYPE", "etcdv3").env("ETCD_ENDPOINTS", e);
        }
        cmd.output().unwrap()
    }

    fn pod(&self, name: &str) -> Pod {
        let ns = Netns::new("cni-pod").unwrap();
        let id = format!("{:x}{}", std::process::id(), name.replace('-', ""));
        Pod {
            ns,
            id: format!("c{id}"),
            name: name.to_string(),
        }
    }

    fn conf(&self, extra: Value) -> Value {
        let mut c = json!({
            "cniVersion": "1.0.0",
            "name": "k8s-pod-network",
            "type": "margay",
            "mtu": 1400,
            "log_level": "debug",
            "nodename_file": self.dir().join("nodename"),
            "ipam": {"type": "margay-ipam"},
        });
        merge(&mut c, extra);
        c
    }

    /// Starts `plugin` (default: margay) inside the host namespace.
    fn spawn(
        &self,
        program: &Path,
        cmd: &str,
        pod: &Pod,
        conf: &Value,
        env: &[(&str, &str)],
    ) -> Child {
        let mut c = self.host().exec(program);
        self.env(&mut c);
        c.env("CNI_COMMAND", cmd)
            .env("CNI_CONTAINERID", &pod.id)
            .env("CNI_NETNS", pod.netns_path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .env("CNI_ARGS", pod.cni_args());
        for (k, v) in env {
            c.env(k, v);
        }
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
        child
    }

    fn run(&self, cmd: &str, pod: &Pod, conf: &Value, env: &[(&str, &str)]) -> Output {
        output_within(
            "a plugin run",
            self.spawn(&exe(), cmd, pod, conf, env),
            RUN_TIMEOUT,
        )
    }

    fn add(&self, pod: &Pod, conf: &Value) -> Value {
        let o = self.run("ADD", pod, conf, &[]);
        assert!(o.status.success(), "ADD failed: {}", show(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    fn del(&self, pod: &Pod, conf: &Value) {
        let o = self.run("DEL", pod, conf, &[]);
        assert!(o.status.success(), "DEL failed: {}", show(&o));
        assert!(o.stdout.is_empty(), "DEL prints nothing: {}", show(&o));
    }

    fn check(&self, pod: &Pod, conf: &Value, result: &Value) -> Output {
        let mut c = conf.clone();
        c["prevResult"] = result.clone();
        self.run("CHECK", pod, &c, &[])
    }

    /// `margay ctl ipam check`: (clean?, output).
    fn ipam_check(&self) -> (bool, String) {
        let o = self.ctl(&["ipam", "check"]);
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    }

    fn assert_clean(&self) {
        let (clean, out) = self.ipam_check();
        assert!(clean, "IPAM is not clean:\n{out}");
        assert!(out.contains("Found 0 handles."), "{out}");
        let weps = self.ctl(&["get", "workloadendpoints", "-A", "-o", "name"]);
        assert!(weps.stdout.is_empty(), "endpoints left: {}", show(&weps));
        let links = self.host().ip(&["-o", "link"]).unwrap();
        assert!(!links.contains("cali"), "host interfaces left: {links}");
    }
}

fn merge(base: &mut Value, extra: Value) {
    if let (Value::Object(b), Value::Object(e)) = (base, extra) {
        for (k, v) in e {
            match (b.get_mut(&k), v) {
                (Some(bv @ Value::Object(_)), v @ Value::Object(_)) => merge(bv, v),
                (_, v) => {
                    b.insert(k, v);
                }
            }
        }
    }
}

fn show(o: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ips_of(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let a = i["address"].as_str().unwrap();
            a.split('/').next().unwrap().to_string()
        })
        .collect()
}

fn ping(from: &Netns, to: &str) {
    let v6 = to.contains(':');
    // Neighbour discovery may need a moment: a few tries, bounded.
    for attempt in 0..5 {
        let mut c = from.exec("ping");
        if v6 {
            c.arg("-6");
        }
        let o = c.args(["-c", "1", "-W", "1", to]).output().unwrap();
        if o.status.success() {
            return;
        }
        if attempt == 4 {
            panic!("ping {to} from {} failed: {}", from.name(), show(&o));
        }
    }
}

fn error_of(o: &Output) -> Value {
    assert!(!o.status.success(), "expected a failure: {}", show(o));
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not a CNI error ({e}): {}", show(o)));
    assert!(v["code"].is_u64() && v["msg"].is_string(), "{v}");
    assert!(v.get("cniVersion").is_some(), "{v}");
    v
}

// ------------------------------------------------------------------------------------------

#[test]
fn add_check_del_ipv4() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.80.0.0/24", 28)]);
    let pod = node.pod("web-0");
    let conf = node.conf(json!({}));
    let result = node.add(&pod, &conf);
    assert_eq!(result["cniVersion"], "1.0.0");
    let ips = ips_of(&result);
    assert_eq!(ips.len(), 1);
    let ip = &ips[0];
    assert!(ip.starts_with("10.80.0."), "{result}");
    assert_eq!(result["ips"][0]["address"], format!("{ip}/32"));
    assert_eq!(result["ips"][0]["interface"], 1);
    assert!(result["ips"][0].get("version").is_none());
    let host_veth = result["interfaces"][0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        host_veth.starts_with("cali") && host_veth.len() == 15,
        "{result}"
    );
    assert_eq!(result["interfaces"][1]["name"], "eth0");
    assert_eq!(result["interfaces"][1]["sandbox"], pod.netns_path());
    assert_eq!(
        result["routes"],
        json!([{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}]),
        "{result}"
    );

    // Host side.
    let link = node.host().ip(&["-o", "link", "show", &host_veth]).unwrap();
    assert!(
        link.contains("ee:ee:ee:ee:ee:ee") && link.contains("mtu 1400"),
        "{link}"
    );
    let routes = node.host().ip(&["route"]).unwrap();
    assert!(
        routes.contains(&format!("{ip} dev {host_veth} scope link")),
        "{routes}"
    );
    let sysctls = node
        .host()
        .exec("sh")
        .arg("-c")
        .arg(format!(
            "cat /proc/sys/net/ipv4/conf/{host_veth}/proxy_arp /proc/sys/net/ipv4/conf/{host_veth}/forwarding /proc/sys/net/ipv4/conf/{host_veth}/route_localnet"
        ))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&sysctls.stdout), "1\n1\n1\n");
    // Container side.
    let addrs = pod.ns.ip(&["-o", "addr", "show", "dev", "eth0"]).unwrap();
    assert!(addrs.contains(&format!("{ip}/32")), "{addrs}");
    let croutes = pod.ns.ip(&["route"]).unwrap();
    assert!(
        croutes.contains("default via 169.254.1.1 dev eth0"),
        "{croutes}"
    );
    assert!(
        croutes.contains("169.254.1.1 dev eth0 scope link"),
        "{croutes}"
    );
    // The WorkloadEndpoint.
    let wep = node.ctl(&[
        "get",
        "wep",
        "-n",
        "default",
        "node--a-k8s-web--0-eth0",
        "-o",
        "json",
    ]);
    assert!(wep.status.success(), "{}", show(&wep));
    let wep: Value = serde_json::from_slice(&wep.stdout).unwrap();
    assert_eq!(wep["spec"]["containerID"], pod.id.as_str());
    assert_eq!(wep["spec"]["interfaceName"], host_veth.as_str());
    assert_eq!(wep["spec"]["ipNetworks"][0], format!("{ip}/32"));
    assert_eq!(wep["spec"]["profiles"][0], "kns.default");
    assert_eq!(
        wep["metadata"]["labels"]["projectcalico.org/orchestrator"],
        "k8s"
    );
    assert_eq!(wep["spec"]["mac"], result["interfaces"][1]["mac"]);

    // Traffic: the pod reaches the host.
    ping(&pod.ns, "192.0.2.1");

    // CHECK passes, and notices a missing route.
    let o = node.check(&pod, &conf, &result);
    assert!(o.status.success(), "{}", show(&o));
    pod.ns.ip(&["route", "del", "default"]).unwrap();
    let e = error_of(&node.check(&pod, &conf, &result));
    assert_eq!(e["code"], 105, "{e}");
    assert!(
        e["details"].as_str().unwrap().contains("default route"),
        "{e}"
    );

    node.del(&pod, &conf);
    assert!(!pod.ns.ip(&["-o", "link"]).unwrap().contains("eth0"));
    node.assert_clean();
    // DEL again: still fine.
    node.del(&pod, &conf);
}

#[test]
fn add_check_del_ipv6_only_and_old_result_format() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p6", "fd80::/120", 124)]);
    let pod = node.pod("v6-0");
    let conf = node.conf(json!({
        "cniVersion": "0.4.0",
        "ipam": {"assign_ipv4": "false", "assign_ipv6": "true"}
    }));
    let result = node.add(&pod, &conf);
    assert_eq!(result["cniVersion"], "0.4.0");
    assert_eq!(result["ips"][0]["version"], "6");
    let ip = ips_of(&result).remove(0);
    assert!(ip.starts_with("fd80::"), "{result}");
    assert_eq!(result["routes"][0]["dst"], "::/0", "{result}");
    assert_eq!(
        result["routes"][0]["gw"], "fe80::ecee:eeff:feee:eeee",
        "{result}"
    );
    let addrs = pod
        .ns
        .ip(&["-o", "-6", "addr", "show", "dev", "eth0"])
        .unwrap();
    assert!(addrs.contains(&format!("{ip}/128")), "{addrs}");
    let croutes = pod.ns.ip(&["-6", "route"]).unwrap();
    assert!(
        croutes.contains("default via fe80::ecee:eeff:feee:eeee dev eth0"),
        "{croutes}"
    );
    let host_veth = result["interfaces"][0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let hroutes = node.host().ip(&["-6", "route"]).unwrap();
    assert!(
        hroutes.contains(&format!("{ip} dev {host_veth}")),
        "{hroutes}"
    );
    ping(&pod.ns, "2001:db8::1");
    // The host side's own (link-local) address answers too.
    ping(&pod.ns, "fe80::ecee:eeff:feee:eeee%eth0");
    let o = node.check(&pod, &conf, &result);
    assert!(o.status.success(), "{}", show(&o));
    node.del(&pod, &conf);
    node.assert_clean();
}

#[test]
fn dual_stack_pods_reach_each_other() {
    if skip() {
        return;
    }
    let node = Node::new(&[
        pool("p4", "10.81.0.0/24", 28),
        pool("p6", "fd81::/120", 124),
    ]);
    let conf = node.conf(json!({"cniVersion": "1.1.0", "ipam": {"assign_ipv6": true}}));
    let (a, b) = (node.pod("a-0"), node.pod("b-0"));
    let ra = node.add(&a, &conf);
    let rb = node.add(&b, &conf);
    assert_eq!(
        ra["interfaces"][1]["mtu"], 1400,
        "1.1.0 results carry the MTU: {ra}"
    );
    let (ia, ib) = (ips_of(&ra), ips_of(&rb));
    assert_eq!(ia.len(), 2);
    assert_ne!(ia, ib);
    ping(&a.ns, &ib[0]);
    ping(&a.ns, &ib[1]);
    ping(&b.ns, &ia[0]);
    ping(&b.ns, &ia[1]);
    for (p, r) in [(&a, &ra), (&b, &rb)] {
        let o = node.check(p, &conf, r);
        assert!(o.status.success(), "{}", show(&o));
    }
    // STATUS: the datastore answers and the pools have room.
    let o = node.run("STATUS", &a, &conf, &[]);
    assert!(o.status.success(), "{}", show(&o));
    node.del(&a, &conf);
    node.del(&b, &conf);
    node.assert_clean();
}

#[test]
fn add_is_idempotent() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.82.0.0/24", 28)]);
    let pod = node.pod("idem-0");
    let conf = node.conf(json!({}));
    let first = node.add(&pod, &conf);
    let second = node.add(&pod, &conf);
    assert_eq!(ips_of(&first), ips_of(&second));
    let (clean, out) = node.ipam_check();
    assert!(clean, "{out}");
    assert!(out.contains("IPAM blocks record 1 allocations"), "{out}");
    let o = node.check(&pod, &conf, &second);
    assert!(o.status.success(), "{}", show(&o));
    ping(&pod.ns, "192.0.2.1");
    node.del(&pod, &conf);
    node.assert_clean();
}

#[test]
fn del_after_the_namespace_is_gone() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.83.0.0/24", 28)]);
    let pod = node.pod("gone-0");
    let conf = node.conf(json!({}));
    node.add(&pod, &conf);
    let Pod { ns, id, name } = pod;
    let path = format!("/run/netns/{}", ns.name());
    drop(ns); // the runtime removed the sandbox first
    let ghost = Pod {
        ns: Netns::new("cni-unused").unwrap(),
        id,
        name,
    };
    // CNI_NETNS still names the deleted namespace.
    let mut c = node.host().exec(exe());
    node.env(&mut c);
    c.env("CNI_COMMAND", "DEL")
        .env("CNI_CONTAINERID", &ghost.id)
        .env("CNI_NETNS", &path)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/usr/lib/cni")
        .env("CNI_ARGS", ghost.cni_args())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let o = output_within("a plugin run", child, RUN_TIMEOUT);
    assert!(o.status.success(), "{}", show(&o));
    node.assert_clean();
    // And with no CNI_NETNS at all (allowed for DEL).
    let o = node.run("DEL", &ghost, &conf, &[("CNI_NETNS", "")]);
    assert!(o.status.success(), "{}", show(&o));
}

#[test]
fn a_full_pool_fails_cleanly_and_leaks_nothing() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("tiny", "10.84.0.0/30", 30)]);
    let conf = node.conf(json!({}));
    let pods: Vec<Pod> = (0..5).map(|i| node.pod(&format!("full-{i}"))).collect();
    let mut results = Vec::new();
    for p in &pods[..4] {
        results.push(node.add(p, &conf));
    }
    let o = node.run("ADD", &pods[4], &conf, &[]);
    let e = error_of(&o);
    assert_eq!(e["code"], 102, "{e}");
    assert!(
        e["msg"].as_str().unwrap().contains("no free address"),
        "{e}"
    );
    // Nothing of the failed pod remains; the four others are consistent.
    let (clean, out) = node.ipam_check();
    assert!(clean, "{out}");
    assert!(out.contains("IPAM blocks record 4 allocations"), "{out}");
    assert!(!pods[4].ns.ip(&["-o", "link"]).unwrap().contains("eth0"));
    // STATUS (1.1.0) says the plugin cannot serve ADDs.
    let st = node.run(
        "STATUS",
        &pods[0],
        &node.conf(json!({"cniVersion": "1.1.0"})),
        &[],
    );
    assert_eq!(error_of(&st)["code"], 50);
    for p in &pods {
        node.del(p, &conf);
    }
    node.assert_clean();
}

/// The plugin is killed (SIGKILL) after IPAM assigned the address but before the endpoint
/// exists (and, second round, after the interfaces exist). The test hook
/// MARGAY_CNI_TEST_PAUSE=<stage>:<ms> makes the plugin stop there and say so on stderr; the
/// test kills it then. The runtime's DEL must leave nothing behind.
#[test]
fn killed_mid_add_then_del_leaks_nothing() {
    if skip() {
        return;
    }
    let node = Node::new(&[pool("p4", "10.85.0.0/24", 28)]);
    let conf = node.conf(json!({}));
    for stage in ["ipam", "veth"] {
        let pod = node.pod(&format!("kill-{stage}"));
        let pause = format!("{stage}:30000");
        let mut child = node.spawn(
            &exe(),
            "ADD",
            &pod,
            &conf,
            &[("MARGAY_CNI_TEST_PAUSE", pause.as_str())],
        );
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("test hook: pausing") {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(RUN_TIMEOUT)
            .unwrap_or_else(|_| panic!("the plugin never reached {stage}"));
        child.kill().unwrap();
        child.wait().unwrap();
        // The allocation is there, unused: IPAM check sees the leak until DEL.
        let (clean, out) = node.ipam_check();
        assert!(!clean && out.contains("leaked"), "{out}");
        node.del(&pod, &conf);
        node.assert_clean();
    }
}

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
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
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
            .env("CNI_ARGS", pod.cni_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
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

// ---- Kubernetes: the pod from the API ------------------------------------------------------
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
