//! Where confd's inputs come from (edge): the datastore directly (the watcher syncer for the
//! BGP kinds plus this node's block affinities), or Typha's `bgp` syncer. Both end as the
//! same [`Input`] stream.

use margay_api::net::Cidr;
use margay_datastore::{
    KvBackend, MirrorEvent, PrefixMirror, SyncStatus, SyncerEvent, SyncerOptions, WatcherSyncer,
};
use margay_ipam::block::{AffinityState, BlockAffinity};
use margay_typha::client::{self, ClientEvent, ClientOptions, ClientStats};
use margay_typha::syncers::{BGP_KINDS, IPAM_AFFINITIES_PREFIX};
use tokio::sync::mpsc;

use crate::daemon::Input;

/// A stored affinity value: its state, None when deleted or unreadable.
pub fn affinity_state(value: &[u8]) -> Option<AffinityState> {
    let a: BlockAffinity = serde_json::from_slice(value).ok()?;
    (!a.deleted).then_some(a.state)
}

/// `/calico/ipam/v2/host/<host>/ipv4/block/<cidr>` → (host, block).
pub fn parse_affinity_key(key: &str) -> Option<(&str, Cidr)> {
    let rest = key.strip_prefix(IPAM_AFFINITIES_PREFIX)?;
    let (host, tail) = rest.split_once('/')?;
    if !(tail.starts_with("ipv4/block/") || tail.starts_with("ipv6/block/")) {
        return None;
    }
    Some((host, margay_ipam::pools::cidr_of_key(tail)?))
}

/// Runs the direct datastore feed until `out` closes: the syncer for the BGP kinds and a
/// list-and-watch of this node's affinities. `Input::InSync` is sent once both have
/// listed everything.
pub async fn run_direct<B: KvBackend + Clone + Send + Sync + 'static>(
    backend: B,
    node: String,
    out: mpsc::Sender<Input>,
) {
    let (stx, mut srx) = mpsc::channel(8);
    let syncer = WatcherSyncer::new(backend.clone(), SyncerOptions::new(BGP_KINDS.to_vec()));
    let syncer_task = tokio::spawn(syncer.run(stx));
    let (atx, mut arx) = mpsc::channel(64);
    let aff_task = tokio::spawn(watch_affinities(backend, node, atx));
    let (mut syncer_done, mut aff_done, mut sent) = (false, false, false);
    loop {
        let msg = tokio::select! {
            ev = srx.recv() => match ev {
                Some(SyncerEvent::Updates(u)) => Some(Input::Updates(u)),
                Some(SyncerEvent::Status(SyncStatus::InSync)) => { syncer_done = true; None }
                Some(SyncerEvent::Status(_)) => None,
                None => break,
            },
            ev = arx.recv() => match ev {
                Some(Input::InSync) => { aff_done = true; None }
                Some(other) => Some(other),
                None => break,
            },
        };
        if let Some(m) = msg
            && out.send(m).await.is_err()
        {
            break;
        }
        if syncer_done && aff_done && !sent {
            sent = true;
            if out.send(Input::InSync).await.is_err() {
                break;
            }
        }
    }
    syncer_task.abort();
    aff_task.abort();
}

impl From<MirrorEvent<(Cidr, AffinityState)>> for Input {
    fn from(ev: MirrorEvent<(Cidr, AffinityState)>) -> Self {
        match ev {
            MirrorEvent::Changed(_, (cidr, state)) => Input::Affinity(cidr, Some(state)),
            MirrorEvent::Removed(_, (cidr, _)) => Input::Affinity(cidr, None),
            MirrorEvent::InSync => Input::InSync,
        }
    }
}

/// Lists then watches `/calico/ipam/v2/host/<node>/`; relists (differences only) after a
/// watch error. Felix's block watcher follows blocks for routes; confd needs the node's own
/// claims, which live under another prefix (and are what Typha's bgp syncer carries).
pub async fn watch_affinities<B: KvBackend>(backend: B, node: String, out: mpsc::Sender<Input>) {
    // Keys that are not a block's affinity, and deleted or unreadable claims, count as absent.
    let decode =
        |key: &str, value: &[u8]| Some((parse_affinity_key(key)?.1, affinity_state(value)?));
    PrefixMirror::new(format!("{IPAM_AFFINITIES_PREFIX}{node}/"), decode)
        .named("block affinities", "block affinity")
        .run(backend, out)
        .await;
}

/// Runs the Typha feed (syncer type `bgp`) until `out` closes. Typha carries every node's
/// affinities; only this node's are passed on.
pub async fn run_typha(opts: ClientOptions, node: String, out: mpsc::Sender<Input>) {
    let (tx, mut rx) = mpsc::channel(16);
    let stats = std::sync::Arc::new(ClientStats::default());
    let task = tokio::spawn(client::run(opts, tx, stats));
    while let Some(ev) = rx.recv().await {
        let inputs = convert_typha(ev, &node);
        for i in inputs {
            if out.send(i).await.is_err() {
                task.abort();
                return;
            }
        }
    }
    task.abort();
}

