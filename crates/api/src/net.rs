//! IP networks (CIDRs) with the parsing rules Calico uses.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An address with a prefix length, e.g. `10.65.0.0/16`. The address is kept as written
/// (it need not be the network address); [`Cidr::network`] masks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Cidr, String> {
        if prefix > max_prefix(addr) {
            return Err(format!(
                "prefix length /{prefix} is too long for {addr} (max /{})",
                max_prefix(addr)
            ));
        }
        Ok(Cidr { addr, prefix })
    }

    /// Parses `ADDRESS/PREFIX`; the prefix is required.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = s.split_once('/').ok_or_else(|| {
            format!("{s:?} is not a valid CIDR (expected ADDRESS/PREFIX, e.g. 10.0.0.0/16)")
        })?;
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not a valid CIDR: {addr:?} is not an IP address"))?;
        if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) || prefix.len() > 3 {
            return Err(format!(
                "{s:?} is not a valid CIDR: bad prefix length {prefix:?}"
            ));
        }
        let prefix: u8 = prefix
            .parse()
            .map_err(|_| format!("{s:?} is not a valid CIDR: bad prefix length {prefix:?}"))?;
        if prefix > max_prefix(addr) {
            return Err(format!(
                "{s:?} is not a valid CIDR: prefix length /{prefix} exceeds /{}",
                max_prefix(addr)
            ));
        }
        Ok(Cidr { addr, prefix })
    }

    /// Parses a CIDR, or a bare address as a single-address network (/32 or /128).
    pub fn parse_cidr_or_ip(s: &str) -> Result<Cidr, String> {
        if s.contains('/') {
            return Cidr::parse(s);
        }
        let addr: IpAddr = s.parse().map_err(|_| {
            format!(
                "{s:?} is not a valid IP address or CIDR (expected e.g. 10.0.0.1 or 10.0.0.0/16)"
            )
        })?;
        Ok(Cidr::host(addr))
    }

    pub fn host(addr: IpAddr) -> Cidr {
        Cidr {
            addr,
            prefix: max_prefix(addr),
        }
    }

    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// 4 or 6.
    pub fn version(&self) -> u8 {
        if self.is_ipv4() { 4 } else { 6 }
    }

    /// The network address with host bits cleared.
    pub fn network(&self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask_v4(self.prefix))),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask_v6(self.prefix))),
        };
        Cidr {
            addr,
            prefix: self.prefix,
        }
    }

    /// True when no host bits are set (`10.0.0.0/8`, not `10.0.0.1/8`).
    pub fn is_masked(&self) -> bool {
        self.network().addr == self.addr
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let m = mask_v4(self.prefix);
                u32::from(net) & m == u32::from(ip) & m
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let m = mask_v6(self.prefix);
                u128::from(net) & m == u128::from(ip) & m
            }
            _ => false,
        }
    }

    /// True when the two networks share at least one address.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        if self.is_ipv4() != other.is_ipv4() {
            return false;
        }
        let shorter = if self.prefix <= other.prefix {
            self
        } else {
            other
        };
        let longer = if self.prefix <= other.prefix {
            other
        } else {
            self
        };
        shorter.contains(longer.addr)
    }

    /// Number of addresses, saturating at u128::MAX for ::/0.
    pub fn size(&self) -> u128 {
        let host_bits = u32::from(max_prefix(self.addr) - self.prefix);
        1u128.checked_shl(host_bits).unwrap_or(u128::MAX)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Cidr::parse(s)
    }
}

impl serde::Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Cidr, D::Error> {
        let s = String::deserialize(d)?;
        Cidr::parse_cidr_or_ip(&s).map_err(serde::de::Error::custom)
    }
}

fn max_prefix(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

fn mask_v4(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask_v6(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

/// Parses an IP address (v4 or v6).
pub fn parse_ip(s: &str) -> Result<IpAddr, String> {
    s.parse()
        .map_err(|_| format!("{s:?} is not a valid IP address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_mask() {
        let c = Cidr::parse("10.1.2.3/16").unwrap();
        assert!(!c.is_masked());
        assert_eq!(c.network().to_string(), "10.1.0.0/16");
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("10.0.0.0").is_err());
        assert!(Cidr::parse("10.0.0.0/").is_err());
        assert!(Cidr::parse("10.0.0.0/-1").is_err());
        assert_eq!(Cidr::parse_cidr_or_ip("10.0.0.1").unwrap().prefix(), 32);
        assert_eq!(Cidr::parse_cidr_or_ip("fd00::1").unwrap().prefix(), 128);
        assert!(Cidr::parse("fd00::/64").unwrap().is_masked());
        assert_eq!(Cidr::parse("0.0.0.0/0").unwrap().size(), 1u128 << 32);
        assert_eq!(Cidr::parse("::/0").unwrap().size(), u128::MAX);
    }

    #[test]
    fn containment() {
        let c = Cidr::parse("192.168.0.0/16").unwrap();
        assert!(c.contains("192.168.4.1".parse().unwrap()));
        assert!(!c.contains("192.169.0.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        assert!(c.overlaps(&Cidr::parse("192.168.3.0/24").unwrap()));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().overlaps(&c));
        assert!(!c.overlaps(&Cidr::parse("10.0.0.0/8").unwrap()));
    }
}
