//! The recent flows a node keeps (Hubble keeps 4095 per node): a bounded ring with sequence
//! numbers, so a follower asks for what came after the last one it saw.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::record::FlowRecord;

/// Which flows a reader wants (`margay flows` flags). Empty fields match everything; all set
/// fields must match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Filter {
    #[serde(default)]
    pub denied: bool,
    /// Either end's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Either end's name starts with it (`[ns/]prefix`, as `hubble observe --pod`).
    #[serde(default)]
    pub pod: Option<String>,
    /// The deciding policy's or profile's name contains it.
    #[serde(default)]
    pub policy: Option<String>,
}

impl Filter {
    pub fn matches(&self, r: &FlowRecord) -> bool {
        if self.denied && !r.denied() {
            return false;
        }
        let ends = [&r.source, &r.dest];
        if let Some(ns) = &self.namespace
            && !ends.iter().any(|p| &p.namespace == ns)
        {
            return false;
        }
        if let Some(pod) = &self.pod {
            let (ns, prefix) = match pod.split_once('/') {
                Some((ns, p)) => (Some(ns), p),
                None => (None, pod.as_str()),
            };
            if !ends.iter().any(|p| {
                p.kind == "wep"
                    && ns.is_none_or(|ns| p.namespace == ns)
                    && p.name.starts_with(prefix)
            }) {
                return false;
            }
        }
        if let Some(policy) = &self.policy
            && !r.policy.contains(policy.as_str())
        {
            return false;
        }
        true
    }
}

/// A flow with its place in the ring's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Numbered {
    pub seq: u64,
    #[serde(flatten)]
    pub flow: FlowRecord,
}

#[derive(Debug)]
pub struct Ring {
    capacity: usize,
    flows: VecDeque<Numbered>,
    next_seq: u64,
}

impl Ring {
    /// Hubble's default per-node capacity.
    pub const DEFAULT_CAPACITY: usize = 4095;

    pub fn new(capacity: usize) -> Ring {
        Ring {
            capacity: capacity.max(1),
            flows: VecDeque::new(),
            next_seq: 1,
        }
    }

    pub fn push(&mut self, flows: impl IntoIterator<Item = FlowRecord>) {
        for flow in flows {
            if self.flows.len() == self.capacity {
                self.flows.pop_front();
            }
            self.flows.push_back(Numbered {
                seq: self.next_seq,
                flow,
            });
            self.next_seq += 1;
        }
    }

    /// The sequence number the next flow will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The last `n` matching flows, oldest first.
    pub fn last(&self, n: usize, filter: &Filter) -> Vec<Numbered> {
        let mut out: Vec<Numbered> = self
            .flows
            .iter()
            .rev()
            .filter(|f| filter.matches(&f.flow))
            .take(n)
            .cloned()
            .collect();
        out.reverse();
        out
    }

    /// Matching flows after `seq` (at most `n`), oldest first.
    pub fn after(&self, seq: u64, n: usize, filter: &Filter) -> Vec<Numbered> {
        self.flows
            .iter()
            .filter(|f| f.seq > seq && filter.matches(&f.flow))
            .take(n)
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.flows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::aggregate::Aggregator;
    use crate::prefix::Action;
    use crate::record::Peer;

    fn flows() -> Vec<FlowRecord> {
        let mut a = Aggregator::new("n", 100);
        for i in 0..10u16 {
            let mut o = crate::aggregate::tests::obs(
                1000 + i,
                u64::from(i),
                if i % 2 == 0 {
                    Action::Deny
                } else {
                    Action::Allow
                },
            );
            o.source = Peer {
                kind: "wep".into(),
                namespace: "shop".into(),
                name: format!("client-{i}"),
                labels: vec![],
            };
            o.dest = Peer::network("8.8.8.8".parse().unwrap());
            a.observe(o);
        }
        a.flush()
    }

    #[test]
    fn keeps_the_newest_and_follows_by_sequence() {
        let mut r = Ring::new(4);
        r.push(flows());
        assert_eq!(r.len(), 4);
        let all = r.last(100, &Filter::default());
        assert_eq!(all.first().unwrap().seq, 7);
        assert_eq!(r.next_seq(), 11);
        assert_eq!(r.after(9, 10, &Filter::default()).len(), 1);
        assert!(r.after(10, 10, &Filter::default()).is_empty());
    }

    #[test]
    fn filters_combine() {
        let mut r = Ring::new(100);
        r.push(flows());
        let denied = Filter {
            denied: true,
            ..Filter::default()
        };
        assert_eq!(r.last(100, &denied).len(), 5);
        let pod = Filter {
            pod: Some("shop/client-3".into()),
            ..Filter::default()
        };
        assert_eq!(r.last(100, &pod).len(), 1);
        let both = Filter {
            pod: Some("client-3".into()),
            denied: true,
            ..Filter::default()
        };
        assert!(r.last(100, &both).is_empty());
        let ns = Filter {
            namespace: Some("other".into()),
            ..Filter::default()
        };
        assert!(r.last(100, &ns).is_empty());
        let pol = Filter {
            policy: Some("allow-web".into()),
            ..Filter::default()
        };
        assert_eq!(r.last(100, &pol).len(), 10);
        assert_eq!(r.last(3, &Filter::default()).len(), 3);
    }
}
