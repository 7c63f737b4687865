//! What the kernel has versus what is wanted, and the one nft transaction that gets from one
//! to the other (pure).
//!
//! The kernel's state is known either from the last successful transaction or by reading the
//! table back (`nft -j list table`, see `observe`). Chains are compared by the hashes in their
//! rules' comments (the kernel re-renders rule text, so text cannot be compared), sets and maps
//! by their elements. Only what differs is written; the transaction is atomic.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

use crate::nft::elements::{ElemType, ElementChange};
use crate::nft::observe::base_key;
use crate::nft::render::{NftState, RenderedService, rule_line};

/// What a table holds, as far as comparison needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fingerprint {
    pub table_exists: bool,
    /// Set → (declaration if known, elements).
    pub sets: BTreeMap<String, (Option<String>, BTreeSet<String>)>,
    /// Map → elements (key → verdict).
    pub maps: BTreeMap<String, BTreeMap<String, String>>,
    /// Chain → (base declaration if a base chain, rule hashes in order).
    pub chains: BTreeMap<String, (Option<String>, Vec<String>)>,
    /// The service ports as last written, apart from the fields above, with the renderer's
    /// generation of that state (see [`NftState::services`]); None when the table was read
    /// back from the kernel, where everything is in the fields above.
    pub services: Option<(u64, Vec<Arc<RenderedService>>)>,
}

fn chain_print(c: &crate::nft::render::ChainSpec) -> (Option<String>, Vec<String>) {
    (
        c.base.as_deref().map(base_key),
        c.rules.iter().map(|r| r.hash.clone()).collect(),
    )
}

impl Fingerprint {
    /// The same table with the service ports merged in (as a read-back would see it).
    pub fn flattened(&self) -> Fingerprint {
        let mut fp = Fingerprint {
            services: None,
            ..self.clone()
        };
        for r in self.services.iter().flat_map(|(_, all)| all) {
            for (name, c) in &r.chains {
                fp.chains.insert(name.clone(), chain_print(c));
            }
            for (name, set) in &r.sets {
                fp.sets
                    .insert(name.clone(), (Some(set.decl.clone()), set.elements.clone()));
            }
            for (set, elem) in &r.set_elements {
                if let Some((_, elems)) = fp.sets.get_mut(set) {
                    elems.insert(elem.clone());
                }
            }
            for (map, key, value) in &r.elements {
                if let Some(elems) = fp.maps.get_mut(map) {
                    elems.insert(key.clone(), value.clone());
                }
            }
        }
        fp
    }

    pub fn of(state: &NftState) -> Fingerprint {
        Fingerprint {
            services: Some((state.services.generation, state.services.all.clone())),
            table_exists: true,
            sets: state
                .sets
                .iter()
                .map(|(k, s)| (k.clone(), (Some(s.decl.clone()), s.elements.clone())))
                .collect(),
            maps: state
                .maps
                .iter()
                .map(|(k, m)| (k.clone(), m.elements.clone()))
                .collect(),
            chains: state
                .chains
                .iter()
                .map(|(k, c)| (k.clone(), chain_print(c)))
                .collect(),
        }
    }
}

/// Counts of what a transaction changes (for logs and metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxStats {
    pub chains_written: usize,
    pub chains_deleted: usize,
    pub rules_written: usize,
    pub elements_added: usize,
    pub elements_removed: usize,
    pub sets_created: usize,
    pub sets_deleted: usize,
}

impl TxStats {
    pub fn is_empty(&self) -> bool {
        *self == TxStats::default()
    }
}

/// Most elements per `add element` line.
const ELEMENTS_PER_LINE: usize = 2000;

fn element_lines(out: &mut String, verb: &str, table: &str, set: &str, elems: &[&String]) {
    for chunk in elems.chunks(ELEMENTS_PER_LINE) {
        let list: Vec<&str> = chunk.iter().map(|s| s.as_str()).collect();
        let _ = writeln!(
            out,
            "{verb} element inet {table} {set} {{ {} }}",
            list.join(", ")
        );
    }
}

