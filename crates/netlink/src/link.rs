//! Links: listing, looking up, creating veth pairs, changing and deleting.

use std::io;
use std::os::fd::RawFd;

use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::link::{
    InfoData, InfoKind, InfoVeth, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};

use crate::{Netlink, is_not_found};

/// Longest interface name the kernel accepts (IFNAMSIZ without the NUL).
pub const MAX_IFNAME: usize = 15;

/// A link as the kernel reports it.
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
    /// `veth`, `vxlan`, `bridge`, ... (None for links without IFLA_LINKINFO, e.g. `lo`).
    pub kind: Option<InfoKind>,
    /// The VXLAN attributes, for a VXLAN link.
    pub vxlan: Vec<InfoVxlan>,
}

/// The link a kernel message describes; None without a name (never seen in practice).
pub fn parse_link(l: &LinkMessage) -> Option<Link> {
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

impl Netlink {
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

    fn get_link(&mut self, m: LinkMessage) -> io::Result<Option<Link>> {
        match self.exchange(0, RouteNetlinkMessage::GetLink(m)) {
            Ok(msgs) => Ok(msgs.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => parse_link(&l),
                _ => None,
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The link called `name`, or None.
    pub fn link(&mut self, name: &str) -> io::Result<Option<Link>> {
        if name.is_empty() || name.len() > MAX_IFNAME {
            return Ok(None); // cannot exist
        }
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.get_link(m)
    }

    /// The link with index `index`, or None.
    pub fn link_by_index(&mut self, index: u32) -> io::Result<Option<Link>> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        self.get_link(m)
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
        self.request(NLM_F_CREATE | NLM_F_EXCL, RouteNetlinkMessage::NewLink(m))
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

    /// Brings a link up.
    pub fn set_up(&mut self, index: u32) -> io::Result<()> {
        self.set_link(index, None, true)
    }

    /// Brings a link down.
    pub fn set_down(&mut self, index: u32) -> io::Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.header.change_mask = LinkFlags::Up;
        self.request(0, RouteNetlinkMessage::SetLink(m))
    }

    /// Sets a link's MAC address.
    pub fn set_mac(&mut self, index: u32, mac: &[u8]) -> io::Result<()> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes.push(LinkAttribute::Address(mac.to_vec()));
        self.request(0, RouteNetlinkMessage::SetLink(m))
    }

    /// Deletes a link by index.
    pub fn delete_link(&mut self, index: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.request(0, RouteNetlinkMessage::DelLink(msg))
    }

    /// Deletes the link called `name`; false if there was none.
    pub fn delete_link_named(&mut self, name: &str) -> io::Result<bool> {
        if name.is_empty() || name.len() > MAX_IFNAME {
            return Ok(false);
        }
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.request(0, RouteNetlinkMessage::DelLink(m)) {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }
}
