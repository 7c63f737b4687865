use super::*;
use proptest::prelude::*;
use serde_json::json;

fn svc(v: serde_json::Value) -> KubeService {
    serde_json::from_value(v).expect("service decodes")
}

fn slice(v: serde_json::Value) -> KubeEndpointSlice {
    serde_json::from_value(v).expect("slice decodes")
}

fn web() -> KubeService {
    svc(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "type": "NodePort",
            "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
            "externalIPs": ["192.0.2.7"],
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http", "nodePort": 30080},
                {"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 5353}
            ]
        }
    }))
}

fn ep(
    addr: &str,
    node: &str,
    ready: Option<bool>,
    serving: Option<bool>,
    term: Option<bool>,
) -> serde_json::Value {
    let mut c = serde_json::Map::new();
    if let Some(r) = ready {
        c.insert("ready".into(), json!(r));
    }
    if let Some(s) = serving {
        c.insert("serving".into(), json!(s));
    }
    if let Some(t) = term {
        c.insert("terminating".into(), json!(t));
    }
    json!({"addresses": [addr], "conditions": c, "nodeName": node})
}

fn web_slice(name: &str, http_port: u16, eps: Vec<serde_json::Value>) -> KubeEndpointSlice {
    slice(json!({
        "metadata": {"name": name, "namespace": "default",
                      "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [
            {"name": "http", "protocol": "TCP", "port": http_port},
            {"name": "dns", "protocol": "UDP", "port": 5353}
        ]
    }))
}

fn be(addr: &str, port: u16) -> Backend {
    Backend {
        addr: addr.parse().expect("ip"),
        port,
    }
}

fn http_id() -> ServicePortId {
    ServicePortId {
        namespace: "default".into(),
        name: "web".into(),
        port_name: "http".into(),
        protocol: PortProtocol::Tcp,
    }
}

fn ports(idx: &ServiceIndex) -> BTreeMap<ServicePortId, ServicePort> {
    idx.ports_of("default", "web")
}

#[test]
fn frontends_and_named_target_ports_resolved_per_slice() {
    let mut idx = ServiceIndex::new("node-a");
    idx.on_service("default", "web", Some(&web()))
        .expect("service");
    idx.on_endpoint_slice(
        "default",
        "web-1",
        Some(&web_slice(
            "web-1",
            8080,
            vec![ep("10.0.0.1", "node-a", None, None, None)],
        )),
    )
    .expect("slice 1");
    // Pods of another revision name their port differently: another slice, another number.
    idx.on_endpoint_slice(
        "default",
        "web-2",
        Some(&web_slice(
            "web-2",
            9090,
            vec![ep("10.0.0.2", "node-b", Some(true), None, None)],
        )),
    )
    .expect("slice 2");
    let p = ports(&idx);
    assert_eq!(p.len(), 2);
    let http = &p[&http_id()];
    assert_eq!(http.node_port, Some(30080));
    assert_eq!(
        http.frontends,
        vec![
            Frontend {
                kind: FrontendKind::ClusterIp,
                addr: "10.96.0.10".parse().expect("ip"),
                port: 80
            },
            Frontend {
                kind: FrontendKind::ExternalIp,
                addr: "192.0.2.7".parse().expect("ip"),
                port: 80
            },
        ]
    );
    assert_eq!(
        http.cluster_backends,
        vec![be("10.0.0.1", 8080), be("10.0.0.2", 9090)]
    );
    assert_eq!(http.local_backends, vec![be("10.0.0.1", 8080)]);
    let dns = p
        .values()
        .find(|p| p.node_port.is_none())
        .expect("dns port");
    assert_eq!(
        dns.cluster_backends,
        vec![be("10.0.0.1", 5353), be("10.0.0.2", 5353)]
    );
}

