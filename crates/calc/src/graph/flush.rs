//! The event sequencer: tiers and endpoint messages, and `flush`, which emits what changed
//! in the dataplane's dependency order.

use super::*;

impl CalcGraph {
    pub(super) fn tier_sort_key(&self, tier: &str) -> (bool, f64, String) {
        match self.tiers.get(tier) {
            Some(spec) => (false, spec.order.unwrap_or(f64::INFINITY), tier.to_string()),
            None if tier == DEFAULT_TIER => (false, DEFAULT_TIER_ORDER, tier.to_string()),
            // A tier without its resource sorts after every valid tier (fail closed).
            None => (true, f64::INFINITY, tier.to_string()),
        }
    }

    pub(super) fn tier_default_action(&self, tier: &str) -> RuleAction {
        match self.tiers.get(tier).and_then(|t| t.default_action) {
            Some(Action::Pass) => RuleAction::Pass,
            _ => RuleAction::Deny,
        }
    }

    /// Tiers (ordered) with the given policies (ordered within each tier).
    pub(super) fn tiers_for(&self, policies: &[&PolicyState]) -> Vec<TierInfo> {
        let mut by_tier: BTreeMap<&str, Vec<&PolicyState>> = BTreeMap::new();
        for p in policies {
            by_tier.entry(p.id.tier.as_str()).or_default().push(p);
        }
        let mut tiers: Vec<(&str, Vec<&PolicyState>)> = by_tier.into_iter().collect();
        tiers.sort_by(|a, b| {
            let ka = self.tier_sort_key(a.0);
            let kb = self.tier_sort_key(b.0);
            ka.0.cmp(&kb.0)
                .then(ka.1.total_cmp(&kb.1))
                .then_with(|| ka.2.cmp(&kb.2))
        });
        tiers
            .into_iter()
            .map(|(name, mut pols)| {
                pols.sort_by(|a, b| {
                    a.order
                        .total_cmp(&b.order)
                        .then_with(|| a.id.name.cmp(&b.id.name))
                        .then_with(|| a.id.namespace.cmp(&b.id.namespace))
                });
                TierInfo {
                    name: name.to_string(),
                    default_action: self.tier_default_action(name),
                    ingress_policies: pols
                        .iter()
                        .filter(|p| p.ingress)
                        .map(|p| p.id.clone())
                        .collect(),
                    egress_policies: pols
                        .iter()
                        .filter(|p| p.egress)
                        .map(|p| p.id.clone())
                        .collect(),
                }
            })
            .collect()
    }

