//! 8 processes × 200 concurrent assignments, on one host and on four hosts, against real etcd
//! and against the Kubernetes datastore (margay's API-server double: blocks, affinities and
//! handles as Calico's custom resources, every write conditional on a resourceVersion). Zero
//! duplicates, zero leaks, every handle accounted for.
//!
//! The worker processes are this test binary re-executed with `IPAM_WORKER` set (see
//! `worker`), so no extra binary is needed.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use margay_api::ippool::IPPoolSpec;
use margay_api::{IPPool, ObjectMeta, Resource};
use margay_datastore::config::EtcdConfig;
use margay_datastore::{AnyBackend, Client, DatastoreConfig, DatastoreType, KubeSettings};
use margay_ipam::{AssignArgs, HostLock, Ipam, Users, check};
use margay_testkit::etcd::EtcdServer;

const PROCESSES: usize = 8;
/// Assignments per process: against etcd, and against the API double (every request of the
/// Kubernetes datastore goes through the double and kube-rs, unoptimised in test builds).
const PER_PROCESS_ETCD: usize = 200;
const PER_PROCESS_KUBE: usize = 50;

/// Kills the workers if the test fails midway.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `etcd=<endpoint>` or `kube=<kubeconfig path>`.
async fn backend(store: &str) -> AnyBackend {
    let mut cfg = DatastoreConfig::default();
    match store.split_once('=') {
        Some(("etcd", endpoint)) => {
            cfg.datastore_type = DatastoreType::Etcd;
            cfg.etcd = EtcdConfig {
                endpoints: vec![endpoint.to_string()],
                ..EtcdConfig::default()
            };
        }
        Some(("kube", kubeconfig)) => {
            cfg.datastore_type = DatastoreType::Kubernetes;
            cfg.kube = KubeSettings {
                kubeconfig: vec![kubeconfig.into()],
                ..KubeSettings::default()
            };
        }
        _ => panic!("bad store {store}"),
    }
    cfg.connect().await.unwrap()
}

/// Run by the re-executed binary: `PER_PROCESS_*` concurrent assignments; prints
/// `handle ip` lines.
#[test]
#[ignore = "worker process for the concurrency tests"]
fn worker() {
    let Ok(spec) = std::env::var("IPAM_WORKER") else {
        return;
    };
    let mut parts = spec.split(',');
    let endpoint = parts.next().unwrap().to_string();
    let host = parts.next().unwrap().to_string();
    let proc_id = parts.next().unwrap().to_string();
    let lock_path = parts.next().unwrap().to_string();
    let per_process = if endpoint.starts_with("kube=") {
        PER_PROCESS_KUBE
    } else {
        PER_PROCESS_ETCD
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let ipam = Arc::new(
            Ipam::new(backend(&endpoint).await).with_host_lock(Arc::new(HostLock::new(lock_path))),
        );
        let mut tasks = Vec::new();
        for i in 0..per_process {
            let ipam = ipam.clone();
            let host = host.clone();
            let handle = format!("k8s-pod-network.p{proc_id}-{i}");
            tasks.push(tokio::spawn(async move {
                let mut args = AssignArgs::new(handle.clone(), host);
                args.num_v4 = 1;
                let got = ipam.auto_assign(&args).await.unwrap();
                (handle, got.v4[0].ip)
            }));
        }
        for t in tasks {
            let (handle, ip) = t.await.unwrap();
            println!("ASSIGNED {handle} {ip}");
        }
    });
}

