//! 5. Typha: the only API watcher for its Felix and confd clients.

use super::*;

/// What one Typha client saw: key → revision, and whether it is in sync.
#[derive(Default)]
struct Seen {
    keys: BTreeMap<String, i64>,
    in_sync: bool,
}

/// The API resources the felix syncer needs on the Kubernetes datastore.
fn felix_syncer_resources() -> Vec<(&'static str, &'static str)> {
    let mut v = vec![
        ("", "pods"),
        ("", "namespaces"),
        ("", "serviceaccounts"),
        ("", "nodes"),
        ("networking.k8s.io", "networkpolicies"),
        // Services and EndpointSlices, for Felix's service proxy.
        ("", "services"),
        ("discovery.k8s.io", "endpointslices"),
    ];
    for plural in [
        "clusterinformations",
        "felixconfigurations",
        "ippools",
        "tiers",
        "globalnetworkpolicies",
        "networkpolicies",
        "hostendpoints",
        "networksets",
        "globalnetworksets",
        "ipamblocks",
        // Service CIDRs for ServiceLoopPrevention (Calico's felix syncer has it too).
        "bgpconfigurations",
    ] {
        v.push(("crd.projectcalico.org", plural));
    }
    v
}

#[test]
fn typha_is_the_only_api_watcher_for_fifty_felix_clients() {
    use margay_typha::SyncerType;
    use margay_typha::client::{self, ClientEvent, ClientOptions, ClientStats};

    let k = Cluster::start();
    k.seed();
    let s = k.store();
    let r = k.node_startup("node1", "10.0.0.1/24");
    assert_eq!(r.code, 0, "{r:?}");
    // Enough pods that a snapshot is more than a handful of keys.
    for i in 0..100 {
        s.create(
            PODS,
            "shop",
            pod(
                &format!("load-{i}"),
                if i % 2 == 0 { "node1" } else { "node2" },
                "load",
                None,
                IpVia::Status(&format!("10.66.{}.{}", i / 200, i % 200 + 1)),
            ),
        )
        .unwrap();
    }

    let port = margay_testkit::free_port().unwrap();
    let log = k.path("typha.log");
    let mut c = k.margay();
    c.args(["typha", "run", "-c"])
        .arg(k.path("typha.cfg"))
        .env("TYPHA_LOGFILEPATH", "none")
        .env("TYPHA_SERVERHOST", "127.0.0.1")
        .env("TYPHA_SERVERPORT", port.to_string())
        .env("TYPHA_SYNCERTYPES", "felix")
        .env("TYPHA_HEALTHENABLED", "false")
        .env("TYPHA_PROMETHEUSMETRICSENABLED", "false");
    let typha = Role::spawn("typha", c, log);

    // What the datastore holds for the felix syncer, as the binary sees it.
    let expected_weps = 103; // web-1, web-2, client-1 and 100 load pods

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let clients: Vec<(Arc<Mutex<Seen>>, Arc<ClientStats>)> = (0..50)
        .map(|i| {
            let seen = Arc::new(Mutex::new(Seen::default()));
            let stats = Arc::new(ClientStats::default());
            let mut opts =
                ClientOptions::new(vec![addr.clone()], format!("felix-{i}"), SyncerType::Felix);
            opts.backoff = Duration::from_millis(100);
            opts.max_backoff = Duration::from_millis(500);
            let (tx, mut rx) = tokio::sync::mpsc::channel(64);
            rt.spawn(client::run(opts, tx, stats.clone()));
            let sink = seen.clone();
            rt.spawn(async move {
                while let Some(ev) = rx.recv().await {
                    let mut s = sink.lock().unwrap();
                    match ev {
                        ClientEvent::Status(margay_datastore::SyncStatus::InSync) => {
                            s.in_sync = true
                        }
                        ClientEvent::Kvs(kvs) => {
                            for kv in kvs {
                                match kv.value {
                                    Some(_) => {
                                        s.keys.insert(kv.key, kv.revision);
                                    }
                                    None => {
                                        s.keys.remove(&kv.key);
                                    }
                                }
                            }
                        }
                        _ => {}
                    }
                }
            });
            (seen, stats)
        })
        .collect();

    let weps_of = |seen: &Seen| {
        seen.keys
            .keys()
            .filter(|k| k.contains("/workloadendpoints/"))
            .count()
    };
    wait_for("50 clients in sync with every pod", WAIT * 2, || {
        typha.assert_alive();
        let lagging: Vec<usize> = clients
            .iter()
            .enumerate()
            .filter(|(_, (seen, _))| {
                let s = seen.lock().unwrap();
                !s.in_sync || weps_of(&s) != expected_weps
            })
            .map(|(i, _)| i)
            .collect();
        if lagging.is_empty() {
            Ok(())
        } else {
            Err(format!("{} clients not there yet", lagging.len()))
        }
    });
    // Every client has the same, complete view: profiles, nodes, policies and config too.
    let first = clients[0].0.lock().unwrap().keys.clone();
    for needle in [
        "/profiles/kns.shop",
        "/profiles/ksa.shop.web-sa",
        "/profiles/projectcalico-default-allow",
        "/nodes/node1",
        "/nodes/node2",
        "/networkpolicies/shop/knp.default.allow-client",
        "/clusterinformations/default",
        "/felixconfigurations/default",
        "/ippools/default-ipv4-ippool",
    ] {
        assert!(
            first.keys().any(|k| k.ends_with(needle)),
            "{needle} missing from {:?}",
            first.keys().collect::<Vec<_>>()
        );
    }
    for (i, (seen, _)) in clients.iter().enumerate() {
        assert_eq!(seen.lock().unwrap().keys, first, "client {i} differs");
    }

    // Exactly one watch per API resource the felix syncer needs, whatever the number of
    // clients, and nothing else watched: Typha is the API server's only watcher. (Typha
    // serves its snapshot before its watches are all open, so they are waited for.)
    let want: BTreeMap<(String, String), usize> = felix_syncer_resources()
        .into_iter()
        .map(|(g, r)| ((g.to_string(), r.to_string()), 1))
        .collect();
    let open_watches = || -> BTreeMap<(String, String), usize> {
        k.api
            .stats()
            .open_watches
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect()
    };
    wait_for("Typha's watches", WAIT, || {
        let open = open_watches();
        if open == want {
            Ok(())
        } else {
            Err(format!("open watches {open:?}"))
        }
    });
    let stats = k.api.stats();
    // Each resource was listed by Typha once (the node start-up before it listed some too).
    let lists_before = stats.request_count("list", "", "pods");

    // A change reaches all 50 clients, through that one watch.
    s.create(
        PODS,
        "shop",
        pod("late", "node1", "web", None, IpVia::Status("10.65.0.99")),
    )
    .unwrap();
    wait_for("the new pod at every client", WAIT, || {
        let missing = clients
            .iter()
            .filter(|(seen, _)| weps_of(&seen.lock().unwrap()) != expected_weps + 1)
            .count();
        if missing == 0 {
            Ok(())
        } else {
            Err(format!("{missing} clients without it"))
        }
    });
    let stats = k.api.stats();
    assert_eq!(
        stats.request_count("list", "", "pods"),
        lists_before,
        "no client made Typha list again"
    );
    assert_eq!(
        open_watches(),
        want,
        "open watches; log:\n{}",
        tail(&typha.log(), 30)
    );
    // Not one watch request more than those: nothing watched per client, nothing re-watched.
    for (g, r) in want.keys() {
        assert_eq!(
            stats.request_count("watch", g, r),
            1,
            "watch requests on {g}/{r}"
        );
    }

    // The API server restarts: Typha watches again (still one watch per resource, the old
    // ones gone), and what changed meanwhile reaches every client without a client resync.
    k.api.stop();
    std::thread::sleep(Duration::from_millis(300));
    s.delete(PODS, "shop", "late").unwrap();
    k.api.start_again().unwrap();
    wait_for("the deletion at every client", WAIT, || {
        typha.assert_alive();
        let behind = clients
            .iter()
            .filter(|(seen, _)| weps_of(&seen.lock().unwrap()) != expected_weps)
            .count();
        if behind == 0 {
            Ok(())
        } else {
            Err(format!("{behind} clients still have it"))
        }
    });
    wait_for("Typha's watches after the restart", WAIT, || {
        let open = open_watches();
        if open == want {
            Ok(())
        } else {
            Err(format!("open watches {open:?}"))
        }
    });
    for (_, cs) in &clients {
        assert_eq!(
            cs.resyncs.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "a client resynced"
        );
    }
    drop(rt);
}

