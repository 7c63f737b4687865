//! Keeps the maps equal to the compiled model, with as few writes as possible.
//!
//! Update protocol (no packet sees half a policy):
//! 1. New IP-set entries are added (an entry nobody references yet changes no verdict).
//! 2. For each endpoint hook whose rules changed, the new list is written into a fresh slot,
//!    then the endpoint's entry is replaced in one map write pointing at the new slots (the
//!    flip). A packet reads the entry once, so it uses the old slot or the new one, whole.
//! 3. Set entries no longer wanted are removed.
//! 4. Slots retired by a flip are deleted one sync later (a packet that read the old entry
//!    just before the flip finishes long before), then reused.
//!
//! An endpoint whose interface does not exist yet is left pending and retried on the next
//! sync. A failed write leaves what was written recorded, so the next sync continues from
//! there.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use margay_calc::{DataplaneModel, WorkloadEndpointId};

use crate::compile::{CompileConfig, CompileError, Compiler};
use crate::layout::{Endpoint, IpSetEntry, Rule};

/// What the syncer needs from the kernel (the real one is [`crate::loader::BpfMaps`]).
pub trait Kernel {
    type Error: std::fmt::Display;
    /// The interface's index in the dataplane's network namespace, if it exists.
    fn ifindex(&self, iface: &str) -> Option<u32>;
    /// Every interface in the namespace: (name, index).
    fn interfaces(&self) -> Vec<(String, u32)>;
    /// Attaches both programs to the interface (idempotent for the same index).
    fn attach(&mut self, iface: &str, ifindex: u32) -> Result<(), Self::Error>;
    /// Detaches them (the interface may be gone already).
    fn detach(&mut self, iface: &str);
    fn put_rule(&mut self, slot: u32, idx: u32, rule: &Rule) -> Result<(), Self::Error>;
    fn del_rule(&mut self, slot: u32, idx: u32) -> Result<(), Self::Error>;
    fn put_endpoint(&mut self, ifindex: u32, ep: &Endpoint) -> Result<(), Self::Error>;
    fn del_endpoint(&mut self, ifindex: u32) -> Result<(), Self::Error>;
    fn put_set_entry(&mut self, e: &IpSetEntry) -> Result<(), Self::Error>;
    fn del_set_entry(&mut self, e: &IpSetEntry) -> Result<(), Self::Error>;
}

#[derive(Debug, thiserror::Error)]
#[error("eBPF dataplane: {what}: {reason}")]
pub struct SyncError {
    pub what: String,
    pub reason: String,
}

fn err<E: std::fmt::Display>(what: impl Into<String>) -> impl FnOnce(E) -> SyncError {
    let what = what.into();
    move |e| SyncError {
        what,
        reason: e.to_string(),
    }
}

#[derive(Debug, Clone)]
struct Written {
    /// None: restored from a previous run's maps, not yet claimed by the model.
    id: Option<WorkloadEndpointId>,
    ifindex: u32,
    slot: [u32; 2],
    rules: [Arc<Vec<Rule>>; 2],
}

/// What one sync did (for logs, stats and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub rules_written: usize,
    pub endpoints_flipped: usize,
    pub endpoints_removed: usize,
    pub set_entries_added: usize,
    pub set_entries_removed: usize,
    pub slots_freed: usize,
    /// Interfaces whose endpoint exists but the interface not (yet).
    pub missing_interfaces: Vec<String>,
    pub refused: Vec<CompileError>,
    pub refused_endpoints: BTreeSet<WorkloadEndpointId>,
}

/// The incremental syncer.
#[derive(Debug, Default)]
pub struct Syncer {
    compiler: Compiler,
    written: BTreeMap<String, Written>,
    sets: BTreeMap<u32, BTreeSet<IpSetEntry>>,
    next_slot: u32,
    free_slots: Vec<u32>,
    /// Retired by the previous sync: (slot, rule count).
    retiring: Vec<(u32, usize)>,
    /// Retired by this sync.
    retired: Vec<(u32, usize)>,
    /// Workload-looking interfaces no endpoint claims, with programs and no entry (they drop).
    guarded: BTreeMap<String, u32>,
    /// Restored endpoint entries whose interface is gone: deleted by the first sync.
    stale_eps: Vec<u32>,
    /// Restored rules no endpoint entry reads (beyond a live slot's count): deleted by the
    /// first sync.
    stray_rules: Vec<(u32, u32)>,
}

