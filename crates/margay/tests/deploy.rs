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
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

// ---------------------------------------------------------------------------------------------
// 1. deploy/crds.yaml: generated from the CRD table
// ---------------------------------------------------------------------------------------------

const CRDS_FILE: &str = "crds.yaml";

/// The text of deploy/crds.yaml: one CustomResourceDefinition per entry of CALICO_CRDS.
fn generated_crds() -> String {
    let mut s = String::from(
        "# Calico's kinds as crd.projectcalico.org/v1 custom resources: one CustomResourceDefinition
# per entry of margay_kdd::crd::CALICO_CRDS (crates/kdd/src/crd.rs), with Calico's names,
# scopes and status subresources (Calico's CRDs have no short names or categories).
#
# The schemas are open: spec and status keep every field (x-kubernetes-preserve-unknown-fields).
# margay decodes every resource strictly and validates it with Calico's rules before writing
# it, and treats a stored value it cannot decode as absent, so an API-server schema would add
# no check margay relies on; a complete one would have to follow Calico's API field by field,
# and an incomplete one would make the API server drop the fields it does not list — from
# resources Calico writes, too, when margay and Calico share a cluster.
#
# GENERATED by crates/margay/tests/deploy.rs, which fails while this file is stale. Regenerate:
#   MARGAY_UPDATE_DEPLOY=1 cargo test -p margay --test deploy crds
",
    );
    for c in CALICO_CRDS {
        let status_schema = if c.has_status {
            "            status:
              type: object
              x-kubernetes-preserve-unknown-fields: true
"
        } else {
            ""
        };
        let subresources = if c.has_status {
            "      subresources:
        status: {}
"
        } else {
            ""
        };
        s.push_str(&format!(
            "---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {name}
spec:
  group: {group}
  names:
    kind: {kind}
    listKind: {list_kind}
    plural: {plural}
    singular: {singular}
  scope: {scope}
  versions:
    - name: {version}
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            apiVersion:
              type: string
            kind:
              type: string
            metadata:
              type: object
            spec:
              type: object
              x-kubernetes-preserve-unknown-fields: true
{status_schema}{subresources}",
            name = c.crd_name(),
            group = c.group,
            kind = c.kind,
            list_kind = c.list_kind,
            plural = c.plural,
            singular = c.singular,
            scope = if c.namespaced {
                "Namespaced"
            } else {
                "Cluster"
            },
            version = c.version,
        ));
    }
    s
}

