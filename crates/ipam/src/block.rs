//! Allocation blocks, affinities and handles in Calico's stored JSON form, and the pure
//! operations on them.
//!
//! A block is a power-of-two range of a pool (`blockSize`), affine to at most one host. Each
//! address (ordinal) is free — in the `unallocated` FIFO, so the longest-free address is reused
//! last — or allocated, pointing at an attribute (handle and owner attributes). Every change
//! bumps the block's sequence number; an allocation remembers the number it was made at, so a
//! release carrying a stale number (the address was released and handed out again meanwhile)
//! is refused instead of freeing someone else's address.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use margay_api::net::Cidr;
use serde::{Deserialize, Deserializer, Serialize};

/// Affinity type prefix of a block affine to a host.
pub const HOST_AFFINITY_PREFIX: &str = "host:";

/// Attribute keys Calico's callers set.
pub const ATTR_NODE: &str = "node";
pub const ATTR_NAMESPACE: &str = "namespace";
pub const ATTR_POD: &str = "pod";
pub const ATTR_TYPE: &str = "type";
pub const ATTR_TIMESTAMP: &str = "timestamp";
pub const ATTR_TYPE_VXLAN: &str = "vxlanTunnelAddress";
pub const ATTR_TYPE_VXLAN_V6: &str = "vxlanV6TunnelAddress";
pub const ATTR_TYPE_IPIP: &str = "ipipTunnelAddress";

/// Go writes a nil slice or map as `null`.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Who an address belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationAttribute {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle_id: Option<String>,
    #[serde(
        default,
        rename = "secondary",
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub attrs: BTreeMap<String, String>,
    /// Fields other writers set (e.g. Calico's live-migration attributes), kept as they are.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `/calico/ipam/v2/assignment/ipv<N>/block/<a.b.c.d-NN>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocationBlock {
    pub cidr: Cidr,
    /// `host:<node>`, or None for a block nobody owns.
    #[serde(default)]
    pub affinity: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub allocations: Vec<Option<usize>>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub unallocated: Vec<usize>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub attributes: Vec<AllocationAttribute>,
    #[serde(default, rename = "sequenceNumber")]
    pub sequence_number: u64,
    #[serde(
        default,
        rename = "sequenceNumberForAllocation",
        deserialize_with = "null_as_default"
    )]
    pub sequence_number_for_allocation: BTreeMap<String, u64>,
    #[serde(default)]
    pub deleted: bool,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// One allocated address of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated<'a> {
    pub ip: IpAddr,
    pub ordinal: usize,
    pub attribute: &'a AllocationAttribute,
    pub sequence_number: u64,
}

/// Why a release did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    #[error("{ip} is not in block {block}")]
    NotInBlock { ip: IpAddr, block: Cidr },
    #[error(
        "{ip} was released and reallocated since it was read (sequence number {expected}, now {actual}); nothing was released"
    )]
    BadSequenceNumber {
        ip: IpAddr,
        expected: u64,
        actual: u64,
    },
}

/// Why a specific address could not be assigned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignError {
    #[error("{ip} is not in block {block}")]
    NotInBlock { ip: IpAddr, block: Cidr },
    #[error("{ip} is already allocated (handle {handle:?})")]
    InUse { ip: IpAddr, handle: Option<String> },
}

fn offset(base: IpAddr, ordinal: usize) -> IpAddr {
    match base {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a).wrapping_add(ordinal as u32))),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a).wrapping_add(ordinal as u128))),
    }
}

fn distance(base: IpAddr, ip: IpAddr) -> Option<u128> {
    match (base, ip) {
        (IpAddr::V4(b), IpAddr::V4(i)) => u32::from(i).checked_sub(u32::from(b)).map(u128::from),
        (IpAddr::V6(b), IpAddr::V6(i)) => u128::from(i).checked_sub(u128::from(b)),
        _ => None,
    }
}

impl AllocationBlock {
    /// A new, empty block affine to `host` (or to nobody).
    pub fn new(cidr: Cidr, host: Option<&str>) -> AllocationBlock {
        let cidr = cidr.network();
        let size = usize::try_from(cidr.size()).unwrap_or(usize::MAX);
        AllocationBlock {
            cidr,
            affinity: host.map(|h| format!("{HOST_AFFINITY_PREFIX}{h}")),
            allocations: vec![None; size],
            unallocated: (0..size).collect(),
            attributes: Vec::new(),
            sequence_number: 0,
            sequence_number_for_allocation: BTreeMap::new(),
            deleted: false,
            extra: BTreeMap::new(),
        }
    }

