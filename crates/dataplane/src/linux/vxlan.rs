//! The VXLAN device (`vxlan.calico`) and its static neighbours.
//!
//! Calico's VXLAN manager, as margay does it:
//! - the device: VNI 4096, UDP port 4789, learning off, parent = the interface holding this
//!   node's address, local IP = that address, MAC = this node's VTEP MAC (the Node's
//!   `vxlanTunnelMACAddr`, else the deterministic `vxlan_mac_for_node`, the same one the
//!   calculation graph gives other nodes), MTU from configuration or the parent's MTU minus
//!   50 (70 for IPv6), address = this node's VXLAN tunnel address as /32 (/128), up;
//! - for every remote VTEP a permanent ARP/NDP entry (tunnel address → VTEP MAC) and an FDB
//!   entry (VTEP MAC → the remote node's address), so nothing is ever learned or flooded;
//! - entries of VTEPs that went away are removed; drift (device settings changed, entries
//!   deleted) is repaired on the next apply; a device whose identity changed (VNI, port,
//!   parent, local address, MAC, learning) is deleted and created again;
//! - VXLAN disabled (no VXLAN pool): the device is deleted if it exists.
//!
//! The decisions ([`device_actions`], [`desired_l2`], [`diff_arp`], [`diff_fdb`]) are pure;
//! [`VxlanManager::apply`] reads the kernel, asks them, and does what they say.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use margay_api::net::Cidr;
use margay_calc::Vtep;
use margay_netlink::packet_route::link::{
    InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use margay_netlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use margay_netlink::packet_route::{AddressFamily, RouteNetlinkMessage};

use super::netlink::{
    self, Link, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, Netlink, format_mac, ip_from_bytes,
    parse_mac,
};
use super::routes::{VXLAN_DEVICE_V4, VXLAN_DEVICE_V6};

/// Calico's VXLANVNI default.
pub const DEFAULT_VNI: u32 = 4096;
/// Calico's VXLANPort default (the IANA VXLAN port).
pub const DEFAULT_PORT: u16 = 4789;
/// VXLAN over IPv4 adds 50 bytes (outer IPv4 20 + UDP 8 + VXLAN 8 + inner Ethernet 14).
pub const OVERHEAD_V4: u32 = 50;
/// VXLAN over IPv6 adds 70 bytes.
pub const OVERHEAD_V6: u32 = 70;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    fn of(ip: &IpAddr) -> IpFamily {
        if ip.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }
    fn address_family(self) -> AddressFamily {
        match self {
            IpFamily::V4 => AddressFamily::Inet,
            IpFamily::V6 => AddressFamily::Inet6,
        }
    }
    fn host_prefix(self) -> u8 {
        match self {
            IpFamily::V4 => 32,
            IpFamily::V6 => 128,
        }
    }
}

/// The VXLAN device's settings (Felix's VXLANVNI, VXLANPort, VXLANMTU / VXLANMTUV6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanConfig {
    pub device: String,
    pub vni: u32,
    pub port: u16,
    /// 0: the parent interface's MTU minus the VXLAN overhead.
    pub mtu: u32,
    pub family: IpFamily,
}

impl VxlanConfig {
    /// `vxlan.calico` with Calico's defaults.
    pub fn v4() -> VxlanConfig {
        VxlanConfig {
            device: VXLAN_DEVICE_V4.into(),
            vni: DEFAULT_VNI,
            port: DEFAULT_PORT,
            mtu: 0,
            family: IpFamily::V4,
        }
    }

    /// `vxlan-v6.calico` with Calico's defaults.
    pub fn v6() -> VxlanConfig {
        VxlanConfig {
            device: VXLAN_DEVICE_V6.into(),
            family: IpFamily::V6,
            ..VxlanConfig::v4()
        }
    }

    fn overhead(&self) -> u32 {
        match self.family {
            IpFamily::V4 => OVERHEAD_V4,
            IpFamily::V6 => OVERHEAD_V6,
        }
    }
}

/// The device as it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    pub mac: [u8; 6],
    pub parent_index: u32,
    pub local: IpAddr,
    pub mtu: u32,
    /// The tunnel address, /32 or /128.
    pub address: Cidr,
}

