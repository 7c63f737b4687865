//! Pure decisions: datastore keys, which pools a request may use, the order in which a host
//! tries a pool's blocks, reservations.

use std::collections::BTreeMap;
use std::net::IpAddr;

use margay_api::IPPool;
use margay_api::ippool::{AllowedUse, IPPoolSpec};
use margay_api::net::Cidr;
use margay_selector::Selector;

use crate::error::IpamError;

pub const IPAM_PREFIX: &str = "/calico/ipam/v2/";
pub const CONFIG_KEY: &str = "/calico/ipam/v2/config";

fn cidr_segment(cidr: &Cidr) -> String {
    cidr.network().to_string().replace('/', "-")
}

/// Parses a key segment like `10.0.0.0-26`.
pub fn parse_cidr_segment(segment: &str) -> Option<Cidr> {
    let (addr, len) = segment.rsplit_once('-')?;
    Cidr::parse(&format!("{addr}/{len}")).ok()
}

pub fn block_key(cidr: &Cidr) -> String {
    format!(
        "{IPAM_PREFIX}assignment/ipv{}/block/{}",
        cidr.version(),
        cidr_segment(cidr)
    )
}

pub fn blocks_prefix(version: u8) -> String {
    format!("{IPAM_PREFIX}assignment/ipv{version}/block/")
}

pub fn affinity_key(host: &str, cidr: &Cidr) -> String {
    format!(
        "{IPAM_PREFIX}host/{host}/ipv{}/block/{}",
        cidr.version(),
        cidr_segment(cidr)
    )
}

pub fn host_affinities_prefix(host: &str, version: u8) -> String {
    format!("{IPAM_PREFIX}host/{host}/ipv{version}/block/")
}

pub fn all_affinities_prefix() -> String {
    format!("{IPAM_PREFIX}host/")
}

pub fn handle_key(handle: &str) -> String {
    format!("{IPAM_PREFIX}handle/{handle}")
}

pub fn handles_prefix() -> String {
    format!("{IPAM_PREFIX}handle/")
}

/// The block CIDR at the end of a block or affinity key.
pub fn cidr_of_key(key: &str) -> Option<Cidr> {
    parse_cidr_segment(key.rsplit('/').next()?)
}

/// A pool as IPAM uses it.
#[derive(Debug, Clone)]
pub struct PoolInfo {
    pub name: String,
    pub cidr: Cidr,
    pub block_size: u8,
    pub disabled: bool,
    pub node_selector: Selector,
    pub allowed_uses: Vec<AllowedUse>,
}

impl PoolInfo {
    pub fn from_resource(pool: &IPPool) -> Result<PoolInfo, IpamError> {
        let spec = &pool.spec;
        let cidr = Cidr::parse(&spec.cidr)
            .map_err(|e| IpamError::BadPool {
                pool: pool.metadata.name.clone(),
                reason: e,
            })?
            .network();
        let default_size = if cidr.is_ipv4() {
            IPPoolSpec::DEFAULT_BLOCK_SIZE_V4
        } else {
            IPPoolSpec::DEFAULT_BLOCK_SIZE_V6
        };
        let block_size = match spec.block_size {
            None => default_size,
            Some(b) => u8::try_from(b).map_err(|_| IpamError::BadPool {
                pool: pool.metadata.name.clone(),
                reason: format!("blockSize {b} is out of range"),
            })?,
        };
        if block_size < cidr.prefix() || block_size > if cidr.is_ipv4() { 32 } else { 128 } {
            return Err(IpamError::BadPool {
                pool: pool.metadata.name.clone(),
                reason: format!(
                    "blockSize /{block_size} does not fit in the pool's /{}",
                    cidr.prefix()
                ),
            });
        }
        let node_selector = if spec.node_selector.trim().is_empty() {
            Selector::all()
        } else {
            Selector::parse(&spec.node_selector).map_err(|e| IpamError::BadPool {
                pool: pool.metadata.name.clone(),
                reason: format!("nodeSelector: {e}"),
            })?
        };
        let allowed_uses = if spec.allowed_uses.is_empty() {
            vec![AllowedUse::Workload, AllowedUse::Tunnel]
        } else {
            spec.allowed_uses.clone()
        };
        Ok(PoolInfo {
            name: pool.metadata.name.clone(),
            cidr,
            block_size,
            disabled: spec.disabled,
            node_selector,
            allowed_uses,
        })
    }

