//! Synchronous rtnetlink for the Linux dataplane.
//!
//! Same approach as `margay-node`'s netlink reader: the message types and socket that
//! rtnetlink 0.24 re-exports (`rtnetlink::packet_route`, `rtnetlink::packet_core`,
//! `rtnetlink::sys`), used without any tokio runtime. A [`Netlink`] is a `NETLINK_ROUTE`
//! socket opened in the **calling thread's** network namespace (a thread that `setns`-ed into
//! a test namespace gets a socket there), so open one per apply, on the thread that applies.
//!
//! Requests are acknowledged one at a time. The kernel handles an rtnetlink request inside the
//! `send` call, so the acknowledgement is already queued when `send` returns: waiting for it
//! costs one `recv`, which is what makes a thousand route changes take tens of milliseconds.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use margay_api::net::Cidr;
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::{
    InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use rtnetlink::packet_route::neighbour::NeighbourMessage;
use rtnetlink::packet_route::route::RouteMessage;
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::{Socket, SocketAddr as NetlinkAddr};

pub use rtnetlink::packet_core::{NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};

/// How long one request or dump may wait for the kernel's answer.
const TIMEOUT: Duration = Duration::from_secs(10);
/// A dump interrupted by a concurrent change (NLM_F_DUMP_INTR) is retried this many times.
const DUMP_ATTEMPTS: usize = 5;
/// Upper bound on datagrams read for one answer.
const MAX_DATAGRAMS: usize = 1_000_000;

/// A link as the dataplane needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// Administratively up (IFF_UP).
    pub up: bool,
    /// Operationally up (IFF_RUNNING: up, and a carrier; for a veth, its peer is up too).
    pub running: bool,
    pub mtu: u32,
    pub mac: Vec<u8>,
    pub kind: Option<InfoKind>,
    /// The VXLAN attributes, for a VXLAN link.
    pub vxlan: Vec<InfoVxlan>,
}

/// An address on an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addr {
    pub index: u32,
    pub cidr: Cidr,
}

/// A `NETLINK_ROUTE` socket in the calling thread's network namespace.
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