/// The device as the kernel has it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceState {
    pub index: u32,
    pub is_vxlan: bool,
    pub vni: Option<u32>,
    pub port: Option<u16>,
    pub parent_index: Option<u32>,
    pub local: Option<IpAddr>,
    pub learning: Option<bool>,
    pub mac: Vec<u8>,
    pub mtu: u32,
    pub up: bool,
    /// Its addresses of the device's family (IPv6 link-local ones left out).
    pub addresses: Vec<Cidr>,
}

impl DeviceState {
    fn from_link(l: &Link, addresses: Vec<Cidr>) -> DeviceState {
        let mut s = DeviceState {
            index: l.index,
            is_vxlan: l.kind == Some(InfoKind::Vxlan),
            mac: l.mac.clone(),
            mtu: l.mtu,
            up: l.up,
            addresses,
            ..DeviceState::default()
        };
        for a in &l.vxlan {
            match a {
                InfoVxlan::Id(v) => s.vni = Some(*v),
                InfoVxlan::Port(p) => s.port = Some(*p),
                InfoVxlan::Link(i) => s.parent_index = Some(*i),
                InfoVxlan::Local(ip) => s.local = Some(IpAddr::V4(*ip)),
                InfoVxlan::Local6(ip) => s.local = Some(IpAddr::V6(*ip)),
                InfoVxlan::Learning(b) => s.learning = Some(*b),
                _ => {}
            }
        }
        s
    }
}

/// One step towards the wanted device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceAction {
    /// Delete the existing device (its identity is wrong).
    Delete {
        reason: String,
    },
    /// Create the device (up, with its MAC and MTU).
    Create,
    SetMtu(u32),
    SetUp,
    AddAddress(Cidr),
    RemoveAddress(Cidr),
}

/// Why the existing device cannot be fixed in place, if it cannot.
pub fn incompatibility(want: &DeviceSpec, have: &DeviceState) -> Option<String> {
    if !have.is_vxlan {
        return Some("it is not a VXLAN device".into());
    }
    let differs = |what: &str, have: String, want: String| {
        Some(format!("{what} is {have}, should be {want}"))
    };
    if have.vni != Some(want.vni) {
        return differs("VNI", format!("{:?}", have.vni), want.vni.to_string());
    }
    if have.port != Some(want.port) {
        return differs(
            "UDP port",
            format!("{:?}", have.port),
            want.port.to_string(),
        );
    }
    if have.parent_index != Some(want.parent_index) {
        return differs(
            "parent interface index",
            format!("{:?}", have.parent_index),
            want.parent_index.to_string(),
        );
    }
    if have.local != Some(want.local) {
        return differs(
            "local address",
            format!("{:?}", have.local),
            want.local.to_string(),
        );
    }
    if have.learning != Some(false) {
        return Some("address learning is on".into());
    }
    if have.mac != want.mac {
        return differs("MAC", format_mac(&have.mac), format_mac(&want.mac));
    }
    None
}

/// What to do to turn `have` (None: no such device) into `want`.
pub fn device_actions(want: &DeviceSpec, have: Option<&DeviceState>) -> Vec<DeviceAction> {
    let mut out = Vec::new();
    let have = match have {
        Some(h) => match incompatibility(want, h) {
            Some(reason) => {
                out.push(DeviceAction::Delete { reason });
                None
            }
            None => Some(h),
        },
        None => None,
    };
    match have {
        None => {
            out.push(DeviceAction::Create);
            out.push(DeviceAction::AddAddress(want.address));
        }
        Some(h) => {
            if h.mtu != want.mtu {
                out.push(DeviceAction::SetMtu(want.mtu));
            }
            if !h.up {
                out.push(DeviceAction::SetUp);
            }
            for a in &h.addresses {
                if *a != want.address {
                    out.push(DeviceAction::RemoveAddress(*a));
                }
            }
            if !h.addresses.contains(&want.address) {
                out.push(DeviceAction::AddAddress(want.address));
            }
        }
    }
    out
}

/// A static ARP (NDP) entry: a remote tunnel address and its VTEP's MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArpEntry {
    pub ip: IpAddr,
    pub mac: [u8; 6],
}

