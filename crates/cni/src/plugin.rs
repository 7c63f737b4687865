//! The plugins' commands: ADD, DEL, CHECK, STATUS, GC and VERSION for `margay` (the main
//! plugin) and `margay-ipam` (IPAM only).
//!
//! ADD writes in this order, so a crash at any point leaves nothing DEL cannot remove:
//! IPAM (handle `<network>.<containerID>`, which DEL releases) → interfaces → the
//! WorkloadEndpoint. A failure after the allocation releases the handle and removes the
//! interfaces before the error is reported. DEL removes everything it can (endpoint,
//! interfaces, both handle forms), treats what is already gone as done, and reports every
//! error it met.

use std::collections::{BTreeSet, HashSet};
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use margay_api::{Kind, Resource, ResourceKey, WorkloadEndpoint};
use margay_datastore::kube::KubeBackend;
use margay_datastore::kube::api::ApiError;
use margay_datastore::kube::route::{NAMESPACES, PODS};
use margay_datastore::{AnyBackend, Client, DatastoreError, KvBackend};
use margay_ipam::{AssignArgs, AssignedIp, HostLock, Ipam, IpamError};
use serde_json::Value;

use crate::config::{
    self, CmdArgs, Command, DEFAULT_MTU, DEFAULT_NODENAME_FILE, Env, NetConf, WorkloadArgs,
};
use crate::dataplane::{self, DataplaneError};
use crate::k8s::{self, AddressPlan};
use crate::spec::{CniError, CniResult, Interface, IpConfig, Version, code, version_info};
use crate::storm::Slot;
use crate::workload::Identity;

// One module per command (each adds methods to `Call`); the dispatch, the shared look-ups
// and the delegated IPAM plugin's call site stay here.
mod add;
mod check;
mod del;
mod gc;
mod pod;
mod status;

/// Which plugin this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginKind {
    /// `margay` (Calico's `calico`): interfaces, routes, IPAM and the WorkloadEndpoint.
    Main,
    /// `margay-ipam` (Calico's `calico-ipam`): addresses only.
    Ipam,
}

/// How long one call may take in total before it reports "try again later".
const CALL_TIMEOUT: Duration = Duration::from_secs(90);
/// How long to wait for the node name file (margay node writes it when it has started).
const NODENAME_WAIT: Duration = Duration::from_secs(2);
/// How long the pod lookup (pod and namespace) may take before ADD says "try again later".
const POD_LOOKUP_TIMEOUT: Duration = Duration::from_secs(20);
/// Test-only: `MARGAY_CNI_TEST_PAUSE=<stage>:<ms>` pauses ADD after a stage (`ipam`, `veth`),
/// so tests can kill the plugin at a known point. Never set it in production.
pub const ENV_TEST_PAUSE: &str = "MARGAY_CNI_TEST_PAUSE";

/// Runs one plugin call: reads the command from `env` and the configuration from `stdin`,
/// writes the result (or a CNI error object) on `out`, returns the exit code.
pub fn run(kind: PluginKind, env: &Env, stdin: &[u8], out: &mut dyn Write) -> u8 {
    let (answer, version) = answer(kind, env, stdin);
    let text = match &answer {
        Ok(Some(v)) => Some(v.to_string()),
        Ok(None) => None,
        Err(e) => {
            tracing::error!(code = e.code, "{e}");
            Some(e.to_json(&version).to_string())
        }
    };
    if let Some(t) = text {
        let _ = writeln!(out, "{t}");
    }
    let _ = out.flush();
    u8::from(answer.is_err())
}

