//! Felix's Prometheus metrics, with Calico's names, in a `margay-daemon-http` registry:
//! gauges and label families are `prometheus-client` metrics; the counters Calico exports
//! without `_total` and the summaries are the registry's Calico-named families (see that
//! crate's `metrics` module for why).
//!
//! Summaries keep their count and sum over the whole run and estimate the 0.5/0.9/0.99
//! quantiles over the most recent observations (a sliding window), as Calico's summaries
//! report recent quantiles.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64};
use std::sync::{Arc, Mutex};

use margay_calc::CalcCounts;
use margay_daemon_http::metrics::{Counter, CounterVec, Kind, ProcessCollector, Registry};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};

pub use margay_daemon_http::metrics::Summary;

/// How many recent observations the summaries' quantiles are computed from.
#[cfg(test)]
const WINDOW: usize = margay_daemon_http::metrics::SUMMARY_WINDOW;

/// A gauge of whole numbers (counts, states).
pub type IntGauge = Gauge<i64, AtomicI64>;
/// A gauge of seconds.
pub type FloatGauge = Gauge<f64, AtomicU64>;

type Labels = [(&'static str, String); 1];

/// Every metric Felix exports.
#[derive(Debug)]
pub struct Metrics {
    pub hostname: String,
    pub ipv6: bool,
    // Calculation graph (felix/calc).
    pub calc_update_time: Summary,
    pub calc_updates_processed: CounterVec,
    pub calc_output_events: Counter,
    pub resync_state: IntGauge,
    pub resyncs_started: Counter,
    pub active_local_endpoints: IntGauge,
    pub active_local_policies: IntGauge,
    pub active_local_selectors: IntGauge,
    /// Active IP sets (exported once per IP version).
    pub ipsets: IntGauge,
    ipsets_v6: IntGauge,
    pub cluster_hosts: IntGauge,
    pub cluster_workload_endpoints: IntGauge,
    pub cluster_policies: IntGauge,
    pub cluster_profiles: IntGauge,
    // Dataplane.
    pub dataplane_apply_time: Summary,
    pub dataplane_messages: CounterVec,
    pub dataplane_failures: Counter,
    pub dataplane_initial_resync_time: FloatGauge,
    // margay's own.
    pub invalid_resources: CounterVec,
    bootstrap_phases: Phases,
    flow_logs: FlowMetrics,
    /// PrometheusProcessMetricsEnabled: also export the process's own metrics.
    pub process_metrics: Arc<AtomicBool>,
    registry: Registry,
}

/// Flow-log counters, once flow logs run (nothing is exported while they are off).
type FlowSource = Arc<dyn Fn() -> crate::flows::FlowCounters + Send + Sync>;

#[derive(Clone, Default)]
struct FlowMetrics(Arc<Mutex<Option<FlowSource>>>);

impl std::fmt::Debug for FlowMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlowMetrics")
    }
}

