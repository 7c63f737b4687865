//! etcd mode: a real etcd holds Calico's resources, the API server double the Kubernetes
//! objects. The mirrors create, update and delete `knp.default.*` NetworkPolicies, `kns.*` and
//! `ksa.*` Profiles and WorkloadEndpoint labels; the node controller deletes the Calico Node of
//! a deleted Kubernetes Node and cleans its IPAM state; the KubeControllersConfiguration
//! `default` is created in etcd with its status.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use margay_api::endpoint::{NodeSpec, OrchRef};
use margay_api::policy::ProfileSpec;
use margay_api::{Kind, Node, ObjectMeta, Profile, Resource, ResourceKey};
use margay_apiserver::{Gvr, PatchType};
use margay_datastore::config::EtcdConfig;
use margay_datastore::{AnyBackend, Client, DatastoreConfig, DatastoreError, DatastoreType};
use margay_ipam::Ipam;
use margay_kube_controllers::config::DatastoreKind;
use margay_kube_controllers::daemon::Daemon;
use margay_testkit::etcd::EtcdServer;
use serde_json::json;

const NETPOLS: Gvr<'static> = Gvr::new("networking.k8s.io", "v1", "networkpolicies");
const SERVICE_ACCOUNTS: Gvr<'static> = Gvr::core("serviceaccounts");

fn key(kind: Kind, ns: &str, name: &str) -> ResourceKey {
    ResourceKey {
        kind,
        namespace: ns.into(),
        name: name.into(),
    }
}

async fn get(client: &Client<AnyBackend>, k: &ResourceKey) -> Option<Resource> {
    match client.get(k).await {
        Ok(r) => Some(r),
        Err(DatastoreError::NotFound { .. }) => None,
        Err(e) => panic!("{k}: {e}"),
    }
}

fn calico_node(name: &str, k8s: Option<&str>) -> Resource {
    Resource::from(Node::new(
        ObjectMeta::named(name),
        NodeSpec {
            orch_refs: k8s
                .map(|k| {
                    vec![OrchRef {
                        node_name: k.into(),
                        orchestrator: "k8s".into(),
                    }]
                })
                .unwrap_or_default(),
            ..NodeSpec::default()
        },
    ))
}

