//! Release: by address (grouped per block) and by handle, each block write with its handle
//! in one transaction.

use super::*;

impl<B: KvBackend + Clone> Ipam<B> {
    /// Releases addresses. Addresses that are already free are skipped; returns the ones
    /// this call freed.
    pub async fn release_ips(&self, ips: &[ReleaseIp]) -> Result<Vec<IpAddr>, IpamError> {
        let _guard = self.guard().await?;
        self.release_unlocked(ips).await
    }

    /// Releases addresses of one block (the caller knows the block, as a garbage collector
    /// that read it does): one compare-and-swap write of the block and its handles, without
    /// listing the blocks. Addresses already free, or outside the block, are skipped; a stale
    /// sequence number releases nothing (`BadSequenceNumber`). Returns the addresses freed.
    pub async fn release_ips_in_block(
        &self,
        block: &Cidr,
        ips: &[ReleaseIp],
    ) -> Result<Vec<IpAddr>, IpamError> {
        let _guard = self.guard().await?;
        if ips.is_empty() {
            return Ok(Vec::new());
        }
        self.release_in_block(block, ips).await
    }

    pub(super) async fn release_unlocked(
        &self,
        ips: &[ReleaseIp],
    ) -> Result<Vec<IpAddr>, IpamError> {
        if ips.is_empty() {
            return Ok(Vec::new());
        }
        // Find each address's block among the stored ones.
        let mut by_block: BTreeMap<Cidr, Vec<ReleaseIp>> = BTreeMap::new();
        for version in [4u8, 6] {
            if !ips.iter().any(|r| (r.ip.is_ipv4()) == (version == 4)) {
                continue;
            }
            let blocks: Vec<Cidr> = self
                .kv
                .list(&blocks_prefix(version))
                .await?
                .kvs
                .iter()
                .filter_map(|kv| cidr_of_key(&kv.key))
                .collect();
            for r in ips.iter().filter(|r| r.ip.is_ipv4() == (version == 4)) {
                if let Some(b) = blocks.iter().find(|b| b.contains(r.ip)) {
                    by_block.entry(*b).or_default().push(*r);
                }
            }
        }
        let mut released = Vec::new();
        let mut first_error = None;
        for (cidr, list) in by_block {
            match self.release_in_block(&cidr, &list).await {
                Ok(mut r) => released.append(&mut r),
                Err(e) => {
                    tracing::warn!(%cidr, "release failed: {e}");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(released),
        }
    }

    pub(super) async fn release_in_block(
        &self,
        cidr: &Cidr,
        ips: &[ReleaseIp],
    ) -> Result<Vec<IpAddr>, IpamError> {
        let key = block_key(cidr);
        for attempt in 0..MAX_RETRIES {
            backoff(attempt, host_seed(&key)).await;
            let Some(kv) = self.kv.get(&key).await? else {
                return Ok(Vec::new());
            };
            let mut block: AllocationBlock = decode(&kv)?;
            let mut handles: BTreeMap<String, i64> = BTreeMap::new();
            let mut released = Vec::new();
            for r in ips {
                match block.release(r.ip, r.sequence_number) {
                    Ok(Some(h)) => {
                        *handles.entry(h).or_insert(0) += 1;
                        released.push(r.ip);
                    }
                    Ok(None) => {}
                    Err(crate::block::ReleaseError::BadSequenceNumber {
                        ip,
                        expected,
                        actual,
                    }) => {
                        return Err(IpamError::BadSequenceNumber {
                            ip,
                            expected,
                            actual,
                        });
                    }
                    Err(crate::block::ReleaseError::NotInBlock { .. }) => {}
                }
            }
            if released.is_empty() {
                return Ok(released);
            }
            // The block and the records of the handles it frees addresses of, in one write.
            let hkeys: Vec<(String, i64)> =
                handles.iter().map(|(h, n)| (handle_key(h), *n)).collect();
            let mut r = self
                .read(hkeys.iter().map(|(k, _)| TxnOp::get(k)).collect())
                .await?;
            let mut txn = BlockTxn::new(&key, kv.mod_revision, &block);
            for (hkey, n) in &hkeys {
                let current = next_get(&mut r)?;
                txn.handle(hkey, current.as_ref(), cidr, -n)?;
            }
            if self.commit(txn.compares, txn.ops).await? {
                return Ok(released);
            }
        }
        Err(too_many_retries(format!("releasing from block {cidr}")))
    }

    /// Releases every address held by `handle`. A handle that does not exist releases
    /// nothing (not an error: release is idempotent).
    pub async fn release_by_handle(&self, handle: &str) -> Result<Vec<IpAddr>, IpamError> {
        let _guard = self.guard().await?;
        let hkey = handle_key(handle);
        // The blocks recent assignments came from: usually where the handle's addresses are.
        let hinted: Vec<Cidr> = {
            let hints = self.hints();
            let set: BTreeSet<Cidr> = hints.blocks.values().copied().collect();
            set.into_iter().take(MAX_RELEASE_HINTS).collect()
        };
        // When this process wrote the handle and its blocks last (a pod it assigned), try
        // the release on those values without reading; the conditions catch any change.
        let mut remembered = self.remembered_handle(&hkey);
        for attempt in 0..MAX_RETRIES {
            backoff(attempt, host_seed(handle)).await;
            let (hkv, mut blocks) = match remembered.take() {
                Some(r) => r,
                None => {
                    let mut ops = vec![TxnOp::get(&hkey)];
                    ops.extend(hinted.iter().map(|c| TxnOp::get(block_key(c))));
                    let mut r = self.read(ops).await?;
                    let Some(hkv) = next_get(&mut r)? else {
                        return Ok(Vec::new());
                    };
                    let mut blocks: BTreeMap<Cidr, Option<KeyValue>> = BTreeMap::new();
                    for c in &hinted {
                        blocks.insert(*c, next_get(&mut r)?);
                    }
                    (hkv, blocks)
                }
            };
            let record: IpamHandle = decode(&hkv)?;
            let named: BTreeSet<Cidr> = record
                .block
                .keys()
                .filter_map(|b| Cidr::parse(b).ok())
                .collect();
            let unread: Vec<Cidr> = named
                .iter()
                .filter(|c| !blocks.contains_key(c))
                .copied()
                .collect();
            if !unread.is_empty() {
                let mut r = self
                    .read(unread.iter().map(|c| TxnOp::get(block_key(c))).collect())
                    .await?;
                for c in unread {
                    blocks.insert(c, next_get(&mut r)?);
                }
            }
            // Every block's addresses of the handle and the record itself, in one write; the
            // record's revision in the condition means a concurrent assignment to the same
            // handle makes this read again (and release that too).
            let mut compares = vec![Compare::ModRevision(hkey.clone(), hkv.mod_revision)];
            let mut ops = Vec::new();
            let mut released = Vec::new();
            for cidr in &named {
                let Some(Some(bkv)) = blocks.get(cidr) else {
                    continue;
                };
                let mut block: AllocationBlock = decode(bkv)?;
                let ips = block.release_handle(handle);
                if ips.is_empty() {
                    continue;
                }
                let bkey = block_key(cidr);
                compares.push(Compare::ModRevision(bkey.clone(), bkv.mod_revision));
                ops.push(TxnOp::put(bkey, encode(&block)));
                released.extend(ips);
            }
            ops.push(TxnOp::delete(&hkey));
            if self.commit(compares, ops).await? {
                return Ok(released);
            }
        }
        Err(too_many_retries(format!("releasing handle {handle}")))
    }

    /// The handle record and every block it names, as this process last wrote them, if it
    /// remembers all of them.
    pub(super) fn remembered_handle(
        &self,
        hkey: &str,
    ) -> Option<(KeyValue, BTreeMap<Cidr, Option<KeyValue>>)> {
        let hints = self.hints();
        let hkv = hints.written.get(hkey)?;
        let record: IpamHandle = decode(hkv).ok()?;
        let mut blocks = BTreeMap::new();
        for name in record.block.keys() {
            let cidr = Cidr::parse(name).ok()?;
            let bkv = hints.written.get(&block_key(&cidr))?;
            blocks.insert(cidr, Some(bkv.clone()));
        }
        Some((hkv.clone(), blocks))
    }
}