impl Collector for FlowMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::counter::ConstCounter;
        let Some(source) = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
            return Ok(());
        };
        let c = source();
        for (name, help, value) in [
            (
                "felix_nflog_logs_received",
                "Packets the flow-log rules handed to Felix (NFLOG).",
                c.packets,
            ),
            (
                "felix_nflog_buffer_overruns",
                "Batches of logged packets the kernel dropped because Felix's buffer was full.",
                c.overruns,
            ),
            (
                "felix_flow_logs_shed",
                "Logged packets of new flows not kept because an interval was full (margay).",
                c.shed,
            ),
            (
                "felix_flow_logs_unknown_prefix",
                "Logged packets whose prefix named no rule Felix rendered (margay).",
                c.unknown_prefixes,
            ),
            (
                "felix_bpf_flow_events_dropped",
                "eBPF flow events the policy program dropped because the ring buffer was full (margay).",
                c.ring_drops,
            ),
        ] {
            let m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(m)?;
        }
        let mut m = encoder.encode_descriptor(
            "felix_policy_rule_packets",
            "Logged packets per policy or profile rule that decided them: an allowed connection's first packet, every denied packet (margay).",
            None,
            MetricType::Counter,
        )?;
        for (rule, n) in &c.per_rule {
            let (policy, tier) = match &rule.origin {
                margay_flows::Origin::Policy {
                    kind,
                    namespace,
                    name,
                } => (
                    if namespace.is_empty() {
                        format!("{kind}/{name}")
                    } else {
                        format!("{kind}/{namespace}/{name}")
                    },
                    String::new(),
                ),
                margay_flows::Origin::Profile { name } => (format!("pro/{name}"), String::new()),
                margay_flows::Origin::EndOfTier { tier } => ("end-of-tier".into(), tier.clone()),
                margay_flows::Origin::NoProfile => ("no-profile".into(), String::new()),
            };
            let labels = [
                ("policy", policy),
                ("tier", tier),
                (
                    "rule",
                    rule.rule_index.map_or("-1".into(), |i| i.to_string()),
                ),
                ("action", format!("{:?}", rule.action).to_ascii_lowercase()),
                (
                    "direction",
                    format!("{:?}", rule.direction).to_ascii_lowercase(),
                ),
            ];
            ConstCounter::new(*n).encode(m.encode_family(&labels)?)?;
        }
        let mut m = encoder.encode_descriptor(
            "felix_denied_flows",
            "Denied flows by the namespace of the endpoint whose policy denied them (margay).",
            None,
            MetricType::Counter,
        )?;
        for (ns, n) in &c.denied_by_namespace {
            ConstCounter::new(*n).encode(m.encode_family(&[("namespace", ns.as_str())])?)?;
        }
        Ok(())
    }
}

/// The start-up phases' durations, in the order they ran (a gauge family rendered in that
/// order, which a hash-keyed family would not keep).
#[derive(Debug, Clone, Default)]
struct Phases(Arc<Mutex<Vec<(String, f64)>>>);

