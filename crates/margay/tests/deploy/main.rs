//! `deploy/`: margay's Kubernetes manifests, checked against margay itself.
//!
//! - `deploy/crds.yaml` is generated from `margay_kdd::crd::CALICO_CRDS` (this file holds the
//!   generator; the test fails while the checked-in file is stale, and
//!   `MARGAY_UPDATE_DEPLOY=1 cargo test -p margay --test deploy crds` rewrites it).
//! - Every document decodes as a Kubernetes object; every container runs a real margay command
//!   line (`margay <args> --help` must accept it, so a renamed subcommand or flag fails here);
//!   every environment variable set is one the command reads (FELIX_* are Felix parameters
//!   margay acts on, TYPHA_* change Typha's configuration, the rest are datastore variables or
//!   documented by the command's `--help`); every reference (ConfigMap keys, Secrets, volumes,
//!   service accounts, roles, selectors, Typha's ports and names) resolves.
//! - The real `kubectl` applies `deploy/` (and the BGP variant over it) to the API server
//!   double; margay's Kubernetes datastore works over the CRDs installed from `deploy/`.
//! - The DaemonSet's and Typha's containers run as deployed (their command lines and
//!   environment, with KUBECONFIG pointing at the double) and bring a node up: start-up
//!   registers it, the CNI configuration script writes a kubeconfig the CNI plugin connects
//!   with, Typha serves, Felix finds Typha through its Service and gets ready (its own probe
//!   says so), network-condition then clears the Node's NetworkUnavailable and sets it again on
//!   SIGTERM, confd renders through Typha. Every request each of them makes is one its
//!   ServiceAccount's roles in `deploy/rbac.yaml` allow.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Duration;

use margay_apiserver::{ApiServer, Gvr, ServerOptions};
use margay_kdd::crd::CALICO_CRDS;
use margay_testkit::roles::{self, Role, wait_until};
use serde::Deserialize;
use serde_json::{Value, json};

/// Bound on any one command or wait.
const WAIT: Duration = Duration::from_secs(60);
/// The node the DaemonSet's pod runs on, in the functional test (`spec.nodeName`).
const NODE: &str = "node-1";
/// The image every container names (a placeholder, deploy/README.md).
const IMAGE: &str = "margay:latest";
const NAMESPACE: &str = "kube-system";

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_margay")
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

// ---------------------------------------------------------------------------------------------
// Reading the manifests
// ---------------------------------------------------------------------------------------------

