//! The lab's EndpointSlice controller (`--datastore kubernetes`): no kube-controller-manager
//! runs in the lab, so the lab plays its part for Services, as Kubernetes' EndpointSlice
//! controller does: for every Service with a selector, the pods of its namespace whose labels
//! match, as endpoints of slices labelled `kubernetes.io/service-name` and
//! `endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io`.
//!
//! Facts kept (Kubernetes' controller): an endpoint is a pod with an IP; `ready` is the pod's
//! Ready condition (always true with `publishNotReadyAddresses`), `serving` likewise,
//! `terminating` a pod with a deletionTimestamp (never ready then); named target ports are
//! resolved against each pod's container ports, and pods that resolve them differently land
//! in different slices; a pod that cannot resolve a port is left out of that slice's port; a
//! Service without endpoints keeps one empty slice; a Service without a selector is the
//! user's to fill (nothing is written); slices of Services that are gone are deleted.
//!
//! `desired` is pure (Services and Pods in, slices out); `run` keeps the API in step: it
//! watches Services and Pods and reconciles everything after each burst of changes (the lab
//! holds tens of objects), and every 30 s whatever happens.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::StreamExt;
use margay_datastore::kube::api::{ApiError, KubeApi, resource_version};
use margay_datastore::kube::route::{ApiResource, ENDPOINT_SLICES, PODS, SERVICES};
use serde_json::{Value, json};

pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// Kubernetes' own controller's name: Felix and Typha treat the lab's slices as real ones.
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
/// Kubernetes' limit of endpoints in one slice.
const MAX_ENDPOINTS: usize = 100;
/// Reconcile this often even without changes (a missed watch event heals).
const RESYNC: Duration = Duration::from_secs(30);
/// Changes that arrive together are reconciled together.
const DEBOUNCE: Duration = Duration::from_millis(20);

fn str_at<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str)
}

fn labels(v: &Value) -> BTreeMap<String, String> {
    v.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// One service port: its name, protocol and target (a number or a container port's name).
#[derive(Debug, Clone)]
struct Port {
    name: String,
    protocol: String,
    target: Target,
}

#[derive(Debug, Clone)]
enum Target {
    Number(u16),
    Named(String),
}

fn service_ports(svc: &Value) -> Vec<Port> {
    let Some(ports) = svc.pointer("/spec/ports").and_then(Value::as_array) else {
        return Vec::new();
    };
    ports
        .iter()
        .filter_map(|p| {
            let port = p.get("port").and_then(Value::as_u64)?;
            let target = match p.get("targetPort") {
                Some(Value::String(s)) => match s.parse::<u16>() {
                    Ok(n) => Target::Number(n),
                    Err(_) => Target::Named(s.clone()),
                },
                Some(Value::Number(n)) => Target::Number(u16::try_from(n.as_u64()?).ok()?),
                _ => Target::Number(u16::try_from(port).ok()?),
            };
            Some(Port {
                name: p
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                protocol: p
                    .get("protocol")
                    .and_then(Value::as_str)
                    .unwrap_or("TCP")
                    .to_string(),
                target,
            })
        })
        .collect()
}

/// The pod's number for a target port (None: a name none of its containers' ports has).
fn resolve(pod: &Value, port: &Port) -> Option<u16> {
    match &port.target {
        Target::Number(n) => Some(*n),
        Target::Named(name) => pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)?
            .iter()
            .filter_map(|c| c.get("ports").and_then(Value::as_array))
            .flatten()
            .find(|cp| {
                cp.get("name").and_then(Value::as_str) == Some(name)
                    && cp.get("protocol").and_then(Value::as_str).unwrap_or("TCP") == port.protocol
            })
            .and_then(|cp| cp.get("containerPort").and_then(Value::as_u64))
            .and_then(|n| u16::try_from(n).ok()),
    }
}

fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

