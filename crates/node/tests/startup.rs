//! Start-up against the in-memory datastore with a fake host: what gets registered and
//! created, idempotence, conflicts, and the errors that name what to fix.
#![allow(clippy::unwrap_used, clippy::type_complexity)]

use std::net::IpAddr;
use std::path::Path;

use margay_api::net::Cidr;
use margay_api::{Kind, Node, ObjectMeta, Resource, ResourceKey};
use margay_datastore::{Client, MemBackend};
use margay_node::autodetect::{InterfaceInfo, NetView};
use margay_node::config::StartupConfig;
use margay_node::kubernetes::ClusterFacts;
use margay_node::startup::{
    ClusterSource, NameSource, Outcome, Paths, StartupError, StartupOptions, node_name, run,
    run_in_cluster,
};

struct FakeHost {
    interfaces: Vec<InterfaceInfo>,
}

impl NetView for FakeHost {
    fn interfaces(&self) -> std::io::Result<Vec<InterfaceInfo>> {
        Ok(self.interfaces.clone())
    }
    fn route_source(&self, _dest: IpAddr) -> std::io::Result<IpAddr> {
        Ok(self.interfaces[0].addrs[0].addr())
    }
}

fn iface(name: &str, index: u32, addrs: &[&str]) -> InterfaceInfo {
    InterfaceInfo {
        name: name.into(),
        index,
        up: true,
        addrs: addrs.iter().map(|a| Cidr::parse(a).unwrap()).collect(),
    }
}

fn host() -> FakeHost {
    FakeHost {
        interfaces: vec![
            iface("lo", 1, &["127.0.0.1/8", "::1/128"]),
            iface("docker0", 2, &["172.17.0.1/16"]),
            iface("eth0", 3, &["10.0.0.5/24", "fd00:10::5/64", "fe80::1/64"]),
            iface("cali1234", 4, &["169.254.1.1/32"]),
        ],
    }
}

fn opts() -> StartupOptions {
    StartupOptions {
        version: "v0.1.0-test".into(),
        wait_timeout: Some(std::time::Duration::from_secs(1)),
        kernel_has_ipv6: true,
        kubernetes_datastore: false,
    }
}

