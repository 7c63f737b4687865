//! IPAM etcd JSON ↔ IPAMBlock, BlockAffinity, IPAMHandle and IPAMConfig custom resources:
//! custom resources as Calico clusters show them (tests/fixtures/ipam: the custom resource,
//! then what margay's IPAM reads from it), exact bodies, Calico's two-step delete, and round
//! trips of the JSON margay's IPAM writes (property-tested).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use margay_kdd::ipam::*;
use margay_kdd::names::{block_affinity_name, hostname_hash};
use proptest::prelude::*;
use serde_json::{Value, json};

fn fixture(name: &str) -> (Value, Value) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ipam")
        .join(name);
    let text = std::fs::read_to_string(path).unwrap();
    let mut docs: Vec<Value> = serde_norway::Deserializer::from_str(&text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
        .collect();
    assert_eq!(docs.len(), 2, "{name}");
    let second = docs.pop().unwrap();
    (docs.pop().unwrap(), second)
}

/// The metadata of a body, without the (checked elsewhere) annotation.
fn annotation(cr: &Value) -> Value {
    serde_json::from_str(
        cr["metadata"]["annotations"]["projectcalico.org/metadata"]
            .as_str()
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn blocks_from_a_calico_cluster() {
    let (cr, expected) = fixture("ipamblock.yaml");
    let etcd = cr_to_block(&cr).unwrap().unwrap();
    assert_eq!(etcd, expected["block"]);
    // margay's IPAM reads it (same JSON as crates/ipam's AllocationBlock).
    assert_eq!(etcd["allocations"][3], 2);
    // And writes back the same custom resource content.
    let body = block_to_cr(&etcd).unwrap();
    assert_eq!(body["metadata"]["name"], "192-168-82-128-26");
    assert_eq!(body["spec"], cr["spec"]);
    assert_eq!(body["kind"], "IPAMBlock");
    assert_eq!(annotation(&body), json!({"creationTimestamp": null}));
    assert_eq!(
        body["metadata"]["annotations"]["projectcalico.org/metadata"],
        cr["metadata"]["annotations"]["projectcalico.org/metadata"]
    );
}

#[test]
fn block_bodies() {
    let etcd = json!({
        "cidr": "fd00:1234::40/122", "affinity": null,
        "allocations": [null, null], "unallocated": [0, 1], "attributes": [],
        "sequenceNumber": 0, "sequenceNumberForAllocation": {}, "deleted": false,
        "hostAffinity": "legacy", "affinity_claim_time": "2026-01-01T00:00:00Z"
    });
    let body = block_to_cr(&etcd).unwrap();
    assert_eq!(
        body,
        json!({
            "apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMBlock",
            "metadata": {"name": "fd00-1234--40-122",
                         "annotations": {"projectcalico.org/metadata": "{\"creationTimestamp\":null}"}},
            "spec": {"cidr": "fd00:1234::40/122", "affinityClaimTime": "2026-01-01T00:00:00Z",
                     "allocations": [null, null], "unallocated": [0, 1], "attributes": [],
                     "sequenceNumber": 0, "sequenceNumberForAllocation": {}, "deleted": false,
                     "strictAffinity": false}
        })
    );
    let back = cr_to_block(&body).unwrap().unwrap();
    assert_eq!(back["affinity"], Value::Null);
    assert_eq!(back["affinity_claim_time"], "2026-01-01T00:00:00Z");
    // Calico's custom resource has no place for the legacy hostAffinity.
    assert!(back.get("hostAffinity").is_none());
    // Go's nil slices and maps (null) survive as null.
    let nulls = json!({"cidr": "10.0.0.0/31", "affinity": "host:a", "allocations": null,
                       "unallocated": null, "attributes": null, "sequenceNumber": 4,
                       "sequenceNumberForAllocation": null, "deleted": false});
    assert_eq!(
        cr_to_block(&block_to_cr(&nulls).unwrap()).unwrap().unwrap(),
        nulls
    );
}

#[test]
fn deleted_objects_read_as_absent() {
    let mut block = block_to_cr(&json!({"cidr": "10.0.0.0/26", "deleted": true})).unwrap();
    assert_eq!(cr_to_block(&block).unwrap(), None);
    block["spec"]["deleted"] = json!(false);
    assert!(cr_to_block(&block).unwrap().is_some());

    let aff = affinity_to_cr(
        "n1",
        "10.0.0.0/26",
        &json!({"state": "confirmed", "deleted": true}),
    )
    .unwrap();
    assert_eq!(aff["spec"]["deleted"], "true");
    assert_eq!(cr_to_affinity(&aff).unwrap(), None);

    let h = handle_to_cr("H", &json!({"block": {}, "deleted": true})).unwrap();
    assert_eq!(cr_to_handle(&h).unwrap(), None);
}

#[test]
fn affinities_from_a_calico_cluster() {
    let (cr, expected) = fixture("blockaffinity.yaml");
    let (host, cidr, value) = cr_to_affinity(&cr).unwrap().unwrap();
    assert_eq!(host, expected["host"]);
    assert_eq!(cidr, expected["cidr"]);
    assert_eq!(value, expected["value"]);
    let body = affinity_to_cr(&host, &cidr, &value).unwrap();
    assert_eq!(body["metadata"]["name"], cr["metadata"]["name"]);
    assert_eq!(body["metadata"]["labels"], cr["metadata"]["labels"]);
    assert_eq!(body["spec"], cr["spec"]);
    assert_eq!(
        body["metadata"]["annotations"]["projectcalico.org/metadata"],
        cr["metadata"]["annotations"]["projectcalico.org/metadata"]
    );
}

#[test]
fn affinity_bodies() {
    let body = affinity_to_cr(
        "node-1",
        "fd00:1234::7/122",
        &json!({"state": "pending", "deleted": false}),
    )
    .unwrap();
    let hash = hostname_hash("node-1");
    assert_eq!(
        body,
        json!({
            "apiVersion": "crd.projectcalico.org/v1", "kind": "BlockAffinity",
            "metadata": {
                "name": "node-1-fd00-1234---122",
                "labels": {"projectcalico.org/hostname-hash": hash,
                           "projectcalico.org/affinity-type": "host",
                           "projectcalico.org/ip-version": "6"},
                "annotations": {"projectcalico.org/metadata": format!(
                    "{{\"creationTimestamp\":null,\"labels\":{{\"projectcalico.org/affinity-type\":\"host\",\"projectcalico.org/hostname-hash\":\"{hash}\",\"projectcalico.org/ip-version\":\"6\"}}}}")}
            },
            "spec": {"state": "pending", "node": "node-1", "type": "host",
                     "cidr": "fd00:1234::/122", "deleted": "false"}
        })
    );
    // Long host names: Calico's cut-and-hash name, the full host in spec.node.
    let host = "h".repeat(250);
    let body = affinity_to_cr(&host, "10.244.1.0/26", &json!({"state": "confirmed"})).unwrap();
    assert_eq!(
        body["metadata"]["name"],
        block_affinity_name(&host, "10.244.1.0/26")
    );
    assert_eq!(body["spec"]["node"], host);
    assert_eq!(cr_to_affinity(&body).unwrap().unwrap().0, host);
    assert!(affinity_to_cr("", "10.0.0.0/26", &json!({})).is_err());
    assert_eq!(
        affinity_to_cr("n", "nope", &json!({})).unwrap_err().field,
        "cidr"
    );
}

#[test]
fn affinity_deleted_forms() {
    let cr = |deleted: Value| {
        json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "BlockAffinity",
               "metadata": {"name": "n-10-0-0-0-26"},
               "spec": {"state": "confirmed", "node": "n", "cidr": "10.0.0.0/26", "deleted": deleted}})
    };
    for (d, deleted) in [
        (json!("true"), true),
        (json!("True"), true),
        (json!("1"), true),
        (json!("t"), true),
        (json!(true), true),
        (json!("false"), false),
        (json!("F"), false),
        (json!("0"), false),
        (json!(""), false),
        (json!(false), false),
        (Value::Null, false),
    ] {
        assert_eq!(
            cr_to_affinity(&cr(d.clone())).unwrap().is_none(),
            deleted,
            "{d}"
        );
    }
    let err = cr_to_affinity(&cr(json!("yes"))).unwrap_err();
    assert_eq!(err.field, "spec.deleted");
    assert_eq!(err.object, "BlockAffinity \"n-10-0-0-0-26\"");
    // No type: Calico's older backends wrote none, meaning host.
    let mut untyped = cr(json!("false"));
    assert!(cr_to_affinity(&untyped).unwrap().is_some());
    untyped["spec"]["type"] = json!("virtual");
    assert_eq!(cr_to_affinity(&untyped).unwrap_err().field, "spec.type");
    let mut bad = cr(json!("false"));
    bad["spec"]["cidr"] = json!("10.0.0.0");
    assert_eq!(cr_to_affinity(&bad).unwrap_err().field, "spec.cidr");
    bad["kind"] = json!("IPAMBlock");
    assert_eq!(cr_to_affinity(&bad).unwrap_err().field, "kind");
}

