//! Tests of `ipam show` and `ipam check`.

use super::*;

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

#[test]
fn ipam_split_replaces_a_pool_and_bad_input_changes_nothing() {
    let ctl = Ctl::new();
    let p = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: p1\nspec:\n  cidr: 10.7.0.0/24\n  blockSize: 26\n  natOutgoing: true\n---\napiVersion: projectcalico.org/v3\nkind: ClusterInformation\nmetadata:\n  name: default\nspec:\n  datastoreReady: true\n";
    let f = ctl.file("p.yaml", p);
    assert_eq!(ctl.run(&["create", "-f", &f]).code, EXIT_OK);
    let ip = assign(&ctl, "h1", "node-a");
    let pool_yaml = |ctl: &Ctl| ctl.run(&["get", "ippool", "p1", "-o", "yaml"]);

    // Not locked: refused, nothing changed.
    let o = ctl.run(&["ipam", "split", "--name", "p1", "2"]);
    assert_eq!(o.code, EXIT_INVALID, "{o:?}");
    assert!(o.err.contains("datastore is not locked"), "{o:?}");
    assert!(!pool_yaml(&ctl).out.contains("disabled"));

    let o = ctl.run(&["datastore", "migrate", "lock"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    for (args, code, says) in [
        (&["ipam", "split", "2"][..], EXIT_USAGE, "no name or CIDR"),
        (
            &["ipam", "split", "--name", "p1", "x"][..],
            EXIT_USAGE,
            "not a valid number",
        ),
        (
            &["ipam", "split", "--name", "p1", "3"][..],
            EXIT_INVALID,
            "power of 2",
        ),
        // /27 pools cannot hold /26 blocks.
        (
            &["ipam", "split", "--name", "p1", "8"][..],
            EXIT_INVALID,
            "would not be valid",
        ),
        (
            &["ipam", "split", "--cidr", "10.9.0.0/24", "2"][..],
            EXIT_INVALID,
            "unable to find IP pool",
        ),
        (
            &["ipam", "split", "--name", "nope", "2"][..],
            EXIT_INVALID,
            "unable to find IP pool with name nope",
        ),
    ] {
        let o = ctl.run(args);
        assert_eq!(o.code, code, "{args:?}: {o:?}");
        assert!(o.err.contains(says), "{args:?}: {o:?}");
        let y = pool_yaml(&ctl);
        assert_eq!(y.code, EXIT_OK, "{args:?}: the pool is gone");
        assert!(
            !y.out.contains("disabled"),
            "{args:?} disabled the pool: {}",
            y.out
        );
    }

    let o = ctl.run(&["ipam", "split", "--cidr", "10.7.0.0/24", "2"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert_eq!(
        o.out,
        "IP Pool p1 was successfully split into 2 smaller pools.\n\
         Created split-p1-0 with CIDR 10.7.0.0/25.\n\
         Created split-p1-1 with CIDR 10.7.0.128/25.\n\
         Please refer to the documentation for final steps.\n"
    );
    assert_eq!(pool_yaml(&ctl).code, EXIT_INVALID, "the old pool stays");
    let child = ctl.run(&["get", "ippool", "split-p1-1", "-o", "yaml"]);
    assert!(
        child.out.contains("natOutgoing: true") && !child.out.contains("disabled"),
        "{}",
        child.out
    );
    // The allocation survives the split.
    let o = ctl.run(&["ipam", "show", "--ip", &ip.to_string()]);
    assert!(o.out.contains("is in use"), "{o:?}");
}
