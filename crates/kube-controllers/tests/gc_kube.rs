//! IPAM garbage collection and node clean-up against the Kubernetes API server double with the
//! Kubernetes datastore (IPAM blocks, affinities and handles as Calico's custom resources).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use margay_api::net::Cidr;
use margay_ipam::{HostLock, Ipam, ReleaseIp};
use margay_kube_controllers::config::DatastoreKind;
use margay_kube_controllers::daemon::Daemon;
use margay_kube_controllers::metrics::sample;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_deleted_without_cni_del_is_released_after_the_grace_period() {
    let c = Cluster::start();
    let kv = connect(&c.kube_datastore()).await;
    create_pool(&kv, "10.20.0.0/16", 26).await;
    let grace = Duration::from_secs(3);
    create_kcc(&kv, "3s").await;
    c.add_node("n1");
    let ipam = Ipam::new(kv.clone());
    let mut ips = BTreeMap::new();
    for pod in ["live", "leak"] {
        c.add_pod("default", pod, "n1");
        let ip = assign(&ipam, "n1", "default", pod).await;
        c.set_pod_ip("default", pod, ip);
        ips.insert(pod, ip);
    }
    // A pod whose addresses are not reported yet holds its allocation.
    c.add_pod("default", "starting", "n1");
    let starting = assign(&ipam, "n1", "default", "starting").await;
    // A second block of n1, empty (claimed for an address since released).
    let spare = Cidr::parse("10.20.250.0/26").unwrap();
    ipam.assign_ip(nth(spare, 1), "tmp", &BTreeMap::new(), "n1")
        .await
        .unwrap();
    ipam.release_ips(&[ReleaseIp {
        ip: nth(spare, 1),
        sequence_number: None,
    }])
    .await
    .unwrap();
    let main_block = ipam.ips_by_handle(&handle_of("live")).await.unwrap()[0].block;

    let d = Daemon::start(daemon_options(
        c.kube_datastore(),
        DatastoreKind::Kubernetes,
        &[("ENABLED_CONTROLLERS", "node")],
        c.dir.path(),
    ))
    .await
    .unwrap();
    let run = d.run_config(Duration::from_secs(30)).await.unwrap();
    assert_eq!(run.controllers.node.unwrap().leak_grace_period, Some(grace));
    // The first scan sees three allocations in use and no candidate.
    wait_for("the first scan", Duration::from_secs(30), || async {
        let m = metrics(&d).await;
        (sample(
            &m,
            "ipam_allocations_in_use",
            Some(r#"ippool="pool1",node="n1""#),
        ) == Some(3.0))
        .then_some(())
    })
    .await;
    assert_eq!(
        sample(&metrics(&d).await, "ipam_allocations_gc_candidates", None),
        Some(0.0)
    );

    // The pod object goes; the CNI plugin's DEL never comes.
    let deleted = Instant::now();
    c.delete_pod("default", "leak");
    let leak_ip = ips["leak"];
    // Reported as a candidate while the grace period runs…
    wait_for("the candidate metric", Duration::from_secs(30), || async {
        let m = metrics(&d).await;
        (sample(
            &m,
            "ipam_allocations_gc_candidates",
            Some(r#"ippool="pool1",node="n1""#),
        ) == Some(1.0))
        .then_some(())
    })
    .await;
    assert!(holds(&ipam, &handle_of("leak"), leak_ip).await);
    // …then released, not before the grace period.
    wait_for("the release", Duration::from_secs(30), || async {
        (!holds(&ipam, &handle_of("leak"), leak_ip).await).then_some(())
    })
    .await;
    let took = deleted.elapsed();
    assert!(
        took >= grace,
        "released after {took:?}, grace period {grace:?}"
    );
    // Only that address: the live pod's and the starting pod's are still theirs.
    assert!(holds(&ipam, &handle_of("live"), ips["live"]).await);
    assert!(holds(&ipam, &handle_of("starting"), starting).await);
    assert!(
        ipam.handles()
            .await
            .unwrap()
            .iter()
            .all(|(h, _)| h != &handle_of("leak"))
    );
    wait_for(
        "the metrics after the release",
        Duration::from_secs(30),
        || async {
            let m = metrics(&d).await;
            let done = sample(
                &m,
                "ipam_allocations_gc_reclamations",
                Some(r#"ippool="pool1",node="n1""#),
            ) == Some(1.0)
                && sample(&m, "ipam_allocations_gc_candidates", None) == Some(0.0)
                && sample(&m, "ipam_allocations_in_use", None) == Some(2.0);
            done.then_some(())
        },
    )
    .await;

    // The empty block, empty for longer than the grace period, lost its affinity and went; the
    // node's other block, in use, stays.
    wait_for(
        "the empty block's release",
        Duration::from_secs(30),
        || async {
            let blocks = ipam.blocks().await.unwrap();
            (!blocks.iter().any(|b| b.cidr == spare)).then_some(blocks)
        },
    )
    .await;
    let affs = ipam.affinities().await.unwrap();
    assert!(!affs.iter().any(|(_, c, _)| *c == spare));
    assert!(affs.iter().any(|(h, c, _)| h == "n1" && *c == main_block));

    // Health: the status file and /readiness say ready.
    let addr = d.health_addr().unwrap();
    let (code, body) = margay_kube_controllers::http::get(addr, "/readiness")
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(c.dir.path().join("status.json")).unwrap()).unwrap();
    for k in ["Startup", "CalicoDatastore", "KubeAPIServer"] {
        assert_eq!(status["Readiness"][k]["Ready"], true, "{status}");
    }

    // A change of the resource is honoured while running.
    let client = margay_datastore::Client::new(kv.clone());
    let key = margay_api::ResourceKey {
        kind: margay_api::Kind::KubeControllersConfiguration,
        namespace: String::new(),
        name: "default".into(),
    };
    let Ok(margay_api::Resource::KubeControllersConfiguration(mut kcc)) = client.get(&key).await
    else {
        panic!("no KubeControllersConfiguration default")
    };
    // Its status says what runs (written through the custom resource's /status).
    let st = kcc.status.clone().expect("status written");
    assert_eq!(st.environment_vars["ENABLED_CONTROLLERS"], "node");
    assert_eq!(st.environment_vars["DATASTORE_TYPE"], "kubernetes");
    assert_eq!(
        st.running_config
            .unwrap()
            .controllers
            .node
            .unwrap()
            .leak_grace_period
            .unwrap()
            .as_str(),
        "3s"
    );
    if let Some(n) = kcc.spec.controllers.node.as_mut() {
        n.leak_grace_period = Some(margay_api::duration::Duration::new("7s"));
    }
    client.update(kcc.into()).await.unwrap();
    wait_for("the new grace period", Duration::from_secs(30), || async {
        let run = d.run_config(Duration::from_secs(1)).await?;
        (run.controllers.node?.leak_grace_period == Some(Duration::from_secs(7))).then_some(())
    })
    .await;
    d.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_node_loses_its_affinities_blocks_and_tunnel_address() {
    let c = Cluster::start();
    let kv = connect(&c.kube_datastore()).await;
    create_pool(&kv, "10.30.0.0/16", 26).await;
    // An hour: only the node-gone path can release anything in this test.
    create_kcc(&kv, "1h").await;
    c.add_node("n1");
    c.add_node("n2");
    let ipam = Ipam::new(kv.clone());
    let mut pod_ips = BTreeMap::new();
    for pod in ["a", "b"] {
        c.add_pod("default", pod, "n2");
        let ip = assign(&ipam, "n2", "default", pod).await;
        c.set_pod_ip("default", pod, ip);
        pod_ips.insert(pod, ip);
    }
    let n2_block = ipam.ips_by_handle(&handle_of("a")).await.unwrap()[0].block;
    // n2's VXLAN tunnel address, in its block.
    let tunnel = nth(n2_block, 10);
    ipam.assign_ip(
        tunnel,
        "vxlan-tunnel-addr-n2",
        &BTreeMap::from([
            ("node".to_string(), "n2".to_string()),
            ("type".to_string(), "vxlanTunnelAddress".to_string()),
        ]),
        "n2",
    )
    .await
    .unwrap();
    // A pod on n1 borrowed an address of n2's block: it must survive n2's clean-up.
    c.add_pod("default", "borrower", "n1");
    let borrowed = nth(n2_block, 20);
    ipam.assign_ip(
        borrowed,
        &handle_of("borrower"),
        &BTreeMap::from([
            ("node".to_string(), "n1".to_string()),
            ("namespace".to_string(), "default".to_string()),
            ("pod".to_string(), "borrower".to_string()),
        ]),
        "n1",
    )
    .await
    .unwrap();
    c.set_pod_ip("default", "borrower", borrowed);
    // A second, empty block of n2 (claimed, then its only address released).
    let other = Cidr::parse("10.30.200.0/26").unwrap();
    let tmp = nth(other, 1);
    ipam.assign_ip(tmp, "tmp", &BTreeMap::new(), "n2")
        .await
        .unwrap();
    ipam.release_ips(&[ReleaseIp {
        ip: tmp,
        sequence_number: None,
    }])
    .await
    .unwrap();
    let n2_blocks = || async {
        ipam.blocks()
            .await
            .unwrap()
            .into_iter()
            .filter(|b| b.host() == Some("n2"))
            .map(|b| b.cidr)
            .collect::<Vec<_>>()
    };
    assert_eq!(n2_blocks().await.len(), 2);

    let d = Daemon::start(daemon_options(
        c.kube_datastore(),
        DatastoreKind::Kubernetes,
        &[("ENABLED_CONTROLLERS", "node")],
        c.dir.path(),
    ))
    .await
    .unwrap();
    // While n2 exists nothing is touched (its empty block is not its last one, but the grace
    // period is an hour).
    wait_for("a scan", Duration::from_secs(30), || async {
        sample(
            &metrics(&d).await,
            "margay_kube_controllers_ipam_scans_total",
            None,
        )
        .filter(|n| *n >= 1.0)
    })
    .await;
    assert_eq!(n2_blocks().await.len(), 2);

    // The node goes, and its pods with it (no CNI DEL on a dead node).
    c.delete_pod("default", "a");
    c.delete_pod("default", "b");
    c.delete_node("n2");
    wait_for("n2's clean-up", Duration::from_secs(60), || async {
        let affs = ipam.affinities().await.unwrap();
        let done = !affs.iter().any(|(h, _, _)| h == "n2") && n2_blocks().await.is_empty();
        done.then_some(())
    })
    .await;
    // Its pods' and tunnel addresses are released; the borrowed address is still the borrower's.
    for (pod, ip) in &pod_ips {
        assert!(!holds(&ipam, &handle_of(pod), *ip).await, "{pod}");
    }
    assert!(
        ipam.ips_by_handle("vxlan-tunnel-addr-n2")
            .await
            .unwrap()
            .is_empty()
    );
    assert!(holds(&ipam, &handle_of("borrower"), borrowed).await);
    // The block holding it stays, affine to nobody; the empty one is gone.
    let blocks = ipam.blocks().await.unwrap();
    let kept = blocks.iter().find(|b| b.cidr == n2_block).unwrap();
    assert_eq!(kept.affinity, None);
    assert_eq!(kept.in_use(), 1);
    assert!(!blocks.iter().any(|b| b.cidr == other));
    let m = metrics(&d).await;
    assert_eq!(
        sample(
            &m,
            "ipam_allocations_gc_reclamations",
            Some(r#"ippool="pool1",node="n2""#)
        ),
        Some(3.0)
    );
    assert!(ipam_check(&kv).await.is_clean());
    d.stop().await.unwrap();
}

fn nth(block: Cidr, n: u32) -> IpAddr {
    match block.addr() {
        IpAddr::V4(a) => IpAddr::V4((u32::from(a) + n).into()),
        IpAddr::V6(_) => unreachable!("IPv4 pools only here"),
    }
}

/// 8 tasks create pods and assign their addresses as the CNI plugin does, and delete pods:
/// some with the CNI DEL (release, then delete), some without (a leak); meanwhile the
/// controller collects. No address of a live pod is ever released: before each release a
/// churner checks its pod still holds its address, at the end every live pod does, the
/// controller reclaimed exactly the leaked ones, and `ipam check` is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_churn_never_loses_a_live_address() {
    const CHURNERS: usize = 8;
    const ROUNDS: usize = 12;
    let c = Arc::new(Cluster::start());
    let kv = connect(&c.kube_datastore()).await;
    create_pool(&kv, "10.40.0.0/16", 26).await;
    create_kcc(&kv, "1s").await;
    for n in 0..4 {
        c.add_node(&format!("n{n}"));
    }
    let d = Daemon::start(daemon_options(
        c.kube_datastore(),
        DatastoreKind::Kubernetes,
        &[("ENABLED_CONTROLLERS", "node")],
        c.dir.path(),
    ))
    .await
    .unwrap();
    d.run_config(Duration::from_secs(30)).await.unwrap();

    let leaked = Arc::new(AtomicUsize::new(0));
    // One IPAM host lock per node, as the CNI plugin takes on each host.
    let locks: Vec<Arc<HostLock>> = (0..4)
        .map(|n| Arc::new(HostLock::new(c.dir.path().join(format!("ipam-n{n}.lock")))))
        .collect();
    let mut tasks = Vec::new();
    for w in 0..CHURNERS {
        let c = c.clone();
        let ipam =
            Ipam::new(connect(&c.kube_datastore()).await).with_host_lock(locks[w % 4].clone());
        let leaked = leaked.clone();
        tasks.push(tokio::spawn(async move {
            let node = format!("n{}", w % 4);
            let mut live: Vec<(String, IpAddr)> = Vec::new();
            for i in 0..ROUNDS {
                let pod = format!("w{w}-p{i}");
                c.add_pod("default", &pod, &node);
                let ip = assign(&ipam, &node, "default", &pod).await;
                c.set_pod_ip("default", &pod, ip);
                match (w + i) % 3 {
                    0 => live.push((pod, ip)),
                    1 => {
                        // CNI DEL: the address must still be the pod's, then it goes.
                        assert!(
                            holds(&ipam, &handle_of(&pod), ip).await,
                            "{pod}'s address {ip} was released while the pod was alive"
                        );
                        ipam.release_by_handle(&handle_of(&pod)).await.unwrap();
                        c.delete_pod("default", &pod);
                    }
                    _ => {
                        c.delete_pod("default", &pod);
                        leaked.fetch_add(1, Ordering::SeqCst);
                    }
                }
                // Now and then an older live pod goes the proper way.
                if i % 4 == 3 && !live.is_empty() {
                    let (pod, ip) = live.remove(0);
                    assert!(
                        holds(&ipam, &handle_of(&pod), ip).await,
                        "{pod}'s address {ip} was released while the pod was alive"
                    );
                    ipam.release_by_handle(&handle_of(&pod)).await.unwrap();
                    c.delete_pod("default", &pod);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (ipam, live)
        }));
    }
    let mut survivors = Vec::new();
    for t in tasks {
        let (ipam, live) = tokio::time::timeout(Duration::from_secs(240), t)
            .await
            .expect("churners finished in time")
            .unwrap();
        for (pod, ip) in live {
            survivors.push((ipam.clone(), pod, ip));
        }
    }
    let leaked = leaked.load(Ordering::SeqCst);
    assert!(leaked > 0 && !survivors.is_empty());
    // Every leak is reclaimed, and nothing else.
    let report = wait_for("every leak reclaimed", Duration::from_secs(120), || async {
        let r = ipam_check(&kv).await;
        r.leaked.is_empty().then_some(r)
    })
    .await;
    assert!(report.is_clean(), "{report:#?}");
    assert_eq!(report.allocated, survivors.len());
    for (ipam, pod, ip) in &survivors {
        assert!(holds(ipam, &handle_of(pod), *ip).await, "{pod} lost {ip}");
    }
    let reclaimed = wait_for("the reclamation count", Duration::from_secs(30), || async {
        let m = metrics(&d).await;
        sample(&m, "ipam_allocations_gc_reclamations", None).filter(|n| *n as usize >= leaked)
    })
    .await;
    assert_eq!(
        reclaimed as usize, leaked,
        "reclaimed exactly the leaked addresses"
    );
    assert_eq!(d.metrics.reclaimed_total() as usize, leaked);
    d.stop().await.unwrap();
}
