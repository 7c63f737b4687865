//! Which BGP sessions this node has (pure): the node-to-node mesh, global and node-specific
//! BGPPeers (by peerIP or peerSelector) and the automatic reverse peerings, with Calico's
//! precedence rules. Rendering them as BIRD text is [`crate::render`]'s job.

use std::collections::BTreeMap;
use std::net::IpAddr;

use margay_api::bgp::{NextHopMode, ReversePeering, SourceAddress};
use margay_api::net::Cidr;
use margay_api::{BGPPeer, Node};
use margay_selector::Selector;

use crate::model::{BirdInputs, SecretRef};

/// Calico's default AS number when neither the node nor BGPConfiguration sets one.
pub const DEFAULT_AS: u32 = 64512;

/// A node's BGP identity, parsed once per render.
#[derive(Debug, Clone, Default)]
pub struct NodeBgp {
    pub v4: Option<(IpAddr, Option<Cidr>)>,
    pub v6: Option<(IpAddr, Option<Cidr>)>,
    pub asn: Option<u32>,
    pub rr_cluster_id: String,
    pub wireguard_v4: bool,
    pub wireguard_v6: bool,
}

impl NodeBgp {
    pub fn of(node: &Node) -> NodeBgp {
        let mut out = NodeBgp::default();
        if let Some(b) = &node.spec.bgp {
            out.v4 = parse_addr(&b.ipv4_address);
            out.v6 = parse_addr(&b.ipv6_address);
            out.asn = b.as_number.map(|a| a.0);
            out.rr_cluster_id = b.route_reflector_cluster_id.trim().to_string();
        }
        if let Some(w) = &node.spec.wireguard {
            out.wireguard_v4 = !w.interface_ipv4_address.is_empty();
            out.wireguard_v6 = !w.interface_ipv6_address.is_empty();
        }
        out
    }

    pub fn ip(&self, v6: bool) -> Option<IpAddr> {
        if v6 { self.v6 } else { self.v4 }.map(|(ip, _)| ip)
    }

    pub fn subnet(&self, v6: bool) -> Option<Cidr> {
        if v6 { self.v6 } else { self.v4 }.and_then(|(_, net)| net)
    }
}

/// `10.0.0.1/24` → (10.0.0.1, 10.0.0.0/24); a bare address has no subnet.
fn parse_addr(s: &str) -> Option<(IpAddr, Option<Cidr>)> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(c) = Cidr::parse(s) {
        return Some((c.addr(), Some(c.network())));
    }
    s.parse::<IpAddr>().ok().map(|ip| (ip, None))
}

/// How a session came about (it names the BIRD protocol: `Mesh_`, `Global_`, `Node_`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerKind {
    Mesh,
    Global,
    Node,
}

impl PeerKind {
    pub fn prefix(self) -> &'static str {
        match self {
            PeerKind::Mesh => "Mesh",
            PeerKind::Global => "Global",
            PeerKind::Node => "Node",
        }
    }
}

/// One peering before it is bound to this node's address family (Calico's v1 BGPPeer).
#[derive(Debug, Clone)]
pub struct Peering {
    pub ip: IpAddr,
    /// 0: BIRD's default (179).
    pub port: u16,
    pub asn: u32,
    pub local_asn: Option<u32>,
    pub source_address: SourceAddress,
    pub keep_next_hop: bool,
    pub next_hop_mode: Option<NextHopMode>,
    /// The peer address is one of the cluster's nodes.
    pub calico_node: bool,
    pub ttl_security: u8,
    pub filters: Vec<String>,
    pub allow_local_as: u32,
    pub reachable_by: Option<IpAddr>,
    pub password: Option<SecretRef>,
    pub restart_time: Option<u64>,
    pub keepalive_time: Option<u64>,
    pub rr_cluster_id: String,
    /// The BGPPeer it came from (for warnings).
    pub origin: String,
}

/// The peerings of this node, keyed as Calico keys them (peer address, port).
#[derive(Debug, Default)]
pub struct Peerings {
    pub global: BTreeMap<(IpAddr, u16), Peering>,
    pub node: BTreeMap<(IpAddr, u16), Peering>,
}

