//! The running configuration (pure): the KubeControllersConfiguration `default` merged with
//! the environment as Calico's kube-controllers merges them (`kube-controllers/pkg/config`).
//!
//! The environment wins where it says something: LOG_LEVEL, ENABLED_CONTROLLERS,
//! RECONCILER_PERIOD, COMPACTION_PERIOD, HEALTH_ENABLED, SYNC_NODE_LABELS, AUTO_HOST_ENDPOINTS;
//! DATASTORE_TYPE (default `etcdv3`, as Calico's kube-controllers) decides what the node
//! controller does. A bad environment value is an error naming the variable (Calico exits on
//! it too); a bad value in the resource is a warning and the default is used, so an edit to
//! the resource cannot stop the controllers.

use std::collections::BTreeMap;
use std::time::Duration;

use margay_api::bgp::EnabledDisabled;
use margay_api::duration::{Duration as ApiDuration, parse_go_duration};
use margay_api::kubecontrollers::{
    AutoHostEndpointConfig, ControllersConfig, KubeControllersConfigurationSpec,
    KubeControllersConfigurationStatus, LoadBalancerControllerConfig, MigrationControllerConfig,
    NodeControllerConfig as ApiNodeConfig, ReconcilerConfig,
};

pub const ENV_LOG_LEVEL: &str = "LOG_LEVEL";
pub const ENV_RECONCILER_PERIOD: &str = "RECONCILER_PERIOD";
pub const ENV_ENABLED_CONTROLLERS: &str = "ENABLED_CONTROLLERS";
pub const ENV_COMPACTION_PERIOD: &str = "COMPACTION_PERIOD";
pub const ENV_HEALTH_ENABLED: &str = "HEALTH_ENABLED";
pub const ENV_SYNC_NODE_LABELS: &str = "SYNC_NODE_LABELS";
pub const ENV_AUTO_HOST_ENDPOINTS: &str = "AUTO_HOST_ENDPOINTS";
pub const ENV_DATASTORE_TYPE: &str = "DATASTORE_TYPE";

/// The variables that override the resource (Calico's `AllEnvs`).
pub const ALL_ENVS: [&str; 7] = [
    ENV_LOG_LEVEL,
    ENV_RECONCILER_PERIOD,
    ENV_ENABLED_CONTROLLERS,
    ENV_COMPACTION_PERIOD,
    ENV_HEALTH_ENABLED,
    ENV_SYNC_NODE_LABELS,
    ENV_AUTO_HOST_ENDPOINTS,
];

/// The resource's name.
pub const DEFAULT_NAME: &str = "default";
/// Calico's defaults.
pub const DEFAULT_RECONCILER_PERIOD: Duration = Duration::from_secs(5 * 60);
pub const DEFAULT_LEAK_GRACE_PERIOD: Duration = Duration::from_secs(15 * 60);
pub const DEFAULT_COMPACTION_PERIOD: Duration = Duration::from_secs(10 * 60);

/// A configuration the controllers cannot start with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{var}={value:?}: {problem}")]
    Env {
        var: &'static str,
        value: String,
        problem: String,
    },
}

fn env_err(var: &'static str, value: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Env {
        var,
        value: value.to_string(),
        problem: problem.into(),
    }
}

/// Where Calico's resources are: decides whether the node controller deletes Calico Nodes and
/// syncs labels (etcd) and which controllers make sense.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatastoreKind {
    Etcd,
    Kubernetes,
}

