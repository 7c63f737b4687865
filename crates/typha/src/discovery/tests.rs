#![allow(clippy::unwrap_used)]
use super::*;
use serde_json::json;

/// Keeps the order (Fisher–Yates with j = i swaps nothing).
struct Identity;
impl RandomSource for Identity {
    fn below(&mut self, n: usize) -> usize {
        n - 1
    }
}

/// Always picks the first: a rotation of the input.
struct Zero;
impl RandomSource for Zero {
    fn below(&mut self, _n: usize) -> usize {
        0
    }
}

fn ep(addrs: &[&str], node: Option<&str>, ready: Option<bool>) -> Value {
    let mut e = json!({ "addresses": addrs });
    if let Some(n) = node {
        e["nodeName"] = json!(n);
    }
    if let Some(r) = ready {
        e["conditions"] = json!({ "ready": r });
    }
    e
}

fn slice(ports: Value, endpoints: Vec<Value>) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "calico-typha-abcde", "namespace": "kube-system",
                     "labels": {"kubernetes.io/service-name": "calico-typha"}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": endpoints,
    })
}

fn typha_port() -> Value {
    json!([{"name": "calico-typha", "port": 5473, "protocol": "TCP"}])
}

fn svc() -> ServiceRef {
    ServiceRef::new("", "calico-typha")
}

fn addrs(r: &[TyphaEndpoint]) -> Vec<&str> {
    r.iter().map(|t| t.addr.as_str()).collect()
}

#[test]
fn service_defaults() {
    let s = svc();
    assert_eq!(s.namespace, "kube-system");
    assert_eq!(s.port_name, "calico-typha");
    assert_eq!(s.to_string(), "kube-system/calico-typha");
    assert_eq!(
        s.label_selector(),
        "kubernetes.io/service-name=calico-typha"
    );
}

#[test]
fn choice_table() {
    struct Case {
        name: &'static str,
        slices: Vec<Value>,
        node: &'static str,
        want: Result<Vec<&'static str>, &'static str>,
    }
    let cases = vec![
        Case {
            name: "local first, then the others in slice order",
            slices: vec![slice(
                typha_port(),
                vec![
                    ep(&["10.0.0.1"], Some("n1"), Some(true)),
                    ep(&["10.0.0.2"], Some("n2"), None),
                    ep(&["10.0.0.3"], Some("n3"), Some(true)),
                ],
            )],
            node: "n2",
            want: Ok(vec!["10.0.0.2:5473", "10.0.0.1:5473", "10.0.0.3:5473"]),
        },
        Case {
            name: "explicitly unready endpoints are skipped; unknown readiness counts as ready",
            slices: vec![slice(
                typha_port(),
                vec![
                    ep(&["10.0.0.1"], Some("n1"), Some(false)),
                    ep(&["10.0.0.2"], Some("n2"), None),
                ],
            )],
            node: "n1",
            want: Ok(vec!["10.0.0.2:5473"]),
        },
        Case {
            name: "only the port named calico-typha, in each slice",
            slices: vec![
                slice(
                    json!([{"name": "metrics", "port": 9093}]),
                    vec![ep(&["10.0.0.9"], Some("n1"), None)],
                ),
                slice(
                    json!([{"name": "metrics", "port": 9093}, {"name": "calico-typha", "port": 6000}]),
                    vec![ep(&["10.0.0.1"], Some("n1"), None)],
                ),
            ],
            node: "n1",
            want: Ok(vec!["10.0.0.1:6000"]),
        },
        Case {
            name: "several addresses, IPv6 bracketed, duplicates across slices once",
            slices: vec![
                slice(
                    typha_port(),
                    vec![ep(&["fd00::1", "10.0.0.1"], Some("n1"), None)],
                ),
                slice(typha_port(), vec![ep(&["10.0.0.1"], Some("n1"), None)]),
            ],
            node: "n9",
            want: Ok(vec!["[fd00::1]:5473", "10.0.0.1:5473"]),
        },
        Case {
            name: "no node name: nothing is local",
            slices: vec![slice(
                typha_port(),
                vec![
                    ep(&["10.0.0.1"], None, None),
                    ep(&["10.0.0.2"], Some("n2"), None),
                ],
            )],
            node: "",
            want: Ok(vec!["10.0.0.1:5473", "10.0.0.2:5473"]),
        },
        Case {
            name: "no slices",
            slices: vec![],
            node: "n1",
            want: Err(
                "no ready endpoints for service kube-system/calico-typha with a port named calico-typha: no EndpointSlice in namespace kube-system is labelled kubernetes.io/service-name=calico-typha",
            ),
        },
        Case {
            name: "every endpoint unready",
            slices: vec![slice(
                typha_port(),
                vec![ep(&["10.0.0.1"], Some("n1"), Some(false))],
            )],
            node: "n1",
            want: Err("1 endpoint(s) not ready"),
        },
        Case {
            name: "no port of that name",
            slices: vec![slice(
                json!([{"name": "typha", "port": 5473}, {"port": 1}]),
                vec![ep(&["10.0.0.1"], None, None)],
            )],
            node: "n1",
            want: Err("1 without a port named calico-typha (ports: typha, (unnamed))"),
        },
        Case {
            name: "a port number that is not one",
            slices: vec![slice(
                json!([{"name": "calico-typha", "port": 70000}]),
                vec![ep(&["10.0.0.1"], None, None)],
            )],
            node: "n1",
            want: Err("1 EndpointSlice(s), 1 whose port calico-typha has no valid number"),
        },
        Case {
            name: "a slice without endpoints, and a malformed one",
            slices: vec![slice(typha_port(), vec![]), json!({"ports": "x"})],
            node: "n1",
            want: Err("2 EndpointSlice(s), 1 unreadable, no endpoint addresses"),
        },
        Case {
            name: "null lists (as the API sends them)",
            slices: vec![json!({"ports": null, "endpoints": null})],
            node: "n1",
            want: Err("1 without a port named calico-typha (ports: none)"),
        },
    ];
    for c in cases {
        let got = choose_typhas(&c.slices, &svc(), c.node, &mut Identity);
        match (&got, &c.want) {
            (Ok(g), Ok(w)) => assert_eq!(addrs(g), *w, "{}", c.name),
            (Err(e), Err(w)) => {
                let text = e.to_string();
                assert!(text.contains(w), "{}: {text}", c.name);
                assert!(text.starts_with("no ready endpoints for service kube-system/calico-typha with a port named calico-typha: "), "{}: {text}", c.name);
            }
            _ => panic!("{}: got {got:?}, want {:?}", c.name, c.want),
        }
    }
}