/// Everything the peer computation needs about the cluster, parsed once.
pub struct Cluster<'a> {
    pub inputs: &'a BirdInputs,
    pub nodes: BTreeMap<&'a str, NodeBgp>,
    pub global_as: u32,
    pub global_listen_port: u16,
    pub warnings: Vec<String>,
}

impl<'a> Cluster<'a> {
    pub fn new(inputs: &'a BirdInputs) -> Cluster<'a> {
        let nodes = inputs
            .nodes
            .iter()
            .map(|(n, node)| (n.as_str(), NodeBgp::of(node)))
            .collect();
        let global = inputs.global_config();
        let global_as = global
            .and_then(|c| c.spec.as_number)
            .map_or(DEFAULT_AS, |a| a.0);
        let global_listen_port = global
            .and_then(|c| c.spec.listen_port)
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(0);
        Cluster {
            inputs,
            nodes,
            global_as,
            global_listen_port,
            warnings: Vec::new(),
        }
    }

    pub fn node_as(&self, name: &str) -> u32 {
        self.nodes
            .get(name)
            .and_then(|n| n.asn)
            .unwrap_or(self.global_as)
    }

    /// The port a node listens on: its `node.<name>` BGPConfiguration, else the global one
    /// (0 = BIRD's default).
    pub fn listen_port(&self, name: &str) -> u16 {
        self.inputs
            .node_config(name)
            .and_then(|c| c.spec.listen_port)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
            .unwrap_or(self.global_listen_port)
    }

    fn selector(&mut self, peer: &str, field: &str, text: &str) -> Option<Selector> {
        match Selector::parse(text) {
            Ok(s) => Some(s),
            Err(e) => {
                self.warnings.push(format!(
                    "BGPPeer {peer}: {field} {text:?} does not parse ({e}); ignoring the peer"
                ));
                None
            }
        }
    }

    fn nodes_matching(&self, sel: &Selector) -> Vec<&'a str> {
        self.inputs
            .nodes
            .iter()
            .filter(|(_, n)| sel.matches(&n.metadata.labels))
            .map(|(name, _)| name.as_str())
            .collect()
    }

    fn is_calico_node(&self, ip: IpAddr) -> bool {
        self.nodes
            .values()
            .any(|n| n.ip(false) == Some(ip) || n.ip(true) == Some(ip))
    }

