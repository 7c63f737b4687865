//! An in-memory backend with the full [`KvBackend`] contract: the reference implementation
//! for the conformance suite, and a fast store for unit tests of the layers above.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::error::{DatastoreError, Result};
use crate::kv::{
    Compare, KeyValue, KvBackend, KvEvent, ListResult, TxnOp, TxnOpResult, TxnResponse, Watch,
    check_txn_ops, check_value_size, conflict_or_missing,
};

/// How often watchers look for expired keys when nothing else happens.
const EXPIRY_SWEEP: Duration = Duration::from_millis(50);

#[derive(Clone, Default)]
pub struct MemBackend {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    // Bumped on every write so watchers wake up.
    notify: Notify,
}

struct Notify(watch::Sender<i64>);

impl Default for Notify {
    fn default() -> Self {
        Notify(watch::channel(0).0)
    }
}

#[derive(Default)]
struct State {
    data: BTreeMap<String, (KeyValue, Option<Instant>)>,
    /// Events with revision > `compacted`, in order.
    log: Vec<KvEvent>,
    revision: i64,
    compacted: i64,
}

impl State {
    fn live(&self, key: &str, now: Instant) -> Option<&KeyValue> {
        match self.data.get(key) {
            Some((kv, expiry)) if expiry.is_none_or(|e| e > now) => Some(kv),
            _ => None,
        }
    }

    fn expire(&mut self, now: Instant) -> bool {
        let due: Vec<String> = self
            .data
            .iter()
            .filter(|(_, (_, e))| e.is_some_and(|e| e <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in &due {
            if let Some((prev, _)) = self.data.remove(key) {
                self.revision += 1;
                self.log.push(KvEvent::Delete {
                    key: key.clone(),
                    revision: self.revision,
                    prev: Some(prev),
                });
            }
        }
        !due.is_empty()
    }

    fn put(&mut self, key: &str, value: Vec<u8>, ttl: Option<Duration>, now: Instant) -> KeyValue {
        self.revision += 1;
        let prev = self.data.get(key).map(|(kv, _)| kv.clone());
        let kv = KeyValue {
            key: key.to_string(),
            value,
            create_revision: prev.as_ref().map_or(self.revision, |p| p.create_revision),
            mod_revision: self.revision,
        };
        self.data
            .insert(key.to_string(), (kv.clone(), ttl.map(|t| now + t)));
        self.log.push(KvEvent::Put {
            kv: kv.clone(),
            prev,
        });
        kv
    }
}

impl State {
    /// Deletes a live key, logging the Delete; returns what it held.
    fn remove(&mut self, key: &str) -> Option<KeyValue> {
        let (prev, _) = self.data.remove(key)?;
        self.revision += 1;
        self.log.push(KvEvent::Delete {
            key: key.to_string(),
            revision: self.revision,
            prev: Some(prev.clone()),
        });
        Some(prev)
    }

    fn list(&self, prefix: &str, now: Instant) -> Vec<KeyValue> {
        self.data
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(_, (_, e))| e.is_none_or(|e| e > now))
            .map(|(_, (kv, _))| kv.clone())
            .collect()
    }
}

impl MemBackend {
    pub fn new() -> Self {
        MemBackend::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way later
        // operations would misread, so a poisoned lock is still usable.
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn write<T>(&self, f: impl FnOnce(&mut State, Instant) -> Result<T>) -> Result<T> {
        let now = Instant::now();
        let (result, revision) = {
            let mut s = self.lock();
            s.expire(now);
            let r = f(&mut s, now);
            (r, s.revision)
        };
        self.inner.notify.0.send_replace(revision);
        result
    }
}

impl KvBackend for MemBackend {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        Ok(self.lock().live(key, Instant::now()).cloned())
    }

    async fn list(&self, prefix: &str) -> Result<ListResult> {
        let s = self.lock();
        let kvs = s.list(prefix, Instant::now());
        Ok(ListResult {
            kvs,
            revision: s.revision,
        })
    }

