//! A flow record: one connection (or an interval's worth of one), who talked to whom, what
//! decided, how much.

use serde::{Deserialize, Serialize};

use crate::packet::Tuple;
use crate::prefix::{Action, Direction, RuleRef};

/// One side of a flow: a workload (namespace/name), a host endpoint, a network set, or a
/// plain network (`pvt`/`pub`, as Calico names addresses outside the cluster).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Peer {
    /// `wep`, `hep`, `ns` or `net`.
    #[serde(rename = "type")]
    pub kind: String,
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
}

impl Peer {
    /// An address nothing in the cluster claims: `pvt` for RFC 1918 addresses, else `pub`.
    pub fn network(addr: std::net::IpAddr) -> Peer {
        let private = match addr {
            std::net::IpAddr::V4(a) => a.is_private(),
            std::net::IpAddr::V6(_) => false,
        };
        Peer {
            kind: "net".into(),
            namespace: "-".into(),
            name: if private { "pvt" } else { "pub" }.into(),
            labels: Vec::new(),
        }
    }

    /// `namespace/name`, or the name alone.
    pub fn display(&self) -> String {
        if self.namespace.is_empty() || self.namespace == "-" {
            self.name.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        }
    }
}

/// One flow, as `margay flows` shows it and the flow log file writes it (one JSON object per
/// line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowRecord {
    /// Unix time in milliseconds of the first and last packet counted.
    pub start_ms: u64,
    pub end_ms: u64,
    pub tuple: Tuple,
    pub proto: String,
    pub source: Peer,
    pub dest: Peer,
    pub action: Action,
    /// `src` when an egress rule decided, `dst` when an ingress rule did.
    pub reporter: String,
    /// What decided it.
    pub rule: RuleRef,
    /// Calico's policy-hit string for it.
    pub policy: String,
    /// Logged packets (the first of an allowed connection; every denied one).
    pub packets: u64,
    pub bytes: u64,
    /// Connections counted in this record.
    pub num_flows: u64,
    /// Connections that started and ended in this record's interval (Calico's
    /// numFlowsStarted / numFlowsCompleted).
    #[serde(default)]
    pub num_flows_started: u64,
    #[serde(default)]
    pub num_flows_completed: u64,
    /// Traffic of allowed connections in the interval, from conntrack's counters, seen from
    /// the reporting endpoint (Calico's packetsIn/Out, bytesIn/Out): for `src` "out" is what
    /// the source sent, for `dst` "in" is. Zero where the dataplane has no counters.
    #[serde(default)]
    pub packets_in: u64,
    #[serde(default)]
    pub packets_out: u64,
    #[serde(default)]
    pub bytes_in: u64,
    #[serde(default)]
    pub bytes_out: u64,
    pub node: String,
}

/// Traffic counted for one connection since its last count: what the connection's source
/// sent (`orig`) and what came back (`reply`), packets and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub orig_packets: u64,
    pub orig_bytes: u64,
    pub reply_packets: u64,
    pub reply_bytes: u64,
}

impl Traffic {
    pub fn is_zero(&self) -> bool {
        *self == Traffic::default()
    }

    /// What grew from `before` to `self` (a counter that went down — a new connection
    /// in the same tuple — counts from zero).
    pub fn since(&self, before: &Traffic) -> Traffic {
        let d = |now: u64, then: u64| if now >= then { now - then } else { now };
        Traffic {
            orig_packets: d(self.orig_packets, before.orig_packets),
            orig_bytes: d(self.orig_bytes, before.orig_bytes),
            reply_packets: d(self.reply_packets, before.reply_packets),
            reply_bytes: d(self.reply_bytes, before.reply_bytes),
        }
    }
}

impl FlowRecord {
    pub fn denied(&self) -> bool {
        self.action == Action::Deny
    }

    /// `reporter` for a rule's direction.
    pub fn reporter_for(d: Direction) -> &'static str {
        match d {
            Direction::Ingress => "dst",
            Direction::Egress => "src",
        }
    }
}