struct Env(Vec<(&'static str, String)>);

impl Env {
    fn new(vars: &[(&'static str, &str)]) -> Env {
        Env(vars.iter().map(|(k, v)| (*k, v.to_string())).collect())
    }
    fn get(&self, k: &str) -> Option<String> {
        self.0.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    }
    fn config(&self) -> StartupConfig {
        StartupConfig::from_lookup(&|k| self.get(k)).unwrap()
    }
}

async fn start(
    client: &Client<MemBackend>,
    root: &Path,
    env: &Env,
    name: &str,
    net: &FakeHost,
) -> Result<Outcome, StartupError> {
    run(&env.config(), name, client, net, &Paths::new(root), &opts()).await
}

async fn node(client: &Client<MemBackend>, name: &str) -> Node {
    match client
        .get(&ResourceKey {
            kind: Kind::Node,
            namespace: String::new(),
            name: name.into(),
        })
        .await
        .unwrap()
    {
        Resource::Node(n) => n,
        other => panic!("{other:?}"),
    }
}

async fn versions(client: &Client<MemBackend>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for kind in margay_api::Kind::ALL {
        for r in client.list(*kind, None, "").await.unwrap().items {
            out.push((r.key().to_string(), r.metadata().resource_version.clone()));
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn first_start_registers_everything_and_second_start_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new(MemBackend::new());
    let env = Env::new(&[]);
    let out = start(&client, dir.path(), &env, "node-a", &host())
        .await
        .unwrap();
    assert!(out.node_written);
    assert_eq!(out.ipv4.as_deref(), Some("10.0.0.5/24"));
    assert_eq!(out.ipv6, None, "IPv6 is off unless IP6 is set");

    let n = node(&client, "node-a").await;
    assert_eq!(n.spec.bgp.as_ref().unwrap().ipv4_address, "10.0.0.5/24");
    assert!(n.spec.interfaces.is_empty(), "IP unset: no interface list");
    // Pools, tiers and configuration.
    let pools = client.list(Kind::IPPool, None, "").await.unwrap().items;
    let cidrs: Vec<String> = pools
        .iter()
        .map(|p| match p {
            Resource::IPPool(p) => p.spec.cidr.clone(),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(cidrs.len(), 2, "{cidrs:?}");
    assert!(cidrs.contains(&"192.168.0.0/16".to_string()));
    assert!(
        cidrs
            .iter()
            .any(|c| c.starts_with("fd") && c.ends_with("/48")),
        "{cidrs:?}"
    );
    for (kind, name) in [
        (Kind::Tier, "default"),
        (Kind::Tier, "kube-admin"),
        (Kind::Tier, "kube-baseline"),
        (Kind::ClusterInformation, "default"),
        (Kind::FelixConfiguration, "default"),
        (Kind::FelixConfiguration, "node.node-a"),
        (Kind::BGPConfiguration, "default"),
        (Kind::IPAMConfiguration, "default"),
    ] {
        let key = ResourceKey {
            kind,
            namespace: String::new(),
            name: name.into(),
        };
        client
            .get(&key)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
    }
    let nodename = std::fs::read_to_string(dir.path().join("var/lib/calico/nodename")).unwrap();
    assert_eq!(nodename, "node-a");
    for d in ["var/lib/calico", "var/run/calico", "var/log/calico"] {
        assert!(dir.path().join(d).is_dir(), "{d}");
    }

    // Idempotent: same resourceVersions after a second run.
    let before = versions(&client).await;
    let again = start(&client, dir.path(), &env, "node-a", &host())
        .await
        .unwrap();
    assert!(!again.node_written);
    assert!(again.created.is_empty(), "{:?}", again.created);
    assert_eq!(versions(&client).await, before);
}

#[tokio::test]
async fn kubernetes_internal_ip_uses_the_nodes_internal_ip_and_its_interface_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new(MemBackend::new());
    // The Node as the Kubernetes datastore shows it: the kubelet's addresses, no BGP spec yet.
    let mut n = Node::new(ObjectMeta::named("node-k"), Default::default());
    n.spec.addresses = vec![
        margay_api::endpoint::NodeAddress {
            address: "203.0.113.9".into(),
            type_: "ExternalIP".into(),
        },
        margay_api::endpoint::NodeAddress {
            address: "10.0.0.5".into(),
            type_: "InternalIP".into(),
        },
    ];
    client.create(Resource::Node(n)).await.unwrap();
    let env = Env::new(&[
        ("IP", "autodetect"),
        ("IP_AUTODETECTION_METHOD", "kubernetes-internal-ip"),
    ]);
    let out = start(&client, dir.path(), &env, "node-k", &host())
        .await
        .unwrap();
    assert_eq!(out.ipv4.as_deref(), Some("10.0.0.5/24"));
    assert_eq!(
        node(&client, "node-k").await.spec.bgp.unwrap().ipv4_address,
        "10.0.0.5/24"
    );
    // A Node without an InternalIP (any datastore but Kubernetes'): a failure saying why.
    let e = start(&client, dir.path(), &env, "node-new", &host())
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("no IPv4 InternalIP") && msg.contains("IP_AUTODETECTION_METHOD"),
        "{msg}"
    );
}

/// What start-up reads in a kubeadm cluster whose kubeadm-config says `podSubnet`.
fn kubeadm(pod_subnet: &str, rancher: bool) -> ClusterFacts {
    ClusterFacts {
        kubernetes: true,
        kubeadm_config: Some(
            [(
                "ClusterConfiguration".to_string(),
                format!("networking:\n  podSubnet: {pod_subnet}\n  serviceSubnet: 10.96.0.0/12\n"),
            )]
            .into(),
        ),
        rancher_state: rancher,
        internal_ips: vec!["10.0.0.5".parse().unwrap()],
    }
}

async fn pool_cidrs(client: &Client<MemBackend>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = client
        .list(Kind::IPPool, None, "")
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| match p {
            Resource::IPPool(p) => (p.metadata.name.clone(), p.spec.cidr.clone()),
            _ => unreachable!(),
        })
        .collect();
    out.sort();
    out
}

async fn cluster_type(client: &Client<MemBackend>) -> String {
    match client
        .get(&ResourceKey {
            kind: Kind::ClusterInformation,
            namespace: String::new(),
            name: "default".into(),
        })
        .await
        .unwrap()
    {
        Resource::ClusterInformation(ci) => ci.spec.cluster_type,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn kubeadms_pod_subnet_is_the_default_pools_cidr_unless_one_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let kube = StartupOptions {
        kubernetes_datastore: true,
        ..opts()
    };
    let start = |client: Client<MemBackend>, env: Env, facts: ClusterFacts| {
        let (root, kube) = (dir.path().to_path_buf(), kube.clone());
        async move {
            run_in_cluster(
                &env.config(),
                "node-a",
                &client,
                &host(),
                &Paths::new(root),
                &kube,
                ClusterSource::Known(facts),
            )
            .await
        }
    };
    // Neither CIDR set: both pools take kubeadm's (host bits cleared, as a pool is made).
    let client = Client::new(MemBackend::new());
    start(
        client.clone(),
        Env::new(&[("IP", "10.0.0.5/24"), ("CLUSTER_TYPE", "k8s,bgp")]),
        kubeadm("10.244.1.0/16,fd00:10::/56", true),
    )
    .await
    .unwrap();
    assert_eq!(
        pool_cidrs(&client).await,
        [
            ("default-ipv4-ippool".into(), "10.244.0.0/16".into()),
            ("default-ipv6-ippool".into(), "fd00:10::/56".into())
        ]
    );
    // Calico's order: CLUSTER_TYPE, kubeadm, rancher, then kdd on the Kubernetes datastore.
    assert_eq!(cluster_type(&client).await, "k8s,bgp,kubeadm,rancher,kdd");

    // An explicit CALICO_IPV4POOL_CIDR wins; the IPv6 pool still follows kubeadm.
    let client = Client::new(MemBackend::new());
    start(
        client.clone(),
        Env::new(&[
            ("IP", "10.0.0.5/24"),
            ("CALICO_IPV4POOL_CIDR", "10.65.0.0/16"),
        ]),
        kubeadm("10.244.0.0/16,fd00:10::/56", false),
    )
    .await
    .unwrap();
    assert_eq!(
        pool_cidrs(&client).await,
        [
            ("default-ipv4-ippool".into(), "10.65.0.0/16".into()),
            ("default-ipv6-ippool".into(), "fd00:10::/56".into())
        ]
    );
    assert_eq!(cluster_type(&client).await, "kubeadm,kdd");

    // No kubeadm-config: Calico's defaults; a v4-only podSubnet leaves IPv6 to its default.
    let client = Client::new(MemBackend::new());
    let facts = ClusterFacts {
        kubeadm_config: None,
        ..kubeadm("", false)
    };
    start(
        client.clone(),
        Env::new(&[("IP", "10.0.0.5/24"), ("CALICO_IPV6POOL_CIDR", "none")]),
        facts,
    )
    .await
    .unwrap();
    assert_eq!(
        pool_cidrs(&client).await,
        [("default-ipv4-ippool".into(), "192.168.0.0/16".into())]
    );
    assert_eq!(cluster_type(&client).await, "kdd");
    let client = Client::new(MemBackend::new());
    start(
        client.clone(),
        Env::new(&[("IP", "10.0.0.5/24")]),
        kubeadm("10.244.0.0/16", false),
    )
    .await
    .unwrap();
    let pools = pool_cidrs(&client).await;
    assert_eq!(pools[0].1, "10.244.0.0/16");
    assert!(
        pools[1].1.starts_with("fd") && pools[1].1.ends_with("/48"),
        "{pools:?}"
    );

    // A kubeadm CIDR that cannot be a pool names its source and the override.
    let client = Client::new(MemBackend::new());
    let e = start(
        client,
        Env::new(&[("IP", "10.0.0.5/24")]),
        kubeadm("10.244.0.0/28", false),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("podSubnet of ConfigMap kube-system/kubeadm-config")
            && e.contains("CALICO_IPV4POOL_CIDR"),
        "{e}"
    );
}

#[tokio::test]
async fn kubernetes_internal_ip_is_the_referenced_kubernetes_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new(MemBackend::new());
    // The Calico Node's own addresses say otherwise: the Kubernetes Node read from the cluster
    // (CALICO_K8S_NODE_REF's) is the one that counts.
    let mut n = Node::new(ObjectMeta::named("node-a"), Default::default());
    n.spec.addresses = vec![margay_api::endpoint::NodeAddress {
        address: "127.0.0.1".into(),
        type_: "InternalIP".into(),
    }];
    client.create(Resource::Node(n)).await.unwrap();
    let env = Env::new(&[
        ("IP", "autodetect"),
        ("IP_AUTODETECTION_METHOD", "kubernetes-internal-ip"),
        ("CALICO_K8S_NODE_REF", "k8s-a"),
    ]);
    let out = run_in_cluster(
        &env.config(),
        "node-a",
        &client,
        &host(),
        &Paths::new(dir.path()),
        &opts(),
        ClusterSource::Known(kubeadm("10.244.0.0/16", false)),
    )
    .await
    .unwrap();
    assert_eq!(out.ipv4.as_deref(), Some("10.0.0.5/24"));
    assert_eq!(
        node(&client, "node-a").await.spec.orch_refs[0].node_name,
        "k8s-a"
    );
}

#[tokio::test]
async fn no_per_node_felix_configuration_in_the_kubernetes_datastore() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new(MemBackend::new());
    let env = Env::new(&[("IP", "10.0.0.5/24")]);
    let fc = |name: &str| ResourceKey {
        kind: Kind::FelixConfiguration,
        namespace: String::new(),
        name: name.into(),
    };
    let kube = StartupOptions {
        kubernetes_datastore: true,
        ..opts()
    };
    run(
        &env.config(),
        "node-a",
        &client,
        &host(),
        &Paths::new(dir.path()),
        &kube,
    )
    .await
    .unwrap();
    // Calico's start-up leaves per-node settings to the DaemonSet's FELIX_* variables there.
    assert!(client.get(&fc("node.node-a")).await.is_err());
    assert!(client.get(&fc("default")).await.is_ok());
    let env_b = Env::new(&[("IP", "10.0.0.6/24")]);
    start(&client, dir.path(), &env_b, "node-b", &host())
        .await
        .unwrap();
    assert!(client.get(&fc("node.node-b")).await.is_ok());
}

#[tokio::test]
async fn explicit_addresses_as_number_and_node_ref() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new(MemBackend::new());
    let env = Env::new(&[
        ("IP", "10.0.0.5"),
        ("IP6", "fd00:10::5/64"),
        ("AS", "1.10"),
        ("CALICO_K8S_NODE_REF", "k8s-node-a"),
        ("CALICO_IPV4POOL_CIDR", "10.244.0.0/16"),
        ("CALICO_IPV4POOL_VXLAN", "CrossSubnet"),
        ("CALICO_IPV6POOL_CIDR", "none"),
    ]);
    let out = start(&client, dir.path(), &env, "node-a", &host())
        .await
        .unwrap();
    // A bare IP takes its prefix from the interface holding it.
    assert_eq!(out.ipv4.as_deref(), Some("10.0.0.5/24"));
    assert_eq!(out.ipv6.as_deref(), Some("fd00:10::5/64"));
    let n = node(&client, "node-a").await;
    let bgp = n.spec.bgp.unwrap();
    assert_eq!(bgp.as_number.map(|a| a.0), Some(65536 + 10));
    assert_eq!(n.spec.orch_refs[0].node_name, "k8s-node-a");
    // With IP set, the host's interfaces (not the excluded ones) are recorded.
    let names: Vec<&str> = n.spec.interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, vec!["eth0"], "{:?}", n.spec.interfaces);
    let pools = client.list(Kind::IPPool, None, "").await.unwrap().items;
    assert_eq!(pools.len(), 1);
    let Resource::IPPool(p) = &pools[0] else {
        unreachable!()
    };
    assert_eq!(p.spec.cidr, "10.244.0.0/16");
    assert_eq!(p.spec.vxlan(), margay_api::ippool::EncapMode::CrossSubnet);
    assert!(p.spec.nat_outgoing);
}

#[tokio::test]
async fn a_vxlan_pool_gives_the_node_a_tunnel_address_once() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new(MemBackend::new());
    let env = Env::new(&[
        ("CALICO_IPV4POOL_CIDR", "10.244.0.0/16"),
        ("CALICO_IPV4POOL_VXLAN", "Always"),
    ]);
    let out = start(&client, dir.path(), &env, "node-a", &host())
        .await
        .unwrap();
    let ip = out.tunnel.ipv4.unwrap();
    assert!(Cidr::parse("10.244.0.0/16").unwrap().contains(ip));
    let n = node(&client, "node-a").await;
    assert_eq!(n.spec.ipv4_vxlan_tunnel_addr, ip.to_string());
    assert_eq!(
        n.spec.vxlan_tunnel_mac_addr,
        margay_calc::vxlan_mac_for_node("node-a")
    );
    // A second start-up keeps the address and writes nothing.
    let before = versions(&client).await;
    let again = start(&client, dir.path(), &env, "node-a", &host())
        .await
        .unwrap();
    assert_eq!(again.tunnel.ipv4, Some(ip));
    assert!(again.tunnel.assigned.is_empty() && !again.tunnel.node_written);
    assert_eq!(versions(&client).await, before);
}

#[tokio::test]
async fn address_conflict_names_both_nodes_and_clears_the_autodetected_address() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new(MemBackend::new());
    let mut other = Node::new(ObjectMeta::named("node-b"), Default::default());
    other.spec.bgp = Some(margay_api::endpoint::NodeBgpSpec {
        ipv4_address: "10.0.0.5/24".into(),
        ..Default::default()
    });
    client.create(Resource::Node(other)).await.unwrap();
    let err = start(
        &client,
        dir.path(),
        &Env::new(&[("IP", "autodetect")]),
        "node-a",
        &host(),
    )
    .await
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("\"node-b\"") && msg.contains("\"node-a\"") && msg.contains("10.0.0.5"),
        "{msg}"
    );
    // The check can be disabled.
    let ok = start(
        &client,
        dir.path(),
        &Env::new(&[("IP", "autodetect"), ("DISABLE_NODE_IP_CHECK", "true")]),
        "node-a",
        &host(),
    )
    .await;
    assert!(ok.is_ok(), "{ok:?}");
}

