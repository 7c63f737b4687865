//! 5. The node's containers and Typha, run as deployed, within their RBAC.

use super::*;

/// One RBAC rule.
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
}

/// The rules bound to kube-system's ServiceAccount `sa` (cluster roles through cluster role
/// bindings, roles through role bindings).
fn rules_of(m: &Manifests, sa: &str) -> Vec<Rule> {
    let mut out = Vec::new();
    for b in m
        .docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
    {
        let bound = b["subjects"].as_array().unwrap().iter().any(|s| {
            s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == NAMESPACE
        });
        if !bound {
            continue;
        }
        let role = m.get(
            b["roleRef"]["kind"].as_str().unwrap(),
            b["roleRef"]["name"].as_str().unwrap(),
        );
        for r in role["rules"].as_array().unwrap() {
            out.push(Rule {
                groups: strings(&r["apiGroups"]),
                resources: strings(&r["resources"]),
                verbs: strings(&r["verbs"]),
            });
        }
    }
    assert!(!out.is_empty(), "nothing is bound to {sa}");
    out
}

/// Whether the rules allow a request the double counted. Its counters name no subresource or
/// namespace: a patch or update of `pods`/`nodes` is allowed by a grant on `<res>/status`
/// (margay writes those only through status), and a Role's grant counts for every namespace
/// (margay's only namespaced need, Typha's EndpointSlices, is in kube-system by construction).
fn allowed(rules: &[Rule], verb: &str, group: &str, resource: &str) -> bool {
    rules.iter().any(|r| {
        r.groups.iter().any(|g| g == group || g == "*")
            && r.verbs.iter().any(|v| v == verb || v == "*")
            && r.resources.iter().any(|res| {
                res == resource
                    || res == "*"
                    || (matches!(verb, "patch" | "update") && *res == format!("{resource}/status"))
            })
    })
}

/// The requests the double served since `before`: (verb, group, resource).
pub(crate) fn requests_since(
    api: &ApiServer,
    before: &BTreeMap<(String, String, String), u64>,
) -> BTreeSet<(String, String, String)> {
    api.stats()
        .requests
        .into_iter()
        .filter(|(k, n)| before.get(k).copied().unwrap_or(0) < *n)
        .map(|(k, _)| k)
        .collect()
}

/// Every request in `requests` is allowed to `sa`.
pub(crate) fn assert_within_rbac(
    m: &Manifests,
    sa: &str,
    what: &str,
    requests: &BTreeSet<(String, String, String)>,
) {
    let rules = rules_of(m, sa);
    let denied: Vec<String> = requests
        .iter()
        .filter(|(v, g, r)| !allowed(&rules, v, g, r))
        .map(|(v, g, r)| {
            format!(
                "{v} {}{r}",
                if g.is_empty() {
                    String::new()
                } else {
                    format!("{g}/")
                }
            )
        })
        .collect();
    assert!(
        denied.is_empty(),
        "{what} needs what deploy/rbac.yaml does not grant to {sa}: {denied:?}"
    );
    eprintln!(
        "{what} as {sa}: {} kinds of request, all granted: {:?}",
        requests.len(),
        requests
            .iter()
            .map(|(v, g, r)| format!("{v} {g}/{r}"))
            .collect::<Vec<_>>()
    );
}

/// A Kubernetes Node as the kubelet registers it: its InternalIP is 127.0.0.1, an address this
/// test host has (on lo), so start-up's kubernetes-internal-ip autodetection finds it.
fn k8s_node(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        "spec": {},
        "status": {"addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": name},
        ]},
    })
}

