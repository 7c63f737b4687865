//! Flow events: the program writes one event per new flow it judges (`mgy_flows`, a BPF ring
//! buffer) while flow logs are on (`mgy_flow_cfg[0]`); a full buffer drops the event and
//! counts it (`mgy_flow_drops`, per CPU), never the packet.
//!
//! - [`FlowNames`] (pure): what an event's numbers mean — a rule slot is a block (a policy's
//!   or profile's rules for a hook), a deny step of an endpoint hook is a tier's end. Built by
//!   [`crate::sync::Syncer::flow_names`] from what it wrote.
//! - [`FlowReader`] (edge): opens the pinned maps, turns events on while it lives, reads a
//!   bounded number of events per poll.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use aya::maps::{Array, Map, MapData, PerCpuArray, RingBuf};

use crate::compile::BlockKey;
use crate::layout::{EV_FAIL, EV_NO_MATCH, EV_RULE, EV_TIER_END, FlowEvent};

/// What decided a flow, as the syncer's state names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// A rule of a block: its policy or profile (or an endpoint's guards), its index there
    /// and its action (`ACT_*`).
    Rule {
        block: Arc<BlockKey>,
        rule_index: u32,
        action: u8,
    },
    /// A tier's default deny.
    TierEnd { tier: Arc<str> },
    /// Nothing matched up to the end of the list (no profile allowed it).
    NoMatch,
    /// A hole in the maps (torn write) denied it; or an event naming what the syncer does not
    /// know (written before a restart, or retired two syncs ago).
    Unknown,
}

/// Slot and step numbers → names, a snapshot of the syncer's state.
#[derive(Debug, Clone, Default)]
pub struct FlowNames {
    /// Rule slot → its block.
    pub slots: HashMap<u32, Arc<BlockKey>>,
    /// (ifindex, hook, step index) → the tier whose default deny that step is.
    pub deny_steps: HashMap<(u32, u8, u32), Arc<str>>,
    /// The previous snapshot's, for events read just after a change (see `keep_retired`).
    retired_slots: HashMap<u32, Arc<BlockKey>>,
    retired_steps: HashMap<(u32, u8, u32), Arc<str>>,
}

impl FlowNames {
    /// Keeps `prev`'s slots that this snapshot no longer has: the syncer retires a slot one
    /// sync before reusing it, so an event read just after a policy change still names the
    /// policy's old rules correctly.
    /// Only the previous snapshot's own entries are kept (never older ones): bounded.
    pub fn keep_retired(&mut self, prev: &FlowNames) {
        self.retired_slots = prev.slots.clone();
        self.retired_steps = prev.deny_steps.clone();
    }

