//! Kubernetes Services in the eBPF dataplane (kube-proxy replacement, IPv4): the service
//! maps' layouts (mirroring `bpf/svc.h` byte for byte), the incremental update protocol
//! (pure, over [`SvcKernel`]) and the maps opened from their pins ([`SvcMaps`], the edge).
//!
//! The model's service ports become **frontends** (ClusterIP, ExternalIP, LoadBalancer
//! address × port × protocol → backend group id, backend count, flags, affinity timeout)
//! and **backend groups** (`{id, slot}` → backend address and port). The program picks
//! `random % count` per new flow (or the ClientIP affinity entry) and keeps the flow on
//! its backend through its own NAT conntrack. See DESIGN.md, "Services".

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;

use aya::maps::{HashMap, Map, MapData, MapError};
use margay_calc::messages::PortProtocol;
use margay_calc::services::{Backend, FrontendKind, ServicePort, ServicePortId};

pub const FE_KEY_SIZE: usize = 8;
pub const FE_VAL_SIZE: usize = 16;
pub const BE_KEY_SIZE: usize = 8;
pub const BE_VAL_SIZE: usize = 8;
pub const SVC_CT_KEY_SIZE: usize = 16;
pub const SVC_CT_VAL_SIZE: usize = 16;
pub const AFF_KEY_SIZE: usize = 8;
pub const AFF_VAL_SIZE: usize = 16;

/// The maps' sizes (`svc.h`): beyond them a service port is refused whole (its frontends
/// are not written; the error names it).
pub const MAX_FRONTENDS: usize = 65_536;
pub const MAX_BACKENDS: usize = 262_144;

/// `svc_fe_val.flags`: sessionAffinity ClientIP.
pub const F_AFFINITY: u32 = 0x1;
/// `svc_fe_val.flags` of an external frontend under externalTrafficPolicy Cluster: the
/// client's address is replaced by the node's (kube-proxy masquerades it), so the reply
/// comes back through this node.
pub const F_SNAT: u32 = 0x2;

const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;

/// A frontend: where clients reach a service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FeKey {
    pub addr: Ipv4Addr,
    pub port: u16,
    pub proto: u8,
}

impl FeKey {
    pub fn encode(&self) -> [u8; FE_KEY_SIZE] {
        let mut b = [0u8; FE_KEY_SIZE];
        b[0..4].copy_from_slice(&self.addr.octets());
        b[4..6].copy_from_slice(&self.port.to_be_bytes());
        b[6] = self.proto;
        b
    }

    pub fn decode(b: &[u8; FE_KEY_SIZE]) -> FeKey {
        FeKey {
            addr: Ipv4Addr::new(b[0], b[1], b[2], b[3]),
            port: u16::from_be_bytes([b[4], b[5]]),
            proto: b[6],
        }
    }
}

/// What a frontend leads to: its backend group and how many backends it has now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FeVal {
    pub id: u32,
    /// Backends at slots `0..count`; 0: the program rejects (ICMP port unreachable).
    pub count: u32,
    pub flags: u32,
    pub affinity_s: u32,
}

impl FeVal {
    pub fn encode(&self) -> [u8; FE_VAL_SIZE] {
        let mut b = [0u8; FE_VAL_SIZE];
        b[0..4].copy_from_slice(&self.id.to_ne_bytes());
        b[4..8].copy_from_slice(&self.count.to_ne_bytes());
        b[8..12].copy_from_slice(&self.flags.to_ne_bytes());
        b[12..16].copy_from_slice(&self.affinity_s.to_ne_bytes());
        b
    }

    pub fn decode(b: &[u8; FE_VAL_SIZE]) -> FeVal {
        let u = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        FeVal {
            id: u(0),
            count: u(4),
            flags: u(8),
            affinity_s: u(12),
        }
    }
}

/// One backend (a slot of a group).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BeVal {
    pub addr: Ipv4Addr,
    pub port: u16,
}

impl BeVal {
    pub fn encode(&self) -> [u8; BE_VAL_SIZE] {
        let mut b = [0u8; BE_VAL_SIZE];
        b[0..4].copy_from_slice(&self.addr.octets());
        b[4..6].copy_from_slice(&self.port.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8; BE_VAL_SIZE]) -> BeVal {
        BeVal {
            addr: Ipv4Addr::new(b[0], b[1], b[2], b[3]),
            port: u16::from_be_bytes([b[4], b[5]]),
        }
    }
}

pub fn be_key(id: u32, slot: u32) -> [u8; BE_KEY_SIZE] {
    let mut b = [0u8; BE_KEY_SIZE];
    b[0..4].copy_from_slice(&id.to_ne_bytes());
    b[4..8].copy_from_slice(&slot.to_ne_bytes());
    b
}

pub fn decode_be_key(b: &[u8; BE_KEY_SIZE]) -> (u32, u32) {
    (
        u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
        u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
    )
}

/// A NAT conntrack entry as the program writes it (for inspection and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatEntry {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// Forward (client → frontend, value: the backend) or reverse (backend → client, value:
    /// the frontend).
    pub reverse: bool,
    pub last_seen_ns: u64,
    pub to: BeVal,
}

impl NatEntry {
    pub fn decode(k: &[u8; SVC_CT_KEY_SIZE], v: &[u8; SVC_CT_VAL_SIZE]) -> NatEntry {
        NatEntry {
            src: Ipv4Addr::new(k[0], k[1], k[2], k[3]),
            dst: Ipv4Addr::new(k[4], k[5], k[6], k[7]),
            sport: u16::from_be_bytes([k[8], k[9]]),
            dport: u16::from_be_bytes([k[10], k[11]]),
            proto: k[12],
            reverse: k[13] == 1,
            last_seen_ns: u64::from_ne_bytes([v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]]),
            to: BeVal {
                addr: Ipv4Addr::new(v[8], v[9], v[10], v[11]),
                port: u16::from_be_bytes([v[12], v[13]]),
            },
        }
    }
}

/// Which backends a group holds: a service port's cluster-wide ones, or (ClusterIP under
/// internalTrafficPolicy Local) this node's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    pub port: ServicePortId,
    pub local: bool,
}

