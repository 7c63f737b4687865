//! Kubernetes Services and EndpointSlices for margay's service proxy.
//!
//! These are not Calico resources and have no key in Calico's layout, so they do not go
//! through the key/value contract: [`watch_services`] lists and watches the two API resources
//! and sends the objects themselves (as JSON) in order, ending the initial listing with
//! [`ServiceEvent::InSync`]. Felix's calculation graph decodes them
//! (`margay_calc::services`). A watch the server ends is resumed from the last
//! resourceVersion; a 410 Gone re-lists, and only differences (and deletions of what vanished)
//! are sent, so a consumer never sees a spurious delete.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::StreamExt;
use kube::core::WatchEvent;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use super::api::{ApiError, KubeApi, parse_revision, resource_version};
use super::route::{ApiResource, ENDPOINT_SLICES, SERVICES};

/// Which of the two API resources an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceObjectKind {
    Service,
    EndpointSlice,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ServiceEvent {
    /// Created or changed (`Some`: the object as the API server sent it) or deleted (`None`).
    Update {
        kind: ServiceObjectKind,
        namespace: String,
        name: String,
        object: Option<Value>,
    },
    /// Both resources have been listed: everything before this describes the cluster.
    InSync,
}

/// Where Typha carries Services and EndpointSlices to its clients (`<root><namespace>/<name>`,
/// the value the object's JSON). Outside `/calico/`, so no Calico key can collide with them;
/// clients that do not know the prefix ignore the keys, as they ignore any key they do not use.
pub const KEY_ROOT: &str = "/margay/kubernetes/";
pub const SERVICES_KEY_ROOT: &str = "/margay/kubernetes/services/";
pub const ENDPOINT_SLICES_KEY_ROOT: &str = "/margay/kubernetes/endpointslices/";

impl ServiceObjectKind {
    pub fn key_root(self) -> &'static str {
        match self {
            ServiceObjectKind::Service => SERVICES_KEY_ROOT,
            ServiceObjectKind::EndpointSlice => ENDPOINT_SLICES_KEY_ROOT,
        }
    }
}

/// The key of one object in margay's key space.
pub fn object_key(kind: ServiceObjectKind, namespace: &str, name: &str) -> String {
    format!("{}{namespace}/{name}", kind.key_root())
}

/// The object a key names (None: not one of these keys, or malformed).
pub fn parse_object_key(key: &str) -> Option<(ServiceObjectKind, &str, &str)> {
    let (kind, rest) = if let Some(r) = key.strip_prefix(SERVICES_KEY_ROOT) {
        (ServiceObjectKind::Service, r)
    } else {
        (
            ServiceObjectKind::EndpointSlice,
            key.strip_prefix(ENDPOINT_SLICES_KEY_ROOT)?,
        )
    };
    let (ns, name) = rest.split_once('/')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains('/')).then_some((kind, ns, name))
}

/// The event a key/value pair in that key space stands for (None: not such a key). A value
/// that is not JSON counts as a deletion, with a warning.
pub fn event_from_kv(key: &str, value: Option<&[u8]>) -> Option<ServiceEvent> {
    let (kind, ns, name) = parse_object_key(key)?;
    let object = value.and_then(|v| match serde_json::from_slice::<Value>(v) {
        Ok(o) => Some(o),
        Err(e) => {
            tracing::warn!(key, error = %e, "not a JSON object; treating it as deleted");
            None
        }
    });
    Some(ServiceEvent::Update {
        kind,
        namespace: ns.to_string(),
        name: name.to_string(),
        object,
    })
}

/// Events sent in one batch at most.
const MAX_BATCH: usize = 512;

/// Lists and watches Services and EndpointSlices until `tx` is closed. Failures are retried
/// with backoff (a cluster without the resources simply has none).
pub async fn watch_services(api: KubeApi, tx: mpsc::Sender<Vec<ServiceEvent>>) {
    let (health, _) = watch::channel(None);
    watch_services_reporting(api, tx, health).await
}

