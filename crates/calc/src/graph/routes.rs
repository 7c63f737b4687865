//! Nodes, pools and routes: route sources per CIDR, the route and VTEP each node's
//! addresses, blocks and tunnel addresses make, and the encapsulation in force.

use super::*;

impl CalcGraph {
    /// Changes one CIDR's route sources; `f` reports which node (if any) it added and
    /// removed a source for.
    pub(super) fn modify_sources(
        &mut self,
        cidr: Cidr,
        f: impl FnOnce(&mut CidrSources) -> NodeDelta,
    ) {
        let entry = self.route_sources.entry(cidr).or_default();
        let delta = f(entry);
        if entry.is_empty() {
            self.route_sources.remove(&cidr);
        }
        if delta.added != delta.removed {
            if let Some(n) = delta.removed
                && let Some(counts) = self.node_cidrs.get_mut(&n)
            {
                if let Some(c) = counts.get_mut(&cidr) {
                    *c -= 1;
                    if *c == 0 {
                        counts.remove(&cidr);
                    }
                }
                if counts.is_empty() {
                    self.node_cidrs.remove(&n);
                }
            }
            if let Some(n) = delta.added {
                match self.node_cidrs.get_mut(&n) {
                    Some(counts) => *counts.entry(cidr).or_insert(0) += 1,
                    None => {
                        self.node_cidrs.insert(n, HashMap::from([(cidr, 1)]));
                    }
                }
            }
        }
        self.dirty_cidrs.insert(cidr);
    }

    pub(super) fn update_node(
        &mut self,
        name: &str,
        value: Option<(BTreeMap<String, String>, NodeSpec)>,
    ) {
        let info = value.map(|(labels, spec)| {
            let bgp = spec.bgp.clone().unwrap_or_default();
            let cidr = |s: &str| {
                if s.is_empty() {
                    None
                } else {
                    Cidr::parse_cidr_or_ip(s).ok()
                }
            };
            let ip = |s: &str| cidr(s).map(|c| c.addr());
            NodeInfo {
                ipv4: cidr(&bgp.ipv4_address).filter(Cidr::is_ipv4),
                ipv6: cidr(&bgp.ipv6_address).filter(|c| !c.is_ipv4()),
                vxlan_v4: ip(&spec.ipv4_vxlan_tunnel_addr),
                vxlan_v6: ip(&spec.ipv6_vxlan_tunnel_addr),
                vxlan_mac: spec.vxlan_tunnel_mac_addr.clone(),
                vxlan_mac_v6: spec.vxlan_tunnel_mac_addr_v6.clone(),
                ipip_addr: ip(&bgp.ipv4_ipip_tunnel_addr),
                labels,
            }
        });
        let old = match &info {
            Some(i) => self.nodes.insert(name.to_string(), i.clone()),
            None => self.nodes.remove(name),
        };
        if old == info {
            return;
        }
        let old = old.unwrap_or_default();
        let new = info.unwrap_or_default();
        let host_cidrs = |i: &NodeInfo| -> Vec<Cidr> {
            [
                i.ipv4.map(|c| Cidr::host(c.addr())),
                i.ipv6.map(|c| Cidr::host(c.addr())),
            ]
            .into_iter()
            .flatten()
            .collect()
        };
        let tunnel_cidrs = |i: &NodeInfo| -> Vec<Cidr> {
            [i.vxlan_v4, i.vxlan_v6, i.ipip_addr]
                .into_iter()
                .flatten()
                .map(Cidr::host)
                .collect()
        };
        for c in host_cidrs(&old) {
            self.modify_sources(c, |s| NodeDelta {
                removed: s.hosts.remove(name).then(|| name.to_string()),
                added: None,
            });
        }
        for c in tunnel_cidrs(&old) {
            self.modify_sources(c, |s| NodeDelta {
                removed: s.tunnels.remove(name).then(|| name.to_string()),
                added: None,
            });
        }
        for c in host_cidrs(&new) {
            self.modify_sources(c, |s| NodeDelta {
                removed: None,
                added: s.hosts.insert(name.to_string()).then(|| name.to_string()),
            });
        }
        for c in tunnel_cidrs(&new) {
            self.modify_sources(c, |s| NodeDelta {
                removed: None,
                added: s.tunnels.insert(name.to_string()).then(|| name.to_string()),
            });
        }
        // Routes towards the node carry its address.
        if let Some(cidrs) = self.node_cidrs.get(name) {
            self.dirty_cidrs.extend(cidrs.keys().copied());
        }
        if name == self.config.hostname && old.ipv4 != new.ipv4 {
            // "Same subnet" is judged against this node's own address.
            self.dirty_cidrs.extend(self.route_sources.keys().copied());
        }
        self.dirty_nodes.insert(name.to_string());
    }

