//! The label index: which labelled items (endpoints, network sets) each selector matches,
//! maintained incrementally as items, their parents' labels and selectors come and go.
//!
//! Items inherit labels from parents (profiles): an item's effective labels are its own, then
//! each parent's in order, the first value found winning. Selectors are indexed by the label
//! restriction that narrows them most (`app == "web"` is only evaluated against items with
//! that label value), so an item update evaluates a handful of selectors, not all of them, and
//! a new selector evaluates the items that can match, not all of them.

use std::collections::{BTreeMap, HashMap, HashSet};

use margay_selector::Selector;

pub type ItemId = u32;
pub type SelId = u32;
pub type LabelMap = BTreeMap<String, String>;

/// A change in which items a selector matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatchChange {
    pub selector: SelId,
    pub item: ItemId,
    pub matched: bool,
}

#[derive(Debug, Default)]
struct ItemEntry {
    own: LabelMap,
    parents: Vec<String>,
    effective: LabelMap,
    /// Sorted.
    matched: Vec<SelId>,
}

#[derive(Debug, Default)]
struct ParentEntry {
    labels: LabelMap,
    children: HashSet<ItemId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum IndexKey {
    /// The label must have one of these values.
    Values(String, Vec<String>),
    /// The label must be present.
    Present(String),
    /// Evaluated against every item.
    Unindexed,
}

#[derive(Debug)]
struct SelEntry {
    selector: Selector,
    key: IndexKey,
    matches: HashSet<ItemId>,
    refs: u32,
}

/// Items by label and value, for finding a new selector's candidates.
#[derive(Debug, Default)]
struct ItemsByLabel {
    by_value: HashMap<String, HashMap<String, HashSet<ItemId>>>,
}

impl ItemsByLabel {
    fn add(&mut self, id: ItemId, labels: &LabelMap) {
        for (k, v) in labels {
            // Look up before inserting: most labels and values exist already, and `entry`
            // would allocate a key each time.
            let values = match self.by_value.get_mut(k) {
                Some(values) => values,
                None => self.by_value.entry(k.clone()).or_default(),
            };
            match values.get_mut(v) {
                Some(ids) => {
                    ids.insert(id);
                }
                None => {
                    values.insert(v.clone(), HashSet::from([id]));
                }
            }
        }
    }

    fn remove(&mut self, id: ItemId, labels: &LabelMap) {
        for (k, v) in labels {
            if let Some(values) = self.by_value.get_mut(k) {
                if let Some(ids) = values.get_mut(v) {
                    ids.remove(&id);
                    if ids.is_empty() {
                        values.remove(v);
                    }
                }
                if values.is_empty() {
                    self.by_value.remove(k);
                }
            }
        }
    }

    fn count_values(&self, label: &str, values: &[String]) -> usize {
        self.by_value.get(label).map_or(0, |m| {
            values
                .iter()
                .map(|v| m.get(v).map_or(0, HashSet::len))
                .sum()
        })
    }

    fn count_label(&self, label: &str) -> usize {
        self.by_value
            .get(label)
            .map_or(0, |m| m.values().map(HashSet::len).sum())
    }
}

/// Selectors by the index key chosen for them.
#[derive(Debug, Default)]
struct SelectorsByLabel {
    by_value: HashMap<String, HashMap<String, HashSet<SelId>>>,
    by_label: HashMap<String, HashSet<SelId>>,
    unindexed: HashSet<SelId>,
}

impl SelectorsByLabel {
    fn add(&mut self, id: SelId, key: &IndexKey) {
        match key {
            IndexKey::Values(label, values) => {
                let m = self.by_value.entry(label.clone()).or_default();
                for v in values {
                    m.entry(v.clone()).or_default().insert(id);
                }
            }
            IndexKey::Present(label) => {
                self.by_label.entry(label.clone()).or_default().insert(id);
            }
            IndexKey::Unindexed => {
                self.unindexed.insert(id);
            }
        }
    }