impl Netlink {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> io::Result<Netlink> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&NetlinkAddr::new(0, 0))?;
        sock.set_non_blocking(true)?;
        // Acknowledgements without a copy of the request: smaller, faster.
        sock.set_cap_ack(true)?;
        Ok(Netlink { sock, seq: 0 })
    }

    fn send(&mut self, flags: u16, msg: RouteNetlinkMessage) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        msg.finalize();
        let mut buf = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut buf);
        self.sock.send(&buf, 0)?;
        Ok(self.seq)
    }

    /// Reads answers to `seq` until `on` says the answer is complete.
    fn receive(
        &mut self,
        seq: u32,
        mut on: impl FnMut(NetlinkMessage<RouteNetlinkMessage>) -> io::Result<bool>,
    ) -> io::Result<()> {
        let deadline = Instant::now() + TIMEOUT;
        let mut idle = 0u32;
        for _ in 0..MAX_DATAGRAMS {
            let data = match self.sock.recv_from_full() {
                Ok((data, _)) => data,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "netlink: no complete answer from the kernel",
                        ));
                    }
                    // The answer is normally queued before `send` returns; spin briefly, then
                    // back off.
                    idle += 1;
                    if idle < 64 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            idle = 0;
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
                if on(m)? {
                    return Ok(());
                }
            }
        }
        Err(invalid("answer did not end"))
    }

    /// Sends a request that changes something and waits for the kernel's acknowledgement;
    /// the kernel's refusal comes back as the `io::Error` of its errno.
    pub fn request(&mut self, flags: u16, msg: RouteNetlinkMessage) -> io::Result<()> {
        let seq = self.send(NLM_F_REQUEST | NLM_F_ACK | flags, msg)?;
        self.receive(seq, |m| match m.payload {
            NetlinkPayload::Error(e) => match e.code {
                Some(_) => Err(e.to_io()),
                None => Ok(true),
            },
            NetlinkPayload::Done(_) => Ok(true),
            _ => Ok(false),
        })
    }

    /// One dump, retried while the kernel reports it inconsistent (NLM_F_DUMP_INTR); the last
    /// attempt's result is returned even if it was interrupted too.
    pub fn dump(&mut self, request: RouteNetlinkMessage) -> io::Result<Vec<RouteNetlinkMessage>> {
        let mut last = Vec::new();
        for _ in 0..DUMP_ATTEMPTS {
            let (out, consistent) = self.dump_once(request.clone())?;
            if consistent {
                return Ok(out);
            }
            tracing::debug!("netlink dump interrupted by a concurrent change; retrying");
            last = out;
        }
        Ok(last)
    }

    fn dump_once(
        &mut self,
        request: RouteNetlinkMessage,
    ) -> io::Result<(Vec<RouteNetlinkMessage>, bool)> {
        let seq = self.send(NLM_F_REQUEST | NLM_F_DUMP, request)?;
        let mut out = Vec::new();
        let mut consistent = true;
        self.receive(seq, |m| {
            if m.header.flags & NLM_F_DUMP_INTR != 0 {
                consistent = false;
            }
            match m.payload {
                // A dump that failed part-way carries the (negative) errno in NLMSG_DONE.
                NetlinkPayload::Done(done) if done.code < 0 => {
                    Err(io::Error::from_raw_os_error(-done.code))
                }
                NetlinkPayload::Done(_) => Ok(true),
                NetlinkPayload::Error(e) if e.code.is_some() => Err(e.to_io()),
                NetlinkPayload::InnerMessage(inner) => {
                    out.push(inner);
                    Ok(false)
                }
                _ => Ok(false),
            }
        })?;
        Ok((out, consistent))
    }

    /// Every link, with its VXLAN attributes where it has them.
    pub fn links(&mut self) -> io::Result<Vec<Link>> {
        let msgs = self.dump(RouteNetlinkMessage::GetLink(LinkMessage::default()))?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => parse_link(&l),
                _ => None,
            })
            .collect())
    }

    /// Every address of every interface.
    pub fn addresses(&mut self) -> io::Result<Vec<Addr>> {
        let msgs = self.dump(RouteNetlinkMessage::GetAddress(AddressMessage::default()))?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewAddress(a) = m else {
                continue;
            };
            // IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer on
            // point-to-point links).
            let local = a.attributes.iter().find_map(|at| match at {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let address = a.attributes.iter().find_map(|at| match at {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            });
            if let Some(ip) = local.or(address)
                && let Ok(cidr) = Cidr::new(ip, a.header.prefix_len)
            {
                out.push(Addr {
                    index: a.header.index,
                    cidr,
                });
            }
        }
        Ok(out)
    }

    /// Every route of one family, in every table.
    pub fn routes(&mut self, family: AddressFamily) -> io::Result<Vec<RouteMessage>> {
        let mut req = RouteMessage::default();
        req.header.address_family = family;
        let msgs = match self.dump(RouteNetlinkMessage::GetRoute(req)) {
            Ok(m) => m,
            // No IPv6 in this kernel (or namespace): no IPv6 routes.
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

    /// Deletes a link by index.
    pub fn delete_link(&mut self, index: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.request(0, RouteNetlinkMessage::DelLink(msg))
    }

    /// Sets a link's MTU and/or brings it up.
    pub fn set_link(&mut self, index: u32, mtu: Option<u32>, up: bool) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        if up {
            msg.header.flags = LinkFlags::Up;
            msg.header.change_mask = LinkFlags::Up;
        }
        if let Some(mtu) = mtu {
            msg.attributes.push(LinkAttribute::Mtu(mtu));
        }
        self.request(0, RouteNetlinkMessage::SetLink(msg))
    }

    /// Adds (`add`) or removes an address; IPv6 ones without duplicate address detection, so
    /// they are usable at once.
    pub fn change_address(&mut self, index: u32, cidr: Cidr, add: bool) -> io::Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.index = index;
        msg.header.prefix_len = cidr.prefix();
        match cidr.addr() {
            IpAddr::V4(_) => {
                msg.header.family = AddressFamily::Inet;
                msg.attributes.push(AddressAttribute::Local(cidr.addr()));
            }
            IpAddr::V6(_) => {
                msg.header.family = AddressFamily::Inet6;
                msg.header.flags = rtnetlink::packet_route::address::AddressHeaderFlags::Nodad;
            }
        }
        msg.attributes.push(AddressAttribute::Address(cidr.addr()));
        if add {
            self.request(
                NLM_F_CREATE | NLM_F_REPLACE,
                RouteNetlinkMessage::NewAddress(msg),
            )
        } else {
            self.request(0, RouteNetlinkMessage::DelAddress(msg))
        }
    }

    /// The name of the interface holding `ip`, if any.
    pub fn interface_holding(&mut self, ip: IpAddr) -> io::Result<Option<Link>> {
        let Some(index) = self
            .addresses()?
            .into_iter()
            .find(|a| a.cidr.addr() == ip)
            .map(|a| a.index)
        else {
            return Ok(None);
        };
        Ok(self.links()?.into_iter().find(|l| l.index == index))
    }
}