/// A container's command (margay's, or its script) with the manifest's environment (values
/// resolved) on an empty one, plus `extra` (what a pod gets from its surroundings: the
/// service account's credentials as KUBECONFIG, the kubelet's KUBERNETES_SERVICE_*, ports
/// free on this host).
pub(crate) fn container_command(
    m: &Manifests,
    c: &Container<'_>,
    home: &Path,
    extra: &[(&str, String)],
) -> Command {
    let argv = c.argv();
    let mut cmd = if is_margay(&argv) {
        let mut cmd = margay(home);
        cmd.args(&argv[1..]);
        cmd
    } else {
        let mut cmd = Command::new(&argv[0]);
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", home)
            .args(&argv[1..]);
        cmd
    };
    for (k, v) in c.env(m).unwrap() {
        cmd.env(k, v);
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd
}

/// Starts the DaemonSet's Felix container (with `extra` around it) and waits until the
/// DaemonSet's own liveness and readiness probes pass; `alive` checks what Felix depends on.
pub(crate) fn start_felix_until_probes_pass(
    m: &Manifests,
    felix_c: &Container<'_>,
    d: &Path,
    extra: &[(&str, String)],
    alive: &mut dyn FnMut(),
) -> Role {
    let mut c = container_command(m, felix_c, d, extra);
    c.arg("-c").arg(d.join("no-felix.cfg"));
    let mut felix = Role::spawn("felix", c, d.join("felix.log"));
    for (what, argv) in felix_c.probe_argvs() {
        wait_for(&format!("felix {what}: {argv:?}"), || {
            felix.assert_running();
            alive();
            let mut c = margay(d);
            c.args(&argv[1..]);
            for (k, v) in felix_c
                .env(m)
                .unwrap()
                .into_iter()
                .chain(extra.iter().map(|(k, v)| (k.to_string(), v.clone())))
            {
                c.env(k, v);
            }
            let o = roles::run_within(c, WAIT);
            if o.status.success() {
                Ok(())
            } else {
                let l = felix.log();
                Err(format!(
                    "{}\nfelix log tail: {}",
                    show(&o),
                    &l[l.len().saturating_sub(2000)..]
                ))
            }
        });
    }
    felix
}

pub(crate) fn container<'a>(m: &'a Manifests, at: &str) -> Container<'a> {
    containers(m)
        .into_iter()
        .find(|c| c.at == at)
        .unwrap_or_else(|| panic!("no container {at}"))
}

/// deploy/ installed in the double (CRDs first, as the loader orders them), and the cluster's
/// own objects: the node, a namespace with a pod on the node.
pub(crate) fn seed_cluster(api: &ApiServer, pod_ip: Option<&str>) {
    let s = api.store();
    for f in manifest_files(&deploy_dir())
        .iter()
        .filter(|f| f.parent() == Some(deploy_dir().as_path()))
    {
        s.load(&std::fs::read_to_string(f).unwrap()).unwrap();
    }
    s.create(NODES, "", k8s_node(NODE)).unwrap();
    s.create(
        NAMESPACES,
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
    )
    .unwrap();
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}},
           "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "web"}]}});
    if let Some(ip) = pod_ip {
        pod["status"] = json!({"podIP": ip, "podIPs": [{"ip": ip}]});
    }
    s.create(PODS, "shop", pod).unwrap();
}

/// Runs the DaemonSet's node-startup container (in `netns` when given) under `root`.
fn run_node_startup(
    m: &Manifests,
    api: &ApiServer,
    d: &Path,
    kubeconfig: &Path,
    netns: Option<&margay_testkit::netns::Netns>,
) -> PathBuf {
    let startup = container(m, "DaemonSet/margay-node initContainers[node-startup]");
    let root = d.join("root");
    let before = api.stats().requests;
    let mut c = container_command(
        m,
        &startup,
        d,
        &[("KUBECONFIG", kubeconfig.display().to_string())],
    );
    c.arg("--root").arg(&root);
    if let Some(ns) = netns {
        c = in_netns(ns, c);
    }
    let o = roles::run_within(c, WAIT);
    assert!(o.status.success(), "node start-up: {}", show(&o));
    assert_within_rbac(
        m,
        "margay-node",
        "node start-up",
        &requests_since(api, &before),
    );
    let nodename = root.join("var/lib/calico/nodename");
    assert_eq!(std::fs::read_to_string(&nodename).unwrap().trim(), NODE);
    nodename
}