/// What a CRD document says, in CrdInfo's terms.
fn crd_identity(d: &Value) -> (String, String, String, String, String, String, bool, bool) {
    let spec = &d["spec"];
    let versions = spec["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 1, "one version per CRD, as Calico's: {d}");
    let v = &versions[0];
    assert!(v["served"] == true && v["storage"] == true, "{d}");
    (
        d["metadata"]["name"].as_str().unwrap().to_string(),
        format!(
            "{}/{}",
            spec["group"].as_str().unwrap(),
            v["name"].as_str().unwrap()
        ),
        spec["names"]["kind"].as_str().unwrap().to_string(),
        spec["names"]["listKind"].as_str().unwrap().to_string(),
        spec["names"]["plural"].as_str().unwrap().to_string(),
        spec["names"]["singular"].as_str().unwrap().to_string(),
        spec["scope"] == "Namespaced",
        v.pointer("/subresources/status").is_some(),
    )
}

#[test]
fn crds_file_is_generated_from_the_crd_table() {
    let path = deploy_dir().join(CRDS_FILE);
    let want = generated_crds();
    if std::env::var("MARGAY_UPDATE_DEPLOY").as_deref() == Ok("1") {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();

    // Both ways, by content: every table entry has its CRD, and every CRD is a table entry.
    let table: BTreeSet<_> = CALICO_CRDS
        .iter()
        .map(|c| {
            (
                c.crd_name(),
                format!("{}/{}", c.group, c.version),
                c.kind.to_string(),
                c.list_kind.to_string(),
                c.plural.to_string(),
                c.singular.to_string(),
                c.namespaced,
                c.has_status,
            )
        })
        .collect();
    let docs = yaml_docs(&have).unwrap();
    for d in &docs {
        assert_eq!(d["apiVersion"], "apiextensions.k8s.io/v1", "{d}");
        assert_eq!(d["kind"], "CustomResourceDefinition", "{d}");
        assert!(d["spec"]["names"].get("shortNames").is_none(), "{d}");
    }
    let file: BTreeSet<_> = docs.iter().map(crd_identity).collect();
    let missing: Vec<_> = table.difference(&file).map(|t| &t.0).collect();
    let extra: Vec<_> = file.difference(&table).map(|t| &t.0).collect();
    assert!(
        missing.is_empty() && extra.is_empty() && docs.len() == CALICO_CRDS.len(),
        "deploy/{CRDS_FILE} and CALICO_CRDS differ: missing or different {missing:?}, not in the table {extra:?}; regenerate with MARGAY_UPDATE_DEPLOY=1 cargo test -p margay --test deploy crds"
    );
    assert!(
        have == want,
        "deploy/{CRDS_FILE} is stale; regenerate with MARGAY_UPDATE_DEPLOY=1 cargo test -p margay --test deploy crds"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Every document, every command line, every variable
// ---------------------------------------------------------------------------------------------

/// Kinds that live outside namespaces.
const CLUSTER_SCOPED: &[&str] = &[
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "Namespace",
];

#[test]
fn every_document_is_a_kubernetes_object() {
    let files = manifest_files(&deploy_dir());
    assert!(files.len() >= 7, "{files:?}");
    let mut seen: BTreeMap<(String, String, String, String), String> = BTreeMap::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            !text.contains('\t'),
            "{}: a tab (YAML indents with spaces)",
            rel(f)
        );
        let docs = yaml_docs(&text).unwrap_or_else(|e| panic!("{}: not YAML: {e}", rel(f)));
        assert!(!docs.is_empty(), "{}: no documents", rel(f));
        for d in docs {
            let at = format!("{}: {}", rel(f), d);
            let api_version = d["apiVersion"].as_str().unwrap_or("");
            let kind = d["kind"].as_str().unwrap_or("");
            let name = d["metadata"]["name"].as_str().unwrap_or("");
            assert!(
                !api_version.is_empty() && !kind.is_empty() && !name.is_empty(),
                "apiVersion, kind and metadata.name: {at}"
            );
            let ns = d["metadata"]["namespace"].as_str().unwrap_or("");
            if CLUSTER_SCOPED.contains(&kind) {
                assert!(ns.is_empty(), "{kind} is cluster-scoped: {at}");
            } else {
                assert_eq!(ns, NAMESPACE, "margay's objects live in kube-system: {at}");
            }
            // One object per identity in an installation; the BGP DaemonSet replaces the
            // default one (a different installation).
            let key = (
                api_version.to_string(),
                kind.to_string(),
                ns.to_string(),
                name.to_string(),
            );
            let variant = rel(f).starts_with("bgp/");
            if !variant && let Some(other) = seen.insert(key, rel(f)) {
                panic!("{kind} {name} is in both {other} and {}", rel(f));
            }
        }
    }
    // The default installation has the pieces the issue asks for.
    let m = Manifests::default_set();
    for (kind, name) in [
        ("DaemonSet", "margay-node"),
        ("Deployment", "margay-typha"),
        ("Service", "margay-typha"),
        ("PodDisruptionBudget", "margay-typha"),
        ("Deployment", "margay-kube-controllers"),
        ("ConfigMap", "margay-config"),
        ("ClusterRole", "margay-node"),
        ("ClusterRole", "margay-cni-plugin"),
        ("ClusterRole", "margay-kube-controllers"),
    ] {
        m.get(kind, name);
    }
    assert_eq!(
        m.of_kind("CustomResourceDefinition").count(),
        CALICO_CRDS.len()
    );
    for (at, pod) in m.pod_specs() {
        for c in ["initContainers", "containers"] {
            for c in pod[c].as_array().into_iter().flatten() {
                assert_eq!(c["image"], IMAGE, "{at}: the documented image placeholder");
            }
        }
    }
}

#[test]
fn every_container_runs_a_margay_command_line() {
    let kube_controllers = has_role("kube-controllers");
    let bird_help = roles::run_within(
        {
            let mut c = Command::new("bird");
            c.arg("--help");
            c
        },
        WAIT,
    );
    let mut checked = 0;
    for m in [Manifests::default_set(), Manifests::bgp_set()] {
        for c in containers(&m) {
            let mut lines = vec![("command".to_string(), c.argv())];
            lines.extend(c.probe_argvs());
            for (what, argv) in lines {
                assert!(!argv.is_empty(), "{} {what}: no command", c.at);
                if is_margay(&argv) {
                    if argv.get(1).is_some_and(|r| r == "kube-controllers") && !kube_controllers {
                        eprintln!(
                            "NOT CHECKED: {} {what} {argv:?}: this margay has no kube-controllers role yet",
                            c.at
                        );
                        continue;
                    }
                    if let Err(e) = margay_help(&argv[1..]) {
                        panic!("{} {what}: margay does not take {argv:?}:\n{e}", c.at);
                    }
                    checked += 1;
                } else if let Some(script) = (what == "command").then(|| c.script()).flatten() {
                    // A script that ends in `exec bird …`: BIRD's own flags.
                    if let Some(line) = script
                        .lines()
                        .map(str::trim)
                        .find(|l| l.starts_with("exec bird "))
                    {
                        let help = String::from_utf8_lossy(&bird_help.stdout).into_owned()
                            + &String::from_utf8_lossy(&bird_help.stderr);
                        assert!(
                            help.contains("-c <config-file>"),
                            "no BIRD to check {line:?} against (Debian's bird2): {help}"
                        );
                        for flag in line.split_whitespace().filter(|t| t.starts_with('-')) {
                            assert!(
                                help.contains(&format!("  {flag} ")),
                                "{}: BIRD has no {flag} ({line:?}):\n{help}",
                                c.at
                            );
                        }
                        checked += 1;
                    }
                    // Other scripts run in dataplane_and_typha_run_as_deployed_within_their_rbac.
                } else {
                    panic!(
                        "{} {what}: {argv:?} is neither margay nor a shell script",
                        c.at
                    );
                }
            }
        }
    }
    assert!(checked >= 10, "only {checked} command lines checked");
}

/// Every variable margay's datastore settings read (DatastoreConfig asks for them).
fn datastore_variables() -> BTreeSet<String> {
    let asked = Mutex::new(BTreeSet::new());
    for (ty, extra) in [
        ("kubernetes", None),
        ("etcdv3", Some(("ETCD_ENDPOINTS", "http://127.0.0.1:1"))),
        ("local", Some(("DATASTORE_PATH", "/nonexistent/ds.db"))),
    ] {
        let _ = margay_datastore::DatastoreConfig::from_lookup(|k| {
            asked.lock().unwrap().insert(k.to_string());
            match k {
                "DATASTORE_TYPE" => Some(ty.to_string()),
                _ => extra.filter(|(n, _)| *n == k).map(|(_, v)| v.to_string()),
            }
        });
    }
    let asked = asked.into_inner().unwrap();
    assert!(
        asked.contains("DATASTORE_TYPE") && asked.contains("KUBECONFIG"),
        "{asked:?}"
    );
    asked
}

/// The names a help text documents: `NAME` words, and `PREFIX_*` patterns.
fn documented(help: &str) -> (BTreeSet<String>, Vec<String>) {
    let mut names = BTreeSet::new();
    let mut prefixes = Vec::new();
    for w in help
        .split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_' || c == '*'))
    {
        if w.len() < 2 || !w.chars().any(|c| c.is_ascii_uppercase()) {
            continue;
        }
        match w.strip_suffix('*') {
            Some(p) if p.ends_with('_') => prefixes.push(p.to_string()),
            Some(_) => {}
            None => {
                names.insert(w.to_string());
            }
        }
    }
    (names, prefixes)
}

/// FELIX_* variables: each is a Felix parameter margay acts on, read from the environment
/// (`margay felix config --all --json` with exactly these variables).
fn check_felix_variables(at: &str, vars: &[(String, String)]) {
    if vars.is_empty() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let mut c = margay(home.path());
    c.args(["felix", "config", "--all", "--json", "--no-datastore", "-c"])
        .arg(home.path().join("no-felix.cfg"));
    for (k, v) in vars {
        c.env(k, v);
    }
    let o = roles::run_within(c, WAIT);
    assert!(o.status.success(), "{at}: felix config: {}", show(&o));
    let cfg: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(cfg["unknown"], json!([]), "{at}: not Felix parameters");
    assert_eq!(cfg["warnings"], json!([]), "{at}: Felix warns");
    for (k, _) in vars {
        let p = cfg["params"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["origin"] == k.as_str())
            .unwrap_or_else(|| panic!("{at}: {k} is not read as a Felix parameter"));
        assert_eq!(p["source"], "environmentVariable", "{at}: {k}: {p}");
        assert_eq!(
            p["supported"], true,
            "{at}: {k}: margay does not act on Felix's {}",
            p["name"]
        );
    }
}

/// TYPHA_* variables: each changes Typha's configuration (a value it cannot take is refused or
/// kept: an unknown parameter is ignored by Typha, so it changes nothing), and the manifest's
/// values load together.
fn check_typha_variables(at: &str, vars: &[(String, String)]) {
    use margay_typha::config::TyphaConfig;
    if vars.is_empty() {
        return;
    }
    let default = TyphaConfig::default();
    for (k, _) in vars {
        let probe = BTreeMap::from([(k.clone(), "margay-probe-value".to_string())]);
        match TyphaConfig::load(&probe, None) {
            Err(_) => {}
            Ok(c) => assert_ne!(
                c, default,
                "{at}: {k} is not a parameter margay's Typha reads"
            ),
        }
    }
    let all: BTreeMap<String, String> = vars.iter().cloned().collect();
    if let Err(e) = TyphaConfig::load(&all, None) {
        panic!("{at}: {e}");
    }
}

#[test]
fn every_variable_set_is_one_margay_reads() {
    let datastore = datastore_variables();
    let kube_controllers = has_role("kube-controllers");
    let mut checked = 0;
    for m in [Manifests::default_set(), Manifests::bgp_set()] {
        for c in containers(&m) {
            let env = c.env(&m).unwrap_or_else(|e| panic!("{}: {e}", c.at));
            let mut seen = BTreeSet::new();
            for (k, _) in &env {
                assert!(seen.insert(k.clone()), "{}: {k} set twice", c.at);
            }
            let argv = c.argv();
            let script = c.script();
            assert!(is_margay(&argv) || script.is_some(), "{}: {argv:?}", c.at);
            if argv.get(1).is_some_and(|r| r == "kube-controllers") && !kube_controllers {
                eprintln!(
                    "NOT CHECKED: {} environment: this margay has no kube-controllers role yet",
                    c.at
                );
                continue;
            }
            // What reads the environment: the script, or the margay command (its help, its
            // role's help), and the margay probes that run in the same container.
            let mut help = String::new();
            if is_margay(&argv) {
                // `margay <role>`, `margay <role> <command>`, …: the subcommand path.
                let path = argv[1..].iter().take_while(|a| !a.starts_with('-')).count();
                for n in 2..=path + 1 {
                    help += &margay_help(&argv[1..n]).unwrap();
                }
            }
            let mut runs_margay = is_margay(&argv);
            for (_, p) in c.probe_argvs() {
                if is_margay(&p) {
                    help += &margay_help(&p[1..]).unwrap();
                    runs_margay = true;
                }
            }
            let (names, prefixes) = documented(&help);
            let of = |prefix: &str| -> Vec<(String, String)> {
                env.iter()
                    .filter(|(k, _)| k.starts_with(prefix))
                    .cloned()
                    .collect()
            };
            check_felix_variables(&c.at, &of("FELIX_"));
            check_typha_variables(&c.at, &of("TYPHA_"));
            for (k, _) in &env {
                let in_script = script.as_ref().is_some_and(|s| {
                    s.contains(&format!("${k}")) || s.contains(&format!("${{{k}"))
                });
                let ok = in_script
                    || (runs_margay
                        && (k.starts_with("FELIX_")
                            || k.starts_with("TYPHA_")
                            || datastore.contains(k)
                            || names.contains(k)
                            || prefixes.iter().any(|p| k.starts_with(p.as_str()))));
                assert!(
                    ok,
                    "{}: {k} is read by nothing in the container: not used by its script, not a datastore variable, not documented by the --help of the margay commands it runs",
                    c.at
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 20, "only {checked} variables checked");
}

// ---------------------------------------------------------------------------------------------
// 3. References between the objects, and what they must agree on with margay
// ---------------------------------------------------------------------------------------------

/// `matchLabels` ⊆ labels.
fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(want) = selector["matchLabels"].as_object() else {
        return false;
    };
    !want.is_empty() && want.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn check_references(m: &Manifests) {
    for (at, pod) in m.pod_specs() {
        let volumes: BTreeMap<&str, &Value> = pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| (v["name"].as_str().unwrap(), v))
            .collect();
        let mut used = BTreeSet::new();
        for list in ["initContainers", "containers"] {
            for c in pod[list].as_array().into_iter().flatten() {
                for vm in c["volumeMounts"].as_array().into_iter().flatten() {
                    let n = vm["name"].as_str().unwrap();
                    assert!(volumes.contains_key(n), "{at}: no volume {n}");
                    used.insert(n);
                }
            }
        }
        for (n, v) in &volumes {
            assert!(used.contains(n), "{at}: volume {n} is mounted nowhere");
            if let Some(cm) = v.get("configMap") {
                let name = cm["name"].as_str().unwrap();
                for item in cm["items"].as_array().into_iter().flatten() {
                    m.config_value(name, item["key"].as_str().unwrap())
                        .unwrap_or_else(|e| panic!("{at}: volume {n}: {e}"));
                }
            }
            if let Some(s) = v.get("secret") {
                let name = s["secretName"].as_str().unwrap();
                m.find("Secret", name)
                    .unwrap_or_else(|| panic!("{at}: volume {n}: no Secret {name}"));
            }
        }
        let sa = pod["serviceAccountName"].as_str().unwrap();
        m.find("ServiceAccount", sa)
            .unwrap_or_else(|| panic!("{at}: no ServiceAccount {sa}"));
    }
    for w in m
        .docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| d["kind"] == "DaemonSet" || d["kind"] == "Deployment")
    {
        let labels = &w["spec"]["template"]["metadata"]["labels"];
        assert!(
            selects(&w["spec"]["selector"], labels),
            "{}: its selector does not select its pods",
            w["metadata"]["name"]
        );
    }
    for pdb in m.of_kind("PodDisruptionBudget") {
        let name = pdb["metadata"]["name"].as_str().unwrap();
        let w = m.get("Deployment", name);
        assert!(
            selects(
                &pdb["spec"]["selector"],
                &w["spec"]["template"]["metadata"]["labels"]
            ),
            "PodDisruptionBudget {name} selects no pod of Deployment {name}"
        );
    }
    // Bindings: to roles that exist, for service accounts that exist.
    for b in m
        .docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
    {
        let role_kind = b["roleRef"]["kind"].as_str().unwrap();
        let role = b["roleRef"]["name"].as_str().unwrap();
        assert_eq!(b["roleRef"]["apiGroup"], "rbac.authorization.k8s.io", "{b}");
        let r = m.get(role_kind, role);
        if role_kind == "Role" {
            assert_eq!(
                r["metadata"]["namespace"], b["metadata"]["namespace"],
                "{b}"
            );
        }
        for s in b["subjects"].as_array().unwrap() {
            assert_eq!(s["kind"], "ServiceAccount", "{b}");
            assert_eq!(s["namespace"], NAMESPACE, "{b}");
            m.get("ServiceAccount", s["name"].as_str().unwrap());
        }
    }
    for r in m
        .docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
    {
        for rule in r["rules"].as_array().unwrap() {
            for k in ["apiGroups", "resources", "verbs"] {
                assert!(
                    !strings(&rule[k]).is_empty(),
                    "{}: {rule}",
                    r["metadata"]["name"]
                );
            }
            for v in strings(&rule["verbs"]) {
                assert!(
                    [
                        "get",
                        "list",
                        "watch",
                        "create",
                        "update",
                        "patch",
                        "delete",
                        "deletecollection"
                    ]
                    .contains(&v.as_str()),
                    "{}: verb {v:?}",
                    r["metadata"]["name"]
                );
            }
        }
    }
    let token = m.get("Secret", "margay-cni-plugin-token");
    assert_eq!(token["type"], "kubernetes.io/service-account-token");
    m.get(
        "ServiceAccount",
        token["metadata"]["annotations"]["kubernetes.io/service-account.name"]
            .as_str()
            .unwrap(),
    );
}

/// Typha's Service, Deployment and clients agree with each other and with margay's defaults.
fn check_typha_wiring(m: &Manifests) {
    use margay_typha::config::TyphaConfig;
    use margay_typha::discovery::{DEFAULT_NAMESPACE, DEFAULT_PORT_NAME};
    let svc_name = m
        .config_value("margay-config", "typha_service_name")
        .unwrap();
    let svc = m.get("Service", &svc_name);
    assert_eq!(svc["metadata"]["namespace"], DEFAULT_NAMESPACE);
    let deploy = m.get("Deployment", &svc_name);
    let pod = &deploy["spec"]["template"]["spec"];
    assert!(selects(
        &json!({"matchLabels": svc["spec"]["selector"]}),
        &deploy["spec"]["template"]["metadata"]["labels"]
    ));
    assert_eq!(deploy["spec"]["replicas"], 3);
    assert!(
        pod.pointer("/affinity/podAntiAffinity").is_some(),
        "Typhas spread over nodes"
    );
    assert_eq!(pod["hostNetwork"], true);
    let c = containers(m)
        .into_iter()
        .find(|c| c.at.starts_with(&format!("Deployment/{svc_name} ")))
        .unwrap();
    let env: BTreeMap<String, String> = c.env(m).unwrap().into_iter().collect();
    let cfg = TyphaConfig::load(&env, None).unwrap();
    // Clients find Typha by the Service's port name; the Service reaches the container's port.
    let port = &svc["spec"]["ports"][0];
    assert_eq!(port["name"], DEFAULT_PORT_NAME);
    assert_eq!(port["targetPort"], DEFAULT_PORT_NAME);
    let cport = c.spec["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == DEFAULT_PORT_NAME)
        .unwrap();
    assert_eq!(cport["containerPort"], cfg.server_port);
    assert_eq!(port["port"], cfg.server_port);
    // Typha counts its own Service's endpoints.
    assert_eq!(cfg.k8s_service_name, svc_name);
    assert_eq!(cfg.k8s_namespace, DEFAULT_NAMESPACE);
    assert_eq!(cfg.k8s_port_name, DEFAULT_PORT_NAME);
    assert_eq!(
        cfg.connection_rebalancing_mode,
        margay_typha::config::RebalancingMode::Kubernetes
    );
    // Health probes where Typha serves health.
    assert!(cfg.health_enabled);
    for p in ["livenessProbe", "readinessProbe"] {
        let g = &c.spec[p]["httpGet"];
        assert_eq!(g["port"], cfg.health_port, "{p}");
        assert_eq!(g["host"], cfg.health_host.as_str(), "{p}");
    }
    // Draining within the grace period.
    assert_eq!(
        pod["terminationGracePeriodSeconds"],
        cfg.shutdown_timeout.as_secs(),
        "TYPHA_SHUTDOWNTIMEOUTSECS and terminationGracePeriodSeconds"
    );
    // Felix and confd look for the same Service (FELIX_TYPHAK8SNAMESPACE left at kube-system).
    for c in containers(m) {
        let env: BTreeMap<String, String> = c.env(m).unwrap().into_iter().collect();
        if let Some(s) = env.get("FELIX_TYPHAK8SSERVICENAME") {
            assert_eq!(s, &svc_name, "{}", c.at);
            assert!(!env.contains_key("FELIX_TYPHAK8SNAMESPACE"), "{}", c.at);
        }
    }
    let pdb = m.get("PodDisruptionBudget", &svc_name);
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
}

/// The CNI pieces: the conflist is a network configuration margay's plugin takes, installed
/// where the script puts it, naming the kubeconfig the script writes, logging where the node
/// keeps the plugin's log.
fn check_cni_wiring(m: &Manifests) {
    let cs = containers(m);
    let install = cs
        .iter()
        .find(|c| c.name() == "install-cni-config")
        .unwrap();
    let env: BTreeMap<String, String> = install.env(m).unwrap().into_iter().collect();
    let conf_file = &env["CNI_NETWORK_CONFIG_FILE"];
    let (mount, item) = conf_file.rsplit_once('/').unwrap();
    let vol = install.volume_at(mount).unwrap();
    let cm = vol["configMap"]["name"].as_str().unwrap();
    let key = vol["configMap"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["path"] == item)
        .unwrap()["key"]
        .as_str()
        .unwrap();
    assert_eq!(item, env["CNI_CONF_NAME"].as_str());
    let conflist: Value = serde_json::from_str(&m.config_value(cm, key).unwrap()).unwrap();
    let host_net_d = install.host_path_at(&env["CNI_NET_DIR"]).unwrap();
    assert_eq!(host_net_d, "/etc/cni/net.d");
    let plugins = conflist["plugins"].as_array().unwrap();
    let types: Vec<&str> = plugins
        .iter()
        .map(|p| p["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["margay", "portmap"]);
    // As a runtime passes it to the plugin: the list's name and version added.
    let mut plugin = plugins[0].clone();
    plugin["name"] = conflist["name"].clone();
    plugin["cniVersion"] = conflist["cniVersion"].clone();
    let parsed = margay_cni::config::parse_netconf(plugin.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("the conflist's margay plugin: {e:?}"));
    assert_eq!(parsed.conf.ipam.ipam_type, "margay-ipam");
    assert_eq!(parsed.conf.datastore_type, "kubernetes");
    assert_eq!(
        parsed.conf.kubernetes.kubeconfig,
        format!("{host_net_d}/margay-kubeconfig"),
        "the kubeconfig the script writes"
    );
    let log_dir = Path::new(&parsed.conf.log_file_path)
        .parent()
        .unwrap()
        .display()
        .to_string();
    let pod = &m.get("DaemonSet", "margay-node")["spec"]["template"]["spec"];
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["hostPath"]["path"] == log_dir.as_str()),
        "the plugin logs under {log_dir}, a directory the DaemonSet creates on the host"
    );
    // The binaries go where the runtime looks for plugins.
    let bin = cs.iter().find(|c| c.name() == "install-cni").unwrap();
    let argv = bin.argv();
    let dir = &argv[argv.iter().position(|a| a == "--dir").unwrap() + 1];
    assert_eq!(bin.host_path_at(dir).unwrap(), "/opt/cni/bin");
    // Start-up before the CNI configuration: no pod is wired on an unregistered node.
    let order: Vec<&str> = pod["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["node-startup", "install-cni", "install-cni-config"]);
}

#[test]
fn references_resolve_and_agree_with_margay() {
    for m in [Manifests::default_set(), Manifests::bgp_set()] {
        check_references(&m);
        check_typha_wiring(&m);
        check_cni_wiring(&m);
        // The host directories Calico's calico-node mounts, where margay uses them.
        let felix = containers(&m)
            .into_iter()
            .find(|c| c.name() == "felix")
            .unwrap();
        assert_eq!(felix.spec["securityContext"]["privileged"], true);
        for p in [
            "/lib/modules",
            "/run/xtables.lock",
            "/var/run/calico",
            "/var/lib/calico",
            "/var/log/calico/cni",
        ] {
            assert_eq!(
                felix.host_path_at(p).as_deref(),
                Some(p),
                "felix mounts {p}"
            );
        }
        let pod = felix.pod;
        assert_eq!(pod["hostNetwork"], true);
        // The probes ask Felix's health server, which the environment turns on.
        let env: BTreeMap<String, String> = felix.env(&m).unwrap().into_iter().collect();
        assert_eq!(env["FELIX_HEALTHENABLED"], "true");
        assert_eq!(env["DATASTORE_TYPE"], "kubernetes");
    }
}

/// The BGP DaemonSet is the default one with BGP's differences, and nothing else: start-up's
/// backend and pools, and the confd and bird containers (BIRD reading what confd writes, on
/// the socket confd and the probes use).
#[test]
fn bgp_variant_is_the_default_daemonset_plus_bird() {
    let vxlan = Manifests::default_set();
    let bgp = Manifests::bgp_set();
    let a = vxlan.get("DaemonSet", "margay-node").clone();
    let b = bgp.get("DaemonSet", "margay-node").clone();

    let envs = |ds: &Value| -> BTreeMap<String, Value> {
        ds["spec"]["template"]["spec"]["initContainers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
            .collect()
    };
    let (ea, eb) = (envs(&a), envs(&b));
    let changed: Vec<&String> = ea
        .keys()
        .filter(|k| ea.get(*k) != eb.get(*k))
        .chain(eb.keys().filter(|k| !ea.contains_key(*k)))
        .collect();
    assert_eq!(
        changed,
        [
            "CALICO_IPV4POOL_VXLAN",
            "CALICO_IPV6POOL_VXLAN",
            "CALICO_NETWORKING_BACKEND",
            "CLUSTER_TYPE"
        ]
    );
    assert_eq!(eb["CALICO_NETWORKING_BACKEND"]["value"], "bird");
    assert_eq!(eb["CALICO_IPV4POOL_VXLAN"]["value"], "Never");

    // network-condition waits for what start-up's backend runs (BIRD too with bird): the same
    // CALICO_NETWORKING_BACKEND in both containers, and its only difference.
    let condition_env = |ds: &Value| -> BTreeMap<String, Value> {
        ds["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "network-condition")
            .unwrap_or_else(|| panic!("no network-condition container"))["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
            .collect()
    };
    let (ca, cb) = (condition_env(&a), condition_env(&b));
    assert_eq!(
        ca["CALICO_NETWORKING_BACKEND"],
        ea["CALICO_NETWORKING_BACKEND"]
    );
    assert_eq!(
        cb["CALICO_NETWORKING_BACKEND"],
        eb["CALICO_NETWORKING_BACKEND"]
    );
    let without_backend = |mut m: BTreeMap<String, Value>| {
        m.remove("CALICO_NETWORKING_BACKEND");
        m
    };
    assert_eq!(without_backend(ca), without_backend(cb));

    let strip = |ds: &Value| -> Value {
        let mut ds = ds.clone();
        let pod = &mut ds["spec"]["template"]["spec"];
        pod["initContainers"][0]["env"] = json!(null);
        let cs = pod["containers"].as_array_mut().unwrap();
        cs.retain(|c| c["name"] != "confd" && c["name"] != "bird");
        for c in cs.iter_mut().filter(|c| c["name"] == "network-condition") {
            c["env"] = json!(null);
        }
        let vs = pod["volumes"].as_array_mut().unwrap();
        vs.retain(|v| v["name"] != "bird-config");
        ds
    };
    assert_eq!(
        strip(&a),
        strip(&b),
        "deploy/bgp/margay-node.yaml differs from deploy/margay-node.yaml in more than BGP's parts"
    );

    let cs = containers(&bgp);
    let confd = cs.iter().find(|c| c.name() == "confd").unwrap();
    let bird = cs.iter().find(|c| c.name() == "bird").unwrap();
    assert_eq!(confd.argv(), ["margay", "confd"]);
    let dir = margay_confd::cli::DEFAULT_CONFIG_DIR;
    let socket = margay_confd::cli::DEFAULT_BIRD_SOCKET;
    let script = bird.script().unwrap();
    let exec = script
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("exec bird "))
        .unwrap();
    let args: Vec<&str> = exec.split_whitespace().collect();
    let after = |flag: &str| args[args.iter().position(|a| *a == flag).unwrap() + 1];
    assert_eq!(
        after("-c"),
        format!("{dir}/bird.cfg"),
        "BIRD reads what confd writes"
    );
    assert_eq!(
        after("-s"),
        socket,
        "BIRD's socket is where confd reloads it"
    );
    assert!(args.contains(&"-f"), "BIRD in the foreground");
    assert!(script.contains(&format!("[ -s {dir}/bird.cfg ]")));
    // Both see the same directory and socket directory.
    assert_eq!(confd.volume_at(dir), bird.volume_at(dir));
    assert!(confd.volume_at(dir).unwrap().get("emptyDir").is_some());
    let run = Path::new(socket).parent().unwrap().to_str().unwrap();
    assert_eq!(confd.host_path_at(run).as_deref(), Some(run));
    assert_eq!(bird.host_path_at(run).as_deref(), Some(run));
    // The probes find BIRD's socket where it is by default.
    let health = margay_help(&["node".into(), "health".into()]).unwrap();
    assert!(health.contains(socket), "{health}");
    let probes: Vec<Vec<String>> = bird.probe_argvs().into_iter().map(|(_, a)| a).collect();
    assert_eq!(
        probes,
        [
            vec!["margay", "node", "health", "--bird-live"],
            vec!["margay", "node", "health", "--bird-ready"]
        ]
    );
    assert_eq!(bird.spec["securityContext"]["privileged"], true);
}

// ---------------------------------------------------------------------------------------------
// 4. kubectl applies deploy/; margay's datastore works over its CRDs
// ---------------------------------------------------------------------------------------------

const NODES: Gvr<'static> = Gvr::core("nodes");
const PODS: Gvr<'static> = Gvr::core("pods");
const NAMESPACES: Gvr<'static> = Gvr::core("namespaces");
const SLICES: Gvr<'static> = Gvr::new("discovery.k8s.io", "v1", "endpointslices");
const DAEMONSETS: Gvr<'static> = Gvr::new("apps", "v1", "daemonsets");

fn kubectl_bin() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
}

/// The double (Calico's CRDs not pre-installed: deploy/ installs them), its kubeconfig, and
/// kubectl with a discovery cache of its own.
struct Kubectl {
    bin: PathBuf,
    api: ApiServer,
    dir: tempfile::TempDir,
}

impl Kubectl {
    fn new() -> Option<Kubectl> {
        let Some(bin) = kubectl_bin() else {
            eprintln!("SKIPPED: no kubectl binary on PATH (install Debian's kubernetes-client)");
            return None;
        };
        let api = ApiServer::start(ServerOptions::default()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        api.write_kubeconfig(&dir.path().join("kubeconfig"))
            .unwrap();
        Some(Kubectl { bin, api, dir })
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args)
            .env("HOME", self.dir.path())
            .env_remove("KUBECONFIG");
        roles::run_within(c, WAIT)
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(o.status.success(), "kubectl {args:?}: {}", show(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

/// How kubectl names an object in its output: `daemonset.apps/margay-node`.
fn kubectl_name(d: &Value) -> String {
    let kind = d["kind"].as_str().unwrap().to_ascii_lowercase();
    let group = d["apiVersion"]
        .as_str()
        .unwrap()
        .rsplit_once('/')
        .map(|(g, _)| format!(".{g}"))
        .unwrap_or_default();
    format!("{kind}{group}/{}", d["metadata"]["name"].as_str().unwrap())
}

#[test]
fn kubectl_applies_deploy_to_the_api_server() {
    let Some(k) = Kubectl::new() else { return };
    let dir = deploy_dir();
    let dir = dir.to_str().unwrap();
    let m = Manifests::default_set();

    // `kubectl apply -f deploy/` (client-side, with kubectl's default strict validation).
    let out = k.ok(&["apply", "-f", dir]);
    for (_, d) in &m.docs {
        let line = format!("{} created", kubectl_name(d));
        assert!(out.lines().any(|l| l == line), "{line:?} not in:\n{out}");
    }
    assert_eq!(out.lines().count(), m.docs.len(), "{out}");
    // Applying again writes nothing. (kubectl reports PodDisruptionBudgets "configured" all
    // the same: its three-way patch always carries spec.selector, whose patch strategy is
    // replace; the server finds nothing to change.)
    let rv = k.api.store().resource_version();
    let again = k.ok(&["apply", "-f", dir]);
    assert!(
        again.lines().all(|l| l.ends_with(" unchanged")
            || l.starts_with("poddisruptionbudget.policy/") && l.ends_with(" configured")),
        "a second apply changed something:\n{again}"
    );
    assert_eq!(
        k.api.store().resource_version(),
        rv,
        "a second apply wrote:\n{again}"
    );

    // Every Calico CRD is served; the RBAC objects exist.
    let crds = k.ok(&["get", "crd", "-o", "name"]);
    for c in CALICO_CRDS {
        let n = format!(
            "customresourcedefinition.apiextensions.k8s.io/{}",
            c.crd_name()
        );
        assert!(crds.lines().any(|l| l == n), "{n} not in:\n{crds}");
    }
    assert_eq!(crds.lines().count(), CALICO_CRDS.len(), "{crds}");
    let api_resources = k.ok(&[
        "api-resources",
        "--api-group=crd.projectcalico.org",
        "-o",
        "name",
    ]);
    assert_eq!(
        api_resources.lines().count(),
        CALICO_CRDS.len(),
        "{api_resources}"
    );
    let rbac = k.ok(&["get", "clusterroles,clusterrolebindings", "-o", "name"]);
    let roles = k.ok(&[
        "get",
        "roles,rolebindings,serviceaccounts",
        "-n",
        NAMESPACE,
        "-o",
        "name",
    ]);
    for (_, d) in m.docs.iter().filter(|(_, d)| {
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ServiceAccount",
        ]
        .contains(&d["kind"].as_str().unwrap())
    }) {
        let n = kubectl_name(d);
        assert!(
            rbac.lines().chain(roles.lines()).any(|l| l == n),
            "{n} not in:\n{rbac}{roles}"
        );
    }
    let all = k.ok(&["get", "all", "-n", NAMESPACE, "-o", "name"]);
    for n in [
        "daemonset.apps/margay-node",
        "deployment.apps/margay-typha",
        "deployment.apps/margay-kube-controllers",
        "service/margay-typha",
    ] {
        assert!(all.lines().any(|l| l == n), "{n} not in `get all`:\n{all}");
    }
    let pdbs = k.ok(&["get", "pdb", "-n", NAMESPACE, "-o", "name"]);
    assert!(
        pdbs.contains("poddisruptionbudget.policy/margay-typha"),
        "{pdbs}"
    );

    // Calico custom resources can now be written, by kubectl and by margay (ctl).
    let pool = k.dir.path().join("pool.yaml");
    std::fs::write(
        &pool,
        "apiVersion: crd.projectcalico.org/v1\nkind: IPPool\nmetadata: {name: from-kubectl}\nspec: {cidr: 10.70.0.0/16, blockSize: 26, vxlanMode: Always, natOutgoing: true}\n",
    )
    .unwrap();
    k.ok(&["apply", "-f", pool.to_str().unwrap()]);
    let mut c = margay(k.dir.path());
    c.env("DATASTORE_TYPE", "kubernetes")
        .env("KUBECONFIG", k.dir.path().join("kubeconfig"))
        .args(["ctl", "get", "ippools", "-o", "name"]);
    let o = roles::run_within(c, WAIT);
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("from-kubectl"),
        "{}",
        show(&o)
    );

    // The BGP variant replaces the DaemonSet (a strategic merge patch of the live one).
    let bgp = deploy_dir().join("bgp/margay-node.yaml");
    let out = k.ok(&["apply", "-f", bgp.to_str().unwrap()]);
    assert_eq!(out.trim(), "daemonset.apps/margay-node configured");
    let live = k
        .api
        .store()
        .get(DAEMONSETS, NAMESPACE, "margay-node")
        .unwrap();
    let want = Manifests::bgp_set().get("DaemonSet", "margay-node").clone();
    assert_eq!(
        live["spec"]["template"], want["spec"]["template"],
        "the DaemonSet after applying the BGP variant"
    );
}

/// margay's Kubernetes datastore over the CRDs as deploy/ installs them (the double starts
/// without Calico's): resources are written and read back in Calico's layout.
#[test]
fn margays_datastore_works_over_the_deployed_crds() {
    let api = ApiServer::start(ServerOptions {
        calico_crds: false,
        ..ServerOptions::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let crds = std::fs::read_to_string(deploy_dir().join(CRDS_FILE)).unwrap();
    assert_eq!(api.store().load(&crds).unwrap(), CALICO_CRDS.len());

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cfg = margay_datastore::DatastoreConfig::from_lookup(|k| match k {
            "DATASTORE_TYPE" => Some("kubernetes".into()),
            "KUBECONFIG" => Some(kubeconfig.display().to_string()),
            _ => None,
        })
        .unwrap();
        let client = margay_datastore::Client::new(cfg.connect().await.unwrap());
        for doc in [
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: pool-1}\nspec: {cidr: 10.80.0.0/16, blockSize: 26, vxlanMode: Always, natOutgoing: true}\n",
            "apiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata: {name: allow-web, namespace: default}\nspec: {selector: app == 'web', types: [Ingress], ingress: [{action: Allow}]}\n",
            "apiVersion: projectcalico.org/v3\nkind: KubeControllersConfiguration\nmetadata: {name: default}\nspec: {controllers: {node: {leakGracePeriod: 15m}}}\n",
        ] {
            let r = margay_api::codec::decode_one(doc).unwrap();
            client.create(r).await.unwrap_or_else(|e| panic!("{doc}: {e}"));
        }
        let pools = client.list(margay_api::Kind::IPPool, None, "").await.unwrap();
        let names: Vec<&str> = pools.items.iter().map(|r| r.name()).collect();
        assert_eq!(names, ["pool-1"]);
        let pols = client
            .list(margay_api::Kind::NetworkPolicy, Some("default"), "")
            .await
            .unwrap();
        assert_eq!(pols.items.len(), 1);
    });
    // In Calico's layout, in the double.
    let s = api.store();
    let cr = s
        .get(
            Gvr::new("crd.projectcalico.org", "v1", "ippools"),
            "",
            "pool-1",
        )
        .unwrap();
    assert_eq!(cr["kind"], "IPPool");
    assert_eq!(cr["spec"]["cidr"], "10.80.0.0/16");
    assert_eq!(cr["spec"]["vxlanMode"], "Always");
    let np = s
        .get(
            Gvr::new("crd.projectcalico.org", "v1", "networkpolicies"),
            "default",
            "allow-web",
        )
        .unwrap();
    assert_eq!(np["spec"]["selector"], "app == 'web'");
}

// ---------------------------------------------------------------------------------------------
// 5. The node's containers and Typha, run as deployed, within their RBAC
// ---------------------------------------------------------------------------------------------

/// One RBAC rule.
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
}

/// The rules bound to kube-system's ServiceAccount `sa` (cluster roles through cluster role
/// bindings, roles through role bindings).
fn rules_of(m: &Manifests, sa: &str) -> Vec<Rule> {
    let mut out = Vec::new();
    for b in m
        .docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
    {
        let bound = b["subjects"].as_array().unwrap().iter().any(|s| {
            s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == NAMESPACE
        });
        if !bound {
            continue;
        }
        let role = m.get(
            b["roleRef"]["kind"].as_str().unwrap(),
            b["roleRef"]["name"].as_str().unwrap(),
        );
        for r in role["rules"].as_array().unwrap() {
            out.push(Rule {
                groups: strings(&r["apiGroups"]),
                resources: strings(&r["resources"]),
                verbs: strings(&r["verbs"]),
            });
        }
    }
    assert!(!out.is_empty(), "nothing is bound to {sa}");
    out
}

/// Whether the rules allow a request the double counted. Its counters name no subresource or
/// namespace: a patch or update of `pods`/`nodes` is allowed by a grant on `<res>/status`
/// (margay writes those only through status), and a Role's grant counts for every namespace
/// (margay's only namespaced need, Typha's EndpointSlices, is in kube-system by construction).
fn allowed(rules: &[Rule], verb: &str, group: &str, resource: &str) -> bool {
    rules.iter().any(|r| {
        r.groups.iter().any(|g| g == group || g == "*")
            && r.verbs.iter().any(|v| v == verb || v == "*")
            && r.resources.iter().any(|res| {
                res == resource
                    || res == "*"
                    || (matches!(verb, "patch" | "update") && *res == format!("{resource}/status"))
            })
    })
}

/// The requests the double served since `before`: (verb, group, resource).
fn requests_since(
    api: &ApiServer,
    before: &BTreeMap<(String, String, String), u64>,
) -> BTreeSet<(String, String, String)> {
    api.stats()
        .requests
        .into_iter()
        .filter(|(k, n)| before.get(k).copied().unwrap_or(0) < *n)
        .map(|(k, _)| k)
        .collect()
}

/// Every request in `requests` is allowed to `sa`.
fn assert_within_rbac(
    m: &Manifests,
    sa: &str,
    what: &str,
    requests: &BTreeSet<(String, String, String)>,
) {
    let rules = rules_of(m, sa);
    let denied: Vec<String> = requests
        .iter()
        .filter(|(v, g, r)| !allowed(&rules, v, g, r))
        .map(|(v, g, r)| {
            format!(
                "{v} {}{r}",
                if g.is_empty() {
                    String::new()
                } else {
                    format!("{g}/")
                }
            )
        })
        .collect();
    assert!(
        denied.is_empty(),
        "{what} needs what deploy/rbac.yaml does not grant to {sa}: {denied:?}"
    );
    eprintln!(
        "{what} as {sa}: {} kinds of request, all granted: {:?}",
        requests.len(),
        requests
            .iter()
            .map(|(v, g, r)| format!("{v} {g}/{r}"))
            .collect::<Vec<_>>()
    );
}

/// A Kubernetes Node as the kubelet registers it: its InternalIP is 127.0.0.1, an address this
/// test host has (on lo), so start-up's kubernetes-internal-ip autodetection finds it.
fn k8s_node(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        "spec": {},
        "status": {"addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": name},
        ]},
    })
}

/// A container's command (margay's, or its script) with the manifest's environment (values
/// resolved) on an empty one, plus `extra` (what a pod gets from its surroundings: the
/// service account's credentials as KUBECONFIG, the kubelet's KUBERNETES_SERVICE_*, ports
/// free on this host).
fn container_command(
    m: &Manifests,
    c: &Container<'_>,
    home: &Path,
    extra: &[(&str, String)],
) -> Command {
    let argv = c.argv();
    let mut cmd = if is_margay(&argv) {
        let mut cmd = margay(home);
        cmd.args(&argv[1..]);
        cmd
    } else {
        let mut cmd = Command::new(&argv[0]);
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", home)
            .args(&argv[1..]);
        cmd
    };
    for (k, v) in c.env(m).unwrap() {
        cmd.env(k, v);
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd
}

fn container<'a>(m: &'a Manifests, at: &str) -> Container<'a> {
    containers(m)
        .into_iter()
        .find(|c| c.at == at)
        .unwrap_or_else(|| panic!("no container {at}"))
}

/// deploy/ installed in the double (CRDs first, as the loader orders them), and the cluster's
/// own objects: the node, a namespace with a pod on the node.
fn seed_cluster(api: &ApiServer, pod_ip: Option<&str>) {
    let s = api.store();
    for f in manifest_files(&deploy_dir())
        .iter()
        .filter(|f| f.parent() == Some(deploy_dir().as_path()))
    {
        s.load(&std::fs::read_to_string(f).unwrap()).unwrap();
    }
    s.create(NODES, "", k8s_node(NODE)).unwrap();
    s.create(
        NAMESPACES,
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
    )
    .unwrap();
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}},
           "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "web"}]}});
    if let Some(ip) = pod_ip {
        pod["status"] = json!({"podIP": ip, "podIPs": [{"ip": ip}]});
    }
    s.create(PODS, "shop", pod).unwrap();
}

