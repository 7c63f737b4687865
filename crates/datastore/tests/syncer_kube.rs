//! The watcher syncer over the Kubernetes datastore, against margay's API-server double, through
//! the faults a real cluster's API server shows: watches closed by the server, compaction (410
//! Gone), the API server restarted mid-watch, and a burst of 10k pod changes. After each, the
//! syncer's view must equal a fresh list (keys and revisions), with no spurious delete and no
//! missed update.
#![allow(clippy::unwrap_used)]

mod syncer_common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use margay_api::{Kind, ResourceKey};
use margay_apiserver::{ApiServer, Gvr, PatchType, ServerOptions};
use margay_datastore::kube::KubeBackend;
use margay_datastore::syncer::SyncerStats;
use margay_datastore::{
    Client, KubeSettings, SyncerEvent, SyncerOptions, UpdateType, WatcherSyncer,
};
use serde_json::{Value, json};
use syncer_common::View;
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(30);
const KINDS: &[Kind] = &[
    Kind::WorkloadEndpoint,
    Kind::Profile,
    Kind::NetworkPolicy,
    Kind::Node,
];
const PODS: Gvr = Gvr::core("pods");
const NAMESPACES: Gvr = Gvr::core("namespaces");
const NODES: Gvr = Gvr::core("nodes");
const NETPOLS: Gvr = Gvr::new("networking.k8s.io", "v1", "networkpolicies");

fn pod(ns: &str, name: &str, node: &str, n: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": ns, "labels": {"app": "web", "gen": "0"},
            "annotations": {"cni.projectcalico.org/podIP": format!("10.{}.{}.{}/32", 60 + n / 65536, (n / 256) % 256, n % 256)},
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    })
}

fn netpol(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": {}}], "ports": [{"port": 80}]}]},
    })
}

fn server() -> ApiServer {
    ApiServer::start(ServerOptions {
        calico_crds: true,
        event_history: 100_000,
        ..ServerOptions::default()
    })
    .unwrap()
}

async fn backend(api: &ApiServer) -> KubeBackend {
    KubeBackend::connect(&KubeSettings {
        kubeconfig_inline: Some(api.kubeconfig_yaml()),
        ..KubeSettings::default()
    })
    .await
    .unwrap()
}

fn start(b: &KubeBackend) -> (mpsc::Receiver<SyncerEvent>, Arc<SyncerStats>) {
    let mut opts = SyncerOptions::new(KINDS.to_vec());
    opts.retry_delay = Duration::from_millis(50);
    opts.max_retry_delay = Duration::from_millis(500);
    let syncer = WatcherSyncer::new(b.clone(), opts);
    let stats = syncer.stats();
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(syncer.run(tx));
    (rx, stats)
}

/// Deletions the view received for each key, so a test can tell real ones from spurious ones.
#[derive(Default)]
struct Deletes(Vec<ResourceKey>);

/// Applies events until the view equals fresh lists of every kind; returns the keys deleted
/// on the way. Lists are compared only once the stream has been quiet for a moment.
async fn converge(
    view: &mut View,
    rx: &mut mpsc::Receiver<SyncerEvent>,
    client: &Client<KubeBackend>,
) -> Deletes {
    let deadline = Instant::now() + T;
    let mut deletes = Deletes::default();
    loop {
        // Drain until quiet.
        loop {
            match tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {
                Ok(Some(ev)) => {
                    if let SyncerEvent::Updates(us) = &ev {
                        deletes.0.extend(
                            us.iter()
                                .filter(|u| u.update_type == UpdateType::Deleted)
                                .map(|u| u.key.clone()),
                        );
                    }
                    view.apply(ev);
                }
                Ok(None) => panic!("syncer stopped"),
                Err(_) => break,
            }
            assert!(Instant::now() < deadline, "the syncer never went quiet");
        }
        let mut why = Vec::new();
        for kind in KINDS {
            if let Err(e) = view.matches_list(client, *kind).await {
                why.push(format!("{kind}: {e}"));
            }
        }
        if why.is_empty() && view.in_sync() {
            return deletes;
        }
        assert!(
            Instant::now() < deadline,
            "the syncer did not converge: {why:?}"
        );
    }
}

