//! Changing a running lab: pods added and deleted (`lab pod add/delete`, as a kubelet does),
//! nodes' roles stopped and started (`lab node stop/start`), and the pod-readiness benchmark
//! (`lab bench --pod-ready N`). Every command that changes the state file holds the lab's
//! lock (`state.lock`) while it does.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::cli::{self, Which};
use crate::k8s;
use crate::kube::Api;
use crate::net::{self, LabError, other};
use crate::state::{LabState, PodState};
use crate::topology::{NamespaceSpec, PodSpec};

/// How long a stopped role gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// The roles `lab node stop` stops, by pid file in the node's directory (network-condition
/// first: on SIGTERM it marks the Node's network unavailable while Felix still runs).
// `bird6`: a dual-stack node's IPv6 BIRD (`up --ipv6 --backend bird`).
const NODE_ROLES: [&str; 5] = ["network-condition", "felix", "confd", "bird", "bird6"];

/// An exclusive lock on the lab's state, held until dropped.
pub struct StateLock(std::fs::File);

pub fn lock_state(dir: &Path) -> Result<StateLock, LabError> {
    let path = dir.join("state.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| other(format!("{}: {e}", path.display())))?;
    f.lock()
        .map_err(|e| other(format!("locking {}: {e}", path.display())))?;
    Ok(StateLock(f))
}

impl Drop for StateLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// The lab's API client when it runs on the Kubernetes datastore.
pub fn api_for(st: &LabState) -> Result<Option<Api>, LabError> {
    if st.is_kubernetes() {
        Api::connect(&st.kubeconfig()).map(Some)
    } else {
        Ok(None)
    }
}

fn split_id(id: &str) -> Result<(&str, &str), LabError> {
    id.split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
        .ok_or_else(|| other(format!("pod {id:?}: write it as namespace/name")))
}

/// A new sandbox's suffix for container IDs (unique per run of the pod).
fn sandbox_suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}", nanos & 0xffff_ffff_ffff)
}

/// The running node with the fewest pods.
fn least_loaded(st: &LabState) -> Option<String> {
    st.nodes
        .iter()
        .filter(|n| !n.stopped)
        .min_by_key(|n| st.pods.iter().filter(|p| p.node == n.name).count())
        .map(|n| n.name.clone())
}

/// Adds a pod to the lab and wires it; returns its address. On failure, what was made is
/// removed again and the state is as before.
pub fn add_pod(st: &mut LabState, api: Option<&Api>, spec: PodSpec) -> Result<String, LabError> {
    let node = st
        .node(&spec.node)
        .ok_or_else(|| {
            other(format!(
                "no node {:?} (nodes: {:?})",
                spec.node,
                st.nodes.iter().map(|n| &n.name).collect::<Vec<_>>()
            ))
        })?
        .clone();
    if node.stopped {
        return Err(other(format!(
            "node {} is stopped; start it first (`margay lab node start {}`)",
            node.name, node.name
        )));
    }
    let new_namespace = !st
        .topology
        .namespaces
        .iter()
        .any(|n| n.name == spec.namespace);
    let before = st.clone();
    st.topology
        .add_pod(spec.clone())
        .map_err(|e| other(e.to_string()))?;
    if new_namespace
        && let Some(ns) = st
            .topology
            .namespaces
            .iter()
            .find(|n| n.name == spec.namespace)
            .cloned()
    {
        let made = match api {
            Some(api) => cli::ensure_namespace(api, &ns),
            None => cli::apply_yaml(st, &cli::namespace_profiles(std::slice::from_ref(&ns))),
        };
        if let Err(e) = made {
            *st = before;
            return Err(e);
        }
    }
    st.pods.push(PodState::new(
        &st.prefix,
        &st.name,
        &spec,
        &sandbox_suffix(),
    ));
    let i = st.pods.len() - 1;
    st.save().map_err(|e| other(e.to_string()))?;
    match cli::wire_pod(st, i, api) {
        Ok(()) => Ok(st.pods[i].ip.clone().unwrap_or_default()),
        Err(e) => {
            let pod = st.pods[i].clone();
            let _ = teardown(st, api, &pod, &spec);
            let pods = before.pods.clone();
            let topology = before.topology.clone();
            st.pods = pods;
            st.topology = topology;
            let _ = st.save();
            Err(e)
        }
    }
}

