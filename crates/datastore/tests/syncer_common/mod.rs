//! Helpers for syncer tests: a consumer-side view that checks the update stream is coherent.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use margay_api::{IPPool, ObjectMeta, Resource, ResourceKey};
use margay_datastore::{Client, KvBackend, SyncStatus, SyncerEvent, UpdateType};
use tokio::sync::mpsc;

/// What a consumer of the syncer knows: key → (revision, value).
#[derive(Default)]
pub struct View {
    pub items: HashMap<ResourceKey, (i64, Resource)>,
    pub statuses: Vec<SyncStatus>,
    /// New/Updated events for a key whose revision the view already had (spurious re-adds).
    pub redundant: usize,
    pub updates: usize,
}

impl View {
    pub fn apply(&mut self, ev: SyncerEvent) {
        match ev {
            SyncerEvent::Status(s) => self.statuses.push(s),
            SyncerEvent::Updates(us) => {
                assert!(!us.is_empty(), "empty update batch");
                for u in us {
                    self.updates += 1;
                    match u.update_type {
                        UpdateType::New => {
                            assert!(
                                !self.items.contains_key(&u.key),
                                "New for a key already present: {}",
                                u.key
                            );
                            self.items.insert(u.key, (u.revision, u.value.unwrap()));
                        }
                        UpdateType::Updated => {
                            let old = self.items.get(&u.key).map(|(r, _)| *r);
                            let old = old
                                .unwrap_or_else(|| panic!("Updated for an unknown key: {}", u.key));
                            if old == u.revision {
                                self.redundant += 1;
                            }
                            assert!(u.revision >= old, "revision went backwards for {}", u.key);
                            self.items.insert(u.key, (u.revision, u.value.unwrap()));
                        }
                        UpdateType::Deleted => {
                            assert!(u.value.is_none());
                            assert!(
                                self.items.remove(&u.key).is_some(),
                                "Deleted for an unknown key: {}",
                                u.key
                            );
                        }
                    }
                }
            }
        }
    }

    pub fn in_sync(&self) -> bool {
        self.statuses.last() == Some(&SyncStatus::InSync)
    }

    /// Applies events until `done(self)` holds, failing after `timeout`.
    pub async fn until(
        &mut self,
        rx: &mut mpsc::Receiver<SyncerEvent>,
        timeout: Duration,
        done: impl Fn(&View) -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        while !done(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, rx.recv()).await {
                Ok(Some(ev)) => self.apply(ev),
                Ok(None) => panic!("syncer stopped"),
                Err(_) => panic!(
                    "timed out: {} items, statuses {:?}, {} updates",
                    self.items.len(),
                    self.statuses,
                    self.updates
                ),
            }
        }
    }

    /// The view equals a fresh list of the kind (keys and revisions).
    pub async fn matches_list<B: KvBackend>(
        &self,
        client: &Client<B>,
        kind: margay_api::Kind,
    ) -> Result<(), String> {
        let listed = client
            .list(kind, None, "")
            .await
            .map_err(|e| e.to_string())?;
        let want: HashMap<ResourceKey, i64> = listed
            .items
            .iter()
            .map(|r| (r.key(), r.metadata().resource_version.parse().unwrap()))
            .collect();
        let have: HashMap<ResourceKey, i64> = self
            .items
            .iter()
            .filter(|(k, _)| k.kind == kind)
            .map(|(k, (r, _))| (k.clone(), *r))
            .collect();
        if want == have {
            Ok(())
        } else {
            let missing = want.keys().filter(|k| !have.contains_key(*k)).count();
            let extra = have.keys().filter(|k| !want.contains_key(*k)).count();
            let stale = want
                .iter()
                .filter(|(k, r)| have.get(*k).is_some_and(|h| h != *r))
                .count();
            Err(format!(
                "view differs from list: {missing} missing, {extra} extra, {stale} stale"
            ))
        }
    }
}

pub fn pool(name: &str, octet: u32) -> Resource {
    let spec = margay_api::ippool::IPPoolSpec {
        cidr: format!("10.{}.{}.0/24", octet / 256, octet % 256),
        ..Default::default()
    };
    Resource::IPPool(IPPool::new(ObjectMeta::named(name), spec))
}