/// The documents of a YAML text (empty documents left out).
fn yaml_docs(text: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        let v = Value::deserialize(doc).map_err(|e| e.to_string())?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// Every manifest file under `dir` (recursively), sorted.
fn manifest_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(manifest_files(&p));
        } else if p
            .extension()
            .is_some_and(|x| x == "yaml" || x == "yml" || x == "json")
        {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn rel(p: &Path) -> String {
    p.strip_prefix(deploy_dir())
        .unwrap_or(p)
        .display()
        .to_string()
}

/// A set of manifests (what one `kubectl apply` installs).
struct Manifests {
    docs: Vec<(String, Value)>,
}

impl Manifests {
    fn read(files: &[PathBuf]) -> Manifests {
        let mut docs = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(f).unwrap();
            for d in yaml_docs(&text).unwrap_or_else(|e| panic!("{}: {e}", rel(f))) {
                docs.push((rel(f), d));
            }
        }
        Manifests { docs }
    }

    /// `kubectl apply -f deploy/`: the top-level files (the default, VXLAN installation).
    fn default_set() -> Manifests {
        let files: Vec<PathBuf> = manifest_files(&deploy_dir())
            .into_iter()
            .filter(|f| f.parent() == Some(deploy_dir().as_path()))
            .collect();
        Manifests::read(&files)
    }

    /// The BGP installation: deploy/ with deploy/bgp/margay-node.yaml instead of
    /// deploy/margay-node.yaml.
    fn bgp_set() -> Manifests {
        let files: Vec<PathBuf> = manifest_files(&deploy_dir())
            .into_iter()
            .filter(|f| {
                (f.parent() == Some(deploy_dir().as_path())
                    && f.file_name().unwrap() != "margay-node.yaml")
                    || f.ends_with("bgp/margay-node.yaml")
            })
            .collect();
        Manifests::read(&files)
    }

    /// The etcd installation: deploy/rbac.yaml and deploy/etcd/ (no CRDs, no Typha).
    fn etcd_set() -> Manifests {
        let files: Vec<PathBuf> = manifest_files(&deploy_dir())
            .into_iter()
            .filter(|f| f.ends_with("rbac.yaml") || rel(f).starts_with("etcd/"))
            .collect();
        Manifests::read(&files)
    }

    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.docs
            .iter()
            .map(|(_, d)| d)
            .filter(move |d| d["kind"] == kind)
    }

    fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.docs
            .iter()
            .map(|(_, d)| d)
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
    }

    fn get(&self, kind: &str, name: &str) -> &Value {
        self.find(kind, name)
            .unwrap_or_else(|| panic!("no {kind} {name:?} in the manifests"))
    }

    /// Every workload's pod spec: (workload kind/name, pod spec).
    fn pod_specs(&self) -> Vec<(String, &Value)> {
        self.docs
            .iter()
            .map(|(_, d)| d)
            .filter(|d| d["kind"] == "DaemonSet" || d["kind"] == "Deployment")
            .map(|d| {
                (
                    format!(
                        "{}/{}",
                        d["kind"].as_str().unwrap(),
                        d["metadata"]["name"].as_str().unwrap()
                    ),
                    &d["spec"]["template"]["spec"],
                )
            })
            .collect()
    }

    /// The value of a ConfigMap key (the object and the key must exist).
    fn config_value(&self, name: &str, key: &str) -> Result<String, String> {
        let cm = self
            .find("ConfigMap", name)
            .ok_or_else(|| format!("no ConfigMap {name:?}"))?;
        cm["data"][key]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("ConfigMap {name:?} has no key {key:?}"))
    }
}

/// A container of a pod spec, with where it is.
struct Container<'a> {
    /// `DaemonSet/margay-node initContainers[node-startup]`.
    at: String,
    spec: &'a Value,
    pod: &'a Value,
}

fn containers<'a>(m: &'a Manifests) -> Vec<Container<'a>> {
    let mut out = Vec::new();
    for (workload, pod) in m.pod_specs() {
        for list in ["initContainers", "containers"] {
            for c in pod[list].as_array().into_iter().flatten() {
                out.push(Container {
                    at: format!("{workload} {list}[{}]", c["name"].as_str().unwrap_or("?")),
                    spec: c,
                    pod,
                });
            }
        }
    }
    out
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

