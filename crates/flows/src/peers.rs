//! Who an address belongs to, cluster-wide: every workload endpoint (on any node), host
//! endpoint and network set the datastore holds, so a flow's far end is named
//! `namespace/pod` with its labels rather than a bare `pvt`/`pub` network.
//!
//! Endpoint addresses are exact matches; network sets are longest-prefix matches and only
//! answer when no endpoint claims the address (Calico's order: an endpoint is more specific
//! than a network set that contains it). Fed by whoever sees the datastore's updates (Felix's
//! calculation thread), read by the flow collector; every operation is O(1) in the number of
//! entries except a network-set lookup, which is O(number of distinct prefix lengths).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use crate::record::Peer;

/// Labels kept per peer (the rest are left out of flow records, which stay bounded).
pub const MAX_LABELS: usize = 64;

/// An address or a network: the address and its prefix length.
pub type Net = (IpAddr, u8);

/// The items claiming one address or network (the latest claim answers).
type Claims = HashMap<IpAddr, Vec<String>>;

/// Network sets' networks, per (IPv4?, prefix length), longest first.
type NetsByLength = BTreeMap<std::cmp::Reverse<(bool, u8)>, Claims>;

/// The address map.
#[derive(Debug, Default)]
pub struct PeerDirectory {
    /// What each datastore item (its key) contributed.
    items: HashMap<String, (Arc<Peer>, Vec<Net>)>,
    /// Endpoint addresses → the items claiming them (usually one; the latest claim wins).
    exact: Claims,
    /// Network sets: per prefix length (longest first), the masked network → items.
    nets: NetsByLength,
}

/// `addr` with the bits past `len` cleared.
fn masked(addr: IpAddr, len: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let keep = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            IpAddr::V4((bits & keep).into())
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let keep = u128::MAX
                .checked_shl(128 - u32::from(len.min(128)))
                .unwrap_or(0);
            IpAddr::V6((bits & keep).into())
        }
    }
}