    fn remove(&mut self, id: SelId, key: &IndexKey) {
        match key {
            IndexKey::Values(label, values) => {
                if let Some(m) = self.by_value.get_mut(label) {
                    for v in values {
                        if let Some(ids) = m.get_mut(v) {
                            ids.remove(&id);
                            if ids.is_empty() {
                                m.remove(v);
                            }
                        }
                    }
                    if m.is_empty() {
                        self.by_value.remove(label);
                    }
                }
            }
            IndexKey::Present(label) => {
                if let Some(ids) = self.by_label.get_mut(label) {
                    ids.remove(&id);
                    if ids.is_empty() {
                        self.by_label.remove(label);
                    }
                }
            }
            IndexKey::Unindexed => {
                self.unindexed.remove(&id);
            }
        }
    }

    /// Every selector that could match an item with these labels.
    fn candidates(&self, labels: &LabelMap, out: &mut Vec<SelId>) {
        out.clear();
        out.extend(self.unindexed.iter().copied());
        for (k, v) in labels {
            if let Some(ids) = self.by_value.get(k).and_then(|m| m.get(v)) {
                out.extend(ids.iter().copied());
            }
            if let Some(ids) = self.by_label.get(k) {
                out.extend(ids.iter().copied());
            }
        }
        out.sort_unstable();
        out.dedup();
    }
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct LabelIndex {
    items: HashMap<ItemId, ItemEntry>,
    next_item: ItemId,
    free_items: Vec<ItemId>,
    parents: HashMap<String, ParentEntry>,
    items_by_label: ItemsByLabel,
    selectors: HashMap<SelId, SelEntry>,
    selector_ids: HashMap<String, SelId>,
    next_sel: SelId,
    sel_index: SelectorsByLabel,
    scratch: Vec<SelId>,
    /// Selector evaluations done (for benchmarks and the status API).
    pub evaluations: u64,
}

fn effective_labels(
    own: &LabelMap,
    parents: &[String],
    parent_map: &HashMap<String, ParentEntry>,
) -> LabelMap {
    let mut eff = own.clone();
    for p in parents {
        if let Some(entry) = parent_map.get(p) {
            for (k, v) in &entry.labels {
                if !eff.contains_key(k) {
                    eff.insert(k.clone(), v.clone());
                }
            }
        }
    }
    eff
}

impl LabelIndex {
    pub fn new() -> LabelIndex {
        LabelIndex::default()
    }

    pub fn num_items(&self) -> usize {
        self.items.len()
    }

    pub fn num_selectors(&self) -> usize {
        self.selectors.len()
    }

    /// Allocates an id for a new item (not yet indexed; call [`LabelIndex::update_item`]).
    pub fn new_item_id(&mut self) -> ItemId {
        if let Some(id) = self.free_items.pop() {
            return id;
        }
        let id = self.next_item;
        self.next_item += 1;
        id
    }

    pub fn effective_labels(&self, id: ItemId) -> Option<&LabelMap> {
        self.items.get(&id).map(|e| &e.effective)
    }

    /// The selectors matching an item.
    pub fn item_matches(&self, id: ItemId) -> &[SelId] {
        self.items.get(&id).map_or(&[], |e| e.matched.as_slice())
    }

    /// Adds or updates an item. Returns whether its effective labels changed.
    pub fn update_item(
        &mut self,
        id: ItemId,
        own: LabelMap,
        parents: Vec<String>,
        changes: &mut Vec<MatchChange>,
    ) -> bool {
        let existing = self.items.remove(&id);
        let is_new = existing.is_none();
        let mut entry = existing.unwrap_or_default();
        if entry.parents != parents {
            for p in &entry.parents {
                if let Some(pe) = self.parents.get_mut(p) {
                    pe.children.remove(&id);
                }
            }
            for p in &parents {
                self.parents
                    .entry(p.clone())
                    .or_default()
                    .children
                    .insert(id);
            }
            // Entries with neither labels nor children are dropped lazily in `gc_parent`.
            for p in &entry.parents {
                self.gc_parent(p);
            }
        }
        let effective = effective_labels(&own, &parents, &self.parents);
        entry.own = own;
        entry.parents = parents;
        let changed = is_new || entry.effective != effective;
        if changed {
            self.items_by_label.remove(id, &entry.effective);
            self.items_by_label.add(id, &effective);
            entry.effective = effective;
            self.rematch(id, &mut entry, changes);
        }
        self.items.insert(id, entry);
        changed
    }