/// The nft script that turns `from` into `to` (empty when nothing differs).
pub fn transaction(table: &str, from: &Fingerprint, to: &NftState) -> (String, TxStats) {
    if from.services.is_some() || !to.services.all.is_empty() {
        return transaction(table, &from.flattened(), &to.flattened());
    }
    // A set whose type changed cannot be fixed in place while rules use it (set names encode
    // their type, so only tampering gets here): replace the whole table, still atomically.
    let retyped = to.sets.iter().any(
        |(name, set)| matches!(from.sets.get(name), Some((Some(decl), _)) if *decl != set.decl),
    );
    if retyped {
        let (rest, stats) = transaction(table, &Fingerprint::default(), to);
        return (format!("delete table inet {table}\n{rest}"), stats);
    }
    let mut out = String::new();
    let mut stats = TxStats::default();
    let mut body = String::new();

    // 1. Sets and maps that are new.
    for (name, set) in &to.sets {
        if !from.sets.contains_key(name) {
            let _ = writeln!(body, "add set inet {table} {name} {{ {} }}", set.decl);
            stats.sets_created += 1;
        }
    }
    for (name, map) in &to.maps {
        if !from.maps.contains_key(name) {
            let _ = writeln!(body, "add map inet {table} {name} {{ {} }}", map.decl);
            stats.sets_created += 1;
        }
    }
    // 2. Set elements: removals, then additions.
    for (name, set) in &to.sets {
        // The kernel fills dynamic sets (service affinity): their elements are not ours.
        if set.decl.contains("flags dynamic") {
            continue;
        }
        let empty = BTreeSet::new();
        let have = from.sets.get(name).map_or(&empty, |(_, e)| e);
        let removed: Vec<&String> = have.difference(&set.elements).collect();
        let added: Vec<&String> = set.elements.difference(have).collect();
        stats.elements_removed += removed.len();
        stats.elements_added += added.len();
        element_lines(&mut body, "delete", table, name, &removed);
        element_lines(&mut body, "add", table, name, &added);
    }
    // 3. New chains (all of them first, so rules may jump to any).
    for (name, chain) in &to.chains {
        if !from.chains.contains_key(name) {
            match &chain.base {
                Some(base) => {
                    let _ = writeln!(body, "add chain inet {table} {name} {{ {base} }}");
                }
                None => {
                    let _ = writeln!(body, "add chain inet {table} {name}");
                }
            }
        } else if let (Some(base), Some((old_base, _))) = (&chain.base, from.chains.get(name))
            && old_base.as_deref() != Some(base_key(base).as_str())
        {
            // A base chain's hook or policy drifted: re-declare it (updates in place).
            let _ = writeln!(body, "add chain inet {table} {name} {{ {base} }}");
        }
    }
    // 4. Chains whose rules differ: rewrite them whole.
    for (name, chain) in &to.chains {
        let hashes: Vec<&String> = chain.rules.iter().map(|r| &r.hash).collect();
        let same = from
            .chains
            .get(name)
            .is_some_and(|(_, old)| old.iter().eq(hashes.iter().copied()));
        if same {
            continue;
        }
        if from.chains.contains_key(name) {
            let _ = writeln!(body, "flush chain inet {table} {name}");
        }
        for r in &chain.rules {
            body.push_str(&rule_line(table, name, r));
            body.push('\n');
        }
        stats.chains_written += 1;
        stats.rules_written += chain.rules.len();
    }
    // 5. Map elements: removals (and changed verdicts), then additions.
    for (name, map) in &to.maps {
        let empty = BTreeMap::new();
        let have = from.maps.get(name).unwrap_or(&empty);
        let removed: Vec<&String> = have
            .iter()
            .filter(|(k, v)| map.elements.get(*k) != Some(*v))
            .map(|(k, _)| k)
            .collect();
        let added: Vec<String> = map
            .elements
            .iter()
            .filter(|(k, v)| have.get(*k) != Some(*v))
            .map(|(k, v)| format!("{k} : {v}"))
            .collect();
        stats.elements_removed += removed.len();
        stats.elements_added += added.len();
        element_lines(&mut body, "delete", table, name, &removed);
        let added_refs: Vec<&String> = added.iter().collect();
        element_lines(&mut body, "add", table, name, &added_refs);
    }
    // 6. Chains nobody wants: flush all first (dropping their jumps), then delete.
    let doomed: Vec<&String> = from
        .chains
        .keys()
        .filter(|k| !to.chains.contains_key(*k))
        .collect();
    for name in &doomed {
        let _ = writeln!(body, "flush chain inet {table} {name}");
    }
    // 7. Sets and maps nobody wants (rules using them are gone by now), before the chains:
    // a doomed map's elements may jump to doomed chains (the service section).
    for name in from.sets.keys() {
        if !to.sets.contains_key(name) {
            let _ = writeln!(body, "delete set inet {table} {name}");
            stats.sets_deleted += 1;
        }
    }
    for name in from.maps.keys() {
        if !to.maps.contains_key(name) {
            let _ = writeln!(body, "delete map inet {table} {name}");
            stats.sets_deleted += 1;
        }
    }
    for name in &doomed {
        let _ = writeln!(body, "delete chain inet {table} {name}");
        stats.chains_deleted += 1;
    }
    if body.is_empty() && from.table_exists {
        return (String::new(), stats);
    }
    let _ = writeln!(out, "add table inet {table}");
    out.push_str(&body);
    (out, stats)
}

