//! Labelled items: workload and host endpoints and network sets into the label index,
//! with their routes, named ports and IP-set membership.

use super::*;

impl CalcGraph {
    pub(super) fn item_id(&mut self, key: &ItemKey) -> ItemId {
        if let Some(id) = self.item_ids.get(key) {
            return *id;
        }
        let id = self.labels.new_item_id();
        self.item_ids.insert(key.clone(), id);
        id
    }

    /// Adds, updates or (with `None`) removes a labelled item, keeping IP sets right.
    pub(super) fn set_item(
        &mut self,
        key: &ItemKey,
        value: Option<(LabelMap, Vec<String>, Payload)>,
    ) -> bool {
        let existing = self.item_ids.get(key).copied();
        // Take the item's members out of every set it is in; they go back below with the new
        // payload. Reference counts make this exact and the delta tracking nets it out.
        if let Some(id) = existing {
            self.item_members_changed(id, false);
        }
        let mut changes = std::mem::take(&mut self.scratch_changes);
        changes.clear();
        let labels_changed = match value {
            None => {
                if let Some(id) = existing {
                    self.labels.remove_item(id, &mut changes);
                    self.payloads.remove(&id);
                    self.item_ids.remove(key);
                }
                true
            }
            Some((labels, parents, payload)) => {
                let id = self.item_id(key);
                let changed = self.labels.update_item(id, labels, parents, &mut changes);
                self.payloads.insert(id, payload);
                self.item_members_changed(id, true);
                changed
            }
        };
        // The match changes only concern this item, whose members were handled above.
        changes.clear();
        self.scratch_changes = changes;
        labels_changed
    }

    /// Adds (or removes) one item's members to every IP set whose selector matches it.
    pub(super) fn item_members_changed(&mut self, id: ItemId, add: bool) {
        let sels: Vec<SelId> = self.labels.item_matches(id).to_vec();
        for sel in sels {
            self.apply_match(sel, id, add);
        }
    }

    pub(super) fn apply_match(&mut self, sel: SelId, item: ItemId, add: bool) {
        let Some(users) = self.sel_users.get(&sel) else {
            return;
        };
        let Some(payload) = self.payloads.get(&item) else {
            return;
        };
        let mut members = std::mem::take(&mut self.scratch_members);
        for set_id in users {
            let Some(st) = self.ip_sets.get_mut(set_id) else {
                continue;
            };
            payload.members_for(&st.source, &mut members);
            let mut touched = false;
            for m in members.drain(..) {
                touched |= if add {
                    add_member(st, m)
                } else {
                    remove_member(st, m)
                };
            }
            if touched {
                self.dirty_ip_sets.insert(set_id.clone());
            }
        }
        self.scratch_members = members;
    }

    pub(super) fn apply_changes(&mut self, changes: &[MatchChange]) {
        for c in changes {
            self.apply_match(c.selector, c.item, c.matched);
        }
    }

