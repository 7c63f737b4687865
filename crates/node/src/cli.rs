//! The `margay node` command line.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use margay_datastore::{Client, DatastoreConfig};

use crate::autodetect::NetView;
use crate::config::StartupConfig;
use crate::health::{HealthChecks, HealthOptions, check};
use crate::kubernetes::{KubeCluster, k8s_node_name, kubernetes_api_configured_here};
use crate::startup::{
    ClusterSource, NetSnapshot, Paths, StartupOptions, kernel_hostname, node_name, run_in_cluster,
};

#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(subcommand)]
    pub command: NodeCommand,
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Register this node (calico-node -startup): name, addresses, AS number, default IP
    /// pools and default cluster configuration.
    ///
    /// Driven by calico-node's environment variables: NODENAME, HOSTNAME,
    /// CALICO_NODENAME_FILE, IP, IP6, IP_AUTODETECTION_METHOD, IP6_AUTODETECTION_METHOD, AS,
    /// CALICO_NETWORKING_BACKEND, CALICO_K8S_NODE_REF, DISABLE_NODE_IP_CHECK,
    /// WAIT_FOR_DATASTORE, CALICO_IPV4POOL_* / CALICO_IPV6POOL_*, NO_DEFAULT_POOLS,
    /// CLUSTER_TYPE, CALICO_DISABLE_FILE_LOGGING, CALICO_STARTUP_LOGLEVEL, and the datastore
    /// variables (DATASTORE_TYPE, DATASTORE_PATH, ETCD_ENDPOINTS, ...). Exits 0 when the node
    /// is registered, 1 with one line saying what to fix otherwise.
    ///
    /// In a Kubernetes cluster (the Kubernetes datastore; or etcd with KUBECONFIG set or in a
    /// pod, as calico-node decides; never the local store) it also reads kube-system's ConfigMaps
    /// kubeadm-config (its podSubnet becomes the default pools' CIDRs when
    /// CALICO_IPV4POOL_CIDR / CALICO_IPV6POOL_CIDR are unset) and full-cluster-state (Rancher),
    /// both recorded in ClusterInformation's clusterType, and the Kubernetes Node
    /// (CALICO_K8S_NODE_REF, else the node name), which must exist and whose InternalIP
    /// kubernetes-internal-ip autodetection uses. A ConfigMap that is missing or may not be
    /// read is simply absent; any other failure stops start-up.
    #[command(after_help = "Examples:
  # Register with an autodetected address reaching the cluster's gateway.
  IP_AUTODETECTION_METHOD=can-reach=10.0.0.1 margay node startup

  # A fixed address and AS number, VXLAN pools.
  IP=10.0.0.5/24 AS=64512 CALICO_IPV4POOL_VXLAN=Always margay node startup")]
    Startup(StartupArgs),
    /// Allocate this node's VXLAN tunnel addresses from IPAM and record them on its Node
    /// (calico-node -allocate-tunnel-addrs, one shot).
    ///
    /// With an IP pool using VXLAN (vxlanMode Always or CrossSubnet) the node gets an address
    /// from it (IPAM handle vxlan-tunnel-addr-<node>), kept on later runs; with none, the
    /// address is released. Start-up runs this step too. The node name comes from NODENAME,
    /// the node name file or the hostname, as for start-up; the datastore from the usual
    /// variables. Exits 0 when done, 1 with what to fix otherwise.
    #[command(after_help = "Example:
  NODENAME=node-1 DATASTORE_TYPE=etcdv3 ETCD_ENDPOINTS=http://10.0.0.1:2379 \\
    margay node allocate-tunnel-addrs")]
    AllocateTunnelAddrs(AllocateArgs),
    /// Check the node's health for Kubernetes probes (calico-node -felix-live -felix-ready
    /// -bird-live -bird-ready).
    ///
    /// Felix: its health endpoint (FELIX_HEALTHHOST:FELIX_HEALTHPORT, default
    /// localhost:9099). BIRD: its control socket (`show status`, `show protocols`); a
    /// session that is down is reported with BIRD's reason, and when this node's BGP address
    /// (Node spec.bgp.ipv4Address) is on none of its interfaces, that is said too. Exits 0
    /// when every requested check passes, 1 with the reason otherwise. Calico's single-dash
    /// spellings (-felix-live, -bird-ready, -threshold-time) are accepted too.
    Health(HealthArgs),
    /// Keep the Kubernetes Node's NetworkUnavailable condition (calico-node -complete-startup
    /// and -shutdown): clear it once this node's networking is ready, set it on SIGTERM.
    ///
    /// Runs until SIGTERM (or SIGINT), beside Felix. It waits until Felix is ready (when
    /// FELIX_HEALTHENABLED=true; FELIX_HEALTHHOST / FELIX_HEALTHPORT say where, as for
    /// `margay node health`) and BIRD is (CALICO_NETWORKING_BACKEND=bird, the default; BIRD6
    /// too when IP6 is set), or until --ready-timeout passes, then sets NetworkUnavailable to
    /// False (reason CalicoIsUp) on the Kubernetes Node (CALICO_K8S_NODE_REF, else the node
    /// name from NODENAME, the node name file or the hostname), retrying for 30 s. On SIGTERM
    /// it sets it to True (CalicoIsDown) and exits 0. With CALICO_NETWORKING_BACKEND=none, or
    /// without a Kubernetes API (the Kubernetes datastore; etcd with KUBECONFIG or in a pod),
    /// it writes nothing and only waits for SIGTERM. Exits 1 with the reason when
    /// the condition cannot be written (the kubelet then restarts it).
    #[command(after_help = "Example (a container of the margay-node DaemonSet):
  DATASTORE_TYPE=kubernetes NODENAME=node-1 CALICO_NETWORKING_BACKEND=vxlan \\
    FELIX_HEALTHENABLED=true margay node network-condition")]
    NetworkCondition(ConditionArgs),
}

