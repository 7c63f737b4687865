//! The snapshot cache (pure: no I/O, no clock of its own — times are passed in).
//!
//! The cache holds the current state of one syncer type as a persistent ordered map (imbl:
//! structurally shared, so a snapshot is an O(1) clone). Updates accumulate as pending deltas;
//! [`Cache::publish`] turns them into a [`Crumb`] ("breadcrumb"): the snapshot after the
//! deltas, the deltas themselves, the upstream status and the datastore revision the state is
//! complete up to. Crumbs form a singly linked list (`next` is set once); readers hold an
//! `Arc` to the crumb they are at, walk `next` without taking any lock, and wait on the last
//! crumb's notifier for the next one. A crumb nobody references any more is freed, so memory
//! is bounded by the oldest crumb a connected client still holds (the server disconnects a
//! client that falls more than MaxFallBehind behind).

use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use bytes::Bytes;
use margay_datastore::SyncStatus;
use tokio::sync::Notify;

use crate::proto::{self, Kv, Message, UpdateKind};

/// One key's value in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub value: Bytes,
    pub revision: i64,
}

/// A snapshot: key → value, ordered.
pub type Snapshot = imbl::OrdMap<Arc<str>, Entry>;

/// Frames of a crumb, computed once and shared by every client that sends them.
pub type Frames = Arc<[Bytes]>;

/// One published state of the cache. See the module documentation.
pub struct Crumb {
    /// 0 for the initial (empty) crumb, then +1 per crumb.
    pub seq: u64,
    /// When it was published.
    pub at: Instant,
    /// The state after this crumb's deltas.
    pub snapshot: Snapshot,
    /// What changed since the previous crumb, in order.
    pub deltas: Vec<Kv>,
    pub status: SyncStatus,
    /// Every change up to this datastore revision is reflected in `snapshot`.
    pub as_of: i64,
    next: OnceLock<Arc<Crumb>>,
    notify: Notify,
    /// The deltas' KV frames followed by the SyncStatus frame: [uncompressed, compressed].
    frames: [OnceLock<Frames>; 2],
}

impl std::fmt::Debug for Crumb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crumb")
            .field("seq", &self.seq)
            .field("keys", &self.snapshot.len())
            .field("deltas", &self.deltas.len())
            .field("status", &self.status)
            .field("as_of", &self.as_of)
            .finish_non_exhaustive()
    }
}

impl Crumb {
    fn new(
        seq: u64,
        at: Instant,
        snapshot: Snapshot,
        deltas: Vec<Kv>,
        status: SyncStatus,
        as_of: i64,
    ) -> Crumb {
        Crumb {
            seq,
            at,
            snapshot,
            deltas,
            status,
            as_of,
            next: OnceLock::new(),
            notify: Notify::new(),
            frames: [OnceLock::new(), OnceLock::new()],
        }
    }

    /// The next crumb, if it has been published (lock-free).
    pub fn next(&self) -> Option<&Arc<Crumb>> {
        self.next.get()
    }

    /// Waits for the next crumb.
    pub async fn wait_next(&self) -> Arc<Crumb> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Register before checking, so a publish in between is not missed.
            notified.as_mut().enable();
            if let Some(n) = self.next.get() {
                return n.clone();
            }
            notified.await;
        }
    }

    /// This crumb's deltas and status as frames (computed once per compression).
    pub fn delta_frames(&self, compress: bool, max_kvs: usize, max_bytes: usize) -> Frames {
        self.frames[usize::from(compress)]
            .get_or_init(|| {
                let mut f = proto::encode_kv_batches(
                    self.deltas.iter().cloned(),
                    max_kvs,
                    max_bytes,
                    compress,
                );
                f.push(self.status_frame());
                f.into()
            })
            .clone()
    }

    /// The status frame that closes this crumb.
    pub fn status_frame(&self) -> Bytes {
        proto::encode(
            &Message::SyncStatus {
                status: self.status,
                as_of: self.as_of,
            },
            false,
        )
    }

    /// The whole snapshot as frames (KVs, then the status). Expensive: callers run it off the
    /// async threads and share the result among clients joining together (the server keeps
    /// it only while it is being sent, not for as long as the crumb lives).
    pub fn encode_snapshot(&self, compress: bool, max_kvs: usize, max_bytes: usize) -> Frames {
        let kvs = self.snapshot.iter().map(|(k, e)| Kv {
            key: k.to_string(),
            value: Some(e.value.clone()),
            revision: e.revision,
            kind: UpdateKind::New,
        });
        let mut f = proto::encode_kv_batches(kvs, max_kvs, max_bytes, compress);
        f.push(self.status_frame());
        f.into()
    }
}

