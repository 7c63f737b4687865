//! A userspace model of the program's policy evaluation (`eval_step` in bpf/policy.c), for
//! unit tests of the compiler without root, and as the oracle the kernel tests compare with.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use crate::layout::*;

/// The fields of a packet that policy reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub proto: u8,
    /// 0 without ports.
    pub sport: u16,
    pub dport: u16,
    pub icmp_type: u8,
    pub icmp_code: u8,
}

impl Packet {
    pub fn tcp(src: Ipv4Addr, dst: Ipv4Addr, dport: u16) -> Packet {
        Packet {
            src,
            dst,
            proto: 6,
            sport: 40000,
            dport,
            icmp_type: 0,
            icmp_code: 0,
        }
    }

    fn has_ports(&self) -> bool {
        matches!(self.proto, 6 | 17 | 132 | 136)
    }
}

/// The LPM trie's answer, as the program asks it.
fn in_set(sets: &BTreeMap<u32, BTreeSet<IpSetEntry>>, id: u32, addr: Ipv4Addr) -> bool {
    sets.get(&id).is_some_and(|s| {
        s.iter().any(|e| match e.prefix {
            Some(p) => {
                let mask = if p == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(p.min(32)))
                };
                u32::from(e.addr) & mask == u32::from(addr) & mask
            }
            None => false,
        })
    })
}

fn in_named(
    sets: &BTreeMap<u32, BTreeSet<IpSetEntry>>,
    id: u32,
    addr: Ipv4Addr,
    port: u16,
    proto: u8,
) -> bool {
    sets.get(&id).is_some_and(|s| {
        s.iter()
            .any(|e| e.prefix.is_none() && e.addr == addr && e.port == port && e.proto == proto)
    })
}

fn side_matches(
    s: &Side,
    addr: Ipv4Addr,
    port: u16,
    p: &Packet,
    sets: &BTreeMap<u32, BTreeSet<IpSetEntry>>,
) -> bool {
    if !s.sets.iter().all(|id| in_set(sets, *id, addr)) {
        return false;
    }
    if s.not_sets.iter().any(|id| in_set(sets, *id, addr)) {
        return false;
    }
    let has = p.has_ports();
    if has && s.not_ports.iter().any(|(a, b)| port >= *a && port <= *b) {
        return false;
    }
    if has
        && s.not_named
            .iter()
            .any(|id| in_named(sets, *id, addr, port, p.proto))
    {
        return false;
    }
    if s.ports.is_empty() && s.named.is_empty() {
        return true;
    }
    has && (s.ports.iter().any(|(a, b)| port >= *a && port <= *b)
        || s.named
            .iter()
            .any(|id| in_named(sets, *id, addr, port, p.proto)))
}

pub fn rule_matches(r: &Rule, p: &Packet, sets: &BTreeMap<u32, BTreeSet<IpSetEntry>>) -> bool {
    if r.flags & F_PROTO != 0 && p.proto != r.proto {
        return false;
    }
    if r.flags & F_NOT_PROTO != 0 && p.proto == r.not_proto {
        return false;
    }
    if r.flags & (F_ICMP_TYPE | F_NOT_ICMP_TYPE) != 0 {
        if p.proto != 1 {
            return false;
        }
        if r.flags & F_ICMP_TYPE != 0 && p.icmp_type != r.icmp_type {
            return false;
        }
        if r.flags & F_ICMP_CODE != 0 && p.icmp_code != r.icmp_code {
            return false;
        }
        if r.flags & F_NOT_ICMP_TYPE != 0 {
            let same_type = p.icmp_type == r.not_icmp_type;
            if r.flags & F_NOT_ICMP_CODE != 0 {
                if same_type && p.icmp_code == r.not_icmp_code {
                    return false;
                }
            } else if same_type {
                return false;
            }
        }
    }
    side_matches(&r.src, p.src, p.sport, p, sets) && side_matches(&r.dst, p.dst, p.dport, p, sets)
}

