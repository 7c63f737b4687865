//! 3. References between the objects, and what they must agree on with margay.

use super::*;

/// `matchLabels` ⊆ labels.
fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(want) = selector["matchLabels"].as_object() else {
        return false;
    };
    !want.is_empty() && want.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn check_references(m: &Manifests) {
    for (at, pod) in m.pod_specs() {
        let volumes: BTreeMap<&str, &Value> = pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| (v["name"].as_str().unwrap(), v))
            .collect();
        let mut used = BTreeSet::new();
        for list in ["initContainers", "containers"] {
            for c in pod[list].as_array().into_iter().flatten() {
                for vm in c["volumeMounts"].as_array().into_iter().flatten() {
                    let n = vm["name"].as_str().unwrap();
                    assert!(volumes.contains_key(n), "{at}: no volume {n}");
                    used.insert(n);
                }
            }
        }
        for (n, v) in &volumes {
            assert!(used.contains(n), "{at}: volume {n} is mounted nowhere");
            if let Some(cm) = v.get("configMap") {
                let name = cm["name"].as_str().unwrap();
                for item in cm["items"].as_array().into_iter().flatten() {
                    m.config_value(name, item["key"].as_str().unwrap())
                        .unwrap_or_else(|e| panic!("{at}: volume {n}: {e}"));
                }
            }
            if let Some(s) = v.get("secret") {
                let name = s["secretName"].as_str().unwrap();
                m.find("Secret", name)
                    .unwrap_or_else(|| panic!("{at}: volume {n}: no Secret {name}"));
            }
        }
        let sa = pod["serviceAccountName"].as_str().unwrap();
        m.find("ServiceAccount", sa)
            .unwrap_or_else(|| panic!("{at}: no ServiceAccount {sa}"));
    }
    for w in m
        .docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| d["kind"] == "DaemonSet" || d["kind"] == "Deployment")
    {
        let labels = &w["spec"]["template"]["metadata"]["labels"];
        assert!(
            selects(&w["spec"]["selector"], labels),
            "{}: its selector does not select its pods",
            w["metadata"]["name"]
        );
    }
    for pdb in m.of_kind("PodDisruptionBudget") {
        let name = pdb["metadata"]["name"].as_str().unwrap();
        let w = m.get("Deployment", name);
        assert!(
            selects(
                &pdb["spec"]["selector"],
                &w["spec"]["template"]["metadata"]["labels"]
            ),
            "PodDisruptionBudget {name} selects no pod of Deployment {name}"
        );
    }
    // Bindings: to roles that exist, for service accounts that exist.
    for b in m
        .docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
    {
        let role_kind = b["roleRef"]["kind"].as_str().unwrap();
        let role = b["roleRef"]["name"].as_str().unwrap();
        assert_eq!(b["roleRef"]["apiGroup"], "rbac.authorization.k8s.io", "{b}");
        let r = m.get(role_kind, role);
        if role_kind == "Role" {
            assert_eq!(
                r["metadata"]["namespace"], b["metadata"]["namespace"],
                "{b}"
            );
        }
        for s in b["subjects"].as_array().unwrap() {
            assert_eq!(s["kind"], "ServiceAccount", "{b}");
            assert_eq!(s["namespace"], NAMESPACE, "{b}");
            m.get("ServiceAccount", s["name"].as_str().unwrap());
        }
    }
    for r in m
        .docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
    {
        for rule in r["rules"].as_array().unwrap() {
            for k in ["apiGroups", "resources", "verbs"] {
                assert!(
                    !strings(&rule[k]).is_empty(),
                    "{}: {rule}",
                    r["metadata"]["name"]
                );
            }
            for v in strings(&rule["verbs"]) {
                assert!(
                    [
                        "get",
                        "list",
                        "watch",
                        "create",
                        "update",
                        "patch",
                        "delete",
                        "deletecollection"
                    ]
                    .contains(&v.as_str()),
                    "{}: verb {v:?}",
                    r["metadata"]["name"]
                );
            }
        }
    }
    let token = m.get("Secret", "margay-cni-plugin-token");
    assert_eq!(token["type"], "kubernetes.io/service-account-token");
    m.get(
        "ServiceAccount",
        token["metadata"]["annotations"]["kubernetes.io/service-account.name"]
            .as_str()
            .unwrap(),
    );
}

