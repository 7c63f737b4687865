//! Routes and neighbours.
//!
//! Two levels: [`Route`] is a main-table unicast route as the CNI plugin writes and checks
//! them; [`Netlink::route_messages`] and [`Netlink::neighbours`] return the kernel's messages
//! whole, for the dataplane's route and VXLAN managers, which read protocols, tables and
//! flags and build their own requests (sent with [`Netlink::request`]).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use rtnetlink::packet_route::neighbour::NeighbourMessage;
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::{EAFNOSUPPORT, Netlink, family, is_not_found};

/// A unicast route of the main table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: IpAddr,
    pub prefix: u8,
    pub oif: Option<u32>,
    pub gateway: Option<IpAddr>,
    pub link_scope: bool,
}

impl Route {
    /// A route to `dst/prefix` through `oif`, scope link when there is no gateway.
    pub fn new(dst: IpAddr, prefix: u8, oif: u32, gateway: Option<IpAddr>) -> Route {
        Route {
            dst,
            prefix,
            oif: Some(oif),
            gateway,
            link_scope: gateway.is_none(),
        }
    }

    /// The request that adds this route (protocol `boot`, as `ip route add` writes).
    fn message(&self) -> RouteMessage {
        let mut m = RouteMessage::default();
        m.header.address_family = family(&self.dst);
        m.header.destination_prefix_length = self.prefix;
        m.header.table = RouteHeader::RT_TABLE_MAIN;
        m.header.protocol = RouteProtocol::Boot;
        m.header.scope = if self.link_scope {
            RouteScope::Link
        } else {
            RouteScope::Universe
        };
        m.header.kind = RouteType::Unicast;
        if self.prefix > 0 {
            m.attributes
                .push(RouteAttribute::Destination(RouteAddress::from(self.dst)));
        }
        if let Some(gw) = self.gateway {
            m.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
        }
        if let Some(oif) = self.oif {
            m.attributes.push(RouteAttribute::Oif(oif));
        }
        m
    }
}

/// An IP address of a route attribute.
pub fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// The table a route is in (RTA_TABLE, else the header's 8 bits).
pub fn route_table(r: &RouteMessage) -> u32 {
    r.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(r.header.table))
}

fn parse_main_route(r: &RouteMessage) -> Option<Route> {
    if route_table(r) != u32::from(RouteHeader::RT_TABLE_MAIN)
        || r.header.kind != RouteType::Unicast
    {
        return None;
    }
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    for a in &r.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = route_ip(d),
            RouteAttribute::Gateway(g) => gateway = route_ip(g),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    let dst = dst.unwrap_or(if r.header.address_family == AddressFamily::Inet6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    });
    Some(Route {
        dst,
        prefix: r.header.destination_prefix_length,
        oif,
        gateway,
        link_scope: r.header.scope == RouteScope::Link,
    })
}

impl Netlink {
    /// Every route of one family, in every table; none when the kernel (or namespace) has
    /// no such family.
    pub fn route_messages(&mut self, family: AddressFamily) -> io::Result<Vec<RouteMessage>> {
        let mut req = RouteMessage::default();
        req.header.address_family = family;
        let msgs = match self.dump(RouteNetlinkMessage::GetRoute(req)) {
            Ok(m) => m,
            Err(e) if e.raw_os_error() == Some(EAFNOSUPPORT) => Vec::new(),
            Err(e) => return Err(e),
        };
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => Some(r),
                _ => None,
            })
            .collect())
    }

    /// The main table's unicast routes of one family.
    pub fn main_routes(&mut self, v6: bool) -> io::Result<Vec<Route>> {
        let family = if v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        Ok(self
            .route_messages(family)?
            .iter()
            .filter_map(parse_main_route)
            .collect())
    }

    /// Adds a route; fails with EEXIST if one to the same destination exists.
    pub fn add_route(&mut self, r: &Route) -> io::Result<()> {
        self.request(
            NLM_F_CREATE | NLM_F_EXCL,
            RouteNetlinkMessage::NewRoute(r.message()),
        )
    }

    /// Deletes a route; false if there was none.
    pub fn delete_route(&mut self, r: &Route) -> io::Result<bool> {
        let mut m = r.message();
        m.header.protocol = RouteProtocol::Unspec;
        m.header.scope = RouteScope::NoWhere;
        match self.request(0, RouteNetlinkMessage::DelRoute(m)) {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every neighbour entry of one family (`Inet`/`Inet6`: ARP/NDP; `Bridge`: FDB).
    pub fn neighbours(&mut self, family: AddressFamily) -> io::Result<Vec<NeighbourMessage>> {
        let mut req = NeighbourMessage::default();
        req.header.family = family;
        let msgs = self.dump(RouteNetlinkMessage::GetNeighbour(req))?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewNeighbour(n) => Some(n),
                _ => None,
            })
            .collect())
    }
}
