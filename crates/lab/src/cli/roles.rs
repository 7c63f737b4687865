//! The roles a lab node runs, each started under the lab's supervision: etcd or the API
//! server, kube-controllers, node start-up, Felix, network-condition, confd, BIRD and a ToR.

use super::*;

/// Starts `argv` under the lab's supervision (roles, pods' servers), with its pid file and log `<dir>/<name>.pid` and
/// `<dir>/<name>.log`; `restart`: started again whenever it exits.
pub(super) fn supervise(
    exe: &Path,
    dir: &Path,
    name: &str,
    restart: bool,
    env: &[(String, String)],
    argv: &[String],
) -> Result<(), LabError> {
    net::spawn_supervised(
        exe,
        &dir.join(format!("{name}.pid")),
        &dir.join(format!("{name}.log")),
        restart,
        env,
        argv,
    )
}

/// Starts the margay role `margay ARGS` in namespace `netns`, supervised and restarted, with
/// the datastore's environment plus `env` (PATH included: roles run `ip`, `nft`, BIRD's
/// client); pid file and log `<dir>/<name>.pid|.log`.
fn spawn_role(
    st: &LabState,
    exe: &Path,
    netns: &str,
    dir: &Path,
    name: &str,
    env: Vec<(String, String)>,
    args: Vec<String>,
) -> Result<(), LabError> {
    let mut all = st.datastore_env();
    all.extend(env);
    all.push(("PATH".into(), std::env::var("PATH").unwrap_or_default()));
    let argv: Vec<String> = ["ip", "netns", "exec", netns]
        .into_iter()
        .map(String::from)
        .chain(std::iter::once(exe.display().to_string()))
        .chain(args)
        .collect();
    supervise(exe, dir, name, true, &all, &argv)
}

/// The lab's etcd, in the fabric namespace; returns once it answers.
pub(super) fn start_etcd(st: &LabState, exe: &Path) -> Result<(), LabError> {
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
    supervise(exe, &dir, "etcd", true, &[], &argv)?;
    wait_datastore(st, "etcd did not come up within 30 s (see etcd/etcd.log)")
}