impl Collector for Phases {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let phases = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut m = encoder.encode_descriptor(
            "felix_bootstrap_phase_seconds",
            "Seconds each start-up phase took, in the order they ran (margay).",
            None,
            MetricType::Gauge,
        )?;
        for (phase, seconds) in &phases {
            let labels = [("phase", phase.as_str())];
            ConstGauge::new(*seconds).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl Metrics {
    pub fn new(hostname: &str, ipv6: bool) -> Metrics {
        let mut r = Registry::new();
        let host: Family<Labels, IntGauge> = Family::default();
        host.get_or_create(&[("host", hostname.to_string())]).set(1);
        r.register(
            "felix_host",
            "Configured Felix hostname (as a label), typically used in grouping/aggregating stats; the value is always 1.",
            host,
        );
        let calc_update_time = Summary::default();
        r.register_calico(
            "felix_calc_graph_update_time_seconds",
            "Seconds to update calculation graph for each datastore OnUpdate call.",
            Kind::Summary,
            calc_update_time.clone(),
        );
        let calc_updates_processed = CounterVec::new("type");
        r.register_calico(
            "felix_calc_graph_updates_processed",
            "Number of datastore updates processed by the calculation graph.",
            Kind::Counter,
            calc_updates_processed.clone(),
        );
        let calc_output_events = Counter::default();
        r.register_calico(
            "felix_calc_graph_output_events",
            "Number of events emitted by the calculation graph.",
            Kind::Counter,
            calc_output_events.clone(),
        );
        let resync_state = IntGauge::default();
        r.register(
            "felix_resync_state",
            "Current datastore state.",
            resync_state.clone(),
        );
        let resyncs_started = Counter::default();
        r.register_calico(
            "felix_resyncs_started",
            "Number of times Felix started resyncing with the datastore.",
            Kind::Counter,
            resyncs_started.clone(),
        );
        let mut gauge = |name: &str, help: &str| {
            let g = IntGauge::default();
            r.register(name, help, g.clone());
            g
        };
        let active_local_endpoints = gauge(
            "felix_active_local_endpoints",
            "Number of active endpoints on this host.",
        );
        let active_local_policies = gauge(
            "felix_active_local_policies",
            "Number of active policies on this host.",
        );
        let active_local_selectors = gauge(
            "felix_active_local_selectors",
            "Number of active selectors on this host.",
        );
        let ipsets_family: Family<Labels, IntGauge> = Family::default();
        let ipsets = ipsets_family
            .get_or_create(&[("ip_version", "4".to_string())])
            .clone();
        let ipsets_v6 = if ipv6 {
            ipsets_family
                .get_or_create(&[("ip_version", "6".to_string())])
                .clone()
        } else {
            IntGauge::default()
        };
        r.register(
            "felix_ipsets_calico",
            "Number of active Calico IP sets.",
            ipsets_family,
        );
        let mut gauge = |name: &str, help: &str| {
            let g = IntGauge::default();
            r.register(name, help, g.clone());
            g
        };
        let cluster_hosts = gauge(
            "felix_cluster_num_hosts",
            "Total number of calico hosts in the cluster.",
        );
        let cluster_workload_endpoints = gauge(
            "felix_cluster_num_workload_endpoints",
            "Total number of workload endpoints cluster-wide.",
        );
        let cluster_policies = gauge(
            "felix_cluster_num_policies",
            "Total number of policies cluster-wide.",
        );
        let cluster_profiles = gauge(
            "felix_cluster_num_profiles",
            "Total number of profiles cluster-wide.",
        );
        let dataplane_apply_time = Summary::default();
        r.register_calico(
            "felix_int_dataplane_apply_time_seconds",
            "Time in seconds for each incremental update to the dataplane (after the initial resync).",
            Kind::Summary,
            dataplane_apply_time.clone(),
        );
        let dataplane_messages = CounterVec::new("type");
        r.register_calico(
            "felix_int_dataplane_messages",
            "Number dataplane messages by type.",
            Kind::Counter,
            dataplane_messages.clone(),
        );
        let dataplane_failures = Counter::default();
        r.register_calico(
            "felix_int_dataplane_failures",
            "Number of times dataplane updates failed and will be retried.",
            Kind::Counter,
            dataplane_failures.clone(),
        );
        let dataplane_initial_resync_time = FloatGauge::default();
        r.register(
            "felix_int_dataplane_initial_resync_time_seconds",
            "Time in seconds that it took to do the initial resync with the dataplane and bring the dataplane into sync for the first time.",
            dataplane_initial_resync_time.clone(),
        );
        let invalid_resources = CounterVec::new("kind");
        r.register_calico(
            "felix_invalid_resources",
            "Datastore updates whose value failed validation and were treated as deletions, by kind (margay).",
            Kind::Counter,
            invalid_resources.clone(),
        );
        let bootstrap_phases = Phases::default();
        r.register_collector(Box::new(bootstrap_phases.clone()));
        let flow_logs = FlowMetrics::default();
        r.register_collector(Box::new(flow_logs.clone()));
        let process = ProcessCollector::new();
        let process_metrics = process.enabled.clone();
        r.register_collector(Box::new(process));
        Metrics {
            hostname: hostname.to_string(),
            ipv6,
            calc_update_time,
            calc_updates_processed,
            calc_output_events,
            resync_state,
            resyncs_started,
            active_local_endpoints,
            active_local_policies,
            active_local_selectors,
            ipsets,
            ipsets_v6,
            cluster_hosts,
            cluster_workload_endpoints,
            cluster_policies,
            cluster_profiles,
            dataplane_apply_time,
            dataplane_messages,
            dataplane_failures,
            dataplane_initial_resync_time,
            invalid_resources,
            bootstrap_phases,
            flow_logs,
            process_metrics,
            registry: r,
        }
    }

    /// Flow logs started: /metrics exports their counters from now on.
    pub fn set_flow_logs(&self, flows: Arc<crate::flows::FlowLogs>) {
        self.set_flow_counters(Arc::new(move || flows.counters()));
    }

    fn set_flow_counters(&self, source: FlowSource) {
        *self.flow_logs.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    /// Updates the gauges that mirror the calculation graph's counts.
    pub fn set_counts(&self, c: &CalcCounts) {
        let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        self.active_local_endpoints.set(n(c.local_endpoints));
        self.active_local_policies.set(n(c.active_policies));
        self.active_local_selectors.set(n(c.selectors));
        self.ipsets.set(n(c.active_ip_sets));
        self.ipsets_v6.set(n(c.active_ip_sets));
        self.cluster_hosts.set(n(c.hosts));
        self.cluster_workload_endpoints.set(n(c.workload_endpoints));
        self.cluster_policies.set(n(c.policies));
        self.cluster_profiles.set(n(c.profiles));
    }

    pub fn set_bootstrap_phase(&self, phase: &str, seconds: f64) {
        let mut p = self
            .bootstrap_phases
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match p.iter_mut().find(|(n, _)| n == phase) {
            Some(e) => e.1 = seconds,
            None => p.push((phase.to_string(), seconds)),
        }
    }

    /// The text exposition of every metric (and the process's own, from /proc, unless
    /// PrometheusProcessMetricsEnabled is false).
    pub fn render(&self) -> String {
        self.registry.render()
    }
}

impl margay_daemon_http::Exposition for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn flow_counters_are_exported_once_flow_logs_run() {
        let m = Metrics::new("n1", false);
        assert!(!m.render().contains("felix_policy_rule_packets"));
        m.set_flow_counters(Arc::new(|| crate::flows::FlowCounters {
            packets: 7,
            shed: 1,
            overruns: 0,
            unknown_prefixes: 0,
            ring_drops: 3,
            per_rule: vec![(
                margay_flows::RuleRef {
                    action: margay_flows::Action::Allow,
                    direction: margay_flows::Direction::Ingress,
                    origin: margay_flows::Origin::Policy {
                        kind: "np".into(),
                        namespace: "prod".into(),
                        name: "web".into(),
                    },
                    rule_index: Some(0),
                },
                5,
            )],
            denied_by_namespace: [("prod".to_string(), 2)].into_iter().collect(),
        }));
        let text = m.render();
        assert!(text.contains("felix_nflog_logs_received_total 7"), "{text}");
        assert!(
            text.contains("felix_bpf_flow_events_dropped_total 3"),
            "{text}"
        );
        assert!(
            text.contains("felix_policy_rule_packets_total{policy=\"np/prod/web\",tier=\"\",rule=\"0\",action=\"allow\",direction=\"ingress\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("felix_denied_flows_total{namespace=\"prod\"} 2"),
            "{text}"
        );
    }

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
        m.resync_state.set(3);
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

    /// The full list of families (name and type) Felix exported before its metrics moved to
    /// prometheus-client, captured from the hand-written exposition: not one may change.
    #[test]
    fn family_names_and_types_are_calicos_unchanged() {
        let m = Metrics::new("h", true);
        m.calc_updates_processed.add("X", 1);
        m.dataplane_messages.add("X", 1);
        m.invalid_resources.add("X", 1);
        m.set_bootstrap_phase("p", 1.0);
        let got = margay_daemon_http::metrics::families(&m.render());
        let want = [
            ("felix_host", "gauge"),
            ("felix_calc_graph_update_time_seconds", "summary"),
            ("felix_calc_graph_updates_processed", "counter"),
            ("felix_calc_graph_output_events", "counter"),
            ("felix_resync_state", "gauge"),
            ("felix_resyncs_started", "counter"),
            ("felix_active_local_endpoints", "gauge"),
            ("felix_active_local_policies", "gauge"),
            ("felix_active_local_selectors", "gauge"),
            ("felix_ipsets_calico", "gauge"),
            ("felix_cluster_num_hosts", "gauge"),
            ("felix_cluster_num_workload_endpoints", "gauge"),
            ("felix_cluster_num_policies", "gauge"),
            ("felix_cluster_num_profiles", "gauge"),
            ("felix_int_dataplane_apply_time_seconds", "summary"),
            ("felix_int_dataplane_messages", "counter"),
            ("felix_int_dataplane_failures", "counter"),
            ("felix_int_dataplane_initial_resync_time_seconds", "gauge"),
            ("felix_invalid_resources", "counter"),
            ("felix_bootstrap_phase_seconds", "gauge"),
            ("process_start_time_seconds", "gauge"),
            ("process_resident_memory_bytes", "gauge"),
            ("process_cpu_seconds_total", "counter"),
            ("process_open_fds", "gauge"),
        ]
        .map(|(n, k)| (n.to_string(), k.to_string()));
        assert_eq!(got, want);
    }
}