/// What the maps should hold for a model's services.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Frontends for traffic from workloads (`mgy_svc_fe`): (group, flags, affinity).
    pub frontends: BTreeMap<FeKey, (GroupKey, u32, u32)>,
    /// Frontends for traffic arriving on the node's data interfaces (`mgy_svc_ext`):
    /// NodePorts on every node address, ExternalIPs, LoadBalancer addresses.
    pub external: BTreeMap<FeKey, (GroupKey, u32, u32)>,
    pub groups: BTreeMap<GroupKey, Vec<BeVal>>,
    /// Service ports left out, and why.
    pub refused: Vec<String>,
}

fn v4(b: &Backend) -> Option<BeVal> {
    match b.addr {
        IpAddr::V4(addr) => Some(BeVal { addr, port: b.port }),
        IpAddr::V6(_) => None,
    }
}

/// The frontends and groups for `services` (pure). Traffic from workloads (the only traffic
/// the workload hook translates) uses the internal backends for a ClusterIP and, as
/// kube-proxy short-circuits pod traffic to external addresses, the cluster-wide backends
/// for ExternalIPs and LoadBalancer addresses. IPv6 frontends and backends and SCTP are
/// left out (the program translates IPv4 TCP and UDP). Traffic from outside (on the
/// node's data interfaces) meets NodePorts on `node_ips`, ExternalIPs and LoadBalancer
/// addresses, with the external backends: this node's under externalTrafficPolicy Local
/// (source kept), else all of them with the source replaced by the node's address.
pub fn desired(
    services: &BTreeMap<ServicePortId, Arc<ServicePort>>,
    node_ips: &[Ipv4Addr],
) -> Desired {
    let mut out = Desired::default();
    let mut backends = 0usize;
    for (id, sp) in services {
        let Some(parts) = port_parts(id, sp, node_ips) else {
            continue;
        };
        // A frontend another port claimed first (an invalid pair of Services) is refused.
        let mut fes = Vec::new();
        for (key, v) in parts.fes {
            if out.frontends.contains_key(&key) || fes.iter().any(|(k, _)| *k == key) {
                out.refused.push(format!(
                    "{id}: frontend {}:{} is another service's already",
                    key.addr, key.port
                ));
            } else {
                fes.push((key, v));
            }
        }
        let mut exts = Vec::new();
        for (key, v) in parts.exts {
            if out.external.contains_key(&key) || exts.iter().any(|(k, _)| *k == key) {
                out.refused.push(format!(
                    "{id}: external frontend {}:{} is another service's already",
                    key.addr, key.port
                ));
            } else {
                exts.push((key, v));
            }
        }
        // Only groups an accepted frontend names.
        let groups: Vec<(GroupKey, Vec<BeVal>)> = parts
            .groups
            .into_iter()
            .filter(|(g, _)| fes.iter().chain(exts.iter()).any(|(_, (h, _, _))| h == g))
            .collect();
        let more: usize = groups.iter().map(|(_, v)| v.len()).sum();
        if out.frontends.len() + fes.len() > MAX_FRONTENDS
            || out.external.len() + exts.len() > MAX_FRONTENDS
            || backends + more > MAX_BACKENDS
        {
            out.refused.push(format!(
                "{id}: the service maps are full ({MAX_FRONTENDS} frontends, {MAX_BACKENDS} backends)"
            ));
            continue;
        }
        backends += more;
        out.frontends.extend(fes);
        out.external.extend(exts);
        out.groups.extend(groups);
    }
    out
}

type FeEntry = (FeKey, (GroupKey, u32, u32));

/// One service port's frontends, external frontends and groups (before any check against
/// the other ports). None: nothing to program (SCTP).
struct PortParts {
    fes: Vec<FeEntry>,
    exts: Vec<FeEntry>,
    groups: Vec<(GroupKey, Vec<BeVal>)>,
}

fn port_parts(id: &ServicePortId, sp: &ServicePort, node_ips: &[Ipv4Addr]) -> Option<PortParts> {
    let proto = match id.protocol {
        PortProtocol::Tcp => PROTO_TCP,
        PortProtocol::Udp => PROTO_UDP,
        PortProtocol::Sctp => return None,
    };
    let flags = if sp.affinity_timeout.is_some() {
        F_AFFINITY
    } else {
        0
    };
    let aff = sp.affinity_timeout.unwrap_or(0);
    let backends_of = |local: bool| {
        let list = if local {
            &sp.local_backends
        } else {
            &sp.cluster_backends
        };
        let mut v: Vec<BeVal> = list.iter().filter_map(v4).collect();
        v.dedup();
        v
    };
    let mut groups: Vec<(GroupKey, Vec<BeVal>)> = Vec::new();
    let add_group = |groups: &mut Vec<(GroupKey, Vec<BeVal>)>, local: bool| {
        let gk = GroupKey {
            port: id.clone(),
            local,
        };
        if !groups.iter().any(|(g, _)| *g == gk) {
            groups.push((gk.clone(), backends_of(local)));
        }
        gk
    };
    let mut fes = Vec::new();
    for f in &sp.frontends {
        let IpAddr::V4(addr) = f.addr else { continue };
        let local = f.kind == FrontendKind::ClusterIp && sp.internal_local;
        let gk = add_group(&mut groups, local);
        let key = FeKey {
            addr,
            port: f.port,
            proto,
        };
        if !fes.iter().any(|(k, _): &FeEntry| *k == key) {
            fes.push((key, (gk, flags, aff)));
        }
    }
    // From outside.
    let mut ext_addrs: Vec<(Ipv4Addr, u16)> = sp
        .frontends
        .iter()
        .filter(|f| f.kind != FrontendKind::ClusterIp)
        .filter_map(|f| match f.addr {
            IpAddr::V4(a) => Some((a, f.port)),
            IpAddr::V6(_) => None,
        })
        .collect();
    if let Some(np) = sp.node_port {
        ext_addrs.extend(node_ips.iter().map(|ip| (*ip, np)));
    }
    let ext_flags = flags | if sp.external_local { 0 } else { F_SNAT };
    let mut exts = Vec::new();
    for (addr, port) in ext_addrs {
        let key = FeKey { addr, port, proto };
        if exts.iter().any(|(k, _): &FeEntry| *k == key) {
            continue;
        }
        let gk = add_group(&mut groups, sp.external_local);
        exts.push((key, (gk, ext_flags, aff)));
    }
    Some(PortParts { fes, exts, groups })
}