/// A static FDB entry: a remote VTEP's MAC and its node's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FdbEntry {
    pub mac: [u8; 6],
    pub dst: IpAddr,
}

impl fmt::Display for ArpEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} lladdr {}", self.ip, format_mac(&self.mac))
    }
}

impl fmt::Display for FdbEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} dst {}", format_mac(&self.mac), self.dst)
    }
}

/// The neighbours every remote VTEP needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct L2Desired {
    pub arp: Vec<ArpEntry>,
    pub fdb: Vec<FdbEntry>,
    /// VTEPs left out: (node, why).
    pub problems: Vec<(String, String)>,
}

/// This node's VTEP for `family`: (tunnel address, MAC, parent address).
pub fn local_vtep(vteps: &[Vtep], me: &str, family: IpFamily) -> Option<(IpAddr, String, IpAddr)> {
    let v = vteps.iter().find(|v| v.node == me)?;
    vtep_fields(v, family)
}

fn vtep_fields(v: &Vtep, family: IpFamily) -> Option<(IpAddr, String, IpAddr)> {
    match family {
        IpFamily::V4 => Some((v.ipv4_addr?, v.mac.clone(), v.parent_device_ip?)),
        IpFamily::V6 => Some((v.ipv6_addr?, v.mac_v6.clone(), v.parent_device_ipv6?)),
    }
}

/// The ARP and FDB entries for every remote VTEP of `family` (this node's own is skipped).
pub fn desired_l2(vteps: &[Vtep], me: &str, family: IpFamily) -> L2Desired {
    let mut out = L2Desired::default();
    let mut arp: BTreeMap<IpAddr, ArpEntry> = BTreeMap::new();
    let mut fdb: BTreeMap<[u8; 6], FdbEntry> = BTreeMap::new();
    for v in vteps {
        if v.node == me {
            continue;
        }
        let Some((tunnel, mac, parent)) = vtep_fields(v, family) else {
            continue;
        };
        let Some(mac) = parse_mac(&mac) else {
            out.problems.push((
                v.node.clone(),
                format!("its VTEP MAC {mac:?} is not a MAC address"),
            ));
            continue;
        };
        if IpFamily::of(&tunnel) != family || IpFamily::of(&parent) != family {
            out.problems.push((
                v.node.clone(),
                "its VTEP addresses are of the wrong IP version".into(),
            ));
            continue;
        }
        if let Some(prev) = arp.get(&tunnel) {
            out.problems.push((
                v.node.clone(),
                format!(
                    "its tunnel address {tunnel} is also another VTEP's ({})",
                    format_mac(&prev.mac)
                ),
            ));
            continue;
        }
        if fdb.contains_key(&mac) {
            out.problems.push((
                v.node.clone(),
                format!("its VTEP MAC {} is also another VTEP's", format_mac(&mac)),
            ));
            continue;
        }
        arp.insert(tunnel, ArpEntry { ip: tunnel, mac });
        fdb.insert(mac, FdbEntry { mac, dst: parent });
    }
    out.arp = arp.into_values().collect();
    out.fdb = fdb.into_values().collect();
    out
}

/// A neighbour entry on the device as the kernel has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedArp {
    pub ip: IpAddr,
    pub mac: Vec<u8>,
    pub permanent: bool,
}

/// What to change in the ARP table: entries to add or replace, addresses to delete.
/// Only permanent entries are margay's to delete (the kernel's own come and go).
pub fn diff_arp(desired: &[ArpEntry], observed: &[ObservedArp]) -> (Vec<ArpEntry>, Vec<IpAddr>) {
    let want: BTreeMap<IpAddr, &ArpEntry> = desired.iter().map(|e| (e.ip, e)).collect();
    let add = desired
        .iter()
        .filter(|e| {
            !observed
                .iter()
                .any(|o| o.ip == e.ip && o.permanent && o.mac == e.mac)
        })
        .copied()
        .collect();
    let remove = observed
        .iter()
        .filter(|o| o.permanent && !want.contains_key(&o.ip))
        .map(|o| o.ip)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    (add, remove)
}

