//! Feeds IPAM blocks (and their host affinity) to the calculation graph, for routes to remote
//! blocks (RouteSource CalicoIPAM). Blocks live outside the v3 resources
//! (`/calico/ipam/v2/assignment/...`), so they have their own list-and-watch loop.

use margay_api::net::Cidr;
use margay_datastore::{KvBackend, MirrorEvent, PrefixMirror};
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

impl From<MirrorEvent<(Cidr, Option<String>)>> for BlockEvent {
    fn from(ev: MirrorEvent<(Cidr, Option<String>)>) -> Self {
        match ev {
            MirrorEvent::Changed(_, (cidr, host)) => BlockEvent::Block(cidr, host),
            MirrorEvent::Removed(_, (cidr, _)) => BlockEvent::Block(cidr, None),
            MirrorEvent::InSync => BlockEvent::InSync,
        }
    }
}

/// Lists then watches blocks until `out` closes; relists (sending only differences) after any
/// watch error. Never returns an error: datastore trouble is retried with backoff.
pub async fn run<B: KvBackend>(backend: B, out: mpsc::Sender<BlockEvent>) {
    // A value that is not a block (corrupt, or another version's) counts as no block.
    let decode = |key: &str, value: &[u8]| {
        let a = affinity(value);
        if a.is_none() {
            tracing::warn!(key = %key, "ignoring an unreadable IPAM block");
        }
        a
    };
    PrefixMirror::new(BLOCKS_PREFIX, decode)
        .named("IPAM blocks", "IPAM block")
        .run(backend, out)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use margay_datastore::MemBackend;
    use std::time::Duration;

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
