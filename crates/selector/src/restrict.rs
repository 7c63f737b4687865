//! Label-restriction analysis: what every matching label set must satisfy.
//!
//! Computed on the compiled decision graph rather than the tree, which makes
//! `!` free: a negated test is just a test with swapped edges, and the
//! analysis records what each *outcome* of a test implies. For every
//! instruction (last to first, since edges point forward) we compute the
//! restrictions that hold on every path from it to ACCEPT:
//!
//! `R(i) = join(meet(facts(i, true), R(on_true)), meet(facts(i, false), R(on_false)))`
//!
//! with `R(ACCEPT)` = no restriction and `R(REJECT)` = impossible. `meet` is
//! "both hold" (values intersect), `join` is "one of them holds" (keep only
//! what both sides require; value sets union). Soundness follows by
//! induction along the path a matching label set takes.

use std::collections::{BTreeMap, BTreeSet};

use crate::Labels;
use crate::program::{ACCEPT, Program, Test};

/// What every label set matched by a selector must satisfy.
///
/// Sound, not complete: a label set that satisfies all restrictions may still
/// fail to match, but one that violates any restriction never matches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelRestrictions {
    /// Per-label restrictions; labels without any restriction are absent.
    /// Empty when `impossible` is set.
    pub labels: BTreeMap<String, LabelRestriction>,
    /// The selector can never match (e.g. `a == "x" && a == "y"`, `!all()`).
    pub impossible: bool,
}

/// What a single label must satisfy.
///
/// Invariant (for values produced by this crate): not both `must_be_present`
/// and `must_be_absent`; `must_have_one_of_values` is non-empty and implies
/// `must_be_present`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelRestriction {
    /// The label must be present (e.g. `has(a)`, `a == "x"`, `a contains "x"`).
    pub must_be_present: bool,
    /// The label must be absent (e.g. `!has(a)`).
    pub must_be_absent: bool,
    /// If set, the label's value must be one of these (e.g. `a in {"x", "y"}`).
    pub must_have_one_of_values: Option<BTreeSet<String>>,
}

impl LabelRestriction {
    /// Whether a label with this value (`None` = label missing) satisfies the
    /// restriction.
    pub fn allows(&self, value: Option<&str>) -> bool {
        match value {
            None => !self.must_be_present,
            Some(v) => {
                !self.must_be_absent
                    && self
                        .must_have_one_of_values
                        .as_ref()
                        .is_none_or(|values| values.contains(v))
            }
        }
    }
}

impl LabelRestrictions {
    /// False if no label set can match.
    pub fn can_match(&self) -> bool {
        !self.impossible
    }

    /// The restriction on `label`, if any.
    pub fn get(&self, label: &str) -> Option<&LabelRestriction> {
        self.labels.get(label)
    }

    /// Labels every matching label set must have.
    pub fn required_labels(&self) -> impl Iterator<Item = &str> + '_ {
        self.labels
            .iter()
            .filter(|(_, r)| r.must_be_present)
            .map(|(k, _)| k.as_str())
    }

    /// Labels no matching label set may have.
    pub fn excluded_labels(&self) -> impl Iterator<Item = &str> + '_ {
        self.labels
            .iter()
            .filter(|(_, r)| r.must_be_absent)
            .map(|(k, _)| k.as_str())
    }

    /// Whether `labels` satisfies every restriction. Necessary (not
    /// sufficient) for the selector to match.
    pub fn allows<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        !self.impossible && self.labels.iter().all(|(k, r)| r.allows(labels.get(k)))
    }
}

/// Working form borrowing strings from the program.
#[derive(Debug, Clone, Default)]
struct Lr<'p> {
    present: bool,
    absent: bool,
    values: Option<BTreeSet<&'p str>>,
}

/// `None` = cannot reach ACCEPT.
type State<'p> = Option<BTreeMap<&'p str, Lr<'p>>>;

/// Adds one fact ("label must satisfy `fact`") to a state.
fn meet<'p>(state: State<'p>, label: &'p str, fact: Lr<'p>) -> State<'p> {
    let mut map = state?;
    let entry = map.entry(label).or_default();
    entry.present |= fact.present;
    entry.absent |= fact.absent;
    entry.values = match (entry.values.take(), fact.values) {
        (None, v) | (v, None) => v,
        (Some(a), Some(b)) => Some(a.intersection(&b).copied().collect()),
    };
    let contradictory =
        entry.present && entry.absent || entry.values.as_ref().is_some_and(BTreeSet::is_empty);
    (!contradictory).then_some(map)
}

