//! The Node's addresses: given, autodetected or kept per family, and the conflict check
//! against other nodes.

use super::*;

/// Applies IP / IP6 and autodetection to the Node. Returns whether an address or the
/// interface list changed (then conflicts with other nodes are checked).
pub(super) fn configure_addresses(
    cfg: &StartupConfig,
    node: &mut Node,
    net: &dyn NetView,
    facts: &ClusterFacts,
    outcome: &mut Outcome,
) -> Result<bool, StartupError> {
    if cfg.backend == NetworkingBackend::None {
        return Ok(false);
    }
    let mut bgp = node.spec.bgp.take().unwrap_or_default();
    let (old4, old6, old_ifaces) = (
        bgp.ipv4_address.clone(),
        bgp.ipv6_address.clone(),
        node.spec.interfaces.clone(),
    );

    // kubernetes-internal-ip reads the Kubernetes Node's InternalIPs: the Node read from the
    // cluster (CALICO_K8S_NODE_REF's, or this node's), else the Node's addresses of type
    // InternalIP, which the Kubernetes datastore derives from the same Kubernetes Node.
    let internal_ips: Vec<IpAddr> = if facts.kubernetes {
        facts.internal_ips.clone()
    } else {
        node.spec
            .addresses
            .iter()
            .filter(|a| a.type_ == "InternalIP")
            .filter_map(|a| a.address.parse().ok())
            .collect()
    };
    let v4_auto = matches!(cfg.ipv4, AddressSetting::Autodetect)
        || (cfg.ipv4 == AddressSetting::Unset && bgp.ipv4_address.is_empty());
    bgp.ipv4_address = choose(
        Family::V4,
        "IP",
        v4_auto,
        &cfg.ipv4,
        &cfg.ipv4_method,
        "IP_AUTODETECTION_METHOD",
        &bgp.ipv4_address,
        net,
        &internal_ips,
        outcome,
    )?;
    let v6_auto = matches!(cfg.ipv6, AddressSetting::Autodetect);
    bgp.ipv6_address = choose(
        Family::V6,
        "IP6",
        v6_auto,
        &cfg.ipv6,
        &cfg.ipv6_method,
        "IP6_AUTODETECTION_METHOD",
        &bgp.ipv6_address,
        net,
        &internal_ips,
        outcome,
    )?;

    // With IP or IP6 set, record the host's (non-excluded) interfaces on the Node, as Calico
    // does; otherwise the list is cleared.
    let explicit =
        |s: &AddressSetting| !matches!(s, AddressSetting::Unset | AddressSetting::Disabled);
    let mut families = Vec::new();
    if explicit(&cfg.ipv4) {
        families.push(true);
    }
    if explicit(&cfg.ipv6) {
        families.push(false);
    }
    let mut ifaces: Vec<NodeInterface> = Vec::new();
    if !families.is_empty() {
        let all = net.interfaces().map_err(|e| {
            StartupError::Address(format!("cannot list the host's interfaces: {e}"))
        })?;
        // Interfaces without an address of the families are listed too, as Calico does.
        for i in all
            .iter()
            .filter(|i| !autodetect::excluded_by_default(&i.name))
        {
            let addresses: Vec<String> = i
                .addrs
                .iter()
                .filter(|a| families.contains(&a.is_ipv4()))
                .map(|a| a.addr().to_string())
                .collect();
            ifaces.push(NodeInterface {
                name: i.name.clone(),
                addresses,
            });
        }
        ifaces.sort_by(|a, b| a.name.cmp(&b.name));
    }
    node.spec.interfaces = ifaces;

    if bgp.ipv4_address.is_empty() && bgp.ipv6_address.is_empty() {
        return Err(StartupError::Address(
            "no IPv4 or IPv6 address was configured or detected, and Calico networking needs one: set IP (or IP6) to an address or to autodetect, choose another IP_AUTODETECTION_METHOD, or set CALICO_NETWORKING_BACKEND=none".into(),
        ));
    }
    let changed =
        bgp.ipv4_address != old4 || bgp.ipv6_address != old6 || node.spec.interfaces != old_ifaces;
    node.spec.bgp = Some(bgp);
    Ok(changed)
}

