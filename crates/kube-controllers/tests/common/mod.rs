//! A cluster for the tests: margay's Kubernetes API server double (Calico's CRDs installed),
//! a kubeconfig for it, helpers to make Kubernetes objects and IPAM allocations as the CNI
//! plugin does, and the daemon started against it.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use margay_api::duration::Duration as ApiDuration;
use margay_api::ippool::IPPoolSpec;
use margay_api::{IPPool, KubeControllersConfiguration, ObjectMeta, Resource};
use margay_apiserver::{ApiServer, Gvr, PatchType, ServerOptions, StoreHandle};
use margay_datastore::{AnyBackend, Client, DatastoreConfig, DatastoreType, KubeSettings};
use margay_ipam::{AssignArgs, Ipam};
use margay_kube_controllers::config::{DatastoreKind, EnvSettings, default_spec};
use margay_kube_controllers::daemon::{Daemon, DaemonOptions};
use serde_json::{Value, json};
use tempfile::TempDir;

pub const PODS: Gvr<'static> = Gvr::core("pods");
pub const NODES: Gvr<'static> = Gvr::core("nodes");
pub const NAMESPACES: Gvr<'static> = Gvr::core("namespaces");

pub struct Cluster {
    pub api: ApiServer,
    pub dir: TempDir,
    pub kubeconfig: PathBuf,
}

