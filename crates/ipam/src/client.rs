//! The datastore adapter: Calico's IPAM protocol over any `KvBackend`.
//!
//! Every write is compare-and-swap on the revisions read and retried (bounded) on conflict
//! after re-reading. A block write and the handle-record change it implies are one
//! transaction ([`KvBackend::txn`]), so handles and blocks agree whatever crashes:
//! - assign: the block and the handle (created, or its count for the block raised);
//! - release: the block and the handle (count lowered; deleted when it holds nothing);
//! - claim: pending affinity, then the block (create: exactly one host wins), then the
//!   affinity is confirmed; pending affinities count as absent.
//!
//! Inside the host lock every round trip counts (each costs about as much as the work; see
//! `examples/ipam_bench.rs`). An assignment reads everything it decides on — pools,
//! reservations, configuration, the node, the host's affinities — in one read transaction,
//! together with the block this process last assigned from for the host (a hint, checked like
//! any read: the block must still be a confirmed affinity of the host), then writes once.
//! Release by handle reads the handle with the hinted blocks, then writes once.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use margay_api::ippool::AllowedUse;
use margay_api::net::Cidr;
use margay_api::{Kind, Resource, ResourceKey};
use margay_datastore::keys::{kind_prefix, resource_path};
use margay_datastore::{Compare, DatastoreError, KeyValue, KvBackend, TxnOp, TxnOpResult};
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
/// The host's blocks read per round trip when looking for room (a block is up to ~16 KB).
const BLOCK_READ_BATCH: usize = 4;
/// Hinted blocks read along with a handle on release (bounds the bytes read on a guess).
const MAX_RELEASE_HINTS: usize = 4;

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

/// What [`Ipam::release_block_affinity`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum AffinityRelease {
    /// The block was empty: it and its affinity were deleted.
    BlockDeleted,
    /// The block holds addresses: it stays, affine to nobody; the affinity was deleted.
    Unaffined,
    /// Only the affinity record was deleted (no block, or a block affine to another host).
    AffinityOnly,
    /// `require_empty` and the block holds addresses: nothing changed.
    NotEmpty,
    /// Neither the affinity nor a block affine to the host exists.
    NotFound,
}

/// What one IP version's assignment works with.
#[derive(Clone, Copy)]
struct VersionContext<'a> {
    version: u8,
    pools: &'a [PoolInfo],
    reservations: &'a [Cidr],
    config: &'a IpamConfig,
    affinities: &'a [KeyValue],
    /// Blocks read with the context (the hints); None: the block did not exist.
    blocks: &'a BTreeMap<Cidr, Option<KeyValue>>,
}

/// Everything an assignment decides on, read at one revision.
struct AssignContext {
    pools: Vec<PoolInfo>,
    reservations: Vec<Cidr>,
    config: IpamConfig,
    labels: BTreeMap<String, String>,
    affinities_v4: Vec<KeyValue>,
    affinities_v6: Vec<KeyValue>,
    blocks: BTreeMap<Cidr, Option<KeyValue>>,
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
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
        };
        // The directory exists after the first call; only create it when opening says so.
        let file = match open() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| err(format!("cannot create its directory: {e}")))?;
                }
                open()
            }
            other => other,
        }
        .map_err(|e| err(format!("cannot open: {e}")))?;
        // Uncontended across processes, the lock is taken at once without a trip through the
        // blocking pool (that hand-off is a measurable share of a ~1 ms operation).
        let file = match file.try_lock() {
            Ok(()) => file,
            Err(std::fs::TryLockError::WouldBlock) => {
                // Blocking: other processes hold it only for one IPAM operation.
                tokio::task::spawn_blocking(move || file.lock().map(|()| file))
                    .await
                    .map_err(|e| err(format!("lock task failed: {e}")))?
                    .map_err(|e| err(format!("cannot lock: {e}")))?
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(err(format!("cannot lock: {e}"))),
        };
        Ok(HostLockGuard {
            _inner: inner,
            _file: file,
        })
    }
}

