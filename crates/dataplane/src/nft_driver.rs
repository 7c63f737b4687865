//! The nftables part of the Linux dataplane: keeps `inet margay` equal to what the messages
//! describe.
//!
//! Nothing touches the kernel before `InSync`. The first write reads the table back and
//! changes only what differs (a restarted Felix leaves established flows and unchanged chains
//! alone); later writes diff against what was last written. Every write is one atomic
//! transaction. A periodic refresh reads the table back again and repairs drift (a rule or
//! element someone removed), counting the repairs.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use margay_calc::{DataplaneModel, Message};
use serde::Serialize;

use crate::nft::diff::{Plan, plan};
use crate::nft::{
    EndpointChains, Fingerprint, NftConfig, NftError, NftRunner, Renderer, TxStats, fingerprint,
};
use crate::{DataplaneError, EndpointStatus, StatusUpdate};

#[derive(Debug, Clone)]
pub struct NftDriverConfig {
    pub nft: NftConfig,
    pub runner: NftRunner,
    /// How often the table is read back to repair drift (0: never).
    pub refresh_interval: Duration,
    /// NFTablesFlowTableOffload `All`: offload established flows to a flowtable holding the
    /// workload interfaces and these host interfaces (NFTablesFlowTableDataIfacePattern),
    /// if the kernel has flowtables (probed at the first write; without them, a warning and
    /// no offload, as in Calico).
    pub flowtable_extra_devices: Option<Vec<String>>,
}

/// The flowtable as the driver keeps it.
#[derive(Debug)]
struct Flowtable {
    extra: Vec<String>,
    /// The kernel has flowtables (None: not probed yet).
    supported: Option<bool>,
    /// The flowtable exists in the table.
    declared: bool,
    /// Interfaces added to it.
    devices: BTreeSet<String>,
}

/// Counters and sizes for metrics and the status API.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NftStats {
    pub transactions: u64,
    pub failed_transactions: u64,
    /// Refreshes that found drift and repaired it.
    pub repairs: u64,
    pub refreshes: u64,
    pub last_apply_seconds: f64,
    /// The last apply's phases: render, read-back (when needed), diff, nft.
    pub last_render_seconds: f64,
    pub last_observe_seconds: f64,
    pub last_diff_seconds: f64,
    pub last_nft_seconds: f64,
    pub last_error: Option<String>,
    pub chains: usize,
    pub rules: usize,
    pub elements: usize,
    pub endpoints: Vec<EndpointChains>,
    /// IP-set (nft set) name → element count.
    pub set_sizes: Vec<(String, usize)>,
    /// NFTablesFlowTableOffload: whether established flows are offloaded, and why not.
    pub flow_offload: Option<String>,
}

/// Shared view of the driver's stats.
#[derive(Debug, Clone, Default)]
pub struct NftStatsHandle(Arc<Mutex<NftStats>>);

