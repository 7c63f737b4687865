//! The maps' keys and values, byte for byte as `bpf/policy.c` declares them.
//!
//! Encoded by hand into fixed byte arrays (native byte order for host-order fields, network
//! order where the C side keeps network order), so the crate needs no `unsafe` Pod impls.
//! The sizes are checked against the object's BTF-free map definitions in the loader tests.

use std::net::Ipv4Addr;

/// Positive or negative IP-set references per rule side (each list).
pub const MAX_SETS: usize = 4;
/// Named-port sets per rule side (each list).
pub const MAX_NAMED: usize = 4;
/// Port ranges per rule side (each list).
pub const MAX_PORTS: usize = 8;
/// Evaluation steps per endpoint and direction (every rule evaluated plus every block entered):
/// the program's `bpf_loop` bound.
pub const MAX_RULES: usize = 4096;

pub const ACT_ALLOW: u8 = 0;
pub const ACT_DENY: u8 = 1;
pub const ACT_PASS: u8 = 2;
pub const ACT_LOG: u8 = 3;

pub const F_PROTO: u8 = 0x01;
pub const F_NOT_PROTO: u8 = 0x02;
pub const F_ICMP_TYPE: u8 = 0x04;
pub const F_ICMP_CODE: u8 = 0x08;
pub const F_NOT_ICMP_TYPE: u8 = 0x10;
pub const F_NOT_ICMP_CODE: u8 = 0x20;

/// tc ingress on the host-side interface: traffic from the workload (its egress policy).
pub const HOOK_FROM_WL: usize = 0;
/// tc egress: traffic to the workload (its ingress policy).
pub const HOOK_TO_WL: usize = 1;

pub const SIDE_SIZE: usize = 4 * (2 * MAX_SETS + 2 * MAX_NAMED) + 4 * 2 * MAX_PORTS + 8;
pub const RULE_SIZE: usize = 16 + 2 * SIDE_SIZE;
pub const ENDPOINT_SIZE: usize = 24;
pub const RULE_KEY_SIZE: usize = 8;
/// The LPM key's data after its 4-byte prefix length.
pub const IPSET_DATA_SIZE: usize = 12;
pub const STEP_SIZE: usize = 12;
pub const BLOCK_SIZE: usize = 8;
pub const CT_KEY_SIZE: usize = 20;
/// `struct counter`: packets u64, bytes u64 (per CPU).
pub const COUNTER_SIZE: usize = 16;

/// Sums a per-CPU counter's values: (packets, bytes).
pub fn sum_counters<'a>(per_cpu: impl IntoIterator<Item = &'a [u8; COUNTER_SIZE]>) -> (u64, u64) {
    per_cpu.into_iter().fold((0u64, 0u64), |(p, b), v| {
        let mut x = [0u8; 8];
        x.copy_from_slice(&v[..8]);
        let mut y = [0u8; 8];
        y.copy_from_slice(&v[8..]);
        (
            p.saturating_add(u64::from_ne_bytes(x)),
            b.saturating_add(u64::from_ne_bytes(y)),
        )
    })
}

/// Conntrack entry flags (`struct ct_val.flags`), only ever set by the program.
pub const CT_REPLY_SEEN: u32 = 0x01;
pub const CT_FIN_FWD: u32 = 0x02;
pub const CT_FIN_REV: u32 = 0x04;
pub const CT_RST: u32 = 0x08;

/// Idle timeouts (ns) by protocol and state, Calico's BPF defaults (BPFConntrackTimeouts);
/// `ct_timeout` in policy.c holds the same table.
pub const CT_TCP_SYN_SENT_NS: u64 = 20 * SEC_NS;
pub const CT_TCP_ESTABLISHED_NS: u64 = 3600 * SEC_NS;
pub const CT_TCP_FINS_SEEN_NS: u64 = 30 * SEC_NS;
pub const CT_TCP_RESET_SEEN_NS: u64 = 40 * SEC_NS;
pub const CT_UDP_NS: u64 = 60 * SEC_NS;
pub const CT_ICMP_NS: u64 = 5 * SEC_NS;
pub const CT_GENERIC_NS: u64 = 600 * SEC_NS;
const SEC_NS: u64 = 1_000_000_000;

