//! Kubernetes Services and EndpointSlices for the service proxy: where Felix reads them and
//! how they reach the calculation thread.
//!
//! Calico's Felix watches Services and EndpointSlices in the Kubernetes datastore, and in etcd
//! mode reads them from the Kubernetes API all the same when one is configured. margay does
//! likewise: with DatastoreType=kubernetes the datastore's own client is used; otherwise a
//! Kubernetes API named by KUBECONFIG / K8S_API_ENDPOINT / the in-cluster environment; with
//! none, Services are not proxied (said once, at info). Through Typha they come from Typha's
//! stream instead (`typha_feed`).
//!
//! The watch never stops Felix: failures are retried with backoff and shown by the
//! `KubernetesServices` health reporter (not ready while the API cannot be read). The
//! pipeline's first in-sync waits for the services' first complete listing, so no service is
//! programmed without its endpoints — but at most [`SERVICES_SYNC_GRACE`]: an unreachable API
//! must not keep the rest of the dataplane unprogrammed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc as smpsc;
use std::time::Duration;

use margay_calc::services::{KubeEndpointSlice, KubeService};
use margay_datastore::kube::KubeBackend;
use margay_datastore::kube::api::KubeApi;
use margay_datastore::kube::services::{ServiceEvent, ServiceObjectKind, watch_services_reporting};
use margay_datastore::{AnyBackend, DatastoreConfig, DatastoreType, KubeSettings};
use tokio::sync::{mpsc, watch};

use super::{CalcInput, Shared};

/// The health reporter of the Services watch.
pub const SERVICES_HEALTH: &str = "KubernetesServices";
/// How long the first in-sync waits for the services' first listing.
pub const SERVICES_SYNC_GRACE: Duration = Duration::from_secs(20);

/// One Service or EndpointSlice change, decoded for the calculation graph.
#[derive(Debug, Clone)]
pub enum ServiceInput {
    Service {
        namespace: String,
        name: String,
        service: Option<Box<KubeService>>,
    },
    Slice {
        namespace: String,
        name: String,
        slice: Option<Box<KubeEndpointSlice>>,
    },
    /// Everything before this describes the cluster's services (or the grace ran out).
    InSync,
}

/// Decodes one watch event. An object that does not decode counts as deleted (a proxy must
/// not keep serving a service it can no longer read), with a warning naming it.
pub fn decode(ev: ServiceEvent) -> ServiceInput {
    match ev {
        ServiceEvent::InSync => ServiceInput::InSync,
        ServiceEvent::Update {
            kind,
            namespace,
            name,
            object,
        } => {
            let what = match kind {
                ServiceObjectKind::Service => "Service",
                ServiceObjectKind::EndpointSlice => "EndpointSlice",
            };
            let warn = |e: &serde_json::Error| {
                tracing::warn!(object = %format!("{what} {namespace}/{name}"), error = %e, "cannot read it; treating it as deleted");
            };
            match kind {
                ServiceObjectKind::Service => ServiceInput::Service {
                    service: object.and_then(|o| {
                        serde_json::from_value::<KubeService>(o)
                            .map_err(|e| warn(&e))
                            .ok()
                            .map(Box::new)
                    }),
                    namespace,
                    name,
                },
                ServiceObjectKind::EndpointSlice => ServiceInput::Slice {
                    slice: object.and_then(|o| {
                        serde_json::from_value::<KubeEndpointSlice>(o)
                            .map_err(|e| warn(&e))
                            .ok()
                            .map(Box::new)
                    }),
                    namespace,
                    name,
                },
            }
        }
    }
}

/// Applies decoded inputs to the graph; true when they included the in-sync.
pub fn apply(graph: &mut margay_calc::CalcGraph, inputs: Vec<ServiceInput>) -> bool {
    let mut in_sync = false;
    for i in inputs {
        match i {
            ServiceInput::Service {
                namespace,
                name,
                service,
            } => graph.on_kube_service(&namespace, &name, service.as_deref()),
            ServiceInput::Slice {
                namespace,
                name,
                slice,
            } => graph.on_endpoint_slice(&namespace, &name, slice.as_deref()),
            ServiceInput::InSync => in_sync = true,
        }
    }
    in_sync
}

