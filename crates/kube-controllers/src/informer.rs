//! Kubernetes objects kept in memory (a small informer): list, then watch from the list's
//! resourceVersion with bookmarks; the server ending a stream means watching again from the
//! last version seen; 410 Gone or repeated failures mean listing again, and only the
//! differences are passed on. Each object is kept as the caller's projection of it, under
//! `namespace/name` (or `name`), and every change is announced to the subscribers.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use futures_util::StreamExt;
use kube::core::WatchEvent;
use margay_datastore::kube::api::{ApiError, KubeApi, parse_revision, resource_version};
use margay_datastore::kube::route::ApiResource;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::pods::object_key;

/// Failed watches in a row before listing again.
const MAX_WATCH_FAILURES: u32 = 5;

/// A change to one object (by key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Upsert(String),
    Delete(String),
}

impl Change {
    pub fn key(&self) -> &str {
        match self {
            Change::Upsert(k) | Change::Delete(k) => k,
        }
    }
}

pub type Projection<T> = Arc<dyn Fn(&Value) -> Option<T> + Send + Sync>;
type Store<T> = Arc<RwLock<HashMap<String, T>>>;

/// The objects of one API resource, kept current by a background task (stopped on drop).
pub struct Informer<T> {
    resource: ApiResource,
    store: Store<T>,
    synced: watch::Receiver<bool>,
    task: tokio::task::AbortHandle,
}

impl<T> Drop for Informer<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<T: Clone + PartialEq + Send + Sync + 'static> Informer<T> {
    /// Starts listing and watching `resource` (every namespace). Objects the projection turns
    /// into None are treated as absent.
    pub fn spawn(
        api: KubeApi,
        resource: ApiResource,
        project: Projection<T>,
        subscribers: Vec<mpsc::UnboundedSender<Change>>,
    ) -> Informer<T> {
        let store: Store<T> = Arc::default();
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(run(api, resource, project, store.clone(), subscribers, tx))
            .abort_handle();
        Informer {
            resource,
            store,
            synced: rx,
            task,
        }
    }

    /// The objects now (do not hold across an await).
    pub fn read(&self) -> RwLockReadGuard<'_, HashMap<String, T>> {
        // The map is replaced or updated whole per event: any state a panic left is usable.
        self.store.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until the first listing is in.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.clone();
        let _ = rx.wait_for(|s| *s).await;
    }

    pub fn resource(&self) -> &ApiResource {
        &self.resource
    }
}

/// Lists `resource` now (not from any cache): the re-check before a release.
pub async fn list_fresh<T>(
    api: &KubeApi,
    resource: &ApiResource,
    project: &(dyn Fn(&Value) -> Option<T> + Send + Sync),
) -> Result<HashMap<String, T>, ApiError> {
    let listing = api.list_all(resource, None, None).await?;
    Ok(listing
        .items
        .iter()
        .filter_map(|o| Some((object_key(o)?, project(o)?)))
        .collect())
}

fn notify(subs: &mut Vec<mpsc::UnboundedSender<Change>>, changes: Vec<Change>) {
    if changes.is_empty() {
        return;
    }
    subs.retain(|s| !s.is_closed());
    for s in subs.iter() {
        for c in &changes {
            let _ = s.send(c.clone());
        }
    }
}

async fn run<T: Clone + PartialEq + Send + Sync + 'static>(
    api: KubeApi,
    res: ApiResource,
    project: Projection<T>,
    store: Store<T>,
    mut subs: Vec<mpsc::UnboundedSender<Change>>,
    synced: watch::Sender<bool>,
) {
    let mut failures = 0u32;
    'relist: loop {
        if failures > 0 {
            tokio::time::sleep(KubeApi::backoff(failures)).await;
        }
        let listing = match api.list_all(&res, None, None).await {
            Ok(l) => l,
            Err(e) => {
                failures = failures.saturating_add(1);
                if failures == 1 || failures.is_multiple_of(10) {
                    tracing::warn!(resource = %res.display(), "listing failed (retrying): {e}");
                }
                continue;
            }
        };
        failures = 0;
        let mut fresh: HashMap<String, T> = HashMap::with_capacity(listing.items.len());
        for o in &listing.items {
            if let (Some(k), Some(v)) = (object_key(o), project(o)) {
                fresh.insert(k, v);
            }
        }
        let mut changes = Vec::new();
        {
            let mut s = store.write().unwrap_or_else(|e| e.into_inner());
            for k in s.keys() {
                if !fresh.contains_key(k) {
                    changes.push(Change::Delete(k.clone()));
                }
            }
            for (k, v) in &fresh {
                if s.get(k) != Some(v) {
                    changes.push(Change::Upsert(k.clone()));
                }
            }
            *s = fresh;
        }
        notify(&mut subs, changes);
        synced.send_replace(true);
        tracing::debug!(resource = %res.display(), "listed; watching");

        let mut rv = listing.resource_version;
        loop {
            let stream = match api.watch(&res, None, None, &rv).await {
                Ok(s) => s,
                Err(ApiError::Gone(_)) => continue 'relist,
                Err(e) => {
                    failures += 1;
                    tracing::debug!(resource = %res.display(), "watch failed: {e}");
                    if failures > MAX_WATCH_FAILURES {
                        continue 'relist;
                    }
                    tokio::time::sleep(KubeApi::backoff(failures)).await;
                    continue;
                }
            };
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                let mut changes = Vec::new();
                match item {
                    Ok(WatchEvent::Added(o)) | Ok(WatchEvent::Modified(o)) => {
                        failures = 0;
                        advance(&mut rv, &o);
                        let Some(k) = object_key(&o) else { continue };
                        let mut s = store.write().unwrap_or_else(|e| e.into_inner());
                        match project(&o) {
                            Some(v) => {
                                if s.get(&k) != Some(&v) {
                                    s.insert(k.clone(), v);
                                    changes.push(Change::Upsert(k));
                                }
                            }
                            None => {
                                if s.remove(&k).is_some() {
                                    changes.push(Change::Delete(k));
                                }
                            }
                        }
                    }
                    Ok(WatchEvent::Deleted(o)) => {
                        failures = 0;
                        advance(&mut rv, &o);
                        let Some(k) = object_key(&o) else { continue };
                        let removed = store
                            .write()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&k)
                            .is_some();
                        if removed {
                            changes.push(Change::Delete(k));
                        }
                    }
                    Ok(WatchEvent::Bookmark(b)) => {
                        failures = 0;
                        if parse_revision(&b.metadata.resource_version).is_some() {
                            rv = b.metadata.resource_version;
                        }
                    }
                    Ok(WatchEvent::Error(status)) if status.code == 410 => continue 'relist,
                    Err(ApiError::Gone(_)) => continue 'relist,
                    Ok(WatchEvent::Error(status)) => {
                        tracing::debug!(resource = %res.display(), code = status.code, "watch ended with an error: {}", status.message);
                        failures += 1;
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(resource = %res.display(), "watch stream failed: {e}");
                        failures += 1;
                        break;
                    }
                }
                notify(&mut subs, changes);
            }
            if failures > MAX_WATCH_FAILURES {
                continue 'relist;
            }
            if failures > 0 {
                tokio::time::sleep(KubeApi::backoff(failures)).await;
            }
        }
    }
}

fn advance(rv: &mut String, obj: &Value) {
    if let Some(v) = resource_version(obj)
        && parse_revision(v).is_some()
    {
        *rv = v.to_string();
    }
}