/// Everything of a pod, in a kubelet's order: its processes, CNI DEL, its namespace, then
/// (Kubernetes) the Pod object. Carries on past failures and reports them all.
fn teardown(
    st: &LabState,
    api: Option<&Api>,
    pod: &PodState,
    spec: &PodSpec,
) -> Result<(), LabError> {
    let mut problems = Vec::new();
    net::kill_pid_file(&st.dir.join("pods").join(format!("{}.pid", pod.file_base())));
    if let Err(e) = cli::cni(st, pod, spec, "DEL") {
        problems.push(e.to_string());
    }
    let failed = net::remove_netns(std::slice::from_ref(&pod.netns));
    if !failed.is_empty() && net::netns_with_prefix(&pod.netns).contains(&pod.netns) {
        problems.push(format!("could not delete namespace {}", pod.netns));
    }
    if let Some(api) = api
        && let Err(e) = api.delete(&crate::kube::PODS, Some(&spec.namespace), &spec.name)
    {
        problems.push(e.to_string());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(other(problems.join("; ")))
    }
}

/// Deletes a pod (see [`teardown`]) and forgets it.
pub fn delete_pod(st: &mut LabState, api: Option<&Api>, id: &str) -> Result<(), LabError> {
    let pod = st
        .pod(id)
        .cloned()
        .ok_or_else(|| other(format!("no pod {id:?} in lab {:?}", st.name)))?;
    let spec = st
        .topology
        .pod(id)
        .cloned()
        .ok_or_else(|| other(format!("pod {id} is not in the topology")))?;
    let result = teardown(st, api, &pod, &spec);
    st.pods.retain(|p| p.id != id);
    st.topology.remove_pod(id);
    st.save().map_err(|e| other(e.to_string()))?;
    result
}

