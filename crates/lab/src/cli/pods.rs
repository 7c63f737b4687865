//! Pods: wired by the real CNI plugin as a runtime (and kubelet) would, with their named ports.

use super::*;

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
    let ips = cni(st, &pod, &spec, "ADD")?;
    let ip = ips
        .v4
        .or(ips.v6.clone())
        .ok_or_else(|| other(format!("CNI ADD for {}: no address in the result", pod.id)))?;
    if api.is_none() {
        add_named_ports(st, &spec)?;
    }
    st.pods[i].ip = Some(ip.clone());
    st.pods[i].ip6 = ips.v6;
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
    supervise(&exe, &pods_dir, &base, true, &[], &argv)?;
    if let Some(api) = api {
        api.patch_status(
            &crate::kube::PODS,
            Some(&spec.namespace),
            &spec.name,
            &k8s::pod_running_patch(&ip, st.pods[i].ip6.as_deref(), &node_ip, &pod.container_id),
        )?;
    }
    Ok(())
}

/// `bird -f` inside `netns`, config `<dir>/confd/bird.cfg` (a node) or `<dir>/bird.cfg`
/// (the ToR), socket `<dir>/bird.ctl`.
pub(super) fn bird_argv(netns: &str, dir: &Path) -> Vec<String> {
    bird_argv_named(netns, dir, "bird")
}

/// [`bird_argv`] for the BIRD named `name`: `bird` (IPv4, `bird.cfg`) or, on a dual-stack
/// node, `bird6` (IPv6: `bird6.cfg`, `bird6.ctl`), a second BIRD 2 as calico-node runs bird6.
pub(super) fn bird_argv_named(netns: &str, dir: &Path, name: &str) -> Vec<String> {
    let file = format!("{name}.cfg");
    let cfg = if dir.join("confd").is_dir() {
        dir.join("confd").join(&file)
    } else {
        dir.join(&file)
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
        dir.join(format!("{name}.ctl")).display().to_string(),
        "-P".into(),
        dir.join(format!("{name}.pidfile")).display().to_string(),
    ]
}

/// Gives the pod's endpoint named ports for what it serves (`serve-80-tcp`, `serve-81-udp`,
/// as in Kubernetes' network-policy tests; a runtime would pass container ports).
pub(super) fn add_named_ports(
    st: &LabState,
    spec: &crate::topology::PodSpec,
) -> Result<(), LabError> {
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
pub(super) fn cni_conf(
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
        "ipam": if st.ipv6 {
            // Calico's IPAM assigns IPv6 only when asked (the default is IPv4 only).
            serde_json::json!({"type": "margay-ipam", "assign_ipv6": "true"})
        } else {
            serde_json::json!({"type": "margay-ipam"})
        },
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
pub(super) const CNI_TIMEOUT: Duration = Duration::from_secs(60);

/// A pod's addresses from CNI ADD's result, one per family.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct PodIps {
    pub(crate) v4: Option<String>,
    pub(crate) v6: Option<String>,
}

/// The first address of each family in a CNI result's `ips`.
pub(crate) fn result_ips(result: &Value) -> PodIps {
    let mut ips = PodIps::default();
    for entry in result["ips"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
        let Some(ip) = entry["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .and_then(|a| a.parse::<IpAddr>().ok())
        else {
            continue;
        };
        let slot = if ip.is_ipv4() {
            &mut ips.v4
        } else {
            &mut ips.v6
        };
        if slot.is_none() {
            *slot = Some(ip.to_string());
        }
    }
    ips
}

/// Runs the CNI plugin for a pod as a kubelet's runtime does (CNI_* variables and nothing else
/// but PATH, CNI_ARGS with the pod's namespace, name and sandbox); ADD returns the pod's
/// addresses.
pub(crate) fn cni(
    st: &LabState,
    pod: &crate::state::PodState,
    spec: &crate::topology::PodSpec,
    command: &str,
) -> Result<PodIps, LabError> {
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
        return Ok(PodIps::default());
    }
    let result: Value = serde_json::from_str(&text)
        .map_err(|e| other(format!("CNI ADD for {}: bad result {text:?}: {e}", pod.id)))?;
    let ips = result_ips(&result);
    if ips.v4.is_none() && ips.v6.is_none() {
        return Err(other(format!(
            "CNI ADD for {}: no address in {text}",
            pod.id
        )));
    }
    if st.ipv6 && ips.v6.is_none() {
        return Err(other(format!(
            "CNI ADD for {}: the lab is dual-stack but the result has no IPv6 address: {text}",
            pod.id
        )));
    }
    Ok(ips)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_ips_takes_one_address_per_family() {
        let r = serde_json::json!({"ips": [
            {"address": "fd00:10:244::5/128"},
            {"address": "10.244.1.2/32"},
            {"address": "10.244.1.3/32"},
            {"address": "garbage"},
        ]});
        assert_eq!(
            result_ips(&r),
            PodIps {
                v4: Some("10.244.1.2".into()),
                v6: Some("fd00:10:244::5".into())
            }
        );
        assert_eq!(result_ips(&serde_json::json!({})), PodIps::default());
    }
}
