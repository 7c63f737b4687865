//! The client-side dedupe buffer (pure).
//!
//! It remembers what it has passed downstream (key → value and revision, plus the datastore
//! revision that state is complete up to) so that a reconnect — to the same Typha or another
//! one — emits only real changes:
//!
//! - The active connection's KVs pass through, less those that change nothing (same value and
//!   revision as already passed, or a delete of a key never passed).
//! - A new connection (after a failure, or a migration while the old one still runs) is
//!   *staged*: its snapshot and deltas build a separate state, nothing goes downstream. The
//!   staged state is committed once that connection is in sync and complete up to at least
//!   the revision downstream has already seen (`as_of`): then exactly the differences go
//!   downstream — updates for changed or new keys, deletes for keys the new connection no
//!   longer has — and nothing for keys that are unchanged. Because the committed state is at
//!   least as new as what downstream saw, a delete is never spurious and no key goes back to
//!   an older revision.
//! - Downstream sees WaitForDatastore/ResyncInProgress only before its first InSync, and
//!   InSync exactly once.

use std::collections::HashMap;

use bytes::Bytes;
use margay_datastore::SyncStatus;

use crate::proto::{Kv, UpdateKind};

#[derive(Debug, Clone, PartialEq, Eq)]
struct Known {
    value: Bytes,
    revision: i64,
}

#[derive(Debug, Default)]
struct Staging {
    state: HashMap<String, Known>,
    in_sync: bool,
    as_of: i64,
}

/// What to send downstream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Output {
    pub kvs: Vec<Kv>,
    pub status: Option<SyncStatus>,
}

#[derive(Debug, Default)]
pub struct Dedupe {
    known: HashMap<String, Known>,
    as_of: i64,
    /// The last status sent downstream.
    sent: Option<SyncStatus>,
    staging: Option<Staging>,
    stats: DedupeStats,
}

/// Counters (for tests, logs and metrics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DedupeStats {
    /// KVs dropped because they changed nothing.
    pub suppressed: u64,
    /// Commits of a staged connection.
    pub resyncs: u64,
    /// Deletes emitted by commits (keys the new connection no longer had).
    pub resync_deletes: u64,
}

impl Dedupe {
    pub fn new() -> Dedupe {
        Dedupe::default()
    }

    /// Whether anything was ever passed downstream (a new connection must then be staged).
    pub fn has_state(&self) -> bool {
        self.sent.is_some() || !self.known.is_empty()
    }

    pub fn stats(&self) -> DedupeStats {
        self.stats
    }

    /// The revision downstream's state is complete up to.
    pub fn as_of(&self) -> i64 {
        self.as_of
    }

    /// Keys downstream has.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// Downstream's view (for tests).
    pub fn view(&self) -> impl Iterator<Item = (&str, &Bytes, i64)> {
        self.known
            .iter()
            .map(|(k, v)| (k.as_str(), &v.value, v.revision))
    }

    /// KVs of the active connection.
    pub fn pass_kvs(&mut self, kvs: Vec<Kv>) -> Vec<Kv> {
        let mut out = Vec::with_capacity(kvs.len());
        for kv in kvs {
            match kv.value {
                Some(value) => {
                    let new = Known {
                        value,
                        revision: kv.revision,
                    };
                    let kind = match self.known.get(&kv.key) {
                        Some(old) if *old == new => {
                            self.stats.suppressed += 1;
                            continue;
                        }
                        Some(_) => UpdateKind::Updated,
                        None => UpdateKind::New,
                    };
                    out.push(Kv {
                        key: kv.key.clone(),
                        value: Some(new.value.clone()),
                        revision: kv.revision,
                        kind,
                    });
                    self.known.insert(kv.key, new);
                }
                None => {
                    if self.known.remove(&kv.key).is_some() {
                        out.push(Kv {
                            value: None,
                            kind: UpdateKind::Deleted,
                            ..kv
                        });
                    } else {
                        self.stats.suppressed += 1;
                    }
                }
            }
        }
        out
    }