    /// Removes an item, reporting the selectors that no longer match it.
    pub fn remove_item(&mut self, id: ItemId, changes: &mut Vec<MatchChange>) {
        let Some(entry) = self.items.remove(&id) else {
            return;
        };
        self.items_by_label.remove(id, &entry.effective);
        for p in &entry.parents {
            if let Some(pe) = self.parents.get_mut(p) {
                pe.children.remove(&id);
            }
            self.gc_parent(p);
        }
        for sel in entry.matched {
            if let Some(s) = self.selectors.get_mut(&sel) {
                s.matches.remove(&id);
            }
            changes.push(MatchChange {
                selector: sel,
                item: id,
                matched: false,
            });
        }
        self.free_items.push(id);
    }

    fn gc_parent(&mut self, name: &str) {
        if self
            .parents
            .get(name)
            .is_some_and(|p| p.labels.is_empty() && p.children.is_empty())
        {
            self.parents.remove(name);
        }
    }

    /// Sets (or, with `None`, clears) a parent's labels. Returns the items whose effective
    /// labels changed.
    pub fn update_parent(
        &mut self,
        name: &str,
        labels: Option<LabelMap>,
        changes: &mut Vec<MatchChange>,
    ) -> Vec<ItemId> {
        let labels = labels.unwrap_or_default();
        let entry = self.parents.entry(name.to_string()).or_default();
        if entry.labels == labels {
            return Vec::new();
        }
        entry.labels = labels;
        let mut children: Vec<ItemId> = entry.children.iter().copied().collect();
        children.sort_unstable();
        self.gc_parent(name);
        let mut changed = Vec::new();
        for id in children {
            let Some(mut item) = self.items.remove(&id) else {
                continue;
            };
            let effective = effective_labels(&item.own, &item.parents, &self.parents);
            if effective != item.effective {
                self.items_by_label.remove(id, &item.effective);
                self.items_by_label.add(id, &effective);
                item.effective = effective;
                self.rematch(id, &mut item, changes);
                changed.push(id);
            }
            self.items.insert(id, item);
        }
        changed
    }

    fn rematch(&mut self, id: ItemId, item: &mut ItemEntry, changes: &mut Vec<MatchChange>) {
        let mut candidates = std::mem::take(&mut self.scratch);
        self.sel_index.candidates(&item.effective, &mut candidates);
        let mut now: Vec<SelId> = Vec::new();
        for sel in &candidates {
            if let Some(s) = self.selectors.get(sel) {
                self.evaluations += 1;
                if s.selector.matches(&item.effective) {
                    now.push(*sel);
                }
            }
        }
        self.scratch = candidates;
        // Both sorted: merge to find the differences.
        let before = std::mem::take(&mut item.matched);
        let (mut i, mut j) = (0, 0);
        while i < before.len() || j < now.len() {
            let b = before.get(i).copied();
            let n = now.get(j).copied();
            match (b, n) {
                (Some(b), Some(n)) if b == n => {
                    i += 1;
                    j += 1;
                }
                (Some(b), n) if n.is_none_or(|n| b < n) => {
                    if let Some(s) = self.selectors.get_mut(&b) {
                        s.matches.remove(&id);
                    }
                    changes.push(MatchChange {
                        selector: b,
                        item: id,
                        matched: false,
                    });
                    i += 1;
                }
                (_, Some(n)) => {
                    if let Some(s) = self.selectors.get_mut(&n) {
                        s.matches.insert(id);
                    }
                    changes.push(MatchChange {
                        selector: n,
                        item: id,
                        matched: true,
                    });
                    j += 1;
                }
                (_, None) => break,
            }
        }
        item.matched = now;
    }

