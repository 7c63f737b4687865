//! Felix's health aggregator, with Calico's semantics (libcalico-go `health`).
//!
//! Components ("reporters") register the qualities they report (live, ready) and a timeout.
//! A reporter fails a quality when its latest report said so, or when it has not reported
//! for longer than its timeout (0 = never stale; `HealthTimeoutOverrides` replaces a
//! reporter's timeout by name, live). Overall live = every live reporter is live; overall
//! ready likewise; with no reporters Felix is both. `/liveness` and `/readiness` answer 200
//! with the detail table when good and 503 when bad (204 when good without detail, which with
//! a table never happens — Calico's rule, kept).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Felix's start-up reporter (live and ready, no timeout).
pub const FELIX_STARTUP: &str = "FelixStartup";
/// The calculation graph's reporter (live and ready, 30 s).
pub const CALCULATION_GRAPH: &str = "CalculationGraph";
/// The calculation graph's timeout, as Calico's.
pub const CALC_GRAPH_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a quiet calculation graph still reports (Calico: 10 s).
pub const CALC_GRAPH_HEALTH_INTERVAL: Duration = Duration::from_secs(10);
/// The internal dataplane driver's reporter (live and ready, DataplaneWatchdogTimeout).
pub const INTERNAL_DATAPLANE: &str = "InternalDataplaneMainLoop";

/// HTTP status for good with detail (Kubernetes takes 200..400 as good).
pub const STATUS_GOOD: u16 = 200;
/// HTTP status for good without detail.
pub const STATUS_GOOD_NO_CONTENT: u16 = 204;
/// HTTP status for bad.
pub const STATUS_BAD: u16 = 503;

/// Where the aggregator gets the time (tests inject a manual clock).
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
}

/// The real monotonic clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that only moves when told to (for tests).
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Instant>,
}

impl ManualClock {
    pub fn new() -> Self {
        ManualClock {
            now: Mutex::new(Instant::now()),
        }
    }

    pub fn advance(&self, d: Duration) {
        let mut n = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *n += d;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Debug, Clone)]
struct Reporter {
    reports_live: bool,
    reports_ready: bool,
    timeout: Duration,
    live: bool,
    ready: bool,
    detail: String,
    timestamp: Instant,
}

impl Reporter {
    fn timeout(&self, name: &str, overrides: &BTreeMap<String, Duration>) -> (Duration, bool) {
        match overrides.get(name) {
            Some(d) => (*d, true),
            None => (self.timeout, false),
        }
    }

    fn timed_out(&self, name: &str, overrides: &BTreeMap<String, Duration>, now: Instant) -> bool {
        let (t, _) = self.timeout(name, overrides);
        !t.is_zero() && now.saturating_duration_since(self.timestamp) > t
    }

    /// (good, why) for liveness, as Calico words it.
    fn liveness(
        &self,
        name: &str,
        o: &BTreeMap<String, Duration>,
        now: Instant,
    ) -> (bool, &'static str) {
        if !self.reports_live {
            (true, "-")
        } else if self.timed_out(name, o, now) {
            (false, "timed out")
        } else if self.live {
            (true, "reporting live")
        } else {
            (false, "reporting non-live")
        }
    }

    fn readiness(
        &self,
        name: &str,
        o: &BTreeMap<String, Duration>,
        now: Instant,
    ) -> (bool, &'static str) {
        if !self.reports_ready {
            (true, "-")
        } else if self.timed_out(name, o, now) {
            (false, "timed out")
        } else if self.ready {
            (true, "reporting ready")
        } else {
            (false, "reporting non-ready")
        }
    }
}

/// One reporter's line in the summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentHealth {
    pub name: String,
    /// Go duration syntax (`30s`, `1m30s`), `-` for none; ` (override)` when overridden.
    pub timeout: String,
    pub liveness: String,
    pub readiness: String,
    pub detail: String,
}

/// The overall health and every reporter's part in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthSummary {
    pub live: bool,
    pub ready: bool,
    pub components: Vec<ComponentHealth>,
}

