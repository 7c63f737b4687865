//! Which datastore to use, from Calico's environment variables or a calicoctl
//! `CalicoAPIConfig` file, and connecting to it.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::any::AnyBackend;
use crate::error::{DatastoreError, Result};

/// Where the embedded datastore lives unless DATASTORE_PATH says otherwise.
pub const DEFAULT_LOCAL_PATH: &str = "/var/lib/margay/datastore.db";
/// calicoctl's default configuration file.
pub const DEFAULT_CTL_CONFIG: &str = "/etc/calico/calicoctl.cfg";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatastoreType {
    /// The embedded single-machine store (margay's default).
    Local,
    /// etcd v3 with Calico's key layout.
    Etcd,
    /// The Kubernetes API (Calico's KDD: custom resources plus Pods, Namespaces, Nodes…).
    Kubernetes,
}

impl DatastoreType {
    fn parse(s: &str) -> Result<DatastoreType> {
        match s.trim().to_ascii_lowercase().as_str() {
            "local" => Ok(DatastoreType::Local),
            "etcdv3" | "etcd" => Ok(DatastoreType::Etcd),
            "kubernetes" | "k8s" => Ok(DatastoreType::Kubernetes),
            other => Err(DatastoreError::invalid(format!(
                "DATASTORE_TYPE {other:?} is not known (use local, etcdv3 or kubernetes)"
            ))),
        }
    }
}

/// Connection settings for etcd (Calico's ETCD_* variables).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `http(s)://host:port` URLs.
    pub endpoints: Vec<String>,
    pub discovery_srv: Option<String>,
    pub ca_cert_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// How to reach the Kubernetes API (Calico's KUBECONFIG, K8S_* variables and calicoctl's