#[derive(Debug, Args)]
pub struct StartupArgs {
    /// Directory under which calico-node's default paths (/var/lib/calico, /var/run/calico,
    /// /var/log/calico, the node name file) are used.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// With WAIT_FOR_DATASTORE=true, give up after this many seconds (default: wait forever).
    #[arg(long, value_name = "SECONDS")]
    pub wait_timeout: Option<u64>,
}

#[derive(Debug, Args)]
pub struct AllocateArgs {
    /// Directory under which calico-node's default paths (the node name file) are used.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
}

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// Felix is alive.
    #[arg(long)]
    pub felix_live: bool,
    /// Felix is ready (in sync and programming the dataplane).
    #[arg(long)]
    pub felix_ready: bool,
    /// BIRD (IPv4) answers on its control socket.
    #[arg(long)]
    pub bird_live: bool,
    /// BIRD (IPv4) has its BGP sessions up: all of them during the threshold after
    /// start-up, at least one afterwards (calico-node's rule; no peers counts as ready).
    #[arg(long, visible_alias = "bird")]
    pub bird_ready: bool,
    /// BIRD (IPv6) answers on its control socket.
    #[arg(long)]
    pub bird6_live: bool,
    /// BIRD (IPv6) has its BGP sessions up (as --bird-ready).
    #[arg(long, visible_alias = "bird6")]
    pub bird6_ready: bool,
    /// How long after start-up every BGP peer must be Established: seconds or a duration
    /// (`30`, `30s`, `1m`).
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub threshold_time: String,
    /// BIRD's control socket (default /var/run/calico/bird.ctl, else /var/run/bird/bird.ctl).
    #[arg(long, value_name = "PATH", env = "MARGAY_BIRD_SOCKET")]
    pub bird_socket: Option<PathBuf>,
    /// BIRD6's control socket (default /var/run/calico/bird6.ctl).
    #[arg(long, value_name = "PATH", env = "MARGAY_BIRD6_SOCKET")]
    pub bird6_socket: Option<PathBuf>,
    /// Directory under which the node name file (/var/lib/calico/nodename, whose time
    /// marks start-up) is found, as for `margay node startup --root`.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
}

#[derive(Debug, Args)]
pub struct ConditionArgs {
    /// How long to wait for Felix and BIRD to be ready before clearing NetworkUnavailable
    /// anyway: seconds or a duration (`300`, `5m`).
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub ready_timeout: String,
    /// BIRD's control socket (default /var/run/calico/bird.ctl, else /var/run/bird/bird.ctl).
    #[arg(long, value_name = "PATH", env = "MARGAY_BIRD_SOCKET")]
    pub bird_socket: Option<PathBuf>,
    /// BIRD6's control socket (default /var/run/calico/bird6.ctl).
    #[arg(long, value_name = "PATH", env = "MARGAY_BIRD6_SOCKET")]
    pub bird6_socket: Option<PathBuf>,
    /// Directory under which the node name file (/var/lib/calico/nodename) is found, as for
    /// `margay node startup --root`.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
}

/// `30`, `30s`, `500ms`, `2m` (calico-node takes a Go duration).
fn parse_threshold(s: &str) -> Result<Duration, String> {
    parse_duration("--threshold-time", s)
}

