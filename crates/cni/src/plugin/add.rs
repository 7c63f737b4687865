//! ADD: the address plan, IPAM (margay's or the delegated plugin), the veth pair and routes,
//! the WorkloadEndpoint, and a roll-back that leaves nothing behind on failure.

use super::*;

impl Call {
    pub(super) async fn add(&self) -> Result<CniResult, CniError> {
        let started = std::time::Instant::now();
        if !self.builtin_ipam() {
            crate::delegate::find(&self.conf.ipam.ipam_type, &self.args.path)?;
        }
        let w = self.workload()?;
        let node = self.nodename().await?;
        let ident = self.identity(&w, &node);
        let _slot = Slot::acquire(&config::lock_path(&self.conf, &self.env), &self.env).await;
        tracing::debug!(elapsed = ?started.elapsed(), "node name known, slot held");
        let store = self.connect().await?;
        tracing::info!(container = %self.args.container_id, handle = %ident.handle(), datastore = %store.describe, "ADD");
        tracing::debug!(elapsed = ?started.elapsed(), "datastore open");
        // The pod first: whatever it says is checked before anything is written.
        let facts = self.pod_facts(&store, &ident).await?;
        if let Some(f) = &facts {
            tracing::debug!(elapsed = ?started.elapsed(), pod = %f.pod.label(), "pod read");
            if f.pod.host_network {
                // The pod shares the host's network namespace: nothing of its own to wire,
                // no address to assign (runtimes do not call CNI plugins for such pods).
                tracing::info!(pod = %f.pod.label(), "the pod uses the host's network (spec.hostNetwork); nothing to wire");
                return Ok(CniResult::default());
            }
            if store.kube().is_some() {
                self.check_kdd_names(&ident, &f.pod)?;
            }
        } else if self.conf.feature_control.floating_ips
            || self.conf.feature_control.ip_addrs_no_ipam
        {
            tracing::info!(
                "feature_control floating_ips / ip_addrs_no_ipam act on Kubernetes pods' annotations, which this call does not read"
            );
        }
        let plan = facts.as_ref().map(|f| f.plan.clone()).unwrap_or_default();
        if self.kind == PluginKind::Main {
            // First, so that a failure leaves nothing behind.
            self.ensure_network_profile(&store, &ident).await?;
        }

        let assigned = if !plan.no_ipam.is_empty() {
            // ipAddrsNoIpam: the addresses as given; IPAM holds nothing for them.
            tracing::info!(ips = ?plan.no_ipam, "ipAddrsNoIpam: using the pod's addresses without IPAM");
            plan.no_ipam
                .iter()
                .map(|ip| AssignedIp {
                    ip: *ip,
                    block: margay_api::net::Cidr::host(*ip),
                })
                .collect()
        } else if self.builtin_ipam() {
            if !plan.ips.is_empty() {
                self.release_previous_sandbox(&store, &ident).await?;
            }
            let req = self.request(&w, &plan, facts.as_ref().map(|f| f.pod.label()));
            self.addresses(&store, &ident, &req).await?.0
        } else {
            let answer = self.delegate("ADD").await?.ok_or_else(|| {
                CniError::new(
                    code::PLUGIN,
                    format!(
                        "the IPAM plugin {} printed no result",
                        self.conf.ipam.ipam_type
                    ),
                )
            })?;
            let r = CniResult::from_json(&answer).map_err(|e| {
                CniError::new(
                    code::PLUGIN,
                    format!(
                        "the IPAM plugin {} answered with an unusable result: {e}",
                        self.conf.ipam.ipam_type
                    ),
                )
            })?;
            let mut out = Vec::new();
            for ip in r.ips {
                if out
                    .iter()
                    .any(|a: &AssignedIp| a.ip.is_ipv4() == ip.ip.is_ipv4())
                {
                    continue; // one address per family, as Calico takes
                }
                let block = margay_api::net::Cidr::new(ip.ip, ip.prefix)
                    .map_err(|e| CniError::new(code::PLUGIN, format!("IPAM result: {e}")))?
                    .network();
                out.push(AssignedIp { ip: ip.ip, block });
            }
            if out.is_empty() {
                let _ = self.delegate("DEL").await;
                return Err(CniError::new(
                    code::NO_ADDRESS,
                    format!(
                        "the IPAM plugin {} assigned no address",
                        self.conf.ipam.ipam_type
                    ),
                ));
            }
            out
        };
        test_pause(&self.env, "ipam");
        if self.kind == PluginKind::Ipam {
            return Ok(CniResult {
                ips: assigned
                    .iter()
                    .map(|a| IpConfig {
                        ip: a.ip,
                        prefix: a.block.prefix(),
                        gateway: None,
                        interface: None,
                    })
                    .collect(),
                ..CniResult::default()
            });
        }
        tracing::debug!(elapsed = ?started.elapsed(), "addresses ready");
        let ips: Vec<IpAddr> = assigned.iter().map(|a| a.ip).collect();
        let done = async {
            let pod = facts.as_ref().map(|f| &f.pod);
            let nats = match pod {
                Some(p) => k8s::ip_nats(p, &plan.floating_ips, &ips)?,
                None => Vec::new(),
            };
            self.add_networking(&store, &ident, &w, pod, &nats, &ips, started)
                .await
        };
        match done.await {
            Ok(r) => Ok(r),
            Err(e) => {
                self.roll_back(&store, &ident).await;
                Err(e)
            }
        }
    }