#[test]
fn affinity_selectors() {
    let hash = hostname_hash("kind-worker");
    assert_eq!(
        affinity_label_selector("kind-worker", Some(4)),
        format!(
            "projectcalico.org/affinity-type=host,projectcalico.org/hostname-hash={hash},projectcalico.org/ip-version=4"
        )
    );
    assert_eq!(
        affinity_label_selector("kind-worker", None),
        format!("projectcalico.org/affinity-type=host,projectcalico.org/hostname-hash={hash}")
    );
}

#[test]
fn handles() {
    let (cr, expected) = fixture("ipamhandle.yaml");
    let (id, value) = cr_to_handle(&cr).unwrap().unwrap();
    assert_eq!(id, expected["handleID"]);
    assert_eq!(value, expected["value"]);
    let body = handle_to_cr(&id, &value).unwrap();
    assert_eq!(body["spec"], cr["spec"]);
    assert_eq!(body["metadata"]["name"], cr["metadata"]["name"]);

    // Names are lower case; the ID keeps its case.
    let body = handle_to_cr(
        "vxlan-tunnel-addr-Node-A",
        &json!({"block": {"10.0.0.0/26": 1}, "deleted": false}),
    )
    .unwrap();
    assert_eq!(body["metadata"]["name"], "vxlan-tunnel-addr-node-a");
    assert_eq!(body["spec"]["handleID"], "vxlan-tunnel-addr-Node-A");
    assert_eq!(annotation(&body), json!({"creationTimestamp": null}));
    assert_eq!(
        cr_to_handle(&body).unwrap().unwrap().0,
        "vxlan-tunnel-addr-Node-A"
    );
    // Without a handleID, the object's name.
    let mut nameless = body.clone();
    nameless["spec"]["handleID"] = json!("");
    assert_eq!(
        cr_to_handle(&nameless).unwrap().unwrap().0,
        "vxlan-tunnel-addr-node-a"
    );
    let mut bad = body;
    bad["spec"]["block"] = json!({"10.0.0.0/26": "one"});
    let err = cr_to_handle(&bad).unwrap_err();
    assert!(err.field.starts_with("spec.block"), "{err}");
    assert!(handle_to_cr("", &json!({})).is_err());
}

