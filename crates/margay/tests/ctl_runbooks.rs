//! calicoctl's runbooks, run with the real binary against the embedded store: the IPAM-leak
//! runbook (lock, `ipam check -o`, `ipam release --from-report`, unlock), `patch`, `version`,
//! `ipam configure`, `get` before anything is stored, and `datastore migrate` to the
//! Kubernetes datastore (Felix computing the same policy before and after).
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use assert_cmd::Command;
use margay_datastore::KvBackend;
use margay_datastore::local::{LocalBackend, LocalOptions};
use margay_ipam::{AssignArgs, Ipam};
use serde_json::Value;

/// A cluster of one registered node in an embedded store.
struct Cluster {
    dir: tempfile::TempDir,
}

impl Cluster {
    fn new() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let c = Cluster { dir };
        let out = c
            .margay()
            .args(["node", "startup", "--root"])
            .arg(c.dir.path())
            .env("NODENAME", "n1")
            .env("IP", "192.0.2.10/24")
            .env("CALICO_IPV4POOL_CIDR", "10.77.0.0/24")
            .output()
            .unwrap();
        assert!(out.status.success(), "node startup: {out:?}");
        c
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("store.db")
    }

    fn margay(&self) -> Command {
        let mut c = Command::cargo_bin("margay").unwrap();
        c.env_clear()
            .env("DATASTORE_TYPE", "local")
            .env("DATASTORE_PATH", self.store())
            .env("CALICO_NODENAME_FILE", self.dir.path().join("nodename"))
            .timeout(std::time::Duration::from_secs(60));
        c
    }

    fn ctl(&self, args: &[&str]) -> Output {
        self.margay().arg("ctl").args(args).output().unwrap()
    }

    /// `margay ctl` against a Kubernetes API server (the migration's target).
    fn kube_ctl(&self, kubeconfig: &Path, args: &[&str]) -> Output {
        Command::cargo_bin("margay")
            .unwrap()
            .env_clear()
            .env("HOME", self.dir.path())
            .env("DATASTORE_TYPE", "kubernetes")
            .env("KUBECONFIG", kubeconfig)
            .timeout(std::time::Duration::from_secs(60))
            .arg("ctl")
            .args(args)
            .output()
            .unwrap()
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Leaks addresses and a handle on purpose, as a crashed CNI DEL would: allocated in IPAM,
/// with nothing using them. Returns the leaked addresses and one that a workload uses.
fn leak(cluster: &Cluster) -> (Vec<String>, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let backend = LocalBackend::open(LocalOptions::new(cluster.store())).unwrap();
        let ipam = Ipam::new(backend.clone());
        let mut args = AssignArgs::new("k8s-pod-network.leaked", "n1");
        args.num_v4 = 3;
        args.attrs = BTreeMap::from([
            ("namespace".to_string(), "prod".to_string()),
            ("pod".to_string(), "gone-7f9c".to_string()),
            ("node".to_string(), "n1".to_string()),
        ]);
        let leaked = ipam.auto_assign(&args).await.unwrap();
        let used = ipam
            .auto_assign(&AssignArgs::new("k8s-pod-network.used", "n1"))
            .await
            .unwrap();
        // A handle record no block refers to.
        backend
            .create(
                "/calico/ipam/v2/handle/k8s-pod-network.stale",
                br#"{"block":{}}"#.to_vec(),
                None,
            )
            .await
            .unwrap();
        (
            leaked.v4.iter().map(|a| a.ip.to_string()).collect(),
            used.v4[0].ip.to_string(),
        )
    })
}