#[tokio::test]
async fn existing_configuration_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new(MemBackend::new());
    let felix = margay_api::decode_one(
        "apiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: default}\nspec: {logSeverityScreen: Debug, reportingInterval: 30s}\n",
    )
    .unwrap();
    client.create(felix).await.unwrap();
    let pool = margay_api::decode_one(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: mine}\nspec: {cidr: 10.96.0.0/12}\n",
    )
    .unwrap();
    client.create(pool).await.unwrap();
    let env = Env::new(&[("CLUSTER_TYPE", "k8s,bgp")]);
    start(&client, dir.path(), &env, "node-a", &host())
        .await
        .unwrap();
    let key = |kind, name: &str| ResourceKey {
        kind,
        namespace: String::new(),
        name: name.into(),
    };
    let Resource::FelixConfiguration(f) = client
        .get(&key(Kind::FelixConfiguration, "default"))
        .await
        .unwrap()
    else {
        unreachable!()
    };
    assert_eq!(f.spec.log_severity_screen.as_deref(), Some("Debug"));
    assert_eq!(
        f.spec.reporting_interval.as_ref().map(|d| d.as_str()),
        Some("30s")
    );
    let v4_pools = client.list(Kind::IPPool, None, "").await.unwrap().items;
    assert!(
        v4_pools.iter().all(|p| p.name() != "default-ipv4-ippool"),
        "an IPv4 pool existed"
    );
    let Resource::ClusterInformation(ci) = client
        .get(&key(Kind::ClusterInformation, "default"))
        .await
        .unwrap()
    else {
        unreachable!()
    };
    assert_eq!(ci.spec.cluster_type, "k8s,bgp");
    assert_eq!(ci.spec.datastore_ready, Some(true));
    assert_eq!(ci.spec.cluster_guid.len(), 32);
}

