//! The [`RouteManager`]: reads the kernel's routes, plans with `plan_routes` and carries
//! the plan out over netlink.

use super::*;

/// Keeps the main table's protocol-80 routes equal to the desired set, and owns the routes
/// through local workloads' interfaces.
///
/// Each [`apply`](RouteManager::apply) reads the kernel's routes (so drift — routes deleted
/// or changed behind margay's back — is repaired on the next apply), plans the difference
/// (`plan_routes`, pure) and carries it out: adds or replaces what differs, then deletes
/// the protocol-80 routes nobody wants and the other protocols' routes to a local workload
/// through its interface once margay's own route to that workload is in place. The netlink
/// socket is opened in the calling thread's network namespace.
#[derive(Debug, Default)]
pub struct RouteManager {
    ipv6: bool,
    warned_conflicts: BTreeSet<RouteKey>,
    warned_missing: BTreeSet<String>,
}

impl RouteManager {
    /// `ipv6`: also manage IPv6 routes (and read the IPv6 table).
    pub fn new(ipv6: bool) -> RouteManager {
        RouteManager {
            ipv6,
            ..RouteManager::default()
        }
    }

    /// Makes the main table's protocol-80 routes exactly `desired` (IPv6 ones are ignored
    /// unless the manager handles IPv6), and removes other protocols' routes through the
    /// interfaces of `workloads` (host-side interface, addresses) to their addresses.
    pub fn apply(
        &mut self,
        desired: &[KernelRoute],
        workloads: &[(String, Vec<Cidr>)],
    ) -> Result<RouteReport, RouteError> {
        let started = Instant::now();
        let mut nl = Netlink::open().map_err(nl_err("opening a netlink socket"))?;
        let links = nl.links().map_err(nl_err("listing links"))?;
        let index_of: HashMap<&str, u32> =
            links.iter().map(|l| (l.name.as_str(), l.index)).collect();

        let mut kernel = nl
            .route_messages(AddressFamily::Inet)
            .map_err(nl_err("listing IPv4 routes"))?;
        if self.ipv6 {
            kernel.extend(
                nl.route_messages(AddressFamily::Inet6)
                    .map_err(nl_err("listing IPv6 routes"))?,
            );
        }
        let observed: Vec<Observed> = kernel.iter().filter_map(parse_route).collect();
        let plan = plan_routes(desired, &observed, &index_of, workloads, self.ipv6);

        let mut report = RouteReport {
            unchanged: plan.unchanged.len(),
            missing_interfaces: plan.missing_interfaces.clone(),
            waiting: plan.waiting,
            ..RouteReport::default()
        };
        let mut conflicts = BTreeSet::new();
        for want in &plan.conflicts {
            let key = want.key();
            conflicts.insert(key);
            if !self.warned_conflicts.contains(&key) {
                tracing::warn!(
                    route = %want,
                    "a route margay does not own (another protocol) has the same destination and metric; leaving it alone and not installing margay's"
                );
            }
        }

        // Destinations whose desired route is in the kernel: taken-over routes to them may go.
        let mut in_place: BTreeSet<Cidr> = plan.unchanged.iter().map(|k| k.dst).collect();
        let mut written: BTreeSet<RouteKey> = BTreeSet::new();
        for w in &plan.writes {
            match nl.request(
                NLM_F_CREATE | NLM_F_REPLACE,
                RouteNetlinkMessage::NewRoute(route_message(&w.route, w.oif)),
            ) {
                Ok(()) => {
                    written.insert(w.route.key());
                    in_place.insert(w.route.dst);
                    if w.replacing {
                        report.replaced += 1;
                        tracing::debug!(route = %w.route, "replaced route");
                    } else {
                        report.added += 1;
                        tracing::debug!(route = %w.route, "added route");
                    }
                }
                Err(e) if e.raw_os_error() == Some(netlink::ENODEV) => {
                    // The interface went away since we listed the links.
                    if let Some(name) = w.route.ifname() {
                        report.missing_interfaces.insert(name.to_string());
                    }
                    report.waiting += 1;
                }
                Err(e) => {
                    report.errors += 1;
                    report.failures.push(RouteFailure {
                        route: w.route.to_string(),
                        operation: if w.replacing { "replace" } else { "add" },
                        error: e.to_string(),
                    });
                }
            }
        }

        for r in &plan.removals {
            if !removal_due(r.kind, &written, &in_place) {
                if matches!(r.kind, RemovalKind::TakenOver(_)) {
                    tracing::debug!(route = %r.route.key, protocol = r.route.protocol, "keeping a workload route of another protocol: margay's is not in place yet");
                }
                continue;
            }
            match nl.request(0, RouteNetlinkMessage::DelRoute(delete_message(&r.route))) {
                Ok(()) => {
                    if matches!(r.kind, RemovalKind::TakenOver(_)) {
                        report.taken_over += 1;
                        tracing::debug!(route = %r.route.key, protocol = r.route.protocol, "removed another protocol's route through a workload interface (margay's is in place)");
                    } else {
                        report.removed += 1;
                        tracing::debug!(route = %r.route.key, "removed route");
                    }
                }
                // Gone already: its interface was deleted meanwhile, or it was the
                // taken-over route a write replaced in place.
                Err(e) if e.raw_os_error() == Some(netlink::ESRCH) => {}
                Err(e) => {
                    report.errors += 1;
                    report.failures.push(RouteFailure {
                        route: r.route.key.to_string(),
                        operation: "delete",
                        error: e.to_string(),
                    });
                }
            }
        }

        for f in &report.failures {
            tracing::warn!(route = %f.route, operation = f.operation, error = %f.error, "the kernel refused a route change; retrying on the next apply");
        }
        let newly_missing: Vec<&String> = report
            .missing_interfaces
            .iter()
            .filter(|n| !self.warned_missing.contains(*n))
            .collect();
        if !newly_missing.is_empty() {
            tracing::info!(interfaces = ?newly_missing, "routes wait for interfaces that do not exist yet");
        }
        self.warned_missing = report.missing_interfaces.clone();
        self.warned_conflicts = conflicts.clone();
        report.conflicts = conflicts.into_iter().collect();
        report.duration = started.elapsed();
        if report.changed() || report.errors > 0 {
            tracing::info!(
                added = report.added,
                replaced = report.replaced,
                removed = report.removed,
                taken_over = report.taken_over,
                unchanged = report.unchanged,
                errors = report.errors,
                waiting = report.waiting,
                took = ?report.duration,
                "routes applied"
            );
        }
        Ok(report)
    }
}
