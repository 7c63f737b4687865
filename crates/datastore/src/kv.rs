//! The key/value backend contract every datastore implements (etcd v3 semantics).
//!
//! Keys are paths (`/calico/resources/v3/projectcalico.org/ippools/default-ipv4-ippool`),
//! values are bytes (resources are stored as JSON). Every write is assigned a store-wide,
//! strictly increasing revision; a key's `mod_revision` is its resourceVersion.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::error::{DatastoreError, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// Revision of the write that created the key.
    pub create_revision: i64,
    /// Revision of the last write to the key.
    pub mod_revision: i64,
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// The key was created (`prev` is None) or modified.
    Put {
        kv: KeyValue,
        prev: Option<KeyValue>,
    },
    /// The key was deleted (explicitly or because its TTL expired) at `revision`.
    Delete {
        key: String,
        revision: i64,
        prev: Option<KeyValue>,
    },
}

impl KvEvent {
    pub fn key(&self) -> &str {
        match self {
            KvEvent::Put { kv, .. } => &kv.key,
            KvEvent::Delete { key, .. } => key,
        }
    }

    pub fn revision(&self) -> i64 {
        match self {
            KvEvent::Put { kv, .. } => kv.mod_revision,
            KvEvent::Delete { revision, .. } => *revision,
        }
    }
}

/// Every live key under a prefix, and the store revision the listing is consistent with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListResult {
    pub kvs: Vec<KeyValue>,
    pub revision: i64,
}

/// A condition of a transaction ([`KvBackend::txn`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key does not exist (etcd: `version == 0`).
    Absent(String),
    /// The key exists, whatever its revision (etcd: `version > 0`).
    Exists(String),
    /// The key exists and was last written at this revision (etcd: `mod_revision == r`).
    ModRevision(String, i64),
}

impl Compare {
    pub fn key(&self) -> &str {
        match self {
            Compare::Absent(k) | Compare::Exists(k) | Compare::ModRevision(k, _) => k,
        }
    }

    /// The error this condition stands for when the key's current mod revision is `current`
    /// (None: missing), or None when it holds. The same errors the single-key writes give:
    /// `AlreadyExists` (create), `NotFound` / `Conflict` (update, delete).
    pub fn failure(&self, current: Option<i64>) -> Option<DatastoreError> {
        match self {
            Compare::Absent(k) => current.map(|_| DatastoreError::AlreadyExists { key: k.clone() }),
            Compare::Exists(k) => current
                .is_none()
                .then(|| DatastoreError::NotFound { key: k.clone() }),
            Compare::ModRevision(k, e) => {
                (current != Some(*e)).then(|| conflict_or_missing(k, *e, current))
            }
        }
    }
}

/// One operation of a transaction. Reads see the writes of earlier operations of the same
/// transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    /// Creates or replaces the key (without a TTL).
    Put {
        key: String,
        value: Vec<u8>,
    },
    /// Deletes the key if it exists (a missing key is not an error: conditions belong in
    /// the compares).
    Delete {
        key: String,
    },
    Get {
        key: String,
    },
    /// Every live key under the prefix, unpaginated: for small prefixes only (the whole
    /// answer is one message).
    List {
        prefix: String,
    },
}

impl TxnOp {
    pub fn put(key: impl Into<String>, value: Vec<u8>) -> TxnOp {
        TxnOp::Put {
            key: key.into(),
            value,
        }
    }

    pub fn delete(key: impl Into<String>) -> TxnOp {
        TxnOp::Delete { key: key.into() }
    }

    pub fn get(key: impl Into<String>) -> TxnOp {
        TxnOp::Get { key: key.into() }
    }

    pub fn list(prefix: impl Into<String>) -> TxnOp {
        TxnOp::List {
            prefix: prefix.into(),
        }
    }

    pub fn is_write(&self) -> bool {
        matches!(self, TxnOp::Put { .. } | TxnOp::Delete { .. })
    }
}

/// The result of one [`TxnOp`], in the order of the operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOpResult {
    /// What the key now holds.
    Put(KeyValue),
    /// What the key held, or None if it did not exist.
    Delete(Option<KeyValue>),
    Get(Option<KeyValue>),
    List(Vec<KeyValue>),
}

/// What a successful transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResponse {
    /// The store's revision after the transaction (the revision of its last write, or the
    /// current revision if it wrote nothing).
    pub revision: i64,
    pub results: Vec<TxnOpResult>,
}

