//! Addresses: listing, adding and removing.

use std::io;
use std::net::IpAddr;

use margay_api::net::Cidr;
use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use rtnetlink::packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressScope,
};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::{Link, Netlink, family};

/// An address on an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addr {
    pub index: u32,
    /// The interface's own address (IFA_LOCAL, else IFA_ADDRESS) and its prefix length.
    pub cidr: Cidr,
    /// Scope link (an IPv6 `fe80::/64` address, for one).
    pub link_scope: bool,
    /// Duplicate address detection has not finished: not usable yet.
    pub tentative: bool,
}

fn parse_addr(a: &AddressMessage) -> Option<Addr> {
    // IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer on point-to-point
    // links (and the address itself otherwise).
    let mut local = None;
    let mut address = None;
    let mut flags = None;
    for at in &a.attributes {
        match at {
            AddressAttribute::Local(ip) => local = Some(*ip),
            AddressAttribute::Address(ip) => address = Some(*ip),
            AddressAttribute::Flags(f) => flags = Some(*f),
            _ => {}
        }
    }
    let ip = local.or(address)?;
    let cidr = match Cidr::new(ip, a.header.prefix_len) {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!("ignoring address {ip}/{}: {e}", a.header.prefix_len);
            return None;
        }
    };
    // IFA_FLAGS (32 bits) supersedes the header's 8 bits when the kernel sends it.
    let tentative = flags.map_or(
        a.header.flags.contains(AddressHeaderFlags::Tentative),
        |f| f.contains(AddressFlags::Tentative),
    );
    Some(Addr {
        index: a.header.index,
        cidr,
        link_scope: a.header.scope == AddressScope::Link,
        tentative,
    })
}

impl Netlink {
    /// Every address of every interface, in the kernel's dump order.
    pub fn addresses(&mut self) -> io::Result<Vec<Addr>> {
        let msgs = self.dump(RouteNetlinkMessage::GetAddress(AddressMessage::default()))?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) => parse_addr(a),
                _ => None,
            })
            .collect())
    }

    /// The addresses of link `index`.
    pub fn addresses_of(&mut self, index: u32) -> io::Result<Vec<Addr>> {
        let mut all = self.addresses()?;
        all.retain(|a| a.index == index);
        Ok(all)
    }

    /// Adds `ip/prefix` to a link, failing with EEXIST if it is there already (IPv6 without
    /// duplicate address detection, so it is usable at once).
    pub fn add_address(&mut self, index: u32, cidr: Cidr) -> io::Result<()> {
        self.request(
            NLM_F_CREATE | NLM_F_EXCL,
            RouteNetlinkMessage::NewAddress(address_message(index, cidr)),
        )
    }

    /// Adds (`add`, replacing one that is there) or removes an address; IPv6 ones without
    /// duplicate address detection.
    pub fn change_address(&mut self, index: u32, cidr: Cidr, add: bool) -> io::Result<()> {
        let msg = address_message(index, cidr);
        if add {
            self.request(
                NLM_F_CREATE | NLM_F_REPLACE,
                RouteNetlinkMessage::NewAddress(msg),
            )
        } else {
            self.request(0, RouteNetlinkMessage::DelAddress(msg))
        }
    }

    /// The interface holding `ip`, if any.
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

fn address_message(index: u32, cidr: Cidr) -> AddressMessage {
    let ip = cidr.addr();
    let mut m = AddressMessage::default();
    m.header.family = family(&ip);
    m.header.prefix_len = cidr.prefix();
    m.header.index = index;
    m.header.scope = AddressScope::Universe;
    m.attributes.push(AddressAttribute::Local(ip));
    m.attributes.push(AddressAttribute::Address(ip));
    if m.header.family == AddressFamily::Inet6 {
        m.header.flags = AddressHeaderFlags::Nodad;
        m.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    m
}
