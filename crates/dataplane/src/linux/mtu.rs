//! MTU detection, as Calico's Felix does it: the host's MTU is the smallest MTU of the
//! operationally-up interfaces whose names match MTUIfacePattern (1460, the smallest common
//! cloud MTU, when none matches); an encapsulation whose MTU is not configured gets the host's
//! minus its overhead; the MTU for pods is the smallest MTU of the encapsulations in use, or
//! the host's without any. Felix writes it to `/var/lib/calico/mtu`, where the CNI plugin reads
//! it when its configuration sets no MTU.
//!
//! Pure: the caller lists the links (`netlink::Netlink::links`) and writes the file.

use super::netlink::Link;

/// Calico's fallback when no interface matches the pattern.
pub const FALLBACK_HOST_MTU: u32 = 1460;
/// VXLAN over IPv4: outer IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14).
pub const VXLAN_OVERHEAD: u32 = 50;
/// VXLAN over IPv6: outer IPv6 (40) + UDP + VXLAN + inner Ethernet.
pub const VXLAN_V6_OVERHEAD: u32 = 70;
/// IP-in-IP: one outer IPv4 header.
pub const IPIP_OVERHEAD: u32 = 20;
/// Where Calico's Felix writes the pod MTU.
pub const MTU_FILE: &str = "/var/lib/calico/mtu";

/// The host MTU: the smallest MTU among up interfaces `matches` accepts, with the names of
/// those interfaces; the fallback (and no names) when none does.
pub fn host_mtu(links: &[Link], matches: impl Fn(&str) -> bool) -> (u32, Vec<String>) {
    let mut smallest = 0;
    let mut used = Vec::new();
    for l in links {
        if !l.running || l.mtu == 0 || !matches(&l.name) {
            continue;
        }
        used.push(l.name.clone());
        if smallest == 0 || l.mtu < smallest {
            smallest = l.mtu;
        }
    }
    if smallest == 0 {
        (FALLBACK_HOST_MTU, used)
    } else {
        (smallest, used)
    }
}

/// An encapsulation's MTU: the configured one, else the host's minus its overhead.
pub fn encap_mtu(configured: u32, host: u32, overhead: u32) -> u32 {
    if configured != 0 {
        configured
    } else {
        host.saturating_sub(overhead)
    }
}

/// The pod MTU: the smallest MTU of the encapsulations in use (each `(in use, MTU)`), or the
/// host's when none is.
pub fn pod_mtu(host: u32, encaps: &[(bool, u32)]) -> u32 {
    encaps
        .iter()
        .filter(|(on, mtu)| *on && *mtu != 0)
        .map(|(_, mtu)| *mtu)
        .min()
        .unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, mtu: u32, running: bool) -> Link {
        Link {
            index: 1,
            name: name.into(),
            up: true,
            running,
            mtu,
            mac: Vec::new(),
            kind: None,
            vxlan: Vec::new(),
        }
    }

    #[test]
    fn host_mtu_is_the_smallest_matching_up_interface() {
        let links = [
            link("eth0", 1500, true),
            link("ens5", 1400, true),
            link("ens6", 1200, false),
            link("cali1", 1300, true),
        ];
        let pattern = |n: &str| n.starts_with("eth") || n.starts_with("en");
        assert_eq!(
            host_mtu(&links, pattern),
            (1400, vec!["eth0".to_string(), "ens5".to_string()])
        );
        assert_eq!(host_mtu(&links, |n| n == "eth0").0, 1500);
        assert_eq!(host_mtu(&links, |_| false), (FALLBACK_HOST_MTU, Vec::new()));
    }

    #[test]
    fn pod_mtu_is_the_smallest_encapsulation_in_use() {
        assert_eq!(encap_mtu(0, 1500, VXLAN_OVERHEAD), 1450);
        assert_eq!(encap_mtu(1300, 1500, VXLAN_OVERHEAD), 1300);
        assert_eq!(pod_mtu(1500, &[(false, 1450), (false, 1430)]), 1500);
        assert_eq!(pod_mtu(1500, &[(true, 1450), (true, 1430)]), 1430);
        assert_eq!(pod_mtu(1500, &[(true, 1450), (false, 1430)]), 1450);
    }
}
