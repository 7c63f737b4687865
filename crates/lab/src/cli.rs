//! `margay lab …` commands.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde_json::Value;

use crate::k8s;
use crate::net::{self, LabError, other};
use crate::state::{FABRIC_PREFIX, LabState, POD_CIDR, check_name};
use crate::topology::{Topology, default_topology};

/// Build, inspect, probe and remove a multi-node margay cluster made of network namespaces.
#[derive(Debug, Args)]
#[command(
    long_about = "A real margay cluster on this machine: every node is a network namespace \
running `margay node startup` and a supervised `margay felix`; pods are namespaces wired by the \
real CNI plugin, each serving TCP/UDP on its ports. Needs root. Nothing outside the lab's own \
namespaces (named mgy-<lab>-...) is touched.

With `up --datastore kubernetes` the cluster's datastore is a Kubernetes API server (margay's \
API server double, on 127.0.0.1 of this machine and, forwarded, on 127.0.0.1 of every lab \
namespace): every node is a Kubernetes Node, namespaces and pods are Kubernetes objects, the lab \
plays the kubelet (CNI_ARGS with K8S_POD_NAMESPACE/K8S_POD_NAME, pod status), kube-controllers \
runs, and `kubectl --kubeconfig $(margay lab kubeconfig)` works from this shell.",
    after_help = "Examples:
  margay lab up --datastore kubernetes
  kubectl --kubeconfig $(margay lab kubeconfig) apply -f netpol.yaml
  margay lab pod add y/d --node node2 --labels pod=d
  kubectl --kubeconfig $(margay lab kubeconfig) label pod -n y d pod=b --overwrite
  margay lab matrix --port 80
  margay lab pod delete y/d
  margay lab node stop node2; margay lab node start node2
  margay lab down"
)]
pub struct LabArgs {
    #[command(subcommand)]
    pub command: LabCommand,
}

#[derive(Debug, Args, Clone)]
pub struct Which {
    /// The lab's name (several labs can run side by side).
    #[arg(long, default_value = "lab")]
    pub name: String,
    /// Where the lab keeps its state, logs and datastore (default
    /// /var/run/margay/lab/<name>).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

impl Which {
    pub(crate) fn dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(crate::state::DEFAULT_STATE_ROOT).join(&self.name))
    }
}

