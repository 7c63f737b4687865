//! The host-side interfaces of local workloads: their `/proc/sys` settings, kept as Calico's
//! endpoint manager keeps them.
//!
//! Every local workload's interface gets [`workload_sysctls`] once it exists (a workload's
//! endpoint often arrives before the CNI plugin has created the interface, or the other way
//! round: an interface not there yet is retried on every housekeeping tick). Every
//! InterfaceRefreshInterval all of them are checked again, and settings someone changed are
//! put back (counted as repairs). Nothing is written before `InSync`.
//!
//! Which interfaces need work ([`WorkloadInterfaces::due`]) is decided without touching the
//! kernel; [`WorkloadInterfaces::apply`] does the reads and writes through [`ProcSys`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use margay_calc::{Message, WorkloadEndpointId};

use super::sysctl::{ProcSys, Sysctl, workload_rp_filter, workload_sysctls};

/// Settings of the interface manager (Felix's configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceConfig {
    /// Ipv6Support: also the IPv6 proxy NDP and forwarding settings.
    pub ipv6: bool,
    /// The host's `net.ipv4.conf.default.rp_filter`, read at start.
    pub default_rp_filter: String,
    /// InterfaceRefreshInterval: how often every workload interface is checked again
    /// (0: only when its endpoint changes).
    pub refresh_interval: Duration,
}

/// What one [`WorkloadInterfaces::apply`] did.
#[derive(Debug, Default)]
pub struct InterfaceReport {
    /// Interfaces configured (all settings in place).
    pub configured: usize,
    /// Settings written (values that differed).
    pub written: usize,
    /// Interfaces that do not exist (yet): retried later.
    pub missing: Vec<String>,
    /// Settings that failed, with the reason.
    pub errors: Vec<String>,
}

/// The desired settings of every local workload interface and which still need applying.
#[derive(Debug)]
pub struct WorkloadInterfaces {
    cfg: InterfaceConfig,
    /// Endpoint → (interface, may send from other addresses).
    endpoints: BTreeMap<WorkloadEndpointId, (String, bool)>,
    /// Interfaces whose settings are not known to be in place.
    pending: BTreeSet<String>,
    in_sync: bool,
    last_refresh: Instant,
    /// Settings found changed by someone else and put back (refreshes).
    pub repairs: u64,
}

impl WorkloadInterfaces {
    pub fn new(cfg: InterfaceConfig) -> WorkloadInterfaces {
        WorkloadInterfaces {
            cfg,
            endpoints: BTreeMap::new(),
            pending: BTreeSet::new(),
            in_sync: false,
            last_refresh: Instant::now(),
            repairs: 0,
        }
    }

    /// Takes one message (no kernel access).
    pub fn on_message(&mut self, m: &Message) {
        match m {
            Message::WorkloadEndpointUpdate { id, endpoint } => {
                let entry = (
                    endpoint.interface.clone(),
                    !endpoint.allow_spoofed_source_prefixes.is_empty(),
                );
                if endpoint.interface.is_empty() {
                    self.endpoints.remove(id);
                    return;
                }
                if self.endpoints.get(id) != Some(&entry) {
                    self.pending.insert(entry.0.clone());
                    self.endpoints.insert(id.clone(), entry);
                }
            }
            Message::WorkloadEndpointRemove { id } => {
                if let Some((iface, _)) = self.endpoints.remove(id) {
                    self.pending.remove(&iface);
                }
            }
            Message::InSync => self.in_sync = true,
            _ => {}
        }
    }

    /// The settings one interface should have (the first endpoint naming it decides whether
    /// it may spoof; two endpoints on one interface is a misconfiguration either way).
    pub fn desired(&self, iface: &str) -> Option<Vec<Sysctl>> {
        let spoof = self
            .endpoints
            .values()
            .filter(|(i, _)| i == iface)
            .any(|(_, s)| *s);
        self.endpoints.values().any(|(i, _)| i == iface).then(|| {
            workload_sysctls(
                iface,
                self.cfg.ipv6,
                &workload_rp_filter(spoof, &self.cfg.default_rp_filter),
            )
        })
    }

    /// Interfaces to configure now: the pending ones, or every known one when the refresh
    /// interval has passed (which also restarts it). Empty before `InSync`.
    pub fn due(&mut self, now: Instant) -> (Vec<String>, bool) {
        if !self.in_sync {
            return (Vec::new(), false);
        }
        let refresh = !self.cfg.refresh_interval.is_zero()
            && now.duration_since(self.last_refresh) >= self.cfg.refresh_interval;
        if refresh {
            self.last_refresh = now;
            let all: BTreeSet<String> = self.endpoints.values().map(|(i, _)| i.clone()).collect();
            return (all.into_iter().collect(), true);
        }
        (self.pending.iter().cloned().collect(), false)
    }

    /// Whether [`WorkloadInterfaces::apply`] has anything to do.
    pub fn needs_apply(&self, now: Instant) -> bool {
        self.in_sync
            && (!self.pending.is_empty()
                || (!self.cfg.refresh_interval.is_zero()
                    && now.duration_since(self.last_refresh) >= self.cfg.refresh_interval))
    }