/// What the syncer needs from the kernel (the real one is [`SvcMaps`]).
pub trait SvcKernel {
    type Error: fmt::Display;
    fn put_frontend(&mut self, k: &FeKey, v: &FeVal) -> Result<(), Self::Error>;
    fn del_frontend(&mut self, k: &FeKey) -> Result<(), Self::Error>;
    fn put_external(&mut self, k: &FeKey, v: &FeVal) -> Result<(), Self::Error>;
    fn del_external(&mut self, k: &FeKey) -> Result<(), Self::Error>;
    fn put_backend(&mut self, id: u32, slot: u32, v: &BeVal) -> Result<(), Self::Error>;
    fn del_backend(&mut self, id: u32, slot: u32) -> Result<(), Self::Error>;
}

#[derive(Debug, thiserror::Error)]
#[error("service maps: {0}")]
pub struct SvcSyncError(pub String);

/// What one sync wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SvcReport {
    pub frontends_written: usize,
    pub frontends_deleted: usize,
    pub backends_written: usize,
    pub backends_deleted: usize,
    pub refused: Vec<String>,
}

/// The incremental update protocol. Per sync:
/// 1. delete what the previous sync left behind (slots beyond a shrunk group's count, the
///    slots of groups no frontend names any more) and free those ids;
/// 2. per group, write the slots that differ (new slots before any count grows);
/// 3. per frontend whose value differs (group, count, affinity), one map write: the flip;
/// 4. delete frontends gone from the model;
/// 5. queue the slots no count covers any more for the next sync (a packet that read the
///    old count finishes long before).
///
/// A service change costs the slots that changed plus one write per frontend whose count
/// changed. The recorded state is exact after a failed write (each write is recorded as it
/// succeeds), so the next sync writes what is still missing.
///
/// Only the service ports whose `Arc` in the model changed are looked at (the model keeps
/// an unchanged port's `Arc`): their old contributions leave the desired state, their new
/// ones join it, and the steps above run over their groups and frontends only. A full pass
/// (every port) runs at the first sync, when the node's addresses change (NodePorts), when
/// a frontend conflict exists or a change would meet another port's frontend or the maps'
/// limits, after a failed write, and when more than an eighth of the ports changed.
#[derive(Debug, Default)]
pub struct SvcSyncer {
    /// The desired state as last computed, and what each port contributed to it.
    cache: Desired,
    owners: BTreeMap<ServicePortId, Owned>,
    seen: BTreeMap<ServicePortId, Arc<ServicePort>>,
    seen_ips: Vec<Ipv4Addr>,
    /// The next sync looks at every port.
    full: bool,
    groups: BTreeMap<GroupKey, Group>,
    frontends: BTreeMap<FeKey, FeVal>,
    external: BTreeMap<FeKey, FeVal>,
    /// (id, slot) to delete at the next sync unless a group covers it again.
    pending: BTreeSet<(u32, u32)>,
    /// Ids whose slots are in `pending`: free once those are gone.
    retired: BTreeSet<u32>,
    /// Slots a previous run wrote: queued once the first sync flipped the frontends away.
    adopted: Vec<(u32, u32)>,
    free: Vec<u32>,
    next_id: u32,
}

/// What one port contributed to the desired state.
#[derive(Debug, Clone, Default)]
struct Owned {
    fes: Vec<FeKey>,
    exts: Vec<FeKey>,
    groups: Vec<GroupKey>,
}

/// What a sync looks at.
enum Touched {
    All,
    Some {
        groups: BTreeSet<GroupKey>,
        fes: BTreeSet<FeKey>,
        exts: BTreeSet<FeKey>,
    },
}

#[derive(Debug, Clone)]
struct Group {
    id: u32,
    /// What the slots hold (0..len), as written.
    slots: Vec<BeVal>,
}

impl SvcSyncer {
    pub fn new() -> SvcSyncer {
        SvcSyncer {
            next_id: 1,
            full: true,
            ..SvcSyncer::default()
        }
    }

    /// Brings `cache` up to `services` and says what to look at.
    fn plan(
        &mut self,
        services: &BTreeMap<ServicePortId, Arc<ServicePort>>,
        node_ips: &[Ipv4Addr],
    ) -> Touched {
        if !self.full && self.cache.refused.is_empty() && node_ips == self.seen_ips {
            let mut changed: Vec<ServicePortId> = services
                .iter()
                .filter(|(id, sp)| !self.seen.get(*id).is_some_and(|o| Arc::ptr_eq(o, sp)))
                .map(|(id, _)| id.clone())
                .collect();
            changed.extend(
                self.seen
                    .keys()
                    .filter(|id| !services.contains_key(*id))
                    .cloned(),
            );
            if changed.len() <= services.len() / 8 + 1
                && let Some(t) = self.patch(&changed, services, node_ips)
            {
                for id in changed {
                    match services.get(&id) {
                        Some(sp) => self.seen.insert(id, sp.clone()),
                        None => self.seen.remove(&id),
                    };
                }
                return t;
            }
        }
        self.cache = desired(services, node_ips);
        self.owners.clear();
        for (fk, (gk, _, _)) in &self.cache.frontends {
            self.owners
                .entry(gk.port.clone())
                .or_default()
                .fes
                .push(*fk);
        }
        for (fk, (gk, _, _)) in &self.cache.external {
            self.owners
                .entry(gk.port.clone())
                .or_default()
                .exts
                .push(*fk);
        }
        for gk in self.cache.groups.keys() {
            self.owners
                .entry(gk.port.clone())
                .or_default()
                .groups
                .push(gk.clone());
        }
        self.seen = services.clone();
        self.seen_ips = node_ips.to_vec();
        self.full = false;
        Touched::All
    }