#[test]
fn ipam_config() {
    let (cr, expected) = fixture("ipamconfig.yaml");
    let etcd = cr_to_ipam_config(&cr).unwrap();
    assert_eq!(etcd, expected["value"]);
    let body = ipam_config_to_cr(&etcd).unwrap();
    assert_eq!(body["spec"], cr["spec"]);
    assert_eq!(body["kind"], "IPAMConfig");
    assert_eq!(body["metadata"]["name"], "default");
    // margay's IPAM reads a missing auto_allocate_blocks as true; so does the conversion.
    assert_eq!(
        ipam_config_to_cr(&json!({})).unwrap()["spec"],
        json!({"strictAffinity": false, "autoAllocateBlocks": true})
    );
    assert_eq!(
        cr_to_ipam_config(&json!({"kind": "IPAMConfig", "spec": {"strictAffinity": true, "autoAllocateBlocks": false, "ipCooldownSeconds": 60}})).unwrap(),
        json!({"strict_affinity": true, "auto_allocate_blocks": false, "maxBlocksPerHost": 0, "ipCooldownSeconds": 60})
    );
    // The v3 resource and the etcd form are the same custom resource.
    let v3 = margay_kdd::crd::cr_to_resource(margay_api::Kind::IPAMConfiguration, &body).unwrap();
    let margay_api::Resource::IPAMConfiguration(c) = v3 else {
        unreachable!()
    };
    assert!(c.spec.strict_affinity);
    assert_eq!(c.spec.max_blocks_per_host, Some(4));
    assert!(
        cr_to_ipam_config(&json!({"kind": "IPAMConfig", "spec": {"maxBlocksPerHost": "4"}}))
            .is_err()
    );
}

fn attribute() -> impl Strategy<Value = Value> {
    (
        proptest::option::of("[a-z0-9.-]{1,20}"),
        proptest::collection::btree_map("[a-z]{1,8}", "[a-z0-9 .:-]{0,12}", 0..4),
    )
        .prop_map(|(handle, secondary)| {
            let mut a = serde_json::Map::new();
            if let Some(h) = handle {
                a.insert("handle_id".into(), json!(h));
            }
            if !secondary.is_empty() {
                a.insert("secondary".into(), json!(secondary));
            }
            Value::Object(a)
        })
}

