//! The pipeline's two threads: the calculation graph (updates in, 10 ms flush tick, batches
//! out) and the dataplane driver (batches applied in order, housekeeping between them).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc as smpsc;
use std::time::{Duration, Instant};

use margay_calc::{CalcGraph, Message};
use margay_dataplane::{DataplaneDriver, DataplaneError, StatusUpdate};
use margay_datastore::SyncStatus;

use super::{CalcInput, EncapPolicy, FLUSH_INTERVAL, GraphSnapshot, Reason, Shared};
use crate::dataplane_config::Encap;
use crate::health::{CALC_GRAPH_HEALTH_INTERVAL, CALCULATION_GRAPH, INTERNAL_DATAPLANE};

// ---- calculation graph --------------------------------------------------------------------

fn sync_gauge(s: SyncStatus) -> i64 {
    match s {
        SyncStatus::WaitForDatastore => 1,
        SyncStatus::ResyncInProgress => 2,
        SyncStatus::InSync => 3,
    }
}

pub(super) fn calc_loop(
    rx: smpsc::Receiver<CalcInput>,
    mut graph: CalcGraph,
    dp_tx: smpsc::Sender<Vec<Message>>,
    shared: Arc<Shared>,
    encap: EncapPolicy,
    services_pending: bool,
    peers: Option<crate::flows::PeerFeed>,
) {
    let m = shared.metrics.clone();
    let mut sync = SyncStatus::WaitForDatastore;
    let mut dirty = false;
    let mut flush_now = false;
    let mut last_flush = Instant::now();
    let mut last_health = Instant::now();
    let mut last_counts: Option<Instant> = None;
    let mut latest_encap: Option<Encap> = None;
    let mut encap_reported = false;
    // In sync means the resources and the IPAM blocks have both been listed: routes computed
    // before the blocks are known would be wrong (per-workload instead of per-block).
    let mut blocks_in_sync = false;
    // And the Services and EndpointSlices (when they are watched): a service programmed
    // before its slices are listed would reject its clients for a moment.
    let mut services_in_sync = !services_pending;
    shared.health.report(CALCULATION_GRAPH, true, false);
    loop {
        let now = Instant::now();
        let wait = if dirty {
            (last_flush + FLUSH_INTERVAL).saturating_duration_since(now)
        } else {
            CALC_GRAPH_HEALTH_INTERVAL.saturating_sub(now.duration_since(last_health))
        };
        match rx.recv_timeout(wait) {
            Ok(CalcInput::Updates(updates)) => {
                if let Some(peers) = &peers {
                    crate::flows::feed_peers(peers, &updates);
                }
                let mut kinds: BTreeMap<&'static str, u64> = BTreeMap::new();
                for (key, value) in updates {
                    let t = Instant::now();
                    graph.on_update(&key, value);
                    m.calc_update_time.observe_duration(t.elapsed());
                    *kinds.entry(key.kind.name()).or_default() += 1;
                }
                for (k, n) in kinds {
                    m.calc_updates_processed.add(k, n);
                }
                dirty = true;
                shared
                    .health
                    .report(CALCULATION_GRAPH, true, sync == SyncStatus::InSync);
                last_health = Instant::now();
            }
            Ok(CalcInput::Status(s)) => {
                m.resync_state.set(sync_gauge(s));
                if s == SyncStatus::ResyncInProgress {
                    m.resyncs_started.inc();
                }
                sync = s;
                if s == SyncStatus::InSync && blocks_in_sync && services_in_sync && !graph.in_sync()
                {
                    tracing::info!("First time we've been in sync");
                    graph.on_in_sync();
                    dirty = true;
                    flush_now = true;
                }
                shared
                    .health
                    .report(CALCULATION_GRAPH, true, sync == SyncStatus::InSync);
                last_health = Instant::now();
            }
            Ok(CalcInput::Block(ev)) => {
                match ev {
                    crate::blocks::BlockEvent::Block(cidr, host) => graph.on_ipam_block(cidr, host),
                    crate::blocks::BlockEvent::InSync => {
                        blocks_in_sync = true;
                        if sync == SyncStatus::InSync && services_in_sync && !graph.in_sync() {
                            tracing::info!("First time we've been in sync");
                            graph.on_in_sync();
                            flush_now = true;
                        }
                    }
                }
                dirty = true;
            }
            Ok(CalcInput::Services(inputs)) => {
                let n = inputs.len() as u64;
                if super::services::apply(&mut graph, inputs) && !services_in_sync {
                    services_in_sync = true;
                    if sync == SyncStatus::InSync && blocks_in_sync && !graph.in_sync() {
                        tracing::info!("First time we've been in sync");
                        graph.on_in_sync();
                        flush_now = true;
                    }
                }
                m.calc_updates_processed.add("KubernetesService", n);
                dirty = true;
            }
            Ok(CalcInput::Query(reply)) => {
                let _ = reply.send(GraphSnapshot {
                    counts: graph.counts(),
                    ip_sets: graph.ip_set_status(),
                    problems: graph.problems(),
                    in_sync: graph.in_sync(),
                    sync,
                });
            }
            Err(smpsc::RecvTimeoutError::Timeout) => {}
            Err(smpsc::RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        if dirty && (flush_now || now >= last_flush + FLUSH_INTERVAL) {
            let t = Instant::now();
            let msgs = graph.flush();
            let took = t.elapsed();
            if took > Duration::from_secs(1) {
                tracing::info!(?took, "Flush took over 1s");
            }
            dirty = false;
            flush_now = false;
            last_flush = now;
            if !msgs.is_empty() {
                m.calc_output_events.add(msgs.len() as u64);
                let mut has_in_sync = false;
                for msg in &msgs {
                    match msg {
                        Message::Encapsulation {
                            ipip,
                            vxlan,
                            vxlan_v6,
                        } => {
                            latest_encap = Some(Encap {
                                ipip: *ipip,
                                vxlan: *vxlan,
                                vxlan_v6: *vxlan_v6,
                            })
                        }
                        Message::InSync => has_in_sync = true,
                        _ => {}
                    }
                }
                // Pools are only complete once in sync: compare then, never before.
                if graph.in_sync()
                    && !encap_reported
                    && let Some(e) = latest_encap
                {
                    let eff = encap.effective(e);
                    if eff != encap.startup {
                        encap_reported = true;
                        tracing::warn!(
                            old = ?encap.startup,
                            new = ?eff,
                            "IPIP, VXLAN and/or noencap encapsulation changed, need to restart."
                        );
                        shared.stop_with(Reason::EncapChanged(format!(
                            "{:?} -> {:?}",
                            encap.startup, eff
                        )));
                    }
                }
                if has_in_sync {
                    tracing::info!("First flush after becoming in sync, sending InSync message.");
                    shared.mark("first_in_sync");
                    last_counts = None;
                }
                if dp_tx.send(msgs).is_err() {
                    return;
                }
            }
        }
        if last_counts.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
            m.set_counts(&graph.counts());
            last_counts = Some(now);
        }
        if now.duration_since(last_health) >= CALC_GRAPH_HEALTH_INTERVAL {
            shared
                .health
                .report(CALCULATION_GRAPH, true, sync == SyncStatus::InSync);
            last_health = now;
        }
    }
}

// ---- dataplane ------------------------------------------------------------------------------

pub(super) fn dataplane_loop(
    rx: smpsc::Receiver<Vec<Message>>,
    mut driver: Box<dyn DataplaneDriver>,
    shared: Arc<Shared>,
) {
    let m = shared.metrics.clone();
    let started = Instant::now();
    let mut in_sync = false;
    let tick = Duration::from_secs(1);
    shared.health.report(INTERNAL_DATAPLANE, true, false);
    loop {
        // Retries of failed writes and drift refreshes, between batches.
        match driver.housekeeping() {
            Ok(status) => {
                if !in_sync && status.contains(&StatusUpdate::DataplaneInSync) {
                    in_sync = true;
                    shared.dp_in_sync.store(true, Ordering::SeqCst);
                    m.dataplane_initial_resync_time
                        .set(started.elapsed().as_secs_f64());
                    shared.mark("first_apply");
                    tracing::info!(driver = driver.name(), "Dataplane in sync");
                }
            }
            Err(e) => {
                m.dataplane_failures.inc();
                tracing::warn!(error = %e, "Dataplane housekeeping failed; will retry");
            }
        }
        match rx.recv_timeout(tick) {
            Ok(mut batch) => {
                // Coalesce what is already queued: consecutive batches keep their order.
                while batch.len() < 100_000 {
                    match rx.try_recv() {
                        Ok(more) => batch.extend(more),
                        Err(_) => break,
                    }
                }
                let t = Instant::now();
                match driver.apply(&batch) {
                    Ok(status) => {
                        m.dataplane_apply_time.observe_duration(t.elapsed());
                        let mut kinds: BTreeMap<&'static str, u64> = BTreeMap::new();
                        for msg in &batch {
                            *kinds.entry(msg.kind()).or_default() += 1;
                        }
                        for (k, n) in kinds {
                            m.dataplane_messages.add(k, n);
                        }
                        shared
                            .messages_applied
                            .fetch_add(batch.len() as u64, Ordering::Relaxed);
                        if !in_sync && status.contains(&StatusUpdate::DataplaneInSync) {
                            in_sync = true;
                            shared.dp_in_sync.store(true, Ordering::SeqCst);
                            m.dataplane_initial_resync_time
                                .set(started.elapsed().as_secs_f64());
                            shared.mark("first_apply");
                            tracing::info!(driver = driver.name(), "Dataplane in sync");
                        }
                    }
                    Err(DataplaneError::Contract(e)) => {
                        tracing::error!(error = %e, "The dataplane driver refused a batch: a bug in the calculation graph");
                        shared.stop_with(Reason::Fatal(format!("dataplane contract broken: {e}")));
                        shared.health.report(INTERNAL_DATAPLANE, false, false);
                        return;
                    }
                    Err(e) => {
                        m.dataplane_failures.inc();
                        tracing::warn!(error = %e, "Applying dataplane updates failed; will retry");
                    }
                }
            }
            Err(smpsc::RecvTimeoutError::Timeout) => {}
            Err(smpsc::RecvTimeoutError::Disconnected) => return,
        }
        shared.health.report(INTERNAL_DATAPLANE, true, in_sync);
    }
}
