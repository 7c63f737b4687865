//! Property tests: decoding and validation never panic, and whatever decodes round-trips.
#![allow(clippy::unwrap_used)] // a panic in a test is a failure with a location

use margay_api::codec::{decode_documents, to_json, to_yaml};
use proptest::prelude::*;
use serde_json::{Value, json};

fn one_of_str(items: &'static [&'static str]) -> impl Strategy<Value = Value> {
    proptest::sample::select(items).prop_map(|s| Value::String(s.to_string()))
}

fn port() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u32..70000).prop_map(|p| json!(p)),
        one_of_str(&[
            "http",
            "8080:8090",
            "90:80",
            "Http",
            "a_b",
            "0",
            "65535",
            "1:1"
        ]),
    ]
}

fn selector() -> impl Strategy<Value = Value> {
    one_of_str(&[
        "",
        "all()",
        "app == 'web'",
        "has(tier) && tier in {'a','b'}",
        "global()",
        "a ==",
        "!has(x) || y != \"z\"",
    ])
}

fn entity() -> impl Strategy<Value = Value> {
    (
        proptest::option::of(prop::collection::vec(
            one_of_str(&[
                "10.0.0.0/8",
                "10.0.0.1/8",
                "fd00::/64",
                "0.0.0.0/0",
                "bad",
                "10.0.0.1",
            ]),
            0..3,
        )),
        proptest::option::of(selector()),
        proptest::option::of(selector()),
        proptest::option::of(prop::collection::vec(port(), 0..3)),
        proptest::option::of(prop::collection::vec(port(), 0..2)),
    )
        .prop_map(|(nets, sel, ns, ports, not_ports)| {
            let mut m = serde_json::Map::new();
            if let Some(v) = nets {
                m.insert("nets".into(), json!(v));
            }
            if let Some(v) = sel {
                m.insert("selector".into(), v);
            }
            if let Some(v) = ns {
                m.insert("namespaceSelector".into(), v);
            }
            if let Some(v) = ports {
                m.insert("ports".into(), json!(v));
            }
            if let Some(v) = not_ports {
                m.insert("notPorts".into(), json!(v));
            }
            Value::Object(m)
        })
}

fn rule() -> impl Strategy<Value = Value> {
    (
        one_of_str(&["Allow", "Deny", "Log", "Pass"]),
        proptest::option::of(prop_oneof![
            one_of_str(&["TCP", "UDP", "ICMP", "ICMPv6", "SCTP", "tcp", "17", "0"]),
            (0u32..300).prop_map(|p| json!(p)),
        ]),
        proptest::option::of(prop_oneof![Just(json!(4)), Just(json!(6)), Just(json!(5))]),
        proptest::option::of((0u32..300, proptest::option::of(0u32..300))),
        entity(),
        entity(),
    )
        .prop_map(|(action, protocol, ipv, icmp, src, dst)| {
            let mut m = serde_json::Map::new();
            m.insert("action".into(), action);
            if let Some(p) = protocol {
                m.insert("protocol".into(), p);
            }
            if let Some(v) = ipv {
                m.insert("ipVersion".into(), v);
            }
            if let Some((t, c)) = icmp {
                let mut i = serde_json::Map::new();
                i.insert("type".into(), json!(t));
                if let Some(c) = c {
                    i.insert("code".into(), json!(c));
                }
                m.insert("icmp".into(), Value::Object(i));
            }
            m.insert("source".into(), src);
            m.insert("destination".into(), dst);
            Value::Object(m)
        })
}

fn policy() -> impl Strategy<Value = Value> {
    (
        one_of_str(&["allow-web", "security.allow-web", "Bad_Name", "a.b.c"]),
        proptest::option::of(-1.0e6f64..1.0e6),
        selector(),
        prop::collection::vec(rule(), 0..4),
        prop::collection::vec(rule(), 0..3),
        any::<bool>(),
    )
        .prop_map(|(name, order, sel, ingress, egress, pre_dnat)| {
            json!({
                "apiVersion": "projectcalico.org/v3",
                "kind": "GlobalNetworkPolicy",
                "metadata": {"name": name, "labels": {"team": "net"}},
                "spec": {
                    "order": order,
                    "selector": sel,
                    "ingress": ingress,
                    "egress": egress,
                    "preDNAT": pre_dnat,
                    "applyOnForward": pre_dnat,
                }
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn decoding_arbitrary_text_never_panics(input in "\\PC{0,200}") {
        let _ = decode_documents(&input);
    }

    #[test]
    fn decoding_arbitrary_yaml_shapes_never_panics(
        input in "(apiVersion: projectcalico.org/v3\n)?(kind: (IPPool|Tier|NetworkPolicy|Node|FelixConfiguration)\n)?(metadata: \\{name: [a-z]{1,5}\\}\n)?(spec: (\\{\\}|\\[1\\]|\\{cidr: [0-9./]{1,12}\\}|\\{order: [0-9.e-]{1,6}\\}))?\n?"
    ) {
        if let Ok(docs) = decode_documents(&input) {
            for d in docs {
                if let Ok(r) = d.result {
                    let _ = r.validate();
                }
            }
        }
    }

    #[test]
    fn generated_policies_round_trip_and_validate_deterministically(doc in policy()) {
        let text = serde_json::to_string(&doc).unwrap();
        let decoded = decode_documents(&text).unwrap();
        prop_assert_eq!(decoded.len(), 1);
        let Ok(r) = &decoded[0].result else { return Ok(()) };
        let verdict = r.validate();
        prop_assert_eq!(&verdict, &r.validate());
        for encoded in [to_yaml(r).unwrap(), to_json(r, false).unwrap()] {
            let again = decode_documents(&encoded).unwrap();
            let again = again[0].result.as_ref().unwrap();
            prop_assert_eq!(again, r);
            prop_assert_eq!(again.validate(), verdict.clone());
        }
    }
}
