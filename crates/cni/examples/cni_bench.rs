//! CNI ADD end to end, measured as a runtime sees it: the margay binary executed once per call
//! (process start, config, node name, datastore, IPAM under the host lock, veth pair, sysctls,
//! addresses, routes, WorkloadEndpoint write, result on stdout).
//!
//! Everything happens in namespaces this program makes (`mgy-bench-*`, deleted at the end):
//! the process enters its own *host* namespace (only its main thread, with setns) and
//! executes the plugin from there, so the plugin's host side is that namespace; each pod gets
//! its own container namespace. The datastore is a private embedded store.
//!
//! ```sh
//! cargo build --release -p margay
//! cargo run --release -p margay-cni --example cni_bench -- target/release/margay [SEQUENTIAL] [PARALLEL]
//! ```
//! Needs root. Prints sequential ADD latency (median, p90, p99, max), DEL latency, and the
//! wall time of PARALLEL (default 100) ADDs started at once — twice, side by side: once with
//! the pod's metadata from the network config only, once with the Kubernetes pod lookup (the
//! Pod and its Namespace read from an API server double serving in the host namespace, named
//! by `kubernetes.kubeconfig`, as a kubelet-driven ADD does).
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use margay_testkit::netns::Netns;

struct Bench {
    exe: PathBuf,
    dir: tempfile::TempDir,
    /// The kubeconfig of the API server the plugin reads its pods from (lookup mode).
    kubeconfig: Option<PathBuf>,
}

impl Bench {
    fn cmd(&self, exe: &Path) -> Command {
        let mut c = Command::new(exe);
        c.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATASTORE_TYPE", "local")
            .env("DATASTORE_PATH", self.dir.path().join("ds.db"))
            .env("MARGAY_IPAM_LOCK_FILE", self.dir.path().join("ipam.lock"));
        c
    }

    fn conf(&self) -> String {
        let (level, file) = match std::env::var("CNI_BENCH_LOG") {
            Ok(f) => ("debug", f),
            Err(_) => ("warn", String::new()),
        };
        let mut conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "k8s-pod-network",
            "type": "margay",
            "mtu": 1450,
            "log_level": level,
            "log_file_path": file,
            "nodename_file": self.dir.path().join("nodename"),
            "ipam": {"type": "margay-ipam"},
        });
        if let Some(k) = &self.kubeconfig {
            conf["kubernetes"] = serde_json::json!({"kubeconfig": k});
        }
        conf.to_string()
    }

    fn spawn(&self, command: &str, pod: &Netns, id: &str) -> Child {
        let mut c = self.cmd(&self.exe);
        c.env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", format!("/run/netns/{}", pod.name()))
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .env(
                "CNI_ARGS",
                format!("K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{id}"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(self.conf().as_bytes())
            .unwrap();
        child
    }

    fn wait(mut child: Child) {
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "plugin failed: {out}\n{err}");
    }
}

/// User + system time of this process's waited-for children (`/proc/self/stat` cutime and
/// cstime, in clock ticks of 1/100 s).
fn children_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // cutime and cstime are fields 16 and 17 of the whole line: 13 and 14 after the name.
    let ticks: u64 = fields[13].parse::<u64>().unwrap() + fields[14].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(name: &str, mut v: Vec<Duration>) {
    v.sort();
    println!(
        "{name}: n={} median={:.1} ms p90={:.1} ms p99={:.1} ms max={:.1} ms",
        v.len(),
        pct(&v, 0.5).as_secs_f64() * 1e3,
        pct(&v, 0.9).as_secs_f64() * 1e3,
        pct(&v, 0.99).as_secs_f64() * 1e3,
        v.last().unwrap().as_secs_f64() * 1e3
    );
}

