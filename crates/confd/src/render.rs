//! The BIRD 2 configuration of one node (pure): `render(&BirdInputs)` → `bird.cfg` (IPv4)
//! and `bird6.cfg` (IPv6), each a complete, standalone configuration for its own BIRD
//! process, as Calico runs one BIRD per family.
//!
//! The semantics are Calico's (confd's templates and bgp_processor), written for BIRD 2's
//! syntax (channels) instead of Calico's BIRD 1.6 fork:
//! - static protocol: a blackhole per block affine to this node, service ranges
//!   (serviceClusterIPs, non-/32 serviceExternalIPs and, when aggregated,
//!   serviceLoadBalancerIPs) and `via` routes for peers with `reachableBy`;
//! - `calico_aggr()`: a confirmed block is exported as the block, nothing beneath it (a more
//!   specific route only when its kernel metric is elevated, i.e. below the normal priority);
//! - `calico_export_to_bgp_peers()`: pools with disableBGPExport never leave the node;
//!   Felix's tunnel routes (`*.cali`, `*.calico`, `tunl0`) are not sent to iBGP peers; other
//!   pools (no encapsulation, VXLAN, IPIP) are exported;
//! - kernel protocol export filter `calico_kernel_programming`: learned routes go to the
//!   main table, with Calico's metric from the priority, except service ranges and pools whose
//!   cluster routes Felix programs (VXLAN always; IPIP too, as BIRD 2 has no `krt_tunnel`).
//!   Routes of no-encapsulation pools, the local blocks' blackholes included, are programmed
//!   by BIRD, as Calico's BIRD does (`blackhole <block> proto bird`).
//!
//! Output is deterministic: peers, filters, pools, blocks and routes are sorted.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

use margay_api::bgp::{
    BindMode, EnabledDisabled, NextHopMode, ProgramClusterRoutes, SourceAddress,
};
use margay_api::ippool::EncapMode;
use margay_api::net::Cidr;
use margay_ipam::block::AffinityState;
use sha2::{Digest, Sha256};

use crate::filters::{self, BIRD_INT_MAX, Direction};
use crate::model::{BirdInputs, SecretRef};
use crate::peers::{Cluster, NodeBgp, PeerKind, Peering, seconds};

/// Why no configuration could be rendered. The daemon keeps the previous files.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RenderError {
    #[error(
        "node {0:?} has no Node resource (run `margay node startup`, or set NODENAME to the node's name)"
    )]
    NoNode(String),
    #[error(
        "node {0:?} has no BGP address (spec.bgp.ipv4Address / ipv6Address are empty; `margay node startup` sets them)"
    )]
    NoBgpAddress(String),
    #[error("CALICO_ROUTER_ID {0:?} is neither an IPv4 address nor \"hash\"")]
    RouterId(String),
    #[error("BGPFilter {filter}: rule {rule}: {why}")]
    Filter {
        filter: String,
        rule: String,
        why: String,
    },
    #[error("formatting the configuration failed")]
    Format,
}

impl From<std::fmt::Error> for RenderError {
    fn from(_: std::fmt::Error) -> Self {
        RenderError::Format
    }
}

/// The two files and what rendering them noticed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedConfig {
    /// `bird.cfg`: IPv4.
    pub bird: String,
    /// `bird6.cfg`: IPv6.
    pub bird6: String,
    /// Things left out, and why (never a password).
    pub warnings: Vec<String>,
    pub peers_v4: usize,
    pub peers_v6: usize,
    /// Either file holds a BGP password (the writer then keeps it from other users).
    pub has_password: bool,
}

/// The normal route priority (kernel metric) when BGPConfiguration sets none.
const NORMAL_PRIORITY: i64 = 1024;
/// The `preference` that lets an imported route with elevated priority override a local
/// workload route (Calico's birdOverridePreference).
const OVERRIDE_PREFERENCE: u32 = 200;
/// Interfaces whose routes Felix programs and that must not reach iBGP peers: VXLAN,
/// WireGuard and (since BIRD 2 cannot program IPIP routes) IPIP.
const FELIX_TUNNELS: [&str; 3] = ["*.cali", "*.calico", "tunl0"];