/// How long an entry may stay idle before the program judges its flow again and the
/// garbage collector deletes it.
pub fn ct_timeout(proto: u8, flags: u32) -> u64 {
    match proto {
        6 if flags & CT_RST != 0 => CT_TCP_RESET_SEEN_NS,
        6 if flags & (CT_FIN_FWD | CT_FIN_REV) == CT_FIN_FWD | CT_FIN_REV => CT_TCP_FINS_SEEN_NS,
        6 if flags & CT_REPLY_SEEN != 0 => CT_TCP_ESTABLISHED_NS,
        6 => CT_TCP_SYN_SENT_NS,
        17 => CT_UDP_NS,
        1 => CT_ICMP_NS,
        _ => CT_GENERIC_NS,
    }
}

/// A conntrack entry's key, as the program writes it: the flow's first packet on
/// `ifindex`, judged by `hook`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtKey {
    pub ifindex: u32,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// Host order (ICMP echo: the identifier).
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub hook: u8,
}

impl CtKey {
    pub fn decode(b: &[u8; CT_KEY_SIZE]) -> CtKey {
        CtKey {
            ifindex: u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
            src: Ipv4Addr::new(b[4], b[5], b[6], b[7]),
            dst: Ipv4Addr::new(b[8], b[9], b[10], b[11]),
            sport: u16::from_be_bytes([b[12], b[13]]),
            dport: u16::from_be_bytes([b[14], b[15]]),
            proto: b[16],
            hook: b[17],
        }
    }
}

/// A conntrack entry's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtVal {
    /// CLOCK_MONOTONIC ns of the last packet.
    pub last_seen_ns: u64,
    pub flags: u32,
    pub proto: u8,
}

impl CtVal {
    pub fn decode(b: &[u8; CT_VAL_SIZE]) -> CtVal {
        CtVal {
            last_seen_ns: u64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            flags: u32::from_ne_bytes([b[8], b[9], b[10], b[11]]),
            proto: b[12],
        }
    }

    /// Expired at `now_ns` (the program would judge the flow again).
    pub fn expired(&self, now_ns: u64) -> bool {
        now_ns.saturating_sub(self.last_seen_ns) > ct_timeout(self.proto, self.flags)
    }
}

/// A step that evaluates a block of rules.
pub const STEP_BLOCK: u32 = 0;
/// A step that denies (a tier's default action).
pub const STEP_DENY: u32 = 1;
pub const CT_VAL_SIZE: usize = 16;

/// Prefix bits of an IP-set entry's key before the address: the set id.
pub const SET_ID_BITS: u32 = 32;
/// A named-port member's full key length: set id, address, port, protocol.
pub const NAMED_PORT_BITS: u32 = 88;

/// One side (source or destination) of a rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Side {
    pub sets: Vec<u32>,
    pub not_sets: Vec<u32>,
    pub named: Vec<u32>,
    pub not_named: Vec<u32>,
    pub ports: Vec<(u16, u16)>,
    pub not_ports: Vec<(u16, u16)>,
}

/// One rule as the program evaluates it. The list lengths are within the limits above
/// (the compiler refuses anything larger before a `Rule` exists).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Rule {
    pub action: u8,
    pub flags: u8,
    pub proto: u8,
    pub not_proto: u8,
    pub icmp_type: u8,
    pub icmp_code: u8,
    pub not_icmp_type: u8,
    pub not_icmp_code: u8,
    /// The rule's index in its policy or profile (IPv6-only rules are left out, so it can
    /// differ from the position in the block): flow events name the rule with it.
    pub rule_index: u32,
    pub src: Side,
    pub dst: Side,
}

