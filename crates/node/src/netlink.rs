//! The host's real network view for autodetection: links and addresses read over netlink.
//!
//! [`SystemNet`] sends `RTM_GETLINK` and `RTM_GETADDR` dumps on a `NETLINK_ROUTE` socket, using
//! the message types and socket that rtnetlink 0.24 re-exports (`rtnetlink::packet_route`,
//! `rtnetlink::packet_core`, `rtnetlink::sys`). It does this **synchronously**, on a
//! non-blocking socket polled until a deadline, without any tokio runtime. (rtnetlink's async
//! request API returns `futures` streams, which would need the `futures` crate to consume and a
//! runtime to drive; a sync [`NetView`] running its own runtime would panic when called from
//! inside another one.) So `SystemNet` may be called from any thread, async code included: it
//! blocks only for two small netlink dumps, typically well under a millisecond. Start-up can
//! still wrap it in `spawn_blocking` if it likes.
//!
//! Interfaces come back sorted by interface index, ascending (the order Go's `net.Interfaces`
//! returns them in, since the kernel dumps links by index); addresses of an interface keep the
//! kernel's dump order. Autodetection then walks them backwards, as Calico does.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use rtnetlink::packet_core::{
    NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::{Socket, SocketAddr as NetlinkAddr};

use margay_api::net::Cidr;

use crate::autodetect::{InterfaceInfo, NetView};

/// How long one netlink dump may take before we give up.
const DUMP_TIMEOUT: Duration = Duration::from_secs(10);
/// Upper bound on datagrams read for one dump (a dump of thousands of interfaces is far less).
const MAX_DATAGRAMS: usize = 1_000_000;
/// A dump interrupted by a concurrent change (NLM_F_DUMP_INTR) is retried this many times.
const DUMP_ATTEMPTS: usize = 5;

/// The host's (current network namespace's) interfaces, read over netlink, and the kernel's
/// routing decision for [`NetView::route_source`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemNet;

impl NetView for SystemNet {
    fn interfaces(&self) -> io::Result<Vec<InterfaceInfo>> {
        let mut last = None;
        for _ in 0..DUMP_ATTEMPTS {
            let (ifaces, consistent) = read_interfaces()?;
            if consistent {
                return Ok(ifaces);
            }
            tracing::debug!("netlink dump interrupted by a concurrent change; retrying");
            last = Some(ifaces);
        }
        Ok(last.unwrap_or_default())
    }

    /// Connects a UDP socket to `dest` port 80 and reads back its local address: the kernel
    /// picks the route and source address, and UDP `connect` sends nothing.
    fn route_source(&self, dest: IpAddr) -> io::Result<IpAddr> {
        let bind: SocketAddr = match dest {
            IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let sock = UdpSocket::bind(bind)?;
        sock.connect(SocketAddr::new(dest, 80))?;
        Ok(sock.local_addr()?.ip())
    }
}

/// One link dump and one address dump; `false` when either was interrupted by a change.
fn read_interfaces() -> io::Result<(Vec<InterfaceInfo>, bool)> {
    let sock = open()?;
    let (links, links_ok) = dump(
        &sock,
        1,
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
    )?;
    let (addrs, addrs_ok) = dump(
        &sock,
        2,
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
    )?;

    let mut by_index: HashMap<u32, Vec<Cidr>> = HashMap::new();
    for m in addrs {
        let RouteNetlinkMessage::NewAddress(a) = m else {
            continue;
        };
        // IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer on point-to-point
        // links (and the address itself otherwise).
        let local = a.attributes.iter().find_map(|at| match at {
            AddressAttribute::Local(ip) => Some(*ip),
            _ => None,
        });
        let address = a.attributes.iter().find_map(|at| match at {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        });
        let Some(ip) = local.or(address) else {
            continue;
        };
        match Cidr::new(ip, a.header.prefix_len) {
            Ok(c) => by_index.entry(a.header.index).or_default().push(c),
            Err(e) => tracing::debug!("ignoring address {ip}/{}: {e}", a.header.prefix_len),
        }
    }

    let mut ifaces = Vec::new();
    for m in links {
        let RouteNetlinkMessage::NewLink(l) = m else {
            continue;
        };
        let Some(name) = l.attributes.iter().find_map(|at| match at {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        }) else {
            continue;
        };
        let index = l.header.index;
        ifaces.push(InterfaceInfo {
            name,
            index,
            up: l.header.flags.contains(LinkFlags::Up),
            addrs: by_index.remove(&index).unwrap_or_default(),
        });
    }
    ifaces.sort_by_key(|i| i.index);
    Ok((ifaces, links_ok && addrs_ok))
}

fn open() -> io::Result<Socket> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&NetlinkAddr::new(0, 0))?;
    sock.set_non_blocking(true)?;
    Ok(sock)
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("netlink: {e}"))
}

/// Sends one dump request and collects the replies until NLMSG_DONE. Returns the messages and
/// whether the dump was consistent (no NLM_F_DUMP_INTR).
fn dump(
    sock: &Socket,
    seq: u32,
    request: RouteNetlinkMessage,
) -> io::Result<(Vec<RouteNetlinkMessage>, bool)> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = seq;
    let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(request));
    msg.finalize();
    let mut buf = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut buf);
    sock.send(&buf, 0)?;

    let deadline = Instant::now() + DUMP_TIMEOUT;
    let mut out = Vec::new();
    let mut consistent = true;
    for _ in 0..MAX_DATAGRAMS {
        let data = match sock.recv_from_full() {
            Ok((data, _)) => data,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "netlink dump: no complete answer from the kernel",
                    ));
                }
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
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
            if m.header.flags & NLM_F_DUMP_INTR != 0 {
                consistent = false;
            }
            match m.payload {
                // A dump that failed part-way carries the (negative) errno in NLMSG_DONE.
                NetlinkPayload::Done(done) if done.code < 0 => {
                    return Err(io::Error::from_raw_os_error(-done.code));
                }
                NetlinkPayload::Done(_) => return Ok((out, consistent)),
                NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                NetlinkPayload::InnerMessage(inner) => out.push(inner),
                _ => {}
            }
        }
    }
    Err(invalid("dump did not end"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Reading the current namespace is harmless and needs no privilege: there is always `lo`.
    #[test]
    fn lists_loopback() {
        let ifaces = SystemNet.interfaces().unwrap();
        assert!(ifaces.windows(2).all(|w| w[0].index < w[1].index));
        let lo = ifaces.iter().find(|i| i.name == "lo").unwrap();
        assert!(
            lo.addrs.iter().any(|c| c.to_string() == "127.0.0.1/8"),
            "{lo:?}"
        );
    }

    #[test]
    fn route_source_to_loopback() {
        let src = SystemNet
            .route_source("127.0.0.1".parse().unwrap())
            .unwrap();
        assert_eq!(src, "127.0.0.1".parse::<IpAddr>().unwrap());
    }
}
