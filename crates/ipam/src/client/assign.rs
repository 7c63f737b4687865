//! Assignment: automatic (`auto_assign`, Calico's AutoAssign: affine blocks, then claiming
//! new ones, then borrowing) and of one given address (`assign_ip`); every block write is a
//! compare-and-swap, together with its handle in one transaction.

use super::*;

impl<B: KvBackend + Clone> Ipam<B> {
    /// Assigns `num_v4` IPv4 and `num_v6` IPv6 addresses to `handle`. All or nothing: on
    /// failure, whatever was assigned is released again.
    pub async fn auto_assign(&self, args: &AssignArgs) -> Result<Assigned, IpamError> {
        let _guard = self.guard().await?;
        let AssignContext {
            pools,
            reservations,
            config,
            labels,
            affinities_v4: aff_v4,
            affinities_v6: aff_v6,
            blocks,
        } = self.read_context(args).await?;
        let mut out = Assigned::default();
        for (version, n, requested) in [
            (4u8, args.num_v4, &args.v4_pools),
            (6u8, args.num_v6, &args.v6_pools),
        ] {
            if n == 0 {
                continue;
            }
            let result = async {
                let usable = select_pools(&pools, version, requested, &labels, args.intended_use)?;
                if usable.is_empty() {
                    return Err(IpamError::NoPools {
                        version,
                        node: args.hostname.clone(),
                    });
                }
                let affinities = if version == 4 { &aff_v4 } else { &aff_v6 };
                let ctx = VersionContext {
                    version,
                    pools: &usable,
                    reservations: &reservations,
                    config: &config,
                    affinities,
                    blocks: &blocks,
                };
                self.assign_version(n, args, &ctx).await
            }
            .await;
            match result {
                Ok(ips) => {
                    // Next time, read the block this assignment ended in along with the context.
                    if let Some(last) = ips.last() {
                        self.hints()
                            .blocks
                            .insert((args.hostname.clone(), version), last.block);
                    }
                    if version == 4 {
                        out.v4 = ips;
                    } else {
                        out.v6 = ips;
                    }
                }
                Err(e) => {
                    let taken: Vec<ReleaseIp> = out
                        .all()
                        .map(|a| ReleaseIp {
                            ip: a.ip,
                            sequence_number: None,
                        })
                        .collect();
                    if !taken.is_empty()
                        && let Err(re) = self.release_unlocked(&taken).await
                    {
                        tracing::error!(
                            "releasing {} addresses after a failed assignment: {re}",
                            taken.len()
                        );
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    pub(super) async fn assign_version(
        &self,
        n: usize,
        args: &AssignArgs,
        ctx: &VersionContext<'_>,
    ) -> Result<Vec<AssignedIp>, IpamError> {
        let VersionContext {
            version,
            pools,
            reservations,
            config,
            affinities,
            blocks,
        } = *ctx;
        let host = &args.hostname;
        let in_pools = |c: &Cidr| {
            pools
                .iter()
                .any(|p| p.cidr.contains(c.addr()) && p.cidr.prefix() <= c.prefix())
        };
        let mut got: Vec<AssignedIp> = Vec::new();
        let release_all = |got: &Vec<AssignedIp>| -> Vec<ReleaseIp> {
            got.iter()
                .map(|a| ReleaseIp {
                    ip: a.ip,
                    sequence_number: None,
                })
                .collect()
        };

        // 1. Blocks this host owns (confirmed affinities). The ones read with the context go
        // first (the hint: usually the one with room); the others are read a few per round
        // trip, rather than one by one, since full blocks before the free one are common.
        let mut owned = 0usize;
        let mut usable: Vec<Cidr> = Vec::new();
        for kv in affinities {
            let Some(cidr) = cidr_of_key(&kv.key) else {
                continue;
            };
            let aff: BlockAffinity = match decode(kv) {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("{e}");
                    continue;
                }
            };
            if aff.state != AffinityState::Confirmed || aff.deleted {
                continue;
            }
            owned += 1;
            if in_pools(&cidr) {
                usable.push(cidr);
            }
        }
        usable.sort_by_key(|c| !blocks.contains_key(c));
        let mut read = blocks.clone();
        for (i, cidr) in usable.iter().enumerate() {
            if got.len() >= n {
                break;
            }
            if !read.contains_key(cidr) {
                let batch: Vec<Cidr> = usable[i..]
                    .iter()
                    .filter(|c| !read.contains_key(c))
                    .take(BLOCK_READ_BATCH)
                    .copied()
                    .collect();
                let fetched = async {
                    let mut r = self
                        .read(batch.iter().map(|c| TxnOp::get(block_key(c))).collect())
                        .await?;
                    batch
                        .iter()
                        .map(|c| Ok((*c, next_get(&mut r)?)))
                        .collect::<Result<Vec<_>, IpamError>>()
                }
                .await;
                match fetched {
                    Ok(f) => read.extend(f),
                    Err(e) => {
                        let _ = self.release_unlocked(&release_all(&got)).await;
                        return Err(e);
                    }
                }
            }
            let ips = self
                .assign_from_block(
                    cidr,
                    n - got.len(),
                    args,
                    reservations,
                    Some(host),
                    read.remove(cidr),
                )
                .await;
            match ips {
                Ok(ips) => got.extend(ips.into_iter().map(|ip| AssignedIp { ip, block: *cidr })),
                Err(e) => {
                    let _ = self.release_unlocked(&release_all(&got)).await;
                    return Err(e);
                }
            }
        }

        // 2. Claim new blocks.
        let limit = config.block_limit();
        if got.len() < n && config.auto_allocate_blocks && owned < limit {
            let existing: HashSet<Cidr> = self
                .kv
                .list(&blocks_prefix(version))
                .await?
                .kvs
                .iter()
                .filter_map(|kv| cidr_of_key(&kv.key))
                .collect();
            'pools: for pool in pools {
                for candidate in block_order(pool, host).take(MAX_CANDIDATES) {
                    if got.len() >= n || owned >= limit {
                        break 'pools;
                    }
                    if existing.contains(&candidate) {
                        continue;
                    }
                    // A block made entirely of reserved addresses is useless.
                    if reservations
                        .iter()
                        .any(|r| r.prefix() <= candidate.prefix() && r.contains(candidate.addr()))
                    {
                        continue;
                    }
                    match self.claim_block(host, &candidate).await {
                        Ok(true) => {}
                        Ok(false) => continue,
                        Err(e) => {
                            let _ = self.release_unlocked(&release_all(&got)).await;
                            return Err(e);
                        }
                    }
                    owned += 1;
                    match self
                        .assign_from_block(
                            &candidate,
                            n - got.len(),
                            args,
                            reservations,
                            Some(host),
                            None,
                        )
                        .await
                    {
                        Ok(ips) => got.extend(ips.into_iter().map(|ip| AssignedIp {
                            ip,
                            block: candidate,
                        })),
                        Err(e) => {
                            let _ = self.release_unlocked(&release_all(&got)).await;
                            return Err(e);
                        }
                    }
                }
            }
        }

        // 3. Borrow from other hosts' blocks.
        if got.len() < n && !config.strict_affinity {
            let mut blocks: Vec<Cidr> = self
                .kv
                .list(&blocks_prefix(version))
                .await?
                .kvs
                .iter()
                .filter_map(|kv| cidr_of_key(&kv.key))
                .filter(|c| in_pools(c))
                .collect();
            blocks.sort();
            if !blocks.is_empty() {
                let start = (host_seed(host) as usize) % blocks.len();
                blocks.rotate_left(start);
            }
            for cidr in blocks {
                if got.len() >= n {
                    break;
                }
                match self
                    .assign_from_block(&cidr, n - got.len(), args, reservations, None, None)
                    .await
                {
                    Ok(ips) => got.extend(ips.into_iter().map(|ip| AssignedIp { ip, block: cidr })),
                    Err(e) => {
                        let _ = self.release_unlocked(&release_all(&got)).await;
                        return Err(e);
                    }
                }
            }
        }

        if got.len() < n {
            let _ = self.release_unlocked(&release_all(&got)).await;
            let hint = if config.strict_affinity {
                format!(
                    "; strictAffinity is on and the node may claim at most {limit} blocks: raise maxBlocksPerHost, or add a pool"
                )
            } else {
                "; add a pool or release unused addresses (`margay ctl ipam check`)".to_string()
            };
            return Err(IpamError::Exhausted {
                version,
                pools: pools.iter().map(|p| p.name.clone()).collect(),
                node: host.clone(),
                wanted: n,
                got: got.len(),
                hint,
            });
        }
        Ok(got)
    }

    /// Takes up to `n` addresses from one block. `only_if_host`: skip the block unless it is
    /// still affine to that host (it may have been released and re-claimed by another).
    /// `prefetched`: the block as read with the context, used for the first attempt.
    pub(super) async fn assign_from_block(
        &self,
        cidr: &Cidr,
        n: usize,
        args: &AssignArgs,
        reservations: &[Cidr],
        only_if_host: Option<&str>,
        prefetched: Option<Option<KeyValue>>,
    ) -> Result<Vec<IpAddr>, IpamError> {
        let key = block_key(cidr);
        let hkey = handle_key(&args.handle);
        let reserved = |ip: IpAddr| is_reserved(ip, reservations);
        let spread = host_seed(&args.handle);
        // A prefetched block comes without the handle: assume a new handle (a new pod), which
        // the write's condition checks; on any conflict both are read again, in one read.
        let mut known = prefetched.map(|block| (block, None));
        for attempt in 0..MAX_RETRIES {
            backoff(attempt, spread).await;
            let (block_kv, handle_kv) = match known.take() {
                Some(k) => k,
                None => {
                    let mut r = self.read(vec![TxnOp::get(&key), TxnOp::get(&hkey)]).await?;
                    (next_get(&mut r)?, next_get(&mut r)?)
                }
            };
            let Some(kv) = block_kv else {
                if let Some(host) = only_if_host {
                    // Affine but missing: a claim that crashed before creating the block.
                    let block = AllocationBlock::new(*cidr, Some(host));
                    match self.kv.create(&key, encode(&block), None).await {
                        Ok(_) | Err(DatastoreError::AlreadyExists { .. }) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                return Ok(Vec::new());
            };
            let mut block: AllocationBlock = decode(&kv)?;
            if block.deleted
                || block.free_count() == 0
                || only_if_host.is_some_and(|h| block.host() != Some(h))
            {
                return Ok(Vec::new());
            }
            let taken = block.assign(n, &args.handle, &args.attrs, &reserved);
            if taken.is_empty() {
                return Ok(Vec::new());
            }
            let mut txn = BlockTxn::new(&key, kv.mod_revision, &block);
            txn.handle(&hkey, handle_kv.as_ref(), cidr, taken.len() as i64)?;
            if self.commit(txn.compares, txn.ops).await? {
                return Ok(taken);
            }
        }
        Err(too_many_retries(format!("assigning from block {cidr}")))
    }

    /// Claims an unowned block for `host`: pending affinity, block create, confirm. Returns
    /// false if another host got it first.
    pub(super) async fn claim_block(&self, host: &str, cidr: &Cidr) -> Result<bool, IpamError> {
        let aff_key = affinity_key(host, cidr);
        match self
            .kv
            .create(
                &aff_key,
                encode(&BlockAffinity::new(AffinityState::Pending)),
                None,
            )
            .await
        {
            Ok(_) | Err(DatastoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let key = block_key(cidr);
        let block = AllocationBlock::new(*cidr, Some(host));
        match self.kv.create(&key, encode(&block), None).await {
            Ok(_) => {}
            Err(DatastoreError::AlreadyExists { .. }) => {
                // Someone made it first. Ours anyway (a claim of ours that crashed)?
                let existing = self.kv.get(&key).await?;
                let ours = match &existing {
                    Some(kv) => decode::<AllocationBlock>(kv)?.host() == Some(host),
                    None => false,
                };
                if !ours {
                    self.delete_if_present(&aff_key).await?;
                    return Ok(false);
                }
            }
            Err(e) => {
                self.delete_if_present(&aff_key).await.ok();
                return Err(e.into());
            }
        }
        self.kv
            .update(
                &aff_key,
                encode(&BlockAffinity::new(AffinityState::Confirmed)),
                None,
                None,
            )
            .await?;
        tracing::info!(%cidr, host, "claimed IPAM block");
        Ok(true)
    }

    pub(super) async fn delete_if_present(&self, key: &str) -> Result<(), IpamError> {
        match self.kv.delete(key, None).await {
            Ok(_) | Err(DatastoreError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Assigns one specific address to `handle` (a static request, or a tunnel address).
    pub async fn assign_ip(
        &self,
        ip: IpAddr,
        handle: &str,
        attrs: &BTreeMap<String, String>,
        hostname: &str,
    ) -> Result<AssignedIp, IpamError> {
        let _guard = self.guard().await?;
        let pools = self.pools().await?;
        let pool = pools
            .iter()
            .filter(|p| p.cidr.contains(ip))
            .max_by_key(|p| p.cidr.prefix())
            .ok_or(IpamError::NotInPool { ip })?;
        if is_reserved(ip, &self.reservations().await?) {
            return Err(IpamError::Reserved { ip });
        }
        let cidr = pool.block_of(ip).ok_or(IpamError::NotInPool { ip })?;
        let key = block_key(&cidr);
        let hkey = handle_key(handle);
        for attempt in 0..MAX_RETRIES {
            backoff(attempt, host_seed(handle)).await;
            let mut r = self.read(vec![TxnOp::get(&key), TxnOp::get(&hkey)]).await?;
            let (block_kv, handle_kv) = (next_get(&mut r)?, next_get(&mut r)?);
            let Some(kv) = block_kv else {
                // Nobody has the block yet: claim it for this host (or, failing that, retry
                // with whoever created it).
                self.claim_block(hostname, &cidr).await?;
                continue;
            };
            let mut block: AllocationBlock = decode(&kv)?;
            if let Err(e) = block.assign_ip(ip, handle, attrs) {
                return Err(match e {
                    crate::block::AssignError::InUse { ip, handle } => {
                        IpamError::InUse { ip, handle }
                    }
                    crate::block::AssignError::NotInBlock { ip, .. } => IpamError::NotInPool { ip },
                });
            }
            let mut txn = BlockTxn::new(&key, kv.mod_revision, &block);
            txn.handle(&hkey, handle_kv.as_ref(), &cidr, 1)?;
            if self.commit(txn.compares, txn.ops).await? {
                return Ok(AssignedIp { ip, block: cidr });
            }
        }
        Err(too_many_retries(format!("assigning {ip}")))
    }
}
