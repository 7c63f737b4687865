//! Synchronous rtnetlink requests for the CNI dataplane: links, addresses, routes.
//!
//! Messages are rtnetlink 0.24's packet types (`rtnetlink::packet_route`), sent on a blocking
//! `NETLINK_ROUTE` socket with a receive timeout, one request at a time. A socket belongs to
//! the network namespace of the thread that opened it, so a socket opened by a thread that
//! entered the container's namespace keeps working there from any thread (see `netns`). No
//! async runtime is involved: a CNI call makes a dozen small requests, each well under a
//! millisecond.

use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::RawFd;
use std::time::Duration;

use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use rtnetlink::packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressScope,
};
use rtnetlink::packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::{Socket, SocketAddr as NetlinkAddr};

/// How long the kernel may take to answer one request.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Upper bound on datagrams read for one request.
const MAX_DATAGRAMS: usize = 100_000;

/// A link as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: Vec<u8>,
    pub up: bool,
    pub mtu: u32,
    /// `veth`, `bridge`, ... (None for links without IFLA_LINKINFO, e.g. `lo`).
    pub kind: Option<String>,
}

/// An address of a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addr {
    pub index: u32,
    pub ip: IpAddr,
    pub prefix: u8,
    pub link_scope: bool,
    pub tentative: bool,
}

/// A route of the main table.
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
}

/// A netlink socket in the namespace of the thread that opened it.
pub struct Netlink {
    sock: Socket,
    seq: u32,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netlink").field("seq", &self.seq).finish()
    }
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("netlink: {e}"))
}

/// The kernel said ENODEV / ENOENT / ESRCH: the object does not exist.
pub fn is_not_found(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(19 | 2 | 3))
}

/// The kernel said EEXIST.
pub fn is_exists(e: &io::Error) -> bool {
    e.raw_os_error() == Some(17)
}

