//! Routes: which kernel routes margay owns (pure), and putting exactly those into the main
//! routing table (the [`RouteManager`]).
//!
//! Calico's rules, as its route and endpoint managers apply them:
//! - a local workload's addresses are routed `scope link` through its host-side interface;
//! - a remote workload block or address (`REMOTE_WORKLOAD`) in a VXLAN pool goes `via` the
//!   remote node's VXLAN tunnel address, `onlink`, through `vxlan.calico` — except in a
//!   CrossSubnet pool when the remote node shares this node's subnet: then `via` the remote
//!   node's own address, `onlink`, through this node's parent interface;
//! - a remote block in a no-encap pool is BIRD's (it learns it over BGP and installs it with
//!   `proto bird`), unless Felix is told to program no-encap cluster routes
//!   (ProgramClusterRoutes Enabled or EnabledNoEncapOnly; Calico's default EnabledIPIPOnly
//!   leaves them to BIRD): then it goes `via` the remote node's address like the above;
//! - a remote node's tunnel address (`REMOTE_TUNNEL`) in a VXLAN pool is directly connected
//!   through `vxlan.calico` (it *is* the next hop);
//! - a block affine to this node (`LOCAL_WORKLOAD`, not a single workload address) is a
//!   blackhole, so addresses of the block that no workload holds go nowhere;
//! - IPIP pools are not supported (the kernel here has no IPIP): nothing is installed;
//! - a route whose next hop is not known yet (no VTEP, no node address) is skipped until it is.
//!
//! Ownership (the route-ownership invariant):
//! - margay's routes carry protocol 80, Calico's value, and the [`RouteManager`] reads,
//!   replaces and deletes main-table routes with that protocol;
//! - it also owns the routes through the host-side interfaces of its *local workloads* (those
//!   it knows from local endpoints, no other interface, whatever its name): a main-table route
//!   of another protocol through such an interface to one of that workload's addresses (the
//!   CNI plugin's `<pod IP> dev caliXXX scope link`, metric 0, protocol boot) is deleted once
//!   margay's own route to that address is in place — added first, then deleted, so the pod
//!   never loses its route; one with margay's key is replaced in place. As in Calico, whose
//!   route table owns its workload interfaces, the CNI plugin's route is transient: left in
//!   place, its metric below 1024 would make BIRD export every pod's /32 besides the block.
//!   Routes of protocol 0 (a delete with it would match any protocol) and BIRD's (`proto
//!   bird`) are never taken over;
//! - any other route is never touched, even when it is in the way (same destination and
//!   metric): that is reported as a conflict instead. Every delete carries the protocol of
//!   the route it deletes, so the kernel itself refuses to delete anything else.
//!
//! The diff between the desired routes and the kernel's table (`plan_routes`) is pure; the
//! [`RouteManager`] only reads the table, plans and carries the plan out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use margay_api::net::Cidr;
use margay_calc::{
    EncapMode, Message, PoolData, PoolType, Route, Vtep, WorkloadEndpointId, route_type,
};
use margay_netlink::packet_route::AddressFamily;
use margay_netlink::packet_route::RouteNetlinkMessage;
use margay_netlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol, RouteScope,
    RouteType,
};

use super::netlink::{self, NLM_F_CREATE, NLM_F_REPLACE, Netlink};

/// The route protocol of every route margay owns (Calico's `DefaultRouteProto`).
pub const ROUTE_PROTOCOL: u8 = 80;
/// Metric of local workload routes (Felix's IPv4/IPv6NormalRoutePriority default).
pub const DEFAULT_WORKLOAD_ROUTE_PRIORITY: u32 = 1024;
/// The IPv4 VXLAN device.
pub const VXLAN_DEVICE_V4: &str = "vxlan.calico";
/// The IPv6 VXLAN device.
pub const VXLAN_DEVICE_V6: &str = "vxlan-v6.calico";
/// The kernel stores an IPv6 route added with metric 0 with this metric.
const IPV6_DEFAULT_METRIC: u32 = 1024;

/// Where a route sends traffic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteTarget {
    /// Directly connected through an interface (`scope link`, no next hop).
    Interface { ifname: String },
    /// Through a next hop reached over an interface.
    Gateway {
        ifname: String,
        gateway: IpAddr,
        /// Trust that the next hop is on the link (it need not be in the interface's subnet).
        onlink: bool,
    },
    /// Dropped.
    Blackhole,
}

/// A route margay wants in the main table, with protocol [`ROUTE_PROTOCOL`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelRoute {
    pub dst: Cidr,
    pub target: RouteTarget,
    /// The route's metric.
    pub priority: u32,
    /// The source address hint (`src`, DeviceRouteSourceAddress[IPv6]) for traffic the host
    /// itself sends along the route.
    pub src: Option<IpAddr>,
}

/// What identifies a route in the main table: destination and metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteKey {
    pub dst: Cidr,
    pub priority: u32,
}

impl KernelRoute {
    /// The key the kernel files this route under (IPv6 metric 0 is stored as 1024).
    pub fn key(&self) -> RouteKey {
        RouteKey {
            dst: self.dst,
            priority: effective_priority(&self.dst, self.priority),
        }
    }

    pub fn ifname(&self) -> Option<&str> {
        match &self.target {
            RouteTarget::Interface { ifname } | RouteTarget::Gateway { ifname, .. } => Some(ifname),
            RouteTarget::Blackhole => None,
        }
    }
}

fn effective_priority(dst: &Cidr, priority: u32) -> u32 {
    if !dst.is_ipv4() && priority == 0 {
        IPV6_DEFAULT_METRIC
    } else {
        priority
    }
}

impl fmt::Display for KernelRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            RouteTarget::Interface { ifname } => write!(f, "{} dev {ifname} scope link", self.dst)?,
            RouteTarget::Gateway {
                ifname,
                gateway,
                onlink,
            } => {
                write!(f, "{} via {gateway} dev {ifname}", self.dst)?;
                if *onlink {
                    f.write_str(" onlink")?;
                }
            }
            RouteTarget::Blackhole => write!(f, "blackhole {}", self.dst)?,
        }
        if let Some(src) = self.src {
            write!(f, " src {src}")?;
        }
        write!(f, " proto {ROUTE_PROTOCOL} metric {}", self.priority)
    }
}

impl fmt::Display for RouteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} metric {}", self.dst, self.priority)
    }
}

/// Why a route the calculation graph sent has no kernel route.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// The route is in an IPIP pool; this dataplane has no IPIP.
    IpipUnsupported,
    /// The remote node has no VTEP (for this IP version) yet.
    NoVtep { node: String },
    /// The remote node's address is not known.
    NoNodeAddress { node: String },
    /// This node's parent interface (the one holding its address) is not known.
    NoParentDevice,
    /// Another route already claims the same destination and metric.
    Duplicate,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::IpipUnsupported => {
                f.write_str("IPIP pools are not supported by this dataplane")
            }
            SkipReason::NoVtep { node } => write!(f, "node {node:?} has no VXLAN tunnel endpoint"),
            SkipReason::NoNodeAddress { node } => write!(f, "node {node:?} has no address"),
            SkipReason::NoParentDevice => {
                f.write_str("the interface holding this node's address is not known")
            }
            SkipReason::Duplicate => f.write_str("another route has the same destination"),
        }
    }
}

/// What [`desired_routes`] needs besides the routes themselves.
#[derive(Debug, Clone, Copy)]
pub struct RouteContext<'a> {
    /// This node's name.
    pub me: &'a str,
    /// The IP pools (CrossSubnet is decided per pool).
    pub pools: &'a [PoolData],
    pub vxlan_device: &'a str,
    pub vxlan_device_v6: &'a str,
    /// The interface holding this node's IPv4 address (no-encap and same-subnet routes).
    pub parent_device: Option<&'a str>,
    /// The interface holding this node's IPv6 address.
    pub parent_device_v6: Option<&'a str>,
    /// Metric of local workload routes.
    pub workload_priority: u32,
    /// Program remote blocks of no-encap pools (else BIRD does).
    pub program_noencap: bool,
    /// DeviceRouteSourceAddress: the `src` of IPv4 routes through an interface.
    pub source_v4: Option<IpAddr>,
    /// DeviceRouteSourceAddressIPv6: the `src` of IPv6 routes through an interface.
    pub source_v6: Option<IpAddr>,
}

