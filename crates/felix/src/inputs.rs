//! Gathering Felix's configuration inputs the way Calico's daemon does: the environment and
//! the config file first (they say where the datastore is), then the datastore's
//! ClusterInformation, FelixConfigurations and this node's Node.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use margay_api::{Kind, Resource, ResourceKey};
use margay_datastore::{Client, DatastoreConfig, DatastoreError, KvBackend};
use margay_felix_config::{ConfigInputs, Loaded, ParamId, Source};

use crate::FelixError;

/// The local inputs: environment, config file, kernel hostname.
#[derive(Debug, Clone)]
pub struct LocalInputs {
    pub env: BTreeMap<String, String>,
    pub config_file: PathBuf,
    /// The file's text; None when it does not exist (not an error, as in Calico).
    pub config_text: Option<String>,
    pub kernel_hostname: Option<String>,
}

impl LocalInputs {
    /// Reads the config file (a missing file is fine; an unreadable one is an error).
    pub fn read(
        env: BTreeMap<String, String>,
        config_file: &Path,
        kernel_hostname: Option<String>,
    ) -> Result<LocalInputs, FelixError> {
        let config_text = match read_bounded(config_file) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(FelixError::ConfigFile {
                    path: config_file.to_path_buf(),
                    reason: e.to_string(),
                });
            }
        };
        Ok(LocalInputs {
            env,
            config_file: config_file.to_path_buf(),
            config_text,
            kernel_hostname,
        })
    }

    /// Inputs without any datastore resources.
    pub fn config_inputs(&self) -> ConfigInputs {
        ConfigInputs {
            env: self.env.clone(),
            config_file: self.config_text.clone(),
            hostname: self.kernel_hostname.clone(),
            ..ConfigInputs::default()
        }
    }
}

/// The largest config file read: felix.cfg holds a few dozen settings.
const MAX_CONFIG_FILE: u64 = 1 << 20;

/// Reads a UTF-8 file of at most [`MAX_CONFIG_FILE`] bytes, reading no further.
fn read_bounded(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = String::new();
    std::fs::File::open(path)?
        .take(MAX_CONFIG_FILE + 1)
        .read_to_string(&mut buf)?;
    if buf.len() as u64 > MAX_CONFIG_FILE {
        return Err(std::io::Error::other(format!(
            "it is larger than {} MiB; a Felix config file holds a few settings",
            MAX_CONFIG_FILE >> 20
        )));
    }
    Ok(buf)
}

/// The kernel's hostname (FelixHostname's default).
pub fn kernel_hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// The datastore resources that configure Felix.
#[derive(Debug, Clone, Default)]
pub struct DatastoreInputs {
    pub cluster_info: Option<Resource>,
    /// Every FelixConfiguration, by name.
    pub felix_configs: BTreeMap<String, Resource>,
    /// This node's Node.
    pub node: Option<Resource>,
}

impl DatastoreInputs {
    /// Applies a datastore change; returns whether it concerns Felix's configuration.
    pub fn apply(&mut self, key: &ResourceKey, value: Option<&Resource>, hostname: &str) -> bool {
        match key.kind {
            Kind::ClusterInformation if key.name == "default" => {
                self.cluster_info = value.cloned();
                true
            }
            Kind::FelixConfiguration => {
                match value {
                    Some(v) => self.felix_configs.insert(key.name.clone(), v.clone()),
                    None => self.felix_configs.remove(&key.name),
                };
                true
            }
            Kind::Node if key.name == hostname => {
                self.node = value.cloned();
                true
            }
            _ => false,
        }
    }

    /// Completes `local` with these resources, for `hostname`.
    pub fn config_inputs(&self, local: &LocalInputs, hostname: &str) -> ConfigInputs {
        let mut inputs = local.config_inputs();
        inputs.cluster_info = match &self.cluster_info {
            Some(Resource::ClusterInformation(c)) => Some(c.clone()),
            _ => None,
        };
        let per_host = format!("node.{hostname}");
        for (name, r) in &self.felix_configs {
            let Resource::FelixConfiguration(fc) = r else {
                continue;
            };
            if name == "default" {
                inputs.global = Some(fc.clone());
            } else if *name == per_host {
                inputs.per_host = Some(fc.clone());
            } else if !name.starts_with("node.") {
                inputs.per_selector.push(fc.clone());
            }
        }
        inputs.node = match &self.node {
            Some(Resource::Node(n)) => Some(n.clone()),
            _ => None,
        };
        inputs
    }
}

