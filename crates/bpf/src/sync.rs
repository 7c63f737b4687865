//! Keeps the maps equal to the compiled model, with as few writes as possible.
//!
//! Storage: each block (a policy's or profile's rules for a hook, an endpoint's guards) is
//! stored once, its rules in a slot of `mgy_rules` and its entry `mgy_blocks[id] = {slot,
//! count}`; each endpoint hook is a short list of steps (block ids, tier ends) in a slot of
//! `mgy_steps`, pointed at by its `mgy_eps` entry.
//!
//! Update protocol (no packet sees half a policy):
//! 1. New IP-set entries are added (an entry nobody references yet changes no verdict).
//! 2. For each block whose rules changed, the new rules are written into a fresh slot, then
//!    the block's entry is replaced in one map write (the flip, for every endpoint using the
//!    policy at once). A packet reads a block's entry once, so it evaluates the old rules
//!    or the new ones, whole. New blocks get a fresh id the same way.
//! 3. For each endpoint hook whose steps changed (policies added to it or removed, tiers),
//!    the new steps are written into a fresh slot, then the endpoint's entry is replaced in
//!    one map write pointing at the new slots.
//! 4. Endpoints gone are removed; blocks no endpoint uses any more are retired.
//! 5. Set entries no longer wanted are removed.
//! 6. Slots and block ids retired are deleted one sync later (a packet that read the old
//!    entry just before the flip finishes long before), then reused.
//!
//! An endpoint whose interface does not exist yet is left pending and retried on the next
//! sync. A failed write leaves what was written recorded, so the next sync continues from
//! there.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use margay_calc::{DataplaneModel, WorkloadEndpointId};

use crate::compile::{BlockKey, CompileConfig, CompileError, Compiler, Step};
use crate::index::Summary;
use crate::layout::{Block, Endpoint, IpSetEntry, MAX_RULES, Rule, STEP_BLOCK, STEP_DENY, StepEnc};

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
    fn put_step(&mut self, slot: u32, idx: u32, step: &StepEnc) -> Result<(), Self::Error>;
    fn del_step(&mut self, slot: u32, idx: u32) -> Result<(), Self::Error>;
    fn put_block(&mut self, id: u32, block: &Block) -> Result<(), Self::Error>;
    fn del_block(&mut self, id: u32) -> Result<(), Self::Error>;
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
    /// The compiled steps written; None for a restored hook (compared by `restored`).
    steps: [Option<Arc<Vec<Step>>>; 2],
    /// A restored hook's encoded steps (empty once written by this run).
    restored: [Vec<StepEnc>; 2],
    count: [usize; 2],
    /// The hook's index entries in its slot (beyond the main list; see `index.rs`).
    extra: [Arc<[(u32, StepEnc)]>; 2],
}

#[derive(Debug, Clone)]
struct WrittenBlock {
    id: u32,
    slot: u32,
    rules: Arc<Vec<Rule>>,
    /// What the endpoints' indexes know of it.
    summary: Arc<Summary>,
}

/// Something to delete one sync after it stopped being read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Retired {
    Rules {
        slot: u32,
        n: usize,
    },
    Steps {
        slot: u32,
        n: usize,
    },
    /// A step slot's index entries (listed before the slot's `Steps`, which frees it).
    StepIdx {
        slot: u32,
        idxs: Arc<[u32]>,
    },
    Block(u32),
}

/// Index entries all endpoints together may hold in `mgy_steps` (an eighth of the map): the
/// index only saves time, the main lists must always fit, also while a policy's port change
/// rewrites every indexed endpoint (their old slots stay one sync: twice their entries).
const INDEX_BUDGET: usize = 32768;

/// What one sync did (for logs, stats and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub rules_written: usize,
    /// Blocks whose entry was written (new, or its rules changed).
    pub blocks_flipped: usize,
    pub steps_written: usize,
    pub endpoints_flipped: usize,
    pub endpoints_removed: usize,
    pub set_entries_added: usize,
    pub set_entries_removed: usize,
    /// Slots and block ids freed.
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
    blocks: HashMap<Arc<BlockKey>, WrittenBlock>,
    sets: BTreeMap<u32, BTreeSet<IpSetEntry>>,
    /// Rule and step slots share one allocator.
    next_slot: u32,
    free_slots: BTreeSet<u32>,
    next_block: u32,
    free_blocks: BTreeSet<u32>,
    /// Retired by the previous sync.
    retiring: Vec<Retired>,
    /// Retired by this sync.
    retired: Vec<Retired>,
    /// Workload-looking interfaces no endpoint claims, with programs and no entry (they drop).
    guarded: BTreeMap<String, u32>,
    /// Restored endpoint entries whose interface is gone: deleted by the first sync.
    stale_eps: Vec<u32>,
    /// Restored rules and steps nothing reads (beyond a live slot's count): deleted by the
    /// first sync.
    stray_rules: Vec<(u32, u32)>,
    stray_steps: Vec<(u32, u32)>,
    /// Restored blocks no compiled block has claimed yet, by content: (id, slot).
    unclaimed: HashMap<Vec<Rule>, Vec<(u32, u32)>>,
    /// Index entries the written endpoints hold (bounded by `INDEX_BUDGET`).
    index_entries: usize,
    /// Blocks whose summary changed, until every endpoint indexing them was rewritten.
    resummarized: HashSet<Arc<BlockKey>>,
    /// No index for endpoints written from now on (benchmarks: the linear walk).
    index_off: bool,
    /// The restored IP sets, by id, until the first sync matched them to the model's by
    /// content (`Compiler::match_restored_sets`).
    restored_sets: Option<BTreeMap<u32, BTreeSet<IpSetEntry>>>,
}

