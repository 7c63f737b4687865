//! Felix's Prometheus metrics, with Felix's established names, rendered by hand in the text
//! exposition format (version 0.0.4).
//!
//! Summaries keep their count and sum over the whole run and estimate the 0.5/0.9/0.99
//! quantiles over the most recent observations (a sliding window), as Calico's summaries
//! report recent quantiles.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use margay_calc::CalcCounts;

/// How many recent observations the summaries' quantiles are computed from.
const WINDOW: usize = 1024;
const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// A float gauge.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    pub fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// A monotonic counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A counter with one label.
#[derive(Debug, Default)]
pub struct LabelledCounter(Mutex<BTreeMap<String, u64>>);

impl LabelledCounter {
    pub fn add(&self, label: &str, n: u64) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match m.get_mut(label) {
            Some(v) => *v += n,
            None => {
                m.insert(label.to_string(), n);
            }
        }
    }
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn total(&self) -> u64 {
        self.snapshot().values().sum()
    }
}

#[derive(Debug, Default)]
struct SummaryState {
    count: u64,
    sum: f64,
    window: VecDeque<f64>,
}

/// A Prometheus summary (see the module documentation).
#[derive(Debug, Default)]
pub struct Summary(Mutex<SummaryState>);

impl Summary {
    pub fn observe(&self, v: f64) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.count += 1;
        s.sum += v;
        if s.window.len() == WINDOW {
            s.window.pop_front();
        }
        s.window.push_back(v);
    }

    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    /// (count, sum, quantiles over the window; NaN when empty).
    pub fn snapshot(&self) -> (u64, f64, [f64; 3]) {
        let s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut sorted: Vec<f64> = s.window.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        let q = QUANTILES.map(|q| {
            if sorted.is_empty() {
                f64::NAN
            } else {
                // Nearest rank.
                let rank = (q * sorted.len() as f64).ceil() as usize;
                sorted[rank.clamp(1, sorted.len()) - 1]
            }
        });
        (s.count, s.sum, q)
    }
}

/// Every metric Felix exports.
#[derive(Debug)]
pub struct Metrics {
    pub hostname: String,
    pub ipv6: bool,
    pub start: SystemTime,
    // Calculation graph (felix/calc).
    pub calc_update_time: Summary,
    pub calc_updates_processed: LabelledCounter,
    pub calc_output_events: Counter,
    pub resync_state: Gauge,
    pub resyncs_started: Counter,
    pub active_local_endpoints: Gauge,
    pub active_local_policies: Gauge,
    pub active_local_selectors: Gauge,
    pub ipsets: Gauge,
    pub cluster_hosts: Gauge,
    pub cluster_workload_endpoints: Gauge,
    pub cluster_policies: Gauge,
    pub cluster_profiles: Gauge,
    // Dataplane.
    pub dataplane_apply_time: Summary,
    pub dataplane_messages: LabelledCounter,
    pub dataplane_failures: Counter,
    pub dataplane_initial_resync_time: Gauge,
    // margay's own.
    pub invalid_resources: LabelledCounter,
    pub bootstrap_phases: Mutex<Vec<(String, f64)>>,
    /// PrometheusProcessMetricsEnabled: also export the process's own metrics.
    pub process_metrics: std::sync::atomic::AtomicBool,
}