impl<'a> RouteContext<'a> {
    /// Calico's defaults: `vxlan.calico` / `vxlan-v6.calico`, workload metric 1024, no-encap
    /// cluster routes left to BIRD.
    pub fn new(me: &'a str, pools: &'a [PoolData]) -> RouteContext<'a> {
        RouteContext {
            me,
            pools,
            vxlan_device: VXLAN_DEVICE_V4,
            vxlan_device_v6: VXLAN_DEVICE_V6,
            parent_device: None,
            parent_device_v6: None,
            workload_priority: DEFAULT_WORKLOAD_ROUTE_PRIORITY,
            program_noencap: false,
            source_v4: None,
            source_v6: None,
        }
    }

    /// The source hint for a route through an interface to `dst` (blackholes get none).
    fn source_for(&self, dst: &Cidr) -> Option<IpAddr> {
        if dst.is_ipv4() {
            self.source_v4.filter(IpAddr::is_ipv4)
        } else {
            self.source_v6.filter(IpAddr::is_ipv6)
        }
    }
}

/// The routes margay wants, and the ones it had to leave out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DesiredRoutes {
    /// Sorted; one per [`RouteKey`].
    pub routes: Vec<KernelRoute>,
    pub skipped: Vec<(Cidr, SkipReason)>,
}

/// The longest pool containing `cidr` (same IP version).
fn containing_pool<'p>(pools: &'p [PoolData], cidr: &Cidr) -> Option<&'p PoolData> {
    pools
        .iter()
        .filter(|p| {
            p.cidr.is_ipv4() == cidr.is_ipv4()
                && p.cidr.prefix() <= cidr.prefix()
                && p.cidr.contains(cidr.addr())
        })
        .max_by_key(|p| p.cidr.prefix())
}

fn is_host_prefix(c: &Cidr) -> bool {
    c.prefix() == if c.is_ipv4() { 32 } else { 128 }
}

/// Computes exactly the kernel routes margay owns (see the module docs for the rules).
///
/// `routes` are the calculation graph's current `RouteUpdate`s, `local_endpoints` the
/// host-side interface and addresses of each local workload, `vteps` every known VTEP
/// (this node's included; it is ignored).
pub fn desired_routes(
    routes: &[Route],
    local_endpoints: &[(String, Vec<Cidr>)],
    vteps: &[Vtep],
    ctx: &RouteContext<'_>,
) -> DesiredRoutes {
    let mut out: BTreeMap<RouteKey, KernelRoute> = BTreeMap::new();
    let mut skipped = Vec::new();
    let mut push = |mut r: KernelRoute, skipped: &mut Vec<(Cidr, SkipReason)>| {
        if r.target != RouteTarget::Blackhole {
            r.src = ctx.source_for(&r.dst);
        }
        match out.entry(r.key()) {
            std::collections::btree_map::Entry::Occupied(_) => {
                skipped.push((r.dst, SkipReason::Duplicate))
            }
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(r);
            }
        }
    };

    // Local workloads, from their endpoints (Calico's endpoint manager).
    for (ifname, nets) in local_endpoints {
        if ifname.is_empty() {
            continue;
        }
        for net in nets {
            push(
                KernelRoute {
                    dst: *net,
                    target: RouteTarget::Interface {
                        ifname: ifname.clone(),
                    },
                    priority: ctx.workload_priority,
                    src: None,
                },
                &mut skipped,
            );
        }
    }

    let vtep_of = |node: &str| vteps.iter().find(|v| v.node == node);
    for r in routes {
        let v4 = r.dst.is_ipv4();
        let has = |bit: u8| r.types & bit != 0;
        if has(route_type::LOCAL_WORKLOAD) {
            // A local workload's own address is routed from its endpoint (above); a block
            // affine to this node is a blackhole.
            if !r.local_workload
                && !is_host_prefix(&r.dst)
                && matches!(r.pool_type, PoolType::Vxlan | PoolType::NoEncap)
            {
                push(
                    KernelRoute {
                        dst: r.dst,
                        target: RouteTarget::Blackhole,
                        priority: 0,
                        src: None,
                    },
                    &mut skipped,
                );
            }
            continue;
        }
        let remote_workload = has(route_type::REMOTE_WORKLOAD);
        let remote_tunnel = has(route_type::REMOTE_TUNNEL);
        if !(remote_workload || remote_tunnel) || r.dst_node_name == ctx.me {
            continue;
        }
        let parent = if v4 {
            ctx.parent_device
        } else {
            ctx.parent_device_v6
        };
        let direct = |skipped: &mut Vec<(Cidr, SkipReason)>| -> Option<KernelRoute> {
            let Some(ip) = r.dst_node_ip else {
                skipped.push((
                    r.dst,
                    SkipReason::NoNodeAddress {
                        node: r.dst_node_name.clone(),
                    },
                ));
                return None;
            };
            let Some(parent) = parent else {
                skipped.push((r.dst, SkipReason::NoParentDevice));
                return None;
            };
            Some(KernelRoute {
                dst: r.dst,
                target: RouteTarget::Gateway {
                    ifname: parent.to_string(),
                    gateway: ip,
                    onlink: true,
                },
                priority: 0,
                src: None,
            })
        };
        let route = match r.pool_type {
            PoolType::None => None,
            PoolType::Ipip => {
                skipped.push((r.dst, SkipReason::IpipUnsupported));
                None
            }
            PoolType::NoEncap => {
                if remote_workload && ctx.program_noencap {
                    direct(&mut skipped)
                } else {
                    None
                }
            }
            PoolType::Vxlan => {
                let cross_subnet = containing_pool(ctx.pools, &r.dst)
                    .is_some_and(|p| p.vxlan == EncapMode::CrossSubnet);
                let device = if v4 {
                    ctx.vxlan_device
                } else {
                    ctx.vxlan_device_v6
                };
                if cross_subnet && r.same_subnet {
                    direct(&mut skipped)
                } else if remote_tunnel {
                    // The remote VTEP itself: directly connected over the tunnel.
                    Some(KernelRoute {
                        dst: r.dst,
                        target: RouteTarget::Interface {
                            ifname: device.to_string(),
                        },
                        priority: 0,
                        src: None,
                    })
                } else {
                    let gw = vtep_of(&r.dst_node_name)
                        .and_then(|v| if v4 { v.ipv4_addr } else { v.ipv6_addr });
                    match gw {
                        Some(gw) => Some(KernelRoute {
                            dst: r.dst,
                            target: RouteTarget::Gateway {
                                ifname: device.to_string(),
                                gateway: gw,
                                onlink: true,
                            },
                            priority: 0,
                            src: None,
                        }),
                        None => {
                            skipped.push((
                                r.dst,
                                SkipReason::NoVtep {
                                    node: r.dst_node_name.clone(),
                                },
                            ));
                            None
                        }
                    }
                }
            }
        };
        if let Some(route) = route {
            push(route, &mut skipped);
        }
    }
    DesiredRoutes {
        routes: out.into_values().collect(),
        skipped,
    }
}

/// The calculation graph's messages that routing depends on, kept as current state.
#[derive(Debug, Clone, Default)]
pub struct RoutingState {
    me: String,
    routes: BTreeMap<Cidr, Route>,
    vteps: BTreeMap<String, Vtep>,
    endpoints: BTreeMap<WorkloadEndpointId, (String, Vec<Cidr>)>,
    pools: BTreeMap<String, PoolData>,
    my_ipv4: Option<Cidr>,
    my_ipv6: Option<Cidr>,
    ipip: bool,
    vxlan: bool,
    vxlan_v6: bool,
    in_sync: bool,
}