impl DatastoreKind {
    /// DATASTORE_TYPE (also as CALICO_DATASTORE_TYPE); unset means `etcdv3`, Calico's
    /// kube-controllers' default (other roles default to something else).
    pub fn from_env(value: Option<&str>) -> Result<DatastoreKind, ConfigError> {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("etcdv3") | Some("etcd") => Ok(DatastoreKind::Etcd),
            Some("kubernetes") | Some("k8s") => Ok(DatastoreKind::Kubernetes),
            Some(_) => Err(env_err(
                ENV_DATASTORE_TYPE,
                value.unwrap_or_default(),
                "kube-controllers runs against etcdv3 or kubernetes; set DATASTORE_TYPE to one of them",
            )),
        }
    }

    /// The value DATASTORE_TYPE should have for margay's datastore settings.
    pub fn env_value(self) -> &'static str {
        match self {
            DatastoreKind::Etcd => "etcdv3",
            DatastoreKind::Kubernetes => "kubernetes",
        }
    }
}

/// The environment variables of [`ALL_ENVS`] that are set (set but empty counts as set, as
/// with Go's `os.LookupEnv`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvSettings {
    pub vars: BTreeMap<String, String>,
}

impl EnvSettings {
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> EnvSettings {
        EnvSettings {
            vars: ALL_ENVS
                .iter()
                .filter_map(|k| get(k).map(|v| (k.to_string(), v)))
                .collect(),
        }
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.vars.get(k).map(String::as_str)
    }
}

/// A controller that mirrors objects on a period (policy, namespace, serviceaccount,
/// workloadendpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenericControllerConfig {
    /// How often the whole set is compared, on top of reacting to changes (zero: only at
    /// start).
    pub reconciler_period: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeControllerConfig {
    /// Copy Kubernetes node labels onto Calico Nodes (etcd only; Calico's KDD Nodes already
    /// carry them).
    pub sync_labels: bool,
    /// Create `<node>-auto-hep` host endpoints for nodes (`crate::auto_hep`).
    pub auto_host_endpoints: bool,
    /// Delete Calico Nodes whose Kubernetes Node is gone (etcd: Calico's DeleteNodes).
    pub delete_nodes: bool,
    /// How long an address whose pod is gone (on a node that exists) waits before it is
    /// released; None: such addresses are not garbage collected; zero: they are reported as
    /// candidates, never released.
    pub leak_grace_period: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Controllers {
    pub node: Option<NodeControllerConfig>,
    pub policy: Option<GenericControllerConfig>,
    pub workload_endpoint: Option<GenericControllerConfig>,
    pub service_account: Option<GenericControllerConfig>,
    pub namespace: Option<GenericControllerConfig>,
    /// The loadbalancer controller (LoadBalancer IPAM, `loadbalancer`).
    pub load_balancer: bool,
}

/// What the controllers run with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunConfig {
    /// A tracing level (`info`, `debug`, …).
    pub log_level: &'static str,
    pub controllers: Controllers,
    /// etcd only: history older than one period is compacted; zero turns compaction off.
    pub etcd_compaction_period: Duration,
    pub health_enabled: bool,
    /// 0: no metrics server (Calico's behaviour for an unset port).
    pub prometheus_port: u16,
}

/// The result of a merge: the running configuration, the status to report in the resource,
/// and what in the resource was ignored.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    pub run: RunConfig,
    pub status: KubeControllersConfigurationStatus,
    pub warnings: Vec<String>,
}

fn minutes(m: u64) -> ApiDuration {
    ApiDuration::from_std(Duration::from_secs(m * 60))
}

/// Calico's default resource (`NewDefaultKubeControllersConfig`), created when none exists.
pub fn default_spec() -> KubeControllersConfigurationSpec {
    let period = || {
        Some(ReconcilerConfig {
            reconciler_period: Some(minutes(5)),
        })
    };
    KubeControllersConfigurationSpec {
        log_severity_screen: "Info".into(),
        health_checks: Some(EnabledDisabled::Enabled),
        etcd_v3_compaction_period: Some(minutes(10)),
        prometheus_metrics_port: None,
        controllers: ControllersConfig {
            node: Some(ApiNodeConfig {
                reconciler_period: Some(minutes(5)),
                sync_labels: Some(EnabledDisabled::Enabled),
                host_endpoint: Some(AutoHostEndpointConfig {
                    auto_create: Some(EnabledDisabled::Disabled),
                    create_default_host_endpoint: Some(EnabledDisabled::Enabled),
                    templates: Vec::new(),
                }),
                leak_grace_period: Some(minutes(15)),
            }),
            policy: period(),
            workload_endpoint: period(),
            service_account: period(),
            namespace: period(),
            load_balancer: Some(LoadBalancerControllerConfig {
                assign_ips: Some(margay_api::kubecontrollers::AssignIps::AllServices),
            }),
            migration: Some(MigrationControllerConfig {
                policy_name_migrator: Some(EnabledDisabled::Enabled),
            }),
        },
        debug_profile_port: None,
    }
}

