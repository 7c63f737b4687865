//! The resource commands of `margay ctl` (create, apply, replace, delete, get, label, ipam), run as
//! the real binary against a private etcd and against the embedded local datastore.
//!
//! Every test has its own store and temp directory, and names its datastore explicitly (a
//! `--config` file of its own, or the environment with the datastore variables reset), so
//! /etc/calico/calicoctl.cfg and /var/lib/margay are never touched.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use margay_testkit::etcd::EtcdServer;
use serde_json::Value;

/// Variables that could point the binary at some other datastore.
const DATASTORE_VARS: [&str; 11] = [
    "DATASTORE_TYPE",
    "DATASTORE_PATH",
    "ETCD_ENDPOINTS",
    "ETCD_DISCOVERY_SRV",
    "ETCD_CA_CERT_FILE",
    "ETCD_CERT_FILE",
    "ETCD_KEY_FILE",
    "ETCD_USERNAME",
    "ETCD_PASSWORD",
    "KUBECONFIG",
    "MARGAY_LOG_LEVEL",
];

/// A private datastore, a temp directory for input files, and a CalicoAPIConfig file there
/// naming the store.
struct Store {
    etcd: Option<EtcdServer>,
    dir: tempfile::TempDir,
    config: PathBuf,
    describe: String,
}

impl Store {
    fn etcd() -> Store {
        let etcd = EtcdServer::start().expect("start a private etcd");
        let endpoint = etcd.endpoint();
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(
            dir.path(),
            &format!("  datastoreType: etcdv3\n  etcdEndpoints: {endpoint}\n"),
        );
        Store {
            etcd: Some(etcd),
            dir,
            config,
            describe: format!("etcd at {endpoint}"),
        }
    }

    fn local() -> Store {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ds.db");
        let config = write_config(
            dir.path(),
            &format!(
                "  datastoreType: local\n  datastorePath: {}\n",
                db.display()
            ),
        );
        let store = Store {
            etcd: None,
            dir,
            config,
            describe: format!("local datastore at {}", db.display()),
        };
        // Bring the (empty) store into being: only create and apply may create it.
        let seed = store.file(
            "seed.yaml",
            "apiVersion: projectcalico.org/v3\nkind: Profile\nmetadata:\n  name: seed\n",
        );
        assert_eq!(run(store.ctl(&["create", "-f", &seed])).code, 0);
        assert_eq!(run(store.ctl(&["delete", "profile", "seed"])).code, 0);
        store
    }

    /// `margay ctl --config <ours> ARGS...`, with no datastore variables in the environment.
    fn ctl(&self, args: &[&str]) -> Command {
        let mut cmd = margay();
        cmd.arg("ctl").arg("--config").arg(&self.config).args(args);
        cmd
    }

    fn file(&self, name: &str, text: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }
}

fn write_config(dir: &Path, spec: &str) -> PathBuf {
    let path = dir.join("calicoctl.cfg");
    std::fs::write(
        &path,
        format!(
            "apiVersion: projectcalico.org/v3\nkind: CalicoAPIConfig\nmetadata: {{}}\nspec:\n{spec}"
        ),
    )
    .unwrap();
    path
}

fn margay() -> Command {
    let mut cmd = Command::cargo_bin("margay").expect("margay binary");
    for var in DATASTORE_VARS {
        cmd.env_remove(var);
    }
    cmd.timeout(std::time::Duration::from_secs(120));
    cmd
}

struct Run {
    code: i32,
    out: String,
    err: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.out, self.err
        )
    }
}