impl RoutingState {
    pub fn new(me: impl Into<String>) -> RoutingState {
        RoutingState {
            me: me.into(),
            ..RoutingState::default()
        }
    }

    /// Takes one message; returns whether routing cares about it.
    pub fn on_message(&mut self, m: &Message) -> bool {
        match m {
            Message::RouteUpdate(r) => {
                self.routes.insert(r.dst, r.clone());
            }
            Message::RouteRemove { dst } => {
                self.routes.remove(dst);
            }
            Message::VtepUpdate(v) => {
                self.vteps.insert(v.node.clone(), v.clone());
            }
            Message::VtepRemove { node } => {
                self.vteps.remove(node);
            }
            Message::WorkloadEndpointUpdate { id, endpoint } => {
                let nets = endpoint
                    .ipv4_nets
                    .iter()
                    .chain(&endpoint.ipv6_nets)
                    .copied()
                    .collect();
                self.endpoints
                    .insert(id.clone(), (endpoint.interface.clone(), nets));
            }
            Message::WorkloadEndpointRemove { id } => {
                self.endpoints.remove(id);
            }
            Message::IpamPoolUpdate { id, pool } => {
                self.pools.insert(id.clone(), pool.clone());
            }
            Message::IpamPoolRemove { id } => {
                self.pools.remove(id);
            }
            Message::HostMetadataUpdate {
                hostname,
                ipv4,
                ipv6,
                ..
            } if *hostname == self.me => {
                self.my_ipv4 = *ipv4;
                self.my_ipv6 = *ipv6;
            }
            Message::HostMetadataRemove { hostname } if *hostname == self.me => {
                self.my_ipv4 = None;
                self.my_ipv6 = None;
            }
            Message::Encapsulation {
                ipip,
                vxlan,
                vxlan_v6,
            } => {
                self.ipip = *ipip;
                self.vxlan = *vxlan;
                self.vxlan_v6 = *vxlan_v6;
            }
            Message::InSync => self.in_sync = true,
            _ => return false,
        }
        true
    }

    pub fn me(&self) -> &str {
        &self.me
    }
    pub fn in_sync(&self) -> bool {
        self.in_sync
    }
    pub fn routes(&self) -> Vec<Route> {
        self.routes.values().cloned().collect()
    }
    pub fn vteps(&self) -> Vec<Vtep> {
        self.vteps.values().cloned().collect()
    }
    pub fn local_endpoints(&self) -> Vec<(String, Vec<Cidr>)> {
        self.endpoints.values().cloned().collect()
    }
    pub fn pools(&self) -> Vec<PoolData> {
        self.pools.values().cloned().collect()
    }
    /// VXLAN (IPv4) is needed: an IPv4 pool uses it (the Encapsulation message).
    pub fn vxlan_enabled(&self) -> bool {
        self.vxlan
    }
    pub fn vxlan_v6_enabled(&self) -> bool {
        self.vxlan_v6
    }
    pub fn ipip_enabled(&self) -> bool {
        self.ipip
    }
    /// This node's IPv4 address: from its host metadata, else its VTEP's parent address.
    pub fn my_ipv4(&self) -> Option<IpAddr> {
        self.my_ipv4
            .map(|c| c.addr())
            .or_else(|| self.vteps.get(&self.me).and_then(|v| v.parent_device_ip))
    }
    pub fn my_ipv6(&self) -> Option<IpAddr> {
        self.my_ipv6
            .map(|c| c.addr())
            .or_else(|| self.vteps.get(&self.me).and_then(|v| v.parent_device_ipv6))
    }

    /// [`desired_routes`] over the current state.
    pub fn desired_routes(&self, ctx_base: &RouteContext<'_>) -> DesiredRoutes {
        let pools = self.pools();
        let ctx = RouteContext {
            me: &self.me,
            pools: &pools,
            ..*ctx_base
        };
        desired_routes(&self.routes(), &self.local_endpoints(), &self.vteps(), &ctx)
    }
}

// ---- applying ------------------------------------------------------------------------------

/// Why the route manager could not do its work at all (single routes that fail are reported
/// in [`RouteReport::failures`] instead).
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error(
        "route manager: {what} failed: {source} (margay needs CAP_NET_ADMIN in the node's network namespace)"
    )]
    Netlink {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn nl_err(what: &'static str) -> impl FnOnce(std::io::Error) -> RouteError {
    move |source| RouteError::Netlink { what, source }
}

/// One route the kernel refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteFailure {
    pub route: String,
    pub operation: &'static str,
    pub error: String,
}

/// What one [`RouteManager::apply`] did, for logs and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteReport {
    pub added: usize,
    /// Routes of margay's whose details changed (replaced in place).
    pub replaced: usize,
    /// Routes of margay's that nobody wants any more (deleted).
    pub removed: usize,
    /// Routes of other protocols through a local workload's interface to its address (the
    /// CNI plugin's), deleted once margay's route to the workload was in place.
    pub taken_over: usize,
    pub unchanged: usize,
    /// Routes the kernel refused; `failures` says which and why.
    pub errors: usize,
    pub failures: Vec<RouteFailure>,
    /// Interfaces that desired routes need but that do not exist (yet): those routes are
    /// retried on the next apply.
    pub missing_interfaces: BTreeSet<String>,
    /// Desired routes waiting for a missing interface.
    pub waiting: usize,
    /// Desired routes not installed because a route margay neither owns nor takes over has
    /// the same destination and metric.
    pub conflicts: Vec<RouteKey>,
    pub duration: Duration,
}

impl RouteReport {
    /// Something is left to do: apply again later.
    pub fn needs_retry(&self) -> bool {
        self.errors > 0 || self.waiting > 0
    }

    pub fn changed(&self) -> bool {
        self.added + self.replaced + self.removed + self.taken_over > 0
    }
}

/// A main-table route as read from the kernel.
#[derive(Debug, Clone, PartialEq)]
struct Observed {
    key: RouteKey,
    tos: u8,
    protocol: u8,
    kind: RouteType,
    scope: RouteScope,
    oif: Option<u32>,
    gateway: Option<IpAddr>,
    onlink: bool,
    src: Option<IpAddr>,
}

fn parse_route(m: &RouteMessage) -> Option<Observed> {
    let h = &m.header;
    if h.flags.contains(RouteFlags::Cloned) {
        return None;
    }
    let mut table = u32::from(h.table);
    let mut dst = None;
    let mut oif = None;
    let mut gateway = None;
    let mut src = None;
    let mut priority = 0;
    for a in &m.attributes {
        match a {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::PrefSource(a) => src = route_ip(a),
            RouteAttribute::Destination(d) => dst = route_ip(d),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Gateway(g) => gateway = route_ip(g),
            RouteAttribute::Priority(p) => priority = *p,
            _ => {}
        }
    }
    if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
        return None;
    }
    let dst = match (dst, h.address_family) {
        (Some(ip), _) => ip,
        (None, AddressFamily::Inet) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        (None, AddressFamily::Inet6) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        _ => return None,
    };
    let dst = Cidr::new(dst, h.destination_prefix_length).ok()?;
    Some(Observed {
        key: RouteKey { dst, priority },
        tos: h.tos,
        protocol: u8::from(h.protocol),
        kind: h.kind,
        scope: h.scope,
        oif,
        gateway,
        onlink: h.flags.contains(RouteFlags::Onlink),
        src,
    })
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// Whether the kernel's route is the wanted one.
fn same(want: &KernelRoute, oif: Option<u32>, have: &Observed) -> bool {
    let v4 = want.dst.is_ipv4();
    if want.target != RouteTarget::Blackhole && have.src != want.src {
        return false;
    }
    match &want.target {
        RouteTarget::Blackhole => have.kind == RouteType::BlackHole,
        RouteTarget::Interface { .. } => {
            have.kind == RouteType::Unicast
                && have.oif == oif
                && have.gateway.is_none()
                // IPv6 routes are all reported with universe scope.
                && (!v4 || have.scope == RouteScope::Link)
        }
        RouteTarget::Gateway {
            gateway, onlink, ..
        } => {
            have.kind == RouteType::Unicast
                && have.oif == oif
                && have.gateway == Some(*gateway)
                && have.onlink == *onlink
        }
    }
}

