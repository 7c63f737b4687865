//! Mutual TLS between Typha and its clients (rustls, ring).
//!
//! Both sides verify the peer's chain against their CA bundle, and then the peer's identity by
//! the certificate's Common Name or a URI Subject Alternative Name (Calico's ClientCN /
//! ClientURISAN on the Typha side, TyphaCN / TyphaURISAN on the Felix side); host names are
//! not checked, as in Calico. A client without a certificate signed by the CA cannot even
//! complete the handshake.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

#[derive(Debug, Clone, thiserror::Error)]
pub enum TlsError {
    #[error("{param} {path}: {reason}")]
    File {
        param: &'static str,
        path: String,
        reason: String,
    },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The identity a peer's certificate must carry: its CN or one of its URI SANs (either
/// matches when both are given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpectedPeer {
    pub cn: String,
    pub uri_san: String,
}

impl ExpectedPeer {
    /// Checks an end-entity certificate; the error says what it carries instead.
    pub fn check(&self, der: &[u8]) -> Result<(), String> {
        let names = cert_names(der).ok_or("the peer certificate cannot be parsed")?;
        if !self.cn.is_empty() && names.common_names.contains(&self.cn) {
            return Ok(());
        }
        if !self.uri_san.is_empty() && names.uri_sans.contains(&self.uri_san) {
            return Ok(());
        }
        Err(format!(
            "the peer certificate has CN {:?} and URI SANs {:?}, but {} is required",
            names.common_names,
            names.uri_sans,
            match (self.cn.is_empty(), self.uri_san.is_empty()) {
                (false, false) => format!("CN {:?} or URI SAN {:?}", self.cn, self.uri_san),
                (false, true) => format!("CN {:?}", self.cn),
                _ => format!("URI SAN {:?}", self.uri_san),
            }
        ))
    }
}

/// File paths of one side's TLS settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub key_file: String,
    pub cert_file: String,
    pub ca_file: String,
    pub expected: ExpectedPeer,
}

/// Parameter names to use in error messages (they differ between Typha and Felix).
#[derive(Debug, Clone, Copy)]
pub struct ParamNames {
    pub key: &'static str,
    pub cert: &'static str,
    pub ca: &'static str,
}

pub const TYPHA_PARAMS: ParamNames = ParamNames {
    key: "ServerKeyFile",
    cert: "ServerCertFile",
    ca: "CAFile",
};
pub const FELIX_PARAMS: ParamNames = ParamNames {
    key: "TyphaKeyFile",
    cert: "TyphaCertFile",
    ca: "TyphaCAFile",
};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_file(param: &'static str, path: &str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::File {
        param,
        path: path.to_string(),
        reason: if e.kind() == std::io::ErrorKind::NotFound {
            "file not found (create it or fix the path)".into()
        } else {
            e.to_string()
        },
    })
}

fn certs(param: &'static str, path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_file(param, path)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::File {
            param,
            path: path.to_string(),
            reason: format!("not a PEM certificate file: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::File {
            param,
            path: path.to_string(),
            reason: "holds no PEM certificate".into(),
        });
    }
    Ok(certs)
}

fn key(param: &'static str, path: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read_file(param, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::File {
        param,
        path: path.to_string(),
        reason: format!("not a PEM private key: {e}"),
    })
}

fn roots(param: &'static str, path: &str) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for c in certs(param, path)? {
        store.add(c).map_err(|e| TlsError::File {
            param,
            path: path.to_string(),
            reason: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(Arc::new(store))
}

/// Typha's side: requires and verifies client certificates.
#[derive(Clone)]
pub struct ServerTls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub expected: ExpectedPeer,
}

impl ServerTls {
    pub fn from_files(f: &TlsFiles, names: ParamNames) -> Result<ServerTls, TlsError> {
        let chain = certs(names.cert, &f.cert_file)?;
        let key = key(names.key, &f.key_file)?;
        let roots = roots(names.ca, &f.ca_file)?;
        let provider = provider();
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| TlsError::Config(format!("client verifier: {e}")))?;
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| {
                TlsError::Config(format!("{} does not match {}: {e}", names.key, names.cert))
            })?;
        Ok(ServerTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            expected: f.expected.clone(),
        })
    }
}