/// What to change in the FDB: entries to add, entries to delete (every remote entry on the
/// device is margay's: the device does not learn).
pub fn diff_fdb(desired: &[FdbEntry], observed: &[FdbEntry]) -> (Vec<FdbEntry>, Vec<FdbEntry>) {
    let want: BTreeSet<&FdbEntry> = desired.iter().collect();
    let have: BTreeSet<&FdbEntry> = observed.iter().collect();
    (
        want.difference(&have).map(|e| **e).collect(),
        have.difference(&want).map(|e| **e).collect(),
    )
}

// ---- applying ------------------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
pub enum VxlanError {
    #[error(
        "VXLAN manager: {what} failed: {source} (margay needs CAP_NET_ADMIN in the node's network namespace)"
    )]
    Netlink {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "VXLAN manager: no interface holds this node's address {ip}, so {device} has no parent; check the Node's address (margay node startup) and the host's interfaces"
    )]
    NoParent { ip: IpAddr, device: String },
    #[error(
        "VXLAN manager: this node's VTEP MAC {mac:?} is not a MAC address; fix the Node's vxlanTunnelMACAddr or remove it"
    )]
    BadMac { mac: String },
    #[error(
        "VXLAN manager: {device}'s MTU would be {mtu} (parent MTU {parent_mtu} minus {overhead}); set VXLANMTU"
    )]
    BadMtu {
        device: String,
        mtu: i64,
        parent_mtu: u32,
        overhead: u32,
    },
    #[error(
        "VXLAN manager: {device} exists but is not a VXLAN device; rename or delete that interface"
    )]
    NotVxlan { device: String },
}

fn nl_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VxlanError {
    let what = what.into();
    move |source| VxlanError::Netlink { what, source }
}

/// What happened to the device in one apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DeviceChange {
    /// VXLAN is off and there is no device.
    #[default]
    Absent,
    Unchanged,
    Created,
    /// Deleted and created again, and why.
    Recreated {
        reason: String,
    },
    /// Fixed in place (MTU, up, addresses).
    Updated {
        changes: Vec<String>,
    },
    /// VXLAN is off; the device was deleted.
    Removed,
    /// VXLAN is on but the device cannot be made yet, and why.
    Waiting {
        reason: String,
    },
}

/// What one [`VxlanManager::apply`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VxlanReport {
    pub device: DeviceChange,
    /// The parent interface's name.
    pub parent: Option<String>,
    pub mtu: u32,
    pub arp_added: usize,
    pub arp_removed: usize,
    pub fdb_added: usize,
    pub fdb_removed: usize,
    /// ARP and FDB entries already right.
    pub l2_unchanged: usize,
    /// VTEPs left out: (node, why).
    pub skipped_vteps: Vec<(String, String)>,
    /// Neighbour changes the kernel refused (retried on the next apply).
    pub errors: Vec<String>,
    pub duration: Duration,
}

impl VxlanReport {
    pub fn needs_retry(&self) -> bool {
        !self.errors.is_empty() || matches!(self.device, DeviceChange::Waiting { .. })
    }
}

/// Creates and maintains one VXLAN device (IPv4 or IPv6) and its static neighbours.
#[derive(Debug)]
pub struct VxlanManager {
    cfg: VxlanConfig,
    warned: BTreeSet<(String, String)>,
}

impl VxlanManager {
    pub fn new(cfg: VxlanConfig) -> VxlanManager {
        VxlanManager {
            cfg,
            warned: BTreeSet::new(),
        }
    }

    pub fn config(&self) -> &VxlanConfig {
        &self.cfg
    }