pub fn render(inputs: &BirdInputs) -> Result<RenderedConfig, RenderError> {
    let me_node = inputs
        .nodes
        .get(&inputs.node_name)
        .ok_or_else(|| RenderError::NoNode(inputs.node_name.clone()))?;
    let me = NodeBgp::of(me_node);
    if me.v4.is_none() && me.v6.is_none() {
        return Err(RenderError::NoBgpAddress(inputs.node_name.clone()));
    }
    let router_id = router_id(inputs, &me)?;
    let mut cluster = Cluster::new(inputs);
    let peerings = cluster.peerings();
    let mut warnings = std::mem::take(&mut cluster.warnings);
    let mut has_password = false;
    let mut fam = |v6: bool, warnings: &mut Vec<String>| -> Result<(String, usize), RenderError> {
        let f = Family {
            inputs,
            cluster: &cluster,
            me: &me,
            v6,
            router_id,
        };
        let peers = f.peers(&peerings, warnings);
        has_password |= peers.values().any(|p| p.password.is_some());
        let text = f.render(&peers, &peerings)?;
        Ok((text, peers.len()))
    };
    let (bird, peers_v4) = fam(false, &mut warnings)?;
    let (bird6, peers_v6) = fam(true, &mut warnings)?;
    Ok(RenderedConfig {
        bird,
        bird6,
        warnings,
        peers_v4,
        peers_v6,
        has_password,
    })
}

/// Calico's rule: CALICO_ROUTER_ID `hash` (an IPv4 address from the node name's SHA-256),
/// an explicit IPv4 address, else the node's IPv4 address. A node without IPv4 and without
/// CALICO_ROUTER_ID gets the hash (Calico would render an empty router id and fail).
fn router_id(inputs: &BirdInputs, me: &NodeBgp) -> Result<Ipv4Addr, RenderError> {
    match inputs.router_id.as_deref().map(str::trim) {
        Some("hash") => Ok(hash_router_id(&inputs.node_name)),
        Some(s) if !s.is_empty() => s
            .parse::<Ipv4Addr>()
            .map_err(|_| RenderError::RouterId(s.to_string())),
        _ => match me.ip(false) {
            Some(IpAddr::V4(a)) => Ok(a),
            _ => Ok(hash_router_id(&inputs.node_name)),
        },
    }
}

/// Calico's HashToIPv4: the first four bytes of SHA-256(name), the first one moved out of
/// the multicast/reserved range (> 223 → minus 32).
pub fn hash_router_id(name: &str) -> Ipv4Addr {
    let d = Sha256::digest(name.as_bytes());
    let first = if d[0] > 223 { d[0] - 32 } else { d[0] };
    Ipv4Addr::new(first, d[1], d[2], d[3])
}

/// One BGP session as rendered. Its Debug shows the password as `<redacted>`.
#[derive(Clone)]
struct Peer {
    ip: IpAddr,
    port: u16,
    asn: u32,
    local_asn: Option<u32>,
    source: Option<IpAddr>,
    /// None: `ttl security off; multihop;`.
    ttl_security: Option<u8>,
    passive: bool,
    restart_time: Option<u64>,
    keepalive_time: Option<u64>,
    rr_cluster_id: Option<String>,
    password: Option<String>,
    next_hop_self: bool,
    next_hop_keep: bool,
    allow_local_as: u32,
    filters: Vec<String>,
    same_as: bool,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("ip", &self.ip)
            .field("port", &self.port)
            .field("asn", &self.asn)
            .field("local_asn", &self.local_asn)
            .field("source", &self.source)
            .field("ttl_security", &self.ttl_security)
            .field("passive", &self.passive)
            .field("restart_time", &self.restart_time)
            .field("keepalive_time", &self.keepalive_time)
            .field("rr_cluster_id", &self.rr_cluster_id)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("next_hop_self", &self.next_hop_self)
            .field("next_hop_keep", &self.next_hop_keep)
            .field("allow_local_as", &self.allow_local_as)
            .field("filters", &self.filters)
            .field("same_as", &self.same_as)
            .finish()
    }
}

struct Family<'a> {
    inputs: &'a BirdInputs,
    cluster: &'a Cluster<'a>,
    me: &'a NodeBgp,
    v6: bool,
    router_id: Ipv4Addr,
}