fn run(mut cmd: Command) -> Run {
    let o = cmd.output().unwrap();
    Run {
        code: o.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn pool(name: &str, cidr: &str, labels: &str) -> String {
    format!(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: {name}\n  labels: {labels}\nspec:\n  cidr: {cidr}\n  natOutgoing: true\n"
    )
}

fn policy(name: &str, namespace: &str) -> String {
    format!(
        "apiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  selector: app == 'web'\n  types: [Ingress]\n  ingress:\n  - action: Allow\n    protocol: TCP\n    destination:\n      ports: [80, 443]\n"
    )
}

/// Runs a scenario against both kinds of store.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod etcd {
            $(#[test] fn $name() { super::$name(&super::Store::etcd()); })*
        }
        mod local {
            $(#[test] fn $name() { super::$name(&super::Store::local()); })*
        }
    };
}

on_both_stores!(
    create_then_get_yaml_round_trips,
    apply_twice_reports_unchanged_then_updated,
    replace_of_a_missing_resource_fails,
    delete_by_kind_and_name,
    label_sets_and_removes,
    get_filters_by_label_selector,
    an_invalid_document_is_reported_and_the_valid_ones_are_written,
    ipam_show_check_and_release,
    a_kubernetes_network_policy_is_applied_shown_and_deleted,
);

/// `ipam show/check/release` on a store with a pool and an endpoint whose address IPAM never
/// allocated (the allocating side is tested with the CNI plugin, tests/cni.rs).
fn ipam_show_check_and_release(s: &Store) {
    let f = s.file("pool.yaml", &pool("pool-i", "10.44.0.0/16", "{}"));
    assert_eq!(run(s.ctl(&["create", "-f", &f])).code, 0);
    let r = run(s.ctl(&["ipam", "show"]));
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.out.contains(
            "| IP Pool  | 10.44.0.0/16 |     65536 |     0 (0%) |       0 (0%) | 65536 (100%) |"
        ),
        "{r:?}"
    );
    let r = run(s.ctl(&["ipam", "check"]));
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.out.contains("Check complete; found 0 problems"), "{r:?}");
    let wep = "apiVersion: projectcalico.org/v3\nkind: WorkloadEndpoint\nmetadata:\n  namespace: default\nspec:\n  orchestrator: k8s\n  node: n1\n  pod: p1\n  endpoint: eth0\n  interfaceName: cali1\n  ipNetworks: [10.44.0.9/32]\n";
    let f = s.file("wep.yaml", wep);
    assert_eq!(run(s.ctl(&["create", "-f", &f])).code, 0);
    let r = run(s.ctl(&["ipam", "check"]));
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.out.contains("10.44.0.9 in use by Workload(default/n1-k8s-p1-eth0) and in an IP pool but has no IPAM allocation"),
        "{r:?}"
    );
    let r = run(s.ctl(&["ipam", "release", "--ip", "10.44.0.9"]));
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("10.44.0.9 is not assigned"), "{r:?}");
}

