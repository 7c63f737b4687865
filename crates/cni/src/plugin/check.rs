//! CHECK: the interfaces, addresses, routes and WorkloadEndpoint compared with the config.

use super::*;

impl Call {
    pub(super) async fn check(&self) -> Result<(), CniError> {
        let prev = self
            .conf
            .prev_result
            .as_ref()
            .filter(|v| !v.is_null())
            .ok_or_else(|| {
                CniError::new(
                    code::INVALID_CONFIG,
                    "CHECK needs prevResult in the network configuration (the result of ADD)",
                )
            })?;
        let prev = CniResult::from_json(prev)
            .map_err(|e| CniError::new(code::INVALID_CONFIG, format!("prevResult: {e}")))?;
        let w = self.workload()?;
        let node = self.nodename().await?;
        let ident = self.identity(&w, &node);
        let store = self.connect().await?;
        if prev.ips.is_empty() && prev.interfaces.is_empty() && self.looks_up_pods(&ident, &store) {
            // The empty result ADD gives a host-network pod: nothing to check.
            let pod = bounded_lookup(&ident, async {
                let kube = self.kube_client(&store).await?;
                self.read_pod(&kube, &ident).await
            })
            .await?;
            if pod.host_network {
                return Ok(());
            }
        }
        let mut problems = Vec::new();
        let expected: BTreeSet<IpAddr> = prev.ips.iter().map(|i| i.ip).collect();
        if expected.is_empty() {
            problems.push("prevResult has no addresses".to_string());
        }
        if self.builtin_ipam() {
            let held: BTreeSet<IpAddr> = store
                .ipam
                .ips_by_handle(&ident.handle())
                .await
                .map_err(ipam_error)?
                .iter()
                .map(|a| a.ip)
                .collect();
            if held != expected {
                problems.push(format!(
                    "IPAM handle {} holds {:?}, prevResult says {:?}",
                    ident.handle(),
                    held,
                    expected
                ));
            }
        } else if let Err(e) = self.delegate("CHECK").await {
            problems.push(e.to_string());
        }
        if self.kind == PluginKind::Main {
            let host_veth = ident.host_veth_name();
            let key = self.endpoint_key(&ident)?;
            match store.client.get(&key).await {
                Ok(Resource::WorkloadEndpoint(wep)) => {
                    if wep.spec.container_id != self.args.container_id {
                        problems.push(format!(
                            "WorkloadEndpoint {key} belongs to container {}",
                            wep.spec.container_id
                        ));
                    }
                    if wep.spec.interface_name != host_veth {
                        problems.push(format!(
                            "WorkloadEndpoint {key} names interface {}, expected {host_veth}",
                            wep.spec.interface_name
                        ));
                    }
                    let nets: BTreeSet<IpAddr> = wep
                        .spec
                        .ip_networks
                        .iter()
                        .filter_map(|n| crate::spec::parse_cidr(n).map(|(ip, _)| ip))
                        .collect();
                    if nets != expected {
                        problems.push(format!(
                            "WorkloadEndpoint {key} has ipNetworks {:?}, expected {:?}",
                            wep.spec.ip_networks, expected
                        ));
                    }
                }
                Ok(_) | Err(DatastoreError::NotFound { .. }) => {
                    problems.push(format!("WorkloadEndpoint {key} does not exist"));
                }
                Err(e) => return Err(datastore_error("reading the WorkloadEndpoint", e)),
            }
            let (netns, ifname, ips) = (
                PathBuf::from(&self.args.netns),
                self.args.ifname.clone(),
                expected.iter().copied().collect::<Vec<_>>(),
            );
            let hv = host_veth.clone();
            let mtu = self.mtu();
            let found = blocking(move || {
                dataplane::check(&dataplane::Spec {
                    host_veth: &hv,
                    ifname: &ifname,
                    netns: &netns,
                    mtu,
                    ips: &ips,
                    allow_ip_forwarding: false,
                })
            })
            .await?;
            problems.extend(found);
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(CniError::new(
                code::CHECK_FAILED,
                format!(
                    "CHECK found {} problem(s) with container {}",
                    problems.len(),
                    self.args.container_id
                ),
            )
            .with_details(problems.join("; ")))
        }
    }
}
