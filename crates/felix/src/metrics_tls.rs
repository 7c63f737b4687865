//! The metrics endpoint over TLS (PrometheusMetricsCertFile, PrometheusMetricsKeyFile,
//! PrometheusMetricsCAFile, PrometheusMetricsClientAuth), as Calico serves it: HTTPS as soon
//! as a certificate or key is set; client certificates asked for as the client-auth mode says
//! (Go's `tls.ClientAuthType` names) and checked against the CA bundle; the files are read
//! again for every connection (by `margay-daemon-http`'s server), so rotated certificates are
//! used without a restart.

use std::sync::Arc;

use margay_daemon_http::tls::{Settings, TlsError, TlsFiles, TlsSource};
use margay_felix_config::Config;

pub use margay_daemon_http::ClientAuth;

/// The names of Felix's settings, for error messages.
const SETTINGS: Settings = Settings {
    cert_file: "PrometheusMetricsCertFile",
    key_file: "PrometheusMetricsKeyFile",
    ca_file: "PrometheusMetricsCAFile",
};
const CLIENT_AUTH: &str = "PrometheusMetricsClientAuth";

/// The metrics server's TLS settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsTls {
    pub cert_file: String,
    pub key_file: String,
    pub ca_file: String,
    pub client_auth: ClientAuth,
}

impl MetricsTls {
    /// The TLS settings, when Felix's configuration asks for HTTPS (a certificate or key is
    /// set); an unusable combination is an error saying what to set.
    pub fn from_config(c: &Config) -> Result<Option<MetricsTls>, String> {
        if c.prometheus_metrics_cert_file.is_empty() && c.prometheus_metrics_key_file.is_empty() {
            return Ok(None);
        }
        if c.prometheus_metrics_cert_file.is_empty() || c.prometheus_metrics_key_file.is_empty() {
            return Err("metrics over TLS need both PrometheusMetricsCertFile and \
                 PrometheusMetricsKeyFile"
                .into());
        }
        let client_auth =
            ClientAuth::parse(&c.prometheus_metrics_client_auth, CLIENT_AUTH).map_err(|e| e.0)?;
        if client_auth.verifies() && c.prometheus_metrics_ca_file.is_empty() {
            return Err(format!(
                "PrometheusMetricsClientAuth {} verifies client certificates: set \
                 PrometheusMetricsCAFile to the CA bundle that signs them",
                c.prometheus_metrics_client_auth
            ));
        }
        Ok(Some(MetricsTls {
            cert_file: c.prometheus_metrics_cert_file.clone(),
            key_file: c.prometheus_metrics_key_file.clone(),
            ca_file: c.prometheus_metrics_ca_file.clone(),
            client_auth,
        }))
    }

    /// The files, for the shared server (which reads them for every connection).
    pub fn files(&self) -> TlsFiles {
        TlsFiles {
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            ca_file: self.ca_file.clone(),
            client_auth: self.client_auth,
            settings: SETTINGS,
        }
    }

    /// A server configuration from the files as they are now.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, String> {
        self.files().load().map_err(|e| e.0)
    }
}

impl TlsSource for MetricsTls {
    fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        self.files().load()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cfg(f: impl FnOnce(&mut Config)) -> Config {
        let mut c = Config::defaults().clone();
        f(&mut c);
        c
    }

    #[test]
    fn tls_is_on_when_a_certificate_or_key_is_set() {
        assert_eq!(MetricsTls::from_config(&cfg(|_| {})), Ok(None));
        let e = MetricsTls::from_config(&cfg(|c| c.prometheus_metrics_cert_file = "c".into()))
            .unwrap_err();
        assert!(e.contains("PrometheusMetricsKeyFile"), "{e}");
        let t = MetricsTls::from_config(&cfg(|c| {
            c.prometheus_metrics_cert_file = "c".into();
            c.prometheus_metrics_key_file = "k".into();
        }))
        .unwrap()
        .unwrap();
        assert_eq!(t.client_auth, ClientAuth::NoClientCert);
        let e = MetricsTls::from_config(&cfg(|c| {
            c.prometheus_metrics_cert_file = "c".into();
            c.prometheus_metrics_key_file = "k".into();
            c.prometheus_metrics_client_auth = "RequireAndVerifyClientCert".into();
        }))
        .unwrap_err();
        assert!(e.contains("PrometheusMetricsCAFile"), "{e}");
    }

    #[test]
    fn client_auth_names_are_gos() {
        for (s, want) in [
            ("NoClientCert", ClientAuth::NoClientCert),
            ("RequireAnyClientCert", ClientAuth::RequireAnyClientCert),
            (
                "VerifyClientCertIfGiven",
                ClientAuth::VerifyClientCertIfGiven,
            ),
            (
                "RequireAndVerifyClientCert",
                ClientAuth::RequireAndVerifyClientCert,
            ),
        ] {
            assert_eq!(ClientAuth::parse(s, CLIENT_AUTH), Ok(want));
        }
        assert!(ClientAuth::parse("Maybe", CLIENT_AUTH).is_err());
    }

    #[test]
    fn unreadable_files_are_named() {
        let t = MetricsTls {
            cert_file: "/nonexistent/c.pem".into(),
            key_file: "/nonexistent/k.pem".into(),
            ca_file: String::new(),
            client_auth: ClientAuth::NoClientCert,
        };
        let e = t.server_config().unwrap_err();
        assert!(
            e.contains("PrometheusMetricsCertFile /nonexistent/c.pem"),
            "{e}"
        );
    }
}