    /// Configures the interfaces that are due, in the calling thread's network namespace.
    pub fn apply(&mut self, sys: &ProcSys, now: Instant) -> InterfaceReport {
        let mut report = InterfaceReport::default();
        let (due, refresh) = self.due(now);
        for iface in due {
            let Some(want) = self.desired(&iface) else {
                self.pending.remove(&iface);
                continue;
            };
            if !sys.has_interface(&iface) {
                // Not created yet (or gone): try again on the next tick.
                self.pending.insert(iface.clone());
                report.missing.push(iface);
                continue;
            }
            let r = sys.apply(&want);
            report.written += r.written.len();
            if refresh && !r.written.is_empty() {
                self.repairs += 1;
                tracing::warn!(interface = %iface, settings = ?r.written.iter().map(Sysctl::dotted).collect::<Vec<_>>(), "workload interface settings had drifted; put back");
            } else if !r.written.is_empty() {
                tracing::info!(interface = %iface, settings = ?r.written.iter().map(|s| format!("{}={}", s.dotted(), s.value)).collect::<Vec<_>>(), "configured workload interface");
            }
            for (s, e) in &r.failed {
                if s.best_effort {
                    tracing::debug!(interface = %iface, "{e}");
                } else {
                    report.errors.push(e.to_string());
                }
            }
            if r.failed_hard() {
                // Gone meanwhile, or refused: retry.
                self.pending.insert(iface);
            } else {
                self.pending.remove(&iface);
                report.configured += 1;
            }
        }
        report
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use margay_api::net::Cidr;
    use margay_calc::WorkloadEndpointData;

    use super::*;

    fn ep(name: &str, iface: &str, spoof: bool) -> Message {
        let mut data = WorkloadEndpointData {
            interface: iface.into(),
            mac: String::new(),
            ipv4_nets: Vec::new(),
            ipv6_nets: Vec::new(),
            profile_ids: Vec::new(),
            tiers: Vec::new(),
            name: name.into(),
            namespace: "default".into(),
            allow_spoofed_source_prefixes: Vec::new(),
        };
        if spoof {
            data.allow_spoofed_source_prefixes = vec![Cidr::parse("10.99.0.0/24").unwrap()];
        }
        Message::WorkloadEndpointUpdate {
            id: WorkloadEndpointId {
                orchestrator: "k8s".into(),
                workload: name.into(),
                endpoint: "eth0".into(),
            },
            endpoint: Arc::new(data),
        }
    }

    fn cfg(refresh: u64) -> InterfaceConfig {
        InterfaceConfig {
            ipv6: false,
            default_rp_filter: "2".into(),
            refresh_interval: Duration::from_secs(refresh),
        }
    }

    fn rp(w: &WorkloadInterfaces, iface: &str) -> String {
        w.desired(iface)
            .unwrap()
            .into_iter()
            .find(|s| s.path.ends_with("rp_filter"))
            .unwrap()
            .value
    }

    #[test]
    fn nothing_is_due_before_in_sync_and_new_endpoints_are_due_after() {
        let mut w = WorkloadInterfaces::new(cfg(0));
        w.on_message(&ep("a", "calia", false));
        let now = Instant::now();
        assert!(w.due(now).0.is_empty());
        w.on_message(&Message::InSync);
        assert_eq!(w.due(now).0, vec!["calia".to_string()]);
        assert_eq!(rp(&w, "calia"), "2");
        w.on_message(&ep("b", "calib", true));
        assert_eq!(
            rp(&w, "calib"),
            "0",
            "a workload that may spoof gets rp_filter 0"
        );
    }

    #[test]
    fn the_refresh_makes_every_interface_due() {
        let mut w = WorkloadInterfaces::new(cfg(1));
        w.on_message(&ep("a", "calia", false));
        w.on_message(&Message::InSync);
        w.pending.clear();
        let t0 = w.last_refresh;
        assert!(!w.needs_apply(t0));
        let later = t0 + Duration::from_secs(1);
        assert!(w.needs_apply(later));
        let (due, refresh) = w.due(later);
        assert!(refresh);
        assert_eq!(due, vec!["calia".to_string()]);
        // The interval restarts.
        assert!(!w.needs_apply(later));
        // 0 turns the refresh off.
        let mut off = WorkloadInterfaces::new(cfg(0));
        off.on_message(&Message::InSync);
        assert!(!off.needs_apply(t0 + Duration::from_secs(3600)));
    }

    #[test]
    fn apply_configures_existing_interfaces_and_retries_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let sys = ProcSys::with_root(dir.path());
        for (d, f, v) in [
            ("net/ipv4/conf/calia", "route_localnet", "0"),
            ("net/ipv4/conf/calia", "proxy_arp", "0"),
            ("net/ipv4/conf/calia", "forwarding", "0"),
            ("net/ipv4/conf/calia", "rp_filter", "1"),
            ("net/ipv4/neigh/calia", "proxy_delay", "5"),
            ("net/ipv6/conf/calia", "accept_ra", "1"),
        ] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
            std::fs::write(dir.path().join(d).join(f), v).unwrap();
        }
        let mut w = WorkloadInterfaces::new(cfg(0));
        w.on_message(&ep("a", "calia", false));
        w.on_message(&ep("b", "calib", false));
        w.on_message(&Message::InSync);
        let r = w.apply(&sys, Instant::now());
        assert_eq!(r.configured, 1);
        assert_eq!(r.written, 6);
        assert_eq!(r.missing, vec!["calib".to_string()]);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("net/ipv4/conf/calia/rp_filter")).unwrap(),
            "2"
        );
        // calib is still pending; calia is done.
        assert!(w.needs_apply(Instant::now()));
        assert_eq!(w.due(Instant::now()).0, vec!["calib".to_string()]);
        // Removing the endpoint forgets the interface.
        w.on_message(&Message::WorkloadEndpointRemove {
            id: WorkloadEndpointId {
                orchestrator: "k8s".into(),
                workload: "b".into(),
                endpoint: "eth0".into(),
            },
        });
        assert!(!w.needs_apply(Instant::now()));
    }
}
