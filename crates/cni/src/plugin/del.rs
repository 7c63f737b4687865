//! DEL: the interface, the addresses and the WorkloadEndpoint, each already gone being fine.

use super::*;

impl Call {
    pub(super) async fn del(&self) -> Result<(), CniError> {
        let w = self.workload()?;
        let node = self.nodename().await?;
        let ident = self.identity(&w, &node);
        let _slot = Slot::acquire(&config::lock_path(&self.conf, &self.env), &self.env).await;
        let mut errors: Vec<CniError> = Vec::new();
        let store = match self.connect().await {
            Ok(s) => Some(s),
            Err(e) => {
                errors.push(e);
                None
            }
        };
        tracing::info!(container = %self.args.container_id, handle = %ident.handle(), "DEL");
        let mut host_veth_from_wep = None;
        if self.kind == PluginKind::Main
            && let Some(store) = &store
        {
            match self.delete_endpoint(store, &ident).await {
                Ok(iface) => host_veth_from_wep = iface,
                Err(e) => errors.push(e),
            }
        }
        if self.kind == PluginKind::Main {
            if self.args.netns.is_empty() {
                // No namespace to clean: remove the host side the endpoint named, if it was ours.
                if let Some(hv) = host_veth_from_wep
                    && let Err(e) = blocking(move || dataplane::delete_host_link(&hv)).await
                {
                    errors.push(e);
                }
            } else {
                let (netns, ifname) = (PathBuf::from(&self.args.netns), self.args.ifname.clone());
                match blocking(move || dataplane::tear_down(&netns, &ifname)).await {
                    Ok(true) => tracing::info!("deleted the container's interface"),
                    Ok(false) => {
                        tracing::info!("the container's interface or namespace was already gone")
                    }
                    Err(e) => errors.push(e),
                }
            }
        }
        if !self.builtin_ipam() {
            if let Err(e) = self.delegate("DEL").await {
                errors.push(e);
            }
        } else if let Some(store) = &store {
            for handle in [ident.handle(), ident.legacy_handle()] {
                match store.ipam.release_by_handle(&handle).await {
                    Ok(ips) if !ips.is_empty() => {
                        tracing::info!(%handle, ?ips, "released");
                    }
                    Ok(_) => tracing::debug!(%handle, "nothing held by the handle"),
                    Err(e) => errors.push(ipam_error(e)),
                }
            }
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            n => {
                let first = errors[0].code;
                let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
                Err(CniError::new(
                    first,
                    format!("DEL met {n} errors; everything else was cleaned up"),
                )
                .with_details(all.join("; ")))
            }
        }
    }

    /// Deletes the container's WorkloadEndpoint if it belongs to this container (a DEL for
    /// an old sandbox of a pod leaves the current one's endpoint alone). Returns the
    /// endpoint's host interface when it was this container's.
    pub(super) async fn delete_endpoint(
        &self,
        store: &Store,
        ident: &Identity,
    ) -> Result<Option<String>, CniError> {
        let key = self.endpoint_key(ident)?;
        for _ in 0..5 {
            let wep: WorkloadEndpoint = match store.client.get(&key).await {
                Ok(Resource::WorkloadEndpoint(w)) => w,
                Ok(_) | Err(DatastoreError::NotFound { .. }) => {
                    tracing::info!(endpoint = %key, "no WorkloadEndpoint to delete");
                    return Ok(None);
                }
                Err(e) => return Err(datastore_error("reading the WorkloadEndpoint", e)),
            };
            if !wep.spec.container_id.is_empty() && wep.spec.container_id != self.args.container_id
            {
                tracing::warn!(endpoint = %key, current = %wep.spec.container_id, "the endpoint belongs to another container of the pod; keeping it");
                return Ok(None);
            }
            match store
                .client
                .delete(&key, Some(&wep.metadata.resource_version))
                .await
            {
                Ok(_) | Err(DatastoreError::NotFound { .. }) => {
                    return Ok(Some(wep.spec.interface_name));
                }
                Err(DatastoreError::Conflict { .. }) => continue,
                Err(e) => return Err(datastore_error("deleting the WorkloadEndpoint", e)),
            }
        }
        Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!("{key} kept changing while it was being deleted; try again later"),
        ))
    }
}