fn family_of(c: &Cidr) -> AddressFamily {
    if c.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

/// The netlink message that installs `r` (with `oif` resolved).
fn route_message(r: &KernelRoute, oif: Option<u32>) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = family_of(&r.dst);
    m.header.destination_prefix_length = r.dst.prefix();
    m.header.table = RouteHeader::RT_TABLE_MAIN;
    m.header.protocol = RouteProtocol::from(ROUTE_PROTOCOL);
    m.header.kind = RouteType::Unicast;
    m.header.scope = RouteScope::Universe;
    m.attributes
        .push(RouteAttribute::Destination(RouteAddress::from(
            r.dst.network().addr(),
        )));
    match &r.target {
        RouteTarget::Blackhole => m.header.kind = RouteType::BlackHole,
        RouteTarget::Interface { .. } => m.header.scope = RouteScope::Link,
        RouteTarget::Gateway {
            gateway, onlink, ..
        } => {
            if *onlink {
                m.header.flags = RouteFlags::Onlink;
            }
            m.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(*gateway)));
        }
    }
    if let Some(oif) = oif {
        m.attributes.push(RouteAttribute::Oif(oif));
    }
    if let Some(src) = r.src {
        m.attributes
            .push(RouteAttribute::PrefSource(RouteAddress::from(src)));
    }
    if r.priority != 0 {
        m.attributes.push(RouteAttribute::Priority(r.priority));
    }
    m
}

/// The netlink message that deletes exactly this route: margay's (protocol 80) or one it takes
/// over (never protocol 0, which the kernel would read as "any protocol").
fn delete_message(o: &Observed) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = family_of(&o.key.dst);
    m.header.destination_prefix_length = o.key.dst.prefix();
    m.header.tos = o.tos;
    m.header.table = RouteHeader::RT_TABLE_MAIN;
    // The kernel only deletes a route whose protocol matches: never another protocol's route
    // with the same destination (margay's own, or BIRD's).
    m.header.protocol = RouteProtocol::from(o.protocol);
    m.header.scope = RouteScope::NoWhere;
    m.header.kind = o.kind;
    m.attributes
        .push(RouteAttribute::Destination(RouteAddress::from(
            o.key.dst.addr(),
        )));
    if o.key.priority != 0 {
        m.attributes.push(RouteAttribute::Priority(o.key.priority));
    }
    if o.kind != RouteType::BlackHole {
        if let Some(oif) = o.oif {
            m.attributes.push(RouteAttribute::Oif(oif));
        }
        if let Some(gw) = o.gateway {
            m.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
        }
    }
    m
}

/// BIRD's route protocol (`proto bird`): routes learned over BGP. margay never deletes one.
const BIRD_PROTOCOL: u8 = 12;

/// One route to add or replace.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RouteWrite {
    route: KernelRoute,
    oif: Option<u32>,
    /// A route with the same key is there already (margay's, or one margay takes over): the
    /// kernel replaces it in place.
    replacing: bool,
}

/// Why a kernel route is to go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RemovalKind {
    /// margay's, and nobody wants it.
    Unwanted,
    /// margay's, and the first with the key of a route being written: the kernel replaces it
    /// in place when that write succeeds, so it is deleted only when the write fails.
    ReplacedBy(RouteKey),
    /// Another protocol's route through a local workload's interface to one of that
    /// workload's addresses (the CNI plugin's): deleted only once margay's route to this
    /// destination is in place, so the workload is never without a route.
    TakenOver(Cidr),
}

#[derive(Debug, Clone, PartialEq)]
struct Removal {
    route: Observed,
    kind: RemovalKind,
}

/// The diff between the desired routes and the kernel's main table: what one apply does.
#[derive(Debug, Clone, Default, PartialEq)]
struct RoutePlan {
    /// Desired routes that are in place already.
    unchanged: BTreeSet<RouteKey>,
    /// Adds and replaces, in the order of the desired routes.
    writes: Vec<RouteWrite>,
    /// Deletions, done after every write (add first, then delete).
    removals: Vec<Removal>,
    missing_interfaces: BTreeSet<String>,
    /// Desired routes waiting for a missing interface.
    waiting: usize,
    /// Desired routes left out because a route margay neither owns nor takes over has their
    /// key.
    conflicts: Vec<KernelRoute>,
}

/// Whether margay takes over `o`, a route of another protocol: it goes through the host-side
/// interface of a local workload (`workload_nets`: interface index → that workload's
/// addresses) to one of that workload's addresses. Calico's route table claims every route on
/// its workload interfaces the same way; margay claims only those of workloads it knows.
fn taken_over(o: &Observed, workload_nets: &HashMap<u32, BTreeSet<Cidr>>) -> bool {
    // Protocol 0 in a delete request matches any protocol (margay's own route included), and
    // BIRD's routes are never margay's to delete.
    if o.protocol == ROUTE_PROTOCOL || o.protocol == 0 || o.protocol == BIRD_PROTOCOL {
        return false;
    }
    o.oif
        .and_then(|i| workload_nets.get(&i))
        .is_some_and(|nets| nets.contains(&o.key.dst))
}

/// The pure diff: what makes the main table hold exactly `desired` as margay's routes.
///
/// `kernel` is the main table as read, `index_of` the interfaces by name, `workloads` the
/// host-side interface and addresses of each local workload. IPv6 routes are ignored unless
/// `ipv6`.
fn plan_routes(
    desired: &[KernelRoute],
    kernel: &[Observed],
    index_of: &HashMap<&str, u32>,
    workloads: &[(String, Vec<Cidr>)],
    ipv6: bool,
) -> RoutePlan {
    let mut plan = RoutePlan::default();
    let mut workload_nets: HashMap<u32, BTreeSet<Cidr>> = HashMap::new();
    for (ifname, nets) in workloads {
        if let Some(i) = index_of.get(ifname.as_str()) {
            workload_nets
                .entry(*i)
                .or_default()
                .extend(nets.iter().copied());
        }
    }
    let mut owned: BTreeMap<RouteKey, Vec<&Observed>> = BTreeMap::new();
    let mut foreign: BTreeSet<RouteKey> = BTreeSet::new();
    let mut claimed: Vec<&Observed> = Vec::new();
    for o in kernel {
        if !o.key.dst.is_ipv4() && !ipv6 {
            continue;
        }
        if o.protocol == ROUTE_PROTOCOL {
            owned.entry(o.key).or_default().push(o);
        } else if taken_over(o, &workload_nets) {
            claimed.push(o);
        } else if o.tos == 0 {
            foreign.insert(o.key);
        }
    }
    let claimed_keys: BTreeSet<RouteKey> = claimed.iter().map(|o| o.key).collect();

    let mut seen = BTreeSet::new();
    // Observed routes of margay's to keep: (key, index in `owned[key]`).
    let mut keep: BTreeSet<(RouteKey, usize)> = BTreeSet::new();
    for want in desired {
        if !want.dst.is_ipv4() && !ipv6 {
            continue;
        }
        let key = want.key();
        if !seen.insert(key) {
            continue;
        }
        let oif = match want.ifname() {
            None => None,
            Some(name) => match index_of.get(name) {
                Some(i) => Some(*i),
                None => {
                    plan.missing_interfaces.insert(name.to_string());
                    plan.waiting += 1;
                    continue;
                }
            },
        };
        let mine = owned.get(&key).map(Vec::as_slice).unwrap_or_default();
        if let Some(i) = mine.iter().position(|o| same(want, oif, o)) {
            keep.insert((key, i));
            plan.unchanged.insert(key);
            continue;
        }
        if foreign.contains(&key) {
            plan.conflicts.push(want.clone());
            continue;
        }
        if let Some(first) = mine.first() {
            keep.insert((key, 0));
            plan.removals.push(Removal {
                route: (*first).clone(),
                kind: RemovalKind::ReplacedBy(key),
            });
        }
        plan.writes.push(RouteWrite {
            route: want.clone(),
            oif,
            // A taken-over route with this key (IPv6 stores the CNI plugin's metric 0 as
            // 1024, Felix's metric) is replaced in place, so the workload keeps a route
            // throughout; its removal below then finds nothing.
            replacing: !mine.is_empty() || claimed_keys.contains(&key),
        });
    }
    for (key, list) in &owned {
        for (i, o) in list.iter().enumerate() {
            if !keep.contains(&(*key, i)) {
                plan.removals.push(Removal {
                    route: (*o).clone(),
                    kind: RemovalKind::Unwanted,
                });
            }
        }
    }
    for o in claimed {
        plan.removals.push(Removal {
            route: o.clone(),
            kind: RemovalKind::TakenOver(o.key.dst),
        });
    }
    plan
}

