//! One pipeline per syncer type: syncer (list + watch of `/calico/`, keeping only the keys the
//! syncer type carries) → validation filter (a v3 value that does not decode or validate is
//! served as a deletion) → snapshot cache (a crumb after each batch).
//!
//! A single list + watch of one prefix gives one revision order: after the list at revision R
//! the state is complete up to R, and after each watch batch up to the batch's last revision.
//! That revision (`as_of`) travels with every crumb, and is what lets a client switch Typhas
//! without spurious deletes. After a watch error the pipeline lists again and applies only the
//! differences (deletes for keys that vanished, updates for changed ones).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use margay_datastore::{KeyValue, KvBackend, KvEvent, SyncStatus};

use crate::cache::Cache;
use crate::syncers::{KeyClass, SyncerType};

/// Counters of one pipeline.
#[derive(Debug, Default)]
pub struct UpstreamStats {
    pub lists: AtomicU64,
    pub watch_errors: AtomicU64,
    /// Values the validation filter turned into deletions.
    pub invalid: AtomicU64,
    /// Values too large for any client's frame limit, served as deletions.
    pub oversized: AtomicU64,
    pub updates: AtomicU64,
    pub crumbs: AtomicU64,
}

#[derive(Debug, Clone)]
pub struct PipelineOptions {
    /// Publish once this many updates are pending.
    pub max_batch: usize,
    /// Otherwise publish this long after the first pending update.
    pub batching_age: Duration,
    /// Publish a revision-only crumb at most this often.
    pub progress_interval: Duration,
    /// Also carry Kubernetes Services and EndpointSlices (the Kubernetes datastore: only it
    /// has them; over etcd their prefix would widen the one watch to the whole key space).
    pub kubernetes_services: bool,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        PipelineOptions {
            max_batch: 100,
            batching_age: Duration::from_millis(10),
            progress_interval: Duration::from_secs(1),
            kubernetes_services: false,
        }
    }
}

/// The validation filter: the value to serve for a key (None: serve a deletion).
///
/// A value too large for the frame a client accepts would make every client refuse the frame
/// and reconnect forever; it is served as deleted and reported, naming the key (the
/// datastore refuses such values on write, but another writer may have stored one).
pub fn filter_value(
    ty: SyncerType,
    class: &KeyClass,
    kv: &KeyValue,
    stats: &UpstreamStats,
) -> Option<Bytes> {
    let max = crate::proto::max_served_value(&kv.key);
    if kv.value.len() > max {
        stats.oversized.fetch_add(1, Ordering::Relaxed);
        tracing::error!(syncer = %ty, key = %kv.key, size = kv.value.len(), max, "stored value is larger than Typha's clients accept in one frame; serving it as deleted (shrink or delete the resource)");
        return None;
    }
    match class {
        KeyClass::Raw => Some(Bytes::copy_from_slice(&kv.value)),
        KeyClass::Resource(key) => match margay_datastore::client::decode(kv) {
            Ok(r) if r.kind() != key.kind => {
                stats.invalid.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(syncer = %ty, key = %kv.key, "stored value is a {} under a {} key; serving it as deleted", r.kind().name(), key.kind.name());
                None
            }
            Ok(r) => match r.validate() {
                Ok(()) => Some(Bytes::copy_from_slice(&kv.value)),
                Err(e) => {
                    stats.invalid.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(syncer = %ty, key = %kv.key, reason = %e, "resource failed validation; serving it as deleted");
                    None
                }
            },
            Err(e) => {
                stats.invalid.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(syncer = %ty, key = %kv.key, error = %e, "stored value does not decode; serving it as deleted");
                None
            }
        },
    }
}

