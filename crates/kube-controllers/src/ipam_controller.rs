//! The node controller's IPAM half (edge): reads IPAM through [`margay_ipam::Ipam`] on the
//! configured datastore and pods and nodes from the Kubernetes API, lets [`crate::gc`] decide,
//! re-checks against a fresh listing, and writes.
//!
//! Level-triggered: every sync reads all blocks and decides from scratch with the timers the
//! collector keeps. Syncs run at start, every leakGracePeriod/2 (5 min without one), when a
//! candidate or an empty block falls due, and (at most once a `min_interval`) after pod or
//! node deletions and IPAM block changes.
//!
//! Never a live address: the blocks are read before the fresh pod and node listing, so every
//! allocation a release considers existed before that listing (its pod, if alive, is in it);
//! the release names the sequence number it read, so an address released and handed out again
//! in between is not touched; and a handle is released only when every address it holds is
//! confirmed, before and after the re-check.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use margay_api::net::Cidr;
use margay_api::{Kind, Resource, ResourceKey};
use margay_datastore::kube::api::KubeApi;
use margay_datastore::kube::route::{NODES, PODS};
use margay_datastore::{Client, DatastoreError, KvBackend};
use margay_ipam::{AffinityRelease, Ipam, IpamError, ReleaseIp};
use tokio::sync::{mpsc, watch};

use crate::config::DatastoreKind;
use crate::gc::{GcState, NodeLookup, NodeNames, Release, ScanInput, ScanOutcome, World};
use crate::informer::{Change, Informer, Projection, list_fresh};
use crate::metrics::{IpamGauges, Metrics, pool_of};
use crate::pods::{PodView, pod_view};

/// At most this many distinct addresses per block in one release write: each frees a handle
/// record in the same transaction, and etcd allows 128 operations per transaction.
pub const RELEASE_CHUNK: usize = 60;
/// Block writes in flight at once while releasing.
pub const RELEASE_CONCURRENCY: usize = 4;
/// Full scans without a leak grace period (Calico's).
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(5 * 60);