#[test]
fn ready_first_then_serving_terminating_then_none() {
    let mut idx = ServiceIndex::new("node-a");
    idx.on_service("default", "web", Some(&web()))
        .expect("service");
    let eps = vec![
        ep("10.0.0.1", "node-a", Some(true), None, None),
        ep("10.0.0.2", "node-b", Some(false), Some(true), Some(true)),
        ep("10.0.0.3", "node-b", Some(false), Some(false), Some(false)),
    ];
    idx.on_endpoint_slice("default", "s", Some(&web_slice("s", 80, eps)))
        .expect("slice");
    assert_eq!(
        ports(&idx)[&http_id()].cluster_backends,
        vec![be("10.0.0.1", 80)]
    );

    // No ready endpoint: the serving-and-terminating ones carry the traffic.
    let eps = vec![
        ep("10.0.0.1", "node-a", Some(false), Some(false), Some(true)),
        ep("10.0.0.2", "node-b", Some(false), Some(true), Some(true)),
        ep("10.0.0.3", "node-b", Some(false), Some(true), Some(false)),
    ];
    idx.on_endpoint_slice("default", "s", Some(&web_slice("s", 80, eps)))
        .expect("slice");
    let p = &ports(&idx)[&http_id()];
    assert_eq!(p.cluster_backends, vec![be("10.0.0.2", 80)]);
    assert!(
        p.local_backends.is_empty(),
        "node-a's endpoint is not serving"
    );

    // None usable: the port stays, with no backends (the dataplane rejects).
    idx.on_endpoint_slice("default", "s", Some(&web_slice("s", 80, vec![])))
        .expect("slice");
    let p = &ports(&idx)[&http_id()];
    assert!(p.cluster_backends.is_empty() && p.local_backends.is_empty());
}

#[test]
fn traffic_policies_and_affinity() {
    let mut s = web();
    s.spec.type_ = Some("LoadBalancer".into());
    s.spec.external_traffic_policy = Some("Local".into());
    s.spec.internal_traffic_policy = Some("Local".into());
    s.spec.session_affinity = Some("ClientIP".into());
    s.status.load_balancer.ingress = vec![KubeLbIngress {
        ip: Some("198.51.100.1".into()),
    }];
    let mut idx = ServiceIndex::new("node-b");
    idx.on_service("default", "web", Some(&s)).expect("service");
    let eps = vec![
        ep("10.0.0.1", "node-a", None, None, None),
        ep("10.0.0.2", "node-b", None, None, None),
    ];
    idx.on_endpoint_slice("default", "s", Some(&web_slice("s", 80, eps)))
        .expect("slice");
    let p = &ports(&idx)[&http_id()];
    assert_eq!(p.affinity_timeout, Some(DEFAULT_AFFINITY_TIMEOUT));
    assert_eq!(p.external_backends(), &[be("10.0.0.2", 80)]);
    assert_eq!(p.internal_backends(), &[be("10.0.0.2", 80)]);
    assert!(
        p.frontends
            .iter()
            .any(|f| f.kind == FrontendKind::LoadBalancer)
    );

    s.spec.session_affinity_config = Some(KubeAffinityConfig {
        client_ip: Some(KubeClientIpConfig {
            timeout_seconds: Some(86_401),
        }),
    });
    let e = idx
        .on_service("default", "web", Some(&s))
        .expect_err("timeout refused");
    assert!(e.to_string().contains("timeoutSeconds"), "{e}");
    assert!(
        ports(&idx).is_empty(),
        "an unusable service counts as absent"
    );
}