/// What this process remembers between operations, all of it guesses that save reads: every
/// use is checked (a hint block must be a confirmed affinity of the host in the same read; a
/// remembered value is only written over with its revision as the condition), so a stale or
/// foreign entry costs a retry, never correctness.
#[derive(Default)]
struct Hints {
    /// The block this process last assigned from, per (host, IP version).
    blocks: BTreeMap<(String, u8), Cidr>,
    /// Values as this process last wrote them (blocks, handles), by key.
    written: std::collections::HashMap<String, KeyValue>,
}

/// Remembered written values beyond which the memory starts afresh (handles of live pods
/// are small; blocks are few).
const MAX_REMEMBERED: usize = 4096;

impl Hints {
    fn remember(&mut self, resp: &margay_datastore::TxnResponse) {
        if self.written.len() >= MAX_REMEMBERED {
            self.written.clear();
        }
        for r in &resp.results {
            match r {
                TxnOpResult::Put(kv) => {
                    self.written.insert(kv.key.clone(), kv.clone());
                }
                TxnOpResult::Delete(Some(kv)) => {
                    self.written.remove(&kv.key);
                }
                _ => {}
            }
        }
    }
}

/// IPAM over a datastore backend.
#[derive(Clone)]
pub struct Ipam<B> {
    kv: B,
    lock: Option<Arc<HostLock>>,
    hints: Arc<Mutex<Hints>>,
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

fn unexpected_answer() -> IpamError {
    DatastoreError::invalid("a read transaction answered with results not matching its operations")
        .into()
}

fn next_get(
    results: &mut impl Iterator<Item = TxnOpResult>,
) -> Result<Option<KeyValue>, IpamError> {
    match results.next() {
        Some(TxnOpResult::Get(kv)) => Ok(kv),
        _ => Err(unexpected_answer()),
    }
}

fn next_list(results: &mut impl Iterator<Item = TxnOpResult>) -> Result<Vec<KeyValue>, IpamError> {
    match results.next() {
        Some(TxnOpResult::List(kvs)) => Ok(kvs),
        _ => Err(unexpected_answer()),
    }
}

fn config_resource_key() -> ResourceKey {
    ResourceKey {
        kind: Kind::IPAMConfiguration,
        namespace: String::new(),
        name: "default".into(),
    }
}

fn node_resource_key(host: &str) -> ResourceKey {
    ResourceKey {
        kind: Kind::Node,
        namespace: String::new(),
        name: host.to_string(),
    }
}

/// The stored resources of `kind` among `kvs` (undecodable ones skipped, as a list does).
fn resources_of(kind: Kind, kvs: &[KeyValue]) -> impl Iterator<Item = Resource> + '_ {
    kvs.iter()
        .filter_map(move |kv| match margay_datastore::client::decode(kv) {
            Ok(r) if r.kind() == kind => Some(r),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(key = %kv.key, "ignoring undecodable {kind:?}: {e}");
                None
            }
        })
}

/// Every usable IP pool among the stored ones (bad ones skipped with a warning).
fn pools_from(kvs: &[KeyValue]) -> Vec<PoolInfo> {
    let mut out = Vec::new();
    for r in resources_of(Kind::IPPool, kvs) {
        if let Resource::IPPool(p) = r {
            match PoolInfo::from_resource(&p) {
                Ok(info) => out.push(info),
                Err(e) => tracing::warn!("ignoring IP pool: {e}"),
            }
        }
    }
    out
}