/// One round: `sequential` ADDs then DELs one after another, then `parallel` ADDs (and DELs)
/// started at once. Container ids start with `tag`, pods are named `pod-<id>`.
fn round(
    bench: &Bench,
    pods: &[Netns],
    sequential: usize,
    parallel: usize,
    tag: &str,
    label: &str,
) {
    // Sequential ADDs, each a new pod.
    let mut add = Vec::new();
    let cpu_before = children_cpu();
    for (i, pod) in pods.iter().take(sequential).enumerate() {
        let t = Instant::now();
        Bench::wait(bench.spawn("ADD", pod, &format!("{tag}s{i}")));
        add.push(t.elapsed());
    }
    // CPU time barely depends on what else the machine runs, unlike wall time.
    println!(
        "{label}: ADD CPU time (user+sys) {:.1} ms per call",
        (children_cpu() - cpu_before).as_secs_f64() * 1e3 / sequential.max(1) as f64
    );
    if std::env::var_os("CNI_BENCH_VERBOSE").is_some() {
        let ms: Vec<String> = add
            .iter()
            .map(|d| format!("{:.1}", d.as_secs_f64() * 1e3))
            .collect();
        println!("ADD latencies (ms, in order): {}", ms.join(" "));
    }
    report(&format!("{label}: ADD (sequential)"), add);
    let mut del = Vec::new();
    for (i, pod) in pods.iter().take(sequential).enumerate() {
        let t = Instant::now();
        Bench::wait(bench.spawn("DEL", pod, &format!("{tag}s{i}")));
        del.push(t.elapsed());
    }
    report(&format!("{label}: DEL (sequential)"), del);

    // A storm: all at once.
    let t = Instant::now();
    let children: Vec<Child> = pods
        .iter()
        .take(parallel)
        .enumerate()
        .map(|(i, pod)| bench.spawn("ADD", pod, &format!("{tag}p{i}")))
        .collect();
    for c in children {
        Bench::wait(c);
    }
    let storm = t.elapsed();
    println!(
        "{label}: {parallel} simultaneous ADDs: total {:.0} ms ({:.1} ms per pod)",
        storm.as_secs_f64() * 1e3,
        storm.as_secs_f64() * 1e3 / parallel as f64
    );
    let t = Instant::now();
    let children: Vec<Child> = pods
        .iter()
        .take(parallel)
        .enumerate()
        .map(|(i, pod)| bench.spawn("DEL", pod, &format!("{tag}p{i}")))
        .collect();
    for c in children {
        Bench::wait(c);
    }
    println!(
        "{label}: {parallel} simultaneous DELs: total {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let exe = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "target/release/margay".into()),
    );
    let sequential: usize = args.next().map_or(200, |s| s.parse().unwrap());
    let parallel: usize = args.next().map_or(100, |s| s.parse().unwrap());
    assert!(
        exe.exists(),
        "{} does not exist: build it first",
        exe.display()
    );
    let exe = exe.canonicalize().unwrap();
    let bench = Bench {
        exe,
        dir: tempfile::tempdir().unwrap(),
        kubeconfig: None,
    };
    std::fs::write(bench.dir.path().join("nodename"), "bench-node\n").unwrap();
    let pools = bench.dir.path().join("pools.yaml");
    std::fs::write(
        &pools,
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: bench\nspec:\n  cidr: 10.200.0.0/16\n  blockSize: 26\n",
    )
    .unwrap();
    let o = bench
        .cmd(&bench.exe)
        .args(["ctl", "apply", "-f", pools.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");

    let host = Netns::new("bench-host").unwrap();
    host.add_veth("uplink", "uplink-peer", &["192.0.2.1/32"])
        .unwrap();
    host.ip(&["route", "add", "default", "dev", "uplink"])
        .unwrap();
    // From here on this thread (and the plugins it starts) live in the host namespace.
    let ns_file = std::fs::File::open(format!("/run/netns/{}", host.name())).unwrap();
    nix::sched::setns(ns_file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();

    println!(
        "margay CNI bench: {} sequential ADD/DEL, then {} simultaneous ADDs ({})",
        sequential,
        parallel,
        bench.exe.display()
    );
    let pods: Vec<Netns> = (0..sequential.max(parallel))
        .map(|_| Netns::new("bench-pod").unwrap())
        .collect();
    round(&bench, &pods, sequential, parallel, "a", "config only");

    // The same with the Kubernetes pod lookup. Threads inherit the creating thread's network
    // namespace, so the server listens in the host namespace, where the plugins dial it.
    let api =
        margay_apiserver::ApiServer::start(margay_apiserver::ServerOptions::default()).unwrap();
    let kubeconfig = bench.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let store = api.store();
    store
        .create(
            margay_apiserver::Gvr::core("namespaces"),
            "",
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": "bench"}}),
        )
        .unwrap();
    for i in 0..sequential.max(parallel) {
        for id in [format!("ks{i}"), format!("kp{i}")] {
            store
                .create(
                    margay_apiserver::Gvr::core("pods"),
                    "bench",
                    serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": format!("pod-{id}"), "namespace": "bench",
                                     "labels": {"app": "bench", "shard": (i % 8).to_string()}},
                        "spec": {"nodeName": "bench-node", "serviceAccountName": "bench",
                                 "containers": [{"name": "c", "image": "busybox"}]}}),
                )
                .unwrap();
        }
    }
    let bench = Bench {
        kubeconfig: Some(kubeconfig),
        ..bench
    };
    round(&bench, &pods, sequential, parallel, "k", "pod lookup");
    // Nothing may be left: the IPAM check must be clean.
    let o = bench
        .cmd(&bench.exe)
        .args(["ctl", "ipam", "check"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let summary = text
        .lines()
        .find(|l| l.starts_with("Check complete"))
        .unwrap_or("");
    println!("ipam check: {summary}");
    assert!(o.status.success(), "{text}");
}