#[allow(clippy::too_many_arguments)]
pub fn pod_add_cmd(
    which: &Which,
    id: &str,
    node: Option<&str>,
    labels: &str,
    tcp: &[u16],
    udp: &[u16],
    out: &mut dyn Write,
) -> Result<u8, LabError> {
    let (namespace, name) = split_id(id)?;
    let labels = k8s::parse_labels(labels).map_err(other)?;
    let _lock = lock_state(&which.dir())?;
    let mut st = cli::load(which)?;
    let node = match node {
        Some(n) => n.to_string(),
        None => least_loaded(&st).ok_or_else(|| other("every node is stopped"))?,
    };
    let api = api_for(&st)?;
    let started = Instant::now();
    let spec = PodSpec {
        name: name.to_string(),
        namespace: namespace.to_string(),
        node: node.clone(),
        labels,
        tcp: tcp.to_vec(),
        udp: udp.to_vec(),
    };
    let ip = add_pod(&mut st, api.as_ref(), spec)?;
    // A dual-stack lab's pod has its IPv6 address too.
    let ip6 = st
        .pod(id)
        .and_then(|p| p.ip6.as_deref())
        .map(|ip6| format!(" and {ip6}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "pod {id} runs on {node} at {ip}{ip6} (wired in {:.2} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(0)
}

pub fn pod_delete_cmd(which: &Which, id: &str, out: &mut dyn Write) -> Result<u8, LabError> {
    split_id(id)?;
    let _lock = lock_state(&which.dir())?;
    let mut st = cli::load(which)?;
    let api = api_for(&st)?;
    delete_pod(&mut st, api.as_ref(), id)?;
    let _ = writeln!(out, "pod {id} deleted");
    Ok(0)
}

pub fn node_stop_cmd(which: &Which, node: &str, out: &mut dyn Write) -> Result<u8, LabError> {
    let _lock = lock_state(&which.dir())?;
    let mut st = cli::load(which)?;
    let dir = st.node_dir(node);
    let Some(n) = st.nodes.iter_mut().find(|n| n.name == node) else {
        return Err(other(format!("no node {node:?} in lab {:?}", which.name)));
    };
    let mut stopped = Vec::new();
    for role in NODE_ROLES {
        let pid = dir.join(format!("{role}.pid"));
        if pid.exists() {
            let killed = net::stop_pid_file(&pid, STOP_GRACE);
            stopped.push(if killed {
                format!("{role} (killed after {STOP_GRACE:?})")
            } else {
                role.to_string()
            });
        }
    }
    n.stopped = true;
    st.save().map_err(|e| other(e.to_string()))?;
    let _ = writeln!(
        out,
        "node {node} stopped: {}; its pods keep running on the dataplane as last programmed",
        if stopped.is_empty() {
            "nothing was running".to_string()
        } else {
            stopped.join(", ")
        }
    );
    Ok(0)
}

pub fn node_start_cmd(which: &Which, node: &str, out: &mut dyn Write) -> Result<u8, LabError> {
    let _lock = lock_state(&which.dir())?;
    let mut st = cli::load(which)?;
    let n = st
        .node(node)
        .cloned()
        .ok_or_else(|| other(format!("no node {node:?} in lab {:?}", which.name)))?;
    let exe = std::env::current_exe().map_err(|e| other(format!("the margay binary: {e}")))?;
    let dir = st.node_dir(node);
    if NODE_ROLES.iter().any(|r| {
        let pid = dir.join(format!("{r}.pid"));
        pid.exists() && net::pid_file_alive(&pid)
    }) {
        return Err(other(format!(
            "node {node} is running; stop it first (`margay lab node stop {node}`)"
        )));
    }
    let started = Instant::now();
    cli::node_startup(&st, &n)?;
    cli::start_felix(&st, &n, &exe)?;
    if st.backend == "bird" {
        cli::start_confd(&st, &n, &exe)?;
        cli::start_bird(&st, &n, &exe, Instant::now() + Duration::from_secs(30))?;
    }
    if st.is_kubernetes() {
        cli::start_network_condition(&st, &n, &exe)?;
    }
    cli::wait_node_felix(&st, &n.name, Instant::now() + Duration::from_secs(60))?;
    if let Some(node) = st.nodes.iter_mut().find(|x| x.name == node) {
        node.stopped = false;
    }
    st.save().map_err(|e| other(e.to_string()))?;
    if st.backend == "bird" {
        crate::bgp::wait_established(&st, Duration::from_secs(60))?;
    }
    let _ = writeln!(
        out,
        "node {node} started: start-up ran, Felix in sync after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(0)
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summary(label: &str, samples: &[Duration]) -> String {
    let mut s = samples.to_vec();
    s.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "{label:<40} p50 {:>7.0} ms   p90 {:>7.0} ms   p99 {:>7.0} ms   max {:>7.0} ms   (n={})",
        ms(percentile(&s, 50.0)),
        ms(percentile(&s, 90.0)),
        ms(percentile(&s, 99.0)),
        ms(percentile(&s, 100.0)),
        s.len()
    )
}

/// The benchmark's NetworkPolicy: pods `app=ready` of namespace `ns` admit only the client
/// (its namespace and labels).
fn bench_policy(ns: &str, client_ns: &str, client_labels: &BTreeMap<String, String>) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "bench-ready", "namespace": ns},
        "spec": {
            "podSelector": {"matchLabels": {"app": "ready"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": client_ns}},
                "podSelector": {"matchLabels": client_labels},
            }]}],
        },
    })
}

const BENCH_NS: &str = "bench";
const PROBE_TIMEOUT_MS: u64 = 200;
const REACH_LIMIT: Duration = Duration::from_secs(15);