/// The EndpointSlices the controller wants, by (namespace, name).
pub fn desired(services: &[Value], pods: &[Value]) -> BTreeMap<(String, String), Value> {
    let mut out = BTreeMap::new();
    for svc in services {
        let (Some(ns), Some(name)) = (
            str_at(svc, "/metadata/namespace"),
            str_at(svc, "/metadata/name"),
        ) else {
            continue;
        };
        let Some(selector) = svc.pointer("/spec/selector").and_then(Value::as_object) else {
            continue; // no selector: the user's slices
        };
        if selector.is_empty() || str_at(svc, "/spec/type") == Some("ExternalName") {
            continue;
        }
        let selector: BTreeMap<&str, &str> = selector
            .iter()
            .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
            .collect();
        let publish_not_ready = svc
            .pointer("/spec/publishNotReadyAddresses")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let ports = service_ports(svc);
        // Endpoints grouped by how their pod resolves the ports.
        let mut groups: BTreeMap<Vec<(usize, u16)>, Vec<Value>> = BTreeMap::new();
        let mut matching: Vec<&Value> = pods
            .iter()
            .filter(|p| str_at(p, "/metadata/namespace") == Some(ns))
            .filter(|p| {
                let l = labels(p);
                selector
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        matching.sort_by_key(|p| str_at(p, "/metadata/name").unwrap_or_default().to_string());
        for pod in matching {
            let Some(ip) = str_at(pod, "/status/podIP").filter(|ip| !ip.is_empty()) else {
                continue;
            };
            if ip.contains(':') {
                continue; // IPv4 slices only
            }
            let terminating = pod.pointer("/metadata/deletionTimestamp").is_some();
            let ready = !terminating && (publish_not_ready || pod_ready(pod));
            let serving = publish_not_ready || pod_ready(pod);
            let resolved: Vec<(usize, u16)> = ports
                .iter()
                .enumerate()
                .filter_map(|(i, p)| Some((i, resolve(pod, p)?)))
                .collect();
            let mut ep = json!({
                "addresses": [ip],
                "conditions": {"ready": ready, "serving": serving, "terminating": terminating},
                "targetRef": {
                    "kind": "Pod",
                    "namespace": ns,
                    "name": str_at(pod, "/metadata/name").unwrap_or_default(),
                    "uid": str_at(pod, "/metadata/uid").unwrap_or_default(),
                },
            });
            if let Some(node) = str_at(pod, "/spec/nodeName") {
                ep["nodeName"] = json!(node);
            }
            groups.entry(resolved).or_default().push(ep);
        }
        if groups.is_empty() {
            // Kubernetes keeps one slice without endpoints or ports for such a Service.
            groups.insert(Vec::new(), Vec::new());
        }
        let mut index = 0usize;
        for (resolved, eps) in groups {
            let slice_ports: Vec<Value> = resolved
                .iter()
                .map(|(i, n)| {
                    let p = &ports[*i];
                    json!({"name": p.name, "protocol": p.protocol, "port": n})
                })
                .collect();
            for chunk in eps.chunks(MAX_ENDPOINTS.max(1)).chain(
                // An empty group still makes its (empty) slice.
                eps.is_empty().then_some(&[][..]),
            ) {
                let slice_name = format!("{}-{index:05x}", truncate(name, 57));
                index += 1;
                let mut slice = json!({
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        "name": slice_name,
                        "namespace": ns,
                        "labels": {LABEL_SERVICE_NAME: name, LABEL_MANAGED_BY: MANAGED_BY},
                    },
                    "addressType": "IPv4",
                    "ports": slice_ports,
                    "endpoints": chunk,
                });
                if let Some(uid) = str_at(svc, "/metadata/uid") {
                    slice["metadata"]["ownerReferences"] = json!([{
                        "apiVersion": "v1", "kind": "Service", "name": name, "uid": uid,
                        "controller": true, "blockOwnerDeletion": true,
                    }]);
                }
                out.insert((ns.to_string(), slice_name), slice);
            }
        }
    }
    out
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => s[..i].trim_end_matches('-'),
        None => s,
    }
}

/// Whether an existing slice already says what the wanted one says.
fn same(existing: &Value, want: &Value) -> bool {
    let norm = |v: &Value, f: &str| match v.get(f) {
        None | Some(Value::Null) => json!([]),
        Some(x) => x.clone(),
    };
    labels(existing) == labels(want)
        && norm(existing, "ports") == norm(want, "ports")
        && norm(existing, "endpoints") == norm(want, "endpoints")
}

/// The writes that bring `existing` (the controller's slices) to `want`.
#[derive(Debug, PartialEq)]
pub enum Write {
    Create(Value),
    Replace(Value),
    Delete { namespace: String, name: String },
}

