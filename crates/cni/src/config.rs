//! What a plugin call is told: the network configuration (stdin), the `CNI_*` variables and
//! `CNI_ARGS` (pure parsing; every problem is a [`CniError`] naming what to fix).
//!
//! The configuration has Calico's field names, so an existing Calico conflist works with only
//! `type` changed. Unknown fields are tolerated (runtimes add `prevResult`, `runtimeConfig`,
//! `args`, capability fields; other plugins' conflists carry their own).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::spec::{CniError, CniResult, Version, code};

/// Calico's default node name file (written last by `margay node startup`).
pub const DEFAULT_NODENAME_FILE: &str = "/var/lib/calico/nodename";
/// Calico's host-wide IPAM lock.
pub const DEFAULT_IPAM_LOCK_FILE: &str = "/var/run/calico/ipam.lock";
/// Where calico-node writes the MTU it detected (used when the config sets none).
pub const DEFAULT_MTU_FILE: &str = "/var/lib/calico/mtu";
/// The MTU used when neither the config nor the MTU file sets one (Linux's default).
pub const DEFAULT_MTU: u32 = 1500;
/// Overrides the IPAM lock path (tests; several nodes on one machine).
pub const ENV_LOCK_FILE: &str = "MARGAY_IPAM_LOCK_FILE";
/// Overrides the MTU file Felix writes and the plugin reads (Felix's MARGAY_MTU_FILE).
pub const ENV_MTU_FILE: &str = "MARGAY_MTU_FILE";

/// A boolean that Calico's configs write either as `true` or as `"true"`.
fn lenient_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    let v = Option::<Value>::deserialize(d)?;
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            other => Err(serde::de::Error::custom(format!(
                "expected true or false, got {other:?}"
            ))),
        },
        Some(other) => Err(serde::de::Error::custom(format!(
            "expected true or false, got {other}"
        ))),
    }
}

fn lenient_bool_default<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(lenient_bool(d)?.unwrap_or(false))
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct IpamConf {
    #[serde(rename = "type", default)]
    pub ipam_type: String,
    #[serde(default, deserialize_with = "lenient_bool")]
    pub assign_ipv4: Option<bool>,
    #[serde(default, deserialize_with = "lenient_bool")]
    pub assign_ipv6: Option<bool>,
    #[serde(default)]
    pub ipv4_pools: Vec<String>,
    #[serde(default)]
    pub ipv6_pools: Vec<String>,
    /// host-local's `usePodCidr`; not used by margay's IPAM.
    #[serde(default)]
    pub subnet: String,
}