    /// The changed ports' contributions swapped in `cache`; None: a full pass is needed
    /// (a conflict with another port's frontend, or the maps' limits in reach).
    fn patch(
        &mut self,
        changed: &[ServicePortId],
        services: &BTreeMap<ServicePortId, Arc<ServicePort>>,
        node_ips: &[Ipv4Addr],
    ) -> Option<Touched> {
        let mut groups = BTreeSet::new();
        let mut fes = BTreeSet::new();
        let mut exts = BTreeSet::new();
        let mut backends: usize = self.cache.groups.values().map(Vec::len).sum();
        for id in changed {
            if let Some(old) = self.owners.remove(id) {
                for fk in old.fes {
                    self.cache.frontends.remove(&fk);
                    fes.insert(fk);
                }
                for fk in old.exts {
                    self.cache.external.remove(&fk);
                    exts.insert(fk);
                }
                for gk in old.groups {
                    if let Some(v) = self.cache.groups.remove(&gk) {
                        backends -= v.len();
                    }
                    groups.insert(gk);
                }
            }
            let Some(sp) = services.get(id) else { continue };
            let Some(parts) = port_parts(id, sp, node_ips) else {
                continue;
            };
            let mut owned = Owned::default();
            for (fk, v) in parts.fes {
                if self.cache.frontends.contains_key(&fk) {
                    return None;
                }
                self.cache.frontends.insert(fk, v);
                fes.insert(fk);
                owned.fes.push(fk);
            }
            for (fk, v) in parts.exts {
                if self.cache.external.contains_key(&fk) {
                    return None;
                }
                self.cache.external.insert(fk, v);
                exts.insert(fk);
                owned.exts.push(fk);
            }
            for (gk, v) in parts.groups {
                backends += v.len();
                groups.insert(gk.clone());
                owned.groups.push(gk.clone());
                self.cache.groups.insert(gk, v);
            }
            self.owners.insert(id.clone(), owned);
        }
        if self.cache.frontends.len() > MAX_FRONTENDS
            || self.cache.external.len() > MAX_FRONTENDS
            || backends > MAX_BACKENDS
        {
            return None;
        }
        Some(Touched::Some { groups, fes, exts })
    }

    /// Takes over what a previous run left in the maps: its frontends stay until the first
    /// sync replaces them (one write each, never absent in between), its groups' slots are
    /// deleted after that; new ids start above every id seen.
    pub fn adopt(
        &mut self,
        frontends: Vec<(FeKey, FeVal)>,
        external: Vec<(FeKey, FeVal)>,
        backends: Vec<(u32, u32)>,
    ) {
        let mut max = 0;
        for (k, v) in frontends {
            max = max.max(v.id);
            self.frontends.insert(k, v);
        }
        for (k, v) in external {
            max = max.max(v.id);
            self.external.insert(k, v);
        }
        for (id, slot) in backends {
            max = max.max(id);
            self.adopted.push((id, slot));
        }
        self.next_id = self.next_id.max(max.saturating_add(1));
    }

    pub fn num_frontends(&self) -> usize {
        self.frontends.len() + self.external.len()
    }

    pub fn num_backends(&self) -> usize {
        self.groups.values().map(|g| g.slots.len()).sum()
    }

    /// The written groups: id → backends (for affinity and NAT clean-up).
    pub fn groups(&self) -> BTreeMap<u32, BTreeSet<BeVal>> {
        self.groups
            .values()
            .map(|g| (g.id, g.slots.iter().copied().collect()))
            .collect()
    }