#[derive(Debug, Subcommand)]
pub enum LabCommand {
    /// Build the cluster and start everything.
    Up {
        #[command(flatten)]
        which: Which,
        /// Topology file (default: Kubernetes' network-policy model, namespaces x, y, z with
        /// pods a, b, c, serving TCP and UDP on 80 and 81).
        #[arg(short = 'f', long)]
        file: Option<PathBuf>,
        /// Nodes for the default topology.
        #[arg(long, default_value_t = 2)]
        nodes: usize,
        /// local (embedded store, the default), etcd (a real etcd in the fabric namespace) or
        /// kubernetes (a Kubernetes API server: Nodes, Namespaces, Pods and NetworkPolicies are
        /// Kubernetes objects, Calico's kinds custom resources; see `margay lab kubeconfig`).
        #[arg(long, default_value = "local")]
        datastore: String,
        /// Cross-node networking: vxlan (Felix's VXLAN routes) or bird (no encapsulation:
        /// every node runs `margay confd` and BIRD, peering in a node-to-node mesh).
        #[arg(long, default_value = "vxlan")]
        backend: String,
        /// With --backend bird: add a top-of-rack router (namespace mgy-<lab>-tor at
        /// 172.30.0.2 running BIRD with its own AS) that every node peers with.
        #[arg(long)]
        tor: bool,
        /// The ToR's AS number.
        #[arg(long, default_value_t = 65000)]
        tor_as: u32,
    },
    /// Nodes, pods, addresses and health.
    Status {
        #[command(flatten)]
        which: Which,
        #[arg(long)]
        json: bool,
    },
    /// Remove everything the lab made (also after a crash).
    Down {
        #[command(flatten)]
        which: Which,
    },
    /// One probe: exit 0 if FROM reaches TO, 1 if not.
    Probe {
        #[command(flatten)]
        which: Which,
        /// `namespace/pod`
        from: String,
        /// `namespace/pod`
        to: String,
        #[arg(long, default_value_t = 80)]
        port: u16,
        #[arg(long, default_value = "tcp")]
        protocol: String,
        #[arg(long, default_value_t = 1000)]
        timeout_ms: u64,
    },
    /// Every pod to every pod, in parallel.
    Matrix {
        #[command(flatten)]
        which: Which,
        #[arg(long, default_value_t = 80)]
        port: u16,
        #[arg(long, default_value = "tcp")]
        protocol: String,
        #[arg(long, default_value_t = 1000)]
        timeout_ms: u64,
        /// table or json
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
    /// Print the path of the lab's kubeconfig (`--datastore kubernetes`), for
    /// `kubectl --kubeconfig $(margay lab kubeconfig) get pods -A`.
    Kubeconfig {
        #[command(flatten)]
        which: Which,
        /// Print the kubeconfig itself (it holds the API server's token) instead of its path.
        #[arg(long)]
        content: bool,
    },
    /// Run kubectl against the lab's API server: `margay lab kubectl -- get pods -A`.
    Kubectl {
        #[command(flatten)]
        which: Which,
        #[arg(last = true, required = true)]
        args: Vec<String>,
    },
    /// Add or delete a pod while the lab runs, as a kubelet would.
    Pod {
        #[command(subcommand)]
        command: PodCommand,
    },
    /// Stop or start a node's margay roles (Felix; confd and BIRD with --backend bird).
    Node {
        #[command(subcommand)]
        command: NodeCommand,
    },
    /// Run a command inside a pod: `margay lab exec x/a -- ip addr`.
    Exec {
        #[command(flatten)]
        which: Which,
        pod: String,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Run `margay ctl` against the lab's datastore: `margay lab ctl -- apply -f policy.yaml`.
    Ctl {
        #[command(flatten)]
        which: Which,
        #[arg(last = true, required = true)]
        args: Vec<String>,
    },
    /// Pod-to-pod throughput (iperf3) and TCP connection rate across nodes, without and with
    /// policy, next to two namespaces joined by a bare veth.
    Bench {
        #[command(flatten)]
        which: Which,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 5)]
        secs: u64,
        /// Policies applying to the server pod for the "with policy" run (its allow last).
        #[arg(long, default_value_t = 200)]
        policies: usize,
        /// Instead of throughput: create this many pods one after the other, each selected by
        /// a NetworkPolicy that admits one client pod only, and report how long each took from
        /// its creation until the client reached it (p50/p90/p99/max); every new pod is also
        /// checked to refuse another pod.
        #[arg(long, value_name = "N")]
        pod_ready: Option<usize>,
    },
    /// The lab's Kubernetes API server (started by `up --datastore kubernetes`).
    #[command(hide = true)]
    Apiserver {
        /// Where to write the kubeconfig once everything listens.
        #[arg(long)]
        kubeconfig: PathBuf,
        /// Namespaces in which to listen on 127.0.0.1 too (comma-separated).
        #[arg(long, value_delimiter = ',')]
        netns: Vec<String>,
    },
    #[command(hide = true)]
    Serve {
        #[arg(long, default_value = "pod")]
        name: String,
        #[arg(long, value_delimiter = ',')]
        tcp: Vec<u16>,
        #[arg(long, value_delimiter = ',')]
        udp: Vec<u16>,
    },
    #[command(hide = true)]
    Connect {
        #[arg(long)]
        to: IpAddr,
        #[arg(long)]
        port: u16,
        #[arg(long)]
        udp: bool,
        #[arg(long, default_value_t = 1000)]
        timeout_ms: u64,
        /// Connect over and over for this many seconds; print how many succeeded.
        #[arg(long)]
        loop_secs: Option<u64>,
    },
    #[command(hide = true)]
    Supervise {
        #[arg(long)]
        pid_file: PathBuf,
        #[arg(long)]
        log: PathBuf,
        #[arg(long)]
        once: bool,
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum PodCommand {
    /// Create a pod and wire it: in a Kubernetes lab the Pod object is created (scheduled on
    /// the node, its namespace and service account made if missing), the CNI plugin runs with
    /// the kubelet's CNI_ARGS and the pod's status is reported; otherwise the CNI plugin runs
    /// with the labels in its configuration. The pod serves TCP/UDP on its ports.
    Add {
        #[command(flatten)]
        which: Which,
        /// `namespace/name`
        pod: String,
        /// The node to run it on (default: the node with the fewest pods).
        #[arg(long)]
        node: Option<String>,
        /// `key=value,...`
        #[arg(long, default_value = "")]
        labels: String,
        /// TCP ports it serves.
        #[arg(long, value_delimiter = ',', default_value = "80,81")]
        tcp: Vec<u16>,
        /// UDP ports it serves.
        #[arg(long, value_delimiter = ',', default_value = "80,81")]
        udp: Vec<u16>,
    },
    /// Delete a pod as a kubelet does: CNI DEL (its addresses released, its endpoint gone),
    /// its processes and namespace removed, then (Kubernetes lab) the Pod object deleted.
    Delete {
        #[command(flatten)]
        which: Which,
        /// `namespace/name`
        pod: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Stop the node's roles (SIGTERM, then SIGKILL after 5 s), as when calico-node stops:
    /// the dataplane stays as it was programmed, pods keep running, the Node object is kept.
    Stop {
        #[command(flatten)]
        which: Which,
        node: String,
    },
    /// Start the node's roles again: `margay node startup`, then Felix (and confd and BIRD);
    /// returns once Felix is in sync.
    Start {
        #[command(flatten)]
        which: Which,
        node: String,
    },
}

/// Runs a lab command; returns the exit code.
pub fn run(args: LabArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let result = match args.command {
        LabCommand::Up {
            which,
            file,
            nodes,
            datastore,
            backend,
            tor,
            tor_as,
        } => up(
            &which,
            file.as_deref(),
            nodes,
            &datastore,
            &Networking {
                backend: &backend,
                tor: tor.then_some(tor_as),
            },
            out,
            err,
        ),
        LabCommand::Status { which, json } => status(&which, json, out),
        LabCommand::Down { which } => down(&which, out),
        LabCommand::Probe {
            which,
            from,
            to,
            port,
            protocol,
            timeout_ms,
        } => probe_cmd(&which, &from, &to, port, &protocol, timeout_ms, out),
        LabCommand::Matrix {
            which,
            port,
            protocol,
            timeout_ms,
            output,
        } => matrix_cmd(&which, port, &protocol, timeout_ms, &output, out),
        LabCommand::Exec {
            which,
            pod,
            command,
        } => exec_cmd(&which, &pod, &command),
        LabCommand::Ctl { which, args } => ctl_cmd(&which, &args),
        LabCommand::Kubeconfig { which, content } => kubeconfig_cmd(&which, content, out),
        LabCommand::Kubectl { which, args } => kubectl_cmd(&which, &args),
        LabCommand::Pod {
            command:
                PodCommand::Add {
                    which,
                    pod,
                    node,
                    labels,
                    tcp,
                    udp,
                },
        } => crate::ops::pod_add_cmd(&which, &pod, node.as_deref(), &labels, &tcp, &udp, out),
        LabCommand::Pod {
            command: PodCommand::Delete { which, pod },
        } => crate::ops::pod_delete_cmd(&which, &pod, out),
        LabCommand::Node {
            command: NodeCommand::Stop { which, node },
        } => crate::ops::node_stop_cmd(&which, &node, out),
        LabCommand::Node {
            command: NodeCommand::Start { which, node },
        } => crate::ops::node_start_cmd(&which, &node, out),
        LabCommand::Apiserver { kubeconfig, netns } => crate::kube::serve(&kubeconfig, &netns),
        LabCommand::Serve { name, tcp, udp } => net::serve(&name, &tcp, &udp, None).map(|()| 0),
        LabCommand::Connect {
            to,
            port,
            udp,
            timeout_ms,
            loop_secs: Some(secs),
        } => {
            let end = Instant::now() + Duration::from_secs(secs);
            let mut n = 0u64;
            while Instant::now() < end {
                if net::connect(to, port, udp, Duration::from_millis(timeout_ms)) {
                    n += 1;
                }
            }
            let _ = writeln!(out, "{n}");
            Ok(0)
        }
        LabCommand::Connect {
            to,
            port,
            udp,
            timeout_ms,
            loop_secs: None,
        } => Ok(
            if net::connect(to, port, udp, Duration::from_millis(timeout_ms)) {
                0
            } else {
                1
            },
        ),
        LabCommand::Bench {
            which,
            pod_ready: Some(n),
            ..
        } => crate::ops::pod_ready_bench(&which, n, out),
        LabCommand::Bench {
            which,
            secs,
            policies,
            pod_ready: None,
        } => bench(&which, secs, policies, out),
        LabCommand::Supervise {
            pid_file,
            log,
            once,
            argv,
        } => net::supervise(&pid_file, &log, once, &argv),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(err, "margay lab: {e}");
            2
        }
    }
}

fn exe() -> Result<PathBuf, LabError> {
    std::env::current_exe().map_err(|e| other(format!("cannot find the margay binary: {e}")))
}

pub(crate) fn load(which: &Which) -> Result<LabState, LabError> {
    check_name(&which.name).map_err(other)?;
    LabState::load(&which.dir()).map_err(|e| {
        other(format!(
            "lab {:?} is not up ({}: {e}); start it with `margay lab up --name {}`",
            which.name,
            LabState::state_file(&which.dir()).display(),
            which.name
        ))
    })
}

/// `margay` inside a namespace, with the lab's datastore in its environment.
pub(crate) fn margay_in(st: &LabState, ns: &str) -> Result<Command, LabError> {
    let mut c = net::in_netns(ns, exe()?);
    for (k, v) in st.datastore_env() {
        c.env(k, v);
    }
    Ok(c)
}

/// Applies YAML to the lab's datastore (from the fabric namespace, which reaches both the
/// embedded store file and the lab's etcd).
pub fn apply_yaml(st: &LabState, yaml: &str) -> Result<(), LabError> {
    let file = st.dir.join(format!("apply-{}.yaml", std::process::id()));
    std::fs::write(&file, yaml).map_err(|e| other(format!("{}: {e}", file.display())))?;
    let mut c = margay_in(st, &st.fabric_netns())?;
    c.args(["ctl", "apply", "-f"]).arg(&file);
    let r = net::run(&mut c);
    let _ = std::fs::remove_file(&file);
    r.map(drop)
}

struct Progress {
    bar: Option<indicatif::ProgressBar>,
    started: Instant,
}

impl Progress {
    fn new(steps: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(steps);
            if let Ok(style) =
                indicatif::ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {pos}/{len} {msg}")
            {
                b.set_style(style);
            }
            b
        });
        Progress {
            bar,
            started: Instant::now(),
        }
    }

