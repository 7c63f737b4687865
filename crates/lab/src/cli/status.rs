//! Readiness waits and `lab status` (text, JSON and the Kubernetes view).

use super::*;

pub(super) fn felix_status(st: &LabState, node: &str) -> Option<Value> {
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

pub(super) fn wait_felix(st: &LabState, limit: Duration) -> Result<(), LabError> {
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

pub(super) fn print_status(st: &LabState, out: &mut dyn Write) {
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
            "{:<9} {:<9} {:<14} {ports}{}",
            p.id,
            p.node,
            p.ip.as_deref().unwrap_or("-"),
            p.ip6
                .as_deref()
                .map(|ip6| format!(" (IPv6 {ip6})"))
                .unwrap_or_default()
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
pub(super) fn kube_view(st: &LabState) -> Result<Value, LabError> {
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

pub(super) fn text(v: &Value) -> String {
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

pub(super) fn status(which: &Which, json: bool, out: &mut dyn Write) -> Result<u8, LabError> {
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
                    "name": n.name, "netns": n.netns, "ip": n.ip, "ip6": n.ip6, "stopped": n.stopped,
                    "ready": s.as_ref().map(|s| s["ready"].clone()),
                    "dataplane_in_sync": s.as_ref().map(|s| s["dataplane"]["in_sync"].clone()),
                    "bgp": bgp,
                })
            })
            .collect();
        let kubernetes = st.is_kubernetes().then(|| {
            kube_view(&st).unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}))
        });
        let doc = serde_json::json!({"name": st.name, "datastore": st.datastore, "backend": st.backend, "tor": st.tor, "ipv6": st.ipv6, "nodes": nodes, "pods": st.pods, "kubernetes": kubernetes});
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
