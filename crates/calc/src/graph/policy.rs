//! Local endpoints and policy matching: which policies and tiers apply to this node's
//! endpoints, and the policies' own state.

use super::*;

impl CalcGraph {
    pub(super) fn set_local(
        &mut self,
        key: ItemKey,
        kind: LocalKind,
        profiles: Vec<String>,
        labels_changed: bool,
    ) {
        let old_profiles = self.local.get(&key).map(|l| l.profiles.clone());
        let is_new = old_profiles.is_none();
        if old_profiles.as_ref() != Some(&profiles) {
            for p in &profiles {
                self.profile_ref(p, 1);
            }
            for p in old_profiles.iter().flatten() {
                self.profile_ref(p, -1);
            }
        }
        self.local
            .insert(key.clone(), LocalEndpoint { kind, profiles });
        if is_new || labels_changed {
            self.rematch_local(&key);
        }
        self.dirty_eps.insert(key);
    }

    pub(super) fn clear_local(&mut self, key: &ItemKey) {
        let Some(old) = self.local.remove(key) else {
            return;
        };
        for p in &old.profiles {
            self.profile_ref(p, -1);
        }
        if let Some(pols) = self.local_policies.remove(key) {
            for p in pols {
                self.policy_unmatch(&p, key);
            }
        }
        self.dirty_eps.insert(key.clone());
    }

    /// Re-evaluates every policy's selector against one local endpoint.
    pub(super) fn rematch_local(&mut self, key: &ItemKey) {
        let Some(id) = self.item_ids.get(key).copied() else {
            return;
        };
        let is_hep = matches!(key, ItemKey::Hep { .. });
        let Some(labels) = self.labels.effective_labels(id) else {
            return;
        };
        let now: BTreeSet<PolicyRef> = self
            .policies
            .iter()
            .filter(|(_, p)| (is_hep || p.applies_to_workloads()) && p.selector.matches(labels))
            .map(|(r, _)| r.clone())
            .collect();
        let before = self.local_policies.remove(key).unwrap_or_default();
        if before != now {
            for p in before.difference(&now) {
                self.policy_unmatch(p, key);
            }
            for p in now.difference(&before) {
                self.policy_match(p, key);
            }
            self.dirty_eps.insert(key.clone());
        }
        self.local_policies.insert(key.clone(), now);
    }

    pub(super) fn policy_match(&mut self, policy: &PolicyRef, ep: &ItemKey) {
        let Some(st) = self.policies.get_mut(policy) else {
            return;
        };
        let was_active = !st.matched.is_empty();
        st.matched.insert(ep.clone());
        if !was_active {
            let sets: Vec<(String, IpSetSource)> = st
                .ip_sets
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for (id, src) in sets {
                self.acquire_ip_set(&id, &src);
            }
            self.dirty_policies.insert(policy.clone());
        }
    }

    pub(super) fn policy_unmatch(&mut self, policy: &PolicyRef, ep: &ItemKey) {
        let Some(st) = self.policies.get_mut(policy) else {
            return;
        };
        if !st.matched.remove(ep) {
            return;
        }
        if st.matched.is_empty() {
            let ids: Vec<String> = st.ip_sets.keys().cloned().collect();
            for id in ids {
                self.release_ip_set(&id);
            }
            self.dirty_policies.insert(policy.clone());
        }
    }

    pub(super) fn build_policy(
        &self,
        namespace: &str,
        name: &str,
        input: PolicyInput<'_>,
    ) -> Result<PolicyState, String> {
        let tier = if input.tier.is_empty() {
            DEFAULT_TIER.to_string()
        } else {
            input.tier.to_string()
        };
        let selector =
            parse_selector_or_all(input.selector).map_err(|e| format!("spec.selector: {e}"))?;
        let owner = format!("{tier}/{namespace}/{name}");
        let ScannedRules {
            inbound,
            outbound,
            ip_sets,
        } = rules::scan_rules(input.ingress, input.egress, namespace, &owner)
            .map_err(|e| e.to_string())?;
        let (ingress, egress) = policy_types(input.types, input.ingress, input.egress);
        let resolved = ResolvedPolicy {
            namespace: namespace.to_string(),
            tier: tier.clone(),
            // A policy that does not govern a direction has no rules for it.
            inbound: if ingress { inbound } else { Vec::new() },
            outbound: if egress { outbound } else { Vec::new() },
            untracked: input.do_not_track,
            pre_dnat: input.pre_dnat,
            apply_on_forward: input.apply_on_forward,
            original_selector: input.selector.to_string(),
        };
        let used: BTreeSet<&String> = resolved.ip_set_ids();
        let ip_sets = ip_sets
            .into_iter()
            .filter(|(id, _)| used.contains(id))
            .collect();
        Ok(PolicyState {
            id: PolicyId {
                tier,
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
            selector,
            order: input.order.unwrap_or(f64::INFINITY),
            ingress,
            egress,
            do_not_track: input.do_not_track,
            pre_dnat: input.pre_dnat,
            apply_on_forward: input.apply_on_forward,
            resolved: Arc::new(resolved),
            ip_sets,
            matched: BTreeSet::new(),
        })
    }

    pub(super) fn update_policy(
        &mut self,
        pref: PolicyRef,
        state: Option<Result<PolicyState, String>>,
    ) -> Result<(), String> {
        let (new, err) = match state {
            None => (None, None),
            Some(Ok(s)) => (Some(s), None),
            Some(Err(e)) => (None, Some(e)),
        };
        let old = self.policies.remove(&pref);
        // Endpoints whose tier lists this policy is in (before or after) must be recomputed.
        if let Some(old) = &old {
            for ep in &old.matched {
                self.dirty_eps.insert(ep.clone());
                if let Some(set) = self.local_policies.get_mut(ep) {
                    set.remove(&pref);
                }
            }
        }
        if let Some(mut new) = new {
            let matched: Vec<ItemKey> = self
                .local
                .keys()
                .filter(|key| {
                    let is_hep = matches!(key, ItemKey::Hep { .. });
                    (is_hep || new.applies_to_workloads())
                        && self
                            .item_ids
                            .get(key)
                            .and_then(|id| self.labels.effective_labels(*id))
                            .is_some_and(|labels| new.selector.matches(labels))
                })
                .cloned()
                .collect();
            for key in matched {
                new.matched.insert(key.clone());
                self.local_policies
                    .entry(key.clone())
                    .or_default()
                    .insert(pref.clone());
                self.dirty_eps.insert(key);
            }
            // Acquire the new sets before releasing the old ones so shared sets survive.
            if !new.matched.is_empty() {
                for (id, src) in &new.ip_sets {
                    self.acquire_ip_set(id, src);
                }
            }
            self.policies.insert(pref.clone(), new);
        }
        if let Some(old) = old
            && !old.matched.is_empty()
        {
            for id in old.ip_sets.keys() {
                self.release_ip_set(id);
            }
        }
        self.dirty_policies.insert(pref);
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub(super) fn update_tier(&mut self, name: &str, spec: Option<TierSpec>) {
        let changed = match spec {
            Some(s) => self.tiers.insert(name.to_string(), s.clone()) != Some(s),
            None => self.tiers.remove(name).is_some(),
        };
        if !changed {
            return;
        }
        // Tier order and default action are part of every endpoint's data using the tier.
        for (pref, st) in &self.policies {
            if st.id.tier == name {
                let _ = pref;
                self.dirty_eps.extend(st.matched.iter().cloned());
            }
        }
    }
}