    pub(super) fn update_pool(
        &mut self,
        name: &str,
        spec: Option<IPPoolSpec>,
    ) -> Result<(), String> {
        let mut err = None;
        let pool = spec.and_then(|spec| match Cidr::parse(&spec.cidr) {
            Ok(c) => Some(PoolData {
                cidr: c.network(),
                masquerade: spec.nat_outgoing,
                ipip: encap(spec.ipip_mode),
                vxlan: encap(spec.vxlan_mode),
                disabled: spec.disabled,
            }),
            Err(e) => {
                err = Some(format!("spec.cidr: {e}"));
                None
            }
        });
        let old = match &pool {
            Some(p) => self.pools.insert(name.to_string(), p.clone()),
            None => self.pools.remove(name),
        };
        if old == pool {
            return err.map_or(Ok(()), Err);
        }
        if let Some(old) = &old {
            self.modify_sources(old.cidr, |s| {
                s.pool = None;
                NodeDelta::default()
            });
        }
        if let Some(new) = &pool {
            let p = new.clone();
            self.modify_sources(new.cidr, |s| {
                s.pool = Some(p);
                NodeDelta::default()
            });
        }
        // Every route inside the old or new pool takes its encapsulation and NAT from it.
        let ranges: Vec<Cidr> = old.iter().chain(pool.iter()).map(|p| p.cidr).collect();
        let inside: Vec<Cidr> = self
            .route_sources
            .keys()
            .filter(|c| {
                ranges
                    .iter()
                    .any(|r| r.prefix() <= c.prefix() && r.contains(c.addr()))
            })
            .copied()
            .collect();
        self.dirty_cidrs.extend(inside);
        // Pools with the same CIDR under another name still count.
        for (other_name, p) in &self.pools {
            if other_name != name && ranges.contains(&p.cidr) {
                let p = p.clone();
                let cidr = p.cidr;
                let entry = self.route_sources.entry(cidr).or_default();
                entry.pool = Some(p);
            }
        }
        self.dirty_pools.insert(name.to_string());
        err.map_or(Ok(()), Err)
    }

    pub(super) fn containing_pool(&self, cidr: &Cidr) -> Option<&PoolData> {
        self.pools
            .values()
            .filter(|p| {
                p.cidr.is_ipv4() == cidr.is_ipv4()
                    && p.cidr.prefix() <= cidr.prefix()
                    && p.cidr.contains(cidr.addr())
            })
            .max_by(|a, b| {
                a.cidr
                    .prefix()
                    .cmp(&b.cidr.prefix())
                    .then_with(|| b.cidr.cmp(&a.cidr))
            })
    }

    pub(super) fn block_owner(&self, ip: IpAddr) -> Option<&String> {
        let max = if ip.is_ipv4() { 32 } else { 128 };
        (0..=max).rev().find_map(|len| {
            let c = Cidr::new(ip, len).ok()?.network();
            self.blocks.get(&c)
        })
    }