    /// The block of this pool that contains `ip`.
    pub fn block_of(&self, ip: IpAddr) -> Option<Cidr> {
        if !self.cidr.contains(ip) {
            return None;
        }
        Cidr::new(ip, self.block_size).ok().map(|c| c.network())
    }

    pub fn num_blocks(&self) -> u128 {
        let bits = u32::from(self.block_size - self.cidr.prefix());
        1u128.checked_shl(bits).unwrap_or(u128::MAX)
    }

    /// The `index`th block of the pool.
    pub fn block_at(&self, index: u128) -> Option<Cidr> {
        let host_bits = u32::from(if self.cidr.is_ipv4() { 32 } else { 128 } - self.block_size);
        let step = 1u128.checked_shl(host_bits)?;
        let offset = index.checked_mul(step)?;
        let addr = match self.cidr.addr() {
            IpAddr::V4(a) => {
                let v = u128::from(u32::from(a)).checked_add(offset)?;
                IpAddr::V4(u32::try_from(v).ok()?.into())
            }
            IpAddr::V6(a) => IpAddr::V6(u128::from(a).checked_add(offset)?.into()),
        };
        Cidr::new(addr, self.block_size).ok()
    }
}

/// The pools a request may draw from, in preference order.
///
/// `requested` names pools by name or CIDR (the CNI config's `ipv4_pools`); empty means every
/// enabled pool of the version whose node selector matches the node and which allows the use.
pub fn select_pools(
    pools: &[PoolInfo],
    version: u8,
    requested: &[String],
    node_labels: &BTreeMap<String, String>,
    intended_use: AllowedUse,
) -> Result<Vec<PoolInfo>, IpamError> {
    let of_version = |p: &&PoolInfo| p.cidr.version() == version;
    if !requested.is_empty() {
        let mut out = Vec::new();
        for r in requested {
            let wanted = Cidr::parse(r).ok().map(|c| c.network());
            let pool = pools
                .iter()
                .filter(of_version)
                .find(|p| p.name == *r || Some(p.cidr) == wanted)
                .ok_or_else(|| IpamError::NoSuchPool {
                    pool: r.clone(),
                    version,
                })?;
            if pool.disabled {
                return Err(IpamError::PoolUnusable {
                    pool: r.clone(),
                    reason: "it is disabled".into(),
                });
            }
            if !pool.node_selector.matches(node_labels) {
                return Err(IpamError::PoolUnusable {
                    pool: r.clone(),
                    reason: format!(
                        "its nodeSelector {:?} does not match this node",
                        pool.node_selector.canonical()
                    ),
                });
            }
            if !pool.allowed_uses.contains(&intended_use) {
                return Err(IpamError::PoolUnusable {
                    pool: r.clone(),
                    reason: format!("its allowedUses do not include {intended_use:?}"),
                });
            }
            out.push(pool.clone());
        }
        return Ok(out);
    }
    let mut out: Vec<PoolInfo> = pools
        .iter()
        .filter(of_version)
        .filter(|p| !p.disabled)
        .filter(|p| p.node_selector.matches(node_labels))
        .filter(|p| p.allowed_uses.contains(&intended_use))
        .cloned()
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// FNV-1a of the host name: seeds the host's walk over a pool's blocks, so retries visit the
/// same blocks in the same order and two hosts start in different places.
pub fn host_seed(host: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in host.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The pool's blocks in this host's order: from a host-seeded start, wrapping around.
pub fn block_order<'a>(pool: &'a PoolInfo, host: &str) -> impl Iterator<Item = Cidr> + 'a {
    let n = pool.num_blocks();
    let start = if n == 0 {
        0
    } else {
        u128::from(host_seed(host)) % n
    };
    (0..n).filter_map(move |i| pool.block_at((start + i) % n))
}