fn parse_duration(flag: &str, s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let bad = || format!("{flag} {s:?}: give seconds or a duration such as 30s, 500ms, 2m");
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

/// Rewrites calico-node's single-dash long flags (`-felix-live`) to `--felix-live`.
pub fn normalize_health_args(args: &mut [std::ffi::OsString]) {
    for a in args.iter_mut() {
        if let Some(s) = a.to_str()
            && s.len() > 2
            && s.starts_with('-')
            && !s.starts_with("--")
        {
            *a = format!("-{s}").into();
        }
    }
}

/// One environment variable; a value that is not UTF-8 is ignored with a warning naming the
/// variable (as if unset), never a panic or a silent surprise.
pub fn env_var(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => {
            tracing::warn!(
                variable = name,
                "ignoring environment variable: its value is not UTF-8 (set it to UTF-8 text or unset it)"
            );
            None
        }
    }
}

pub fn run_node(args: NodeArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let get = env_var;
    let result = match args.command {
        NodeCommand::Startup(a) => startup(&a, &get, out),
        NodeCommand::AllocateTunnelAddrs(a) => allocate_tunnel_addrs(&a, &get, out),
        NodeCommand::NetworkCondition(a) => network_condition(&a, &get),
        NodeCommand::Health(a) => {
            let checks = HealthChecks {
                felix_live: a.felix_live,
                felix_ready: a.felix_ready,
                bird_live: a.bird_live,
                bird_ready: a.bird_ready,
                bird6_live: a.bird6_live,
                bird6_ready: a.bird6_ready,
            };
            health_options(&a, &get).and_then(|opts| {
                check(checks, &opts, &get)
                    .and_then(|ok| writeln!(out, "{ok}").map_err(|e| e.to_string()))
            })
        }
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            1
        }
    }
}

fn health_options(
    a: &HealthArgs,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<HealthOptions, String> {
    let nodename_file = match get("CALICO_NODENAME_FILE").filter(|f| !f.is_empty()) {
        Some(f) => PathBuf::from(f),
        None => a
            .root
            .join(crate::config::DEFAULT_NODENAME_FILE.trim_start_matches('/')),
    };
    Ok(HealthOptions {
        bird_socket: a
            .bird_socket
            .clone()
            .unwrap_or_else(|| margay_bird::default_socket(false)),
        bird6_socket: a
            .bird6_socket
            .clone()
            .unwrap_or_else(|| margay_bird::default_socket(true)),
        threshold: parse_threshold(&a.threshold_time)?,
        nodename_file,
    })
}

fn network_condition(
    a: &ConditionArgs,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<(), String> {
    use crate::condition::{
        ConditionOptions, DEFAULT_READY_TIMEOUT, SHUTDOWN_RETRY, plan, run as run_condition,
    };
    let cfg = StartupConfig::from_lookup(get).map_err(|e| e.to_string())?;
    let paths = Paths::new(&a.root);
    let (name, _) =
        node_name(get, &paths.nodename_file(&cfg), &kernel_hostname).map_err(|e| e.to_string())?;
    let k8s_node = k8s_node_name(&name, cfg.k8s_node_ref.as_deref()).to_string();
    let ds = DatastoreConfig::from_env().map_err(|e| format!("datastore configuration: {e}"))?;
    let ready_timeout = parse_duration("--ready-timeout", &a.ready_timeout)?;
    let plan = plan(cfg.backend, kubernetes_api_configured_here(&ds, get), get);
    let health = HealthOptions {
        bird_socket: a
            .bird_socket
            .clone()
            .unwrap_or_else(|| margay_bird::default_socket(false)),
        bird6_socket: a
            .bird6_socket
            .clone()
            .unwrap_or_else(|| margay_bird::default_socket(true)),
        // calico-node's wait gives BGP sessions this long to come up, all of them.
        threshold: DEFAULT_READY_TIMEOUT,
        nodename_file: paths.nodename_file(&cfg),
    };
    tracing::info!(node = %k8s_node, "the Kubernetes Node's NetworkUnavailable condition: {plan}");
    let opts = ConditionOptions {
        k8s_node,
        plan,
        health,
        ready_timeout,
        clear_retry: crate::kubernetes::CLEAR_RETRY,
        shutdown_retry: SHUTDOWN_RETRY,
        env: std::sync::Arc::new(env_var),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())
            .map_err(|e| format!("cannot listen for SIGTERM: {e}"))?;
        let mut int = signal(SignalKind::interrupt())
            .map_err(|e| format!("cannot listen for SIGINT: {e}"))?;
        let stop = async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM"),
                _ = int.recv() => tracing::info!("SIGINT"),
            }
        };
        let api = match &opts.plan {
            crate::condition::Plan::Manage(_) => KubeCluster::connect(&ds, None, get)
                .await
                .map_err(|e| e.to_string())?,
            crate::condition::Plan::Idle(_) => None,
        };
        run_condition(opts, api, stop)
            .await
            .map_err(|e| e.to_string())
    })
}