/// Keeps what both alternatives require.
fn join<'p>(a: State<'p>, b: State<'p>) -> State<'p> {
    let (Some(a), Some(b)) = (&a, &b) else {
        return a.or(b);
    };
    // Only common labels survive, so walk the smaller map: keeps long
    // `&&` chains with a shared `||` exit linear rather than quadratic.
    let (a, b) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    let mut out = BTreeMap::new();
    for (label, ra) in a {
        let Some(rb) = b.get(label) else { continue };
        let present = ra.present && rb.present;
        let absent = ra.absent && rb.absent;
        let values = match (&ra.values, &rb.values) {
            (Some(va), Some(vb)) if present => Some(va.union(vb).copied().collect()),
            _ => None,
        };
        if present || absent {
            out.insert(
                *label,
                Lr {
                    present,
                    absent,
                    values,
                },
            );
        }
    }
    Some(out)
}

/// What an outcome of a test implies about its label, if anything.
fn facts<'p>(test: &'p Test, outcome: bool) -> Option<Lr<'p>> {
    let present = || Lr {
        present: true,
        ..Lr::default()
    };
    match (test, outcome) {
        (Test::Has, false) => Some(Lr {
            absent: true,
            ..Lr::default()
        }),
        // Every other test can fail on a missing label or on a value, so
        // failure says nothing (this is why `!(a == "x")` restricts nothing).
        (_, false) => None,
        (Test::Eq(v), true) => Some(Lr {
            values: Some(BTreeSet::from([&**v])),
            ..present()
        }),
        (Test::In(set), true) => Some(Lr {
            values: Some(set.iter().map(|v| &**v).collect()),
            ..present()
        }),
        (Test::Has | Test::Contains(_) | Test::StartsWith(_) | Test::EndsWith(_), true) => {
            Some(present())
        }
    }
}

/// Per-instruction states, each handed out by move on its last use so that
/// chains don't copy ever-growing maps.
struct States<'p> {
    states: Vec<State<'p>>,
    uses_left: Vec<usize>,
}

impl<'p> States<'p> {
    fn take(&mut self, target: usize) -> State<'p> {
        if target == ACCEPT {
            return Some(BTreeMap::new());
        }
        // REJECT is out of range, hence None (impossible).
        let (Some(slot), Some(uses)) =
            (self.states.get_mut(target), self.uses_left.get_mut(target))
        else {
            return None;
        };
        *uses = uses.saturating_sub(1);
        if *uses == 0 {
            slot.take()
        } else {
            slot.clone()
        }
    }
}

pub(crate) fn analyse(program: &Program) -> LabelRestrictions {
    let instrs = &program.instrs;
    let n = instrs.len();
    let mut uses_left = vec![0usize; n];
    let edges = instrs.iter().flat_map(|i| [i.on_true, i.on_false]);
    for target in edges.chain([program.entry]) {
        if let Some(uses) = uses_left.get_mut(target) {
            *uses += 1;
        }
    }
    let mut states = States {
        states: vec![None; n],
        uses_left,
    };
    for (i, instr) in instrs.iter().enumerate().rev() {
        let mut branch = |outcome: bool, target: usize| {
            let next = states.take(target);
            match facts(&instr.test, outcome) {
                Some(fact) => meet(next, &instr.label, fact),
                None => next,
            }
        };
        let on_true = branch(true, instr.on_true);
        let on_false = branch(false, instr.on_false);
        states.states[i] = join(on_true, on_false);
    }
    match states.take(program.entry) {
        None => LabelRestrictions {
            labels: BTreeMap::new(),
            impossible: true,
        },
        Some(map) => LabelRestrictions {
            labels: map
                .into_iter()
                .map(|(k, r)| {
                    let restriction = LabelRestriction {
                        must_be_present: r.present,
                        must_be_absent: r.absent,
                        must_have_one_of_values: r
                            .values
                            .map(|vs| vs.into_iter().map(str::to_owned).collect()),
                    };
                    (k.to_owned(), restriction)
                })
                .collect(),
            impossible: false,
        },
    }
}