/// Whether a planned removal is to be carried out, given the keys the writes of this apply
/// installed (`written`) and the destinations whose desired route is now in the kernel
/// (`in_place`).
fn removal_due(kind: RemovalKind, written: &BTreeSet<RouteKey>, in_place: &BTreeSet<Cidr>) -> bool {
    match kind {
        RemovalKind::Unwanted => true,
        RemovalKind::ReplacedBy(key) => !written.contains(&key),
        // Add first, then delete: never leave a workload without a route.
        RemovalKind::TakenOver(dst) => in_place.contains(&dst),
    }
}

/// Keeps the main table's protocol-80 routes equal to the desired set, and owns the routes
/// through local workloads' interfaces.
///
/// Each [`apply`](RouteManager::apply) reads the kernel's routes (so drift — routes deleted
/// or changed behind margay's back — is repaired on the next apply), plans the difference
/// (`plan_routes`, pure) and carries it out: adds or replaces what differs, then deletes
/// the protocol-80 routes nobody wants and the other protocols' routes to a local workload
/// through its interface once margay's own route to that workload is in place. The netlink
/// socket is opened in the calling thread's network namespace.
#[derive(Debug, Default)]
pub struct RouteManager {
    ipv6: bool,
    warned_conflicts: BTreeSet<RouteKey>,
    warned_missing: BTreeSet<String>,
}

impl RouteManager {
    /// `ipv6`: also manage IPv6 routes (and read the IPv6 table).
    pub fn new(ipv6: bool) -> RouteManager {
        RouteManager {
            ipv6,
            ..RouteManager::default()
        }
    }

