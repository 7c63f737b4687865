//! Routing as one piece for the Linux driver: the calculation graph's messages in, the VXLAN
//! device, its neighbours and margay's routes out.
//!
//! ```no_run
//! # use margay_dataplane::linux::routing::{Routing, RoutingConfig};
//! # fn batch() -> Vec<margay_calc::Message> { vec![] }
//! let mut routing = Routing::new(RoutingConfig::new("node-1"));
//! routing.on_messages(&batch());
//! if routing.needs_apply() {
//!     let report = routing.apply()?;
//!     println!("{} routes added", report.routes.added);
//! }
//! # Ok::<(), margay_dataplane::linux::routes::RouteError>(())
//! ```
//!
//! Nothing touches the kernel before the calculation graph's `InSync` (Calico's rule: the
//! dataplane's mark and sweep of what it owns needs the complete state). Order of one apply:
//! VXLAN device and neighbours (IPv4, then IPv6), then routes — routes through the VXLAN
//! device need it to exist.

use margay_api::net::Cidr;
use margay_calc::Message;

use super::netlink::Netlink;
use super::routes::{
    DEFAULT_WORKLOAD_ROUTE_PRIORITY, RouteContext, RouteError, RouteManager, RouteReport,
    RoutingState, SkipReason,
};
use super::vxlan::{VxlanConfig, VxlanManager, VxlanReport};

/// Routing settings (Felix's configuration, where it has them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingConfig {
    /// This node's name (FelixHostname).
    pub hostname: String,
    pub vxlan: VxlanConfig,
    pub vxlan_v6: VxlanConfig,
    /// Manage IPv6 routes and the IPv6 VXLAN device too (Ipv6Support).
    pub ipv6: bool,
    /// Metric of local workload routes (IPv4NormalRoutePriority).
    pub workload_route_priority: u32,
    /// Program the remote blocks of no-encap pools (ProgramClusterRoutes Enabled or
    /// EnabledNoEncapOnly). Calico's default leaves them to BIRD.
    pub program_noencap_routes: bool,
    /// DeviceRouteSourceAddress: `src` of IPv4 routes through an interface.
    pub source_v4: Option<std::net::IpAddr>,
    /// DeviceRouteSourceAddressIPv6: `src` of IPv6 routes through an interface.
    pub source_v6: Option<std::net::IpAddr>,
}

impl RoutingConfig {
    /// Calico's defaults, IPv4 only (no-encap cluster routes left to BIRD).
    pub fn new(hostname: impl Into<String>) -> RoutingConfig {
        RoutingConfig {
            hostname: hostname.into(),
            vxlan: VxlanConfig::v4(),
            vxlan_v6: VxlanConfig::v6(),
            ipv6: false,
            workload_route_priority: DEFAULT_WORKLOAD_ROUTE_PRIORITY,
            program_noencap_routes: false,
            source_v4: None,
            source_v6: None,
        }
    }
}

/// What one [`Routing::apply`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutingReport {
    /// False before `InSync`: nothing was done.
    pub applied: bool,
    pub vxlan: VxlanReport,
    pub vxlan_v6: Option<VxlanReport>,
    pub routes: RouteReport,
    /// Routes the calculation graph sent that have no kernel route, and why.
    pub skipped: Vec<(Cidr, SkipReason)>,
    /// VXLAN failures (the routes were still applied; retried on the next apply).
    pub errors: Vec<String>,
}

impl RoutingReport {
    pub fn needs_retry(&self) -> bool {
        !self.errors.is_empty()
            || self.routes.needs_retry()
            || self.vxlan.needs_retry()
            || self.vxlan_v6.as_ref().is_some_and(VxlanReport::needs_retry)
    }
}

/// The routing half of the Linux dataplane.
#[derive(Debug)]
pub struct Routing {
    cfg: RoutingConfig,
    state: RoutingState,
    vxlan: VxlanManager,
    vxlan_v6: VxlanManager,
    routes: RouteManager,
    ipip_warned: bool,
    dirty: bool,
    retry: bool,
}