impl IpamConf {
    pub fn v4(&self) -> bool {
        self.assign_ipv4.unwrap_or(true)
    }
    pub fn v6(&self) -> bool {
        self.assign_ipv6.unwrap_or(false)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct KubernetesConf {
    #[serde(default)]
    pub kubeconfig: String,
    #[serde(default)]
    pub node_name: String,
    #[serde(default)]
    pub k8s_api_root: String,
}

/// Calico's `policy` block: the policy handler and, for the plugin's own Kubernetes API
/// client (the pod lookup), overrides on top of `kubernetes.kubeconfig`.
#[derive(Clone, Default, Deserialize)]
pub struct PolicyConf {
    #[serde(rename = "type", default)]
    pub policy_type: String,
    /// The API server (`https://host:port`; a trailing `/api/...` is cut off, as Calico does).
    #[serde(default)]
    pub k8s_api_root: String,
    #[serde(default)]
    pub k8s_auth_token: String,
    #[serde(default)]
    pub k8s_client_certificate: String,
    #[serde(default)]
    pub k8s_client_key: String,
    #[serde(default)]
    pub k8s_certificate_authority: String,
}

impl std::fmt::Debug for PolicyConf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a credential: never printed.
        f.debug_struct("PolicyConf")
            .field("policy_type", &self.policy_type)
            .field("k8s_api_root", &self.k8s_api_root)
            .field(
                "k8s_auth_token",
                &(!self.k8s_auth_token.is_empty()).then_some("<redacted>"),
            )
            .field("k8s_client_certificate", &self.k8s_client_certificate)
            .field("k8s_client_key", &self.k8s_client_key)
            .field("k8s_certificate_authority", &self.k8s_certificate_authority)
            .finish()
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct FeatureControl {
    #[serde(default, deserialize_with = "lenient_bool_default")]
    pub ip_addrs_no_ipam: bool,
    #[serde(default, deserialize_with = "lenient_bool_default")]
    pub floating_ips: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerSettings {
    #[serde(default, deserialize_with = "lenient_bool_default")]
    pub allow_ip_forwarding: bool,
}

/// The network configuration (Calico's `NetConf`), plus margay's `datastore_path`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NetConf {
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    #[serde(default)]
    pub name: String,
    #[serde(rename = "type", default)]
    pub plugin_type: String,
    #[serde(default)]
    pub mtu: u32,
    #[serde(default)]
    pub num_queues: u32,
    #[serde(default)]
    pub nodename: String,
    #[serde(default)]
    pub nodename_file: String,
    #[serde(default, deserialize_with = "lenient_bool_default")]
    pub nodename_file_optional: bool,
    #[serde(default)]
    pub hostname: String,
    #[serde(default)]
    pub ipam_lock_file: String,
    #[serde(default)]
    pub datastore_type: String,
    /// margay: the embedded store's file (else DATASTORE_PATH, else the default).
    #[serde(default)]
    pub datastore_path: String,
    #[serde(default)]
    pub etcd_endpoints: String,
    #[serde(default)]
    pub etcd_discovery_srv: String,
    #[serde(default)]
    pub etcd_key_file: String,
    #[serde(default)]
    pub etcd_cert_file: String,
    #[serde(default)]
    pub etcd_ca_cert_file: String,
    #[serde(default)]
    pub log_level: String,
    #[serde(default)]
    pub log_file_path: String,
    #[serde(default)]
    pub ipam: IpamConf,
    #[serde(default)]
    pub kubernetes: KubernetesConf,
    #[serde(default)]
    pub policy: PolicyConf,
    #[serde(default)]
    pub feature_control: FeatureControl,
    #[serde(default)]
    pub container_settings: ContainerSettings,
    #[serde(default)]
    pub device_type: String,
    #[serde(default)]
    pub policy_setup_timeout_seconds: i64,
    #[serde(default)]
    pub endpoint_status_dir: String,
    #[serde(rename = "prevResult", default)]
    pub prev_result: Option<Value>,
    #[serde(rename = "runtimeConfig", default)]
    pub runtime_config: Option<Value>,
    #[serde(default)]
    pub args: Option<Value>,
}

/// A parsed configuration and the version to answer in.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub conf: NetConf,
    pub version: Version,
    /// The whole configuration as given (for fields margay reads on demand).
    pub raw: Value,
}

/// The version to answer errors in when the input cannot be trusted to name one.
pub fn sniff_version(stdin: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
        .filter(|v| Version::parse(v).is_some_and(Version::is_supported))
        .unwrap_or_else(|| crate::spec::LATEST.to_string())
}

/// Parses and checks the network configuration.
pub fn parse_netconf(stdin: &[u8]) -> Result<Parsed, CniError> {
    if stdin.iter().all(u8::is_ascii_whitespace) {
        return Err(CniError::new(
            code::DECODE,
            "no network configuration on stdin: the runtime must pass the network's JSON config",
        ));
    }
    let value: Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            code::DECODE,
            "the network configuration on stdin is not valid JSON",
        )
        .with_details(e)
    })?;
    if !value.is_object() {
        return Err(CniError::new(
            code::DECODE,
            "the network configuration must be a JSON object",
        ));
    }
    let conf: NetConf = serde_path_to_error::deserialize(&value).map_err(|e| {
        CniError::new(
            code::INVALID_CONFIG,
            format!("network configuration field {}: {}", e.path(), e.inner()),
        )
    })?;
    let version = check_version(&conf.cni_version)?;
    if conf.name.trim().is_empty() {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            "network configuration: \"name\" is required (the network's name; it prefixes IPAM handles)",
        ));
    }
    if conf.policy_setup_timeout_seconds < 0 {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            format!(
                "network configuration: policy_setup_timeout_seconds is {}, it must be 0 or more",
                conf.policy_setup_timeout_seconds
            ),
        ));
    }
    match conf.device_type.as_str() {
        "" | "veth" | "netkit" => {}
        other => {
            return Err(CniError::new(
                code::INVALID_CONFIG,
                format!("network configuration: device_type {other:?} is not known (use veth)"),
            ));
        }
    }
    if !conf.ipam.v4() && !conf.ipam.v6() {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            "network configuration: ipam.assign_ipv4 and ipam.assign_ipv6 are both false, so a pod would get no address",
        ));
    }
    if let Some(prev) = &conf.prev_result
        && !prev.is_null()
        && let Err(e) = CniResult::from_json(prev)
    {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            format!("network configuration: prevResult is not a CNI result: {e}"),
        ));
    }
    Ok(Parsed {
        conf,
        version,
        raw: value,
    })
}