/// The interface set workload dispatch checks first; see [`plan`] for its ordering.
const WL_IFACES: &str = crate::nft::render::SET_WL_IFACES;

/// A change in five steps, for element changes written over nfnetlink (see
/// `nft::elements`): nft text for declarations and chains, netlink for elements.
///
/// Order keeps every intermediate state fail-closed: sets exist and hold their members before
/// any rule uses them; an endpoint's chains and dispatch entries exist before its interface is
/// known (unknown interfaces are dropped), and its interface is forgotten before they go.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// nft: the table, new sets and maps.
    pub declare: String,
    /// netlink: set element removals and additions (interface removals included).
    pub elements_before: Vec<ElementChange>,
    /// nft: new chains, rewritten chains.
    pub chains: String,
    /// netlink: dispatch-map changes, then interface additions.
    pub elements_after: Vec<ElementChange>,
    /// nft: chains, sets and maps nobody wants any more.
    pub cleanup: String,
    /// A set changed type: replace the table in one text transaction instead.
    pub full_replacement: Option<String>,
    pub stats: TxStats,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.full_replacement.is_none()
            && self.declare.is_empty()
            && self.chains.is_empty()
            && self.cleanup.is_empty()
            && self
                .elements_before
                .iter()
                .chain(&self.elements_after)
                .all(|c| c.add.is_empty() && c.delete.is_empty())
    }
}

fn elem_change(
    name: &str,
    decl: &str,
    add: Vec<(String, Option<String>)>,
    delete: Vec<(String, Option<String>)>,
) -> Option<ElementChange> {
    if add.is_empty() && delete.is_empty() {
        return None;
    }
    Some(ElementChange {
        set: name.to_string(),
        kind: ElemType::of_decl(decl).unwrap_or(ElemType::Addr),
        add,
        delete,
    })
}

