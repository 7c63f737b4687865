//! Feeds IPAM blocks (and their host affinity) to the calculation graph, for routes to remote
//! blocks (RouteSource CalicoIPAM). Blocks live outside the v3 resources
//! (`/calico/ipam/v2/assignment/...`), so they have their own list-and-watch loop.

use std::collections::HashMap;
use std::time::Duration;

use margay_api::net::Cidr;
use margay_datastore::{KvBackend, KvEvent};
use margay_ipam::AllocationBlock;
use tokio::sync::mpsc;

/// Where every block lives.
pub const BLOCKS_PREFIX: &str = "/calico/ipam/v2/assignment/";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockEvent {
    /// A block and the host it is affine to (None: gone, or affine to nobody).
    Block(Cidr, Option<String>),
    /// Every block has been listed once.
    InSync,
}

/// A stored block's CIDR and the host it is affine to (None when deleted or unaffine); None
/// when the value is not a block.
pub fn affinity(value: &[u8]) -> Option<(Cidr, Option<String>)> {
    let b: AllocationBlock = serde_json::from_slice(value).ok()?;
    let host = b.host().map(str::to_string);
    Some((b.cidr.network(), if b.deleted { None } else { host }))
}

/// Lists then watches blocks until `out` closes; relists (sending only differences) after any
/// watch error. Never returns an error: datastore trouble is retried with backoff.
pub async fn run<B: KvBackend>(backend: B, out: mpsc::Sender<BlockEvent>) {
    let mut known: HashMap<String, (Cidr, Option<String>)> = HashMap::new();
    let mut reported_in_sync = false;
    let mut delay = Duration::from_millis(200);
    loop {
        let listed = match backend.list(BLOCKS_PREFIX).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("listing IPAM blocks failed (retrying): {e}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        delay = Duration::from_millis(200);
        let mut seen: HashMap<String, (Cidr, Option<String>)> = HashMap::new();
        for kv in &listed.kvs {
            match affinity(&kv.value) {
                Some(a) => {
                    seen.insert(kv.key.clone(), a);
                }
                None => tracing::warn!(key = %kv.key, "ignoring an unreadable IPAM block"),
            }
        }
        for (key, (cidr, _)) in &known {
            if !seen.contains_key(key) && out.send(BlockEvent::Block(*cidr, None)).await.is_err() {
                return;
            }
        }
        for (key, a) in &seen {
            if known.get(key) != Some(a)
                && out.send(BlockEvent::Block(a.0, a.1.clone())).await.is_err()
            {
                return;
            }
        }
        known = seen;
        if !reported_in_sync {
            reported_in_sync = true;
            if out.send(BlockEvent::InSync).await.is_err() {
                return;
            }
        }
        let mut watch = match backend.watch(BLOCKS_PREFIX, listed.revision).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!("watching IPAM blocks failed (relisting): {e}");
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        while let Some(item) = watch.next().await {
            let events = match item {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::info!("IPAM block watch ended ({e}); relisting");
                    break;
                }
            };
            for ev in events {
                let key = ev.key().to_string();
                let update = match &ev {
                    KvEvent::Put { kv, .. } => affinity(&kv.value),
                    KvEvent::Delete { .. } => None,
                };
                let msg = match update {
                    Some(a) => {
                        if known.get(&key) == Some(&a) {
                            continue;
                        }
                        known.insert(key, a.clone());
                        BlockEvent::Block(a.0, a.1)
                    }
                    None => match known.remove(&key) {
                        Some((cidr, _)) => BlockEvent::Block(cidr, None),
                        None => continue,
                    },
                };
                if out.send(msg).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use margay_datastore::MemBackend;

    fn block_json(cidr: &str, host: Option<&str>) -> Vec<u8> {
        let b = AllocationBlock::new(Cidr::parse(cidr).expect("cidr"), host);
        serde_json::to_vec(&b).expect("json")
    }

    async fn next(rx: &mut mpsc::Receiver<BlockEvent>) -> BlockEvent {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("an event within 5 s")
            .expect("channel open")
    }

    #[tokio::test]
    async fn lists_then_follows_blocks() {
        let kv = MemBackend::new();
        let key_a = "/calico/ipam/v2/assignment/ipv4/block/10.0.0.0-26";
        let key_b = "/calico/ipam/v2/assignment/ipv4/block/10.0.0.64-26";
        kv.create(key_a, block_json("10.0.0.0/26", Some("n1")), None)
            .await
            .expect("create");
        let (tx, mut rx) = mpsc::channel(16);
        let task = tokio::spawn(run(kv.clone(), tx));
        let a = Cidr::parse("10.0.0.0/26").expect("cidr");
        let b = Cidr::parse("10.0.0.64/26").expect("cidr");
        assert_eq!(next(&mut rx).await, BlockEvent::Block(a, Some("n1".into())));
        assert_eq!(next(&mut rx).await, BlockEvent::InSync);
        kv.create(key_b, block_json("10.0.0.64/26", Some("n2")), None)
            .await
            .expect("create");
        assert_eq!(next(&mut rx).await, BlockEvent::Block(b, Some("n2".into())));
        let cur = kv.get(key_a).await.expect("get").expect("present");
        kv.update(
            key_a,
            block_json("10.0.0.0/26", None),
            Some(cur.mod_revision),
            None,
        )
        .await
        .expect("update");
        assert_eq!(next(&mut rx).await, BlockEvent::Block(a, None));
        kv.delete(key_b, None).await.expect("delete");
        assert_eq!(next(&mut rx).await, BlockEvent::Block(b, None));
        task.abort();
    }
}