/// Checks `cniVersion` (required; one of [`crate::spec::SUPPORTED_VERSIONS`]).
pub fn check_version(v: &str) -> Result<Version, CniError> {
    if v.trim().is_empty() {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            format!(
                "network configuration: \"cniVersion\" is required (supported: {})",
                crate::spec::SUPPORTED_VERSIONS.join(", ")
            ),
        ));
    }
    match Version::parse(v) {
        Some(ver) if ver.is_supported() => Ok(ver),
        _ => Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "CNI version {v:?} is not supported by margay (supported: {})",
                crate::spec::SUPPORTED_VERSIONS.join(", ")
            ),
        )),
    }
}

/// The CNI command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    pub fn parse(s: &str) -> Option<Command> {
        match s {
            "ADD" => Some(Command::Add),
            "DEL" => Some(Command::Del),
            "CHECK" => Some(Command::Check),
            "STATUS" => Some(Command::Status),
            "GC" => Some(Command::Gc),
            "VERSION" => Some(Command::Version),
            _ => None,
        }
    }
}

/// The `CNI_*` environment of one call.
#[derive(Debug, Clone, Default)]
pub struct CmdArgs {
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    pub path: String,
}

/// The process environment as a table (so tests need not touch the real one).
pub type Env = HashMap<String, String>;

pub fn env_from_process() -> Env {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// Reads `CNI_COMMAND`.
pub fn command(env: &Env) -> Result<Command, CniError> {
    let raw = env.get("CNI_COMMAND").map(String::as_str).unwrap_or("");
    if raw.is_empty() {
        return Err(CniError::new(
            code::INVALID_ENV,
            "CNI_COMMAND is not set: set it to ADD, DEL, CHECK, STATUS, GC or VERSION",
        ));
    }
    Command::parse(raw).ok_or_else(|| {
        CniError::new(
            code::INVALID_ENV,
            format!(
                "CNI_COMMAND {raw:?} is not known (use ADD, DEL, CHECK, STATUS, GC or VERSION)"
            ),
        )
    })
}

/// Reads and checks the variables `cmd` needs.
pub fn cmd_args(env: &Env, cmd: Command) -> Result<CmdArgs, CniError> {
    let get = |k: &str| env.get(k).cloned().unwrap_or_default();
    let a = CmdArgs {
        container_id: get("CNI_CONTAINERID"),
        netns: get("CNI_NETNS"),
        ifname: get("CNI_IFNAME"),
        args: get("CNI_ARGS"),
        path: get("CNI_PATH"),
    };
    let per_container = matches!(cmd, Command::Add | Command::Del | Command::Check);
    let mut missing = Vec::new();
    if per_container {
        if a.container_id.is_empty() {
            missing.push("CNI_CONTAINERID");
        }
        if a.ifname.is_empty() {
            missing.push("CNI_IFNAME");
        }
        if a.netns.is_empty() && cmd != Command::Del {
            missing.push("CNI_NETNS");
        }
    }
    if cmd != Command::Version && a.path.is_empty() {
        missing.push("CNI_PATH");
    }
    if !missing.is_empty() {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!(
                "required environment variable(s) not set for {cmd:?}: {}",
                missing.join(", ")
            ),
        ));
    }
    if per_container {
        let id_ok = a
            .container_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-')
            && a.container_id
                .starts_with(|c: char| c.is_ascii_alphanumeric());
        if !id_ok {
            return Err(CniError::new(
                code::INVALID_ENV,
                format!(
                    "CNI_CONTAINERID {:?} is invalid: it must start with a letter or digit and contain only letters, digits, '_', '.' and '-'",
                    a.container_id
                ),
            ));
        }
        let name_ok = a.ifname.len() <= 15
            && a.ifname != "."
            && a.ifname != ".."
            && !a
                .ifname
                .chars()
                .any(|c| c == '/' || c == ':' || c.is_whitespace());
        if !name_ok {
            return Err(CniError::new(
                code::INVALID_ENV,
                format!(
                    "CNI_IFNAME {:?} is not a valid interface name (at most 15 characters, no '/', ':' or spaces)",
                    a.ifname
                ),
            ));
        }
    }
    Ok(a)
}