/// One Typha event as inputs.
pub fn convert_typha(ev: ClientEvent, node: &str) -> Vec<Input> {
    match ev {
        ClientEvent::Status(SyncStatus::InSync) => vec![Input::InSync],
        ClientEvent::Status(_) => Vec::new(),
        ClientEvent::Connection(c) => {
            tracing::info!("Typha connection: {c:?}");
            Vec::new()
        }
        ClientEvent::Kvs(kvs) => {
            let mut out = Vec::new();
            let mut updates = Vec::new();
            for kv in kvs {
                if let Some((host, cidr)) = parse_affinity_key(&kv.key) {
                    if host == node {
                        let state = kv.value.as_deref().and_then(affinity_state);
                        out.push(Input::Affinity(cidr, state));
                    }
                    continue;
                }
                updates.extend(client::to_update_or_deleted(&kv));
            }
            if !updates.is_empty() {
                out.insert(0, Input::Updates(updates));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use margay_datastore::MemBackend;
    use std::time::Duration;

    fn aff(state: AffinityState) -> Vec<u8> {
        serde_json::to_vec(&BlockAffinity::new(state)).expect("json")
    }

    async fn next(rx: &mut mpsc::Receiver<Input>) -> Input {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("an input within 5 s")
            .expect("open")
    }

    #[test]
    fn typha_kvs_become_inputs() {
        use margay_typha::proto::{Kv, UpdateKind};
        let peer = br#"{"apiVersion":"projectcalico.org/v3","kind":"BGPPeer","metadata":{"name":"tor"},"spec":{"peerIP":"10.0.0.254","asNumber":65000}}"#;
        let kv = |key: &str, value: Option<Vec<u8>>, revision| Kv {
            key: key.into(),
            value: value.map(bytes::Bytes::from),
            revision,
            kind: UpdateKind::New,
        };
        let out = convert_typha(
            ClientEvent::Kvs(vec![
                kv(
                    "/calico/resources/v3/projectcalico.org/bgppeers/tor",
                    Some(peer.to_vec()),
                    5,
                ),
                kv(
                    "/calico/ipam/v2/host/n1/ipv4/block/10.65.0.0-26",
                    Some(aff(AffinityState::Confirmed)),
                    6,
                ),
                // Another node's claim: not ours to announce.
                kv(
                    "/calico/ipam/v2/host/n2/ipv4/block/10.65.1.0-26",
                    Some(aff(AffinityState::Confirmed)),
                    7,
                ),
                kv("/calico/ipam/v2/host/n1/ipv4/block/10.65.2.0-26", None, 8),
            ]),
            "n1",
        );
        assert_eq!(out.len(), 3, "{out:?}");
        let Input::Updates(u) = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(u[0].key.name, "tor");
        assert_eq!(
            out[1],
            Input::Affinity(
                Cidr::parse("10.65.0.0/26").expect("cidr"),
                Some(AffinityState::Confirmed)
            )
        );
        assert_eq!(
            out[2],
            Input::Affinity(Cidr::parse("10.65.2.0/26").expect("cidr"), None)
        );
        assert_eq!(
            convert_typha(ClientEvent::Status(SyncStatus::InSync), "n1"),
            vec![Input::InSync]
        );
    }

    #[test]
    fn affinity_keys() {
        let (h, c) = parse_affinity_key("/calico/ipam/v2/host/node-1/ipv4/block/10.65.0.64-26")
            .expect("key");
        assert_eq!(h, "node-1");
        assert_eq!(c, Cidr::parse("10.65.0.64/26").expect("cidr"));
        assert!(parse_affinity_key("/calico/ipam/v2/host/n/ipv4/other/x").is_none());
    }

    #[tokio::test]
    async fn follows_this_nodes_affinities_only() {
        let kv = MemBackend::new();
        let mine = "/calico/ipam/v2/host/n1/ipv4/block/10.65.0.0-26";
        let theirs = "/calico/ipam/v2/host/n10/ipv4/block/10.65.1.0-26";
        kv.create(mine, aff(AffinityState::Pending), None)
            .await
            .expect("create");
        kv.create(theirs, aff(AffinityState::Confirmed), None)
            .await
            .expect("create");
        let (tx, mut rx) = mpsc::channel(16);
        let task = tokio::spawn(watch_affinities(kv.clone(), "n1".into(), tx));
        let block = Cidr::parse("10.65.0.0/26").expect("cidr");
        assert_eq!(
            next(&mut rx).await,
            Input::Affinity(block, Some(AffinityState::Pending))
        );
        assert_eq!(next(&mut rx).await, Input::InSync);
        let cur = kv.get(mine).await.expect("get").expect("present");
        kv.update(
            mine,
            aff(AffinityState::Confirmed),
            Some(cur.mod_revision),
            None,
        )
        .await
        .expect("update");
        assert_eq!(
            next(&mut rx).await,
            Input::Affinity(block, Some(AffinityState::Confirmed))
        );
        kv.delete(mine, None).await.expect("delete");
        assert_eq!(next(&mut rx).await, Input::Affinity(block, None));
        task.abort();
    }
}