/// The JSON to print (None for commands that print nothing) and the version to answer in.
fn answer(kind: PluginKind, env: &Env, stdin: &[u8]) -> (Result<Option<Value>, CniError>, String) {
    let sniffed = config::sniff_version(stdin);
    let cmd = match config::command(env) {
        Ok(c) => c,
        Err(e) => return (Err(e), sniffed),
    };
    if cmd == Command::Version {
        let requested = serde_json::from_slice::<Value>(stdin)
            .ok()
            .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
            .filter(|v| Version::parse(v).is_some())
            .unwrap_or_else(|| crate::spec::LATEST.to_string());
        return (Ok(Some(version_info(&requested))), requested);
    }
    let parsed = match config::parse_netconf(stdin) {
        Ok(p) => p,
        Err(e) => return (Err(e), sniffed),
    };
    let version = parsed.version;
    let vs = version.to_string();
    let allowed = match cmd {
        Command::Check => version.has_check(),
        Command::Status | Command::Gc => version.has_status_and_gc(),
        _ => true,
    };
    if !allowed {
        return (
            Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!(
                    "config version {version} does not allow {cmd:?} (set cniVersion to 1.1.0 or later for STATUS/GC, 0.4.0 or later for CHECK)"
                ),
            )),
            vs,
        );
    }
    let args = match config::cmd_args(env, cmd) {
        Ok(a) => a,
        Err(e) => return (Err(e), vs),
    };
    let call = Call {
        kind,
        cmd,
        conf: parsed.conf,
        raw: parsed.raw,
        stdin: stdin.to_vec(),
        version,
        args,
        env: env.clone(),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return (
                Err(CniError::new(code::PLUGIN, "cannot start the async runtime").with_details(e)),
                vs,
            );
        }
    };
    let result = rt.block_on(async {
        match tokio::time::timeout(CALL_TIMEOUT, call.dispatch()).await {
            Ok(r) => r,
            Err(_) => Err(CniError::new(
                code::TRY_AGAIN_LATER,
                format!("{cmd:?} did not finish within {CALL_TIMEOUT:?}; try again later"),
            )),
        }
    });
    (result, vs)
}

/// One plugin call.
struct Call {
    kind: PluginKind,
    cmd: Command,
    conf: NetConf,
    raw: Value,
    /// The configuration as received (passed on to a delegated IPAM plugin).
    stdin: Vec<u8>,
    version: Version,
    args: CmdArgs,
    env: Env,
}

/// The datastore, IPAM and resource client of one call.
struct Store {
    client: Client<AnyBackend>,
    ipam: Ipam<AnyBackend>,
    describe: String,
}

impl Store {
    /// The Kubernetes datastore's backend (its client also serves the pod lookups).
    fn kube(&self) -> Option<&KubeBackend> {
        match self.client.backend() {
            AnyBackend::Kube(k) => Some(k),
            _ => None,
        }
    }
}

/// What one ADD asks IPAM for, and where the pod's annotations said so (for errors).
struct Request {
    /// Specific addresses (assign_ip), else `v4`/`v6` from the pools (auto_assign).
    ips: Vec<IpAddr>,
    ips_origin: Option<String>,
    v4: bool,
    v6: bool,
    v4_pools: Vec<String>,
    v6_pools: Vec<String>,
    /// The pools annotations (IPv4, IPv6) the pool lists came from.
    pools_origin: [Option<k8s::Pools>; 2],
}

impl Request {
    /// An IPAM error, naming the annotation that led to it when one did.
    fn error(&self, e: IpamError) -> CniError {
        let pools_origin = match &e {
            IpamError::NoSuchPool { version, .. } => {
                self.pools_origin[usize::from(*version == 6)].as_ref()
            }
            IpamError::PoolUnusable { pool, .. } => self
                .pools_origin
                .iter()
                .flatten()
                .find(|p| p.pools.contains(pool)),
            _ => None,
        };
        if let Some(p) = pools_origin {
            return CniError::new(code::POD, format!("{}: {e}", p.origin));
        }
        ipam_error(e)
    }

    /// An error of assigning one of `ips`.
    fn ip_error(&self, e: IpamError) -> CniError {
        let mut err = ipam_error(e);
        if let Some(origin) = &self.ips_origin {
            err.msg = format!("{origin}: {}", err.msg);
        }
        err
    }
}

/// A Kubernetes pod read from the API for ADD, and what its annotations ask for.
struct PodFacts {
    pod: k8s::Pod,
    plan: AddressPlan,
}

/// The pod lookup within [`POD_LOOKUP_TIMEOUT`] (a hung API server is "try again later").
async fn bounded_lookup<T>(
    ident: &Identity,
    lookup: impl std::future::Future<Output = Result<T, CniError>>,
) -> Result<T, CniError> {
    match tokio::time::timeout(POD_LOOKUP_TIMEOUT, lookup).await {
        Ok(r) => r,
        Err(_) => Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!(
                "the Kubernetes API did not answer the lookup of pod {}/{} within {POD_LOOKUP_TIMEOUT:?}; try again later",
                ident.namespace, ident.pod
            ),
        )),
    }
}