    async fn create(&self, key: &str, value: Vec<u8>, ttl: Option<Duration>) -> Result<KeyValue> {
        check_value_size(key, &value)?;
        self.write(|s, now| {
            if s.live(key, now).is_some() {
                return Err(DatastoreError::AlreadyExists {
                    key: key.to_string(),
                });
            }
            Ok(s.put(key, value, ttl, now))
        })
    }

    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Option<i64>,
        ttl: Option<Duration>,
    ) -> Result<KeyValue> {
        check_value_size(key, &value)?;
        self.write(|s, now| {
            let current = s.live(key, now).map(|kv| kv.mod_revision);
            match (current, expected) {
                (None, _) => Err(DatastoreError::NotFound {
                    key: key.to_string(),
                }),
                (Some(c), Some(e)) if c != e => Err(conflict_or_missing(key, e, Some(c))),
                _ => Ok(s.put(key, value, ttl, now)),
            }
        })
    }

    async fn delete(&self, key: &str, expected: Option<i64>) -> Result<KeyValue> {
        self.write(|s, now| {
            let current = s.live(key, now).map(|kv| kv.mod_revision);
            match (current, expected) {
                (None, _) => Err(DatastoreError::NotFound {
                    key: key.to_string(),
                }),
                (Some(c), Some(e)) if c != e => Err(conflict_or_missing(key, e, Some(c))),
                _ => s.remove(key).ok_or_else(|| DatastoreError::NotFound {
                    key: key.to_string(),
                }),
            }
        })
    }

    async fn txn(&self, compares: Vec<Compare>, ops: Vec<TxnOp>) -> Result<TxnResponse> {
        check_txn_ops(&ops)?;
        self.write(|s, now| {
            for c in &compares {
                let current = s.live(c.key(), now).map(|kv| kv.mod_revision);
                if let Some(e) = c.failure(current) {
                    return Err(e);
                }
            }
            let mut results = Vec::with_capacity(ops.len());
            for op in ops {
                results.push(match op {
                    TxnOp::Put { key, value } => TxnOpResult::Put(s.put(&key, value, None, now)),
                    TxnOp::Delete { key } => TxnOpResult::Delete(s.remove(&key)),
                    TxnOp::Get { key } => TxnOpResult::Get(s.live(&key, now).cloned()),
                    TxnOp::List { prefix } => TxnOpResult::List(s.list(&prefix, now)),
                });
            }
            Ok(TxnResponse {
                revision: s.revision,
                results,
            })
        })
    }

    async fn watch(&self, prefix: &str, after_revision: i64) -> Result<Watch> {
        {
            let s = self.lock();
            if after_revision < s.compacted {
                return Err(DatastoreError::Compacted {
                    requested: after_revision,
                    compacted: s.compacted,
                });
            }
        }
        let (tx, rx) = mpsc::channel(64);
        let this = self.clone();
        let prefix = prefix.to_string();
        let mut wake = self.inner.notify.0.subscribe();
        let task = tokio::spawn(async move {
            let mut last = after_revision;
            loop {
                let batch = {
                    let mut s = this.lock();
                    if s.expire(Instant::now()) {
                        let r = s.revision;
                        this.inner.notify.0.send_replace(r);
                    }
                    if last < s.compacted {
                        Err(DatastoreError::Compacted {
                            requested: last,
                            compacted: s.compacted,
                        })
                    } else {
                        let start = s.log.partition_point(|e| e.revision() <= last);
                        let events: Vec<KvEvent> = s.log[start..]
                            .iter()
                            .filter(|e| e.key().starts_with(&prefix))
                            .cloned()
                            .collect();
                        last = s.revision;
                        Ok(events)
                    }
                };
                match batch {
                    Ok(events) if events.is_empty() => {}
                    Ok(events) => {
                        if tx.send(Ok(events)).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
                // Wake on the next write, or after a while to expire TTL'd keys.
                let _ = tokio::time::timeout(EXPIRY_SWEEP, wake.changed()).await;
            }
        });
        Ok(Watch::new(rx, Some(task.abort_handle())))
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        let mut s = self.lock();
        if revision > s.revision {
            return Err(DatastoreError::invalid(format!(
                "cannot compact to revision {revision}: the store is only at {}",
                s.revision
            )));
        }
        if revision > s.compacted {
            let keep = s.log.partition_point(|e| e.revision() <= revision);
            s.log.drain(..keep);
            s.compacted = revision;
        }
        Ok(())
    }

    async fn revision(&self) -> Result<i64> {
        Ok(self.lock().revision)
    }
}
