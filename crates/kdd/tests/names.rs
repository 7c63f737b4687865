//! Calico's naming rules, with expected values from Calico's tests
//! (`libcalico-go/lib/names/workloadendpoint_test.go`, `lk8s/conversion/conversion_test.go`,
//! `lk8s/resources/customresource_test.go`) or computed independently (Python's hashlib and
//! base64 for the hashes) where Calico has none.
#![allow(clippy::unwrap_used)]

use margay_kdd::names::*;
use proptest::prelude::*;

#[test]
fn cidr_names() {
    for (cidr, want) in [
        ("10.244.1.0/26", "10-244-1-0-26"),
        ("fd00:1234::/122", "fd00-1234---122"),
        ("192.168.0.0/16", "192-168-0-0-16"),
        // Masked first, as Calico names blocks by their network.
        ("10.244.1.7/26", "10-244-1-0-26"),
        ("fd00:1234:0:0:0:0:0:40/122", "fd00-1234--40-122"),
        ("2001:db8:0:1::/64", "2001-db8-0-1---64"),
        ("::/0", "---0"),
        // Not a CIDR: converted character by character.
        ("not/a.cidr", "not-a-cidr"),
    ] {
        assert_eq!(cidr_name(cidr), want, "{cidr}");
    }
}

#[test]
fn block_affinity_names() {
    assert_eq!(
        block_affinity_name("node-1", "10.244.1.0/26"),
        "node-1-10-244-1-0-26"
    );
    assert_eq!(
        block_affinity_name("worker.example.com", "fd00:1234::/122"),
        "worker.example.com-fd00-1234---122"
    );
    // 252 characters: still the plain form.
    let cn = "10-244-1-0-26";
    let host = "a".repeat(252 - cn.len() - 1);
    assert_eq!(
        block_affinity_name(&host, "10.244.1.0/26"),
        format!("{host}-{cn}")
    );
    // 253 characters: cut and hashed (expected hash from Python's hashlib).
    let host = "a".repeat(253 - cn.len() - 1);
    let name = block_affinity_name(&host, "10.244.1.0/26");
    assert_eq!(
        name,
        format!("{}-{cn}-c293a3d6187", &host[..252 - cn.len() - 13])
    );
    assert_eq!(name.len(), 252);
    let host = "h".repeat(250);
    let name = block_affinity_name(&host, "10.244.1.0/26");
    assert!(name.ends_with("-10-244-1-0-26-4b27d8ccedb"), "{name}");
    assert_eq!(name.len(), 252);
    let host = "n".repeat(240);
    let name = block_affinity_name(&host, "fd00:1234::/122");
    assert!(name.ends_with("-fd00-1234---122-79fa155e522"), "{name}");
    assert!(name.len() < 253);
    // Multi-byte characters never split (names are ASCII, but input is input).
    let host = "é".repeat(200);
    assert!(block_affinity_name(&host, "10.244.1.0/26").len() < 253);
}

#[test]
fn hostname_hashes() {
    // Unpadded standard base32 (upper case) of SHA3-256, 52 characters.
    for (host, want) in [
        (
            "node-1",
            "A3XPYDATRKB7Q4SM2O5FN4RXIHBFIL2PITFX26BAIP5XAB2X74CA",
        ),
        (
            "kind-worker",
            "IBVBROKXJCMHPK3CZI3D3PWK642IN433QZEAMKIO7Z4KRA4BKK3Q",
        ),
        (
            "worker-2.example.com",
            "5AQW2RENGGZWSYXIFBKM7UFM7Y54P4A2ZVKX4LD6PZJR5VQOJZGQ",
        ),
    ] {
        let got = hostname_hash(host);
        assert_eq!(got, want, "{host}");
        assert_eq!(got.len(), 52);
    }
}

#[test]
fn workload_endpoint_names_from_calicos_tests() {
    for (parts, want) in [
        (
            ("node-1", "k8s", "pod-name", "eth0"),
            "node--1-k8s-pod--name-eth0",
        ),
        (("ip-1", "k8s", "web-x", "eth0"), "ip--1-k8s-web--x-eth0"),
        (
            ("node-1", "cni", "abcdefa0123456", "eth0"),
            "node--1-cni-abcdefa0123456-eth0",
        ),
        (
            ("node-1", "libnetwork", "libnetwork", "abcdefgh"),
            "node--1-libnetwork-libnetwork-abcdefgh",
        ),
        (
            ("node-1", "foo", "foo-foo", "abcdefgh"),
            "node--1-foo-foo--foo-abcdefgh",
        ),
        (("nodeA", "k8s", "podA", "eth0"), "nodeA-k8s-podA-eth0"),
    ] {
        let (n, o, w, e) = parts;
        assert_eq!(workload_endpoint_name(n, o, w, e).unwrap(), want);
        assert_eq!(
            parse_workload_endpoint_name(want),
            Some((n.into(), o.into(), w.into(), e.into()))
        );
    }
    for (parts, field) in [
        (("node-1", "", "pod", "eth0"), "orchestrator"),
        (("node-1", "k8s", "", "eth0"), "workload"),
        (("", "k8s", "pod", "eth0"), "node"),
        (("node-1", "cni", "-abcdefa0123456", "eth0"), "workload"),
        (("node-1", "foo", "foo-foo-", "abcdefgh"), "workload"),
        (("node-1", "k8s", "pod", "eth0-"), "endpoint"),
    ] {
        let (n, o, w, e) = parts;
        let err = workload_endpoint_name(n, o, w, e).unwrap_err();
        assert_eq!(err.field, field, "{parts:?}");
    }
}