    pub(super) fn endpoint_message(&self, key: &ItemKey) -> Option<Message> {
        let ep = self.local.get(key)?;
        let pols: Vec<&PolicyState> = self
            .local_policies
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|r| self.policies.get(r))
            .collect();
        Some(match &ep.kind {
            LocalKind::Wep { id, data } => {
                let mut data = data.clone();
                data.tiers = self.tiers_for(&pols);
                Message::WorkloadEndpointUpdate {
                    id: id.clone(),
                    endpoint: Arc::new(data),
                }
            }
            LocalKind::Hep { data } => {
                let mut data = data.clone();
                let pick = |f: &dyn Fn(&PolicyState) -> bool| -> Vec<&PolicyState> {
                    pols.iter().copied().filter(|p| f(p)).collect()
                };
                data.tiers = self.tiers_for(&pick(&|p| !p.do_not_track && !p.pre_dnat));
                // Untracked and preDNAT tiers never drop at their end: Calico forces Pass
                // (normal policy still runs after them). preDNAT is ingress only.
                data.untracked_tiers = self.tiers_for(&pick(&|p| p.do_not_track));
                data.pre_dnat_tiers = self.tiers_for(&pick(&|p| p.pre_dnat));
                for t in data
                    .untracked_tiers
                    .iter_mut()
                    .chain(&mut data.pre_dnat_tiers)
                {
                    t.default_action = RuleAction::Pass;
                }
                for t in &mut data.pre_dnat_tiers {
                    t.egress_policies.clear();
                }
                data.forward_tiers = self.tiers_for(&pick(&|p| {
                    p.apply_on_forward && !p.do_not_track && !p.pre_dnat
                }));
                let name = match key {
                    ItemKey::Hep { name } => name.clone(),
                    _ => String::new(),
                };
                Message::HostEndpointUpdate {
                    id: name,
                    endpoint: Arc::new(data),
                }
            }
        })
    }

    // ---- flush ------------------------------------------------------------------------

    /// Emits everything that changed since the last flush, in the dataplane's dependency
    /// order: IP sets, policies, profiles, endpoints; then removals in reverse; then
    /// namespaces and service accounts; route removals, VTEP removals, VTEP additions,
    /// route additions; hosts, pools, encapsulation; and `InSync` last, once.
    pub fn flush(&mut self) -> Vec<Message> {
        let mut out = Vec::new();
        let mut ip_set_removes = Vec::new();
        let mut policy_removes = Vec::new();
        let mut profile_removes = Vec::new();
        let mut ep_removes = Vec::new();

        // IP sets.
        for id in std::mem::take(&mut self.dirty_ip_sets) {
            let Some(st) = self.ip_sets.get_mut(&id) else {
                continue;
            };
            if st.refs == 0 {
                if st.sent {
                    ip_set_removes.push(Message::IpSetRemove { id: id.clone() });
                }
                self.ip_sets.remove(&id);
                continue;
            }
            if !st.sent || st.resend_full {
                let mut members: Vec<IpSetMember> = st.members.keys().copied().collect();
                members.sort_unstable();
                out.push(Message::IpSetUpdate {
                    id: id.clone(),
                    kind: st.source.kind(),
                    members,
                });
                st.sent = true;
                st.resend_full = false;
            } else if !st.added.is_empty() || !st.removed.is_empty() {
                let mut added: Vec<IpSetMember> = st.added.iter().copied().collect();
                let mut removed: Vec<IpSetMember> = st.removed.iter().copied().collect();
                added.sort_unstable();
                removed.sort_unstable();
                out.push(Message::IpSetDeltaUpdate {
                    id: id.clone(),
                    added,
                    removed,
                });
            }
            st.added.clear();
            st.removed.clear();
        }

        // Policies.
        for pref in std::mem::take(&mut self.dirty_policies) {
            let desired = self
                .policies
                .get(&pref)
                .filter(|p| !p.matched.is_empty())
                .map(|p| (p.id.clone(), p.resolved.clone()));
            let sent = self.sent_policies.get(&pref);
            match (desired, sent) {
                (Some((id, pol)), sent) => {
                    if let Some((sent_id, _)) = sent
                        && *sent_id != id
                    {
                        policy_removes.push(Message::ActivePolicyRemove {
                            id: sent_id.clone(),
                        });
                    }
                    if sent.is_none_or(|(sid, spol)| *sid != id || **spol != *pol) {
                        out.push(Message::ActivePolicyUpdate {
                            id: id.clone(),
                            policy: pol.clone(),
                        });
                    }
                    self.sent_policies.insert(pref, (id, pol));
                }
                (None, Some(_)) => {
                    if let Some((id, _)) = self.sent_policies.remove(&pref) {
                        policy_removes.push(Message::ActivePolicyRemove { id });
                    }
                }
                (None, None) => {}
            }
        }

        // Profiles (and their namespace / service-account views).
        let mut ns_msgs = Vec::new();
        for name in std::mem::take(&mut self.dirty_profiles) {
            let st = self.profiles.get(&name);
            let desired = st.filter(|p| p.refs > 0).map(|p| match &p.rules {
                Some((profile, _)) => profile.clone(),
                None => {
                    let deny = rules::deny_all();
                    Arc::new(ResolvedProfile {
                        inbound: deny.inbound,
                        outbound: deny.outbound,
                    })
                }
            });
            match desired {
                Some(profile) => {
                    if self.sent_profiles.get(&name) != Some(&profile) {
                        out.push(Message::ActiveProfileUpdate {
                            id: name.clone(),
                            profile: profile.clone(),
                        });
                        self.sent_profiles.insert(name.clone(), profile);
                    }
                }
                None => {
                    if self.sent_profiles.remove(&name).is_some() {
                        profile_removes.push(Message::ActiveProfileRemove { id: name.clone() });
                    }
                }
            }
            let exists = st.is_some_and(|p| p.rules.is_some());
            let labels = st.map(|p| p.labels.clone()).unwrap_or_default();
            if let Some(ns) = name.strip_prefix(NAMESPACE_PROFILE_PREFIX) {
                let labels: BTreeMap<String, String> = labels
                    .into_iter()
                    .filter_map(|(k, v)| {
                        k.strip_prefix(NAMESPACE_LABEL_PREFIX)
                            .map(|k| (k.to_string(), v))
                    })
                    .collect();
                diff_labels(
                    &mut self.sent_namespaces,
                    ns,
                    exists.then_some(labels),
                    &mut ns_msgs,
                    |id, labels| Message::NamespaceUpdate { id, labels },
                    |id| Message::NamespaceRemove { id },
                );
            } else if let Some(rest) = name.strip_prefix(SERVICE_ACCOUNT_PROFILE_PREFIX) {
                let id = rest.replacen('.', "/", 1);
                let labels: BTreeMap<String, String> = labels
                    .into_iter()
                    .filter_map(|(k, v)| {
                        k.strip_prefix(SERVICE_ACCOUNT_LABEL_PREFIX)
                            .map(|k| (k.to_string(), v))
                    })
                    .collect();
                diff_labels(
                    &mut self.sent_service_accounts,
                    &id,
                    exists.then_some(labels),
                    &mut ns_msgs,
                    |id, labels| Message::ServiceAccountUpdate { id, labels },
                    |id| Message::ServiceAccountRemove { id },
                );
            }
        }

        // Endpoints.
        for key in std::mem::take(&mut self.dirty_eps) {
            let desired = self.endpoint_message(&key);
            let sent = self.sent_eps.get(&key);
            if desired.as_ref() == sent {
                continue;
            }
            if let Some(old) = sent {
                let remove = removal_for(old);
                let replaced = desired.as_ref().map(removal_for);
                // A workload whose identity changed: remove the old one.
                if replaced.as_ref() != Some(&remove) {
                    ep_removes.push(remove);
                }
            }
            match desired {
                Some(m) => {
                    out.push(m.clone());
                    self.sent_eps.insert(key, m);
                }
                None => {
                    self.sent_eps.remove(&key);
                }
            }
        }

        out.extend(ep_removes);
        out.extend(profile_removes);
        out.extend(policy_removes);
        out.extend(ip_set_removes);
        out.extend(ns_msgs);

        // Routes and VTEPs: removals, then VTEP changes, then additions.
        let mut route_removes = Vec::new();
        let mut route_adds = Vec::new();
        let mut dirty: Vec<Cidr> = std::mem::take(&mut self.dirty_cidrs).into_iter().collect();
        dirty.sort_unstable();
        for cidr in dirty {
            let desired = self.compute_route(&cidr);
            match desired {
                Some(r) => {
                    if self.sent_routes.get(&cidr) != Some(&r) {
                        self.sent_routes.insert(cidr, r.clone());
                        route_adds.push(Message::RouteUpdate(r));
                    }
                }
                None => {
                    if self.sent_routes.remove(&cidr).is_some() {
                        route_removes.push(Message::RouteRemove { dst: cidr });
                    }
                }
            }
        }
        let mut vtep_removes = Vec::new();
        let mut vtep_adds = Vec::new();
        let mut host_msgs = Vec::new();
        for name in std::mem::take(&mut self.dirty_nodes) {
            let desired = self.compute_vtep(&name);
            match desired {
                Some(v) => {
                    if self.sent_vteps.get(&name) != Some(&v) {
                        if self.sent_vteps.contains_key(&name) {
                            // Calico's dataplane expects a remove before a changed VTEP.
                            vtep_removes.push(Message::VtepRemove { node: name.clone() });
                        }
                        self.sent_vteps.insert(name.clone(), v.clone());
                        vtep_adds.push(Message::VtepUpdate(v));
                    }
                }
                None => {
                    if self.sent_vteps.remove(&name).is_some() {
                        vtep_removes.push(Message::VtepRemove { node: name.clone() });
                    }
                }
            }
            let host = self.nodes.get(&name).and_then(|n| {
                (n.ipv4.is_some() || n.ipv6.is_some()).then(|| Message::HostMetadataUpdate {
                    hostname: name.clone(),
                    ipv4: n.ipv4,
                    ipv6: n.ipv6,
                    labels: n.labels.clone(),
                })
            });
            match host {
                Some(m) => {
                    if self.sent_hosts.get(&name) != Some(&m) {
                        self.sent_hosts.insert(name.clone(), m.clone());
                        host_msgs.push(m);
                    }
                }
                None => {
                    if self.sent_hosts.remove(&name).is_some() {
                        host_msgs.push(Message::HostMetadataRemove {
                            hostname: name.clone(),
                        });
                    }
                }
            }
        }
        out.extend(route_removes);
        out.extend(vtep_removes);
        out.extend(vtep_adds);
        out.extend(route_adds);
        out.extend(host_msgs);

        for name in std::mem::take(&mut self.dirty_pools) {
            match self.pools.get(&name) {
                Some(p) => {
                    if self.sent_pools.get(&name) != Some(p) {
                        if let Some(old) = self.sent_pools.get(&name)
                            && old.cidr != p.cidr
                        {
                            out.push(Message::IpamPoolRemove {
                                id: pool_id(&old.cidr),
                            });
                        }
                        out.push(Message::IpamPoolUpdate {
                            id: pool_id(&p.cidr),
                            pool: p.clone(),
                        });
                        self.sent_pools.insert(name, p.clone());
                    }
                }
                None => {
                    if let Some(old) = self.sent_pools.remove(&name) {
                        out.push(Message::IpamPoolRemove {
                            id: pool_id(&old.cidr),
                        });
                    }
                }
            }
        }
        let encap = self.compute_encap();
        if self.sent_encap != Some(encap)
            && (self.sent_encap.is_some() || self.in_sync_pending || !self.pools.is_empty())
        {
            out.push(Message::Encapsulation {
                ipip: encap.ipip,
                vxlan: encap.vxlan,
                vxlan_v6: encap.vxlan_v6,
            });
            self.sent_encap = Some(encap);
        }
        if self.sent_service_cidrs.as_ref() != Some(&self.service_cidrs)
            && (self.sent_service_cidrs.is_some() || !self.service_cidrs.is_empty())
        {
            out.push(Message::GlobalBgpConfig(self.service_cidrs.clone()));
            self.sent_service_cidrs = Some(self.service_cidrs.clone());
        }
        // Services last: they reference nothing else the dataplane holds.
        let mut changes = Vec::new();
        self.services.flush(&mut changes);
        out.extend(changes.into_iter().map(|c| match c {
            ServiceChange::Update(id, service) => Message::ServiceUpdate { id, service },
            ServiceChange::Remove(id) => Message::ServiceRemove { id },
        }));
        if self.in_sync_pending {
            self.in_sync_pending = false;
            self.in_sync_sent = true;
            out.push(Message::InSync);
        }
        out
    }
}
