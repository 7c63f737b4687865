//! The per-endpoint-hook index: lets a new flow skip, in O(1), the blocks that cannot match
//! its (protocol, destination port), so that 1000 policies each allowing a few ports cost a
//! new connection two lookups instead of 1000 block evaluations.
//!
//! A block's [`Summary`]: the (protocol, port) keys its rules can match, or `any` when one
//! of its rules can match a packet whatever its destination port (no positive destination
//! port, no protocol, named ports, wide ranges). Per endpoint hook, with the main step list
//! `0..n` (unchanged: the program falls back to it), extra entries in the same `mgy_steps`
//! slot:
//! - refs `n..`: each names a main step by index (`STEP_REF`, `block` = the step's index);
//! - `DEFAULT_IDX` → the range of refs to the steps every packet must see (deny steps and
//!   blocks with `any`), in order;
//! - `key_idx(proto, port)` → the range of refs to the blocks whose keys contain it, in
//!   order.
//!
//! The program walks the default range and the key's range merged by step index: exactly
//! the main list with the blocks that match nothing for this packet left out, so verdicts,
//! Pass targets (a step index: entries below it are skipped), Log rules, counters and flow
//! events are those of the linear walk. Everything lives in the endpoint's fresh step slot,
//! written before its entry flips: a packet sees the old list with its old index or the
//! new ones.

use std::collections::{BTreeMap, BTreeSet};

use crate::layout::{F_PROTO, Rule, StepEnc};

/// A ref: `block` is the main step's index.
pub const STEP_REF: u32 = 2;
/// An index entry: refs `block .. block + pass_to`.
pub const STEP_INDEX: u32 = 3;
/// Index entries' `idx` in the slot: above any list position.
pub const INDEX_BASE: u32 = 0x8000_0000;
/// The default range's entry (protocol 0 is never a key).
pub const DEFAULT_IDX: u32 = INDEX_BASE;
/// A rule whose destination ranges span more ports than this is `any` (keeps the index small).
pub const MAX_RULE_PORTS: u32 = 32;
/// A block with more keys than this is `any`.
pub const MAX_BLOCK_KEYS: usize = 256;
/// An endpoint hook whose index would need more entries than this is not indexed.
pub const MAX_HOOK_INDEX: usize = 8192;

/// The protocols whose packets carry ports the program parses (TCP, UDP, SCTP, UDP-Lite).
fn has_ports(proto: u8) -> bool {
    matches!(proto, 6 | 17 | 132 | 136)
}

/// Where a (protocol, destination port) key is in a slot.
pub fn key_idx(proto: u8, port: u16) -> u32 {
    INDEX_BASE | (u32::from(proto) << 16) | u32::from(port)
}

/// What packets a block's rules can match, as far as the index is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Some rule can match whatever the destination port.
    pub any: bool,
    /// (protocol, destination port) every other rule's match requires one of.
    pub keys: BTreeSet<(u8, u16)>,
}

pub fn summary(rules: &[Rule]) -> Summary {
    let mut s = Summary::default();
    for r in rules {
        let keyable = r.flags & F_PROTO != 0
            && has_ports(r.proto)
            && r.dst.named.is_empty()
            && !r.dst.ports.is_empty()
            && r.dst
                .ports
                .iter()
                .map(|(a, b)| u32::from(b.saturating_sub(*a)) + 1)
                .sum::<u32>()
                <= MAX_RULE_PORTS;
        if !keyable {
            s.any = true;
            break;
        }
        for (a, b) in &r.dst.ports {
            for port in *a..=*b {
                s.keys.insert((r.proto, port));
            }
        }
        if s.keys.len() > MAX_BLOCK_KEYS {
            s.any = true;
            break;
        }
    }
    if s.any {
        s.keys.clear();
    }
    s
}