pub fn plan(
    existing: &BTreeMap<(String, String), Value>,
    want: &BTreeMap<(String, String), Value>,
) -> Vec<Write> {
    let mut out = Vec::new();
    for (id, w) in want {
        match existing.get(id) {
            None => out.push(Write::Create(w.clone())),
            Some(e) if !same(e, w) => {
                let mut r = w.clone();
                if let Some(rv) = resource_version(e) {
                    r["metadata"]["resourceVersion"] = json!(rv);
                }
                out.push(Write::Replace(r));
            }
            Some(_) => {}
        }
    }
    let wanted: BTreeSet<&(String, String)> = want.keys().collect();
    for id in existing.keys().filter(|id| !wanted.contains(id)) {
        out.push(Write::Delete {
            namespace: id.0.clone(),
            name: id.1.clone(),
        });
    }
    out
}

/// One pass: lists, compares, writes. Errors name what failed; the next pass retries.
pub async fn reconcile(api: &KubeApi) -> Result<usize, String> {
    let list = |res: ApiResource, sel: Option<&'static str>| async move {
        api.list_all(&res, None, sel)
            .await
            .map(|l| l.items)
            .map_err(|e| format!("listing {}: {e}", res.display()))
    };
    let services = list(SERVICES, None).await?;
    let pods = list(PODS, None).await?;
    let selector = "endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io";
    let existing: BTreeMap<(String, String), Value> = list(ENDPOINT_SLICES, Some(selector))
        .await?
        .into_iter()
        .filter_map(|s| {
            let id = (
                str_at(&s, "/metadata/namespace")?.to_string(),
                str_at(&s, "/metadata/name")?.to_string(),
            );
            Some((id, s))
        })
        .collect();
    let writes = plan(&existing, &desired(&services, &pods));
    let n = writes.len();
    for w in writes {
        let r = match &w {
            Write::Create(s) => api
                .create(&ENDPOINT_SLICES, str_at(s, "/metadata/namespace"), s)
                .await
                .map(drop),
            Write::Replace(s) => api
                .replace(
                    &ENDPOINT_SLICES,
                    str_at(s, "/metadata/namespace"),
                    str_at(s, "/metadata/name").unwrap_or_default(),
                    s,
                )
                .await
                .map(drop),
            Write::Delete { namespace, name } => {
                match api
                    .delete(&ENDPOINT_SLICES, Some(namespace), name, None)
                    .await
                {
                    Ok(_) | Err(ApiError::NotFound) => Ok(()),
                    Err(e) => Err(e),
                }
            }
        };
        r.map_err(|e| format!("writing EndpointSlices ({w:?}): {e}"))?;
    }
    Ok(n)
}

/// Watches `res` and pokes `tx` on every change, until `tx` is closed.
async fn trigger(api: KubeApi, res: ApiResource, tx: tokio::sync::mpsc::Sender<()>) {
    let mut failures = 0u32;
    loop {
        if tx.is_closed() {
            return;
        }
        let rv = match api.current_revision(&res).await {
            Ok(rv) => rv,
            Err(_) => {
                failures += 1;
                tokio::time::sleep(KubeApi::backoff(failures)).await;
                continue;
            }
        };
        // A change between the last reconcile and this watch is covered by this poke.
        let _ = tx.try_send(());
        let Ok(stream) = api.watch(&res, None, None, &rv).await else {
            failures += 1;
            tokio::time::sleep(KubeApi::backoff(failures)).await;
            continue;
        };
        failures = 0;
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if ev.is_err() {
                break;
            }
            let _ = tx.try_send(());
        }
    }
}

