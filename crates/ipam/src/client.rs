//! The datastore adapter: Calico's IPAM protocol over any `KvBackend`.
//!
//! Every write is compare-and-swap on the key's revision and retried (bounded) on conflict
//! after re-reading. Order of writes, chosen so a crash at any point leaks nothing:
//! - assign: the handle record is incremented before the block is written (a crash leaves a
//!   handle that points at a block without its addresses — release by handle then frees
//!   nothing and deletes the handle);
//! - claim: pending affinity, then the block (create: exactly one host wins), then the
//!   affinity is confirmed; pending affinities count as absent;
//! - release: the block first, then the handle record.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use margay_api::ippool::AllowedUse;
use margay_api::net::Cidr;
use margay_api::{Kind, Resource, ResourceKey};
use margay_datastore::{Client, DatastoreError, KeyValue, KvBackend};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::block::{AffinityState, AllocationBlock, BlockAffinity, IpamHandle, StoredIpamConfig};
use crate::error::IpamError;
use crate::pools::{
    CONFIG_KEY, PoolInfo, affinity_key, all_affinities_prefix, block_key, block_order,
    blocks_prefix, cidr_of_key, handle_key, handles_prefix, host_affinities_prefix, host_seed,
    is_reserved, select_pools,
};

/// Compare-and-swap attempts before giving up (Calico's datastoreRetries).
pub const MAX_RETRIES: usize = 100;
/// Blocks a host may claim when the configuration says 0.
pub const DEFAULT_MAX_BLOCKS_PER_HOST: usize = 20;
/// Candidate blocks examined per pool when claiming (bounds the walk over huge IPv6 pools).
const MAX_CANDIDATES: usize = 1 << 20;

/// The effective IPAM configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IpamConfig {
    pub strict_affinity: bool,
    pub auto_allocate_blocks: bool,
    /// 0: the default (20).
    pub max_blocks_per_host: usize,
}

impl Default for IpamConfig {
    fn default() -> Self {
        IpamConfig {
            strict_affinity: false,
            auto_allocate_blocks: true,
            max_blocks_per_host: 0,
        }
    }
}

impl IpamConfig {
    pub fn block_limit(&self) -> usize {
        if self.max_blocks_per_host == 0 {
            DEFAULT_MAX_BLOCKS_PER_HOST
        } else {
            self.max_blocks_per_host
        }
    }
}

/// A request for automatically chosen addresses.
#[derive(Debug, Clone)]
pub struct AssignArgs {
    pub num_v4: usize,
    pub num_v6: usize,
    pub handle: String,
    pub attrs: BTreeMap<String, String>,
    pub hostname: String,
    /// Pools by name or CIDR; empty = every pool the node may use.
    pub v4_pools: Vec<String>,
    pub v6_pools: Vec<String>,
    pub intended_use: AllowedUse,
}

impl AssignArgs {
    pub fn new(handle: impl Into<String>, hostname: impl Into<String>) -> AssignArgs {
        AssignArgs {
            num_v4: 1,
            num_v6: 0,
            handle: handle.into(),
            attrs: BTreeMap::new(),
            hostname: hostname.into(),
            v4_pools: Vec::new(),
            v6_pools: Vec::new(),
            intended_use: AllowedUse::Workload,
        }
    }
}

/// An assigned address and the block it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AssignedIp {
    pub ip: IpAddr,
    pub block: Cidr,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Assigned {
    pub v4: Vec<AssignedIp>,
    pub v6: Vec<AssignedIp>,
}

impl Assigned {
    pub fn all(&self) -> impl Iterator<Item = &AssignedIp> {
        self.v4.iter().chain(&self.v6)
    }
}

/// An address to release, optionally guarded by the sequence number it was read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseIp {
    pub ip: IpAddr,
    pub sequence_number: Option<u64>,
}

/// What one IP version's assignment works with.
#[derive(Clone, Copy)]
struct VersionContext<'a> {
    version: u8,
    pools: &'a [PoolInfo],
    reservations: &'a [Cidr],
    config: &'a IpamConfig,
    affinities: &'a [KeyValue],
}