/// `lab bench --pod-ready N`: pod created → reachable under policy.
pub fn pod_ready_bench(which: &Which, n: usize, out: &mut dyn Write) -> Result<u8, LabError> {
    let _lock = lock_state(&which.dir())?;
    let mut st = cli::load(which)?;
    let api = api_for(&st)?;
    let client = st
        .pods
        .iter()
        .find(|p| p.ip.is_some())
        .cloned()
        .ok_or_else(|| other("the bench needs a pod with an address (the client)"))?;
    let client_spec = st
        .topology
        .pod(&client.id)
        .cloned()
        .ok_or_else(|| other("the client pod is not in the topology"))?;
    // A pod the policy does not admit: another namespace's, else one with other labels.
    let refused = st
        .pods
        .iter()
        .filter(|p| p.ip.is_some() && p.id != client.id)
        .find(|p| {
            st.topology.pod(&p.id).is_some_and(|s| {
                s.namespace != client_spec.namespace || s.labels != client_spec.labels
            })
        })
        .cloned();
    let nodes: Vec<String> = st
        .nodes
        .iter()
        .filter(|n| !n.stopped)
        .map(|n| n.name.clone())
        .collect();
    if nodes.is_empty() {
        return Err(other("every node is stopped"));
    }
    if st
        .pods
        .iter()
        .any(|p| p.id.starts_with(&format!("{BENCH_NS}/")))
    {
        return Err(other(format!(
            "namespace {BENCH_NS} has pods already (a bench that was interrupted?); delete them with `margay lab pod delete`"
        )));
    }
    st.topology
        .add_namespace(NamespaceSpec {
            name: BENCH_NS.into(),
            labels: BTreeMap::from([("ns".to_string(), BENCH_NS.to_string())]),
        })
        .map_err(|e| other(e.to_string()))?;
    let policy = bench_policy(BENCH_NS, &client_spec.namespace, &client_spec.labels);
    let ns_spec = st
        .topology
        .namespaces
        .iter()
        .find(|x| x.name == BENCH_NS)
        .cloned()
        .ok_or_else(|| other("bench namespace"))?;
    match &api {
        Some(api) => {
            cli::ensure_namespace(api, &ns_spec)?;
            api.ensure(&crate::kube::K8S_NETWORK_POLICIES, &policy)?;
        }
        None => {
            cli::apply_yaml(&st, &cli::namespace_profiles(&[ns_spec]))?;
            cli::apply_yaml(&st, &policy.to_string())?;
        }
    }
    st.save().map_err(|e| other(e.to_string()))?;
    // Felix has the policy before the first pod comes.
    std::thread::sleep(Duration::from_secs(1));

    let mut wired = Vec::new();
    let mut reachable = Vec::new();
    let mut failures = Vec::new();
    let mut refusals = 0usize;
    for i in 0..n {
        let id = format!("{BENCH_NS}/ready-{i}");
        let spec = PodSpec {
            name: format!("ready-{i}"),
            namespace: BENCH_NS.into(),
            node: nodes[i % nodes.len()].clone(),
            labels: BTreeMap::from([("app".to_string(), "ready".to_string())]),
            tcp: vec![80],
            udp: vec![],
        };
        let t0 = Instant::now();
        if let Err(e) = add_pod(&mut st, api.as_ref(), spec) {
            failures.push(format!("{id}: {e}"));
            continue;
        }
        wired.push(t0.elapsed());
        let st_ref = &st;
        let (reached, refused_ok) = std::thread::scope(|s| {
            let refuse = refused.as_ref().map(|r| {
                let (from, to) = (r.id.clone(), id.clone());
                s.spawn(move || {
                    cli::probe(st_ref, &from, &to, 80, false, 2 * PROBE_TIMEOUT_MS)
                        .map(|ok| !ok)
                        .unwrap_or(false)
                })
            });
            let mut reached = None;
            while t0.elapsed() < REACH_LIMIT {
                if cli::probe(st_ref, &client.id, &id, 80, false, PROBE_TIMEOUT_MS).unwrap_or(false)
                {
                    reached = Some(t0.elapsed());
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let refused_ok = refuse.map(|h| h.join().unwrap_or(false));
            (reached, refused_ok)
        });
        match reached {
            Some(t) => reachable.push(t),
            None => failures.push(format!(
                "{id}: {} did not reach it within {REACH_LIMIT:?}",
                client.id
            )),
        }
        match refused_ok {
            Some(true) => refusals += 1,
            Some(false) => failures.push(format!(
                "{id}: {} reached it, which the policy does not admit",
                refused.as_ref().map(|r| r.id.as_str()).unwrap_or("?")
            )),
            None => {}
        }
    }
    // Clean up: the bench's pods, policy and namespace.
    let ids: Vec<String> = st
        .pods
        .iter()
        .filter(|p| p.id.starts_with(&format!("{BENCH_NS}/")))
        .map(|p| p.id.clone())
        .collect();
    for id in ids {
        if let Err(e) = delete_pod(&mut st, api.as_ref(), &id) {
            failures.push(format!("deleting {id}: {e}"));
        }
    }
    match &api {
        Some(api) => {
            let _ = api.delete(
                &crate::kube::K8S_NETWORK_POLICIES,
                Some(BENCH_NS),
                "bench-ready",
            );
            let _ = api.delete(&crate::kube::NAMESPACES, None, BENCH_NS);
        }
        None => {
            let file = st.dir.join("bench-ready.yaml");
            let _ = std::fs::write(
                &file,
                format!(
                    "{policy}\n---\napiVersion: projectcalico.org/v3\nkind: Profile\nmetadata: {{name: kns.{BENCH_NS}}}\n"
                ),
            );
            if let Ok(mut c) = cli::margay_in(&st, &st.fabric_netns()) {
                c.args(["ctl", "delete", "-f"]).arg(&file);
                let _ = net::run(&mut c);
            }
            let _ = std::fs::remove_file(&file);
        }
    }
    st.topology.namespaces.retain(|x| x.name != BENCH_NS);
    st.save().map_err(|e| other(e.to_string()))?;

    let _ = writeln!(
        out,
        "pod created -> reachable under policy ({} datastore, {} backend; client {}, probes every ~{PROBE_TIMEOUT_MS} ms at most)",
        st.datastore, st.backend, client.id
    );
    let _ = writeln!(
        out,
        "{}",
        summary("wired (CNI ADD returned, pod serving)", &wired)
    );
    let _ = writeln!(
        out,
        "{}",
        summary("reachable from the admitted client", &reachable)
    );
    if let Some(r) = &refused {
        let _ = writeln!(
            out,
            "refused from {} (not admitted): {refusals}/{} pods",
            r.id,
            wired.len()
        );
    }
    for f in &failures {
        let _ = writeln!(out, "FAILED {f}");
    }
    Ok(if failures.is_empty() && reachable.len() == n {
        0
    } else {
        1
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let s: Vec<Duration> = (1..=10).map(Duration::from_millis).collect();
        assert_eq!(percentile(&s, 50.0), Duration::from_millis(5));
        assert_eq!(percentile(&s, 90.0), Duration::from_millis(9));
        assert_eq!(percentile(&s, 99.0), Duration::from_millis(10));
        assert_eq!(percentile(&s, 100.0), Duration::from_millis(10));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }

    #[test]
    fn the_bench_policy_admits_the_client_only() {
        let p = bench_policy(
            "bench",
            "x",
            &BTreeMap::from([("pod".to_string(), "a".to_string())]),
        );
        let from = &p["spec"]["ingress"][0]["from"][0];
        assert_eq!(
            from["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "x"
        );
        assert_eq!(from["podSelector"]["matchLabels"]["pod"], "a");
        assert_eq!(p["spec"]["podSelector"]["matchLabels"]["app"], "ready");
        assert!(split_id("x/a").is_ok());
        for bad in ["xa", "/a", "x/", "x/a/b"] {
            assert!(split_id(bad).is_err(), "{bad}");
        }
    }
}