/// Typha's Service, Deployment and clients agree with each other and with margay's defaults.
fn check_typha_wiring(m: &Manifests) {
    use margay_typha::config::TyphaConfig;
    use margay_typha::discovery::{DEFAULT_NAMESPACE, DEFAULT_PORT_NAME};
    let svc_name = m
        .config_value("margay-config", "typha_service_name")
        .unwrap();
    let svc = m.get("Service", &svc_name);
    assert_eq!(svc["metadata"]["namespace"], DEFAULT_NAMESPACE);
    let deploy = m.get("Deployment", &svc_name);
    let pod = &deploy["spec"]["template"]["spec"];
    assert!(selects(
        &json!({"matchLabels": svc["spec"]["selector"]}),
        &deploy["spec"]["template"]["metadata"]["labels"]
    ));
    assert_eq!(deploy["spec"]["replicas"], 3);
    assert!(
        pod.pointer("/affinity/podAntiAffinity").is_some(),
        "Typhas spread over nodes"
    );
    assert_eq!(pod["hostNetwork"], true);
    let c = containers(m)
        .into_iter()
        .find(|c| c.at.starts_with(&format!("Deployment/{svc_name} ")))
        .unwrap();
    let env: BTreeMap<String, String> = c.env(m).unwrap().into_iter().collect();
    let cfg = TyphaConfig::load(&env, None).unwrap();
    // Clients find Typha by the Service's port name; the Service reaches the container's port.
    let port = &svc["spec"]["ports"][0];
    assert_eq!(port["name"], DEFAULT_PORT_NAME);
    assert_eq!(port["targetPort"], DEFAULT_PORT_NAME);
    let cport = c.spec["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == DEFAULT_PORT_NAME)
        .unwrap();
    assert_eq!(cport["containerPort"], cfg.server_port);
    assert_eq!(port["port"], cfg.server_port);
    // Typha counts its own Service's endpoints.
    assert_eq!(cfg.k8s_service_name, svc_name);
    assert_eq!(cfg.k8s_namespace, DEFAULT_NAMESPACE);
    assert_eq!(cfg.k8s_port_name, DEFAULT_PORT_NAME);
    assert_eq!(
        cfg.connection_rebalancing_mode,
        margay_typha::config::RebalancingMode::Kubernetes
    );
    // Health probes where Typha serves health.
    assert!(cfg.health_enabled);
    for p in ["livenessProbe", "readinessProbe"] {
        let g = &c.spec[p]["httpGet"];
        assert_eq!(g["port"], cfg.health_port, "{p}");
        assert_eq!(g["host"], cfg.health_host.as_str(), "{p}");
    }
    // Draining within the grace period.
    assert_eq!(
        pod["terminationGracePeriodSeconds"],
        cfg.shutdown_timeout.as_secs(),
        "TYPHA_SHUTDOWNTIMEOUTSECS and terminationGracePeriodSeconds"
    );
    // Felix and confd look for the same Service (FELIX_TYPHAK8SNAMESPACE left at kube-system).
    for c in containers(m) {
        let env: BTreeMap<String, String> = c.env(m).unwrap().into_iter().collect();
        if let Some(s) = env.get("FELIX_TYPHAK8SSERVICENAME") {
            assert_eq!(s, &svc_name, "{}", c.at);
            assert!(!env.contains_key("FELIX_TYPHAK8SNAMESPACE"), "{}", c.at);
        }
    }
    let pdb = m.get("PodDisruptionBudget", &svc_name);
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
}

/// The CNI pieces: the conflist is a network configuration margay's plugin takes, installed
/// where the script puts it, naming the kubeconfig the script writes, logging where the node
/// keeps the plugin's log.
fn check_cni_wiring(m: &Manifests) {
    let cs = containers(m);
    let install = cs
        .iter()
        .find(|c| c.name() == "install-cni-config")
        .unwrap();
    let env: BTreeMap<String, String> = install.env(m).unwrap().into_iter().collect();
    let conf_file = &env["CNI_NETWORK_CONFIG_FILE"];
    let (mount, item) = conf_file.rsplit_once('/').unwrap();
    let vol = install.volume_at(mount).unwrap();
    let cm = vol["configMap"]["name"].as_str().unwrap();
    let key = vol["configMap"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["path"] == item)
        .unwrap()["key"]
        .as_str()
        .unwrap();
    assert_eq!(item, env["CNI_CONF_NAME"].as_str());
    let conflist: Value = serde_json::from_str(&m.config_value(cm, key).unwrap()).unwrap();
    let host_net_d = install.host_path_at(&env["CNI_NET_DIR"]).unwrap();
    assert_eq!(host_net_d, "/etc/cni/net.d");
    let plugins = conflist["plugins"].as_array().unwrap();
    let types: Vec<&str> = plugins
        .iter()
        .map(|p| p["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["margay", "portmap"]);
    // As a runtime passes it to the plugin: the list's name and version added.
    let mut plugin = plugins[0].clone();
    plugin["name"] = conflist["name"].clone();
    plugin["cniVersion"] = conflist["cniVersion"].clone();
    let parsed = margay_cni::config::parse_netconf(plugin.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("the conflist's margay plugin: {e:?}"));
    assert_eq!(parsed.conf.ipam.ipam_type, "margay-ipam");
    assert_eq!(parsed.conf.datastore_type, "kubernetes");
    assert_eq!(
        parsed.conf.kubernetes.kubeconfig,
        format!("{host_net_d}/margay-kubeconfig"),
        "the kubeconfig the script writes"
    );
    let log_dir = Path::new(&parsed.conf.log_file_path)
        .parent()
        .unwrap()
        .display()
        .to_string();
    let pod = &m.get("DaemonSet", "margay-node")["spec"]["template"]["spec"];
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["hostPath"]["path"] == log_dir.as_str()),
        "the plugin logs under {log_dir}, a directory the DaemonSet creates on the host"
    );
    // The binaries go where the runtime looks for plugins.
    let bin = cs.iter().find(|c| c.name() == "install-cni").unwrap();
    let argv = bin.argv();
    let dir = &argv[argv.iter().position(|a| a == "--dir").unwrap() + 1];
    assert_eq!(bin.host_path_at(dir).unwrap(), "/opt/cni/bin");
    // Start-up before the CNI configuration: no pod is wired on an unregistered node.
    let order: Vec<&str> = pod["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["node-startup", "install-cni", "install-cni-config"]);
}

#[test]
fn references_resolve_and_agree_with_margay() {
    for m in [Manifests::default_set(), Manifests::bgp_set()] {
        check_references(&m);
        check_typha_wiring(&m);
        check_cni_wiring(&m);
        // The host directories Calico's calico-node mounts, where margay uses them.
        let felix = containers(&m)
            .into_iter()
            .find(|c| c.name() == "felix")
            .unwrap();
        assert_eq!(felix.spec["securityContext"]["privileged"], true);
        for p in [
            "/lib/modules",
            "/run/xtables.lock",
            "/var/run/calico",
            "/var/lib/calico",
            "/var/log/calico/cni",
        ] {
            assert_eq!(
                felix.host_path_at(p).as_deref(),
                Some(p),
                "felix mounts {p}"
            );
        }
        let pod = felix.pod;
        assert_eq!(pod["hostNetwork"], true);
        // The probes ask Felix's health server, which the environment turns on.
        let env: BTreeMap<String, String> = felix.env(&m).unwrap().into_iter().collect();
        assert_eq!(env["FELIX_HEALTHENABLED"], "true");
        assert_eq!(env["DATASTORE_TYPE"], "kubernetes");
    }
}

/// The etcd installation: every reference resolves, every margay container that reads the
/// datastore reads etcd with the ConfigMap's endpoints and certificate paths (the Secret
/// mounted where they point), the CNI configuration names etcd too, and no Typha is wired.
#[test]
fn etcd_installation_reads_etcd_everywhere() {
    let m = Manifests::etcd_set();
    check_references(&m);
    assert!(m.find("Deployment", "margay-typha").is_none());
    assert!(
        m.find("CustomResourceDefinition", "ippools.crd.projectcalico.org")
            .is_none()
    );
    let mut readers = 0;
    for c in containers(&m) {
        let env: BTreeMap<String, String> = c.env(&m).unwrap().into_iter().collect();
        assert!(!env.contains_key("FELIX_TYPHAK8SSERVICENAME"), "{}", c.at);
        let Some(ty) = env.get("DATASTORE_TYPE") else {
            continue;
        };
        readers += 1;
        assert_eq!(ty, "etcdv3", "{}", c.at);
        assert_eq!(
            env["ETCD_ENDPOINTS"],
            m.config_value("margay-config", "etcd_endpoints").unwrap()
        );
        for k in ["ETCD_CA_CERT_FILE", "ETCD_CERT_FILE", "ETCD_KEY_FILE"] {
            assert!(env.contains_key(k), "{}: {k}", c.at);
        }
        let mounts: Vec<&str> = c.spec["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["name"] == "etcd-certs")
            .map(|v| v["mountPath"].as_str().unwrap())
            .collect();
        assert_eq!(mounts, ["/calico-secrets"], "{}", c.at);
    }
    // node-startup, felix, network-condition, kube-controllers.
    assert_eq!(readers, 4);
    let cni: Value = serde_json::from_str(
        &m.config_value("margay-config", "cni_network_config")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(cni["plugins"][0]["datastore_type"], "etcdv3");
    assert_eq!(
        cni["plugins"][0]["etcd_endpoints"],
        m.config_value("margay-config", "etcd_endpoints")
            .unwrap()
            .as_str()
    );
    let kc = m.get("Deployment", "margay-kube-controllers");
    let env = &kc["spec"]["template"]["spec"]["containers"][0]["env"];
    let enabled = env
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "ENABLED_CONTROLLERS")
        .unwrap();
    assert_eq!(
        enabled["value"],
        "policy,namespace,serviceaccount,workloadendpoint,node"
    );
}

/// The BGP DaemonSet is the default one with BGP's differences, and nothing else: start-up's
/// backend and pools, and the confd and bird containers (BIRD reading what confd writes, on
/// the socket confd and the probes use).
#[test]
fn bgp_variant_is_the_default_daemonset_plus_bird() {
    let vxlan = Manifests::default_set();
    let bgp = Manifests::bgp_set();
    let a = vxlan.get("DaemonSet", "margay-node").clone();
    let b = bgp.get("DaemonSet", "margay-node").clone();

    let envs = |ds: &Value| -> BTreeMap<String, Value> {
        ds["spec"]["template"]["spec"]["initContainers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
            .collect()
    };
    let (ea, eb) = (envs(&a), envs(&b));
    let changed: Vec<&String> = ea
        .keys()
        .filter(|k| ea.get(*k) != eb.get(*k))
        .chain(eb.keys().filter(|k| !ea.contains_key(*k)))
        .collect();
    assert_eq!(
        changed,
        [
            "CALICO_IPV4POOL_VXLAN",
            "CALICO_IPV6POOL_VXLAN",
            "CALICO_NETWORKING_BACKEND",
            "CLUSTER_TYPE"
        ]
    );
    assert_eq!(eb["CALICO_NETWORKING_BACKEND"]["value"], "bird");
    assert_eq!(eb["CALICO_IPV4POOL_VXLAN"]["value"], "Never");

    // network-condition waits for what start-up's backend runs (BIRD too with bird): the same
    // CALICO_NETWORKING_BACKEND in both containers, and its only difference.
    let condition_env = |ds: &Value| -> BTreeMap<String, Value> {
        ds["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "network-condition")
            .unwrap_or_else(|| panic!("no network-condition container"))["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
            .collect()
    };
    let (ca, cb) = (condition_env(&a), condition_env(&b));
    assert_eq!(
        ca["CALICO_NETWORKING_BACKEND"],
        ea["CALICO_NETWORKING_BACKEND"]
    );
    assert_eq!(
        cb["CALICO_NETWORKING_BACKEND"],
        eb["CALICO_NETWORKING_BACKEND"]
    );
    let without_backend = |mut m: BTreeMap<String, Value>| {
        m.remove("CALICO_NETWORKING_BACKEND");
        m
    };
    assert_eq!(without_backend(ca), without_backend(cb));

    let strip = |ds: &Value| -> Value {
        let mut ds = ds.clone();
        let pod = &mut ds["spec"]["template"]["spec"];
        pod["initContainers"][0]["env"] = json!(null);
        let cs = pod["containers"].as_array_mut().unwrap();
        cs.retain(|c| c["name"] != "confd" && c["name"] != "bird");
        for c in cs.iter_mut().filter(|c| c["name"] == "network-condition") {
            c["env"] = json!(null);
        }
        let vs = pod["volumes"].as_array_mut().unwrap();
        vs.retain(|v| v["name"] != "bird-config");
        ds
    };
    assert_eq!(
        strip(&a),
        strip(&b),
        "deploy/bgp/margay-node.yaml differs from deploy/margay-node.yaml in more than BGP's parts"
    );

    let cs = containers(&bgp);
    let confd = cs.iter().find(|c| c.name() == "confd").unwrap();
    let bird = cs.iter().find(|c| c.name() == "bird").unwrap();
    assert_eq!(confd.argv(), ["margay", "confd"]);
    let dir = margay_confd::cli::DEFAULT_CONFIG_DIR;
    let socket = margay_confd::cli::DEFAULT_BIRD_SOCKET;
    let script = bird.script().unwrap();
    let exec = script
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("exec bird "))
        .unwrap();
    let args: Vec<&str> = exec.split_whitespace().collect();
    let after = |flag: &str| args[args.iter().position(|a| *a == flag).unwrap() + 1];
    assert_eq!(
        after("-c"),
        format!("{dir}/bird.cfg"),
        "BIRD reads what confd writes"
    );
    assert_eq!(
        after("-s"),
        socket,
        "BIRD's socket is where confd reloads it"
    );
    assert!(args.contains(&"-f"), "BIRD in the foreground");
    assert!(script.contains(&format!("[ -s {dir}/bird.cfg ]")));
    // Both see the same directory and socket directory.
    assert_eq!(confd.volume_at(dir), bird.volume_at(dir));
    assert!(confd.volume_at(dir).unwrap().get("emptyDir").is_some());
    let run = Path::new(socket).parent().unwrap().to_str().unwrap();
    assert_eq!(confd.host_path_at(run).as_deref(), Some(run));
    assert_eq!(bird.host_path_at(run).as_deref(), Some(run));
    // The probes find BIRD's socket where it is by default.
    let health = margay_help(&["node".into(), "health".into()]).unwrap();
    assert!(health.contains(socket), "{health}");
    let probes: Vec<Vec<String>> = bird.probe_argvs().into_iter().map(|(_, a)| a).collect();
    assert_eq!(
        probes,
        [
            vec!["margay", "node", "health", "--bird-live"],
            vec!["margay", "node", "health", "--bird-ready"]
        ]
    );
    assert_eq!(bird.spec["securityContext"]["privileged"], true);
}