/// What a previous run left in the maps, read by the loader at start.
#[derive(Debug, Clone, Default)]
pub struct Restored {
    pub endpoints: BTreeMap<u32, Endpoint>,
    pub steps: BTreeMap<(u32, u32), StepEnc>,
    pub blocks: BTreeMap<u32, Block>,
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
    pub blocks: usize,
    pub rules: usize,
    /// Slots no entry points at (freed by the first sync).
    pub orphan_slots: usize,
    pub set_entries: usize,
}

/// Stands for a rule missing from a restored block (the program fails closed there); never
/// equal to a compiled rule, so the block is never claimed.
fn hole() -> Rule {
    Rule {
        action: u8::MAX,
        ..Rule::default()
    }
}

/// Stands for a missing restored step: never equal to an encoded compiled step.
const HOLE_STEP: StepEnc = StepEnc {
    kind: u32::MAX,
    block: 0,
    pass_to: 0,
};

impl Syncer {
    pub fn new(cfg: CompileConfig) -> Syncer {
        Syncer {
            compiler: Compiler::new(cfg),
            ..Syncer::default()
        }
    }

    /// Turns the per-hook index off (on by default) for the endpoints written from now on:
    /// the program then walks every step (to measure what the index saves).
    pub fn set_index(&mut self, on: bool) {
        self.index_off = !on;
    }

    /// Endpoints programmed, by interface: (endpoint, ifindex, step counts per hook). The
    /// endpoint is None for an entry restored from a previous run and not yet synced.
    pub fn endpoints(
        &self,
    ) -> impl Iterator<Item = (&String, Option<&WorkloadEndpointId>, u32, [usize; 2])> {
        self.written
            .iter()
            .map(|(i, w)| (i, w.id.as_ref(), w.ifindex, w.count))
    }

    /// What the written slots and deny steps mean, for flow events (see [`crate::flows`]).
    /// Costs one pass over the blocks and the endpoints' steps.
    pub fn flow_names(&self) -> crate::flows::FlowNames {
        let mut n = crate::flows::FlowNames::default();
        for (key, b) in &self.blocks {
            n.slots.insert(b.slot, key.clone());
        }
        for w in self.written.values() {
            for (hook, steps) in w.steps.iter().enumerate() {
                let Some(steps) = steps else { continue };
                for (i, s) in steps.iter().enumerate() {
                    if let Step::Deny(tier) = s {
                        n.deny_steps
                            .insert((w.ifindex, hook as u8, i as u32), tier.clone());
                    }
                }
            }
        }
        n
    }