/// Serialises this host's IPAM operations: an in-process mutex plus an advisory file lock
/// (`/var/run/calico/ipam.lock`, as Calico's CNI plugin) shared by every process on the host.
pub struct HostLock {
    path: PathBuf,
    inner: tokio::sync::Mutex<()>,
}

pub struct HostLockGuard<'a> {
    _inner: tokio::sync::MutexGuard<'a, ()>,
    _file: std::fs::File,
}

impl HostLock {
    pub fn new(path: impl Into<PathBuf>) -> HostLock {
        HostLock {
            path: path.into(),
            inner: tokio::sync::Mutex::new(()),
        }
    }

    pub async fn lock(&self) -> Result<HostLockGuard<'_>, IpamError> {
        let inner = self.inner.lock().await;
        let path = self.path.clone();
        let err = |reason: String| IpamError::Lock {
            path: path.display().to_string(),
            reason,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| err(format!("cannot create its directory: {e}")))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| err(format!("cannot open: {e}")))?;
        // Blocking: other processes hold it only for one IPAM operation.
        let file = tokio::task::spawn_blocking(move || file.lock().map(|()| file))
            .await
            .map_err(|e| err(format!("lock task failed: {e}")))?
            .map_err(|e| err(format!("cannot lock: {e}")))?;
        Ok(HostLockGuard {
            _inner: inner,
            _file: file,
        })
    }
}

/// IPAM over a datastore backend.
#[derive(Clone)]
pub struct Ipam<B> {
    kv: B,
    resources: Client<B>,
    lock: Option<Arc<HostLock>>,
}

