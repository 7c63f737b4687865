//! STATUS: whether the plugin can serve ADDs (datastore reachable, pools with room).

use super::*;

impl Call {
    pub(super) async fn status(&self) -> Result<(), CniError> {
        let unavailable = |e: CniError| CniError {
            code: code::NOT_AVAILABLE,
            ..e
        };
        let store = self.connect().await.map_err(unavailable)?;
        store
            .client
            .backend()
            .revision()
            .await
            .map_err(|e| unavailable(datastore_error("the datastore does not answer", e)))?;
        if !self.builtin_ipam() {
            return Ok(()); // the delegated IPAM plugin's pools are its own business
        }
        let node = self.nodename().await.ok();
        let pools = store
            .ipam
            .pools()
            .await
            .map_err(|e| unavailable(ipam_error(e)))?;
        let blocks = store
            .ipam
            .blocks()
            .await
            .map_err(|e| unavailable(ipam_error(e)))?;
        let reservations = store
            .ipam
            .reservations()
            .await
            .map_err(|e| unavailable(ipam_error(e)))?;
        let labels = match &node {
            Some(n) => match store
                .client
                .get(&ResourceKey {
                    kind: Kind::Node,
                    namespace: String::new(),
                    name: n.clone(),
                })
                .await
            {
                Ok(r) => r.metadata().labels.clone(),
                Err(_) => Default::default(),
            },
            None => Default::default(),
        };
        for (version, wanted, requested) in [
            (4u8, self.conf.ipam.v4(), &self.conf.ipam.ipv4_pools),
            (6u8, self.conf.ipam.v6(), &self.conf.ipam.ipv6_pools),
        ] {
            if !wanted {
                continue;
            }
            let usable = margay_ipam::pools::select_pools(
                &pools,
                version,
                requested,
                &labels,
                margay_api::ippool::AllowedUse::Workload,
            )
            .map_err(|e| unavailable(ipam_error(e)))?;
            if usable.is_empty() {
                return Err(CniError::new(
                    code::NOT_AVAILABLE,
                    format!(
                        "no enabled IPv{version} pool can be used by this node; create one with `margay ctl apply`"
                    ),
                ));
            }
            let free: u128 = usable
                .iter()
                .map(|p| margay_ipam::usage::pool_usage(p, &blocks, &reservations).free())
                .sum();
            if free == 0 {
                let names: Vec<&str> = usable.iter().map(|p| p.name.as_str()).collect();
                return Err(CniError::new(
                    code::NOT_AVAILABLE,
                    format!(
                        "the IPv{version} pools {names:?} have no free address; add a pool or free addresses"
                    ),
                ));
            }
        }
        Ok(())
    }
}
