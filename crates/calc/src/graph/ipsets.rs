//! IP sets: reference-counted by the rules that use them, members kept as selectors and
//! named ports match.

use super::*;

impl CalcGraph {
    pub(super) fn acquire_ip_set(&mut self, id: &str, source: &IpSetSource) {
        if let Some(st) = self.ip_sets.get_mut(id)
            && st.refs > 0
        {
            st.refs += 1;
            return;
        }
        let mut changes = std::mem::take(&mut self.scratch_changes);
        changes.clear();
        let sel = source
            .selector()
            .map(|s| self.labels.acquire(s, &mut changes));
        // A brand-new selector reports its initial matches; they are applied from `matches`
        // below instead, for this set only.
        changes.clear();
        self.scratch_changes = changes;
        let mut members: HashMap<IpSetMember, u32> = HashMap::new();
        if let Some(sel) = sel {
            let mut buf = Vec::new();
            for item in self.labels.matches(sel) {
                if let Some(p) = self.payloads.get(&item) {
                    p.members_for(source, &mut buf);
                    for m in buf.drain(..) {
                        *members.entry(m).or_insert(0) += 1;
                    }
                }
            }
            self.sel_users.entry(sel).or_default().push(id.to_string());
        }
        if let IpSetSource::Service { namespace, name } = source {
            for m in self.services.ip_set_members(namespace, name) {
                members.insert(m, 1);
            }
        }
        match self.ip_sets.get_mut(id) {
            // Released but not yet removed from the dataplane: revive it with a full update.
            Some(st) => {
                st.refs = 1;
                st.sel = sel;
                st.members = members;
                st.resend_full = true;
                st.added.clear();
                st.removed.clear();
            }
            None => {
                self.ip_sets.insert(
                    id.to_string(),
                    IpSetState {
                        source: source.clone(),
                        sel,
                        refs: 1,
                        members,
                        sent: false,
                        resend_full: false,
                        added: HashSet::new(),
                        removed: HashSet::new(),
                    },
                );
            }
        }
        self.dirty_ip_sets.insert(id.to_string());
    }

    pub(super) fn release_ip_set(&mut self, id: &str) {
        let Some(st) = self.ip_sets.get_mut(id) else {
            return;
        };
        st.refs = st.refs.saturating_sub(1);
        if st.refs > 0 {
            return;
        }
        if let Some(sel) = st.sel.take() {
            if let Some(users) = self.sel_users.get_mut(&sel) {
                users.retain(|u| u != id);
                if users.is_empty() {
                    self.sel_users.remove(&sel);
                }
            }
            self.labels.release(sel);
        }
        st.members = HashMap::new();
        st.added.clear();
        st.removed.clear();
        if st.sent {
            self.dirty_ip_sets.insert(id.to_string());
        } else {
            self.ip_sets.remove(id);
        }
    }
}
