//! HTTPS for a daemon's server, as Calico serves its metrics: a certificate and key, and
//! client certificates asked for as the client-auth mode says (Go's `tls.ClientAuthType`
//! names) and checked against a CA bundle. The files are read again for every connection, so
//! rotated certificates are used without a restart.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

/// Where a server gets its TLS configuration, once per connection.
pub trait TlsSource: Send + Sync {
    fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError>;
}

/// Why TLS cannot be served; the message names the setting (e.g. PrometheusMetricsCertFile)
/// and the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);

/// How client certificates are treated (Go's `tls.ClientAuthType` names).
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
    /// Parses a mode; `setting` names the parameter in the error.
    pub fn parse(s: &str, setting: &str) -> Result<ClientAuth, TlsError> {
        match s {
            "" | "NoClientCert" => Ok(ClientAuth::NoClientCert),
            "RequireAnyClientCert" => Ok(ClientAuth::RequireAnyClientCert),
            "VerifyClientCertIfGiven" => Ok(ClientAuth::VerifyClientCertIfGiven),
            "RequireAndVerifyClientCert" => Ok(ClientAuth::RequireAndVerifyClientCert),
            other => Err(TlsError(format!(
                "{setting} {other:?} is not one of NoClientCert, RequireAnyClientCert, \
                 VerifyClientCertIfGiven, RequireAndVerifyClientCert"
            ))),
        }
    }

    /// Whether client certificates are checked against the CA bundle.
    pub fn verifies(self) -> bool {
        matches!(
            self,
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert
        )
    }
}

/// The names of the settings the files come from, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub cert_file: &'static str,
    pub key_file: &'static str,
    pub ca_file: &'static str,
}

/// A certificate, its key, and (to verify clients) a CA bundle, all PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert_file: String,
    pub key_file: String,
    pub ca_file: String,
    pub client_auth: ClientAuth,
    pub settings: Settings,
}

impl TlsSource for TlsFiles {
    fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        self.load()
    }
}

impl TlsFiles {
    /// A server configuration from the files as they are now.
    pub fn load(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let s = self.settings;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certs(s.cert_file, &self.cert_file)?;
        let key =
            PrivateKeyDer::from_pem_slice(&read(s.key_file, &self.key_file)?).map_err(|e| {
                TlsError(format!(
                    "{} {}: not a PEM private key: {e}",
                    s.key_file, self.key_file
                ))
            })?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError(format!("TLS: {e}")))?;
        let builder = match self.client_auth {
            ClientAuth::NoClientCert => builder.with_no_client_auth(),
            ClientAuth::RequireAnyClientCert => {
                builder.with_client_cert_verifier(Arc::new(AnyClientCert(provider)))
            }
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert => {
                let mut roots = RootCertStore::empty();
                for c in certs(s.ca_file, &self.ca_file)? {
                    roots.add(c).map_err(|e| {
                        TlsError(format!(
                            "{} {}: not a usable CA certificate: {e}",
                            s.ca_file, self.ca_file
                        ))
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
                        .map_err(|e| TlsError(format!("{} {}: {e}", s.ca_file, self.ca_file)))?,
                )
            }
        };
        builder
            .with_single_cert(chain, key)
            .map(Arc::new)
            .map_err(|e| {
                TlsError(format!(
                    "{} {} does not match {} {}: {e}",
                    s.key_file, self.key_file, s.cert_file, self.cert_file
                ))
            })
    }
}

/// PEM files are small; anything bigger than this is not one and is refused unread.
const MAX_PEM: u64 = 1024 * 1024;

fn read(setting: &str, path: &str) -> Result<Vec<u8>, TlsError> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| TlsError(format!("{setting} {path}: {e}")))?;
    let mut buf = Vec::new();
    f.take(MAX_PEM + 1)
        .read_to_end(&mut buf)
        .map_err(|e| TlsError(format!("{setting} {path}: {e}")))?;
    if buf.len() as u64 > MAX_PEM {
        return Err(TlsError(format!(
            "{setting} {path}: larger than 1 MiB, not a PEM file (point {setting} at the PEM file)"
        )));
    }
    Ok(buf)
}

fn certs(setting: &str, path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(setting, path)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError(format!("{setting} {path}: not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError(format!(
            "{setting} {path}: holds no PEM certificate"
        )));
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
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const S: Settings = Settings {
        cert_file: "CertSetting",
        key_file: "KeySetting",
        ca_file: "CaSetting",
    };

    #[test]
    fn client_auth_names_are_gos() {
        for (s, want) in [
            ("", ClientAuth::NoClientCert),
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
            assert_eq!(ClientAuth::parse(s, "X"), Ok(want));
        }
        let e = ClientAuth::parse("Maybe", "ClientAuthSetting").unwrap_err();
        assert!(e.0.contains("ClientAuthSetting \"Maybe\""), "{e}");
    }

    #[test]
    fn unreadable_and_oversized_files_are_named() {
        let t = TlsFiles {
            cert_file: "/nonexistent/c.pem".into(),
            key_file: "/nonexistent/k.pem".into(),
            ca_file: String::new(),
            client_auth: ClientAuth::NoClientCert,
            settings: S,
        };
        let e = t.load().unwrap_err();
        assert!(e.0.contains("CertSetting /nonexistent/c.pem"), "{e}");

        let dir = std::env::temp_dir().join(format!("daemon-http-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.pem");
        // Sparse: 2 MiB that cost no disk.
        std::fs::File::create(&big)
            .unwrap()
            .set_len(2 * 1024 * 1024)
            .unwrap();
        let t = TlsFiles {
            cert_file: big.display().to_string(),
            ..t
        };
        let e = t.load().unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(e.0.contains("larger than 1 MiB"), "{e}");
    }
}