/// Runs the DaemonSet's node-startup container (in `netns` when given) under `root`.
fn run_node_startup(
    m: &Manifests,
    api: &ApiServer,
    d: &Path,
    kubeconfig: &Path,
    netns: Option<&margay_testkit::netns::Netns>,
) -> PathBuf {
    let startup = container(m, "DaemonSet/margay-node initContainers[node-startup]");
    let root = d.join("root");
    let before = api.stats().requests;
    let mut c = container_command(
        m,
        &startup,
        d,
        &[("KUBECONFIG", kubeconfig.display().to_string())],
    );
    c.arg("--root").arg(&root);
    if let Some(ns) = netns {
        c = in_netns(ns, c);
    }
    let o = roles::run_within(c, WAIT);
    assert!(o.status.success(), "node start-up: {}", show(&o));
    assert_within_rbac(
        m,
        "margay-node",
        "node start-up",
        &requests_since(api, &before),
    );
    let nodename = root.join("var/lib/calico/nodename");
    assert_eq!(std::fs::read_to_string(&nodename).unwrap().trim(), NODE);
    nodename
}

/// The same command, inside a network namespace (`ip netns exec`).
fn in_netns(ns: &margay_testkit::netns::Netns, c: Command) -> Command {
    let mut n = ns.exec(c.get_program());
    n.args(c.get_args()).env_clear();
    for (k, v) in c.get_envs() {
        if let Some(v) = v {
            n.env(k, v);
        }
    }
    n
}

