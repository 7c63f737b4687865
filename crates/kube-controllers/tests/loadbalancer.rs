//! The loadbalancer controller against the Kubernetes API server double (Kubernetes
//! datastore): Services of type LoadBalancer get an address from the pool that allows
//! `LoadBalancer` (never from the workload pool), written to their status; other classes and
//! types are left alone; a deleted Service's address is released; the node controller's IPAM
//! garbage collection, running beside it, leaves LoadBalancer addresses alone.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::*;
use margay_api::ippool::{AllowedUse, IPPoolSpec};
use margay_api::net::Cidr;
use margay_api::{IPPool, ObjectMeta, Resource};
use margay_apiserver::Gvr;
use margay_datastore::Client;
use margay_ipam::Ipam;
use margay_kube_controllers::config::DatastoreKind;
use margay_kube_controllers::daemon::Daemon;
use margay_kube_controllers::loadbalancer::handle_of;
use serde_json::{Value, json};

const SERVICES: Gvr<'static> = Gvr::core("services");

fn service(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": "default"},
           "spec": spec})
}

fn ingress_ip(c: &Cluster, name: &str) -> Option<IpAddr> {
    let s = c.store().get(SERVICES, "default", name).ok()?;
    s.pointer("/status/loadBalancer/ingress/0/ip")?
        .as_str()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancer_services_get_addresses_from_load_balancer_pools() {
    let c = Cluster::start();
    let kv = connect(&c.kube_datastore()).await;
    create_pool(&kv, "10.20.0.0/16", 26).await;
    let lb_pool = Cidr::parse("10.99.0.0/24").unwrap();
    Client::new(kv.clone())
        .create(Resource::from(IPPool::new(
            ObjectMeta::named("lb-pool"),
            IPPoolSpec {
                cidr: lb_pool.to_string(),
                block_size: Some(28),
                allowed_uses: vec![AllowedUse::LoadBalancer],
                ..IPPoolSpec::default()
            },
        )))
        .await
        .unwrap();
    create_kcc(&kv, "1s").await;
    let port = json!([{"port": 80, "protocol": "TCP"}]);
    let store = c.store();
    store
        .create(
            SERVICES,
            "default",
            service("lb", json!({"type": "LoadBalancer", "ports": port})),
        )
        .unwrap();
    store
        .create(
            SERVICES,
            "default",
            service(
                "other-class",
                json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/lb", "ports": port}),
            ),
        )
        .unwrap();
    store
        .create(
            SERVICES,
            "default",
            service("plain", json!({"ports": port})),
        )
        .unwrap();

    let d = Daemon::start(daemon_options(
        c.kube_datastore(),
        DatastoreKind::Kubernetes,
        &[("ENABLED_CONTROLLERS", "node,loadbalancer")],
        c.dir.path(),
    ))
    .await
    .unwrap();

    let ip = wait_for(
        "the LoadBalancer address",
        Duration::from_secs(30),
        || async { ingress_ip(&c, "lb") },
    )
    .await;
    assert!(
        lb_pool.contains(ip),
        "{ip} is not from the LoadBalancer pool"
    );
    let ipam = Ipam::new(kv.clone());
    assert!(holds(&ipam, &handle_of("default", "lb"), ip).await);
    // A Service created later is served too, with another address.
    store
        .create(
            SERVICES,
            "default",
            service("lb2", json!({"type": "LoadBalancer", "ports": port})),
        )
        .unwrap();
    let ip2 = wait_for("the second address", Duration::from_secs(30), || async {
        ingress_ip(&c, "lb2")
    })
    .await;
    assert!(lb_pool.contains(ip2) && ip2 != ip, "{ip2}");
    // Another class, and a ClusterIP Service, are not this controller's.
    assert_eq!(ingress_ip(&c, "other-class"), None);
    assert_eq!(ingress_ip(&c, "plain"), None);

    // Deleted: the address goes back to the pool.
    store.delete(SERVICES, "default", "lb").unwrap();
    wait_for("the address released", Duration::from_secs(30), || async {
        (!holds(&ipam, &handle_of("default", "lb"), ip).await).then_some(())
    })
    .await;
    // The node controller's garbage collection ran meanwhile (1 s grace period) and left the
    // remaining LoadBalancer address alone.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(holds(&ipam, &handle_of("default", "lb2"), ip2).await);
    d.stop().await.unwrap();
}