fn decode<T: DeserializeOwned>(kv: &KeyValue) -> Result<T, IpamError> {
    serde_json::from_slice(&kv.value).map_err(|e| IpamError::Corrupt {
        key: kv.key.clone(),
        reason: e.to_string(),
    })
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Serialising plain data with string keys cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

fn is_conflict(e: &DatastoreError) -> bool {
    matches!(
        e,
        DatastoreError::Conflict { .. }
            | DatastoreError::AlreadyExists { .. }
            | DatastoreError::NotFound { .. }
    )
}

/// A short pause before retrying a lost compare-and-swap, growing with the attempt and spread
/// by a per-caller value so racing writers do not retry in lockstep.
async fn backoff(attempt: usize, spread: u64) {
    if attempt < 2 {
        return;
    }
    let base = (attempt as u64).min(20) * 200;
    let jitter = spread.wrapping_mul(attempt as u64 + 1) % 500;
    tokio::time::sleep(Duration::from_micros(base + jitter)).await;
}

impl<B: KvBackend + Clone> Ipam<B> {
    pub fn new(kv: B) -> Ipam<B> {
        Ipam {
            resources: Client::new(kv.clone()),
            kv,
            lock: None,
        }
    }

    /// Serialise this host's operations through `lock` (see [`HostLock`]).
    pub fn with_host_lock(mut self, lock: Arc<HostLock>) -> Ipam<B> {
        self.lock = Some(lock);
        self
    }

    pub fn backend(&self) -> &B {
        &self.kv
    }

    async fn guard(&self) -> Result<Option<HostLockGuard<'_>>, IpamError> {
        match &self.lock {
            Some(l) => Ok(Some(l.lock().await?)),
            None => Ok(None),
        }
    }

    // ---- context ------------------------------------------------------------------------

    /// The IPAM configuration: the v3 IPAMConfiguration `default` if present, else Calico's
    /// v1 config key, else defaults.
    pub async fn config(&self) -> Result<IpamConfig, IpamError> {
        let key = ResourceKey {
            kind: Kind::IPAMConfiguration,
            namespace: String::new(),
            name: "default".into(),
        };
        // Both places at once: one round trip.
        let (v3, v1) = tokio::join!(self.resources.get(&key), self.kv.get(CONFIG_KEY));
        match v3 {
            Ok(Resource::IPAMConfiguration(c)) => {
                return Ok(IpamConfig {
                    strict_affinity: c.spec.strict_affinity,
                    auto_allocate_blocks: c.spec.auto_allocate_blocks,
                    max_blocks_per_host: usize::try_from(c.spec.max_blocks_per_host.unwrap_or(0))
                        .unwrap_or(0),
                });
            }
            Ok(_) | Err(DatastoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        match v1? {
            Some(kv) => {
                let c: StoredIpamConfig = decode(&kv)?;
                Ok(IpamConfig {
                    strict_affinity: c.strict_affinity,
                    auto_allocate_blocks: c.auto_allocate_blocks,
                    max_blocks_per_host: usize::try_from(c.max_blocks_per_host).unwrap_or(0),
                })
            }
            None => Ok(IpamConfig::default()),
        }
    }

    /// Every IP pool (bad ones skipped with a warning).
    pub async fn pools(&self) -> Result<Vec<PoolInfo>, IpamError> {
        let listed = self.resources.list(Kind::IPPool, None, "").await?;
        let mut out = Vec::new();
        for r in listed.items {
            if let Resource::IPPool(p) = r {
                match PoolInfo::from_resource(&p) {
                    Ok(info) => out.push(info),
                    Err(e) => tracing::warn!("ignoring IP pool: {e}"),
                }
            }
        }
        Ok(out)
    }

    /// Every reserved CIDR (IPReservation resources).
    pub async fn reservations(&self) -> Result<Vec<Cidr>, IpamError> {
        let listed = self.resources.list(Kind::IPReservation, None, "").await?;
        let mut out = Vec::new();
        for r in listed.items {
            if let Resource::IPReservation(res) = r {
                for c in &res.spec.reserved_cidrs {
                    match Cidr::parse_cidr_or_ip(c) {
                        Ok(c) => out.push(c.network()),
                        Err(e) => {
                            tracing::warn!(reservation = %res.metadata.name, "ignoring reserved CIDR: {e}")
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    async fn node_labels(&self, host: &str) -> Result<BTreeMap<String, String>, IpamError> {
        let key = ResourceKey {
            kind: Kind::Node,
            namespace: String::new(),
            name: host.to_string(),
        };
        match self.resources.get(&key).await {
            Ok(r) => Ok(r.metadata().labels.clone()),
            Err(DatastoreError::NotFound { .. }) => Ok(BTreeMap::new()),
            Err(e) => Err(e.into()),
        }
    }

    // ---- assignment ---------------------------------------------------------------------

    /// Assigns `num_v4` IPv4 and `num_v6` IPv6 addresses to `handle`. All or nothing: on
    /// failure, whatever was assigned is released again.
    pub async fn auto_assign(&self, args: &AssignArgs) -> Result<Assigned, IpamError> {
        let _guard = self.guard().await?;
        // Independent reads: one round trip instead of four.
        let (pools, reservations, config, labels, aff_v4, aff_v6) = tokio::join!(
            self.pools(),
            self.reservations(),
            self.config(),
            self.node_labels(&args.hostname),
            self.affinities_if(args.num_v4 > 0, &args.hostname, 4),
            self.affinities_if(args.num_v6 > 0, &args.hostname, 6),
        );
        let (pools, reservations, config, labels) = (pools?, reservations?, config?, labels?);
        let (aff_v4, aff_v6) = (aff_v4?, aff_v6?);
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
                };
                self.assign_version(n, args, &ctx).await
            }
            .await;
            match result {
                Ok(ips) => {
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

    async fn assign_version(
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

        // 1. Blocks this host owns (confirmed affinities).
        let mut owned = 0usize;
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
            if got.len() >= n || !in_pools(&cidr) {
                continue;
            }
            let ips = self
                .assign_from_block(&cidr, n - got.len(), args, reservations, Some(host))
                .await;
            match ips {
                Ok(ips) => got.extend(ips.into_iter().map(|ip| AssignedIp { ip, block: cidr })),
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
                    .assign_from_block(&cidr, n - got.len(), args, reservations, None)
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
    async fn assign_from_block(
        &self,
        cidr: &Cidr,
        n: usize,
        args: &AssignArgs,
        reservations: &[Cidr],
        only_if_host: Option<&str>,
    ) -> Result<Vec<IpAddr>, IpamError> {
        let key = block_key(cidr);
        let reserved = |ip: IpAddr| is_reserved(ip, reservations);
        let spread = host_seed(&args.handle);
        let mut handle_claimed = 0usize;
        let mut result = Err(IpamError::TooManyRetries {
            what: format!("assigning from block {cidr}"),
            attempts: MAX_RETRIES,
        });
        for attempt in 0..MAX_RETRIES {
            backoff(attempt, spread).await;
            let Some(kv) = self.kv.get(&key).await? else {
                if only_if_host.is_some() {
                    // Affine but missing: a claim that crashed before creating the block.
                    let host = only_if_host.unwrap_or_default();
                    let block = AllocationBlock::new(*cidr, Some(host));
                    match self.kv.create(&key, encode(&block), None).await {
                        Ok(_) | Err(DatastoreError::AlreadyExists { .. }) => continue,
                        Err(e) => {
                            result = Err(e.into());
                            break;
                        }
                    }
                }
                result = Ok(Vec::new());
                break;
            };
            let mut block: AllocationBlock = decode(&kv)?;
            if block.deleted
                || block.free_count() == 0
                || only_if_host.is_some_and(|h| block.host() != Some(h))
            {
                result = Ok(Vec::new());
                break;
            }
            let taken = block.assign(n, &args.handle, &args.attrs, &reserved);
            if taken.is_empty() {
                result = Ok(Vec::new());
                break;
            }
            if handle_claimed < taken.len() {
                self.handle_add(&args.handle, cidr, (taken.len() - handle_claimed) as i64)
                    .await?;
                handle_claimed = taken.len();
            }
            match self
                .kv
                .update(&key, encode(&block), Some(kv.mod_revision), None)
                .await
            {
                Ok(_) => {
                    result = Ok(taken);
                    break;
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => {
                    result = Err(e.into());
                    break;
                }
            }
        }
        // Keep the handle's count exact: give back what was counted but not taken.
        let taken = result.as_ref().map_or(0, Vec::len);
        if handle_claimed > taken
            && let Err(e) = self
                .handle_add(&args.handle, cidr, taken as i64 - handle_claimed as i64)
                .await
        {
            tracing::warn!("correcting handle {} after assignment: {e}", args.handle);
        }
        result
    }

    /// Claims an unowned block for `host`: pending affinity, block create, confirm. Returns
    /// false if another host got it first.
    async fn claim_block(&self, host: &str, cidr: &Cidr) -> Result<bool, IpamError> {
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

    /// The host's affinity records for one IP version (empty when not needed).
    async fn affinities_if(
        &self,
        needed: bool,
        host: &str,
        version: u8,
    ) -> Result<Vec<KeyValue>, IpamError> {
        if !needed {
            return Ok(Vec::new());
        }
        Ok(self
            .kv
            .list(&host_affinities_prefix(host, version))
            .await?
            .kvs)
    }

    async fn delete_if_present(&self, key: &str) -> Result<(), IpamError> {
        match self.kv.delete(key, None).await {
            Ok(_) | Err(DatastoreError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Adds `delta` to the handle's count for `block`, creating or deleting the record.
    async fn handle_add(&self, handle: &str, block: &Cidr, delta: i64) -> Result<(), IpamError> {
        if delta == 0 {
            return Ok(());
        }
        let key = handle_key(handle);
        let block_name = block.to_string();
        if delta > 0 {
            // Usually a new handle (a new pod): try to create it without reading first.
            let record = IpamHandle {
                block: BTreeMap::from([(block_name.clone(), delta as usize)]),
                ..IpamHandle::default()
            };
            match self.kv.create(&key, encode(&record), None).await {
                Ok(_) => return Ok(()),
                Err(DatastoreError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        for attempt in 0..MAX_RETRIES {
            backoff(attempt, host_seed(handle)).await;
            let current = self.kv.get(&key).await?;
            let (mut record, rev) = match &current {
                Some(kv) => (decode::<IpamHandle>(kv)?, Some(kv.mod_revision)),
                None => (IpamHandle::default(), None),
            };
            let count = record.block.entry(block_name.clone()).or_insert(0);
            let new = (*count as i64 + delta).max(0) as usize;
            *count = new;
            if new == 0 {
                record.block.remove(&block_name);
            }
            let outcome = match (rev, record.block.is_empty()) {
                (None, true) => return Ok(()),
                (None, false) => self
                    .kv
                    .create(&key, encode(&record), None)
                    .await
                    .map(|_| ()),
                (Some(r), true) => self.kv.delete(&key, Some(r)).await.map(|_| ()),
                (Some(r), false) => self
                    .kv
                    .update(&key, encode(&record), Some(r), None)
                    .await
                    .map(|_| ()),
            };
            match outcome {
                Ok(()) => return Ok(()),
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(IpamError::TooManyRetries {
            what: format!("updating handle {handle}"),
            attempts: MAX_RETRIES,
        })
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
        let mut counted = false;
        for attempt in 0..MAX_RETRIES {
            backoff(attempt, host_seed(handle)).await;
            let Some(kv) = self.kv.get(&key).await? else {
                // Nobody has the block yet: claim it for this host (or, failing that, retry
                // with whoever created it).
                if !self.claim_block(hostname, &cidr).await? {
                    continue;
                }
                continue;
            };
            let mut block: AllocationBlock = decode(&kv)?;
            if let Err(e) = block.assign_ip(ip, handle, attrs) {
                if counted {
                    self.handle_add(handle, &cidr, -1).await.ok();
                }
                return Err(match e {
                    crate::block::AssignError::InUse { ip, handle } => {
                        IpamError::InUse { ip, handle }
                    }
                    crate::block::AssignError::NotInBlock { ip, .. } => IpamError::NotInPool { ip },
                });
            }
            if !counted {
                self.handle_add(handle, &cidr, 1).await?;
                counted = true;
            }
            match self
                .kv
                .update(&key, encode(&block), Some(kv.mod_revision), None)
                .await
            {
                Ok(_) => return Ok(AssignedIp { ip, block: cidr }),
                Err(e) if is_conflict(&e) => continue,
                Err(e) => {
                    self.handle_add(handle, &cidr, -1).await.ok();
                    return Err(e.into());
                }
            }
        }
        if counted {
            self.handle_add(handle, &cidr, -1).await.ok();
        }
        Err(IpamError::TooManyRetries {
            what: format!("assigning {ip}"),
            attempts: MAX_RETRIES,
        })
    }

    // ---- release ------------------------------------------------------------------------

    /// Releases addresses. Addresses that are already free are skipped; returns the ones
    /// this call freed.
    pub async fn release_ips(&self, ips: &[ReleaseIp]) -> Result<Vec<IpAddr>, IpamError> {
        let _guard = self.guard().await?;
        self.release_unlocked(ips).await
    }

    async fn release_unlocked(&self, ips: &[ReleaseIp]) -> Result<Vec<IpAddr>, IpamError> {
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

    async fn release_in_block(
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
            match self
                .kv
                .update(&key, encode(&block), Some(kv.mod_revision), None)
                .await
            {
                Ok(_) => {
                    for (h, n) in handles {
                        if let Err(e) = self.handle_add(&h, cidr, -n).await {
                            tracing::warn!(handle = %h, "updating handle after release: {e}");
                        }
                    }
                    return Ok(released);
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(IpamError::TooManyRetries {
            what: format!("releasing from block {cidr}"),
            attempts: MAX_RETRIES,
        })
    }

    /// Releases every address held by `handle`. A handle that does not exist releases
    /// nothing (not an error: release is idempotent).
    pub async fn release_by_handle(&self, handle: &str) -> Result<Vec<IpAddr>, IpamError> {
        let _guard = self.guard().await?;
        let key = handle_key(handle);
        let Some(kv) = self.kv.get(&key).await? else {
            return Ok(Vec::new());
        };
        let record: IpamHandle = decode(&kv)?;
        let mut released = Vec::new();
        for block_name in record.block.keys() {
            let Ok(cidr) = Cidr::parse(block_name) else {
                continue;
            };
            let bkey = block_key(&cidr);
            let mut done = false;
            for attempt in 0..MAX_RETRIES {
                backoff(attempt, host_seed(handle)).await;
                let Some(bkv) = self.kv.get(&bkey).await? else {
                    done = true;
                    break;
                };
                let mut block: AllocationBlock = decode(&bkv)?;
                let ips = block.release_handle(handle);
                if ips.is_empty() {
                    done = true;
                    break;
                }
                match self
                    .kv
                    .update(&bkey, encode(&block), Some(bkv.mod_revision), None)
                    .await
                {
                    Ok(_) => {
                        released.extend(ips);
                        done = true;
                        break;
                    }
                    Err(e) if is_conflict(&e) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            if !done {
                return Err(IpamError::TooManyRetries {
                    what: format!("releasing handle {handle} from block {cidr}"),
                    attempts: MAX_RETRIES,
                });
            }
        }
        // Every block is clean of the handle: drop the record, unless it changed meanwhile
        // (e.g. a concurrent assignment to the same handle), which the revision check sees.
        match self.kv.delete(&key, Some(kv.mod_revision)).await {
            Ok(_) | Err(DatastoreError::NotFound { .. }) => return Ok(released),
            Err(DatastoreError::Conflict { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        for attempt in 0..MAX_RETRIES {
            backoff(attempt, host_seed(handle)).await;
            let Some(kv) = self.kv.get(&key).await? else {
                break;
            };
            let current: IpamHandle = decode(&kv)?;
            let still_used = self.handle_in_use(handle, &current).await?;
            if still_used {
                break;
            }
            match self.kv.delete(&key, Some(kv.mod_revision)).await {
                Ok(_) | Err(DatastoreError::NotFound { .. }) => break,
                Err(DatastoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(released)
    }

    async fn handle_in_use(&self, handle: &str, record: &IpamHandle) -> Result<bool, IpamError> {
        for block_name in record.block.keys() {
            let Ok(cidr) = Cidr::parse(block_name) else {
                continue;
            };
            if let Some(kv) = self.kv.get(&block_key(&cidr)).await? {
                let block: AllocationBlock = decode(&kv)?;
                if block
                    .allocated()
                    .any(|a| a.attribute.handle_id.as_deref() == Some(handle))
                {
                    return Ok(true);
                }
            }
        }
        Ok(false)
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

    // ---- inspection ---------------------------------------------------------------------

    /// Every block, IPv4 then IPv6.
    pub async fn blocks(&self) -> Result<Vec<AllocationBlock>, IpamError> {
        let mut out = Vec::new();
        for v in [4u8, 6] {
            for kv in self.kv.list(&blocks_prefix(v)).await?.kvs {
                out.push(decode(&kv)?);
            }
        }
        Ok(out)
    }

    /// Every (host, block, state) affinity.
    pub async fn affinities(&self) -> Result<Vec<(String, Cidr, BlockAffinity)>, IpamError> {
        let prefix = all_affinities_prefix();
        let mut out = Vec::new();
        for kv in self.kv.list(&prefix).await?.kvs {
            let rest = kv.key.strip_prefix(&prefix).unwrap_or_default();
            let host = rest.split('/').next().unwrap_or_default().to_string();
            if let Some(cidr) = cidr_of_key(&kv.key) {
                out.push((host, cidr, decode(&kv)?));
            }
        }
        Ok(out)
    }

    /// Every handle record.
    pub async fn handles(&self) -> Result<Vec<(String, IpamHandle)>, IpamError> {
        let prefix = handles_prefix();
        let mut out = Vec::new();
        for kv in self.kv.list(&prefix).await?.kvs {
            let id = kv.key.strip_prefix(&prefix).unwrap_or_default().to_string();
            out.push((id, decode(&kv)?));
        }
        Ok(out)
    }
}
