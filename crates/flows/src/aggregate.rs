//! Logged packets into flow records: one record per (5-tuple, deciding rule) per interval, so
//! a flood of packets costs one entry per connection, and at most `max_flows` entries per
//! interval — what does not fit is counted as dropped, never silently lost.

use std::collections::HashMap;

use crate::packet::{Tuple, proto_name};
use crate::prefix::RuleRef;
use crate::record::{FlowRecord, Peer, Traffic};

/// One logged packet, with what the dataplane knows of its two ends.
#[derive(Debug, Clone)]
pub struct Observation {
    pub at_ms: u64,
    pub tuple: Tuple,
    pub bytes: u64,
    pub rule: RuleRef,
    /// The rule's tier (for the policy-hit string).
    pub tier: String,
    pub source: Peer,
    pub dest: Peer,
}

/// An allowed connection's traffic since its last count (conntrack's counters), or its end.
#[derive(Debug, Clone)]
pub struct Count {
    pub at_ms: u64,
    pub tuple: Tuple,
    pub rule: RuleRef,
    pub tier: String,
    pub source: Peer,
    pub dest: Peer,
    pub traffic: Traffic,
    /// The connection has ended (its conntrack entry closed or gone).
    pub completed: bool,
}

#[derive(Debug)]
struct Entry {
    start_ms: u64,
    end_ms: u64,
    packets: u64,
    bytes: u64,
    started: u64,
    completed: u64,
    traffic: Traffic,
    tier: String,
    source: Peer,
    dest: Peer,
}

impl Entry {
    fn new(at_ms: u64, tier: String, source: Peer, dest: Peer) -> Entry {
        Entry {
            start_ms: at_ms,
            end_ms: at_ms,
            packets: 0,
            bytes: 0,
            started: 0,
            completed: 0,
            traffic: Traffic::default(),
            tier,
            source,
            dest,
        }
    }

    fn touch(&mut self, at_ms: u64) {
        self.start_ms = self.start_ms.min(at_ms);
        self.end_ms = self.end_ms.max(at_ms);
    }
}

/// The current interval's flows.
#[derive(Debug)]
pub struct Aggregator {
    node: String,
    max_flows: usize,
    entries: HashMap<(Tuple, RuleRef), Entry>,
    dropped: u64,
    observed: u64,
}

impl Aggregator {
    pub fn new(node: impl Into<String>, max_flows: usize) -> Aggregator {
        Aggregator {
            node: node.into(),
            max_flows: max_flows.max(1),
            entries: HashMap::new(),
            dropped: 0,
            observed: 0,
        }
    }

    /// The interval's entry for `key`, made if there is room (None, counted as dropped, when
    /// the interval is full).
    fn slot(
        &mut self,
        key: (Tuple, RuleRef),
        at_ms: u64,
        tier: String,
        source: Peer,
        dest: Peer,
    ) -> Option<&mut Entry> {
        if self.entries.len() >= self.max_flows && !self.entries.contains_key(&key) {
            self.dropped += 1;
            return None;
        }
        Some(
            self.entries
                .entry(key)
                .or_insert_with(|| Entry::new(at_ms, tier, source, dest)),
        )
    }

    /// Counts one packet. Returns false when it was dropped (the interval is full).
    pub fn observe(&mut self, o: Observation) -> bool {
        self.observed += 1;
        // An allowed connection logs its first packet only: that packet starts it.
        let starts = o.rule.action == crate::prefix::Action::Allow;
        let Some(e) = self.slot((o.tuple, o.rule), o.at_ms, o.tier, o.source, o.dest) else {
            return false;
        };
        e.packets += 1;
        e.bytes += o.bytes;
        if starts {
            e.started = 1;
        }
        e.touch(o.at_ms);
        true
    }

    /// Adds an allowed connection's traffic (or its end) to the interval: a long-lived
    /// connection gets a record in every interval it moves data. Returns false when it was
    /// dropped (the interval is full).
    pub fn count(&mut self, c: Count) -> bool {
        let Some(e) = self.slot((c.tuple, c.rule), c.at_ms, c.tier, c.source, c.dest) else {
            return false;
        };
        let t = &mut e.traffic;
        t.orig_packets += c.traffic.orig_packets;
        t.orig_bytes += c.traffic.orig_bytes;
        t.reply_packets += c.traffic.reply_packets;
        t.reply_bytes += c.traffic.reply_bytes;
        if c.completed {
            e.completed = 1;
        }
        e.touch(c.at_ms);
        true
    }

    /// Packets seen and dropped since the aggregator was made.
    pub fn counts(&self) -> (u64, u64) {
        (self.observed, self.dropped)
    }

    pub fn pending(&self) -> usize {
        self.entries.len()
    }

