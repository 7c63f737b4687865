//! IPAM garbage collection decisions (pure): which allocations look leaked, when a leak is
//! confirmed, which may be released, which deleted nodes' IPAM state can go, which empty
//! blocks lose their affinity. Calico's rules (`kube-controllers/pkg/controllers/node/ipam.go`,
//! `design/ipam/ipam-gc.md`); the edge (`ipam_controller`) reads the inputs, re-checks, writes.
//!
//! The rules, in the order they are applied to each allocation of a node:
//! - the Windows reserved handle is never collected;
//! - an allocation that is neither a pod's (no `namespace`/`pod` attributes) nor a tunnel
//!   address (`type`) is valid, and keeps its node's IPAM state;
//! - a tunnel address is valid while its node exists;
//! - a pod's address is valid while the pod holds it ([`crate::pods::pod_holds`]);
//! - an invalid address on a node that is gone is a confirmed leak at once;
//! - otherwise it is a candidate, confirmed once it stayed one for longer than the leak grace
//!   period (zero: reported, never confirmed; unset: not even reported);
//! - a node that is gone and holds no valid address has its tunnel addresses confirmed and its
//!   affinities released;
//! - an allocation is released only when every allocation of its handle is confirmed.
//!
//! Allocations are identified by address, handle and sequence number, so an address released
//! and handed out again starts from scratch, and a release names the sequence number it saw.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use margay_api::net::Cidr;
use margay_ipam::AllocationBlock;
use margay_ipam::block::{ATTR_NAMESPACE, ATTR_NODE, ATTR_POD, ATTR_TYPE};

use crate::pods::{PodView, pod_holds, pod_key};

/// Calico's handle of the addresses Windows nodes reserve in their blocks.
pub const WINDOWS_RESERVED_HANDLE: &str = "windows-reserved-ipam-handle";
/// `type` attributes of tunnel addresses.
pub const TUNNEL_TYPES: [&str; 5] = [
    "ipipTunnelAddress",
    "vxlanTunnelAddress",
    "vxlanV6TunnelAddress",
    "wireguardTunnelAddress",
    "wireguardV6TunnelAddress",
];

/// One allocation's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocKey {
    pub ip: IpAddr,
    pub handle: Option<String>,
    pub sequence_number: u64,
}

/// An allocated address as the collector sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub key: AllocKey,
    pub block: Cidr,
    pub attrs: BTreeMap<String, String>,
}

impl Allocation {
    /// The (Calico) node the address was allocated for; "" when unknown.
    pub fn node(&self) -> &str {
        self.attrs.get(ATTR_NODE).map_or("", String::as_str)
    }

    /// `namespace/pod` for a pod's address.
    pub fn pod(&self) -> Option<String> {
        let ns = self.attrs.get(ATTR_NAMESPACE).filter(|s| !s.is_empty())?;
        let pod = self.attrs.get(ATTR_POD).filter(|s| !s.is_empty())?;
        Some(pod_key(ns, pod))
    }

    pub fn is_tunnel(&self) -> bool {
        self.attrs
            .get(ATTR_TYPE)
            .is_some_and(|t| TUNNEL_TYPES.contains(&t.as_str()))
    }

    fn is_windows_reserved(&self) -> bool {
        self.key.handle.as_deref() == Some(WINDOWS_RESERVED_HANDLE)
    }
}

/// Every allocated address of the blocks.
pub fn allocations(blocks: &[AllocationBlock]) -> Vec<Allocation> {
    let mut out = Vec::new();
    for b in blocks {
        for a in b.allocated() {
            out.push(Allocation {
                key: AllocKey {
                    ip: a.ip,
                    handle: a.attribute.handle_id.clone(),
                    sequence_number: a.sequence_number,
                },
                block: b.cidr,
                attrs: a.attribute.attrs.clone(),
            });
        }
    }
    out
}

/// How a Calico node name becomes a Kubernetes node name.
#[derive(Debug, Clone, Copy)]
pub enum NodeNames<'a> {
    /// Kubernetes datastore: they are the same.
    Same,
    /// etcd: the Calico Nodes, each with the Kubernetes node of its `k8s` orchRef (None: not
    /// a Kubernetes node, left alone). A Calico node missing here is gone.
    Calico(&'a HashMap<String, Option<String>>),
}

/// Names of the Kubernetes Nodes that exist.
pub trait NodeSet: Sync {
    fn has(&self, name: &str) -> bool;
}

impl NodeSet for HashSet<String> {
    fn has(&self, name: &str) -> bool {
        self.contains(name)
    }
}