/// What `CNI_ARGS` (and the config's `args`) tell margay about the workload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadArgs {
    pub pod_name: String,
    pub pod_namespace: String,
    pub infra_container_id: String,
    /// Static addresses requested with `IP=` (at most one per family).
    pub ips: Vec<IpAddr>,
    /// Pod labels, from the config's `args.cni.labels` (CNI conventions).
    pub labels: BTreeMap<String, String>,
    /// The pod's service account, from `args.cni.serviceAccountName`.
    pub service_account: String,
}

impl WorkloadArgs {
    pub fn is_k8s(&self) -> bool {
        !self.pod_name.is_empty() && !self.pod_namespace.is_empty()
    }
}

/// The host-side interface prefix of Kubernetes pods: the first item of
/// FELIX_INTERFACEPREFIX, else `cali` (Calico's plugin reads the same variable, so the name it
/// gives the veth is the one the Kubernetes datastore derives from the pod).
pub fn interface_prefix(env: &Env) -> String {
    env.get("FELIX_INTERFACEPREFIX")
        .and_then(|v| {
            v.split(',')
                .map(str::trim)
                .find(|p| !p.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "cali".to_string())
}

/// Calico's `k8s_api_root`: the server part of the URL (older configs gave `…/api/v1/`).
fn api_root(conf: &NetConf) -> &str {
    let root = if conf.kubernetes.k8s_api_root.is_empty() {
        conf.policy.k8s_api_root.as_str()
    } else {
        conf.kubernetes.k8s_api_root.as_str()
    };
    root.split("/api/").next().unwrap_or(root)
}

/// Whether the network configuration says how to reach the Kubernetes API for the plugin's
/// own lookups (`kubernetes.kubeconfig`, or an API root). The Kubernetes datastore reaches it
/// anyway.
pub fn names_kubernetes_api(conf: &NetConf) -> bool {
    !conf.kubernetes.kubeconfig.is_empty() || !api_root(conf).is_empty()
}

fn parse_ip_list(raw: &str, origin: &str) -> Result<Vec<IpAddr>, CniError> {
    let mut out: Vec<IpAddr> = Vec::new();
    for part in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        // Accept `10.0.0.5/32` as well as the bare address.
        let bare = part.split_once('/').map_or(part, |(a, _)| a);
        let ip: IpAddr = bare.parse().map_err(|_| {
            CniError::new(
                code::INVALID_ENV,
                format!("{origin}: {part:?} is not a valid IP address"),
            )
        })?;
        if out.iter().any(|o| o.is_ipv4() == ip.is_ipv4()) {
            return Err(CniError::new(
                code::INVALID_ENV,
                format!(
                    "{origin}: more than one IPv{} address requested; a pod gets at most one of each family",
                    if ip.is_ipv4() { 4 } else { 6 }
                ),
            ));
        }
        out.push(ip);
    }
    Ok(out)
}

/// Parses `CNI_ARGS` (`K=V;K=V`) and the config's `args`.
pub fn workload_args(cni_args: &str, conf: &NetConf) -> Result<WorkloadArgs, CniError> {
    let mut w = WorkloadArgs::default();
    for pair in cni_args.split(';').filter(|p| !p.trim().is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(CniError::new(
                code::INVALID_ENV,
                format!("CNI_ARGS: {pair:?} is not a KEY=VALUE pair"),
            ));
        };
        match k.trim() {
            "K8S_POD_NAME" => w.pod_name = v.trim().to_string(),
            "K8S_POD_NAMESPACE" => w.pod_namespace = v.trim().to_string(),
            "K8S_POD_INFRA_CONTAINER_ID" => w.infra_container_id = v.trim().to_string(),
            "IP" => w.ips = parse_ip_list(v, "CNI_ARGS IP")?,
            // IgnoreUnknown is honoured implicitly: margay ignores keys it does not know,
            // as Calico does (it sets IgnoreUnknown=1 itself).
            other => tracing::debug!(key = other, "ignoring unknown CNI_ARGS key"),
        }
    }
    if let Some(cni) = conf.args.as_ref().and_then(|a| a.get("cni")) {
        if let Some(labels) = cni.get("labels") {
            w.labels = parse_labels(labels)?;
        }
        if let Some(sa) = cni.get("serviceAccountName").and_then(Value::as_str) {
            w.service_account = sa.to_string();
        }
        if w.ips.is_empty()
            && let Some(ips) = cni.get("ips").and_then(Value::as_array)
        {
            let joined: Vec<&str> = ips.iter().filter_map(Value::as_str).collect();
            w.ips = parse_ip_list(&joined.join(","), "args.cni.ips")?;
        }
    }
    if w.ips.is_empty()
        && let Some(ips) = conf
            .runtime_config
            .as_ref()
            .and_then(|r| r.get("ips"))
            .and_then(Value::as_array)
    {
        let joined: Vec<&str> = ips.iter().filter_map(Value::as_str).collect();
        w.ips = parse_ip_list(&joined.join(","), "runtimeConfig.ips")?;
    }
    Ok(w)
}