impl Drop for Crumb {
    /// Frees a chain of crumbs iteratively (a recursive drop of a long chain would overflow
    /// the stack).
    fn drop(&mut self) {
        let mut next = self.next.take();
        while let Some(n) = next {
            match Arc::into_inner(n) {
                Some(mut c) => next = c.next.take(),
                None => break,
            }
        }
    }
}

/// A cheap handle for readers: the latest crumb.
#[derive(Clone)]
pub struct CacheReader {
    latest: Arc<RwLock<Arc<Crumb>>>,
}

impl CacheReader {
    pub fn latest(&self) -> Arc<Crumb> {
        self.latest
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The writer side: one per syncer type, owned by its pipeline.
pub struct Cache {
    snapshot: Snapshot,
    pending: Vec<Kv>,
    status: SyncStatus,
    as_of: i64,
    /// Status or as_of changed since the last crumb.
    progress: bool,
    status_changed: bool,
    latest: Arc<Crumb>,
    shared: Arc<RwLock<Arc<Crumb>>>,
}

impl Cache {
    pub fn new(now: Instant) -> Cache {
        let first = Arc::new(Crumb::new(
            0,
            now,
            Snapshot::new(),
            Vec::new(),
            SyncStatus::WaitForDatastore,
            0,
        ));
        Cache {
            snapshot: Snapshot::new(),
            pending: Vec::new(),
            status: SyncStatus::WaitForDatastore,
            as_of: 0,
            progress: false,
            status_changed: false,
            shared: Arc::new(RwLock::new(first.clone())),
            latest: first,
        }
    }

    pub fn reader(&self) -> CacheReader {
        CacheReader {
            latest: self.shared.clone(),
        }
    }

    /// Applies one change. Changes that change nothing (a delete of an absent key, the same
    /// value at the same revision) are dropped; the update kind is recomputed from the state.
    pub fn update(&mut self, key: &str, value: Option<Bytes>, revision: i64) {
        match value {
            None => {
                if self.snapshot.remove(key).is_some() {
                    self.pending.push(Kv {
                        key: key.to_string(),
                        value: None,
                        revision,
                        kind: UpdateKind::Deleted,
                    });
                }
            }
            Some(value) => {
                let entry = Entry { value, revision };
                let kind = match self.snapshot.get(key) {
                    Some(old) if *old == entry => return,
                    Some(_) => UpdateKind::Updated,
                    None => UpdateKind::New,
                };
                self.pending.push(Kv {
                    key: key.to_string(),
                    value: Some(entry.value.clone()),
                    revision,
                    kind,
                });
                self.snapshot.insert(Arc::from(key), entry);
            }
        }
    }

    /// Records the upstream status and the revision the state is now complete up to.
    pub fn set_status(&mut self, status: SyncStatus, as_of: i64) {
        if status != self.status {
            self.status = status;
            self.status_changed = true;
            self.progress = true;
        }
        if as_of > self.as_of {
            self.as_of = as_of;
            self.progress = true;
        }
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether a publish would carry deltas or a status change (as opposed to progress only).
    pub fn has_news(&self) -> bool {
        !self.pending.is_empty() || self.status_changed
    }

    /// Whether only the as_of revision moved since the last crumb.
    pub fn has_progress(&self) -> bool {
        self.progress
    }

    pub fn len(&self) -> usize {
        self.snapshot.len()
    }

    pub fn is_empty(&self) -> bool {
        self.snapshot.is_empty()
    }

    pub fn latest(&self) -> Arc<Crumb> {
        self.latest.clone()
    }

    /// Publishes a crumb if there is anything to say (deltas, or a status/as_of change);
    /// wakes every reader waiting at the previous crumb.
    pub fn publish(&mut self, now: Instant) -> Option<Arc<Crumb>> {
        if self.pending.is_empty() && !self.progress {
            return None;
        }
        let crumb = Arc::new(Crumb::new(
            self.latest.seq + 1,
            now,
            self.snapshot.clone(),
            std::mem::take(&mut self.pending),
            self.status,
            self.as_of,
        ));
        self.progress = false;
        self.status_changed = false;
        // Only the cache sets `next`, once per crumb.
        let _ = self.latest.next.set(crumb.clone());
        self.latest.notify.notify_waiters();
        self.latest = crumb.clone();
        *self.shared.write().unwrap_or_else(|e| e.into_inner()) = crumb.clone();
        Some(crumb)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    fn b(s: &str) -> Option<Bytes> {
        Some(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn crumbs_chain_and_carry_deltas() {
        let t = Instant::now();
        let mut c = Cache::new(t);
        let r = c.reader();
        let first = r.latest();
        assert_eq!(first.seq, 0);
        c.update("/a", b("1"), 1);
        c.update("/b", b("2"), 2);
        c.update("/a", b("1"), 1); // no-op
        c.update("/zz", None, 3); // absent
        c.set_status(SyncStatus::InSync, 2);
        let c1 = c.publish(t).unwrap();
        assert_eq!(c1.deltas.len(), 2);
        assert_eq!(c1.deltas[0].kind, UpdateKind::New);
        assert_eq!(c1.status, SyncStatus::InSync);
        assert!(c.publish(t).is_none(), "nothing new");
        c.update("/a", b("3"), 4);
        c.update("/b", None, 5);
        let c2 = c.publish(t + Duration::from_millis(1)).unwrap();
        assert_eq!(
            c2.deltas.iter().map(|k| k.kind).collect::<Vec<_>>(),
            vec![UpdateKind::Updated, UpdateKind::Deleted]
        );
        assert_eq!(first.next().unwrap().seq, 1);
        assert_eq!(first.next().unwrap().next().unwrap().seq, 2);
        assert_eq!(r.latest().seq, 2);
        // Snapshots are independent.
        assert_eq!(c1.snapshot.len(), 2);
        assert_eq!(c2.snapshot.len(), 1);
        assert_eq!(c2.snapshot.get("/a").unwrap().revision, 4);
    }

    #[test]
    fn progress_only_crumb() {
        let t = Instant::now();
        let mut c = Cache::new(t);
        c.set_status(SyncStatus::InSync, 10);
        assert!(c.has_news());
        c.publish(t).unwrap();
        c.set_status(SyncStatus::InSync, 12);
        assert!(!c.has_news());
        assert!(c.has_progress());
        assert_eq!(c.publish(t).unwrap().as_of, 12);
    }

    #[test]
    fn long_chains_drop_without_recursion() {
        let t = Instant::now();
        let mut c = Cache::new(t);
        let head = c.latest();
        for i in 0..200_000 {
            c.update("/k", b(&i.to_string()), i);
            c.publish(t);
        }
        drop(c);
        drop(head);
    }

    #[tokio::test]
    async fn readers_wait_at_the_end() {
        let t = Instant::now();
        let mut c = Cache::new(t);
        let first = c.latest();
        let waiter = tokio::spawn(async move { first.wait_next().await.seq });
        tokio::time::sleep(Duration::from_millis(20)).await;
        c.update("/a", b("x"), 1);
        c.publish(t);
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .unwrap()
                .unwrap(),
            1
        );
    }

    #[test]
    fn snapshot_frames_decode_to_the_state() {
        let t = Instant::now();
        let mut c = Cache::new(t);
        for i in 0..250 {
            c.update(&format!("/k/{i:03}"), b(&"v".repeat(i)), i as i64);
        }
        c.set_status(SyncStatus::InSync, 250);
        let crumb = c.publish(t).unwrap();
        let frames = crumb.encode_snapshot(true, 100, 1 << 20);
        assert_eq!(frames.len(), 4);
        let all: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
        let (msgs, err) = proto::decode_stream(&all, proto::DEFAULT_MAX_CLIENT_INBOUND);
        assert!(err.is_none());
        let n: usize = msgs
            .iter()
            .map(|m| match m {
                Message::Kvs(k) => k.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(n, 250);
        assert_eq!(
            msgs.last(),
            Some(&Message::SyncStatus {
                status: SyncStatus::InSync,
                as_of: 250
            })
        );
    }
}