#[tokio::test]
async fn failures_say_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new(MemBackend::new());
    let h = host();
    // IP=none with Calico networking: no address at all.
    let e = start(&client, dir.path(), &Env::new(&[("IP", "none")]), "n", &h)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no IPv4 or IPv6 address"), "{e}");
    // ... but fine when Calico only does policy.
    start(
        &client,
        dir.path(),
        &Env::new(&[("IP", "none"), ("CALICO_NETWORKING_BACKEND", "none")]),
        "n",
        &h,
    )
    .await
    .unwrap();
    // Unknown autodetection method: exit with the valid ones.
    let e = start(
        &client,
        dir.path(),
        &Env::new(&[("IP", "autodetect"), ("IP_AUTODETECTION_METHOD", "magic")]),
        "n2",
        &h,
    )
    .await
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("IP_AUTODETECTION_METHOD")
            && msg.contains("first-found")
            && msg.contains("can-reach"),
        "{msg}"
    );
    // A pool too small for its blocks names the variable.
    let fresh = Client::new(MemBackend::new());
    let e = start(
        &fresh,
        dir.path(),
        &Env::new(&[("CALICO_IPV4POOL_CIDR", "172.16.0.0/27")]),
        "n",
        &h,
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("CALICO_IPV4POOL_CIDR"), "{e}");
    let e = start(
        &fresh,
        dir.path(),
        &Env::new(&[("IP", "10.9.9.9/33")]),
        "n",
        &h,
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("IP="), "{e}");
}