/// `[{"key": k, "value": v}, ...]` (CNI conventions) or a plain object.
fn parse_labels(v: &Value) -> Result<BTreeMap<String, String>, CniError> {
    let bad = || {
        CniError::new(
            code::INVALID_CONFIG,
            "network configuration: args.cni.labels must be a list of {\"key\": ..., \"value\": ...} or an object of strings",
        )
    };
    let mut out = BTreeMap::new();
    match v {
        Value::Array(items) => {
            for item in items {
                let k = item.get("key").and_then(Value::as_str).ok_or_else(bad)?;
                let val = item.get("value").and_then(Value::as_str).ok_or_else(bad)?;
                out.insert(k.to_string(), val.to_string());
            }
        }
        Value::Object(map) => {
            for (k, val) in map {
                out.insert(k.clone(), val.as_str().ok_or_else(bad)?.to_string());
            }
        }
        Value::Null => {}
        _ => return Err(bad()),
    }
    Ok(out)
}

/// The MTU file Felix writes: MARGAY_MTU_FILE, else Calico's.
pub fn mtu_file(env: &Env) -> PathBuf {
    env.get(ENV_MTU_FILE)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_MTU_FILE))
}

/// The IPAM lock path: MARGAY_IPAM_LOCK_FILE, else the config's `ipam_lock_file`, else
/// Calico's.
pub fn lock_path(conf: &NetConf, env: &Env) -> PathBuf {
    env.get(ENV_LOCK_FILE)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| (!conf.ipam_lock_file.is_empty()).then(|| PathBuf::from(&conf.ipam_lock_file)))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_IPAM_LOCK_FILE))
}