    /// The host this block is affine to.
    pub fn host(&self) -> Option<&str> {
        self.affinity
            .as_deref()
            .and_then(|a| a.strip_prefix(HOST_AFFINITY_PREFIX))
    }

    pub fn size(&self) -> usize {
        self.allocations.len()
    }

    pub fn ip(&self, ordinal: usize) -> IpAddr {
        offset(self.cidr.addr(), ordinal)
    }

    pub fn ordinal(&self, ip: IpAddr) -> Option<usize> {
        if !self.cidr.contains(ip) {
            return None;
        }
        let d = distance(self.cidr.addr(), ip)?;
        usize::try_from(d).ok().filter(|o| *o < self.size())
    }

    pub fn free_count(&self) -> usize {
        self.unallocated.len()
    }

    pub fn in_use(&self) -> usize {
        self.allocations.iter().filter(|a| a.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.allocations.iter().all(Option::is_none)
    }

    /// Every allocated address, in address order.
    pub fn allocated(&self) -> impl Iterator<Item = Allocated<'_>> + '_ {
        self.allocations
            .iter()
            .enumerate()
            .filter_map(move |(ordinal, a)| {
                let idx = (*a)?;
                let attribute = self.attributes.get(idx)?;
                Some(Allocated {
                    ip: self.ip(ordinal),
                    ordinal,
                    attribute,
                    sequence_number: self.sequence_number_for(ordinal),
                })
            })
    }

    pub fn sequence_number_for(&self, ordinal: usize) -> u64 {
        // Blocks written by older versions lack per-ordinal numbers: 0 then.
        self.sequence_number_for_allocation
            .get(&ordinal.to_string())
            .copied()
            .unwrap_or(0)
    }

    fn attribute_index(&mut self, handle: &str, attrs: &BTreeMap<String, String>) -> usize {
        if let Some(i) = self
            .attributes
            .iter()
            .position(|a| a.handle_id.as_deref() == Some(handle) && &a.attrs == attrs)
        {
            return i;
        }
        self.attributes.push(AllocationAttribute {
            handle_id: Some(handle.to_string()),
            attrs: attrs.clone(),
            extra: BTreeMap::new(),
        });
        self.attributes.len() - 1
    }

    fn allocate_ordinal(&mut self, ordinal: usize, attr: usize) {
        if let Some(slot) = self.allocations.get_mut(ordinal) {
            *slot = Some(attr);
        }
        self.sequence_number_for_allocation
            .insert(ordinal.to_string(), self.sequence_number);
    }

    /// Takes up to `n` free addresses (oldest-freed first), skipping reserved ones, for
    /// `handle`. Returns what it took (possibly fewer than `n`).
    pub fn assign(
        &mut self,
        n: usize,
        handle: &str,
        attrs: &BTreeMap<String, String>,
        reserved: &dyn Fn(IpAddr) -> bool,
    ) -> Vec<IpAddr> {
        if n == 0 {
            return Vec::new();
        }
        self.sequence_number += 1;
        let attr = self.attribute_index(handle, attrs);
        let mut taken = Vec::new();
        let mut kept = Vec::with_capacity(self.unallocated.len());
        for ordinal in std::mem::take(&mut self.unallocated) {
            let ip = self.ip(ordinal);
            let usable =
                taken.len() < n && self.allocations.get(ordinal) == Some(&None) && !reserved(ip);
            if usable {
                self.allocate_ordinal(ordinal, attr);
                taken.push(ip);
            } else {
                kept.push(ordinal);
            }
        }
        self.unallocated = kept;
        if taken.is_empty() {
            self.prune_attributes();
        }
        taken
    }

    /// Allocates one specific address.
    pub fn assign_ip(
        &mut self,
        ip: IpAddr,
        handle: &str,
        attrs: &BTreeMap<String, String>,
    ) -> Result<(), AssignError> {
        let ordinal = self.ordinal(ip).ok_or(AssignError::NotInBlock {
            ip,
            block: self.cidr,
        })?;
        if let Some(Some(idx)) = self.allocations.get(ordinal) {
            return Err(AssignError::InUse {
                ip,
                handle: self.attributes.get(*idx).and_then(|a| a.handle_id.clone()),
            });
        }
        self.sequence_number += 1;
        let attr = self.attribute_index(handle, attrs);
        self.allocate_ordinal(ordinal, attr);
        self.unallocated.retain(|o| *o != ordinal);
        Ok(())
    }

    /// Frees one address. Freeing a free address is not an error (returns `Ok(None)`); the
    /// handle it belonged to is returned otherwise.
    pub fn release(
        &mut self,
        ip: IpAddr,
        expected_sequence: Option<u64>,
    ) -> Result<Option<String>, ReleaseError> {
        let ordinal = self.ordinal(ip).ok_or(ReleaseError::NotInBlock {
            ip,
            block: self.cidr,
        })?;
        let Some(Some(idx)) = self.allocations.get(ordinal).copied() else {
            return Ok(None);
        };
        if let Some(expected) = expected_sequence {
            let actual = self.sequence_number_for(ordinal);
            if actual != expected {
                return Err(ReleaseError::BadSequenceNumber {
                    ip,
                    expected,
                    actual,
                });
            }
        }
        let handle = self.attributes.get(idx).and_then(|a| a.handle_id.clone());
        self.free_ordinal(ordinal);
        self.prune_attributes();
        Ok(handle)
    }

    /// Frees every address held by `handle`; returns them.
    pub fn release_handle(&mut self, handle: &str) -> Vec<IpAddr> {
        let ordinals: Vec<usize> = self
            .allocations
            .iter()
            .enumerate()
            .filter_map(|(o, a)| {
                let idx = (*a)?;
                (self.attributes.get(idx)?.handle_id.as_deref() == Some(handle)).then_some(o)
            })
            .collect();
        let ips = ordinals.iter().map(|o| self.ip(*o)).collect();
        for o in ordinals {
            self.free_ordinal(o);
        }
        self.prune_attributes();
        ips
    }

    fn free_ordinal(&mut self, ordinal: usize) {
        self.sequence_number += 1;
        if let Some(slot) = self.allocations.get_mut(ordinal) {
            *slot = None;
        }
        self.sequence_number_for_allocation
            .remove(&ordinal.to_string());
        self.unallocated.push(ordinal);
    }

    /// Drops attributes no allocation uses and renumbers the rest.
    fn prune_attributes(&mut self) {
        let mut used = vec![false; self.attributes.len()];
        for idx in self.allocations.iter().flatten() {
            if let Some(u) = used.get_mut(*idx) {
                *u = true;
            }
        }
        if used.iter().all(|u| *u) {
            return;
        }
        let mut remap = vec![None; self.attributes.len()];
        let mut kept = Vec::new();
        for (i, attr) in std::mem::take(&mut self.attributes).into_iter().enumerate() {
            if used[i] {
                remap[i] = Some(kept.len());
                kept.push(attr);
            }
        }
        self.attributes = kept;
        for a in self.allocations.iter_mut() {
            if let Some(idx) = a {
                *a = remap.get(*idx).copied().flatten();
            }
        }
    }

    /// Checks the block's internal consistency (for tests and `ipam check`).
    pub fn check(&self) -> Result<(), String> {
        let mut seen = vec![false; self.size()];
        for o in &self.unallocated {
            let Some(s) = seen.get_mut(*o) else {
                return Err(format!("unallocated ordinal {o} is outside the block"));
            };
            if *s {
                return Err(format!("ordinal {o} is listed twice as unallocated"));
            }
            *s = true;
            if self.allocations.get(*o) != Some(&None) {
                return Err(format!("ordinal {o} is both allocated and unallocated"));
            }
        }
        for (o, a) in self.allocations.iter().enumerate() {
            match a {
                None if !seen[o] => {
                    return Err(format!("ordinal {o} is neither allocated nor unallocated"));
                }
                Some(idx) if *idx >= self.attributes.len() => {
                    return Err(format!("ordinal {o} points at missing attribute {idx}"));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// The state of a host's claim on a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AffinityState {
    #[serde(rename = "pending")]
    Pending,
    #[serde(rename = "confirmed")]
    Confirmed,
    #[serde(rename = "pendingDeletion")]
    PendingDeletion,
}

/// `/calico/ipam/v2/host/<host>/ipv<N>/block/<cidr>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockAffinity {
    pub state: AffinityState,
    #[serde(default)]
    pub deleted: bool,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl BlockAffinity {
    pub fn new(state: AffinityState) -> BlockAffinity {
        BlockAffinity {
            state,
            deleted: false,
            extra: BTreeMap::new(),
        }
    }
}

/// `/calico/ipam/v2/handle/<id>`: how many addresses the handle holds in each block.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IpamHandle {
    #[serde(default, deserialize_with = "null_as_default")]
    pub block: BTreeMap<String, usize>,
    #[serde(default)]
    pub deleted: bool,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `/calico/ipam/v2/config` (Calico's v1 IPAM configuration).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredIpamConfig {
    #[serde(default)]
    pub strict_affinity: bool,
    #[serde(default = "default_true")]
    pub auto_allocate_blocks: bool,
    #[serde(default, rename = "maxBlocksPerHost")]
    pub max_blocks_per_host: i64,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

fn default_true() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn assign_takes_oldest_free_first_and_release_goes_to_the_back() {
        let mut b = AllocationBlock::new(cidr("10.0.0.0/30"), Some("h1"));
        let attrs = BTreeMap::new();
        let got = b.assign(2, "a", &attrs, &|_| false);
        assert_eq!(got, vec![ip("10.0.0.0"), ip("10.0.0.1")]);
        assert_eq!(b.release(ip("10.0.0.0"), None).unwrap(), Some("a".into()));
        let got = b.assign(2, "b", &attrs, &|_| false);
        // 10.0.0.0 was freed last: it comes after the never-used addresses.
        assert_eq!(got, vec![ip("10.0.0.2"), ip("10.0.0.3")]);
        assert_eq!(b.assign(1, "c", &attrs, &|_| false), vec![ip("10.0.0.0")]);
        assert!(b.assign(1, "d", &attrs, &|_| false).is_empty());
        b.check().unwrap();
        assert_eq!(b.attributes.len(), 3);
        assert_eq!(b.release_handle("b"), vec![ip("10.0.0.2"), ip("10.0.0.3")]);
        assert_eq!(b.attributes.len(), 2);
        b.check().unwrap();
    }

    #[test]
    fn reserved_addresses_are_skipped_and_stay_free() {
        let mut b = AllocationBlock::new(cidr("10.0.0.0/30"), None);
        let got = b.assign(4, "a", &BTreeMap::new(), &|i| i == ip("10.0.0.1"));
        assert_eq!(got.len(), 3);
        assert!(!got.contains(&ip("10.0.0.1")));
        assert_eq!(b.unallocated, vec![1]);
        b.check().unwrap();
    }

    #[test]
    fn stale_sequence_numbers_do_not_release() {
        let mut b = AllocationBlock::new(cidr("10.0.0.0/31"), None);
        b.assign(1, "a", &BTreeMap::new(), &|_| false);
        let seq = b.sequence_number_for(0);
        b.release(ip("10.0.0.0"), Some(seq)).unwrap();
        // Reallocated to someone else...
        b.assign_ip(ip("10.0.0.0"), "b", &BTreeMap::new()).unwrap();
        // ...so the old release must not free it.
        let err = b.release(ip("10.0.0.0"), Some(seq)).unwrap_err();
        assert!(matches!(err, ReleaseError::BadSequenceNumber { .. }));
        assert_eq!(b.in_use(), 1);
        // Releasing a free address is fine.
        assert_eq!(b.release(ip("10.0.0.1"), None).unwrap(), None);
    }

    #[test]
    fn json_matches_calico() {
        // As Calico writes it (nil slices as null, extra fields kept).
        let text = r#"{"cidr":"10.0.0.0/30","affinity":"host:node1","allocations":[0,null,null,null],
            "unallocated":[1,2,3],"attributes":[{"handle_id":"k8s-pod-network.abc","secondary":{"node":"node1","pod":"p"}}],
            "sequenceNumber":3,"sequenceNumberForAllocation":{"0":2},"deleted":false,"hostAffinity":"node1"}"#;
        let b: AllocationBlock = serde_json::from_str(text).unwrap();
        assert_eq!(b.host(), Some("node1"));
        assert_eq!(b.allocated().next().unwrap().sequence_number, 2);
        b.check().unwrap();
        let again: serde_json::Value = serde_json::to_value(&b).unwrap();
        assert_eq!(again["hostAffinity"], "node1");
        assert_eq!(again["attributes"][0]["secondary"]["pod"], "p");
        let nulls = r#"{"cidr":"10.0.0.0/31","affinity":null,"allocations":[null,null],"unallocated":[0,1],"attributes":null,"sequenceNumberForAllocation":null}"#;
        let b: AllocationBlock = serde_json::from_str(nulls).unwrap();
        assert!(b.attributes.is_empty());
        let h: IpamHandle =
            serde_json::from_str(r#"{"block":{"10.0.0.0/26":2},"deleted":false}"#).unwrap();
        assert_eq!(h.block["10.0.0.0/26"], 2);
        let a: BlockAffinity =
            serde_json::from_str(r#"{"state":"confirmed","deleted":false}"#).unwrap();
        assert_eq!(a.state, AffinityState::Confirmed);
    }
}