/// What went wrong in a sync (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("reading IPAM: {0}")]
    Ipam(#[from] IpamError),
    #[error("reading the datastore: {0}")]
    Datastore(#[from] DatastoreError),
    #[error("listing {what} from the Kubernetes API: {message}")]
    Kube { what: &'static str, message: String },
}

#[derive(Debug, Clone)]
pub struct IpamGcOptions {
    /// KubeControllersConfiguration's leakGracePeriod.
    pub grace: Option<Duration>,
    pub datastore: DatastoreKind,
    /// etcd: delete Calico Nodes whose Kubernetes Node is gone.
    pub delete_nodes: bool,
    /// Least time between two syncs triggered by events.
    pub min_interval: Duration,
    /// FELIX_INTERFACEPREFIX's first item (part of the endpoints pods convert to).
    pub interface_prefix: String,
}

impl IpamGcOptions {
    pub fn new(datastore: DatastoreKind, grace: Option<Duration>) -> IpamGcOptions {
        IpamGcOptions {
            grace,
            datastore,
            delete_nodes: datastore == DatastoreKind::Etcd,
            min_interval: Duration::from_secs(1),
            interface_prefix: "cali".into(),
        }
    }

    /// How often a full scan runs without any event.
    pub fn period(&self) -> Duration {
        match self.grace {
            Some(g) if !g.is_zero() => g / 2,
            _ => DEFAULT_PERIOD,
        }
    }
}

/// What one sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// False when the inputs were not ready (informers not synced, datastore not ready).
    pub ran: bool,
    pub scan: ScanOutcome,
    /// Addresses released.
    pub released: Vec<IpAddr>,
    /// Releases the re-check dropped.
    pub resurrected: usize,
    pub nodes_cleaned: Vec<String>,
    pub affinities_released: usize,
    pub calico_nodes_deleted: Vec<String>,
    /// Writes that failed (retried at the next sync).
    pub failures: usize,
}

/// The Kubernetes side the controller reads: pods and nodes, kept by informers.
pub struct KubeView {
    pub api: KubeApi,
    pub pods: Arc<Informer<PodView>>,
    pub nodes: Arc<Informer<()>>,
}

/// The pod projection the informers and the re-check use.
pub fn pod_projection(interface_prefix: String) -> Projection<PodView> {
    Arc::new(move |v| pod_view(v, &interface_prefix))
}

pub fn node_projection() -> Projection<()> {
    Arc::new(|_| Some(()))
}

pub struct IpamController<B> {
    ipam: Ipam<B>,
    client: Client<B>,
    kube: KubeView,
    opts: IpamGcOptions,
    metrics: Arc<Metrics>,
    state: GcState,
}

/// Calico node name → its Kubernetes node (None: not a Kubernetes node).
fn calico_node_names(items: &[Resource]) -> HashMap<String, Option<String>> {
    items
        .iter()
        .filter_map(|r| match r {
            Resource::Node(n) => {
                let k8s = n
                    .spec
                    .orch_refs
                    .iter()
                    .find(|o| o.orchestrator == "k8s")
                    .map(|o| o.node_name.clone())
                    .filter(|k| !k.is_empty());
                Some((n.metadata.name.clone(), k8s))
            }
            _ => None,
        })
        .collect()
}

fn kube_err(what: &'static str) -> impl Fn(margay_datastore::kube::api::ApiError) -> SyncError {
    move |e| SyncError::Kube {
        what,
        message: e.to_string(),
    }
}

impl<B: KvBackend + Clone + Send + Sync + 'static> IpamController<B> {
    pub fn new(
        backend: B,
        kube: KubeView,
        opts: IpamGcOptions,
        metrics: Arc<Metrics>,
    ) -> IpamController<B> {
        IpamController {
            ipam: Ipam::new(backend.clone()),
            client: Client::new(backend),
            kube,
            opts,
            metrics,
            state: GcState::default(),
        }
    }

    /// Candidates and confirmed leaks known now.
    pub fn flagged(&self) -> usize {
        self.state.flagged()
    }

    async fn calico_nodes(&self) -> Result<Option<HashMap<String, Option<String>>>, SyncError> {
        match self.opts.datastore {
            DatastoreKind::Kubernetes => Ok(None),
            DatastoreKind::Etcd => {
                let l = self.client.list(Kind::Node, None, "").await?;
                Ok(Some(calico_node_names(&l.items)))
            }
        }
    }

    /// ClusterInformation `default` says the datastore is locked (a migration): do nothing.
    async fn datastore_locked(&self) -> bool {
        let key = ResourceKey {
            kind: Kind::ClusterInformation,
            namespace: String::new(),
            name: "default".into(),
        };
        matches!(self.client.get(&key).await,
            Ok(Resource::ClusterInformation(ci)) if ci.spec.datastore_ready == Some(false))
    }

    /// One sync: scan, re-check, release, clean nodes, release empty blocks, metrics.
    pub async fn sync(&mut self) -> Result<SyncReport, SyncError> {
        let mut report = SyncReport::default();
        if !self.kube.pods.is_synced() || !self.kube.nodes.is_synced() {
            tracing::debug!("Kubernetes pods and nodes not listed yet; IPAM sync postponed");
            return Ok(report);
        }
        if self.datastore_locked().await {
            tracing::warn!(
                "ClusterInformation default says the datastore is not ready; skipping IPAM sync"
            );
            return Ok(report);
        }
        report.ran = true;
        // Blocks first: everything decided below existed before the listings that follow.
        let blocks = self.ipam.blocks().await?;
        let affinities: Vec<(String, Cidr)> = self
            .ipam
            .affinities()
            .await?
            .into_iter()
            .map(|(h, c, _)| (h, c))
            .collect();
        let pools = self.ipam.pools().await?;
        let reservations = self.ipam.reservations().await?;
        let calico = self.calico_nodes().await?;
        let now = Instant::now();
        let (outcome, gauges) = {
            let pods = self.kube.pods.read();
            let nodes = self.kube.nodes.read();
            let node_names = match &calico {
                Some(m) => NodeNames::Calico(m),
                None => NodeNames::Same,
            };
            let outcome = self.state.scan(&ScanInput {
                blocks: &blocks,
                affinities: &affinities,
                world: World {
                    pods: &pods,
                    nodes: &*nodes,
                    node_names,
                },
                grace: self.opts.grace,
                now,
            });
            let known: BTreeSet<String> = match &calico {
                Some(m) => m.keys().cloned().collect(),
                None => nodes.keys().cloned().collect(),
            };
            let state = &self.state;
            let gauges = IpamGauges::compute(
                &blocks,
                &pools,
                &reservations,
                &|k| state.is_flagged(k),
                &known,
            );
            (outcome, gauges)
        };
        self.metrics.set_ipam(gauges);
        tracing::debug!(
            allocations = outcome.allocations,
            flagged = outcome.flagged,
            releases = outcome.releases.len(),
            nodes = outcome.nodes_to_clean.len(),
            empty_blocks = outcome.empty_blocks.len(),
            "IPAM scan"
        );
        let stale_calico_nodes = self.stale_calico_nodes(calico.as_ref());
        let need_fresh = !outcome.releases.is_empty()
            || !outcome.nodes_to_clean.is_empty()
            || !stale_calico_nodes.is_empty();
        if need_fresh {
            self.act(&outcome, &stale_calico_nodes, &mut report).await?;
        }
        for (host, cidr) in &outcome.empty_blocks {
            match self.ipam.release_block_affinity(host, cidr, true).await {
                Ok(AffinityRelease::NotEmpty) | Ok(AffinityRelease::NotFound) => {}
                Ok(r) => {
                    tracing::info!(%cidr, node = %host, outcome = ?r, "released the affinity of an empty block");
                    report.affinities_released += 1;
                    self.metrics.add_released_affinities(1);
                }
                Err(e) => {
                    tracing::warn!(%cidr, node = %host, "releasing the affinity of an empty block failed: {e}");
                    report.failures += 1;
                }
            }
        }
        report.scan = outcome;
        Ok(report)
    }

    /// etcd: Calico Nodes of Kubernetes nodes the cache does not have.
    fn stale_calico_nodes(&self, calico: Option<&HashMap<String, Option<String>>>) -> Vec<String> {
        let (true, Some(map)) = (self.opts.delete_nodes, calico) else {
            return Vec::new();
        };
        let nodes = self.kube.nodes.read();
        let mut out: Vec<String> = map
            .iter()
            .filter(|(_, k)| k.as_ref().is_some_and(|k| !nodes.contains_key(k)))
            .map(|(c, _)| c.clone())
            .collect();
        out.sort();
        out
    }

    /// The writes, after a fresh look at pods and nodes.
    async fn act(
        &mut self,
        outcome: &ScanOutcome,
        stale_calico_nodes: &[String],
        report: &mut SyncReport,
    ) -> Result<(), SyncError> {
        let project = pod_projection(self.opts.interface_prefix.clone());
        let (pods, nodes) = tokio::join!(
            list_fresh(&self.kube.api, &PODS, &*project),
            list_fresh(&self.kube.api, &NODES, &|_| Some(()))
        );
        let pods = pods.map_err(kube_err("pods"))?;
        let nodes = nodes.map_err(kube_err("nodes"))?;
        let calico = self.calico_nodes().await?;
        let node_names = match &calico {
            Some(m) => NodeNames::Calico(m),
            None => NodeNames::Same,
        };
        let world = World {
            pods: &pods,
            nodes: &nodes,
            node_names,
        };
        let before = outcome.releases.len();
        let releases = self
            .state
            .recheck(outcome.releases.clone(), &world, Instant::now());
        report.resurrected = before - releases.len();

        // Release, block by block, a chunk per write, a few blocks at a time.
        let mut by_block: BTreeMap<Cidr, Vec<Release>> = BTreeMap::new();
        for r in releases {
            by_block.entry(r.allocation.block).or_default().push(r);
        }
        let mut chunks: Vec<(Cidr, Vec<Release>)> = Vec::new();
        for (cidr, list) in by_block {
            for c in list.chunks(RELEASE_CHUNK) {
                chunks.push((cidr, c.to_vec()));
            }
        }
        let ipam = self.ipam.clone();
        type Outcome = (Cidr, Vec<Release>, Result<Vec<IpAddr>, IpamError>);
        let results: Vec<Outcome> = stream::iter(chunks)
            .map(move |(cidr, list)| {
                let ipam = ipam.clone();
                async move {
                    let ips: Vec<ReleaseIp> = list
                        .iter()
                        .map(|r| ReleaseIp {
                            ip: r.allocation.key.ip,
                            sequence_number: Some(r.allocation.key.sequence_number),
                        })
                        .collect();
                    let res = ipam.release_ips_in_block(&cidr, &ips).await;
                    (cidr, list, res)
                }
            })
            .buffer_unordered(RELEASE_CONCURRENCY)
            .collect()
            .await;
        let pools = self.ipam.pools().await.unwrap_or_default();
        let mut failed_nodes: HashSet<String> = HashSet::new();
        for (cidr, list, res) in results {
            match res {
                Ok(freed) => {
                    let freed: HashSet<IpAddr> = freed.into_iter().collect();
                    let pool = pool_of(&cidr, &pools).to_string();
                    for r in list {
                        let a = &r.allocation;
                        // Already free counts as done: someone else released it.
                        self.state.released(&a.key);
                        if freed.contains(&a.key.ip) {
                            tracing::info!(ip = %a.key.ip, handle = ?a.key.handle, node = a.node(), pod = ?a.pod(), reason = ?r.reason, "garbage collected leaked IP address");
                            self.metrics.add_reclaimed(&pool, a.node(), 1);
                            report.released.push(a.key.ip);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(%cidr, addresses = list.len(), "releasing leaked addresses failed (retried at the next sync): {e}");
                    report.failures += 1;
                    self.metrics.add_error("ipam");
                    for r in list {
                        failed_nodes.insert(r.allocation.node().to_string());
                    }
                }
            }
        }

        // Deleted nodes whose leaks are all released: their affinities go.
        for node in &outcome.nodes_to_clean {
            if failed_nodes.contains(node) {
                continue;
            }
            if !matches!(world.lookup(node), NodeLookup::Node { exists: false, .. }) {
                tracing::info!(
                    node,
                    "node is back (or no longer a Kubernetes node); keeping its IPAM state"
                );
                continue;
            }
            match self.ipam.release_host_affinities(node, false).await {
                Ok(done) => {
                    let n = done
                        .iter()
                        .filter(|(_, r)| {
                            !matches!(r, AffinityRelease::NotFound | AffinityRelease::NotEmpty)
                        })
                        .count();
                    tracing::info!(
                        node,
                        affinities = n,
                        "released the IPAM affinities of a deleted node"
                    );
                    report.affinities_released += n;
                    self.metrics.add_released_affinities(n as u64);
                    report.nodes_cleaned.push(node.clone());
                }
                Err(e) => {
                    tracing::warn!(
                        node,
                        "releasing the affinities of a deleted node failed (retried at the next sync): {e}"
                    );
                    report.failures += 1;
                    self.metrics.add_error("ipam");
                }
            }
        }

        // etcd: Calico Nodes whose Kubernetes Node is gone (confirmed by the fresh listing).
        for cnode in stale_calico_nodes {
            let gone = calico
                .as_ref()
                .and_then(|m| m.get(cnode))
                .is_some_and(|k| k.as_ref().is_some_and(|k| !nodes.contains_key(k)));
            if !gone {
                continue;
            }
            let key = ResourceKey {
                kind: Kind::Node,
                namespace: String::new(),
                name: cnode.clone(),
            };
            match self.client.delete(&key, None).await {
                Ok(_) | Err(DatastoreError::NotFound { .. }) => {
                    tracing::info!(node = %cnode, "deleted the Calico Node of a deleted Kubernetes Node");
                    self.metrics.add_deleted_node();
                    report.calico_nodes_deleted.push(cnode.clone());
                }
                Err(e) => {
                    tracing::warn!(node = %cnode, "deleting the Calico Node failed (retried at the next sync): {e}");
                    report.failures += 1;
                }
            }
        }
        Ok(())
    }

    /// Runs until `stop` turns true: syncs at start, periodically, when something falls due,
    /// and after deletions (`pod_changes`, `node_changes`) and IPAM block changes.
    pub async fn run(
        mut self,
        mut pod_changes: mpsc::UnboundedReceiver<Change>,
        mut node_changes: mpsc::UnboundedReceiver<Change>,
        mut stop: watch::Receiver<bool>,
    ) {
        let period = self.opts.period();
        tracing::info!(period = ?period, grace = ?self.opts.grace, "IPAM garbage collection running");
        let (block_tx, mut block_rx) = mpsc::unbounded_channel();
        let watcher = tokio::spawn(watch_blocks(self.ipam.backend().clone(), block_tx));
        let _watcher = AbortOnDrop(watcher.abort_handle());
        self.kube.pods.wait_synced().await;
        self.kube.nodes.wait_synced().await;
        let mut last: Option<Instant> = None;
        let mut next_full = Instant::now();
        let mut next_due: Option<Instant> = None;
        let mut dirty = false;
        let mut retry: Option<(Instant, u32)> = None;
        loop {
            let mut deadline = next_full;
            if let Some(d) = next_due {
                deadline = deadline.min(d);
            }
            if dirty {
                deadline =
                    deadline.min(last.map_or_else(Instant::now, |l| l + self.opts.min_interval));
            }
            if let Some((at, _)) = retry {
                deadline = deadline.min(at);
            }
            tokio::select! {
                _ = stop.changed() => return,
                Some(c) = pod_changes.recv() => {
                    if matches!(c, Change::Delete(_)) { dirty = true; }
                    continue;
                }
                Some(c) = node_changes.recv() => {
                    if matches!(c, Change::Delete(_)) { dirty = true; }
                    continue;
                }
                Some(()) = block_rx.recv() => { dirty = true; continue; }
                _ = tokio::time::sleep_until(deadline.into()) => {}
            }
            if *stop.borrow() {
                return;
            }
            let started = Instant::now();
            last = Some(started);
            dirty = false;
            let backoff = |retry: Option<(Instant, u32)>| {
                let n = retry.map_or(1, |(_, n)| n + 1);
                let wait = Duration::from_secs(1 << n.min(5)).min(Duration::from_secs(30));
                (Instant::now() + wait, n)
            };
            match self.sync().await {
                Ok(report) => {
                    next_full = started + period;
                    next_due = report.scan.next_due;
                    // Something was written: look again soon (metrics, and what follows).
                    if !report.released.is_empty() || report.affinities_released > 0 {
                        dirty = true;
                    }
                    if !report.released.is_empty() {
                        tracing::info!(released = report.released.len(), took = ?started.elapsed(), "IPAM sync released leaked addresses");
                    }
                    // Failed writes are tried again, later each time they keep failing.
                    retry = (report.failures > 0).then(|| backoff(retry));
                }
                Err(e) => {
                    let r = backoff(retry);
                    tracing::warn!(retry_in = ?r.0.saturating_duration_since(Instant::now()), "IPAM sync failed: {e}");
                    self.metrics.add_error("ipam");
                    retry = Some(r);
                }
            }
        }
    }
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Announces IPAM block changes (for metrics and prompt follow-ups); watches again after
/// errors. Missing a change only delays a sync until the next periodic one.
async fn watch_blocks<B: KvBackend>(kv: B, tx: mpsc::UnboundedSender<()>) {
    const PREFIX: &str = "/calico/ipam/v2/assignment/";
    let mut failures = 0u32;
    loop {
        if failures > 0 {
            tokio::time::sleep(KubeApi::backoff(failures)).await;
        }
        let rev = match kv.revision().await {
            Ok(r) => r,
            Err(e) => {
                failures += 1;
                tracing::debug!("IPAM block watch: cannot read the revision: {e}");
                continue;
            }
        };
        let mut w = match kv.watch(PREFIX, rev).await {
            Ok(w) => w,
            Err(e) => {
                failures += 1;
                tracing::debug!("IPAM block watch failed: {e}");
                continue;
            }
        };
        if failures > 0 && tx.send(()).is_err() {
            // Changes between the lost watch and this one were not seen: look anyway.
            return;
        }
        failures = 0;
        while let Some(item) = w.next().await {
            match item {
                Ok(_) => {
                    if tx.send(()).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!("IPAM block watch ended: {e}");
                    failures += 1;
                    break;
                }
            }
        }
        if tx.is_closed() {
            return;
        }
        failures = failures.max(1);
    }
}