    /// Calico's nodesWithIPPortAndAS: nodes with address `ip`, AS `asn` (0 = the global
    /// AS) and, when `port` is given, that listen port.
    fn nodes_with_ip_port_as(&self, ip: IpAddr, asn: u32, port: u16) -> Vec<&'a str> {
        let want_as = if asn == 0 { self.global_as } else { asn };
        self.inputs
            .nodes
            .keys()
            .filter(|name| {
                let Some(n) = self.nodes.get(name.as_str()) else {
                    return false;
                };
                if n.ip(false) != Some(ip) && n.ip(true) != Some(ip) {
                    return false;
                }
                if self.node_as(name) != want_as {
                    return false;
                }
                port == 0 || self.listen_port(name) == 0 || self.listen_port(name) == port
            })
            .map(|s| s.as_str())
            .collect()
    }

    /// Calico's nodeAsBGPPeers: a node as a peer, for the families asked for.
    fn node_as_peerings(&self, node: &str, v4: bool, v6: bool, peer: &BGPPeer) -> Vec<Peering> {
        let Some(n) = self.nodes.get(node) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (want, ip) in [(v4, n.ip(false)), (v6, n.ip(true))] {
            let (true, Some(ip)) = (want, ip) else {
                continue;
            };
            let mut p = base_peering(peer, ip);
            p.port = self.listen_port(node);
            p.asn = self.node_as(node);
            p.rr_cluster_id = n.rr_cluster_id.clone();
            // Calico does not carry these for selector peers.
            p.local_asn = None;
            p.allow_local_as = 0;
            out.push(p);
        }
        out
    }

    /// Whether the BGPPeer's local side (node / nodeSelector) selects `node`.
    fn selects_local(&mut self, peer: &BGPPeer, node: &str) -> bool {
        let s = &peer.spec;
        if !s.node_selector.is_empty() {
            let name = peer.metadata.name.clone();
            return self
                .selector(&name, "nodeSelector", &s.node_selector)
                .is_some_and(|sel| {
                    self.inputs
                        .nodes
                        .get(node)
                        .is_some_and(|n| sel.matches(&n.metadata.labels))
                });
        }
        s.node == node
    }

    /// The remote side of a BGPPeer as peerings (peerSelector or peerIP).
    fn remote_peerings(&mut self, peer: &BGPPeer) -> Vec<Peering> {
        let s = &peer.spec;
        let name = peer.metadata.name.clone();
        if !s.peer_selector.is_empty() {
            let Some(sel) = self.selector(&name, "peerSelector", &s.peer_selector) else {
                return Vec::new();
            };
            return self
                .nodes_matching(&sel)
                .into_iter()
                .flat_map(|n| self.node_as_peerings(n, true, true, peer))
                .collect();
        }
        let Some((ip, mut port)) = parse_ip_port(&s.peer_ip) else {
            if !s.peer_ip.is_empty() {
                self.warnings.push(format!(
                    "BGPPeer {name}: peerIP {:?} is not an address; ignoring the peer",
                    s.peer_ip
                ));
            }
            return Vec::new();
        };
        let asn = s.as_number.map_or(0, |a| a.0);
        if port == 0
            && let Some(n) = self.nodes_with_ip_port_as(ip, asn, 0).first()
        {
            port = self.listen_port(n);
        }
        let mut p = base_peering(peer, ip);
        p.port = port;
        p.asn = asn;
        p.calico_node = self.is_calico_node(ip);
        if !s.reachable_by.is_empty() {
            match s.reachable_by.trim().parse::<IpAddr>() {
                Ok(r) if r.is_ipv4() == ip.is_ipv4() => p.reachable_by = Some(r),
                Ok(_) => {
                    self.warnings.push(format!(
                        "BGPPeer {name}: reachableBy {} is not of the peer's address family; ignoring the peer",
                        s.reachable_by
                    ));
                    return Vec::new();
                }
                Err(_) => {
                    self.warnings.push(format!(
                        "BGPPeer {name}: reachableBy {:?} is not an address; ignoring the peer",
                        s.reachable_by
                    ));
                    return Vec::new();
                }
            }
        }
        vec![p]
    }

    /// This node's peerings from the BGPPeers, in Calico's precedence: global peerings
    /// first, then node-specific ones (a node-specific peering to an address a global one
    /// already covers is dropped), then automatic reverse peerings; for each key the first
    /// one wins. BGPPeers are taken in name order so the result is deterministic.
    pub fn peerings(&mut self) -> Peerings {
        let me = self.inputs.node_name.clone();
        let peers: Vec<&BGPPeer> = self.inputs.peers.values().collect();
        let mut out = Peerings::default();
        for global_pass in [true, false] {
            for peer in &peers {
                let s = &peer.spec;
                // Local workload peering needs a workload watcher margay does not have.
                if !s.local_workload_selector.is_empty() {
                    continue;
                }
                let is_global = s.node.is_empty() && s.node_selector.is_empty();
                if is_global != global_pass {
                    continue;
                }
                if !global_pass && !self.selects_local(peer, &me) {
                    continue;
                }
                for p in self.remote_peerings(peer) {
                    let key = (p.ip, p.port);
                    if global_pass {
                        out.global.entry(key).or_insert(p);
                    } else if !out.global.contains_key(&key) {
                        out.node.entry(key).or_insert(p);
                    }
                }
            }
        }
        // Reverse peerings: this node is on the remote side of a BGPPeer, so it peers back
        // with the nodes on its local side.
        for peer in &peers {
            let s = &peer.spec;
            if s.reverse_peering == Some(ReversePeering::Manual)
                || !s.local_workload_selector.is_empty()
            {
                continue;
            }
            let name = peer.metadata.name.clone();
            let (remote_nodes, v4, v6) = if !s.peer_selector.is_empty() {
                let Some(sel) = self.selector(&name, "peerSelector", &s.peer_selector) else {
                    continue;
                };
                (self.nodes_matching(&sel), true, true)
            } else {
                let Some((ip, port)) = parse_ip_port(&s.peer_ip) else {
                    continue;
                };
                let asn = s.as_number.map_or(0, |a| a.0);
                (
                    self.nodes_with_ip_port_as(ip, asn, port),
                    ip.is_ipv4(),
                    ip.is_ipv6(),
                )
            };
            if !remote_nodes.contains(&me.as_str()) {
                continue;
            }
            let local_nodes: Vec<&str> = if !s.node_selector.is_empty() {
                let Some(sel) = self.selector(&name, "nodeSelector", &s.node_selector) else {
                    continue;
                };
                self.nodes_matching(&sel)
            } else if !s.node.is_empty() {
                vec![s.node.as_str()]
            } else {
                self.inputs.nodes.keys().map(String::as_str).collect()
            };
            for n in local_nodes {
                for p in self.node_as_peerings(n, v4, v6, peer) {
                    let key = (p.ip, p.port);
                    if !out.global.contains_key(&key) {
                        out.node.entry(key).or_insert(p);
                    }
                }
            }
        }
        out
    }
}