    /// A status of the active connection; returns the status to forward, if any.
    pub fn pass_status(&mut self, status: SyncStatus, as_of: i64) -> Option<SyncStatus> {
        self.as_of = self.as_of.max(as_of);
        self.forward(status)
    }

    fn forward(&mut self, status: SyncStatus) -> Option<SyncStatus> {
        match (self.sent, status) {
            (Some(SyncStatus::InSync), _) => None,
            (Some(s), new) if s == new => None,
            _ => {
                self.sent = Some(status);
                Some(status)
            }
        }
    }

    /// Starts staging a new connection (dropping any earlier staged one).
    pub fn stage_begin(&mut self) {
        self.staging = Some(Staging::default());
    }

    pub fn is_staging(&self) -> bool {
        self.staging.is_some()
    }

    pub fn stage_abort(&mut self) {
        self.staging = None;
    }

    /// KVs of the staged connection.
    pub fn stage_kvs(&mut self, kvs: Vec<Kv>) {
        let Some(s) = &mut self.staging else { return };
        for kv in kvs {
            match kv.value {
                Some(value) => {
                    s.state.insert(
                        kv.key,
                        Known {
                            value,
                            revision: kv.revision,
                        },
                    );
                }
                None => {
                    s.state.remove(&kv.key);
                }
            }
        }
    }

    /// A status of the staged connection.
    pub fn stage_status(&mut self, status: SyncStatus, as_of: i64) {
        if let Some(s) = &mut self.staging {
            if status == SyncStatus::InSync {
                s.in_sync = true;
            }
            s.as_of = s.as_of.max(as_of);
        }
    }

    /// Whether the staged connection is in sync (it may still be behind downstream).
    pub fn stage_in_sync(&self) -> bool {
        self.staging.as_ref().is_some_and(|s| s.in_sync)
    }

    /// Whether the staged connection can be committed: in sync and complete up to at least
    /// what downstream has seen.
    pub fn stage_ready(&self) -> bool {
        self.staging
            .as_ref()
            .is_some_and(|s| s.in_sync && s.as_of >= self.as_of)
    }

    /// The staged connection's revision (how far it has caught up).
    pub fn stage_as_of(&self) -> Option<i64> {
        self.staging.as_ref().map(|s| s.as_of)
    }