    pub fn resolve(&self, e: &FlowEvent) -> Decided {
        match e.kind {
            EV_RULE => match self
                .slots
                .get(&e.slot)
                .or_else(|| self.retired_slots.get(&e.slot))
            {
                Some(block) => Decided::Rule {
                    block: block.clone(),
                    rule_index: e.rule_index,
                    action: e.action,
                },
                None => Decided::Unknown,
            },
            EV_TIER_END => self
                .deny_steps
                .get(&(e.ifindex, e.hook, e.step))
                .or_else(|| self.retired_steps.get(&(e.ifindex, e.hook, e.step)))
                .map_or(Decided::Unknown, |t| Decided::TierEnd { tier: t.clone() }),
            EV_NO_MATCH => Decided::NoMatch,
            EV_FAIL => Decided::Unknown,
            _ => Decided::Unknown,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FlowReaderError {
    #[error(
        "cannot open the eBPF flow map {path}: {reason} (is Felix running with BPFEnabled=true \
         in this mount namespace? the maps are pinned by the dataplane driver at start)"
    )]
    Open { path: String, reason: String },
    #[error("cannot switch eBPF flow events {what}: {reason}")]
    Switch { what: &'static str, reason: String },
}

/// Most events one [`FlowReader::poll`] hands out (bounded work per call).
pub const MAX_EVENTS_PER_POLL: usize = 4096;

/// Reads the program's flow events from the pinned ring buffer; events are on while it
/// lives (off again when dropped).
pub struct FlowReader {
    ring: RingBuf<MapData>,
    cfg: Array<MapData, u32>,
    drops: PerCpuArray<MapData, u64>,
    /// Events whose size was not an event's (never expected; counted, not trusted).
    pub malformed: u64,
}

fn open_map(pin_dir: &Path, name: &str) -> Result<Map, FlowReaderError> {
    let path = pin_dir.join(name);
    let bad = |reason: String| FlowReaderError::Open {
        path: path.display().to_string(),
        reason,
    };
    let data = MapData::from_pin(&path).map_err(|e| bad(e.to_string()))?;
    Map::from_map_data(data).map_err(|e| bad(e.to_string()))
}

impl FlowReader {
    /// Opens `<pin_dir>/mgy_flows`, `mgy_flow_cfg`, `mgy_flow_drops` and turns events on.
    pub fn open(pin_dir: &Path) -> Result<FlowReader, FlowReaderError> {
        Self::open_with(pin_dir, true)
    }

    /// [`FlowReader::open`]; `enable` false leaves the switch as it is (to look at what is
    /// queued; dropping the reader still turns events off).
    pub fn open_with(pin_dir: &Path, enable: bool) -> Result<FlowReader, FlowReaderError> {
        let bad = |name: &str, reason: String| FlowReaderError::Open {
            path: pin_dir.join(name).display().to_string(),
            reason,
        };
        let ring = RingBuf::try_from(open_map(pin_dir, "mgy_flows")?)
            .map_err(|e| bad("mgy_flows", e.to_string()))?;
        let cfg = Array::try_from(open_map(pin_dir, "mgy_flow_cfg")?)
            .map_err(|e| bad("mgy_flow_cfg", e.to_string()))?;
        let drops = PerCpuArray::try_from(open_map(pin_dir, "mgy_flow_drops")?)
            .map_err(|e| bad("mgy_flow_drops", e.to_string()))?;
        let mut r = FlowReader {
            ring,
            cfg,
            drops,
            malformed: 0,
        };
        if enable {
            r.set_enabled(true)?;
        }
        Ok(r)
    }

    /// Turns the program's events on or off (it reads the flag once per new flow).
    pub fn set_enabled(&mut self, on: bool) -> Result<(), FlowReaderError> {
        self.cfg
            .set(0, u32::from(on), 0)
            .map_err(|e| FlowReaderError::Switch {
                what: if on { "on" } else { "off" },
                reason: e.to_string(),
            })
    }

    /// Events dropped because the ring buffer was full, summed over CPUs.
    pub fn drops(&self) -> u64 {
        self.drops
            .get(&0, 0)
            .map(|v| v.iter().fold(0u64, |a, b| a.saturating_add(*b)))
            .unwrap_or(0)
    }

    /// Waits up to `timeout` for events, then hands out at most `max` of them (and at most
    /// [`MAX_EVENTS_PER_POLL`]). Returns how many.
    pub fn poll(&mut self, timeout: Duration, max: usize, mut f: impl FnMut(FlowEvent)) -> usize {
        let max = max.min(MAX_EVENTS_PER_POLL);
        let mut n = self.drain(max, &mut f);
        if n == 0 {
            let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
            let mut fds = [nix::poll::PollFd::new(
                self.ring.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            // An error (EINTR) only shortens the wait.
            let _ = nix::poll::poll(&mut fds, ms);
            n = self.drain(max, &mut f);
        }
        n
    }

    fn drain(&mut self, max: usize, f: &mut impl FnMut(FlowEvent)) -> usize {
        let mut n = 0;
        while n < max {
            let Some(item) = self.ring.next() else {
                break;
            };
            match FlowEvent::decode(&item) {
                Some(e) => {
                    n += 1;
                    drop(item);
                    f(e);
                }
                None => self.malformed += 1,
            }
        }
        n
    }
}

impl Drop for FlowReader {
    fn drop(&mut self) {
        if let Err(e) = self.set_enabled(false) {
            tracing::warn!("{e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{ACT_ALLOW, ACT_DENY, HOOK_TO_WL};
    use std::net::Ipv4Addr;

    fn event(kind: u8) -> FlowEvent {
        FlowEvent {
            ts_ns: 1,
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            sport: 1,
            dport: 2,
            proto: 6,
            hook: HOOK_TO_WL as u8,
            kind,
            action: ACT_DENY,
            ifindex: 5,
            slot: 9,
            idx: 0,
            rule_index: 3,
            step: 2,
            len: 60,
            icmp_type: 0,
            icmp_code: 0,
        }
    }

    #[test]
    fn events_resolve_to_blocks_tiers_or_unknown() {
        let key = Arc::new(BlockKey::Profile("kns.a".into(), HOOK_TO_WL));
        let mut names = FlowNames::default();
        names.slots.insert(9, key.clone());
        names
            .deny_steps
            .insert((5, HOOK_TO_WL as u8, 2), Arc::from("default"));
        assert_eq!(
            names.resolve(&event(EV_RULE)),
            Decided::Rule {
                block: key.clone(),
                rule_index: 3,
                action: ACT_DENY
            }
        );
        assert_eq!(
            names.resolve(&event(EV_TIER_END)),
            Decided::TierEnd {
                tier: Arc::from("default")
            }
        );
        assert_eq!(names.resolve(&event(EV_NO_MATCH)), Decided::NoMatch);
        assert_eq!(names.resolve(&event(EV_FAIL)), Decided::Unknown);
        assert_eq!(names.resolve(&event(77)), Decided::Unknown);
        let mut other = event(EV_RULE);
        other.slot = 10;
        assert_eq!(names.resolve(&other), Decided::Unknown);
        // A retired slot stays known for one more snapshot.
        let mut next = FlowNames::default();
        let newer = Arc::new(BlockKey::Profile("kns.b".into(), HOOK_TO_WL));
        next.slots.insert(11, newer);
        next.keep_retired(&names);
        let mut e = event(EV_RULE);
        e.action = ACT_ALLOW;
        assert!(matches!(next.resolve(&e), Decided::Rule { .. }));
        // …but not for two.
        let mut third = FlowNames::default();
        third.keep_retired(&next);
        assert_eq!(third.resolve(&e), Decided::Unknown);
    }
}