/// Where to read Services from, when Felix reads the datastore itself.
pub enum ServiceSource {
    /// The Kubernetes datastore's own client.
    Datastore(KubeApi),
    /// Another Kubernetes API (etcd or embedded-store mode with one configured).
    Settings(KubeSettings),
    /// No Kubernetes API: Services are not proxied.
    None,
}

/// Whether a Kubernetes API is configured beside a non-Kubernetes datastore: KUBECONFIG (or
/// an inline kubeconfig), K8S_API_ENDPOINT, or the in-cluster service environment. The
/// `$HOME/.kube/config` fallback of the Kubernetes datastore is not used here: an operator's
/// personal kubeconfig on an etcd-mode node must not make Felix proxy another cluster.
pub fn service_source(
    env: &BTreeMap<String, String>,
    cfg: &DatastoreConfig,
    backend: &AnyBackend,
) -> ServiceSource {
    if let AnyBackend::Kube(b) = backend {
        return ServiceSource::Datastore(b.api().clone());
    }
    if cfg.datastore_type == DatastoreType::Kubernetes {
        return ServiceSource::None;
    }
    let k = &cfg.kube;
    let in_cluster = env
        .get("KUBERNETES_SERVICE_HOST")
        .is_some_and(|h| !h.trim().is_empty());
    if !k.kubeconfig.is_empty()
        || k.kubeconfig_inline.is_some()
        || k.api_endpoint.is_some()
        || in_cluster
    {
        ServiceSource::Settings(k.clone())
    } else {
        ServiceSource::None
    }
}

/// Starts the watch (Felix reads the datastore itself). Returns None when there is nothing to
/// watch; the caller then treats services as in sync.
pub(super) fn start(
    source: ServiceSource,
    calc_tx: smpsc::Sender<CalcInput>,
    shared: Arc<Shared>,
) -> Option<tokio::task::JoinHandle<()>> {
    let api_source = match source {
        ServiceSource::None => {
            tracing::info!(
                "No Kubernetes API configured (KUBECONFIG, K8S_API_ENDPOINT or in-cluster): \
                 Kubernetes Services are not proxied by this Felix"
            );
            return None;
        }
        s => s,
    };
    shared
        .health
        .register(SERVICES_HEALTH, false, true, Duration::ZERO);
    shared.health.report(SERVICES_HEALTH, true, false);
    Some(tokio::spawn(async move {
        let api = match api_source {
            ServiceSource::Datastore(api) => api,
            ServiceSource::Settings(s) => match connect(&s, &calc_tx, &shared).await {
                Some(api) => api,
                None => return,
            },
            ServiceSource::None => return,
        };
        tracing::info!("Watching Kubernetes Services and EndpointSlices (service proxy)");
        run(api, calc_tx, shared).await;
    }))
}

/// A client for the configured API, retried with backoff (a bad kubeconfig is fixed by its
/// operator without restarting Felix). None: the pipeline is gone.
async fn connect(
    s: &KubeSettings,
    calc_tx: &smpsc::Sender<CalcInput>,
    shared: &Shared,
) -> Option<KubeApi> {
    let mut attempt = 0u32;
    let mut grace_sent = false;
    let started = tokio::time::Instant::now();
    loop {
        match KubeBackend::connect(s).await {
            Ok(b) => return Some(b.api().clone()),
            Err(e) => {
                attempt += 1;
                let msg = format!("cannot reach the Kubernetes API for Services: {e}");
                if attempt == 1 || attempt.is_multiple_of(30) {
                    tracing::warn!("{msg}; retrying");
                }
                shared
                    .health
                    .report_detail(SERVICES_HEALTH, true, false, &msg);
                if !grace_sent && started.elapsed() >= SERVICES_SYNC_GRACE {
                    grace_sent = true;
                    tracing::warn!(
                        "Services are not listed yet; programming the dataplane without them"
                    );
                    if calc_tx
                        .send(CalcInput::Services(vec![ServiceInput::InSync]))
                        .is_err()
                    {
                        return None;
                    }
                }
                tokio::time::sleep(KubeApi::backoff(attempt)).await;
            }
        }
    }
}