/// Runs one pipeline until the task is dropped. Never returns an error: datastore trouble is
/// logged and retried with backoff.
pub async fn run<B: KvBackend>(
    backend: B,
    ty: SyncerType,
    mut cache: Cache,
    opts: PipelineOptions,
    stats: Arc<UpstreamStats>,
) {
    // key → revision of what the cache holds (for difference-only relists).
    let mut known: HashMap<String, i64> = HashMap::new();
    let mut delay = Duration::from_millis(200);
    let mut last_publish = Instant::now();
    cache.set_status(SyncStatus::WaitForDatastore, 0);
    let mut prefixes = ty.watch_prefixes();
    if opts.kubernetes_services {
        prefixes.extend(ty.service_prefixes().iter().map(|p| p.to_string()));
    }
    let services = opts.kubernetes_services;
    loop {
        stats.lists.fetch_add(1, Ordering::Relaxed);
        let listed = match backend.list_many(&prefixes).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(syncer = %ty, error = %e, "listing the datastore failed; retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        delay = Duration::from_millis(200);
        if cache.latest().status != SyncStatus::InSync {
            cache.set_status(SyncStatus::ResyncInProgress, 0);
        }
        let mut seen: HashMap<String, i64> = HashMap::with_capacity(known.len());
        for kv in &listed.kvs {
            let Some(class) = ty.classify_with(&kv.key, services) else {
                continue;
            };
            seen.insert(kv.key.clone(), kv.mod_revision);
            if known.get(&kv.key) == Some(&kv.mod_revision) {
                continue;
            }
            let value = filter_value(ty, &class, kv, &stats);
            stats.updates.fetch_add(1, Ordering::Relaxed);
            cache.update(&kv.key, value, kv.mod_revision);
            if cache.pending() >= opts.max_batch {
                publish(&mut cache, &stats, &mut last_publish);
            }
        }
        for key in known.keys() {
            if !seen.contains_key(key) {
                stats.updates.fetch_add(1, Ordering::Relaxed);
                cache.update(key, None, listed.revision);
            }
        }
        known = seen;
        let mut watch = match backend.watch_many(&prefixes, listed.revision).await {
            Ok(w) => w,
            Err(e) => {
                stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(syncer = %ty, error = %e, "watching the datastore failed; listing again in {delay:?}");
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        // The listing is complete up to its revision — or, where several streams were listed
        // one after another (the Kubernetes datastore), up to the oldest of them.
        let as_of = watch
            .progress()
            .unwrap_or(listed.revision)
            .min(listed.revision);
        cache.set_status(SyncStatus::InSync, as_of);
        publish(&mut cache, &stats, &mut last_publish);
        tracing::info!(syncer = %ty, keys = cache.len(), revision = listed.revision, "Listed the datastore; in sync");
        let mut first_pending: Option<Instant> = None;
        // A watch of several streams also moves on without events (bookmarks): look at its
        // progress now and then, so as_of keeps up on a quiet datastore.
        let polls_progress = watch.progress().is_some();
        let mut last_poll = Instant::now();
        loop {
            let publish_at = if cache.has_news() {
                first_pending.map(|t| t + opts.batching_age)
            } else if cache.has_progress() {
                Some(last_publish + opts.progress_interval)
            } else {
                None
            };
            let poll_at = polls_progress.then(|| last_poll + opts.progress_interval);
            let deadline = match (publish_at, poll_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let item = tokio::select! {
                item = watch.next() => item,
                _ = sleep_until(deadline), if deadline.is_some() => {
                    if poll_at.is_some_and(|t| t <= Instant::now()) {
                        last_poll = Instant::now();
                        if let Some(p) = watch.progress() {
                            cache.set_status(SyncStatus::InSync, p);
                        }
                    }
                    if publish_at.is_some_and(|t| t <= Instant::now()) || cache.has_progress() {
                        publish(&mut cache, &stats, &mut last_publish);
                        first_pending = None;
                    }
                    continue;
                }
            };
            let events = match item {
                Some(Ok(ev)) => ev,
                Some(Err(e)) => {
                    stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(syncer = %ty, error = %e, "datastore watch ended; listing again (only differences are served)");
                    break;
                }
                None => {
                    stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(syncer = %ty, "datastore watch closed; listing again");
                    break;
                }
            };
            let mut last_rev = None;
            for ev in events {
                last_rev = Some(ev.revision());
                let key = ev.key();
                let Some(class) = ty.classify_with(key, services) else {
                    continue;
                };
                stats.updates.fetch_add(1, Ordering::Relaxed);
                match &ev {
                    KvEvent::Put { kv, .. } => {
                        known.insert(kv.key.clone(), kv.mod_revision);
                        let value = filter_value(ty, &class, kv, &stats);
                        cache.update(&kv.key, value, kv.mod_revision);
                    }
                    KvEvent::Delete { key, revision, .. } => {
                        known.remove(key);
                        cache.update(key, None, *revision);
                    }
                }
                if first_pending.is_none() && cache.has_news() {
                    first_pending = Some(Instant::now());
                }
                if cache.pending() >= opts.max_batch {
                    publish(&mut cache, &stats, &mut last_publish);
                    first_pending = None;
                }
            }
            // as_of says "complete up to": one revision order makes that the last event's;
            // several streams side by side make it the slowest stream's progress.
            if let Some(r) = watch.progress().or(last_rev) {
                cache.set_status(SyncStatus::InSync, r);
            }
        }
        publish(&mut cache, &stats, &mut last_publish);
        tokio::time::sleep(delay).await;
    }
}

fn publish(cache: &mut Cache, stats: &UpstreamStats, last: &mut Instant) {
    let now = Instant::now();
    if cache.publish(now).is_some() {
        stats.crumbs.fetch_add(1, Ordering::Relaxed);
        *last = now;
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use margay_datastore::MemBackend;

    #[tokio::test]
    async fn lists_filters_and_follows() {
        let kv = MemBackend::new();
        let pool = br#"{"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{"name":"p1"},"spec":{"cidr":"10.0.0.0/16"}}"#;
        let bad = br#"{"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{"name":"p2"},"spec":{"cidr":"nonsense"}}"#;
        kv.create(
            "/calico/resources/v3/projectcalico.org/ippools/p1",
            pool.to_vec(),
            None,
        )
        .await
        .unwrap();
        kv.create(
            "/calico/resources/v3/projectcalico.org/ippools/p2",
            bad.to_vec(),
            None,
        )
        .await
        .unwrap();
        kv.create("/calico/ipam/v2/handle/h", b"{}".to_vec(), None)
            .await
            .unwrap();
        kv.create(
            "/calico/ipam/v2/assignment/ipv4/block/10.0.0.0-26",
            b"{}".to_vec(),
            None,
        )
        .await
        .unwrap();
        let cache = Cache::new(Instant::now());
        let reader = cache.reader();
        let stats = Arc::new(UpstreamStats::default());
        let task = tokio::spawn(run(
            kv.clone(),
            SyncerType::Felix,
            cache,
            PipelineOptions::default(),
            stats.clone(),
        ));
        let deadline = Instant::now() + Duration::from_secs(5);
        while reader.latest().status != SyncStatus::InSync {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let c = reader.latest();
        let keys: Vec<String> = c.snapshot.keys().map(|k| k.to_string()).collect();
        assert_eq!(
            keys,
            vec![
                "/calico/ipam/v2/assignment/ipv4/block/10.0.0.0-26",
                "/calico/resources/v3/projectcalico.org/ippools/p1"
            ]
        );
        assert_eq!(stats.invalid.load(Ordering::Relaxed), 1);
        kv.delete("/calico/resources/v3/projectcalico.org/ippools/p1", None)
            .await
            .unwrap();
        let rev = kv.revision().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let c = reader.latest();
            if c.snapshot.len() == 1 && c.as_of >= rev {
                break;
            }
            assert!(Instant::now() < deadline, "{c:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        task.abort();
    }
}