/// [`watch_services`], also saying how it goes: `health` holds the last failure (`Some`,
/// naming the resource and the error) until a list or watch succeeds again (`None`), so a
/// consumer can show it without the watch ever giving up.
pub async fn watch_services_reporting(
    api: KubeApi,
    tx: mpsc::Sender<Vec<ServiceEvent>>,
    health: watch::Sender<Option<String>>,
) {
    let listed = Arc::new(AtomicUsize::new(0));
    let a = one(
        api.clone(),
        SERVICES,
        ServiceObjectKind::Service,
        tx.clone(),
        listed.clone(),
        health.clone(),
    );
    let b = one(
        api,
        ENDPOINT_SLICES,
        ServiceObjectKind::EndpointSlice,
        tx,
        listed,
        health,
    );
    // Each ends only when the consumer is gone.
    tokio::join!(a, b);
}

fn identity(obj: &Value) -> Option<(String, String)> {
    let meta = obj.get("metadata")?;
    let name = meta.get("name")?.as_str()?.to_string();
    let ns = meta
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Some((ns, name))
}

async fn one(
    api: KubeApi,
    res: ApiResource,
    kind: ServiceObjectKind,
    tx: mpsc::Sender<Vec<ServiceEvent>>,
    listed: Arc<AtomicUsize>,
    health: watch::Sender<Option<String>>,
) {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        let msg = format!("{what} {}: {e}", res.display());
        health.send_if_modified(|h| {
            let changed = h.as_deref() != Some(msg.as_str());
            *h = Some(msg.clone());
            changed
        });
    };
    let ok = || {
        health.send_if_modified(|h| h.take().is_some());
    };
    // What the consumer has: (namespace, name) → resourceVersion.
    let mut known: HashMap<(String, String), String> = HashMap::new();
    let mut first = true;
    let mut failures = 0u32;
    'list: loop {
        if tx.is_closed() {
            return;
        }
        let listing = match api.list_all(&res, None, None).await {
            Ok(l) => l,
            Err(e) => {
                failures += 1;
                tracing::debug!(resource = %res.display(), error = %e, "listing failed; retrying");
                fail("listing", &e);
                tokio::select! {
                    _ = tokio::time::sleep(KubeApi::backoff(failures)) => {}
                    _ = tx.closed() => return,
                }
                continue 'list;
            }
        };
        failures = 0;
        ok();
        let mut batch = Vec::new();
        let mut seen: HashMap<(String, String), String> =
            HashMap::with_capacity(listing.items.len());
        for obj in listing.items {
            let Some(id) = identity(&obj) else { continue };
            let rv = resource_version(&obj).unwrap_or_default().to_string();
            if known.get(&id) != Some(&rv) {
                batch.push(ServiceEvent::Update {
                    kind,
                    namespace: id.0.clone(),
                    name: id.1.clone(),
                    object: Some(obj),
                });
            }
            seen.insert(id, rv);
        }
        for (ns, name) in known.keys().filter(|k| !seen.contains_key(*k)) {
            batch.push(ServiceEvent::Update {
                kind,
                namespace: ns.clone(),
                name: name.clone(),
                object: None,
            });
        }
        known = seen;
        for chunk in batch.chunks(MAX_BATCH) {
            if tx.send(chunk.to_vec()).await.is_err() {
                return;
            }
        }
        if first {
            first = false;
            // The last of the two first listings says the state is complete.
            if listed.fetch_add(1, Ordering::SeqCst) + 1 == 2
                && tx.send(vec![ServiceEvent::InSync]).await.is_err()
            {
                return;
            }
        }
        let mut rv = listing.resource_version;
        loop {
            let stream = match api.watch(&res, None, None, &rv).await {
                Ok(s) => {
                    ok();
                    s
                }
                Err(ApiError::Gone(_)) => continue 'list,
                Err(e) => {
                    failures += 1;
                    tracing::debug!(resource = %res.display(), error = %e, "watch request failed; retrying");
                    fail("watching", &e);
                    tokio::time::sleep(KubeApi::backoff(failures)).await;
                    if failures > 5 {
                        continue 'list;
                    }
                    continue;
                }
            };
            let mut stream = std::pin::pin!(stream.ready_chunks(MAX_BATCH));
            loop {
                // A quiet watch must not outlive its consumer.
                let chunk = tokio::select! {
                    c = stream.next() => c,
                    _ = tx.closed() => return,
                };
                let Some(chunk) = chunk else { break };
                let mut batch = Vec::with_capacity(chunk.len());
                let mut relist = false;
                for item in chunk {
                    match item {
                        Ok(WatchEvent::Added(obj)) | Ok(WatchEvent::Modified(obj)) => {
                            failures = 0;
                            let Some(id) = identity(&obj) else { continue };
                            let v = resource_version(&obj).unwrap_or_default().to_string();
                            if parse_revision(&v).is_some() {
                                rv = v.clone();
                            }
                            known.insert(id.clone(), v);
                            batch.push(ServiceEvent::Update {
                                kind,
                                namespace: id.0,
                                name: id.1,
                                object: Some(obj),
                            });
                        }
                        Ok(WatchEvent::Deleted(obj)) => {
                            failures = 0;
                            let Some(id) = identity(&obj) else { continue };
                            if let Some(v) =
                                resource_version(&obj).filter(|v| parse_revision(v).is_some())
                            {
                                rv = v.to_string();
                            }
                            if known.remove(&id).is_some() {
                                batch.push(ServiceEvent::Update {
                                    kind,
                                    namespace: id.0,
                                    name: id.1,
                                    object: None,
                                });
                            }
                        }
                        Ok(WatchEvent::Bookmark(b)) => {
                            if parse_revision(&b.metadata.resource_version).is_some() {
                                rv = b.metadata.resource_version;
                            }
                        }
                        Ok(WatchEvent::Error(status)) if status.code == 410 => relist = true,
                        Err(ApiError::Gone(_)) => relist = true,
                        Ok(WatchEvent::Error(status)) => {
                            failures += 1;
                            fail("watching", &status.message);
                        }
                        Err(e) => {
                            failures += 1;
                            fail("watching", &e);
                        }
                    }
                }
                if !batch.is_empty() && tx.send(batch).await.is_err() {
                    return;
                }
                if relist {
                    continue 'list;
                }
            }
            if tx.is_closed() {
                return;
            }
            if failures > 0 {
                tokio::time::sleep(KubeApi::backoff(failures)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_keys_round_trip_and_refuse_other_keys() {
        for kind in [ServiceObjectKind::Service, ServiceObjectKind::EndpointSlice] {
            let key = object_key(kind, "ns1", "web");
            assert_eq!(parse_object_key(&key), Some((kind, "ns1", "web")));
            assert!(key.starts_with(KEY_ROOT));
        }
        for bad in [
            "/calico/resources/v3/projectcalico.org/networkpolicies/ns/p",
            "/margay/kubernetes/services/ns1",
            "/margay/kubernetes/services//web",
            "/margay/kubernetes/services/ns1/",
            "/margay/kubernetes/services/ns1/a/b",
            "/margay/kubernetes/pods/ns1/a",
        ] {
            assert_eq!(parse_object_key(bad), None, "{bad}");
        }
        let ev = event_from_kv(
            "/margay/kubernetes/services/ns1/web",
            Some(br#"{"metadata":{"name":"web"}}"#),
        );
        assert!(matches!(
            ev,
            Some(ServiceEvent::Update {
                object: Some(_),
                ..
            })
        ));
        let ev = event_from_kv("/margay/kubernetes/services/ns1/web", Some(b"{not json"));
        assert!(matches!(
            ev,
            Some(ServiceEvent::Update { object: None, .. })
        ));
    }
}