fn put_u32s(out: &mut Vec<u8>, vals: &[u32], n: usize) {
    for i in 0..n {
        out.extend_from_slice(&vals.get(i).copied().unwrap_or(0).to_ne_bytes());
    }
}

fn put_ranges(out: &mut Vec<u8>, vals: &[(u16, u16)], n: usize) {
    for i in 0..n {
        let (a, b) = vals.get(i).copied().unwrap_or((0, 0));
        out.extend_from_slice(&a.to_ne_bytes());
        out.extend_from_slice(&b.to_ne_bytes());
    }
}

/// Lengths are capped at the limit: the compiler guarantees they fit, and a longer list must
/// never spill into the next field.
fn len(v: usize, max: usize) -> u8 {
    v.min(max) as u8
}

impl Side {
    fn encode(&self, out: &mut Vec<u8>) {
        put_u32s(out, &self.sets, MAX_SETS);
        put_u32s(out, &self.not_sets, MAX_SETS);
        put_u32s(out, &self.named, MAX_NAMED);
        put_u32s(out, &self.not_named, MAX_NAMED);
        put_ranges(out, &self.ports, MAX_PORTS);
        put_ranges(out, &self.not_ports, MAX_PORTS);
        out.extend_from_slice(&[
            len(self.sets.len(), MAX_SETS),
            len(self.not_sets.len(), MAX_SETS),
            len(self.named.len(), MAX_NAMED),
            len(self.not_named.len(), MAX_NAMED),
            len(self.ports.len(), MAX_PORTS),
            len(self.not_ports.len(), MAX_PORTS),
            0,
            0,
        ]);
    }
}

impl Rule {
    pub fn encode(&self) -> [u8; RULE_SIZE] {
        let mut out = Vec::with_capacity(RULE_SIZE);
        out.extend_from_slice(&[
            self.action,
            self.flags,
            self.proto,
            self.not_proto,
            self.icmp_type,
            self.icmp_code,
            self.not_icmp_type,
            self.not_icmp_code,
        ]);
        out.extend_from_slice(&self.rule_index.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        self.src.encode(&mut out);
        self.dst.encode(&mut out);
        let mut arr = [0u8; RULE_SIZE];
        arr.copy_from_slice(&out[..RULE_SIZE]);
        arr
    }
}

/// Reads `n` native-endian u32s at `*at`, advancing it.
fn get_u32s(b: &[u8], at: &mut usize, n: usize) -> Vec<u32> {
    (0..n)
        .map(|_| {
            let v = u32::from_ne_bytes([b[*at], b[*at + 1], b[*at + 2], b[*at + 3]]);
            *at += 4;
            v
        })
        .collect()
}

fn get_ranges(b: &[u8], at: &mut usize, n: usize) -> Vec<(u16, u16)> {
    (0..n)
        .map(|_| {
            let r = (
                u16::from_ne_bytes([b[*at], b[*at + 1]]),
                u16::from_ne_bytes([b[*at + 2], b[*at + 3]]),
            );
            *at += 4;
            r
        })
        .collect()
}

impl Side {
    /// The inverse of `encode` for the `SIDE_SIZE` bytes at `b[at..]` (counts beyond the
    /// limits, which only a corrupt map holds, are capped).
    fn decode(b: &[u8], at: usize) -> Side {
        let mut i = at;
        let mut sets = get_u32s(b, &mut i, MAX_SETS);
        let mut not_sets = get_u32s(b, &mut i, MAX_SETS);
        let mut named = get_u32s(b, &mut i, MAX_NAMED);
        let mut not_named = get_u32s(b, &mut i, MAX_NAMED);
        let mut ports = get_ranges(b, &mut i, MAX_PORTS);
        let mut not_ports = get_ranges(b, &mut i, MAX_PORTS);
        let n = |k: usize, max: usize| usize::from(b[i + k]).min(max);
        sets.truncate(n(0, MAX_SETS));
        not_sets.truncate(n(1, MAX_SETS));
        named.truncate(n(2, MAX_NAMED));
        not_named.truncate(n(3, MAX_NAMED));
        ports.truncate(n(4, MAX_PORTS));
        not_ports.truncate(n(5, MAX_PORTS));
        Side {
            sets,
            not_sets,
            named,
            not_named,
            ports,
            not_ports,
        }
    }
}

impl Rule {
    /// The inverse of [`Rule::encode`]: restoring what a previous run wrote.
    pub fn decode(b: &[u8; RULE_SIZE]) -> Rule {
        Rule {
            action: b[0],
            flags: b[1],
            proto: b[2],
            not_proto: b[3],
            icmp_type: b[4],
            icmp_code: b[5],
            not_icmp_type: b[6],
            not_icmp_code: b[7],
            rule_index: u32::from_ne_bytes([b[8], b[9], b[10], b[11]]),
            src: Side::decode(b, 16),
            dst: Side::decode(b, 16 + SIDE_SIZE),
        }
    }
}

pub fn decode_rule_key(k: &[u8; RULE_KEY_SIZE]) -> (u32, u32) {
    (
        u32::from_ne_bytes([k[0], k[1], k[2], k[3]]),
        u32::from_ne_bytes([k[4], k[5], k[6], k[7]]),
    )
}

pub fn rule_key(slot: u32, idx: u32) -> [u8; RULE_KEY_SIZE] {
    let mut k = [0u8; RULE_KEY_SIZE];
    k[..4].copy_from_slice(&slot.to_ne_bytes());
    k[4..].copy_from_slice(&idx.to_ne_bytes());
    k
}

/// One step of an endpoint hook's list (`mgy_steps[{slot, idx}]`): evaluate block `block`
/// (a Pass rule in it continues at step `pass_to`), or deny.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct StepEnc {
    pub kind: u32,
    pub block: u32,
    pub pass_to: u32,
}