    fn step(&self, err: &mut dyn Write, msg: &str) {
        match &self.bar {
            Some(b) => {
                b.set_message(msg.to_string());
                b.inc(1);
            }
            None => {
                let _ = writeln!(
                    err,
                    "[{:>5.1}s] {msg}",
                    self.started.elapsed().as_secs_f64()
                );
            }
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// How nodes reach each other: the backend and, for BGP, an optional ToR's AS number.
struct Networking<'a> {
    backend: &'a str,
    tor: Option<u32>,
}

fn up(
    which: &Which,
    file: Option<&Path>,
    nodes: usize,
    datastore: &str,
    networking: &Networking<'_>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, LabError> {
    let (backend, tor) = (networking.backend, networking.tor);
    check_name(&which.name).map_err(other)?;
    if !matches!(datastore, "local" | "etcd" | "kubernetes") {
        return Err(other(format!(
            "--datastore {datastore:?}: use local (embedded store), etcd or kubernetes (a Kubernetes API server)"
        )));
    }
    if !matches!(backend, "vxlan" | "bird") {
        return Err(other(format!(
            "--backend {backend:?}: use vxlan (Felix's VXLAN routes) or bird (BGP, no encapsulation)"
        )));
    }
    if tor.is_some() && backend != "bird" {
        return Err(other("--tor needs --backend bird (the ToR speaks BGP)"));
    }
    let topology = match file {
        Some(f) => Topology::parse(
            &std::fs::read_to_string(f).map_err(|e| other(format!("{}: {e}", f.display())))?,
        )
        .map_err(|e| other(e.to_string()))?,
        None => default_topology(nodes),
    };
    let dir = which.dir();
    if let Ok(old) = LabState::load(&dir) {
        if !net::netns_with_prefix(&old.fabric_netns()).is_empty() {
            return Err(other(format!(
                "lab {:?} is already up; `margay lab down --name {}` first",
                which.name, which.name
            )));
        }
        // Left over from a crash: clear it.
        down(which, &mut std::io::sink())?;
    }
    let started = Instant::now();
    let mut st = LabState::new(&which.name, &dir, datastore, backend, topology);
    if let Some(asn) = tor {
        st = st.with_tor(asn);
    }
    let _ = std::fs::remove_dir_all(&dir);
    st.save()
        .map_err(|e| other(format!("{}: {e}", dir.display())))?;
    let progress = Progress::new(
        6 + st.pods.len() as u64 + 2 * u64::from(backend == "bird") + u64::from(st.is_kubernetes()),
    );
    let result = build(st, &progress, err);
    progress.finish();
    match result {
        Ok(st) => {
            let (st, timings) = st;
            let _ = writeln!(
                out,
                "lab {:?} is up in {:.1} s: {} nodes, {} pods ({} datastore, {} backend{})",
                st.name,
                started.elapsed().as_secs_f64(),
                st.nodes.len(),
                st.pods.len(),
                st.datastore,
                st.backend,
                if st.tor.is_some() { ", ToR" } else { "" }
            );
            for t in timings {
                let _ = writeln!(out, "{t}");
            }
            print_status(&st, out);
            Ok(0)
        }
        Err(e) => {
            let _ = writeln!(
                err,
                "margay lab: building the lab failed: {e}\nlogs are in {}; remove what was built with `margay lab down --name {}`",
                dir.display(),
                which.name
            );
            Ok(1)
        }
    }
}

fn build(
    mut st: LabState,
    progress: &Progress,
    err: &mut dyn Write,
) -> Result<(LabState, Vec<String>), LabError> {
    let exe = exe()?;
    let bird = st.backend == "bird";
    let mut timings = Vec::new();
    // Fabric and nodes.
    let fabric = st.fabric_netns();
    net::add_netns(&fabric)?;
    net::ip(&fabric, &["link", "add", "br0", "type", "bridge"])?;
    net::ip(
        &fabric,
        &[
            "addr",
            "add",
            &format!("{FABRIC_PREFIX}.1/24"),
            "dev",
            "br0",
        ],
    )?;
    net::ip(&fabric, &["link", "set", "br0", "up"])?;
    for (i, node) in st.nodes.iter().enumerate() {
        net::add_netns(&node.netns)?;
        let fab_if = format!("n{i}");
        net::ip(
            &fabric,
            &[
                "link",
                "add",
                &fab_if,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &node.netns,
            ],
        )?;
        net::ip(&fabric, &["link", "set", &fab_if, "master", "br0", "up"])?;
        net::ip(
            &node.netns,
            &["addr", "add", &format!("{}/24", node.ip), "dev", "eth0"],
        )?;
        net::ip(&node.netns, &["link", "set", "eth0", "up"])?;
        net::ip(
            &node.netns,
            &[
                "route",
                "add",
                "default",
                "via",
                &format!("{FABRIC_PREFIX}.1"),
            ],
        )?;
        // No forwarding sysctl here: a fresh namespace has forwarding off, like a host nobody
        // prepared, and Felix (IPForwarding) turns it on.
        std::fs::create_dir_all(st.node_dir(&node.name))
            .map_err(|e| other(format!("{}: {e}", st.node_dir(&node.name).display())))?;
    }
    if let Some(tor) = st.tor.clone() {
        net::add_netns(&tor.netns)?;
        net::ip(
            &fabric,
            &[
                "link", "add", "tor", "type", "veth", "peer", "name", "eth0", "netns", &tor.netns,
            ],
        )?;
        net::ip(&fabric, &["link", "set", "tor", "master", "br0", "up"])?;
        net::ip(
            &tor.netns,
            &["addr", "add", &format!("{}/24", tor.ip), "dev", "eth0"],
        )?;
        net::ip(&tor.netns, &["link", "set", "eth0", "up"])?;
        net::sysctl(&tor.netns, "net.ipv4.ip_forward", "1")?;
    }
    progress.step(err, "namespaces and fabric");

    // The datastore.
    let api = match st.datastore.as_str() {
        "etcd" => {
            start_etcd(&st, &exe)?;
            None
        }
        "kubernetes" => Some(start_apiserver(&st, &exe)?),
        _ => None,
    };
    progress.step(err, "datastore");
    if let Some(api) = &api {
        // What the cluster's installer, controllers and kubelets make before any network
        // plugin runs: kubeadm's configuration, every node registered (NotReady: no CNI
        // configuration yet), the namespaces with their default service accounts.
        api.ensure(&crate::kube::CONFIGMAPS, &k8s::kubeadm_config(POD_CIDR))?;
        for node in &st.nodes {
            api.create(&crate::kube::NODES, &k8s::node(&node.name, &node.ip, false))?;
        }
        for ns in &st.topology.namespaces {
            ensure_namespace(api, ns)?;
        }
        progress.step(err, "Kubernetes Nodes and Namespaces");
    }

    // Node start-up (the first node creates the pool).
    for node in &st.nodes {
        node_startup(&st, node)?;
    }
    progress.step(err, "node start-up");

    if api.is_none() {
        // Namespaces as Calico represents Kubernetes namespaces: profiles kns.<ns> (in the
        // Kubernetes datastore they are the Namespaces themselves).
        apply_yaml(&st, &namespace_profiles(&st.topology.namespaces))?;
    }
    progress.step(err, "namespaces (profiles)");

    if let Some(tor) = &st.tor {
        start_tor(&st, tor, &exe)?;
    }
    for node in &st.nodes {
        start_felix(&st, node, &exe)?;
        if bird {
            start_confd(&st, node, &exe)?;
        }
        if api.is_some() {
            start_network_condition(&st, node, &exe)?;
        }
    }
    if bird {
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &st.nodes {
            start_bird(&st, node, &exe, deadline)?;
        }
        progress.step(err, "confd and BIRD on every node");
    }
    wait_felix(&st, Duration::from_secs(60))?;
    progress.step(err, "felix in sync on every node");
    if let Some(api) = &api {
        // Calico's CNI configuration is in place once calico-node runs: the kubelets report
        // their nodes Ready. The cluster's controllers start.
        for node in &st.nodes {
            api.patch_status(
                &crate::kube::NODES,
                None,
                &node.name,
                &k8s::node_ready_patch(true),
            )?;
        }
        start_kube_controllers(&st, &exe)?;
    }
    if bird {
        let took = crate::bgp::wait_established(&st, Duration::from_secs(60))?;
        timings.push(format!(
            "BGP: every node's {} sessions established {:.2} s after BIRD started",
            crate::bgp::expected_sessions(&st),
            took.as_secs_f64()
        ));
        progress.step(err, "BGP sessions established");
    }

    // Pods, wired by the CNI plugin exactly as a runtime would.
    for i in 0..st.pods.len() {
        let id = st.pods[i].id.clone();
        wire_pod(&mut st, i, api.as_ref())?;
        progress.step(err, &format!("pod {id}"));
    }
    wait_felix(&st, Duration::from_secs(60))?;
    if bird {
        let took = crate::bgp::wait_routes(&st, Duration::from_secs(60))?;
        timings.push(format!(
            "BGP: every node has BIRD routes to the other nodes' pod blocks ({:.2} s after the last pod)",
            took.as_secs_f64()
        ));
    }
    progress.step(err, "ready");
    st.save().map_err(|e| other(e.to_string()))?;
    Ok((st, timings))
}

/// The lab's etcd, in the fabric namespace; returns once it answers.
fn start_etcd(st: &LabState, exe: &Path) -> Result<(), LabError> {
    let fabric = st.fabric_netns();
    let dir = st.dir.join("etcd");
    std::fs::create_dir_all(&dir).map_err(|e| other(format!("{}: {e}", dir.display())))?;
    let url = format!("http://{FABRIC_PREFIX}.1:2379");
    let argv: Vec<String> = [
        "ip",
        "netns",
        "exec",
        &fabric,
        "etcd",
        "--name",
        "lab",
        "--data-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        dir.join("data").display().to_string(),
        "--listen-client-urls".into(),
        url.clone(),
        "--advertise-client-urls".into(),
        url,
        "--listen-peer-urls".into(),
        "http://127.0.0.1:2380".into(),
        "--initial-advertise-peer-urls".into(),
        "http://127.0.0.1:2380".into(),
        "--initial-cluster".into(),
        "lab=http://127.0.0.1:2380".into(),
    ])
    .collect();
    net::spawn_supervised(
        exe,
        &dir.join("etcd.pid"),
        &dir.join("etcd.log"),
        true,
        &[],
        &argv,
    )?;
    wait_datastore(st, "etcd did not come up within 30 s (see etcd/etcd.log)")
}

/// Waits (30 s at most) until `margay ctl` reaches the datastore from the fabric namespace.
fn wait_datastore(st: &LabState, failure: &str) -> Result<(), LabError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut c = margay_in(st, &st.fabric_netns())?;
        c.args(["ctl", "get", "ippools"]);
        let r = net::run(&mut c);
        match r {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(other(format!("{failure}: {e}"))),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// The lab's Kubernetes API server (`margay lab apiserver`, see [`crate::kube`]): on 127.0.0.1
/// of this namespace and, forwarded, of the fabric's and every node's; returns the lab's
/// client once the kubeconfig is written and the API answers from the fabric namespace.
fn start_apiserver(st: &LabState, exe: &Path) -> Result<crate::kube::Api, LabError> {
    let dir = st.dir.join("apiserver");
    std::fs::create_dir_all(&dir).map_err(|e| other(format!("{}: {e}", dir.display())))?;
    let namespaces: Vec<String> = std::iter::once(st.fabric_netns())
        .chain(st.nodes.iter().map(|n| n.netns.clone()))
        .collect();
    let argv = vec![
        exe.display().to_string(),
        "--log-level".into(),
        "info".into(),
        "lab".into(),
        "apiserver".into(),
        "--kubeconfig".into(),
        st.kubeconfig().display().to_string(),
        "--netns".into(),
        namespaces.join(","),
    ];
    // Not restarted: the server keeps its objects in memory, a new one would be empty.
    net::spawn_supervised(
        exe,
        &dir.join("apiserver.pid"),
        &dir.join("apiserver.log"),
        false,
        &[],
        &argv,
    )?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !st.kubeconfig().exists() {
        if Instant::now() > deadline {
            return Err(other(format!(
                "the API server wrote no {} within 30 s (see {})",
                st.kubeconfig().display(),
                dir.join("apiserver.log").display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_datastore(
        st,
        "the Kubernetes API did not answer within 30 s (see apiserver/apiserver.log)",
    )?;
    crate::kube::Api::connect(&st.kubeconfig())
}

/// A Namespace and its `default` ServiceAccount, unless they exist.
pub(crate) fn ensure_namespace(
    api: &crate::kube::Api,
    ns: &crate::topology::NamespaceSpec,
) -> Result<(), LabError> {
    api.ensure(&crate::kube::NAMESPACES, &k8s::namespace(ns))?;
    api.ensure(
        &crate::kube::SERVICE_ACCOUNTS,
        &k8s::service_account(&ns.name),
    )
}

/// `margay kube-controllers`, supervised, in the fabric namespace (the control plane's host).
fn start_kube_controllers(st: &LabState, exe: &Path) -> Result<(), LabError> {
    let dir = st.dir.join("kube-controllers");
    std::fs::create_dir_all(&dir).map_err(|e| other(format!("{}: {e}", dir.display())))?;
    let mut env = st.datastore_env();
    env.extend([
        ("LOG_LEVEL".to_string(), "info".to_string()),
        ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
    ]);
    let argv = vec![
        "ip".to_string(),
        "netns".into(),
        "exec".into(),
        st.fabric_netns(),
        exe.display().to_string(),
        "kube-controllers".into(),
        "--status-file".into(),
        dir.join("status.json").display().to_string(),
    ];
    net::spawn_supervised(
        exe,
        &dir.join("kube-controllers.pid"),
        &dir.join("kube-controllers.log"),
        true,
        &env,
        &argv,
    )
}

/// Profiles `kns.<ns>`, as Calico makes them of Kubernetes Namespaces (local and etcd labs).
pub(crate) fn namespace_profiles(namespaces: &[crate::topology::NamespaceSpec]) -> String {
    let mut yaml = String::new();
    for ns in namespaces {
        let mut labels = ns.labels.clone();
        labels.insert("kubernetes.io/metadata.name".into(), ns.name.clone());
        let apply: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("      pcns.{k}: {v:?}"))
            .chain(std::iter::once(format!(
                "      pcns.projectcalico.org/name: {:?}",
                ns.name
            )))
            .collect();
        yaml.push_str(&format!(
            "---\napiVersion: projectcalico.org/v3\nkind: Profile\nmetadata:\n  name: kns.{}\nspec:\n  labelsToApply:\n{}\n  ingress: [{{action: Allow}}]\n  egress: [{{action: Allow}}]\n",
            ns.name,
            apply.join("\n")
        ));
    }
    yaml
}

/// `margay node startup` in the node's namespace, as calico-node runs it at every start.
pub(crate) fn node_startup(st: &LabState, node: &crate::state::NodeState) -> Result<(), LabError> {
    let bird = st.backend == "bird";
    let dir = st.node_dir(&node.name);
    let mut c = margay_in(st, &node.netns)?;
    c.args(["node", "startup", "--root"])
        .arg(dir.join("root"))
        .env("NODENAME", &node.name)
        .env("IP", "autodetect")
        .env("IP6", "none")
        .env(
            "CALICO_IPV4POOL_VXLAN",
            if bird { "Never" } else { "Always" },
        )
        .env("CALICO_IPV4POOL_IPIP", "Never")
        .env("CALICO_IPV4POOL_NAT_OUTGOING", "true")
        .env(
            "CALICO_NETWORKING_BACKEND",
            if bird { "bird" } else { "vxlan" },
        )
        .env("CALICO_STARTUP_LOGLEVEL", "warning");
    if st.is_kubernetes() {
        // As on a cluster: the address the kubelet registered (the Node's InternalIP), and
        // the pool from kubeadm's podSubnet (kube-system/kubeadm-config, made by `up`).
        c.env("IP_AUTODETECTION_METHOD", "kubernetes-internal-ip");
    } else {
        c.env("IP_AUTODETECTION_METHOD", "interface=eth0")
            .env("CALICO_IPV4POOL_CIDR", POD_CIDR);
    }
    net::run(&mut c)
        .map(drop)
        .map_err(|e| other(format!("node start-up of {}: {e}", node.name)))
}

/// Felix on a node, supervised.
pub(crate) fn start_felix(
    st: &LabState,
    node: &crate::state::NodeState,
    exe: &Path,
) -> Result<(), LabError> {
    let dir = st.node_dir(&node.name);
    let mut env = st.datastore_env();
    env.extend([
        ("FELIX_FELIXHOSTNAME".to_string(), node.name.clone()),
        ("FELIX_HEALTHENABLED".into(), "true".into()),
        ("FELIX_LOGSEVERITYSCREEN".into(), "Info".into()),
        // Each node logs to its own file; the machine's syslog is not the lab's.
        ("FELIX_LOGSEVERITYSYS".into(), "none".into()),
        (
            "FELIX_ENDPOINTSTATUSPATHPREFIX".into(),
            dir.join("status").display().to_string(),
        ),
        ("MARGAY_DATAPLANE".into(), "linux".into()),
        // Each node's pod MTU (Calico's /var/lib/calico/mtu) in the node's directory.
        (
            "MARGAY_MTU_FILE".into(),
            dir.join("mtu").display().to_string(),
        ),
        ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
    ]);
    let argv = vec![
        "ip".to_string(),
        "netns".into(),
        "exec".into(),
        node.netns.clone(),
        exe.display().to_string(),
        "felix".into(),
        "run".into(),
        "--status-socket".into(),
        dir.join("felix.sock").display().to_string(),
    ];
    net::spawn_supervised(
        exe,
        &dir.join("felix.pid"),
        &dir.join("felix.log"),
        true,
        &env,
        &argv,
    )
}

/// Kubernetes lab: `margay node network-condition` on a node (supervised), which clears the
/// Node's NetworkUnavailable once Felix (and BIRD) are ready and sets it when stopped.
pub(crate) fn start_network_condition(
    st: &LabState,
    node: &crate::state::NodeState,
    exe: &Path,
) -> Result<(), LabError> {
    let dir = st.node_dir(&node.name);
    let bird = st.backend == "bird";
    let mut env = st.datastore_env();
    env.extend([
        ("NODENAME".to_string(), node.name.clone()),
        (
            "CALICO_NETWORKING_BACKEND".into(),
            if bird { "bird" } else { "vxlan" }.into(),
        ),
        ("FELIX_HEALTHENABLED".into(), "true".into()),
        ("MARGAY_LOG_LEVEL".into(), "info".into()),
        ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
    ]);
    let mut argv = vec![
        "ip".to_string(),
        "netns".into(),
        "exec".into(),
        node.netns.clone(),
        exe.display().to_string(),
        "node".into(),
        "network-condition".into(),
        "--root".into(),
        dir.join("root").display().to_string(),
    ];
    if bird {
        argv.extend([
            "--bird-socket".into(),
            st.bird_socket(&node.name).display().to_string(),
        ]);
    }
    net::spawn_supervised(
        exe,
        &dir.join("network-condition.pid"),
        &dir.join("network-condition.log"),
        true,
        &env,
        &argv,
    )
}

/// The ToR's BIRD (BGP backend with --tor) and the BGPPeer that makes every node peer with it.
fn start_tor(st: &LabState, tor: &crate::state::TorState, exe: &Path) -> Result<(), LabError> {
    apply_yaml(st, &crate::bgp::tor_peer_yaml(tor))?;
    let dir = st.tor_dir();
    std::fs::create_dir_all(&dir).map_err(|e| other(format!("{}: {e}", dir.display())))?;
    let cfg = dir.join("bird.cfg");
    std::fs::write(&cfg, crate::bgp::tor_config(tor, &st.nodes))
        .map_err(|e| other(format!("{}: {e}", cfg.display())))?;
    net::spawn_supervised(
        exe,
        &dir.join("bird.pid"),
        &dir.join("bird.log"),
        true,
        &[],
        &bird_argv(&tor.netns, &dir),
    )
}

/// BGP backend: `margay confd` on a node (supervised).
pub(crate) fn start_confd(
    st: &LabState,
    node: &crate::state::NodeState,
    exe: &Path,
) -> Result<(), LabError> {
    let dir = st.node_dir(&node.name);
    let confd_dir = dir.join("confd");
    std::fs::create_dir_all(&confd_dir)
        .map_err(|e| other(format!("{}: {e}", confd_dir.display())))?;
    let mut env = st.datastore_env();
    env.extend([
        ("NODENAME".to_string(), node.name.clone()),
        ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
    ]);
    let argv: Vec<String> = vec![
        "ip".into(),
        "netns".into(),
        "exec".into(),
        node.netns.clone(),
        exe.display().to_string(),
        "confd".into(),
        "--nodename".into(),
        node.name.clone(),
        "--config-dir".into(),
        confd_dir.display().to_string(),
        "--bird-socket".into(),
        st.bird_socket(&node.name).display().to_string(),
        "--bird6-socket".into(),
        dir.join("bird6.ctl").display().to_string(),
    ];
    net::spawn_supervised(
        exe,
        &dir.join("confd.pid"),
        &dir.join("confd.log"),
        true,
        &env,
        &argv,
    )
}

/// BGP backend: BIRD on a node (supervised, in the node's namespace, foreground), once confd
/// has written its bird.cfg (confd tells it to reconfigure on every change).
pub(crate) fn start_bird(
    st: &LabState,
    node: &crate::state::NodeState,
    exe: &Path,
    deadline: Instant,
) -> Result<(), LabError> {
    let dir = st.node_dir(&node.name);
    let cfg = dir.join("confd").join("bird.cfg");
    while !cfg.exists() {
        if Instant::now() > deadline {
            return Err(other(format!(
                "margay confd on {} wrote no {} in time (see {})",
                node.name,
                cfg.display(),
                dir.join("confd.log").display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    net::spawn_supervised(
        exe,
        &dir.join("bird.pid"),
        &dir.join("bird.log"),
        true,
        &[],
        &bird_argv(&node.netns, &dir),
    )
}

/// Makes pod `st.pods[i]` run as a runtime (and, in a Kubernetes lab, a kubelet) would: its
/// namespace, (Kubernetes) the Pod object, CNI ADD, the server in it, (Kubernetes) its
/// status; (otherwise) the endpoint's named ports. Saves the state with its address.
pub(crate) fn wire_pod(
    st: &mut LabState,
    i: usize,
    api: Option<&crate::kube::Api>,
) -> Result<(), LabError> {
    let exe = exe()?;
    let pod = st.pods[i].clone();
    let spec = st
        .topology
        .pod(&pod.id)
        .cloned()
        .ok_or_else(|| other(format!("pod {} vanished from the topology", pod.id)))?;
    let node_ip = st
        .node(&pod.node)
        .map(|n| n.ip.clone())
        .ok_or_else(|| other(format!("pod {} is on unknown node {}", pod.id, pod.node)))?;
    net::add_netns(&pod.netns)?;
    if let Some(api) = api {
        api.create(&crate::kube::PODS, &k8s::pod(&spec, &pod.node))?;
    }
    let ip = cni(st, &pod, &spec, "ADD")?;
    if api.is_none() {
        add_named_ports(st, &spec)?;
    }
    st.pods[i].ip = Some(ip.clone());
    st.save().map_err(|e| other(e.to_string()))?;
    let pods_dir = st.dir.join("pods");
    std::fs::create_dir_all(&pods_dir).map_err(|e| other(e.to_string()))?;
    let base = pod.file_base();
    let mut argv = vec![
        "ip".to_string(),
        "netns".into(),
        "exec".into(),
        pod.netns.clone(),
        exe.display().to_string(),
        "lab".into(),
        "serve".into(),
        "--name".into(),
        pod.id.clone(),
    ];
    for (flag, ports) in [("--tcp", &spec.tcp), ("--udp", &spec.udp)] {
        if !ports.is_empty() {
            argv.push(flag.into());
            argv.push(
                ports
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
    }
    net::spawn_supervised(
        &exe,
        &pods_dir.join(format!("{base}.pid")),
        &pods_dir.join(format!("{base}.log")),
        true,
        &[],
        &argv,
    )?;
    if let Some(api) = api {
        api.patch_status(
            &crate::kube::PODS,
            Some(&spec.namespace),
            &spec.name,
            &k8s::pod_running_patch(&ip, &node_ip, &pod.container_id),
        )?;
    }
    Ok(())
}

/// `bird -f` inside `netns`, config `<dir>/confd/bird.cfg` (a node) or `<dir>/bird.cfg`
/// (the ToR), socket `<dir>/bird.ctl`.
fn bird_argv(netns: &str, dir: &Path) -> Vec<String> {
    let cfg = if dir.join("confd").is_dir() {
        dir.join("confd").join("bird.cfg")
    } else {
        dir.join("bird.cfg")
    };
    vec![
        "ip".into(),
        "netns".into(),
        "exec".into(),
        netns.to_string(),
        "bird".into(),
        "-f".into(),
        "-c".into(),
        cfg.display().to_string(),
        "-s".into(),
        dir.join("bird.ctl").display().to_string(),
        "-P".into(),
        dir.join("bird.pidfile").display().to_string(),
    ]
}

/// Gives the pod's endpoint named ports for what it serves (`serve-80-tcp`, `serve-81-udp`,
/// as in Kubernetes' network-policy tests; a runtime would pass container ports).
fn add_named_ports(st: &LabState, spec: &crate::topology::PodSpec) -> Result<(), LabError> {
    if spec.tcp.is_empty() && spec.udp.is_empty() {
        return Ok(());
    }
    let mut c = margay_in(st, &st.fabric_netns())?;
    c.args([
        "ctl",
        "get",
        "workloadendpoints",
        "-n",
        &spec.namespace,
        "-o",
        "json",
    ]);
    let text = net::run(&mut c)?;
    let doc: Value = serde_json::from_str(&text)
        .map_err(|e| other(format!("reading endpoints of {}: {e}", spec.namespace)))?;
    let items: Vec<Value> = match doc.get("items").and_then(Value::as_array) {
        Some(items) => items.clone(),
        None => vec![doc],
    };
    let Some(mut wep) = items
        .into_iter()
        .find(|w| w["spec"]["pod"].as_str() == Some(spec.name.as_str()))
    else {
        return Err(other(format!(
            "no endpoint for pod {} after CNI ADD",
            spec.id()
        )));
    };
    let ports: Vec<Value> = spec
        .tcp
        .iter()
        .map(
            |p| serde_json::json!({"name": format!("serve-{p}-tcp"), "protocol": "TCP", "port": p}),
        )
        .chain(spec.udp.iter().map(
            |p| serde_json::json!({"name": format!("serve-{p}-udp"), "protocol": "UDP", "port": p}),
        ))
        .collect();
    wep["spec"]["ports"] = Value::Array(ports);
    if let Some(meta) = wep["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
    }
    apply_yaml(st, &wep.to_string())
}

/// The network configuration the lab's runtime hands the CNI plugin on `node`: no MTU (the
/// plugin takes the one Felix wrote), the node's own files, the datastore; in a Kubernetes lab
/// the plugin entry of `deploy/config.yaml`'s conflist (Kubernetes datastore through the lab's
/// kubeconfig, `policy: k8s`: the pod's labels and service account come from the API), else
/// the pod's labels in `args.cni` (CNI conventions).
fn cni_conf(
    st: &LabState,
    node: &crate::state::NodeState,
    spec: &crate::topology::PodSpec,
) -> Value {
    let dir = st.node_dir(&node.name);
    let mut conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "type": "margay",
        "nodename": node.name,
        "nodename_file": dir.join("root/var/lib/calico/nodename").display().to_string(),
        "log_level": "info",
        "log_file_path": dir.join("cni.log").display().to_string(),
        "ipam": {"type": "margay-ipam"},
        "ipam_lock_file": dir.join("ipam.lock").display().to_string(),
        "endpoint_status_dir": dir.join("status/endpoint-status").display().to_string(),
        "policy_setup_timeout_seconds": 10,
    });
    let ds: BTreeMap<String, String> = st.datastore_env().into_iter().collect();
    let labels: Vec<Value> = spec
        .labels
        .iter()
        .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
        .collect();
    if let Value::Object(o) = &mut conf {
        match ds.get("DATASTORE_TYPE").map(String::as_str) {
            Some("kubernetes") => {
                o.insert("datastore_type".into(), "kubernetes".into());
                o.insert("policy".into(), serde_json::json!({"type": "k8s"}));
                o.insert(
                    "kubernetes".into(),
                    serde_json::json!({"kubeconfig": st.kubeconfig().display().to_string()}),
                );
            }
            Some("etcdv3") => {
                o.insert("datastore_type".into(), "etcdv3".into());
                o.insert(
                    "etcd_endpoints".into(),
                    ds.get("ETCD_ENDPOINTS").cloned().unwrap_or_default().into(),
                );
                o.insert(
                    "args".into(),
                    serde_json::json!({"cni": {"labels": labels}}),
                );
            }
            _ => {
                o.insert("datastore_type".into(), "local".into());
                o.insert(
                    "datastore_path".into(),
                    ds.get("DATASTORE_PATH").cloned().unwrap_or_default().into(),
                );
                o.insert(
                    "args".into(),
                    serde_json::json!({"cni": {"labels": labels}}),
                );
            }
        }
    }
    conf
}

/// How long one CNI plugin call may take (it waits up to 10 s for Felix's endpoint status).
const CNI_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the CNI plugin for a pod as a kubelet's runtime does (CNI_* variables and nothing else
/// but PATH, CNI_ARGS with the pod's namespace, name and sandbox); ADD returns the pod's address.
pub(crate) fn cni(
    st: &LabState,
    pod: &crate::state::PodState,
    spec: &crate::topology::PodSpec,
    command: &str,
) -> Result<String, LabError> {
    let node = st
        .node(&pod.node)
        .ok_or_else(|| other(format!("pod {} is on unknown node {}", pod.id, pod.node)))?;
    let dir = st.node_dir(&node.name);
    let conf = cni_conf(st, node, spec);
    let exe = exe()?;
    let mut c = net::in_netns(&node.netns, &exe);
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CNI_COMMAND", command)
        // No MTU in the network config: the plugin takes the one Felix detected.
        .env("MARGAY_MTU_FILE", dir.join("mtu"))
        .env("CNI_CONTAINERID", &pod.container_id)
        .env("CNI_NETNS", format!("/run/netns/{}", pod.netns))
        .env("CNI_IFNAME", "eth0")
        .env(
            "CNI_PATH",
            exe.parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        )
        .env(
            "CNI_ARGS",
            k8s::cni_args(&spec.namespace, &spec.name, &pod.container_id),
        );
    let outp = net::run_with_input(&mut c, conf.to_string().as_bytes(), CNI_TIMEOUT)
        .map_err(|e| other(format!("CNI {command} for {}: {e}", pod.id)))?;
    let text = String::from_utf8_lossy(&outp.stdout);
    if !outp.status.success() {
        return Err(other(format!(
            "CNI {command} for {} failed: {} {}",
            pod.id,
            text.trim(),
            String::from_utf8_lossy(&outp.stderr).trim()
        )));
    }
    if command != "ADD" {
        return Ok(String::new());
    }
    let result: Value = serde_json::from_str(&text)
        .map_err(|e| other(format!("CNI ADD for {}: bad result {text:?}: {e}", pod.id)))?;
    result["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .map(str::to_string)
        .ok_or_else(|| other(format!("CNI ADD for {}: no address in {text}", pod.id)))
}

fn felix_status(st: &LabState, node: &str) -> Option<Value> {
    let sock = st.node_dir(node).join("felix.sock");
    let out = Command::new(exe().ok()?)
        .args(["felix", "status", "--json", "--socket"])
        .arg(&sock)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

fn wait_felix(st: &LabState, limit: Duration) -> Result<(), LabError> {
    let deadline = Instant::now() + limit;
    for node in st.nodes.iter().filter(|n| !n.stopped) {
        wait_node_felix(st, &node.name, deadline)?;
    }
    Ok(())
}

/// Waits until Felix on `node` says its dataplane is in sync.
pub(crate) fn wait_node_felix(
    st: &LabState,
    node: &str,
    deadline: Instant,
) -> Result<(), LabError> {
    let started = Instant::now();
    loop {
        if felix_status(st, node).is_some_and(|s| s["dataplane"]["in_sync"] == Value::Bool(true)) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(other(format!(
                "felix on {node} did not get in sync within {:?}; see {}",
                started.elapsed(),
                st.node_dir(node).join("felix.log").display()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn print_status(st: &LabState, out: &mut dyn Write) {
    let _ = writeln!(out, "NODE      NAMESPACE              ADDRESS        FELIX");
    for n in &st.nodes {
        let felix = match felix_status(st, &n.name) {
            None if n.stopped => "stopped (`margay lab node start`)".into(),
            Some(s) => format!(
                "{}{}",
                if s["ready"] == Value::Bool(true) {
                    "ready"
                } else {
                    "NOT READY"
                },
                if s["dataplane"]["in_sync"] == Value::Bool(true) {
                    ", dataplane in sync"
                } else {
                    ", dataplane not in sync"
                }
            ),
            None => "not answering".into(),
        };
        let _ = writeln!(out, "{:<9} {:<22} {:<14} {felix}", n.name, n.netns, n.ip);
    }
    let _ = writeln!(out, "POD       NODE      ADDRESS        PORTS");
    for p in &st.pods {
        let ports = st
            .topology
            .pod(&p.id)
            .map(|s| format!("tcp {:?} udp {:?}", s.tcp, s.udp))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<9} {:<9} {:<14} {ports}",
            p.id,
            p.node,
            p.ip.as_deref().unwrap_or("-")
        );
    }
    if st.backend == "bird" {
        let _ = write!(out, "{}", crate::bgp::render_status(st));
    }
    if st.is_kubernetes() {
        match kube_view(st) {
            Ok(v) => {
                let _ = write!(out, "{}", render_kube_view(&v, &st.kubeconfig()));
            }
            Err(e) => {
                let _ = writeln!(out, "KUBERNETES: {e}");
            }
        }
    }
}

/// What the lab's API server holds: Nodes (InternalIP, Ready, the address calico-node
/// registered, NetworkUnavailable) and Pods (node, phase, address, labels).
fn kube_view(st: &LabState) -> Result<Value, LabError> {
    let api = crate::kube::Api::connect(&st.kubeconfig())?;
    let condition = |obj: &Value, t: &str| -> Value {
        obj.pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == t))
            .map(|c| c["status"].clone())
            .unwrap_or(Value::Null)
    };
    let nodes: Vec<Value> = api
        .list(&crate::kube::NODES, None)?
        .iter()
        .map(|n| {
            let internal = n
                .pointer("/status/addresses")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
                .map(|a| a["address"].clone())
                .unwrap_or(Value::Null);
            serde_json::json!({
                "name": n["metadata"]["name"],
                "internal_ip": internal,
                "ready": condition(n, "Ready"),
                "calico_ipv4": n["metadata"]["annotations"]["projectcalico.org/IPv4Address"],
                "network_unavailable": condition(n, "NetworkUnavailable"),
            })
        })
        .collect();
    let pods: Vec<Value> = api
        .list(&crate::kube::PODS, None)?
        .iter()
        .map(|p| {
            serde_json::json!({
                "id": format!("{}/{}",
                    p["metadata"]["namespace"].as_str().unwrap_or_default(),
                    p["metadata"]["name"].as_str().unwrap_or_default()),
                "node": p["spec"]["nodeName"],
                "phase": p["status"]["phase"],
                "pod_ip": p["status"]["podIP"],
                "calico_pod_ip": p["metadata"]["annotations"]["cni.projectcalico.org/podIP"],
                "labels": p["metadata"]["labels"],
            })
        })
        .collect();
    Ok(serde_json::json!({
        "kubeconfig": st.kubeconfig().display().to_string(),
        "nodes": nodes,
        "pods": pods,
    }))
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) if !s.is_empty() => s.clone(),
        Value::Null | Value::String(_) => "-".into(),
        other => other.to_string(),
    }
}

/// The Kubernetes view as text (pure).
pub fn render_kube_view(v: &Value, kubeconfig: &Path) -> String {
    let mut s = format!(
        "KUBERNETES (kubectl --kubeconfig {})\nNODE      INTERNAL-IP    READY  CALICO-ADDRESS     NETWORK-UNAVAILABLE\n",
        kubeconfig.display()
    );
    let empty = Vec::new();
    for n in v["nodes"].as_array().unwrap_or(&empty) {
        s.push_str(&format!(
            "{:<9} {:<14} {:<6} {:<18} {}\n",
            text(&n["name"]),
            text(&n["internal_ip"]),
            text(&n["ready"]),
            text(&n["calico_ipv4"]),
            text(&n["network_unavailable"])
        ));
    }
    s.push_str("POD                 NODE      PHASE     POD-IP         LABELS\n");
    for p in v["pods"].as_array().unwrap_or(&empty) {
        let labels = p["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        s.push_str(&format!(
            "{:<19} {:<9} {:<9} {:<14} {labels}\n",
            text(&p["id"]),
            text(&p["node"]),
            text(&p["phase"]),
            text(&p["pod_ip"])
        ));
    }
    s
}

fn status(which: &Which, json: bool, out: &mut dyn Write) -> Result<u8, LabError> {
    let st = load(which)?;
    if json {
        let nodes: Vec<Value> = st
            .nodes
            .iter()
            .map(|n| {
                let s = felix_status(&st, &n.name);
                let bgp =
                    (st.backend == "bird").then(|| match crate::bgp::node_sessions(&st, &n.name) {
                        Ok(peers) => serde_json::json!(peers),
                        Err(e) => serde_json::json!({"error": e}),
                    });
                serde_json::json!({
                    "name": n.name, "netns": n.netns, "ip": n.ip, "stopped": n.stopped,
                    "ready": s.as_ref().map(|s| s["ready"].clone()),
                    "dataplane_in_sync": s.as_ref().map(|s| s["dataplane"]["in_sync"].clone()),
                    "bgp": bgp,
                })
            })
            .collect();
        let kubernetes = st.is_kubernetes().then(|| {
            kube_view(&st).unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}))
        });
        let doc = serde_json::json!({"name": st.name, "datastore": st.datastore, "backend": st.backend, "tor": st.tor, "nodes": nodes, "pods": st.pods, "kubernetes": kubernetes});
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&doc).unwrap_or_default()
        );
    } else {
        print_status(&st, out);
    }
    Ok(0)
}

fn down(which: &Which, out: &mut dyn Write) -> Result<u8, LabError> {
    check_name(&which.name).map_err(other)?;
    let dir = which.dir();
    let prefix = match LabState::load(&dir) {
        Ok(st) => {
            for pid_file in st.pid_files() {
                net::kill_pid_file(&pid_file);
            }
            st.prefix
        }
        Err(_) => format!("mgy-{}-", which.name),
    };
    // Anything still running with the lab's directory in its command line.
    let needle = dir.display().to_string();
    net::kill_where(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).contains(needle.as_str()))
            .unwrap_or(false)
    });
    let namespaces = net::netns_with_prefix(&prefix);
    let failed = net::remove_netns(&namespaces);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = writeln!(
        out,
        "lab {:?} removed ({} namespaces)",
        which.name,
        namespaces.len() - failed.len()
    );
    if failed.is_empty() {
        Ok(0)
    } else {
        Err(other(format!(
            "could not delete namespaces {failed:?}; remove them with `ip netns delete NAME`"
        )))
    }
}

/// One probe between pods (true: reached).
pub fn probe(
    st: &LabState,
    from: &str,
    to: &str,
    port: u16,
    udp: bool,
    timeout_ms: u64,
) -> Result<bool, LabError> {
    let src = st
        .pod(from)
        .ok_or_else(|| other(format!("no pod {from:?} (pods: {:?})", pod_ids(st))))?;
    let dst = st
        .pod(to)
        .ok_or_else(|| other(format!("no pod {to:?} (pods: {:?})", pod_ids(st))))?;
    let ip = dst
        .ip
        .as_deref()
        .ok_or_else(|| other(format!("pod {to} has no address yet")))?;
    let mut c = net::in_netns(&src.netns, exe()?);
    c.args([
        "lab",
        "connect",
        "--to",
        ip,
        "--port",
        &port.to_string(),
        "--timeout-ms",
        &timeout_ms.to_string(),
    ]);
    if udp {
        c.arg("--udp");
    }
    let status = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| other(format!("probing {from} -> {to}: {e}")))?;
    Ok(status.success())
}

fn pod_ids(st: &LabState) -> Vec<&str> {
    st.pods.iter().map(|p| p.id.as_str()).collect()
}

fn udp_flag(protocol: &str) -> Result<bool, LabError> {
    match protocol {
        "tcp" => Ok(false),
        "udp" => Ok(true),
        other_p => Err(other(format!("--protocol {other_p:?}: use tcp or udp"))),
    }
}

fn probe_cmd(
    which: &Which,
    from: &str,
    to: &str,
    port: u16,
    protocol: &str,
    timeout_ms: u64,
    out: &mut dyn Write,
) -> Result<u8, LabError> {
    let st = load(which)?;
    let ok = probe(&st, from, to, port, udp_flag(protocol)?, timeout_ms)?;
    let _ = writeln!(
        out,
        "{from} -> {to} {protocol}/{port}: {}",
        if ok { "allowed" } else { "denied" }
    );
    Ok(if ok { 0 } else { 1 })
}

/// Every pod to every pod (itself included), probed in parallel.
pub fn matrix(
    st: &LabState,
    port: u16,
    udp: bool,
    timeout_ms: u64,
) -> Result<BTreeMap<String, BTreeMap<String, bool>>, LabError> {
    let pairs: Vec<(String, String)> = st
        .pods
        .iter()
        .flat_map(|a| st.pods.iter().map(move |b| (a.id.clone(), b.id.clone())))
        .collect();
    let mut out: BTreeMap<String, BTreeMap<String, bool>> = BTreeMap::new();
    // All at once (bounded): a matrix costs about one probe timeout.
    for chunk in pairs.chunks(128) {
        let results: Vec<Result<(String, String, bool), LabError>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|(a, b)| {
                    s.spawn(move || {
                        probe(st, a, b, port, udp, timeout_ms).map(|ok| (a.clone(), b.clone(), ok))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(other("a probe thread panicked")))
                })
                .collect()
        });
        for r in results {
            let (a, b, ok) = r?;
            out.entry(a).or_default().insert(b, ok);
        }
    }
    Ok(out)
}