#[test]
fn the_ipam_leak_runbook_releases_only_what_leaked() {
    let cluster = Cluster::new();
    let (leaked, used) = leak(&cluster);
    // The used address belongs to a workload.
    let wep = format!(
        "apiVersion: projectcalico.org/v3\nkind: WorkloadEndpoint\nmetadata:\n  name: n1-k8s-web-eth0\n  namespace: prod\n  labels: {{app: web}}\nspec:\n  node: n1\n  orchestrator: k8s\n  pod: web\n  endpoint: eth0\n  interfaceName: cali0123456789a\n  ipNetworks: [{used}/32]\n"
    );
    let out = cluster
        .margay()
        .args(["ctl", "create", "-f", "-"])
        .write_stdin(wep)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    // 1. A report written before locking is of no use once locked.
    let early = cluster.file("early.json");
    let out = cluster.ctl(&["ipam", "check", "-o", early.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "problems found: {out:?}");
    let report = read_json(&early);
    for ip in &leaked {
        assert_eq!(report["allocations"][ip][0]["inUse"], false, "{report}");
        assert_eq!(report["allocations"][ip][0]["pod"], "gone-7f9c");
        assert_eq!(report["allocations"][ip][0]["owners"], Value::Null);
    }
    assert_eq!(report["allocations"][&used][0]["inUse"], true);
    assert_eq!(
        report["allocations"][&used][0]["owners"][0],
        "Workload(prod/n1-k8s-web-eth0)"
    );
    assert_eq!(report["leakedHandles"][0]["ID"], "k8s-pod-network.stale");
    assert!(!report["clusterGUID"].as_str().unwrap().is_empty());
    assert_eq!(report["datastoreLocked"], false);

    // 2. Not locked: refused (nothing released).
    let out = cluster.ctl(&["ipam", "release", "--from-report", early.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("data store is not locked"),
        "{out:?}"
    );

    // 3. Locked, but the report predates the lock: stale.
    let out = cluster.ctl(&["datastore", "migrate", "lock"]);
    assert!(text(&out.stdout).contains("Datastore locked."), "{out:?}");
    let out = cluster.ctl(&["ipam", "release", "--from-report", early.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("all stale"), "{out:?}");

    // 4. A report written while locked: every leaked address and handle goes, nothing else.
    let fresh = cluster.file("fresh.json");
    let out = cluster.ctl(&["ipam", "check", "-o", fresh.to_str().unwrap()]);
    assert!(text(&out.stdout).contains("Report written to"), "{out:?}");
    assert_eq!(read_json(&fresh)["datastoreLocked"], true);
    let out = cluster.ctl(&["ipam", "release", "--from-report", fresh.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("Released 3 IPs successfully"), "{stdout}");
    assert!(
        stdout.contains("Released 1 handles; 0 skipped; 0 errors."),
        "{stdout}"
    );
    assert!(stdout.contains("You may now unlock the data store."));
    // Released again from the same report: already gone, nothing else touched.
    let out = cluster.ctl(&["ipam", "release", "--from-report", fresh.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("Released 0 IPs successfully"), "{stdout}");
    assert!(
        stdout.contains("3 addresses marked as leaked in the report had already been cleaned up."),
        "{stdout}"
    );
    assert!(
        stdout.contains("Released 0 handles; 1 skipped; 0 errors."),
        "{stdout}"
    );

    // 5. Unlocked, IPAM is clean and the workload keeps its address.
    let out = cluster.ctl(&["datastore", "migrate", "unlock"]);
    assert!(text(&out.stdout).contains("Datastore unlocked."));
    let out = cluster.ctl(&["ipam", "check"]);
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("found 0 problems"));
    let out = cluster.ctl(&["ipam", "show", "--ip", &used]);
    assert!(
        text(&out.stdout).contains(&format!("IP {used} is in use")),
        "{out:?}"
    );
    for ip in &leaked {
        let out = cluster.ctl(&["ipam", "show", "--ip", ip]);
        assert!(text(&out.stdout).contains("is not assigned"), "{out:?}");
    }
}

#[test]
fn a_report_from_another_cluster_is_never_used() {
    let cluster = Cluster::new();
    leak(&cluster);
    let path = cluster.file("other.json");
    assert_eq!(
        cluster
            .ctl(&["ipam", "check", "-o", path.to_str().unwrap()])
            .status
            .code(),
        Some(1)
    );
    let mut report = read_json(&path);
    report["clusterGUID"] = Value::String("0123456789abcdef".into());
    std::fs::write(&path, serde_json::to_vec(&report).unwrap()).unwrap();
    // Not even with --force.
    let out = cluster.ctl(&[
        "ipam",
        "release",
        "--from-report",
        path.to_str().unwrap(),
        "--force",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("mismatched cluster GUID"),
        "{out:?}"
    );
    // A file that is not a report says so.
    std::fs::write(&path, "{\"hello\": 1}").unwrap();
    let out = cluster.ctl(&["ipam", "release", "--from-report", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("is not an IPAM report"),
        "{out:?}"
    );
}

#[test]
fn patch_version_configure_and_get_as_calicoctl() {
    // Before anything is stored, `get` lists nothing rather than failing.
    let empty = tempfile::tempdir().unwrap();
    let out = Command::cargo_bin("margay")
        .unwrap()
        .env_clear()
        .env("DATASTORE_PATH", empty.path().join("never.db"))
        .args(["ctl", "get", "ippools"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stdout).starts_with("NAME "), "{out:?}");
    assert!(
        !empty.path().join("never.db").exists(),
        "get must not create a store"
    );

    let cluster = Cluster::new();
    // patch: merge, validated, compare-and-swap.
    let out = cluster.ctl(&[
        "patch",
        "ippool",
        "default-ipv4-ippool",
        "-p",
        r#"{"spec":{"natOutgoing":false,"nodeSelector":"zone == 'a'"}}"#,
    ]);
    assert_eq!(
        text(&out.stdout).trim(),
        "Successfully patched 1 'IPPool' resource",
        "{out:?}"
    );
    let pool = cluster.ctl(&["get", "ippool", "default-ipv4-ippool", "-o", "json"]);
    let pool: Value = serde_json::from_slice(&pool.stdout).unwrap();
    assert_eq!(pool["spec"]["nodeSelector"], "zone == 'a'");
    assert!(pool["spec"].get("natOutgoing").is_none_or(|v| v == false));
    assert_eq!(pool["spec"]["cidr"], "10.77.0.0/24", "the rest is kept");
    // Every problem of a bad patch, and nothing written.
    let out = cluster.ctl(&[
        "patch",
        "ippool",
        "default-ipv4-ippool",
        "-p",
        r#"{"spec":{"blockSize":"big","disabled":"maybe"}}"#,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("spec.blockSize") && stderr.contains("spec.disabled"),
        "{stderr}"
    );
    let out = cluster.ctl(&["patch", "ippool", "nope", "-p", "{}"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("resource does not exist"),
        "{out:?}"
    );

    // version: calicoctl's layout, the cluster's facts from ClusterInformation.
    let out = cluster.ctl(&["version"]);
    let v = text(&out.stdout);
    assert!(
        v.contains(&format!(
            "Client Version:    v{}\n",
            env!("CARGO_PKG_VERSION")
        )),
        "{v}"
    );
    assert!(v.contains("Git commit:        "), "{v}");
    assert!(v.contains("Cluster Version:   "), "{v}");
    assert!(v.contains("Cluster Type:      "), "{v}");
    let out = cluster.ctl(&["version", "--client"]);
    assert!(!text(&out.stdout).contains("Cluster"), "{out:?}");

    // ipam configure: one setting at a time, the others kept.
    let out = cluster.ctl(&["ipam", "configure", "--strictaffinity=true"]);
    assert_eq!(
        text(&out.stdout).trim(),
        "Successfully set StrictAffinity to: true",
        "{out:?}"
    );
    let out = cluster.ctl(&["ipam", "configure", "--max-blocks-per-host=4"]);
    assert!(out.status.success(), "{out:?}");
    let cfg = cluster.ctl(&["get", "ipamconfigurations", "default", "-o", "json"]);
    let cfg: Value = serde_json::from_slice(&cfg.stdout).unwrap();
    assert_eq!(cfg["spec"]["strictAffinity"], true, "{cfg}");
    assert_eq!(cfg["spec"]["maxBlocksPerHost"], 4, "{cfg}");
    let out = cluster.ctl(&["ipam", "configure", "--strictaffinity=perhaps"]);
    assert_eq!(out.status.code(), Some(2));
    let out = cluster.ctl(&["ipam", "configure"]);
    assert_eq!(out.status.code(), Some(2), "at least one setting: {out:?}");
}

#[test]
fn get_f_and_yaml_as_calicoctl_prints_them() {
    let cluster = Cluster::new();
    // YAML quoted as go-yaml quotes: numbers-as-strings and timestamps in double quotes.
    let out = cluster.ctl(&["get", "ippools", "-o", "yaml"]);
    let yaml = text(&out.stdout);
    assert!(
        yaml.starts_with(
            "apiVersion: projectcalico.org/v3\nitems:\n- apiVersion: projectcalico.org/v3\n"
        ),
        "{yaml}"
    );
    assert!(yaml.contains("\n  resourceVersion: \""), "{yaml}");
    assert!(yaml.contains("    creationTimestamp: \""), "{yaml}");
    assert!(!yaml.contains('\''), "{yaml}");
    // get -f: a named document is read by name, an unnamed one lists its kind; several
    // results are one sequence.
    let f = cluster.file("get.yaml");
    std::fs::write(
        &f,
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: default-ipv4-ippool}\n---\napiVersion: projectcalico.org/v3\nkind: Node\n",
    )
    .unwrap();
    let out = cluster.ctl(&["get", "-f", f.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["kind"], "IPPool");
    assert_eq!(v[0]["metadata"]["name"], "default-ipv4-ippool");
    assert_eq!(v[1]["kind"], "NodeList");
    assert_eq!(v[1]["items"][0]["metadata"]["name"], "n1");
    // A table per result; a name that does not exist is reported and fails the command.
    std::fs::write(
        &f,
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: default-ipv4-ippool}\n---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: missing}\n",
    )
    .unwrap();
    let out = cluster.ctl(&["get", "-f", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("default-ipv4-ippool"), "{out:?}");
    assert!(text(&out.stderr).contains("missing"), "{out:?}");
}

/// calicoctl's documented move from etcd (here the embedded store) to the Kubernetes
/// datastore: lock, export, import into a cluster (the API server double), unlock.
#[test]
fn datastore_migrate_moves_a_cluster_to_the_kubernetes_datastore() {
    use margay_apiserver::{ApiServer, Gvr, ServerOptions};

    let cluster = Cluster::new();
    let (_, used) = leak(&cluster);
    let resources = "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: deny-db}\nspec:\n  selector: app == 'db'\n  types: [Ingress]\n---\napiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: node.n1}\nspec: {logSeverityScreen: Debug}\n---\napiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata: {name: knp.default.from-k8s, namespace: prod}\nspec: {selector: all()}\n";
    let out = cluster
        .margay()
        .args(["ctl", "apply", "-f", "-"])
        .write_stdin(resources)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    // Export needs a locked store, and nodes that say which Kubernetes node they are.
    let out = cluster.ctl(&["datastore", "migrate", "export"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("datastore is not locked"),
        "{out:?}"
    );
    cluster.ctl(&["datastore", "migrate", "lock"]);
    let out = cluster.ctl(&["datastore", "migrate", "export"]);
    assert!(
        text(&out.stderr).contains("missing a 'k8s' orchestrator reference"),
        "{out:?}"
    );
    let out = cluster.ctl(&[
        "patch",
        "node",
        "n1",
        "-p",
        r#"{"spec":{"orchRefs":[{"nodeName":"k8s-n1","orchestrator":"k8s"}]}}"#,
    ]);
    assert!(out.status.success(), "{out:?}");
    let out = cluster.ctl(&["datastore", "migrate", "export"]);
    assert!(out.status.success(), "{out:?}");
    let export = text(&out.stdout);
    assert_eq!(export.matches("\n===\n").count(), 2, "three parts");
    assert!(export.contains("kind: GlobalNetworkPolicyList"));
    assert!(
        export.contains("name: k8s-n1"),
        "nodes take their Kubernetes names"
    );
    assert!(
        export.contains("name: node.k8s-n1"),
        "and so does their configuration"
    );
    assert!(
        !export.contains("knp.default.from-k8s"),
        "derived policies stay behind"
    );
    assert!(export.contains("\"Key\": \"/calico/ipam/v2/handle/k8s-pod-network.used\""));
    assert!(export.contains("host:k8s-n1"), "block affinities renamed");
    let file = cluster.file("cluster.migrate");
    std::fs::write(&file, &export).unwrap();
    let guid = {
        let out = cluster.ctl(&["get", "clusterinformation", "default", "-o", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["spec"]["clusterGUID"].as_str().unwrap().to_string()
    };

    // The Kubernetes cluster: its node exists (the kubelet registered it), no Calico data.
    let api = ApiServer::start(ServerOptions {
        calico_crds: true,
        ..ServerOptions::default()
    })
    .unwrap();
    let kubeconfig = cluster.file("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    api.store()
        .create(
            Gvr::core("nodes"),
            "",
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "k8s-n1"}}),
        )
        .unwrap();
    let kube = |args: &[&str]| cluster.kube_ctl(&kubeconfig, args);
    let out = kube(&[
        "datastore",
        "migrate",
        "import",
        "-f",
        file.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("Datastore locked."), "{stdout}");
    assert!(
        stdout.contains("Datastore information successfully imported."),
        "{stdout}"
    );

    // Everything is there, under the Kubernetes names.
    let out = kube(&["get", "gnp", "deny-db", "-o", "json"]);
    assert!(out.status.success(), "{out:?}");
    let out = kube(&["get", "felixconfiguration", "node.k8s-n1", "-o", "json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["spec"]["logSeverityScreen"], "Debug", "{v}");
    let out = kube(&["ipam", "show", "--ip", &used]);
    assert!(
        text(&out.stdout).contains(&format!("IP {used} is in use")),
        "{out:?}"
    );
    let out = kube(&["get", "clusterinformation", "default", "-o", "json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["spec"]["clusterGUID"],
        guid.as_str(),
        "the cluster keeps its identity"
    );
    assert_eq!(
        v["spec"]["datastoreReady"], false,
        "left locked for the operator"
    );
    // A second import refuses: the target is no longer empty.
    let out = kube(&[
        "datastore",
        "migrate",
        "import",
        "-f",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("already has Calico resources"),
        "{out:?}"
    );
    let out = kube(&["datastore", "migrate", "unlock"]);
    assert!(text(&out.stdout).contains("Datastore unlocked."), "{out:?}");
}

#[test]
fn node_checksystem_and_diags() {
    // This machine runs the whole suite: it meets the requirements.
    let out = Command::cargo_bin("margay")
        .unwrap()
        .args(["ctl", "node", "checksystem"])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("System meets minimum system requirements to run margay!"));
    assert!(
        stdout.contains("nftables") && stdout.contains("veth pairs"),
        "{stdout}"
    );
    // A kernel without nftables fails, naming what is missing.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config");
    std::fs::write(
        &cfg,
        "CONFIG_VETH=y\n# CONFIG_NF_TABLES is not set\nCONFIG_VXLAN=m\n",
    )
    .unwrap();
    let out = Command::cargo_bin("margay")
        .unwrap()
        .args(["ctl", "node", "checksystem", "--kernel-config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("FAIL (CONFIG_NF_TABLES not found)"),
        "{stdout}"
    );
    assert!(stdout.contains("OK (CONFIG_VXLAN=m)"), "{stdout}");
    assert!(text(&out.stderr).contains("doesn't meet one or more minimum systems requirements"));

    // diags: a tarball with the node's state and margay's logs.
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(logs.join("cni")).unwrap();
    std::fs::write(logs.join("cni/cni.log"), "ADD ok\n").unwrap();
    let out = Command::cargo_bin("margay")
        .unwrap()
        .args(["ctl", "node", "diags", "--log-dir"])
        .arg(&logs)
        .timeout(std::time::Duration::from_secs(180))
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let tarball = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Diags saved to "))
        .expect("where the bundle is")
        .to_string();
    let listing = std::process::Command::new("tar")
        .args(["-tzf", &tarball])
        .output()
        .unwrap();
    let listing = text(&listing.stdout);
    for f in [
        "diagnostics/ipv4_route",
        "diagnostics/nft_ruleset",
        "diagnostics/date",
        "diagnostics/logs/cni/cni.log",
    ] {
        assert!(listing.lines().any(|l| l == f), "{f} in\n{listing}");
    }
    let bundle_dir = Path::new(&tarball).parent().unwrap().to_path_buf();
    assert!(bundle_dir.starts_with(std::env::temp_dir()));
    std::fs::remove_dir_all(bundle_dir).unwrap();
}

/// Felix's policy for one endpoint as `margay felix status --json` shows it: each tier's name,
/// default action and ingress/egress policies, in order.
fn felix_tiers(
    cluster: &Cluster,
    env: &[(&str, &std::ffi::OsStr)],
    host: &str,
    tag: &str,
) -> (Value, Vec<String>) {
    use margay_testkit::roles::{Role, wait_until};
    let socket = cluster.file(&format!("felix-{tag}.sock"));
    let mut c = std::process::Command::new(assert_cmd::cargo::cargo_bin("margay"));
    c.env_clear()
        .env("MARGAY_DATAPLANE", "recording")
        .env("FELIX_FELIXHOSTNAME", host)
        .env("FELIX_LOGFILEPATH", "none")
        .env("FELIX_LOGSEVERITYSYS", "none")
        .env("FELIX_HEALTHENABLED", "false")
        .args(["felix", "run", "-c"])
        .arg(cluster.file("no-felix.cfg"))
        .arg("--status-socket")
        .arg(&socket);
    for (k, v) in env {
        c.env(k, v);
    }
    let mut felix = Role::spawn("felix", c, cluster.file(&format!("felix-{tag}.log")));
    let endpoint = wait_until(
        &format!("Felix on the {tag} datastore in sync with one endpoint"),
        std::time::Duration::from_secs(60),
        || {
            felix.assert_running();
            let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("margay"))
                .env_clear()
                .args(["felix", "status", "--json", "--status-socket"])
                .arg(&socket)
                .output()
                .map_err(|e| e.to_string())?;
            let st: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
            match st["endpoints"].as_array() {
                Some(eps) if st["in_sync"] == true && eps.len() == 1 => Ok(eps[0].clone()),
                _ => Err(st.to_string()),
            }
        },
    );
    felix.terminate().unwrap();
    let profiles = endpoint["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    (endpoint["tiers"].clone(), profiles)
}

/// The migration's point: after `datastore migrate export` from the embedded store and
/// `import` into a Kubernetes API server (whose pods are the workloads, as in the cluster
/// being migrated), Felix on the Kubernetes datastore computes the same policy for the same
/// workload as Felix did before: the same tiers, policies in the same order, the namespace's
/// profile.
#[test]
fn felix_computes_the_same_policy_after_datastore_migrate() {
    use margay_apiserver::{ApiServer, Gvr, ServerOptions};

    let cluster = Cluster::new();
    let resources = "\
apiVersion: projectcalico.org/v3
kind: Tier
metadata: {name: security}
spec: {order: 100}
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: security.quarantine}
spec:
  tier: security
  order: 10
  selector: quarantine == 'true'
  types: [Ingress, Egress]
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: security.pass-db}
spec:
  tier: security
  order: 20
  selector: app == 'db'
  ingress: [{action: Pass}]
  types: [Ingress]
---
apiVersion: projectcalico.org/v3
kind: GlobalNetworkPolicy
metadata: {name: db-from-web}
spec:
  order: 100
  selector: app == 'db'
  ingress:
  - action: Allow
    protocol: TCP
    source: {selector: app == 'web'}
    destination: {ports: [5432]}
  types: [Ingress]
---
apiVersion: projectcalico.org/v3
kind: NetworkPolicy
metadata: {name: db-egress, namespace: prod}
spec:
  order: 200
  selector: app == 'db'
  egress: [{action: Allow, protocol: UDP, destination: {ports: [53]}}]
  types: [Egress]
---
apiVersion: projectcalico.org/v3
kind: Profile
metadata: {name: kns.prod}
spec:
  labelsToApply: {pcns.projectcalico.org/name: prod}
  ingress: [{action: Allow}]
  egress: [{action: Allow}]
---
apiVersion: projectcalico.org/v3
kind: WorkloadEndpoint
metadata:
  name: n1-k8s-db--1-eth0
  namespace: prod
  labels: {app: db, projectcalico.org/namespace: prod, projectcalico.org/orchestrator: k8s}
spec: {orchestrator: k8s, node: n1, pod: db-1, endpoint: eth0, interfaceName: cali0123456789a, ipNetworks: [10.77.0.5/32], profiles: [kns.prod]}
";
    let out = cluster
        .margay()
        .args(["ctl", "apply", "-f", "-"])
        .write_stdin(resources)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let store = cluster.store();
    let before = felix_tiers(
        &cluster,
        &[
            ("DATASTORE_TYPE", "local".as_ref()),
            ("DATASTORE_PATH", store.as_os_str()),
        ],
        "n1",
        "embedded",
    );
    let names: Vec<&str> = before
        .0
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["security", "default"], "{}", before.0);
    assert_eq!(
        before.0[0]["ingress"],
        serde_json::json!(["security.pass-db"])
    );
    assert_eq!(before.0[1]["ingress"], serde_json::json!(["db-from-web"]));
    assert_eq!(before.0[1]["egress"], serde_json::json!(["prod/db-egress"]));

    // Migrate: the node keeps its name in Kubernetes.
    cluster.ctl(&["datastore", "migrate", "lock"]);
    let out = cluster.ctl(&[
        "patch",
        "node",
        "n1",
        "-p",
        r#"{"spec":{"orchRefs":[{"nodeName":"n1","orchestrator":"k8s"}]}}"#,
    ]);
    assert!(out.status.success(), "{out:?}");
    let out = cluster.ctl(&["datastore", "migrate", "export"]);
    assert!(out.status.success(), "{out:?}");
    let file = cluster.file("cluster.migrate");
    std::fs::write(&file, &out.stdout).unwrap();

    // The Kubernetes cluster being migrated to: its node, namespace and pod exist already.
    let api = ApiServer::start(ServerOptions {
        calico_crds: true,
        ..ServerOptions::default()
    })
    .unwrap();
    let kubeconfig = cluster.file("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let s = api.store();
    s.create(
        Gvr::core("nodes"),
        "",
        serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
    )
    .unwrap();
    s.create(
        Gvr::core("namespaces"),
        "",
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "prod"}}),
    )
    .unwrap();
    s.create(
        Gvr::core("pods"),
        "prod",
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "db-1", "namespace": "prod", "labels": {"app": "db"},
                         "annotations": {"cni.projectcalico.org/podIP": "10.77.0.5/32",
                                         "cni.projectcalico.org/podIPs": "10.77.0.5/32",
                                         "cni.projectcalico.org/containerID": "0123456789abcdef"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "postgres"}]},
            "status": {"phase": "Running", "podIP": "10.77.0.5", "podIPs": [{"ip": "10.77.0.5"}]},
        }),
    )
    .unwrap();
    let kube = |args: &[&str]| cluster.kube_ctl(&kubeconfig, args);
    let out = kube(&[
        "datastore",
        "migrate",
        "import",
        "-f",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let out = kube(&["datastore", "migrate", "unlock"]);
    assert!(out.status.success(), "{out:?}");

    let after = felix_tiers(
        &cluster,
        &[
            ("DATASTORE_TYPE", "kubernetes".as_ref()),
            ("KUBECONFIG", kubeconfig.as_os_str()),
        ],
        "n1",
        "kubernetes",
    );
    assert_eq!(
        after.0, before.0,
        "the same tiers and policies, in the same order"
    );
    assert!(after.1.contains(&"kns.prod".to_string()), "{:?}", after.1);
}