impl StepEnc {
    pub fn encode(&self) -> [u8; STEP_SIZE] {
        let mut b = [0u8; STEP_SIZE];
        b[..4].copy_from_slice(&self.kind.to_ne_bytes());
        b[4..8].copy_from_slice(&self.block.to_ne_bytes());
        b[8..].copy_from_slice(&self.pass_to.to_ne_bytes());
        b
    }

    pub fn decode(b: &[u8; STEP_SIZE]) -> StepEnc {
        let u = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        StepEnc {
            kind: u(0),
            block: u(4),
            pass_to: u(8),
        }
    }
}

/// A block's entry (`mgy_blocks[id]`): where its current rules are. Replaced in one map
/// write when the policy changes (the flip, for every endpoint using it at once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Block {
    pub slot: u32,
    pub count: u32,
}

impl Block {
    pub fn encode(&self) -> [u8; BLOCK_SIZE] {
        let mut b = [0u8; BLOCK_SIZE];
        b[..4].copy_from_slice(&self.slot.to_ne_bytes());
        b[4..].copy_from_slice(&self.count.to_ne_bytes());
        b
    }

    pub fn decode(b: &[u8; BLOCK_SIZE]) -> Block {
        Block {
            slot: u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
            count: u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
        }
    }
}

/// An endpoint's entry: the step slot and step count per hook. Written in one map update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Endpoint {
    pub slot: [u32; 2],
    pub count: [u32; 2],
    pub flags: u32,
}