fn family(ip: &IpAddr) -> AddressFamily {
    if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

impl Netlink {
    /// Opens a socket in the current thread's network namespace.
    pub fn open() -> io::Result<Netlink> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&NetlinkAddr::new(0, 0))?;
        let timeout =
            nix::sys::time::TimeVal::new(i64::try_from(REPLY_TIMEOUT.as_secs()).unwrap_or(10), 0);
        nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(io::Error::from)?;
        Ok(Netlink { sock, seq: 0 })
    }

    /// Sends one request and collects the answers until the ACK (or NLMSG_DONE for dumps).
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut m = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        m.finalize();
        let mut buf = vec![0u8; m.buffer_len()];
        m.serialize(&mut buf);
        self.sock.send(&buf, 0)?;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut out = Vec::new();
        for _ in 0..MAX_DATAGRAMS {
            let data = match self.sock.recv_from_full() {
                Ok((data, _)) => data,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("netlink: no answer from the kernel within {REPLY_TIMEOUT:?}"),
                    ));
                }
                Err(e) => return Err(e),
            };
            let mut off = 0;
            while off < data.len() {
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..])
                    .map_err(invalid)?;
                let len = m.header.length as usize;
                if len == 0 {
                    return Err(invalid("zero-length message"));
                }
                off += len.next_multiple_of(4);
                if m.header.sequence_number != seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::Done(done) if done.code < 0 => {
                        return Err(io::Error::from_raw_os_error(-done.code));
                    }
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => match e.code {
                        Some(_) => return Err(e.to_io()),
                        None if !dump => return Ok(out),
                        None => {}
                    },
                    NetlinkPayload::InnerMessage(inner) => out.push(inner),
                    _ => {}
                }
            }
        }
        Err(invalid("the answer did not end"))
    }

    fn ack(&mut self, msg: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
        self.request(msg, NLM_F_ACK | flags).map(drop)
    }

    fn dump(&mut self, msg: RouteNetlinkMessage) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.request(msg, NLM_F_DUMP)
    }

    // ---- links -----------------------------------------------------------------------------

    /// The link called `name`, or None.
    pub fn link(&mut self, name: &str) -> io::Result<Option<Link>> {
        if name.len() > 15 {
            return Ok(None); // longer than IFNAMSIZ: cannot exist
        }
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.request(RouteNetlinkMessage::GetLink(m), NLM_F_ACK) {
            Ok(msgs) => Ok(msgs.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(to_link(&l)),
                _ => None,
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates the veth pair `name` (here) ↔ `peer` (in the namespace `peer_netns_fd`
    /// refers to), both with `mtu`, `name` with MAC `mac`. Atomic: both ends or neither.
    pub fn create_veth(
        &mut self,
        name: &str,
        peer: &str,
        peer_netns_fd: RawFd,
        mtu: u32,
        mac: &[u8],
    ) -> io::Result<()> {
        let mut peer_msg = LinkMessage::default();
        peer_msg.attributes = vec![
            LinkAttribute::IfName(peer.to_string()),
            LinkAttribute::Mtu(mtu),
            LinkAttribute::NetNsFd(peer_netns_fd),
        ];
        let mut m = LinkMessage::default();
        m.attributes = vec![
            LinkAttribute::IfName(name.to_string()),
            LinkAttribute::Mtu(mtu),
            LinkAttribute::Address(mac.to_vec()),
            LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::Veth),
                LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg))),
            ]),
        ];
        self.ack(RouteNetlinkMessage::NewLink(m), NLM_F_CREATE | NLM_F_EXCL)
    }

    /// Brings a link up.
    pub fn set_up(&mut self, index: u32) -> io::Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.header.flags = LinkFlags::Up;
        m.header.change_mask = LinkFlags::Up;
        self.ack(RouteNetlinkMessage::SetLink(m), 0)
    }

    /// Brings a link down.
    pub fn set_down(&mut self, index: u32) -> io::Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.header.change_mask = LinkFlags::Up;
        self.ack(RouteNetlinkMessage::SetLink(m), 0)
    }

    /// Sets a link's MAC address.
    pub fn set_mac(&mut self, index: u32, mac: &[u8]) -> io::Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes.push(LinkAttribute::Address(mac.to_vec()));
        self.ack(RouteNetlinkMessage::SetLink(m), 0)
    }

    /// Deletes the link called `name`; false if there was none.
    pub fn delete_link(&mut self, name: &str) -> io::Result<bool> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.ack(RouteNetlinkMessage::DelLink(m), 0) {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    // ---- addresses -------------------------------------------------------------------------

    /// Adds `ip/prefix` to a link (IPv6 without duplicate address detection).
    pub fn add_addr(&mut self, index: u32, ip: IpAddr, prefix: u8) -> io::Result<()> {
        let mut m = AddressMessage::default();
        m.header.family = family(&ip);
        m.header.prefix_len = prefix;
        m.header.index = index;
        m.header.scope = AddressScope::Universe;
        m.attributes.push(AddressAttribute::Local(ip));
        m.attributes.push(AddressAttribute::Address(ip));
        if ip.is_ipv6() {
            m.header.flags = AddressHeaderFlags::Nodad;
            m.attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        self.ack(
            RouteNetlinkMessage::NewAddress(m),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// The addresses of link `index`.
    pub fn addrs(&mut self, index: u32) -> io::Result<Vec<Addr>> {
        let msgs = self.dump(RouteNetlinkMessage::GetAddress(AddressMessage::default()))?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewAddress(a) = m else {
                continue;
            };
            if a.header.index != index {
                continue;
            }
            let local = a.attributes.iter().find_map(|at| match at {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let address = a.attributes.iter().find_map(|at| match at {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            });
            let flags = a.attributes.iter().find_map(|at| match at {
                AddressAttribute::Flags(f) => Some(*f),
                _ => None,
            });
            let tentative = flags.map_or(
                a.header.flags.contains(AddressHeaderFlags::Tentative),
                |f| f.contains(AddressFlags::Tentative),
            );
            if let Some(ip) = local.or(address) {
                out.push(Addr {
                    index,
                    ip,
                    prefix: a.header.prefix_len,
                    link_scope: a.header.scope == AddressScope::Link,
                    tentative,
                });
            }
        }
        Ok(out)
    }

    // ---- routes ----------------------------------------------------------------------------

    fn route_message(r: &Route) -> RouteMessage {
        let mut m = RouteMessage::default();
        m.header.address_family = family(&r.dst);
        m.header.destination_prefix_length = r.prefix;
        m.header.table = RouteHeader::RT_TABLE_MAIN;
        m.header.protocol = RouteProtocol::Boot;
        m.header.scope = if r.link_scope {
            RouteScope::Link
        } else {
            RouteScope::Universe
        };
        m.header.kind = RouteType::Unicast;
        if r.prefix > 0 {
            m.attributes
                .push(RouteAttribute::Destination(RouteAddress::from(r.dst)));
        }
        if let Some(gw) = r.gateway {
            m.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
        }
        if let Some(oif) = r.oif {
            m.attributes.push(RouteAttribute::Oif(oif));
        }
        m
    }

    /// Adds a route; fails with EEXIST if one to the same destination exists.
    pub fn add_route(&mut self, r: &Route) -> io::Result<()> {
        self.ack(
            RouteNetlinkMessage::NewRoute(Self::route_message(r)),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// Deletes a route; false if there was none.
    pub fn delete_route(&mut self, r: &Route) -> io::Result<bool> {
        let mut m = Self::route_message(r);
        m.header.protocol = RouteProtocol::Unspec;
        m.header.scope = RouteScope::NoWhere;
        match self.ack(RouteNetlinkMessage::DelRoute(m), 0) {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The main table's unicast routes of one family.
    pub fn routes(&mut self, v6: bool) -> io::Result<Vec<Route>> {
        let mut req = RouteMessage::default();
        req.header.address_family = if v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        let msgs = self.dump(RouteNetlinkMessage::GetRoute(req))?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewRoute(r) = m else {
                continue;
            };
            let table = r
                .attributes
                .iter()
                .find_map(|a| match a {
                    RouteAttribute::Table(t) => Some(*t),
                    _ => None,
                })
                .unwrap_or(u32::from(r.header.table));
            if table != u32::from(RouteHeader::RT_TABLE_MAIN) || r.header.kind != RouteType::Unicast
            {
                continue;
            }
            let addr = |a: &RouteAddress| match a {
                RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
                RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
                _ => None,
            };
            let dst = r
                .attributes
                .iter()
                .find_map(|a| match a {
                    RouteAttribute::Destination(d) => addr(d),
                    _ => None,
                })
                .unwrap_or(if v6 {
                    IpAddr::V6(Ipv6Addr::UNSPECIFIED)
                } else {
                    IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
                });
            let gateway = r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Gateway(g) => addr(g),
                _ => None,
            });
            let oif = r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(i) => Some(*i),
                _ => None,
            });
            out.push(Route {
                dst,
                prefix: r.header.destination_prefix_length,
                oif,
                gateway,
                link_scope: r.header.scope == RouteScope::Link,
            });
        }
        Ok(out)
    }

    /// The name of the link with index `index`, if any.
    pub fn link_name(&mut self, index: u32) -> io::Result<Option<String>> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        match self.request(RouteNetlinkMessage::GetLink(m), NLM_F_ACK) {
            Ok(msgs) => Ok(msgs.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(to_link(&l).name),
                _ => None,
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn to_link(l: &LinkMessage) -> Link {
    let mut link = Link {
        index: l.header.index,
        name: String::new(),
        mac: Vec::new(),
        up: l.header.flags.contains(LinkFlags::Up),
        mtu: 0,
        kind: None,
    };
    for a in &l.attributes {
        match a {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Address(m) => link.mac = m.clone(),
            LinkAttribute::Mtu(m) => link.mtu = *m,
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let LinkInfo::Kind(k) = i {
                        link.kind = Some(k.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    link
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Reading the current namespace is harmless and needs no privilege.
    #[test]
    fn reads_loopback() {
        let mut nl = Netlink::open().unwrap();
        let lo = nl.link("lo").unwrap().unwrap();
        assert_eq!(lo.name, "lo");
        assert!(lo.index > 0);
        assert!(nl.link("mgy-no-such-link").unwrap().is_none());
        let addrs = nl.addrs(lo.index).unwrap();
        assert!(addrs.iter().any(|a| a.ip == IpAddr::from([127, 0, 0, 1])));
        assert_eq!(nl.link_name(lo.index).unwrap().as_deref(), Some("lo"));
        let _ = nl.routes(false).unwrap();
    }
}