/// Waits (30 s at most) until `margay ctl` reaches the datastore from the fabric namespace.
pub(super) fn wait_datastore(st: &LabState, failure: &str) -> Result<(), LabError> {
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
pub(super) fn start_apiserver(st: &LabState, exe: &Path) -> Result<crate::kube::Api, LabError> {
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
    supervise(exe, &dir, "apiserver", false, &[], &argv)?;
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
pub(super) fn start_kube_controllers(st: &LabState, exe: &Path) -> Result<(), LabError> {
    let dir = st.dir.join("kube-controllers");
    std::fs::create_dir_all(&dir).map_err(|e| other(format!("{}: {e}", dir.display())))?;
    spawn_role(
        st,
        exe,
        &st.fabric_netns(),
        &dir,
        "kube-controllers",
        vec![("LOG_LEVEL".into(), "info".into())],
        vec![
            "kube-controllers".into(),
            "--status-file".into(),
            dir.join("status.json").display().to_string(),
        ],
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
    if st.ipv6 {
        // Dual-stack as an operator configures calico-node: IPv6 is detected only when asked
        // for, the pool's CIDR given (kubeadm's podSubnet is IPv4 only here).
        c.env("IP6", "autodetect")
            .env("IP6_AUTODETECTION_METHOD", "interface=eth0")
            .env("CALICO_IPV6POOL_CIDR", POD_CIDR_V6)
            .env(
                "CALICO_IPV6POOL_VXLAN",
                if bird { "Never" } else { "Always" },
            )
            .env("FELIX_IPV6SUPPORT", "true");
    } else {
        c.env("IP6", "none");
    }
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
    let env = vec![
        ("FELIX_FELIXHOSTNAME".to_string(), node.name.clone()),
        ("FELIX_HEALTHENABLED".into(), "true".into()),
        ("FELIX_LOGSEVERITYSCREEN".into(), "Info".into()),
        // Each node logs to its own file; the machine's syslog is not the lab's.
        ("FELIX_LOGSEVERITYSYS".into(), "none".into()),
        // The lab keeps each role's screen output in the node's directory (as calico-node's
        // felix.cfg sets LogFilePath=None and svlogd keeps the screen).
        ("FELIX_LOGFILEPATH".into(), "none".into()),
        // Flow logs on: `margay lab flows` and `lab matrix --explain` read them.
        ("FELIX_FLOWLOGSLOCALREPORTER".into(), "Enabled".into()),
        (
            "FELIX_ENDPOINTSTATUSPATHPREFIX".into(),
            dir.join("status").display().to_string(),
        ),
        ("MARGAY_DATAPLANE".into(), "linux".into()),
        (
            "FELIX_BPFENABLED".into(),
            (st.dataplane == "bpf").to_string(),
        ),
        // Each node's pod MTU (Calico's /var/lib/calico/mtu) in the node's directory.
        (
            "MARGAY_MTU_FILE".into(),
            dir.join("mtu").display().to_string(),
        ),
    ];
    let args = vec![
        "felix".into(),
        "run".into(),
        "--status-socket".into(),
        dir.join("felix.sock").display().to_string(),
    ];
    spawn_role(st, exe, &node.netns, &dir, "felix", env, args)
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
    let env = vec![
        ("NODENAME".to_string(), node.name.clone()),
        (
            "CALICO_NETWORKING_BACKEND".into(),
            if bird { "bird" } else { "vxlan" }.into(),
        ),
        ("FELIX_HEALTHENABLED".into(), "true".into()),
        ("MARGAY_LOG_LEVEL".into(), "info".into()),
    ];
    let mut args = vec![
        "node".into(),
        "network-condition".into(),
        "--root".into(),
        dir.join("root").display().to_string(),
    ];
    if bird {
        args.extend([
            "--bird-socket".into(),
            st.bird_socket(&node.name).display().to_string(),
        ]);
    }
    spawn_role(st, exe, &node.netns, &dir, "network-condition", env, args)
}

/// The ToR's BIRD (BGP backend with --tor) and the BGPPeer that makes every node peer with it.
pub(super) fn start_tor(
    st: &LabState,
    tor: &crate::state::TorState,
    exe: &Path,
) -> Result<(), LabError> {
    apply_yaml(st, &crate::bgp::tor_peer_yaml(tor))?;
    let dir = st.tor_dir();
    std::fs::create_dir_all(&dir).map_err(|e| other(format!("{}: {e}", dir.display())))?;
    let cfg = dir.join("bird.cfg");
    std::fs::write(&cfg, crate::bgp::tor_config(tor, &st.nodes))
        .map_err(|e| other(format!("{}: {e}", cfg.display())))?;
    supervise(exe, &dir, "bird", true, &[], &bird_argv(&tor.netns, &dir))?;
    if let Some(cfg6) = crate::bgp::tor_config6(tor, &st.nodes) {
        let file = dir.join("bird6.cfg");
        std::fs::write(&file, cfg6).map_err(|e| other(format!("{}: {e}", file.display())))?;
        supervise(
            exe,
            &dir,
            "bird6",
            true,
            &[],
            &bird_argv_named(&tor.netns, &dir, "bird6"),
        )?;
    }
    Ok(())
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
    let env = vec![("NODENAME".to_string(), node.name.clone())];
    let args = vec![
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
    spawn_role(st, exe, &node.netns, &dir, "confd", env, args)
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
    // Dual-stack: a second BIRD for IPv6 (bird6.cfg), as calico-node runs bird and bird6.
    let names: &[&str] = if st.ipv6 {
        &["bird", "bird6"]
    } else {
        &["bird"]
    };
    for name in names {
        let cfg = dir.join("confd").join(format!("{name}.cfg"));
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
        supervise(
            exe,
            &dir,
            name,
            true,
            &[],
            &bird_argv_named(&node.netns, &dir, name),
        )?;
    }
    Ok(())
}
