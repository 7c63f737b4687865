//! Tests of the commands that read or relabel: get (tables, YAML/JSON, export) and label.

use super::*;

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

/// `-o json` as calicoctl's `json.MarshalIndent` of the Go types: keys in struct order
/// (`kind`, `apiVersion`, `metadata`, `spec`; a list's `metadata` before its `items`), two
/// spaces, no newline at the end.
#[test]
fn get_json_keeps_calicoctls_key_order() {
    let ctl = Ctl::new();
    let f = ctl.file(
        "p.yaml",
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata:\n  name: p1\n  labels: {b: '1', a: '2'}\nspec:\n  natOutgoing: true\n  cidr: 10.1.0.0/16\n  blockSize: 26\n  vxlanMode: Always\n",
    );
    assert_eq!(ctl.run(&["create", "-f", &f]).code, EXIT_OK);
    let o = ctl.run(&["get", "ippool", "p1", "-o", "json"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert!(o.out.starts_with("{\n  \"kind\": \"IPPool\",\n  \"apiVersion\": \"projectcalico.org/v3\",\n  \"metadata\": {\n    \"name\": \"p1\","), "{}", o.out);
    assert!(o.out.ends_with('}'), "no newline at the end: {:?}", o.out);
    let at = |k: &str| o.out.find(k).unwrap_or_else(|| panic!("{k} in {}", o.out));
    // IPPoolSpec's Go order: cidr, vxlanMode, natOutgoing, blockSize; labels sorted (a map).
    assert!(
        at("\"cidr\"") < at("\"vxlanMode\"")
            && at("\"vxlanMode\"") < at("\"natOutgoing\"")
            && at("\"natOutgoing\"") < at("\"blockSize\""),
        "{}",
        o.out
    );
    assert!(
        at("\"uid\"") < at("\"resourceVersion\"") && at("\"resourceVersion\"") < at("\"labels\""),
        "{}",
        o.out
    );
    assert!(at("\"a\": \"2\"") < at("\"b\": \"1\""), "{}", o.out);

    let o = ctl.run(&["get", "ippools", "-o", "json"]);
    assert!(o.out.starts_with("{\n  \"kind\": \"IPPoolList\",\n  \"apiVersion\": \"projectcalico.org/v3\",\n  \"metadata\": {\n    \"resourceVersion\": "), "{}", o.out);
    assert!(o.out.find("\"metadata\"") < o.out.find("\"items\""));
    let v: serde_json::Value = serde_json::from_str(&o.out).unwrap();
    assert_eq!(v["items"][0]["metadata"]["name"], "p1");

    // get -f naming two resources: one JSON array of both, each in the same order.
    let g = ctl.file(
        "two.yaml",
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p1}\n---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p1}\n",
    );
    let o = ctl.run(&["get", "-f", &g, "-o", "json"]);
    assert_eq!(o.code, EXIT_OK, "{o:?}");
    assert!(
        o.out
            .starts_with("[\n  {\n    \"kind\": \"IPPool\",\n    \"apiVersion\""),
        "{}",
        o.out
    );
    let v: serde_json::Value = serde_json::from_str(&o.out).unwrap();
    assert_eq!(v.as_array().map(Vec::len), Some(2), "{}", o.out);
}