/// Runs the DaemonSet's install-cni-config script with what the kubelet gives it (the token
/// Secret — here the double's token and CA —, the ConfigMap's conflist, the API server's
/// address) and the host's /etc/cni/net.d as `d/net.d`; returns (the installed conflist, the
/// plugin's kubeconfig).
fn run_install_cni_config(m: &Manifests, api: &ApiServer, d: &Path) -> (String, PathBuf) {
    let install = container(
        m,
        "DaemonSet/margay-node initContainers[install-cni-config]",
    );
    let net_d = d.join("net.d");
    let token_dir = d.join("token");
    let cm_dir = d.join("cni-config");
    for p in [&net_d, &token_dir, &cm_dir] {
        std::fs::create_dir_all(p).unwrap();
    }
    std::fs::write(token_dir.join("token"), api.token()).unwrap();
    std::fs::write(token_dir.join("ca.crt"), api.ca_pem()).unwrap();
    let conflist_text = m
        .config_value("margay-config", "cni_network_config")
        .unwrap();
    std::fs::write(cm_dir.join("10-margay.conflist"), &conflist_text).unwrap();
    let c = container_command(
        m,
        &install,
        d,
        &[
            ("CNI_NET_DIR", net_d.display().to_string()),
            ("CNI_PLUGIN_TOKEN_DIR", token_dir.display().to_string()),
            (
                "CNI_NETWORK_CONFIG_FILE",
                cm_dir.join("10-margay.conflist").display().to_string(),
            ),
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".into()),
            ("KUBERNETES_SERVICE_PORT", api.addr().port().to_string()),
        ],
    );
    let o = roles::run_within(c, WAIT);
    assert!(o.status.success(), "install-cni-config: {}", show(&o));
    let installed = std::fs::read_to_string(net_d.join("10-margay.conflist")).unwrap();
    assert_eq!(installed, conflist_text);
    let kubeconfig = net_d.join("margay-kubeconfig");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&kubeconfig).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o077,
        0,
        "the plugin's kubeconfig holds a token: {mode:o}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&net_d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    (installed, kubeconfig)
}