    /// Takes a reference on a selector, indexing it (and computing its matches) if it is new.
    /// New matches are reported.
    pub fn acquire(&mut self, selector: &Selector, changes: &mut Vec<MatchChange>) -> SelId {
        if let Some(id) = self.selector_ids.get(selector.unique_id()) {
            if let Some(s) = self.selectors.get_mut(id) {
                s.refs += 1;
            }
            return *id;
        }
        let id = self.next_sel;
        self.next_sel += 1;
        let key = self.choose_key(selector);
        let candidates: Vec<ItemId> = match &key {
            IndexKey::Values(label, values) => {
                let mut c: Vec<ItemId> = Vec::new();
                if let Some(m) = self.items_by_label.by_value.get(label) {
                    for v in values {
                        if let Some(ids) = m.get(v) {
                            c.extend(ids.iter().copied());
                        }
                    }
                }
                c
            }
            IndexKey::Present(label) => self
                .items_by_label
                .by_value
                .get(label)
                .map(|m| m.values().flatten().copied().collect())
                .unwrap_or_default(),
            IndexKey::Unindexed => self.items.keys().copied().collect(),
        };
        let mut matches = HashSet::new();
        for item_id in candidates {
            let Some(item) = self.items.get_mut(&item_id) else {
                continue;
            };
            self.evaluations += 1;
            if selector.matches(&item.effective) && matches.insert(item_id) {
                // New ids are the largest, so pushing keeps `matched` sorted.
                item.matched.push(id);
                changes.push(MatchChange {
                    selector: id,
                    item: item_id,
                    matched: true,
                });
            }
        }
        self.sel_index.add(id, &key);
        self.selector_ids
            .insert(selector.unique_id().to_string(), id);
        self.selectors.insert(
            id,
            SelEntry {
                selector: selector.clone(),
                key,
                matches,
                refs: 1,
            },
        );
        id
    }

    /// Drops a reference; the last one un-indexes the selector (no changes are reported: its
    /// users are going away).
    pub fn release(&mut self, id: SelId) {
        let Some(s) = self.selectors.get_mut(&id) else {
            return;
        };
        s.refs -= 1;
        if s.refs > 0 {
            return;
        }
        let Some(s) = self.selectors.remove(&id) else {
            return;
        };
        self.sel_index.remove(id, &s.key);
        self.selector_ids.remove(s.selector.unique_id());
        for item in s.matches {
            if let Some(e) = self.items.get_mut(&item)
                && let Ok(pos) = e.matched.binary_search(&id)
            {
                e.matched.remove(pos);
            }
        }
    }

    pub fn matches(&self, id: SelId) -> impl Iterator<Item = ItemId> + '_ {
        self.selectors
            .get(&id)
            .into_iter()
            .flat_map(|s| s.matches.iter().copied())
    }

    pub fn selector(&self, id: SelId) -> Option<&Selector> {
        self.selectors.get(&id).map(|s| &s.selector)
    }