impl Family<'_> {
    fn my_ip(&self) -> Option<IpAddr> {
        self.me.ip(self.v6)
    }

    fn of_family(&self, ip: IpAddr) -> bool {
        ip.is_ipv6() == self.v6
    }

    fn cidr_of_family(&self, c: &str) -> Option<Cidr> {
        Cidr::parse(c.trim())
            .ok()
            .map(|c| c.network())
            .filter(|c| c.is_ipv4() != self.v6)
    }

    fn my_as(&self) -> u32 {
        self.cluster.node_as(&self.inputs.node_name)
    }

    fn normal_priority(&self) -> i64 {
        let g = self.inputs.global_config().map(|c| &c.spec);
        let p = if self.v6 {
            g.and_then(|s| s.ipv6_normal_route_priority)
        } else {
            g.and_then(|s| s.ipv4_normal_route_priority)
        };
        p.unwrap_or(NORMAL_PRIORITY)
    }

    /// The BIRD log level: `node.<name>` then `default` logSeverityScreen; debug → all,
    /// info or unset → states, anything else → none (Calico's mapping).
    fn log_level(&self) -> &'static str {
        let level = self
            .inputs
            .node_config(&self.inputs.node_name)
            .map(|c| c.spec.log_severity_screen.as_str())
            .filter(|s| !s.is_empty())
            .or_else(|| {
                self.inputs
                    .global_config()
                    .map(|c| c.spec.log_severity_screen.as_str())
                    .filter(|s| !s.is_empty())
            })
            .map(str::to_ascii_lowercase);
        match level.as_deref() {
            None | Some("info") => "info",
            Some("debug") => "debug",
            Some(_) => "none",
        }
    }

    fn password(
        &self,
        r: &Option<SecretRef>,
        what: &str,
        warnings: &mut Vec<String>,
    ) -> Result<Option<String>, ()> {
        let Some(r) = r else { return Ok(None) };
        match self.inputs.secrets.get(r) {
            Some(p) if filters::bird_string(p).is_ok() && !p.is_empty() => Ok(Some(p.clone())),
            Some(_) => {
                warnings.push(format!(
                    "{what}: the password in secret {r} is empty or holds a quote, backslash or line break; leaving the session out"
                ));
                Err(())
            }
            None => {
                warnings.push(format!(
                    "{what}: the password secret {r} cannot be read; leaving the session out rather than connecting without it"
                ));
                Err(())
            }
        }
    }

    /// Every session of this family, by protocol name.
    fn peers(
        &self,
        peerings: &crate::peers::Peerings,
        warnings: &mut Vec<String>,
    ) -> BTreeMap<String, Peer> {
        let mut out = BTreeMap::new();
        let Some(my_ip) = self.my_ip() else {
            return out;
        };
        let my_as = self.my_as();
        let global = self.inputs.global_config().map(|c| &c.spec);
        let mesh_on = global
            .and_then(|s| s.node_to_node_mesh_enabled)
            .unwrap_or(true);
        // A route reflector does not take part in the mesh.
        if mesh_on && self.me.rr_cluster_id.is_empty() {
            let mesh_pw = global
                .and_then(|s| s.node_mesh_password.as_ref())
                .and_then(SecretRef::of);
            let mesh_restart = global
                .and_then(|s| s.node_mesh_max_restart_time.as_ref())
                .and_then(seconds);
            let password = self.password(&mesh_pw, "node-to-node mesh", warnings);
            if let Ok(password) = password {
                for (name, n) in &self.cluster.nodes {
                    let Some(ip) = n.ip(self.v6) else { continue };
                    if ip == my_ip || !n.rr_cluster_id.is_empty() {
                        continue;
                    }
                    let asn = self.cluster.node_as(name);
                    let peer = Peer {
                        ip,
                        port: self.cluster.listen_port(name),
                        asn,
                        local_asn: None,
                        source: Some(my_ip),
                        ttl_security: None,
                        // One side connects: the lower address, as Calico decides it (as text).
                        passive: ip.to_string() > my_ip.to_string(),
                        restart_time: mesh_restart,
                        keepalive_time: None,
                        rr_cluster_id: None,
                        password: password.clone(),
                        next_hop_self: false,
                        next_hop_keep: false,
                        allow_local_as: 0,
                        filters: Vec::new(),
                        same_as: asn == my_as,
                    };
                    out.entry(peer_name(PeerKind::Mesh, ip, 0)).or_insert(peer);
                }
            }
        }
        for (kind, map) in [
            (PeerKind::Global, &peerings.global),
            (PeerKind::Node, &peerings.node),
        ] {
            for p in map.values() {
                if !self.of_family(p.ip) || p.ip == my_ip {
                    continue;
                }
                let what = format!("BGPPeer {} ({})", p.origin, p.ip);
                let Ok(password) = self.password(&p.password, &what, warnings) else {
                    continue;
                };
                let peer = self.peer_from(kind, p, my_ip, password);
                out.entry(peer_name(kind, p.ip, p.port)).or_insert(peer);
            }
        }
        out
    }

    /// Calico's buildPeerFromData.
    fn peer_from(
        &self,
        kind: PeerKind,
        p: &Peering,
        my_ip: IpAddr,
        password: Option<String>,
    ) -> Peer {
        let effective_as = p.local_asn.unwrap_or_else(|| self.my_as());
        let same_as = p.asn == effective_as;
        let mine = &self.me.rr_cluster_id;
        let rr_client = same_as && !mine.is_empty() && p.rr_cluster_id != *mine;
        let auto_passive = matches!(kind, PeerKind::Global)
            && p.calico_node
            && p.ip.to_string() > my_ip.to_string();
        Peer {
            ip: p.ip,
            port: p.port,
            asn: p.asn,
            local_asn: p.local_asn,
            source: match p.source_address {
                SourceAddress::UseNodeIp => Some(my_ip),
                SourceAddress::None => None,
            },
            ttl_security: (p.ttl_security > 0).then_some(p.ttl_security),
            passive: auto_passive,
            restart_time: p.restart_time,
            keepalive_time: p.keepalive_time,
            rr_cluster_id: rr_client.then(|| mine.clone()),
            password,
            next_hop_self: p.next_hop_mode == Some(NextHopMode::Self_),
            next_hop_keep: p.next_hop_mode == Some(NextHopMode::Keep)
                || (p.keep_next_hop && !same_as),
            allow_local_as: p.allow_local_as,
            filters: p.filters.clone(),
            same_as,
        }
    }

    /// Service ranges this node announces (Calico's static routes) and those it must never
    /// program into the kernel (its reject routes), for this family.
    fn service_ranges(&self) -> (Vec<Cidr>, Vec<Cidr>) {
        let Some(g) = self.inputs.global_config().map(|c| &c.spec) else {
            return (Vec::new(), Vec::new());
        };
        let single = |c: &Cidr| c.prefix() == if c.is_ipv4() { 32 } else { 128 };
        let mut ranges: Vec<Cidr> = Vec::new();
        ranges.extend(
            g.service_cluster_ips
                .iter()
                .filter_map(|b| self.cidr_of_family(&b.cidr)),
        );
        // Single addresses are per-service announcements (needing Kubernetes services,
        // which margay does not watch); ranges are announced by every node.
        ranges.extend(
            g.service_external_ips
                .iter()
                .filter_map(|b| self.cidr_of_family(&b.cidr))
                .filter(|c| !single(c)),
        );
        if g.service_load_balancer_aggregation != Some(EnabledDisabled::Disabled) {
            ranges.extend(
                g.service_load_balancer_ips
                    .iter()
                    .filter_map(|b| self.cidr_of_family(&b.cidr))
                    .filter(|c| !single(c)),
            );
        }
        ranges.sort();
        ranges.dedup();
        let excluded = self
            .inputs
            .nodes
            .get(&self.inputs.node_name)
            .and_then(|n| {
                n.metadata
                    .labels
                    .get("node.kubernetes.io/exclude-from-external-load-balancers")
            })
            .is_some_and(|v| v == "true");
        let announce = if excluded { Vec::new() } else { ranges.clone() };
        (announce, ranges)
    }

    fn render(
        &self,
        peers: &BTreeMap<String, Peer>,
        peerings: &crate::peers::Peerings,
    ) -> Result<String, RenderError> {
        let mut o = String::with_capacity(4096 + peers.len() * 1200);
        let fam = if self.v6 { "IPv6" } else { "IPv4" };
        let ch = if self.v6 { "ipv6" } else { "ipv4" };
        let prio = self.normal_priority();
        let level = self.log_level();
        let (announce, reject) = self.service_ranges();
        writeln!(
            o,
            "# Generated by margay confd for node {} ({fam}). Do not edit: changes are overwritten.\n",
            self.inputs.node_name
        )?;
        writeln!(o, "router id {};\n", self.router_id)?;

        // Communities for prefix advertisements: `node.<name>` first, else `default`.
        writeln!(o, "function apply_communities ()\n{{")?;
        for (cidr, adds) in self.community_rules() {
            writeln!(o, "  if ( net ~ {cidr} ) then {{")?;
            for a in adds {
                writeln!(o, "    {a}")?;
            }
            writeln!(o, "  }}")?;
        }
        writeln!(o, "}}\n")?;

        writeln!(o, "# -------------- BGP Filters ------------------")?;
        filters::functions(self.inputs.filters.iter(), self.v6, &mut o)?;
        writeln!(o)?;

        // The blocks affine to this node.
        let blocks: Vec<(Cidr, AffinityState)> = self
            .inputs
            .affinities
            .iter()
            .filter(|(c, _)| c.is_ipv4() != self.v6)
            .map(|(c, s)| (c.network(), *s))
            .collect();
        writeln!(
            o,
            "# Aggregation of routes on this host; export the block, nothing beneath it.\nfunction calico_aggr ()\n{{"
        )?;
        for (c, state) in &blocks {
            match state {
                AffinityState::Confirmed => {
                    writeln!(o, "  # Block {c} is confirmed.")?;
                    writeln!(o, "  if ( net = {c} ) then {{ accept; }}")?;
                    writeln!(
                        o,
                        "  if ( net ~ {c} && krt_metric < {prio} ) then {{ accept; }}"
                    )?;
                    writeln!(o, "  if ( net ~ {c} ) then {{ reject; }}")?;
                }
                AffinityState::Pending => writeln!(o, "  # Block {c} is pending.")?,
                AffinityState::PendingDeletion => writeln!(o, "  # Block {c} is pendingDeletion.")?,
            }
        }
        writeln!(o, "}}\n")?;

        writeln!(
            o,
            "function reject_local_routes ()\n{{\n  # Local routes learned via BPF never leave the node.\n  if (defined(ifname)) then {{\n    if (ifname ~ \"bpf*.cali\") then {{ reject; }}\n  }}\n}}\n"
        )?;

        let (pool_reject, pool_accept, pool_kernel) = self.pool_statements();
        writeln!(
            o,
            "function calico_export_to_bgp_peers (bool internal_peer)\n{{"
        )?;
        for l in &pool_reject {
            writeln!(o, "{l}")?;
        }
        let tunnels: Vec<String> = FELIX_TUNNELS
            .iter()
            .map(|p| format!("(ifname ~ \"{p}\")"))
            .collect();
        writeln!(
            o,
            "  if (internal_peer) then {{\n    # Felix programs tunnel routes on every node: never pass them on over iBGP.\n    if (defined(ifname)) then {{\n      if ({}) then {{ reject; }}\n    }}\n  }}",
            tunnels.join(" || ")
        )?;
        writeln!(
            o,
            "  reject_local_routes();\n  apply_communities();\n  calico_aggr();"
        )?;
        for c in &announce {
            writeln!(o, "  if ( net ~ {c} ) then {{ accept; }} # Service range.")?;
        }
        if !self.me.rr_cluster_id.is_empty() {
            // A route reflector passes on the service addresses its clients announce.
            if let Some(g) = self.inputs.global_config() {
                let mut rr: Vec<Cidr> = g
                    .spec
                    .service_load_balancer_ips
                    .iter()
                    .chain(&g.spec.service_external_ips)
                    .filter_map(|b| self.cidr_of_family(&b.cidr))
                    .collect();
                rr.sort();
                rr.dedup();
                for c in rr {
                    writeln!(
                        o,
                        "  if ( net ~ {c} ) then {{ accept; }} # Service addresses (route reflector)."
                    )?;
                }
            }
        }
        for l in &pool_accept {
            writeln!(o, "{l}")?;
        }
        writeln!(o, "}}\n")?;

        writeln!(o, "filter calico_kernel_programming\n{{")?;
        // BIRD 2 would program the direct protocol's connected networks too (BIRD 1.6, which
        // Calico's filter was written for, did not): they are the kernel's own.
        writeln!(
            o,
            "  if (defined(source) && source = RTS_DEVICE) then {{ reject; }}"
        )?;
        for c in &reject {
            writeln!(
                o,
                "  if ( net ~ {c} ) then {{ reject; }} # Service range: not programmed."
            )?;
        }
        writeln!(
            o,
            "  if (defined(source) && (source = RTS_BGP) && !defined(krt_metric)) then {{\n    krt_metric = {prio};\n    if (defined(bgp_local_pref)) then {{\n      krt_metric = {BIRD_INT_MAX} - bgp_local_pref;\n    }}\n    if (krt_metric < {prio}) then {{\n      preference = {OVERRIDE_PREFERENCE};\n    }}\n  }}"
        )?;
        for l in self.wireguard_rejects() {
            writeln!(o, "{l}")?;
        }
        for l in &pool_kernel {
            writeln!(o, "{l}")?;
        }
        writeln!(o, "  accept;\n}}\n")?;

        // Static routes: block blackholes, service ranges, routes to reachableBy peers.
        let max_len = if self.v6 { 128 } else { 32 };
        let block_routes: Vec<&Cidr> = blocks
            .iter()
            .map(|(c, _)| c)
            .filter(|c| c.prefix() != max_len)
            .collect();
        let mut via: Vec<(IpAddr, IpAddr)> = [&peerings.global, &peerings.node]
            .into_iter()
            .flat_map(|m| m.values())
            .filter(|p| self.of_family(p.ip))
            .filter_map(|p| p.reachable_by.map(|r| (p.ip, r)))
            .collect();
        via.sort();
        via.dedup();
        if block_routes.is_empty() && announce.is_empty() && via.is_empty() {
            writeln!(o, "# No IP blocks or static routes for this host.\n")?;
        } else {
            writeln!(o, "protocol static {{\n  {ch};")?;
            if !block_routes.is_empty() {
                writeln!(o, "  # IP blocks for this host.")?;
                for c in block_routes {
                    writeln!(o, "  route {c} blackhole;")?;
                }
            }
            if !announce.is_empty() {
                writeln!(o, "  # Service ranges.")?;
                for c in &announce {
                    writeln!(o, "  route {c} blackhole;")?;
                }
            }
            if !via.is_empty() {
                writeln!(o, "  # Routes to BGP peers with reachableBy.")?;
                for (ip, gw) in &via {
                    writeln!(o, "  route {ip}/{max_len} via {gw};")?;
                }
            }
            writeln!(o, "}}\n")?;
        }

        let debug = match level {
            "debug" => "  debug all;\n",
            "info" => "  debug { states };\n",
            _ => "",
        };
        writeln!(
            o,
            "# Routes between BIRD and the kernel's main table.\nprotocol kernel {{\n  learn;             # Learn alien routes from the kernel.\n  persist;           # Keep routes in the kernel when BIRD stops.\n  scan time 2;\n  graceful restart;\n  merge paths on;    # ECMP.\n  {ch} {{\n    import all;\n    export filter calico_kernel_programming;\n  }};\n}}\n"
        )?;
        writeln!(o, "protocol device {{\n{debug}  scan time 2;\n}}\n")?;
        let mut ifaces: Vec<String> = self
            .inputs
            .global_config()
            .map(|c| c.spec.ignored_interfaces.clone())
            .unwrap_or_default()
            .iter()
            .filter(|i| filters::bird_string(i).is_ok())
            .map(|i| format!("-\"{i}\""))
            .collect();
        // Workload interfaces and kube-ipvs0 (one address per cluster IP) are not networks
        // to announce; service ranges are announced through static routes instead.
        ifaces.extend([
            "-\"cali*\"".into(),
            "-\"kube-ipvs*\"".into(),
            "\"*\"".into(),
        ]);
        writeln!(
            o,
            "protocol direct {{\n{debug}  {ch};\n  interface {};\n}}\n",
            ifaces.join(", ")
        )?;

        let Some(my_ip) = self.my_ip() else {
            writeln!(
                o,
                "# {fam} is disabled on this node (no BGP {fam} address)."
            )?;
            return Ok(o);
        };
        // Listening on the node's address (bindMode NodeIP) needs `strict bind`.
        let bind_node_ip =
            self.inputs.global_config().and_then(|c| c.spec.bind_mode) == Some(BindMode::NodeIp);
        let listen_port = self.cluster.listen_port(&self.inputs.node_name);
        let mut local = String::from("local");
        if bind_node_ip {
            let _ = write!(local, " {my_ip}");
        }
        if listen_port != 0 {
            let _ = write!(local, " port {listen_port}");
        }
        let peer_debug = match level {
            "debug" => "  debug all;\n",
            "info" => "  debug { states, routes, filters, events };\n",
            _ => "",
        };
        writeln!(
            o,
            "# Template for all BGP sessions.\ntemplate bgp bgp_template {{\n{peer_debug}  description \"Connection to BGP peer\";\n  {local} as {};\n{}  graceful restart;\n  connect delay time 2;\n  connect retry time 5;\n  error wait time 5,30;\n}}\n",
            self.my_as(),
            if bind_node_ip {
                "  strict bind;         # Listen on the node's address only.\n"
            } else {
                ""
            }
        )?;
        if peers.is_empty() {
            writeln!(o, "# No BGP peers configured for this node.")?;
            return Ok(o);
        }
        writeln!(o, "# BGP sessions.")?;
        let fsuffix = |dir| (dir, self.v6);
        for (name, p) in peers {
            writeln!(o, "protocol bgp {name} from bgp_template {{")?;
            if let Some(l) = p.local_asn {
                writeln!(o, "  local as {l};")?;
            }
            if p.port != 0 {
                writeln!(o, "  neighbor {} port {} as {};", p.ip, p.port, p.asn)?;
            } else {
                writeln!(o, "  neighbor {} as {};", p.ip, p.asn)?;
            }
            if let Some(s) = p.source {
                writeln!(o, "  source address {s};")?;
            }
            match p.ttl_security {
                Some(hops) => writeln!(o, "  ttl security on;\n  multihop {hops};")?,
                None => writeln!(o, "  ttl security off;\n  multihop;")?,
            }
            if p.passive {
                writeln!(o, "  passive on;")?;
            }
            if let Some(t) = p.restart_time {
                writeln!(o, "  graceful restart time {t};")?;
            }
            if let Some(t) = p.keepalive_time {
                writeln!(o, "  keepalive time {t};")?;
            }
            if let Some(id) = &p.rr_cluster_id {
                writeln!(o, "  rr client;\n  rr cluster id {id};")?;
            }
            if let Some(pw) = &p.password {
                writeln!(o, "  password \"{pw}\";")?;
            }
            if p.allow_local_as > 0 {
                writeln!(o, "  allow local as {};", p.allow_local_as)?;
            }
            writeln!(o, "  {ch} {{\n    gateway recursive;\n    add paths on;")?;
            if p.next_hop_keep {
                writeln!(o, "    next hop keep;")?;
            }
            if p.next_hop_self {
                writeln!(o, "    next hop self;")?;
            }
            writeln!(o, "    import filter {{")?;
            for call in self.filter_calls(&p.filters, fsuffix(Direction::Import), p.same_as) {
                writeln!(o, "      {call}")?;
            }
            writeln!(
                o,
                "      if (defined(bgp_local_pref)&&(bgp_local_pref > {})) then\n        preference = {OVERRIDE_PREFERENCE};\n      accept;\n    }};",
                BIRD_INT_MAX - prio
            )?;
            writeln!(
                o,
                "    export filter {{\n      if (defined(source) && source = RTS_BGP && defined(bgp_local_pref)) then {{\n        krt_metric = {BIRD_INT_MAX} - bgp_local_pref;\n      }} else {{\n        if (!defined(krt_metric)) then {{ krt_metric = {prio}; }}\n        bgp_local_pref = {BIRD_INT_MAX} - krt_metric;\n      }}"
            )?;
            for call in self.filter_calls(&p.filters, fsuffix(Direction::Export), p.same_as) {
                writeln!(o, "      {call}")?;
            }
            writeln!(
                o,
                "      calico_export_to_bgp_peers({});\n      reject;\n    }};\n  }};\n}}\n",
                p.same_as
            )?;
        }
        Ok(o)
    }

    /// Calls to the BGPFilter functions a peer names, in its order; names of filters that
    /// do not exist or have no rules for this family and direction are skipped (Calico).
    fn filter_calls(
        &self,
        names: &[String],
        (dir, v6): (Direction, bool),
        same_as: bool,
    ) -> Vec<String> {
        names
            .iter()
            .filter_map(|n| {
                let f = self.inputs.filters.get(n)?;
                let rules = filters::rules(f, dir, v6);
                if rules.is_empty() {
                    return None;
                }
                let fname = filters::function_name(n, dir, v6);
                Some(if filters::has_peer_type(rules) {
                    format!("{fname}({same_as});")
                } else {
                    format!("{fname}();")
                })
            })
            .collect()
    }

    /// (cidr, community additions) for the prefix advertisements of this family.
    fn community_rules(&self) -> Vec<(Cidr, Vec<String>)> {
        let node_cfg = self
            .inputs
            .node_config(&self.inputs.node_name)
            .filter(|c| !c.spec.prefix_advertisements.is_empty());
        let Some(cfg) = node_cfg.or_else(|| self.inputs.global_config()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for adv in &cfg.spec.prefix_advertisements {
            let Some(cidr) = self.cidr_of_family(&adv.cidr) else {
                continue;
            };
            let mut values: Vec<String> = adv
                .communities
                .iter()
                .filter_map(|c| {
                    if filters::community(c).is_ok() {
                        Some(c.trim().to_string())
                    } else {
                        // A name defined under spec.communities.
                        cfg.spec
                            .communities
                            .iter()
                            .find(|d| d.name == *c)
                            .map(|d| d.value.trim().to_string())
                    }
                })
                .collect();
            values.sort();
            values.dedup();
            let adds: Vec<String> = values
                .iter()
                .filter_map(|v| {
                    filters::community(v)
                        .ok()
                        .map(|p| filters::community_add(&p))
                })
                .collect();
            if !adds.is_empty() {
                out.push((cidr, adds));
            }
        }
        out
    }

    /// (export rejects, export accepts, kernel statements) for the pools of this family,
    /// each list sorted (Calico's processIPPool).
    fn pool_statements(&self) -> (Vec<String>, Vec<String>, Vec<String>) {
        let policy = self
            .inputs
            .global_config()
            .and_then(|c| c.spec.program_cluster_routes);
        // BIRD programs no-encapsulation pools unless BGPConfiguration hands them to Felix.
        let bird_programs_no_encap = !matches!(
            policy,
            Some(ProgramClusterRoutes::Disabled | ProgramClusterRoutes::EnabledIpipOnly)
        );
        let (mut rej, mut acc, mut kern) = (Vec::new(), Vec::new(), Vec::new());
        for pool in self.inputs.pools.values() {
            let Some(cidr) = self.cidr_of_family(&pool.spec.cidr) else {
                continue;
            };
            let on = |m: Option<EncapMode>| {
                matches!(m, Some(EncapMode::Always | EncapMode::CrossSubnet))
            };
            let vxlan = on(pool.spec.vxlan_mode);
            let ipip = on(pool.spec.ipip_mode);
            if pool.spec.disable_bgp_export {
                rej.push(format!(
                    "  if (net ~ {cidr}) then {{ reject; }} # BGP export is disabled."
                ));
            } else {
                acc.push(format!("  if (net ~ {cidr}) then {{ accept; }}"));
            }
            let kernel = if vxlan {
                format!(
                    "  if (net ~ {cidr}) then {{ reject; }} # VXLAN routes are handled by Felix."
                )
            } else if ipip || !bird_programs_no_encap {
                format!(
                    "  if (net ~ {cidr}) then {{ reject; }} # Cluster routes are handled by Felix."
                )
            } else {
                format!("  if (net ~ {cidr}) then {{ accept; }}")
            };
            // IPv6 needs only the rejections: the filter accepts by default.
            if !self.v6 || kernel.contains("reject;") {
                kern.push(kernel);
            }
        }
        rej.sort();
        acc.sort();
        kern.sort();
        (rej, acc, kern)
    }

    /// When this node runs WireGuard, Felix routes to other WireGuard nodes over the tunnel:
    /// BIRD must not program routes through them.
    fn wireguard_rejects(&self) -> Vec<String> {
        let wg = |n: &NodeBgp| {
            if self.v6 {
                n.wireguard_v6
            } else {
                n.wireguard_v4
            }
        };
        if !wg(self.me) {
            return Vec::new();
        }
        let mut out: Vec<String> = self
            .cluster
            .nodes
            .iter()
            .filter(|(name, n)| **name != self.inputs.node_name && wg(n))
            .filter_map(|(_, n)| n.ip(self.v6))
            .map(|ip| {
                format!("  if (defined(bgp_next_hop) && bgp_next_hop = {ip}) then {{ reject; }} # WireGuard routes are handled by Felix.")
            })
            .collect();
        out.sort();
        out
    }
}

/// `Mesh_10_0_0_2`, `Global_fd00__1`, `Node_10_0_0_9_port_1790`.
pub fn peer_name(kind: PeerKind, ip: IpAddr, port: u16) -> String {
    let addr = ip.to_string().replace(['.', ':'], "_");
    if port > 0 {
        format!("{}_{addr}_port_{port}", kind.prefix())
    } else {
        format!("{}_{addr}", kind.prefix())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_id_hash_matches_calico() {
        // sha256("node1") = 0x4e2c…: first byte 0x4e = 78.
        let id = hash_router_id("node1");
        let d = Sha256::digest(b"node1");
        assert_eq!(id.octets()[1..], d[1..4]);
        assert!(id.octets()[0] <= 223);
    }

    #[test]
    fn names() {
        let v4: IpAddr = "10.0.0.2".parse().expect("ip");
        let v6: IpAddr = "fd00::1".parse().expect("ip");
        assert_eq!(peer_name(PeerKind::Mesh, v4, 0), "Mesh_10_0_0_2");
        assert_eq!(
            peer_name(PeerKind::Node, v4, 1790),
            "Node_10_0_0_2_port_1790"
        );
        assert_eq!(peer_name(PeerKind::Global, v6, 0), "Global_fd00__1");
    }
}
