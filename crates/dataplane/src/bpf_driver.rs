//! The eBPF dataplane driver (`BPFEnabled=true`): workload policy in BPF programs and maps
//! (crates/bpf), routes, VXLAN, sysctls and workload interface settings exactly as the Linux
//! driver does them (the same `linux::*` parts). It replaces nftables policy only.
//!
//! Like the Linux driver, each batch goes into the model first and the kernel is written
//! only after `InSync`; a failed write, or an endpoint whose interface does not exist yet,
//! is retried by [`DataplaneDriver::housekeeping`]. The programs are attached in the
//! network namespace of the thread calling `apply`/`housekeeping` (Felix runs inside its
//! node's namespace).
//!
//! Restarts do not touch traffic: the programs' TCX links and the maps are pinned, so
//! they keep enforcing the previous run's rules while Felix is down and after it starts;
//! `new` adopts them (the syncer's state is rebuilt from the maps) and the first in-sync
//! write changes only what differs, then sweeps programs no endpoint claims any more.
//!
//! Services (the model's service ports) are load-balanced by the same programs
//! (`bpf/svc.h`, [`margay_bpf::services`]): the service maps are written after the policy
//! maps in every write, incrementally; no nftables service section exists in this mode.
//!
//! DefaultEndpointToHostAction and natOutgoing stay in a small nftables table
//! ([`crate::bpf_host_nft`]). Housekeeping runs the conntrack garbage collector every
//! [`CT_GC_INTERVAL`]. Flow logs read the program's events themselves
//! ([`BpfStatusHandle::flow_source`]); the driver only publishes what slots and steps mean.
//! Not in this milestone (see crates/bpf/DESIGN.md): host endpoints, IPv6.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use margay_bpf::compile::{BlockKey, CompileConfig};
use margay_bpf::flows::{Decided, FlowNames};
use margay_bpf::layout::{ACT_ALLOW, ACT_DENY, ACT_LOG, FlowEvent, HOOK_TO_WL};
use margay_bpf::loader::{BpfMaps, CtGc, LinkRestore, LoadError, ensure_bpffs};
use margay_bpf::services::{SvcMaps, SvcReport, SvcSyncer};
use margay_bpf::sync::{AdoptReport, SyncReport, Syncer};
use margay_calc::Message;
use margay_calc::RuleAction;
use margay_flows::RuleRef;

use crate::bpf_host_nft::{HostNft, HostNftConfig};
use crate::linux::interfaces::{InterfaceConfig, WorkloadInterfaces};
use crate::linux::routing::{Routing, RoutingConfig};
use crate::linux::sysctl::{ProcSys, Sysctl};
use crate::nft::render::{LogOwner, flow_rule_ref, log_prefix};
use crate::{DataplaneDriver, DataplaneError, EndpointStatus, Recording, StatusUpdate};

fn default_data_ifaces() -> regex::Regex {
    // A constant pattern: it compiles (unit-tested below).
    regex::Regex::new(margay_bpf::services::DEFAULT_DATA_IFACE_PATTERN)
        .unwrap_or_else(|_| regex::Regex::new("^$").unwrap_or_else(|_| unreachable!()))
}

/// How often housekeeping sweeps conntrack (Calico's BPF scanner: every 10 s).
pub const CT_GC_INTERVAL: Duration = Duration::from_secs(10);

/// The eBPF driver's state, for `felix status` and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BpfStatus {
    pub pin_dir: PathBuf,
    /// Interfaces with programs attached.
    pub interfaces_attached: usize,
    /// Workload endpoints with an entry.
    pub endpoints: usize,
    /// Rule blocks stored, and their rules.
    pub blocks: usize,
    pub rules: usize,
    pub set_entries: usize,
    /// The last conntrack sweep: entries deleted and left.
    pub conntrack_deleted: usize,
    pub conntrack_entries: usize,
    /// What the start took over from the previous run: endpoints, interfaces, programs
    /// replaced.
    pub restored_endpoints: usize,
    pub restored_interfaces: usize,
    pub programs_replaced: usize,
    /// Service frontends (address, port, protocol) and backend slots in the service maps.
    #[serde(default)]
    pub service_frontends: usize,
    #[serde(default)]
    pub service_backends: usize,
}

