//! In-process tests of the resource commands against the in-memory datastore: the same code
//! paths as the binary, with `MemBackend` in place of etcd or the local store.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use std::path::{Path, PathBuf};

use clap::Parser;
use margay_api::{Kind, Resource, ResourceKey};
use margay_datastore::{Client, KvBackend, MemBackend};

use crate::datastore::{Access, ConnectFailure, Connection, Connector};
use crate::table::go_float;
use crate::{CtlArgs, EXIT_INVALID, EXIT_OK, EXIT_USAGE, Ui, run_with};

/// Hands out one shared in-memory store.
struct MemConnector {
    client: Client<MemBackend>,
}

impl Connector for MemConnector {
    type Backend = MemBackend;

    async fn connect(
        &self,
        _: Option<&Path>,
        _: Access,
    ) -> Result<Connection<MemBackend>, ConnectFailure> {
        Ok(Connection {
            client: self.client.clone(),
            describe: "in-memory datastore".to_string(),
            kubernetes: false,
            note: None,
        })
    }
}

/// A datastore that cannot be reached.
struct Unreachable;

impl Connector for Unreachable {
    type Backend = MemBackend;

    async fn connect(
        &self,
        _: Option<&Path>,
        _: Access,
    ) -> Result<Connection<MemBackend>, ConnectFailure> {
        Err(ConnectFailure {
            message: "cannot reach the datastore (etcd at http://127.0.0.1:1): connection refused"
                .to_string(),
            code: EXIT_INVALID,
        })
    }
}

#[derive(Parser)]
#[command(name = "ctl")]
struct TestCli {
    #[command(flatten)]
    ctl: CtlArgs,
}

struct Outcome {
    code: u8,
    out: String,
    err: String,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.out, self.err
        )
    }
}

struct Ctl {
    conn: MemConnector,
    dir: tempfile::TempDir,
}