/// Whether `ip` is covered by a reservation.
pub fn is_reserved(ip: IpAddr, reservations: &[Cidr]) -> bool {
    reservations.iter().any(|c| c.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use margay_api::ObjectMeta;

    fn pool(name: &str, cidr: &str, block: Option<i64>, selector: &str) -> PoolInfo {
        PoolInfo::from_resource(&IPPool::new(
            ObjectMeta::named(name),
            IPPoolSpec {
                cidr: cidr.into(),
                block_size: block,
                node_selector: selector.into(),
                ..IPPoolSpec::default()
            },
        ))
        .unwrap()
    }

    #[test]
    fn keys_are_calicos() {
        let c = Cidr::parse("10.65.0.64/26").unwrap();
        assert_eq!(
            block_key(&c),
            "/calico/ipam/v2/assignment/ipv4/block/10.65.0.64-26"
        );
        assert_eq!(
            affinity_key("node-1", &c),
            "/calico/ipam/v2/host/node-1/ipv4/block/10.65.0.64-26"
        );
        assert_eq!(
            handle_key("k8s-pod-network.abc"),
            "/calico/ipam/v2/handle/k8s-pod-network.abc"
        );
        assert_eq!(cidr_of_key(&block_key(&c)), Some(c));
        let v6 = Cidr::parse("fd00::40/122").unwrap();
        assert_eq!(
            block_key(&v6),
            "/calico/ipam/v2/assignment/ipv6/block/fd00::40-122"
        );
        assert_eq!(cidr_of_key(&block_key(&v6)), Some(v6));
    }

    #[test]
    fn block_order_visits_every_block_once_from_a_host_seeded_start() {
        let p = pool("p", "10.0.0.0/24", Some(28), "");
        let a: Vec<Cidr> = block_order(&p, "host-a").collect();
        let b: Vec<Cidr> = block_order(&p, "host-b").collect();
        assert_eq!(a.len(), 16);
        let mut sorted = a.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 16);
        assert_ne!(a[0], b[0]);
        assert_eq!(a, block_order(&p, "host-a").collect::<Vec<_>>());
        assert_eq!(
            p.block_of("10.0.0.77".parse().unwrap()),
            Cidr::parse("10.0.0.64/28").ok()
        );
    }

    #[test]
    fn pool_selection() {
        let pools = vec![
            pool("b", "10.1.0.0/16", None, "rack == 'r1'"),
            pool("a", "10.0.0.0/16", None, ""),
            pool("v6", "fd00::/48", None, ""),
        ];
        let r1 = BTreeMap::from([("rack".to_string(), "r1".to_string())]);
        let got = select_pools(&pools, 4, &[], &r1, AllowedUse::Workload).unwrap();
        assert_eq!(
            got.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            vec!["a", "b"]
        );
        let got = select_pools(&pools, 4, &[], &BTreeMap::new(), AllowedUse::Workload).unwrap();
        assert_eq!(got.len(), 1);
        let got = select_pools(
            &pools,
            4,
            &["10.0.0.0/16".into()],
            &r1,
            AllowedUse::Workload,
        )
        .unwrap();
        assert_eq!(got[0].name, "a");
        assert!(matches!(
            select_pools(
                &pools,
                4,
                &["b".into()],
                &BTreeMap::new(),
                AllowedUse::Workload
            ),
            Err(IpamError::PoolUnusable { .. })
        ));
        assert!(matches!(
            select_pools(&pools, 4, &["nope".into()], &r1, AllowedUse::Workload),
            Err(IpamError::NoSuchPool { .. })
        ));
        assert_eq!(
            select_pools(&pools, 6, &[], &r1, AllowedUse::Workload)
                .unwrap()
                .len(),
            1
        );
    }
}
