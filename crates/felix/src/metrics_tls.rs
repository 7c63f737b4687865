//! The metrics endpoint over TLS (PrometheusMetricsCertFile, PrometheusMetricsKeyFile,
//! PrometheusMetricsCAFile, PrometheusMetricsClientAuth), as Calico serves it: HTTPS as soon
//! as a certificate or key is set; client certificates asked for as the client-auth mode says
//! (Go's `tls.ClientAuthType` names) and checked against the CA bundle; the files are read
//! again for every connection, so rotated certificates are used without a restart.

use std::sync::Arc;

use margay_felix_config::Config;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

/// How the metrics server treats client certificates (PrometheusMetricsClientAuth).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// None asked for.
    NoClientCert,
    /// One is required, but not verified.
    RequireAnyClientCert,
    /// Verified against the CA bundle when the client sends one.
    VerifyClientCertIfGiven,
    /// Required and verified against the CA bundle.
    RequireAndVerifyClientCert,
}

impl ClientAuth {
    pub fn parse(s: &str) -> Result<ClientAuth, String> {
        match s {
            "" | "NoClientCert" => Ok(ClientAuth::NoClientCert),
            "RequireAnyClientCert" => Ok(ClientAuth::RequireAnyClientCert),
            "VerifyClientCertIfGiven" => Ok(ClientAuth::VerifyClientCertIfGiven),
            "RequireAndVerifyClientCert" => Ok(ClientAuth::RequireAndVerifyClientCert),
            other => Err(format!(
                "PrometheusMetricsClientAuth {other:?} is not one of NoClientCert, \
                 RequireAnyClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"
            )),
        }
    }

    fn verifies(self) -> bool {
        matches!(
            self,
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert
        )
    }
}

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
        let client_auth = ClientAuth::parse(&c.prometheus_metrics_client_auth)?;
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

    /// A server configuration from the files as they are now.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certs("PrometheusMetricsCertFile", &self.cert_file)?;
        let key = PrivateKeyDer::from_pem_slice(&read("PrometheusMetricsKeyFile", &self.key_file)?)
            .map_err(|e| {
                format!(
                    "PrometheusMetricsKeyFile {}: not a PEM private key: {e}",
                    self.key_file
                )
            })?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let builder = match self.client_auth {
            ClientAuth::NoClientCert => builder.with_no_client_auth(),
            ClientAuth::RequireAnyClientCert => {
                builder.with_client_cert_verifier(Arc::new(AnyClientCert(provider)))
            }
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert => {
                let mut roots = RootCertStore::empty();
                for c in certs("PrometheusMetricsCAFile", &self.ca_file)? {
                    roots.add(c).map_err(|e| {
                        format!(
                            "PrometheusMetricsCAFile {}: not a usable CA certificate: {e}",
                            self.ca_file
                        )
                    })?;
                }
                let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let v = if self.client_auth == ClientAuth::VerifyClientCertIfGiven {
                    v.allow_unauthenticated()
                } else {
                    v
                };
                builder.with_client_cert_verifier(
                    v.build()
                        .map_err(|e| format!("PrometheusMetricsCAFile {}: {e}", self.ca_file))?,
                )
            }
        };
        builder
            .with_single_cert(chain, key)
            .map(Arc::new)
            .map_err(|e| {
                format!(
                    "PrometheusMetricsKeyFile {} does not match PrometheusMetricsCertFile {}: {e}",
                    self.key_file, self.cert_file
                )
            })
    }
}

fn read(param: &str, path: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{param} {path}: {e}"))
}

fn certs(param: &str, path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(param, path)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{param} {path}: not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{param} {path}: holds no PEM certificate"));
    }
    Ok(certs)
}

/// Go's RequireAnyClientCert: a certificate must be presented (and its signature over the
/// handshake must be right), but it is not checked against any CA.
#[derive(Debug)]
struct AnyClientCert(Arc<CryptoProvider>);

impl ClientCertVerifier for AnyClientCert {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
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
            assert_eq!(ClientAuth::parse(s), Ok(want));
        }
        assert!(ClientAuth::parse("Maybe").is_err());
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