impl Routing {
    pub fn new(cfg: RoutingConfig) -> Routing {
        Routing {
            state: RoutingState::new(cfg.hostname.clone()),
            vxlan: VxlanManager::new(cfg.vxlan.clone()),
            vxlan_v6: VxlanManager::new(cfg.vxlan_v6.clone()),
            routes: RouteManager::new(cfg.ipv6),
            cfg,
            ipip_warned: false,
            dirty: true,
            retry: false,
        }
    }

    /// Takes one message (cheap: no kernel I/O).
    pub fn on_message(&mut self, m: &Message) {
        if self.state.on_message(m) {
            self.dirty = true;
        }
    }

    pub fn on_messages(&mut self, batch: &[Message]) {
        for m in batch {
            self.on_message(m);
        }
    }

    pub fn state(&self) -> &RoutingState {
        &self.state
    }

    /// In sync, and something changed since the last apply or the last apply left work
    /// (an interface that did not exist yet, a refused change). A periodic apply also
    /// repairs drift.
    pub fn needs_apply(&self) -> bool {
        self.state.in_sync() && (self.dirty || self.retry)
    }

    /// Programs the kernel (in the calling thread's network namespace). Before `InSync`
    /// it does nothing. Fails only when routes cannot be read or written at all.
    pub fn apply(&mut self) -> Result<RoutingReport, RouteError> {
        let mut report = RoutingReport::default();
        if !self.state.in_sync() {
            return Ok(report);
        }
        report.applied = true;
        if self.state.ipip_enabled() && !self.ipip_warned {
            tracing::warn!(
                "an IP pool uses IPIP, which this dataplane does not support (the kernel has no IPIP); its routes are not installed — use VXLAN"
            );
            self.ipip_warned = true;
        }
        let me = self.cfg.hostname.clone();
        let vteps = self.state.vteps();
        match self.vxlan.apply(self.state.vxlan_enabled(), &me, &vteps) {
            Ok(r) => report.vxlan = r,
            Err(e) => report.errors.push(e.to_string()),
        }
        if self.cfg.ipv6 {
            match self
                .vxlan_v6
                .apply(self.state.vxlan_v6_enabled(), &me, &vteps)
            {
                Ok(r) => report.vxlan_v6 = Some(r),
                Err(e) => report.errors.push(e.to_string()),
            }
        }
        for e in &report.errors {
            tracing::warn!(error = %e, "VXLAN not configured; retrying on the next apply");
        }

        // The parent interfaces (for no-encap and same-subnet routes).
        let mut parent = report.vxlan.parent.clone();
        let mut parent_v6 = report.vxlan_v6.as_ref().and_then(|r| r.parent.clone());
        if parent.is_none() || (self.cfg.ipv6 && parent_v6.is_none()) {
            let holder = |ip: Option<std::net::IpAddr>| -> Option<String> {
                let ip = ip?;
                let mut nl = Netlink::open().ok()?;
                nl.interface_holding(ip).ok().flatten().map(|l| l.name)
            };
            if parent.is_none() {
                parent = holder(self.state.my_ipv4());
            }
            if self.cfg.ipv6 && parent_v6.is_none() {
                parent_v6 = holder(self.state.my_ipv6());
            }
        }
        let ctx = RouteContext {
            me: &me,
            pools: &[],
            vxlan_device: &self.cfg.vxlan.device,
            vxlan_device_v6: &self.cfg.vxlan_v6.device,
            parent_device: parent.as_deref(),
            parent_device_v6: parent_v6.as_deref(),
            workload_priority: self.cfg.workload_route_priority,
            program_noencap: self.cfg.program_noencap_routes,
            source_v4: self.cfg.source_v4,
            source_v6: self.cfg.source_v6,
        };
        let desired = self.state.desired_routes(&ctx);
        report.skipped = desired.skipped;
        report.routes = self
            .routes
            .apply(&desired.routes, &self.state.local_endpoints())?;
        self.dirty = false;
        self.retry = report.needs_retry();
        Ok(report)
    }
}
