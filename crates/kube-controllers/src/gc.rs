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
        if calico_node.is_empty() {
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
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::pods::EndpointData;

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn pod_attrs(node: &str, ns: &str, pod: &str) -> BTreeMap<String, String> {
        attrs(&[("node", node), ("namespace", ns), ("pod", pod)])
    }

    fn tunnel_attrs(node: &str) -> BTreeMap<String, String> {
        attrs(&[("node", node), ("type", "vxlanTunnelAddress")])
    }

    /// A running pod holding `ips` on `node`.
    fn pod(ns: &str, name: &str, node: &str, ips: &[&str]) -> PodView {
        PodView {
            namespace: ns.into(),
            name: name.into(),
            node: node.into(),
            host_network: false,
            has_pod_ip: !ips.is_empty(),
            ips_reported: !ips.is_empty(),
            evicted: false,
            endpoint_ips: Some(ips.iter().map(|i| ip(i)).collect()),
            endpoint: Some(EndpointData {
                name: format!("{node}-k8s-{name}-eth0"),
                labels: BTreeMap::new(),
                service_account: String::new(),
            }),
        }
    }

    struct Fixture {
        blocks: Vec<AllocationBlock>,
        affinities: Vec<(String, Cidr)>,
        pods: HashMap<String, PodView>,
        nodes: HashSet<String>,
        calico: Option<HashMap<String, Option<String>>>,
        grace: Option<Duration>,
    }

    impl Fixture {
        fn new() -> Fixture {
            Fixture {
                blocks: vec![AllocationBlock::new(cidr("10.0.0.0/26"), Some("n1"))],
                affinities: vec![("n1".into(), cidr("10.0.0.0/26"))],
                pods: HashMap::new(),
                nodes: ["n1".to_string()].into(),
                calico: None,
                grace: Some(Duration::from_secs(10)),
            }
        }

        fn assign(&mut self, block: usize, addr: &str, handle: &str, a: BTreeMap<String, String>) {
            self.blocks[block].assign_ip(ip(addr), handle, &a).unwrap();
        }

        fn add_pod(&mut self, p: PodView) {
            self.pods.insert(pod_key(&p.namespace, &p.name), p);
        }

        fn scan(&self, st: &mut GcState, now: Instant) -> ScanOutcome {
            let names = match &self.calico {
                Some(m) => NodeNames::Calico(m),
                None => NodeNames::Same,
            };
            st.scan(&ScanInput {
                blocks: &self.blocks,
                affinities: &self.affinities,
                world: World {
                    pods: &self.pods,
                    nodes: &self.nodes,
                    node_names: names,
                },
                grace: self.grace,
                now,
            })
        }

        fn recheck(&self, st: &mut GcState, r: Vec<Release>, now: Instant) -> Vec<Release> {
            let names = match &self.calico {
                Some(m) => NodeNames::Calico(m),
                None => NodeNames::Same,
            };
            let world = World {
                pods: &self.pods,
                nodes: &self.nodes,
                node_names: names,
            };
            st.recheck(r, &world, now)
        }
    }

    fn released_ips(o: &ScanOutcome) -> Vec<IpAddr> {
        let mut v: Vec<IpAddr> = o.releases.iter().map(|r| r.allocation.key.ip).collect();
        v.sort();
        v
    }

    #[test]
    fn deleted_pod_on_live_node_is_released_only_after_the_grace_period() {
        let mut f = Fixture::new();
        f.assign(
            0,
            "10.0.0.1",
            "k8s-pod-network.a",
            pod_attrs("n1", "ns", "a"),
        );
        f.assign(
            0,
            "10.0.0.2",
            "k8s-pod-network.b",
            pod_attrs("n1", "ns", "b"),
        );
        f.add_pod(pod("ns", "b", "n1", &["10.0.0.2"]));
        let mut st = GcState::default();
        let t0 = Instant::now();
        let g = Duration::from_secs(10);
        let o = f.scan(&mut st, t0);
        assert_eq!((o.allocations, o.flagged), (2, 1));
        assert!(o.releases.is_empty());
        assert_eq!(o.next_due, Some(t0 + g + Duration::from_millis(1)));
        // Grace periods are "longer than": at exactly the period, still a candidate.
        let o = f.scan(&mut st, t0 + g);
        assert!(o.releases.is_empty());
        let o = f.scan(&mut st, t0 + g + Duration::from_millis(1));
        assert_eq!(released_ips(&o), vec![ip("10.0.0.1")]);
        assert_eq!(o.releases[0].reason, Confirmed::GracePeriod);
        assert_eq!(o.flagged, 1);
        assert_eq!(o.next_due, None);
    }

    #[test]
    fn a_pod_that_comes_back_resets_the_timer() {
        let mut f = Fixture::new();
        f.assign(0, "10.0.0.1", "h", pod_attrs("n1", "ns", "a"));
        let mut st = GcState::default();
        let t0 = Instant::now();
        f.scan(&mut st, t0);
        f.add_pod(pod("ns", "a", "n1", &["10.0.0.1"]));
        let o = f.scan(&mut st, t0 + Duration::from_secs(5));
        assert_eq!(o.flagged, 0);
        f.pods.clear();
        let t2 = t0 + Duration::from_secs(8);
        f.scan(&mut st, t2);
        let o = f.scan(&mut st, t0 + Duration::from_secs(11));
        assert!(o.releases.is_empty(), "the timer restarted at {t2:?}");
        let o = f.scan(&mut st, t2 + Duration::from_secs(11));
        assert_eq!(released_ips(&o), vec![ip("10.0.0.1")]);
    }

    #[test]
    fn node_gone_confirms_at_once_and_cleans_the_node() {
        let mut f = Fixture::new();
        f.assign(0, "10.0.0.1", "h1", pod_attrs("n1", "ns", "a"));
        f.assign(0, "10.0.0.2", "vxlan-tunnel-addr-n1", tunnel_attrs("n1"));
        f.nodes.clear();
        let mut st = GcState::default();
        let o = f.scan(&mut st, Instant::now());
        assert_eq!(released_ips(&o), vec![ip("10.0.0.1"), ip("10.0.0.2")]);
        assert!(o.releases.iter().all(|r| r.reason == Confirmed::NodeGone));
        assert_eq!(o.nodes_to_clean, vec!["n1".to_string()]);
    }

    #[test]
    fn node_gone_with_a_live_pod_keeps_everything() {
        let mut f = Fixture::new();
        f.assign(0, "10.0.0.1", "h1", pod_attrs("n1", "ns", "a"));
        f.assign(0, "10.0.0.2", "h2", pod_attrs("n1", "ns", "b"));
        f.assign(0, "10.0.0.3", "vxlan-tunnel-addr-n1", tunnel_attrs("n1"));
        f.add_pod(pod("ns", "b", "n1", &["10.0.0.2"]));
        f.nodes.clear();
        let mut st = GcState::default();
        let o = f.scan(&mut st, Instant::now());
        // The dead pod's address goes; the live pod's and the tunnel address stay.
        assert_eq!(released_ips(&o), vec![ip("10.0.0.1")]);
        assert!(o.nodes_to_clean.is_empty());
        assert!(!st.is_flagged(&AllocKey {
            ip: ip("10.0.0.3"),
            handle: Some("vxlan-tunnel-addr-n1".into()),
            sequence_number: 0
        }));
    }

    #[test]
    fn tunnel_addresses_are_valid_while_their_node_exists() {
        let mut f = Fixture::new();
        f.assign(0, "10.0.0.3", "vxlan-tunnel-addr-n1", tunnel_attrs("n1"));
        let mut st = GcState::default();
        let t0 = Instant::now();
        for s in [0, 100, 10_000] {
            let o = f.scan(&mut st, t0 + Duration::from_secs(s));
            assert_eq!((o.flagged, o.releases.len()), (0, 0));
        }
    }

    #[test]
    fn a_handle_with_one_live_address_is_never_released() {
        let mut f = Fixture::new();
        f.blocks
            .push(AllocationBlock::new(cidr("fd00::/122"), Some("n1")));
        // A dual-stack pod whose status reports only the IPv4 address.
        f.assign(0, "10.0.0.1", "h", pod_attrs("n1", "ns", "a"));
        f.assign(1, "fd00::1", "h", pod_attrs("n1", "ns", "a"));
        f.add_pod(pod("ns", "a", "n1", &["10.0.0.1"]));
        let mut st = GcState::default();
        let t0 = Instant::now();
        for s in [0, 11, 100, 1000] {
            let o = f.scan(&mut st, t0 + Duration::from_secs(s));
            assert!(o.releases.is_empty());
        }
        assert_eq!(st.flagged(), 1, "the IPv6 address is a (confirmed) leak…");
        // …released once the pod holds neither.
        f.pods.clear();
        f.scan(&mut st, t0 + Duration::from_secs(1001));
        let o = f.scan(&mut st, t0 + Duration::from_secs(1012));
        assert_eq!(released_ips(&o), vec![ip("10.0.0.1"), ip("fd00::1")]);
    }

    #[test]
    fn allocations_of_unknown_origin_are_never_flagged_and_keep_their_node() {
        let mut f = Fixture::new();
        f.assign(0, "10.0.0.1", "manual", attrs(&[("node", "n1")]));
        f.assign(0, "10.0.0.2", "nonode", pod_attrs("", "ns", "gone"));
        f.assign(
            0,
            "10.0.0.3",
            WINDOWS_RESERVED_HANDLE,
            pod_attrs("n1", "ns", "x"),
        );
        f.nodes.clear();
        let mut st = GcState::default();
        let o = f.scan(&mut st, Instant::now());
        assert_eq!(o.flagged, 0);
        assert!(o.releases.is_empty());
        assert!(o.nodes_to_clean.is_empty());
    }

    #[test]
    fn grace_unset_or_zero() {
        let mut f = Fixture::new();
        f.assign(0, "10.0.0.1", "h", pod_attrs("n1", "ns", "a"));
        let t0 = Instant::now();
        f.grace = None;
        let mut st = GcState::default();
        let o = f.scan(&mut st, t0);
        assert_eq!(o.flagged, 0);
        f.grace = Some(Duration::ZERO);
        for s in [0, 10, 10_000] {
            let o = f.scan(&mut st, t0 + Duration::from_secs(s));
            assert_eq!((o.flagged, o.releases.len(), o.next_due), (1, 0, None));
        }
        // A node that is gone needs no grace period, whatever it is.
        f.nodes.clear();
        f.grace = None;
        let o = f.scan(&mut st, t0);
        assert_eq!(released_ips(&o), vec![ip("10.0.0.1")]);
    }

    #[test]
    fn pod_rescheduled_elsewhere_no_longer_holds_the_old_address() {
        let mut f = Fixture::new();
        f.nodes.insert("n2".into());
        f.assign(0, "10.0.0.1", "h", pod_attrs("n1", "ns", "a"));
        f.add_pod(pod("ns", "a", "n2", &["10.0.0.1"]));
        let mut st = GcState::default();
        let o = f.scan(&mut st, Instant::now());
        assert_eq!(o.flagged, 1);
    }

    #[test]
    fn etcd_node_names_come_from_orch_refs() {
        let mut f = Fixture::new();
        f.blocks
            .push(AllocationBlock::new(cidr("10.0.1.0/26"), Some("c2")));
        f.assign(0, "10.0.0.1", "h1", pod_attrs("n1", "ns", "a"));
        f.assign(1, "10.0.1.1", "h2", pod_attrs("c2", "ns", "b"));
        f.assign(1, "10.0.1.2", "h3", pod_attrs("gone", "ns", "c"));
        f.nodes = ["k2".to_string()].into();
        // n1: not a Kubernetes node; c2 is Kubernetes node k2 (which exists); "gone" has no
        // Calico Node at all.
        f.calico = Some(HashMap::from([
            ("n1".to_string(), None),
            ("c2".to_string(), Some("k2".to_string())),
        ]));
        let mut st = GcState::default();
        let o = f.scan(&mut st, Instant::now());
        assert_eq!(released_ips(&o), vec![ip("10.0.1.2")]);
        assert_eq!(o.flagged, 2, "b is a candidate, c confirmed, a untouched");
        assert_eq!(o.nodes_to_clean, vec!["gone".to_string()]);
    }

    #[test]
    fn a_reallocated_address_starts_from_scratch() {
        let mut f = Fixture::new();
        f.assign(0, "10.0.0.1", "h", pod_attrs("n1", "ns", "a"));
        let first = f.blocks[0].sequence_number_for(1);
        let mut st = GcState::default();
        let t0 = Instant::now();
        f.scan(&mut st, t0);
        // Released and handed out again to the same handle (new sequence number).
        f.blocks[0].release(ip("10.0.0.1"), None).unwrap();
        f.assign(0, "10.0.0.1", "h", pod_attrs("n1", "ns", "a"));
        f.scan(&mut st, t0 + Duration::from_secs(5));
        let o = f.scan(&mut st, t0 + Duration::from_secs(11));
        assert!(o.releases.is_empty());
        let o = f.scan(&mut st, t0 + Duration::from_secs(16));
        assert_eq!(released_ips(&o), vec![ip("10.0.0.1")]);
        assert_ne!(o.releases[0].allocation.key.sequence_number, first);
    }

    #[test]
    fn empty_blocks_lose_their_affinity_but_never_the_last_one() {
        let mut f = Fixture::new();
        f.blocks
            .push(AllocationBlock::new(cidr("10.0.1.0/26"), Some("n1")));
        f.blocks
            .push(AllocationBlock::new(cidr("10.0.2.0/26"), Some("n1")));
        f.blocks
            .push(AllocationBlock::new(cidr("10.0.3.0/26"), Some("n3")));
        f.nodes.insert("n3".into());
        f.assign(2, "10.0.2.1", "m", attrs(&[("node", "n1")]));
        let mut st = GcState::default();
        let t0 = Instant::now();
        let o = f.scan(&mut st, t0);
        assert!(o.empty_blocks.is_empty());
        assert_eq!(o.next_due, Some(t0 + Duration::from_millis(10_001)));
        let o = f.scan(&mut st, t0 + Duration::from_secs(11));
        // n1 has three blocks, two empty: both may go (one non-empty stays); n3's only block
        // stays.
        assert_eq!(
            o.empty_blocks,
            vec![
                ("n1".to_string(), cidr("10.0.0.0/26")),
                ("n1".to_string(), cidr("10.0.1.0/26"))
            ]
        );
        // Two empty blocks and nothing else: only one goes.
        f.blocks[2].release(ip("10.0.2.1"), None).unwrap();
        f.blocks.remove(0);
        let o = f.scan(&mut st, t0 + Duration::from_secs(30));
        assert_eq!(o.empty_blocks.len(), 1);
        // A block that fills up again restarts its timer.
        f.assign(0, "10.0.1.7", "m", attrs(&[("node", "n1")]));
        f.scan(&mut st, t0 + Duration::from_secs(31));
        f.blocks[0].release(ip("10.0.1.7"), None).unwrap();
        let o = f.scan(&mut st, t0 + Duration::from_secs(32));
        assert!(
            !o.empty_blocks
                .iter()
                .any(|(_, c)| *c == cidr("10.0.1.0/26"))
        );
    }

    #[test]
    fn recheck_drops_what_came_back_and_whole_handles() {
        let mut f = Fixture::new();
        f.blocks
            .push(AllocationBlock::new(cidr("fd00::/122"), Some("n1")));
        f.assign(0, "10.0.0.1", "h", pod_attrs("n1", "ns", "a"));
        f.assign(1, "fd00::1", "h", pod_attrs("n1", "ns", "a"));
        f.assign(0, "10.0.0.2", "h2", pod_attrs("n1", "ns", "b"));
        f.assign(0, "10.0.0.3", "h3", pod_attrs("n1", "ns", "c"));
        f.nodes.clear();
        let mut st = GcState::default();
        let t0 = Instant::now();
        let o = f.scan(&mut st, t0);
        assert_eq!(o.releases.len(), 4);
        // Fresh read: pod a is back holding its IPv6 address only (a lagging cache had missed
        // it); n1 is back too; c is still gone.
        f.add_pod(pod("ns", "a", "n1", &["fd00::1"]));
        f.nodes.insert("n1".into());
        let left = f.recheck(&mut st, o.releases.clone(), t0);
        // a's IPv4 address is still not held, but its handle holds a live one: all of h stays.
        // b and c were confirmed because n1 was gone: only candidates now.
        assert!(left.is_empty());
        assert_eq!(st.flagged(), 3);
        assert!(!st.is_confirmed(&o.releases[0].allocation.key));
        // Nothing changed on a second look: everything passes.
        f.pods.clear();
        f.nodes.clear();
        let mut st = GcState::default();
        let o = f.scan(&mut st, t0);
        let left = f.recheck(&mut st, o.releases.clone(), t0);
        assert_eq!(left, o.releases);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        /// A random cluster: 4 nodes (some gone), pods (some gone, some holding their address,
        /// some not yet reporting, some holding another one), tunnel and unknown allocations.
        #[derive(Debug, Clone)]
        struct Alloc {
            node: usize,
            kind: u8,
            pod: usize,
            pod_state: u8,
            handle: usize,
        }

        fn world_strategy() -> impl Strategy<Value = (Vec<bool>, Vec<Alloc>, Vec<u64>)> {
            (
                proptest::collection::vec(any::<bool>(), 4),
                proptest::collection::vec(
                    (0usize..5, 0u8..4, 0usize..30, 0u8..5, 0usize..40).prop_map(
                        |(node, kind, pod, pod_state, handle)| Alloc {
                            node,
                            kind,
                            pod,
                            pod_state,
                            handle,
                        },
                    ),
                    0..60,
                ),
                proptest::collection::vec(0u64..30, 1..6),
            )
        }

        proptest! {
            /// Whatever the cluster and the timing, nothing released is in use: every released
            /// allocation is invalid in the world the scan saw, and no address of its handle is
            /// valid.
            #[test]
            fn never_releases_a_live_address((alive, list, steps) in world_strategy()) {
                let mut f = Fixture::new();
                f.blocks = (0..4).map(|n| AllocationBlock::new(cidr(&format!("10.0.{n}.0/26")), Some(&format!("n{n}")))).collect();
                f.affinities.clear();
                f.nodes = (0..4).filter(|n| alive[*n]).map(|n| format!("n{n}")).collect();
                for (i, a) in list.iter().enumerate() {
                    let node = if a.node == 4 { String::new() } else { format!("n{}", a.node) };
                    let block = i % 4;
                    let addr = format!("10.0.{block}.{}", i / 4 + 1);
                    let at = match a.kind {
                        0 | 1 => pod_attrs(&node, "ns", &format!("p{}", a.pod)),
                        2 => tunnel_attrs(&node),
                        _ => attrs(&[("node", &node)]),
                    };
                    f.assign(block, &addr, &format!("h{}", a.handle), at.clone());
                    if a.kind <= 1 {
                        let key = pod_key("ns", &format!("p{}", a.pod));
                        match a.pod_state {
                            0 => {}
                            1 => { f.pods.entry(key).or_insert_with(|| pod("ns", &format!("p{}", a.pod), &node, &[])); }
                            2 => {
                                let p = f.pods.entry(key).or_insert_with(|| pod("ns", &format!("p{}", a.pod), &node, &[]));
                                p.ips_reported = true;
                                p.endpoint_ips.get_or_insert_with(Vec::new).push(ip(&addr));
                            }
                            _ => {
                                let p = f.pods.entry(key).or_insert_with(|| pod("ns", &format!("p{}", a.pod), &node, &[]));
                                p.ips_reported = true;
                            }
                        }
                    }
                }
                let world_allocs = allocations(&f.blocks);
                let mut st = GcState::default();
                let t0 = Instant::now();
                let mut t = t0;
                for s in steps {
                    t += Duration::from_secs(s);
                    let o = f.scan(&mut st, t);
                    let names = NodeNames::Same;
                    let world = World { pods: &f.pods, nodes: &f.nodes, node_names: names };
                    let left = st.recheck(o.releases.clone(), &world, t);
                    prop_assert_eq!(&left, &o.releases, "re-checking the same world changes nothing");
                    for r in &o.releases {
                        let a = &r.allocation;
                        let handle_live = world_allocs.iter()
                            .filter(|b| b.key.handle == a.key.handle)
                            .any(|b| match world.lookup(b.node()) {
                                NodeLookup::Skip => true,
                                NodeLookup::Node { knode, exists } =>
                                    (b.pod().is_none() && !b.is_tunnel())
                                        || world.valid(b, knode.as_deref(), exists),
                            });
                        prop_assert!(!handle_live, "released {:?} of a live handle", a.key);
                        if r.reason == Confirmed::GracePeriod {
                            prop_assert!(t.duration_since(t0) > Duration::from_secs(10));
                        }
                    }
                }
            }
        }
    }
}
