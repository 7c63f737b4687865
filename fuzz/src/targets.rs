//! The fuzz targets: parsers that read what strangers send. Each returns an outcome class
//! (a hash of what kind of result the input produced, for the engine's corpus) and panics
//! when a property breaks.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::Target;

/// Every target, by name.
pub const ALL: &[Target] = &[
    Target {
        name: "typha_frame",
        run: typha_frame,
        dictionary: &[
            b"\0\0\0\x10",
            b"\0\0\x01\0",
            b"\x7f\xff\xff\xff",
            b"\x01",
            b"\x02",
            b"\x03",
            b"\x04",
            b"\x05",
            b"\x06",
            b"\x07",
            b"\x08",
            b"\x80",
            b"felix",
            b"bgp",
            b"snappy",
        ],
        max_len: 8 << 10,
    },
    Target {
        name: "selector",
        run: selector,
        dictionary: &[
            b"==",
            b"!=",
            b" in ",
            b" not in ",
            b"has(",
            b")",
            b"all()",
            b"global()",
            b"!",
            b"&&",
            b"||",
            b"contains",
            b"starts with",
            b"ends with",
            b"{",
            b"}",
            b"'",
            b"\"",
            b",",
            b"projectcalico.org/",
            b"(",
            b"a",
            b"k8s-app",
            b"\\",
            b" ",
        ],
        max_len: 4 << 10,
    },
    Target {
        name: "resource",
        run: resource,
        dictionary: &[
            b"apiVersion: projectcalico.org/v3\n",
            b"kind: ",
            b"metadata:\n",
            b"  name: ",
            b"spec:\n",
            b"---\n",
            b"&a ",
            b"*a",
            b"<<: ",
            b"!!str ",
            b"!!binary ",
            b"[",
            b"]",
            b"{",
            b"}",
            b": ",
            b"- ",
            b"\"",
            b"'",
            b"|\n",
            b">-\n",
            b"#",
            b"null",
            b"~",
            b"true",
            b"0x1",
            b"1e999",
            b"-1",
            b"NetworkPolicy",
            b"GlobalNetworkPolicy",
            b"IPPool",
            b"List",
            b"items",
            b"selector: ",
            b"networking.k8s.io/v1",
            b"cidr: 10.0.0.0/8",
            b"ports: [80, \"1:2\"]",
            b"\\u0000",
            b"\t",
            b"\r\n",
        ],
        max_len: 16 << 10,
    },
    Target {
        name: "cni_config",
        run: cni_config,
        dictionary: &[
            b"{",
            b"}",
            b"[",
            b"]",
            b",",
            b":",
            b"\"cniVersion\"",
            b"\"1.0.0\"",
            b"\"0.3.1\"",
            b"\"name\"",
            b"\"type\"",
            b"\"calico\"",
            b"\"ipam\"",
            b"\"calico-ipam\"",
            b"\"host-local\"",
            b"\"mtu\"",
            b"\"plugins\"",
            b"\"prevResult\"",
            b"\"datastore_type\"",
            b"\"kubernetes\"",
            b"\"feature_control\"",
            b"\"ipv4_pools\"",
            b"\"runtimeConfig\"",
            b"\"portMappings\"",
            b"null",
            b"true",
            b"-1",
            b"1e400",
            b"\"\\u0000\"",
        ],
        max_len: 16 << 10,
    },
    Target {
        name: "bird_reply",
        run: bird_reply,
        dictionary: &[
            b"0001 ",
            b"1002-",
            b"1006-",
            b"0000 ",
            b"0013 ",
            b"8001 ",
            b"9001 ",
            b"2002-",
            b" ",
            b"\n",
            b"BGP",
            b"Mesh_10_0_0_1",
            b"Node_10_0_0_2_port_179",
            b"Global_",
            b"Established",
            b"up",
            b"down",
            b"start",
            b"Neighbor address:",
            b"BGP state:",
            b"Last error:",
            b"2024-01-01",
            b"00:00:00",
            b"master4",
            b"\t",
        ],
        max_len: 16 << 10,
    },
];