fn run_workers(store: &str, hosts: usize, dir: &std::path::Path) -> BTreeMap<String, IpAddr> {
    let exe = std::env::current_exe().unwrap();
    let mut workers = Workers(Vec::new());
    for p in 0..PROCESSES {
        let host = format!("node-{}", p % hosts);
        let lock = dir.join(format!("{host}.lock"));
        let child = Command::new(&exe)
            .args([
                "--exact",
                "worker",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                "IPAM_WORKER",
                format!("{store},{host},{p},{}", lock.display()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        workers.0.push(child);
    }
    let mut assigned = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    for mut child in std::mem::take(&mut workers.0) {
        // Bounded: the workers are killed by the guard if this test panics.
        let out = loop {
            if child.try_wait().unwrap().is_some() {
                break child.wait_with_output().unwrap();
            }
            assert!(Instant::now() < deadline, "workers did not finish in time");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(out.status.success(), "worker failed: {:?}", out.status);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // libtest's own output may share the line: find the marker.
            let Some(pos) = line.find("ASSIGNED ") else {
                continue;
            };
            if let Some((handle, ip)) = line[pos + 9..].split_once(' ')
                && let Ok(ip) = ip.parse::<IpAddr>()
            {
                assert!(assigned.insert(handle.to_string(), ip).is_none());
            }
        }
    }
    assigned
}

/// A datastore for a scenario, alive as long as the value.
enum Store {
    Etcd(EtcdServer),
    // The server is held only to keep it running for the scenario.
    Kube(#[allow(dead_code)] margay_apiserver::ApiServer, TempDir),
}

impl Store {
    fn etcd() -> Store {
        Store::Etcd(EtcdServer::start().unwrap())
    }

    fn kube() -> Store {
        let api = margay_apiserver::ApiServer::start(margay_apiserver::ServerOptions {
            calico_crds: true,
            ..Default::default()
        })
        .unwrap();
        let dir = tempfile_dir();
        api.write_kubeconfig(&dir.path().join("kubeconfig"))
            .unwrap();
        Store::Kube(api, dir)
    }

    fn spec(&self) -> String {
        match self {
            Store::Etcd(s) => format!("etcd={}", s.endpoint()),
            Store::Kube(_, dir) => format!("kube={}", dir.path().join("kubeconfig").display()),
        }
    }
}

async fn scenario(store: Store, hosts: usize) {
    let spec = store.spec();
    let kv = backend(&spec).await;
    Client::new(kv.clone())
        .create(Resource::from(IPPool::new(
            ObjectMeta::named("pool"),
            IPPoolSpec {
                cidr: "10.10.0.0/16".into(),
                block_size: Some(24),
                ..IPPoolSpec::default()
            },
        )))
        .await
        .unwrap();
    let dir = tempfile_dir();
    let started = Instant::now();
    let worker_spec = spec.clone();
    let assigned = tokio::task::spawn_blocking(move || {
        let a = run_workers(&worker_spec, hosts, dir.path());
        drop(dir);
        a
    })
    .await
    .unwrap();
    eprintln!(
        "{} assignments by {PROCESSES} processes on {hosts} host(s) in {:?} ({})",
        assigned.len(),
        started.elapsed(),
        spec.split('=').next().unwrap_or_default()
    );
    let per_process = match store {
        Store::Etcd(_) => PER_PROCESS_ETCD,
        Store::Kube(..) => PER_PROCESS_KUBE,
    };
    assert_eq!(
        assigned.len(),
        PROCESSES * per_process,
        "every assignment answered"
    );
    let distinct: BTreeSet<&IpAddr> = assigned.values().collect();
    assert_eq!(
        distinct.len(),
        assigned.len(),
        "no address handed out twice"
    );

    let ipam = Ipam::new(kv);
    let blocks = ipam.blocks().await.unwrap();
    let stored: BTreeMap<String, IpAddr> = blocks
        .iter()
        .flat_map(|b| {
            b.allocated()
                .map(|a| (a.attribute.handle_id.clone().unwrap(), a.ip))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        stored, assigned,
        "the blocks hold exactly what was handed out"
    );
    let handles = ipam.handles().await.unwrap();
    assert_eq!(handles.len(), assigned.len());
    let mut users = Users::default();
    for (h, ip) in &assigned {
        users.add(*ip, h.clone());
    }
    let report = check(&blocks, &handles, &users, &|_| true);
    assert!(
        report.is_clean() && report.stale_handles.is_empty(),
        "{report:#?}"
    );
    // Blocks belong to the hosts that used them.
    let affinities = ipam.affinities().await.unwrap();
    let owners: BTreeSet<&String> = affinities.iter().map(|(h, _, _)| h).collect();
    assert_eq!(owners.len(), hosts);
    for b in &blocks {
        b.check().unwrap();
    }
    // Release everything concurrently (each host's releases serialised by its host lock,
    // as CNI DELs are): nothing left.
    let lock_dir = tempfile_dir();
    let per_host: Vec<Arc<Ipam<AnyBackend>>> = (0..hosts)
        .map(|h| {
            Arc::new(
                Ipam::new(ipam.backend().clone()).with_host_lock(Arc::new(HostLock::new(
                    lock_dir.path().join(format!("node-{h}.lock")),
                ))),
            )
        })
        .collect();
    let mut tasks = Vec::new();
    for (i, h) in assigned.keys().cloned().enumerate() {
        let ipam = per_host[i % hosts].clone();
        tasks.push(tokio::spawn(async move {
            ipam.release_by_handle(&h).await.unwrap().len()
        }));
    }
    let mut released = 0;
    for t in tasks {
        released += t.await.unwrap();
    }
    assert_eq!(released, assigned.len());
    let ipam = per_host[0].clone();
    assert!(ipam.handles().await.unwrap().is_empty());
    assert!(ipam.blocks().await.unwrap().iter().all(|b| b.is_empty()));
}

fn tempfile_dir() -> TempDir {
    let path = std::env::temp_dir().join(format!(
        "margay-ipam-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&path).unwrap();
    TempDir(path)
}

struct TempDir(std::path::PathBuf);

impl TempDir {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_eight_processes_on_one_host() {
    scenario(Store::etcd(), 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_eight_processes_on_four_hosts() {
    scenario(Store::etcd(), 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubernetes_eight_processes_on_one_host() {
    scenario(Store::kube(), 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubernetes_eight_processes_on_four_hosts() {
    scenario(Store::kube(), 4).await;
}
