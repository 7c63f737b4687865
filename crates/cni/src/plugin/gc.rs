//! GC: addresses and endpoints of attachments the runtime no longer has, released.

use super::*;

impl Call {
    /// Releases what this node holds for attachments of this network that the runtime no
    /// longer lists in `cni.dev/valid-attachments`.
    pub(super) async fn gc(&self) -> Result<(), CniError> {
        if !self.builtin_ipam() {
            tracing::info!(
                "GC: addresses belong to the delegated IPAM plugin; nothing for margay to collect"
            );
            return Ok(());
        }
        let valid: HashSet<(String, String)> = self
            .conf_value("cni.dev/valid-attachments")
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|a| {
                Some((
                    a.get("containerID")?.as_str()?.to_string(),
                    a.get("ifname")?.as_str()?.to_string(),
                ))
            })
            .collect();
        let valid_ids: HashSet<&str> = valid.iter().map(|(c, _)| c.as_str()).collect();
        let node = self.nodename().await?;
        let store = self.connect().await?;
        let prefix = format!("{}.", self.conf.name);
        let blocks = store.ipam.blocks().await.map_err(ipam_error)?;
        let mut stale: BTreeSet<String> = BTreeSet::new();
        for b in &blocks {
            for a in b.allocated() {
                let Some(h) = a.attribute.handle_id.as_deref() else {
                    continue;
                };
                let Some(cid) = h.strip_prefix(&prefix) else {
                    continue;
                };
                if a.attribute.attrs.get("node").map(String::as_str) == Some(node.as_str())
                    && !valid_ids.contains(cid)
                {
                    stale.insert(h.to_string());
                }
            }
        }
        let mut errors = Vec::new();
        for h in &stale {
            match store.ipam.release_by_handle(h).await {
                Ok(ips) => tracing::info!(handle = %h, ?ips, "GC released"),
                Err(e) => errors.push(ipam_error(e).to_string()),
            }
        }
        if self.kind == PluginKind::Main {
            let listed = store
                .client
                .list(Kind::WorkloadEndpoint, None, "")
                .await
                .map_err(|e| datastore_error("listing WorkloadEndpoints", e))?;
            for r in listed.items {
                let Resource::WorkloadEndpoint(wep) = r else {
                    continue;
                };
                // Only endpoints whose addresses this GC just released: endpoints of other
                // networks on this node are not in this network's valid attachments.
                let handle = margay_ipam::workload_handle(&self.conf.name, &wep.spec.container_id);
                if wep.spec.node != node
                    || wep.spec.container_id.is_empty()
                    || valid_ids.contains(wep.spec.container_id.as_str())
                    || !stale.contains(&handle)
                {
                    continue;
                }
                let key = ResourceKey {
                    kind: Kind::WorkloadEndpoint,
                    namespace: wep.metadata.namespace.clone(),
                    name: wep.metadata.name.clone(),
                };
                match store
                    .client
                    .delete(&key, Some(&wep.metadata.resource_version))
                    .await
                {
                    Ok(_) | Err(DatastoreError::NotFound { .. }) => {
                        tracing::info!(endpoint = %key, "GC deleted the endpoint");
                        let hv = wep.spec.interface_name.clone();
                        if !hv.is_empty()
                            && let Err(e) = blocking(move || dataplane::delete_host_link(&hv)).await
                        {
                            errors.push(e.to_string());
                        }
                    }
                    Err(e) => errors.push(format!("{key}: {e}")),
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(
                CniError::new(code::PLUGIN, format!("GC met {} error(s)", errors.len()))
                    .with_details(errors.join("; ")),
            )
        }
    }
}