/// The fields every peering of a BGPPeer shares (Calico's setPeerConfigFieldsFromV3Resource
/// plus the common ones).
fn base_peering(peer: &BGPPeer, ip: IpAddr) -> Peering {
    let s = &peer.spec;
    let (keep_next_hop, next_hop_mode) = match s.next_hop_mode {
        Some(m) => (false, Some(m)),
        None => (s.keep_original_next_hop, None),
    };
    Peering {
        ip,
        port: 0,
        asn: 0,
        local_asn: s.local_as_number.map(|a| a.0),
        source_address: s.source_address.unwrap_or(SourceAddress::UseNodeIp),
        keep_next_hop,
        next_hop_mode,
        calico_node: false,
        ttl_security: s
            .ttl_security
            .and_then(|t| u8::try_from(t).ok())
            .unwrap_or(0),
        filters: s.filters.clone(),
        allow_local_as: s
            .num_allowed_local_as_numbers
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
        reachable_by: None,
        password: s.password.as_ref().and_then(SecretRef::of),
        restart_time: s.max_restart_time.as_ref().and_then(seconds),
        keepalive_time: s.keepalive_time.as_ref().and_then(seconds),
        rr_cluster_id: String::new(),
        origin: peer.metadata.name.clone(),
    }
}

/// A duration in whole seconds (rounded, as Calico does).
pub fn seconds(d: &margay_api::duration::Duration) -> Option<u64> {
    d.to_std().ok().map(|d| (d.as_secs_f64().round()) as u64)
}

/// `10.0.0.1`, `10.0.0.1:1790`, `[fd00::1]:1790` or `fd00::1` → (address, port or 0).
pub fn parse_ip_port(s: &str) -> Option<(IpAddr, u16)> {
    let s = s.trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some((ip, 0));
    }
    if let Ok(sa) = s.parse::<std::net::SocketAddr>() {
        return Some((sa.ip(), sa.port()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_port_forms() {
        let v4: IpAddr = "10.0.0.1".parse().expect("ip");
        let v6: IpAddr = "fd00::1".parse().expect("ip");
        assert_eq!(parse_ip_port("10.0.0.1"), Some((v4, 0)));
        assert_eq!(parse_ip_port("10.0.0.1:1790"), Some((v4, 1790)));
        assert_eq!(parse_ip_port("fd00::1"), Some((v6, 0)));
        assert_eq!(parse_ip_port("[fd00::1]:1790"), Some((v6, 1790)));
        assert_eq!(parse_ip_port("nonsense"), None);
    }
}