/// A failed Kubernetes API request of the pod lookup, as a CNI error.
fn api_error(what: &str, e: ApiError) -> CniError {
    match e {
        ApiError::Unavailable(m) | ApiError::Gone(m) => CniError::new(
            code::TRY_AGAIN_LATER,
            format!("{what}: the Kubernetes API did not answer ({m}); try again later"),
        ),
        ApiError::Denied(m) => CniError::new(
            code::PLUGIN,
            format!("{what}: {m} (the plugin needs get on pods and namespaces)"),
        ),
        other => CniError::new(code::PLUGIN, format!("{what}: {other}")),
    }
}

fn ipam_error(e: IpamError) -> CniError {
    let c = match &e {
        IpamError::NoPools { .. }
        | IpamError::Exhausted { .. }
        | IpamError::PoolUnusable { .. } => code::NO_ADDRESS,
        IpamError::NotInPool { .. } | IpamError::InUse { .. } | IpamError::Reserved { .. } => {
            code::ADDRESS_REFUSED
        }
        IpamError::NoSuchPool { .. } => code::INVALID_CONFIG,
        IpamError::TooManyRetries { .. } | IpamError::BadSequenceNumber { .. } => {
            code::TRY_AGAIN_LATER
        }
        IpamError::Lock { .. } => code::IO_FAILURE,
        IpamError::Datastore(d) if d.is_transient() => code::TRY_AGAIN_LATER,
        _ => code::DATASTORE,
    };
    CniError::new(c, e.to_string())
}

fn datastore_error(what: &str, e: DatastoreError) -> CniError {
    let c = if e.is_transient() {
        code::TRY_AGAIN_LATER
    } else {
        code::DATASTORE
    };
    CniError::new(c, format!("{what}: {e}"))
}

fn dataplane_error(e: DataplaneError) -> CniError {
    match &e {
        DataplaneError::Netns { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            CniError::new(
                code::UNKNOWN_CONTAINER,
                format!("{e} (CNI_NETNS must name the container's network namespace)"),
            )
        }
        DataplaneError::Netns { source, .. }
            if source.kind() == std::io::ErrorKind::InvalidInput =>
        {
            CniError::new(code::INVALID_ENV, format!("CNI_NETNS: {e}"))
        }
        _ => CniError::new(code::DATAPLANE, e.to_string()),
    }
}

/// Runs blocking dataplane work off the runtime thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DataplaneError> + Send + 'static,
) -> Result<T, CniError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(dataplane_error),
        Err(e) => Err(CniError::new(code::PLUGIN, "dataplane task failed").with_details(e)),
    }
}

fn test_pause(env: &Env, stage: &str) {
    let Some(spec) = env.get(ENV_TEST_PAUSE) else {
        return;
    };
    let Some((s, ms)) = spec.split_once(':') else {
        return;
    };
    if s != stage {
        return;
    }
    let ms: u64 = ms.parse().unwrap_or(0);
    // Straight to stderr, whatever the log settings: tests wait for this line.
    eprintln!("margay-cni test hook: pausing {ms} ms after {stage}");
    std::thread::sleep(Duration::from_millis(ms));
}

impl Call {
    async fn dispatch(&self) -> Result<Option<Value>, CniError> {
        match self.cmd {
            Command::Add => self.add().await.map(|r| Some(r.to_json(self.version))),
            Command::Del => self.del().await.map(|()| None),
            Command::Check => self.check().await.map(|()| None),
            Command::Status => self.status().await.map(|()| None),
            Command::Gc => self.gc().await.map(|()| None),
            Command::Version => Ok(Some(version_info(&self.version.to_string()))),
        }
    }

    /// Whether margay assigns the addresses itself (`margay-ipam`, or `calico-ipam`, which
    /// margay serves), rather than delegating to another IPAM plugin in CNI_PATH.
    fn builtin_ipam(&self) -> bool {
        self.kind == PluginKind::Ipam
            || matches!(
                self.conf.ipam.ipam_type.as_str(),
                "" | "margay-ipam" | "calico-ipam"
            )
    }