/// Blocks as margay's IPAM writes them (crates/ipam AllocationBlock's serialisation).
fn etcd_block() -> impl Strategy<Value = Value> {
    (
        any::<bool>(),
        0u8..=255,
        2u8..=4,
        proptest::option::of("[a-z0-9-]{1,20}"),
        proptest::collection::vec(proptest::option::of(0usize..3), 1..16),
        proptest::collection::vec(attribute(), 0..3),
        any::<u64>(),
        proptest::collection::btree_map("[0-9]{1,2}", any::<u64>(), 0..4),
    )
        .prop_map(
            |(v6, octet, bits, host, allocations, attributes, seq, seqs)| {
                let size = 1usize << bits;
                let cidr = if v6 {
                    format!("fd{octet:02x}::/{}", 128 - bits)
                } else {
                    format!("10.{octet}.0.0/{}", 32 - bits)
                };
                let allocations: Vec<Option<usize>> = (0..size)
                    .map(|i| allocations.get(i).copied().flatten())
                    .collect();
                let unallocated: Vec<usize> =
                    (0..size).filter(|i| allocations[*i].is_none()).collect();
                json!({
                    "cidr": cidr,
                    "affinity": host.map(|h| format!("host:{h}")),
                    "allocations": allocations,
                    "unallocated": unallocated,
                    "attributes": attributes,
                    "sequenceNumber": seq,
                    "sequenceNumberForAllocation": seqs,
                    "deleted": false,
                })
            },
        )
}

proptest! {
    #[test]
    fn blocks_round_trip(block in etcd_block()) {
        let cr = block_to_cr(&block).unwrap();
        prop_assert_eq!(cr_to_block(&cr).unwrap(), Some(block));
    }

    #[test]
    fn affinities_round_trip(
        host in "[a-z0-9]([a-z0-9.-]{0,300}[a-z0-9])?",
        v6 in any::<bool>(),
        octet in 0u8..=255,
        state in prop_oneof![Just("pending"), Just("confirmed"), Just("pendingDeletion")],
    ) {
        let cidr = if v6 { format!("fd{octet:02x}::/122") } else { format!("10.{octet}.1.0/26") };
        let value = json!({"state": state, "deleted": false});
        let cr = affinity_to_cr(&host, &cidr, &value).unwrap();
        prop_assert!(cr["metadata"]["name"].as_str().unwrap().len() < 253);
        prop_assert_eq!(cr_to_affinity(&cr).unwrap(), Some((host, cidr, value)));
    }

    #[test]
    fn handles_round_trip(
        id in "[A-Za-z0-9][A-Za-z0-9.-]{0,60}",
        blocks in proptest::collection::btree_map("10\\.[0-9]{1,2}\\.0\\.0/26", 1u64..64, 0..3),
    ) {
        let value = json!({"block": blocks, "deleted": false});
        let cr = handle_to_cr(&id, &value).unwrap();
        prop_assert_eq!(cr_to_handle(&cr).unwrap(), Some((id, value)));
    }

    #[test]
    fn ipam_config_round_trips(
        strict in any::<bool>(), auto in any::<bool>(), max in 0i64..20,
        kv in proptest::option::of(prop_oneof![Just("Enabled"), Just("Disabled")]),
        cooldown in proptest::option::of(1i64..1200),
    ) {
        let mut v = json!({"strict_affinity": strict, "auto_allocate_blocks": auto, "maxBlocksPerHost": max});
        if let Some(k) = kv { v["kubeVirtVMAddressPersistence"] = json!(k); }
        if let Some(c) = cooldown { v["ipCooldownSeconds"] = json!(c); }
        prop_assert_eq!(cr_to_ipam_config(&ipam_config_to_cr(&v).unwrap()).unwrap(), v);
    }
}

#[test]
fn undecodable_ipam_objects_name_the_field() {
    let err = block_to_cr(&json!({"cidr": "10.0.0.0/26", "allocations": "all"})).unwrap_err();
    assert_eq!(err.field, "allocations");
    assert_eq!(
        block_to_cr(&json!({"cidr": "x"})).unwrap_err().field,
        "cidr"
    );
    assert_eq!(block_to_cr(&json!({})).unwrap_err().field, "<object>");
    let err = cr_to_block(&json!({"kind": "IPAMBlock", "metadata": {"name": "b"},
                                  "spec": {"cidr": "10.0.0.0/26", "unallocated": [-1]}}))
    .unwrap_err();
    assert_eq!(err.field, "spec.unallocated[0]");
    assert_eq!(err.object, "IPAMBlock \"b\"");
    let err = cr_to_block(&json!({"kind": "IPAMBlock", "metadata": {"name": "b"}, "spec": {}}))
        .unwrap_err();
    assert_eq!(err.field, "spec");
}