/// The same command, inside a network namespace (`ip netns exec`).
fn in_netns(ns: &margay_testkit::netns::Netns, c: Command) -> Command {
    let mut n = ns.exec(c.get_program());
    n.args(c.get_args()).env_clear();
    for (k, v) in c.get_envs() {
        if let Some(v) = v {
            n.env(k, v);
        }
    }
    n
}

/// Runs the DaemonSet's install-cni-config script with what the kubelet gives it (the token
/// Secret — here the double's token and CA —, the ConfigMap's conflist, the API server's
/// address) and the host's /etc/cni/net.d as `d/net.d`; returns (the installed conflist, the
/// plugin's kubeconfig).
fn run_install_cni_config(m: &Manifests, api: &ApiServer, d: &Path) -> (String, PathBuf) {
    let install = container(
        m,
        "DaemonSet/margay-node initContainers[install-cni-config]",
    );
    let net_d = d.join("net.d");
    let token_dir = d.join("token");
    let cm_dir = d.join("cni-config");
    for p in [&net_d, &token_dir, &cm_dir] {
        std::fs::create_dir_all(p).unwrap();
    }
    std::fs::write(token_dir.join("token"), api.token()).unwrap();
    std::fs::write(token_dir.join("ca.crt"), api.ca_pem()).unwrap();
    let conflist_text = m
        .config_value("margay-config", "cni_network_config")
        .unwrap();
    std::fs::write(cm_dir.join("10-margay.conflist"), &conflist_text).unwrap();
    let c = container_command(
        m,
        &install,
        d,
        &[
            ("CNI_NET_DIR", net_d.display().to_string()),
            ("CNI_PLUGIN_TOKEN_DIR", token_dir.display().to_string()),
            (
                "CNI_NETWORK_CONFIG_FILE",
                cm_dir.join("10-margay.conflist").display().to_string(),
            ),
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".into()),
            ("KUBERNETES_SERVICE_PORT", api.addr().port().to_string()),
        ],
    );
    let o = roles::run_within(c, WAIT);
    assert!(o.status.success(), "install-cni-config: {}", show(&o));
    let installed = std::fs::read_to_string(net_d.join("10-margay.conflist")).unwrap();
    assert_eq!(installed, conflist_text);
    let kubeconfig = net_d.join("margay-kubeconfig");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&kubeconfig).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o077,
        0,
        "the plugin's kubeconfig holds a token: {mode:o}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&net_d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    (installed, kubeconfig)
}

/// The installed conflist's margay plugin as the runtime passes it (the list's name and
/// version added), with this host's paths: the kubeconfig, start-up's node name file, the log
/// and the IPAM lock in the temp dir.
fn plugin_conf(installed: &str, kubeconfig: &Path, nodename: &Path, d: &Path) -> Value {
    let list: Value = serde_json::from_str(installed).unwrap();
    let mut plugin = list["plugins"][0].clone();
    assert_eq!(
        plugin["kubernetes"]["kubeconfig"],
        "/etc/cni/net.d/margay-kubeconfig"
    );
    plugin["kubernetes"]["kubeconfig"] = json!(kubeconfig);
    plugin["name"] = list["name"].clone();
    plugin["cniVersion"] = list["cniVersion"].clone();
    plugin["nodename_file"] = json!(nodename);
    plugin["log_file_path"] = json!(d.join("cni.log"));
    plugin["ipam_lock_file"] = json!(d.join("ipam.lock"));
    plugin
}

/// The plugin as a runtime runs it: CNI_* variables (and nothing else but PATH), the network
/// configuration on stdin.
fn run_plugin(mut c: Command, cni: &[(&str, &str)], conf: &Value, d: &Path) -> Output {
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CNI_PATH", "/opt/cni/bin");
    for (k, v) in cni {
        c.env(k, v);
    }
    let o = roles::run_with_input(c, conf.to_string().as_bytes(), WAIT);
    assert!(
        o.status.success(),
        "CNI {cni:?} with the installed configuration: {}\nplugin log: {}",
        show(&o),
        std::fs::read_to_string(d.join("cni.log")).unwrap_or_default()
    );
    o
}

