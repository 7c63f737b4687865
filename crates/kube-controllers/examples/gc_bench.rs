//! IPAM garbage collection of 10k leaked addresses on the Kubernetes datastore (the API server
//! double over HTTPS, blocks/handles/affinities as Calico's custom resources, kube-rs as the
//! client), among 1k live pods whose addresses share the same blocks. Prints how long the
//! candidate scan and the confirming scan (re-check + releases) took, and checks that every
//! leaked address was released and not one live address was.
//!
//! `cargo run --release -p margay-kube-controllers --example gc_bench [LEAKED] [LIVE]`
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use margay_api::ippool::IPPoolSpec;
use margay_api::net::Cidr;
use margay_api::{IPPool, ObjectMeta, Resource};
use margay_apiserver::{ApiServer, Gvr, ServerOptions};
use margay_datastore::kube::KubeBackend;
use margay_datastore::kube::route::{NODES, PODS};
use margay_datastore::{AnyBackend, Client, KubeSettings};
use margay_ipam::block::AffinityState;
use margay_ipam::{AllocationBlock, BlockAffinity, Ipam, IpamHandle};
use margay_kube_controllers::config::DatastoreKind;
use margay_kube_controllers::informer::Informer;
use margay_kube_controllers::ipam_controller::{
    IpamController, IpamGcOptions, KubeView, node_projection, pod_projection,
};
use margay_kube_controllers::metrics::Metrics;
use serde_json::json;

const NODE_COUNT: usize = 10;
const BLOCK: u32 = 64;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let leaked = args.first().copied().unwrap_or(10_000);
    let live = args.get(1).copied().unwrap_or(1_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(leaked, live));
}

fn addr(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 64, 0, 0)) + i))
}

