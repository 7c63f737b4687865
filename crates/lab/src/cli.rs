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
use crate::state::{FABRIC_PREFIX, FABRIC_PREFIX_V6, LabState, POD_CIDR, POD_CIDR_V6, check_name};
use crate::topology::{Topology, default_topology};

// One module per command group; this file keeps the arguments and the dispatch.
mod down;
mod exec;
mod pods;
mod probe;
mod roles;
mod status;
mod up;
use down::*;
use exec::*;
pub(crate) use pods::*;
pub use probe::*;
pub(crate) use roles::*;
pub use status::*;
use up::*;

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
        /// Felix's dataplane on every node: linux (nftables, the default) or bpf (the eBPF
        /// dataplane: BPFEnabled=true).
        #[arg(long, env = "MARGAY_LAB_DATAPLANE", default_value = "linux")]
        dataplane: String,
        /// With --backend bird: add a top-of-rack router (namespace mgy-<lab>-tor at
        /// 172.30.0.2 running BIRD with its own AS) that every node peers with.
        #[arg(long)]
        tor: bool,
        /// The ToR's AS number.
        #[arg(long, default_value_t = 65000)]
        tor_as: u32,
        /// Dual-stack: IPv6 on the fabric (fd00:172:30::/64), every node detecting its IPv6
        /// address (IP6=autodetect), an IPv6 pool (fd00:10:244::/64) beside the IPv4 one, and
        /// pods with one address of each family (CNI `assign_ipv6`). Probe IPv6 with
        /// `probe --family 6` / `matrix --family 6`.
        #[arg(long)]
        ipv6: bool,
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
        /// `namespace/pod`, or `node/<name>` (from the node's own namespace)
        from: String,
        /// `namespace/pod`, `svc/<namespace>/<name>[:port]` (the Service's ClusterIP; the
        /// port by number or name, else its first), `node/<name>` (the node's address) or an
        /// IP address (e.g. a LoadBalancer's)
        to: String,
        #[arg(long, default_value_t = 80)]
        port: u16,
        #[arg(long, default_value = "tcp")]
        protocol: String,
        #[arg(long, default_value_t = 1000)]
        timeout_ms: u64,
        /// Print the server's answer: the pod that answered and the client address it saw.
        #[arg(long)]
        show: bool,
        /// 4, or 6: reach a pod or node at its IPv6 address (a lab made with `up --ipv6`).
        #[arg(long, default_value_t = 4)]
        family: u8,
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
        /// After the grid, list each blocked cell with the rule that denied it (from the
        /// nodes' flow logs).
        #[arg(long)]
        explain: bool,
        /// Also probe these Services from every pod (`svc/<namespace>/<name>[:port]`; columns
        /// after the pods').
        #[arg(long = "service")]
        services: Vec<String>,
        /// 4, or 6: probe the pods' IPv6 addresses (a lab made with `up --ipv6`).
        #[arg(long, default_value_t = 4)]
        family: u8,
    },
    /// Every node's recent flows, merged by time: who connected to whom and which rule
    /// decided (each node's `margay flows`).
    Flows {
        #[command(flatten)]
        which: Which,
        /// Only denied connections.
        #[arg(long)]
        denied: bool,
        /// Only flows with an end in this namespace.
        #[arg(short, long, value_name = "NS")]
        namespace: Option<String>,
        /// Only flows to or from pods whose name starts with this (`[namespace/]name`).
        #[arg(long, value_name = "[NS/]POD")]
        pod: Option<String>,
        /// Only flows decided by a policy or profile whose name contains this.
        #[arg(long, value_name = "NAME")]
        policy: Option<String>,
        /// Recent flows per node.
        #[arg(long, value_name = "N", default_value_t = 100)]
        last: usize,
        /// table or json (one object per line)
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
        /// Then keep printing every node's new flows as they come (until interrupted, or
        /// --until-seconds).
        #[arg(short, long)]
        follow: bool,
        /// With --follow: stop after this many seconds.
        #[arg(long, value_name = "SECONDS", requires = "follow")]
        until_seconds: Option<u64>,
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
        /// 4, or 6: measure between the pods' IPv6 addresses (a lab made with `up --ipv6`).
        #[arg(long, default_value_t = 4)]
        family: u8,
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
        /// Print the server's answer (`lab serve`: the pod's name and the client address it saw).
        #[arg(long)]
        show: bool,
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
            dataplane,
            tor,
            tor_as,
            ipv6,
        } => up(
            &which,
            file.as_deref(),
            nodes,
            &datastore,
            &Networking {
                backend: &backend,
                dataplane: &dataplane,
                tor: tor.then_some(tor_as),
                ipv6,
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
            show,
            family,
        } => probe_cmd(
            &which, &from, &to, port, &protocol, timeout_ms, show, family, out,
        ),
        LabCommand::Matrix {
            which,
            port,
            protocol,
            timeout_ms,
            output,
            explain,
            services,
            family,
        } => matrix_cmd(
            &which, port, &protocol, timeout_ms, &output, explain, &services, family, out,
        ),
        LabCommand::Flows {
            which,
            denied,
            namespace,
            pod,
            policy,
            last,
            output,
            follow,
            until_seconds,
        } => flows_cmd(
            &which,
            &FlowFilter {
                denied,
                namespace,
                pod,
                policy,
                last,
                follow,
                until_seconds,
            },
            &output,
            out,
        ),
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
            ..
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
            show,
        } => Ok(
            match net::connect_reply(to, port, udp, Duration::from_millis(timeout_ms)) {
                Some(reply) => {
                    if show {
                        let _ = writeln!(out, "{reply}");
                    }
                    0
                }
                None => 1,
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
            family,
        } => bench(&which, secs, policies, family, out),
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