/// The largest value a backend stores by default: etcd's own request limit
/// (`--max-request-bytes`, 1.5 MiB) less 4 KiB for the key and the request's framing, so a
/// value fits whichever backend holds it.
pub const DEFAULT_MAX_VALUE_SIZE: usize = 1536 * 1024 - 4096;

static MAX_VALUE_SIZE: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_VALUE_SIZE);
static SKIPPED: AtomicU64 = AtomicU64::new(0);

/// The largest value any backend of this process stores (DATASTORE_MAX_VALUE_SIZE).
pub fn max_value_size() -> usize {
    MAX_VALUE_SIZE.load(Ordering::Relaxed)
}

/// Sets the limit for every backend of this process (a process serves one datastore; the
/// setting is the operator's, applied when the datastore is connected).
pub fn set_max_value_size(bytes: usize) {
    MAX_VALUE_SIZE.store(bytes, Ordering::Relaxed);
}

/// Refuses a value larger than [`max_value_size`]: every backend checks before writing, so
/// a huge resource fails where it is written instead of breaking every reader later.
pub fn check_value_size(key: &str, value: &[u8]) -> Result<()> {
    let max = max_value_size();
    if value.len() > max {
        return Err(DatastoreError::invalid(format!(
            "{key}: the value is {} bytes, more than the datastore accepts ({max} bytes; \
             DATASTORE_MAX_VALUE_SIZE, default {DEFAULT_MAX_VALUE_SIZE}, within etcd's \
             --max-request-bytes): split it into smaller resources",
            value.len()
        )));
    }
    Ok(())
}

/// Keys and values a backend could not decode and skipped (a list or watch goes on without
/// them), since the process started.
pub fn skipped_entries() -> u64 {
    SKIPPED.load(Ordering::Relaxed)
}

/// Reports a stored key (or value) that cannot be decoded and is skipped.
pub(crate) fn note_skipped(store: &str, key: &[u8], why: &str) {
    SKIPPED.fetch_add(1, Ordering::Relaxed);
    let shown: String = String::from_utf8_lossy(&key[..key.len().min(300)])
        .chars()
        .flat_map(char::escape_debug)
        .collect();
    tracing::warn!(store, key = %shown, "skipping a stored entry that cannot be decoded: {why} (delete it with etcdctl or the store's own tool)");
}

/// Refuses a transaction that writes one key twice (etcd refuses it too: the order of two
/// writes to a key in one revision would be undefined), or a value over the size limit.
pub(crate) fn check_txn_ops(ops: &[TxnOp]) -> Result<()> {
    let mut written = std::collections::HashSet::new();
    for op in ops {
        if let TxnOp::Put { key, value } = op {
            check_value_size(key, value)?;
        }
        if let TxnOp::Put { key, .. } | TxnOp::Delete { key } = op
            && !written.insert(key.as_str())
        {
            return Err(DatastoreError::invalid(format!(
                "transaction writes {key} more than once"
            )));
        }
    }
    Ok(())
}

/// What a watch delivers: batches of events in revision order, or the error that ended it.
pub type WatchItem = Result<Vec<KvEvent>>;

/// One message of a watch made of several streams (see [`Watch::from_streams`]): events of one
/// stream (or none, only progress), and how far that stream is complete once they are read.
#[derive(Debug)]
pub struct StreamMsg {
    pub stream: usize,
    /// Every change of this stream at or below this revision is in this message or earlier
    /// ones.
    pub complete_to: i64,
    pub item: Option<WatchItem>,
}

enum Feed {
    /// One revision order (etcd, SQLite, mem).
    Plain(mpsc::Receiver<WatchItem>),
    /// Streams side by side (the Kubernetes datastore's API resources), with how far each is
    /// complete in what the consumer has read.
    Streams {
        rx: mpsc::Receiver<StreamMsg>,
        done: Vec<i64>,
    },
}

/// A running watch. Dropping it stops the watch.
pub struct Watch {
    feed: Feed,
    task: Option<tokio::task::AbortHandle>,
}

impl Watch {
    /// Wraps the receiving end of a watch; `task` (if any) is aborted when the watch is dropped.
    pub fn new(rx: mpsc::Receiver<WatchItem>, task: Option<tokio::task::AbortHandle>) -> Self {
        Watch {
            feed: Feed::Plain(rx),
            task,
        }
    }

