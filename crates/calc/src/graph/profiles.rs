//! Profiles: reference-counted by local endpoints, their labels inherited by endpoints and
//! their rules sent while used.

use super::*;

impl CalcGraph {
    pub(super) fn profile_ref(&mut self, name: &str, delta: i32) {
        let st = self.profiles.entry(name.to_string()).or_default();
        let was = st.refs;
        st.refs = if delta > 0 {
            st.refs + 1
        } else {
            st.refs.saturating_sub(1)
        };
        let now = st.refs;
        let sets: Vec<(String, IpSetSource)> = st
            .rules
            .as_ref()
            .map(|(_, s)| s.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        if was == 0 && now > 0 {
            for (id, src) in &sets {
                self.acquire_ip_set(id, src);
            }
            self.dirty_profiles.insert(name.to_string());
        } else if was > 0 && now == 0 {
            for (id, _) in &sets {
                self.release_ip_set(id);
            }
            self.dirty_profiles.insert(name.to_string());
        }
        self.gc_profile(name);
    }

    pub(super) fn gc_profile(&mut self, name: &str) {
        if self
            .profiles
            .get(name)
            .is_some_and(|p| p.refs == 0 && p.rules.is_none() && p.labels.is_empty())
        {
            self.profiles.remove(name);
        }
    }

    pub(super) fn update_profile(
        &mut self,
        name: &str,
        spec: Option<margay_api::policy::ProfileSpec>,
    ) -> Result<(), String> {
        let mut err = None;
        let (labels, rules) = match spec {
            None => (LabelMap::new(), None),
            Some(spec) => match rules::scan_rules(&spec.ingress, &spec.egress, "", name) {
                Ok(scanned) => {
                    let profile = ResolvedProfile {
                        inbound: scanned.inbound,
                        outbound: scanned.outbound,
                    };
                    (
                        spec.labels_to_apply,
                        Some((Arc::new(profile), scanned.ip_sets)),
                    )
                }
                Err(e) => {
                    err = Some(e.to_string());
                    (LabelMap::new(), None)
                }
            },
        };
        let st = self.profiles.entry(name.to_string()).or_default();
        let active = st.refs > 0;
        let old_rules = std::mem::replace(&mut st.rules, rules.clone());
        let labels_changed = st.labels != labels;
        st.labels = labels.clone();
        if active {
            if let Some((_, sets)) = &rules {
                for (id, src) in sets {
                    self.acquire_ip_set(id, src);
                }
            }
            if let Some((_, sets)) = &old_rules {
                for id in sets.keys() {
                    self.release_ip_set(id);
                }
            }
            self.dirty_profiles.insert(name.to_string());
        }
        if labels_changed {
            let mut changes = std::mem::take(&mut self.scratch_changes);
            changes.clear();
            let label_opt = if labels.is_empty() {
                None
            } else {
                Some(labels)
            };
            let changed_items = self.labels.update_parent(name, label_opt, &mut changes);
            self.apply_changes(&changes);
            changes.clear();
            self.scratch_changes = changes;
            let id_to_key: HashMap<ItemId, ItemKey> = if changed_items.is_empty() {
                HashMap::new()
            } else {
                self.local
                    .keys()
                    .filter_map(|k| self.item_ids.get(k).map(|id| (*id, k.clone())))
                    .collect()
            };
            for item in changed_items {
                if let Some(key) = id_to_key.get(&item) {
                    self.rematch_local(key);
                }
            }
        }
        // Namespace and service-account views of the Kubernetes profiles.
        if name.starts_with(NAMESPACE_PROFILE_PREFIX)
            || name.starts_with(SERVICE_ACCOUNT_PROFILE_PREFIX)
        {
            self.dirty_profiles.insert(name.to_string());
        }
        self.gc_profile(name);
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
