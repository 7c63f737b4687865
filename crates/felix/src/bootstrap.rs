//! Start-up timing (an idea from Cilium's agent): every phase of start-up is timed, logged in
//! one line once Felix is ready, exported as `felix_bootstrap_phase_seconds{phase}` and shown
//! by the status API, so a slow start explains itself.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The phases, in the order they complete.
pub const PHASES: &[&str] = &[
    "config_load",
    "datastore_connect",
    "datastore_config",
    "dataplane_start",
    "first_in_sync",
    "first_apply",
    "ready",
];

/// One completed phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseTiming {
    pub phase: String,
    /// How long the phase took (from the end of the previous one).
    pub seconds: f64,
    /// When it completed, in seconds after start.
    pub at_seconds: f64,
}

/// The phases completed so far.
#[derive(Debug, Clone)]
pub struct Bootstrap {
    start: Instant,
    last: Instant,
    phases: Vec<PhaseTiming>,
}

impl Bootstrap {
    pub fn new(start: Instant) -> Self {
        Bootstrap {
            start,
            last: start,
            phases: Vec::new(),
        }
    }

    pub fn start(&self) -> Instant {
        self.start
    }

    /// Records that `phase` completed at `now` (a phase completes once; later calls are
    /// ignored). Returns the timing when it was recorded.
    pub fn mark(&mut self, phase: &str, now: Instant) -> Option<PhaseTiming> {
        if self.phases.iter().any(|p| p.phase == phase) {
            return None;
        }
        let now = now.max(self.last);
        let t = PhaseTiming {
            phase: phase.to_string(),
            seconds: now.duration_since(self.last).as_secs_f64(),
            at_seconds: now.duration_since(self.start).as_secs_f64(),
        };
        self.last = now;
        self.phases.push(t.clone());
        Some(t)
    }

    pub fn phases(&self) -> &[PhaseTiming] {
        &self.phases
    }

    /// Seconds from start to ready, once ready.
    pub fn ready_after(&self) -> Option<f64> {
        self.phases
            .iter()
            .find(|p| p.phase == "ready")
            .map(|p| p.at_seconds)
    }

    /// The one-line summary logged when Felix becomes ready.
    pub fn summary_line(&self) -> String {
        let parts: Vec<String> = self
            .phases
            .iter()
            .map(|p| format!("{}={:.1}ms", p.phase, p.seconds * 1000.0))
            .collect();
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    #[test]
    fn phases_take_the_time_since_the_previous_one() {
        let t0 = Instant::now();
        let mut b = Bootstrap::new(t0);
        b.mark("config_load", t0 + Duration::from_millis(5))
            .unwrap();
        b.mark("datastore_connect", t0 + Duration::from_millis(12))
            .unwrap();
        assert!(
            b.mark("config_load", t0 + Duration::from_millis(20))
                .is_none()
        );
        b.mark("ready", t0 + Duration::from_millis(40)).unwrap();
        let p = b.phases();
        assert_eq!(p.len(), 3);
        assert!((p[1].seconds - 0.007).abs() < 1e-9);
        assert!((p[1].at_seconds - 0.012).abs() < 1e-9);
        assert!((b.ready_after().unwrap() - 0.040).abs() < 1e-9);
        assert_eq!(
            b.summary_line(),
            "config_load=5.0ms datastore_connect=7.0ms ready=28.0ms"
        );
    }
}
