//! Affinity release: a block's or a whole host's affinities, with empty blocks deleted; and
//! the addresses a handle holds.

use super::*;

impl<B: KvBackend + Clone> Ipam<B> {
    /// Releases `host`'s affinity for the block `cidr` (Calico's releaseBlockAffinity): an empty
    /// block is deleted with its affinity; a block still holding addresses loses its affinity
    /// (it stays, unowned, with every address as it is) unless `require_empty`, in which case
    /// nothing changes. A block affine to another host only loses the stale affinity record.
    /// Nothing is ever released: the block and the affinity are written in one transaction,
    /// conditional on both being as read.
    pub async fn release_block_affinity(
        &self,
        host: &str,
        cidr: &Cidr,
        require_empty: bool,
    ) -> Result<AffinityRelease, IpamError> {
        let aff_key = affinity_key(host, cidr);
        let key = block_key(cidr);
        for attempt in 0..MAX_RETRIES {
            backoff(attempt, host_seed(&aff_key)).await;
            let mut r = self
                .read(vec![TxnOp::get(&aff_key), TxnOp::get(&key)])
                .await?;
            let (aff_kv, block_kv) = (next_get(&mut r)?, next_get(&mut r)?);
            let aff_compare = match &aff_kv {
                Some(kv) => Compare::ModRevision(aff_key.clone(), kv.mod_revision),
                None => Compare::Absent(aff_key.clone()),
            };
            let (mut compares, mut ops) = (vec![aff_compare], Vec::new());
            if aff_kv.is_some() {
                ops.push(TxnOp::delete(&aff_key));
            }
            let outcome = match &block_kv {
                None if aff_kv.is_none() => return Ok(AffinityRelease::NotFound),
                None => AffinityRelease::AffinityOnly,
                Some(bkv) => {
                    let mut block: AllocationBlock = decode(bkv)?;
                    compares.push(Compare::ModRevision(key.clone(), bkv.mod_revision));
                    if block.host() != Some(host) {
                        if aff_kv.is_none() {
                            return Ok(AffinityRelease::NotFound);
                        }
                        AffinityRelease::AffinityOnly
                    } else if block.is_empty() {
                        ops.insert(0, TxnOp::delete(&key));
                        AffinityRelease::BlockDeleted
                    } else if require_empty {
                        return Ok(AffinityRelease::NotEmpty);
                    } else {
                        block.affinity = None;
                        block.extra.remove("affinity_claim_time");
                        block.sequence_number += 1;
                        ops.insert(0, TxnOp::put(&key, encode(&block)));
                        AffinityRelease::Unaffined
                    }
                }
            };
            if self.commit(compares, ops).await? {
                tracing::info!(%cidr, host, ?outcome, "released IPAM block affinity");
                return Ok(outcome);
            }
        }
        Err(too_many_retries(format!(
            "releasing the affinity of {host} for block {cidr}"
        )))
    }

    /// Releases every affinity of `host` (Calico's ReleaseHostAffinities), each as
    /// [`Ipam::release_block_affinity`] does; carries on past failures and returns the first.
    pub async fn release_host_affinities(
        &self,
        host: &str,
        require_empty: bool,
    ) -> Result<Vec<(Cidr, AffinityRelease)>, IpamError> {
        let mut ops = Vec::new();
        for v in [4u8, 6] {
            ops.push(TxnOp::list(host_affinities_prefix(host, v)));
        }
        let mut r = self.read(ops).await?;
        let mut cidrs = Vec::new();
        for _ in 0..2 {
            cidrs.extend(
                next_list(&mut r)?
                    .iter()
                    .filter_map(|kv| cidr_of_key(&kv.key)),
            );
        }
        let mut out = Vec::new();
        let mut first_error = None;
        for cidr in cidrs {
            match self
                .release_block_affinity(host, &cidr, require_empty)
                .await
            {
                Ok(o) => out.push((cidr, o)),
                Err(e) => {
                    tracing::warn!(%cidr, host, "releasing block affinity failed: {e}");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// The addresses `handle` holds.
    pub async fn ips_by_handle(&self, handle: &str) -> Result<Vec<AssignedIp>, IpamError> {
        let Some(kv) = self.kv.get(&handle_key(handle)).await? else {
            return Ok(Vec::new());
        };
        let record: IpamHandle = decode(&kv)?;
        let mut out = Vec::new();
        for block_name in record.block.keys() {
            let Ok(cidr) = Cidr::parse(block_name) else {
                continue;
            };
            if let Some(bkv) = self.kv.get(&block_key(&cidr)).await? {
                let block: AllocationBlock = decode(&bkv)?;
                out.extend(
                    block
                        .allocated()
                        .filter(|a| a.attribute.handle_id.as_deref() == Some(handle))
                        .map(|a| AssignedIp {
                            ip: a.ip,
                            block: cidr,
                        }),
                );
            }
        }
        Ok(out)
    }
}