/// Runs the controller until the task is dropped.
pub async fn run(api: KubeApi) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    let services = tokio::spawn(trigger(api.clone(), SERVICES, tx.clone()));
    let pods = tokio::spawn(trigger(api.clone(), PODS, tx));
    let mut failures = 0u32;
    loop {
        match reconcile(&api).await {
            Ok(n) => {
                failures = 0;
                if n > 0 {
                    eprintln!("margay lab apiserver: EndpointSlices: {n} written");
                }
            }
            Err(e) => {
                failures += 1;
                eprintln!("margay lab apiserver: EndpointSlice controller: {e}; retrying");
                tokio::time::sleep(KubeApi::backoff(failures)).await;
                continue;
            }
        }
        // A poke, or the periodic resync; None: every trigger is gone.
        if let Ok(None) = tokio::time::timeout(RESYNC, rx.recv()).await {
            break;
        }
        tokio::time::sleep(DEBOUNCE).await;
        while rx.try_recv().is_ok() {}
    }
    services.abort();
    pods.abort();
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn svc(selector: Value, ports: Value) -> Value {
        json!({"metadata": {"name": "web", "namespace": "ns1", "uid": "u1"},
               "spec": {"selector": selector, "ports": ports}})
    }

    fn pod(name: &str, ip: &str, ready: bool, labels: Value, ports: Value) -> Value {
        json!({"metadata": {"name": name, "namespace": "ns1", "uid": format!("uid-{name}"), "labels": labels},
               "spec": {"nodeName": "node1", "containers": [{"name": "c", "ports": ports}]},
               "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}})
    }

    #[test]
    fn slices_follow_selector_readiness_and_named_ports() {
        let s = svc(
            json!({"app": "web"}),
            json!([{"name": "http", "port": 80, "targetPort": "web-port"},
                   {"name": "metrics", "port": 9090, "targetPort": 9090}]),
        );
        let pods = vec![
            pod(
                "a",
                "10.0.0.1",
                true,
                json!({"app": "web"}),
                json!([{"name": "web-port", "containerPort": 8080}]),
            ),
            pod(
                "b",
                "10.0.0.2",
                false,
                json!({"app": "web"}),
                json!([{"name": "web-port", "containerPort": 8080}]),
            ),
            // Another number for the named port: its own slice.
            pod(
                "c",
                "10.0.0.3",
                true,
                json!({"app": "web"}),
                json!([{"name": "web-port", "containerPort": 8081}]),
            ),
            pod("other", "10.0.0.4", true, json!({"app": "db"}), json!([])),
        ];
        let want = desired(std::slice::from_ref(&s), &pods);
        assert_eq!(want.len(), 2, "{want:?}");
        let slices: Vec<&Value> = want.values().collect();
        let first = slices[0];
        assert_eq!(first["metadata"]["labels"][LABEL_SERVICE_NAME], "web");
        assert_eq!(first["metadata"]["labels"][LABEL_MANAGED_BY], MANAGED_BY);
        let ports: Vec<u64> = first["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["port"].as_u64().unwrap())
            .collect();
        assert_eq!(ports, [8080, 9090]);
        let eps = first["endpoints"].as_array().unwrap();
        assert_eq!(eps.len(), 2);
        assert_eq!(eps[0]["addresses"][0], "10.0.0.1");
        assert_eq!(eps[0]["conditions"]["ready"], true);
        assert_eq!(eps[1]["conditions"]["ready"], false);
        assert_eq!(eps[0]["nodeName"], "node1");
        assert_eq!(slices[1]["ports"][0]["port"], 8081);

        // No matching pods: one empty slice. No selector: nothing.
        let none = desired(&[s], &[]);
        assert_eq!(none.len(), 1);
        assert_eq!(none.values().next().unwrap()["endpoints"], json!([]));
        let manual = json!({"metadata": {"name": "m", "namespace": "ns1"}, "spec": {"ports": [{"port": 1}]}});
        assert!(desired(&[manual], &pods).is_empty());
    }

    #[test]
    fn a_terminating_pod_serves_but_is_not_ready() {
        let s = svc(json!({"app": "web"}), json!([{"port": 80}]));
        let mut p = pod("a", "10.0.0.1", true, json!({"app": "web"}), json!([]));
        p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let want = desired(&[s], &[p]);
        let ep = &want.values().next().unwrap()["endpoints"][0];
        assert_eq!(
            ep["conditions"],
            json!({"ready": false, "serving": true, "terminating": true})
        );
    }

    #[test]
    fn plans_only_the_differences() {
        let s = svc(json!({"app": "web"}), json!([{"port": 80}]));
        let p = pod("a", "10.0.0.1", true, json!({"app": "web"}), json!([]));
        let want = desired(std::slice::from_ref(&s), std::slice::from_ref(&p));
        assert!(matches!(
            plan(&BTreeMap::new(), &want)[..],
            [Write::Create(_)]
        ));
        let mut existing = want.clone();
        for v in existing.values_mut() {
            v["metadata"]["resourceVersion"] = json!("7");
        }
        assert!(plan(&existing, &want).is_empty());
        let changed = desired(&[s], &[]);
        let w = plan(&existing, &changed);
        assert!(
            matches!(&w[..], [Write::Replace(r)] if r["metadata"]["resourceVersion"] == "7"),
            "{w:?}"
        );
        let w = plan(&existing, &BTreeMap::new());
        assert!(matches!(&w[..], [Write::Delete { name, .. }] if name == "web-00000"));
    }
}
