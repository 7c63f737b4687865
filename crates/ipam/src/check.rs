//! `ipam check`: compares what IPAM has allocated with what uses addresses (pure).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use serde::Serialize;

use crate::block::{AllocationBlock, IpamHandle};

/// What uses addresses: workload endpoints and nodes' tunnel addresses.
#[derive(Debug, Clone, Default)]
pub struct Users {
    /// Address → who uses it (`workloadendpoint ns/name`, `node n (vxlan tunnel)`).
    pub by_ip: BTreeMap<IpAddr, Vec<String>>,
}

impl Users {
    pub fn add(&mut self, ip: IpAddr, who: impl Into<String>) {
        self.by_ip.entry(ip).or_default().push(who.into());
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeakedIp {
    pub ip: IpAddr,
    pub handle: Option<String>,
    pub block: String,
    pub attrs: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    pub allocated: usize,
    pub in_use: usize,
    /// Allocated, but nothing uses the address.
    pub leaked: Vec<LeakedIp>,
    /// Used (by the named users), but not allocated.
    pub not_allocated: Vec<(IpAddr, Vec<String>)>,
    /// Used by more than one endpoint.
    pub duplicates: Vec<(IpAddr, Vec<String>)>,
    /// Handle records for which no block holds an address.
    pub stale_handles: Vec<String>,
    /// Blocks whose internal bookkeeping is inconsistent.
    pub broken_blocks: Vec<(String, String)>,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.leaked.is_empty()
            && self.not_allocated.is_empty()
            && self.duplicates.is_empty()
            && self.broken_blocks.is_empty()
    }
}

/// Compares allocations with users. `in_pools` says whether an address is in any pool (users
/// outside every pool are none of IPAM's business).
pub fn check(
    blocks: &[AllocationBlock],
    handles: &[(String, IpamHandle)],
    users: &Users,
    in_pools: &dyn Fn(IpAddr) -> bool,
) -> CheckReport {
    let mut report = CheckReport::default();
    let mut allocated: BTreeSet<IpAddr> = BTreeSet::new();
    let mut handles_seen: BTreeSet<&str> = BTreeSet::new();
    for b in blocks {
        if let Err(e) = b.check() {
            report.broken_blocks.push((b.cidr.to_string(), e));
        }
        for a in b.allocated() {
            allocated.insert(a.ip);
            if let Some(h) = a.attribute.handle_id.as_deref() {
                handles_seen.insert(h);
            }
            if !users.by_ip.contains_key(&a.ip) {
                report.leaked.push(LeakedIp {
                    ip: a.ip,
                    handle: a.attribute.handle_id.clone(),
                    block: b.cidr.to_string(),
                    attrs: a.attribute.attrs.clone(),
                });
            }
        }
    }
    report.allocated = allocated.len();
    for (ip, who) in &users.by_ip {
        if !in_pools(*ip) {
            continue;
        }
        if allocated.contains(ip) {
            report.in_use += 1;
        } else {
            report.not_allocated.push((*ip, who.clone()));
        }
        if who.len() > 1 {
            report.duplicates.push((*ip, who.clone()));
        }
    }
    for (id, _) in handles {
        if !handles_seen.contains(id.as_str()) {
            report.stale_handles.push(id.clone());
        }
    }
    report
}