    /// Brings the device and its neighbours in line with `vteps` (every VTEP, this node's
    /// included: it defines the device). With `enabled` false the device is deleted.
    pub fn apply(
        &mut self,
        enabled: bool,
        me: &str,
        vteps: &[Vtep],
    ) -> Result<VxlanReport, VxlanError> {
        let started = Instant::now();
        let mut report = VxlanReport::default();
        let cfg = &self.cfg;
        let mut nl = Netlink::open().map_err(nl_err("opening a netlink socket"))?;
        let links = nl.links().map_err(nl_err("listing links"))?;
        let existing = links.iter().find(|l| l.name == cfg.device);
        // An interface of another kind under margay's name is someone else's: never deleted.
        if existing.is_some_and(|l| l.kind != Some(InfoKind::Vxlan)) {
            return Err(VxlanError::NotVxlan {
                device: cfg.device.clone(),
            });
        }

        if !enabled {
            if let Some(l) = existing {
                nl.delete_link(l.index)
                    .map_err(nl_err(format!("deleting {}", cfg.device)))?;
                tracing::info!(device = %cfg.device, "VXLAN is not used: deleted the VXLAN device");
                report.device = DeviceChange::Removed;
            }
            report.duration = started.elapsed();
            return Ok(report);
        }

        let Some((tunnel_ip, mac, parent_ip)) = local_vtep(vteps, me, cfg.family) else {
            report.device = DeviceChange::Waiting {
                reason: format!(
                    "node {me:?} has no VXLAN tunnel address yet (margay node allocate-tunnel-addrs assigns it)"
                ),
            };
            report.duration = started.elapsed();
            return Ok(report);
        };
        let mac = parse_mac(&mac).ok_or(VxlanError::BadMac { mac })?;
        let addrs = nl.addresses().map_err(nl_err("listing addresses"))?;
        let parent = addrs
            .iter()
            .find(|a| a.cidr.addr() == parent_ip)
            .and_then(|a| links.iter().find(|l| l.index == a.index))
            .ok_or_else(|| VxlanError::NoParent {
                ip: parent_ip,
                device: cfg.device.clone(),
            })?;
        report.parent = Some(parent.name.clone());
        let mtu = if cfg.mtu != 0 {
            cfg.mtu
        } else {
            let m = i64::from(parent.mtu) - i64::from(cfg.overhead());
            u32::try_from(m)
                .ok()
                .filter(|m| *m >= 68)
                .ok_or(VxlanError::BadMtu {
                    device: cfg.device.clone(),
                    mtu: m,
                    parent_mtu: parent.mtu,
                    overhead: cfg.overhead(),
                })?
        };
        report.mtu = mtu;
        let address =
            Cidr::new(tunnel_ip, cfg.family.host_prefix()).map_err(|e| VxlanError::Netlink {
                what: format!("tunnel address {tunnel_ip}"),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
            })?;
        let spec = DeviceSpec {
            name: cfg.device.clone(),
            vni: cfg.vni,
            port: cfg.port,
            mac,
            parent_index: parent.index,
            local: parent_ip,
            mtu,
            address,
        };
        let have = existing.map(|l| {
            let own: Vec<Cidr> = addrs
                .iter()
                .filter(|a| a.index == l.index && IpFamily::of(&a.cidr.addr()) == cfg.family)
                .map(|a| a.cidr)
                .filter(|c| !is_link_local(c))
                .collect();
            DeviceState::from_link(l, own)
        });
        let actions = device_actions(&spec, have.as_ref());
        let mut index = have.as_ref().map(|h| h.index).unwrap_or(0);
        let mut changes = Vec::new();
        let mut recreated = None;
        let mut created = false;
        for a in &actions {
            match a {
                DeviceAction::Delete { reason } => {
                    tracing::warn!(device = %cfg.device, %reason, "VXLAN device has the wrong settings; recreating it");
                    nl.delete_link(index)
                        .map_err(nl_err(format!("deleting {}", cfg.device)))?;
                    recreated = Some(reason.clone());
                }
                DeviceAction::Create => {
                    nl.request(
                        NLM_F_CREATE | NLM_F_EXCL,
                        RouteNetlinkMessage::NewLink(vxlan_link_message(&spec)),
                    )
                    .map_err(nl_err(format!("creating {}", cfg.device)))?;
                    index = nl
                        .links()
                        .map_err(nl_err("listing links"))?
                        .into_iter()
                        .find(|l| l.name == cfg.device)
                        .map(|l| l.index)
                        .ok_or_else(|| VxlanError::Netlink {
                            what: format!("creating {}", cfg.device),
                            source: std::io::Error::other("the new device is not listed"),
                        })?;
                    created = true;
                }
                DeviceAction::SetMtu(m) => {
                    nl.set_link(index, Some(*m), false)
                        .map_err(nl_err(format!("setting {}'s MTU", cfg.device)))?;
                    changes.push(format!("MTU {m}"));
                }
                DeviceAction::SetUp => {
                    nl.set_link(index, None, true)
                        .map_err(nl_err(format!("bringing {} up", cfg.device)))?;
                    changes.push("up".into());
                }
                DeviceAction::AddAddress(c) => {
                    nl.change_address(index, *c, true)
                        .map_err(nl_err(format!("adding {c} to {}", cfg.device)))?;
                    changes.push(format!("address {c}"));
                }
                DeviceAction::RemoveAddress(c) => {
                    nl.change_address(index, *c, false)
                        .map_err(nl_err(format!("removing {c} from {}", cfg.device)))?;
                    changes.push(format!("removed address {c}"));
                }
            }
        }
        report.device = match (recreated, created) {
            (Some(reason), _) => DeviceChange::Recreated { reason },
            (None, true) => DeviceChange::Created,
            (None, false) if changes.is_empty() => DeviceChange::Unchanged,
            (None, false) => DeviceChange::Updated { changes },
        };
        if report.device != DeviceChange::Unchanged {
            tracing::info!(device = %cfg.device, change = ?report.device, parent = %parent.name, mtu, vni = cfg.vni, "VXLAN device configured");
        }

        self.apply_l2(&mut nl, index, me, vteps, &mut report)?;
        report.duration = started.elapsed();
        Ok(report)
    }

