//! Start-up and feeding through Typha: Felix's inputs come from Typha's felix syncer instead
//! of the datastore.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc as smpsc;
use std::time::{Duration, Instant};

use margay_api::{Kind, Resource};
use margay_datastore::{SyncStatus, SyncerEvent};
use margay_felix_config::{Loaded, load};
use margay_typha::ConnectionState;
use tokio::sync::mpsc;

use super::{CalcInput, Reason, Shared, StartError};
use crate::health::{FELIX_STARTUP, HealthAggregator};
use crate::inputs::{DatastoreInputs, LocalInputs};
use crate::typha_feed::{FeedItem, TYPHA_CONNECTION, TyphaFeed};

// ---- Typha ---------------------------------------------------------------------------------------

/// Where Felix's inputs come from.
pub(super) enum Source {
    Datastore(margay_datastore::AnyBackend),
    /// Typha: the running client, what it delivered during start-up (replayed into the
    /// pipeline first) and the pools in it.
    Typha {
        feed: TyphaFeed,
        buffered: Vec<FeedItem>,
        pools: Vec<Resource>,
    },
}

pub(super) struct TyphaStart {
    pub(super) buffered: Vec<FeedItem>,
    pub(super) inputs: DatastoreInputs,
    pub(super) loaded: Loaded,
    pub(super) pools: Vec<Resource>,
}

/// Start-up through Typha: consumes the stream until it is in sync and the configuration it
/// carries loads with ClusterInformation ready (Calico's wait for datastoreReady), keeping
/// everything for the pipeline.
pub(super) async fn typha_startup(
    feed: &mut TyphaFeed,
    local: &LocalInputs,
    health: &HealthAggregator,
    hostname: &str,
) -> Result<TyphaStart, StartError> {
    let mut buffered = Vec::new();
    let mut inputs = DatastoreInputs::default();
    let mut pools: BTreeMap<String, Resource> = BTreeMap::new();
    let mut in_sync = false;
    let mut last_wait_log: Option<Instant> = None;
    loop {
        let Some(items) = feed.next().await else {
            return Err(StartError::Fatal(feed.stop_reason()));
        };
        let mut changed = false;
        for item in &items {
            match item {
                FeedItem::Syncer(SyncerEvent::Updates(us)) => {
                    for u in us {
                        changed |= inputs.apply(&u.key, u.value.as_ref(), hostname);
                        if u.key.kind == Kind::IPPool {
                            match &u.value {
                                Some(v) => pools.insert(u.key.name.clone(), v.clone()),
                                None => pools.remove(&u.key.name),
                            };
                        }
                    }
                }
                FeedItem::Syncer(SyncerEvent::Status(SyncStatus::InSync)) => {
                    in_sync = true;
                    changed = true;
                }
                FeedItem::Connection(c) => report_typha(health, c),
                _ => {}
            }
        }
        buffered.extend(items);
        if !in_sync || !changed {
            continue;
        }
        let loaded = match load(&inputs.config_inputs(local, hostname)) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "Failed to parse/validate configuration from Typha; waiting for a change");
                continue;
            }
        };
        if loaded.datastore_ready != Some(true) {
            health.report(FELIX_STARTUP, true, true);
            if last_wait_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                last_wait_log = Some(Instant::now());
                tracing::warn!(
                    "Waiting for datastore to be initialized: ClusterInformation \"default\" \
                     does not have datastoreReady: true (margay node startup sets it)"
                );
            }
            continue;
        }
        return Ok(TyphaStart {
            buffered,
            inputs,
            loaded,
            pools: pools.into_values().collect(),
        });
    }
}

/// The TyphaConnection reporter, whose detail says which Typha Felix uses (or why none).
fn report_typha(health: &HealthAggregator, c: &ConnectionState) {
    match c {
        ConnectionState::Connected { addr, server_id } => {
            tracing::info!(addr = %addr, server = %server_id, "Typha connection up");
            health.report_detail(
                TYPHA_CONNECTION,
                true,
                true,
                &format!("connected to Typha at {addr} ({server_id})"),
            );
        }
        ConnectionState::Disconnected { reason } => {
            tracing::warn!(reason = %reason, "No Typha connection; retrying");
            health.report_detail(TYPHA_CONNECTION, true, false, reason);
        }
    }
}

/// Feeds the pipeline from Typha: first what start-up consumed, then the live stream. A
/// client that stops (every Typha it knew left the Service) stops Felix, so its restart
/// looks Typha up again.
pub(super) async fn run_typha_feed(
    mut feed: TyphaFeed,
    buffered: Vec<FeedItem>,
    sync_tx: mpsc::Sender<SyncerEvent>,
    calc_tx: smpsc::Sender<CalcInput>,
    shared: Arc<Shared>,
) {
    let health = shared.health.clone();
    let mut pending = Some(buffered);
    loop {
        let items = match pending.take() {
            Some(b) => b,
            None => match feed.next().await {
                Some(i) => i,
                None => {
                    let why = feed.stop_reason();
                    tracing::error!("{why}");
                    shared.stop_with(Reason::Fatal(why));
                    return;
                }
            },
        };
        for item in items {
            match item {
                FeedItem::Syncer(ev) => {
                    if sync_tx.send(ev).await.is_err() {
                        return;
                    }
                }
                FeedItem::Block(ev) => {
                    if calc_tx.send(CalcInput::Block(ev)).is_err() {
                        return;
                    }
                }
                FeedItem::Services(evs) => {
                    let inputs = evs.into_iter().map(super::services::decode).collect();
                    if calc_tx.send(CalcInput::Services(inputs)).is_err() {
                        return;
                    }
                }
                FeedItem::Connection(c) => report_typha(&health, &c),
            }
        }
    }
}
