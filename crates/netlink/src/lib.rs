//! margay's one way into the kernel's network state.
//!
//! Every kernel-touching crate (the CNI plugin, node start-up's autodetection, Felix's Linux
//! dataplane) goes through here:
//!
//! - [`Netlink`]: a synchronous `NETLINK_ROUTE` socket built on the message types and socket
//!   rtnetlink re-exports from `netlink-packet-route` / `netlink-sys` (re-exported here as
//!   [`packet_route`], [`packet_core`]), with typed requests for links ([`Link`]), addresses
//!   ([`Addr`]), routes ([`Route`], or whole `RouteMessage`s) and neighbours. No async runtime:
//!   the CNI plugin makes a dozen small requests per call and Felix's managers run on their
//!   own threads; each answer is bounded in time ([`socket::TIMEOUT`]) and size, and a dump the
//!   kernel marks interrupted is repeated.
//! - [`netns`]: running work on a thread inside another network namespace.
//! - [`sysctl`]: settings under `/proc/sys`, read and written only where they differ.
//! - [`nflog`]: the packets nftables `log group` rules hand to userspace, with the rule's
//!   prefix (how a dataplane learns which rule decided a connection).
//! - [`conntrack`]: the connection tracking table dumped over ctnetlink, with each
//!   connection's packet and byte counters (flow records of long-lived connections).
//!
//! A socket belongs to the network namespace of the thread that opened it, so open one per
//! batch of work, on a thread in the namespace meant.
//!
//! Pure logic does not depend on this crate's I/O: the route and VXLAN managers plan with pure
//! functions, the CNI plugin's decisions are pure, and autodetection reads through its own
//! `NetView` trait with a recording fake in its tests.

#![forbid(unsafe_code)]

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

mod addr;
pub mod conntrack;
mod link;
pub mod netns;
pub mod nflog;
mod nfnl;
mod route;
pub mod socket;
pub mod sysctl;

pub use addr::Addr;
pub use link::{Link, MAX_IFNAME, parse_link};
pub use route::{Route, route_ip, route_table};
pub use socket::Netlink;

pub use rtnetlink::packet_core;
pub use rtnetlink::packet_core::{NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
pub use rtnetlink::packet_route;

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

/// The kernel said ENODEV / ENOENT / ESRCH: the object does not exist.
pub fn is_not_found(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(ENODEV | ENOENT | ESRCH))
}

/// The kernel said EEXIST.
pub fn is_exists(e: &io::Error) -> bool {
    e.raw_os_error() == Some(EEXIST)
}

fn family(ip: &IpAddr) -> packet_route::AddressFamily {
    if ip.is_ipv4() {
        packet_route::AddressFamily::Inet
    } else {
        packet_route::AddressFamily::Inet6
    }
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

    #[test]
    fn errnos_classify() {
        assert!(is_not_found(&io::Error::from_raw_os_error(ENODEV)));
        assert!(is_not_found(&io::Error::from_raw_os_error(ESRCH)));
        assert!(!is_not_found(&io::Error::from_raw_os_error(EEXIST)));
        assert!(is_exists(&io::Error::from_raw_os_error(EEXIST)));
    }

    /// Reading the current namespace needs no privilege: there is always `lo`, holding
    /// 127.0.0.1, with a host route in the local table and none in main.
    #[test]
    fn reads_loopback() {
        let mut nl = Netlink::open().unwrap();
        let links = nl.links().unwrap();
        let lo = links.iter().find(|l| l.name == "lo").unwrap();
        assert_eq!(nl.link("lo").unwrap().as_ref(), Some(lo));
        assert_eq!(nl.link_by_index(lo.index).unwrap().as_ref(), Some(lo));
        assert!(nl.link("mgy-no-such-link").unwrap().is_none());
        assert!(nl.link("a-name-far-too-long-for-linux").unwrap().is_none());
        let addrs = nl.addresses_of(lo.index).unwrap();
        assert!(
            addrs
                .iter()
                .any(|a| a.cidr.addr() == IpAddr::from([127, 0, 0, 1]) && a.cidr.prefix() == 8),
            "{addrs:?}"
        );
        let holder = nl
            .interface_holding("127.0.0.1".parse().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(holder.index, lo.index);
        let local = nl
            .route_messages(packet_route::AddressFamily::Inet)
            .unwrap();
        assert!(local.iter().any(|r| route_table(r) == 255), "{local:?}");
        let _ = nl.main_routes(false).unwrap();
    }
}