    fn apply_l2(
        &mut self,
        nl: &mut Netlink,
        index: u32,
        me: &str,
        vteps: &[Vtep],
        report: &mut VxlanReport,
    ) -> Result<(), VxlanError> {
        let family = self.cfg.family;
        let want = desired_l2(vteps, me, family);
        for p in &want.problems {
            if self.warned.insert(p.clone()) {
                tracing::warn!(node = %p.0, problem = %p.1, "VTEP left out");
            }
        }
        self.warned.retain(|p| want.problems.contains(p));
        report.skipped_vteps = want.problems.clone();

        let arp_seen: Vec<ObservedArp> = nl
            .neighbours(family.address_family())
            .map_err(nl_err("listing neighbours"))?
            .iter()
            .filter(|n| n.header.ifindex == index)
            .filter_map(|n| {
                let ip = n.attributes.iter().find_map(|a| match a {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                        Some(IpAddr::V4(*v4))
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                        Some(IpAddr::V6(*v6))
                    }
                    _ => None,
                })?;
                let mac = n
                    .attributes
                    .iter()
                    .find_map(|a| match a {
                        NeighbourAttribute::LinkLayerAddress(m) => Some(m.clone()),
                        _ => None,
                    })
                    .unwrap_or_default();
                Some(ObservedArp {
                    ip,
                    mac,
                    permanent: n.header.state == NeighbourState::Permanent,
                })
            })
            .collect();
        let fdb_seen: Vec<FdbEntry> = nl
            .neighbours(AddressFamily::Bridge)
            .map_err(nl_err("listing FDB entries"))?
            .iter()
            .filter(|n| n.header.ifindex == index)
            .filter_map(|n| {
                let mut mac = None;
                let mut dst = None;
                for a in &n.attributes {
                    match a {
                        NeighbourAttribute::LinkLayerAddress(m) => {
                            mac = <[u8; 6]>::try_from(m.as_slice()).ok()
                        }
                        NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => {
                            dst = ip_from_bytes(b)
                        }
                        NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                            dst = Some(IpAddr::V4(*v4))
                        }
                        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                            dst = Some(IpAddr::V6(*v6))
                        }
                        _ => {}
                    }
                }
                Some(FdbEntry {
                    mac: mac?,
                    dst: dst?,
                })
            })
            .collect();

        let (arp_add, arp_remove) = diff_arp(&want.arp, &arp_seen);
        let (fdb_add, fdb_remove) = diff_fdb(&want.fdb, &fdb_seen);
        report.l2_unchanged = (want.arp.len() - arp_add.len()) + (want.fdb.len() - fdb_add.len());
        let dev = &self.cfg.device;
        // Removals first: an FDB entry whose node moved is deleted, then added again.
        for ip in &arp_remove {
            match nl.request(
                0,
                RouteNetlinkMessage::DelNeighbour(arp_message(index, *ip, None)),
            ) {
                Ok(()) => report.arp_removed += 1,
                Err(e) if e.raw_os_error() == Some(netlink::ENOENT) => {}
                Err(e) => report
                    .errors
                    .push(format!("deleting ARP entry {ip} on {dev}: {e}")),
            }
        }
        for e in &fdb_remove {
            match nl.request(0, RouteNetlinkMessage::DelNeighbour(fdb_message(index, e))) {
                Ok(()) => report.fdb_removed += 1,
                Err(err) if err.raw_os_error() == Some(netlink::ENOENT) => {}
                Err(err) => report
                    .errors
                    .push(format!("deleting FDB entry {e} on {dev}: {err}")),
            }
        }
        for e in &arp_add {
            match nl.request(
                NLM_F_CREATE | NLM_F_REPLACE,
                RouteNetlinkMessage::NewNeighbour(arp_message(index, e.ip, Some(e.mac))),
            ) {
                Ok(()) => report.arp_added += 1,
                Err(err) => report
                    .errors
                    .push(format!("adding ARP entry {e} on {dev}: {err}")),
            }
        }
        for e in &fdb_add {
            match nl.request(
                NLM_F_CREATE | NLM_F_REPLACE,
                RouteNetlinkMessage::NewNeighbour(fdb_message(index, e)),
            ) {
                Ok(()) => report.fdb_added += 1,
                Err(err) => report
                    .errors
                    .push(format!("adding FDB entry {e} on {dev}: {err}")),
            }
        }
        for e in &report.errors {
            tracing::warn!(error = %e, "VXLAN neighbour change refused; retrying on the next apply");
        }
        if report.arp_added + report.arp_removed + report.fdb_added + report.fdb_removed > 0 {
            tracing::info!(
                device = %dev,
                arp_added = report.arp_added,
                arp_removed = report.arp_removed,
                fdb_added = report.fdb_added,
                fdb_removed = report.fdb_removed,
                "VXLAN neighbours updated"
            );
        }
        Ok(())
    }
}