#[test]
fn dataplane_and_typha_run_as_deployed_within_their_rbac() {
    let m = Manifests::default_set();
    let bgp = Manifests::bgp_set();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let api = ApiServer::start(ServerOptions::default()).unwrap();
    let kubeconfig = d.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let kc = ("KUBECONFIG", kubeconfig.display().to_string());
    let s = api.store();
    seed_cluster(&api, Some("10.244.0.5"));

    // --- node start-up (init container 1), as margay-node ---------------------------------
    let nodename = run_node_startup(&m, &api, d, &kubeconfig, None);
    let node = s.get(NODES, "", NODE).unwrap();
    assert_eq!(
        node["metadata"]["annotations"]["projectcalico.org/IPv4Address"], "127.0.0.1/8",
        "{node}"
    );
    let pool = s
        .get(
            Gvr::new("crd.projectcalico.org", "v1", "ippools"),
            "",
            "default-ipv4-ippool",
        )
        .unwrap();
    assert_eq!(pool["spec"]["vxlanMode"], "CrossSubnet", "{pool}");

    // --- the CNI configuration (init container 3) and the plugin, as margay-cni-plugin -----
    let (installed, plugin_kubeconfig) = run_install_cni_config(&m, &api, d);
    // A token Secret not filled yet: the script says so and fails (the kubelet retries it).
    let install = container(
        &m,
        "DaemonSet/margay-node initContainers[install-cni-config]",
    );
    let empty = d.join("empty-token");
    std::fs::create_dir_all(&empty).unwrap();
    let c = container_command(
        &m,
        &install,
        d,
        &[
            ("CNI_NET_DIR", d.join("unused").display().to_string()),
            ("CNI_PLUGIN_TOKEN_DIR", empty.display().to_string()),
        ],
    );
    let o = roles::run_within(c, WAIT);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("margay-cni-plugin-token"),
        "{}",
        show(&o)
    );
    // CNI STATUS (cniVersion 1.1.0) with no datastore variables at all: the installed
    // configuration alone connects, reads the pools and finds one usable. (ADD and DEL:
    // cni_plugin_wires_a_pod_as_installed_within_its_rbac.)
    let mut conf = plugin_conf(&installed, &plugin_kubeconfig, &nodename, d);
    conf["cniVersion"] = json!("1.1.0");
    let before = api.stats().requests;
    run_plugin(Command::new(bin()), &[("CNI_COMMAND", "STATUS")], &conf, d);
    assert_within_rbac(
        &m,
        "margay-cni-plugin",
        "the CNI plugin (STATUS)",
        &requests_since(&api, &before),
    );

    // --- Typha, Felix through Typha, confd through Typha, as margay-node -------------------
    let before = api.stats().requests;
    let typha_port = margay_testkit::free_port().unwrap();
    let typha_health = margay_testkit::free_port().unwrap();
    let typha_c = container(&m, "Deployment/margay-typha containers[typha]");
    let mut c = container_command(
        &m,
        &typha_c,
        d,
        &[
            kc.clone(),
            // This host's free ports, on loopback only.
            ("TYPHA_SERVERHOST", "127.0.0.1".into()),
            ("TYPHA_SERVERPORT", typha_port.to_string()),
            ("TYPHA_HEALTHPORT", typha_health.to_string()),
        ],
    );
    c.arg("-c").arg(d.join("no-typha.cfg"));
    let mut typha = Role::spawn("typha", c, d.join("typha.log"));
    wait_for("Typha ready (its readiness probe's URL)", || {
        typha.assert_running();
        match http_get(typha_health, "/readiness") {
            Some(200) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    // What the endpoints controller would publish for the Service.
    let svc = m.get("Service", "margay-typha");
    s.create(
        SLICES,
        NAMESPACE,
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "margay-typha-x1", "namespace": NAMESPACE,
                         "labels": {"kubernetes.io/service-name": "margay-typha"}},
            "addressType": "IPv4",
            "ports": [{"name": svc["spec"]["ports"][0]["name"], "port": typha_port, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["127.0.0.1"], "nodeName": NODE, "conditions": {"ready": true}}],
        }),
    )
    .unwrap();

    let felix_c = container(&m, "DaemonSet/margay-node containers[felix]");
    let felix_health = margay_testkit::free_port().unwrap();
    let felix_extra = [
        kc.clone(),
        // No kernel here: the recording dataplane computes everything and programs nothing.
        ("MARGAY_DATAPLANE", "recording".into()),
        ("FELIX_HEALTHPORT", felix_health.to_string()),
        (
            "MARGAY_FELIX_STATUS_SOCKET",
            d.join("felix.sock").display().to_string(),
        ),
    ];
    let mut felix = start_felix_until_probes_pass(&m, &felix_c, d, &felix_extra, &mut || {
        typha.assert_running()
    });
    let felix_log = felix.log();
    assert!(
        felix_log.contains(&format!("127.0.0.1:{typha_port}")),
        "Felix uses the Typha it found in the Service: {felix_log}"
    );

    // network-condition beside Felix: NetworkUnavailable False once Felix is ready (the
    // probe above says it is), True again on SIGTERM.
    let cond_c = container(&m, "DaemonSet/margay-node containers[network-condition]");
    let c = container_command(
        &m,
        &cond_c,
        d,
        &[kc.clone(), ("FELIX_HEALTHPORT", felix_health.to_string())],
    );
    let mut cond = Role::spawn("network-condition", c, d.join("network-condition.log"));
    let condition = || -> Value {
        s.get(NODES, "", NODE).unwrap()["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "NetworkUnavailable")
            .cloned()
            .unwrap_or(Value::Null)
    };
    wait_for("NetworkUnavailable False (CalicoIsUp)", || {
        cond.assert_running();
        let c = condition();
        if c["reason"] == "CalicoIsUp" && c["status"] == "False" {
            Ok(())
        } else {
            Err(format!("{c}; log: {}", cond.log()))
        }
    });
    let pid = cond.pid().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let exited = wait_for("network-condition to exit on SIGTERM", || {
        cond.exited().ok_or_else(|| cond.log())
    });
    assert!(exited.success(), "{exited}: {}", cond.log());
    let down = condition();
    assert_eq!(
        (&down["status"], &down["reason"]),
        (&json!("True"), &json!("CalicoIsDown")),
        "{down}"
    );

    // confd of the BGP variant, once, through the same Typha.
    let confd_c = container(&bgp, "DaemonSet/margay-node containers[confd]");
    let bird_dir = d.join("bird");
    let mut c = container_command(&bgp, &confd_c, d, std::slice::from_ref(&kc));
    c.args(["--once", "--no-reload", "--config-dir"])
        .arg(&bird_dir);
    let o = roles::run_within(c, WAIT);
    assert!(o.status.success(), "confd --once: {}", show(&o));
    let cfg = std::fs::read_to_string(bird_dir.join("bird.cfg")).unwrap();
    assert!(cfg.contains("router id 127.0.0.1"), "{cfg}");
    typha.assert_running();
    felix.assert_running();
    drop(felix);
    drop(typha);
    assert_within_rbac(
        &m,
        "margay-node",
        "Typha, Felix and confd",
        &requests_since(&api, &before),
    );
}