/// The installed conflist's margay plugin as the runtime passes it (the list's name and
/// version added), with this host's paths: the kubeconfig, start-up's node name file, the log
/// and the IPAM lock in the temp dir.
fn plugin_conf(installed: &str, kubeconfig: &Path, nodename: &Path, d: &Path) -> Value {
    let list: Value = serde_json::from_str(installed).unwrap();
    let mut plugin = list["plugins"][0].clone();
    assert_eq!(
        plugin["kubernetes"]["kubeconfig"],
        "/etc/cni/net.d/margay-kubeconfig"
    );
    plugin["kubernetes"]["kubeconfig"] = json!(kubeconfig);
    plugin["name"] = list["name"].clone();
    plugin["cniVersion"] = list["cniVersion"].clone();
    plugin["nodename_file"] = json!(nodename);
    plugin["log_file_path"] = json!(d.join("cni.log"));
    plugin["ipam_lock_file"] = json!(d.join("ipam.lock"));
    plugin
}

/// The plugin as a runtime runs it: CNI_* variables (and nothing else but PATH), the network
/// configuration on stdin.
fn run_plugin(mut c: Command, cni: &[(&str, &str)], conf: &Value, d: &Path) -> Output {
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CNI_PATH", "/opt/cni/bin");
    for (k, v) in cni {
        c.env(k, v);
    }
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the CNI plugin hangs ({cni:?})");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "CNI {cni:?} with the installed configuration: {}\nplugin log: {}",
        show(&o),
        std::fs::read_to_string(d.join("cni.log")).unwrap_or_default()
    );
    o
}