fn is_link_local(c: &Cidr) -> bool {
    match c.addr() {
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
        IpAddr::V4(_) => false,
    }
}

/// The RTM_NEWLINK message creating the device, up.
fn vxlan_link_message(spec: &DeviceSpec) -> LinkMessage {
    let mut m = LinkMessage::default();
    m.header.flags = LinkFlags::Up;
    m.header.change_mask = LinkFlags::Up;
    let local = match spec.local {
        IpAddr::V4(v4) => InfoVxlan::Local(v4),
        IpAddr::V6(v6) => InfoVxlan::Local6(v6),
    };
    m.attributes.push(LinkAttribute::IfName(spec.name.clone()));
    m.attributes.push(LinkAttribute::Address(spec.mac.to_vec()));
    m.attributes.push(LinkAttribute::Mtu(spec.mtu));
    m.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::Vxlan),
        LinkInfo::Data(InfoData::Vxlan(vec![
            InfoVxlan::Id(spec.vni),
            InfoVxlan::Link(spec.parent_index),
            local,
            InfoVxlan::Port(spec.port),
            InfoVxlan::Learning(false),
        ])),
    ]));
    m
}

fn arp_message(index: u32, ip: IpAddr, mac: Option<[u8; 6]>) -> NeighbourMessage {
    let mut m = NeighbourMessage::default();
    m.header.family = IpFamily::of(&ip).address_family();
    m.header.ifindex = index;
    m.header.state = NeighbourState::Permanent;
    m.attributes
        .push(NeighbourAttribute::Destination(NeighbourAddress::from(ip)));
    if let Some(mac) = mac {
        m.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
    }
    m
}

fn fdb_message(index: u32, e: &FdbEntry) -> NeighbourMessage {
    let mut m = NeighbourMessage::default();
    m.header.family = AddressFamily::Bridge;
    m.header.ifindex = index;
    m.header.state = NeighbourState::Permanent;
    m.header.flags = NeighbourFlags::Own;
    m.attributes
        .push(NeighbourAttribute::LinkLayerAddress(e.mac.to_vec()));
    m.attributes
        .push(NeighbourAttribute::Destination(NeighbourAddress::from(
            e.dst,
        )));
    m
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
