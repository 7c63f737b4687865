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

// Applying, in two steps: the pure plan against the kernel's table, and the manager that
// reads the table and carries the plan out.
mod manager;
mod plan;
pub use manager::*;
pub use plan::*;

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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