impl Container<'_> {
    fn name(&self) -> &str {
        self.spec["name"].as_str().unwrap()
    }

    /// The command line (command, then args).
    fn argv(&self) -> Vec<String> {
        let mut v = strings(&self.spec["command"]);
        v.extend(strings(&self.spec["args"]));
        v
    }

    /// The exec probes' and hooks' command lines.
    fn probe_argvs(&self) -> Vec<(String, Vec<String>)> {
        let mut out = Vec::new();
        for p in ["livenessProbe", "readinessProbe", "startupProbe"] {
            if self.spec[p]["exec"].is_object() {
                out.push((p.to_string(), strings(&self.spec[p]["exec"]["command"])));
            }
        }
        for h in ["postStart", "preStop"] {
            if self.spec["lifecycle"][h]["exec"].is_object() {
                out.push((
                    h.to_string(),
                    strings(&self.spec["lifecycle"][h]["exec"]["command"]),
                ));
            }
        }
        out
    }

    /// The script of a `/bin/sh -c SCRIPT` container.
    fn script(&self) -> Option<String> {
        let argv = self.argv();
        (argv.len() == 3 && (argv[0] == "/bin/sh" || argv[0] == "sh") && argv[1] == "-c")
            .then(|| argv[2].clone())
    }

    /// The environment, with each value resolved: ConfigMap keys from the manifests,
    /// `spec.nodeName` as [`NODE`]. Anything unresolvable is an error.
    fn env(&self, m: &Manifests) -> Result<Vec<(String, String)>, String> {
        let mut out = Vec::new();
        for e in self.spec["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().ok_or("an env entry without a name")?;
            let value = if let Some(v) = e.get("value") {
                v.as_str()
                    .ok_or_else(|| format!("{name}: value is not a string: {v}"))?
                    .to_string()
            } else if let Some(r) = e.pointer("/valueFrom/configMapKeyRef") {
                m.config_value(
                    r["name"].as_str().unwrap_or(""),
                    r["key"].as_str().unwrap_or(""),
                )
                .map_err(|err| format!("{name}: {err}"))?
            } else if let Some(r) = e.pointer("/valueFrom/fieldRef") {
                match r["fieldPath"].as_str() {
                    Some("spec.nodeName") => NODE.to_string(),
                    other => return Err(format!("{name}: fieldRef {other:?} not expected")),
                }
            } else {
                return Err(format!("{name}: neither value nor a known valueFrom: {e}"));
            };
            out.push((name.to_string(), value));
        }
        if self.spec.get("envFrom").is_some() {
            return Err("envFrom hides which variables are set; list them under env".into());
        }
        Ok(out)
    }

    /// The volume mounted at `path` (its definition in the pod spec).
    fn volume_at(&self, path: &str) -> Option<&Value> {
        let mount = self.spec["volumeMounts"]
            .as_array()?
            .iter()
            .find(|v| v["mountPath"] == path)?;
        self.pod["volumes"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == mount["name"])
    }

    /// The host path mounted at `path`.
    fn host_path_at(&self, path: &str) -> Option<String> {
        self.volume_at(path)?["hostPath"]["path"]
            .as_str()
            .map(str::to_string)
    }
}

fn is_margay(argv: &[String]) -> bool {
    argv.first()
        .is_some_and(|a| a == "margay" || a.ends_with("/margay"))
}

// ---------------------------------------------------------------------------------------------
// Running margay
// ---------------------------------------------------------------------------------------------

fn show(o: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `margay` with an empty environment (PATH kept, HOME a directory of the test's).
fn margay(home: &Path) -> Command {
    let mut c = Command::new(bin());
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home);
    c
}

/// `margay ARGS --help`: the help text if margay accepts the command line, else why not.
fn margay_help(args: &[String]) -> Result<String, String> {
    let home = tempfile::tempdir().unwrap();
    let mut c = margay(home.path());
    c.args(args).arg("--help");
    let o = roles::run_within(c, WAIT);
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    }
}

/// Whether this margay has the role (kube-controllers is being added to the binary).
fn has_role(role: &str) -> bool {
    let top = margay_help(&[]).unwrap();
    top.lines()
        .any(|l| l.split_whitespace().next() == Some(role))
}

/// Bounded wait (WAIT) until `f` answers.
fn wait_for<T>(what: &str, f: impl FnMut() -> Result<T, String>) -> T {
    wait_until(what, WAIT, f)
}

/// The status code of one GET on 127.0.0.1.
fn http_get(port: u16, path: &str) -> Option<u16> {
    roles::http_get(port, path).map(|(code, _)| code)
}

const CRDS_FILE: &str = "crds.yaml";

const NODES: Gvr<'static> = Gvr::core("nodes");

const PODS: Gvr<'static> = Gvr::core("pods");

const NAMESPACES: Gvr<'static> = Gvr::core("namespaces");

const SLICES: Gvr<'static> = Gvr::new("discovery.k8s.io", "v1", "endpointslices");

mod crds;
mod documents;
mod etcd;
mod kubectl;
mod node;
mod references;