/// The index entries of an endpoint hook whose main list has `main.len()` steps, each with
/// its block's summary (None: a deny step). Empty: no index (nothing to skip, or too large);
/// the program then walks the main list.
pub fn build(main: &[Option<&Summary>]) -> Vec<(u32, StepEnc)> {
    let n = main.len() as u32;
    let always: Vec<u32> = (0..n)
        .filter(|i| main[*i as usize].is_none_or(|s| s.any))
        .collect();
    if always.len() == main.len() {
        return Vec::new();
    }
    let mut keys: BTreeMap<(u8, u16), Vec<u32>> = BTreeMap::new();
    for (i, s) in main.iter().enumerate() {
        if let Some(s) = s.filter(|s| !s.any) {
            for k in &s.keys {
                keys.entry(*k).or_default().push(i as u32);
            }
        }
    }
    let mut out = Vec::new();
    let mut next = n;
    let mut range = |out: &mut Vec<(u32, StepEnc)>, list: &[u32]| {
        let start = next;
        for i in list {
            out.push((
                next,
                StepEnc {
                    kind: STEP_REF,
                    block: *i,
                    pass_to: 0,
                },
            ));
            next += 1;
        }
        StepEnc {
            kind: STEP_INDEX,
            block: start,
            pass_to: list.len() as u32,
        }
    };
    let d = range(&mut out, &always);
    out.push((DEFAULT_IDX, d));
    for ((proto, port), list) in &keys {
        // (Even one step is a ref: the program then has one kind of key entry, and the
        // verifier one loop state fewer to explore.)
        let e = range(&mut out, list);
        out.push((key_idx(*proto, *port), e));
        if out.len() > MAX_HOOK_INDEX {
            return Vec::new();
        }
    }
    // By position: refs first, then the entries naming them (the syncer compares a restored
    // index, read back in this order, with a compiled one).
    out.sort_unstable_by_key(|(idx, _)| *idx);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{ACT_ALLOW, Side};

    fn tcp(ports: &[(u16, u16)]) -> Rule {
        Rule {
            action: ACT_ALLOW,
            flags: F_PROTO,
            proto: 6,
            dst: Side {
                ports: ports.to_vec(),
                ..Side::default()
            },
            ..Rule::default()
        }
    }

    #[test]
    fn summaries_key_only_positive_narrow_destination_ports_with_a_protocol() {
        let s = summary(&[tcp(&[(80, 81)]), tcp(&[(443, 443)])]);
        assert!(!s.any);
        assert_eq!(
            s.keys.into_iter().collect::<Vec<_>>(),
            vec![(6, 80), (6, 81), (6, 443)]
        );
        // No protocol, a wide range, named ports, no port at all: any.
        let mut no_proto = tcp(&[(80, 80)]);
        no_proto.flags = 0;
        let mut named = tcp(&[(80, 80)]);
        named.dst.named = vec![3];
        let mut icmp = tcp(&[(80, 80)]);
        icmp.proto = 1;
        for r in [no_proto, tcp(&[(1000, 2000)]), named, tcp(&[]), icmp] {
            let s = summary(&[tcp(&[(80, 80)]), r.clone()]);
            assert!(s.any, "{r:?}");
            assert!(s.keys.is_empty());
        }
    }

    #[test]
    fn the_index_holds_deny_steps_and_any_blocks_by_default_and_keyed_blocks_by_key() {
        let a = summary(&[tcp(&[(80, 80)])]);
        let b = summary(&[tcp(&[(80, 80), (443, 443)])]);
        let any = summary(&[tcp(&[])]);
        // 0: a, 1: any, 2: b, 3: deny
        let out: BTreeMap<u32, StepEnc> = build(&[Some(&a), Some(&any), Some(&b), None])
            .into_iter()
            .collect();
        let refs = |e: &StepEnc| -> Vec<u32> {
            (e.block..e.block + e.pass_to)
                .map(|i| {
                    let r = out[&i];
                    assert_eq!(r.kind, STEP_REF);
                    r.block
                })
                .collect()
        };
        assert_eq!(refs(&out[&DEFAULT_IDX]), vec![1, 3]);
        assert_eq!(refs(&out[&key_idx(6, 80)]), vec![0, 2]);
        assert_eq!(refs(&out[&key_idx(6, 443)]), vec![2]);
        assert!(!out.contains_key(&key_idx(17, 80)));
        // Nothing to skip: no index.
        assert!(build(&[Some(&any), None]).is_empty());
    }
}