    /// Picks the restriction with the fewest candidate items right now.
    fn choose_key(&self, selector: &Selector) -> IndexKey {
        let restrictions = selector.restrictions();
        if !restrictions.can_match() {
            // Matches nothing; any key works. Use one no item has.
            return IndexKey::Values(String::new(), Vec::new());
        }
        let mut best: Option<(usize, IndexKey)> = None;
        for (label, r) in &restrictions.labels {
            let candidate = if let Some(values) = &r.must_have_one_of_values {
                let values: Vec<String> = values.iter().cloned().collect();
                let n = self.items_by_label.count_values(label, &values);
                (n, IndexKey::Values(label.clone(), values))
            } else if r.must_be_present {
                (
                    self.items_by_label.count_label(label),
                    IndexKey::Present(label.clone()),
                )
            } else {
                continue;
            };
            if best.as_ref().is_none_or(|(n, _)| candidate.0 < *n) {
                best = Some(candidate);
            }
        }
        best.map_or(IndexKey::Unindexed, |(_, k)| k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> LabelMap {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sel(s: &str) -> Selector {
        Selector::parse(s).unwrap()
    }

    fn matches(idx: &LabelIndex, s: SelId) -> Vec<ItemId> {
        let mut v: Vec<_> = idx.matches(s).collect();
        v.sort();
        v
    }

    #[test]
    fn items_and_selectors_in_either_order() {
        let mut idx = LabelIndex::new();
        let mut ch = Vec::new();
        let a = idx.new_item_id();
        idx.update_item(a, labels(&[("app", "web")]), vec![], &mut ch);
        let s = idx.acquire(&sel("app == 'web'"), &mut ch);
        assert_eq!(matches(&idx, s), vec![a]);
        let b = idx.new_item_id();
        idx.update_item(b, labels(&[("app", "web")]), vec![], &mut ch);
        assert_eq!(matches(&idx, s), vec![a, b]);
        ch.clear();
        idx.update_item(a, labels(&[("app", "db")]), vec![], &mut ch);
        assert_eq!(
            ch,
            vec![MatchChange {
                selector: s,
                item: a,
                matched: false
            }]
        );
        assert_eq!(matches(&idx, s), vec![b]);
        ch.clear();
        idx.remove_item(b, &mut ch);
        assert_eq!(
            ch,
            vec![MatchChange {
                selector: s,
                item: b,
                matched: false
            }]
        );
        assert!(matches(&idx, s).is_empty());
    }

    #[test]
    fn inheritance_from_parents() {
        let mut idx = LabelIndex::new();
        let mut ch = Vec::new();
        let a = idx.new_item_id();
        idx.update_item(
            a,
            labels(&[("app", "web")]),
            vec!["kns.prod".into()],
            &mut ch,
        );
        let s = idx.acquire(&sel("pcns.env == 'prod' && app == 'web'"), &mut ch);
        assert!(matches(&idx, s).is_empty());
        let changed = idx.update_parent("kns.prod", Some(labels(&[("pcns.env", "prod")])), &mut ch);
        assert_eq!(changed, vec![a]);
        assert_eq!(matches(&idx, s), vec![a]);
        // Own labels win over inherited ones.
        idx.update_item(
            a,
            labels(&[("app", "web"), ("pcns.env", "dev")]),
            vec!["kns.prod".into()],
            &mut ch,
        );
        assert!(matches(&idx, s).is_empty());
        idx.update_item(
            a,
            labels(&[("app", "web")]),
            vec!["kns.prod".into()],
            &mut ch,
        );
        assert_eq!(matches(&idx, s), vec![a]);
        idx.update_parent("kns.prod", None, &mut ch);
        assert!(matches(&idx, s).is_empty());
    }

    #[test]
    fn indexing_avoids_evaluating_unrelated_selectors() {
        let mut idx = LabelIndex::new();
        let mut ch = Vec::new();
        for i in 0..100 {
            idx.acquire(&sel(&format!("app == 'a{i}'")), &mut ch);
        }
        let before = idx.evaluations;
        let item = idx.new_item_id();
        idx.update_item(item, labels(&[("app", "a7")]), vec![], &mut ch);
        assert_eq!(idx.evaluations - before, 1);
        assert_eq!(ch.len(), 1);
    }

    #[test]
    fn release_unindexes() {
        let mut idx = LabelIndex::new();
        let mut ch = Vec::new();
        let a = idx.new_item_id();
        idx.update_item(a, labels(&[("x", "1")]), vec![], &mut ch);
        let s1 = idx.acquire(&sel("has(x)"), &mut ch);
        let s2 = idx.acquire(&sel("has(x)"), &mut ch);
        assert_eq!(s1, s2);
        idx.release(s1);
        assert_eq!(idx.num_selectors(), 1);
        idx.release(s2);
        assert_eq!(idx.num_selectors(), 0);
        assert!(idx.item_matches(a).is_empty());
    }
}