fn profile_labels(r: &Resource) -> BTreeMap<String, String> {
    match r {
        Resource::Profile(p) => p.spec.labels_to_apply.clone(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_and_node_controller_keep_etcd_in_step() {
    let etcd = EtcdServer::start().unwrap();
    let c = Cluster::start();
    let ds = DatastoreConfig {
        datastore_type: DatastoreType::Etcd,
        etcd: EtcdConfig {
            endpoints: vec![etcd.endpoint()],
            ..EtcdConfig::default()
        },
        kube: c.kube_settings(),
        ..DatastoreConfig::default()
    };
    let kv = connect(&ds).await;
    let client = Client::new(kv.clone());
    create_pool(&kv, "10.50.0.0/16", 26).await;
    create_kcc(&kv, "1h").await;

    // Kubernetes objects.
    c.add_namespace("shop", json!({"team": "a"}));
    c.store()
        .create(
            SERVICE_ACCOUNTS,
            "shop",
            json!({"metadata": {"name": "api", "namespace": "shop", "labels": {"role": "x"}}}),
        )
        .unwrap();
    c.store()
        .create(
            NETPOLS,
            "shop",
            json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "deny", "namespace": "shop"},
                "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]},
            }),
        )
        .unwrap();
    c.add_node("n1");
    c.store()
        .create(
            PODS,
            "shop",
            json!({
                "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
                "spec": {"nodeName": "n1", "serviceAccountName": "api",
                         "containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": "Pending"},
            }),
        )
        .unwrap();
    let ipam = Ipam::new(kv.clone());
    let web_ip = assign(&ipam, "n1", "shop", "web").await;
    c.set_pod_ip("shop", "web", web_ip);

    // What etcd holds before the controllers start: the endpoint the CNI plugin wrote (with
    // labels since changed), stale mirrored copies, something of the operator's own, Calico
    // Nodes (one of a deleted Kubernetes Node, with an address of a pod that went with it).
    let pod = c.store().get(PODS, "shop", "web").unwrap();
    let mut wep = margay_kdd::pod::pod_to_workload_endpoint(&pod, "cali")
        .unwrap()
        .unwrap();
    wep.metadata_mut().resource_version.clear();
    wep.metadata_mut().labels.insert("app".into(), "old".into());
    let wep_key = wep.key();
    client.create(wep).await.unwrap();
    let stale = Profile::new(ObjectMeta::named("kns.gone"), ProfileSpec::default());
    client.create(Resource::from(stale)).await.unwrap();
    let mine = Profile::new(ObjectMeta::named("mine"), ProfileSpec::default());
    client.create(Resource::from(mine)).await.unwrap();
    client.create(calico_node("n1", Some("n1"))).await.unwrap();
    client
        .create(calico_node("old", Some("old")))
        .await
        .unwrap();
    client.create(calico_node("bare", None)).await.unwrap();
    let old_ip = assign(&ipam, "old", "shop", "gone-pod").await;

    let d = Daemon::start(daemon_options(
        ds.clone(),
        DatastoreKind::Etcd,
        &[(
            "ENABLED_CONTROLLERS",
            "node,policy,namespace,serviceaccount,workloadendpoint",
        )],
        c.dir.path(),
    ))
    .await
    .unwrap();
    let run = d.run_config(Duration::from_secs(30)).await.unwrap();
    assert!(run.controllers.node.as_ref().unwrap().delete_nodes);

    let limit = Duration::from_secs(60);
    wait_for("the mirrors", limit, || async {
        let kns = get(&client, &key(Kind::Profile, "", "kns.shop")).await?;
        let ksa = get(&client, &key(Kind::Profile, "", "ksa.shop.api")).await?;
        get(
            &client,
            &key(Kind::NetworkPolicy, "shop", "knp.default.deny"),
        )
        .await?;
        let w = get(&client, &wep_key).await?;
        let gone = get(&client, &key(Kind::Profile, "", "kns.gone"))
            .await
            .is_none();
        let ok = profile_labels(&kns).get("pcns.team").map(String::as_str) == Some("a")
            && profile_labels(&ksa).get("pcsa.role").map(String::as_str) == Some("x")
            && w.metadata().labels.get("app").map(String::as_str) == Some("web")
            && gone;
        ok.then_some(())
    })
    .await;
    match get(&client, &wep_key).await.unwrap() {
        Resource::WorkloadEndpoint(w) => {
            assert_eq!(w.spec.service_account_name, "api");
            assert_eq!(w.metadata.labels["projectcalico.org/serviceaccount"], "api");
        }
        other => panic!("{other:?}"),
    }
    // The operator's own profile is not the mirror's business.
    assert!(
        get(&client, &key(Kind::Profile, "", "mine"))
            .await
            .is_some()
    );

    // The node controller: the Calico Node of the deleted Kubernetes Node goes, with its
    // address and affinity; the others stay.
    wait_for("the stale Calico Node", limit, || async {
        let gone = get(&client, &key(Kind::Node, "", "old")).await.is_none();
        let released = !holds(&ipam, &handle_of("gone-pod"), old_ip).await;
        let affs = ipam.affinities().await.unwrap();
        (gone && released && !affs.iter().any(|(h, _, _)| h == "old")).then_some(())
    })
    .await;
    assert!(get(&client, &key(Kind::Node, "", "n1")).await.is_some());
    assert!(get(&client, &key(Kind::Node, "", "bare")).await.is_some());
    assert!(holds(&ipam, &handle_of("web"), web_ip).await);

    // Changes flow through: namespace labels, pod labels, a deleted policy and account.
    c.store()
        .patch(
            NAMESPACES,
            "",
            "shop",
            PatchType::Merge,
            &json!({"metadata": {"labels": {"team": "b"}}}),
        )
        .unwrap();
    c.store()
        .patch(
            PODS,
            "shop",
            "web",
            PatchType::Merge,
            &json!({"metadata": {"labels": {"app": "web2"}}}),
        )
        .unwrap();
    c.store().delete(NETPOLS, "shop", "deny").unwrap();
    c.store().delete(SERVICE_ACCOUNTS, "shop", "api").unwrap();
    wait_for("the changes", limit, || async {
        let kns = get(&client, &key(Kind::Profile, "", "kns.shop")).await?;
        let w = get(&client, &wep_key).await?;
        let ok = profile_labels(&kns).get("pcns.team").map(String::as_str) == Some("b")
            && w.metadata().labels.get("app").map(String::as_str) == Some("web2")
            && get(
                &client,
                &key(Kind::NetworkPolicy, "shop", "knp.default.deny"),
            )
            .await
            .is_none()
            && get(&client, &key(Kind::Profile, "", "ksa.shop.api"))
                .await
                .is_none();
        ok.then_some(())
    })
    .await;

    // The configuration resource was created in etcd with the running configuration.
    match get(
        &client,
        &key(Kind::KubeControllersConfiguration, "", "default"),
    )
    .await
    .unwrap()
    {
        Resource::KubeControllersConfiguration(k) => {
            let st = k.status.unwrap();
            assert_eq!(
                st.environment_vars["ENABLED_CONTROLLERS"],
                "node,policy,namespace,serviceaccount,workloadendpoint"
            );
            assert_eq!(st.running_config.unwrap().log_severity_screen, "Info");
        }
        other => panic!("{other:?}"),
    }
    let m = metrics(&d).await;
    assert!(
        margay_kube_controllers::metrics::sample(
            &m,
            "margay_kube_controllers_mirror_writes_total",
            None
        )
        .unwrap()
            >= 7.0,
        "{m}"
    );
    d.stop().await.unwrap();
}