/// `kubeconfig`/`k8s*` fields). With nothing set: `$HOME/.kube/config` if it exists, else the
/// in-cluster service account.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KubeSettings {
    /// KUBECONFIG: one file, or a `:`-separated precedence list (first wins).
    pub kubeconfig: Vec<PathBuf>,
    /// calicoctl's `kubeconfigInline`: a whole kubeconfig as text (wins over the files).
    pub kubeconfig_inline: Option<String>,
    /// K8S_API_ENDPOINT: the API server URL, over whatever the kubeconfig says.
    pub api_endpoint: Option<String>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub insecure_skip_tls_verify: bool,
    /// K8S_CURRENT_CONTEXT: the kubeconfig context to use.
    pub current_context: Option<String>,
    /// K8S_API_TOKEN / `k8sAPIToken`: a bearer token.
    pub token: Option<String>,
    /// The host-side interface prefix of pods' veths (first item of FELIX_INTERFACEPREFIX):
    /// part of every WorkloadEndpoint derived from a Pod.
    pub interface_prefix: String,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the password (Debug output ends up in logs and panics).
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("discovery_srv", &self.discovery_srv)
            .field("ca_cert_file", &self.ca_cert_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl std::fmt::Debug for KubeSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets: the token and an inline kubeconfig (which may hold keys).
        f.debug_struct("KubeSettings")
            .field("kubeconfig", &self.kubeconfig)
            .field(
                "kubeconfig_inline",
                &self.kubeconfig_inline.as_ref().map(|_| "<redacted>"),
            )
            .field("api_endpoint", &self.api_endpoint)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("ca_file", &self.ca_file)
            .field("insecure_skip_tls_verify", &self.insecure_skip_tls_verify)
            .field("current_context", &self.current_context)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("interface_prefix", &self.interface_prefix)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatastoreConfig {
    pub datastore_type: DatastoreType,
    /// The embedded store's file.
    pub local_path: PathBuf,
    pub etcd: EtcdConfig,
    pub kube: KubeSettings,
    /// DATASTORE_MAX_VALUE_SIZE (margay's): the largest value written, in bytes, on every
    /// backend (default etcd's 1.5 MiB request limit).
    pub max_value_size: usize,
}

impl Default for DatastoreConfig {
    fn default() -> Self {
        DatastoreConfig {
            datastore_type: DatastoreType::Local,
            local_path: PathBuf::from(DEFAULT_LOCAL_PATH),
            etcd: EtcdConfig::default(),
            kube: KubeSettings {
                interface_prefix: "cali".to_string(),
                ..KubeSettings::default()
            },
            max_value_size: crate::kv::DEFAULT_MAX_VALUE_SIZE,
        }
    }
}

impl DatastoreConfig {
    /// From the process environment.
    pub fn from_env() -> Result<DatastoreConfig> {
        DatastoreConfig::from_lookup(|k| std::env::var(k).ok())
    }

    /// From variables looked up with `get` (the environment, or a table in tests).
    ///
    /// DATASTORE_TYPE picks the store (`local`, `etcdv3`, `kubernetes`); without it, setting
    /// ETCD_ENDPOINTS means etcd and nothing means the embedded store at DATASTORE_PATH. As
    /// in Calico, each variable may also be given with a `CALICO_` prefix, which wins.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<DatastoreConfig> {
        let non_empty = |k: &str| {
            get(&format!("CALICO_{k}"))
                .filter(|v| !v.trim().is_empty())
                .or_else(|| get(k).filter(|v| !v.trim().is_empty()))
        };
        let endpoints = non_empty("ETCD_ENDPOINTS").map(|e| split_endpoints(&e));
        let datastore_type = match non_empty("DATASTORE_TYPE") {
            Some(t) => DatastoreType::parse(&t)?,
            None if endpoints.is_some() || non_empty("ETCD_DISCOVERY_SRV").is_some() => {
                DatastoreType::Etcd
            }
            None => DatastoreType::Local,
        };
        let etcd = EtcdConfig {
            endpoints: endpoints.unwrap_or_default(),
            discovery_srv: non_empty("ETCD_DISCOVERY_SRV"),
            ca_cert_file: non_empty("ETCD_CA_CERT_FILE").map(PathBuf::from),
            cert_file: non_empty("ETCD_CERT_FILE").map(PathBuf::from),
            key_file: non_empty("ETCD_KEY_FILE").map(PathBuf::from),
            username: non_empty("ETCD_USERNAME"),
            password: non_empty("ETCD_PASSWORD"),
        };
        let kube = KubeSettings {
            kubeconfig: non_empty("KUBECONFIG")
                .map(|v| split_paths(&v))
                .unwrap_or_default(),
            kubeconfig_inline: non_empty("KUBECONFIG_INLINE"),
            api_endpoint: non_empty("K8S_API_ENDPOINT"),
            cert_file: non_empty("K8S_CERT_FILE").map(PathBuf::from),
            key_file: non_empty("K8S_KEY_FILE").map(PathBuf::from),
            ca_file: non_empty("K8S_CA_FILE").map(PathBuf::from),
            insecure_skip_tls_verify: match non_empty("K8S_INSECURE_SKIP_TLS_VERIFY") {
                Some(v) => parse_bool("K8S_INSECURE_SKIP_TLS_VERIFY", &v)?,
                None => false,
            },
            current_context: non_empty("K8S_CURRENT_CONTEXT"),
            token: non_empty("K8S_API_TOKEN"),
            interface_prefix: get("FELIX_INTERFACEPREFIX")
                .and_then(|v| {
                    v.split(',')
                        .map(str::trim)
                        .find(|p| !p.is_empty())
                        .map(str::to_string)
                })
                .unwrap_or_else(|| "cali".to_string()),
        };
        let cfg = DatastoreConfig {
            datastore_type,
            local_path: non_empty("DATASTORE_PATH")
                .map_or_else(|| PathBuf::from(DEFAULT_LOCAL_PATH), PathBuf::from),
            etcd,
            kube,
            max_value_size: match non_empty("DATASTORE_MAX_VALUE_SIZE") {
                Some(v) => parse_size("DATASTORE_MAX_VALUE_SIZE", &v)?,
                None => crate::kv::DEFAULT_MAX_VALUE_SIZE,
            },
        };
        cfg.check()?;
        Ok(cfg)
    }

    /// From a calicoctl configuration file (`kind: CalicoAPIConfig`).
    pub fn from_file(path: &Path) -> Result<DatastoreConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            DatastoreError::invalid(format!(
                "cannot read datastore config {}: {e}",
                path.display()
            ))
        })?;
        DatastoreConfig::from_api_config(&text)
            .map_err(|e| DatastoreError::invalid(format!("{}: {e}", path.display())))
    }

    /// Parses the text of a `CalicoAPIConfig` document.
    pub fn from_api_config(text: &str) -> std::result::Result<DatastoreConfig, String> {
        let doc: ApiConfig = serde_norway::from_str(text)
            .map_err(|e| format!("not a valid CalicoAPIConfig: {e}"))?;
        if doc.kind != "CalicoAPIConfig" {
            return Err(format!("kind is {:?}, expected CalicoAPIConfig", doc.kind));
        }
        if doc.api_version != "projectcalico.org/v3" {
            return Err(format!(
                "apiVersion is {:?}, expected projectcalico.org/v3",
                doc.api_version
            ));
        }
        let s = doc.spec;
        let vars: Vec<(&str, Option<String>)> = vec![
            ("DATASTORE_TYPE", s.datastore_type),
            ("ETCD_ENDPOINTS", s.etcd_endpoints),
            ("ETCD_DISCOVERY_SRV", s.etcd_discovery_srv),
            ("ETCD_CA_CERT_FILE", s.etcd_ca_cert_file),
            ("ETCD_CERT_FILE", s.etcd_cert_file),
            ("ETCD_KEY_FILE", s.etcd_key_file),
            ("ETCD_USERNAME", s.etcd_username),
            ("ETCD_PASSWORD", s.etcd_password),
            ("DATASTORE_PATH", s.datastore_path),
            ("KUBECONFIG", s.kubeconfig),
            ("KUBECONFIG_INLINE", s.kubeconfig_inline),
            ("K8S_API_ENDPOINT", s.k8s_api_endpoint),
            ("K8S_KEY_FILE", s.k8s_key_file),
            ("K8S_CERT_FILE", s.k8s_cert_file),
            ("K8S_CA_FILE", s.k8s_ca_file),
            ("K8S_API_TOKEN", s.k8s_api_token),
            ("K8S_CURRENT_CONTEXT", s.k8s_current_context),
            (
                "K8S_INSECURE_SKIP_TLS_VERIFY",
                s.k8s_insecure.map(|b| b.to_string()),
            ),
        ];
        let lookup = |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .and_then(|(_, v)| v.clone())
        };
        DatastoreConfig::from_lookup(lookup).map_err(|e| e.to_string())
    }

    /// Where it points, for logs and error messages.
    pub fn describe(&self) -> String {
        match self.datastore_type {
            DatastoreType::Local => format!("local datastore at {}", self.local_path.display()),
            DatastoreType::Etcd => format!("etcd at {}", self.etcd.endpoints.join(",")),
            DatastoreType::Kubernetes => {
                match (&self.kube.api_endpoint, self.kube.kubeconfig.first()) {
                    (Some(url), _) => format!("Kubernetes API at {url}"),
                    (None, Some(path)) => format!("Kubernetes API (kubeconfig {})", path.display()),
                    (None, None) => "Kubernetes API (default kubeconfig or in-cluster)".to_string(),
                }
            }
        }
    }

    fn check(&self) -> Result<()> {
        match self.datastore_type {
            DatastoreType::Kubernetes => {
                if self.kube.cert_file.is_some() != self.kube.key_file.is_some() {
                    return Err(DatastoreError::invalid(
                        "set both K8S_CERT_FILE and K8S_KEY_FILE for a client certificate, or neither",
                    ));
                }
                if let Some(url) = &self.kube.api_endpoint
                    && !(url.starts_with("https://") || url.starts_with("http://"))
                {
                    return Err(DatastoreError::invalid(format!(
                        "K8S_API_ENDPOINT {url:?} must be a URL such as https://10.96.0.1:443"
                    )));
                }
                Ok(())
            }
            DatastoreType::Etcd if self.etcd.endpoints.is_empty() => {
                if self.etcd.discovery_srv.is_some() {
                    Err(DatastoreError::invalid(
                        "ETCD_DISCOVERY_SRV is not supported yet: list the members in ETCD_ENDPOINTS",
                    ))
                } else {
                    Err(DatastoreError::invalid(
                        "DATASTORE_TYPE=etcdv3 needs ETCD_ENDPOINTS (e.g. http://127.0.0.1:2379)",
                    ))
                }
            }
            DatastoreType::Etcd => {
                for e in &self.etcd.endpoints {
                    if !(e.starts_with("http://") || e.starts_with("https://")) {
                        return Err(DatastoreError::invalid(format!(
                            "ETCD_ENDPOINTS entry {e:?} must be a URL such as http://127.0.0.1:2379"
                        )));
                    }
                }
                let tls = [&self.etcd.cert_file, &self.etcd.key_file];
                if tls[0].is_some() != tls[1].is_some() {
                    return Err(DatastoreError::invalid(
                        "set both ETCD_CERT_FILE and ETCD_KEY_FILE for client certificates, or neither",
                    ));
                }
                if self.etcd.username.is_some() != self.etcd.password.is_some() {
                    return Err(DatastoreError::invalid(
                        "set both ETCD_USERNAME and ETCD_PASSWORD, or neither",
                    ));
                }
                if self.etcd.password.is_some()
                    && let Some(plain) = self
                        .etcd
                        .endpoints
                        .iter()
                        .find(|e| e.starts_with("http://"))
                {
                    tracing::warn!(endpoint = %plain, "ETCD_USERNAME/ETCD_PASSWORD are sent over plain http:// to {plain}: anyone on the path can read them; use https:// endpoints (ETCD_CA_CERT_FILE)");
                }
                Ok(())
            }
            DatastoreType::Local => Ok(()),
        }
    }

    /// Opens the configured datastore, creating the embedded store's file if needed.
    pub async fn connect(&self) -> Result<AnyBackend> {
        self.open(false).await
    }

    /// Opens the configured datastore for reading or changing existing data: an embedded
    /// store that does not exist yet is an error rather than a new empty file.
    pub async fn connect_existing(&self) -> Result<AnyBackend> {
        self.open(true).await
    }

    async fn open(&self, must_exist: bool) -> Result<AnyBackend> {
        let _ = must_exist; // only the embedded store can be created by opening it
        crate::kv::set_max_value_size(self.max_value_size);
        match self.datastore_type {
            #[cfg(feature = "local")]
            DatastoreType::Local => {
                let mut opts = crate::local::LocalOptions::new(self.local_path.clone());
                opts.must_exist = must_exist;
                let b = crate::local::LocalBackend::open(opts)?;
                Ok(AnyBackend::Local(b))
            }
            #[cfg(feature = "etcd")]
            DatastoreType::Etcd => Ok(AnyBackend::Etcd(
                crate::etcd::EtcdBackend::connect(&self.etcd).await?,
            )),
            #[cfg(feature = "kubernetes")]
            DatastoreType::Kubernetes => Ok(AnyBackend::Kube(
                crate::kube::KubeBackend::connect(&self.kube).await?,
            )),
            #[allow(unreachable_patterns)]
            other => Err(DatastoreError::invalid(format!(
                "{other:?} datastore support is not built into this binary"
            ))),
        }
    }
}