#[test]
fn workload_endpoint_name_parsing() {
    assert_eq!(
        parse_workload_endpoint_name("node-k8s-pod-eth0"),
        Some(("node".into(), "k8s".into(), "pod".into(), "eth0".into()))
    );
    assert_eq!(
        parse_workload_endpoint_name("node-foo--orch-workload-eth0"),
        Some((
            "node".into(),
            "foo-orch".into(),
            "workload".into(),
            "eth0".into()
        ))
    );
    for bad in [
        "",
        "node-",
        "node-k8s-pod--name-",
        // A pod name instead of an endpoint name (Calico's test): too few or too many parts.
        "coredns-668d6bf9bc-bxhr6",
        "calico-kube-controllers-7946b84856-2fwwq",
        "node--1-k8s-pod-eth0-extra",
        // Three dashes: a part ending in '-', which no endpoint name has.
        "a---b-c-d",
        "-a-b-c-d",
        "a-b-c-d-",
    ] {
        assert_eq!(parse_workload_endpoint_name(bad), None, "{bad:?}");
    }
}

#[test]
fn interface_names_from_calicos_tests() {
    // "If this fails, fix the code not this expect!" (Calico's conversion tests).
    assert_eq!(
        k8s_interface_name("cali", "default", "podA"),
        "cali7f94ce7c295"
    );
    assert_eq!(
        k8s_interface_name("cali", "default", "podB"),
        "cali92cf1f5e9f6"
    );
    assert_eq!(
        k8s_interface_name(interface_prefix("eni,veth,foo"), "namespace", "podname"),
        "eni82111e10a96"
    );
    assert_eq!(interface_prefix(""), "cali");
    assert_eq!(interface_prefix("tap"), "tap");
}

#[test]
fn uid_conversion_from_calicos_tests() {
    // customresource_test.go and conversion_test.go.
    assert_eq!(
        convert_uid("41cb1fde-57e7-42c1-a73b-0acaf38c7737").as_deref(),
        Some("82d3f87b-eae7-4283-a7dc-5053cf31eeec")
    );
    assert_eq!(
        convert_uid("82d3f87b-eae7-4283-a7dc-5053cf31eeec").as_deref(),
        Some("41cb1fde-57e7-42c1-a73b-0acaf38c7737")
    );
    assert_eq!(
        convert_uid("30316465-6365-4463-ad63-3564622d3638").as_deref(),
        Some("0c8c26a6-c6a6-44c6-adc6-ac2646b46c1c")
    );
    // Go's uuid.Parse forms; the result is always canonical.
    assert_eq!(
        convert_uid("41CB1FDE57E742C1A73B0ACAF38C7737").as_deref(),
        Some("82d3f87b-eae7-4283-a7dc-5053cf31eeec")
    );
    assert_eq!(convert_uid("not-a-uid"), None);
    assert_eq!(convert_uid(""), None);
}

proptest! {
    #[test]
    fn uid_conversion_is_self_inverse_and_keeps_version_and_variant(bytes in any::<[u8; 16]>()) {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let uid = format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32]);
        let converted = convert_uid(&uid).unwrap();
        prop_assert_eq!(convert_uid(&converted).unwrap(), uid.clone());
        // Bytes 6 and 8 (hex digits 14-15 and 19-20 with dashes) are untouched.
        prop_assert_eq!(&converted[14..16], &uid[14..16]);
        prop_assert_eq!(&converted[19..21], &uid[19..21]);
    }

    #[test]
    fn workload_endpoint_names_parse_back(
        node in "[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?",
        orch in "[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?",
        workload in "[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?",
        endpoint in "[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?",
    ) {
        let name = workload_endpoint_name(&node, &orch, &workload, &endpoint).unwrap();
        prop_assert_eq!(
            parse_workload_endpoint_name(&name),
            Some((node, orch, workload, endpoint))
        );
    }

    #[test]
    fn affinity_names_fit_and_keep_the_cidr(host in "[a-z0-9.-]{1,300}") {
        let name = block_affinity_name(&host, "10.65.0.64/26");
        prop_assert!(name.len() < 253);
        prop_assert!(name.contains("-10-65-0-64-26"));
    }
}