/// logrus' level names (any case) as a tracing level and Calico's status spelling.
pub fn parse_log_level(v: &str) -> Option<(&'static str, &'static str)> {
    match v.trim().to_ascii_lowercase().as_str() {
        "panic" => Some(("error", "Panic")),
        "fatal" => Some(("error", "Fatal")),
        "error" => Some(("error", "Error")),
        "warn" | "warning" => Some(("warn", "Warning")),
        "info" => Some(("info", "Info")),
        "debug" => Some(("debug", "Debug")),
        "trace" => Some(("trace", "Trace")),
        _ => None,
    }
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `time.ParseDuration`, refusing negative lengths.
pub fn parse_duration(v: &str) -> Result<Duration, String> {
    let nanos = parse_go_duration(v)?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| format!("{v:?} is negative"))
}

/// A duration as Go prints it (`5m0s`, `1h0m0s`, `1.5s`, `300ms`), as Calico's status shows.
pub fn go_duration_string(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    if nanos < 1_000_000_000 {
        let (unit, div) = if nanos < 1_000 {
            ("ns", 1u128)
        } else if nanos < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{}{unit}", trim_fraction(nanos, div));
    }
    let total_secs = d.as_secs();
    let (h, m) = (total_secs / 3600, (total_secs % 3600) / 60);
    let secs_nanos = u128::from(total_secs % 60) * 1_000_000_000 + u128::from(d.subsec_nanos());
    let s = format!("{}s", trim_fraction(secs_nanos, 1_000_000_000));
    match (h, m) {
        (0, 0) => s,
        (0, m) => format!("{m}m{s}"),
        (h, m) => format!("{h}h{m}m{s}"),
    }
}

fn trim_fraction(value: u128, div: u128) -> String {
    let (int, frac) = (value / div, value % div);
    if frac == 0 {
        return int.to_string();
    }
    let width = div.to_string().len() - 1;
    let frac = format!("{frac:0width$}");
    format!("{int}.{}", frac.trim_end_matches('0'))
}

fn status_period(d: Duration) -> Option<ApiDuration> {
    Some(ApiDuration::new(go_duration_string(d)))
}

fn api_period(
    p: Option<&ApiDuration>,
    what: &str,
    default: Duration,
    warnings: &mut Vec<String>,
) -> Duration {
    match p {
        None => default,
        Some(d) => match parse_duration(d.as_str()) {
            Ok(d) => d,
            Err(e) => {
                warnings.push(format!(
                    "KubeControllersConfiguration default: {what}: {e}; using {}",
                    go_duration_string(default)
                ));
                default
            }
        },
    }
}