impl<T: Sync> NodeSet for HashMap<String, T> {
    fn has(&self, name: &str) -> bool {
        self.contains_key(name)
    }
}

/// The state of the cluster a scan or a re-check works with.
#[derive(Clone, Copy)]
pub struct World<'a> {
    /// Pods by `namespace/name`.
    pub pods: &'a HashMap<String, PodView>,
    /// Kubernetes Nodes by name.
    pub nodes: &'a dyn NodeSet,
    pub node_names: NodeNames<'a>,
}

/// What is known of an allocation's node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeLookup {
    /// No node attribute, or not a Kubernetes node: its allocations are left alone.
    Skip,
    Node {
        /// The Kubernetes node's name, when it is known.
        knode: Option<String>,
        exists: bool,
    },
}

impl World<'_> {
    pub fn lookup(&self, calico_node: &str) -> NodeLookup {
        // LoadBalancer addresses belong to a virtual host no Node will ever be.
        if calico_node.is_empty() || calico_node == crate::loadbalancer::VIRTUAL_HOST {
            return NodeLookup::Skip;
        }
        match self.node_names {
            NodeNames::Same => {
                let exists = self.nodes.has(calico_node);
                NodeLookup::Node {
                    knode: exists.then(|| calico_node.to_string()),
                    exists,
                }
            }
            NodeNames::Calico(map) => match map.get(calico_node) {
                None => NodeLookup::Node {
                    knode: None,
                    exists: false,
                },
                Some(None) => NodeLookup::Skip,
                Some(Some(k)) => NodeLookup::Node {
                    knode: Some(k.clone()),
                    exists: self.nodes.has(k),
                },
            },
        }
    }

    /// Whether the allocation is in use (Calico's `allocationIsValid`); unknown kinds are.
    pub fn valid(&self, a: &Allocation, knode: Option<&str>, node_exists: bool) -> bool {
        if a.is_tunnel() {
            return node_exists;
        }
        match a.pod() {
            None => true,
            Some(key) => self
                .pods
                .get(&key)
                .is_some_and(|p| pod_holds(p, a.key.ip, knode)),
        }
    }
}

/// Why a leak is confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmed {
    /// Its node is gone (and its pod too): no grace period.
    NodeGone,
    /// It stayed a candidate for longer than the leak grace period.
    GracePeriod,
}

#[derive(Debug, Clone, Copy)]
struct Leak {
    since: Instant,
    confirmed: Option<Confirmed>,
}

/// An allocation to release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub allocation: Allocation,
    pub reason: Confirmed,
}

/// What a scan reads.
#[derive(Clone, Copy)]
pub struct ScanInput<'a> {
    pub blocks: &'a [AllocationBlock],
    /// Every block affinity record (host, block), whatever its state.
    pub affinities: &'a [(String, Cidr)],
    pub world: World<'a>,
    /// KubeControllersConfiguration's leakGracePeriod.
    pub grace: Option<Duration>,
    pub now: Instant,
}

/// What a scan decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanOutcome {
    pub allocations: usize,
    /// Candidates and confirmed leaks (the `ipam_allocations_gc_candidates` total).
    pub flagged: usize,
    /// Confirmed leaks whose handles are entirely confirmed: to release after a re-check.
    pub releases: Vec<Release>,
    /// (Calico) nodes that are gone and hold no valid address: their affinities go once their
    /// leaks are released.
    pub nodes_to_clean: Vec<String>,
    /// Empty blocks of live nodes, empty for longer than the grace period, that are not their
    /// node's last block: their affinities go (if still empty).
    pub empty_blocks: Vec<(String, Cidr)>,
    /// When a candidate or an empty block will be due (the next scan should not be later).
    pub next_due: Option<Instant>,
}

/// The collector's memory between scans: when each candidate was first seen, and when each
/// empty block was first seen empty.
#[derive(Debug, Clone, Default)]
pub struct GcState {
    leaks: HashMap<AllocKey, Leak>,
    empty_since: HashMap<Cidr, Instant>,
}