/// The matrix as a grid: rows are sources, columns destinations.
pub fn render_matrix(m: &BTreeMap<String, BTreeMap<String, bool>>, colour: bool) -> String {
    let cols: Vec<&String> = m
        .values()
        .next()
        .map(|r| r.keys().collect())
        .unwrap_or_default();
    let mut s = String::from("from\\to ");
    for c in &cols {
        s.push_str(&format!("{c:>5}"));
    }
    s.push('\n');
    for (row, cells) in m {
        s.push_str(&format!("{row:<8}"));
        for c in &cols {
            let ok = cells.get(*c).copied().unwrap_or(false);
            let mark = match (ok, colour) {
                (true, true) => "\x1b[32m    .\x1b[0m".to_string(),
                (false, true) => "\x1b[31m    X\x1b[0m".to_string(),
                (true, false) => "    .".to_string(),
                (false, false) => "    X".to_string(),
            };
            s.push_str(&mark);
        }
        s.push('\n');
    }
    s.push_str("(. reached, X blocked)\n");
    s
}

fn matrix_cmd(
    which: &Which,
    port: u16,
    protocol: &str,
    timeout_ms: u64,
    output: &str,
    out: &mut dyn Write,
) -> Result<u8, LabError> {
    let st = load(which)?;
    let m = matrix(&st, port, udp_flag(protocol)?, timeout_ms)?;
    match output {
        "json" => {
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&m).unwrap_or_default()
            );
        }
        "table" => {
            let _ = writeln!(out, "{protocol}/{port}:");
            let _ = write!(
                out,
                "{}",
                render_matrix(&m, std::io::stdout().is_terminal())
            );
        }
        other_o => return Err(other(format!("-o {other_o:?}: use table or json"))),
    }
    Ok(0)
}