/// What a previous run left in the maps, read by the loader at start.
#[derive(Debug, Clone, Default)]
pub struct Restored {
    pub endpoints: BTreeMap<u32, Endpoint>,
    pub rules: BTreeMap<(u32, u32), Rule>,
    pub sets: Vec<IpSetEntry>,
}

/// What [`Syncer::adopt`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdoptReport {
    /// Endpoint entries on live interfaces: kept, compared with the model at the first sync.
    pub endpoints: usize,
    /// Entries whose interface is gone (deleted by the first sync).
    pub stale_endpoints: usize,
    pub rules: usize,
    /// Slots no entry points at (freed by the first sync).
    pub orphan_slots: usize,
    pub set_entries: usize,
}

/// Stands for a rule missing from a restored slot (the program fails closed there); never
/// equal to a compiled rule, so the hook is rewritten by the first sync.
fn hole() -> Rule {
    Rule {
        action: u8::MAX,
        ..Rule::default()
    }
}

impl Syncer {
    pub fn new(cfg: CompileConfig) -> Syncer {
        Syncer {
            compiler: Compiler::new(cfg),
            ..Syncer::default()
        }
    }

    /// Endpoints programmed, by interface: (endpoint, ifindex, rule counts per hook). The
    /// endpoint is None for an entry restored from a previous run and not yet synced.
    pub fn endpoints(
        &self,
    ) -> impl Iterator<Item = (&String, Option<&WorkloadEndpointId>, u32, [usize; 2])> {
        self.written.iter().map(|(i, w)| {
            (
                i,
                w.id.as_ref(),
                w.ifindex,
                [w.rules[0].len(), w.rules[1].len()],
            )
        })
    }

    /// Interfaces whose programs this syncer wants: endpoints and guarded unknown ones.
    /// Anything else attached (left by a previous run) can be swept.
    pub fn owned_interfaces(&self) -> BTreeSet<String> {
        self.written
            .keys()
            .chain(self.guarded.keys())
            .cloned()
            .collect()
    }

    /// Takes over what a previous run left in the maps, so that its rules keep being
    /// enforced until the first sync, which then writes only what differs. Endpoint entries
    /// are matched to interfaces by index; the slot allocator continues above every slot
    /// in use; set ids in use stay reserved (their rules still reference them) until the
    /// first sync has replaced those rules and removed the old entries.
    pub fn adopt<K: Kernel>(&mut self, r: Restored, k: &K) -> AdoptReport {
        let names: BTreeMap<u32, String> =
            k.interfaces().into_iter().map(|(n, i)| (i, n)).collect();
        let mut report = AdoptReport {
            rules: r.rules.len(),
            set_entries: r.sets.len(),
            ..AdoptReport::default()
        };
        // Slot -> how many rules entries read from it.
        let mut used: BTreeMap<u32, u32> = BTreeMap::new();
        for (ifindex, ep) in &r.endpoints {
            let shared = (0..2).any(|h| used.contains_key(&ep.slot[h])) || ep.slot[0] == ep.slot[1];
            let Some(name) = names.get(ifindex).filter(|_| !shared) else {
                // Gone (or a corrupt entry sharing a slot): nothing can send through it.
                self.stale_eps.push(*ifindex);
                report.stale_endpoints += 1;
                continue;
            };
            let rules = [0, 1].map(|h| {
                let n = ep.count[h].min(crate::layout::MAX_RULES as u32);
                used.insert(ep.slot[h], n);
                Arc::new(
                    (0..n)
                        .map(|i| r.rules.get(&(ep.slot[h], i)).cloned().unwrap_or_else(hole))
                        .collect::<Vec<_>>(),
                )
            });
            self.written.insert(
                name.clone(),
                Written {
                    id: None,
                    ifindex: *ifindex,
                    slot: ep.slot,
                    rules,
                },
            );
            report.endpoints += 1;
        }
        let mut orphans: BTreeMap<u32, u32> = BTreeMap::new();
        let mut max_slot = None;
        for (slot, idx) in r.rules.keys() {
            max_slot = max_slot.max(Some(*slot));
            match used.get(slot) {
                Some(n) if idx < n => {}
                Some(_) => self.stray_rules.push((*slot, *idx)),
                None => {
                    let e = orphans.entry(*slot).or_default();
                    *e = (*e).max(idx.saturating_add(1));
                }
            }
        }
        for s in used.keys() {
            max_slot = max_slot.max(Some(*s));
        }
        report.orphan_slots = orphans.len();
        self.retiring
            .extend(orphans.into_iter().map(|(s, n)| (s, n as usize)));
        // Slots below the highest in use are not scanned for gaps: a corrupt slot number
        // must not cost memory. Retired slots are reused as usual.
        self.next_slot = max_slot.map_or(0, |m| m.saturating_add(1));
        self.free_slots.clear();
        let mut max_set = 0;
        for e in r.sets {
            max_set = max_set.max(e.set_id);
            self.sets.entry(e.set_id).or_default().insert(e);
        }
        for w in self.written.values() {
            for list in &w.rules {
                for rule in list.iter() {
                    for side in [&rule.src, &rule.dst] {
                        for id in side
                            .sets
                            .iter()
                            .chain(&side.not_sets)
                            .chain(&side.named)
                            .chain(&side.not_named)
                        {
                            max_set = max_set.max(*id);
                        }
                    }
                }
            }
        }
        self.compiler.reserve_set_ids(max_set);
        report
    }