/// A Kubernetes NetworkPolicy goes in as Calico converts it (`knp.default.<name>`, tier
/// default, order 1000) and comes out of `get` and `delete` under either name.
fn a_kubernetes_network_policy_is_applied_shown_and_deleted(s: &Store) {
    let netpol = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: allow-web
  namespace: shop
spec:
  podSelector:
    matchLabels: {app: web}
  ingress:
  - from:
    - podSelector: {matchLabels: {role: lb}}
    - ipBlock: {cidr: 10.8.0.0/16, except: [10.8.1.0/24]}
    ports:
    - {port: 443}
    - {port: 8000, endPort: 8080, protocol: TCP}
";
    let f = s.file("netpol.yaml", netpol);
    let r = run(s.ctl(&["apply", "-f", &f]));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        r.out,
        "Successfully applied 1 'NetworkPolicy' resource(s)\n"
    );

    let r = run(s.ctl(&[
        "get",
        "networkpolicies.networking.k8s.io",
        "allow-web",
        "-n",
        "shop",
        "-o",
        "json",
    ]));
    assert_eq!(r.code, 0, "{r:?}");
    let got: Value = serde_json::from_str(&r.out).unwrap();
    assert_eq!(got["metadata"]["name"], "knp.default.allow-web");
    assert_eq!(got["metadata"]["namespace"], "shop");
    assert_eq!(
        got["spec"],
        serde_json::json!({
            "tier": "default",
            "order": 1000,
            "selector": "projectcalico.org/orchestrator == 'k8s' && app == 'web'",
            "types": ["Ingress"],
            "ingress": [
                {
                    "action": "Allow",
                    "protocol": "TCP",
                    "source": {"selector": "projectcalico.org/orchestrator == 'k8s' && role == 'lb'"},
                    "destination": {"ports": [443, "8000:8080"]},
                },
                {
                    "action": "Allow",
                    "protocol": "TCP",
                    "source": {"nets": ["10.8.0.0/16"], "notNets": ["10.8.1.0/24"]},
                    "destination": {"ports": [443, "8000:8080"]},
                },
            ],
        })
    );
    let r = run(s.ctl(&["get", "policies", "-A"]));
    let rows: Vec<Vec<&str>> = r
        .out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[1],
        ["shop", "knp.default.allow-web", "default"],
        "{r:?}"
    );

    // Applying the same document again is a no-op; validate accepts it too.
    let r = run(s.ctl(&["apply", "-f", &f]));
    assert_eq!(r.err, "0 created, 0 updated, 1 unchanged\n", "{r:?}");
    let r = run(s.ctl(&["validate", "-f", &f]));
    assert_eq!(r.code, 0, "{r:?}");

    let r = run(s.ctl(&["delete", "-f", &f]));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        r.out,
        "Successfully deleted 1 'NetworkPolicy' resource(s)\n"
    );
    let r = run(s.ctl(&[
        "get",
        "networkpolicy",
        "knp.default.allow-web",
        "-n",
        "shop",
    ]));
    assert_eq!(r.code, 1, "{r:?}");
}

fn create_then_get_yaml_round_trips(s: &Store) {
    let f = s.file(
        "res.yaml",
        &[
            pool("pool-a", "10.1.0.0/16", "{env: prod}"),
            policy("web", "shop"),
        ]
        .join("---\n"),
    );
    let r = run(s.ctl(&["create", "-f", &f]));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.out, "Successfully created 2 resource(s)\n");

    let r = run(s.ctl(&["get", "ippool", "pool-a", "-o", "yaml"]));
    assert_eq!(r.code, 0, "{r:?}");
    for line in [
        "apiVersion: projectcalico.org/v3\n",
        "kind: IPPool\n",
        "  name: pool-a\n",
        "    env: prod\n",
        "  cidr: 10.1.0.0/16\n",
        "  natOutgoing: true\n",
        "  resourceVersion: ",
        "  uid: ",
    ] {
        assert!(r.out.contains(line), "{line:?} in {r:?}");
    }

    // What get prints is accepted back as it is.
    let back = s.file("back.yaml", &r.out);
    let r = run(s.ctl(&["apply", "-f", &back]));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.err, "0 created, 0 updated, 1 unchanged\n");

    let r = run(s.ctl(&["get", "networkpolicy", "web", "-n", "shop", "-o", "json"]));
    assert_eq!(r.code, 0, "{r:?}");
    let got: Value = serde_json::from_str(&r.out).unwrap();
    assert_eq!(got["kind"], "NetworkPolicy");
    assert_eq!(got["metadata"]["namespace"], "shop");
    assert_eq!(
        got["spec"]["ingress"][0]["destination"]["ports"],
        serde_json::json!([80, 443])
    );

    let r = run(s.ctl(&["get", "policies", "-A"]));
    assert_eq!(r.code, 0, "{r:?}");
    let rows: Vec<Vec<&str>> = r
        .out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["NAMESPACE", "NAME", "TIER"]);
    assert_eq!(rows[1], ["shop", "web", "default"]);
}