impl Cluster {
    pub fn start() -> Cluster {
        let api = ApiServer::start(ServerOptions {
            calico_crds: true,
            ..Default::default()
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).unwrap();
        // The double has the `default` namespace already.
        Cluster {
            api,
            dir,
            kubeconfig,
        }
    }

    pub fn store(&self) -> StoreHandle {
        self.api.store()
    }

    pub fn kube_settings(&self) -> KubeSettings {
        KubeSettings {
            kubeconfig: vec![self.kubeconfig.clone()],
            interface_prefix: "cali".into(),
            ..KubeSettings::default()
        }
    }

    /// The Kubernetes datastore on this cluster.
    pub fn kube_datastore(&self) -> DatastoreConfig {
        DatastoreConfig {
            datastore_type: DatastoreType::Kubernetes,
            kube: self.kube_settings(),
            ..DatastoreConfig::default()
        }
    }

    pub fn add_node(&self, name: &str) {
        self.store()
            .create(NODES, "", json!({"metadata": {"name": name}}))
            .unwrap();
    }

    pub fn delete_node(&self, name: &str) {
        self.store().delete(NODES, "", name).unwrap();
    }

    pub fn add_namespace(&self, name: &str, labels: Value) {
        self.store()
            .create(
                NAMESPACES,
                "",
                json!({"metadata": {"name": name, "labels": labels}}),
            )
            .unwrap();
    }

    /// A scheduled pod without addresses yet (the kubelet is about to call the CNI plugin).
    pub fn add_pod(&self, ns: &str, name: &str, node: &str) {
        self.store()
            .create(
                PODS,
                ns,
                json!({
                    "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
                    "status": {"phase": "Pending"},
                }),
            )
            .unwrap();
    }

    /// The kubelet reports the pod's address.
    pub fn set_pod_ip(&self, ns: &str, name: &str, ip: IpAddr) {
        self.store()
            .patch_status(
                PODS,
                ns,
                name,
                PatchType::Merge,
                &json!({"status": {"phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]}}),
            )
            .unwrap();
    }

    pub fn delete_pod(&self, ns: &str, name: &str) {
        self.store().delete(PODS, ns, name).unwrap();
    }
}

pub async fn connect(cfg: &DatastoreConfig) -> AnyBackend {
    cfg.connect().await.unwrap()
}

pub async fn create_pool(kv: &AnyBackend, cidr: &str, block_size: u8) {
    Client::new(kv.clone())
        .create(Resource::from(IPPool::new(
            ObjectMeta::named("pool1"),
            IPPoolSpec {
                cidr: cidr.into(),
                block_size: Some(i64::from(block_size)),
                ..IPPoolSpec::default()
            },
        )))
        .await
        .unwrap();
}

/// The KubeControllersConfiguration `default` with a leak grace period.
pub async fn create_kcc(kv: &AnyBackend, grace: &str) {
    let mut spec = default_spec();
    if let Some(n) = spec.controllers.node.as_mut() {
        n.leak_grace_period = Some(ApiDuration::new(grace));
    }
    Client::new(kv.clone())
        .create(Resource::from(KubeControllersConfiguration::new(
            ObjectMeta::named("default"),
            spec,
        )))
        .await
        .unwrap();
}

pub fn handle_of(pod: &str) -> String {
    format!("k8s-pod-network.{pod}-cid")
}

/// CNI ADD's IPAM step: one IPv4 address for the pod, with Calico's attributes.
pub async fn assign(ipam: &Ipam<AnyBackend>, node: &str, ns: &str, pod: &str) -> IpAddr {
    let mut args = AssignArgs::new(handle_of(pod), node);
    args.attrs = BTreeMap::from([
        ("node".to_string(), node.to_string()),
        ("namespace".to_string(), ns.to_string()),
        ("pod".to_string(), pod.to_string()),
    ]);
    ipam.auto_assign(&args).await.unwrap().v4[0].ip
}

pub fn daemon_options(
    datastore: DatastoreConfig,
    kind: DatastoreKind,
    env: &[(&str, &str)],
    dir: &std::path::Path,
) -> DaemonOptions {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    DaemonOptions {
        datastore,
        kind,
        env: EnvSettings::from_lookup(|k| env.get(k).cloned()),
        status_file: Some(dir.join("status.json")),
        health_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        log_level: None,
        gc_min_interval: Duration::from_millis(100),
        auto_hep_period: Duration::from_millis(200),
    }
}

/// `GET /metrics` of the daemon.
pub async fn metrics(d: &Daemon) -> String {
    let addr = d.metrics_addr(Duration::from_secs(30)).await.unwrap();
    let (code, body) = margay_kube_controllers::http::get(addr, "/metrics")
        .await
        .unwrap();
    assert_eq!(code, 200);
    body
}

/// Polls `f` every 50 ms until it returns Some, for at most `limit`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `ip` is allocated to `handle`.
pub async fn holds(ipam: &Ipam<AnyBackend>, handle: &str, ip: IpAddr) -> bool {
    ipam.ips_by_handle(handle)
        .await
        .unwrap()
        .iter()
        .any(|a| a.ip == ip)
}

/// `margay ctl ipam check`'s verdict: every allocation has a user (a pod's endpoint or a node
/// tunnel address) and every user's address is allocated, once.
pub async fn ipam_check(kv: &AnyBackend) -> margay_ipam::CheckReport {
    use margay_api::Kind;
    use margay_api::net::Cidr;
    let ipam = Ipam::new(kv.clone());
    let client = Client::new(kv.clone());
    let blocks = ipam.blocks().await.unwrap();
    let handles = ipam.handles().await.unwrap();
    let pools = ipam.pools().await.unwrap();
    let mut users = margay_ipam::Users::default();
    for r in client
        .list(Kind::WorkloadEndpoint, None, "")
        .await
        .unwrap()
        .items
    {
        if let Resource::WorkloadEndpoint(w) = r {
            for n in &w.spec.ip_networks {
                users.add(
                    Cidr::parse_cidr_or_ip(n).unwrap().addr(),
                    format!("{}/{}", w.metadata.namespace, w.metadata.name),
                );
            }
        }
    }
    for r in client.list(Kind::Node, None, "").await.unwrap().items {
        if let Resource::Node(n) = r {
            for a in [
                &n.spec.ipv4_vxlan_tunnel_addr,
                &n.spec.ipv6_vxlan_tunnel_addr,
            ] {
                if let Ok(c) = Cidr::parse_cidr_or_ip(a) {
                    users.add(c.addr(), format!("node {}", n.metadata.name));
                }
            }
        }
    }
    let in_pools = |ip: IpAddr| pools.iter().any(|p| p.cidr.contains(ip));
    margay_ipam::check(&blocks, &handles, &users, &in_pools)
}