/// Parses `10.0.0.1`, `10.0.0.1/32`, `fd00::/64` (a bad string is `None`: the item is
/// named without it, never an error — the datastore's validation owns that).
pub fn parse_net(text: &str) -> Option<Net> {
    let (addr, len) = match text.split_once('/') {
        Some((a, l)) => (
            a.trim().parse::<IpAddr>().ok()?,
            Some(l.trim().parse::<u8>().ok()?),
        ),
        None => (text.trim().parse::<IpAddr>().ok()?, None),
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = len.unwrap_or(max);
    (len <= max).then(|| (masked(addr, len), len))
}

/// `k=v` strings of a label map, at most [`MAX_LABELS`].
pub fn label_strings<'a>(
    labels: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Vec<String> {
    labels
        .into_iter()
        .take(MAX_LABELS)
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

fn detach(map: &mut Claims, at: IpAddr, key: &str) {
    if let Some(keys) = map.get_mut(&at) {
        keys.retain(|k| k != key);
        if keys.is_empty() {
            map.remove(&at);
        }
    }
}

impl PeerDirectory {
    pub fn new() -> PeerDirectory {
        PeerDirectory::default()
    }

    /// Items known.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Sets what the item `key` names: an endpoint (`wep`, `hep`: its addresses, exact) or a
    /// network set (`ns`: its networks, longest prefix). Replaces what the key named before.
    pub fn upsert(&mut self, key: &str, peer: Peer, nets: Vec<Net>) {
        self.remove(key);
        let endpoint = peer.kind != "ns";
        for &(addr, len) in &nets {
            let full = if addr.is_ipv4() { 32 } else { 128 };
            let keys = if endpoint && len == full {
                self.exact.entry(addr).or_default()
            } else {
                self.nets
                    .entry(std::cmp::Reverse((addr.is_ipv4(), len)))
                    .or_default()
                    .entry(masked(addr, len))
                    .or_default()
            };
            keys.push(key.to_string());
        }
        self.items.insert(key.to_string(), (Arc::new(peer), nets));
    }

    /// Forgets the item `key` (nothing when it is unknown).
    pub fn remove(&mut self, key: &str) {
        let Some((peer, nets)) = self.items.remove(key) else {
            return;
        };
        let endpoint = peer.kind != "ns";
        for (addr, len) in nets {
            let full = if addr.is_ipv4() { 32 } else { 128 };
            if endpoint && len == full {
                detach(&mut self.exact, addr, key);
            } else {
                let slot = std::cmp::Reverse((addr.is_ipv4(), len));
                if let Some(by_net) = self.nets.get_mut(&slot) {
                    detach(by_net, masked(addr, len), key);
                    if by_net.is_empty() {
                        self.nets.remove(&slot);
                    }
                }
            }
        }
    }

    /// Who `addr` is: an endpoint with that address, else the network set with the longest
    /// network containing it, else nobody the datastore knows.
    pub fn lookup(&self, addr: IpAddr) -> Option<Arc<Peer>> {
        let named = |keys: &Vec<String>| {
            keys.last()
                .and_then(|k| self.items.get(k))
                .map(|(p, _)| p.clone())
        };
        if let Some(p) = self.exact.get(&addr).and_then(named) {
            return Some(p);
        }
        let v4 = addr.is_ipv4();
        self.nets
            .iter()
            .filter(|(std::cmp::Reverse((is_v4, _)), _)| *is_v4 == v4)
            .find_map(|(std::cmp::Reverse((_, len)), by_net)| {
                by_net.get(&masked(addr, *len)).and_then(named)
            })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn peer(kind: &str, ns: &str, name: &str) -> Peer {
        Peer {
            kind: kind.into(),
            namespace: ns.into(),
            name: name.into(),
            labels: vec![format!("app={name}")],
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn endpoints_are_exact_and_beat_the_network_sets_that_contain_them() {
        let mut d = PeerDirectory::new();
        d.upsert(
            "ns/-/corp",
            peer("ns", "-", "corp"),
            vec![
                parse_net("10.0.0.0/8").unwrap(),
                parse_net("fd00::/8").unwrap(),
            ],
        );
        d.upsert(
            "ns/prod/lab",
            peer("ns", "prod", "lab"),
            vec![parse_net("10.1.0.0/16").unwrap()],
        );
        d.upsert(
            "wep/prod/web",
            peer("wep", "prod", "web"),
            vec![
                parse_net("10.1.2.3/32").unwrap(),
                parse_net("fd00::3").unwrap(),
            ],
        );
        assert_eq!(d.lookup(ip("10.1.2.3")).unwrap().name, "web");
        assert_eq!(d.lookup(ip("fd00::3")).unwrap().name, "web");
        assert_eq!(d.lookup(ip("10.1.9.9")).unwrap().name, "lab");
        assert_eq!(d.lookup(ip("10.200.0.1")).unwrap().name, "corp");
        assert_eq!(d.lookup(ip("fd00::4")).unwrap().name, "corp");
        assert!(d.lookup(ip("192.168.0.1")).is_none());
        // An IPv4 network never answers for an IPv6 address of the same bits, and back.
        assert!(d.lookup(ip("::a00:1")).is_none());

        // Moved: the old address is free, the new one named.
        d.upsert(
            "wep/prod/web",
            peer("wep", "prod", "web"),
            vec![parse_net("10.1.2.4/32").unwrap()],
        );
        assert_eq!(d.lookup(ip("10.1.2.3")).unwrap().name, "lab");
        assert_eq!(d.lookup(ip("10.1.2.4")).unwrap().name, "web");
        d.remove("ns/prod/lab");
        d.remove("ns/-/corp");
        d.remove("nothing");
        assert!(d.lookup(ip("10.1.9.9")).is_none());
        assert_eq!(d.len(), 1);
        d.remove("wep/prod/web");
        assert!(d.is_empty());
        assert!(d.exact.is_empty() && d.nets.is_empty(), "{d:?}");
    }

    #[test]
    fn two_claims_on_one_address_keep_the_latest_and_fall_back_to_the_other() {
        let mut d = PeerDirectory::new();
        d.upsert(
            "wep/a/old",
            peer("wep", "a", "old"),
            vec![parse_net("10.0.0.5").unwrap()],
        );
        d.upsert(
            "wep/a/new",
            peer("wep", "a", "new"),
            vec![parse_net("10.0.0.5").unwrap()],
        );
        assert_eq!(d.lookup(ip("10.0.0.5")).unwrap().name, "new");
        d.remove("wep/a/new");
        assert_eq!(d.lookup(ip("10.0.0.5")).unwrap().name, "old");
    }

    #[test]
    fn bad_networks_are_left_out_and_host_bits_are_cleared() {
        assert_eq!(parse_net("10.1.2.3/8"), Some((ip("10.0.0.0"), 8)));
        assert_eq!(parse_net("10.1.2.3/0"), Some((ip("0.0.0.0"), 0)));
        assert_eq!(parse_net("fd00::1/129"), None);
        assert_eq!(parse_net("10.0.0.1/33"), None);
        assert_eq!(parse_net("nonsense"), None);
        assert_eq!(parse_net("10.0.0.1/x"), None);
        let mut d = PeerDirectory::new();
        d.upsert(
            "ns/-/all",
            peer("ns", "-", "all"),
            vec![parse_net("0.0.0.0/0").unwrap()],
        );
        assert_eq!(d.lookup(ip("8.8.8.8")).unwrap().name, "all");
        assert!(d.lookup(ip("2001:db8::1")).is_none());
    }

    #[test]
    fn labels_are_bounded() {
        let many: BTreeMap<String, String> = (0..100)
            .map(|i| (format!("k{i:03}"), "v".to_string()))
            .collect();
        let got = label_strings(&many);
        assert_eq!(got.len(), MAX_LABELS);
        assert_eq!(got[0], "k000=v");
    }
}