/// errno: address family not supported.
pub const EAFNOSUPPORT: i32 = 97;
/// errno: no such device.
pub const ENODEV: i32 = 19;
/// errno: no such process (the kernel's "no such route/entry").
pub const ESRCH: i32 = 3;
/// errno: no such file or directory (the kernel's "no such neighbour/address").
pub const ENOENT: i32 = 2;
/// errno: file exists.
pub const EEXIST: i32 = 17;
/// errno: network is unreachable.
pub const ENETUNREACH: i32 = 101;

fn parse_link(l: &LinkMessage) -> Option<Link> {
    let mut name = None;
    let mut mtu = 0;
    let mut mac = Vec::new();
    let mut kind = None;
    let mut vxlan = Vec::new();
    for a in &l.attributes {
        match a {
            LinkAttribute::IfName(n) => name = Some(n.clone()),
            LinkAttribute::Mtu(m) => mtu = *m,
            LinkAttribute::Address(m) => mac = m.clone(),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        LinkInfo::Kind(k) => kind = Some(k.clone()),
                        LinkInfo::Data(InfoData::Vxlan(v)) => vxlan = v.clone(),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(Link {
        index: l.header.index,
        name: name?,
        up: l.header.flags.contains(LinkFlags::Up),
        running: l.header.flags.contains(LinkFlags::Running),
        mtu,
        mac,
        kind,
        vxlan,
    })
}

/// Formats a MAC address as `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff` (or with `-`).
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split([':', '-']);
    for b in &mut out {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// An IP address from the raw bytes of a netlink attribute (4 or 16 bytes).
pub fn ip_from_bytes(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => <[u8; 4]>::try_from(b)
            .ok()
            .map(|a| IpAddr::V4(Ipv4Addr::from(a))),
        16 => <[u8; 16]>::try_from(b)
            .ok()
            .map(|a| IpAddr::V6(Ipv6Addr::from(a))),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_and_format() {
        let m = parse_mac("66:0a:BC:de:f0:01").unwrap();
        assert_eq!(m, [0x66, 0x0a, 0xbc, 0xde, 0xf0, 0x01]);
        assert_eq!(format_mac(&m), "66:0a:bc:de:f0:01");
        assert_eq!(parse_mac("66-0a-bc-de-f0-01"), Some(m));
        for bad in [
            "",
            "66:0a:bc:de:f0",
            "66:0a:bc:de:f0:01:02",
            "6:0a:bc:de:f0:01",
            "zz:0a:bc:de:f0:01",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }

    #[test]
    fn ips_from_bytes() {
        assert_eq!(
            ip_from_bytes(&[10, 0, 0, 1]),
            Some("10.0.0.1".parse().unwrap())
        );
        assert_eq!(ip_from_bytes(&[0; 16]), Some("::".parse().unwrap()));
        assert_eq!(ip_from_bytes(&[1, 2, 3]), None);
    }

    /// Reading the current namespace needs no privilege: there is always `lo`.
    #[test]
    fn lists_loopback() {
        let mut nl = Netlink::open().unwrap();
        let links = nl.links().unwrap();
        let lo = links.iter().find(|l| l.name == "lo").unwrap();
        let holder = nl
            .interface_holding("127.0.0.1".parse().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(holder.index, lo.index);
    }
}