impl Endpoint {
    pub fn encode(&self) -> [u8; ENDPOINT_SIZE] {
        let mut k = [0u8; ENDPOINT_SIZE];
        for (i, v) in [
            self.slot[0],
            self.slot[1],
            self.count[0],
            self.count[1],
            self.flags,
            0,
        ]
        .iter()
        .enumerate()
        {
            k[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
        }
        k
    }

    pub fn decode(b: &[u8; ENDPOINT_SIZE]) -> Endpoint {
        let u = |i: usize| u32::from_ne_bytes([b[i * 4], b[i * 4 + 1], b[i * 4 + 2], b[i * 4 + 3]]);
        Endpoint {
            slot: [u(0), u(1)],
            count: [u(2), u(3)],
            flags: u(4),
        }
    }
}

/// One entry of the IP-set LPM trie.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpSetEntry {
    pub set_id: u32,
    pub addr: Ipv4Addr,
    /// CIDR prefix length for a network member; None for a named-port member.
    pub prefix: Option<u8>,
    pub port: u16,
    pub proto: u8,
}

impl IpSetEntry {
    /// The LPM key: (prefix length, data).
    pub fn key(&self) -> (u32, [u8; IPSET_DATA_SIZE]) {
        let mut d = [0u8; IPSET_DATA_SIZE];
        d[..4].copy_from_slice(&self.set_id.to_be_bytes());
        d[4..8].copy_from_slice(&self.addr.octets());
        match self.prefix {
            Some(p) => (SET_ID_BITS + u32::from(p.min(32)), d),
            None => {
                d[8..10].copy_from_slice(&self.port.to_be_bytes());
                d[10] = self.proto;
                (NAMED_PORT_BITS, d)
            }
        }
    }
}

impl IpSetEntry {
    /// The inverse of [`IpSetEntry::key`]; None for a key `key` never produces.
    pub fn decode(plen: u32, d: &[u8; IPSET_DATA_SIZE]) -> Option<IpSetEntry> {
        let set_id = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
        let addr = Ipv4Addr::new(d[4], d[5], d[6], d[7]);
        if plen == NAMED_PORT_BITS {
            return Some(IpSetEntry {
                set_id,
                addr,
                prefix: None,
                port: u16::from_be_bytes([d[8], d[9]]),
                proto: d[10],
            });
        }
        let bits = plen.checked_sub(SET_ID_BITS).filter(|b| *b <= 32)?;
        Some(IpSetEntry {
            set_id,
            addr,
            prefix: Some(bits as u8),
            port: 0,
            proto: 0,
        })
    }
}

/// `struct flow_event` (policy.c): one new flow judged by policy.
pub const FLOW_EVENT_SIZE: usize = 48;
/// A rule decided (`slot`, `idx`, `rule_index`, `action`).
pub const EV_RULE: u8 = 0;
/// A tier's default deny (`step`).
pub const EV_TIER_END: u8 = 1;
/// The end of the endpoint's list: no profile matched.
pub const EV_NO_MATCH: u8 = 2;
/// A missing step, block or rule (a torn write): denied, fail closed.
pub const EV_FAIL: u8 = 3;

/// A decoded flow event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowEvent {
    /// CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// Host order (ICMP echo: the id on both sides).
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// [`HOOK_FROM_WL`] (the workload's egress policy) or [`HOOK_TO_WL`] (its ingress).
    pub hook: u8,
    pub kind: u8,
    /// `ACT_ALLOW`, `ACT_DENY` (the verdict) or `ACT_LOG` (a Log rule; evaluation went on).
    pub action: u8,
    pub ifindex: u32,
    pub slot: u32,
    pub idx: u32,
    pub rule_index: u32,
    pub step: u32,
    /// The packet's length (saturated at 65535).
    pub len: u16,
    pub icmp_type: u8,
    pub icmp_code: u8,
}

