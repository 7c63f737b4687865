//! The host's real network view for autodetection: links and addresses read through
//! `margay-netlink`, the kernel's own source-address choice for `route_source`.
//!
//! Synchronous (no tokio runtime), so [`SystemNet`] may be called from any thread, async code
//! included: it blocks only for two small netlink dumps, typically well under a millisecond.
//!
//! Interfaces come back sorted by interface index, ascending (the order Go's `net.Interfaces`
//! returns them in, since the kernel dumps links by index); addresses of an interface keep the
//! kernel's dump order. Autodetection then walks them backwards, as Calico does.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use margay_api::net::Cidr;
use margay_netlink::Netlink;

use crate::autodetect::{InterfaceInfo, NetView};

/// The host's (current network namespace's) interfaces, read over netlink, and the kernel's
/// routing decision for [`NetView::route_source`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemNet;

impl NetView for SystemNet {
    fn interfaces(&self) -> io::Result<Vec<InterfaceInfo>> {
        let mut nl = Netlink::open()?;
        let links = nl.links()?;
        let mut by_index: HashMap<u32, Vec<Cidr>> = HashMap::new();
        for a in nl.addresses()? {
            by_index.entry(a.index).or_default().push(a.cidr);
        }
        let mut ifaces: Vec<InterfaceInfo> = links
            .into_iter()
            .map(|l| InterfaceInfo {
                addrs: by_index.remove(&l.index).unwrap_or_default(),
                name: l.name,
                index: l.index,
                up: l.up,
            })
            .collect();
        ifaces.sort_by_key(|i| i.index);
        Ok(ifaces)
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