impl HealthSummary {
    /// The detail table Calico's endpoints return (go-pretty's default style).
    pub fn table(&self) -> String {
        let header = ["COMPONENT", "TIMEOUT", "LIVENESS", "READINESS", "DETAIL"];
        let rows: Vec<[&str; 5]> = self
            .components
            .iter()
            .map(|c| {
                [
                    c.name.as_str(),
                    c.timeout.as_str(),
                    c.liveness.as_str(),
                    c.readiness.as_str(),
                    c.detail.as_str(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for r in &rows {
            for (w, cell) in widths.iter_mut().zip(r) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let rule = {
            let mut s = String::from("+");
            for w in widths {
                s.push_str(&"-".repeat(w + 2));
                s.push('+');
            }
            s
        };
        let line = |cells: &[&str; 5]| {
            let mut s = String::from("|");
            for (w, cell) in widths.iter().zip(cells) {
                let _ = write!(s, " {cell:<w$} |");
            }
            s
        };
        let mut out = String::new();
        let _ = writeln!(out, "{rule}");
        let _ = writeln!(out, "{}", line(&header));
        let _ = writeln!(out, "{rule}");
        for r in &rows {
            let _ = writeln!(out, "{}", line(r));
        }
        out.push_str(&rule);
        out
    }

    /// The HTTP answer for one quality: (status, body).
    pub fn response(&self, ready_not_live: bool) -> (u16, String) {
        let good = if ready_not_live {
            self.ready
        } else {
            self.live
        };
        let detail = self.table();
        let status = match (good, detail.is_empty()) {
            (false, _) => STATUS_BAD,
            (true, false) => STATUS_GOOD,
            (true, true) => STATUS_GOOD_NO_CONTENT,
        };
        (status, detail)
    }
}

#[derive(Default)]
struct Inner {
    reporters: BTreeMap<String, Reporter>,
    overrides: BTreeMap<String, Duration>,
    last: Option<(bool, bool)>,
    first_ready: Option<Instant>,
}

/// See the module documentation. Cheap to share (`Arc` inside).
#[derive(Clone)]
pub struct HealthAggregator {
    inner: Arc<Mutex<Inner>>,
    clock: Arc<dyn Clock>,
    ready_tx: Arc<tokio::sync::watch::Sender<bool>>,
}

impl HealthAggregator {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        let (ready_tx, _) = tokio::sync::watch::channel(false);
        HealthAggregator {
            inner: Arc::new(Mutex::new(Inner::default())),
            clock,
            ready_tx: Arc::new(ready_tx),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a reporter (again: replaces it). Its first state is live, not ready, as of now.
    pub fn register(&self, name: &str, live: bool, ready: bool, timeout: Duration) {
        let now = self.clock.now();
        let mut inner = self.lock();
        inner.reporters.insert(
            name.to_string(),
            Reporter {
                reports_live: live,
                reports_ready: ready,
                timeout,
                live: true,
                ready: false,
                detail: String::new(),
                timestamp: now,
            },
        );
        self.after_change(&mut inner, now);
    }

    /// A reporter's current state (refreshes its timestamp).
    pub fn report(&self, name: &str, live: bool, ready: bool) {
        self.report_detail(name, live, ready, "");
    }

    pub fn report_detail(&self, name: &str, live: bool, ready: bool, detail: &str) {
        let now = self.clock.now();
        let mut inner = self.lock();
        let Some(r) = inner.reporters.get_mut(name) else {
            tracing::warn!(
                reporter = name,
                "health report from an unregistered reporter ignored"
            );
            return;
        };
        if r.live != live || r.ready != ready || r.detail != detail {
            let describe = |live: bool, ready: bool| {
                let mut parts = Vec::new();
                if r.reports_live {
                    parts.push(if live { "live" } else { "non-live" });
                }
                if r.reports_ready {
                    parts.push(if ready { "ready" } else { "non-ready" });
                }
                parts.join(",")
            };
            tracing::info!(
                name,
                old = %describe(r.live, r.ready),
                new = %describe(live, ready),
                "Health of component changed"
            );
            r.live = live;
            r.ready = ready;
            r.detail = detail.to_string();
        }
        r.timestamp = now;
        self.after_change(&mut inner, now);
    }

    /// Replaces the timeout overrides (`HealthTimeoutOverrides`; applied live).
    pub fn set_overrides(&self, overrides: BTreeMap<String, Duration>) {
        let now = self.clock.now();
        let mut inner = self.lock();
        if inner.overrides != overrides {
            tracing::info!(?overrides, "health timeout overrides changed");
            inner.overrides = overrides;
        }
        self.after_change(&mut inner, now);
    }

    fn overall(inner: &Inner, now: Instant) -> (bool, bool) {
        let mut live = true;
        let mut ready = true;
        for (name, r) in &inner.reporters {
            live &= r.liveness(name, &inner.overrides, now).0;
            ready &= r.readiness(name, &inner.overrides, now).0;
        }
        (live, ready)
    }

    fn after_change(&self, inner: &mut Inner, now: Instant) {
        let state = Self::overall(inner, now);
        if inner.last != Some(state) {
            tracing::info!(
                live = state.0,
                ready = state.1,
                "Overall health status changed"
            );
            inner.last = Some(state);
        }
        if state.1 && inner.first_ready.is_none() {
            inner.first_ready = Some(now);
        }
        self.ready_tx.send_replace(state.1);
    }

    /// The overall state and each reporter's part, as of now.
    pub fn summary(&self) -> HealthSummary {
        let now = self.clock.now();
        let inner = self.lock();
        let (live, ready) = Self::overall(&inner, now);
        let components = inner
            .reporters
            .iter()
            .map(|(name, r)| {
                let (t, overridden) = r.timeout(name, &inner.overrides);
                let mut timeout = if t.is_zero() {
                    "-".to_string()
                } else {
                    margay_felix_config::format_go_duration(
                        i64::try_from(t.as_nanos()).unwrap_or(i64::MAX),
                    )
                };
                if overridden {
                    timeout.push_str(" (override)");
                }
                ComponentHealth {
                    name: name.clone(),
                    timeout,
                    liveness: r.liveness(name, &inner.overrides, now).1.to_string(),
                    readiness: r.readiness(name, &inner.overrides, now).1.to_string(),
                    detail: r.detail.clone(),
                }
            })
            .collect();
        HealthSummary {
            live,
            ready,
            components,
        }
    }

    /// When Felix was first ready overall, if it has been.
    pub fn first_ready(&self) -> Option<Instant> {
        self.lock().first_ready
    }

    /// Follows overall readiness as reports arrive (timeouts are noticed at the next report or
    /// summary, not pushed).
    pub fn watch_ready(&self) -> tokio::sync::watch::Receiver<bool> {
        self.ready_tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn agg() -> (HealthAggregator, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new());
        (HealthAggregator::new(clock.clone()), clock)
    }

    #[test]
    fn no_reporters_is_live_and_ready() {
        let (a, _) = agg();
        let s = a.summary();
        assert!(s.live && s.ready);
        assert!(s.components.is_empty());
    }

    #[test]
    fn registered_reporter_starts_live_not_ready() {
        let (a, _) = agg();
        a.register(FELIX_STARTUP, true, true, Duration::ZERO);
        let s = a.summary();
        assert!(s.live);
        assert!(!s.ready);
        assert_eq!(s.components[0].readiness, "reporting non-ready");
        a.report(FELIX_STARTUP, true, true);
        assert!(a.summary().ready);
        assert!(a.first_ready().is_some());
    }

    #[test]
    fn every_reporter_of_a_quality_must_agree() {
        let (a, _) = agg();
        a.register("A", true, true, Duration::ZERO);
        a.register("LiveOnly", true, false, Duration::ZERO);
        a.report("A", true, true);
        // A live-only reporter does not take part in readiness.
        a.report("LiveOnly", true, false);
        let s = a.summary();
        assert!(s.live && s.ready);
        let lo = s.components.iter().find(|c| c.name == "LiveOnly").unwrap();
        assert_eq!(lo.readiness, "-");
        a.report("LiveOnly", false, false);
        let s = a.summary();
        assert!(!s.live && s.ready);
    }

    #[test]
    fn reports_go_stale_after_the_timeout() {
        let (a, clock) = agg();
        a.register(CALCULATION_GRAPH, true, true, CALC_GRAPH_TIMEOUT);
        a.report(CALCULATION_GRAPH, true, true);
        clock.advance(Duration::from_secs(30));
        // Exactly the timeout is not yet stale (Calico: strictly greater).
        assert!(a.summary().live);
        clock.advance(Duration::from_millis(1));
        let s = a.summary();
        assert!(!s.live && !s.ready);
        assert_eq!(s.components[0].liveness, "timed out");
        assert_eq!(s.components[0].timeout, "30s");
        // A new report brings it back.
        a.report(CALCULATION_GRAPH, true, true);
        assert!(a.summary().ready);
    }

    #[test]
    fn zero_timeout_never_goes_stale() {
        let (a, clock) = agg();
        a.register(FELIX_STARTUP, true, true, Duration::ZERO);
        a.report(FELIX_STARTUP, true, true);
        clock.advance(Duration::from_secs(86_400));
        assert!(a.summary().ready);
        assert_eq!(a.summary().components[0].timeout, "-");
    }

    #[test]
    fn overrides_replace_timeouts_by_name_live() {
        let (a, clock) = agg();
        a.register(INTERNAL_DATAPLANE, true, true, Duration::from_secs(90));
        a.register(FELIX_STARTUP, true, true, Duration::ZERO);
        a.report(INTERNAL_DATAPLANE, true, true);
        a.report(FELIX_STARTUP, true, true);
        clock.advance(Duration::from_secs(20));
        assert!(a.summary().live);
        a.set_overrides(BTreeMap::from([
            (INTERNAL_DATAPLANE.to_string(), Duration::from_secs(10)),
            // An override can also give a timeout to a reporter that had none.
            (FELIX_STARTUP.to_string(), Duration::from_secs(90)),
        ]));
        let s = a.summary();
        assert!(!s.live);
        let dp = s
            .components
            .iter()
            .find(|c| c.name == INTERNAL_DATAPLANE)
            .unwrap();
        assert_eq!(dp.timeout, "10s (override)");
        assert_eq!(dp.liveness, "timed out");
        let st = s
            .components
            .iter()
            .find(|c| c.name == FELIX_STARTUP)
            .unwrap();
        assert_eq!(st.timeout, "1m30s (override)");
        assert_eq!(st.liveness, "reporting live");
        a.set_overrides(BTreeMap::new());
        assert!(a.summary().live);
    }

    #[test]
    fn http_answers_follow_calico() {
        let (a, _) = agg();
        a.register(CALCULATION_GRAPH, true, true, CALC_GRAPH_TIMEOUT);
        a.report(CALCULATION_GRAPH, true, false);
        let s = a.summary();
        let (code, body) = s.response(true);
        assert_eq!(code, STATUS_BAD);
        assert!(
            body.contains(
                "| CalculationGraph | 30s     | reporting live | reporting non-ready |        |"
            ),
            "{body}"
        );
        assert_eq!(s.response(false).0, STATUS_GOOD);
        let lines: Vec<&str> = body.lines().collect();
        assert_eq!(lines.len(), 5);
        assert!(lines[0].starts_with("+---") && lines[0] == lines[2] && lines[0] == lines[4]);
        assert!(lines[1].starts_with("| COMPONENT        | TIMEOUT |"));
    }

    #[test]
    fn readiness_is_watchable() {
        let (a, _) = agg();
        let rx = a.watch_ready();
        a.register(FELIX_STARTUP, true, true, Duration::ZERO);
        assert!(!*rx.borrow());
        a.report(FELIX_STARTUP, true, true);
        assert!(*rx.borrow());
    }
}