fn apply_twice_reports_unchanged_then_updated(s: &Store) {
    let f = s.file("pool.yaml", &pool("pool-a", "10.1.0.0/16", "{env: prod}"));
    let r = run(s.ctl(&["apply", "-f", &f]));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.out, "Successfully applied 1 'IPPool' resource(s)\n");
    assert_eq!(r.err, "");

    let r = run(s.ctl(&["apply", "-f", &f]));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.out, "Successfully applied 1 'IPPool' resource(s)\n");
    assert_eq!(r.err, "0 created, 0 updated, 1 unchanged\n");

    let f = s.file("pool.yaml", &pool("pool-a", "10.1.0.0/16", "{env: dev}"));
    let r = run(s.ctl(&["apply", "-f", &f]));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.err, "0 created, 1 updated, 0 unchanged\n");
    let r = run(s.ctl(&["get", "ippools", "-l", "env == 'dev'", "-o", "name"]));
    assert_eq!(r.out, "ippool.projectcalico.org/pool-a\n", "{r:?}");
}

fn replace_of_a_missing_resource_fails(s: &Store) {
    let f = s.file("pool.yaml", &pool("pool-a", "10.1.0.0/16", "{}"));
    let r = run(s.ctl(&["replace", "-f", &f]));
    assert_eq!(r.code, 1, "{r:?}");
    assert_eq!(r.out, "");
    assert!(
        r.err.contains(
            "Failed to replace 'IPPool' resource: resource does not exist: IPPool(pool-a)"
        ),
        "{r:?}"
    );
    let r = run(s.ctl(&["get", "ippools", "-o", "name"]));
    assert_eq!(r.out, "", "{r:?}");

    // Once it exists, replace works, and a stale copy is refused.
    let r = run(s.ctl(&["create", "-f", &f]));
    assert_eq!(r.code, 0, "{r:?}");
    let stale = s.file(
        "stale.yaml",
        &run(s.ctl(&["get", "ippool", "pool-a", "-o", "yaml"])).out,
    );
    let r = run(s.ctl(&["replace", "-f", &f]));
    assert_eq!(
        r.out, "Successfully replaced 1 'IPPool' resource(s)\n",
        "{r:?}"
    );
    let r = run(s.ctl(&["replace", "-f", &stale]));
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("re-read it and retry"), "{r:?}");
}

fn delete_by_kind_and_name(s: &Store) {
    let f = s.file(
        "pools.yaml",
        &[
            pool("pool-a", "10.1.0.0/16", "{}"),
            pool("pool-b", "10.2.0.0/16", "{}"),
        ]
        .join("---\n"),
    );
    assert_eq!(run(s.ctl(&["create", "-f", &f])).code, 0);
    let r = run(s.ctl(&["delete", "ippool", "pool-a"]));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.out, "Successfully deleted 1 'IPPool' resource(s)\n");
    let r = run(s.ctl(&["get", "ippools", "-o", "name"]));
    assert_eq!(r.out, "ippool.projectcalico.org/pool-b\n", "{r:?}");

    let r = run(s.ctl(&["delete", "ippool", "pool-a"]));
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.err.contains("resource does not exist: IPPool(pool-a)"),
        "{r:?}"
    );
    let r = run(s.ctl(&["delete", "ippools", "pool-a", "pool-b", "--skip-not-exists"]));
    assert_eq!(r.code, 0, "{r:?}");
    let r = run(s.ctl(&["get", "ippools"]));
    assert_eq!(r.out, "NAME   CIDR   SELECTOR   \n\n", "{r:?}");
}