    /// What to ask IPAM for: the configuration, overridden by the pod's annotations
    /// (`ipAddrs` over `IP=`/`args.cni.ips`, `ipFamilies` over assign_ipv4/6, the pools).
    pub(super) fn request(
        &self,
        w: &WorkloadArgs,
        plan: &AddressPlan,
        pod: Option<String>,
    ) -> Request {
        if !plan.ips.is_empty() && !w.ips.is_empty() {
            tracing::warn!(annotation = ?plan.ips, args = ?w.ips, "the pod's ipAddrs annotation wins over the addresses in CNI_ARGS/args/runtimeConfig");
        }
        let pools = |p: &Option<k8s::Pools>, conf: &Vec<String>| {
            p.as_ref().map_or_else(|| conf.clone(), |p| p.pools.clone())
        };
        Request {
            ips: if plan.ips.is_empty() {
                w.ips.clone()
            } else {
                plan.ips.clone()
            },
            ips_origin: (!plan.ips.is_empty()).then(|| {
                format!(
                    "pod {}'s annotation {}",
                    pod.unwrap_or_default(),
                    k8s::ANNOTATION_IP_ADDRS
                )
            }),
            v4: plan.families.map_or(self.conf.ipam.v4(), |f| f.v4),
            v6: plan.families.map_or(self.conf.ipam.v6(), |f| f.v6),
            v4_pools: pools(&plan.v4_pools, &self.conf.ipam.ipv4_pools),
            v6_pools: pools(&plan.v6_pools, &self.conf.ipam.ipv6_pools),
            pools_origin: [plan.v4_pools.clone(), plan.v6_pools.clone()],
        }
    }

    /// Calico's profile handling: unless the config names a policy handler (`policy.type`),
    /// the network's profile (`workload::network_profile`) is created when it does not exist,
    /// and never updated. Two ADDs racing to create it both succeed.
    pub(super) async fn ensure_network_profile(
        &self,
        store: &Store,
        ident: &Identity,
    ) -> Result<(), CniError> {
        if !self.conf.policy.policy_type.is_empty() {
            return Ok(());
        }
        let key = ResourceKey {
            kind: Kind::Profile,
            namespace: String::new(),
            name: self.conf.name.clone(),
        };
        match store.client.get(&key).await {
            Ok(_) => return Ok(()),
            Err(DatastoreError::NotFound { .. }) => {}
            Err(e) => return Err(datastore_error("reading the network's profile", e)),
        }
        let profile = crate::workload::network_profile(&self.conf.name, ident.is_k8s());
        match store.client.create(Resource::Profile(profile)).await {
            Ok(_) => {
                tracing::info!(profile = %self.conf.name, "created the network's profile");
                Ok(())
            }
            Err(DatastoreError::AlreadyExists { .. }) => Ok(()),
            Err(e @ DatastoreError::Validation { .. }) => Err(CniError::new(
                code::INVALID_CONFIG,
                format!(
                    "the network name {:?} cannot name its profile: {e} (use a name of lower-case letters, digits, '-' and '.', or set policy.type to manage policy elsewhere)",
                    self.conf.name
                ),
            )),
            Err(e) => Err(datastore_error("creating the network's profile", e)),
        }
    }