    pub(super) fn compute_route(&self, cidr: &Cidr) -> Option<Route> {
        let src = self.route_sources.get(cidr)?;
        let me = &self.config.hostname;
        let mut types = route_type::CIDR_INFO;
        let mut dst_node: Option<&String> = None;
        let mut local_workload = false;
        // Workloads first: they are the most specific owner of an address.
        let wep_node = src
            .weps
            .values()
            .find(|n| *n == me)
            .or_else(|| src.weps.values().next());
        if let Some(node) = wep_node {
            let borrowed_or_listed = node == me
                || self.config.route_source == RouteSource::WorkloadIps
                || self.block_owner(cidr.addr()) != Some(node);
            if borrowed_or_listed {
                if node == me {
                    types |= route_type::LOCAL_WORKLOAD;
                    local_workload = true;
                } else {
                    types |= route_type::REMOTE_WORKLOAD;
                }
                dst_node = Some(node);
            }
        }
        if let Some(node) = &src.block {
            types |= if node == me {
                route_type::LOCAL_WORKLOAD
            } else {
                route_type::REMOTE_WORKLOAD
            };
            dst_node = dst_node.or(Some(node));
        }
        if let Some(node) = src.tunnels.iter().next() {
            types |= if node == me {
                route_type::LOCAL_TUNNEL
            } else {
                route_type::REMOTE_TUNNEL
            };
            dst_node = dst_node.or(Some(node));
        }
        if let Some(node) = src.hosts.iter().next() {
            types |= if node == me {
                route_type::LOCAL_HOST
            } else {
                route_type::REMOTE_HOST
            };
            dst_node = dst_node.or(Some(node));
        }
        let pool = self.containing_pool(cidr);
        if dst_node.is_none() && src.pool.is_none() {
            return None;
        }
        let pool_type = match pool {
            None => PoolType::None,
            Some(p) if p.vxlan != EncapMode::Never => PoolType::Vxlan,
            Some(p) if p.ipip != EncapMode::Never => PoolType::Ipip,
            Some(_) => PoolType::NoEncap,
        };
        let dst_info = dst_node.and_then(|n| self.nodes.get(n));
        let dst_node_ip = dst_info.and_then(|i| {
            if cidr.is_ipv4() {
                i.ipv4.map(|c| c.addr())
            } else {
                i.ipv6.map(|c| c.addr())
            }
        });
        let same_subnet = match (dst_node, dst_node_ip, self.nodes.get(me)) {
            (Some(n), Some(ip), Some(mine)) if n != me => {
                let my = if ip.is_ipv4() { mine.ipv4 } else { mine.ipv6 };
                my.is_some_and(|c| c.contains(ip))
            }
            _ => false,
        };
        Some(Route {
            dst: *cidr,
            types,
            pool_type,
            dst_node_name: dst_node.cloned().unwrap_or_default(),
            dst_node_ip,
            same_subnet,
            nat_outgoing: pool.is_some_and(|p| p.masquerade),
            local_workload,
        })
    }

    pub(super) fn compute_vtep(&self, name: &str) -> Option<Vtep> {
        let n = self.nodes.get(name)?;
        let v4 = n.vxlan_v4.zip(n.ipv4.map(|c| c.addr()));
        let v6 = n.vxlan_v6.zip(n.ipv6.map(|c| c.addr()));
        if v4.is_none() && v6.is_none() {
            return None;
        }
        let mac = |m: &str, suffix: &str| {
            if m.is_empty() {
                vxlan_mac_for_node(&format!("{name}{suffix}"))
            } else {
                m.to_string()
            }
        };
        Some(Vtep {
            node: name.to_string(),
            mac: if v4.is_some() {
                mac(&n.vxlan_mac, "")
            } else {
                String::new()
            },
            ipv4_addr: v4.map(|(a, _)| a),
            parent_device_ip: v4.map(|(_, p)| p),
            mac_v6: if v6.is_some() {
                mac(&n.vxlan_mac_v6, "/v6")
            } else {
                String::new()
            },
            ipv6_addr: v6.map(|(a, _)| a),
            parent_device_ipv6: v6.map(|(_, p)| p),
        })
    }

    pub(super) fn compute_encap(&self) -> Encap {
        let mut e = Encap {
            ipip: false,
            vxlan: false,
            vxlan_v6: false,
        };
        for p in self.pools.values() {
            if p.cidr.is_ipv4() {
                e.ipip |= p.ipip != EncapMode::Never;
                e.vxlan |= p.vxlan != EncapMode::Never;
            } else {
                e.vxlan_v6 |= p.vxlan != EncapMode::Never;
            }
        }
        e
    }
}