#[test]
fn skipped_services_program_nothing() {
    for (field, value) in [
        ("clusterIP", json!("None")),
        ("type", json!("ExternalName")),
    ] {
        let mut v = json!({"metadata": {"name": "web", "namespace": "default"},
                           "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}});
        v["spec"][field] = value;
        if field == "clusterIP" {
            v["spec"]["clusterIPs"] = json!(["None"]);
        }
        let mut idx = ServiceIndex::new("n");
        idx.on_service("default", "web", Some(&svc(v)))
            .expect("service");
        assert!(ports(&idx).is_empty(), "{field}");
    }
    let mut other = web();
    other
        .metadata
        .labels
        .insert(LABEL_SERVICE_PROXY_NAME.into(), "foo".into());
    let mut idx = ServiceIndex::new("n");
    idx.on_service("default", "web", Some(&other))
        .expect("service");
    assert!(ports(&idx).is_empty());
}

#[test]
fn hostile_objects_are_refused_with_the_field() {
    let mut idx = ServiceIndex::new("n");
    let mut s = web();
    s.spec.cluster_ips = vec!["10.96.0.300".into()];
    let e = idx
        .on_service("default", "web", Some(&s))
        .expect_err("bad ip");
    assert_eq!(e.field, "spec.clusterIPs[0]");
    let mut s = web();
    s.spec.ports[0].port = 70_000;
    let e = idx
        .on_service("default", "web", Some(&s))
        .expect_err("bad port");
    assert_eq!(e.field, "spec.ports[0].port");
    let many: Vec<serde_json::Value> = (0..=MAX_SLICE_ENDPOINTS)
        .map(|i| {
            ep(
                &format!("10.1.{}.{}", i / 250, i % 250),
                "n",
                None,
                None,
                None,
            )
        })
        .collect();
    let e = idx
        .on_endpoint_slice("default", "big", Some(&web_slice("big", 80, many)))
        .expect_err("too many endpoints");
    assert_eq!(e.field, "endpoints");
    let mut bad = web_slice("s", 80, vec![ep("nonsense", "n", None, None, None)]);
    bad.metadata.name = "s".into();
    let e = idx
        .on_endpoint_slice("default", "s", Some(&bad))
        .expect_err("bad address");
    assert!(e.to_string().contains("EndpointSlice default/s"), "{e}");
}

#[test]
fn flush_emits_only_changed_ports() {
    let mut idx = ServiceIndex::new("node-a");
    idx.on_service("default", "web", Some(&web()))
        .expect("service");
    let mut out = Vec::new();
    idx.flush(&mut out);
    assert_eq!(out.len(), 2, "{out:?}");
    out.clear();
    // The http port's target changes; dns keeps its backends? No: both gain the endpoint.
    idx.on_endpoint_slice(
        "default",
        "s",
        Some(&web_slice(
            "s",
            80,
            vec![ep("10.0.0.1", "x", None, None, None)],
        )),
    )
    .expect("slice");
    idx.flush(&mut out);
    assert_eq!(out.len(), 2);
    out.clear();
    // Only the http number changes: only the http port is sent.
    idx.on_endpoint_slice(
        "default",
        "s",
        Some(&web_slice(
            "s",
            81,
            vec![ep("10.0.0.1", "x", None, None, None)],
        )),
    )
    .expect("slice");
    idx.flush(&mut out);
    assert!(
        matches!(&out[..], [ServiceChange::Update(id, p)] if *id == http_id() && p.cluster_backends == vec![be("10.0.0.1", 81)]),
        "{out:?}"
    );
    out.clear();
    idx.flush(&mut out);
    assert!(out.is_empty(), "an idle flush emits nothing");
    idx.on_service("default", "web", None).expect("delete");
    idx.flush(&mut out);
    assert_eq!(
        out.iter()
            .filter(|c| matches!(c, ServiceChange::Remove(_)))
            .count(),
        2
    );
}

#[test]
fn ip_set_members_are_serving_endpoints_with_slice_ports() {
    let mut idx = ServiceIndex::new("n");
    let eps = vec![
        ep("10.0.0.1", "n", None, None, None),
        ep("10.0.0.2", "n", Some(false), Some(false), None),
    ];
    idx.on_endpoint_slice("default", "s", Some(&web_slice("s", 8080, eps)))
        .expect("slice");
    assert!(
        idx.ip_set_members("default", "web").is_empty(),
        "no service yet"
    );
    idx.on_service("default", "web", Some(&web()))
        .expect("service");
    let m: Vec<String> = idx
        .ip_set_members("default", "web")
        .iter()
        .map(|m| m.to_string())
        .collect();
    assert_eq!(m, vec!["10.0.0.1,tcp:8080", "10.0.0.1,udp:5353"]);
}

// ---- properties ----------------------------------------------------------------------

fn arb_slice(i: usize) -> impl Strategy<Value = (String, KubeEndpointSlice)> {
    (
        proptest::collection::vec(
            (
                0u8..6,
                0u8..3,
                any::<Option<bool>>(),
                any::<Option<bool>>(),
                any::<Option<bool>>(),
            ),
            0..5,
        ),
        prop_oneof![Just("web"), Just("other")],
        70u16..73,
    )
        .prop_map(move |(eps, svc, port)| {
            let name = format!("s{i}");
            let eps = eps
                .into_iter()
                .map(|(a, n, r, s, t)| ep(&format!("10.0.0.{a}"), &format!("node-{n}"), r, s, t))
                .collect();
            let mut sl = web_slice(&name, port, eps);
            sl.metadata
                .labels
                .insert(LABEL_SERVICE_NAME.into(), svc.into());
            (name, sl)
        })
}

proptest! {
    /// The model depends on the current objects only: any order of the same updates, and
    /// flushes in between, end in the same dataplane state, and that state is what the
    /// deltas add up to.
    #[test]
    fn order_independent_and_deltas_add_up(
        slices in proptest::collection::vec((0usize..4).prop_flat_map(arb_slice), 0..8),
        etp_local in any::<bool>(),
        flush_every in 1usize..4,
        seed in any::<u64>(),
    ) {
        let mut s = web();
        if etp_local {
            s.spec.external_traffic_policy = Some("Local".into());
        }
        let mut a = ServiceIndex::new("node-1");
        let mut applied: BTreeMap<ServicePortId, Arc<ServicePort>> = BTreeMap::new();
        let mut out = Vec::new();
        a.on_service("default", "web", Some(&s)).expect("service");
        for (i, (name, sl)) in slices.iter().enumerate() {
            a.on_endpoint_slice("default", name, Some(sl)).expect("slice");
            if i % flush_every == 0 {
                a.flush(&mut out);
            }
        }
        a.flush(&mut out);
        for c in out.drain(..) {
            match c {
                ServiceChange::Update(id, p) => { applied.insert(id, p); }
                ServiceChange::Remove(id) => { prop_assert!(applied.remove(&id).is_some()); }
            }
        }
        // From scratch, last value per slice name, in a shuffled order.
        let mut last: BTreeMap<&String, &KubeEndpointSlice> = BTreeMap::new();
        for (n, sl) in &slices { last.insert(n, sl); }
        let mut order: Vec<_> = last.into_iter().collect();
        let k = order.len().max(1);
        order.rotate_left((seed as usize) % k);
        let mut b = ServiceIndex::new("node-1");
        for (n, sl) in order { b.on_endpoint_slice("default", n, Some(sl)).expect("slice"); }
        b.on_service("default", "web", Some(&s)).expect("service");
        let want = b.ports_of("default", "web");
        let got: BTreeMap<ServicePortId, ServicePort> =
            applied.iter().map(|(k, v)| (k.clone(), (**v).clone())).collect();
        prop_assert_eq!(&got, &want);
        prop_assert_eq!(a.ip_set_members("default", "web"), b.ip_set_members("default", "web"));
        for p in want.values() {
            // Local backends are this node's; the backends are distinct and sorted.
            prop_assert!(p.cluster_backends.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(p.local_backends.windows(2).all(|w| w[0] < w[1]));
            prop_assert_eq!(p.external_backends().len(), if etp_local { p.local_backends.len() } else { p.cluster_backends.len() });
        }
        // Deleting everything empties the model.
        a.on_service("default", "web", None).expect("delete");
        a.flush(&mut out);
        for c in out.drain(..) {
            if let ServiceChange::Remove(id) = c { applied.remove(&id); }
        }
        prop_assert!(applied.is_empty());
    }
}
