//! `lab up`: the fabric, the datastore, the nodes and their roles, the pods, in that order.

use super::*;

/// How nodes reach each other: the backend and, for BGP, an optional ToR's AS number.
pub(super) struct Networking<'a> {
    pub(super) backend: &'a str,
    /// Felix's dataplane: `linux` or `bpf`.
    pub(super) dataplane: &'a str,
    pub(super) tor: Option<u32>,
    /// `--ipv6`: dual-stack.
    pub(super) ipv6: bool,
}

pub(super) fn up(
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
    if !matches!(networking.dataplane, "linux" | "bpf") {
        return Err(other(format!(
            "--dataplane {:?}: use linux (nftables) or bpf (the eBPF dataplane)",
            networking.dataplane
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
    if networking.dataplane == "bpf" {
        st.dataplane = "bpf".into();
    }
    if networking.ipv6 {
        if networking.dataplane == "bpf" {
            // margay's eBPF dataplane drops IPv6 (see ARCHITECTURE.md): a dual-stack lab on it
            // would only show that.
            return Err(other(
                "--ipv6 needs --dataplane linux (the eBPF dataplane does not carry IPv6)",
            ));
        }
        st = st.with_ipv6();
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
                "lab {:?} is up in {:.1} s: {} nodes, {} pods ({} datastore, {} backend{}{}{})",
                st.name,
                started.elapsed().as_secs_f64(),
                st.nodes.len(),
                st.pods.len(),
                st.datastore,
                st.backend,
                if st.tor.is_some() { ", ToR" } else { "" },
                if st.ipv6 { ", dual-stack" } else { "" },
                if st.dataplane == "bpf" {
                    ", eBPF dataplane"
                } else {
                    ""
                }
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

pub(super) fn build(
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
    if st.ipv6 {
        // nodad: the address is usable at once (a fresh namespace would run DAD first).
        net::ip(
            &fabric,
            &[
                "addr",
                "add",
                &format!("{FABRIC_PREFIX_V6}1/64"),
                "dev",
                "br0",
                "nodad",
            ],
        )?;
    }
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
        if let Some(ip6) = &node.ip6 {
            net::ip(
                &node.netns,
                &["addr", "add", &format!("{ip6}/64"), "dev", "eth0", "nodad"],
            )?;
        }
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
        if node.ip6.is_some() {
            net::ip(
                &node.netns,
                &[
                    "-6",
                    "route",
                    "add",
                    "default",
                    "via",
                    &format!("{FABRIC_PREFIX_V6}1"),
                ],
            )?;
        }
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
        if let Some(ip6) = &tor.ip6 {
            net::ip(
                &tor.netns,
                &["addr", "add", &format!("{ip6}/64"), "dev", "eth0", "nodad"],
            )?;
            // The ToR is not margay's: the lab prepares it as its operator would.
            net::sysctl(&tor.netns, "net.ipv6.conf.all.forwarding", "1")?;
        }
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