impl Ctl {
    fn new() -> Ctl {
        Ctl {
            conn: MemConnector {
                client: Client::new(MemBackend::default()),
            },
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn run(&self, args: &[&str]) -> Outcome {
        self.run_stdin(args, "")
    }

    fn run_stdin(&self, args: &[&str], stdin: &str) -> Outcome {
        run_args(args, stdin, &self.conn)
    }

    fn file(&self, name: &str, text: &str) -> String {
        let path: PathBuf = self.dir.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    fn stored(&self, kind: Kind, namespace: &str, name: &str) -> Option<Resource> {
        let key = ResourceKey {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        block_on(self.conn.client.get(&key)).ok()
    }

    fn count(&self, kind: Kind) -> usize {
        block_on(self.conn.client.list(kind, None, ""))
            .unwrap()
            .items
            .len()
    }
}

fn run_args<C: Connector>(args: &[&str], stdin: &str, connector: &C) -> Outcome {
    let argv = std::iter::once("ctl").chain(args.iter().copied());
    let cli = TestCli::try_parse_from(argv).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_with(
        cli.ctl,
        &mut stdin.as_bytes(),
        &mut out,
        &mut err,
        connector,
        Ui::default(),
    );
    Outcome {
        code,
        out: String::from_utf8(out).unwrap(),
        err: String::from_utf8(err).unwrap(),
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn pool(name: &str, cidr: &str) -> String {
    format!(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: {name}\nspec:\n  cidr: {cidr}\n"
    )
}

fn pool_labelled(name: &str, cidr: &str, labels: &str) -> String {
    format!(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: {name}\n  labels: {labels}\nspec:\n  cidr: {cidr}\n"
    )
}

fn policy(name: &str, namespace: Option<&str>, selector: &str) -> String {
    let ns = namespace
        .map(|n| format!("  namespace: {n}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata:\n  name: {name}\n{ns}spec:\n  selector: {selector}\n  types: [Ingress]\n  ingress:\n  - action: Allow\n"
    )
}

fn three_pools() -> String {
    [
        pool("pool-a", "10.1.0.0/16"),
        pool("pool-b", "10.2.0.0/16"),
        pool("pool-c", "10.3.0.0/16"),
    ]
    .join("---\n")
}

// ---------------------------------------------------------------- create

#[test]
fn create_stores_every_resource_and_reports_like_calicoctl() {
    let ctl = Ctl::new();
    let f = ctl.file("pools.yaml", &three_pools());
    let o = ctl.run(&["create", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(o.out, "Successfully created 3 'IPPool' resource(s)\n");
    assert_eq!(o.err, "");
    let stored = ctl.stored(Kind::IPPool, "", "pool-b").unwrap();
    assert!(!stored.metadata().uid.is_empty());
    assert!(!stored.metadata().resource_version.is_empty());
}

#[test]
fn create_fails_for_existing_resources_unless_skip_exists() {
    let ctl = Ctl::new();
    let f = ctl.file("pools.yaml", &three_pools());
    assert_eq!(ctl.run(&["create", "-f", &f]).code, EXIT_OK);
    let o = ctl.run(&["create", "-f", &f]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert_eq!(o.out, "");
    assert!(
        o.err.contains(
            "Failed to create 'IPPool' resource: resource already exists: IPPool(pool-a)\n"
        ),
        "{o:?}"
    );
    assert!(
        o.err.contains("Failed to create any 'IPPool' resources"),
        "{o:?}"
    );

    let o = ctl.run(&["create", "-f", &f, "--skip-exists"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(o.out, "Successfully created 3 'IPPool' resource(s)\n");
    assert!(
        o.err.contains("3 already existed and were skipped"),
        "{o:?}"
    );
}

#[test]
fn invalid_documents_are_reported_and_skipped_while_valid_ones_are_written() {
    let ctl = Ctl::new();
    let text = [
        pool("good-1", "10.1.0.0/16"),
        pool("bad", "10.2.0.0/33"),
        pool("good-2", "10.3.0.0/16"),
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: typo\nspec:\n  cidrr: 10.4.0.0/16\n".to_string(),
    ]
    .join("---\n");
    let f = ctl.file("mixed.yaml", &text);
    let o = ctl.run(&["create", "-f", &f]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(
        o.err
            .contains(&format!("{f} [document 2] IPPool/bad: spec.cidr: ")),
        "{o:?}"
    );
    assert!(
        o.err.contains(&format!(
            "{f} [document 4] IPPool/typo: spec.cidrr: unknown field \"cidrr\" (did you mean \"cidr\"?)"
        )),
        "{o:?}"
    );
    assert_eq!(
        o.out,
        "Partial success: created 2 out of 4 'IPPool' resources\n"
    );
    assert!(o.err.contains("2 of 4 documents are invalid"), "{o:?}");
    assert!(ctl.stored(Kind::IPPool, "", "good-1").is_some());
    assert!(ctl.stored(Kind::IPPool, "", "good-2").is_some());
    assert!(ctl.stored(Kind::IPPool, "", "bad").is_none());
    assert!(ctl.stored(Kind::IPPool, "", "typo").is_none());
}

#[test]
fn a_file_with_a_syntax_error_is_skipped_and_other_files_are_processed() {
    let ctl = Ctl::new();
    let bad = ctl.file("bad.yaml", "apiVersion: [unclosed\n");
    let good = ctl.file("good.yaml", &pool("pool-a", "10.1.0.0/16"));
    let o = ctl.run(&["create", "-f", &bad, "-f", &good]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(o.err.contains(&format!("{bad}: invalid YAML")), "{o:?}");
    assert!(ctl.stored(Kind::IPPool, "", "pool-a").is_some());
}

#[test]
fn only_invalid_documents_never_connect() {
    let ctl = Ctl::new();
    let f = ctl.file("bad.yaml", &pool("bad", "300.0.0.0/8"));
    let o = run_args(&["apply", "-f", &f], "", &Unreachable);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(!o.err.contains("cannot reach"), "{o:?}");
    assert!(o.err.contains("IPPool/bad: spec.cidr"), "{o:?}");
}

#[test]
fn an_unreadable_file_writes_nothing_and_exits_2() {
    let ctl = Ctl::new();
    let good = ctl.file("good.yaml", &pool("pool-a", "10.1.0.0/16"));
    let missing = ctl.dir.path().join("missing.yaml").display().to_string();
    let o = ctl.run(&["create", "-f", &good, "-f", &missing]);
    assert_eq!(o.code, EXIT_USAGE, "{o:?}");
    assert!(o.err.contains("cannot read"), "{o:?}");
    assert_eq!(ctl.count(Kind::IPPool), 0);
}

#[test]
fn empty_files_fail_unless_skip_empty() {
    let ctl = Ctl::new();
    let f = ctl.file("empty.yaml", "# nothing here\n");
    let o = ctl.run(&["create", "-f", &f]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(o.err.contains("no resources specified in file"), "{o:?}");
    let o = ctl.run(&["create", "-f", &f, "--skip-empty"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(o.out, "No resources specified\n");
}

#[test]
fn list_kinds_json_arrays_and_stdin_are_read() {
    let ctl = Ctl::new();
    let list = ctl.file(
        "list.yaml",
        "apiVersion: projectcalico.org/v3\nkind: IPPoolList\nitems:\n- metadata: {name: l1}\n  spec: {cidr: 10.1.0.0/16}\n- metadata: {name: l2}\n  spec: {cidr: 10.2.0.0/16}\n",
    );
    let o = ctl.run(&["create", "-f", &list]);
    assert_eq!(
        o.out, "Successfully created 2 'IPPool' resource(s)\n",
        "{o:?}"
    );
    let json = r#"[{"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{"name":"j1"},"spec":{"cidr":"10.3.0.0/16"}}]"#;
    let o = ctl.run_stdin(&["create", "-f", "-"], json);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert!(ctl.stored(Kind::IPPool, "", "j1").is_some());
}

#[test]
fn directories_are_read_recursively_only_with_r() {
    let ctl = Ctl::new();
    ctl.file("dir/a.yaml", &pool("pool-a", "10.1.0.0/16"));
    ctl.file("dir/notes.txt", "not a resource");
    ctl.file("dir/sub/b.json", r#"{"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{"name":"pool-b"},"spec":{"cidr":"10.2.0.0/16"}}"#);
    let dir = ctl.dir.path().join("dir").display().to_string();
    let o = ctl.run(&["apply", "-f", &dir]);
    assert_eq!(
        o.out, "Successfully applied 1 'IPPool' resource(s)\n",
        "{o:?}"
    );
    assert!(ctl.stored(Kind::IPPool, "", "pool-b").is_none());
    let o = ctl.run(&["apply", "-f", &dir, "-R"]);
    assert_eq!(
        o.out, "Successfully applied 2 'IPPool' resource(s)\n",
        "{o:?}"
    );
    assert!(ctl.stored(Kind::IPPool, "", "pool-b").is_some());
}

#[test]
fn a_symlink_loop_under_r_reads_each_file_once() {
    let ctl = Ctl::new();
    ctl.file("dir/a.yaml", &pool("pool-a", "10.1.0.0/16"));
    ctl.file("dir/sub/b.yaml", &pool("pool-b", "10.2.0.0/16"));
    let dir = ctl.dir.path().join("dir");
    // Links back up the tree, and a second name for the same file.
    std::os::unix::fs::symlink("..", dir.join("sub/up")).unwrap();
    std::os::unix::fs::symlink(".", dir.join("self")).unwrap();
    std::os::unix::fs::symlink("a.yaml", dir.join("again.yaml")).unwrap();
    let o = ctl.run(&["apply", "-f", &dir.display().to_string(), "-R"]);
    // Before: the loop was followed until the path was too long, applying a.yaml 41 times.
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(
        o.out, "Successfully applied 2 'IPPool' resource(s)\n",
        "{o:?}"
    );
    assert_eq!(ctl.count(Kind::IPPool), 2);
}

#[test]
fn validate_counts_a_file_with_a_syntax_error_as_one_invalid_document() {
    let ctl = Ctl::new();
    let bad = ctl.file("bad.yaml", "apiVersion: [unclosed\n");
    let o = ctl.run(&["validate", "-f", &bad]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    // Before: "1 of 0 documents are invalid".
    assert!(o.err.contains("1 of 1 documents are invalid"), "{o:?}");
    let good = ctl.file("good.yaml", &three_pools());
    let o = ctl.run(&["validate", "-f", &bad, "-f", &good]);
    assert!(o.err.contains("1 of 4 documents are invalid"), "{o:?}");
}

#[test]
fn mixed_kinds_are_counted_without_a_kind() {
    let ctl = Ctl::new();
    let f = ctl.file(
        "mixed.yaml",
        &[pool("pool-a", "10.1.0.0/16"), policy("p1", None, "all()")].join("---\n"),
    );
    let o = ctl.run(&["create", "-f", &f]);
    assert_eq!(o.out, "Successfully created 2 resource(s)\n", "{o:?}");
}

#[test]
fn create_drops_store_owned_metadata() {
    let ctl = Ctl::new();
    let f = ctl.file(
        "pool.yaml",
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: p\n  uid: from-another-cluster\n  creationTimestamp: '2020-01-01T00:00:00Z'\n  annotations: {a: b}\nspec:\n  cidr: 10.1.0.0/16\n",
    );
    assert_eq!(ctl.run(&["create", "-f", &f]).code, EXIT_OK);
    let stored = ctl.stored(Kind::IPPool, "", "p").unwrap();
    assert_ne!(stored.metadata().uid, "from-another-cluster");
    assert_ne!(
        stored.metadata().creation_timestamp.as_deref(),
        Some("2020-01-01T00:00:00Z")
    );
    assert_eq!(stored.metadata().annotations["a"], "b");
}

// ---------------------------------------------------------------- apply / replace

#[test]
fn apply_creates_then_reports_unchanged_then_updated() {
    let ctl = Ctl::new();
    let f = ctl.file("pool.yaml", &pool("pool-a", "10.1.0.0/16"));
    let o = ctl.run(&["apply", "-f", &f]);
    assert_eq!(
        o.out, "Successfully applied 1 'IPPool' resource(s)\n",
        "{o:?}"
    );
    assert_eq!(o.err, "");
    let v1 = ctl.stored(Kind::IPPool, "", "pool-a").unwrap();

    let o = ctl.run(&["apply", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(o.out, "Successfully applied 1 'IPPool' resource(s)\n");
    assert_eq!(o.err, "0 created, 0 updated, 1 unchanged\n");
    let v2 = ctl.stored(Kind::IPPool, "", "pool-a").unwrap();
    assert_eq!(
        v1.metadata().resource_version,
        v2.metadata().resource_version
    );

    let f = ctl.file(
        "pool.yaml",
        &pool_labelled("pool-a", "10.1.0.0/16", "{env: prod}"),
    );
    let o = ctl.run(&["apply", "-f", &f]);
    assert_eq!(o.err, "0 created, 1 updated, 0 unchanged\n", "{o:?}");
    let v3 = ctl.stored(Kind::IPPool, "", "pool-a").unwrap();
    assert_eq!(v3.metadata().labels["env"], "prod");
    assert_eq!(v3.metadata().uid, v1.metadata().uid, "identity kept");
}

#[test]
fn apply_reads_json_documents_separated_by_dashes() {
    let ctl = Ctl::new();
    let doc = |name: &str, cidr: &str| {
        format!(
            r#"{{"apiVersion": "projectcalico.org/v3", "kind": "IPPool", "metadata": {{"name": "{name}"}}, "spec": {{"cidr": "{cidr}"}}}}"#
        )
    };
    let f = ctl.file(
        "pools.json",
        &format!(
            "{}\n---\n{}\n",
            doc("a", "10.1.0.0/16"),
            doc("b", "10.2.0.0/16")
        ),
    );
    let o = ctl.run(&["apply", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(
        o.out, "Successfully applied 2 'IPPool' resource(s)\n",
        "{o:?}"
    );
    let o = ctl.run_stdin(
        &["apply", "-f", "-"],
        &format!(
            "---\n{}\n---\n{}\n",
            doc("c", "10.3.0.0/16"),
            doc("d", "10.4.0.0/16")
        ),
    );
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(ctl.count(Kind::IPPool), 4);
}

#[test]
fn apply_with_a_stale_resource_version_is_a_conflict() {
    let ctl = Ctl::new();
    let f = ctl.file("pool.yaml", &pool("pool-a", "10.1.0.0/16"));
    ctl.run(&["apply", "-f", &f]);
    let o = ctl.run(&["get", "ippool", "pool-a", "-o", "yaml"]);
    let exported = ctl.file("exported.yaml", &o.out);
    // Someone else changes it.
    let f2 = ctl.file(
        "pool2.yaml",
        &pool_labelled("pool-a", "10.1.0.0/16", "{x: y}"),
    );
    ctl.run(&["apply", "-f", &f2]);
    for cmd in ["apply", "replace"] {
        let o = ctl.run(&[cmd, "-f", &exported]);
        assert_eq!(o.code, EXIT_INVALID, "{o:?}");
        assert!(
            o.err.contains(&format!(
                "Failed to {cmd} 'IPPool' resource: update conflict: IPPool(pool-a): resource was modified"
            )),
            "{o:?}"
        );
        assert!(o.err.contains("re-read it and retry"), "{o:?}");
    }
    assert_eq!(
        ctl.stored(Kind::IPPool, "", "pool-a")
            .unwrap()
            .metadata()
            .labels["x"],
        "y"
    );
}

#[test]
fn get_yaml_output_applies_back_unchanged() {
    let ctl = Ctl::new();
    let f = ctl.file("pools.yaml", &three_pools());
    ctl.run(&["create", "-f", &f]);
    let listing = ctl.run(&["get", "ippools", "-o", "yaml"]);
    let back = ctl.file("back.yaml", &listing.out);
    let o = ctl.run(&["apply", "-f", &back]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(o.err, "0 created, 0 updated, 3 unchanged\n");
    let o = ctl.run(&["replace", "-f", &back]);
    assert_eq!(
        o.out, "Successfully replaced 3 'IPPool' resource(s)\n",
        "{o:?}"
    );
}

#[test]
fn replace_needs_an_existing_resource_and_keeps_its_identity() {
    let ctl = Ctl::new();
    let f = ctl.file("pool.yaml", &pool("pool-a", "10.1.0.0/16"));
    let o = ctl.run(&["replace", "-f", &f]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(
        o.err.contains(
            "Failed to replace 'IPPool' resource: resource does not exist: IPPool(pool-a)"
        ),
        "{o:?}"
    );
    assert!(ctl.stored(Kind::IPPool, "", "pool-a").is_none());

    ctl.run(&["create", "-f", &f]);
    let before = ctl.stored(Kind::IPPool, "", "pool-a").unwrap();
    let f = ctl.file("pool.yaml", &pool("pool-a", "10.9.0.0/16"));
    let o = ctl.run(&["replace", "-f", &f]);
    assert_eq!(
        o.out, "Successfully replaced 1 'IPPool' resource(s)\n",
        "{o:?}"
    );
    let after = ctl.stored(Kind::IPPool, "", "pool-a").unwrap();
    let Resource::IPPool(p) = &after else {
        panic!("not a pool")
    };
    assert_eq!(p.spec.cidr, "10.9.0.0/16");
    assert_eq!(after.metadata().uid, before.metadata().uid);
    assert_eq!(
        after.metadata().creation_timestamp,
        before.metadata().creation_timestamp
    );
}

#[test]
fn cluster_information_cannot_be_applied() {
    let ctl = Ctl::new();
    let f = ctl.file(
        "ci.yaml",
        "apiVersion: projectcalico.org/v3\nkind: ClusterInformation\nmetadata:\n  name: default\nspec: {}\n",
    );
    let o = ctl.run(&["apply", "-f", &f]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(
        o.err
            .contains("operation apply is not supported on ClusterInformation"),
        "{o:?}"
    );
}

// ---------------------------------------------------------------- namespaces

#[test]
fn namespaced_documents_default_to_default_or_take_dash_n() {
    let ctl = Ctl::new();
    let f = ctl.file("p.yaml", &policy("p1", None, "all()"));
    assert_eq!(ctl.run(&["create", "-f", &f]).code, EXIT_OK);
    assert!(ctl.stored(Kind::NetworkPolicy, "default", "p1").is_some());
    assert_eq!(ctl.run(&["create", "-f", &f, "-n", "prod"]).code, EXIT_OK);
    assert!(ctl.stored(Kind::NetworkPolicy, "prod", "p1").is_some());
    // The document's own namespace is used when -n agrees or is absent.
    let f = ctl.file("q.yaml", &policy("q1", Some("prod"), "all()"));
    assert_eq!(ctl.run(&["create", "-f", &f]).code, EXIT_OK);
    assert!(ctl.stored(Kind::NetworkPolicy, "prod", "q1").is_some());
}

#[test]
fn a_namespace_conflicting_with_dash_n_is_an_error() {
    let ctl = Ctl::new();
    let f = ctl.file("p.yaml", &policy("p1", Some("prod"), "all()"));
    let o = ctl.run(&["apply", "-f", &f, "-n", "dev"]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(
        o.err.contains(
            "Failed to apply 'NetworkPolicy' resource: NetworkPolicy(prod/p1): resource namespace does not match client namespace. prod != dev"
        ),
        "{o:?}"
    );
    assert_eq!(ctl.count(Kind::NetworkPolicy), 0);
}

#[test]
fn cluster_scoped_kinds_take_no_namespace() {
    let ctl = Ctl::new();
    let f = ctl.file("pool.yaml", &pool("pool-a", "10.1.0.0/16"));
    let o = ctl.run(&["apply", "-f", &f, "-n", "prod"]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(o.err.contains("IPPool is not namespaced"), "{o:?}");
    let o = ctl.run(&["get", "ippools", "-n", "prod"]);
    assert_eq!(o.code, EXIT_USAGE, "{o:?}");
}

// ---------------------------------------------------------------- delete

#[test]
fn delete_by_kind_and_names() {
    let ctl = Ctl::new();
    let f = ctl.file("pools.yaml", &three_pools());
    ctl.run(&["create", "-f", &f]);
    let o = ctl.run(&["delete", "ippools", "pool-a", "pool-b"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(o.out, "Successfully deleted 2 'IPPool' resource(s)\n");
    assert_eq!(ctl.count(Kind::IPPool), 1);

    let o = ctl.run(&["delete", "pool", "pool-a"]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(
        o.err.contains(
            "Failed to delete 'IPPool' resource: resource does not exist: IPPool(pool-a)"
        ),
        "{o:?}"
    );
    let o = ctl.run(&["delete", "pool", "pool-a", "pool-c", "--skip-not-exists"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(o.out, "Successfully deleted 2 'IPPool' resource(s)\n");
    assert!(o.err.contains("1 did not exist and were skipped"), "{o:?}");
    assert_eq!(ctl.count(Kind::IPPool), 0);
}

#[test]
fn delete_namespaced_by_name_uses_dash_n() {
    let ctl = Ctl::new();
    let f = ctl.file("p.yaml", &policy("p1", Some("prod"), "all()"));
    ctl.run(&["create", "-f", &f]);
    let o = ctl.run(&["delete", "networkpolicy", "p1"]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(o.err.contains("NetworkPolicy(default/p1)"), "{o:?}");
    let o = ctl.run(&["delete", "np", "p1", "-n", "prod"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(ctl.count(Kind::NetworkPolicy), 0);
}

#[test]
fn delete_from_a_file_checks_the_resource_version_it_carries() {
    let ctl = Ctl::new();
    let f = ctl.file("pools.yaml", &three_pools());
    ctl.run(&["create", "-f", &f]);
    let exported = ctl.file(
        "a.yaml",
        &ctl.run(&["get", "ippool", "pool-a", "-o", "yaml"]).out,
    );
    ctl.run(&["label", "ippool", "pool-a", "x=y"]);
    let o = ctl.run(&["delete", "-f", &exported]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(o.err.contains("update conflict: IPPool(pool-a)"), "{o:?}");
    let o = ctl.run(&["delete", "-f", &f]);
    assert_eq!(
        o.out, "Successfully deleted 3 'IPPool' resource(s)\n",
        "{o:?}"
    );
    assert_eq!(ctl.count(Kind::IPPool), 0);
}

#[test]
fn delete_needs_names_or_files() {
    let ctl = Ctl::new();
    let o = ctl.run(&["delete", "ippool"]);
    assert_eq!(o.code, EXIT_USAGE, "{o:?}");
    assert!(o.err.contains("no resources specified"), "{o:?}");
    assert!(TestCli::try_parse_from(["ctl", "delete"]).is_err());
    assert!(TestCli::try_parse_from(["ctl", "delete", "ippool", "a", "-f", "x.yaml"]).is_err());
}

// ---------------------------------------------------------------- get

#[test]
fn get_prints_calicoctl_tables() {
    let ctl = Ctl::new();
    let f = ctl.file(
        "pools.yaml",
        &[
            pool("default-ipv4-ippool", "192.168.0.0/16"),
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: vx\nspec:\n  cidr: 10.2.0.0/16\n  vxlanMode: CrossSubnet\n  natOutgoing: true\n  nodeSelector: zone == 'a'\n".to_string(),
        ]
        .join("---\n"),
    );
    ctl.run(&["create", "-f", &f]);
    let o = ctl.run(&["get", "ippools"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(
        o.out,
        "NAME                  CIDR             SELECTOR      \n\
         default-ipv4-ippool   192.168.0.0/16                 \n\
         vx                    10.2.0.0/16      zone == 'a'   \n\
         \n"
    );
    let o = ctl.run(&["get", "ippools", "-o", "wide"]);
    let lines: Vec<&str> = o.out.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "CIDR",
            "NAT",
            "IPIPMODE",
            "VXLANMODE",
            "DISABLED",
            "DISABLEBGPEXPORT",
            "SELECTOR",
            "ASSIGNMENTMODE"
        ]
    );
    let vx: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        vx,
        [
            "vx",
            "10.2.0.0/16",
            "true",
            "Never",
            "CrossSubnet",
            "false",
            "false",
            "zone",
            "==",
            "'a'",
            "Automatic"
        ]
    );
    let o = ctl.run(&["get", "ippools", "-o", "custom-columns=name,cidr"]);
    assert_eq!(
        o.out.lines().next().unwrap().trim_end(),
        "NAME                  CIDR"
    );
    let o = ctl.run(&["get", "ippools", "-o", "custom-columns=NAME,NOPE"]);
    assert_eq!(o.code, EXIT_USAGE, "{o:?}");
    assert!(o.err.contains("unknown heading NOPE"), "{o:?}");
}

#[test]
fn get_empty_listing_prints_the_header() {
    let ctl = Ctl::new();
    let o = ctl.run(&["get", "bgppeers"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(o.out, "NAME   PEERIP   NODE   ASN   \n\n");
}

#[test]
fn get_namespaced_kinds_per_namespace_or_all() {
    let ctl = Ctl::new();
    let f = ctl.file(
        "p.yaml",
        &[
            policy("a", Some("default"), "all()"),
            policy("b", Some("prod"), "all()"),
            "apiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata:\n  name: c\n  namespace: prod\nspec:\n  order: 1000000\n  selector: app == 'x'\n".to_string(),
        ]
        .join("---\n"),
    );
    assert_eq!(ctl.run(&["create", "-f", &f]).code, EXIT_OK);
    let o = ctl.run(&["get", "networkpolicies"]);
    assert_eq!(o.out, "NAME   TIER      \na      default   \n\n", "{o:?}");
    let o = ctl.run(&["get", "networkpolicy", "-n", "prod", "-o", "wide"]);
    let rows: Vec<Vec<&str>> = o
        .out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["NAMESPACE", "NAME", "TIER", "ORDER", "SELECTOR"]);
    assert_eq!(
        rows[2],
        ["prod", "c", "default", "1e+06", "app", "==", "'x'"]
    );
    let o = ctl.run(&["get", "np", "-A", "-o", "name"]);
    assert_eq!(
        o.out,
        "networkpolicy.projectcalico.org/a\nnetworkpolicy.projectcalico.org/b\nnetworkpolicy.projectcalico.org/c\n"
    );
    let o = ctl.run(&["get", "np", "-a", "-o", "name"]);
    assert_eq!(o.out.lines().count(), 3, "{o:?}");
    let o = ctl.run(&["get", "np", "b", "-A"]);
    assert_eq!(o.code, EXIT_USAGE, "{o:?}");
    assert!(TestCli::try_parse_from(["ctl", "get", "np", "-A", "-n", "x"]).is_err());
    // -A means nothing for cluster-scoped kinds.
    assert_eq!(ctl.run(&["get", "ippools", "-A"]).code, EXIT_OK);
}

#[test]
fn get_yaml_and_json_print_one_resource_as_itself_and_more_as_a_list() {
    let ctl = Ctl::new();
    let f = ctl.file("pools.yaml", &three_pools());
    ctl.run(&["create", "-f", &f]);

    let o = ctl.run(&["get", "ippool", "pool-a", "-o", "yaml"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    let one: serde_json::Value = serde_norway::from_str(&o.out).unwrap();
    assert_eq!(one["kind"], "IPPool");
    assert_eq!(one["metadata"]["name"], "pool-a");
    assert!(one["metadata"]["resourceVersion"].is_string());
    assert!(
        o.out.starts_with("apiVersion: projectcalico.org/v3\n"),
        "{o:?}"
    );

    let o = ctl.run(&["get", "ippools", "-o", "yaml"]);
    let list: serde_json::Value = serde_norway::from_str(&o.out).unwrap();
    assert_eq!(list["kind"], "IPPoolList");
    assert_eq!(list["apiVersion"], "projectcalico.org/v3");
    assert_eq!(list["items"].as_array().unwrap().len(), 3);
    assert!(list["metadata"]["resourceVersion"].is_string());

    let o = ctl.run(&["get", "ippool", "pool-a", "pool-c", "-o", "json"]);
    let list: serde_json::Value = serde_json::from_str(&o.out).unwrap();
    assert_eq!(list["kind"], "IPPoolList");
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["pool-a", "pool-c"]);

    let o = ctl.run(&["get", "ippool", "pool-b", "-o", "json"]);
    let one: serde_json::Value = serde_json::from_str(&o.out).unwrap();
    assert_eq!(one["kind"], "IPPool");

    // A listing is a list even with no items.
    let o = ctl.run(&["get", "tiers", "-o", "yaml"]);
    let list: serde_json::Value = serde_norway::from_str(&o.out).unwrap();
    assert_eq!(list["kind"], "TierList");
    assert_eq!(list["items"], serde_json::json!([]));
}

#[test]
fn get_export_drops_cluster_specific_metadata() {
    let ctl = Ctl::new();
    let f = ctl.file("p.yaml", &policy("p1", Some("prod"), "all()"));
    ctl.run(&["create", "-f", &f]);
    let o = ctl.run(&["get", "np", "p1", "-n", "prod", "-o", "yaml", "--export"]);
    let v: serde_json::Value = serde_norway::from_str(&o.out).unwrap();
    assert_eq!(v["metadata"], serde_json::json!({"name": "p1"}));
}

#[test]
fn get_filters_by_label_selector() {
    let ctl = Ctl::new();
    let f = ctl.file(
        "pools.yaml",
        &[
            pool_labelled("a", "10.1.0.0/16", "{env: prod, tier: web}"),
            pool_labelled("b", "10.2.0.0/16", "{env: dev}"),
            pool("c", "10.3.0.0/16"),
        ]
        .join("---\n"),
    );
    ctl.run(&["create", "-f", &f]);
    let names = |sel: &str| {
        ctl.run(&["get", "ippools", "-l", sel, "-o", "name"])
            .out
            .lines()
            .map(|l| l.rsplit('/').next().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(names("env == 'prod'"), ["a"]);
    assert_eq!(names("has(env)"), ["a", "b"]);
    assert_eq!(names("!has(env)"), ["c"]);
    assert_eq!(names("env in {'dev', 'prod'} && !has(tier)"), ["b"]);
    let o = ctl.run(&["get", "ippools", "-l", "env =="]);
    assert_eq!(o.code, EXIT_USAGE, "{o:?}");
    assert!(o.err.contains("invalid selector"), "{o:?}");
}

#[test]
fn get_missing_names_are_errors_after_the_found_ones() {
    let ctl = Ctl::new();
    let f = ctl.file("pools.yaml", &three_pools());
    ctl.run(&["create", "-f", &f]);
    let o = ctl.run(&["get", "ippool", "nope"]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert_eq!(o.out, "");
    assert_eq!(o.err, "resource does not exist: IPPool(nope)\n");
    let o = ctl.run(&["get", "ippool", "pool-a", "nope", "-o", "name"]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert_eq!(o.out, "ippool.projectcalico.org/pool-a\n");
}

#[test]
fn unknown_kinds_and_formats_are_usage_errors() {
    let ctl = Ctl::new();
    let o = ctl.run(&["get", "ipool"]);
    assert_eq!(o.code, EXIT_USAGE, "{o:?}");
    assert!(
        o.err
            .contains("resource type 'ipool' is not supported (did you mean 'ippool'?)"),
        "{o:?}"
    );
    assert!(o.err.contains("globalnetworkpolicy"), "{o:?}");
    let o = ctl.run(&["delete", "gnps-typo", "x"]);
    assert_eq!(o.code, EXIT_USAGE, "{o:?}");
    let o = ctl.run(&["get", "ippools", "-o", "xml"]);
    assert_eq!(o.code, EXIT_USAGE, "{o:?}");
    assert!(o.err.contains("unrecognized output format 'xml'"), "{o:?}");
    // Every calicoctl spelling works.
    for alias in [
        "gnp",
        "GlobalNetworkPolicies",
        "ipps",
        "wep",
        "bgpconfig",
        "hep",
        "pols",
    ] {
        assert_eq!(ctl.run(&["get", alias]).code, EXIT_OK, "{alias}");
    }
}

#[test]
fn get_tables_for_other_kinds() {
    let ctl = Ctl::new();
    let f = ctl.file(
        "misc.yaml",
        "apiVersion: projectcalico.org/v3\nkind: BGPConfiguration\nmetadata:\n  name: default\nspec:\n  asNumber: 65001\n  nodeToNodeMeshEnabled: false\n  logSeverityScreen: Info\n---\n\
         apiVersion: projectcalico.org/v3\nkind: Node\nmetadata:\n  name: n1\nspec:\n  bgp:\n    ipv4Address: 10.0.0.1/24\n---\n\
         apiVersion: projectcalico.org/v3\nkind: Node\nmetadata:\n  name: n2\nspec:\n  bgp:\n    asNumber: 64700\n    ipv6Address: fd00::2/64\n---\n\
         apiVersion: projectcalico.org/v3\nkind: BGPPeer\nmetadata:\n  name: rr\nspec:\n  peerIP: 10.0.0.9\n  asNumber: 65002\n---\n\
         apiVersion: projectcalico.org/v3\nkind: GlobalNetworkSet\nmetadata:\n  name: s\nspec:\n  nets: [10.1.0.0/16, 10.2.0.0/16]\n",
    );
    let o = ctl.run(&["create", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    let rows = |args: &[&str]| -> Vec<Vec<String>> {
        ctl.run(args)
            .out
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| l.split_whitespace().map(str::to_string).collect())
            .collect()
    };
    assert_eq!(
        rows(&["get", "bgpconfig"]),
        [
            vec!["NAME", "LOGSEVERITY", "MESHENABLED", "ASNUMBER"],
            vec!["default", "Info", "false", "65001"]
        ]
    );
    assert_eq!(
        rows(&["get", "nodes", "-o", "wide"]),
        [
            vec!["NAME", "ASN", "IPV4", "IPV6"],
            vec!["n1", "(65001)", "10.0.0.1/24"],
            vec!["n2", "64700", "fd00::2/64"]
        ]
    );
    assert_eq!(
        rows(&["get", "bgppeers"]),
        [
            vec!["NAME", "PEERIP", "NODE", "ASN"],
            vec!["rr", "10.0.0.9", "(global)", "65002"]
        ]
    );
    assert_eq!(
        rows(&["get", "globalnetworksets", "-o", "wide"]),
        [vec!["NAME", "NETS"], vec!["s", "10.1.0.0/16,10.2.0.0/16"]]
    );
}

// ---------------------------------------------------------------- label

#[test]
fn label_sets_updates_and_removes_like_calicoctl() {
    let ctl = Ctl::new();
    let f = ctl.file("pool.yaml", &pool("pool-a", "10.1.0.0/16"));
    ctl.run(&["create", "-f", &f]);
    let rv = |ctl: &Ctl| {
        ctl.stored(Kind::IPPool, "", "pool-a")
            .unwrap()
            .metadata()
            .resource_version
            .clone()
    };
    let v0 = rv(&ctl);

    let o = ctl.run(&["label", "ippools", "pool-a", "env=prod"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(o.out, "Successfully set label env on ippools pool-a\n");
    assert_ne!(rv(&ctl), v0);

    let o = ctl.run(&["label", "ippools", "pool-a", "env=dev"]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert_eq!(
        o.err,
        "failed to update label of ippools pool-a, key env is already present. please use '--overwrite' to set a new value\n"
    );
    let o = ctl.run(&["label", "ippools", "pool-a", "env=dev", "--overwrite"]);
    assert_eq!(
        o.out, "Successfully updated label env on ippools pool-a\n",
        "{o:?}"
    );
    // The same value again is not a change of value: no --overwrite needed.
    let o = ctl.run(&["label", "ippools", "pool-a", "env=dev"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    let stored = ctl.stored(Kind::IPPool, "", "pool-a").unwrap();
    assert_eq!(stored.metadata().labels["env"], "dev");

    let o = ctl.run(&["label", "ippools", "pool-a", "env", "--remove"]);
    assert_eq!(
        o.out, "Successfully removed label env from ippools pool-a\n",
        "{o:?}"
    );
    assert!(
        ctl.stored(Kind::IPPool, "", "pool-a")
            .unwrap()
            .metadata()
            .labels
            .is_empty()
    );
    let o = ctl.run(&["label", "ippools", "pool-a", "env", "--remove"]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert_eq!(
        o.err,
        "cannot remove label of ippools pool-a, key env does not exist\n"
    );
}

#[test]
fn label_errors() {
    let ctl = Ctl::new();
    let o = ctl.run(&["label", "ippool", "nope", "a=b"]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(
        o.err.contains("resource does not exist: IPPool(nope)"),
        "{o:?}"
    );
    let o = ctl.run(&["label", "ippool", "nope", "novalue"]);
    assert_eq!(o.code, EXIT_USAGE, "{o:?}");
    assert!(o.err.contains("invalid label novalue"), "{o:?}");
    // An invalid label is refused by validation and nothing changes.
    let f = ctl.file("pool.yaml", &pool("pool-a", "10.1.0.0/16"));
    ctl.run(&["create", "-f", &f]);
    let o = ctl.run(&["label", "ippool", "pool-a", "bad key=x"]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(o.err.contains("label not changed"), "{o:?}");
    assert!(
        ctl.stored(Kind::IPPool, "", "pool-a")
            .unwrap()
            .metadata()
            .labels
            .is_empty()
    );
}

#[test]
fn label_namespaced_resources() {
    let ctl = Ctl::new();
    let f = ctl.file("p.yaml", &policy("p1", Some("prod"), "all()"));
    ctl.run(&["create", "-f", &f]);
    let o = ctl.run(&["label", "networkpolicy", "p1", "team=a", "-n", "prod"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    let p = ctl.stored(Kind::NetworkPolicy, "prod", "p1").unwrap();
    assert_eq!(p.metadata().labels["team"], "a");
}

// ---------------------------------------------------------------- datastore

#[test]
fn an_unreachable_datastore_is_reported_with_exit_1() {
    let ctl = Ctl::new();
    let f = ctl.file("pool.yaml", &pool("pool-a", "10.1.0.0/16"));
    for args in [
        vec!["get", "ippools"],
        vec!["apply", "-f", f.as_str()],
        vec!["delete", "ippool", "x"],
        vec!["label", "ippool", "x", "a=b"],
    ] {
        let o = run_args(&args, "", &Unreachable);
        assert_eq!(o.code, EXIT_INVALID, "{args:?} {o:?}");
        assert!(
            o.err
                .starts_with("error: cannot reach the datastore (etcd at http://127.0.0.1:1)"),
            "{o:?}"
        );
        assert_eq!(o.out, "");
    }
}

#[test]
fn a_missing_config_file_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("calicoctl.cfg").display().to_string();
    let o = run_args(
        &["get", "ippools", "--config", &missing],
        "",
        &crate::datastore::EnvConnector,
    );
    assert_eq!(o.code, EXIT_USAGE, "{o:?}");
    assert!(o.err.contains("does not exist"), "{o:?}");
}

#[test]
fn an_oversized_config_file_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("calicoctl.cfg");
    // Before: read (and parsed) whatever its size.
    std::fs::File::create(&path)
        .unwrap()
        .set_len(2 << 20)
        .unwrap();
    let o = run_args(
        &["get", "ippools", "--config", &path.display().to_string()],
        "",
        &crate::datastore::EnvConnector,
    );
    assert_eq!(o.code, EXIT_USAGE, "{o:?}");
    assert!(o.err.contains("larger than 1 MiB"), "{o:?}");
}

#[test]
fn a_config_file_selects_the_datastore() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("calicoctl.cfg");
    std::fs::write(
        &cfg,
        "apiVersion: projectcalico.org/v3\nkind: CalicoAPIConfig\nmetadata: {}\nspec:\n  datastoreType: etcdv3\n  etcdEndpoints: http://127.0.0.1:1\n",
    )
    .unwrap();
    let cfg = cfg.display().to_string();
    let o = run_args(
        &["-c", &cfg, "get", "ippools"],
        "",
        &crate::datastore::EnvConnector,
    );
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(
        o.err
            .contains("cannot reach the datastore (etcd at http://127.0.0.1:1)"),
        "{o:?}"
    );
}

// ---------------------------------------------------------------- helpers

#[test]
fn floats_print_as_go_does() {
    assert_eq!(go_float(100.0), "100");
    assert_eq!(go_float(1.5), "1.5");
    assert_eq!(go_float(1_000_000.0), "1e+06");
    assert_eq!(go_float(123_456.0), "123456");
    assert_eq!(go_float(1_234_567.0), "1.234567e+06");
    assert_eq!(go_float(0.0001), "0.0001");
    assert_eq!(go_float(0.00001), "1e-05");
    assert_eq!(go_float(-2.5), "-2.5");
    assert_eq!(go_float(0.0), "0");
}

#[test]
fn progress_is_silent_unless_enabled_and_long() {
    let p = crate::report::Progress::new(1000, false, "applying");
    let mut buf = Vec::new();
    p.line(&mut buf, "x").unwrap();
    p.inc();
    p.finish();
    assert_eq!(buf, b"x\n");
    let p = crate::report::Progress::new(10, true, "applying");
    let mut buf = Vec::new();
    p.line(&mut buf, "y").unwrap();
    assert_eq!(buf, b"y\n");
}

#[test]
fn a_long_batch_is_processed_completely() {
    let ctl = Ctl::new();
    let docs: Vec<String> = (0..120)
        .map(|i| pool(&format!("p{i}"), &format!("10.{i}.0.0/16")))
        .collect();
    let f = ctl.file("many.yaml", &docs.join("---\n"));
    let o = ctl.run(&["apply", "-f", &f]);
    assert_eq!(
        o.out, "Successfully applied 120 'IPPool' resource(s)\n",
        "{o:?}"
    );
    assert_eq!(ctl.count(Kind::IPPool), 120);
}

#[test]
fn workload_endpoints_without_a_name_get_the_derived_one() {
    let ctl = Ctl::new();
    let f = ctl.file(
        "wep.yaml",
        "apiVersion: projectcalico.org/v3\nkind: WorkloadEndpoint\nmetadata:\n  namespace: shop\nspec:\n  node: worker-2\n  orchestrator: k8s\n  pod: cart-api-7d9f8c\n  endpoint: eth0\n  interfaceName: cali5a1f03c9e2d\n  ipNetworks: [10.48.3.17/32]\n  ipNATs:\n  - internalIP: 10.48.3.17\n    externalIP: 172.16.0.5\n",
    );
    let o = ctl.run(&["apply", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    let o = ctl.run(&["apply", "-f", &f]);
    assert_eq!(o.err, "0 created, 0 updated, 1 unchanged\n", "{o:?}");
    let o = ctl.run(&["get", "weps", "-n", "shop", "-o", "wide"]);
    let rows: Vec<Vec<&str>> = o
        .out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        [
            "NAMESPACE",
            "NAME",
            "WORKLOAD",
            "NODE",
            "NETWORKS",
            "INTERFACE",
            "PROFILES",
            "NATS"
        ]
    );
    assert_eq!(
        rows[1],
        [
            "shop",
            "worker--2-k8s-cart--api--7d9f8c-eth0",
            "cart-api-7d9f8c",
            "worker-2",
            "10.48.3.17/32",
            "cali5a1f03c9e2d",
            "{10.48.3.17",
            "172.16.0.5}"
        ]
    );
    let o = ctl.run(&["delete", "-f", &f]);
    assert_eq!(
        o.out, "Successfully deleted 1 'WorkloadEndpoint' resource(s)\n",
        "{o:?}"
    );
}

// ---------------------------------------------------------------- ipam

fn ipam_of(ctl: &Ctl) -> margay_ipam::Ipam<MemBackend> {
    margay_ipam::Ipam::new(ctl.conn.client.backend().clone())
}

fn assign(ctl: &Ctl, handle: &str, node: &str) -> std::net::IpAddr {
    let args = margay_ipam::AssignArgs::new(handle, node);
    block_on(ipam_of(ctl).auto_assign(&args)).unwrap().v4[0].ip
}

fn wep_yaml(name_pod: &str, ip: &str) -> String {
    format!(
        "apiVersion: projectcalico.org/v3\nkind: WorkloadEndpoint\nmetadata:\n  namespace: default\nspec:\n  orchestrator: k8s\n  node: node-a\n  pod: {name_pod}\n  endpoint: eth0\n  interfaceName: cali0\n  ipNetworks: [{ip}/32]\n"
    )
}

#[test]
fn ipam_show_prints_pool_and_block_utilization() {
    let ctl = Ctl::new();
    let pools = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: p1\nspec:\n  cidr: 10.5.0.0/24\n  blockSize: 28\n";
    let f = ctl.file("p.yaml", pools);
    assert_eq!(ctl.run(&["create", "-f", &f]).code, EXIT_OK);
    for i in 0..3 {
        assign(&ctl, &format!("h{i}"), "node-a");
    }
    let o = ctl.run(&["ipam", "show"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    let expected = "\
+----------+-------------+-----------+------------+--------------+-----------+
| GROUPING | CIDR        | IPS TOTAL | IPS IN USE | IPS RESERVED | IPS FREE  |
+----------+-------------+-----------+------------+--------------+-----------+
| IP Pool  | 10.5.0.0/24 |       256 |     3 (1%) |       0 (0%) | 253 (99%) |
+----------+-------------+-----------+------------+--------------+-----------+
";
    assert_eq!(o.out, expected);
    let o = ctl.run(&["ipam", "show", "--show-blocks"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    let block_line = o.out.lines().find(|l| l.starts_with("| Block")).unwrap();
    assert!(block_line.contains("/28"), "{}", o.out);
    assert!(block_line.contains("3 (19%)"), "{}", o.out);
    assert!(block_line.contains("13 (81%)"), "{}", o.out);
    assert!(block_line.contains("host:node-a"), "{}", o.out);
    let ip = assign(&ctl, "h9", "node-a");
    let o = ctl.run(&["ipam", "show", "--ip", &ip.to_string()]);
    assert!(o.out.contains(&format!("IP {ip} is in use")), "{o:?}");
    assert!(o.out.contains("Handle ID: h9"), "{o:?}");
    let o = ctl.run(&["ipam", "show", "--ip", "10.5.0.250"]);
    assert_eq!(o.out, "10.5.0.250 is not assigned\n");
    let o = ctl.run(&["ipam", "show", "--ip", "nope"]);
    assert_eq!(o.code, EXIT_USAGE, "{o:?}");
}

#[test]
fn go_g5_formats_like_calicoctl() {
    use crate::ipam_cmd::go_g5;
    assert_eq!(go_g5(256), "256");
    assert_eq!(go_g5(65536), "65536");
    assert_eq!(go_g5(1_048_576), "1.0486e+06");
    assert_eq!(go_g5(1_000_000), "1e+06");
    assert_eq!(go_g5(1u128 << 64), "1.8447e+19");
}

#[test]
fn ipam_check_reports_leaks_missing_allocations_duplicates_and_stale_handles() {
    let ctl = Ctl::new();
    let f = ctl.file("p.yaml", &pool("p1", "10.6.0.0/24"));
    assert_eq!(ctl.run(&["create", "-f", &f]).code, EXIT_OK);
    // Clean: nothing allocated, nothing used.
    let o = ctl.run(&["ipam", "check"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert!(o.out.contains("Check complete; found 0 problems"), "{o:?}");

    let used = assign(&ctl, "k8s-pod-network.c1", "node-a");
    let leaked = assign(&ctl, "k8s-pod-network.c2", "node-a");
    let weps = [
        wep_yaml("web-0", &used.to_string()),
        wep_yaml("web-1", "10.6.0.250"),
        wep_yaml("web-2", "10.6.0.250"),
    ]
    .join("---\n");
    let f = ctl.file("w.yaml", &weps);
    let o = ctl.run(&["create", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    // A handle record whose addresses are gone.
    block_on(ctl.conn.client.backend().create(
        "/calico/ipam/v2/handle/stale-one",
        br#"{"block":{"10.6.0.128/26":1}}"#.to_vec(),
        None,
    ))
    .unwrap();

    let o = ctl.run(&["ipam", "check"]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(
        o.out
            .contains(&format!("  {leaked} leaked; handle k8s-pod-network.c2")),
        "{o:?}"
    );
    assert!(!o.out.contains(&format!("  {used} leaked")), "{o:?}");
    assert!(
        o.out.contains("10.6.0.250 in use by Workload(default/node--a-k8s-web--1-eth0), Workload(default/node--a-k8s-web--2-eth0) and in an IP pool but has no IPAM allocation"),
        "{o:?}"
    );
    assert!(o.out.contains("10.6.0.250 has multiple owners"), "{o:?}");
    assert!(
        o.out.contains("stale-one doesn't have any active IPs"),
        "{o:?}"
    );
    assert!(
        o.out.contains("found 4 problems: 1 leaked, 1 not allocated, 1 duplicate, 1 stale handles, 0 invalid blocks"),
        "{o:?}"
    );

    // Releasing the leak fixes that part.
    let o = ctl.run(&["ipam", "release", "--ip", &leaked.to_string()]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(
        o.out,
        format!("Successfully released IP address {leaked}\n")
    );
    let o = ctl.run(&["ipam", "check"]);
    assert!(
        o.out
            .contains("Found 0 IPs that are allocated in IPAM but not actually in use"),
        "{o:?}"
    );
}

#[test]
fn ipam_release_of_a_free_address_says_so() {
    let ctl = Ctl::new();
    let f = ctl.file("p.yaml", &pool("p1", "10.7.0.0/24"));
    assert_eq!(ctl.run(&["create", "-f", &f]).code, EXIT_OK);
    let o = ctl.run(&["ipam", "release", "--ip", "10.7.0.9"]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(o.err.contains("10.7.0.9 is not assigned"), "{o:?}");
    let o = ctl.run(&["ipam", "release", "--ip", "10.7.0.999"]);
    assert_eq!(o.code, EXIT_USAGE, "{o:?}");
    // Releasing one a workload still uses works, with a warning.
    let ip = assign(&ctl, "h", "node-a");
    let f = ctl.file("w.yaml", &wep_yaml("web-0", &ip.to_string()));
    assert_eq!(ctl.run(&["create", "-f", &f]).code, EXIT_OK);
    let o = ctl.run(&["ipam", "release", "--ip", &ip.to_string()]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert!(o.err.contains("still used by Workload(default/"), "{o:?}");
}

#[test]
fn ipam_with_an_unreachable_datastore_exits_1() {
    let o = run_args(&["ipam", "show"], "", &Unreachable);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(o.err.contains("cannot reach the datastore"), "{o:?}");
}

// ---------------------------------------------------------------- Kubernetes NetworkPolicy

fn k8s_policy(name: &str, namespace: Option<&str>, port: u32) -> String {
    let ns = namespace
        .map(|n| format!("  namespace: {n}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: {name}\n{ns}spec:\n  podSelector:\n    matchLabels: {{app: web}}\n  ingress:\n  - from:\n    - namespaceSelector: {{matchLabels: {{env: prod}}}}\n    ports:\n    - port: {port}\n"
    )
}

#[test]
fn apply_get_and_delete_a_kubernetes_network_policy() {
    let ctl = Ctl::new();
    let f = ctl.file("netpol.yaml", &k8s_policy("allow-web", Some("shop"), 80));
    let o = ctl.run(&["apply", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(
        o.out,
        "Successfully applied 1 'NetworkPolicy' resource(s)\n"
    );

    // Stored as Calico stores a Kubernetes policy.
    let Some(Resource::NetworkPolicy(p)) =
        ctl.stored(Kind::NetworkPolicy, "shop", "knp.default.allow-web")
    else {
        panic!("not stored")
    };
    assert_eq!(p.spec.tier, "default");
    assert_eq!(p.spec.order, Some(1000.0));
    assert_eq!(
        p.spec.selector,
        "projectcalico.org/orchestrator == 'k8s' && app == 'web'"
    );
    assert_eq!(p.spec.ingress[0].source.namespace_selector, "env == 'prod'");

    // Applying it again changes nothing; a changed port updates it.
    let o = ctl.run(&["apply", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(o.err, "0 created, 0 updated, 1 unchanged\n");
    let f2 = ctl.file("netpol2.yaml", &k8s_policy("allow-web", Some("shop"), 8080));
    let o = ctl.run(&["apply", "-f", &f2]);
    assert_eq!(o.err, "0 created, 1 updated, 0 unchanged\n", "{o:?}");
    let o = ctl.run(&["replace", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");

    // get by the v3 name, by the Kubernetes kind and name, and listings.
    let o = ctl.run(&[
        "get",
        "networkpolicy",
        "knp.default.allow-web",
        "-n",
        "shop",
        "-o",
        "yaml",
    ]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    let v: serde_json::Value = serde_norway::from_str(&o.out).unwrap();
    assert_eq!(v["kind"], "NetworkPolicy");
    assert_eq!(v["spec"]["ingress"][0]["destination"]["ports"][0], 80);
    for kind in [
        "networkpolicies.networking.k8s.io",
        "NetworkPolicy.networking.k8s.io",
        "netpol",
    ] {
        let o = ctl.run(&["get", kind, "allow-web", "-n", "shop", "-o", "name"]);
        assert_eq!(o.code, EXIT_OK, "{kind}: {o:?}");
        assert_eq!(
            o.out,
            "networkpolicy.projectcalico.org/knp.default.allow-web\n"
        );
    }
    // The Kubernetes kind lists only converted policies; networkpolicy lists them all.
    let f3 = ctl.file("calico.yaml", &policy("calico-own", Some("shop"), "all()"));
    assert_eq!(ctl.run(&["create", "-f", &f3]).code, EXIT_OK);
    let o = ctl.run(&["get", "netpol", "-n", "shop", "-o", "name"]);
    assert_eq!(
        o.out,
        "networkpolicy.projectcalico.org/knp.default.allow-web\n"
    );
    let o = ctl.run(&["get", "networkpolicies", "-n", "shop", "-o", "name"]);
    assert_eq!(o.out.lines().count(), 2, "{o:?}");

    // delete -f with the Kubernetes document deletes the converted policy.
    let o = ctl.run(&["delete", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(
        o.out,
        "Successfully deleted 1 'NetworkPolicy' resource(s)\n"
    );
    assert!(
        ctl.stored(Kind::NetworkPolicy, "shop", "knp.default.allow-web")
            .is_none()
    );
    assert!(
        ctl.stored(Kind::NetworkPolicy, "shop", "calico-own")
            .is_some()
    );

    // delete by the Kubernetes kind and name.
    assert_eq!(ctl.run(&["create", "-f", &f]).code, EXIT_OK);
    let o = ctl.run(&[
        "delete",
        "networkpolicies.networking.k8s.io",
        "allow-web",
        "-n",
        "shop",
    ]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert!(
        ctl.stored(Kind::NetworkPolicy, "shop", "knp.default.allow-web")
            .is_none()
    );
}

#[test]
fn kubernetes_and_calico_documents_mix_in_one_file() {
    let ctl = Ctl::new();
    let text = [
        k8s_policy("from-k8s", None, 443),
        policy("from-calico", None, "all()"),
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: networking.k8s.io/v1\n  kind: NetworkPolicy\n  metadata: {name: in-list}\n  spec: {podSelector: {}, policyTypes: [Egress]}\n".to_string(),
    ]
    .join("---\n");
    let f = ctl.file("mixed.yaml", &text);
    let o = ctl.run(&["create", "-f", &f, "-n", "team"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(
        o.out,
        "Successfully created 3 'NetworkPolicy' resource(s)\n"
    );
    for name in ["knp.default.from-k8s", "from-calico", "knp.default.in-list"] {
        assert!(
            ctl.stored(Kind::NetworkPolicy, "team", name).is_some(),
            "{name}"
        );
    }
    let o = ctl.run(&["validate", "-f", &f]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(o.out, "3 documents are valid\n");
}

#[test]
fn an_invalid_kubernetes_policy_reports_every_problem_and_is_not_written() {
    let ctl = Ctl::new();
    let bad = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad, namespace: shop}
spec:
  ingress:
  - from:
    - podSelector: {}
    - ipBlock: {cidr: 10.0.0.0/33}
    ports:
    - {port: 90, endPort: 80}
";
    let f = ctl.file(
        "bad.yaml",
        &[bad.to_string(), k8s_policy("good", Some("shop"), 80)].join("---\n"),
    );
    let o = ctl.run(&["apply", "-f", &f]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    let prefix = format!("{f} [document 1] NetworkPolicy/shop/bad: ");
    assert!(
        o.err.contains(&format!(
            "{prefix}spec.ingress[0].ports[0].endPort: 80 is less than port 90: endPort must be at least port\n"
        )),
        "{o:?}"
    );
    assert!(
        o.err.contains(&format!(
            "{prefix}spec.ingress[0].from[1].ipBlock.cidr: \"10.0.0.0/33\" is not a valid CIDR: prefix length /33 exceeds /32\n"
        )),
        "{o:?}"
    );
    assert_eq!(
        o.out,
        "Partial success: applied 1 out of 2 'NetworkPolicy' resources\n"
    );
    assert!(
        ctl.stored(Kind::NetworkPolicy, "shop", "knp.default.bad")
            .is_none()
    );
    assert!(
        ctl.stored(Kind::NetworkPolicy, "shop", "knp.default.good")
            .is_some()
    );

    let o = ctl.run(&["validate", "-f", &f]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert_eq!(o.out.lines().count(), 2, "{o:?}");
    assert!(o.err.contains("1 of 2 documents are invalid"), "{o:?}");

    let typo = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: typo}\nspec: {podSelector: {matchLabel: {app: x}}}\n";
    let f = ctl.file("typo.yaml", typo);
    let o = ctl.run(&["create", "-f", &f]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(
        o.err.contains("spec.podSelector.matchLabel: unknown field \"matchLabel\" (did you mean \"matchLabels\"?)"),
        "{o:?}"
    );
}

#[test]
fn derived_kinds_are_read_only_in_the_kubernetes_datastore() {
    use crate::write_cmd::{Action, derived_refusal_for};
    let create = Action::Create { skip_exists: false };
    let delete = Action::Delete {
        skip_not_exists: false,
    };
    for (kind, name) in [
        (Kind::WorkloadEndpoint, "n1-k8s-web-eth0"),
        (Kind::Profile, "kns.prod"),
        (Kind::NetworkPolicy, "knp.default.deny"),
    ] {
        for action in [create, Action::Apply, Action::Replace, delete] {
            let why = derived_refusal_for(true, action, kind, name)
                .unwrap_or_else(|| panic!("{kind} {name} must be refused"));
            assert!(
                why.contains("Kubernetes datastore") && why.contains("kubectl"),
                "{why}"
            );
            assert_eq!(derived_refusal_for(false, action, kind, name), None);
        }
    }
    assert!(derived_refusal_for(true, create, Kind::Node, "n1").is_some());
    assert!(derived_refusal_for(true, delete, Kind::Node, "n1").is_some());
    assert_eq!(
        derived_refusal_for(true, Action::Apply, Kind::Node, "n1"),
        None
    );
    assert_eq!(
        derived_refusal_for(true, create, Kind::NetworkPolicy, "web"),
        None
    );
    assert_eq!(
        derived_refusal_for(true, create, Kind::IPPool, "pool"),
        None
    );
}