/// The client's side: presents its certificate, verifies Typha's chain and CN/URI SAN.
#[derive(Clone)]
pub struct ClientTls {
    pub connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("expected", &self.expected)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    pub fn from_files(f: &TlsFiles, names: ParamNames) -> Result<ClientTls, TlsError> {
        let chain = certs(names.cert, &f.cert_file)?;
        let key = key(names.key, &f.key_file)?;
        let roots = roots(names.ca, &f.ca_file)?;
        let provider = provider();
        let verifier = Arc::new(PeerVerifier {
            roots,
            algs: provider.signature_verification_algorithms,
            expected: f.expected.clone(),
        });
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(chain, key)
            .map_err(|e| {
                TlsError::Config(format!("{} does not match {}: {e}", names.key, names.cert))
            })?;
        Ok(ClientTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })
    }
}

/// Verifies Typha's chain against the CA, then its CN / URI SAN instead of a host name.
#[derive(Debug)]
struct PeerVerifier {
    roots: Arc<RootCertStore>,
    algs: WebPkiSupportedAlgorithms,
    expected: ExpectedPeer,
}

impl ServerCertVerifier for PeerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algs.all,
        )?;
        self.expected
            .check(end_entity)
            .map_err(|e| rustls::Error::General(format!("Typha's certificate: {e}")))?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// The names a certificate carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertNames {
    pub common_names: Vec<String>,
    pub uri_sans: Vec<String>,
}

/// One DER TLV: (tag, contents, rest).
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *input.first()?;
    let first = *input.get(1)?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | usize::from(*input.get(2 + i)?);
        }
        (len, 2 + n)
    };
    let end = header.checked_add(len)?;
    Some((tag, input.get(header..end)?, input.get(end..)?))
}

const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_SAN: &[u8] = &[0x55, 0x1d, 0x11];

/// Extracts the subject CNs and URI SANs of an X.509 certificate (DER). Only reads names:
/// the chain and signatures are verified by rustls.
pub fn cert_names(der: &[u8]) -> Option<CertNames> {
    let (_, cert, _) = tlv(der)?;
    let (_, tbs, _) = tlv(cert)?;
    let mut rest = tbs;
    let (tag, _, after) = tlv(rest)?;
    if tag == 0xa0 {
        rest = after; // version
    }
    let mut fields = Vec::new();
    while !rest.is_empty() {
        let (tag, content, after) = tlv(rest)?;
        fields.push((tag, content));
        rest = after;
    }
    // serial, signature, issuer, validity, subject, spki, then optional [1] [2] [3].
    let subject = fields.get(4)?.1;
    let mut names = CertNames::default();
    let mut rdns = subject;
    while !rdns.is_empty() {
        let (_, set, after) = tlv(rdns)?;
        rdns = after;
        let mut atvs = set;
        while !atvs.is_empty() {
            let (_, atv, after) = tlv(atvs)?;
            atvs = after;
            let (_, oid, value) = tlv(atv)?;
            if oid == OID_CN {
                let (vtag, v, _) = tlv(value)?;
                if matches!(vtag, 0x0c | 0x13 | 0x16 | 0x14) {
                    names
                        .common_names
                        .push(String::from_utf8_lossy(v).into_owned());
                }
            }
        }
    }
    if let Some((_, exts)) = fields.iter().skip(6).find(|(t, _)| *t == 0xa3) {
        let (_, mut list, _) = tlv(exts)?;
        while !list.is_empty() {
            let (_, ext, after) = tlv(list)?;
            list = after;
            let (_, oid, mut rest) = tlv(ext)?;
            if oid != OID_SAN {
                continue;
            }
            let (mut tag, mut content, mut after) = tlv(rest)?;
            if tag == 0x01 {
                // critical flag
                rest = after;
                (tag, content, after) = tlv(rest)?;
            }
            let _ = (tag, after);
            let (_, mut gns, _) = tlv(content)?;
            while !gns.is_empty() {
                let (gtag, g, after) = tlv(gns)?;
                gns = after;
                if gtag == 0x86 {
                    names.uri_sans.push(String::from_utf8_lossy(g).into_owned());
                }
            }
        }
    }
    Some(names)
}