/// Throughput (Gbit/s) and connection rate (per second) from one namespace to an address.
fn measure(client_ns: &str, server_ns: &str, to: &str, secs: u64) -> Result<(f64, f64), LabError> {
    let exe = exe()?;
    let mut server = net::in_netns(server_ns, "iperf3")
        .args(["-s", "-p", "5299", "-1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| other(format!("iperf3 (install it: apt-get install iperf3): {e}")))?;
    std::thread::sleep(Duration::from_millis(300));
    let result = net::run(net::in_netns(client_ns, "iperf3").args([
        "-c",
        to,
        "-p",
        "5299",
        "-t",
        &secs.to_string(),
        "-J",
    ]));
    let _ = server.kill();
    let _ = server.wait();
    let json: Value =
        serde_json::from_str(&result?).map_err(|e| other(format!("iperf3 output: {e}")))?;
    let gbps = json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e9;
    let mut acceptor = net::in_netns(server_ns, &exe)
        .args(["lab", "serve", "--name", "bench", "--tcp", "5300"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| other(format!("bench server: {e}")))?;
    // Each connection leaves a socket in TIME_WAIT on the client for 60 s: with the default
    // port range a few seconds of connecting use up the ports, and the next run would measure
    // port exhaustion instead of the datapath. Both settings are per namespace (the client's).
    net::sysctl(client_ns, "net.ipv4.ip_local_port_range", "1024 65535")?;
    net::sysctl(client_ns, "net.ipv4.tcp_tw_reuse", "1")?;
    std::thread::sleep(Duration::from_millis(300));
    let counted = net::run(net::in_netns(client_ns, &exe).args([
        "lab",
        "connect",
        "--to",
        to,
        "--port",
        "5300",
        "--timeout-ms",
        "500",
        "--loop-secs",
        &secs.to_string(),
    ]));
    let _ = acceptor.kill();
    let _ = acceptor.wait();
    let conns: f64 = counted?.trim().parse().unwrap_or(0.0);
    Ok((gbps, conns / secs as f64))
}

fn bench(which: &Which, secs: u64, policies: usize, out: &mut dyn Write) -> Result<u8, LabError> {
    let st = load(which)?;
    // Client and server on different nodes when there are two.
    let client = st
        .pods
        .first()
        .ok_or_else(|| other("the lab has no pods"))?;
    let server = st
        .pods
        .iter()
        .find(|p| p.node != client.node)
        .or_else(|| st.pods.get(1))
        .ok_or_else(|| other("the bench needs two pods"))?;
    let server_ip = server
        .ip
        .clone()
        .ok_or_else(|| other("the server pod has no address"))?;
    let mut rows = Vec::new();
    // Baseline: two throw-away namespaces joined by a bare veth pair.
    let a = format!("{}bench-a", st.prefix);
    let b = format!("{}bench-b", st.prefix);
    net::add_netns(&a)?;
    net::add_netns(&b)?;
    let baseline = (|| {
        net::ip(
            &a,
            &[
                "link", "add", "veth0", "type", "veth", "peer", "name", "veth0", "netns", &b,
            ],
        )?;
        net::ip(&a, &["addr", "add", "192.0.2.1/24", "dev", "veth0"])?;
        net::ip(&b, &["addr", "add", "192.0.2.2/24", "dev", "veth0"])?;
        net::ip(&a, &["link", "set", "veth0", "up"])?;
        net::ip(&b, &["link", "set", "veth0", "up"])?;
        measure(&a, &b, "192.0.2.2", secs)
    })();
    net::remove_netns(&[a, b]);
    rows.push(("bare veth pair (no margay)".to_string(), baseline?));
    rows.push((
        format!(
            "{} -> {} (other node, VXLAN), no policy",
            client.id, server.id
        ),
        measure(&client.netns, &server.netns, &server_ip, secs)?,
    ));
    // With policy: many policies on the server pod, the one allowing the traffic last.
    let (ns, pod) = server.id.split_once('/').unwrap_or(("", ""));
    let mut yaml = String::new();
    for i in 0..policies {
        yaml.push_str(&format!(
            "---\napiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata: {{name: bench-{i}, namespace: {ns}}}\nspec:\n  order: {i}\n  selector: pod == '{pod}'\n  ingress:\n  - action: Allow\n    protocol: TCP\n    source: {{selector: pod == 'nobody-{i}'}}\n    destination: {{ports: [{}]}}\n",
            10000 + i
        ));
    }
    yaml.push_str(&format!(
        "---\napiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata: {{name: bench-allow, namespace: {ns}}}\nspec:\n  order: {policies}\n  selector: pod == '{pod}'\n  ingress: [{{action: Allow}}]\n"
    ));
    apply_yaml(&st, &yaml)?;
    std::thread::sleep(Duration::from_secs(2));
    let with = measure(&client.netns, &server.netns, &server_ip, secs);
    // Remove the bench policies again.
    let file = st.dir.join("bench-policies.yaml");
    let _ = std::fs::write(&file, &yaml);
    if let Ok(mut c) = margay_in(&st, &st.fabric_netns()) {
        c.args(["ctl", "delete", "-f"]).arg(&file);
        let _ = net::run(&mut c);
    }
    let _ = std::fs::remove_file(&file);
    rows.push((
        format!("same, with {} policies on {}", policies + 1, server.id),
        with?,
    ));
    let _ = writeln!(
        out,
        "{:<58} {:>10} {:>14}",
        "PATH", "TCP Gbit/s", "connections/s"
    );
    let base = rows[0].1;
    for (label, (gbps, rate)) in &rows {
        let _ = writeln!(
            out,
            "{label:<58} {gbps:>10.2} {rate:>14.0}   ({:.0}% / {:.0}% of the bare veth)",
            100.0 * gbps / base.0.max(f64::MIN_POSITIVE),
            100.0 * rate / base.1.max(f64::MIN_POSITIVE)
        );
    }
    Ok(0)
}

fn exec_cmd(which: &Which, pod: &str, command: &[String]) -> Result<u8, LabError> {
    let st = load(which)?;
    let p = st
        .pod(pod)
        .ok_or_else(|| other(format!("no pod {pod:?} (pods: {:?})", pod_ids(&st))))?;
    let Some((prog, args)) = command.split_first() else {
        return Err(other("exec: give a command after --"));
    };
    let status = net::in_netns(&p.netns, prog)
        .args(args)
        .status()
        .map_err(|e| other(format!("exec in {pod}: {e}")))?;
    Ok(status.code().map_or(1, |c| u8::try_from(c).unwrap_or(1)))
}

fn kubeconfig_cmd(which: &Which, content: bool, out: &mut dyn Write) -> Result<u8, LabError> {
    let st = load(which)?;
    if !st.is_kubernetes() {
        return Err(other(format!(
            "lab {:?} runs on the {} datastore; only `margay lab up --datastore kubernetes` has a Kubernetes API",
            st.name, st.datastore
        )));
    }
    let path = st.kubeconfig();
    if content {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| other(format!("{}: {e}", path.display())))?;
        let _ = write!(out, "{text}");
    } else {
        let _ = writeln!(out, "{}", path.display());
    }
    Ok(0)
}

fn kubectl_cmd(which: &Which, args: &[String]) -> Result<u8, LabError> {
    let st = load(which)?;
    if !st.is_kubernetes() {
        return Err(other(format!(
            "lab {:?} runs on the {} datastore; kubectl needs `margay lab up --datastore kubernetes`",
            st.name, st.datastore
        )));
    }
    let status = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(st.kubeconfig())
        .args(args)
        .status()
        .map_err(|e| other(format!("kubectl (is it installed?): {e}")))?;
    Ok(status.code().map_or(1, |c| u8::try_from(c).unwrap_or(1)))
}

fn ctl_cmd(which: &Which, args: &[String]) -> Result<u8, LabError> {
    let st = load(which)?;
    let status = margay_in(&st, &st.fabric_netns())?
        .arg("ctl")
        .args(args)
        .status()
        .map_err(|e| other(format!("margay ctl: {e}")))?;
    Ok(status.code().map_or(1, |c| u8::try_from(c).unwrap_or(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_renders_a_grid() {
        let m = BTreeMap::from([
            (
                "x/a".to_string(),
                BTreeMap::from([("x/a".to_string(), true), ("x/b".to_string(), false)]),
            ),
            (
                "x/b".to_string(),
                BTreeMap::from([("x/a".to_string(), true), ("x/b".to_string(), true)]),
            ),
        ]);
        let text = render_matrix(&m, false);
        assert!(text.contains("x/a         .    X"), "{text}");
        assert!(text.contains("x/b         .    ."), "{text}");
    }
}