    fn alloc(&mut self) -> u32 {
        if let Some(id) = self.free.pop() {
            return id;
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        id
    }

    /// Steps 2–5 over what `touched` names.
    fn write<K: SvcKernel>(
        &mut self,
        want: &Desired,
        touched: &Touched,
        k: &mut K,
        report: &mut SvcReport,
    ) -> Result<(), SvcSyncError> {
        let e = |what: &str, err: K::Error| SvcSyncError(format!("{what}: {err}"));
        let (group_keys, fe_keys, ext_keys): (Vec<GroupKey>, Vec<FeKey>, Vec<FeKey>) = match touched
        {
            Touched::All => (
                want.groups
                    .keys()
                    .chain(self.groups.keys())
                    .cloned()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect(),
                want.frontends
                    .keys()
                    .chain(self.frontends.keys())
                    .copied()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect(),
                want.external
                    .keys()
                    .chain(self.external.keys())
                    .copied()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect(),
            ),
            Touched::Some { groups, fes, exts } => (
                groups.iter().cloned().collect(),
                fes.iter().copied().collect(),
                exts.iter().copied().collect(),
            ),
        };
        // 2. Backends first: a count never covers a slot not written yet.
        for gk in &group_keys {
            let Some(backends) = want.groups.get(gk) else {
                continue;
            };
            if !self.groups.contains_key(gk) {
                let id = self.alloc();
                self.groups.insert(
                    gk.clone(),
                    Group {
                        id,
                        slots: Vec::new(),
                    },
                );
            }
            let Some(g) = self.groups.get_mut(gk) else {
                continue;
            };
            for (i, b) in backends.iter().enumerate() {
                if g.slots.get(i) == Some(b) {
                    continue;
                }
                let slot = u32::try_from(i).unwrap_or(u32::MAX);
                k.put_backend(g.id, slot, b).map_err(|err| {
                    e(
                        &format!("backend {}:{} of {}", b.addr, b.port, gk.port),
                        err,
                    )
                })?;
                report.backends_written += 1;
                if i < g.slots.len() {
                    g.slots[i] = *b;
                } else {
                    g.slots.push(*b);
                }
            }
        }
        // 3. The flips; 4. frontends gone.
        for external in [false, true] {
            let (wanted, written, keys) = if external {
                (&want.external, &mut self.external, &ext_keys)
            } else {
                (&want.frontends, &mut self.frontends, &fe_keys)
            };
            for fk in keys {
                let Some((gk, flags, aff)) = wanted.get(fk) else {
                    if written.contains_key(fk) {
                        let r = if external {
                            k.del_external(fk)
                        } else {
                            k.del_frontend(fk)
                        };
                        r.map_err(|err| {
                            e(&format!("deleting frontend {}:{}", fk.addr, fk.port), err)
                        })?;
                        report.frontends_deleted += 1;
                        written.remove(fk);
                    }
                    continue;
                };
                let (Some(g), Some(n)) = (self.groups.get(gk), want.groups.get(gk)) else {
                    continue;
                };
                let v = FeVal {
                    id: g.id,
                    count: u32::try_from(n.len()).unwrap_or(u32::MAX),
                    flags: *flags,
                    affinity_s: *aff,
                };
                if written.get(fk) == Some(&v) {
                    continue;
                }
                let r = if external {
                    k.put_external(fk, &v)
                } else {
                    k.put_frontend(fk, &v)
                };
                r.map_err(|err| {
                    e(
                        &format!(
                            "frontend {}:{}/{} of {}",
                            fk.addr, fk.port, fk.proto, gk.port
                        ),
                        err,
                    )
                })?;
                report.frontends_written += 1;
                written.insert(*fk, v);
            }
        }
        // 5. Slots no count covers any more, deleted next time.
        for gk in &group_keys {
            let Some(g) = self.groups.get_mut(gk) else {
                continue;
            };
            match want.groups.get(gk) {
                Some(n) => {
                    for slot in n.len()..g.slots.len() {
                        self.pending.insert((g.id, slot as u32));
                    }
                    g.slots.truncate(n.len());
                }
                None => {
                    for slot in 0..g.slots.len() {
                        self.pending.insert((g.id, slot as u32));
                    }
                    self.retired.insert(g.id);
                    self.groups.remove(gk);
                }
            }
        }
        Ok(())
    }

    pub fn sync<K: SvcKernel>(
        &mut self,
        services: &BTreeMap<ServicePortId, Arc<ServicePort>>,
        node_ips: &[Ipv4Addr],
        k: &mut K,
    ) -> Result<SvcReport, SvcSyncError> {
        let mut report = SvcReport::default();
        // 1. Leftovers of the previous sync.
        let live: BTreeMap<u32, usize> = if self.pending.is_empty() {
            BTreeMap::new()
        } else {
            self.groups
                .values()
                .map(|g| (g.id, g.slots.len()))
                .collect()
        };
        let pending = std::mem::take(&mut self.pending);
        for (id, slot) in pending {
            if live.get(&id).is_some_and(|n| (slot as usize) < *n) {
                continue; // covered again by its (regrown) group
            }
            match k.del_backend(id, slot) {
                Ok(()) => report.backends_deleted += 1,
                Err(err) => {
                    tracing::warn!(id, slot, "deleting a service backend slot: {err}; retried");
                    self.pending.insert((id, slot));
                }
            }
        }
        let retired = std::mem::take(&mut self.retired);
        for id in retired {
            if self.pending.iter().any(|(i, _)| *i == id) {
                self.retired.insert(id);
            } else {
                self.free.push(id);
            }
        }
        let touched = self.plan(services, node_ips);
        report.refused = self.cache.refused.clone();
        let want = std::mem::take(&mut self.cache);
        let r = self.write(&want, &touched, k, &mut report);
        self.cache = want;
        if r.is_err() {
            // What was written is recorded exactly; the next sync looks at everything.
            self.full = true;
        }
        r?;
        self.pending.extend(self.adopted.drain(..));
        Ok(report)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SvcMapError {
    #[error("service map {map} at {path}: {reason} (is the eBPF program object loaded?)")]
    Open {
        map: &'static str,
        path: String,
        reason: String,
    },
    #[error("service map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
}

/// A previous run's frontends, external frontends and backend slots.
pub type Restored = (Vec<(FeKey, FeVal)>, Vec<(FeKey, FeVal)>, Vec<(u32, u32)>);

/// The service maps, opened from the pins the policy object's load created.
pub struct SvcMaps {
    fe: HashMap<MapData, [u8; FE_KEY_SIZE], [u8; FE_VAL_SIZE]>,
    ext: HashMap<MapData, [u8; FE_KEY_SIZE], [u8; FE_VAL_SIZE]>,
    be: HashMap<MapData, [u8; BE_KEY_SIZE], [u8; BE_VAL_SIZE]>,
    ct: HashMap<MapData, [u8; SVC_CT_KEY_SIZE], [u8; SVC_CT_VAL_SIZE]>,
    aff: HashMap<MapData, [u8; AFF_KEY_SIZE], [u8; AFF_VAL_SIZE]>,
}

fn open_hash<const K: usize, const V: usize>(
    dir: &Path,
    name: &'static str,
    lru: bool,
) -> Result<HashMap<MapData, [u8; K], [u8; V]>, SvcMapError> {
    let path = dir.join(name);
    let bad = |reason: String| SvcMapError::Open {
        map: name,
        path: path.display().to_string(),
        reason,
    };
    let data = MapData::from_pin(&path).map_err(|e| bad(e.to_string()))?;
    let map = if lru {
        Map::LruHashMap(data)
    } else {
        Map::HashMap(data)
    };
    HashMap::try_from(map).map_err(|e| bad(e.to_string()))
}

/// Not-found on delete is success: the entry is gone either way.
fn gone_ok(r: Result<(), MapError>) -> Result<(), MapError> {
    match r {
        Err(MapError::KeyNotFound) | Err(MapError::ElementNotFound) => Ok(()),
        Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(2) => Ok(()),
        other => other,
    }
}

impl SvcMaps {
    pub fn open(pin_dir: &Path) -> Result<SvcMaps, SvcMapError> {
        Ok(SvcMaps {
            fe: open_hash(pin_dir, "mgy_svc_fe", false)?,
            ext: open_hash(pin_dir, "mgy_svc_ext", false)?,
            be: open_hash(pin_dir, "mgy_svc_be", false)?,
            ct: open_hash(pin_dir, "mgy_svc_ct", true)?,
            aff: open_hash(pin_dir, "mgy_svc_aff", true)?,
        })
    }

    /// What the maps hold (a previous run's frontends and backend slots), for
    /// [`SvcSyncer::adopt`]. The maps' sizes bound it.
    pub fn restored(&self) -> Restored {
        let read = |m: &HashMap<MapData, [u8; FE_KEY_SIZE], [u8; FE_VAL_SIZE]>| {
            m.iter()
                .filter_map(Result::ok)
                .map(|(k, v)| (FeKey::decode(&k), FeVal::decode(&v)))
                .collect()
        };
        let fe = read(&self.fe);
        let ext = read(&self.ext);
        let be = self
            .be
            .keys()
            .filter_map(Result::ok)
            .map(|k| decode_be_key(&k))
            .collect();
        (fe, ext, be)
    }

    /// Every NAT conntrack entry (bounded by the map's size).
    pub fn nat_entries(&self) -> Vec<NatEntry> {
        self.ct
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| NatEntry::decode(&k, &v))
            .collect()
    }

    /// Deletes ClientIP affinity entries whose group is gone or no longer has their backend
    /// (the program never deletes them; a stale one would send a client to a backend that
    /// left). One pass over the map (its size bounds the work). Returns how many.
    pub fn affinity_gc(&mut self, groups: &BTreeMap<u32, BTreeSet<BeVal>>) -> usize {
        let stale: Vec<[u8; AFF_KEY_SIZE]> = self
            .aff
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, v)| {
                let id = u32::from_ne_bytes([k[4], k[5], k[6], k[7]]);
                let be = BeVal {
                    addr: Ipv4Addr::new(v[8], v[9], v[10], v[11]),
                    port: u16::from_be_bytes([v[12], v[13]]),
                };
                !groups.get(&id).is_some_and(|g| g.contains(&be))
            })
            .map(|(k, _)| k)
            .collect();
        stale
            .iter()
            .filter(|k| gone_ok(self.aff.remove(k)).is_ok())
            .count()
    }
}