fn wep_key(ns: &str, node: &str, pod: &str) -> ResourceKey {
    ResourceKey {
        kind: Kind::WorkloadEndpoint,
        namespace: ns.into(),
        name: margay_kdd_name(node, pod),
    }
}

fn margay_kdd_name(node: &str, pod: &str) -> String {
    let d = |s: &str| s.replace('-', "--");
    format!("{}-k8s-{}-eth0", d(node), d(pod))
}

fn relabel(api: &ApiServer, ns: &str, name: &str, generation: u32) {
    api.store()
        .patch(
            PODS,
            ns,
            name,
            PatchType::Merge,
            &json!({"metadata": {"labels": {"gen": generation.to_string()}}}),
        )
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_syncer_converges_through_closed_watches_compaction_and_restarts() {
    let api = server();
    let store = api.store();
    for ns in ["a", "b"] {
        store
            .create(
                NAMESPACES,
                "",
                json!({"metadata": {"name": ns, "labels": {"team": ns}}}),
            )
            .unwrap();
        store
            .create(
                Gvr::core("serviceaccounts"),
                ns,
                json!({"metadata": {"name": "sa1", "namespace": ns}}),
            )
            .unwrap();
        store.create(NETPOLS, ns, netpol(ns, "web")).unwrap();
    }
    for node in ["n1", "n2"] {
        store
            .create(
                NODES,
                "",
                json!({"metadata": {"name": node}, "spec": {"podCIDR": "10.60.0.0/24"}}),
            )
            .unwrap();
    }
    for i in 0..200u32 {
        let ns = if i % 2 == 0 { "a" } else { "b" };
        let node = if i % 3 == 0 { "n1" } else { "n2" };
        store
            .create(PODS, ns, pod(ns, &format!("p-{i}"), node, i))
            .unwrap();
    }
    // A host-network pod has no endpoint; an unscheduled one has none yet.
    let mut host = pod("a", "host", "n1", 999);
    host["spec"]["hostNetwork"] = json!(true);
    store.create(PODS, "a", host).unwrap();
    let mut pending = pod("a", "pending", "n1", 998);
    pending["spec"].as_object_mut().unwrap().remove("nodeName");
    store.create(PODS, "a", pending).unwrap();

    let b = backend(&api).await;
    let client = Client::new(b.clone());
    let (mut rx, stats) = start(&b);
    let mut view = View::default();
    converge(&mut view, &mut rx, &client).await;
    let weps = view
        .items
        .keys()
        .filter(|k| k.kind == Kind::WorkloadEndpoint)
        .count();
    assert_eq!(weps, 200, "one endpoint per scheduled, pod-network pod");
    assert!(view.items.contains_key(&ResourceKey {
        kind: Kind::NetworkPolicy,
        namespace: "a".into(),
        name: "knp.default.web".into()
    }));
    // kns.a, kns.b, kns.default, kns.kube-system, kns.kube-public, ksa.a.sa1, ksa.b.sa1, default-allow.
    let profiles: HashSet<String> = view
        .items
        .keys()
        .filter(|k| k.kind == Kind::Profile)
        .map(|k| k.name.clone())
        .collect();
    for p in [
        "kns.a",
        "kns.b",
        "ksa.a.sa1",
        "ksa.b.sa1",
        "projectcalico-default-allow",
    ] {
        assert!(profiles.contains(p), "{p} missing from {profiles:?}");
    }
    let lists_after_sync = stats.resyncs.load(Ordering::Relaxed);

    // 1. The server ends every watch (its timeout, a load balancer): re-watched from the last
    //    version seen, no re-list, nothing missed.
    api.close_watches();
    for i in 0..20 {
        let ns = if i % 2 == 0 { "a" } else { "b" };
        relabel(&api, ns, &format!("p-{i}"), 1);
    }
    store.delete(PODS, "a", "p-100").unwrap();
    let d = converge(&mut view, &mut rx, &client).await;
    assert_eq!(
        d.0,
        vec![wep_key("a", "n2", "p-100")],
        "only the deleted pod's endpoint goes"
    );
    assert_eq!(
        stats.resyncs.load(Ordering::Relaxed),
        lists_after_sync,
        "a closed watch resumes; it does not re-list"
    );
    assert_eq!(view.redundant, 0);

    // 2. Compaction past the watchers' position (410 Gone): a re-list delivering differences only.
    api.close_watches();
    relabel(&api, "b", "p-21", 2);
    store.delete(PODS, "b", "p-23").unwrap();
    api.compact();
    api.close_watches();
    relabel(&api, "a", "p-22", 2);
    let d = converge(&mut view, &mut rx, &client).await;
    assert_eq!(
        d.0,
        vec![wep_key("b", "n2", "p-23")],
        "no spurious delete after 410"
    );
    assert!(
        stats.resyncs.load(Ordering::Relaxed) > lists_after_sync,
        "410 caused a re-list"
    );
    assert_eq!(view.redundant, 0, "a re-list sends only what changed");

    // 3. The API server restarts mid-watch; changes made meanwhile arrive once it is back.
    api.stop();
    relabel(&api, "a", "p-24", 3);
    store.delete(PODS, "a", "p-26").unwrap();
    store
        .create(PODS, "b", pod("b", "late", "n1", 500))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    api.start_again().unwrap();
    let d = converge(&mut view, &mut rx, &client).await;
    assert_eq!(d.0, vec![wep_key("a", "n2", "p-26")]);
    assert!(view.items.contains_key(&wep_key("b", "n1", "late")));

    // 4. Pod deletions that happen while listing in pages, and a new namespace's profile.
    store
        .create(NAMESPACES, "", json!({"metadata": {"name": "c"}}))
        .unwrap();
    let d = converge(&mut view, &mut rx, &client).await;
    assert!(d.0.is_empty());
    assert!(view.items.keys().any(|k| k.name == "kns.c"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_10k_pod_changes_arrives_whole() {
    let api = server();
    let store = api.store();
    store
        .create(NAMESPACES, "", json!({"metadata": {"name": "burst"}}))
        .unwrap();
    store
        .create(NODES, "", json!({"metadata": {"name": "n1"}}))
        .unwrap();
    let pods: Vec<Value> = (0..2000u32)
        .map(|i| pod("burst", &format!("p-{i}"), "n1", i))
        .collect();
    store.create_many(PODS, "burst", pods).unwrap();
    let b = backend(&api).await;
    let client = Client::new(b.clone());
    let (mut rx, _stats) = start(&b);
    let mut view = View::default();
    converge(&mut view, &mut rx, &client).await;

    // 10k changes: 4k relabels, 2k new pods, 1k deletions, 3k more relabels, with the
    // watches closed once in the middle.
    let started = Instant::now();
    for i in 0..4000u32 {
        relabel(&api, "burst", &format!("p-{}", i % 2000), 10 + i);
    }
    let news: Vec<Value> = (2000..4000u32)
        .map(|i| pod("burst", &format!("p-{i}"), "n1", i))
        .collect();
    store.create_many(PODS, "burst", news).unwrap();
    api.close_watches();
    let mut deleted = Vec::new();
    for i in (0..2000u32).step_by(2) {
        store.delete(PODS, "burst", &format!("p-{i}")).unwrap();
        deleted.push(wep_key("burst", "n1", &format!("p-{i}")));
    }
    for i in 0..3000u32 {
        relabel(
            &api,
            "burst",
            &format!("p-{}", 2000 + (i % 2000)),
            50_000 + i,
        );
    }
    let d = converge(&mut view, &mut rx, &client).await;
    let mut got = d.0.clone();
    got.sort_by(|a, b| a.name.cmp(&b.name));
    deleted.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(
        got, deleted,
        "exactly the deleted pods' endpoints were deleted"
    );
    assert_eq!(view.redundant, 0);
    eprintln!(
        "10k pod changes written and applied by the syncer in {:?}",
        started.elapsed()
    );
}