impl NftStatsHandle {
    pub fn lock(&self) -> MutexGuard<'_, NftStats> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Keeps the table equal to a [`DataplaneModel`] owned by the caller.
pub struct NftDriver {
    cfg: NftDriverConfig,
    renderer: Renderer,
    /// What the kernel holds, if known (None: read it back before the next write).
    programmed: Option<Fingerprint>,
    last_refresh: Instant,
    stats: NftStatsHandle,
    dirty: bool,
    flowtable: Option<Flowtable>,
}

/// Interface names in the network namespace `runner` works in.
fn interfaces(runner: &NftRunner) -> BTreeSet<String> {
    let text = match &runner.netns {
        Some(ns) => std::process::Command::new("ip")
            .args(["-n", ns, "-o", "link", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .map(|n| n + ":")
            .collect::<Vec<_>>()
            .join("\n"),
        None => std::fs::read_to_string("/proc/net/dev").unwrap_or_default(),
    };
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(n, _)| n.trim().to_string())
        .filter(|n| !n.is_empty() && !n.contains(' '))
        .collect()
}

impl NftDriver {
    pub fn new(cfg: NftDriverConfig) -> (NftDriver, NftStatsHandle) {
        let stats = NftStatsHandle::default();
        let flowtable = cfg.flowtable_extra_devices.clone().map(|extra| Flowtable {
            extra,
            supported: None,
            declared: false,
            devices: BTreeSet::new(),
        });
        (
            NftDriver {
                cfg,
                renderer: Renderer::new(),
                programmed: None,
                last_refresh: Instant::now(),
                stats: stats.clone(),
                dirty: false,
                flowtable,
            },
            stats,
        )
    }

    pub fn config_mut(&mut self) -> &mut NftConfig {
        self.dirty = true;
        &mut self.cfg.nft
    }

    /// The model changed: the next [`NftDriver::sync`] renders it.
    pub fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Writes what changed, if the model is in sync. Returns what the transaction did.
    pub fn sync(&mut self, model: &DataplaneModel) -> Result<TxStats, DataplaneError> {
        if !model.in_sync || !self.dirty {
            return Ok(TxStats::default());
        }
        self.probe_flowtable();
        let started = Instant::now();
        let (desired, summaries) = self.renderer.render(model, &self.cfg.nft);
        let rendered = started.elapsed();
        let from = match self.programmed.take() {
            Some(fp) => fp,
            None => self.observe()?,
        };
        let observed = started.elapsed();
        let plan = plan(&self.cfg.nft.table, &from, &desired);
        let tx = plan.stats;
        let wrote = !plan.is_empty();
        let diffed = started.elapsed();
        let result = self.execute(&plan);
        let mut stats = self.stats.lock();
        stats.last_render_seconds = rendered.as_secs_f64();
        stats.last_observe_seconds = (observed - rendered).as_secs_f64();
        stats.last_diff_seconds = (diffed - observed).as_secs_f64();
        stats.last_nft_seconds = started.elapsed().saturating_sub(diffed).as_secs_f64();
        match result {
            Ok(()) => {
                drop(stats);
                self.add_flowtable_devices(model);
                if !desired.services.stale_udp.is_empty() {
                    let (ran, failure) = crate::conntrack::delete(
                        &desired.services.stale_udp,
                        self.cfg.runner.netns.as_deref(),
                    );
                    tracing::debug!(ran, "deleted stale UDP service flows");
                    if let Some(f) = failure {
                        tracing::warn!("clearing stale UDP service flows: {f}");
                    }
                }
                let mut stats = self.stats.lock();
                self.programmed = Some(Fingerprint::of(&desired));
                self.dirty = false;
                if wrote {
                    stats.transactions += 1;
                }
                stats.last_apply_seconds = started.elapsed().as_secs_f64();
                stats.last_error = None;
                stats.chains = desired.num_chains();
                stats.rules = desired.num_rules();
                stats.elements = desired.num_elements();
                stats.endpoints = summaries;
                stats.set_sizes = desired
                    .sets
                    .iter()
                    .map(|(k, s)| (k.clone(), s.elements.len()))
                    .collect();
                Ok(tx)
            }
            Err(e) => {
                // The failing step was rolled back (earlier ones stand): read the kernel again
                // before the next write.
                self.programmed = None;
                if let Some(ft) = &mut self.flowtable {
                    ft.declared = false;
                }
                stats.failed_transactions += 1;
                stats.last_error = Some(e.to_string());
                tracing::warn!("nftables update failed (will retry): {e}");
                Err(DataplaneError::Apply {
                    what: "the nftables transaction".into(),
                    reason: e.to_string(),
                })
            }
        }
    }

    /// Probes once whether the kernel has flowtables, when offload is asked for; without
    /// them, says so once and renders no offload rule (Calico's behaviour).
    fn probe_flowtable(&mut self) {
        let Some(ft) = &mut self.flowtable else {
            return;
        };
        if ft.supported.is_some() {
            return;
        }
        let probe_table = format!("{}-ftprobe", self.cfg.nft.table);
        let script = format!(
            "add table inet {probe_table}\n{}\ndelete table inet {probe_table}\n",
            crate::nft::render::flowtable_decl(&probe_table, &[])
        );
        let why = match self.cfg.runner.apply(&script) {
            Ok(()) => None,
            Err(e) => {
                // Leave nothing behind if the delete did not run.
                let _ = self
                    .cfg
                    .runner
                    .apply(&format!("delete table inet {probe_table}\n"));
                Some(e.to_string())
            }
        };
        ft.supported = Some(why.is_none());
        self.cfg.nft.flow_offload = why.is_none();
        let mut stats = self.stats.lock();
        match why {
            None => {
                tracing::info!(
                    "NFTablesFlowTableOffload: established flows are offloaded to the flowtable"
                );
                stats.flow_offload = Some("enabled".into());
            }
            Some(e) => {
                tracing::warn!(
                    "NFTablesFlowTableOffload is All but the kernel does not support nftables flowtables (nf_flow_table unavailable: {e}); continuing without offload"
                );
                stats.flow_offload = Some(format!("unavailable: {e}"));
            }
        }
    }

    /// Adds workload interfaces (and the data interfaces) that exist to the flowtable; the
    /// kernel drops an interface from it when the interface goes.
    fn add_flowtable_devices(&mut self, model: &DataplaneModel) {
        let Some(ft) = &mut self.flowtable else {
            return;
        };
        if ft.supported != Some(true) || !ft.declared {
            return;
        }
        let present = interfaces(&self.cfg.runner);
        let wanted: BTreeSet<String> = model
            .workload_endpoints
            .values()
            .map(|e| e.interface.clone())
            .chain(ft.extra.iter().cloned())
            .filter(|i| present.contains(i))
            .collect();
        ft.devices.retain(|d| wanted.contains(d));
        let new: Vec<String> = wanted.difference(&ft.devices).cloned().collect();
        if new.is_empty() {
            return;
        }
        let text = crate::nft::render::flowtable_decl(&self.cfg.nft.table, &new);
        match self.cfg.runner.apply(&format!("{text}\n")) {
            Ok(()) => ft.devices.extend(new),
            Err(e) => {
                tracing::warn!(devices = ?new, "adding interfaces to the flowtable failed (will retry): {e}")
            }
        }
    }

    /// Carries out a plan: nft for declarations and chains, netlink for elements.
    fn execute(&mut self, plan: &Plan) -> Result<(), String> {
        let table = self.cfg.nft.table.clone();
        let table = &table;
        let runner = self.cfg.runner.clone();
        let runner = &runner;
        // The offload rule refers to the flowtable: it must exist before any chain does.
        let offload = self.cfg.nft.flow_offload;
        let flowtable_decl = format!("{}\n", crate::nft::render::flowtable_decl(table, &[]));
        if let Some(text) = &plan.full_replacement {
            let text = if offload {
                let add_table = format!("add table inet {table}\n");
                text.replacen(&add_table, &format!("{add_table}{flowtable_decl}"), 1)
            } else {
                text.clone()
            };
            runner.apply(&text).map_err(|e| e.to_string())?;
            if let Some(ft) = &mut self.flowtable {
                ft.declared = offload;
                ft.devices.clear();
            }
            return Ok(());
        }
        if offload && self.flowtable.as_ref().is_some_and(|f| !f.declared) {
            runner
                .apply(&format!("add table inet {table}\n{flowtable_decl}"))
                .map_err(|e| e.to_string())?;
            if let Some(ft) = &mut self.flowtable {
                ft.declared = true;
            }
        }
        if !plan.declare.is_empty() {
            runner.apply(&plan.declare).map_err(|e| e.to_string())?;
        }
        runner
            .apply_elements(table, &plan.elements_before)
            .map_err(|e| e.to_string())?;
        if !plan.chains.is_empty() {
            runner.apply(&plan.chains).map_err(|e| e.to_string())?;
        }
        runner
            .apply_elements(table, &plan.elements_after)
            .map_err(|e| e.to_string())?;
        if !plan.cleanup.is_empty() {
            runner.apply(&plan.cleanup).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn observe(&self) -> Result<Fingerprint, DataplaneError> {
        let map = |e: NftError| DataplaneError::Apply {
            what: "reading the nftables table".into(),
            reason: e.to_string(),
        };
        match self
            .cfg
            .runner
            .list_table(&self.cfg.nft.table)
            .map_err(map)?
        {
            Some(json) => fingerprint(&json).map_err(map),
            None => Ok(Fingerprint::default()),
        }
    }

    /// Reads the table back and repairs any drift, when the refresh interval has passed.
    pub fn refresh_if_due(
        &mut self,
        model: &DataplaneModel,
        now: Instant,
    ) -> Result<bool, DataplaneError> {
        if self.cfg.refresh_interval.is_zero()
            || !model.in_sync
            || now.duration_since(self.last_refresh) < self.cfg.refresh_interval
        {
            return Ok(false);
        }
        self.last_refresh = now;
        self.refresh(model)
    }

    /// Reads the table back now and repairs drift. Returns whether anything was repaired.
    pub fn refresh(&mut self, model: &DataplaneModel) -> Result<bool, DataplaneError> {
        self.programmed = None;
        if let Some(ft) = &mut self.flowtable {
            // Declared again (a no-op when it is there) in case someone removed it.
            ft.declared = false;
        }
        self.dirty = true;
        let tx = self.sync(model)?;
        let mut stats = self.stats.lock();
        stats.refreshes += 1;
        let repaired = !tx.is_empty();
        if repaired {
            stats.repairs += 1;
            tracing::warn!(?tx, "nftables drift repaired");
        }
        Ok(repaired)
    }

    /// Endpoint status after a successful sync: every programmed endpoint is up.
    pub fn endpoint_statuses(&self, batch: &[Message]) -> Vec<StatusUpdate> {
        let mut out = Vec::new();
        for m in batch {
            match m {
                Message::WorkloadEndpointUpdate { id, .. } => {
                    out.push(StatusUpdate::WorkloadEndpoint {
                        id: id.clone(),
                        status: if self.programmed.is_some() {
                            EndpointStatus::Up
                        } else {
                            EndpointStatus::Down
                        },
                    })
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
