//! The status API's answers (`margay felix status`): a snapshot from the calculation thread,
//! the dataplane model, health, start-up phases and the problems found.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use margay_datastore::SyncStatus;
use tokio::sync::{oneshot, watch};

use super::{CalcInput, Control, Shared, lock};
use crate::status::{
    BootstrapView, ConnLimits, DataplaneView, EndpointView, IpSetView, ProblemView, REQUESTS,
    StartingDoc, StatusDoc, StatusSocket, TierView,
};

// ---- status API -----------------------------------------------------------------------------

fn sync_name(s: SyncStatus) -> &'static str {
    match s {
        SyncStatus::WaitForDatastore => "wait-for-datastore",
        SyncStatus::ResyncInProgress => "resync-in-progress",
        SyncStatus::InSync => "in-sync",
    }
}

fn endpoint_views(model: &margay_calc::DataplaneModel) -> Vec<EndpointView> {
    let tier_views = |tiers: &[margay_calc::TierInfo], stage: &str| -> Vec<TierView> {
        tiers
            .iter()
            .map(|t| TierView {
                name: t.name.clone(),
                stage: stage.to_string(),
                default_action: format!("{:?}", t.default_action),
                ingress: t.ingress_policies.iter().map(ToString::to_string).collect(),
                egress: t.egress_policies.iter().map(ToString::to_string).collect(),
            })
            .collect()
    };
    let mut out = Vec::new();
    for (id, ep) in &model.workload_endpoints {
        out.push(EndpointView {
            kind: "workload".into(),
            id: id.to_string(),
            name: ep.name.clone(),
            namespace: ep.namespace.clone(),
            interface: ep.interface.clone(),
            addresses: ep
                .ipv4_nets
                .iter()
                .chain(&ep.ipv6_nets)
                .map(ToString::to_string)
                .collect(),
            profiles: ep.profile_ids.clone(),
            tiers: tier_views(&ep.tiers, "normal"),
        });
    }
    for (id, ep) in &model.host_endpoints {
        let mut tiers = tier_views(&ep.untracked_tiers, "untracked");
        tiers.extend(tier_views(&ep.pre_dnat_tiers, "pre-dnat"));
        tiers.extend(tier_views(&ep.tiers, "normal"));
        tiers.extend(tier_views(&ep.forward_tiers, "forward"));
        out.push(EndpointView {
            kind: "host".into(),
            id: id.clone(),
            name: id.clone(),
            namespace: String::new(),
            interface: ep.interface.clone(),
            addresses: ep
                .expected_ipv4
                .iter()
                .chain(&ep.expected_ipv6)
                .map(ToString::to_string)
                .collect(),
            profiles: ep.profile_ids.clone(),
            tiers,
        });
    }
    out
}

async fn status_doc(shared: &Shared, with_config: bool) -> Result<StatusDoc, String> {
    let (tx, rx) = oneshot::channel();
    let sent = lock(&shared.calc_tx)
        .as_ref()
        .map(|c| c.send(CalcInput::Query(tx)).is_ok())
        .unwrap_or(false);
    if !sent {
        return Err("the calculation graph has stopped (Felix is shutting down)".into());
    }
    let snap = match tokio::time::timeout(Duration::from_secs(5), rx).await {
        Ok(Ok(s)) => s,
        Ok(Err(_)) => return Err("the calculation graph has stopped".into()),
        Err(_) => {
            return Err(
                "the calculation graph did not answer within 5s (it is busy); try again".into(),
            );
        }
    };
    let summary = shared.health.summary();
    let counts: BTreeMap<String, u64> = match serde_json::to_value(&snap.counts) {
        Ok(serde_json::Value::Object(o)) => o
            .into_iter()
            .filter_map(|(k, v)| v.as_u64().map(|n| (k, n)))
            .collect(),
        _ => BTreeMap::new(),
    };
    let (endpoints, in_sync_dp, services) = {
        let rec = shared.recording.lock();
        let services: BTreeMap<String, serde_json::Value> = rec
            .model
            .services
            .iter()
            .filter_map(|(id, s)| Some((id.to_string(), serde_json::to_value(&**s).ok()?)))
            .collect();
        (endpoint_views(&rec.model), rec.model.in_sync, services)
    };
    let mut problems: Vec<ProblemView> = lock(&shared.invalid)
        .iter()
        .map(|(r, why)| ProblemView {
            resource: r.clone(),
            stage: "validation".into(),
            reason: why.clone(),
        })
        .collect();
    problems.extend(snap.problems.into_iter().map(|p| ProblemView {
        resource: p.resource,
        stage: "graph".into(),
        reason: p.reason,
    }));
    let b = lock(&shared.bootstrap).clone();
    Ok(StatusDoc {
        hostname: shared.hostname.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        uptime_seconds: shared.start.elapsed().as_secs_f64(),
        live: summary.live,
        ready: summary.ready,
        health: summary.components,
        sync_status: sync_name(snap.sync).into(),
        in_sync: snap.in_sync,
        datastore: shared.datastore.clone(),
        dataplane: DataplaneView {
            driver: shared.driver_name.into(),
            in_sync: in_sync_dp && shared.dp_in_sync.load(Ordering::SeqCst),
            messages_applied: shared.messages_applied.load(Ordering::Relaxed),
            nft: shared.nft_stats.as_ref().and_then(|h| h.nft_json()),
            bpf: shared.nft_stats.as_ref().and_then(|h| h.bpf_json()),
        },
        counts,
        bootstrap: BootstrapView {
            phases: b.phases().to_vec(),
            ready_after_seconds: b.ready_after(),
        },
        endpoints,
        ip_sets: snap
            .ip_sets
            .into_iter()
            .map(|s| IpSetView {
                id: s.id,
                kind: format!("{:?}", s.kind),
                members: s.members,
                users: s.users,
                source: s.source,
            })
            .collect(),
        problems,
        services,
        config: with_config.then(|| lock(&shared.config_json).clone()),
    })
}

