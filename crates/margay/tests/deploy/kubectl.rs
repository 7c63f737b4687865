//! 4. kubectl applies deploy/; margay's datastore works over its CRDs.

use super::*;

const DAEMONSETS: Gvr<'static> = Gvr::new("apps", "v1", "daemonsets");

fn kubectl_bin() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
}

/// The double (Calico's CRDs not pre-installed: deploy/ installs them), its kubeconfig, and
/// kubectl with a discovery cache of its own.
struct Kubectl {
    bin: PathBuf,
    api: ApiServer,
    dir: tempfile::TempDir,
}

impl Kubectl {
    fn new() -> Option<Kubectl> {
        let Some(bin) = kubectl_bin() else {
            eprintln!("SKIPPED: no kubectl binary on PATH (install Debian's kubernetes-client)");
            return None;
        };
        let api = ApiServer::start(ServerOptions::default()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        api.write_kubeconfig(&dir.path().join("kubeconfig"))
            .unwrap();
        Some(Kubectl { bin, api, dir })
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args)
            .env("HOME", self.dir.path())
            .env_remove("KUBECONFIG");
        roles::run_within(c, WAIT)
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(o.status.success(), "kubectl {args:?}: {}", show(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

/// How kubectl names an object in its output: `daemonset.apps/margay-node`.
fn kubectl_name(d: &Value) -> String {
    let kind = d["kind"].as_str().unwrap().to_ascii_lowercase();
    let group = d["apiVersion"]
        .as_str()
        .unwrap()
        .rsplit_once('/')
        .map(|(g, _)| format!(".{g}"))
        .unwrap_or_default();
    format!("{kind}{group}/{}", d["metadata"]["name"].as_str().unwrap())
}

#[test]
fn kubectl_applies_deploy_to_the_api_server() {
    let Some(k) = Kubectl::new() else { return };
    let dir = deploy_dir();
    let dir = dir.to_str().unwrap();
    let m = Manifests::default_set();

    // `kubectl apply -f deploy/` (client-side, with kubectl's default strict validation).
    let out = k.ok(&["apply", "-f", dir]);
    for (_, d) in &m.docs {
        let line = format!("{} created", kubectl_name(d));
        assert!(out.lines().any(|l| l == line), "{line:?} not in:\n{out}");
    }
    assert_eq!(out.lines().count(), m.docs.len(), "{out}");
    // Applying again writes nothing. (kubectl reports PodDisruptionBudgets "configured" all
    // the same: its three-way patch always carries spec.selector, whose patch strategy is
    // replace; the server finds nothing to change.)
    let rv = k.api.store().resource_version();
    let again = k.ok(&["apply", "-f", dir]);
    assert!(
        again.lines().all(|l| l.ends_with(" unchanged")
            || l.starts_with("poddisruptionbudget.policy/") && l.ends_with(" configured")),
        "a second apply changed something:\n{again}"
    );
    assert_eq!(
        k.api.store().resource_version(),
        rv,
        "a second apply wrote:\n{again}"
    );

    // Every Calico CRD is served; the RBAC objects exist.
    let crds = k.ok(&["get", "crd", "-o", "name"]);
    for c in CALICO_CRDS {
        let n = format!(
            "customresourcedefinition.apiextensions.k8s.io/{}",
            c.crd_name()
        );
        assert!(crds.lines().any(|l| l == n), "{n} not in:\n{crds}");
    }
    assert_eq!(crds.lines().count(), CALICO_CRDS.len(), "{crds}");
    let api_resources = k.ok(&[
        "api-resources",
        "--api-group=crd.projectcalico.org",
        "-o",
        "name",
    ]);
    assert_eq!(
        api_resources.lines().count(),
        CALICO_CRDS.len(),
        "{api_resources}"
    );
    let rbac = k.ok(&["get", "clusterroles,clusterrolebindings", "-o", "name"]);
    let roles = k.ok(&[
        "get",
        "roles,rolebindings,serviceaccounts",
        "-n",
        NAMESPACE,
        "-o",
        "name",
    ]);
    for (_, d) in m.docs.iter().filter(|(_, d)| {
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ServiceAccount",
        ]
        .contains(&d["kind"].as_str().unwrap())
    }) {
        let n = kubectl_name(d);
        assert!(
            rbac.lines().chain(roles.lines()).any(|l| l == n),
            "{n} not in:\n{rbac}{roles}"
        );
    }
    let all = k.ok(&["get", "all", "-n", NAMESPACE, "-o", "name"]);
    for n in [
        "daemonset.apps/margay-node",
        "deployment.apps/margay-typha",
        "deployment.apps/margay-kube-controllers",
        "service/margay-typha",
    ] {
        assert!(all.lines().any(|l| l == n), "{n} not in `get all`:\n{all}");
    }
    let pdbs = k.ok(&["get", "pdb", "-n", NAMESPACE, "-o", "name"]);
    assert!(
        pdbs.contains("poddisruptionbudget.policy/margay-typha"),
        "{pdbs}"
    );

    // Calico custom resources can now be written, by kubectl and by margay (ctl).
    let pool = k.dir.path().join("pool.yaml");
    std::fs::write(
        &pool,
        "apiVersion: crd.projectcalico.org/v1\nkind: IPPool\nmetadata: {name: from-kubectl}\nspec: {cidr: 10.70.0.0/16, blockSize: 26, vxlanMode: Always, natOutgoing: true}\n",
    )
    .unwrap();
    k.ok(&["apply", "-f", pool.to_str().unwrap()]);
    let mut c = margay(k.dir.path());
    c.env("DATASTORE_TYPE", "kubernetes")
        .env("KUBECONFIG", k.dir.path().join("kubeconfig"))
        .args(["ctl", "get", "ippools", "-o", "name"]);
    let o = roles::run_within(c, WAIT);
    assert!(o.status.success(), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("from-kubectl"),
        "{}",
        show(&o)
    );

    // The BGP variant replaces the DaemonSet (a strategic merge patch of the live one).
    let bgp = deploy_dir().join("bgp/margay-node.yaml");
    let out = k.ok(&["apply", "-f", bgp.to_str().unwrap()]);
    assert_eq!(out.trim(), "daemonset.apps/margay-node configured");
    let live = k
        .api
        .store()
        .get(DAEMONSETS, NAMESPACE, "margay-node")
        .unwrap();
    let want = Manifests::bgp_set().get("DaemonSet", "margay-node").clone();
    assert_eq!(
        live["spec"]["template"], want["spec"]["template"],
        "the DaemonSet after applying the BGP variant"
    );
}

/// margay's Kubernetes datastore over the CRDs as deploy/ installs them (the double starts
/// without Calico's): resources are written and read back in Calico's layout.
#[test]
fn margays_datastore_works_over_the_deployed_crds() {
    let api = ApiServer::start(ServerOptions {
        calico_crds: false,
        ..ServerOptions::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let crds = std::fs::read_to_string(deploy_dir().join(CRDS_FILE)).unwrap();
    assert_eq!(api.store().load(&crds).unwrap(), CALICO_CRDS.len());

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cfg = margay_datastore::DatastoreConfig::from_lookup(|k| match k {
            "DATASTORE_TYPE" => Some("kubernetes".into()),
            "KUBECONFIG" => Some(kubeconfig.display().to_string()),
            _ => None,
        })
        .unwrap();
        let client = margay_datastore::Client::new(cfg.connect().await.unwrap());
        for doc in [
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: pool-1}\nspec: {cidr: 10.80.0.0/16, blockSize: 26, vxlanMode: Always, natOutgoing: true}\n",
            "apiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata: {name: allow-web, namespace: default}\nspec: {selector: app == 'web', types: [Ingress], ingress: [{action: Allow}]}\n",
            "apiVersion: projectcalico.org/v3\nkind: KubeControllersConfiguration\nmetadata: {name: default}\nspec: {controllers: {node: {leakGracePeriod: 15m}}}\n",
        ] {
            let r = margay_api::codec::decode_one(doc).unwrap();
            client.create(r).await.unwrap_or_else(|e| panic!("{doc}: {e}"));
        }
        let pools = client.list(margay_api::Kind::IPPool, None, "").await.unwrap();
        let names: Vec<&str> = pools.items.iter().map(|r| r.name()).collect();
        assert_eq!(names, ["pool-1"]);
        let pols = client
            .list(margay_api::Kind::NetworkPolicy, Some("default"), "")
            .await
            .unwrap();
        assert_eq!(pols.items.len(), 1);
    });
    // In Calico's layout, in the double.
    let s = api.store();
    let cr = s
        .get(
            Gvr::new("crd.projectcalico.org", "v1", "ippools"),
            "",
            "pool-1",
        )
        .unwrap();
    assert_eq!(cr["kind"], "IPPool");
    assert_eq!(cr["spec"]["cidr"], "10.80.0.0/16");
    assert_eq!(cr["spec"]["vxlanMode"], "Always");
    let np = s
        .get(
            Gvr::new("crd.projectcalico.org", "v1", "networkpolicies"),
            "default",
            "allow-web",
        )
        .unwrap();
    assert_eq!(np["spec"]["selector"], "app == 'web'");
}

/// The etcd installation as its header says to install it: `kubectl apply -f
/// deploy/rbac.yaml -f deploy/etcd/margay-etcd.yaml`, every object created.
#[test]
fn kubectl_applies_the_etcd_installation() {
    let Some(k) = Kubectl::new() else { return };
    let dir = deploy_dir();
    let rbac = dir.join("rbac.yaml");
    let etcd = dir.join("etcd/margay-etcd.yaml");
    let out = k.ok(&[
        "apply",
        "-f",
        rbac.to_str().unwrap(),
        "-f",
        etcd.to_str().unwrap(),
    ]);
    let m = Manifests::etcd_set();
    for (_, d) in &m.docs {
        let line = format!("{} created", kubectl_name(d));
        assert!(out.lines().any(|l| l == line), "{line:?} not in:\n{out}");
    }
    assert_eq!(out.lines().count(), m.docs.len(), "{out}");
}
