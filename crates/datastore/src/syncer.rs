//! The watcher syncer (Calico's watcherSyncer): lists then watches a set of resource kinds and
//! turns them into one ordered stream of updates plus a sync status.
//!
//! Invariants:
//! - Status goes WaitForDatastore → ResyncInProgress → InSync, and InSync is sent only once
//!   every kind has been listed and its contents delivered. It is never withdrawn: a later
//!   resync (after a watch error, compaction or datastore restart) only delivers differences.
//! - A resync emits deletes for keys that vanished while the syncer was away and updates for
//!   keys whose revision changed; unchanged keys produce nothing (no spurious delete/re-add).
//! - A stored value that cannot be decoded is reported once (per key and revision) and treated
//!   as absent; it never stops the syncer.
//! - Updates for one key arrive in revision order (each kind has one list/watch loop).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use margay_api::{Kind, Resource, ResourceKey};
use tokio::sync::mpsc;

use crate::client::{Client, ResourceEvent};
use crate::error::DatastoreError;
use crate::kv::KvBackend;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncStatus {
    /// Not connected yet (or never managed to list).
    WaitForDatastore,
    /// Listing: some kinds are not complete yet.
    ResyncInProgress,
    /// Every kind has been listed and delivered; updates from now on are live.
    InSync,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateType {
    New,
    Updated,
    Deleted,
}

/// One change to one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub key: ResourceKey,
    /// The new value; None for a deletion.
    pub value: Option<Resource>,
    /// The datastore revision of the change (for a deletion: of the delete, or of the resync
    /// that noticed it).
    pub revision: i64,
    pub update_type: UpdateType,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SyncerEvent {
    Status(SyncStatus),
    Updates(Vec<Update>),
}

#[derive(Debug, Clone)]
pub struct SyncerOptions {
    pub kinds: Vec<Kind>,
    /// Most updates in one `Updates` message.
    pub max_batch: usize,
    /// First pause before retrying a failed list or watch; doubles up to `max_retry_delay`.
    pub retry_delay: Duration,
    pub max_retry_delay: Duration,
}

impl SyncerOptions {
    pub fn new(kinds: impl Into<Vec<Kind>>) -> Self {
        SyncerOptions {
            kinds: kinds.into(),
            max_batch: 1000,
            retry_delay: Duration::from_millis(500),
            max_retry_delay: Duration::from_secs(10),
        }
    }
}

/// Counters for metrics and tests.
#[derive(Debug, Default)]
pub struct SyncerStats {
    /// Lists performed (the first one per kind included).
    pub resyncs: AtomicU64,
    /// Watches that ended with an error (each leads to a resync).
    pub watch_errors: AtomicU64,
    /// Stored values that could not be decoded.
    pub undecodable: AtomicU64,
    /// Updates sent downstream.
    pub updates: AtomicU64,
}

pub struct WatcherSyncer<B> {
    client: Client<B>,
    options: SyncerOptions,
    stats: Arc<SyncerStats>,
}

enum KindMessage {
    Listed(Kind, Vec<Update>),
    Updates(Vec<Update>),
    /// A list failed (the datastore may be down); the kind keeps retrying.
    Unreachable,
}

impl<B: KvBackend + Clone> WatcherSyncer<B> {
    pub fn new(backend: B, options: SyncerOptions) -> Self {
        WatcherSyncer {
            client: Client::new(backend),
            options,
            stats: Arc::new(SyncerStats::default()),
        }
    }

    pub fn stats(&self) -> Arc<SyncerStats> {
        self.stats.clone()
    }

    /// Runs until `out` is closed. Never returns an error: datastore problems are retried
    /// with backoff and logged.
    pub async fn run(self, out: mpsc::Sender<SyncerEvent>) {
        // Small: each message can hold a thousand decoded resources.
        let (tx, mut rx) = mpsc::channel::<KindMessage>(4);
        let mut tasks = Vec::new();
        for kind in self.options.kinds.iter().copied() {
            let k = KindLoop {
                client: self.client.clone(),
                kind,
                options: self.options.clone(),
                stats: self.stats.clone(),
                cache: HashMap::new(),
                reported: HashSet::new(),
            };
            tasks.push(AbortOnDrop(tokio::spawn(k.run(tx.clone()))));
        }
        drop(tx);

        let mut status = SyncStatus::WaitForDatastore;
        if out.send(SyncerEvent::Status(status)).await.is_err() {
            return;
        }
        let mut listed: HashSet<Kind> = HashSet::new();
        while let Some(msg) = rx.recv().await {
            let updates = match msg {
                KindMessage::Unreachable => continue,
                KindMessage::Listed(kind, updates) => {
                    if status == SyncStatus::WaitForDatastore {
                        status = SyncStatus::ResyncInProgress;
                        if out.send(SyncerEvent::Status(status)).await.is_err() {
                            return;
                        }
                    }
                    listed.insert(kind);
                    updates
                }
                KindMessage::Updates(u) => u,
            };
            // Coalesce whatever else is already waiting, up to the batch limit.
            let mut batch = updates;
            while batch.len() < self.options.max_batch {
                match rx.try_recv() {
                    Ok(KindMessage::Updates(more)) => batch.extend(more),
                    Ok(KindMessage::Listed(kind, more)) => {
                        listed.insert(kind);
                        batch.extend(more);
                    }
                    Ok(KindMessage::Unreachable) | Err(_) => break,
                }
            }
            for chunk in batch.chunks(self.options.max_batch.max(1)) {
                self.stats
                    .updates
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                if out
                    .send(SyncerEvent::Updates(chunk.to_vec()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if status != SyncStatus::InSync && listed.len() == self.options.kinds.len() {
                status = SyncStatus::InSync;
                if out.send(SyncerEvent::Status(status)).await.is_err() {
                    return;
                }
            }
        }
        drop(tasks);
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The list/watch loop of one kind. Its cache (key → revision) is what makes resyncs
/// difference-only.
struct KindLoop<B> {
    client: Client<B>,
    kind: Kind,
    options: SyncerOptions,
    stats: Arc<SyncerStats>,
    cache: HashMap<ResourceKey, i64>,
    /// (path, revision) of undecodable values already reported.
    reported: HashSet<(String, i64)>,
}

impl<B: KvBackend + Clone> KindLoop<B> {
    async fn run(mut self, tx: mpsc::Sender<KindMessage>) {
        let mut delay = self.options.retry_delay;
        loop {
            // List (or re-list), diff against the cache, then watch from the list's revision.
            self.stats.resyncs.fetch_add(1, Ordering::Relaxed);
            let prefix = crate::keys::kind_prefix(self.kind, None, "");
            let listed = match self.client.backend().list(&prefix).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(kind = %self.kind, error = %e, "list failed; retrying in {delay:?}");
                    if tx.send(KindMessage::Unreachable).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(self.options.max_retry_delay);
                    continue;
                }
            };
            delay = self.options.retry_delay;
            let revision = listed.revision;
            // Decode and send in chunks while consuming the raw listing, so a 100k-key kind
            // never holds every decoded value at once; deletions follow once all is seen.
            let mut seen = HashSet::with_capacity(listed.kvs.len());
            let mut chunk = Vec::new();
            for kv in listed.kvs {
                match crate::client::decode(&kv) {
                    Ok(r) if r.kind() == self.kind => {
                        let key = r.key();
                        seen.insert(key.clone());
                        if let Some(u) = self.observe(key, r, kv.mod_revision) {
                            chunk.push(u);
                        }
                    }
                    Ok(_) => {}
                    // Not in `seen`: a cached value for this key is deleted below.
                    Err(e) => self.report_undecodable(&kv.key, kv.mod_revision, &e.to_string()),
                }
                if chunk.len() >= self.options.max_batch
                    && tx
                        .send(KindMessage::Updates(std::mem::take(&mut chunk)))
                        .await
                        .is_err()
                {
                    return;
                }
            }
            chunk.extend(self.vanished(&seen, revision));
            if tx
                .send(KindMessage::Listed(self.kind, chunk))
                .await
                .is_err()
            {
                return;
            }
            let mut watch = match self.client.watch(self.kind, None, revision).await {
                Ok(w) => w,
                Err(e) => {
                    self.stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(kind = %self.kind, error = %e, "watch failed; resyncing in {delay:?}");
                    tokio::time::sleep(delay).await;
                    continue;
                }
            };
            loop {
                match watch.next().await {
                    Some(Ok(events)) => {
                        let updates = self.apply_events(&events);
                        if !updates.is_empty()
                            && tx.send(KindMessage::Updates(updates)).await.is_err()
                        {
                            return;
                        }
                    }
                    Some(Err(e)) => {
                        self.stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                        match &e {
                            DatastoreError::Compacted { .. } => {
                                tracing::info!(kind = %self.kind, error = %e, "watch fell behind compaction; resyncing")
                            }
                            _ => {
                                tracing::warn!(kind = %self.kind, error = %e, "watch failed; resyncing")
                            }
                        }
                        break;
                    }
                    None => {
                        self.stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(kind = %self.kind, "watch closed; resyncing");
                        break;
                    }
                }
            }
            tokio::time::sleep(self.options.retry_delay).await;
        }
    }

    /// The update (if any) that a listed value means for a consumer of the cached state.
    fn observe(&mut self, key: ResourceKey, resource: Resource, revision: i64) -> Option<Update> {
        let update_type = match self.cache.insert(key.clone(), revision) {
            Some(old) if old == revision => return None,
            Some(_) => UpdateType::Updated,
            None => UpdateType::New,
        };
        Some(Update {
            key,
            value: Some(resource),
            revision,
            update_type,
        })
    }

    /// Deletions for cached keys a complete listing did not contain.
    fn vanished(&mut self, seen: &HashSet<ResourceKey>, revision: i64) -> Vec<Update> {
        let gone: Vec<ResourceKey> = self
            .cache
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        gone.into_iter()
            .map(|key| {
                self.cache.remove(&key);
                Update {
                    key,
                    value: None,
                    revision,
                    update_type: UpdateType::Deleted,
                }
            })
            .collect()
    }

    fn apply_events(&mut self, events: &[ResourceEvent]) -> Vec<Update> {
        let mut updates = Vec::with_capacity(events.len());
        for e in events.iter().cloned() {
            match e {
                ResourceEvent::Put {
                    key,
                    resource,
                    revision,
                    ..
                } => {
                    let update_type = match self.cache.insert(key.clone(), revision) {
                        Some(old) if old == revision => continue,
                        Some(_) => UpdateType::Updated,
                        None => UpdateType::New,
                    };
                    updates.push(Update {
                        key,
                        value: Some(resource),
                        revision,
                        update_type,
                    });
                }
                ResourceEvent::Deleted { key, revision, .. } => {
                    if self.cache.remove(&key).is_some() {
                        updates.push(Update {
                            key,
                            value: None,
                            revision,
                            update_type: UpdateType::Deleted,
                        });
                    }
                }
                ResourceEvent::Undecodable {
                    path,
                    revision,
                    error,
                } => {
                    self.report_undecodable(&path, revision, &error);
                    // The last good value is no longer current: treat the key as gone.
                    if let Some(key) = crate::keys::parse_resource_path(&path)
                        && self.cache.remove(&key).is_some()
                    {
                        updates.push(Update {
                            key,
                            value: None,
                            revision,
                            update_type: UpdateType::Deleted,
                        });
                    }
                }
            }
        }
        updates
    }

    fn report_undecodable(&mut self, path: &str, revision: i64, error: &str) {
        if self.reported.insert((path.to_string(), revision)) {
            self.stats.undecodable.fetch_add(1, Ordering::Relaxed);
            tracing::error!(kind = %self.kind, key = path, revision, error, "skipping a stored value that cannot be decoded");
        }
    }
}