#[test]
fn local_and_remote_are_shuffled_separately() {
    let slices = vec![slice(
        typha_port(),
        vec![
            ep(&["10.0.0.1"], Some("me"), None),
            ep(&["10.0.0.2"], Some("me"), None),
            ep(&["10.0.0.3"], Some("n3"), None),
            ep(&["10.0.0.4"], Some("n4"), None),
            ep(&["10.0.0.5"], Some("n5"), None),
        ],
    )];
    // Zero rotates each group; the local ones still come first.
    let got = choose_typhas(&slices, &svc(), "me", &mut Zero).unwrap();
    assert_eq!(
        addrs(&got),
        [
            "10.0.0.2:5473",
            "10.0.0.1:5473",
            "10.0.0.4:5473",
            "10.0.0.5:5473",
            "10.0.0.3:5473"
        ]
    );
    assert!(got[0].local && got[1].local && !got[2].local);
    // A real source visits every order of the remote group, and never puts a remote first.
    let mut rng = Rng::seeded(7);
    let mut firsts = HashSet::new();
    for _ in 0..200 {
        let got = choose_typhas(&slices, &svc(), "me", &mut rng).unwrap();
        assert!(got[0].local && got[1].local, "{got:?}");
        firsts.insert(got[2].addr.clone());
    }
    assert_eq!(firsts.len(), 3, "{firsts:?}");
}

#[test]
fn describe_and_disjoint() {
    let slices = vec![slice(
        typha_port(),
        vec![
            ep(&["10.0.0.1"], Some("me"), None),
            ep(&["10.0.0.2"], Some("n2"), None),
            ep(&["10.0.0.3"], None, None),
        ],
    )];
    let d = Discovered {
        service: svc(),
        typhas: choose_typhas(&slices, &svc(), "me", &mut Identity).unwrap(),
    };
    assert_eq!(
        d.describe(),
        "10.0.0.1:5473 (this node), 10.0.0.2:5473 (node n2), 10.0.0.3:5473"
    );
    let other = Discovered {
        service: svc(),
        typhas: d.typhas[2..].to_vec(),
    };
    assert!(!d.disjoint(&other));
    let moved = Discovered {
        service: svc(),
        typhas: vec![TyphaEndpoint {
            addr: "10.0.9.9:5473".into(),
            ip: "10.0.9.9".into(),
            node: None,
            local: false,
        }],
    };
    assert!(d.disjoint(&moved));
}

#[test]
fn typhas_are_counted_as_calico_does() {
    let slices = vec![
        slice(
            typha_port(),
            vec![
                ep(&["10.0.0.1"], Some("n1"), None),
                // Unready Typhas count: they will be back.
                ep(&["10.0.0.2"], Some("n2"), Some(false)),
            ],
        ),
        // The same IP in another slice (another address family's, another port) is one.
        slice(typha_port(), vec![ep(&["10.0.0.1"], Some("n1"), None)]),
        // A slice without the port does not count.
        slice(
            json!([{"name": "other", "port": 1}]),
            vec![ep(&["10.0.0.7"], None, None)],
        ),
        json!({"garbage": true, "endpoints": 3}),
    ];
    assert_eq!(count_typhas(&slices, "calico-typha"), 2);
    assert_eq!(count_typhas(&slices, "other"), 1);
    assert_eq!(count_typhas(&[], "calico-typha"), 0);
}

#[test]
fn nodes_are_counted_from_the_snapshot() {
    use crate::cache::Entry;
    let mut s = Snapshot::new();
    let entry = Entry {
        value: bytes::Bytes::from_static(b"{}"),
        revision: 1,
    };
    for k in [
        "/calico/resources/v3/projectcalico.org/ippools/p",
        "/calico/resources/v3/projectcalico.org/nodes/a",
        "/calico/resources/v3/projectcalico.org/nodes/b",
        "/calico/resources/v3/projectcalico.org/nodesx",
        "/calico/resources/v3/projectcalico.org/profiles/x",
    ] {
        s.insert(Arc::from(k), entry.clone());
    }
    assert_eq!(count_nodes(&s), 2);
    assert_eq!(count_nodes(&Snapshot::new()), 0);
}