fn startup(
    a: &StartupArgs,
    get: &dyn Fn(&str) -> Option<String>,
    out: &mut dyn Write,
) -> Result<(), String> {
    let started = Instant::now();
    let cfg = StartupConfig::from_lookup(get).map_err(|e| e.to_string())?;
    let paths = Paths::new(&a.root);
    let (name, source) =
        node_name(get, &paths.nodename_file(&cfg), &kernel_hostname).map_err(|e| e.to_string())?;
    tracing::info!(node = %name, source = ?source, "determined the node name");
    // One snapshot of the interfaces for the whole run (netlink is read synchronously).
    let interfaces = crate::system_net::SystemNet
        .interfaces()
        .map_err(|e| format!("cannot list the host's interfaces through netlink: {e}"))?;
    let net = NetSnapshot { interfaces };
    let ds = DatastoreConfig::from_env().map_err(|e| format!("datastore configuration: {e}"))?;
    let opts = StartupOptions {
        version: env!("CARGO_PKG_VERSION").to_string(),
        wait_timeout: a.wait_timeout.map(Duration::from_secs),
        kernel_has_ipv6: std::path::Path::new("/proc/sys/net/ipv6").exists(),
        kubernetes_datastore: ds.datastore_type == margay_datastore::DatastoreType::Kubernetes,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let outcome = rt.block_on(async {
        let backend = ds
            .connect()
            .await
            .map_err(|e| format!("{} ({})", e, ds.describe()))?;
        let cluster = KubeCluster::connect(&ds, Some(&backend), get)
            .await
            .map_err(|e| e.to_string())?;
        let source = match &cluster {
            Some(c) => ClusterSource::Api(c),
            None => ClusterSource::None,
        };
        let client = Client::new(backend);
        run_in_cluster(&cfg, &name, &client, &net, &paths, &opts, source)
            .await
            .map_err(|e| e.to_string())
    })?;
    let addr = |a: &Option<String>| a.clone().unwrap_or_else(|| "-".into());
    let tunnel = match (outcome.tunnel.ipv4, outcome.tunnel.ipv6) {
        (None, None) => String::new(),
        (v4, v6) => format!("; VXLAN tunnel {}", tunnel_addrs(v4, v6)),
    };
    writeln!(
        out,
        "node {:?} registered in {} ms: IPv4 {}, IPv6 {}, node {}{}{tunnel}",
        outcome.node_name,
        started.elapsed().as_millis(),
        addr(&outcome.ipv4),
        addr(&outcome.ipv6),
        if outcome.node_written {
            "written"
        } else {
            "unchanged"
        },
        if outcome.created.is_empty() {
            String::new()
        } else {
            format!("; created {}", outcome.created.join(", "))
        }
    )
    .map_err(|e| e.to_string())
}

fn tunnel_addrs(v4: Option<std::net::IpAddr>, v6: Option<std::net::IpAddr>) -> String {
    let show = |a: Option<std::net::IpAddr>| a.map_or_else(|| "-".to_string(), |a| a.to_string());
    format!("IPv4 {}, IPv6 {}", show(v4), show(v6))
}

fn allocate_tunnel_addrs(
    a: &AllocateArgs,
    get: &dyn Fn(&str) -> Option<String>,
    out: &mut dyn Write,
) -> Result<(), String> {
    let cfg = StartupConfig::from_lookup(get).map_err(|e| e.to_string())?;
    let paths = Paths::new(&a.root);
    let (name, _) =
        node_name(get, &paths.nodename_file(&cfg), &kernel_hostname).map_err(|e| e.to_string())?;
    let ds = DatastoreConfig::from_env().map_err(|e| format!("datastore configuration: {e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let outcome = rt.block_on(async {
        let backend = ds
            .connect()
            .await
            .map_err(|e| format!("{} ({})", e, ds.describe()))?;
        let client = Client::new(backend.clone());
        let ipam = margay_ipam::Ipam::new(backend);
        crate::tunnel::allocate_tunnel_addrs(&client, &ipam, &name)
            .await
            .map_err(|e| e.to_string())
    })?;
    let mut what = Vec::new();
    if !outcome.assigned.is_empty() {
        what.push(format!("assigned {:?}", outcome.assigned));
    }
    if !outcome.released.is_empty() {
        what.push(format!("released {:?}", outcome.released));
    }
    writeln!(
        out,
        "node {name:?}: VXLAN tunnel {}; node {}{}",
        tunnel_addrs(outcome.ipv4, outcome.ipv6),
        if outcome.node_written {
            "written"
        } else {
            "unchanged"
        },
        if what.is_empty() {
            String::new()
        } else {
            format!(" ({})", what.join(", "))
        }
    )
    .map_err(|e| e.to_string())
}