#[test]
fn dataplane_and_typha_run_as_deployed_within_their_rbac() {
    let m = Manifests::default_set();
    let bgp = Manifests::bgp_set();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let api = ApiServer::start(ServerOptions::default()).unwrap();
    let kubeconfig = d.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let kc = ("KUBECONFIG", kubeconfig.display().to_string());
    let s = api.store();
    seed_cluster(&api, Some("10.244.0.5"));

    // --- node start-up (init container 1), as margay-node ---------------------------------
    let nodename = run_node_startup(&m, &api, d, &kubeconfig, None);
    let node = s.get(NODES, "", NODE).unwrap();
    assert_eq!(
        node["metadata"]["annotations"]["projectcalico.org/IPv4Address"], "127.0.0.1/8",
        "{node}"
    );
    let pool = s
        .get(
            Gvr::new("crd.projectcalico.org", "v1", "ippools"),
            "",
            "default-ipv4-ippool",
        )
        .unwrap();
    assert_eq!(pool["spec"]["vxlanMode"], "CrossSubnet", "{pool}");

    // --- the CNI configuration (init container 3) and the plugin, as margay-cni-plugin -----
    let (installed, plugin_kubeconfig) = run_install_cni_config(&m, &api, d);
    // A token Secret not filled yet: the script says so and fails (the kubelet retries it).
    let install = container(
        &m,
        "DaemonSet/margay-node initContainers[install-cni-config]",
    );
    let empty = d.join("empty-token");
    std::fs::create_dir_all(&empty).unwrap();
    let c = container_command(
        &m,
        &install,
        d,
        &[
            ("CNI_NET_DIR", d.join("unused").display().to_string()),
            ("CNI_PLUGIN_TOKEN_DIR", empty.display().to_string()),
        ],
    );
    let o = roles::run_within(c, WAIT);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("margay-cni-plugin-token"),
        "{}",
        show(&o)
    );
    // CNI STATUS (cniVersion 1.1.0) with no datastore variables at all: the installed
    // configuration alone connects, reads the pools and finds one usable. (ADD and DEL:
    // cni_plugin_wires_a_pod_as_installed_within_its_rbac.)
    let mut conf = plugin_conf(&installed, &plugin_kubeconfig, &nodename, d);
    conf["cniVersion"] = json!("1.1.0");
    let before = api.stats().requests;
    run_plugin(Command::new(bin()), &[("CNI_COMMAND", "STATUS")], &conf, d);
    assert_within_rbac(
        &m,
        "margay-cni-plugin",
        "the CNI plugin (STATUS)",
        &requests_since(&api, &before),
    );

    // --- Typha, Felix through Typha, confd through Typha, as margay-node -------------------
    let before = api.stats().requests;
    let typha_port = margay_testkit::free_port().unwrap();
    let typha_health = margay_testkit::free_port().unwrap();
    let typha_c = container(&m, "Deployment/margay-typha containers[typha]");
    let mut c = container_command(
        &m,
        &typha_c,
        d,
        &[
            kc.clone(),
            // This host's free ports, on loopback only.
            ("TYPHA_SERVERHOST", "127.0.0.1".into()),
            ("TYPHA_SERVERPORT", typha_port.to_string()),
            ("TYPHA_HEALTHPORT", typha_health.to_string()),
        ],
    );
    c.arg("-c").arg(d.join("no-typha.cfg"));
    let mut typha = Role::spawn("typha", c, d.join("typha.log"));
    wait_for("Typha ready (its readiness probe's URL)", || {
        typha.assert_running();
        match http_get(typha_health, "/readiness") {
            Some(200) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    // What the endpoints controller would publish for the Service.
    let svc = m.get("Service", "margay-typha");
    s.create(
        SLICES,
        NAMESPACE,
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "margay-typha-x1", "namespace": NAMESPACE,
                         "labels": {"kubernetes.io/service-name": "margay-typha"}},
            "addressType": "IPv4",
            "ports": [{"name": svc["spec"]["ports"][0]["name"], "port": typha_port, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["127.0.0.1"], "nodeName": NODE, "conditions": {"ready": true}}],
        }),
    )
    .unwrap();

    let felix_c = container(&m, "DaemonSet/margay-node containers[felix]");
    let felix_health = margay_testkit::free_port().unwrap();
    let felix_extra = [
        kc.clone(),
        // No kernel here: the recording dataplane computes everything and programs nothing.
        ("MARGAY_DATAPLANE", "recording".into()),
        ("FELIX_HEALTHPORT", felix_health.to_string()),
        (
            "MARGAY_FELIX_STATUS_SOCKET",
            d.join("felix.sock").display().to_string(),
        ),
    ];
    let mut c = container_command(&m, &felix_c, d, &felix_extra);
    c.arg("-c").arg(d.join("no-felix.cfg"));
    let mut felix = Role::spawn("felix", c, d.join("felix.log"));
    // The DaemonSet's own probes say when Felix is live and ready.
    for (what, argv) in felix_c.probe_argvs() {
        wait_for(&format!("felix {what}: {argv:?}"), || {
            felix.assert_running();
            typha.assert_running();
            let mut c = margay(d);
            c.args(&argv[1..]);
            for (k, v) in felix_c
                .env(&m)
                .unwrap()
                .into_iter()
                .chain(felix_extra.iter().map(|(k, v)| (k.to_string(), v.clone())))
            {
                c.env(k, v);
            }
            let o = roles::run_within(c, WAIT);
            if o.status.success() {
                Ok(())
            } else {
                let l = felix.log();
                Err(format!(
                    "{}\nfelix log tail: {}",
                    show(&o),
                    &l[l.len().saturating_sub(2000)..]
                ))
            }
        });
    }
    let felix_log = felix.log();
    assert!(
        felix_log.contains(&format!("127.0.0.1:{typha_port}")),
        "Felix uses the Typha it found in the Service: {felix_log}"
    );

    // network-condition beside Felix: NetworkUnavailable False once Felix is ready (the
    // probe above says it is), True again on SIGTERM.
    let cond_c = container(&m, "DaemonSet/margay-node containers[network-condition]");
    let c = container_command(
        &m,
        &cond_c,
        d,
        &[kc.clone(), ("FELIX_HEALTHPORT", felix_health.to_string())],
    );
    let mut cond = Role::spawn("network-condition", c, d.join("network-condition.log"));
    let condition = || -> Value {
        s.get(NODES, "", NODE).unwrap()["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "NetworkUnavailable")
            .cloned()
            .unwrap_or(Value::Null)
    };
    wait_for("NetworkUnavailable False (CalicoIsUp)", || {
        cond.assert_running();
        let c = condition();
        if c["reason"] == "CalicoIsUp" && c["status"] == "False" {
            Ok(())
        } else {
            Err(format!("{c}; log: {}", cond.log()))
        }
    });
    let pid = cond.pid().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let exited = wait_for("network-condition to exit on SIGTERM", || {
        cond.exited().ok_or_else(|| cond.log())
    });
    assert!(exited.success(), "{exited}: {}", cond.log());
    let down = condition();
    assert_eq!(
        (&down["status"], &down["reason"]),
        (&json!("True"), &json!("CalicoIsDown")),
        "{down}"
    );

    // confd of the BGP variant, once, through the same Typha.
    let confd_c = container(&bgp, "DaemonSet/margay-node containers[confd]");
    let bird_dir = d.join("bird");
    let mut c = container_command(&bgp, &confd_c, d, std::slice::from_ref(&kc));
    c.args(["--once", "--no-reload", "--config-dir"])
        .arg(&bird_dir);
    let o = roles::run_within(c, WAIT);
    assert!(o.status.success(), "confd --once: {}", show(&o));
    let cfg = std::fs::read_to_string(bird_dir.join("bird.cfg")).unwrap();
    assert!(cfg.contains("router id 127.0.0.1"), "{cfg}");
    typha.assert_running();
    felix.assert_running();
    drop(felix);
    drop(typha);
    assert_within_rbac(
        &m,
        "margay-node",
        "Typha, Felix and confd",
        &requests_since(&api, &before),
    );
}