impl SvcKernel for SvcMaps {
    type Error = SvcMapError;

    fn put_frontend(&mut self, k: &FeKey, v: &FeVal) -> Result<(), SvcMapError> {
        self.fe
            .insert(k.encode(), v.encode(), 0)
            .map_err(|source| SvcMapError::Map {
                map: "mgy_svc_fe",
                source,
            })
    }

    fn del_frontend(&mut self, k: &FeKey) -> Result<(), SvcMapError> {
        gone_ok(self.fe.remove(&k.encode())).map_err(|source| SvcMapError::Map {
            map: "mgy_svc_fe",
            source,
        })
    }

    fn put_external(&mut self, k: &FeKey, v: &FeVal) -> Result<(), SvcMapError> {
        self.ext
            .insert(k.encode(), v.encode(), 0)
            .map_err(|source| SvcMapError::Map {
                map: "mgy_svc_ext",
                source,
            })
    }

    fn del_external(&mut self, k: &FeKey) -> Result<(), SvcMapError> {
        gone_ok(self.ext.remove(&k.encode())).map_err(|source| SvcMapError::Map {
            map: "mgy_svc_ext",
            source,
        })
    }

    fn put_backend(&mut self, id: u32, slot: u32, v: &BeVal) -> Result<(), SvcMapError> {
        self.be
            .insert(be_key(id, slot), v.encode(), 0)
            .map_err(|source| SvcMapError::Map {
                map: "mgy_svc_be",
                source,
            })
    }

    fn del_backend(&mut self, id: u32, slot: u32) -> Result<(), SvcMapError> {
        gone_ok(self.be.remove(&be_key(id, slot))).map_err(|source| SvcMapError::Map {
            map: "mgy_svc_be",
            source,
        })
    }
}

/// Calico's default BPFDataIfacePattern, plus the VXLAN device (Felix adds it too): where
/// traffic from other nodes and from outside arrives.
pub const DEFAULT_DATA_IFACE_PATTERN: &str =
    "^((en|wl|ww|sl|ib)[Popsx].*|(eth|wlan|wwan|bond).*|vxlan\\.calico)$";