impl Metrics {
    pub fn new(hostname: &str, ipv6: bool) -> Metrics {
        Metrics {
            hostname: hostname.to_string(),
            ipv6,
            start: SystemTime::now(),
            calc_update_time: Summary::default(),
            calc_updates_processed: LabelledCounter::default(),
            calc_output_events: Counter::default(),
            resync_state: Gauge::default(),
            resyncs_started: Counter::default(),
            active_local_endpoints: Gauge::default(),
            active_local_policies: Gauge::default(),
            active_local_selectors: Gauge::default(),
            ipsets: Gauge::default(),
            cluster_hosts: Gauge::default(),
            cluster_workload_endpoints: Gauge::default(),
            cluster_policies: Gauge::default(),
            cluster_profiles: Gauge::default(),
            dataplane_apply_time: Summary::default(),
            dataplane_messages: LabelledCounter::default(),
            dataplane_failures: Counter::default(),
            dataplane_initial_resync_time: Gauge::default(),
            invalid_resources: LabelledCounter::default(),
            bootstrap_phases: Mutex::new(Vec::new()),
            process_metrics: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Updates the gauges that mirror the calculation graph's counts.
    pub fn set_counts(&self, c: &CalcCounts) {
        self.active_local_endpoints.set(c.local_endpoints as f64);
        self.active_local_policies.set(c.active_policies as f64);
        self.active_local_selectors.set(c.selectors as f64);
        self.ipsets.set(c.active_ip_sets as f64);
        self.cluster_hosts.set(c.hosts as f64);
        self.cluster_workload_endpoints
            .set(c.workload_endpoints as f64);
        self.cluster_policies.set(c.policies as f64);
        self.cluster_profiles.set(c.profiles as f64);
    }

    pub fn set_bootstrap_phase(&self, phase: &str, seconds: f64) {
        let mut p = self
            .bootstrap_phases
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match p.iter_mut().find(|(n, _)| n == phase) {
            Some(e) => e.1 = seconds,
            None => p.push((phase.to_string(), seconds)),
        }
    }

    /// The text exposition of every metric (and the process's own, from /proc).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        let w = &mut out;
        gauge(
            w,
            "felix_host",
            "Configured Felix hostname (as a label), typically used in grouping/aggregating stats; the value is always 1.",
            &[(format!("host=\"{}\"", escape(&self.hostname)), 1.0)],
        );
        summary(
            w,
            "felix_calc_graph_update_time_seconds",
            "Seconds to update calculation graph for each datastore OnUpdate call.",
            &self.calc_update_time,
        );
        counter_labelled(
            w,
            "felix_calc_graph_updates_processed",
            "Number of datastore updates processed by the calculation graph.",
            "type",
            &self.calc_updates_processed.snapshot(),
        );
        counter(
            w,
            "felix_calc_graph_output_events",
            "Number of events emitted by the calculation graph.",
            self.calc_output_events.get(),
        );
        gauge1(
            w,
            "felix_resync_state",
            "Current datastore state.",
            self.resync_state.get(),
        );
        counter(
            w,
            "felix_resyncs_started",
            "Number of times Felix started resyncing with the datastore.",
            self.resyncs_started.get(),
        );
        gauge1(
            w,
            "felix_active_local_endpoints",
            "Number of active endpoints on this host.",
            self.active_local_endpoints.get(),
        );
        gauge1(
            w,
            "felix_active_local_policies",
            "Number of active policies on this host.",
            self.active_local_policies.get(),
        );
        gauge1(
            w,
            "felix_active_local_selectors",
            "Number of active selectors on this host.",
            self.active_local_selectors.get(),
        );
        let sets = self.ipsets.get();
        let mut per_version = vec![("ip_version=\"4\"".to_string(), sets)];
        if self.ipv6 {
            per_version.push(("ip_version=\"6\"".to_string(), sets));
        }
        gauge(
            w,
            "felix_ipsets_calico",
            "Number of active Calico IP sets.",
            &per_version,
        );
        gauge1(
            w,
            "felix_cluster_num_hosts",
            "Total number of calico hosts in the cluster.",
            self.cluster_hosts.get(),
        );
        gauge1(
            w,
            "felix_cluster_num_workload_endpoints",
            "Total number of workload endpoints cluster-wide.",
            self.cluster_workload_endpoints.get(),
        );
        gauge1(
            w,
            "felix_cluster_num_policies",
            "Total number of policies cluster-wide.",
            self.cluster_policies.get(),
        );
        gauge1(
            w,
            "felix_cluster_num_profiles",
            "Total number of profiles cluster-wide.",
            self.cluster_profiles.get(),
        );
        summary(
            w,
            "felix_int_dataplane_apply_time_seconds",
            "Time in seconds for each incremental update to the dataplane (after the initial resync).",
            &self.dataplane_apply_time,
        );
        counter_labelled(
            w,
            "felix_int_dataplane_messages",
            "Number dataplane messages by type.",
            "type",
            &self.dataplane_messages.snapshot(),
        );
        counter(
            w,
            "felix_int_dataplane_failures",
            "Number of times dataplane updates failed and will be retried.",
            self.dataplane_failures.get(),
        );
        gauge1(
            w,
            "felix_int_dataplane_initial_resync_time_seconds",
            "Time in seconds that it took to do the initial resync with the dataplane and bring the dataplane into sync for the first time.",
            self.dataplane_initial_resync_time.get(),
        );
        counter_labelled(
            w,
            "felix_invalid_resources",
            "Datastore updates whose value failed validation and were treated as deletions, by kind (margay).",
            "kind",
            &self.invalid_resources.snapshot(),
        );
        let phases: Vec<(String, f64)> = self
            .bootstrap_phases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(p, s)| (format!("phase=\"{}\"", escape(p)), *s))
            .collect();
        gauge(
            w,
            "felix_bootstrap_phase_seconds",
            "Seconds each start-up phase took, in the order they ran (margay).",
            &phases,
        );
        if self
            .process_metrics
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            self.render_process(w);
        }
        out
    }

    fn render_process(&self, w: &mut String) {
        if let Ok(start) = self.start.duration_since(UNIX_EPOCH) {
            gauge1(
                w,
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                start.as_secs_f64(),
            );
        }
        if let Some(kb) = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            })
        {
            gauge1(
                w,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                kb * 1024.0,
            );
        }
        if let Some(ticks) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| {
                // Fields after the command name (which may contain spaces) start at field 3.
                let rest = s.rsplit_once(')')?.1;
                let f: Vec<&str> = rest.split_whitespace().collect();
                let utime: f64 = f.get(11)?.parse().ok()?;
                let stime: f64 = f.get(12)?.parse().ok()?;
                Some(utime + stime)
            })
        {
            // USER_HZ is 100 on every Linux platform margay runs on.
            let _ = writeln!(
                w,
                "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {}",
                fmt_f64(ticks / 100.0)
            );
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            gauge1(
                w,
                "process_open_fds",
                "Number of open file descriptors.",
                fds.count() as f64,
            );
        }
    }
}