    pub fn num_set_entries(&self) -> usize {
        self.sets.values().map(BTreeSet::len).sum()
    }

    fn alloc_slot(&mut self) -> u32 {
        self.free_slots.pop().unwrap_or_else(|| {
            let s = self.next_slot;
            self.next_slot += 1;
            s
        })
    }

    // `hook` indexes several parallel arrays (slots, old and new rule lists).
    #[allow(clippy::needless_range_loop)]
    pub fn sync<K: Kernel>(
        &mut self,
        model: &DataplaneModel,
        k: &mut K,
    ) -> Result<SyncReport, SyncError> {
        let mut report = SyncReport::default();
        // 0 (after a restore): what a previous run left that nothing reads.
        while let Some(ifindex) = self.stale_eps.last().copied() {
            k.del_endpoint(ifindex).map_err(err(format!(
                "removing a stale endpoint entry (ifindex {ifindex})"
            )))?;
            self.stale_eps.pop();
        }
        while let Some((slot, idx)) = self.stray_rules.last().copied() {
            k.del_rule(slot, idx)
                .map_err(err(format!("removing a stray rule of slot {slot}")))?;
            self.stray_rules.pop();
        }
        // 4 (from the previous sync): free the slots retired then.
        let retiring = std::mem::take(&mut self.retiring);
        for (i, (slot, n)) in retiring.iter().enumerate() {
            for idx in 0..*n {
                if let Err(e) = k.del_rule(*slot, idx as u32) {
                    // Keep what is left for the next attempt.
                    self.retiring.extend_from_slice(&retiring[i..]);
                    return Err(err(format!("deleting rules of retired slot {slot}"))(e));
                }
            }
            self.free_slots.push(*slot);
            report.slots_freed += 1;
        }
        let compiled = self.compiler.compile(model);
        report.refused = compiled.errors.clone();
        report.refused_endpoints = compiled.refused_endpoints.clone();

        // 1. Add set entries.
        for (id, want) in &compiled.sets {
            let have = self.sets.entry(*id).or_default();
            for e in want.difference(&have.clone()) {
                k.put_set_entry(e)
                    .map_err(err(format!("adding {:?} to IP set {id}", e.addr)))?;
                have.insert(*e);
                report.set_entries_added += 1;
            }
        }

        // 2. Endpoints: write changed hooks into fresh slots, then flip.
        let mut seen = BTreeSet::new();
        for (iface, ep) in &compiled.endpoints {
            let Some(ifindex) = k.ifindex(iface) else {
                report.missing_interfaces.push(iface.clone());
                continue;
            };
            seen.insert(iface.clone());
            let old = self.written.get(iface).cloned();
            if let Some(o) = &old
                && o.ifindex != ifindex
            {
                // The interface was recreated: its old index's entry goes.
                self.remove_endpoint(iface, k, &mut report)?;
            }
            let old = self.written.get(iface).cloned();
            k.attach(iface, ifindex)
                .map_err(err(format!("attaching to {iface}")))?;
            let mut slot = [0u32; 2];
            let mut changed = old.is_none();
            for hook in 0..2 {
                match &old {
                    Some(o)
                        if Arc::ptr_eq(&o.rules[hook], &ep.hooks[hook])
                            || o.rules[hook] == ep.hooks[hook] =>
                    {
                        slot[hook] = o.slot[hook]
                    }
                    _ => {
                        let s = self.alloc_slot();
                        for (idx, r) in ep.hooks[hook].iter().enumerate() {
                            if let Err(e) = k.put_rule(s, idx as u32, r) {
                                self.retired.push((s, idx + 1));
                                return Err(err(format!("writing rules for {iface}"))(e));
                            }
                            report.rules_written += 1;
                        }
                        slot[hook] = s;
                        changed = true;
                    }
                }
            }
            if !changed {
                // A restored entry the model claims unchanged: now it has an owner.
                if let Some(w) = self.written.get_mut(iface)
                    && w.id.is_none()
                {
                    w.id = Some(ep.id.clone());
                }
                continue;
            }
            let entry = Endpoint {
                slot,
                count: [ep.hooks[0].len() as u32, ep.hooks[1].len() as u32],
                flags: 0,
            };
            if let Err(e) = k.put_endpoint(ifindex, &entry) {
                for hook in 0..2 {
                    if old.as_ref().is_none_or(|o| o.slot[hook] != slot[hook]) {
                        self.retired.push((slot[hook], ep.hooks[hook].len()));
                    }
                }
                return Err(err(format!("writing the endpoint entry of {iface}"))(e));
            }
            report.endpoints_flipped += 1;
            if let Some(o) = &old {
                for hook in 0..2 {
                    if o.slot[hook] != slot[hook] {
                        self.retired.push((o.slot[hook], o.rules[hook].len()));
                    }
                }
            }
            self.written.insert(
                iface.clone(),
                Written {
                    id: Some(ep.id.clone()),
                    ifindex,
                    slot,
                    rules: ep.hooks.clone(),
                },
            );
        }
        let gone: Vec<String> = self
            .written
            .keys()
            .filter(|i| !seen.contains(*i))
            .cloned()
            .collect();
        for iface in gone {
            self.remove_endpoint(&iface, k, &mut report)?;
        }

        // 3. Remove set entries nobody wants.
        let ids: Vec<u32> = self.sets.keys().copied().collect();
        for id in ids {
            let want = compiled.sets.get(&id);
            let have = self.sets.get(&id).cloned().unwrap_or_default();
            for e in &have {
                if want.is_none_or(|w| !w.contains(e)) {
                    k.del_set_entry(e)
                        .map_err(err(format!("removing {:?} from IP set {id}", e.addr)))?;
                    if let Some(h) = self.sets.get_mut(&id) {
                        h.remove(e);
                    }
                    report.set_entries_removed += 1;
                }
            }
            if self.sets.get(&id).is_some_and(BTreeSet::is_empty) && want.is_none() {
                self.sets.remove(&id);
            }
        }
        self.retiring.append(&mut self.retired);
        Ok(report)
    }