fn class(parts: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    parts.hash(&mut h);
    h.finish()
}

/// Text with its variable parts (names, numbers) folded, so classes follow structure.
fn shape(text: &str) -> String {
    let mut out = String::new();
    let mut last = ' ';
    for c in text.chars().take(60) {
        let c = if c.is_alphanumeric() { 'a' } else { c };
        if !(c == 'a' && last == 'a') {
            out.push(c);
        }
        last = c;
    }
    out
}

/// Typha's frame decoder, with the client's limit and a small one: whatever decodes must
/// re-encode to the same message.
pub fn typha_frame(data: &[u8]) -> u64 {
    use margay_typha::proto;
    let mut outcome = Vec::new();
    for max in [300, proto::DEFAULT_MAX_CLIENT_INBOUND] {
        let (msgs, err) = proto::decode_stream(data, max);
        outcome.push((msgs.len(), err.as_ref().map(|e| shape(&e.to_string()))));
        for m in msgs {
            let again = proto::decode_stream(&proto::encode(&m, false), usize::MAX >> 8);
            assert_eq!(again, (vec![m], None), "re-encoding changed the message");
        }
    }
    let body = proto::decode_body(bytes::Bytes::copy_from_slice(data), 4096);
    class((
        outcome,
        body.map(|m| format!("{:?}", m.msg_type()))
            .map_err(|e| shape(&e.to_string())),
    ))
}

/// The selector parser: a canonical form parses, reaches a fixed point in one more round, and
/// matches as the original does; evaluation never panics.
///
/// (Not "canonical(canonical(s)) == canonical(s)": runs of `!` collapse to their parity as in
/// Calico, but a `!` outside parentheses does not collapse with one inside, so `!(!has(a))`
/// canonicalises to `!!has(a)`, which canonicalises to `has(a)`. The fuzzer found it.)
pub fn selector(data: &[u8]) -> u64 {
    use margay_selector::Selector;
    let Ok(text) = std::str::from_utf8(data) else {
        return 0;
    };
    match Selector::parse(text) {
        Err(e) => class(("err", shape(&e.to_string()))),
        Ok(sel) => {
            let canonical = sel.canonical().to_string();
            let reparse = |c: &str| {
                Selector::parse(c)
                    .unwrap_or_else(|e| panic!("canonical form {c:?} does not parse: {e}"))
            };
            let again = reparse(&canonical);
            let fixed = reparse(again.canonical());
            assert_eq!(
                fixed.canonical(),
                again.canonical(),
                "canonical form of {canonical:?} does not settle"
            );
            assert_eq!(
                fixed.unique_id(),
                again.unique_id(),
                "unique id does not settle"
            );
            let labels: BTreeMap<&str, &str> = [
                ("a", "b"),
                ("k8s-app", "x"),
                ("projectcalico.org/namespace", "default"),
            ]
            .into_iter()
            .collect();
            let m = sel.matches(&labels);
            assert_eq!(
                again.matches(&labels),
                m,
                "re-parsed selector matches differently"
            );
            assert_eq!(
                fixed.matches(&labels),
                m,
                "re-parsed selector matches differently"
            );
            class(("ok", shape(&canonical), m))
        }
    }
}

/// The resource decoder (YAML and JSON, several documents, list kinds): every decoded resource
/// validates without panicking, and a valid one survives encode → decode unchanged.
pub fn resource(data: &[u8]) -> u64 {
    use margay_api::codec::{decode_documents, decode_one, to_json};
    let Ok(text) = std::str::from_utf8(data) else {
        return 0;
    };
    match decode_documents(text) {
        Err(e) => class(("syntax", shape(&e.to_string()))),
        Ok(docs) => {
            let mut outcome = Vec::new();
            for d in docs {
                match d.result {
                    Err(e) => outcome.push(shape(&e.to_string())),
                    Ok(r) => {
                        let valid = r.validate().is_ok();
                        if valid {
                            let json = to_json(&r, false).unwrap_or_else(|e| {
                                panic!("a valid resource does not encode: {e}")
                            });
                            let back = decode_one(&json).unwrap_or_else(|e| {
                                panic!("its own encoding does not decode: {e}: {json}")
                            });
                            assert_eq!(back, r, "encode → decode changed the resource: {json}");
                        }
                        outcome.push(format!("{:?}/{valid}", r.kind()));
                    }
                }
            }
            class(("docs", outcome))
        }
    }
}