/// One family's address: autodetected, given, kept or none.
#[allow(clippy::too_many_arguments)]
pub(super) fn choose(
    family: Family,
    var: &'static str,
    autodetect_now: bool,
    setting: &AddressSetting,
    method: &str,
    method_var: &'static str,
    existing: &str,
    net: &dyn NetView,
    internal_ips: &[IpAddr],
    outcome: &mut Outcome,
) -> Result<String, StartupError> {
    let version = if matches!(family, Family::V4) { 4 } else { 6 };
    if autodetect_now {
        // An unknown method is fatal; a bad regex or CIDR only makes detection fail (a Node
        // that already has an address keeps it), as in Calico.
        let detected = match Method::parse(method) {
            Ok(m) => autodetect::autodetect(&m, family, net, internal_ips),
            Err(e @ autodetect::AutodetectError::UnknownMethod { .. }) => {
                return Err(StartupError::Config(crate::config::ConfigError {
                    var: method_var,
                    value: method.to_string(),
                    problem: e.to_string(),
                }));
            }
            Err(e) => Err(e),
        };
        return match detected {
            Ok(d) => {
                outcome.decisions.extend(d.decisions.iter().cloned());
                tracing::info!(address = %d.address, interface = %d.interface, "autodetected the IPv{version} address");
                Ok(d.address.to_string())
            }
            Err(e) if existing.is_empty() => Err(StartupError::Address(format!(
                "cannot autodetect an IPv{version} address: {e} (choose another {method_var}, or set {var} to the address)"
            ))),
            Err(e) => {
                tracing::warn!(error = %e, kept = existing, "IPv{version} autodetection failed; keeping the Node's current address");
                Ok(existing.to_string())
            }
        };
    }
    match setting {
        AddressSetting::Given(value) => {
            let given = if value.contains('/') {
                Cidr::parse(value)
                    .map_err(|e| StartupError::Address(format!("{var}={value:?}: {e}")))?
            } else {
                let ip: IpAddr = value.parse().map_err(|_| {
                    StartupError::Address(format!("{var}={value:?} is not an IP address or CIDR"))
                })?;
                // A bare address takes its prefix length from the interface that holds it.
                match autodetect::interface_holding(ip, net) {
                    Ok(Some((iface, cidr))) => {
                        outcome
                            .decisions
                            .push(format!("{var}={value}: found on {iface} as {cidr}"));
                        cidr
                    }
                    _ => {
                        tracing::warn!(
                            "{var}={value} is not assigned to any interface of this host"
                        );
                        Cidr::host(ip)
                    }
                }
            };
            if given.version() != version {
                return Err(StartupError::Address(format!(
                    "{var}={value:?} is not an IPv{version} address"
                )));
            }
            Ok(given.to_string())
        }
        // Unset (with an address already on the Node) or none: keep what is there.
        _ => Ok(existing.to_string()),
    }
}

/// Another node using one of our addresses is a conflict: returns the message naming both.
pub(super) async fn check_conflicts_with_others<B: KvBackend>(
    client: &Client<B>,
    node: &Node,
) -> Result<Result<(), String>, StartupError> {
    let ours = |s: &str| Cidr::parse_cidr_or_ip(s).ok().map(|c| c.addr());
    let bgp = node.spec.bgp.clone().unwrap_or_default();
    let (our4, our6) = (ours(&bgp.ipv4_address), ours(&bgp.ipv6_address));
    let nodes = client.list(Kind::Node, None, "").await?;
    for other in nodes.items {
        let Resource::Node(other) = other else {
            continue;
        };
        if other.metadata.name == node.metadata.name {
            continue;
        }
        let Some(theirs) = &other.spec.bgp else {
            continue;
        };
        for (mine, their) in [
            (our4, ours(&theirs.ipv4_address)),
            (our6, ours(&theirs.ipv6_address)),
        ] {
            if let (Some(m), Some(t)) = (mine, their)
                && m == t
            {
                return Ok(Err(format!(
                    "node {:?} is already using {m}, which this node {:?} would use: give each node its own address (IP / IP6), pick another interface with IP_AUTODETECTION_METHOD, or set DISABLE_NODE_IP_CHECK=true if this is intended",
                    other.metadata.name, node.metadata.name
                )));
            }
        }
    }
    Ok(Ok(()))
}

/// After a conflict, remove autodetected addresses from the stored Node so it does not keep
/// claiming another node's address.
pub(super) async fn clear_autodetected<B: KvBackend>(
    cfg: &StartupConfig,
    client: &Client<B>,
    stored: &Node,
) {
    let mut node = stored.clone();
    let Some(bgp) = node.spec.bgp.as_mut() else {
        return;
    };
    let mut changed = false;
    if cfg.ipv4 == AddressSetting::Autodetect && !bgp.ipv4_address.is_empty() {
        bgp.ipv4_address.clear();
        changed = true;
    }
    if cfg.ipv6 == AddressSetting::Autodetect && !bgp.ipv6_address.is_empty() {
        bgp.ipv6_address.clear();
        changed = true;
    }
    if node
        .spec
        .bgp
        .as_ref()
        .is_some_and(|b| b == &NodeBgpSpec::default())
    {
        node.spec.bgp = None;
    }
    if changed && let Err(e) = client.update(Resource::Node(node)).await {
        tracing::warn!(error = %e, "could not clear the conflicting address from the Node");
    }
}
