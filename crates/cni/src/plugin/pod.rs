//! Kubernetes: the pod and its namespace read from the API (bounded), the Kubernetes
//! datastore's name rules checked, and a previous sandbox's addresses released.

use super::*;

impl Call {
    /// Whether this call reads its pod from the Kubernetes API: the main plugin, a Kubernetes
    /// pod (K8S_POD_NAMESPACE/K8S_POD_NAME), and an API to ask — the Kubernetes datastore, or
    /// one the network configuration names (`kubernetes.kubeconfig`, `k8s_api_root`), as in
    /// Calico's conflists. Without one the call works as for any runtime (labels from
    /// `args.cni`).
    pub(super) fn looks_up_pods(&self, ident: &Identity, store: &Store) -> bool {
        self.kind == PluginKind::Main
            && ident.is_k8s()
            && (store.kube().is_some() || config::names_kubernetes_api(&self.conf))
    }

    /// The API client of the lookups: the Kubernetes datastore's own, else one made from the
    /// network configuration (`kubernetes.kubeconfig`, the `policy` block's overrides).
    pub(super) async fn kube_client(&self, store: &Store) -> Result<KubeBackend, CniError> {
        if let Some(k) = store.kube() {
            return Ok(k.clone());
        }
        let settings = config::datastore_config(&self.conf, &self.env)?.kube;
        if settings.cert_file.is_some() != settings.key_file.is_some() {
            return Err(CniError::new(
                code::INVALID_CONFIG,
                "network configuration: policy.k8s_client_certificate and policy.k8s_client_key go together; set both or neither",
            ));
        }
        KubeBackend::connect(&settings).await.map_err(|e| {
            CniError::new(
                code::INVALID_CONFIG,
                "cannot set up the Kubernetes API client for the pod lookup (network config kubernetes.kubeconfig, policy.k8s_*)",
            )
            .with_details(e)
        })
    }

    /// Reads the pod (and, when its annotations can matter, its namespace) and checks what
    /// they ask for. None when this call does not look pods up.
    pub(super) async fn pod_facts(
        &self,
        store: &Store,
        ident: &Identity,
    ) -> Result<Option<PodFacts>, CniError> {
        if !self.looks_up_pods(ident, store) {
            return Ok(None);
        }
        let lookup = async {
            let kube = self.kube_client(store).await?;
            let pod = self.read_pod(&kube, ident).await?;
            if pod.host_network {
                return Ok(PodFacts {
                    pod,
                    plan: AddressPlan::default(),
                });
            }
            let ns = if pod.needs_namespace(self.builtin_ipam()) {
                match kube
                    .api()
                    .get(&NAMESPACES, None, &ident.namespace)
                    .await
                    .map_err(|e| api_error(&format!("reading namespace {}", ident.namespace), e))?
                {
                    Some(n) => k8s::annotations_of(&n).map_err(|e| {
                        CniError::new(
                            code::POD,
                            format!("namespace {}: metadata.annotations: {e}", ident.namespace),
                        )
                    })?,
                    None => Default::default(),
                }
            } else {
                Default::default()
            };
            let plan = k8s::address_plan(&pod, &ns, &self.conf, self.builtin_ipam())?;
            Ok(PodFacts { pod, plan })
        };
        bounded_lookup(ident, lookup).await.map(Some)
    }

    /// GET the pod; a pod that does not exist is "unknown container" (nothing to clean up).
    pub(super) async fn read_pod(
        &self,
        kube: &KubeBackend,
        ident: &Identity,
    ) -> Result<k8s::Pod, CniError> {
        let label = format!("{}/{}", ident.namespace, ident.pod);
        let obj = kube
            .api()
            .get(&PODS, Some(&ident.namespace), &ident.pod)
            .await
            .map_err(|e| api_error(&format!("reading pod {label}"), e))?
            .ok_or_else(|| {
                CniError::new(
                    code::UNKNOWN_CONTAINER,
                    format!(
                        "pod {label} does not exist in the Kubernetes API (deleted, or K8S_POD_NAMESPACE/K8S_POD_NAME name another cluster's pod); nothing was set up"
                    ),
                )
            })?;
        k8s::Pod::from_api(&obj, &ident.interface_prefix)
    }

    /// In the Kubernetes datastore the endpoint *is* the pod: its name and interface are
    /// derived from it (`<spec.nodeName>-k8s-<pod>-eth0`, prefix + hash), and Felix sees only
    /// that. The plugin's own names must be those, or its write would land on no endpoint
    /// Felix knows (and DEL would miss it).
    pub(super) fn check_kdd_names(&self, ident: &Identity, pod: &k8s::Pod) -> Result<(), CniError> {
        if pod.node_name != ident.node {
            return Err(CniError::new(
                code::NODENAME,
                format!(
                    "pod {} is scheduled on node {:?} (spec.nodeName) but this plugin's node name is {:?}: in the Kubernetes datastore they must be the same; set nodename (or the node name file) to the Kubernetes node's name",
                    pod.label(),
                    pod.node_name,
                    ident.node
                ),
            ));
        }
        if ident.endpoint != margay_kdd::pod::ENDPOINT_ETH0 {
            return Err(CniError::new(
                code::INVALID_ENV,
                format!(
                    "CNI_IFNAME is {:?}: in the Kubernetes datastore a pod's endpoint is its {} interface (the WorkloadEndpoint is derived from the pod), so margay wires only that one",
                    ident.endpoint,
                    margay_kdd::pod::ENDPOINT_ETH0
                ),
            ));
        }
        if let Some(derived) = &pod.endpoint {
            let name = ident.endpoint_name()?;
            if derived.metadata.name != name
                || derived.spec.interface_name != ident.host_veth_name()
            {
                return Err(CniError::new(
                    code::PLUGIN,
                    format!(
                        "the endpoint of pod {} would be {name} on {}, but the Kubernetes datastore derives {} on {}",
                        pod.label(),
                        ident.host_veth_name(),
                        derived.metadata.name,
                        derived.spec.interface_name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `ipAddrs` on a pod whose endpoint still names another (old) sandbox's addresses: they
    /// are released first, as Calico does, so the pod can have them again.
    pub(super) async fn release_previous_sandbox(
        &self,
        store: &Store,
        ident: &Identity,
    ) -> Result<(), CniError> {
        let key = self.endpoint_key(ident)?;
        let wep = match store.client.get(&key).await {
            Ok(Resource::WorkloadEndpoint(w)) => w,
            Ok(_) | Err(DatastoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(datastore_error("reading the pod's WorkloadEndpoint", e)),
        };
        if wep.spec.container_id == self.args.container_id {
            return Ok(()); // this container's own: its handle keeps them
        }
        let old: Vec<margay_ipam::ReleaseIp> = wep
            .spec
            .ip_networks
            .iter()
            .filter_map(|n| crate::spec::parse_cidr(n).map(|(ip, _)| ip))
            .map(|ip| margay_ipam::ReleaseIp {
                ip,
                sequence_number: None,
            })
            .collect();
        if old.is_empty() {
            return Ok(());
        }
        let released = store.ipam.release_ips(&old).await.map_err(ipam_error)?;
        tracing::info!(previous = %wep.spec.container_id, ?released, "ipAddrs: released the addresses of the pod's previous sandbox");
        Ok(())
    }
}