    /// Attaches the programs to every interface whose name starts with one of `prefixes`
    /// and that no endpoint claims: without an endpoint entry they drop everything, as the
    /// nftables dataplane drops unknown workload interfaces. Returns how many are guarded.
    pub fn guard_unknown<K: Kernel>(
        &mut self,
        prefixes: &[String],
        k: &mut K,
    ) -> Result<usize, SyncError> {
        let now: BTreeMap<String, u32> = k
            .interfaces()
            .into_iter()
            .filter(|(n, _)| {
                prefixes
                    .iter()
                    .any(|p| !p.is_empty() && n.starts_with(p.as_str()))
                    && !self.written.contains_key(n)
            })
            .collect();
        let stale: Vec<String> = self
            .guarded
            .iter()
            .filter(|(n, i)| now.get(*n) != Some(*i))
            .map(|(n, _)| n.clone())
            .collect();
        for n in stale {
            self.guarded.remove(&n);
            if !self.written.contains_key(&n) {
                k.detach(&n);
            }
        }
        for (n, i) in now {
            if self.guarded.get(&n) == Some(&i) {
                continue;
            }
            k.attach(&n, i)
                .map_err(err(format!("attaching to unknown workload interface {n}")))?;
            tracing::info!(iface = %n, "eBPF: no endpoint for this workload interface: its traffic is dropped");
            self.guarded.insert(n, i);
        }
        Ok(self.guarded.len())
    }