    pub(super) fn update_wep(
        &mut self,
        namespace: &str,
        name: &str,
        value: Option<(BTreeMap<String, String>, WorkloadEndpointSpec)>,
    ) -> Result<(), String> {
        let key = ItemKey::Wep {
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        // A workload without addresses cannot have rules rendered yet: treated as absent.
        let value = value.filter(|(_, spec)| !spec.ip_networks.is_empty());
        let Some((raw_labels, spec)) = value else {
            self.remove_wep(&key);
            return Ok(());
        };
        let parsed = (|| -> Result<_, String> {
            let mut v4 = Vec::new();
            let mut v6 = Vec::new();
            for n in &spec.ip_networks {
                let c = Cidr::parse_cidr_or_ip(n).map_err(|e| format!("spec.ipNetworks: {e}"))?;
                let c = c.network();
                if c.is_ipv4() {
                    v4.push(c);
                } else {
                    v6.push(c);
                }
            }
            let mut spoof = Vec::new();
            for n in &spec.allow_spoofed_source_prefixes {
                spoof.push(
                    Cidr::parse_cidr_or_ip(n)
                        .map_err(|e| format!("spec.allowSpoofedSourcePrefixes: {e}"))?
                        .network(),
                );
            }
            Ok((v4, v6, spoof))
        })();
        let (v4, v6, spoof) = match parsed {
            Ok(p) => p,
            Err(e) => {
                self.remove_wep(&key);
                return Err(e);
            }
        };
        // Labels as Calico's syncer presents them: no forged namespace or service-account
        // labels; namespace, orchestrator and service account from the resource itself.
        let mut labels: LabelMap = raw_labels
            .into_iter()
            .filter(|(k, _)| {
                !k.starts_with(NAMESPACE_LABEL_PREFIX)
                    && !k.starts_with(SERVICE_ACCOUNT_LABEL_PREFIX)
            })
            .collect();
        labels.insert(LABEL_NAMESPACE.to_string(), namespace.to_string());
        if !spec.orchestrator.is_empty() {
            labels.insert(LABEL_ORCHESTRATOR.to_string(), spec.orchestrator.clone());
        }
        if !spec.service_account_name.is_empty() {
            labels.insert(
                LABEL_SERVICE_ACCOUNT.to_string(),
                spec.service_account_name.clone(),
            );
        }
        let named_ports = spec
            .ports
            .iter()
            .filter(|p| !p.name.is_empty())
            .filter_map(|p| {
                let proto = match p.protocol.number()? {
                    6 => PortProtocol::Tcp,
                    17 => PortProtocol::Udp,
                    132 => PortProtocol::Sctp,
                    _ => return None,
                };
                Some((p.name.clone(), proto, u16::try_from(p.port).ok()?))
            })
            .collect();
        let nets: Vec<Cidr> = v4.iter().chain(&v6).copied().collect();
        let payload = Payload {
            nets: nets.clone(),
            named_ports,
        };
        let is_local = spec.node == self.config.hostname;
        let node = spec.node.clone();
        // Routes: every workload address is a route source (see `compute_route`).
        let old_cidrs = self.wep_route_cidrs(&key);
        let labels_changed = self.set_item(&key, Some((labels, spec.profiles.clone(), payload)));
        for c in &old_cidrs {
            if !nets.contains(c) {
                self.modify_sources(*c, |s| NodeDelta {
                    removed: s.weps.remove(&key),
                    added: None,
                });
            }
        }
        for c in &nets {
            self.modify_sources(*c, |s| NodeDelta {
                removed: s.weps.insert(key.clone(), node.clone()),
                added: Some(node.clone()),
            });
        }

        if is_local {
            let id = WorkloadEndpointId {
                orchestrator: spec.orchestrator.clone(),
                workload: spec.workload_id(namespace, name),
                endpoint: spec.endpoint_id(),
            };
            let data = WorkloadEndpointData {
                interface: spec.interface_name.clone(),
                mac: spec.mac.clone(),
                ipv4_nets: v4,
                ipv6_nets: v6,
                profile_ids: spec.profiles.clone(),
                tiers: Vec::new(),
                name: name.to_string(),
                namespace: namespace.to_string(),
                allow_spoofed_source_prefixes: spoof,
            };
            self.set_local(
                key,
                LocalKind::Wep { id, data },
                spec.profiles,
                labels_changed,
            );
        } else {
            self.clear_local(&key);
        }
        Ok(())
    }

    pub(super) fn wep_route_cidrs(&self, key: &ItemKey) -> Vec<Cidr> {
        let Some(id) = self.item_ids.get(key) else {
            return Vec::new();
        };
        self.payloads
            .get(id)
            .map(|p| p.nets.clone())
            .unwrap_or_default()
    }

    pub(super) fn remove_wep(&mut self, key: &ItemKey) {
        for c in self.wep_route_cidrs(key) {
            self.modify_sources(c, |s| NodeDelta {
                removed: s.weps.remove(key),
                added: None,
            });
        }
        self.set_item(key, None);
        self.clear_local(key);
    }

    pub(super) fn update_hep(
        &mut self,
        name: &str,
        value: Option<(BTreeMap<String, String>, HostEndpointSpec)>,
    ) -> Result<(), String> {
        let key = ItemKey::Hep {
            name: name.to_string(),
        };
        let Some((labels, spec)) = value else {
            self.set_item(&key, None);
            self.clear_local(&key);
            return Ok(());
        };
        let mut ips = Vec::new();
        for ip in &spec.expected_ips {
            match ip.parse::<IpAddr>() {
                Ok(a) => ips.push(a),
                Err(_) => {
                    self.set_item(&key, None);
                    self.clear_local(&key);
                    return Err(format!("spec.expectedIPs: {ip:?} is not an IP address"));
                }
            }
        }
        let named_ports = spec
            .ports
            .iter()
            .filter_map(|p| {
                let proto = match p.protocol.number()? {
                    6 => PortProtocol::Tcp,
                    17 => PortProtocol::Udp,
                    132 => PortProtocol::Sctp,
                    _ => return None,
                };
                Some((p.name.clone(), proto, u16::try_from(p.port).ok()?))
            })
            .collect();
        let payload = Payload {
            nets: ips.iter().map(|ip| Cidr::host(*ip)).collect(),
            named_ports,
        };
        let labels_changed = self.set_item(&key, Some((labels, spec.profiles.clone(), payload)));
        if spec.node == self.config.hostname {
            let data = HostEndpointData {
                interface: spec.interface_name.clone(),
                expected_ipv4: ips.iter().filter(|i| i.is_ipv4()).copied().collect(),
                expected_ipv6: ips.iter().filter(|i| i.is_ipv6()).copied().collect(),
                profile_ids: spec.profiles.clone(),
                tiers: Vec::new(),
                untracked_tiers: Vec::new(),
                pre_dnat_tiers: Vec::new(),
                forward_tiers: Vec::new(),
            };
            self.set_local(key, LocalKind::Hep { data }, spec.profiles, labels_changed);
        } else {
            self.clear_local(&key);
        }
        Ok(())
    }

    pub(super) fn update_network_set(
        &mut self,
        key: ItemKey,
        namespace: Option<&str>,
        value: Option<(BTreeMap<String, String>, Vec<String>)>,
    ) -> Result<(), String> {
        let Some((mut labels, nets)) = value else {
            self.set_item(&key, None);
            return Ok(());
        };
        let mut cidrs = Vec::new();
        for n in &nets {
            match Cidr::parse_cidr_or_ip(n) {
                Ok(c) => cidrs.push(c.network()),
                Err(e) => {
                    self.set_item(&key, None);
                    return Err(format!("spec.nets: {e}"));
                }
            }
        }
        let mut parents = Vec::new();
        if let Some(ns) = namespace {
            labels.insert(LABEL_NAMESPACE.to_string(), ns.to_string());
            parents.push(format!("{NAMESPACE_PROFILE_PREFIX}{ns}"));
        }
        self.set_item(
            &key,
            Some((
                labels,
                parents,
                Payload {
                    nets: cidrs,
                    named_ports: Vec::new(),
                },
            )),
        );
        Ok(())
    }
}