/// Plans the change from `from` to `to`.
pub fn plan(table: &str, from: &Fingerprint, to: &NftState) -> Plan {
    // The services are planned from the renderer's changes when `from` is the state the
    // renderer produced just before `to`; otherwise (read back from the kernel, or a failed
    // write in between) everything is compared, services included.
    let consecutive = matches!(&from.services, Some((g, _)) if g + 1 == to.services.generation);
    if !consecutive && (from.services.is_some() || !to.services.all.is_empty()) {
        return plan(table, &from.flattened(), &to.flattened());
    }
    let mut p = Plan::default();
    let retyped = to.sets.iter().any(
        |(name, set)| matches!(from.sets.get(name), Some((Some(decl), _)) if *decl != set.decl),
    ) || to
        .sets
        .values()
        .any(|s| ElemType::of_decl(&s.decl).is_none())
        || to
            .maps
            .values()
            .any(|m| ElemType::of_decl(&m.decl).is_none());
    if retyped {
        let (text, stats) = transaction(table, from, to);
        p.full_replacement = Some(text);
        p.stats = stats;
        return p;
    }
    let stats = &mut p.stats;
    // 1. Declarations.
    let mut declare = String::new();
    for (name, set) in &to.sets {
        if !from.sets.contains_key(name) {
            let _ = writeln!(declare, "add set inet {table} {name} {{ {} }}", set.decl);
            stats.sets_created += 1;
        }
    }
    for (name, map) in &to.maps {
        if !from.maps.contains_key(name) {
            let _ = writeln!(declare, "add map inet {table} {name} {{ {} }}", map.decl);
            stats.sets_created += 1;
        }
    }
    if !declare.is_empty() || !from.table_exists {
        p.declare = format!("add table inet {table}\n{declare}");
    }
    // 2. Set elements (the interface set: removals only here).
    let mut iface_adds = None;
    for (name, set) in &to.sets {
        if set.decl.contains("flags dynamic") {
            continue;
        }
        let empty = BTreeSet::new();
        let have = from.sets.get(name).map_or(&empty, |(_, e)| e);
        let delete: Vec<(String, Option<String>)> = have
            .difference(&set.elements)
            .map(|e| (e.clone(), None))
            .collect();
        let add: Vec<(String, Option<String>)> = set
            .elements
            .difference(have)
            .map(|e| (e.clone(), None))
            .collect();
        stats.elements_removed += delete.len();
        stats.elements_added += add.len();
        if name == WL_IFACES {
            iface_adds = elem_change(name, &set.decl, add, Vec::new());
            p.elements_before
                .extend(elem_change(name, &set.decl, Vec::new(), delete));
        } else {
            p.elements_before
                .extend(elem_change(name, &set.decl, add, delete));
        }
    }
    // 3. Chains: every new chain first, so rules may jump to any.
    let mut chains = String::new();
    let mut rules = String::new();
    let services = consecutive.then(|| ServiceChanges::of(&to.services.changed));
    if let Some(sc) = &services {
        for (name, set) in &sc.new_sets {
            let _ = writeln!(
                declare_more(&mut p.declare, table),
                "add set inet {table} {name} {{ {} }}",
                set.decl
            );
            stats.sets_created += 1;
        }
    }
    for (name, chain) in &to.chains {
        if !from.chains.contains_key(name) {
            match &chain.base {
                Some(base) => {
                    let _ = writeln!(chains, "add chain inet {table} {name} {{ {base} }}");
                }
                None => {
                    let _ = writeln!(chains, "add chain inet {table} {name}");
                }
            }
        } else if let (Some(base), Some((old_base, _))) = (&chain.base, from.chains.get(name))
            && old_base.as_deref() != Some(base_key(base).as_str())
        {
            let _ = writeln!(chains, "add chain inet {table} {name} {{ {base} }}");
        }
    }
    let mut write_chain = |name: &str, chain: &crate::nft::render::ChainSpec, existed: bool| {
        if existed {
            let _ = writeln!(rules, "flush chain inet {table} {name}");
        }
        for r in &chain.rules {
            rules.push_str(&rule_line(table, name, r));
            rules.push('\n');
        }
        stats.chains_written += 1;
        stats.rules_written += chain.rules.len();
    };
    for (name, chain) in &to.chains {
        let same = from
            .chains
            .get(name)
            .is_some_and(|(_, old)| old.iter().eq(chain.rules.iter().map(|r| &r.hash)));
        if !same {
            write_chain(name, chain, from.chains.contains_key(name));
        }
    }
    if let Some(sc) = &services {
        for (name, chain, existed) in &sc.chains {
            if !existed {
                let _ = writeln!(chains, "add chain inet {table} {name}");
            }
            write_chain(name, chain, *existed);
        }
    }
    if !chains.is_empty() || !rules.is_empty() {
        p.chains = format!("add table inet {table}\n{chains}{rules}");
    }
    // 4. Dispatch maps, then the interfaces they dispatch.
    for (name, map) in &to.maps {
        let empty = BTreeMap::new();
        let have = from.maps.get(name).unwrap_or(&empty);
        let delete: Vec<(String, Option<String>)> = have
            .iter()
            .filter(|(k, v)| map.elements.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), Some(v.clone())))
            .collect();
        let add: Vec<(String, Option<String>)> = map
            .elements
            .iter()
            .filter(|(k, v)| have.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), Some(v.clone())))
            .collect();
        stats.elements_removed += delete.len();
        stats.elements_added += add.len();
        p.elements_after
            .extend(elem_change(name, &map.decl, add, delete));
    }
    if let Some(sc) = &services {
        for (name, (add, delete)) in &sc.elements {
            // A map that goes altogether (the last service went) takes its elements along.
            if !to.maps.contains_key(name) && !to.sets.contains_key(name) {
                continue;
            }
            let decl = to
                .maps
                .get(name)
                .map(|m| m.decl.as_str())
                .or_else(|| to.sets.get(name).map(|s| s.decl.as_str()))
                .unwrap_or_default();
            stats.elements_removed += delete.len();
            stats.elements_added += add.len();
            p.elements_after
                .extend(elem_change(name, decl, add.clone(), delete.clone()));
        }
    }
    p.elements_after.extend(iface_adds);
    // 5. Clean-up.
    let mut cleanup = String::new();
    let mut doomed: Vec<&String> = from
        .chains
        .keys()
        .filter(|k| !to.chains.contains_key(*k))
        .collect();
    if let Some(sc) = &services {
        doomed.extend(&sc.doomed_chains);
    }
    for name in &doomed {
        let _ = writeln!(cleanup, "flush chain inet {table} {name}");
    }
    // Sets and maps before chains: a doomed map's elements may still jump to doomed chains
    // (the service section), and the rules that used the sets were flushed above.
    for name in from.sets.keys().filter(|k| !to.sets.contains_key(*k)) {
        let _ = writeln!(cleanup, "delete set inet {table} {name}");
        stats.sets_deleted += 1;
    }
    for name in from.maps.keys().filter(|k| !to.maps.contains_key(*k)) {
        let _ = writeln!(cleanup, "delete map inet {table} {name}");
        stats.sets_deleted += 1;
    }
    for name in services.iter().flat_map(|sc| &sc.doomed_sets) {
        let _ = writeln!(cleanup, "delete set inet {table} {name}");
        stats.sets_deleted += 1;
    }
    for name in &doomed {
        let _ = writeln!(cleanup, "delete chain inet {table} {name}");
        stats.chains_deleted += 1;
    }
    p.cleanup = cleanup;
    p
}

