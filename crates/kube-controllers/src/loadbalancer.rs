//! The loadbalancer controller (Calico's LB IPAM): Services of type LoadBalancer get an
//! ingress address from the IP pools whose `allowedUses` include `LoadBalancer`, written to
//! their `status.loadBalancer.ingress`; an address is released when its Service is gone or no
//! longer a LoadBalancer of this controller.
//!
//! Facts kept (Calico): the class is `calico` (a Service naming another
//! `spec.loadBalancerClass` is left to its controller; none means the default, which is this
//! one); the annotation `projectcalico.org/ipv4pools` (a JSON list of pool names or CIDRs)
//! narrows the pools; the allocation is made for the virtual host `load-balancer` under the
//! handle `lb-<sha256>`, so IPAM garbage collection (which leaves non-Kubernetes hosts
//! alone) never takes it. margay assigns one IPv4 address per Service; specific addresses
//! (`projectcalico.org/loadBalancerIPs`), IPv6 and `assignIPs: RequestedServicesOnly` are not
//! implemented yet.
//!
//! `wanted` and `handle_of` are pure; `run` lists and watches Services and reconciles after
//! each burst of changes, and every reconciler period.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::StreamExt;
use margay_api::ippool::AllowedUse;
use margay_datastore::AnyBackend;
use margay_datastore::kube::api::KubeApi;
use margay_datastore::kube::route::SERVICES;
use margay_ipam::{AssignArgs, Ipam};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// The class Calico's controller answers to.
pub const CLASS: &str = "calico";
/// The virtual host LoadBalancer addresses are allocated for (Calico's `load-balancer`).
pub const VIRTUAL_HOST: &str = "load-balancer";
pub const HANDLE_PREFIX: &str = "lb-";
pub const ANNOTATION_IPV4_POOLS: &str = "projectcalico.org/ipv4pools";
pub const ANNOTATION_LB_IPS: &str = "projectcalico.org/loadBalancerIPs";
/// Changes that arrive together are reconciled together.
const DEBOUNCE: Duration = Duration::from_millis(50);

fn str_at<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str)
}

/// The IPAM handle of a Service's address: `lb-` and the SHA-256 of `<namespace>/<name>`.
pub fn handle_of(namespace: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{HANDLE_PREFIX}{hex}")
}

/// A Service this controller gives an address: (namespace, name) → the pools it may use
/// (empty: every LoadBalancer pool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub namespace: String,
    pub name: String,
    pub pools: Vec<String>,
    /// The addresses its status shows now.
    pub ingress: Vec<String>,
}

/// The Services of type LoadBalancer of this controller's class.
pub fn wanted(services: &[Value]) -> Vec<Wanted> {
    let mut out = Vec::new();
    for s in services {
        if str_at(s, "/spec/type") != Some("LoadBalancer") {
            continue;
        }
        if str_at(s, "/spec/loadBalancerClass").is_some_and(|c| c != CLASS) {
            continue;
        }
        let (Some(ns), Some(name)) = (
            str_at(s, "/metadata/namespace"),
            str_at(s, "/metadata/name"),
        ) else {
            continue;
        };
        let annotation = |k: &str| {
            s.pointer("/metadata/annotations")
                .and_then(|a| a.get(k))
                .and_then(Value::as_str)
        };
        let pools = annotation(ANNOTATION_IPV4_POOLS)
            .and_then(|v| serde_json::from_str::<Vec<String>>(v).ok())
            .unwrap_or_default();
        let ingress = s
            .pointer("/status/loadBalancer/ingress")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|i| i.get("ip").and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        out.push(Wanted {
            namespace: ns.to_string(),
            name: name.to_string(),
            pools,
            ingress,
        });
    }
    out
}

