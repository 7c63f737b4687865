//! Tests of datastore selection and errors, and of the output helpers (floats, progress).

use super::*;

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