    /// Makes the main table's protocol-80 routes exactly `desired` (IPv6 ones are ignored
    /// unless the manager handles IPv6), and removes other protocols' routes through the
    /// interfaces of `workloads` (host-side interface, addresses) to their addresses.
    pub fn apply(
        &mut self,
        desired: &[KernelRoute],
        workloads: &[(String, Vec<Cidr>)],
    ) -> Result<RouteReport, RouteError> {
        let started = Instant::now();
        let mut nl = Netlink::open().map_err(nl_err("opening a netlink socket"))?;
        let links = nl.links().map_err(nl_err("listing links"))?;
        let index_of: HashMap<&str, u32> =
            links.iter().map(|l| (l.name.as_str(), l.index)).collect();

        let mut kernel = nl
            .route_messages(AddressFamily::Inet)
            .map_err(nl_err("listing IPv4 routes"))?;
        if self.ipv6 {
            kernel.extend(
                nl.route_messages(AddressFamily::Inet6)
                    .map_err(nl_err("listing IPv6 routes"))?,
            );
        }
        let observed: Vec<Observed> = kernel.iter().filter_map(parse_route).collect();
        let plan = plan_routes(desired, &observed, &index_of, workloads, self.ipv6);

        let mut report = RouteReport {
            unchanged: plan.unchanged.len(),
            missing_interfaces: plan.missing_interfaces.clone(),
            waiting: plan.waiting,
            ..RouteReport::default()
        };
        let mut conflicts = BTreeSet::new();
        for want in &plan.conflicts {
            let key = want.key();
            conflicts.insert(key);
            if !self.warned_conflicts.contains(&key) {
                tracing::warn!(
                    route = %want,
                    "a route margay does not own (another protocol) has the same destination and metric; leaving it alone and not installing margay's"
                );
            }
        }

        // Destinations whose desired route is in the kernel: taken-over routes to them may go.
        let mut in_place: BTreeSet<Cidr> = plan.unchanged.iter().map(|k| k.dst).collect();
        let mut written: BTreeSet<RouteKey> = BTreeSet::new();
        for w in &plan.writes {
            match nl.request(
                NLM_F_CREATE | NLM_F_REPLACE,
                RouteNetlinkMessage::NewRoute(route_message(&w.route, w.oif)),
            ) {
                Ok(()) => {
                    written.insert(w.route.key());
                    in_place.insert(w.route.dst);
                    if w.replacing {
                        report.replaced += 1;
                        tracing::debug!(route = %w.route, "replaced route");
                    } else {
                        report.added += 1;
                        tracing::debug!(route = %w.route, "added route");
                    }
                }
                Err(e) if e.raw_os_error() == Some(netlink::ENODEV) => {
                    // The interface went away since we listed the links.
                    if let Some(name) = w.route.ifname() {
                        report.missing_interfaces.insert(name.to_string());
                    }
                    report.waiting += 1;
                }
                Err(e) => {
                    report.errors += 1;
                    report.failures.push(RouteFailure {
                        route: w.route.to_string(),
                        operation: if w.replacing { "replace" } else { "add" },
                        error: e.to_string(),
                    });
                }
            }
        }

        for r in &plan.removals {
            if !removal_due(r.kind, &written, &in_place) {
                if matches!(r.kind, RemovalKind::TakenOver(_)) {
                    tracing::debug!(route = %r.route.key, protocol = r.route.protocol, "keeping a workload route of another protocol: margay's is not in place yet");
                }
                continue;
            }
            match nl.request(0, RouteNetlinkMessage::DelRoute(delete_message(&r.route))) {
                Ok(()) => {
                    if matches!(r.kind, RemovalKind::TakenOver(_)) {
                        report.taken_over += 1;
                        tracing::debug!(route = %r.route.key, protocol = r.route.protocol, "removed another protocol's route through a workload interface (margay's is in place)");
                    } else {
                        report.removed += 1;
                        tracing::debug!(route = %r.route.key, "removed route");
                    }
                }
                // Gone already: its interface was deleted meanwhile, or it was the
                // taken-over route a write replaced in place.
                Err(e) if e.raw_os_error() == Some(netlink::ESRCH) => {}
                Err(e) => {
                    report.errors += 1;
                    report.failures.push(RouteFailure {
                        route: r.route.key.to_string(),
                        operation: "delete",
                        error: e.to_string(),
                    });
                }
            }
        }

        for f in &report.failures {
            tracing::warn!(route = %f.route, operation = f.operation, error = %f.error, "the kernel refused a route change; retrying on the next apply");
        }
        let newly_missing: Vec<&String> = report
            .missing_interfaces
            .iter()
            .filter(|n| !self.warned_missing.contains(*n))
            .collect();
        if !newly_missing.is_empty() {
            tracing::info!(interfaces = ?newly_missing, "routes wait for interfaces that do not exist yet");
        }
        self.warned_missing = report.missing_interfaces.clone();
        self.warned_conflicts = conflicts.clone();
        report.conflicts = conflicts.into_iter().collect();
        report.duration = started.elapsed();
        if report.changed() || report.errors > 0 {
            tracing::info!(
                added = report.added,
                replaced = report.replaced,
                removed = report.removed,
                taken_over = report.taken_over,
                unchanged = report.unchanged,
                errors = report.errors,
                waiting = report.waiting,
                took = ?report.duration,
                "routes applied"
            );
        }
        Ok(report)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn pool(cidr: &str, vxlan: EncapMode, ipip: EncapMode) -> PoolData {
        PoolData {
            cidr: c(cidr),
            masquerade: false,
            ipip,
            vxlan,
            disabled: false,
        }
    }

    fn route(dst: &str, types: u8, pool_type: PoolType, node: &str, node_ip: &str) -> Route {
        Route {
            dst: c(dst),
            types,
            pool_type,
            dst_node_name: node.into(),
            dst_node_ip: if node_ip.is_empty() {
                None
            } else {
                Some(ip(node_ip))
            },
            same_subnet: false,
            nat_outgoing: false,
            local_workload: false,
        }
    }

    fn vtep(node: &str, tunnel: &str, parent: &str) -> Vtep {
        Vtep {
            node: node.into(),
            mac: margay_calc::vxlan_mac_for_node(node),
            ipv4_addr: Some(ip(tunnel)),
            parent_device_ip: Some(ip(parent)),
            mac_v6: String::new(),
            ipv6_addr: None,
            parent_device_ipv6: None,
        }
    }

    fn gw(dst: &str, dev: &str, via: &str) -> KernelRoute {
        KernelRoute {
            dst: c(dst),
            target: RouteTarget::Gateway {
                ifname: dev.into(),
                gateway: ip(via),
                onlink: true,
            },
            priority: 0,
            src: None,
        }
    }

    fn dev(dst: &str, dev: &str, priority: u32) -> KernelRoute {
        KernelRoute {
            dst: c(dst),
            target: RouteTarget::Interface { ifname: dev.into() },
            priority,
            src: None,
        }
    }

    use route_type::{LOCAL_WORKLOAD, REMOTE_HOST, REMOTE_TUNNEL, REMOTE_WORKLOAD};

    #[test]
    fn calicos_rules() {
        let pools = vec![
            pool("10.65.0.0/16", EncapMode::Always, EncapMode::Never),
            pool("10.66.0.0/16", EncapMode::CrossSubnet, EncapMode::Never),
            pool("10.67.0.0/16", EncapMode::Never, EncapMode::Never),
            pool("10.68.0.0/16", EncapMode::Never, EncapMode::Always),
        ];
        let mut same_subnet_always = route(
            "10.65.3.0/26",
            REMOTE_WORKLOAD,
            PoolType::Vxlan,
            "b",
            "192.168.1.2",
        );
        same_subnet_always.same_subnet = true;
        let mut cross_same = route(
            "10.66.1.0/26",
            REMOTE_WORKLOAD,
            PoolType::Vxlan,
            "b",
            "192.168.1.2",
        );
        cross_same.same_subnet = true;
        let mut local_wep = route(
            "10.65.0.5/32",
            LOCAL_WORKLOAD,
            PoolType::Vxlan,
            "a",
            "192.168.1.1",
        );
        local_wep.local_workload = true;
        let routes = vec![
            // Remote block in an Always VXLAN pool, even on the same subnet: via the VTEP.
            route(
                "10.65.1.0/26",
                REMOTE_WORKLOAD,
                PoolType::Vxlan,
                "b",
                "192.168.1.2",
            ),
            same_subnet_always,
            // The remote VTEP's own address: directly over the tunnel.
            route(
                "10.65.1.1/32",
                REMOTE_TUNNEL | REMOTE_WORKLOAD,
                PoolType::Vxlan,
                "b",
                "192.168.1.2",
            ),
            // CrossSubnet: via the VTEP across subnets, direct within one.
            route(
                "10.66.2.0/26",
                REMOTE_WORKLOAD,
                PoolType::Vxlan,
                "c",
                "192.168.2.3",
            ),
            cross_same,
            // No encapsulation: via the node.
            route(
                "10.67.1.0/26",
                REMOTE_WORKLOAD,
                PoolType::NoEncap,
                "b",
                "192.168.1.2",
            ),
            // IPIP: unsupported.
            route(
                "10.68.1.0/26",
                REMOTE_WORKLOAD,
                PoolType::Ipip,
                "b",
                "192.168.1.2",
            ),
            // Local block: blackhole; local workload: from the endpoint.
            route(
                "10.65.0.0/26",
                LOCAL_WORKLOAD,
                PoolType::Vxlan,
                "a",
                "192.168.1.1",
            ),
            local_wep,
            // Next hop unknown: skipped.
            route(
                "10.65.9.0/26",
                REMOTE_WORKLOAD,
                PoolType::Vxlan,
                "novtep",
                "192.168.1.9",
            ),
            route(
                "10.67.9.0/26",
                REMOTE_WORKLOAD,
                PoolType::NoEncap,
                "noaddr",
                "",
            ),
            // Hosts and routes outside pools: not margay's.
            route(
                "192.168.1.2/32",
                REMOTE_HOST,
                PoolType::None,
                "b",
                "192.168.1.2",
            ),
            route(
                "172.20.0.0/26",
                REMOTE_WORKLOAD,
                PoolType::None,
                "b",
                "192.168.1.2",
            ),
        ];
        let vteps = vec![
            vtep("a", "10.65.0.1", "192.168.1.1"),
            vtep("b", "10.65.1.1", "192.168.1.2"),
            vtep("c", "10.66.2.1", "192.168.2.3"),
        ];
        let endpoints = vec![("cali12345".to_string(), vec![c("10.65.0.5/32")])];
        let mut ctx = RouteContext::new("a", &pools);
        ctx.parent_device = Some("eth0");
        // By default a no-encap pool's remote blocks are BIRD's: nothing of margay's.
        let bird = desired_routes(&routes, &endpoints, &vteps, &ctx);
        assert!(
            !bird
                .routes
                .iter()
                .any(|r| r.dst == c("10.67.1.0/26") || r.dst == c("10.67.9.0/26")),
            "{:#?}",
            bird.routes
        );
        assert!(!bird.skipped.iter().any(|(d, _)| *d == c("10.67.9.0/26")));
        // The local no-encap block is still blackholed (addresses no workload holds).
        ctx.program_noencap = true;
        let got = desired_routes(&routes, &endpoints, &vteps, &ctx);
        assert_eq!(
            bird.routes.len() + 1,
            got.routes.len(),
            "only the no-encap remote block differs"
        );
        let mut want = vec![
            dev("10.65.0.5/32", "cali12345", 1024),
            gw("10.65.1.0/26", "vxlan.calico", "10.65.1.1"),
            gw("10.65.3.0/26", "vxlan.calico", "10.65.1.1"),
            dev("10.65.1.1/32", "vxlan.calico", 0),
            gw("10.66.2.0/26", "vxlan.calico", "10.66.2.1"),
            gw("10.66.1.0/26", "eth0", "192.168.1.2"),
            gw("10.67.1.0/26", "eth0", "192.168.1.2"),
            KernelRoute {
                dst: c("10.65.0.0/26"),
                target: RouteTarget::Blackhole,
                priority: 0,
                src: None,
            },
        ];
        want.sort_by_key(KernelRoute::key);
        assert_eq!(got.routes, want, "{:#?}", got.routes);
        assert_eq!(
            got.skipped,
            vec![
                (c("10.68.1.0/26"), SkipReason::IpipUnsupported),
                (
                    c("10.65.9.0/26"),
                    SkipReason::NoVtep {
                        node: "novtep".into()
                    }
                ),
                (
                    c("10.67.9.0/26"),
                    SkipReason::NoNodeAddress {
                        node: "noaddr".into()
                    }
                ),
            ]
        );

        // Without a parent device, the direct routes wait.
        let mut ctx = RouteContext::new("a", &pools);
        ctx.program_noencap = true;
        let got = desired_routes(&routes, &endpoints, &vteps, &ctx);
        assert!(
            got.skipped
                .contains(&(c("10.67.1.0/26"), SkipReason::NoParentDevice))
        );
        assert!(!got.routes.iter().any(|r| r.dst == c("10.67.1.0/26")));
    }

    #[test]
    fn ipv6_routes_use_the_v6_device_and_addresses() {
        let pools = vec![pool("fd00:65::/48", EncapMode::Always, EncapMode::Never)];
        let routes = vec![route(
            "fd00:65:0:1::/122",
            REMOTE_WORKLOAD,
            PoolType::Vxlan,
            "b",
            "fd00:1::2",
        )];
        let mut v = vtep("b", "10.65.1.1", "192.168.1.2");
        v.ipv6_addr = Some(ip("fd00:65:0:1::"));
        v.parent_device_ipv6 = Some(ip("fd00:1::2"));
        v.mac_v6 = "66:00:00:00:00:02".into();
        let endpoints = vec![("cali1".to_string(), vec![c("fd00:65::5/128")])];
        let ctx = RouteContext::new("a", &pools);
        let got = desired_routes(&routes, &endpoints, &[v], &ctx);
        assert_eq!(
            got.routes,
            vec![
                dev("fd00:65::5/128", "cali1", 1024),
                gw("fd00:65:0:1::/122", "vxlan-v6.calico", "fd00:65:0:1::"),
            ]
        );
        // IPv6 metric 0 is filed by the kernel as 1024.
        assert_eq!(got.routes[1].key().priority, 1024);
    }

    #[test]
    fn device_route_source_address_goes_on_routes_through_interfaces() {
        let pools = vec![pool("10.65.0.0/16", EncapMode::Always, EncapMode::Never)];
        let routes = vec![
            route(
                "10.65.1.0/26",
                REMOTE_WORKLOAD,
                PoolType::Vxlan,
                "b",
                "192.168.1.2",
            ),
            route(
                "10.65.0.0/26",
                LOCAL_WORKLOAD,
                PoolType::Vxlan,
                "a",
                "192.168.1.1",
            ),
        ];
        let endpoints = vec![
            ("cali1".to_string(), vec![c("10.65.0.5/32")]),
            ("cali2".to_string(), vec![c("fd00:65::5/128")]),
        ];
        let mut ctx = RouteContext::new("a", &pools);
        ctx.source_v4 = Some(ip("192.168.1.1"));
        ctx.source_v6 = Some(ip("fd00:1::1"));
        let got = desired_routes(
            &routes,
            &endpoints,
            &[vtep("b", "10.65.1.1", "192.168.1.2")],
            &ctx,
        );
        let src = |dst: &str| got.routes.iter().find(|r| r.dst == c(dst)).unwrap().src;
        assert_eq!(src("10.65.0.5/32"), Some(ip("192.168.1.1")));
        assert_eq!(src("fd00:65::5/128"), Some(ip("fd00:1::1")));
        assert_eq!(src("10.65.1.0/26"), Some(ip("192.168.1.1")));
        assert_eq!(src("10.65.0.0/26"), None, "a blackhole has no source");
        // Unset: no hint at all (the kernel chooses).
        let plain = desired_routes(&[], &endpoints, &[], &RouteContext::new("a", &[]));
        assert!(plain.routes.iter().all(|r| r.src.is_none()));
    }

    #[test]
    fn duplicates_keep_the_first_and_are_reported() {
        let endpoints = vec![
            ("cali1".to_string(), vec![c("10.65.0.5/32")]),
            (
                "cali2".to_string(),
                vec![c("10.65.0.5/32"), c("10.65.0.6/32")],
            ),
            (String::new(), vec![c("10.65.0.7/32")]),
        ];
        let got = desired_routes(&[], &endpoints, &[], &RouteContext::new("a", &[]));
        assert_eq!(
            got.routes,
            vec![
                dev("10.65.0.5/32", "cali1", 1024),
                dev("10.65.0.6/32", "cali2", 1024)
            ]
        );
        assert_eq!(
            got.skipped,
            vec![(c("10.65.0.5/32"), SkipReason::Duplicate)]
        );
    }

    #[test]
    fn state_follows_messages() {
        use std::sync::Arc;
        let mut st = RoutingState::new("a");
        let r = route(
            "10.65.1.0/26",
            REMOTE_WORKLOAD,
            PoolType::Vxlan,
            "b",
            "192.168.1.2",
        );
        assert!(st.on_message(&Message::RouteUpdate(r.clone())));
        assert!(st.on_message(&Message::VtepUpdate(vtep("b", "10.65.1.1", "192.168.1.2"))));
        assert!(st.on_message(&Message::VtepUpdate(vtep("a", "10.65.0.1", "192.168.1.1"))));
        let id = WorkloadEndpointId {
            orchestrator: "k8s".into(),
            workload: "ns/pod".into(),
            endpoint: "eth0".into(),
        };
        let ep = margay_calc::WorkloadEndpointData {
            interface: "cali1".into(),
            mac: String::new(),
            ipv4_nets: vec![c("10.65.0.5/32")],
            ipv6_nets: vec![],
            profile_ids: vec![],
            tiers: vec![],
            name: "pod".into(),
            namespace: "ns".into(),
            allow_spoofed_source_prefixes: vec![],
        };
        assert!(st.on_message(&Message::WorkloadEndpointUpdate {
            id: id.clone(),
            endpoint: Arc::new(ep),
        }));
        assert!(!st.on_message(&Message::IpSetRemove { id: "x".into() }));
        assert!(st.on_message(&Message::Encapsulation {
            ipip: false,
            vxlan: true,
            vxlan_v6: false
        }));
        assert!(!st.in_sync());
        st.on_message(&Message::InSync);
        assert!(st.in_sync() && st.vxlan_enabled());
        assert_eq!(st.my_ipv4(), Some(ip("192.168.1.1")));
        let d = st.desired_routes(&RouteContext::new("ignored", &[]));
        assert_eq!(
            d.routes,
            vec![
                dev("10.65.0.5/32", "cali1", 1024),
                gw("10.65.1.0/26", "vxlan.calico", "10.65.1.1"),
            ]
        );
        st.on_message(&Message::WorkloadEndpointRemove { id });
        st.on_message(&Message::RouteRemove { dst: r.dst });
        assert!(
            st.desired_routes(&RouteContext::new("a", &[]))
                .routes
                .is_empty()
        );
    }

    #[test]
    fn messages_carry_protocol_80_and_the_right_shape() {
        let m = route_message(&gw("10.65.1.0/26", "vxlan.calico", "10.65.1.1"), Some(7));
        assert_eq!(u8::from(m.header.protocol), 80);
        assert_eq!(m.header.table, RouteHeader::RT_TABLE_MAIN);
        assert!(m.header.flags.contains(RouteFlags::Onlink));
        assert_eq!(m.header.scope, RouteScope::Universe);
        assert!(m.attributes.contains(&RouteAttribute::Oif(7)));
        let m = route_message(&dev("10.65.0.5/32", "cali1", 1024), Some(3));
        assert_eq!(m.header.scope, RouteScope::Link);
        assert!(m.attributes.contains(&RouteAttribute::Priority(1024)));
        let o = parse_route(&m).unwrap();
        assert!(same(&dev("10.65.0.5/32", "cali1", 1024), Some(3), &o));
        assert!(!same(&dev("10.65.0.5/32", "cali1", 1024), Some(4), &o));
        // DeviceRouteSourceAddress: the source hint goes into the message and is compared.
        let mut with_src = dev("10.65.0.5/32", "cali1", 1024);
        with_src.src = Some(ip("192.0.2.1"));
        assert!(
            !same(&with_src, Some(3), &o),
            "a route without the hint is not the wanted one"
        );
        let o2 = parse_route(&route_message(&with_src, Some(3))).unwrap();
        assert_eq!(o2.src, Some(ip("192.0.2.1")));
        assert!(same(&with_src, Some(3), &o2));
        assert!(
            with_src.to_string().contains(" src 192.0.2.1 "),
            "{with_src}"
        );
        let d = delete_message(&o);
        assert_eq!(u8::from(d.header.protocol), 80);
    }

    fn obs(dst: &str, priority: u32, protocol: u8, oif: u32) -> Observed {
        Observed {
            key: RouteKey {
                dst: c(dst),
                priority,
            },
            tos: 0,
            protocol,
            kind: RouteType::Unicast,
            scope: RouteScope::Link,
            oif: Some(oif),
            gateway: None,
            onlink: false,
            src: None,
        }
    }

    const BOOT: u8 = 3;

    #[test]
    fn the_plan_takes_over_workload_routes_and_nothing_else() {
        let index_of: HashMap<&str, u32> =
            [("eth0", 2), ("cali1", 3), ("cali2", 4), ("caliother", 5)]
                .into_iter()
                .collect();
        let workloads = vec![
            (
                "cali1".to_string(),
                vec![c("10.65.0.5/32"), c("fd00:65::5/128")],
            ),
            (
                "cali2".to_string(),
                vec![c("10.65.0.6/32"), c("10.65.0.8/32")],
            ),
        ];
        let desired = vec![
            dev("10.65.0.5/32", "cali1", 1024),
            dev("10.65.0.6/32", "cali2", 1024),
            dev("10.65.0.8/32", "cali2", 1024),
            dev("fd00:65::5/128", "cali1", 1024),
        ];
        let cni_v4 = obs("10.65.0.5/32", 0, BOOT, 3);
        let cni_v4_b = obs("10.65.0.6/32", 0, BOOT, 4);
        let cni_blocked = obs("10.65.0.8/32", 0, BOOT, 4);
        // IPv6 stores the CNI plugin's metric 0 as 1024: margay's key.
        let cni_v6 = obs("fd00:65::5/128", 1024, BOOT, 3);
        let stale_mine = obs("10.65.0.5/32", 512, ROUTE_PROTOCOL, 3);
        let kernel = vec![
            cni_v4.clone(),
            // Same destination through an interface that is no local workload's, even
            // though its name looks like one: someone else's.
            obs("10.65.0.5/32", 7, BOOT, 5),
            obs("10.65.0.5/32", 9, BOOT, 2),
            // BIRD's and protocol 0 are never taken over, even through a workload interface.
            obs("10.65.0.5/32", 33, BIRD_PROTOCOL, 3),
            obs("10.65.0.5/32", 44, 0, 3),
            // Through a workload interface, but not to that workload's address.
            obs("10.65.9.9/32", 0, BOOT, 3),
            obs("10.65.0.6/32", 5, BOOT, 3),
            obs("10.65.0.6/32", 1024, ROUTE_PROTOCOL, 4),
            cni_v4_b.clone(),
            // Someone else holds margay's key for 10.65.0.8 elsewhere: a conflict, and the
            // CNI plugin's route to it must stay (margay's cannot go in).
            obs("10.65.0.8/32", 1024, BOOT, 2),
            cni_blocked.clone(),
            cni_v6.clone(),
            stale_mine.clone(),
        ];
        let plan = plan_routes(&desired, &kernel, &index_of, &workloads, true);
        let key = |d: &str, p: u32| RouteKey {
            dst: c(d),
            priority: p,
        };
        assert_eq!(
            plan.unchanged,
            [key("10.65.0.6/32", 1024)].into_iter().collect()
        );
        assert_eq!(
            plan.writes,
            vec![
                RouteWrite {
                    route: dev("10.65.0.5/32", "cali1", 1024),
                    oif: Some(3),
                    replacing: false,
                },
                RouteWrite {
                    route: dev("fd00:65::5/128", "cali1", 1024),
                    oif: Some(3),
                    replacing: true,
                },
            ]
        );
        assert_eq!(plan.conflicts, vec![dev("10.65.0.8/32", "cali2", 1024)]);
        assert_eq!(
            plan.removals,
            vec![
                Removal {
                    route: stale_mine,
                    kind: RemovalKind::Unwanted
                },
                Removal {
                    route: cni_v4,
                    kind: RemovalKind::TakenOver(c("10.65.0.5/32"))
                },
                Removal {
                    route: cni_v4_b,
                    kind: RemovalKind::TakenOver(c("10.65.0.6/32"))
                },
                Removal {
                    route: cni_blocked,
                    kind: RemovalKind::TakenOver(c("10.65.0.8/32"))
                },
                Removal {
                    route: cni_v6.clone(),
                    kind: RemovalKind::TakenOver(c("fd00:65::5/128"))
                },
            ]
        );
        assert!(plan.missing_interfaces.is_empty() && plan.waiting == 0);
        // The delete carries the taken-over route's own protocol, so the kernel cannot match
        // margay's route (or BIRD's) to the same destination with it.
        let del = delete_message(&plan.removals[1].route);
        assert_eq!(u8::from(del.header.protocol), BOOT);

        // Add first, then delete: a taken-over route goes only once margay's route to its
        // destination is in (unchanged, or written by this apply).
        let in_place: BTreeSet<Cidr> = [c("10.65.0.6/32"), c("10.65.0.5/32")].into_iter().collect();
        let written: BTreeSet<RouteKey> = [key("10.65.0.5/32", 1024)].into_iter().collect();
        let due: Vec<bool> = plan
            .removals
            .iter()
            .map(|r| removal_due(r.kind, &written, &in_place))
            .collect();
        // The IPv6 write failed: its taken-over route stays too.
        assert_eq!(due, [true, true, true, false, false]);
        let replaced = key("10.65.0.7/32", 0);
        assert!(!removal_due(
            RemovalKind::ReplacedBy(replaced),
            &[replaced].into_iter().collect(),
            &in_place
        ));
        assert!(removal_due(
            RemovalKind::ReplacedBy(replaced),
            &BTreeSet::new(),
            &in_place
        ));

        // Without IPv6, IPv6 routes are neither written nor taken over.
        let plan = plan_routes(&desired, &kernel, &index_of, &workloads, false);
        assert_eq!(plan.writes.len(), 1);
        assert!(!plan.removals.iter().any(|r| r.route == cni_v6));

        // Not a local workload (no endpoint for it): its interface is no one's to take over.
        let plan = plan_routes(&desired, &kernel, &index_of, &workloads[1..], true);
        assert!(
            !plan
                .removals
                .iter()
                .any(|r| r.route.oif == Some(3) && r.kind != RemovalKind::Unwanted),
            "{:#?}",
            plan.removals
        );
        assert!(
            plan.writes
                .iter()
                .any(|w| w.route.dst == c("10.65.0.5/32") && !w.replacing)
        );
        // fd00:65::5 now has a foreign route with margay's key: a conflict, as before.
        assert!(
            plan.conflicts
                .contains(&dev("fd00:65::5/128", "cali1", 1024))
        );
    }

    #[test]
    fn display_reads_like_ip_route() {
        assert_eq!(
            gw("10.65.1.0/26", "vxlan.calico", "10.65.1.1").to_string(),
            "10.65.1.0/26 via 10.65.1.1 dev vxlan.calico onlink proto 80 metric 0"
        );
        assert_eq!(
            dev("10.65.0.5/32", "cali1", 1024).to_string(),
            "10.65.0.5/32 dev cali1 scope link proto 80 metric 1024"
        );
    }
}