/// The API resources the bgp syncer needs that the felix syncer does not.
const BGP_ONLY_RESOURCES: [&str; 3] = ["bgppeers", "bgpfilters", "blockaffinities"];

#[test]
fn felix_and_confd_sync_through_typha_which_alone_watches_the_api() {
    let k = Cluster::start();
    k.seed();
    let s = k.store();
    for (node, ip) in [("node1", "10.0.0.1/24"), ("node2", "10.0.0.2/24")] {
        let r = k.node_startup(node, ip);
        assert_eq!(r.code, 0, "{r:?}");
    }
    let port = margay_testkit::free_port().unwrap();
    let log = k.path("typha.log");
    let mut c = k.margay();
    c.args(["typha", "run", "-c"])
        .arg(k.path("typha.cfg"))
        .env("TYPHA_LOGFILEPATH", "none")
        .env("TYPHA_SERVERHOST", "127.0.0.1")
        .env("TYPHA_SERVERPORT", port.to_string())
        .env("TYPHA_HEALTHENABLED", "false")
        .env("TYPHA_PROMETHEUSMETRICSENABLED", "false");
    let typha = Role::spawn("typha", c, log);
    let addr = format!("127.0.0.1:{port}");

    // Felix and confd get everything from Typha: their kubeconfig leads nowhere.
    let nowhere = k.path("no-such-kubeconfig");
    let mut felix = Felix::start(
        &k,
        "node1",
        &[
            ("FELIX_TYPHAADDR", addr.as_str()),
            ("KUBECONFIG", nowhere.to_str().unwrap()),
        ],
    );
    let cfg = k.path("confd");
    let log = k.path("confd.log");
    let mut c = k.margay();
    c.args([
        "confd",
        "--nodename",
        "node1",
        "--no-reload",
        "--config-dir",
    ])
    .arg(&cfg)
    .env("FELIX_TYPHAADDR", &addr)
    .env("KUBECONFIG", &nowhere);
    let confd = Role::spawn("confd", c, log);

    felix.wait("node1's pods through Typha", |st| {
        let ids: Vec<String> = endpoints(st).into_keys().collect();
        if ids == ["k8s/shop/web-1/eth0", "k8s/shop/web-2/eth0"] {
            Ok(())
        } else {
            Err(format!("endpoints {ids:?}"))
        }
    });
    let bird = || std::fs::read_to_string(cfg.join("bird.cfg")).unwrap_or_default();
    let own_block = s
        .list(Gvr::calico("blockaffinities"), None, "")
        .unwrap()
        .into_iter()
        .find(|a| a["spec"]["node"] == "node1")
        .map(|a| a["spec"]["cidr"].as_str().unwrap().to_string())
        .unwrap();
    wait_for("confd's config through Typha", WAIT, || {
        confd.assert_alive();
        typha.assert_alive();
        let b = bird();
        if b.contains("protocol bgp Mesh_10_0_0_2 from bgp_template")
            && b.contains(&format!("route {own_block} blackhole;"))
        {
            Ok(())
        } else {
            Err(format!("{b}\nconfd log: {}", tail(&confd.log(), 10)))
        }
    });

    // Typha is the only watcher: one watch per API resource and syncer type (nodes, pools and
    // BGP configurations are in both the felix and the bgp syncer, as in Calico's Typha), none
    // from Felix or confd.
    let mut want: BTreeMap<(String, String), usize> = felix_syncer_resources()
        .into_iter()
        .map(|(g, r)| ((g.to_string(), r.to_string()), 1))
        .collect();
    for r in BGP_ONLY_RESOURCES {
        want.insert(("crd.projectcalico.org".into(), r.into()), 1);
    }
    for r in [
        ("", "nodes"),
        ("crd.projectcalico.org", "ippools"),
        ("crd.projectcalico.org", "bgpconfigurations"),
    ] {
        want.insert((r.0.into(), r.1.into()), 2);
    }
    wait_for("Typha's watches", WAIT, || {
        let open: BTreeMap<(String, String), usize> = k
            .api
            .stats()
            .open_watches
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect();
        if open == want {
            Ok(())
        } else {
            Err(format!("open watches {open:?}"))
        }
    });

    // Changes reach both through Typha.
    s.create(
        PODS,
        "shop",
        pod("web-3", "node1", "web", None, IpVia::Status("10.65.0.4")),
    )
    .unwrap();
    let peer = k.file(
        "peer.yaml",
        "apiVersion: projectcalico.org/v3\nkind: BGPPeer\nmetadata: {name: tor}\nspec: {peerIP: 10.0.0.254, asNumber: 65000}\n",
    );
    k.ctl_ok(&["apply", "-f", &peer]);
    felix.wait("web-3 through Typha", |st| {
        if endpoints(st).contains_key("k8s/shop/web-3/eth0") {
            Ok(())
        } else {
            Err("no web-3".into())
        }
    });
    wait_for("the BGPPeer through Typha", WAIT, || {
        confd.assert_alive();
        let b = bird();
        if b.contains("protocol bgp Global_10_0_0_254 from bgp_template") {
            Ok(())
        } else {
            Err(format!("{b}\nconfd log: {}", tail(&confd.log(), 10)))
        }
    });
    bird_accepts(&cfg.join("bird.cfg"));
}