    fn remove_endpoint<K: Kernel>(
        &mut self,
        iface: &str,
        k: &mut K,
        report: &mut SyncReport,
    ) -> Result<(), SyncError> {
        let Some(w) = self.written.get(iface) else {
            return Ok(());
        };
        k.del_endpoint(w.ifindex)
            .map_err(err(format!("removing the endpoint entry of {iface}")))?;
        k.detach(iface);
        for hook in 0..2 {
            self.retired.push((w.slot[hook], w.rules[hook].len()));
        }
        self.written.remove(iface);
        report.endpoints_removed += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use margay_api::net::Cidr;
    use margay_calc::{
        PolicyId, PortRange, ResolvedMatch, ResolvedPolicy, ResolvedProfile, ResolvedRule,
        RuleAction, TierInfo, WorkloadEndpointData,
    };

    use super::*;

    /// An in-memory kernel that checks the update protocol's invariant at every flip: the
    /// slots an endpoint entry points at hold exactly its rules, and every set they use
    /// has its entries.
    #[derive(Default)]
    struct Fake {
        links: HashMap<String, u32>,
        attached: BTreeSet<String>,
        rules: HashMap<(u32, u32), Rule>,
        eps: HashMap<u32, Endpoint>,
        sets: BTreeSet<IpSetEntry>,
        writes: usize,
        fail_rule_writes_after: Option<usize>,
    }

    impl Kernel for Fake {
        type Error = String;
        fn ifindex(&self, iface: &str) -> Option<u32> {
            self.links.get(iface).copied()
        }
        fn interfaces(&self) -> Vec<(String, u32)> {
            self.links.iter().map(|(n, i)| (n.clone(), *i)).collect()
        }
        fn attach(&mut self, iface: &str, _ifindex: u32) -> Result<(), String> {
            self.attached.insert(iface.to_string());
            Ok(())
        }
        fn detach(&mut self, iface: &str) {
            self.attached.remove(iface);
        }
        fn put_rule(&mut self, slot: u32, idx: u32, rule: &Rule) -> Result<(), String> {
            if let Some(n) = &mut self.fail_rule_writes_after {
                if *n == 0 {
                    return Err("injected failure".into());
                }
                *n -= 1;
            }
            self.writes += 1;
            self.rules.insert((slot, idx), rule.clone());
            Ok(())
        }
        fn del_rule(&mut self, slot: u32, idx: u32) -> Result<(), String> {
            self.writes += 1;
            self.rules.remove(&(slot, idx));
            Ok(())
        }
        fn put_endpoint(&mut self, ifindex: u32, ep: &Endpoint) -> Result<(), String> {
            for hook in 0..2 {
                for idx in 0..ep.count[hook] {
                    let r = self
                        .rules
                        .get(&(ep.slot[hook], idx))
                        .ok_or(format!("flip to slot {} before rule {idx}", ep.slot[hook]))?;
                    for id in r.src.sets.iter().chain(&r.dst.sets) {
                        assert!(
                            self.sets.iter().any(|e| e.set_id == *id),
                            "flip before set {id} has entries"
                        );
                    }
                }
                // Nothing else in the slot: a longer old list would not be read anyway,
                // but a fresh slot must be clean.
                assert!(!self.rules.contains_key(&(ep.slot[hook], ep.count[hook])));
            }
            self.writes += 1;
            self.eps.insert(ifindex, *ep);
            Ok(())
        }
        fn del_endpoint(&mut self, ifindex: u32) -> Result<(), String> {
            self.writes += 1;
            self.eps.remove(&ifindex);
            Ok(())
        }
        fn put_set_entry(&mut self, e: &IpSetEntry) -> Result<(), String> {
            self.writes += 1;
            self.sets.insert(*e);
            Ok(())
        }
        fn del_set_entry(&mut self, e: &IpSetEntry) -> Result<(), String> {
            self.writes += 1;
            self.sets.remove(e);
            Ok(())
        }
    }

    fn allow_from(set: &str, port: u16) -> ResolvedRule {
        ResolvedRule {
            action: RuleAction::Allow,
            ip_version: None,
            protocol: Some(6),
            not_protocol: None,
            icmp: None,
            not_icmp: None,
            src: ResolvedMatch {
                ip_set_ids: vec![set.into()],
                ..ResolvedMatch::default()
            },
            dst: ResolvedMatch {
                ports: vec![PortRange {
                    first: port,
                    last: port,
                }],
                ..ResolvedMatch::default()
            },
            rule_id: String::new(),
        }
    }

    fn model(port: u16, members: &[&str]) -> DataplaneModel {
        let mut m = DataplaneModel::default();
        m.ip_sets.insert(
            "s:a".into(),
            (
                margay_calc::IpSetKind::Net,
                members
                    .iter()
                    .map(|c| margay_calc::IpSetMember::Net(Cidr::parse(c).expect("cidr")))
                    .collect(),
            ),
        );
        let pid = PolicyId {
            tier: "default".into(),
            namespace: String::new(),
            name: "p".into(),
        };
        m.policies.insert(
            pid.clone(),
            Arc::new(ResolvedPolicy {
                tier: "default".into(),
                inbound: vec![allow_from("s:a", port)],
                ..ResolvedPolicy::default()
            }),
        );
        m.profiles
            .insert("prof".into(), Arc::new(ResolvedProfile::default()));
        for (i, iface) in ["cali-a", "cali-b", "cali-c"].iter().enumerate() {
            let tiers = if *iface == "cali-c" {
                vec![]
            } else {
                vec![TierInfo {
                    name: "default".into(),
                    default_action: RuleAction::Deny,
                    ingress_policies: vec![pid.clone()],
                    egress_policies: vec![],
                }]
            };
            m.workload_endpoints.insert(
                WorkloadEndpointId {
                    orchestrator: "k8s".into(),
                    workload: format!("ns/{iface}"),
                    endpoint: "eth0".into(),
                },
                Arc::new(WorkloadEndpointData {
                    interface: iface.to_string(),
                    mac: String::new(),
                    ipv4_nets: vec![Cidr::parse(&format!("10.0.0.{}/32", i + 1)).expect("cidr")],
                    ipv6_nets: vec![],
                    profile_ids: vec!["prof".into()],
                    tiers,
                    name: iface.to_string(),
                    namespace: "ns".into(),
                    allow_spoofed_source_prefixes: vec![],
                }),
            );
        }
        m
    }

    fn fake() -> Fake {
        let mut f = Fake::default();
        for (i, n) in ["cali-a", "cali-b", "cali-c"].iter().enumerate() {
            f.links.insert(n.to_string(), 10 + i as u32);
        }
        f
    }

    #[test]
    fn a_policy_change_rewrites_only_the_endpoints_using_it_and_frees_old_slots_later() {
        let mut k = fake();
        let mut s = Syncer::default();
        let r = s.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        assert_eq!(r.endpoints_flipped, 3);
        assert_eq!(k.attached.len(), 3);
        assert_eq!(k.eps.len(), 3);
        // The same model again writes nothing.
        let before = k.writes;
        let r = s.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        assert_eq!((r.rules_written, r.endpoints_flipped), (0, 0));
        assert_eq!(k.writes, before);
        // The policy changes: a and b (which use it) get one new ingress slot each; c not.
        let rules_before = k.rules.len();
        let r = s.sync(&model(443, &["10.1.0.0/16"]), &mut k).expect("sync");
        assert_eq!(r.endpoints_flipped, 2);
        assert_eq!(
            r.rules_written,
            2 * 2,
            "one policy rule and the end of tier, twice"
        );
        assert_eq!(r.slots_freed, 0, "old slots stay one sync");
        assert_eq!(k.rules.len(), rules_before + 4);
        let r = s.sync(&model(443, &["10.1.0.0/16"]), &mut k).expect("sync");
        assert_eq!(r.slots_freed, 2);
        assert_eq!(k.rules.len(), rules_before);
    }

    #[test]
    fn membership_changes_are_set_entry_writes_only() {
        let mut k = fake();
        let mut s = Syncer::default();
        s.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        let r = s
            .sync(&model(80, &["10.1.0.0/16", "10.2.0.0/16"]), &mut k)
            .expect("sync");
        assert_eq!(
            (r.set_entries_added, r.rules_written, r.endpoints_flipped),
            (1, 0, 0)
        );
        let r = s.sync(&model(80, &["10.2.0.0/16"]), &mut k).expect("sync");
        assert_eq!((r.set_entries_removed, r.rules_written), (1, 0));
    }

    #[test]
    fn removed_and_missing_interfaces_and_a_failed_write_retry_cleanly() {
        let mut k = fake();
        k.links.remove("cali-c");
        let mut s = Syncer::default();
        let r = s.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        assert_eq!(r.missing_interfaces, vec!["cali-c".to_string()]);
        assert_eq!(k.eps.len(), 2);
        // The interface appears; a rule write fails midway: no flip happened for it.
        k.links.insert("cali-c".into(), 12);
        k.fail_rule_writes_after = Some(1);
        assert!(s.sync(&model(80, &["10.1.0.0/16"]), &mut k).is_err());
        assert!(!k.eps.contains_key(&12));
        k.fail_rule_writes_after = None;
        s.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("retry");
        assert!(k.eps.contains_key(&12));
        // An endpoint leaves the model: entry deleted, detached, slots freed a sync later.
        let mut m = model(80, &["10.1.0.0/16"]);
        m.workload_endpoints
            .retain(|id, _| id.workload != "ns/cali-a");
        let r = s.sync(&m, &mut k).expect("sync");
        assert_eq!(r.endpoints_removed, 1);
        assert!(!k.eps.contains_key(&10) && !k.attached.contains("cali-a"));
        s.sync(&m, &mut k).expect("sync");
        s.sync(&m, &mut k).expect("sync");
        let live: usize = k
            .eps
            .values()
            .map(|e| (e.count[0] + e.count[1]) as usize)
            .sum();
        assert_eq!(k.rules.len(), live, "no rule outlives its slot");
    }

    #[test]
    fn a_new_syncer_adopts_what_the_maps_hold_and_its_first_sync_rewrites_only_that() {
        let mut k = fake();
        let mut s = Syncer::default();
        s.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        // Leftovers of a crash: a slot no entry reads, an entry whose interface is gone.
        k.rules.insert((999, 3), Rule::default());
        k.eps.insert(
            77,
            Endpoint {
                slot: [500, 501],
                count: [0, 0],
                flags: 0,
            },
        );
        let old_ids: BTreeSet<u32> = k.sets.iter().map(|e| e.set_id).collect();
        let restored = Restored {
            endpoints: k.eps.iter().map(|(i, e)| (*i, *e)).collect(),
            rules: k.rules.iter().map(|(a, r)| (*a, r.clone())).collect(),
            sets: k.sets.iter().copied().collect(),
        };
        let eps_before = k.eps.clone();
        let mut s2 = Syncer::default();
        let a = s2.adopt(restored, &k);
        assert_eq!(
            (a.endpoints, a.stale_endpoints, a.orphan_slots),
            (3, 1, 1),
            "{a:?}"
        );
        assert_eq!(k.eps, eps_before, "adopting writes nothing");
        assert!(s2.endpoints().all(|(_, id, _, _)| id.is_none()));
        assert_eq!(s2.owned_interfaces().len(), 3);
        // The first sync: the Fake checks at every flip that the new slots and sets are
        // complete; set ids never reuse the restored ones (old rules still read them).
        let r = s2.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        assert!(r.endpoints_flipped <= 3);
        assert!(!k.eps.contains_key(&77), "the stale entry is gone");
        assert!(!k.rules.contains_key(&(999, 3)) || r.slots_freed == 1);
        let new_ids: BTreeSet<u32> = k.sets.iter().map(|e| e.set_id).collect();
        assert!(
            new_ids.is_disjoint(&old_ids),
            "{new_ids:?} vs {old_ids:?}: old set entries are removed, no id reused"
        );
        assert!(s2.endpoints().all(|(_, id, _, _)| id.is_some()));
        // A second sync writes nothing; after it every rule belongs to a live slot.
        let r = s2.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        assert_eq!((r.rules_written, r.endpoints_flipped), (0, 0));
        s2.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        let live: usize = k
            .eps
            .values()
            .map(|e| (e.count[0] + e.count[1]) as usize)
            .sum();
        assert_eq!(k.rules.len(), live, "no rule outlives its slot");
        // New slots never collide with the restored ones still in use.
        let mut slots: Vec<u32> = k.eps.values().flat_map(|e| e.slot).collect();
        let n = slots.len();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), n);
    }

    #[test]
    fn a_restored_endpoint_the_model_does_not_change_is_not_rewritten() {
        // An endpoint whose rules reference no IP set (no addresses: no anti-spoofing set,
        // no policy): its restored rules compare equal to the compiled ones.
        let mut m = model(80, &[]);
        m.workload_endpoints
            .retain(|id, _| id.workload == "ns/cali-c");
        for ep in m.workload_endpoints.values_mut() {
            Arc::make_mut(ep).ipv4_nets.clear();
        }
        let mut k = fake();
        let mut s = Syncer::default();
        s.sync(&m, &mut k).expect("sync");
        assert!(k.sets.is_empty());
        let restored = Restored {
            endpoints: k.eps.iter().map(|(i, e)| (*i, *e)).collect(),
            rules: k.rules.iter().map(|(a, r)| (*a, r.clone())).collect(),
            sets: vec![],
        };
        let mut s2 = Syncer::default();
        s2.adopt(restored, &k);
        let before = k.writes;
        let r = s2.sync(&m, &mut k).expect("sync");
        assert_eq!(r.endpoints_flipped, 0, "{r:?}");
        assert_eq!(k.writes, before, "nothing differs, nothing is written");
        assert!(s2.endpoints().all(|(_, id, _, _)| id.is_some()), "claimed");
    }

    #[test]
    fn unknown_workload_interfaces_get_programs_and_no_entry() {
        let mut k = fake();
        k.links.insert("caliunknown".into(), 20);
        k.links.insert("eth0".into(), 2);
        let mut s = Syncer::default();
        s.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        let prefixes = vec!["cali".to_string()];
        assert_eq!(s.guard_unknown(&prefixes, &mut k).expect("guard"), 1);
        assert!(k.attached.contains("caliunknown") && !k.attached.contains("eth0"));
        assert!(!k.eps.contains_key(&20), "no entry: the program drops");
        // A known endpoint leaves: its interface becomes unknown and stays guarded.
        let mut m = model(80, &["10.1.0.0/16"]);
        m.workload_endpoints
            .retain(|id, _| id.workload != "ns/cali-a");
        s.sync(&m, &mut k).expect("sync");
        assert_eq!(s.guard_unknown(&prefixes, &mut k).expect("guard"), 2);
        assert!(k.attached.contains("cali-a") && !k.eps.contains_key(&10));
        // Gone interfaces are forgotten.
        k.links.remove("caliunknown");
        assert_eq!(s.guard_unknown(&prefixes, &mut k).expect("guard"), 1);
        assert!(!k.attached.contains("caliunknown"));
    }
}