/// Whether every TLS setting is empty, all are set, or some are missing (named).
pub fn check_all_or_none(
    settings: &[(&str, &str)],
    name_settings: (&str, &str, &str, &str),
) -> Result<bool, String> {
    let (cn_name, cn, san_name, san) = name_settings;
    let any = settings.iter().any(|(_, v)| !v.is_empty()) || !cn.is_empty() || !san.is_empty();
    if !any {
        return Ok(false);
    }
    let mut missing: Vec<String> = settings
        .iter()
        .filter(|(_, v)| v.is_empty())
        .map(|(n, _)| n.to_string())
        .collect();
    if cn.is_empty() && san.is_empty() {
        missing.push(format!("{cn_name} or {san_name}"));
    }
    if missing.is_empty() {
        Ok(true)
    } else {
        Err(format!(
            "TLS settings are all or none: missing {}",
            missing.join(", ")
        ))
    }
}

/// Whether a path exists (for errors that name the missing file before rustls does).
pub fn exists(path: &str) -> bool {
    Path::new(path).exists()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_are_read_from_generated_certificates() {
        let mut params = rcgen::CertificateParams::new(vec!["typha.example".to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "typha-server");
        params.subject_alt_names.push(rcgen::SanType::URI(
            rcgen::string::Ia5String::try_from("spiffe://cluster/typha").unwrap(),
        ));
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let names = cert_names(cert.der()).unwrap();
        assert_eq!(names.common_names, vec!["typha-server"]);
        assert_eq!(names.uri_sans, vec!["spiffe://cluster/typha"]);
        let e = ExpectedPeer {
            cn: "felix".into(),
            uri_san: String::new(),
        };
        assert!(e.check(cert.der()).unwrap_err().contains("typha-server"));
        let ok = ExpectedPeer {
            cn: "x".into(),
            uri_san: "spiffe://cluster/typha".into(),
        };
        assert!(ok.check(cert.der()).is_ok());
    }

    #[test]
    fn garbage_is_not_a_certificate() {
        assert_eq!(cert_names(&[]), None);
        assert_eq!(cert_names(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(cert_names(&[0x30, 0x03, 0x30, 0x01]), None);
    }

    #[test]
    fn missing_files_are_named() {
        let f = TlsFiles {
            key_file: "/nonexistent/key.pem".into(),
            cert_file: "/nonexistent/cert.pem".into(),
            ca_file: "/nonexistent/ca.pem".into(),
            expected: ExpectedPeer {
                cn: "felix".into(),
                uri_san: String::new(),
            },
        };
        let e = ServerTls::from_files(&f, TYPHA_PARAMS)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ServerCertFile /nonexistent/cert.pem: file not found"),
            "{e}"
        );
        let e = ClientTls::from_files(&f, FELIX_PARAMS)
            .unwrap_err()
            .to_string();
        assert!(e.contains("TyphaCertFile"), "{e}");
    }

    #[test]
    fn all_or_none() {
        assert_eq!(
            check_all_or_none(&[("K", ""), ("C", "")], ("CN", "", "SAN", "")),
            Ok(false)
        );
        assert_eq!(
            check_all_or_none(&[("K", "k"), ("C", "c")], ("CN", "x", "SAN", "")),
            Ok(true)
        );
        let e = check_all_or_none(&[("K", "k"), ("C", "")], ("CN", "", "SAN", "")).unwrap_err();
        assert!(e.contains("C, CN or SAN"), "{e}");
    }
}