async fn run(api: KubeApi, calc_tx: smpsc::Sender<CalcInput>, shared: Arc<Shared>) {
    let (tx, mut rx) = mpsc::channel::<Vec<ServiceEvent>>(16);
    let (health_tx, mut health_rx) = watch::channel::<Option<String>>(None);
    let watcher = tokio::spawn(watch_services_reporting(api, tx, health_tx));
    let grace = tokio::time::sleep(SERVICES_SYNC_GRACE);
    tokio::pin!(grace);
    let mut in_sync = false;
    let mut grace_over = false;
    loop {
        tokio::select! {
            batch = rx.recv() => {
                let Some(batch) = batch else { break };
                let inputs: Vec<ServiceInput> = batch.into_iter().map(decode).collect();
                if inputs.iter().any(|i| matches!(i, ServiceInput::InSync)) {
                    in_sync = true;
                    tracing::info!("Kubernetes Services and EndpointSlices listed");
                }
                if calc_tx.send(CalcInput::Services(inputs)).is_err() {
                    break;
                }
                report(&shared, in_sync, health_rx.borrow().as_deref());
            }
            changed = health_rx.changed() => {
                if changed.is_err() {
                    break;
                }
                let err = health_rx.borrow_and_update().clone();
                if let Some(e) = &err {
                    tracing::warn!(error = %e, "Kubernetes Services watch failing; retrying with backoff");
                }
                report(&shared, in_sync, err.as_deref());
            }
            _ = &mut grace, if !grace_over && !in_sync => {
                grace_over = true;
                tracing::warn!(grace = ?SERVICES_SYNC_GRACE, "Services are not listed yet; programming the dataplane without them");
                if calc_tx.send(CalcInput::Services(vec![ServiceInput::InSync])).is_err() {
                    break;
                }
            }
        }
    }
    watcher.abort();
}

fn report(shared: &Shared, in_sync: bool, err: Option<&str>) {
    match err {
        Some(e) => shared.health.report_detail(SERVICES_HEALTH, true, false, e),
        None => shared.health.report(SERVICES_HEALTH, true, in_sync),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use margay_datastore::MemBackend;

    fn cfg(env: &[(&str, &str)]) -> (BTreeMap<String, String>, DatastoreConfig) {
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let c = DatastoreConfig::from_lookup(|k| env.get(k).cloned()).unwrap();
        (env, c)
    }

    #[test]
    fn a_kubernetes_api_is_used_only_when_one_is_named() {
        let mem = AnyBackend::Mem(MemBackend::new());
        let (env, c) = cfg(&[
            ("DATASTORE_TYPE", "etcdv3"),
            ("ETCD_ENDPOINTS", "http://e:2379"),
        ]);
        assert!(matches!(
            service_source(&env, &c, &mem),
            ServiceSource::None
        ));
        // The operator's own ~/.kube/config is not a reason to proxy some cluster.
        let (env, c) = cfg(&[("ETCD_ENDPOINTS", "http://e:2379"), ("HOME", "/root")]);
        assert!(matches!(
            service_source(&env, &c, &mem),
            ServiceSource::None
        ));
        let (env, c) = cfg(&[
            ("ETCD_ENDPOINTS", "http://e:2379"),
            ("KUBECONFIG", "/k/config"),
        ]);
        assert!(matches!(
            service_source(&env, &c, &mem),
            ServiceSource::Settings(s) if s.kubeconfig == [std::path::PathBuf::from("/k/config")]
        ));
        let (env, c) = cfg(&[("KUBERNETES_SERVICE_HOST", "10.96.0.1")]);
        assert!(matches!(
            service_source(&env, &c, &mem),
            ServiceSource::Settings(_)
        ));
    }

    #[test]
    fn undecodable_objects_count_as_deleted() {
        let bad = decode(ServiceEvent::Update {
            kind: ServiceObjectKind::Service,
            namespace: "ns1".into(),
            name: "web".into(),
            object: Some(serde_json::json!({"spec": {"ports": "not a list"}})),
        });
        assert!(matches!(bad, ServiceInput::Service { service: None, .. }));
        let good = decode(ServiceEvent::Update {
            kind: ServiceObjectKind::EndpointSlice,
            namespace: "ns1".into(),
            name: "web-1".into(),
            object: Some(serde_json::json!({"metadata": {"name": "web-1"}, "endpoints": []})),
        });
        assert!(matches!(good, ServiceInput::Slice { slice: Some(_), .. }));
        assert!(matches!(decode(ServiceEvent::InSync), ServiceInput::InSync));
    }
}