/// The CNI plugin, installed as the DaemonSet installs it, wires a pod (ADD, CHECK, DEL) with
/// the installed configuration and the kubeconfig the script wrote, asking the API only what
/// margay-cni-plugin may. Needs root: the plugin and the double run in a network namespace
/// this test makes (the pod's in another), so nothing outside them is touched.
#[test]
fn cni_plugin_wires_a_pod_as_installed_within_its_rbac() {
    use margay_testkit::netns::{Netns, is_root};
    if !is_root() {
        if std::env::var("MARGAY_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
            eprintln!("skipped: needs root (MARGAY_SKIP_ROOT_TESTS=1)");
            return;
        }
        panic!("needs root (network namespaces); run as root or set MARGAY_SKIP_ROOT_TESTS=1");
    }
    let m = Manifests::default_set();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The node: a namespace with an uplink and a default route, as a real host has.
    let host = Netns::new("deploy-host").unwrap();
    host.add_veth("uplink", "uplink-peer", &["192.0.2.1/32"])
        .unwrap();
    host.ip(&["route", "add", "default", "dev", "uplink"])
        .unwrap();
    // The API server listens inside the node's namespace (its loopback), where the plugin runs.
    let ns_file =
        margay_netlink::netns::open(Path::new(&format!("/run/netns/{}", host.name()))).unwrap();
    let api = margay_netlink::netns::run_in(&ns_file, || {
        ApiServer::start(ServerOptions::default()).map_err(std::io::Error::other)
    })
    .unwrap();
    let kubeconfig = d.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    seed_cluster(&api, None);
    let nodename = run_node_startup(&m, &api, d, &kubeconfig, Some(&host));
    let (installed, plugin_kubeconfig) = run_install_cni_config(&m, &api, d);
    let conf = plugin_conf(&installed, &plugin_kubeconfig, &nodename, d);

    let pod_ns = Netns::new("deploy-pod").unwrap();
    let id = format!("c{:x}web1", std::process::id());
    let netns_path = format!("/run/netns/{}", pod_ns.name());
    let args = format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1;K8S_POD_INFRA_CONTAINER_ID={id}"
    );
    let cni = |cmd: &'static str| -> Vec<(&'static str, String)> {
        vec![
            ("CNI_COMMAND", cmd.to_string()),
            ("CNI_CONTAINERID", id.clone()),
            ("CNI_NETNS", netns_path.clone()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_ARGS", args.clone()),
        ]
    };
    let plugin = |cmd: &'static str, conf: &Value| -> Output {
        let env = cni(cmd);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        run_plugin(host.exec(bin()), &env, conf, d)
    };
    let s = api.store();
    let before = api.stats().requests;
    let o = plugin("ADD", &conf);
    let result: Value = serde_json::from_slice(&o.stdout).unwrap();
    let ip = result["ips"][0]["address"].as_str().unwrap().to_string();
    assert!(
        ip.starts_with("192.168."),
        "from the default pool: {result}"
    );
    let pod = s.get(PODS, "shop", "web-1").unwrap();
    assert_eq!(
        pod["metadata"]["annotations"]["cni.projectcalico.org/podIP"], ip,
        "the WorkloadEndpoint is the pod: {pod}"
    );
    let mut check = conf.clone();
    check["prevResult"] = result;
    plugin("CHECK", &check);
    plugin("DEL", &conf);
    let pod = s.get(PODS, "shop", "web-1").unwrap();
    assert_eq!(
        pod["metadata"]["annotations"]["cni.projectcalico.org/podIP"], "",
        "{pod}"
    );
    let handles = s
        .list(
            Gvr::new("crd.projectcalico.org", "v1", "ipamhandles"),
            None,
            "",
        )
        .unwrap();
    assert!(
        handles
            .iter()
            .all(|h| !h["spec"]["handleID"].as_str().unwrap_or("").contains(&id)),
        "the pod's addresses are released: {handles:?}"
    );
    assert_within_rbac(
        &m,
        "margay-cni-plugin",
        "the CNI plugin (ADD, CHECK, DEL)",
        &requests_since(&api, &before),
    );
    drop(api);
}