fn label_sets_and_removes(s: &Store) {
    let f = s.file("pool.yaml", &pool("pool-a", "10.1.0.0/16", "{}"));
    assert_eq!(run(s.ctl(&["create", "-f", &f])).code, 0);
    let r = run(s.ctl(&["label", "ippools", "pool-a", "zone=a"]));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.out, "Successfully set label zone on ippools pool-a\n");
    let r = run(s.ctl(&["label", "ippools", "pool-a", "zone=b"]));
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("please use '--overwrite'"), "{r:?}");
    let r = run(s.ctl(&["label", "ippools", "pool-a", "zone=b", "--overwrite"]));
    assert_eq!(
        r.out, "Successfully updated label zone on ippools pool-a\n",
        "{r:?}"
    );
    let r = run(s.ctl(&["get", "ippools", "-l", "zone == 'b'", "-o", "name"]));
    assert_eq!(r.out, "ippool.projectcalico.org/pool-a\n", "{r:?}");
    let r = run(s.ctl(&["label", "ippools", "pool-a", "zone", "--remove"]));
    assert_eq!(
        r.out, "Successfully removed label zone from ippools pool-a\n",
        "{r:?}"
    );
    let r = run(s.ctl(&["get", "ippools", "-l", "has(zone)", "-o", "name"]));
    assert_eq!(r.out, "", "{r:?}");
}

fn get_filters_by_label_selector(s: &Store) {
    let f = s.file(
        "pools.yaml",
        &[
            pool("a", "10.1.0.0/16", "{env: prod, tier: web}"),
            pool("b", "10.2.0.0/16", "{env: dev}"),
            pool("c", "10.3.0.0/16", "{}"),
        ]
        .join("---\n"),
    );
    assert_eq!(run(s.ctl(&["create", "-f", &f])).code, 0);
    let r = run(s.ctl(&["get", "ippools", "-l", "has(env) && env != 'dev'"]));
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        r.out,
        "NAME   CIDR          SELECTOR   \na      10.1.0.0/16              \n\n"
    );
    let r = run(s.ctl(&[
        "get",
        "ippools",
        "-l",
        "env in {'dev','prod'}",
        "-o",
        "json",
    ]));
    let list: Value = serde_json::from_str(&r.out).unwrap();
    assert_eq!(list["kind"], "IPPoolList");
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    let r = run(s.ctl(&["get", "ippools", "-l", "env =="]));
    assert_eq!(r.code, 2, "{r:?}");
}

fn an_invalid_document_is_reported_and_the_valid_ones_are_written(s: &Store) {
    let f = s.file(
        "batch.yaml",
        &[
            pool("good-1", "10.1.0.0/16", "{}"),
            pool("bad", "10.2.0.0/40", "{}"),
            pool("good-2", "10.3.0.0/16", "{}"),
        ]
        .join("---\n"),
    );
    let r = run(s.ctl(&["apply", "-f", &f]));
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.err
            .contains(&format!("{f} [document 2] IPPool/bad: spec.cidr: ")),
        "{r:?}"
    );
    assert_eq!(
        r.out,
        "Partial success: applied 2 out of 3 'IPPool' resources\n"
    );
    let r = run(s.ctl(&["get", "ippools", "-o", "name"]));
    assert_eq!(
        r.out, "ippool.projectcalico.org/good-1\nippool.projectcalico.org/good-2\n",
        "{r:?}"
    );
}

#[test]
fn an_unreachable_etcd_is_a_clear_error_with_exit_1() {
    let port = margay_testkit::free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    let config = write_config(
        dir.path(),
        &format!("  datastoreType: etcdv3\n  etcdEndpoints: {endpoint}\n"),
    );
    let f = dir.path().join("pool.yaml");
    std::fs::write(&f, pool("pool-a", "10.1.0.0/16", "{}")).unwrap();
    for args in [
        vec!["get", "ippools"],
        vec!["apply", "-f", f.to_str().unwrap()],
    ] {
        let mut cmd = margay();
        cmd.arg("ctl").arg("-c").arg(&config).args(&args);
        let r = run(cmd);
        assert_eq!(r.code, 1, "{r:?}");
        assert!(
            r.err.starts_with(&format!(
                "error: cannot reach the datastore (etcd at {endpoint}): "
            )),
            "{r:?}"
        );
        assert_eq!(r.out, "", "{r:?}");
    }
}

