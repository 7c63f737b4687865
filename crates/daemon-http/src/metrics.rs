//! Metrics for `/metrics`: a [`Registry`] of `prometheus-client` metrics and collectors,
//! rendered with its Prometheus text encoder (format 0.0.4), plus the Calico-named families
//! that `prometheus-client` cannot express.
//!
//! Why two kinds: Calico's daemons use Go's client_golang, which exports a counter under
//! exactly the name it was given (`felix_resyncs_started`, `typha_connections_accepted`) and
//! has summaries (`felix_calc_graph_update_time_seconds`). `prometheus-client`'s encoder
//! always appends `_total` to a counter's name and has no summary type. Dashboards and
//! alerts written for Calico must keep working, so those families are [`Counter`],
//! [`CounterVec`], [`Summary`] or a closure ([`Samples`]) registered with
//! [`Registry::register_calico`] and encoded here; everything else (gauges, label families,
//! counters whose Calico name ends in `_total`, scrape-time collectors) is a
//! `prometheus-client` metric registered with [`Registry::register`] or
//! [`Registry::register_collector`]. Families are rendered in registration order.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The type line of a Calico-named family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Summary,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Summary => "summary",
        }
    }
}

/// Writes one family's samples.
pub struct SampleWriter<'a> {
    out: &'a mut String,
    name: &'a str,
}

impl SampleWriter<'_> {
    /// `name{labels} value`.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) {
        self.suffixed("", labels, &fmt_f64(value));
    }

    /// `name{labels} value` for a whole number.
    pub fn sample_u64(&mut self, labels: &[(&str, &str)], value: u64) {
        self.suffixed("", labels, itoa(value).as_str());
    }

    fn suffixed(&mut self, suffix: &str, labels: &[(&str, &str)], value: &str) {
        let out = &mut *self.out;
        out.push_str(self.name);
        out.push_str(suffix);
        if !labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(k);
                out.push_str("=\"");
                escape_into(out, v);
                out.push('"');
            }
            out.push('}');
        }
        out.push(' ');
        out.push_str(value);
        out.push('\n');
    }
}

fn itoa(v: u64) -> String {
    v.to_string()
}