/// The `[default: …]` clap prints for `flag` in a help text.
fn help_default(help: &str, flag: &str) -> Option<String> {
    // Wrapped lines joined: `[default:` and its value may be on two lines.
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    let at = help.find(&format!("{flag} <"))?;
    let rest = &help[at..];
    let start = rest.find("[default: ")? + "[default: ".len();
    let end = rest[start..].find(']')?;
    Some(rest[start..start + end].to_string())
}

#[test]
fn kube_controllers_run_as_deployed_within_their_rbac() {
    if !has_role("kube-controllers") {
        eprintln!("NOT RUN: this margay has no kube-controllers role yet");
        return;
    }
    let m = Manifests::default_set();
    let c = container(
        &m,
        "Deployment/margay-kube-controllers containers[kube-controllers]",
    );
    // The status file the probes read is where the container can write it.
    let help = margay_help(&c.argv()[1..]).unwrap();
    let status = help_default(&help, "--status-file").unwrap();
    let status_dir = Path::new(&status).parent().unwrap().to_str().unwrap();
    let vol = c
        .volume_at(status_dir)
        .unwrap_or_else(|| panic!("nothing mounted at {status_dir} for {status}"));
    assert!(vol.get("emptyDir").is_some(), "{vol}");
    for (_, p) in c.probe_argvs() {
        let h = margay_help(&p[1..]).unwrap();
        assert_eq!(
            help_default(&h, "--file").as_deref(),
            Some(status.as_str()),
            "{p:?}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let api = ApiServer::start(ServerOptions::default()).unwrap();
    let kubeconfig = d.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let s = api.store();
    // A node that start-up registered (VXLAN tunnel address: a block, its affinity, a
    // handle), whose Kubernetes Node is deleted below: the node controller's to clean up.
    seed_cluster(&api, Some("10.244.0.5"));
    run_node_startup(&m, &api, d, &kubeconfig, None);
    let ipam = |plural: &'static str| -> usize {
        s.list(Gvr::new("crd.projectcalico.org", "v1", plural), None, "")
            .unwrap()
            .len()
    };
    assert_eq!(
        (
            ipam("ipamblocks"),
            ipam("blockaffinities"),
            ipam("ipamhandles")
        ),
        (1, 1, 1),
        "the node's tunnel address"
    );

    let before = api.stats().requests;
    let status_file = d.join("status.json");
    let mut cmd = container_command(
        &m,
        &c,
        d,
        &[("KUBECONFIG", kubeconfig.display().to_string())],
    );
    cmd.arg("--status-file").arg(&status_file);
    let mut kc = Role::spawn("kube-controllers", cmd, d.join("kube-controllers.log"));
    // Its own probes (on this test's status file) say when it is ready.
    for (what, argv) in c.probe_argvs() {
        wait_for(&format!("kube-controllers {what}"), || {
            kc.assert_running();
            let mut p = margay(d);
            p.args(&argv[1..]).arg("-f").arg(&status_file);
            let o = roles::run_within(p, WAIT);
            if o.status.success() {
                Ok(())
            } else {
                Err(format!("{}\nlog: {}", show(&o), kc.log()))
            }
        });
    }
    // The KubeControllersConfiguration it creates, with its status.
    wait_for("KubeControllersConfiguration default", || {
        s.get(
            Gvr::new(
                "crd.projectcalico.org",
                "v1",
                "kubecontrollersconfigurations",
            ),
            "",
            "default",
        )
        .map_err(|e| format!("{e:?}"))
    });
    // The node goes: its tunnel address, affinity and (empty) block are released.
    s.delete(NODES, "", NODE).unwrap();
    wait_for("the deleted node's IPAM released", || {
        kc.assert_running();
        let left = (
            ipam("ipamblocks"),
            ipam("blockaffinities"),
            ipam("ipamhandles"),
        );
        if left == (0, 0, 0) {
            Ok(())
        } else {
            Err(format!(
                "blocks, affinities, handles left: {left:?}; log:\n{}",
                kc.log()
            ))
        }
    });
    kc.assert_running();
    drop(kc);
    assert_within_rbac(
        &m,
        "margay-kube-controllers",
        "kube-controllers",
        &requests_since(&api, &before),
    );
}