#[test]
fn an_unusable_local_path_is_a_clear_error_with_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    // The store's directory is a regular file: the store cannot be opened.
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "").unwrap();
    let db = blocker.join("ds.db");
    let mut cmd = margay();
    cmd.env("DATASTORE_TYPE", "local")
        .env("DATASTORE_PATH", &db)
        .args(["ctl", "get", "ippools"]);
    if Path::new("/etc/calico/calicoctl.cfg").exists() {
        // The environment is only read without that file; --config keeps this test private.
        let config = write_config(
            dir.path(),
            &format!(
                "  datastoreType: local\n  datastorePath: {}\n",
                db.display()
            ),
        );
        cmd.arg("--config").arg(config);
    }
    let r = run(cmd);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.err.starts_with(&format!(
            "error: cannot reach the datastore (local datastore at {}): ",
            db.display()
        )),
        "{r:?}"
    );
}

#[test]
fn the_environment_selects_etcd_without_a_config_file() {
    if Path::new("/etc/calico/calicoctl.cfg").exists() {
        eprintln!("skipped: /etc/calico/calicoctl.cfg exists and would take precedence");
        return;
    }
    let s = Store::etcd();
    let endpoint = s.etcd.as_ref().unwrap().endpoint();
    let f = s.file("pool.yaml", &pool("pool-a", "10.1.0.0/16", "{}"));
    let mut cmd = margay();
    cmd.env("DATASTORE_TYPE", "etcdv3")
        .env("ETCD_ENDPOINTS", &endpoint)
        .args(["ctl", "create", "-f", &f]);
    let r = run(cmd);
    assert_eq!(r.code, 0, "{r:?}");
    // The same store, through the config file.
    let r = run(s.ctl(&["get", "ippools", "-o", "name"]));
    assert_eq!(r.out, "ippool.projectcalico.org/pool-a\n", "{r:?}");
    assert!(s.describe.contains(&endpoint));
}

#[test]
fn help_explains_every_resource_command_with_an_example() {
    for cmd in ["create", "apply", "replace", "delete", "get", "label"] {
        let r = run({
            let mut c = margay();
            c.args(["ctl", cmd, "--help"]);
            c
        });
        assert_eq!(r.code, 0, "{cmd}: {r:?}");
        assert!(r.out.contains("Example"), "{cmd}: {r:?}");
        assert!(r.out.contains(&format!("margay ctl {cmd}")), "{cmd}: {r:?}");
    }
}

#[test]
fn calicoctl_spellings_and_an_unknown_kind() {
    let s = Store::local();
    for alias in [
        "gnp",
        "GlobalNetworkPolicies",
        "ipps",
        "wep",
        "bgppeers",
        "hep",
    ] {
        let r = run(s.ctl(&["get", alias]));
        assert_eq!(r.code, 0, "{alias}: {r:?}");
    }
    let r = run(s.ctl(&["get", "ippol"]));
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.err.contains("did you mean 'ippool'?"), "{r:?}");
}

#[test]
fn reading_a_local_store_that_does_not_exist_lists_nothing_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("typo").join("ds.db");
    let mut cmd = margay();
    cmd.args(["ctl", "get", "ippools"])
        .env("DATASTORE_TYPE", "local")
        .env("DATASTORE_PATH", &db);
    let r = run(cmd);
    // As a fresh etcd: an empty table (calicoctl's header), and a note naming the path so a
    // typo in DATASTORE_PATH is still seen.
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.out.starts_with("NAME"), "{r:?}");
    assert!(r.err.contains("nothing has been stored at"), "{r:?}");
    assert!(r.err.contains(&db.display().to_string()), "{r:?}");
    // Writing-side commands that need an existing store still refuse.
    let mut cmd = margay();
    cmd.args(["ctl", "delete", "ippool", "p"])
        .env("DATASTORE_TYPE", "local")
        .env("DATASTORE_PATH", &db);
    let r = run(cmd);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("no datastore at"), "{r:?}");
    assert!(
        !db.exists() && !db.parent().unwrap().exists(),
        "the store was created"
    );
}
