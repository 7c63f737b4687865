//! The cluster's defaults start-up creates when missing: IP pools (Calico's default CIDRs,
//! kubeadm's pod CIDRs), IPAM configuration, the default tier and configurations, and
//! ClusterInformation.

use super::*;

pub(super) async fn ensure_pools<B: KvBackend>(
    cfg: &StartupConfig,
    client: &Client<B>,
    net: &dyn NetView,
    opts: &StartupOptions,
    facts: &ClusterFacts,
    outcome: &mut Outcome,
) -> Result<(), StartupError> {
    if cfg.ipv4_pool.is_none() && cfg.ipv6_pool.is_none() {
        tracing::info!("NO_DEFAULT_POOLS=true: not creating IP pools");
        return Ok(());
    }
    let pools = client.list(Kind::IPPool, None, "").await?;
    let present = |v4: bool| {
        pools.items.iter().any(|p| match p {
            Resource::IPPool(p) => Cidr::parse(&p.spec.cidr).is_ok_and(|c| c.is_ipv4() == v4),
            _ => false,
        })
    };
    // kubeadm's pod CIDRs stand in for CALICO_IPV4POOL_CIDR / CALICO_IPV6POOL_CIDR when
    // those are unset (Calico's rule).
    let kubeadm = facts
        .kubeadm_config
        .as_ref()
        .map(kubeadm_pod_subnets)
        .unwrap_or_default();
    let choose = |given: Option<Cidr>, from_kubeadm: Option<Cidr>, var: &'static str| match (
        given,
        from_kubeadm,
    ) {
        (Some(c), _) => Some((c.network(), var)),
        (None, Some(c)) => {
            tracing::info!(cidr = %c, "using the pod CIDR of ConfigMap kube-system/kubeadm-config ({var} is unset)");
            Some((c, KUBEADM_SOURCE))
        }
        (None, None) => None,
    };
    if let Some(PoolSetting::Create(params)) = &cfg.ipv4_pool {
        if present(true) {
            tracing::info!("an IPv4 pool exists; not creating the default one");
        } else {
            let (cidr, source) = choose(params.cidr, kubeadm.v4, "CALICO_IPV4POOL_CIDR")
                .unwrap_or_else(|| (default_ipv4_pool(net), "CALICO_IPV4POOL_CIDR"));
            create_pool(
                client,
                4,
                DEFAULT_IPV4_POOL_NAME,
                cidr,
                source,
                params,
                outcome,
            )
            .await?;
        }
    }
    if let Some(PoolSetting::Create(params)) = &cfg.ipv6_pool {
        if present(false) {
            tracing::info!("an IPv6 pool exists; not creating the default one");
        } else if !cfg.ipv6_support || !opts.kernel_has_ipv6 {
            tracing::info!(
                "IPv6 is not supported here (FELIX_IPV6SUPPORT or kernel); no default IPv6 pool"
            );
        } else {
            let (cidr, source) = choose(params.cidr, kubeadm.v6, "CALICO_IPV6POOL_CIDR")
                .unwrap_or_else(|| (random_ula_48(), "CALICO_IPV6POOL_CIDR"));
            create_pool(
                client,
                6,
                DEFAULT_IPV6_POOL_NAME,
                cidr,
                source,
                params,
                outcome,
            )
            .await?;
        }
    }
    Ok(())
}

/// Names kubeadm's ConfigMap as the source of a default pool's CIDR in errors.
pub(super) const KUBEADM_SOURCE: &str = "podSubnet of ConfigMap kube-system/kubeadm-config (set CALICO_IPV4POOL_CIDR / CALICO_IPV6POOL_CIDR to override it)";

/// Calico's default IPv4 pool: 192.168.0.0/16, unless a host address is inside it, then the
/// first of 172.16-31.0.0/16 that holds none.
pub(super) fn default_ipv4_pool(net: &dyn NetView) -> Cidr {
    let host: Vec<IpAddr> = net
        .interfaces()
        .unwrap_or_default()
        .iter()
        .flat_map(|i| i.addrs.iter().map(Cidr::addr))
        .filter(IpAddr::is_ipv4)
        .collect();
    let free = |c: &Cidr| !host.iter().any(|a| c.contains(*a));
    let preferred = Cidr::parse(DEFAULT_IPV4_POOL_CIDR)
        .unwrap_or_else(|_| Cidr::host(IpAddr::from([192, 168, 0, 0])));
    if free(&preferred) {
        return preferred;
    }
    for second in 16..=31u8 {
        if let Ok(c) = Cidr::new(IpAddr::from([172, second, 0, 0]), 16)
            && free(&c)
        {
            tracing::info!(pool = %c, "192.168.0.0/16 overlaps a host address; using a fallback");
            return c;
        }
    }
    preferred
}