fn earliest(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// Past the grace period, as Calico counts it (strictly longer).
fn elapsed(since: Instant, now: Instant, grace: Duration) -> bool {
    now.saturating_duration_since(since) > grace
}

/// A tick after `since + grace`, when [`elapsed`] turns true.
fn due(since: Instant, grace: Duration) -> Instant {
    since + grace + Duration::from_millis(1)
}

impl GcState {
    /// Candidates and confirmed leaks known.
    pub fn flagged(&self) -> usize {
        self.leaks.len()
    }

    /// Whether the allocation is a candidate or a confirmed leak.
    pub fn is_flagged(&self, key: &AllocKey) -> bool {
        self.leaks.contains_key(key)
    }

    pub fn is_confirmed(&self, key: &AllocKey) -> bool {
        self.leaks.get(key).is_some_and(|l| l.confirmed.is_some())
    }

    /// The allocation was released: forget it.
    pub fn released(&mut self, key: &AllocKey) {
        self.leaks.remove(key);
    }

    fn mark_valid(&mut self, key: &AllocKey) {
        if self.leaks.remove(key).is_some() {
            tracing::info!(ip = %key.ip, handle = ?key.handle, "allocation is in use again; no longer a leak candidate");
        }
    }

    fn confirm(&mut self, key: &AllocKey, now: Instant, why: Confirmed) {
        let l = self.leaks.entry(key.clone()).or_insert(Leak {
            since: now,
            confirmed: None,
        });
        if l.confirmed.is_none() {
            tracing::warn!(ip = %key.ip, handle = ?key.handle, reason = ?why, "confirmed IP address leak");
            l.confirmed = Some(why);
        }
    }

    /// Candidate from now (if not already); confirmed once the grace period passed.
    fn candidate(&mut self, key: &AllocKey, now: Instant, grace: Duration) -> Option<Instant> {
        let l = self.leaks.entry(key.clone()).or_insert_with(|| {
            tracing::info!(ip = %key.ip, handle = ?key.handle, "candidate IP address leak");
            Leak {
                since: now,
                confirmed: None,
            }
        });
        if l.confirmed.is_some() {
            return None;
        }
        // Zero: reported as a candidate, never confirmed (Calico's "GC off").
        if grace.is_zero() {
            return None;
        }
        if elapsed(l.since, now, grace) {
            tracing::warn!(ip = %key.ip, handle = ?key.handle, "confirmed IP address leak after the grace period");
            l.confirmed = Some(Confirmed::GracePeriod);
            None
        } else {
            Some(due(l.since, grace))
        }
    }

    /// One pass over every allocation (Calico's checkAllocations, plus the selection of
    /// releases by handle and of empty blocks).
    pub fn scan(&mut self, input: &ScanInput<'_>) -> ScanOutcome {
        let now = input.now;
        let world = &input.world;
        let allocs = allocations(input.blocks);
        let mut out = ScanOutcome {
            allocations: allocs.len(),
            ..ScanOutcome::default()
        };

        let mut by_node: BTreeMap<&str, Vec<&Allocation>> = BTreeMap::new();
        for a in &allocs {
            by_node.entry(a.node()).or_default().push(a);
        }
        // Nodes with affinities but no allocations are checked too (their state may go).
        for b in input.blocks {
            if let Some(h) = b.host() {
                by_node.entry(h).or_default();
            }
        }
        for (h, _) in input.affinities {
            by_node.entry(h.as_str()).or_default();
        }

        let mut node_exists: HashMap<&str, bool> = HashMap::new();
        for (node, list) in &by_node {
            let (knode, exists) = match world.lookup(node) {
                NodeLookup::Skip => {
                    for a in list {
                        self.mark_valid(&a.key);
                    }
                    continue;
                }
                NodeLookup::Node { knode, exists } => (knode, exists),
            };
            node_exists.insert(node, exists);
            let mut can_clean = true;
            let mut tunnels = Vec::new();
            for a in list {
                if a.is_windows_reserved() {
                    self.mark_valid(&a.key);
                    continue;
                }
                if a.pod().is_none() && !a.is_tunnel() {
                    // Made by something other than the CNI plugin or node start-up: not ours
                    // to judge; the node's state stays until someone releases it.
                    can_clean = false;
                    self.mark_valid(&a.key);
                    continue;
                }
                if a.is_tunnel() {
                    if exists {
                        self.mark_valid(&a.key);
                    } else {
                        tunnels.push(*a);
                    }
                    continue;
                }
                if world.valid(a, knode.as_deref(), exists) {
                    can_clean = false;
                    self.mark_valid(&a.key);
                } else if !exists {
                    self.confirm(&a.key, now, Confirmed::NodeGone);
                } else if let Some(grace) = input.grace {
                    if let Some(t) = self.candidate(&a.key, now, grace) {
                        out.next_due = earliest(out.next_due, t);
                    }
                } else {
                    self.mark_valid(&a.key);
                }
            }
            if !exists {
                if can_clean {
                    for a in tunnels {
                        self.confirm(&a.key, now, Confirmed::NodeGone);
                    }
                    out.nodes_to_clean.push(node.to_string());
                } else {
                    // Kept while the node's state stays (Calico waits for the last valid
                    // address before it touches the tunnel addresses).
                    for a in tunnels {
                        self.mark_valid(&a.key);
                    }
                }
            }
        }

        // Forget allocations that no longer exist (released, or handed out again).
        let present: HashSet<&AllocKey> = allocs.iter().map(|a| &a.key).collect();
        self.leaks.retain(|k, _| present.contains(k));
        out.flagged = self.leaks.len();

        // All or none per handle: one address of the handle in use keeps them all.
        let mut handle_confirmed: HashMap<&str, bool> = HashMap::new();
        for a in &allocs {
            if let Some(h) = a.key.handle.as_deref() {
                let c = handle_confirmed.entry(h).or_insert(true);
                *c &= self.is_confirmed(&a.key);
            }
        }
        for a in &allocs {
            let Some(Leak {
                confirmed: Some(reason),
                ..
            }) = self.leaks.get(&a.key)
            else {
                continue;
            };
            let whole_handle = match a.key.handle.as_deref() {
                Some(h) => handle_confirmed.get(h).copied().unwrap_or(false),
                None => true,
            };
            if whole_handle {
                out.releases.push(Release {
                    allocation: a.clone(),
                    reason: *reason,
                });
            }
        }

        self.scan_empty_blocks(input, &node_exists, &mut out);
        out
    }

    /// Calico's releaseUnusedBlocks: an empty block of a live node that has other blocks,
    /// seen empty for longer than the grace period, loses its affinity.
    fn scan_empty_blocks(
        &mut self,
        input: &ScanInput<'_>,
        node_exists: &HashMap<&str, bool>,
        out: &mut ScanOutcome,
    ) {
        let now = input.now;
        let mut blocks_of: HashMap<&str, usize> = HashMap::new();
        for b in input.blocks {
            if let Some(h) = b.host() {
                *blocks_of.entry(h).or_default() += 1;
            }
        }
        let mut seen_empty = HashSet::new();
        for b in input.blocks {
            let Some(host) = b.host() else { continue };
            if !b.is_empty() || node_exists.get(host) != Some(&true) {
                continue;
            }
            let count = blocks_of.get(host).copied().unwrap_or(0);
            // Never a node's last block: its next pod would pay for a fresh claim.
            if count <= 1 {
                continue;
            }
            let Some(grace) = input.grace.filter(|g| !g.is_zero()) else {
                continue;
            };
            seen_empty.insert(b.cidr);
            let first = *self.empty_since.entry(b.cidr).or_insert(now);
            if elapsed(first, now, grace) {
                out.empty_blocks.push((host.to_string(), b.cidr));
                if let Some(c) = blocks_of.get_mut(host) {
                    *c -= 1;
                }
            } else {
                out.next_due = earliest(out.next_due, due(first, grace));
            }
        }
        self.empty_since.retain(|c, _| seen_empty.contains(c));
    }

    /// The last check before releasing (Calico's final re-validation), against a fresh read of
    /// the cluster: drops every release whose allocation is valid now, demotes leaks confirmed
    /// because their node was gone when the node is back, and then drops every release whose
    /// handle lost one of its releases (all or none per handle). Returns what may be released.
    pub fn recheck(
        &mut self,
        releases: Vec<Release>,
        world: &World<'_>,
        now: Instant,
    ) -> Vec<Release> {
        let mut total: HashMap<Option<String>, usize> = HashMap::new();
        let mut kept = Vec::new();
        for r in releases {
            let a = &r.allocation;
            *total.entry(a.key.handle.clone()).or_default() += 1;
            match world.lookup(a.node()) {
                NodeLookup::Skip => self.mark_valid(&a.key),
                NodeLookup::Node { knode, exists } => {
                    if world.valid(a, knode.as_deref(), exists) {
                        self.mark_valid(&a.key);
                    } else if r.reason == Confirmed::NodeGone && exists {
                        // The node is back: only a candidate now, from now.
                        self.leaks.insert(
                            a.key.clone(),
                            Leak {
                                since: now,
                                confirmed: None,
                            },
                        );
                    } else {
                        kept.push(r);
                    }
                }
            }
        }
        let mut left: HashMap<Option<String>, usize> = HashMap::new();
        for r in &kept {
            *left.entry(r.allocation.key.handle.clone()).or_default() += 1;
        }
        kept.into_iter()
            .filter(|r| {
                let h = &r.allocation.key.handle;
                h.is_none() || left.get(h) == total.get(h)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