    /// A watch whose events come from several streams that are not in one revision order;
    /// `starts` is each stream's revision when it begins (complete up to there).
    pub fn from_streams(
        rx: mpsc::Receiver<StreamMsg>,
        starts: Vec<i64>,
        task: Option<tokio::task::AbortHandle>,
    ) -> Self {
        Watch {
            feed: Feed::Streams { rx, done: starts },
            task,
        }
    }

    /// For a watch of several streams: the revision up to which every change has been
    /// returned by [`Watch::next`] (the slowest stream's). None for a watch in one revision
    /// order, where the last event's revision says as much.
    pub fn progress(&self) -> Option<i64> {
        match &self.feed {
            Feed::Plain(_) => None,
            Feed::Streams { done, .. } => done.iter().copied().min(),
        }
    }

    /// The next batch (never empty), an error (after which the watch is over), or None when the
    /// backend closed the watch.
    pub async fn next(&mut self) -> Option<WatchItem> {
        match &mut self.feed {
            Feed::Plain(rx) => rx.recv().await,
            Feed::Streams { rx, done } => loop {
                let m = rx.recv().await?;
                if let Some(d) = done.get_mut(m.stream) {
                    *d = (*d).max(m.complete_to);
                }
                if let Some(item) = m.item {
                    return Some(item);
                }
            },
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

/// A key/value store with etcd v3 semantics.
///
/// Contract (every backend, checked by the shared conformance suite):
/// - `create` fails with `AlreadyExists` if the key exists.
/// - `update` and `delete` fail with `NotFound` if the key is missing, and with `Conflict`
///   (carrying the current revision) if `expected_mod_revision` is given and differs.
/// - Every successful write gets a new revision, greater than every earlier one.
/// - `watch(prefix, after)` delivers, in revision order and without gaps or duplicates, every
///   change under `prefix` with revision > `after`; if `after` is older than the compacted
///   revision it fails with `Compacted`.
/// - A key written with a TTL disappears when the TTL passes, and watchers see a `Delete`.
/// - `txn(compares, ops)` is all or nothing: if every compare holds, every op is applied, in
///   order, with no other write in between (reads in it see one consistent state); otherwise
///   nothing is written and it fails with the error of the first compare that does not hold
///   (`AlreadyExists`, `NotFound` or `Conflict`, as the single-key writes). Its writes get
///   revisions greater than every earlier write: one shared revision (etcd) or consecutive
///   ones (mem, local); watchers see them in op order. A key may be written once per txn.
pub trait KvBackend: Send + Sync + 'static {
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<KeyValue>>> + Send;

    fn list(&self, prefix: &str) -> impl Future<Output = Result<ListResult>> + Send;

    fn create(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<KeyValue>> + Send;

    fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected_mod_revision: Option<i64>,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<KeyValue>> + Send;

    /// Deletes the key and returns what it held.
    fn delete(
        &self,
        key: &str,
        expected_mod_revision: Option<i64>,
    ) -> impl Future<Output = Result<KeyValue>> + Send;

    /// A multi-key atomic transaction (etcd's Txn; see the contract above). With only reads,
    /// a consistent multi-key read in one round trip.
    fn txn(
        &self,
        compares: Vec<Compare>,
        ops: Vec<TxnOp>,
    ) -> impl Future<Output = Result<TxnResponse>> + Send;

    fn watch(
        &self,
        prefix: &str,
        after_revision: i64,
    ) -> impl Future<Output = Result<Watch>> + Send;

    /// Discards history up to and including `revision`.
    fn compact(&self, revision: i64) -> impl Future<Output = Result<()>> + Send;

    /// The store's current revision (the revision of the latest write).
    fn revision(&self) -> impl Future<Output = Result<i64>> + Send;

    /// Every live key under any of `prefixes`, as one listing: what a consumer of several
    /// prefixes lists before [`KvBackend::watch_many`] with the listing's revision. Stores
    /// with one global order (etcd, SQLite, mem) list the prefixes' common ancestor once; the
    /// Kubernetes datastore lists only the API resources behind the prefixes.
    fn list_many(&self, prefixes: &[String]) -> impl Future<Output = Result<ListResult>> + Send {
        async move {
            let mut listed = self.list(&common_prefix(prefixes)).await?;
            listed
                .kvs
                .retain(|kv| prefixes.iter().any(|p| kv.key.starts_with(p.as_str())));
            Ok(listed)
        }
    }

    /// Watches every key under any of `prefixes` after `after_revision` (the revision of a
    /// [`KvBackend::list_many`] of the same prefixes).
    fn watch_many(
        &self,
        prefixes: &[String],
        after_revision: i64,
    ) -> impl Future<Output = Result<Watch>> + Send {
        async move {
            let mut inner = self.watch(&common_prefix(prefixes), after_revision).await?;
            let prefixes = prefixes.to_vec();
            let (tx, rx) = mpsc::channel(16);
            let task = tokio::spawn(async move {
                while let Some(item) = inner.next().await {
                    let item = item.map(|events| {
                        events
                            .into_iter()
                            .filter(|e| prefixes.iter().any(|p| e.key().starts_with(p.as_str())))
                            .collect::<Vec<_>>()
                    });
                    if matches!(&item, Ok(events) if events.is_empty()) {
                        continue;
                    }
                    let end = item.is_err();
                    if tx.send(item).await.is_err() || end {
                        return;
                    }
                }
            });
            Ok(Watch::new(rx, Some(task.abort_handle())))
        }
    }
}

/// The longest common prefix of `prefixes` ("" when there are none).
pub fn common_prefix(prefixes: &[String]) -> String {
    let Some(first) = prefixes.first() else {
        return String::new();
    };
    let mut len = first.len();
    for p in &prefixes[1..] {
        len = first
            .bytes()
            .zip(p.bytes())
            .take(len)
            .take_while(|(a, b)| a == b)
            .count();
    }
    // Back off to a character boundary.
    while !first.is_char_boundary(len) {
        len -= 1;
    }
    first[..len].to_string()
}

/// The exclusive end of the key range that starts with `prefix` (etcd's prefix range end).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: the range is unbounded ("\0" means "to the end" in etcd).
    vec![0]
}

pub(crate) fn conflict_or_missing(
    key: &str,
    expected: i64,
    current: Option<i64>,
) -> DatastoreError {
    match current {
        None => DatastoreError::NotFound {
            key: key.to_string(),
        },
        Some(c) => DatastoreError::Conflict {
            key: key.to_string(),
            expected,
            current: Some(c),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_of_streams_is_complete_up_to_its_slowest_stream() {
        let (tx, rx) = mpsc::channel(8);
        let mut w = Watch::from_streams(rx, vec![100, 90], None);
        assert_eq!(w.progress(), Some(90));
        let put = |key: &str, rev: i64| KvEvent::Put {
            kv: KeyValue {
                key: key.into(),
                value: vec![],
                create_revision: rev,
                mod_revision: rev,
            },
            prev: None,
        };
        let msg = |stream, complete_to, item: Option<WatchItem>| StreamMsg {
            stream,
            complete_to,
            item,
        };
        // Stream 0 races ahead; nothing of stream 1 after 90 has been read yet.
        tx.send(msg(0, 200, Some(Ok(vec![put("/a", 200)]))))
            .await
            .unwrap();
        tx.send(msg(1, 150, Some(Ok(vec![put("/b", 150)]))))
            .await
            .unwrap();
        let first = w.next().await.unwrap().unwrap();
        assert_eq!(first[0].key(), "/a");
        assert_eq!(
            w.progress(),
            Some(90),
            "stream 1's event at 150 is not read yet"
        );
        w.next().await.unwrap().unwrap();
        assert_eq!(w.progress(), Some(150));
        // Progress-only messages (bookmarks) are consumed on the way to the next batch.
        tx.send(msg(1, 300, None)).await.unwrap();
        tx.send(msg(0, 310, Some(Ok(vec![put("/a", 310)]))))
            .await
            .unwrap();
        w.next().await.unwrap().unwrap();
        assert_eq!(w.progress(), Some(300));
        // A plain watch has no progress of its own.
        let (_t, r) = mpsc::channel(1);
        assert_eq!(Watch::new(r, None).progress(), None);
    }

    #[test]
    fn common_prefixes() {
        let p = |v: &[&str]| common_prefix(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            p(&["/calico/resources/v3/a/", "/calico/ipam/v2/x/"]),
            "/calico/"
        );
        assert_eq!(p(&["/a/b/"]), "/a/b/");
        assert_eq!(p(&[]), "");
        assert_eq!(p(&["/é1", "/é2"]), "/é");
    }

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end("ab"), b"ac".to_vec());
    }
}