async fn run(leaked: usize, live: usize) {
    let api = ApiServer::start(ServerOptions {
        calico_crds: true,
        event_history: 200_000,
        ..ServerOptions::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let settings = KubeSettings {
        kubeconfig: vec![kubeconfig],
        interface_prefix: "cali".into(),
        ..KubeSettings::default()
    };
    let kube = KubeBackend::connect(&settings).await.unwrap();
    let kv = AnyBackend::Kube(kube.clone());
    Client::new(kv.clone())
        .create(Resource::from(IPPool::new(
            ObjectMeta::named("pool1"),
            IPPoolSpec {
                cidr: "10.64.0.0/12".into(),
                block_size: Some(26),
                ..IPPoolSpec::default()
            },
        )))
        .await
        .unwrap();

    // The cluster as the CNI plugin would have left it: every address with Calico's
    // attributes, live ones (every (total/live)-th) with a running pod, leaked ones without.
    let started = Instant::now();
    let total = (leaked + live) as u32;
    let stride = if live == 0 {
        u32::MAX
    } else {
        total / live as u32
    };
    let store = api.store();
    store
        .create_many(
            Gvr::core("nodes"),
            "",
            (0..NODE_COUNT).map(|n| json!({"metadata": {"name": format!("node-{n}")}})),
        )
        .unwrap();
    let mut blocks: Vec<AllocationBlock> = Vec::new();
    let mut handles = Vec::new();
    let mut pods = Vec::new();
    let mut live_set: BTreeMap<IpAddr, String> = BTreeMap::new();
    let mut live_left = live;
    for i in 0..total {
        let b = (i / BLOCK) as usize;
        let node = format!("node-{}", b % NODE_COUNT);
        if blocks.len() <= b {
            let cidr = Cidr::parse(&format!("{}/26", addr(i))).unwrap();
            blocks.push(AllocationBlock::new(cidr, Some(&node)));
        }
        let ip = addr(i);
        let pod = format!("pod-{i:06}");
        let handle = format!("k8s-pod-network.{pod}");
        let attrs = BTreeMap::from([
            ("node".to_string(), node.clone()),
            ("namespace".to_string(), "default".to_string()),
            ("pod".to_string(), pod.clone()),
        ]);
        blocks[b].assign_ip(ip, &handle, &attrs).unwrap();
        handles.push((handle.clone(), blocks[b].cidr));
        if live_left > 0 && i % stride == 0 {
            live_left -= 1;
            live_set.insert(ip, handle);
            pods.push(json!({
                "metadata": {"name": pod, "namespace": "default"},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]},
            }));
        }
    }
    let block_crs = blocks
        .iter()
        .map(|b| margay_kdd::ipam::block_to_cr(&serde_json::to_value(b).unwrap()).unwrap());
    store
        .create_many(Gvr::calico("ipamblocks"), "", block_crs)
        .unwrap();
    let aff = serde_json::to_value(BlockAffinity::new(AffinityState::Confirmed)).unwrap();
    store
        .create_many(
            Gvr::calico("blockaffinities"),
            "",
            blocks.iter().map(|b| {
                margay_kdd::ipam::affinity_to_cr(b.host().unwrap(), &b.cidr.to_string(), &aff)
                    .unwrap()
            }),
        )
        .unwrap();
    store
        .create_many(
            Gvr::calico("ipamhandles"),
            "",
            handles.iter().map(|(h, c)| {
                let rec = IpamHandle {
                    block: BTreeMap::from([(c.to_string(), 1)]),
                    ..IpamHandle::default()
                };
                margay_kdd::ipam::handle_to_cr(h, &serde_json::to_value(rec).unwrap()).unwrap()
            }),
        )
        .unwrap();
    store
        .create_many(Gvr::core("pods"), "default", pods)
        .unwrap();
    println!(
        "cluster: {} allocations in {} blocks on {NODE_COUNT} nodes ({} leaked, {} live pods), built in {:.2?}",
        total,
        blocks.len(),
        total as usize - live_set.len(),
        live_set.len(),
        started.elapsed()
    );

    let api_client = kube.api().clone();
    let pods = Arc::new(Informer::spawn(
        api_client.clone(),
        PODS,
        pod_projection("cali".into()),
        Vec::new(),
    ));
    let nodes = Arc::new(Informer::spawn(
        api_client.clone(),
        NODES,
        node_projection(),
        Vec::new(),
    ));
    pods.wait_synced().await;
    nodes.wait_synced().await;
    let grace = Duration::from_millis(500);
    let metrics = Arc::new(Metrics::default());
    let mut ctl = IpamController::new(
        kv.clone(),
        KubeView {
            api: api_client,
            pods,
            nodes,
        },
        IpamGcOptions::new(DatastoreKind::Kubernetes, Some(grace)),
        metrics.clone(),
    );

    let t = Instant::now();
    let first = ctl.sync().await.unwrap();
    let scan = t.elapsed();
    println!(
        "scan 1: {} allocations, {} leak candidates, {} released, in {scan:.2?}",
        first.scan.allocations,
        first.scan.flagged,
        first.released.len()
    );
    assert!(first.released.is_empty(), "nothing before the grace period");
    tokio::time::sleep(grace + Duration::from_millis(50)).await;
    let t = Instant::now();
    let second = ctl.sync().await.unwrap();
    let gc = t.elapsed();
    println!(
        "scan 2: {} confirmed, {} re-checked away, {} released in {gc:.2?} ({:.0} addresses/s), {} failed writes",
        second.scan.releases.len(),
        second.resurrected,
        second.released.len(),
        second.released.len() as f64 / gc.as_secs_f64(),
        second.failures
    );

    // Verify: the live addresses are all still allocated, to their handles, and nothing else is.
    let ipam = Ipam::new(kv.clone());
    let after = ipam.blocks().await.unwrap();
    let mut remaining = 0usize;
    let mut live_released = 0usize;
    let mut still_there: HashSet<IpAddr> = HashSet::new();
    for b in &after {
        for a in b.allocated() {
            remaining += 1;
            still_there.insert(a.ip);
            if live_set.get(&a.ip).map(String::as_str) != a.attribute.handle_id.as_deref() {
                println!(
                    "UNEXPECTED allocation left: {} ({:?})",
                    a.ip, a.attribute.handle_id
                );
            }
        }
    }
    for ip in live_set.keys() {
        if !still_there.contains(ip) {
            live_released += 1;
        }
    }
    let handles_left = ipam.handles().await.unwrap().len();
    println!(
        "after: {remaining} allocations and {handles_left} handles left; live addresses released: {live_released}; reclaimed (metric): {}",
        metrics.reclaimed_total()
    );
    let ok = live_released == 0
        && remaining == live_set.len()
        && second.released.len() == total as usize - live_set.len()
        && handles_left == live_set.len();
    println!(
        "RESULT: {} leaked addresses reclaimed in {gc:.2?} (target 10 s), {live_released} live addresses released: {}",
        second.released.len(),
        if ok && gc <= Duration::from_secs(10) {
            "PASS"
        } else {
            "FAIL"
        }
    );
    if !ok {
        std::process::exit(1);
    }
}