    /// Blocks stored: (count, rules).
    pub fn num_blocks(&self) -> (usize, usize) {
        (
            self.blocks.len(),
            self.blocks.values().map(|b| b.rules.len()).sum(),
        )
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

    pub fn num_set_entries(&self) -> usize {
        self.sets.values().map(BTreeSet::len).sum()
    }

    fn alloc_slot(&mut self) -> u32 {
        self.free_slots.pop_first().unwrap_or_else(|| {
            let s = self.next_slot;
            self.next_slot = self.next_slot.saturating_add(1);
            s
        })
    }

    fn alloc_block(&mut self) -> u32 {
        self.free_blocks.pop_first().unwrap_or_else(|| {
            let s = self.next_block;
            self.next_block = self.next_block.saturating_add(1);
            s
        })
    }

    /// Takes over what a previous run left in the maps, so that its rules keep being
    /// enforced until the first sync, which then writes only what differs: blocks are
    /// claimed by content (a compiled block equal to a restored one keeps its id and slot),
    /// endpoint entries are matched to interfaces by index and compared step by step. The
    /// allocators continue above every slot and block id in use; set ids in use stay
    /// reserved (restored rules still reference them) until the first sync replaced them.
    pub fn adopt<K: Kernel>(&mut self, r: Restored, k: &K) -> AdoptReport {
        let names: BTreeMap<u32, String> =
            k.interfaces().into_iter().map(|(n, i)| (i, n)).collect();
        let mut report = AdoptReport {
            rules: r.rules.len(),
            blocks: r.blocks.len(),
            set_entries: r.sets.len(),
            ..AdoptReport::default()
        };
        let mut max_slot: Option<u32> = None;
        let mut max_block: Option<u32> = None;
        // Slot -> entries read from it; a slot read twice (a corrupt map) is owned once.
        let mut rule_slots: BTreeMap<u32, u32> = BTreeMap::new();
        let mut step_slots: BTreeMap<u32, u32> = BTreeMap::new();
        // A live step slot's index entries (not strays).
        let mut extra_steps: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
        // An orphan step slot's entries, listed (index entries sit at INDEX_BASE and above).
        let mut orphan_steps: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (id, b) in &r.blocks {
            max_block = max_block.max(Some(*id));
            if rule_slots.contains_key(&b.slot) {
                self.retired.push(Retired::Block(*id));
                continue;
            }
            let n = b.count.min(MAX_RULES as u32);
            rule_slots.insert(b.slot, n);
            let rules: Vec<Rule> = (0..n)
                .map(|i| r.rules.get(&(b.slot, i)).cloned().unwrap_or_else(hole))
                .collect();
            self.unclaimed.entry(rules).or_default().push((*id, b.slot));
        }
        for (ifindex, ep) in &r.endpoints {
            let shared =
                ep.slot[0] == ep.slot[1] || (0..2).any(|h| step_slots.contains_key(&ep.slot[h]));
            let Some(name) = names.get(ifindex).filter(|_| !shared) else {
                // Gone (or corrupt): nothing sends through it.
                self.stale_eps.push(*ifindex);
                report.stale_endpoints += 1;
                continue;
            };
            let restored = [0, 1].map(|h| {
                let n = ep.count[h].min(MAX_RULES as u32);
                step_slots.insert(ep.slot[h], n);
                (0..n)
                    .map(|i| r.steps.get(&(ep.slot[h], i)).copied().unwrap_or(HOLE_STEP))
                    .collect::<Vec<_>>()
            });
            // The slot's entries beyond the main list: its index (compared at the first
            // sync, retired with the slot).
            let extra = [0, 1].map(|h| {
                let n = restored[h].len() as u32;
                let e: Arc<[(u32, StepEnc)]> = r
                    .steps
                    .range((ep.slot[h], n)..=(ep.slot[h], u32::MAX))
                    .map(|((_, i), st)| (*i, *st))
                    .collect();
                e
            });
            for (s, e) in ep.slot.iter().zip(&extra) {
                extra_steps.insert(*s, e.iter().map(|(i, _)| *i).collect());
            }
            self.index_entries += extra[0].len() + extra[1].len();
            self.written.insert(
                name.clone(),
                Written {
                    id: None,
                    ifindex: *ifindex,
                    slot: ep.slot,
                    steps: [None, None],
                    count: [restored[0].len(), restored[1].len()],
                    restored,
                    extra,
                },
            );
            report.endpoints += 1;
        }
        let mut orphans: BTreeMap<u32, (bool, u32)> = BTreeMap::new();
        for ((slot, idx), is_rule) in r
            .rules
            .keys()
            .map(|k| (k, true))
            .chain(r.steps.keys().map(|k| (k, false)))
        {
            max_slot = max_slot.max(Some(*slot));
            let used = if is_rule { &rule_slots } else { &step_slots };
            let stray = if is_rule {
                &mut self.stray_rules
            } else {
                &mut self.stray_steps
            };
            match used.get(slot) {
                Some(n) if idx < n => {}
                Some(_) if !is_rule && extra_steps.get(slot).is_some_and(|e| e.contains(idx)) => {}
                Some(_) => stray.push((*slot, *idx)),
                None if !is_rule => orphan_steps.entry(*slot).or_default().push(*idx),
                None => {
                    let e = orphans.entry(*slot).or_insert((is_rule, 0));
                    e.1 = e.1.max(idx.saturating_add(1));
                }
            }
        }
        for s in rule_slots.keys().chain(step_slots.keys()) {
            max_slot = max_slot.max(Some(*s));
        }
        report.orphan_slots = orphans.len() + orphan_steps.len();
        for (slot, idxs) in orphan_steps {
            self.retired.push(Retired::StepIdx {
                slot,
                idxs: idxs.into(),
            });
            self.retired.push(Retired::Steps { slot, n: 0 });
        }
        for (slot, (is_rule, n)) in orphans {
            let n = n as usize;
            self.retired.push(if is_rule {
                Retired::Rules { slot, n }
            } else {
                Retired::Steps { slot, n }
            });
        }
        // Gaps below the highest slot are not scanned: a corrupt number costs no memory.
        self.next_slot = max_slot.map_or(0, |m| m.saturating_add(1));
        self.next_block = max_block.map_or(0, |m| m.saturating_add(1));
        self.free_slots.clear();
        self.free_blocks.clear();
        let mut max_set = 0;
        for e in r.sets {
            max_set = max_set.max(e.set_id);
            self.sets.entry(e.set_id).or_default().insert(e);
        }
        for rules in self.unclaimed.keys() {
            for rule in rules {
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
        self.compiler.reserve_set_ids(max_set);
        self.restored_sets = Some(self.sets.clone());
        report
    }

    fn free(&mut self, k: &mut impl Kernel, r: &Retired) -> Result<(), SyncError> {
        let r = r.clone();
        match r {
            Retired::Rules { slot, n } => {
                for idx in 0..n {
                    k.del_rule(slot, idx as u32)
                        .map_err(err(format!("deleting rules of retired slot {slot}")))?;
                }
                self.free_slots.insert(slot);
            }
            Retired::Steps { slot, n } => {
                for idx in 0..n {
                    k.del_step(slot, idx as u32)
                        .map_err(err(format!("deleting steps of retired slot {slot}")))?;
                }
                self.free_slots.insert(slot);
            }
            Retired::StepIdx { slot, idxs } => {
                for idx in idxs.iter() {
                    k.del_step(slot, *idx)
                        .map_err(err(format!("deleting the index of retired slot {slot}")))?;
                }
            }
            Retired::Block(id) => {
                k.del_block(id)
                    .map_err(err(format!("deleting retired block {id}")))?;
                self.free_blocks.insert(id);
            }
        }
        Ok(())
    }

    fn encode_steps(&self, steps: &[Step]) -> Result<Vec<StepEnc>, SyncError> {
        steps
            .iter()
            .map(|s| match s {
                Step::Deny(_) => Ok(StepEnc {
                    kind: STEP_DENY,
                    block: 0,
                    pass_to: 0,
                }),
                Step::Block { key, pass_to } => match self.blocks.get(key) {
                    Some(b) => Ok(StepEnc {
                        kind: STEP_BLOCK,
                        block: b.id,
                        pass_to: *pass_to,
                    }),
                    None => Err(SyncError {
                        what: format!("block {key:?}"),
                        reason: "referenced but not written (a compiler bug)".into(),
                    }),
                },
            })
            .collect()
    }

    /// The hook's index entries (see `index.rs`) from its blocks' summaries; none when the
    /// index would not fit `INDEX_BUDGET` (besides `freed`, the entries the hook's current
    /// index, to be retired, holds).
    fn encode_index(&self, steps: &[Step], freed: usize) -> Vec<(u32, StepEnc)> {
        let main: Vec<Option<&Summary>> = steps
            .iter()
            .map(|s| match s {
                Step::Deny(_) => None,
                // (A block not written fails `encode_steps` first.)
                Step::Block { key, .. } => self.blocks.get(key).map(|b| &*b.summary),
            })
            .collect();
        if self.index_off {
            return Vec::new();
        }
        let extra = crate::index::build(&main);
        if self.index_entries.saturating_sub(freed) + extra.len() > INDEX_BUDGET {
            return Vec::new();
        }
        extra
    }

    /// Writes one block's rules into a fresh slot and points its entry there (the flip).
    fn write_block<K: Kernel>(
        &mut self,
        k: &mut K,
        key: &Arc<BlockKey>,
        rules: &Arc<Vec<Rule>>,
        report: &mut SyncReport,
    ) -> Result<(), SyncError> {
        let old = self.blocks.get(key).cloned();
        let slot = self.alloc_slot();
        for (idx, r) in rules.iter().enumerate() {
            if let Err(e) = k.put_rule(slot, idx as u32, r) {
                self.retired.push(Retired::Rules { slot, n: idx + 1 });
                return Err(err(format!("writing the rules of {key:?}"))(e));
            }
            report.rules_written += 1;
        }
        let id = match &old {
            Some(o) => o.id,
            None => self.alloc_block(),
        };
        let entry = Block {
            slot,
            count: rules.len() as u32,
        };
        if let Err(e) = k.put_block(id, &entry) {
            self.retired.push(Retired::Rules {
                slot,
                n: rules.len(),
            });
            if old.is_none() {
                self.retired.push(Retired::Block(id));
            }
            return Err(err(format!("writing the entry of {key:?}"))(e));
        }
        report.blocks_flipped += 1;
        if let Some(o) = old {
            self.retired.push(Retired::Rules {
                slot: o.slot,
                n: o.rules.len(),
            });
        }
        self.blocks.insert(
            key.clone(),
            WrittenBlock {
                id,
                slot,
                rules: rules.clone(),
                summary: Arc::new(crate::index::summary(rules)),
            },
        );
        Ok(())
    }

    // `hook` indexes several parallel arrays (slots, old and new step lists).
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
        while let Some((slot, idx)) = self.stray_steps.last().copied() {
            k.del_step(slot, idx)
                .map_err(err(format!("removing a stray step of slot {slot}")))?;
            self.stray_steps.pop();
        }
        // 6 (from the previous sync): free what was retired then.
        let retiring = std::mem::take(&mut self.retiring);
        for (i, r) in retiring.iter().enumerate() {
            if let Err(e) = self.free(k, r) {
                // Keep what is left for the next attempt.
                self.retiring.extend_from_slice(&retiring[i..]);
                return Err(e);
            }
            report.slots_freed += 1;
        }
        if let Some(restored) = self.restored_sets.take() {
            let n = self.compiler.match_restored_sets(model, &restored);
            tracing::debug!(
                matched = n,
                restored = restored.len(),
                "eBPF: restored IP sets matched by content"
            );
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

        // 2. Blocks: new or changed rules into fresh slots, then flip the block's entry.
        for (key, rules) in &compiled.blocks {
            if let Some(w) = self.blocks.get(key)
                && (Arc::ptr_eq(&w.rules, rules) || w.rules == *rules)
            {
                continue;
            }
            if !self.blocks.contains_key(key)
                && let Some(list) = self.unclaimed.get_mut(rules.as_slice())
                && let Some((id, slot)) = list.pop()
            {
                // A restored block with the same rules: kept as it is.
                self.blocks.insert(
                    key.clone(),
                    WrittenBlock {
                        id,
                        slot,
                        rules: rules.clone(),
                        summary: Arc::new(crate::index::summary(rules)),
                    },
                );
                continue;
            }
            // A block whose summary changes leaves the indexes of the endpoints using it
            // stale until step 3 rewrites them. Meanwhile a packet the stale index sends
            // past the block is one the old rules did not match: it sees the policy's old
            // version, whole, as a packet that read the block's entry before the flip.
            if let Some(old) = self.blocks.get(key)
                && *old.summary != crate::index::summary(rules)
            {
                self.resummarized.insert(key.clone());
            }
            self.write_block(k, key, rules, &mut report)?;
        }

        // 3. Endpoints: write changed hooks' steps into fresh slots, then flip.
        let mut seen = BTreeSet::new();
        for (iface, ep) in &compiled.endpoints {
            let Some(ifindex) = k.ifindex(iface) else {
                report.missing_interfaces.push(iface.clone());
                continue;
            };
            seen.insert(iface.clone());
            if let Some(o) = self.written.get(iface)
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
            let mut extra: [Arc<[(u32, StepEnc)]>; 2] = [Arc::from([]), Arc::from([])];
            for hook in 0..2 {
                let stale_index = |steps: &[Step]| {
                    !self.resummarized.is_empty()
                        && steps.iter().any(|s| {
                            matches!(s, Step::Block { key, .. } if self.resummarized.contains(key))
                        })
                };
                let same = match &old {
                    None => false,
                    Some(o) => match &o.steps[hook] {
                        Some(s) => {
                            (Arc::ptr_eq(s, &ep.steps[hook]) || **s == *ep.steps[hook])
                                && (o.extra[hook].is_empty() || !stale_index(s))
                        }
                        None => {
                            self.encode_steps(&ep.steps[hook])? == o.restored[hook]
                                && *self.encode_index(&ep.steps[hook], o.extra[hook].len())
                                    == *o.extra[hook]
                        }
                    },
                };
                if let (true, Some(o)) = (same, &old) {
                    slot[hook] = o.slot[hook];
                    extra[hook] = o.extra[hook].clone();
                    continue;
                }
                let enc = self.encode_steps(&ep.steps[hook])?;
                let freed = old.as_ref().map_or(0, |o| o.extra[hook].len());
                let idx_enc: Arc<[(u32, StepEnc)]> =
                    self.encode_index(&ep.steps[hook], freed).into();
                let s = self.alloc_slot();
                // The main list, then its index (nothing reads the slot before the flip).
                for (idx, st) in enc.iter().enumerate() {
                    if let Err(e) = k.put_step(s, idx as u32, st) {
                        self.retired.push(Retired::Steps {
                            slot: s,
                            n: idx + 1,
                        });
                        return Err(err(format!("writing the steps of {iface}"))(e));
                    }
                    report.steps_written += 1;
                }
                for (i, (idx, st)) in idx_enc.iter().enumerate() {
                    if let Err(e) = k.put_step(s, *idx, st) {
                        self.retired.push(Retired::StepIdx {
                            slot: s,
                            idxs: idx_enc[..=i].iter().map(|(x, _)| *x).collect(),
                        });
                        self.retired.push(Retired::Steps {
                            slot: s,
                            n: enc.len(),
                        });
                        return Err(err(format!("writing the index of {iface}"))(e));
                    }
                    report.steps_written += 1;
                }
                self.index_entries += idx_enc.len();
                extra[hook] = idx_enc;
                slot[hook] = s;
                changed = true;
            }
            if !changed {
                // A restored entry the model claims unchanged: now it has an owner.
                if let Some(w) = self.written.get_mut(iface)
                    && (w.id.is_none() || w.steps.iter().any(Option::is_none))
                {
                    w.id = Some(ep.id.clone());
                    w.steps = [Some(ep.steps[0].clone()), Some(ep.steps[1].clone())];
                    w.restored = [Vec::new(), Vec::new()];
                }
                continue;
            }
            let count = [ep.steps[0].len(), ep.steps[1].len()];
            let entry = Endpoint {
                slot,
                count: [count[0] as u32, count[1] as u32],
                flags: 0,
            };
            if let Err(e) = k.put_endpoint(ifindex, &entry) {
                for hook in 0..2 {
                    if old.as_ref().is_none_or(|o| o.slot[hook] != slot[hook]) {
                        self.retire_index(slot[hook], &extra[hook]);
                        self.retired.push(Retired::Steps {
                            slot: slot[hook],
                            n: count[hook],
                        });
                    }
                }
                return Err(err(format!("writing the endpoint entry of {iface}"))(e));
            }
            report.endpoints_flipped += 1;
            if let Some(o) = &old {
                for hook in 0..2 {
                    if o.slot[hook] != slot[hook] {
                        self.retire_index(o.slot[hook], &o.extra[hook]);
                        self.retired.push(Retired::Steps {
                            slot: o.slot[hook],
                            n: o.count[hook],
                        });
                    }
                }
            }
            self.written.insert(
                iface.clone(),
                Written {
                    id: Some(ep.id.clone()),
                    ifindex,
                    slot,
                    steps: [Some(ep.steps[0].clone()), Some(ep.steps[1].clone())],
                    restored: [Vec::new(), Vec::new()],
                    count,
                    extra,
                },
            );
        }
        // Every indexed endpoint using a resummarized block has its index rewritten.
        self.resummarized.clear();
        // 4. Endpoints gone; blocks nothing uses (every endpoint has flipped away).
        let gone: Vec<String> = self
            .written
            .keys()
            .filter(|i| !seen.contains(*i))
            .cloned()
            .collect();
        for iface in gone {
            self.remove_endpoint(&iface, k, &mut report)?;
        }
        let unused: Vec<Arc<BlockKey>> = self
            .blocks
            .keys()
            .filter(|key| !compiled.blocks.contains_key(*key))
            .cloned()
            .collect();
        for key in unused {
            if let Some(b) = self.blocks.remove(&key) {
                self.retired.push(Retired::Block(b.id));
                self.retired.push(Retired::Rules {
                    slot: b.slot,
                    n: b.rules.len(),
                });
            }
        }
        for (rules, list) in std::mem::take(&mut self.unclaimed) {
            for (id, slot) in list {
                self.retired.push(Retired::Block(id));
                self.retired.push(Retired::Rules {
                    slot,
                    n: rules.len(),
                });
            }
        }

        // 5. Remove set entries nobody wants.
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

    /// Retires a step slot's index entries (before the slot itself).
    fn retire_index(&mut self, slot: u32, extra: &[(u32, StepEnc)]) {
        if extra.is_empty() {
            return;
        }
        self.index_entries = self.index_entries.saturating_sub(extra.len());
        self.retired.push(Retired::StepIdx {
            slot,
            idxs: extra.iter().map(|(i, _)| *i).collect(),
        });
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
        let w = w.clone();
        for hook in 0..2 {
            self.retire_index(w.slot[hook], &w.extra[hook]);
            self.retired.push(Retired::Steps {
                slot: w.slot[hook],
                n: w.count[hook],
            });
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
    use crate::layout::{Block, STEP_BLOCK, StepEnc};

    /// An in-memory kernel that checks the update protocol's invariant at every flip: the
    /// slots an entry points at hold exactly its rules or steps, every block a step names
    /// exists, and every set a rule uses has its entries.
    #[derive(Default)]
    struct Fake {
        links: HashMap<String, u32>,
        attached: BTreeSet<String>,
        rules: HashMap<(u32, u32), Rule>,
        steps: HashMap<(u32, u32), StepEnc>,
        blocks: HashMap<u32, Block>,
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
        fn put_step(&mut self, slot: u32, idx: u32, step: &StepEnc) -> Result<(), String> {
            self.writes += 1;
            self.steps.insert((slot, idx), *step);
            Ok(())
        }
        fn del_step(&mut self, slot: u32, idx: u32) -> Result<(), String> {
            self.writes += 1;
            self.steps.remove(&(slot, idx));
            Ok(())
        }
        fn put_block(&mut self, id: u32, b: &Block) -> Result<(), String> {
            for idx in 0..b.count {
                let r = self
                    .rules
                    .get(&(b.slot, idx))
                    .ok_or(format!("flip to slot {} before rule {idx}", b.slot))?;
                for id in r.src.sets.iter().chain(&r.dst.sets) {
                    assert!(
                        self.sets.iter().any(|e| e.set_id == *id),
                        "flip before set {id} has entries"
                    );
                }
            }
            // A fresh slot is clean.
            assert!(!self.rules.contains_key(&(b.slot, b.count)));
            self.writes += 1;
            self.blocks.insert(id, *b);
            Ok(())
        }
        fn del_block(&mut self, id: u32) -> Result<(), String> {
            self.writes += 1;
            self.blocks.remove(&id);
            Ok(())
        }
        fn put_endpoint(&mut self, ifindex: u32, ep: &Endpoint) -> Result<(), String> {
            for hook in 0..2 {
                for idx in 0..ep.count[hook] {
                    let s = self
                        .steps
                        .get(&(ep.slot[hook], idx))
                        .ok_or(format!("flip to slot {} before step {idx}", ep.slot[hook]))?;
                    if s.kind == STEP_BLOCK {
                        assert!(self.blocks.contains_key(&s.block), "flip before block");
                    }
                }
                // The slot holds exactly the main list and its index, built from the rules
                // the blocks hold now.
                assert_eq!(
                    self.extras(ep.slot[hook], ep.count[hook]),
                    self.expected_index(ep.slot[hook], ep.count[hook]),
                    "flip to a stale or partial index"
                );
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

    impl Fake {
        /// A step slot's entries beyond its main list.
        fn extras(&self, slot: u32, count: u32) -> BTreeMap<u32, StepEnc> {
            self.steps
                .iter()
                .filter(|((s, i), _)| *s == slot && *i >= count)
                .map(|((_, i), st)| (*i, *st))
                .collect()
        }

        /// The index the slot's main list should have with the blocks as they are.
        fn expected_index(&self, slot: u32, count: u32) -> BTreeMap<u32, StepEnc> {
            let sums: Vec<Option<crate::index::Summary>> = (0..count)
                .map(|i| {
                    let s = self.steps.get(&(slot, i))?;
                    if s.kind != STEP_BLOCK {
                        return None;
                    }
                    let b = *self.blocks.get(&s.block)?;
                    let rules: Vec<Rule> = (0..b.count)
                        .filter_map(|r| self.rules.get(&(b.slot, r)).cloned())
                        .collect();
                    Some(crate::index::summary(&rules))
                })
                .collect();
            let refs: Vec<Option<&crate::index::Summary>> =
                sums.iter().map(Option::as_ref).collect();
            crate::index::build(&refs).into_iter().collect()
        }

        /// Every rule and step belongs to a live entry; every block entry is read; every
        /// endpoint's index is exact for the rules its blocks hold.
        fn assert_no_leftovers(&self) {
            for ep in self.eps.values() {
                for hook in 0..2 {
                    assert_eq!(
                        self.extras(ep.slot[hook], ep.count[hook]),
                        self.expected_index(ep.slot[hook], ep.count[hook]),
                        "a stale index after a sync"
                    );
                }
            }
            let live_steps: usize = self
                .eps
                .values()
                .map(|e| {
                    (0..2)
                        .map(|h| e.count[h] as usize + self.extras(e.slot[h], e.count[h]).len())
                        .sum::<usize>()
                })
                .sum();
            assert_eq!(self.steps.len(), live_steps, "no step outlives its slot");
            let live_rules: usize = self.blocks.values().map(|b| b.count as usize).sum();
            assert_eq!(self.rules.len(), live_rules, "no rule outlives its slot");
            let used: BTreeSet<u32> = self
                .steps
                .values()
                .filter(|s| s.kind == STEP_BLOCK)
                .map(|s| s.block)
                .collect();
            for id in self.blocks.keys() {
                assert!(used.contains(id), "block {id} is read by no step");
            }
        }

        fn restored(&self) -> Restored {
            Restored {
                endpoints: self.eps.iter().map(|(i, e)| (*i, *e)).collect(),
                steps: self.steps.iter().map(|(a, s)| (*a, *s)).collect(),
                blocks: self.blocks.iter().map(|(i, b)| (*i, *b)).collect(),
                rules: self.rules.iter().map(|(a, r)| (*a, r.clone())).collect(),
                sets: self.sets.iter().copied().collect(),
            }
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
    fn a_policy_change_rewrites_only_its_block_once_and_frees_old_slots_later() {
        let mut k = fake();
        let mut s = Syncer::default();
        let r = s.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        assert_eq!(r.endpoints_flipped, 3);
        assert_eq!(k.attached.len(), 3);
        assert_eq!(k.eps.len(), 3);
        // The policy (ingress of a and b) is stored once: one block, one rule.
        let pol = Arc::new(BlockKey::Policy(
            PolicyId {
                tier: "default".into(),
                namespace: String::new(),
                name: "p".into(),
            },
            crate::layout::HOOK_TO_WL,
        ));
        assert_eq!(s.blocks[&pol].rules.len(), 1);
        // The same model again writes nothing.
        let before = k.writes;
        let r = s.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        assert_eq!((r.rules_written, r.endpoints_flipped), (0, 0));
        assert_eq!(k.writes, before);
        // The policy changes (its action; same ports): its block's one rule is written once
        // and its entry flipped; no endpoint entry or step is touched.
        let before = k.writes;
        let rules_before = k.rules.len();
        let mut denied = model(80, &["10.1.0.0/16"]);
        for p in denied.policies.values_mut() {
            let mut np = (**p).clone();
            np.inbound[0].action = RuleAction::Deny;
            *p = Arc::new(np);
        }
        let r = s.sync(&denied, &mut k).expect("sync");
        assert_eq!(
            (
                r.rules_written,
                r.blocks_flipped,
                r.steps_written,
                r.endpoints_flipped
            ),
            (1, 1, 0, 0),
            "{r:?}"
        );
        assert_eq!(k.writes, before + 2);
        assert_eq!(r.slots_freed, 0, "old slots stay one sync");
        assert_eq!(k.rules.len(), rules_before + 1);
        let r = s.sync(&denied, &mut k).expect("sync");
        assert_eq!(r.slots_freed, 1);
        assert_eq!(k.rules.len(), rules_before);
        k.assert_no_leftovers();
        // A change of its port changes what the endpoints' indexes must say: the block is
        // flipped, then the two endpoints using it (a and b, not c) get new steps and index.
        let r = s.sync(&model(443, &["10.1.0.0/16"]), &mut k).expect("sync");
        assert_eq!(
            (r.rules_written, r.blocks_flipped, r.endpoints_flipped),
            (1, 1, 2),
            "{r:?}"
        );
        // Per endpoint: the main list (policy, tier end), one default ref (the tier end),
        // the default entry, one ref to the policy's step and the port's entry.
        assert_eq!(r.steps_written, 2 * 6, "{r:?}");
        let r = s.sync(&model(443, &["10.1.0.0/16"]), &mut k).expect("sync");
        assert_eq!((r.rules_written, r.steps_written), (0, 0));
        k.assert_no_leftovers();
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
        // The interface appears; a rule write (its guard block) fails midway: no flip
        // happened for it.
        k.links.insert("cali-c".into(), 12);
        let mut m = model(80, &["10.1.0.0/16"]);
        for (id, ep) in m.workload_endpoints.iter_mut() {
            if id.workload == "ns/cali-c" {
                Arc::make_mut(ep)
                    .ipv4_nets
                    .push(Cidr::parse("10.0.9.9/32").expect("cidr"));
            }
        }
        k.fail_rule_writes_after = Some(0);
        assert!(s.sync(&m, &mut k).is_err());
        assert!(!k.eps.contains_key(&12));
        k.fail_rule_writes_after = None;
        s.sync(&m, &mut k).expect("retry");
        assert!(k.eps.contains_key(&12));
        // An endpoint leaves the model: entry deleted, detached, slots freed a sync later.
        m.workload_endpoints
            .retain(|id, _| id.workload != "ns/cali-a");
        let r = s.sync(&m, &mut k).expect("sync");
        assert_eq!(r.endpoints_removed, 1);
        assert!(!k.eps.contains_key(&10) && !k.attached.contains("cali-a"));
        s.sync(&m, &mut k).expect("sync");
        s.sync(&m, &mut k).expect("sync");
        k.assert_no_leftovers();
    }

    #[test]
    fn a_new_syncer_adopts_what_the_maps_hold_and_its_first_sync_rewrites_only_that() {
        let mut k = fake();
        let mut s = Syncer::default();
        s.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        s.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        // Leftovers of a crash: a slot nothing reads, an entry whose interface is gone.
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
        let blocks_before = k.blocks.clone();
        let eps_before = k.eps.clone();
        let mut s2 = Syncer::default();
        let a = s2.adopt(k.restored(), &k);
        assert_eq!(
            (a.endpoints, a.stale_endpoints, a.orphan_slots),
            (3, 1, 1),
            "{a:?}"
        );
        assert_eq!(k.eps, eps_before, "adopting writes nothing");
        assert!(s2.endpoints().all(|(_, id, _, _)| id.is_none()));
        assert_eq!(s2.owned_interfaces().len(), 3);
        // The first sync: the Fake checks every flip. Every restored set has its model
        // set's entries (the policy's set, each endpoint's own address): each keeps its id,
        // so every block and endpoint is claimed as it is: nothing is written.
        let r = s2.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        assert_eq!(
            (
                r.rules_written,
                r.steps_written,
                r.endpoints_flipped,
                r.set_entries_added
            ),
            (0, 0, 0, 0),
            "{r:?}"
        );
        assert!(!k.eps.contains_key(&77), "the stale entry is gone");
        let new_ids: BTreeSet<u32> = k.sets.iter().map(|e| e.set_id).collect();
        assert_eq!(new_ids, old_ids);
        assert_eq!(k.blocks, blocks_before);
        assert!(s2.endpoints().all(|(_, id, _, _)| id.is_some()));
        let r = s2.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        assert_eq!((r.rules_written, r.endpoints_flipped), (0, 0));
        s2.sync(&model(80, &["10.1.0.0/16"]), &mut k).expect("sync");
        k.assert_no_leftovers();
        assert!(!k.rules.contains_key(&(999, 3)));
        // New slots never collide: every live slot is distinct.
        let mut slots: Vec<u32> = k.eps.values().flat_map(|e| e.slot).collect();
        slots.extend(k.blocks.values().map(|b| b.slot));
        let n = slots.len();
        slots.sort_unstable();
        slots.dedup();
        assert_eq!(slots.len(), n);

        // A set whose members changed while nobody ran matches nothing: it gets an id never
        // used before (old rules still read the old ones) and its blocks are rewritten.
        let mut s3 = Syncer::default();
        s3.adopt(k.restored(), &k);
        let r = s3
            .sync(&model(80, &["10.1.0.0/16", "10.9.0.0/16"]), &mut k)
            .expect("sync");
        assert_eq!(r.rules_written, 1, "the policy's block only: {r:?}");
        let ids: BTreeSet<u32> = k.sets.iter().map(|e| e.set_id).collect();
        assert_eq!(
            ids.difference(&old_ids).count(),
            1,
            "{ids:?} vs {old_ids:?}"
        );
        let max_old = old_ids.iter().max().copied().unwrap_or_default();
        assert!(ids.difference(&old_ids).all(|id| *id > max_old));
        s3.sync(&model(80, &["10.1.0.0/16", "10.9.0.0/16"]), &mut k)
            .expect("sync");
        s3.sync(&model(80, &["10.1.0.0/16", "10.9.0.0/16"]), &mut k)
            .expect("sync");
        k.assert_no_leftovers();
    }

    #[test]
    fn a_restored_endpoint_the_model_does_not_change_is_not_rewritten() {
        // An endpoint whose rules reference no IP set (no addresses: no anti-spoofing set,
        // no policy): its restored blocks and steps compare equal to the compiled ones.
        let mut m = model(80, &[]);
        m.workload_endpoints
            .retain(|id, _| id.workload == "ns/cali-c");
        for ep in m.workload_endpoints.values_mut() {
            Arc::make_mut(ep).ipv4_nets.clear();
        }
        let mut k = fake();
        let mut s = Syncer::default();
        s.sync(&m, &mut k).expect("sync");
        assert!(k.sets.is_empty() && !k.blocks.is_empty());
        let mut s2 = Syncer::default();
        s2.adopt(k.restored(), &k);
        let before = k.writes;
        let r = s2.sync(&m, &mut k).expect("sync");
        assert_eq!((r.endpoints_flipped, r.blocks_flipped), (0, 0), "{r:?}");
        assert_eq!(k.writes, before, "nothing differs, nothing is written");
        assert!(s2.endpoints().all(|(_, id, _, _)| id.is_some()), "claimed");
        s2.sync(&m, &mut k).expect("sync");
        k.assert_no_leftovers();
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
