//! The Linux dataplane driver: nftables policy, routes and VXLAN kept equal to the calculation
//! graph's messages.
//!
//! Each batch goes into the model first (no kernel access, contract checked); the kernel is
//! written once per batch, and only after `InSync`. A failed write is retried by
//! [`DataplaneDriver::housekeeping`], which also runs the periodic drift refresh.
//!
//! The one exception is the host's global forwarding settings (IPForwarding), which, as in
//! Calico's Felix, are made once when the driver starts (its first batch), before the
//! datastore is in sync: they do not depend on it. The workload interfaces' settings follow
//! their endpoints after `InSync` ([`crate::linux::interfaces`]).

use std::time::{Duration, Instant};

use margay_calc::Message;

use crate::linux::interfaces::{InterfaceConfig, WorkloadInterfaces};
use crate::linux::routing::{Routing, RoutingConfig};
use crate::linux::sysctl::{ProcSys, Sysctl};
use crate::nft_driver::{NftDriver, NftDriverConfig, NftStatsHandle};
use crate::{DataplaneDriver, DataplaneError, Recording, StatusUpdate};

#[derive(Debug, Clone)]
pub struct LinuxDriverConfig {
    pub nft: NftDriverConfig,
    /// Routes and VXLAN (None: policy only).
    pub routing: Option<RoutingConfig>,
    /// How often routes, VXLAN device and neighbours are re-applied to repair drift (0: never).
    pub route_refresh_interval: Duration,
    /// EndpointStatusPathPrefix: per-endpoint status files under `<prefix>/endpoint-status`
    /// once the endpoint's policy is in (None: no files).
    pub status_prefix: Option<std::path::PathBuf>,
    /// Global settings made once at start (`linux::sysctl::global_sysctls`: IPForwarding).
    pub global_sysctls: Vec<Sysctl>,
    /// The workload interfaces' settings (None: left alone).
    pub interfaces: Option<InterfaceConfig>,
}

pub struct LinuxDriver {
    state: Recording,
    nft: NftDriver,
    routing: Option<Routing>,
    route_refresh_interval: Duration,
    last_route_refresh: Instant,
    status_files: Option<crate::status_files::StatusFiles>,
    sys: ProcSys,
    /// Global settings still to make (taken on the first batch).
    global_sysctls: Option<Vec<Sysctl>>,
    interfaces: Option<WorkloadInterfaces>,
    /// `InSync` arrived but the kernel write it needs has not succeeded yet.
    in_sync_pending: bool,
    in_sync_reported: bool,
}

impl LinuxDriver {
    pub fn new(cfg: LinuxDriverConfig) -> (LinuxDriver, Recording, NftStatsHandle) {
        let state = Recording::default();
        let (nft, stats) = NftDriver::new(cfg.nft);
        (
            LinuxDriver {
                state: state.clone(),
                nft,
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
            },
            state,
            stats,
        )
    }

    fn write(&mut self) -> Result<Vec<StatusUpdate>, DataplaneError> {
        let st = self.state.lock();
        self.nft.sync(&st.model)?;
        // Policy is in: tell waiting CNI calls (best effort; retried on the next write).
        if st.model.in_sync
            && let Some(files) = &mut self.status_files
            && let Err(e) = files.sync(&st.model)
        {
            tracing::warn!(dir = %files.dir().display(), "endpoint status files: {e}");
        }
        drop(st);
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

    /// The global settings, once (Calico's `configureKernel`): a failure is logged, not
    /// retried, as in Calico.
    fn configure_kernel(&mut self) {
        let Some(settings) = self.global_sysctls.take() else {
            return;
        };
        if settings.is_empty() {
            tracing::info!("IPForwarding is Disabled: leaving the forwarding sysctls untouched");
            return;
        }
        let r = self.sys.apply(&settings);
        for s in &r.written {
            tracing::info!(setting = %s.dotted(), value = %s.value, "turned on forwarding for workloads");
        }
        for (s, e) in &r.failed {
            tracing::error!(setting = %s.dotted(), "cannot set {}: {e} (workloads will not be reachable through this host)", s.value);
        }
    }

    /// Configures workload interfaces that are due (new, retried, or the periodic check).
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
        if !r.missing.is_empty() {
            tracing::debug!(interfaces = ?r.missing, "workload interfaces do not exist yet; their settings wait");
        }
    }

    /// Programs routes and VXLAN when something changed (or `force`, for the refresh).
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
                if !report.routes.missing_interfaces.is_empty() {
                    tracing::debug!(
                        interfaces = ?report.routes.missing_interfaces,
                        "routes wait for workload interfaces that do not exist yet"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "programming routes failed; will retry"),
        }
    }
}

impl DataplaneDriver for LinuxDriver {
    fn name(&self) -> &'static str {
        "linux"
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
        if !batch.is_empty() {
            self.nft.mark_dirty();
        }
        if let Some(r) = &mut self.routing {
            r.on_messages(batch);
        }
        if let Some(i) = &mut self.interfaces {
            for m in batch {
                i.on_message(m);
            }
        }
        // Policy first, then interfaces and routes: a new workload is reachable only once its
        // policy is in.
        let written = self.write();
        self.write_interfaces();
        self.write_routes(false);
        let mut status = written?;
        status.extend(self.nft.endpoint_statuses(batch));
        Ok(status)
    }

    fn housekeeping(&mut self) -> Result<Vec<StatusUpdate>, DataplaneError> {
        self.configure_kernel();
        let mut out = Vec::new();
        if self.nft.is_dirty() {
            out.extend(self.write()?);
        }
        let now = Instant::now();
        let refresh = !self.route_refresh_interval.is_zero()
            && now.duration_since(self.last_route_refresh) >= self.route_refresh_interval;
        if refresh {
            self.last_route_refresh = now;
        }
        self.write_interfaces();
        self.write_routes(refresh);
        let st = self.state.lock();
        self.nft.refresh_if_due(&st.model, Instant::now())?;
        Ok(out)
    }
}
