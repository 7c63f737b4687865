//! Tests of the commands that write: create, apply, replace (namespaces included) and delete.

use super::*;

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