/// True when the endpoint hook's steps (each with its block's rules, as
/// [`crate::compile::Compiled::resolved`] gives them) allow the packet (a new flow): the
/// program's `eval_step` loop, step by step, with the same bound.
pub fn allows(
    steps: &[(crate::compile::Step, std::sync::Arc<Vec<Rule>>)],
    p: &Packet,
    sets: &BTreeMap<u32, BTreeSet<IpSetEntry>>,
) -> bool {
    use crate::compile::Step;
    let mut step = 0usize;
    let mut block: &[Rule] = &[];
    let mut rule = 0usize;
    let mut pass_to = 0usize;
    for _ in 0..MAX_RULES {
        if rule >= block.len() {
            let Some((s, rules)) = steps.get(step) else {
                return false;
            };
            match s {
                Step::Deny(_) => return false,
                Step::Block { pass_to: to, .. } => {
                    block = rules;
                    rule = 0;
                    pass_to = *to as usize;
                    step += 1;
                }
            }
            continue;
        }
        let r = &block[rule];
        if !rule_matches(r, p, sets) {
            rule += 1;
            continue;
        }
        match r.action {
            ACT_ALLOW => return true,
            ACT_PASS => {
                step = step.max(pass_to);
                rule = block.len();
            }
            ACT_LOG => rule += 1,
            _ => return false,
        }
    }
    false
}

/// [`allows`] through the endpoint hook's index (`extras`: the slot's entries beyond the
/// main list, as [`crate::index::build`] makes them), as the program walks it: the default
/// range and the packet's key range merged by step index, entries below the current step
/// (after a Pass) skipped one per iteration. Without a default entry: the linear walk.
pub fn allows_indexed(
    steps: &[(crate::compile::Step, std::sync::Arc<Vec<Rule>>)],
    extras: &BTreeMap<u32, StepEnc>,
    p: &Packet,
    sets: &BTreeMap<u32, BTreeSet<IpSetEntry>>,
) -> bool {
    use crate::compile::Step;
    use crate::index::{DEFAULT_IDX, STEP_INDEX, STEP_REF, key_idx};
    const NONE: u32 = u32::MAX;
    let Some(def) = extras.get(&DEFAULT_IDX).filter(|d| d.kind == STEP_INDEX) else {
        return allows(steps, p, sets);
    };
    let (mut d_pos, d_end) = (def.block, def.block.saturating_add(def.pass_to));
    let (mut k_pos, mut k_end) = (0u32, 0u32);
    if p.has_ports()
        && let Some(e) = extras
            .get(&key_idx(p.proto, p.dport))
            .filter(|e| e.kind == STEP_INDEX)
    {
        (k_pos, k_end) = (e.block, e.block.saturating_add(e.pass_to));
    }
    // A ref's step index; None: a hole (the program fails closed).
    let head = |pos: u32| -> Option<u32> {
        extras
            .get(&pos)
            .filter(|r| r.kind == STEP_REF)
            .map(|r| r.block)
    };
    let mut floor = 0u32;
    let mut block: &[Rule] = &[];
    let mut rule = 0usize;
    let mut pass_to = 0u32;
    for _ in 0..MAX_RULES {
        if rule >= block.len() {
            let od = if d_pos < d_end {
                match head(d_pos) {
                    Some(o) => o,
                    None => return false,
                }
            } else {
                NONE
            };
            if od < floor {
                d_pos += 1;
                continue;
            }
            let ok = if k_pos >= k_end {
                NONE
            } else {
                match head(k_pos) {
                    Some(o) => o,
                    None => return false,
                }
            };
            if ok < floor {
                k_pos += 1;
                continue;
            }
            if od == NONE && ok == NONE {
                return false;
            }
            let at = if od <= ok {
                d_pos += 1;
                od
            } else {
                k_pos += 1;
                ok
            };
            let Some((s, rules)) = steps.get(at as usize) else {
                return false;
            };
            match s {
                Step::Deny(_) => return false,
                Step::Block { pass_to: to, .. } => {
                    block = rules;
                    rule = 0;
                    pass_to = *to;
                    floor = at + 1;
                }
            }
            continue;
        }
        let r = &block[rule];
        if !rule_matches(r, p, sets) {
            rule += 1;
            continue;
        }
        match r.action {
            ACT_ALLOW => return true,
            ACT_PASS => {
                floor = floor.max(pass_to);
                rule = block.len();
            }
            ACT_LOG => rule += 1,
            _ => return false,
        }
    }
    false
}