/// The JSON answer to one request.
async fn answer(shared: &Shared, what: &str) -> (u16, serde_json::Value) {
    let err = |code: u16, msg: String| (code, serde_json::json!({ "error": msg }));
    if what == "config" {
        return (200, lock(&shared.config_json).clone());
    }
    if what == "flows" || what.starts_with("flows?") {
        let Some(flows) = &shared.flows else {
            return err(
                404,
                "flow logs are off: set FlowLogsLocalReporter=Enabled \
                 (FELIX_FLOWLOGSLOCALREPORTER=Enabled) on this node, with the nftables dataplane"
                    .into(),
            );
        };
        return match crate::flows::Query::parse(what) {
            Ok(q) => match serde_json::to_value(flows.query(&q)) {
                Ok(v) => (200, v),
                Err(e) => err(500, format!("cannot encode the answer: {e}")),
            },
            Err(e) => err(400, e),
        };
    }
    if !REQUESTS.contains(&what) {
        return err(
            404,
            format!(
                "unknown request {what:?}; ask for one of: {}",
                REQUESTS.join(", ")
            ),
        );
    }
    let doc = match status_doc(shared, what == "all").await {
        Ok(d) => d,
        Err(e) => return err(503, e),
    };
    let v = match what {
        "endpoints" => serde_json::to_value(&doc.endpoints),
        "ipsets" => serde_json::to_value(&doc.ip_sets),
        "problems" => serde_json::to_value(&doc.problems),
        "bootstrap" => serde_json::to_value(&doc.bootstrap),
        "health" => serde_json::to_value(shared.health.summary()),
        _ => serde_json::to_value(&doc),
    };
    match v {
        Ok(v) => (200, v),
        Err(e) => err(500, format!("cannot encode the answer: {e}")),
    }
}

/// The answer while start-up is still under way: what it waits for and since when, the phases
/// done, health; 503 (Felix is not running its pipeline yet) except for `health`.
fn starting_answer(control: &Control, what: &str) -> (u16, serde_json::Value) {
    if what == "health" {
        return match serde_json::to_value(control.health.summary()) {
            Ok(v) => (200, v),
            Err(e) => (500, serde_json::json!({ "error": e.to_string() })),
        };
    }
    let waiting = lock(&control.waiting).clone();
    let b = lock(&control.bootstrap).clone();
    let waited = waiting.since.elapsed().as_secs_f64();
    let doc = StartingDoc {
        starting: true,
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").into(),
        uptime_seconds: b.start().elapsed().as_secs_f64(),
        waiting_for: waiting.what.clone(),
        waiting_seconds: waited,
        phases: b.phases().to_vec(),
        error: format!(
            "Felix is starting: waiting for {} (for {waited:.1}s)",
            waiting.what
        ),
    };
    match serde_json::to_value(&doc) {
        Ok(v) => (503, v),
        Err(e) => (500, serde_json::json!({ "error": e.to_string() })),
    }
}

pub(super) async fn serve_status(
    sock: StatusSocket,
    control: Control,
    stop: watch::Receiver<bool>,
) {
    let respond = move |what: String| {
        let control = control.clone();
        async move {
            let running = lock(&control.running).clone();
            match running {
                Some(shared) => answer(&shared, &what).await,
                None => starting_answer(&control, &what),
            }
        }
    };
    crate::status::serve(&sock.listener, ConnLimits::default(), respond, stop).await;
}