/// One pass: every wanted Service holds one address and shows it; handles of Services no
/// longer wanted are released. Errors name what failed; the next pass retries.
pub async fn reconcile(api: &KubeApi, ipam: &Ipam<AnyBackend>) -> Result<usize, String> {
    let services = api
        .list_all(&SERVICES, None, None)
        .await
        .map_err(|e| format!("listing Services: {e}"))?
        .items;
    let wanted = wanted(&services);
    let mut changes = 0;
    let mut keep: BTreeSet<String> = BTreeSet::new();
    for w in &wanted {
        let handle = handle_of(&w.namespace, &w.name);
        keep.insert(handle.clone());
        let mut ips: Vec<String> = ipam
            .ips_by_handle(&handle)
            .await
            .map_err(|e| format!("reading handle {handle}: {e}"))?
            .into_iter()
            .map(|a| a.ip.to_string())
            .collect();
        if ips.is_empty() {
            let mut args = AssignArgs::new(handle.clone(), VIRTUAL_HOST);
            args.intended_use = AllowedUse::LoadBalancer;
            args.v4_pools = w.pools.clone();
            args.attrs = BTreeMap::from([
                ("service".to_string(), w.name.clone()),
                ("namespace".to_string(), w.namespace.clone()),
            ]);
            match ipam.auto_assign(&args).await {
                Ok(a) => {
                    ips = a.v4.iter().map(|a| a.ip.to_string()).collect();
                    tracing::info!(service = %format!("{}/{}", w.namespace, w.name), ips = ?ips, "assigned a LoadBalancer address");
                    changes += 1;
                }
                Err(e) => {
                    // One Service without a usable pool must not hold up the others.
                    tracing::warn!(service = %format!("{}/{}", w.namespace, w.name), error = %e, "no LoadBalancer address (add an IP pool with allowedUses: [LoadBalancer])");
                    continue;
                }
            }
        }
        ips.sort();
        let mut shown = w.ingress.clone();
        shown.sort();
        if shown != ips {
            let ingress: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
            api.merge_patch(
                &SERVICES,
                Some(&w.namespace),
                &w.name,
                Some("status"),
                &json!({"status": {"loadBalancer": {"ingress": ingress}}}),
            )
            .await
            .map_err(|e| {
                format!(
                    "writing the status of Service {}/{}: {e}",
                    w.namespace, w.name
                )
            })?;
            changes += 1;
        }
    }
    // Addresses of Services that are gone (or no longer LoadBalancers of this class).
    let handles = ipam
        .handles()
        .await
        .map_err(|e| format!("listing IPAM handles: {e}"))?;
    for (id, _) in handles {
        if id.starts_with(HANDLE_PREFIX) && !keep.contains(&id) {
            ipam.release_by_handle(&id)
                .await
                .map_err(|e| format!("releasing handle {id}: {e}"))?;
            tracing::info!(handle = %id, "released a LoadBalancer address (its Service is gone)");
            changes += 1;
        }
    }
    Ok(changes)
}

/// Runs until `stop` says so: a reconcile at start, after every burst of Service changes,
/// and every `period`.
pub async fn run(
    api: KubeApi,
    backend: AnyBackend,
    period: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let ipam = Ipam::new(backend);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    let trigger = tokio::spawn(watch_services(api.clone(), tx));
    let mut failures = 0u32;
    loop {
        let wait = match reconcile(&api, &ipam).await {
            Ok(_) => {
                failures = 0;
                period
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(error = %e, "loadbalancer controller: retrying");
                KubeApi::backoff(failures)
            }
        };
        tokio::select! {
            _ = stop.changed() => break,
            r = tokio::time::timeout(wait, rx.recv()) => {
                if let Ok(None) = r {
                    break;
                }
            }
        }
        tokio::time::sleep(DEBOUNCE).await;
        while rx.try_recv().is_ok() {}
    }
    trigger.abort();
}

/// Pokes `tx` on every Service change (re-watching after failures), until `tx` is closed.
async fn watch_services(api: KubeApi, tx: tokio::sync::mpsc::Sender<()>) {
    let mut failures = 0u32;
    while !tx.is_closed() {
        let Ok(rv) = api.current_revision(&SERVICES).await else {
            failures += 1;
            tokio::time::sleep(KubeApi::backoff(failures)).await;
            continue;
        };
        let _ = tx.try_send(());
        let Ok(stream) = api.watch(&SERVICES, None, None, &rv).await else {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loadbalancers_of_this_class_are_wanted() {
        let svc = |name: &str, spec: Value| {
            json!({"metadata": {"name": name, "namespace": "ns1",
                                "annotations": {"projectcalico.org/ipv4pools": "[\"lb-pool\"]"}},
                   "spec": spec,
                   "status": {"loadBalancer": {"ingress": [{"ip": "10.9.0.1"}]}}})
        };
        let all = [
            svc("a", json!({"type": "LoadBalancer"})),
            svc(
                "b",
                json!({"type": "LoadBalancer", "loadBalancerClass": "calico"}),
            ),
            svc(
                "c",
                json!({"type": "LoadBalancer", "loadBalancerClass": "metallb"}),
            ),
            svc("d", json!({"type": "ClusterIP"})),
        ];
        let w = wanted(&all);
        let names: Vec<&str> = w.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(w[0].pools, ["lb-pool"]);
        assert_eq!(w[0].ingress, ["10.9.0.1"]);
        let h = handle_of("ns1", "a");
        assert!(h.starts_with("lb-") && h.len() == 3 + 64, "{h}");
        assert_ne!(h, handle_of("ns1", "b"));
    }
}