    /// The container's addresses: the ones its handle already holds (a repeated ADD gets the
    /// same addresses), completed by new ones. Returns all of them and the new ones.
    pub(super) async fn addresses(
        &self,
        store: &Store,
        ident: &Identity,
        req: &Request,
    ) -> Result<(Vec<AssignedIp>, Vec<AssignedIp>), CniError> {
        let handle = ident.handle();
        let held = store
            .ipam
            .ips_by_handle(&handle)
            .await
            .map_err(ipam_error)?;
        let attrs = ident.ipam_attrs(&margay_datastore::util::now_rfc3339());
        let mut fresh = Vec::new();
        let mut out: Vec<AssignedIp> = Vec::new();
        if !req.ips.is_empty() {
            for ip in &req.ips {
                if let Some(h) = held.iter().find(|h| h.ip == *ip) {
                    out.push(*h);
                    continue;
                }
                match store
                    .ipam
                    .assign_ip(*ip, &handle, &attrs, &node_of(ident))
                    .await
                {
                    Ok(a) => {
                        fresh.push(a);
                        out.push(a);
                    }
                    Err(e) => {
                        self.release_fresh(store, &fresh).await;
                        return Err(req.ip_error(e));
                    }
                }
            }
            return Ok((out, fresh));
        }
        let (want4, want6) = (req.v4, req.v6);
        let have4 = held.iter().find(|a| a.ip.is_ipv4()).copied();
        let have6 = held.iter().find(|a| a.ip.is_ipv6()).copied();
        let mut args = AssignArgs::new(handle.clone(), node_of(ident));
        args.num_v4 = usize::from(want4 && have4.is_none());
        args.num_v6 = usize::from(want6 && have6.is_none());
        args.attrs = attrs;
        args.v4_pools = req.v4_pools.clone();
        args.v6_pools = req.v6_pools.clone();
        if args.num_v4 + args.num_v6 > 0 {
            let got = store
                .ipam
                .auto_assign(&args)
                .await
                .map_err(|e| req.error(e))?;
            fresh.extend(got.all().copied());
        }
        if want4 {
            out.extend(have4.or_else(|| fresh.iter().find(|a| a.ip.is_ipv4()).copied()));
        }
        if want6 {
            out.extend(have6.or_else(|| fresh.iter().find(|a| a.ip.is_ipv6()).copied()));
        }
        if held.is_empty() {
            tracing::info!(ips = ?out.iter().map(|a| a.ip).collect::<Vec<_>>(), "assigned");
        } else {
            tracing::info!(ips = ?out.iter().map(|a| a.ip).collect::<Vec<_>>(), "reusing the addresses this container already holds");
        }
        Ok((out, fresh))
    }