/// `declare`, starting it with the table line when it is still empty.
fn declare_more<'a>(declare: &'a mut String, table: &str) -> &'a mut String {
    if declare.is_empty() {
        let _ = writeln!(declare, "add table inet {table}");
    }
    declare
}

/// Element changes per set or map: (additions, removals), each with its data.
type ElementDelta = (Vec<(String, Option<String>)>, Vec<(String, Option<String>)>);

/// What the service ports whose rendering changed change in the table.
#[derive(Debug, Default)]
struct ServiceChanges {
    /// Chains to write: (name, chain, existed before).
    chains: Vec<(String, crate::nft::render::ChainSpec, bool)>,
    doomed_chains: Vec<String>,
    new_sets: Vec<(String, crate::nft::render::SetSpec)>,
    doomed_sets: Vec<String>,
    elements: BTreeMap<String, ElementDelta>,
}

impl ServiceChanges {
    fn of(changed: &[crate::nft::render::ServiceChange]) -> ServiceChanges {
        let mut sc = ServiceChanges::default();
        let empty = RenderedService::default();
        // Removals and additions are gathered per set/map, keyed by element, so a key that
        // one port gives up and another takes in the same change is written once.
        let mut removed: BTreeMap<&str, BTreeMap<&str, Option<&str>>> = BTreeMap::new();
        let mut added: BTreeMap<&str, BTreeMap<&str, Option<&str>>> = BTreeMap::new();
        for (o, n) in changed {
            let o = o.as_deref().unwrap_or(&empty);
            let n = n.as_deref().unwrap_or(&empty);
            for (name, c) in &n.chains {
                match o.chains.iter().find(|(on, _)| on == name) {
                    Some((_, oc)) if oc.rules == c.rules => {}
                    Some(_) => sc.chains.push((name.clone(), c.clone(), true)),
                    None => sc.chains.push((name.clone(), c.clone(), false)),
                }
            }
            for (name, _) in &o.chains {
                if !n.chains.iter().any(|(nn, _)| nn == name) {
                    sc.doomed_chains.push(name.clone());
                }
            }
            for (name, set) in &n.sets {
                if !o.sets.iter().any(|(on, _)| on == name) {
                    sc.new_sets.push((name.clone(), set.clone()));
                }
            }
            for (name, _) in &o.sets {
                if !n.sets.iter().any(|(nn, _)| nn == name) {
                    sc.doomed_sets.push(name.clone());
                }
            }
            let old_elems: BTreeSet<(&str, &str, Option<&str>)> = o
                .elements
                .iter()
                .map(|(m, k, v)| (m.as_str(), k.as_str(), Some(v.as_str())))
                .chain(
                    o.set_elements
                        .iter()
                        .map(|(s, e)| (s.as_str(), e.as_str(), None)),
                )
                .collect();
            let new_elems: BTreeSet<(&str, &str, Option<&str>)> = n
                .elements
                .iter()
                .map(|(m, k, v)| (m.as_str(), k.as_str(), Some(v.as_str())))
                .chain(
                    n.set_elements
                        .iter()
                        .map(|(s, e)| (s.as_str(), e.as_str(), None)),
                )
                .collect();
            for (set, key, value) in old_elems.difference(&new_elems) {
                removed.entry(set).or_default().insert(key, *value);
            }
            for (set, key, value) in new_elems.difference(&old_elems) {
                added.entry(set).or_default().insert(key, *value);
            }
        }
        let own = |v: Option<&str>| v.map(str::to_string);
        for (set, keys) in &removed {
            let entry = sc.elements.entry(set.to_string()).or_default();
            for (key, value) in keys {
                // A key re-added with the same data needs no change at all; with other data
                // (a map), it is deleted and added in the same batch.
                if added.get(set).and_then(|a| a.get(key)) == Some(value) {
                    continue;
                }
                entry.1.push((key.to_string(), own(*value)));
            }
        }
        for (set, keys) in &added {
            let entry = sc.elements.entry(set.to_string()).or_default();
            for (key, value) in keys {
                if removed.get(set).and_then(|r| r.get(key)) == Some(value) {
                    continue;
                }
                entry.0.push((key.to_string(), own(*value)));
            }
        }
        sc.elements
            .retain(|_, (a, d)| !a.is_empty() || !d.is_empty());
        sc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::render::{ChainSpec, MapSpec, NftRule, SetSpec};

    fn state(rules: &[&str], elems: &[&str]) -> NftState {
        let mut st = NftState::default();
        st.sets.insert(
            "s4-a".into(),
            SetSpec {
                decl: "type ipv4_addr; flags interval;".into(),
                elements: elems.iter().map(|e| e.to_string()).collect(),
            },
        );
        st.maps.insert(
            "wl-ingress".into(),
            MapSpec {
                decl: "type ifname : verdict;".into(),
                elements: BTreeMap::from([("\"cali1\"".into(), "jump tw-cali1".into())]),
            },
        );
        st.chains.insert(
            "tw-cali1".into(),
            ChainSpec {
                base: None,
                rules: rules.iter().map(|r| NftRule::new(r.to_string())).collect(),
            },
        );
        st
    }

    #[test]
    fn nothing_to_do_when_equal() {
        let st = state(&["drop"], &["10.0.0.1"]);
        let (tx, stats) = transaction("margay", &Fingerprint::of(&st), &st);
        assert!(tx.is_empty(), "{tx}");
        assert!(stats.is_empty());
    }

    #[test]
    fn only_what_changed_is_written() {
        let old = state(&["drop"], &["10.0.0.1", "10.0.0.2"]);
        let mut new = state(&["drop"], &["10.0.0.2", "10.0.0.3"]);
        new.chains.insert(
            "pi-x".into(),
            ChainSpec {
                base: None,
                rules: vec![NftRule::new("accept".into())],
            },
        );
        let (tx, stats) = transaction("margay", &Fingerprint::of(&old), &new);
        assert!(
            tx.contains("delete element inet margay s4-a { 10.0.0.1 }"),
            "{tx}"
        );
        assert!(
            tx.contains("add element inet margay s4-a { 10.0.0.3 }"),
            "{tx}"
        );
        assert!(tx.contains("add chain inet margay pi-x\n"), "{tx}");
        assert!(!tx.contains("tw-cali1"), "unchanged chain rewritten: {tx}");
        assert_eq!(stats.chains_written, 1);
        // Removal: chains flushed then deleted, after map entries pointing at them are gone.
        let (tx, stats) = transaction("margay", &Fingerprint::of(&new), &NftState::default());
        let flush = tx.find("flush chain inet margay tw-cali1").unwrap();
        let delete = tx.find("delete chain inet margay tw-cali1").unwrap();
        assert!(flush < delete);
        assert!(tx.contains("delete set inet margay s4-a"));
        assert_eq!(stats.chains_deleted, 2);
    }

    #[test]
    fn plans_keep_interfaces_unknown_until_their_dispatch_exists() {
        let old = state(&["drop"], &["10.0.0.1"]);
        let mut new = old.clone();
        new.maps
            .get_mut("wl-ingress")
            .unwrap()
            .elements
            .insert("\"cali2\"".into(), "jump tw-cali2".into());
        new.chains.insert(
            "tw-cali2".into(),
            ChainSpec {
                base: None,
                rules: vec![NftRule::new("drop".into())],
            },
        );
        new.sets.insert(
            WL_IFACES.into(),
            SetSpec {
                decl: "type ifname;".into(),
                elements: BTreeSet::from(["\"cali2\"".to_string()]),
            },
        );
        let mut old = old;
        old.sets.insert(
            WL_IFACES.into(),
            SetSpec {
                decl: "type ifname;".into(),
                elements: BTreeSet::new(),
            },
        );
        let p = plan("margay", &Fingerprint::of(&old), &new);
        assert!(p.chains.contains("add chain inet margay tw-cali2"));
        assert!(
            p.elements_before
                .iter()
                .all(|c| c.add.is_empty() || c.set != WL_IFACES)
        );
        let after: Vec<&str> = p.elements_after.iter().map(|c| c.set.as_str()).collect();
        assert_eq!(after, vec!["wl-ingress", WL_IFACES]);
        assert!(p.cleanup.is_empty());
        assert!(plan("margay", &Fingerprint::of(&new), &new).is_empty());
    }

    #[test]
    fn an_empty_kernel_gets_everything() {
        let st = state(&["drop"], &["10.0.0.1"]);
        let (tx, _) = transaction("margay", &Fingerprint::default(), &st);
        let table = tx.find("add table").unwrap();
        let set = tx.find("add set").unwrap();
        let chain = tx.find("add chain").unwrap();
        let rule = tx.find("add rule").unwrap();
        let map_elem = tx.find("add element inet margay wl-ingress").unwrap();
        assert!(
            table < set && set < chain && chain < rule && rule < map_elem,
            "{tx}"
        );
    }
}