/// The CNI plugin, installed as the DaemonSet installs it, wires a pod (ADD, CHECK, DEL) with
/// the installed configuration and the kubeconfig the script wrote, asking the API only what
/// margay-cni-plugin may. Needs root: the plugin and the double run in a network namespace
/// this test makes (the pod's in another), so nothing outside them is touched.
#[test]
fn cni_plugin_wires_a_pod_as_installed_within_its_rbac() {
    use margay_testkit::netns::{Netns, is_root};
    if !is_root() {
        if std::env::var("MARGAY_SKIP_ROOT_TESTS").as_deref() == Ok("1") {
            eprintln!("skipped: needs root (MARGAY_SKIP_ROOT_TESTS=1)");
            return;
        }
        panic!("needs root (network namespaces); run as root or set MARGAY_SKIP_ROOT_TESTS=1");
    }
    let m = Manifests::default_set();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The node: a namespace with an uplink and a default route, as a real host has.
    let host = Netns::new("deploy-host").unwrap();
    host.add_veth("uplink", "uplink-peer", &["192.0.2.1/32"])
        .unwrap();
    host.ip(&["route", "add", "default", "dev", "uplink"])
        .unwrap();
    // The API server listens inside the node's namespace (its loopback), where the plugin runs.
    let ns_file =
        margay_netlink::netns::open(Path::new(&format!("/run/netns/{}", host.name()))).unwrap();
    let api = margay_netlink::netns::run_in(&ns_file, || {
        ApiServer::start(ServerOptions::default()).map_err(std::io::Error::other)
    })
    .unwrap();
    let kubeconfig = d.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    seed_cluster(&api, None);
    let nodename = run_node_startup(&m, &api, d, &kubeconfig, Some(&host));
    let (installed, plugin_kubeconfig) = run_install_cni_config(&m, &api, d);
    let conf = plugin_conf(&installed, &plugin_kubeconfig, &nodename, d);

    let pod_ns = Netns::new("deploy-pod").unwrap();
    let id = format!("c{:x}web1", std::process::id());
    let netns_path = format!("/run/netns/{}", pod_ns.name());
    let args = format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1;K8S_POD_INFRA_CONTAINER_ID={id}"
    );
    let cni = |cmd: &'static str| -> Vec<(&'static str, String)> {
        vec![
            ("CNI_COMMAND", cmd.to_string()),
            ("CNI_CONTAINERID", id.clone()),
            ("CNI_NETNS", netns_path.clone()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_ARGS", args.clone()),
        ]
    };
    let plugin = |cmd: &'static str, conf: &Value| -> Output {
        let env = cni(cmd);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        run_plugin(host.exec(bin()), &env, conf, d)
    };
    let s = api.store();
    let before = api.stats().requests;
    let o = plugin("ADD", &conf);
    let result: Value = serde_json::from_slice(&o.stdout).unwrap();
    let ip = result["ips"][0]["address"].as_str().unwrap().to_string();
    assert!(
        ip.starts_with("192.168."),
        "from the default pool: {result}"
    );
    let pod = s.get(PODS, "shop", "web-1").unwrap();
    assert_eq!(
        pod["metadata"]["annotations"]["cni.projectcalico.org/podIP"], ip,
        "the WorkloadEndpoint is the pod: {pod}"
    );
    let mut check = conf.clone();
    check["prevResult"] = result;
    plugin("CHECK", &check);
    plugin("DEL", &conf);
    let pod = s.get(PODS, "shop", "web-1").unwrap();
    assert_eq!(
        pod["metadata"]["annotations"]["cni.projectcalico.org/podIP"], "",
        "{pod}"
    );
    let handles = s
        .list(
            Gvr::new("crd.projectcalico.org", "v1", "ipamhandles"),
            None,
            "",
        )
        .unwrap();
    assert!(
        handles
            .iter()
            .all(|h| !h["spec"]["handleID"].as_str().unwrap_or("").contains(&id)),
        "the pod's addresses are released: {handles:?}"
    );
    assert_within_rbac(
        &m,
        "margay-cni-plugin",
        "the CNI plugin (ADD, CHECK, DEL)",
        &requests_since(&api, &before),
    );
    drop(api);
}