#[tokio::test]
async fn the_default_ipv4_pool_avoids_host_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new(MemBackend::new());
    let mut h = host();
    h.interfaces
        .push(iface("eth1", 5, &["192.168.1.10/24", "172.16.0.9/24"]));
    start(
        &client,
        dir.path(),
        &Env::new(&[("CALICO_IPV6POOL_CIDR", "none")]),
        "n",
        &h,
    )
    .await
    .unwrap();
    let pools = client.list(Kind::IPPool, None, "").await.unwrap().items;
    let Resource::IPPool(p) = &pools[0] else {
        unreachable!()
    };
    // 192.168/16 and 172.16/16 hold eth1's addresses, 172.17/16 docker0's.
    assert_eq!(p.spec.cidr, "172.18.0.0/16");
}

#[test]
fn node_name_sources_in_calicos_order() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nodename");
    let kernel = || Ok::<_, std::io::Error>("Kernel-Host\n".to_string());
    let lookup = |vars: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let cases: &[(&[(&str, &str)], bool, &str, NameSource)] = &[
        (
            &[
                ("NODENAME", "abc-def.ghi123"),
                ("HOSTNAME", "foo1.bar2-baz3"),
            ],
            false,
            "abc-def.ghi123",
            NameSource::NodenameEnv,
        ),
        (
            &[
                ("NODENAME", "MyHostname-123"),
                ("HOSTNAME", "valid.hostname"),
            ],
            false,
            "MyHostname-123",
            NameSource::NodenameEnv,
        ),
        (
            &[("NODENAME", "  "), ("HOSTNAME", "host123")],
            false,
            "host123",
            NameSource::HostnameEnv,
        ),
        (
            &[("HOSTNAME", "HOSTName")],
            false,
            "hostname",
            NameSource::HostnameEnv,
        ),
        (&[], false, "kernel-host", NameSource::KernelHostname),
        (
            &[("NODENAME", "  "), ("HOSTNAME", "  ")],
            false,
            "kernel-host",
            NameSource::KernelHostname,
        ),
        (
            &[("HOSTNAME", "host123")],
            true,
            "from-file",
            NameSource::File(file.clone()),
        ),
    ];
    for (vars, with_file, want, source) in cases {
        if *with_file {
            std::fs::write(&file, "from-file\n").unwrap();
        } else {
            let _ = std::fs::remove_file(&file);
        }
        let get = lookup(Box::leak(vars.to_vec().into_boxed_slice()));
        let (name, src) = node_name(&get, &file, &kernel).unwrap();
        assert_eq!((name.as_str(), &src), (*want, source), "{vars:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_datastore_waits_until_etcd_is_back() {
    use margay_datastore::config::EtcdConfig;
    use margay_datastore::etcd::EtcdBackend;
    let mut etcd = margay_testkit::etcd::EtcdServer::start().unwrap();
    let client = Client::new(
        EtcdBackend::connect(&EtcdConfig {
            endpoints: vec![etcd.endpoint()],
            ..EtcdConfig::default()
        })
        .await
        .unwrap(),
    );
    etcd.kill();
    let dir = tempfile::tempdir().unwrap();
    let env = Env::new(&[("WAIT_FOR_DATASTORE", "true")]);
    let cfg = env.config();
    let mut o = opts();
    o.wait_timeout = Some(std::time::Duration::from_secs(60));
    let task = {
        let (client, root) = (client.clone(), dir.path().to_path_buf());
        tokio::spawn(
            async move { run(&cfg, "node-w", &client, &host(), &Paths::new(root), &o).await },
        )
    };
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(!task.is_finished(), "start-up should still be waiting");
    etcd.restart().unwrap();
    etcd.wait_healthy().unwrap();
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(out.ipv4.as_deref(), Some("10.0.0.5/24"));

    // With a limit, an unreachable store ends start-up with the datastore's error.
    etcd.kill();
    let mut o = opts();
    o.wait_timeout = Some(std::time::Duration::from_secs(1));
    let e = run(
        &env.config(),
        "node-w",
        &client,
        &host(),
        &Paths::new(dir.path()),
        &o,
    )
    .await
    .unwrap_err();
    assert!(e.to_string().starts_with("datastore:"), "{e}");
}