/// Shared view of the driver's [`BpfStatus`] (and what flow logs need of the driver).
#[derive(Debug, Clone, Default)]
pub struct BpfStatusHandle {
    status: Arc<Mutex<BpfStatus>>,
    flows: BpfFlowSource,
}

impl BpfStatusHandle {
    pub fn get(&self) -> BpfStatus {
        lock(&self.status).clone()
    }

    /// Where flow logs read the program's events and how they name them.
    pub fn flow_source(&self) -> BpfFlowSource {
        self.flows.clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Flow logs' view of the eBPF driver: the pin directory (the ring buffer is
/// `<pin_dir>/mgy_flows`, read with [`margay_bpf::flows::FlowReader`]) and the names of the
/// slots and steps the syncer wrote, published after every write while someone
/// [wants](BpfFlowSource::want) them (nothing is built while flow logs are off).
#[derive(Debug, Clone, Default)]
pub struct BpfFlowSource {
    pub pin_dir: PathBuf,
    wanted: Arc<AtomicBool>,
    names: Arc<Mutex<Arc<FlowNames>>>,
}

impl BpfFlowSource {
    /// Asks the driver to publish names from its next write or housekeeping on.
    pub fn want(&self) {
        self.wanted.store(true, Ordering::Relaxed);
    }

    pub fn names(&self) -> Arc<FlowNames> {
        lock(&self.names).clone()
    }

    /// A Log rule's event (`ACT_LOG`: Calico logs the packet and evaluation goes on) as the
    /// line the nftables dataplane's `log prefix "calico-packet"` writes, naming the policy
    /// and rule; None for any other event or a rule the names do not know.
    pub fn log_line(names: &FlowNames, e: &FlowEvent) -> Option<String> {
        if e.action != ACT_LOG {
            return None;
        }
        let Decided::Rule {
            block, rule_index, ..
        } = names.resolve(e)
        else {
            return None;
        };
        let owner = match &*block {
            BlockKey::Policy(id, _) => LogOwner::policy(id),
            BlockKey::Profile(name, _) => LogOwner::profile(name),
            BlockKey::Guard(_) => return None,
        };
        let who = if owner.namespace.is_empty() {
            format!("{}/{}", owner.kind, owner.name)
        } else {
            format!("{}/{}/{}", owner.kind, owner.namespace, owner.name)
        };
        let dir = if usize::from(e.hook) == HOOK_TO_WL {
            "ingress"
        } else {
            "egress"
        };
        Some(format!(
            "{}: IFINDEX={} SRC={} DST={} PROTO={} SPT={} DPT={} LEN={} ({who} {dir} rule {rule_index})",
            log_prefix("", &owner),
            e.ifindex,
            e.src,
            e.dst,
            e.proto,
            e.sport,
            e.dport,
            e.len
        ))
    }

    /// What decided the event's flow, as flow records name it (the rule and its tier), or
    /// None for what no policy decided (an endpoint's guards, a torn write, a Log rule, a
    /// slot the names do not know yet).
    pub fn resolve(names: &FlowNames, e: &FlowEvent) -> Option<(RuleRef, String)> {
        use margay_flows::{Action, Direction, Origin};
        let direction = if usize::from(e.hook) == HOOK_TO_WL {
            Direction::Ingress
        } else {
            Direction::Egress
        };
        match names.resolve(e) {
            Decided::Rule {
                block,
                rule_index,
                action,
            } => {
                let action = match action {
                    ACT_ALLOW => RuleAction::Allow,
                    ACT_DENY => RuleAction::Deny,
                    _ => return None,
                };
                let ingress = direction == Direction::Ingress;
                let index = usize::try_from(rule_index).ok()?;
                match &*block {
                    BlockKey::Policy(id, _) => {
                        flow_rule_ref(&LogOwner::policy(id), ingress, index, action)
                            .map(|r| (r, id.tier.clone()))
                    }
                    BlockKey::Profile(name, _) => {
                        flow_rule_ref(&LogOwner::profile(name), ingress, index, action)
                            .map(|r| (r, "__PROFILE__".to_string()))
                    }
                    BlockKey::Guard(_) => None,
                }
            }
            Decided::TierEnd { tier } => Some((
                RuleRef {
                    action: Action::Deny,
                    direction,
                    origin: Origin::EndOfTier {
                        tier: tier.to_string(),
                    },
                    rule_index: None,
                },
                tier.to_string(),
            )),
            Decided::NoMatch => Some((
                RuleRef {
                    action: Action::Deny,
                    direction,
                    origin: Origin::NoProfile,
                    rule_index: None,
                },
                "__PROFILE__".to_string(),
            )),
            Decided::Unknown => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct BpfDriverConfig {
    /// Where the maps are pinned; unique per Felix instance (`<bpffs>/margay/<node>`).
    pub pin_dir: PathBuf,
    /// Mount a BPF filesystem here first when there is none (e.g. /sys/fs/bpf); None: the
    /// caller guarantees `pin_dir` is on one.
    pub bpffs_mount: Option<PathBuf>,
    pub compile: CompileConfig,
    /// Workload interface prefixes (InterfacePrefix): an interface with one of them that no
    /// endpoint claims gets the programs and no entry, so it drops (fail closed).
    pub workload_prefixes: Vec<String>,
    pub routing: Option<RoutingConfig>,
    pub route_refresh_interval: Duration,
    pub status_prefix: Option<PathBuf>,
    pub global_sysctls: Vec<Sysctl>,
    pub interfaces: Option<InterfaceConfig>,
    /// DefaultEndpointToHostAction and natOutgoing, still in nftables (None: neither).
    pub host_nft: Option<HostNftConfig>,
}

pub struct BpfDriver {
    state: Recording,
    maps: BpfMaps,
    syncer: Syncer,
    dirty: bool,
    routing: Option<Routing>,
    route_refresh_interval: Duration,
    last_route_refresh: Instant,
    status_files: Option<crate::status_files::StatusFiles>,
    sys: ProcSys,
    global_sysctls: Option<Vec<Sysctl>>,
    interfaces: Option<WorkloadInterfaces>,
    in_sync_pending: bool,
    in_sync_reported: bool,
    host_nft: Option<HostNft>,
    workload_prefixes: Vec<String>,
    last_report: SyncReport,
    restore: (AdoptReport, LinkRestore),
    last_ct_gc: Instant,
    ct: CtGc,
    status_handle: BpfStatusHandle,
    /// Successful writes so far, and the one whose flow names were last published.
    writes: u64,
    names_published: Option<u64>,
    svc: SvcSyncer,
    svc_maps: SvcMaps,
    last_svc: SvcReport,
    /// BPFDataIfacePattern: the interfaces that get the Services program for traffic from
    /// outside (NodePorts), and whose IPv4 addresses NodePorts answer on.
    data_ifaces: regex::Regex,
    node_ips: Vec<std::net::Ipv4Addr>,
}

impl BpfDriver {
    /// Mounts bpffs if asked, loads the programs (the verifier runs here, so a kernel that
    /// cannot run them fails Felix's start with the reason) and pins the maps.
    pub fn new(cfg: BpfDriverConfig) -> Result<(BpfDriver, Recording), LoadError> {
        if let Some(m) = &cfg.bpffs_mount
            && ensure_bpffs(m)?
        {
            tracing::info!(dir = %m.display(), "mounted a BPF filesystem");
        }
        let mut maps = BpfMaps::load(&cfg.pin_dir)?;
        let mut syncer = Syncer::new(cfg.compile);
        let restored = maps.take_restored();
        let adopted = syncer.adopt(restored, &maps);
        let links = maps.link_restore().clone();
        // The service maps were pinned by the load above.
        let svc_maps = SvcMaps::open(&cfg.pin_dir).map_err(|e| LoadError::Map {
            map: "mgy_svc_*",
            reason: e.to_string(),
        })?;
        let mut svc = SvcSyncer::new();
        let (frontends, external, backends) = svc_maps.restored();
        svc.adopt(frontends, external, backends);
        tracing::info!(
            pin_dir = %cfg.pin_dir.display(),
            endpoints = adopted.endpoints,
            rules = adopted.rules,
            set_entries = adopted.set_entries,
            interfaces = links.interfaces,
            programs_replaced = links.programs_replaced,
            "eBPF policy programs loaded; what the previous run left stays enforced until in-sync"
        );
        let state = Recording::default();
        Ok((
            BpfDriver {
                state: state.clone(),
                maps,
                syncer,
                dirty: false,
                routing: cfg.routing.map(Routing::new),
                route_refresh_interval: cfg.route_refresh_interval,
                last_route_refresh: Instant::now(),
                status_files: cfg
                    .status_prefix
                    .as_deref()
                    .map(crate::status_files::StatusFiles::new),
                sys: ProcSys::default(),
                global_sysctls: Some(cfg.global_sysctls),
                interfaces: cfg.interfaces.map(WorkloadInterfaces::new),
                in_sync_pending: false,
                in_sync_reported: false,
                host_nft: cfg.host_nft.map(HostNft::new),
                workload_prefixes: cfg.workload_prefixes,
                last_report: SyncReport::default(),
                restore: (adopted, links),
                last_ct_gc: Instant::now(),
                ct: CtGc::default(),
                status_handle: BpfStatusHandle {
                    status: Arc::default(),
                    flows: BpfFlowSource {
                        pin_dir: cfg.pin_dir.clone(),
                        ..BpfFlowSource::default()
                    },
                },
                writes: 0,
                names_published: None,
                svc,
                svc_maps,
                last_svc: SvcReport::default(),
                data_ifaces: default_data_ifaces(),
                node_ips: Vec::new(),
            },
            state,
        ))
    }

    /// What the start took over from a previous run (map contents, pinned links).
    pub fn restore_report(&self) -> &(AdoptReport, LinkRestore) {
        &self.restore
    }

    /// The driver's state (cheap: no map is read).
    pub fn status(&self) -> BpfStatus {
        let (blocks, rules) = self.syncer.num_blocks();
        BpfStatus {
            pin_dir: self.maps.pin_dir().to_path_buf(),
            interfaces_attached: self.maps.attached().count(),
            endpoints: self.syncer.endpoints().count(),
            blocks,
            rules,
            set_entries: self.syncer.num_set_entries(),
            conntrack_deleted: self.ct.deleted,
            conntrack_entries: self.ct.live,
            restored_endpoints: self.restore.0.endpoints,
            restored_interfaces: self.restore.1.interfaces,
            programs_replaced: self.restore.1.programs_replaced,
            service_frontends: self.svc.num_frontends(),
            service_backends: self.svc.num_backends(),
        }
    }

    /// A shared view of [`BpfDriver::status`], refreshed after every write and
    /// housekeeping, for a status server on another thread (as `NftStatsHandle`).
    pub fn status_handle(&self) -> BpfStatusHandle {
        self.status_handle.clone()
    }

    fn publish_status(&mut self) {
        let st = self.status();
        *lock(&self.status_handle.status) = st;
        let flows = &self.status_handle.flows;
        if flows.wanted.load(Ordering::Relaxed) && self.names_published != Some(self.writes) {
            let mut names = self.syncer.flow_names();
            let mut cur = lock(&flows.names);
            names.keep_retired(&cur);
            *cur = Arc::new(names);
            self.names_published = Some(self.writes);
        }
    }

    /// Runs one conntrack sweep now (housekeeping does every [`CT_GC_INTERVAL`]).
    pub fn ct_gc(&mut self) -> CtGc {
        self.last_ct_gc = Instant::now();
        self.ct = self.maps.ct_gc(None);
        if self.ct.deleted > 0 {
            tracing::debug!(gc = ?self.ct, "eBPF conntrack sweep");
        }
        let stale = self.svc_maps.affinity_gc(&self.svc.groups());
        if stale > 0 {
            tracing::debug!(
                stale,
                "eBPF: ClientIP affinities of backends that left deleted"
            );
        }
        self.ct
    }

    /// What the last successful write did.
    pub fn last_report(&self) -> &SyncReport {
        &self.last_report
    }

    /// Sets BPFDataIfacePattern (a regular expression; Calico's default otherwise). The VXLAN
    /// device is always one.
    pub fn set_data_interfaces(&mut self, pattern: &str) -> Result<(), regex::Error> {
        self.data_ifaces = regex::Regex::new(pattern)?;
        self.dirty = true;
        Ok(())
    }

    /// The Services program on the data interfaces (attached where missing, detached where
    /// an interface left) and the node addresses NodePorts answer on.
    fn sync_data_interfaces(&mut self) -> Vec<std::net::Ipv4Addr> {
        let pattern = &self.data_ifaces;
        let ifaces =
            margay_bpf::services::data_interfaces(|n| n == "vxlan.calico" || pattern.is_match(n));
        let mut ips = Vec::new();
        for (name, ifindex, addrs) in &ifaces {
            if let Err(e) = self.maps.attach_host(name, *ifindex) {
                tracing::warn!(iface = %name, "eBPF Services program (NodePorts): {e}; retried");
                self.dirty = true;
            }
            ips.extend(addrs.iter().copied());
        }
        let gone: Vec<String> = self
            .maps
            .host_attached()
            .filter(|(n, _)| !ifaces.iter().any(|(m, _, _)| m == *n))
            .map(|(n, _)| n.clone())
            .collect();
        for n in gone {
            self.maps.detach_host(&n);
        }
        ips.sort();
        ips.dedup();
        ips
    }

    /// What the last successful write did to the service maps.
    pub fn last_service_report(&self) -> &SvcReport {
        &self.last_svc
    }

    /// The service NAT conntrack entries (tests, inspection).
    pub fn service_nat_entries(&self) -> Vec<margay_bpf::services::NatEntry> {
        self.svc_maps.nat_entries()
    }

    /// Interfaces with programs attached (name, ifindex).
    pub fn attached(&self) -> Vec<(String, u32)> {
        self.maps
            .attached()
            .map(|(n, i, _)| (n.clone(), i))
            .collect()
    }

    fn write(&mut self) -> Result<Vec<StatusUpdate>, DataplaneError> {
        if !self.state.lock().model.in_sync {
            return Ok(Vec::new());
        }
        let node_ips = self.sync_data_interfaces();
        let st = self.state.lock();
        let report =
            self.syncer
                .sync(&st.model, &mut self.maps)
                .map_err(|e| DataplaneError::Apply {
                    what: "eBPF maps".into(),
                    reason: e.to_string(),
                })?;
        self.syncer
            .guard_unknown(&self.workload_prefixes, &mut self.maps)
            .map_err(|e| DataplaneError::Apply {
                what: "eBPF programs on unknown workload interfaces".into(),
                reason: e.to_string(),
            })?;
        // Services: backends before the frontends that count them (see services.rs).
        let svc = self
            .svc
            .sync(&st.model.services, &node_ips, &mut self.svc_maps)
            .map_err(|e| DataplaneError::Apply {
                what: "eBPF service maps".into(),
                reason: e.to_string(),
            })?;
        if svc.refused != self.last_svc.refused {
            for r in &svc.refused {
                tracing::warn!("service port not programmed: {r}");
            }
        }
        self.last_svc = svc;
        self.node_ips = node_ips;
        // Programs a previous run attached that nothing claims now.
        let owned = self.syncer.owned_interfaces();
        self.maps.sweep(&owned);
        if let Some(h) = &mut self.host_nft {
            h.sync(&st.model).map_err(|e| DataplaneError::Apply {
                what: "nftables (endpoint-to-host, natOutgoing)".into(),
                reason: e.to_string(),
            })?;
        }
        if st.model.in_sync
            && let Some(files) = &mut self.status_files
            && let Err(e) = files.sync(&st.model)
        {
            tracing::warn!(dir = %files.dir().display(), "endpoint status files: {e}");
        }
        drop(st);
        // An endpoint whose interface is not there yet is retried at housekeeping.
        self.dirty = !report.missing_interfaces.is_empty();
        if !report.missing_interfaces.is_empty() {
            tracing::debug!(interfaces = ?report.missing_interfaces, "eBPF: workload interfaces do not exist yet");
        }
        self.last_report = report;
        self.writes += 1;
        let mut out = Vec::new();
        if self.in_sync_pending {
            self.in_sync_pending = false;
            if !self.in_sync_reported {
                self.in_sync_reported = true;
                out.push(StatusUpdate::DataplaneInSync);
            }
        }
        Ok(out)
    }

    /// Programs (and no entry) on workload interfaces no endpoint claims.
    fn guard_unknown(&mut self) -> Result<(), DataplaneError> {
        self.syncer
            .guard_unknown(&self.workload_prefixes, &mut self.maps)
            .map(drop)
            .map_err(|e| DataplaneError::Apply {
                what: "eBPF programs on unknown workload interfaces".into(),
                reason: e.to_string(),
            })
    }

    fn configure_kernel(&mut self) {
        let Some(settings) = self.global_sysctls.take() else {
            return;
        };
        let r = self.sys.apply(&settings);
        for (s, e) in &r.failed {
            tracing::error!(setting = %s.dotted(), "cannot set {}: {e} (workloads will not be reachable through this host)", s.value);
        }
    }

    fn write_interfaces(&mut self) {
        let Some(ifaces) = &mut self.interfaces else {
            return;
        };
        let now = Instant::now();
        if !ifaces.needs_apply(now) {
            return;
        }
        let r = ifaces.apply(&self.sys, now);
        for e in &r.errors {
            tracing::warn!("workload interface settings: {e}; will retry");
        }
    }

    fn write_routes(&mut self, force: bool) {
        let Some(routing) = &mut self.routing else {
            return;
        };
        if !force && !routing.needs_apply() {
            return;
        }
        match routing.apply() {
            Ok(report) => {
                for e in &report.errors {
                    tracing::warn!(error = %e, "routing: will retry");
                }
            }
            Err(e) => tracing::warn!(error = %e, "programming routes failed; will retry"),
        }
    }

    fn endpoint_statuses(&self, batch: &[Message]) -> Vec<StatusUpdate> {
        let mut out = Vec::new();
        for m in batch {
            match m {
                Message::WorkloadEndpointUpdate { id, endpoint } => {
                    let up = self
                        .maps
                        .attached()
                        .any(|(n, _, _)| *n == endpoint.interface);
                    let status = if self.last_report.refused_endpoints.contains(id) {
                        EndpointStatus::Error
                    } else if up {
                        EndpointStatus::Up
                    } else {
                        EndpointStatus::Down
                    };
                    out.push(StatusUpdate::WorkloadEndpoint {
                        id: id.clone(),
                        status,
                    });
                }
                Message::WorkloadEndpointRemove { id } => {
                    out.push(StatusUpdate::WorkloadEndpointRemoved { id: id.clone() })
                }
                _ => {}
            }
        }
        out
    }
}

impl DataplaneDriver for BpfDriver {
    fn name(&self) -> &'static str {
        "bpf"
    }

    fn apply(&mut self, batch: &[Message]) -> Result<Vec<StatusUpdate>, DataplaneError> {
        self.configure_kernel();
        {
            let mut st = self.state.lock();
            st.model.apply_all(batch)?;
            st.messages_applied += batch.len() as u64;
        }
        if batch.contains(&Message::InSync) {
            self.in_sync_pending = true;
        }
        if let Some(r) = &mut self.routing {
            r.on_messages(batch);
        }
        if let Some(i) = &mut self.interfaces {
            for m in batch {
                i.on_message(m);
            }
        }
        // Policy first: a new workload is reachable only once its programs are in.
        let written = if batch.is_empty() {
            Ok(Vec::new())
        } else {
            self.write()
        };
        if written.is_err() {
            self.dirty = true;
        }
        self.write_interfaces();
        self.write_routes(false);
        self.publish_status();
        let mut status = written?;
        status.extend(self.endpoint_statuses(batch));
        Ok(status)
    }

    fn housekeeping(&mut self) -> Result<Vec<StatusUpdate>, DataplaneError> {
        self.configure_kernel();
        let mut out = Vec::new();
        if self.dirty {
            match self.write() {
                Ok(s) => out.extend(s),
                Err(e) => {
                    self.dirty = true;
                    return Err(e);
                }
            }
        }
        // A new interface (a pod being wired) is closed within a housekeeping period.
        if self.in_sync_reported {
            self.guard_unknown()?;
            // A data interface or node address that came or went: NodePorts follow.
            let pattern = &self.data_ifaces;
            let ifaces = margay_bpf::services::data_interfaces(|n| {
                n == "vxlan.calico" || pattern.is_match(n)
            });
            let mut now_ips: Vec<std::net::Ipv4Addr> = ifaces
                .iter()
                .flat_map(|(_, _, a)| a.iter().copied())
                .collect();
            now_ips.sort();
            now_ips.dedup();
            let same_ifaces = ifaces.len() == self.maps.host_attached().count()
                && ifaces
                    .iter()
                    .all(|(n, i, _)| self.maps.host_attached().any(|(m, j)| m == n && j == *i));
            if now_ips != self.node_ips || !same_ifaces {
                out.extend(self.write()?);
            }
        }
        let now = Instant::now();
        if now.duration_since(self.last_ct_gc) >= CT_GC_INTERVAL {
            self.ct_gc();
        }
        let refresh = !self.route_refresh_interval.is_zero()
            && now.duration_since(self.last_route_refresh) >= self.route_refresh_interval;
        if refresh {
            self.last_route_refresh = now;
        }
        self.write_interfaces();
        self.write_routes(refresh);
        self.publish_status();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use margay_bpf::layout::{ACT_PASS, EV_NO_MATCH, EV_RULE, EV_TIER_END, HOOK_FROM_WL};
    use margay_calc::PolicyId;

    fn event(kind: u8, hook: usize, action: u8) -> FlowEvent {
        FlowEvent {
            ts_ns: 0,
            src: std::net::Ipv4Addr::new(10, 0, 0, 1),
            dst: std::net::Ipv4Addr::new(10, 0, 0, 2),
            sport: 40000,
            dport: 80,
            proto: 6,
            hook: hook as u8,
            kind,
            action,
            ifindex: 4,
            slot: 7,
            idx: 1,
            rule_index: 2,
            step: 3,
            len: 60,
            icmp_type: 0,
            icmp_code: 0,
        }
    }

    /// Events name rules exactly as the nftables prefixes do: policy kind, namespace, name,
    /// rule index (the policy's, not the block's), direction, tier ends and no profile.
    #[test]
    fn events_resolve_to_the_nft_prefixes_rules() {
        let np = PolicyId {
            tier: "security".into(),
            namespace: "prod".into(),
            name: "db".into(),
        };
        let mut names = FlowNames::default();
        names
            .slots
            .insert(7, Arc::new(BlockKey::Policy(np, HOOK_TO_WL)));
        names
            .deny_steps
            .insert((4, HOOK_FROM_WL as u8, 3), Arc::from("security"));
        let resolve = |e: FlowEvent| BpfFlowSource::resolve(&names, &e);
        let (r, tier) = resolve(event(EV_RULE, HOOK_TO_WL, ACT_ALLOW)).expect("a policy rule");
        assert_eq!(r.full_prefix(), "API2|np/prod/db");
        assert_eq!(tier, "security");
        let (r, _) = resolve(event(EV_RULE, HOOK_TO_WL, ACT_DENY)).expect("a policy rule");
        assert_eq!(r.full_prefix(), "DPI2|np/prod/db");
        let (r, tier) =
            resolve(event(EV_TIER_END, HOOK_FROM_WL, ACT_DENY)).expect("the tier's end");
        assert_eq!(
            (r.full_prefix().as_str(), tier.as_str()),
            ("DPE|security", "security")
        );
        let (r, _) = resolve(event(EV_NO_MATCH, HOOK_TO_WL, ACT_DENY)).expect("no profile");
        assert_eq!(r.full_prefix(), "DRI");
        // Pass and Log decide nothing; an unknown slot names nothing.
        assert_eq!(resolve(event(EV_RULE, HOOK_TO_WL, ACT_PASS)), None);
        assert_eq!(resolve(event(EV_RULE, HOOK_TO_WL, ACT_LOG)), None);
        let mut other = event(EV_RULE, HOOK_TO_WL, ACT_ALLOW);
        other.slot = 8;
        assert_eq!(resolve(other), None);
        // A Log rule's event is a calico-packet line naming the rule.
        let line = BpfFlowSource::log_line(&names, &event(EV_RULE, HOOK_TO_WL, ACT_LOG))
            .expect("a log line");
        assert!(line.starts_with("calico-packet: "), "{line}");
        assert!(line.contains("np/prod/db ingress rule 2"), "{line}");
        assert!(
            line.contains("SRC=10.0.0.1 DST=10.0.0.2 PROTO=6 SPT=40000 DPT=80"),
            "{line}"
        );
        assert_eq!(
            BpfFlowSource::log_line(&names, &event(EV_RULE, HOOK_TO_WL, ACT_ALLOW)),
            None
        );
    }
}