fn split_paths(s: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in s.split(':').map(str::trim).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// A size in bytes: at least 1 KiB (a smaller limit would refuse ordinary resources) and
/// at most 1 GiB.
fn parse_size(name: &str, v: &str) -> Result<usize> {
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (1024..=1 << 30).contains(n))
        .ok_or_else(|| {
            DatastoreError::invalid(format!(
                "{name} {v:?} must be a number of bytes between 1024 and 1073741824 (default {})",
                crate::kv::DEFAULT_MAX_VALUE_SIZE
            ))
        })
}

fn parse_bool(name: &str, v: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        other => Err(DatastoreError::invalid(format!(
            "{name} {other:?} is not a boolean (use true or false)"
        ))),
    }
}

fn split_endpoints(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ApiConfig {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    #[allow(dead_code)]
    metadata: serde_json::Value,
    #[serde(default)]
    spec: ApiConfigSpec,
}

/// The fields calicoctl accepts; the Kubernetes ones are recognised so that an existing file
/// parses, and rejected with a clear message when used.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ApiConfigSpec {
    datastore_type: Option<String>,
    etcd_endpoints: Option<String>,
    etcd_discovery_srv: Option<String>,
    #[serde(rename = "etcdCACertFile")]
    etcd_ca_cert_file: Option<String>,
    etcd_cert_file: Option<String>,
    etcd_key_file: Option<String>,
    etcd_username: Option<String>,
    etcd_password: Option<String>,
    /// margay's embedded datastore file.
    datastore_path: Option<String>,
    kubeconfig: Option<String>,
    kubeconfig_inline: Option<String>,
    #[serde(rename = "k8sAPIEndpoint")]
    k8s_api_endpoint: Option<String>,
    #[serde(rename = "k8sKeyFile")]
    k8s_key_file: Option<String>,
    #[serde(rename = "k8sCertFile")]
    k8s_cert_file: Option<String>,
    #[serde(rename = "k8sCAFile")]
    k8s_ca_file: Option<String>,
    #[serde(rename = "k8sAPIToken")]
    k8s_api_token: Option<String>,
    #[serde(rename = "k8sInsecureSkipTLSVerify")]
    k8s_insecure: Option<bool>,
    #[serde(rename = "k8sCurrentContext")]
    k8s_current_context: Option<String>,
    /// Calico accepts these; margay has no use for them (client-side rate limits, and a
    /// vestigial flag), so they parse and are ignored.
    #[serde(rename = "k8sClientQPS")]
    _k8s_client_qps: Option<serde_json::Value>,
    #[serde(rename = "k8sClientBurst")]
    _k8s_client_burst: Option<serde_json::Value>,
    #[serde(rename = "k8sDisableNodePoll")]
    _k8s_disable_node_poll: Option<bool>,
    #[serde(rename = "calicoAPIGroup")]
    _calico_api_group: Option<String>,
    #[serde(rename = "usePodCIDR")]
    _use_pod_cidr: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vars: &[(&str, &str)]) -> Result<DatastoreConfig> {
        DatastoreConfig::from_lookup(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn defaults_to_the_local_store() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.datastore_type, DatastoreType::Local);
        assert_eq!(c.local_path, PathBuf::from(DEFAULT_LOCAL_PATH));
        let c = cfg(&[("DATASTORE_PATH", "/tmp/x.db")]).unwrap();
        assert_eq!(c.local_path, PathBuf::from("/tmp/x.db"));
    }

    #[test]
    fn etcd_from_endpoints_or_type() {
        let c = cfg(&[(
            "ETCD_ENDPOINTS",
            "http://10.0.0.1:2379, http://10.0.0.2:2379",
        )])
        .unwrap();
        assert_eq!(c.datastore_type, DatastoreType::Etcd);
        assert_eq!(
            c.etcd.endpoints,
            vec!["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert!(
            cfg(&[("DATASTORE_TYPE", "etcdv3")])
                .unwrap_err()
                .to_string()
                .contains("needs ETCD_ENDPOINTS")
        );
        assert!(
            cfg(&[("ETCD_ENDPOINTS", "10.0.0.1:2379")])
                .unwrap_err()
                .to_string()
                .contains("must be a URL")
        );
        assert!(cfg(&[("ETCD_ENDPOINTS", "http://a:1"), ("ETCD_CERT_FILE", "/c")]).is_err());
        let k = cfg(&[
            ("DATASTORE_TYPE", "kubernetes"),
            ("KUBECONFIG", "/a/config:/b/config:/a/config"),
            ("FELIX_INTERFACEPREFIX", "tap,cali"),
        ])
        .unwrap();
        assert_eq!(k.datastore_type, DatastoreType::Kubernetes);
        assert_eq!(
            k.kube.kubeconfig,
            vec![PathBuf::from("/a/config"), PathBuf::from("/b/config")]
        );
        assert_eq!(k.kube.interface_prefix, "tap");
        assert!(
            cfg(&[("DATASTORE_TYPE", "kubernetes"), ("K8S_CERT_FILE", "/c")])
                .unwrap_err()
                .to_string()
                .contains("K8S_KEY_FILE")
        );
        let k = cfg(&[
            ("CALICO_DATASTORE_TYPE", "kubernetes"),
            ("DATASTORE_TYPE", "etcdv3"),
            ("K8S_API_TOKEN", "s3cret"),
        ])
        .unwrap();
        assert_eq!(
            k.datastore_type,
            DatastoreType::Kubernetes,
            "CALICO_ prefix wins"
        );
        assert!(
            !format!("{k:?}").contains("s3cret"),
            "Debug must redact the token"
        );
        assert!(
            cfg(&[("DATASTORE_TYPE", "mysql")])
                .unwrap_err()
                .to_string()
                .contains("not known")
        );
        let c = cfg(&[
            ("DATASTORE_TYPE", "local"),
            ("ETCD_ENDPOINTS", "http://a:1"),
        ])
        .unwrap();
        assert_eq!(c.datastore_type, DatastoreType::Local);
    }

    #[test]
    fn calicoctl_config_files() {
        let c = DatastoreConfig::from_api_config(
            "apiVersion: projectcalico.org/v3\nkind: CalicoAPIConfig\nmetadata: {}\nspec:\n  datastoreType: etcdv3\n  etcdEndpoints: http://127.0.0.1:2379\n  etcdCACertFile: /etc/ca.pem\n",
        )
        .unwrap();
        assert_eq!(c.datastore_type, DatastoreType::Etcd);
        assert_eq!(c.etcd.ca_cert_file, Some(PathBuf::from("/etc/ca.pem")));
        let e = DatastoreConfig::from_api_config(
            "apiVersion: projectcalico.org/v3\nkind: CalicoAPIConfig\nspec:\n  etcdEndpoint: http://x:1\n",
        )
        .unwrap_err();
        assert!(e.contains("etcdEndpoint"), "{e}");
        let c = DatastoreConfig::from_api_config(
            "apiVersion: projectcalico.org/v3\nkind: CalicoAPIConfig\nmetadata: {}\nspec:\n  datastoreType: kubernetes\n  kubeconfig: /root/.kube/config\n  k8sInsecureSkipTLSVerify: true\n",
        )
        .unwrap();
        assert_eq!(c.datastore_type, DatastoreType::Kubernetes);
        assert_eq!(c.kube.kubeconfig, vec![PathBuf::from("/root/.kube/config")]);
        assert!(c.kube.insecure_skip_tls_verify);
        let e = DatastoreConfig::from_api_config("apiVersion: v1\nkind: Config\n").unwrap_err();
        assert!(e.contains("CalicoAPIConfig"), "{e}");
    }
}
