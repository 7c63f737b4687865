//! Logged packets into flow records: one record per (5-tuple, deciding rule) per interval, so
//! a flood of packets costs one entry per connection, and at most `max_flows` entries per
//! interval — what does not fit is counted as dropped, never silently lost.

use std::collections::HashMap;

use crate::packet::{Tuple, proto_name};
use crate::prefix::RuleRef;
use crate::record::{FlowRecord, Peer};

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

#[derive(Debug)]
struct Entry {
    start_ms: u64,
    end_ms: u64,
    packets: u64,
    bytes: u64,
    tier: String,
    source: Peer,
    dest: Peer,
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

    /// Counts one packet. Returns false when it was dropped (the interval is full).
    pub fn observe(&mut self, o: Observation) -> bool {
        self.observed += 1;
        let key = (o.tuple, o.rule);
        if let Some(e) = self.entries.get_mut(&key) {
            e.packets += 1;
            e.bytes += o.bytes;
            e.start_ms = e.start_ms.min(o.at_ms);
            e.end_ms = e.end_ms.max(o.at_ms);
            return true;
        }
        if self.entries.len() >= self.max_flows {
            self.dropped += 1;
            return false;
        }
        self.entries.insert(
            key,
            Entry {
                start_ms: o.at_ms,
                end_ms: o.at_ms,
                packets: 1,
                bytes: o.bytes,
                tier: o.tier,
                source: o.source,
                dest: o.dest,
            },
        );
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
            .map(|((tuple, rule), e)| FlowRecord {
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
                node: self.node.clone(),
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