/// A Calico-named family's samples, written at each scrape. Closures implement it, for
/// values read from elsewhere at scrape time.
pub trait Samples: Send + Sync {
    fn write(&self, w: &mut SampleWriter<'_>);
}

impl<F: Fn(&mut SampleWriter<'_>) + Send + Sync> Samples for F {
    fn write(&self, w: &mut SampleWriter<'_>) {
        self(w)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A counter exported under exactly its name (client_golang's, without `_total`).
#[derive(Debug, Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

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

impl Samples for Counter {
    fn write(&self, w: &mut SampleWriter<'_>) {
        w.sample_u64(&[], self.get());
    }
}

/// A counter with one label, exported under exactly its name; series in label order.
#[derive(Debug, Clone)]
pub struct CounterVec {
    label: &'static str,
    values: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl CounterVec {
    pub fn new(label: &'static str) -> CounterVec {
        CounterVec {
            label,
            values: Arc::default(),
        }
    }
    pub fn add(&self, value: &str, n: u64) {
        let mut m = lock(&self.values);
        match m.get_mut(value) {
            Some(v) => *v += n,
            None => {
                m.insert(value.to_string(), n);
            }
        }
    }
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        lock(&self.values).clone()
    }
    pub fn total(&self) -> u64 {
        lock(&self.values).values().sum()
    }
}

impl Samples for CounterVec {
    fn write(&self, w: &mut SampleWriter<'_>) {
        for (v, n) in lock(&self.values).iter() {
            w.sample_u64(&[(self.label, v)], *n);
        }
    }
}

/// How many recent observations a summary's quantiles are computed from.
pub const SUMMARY_WINDOW: usize = 1024;
const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

#[derive(Debug, Default)]
struct SummaryState {
    count: u64,
    sum: f64,
    window: VecDeque<f64>,
}

/// A Prometheus summary: count and sum over the whole run, the 0.5/0.9/0.99 quantiles over
/// the most recent [`SUMMARY_WINDOW`] observations (Calico's summaries report recent
/// quantiles). Memory is bounded by the window.
#[derive(Debug, Clone, Default)]
pub struct Summary(Arc<Mutex<SummaryState>>);

impl Summary {
    pub fn observe(&self, v: f64) {
        let mut s = lock(&self.0);
        s.count += 1;
        s.sum += v;
        if s.window.len() == SUMMARY_WINDOW {
            s.window.pop_front();
        }
        s.window.push_back(v);
    }

    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    /// (count, sum, quantiles over the window; NaN when empty).
    pub fn snapshot(&self) -> (u64, f64, [f64; 3]) {
        let s = lock(&self.0);
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

impl Samples for Summary {
    fn write(&self, w: &mut SampleWriter<'_>) {
        let (count, sum, q) = self.snapshot();
        for (quantile, v) in QUANTILES.iter().zip(q) {
            w.sample(&[("quantile", &quantile.to_string())], v);
        }
        w.suffixed("_sum", &[], &fmt_f64(sum));
        w.suffixed("_count", &[], &itoa(count));
    }
}

enum Entry {
    Client(prometheus_client::registry::Registry),
    Calico {
        name: String,
        help: String,
        kind: Kind,
        samples: Box<dyn Samples>,
    },
}

/// The metrics a daemon exports (see the module documentation).
#[derive(Default)]
pub struct Registry {
    entries: Vec<Entry>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("families", &self.entries.len())
            .finish()
    }
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    /// A `prometheus-client` metric, named as that crate names it (a counter gets `_total`
    /// appended, so register `foo` to export `foo_total`). The help is exported as given:
    /// that crate appends a full stop, so one `help` ends with is dropped first.
    pub fn register(
        &mut self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        let mut r = prometheus_client::registry::Registry::default();
        r.register(name, help.strip_suffix('.').unwrap_or(help), metric);
        self.entries.push(Entry::Client(r));
    }

    /// A `prometheus-client` collector, asked for its families at each scrape.
    pub fn register_collector(&mut self, collector: Box<dyn Collector>) {
        let mut r = prometheus_client::registry::Registry::default();
        r.register_collector(collector);
        self.entries.push(Entry::Client(r));
    }

    /// A Calico-named family: exported under exactly `name`, with `kind` as its type.
    pub fn register_calico(
        &mut self,
        name: &str,
        help: &str,
        kind: Kind,
        samples: impl Samples + 'static,
    ) {
        self.entries.push(Entry::Calico {
            name: name.to_string(),
            help: help.to_string(),
            kind,
            samples: Box::new(samples),
        });
    }

    /// The text exposition of every family.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        for e in &self.entries {
            match e {
                Entry::Client(r) => {
                    // Writing to a String cannot fail; a metric's own encoder failing would
                    // only lose that family.
                    if let Err(e) =
                        prometheus_client::encoding::prometheus_text::encode(&mut out, r)
                    {
                        tracing::debug!("encoding a metric failed: {e}");
                    }
                }
                Entry::Calico {
                    name,
                    help,
                    kind,
                    samples,
                } => {
                    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
                    let _ = writeln!(out, "# TYPE {name} {}", kind.as_str());
                    samples.write(&mut SampleWriter {
                        out: &mut out,
                        name,
                    });
                }
            }
        }
        out
    }
}

impl crate::Exposition for Registry {
    fn render(&self) -> String {
        Registry::render(self)
    }
}

/// The process's own metrics, from /proc, with client_golang's process collector's names:
/// `process_start_time_seconds`, `process_resident_memory_bytes`,
/// `process_cpu_seconds_total`, `process_open_fds`. Off while `enabled` is false (Felix's
/// PrometheusProcessMetricsEnabled).
#[derive(Debug, Clone)]
pub struct ProcessCollector {
    pub start: SystemTime,
    pub enabled: Arc<AtomicBool>,
}

impl ProcessCollector {
    pub fn new() -> ProcessCollector {
        ProcessCollector {
            start: SystemTime::now(),
            enabled: Arc::new(AtomicBool::new(true)),
        }
    }
}

impl Default for ProcessCollector {
    fn default() -> Self {
        ProcessCollector::new()
    }
}

/// This process's resident memory in bytes (VmRSS).
pub fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

fn cpu_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may contain spaces and parentheses).
    let rest = s.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    // USER_HZ is 100 on every Linux platform margay runs on.
    Some((utime + stime) / 100.0)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if !self.enabled.load(Ordering::Relaxed) {
            return Ok(());
        }
        if let Ok(start) = self.start.duration_since(UNIX_EPOCH) {
            let m = encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(start.as_secs_f64()).encode(m)?;
        }
        if let Some(rss) = rss_bytes() {
            let m = encoder.encode_descriptor(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(i64::try_from(rss).unwrap_or(i64::MAX)).encode(m)?;
        }
        if let Some(cpu) = cpu_seconds() {
            // The encoder appends `_total`: process_cpu_seconds_total, as Go names it.
            let m = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(cpu).encode(m)?;
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            let m = encoder.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors.",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(i64::try_from(fds.count()).unwrap_or(i64::MAX)).encode(m)?;
        }
        Ok(())
    }
}

/// Prometheus float syntax, as client_golang writes sample values.
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

fn escape_into(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn escape_help(h: &str) -> String {
    h.replace('\\', "\\\\").replace('\n', "\\n")
}

/// The families in an exposition, in order, as (name, type) from its `# TYPE` lines: what
/// the metric-name tests compare.
pub fn families(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let (n, k) = l.split_once(' ')?;
            Some((n.to_string(), k.to_string()))
        })
        .collect()
}