impl FlowEvent {
    /// None when `b` is not one event (a size the program never writes).
    pub fn decode(b: &[u8]) -> Option<FlowEvent> {
        let b: &[u8; FLOW_EVENT_SIZE] = b.get(..FLOW_EVENT_SIZE)?.try_into().ok()?;
        let u32_at = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&b[0..8]);
        Some(FlowEvent {
            ts_ns: u64::from_ne_bytes(ts),
            src: Ipv4Addr::new(b[8], b[9], b[10], b[11]),
            dst: Ipv4Addr::new(b[12], b[13], b[14], b[15]),
            sport: u16::from_be_bytes([b[16], b[17]]),
            dport: u16::from_be_bytes([b[18], b[19]]),
            proto: b[20],
            hook: b[21],
            kind: b[22],
            action: b[23],
            ifindex: u32_at(24),
            slot: u32_at(28),
            idx: u32_at(32),
            rule_index: u32_at(36),
            step: u32_at(40),
            len: u16::from_ne_bytes([b[44], b[45]]),
            icmp_type: b[46],
            icmp_code: b[47],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_c_structs() {
        // struct side: 16 u32 ids, 16 ranges, 8 bytes of counts and padding.
        assert_eq!(SIDE_SIZE, 136);
        assert_eq!(RULE_SIZE, 288);
        let r = Rule {
            action: ACT_PASS,
            rule_index: 7,
            src: Side {
                sets: vec![1, 2],
                ports: vec![(80, 81)],
                ..Side::default()
            },
            ..Rule::default()
        };
        let b = r.encode();
        assert_eq!(b[0], ACT_PASS);
        assert_eq!(u32::from_ne_bytes([b[8], b[9], b[10], b[11]]), 7);
        // src.sets[1] at 16 + 4.
        assert_eq!(u32::from_ne_bytes([b[20], b[21], b[22], b[23]]), 2);
        // src.ports[0] after the 16 ids: 16 + 64.
        assert_eq!(u16::from_ne_bytes([b[80], b[81]]), 80);
        // src.n_sets and src.n_ports after the 16 ranges: 16 + 128.
        assert_eq!(b[144], 2);
        assert_eq!(b[148], 1);
    }

    #[test]
    fn flow_events_decode_as_the_program_writes_them() {
        let mut b = [0u8; FLOW_EVENT_SIZE];
        b[0..8].copy_from_slice(&42u64.to_ne_bytes());
        b[8..12].copy_from_slice(&[10, 0, 0, 1]);
        b[12..16].copy_from_slice(&[10, 0, 0, 2]);
        b[16..18].copy_from_slice(&40000u16.to_be_bytes());
        b[18..20].copy_from_slice(&80u16.to_be_bytes());
        b[20] = 6;
        b[21] = HOOK_TO_WL as u8;
        b[22] = EV_RULE;
        b[23] = ACT_DENY;
        for (at, v) in [(24, 7u32), (28, 9), (32, 3), (36, 5), (40, 0)] {
            b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        }
        b[44..46].copy_from_slice(&60u16.to_ne_bytes());
        b[46] = 8;
        let e = FlowEvent::decode(&b).expect("a whole event");
        assert_eq!(e.ts_ns, 42);
        assert_eq!(e.src, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(e.dst, Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!((e.sport, e.dport, e.proto), (40000, 80, 6));
        assert_eq!((e.hook, e.kind, e.action), (1, EV_RULE, ACT_DENY));
        assert_eq!(
            (e.ifindex, e.slot, e.idx, e.rule_index, e.len),
            (7, 9, 3, 5, 60)
        );
        assert_eq!((e.icmp_type, e.icmp_code), (8, 0));
        // Short input is refused, longer input (the ring's 8-byte rounding) is fine.
        assert_eq!(FlowEvent::decode(&b[..47]), None);
        let mut long = b.to_vec();
        long.extend_from_slice(&[0; 8]);
        assert_eq!(FlowEvent::decode(&long), Some(e));
    }

    #[test]
    fn ipset_keys_put_the_set_id_first_and_count_its_bits() {
        let e = IpSetEntry {
            set_id: 0x0102_0304,
            addr: Ipv4Addr::new(10, 0, 0, 0),
            prefix: Some(8),
            port: 0,
            proto: 0,
        };
        let (plen, d) = e.key();
        assert_eq!(plen, 40);
        assert_eq!(&d[..5], &[1, 2, 3, 4, 10]);
        let n = IpSetEntry {
            prefix: None,
            port: 8080,
            proto: 6,
            ..e
        };
        let (plen, d) = n.key();
        assert_eq!(plen, 88);
        assert_eq!(&d[8..11], &[0x1f, 0x90, 6]);
        let ep = Endpoint {
            slot: [3, 4],
            count: [5, 6],
            flags: 1,
        };
        assert_eq!(Endpoint::decode(&ep.encode()), ep);
        let (plen, d) = n.key();
        assert_eq!(IpSetEntry::decode(plen, &d), Some(n));
        let (plen, d) = e.key();
        assert_eq!(IpSetEntry::decode(plen, &d), Some(e));
        assert_eq!(IpSetEntry::decode(7, &d), None);
    }

    #[test]
    fn conntrack_timeouts_follow_the_tcp_state() {
        let v = |proto, flags| CtVal {
            last_seen_ns: 1_000,
            flags,
            proto,
        };
        let s = 1_000_000_000u64;
        assert_eq!(ct_timeout(6, 0), 20 * s);
        assert_eq!(ct_timeout(6, CT_REPLY_SEEN), 3600 * s);
        assert_eq!(ct_timeout(6, CT_REPLY_SEEN | CT_FIN_FWD), 3600 * s);
        assert_eq!(
            ct_timeout(6, CT_REPLY_SEEN | CT_FIN_FWD | CT_FIN_REV),
            30 * s
        );
        assert_eq!(ct_timeout(6, CT_REPLY_SEEN | CT_RST), 40 * s);
        assert_eq!((ct_timeout(17, 0), ct_timeout(1, 0)), (60 * s, 5 * s));
        assert_eq!(ct_timeout(132, 0), 600 * s);
        assert!(!v(17, 0).expired(1_000 + 60 * s));
        assert!(v(17, 0).expired(1_001 + 60 * s));
        // A clock behind the entry (never expired).
        assert!(!v(6, 0).expired(0));
        let mut b = [0u8; CT_VAL_SIZE];
        b[..8].copy_from_slice(&7u64.to_ne_bytes());
        b[8..12].copy_from_slice(&CT_RST.to_ne_bytes());
        b[12] = 6;
        assert_eq!(CtVal::decode(&b), v(6, CT_RST).with_last_seen(7));
    }

    impl CtVal {
        fn with_last_seen(mut self, ns: u64) -> CtVal {
            self.last_seen_ns = ns;
            self
        }
    }

    #[test]
    fn rules_decode_to_what_was_encoded() {
        let full = Side {
            sets: vec![1, 2, 3, 4],
            not_sets: vec![5],
            named: vec![6, 7],
            not_named: vec![8, 9, 10],
            ports: vec![(1, 2), (80, 80), (1000, 2000)],
            not_ports: vec![(7, 7); MAX_PORTS],
        };
        let r = Rule {
            action: ACT_DENY,
            flags: F_PROTO | F_ICMP_TYPE | F_NOT_ICMP_CODE,
            proto: 1,
            not_proto: 17,
            icmp_type: 8,
            icmp_code: 3,
            not_icmp_type: 5,
            not_icmp_code: 9,
            rule_index: 4095,
            src: full.clone(),
            dst: Side {
                ports: vec![(443, 443)],
                ..Side::default()
            },
        };
        assert_eq!(Rule::decode(&r.encode()), r);
        assert_eq!(Rule::decode(&Rule::default().encode()), Rule::default());
        assert_eq!(decode_rule_key(&rule_key(7, 4000)), (7, 4000));
        let st = StepEnc {
            kind: STEP_DENY,
            block: 9,
            pass_to: 12,
        };
        assert_eq!(StepEnc::decode(&st.encode()), st);
        let b = Block { slot: 3, count: 4 };
        assert_eq!(Block::decode(&b.encode()), b);
    }
}