/// The interfaces of the calling thread's network namespace that `is_data` accepts, each
/// with its index and IPv4 addresses (the node addresses NodePorts answer on).
pub fn data_interfaces(is_data: impl Fn(&str) -> bool) -> Vec<(String, u32, Vec<Ipv4Addr>)> {
    let mut out: BTreeMap<String, (u32, Vec<Ipv4Addr>)> = BTreeMap::new();
    if let Ok(list) = nix::net::if_::if_nameindex() {
        for i in list.iter() {
            let name = i.name().to_string_lossy().into_owned();
            if is_data(&name) {
                out.insert(name, (i.index(), Vec::new()));
            }
        }
    }
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for a in addrs {
            let Some(entry) = out.get_mut(&a.interface_name) else {
                continue;
            };
            if let Some(sin) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) {
                let ip = sin.ip();
                if !entry.1.contains(&ip) {
                    entry.1.push(ip);
                }
            }
        }
    }
    out.into_iter().map(|(n, (i, a))| (n, i, a)).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use margay_calc::services::Frontend;

    /// Records writes in order; can fail the n-th one.
    #[derive(Default)]
    struct Fake {
        fe: BTreeMap<FeKey, FeVal>,
        ext: BTreeMap<FeKey, FeVal>,
        be: BTreeMap<(u32, u32), BeVal>,
        log: Vec<String>,
        fail_at: Option<usize>,
    }

    impl Fake {
        fn step(&mut self, what: String) -> Result<(), String> {
            if self.fail_at == Some(self.log.len()) {
                self.fail_at = None;
                return Err(format!("injected failure at {what}"));
            }
            self.log.push(what);
            Ok(())
        }

        /// Every frontend's count is covered by written slots.
        fn consistent(&self) -> bool {
            self.fe
                .values()
                .chain(self.ext.values())
                .all(|v| (0..v.count).all(|s| self.be.contains_key(&(v.id, s))))
        }
    }

    impl SvcKernel for Fake {
        type Error = String;
        fn put_frontend(&mut self, k: &FeKey, v: &FeVal) -> Result<(), String> {
            self.step(format!("fe {}:{} count {}", k.addr, k.port, v.count))?;
            self.fe.insert(*k, *v);
            assert!(
                self.consistent(),
                "a frontend's count covers an unwritten slot"
            );
            Ok(())
        }
        fn del_frontend(&mut self, k: &FeKey) -> Result<(), String> {
            self.step(format!("del fe {}:{}", k.addr, k.port))?;
            self.fe.remove(k);
            Ok(())
        }
        fn put_external(&mut self, k: &FeKey, v: &FeVal) -> Result<(), String> {
            self.step(format!("ext {}:{} count {}", k.addr, k.port, v.count))?;
            self.ext.insert(*k, *v);
            assert!(
                self.consistent(),
                "a frontend's count covers an unwritten slot"
            );
            Ok(())
        }
        fn del_external(&mut self, k: &FeKey) -> Result<(), String> {
            self.step(format!("del ext {}:{}", k.addr, k.port))?;
            self.ext.remove(k);
            Ok(())
        }
        fn put_backend(&mut self, id: u32, slot: u32, v: &BeVal) -> Result<(), String> {
            self.step(format!("be {id}/{slot} {}", v.addr))?;
            self.be.insert((id, slot), *v);
            Ok(())
        }
        fn del_backend(&mut self, id: u32, slot: u32) -> Result<(), String> {
            self.step(format!("del be {id}/{slot}"))?;
            self.be.remove(&(id, slot));
            assert!(self.consistent(), "a slot still counted was deleted");
            Ok(())
        }
    }

    fn id(name: &str, proto: PortProtocol) -> ServicePortId {
        ServicePortId {
            namespace: "prod".into(),
            name: name.into(),
            port_name: "http".into(),
            protocol: proto,
        }
    }

    fn port(vip: [u8; 4], backends: &[u8], affinity: Option<u32>) -> Arc<ServicePort> {
        let bes: Vec<Backend> = backends
            .iter()
            .map(|b| Backend {
                addr: IpAddr::V4(Ipv4Addr::new(10, 65, 0, *b)),
                port: 8080,
            })
            .collect();
        Arc::new(ServicePort {
            frontends: vec![Frontend {
                kind: FrontendKind::ClusterIp,
                addr: IpAddr::V4(Ipv4Addr::from(vip)),
                port: 80,
            }],
            node_port: None,
            cluster_backends: bes.clone(),
            local_backends: bes,
            external_local: false,
            internal_local: false,
            affinity_timeout: affinity,
        })
    }

    fn model(list: &[(&str, [u8; 4], &[u8])]) -> BTreeMap<ServicePortId, Arc<ServicePort>> {
        list.iter()
            .map(|(n, vip, b)| (id(n, PortProtocol::Tcp), port(*vip, b, None)))
            .collect()
    }

    #[test]
    fn codecs_round_trip_in_the_programs_byte_order() {
        let k = FeKey {
            addr: Ipv4Addr::new(10, 96, 0, 10),
            port: 80,
            proto: 6,
        };
        assert_eq!(k.encode(), [10, 96, 0, 10, 0, 80, 6, 0]);
        assert_eq!(FeKey::decode(&k.encode()), k);
        let v = FeVal {
            id: 7,
            count: 3,
            flags: F_AFFINITY,
            affinity_s: 10800,
        };
        assert_eq!(FeVal::decode(&v.encode()), v);
        let b = BeVal {
            addr: Ipv4Addr::new(10, 65, 0, 1),
            port: 8080,
        };
        assert_eq!(b.encode(), [10, 65, 0, 1, 0x1f, 0x90, 0, 0]);
        assert_eq!(decode_be_key(&be_key(5, 9)), (5, 9));
    }

    #[test]
    fn a_service_is_backends_then_one_frontend_write_and_changes_are_incremental() {
        let mut s = SvcSyncer::new();
        let mut k = Fake::default();
        let m = model(&[("web", [10, 96, 0, 10], &[1, 2, 3])]);
        let r = s.sync(&m, &[], &mut k).unwrap();
        assert_eq!((r.backends_written, r.frontends_written), (3, 1));
        assert_eq!(
            k.log,
            [
                "be 1/0 10.65.0.1",
                "be 1/1 10.65.0.2",
                "be 1/2 10.65.0.3",
                "fe 10.96.0.10:80 count 3"
            ]
        );
        // Nothing changed: nothing written.
        k.log.clear();
        let r = s.sync(&m, &[], &mut k).unwrap();
        assert_eq!(r, SvcReport::default());
        assert!(k.log.is_empty());
        // One endpoint more: one slot, then one frontend write.
        let m = model(&[("web", [10, 96, 0, 10], &[1, 2, 3, 4])]);
        s.sync(&m, &[], &mut k).unwrap();
        assert_eq!(k.log, ["be 1/3 10.65.0.4", "fe 10.96.0.10:80 count 4"]);
        // Scaled to one: the count drops first, the slots go at the next sync.
        k.log.clear();
        let m = model(&[("web", [10, 96, 0, 10], &[4])]);
        s.sync(&m, &[], &mut k).unwrap();
        assert_eq!(k.log, ["be 1/0 10.65.0.4", "fe 10.96.0.10:80 count 1"]);
        assert_eq!(k.be.len(), 4);
        k.log.clear();
        s.sync(&m, &[], &mut k).unwrap();
        assert_eq!(k.log, ["del be 1/1", "del be 1/2", "del be 1/3"]);
        // Scaled to zero: count 0 (the program rejects).
        k.log.clear();
        let m = model(&[("web", [10, 96, 0, 10], &[])]);
        s.sync(&m, &[], &mut k).unwrap();
        assert_eq!(k.log, ["fe 10.96.0.10:80 count 0"]);
        // Removed: the frontend at once (after the slot count 0 left uncovered), the
        // group's id at the next sync.
        k.log.clear();
        s.sync(&BTreeMap::new(), &[], &mut k).unwrap();
        assert_eq!(k.log, ["del be 1/0", "del fe 10.96.0.10:80"]);
        s.sync(&BTreeMap::new(), &[], &mut k).unwrap();
        assert!(k.fe.is_empty() && k.be.is_empty(), "{:?}", k.be);
        assert_eq!(s.num_frontends(), 0);
    }

    #[test]
    fn node_ports_external_ips_and_traffic_policies() {
        let mut sp = (*port([10, 96, 0, 10], &[1, 2], None)).clone();
        sp.node_port = Some(30080);
        sp.frontends.push(Frontend {
            kind: FrontendKind::ExternalIp,
            addr: IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)),
            port: 80,
        });
        sp.local_backends.truncate(1);
        let nodes = [Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(172, 18, 0, 2)];
        let mut m = BTreeMap::new();
        m.insert(id("web", PortProtocol::Tcp), Arc::new(sp.clone()));
        let d = desired(&m, &nodes);
        // Pods reach the ClusterIP and the ExternalIP; outside traffic the ExternalIP and the
        // NodePort on both node addresses, SNATed (Cluster), all with the two backends.
        assert_eq!(d.frontends.len(), 2);
        assert_eq!(d.external.len(), 3, "{:?}", d.external);
        assert!(
            d.external
                .values()
                .all(|(g, f, _)| !g.local && *f == F_SNAT)
        );
        assert_eq!(d.groups.len(), 1);
        // externalTrafficPolicy Local: outside traffic keeps its source and goes to this
        // node's endpoint only (a group of its own); pods still use all of them.
        sp.external_local = true;
        m.insert(id("web", PortProtocol::Tcp), Arc::new(sp));
        let d = desired(&m, &nodes);
        assert!(d.external.values().all(|(g, f, _)| g.local && *f == 0));
        assert_eq!(d.groups.len(), 2);
        let local = d.groups.iter().find(|(g, _)| g.local).unwrap().1;
        assert_eq!(local.len(), 1);
        let mut s = SvcSyncer::new();
        let mut k = Fake::default();
        s.sync(&m, &nodes, &mut k).unwrap();
        assert_eq!((k.fe.len(), k.ext.len(), k.be.len()), (2, 3, 3));
        // The node's address changes: only the NodePort frontends move.
        k.log.clear();
        s.sync(&m, &nodes[..1], &mut k).unwrap();
        assert_eq!(k.log, ["del ext 172.18.0.2:30080"]);
    }

    #[test]
    fn only_changed_ports_are_looked_at_and_a_conflict_falls_back_to_a_full_pass() {
        let mut m = model(&[
            ("a", [10, 96, 0, 1], &[1, 2]),
            ("b", [10, 96, 0, 2], &[3, 4]),
            ("c", [10, 96, 0, 3], &[5]),
        ]);
        let mut s = SvcSyncer::new();
        let mut k = Fake::default();
        s.sync(&m, &[], &mut k).unwrap();
        // b's slice changes: b's slot and frontend only.
        k.log.clear();
        m.insert(
            id("b", PortProtocol::Tcp),
            port([10, 96, 0, 2], &[3, 6, 7], None),
        );
        s.sync(&m, &[], &mut k).unwrap();
        assert_eq!(
            k.log,
            [
                "be 2/1 10.65.0.6",
                "be 2/2 10.65.0.7",
                "fe 10.96.0.2:80 count 3"
            ]
        );
        // c removed, d added with c's old ClusterIP: one pass, c's frontend replaced by d's.
        k.log.clear();
        m.remove(&id("c", PortProtocol::Tcp));
        m.insert(id("d", PortProtocol::Tcp), port([10, 96, 0, 3], &[8], None));
        s.sync(&m, &[], &mut k).unwrap();
        assert_eq!(
            k.fe[&FeKey {
                addr: Ipv4Addr::new(10, 96, 0, 3),
                port: 80,
                proto: PROTO_TCP
            }]
                .count,
            1
        );
        assert!(k.consistent());
        // e claims a's ClusterIP (a conflict): refused by name, a keeps it.
        m.insert(id("e", PortProtocol::Tcp), port([10, 96, 0, 1], &[9], None));
        let r = s.sync(&m, &[], &mut k).unwrap();
        assert!(r.refused.iter().any(|x| x.contains("prod/e/")), "{r:?}");
        let a = k.fe[&FeKey {
            addr: Ipv4Addr::new(10, 96, 0, 1),
            port: 80,
            proto: PROTO_TCP,
        }];
        assert_eq!(a.count, 2);
        // The same state from scratch writes the same maps.
        let mut fresh = SvcSyncer::new();
        let mut k2 = Fake::default();
        fresh.sync(&m, &[], &mut k2).unwrap();
        assert_eq!(k2.fe.len(), k.fe.len());
        let addrs = |f: &Fake| -> BTreeSet<(FeKey, Vec<BeVal>)> {
            f.fe.iter()
                .map(|(fk, v)| (*fk, (0..v.count).map(|i| f.be[&(v.id, i)]).collect()))
                .collect()
        };
        assert_eq!(addrs(&k), addrs(&k2));
    }

    #[test]
    fn a_failed_write_leaves_the_record_exact_and_the_next_sync_finishes() {
        let m = model(&[
            ("a", [10, 96, 0, 1], &[1, 2]),
            ("b", [10, 96, 0, 2], &[3, 4, 5]),
        ]);
        for fail_at in 0..7 {
            let mut s = SvcSyncer::new();
            let mut k = Fake {
                fail_at: Some(fail_at),
                ..Fake::default()
            };
            assert!(
                s.sync(&m, &[], &mut k).is_err(),
                "write {fail_at} should fail"
            );
            s.sync(&m, &[], &mut k).unwrap();
            assert_eq!(k.fe.len(), 2, "fail at {fail_at}");
            assert_eq!(k.be.len(), 5, "fail at {fail_at}");
            assert!(k.consistent());
            k.log.clear();
            assert_eq!(s.sync(&m, &[], &mut k).unwrap(), SvcReport::default());
        }
    }

    #[test]
    fn affinity_ipv6_sctp_duplicates_and_adoption() {
        let mut m = BTreeMap::new();
        m.insert(
            id("sticky", PortProtocol::Udp),
            port([10, 96, 0, 53], &[1], Some(60)),
        );
        m.insert(
            id("sctp", PortProtocol::Sctp),
            port([10, 96, 0, 9], &[1], None),
        );
        // Another service claiming the same frontend is refused, named.
        m.insert(
            id("zz-dup", PortProtocol::Udp),
            port([10, 96, 0, 53], &[2], None),
        );
        let mut v6 = (*port([0, 0, 0, 0], &[1], None)).clone();
        v6.frontends[0].addr = "fd00::10".parse().unwrap();
        m.insert(id("v6", PortProtocol::Tcp), Arc::new(v6));
        let d = desired(&m, &[]);
        assert_eq!(d.frontends.len(), 1, "{d:?}");
        let (_, (_, flags, aff)) = d.frontends.iter().next().unwrap();
        assert_eq!((*flags, *aff), (F_AFFINITY, 60));
        assert!(d.refused[0].contains("zz-dup"), "{:?}", d.refused);

        // A restart: the old run's frontends are replaced in one write each, its slots
        // deleted after, new ids above the old ones.
        let mut k = Fake::default();
        let old = FeKey {
            addr: Ipv4Addr::new(10, 96, 0, 53),
            port: 80,
            proto: PROTO_UDP,
        };
        let gone = FeKey {
            addr: Ipv4Addr::new(10, 96, 0, 99),
            port: 80,
            proto: PROTO_UDP,
        };
        let b = BeVal {
            addr: Ipv4Addr::new(10, 65, 0, 1),
            port: 8080,
        };
        for (fk, id) in [(old, 40), (gone, 41)] {
            k.fe.insert(
                fk,
                FeVal {
                    id,
                    count: 1,
                    ..FeVal::default()
                },
            );
            k.be.insert((id, 0), b);
        }
        let mut s = SvcSyncer::new();
        s.adopt(
            k.fe.iter().map(|(a, b)| (*a, *b)).collect(),
            vec![],
            k.be.keys().copied().collect(),
        );
        s.sync(&m, &[], &mut k).unwrap();
        assert_eq!(k.fe[&old].id, 42);
        assert!(!k.fe.contains_key(&gone));
        s.sync(&m, &[], &mut k).unwrap();
        assert_eq!(k.be.keys().copied().collect::<Vec<_>>(), [(42, 0)]);
    }
}