/// Prometheus float syntax.
fn fmt_f64(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else {
        format!("{v}")
    }
}

/// Escapes a label value.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn header(w: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(w, "# HELP {name} {help}");
    let _ = writeln!(w, "# TYPE {name} {kind}");
}

fn gauge1(w: &mut String, name: &str, help: &str, v: f64) {
    header(w, name, help, "gauge");
    let _ = writeln!(w, "{name} {}", fmt_f64(v));
}

fn gauge(w: &mut String, name: &str, help: &str, values: &[(String, f64)]) {
    header(w, name, help, "gauge");
    for (labels, v) in values {
        let _ = writeln!(w, "{name}{{{labels}}} {}", fmt_f64(*v));
    }
}

fn counter(w: &mut String, name: &str, help: &str, v: u64) {
    header(w, name, help, "counter");
    let _ = writeln!(w, "{name} {v}");
}

fn counter_labelled(
    w: &mut String,
    name: &str,
    help: &str,
    label: &str,
    values: &BTreeMap<String, u64>,
) {
    header(w, name, help, "counter");
    for (l, v) in values {
        let _ = writeln!(w, "{name}{{{label}=\"{}\"}} {v}", escape(l));
    }
}

fn summary(w: &mut String, name: &str, help: &str, s: &Summary) {
    header(w, name, help, "summary");
    let (count, sum, q) = s.snapshot();
    for (quantile, v) in QUANTILES.iter().zip(q) {
        let _ = writeln!(w, "{name}{{quantile=\"{quantile}\"}} {}", fmt_f64(v));
    }
    let _ = writeln!(w, "{name}_sum {}", fmt_f64(sum));
    let _ = writeln!(w, "{name}_count {count}");
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Every sample line parses as `name{labels} value` and every family has HELP and TYPE.
    fn check_exposition(text: &str) {
        let mut typed = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut p = rest.split(' ');
                let name = p.next().unwrap();
                let kind = p.next().unwrap();
                assert!(["gauge", "counter", "summary"].contains(&kind), "{line}");
                assert!(typed.insert(name.to_string()), "family {name} typed twice");
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            assert!(
                value == "NaN" || value.parse::<f64>().is_ok(),
                "bad value in {line:?}"
            );
            let name = series.split('{').next().unwrap();
            let family = name
                .strip_suffix("_sum")
                .or_else(|| name.strip_suffix("_count"))
                .filter(|f| typed.contains(*f))
                .unwrap_or(name);
            assert!(typed.contains(family), "sample before its TYPE: {line}");
            assert!(
                name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{line}"
            );
        }
    }

    #[test]
    fn renders_felix_names_in_text_format() {
        let m = Metrics::new("host\"1", true);
        m.calc_update_time.observe(0.002);
        m.calc_updates_processed.add("WorkloadEndpoint", 3);
        m.calc_updates_processed.add("GlobalNetworkPolicy", 1);
        m.calc_output_events.add(7);
        m.resync_state.set(3.0);
        m.set_counts(&CalcCounts {
            local_endpoints: 2,
            active_policies: 1,
            selectors: 4,
            active_ip_sets: 5,
            hosts: 3,
            workload_endpoints: 9,
            policies: 6,
            ..CalcCounts::default()
        });
        m.invalid_resources.add("NetworkPolicy", 1);
        m.set_bootstrap_phase("config_load", 0.25);
        m.set_bootstrap_phase("config_load", 0.5);
        let text = m.render();
        check_exposition(&text);
        for want in [
            "felix_host{host=\"host\\\"1\"} 1\n",
            "felix_calc_graph_update_time_seconds{quantile=\"0.5\"} 0.002\n",
            "felix_calc_graph_update_time_seconds_count 1\n",
            "felix_calc_graph_updates_processed{type=\"WorkloadEndpoint\"} 3\n",
            "felix_calc_graph_output_events 7\n",
            "felix_resync_state 3\n",
            "felix_active_local_endpoints 2\n",
            "felix_active_local_policies 1\n",
            "felix_active_local_selectors 4\n",
            "felix_ipsets_calico{ip_version=\"4\"} 5\n",
            "felix_ipsets_calico{ip_version=\"6\"} 5\n",
            "felix_cluster_num_hosts 3\n",
            "felix_cluster_num_workload_endpoints 9\n",
            "felix_cluster_num_policies 6\n",
            "felix_int_dataplane_apply_time_seconds{quantile=\"0.99\"} NaN\n",
            "felix_int_dataplane_apply_time_seconds_count 0\n",
            "felix_invalid_resources{kind=\"NetworkPolicy\"} 1\n",
            "felix_bootstrap_phase_seconds{phase=\"config_load\"} 0.5\n",
            "# TYPE felix_resyncs_started counter\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert_eq!(text.matches("phase=\"config_load\"").count(), 1);
        assert!(text.contains("\nprocess_start_time_seconds "), "{text}");
        // PrometheusProcessMetricsEnabled false: the process's metrics go.
        m.process_metrics
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let text = m.render();
        check_exposition(&text);
        assert!(!text.contains("process_"), "{text}");
        assert!(text.contains("felix_resync_state 3\n"));
    }

    #[test]
    fn summary_quantiles_use_the_recent_window() {
        let s = Summary::default();
        for i in 1..=100 {
            s.observe(f64::from(i));
        }
        let (count, sum, q) = s.snapshot();
        assert_eq!(count, 100);
        assert_eq!(sum, 5050.0);
        assert_eq!(q, [50.0, 90.0, 99.0]);
        for _ in 0..WINDOW {
            s.observe(1.0);
        }
        let (count, _, q) = s.snapshot();
        assert_eq!(count, 100 + WINDOW as u64);
        assert_eq!(q, [1.0, 1.0, 1.0]);
    }
}
