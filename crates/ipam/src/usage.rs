//! Utilization of pools and blocks (pure): what `margay ctl ipam show` prints and what the CNI
//! plugin's STATUS checks.

use std::net::IpAddr;

use margay_api::net::Cidr;
use serde::Serialize;

use crate::block::AllocationBlock;
use crate::pools::PoolInfo;

/// One block's use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockUsage {
    pub cidr: Cidr,
    /// The host the block is affine to, if any.
    pub affinity: Option<String>,
    pub capacity: u128,
    pub in_use: u128,
    /// Free addresses covered by an IPReservation (never handed out).
    pub reserved: u128,
}

impl BlockUsage {
    pub fn free(&self) -> u128 {
        self.capacity
            .saturating_sub(self.in_use)
            .saturating_sub(self.reserved)
    }
}

/// One pool's use, with its blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolUsage {
    pub name: String,
    pub cidr: Cidr,
    pub capacity: u128,
    pub in_use: u128,
    pub reserved: u128,
    pub blocks: Vec<BlockUsage>,
}

impl PoolUsage {
    pub fn free(&self) -> u128 {
        self.capacity
            .saturating_sub(self.in_use)
            .saturating_sub(self.reserved)
    }
}

/// Addresses of `within` covered by `reservations` (nested reservations counted once).
fn reserved_in(within: &Cidr, reservations: &[Cidr]) -> u128 {
    let mut total = 0u128;
    for (i, r) in reservations.iter().enumerate() {
        if r.version() != within.version() || !r.overlaps(within) {
            continue;
        }
        // Skip a reservation inside another one (counted by the outer one).
        let nested = reservations.iter().enumerate().any(|(j, o)| {
            j != i
                && o.version() == r.version()
                && o.contains(r.addr())
                && (o.prefix() < r.prefix() || (o.prefix() == r.prefix() && j < i))
        });
        if nested {
            continue;
        }
        // Two CIDRs that overlap are nested: the smaller one is the intersection.
        total += if r.prefix() >= within.prefix() {
            r.size()
        } else {
            within.size()
        };
    }
    total.min(within.size())
}

fn reserved_and_allocated(block: &AllocationBlock, reservations: &[Cidr]) -> u128 {
    block
        .allocated()
        .filter(|a| reservations.iter().any(|r| r.contains(a.ip)))
        .count() as u128
}

/// The use of one block.
pub fn block_usage(block: &AllocationBlock, reservations: &[Cidr]) -> BlockUsage {
    let in_use = block.in_use() as u128;
    let reserved = reserved_in(&block.cidr, reservations)
        .saturating_sub(reserved_and_allocated(block, reservations));
    BlockUsage {
        cidr: block.cidr,
        affinity: block.affinity.clone(),
        capacity: block.cidr.size(),
        in_use,
        reserved,
    }
}

/// The use of one pool: every address of the pool, in use where a block of the pool records
/// an allocation.
pub fn pool_usage(pool: &PoolInfo, blocks: &[AllocationBlock], reservations: &[Cidr]) -> PoolUsage {
    let in_pool = |ip: IpAddr| pool.cidr.contains(ip);
    let mut out = PoolUsage {
        name: pool.name.clone(),
        cidr: pool.cidr,
        capacity: pool.cidr.size(),
        in_use: 0,
        reserved: 0,
        blocks: Vec::new(),
    };
    let mut reserved_allocated = 0u128;
    for b in blocks.iter().filter(|b| in_pool(b.cidr.addr())) {
        let u = block_usage(b, reservations);
        out.in_use += u.in_use;
        reserved_allocated += reserved_and_allocated(b, reservations);
        out.blocks.push(u);
    }
    out.blocks.sort_by_key(|b| b.cidr);
    out.reserved = reserved_in(&pool.cidr, reservations).saturating_sub(reserved_allocated);
    out
}

/// The use of every pool, in the order given.
pub fn utilization(
    pools: &[PoolInfo],
    blocks: &[AllocationBlock],
    reservations: &[Cidr],
) -> Vec<PoolUsage> {
    pools
        .iter()
        .map(|p| pool_usage(p, blocks, reservations))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use margay_api::IPPool;
    use margay_api::ObjectMeta;
    use margay_api::ippool::IPPoolSpec;

    use super::*;

    fn pool(cidr: &str, block: i64) -> PoolInfo {
        PoolInfo::from_resource(&IPPool::new(
            ObjectMeta::named("p"),
            IPPoolSpec {
                cidr: cidr.into(),
                block_size: Some(block),
                ..IPPoolSpec::default()
            },
        ))
        .unwrap()
    }

    #[test]
    fn counts_blocks_and_reservations() {
        let p = pool("10.0.0.0/24", 28);
        let mut b = AllocationBlock::new(Cidr::parse("10.0.0.16/28").unwrap(), Some("n1"));
        for i in 0..3 {
            let ip: IpAddr = format!("10.0.0.{}", 16 + i).parse().unwrap();
            b.assign_ip(ip, "h", &BTreeMap::new()).unwrap();
        }
        let other = AllocationBlock::new(Cidr::parse("10.9.0.0/28").unwrap(), None);
        let res = vec![
            Cidr::parse("10.0.0.16/30").unwrap(),
            Cidr::parse("10.0.0.17/32").unwrap(),
        ];
        let u = pool_usage(&p, &[b, other], &res);
        assert_eq!(u.capacity, 256);
        assert_eq!(u.in_use, 3);
        // 4 reserved addresses, 3 of them allocated before the reservation: 1 left reserved.
        assert_eq!(u.reserved, 1);
        assert_eq!(u.free(), 252);
        assert_eq!(u.blocks.len(), 1);
        assert_eq!(u.blocks[0].affinity.as_deref(), Some("host:n1"));
        assert_eq!(u.blocks[0].free(), 12);
    }
}