/// Every reserved CIDR among the stored IPReservations.
fn reservations_from(kvs: &[KeyValue]) -> Vec<Cidr> {
    let mut out = Vec::new();
    for r in resources_of(Kind::IPReservation, kvs) {
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
    out
}

/// The v3 IPAMConfiguration `default` if present, else Calico's v1 config key, else defaults.
fn config_from(v3: Option<&KeyValue>, v1: Option<&KeyValue>) -> Result<IpamConfig, IpamError> {
    if let Some(kv) = v3
        && let Resource::IPAMConfiguration(c) = margay_datastore::client::decode(kv)?
    {
        return Ok(IpamConfig {
            strict_affinity: c.spec.strict_affinity,
            auto_allocate_blocks: c.spec.auto_allocate_blocks,
            max_blocks_per_host: usize::try_from(c.spec.max_blocks_per_host.unwrap_or(0))
                .unwrap_or(0),
        });
    }
    match v1 {
        Some(kv) => {
            let c: StoredIpamConfig = decode(kv)?;
            Ok(IpamConfig {
                strict_affinity: c.strict_affinity,
                auto_allocate_blocks: c.auto_allocate_blocks,
                max_blocks_per_host: usize::try_from(c.max_blocks_per_host).unwrap_or(0),
            })
        }
        None => Ok(IpamConfig::default()),
    }
}

/// The handle record's side of a block change of `delta` addresses: the condition that the
/// record is still as read (`current`; None = absent), and its write (none when an absent
/// record would stay empty; a delete when it becomes empty).
fn handle_change(
    key: &str,
    current: Option<&KeyValue>,
    block: &Cidr,
    delta: i64,
) -> Result<(Compare, Option<TxnOp>), IpamError> {
    let (mut record, compare) = match current {
        Some(kv) => (
            decode::<IpamHandle>(kv)?,
            Compare::ModRevision(key.to_string(), kv.mod_revision),
        ),
        None => (IpamHandle::default(), Compare::Absent(key.to_string())),
    };
    let name = block.to_string();
    let count = record.block.entry(name.clone()).or_insert(0);
    *count = (*count as i64 + delta).max(0) as usize;
    if *count == 0 {
        record.block.remove(&name);
    }
    let op = match (current.is_some(), record.block.is_empty()) {
        (false, true) => None,
        (true, true) => Some(TxnOp::delete(key)),
        (_, false) => Some(TxnOp::put(key, encode(&record))),
    };
    Ok((compare, op))
}

/// A block write and the handle records it changes, as one transaction: the block
/// compare-and-swapped against the revision it was read at, each handle record against how it
/// was read — so a block and its handles never disagree, whoever else writes.
struct BlockTxn {
    compares: Vec<Compare>,
    ops: Vec<TxnOp>,
}

impl BlockTxn {
    fn new(key: &str, read_at: i64, block: &AllocationBlock) -> Self {
        BlockTxn {
            compares: vec![Compare::ModRevision(key.to_string(), read_at)],
            ops: vec![TxnOp::put(key, encode(block))],
        }
    }

    /// Adds the change of `delta` addresses of `block` to the handle record at `key`
    /// ([`handle_change`]).
    fn handle(
        &mut self,
        key: &str,
        current: Option<&KeyValue>,
        block: &Cidr,
        delta: i64,
    ) -> Result<(), IpamError> {
        let (compare, op) = handle_change(key, current, block, delta)?;
        self.compares.push(compare);
        self.ops.extend(op);
        Ok(())
    }
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
            kv,
            lock: None,
            hints: Arc::default(),
        }
    }

    fn hints(&self) -> std::sync::MutexGuard<'_, Hints> {
        // A hint map is valid in any state, so a poisoned lock is still usable.
        self.hints.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads keys and prefixes at one revision, in one round trip.
    async fn read(&self, ops: Vec<TxnOp>) -> Result<std::vec::IntoIter<TxnOpResult>, IpamError> {
        let n = ops.len();
        let results = self.kv.txn(Vec::new(), ops).await?.results;
        if results.len() != n {
            return Err(unexpected_answer());
        }
        Ok(results.into_iter())
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
        let mut r = self
            .read(vec![
                TxnOp::get(resource_path(&config_resource_key())),
                TxnOp::get(CONFIG_KEY),
            ])
            .await?;
        let (v3, v1) = (next_get(&mut r)?, next_get(&mut r)?);
        config_from(v3.as_ref(), v1.as_ref())
    }

    /// Every IP pool (bad ones skipped with a warning).
    pub async fn pools(&self) -> Result<Vec<PoolInfo>, IpamError> {
        let listed = self.kv.list(&kind_prefix(Kind::IPPool, None, "")).await?;
        Ok(pools_from(&listed.kvs))
    }

    /// Every reserved CIDR (IPReservation resources).
    pub async fn reservations(&self) -> Result<Vec<Cidr>, IpamError> {
        let listed = self
            .kv
            .list(&kind_prefix(Kind::IPReservation, None, ""))
            .await?;
        Ok(reservations_from(&listed.kvs))
    }

    /// Everything `args` needs decided, in one read: pools, reservations, configuration, the
    /// node's labels, the host's affinities, and the hinted blocks.
    async fn read_context(&self, args: &AssignArgs) -> Result<AssignContext, IpamError> {
        let host = &args.hostname;
        let hinted: Vec<Cidr> = {
            let hints = self.hints();
            [(4u8, args.num_v4), (6u8, args.num_v6)]
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .filter_map(|(v, _)| hints.blocks.get(&(host.clone(), v)).copied())
                .collect()
        };
        let mut ops = vec![
            TxnOp::list(kind_prefix(Kind::IPPool, None, "")),
            TxnOp::list(kind_prefix(Kind::IPReservation, None, "")),
            TxnOp::get(resource_path(&config_resource_key())),
            TxnOp::get(CONFIG_KEY),
            TxnOp::get(resource_path(&node_resource_key(host))),
            TxnOp::list(host_affinities_prefix(host, 4)),
            TxnOp::list(host_affinities_prefix(host, 6)),
        ];
        ops.extend(hinted.iter().map(|c| TxnOp::get(block_key(c))));
        let mut r = self.read(ops).await?;
        let pools = pools_from(&next_list(&mut r)?);
        let reservations = reservations_from(&next_list(&mut r)?);
        let (v3, v1) = (next_get(&mut r)?, next_get(&mut r)?);
        let config = config_from(v3.as_ref(), v1.as_ref())?;
        let labels = match next_get(&mut r)? {
            Some(kv) => margay_datastore::client::decode(&kv)?
                .metadata()
                .labels
                .clone(),
            None => BTreeMap::new(),
        };
        let affinities_v4 = next_list(&mut r)?;
        let affinities_v6 = next_list(&mut r)?;
        let mut blocks = BTreeMap::new();
        for c in hinted {
            blocks.insert(c, next_get(&mut r)?);
        }
        Ok(AssignContext {
            pools,
            reservations,
            config,
            labels,
            affinities_v4,
            affinities_v6,
            blocks,
        })
    }

    // ---- assignment ---------------------------------------------------------------------

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
    async fn assign_from_block(
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
            match self.kv.txn(txn.compares, txn.ops).await {
                Ok(resp) => {
                    self.hints().remember(&resp);
                    return Ok(taken);
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(IpamError::TooManyRetries {
            what: format!("assigning from block {cidr}"),
            attempts: MAX_RETRIES,
        })
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

    async fn delete_if_present(&self, key: &str) -> Result<(), IpamError> {
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
            match self.kv.txn(txn.compares, txn.ops).await {
                Ok(resp) => {
                    self.hints().remember(&resp);
                    return Ok(AssignedIp { ip, block: cidr });
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e.into()),
            }
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
            match self.kv.txn(txn.compares, txn.ops).await {
                Ok(resp) => {
                    self.hints().remember(&resp);
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
            match self.kv.txn(compares, ops).await {
                Ok(resp) => {
                    self.hints().remember(&resp);
                    return Ok(released);
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(IpamError::TooManyRetries {
            what: format!("releasing handle {handle}"),
            attempts: MAX_RETRIES,
        })
    }

    /// The handle record and every block it names, as this process last wrote them, if it
    /// remembers all of them.
    fn remembered_handle(
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

    // ---- affinity release -----------------------------------------------------------------

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
            match self.kv.txn(compares, ops).await {
                Ok(resp) => {
                    self.hints().remember(&resp);
                    tracing::info!(%cidr, host, ?outcome, "released IPAM block affinity");
                    return Ok(outcome);
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(IpamError::TooManyRetries {
            what: format!("releasing the affinity of {host} for block {cidr}"),
            attempts: MAX_RETRIES,
        })
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