/// The `[default: …]` clap prints for `flag` in a help text.
fn help_default(help: &str, flag: &str) -> Option<String> {
    // Wrapped lines joined: `[default:` and its value may be on two lines.
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    let at = help.find(&format!("{flag} <"))?;
    let rest = &help[at..];
    let start = rest.find("[default: ")? + "[default: ".len();
    let end = rest[start..].find(']')?;
    Some(rest[start..start + end].to_string())
}

#[test]
fn kube_controllers_run_as_deployed_within_their_rbac() {
    if !has_role("kube-controllers") {
        eprintln!("NOT RUN: this margay has no kube-controllers role yet");
        return;
    }
    let m = Manifests::default_set();
    let c = container(
        &m,
        "Deployment/margay-kube-controllers containers[kube-controllers]",
    );
    // The status file the probes read is where the container can write it.
    let help = margay_help(&c.argv()[1..]).unwrap();
    let status = help_default(&help, "--status-file").unwrap();
    let status_dir = Path::new(&status).parent().unwrap().to_str().unwrap();
    let vol = c
        .volume_at(status_dir)
        .unwrap_or_else(|| panic!("nothing mounted at {status_dir} for {status}"));
    assert!(vol.get("emptyDir").is_some(), "{vol}");
    for (_, p) in c.probe_argvs() {
        let h = margay_help(&p[1..]).unwrap();
        assert_eq!(
            help_default(&h, "--file").as_deref(),
            Some(status.as_str()),
            "{p:?}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let api = ApiServer::start(ServerOptions::default()).unwrap();
    let kubeconfig = d.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let s = api.store();
    // A node that start-up registered (VXLAN tunnel address: a block, its affinity, a
    // handle), whose Kubernetes Node is deleted below: the node controller's to clean up.
    seed_cluster(&api, Some("10.244.0.5"));
    run_node_startup(&m, &api, d, &kubeconfig, None);
    let ipam = |plural: &'static str| -> usize {
        s.list(Gvr::new("crd.projectcalico.org", "v1", plural), None, "")
            .unwrap()
            .len()
    };
    assert_eq!(
        (
            ipam("ipamblocks"),
            ipam("blockaffinities"),
            ipam("ipamhandles")
        ),
        (1, 1, 1),
        "the node's tunnel address"
    );

    let before = api.stats().requests;
    let status_file = d.join("status.json");
    let mut cmd = container_command(
        &m,
        &c,
        d,
        &[("KUBECONFIG", kubeconfig.display().to_string())],
    );
    cmd.arg("--status-file").arg(&status_file);
    let mut kc = Role::spawn("kube-controllers", cmd, d.join("kube-controllers.log"));
    // Its own probes (on this test's status file) say when it is ready.
    for (what, argv) in c.probe_argvs() {
        wait_for(&format!("kube-controllers {what}"), || {
            kc.assert_running();
            let mut p = margay(d);
            p.args(&argv[1..]).arg("-f").arg(&status_file);
            let o = roles::run_within(p, WAIT);
            if o.status.success() {
                Ok(())
            } else {
                Err(format!("{}\nlog: {}", show(&o), kc.log()))
            }
        });
    }
    // The KubeControllersConfiguration it creates, with its status.
    wait_for("KubeControllersConfiguration default", || {
        s.get(
            Gvr::new(
                "crd.projectcalico.org",
                "v1",
                "kubecontrollersconfigurations",
            ),
            "",
            "default",
        )
        .map_err(|e| format!("{e:?}"))
    });
    // The node goes: its tunnel address, affinity and (empty) block are released.
    s.delete(NODES, "", NODE).unwrap();
    wait_for("the deleted node's IPAM released", || {
        kc.assert_running();
        let left = (
            ipam("ipamblocks"),
            ipam("blockaffinities"),
            ipam("ipamhandles"),
        );
        if left == (0, 0, 0) {
            Ok(())
        } else {
            Err(format!(
                "blocks, affinities, handles left: {left:?}; log:\n{}",
                kc.log()
            ))
        }
    });
    kc.assert_running();
    drop(kc);
    assert_within_rbac(
        &m,
        "margay-kube-controllers",
        "kube-controllers",
        &requests_since(&api, &before),
    );
}