/// Merges the environment with the resource's spec (Calico's `mergeConfig`).
pub fn merge(
    env: &EnvSettings,
    datastore: DatastoreKind,
    spec: &KubeControllersConfigurationSpec,
) -> Result<Merged, ConfigError> {
    let mut warnings = Vec::new();
    let mut status = KubeControllersConfigurationStatus {
        running_config: None,
        environment_vars: BTreeMap::new(),
    };
    let mut running = KubeControllersConfigurationSpec::default();

    // Log level.
    let (log_level, severity) = match env.get(ENV_LOG_LEVEL) {
        Some(v) => {
            record(&mut status, ENV_LOG_LEVEL, v);
            parse_log_level(v).ok_or_else(|| {
                env_err(
                    ENV_LOG_LEVEL,
                    v,
                    "not a log level; use panic, fatal, error, warning, info, debug or trace",
                )
            })?
        }
        None => match parse_log_level(&spec.log_severity_screen) {
            Some(l) => l,
            None => {
                warnings.push(format!(
                    "KubeControllersConfiguration default: spec.logSeverityScreen {:?} is not a log level; using Info",
                    spec.log_severity_screen
                ));
                ("info", "Info")
            }
        },
    };
    running.log_severity_screen = severity.to_string();

    // Enabled controllers.
    let api = &spec.controllers;
    let mut c = Controllers::default();
    let generic = |p: Option<&ReconcilerConfig>, what: &str, warnings: &mut Vec<String>| {
        GenericControllerConfig {
            reconciler_period: api_period(
                p.and_then(|r| r.reconciler_period.as_ref()),
                what,
                DEFAULT_RECONCILER_PERIOD,
                warnings,
            ),
        }
    };
    let (mut want_node, mut want_lb) = (false, false);
    let mut want = |name: &str, c: &mut Controllers, warnings: &mut Vec<String>| match name {
        "workloadendpoint" => {
            c.workload_endpoint = Some(generic(
                api.workload_endpoint.as_ref(),
                "spec.controllers.workloadEndpoint.reconcilerPeriod",
                warnings,
            ))
        }
        "namespace" | "profile" => {
            c.namespace = Some(generic(
                api.namespace.as_ref(),
                "spec.controllers.namespace.reconcilerPeriod",
                warnings,
            ))
        }
        "policy" => {
            c.policy = Some(generic(
                api.policy.as_ref(),
                "spec.controllers.policy.reconcilerPeriod",
                warnings,
            ))
        }
        "serviceaccount" => {
            c.service_account = Some(generic(
                api.service_account.as_ref(),
                "spec.controllers.serviceAccount.reconcilerPeriod",
                warnings,
            ))
        }
        "node" => want_node = true,
        "loadbalancer" => want_lb = true,
        _ => {}
    };
    match env.get(ENV_ENABLED_CONTROLLERS) {
        Some(v) => {
            record(&mut status, ENV_ENABLED_CONTROLLERS, v);
            for name in v.split(',') {
                match name {
                    "workloadendpoint" | "namespace" | "profile" | "policy" | "serviceaccount"
                    | "node" | "loadbalancer" => want(name, &mut c, &mut warnings),
                    "flannelmigration" => {
                        return Err(env_err(
                            ENV_ENABLED_CONTROLLERS,
                            v,
                            "margay has no flannelmigration controller; leave it out",
                        ));
                    }
                    other => {
                        return Err(env_err(
                            ENV_ENABLED_CONTROLLERS,
                            v,
                            format!(
                                "unknown controller {other:?}; use a comma-separated list of node, policy, namespace, serviceaccount, workloadendpoint, loadbalancer"
                            ),
                        ));
                    }
                }
            }
        }
        None => {
            if api.node.is_some() {
                want("node", &mut c, &mut warnings);
            }
            if api.policy.is_some() {
                want("policy", &mut c, &mut warnings);
            }
            if api.workload_endpoint.is_some() {
                want("workloadendpoint", &mut c, &mut warnings);
            }
            if api.service_account.is_some() {
                want("serviceaccount", &mut c, &mut warnings);
            }
            if api.namespace.is_some() {
                want("namespace", &mut c, &mut warnings);
            }
            if api.load_balancer.is_some() {
                want("loadbalancer", &mut c, &mut warnings);
            }
        }
    }
    c.load_balancer = want_lb;

    // Reconciler period from the environment: every enabled mirror controller.
    if let Some(v) = env.get(ENV_RECONCILER_PERIOD) {
        record(&mut status, ENV_RECONCILER_PERIOD, v);
        let d = parse_duration(v).map_err(|e| env_err(ENV_RECONCILER_PERIOD, v, e))?;
        for g in [
            &mut c.policy,
            &mut c.workload_endpoint,
            &mut c.service_account,
            &mut c.namespace,
        ]
        .into_iter()
        .flatten()
        {
            g.reconciler_period = d;
        }
    }

    // etcd compaction.
    let etcd_compaction_period = match env.get(ENV_COMPACTION_PERIOD) {
        Some(v) => {
            record(&mut status, ENV_COMPACTION_PERIOD, v);
            parse_duration(v).map_err(|e| env_err(ENV_COMPACTION_PERIOD, v, e))?
        }
        None => api_period(
            spec.etcd_v3_compaction_period.as_ref(),
            "spec.etcdV3CompactionPeriod",
            DEFAULT_COMPACTION_PERIOD,
            &mut warnings,
        ),
    };
    running.etcd_v3_compaction_period = status_period(etcd_compaction_period);

    // Health.
    let health_enabled = match env.get(ENV_HEALTH_ENABLED) {
        Some(v) => {
            record(&mut status, ENV_HEALTH_ENABLED, v);
            parse_go_bool(v)
                .ok_or_else(|| env_err(ENV_HEALTH_ENABLED, v, "not a boolean; use true or false"))?
        }
        // Unset and anything but Disabled mean enabled (Calico's default).
        None => spec.health_checks != Some(EnabledDisabled::Disabled),
    };
    running.health_checks = Some(if health_enabled {
        EnabledDisabled::Enabled
    } else {
        EnabledDisabled::Disabled
    });

    // Node controller.
    let mut running_node = None;
    if want_node {
        let mut rn = ApiNodeConfig::default();
        let sync_labels = match datastore {
            DatastoreKind::Kubernetes => {
                record(&mut status, ENV_DATASTORE_TYPE, "kubernetes");
                false
            }
            DatastoreKind::Etcd => match env.get(ENV_SYNC_NODE_LABELS) {
                Some(v) => {
                    record(&mut status, ENV_SYNC_NODE_LABELS, v);
                    parse_go_bool(v).ok_or_else(|| {
                        env_err(ENV_SYNC_NODE_LABELS, v, "not a boolean; use true or false")
                    })?
                }
                None => {
                    api.node.as_ref().and_then(|n| n.sync_labels) != Some(EnabledDisabled::Disabled)
                }
            },
        };
        rn.sync_labels = Some(enabled(sync_labels));
        let auto_host_endpoints = match env.get(ENV_AUTO_HOST_ENDPOINTS) {
            Some(v) => {
                record(&mut status, ENV_AUTO_HOST_ENDPOINTS, v);
                match v.to_ascii_lowercase().as_str() {
                    "enabled" => true,
                    "disabled" => false,
                    _ => {
                        return Err(env_err(
                            ENV_AUTO_HOST_ENDPOINTS,
                            v,
                            "use enabled or disabled",
                        ));
                    }
                }
            }
            None => api
                .node
                .as_ref()
                .and_then(|n| n.host_endpoint.as_ref())
                .is_some_and(|h| h.auto_create == Some(EnabledDisabled::Enabled)),
        };
        rn.host_endpoint = Some(AutoHostEndpointConfig {
            auto_create: Some(enabled(auto_host_endpoints)),
            create_default_host_endpoint: Some(EnabledDisabled::Enabled),
            templates: Vec::new(),
        });
        // No variable for this one: always the resource's (unset: no grace-period GC).
        let leak = api.node.as_ref().and_then(|n| n.leak_grace_period.as_ref());
        let leak_grace_period = leak.map(|d| {
            api_period(
                Some(d),
                "spec.controllers.node.leakGracePeriod",
                DEFAULT_LEAK_GRACE_PERIOD,
                &mut warnings,
            )
        });
        rn.leak_grace_period = leak.cloned();
        running_node = Some(rn);
        c.node = Some(NodeControllerConfig {
            sync_labels,
            auto_host_endpoints,
            delete_nodes: datastore == DatastoreKind::Etcd,
            leak_grace_period,
        });
    }

    running.controllers = ControllersConfig {
        node: running_node,
        policy: c.policy.map(reconciler),
        workload_endpoint: c.workload_endpoint.map(reconciler),
        service_account: c.service_account.map(reconciler),
        namespace: c.namespace.map(reconciler),
        load_balancer: c.load_balancer.then(|| LoadBalancerControllerConfig {
            assign_ips: api
                .load_balancer
                .as_ref()
                .and_then(|l| l.assign_ips)
                .or(Some(margay_api::kubecontrollers::AssignIps::AllServices)),
        }),
        migration: None,
    };

    let prometheus_port = match spec.prometheus_metrics_port {
        None | Some(0) => 0,
        Some(p) => match u16::try_from(p) {
            Ok(p) => p,
            Err(_) => {
                warnings.push(format!(
                    "KubeControllersConfiguration default: spec.prometheusMetricsPort {p} is not a port; no metrics server"
                ));
                0
            }
        },
    };
    status.running_config = Some(running);
    Ok(Merged {
        run: RunConfig {
            log_level,
            controllers: c,
            etcd_compaction_period,
            health_enabled,
            prometheus_port,
        },
        status,
        warnings,
    })
}