/// fdXX:XXXX:XXXX::/48 with 40 random bits (RFC 4193), as Calico generates.
pub(super) fn random_ula_48() -> Cidr {
    let uid = margay_datastore::util::new_uid().replace('-', "");
    let byte =
        |i: usize| u8::from_str_radix(uid.get(2 * i..2 * i + 2).unwrap_or("00"), 16).unwrap_or(0);
    let mut octets = [0u8; 16];
    octets[0] = 0xfd;
    for (i, o) in octets.iter_mut().enumerate().take(6).skip(1) {
        *o = byte(i);
    }
    Cidr::new(IpAddr::from(octets), 48).unwrap_or_else(|_| Cidr::host(IpAddr::from(octets)))
}

pub(super) async fn create_pool<B: KvBackend>(
    client: &Client<B>,
    version: u8,
    name: &str,
    cidr: Cidr,
    source: &'static str,
    params: &PoolParams,
    outcome: &mut Outcome,
) -> Result<(), StartupError> {
    let spec = IPPoolSpec {
        cidr: cidr.to_string(),
        ipip_mode: Some(params.ipip),
        vxlan_mode: Some(params.vxlan),
        nat_outgoing: params.nat_outgoing,
        block_size: Some(params.block_size),
        node_selector: params.node_selector.clone(),
        disable_bgp_export: params.disable_bgp_export,
        ..IPPoolSpec::default()
    };
    let pool = Resource::IPPool(IPPool::new(ObjectMeta::named(name), spec));
    match client.create(pool).await {
        Ok(_) => {
            tracing::info!(pool = name, %cidr, nat_outgoing = params.nat_outgoing, ipip = ?params.ipip, vxlan = ?params.vxlan, "created the default IPv{version} pool");
            outcome.created.push(format!("IPPool {name:?} ({cidr})"));
            Ok(())
        }
        // Another node got there first.
        Err(DatastoreError::AlreadyExists { .. }) => Ok(()),
        Err(DatastoreError::Validation { errors, .. }) => Err(StartupError::Pool {
            version,
            var: source,
            message: format!("the pool {cidr} would be invalid: {errors}"),
        }),
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn ensure_defaults<B: KvBackend>(
    cfg: &StartupConfig,
    node_name: &str,
    client: &Client<B>,
    opts: &StartupOptions,
    facts: &ClusterFacts,
    outcome: &mut Outcome,
) -> Result<(), StartupError> {
    ensure_cluster_information(cfg, client, opts, facts, outcome).await?;
    for (name, order, action) in [
        (
            margay_api::policy::DEFAULT_TIER,
            margay_api::policy::DEFAULT_TIER_ORDER,
            Action::Deny,
        ),
        (
            margay_api::policy::KUBE_ADMIN_TIER,
            margay_api::policy::KUBE_ADMIN_TIER_ORDER,
            Action::Pass,
        ),
        (
            margay_api::policy::KUBE_BASELINE_TIER,
            margay_api::policy::KUBE_BASELINE_TIER_ORDER,
            Action::Pass,
        ),
    ] {
        let tier = Resource::Tier(Tier::new(
            ObjectMeta::named(name),
            TierSpec {
                order: Some(order),
                default_action: Some(action),
            },
        ));
        create_missing(client, tier, outcome).await?;
    }

    // FelixConfiguration "default": reporting off and Info logging unless set.
    complete_or_create(client, Kind::FelixConfiguration, "default", outcome, |r| {
        let Resource::FelixConfiguration(f) = r else {
            return false;
        };
        let mut changed = false;
        if f.spec.reporting_interval.is_none() {
            f.spec.reporting_interval = Some(margay_api::duration::Duration::new("0s"));
            changed = true;
        }
        if f.spec
            .log_severity_screen
            .as_deref()
            .unwrap_or_default()
            .is_empty()
        {
            f.spec.log_severity_screen = Some("Info".into());
            changed = true;
        }
        changed
    })
    .await?;
    // FelixConfiguration "node.<name>": workload-to-host traffic returns to the host's
    // chains unless set (Calico does this for non-Kubernetes datastores only).
    if !opts.kubernetes_datastore {
        complete_or_create(
            client,
            Kind::FelixConfiguration,
            &format!("node.{node_name}"),
            outcome,
            |r| {
                let Resource::FelixConfiguration(f) = r else {
                    return false;
                };
                if f.spec
                    .default_endpoint_to_host_action
                    .as_deref()
                    .unwrap_or_default()
                    .is_empty()
                {
                    f.spec.default_endpoint_to_host_action = Some("Return".into());
                    true
                } else {
                    false
                }
            },
        )
        .await?;
    }
    create_missing(
        client,
        Resource::BGPConfiguration(BGPConfiguration::new(
            ObjectMeta::named("default"),
            Default::default(),
        )),
        outcome,
    )
    .await?;
    let ipam = IPAMConfigurationSpec {
        strict_affinity: false,
        max_blocks_per_host: None,
        auto_allocate_blocks: true,
        kube_virt_vm_address_persistence: Some(VmAddressPersistence::Enabled),
        ip_cooldown_seconds: None,
    };
    create_missing(
        client,
        Resource::IPAMConfiguration(IPAMConfiguration::new(ObjectMeta::named("default"), ipam)),
        outcome,
    )
    .await?;
    let _ = cfg;
    Ok(())
}

pub(super) async fn ensure_cluster_information<B: KvBackend>(
    cfg: &StartupConfig,
    client: &Client<B>,
    opts: &StartupOptions,
    facts: &ClusterFacts,
    outcome: &mut Outcome,
) -> Result<(), StartupError> {
    let version = opts.version.clone();
    let wanted_types = cluster_types(
        &cfg.cluster_type,
        facts.kubeadm_config.is_some(),
        facts.rancher_state,
        opts.kubernetes_datastore,
    );
    complete_or_create(client, Kind::ClusterInformation, "default", outcome, |r| {
        let Resource::ClusterInformation(ci) = r else {
            return false;
        };
        let s = &mut ci.spec;
        let mut changed = false;
        if !version.is_empty() && s.calico_version != version {
            s.calico_version = version.clone();
            changed = true;
        }
        if s.cluster_guid.is_empty() {
            s.cluster_guid = margay_datastore::util::new_uid().replace('-', "");
            changed = true;
        }
        if s.datastore_ready.is_none() {
            s.datastore_ready = Some(true);
            changed = true;
        }
        let mut types: Vec<String> = s
            .cluster_type
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect();
        for t in &wanted_types {
            if !types.contains(t) {
                types.push(t.clone());
                changed = true;
            }
        }
        s.cluster_type = types.join(",");
        changed
    })
    .await
}

/// Creates `r` unless a resource with its key exists (never overwrites).
pub(super) async fn create_missing<B: KvBackend>(
    client: &Client<B>,
    r: Resource,
    outcome: &mut Outcome,
) -> Result<(), StartupError> {
    let label = format!("{} {:?}", r.kind(), r.name());
    match client.create(r).await {
        Ok(_) => {
            tracing::info!(resource = %label, "created default");
            outcome.created.push(label);
            Ok(())
        }
        Err(DatastoreError::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Creates the named resource (empty, then completed by `complete`), or completes an
/// existing one: `complete` fills in what is missing and says whether it changed anything.
pub(super) async fn complete_or_create<B: KvBackend>(
    client: &Client<B>,
    kind: Kind,
    name: &str,
    outcome: &mut Outcome,
    complete: impl Fn(&mut Resource) -> bool,
) -> Result<(), StartupError> {
    let key = ResourceKey {
        kind,
        namespace: String::new(),
        name: name.to_string(),
    };
    for _ in 0..WRITE_ATTEMPTS {
        match client.get(&key).await {
            Ok(mut r) => {
                if !complete(&mut r) {
                    return Ok(());
                }
                match client.update(r).await {
                    Ok(_) => {
                        outcome.created.push(format!("{kind} {name:?} (completed)"));
                        return Ok(());
                    }
                    Err(DatastoreError::Conflict { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Err(DatastoreError::NotFound { .. }) => {
                let mut r = empty(kind, name);
                complete(&mut r);
                match client.create(r).await {
                    Ok(_) => {
                        tracing::info!(resource = %format!("{kind} {name:?}"), "created default");
                        outcome.created.push(format!("{kind} {name:?}"));
                        return Ok(());
                    }
                    Err(DatastoreError::AlreadyExists { .. }) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

pub(super) fn empty(kind: Kind, name: &str) -> Resource {
    let meta = ObjectMeta::named(name);
    match kind {
        Kind::ClusterInformation => {
            Resource::ClusterInformation(ClusterInformation::new(meta, Default::default()))
        }
        _ => Resource::FelixConfiguration(FelixConfiguration::new(meta, Default::default())),
    }
}
