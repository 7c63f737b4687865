//! 5. The etcd installation (`deploy/rbac.yaml` + `deploy/etcd/`) run as deployed: start-up
//!    registers the node in etcd, Felix reads etcd and its own probes find it ready,
//!    kube-controllers mirrors the Kubernetes namespaces into etcd — each with the command line
//!    and environment of its container, the API server double standing in for Kubernetes.

use super::node::{
    assert_within_rbac, container, container_command, requests_since, seed_cluster,
    start_felix_until_probes_pass,
};
use super::*;

/// `margay ctl` against the test's etcd.
fn ctl(d: &Path, endpoint: &str, args: &[&str]) -> Output {
    let mut c = margay(d);
    c.env("DATASTORE_TYPE", "etcdv3")
        .env("ETCD_ENDPOINTS", endpoint)
        .arg("ctl")
        .args(args);
    roles::run_within(c, WAIT)
}

#[test]
fn etcd_installation_runs_as_deployed() {
    let m = Manifests::etcd_set();
    let etcd = margay_testkit::etcd::EtcdServer::start().unwrap();
    let endpoint = etcd.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let api = ApiServer::start(ServerOptions::default()).unwrap();
    let kubeconfig = d.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    seed_cluster(&api, Some("10.244.0.5"));
    // What the pod gets around it: the API server (as KUBECONFIG) and this test's etcd in
    // place of the ConfigMap's placeholder endpoint.
    let around = [
        ("KUBECONFIG", kubeconfig.display().to_string()),
        ("ETCD_ENDPOINTS", endpoint.clone()),
    ];

    // --- node start-up -------------------------------------------------------------------
    let startup = container(&m, "DaemonSet/margay-node initContainers[node-startup]");
    let root = d.join("root");
    let before = api.stats().requests;
    let mut c = container_command(&m, &startup, d, &around);
    c.arg("--root").arg(&root);
    let o = roles::run_within(c, WAIT);
    assert!(o.status.success(), "node start-up: {}", show(&o));
    assert_within_rbac(
        &m,
        "margay-node",
        "node start-up",
        &requests_since(&api, &before),
    );
    let node = ctl(d, &endpoint, &["get", "node", NODE, "-o", "yaml"]);
    let node_yaml = String::from_utf8_lossy(&node.stdout);
    assert!(
        node.status.success() && node_yaml.contains("ipv4Address: 127.0.0.1/8"),
        "the node in etcd: {}",
        show(&node)
    );
    let pools = ctl(d, &endpoint, &["get", "ippools", "-o", "wide"]);
    assert!(
        String::from_utf8_lossy(&pools.stdout).contains("default-ipv4-ippool"),
        "{}",
        show(&pools)
    );
    // Nothing Calico-shaped went to the API server: etcd holds it all.
    let crd_pools = api
        .store()
        .list(Gvr::new("crd.projectcalico.org", "v1", "ippools"), None, "")
        .unwrap();
    assert!(crd_pools.is_empty(), "{crd_pools:?}");

    // --- Felix: its own probes say when it is live and ready --------------------------------
    let felix_c = container(&m, "DaemonSet/margay-node containers[felix]");
    let felix_health = margay_testkit::free_port().unwrap();
    let mut felix_extra: Vec<(&str, String)> = around.to_vec();
    felix_extra.extend([
        ("MARGAY_DATAPLANE", "recording".to_string()),
        ("FELIX_HEALTHPORT", felix_health.to_string()),
        (
            "MARGAY_FELIX_STATUS_SOCKET",
            d.join("felix.sock").display().to_string(),
        ),
    ]);
    let felix = start_felix_until_probes_pass(&m, &felix_c, d, &felix_extra, &mut || {});
    let log = felix.log();
    assert!(log.contains("etcd"), "Felix names its datastore: {log}");

    // --- kube-controllers: the namespace mirror writes profiles into etcd -------------------
    if has_role("kube-controllers") {
        let kc_c = container(
            &m,
            "Deployment/margay-kube-controllers containers[kube-controllers]",
        );
        let before = api.stats().requests;
        let mut c = container_command(&m, &kc_c, d, &around);
        c.arg("--status-file").arg(d.join("status.json"));
        let mut kc = Role::spawn("kube-controllers", c, d.join("kube-controllers.log"));
        wait_for(
            "the namespace shop mirrored into etcd as profile kns.shop",
            || {
                kc.assert_running();
                let o = ctl(d, &endpoint, &["get", "profile", "kns.shop", "-o", "yaml"]);
                if o.status.success() {
                    Ok(())
                } else {
                    Err(format!("{}\nlog: {}", show(&o), kc.log()))
                }
            },
        );
        drop(kc);
        assert_within_rbac(
            &m,
            "margay-kube-controllers",
            "kube-controllers",
            &requests_since(&api, &before),
        );
    }
    drop(felix);
}