    /// The interval's records (oldest first), and a fresh interval.
    pub fn flush(&mut self) -> Vec<FlowRecord> {
        let mut out: Vec<FlowRecord> = self
            .entries
            .drain()
            .map(|((tuple, rule), e)| {
                // In and out as the reporting endpoint sees them.
                let t = e.traffic;
                let (packets_out, bytes_out, packets_in, bytes_in) = match rule.direction {
                    crate::prefix::Direction::Egress => {
                        (t.orig_packets, t.orig_bytes, t.reply_packets, t.reply_bytes)
                    }
                    crate::prefix::Direction::Ingress => {
                        (t.reply_packets, t.reply_bytes, t.orig_packets, t.orig_bytes)
                    }
                };
                FlowRecord {
                    start_ms: e.start_ms,
                    end_ms: e.end_ms,
                    proto: proto_name(tuple.proto),
                    tuple,
                    policy: rule.hit(0, &e.tier),
                    reporter: FlowRecord::reporter_for(rule.direction).into(),
                    action: rule.action,
                    rule,
                    source: e.source,
                    dest: e.dest,
                    packets: e.packets,
                    bytes: e.bytes,
                    num_flows: 1,
                    num_flows_started: e.started,
                    num_flows_completed: e.completed,
                    packets_in,
                    packets_out,
                    bytes_in,
                    bytes_out,
                    node: self.node.clone(),
                }
            })
            .collect();
        out.sort_by_key(|r| (r.start_ms, r.tuple));
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use crate::prefix::{Action, Direction, Origin};

    pub(crate) fn obs(port: u16, at: u64, action: Action) -> Observation {
        Observation {
            at_ms: at,
            tuple: Tuple {
                src: "10.0.0.2".parse().unwrap(),
                dst: "10.0.0.9".parse().unwrap(),
                proto: 6,
                src_port: port,
                dst_port: 80,
            },
            bytes: 60,
            rule: RuleRef {
                action,
                direction: Direction::Ingress,
                origin: Origin::Policy {
                    kind: "np".into(),
                    namespace: "shop".into(),
                    name: "allow-web".into(),
                },
                rule_index: Some(0),
            },
            tier: "default".into(),
            source: Peer::default(),
            dest: Peer::default(),
        }
    }

    #[test]
    fn one_record_per_connection_and_rule_per_interval() {
        let mut a = Aggregator::new("node-1", 100);
        for i in 0..5 {
            assert!(a.observe(obs(1000, 10 + i, Action::Deny)));
        }
        a.observe(obs(1001, 12, Action::Allow));
        let out = a.flush();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].packets, 5);
        assert_eq!(out[0].bytes, 300);
        assert_eq!((out[0].start_ms, out[0].end_ms), (10, 14));
        assert_eq!(out[0].policy, "0|default|np:shop/allow-web|deny|0");
        assert_eq!(out[0].reporter, "dst");
        assert_eq!(out[0].proto, "tcp");
        assert_eq!(out[0].node, "node-1");
        assert!(a.flush().is_empty());
    }

    #[test]
    fn conntrack_counts_add_up_per_interval_and_say_when_a_connection_ends() {
        let mut a = Aggregator::new("n", 100);
        let first = obs(1000, 10, Action::Allow);
        let count = |at: u64, orig: u64, reply: u64, completed: bool| Count {
            at_ms: at,
            tuple: first.tuple,
            rule: first.rule.clone(),
            tier: "default".into(),
            source: Peer::default(),
            dest: Peer::default(),
            traffic: Traffic {
                orig_packets: orig,
                orig_bytes: orig * 100,
                reply_packets: reply,
                reply_bytes: reply * 1000,
            },
            completed,
        };
        a.observe(first.clone());
        a.count(count(20, 3, 2, false));
        a.count(count(30, 1, 1, false));
        let out = a.flush();
        assert_eq!(out.len(), 1);
        let r = &out[0];
        assert_eq!((r.num_flows_started, r.num_flows_completed), (1, 0));
        // An ingress rule reports for the destination: what the source sent comes in.
        assert_eq!((r.packets_in, r.bytes_in), (4, 400));
        assert_eq!((r.packets_out, r.bytes_out), (3, 3000));
        assert_eq!((r.start_ms, r.end_ms), (10, 30));
        // The next interval: only the end (no new first packet).
        a.count(count(40, 0, 0, true));
        let out = a.flush();
        assert_eq!(
            (out[0].num_flows_started, out[0].num_flows_completed),
            (0, 1)
        );
        assert_eq!(out[0].packets, 0);
        // A full interval sheds counts as it sheds packets.
        let mut small = Aggregator::new("n", 1);
        small.observe(obs(1, 1, Action::Deny));
        assert!(!small.count(count(2, 1, 1, false)));
        assert_eq!(small.counts().1, 1);
    }

    #[test]
    fn a_flood_is_bounded_and_what_is_shed_is_counted() {
        let mut a = Aggregator::new("n", 1000);
        for i in 0..100_000u32 {
            a.observe(obs((i % 60_000) as u16, u64::from(i), Action::Deny));
        }
        assert_eq!(a.pending(), 1000);
        let (seen, dropped) = a.counts();
        assert_eq!(seen, 100_000);
        // Packets of the 1000 kept connections still count; new connections beyond are shed.
        assert!(dropped > 90_000, "{dropped}");
        assert_eq!(a.flush().len(), 1000);
    }
}