    pub(super) async fn release_fresh(&self, store: &Store, fresh: &[AssignedIp]) {
        if fresh.is_empty() {
            return;
        }
        let ips: Vec<margay_ipam::ReleaseIp> = fresh
            .iter()
            .map(|a| margay_ipam::ReleaseIp {
                ip: a.ip,
                sequence_number: None,
            })
            .collect();
        if let Err(e) = store.ipam.release_ips(&ips).await {
            tracing::error!("releasing addresses after a failed ADD: {e}");
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn add_networking(
        &self,
        store: &Store,
        ident: &Identity,
        w: &WorkloadArgs,
        pod: Option<&k8s::Pod>,
        nats: &[margay_api::endpoint::IpNat],
        ips: &[IpAddr],
        started: std::time::Instant,
    ) -> Result<CniResult, CniError> {
        let host_veth = ident.host_veth_name();
        let mtu = self.mtu();
        if self.conf.device_type == "netkit" {
            tracing::info!("device_type netkit is not supported by margay yet; using veth");
        }
        let set_up = {
            let (hv, ifname, netns, ips) = (
                host_veth.clone(),
                self.args.ifname.clone(),
                PathBuf::from(&self.args.netns),
                ips.to_vec(),
            );
            let fwd = self.conf.container_settings.allow_ip_forwarding;
            blocking(move || {
                dataplane::set_up(&dataplane::Spec {
                    host_veth: &hv,
                    ifname: &ifname,
                    netns: &netns,
                    mtu,
                    ips: &ips,
                    allow_ip_forwarding: fwd,
                })
            })
            .await?
        };
        tracing::debug!(elapsed = ?started.elapsed(), "interfaces ready");
        test_pause(&self.env, "veth");
        let mut wep = ident.endpoint(
            w,
            pod.and_then(|p| p.endpoint.as_ref()),
            &host_veth,
            &set_up.container_mac,
            ips,
        )?;
        wep.spec.ip_nats = nats.to_vec();
        if let Some(p) = pod
            && store.kube().is_some()
        {
            // The write is a patch of this pod: its uid makes it a precondition, so a pod
            // re-created under the same name meanwhile is not patched.
            wep.metadata.uid = p.uid.clone();
        }
        let status_file = margay_api::endpoint::endpoint_status_file_name(
            &wep.spec.orchestrator,
            &wep.spec
                .workload_id(&wep.metadata.namespace, &wep.metadata.name),
            &wep.spec.endpoint_id(),
        );
        store
            .client
            .apply(Resource::WorkloadEndpoint(wep))
            .await
            .map_err(|e| datastore_error("writing the WorkloadEndpoint", e))?;
        tracing::debug!(elapsed = ?started.elapsed(), "endpoint written");
        if self.conf.policy_setup_timeout_seconds > 0 {
            // Wait (bounded) for Felix to report the endpoint's policy in place, as Calico's
            // plugin does; a timeout lets the pod start anyway.
            let dir = if self.conf.endpoint_status_dir.is_empty() {
                PathBuf::from("/var/run/calico/endpoint-status")
            } else {
                PathBuf::from(&self.conf.endpoint_status_dir)
            };
            let path = dir.join(&status_file);
            let limit = std::time::Duration::from_secs(
                u64::try_from(self.conf.policy_setup_timeout_seconds).unwrap_or(0),
            );
            let waited = std::time::Instant::now();
            loop {
                if path.exists() {
                    tracing::info!(elapsed = ?waited.elapsed(), "policy for the endpoint is in place");
                    break;
                }
                if waited.elapsed() >= limit {
                    tracing::warn!(
                        file = %path.display(),
                        "Felix did not report the endpoint's policy within policy_setup_timeout_seconds; unblocking pod creation"
                    );
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        let mut result = CniResult {
            interfaces: vec![
                Interface {
                    name: host_veth,
                    ..Interface::default()
                },
                Interface {
                    name: self.args.ifname.clone(),
                    mac: set_up.container_mac,
                    mtu: Some(mtu),
                    sandbox: self.args.netns.clone(),
                },
            ],
            ..CniResult::default()
        };
        // The default routes set up in the container.
        if ips.iter().any(IpAddr::is_ipv4) {
            result.routes.push(crate::spec::Route {
                dst: "0.0.0.0/0".into(),
                gw: Some(IpAddr::V4(crate::workload::GATEWAY_V4)),
            });
        }
        if let Some(gw) = set_up.gateway_v6 {
            result.routes.push(crate::spec::Route {
                dst: "::/0".into(),
                gw: Some(IpAddr::V6(gw)),
            });
        }
        result.ips = ips
            .iter()
            .map(|ip| IpConfig {
                ip: *ip,
                prefix: if ip.is_ipv4() { 32 } else { 128 },
                gateway: None,
                interface: Some(1),
            })
            .collect();
        Ok(result)
    }

    /// Undoes a failed ADD: the container's addresses, its interfaces and its endpoint.
    pub(super) async fn roll_back(&self, store: &Store, ident: &Identity) {
        if self.builtin_ipam() {
            if let Err(e) = store.ipam.release_by_handle(&ident.handle()).await {
                tracing::error!(handle = %ident.handle(), "releasing the addresses of a failed ADD: {e}");
            }
        } else if let Err(e) = self.delegate("DEL").await {
            tracing::error!("releasing the addresses of a failed ADD: {e}");
        }
        let hv = ident.host_veth_name();
        if let Err(e) = blocking(move || dataplane::delete_host_link(&hv)).await {
            tracing::error!("removing the interfaces of a failed ADD: {e}");
        }
        if let Ok(key) = self.endpoint_key(ident)
            && let Ok(Resource::WorkloadEndpoint(wep)) = store.client.get(&key).await
            && wep.spec.container_id == self.args.container_id
            && let Err(e) = store
                .client
                .delete(&key, Some(&wep.metadata.resource_version))
                .await
        {
            tracing::error!("removing the endpoint of a failed ADD: {e}");
        }
    }

    pub(super) fn endpoint_key(&self, ident: &Identity) -> Result<ResourceKey, CniError> {
        Ok(ResourceKey {
            kind: Kind::WorkloadEndpoint,
            namespace: ident.namespace.clone(),
            name: ident.endpoint_name()?,
        })
    }
}