/// The CNI network configuration parser.
pub fn cni_config(data: &[u8]) -> u64 {
    let _ = margay_cni::config::sniff_version(data);
    match margay_cni::config::parse_netconf(data) {
        Ok(p) => {
            let keys: Vec<&String> = p
                .raw
                .as_object()
                .map(|o| o.keys().collect())
                .unwrap_or_default();
            class(("ok", keys))
        }
        Err(e) => class(("err", e.code, shape(&e.msg))),
    }
}

/// BIRD's control-socket replies and what is read from them.
pub fn bird_reply(data: &[u8]) -> u64 {
    use margay_bird::protocols::{Protocol, ProtocolDetail, bgp_peers};
    let text = String::from_utf8_lossy(data);
    match margay_bird::reply::split_replies(&text) {
        Err(e) => class(("err", shape(&e.to_string()))),
        Ok(replies) => {
            let mut outcome = Vec::new();
            for r in &replies {
                let table = Protocol::parse_table(r);
                let peers = table.as_ref().map(|t| bgp_peers(t).len()).unwrap_or(0);
                let detail = ProtocolDetail::parse(r).map(|d| d.is_some());
                let _ = margay_bird::status::Status::parse(r);
                outcome.push((r.code(), table.is_ok(), peers.min(3), detail.is_ok()));
            }
            outcome.sort_unstable();
            outcome.dedup();
            class(("ok", outcome))
        }
    }
}

/// Frames of every message type, for `fuzz/corpus/typha_frame` (`margay-fuzz --write-typha-seeds`).
pub fn typha_seeds() -> Vec<Vec<u8>> {
    use margay_typha::proto::{self, ClientHello, Kv, Message, ServerHello, UpdateKind};
    let msgs = [
        Message::ClientHello(ClientHello {
            min_version: 1,
            max_version: 2,
            hostname: "node1".into(),
            info: "margay felix 0.1.0".into(),
            syncer_type: "felix".into(),
            compression: vec!["snappy".into()],
            capabilities: vec!["migrate".into()],
        }),
        Message::ServerHello(ServerHello {
            version: 2,
            syncer_type: "bgp".into(),
            server_id: "10.0.0.1:5473/1".into(),
            compression: "snappy".into(),
            capabilities: vec![],
        }),
        Message::Error {
            code: "overloaded".into(),
            message: "too many connections".into(),
        },
        Message::Kvs(vec![
            Kv {
                key: "/calico/resources/v3/projectcalico.org/ippools/default".into(),
                value: Some(bytes::Bytes::from_static(b"{\"kind\":\"IPPool\"}")),
                revision: 42,
                kind: UpdateKind::New,
            },
            Kv {
                key: "/calico/resources/v3/projectcalico.org/ippools/old".into(),
                value: None,
                revision: 43,
                kind: UpdateKind::Deleted,
            },
        ]),
        Message::SyncStatus {
            status: margay_datastore::SyncStatus::InSync,
            as_of: 43,
        },
        Message::Ping(7),
        Message::Pong(7),
        Message::Migrate {
            grace_ms: 5000,
            reason: "rebalancing".into(),
        },
    ];
    let mut out: Vec<Vec<u8>> = msgs
        .iter()
        .map(|m| proto::encode(m, false).to_vec())
        .collect();
    // A compressed KV batch, and a stream of several frames.
    out.push(proto::encode(&msgs[3], true).to_vec());
    out.push(
        msgs.iter()
            .flat_map(|m| proto::encode(m, false).to_vec())
            .collect(),
    );
    out
}