    /// Makes the staged connection the active one: emits exactly the differences between
    /// downstream's view and the staged state. Call only when [`Dedupe::stage_ready`].
    pub fn stage_commit(&mut self) -> Output {
        let Some(s) = self.staging.take() else {
            return Output::default();
        };
        let mut kvs = Vec::new();
        let mut deletes: Vec<String> = self
            .known
            .keys()
            .filter(|k| !s.state.contains_key(*k))
            .cloned()
            .collect();
        deletes.sort();
        for key in deletes {
            if let Some(old) = self.known.remove(&key) {
                // The delete happened at or before the staged revision.
                kvs.push(Kv {
                    key,
                    value: None,
                    revision: s.as_of.max(old.revision),
                    kind: UpdateKind::Deleted,
                });
            }
        }
        self.stats.resync_deletes += kvs.len() as u64;
        let mut staged: Vec<(String, Known)> = s.state.into_iter().collect();
        staged.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, new) in staged {
            let kind = match self.known.get(&key) {
                Some(old) if *old == new => {
                    self.stats.suppressed += 1;
                    continue;
                }
                Some(_) => UpdateKind::Updated,
                None => UpdateKind::New,
            };
            kvs.push(Kv {
                key: key.clone(),
                value: Some(new.value.clone()),
                revision: new.revision,
                kind,
            });
            self.known.insert(key, new);
        }
        self.as_of = self.as_of.max(s.as_of);
        self.stats.resyncs += 1;
        Output {
            kvs,
            status: self.forward(SyncStatus::InSync),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn kv(k: &str, v: Option<&str>, rev: i64) -> Kv {
        Kv {
            key: k.into(),
            value: v.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            revision: rev,
            kind: if v.is_some() {
                UpdateKind::New
            } else {
                UpdateKind::Deleted
            },
        }
    }

    fn keys(kvs: &[Kv]) -> Vec<(String, UpdateKind)> {
        kvs.iter().map(|k| (k.key.clone(), k.kind)).collect()
    }

    #[test]
    fn reconnect_emits_only_real_changes() {
        let mut d = Dedupe::new();
        assert_eq!(
            d.pass_status(SyncStatus::ResyncInProgress, 0),
            Some(SyncStatus::ResyncInProgress)
        );
        let out = d.pass_kvs(vec![
            kv("a", Some("1"), 1),
            kv("b", Some("2"), 2),
            kv("c", Some("3"), 3),
        ]);
        assert_eq!(out.len(), 3);
        assert_eq!(
            d.pass_status(SyncStatus::InSync, 3),
            Some(SyncStatus::InSync)
        );
        // Duplicates and deletes of unknown keys are dropped.
        assert!(
            d.pass_kvs(vec![kv("a", Some("1"), 1), kv("zz", None, 4)])
                .is_empty()
        );
        // Reconnect: a unchanged, b changed, c gone, d new.
        d.stage_begin();
        d.stage_status(SyncStatus::ResyncInProgress, 0);
        d.stage_kvs(vec![
            kv("a", Some("1"), 1),
            kv("b", Some("20"), 5),
            kv("d", Some("4"), 6),
        ]);
        assert!(!d.stage_ready());
        d.stage_status(SyncStatus::InSync, 6);
        assert!(d.stage_ready());
        let out = d.stage_commit();
        assert_eq!(
            keys(&out.kvs),
            vec![
                ("c".into(), UpdateKind::Deleted),
                ("b".into(), UpdateKind::Updated),
                ("d".into(), UpdateKind::New)
            ]
        );
        assert_eq!(out.status, None, "InSync is sent once");
        assert_eq!(d.len(), 3);
        assert_eq!(d.as_of(), 6);
    }

    #[test]
    fn a_staged_connection_that_is_behind_waits() {
        let mut d = Dedupe::new();
        d.pass_kvs(vec![kv("a", Some("1"), 1), kv("b", Some("2"), 10)]);
        d.pass_status(SyncStatus::InSync, 10);
        d.stage_begin();
        // The new Typha has not seen b yet: committing now would delete it spuriously.
        d.stage_kvs(vec![kv("a", Some("1"), 1)]);
        d.stage_status(SyncStatus::InSync, 5);
        assert!(d.stage_in_sync() && !d.stage_ready());
        d.stage_kvs(vec![kv("b", Some("2"), 10)]);
        d.stage_status(SyncStatus::InSync, 10);
        assert!(d.stage_ready());
        let out = d.stage_commit();
        assert!(out.kvs.is_empty(), "{:?}", out.kvs);
        assert_eq!(d.stats().resync_deletes, 0);
    }

    #[test]
    fn first_in_sync_may_come_from_a_staged_connection() {
        let mut d = Dedupe::new();
        assert_eq!(
            d.pass_status(SyncStatus::WaitForDatastore, 0),
            Some(SyncStatus::WaitForDatastore)
        );
        d.pass_kvs(vec![kv("a", Some("1"), 1)]);
        d.stage_begin();
        d.stage_kvs(vec![kv("a", Some("1"), 1)]);
        d.stage_status(SyncStatus::InSync, 1);
        let out = d.stage_commit();
        assert!(out.kvs.is_empty());
        assert_eq!(out.status, Some(SyncStatus::InSync));
        assert_eq!(d.pass_status(SyncStatus::ResyncInProgress, 1), None);
    }
}