    /// Runs the delegated IPAM plugin for `command` (off the runtime thread).
    async fn delegate(&self, command: &'static str) -> Result<Option<Value>, CniError> {
        let (plugin, env, stdin) = (
            self.conf.ipam.ipam_type.clone(),
            self.env.clone(),
            self.stdin.clone(),
        );
        match tokio::task::spawn_blocking(move || {
            crate::delegate::exec(&plugin, command, &env, &stdin)
        })
        .await
        {
            Ok(r) => r,
            Err(e) => {
                Err(CniError::new(code::PLUGIN, "IPAM delegation task failed").with_details(e))
            }
        }
    }

    /// The node name: the config's `nodename`, else the node name file, else the host name.
    /// Unless `nodename_file_optional`, the node name file must exist (margay node has
    /// started), as Calico requires; it is waited for briefly.
    async fn nodename(&self) -> Result<String, CniError> {
        let path = if self.conf.nodename_file.is_empty() {
            PathBuf::from(DEFAULT_NODENAME_FILE)
        } else {
            PathBuf::from(&self.conf.nodename_file)
        };
        let mut from_file = None;
        let deadline = tokio::time::Instant::now() + NODENAME_WAIT;
        loop {
            match std::fs::read_to_string(&path) {
                Ok(s) => {
                    from_file = Some(s.trim().to_string()).filter(|s| !s.is_empty());
                    break;
                }
                Err(e) if self.conf.nodename_file_optional => {
                    tracing::debug!(path = %path.display(), "no node name file: {e}");
                    break;
                }
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(CniError::new(
                        code::NODENAME,
                        format!(
                            "{}: {e}: check that margay node (calico-node) is running and has written it (or set nodename_file_optional)",
                            path.display()
                        ),
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        if !self.conf.nodename.is_empty() {
            return Ok(self.conf.nodename.clone());
        }
        if let Some(n) = from_file {
            return Ok(n);
        }
        if !self.conf.kubernetes.node_name.is_empty() {
            return Ok(self.conf.kubernetes.node_name.clone());
        }
        if !self.conf.hostname.is_empty() {
            return Ok(self.conf.hostname.clone());
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_lowercase())
            .unwrap_or_default();
        if host.is_empty() {
            return Err(CniError::new(
                code::NODENAME,
                "cannot determine the node name: set nodename in the network configuration",
            ));
        }
        Ok(host)
    }

    fn mtu(&self) -> u32 {
        if self.conf.mtu > 0 {
            return self.conf.mtu;
        }
        std::fs::read_to_string(config::mtu_file(&self.env))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .filter(|m| *m > 0)
            .unwrap_or(DEFAULT_MTU)
    }

    async fn connect(&self) -> Result<Store, CniError> {
        let cfg = config::datastore_config(&self.conf, &self.env)?;
        let describe = cfg.describe();
        let backend =
            match tokio::time::timeout(Duration::from_secs(30), cfg.connect_existing()).await {
                Ok(Ok(b)) => b,
                Ok(Err(e)) => {
                    return Err(CniError::new(
                        code::TRY_AGAIN_LATER,
                        format!("cannot reach the datastore ({describe}); try again later"),
                    )
                    .with_details(e));
                }
                Err(_) => {
                    return Err(CniError::new(
                        code::TRY_AGAIN_LATER,
                        format!(
                            "the datastore ({describe}) did not answer within 30s; try again later"
                        ),
                    ));
                }
            };
        let lock = Arc::new(HostLock::new(config::lock_path(&self.conf, &self.env)));
        Ok(Store {
            client: Client::new(backend.clone()),
            ipam: Ipam::new(backend).with_host_lock(lock),
            describe,
        })
    }

    fn workload(&self) -> Result<WorkloadArgs, CniError> {
        config::workload_args(&self.args.args, &self.conf)
    }

    fn identity(&self, w: &WorkloadArgs, node: &str) -> Identity {
        Identity::new(&self.args, w, node, &self.conf.name)
            .with_interface_prefix(&config::interface_prefix(&self.env))
    }

    fn conf_value(&self, field: &str) -> Option<Value> {
        self.raw.get(field).cloned()
    }
}

fn node_of(ident: &Identity) -> String {
    ident.node.clone()
}

/// Helper for tests and tools: the nodename file path a config resolves to.
pub fn nodename_file(conf: &NetConf) -> &Path {
    if conf.nodename_file.is_empty() {
        Path::new(DEFAULT_NODENAME_FILE)
    } else {
        Path::new(&conf.nodename_file)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn call(kind: PluginKind, env: &[(&str, &str)], stdin: &str) -> (u8, Value) {
        let env: Env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut out = Vec::new();
        let code = run(kind, &env, stdin.as_bytes(), &mut out);
        let v = if out.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&out).unwrap()
        };
        (code, v)
    }

    const ENV: &[(&str, &str)] = &[
        ("CNI_CONTAINERID", "abc"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_NETNS", "/run/netns/mgy-nowhere"),
        ("CNI_PATH", "/opt/cni/bin"),
    ];

    fn with(cmd: &str) -> Vec<(&str, &str)> {
        let mut e = ENV.to_vec();
        e.push(("CNI_COMMAND", cmd));
        e
    }

    #[test]
    fn version_answers_in_the_requested_version() {
        let (code, v) = call(
            PluginKind::Main,
            &[("CNI_COMMAND", "VERSION")],
            r#"{"cniVersion":"0.4.0"}"#,
        );
        assert_eq!(code, 0);
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(v["supportedVersions"].as_array().unwrap().len(), 5);
        let (_, v) = call(PluginKind::Ipam, &[("CNI_COMMAND", "VERSION")], "");
        assert_eq!(v["cniVersion"], "1.1.0");
    }

    #[test]
    fn commands_the_config_version_does_not_have_are_refused() {
        let (code, v) = call(
            PluginKind::Main,
            &with("CHECK"),
            r#"{"cniVersion":"0.3.1","name":"n","type":"margay"}"#,
        );
        assert_eq!(code, 1);
        assert_eq!(v["code"], 1);
        assert_eq!(v["cniVersion"], "0.3.1");
        let (_, v) = call(
            PluginKind::Main,
            &with("STATUS"),
            r#"{"cniVersion":"1.0.0","name":"n","type":"margay"}"#,
        );
        assert_eq!(v["code"], 1, "{v}");
        assert!(v["msg"].as_str().unwrap().contains("STATUS"), "{v}");
    }

    #[test]
    fn input_errors_come_back_as_cni_errors() {
        let (code, v) = call(PluginKind::Main, &with("ADD"), "{]");
        assert_eq!((code, v["code"].as_u64()), (1, Some(6)));
        let (_, v) = call(
            PluginKind::Main,
            &[("CNI_COMMAND", "ADD")],
            r#"{"cniVersion":"1.0.0","name":"n"}"#,
        );
        assert_eq!(v["code"], 4);
        assert!(
            v["msg"].as_str().unwrap().contains("CNI_CONTAINERID"),
            "{v}"
        );
        let (_, v) = call(
            PluginKind::Main,
            &with("ADD"),
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"host-local"}}"#,
        );
        assert_eq!(v["code"], 7);
        assert!(v["msg"].as_str().unwrap().contains("host-local"), "{v}");
        assert!(v["msg"].as_str().unwrap().contains("CNI_PATH"), "{v}");
        let (_, v) = call(
            PluginKind::Main,
            &with("ADD"),
            r#"{"cniVersion":"0.2.0","name":"n"}"#,
        );
        assert_eq!(v["code"], 1);
    }

    #[test]
    fn a_missing_nodename_file_is_explained() {
        let dir = tempfile::tempdir().unwrap();
        let conf = serde_json::json!({
            "cniVersion": "1.0.0", "name": "n", "type": "margay",
            "nodename_file": dir.path().join("nodename"),
        });
        let t = std::time::Instant::now();
        let (code, v) = call(PluginKind::Main, &with("DEL"), &conf.to_string());
        assert_eq!(code, 1);
        assert_eq!(v["code"], code::NODENAME);
        assert!(v["msg"].as_str().unwrap().contains("margay node"), "{v}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn an_unreachable_datastore_means_try_again_later() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nodename"), "n1").unwrap();
        let conf = serde_json::json!({
            "cniVersion": "1.0.0", "name": "n", "type": "margay",
            "nodename_file": dir.path().join("nodename"),
            "datastore_type": "local",
            "datastore_path": dir.path().join("no-such-store.db"),
            "ipam_lock_file": dir.path().join("ipam.lock"),
        });
        let (code, v) = call(PluginKind::Ipam, &with("ADD"), &conf.to_string());
        assert_eq!(code, 1);
        assert_eq!(v["code"], code::TRY_AGAIN_LATER, "{v}");
        assert!(!dir.path().join("no-such-store.db").exists());
    }
}