/// The value of the sample `series` (its name and labels exactly as rendered) in an
/// exposition, if present.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (s, v) = l.rsplit_once(' ')?;
        (s == series).then(|| v.parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;

    #[test]
    fn calico_counters_keep_their_names_and_client_metrics_follow_the_crate() {
        let mut r = Registry::new();
        let plain = Counter::default();
        r.register_calico(
            "x_resyncs_started",
            "Resyncs.",
            Kind::Counter,
            plain.clone(),
        );
        let by = CounterVec::new("type");
        r.register_calico("x_updates", "Updates by type.", Kind::Counter, by.clone());
        let g: Gauge = Gauge::default();
        r.register("x_in_sync", "In sync.", g.clone());
        let c: prometheus_client::metrics::counter::Counter =
            prometheus_client::metrics::counter::Counter::default();
        r.register("x_updates_seen", "Seen.", c.clone());
        let f: Family<Vec<(String, String)>, Gauge> = Family::default();
        r.register("x_host", "Host.", f.clone());
        plain.add(3);
        by.add("b\"q", 2);
        by.add("a", 1);
        g.set(1);
        c.inc_by(5);
        f.get_or_create(&vec![("host".into(), "h\"1".into())])
            .set(1);
        let text = r.render();
        assert_eq!(
            families(&text),
            [
                ("x_resyncs_started", "counter"),
                ("x_updates", "counter"),
                ("x_in_sync", "gauge"),
                ("x_updates_seen_total", "counter"),
                ("x_host", "gauge"),
            ]
            .map(|(n, k)| (n.to_string(), k.to_string()))
        );
        for want in [
            "x_resyncs_started 3\n",
            "x_updates{type=\"a\"} 1\nx_updates{type=\"b\\\"q\"} 2\n",
            "x_in_sync 1\n",
            "x_updates_seen_total 5\n",
            "x_host{host=\"h\\\"1\"} 1\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(!text.contains("# EOF"), "{text}");
        // Help texts exactly as registered, whichever kind.
        assert!(text.contains("# HELP x_in_sync In sync.\n"), "{text}");
        assert!(
            text.contains("# HELP x_resyncs_started Resyncs.\n"),
            "{text}"
        );
        assert_eq!(sample(&text, "x_updates{type=\"a\"}"), Some(1.0));
    }

    #[test]
    fn summaries_render_quantiles_sum_and_count_over_the_recent_window() {
        let s = Summary::default();
        for i in 1..=100 {
            s.observe(f64::from(i));
        }
        let (count, sum, q) = s.snapshot();
        assert_eq!((count, sum, q), (100, 5050.0, [50.0, 90.0, 99.0]));
        for _ in 0..SUMMARY_WINDOW {
            s.observe(1.0);
        }
        let (count, _, q) = s.snapshot();
        assert_eq!(count, 100 + SUMMARY_WINDOW as u64);
        assert_eq!(q, [1.0, 1.0, 1.0]);

        let mut r = Registry::new();
        r.register_calico("t_seconds", "T.", Kind::Summary, Summary::default());
        let text = r.render();
        assert_eq!(
            text,
            "# HELP t_seconds T.\n# TYPE t_seconds summary\n\
             t_seconds{quantile=\"0.5\"} NaN\nt_seconds{quantile=\"0.9\"} NaN\n\
             t_seconds{quantile=\"0.99\"} NaN\nt_seconds_sum 0\nt_seconds_count 0\n"
        );
    }

    #[test]
    fn process_metrics_have_go_names_and_can_be_turned_off() {
        let p = ProcessCollector::new();
        let mut r = Registry::new();
        r.register_collector(Box::new(p.clone()));
        let names: Vec<String> = families(&r.render()).into_iter().map(|f| f.0).collect();
        assert_eq!(
            names,
            [
                "process_start_time_seconds",
                "process_resident_memory_bytes",
                "process_cpu_seconds_total",
                "process_open_fds"
            ]
        );
        p.enabled.store(false, Ordering::Relaxed);
        assert_eq!(r.render(), "");
    }
}