/// Notes an environment variable in the status, as Calico's status lists the ones it used.
fn record(status: &mut KubeControllersConfigurationStatus, k: &str, v: &str) {
    status.environment_vars.insert(k.to_string(), v.to_string());
}

fn enabled(b: bool) -> EnabledDisabled {
    if b {
        EnabledDisabled::Enabled
    } else {
        EnabledDisabled::Disabled
    }
}

fn reconciler(g: GenericControllerConfig) -> ReconcilerConfig {
    ReconcilerConfig {
        reconciler_period: status_period(g.reconciler_period),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> EnvSettings {
        let m: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        EnvSettings::from_lookup(|k| m.get(k).cloned())
    }

    fn gp(d: u64) -> Option<GenericControllerConfig> {
        Some(GenericControllerConfig {
            reconciler_period: Duration::from_secs(d),
        })
    }

    #[test]
    fn defaults_in_etcd_mode_run_every_controller_as_calico() {
        let m = merge(&env(&[]), DatastoreKind::Etcd, &default_spec()).unwrap();
        assert!(m.warnings.is_empty());
        let r = &m.run;
        assert_eq!(r.log_level, "info");
        assert!(r.health_enabled);
        assert_eq!(r.etcd_compaction_period, Duration::from_secs(600));
        assert_eq!(r.prometheus_port, 0);
        assert_eq!(
            r.controllers.node,
            Some(NodeControllerConfig {
                sync_labels: true,
                auto_host_endpoints: false,
                delete_nodes: true,
                leak_grace_period: Some(Duration::from_secs(900)),
            })
        );
        assert_eq!(r.controllers.policy, gp(300));
        assert_eq!(r.controllers.namespace, gp(300));
        assert_eq!(r.controllers.service_account, gp(300));
        assert_eq!(r.controllers.workload_endpoint, gp(300));
        assert!(r.controllers.load_balancer);
        let rc = m.status.running_config.unwrap();
        assert_eq!(rc.log_severity_screen, "Info");
        assert_eq!(rc.etcd_v3_compaction_period.unwrap().as_str(), "10m0s");
        assert_eq!(
            rc.controllers
                .policy
                .unwrap()
                .reconciler_period
                .unwrap()
                .as_str(),
            "5m0s"
        );
        assert!(m.status.environment_vars.is_empty());
    }

    #[test]
    fn kubernetes_mode_never_syncs_labels_nor_deletes_nodes() {
        let m = merge(
            &env(&[("SYNC_NODE_LABELS", "true")]),
            DatastoreKind::Kubernetes,
            &default_spec(),
        )
        .unwrap();
        let n = m.run.controllers.node.unwrap();
        assert!(!n.sync_labels && !n.delete_nodes);
        assert_eq!(m.status.environment_vars["DATASTORE_TYPE"], "kubernetes");
        // SYNC_NODE_LABELS is not consulted (nor recorded) in Kubernetes mode, as in Calico.
        assert!(!m.status.environment_vars.contains_key("SYNC_NODE_LABELS"));
    }

    #[test]
    fn environment_overrides_the_resource() {
        let mut spec = default_spec();
        spec.log_severity_screen = "Debug".into();
        spec.health_checks = Some(EnabledDisabled::Disabled);
        let m = merge(
            &env(&[
                ("LOG_LEVEL", "warning"),
                ("ENABLED_CONTROLLERS", "node,policy"),
                ("RECONCILER_PERIOD", "1m30s"),
                ("COMPACTION_PERIOD", "0"),
                ("HEALTH_ENABLED", "true"),
                ("SYNC_NODE_LABELS", "false"),
                ("AUTO_HOST_ENDPOINTS", "Enabled"),
            ]),
            DatastoreKind::Etcd,
            &spec,
        )
        .unwrap();
        let r = &m.run;
        assert_eq!(r.log_level, "warn");
        assert!(r.health_enabled);
        assert_eq!(r.etcd_compaction_period, Duration::ZERO);
        assert_eq!(r.controllers.policy, gp(90));
        assert_eq!(r.controllers.namespace, None);
        assert_eq!(r.controllers.workload_endpoint, None);
        assert!(!r.controllers.load_balancer);
        let n = r.controllers.node.clone().unwrap();
        assert!(!n.sync_labels && n.auto_host_endpoints && n.delete_nodes);
        assert_eq!(m.status.environment_vars.len(), 7);
        assert_eq!(
            m.status.running_config.unwrap().log_severity_screen,
            "Warning"
        );
    }

    #[test]
    fn resource_alone_decides_without_environment() {
        let mut spec = default_spec();
        spec.controllers.policy = None;
        spec.controllers.load_balancer = None;
        spec.controllers.namespace = Some(ReconcilerConfig {
            reconciler_period: Some(ApiDuration::new("30s")),
        });
        if let Some(n) = spec.controllers.node.as_mut() {
            n.leak_grace_period = Some(ApiDuration::new("2s"));
            n.sync_labels = Some(EnabledDisabled::Disabled);
        }
        spec.health_checks = Some(EnabledDisabled::Disabled);
        spec.prometheus_metrics_port = Some(9094);
        let m = merge(&env(&[]), DatastoreKind::Etcd, &spec).unwrap();
        let r = &m.run;
        assert_eq!(r.controllers.policy, None);
        assert!(!r.controllers.load_balancer);
        assert_eq!(r.controllers.namespace, gp(30));
        assert!(!r.health_enabled);
        assert_eq!(r.prometheus_port, 9094);
        let n = r.controllers.node.clone().unwrap();
        assert_eq!(n.leak_grace_period, Some(Duration::from_secs(2)));
        assert!(!n.sync_labels);
    }

    #[test]
    fn unset_leak_grace_period_means_no_grace_period_gc() {
        let mut spec = default_spec();
        if let Some(n) = spec.controllers.node.as_mut() {
            n.leak_grace_period = None;
        }
        let m = merge(&env(&[]), DatastoreKind::Kubernetes, &spec).unwrap();
        assert_eq!(m.run.controllers.node.unwrap().leak_grace_period, None);
    }

    #[test]
    fn bad_environment_values_are_errors_naming_the_variable() {
        for (k, v) in [
            ("LOG_LEVEL", "loud"),
            ("ENABLED_CONTROLLERS", "node,ipam"),
            ("ENABLED_CONTROLLERS", "flannelmigration"),
            ("RECONCILER_PERIOD", "5 minutes"),
            ("RECONCILER_PERIOD", "-5m"),
            ("COMPACTION_PERIOD", "x"),
            ("HEALTH_ENABLED", "yes"),
            ("SYNC_NODE_LABELS", "maybe"),
            ("AUTO_HOST_ENDPOINTS", "on"),
        ] {
            let e = merge(&env(&[(k, v)]), DatastoreKind::Etcd, &default_spec()).unwrap_err();
            let text = e.to_string();
            assert!(text.starts_with(&format!("{k}=")), "{text}");
        }
        assert!(DatastoreKind::from_env(Some("local")).is_err());
        assert_eq!(DatastoreKind::from_env(None).unwrap(), DatastoreKind::Etcd);
        assert_eq!(
            DatastoreKind::from_env(Some("Kubernetes")).unwrap(),
            DatastoreKind::Kubernetes
        );
    }

    #[test]
    fn bad_resource_values_are_warnings_and_defaults() {
        let mut spec = default_spec();
        spec.log_severity_screen = "Loud".into();
        spec.etcd_v3_compaction_period = Some(ApiDuration::new("soon"));
        spec.prometheus_metrics_port = Some(70000);
        if let Some(n) = spec.controllers.node.as_mut() {
            n.leak_grace_period = Some(ApiDuration::new("-1s"));
        }
        let m = merge(&env(&[]), DatastoreKind::Etcd, &spec).unwrap();
        assert_eq!(m.warnings.len(), 4, "{:?}", m.warnings);
        assert_eq!(m.run.log_level, "info");
        assert_eq!(m.run.etcd_compaction_period, DEFAULT_COMPACTION_PERIOD);
        assert_eq!(m.run.prometheus_port, 0);
        assert_eq!(
            m.run.controllers.node.unwrap().leak_grace_period,
            Some(DEFAULT_LEAK_GRACE_PERIOD)
        );
    }

    #[test]
    fn go_durations_print_as_go_prints_them() {
        for (secs, nanos, want) in [
            (0, 0, "0s"),
            (300, 0, "5m0s"),
            (900, 0, "15m0s"),
            (3600, 0, "1h0m0s"),
            (5430, 0, "1h30m30s"),
            (1, 500_000_000, "1.5s"),
            (0, 300_000_000, "300ms"),
            (0, 1_500, "1.5µs"),
            (0, 7, "7ns"),
        ] {
            assert_eq!(go_duration_string(Duration::new(secs, nanos)), want);
            assert_eq!(
                parse_duration(want).unwrap(),
                Duration::new(secs, nanos),
                "{want}"
            );
        }
    }

    #[test]
    fn go_bools() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Some(true));
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Some(false));
        }
        assert_eq!(parse_go_bool("yes"), None);
        assert_eq!(parse_go_bool("tRUE"), None);
    }

    proptest::proptest! {
        /// Any duration round-trips through Go's spelling.
        #[test]
        fn go_duration_round_trip(n in 0u64..(1u64 << 50)) {
            let d = Duration::from_nanos(n);
            proptest::prop_assert_eq!(parse_duration(&go_duration_string(d)).unwrap(), d);
        }

        /// Whatever the environment holds, merging never panics, and an error always names one
        /// of the variables.
        #[test]
        fn merge_never_panics(vals in proptest::collection::vec("[a-z0-9,.:-]{0,12}", 7)) {
            let e = EnvSettings {
                vars: ALL_ENVS.iter().zip(vals).map(|(k, v)| (k.to_string(), v)).collect(),
            };
            for ds in [DatastoreKind::Etcd, DatastoreKind::Kubernetes] {
                if let Err(ConfigError::Env { var, .. }) = merge(&e, ds, &default_spec()) {
                    proptest::prop_assert!(ALL_ENVS.contains(&var));
                }
            }
        }
    }
}
