//! Typha's configuration (pure): Calico's parameter names and defaults, read from `TYPHA_*`
//! environment variables (case-insensitive) over `/etc/calico/typha.cfg` (INI, sections
//! flattened) over the defaults. margay's own additions are marked as such.

use std::collections::BTreeMap;
use std::time::Duration;

/// Typha's port (Calico's syncserver default).
pub const DEFAULT_PORT: u16 = 5473;
pub const DEFAULT_CONFIG_FILE: &str = "/etc/calico/typha.cfg";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid Typha configuration: {param}={value:?} (from {source_name}): {reason}")]
pub struct ConfigError {
    pub param: &'static str,
    pub value: String,
    pub source_name: String,
    pub reason: String,
}

/// How the connection limit is decided (Calico's ConnectionRebalancingMode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RebalancingMode {
    /// Fixed at start-up: MaxConnections, or Calico's formula over ClusterNodes/Replicas,
    /// else the upper limit.
    #[default]
    None,
    /// Recomputed every K8sServicePollIntervalSecs from the Typhas in Typha's Service and the
    /// nodes its syncer sees.
    Kubernetes,
}

impl RebalancingMode {
    pub fn name(self) -> &'static str {
        match self {
            RebalancingMode::None => "none",
            RebalancingMode::Kubernetes => "kubernetes",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TyphaConfig {
    pub log_severity_screen: String,
    /// LogFilePath (empty: no log file; Calico's default /var/log/calico/typha.log).
    pub log_file_path: String,
    pub log_severity_file: String,
    pub health_enabled: bool,
    pub health_host: String,
    pub health_port: u16,
    pub prometheus_metrics_enabled: bool,
    pub prometheus_metrics_host: String,
    pub prometheus_metrics_port: u16,
    pub snapshot_cache_max_batch_size: usize,
    pub server_max_message_size: usize,
    pub server_max_fall_behind: Duration,
    pub server_new_client_fall_behind_grace_period: Duration,
    pub server_min_batching_age: Duration,
    pub server_ping_interval: Duration,
    pub server_pong_timeout: Duration,
    pub server_handshake_timeout: Duration,
    pub server_write_timeout: Duration,
    pub server_port: u16,
    pub server_host: String,
    pub server_key_file: String,
    pub server_cert_file: String,
    pub ca_file: String,
    pub client_cn: String,
    pub client_uri_san: String,
    pub connection_drop_interval: Duration,
    pub shutdown_timeout: Duration,
    pub max_connections_upper_limit: usize,
    pub max_connections_lower_limit: usize,
    /// ConnectionRebalancingMode: `none` or `kubernetes`.
    pub connection_rebalancing_mode: RebalancingMode,
    /// K8sServicePollIntervalSecs: how often the kubernetes mode recomputes the limit.
    pub k8s_service_poll_interval: Duration,
    /// K8sServiceName, K8sNamespace, K8sPortName: Typha's own Service and port, whose
    /// EndpointSlices the kubernetes mode counts.
    pub k8s_service_name: String,
    pub k8s_namespace: String,
    pub k8s_port_name: String,
    /// margay: a fixed connection limit; wins over every other way of deciding it (0: Calico's
    /// formula: from Kubernetes in the kubernetes mode, else when the cluster size is known,
    /// else the upper limit).
    pub max_connections: usize,
    /// margay: nodes in the cluster, for Calico's formula (0: unknown).
    pub cluster_nodes: usize,
    /// margay: Typha replicas, for Calico's formula (0: unknown).
    pub typha_replicas: usize,
    /// margay: how long a client asked to migrate has to move before the connection is closed.
    pub migration_grace: Duration,
    /// margay: the maximum frame a client may send (Calico: 1 MiB).
    pub server_max_inbound_bytes: usize,
    /// margay: the syncer types served (`felix`, `bgp`).
    pub syncer_types: Vec<String>,
    /// margay: connections that may be without a hello (TLS handshake included) at once;
    /// a new one closes the oldest.
    pub server_max_pending_handshakes: usize,
}

/// The longest duration any `*Secs` setting may have (one year): every deadline computed
/// from one stays far from overflowing a clock.
pub const MAX_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// The process environment as text. An entry whose name or value is not UTF-8 cannot be a
/// setting anyone meant; it is left out and its name (lossily) returned, for a warning.
pub fn env_from_os(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> (BTreeMap<String, String>, Vec<String>) {
    let mut env = BTreeMap::new();
    let mut skipped = Vec::new();
    for (k, v) in vars {
        match (k.into_string(), v.into_string()) {
            (Ok(k), Ok(v)) => {
                env.insert(k, v);
            }
            (Ok(k), Err(_)) => skipped.push(k),
            (Err(k), _) => skipped.push(k.to_string_lossy().into_owned()),
        }
    }
    (env, skipped)
}

impl Default for TyphaConfig {
    fn default() -> Self {
        TyphaConfig {
            log_severity_screen: "INFO".into(),
            log_file_path: "/var/log/calico/typha.log".into(),
            log_severity_file: "INFO".into(),
            health_enabled: false,
            health_host: "localhost".into(),
            health_port: 9098,
            prometheus_metrics_enabled: false,
            prometheus_metrics_host: String::new(),
            prometheus_metrics_port: 9093,
            snapshot_cache_max_batch_size: 100,
            server_max_message_size: 100,
            server_max_fall_behind: Duration::from_secs(300),
            server_new_client_fall_behind_grace_period: Duration::from_secs(300),
            server_min_batching_age: Duration::from_millis(10),
            server_ping_interval: Duration::from_secs(10),
            server_pong_timeout: Duration::from_secs(60),
            server_handshake_timeout: Duration::from_secs(10),
            server_write_timeout: Duration::from_secs(120),
            server_port: DEFAULT_PORT,
            server_host: String::new(),
            server_key_file: String::new(),
            server_cert_file: String::new(),
            ca_file: String::new(),
            client_cn: String::new(),
            client_uri_san: String::new(),
            connection_drop_interval: Duration::from_secs(1),
            shutdown_timeout: Duration::from_secs(300),
            max_connections_upper_limit: 10_000,
            max_connections_lower_limit: 400,
            connection_rebalancing_mode: RebalancingMode::None,
            k8s_service_poll_interval: Duration::from_secs(30),
            k8s_service_name: crate::discovery::DEFAULT_SERVICE_NAME.into(),
            k8s_namespace: crate::discovery::DEFAULT_NAMESPACE.into(),
            k8s_port_name: crate::discovery::DEFAULT_PORT_NAME.into(),
            max_connections: 0,
            cluster_nodes: 0,
            typha_replicas: 0,
            migration_grace: Duration::from_secs(30),
            server_max_inbound_bytes: crate::proto::DEFAULT_MAX_SERVER_INBOUND,
            syncer_types: vec!["felix".into(), "bgp".into()],
            server_max_pending_handshakes: 256,
        }
    }
}

/// Calico's connection limit: max(lower, syncerTypes × (1 + nodes×120/(typhas−1)/100)),
/// capped at `upper`. With one Typha (or an unknown size: no nodes) the limit is `upper`.
pub fn connection_limit(
    syncer_types: usize,
    nodes: usize,
    typhas: usize,
    lower: usize,
    upper: usize,
) -> usize {
    if nodes == 0 {
        return upper;
    }
    rebalanced_limit(syncer_types, Some(nodes), Some(typhas), lower, upper).0
}

/// Calico's limit from what the Kubernetes poll found, and why (for the log). `None` where it
/// could not be found out (an API error; a syncer not yet in sync): the upper limit. One Typha
/// or none: the upper limit. Otherwise the fair share of the connections
/// (`syncer_types` per node) among the other Typhas, as if one were gone, plus 20%, at least
/// `lower` and at most `upper`; the arithmetic is Calico's (integer division, in this order).
///
/// `syncer_types` is the number of connections a node opens: one per syncer type. Calico
/// passes 4, every type it has, since each calico-node opens one of each; margay's nodes open
/// one per type Typha serves (felix and bgp), and counting 4 would let every Typha take twice
/// its share before rebalancing started.
pub fn rebalanced_limit(
    syncer_types: usize,
    nodes: Option<usize>,
    typhas: Option<usize>,
    lower: usize,
    upper: usize,
) -> (usize, &'static str) {
    let (Some(nodes), Some(typhas)) = (nodes, typhas) else {
        return (upper, "cluster size unknown");
    };
    if typhas <= 1 {
        return (upper, "lone Typha");
    }
    // Saturating: ClusterNodes comes from configuration, and no value may panic.
    let per_type = nodes.saturating_mul(120) / (typhas - 1) / 100 + 1;
    let candidate = syncer_types.saturating_mul(per_type);
    if candidate > upper {
        (upper, "configured upper limit")
    } else if candidate > lower {
        (candidate, "fair share + 20%")
    } else {
        (lower.min(upper), "configured lower limit")
    }
}

impl TyphaConfig {
    /// The connection limit at start-up (in the kubernetes mode the poll changes it later,
    /// starting from the upper limit, as Calico does).
    pub fn connection_limit(&self) -> usize {
        if self.max_connections > 0 {
            return self.max_connections;
        }
        if self.connection_rebalancing_mode == RebalancingMode::Kubernetes {
            return self.max_connections_upper_limit;
        }
        connection_limit(
            self.syncer_types.len(),
            self.cluster_nodes,
            self.typha_replicas,
            self.max_connections_lower_limit,
            self.max_connections_upper_limit,
        )
    }

    /// Whether TLS is configured (all of key, cert, CA and CN or URI SAN).
    pub fn tls_configured(&self) -> bool {
        !self.server_key_file.is_empty()
    }

    /// Loads from the environment (`TYPHA_*`) over the config file's text over the defaults.
    pub fn load(
        env: &BTreeMap<String, String>,
        file_text: Option<&str>,
    ) -> Result<TyphaConfig, ConfigError> {
        let mut raw: BTreeMap<String, (String, String)> = BTreeMap::new();
        if let Some(text) = file_text {
            for line in text.lines() {
                let line = line.trim();
                if line.is_empty() || line.starts_with(['#', ';', '[']) {
                    continue;
                }
                if let Some((k, v)) = line.split_once('=') {
                    raw.insert(
                        k.trim().to_ascii_lowercase(),
                        (v.trim().to_string(), "config file".into()),
                    );
                }
            }
        }
        for (k, v) in env {
            // `get`, not indexing: byte 6 may be inside a multi-byte character.
            if let (Some(prefix), Some(name)) = (k.get(..6), k.get(6..))
                && !name.is_empty()
                && prefix.eq_ignore_ascii_case("TYPHA_")
            {
                raw.insert(
                    name.to_ascii_lowercase(),
                    (v.clone(), format!("environment variable {k}")),
                );
            }
        }
        let mut c = TyphaConfig::default();
        for (name, (value, source)) in &raw {
            if value.is_empty() {
                continue;
            }
            c.set(name, value).map_err(|(param, reason)| ConfigError {
                param,
                value: value.clone(),
                source_name: source.clone(),
                reason,
            })?;
        }
        c.check()?;
        Ok(c)
    }

    fn set(&mut self, name: &str, v: &str) -> Result<(), (&'static str, String)> {
        fn secs(p: &'static str, v: &str) -> Result<Duration, (&'static str, String)> {
            let s = v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .ok_or((p, "expected a number of seconds".to_string()))?;
            if s > MAX_SECS {
                return Err((p, format!("at most {MAX_SECS} seconds (one year)")));
            }
            Duration::try_from_secs_f64(s).map_err(|e| (p, e.to_string()))
        }
        // A zero interval would panic a timer; a zero timeout would drop every client.
        fn positive_secs(p: &'static str, v: &str) -> Result<Duration, (&'static str, String)> {
            let d = secs(p, v)?;
            if d.is_zero() {
                return Err((p, "expected a number of seconds greater than 0".into()));
            }
            Ok(d)
        }
        fn num(p: &'static str, v: &str, min: usize) -> Result<usize, (&'static str, String)> {
            v.parse::<usize>()
                .ok()
                .filter(|n| *n >= min)
                .ok_or((p, format!("expected a whole number of at least {min}")))
        }
        fn port(p: &'static str, v: &str) -> Result<u16, (&'static str, String)> {
            v.parse::<u16>()
                .map_err(|_| (p, "expected a port number (0-65535)".to_string()))
        }
        fn boolean(p: &'static str, v: &str) -> Result<bool, (&'static str, String)> {
            match v.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "y" | "t" => Ok(true),
                "false" | "0" | "no" | "n" | "f" => Ok(false),
                _ => Err((p, "expected true or false".into())),
            }
        }
        match name {
            "logseverityscreen" => self.log_severity_screen = v.to_string(),
            "logfilepath" => {
                self.log_file_path = if v.trim().eq_ignore_ascii_case("none") {
                    String::new()
                } else {
                    v.trim().to_string()
                }
            }
            "logseverityfile" => self.log_severity_file = v.to_string(),
            "healthenabled" => self.health_enabled = boolean("HealthEnabled", v)?,
            "healthhost" => self.health_host = v.to_string(),
            "healthport" => self.health_port = port("HealthPort", v)?,
            "prometheusmetricsenabled" => {
                self.prometheus_metrics_enabled = boolean("PrometheusMetricsEnabled", v)?
            }
            "prometheusmetricshost" => self.prometheus_metrics_host = v.to_string(),
            "prometheusmetricsport" => {
                self.prometheus_metrics_port = port("PrometheusMetricsPort", v)?
            }
            "snapshotcachemaxbatchsize" => {
                self.snapshot_cache_max_batch_size = num("SnapshotCacheMaxBatchSize", v, 1)?
            }
            "servermaxmessagesize" => {
                self.server_max_message_size = num("ServerMaxMessageSize", v, 1)?
            }
            "servermaxfallbehindsecs" => {
                self.server_max_fall_behind = secs("ServerMaxFallBehindSecs", v)?
            }
            "servernewclientfallbehindgraceperiod" => {
                self.server_new_client_fall_behind_grace_period =
                    secs("ServerNewClientFallBehindGracePeriod", v)?
            }
            "serverminbatchingagethresholdsecs" => {
                self.server_min_batching_age = secs("ServerMinBatchingAgeThresholdSecs", v)?
            }
            "serverpingintervalsecs" => {
                self.server_ping_interval = positive_secs("ServerPingIntervalSecs", v)?
            }
            "serverpongtimeoutsecs" => {
                self.server_pong_timeout = positive_secs("ServerPongTimeoutSecs", v)?
            }
            "serverhandshaketimeoutsecs" => {
                self.server_handshake_timeout = positive_secs("ServerHandshakeTimeoutSecs", v)?
            }
            "serverwritetimeoutsecs" => {
                self.server_write_timeout = positive_secs("ServerWriteTimeoutSecs", v)?
            }
            "serverport" => {
                let p = port("ServerPort", v)?;
                self.server_port = if p == 0 { DEFAULT_PORT } else { p };
            }
            "serverhost" => self.server_host = v.to_string(),
            "serverkeyfile" => self.server_key_file = v.to_string(),
            "servercertfile" => self.server_cert_file = v.to_string(),
            "cafile" => self.ca_file = v.to_string(),
            "clientcn" => self.client_cn = v.to_string(),
            "clienturisan" => self.client_uri_san = v.to_string(),
            "connectiondropintervalsecs" => {
                self.connection_drop_interval = secs("ConnectionDropIntervalSecs", v)?
            }
            "shutdowntimeoutsecs" => self.shutdown_timeout = secs("ShutdownTimeoutSecs", v)?,
            "maxconnectionsupperlimit" => {
                self.max_connections_upper_limit = num("MaxConnectionsUpperLimit", v, 1)?
            }
            "maxconnectionslowerlimit" => {
                self.max_connections_lower_limit = num("MaxConnectionsLowerLimit", v, 1)?
            }
            "maxconnections" => self.max_connections = num("MaxConnections", v, 0)?,
            "connectionrebalancingmode" => {
                self.connection_rebalancing_mode = match v.trim().to_ascii_lowercase().as_str() {
                    "none" => RebalancingMode::None,
                    "kubernetes" => RebalancingMode::Kubernetes,
                    _ => {
                        return Err((
                            "ConnectionRebalancingMode",
                            "expected none or kubernetes".into(),
                        ));
                    }
                }
            }
            "k8sservicepollintervalsecs" => {
                self.k8s_service_poll_interval = positive_secs("K8sServicePollIntervalSecs", v)?
            }
            "k8sservicename" => self.k8s_service_name = v.trim().to_string(),
            "k8snamespace" => self.k8s_namespace = v.trim().to_string(),
            "k8sportname" => self.k8s_port_name = v.trim().to_string(),
            "clusternodes" => self.cluster_nodes = num("ClusterNodes", v, 0)?,
            "replicas" => self.typha_replicas = num("Replicas", v, 0)?,
            "migrationgracesecs" => self.migration_grace = secs("MigrationGraceSecs", v)?,
            "servermaxinboundbytes" => {
                self.server_max_inbound_bytes = num("ServerMaxInboundBytes", v, 1024)?
            }
            "servermaxpendinghandshakes" => {
                self.server_max_pending_handshakes = num("ServerMaxPendingHandshakes", v, 1)?
            }
            "syncertypes" => {
                let types: Vec<String> = v
                    .split(',')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .filter(|s| !s.is_empty())
                    .collect();
                if let Some(bad) = types
                    .iter()
                    .find(|t| crate::syncers::SyncerType::parse(t).is_none())
                {
                    return Err((
                        "SyncerTypes",
                        format!("unknown syncer type {bad:?} (margay serves felix and bgp)"),
                    ));
                }
                self.syncer_types = types;
            }
            // Parameters of Calico's Typha that margay accepts and does not act on
            // (the datastore comes from DATASTORE_TYPE / ETCD_*, as for every role).
            _ => {
                tracing::debug!(
                    param = name,
                    "ignoring a Typha parameter margay does not use"
                );
            }
        }
        Ok(())
    }

    /// What to warn about when serving plain TCP where other machines can reach it (None:
    /// TLS is on, or the address is loopback only).
    pub fn plaintext_warning(&self) -> Option<String> {
        if self.tls_configured() {
            return None;
        }
        let host = self
            .server_host
            .trim()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|a| a.is_loopback());
        if loopback {
            return None;
        }
        let on = if host.is_empty() {
            "every address"
        } else {
            host
        };
        Some(format!(
            "Typha serves plain TCP (no TLS) on {on}, port {}: anyone who can reach it can read              every policy, endpoint and IPAM block it serves and connect as a client. Set              TYPHA_SERVERKEYFILE, TYPHA_SERVERCERTFILE, TYPHA_CAFILE and TYPHA_CLIENTCN (or              TYPHA_CLIENTURISAN) for mutual TLS, or TYPHA_SERVERHOST=127.0.0.1 for local clients only",
            self.server_port
        ))
    }

    /// All-or-none TLS, with errors that say what is missing.
    fn check(&self) -> Result<(), ConfigError> {
        let parts = [
            ("ServerKeyFile", &self.server_key_file),
            ("ServerCertFile", &self.server_cert_file),
            ("CAFile", &self.ca_file),
        ];
        let any = parts.iter().any(|(_, v)| !v.is_empty())
            || !self.client_cn.is_empty()
            || !self.client_uri_san.is_empty();
        if !any {
            return Ok(());
        }
        let missing: Vec<&str> = parts
            .iter()
            .filter(|(_, v)| v.is_empty())
            .map(|(n, _)| *n)
            .collect();
        if !missing.is_empty() || (self.client_cn.is_empty() && self.client_uri_san.is_empty()) {
            let mut what: Vec<String> = missing.iter().map(|s| s.to_string()).collect();
            if self.client_cn.is_empty() && self.client_uri_san.is_empty() {
                what.push("ClientCN or ClientURISAN".into());
            }
            return Err(ConfigError {
                param: "ServerKeyFile/ServerCertFile/CAFile/ClientCN/ClientURISAN",
                value: String::new(),
                source_name: "TLS settings".into(),
                reason: format!(
                    "TLS needs all of ServerKeyFile, ServerCertFile, CAFile and ClientCN or \
                     ClientURISAN; missing: {} (set TYPHA_{} or unset every TLS setting)",
                    what.join(", "),
                    what.first()
                        .map(|s| s.split(' ').next().unwrap_or_default().to_ascii_uppercase())
                        .unwrap_or_default()
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_calicos() {
        let c = TyphaConfig::load(&BTreeMap::new(), None).unwrap();
        assert_eq!(c.server_port, 5473);
        assert_eq!(c.health_port, 9098);
        assert_eq!(c.prometheus_metrics_port, 9093);
        assert_eq!(c.server_max_message_size, 100);
        assert_eq!(c.server_ping_interval, Duration::from_secs(10));
        assert_eq!(c.server_pong_timeout, Duration::from_secs(60));
        assert_eq!(c.server_handshake_timeout, Duration::from_secs(10));
        assert_eq!(c.server_write_timeout, Duration::from_secs(120));
        assert_eq!(c.server_min_batching_age, Duration::from_millis(10));
        assert_eq!(c.server_max_fall_behind, Duration::from_secs(300));
        assert_eq!(c.shutdown_timeout, Duration::from_secs(300));
        assert_eq!(c.server_max_inbound_bytes, 1 << 20);
        assert_eq!(c.connection_limit(), 10_000);
    }

    #[test]
    fn hostile_settings_are_errors_not_panics() {
        // A multi-byte character across byte 6 of the name: not a Typha variable, no panic.
        let c = TyphaConfig::load(&env(&[("TYPHAé_X", "1"), ("TYPHA_", "1")]), None).unwrap();
        assert_eq!(c, TyphaConfig::default());
        for (k, v, param) in [
            ("TYPHA_SHUTDOWNTIMEOUTSECS", "1e300", "ShutdownTimeoutSecs"),
            (
                "TYPHA_SERVERMAXFALLBEHINDSECS",
                "18446744073709551616",
                "ServerMaxFallBehindSecs",
            ),
            ("TYPHA_MIGRATIONGRACESECS", "31536001", "MigrationGraceSecs"),
            (
                "TYPHA_SERVERPINGINTERVALSECS",
                "0",
                "ServerPingIntervalSecs",
            ),
            (
                "TYPHA_SERVERPONGTIMEOUTSECS",
                "0.0",
                "ServerPongTimeoutSecs",
            ),
            (
                "TYPHA_SERVERHANDSHAKETIMEOUTSECS",
                "0",
                "ServerHandshakeTimeoutSecs",
            ),
            (
                "TYPHA_SERVERWRITETIMEOUTSECS",
                "0",
                "ServerWriteTimeoutSecs",
            ),
            (
                "TYPHA_SERVERPINGINTERVALSECS",
                "NaN",
                "ServerPingIntervalSecs",
            ),
            (
                "TYPHA_SERVERMAXPENDINGHANDSHAKES",
                "0",
                "ServerMaxPendingHandshakes",
            ),
        ] {
            let e = TyphaConfig::load(&env(&[(k, v)]), None).unwrap_err();
            assert_eq!(e.param, param, "{k}={v}");
            assert!(e.to_string().contains(k), "{e}");
        }
        let c =
            TyphaConfig::load(&env(&[("TYPHA_SHUTDOWNTIMEOUTSECS", "31536000")]), None).unwrap();
        assert_eq!(c.shutdown_timeout, Duration::from_secs(31_536_000));
    }

    #[test]
    fn non_utf8_environment_entries_are_skipped_and_named() {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt;
        let vars = vec![
            (OsString::from("TYPHA_SERVERPORT"), OsString::from("6000")),
            (
                OsString::from("TYPHA_HEALTHHOST"),
                OsString::from_vec(vec![0xff, b'x']),
            ),
            (
                OsString::from_vec(b"TYPHA_\xfe".to_vec()),
                OsString::from("1"),
            ),
            (OsString::from_vec(vec![b'T', 0xfe]), OsString::from("1")),
        ];
        let (env, skipped) = env_from_os(vars);
        assert_eq!(env.len(), 1, "{env:?}");
        assert_eq!(skipped, ["TYPHA_HEALTHHOST", "TYPHA_\u{fffd}", "T\u{fffd}"]);
        let c = TyphaConfig::load(&env, None).unwrap();
        assert_eq!(c.server_port, 6000);
    }

    #[test]
    fn plain_tcp_beyond_loopback_is_warned_about() {
        let plain = TyphaConfig::default();
        let w = plain.plaintext_warning().unwrap();
        assert!(
            w.contains("every address") && w.contains("TYPHA_SERVERKEYFILE"),
            "{w}"
        );
        for host in ["127.0.0.1", "::1", "[::1]", "localhost"] {
            let c = TyphaConfig {
                server_host: host.into(),
                ..TyphaConfig::default()
            };
            assert_eq!(c.plaintext_warning(), None, "{host}");
        }
        let c = TyphaConfig {
            server_host: "10.0.0.5".into(),
            ..TyphaConfig::default()
        };
        assert!(
            c.plaintext_warning()
                .unwrap()
                .contains("on 10.0.0.5, port 5473")
        );
        let tls = TyphaConfig {
            server_key_file: "k".into(),
            ..TyphaConfig::default()
        };
        assert_eq!(tls.plaintext_warning(), None);
    }

    #[test]
    fn environment_beats_file() {
        let file = "[global]\nServerPort = 6000\nHealthEnabled = true\n";
        let c = TyphaConfig::load(&env(&[("typha_serverport", "7000")]), Some(file)).unwrap();
        assert_eq!(c.server_port, 7000);
        assert!(c.health_enabled);
        let e = TyphaConfig::load(&env(&[("TYPHA_HEALTHPORT", "x")]), None).unwrap_err();
        assert!(e.to_string().contains("HealthPort"), "{e}");
        assert!(e.to_string().contains("TYPHA_HEALTHPORT"), "{e}");
    }

    #[test]
    fn tls_is_all_or_none() {
        let e = TyphaConfig::load(
            &env(&[("TYPHA_SERVERKEYFILE", "/k"), ("TYPHA_CAFILE", "/ca")]),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("ServerCertFile") && e.contains("ClientCN"),
            "{e}"
        );
        let c = TyphaConfig::load(
            &env(&[
                ("TYPHA_SERVERKEYFILE", "/k"),
                ("TYPHA_SERVERCERTFILE", "/c"),
                ("TYPHA_CAFILE", "/ca"),
                ("TYPHA_CLIENTCN", "felix"),
            ]),
            None,
        )
        .unwrap();
        assert!(c.tls_configured());
    }

    #[test]
    fn calicos_connection_formula() {
        // 1000 nodes, 3 typhas, 2 syncer types: 2 × (1 + 1000×120/2/100) = 1202.
        assert_eq!(connection_limit(2, 1000, 3, 400, 10_000), 1202);
        assert_eq!(connection_limit(2, 10, 3, 400, 10_000), 400);
        assert_eq!(connection_limit(2, 100_000, 3, 400, 10_000), 10_000);
        assert_eq!(connection_limit(2, 1000, 1, 400, 10_000), 10_000);
        // Configuration cannot make it overflow.
        assert_eq!(connection_limit(2, usize::MAX, 3, 400, 10_000), 10_000);
    }

    #[test]
    fn rebalanced_limit_table() {
        // (syncer types, nodes, typhas, lower, upper) → limit, as Calico computes it.
        type Case = (usize, Option<usize>, Option<usize>, usize, usize, usize);
        let cases: &[Case] = &[
            // Unknown (API error, syncer not in sync): the upper limit.
            (2, None, Some(3), 400, 10_000, 10_000),
            (2, Some(1000), None, 400, 10_000, 10_000),
            // One Typha, or none in the service: the upper limit.
            (2, Some(1000), Some(1), 400, 10_000, 10_000),
            (2, Some(1000), Some(0), 400, 10_000, 10_000),
            // Calico's own examples of the formula: 4 × (1 + 1000×120/2/100) = 2404.
            (4, Some(1000), Some(3), 400, 10_000, 2404),
            (2, Some(1000), Some(3), 400, 10_000, 1202),
            // Integer maths in Calico's order: 2 × (1 + 3×120/1/100) = 2 × 4.
            (2, Some(3), Some(2), 1, 10_000, 8),
            (2, Some(3), Some(3), 1, 10_000, 4),
            // No nodes yet (but known): the lower limit.
            (2, Some(0), Some(3), 400, 10_000, 400),
            (2, Some(0), Some(3), 1, 10_000, 2),
            // Clamped.
            (2, Some(1_000_000), Some(2), 400, 10_000, 10_000),
            (2, Some(10), Some(3), 400, 10_000, 400),
            (2, Some(10), Some(3), 500, 300, 300),
        ];
        for &(s, n, t, lower, upper, want) in cases {
            assert_eq!(
                rebalanced_limit(s, n, t, lower, upper).0,
                want,
                "S={s} N={n:?} T={t:?} [{lower}, {upper}]"
            );
        }
    }

    #[test]
    fn rebalancing_settings() {
        let c = TyphaConfig::load(&BTreeMap::new(), None).unwrap();
        assert_eq!(c.connection_rebalancing_mode, RebalancingMode::None);
        assert_eq!(c.k8s_service_poll_interval, Duration::from_secs(30));
        assert_eq!(
            (
                c.k8s_service_name.as_str(),
                c.k8s_namespace.as_str(),
                c.k8s_port_name.as_str()
            ),
            ("calico-typha", "kube-system", "calico-typha")
        );
        let file = "[global]\nConnectionRebalancingMode = Kubernetes\nK8sServiceName = typha\n";
        let c = TyphaConfig::load(
            &env(&[
                ("TYPHA_K8SSERVICEPOLLINTERVALSECS", "2.5"),
                ("TYPHA_K8SNAMESPACE", "calico-system"),
                ("TYPHA_K8SPORTNAME", "typha-port"),
                ("TYPHA_MAXCONNECTIONSUPPERLIMIT", "5000"),
            ]),
            Some(file),
        )
        .unwrap();
        assert_eq!(c.connection_rebalancing_mode, RebalancingMode::Kubernetes);
        assert_eq!(c.k8s_service_poll_interval, Duration::from_millis(2500));
        assert_eq!(c.k8s_service_name, "typha");
        assert_eq!(c.k8s_namespace, "calico-system");
        assert_eq!(c.k8s_port_name, "typha-port");
        // The kubernetes mode starts from the upper limit; MaxConnections still wins.
        assert_eq!(c.connection_limit(), 5000);
        let c = TyphaConfig::load(
            &env(&[
                ("TYPHA_CONNECTIONREBALANCINGMODE", "kubernetes"),
                ("TYPHA_MAXCONNECTIONS", "7"),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(c.connection_limit(), 7);

        let e = TyphaConfig::load(&env(&[("TYPHA_CONNECTIONREBALANCINGMODE", "k8s")]), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ConnectionRebalancingMode") && e.contains("none or kubernetes"),
            "{e}"
        );
        let e = TyphaConfig::load(&env(&[("TYPHA_K8SSERVICEPOLLINTERVALSECS", "0")]), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("K8sServicePollIntervalSecs"), "{e}");
    }
}