/// The datastore: Calico's environment variables, with the config file's datastore fields
/// taking precedence (as Calico's plugin exports them into its environment).
pub fn datastore_config(
    conf: &NetConf,
    env: &Env,
) -> Result<margay_datastore::DatastoreConfig, CniError> {
    let from_conf: Vec<(&str, &str)> = vec![
        ("DATASTORE_TYPE", conf.datastore_type.as_str()),
        ("DATASTORE_PATH", conf.datastore_path.as_str()),
        ("ETCD_ENDPOINTS", conf.etcd_endpoints.as_str()),
        ("ETCD_DISCOVERY_SRV", conf.etcd_discovery_srv.as_str()),
        ("ETCD_KEY_FILE", conf.etcd_key_file.as_str()),
        ("ETCD_CERT_FILE", conf.etcd_cert_file.as_str()),
        ("ETCD_CA_CERT_FILE", conf.etcd_ca_cert_file.as_str()),
        // Calico's plugin exports these for the Kubernetes datastore; its pod lookups add the
        // policy block's credentials. margay makes one client of both (the lookups use the
        // datastore's client in the Kubernetes datastore), so they all apply.
        ("KUBECONFIG", conf.kubernetes.kubeconfig.as_str()),
        ("K8S_API_ENDPOINT", api_root(conf)),
        ("K8S_API_TOKEN", conf.policy.k8s_auth_token.as_str()),
        ("K8S_CERT_FILE", conf.policy.k8s_client_certificate.as_str()),
        ("K8S_KEY_FILE", conf.policy.k8s_client_key.as_str()),
        (
            "K8S_CA_FILE",
            conf.policy.k8s_certificate_authority.as_str(),
        ),
    ];
    let lookup = |k: &str| {
        from_conf
            .iter()
            .find(|(n, v)| *n == k && !v.is_empty())
            .map(|(_, v)| v.to_string())
            .or_else(|| env.get(k).cloned())
    };
    margay_datastore::DatastoreConfig::from_lookup(lookup).map_err(|e| {
        CniError::new(
            code::INVALID_CONFIG,
            "the datastore settings (network config datastore_type/etcd_* or DATASTORE_*/ETCD_* variables) are unusable",
        )
        .with_details(e)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const CALICO_CONFLIST_PLUGIN: &str = r#"{
      "cniVersion": "1.0.0",
      "name": "k8s-pod-network",
      "type": "margay",
      "log_level": "info",
      "log_file_path": "/var/log/calico/cni/cni.log",
      "datastore_type": "etcdv3",
      "etcd_endpoints": "http://127.0.0.1:2379",
      "etcd_key_file": "",
      "etcd_cert_file": "",
      "etcd_ca_cert_file": "",
      "nodename": "node-1",
      "mtu": 0,
      "ipam": {"type": "calico-ipam", "assign_ipv4": "true", "assign_ipv6": "false"},
      "policy": {"type": "k8s"},
      "kubernetes": {"kubeconfig": "/etc/cni/net.d/calico-kubeconfig"},
      "container_settings": {"allow_ip_forwarding": false},
      "feature_control": {"floating_ips": false},
      "capabilities": {"portMappings": true},
      "some_future_field": {"x": 1}
    }"#;

    #[test]
    fn a_calico_plugin_config_parses() {
        let p = parse_netconf(CALICO_CONFLIST_PLUGIN.as_bytes()).unwrap();
        assert_eq!(p.version, Version(1, 0, 0));
        assert_eq!(p.conf.name, "k8s-pod-network");
        assert_eq!(p.conf.ipam.ipam_type, "calico-ipam");
        assert!(p.conf.ipam.v4());
        assert!(!p.conf.ipam.v6());
        assert_eq!(p.conf.nodename, "node-1");
        let env = Env::new();
        let ds = datastore_config(&p.conf, &env).unwrap();
        assert_eq!(ds.datastore_type, margay_datastore::DatastoreType::Etcd);
        assert_eq!(
            ds.kube.kubeconfig,
            vec![std::path::PathBuf::from("/etc/cni/net.d/calico-kubeconfig")],
            "the network config's kubernetes.kubeconfig reaches the datastore settings"
        );
        assert_eq!(ds.etcd.endpoints, vec!["http://127.0.0.1:2379".to_string()]);
    }

    #[test]
    fn bad_configs_are_named() {
        let e = parse_netconf(b"{not json").unwrap_err();
        assert_eq!(e.code, code::DECODE);
        let e = parse_netconf(b"").unwrap_err();
        assert_eq!(e.code, code::DECODE);
        let e = parse_netconf(br#"{"cniVersion":"9.9.9","name":"n"}"#).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        assert!(e.msg.contains("9.9.9") && e.msg.contains("1.1.0"), "{e}");
        let e = parse_netconf(br#"{"name":"n"}"#).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("cniVersion"), "{e}");
        let e = parse_netconf(br#"{"cniVersion":"1.0.0","name":"n","mtu":"big"}"#).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("mtu"), "{e}");
        let e = parse_netconf(br#"{"cniVersion":"1.0.0","name":"n","ipam":{"assign_ipv4":"yes"}}"#)
            .unwrap_err();
        assert!(e.msg.contains("ipam.assign_ipv4"), "{e}");
        let e = parse_netconf(br#"{"cniVersion":"1.0.0"}"#).unwrap_err();
        assert!(e.msg.contains("name"), "{e}");
        let e = parse_netconf(
            br#"{"cniVersion":"1.0.0","name":"n","ipam":{"assign_ipv4":false,"assign_ipv6":false}}"#,
        )
        .unwrap_err();
        assert!(e.msg.contains("no address"), "{e}");
        let e = parse_netconf(br#"{"cniVersion":"1.0.0","name":"n","prevResult":{"ips":[{}]}}"#)
            .unwrap_err();
        assert!(e.msg.contains("prevResult"), "{e}");
    }

    fn env(pairs: &[(&str, &str)]) -> Env {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn cni_variables() {
        let e = command(&Env::new()).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        assert_eq!(
            command(&env(&[("CNI_COMMAND", "DEL")])).unwrap(),
            Command::Del
        );
        assert!(command(&env(&[("CNI_COMMAND", "ADDX")])).is_err());
        let e = cmd_args(&env(&[("CNI_PATH", "/opt/cni/bin")]), Command::Add).unwrap_err();
        assert!(
            e.msg.contains("CNI_CONTAINERID")
                && e.msg.contains("CNI_IFNAME")
                && e.msg.contains("CNI_NETNS"),
            "{e}"
        );
        let ok = env(&[
            ("CNI_CONTAINERID", "abc123"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ]);
        assert!(cmd_args(&ok, Command::Del).is_ok());
        assert!(cmd_args(&ok, Command::Add).is_err());
        let mut bad = ok.clone();
        bad.insert("CNI_CONTAINERID".into(), "a/b".into());
        assert!(
            cmd_args(&bad, Command::Del)
                .unwrap_err()
                .msg
                .contains("CNI_CONTAINERID")
        );
        let mut bad = ok;
        bad.insert("CNI_IFNAME".into(), "a-very-long-interface-name".into());
        assert!(
            cmd_args(&bad, Command::Del)
                .unwrap_err()
                .msg
                .contains("CNI_IFNAME")
        );
    }

    #[test]
    fn cni_args() {
        let conf = NetConf::default();
        let w = workload_args(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;FOO=bar",
            &conf,
        )
        .unwrap();
        assert!(w.is_k8s());
        assert_eq!(w.pod_namespace, "ns1");
        assert_eq!(w.pod_name, "web-0");
        let w = workload_args("IP=10.0.0.7", &conf).unwrap();
        assert_eq!(w.ips, vec!["10.0.0.7".parse::<IpAddr>().unwrap()]);
        let w = workload_args("IP=10.0.0.7,fd00::7", &conf).unwrap();
        assert_eq!(w.ips.len(), 2);
        let e = workload_args("IP=10.0.0.300", &conf).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        assert!(e.msg.contains("IP") && e.msg.contains("10.0.0.300"), "{e}");
        assert!(workload_args("IP=10.0.0.1,10.0.0.2", &conf).is_err());
        assert!(workload_args("garbage", &conf).is_err());
    }

    #[test]
    fn labels_from_args() {
        let conf: NetConf = serde_json::from_str(
            r#"{"args":{"cni":{"labels":[{"key":"app","value":"web"}],"serviceAccountName":"sa1"}}}"#,
        )
        .unwrap();
        let w = workload_args("", &conf).unwrap();
        assert_eq!(w.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(w.service_account, "sa1");
    }

    #[test]
    fn the_kubernetes_api_settings_of_calicos_conflists() {
        let conf: NetConf = serde_json::from_str(
            r#"{"datastore_type": "kubernetes",
                "kubernetes": {"kubeconfig": "/etc/cni/net.d/calico-kubeconfig"},
                "policy": {"type": "k8s", "k8s_api_root": "https://10.96.0.1:443/api/v1/",
                           "k8s_auth_token": "s3cret", "k8s_client_certificate": "/c.pem",
                           "k8s_client_key": "/k.pem", "k8s_certificate_authority": "/ca.pem"}}"#,
        )
        .unwrap();
        assert!(names_kubernetes_api(&conf));
        assert!(
            !format!("{conf:?}").contains("s3cret"),
            "the token is not printed"
        );
        let ds = datastore_config(&conf, &Env::new()).unwrap();
        assert_eq!(
            ds.kube.kubeconfig,
            vec![PathBuf::from("/etc/cni/net.d/calico-kubeconfig")]
        );
        assert_eq!(
            ds.kube.api_endpoint.as_deref(),
            Some("https://10.96.0.1:443"),
            "the old /api/v1/ suffix is cut off, as Calico does"
        );
        assert_eq!(ds.kube.token.as_deref(), Some("s3cret"));
        assert_eq!(ds.kube.cert_file, Some(PathBuf::from("/c.pem")));
        assert_eq!(ds.kube.key_file, Some(PathBuf::from("/k.pem")));
        assert_eq!(ds.kube.ca_file, Some(PathBuf::from("/ca.pem")));
        // kubernetes.k8s_api_root wins over policy.k8s_api_root.
        let conf: NetConf = serde_json::from_str(
            r#"{"kubernetes": {"k8s_api_root": "https://a:6443"},
                "policy": {"k8s_api_root": "https://b:6443"}}"#,
        )
        .unwrap();
        assert!(names_kubernetes_api(&conf));
        let ds = datastore_config(&conf, &Env::new()).unwrap();
        assert_eq!(ds.kube.api_endpoint.as_deref(), Some("https://a:6443"));
        // Nothing named: no lookups (the environment's KUBECONFIG alone does not count).
        assert!(!names_kubernetes_api(&NetConf::default()));
    }

    #[test]
    fn interface_prefix_is_felixs() {
        assert_eq!(interface_prefix(&Env::new()), "cali");
        assert_eq!(
            interface_prefix(&env(&[("FELIX_INTERFACEPREFIX", " tap, cali")])),
            "tap"
        );
        assert_eq!(
            interface_prefix(&env(&[("FELIX_INTERFACEPREFIX", "")])),
            "cali"
        );
    }

    #[test]
    fn lock_path_precedence() {
        let mut conf = NetConf::default();
        assert_eq!(
            lock_path(&conf, &Env::new()),
            PathBuf::from(DEFAULT_IPAM_LOCK_FILE)
        );
        conf.ipam_lock_file = "/tmp/a.lock".into();
        assert_eq!(lock_path(&conf, &Env::new()), PathBuf::from("/tmp/a.lock"));
        assert_eq!(
            lock_path(&conf, &env(&[(ENV_LOCK_FILE, "/tmp/b.lock")])),
            PathBuf::from("/tmp/b.lock")
        );
    }
}
