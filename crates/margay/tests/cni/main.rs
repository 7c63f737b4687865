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

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use margay_testkit::netns::{Netns, is_root};
use margay_testkit::roles::{self, output_within, spawn_with_input};
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
        spawn_with_input(c, conf.to_string().as_bytes())
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

mod k8s;
mod lifecycle;
mod operations;
mod plugins;
