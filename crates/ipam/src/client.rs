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

// The operations, one module each (they add methods to `Ipam`, whose state and shared
// helpers stay here).
mod affinity;
mod assign;
mod release;

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

/// What a retry loop returns once every attempt lost a compare-and-swap.
fn too_many_retries(what: String) -> IpamError {
    IpamError::TooManyRetries {
        what,
        attempts: MAX_RETRIES,
    }
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

    /// Writes one conditional transaction of a compare-and-swap retry loop: true when it was
    /// written (the hints remember what it wrote), false when a condition failed (the caller
    /// reads again and retries), an error otherwise.
    async fn commit(&self, compares: Vec<Compare>, ops: Vec<TxnOp>) -> Result<bool, IpamError> {
        match self.kv.txn(compares, ops).await {
            Ok(resp) => {
                self.hints().remember(&resp);
                Ok(true)
            }
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e.into()),
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