/// Reads the resources that configure `hostname`'s Felix.
pub async fn read_datastore_inputs<B: KvBackend>(
    client: &Client<B>,
    hostname: &str,
) -> Result<DatastoreInputs, DatastoreError> {
    let get = |kind: Kind, name: &str| ResourceKey {
        kind,
        namespace: String::new(),
        name: name.to_string(),
    };
    let optional = |r: Result<Resource, DatastoreError>| match r {
        Ok(r) => Ok(Some(r)),
        Err(DatastoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    };
    let cluster_info = optional(client.get(&get(Kind::ClusterInformation, "default")).await)?;
    let node = optional(client.get(&get(Kind::Node, hostname)).await)?;
    let listed = client.list(Kind::FelixConfiguration, None, "").await?;
    for (key, why) in &listed.undecodable {
        tracing::warn!(key, reason = %why, "ignoring a FelixConfiguration that does not decode");
    }
    let felix_configs = listed
        .items
        .into_iter()
        .map(|r| (r.name().to_string(), r))
        .collect();
    Ok(DatastoreInputs {
        cluster_info,
        felix_configs,
        node,
    })
}

/// Where Felix's datastore is: the standard variables (DATASTORE_TYPE, DATASTORE_PATH,
/// ETCD_*), then — as in Calico — Felix's own DatastoreType, EtcdEndpoints/EtcdAddr and etcd
/// TLS files when the config file or a `FELIX_*` variable sets them.
pub fn datastore_config(
    env: &BTreeMap<String, String>,
    local: &Loaded,
) -> Result<DatastoreConfig, FelixError> {
    let mut cfg = DatastoreConfig::from_lookup(|k| env.get(k).cloned())
        .map_err(|e| FelixError::Datastore(e.to_string()))?;
    let set = |id: ParamId| {
        local.set_by(id, Source::EnvironmentVariable) || local.set_by(id, Source::ConfigFile)
    };
    let c = &local.config;
    if set(ParamId::DatastoreType) {
        match c.datastore_type.as_str() {
            "etcdv3" => cfg.datastore_type = margay_datastore::DatastoreType::Etcd,
            "kubernetes" => cfg.datastore_type = margay_datastore::DatastoreType::Kubernetes,
            _ => {}
        }
    }
    if set(ParamId::EtcdEndpoints) && !c.etcd_endpoints.is_empty() {
        // Felix's endpoint-list kind writes URLs with a trailing slash (as Calico's does).
        cfg.etcd.endpoints = c
            .etcd_endpoints
            .iter()
            .map(|e| e.trim_end_matches('/').to_string())
            .collect();
        cfg.datastore_type = margay_datastore::DatastoreType::Etcd;
    } else if set(ParamId::EtcdAddr) {
        cfg.etcd.endpoints = vec![format!("{}://{}", c.etcd_scheme, c.etcd_addr)];
        cfg.datastore_type = margay_datastore::DatastoreType::Etcd;
    }
    if set(ParamId::EtcdKeyFile) {
        cfg.etcd.key_file = Some(PathBuf::from(&c.etcd_key_file));
    }
    if set(ParamId::EtcdCertFile) {
        cfg.etcd.cert_file = Some(PathBuf::from(&c.etcd_cert_file));
    }
    if set(ParamId::EtcdCaFile) {
        cfg.etcd.ca_cert_file = Some(PathBuf::from(&c.etcd_ca_file));
    }
    if cfg.datastore_type == margay_datastore::DatastoreType::Etcd && cfg.etcd.endpoints.is_empty()
    {
        return Err(FelixError::Datastore(
            "the etcdv3 datastore needs endpoints: set ETCD_ENDPOINTS or FELIX_ETCDENDPOINTS \
             (e.g. http://127.0.0.1:2379)"
                .into(),
        ));
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_oversized_config_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("felix.cfg");
        // Before: read whatever its size (a FIFO that never ends: until memory ran out).
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(2 << 20).unwrap();
        let e = LocalInputs::read(BTreeMap::new(), &path, None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("felix.cfg") && e.contains("larger than 1 MiB"),
            "{e}"
        );
        std::fs::write(&path, "[global]\nLogSeverityScreen = debug\n").unwrap();
        assert!(LocalInputs::read(BTreeMap::new(), &path, None).is_ok());
    }

    fn local(env: &[(&str, &str)]) -> (BTreeMap<String, String>, Loaded) {
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let inputs = ConfigInputs {
            env: env.clone(),
            hostname: Some("h1".into()),
            ..ConfigInputs::default()
        };
        let loaded = margay_felix_config::load(&inputs).unwrap();
        (env, loaded)
    }

    #[test]
    fn datastore_defaults_to_the_environment() {
        let (env, l) = local(&[("DATASTORE_PATH", "/tmp/x.db")]);
        let c = datastore_config(&env, &l).unwrap();
        assert_eq!(c.datastore_type, margay_datastore::DatastoreType::Local);
        assert_eq!(c.local_path, PathBuf::from("/tmp/x.db"));
    }

    #[test]
    fn felix_etcd_settings_override_the_environment() {
        let (env, l) = local(&[("FELIX_ETCDENDPOINTS", "http://10.0.0.1:2379")]);
        let c = datastore_config(&env, &l).unwrap();
        assert_eq!(c.datastore_type, margay_datastore::DatastoreType::Etcd);
        assert_eq!(c.etcd.endpoints, vec!["http://10.0.0.1:2379"]);
        let (env, l) = local(&[
            ("FELIX_ETCDADDR", "10.0.0.2:2379"),
            ("FELIX_ETCDSCHEME", "https"),
        ]);
        let c = datastore_config(&env, &l).unwrap();
        assert_eq!(c.etcd.endpoints, vec!["https://10.0.0.2:2379"]);
        let (env, l) = local(&[
            ("FELIX_DATASTORETYPE", "kubernetes"),
            ("KUBECONFIG", "/etc/kube/config"),
        ]);
        let c = datastore_config(&env, &l).unwrap();
        assert_eq!(
            c.datastore_type,
            margay_datastore::DatastoreType::Kubernetes
        );
        assert_eq!(c.kube.kubeconfig, vec![PathBuf::from("/etc/kube/config")]);
    }
}
