//! Applying, the pure part: the kernel's routes as read back, the plan that makes the main
//! table equal to the desired routes (which routes to write, replace, take over or delete),
//! and the netlink requests that carry it out.

use margay_netlink::route_ip;

use super::*;

/// Why the route manager could not do its work at all (single routes that fail are reported
/// in [`RouteReport::failures`] instead).
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error(
        "route manager: {what} failed: {source} (margay needs CAP_NET_ADMIN in the node's network namespace)"
    )]
    Netlink {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

pub(super) fn nl_err(what: &'static str) -> impl FnOnce(std::io::Error) -> RouteError {
    move |source| RouteError::Netlink { what, source }
}

/// One route the kernel refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteFailure {
    pub route: String,
    pub operation: &'static str,
    pub error: String,
}

/// What one [`RouteManager::apply`] did, for logs and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteReport {
    pub added: usize,
    /// Routes of margay's whose details changed (replaced in place).
    pub replaced: usize,
    /// Routes of margay's that nobody wants any more (deleted).
    pub removed: usize,
    /// Routes of other protocols through a local workload's interface to its address (the
    /// CNI plugin's), deleted once margay's route to the workload was in place.
    pub taken_over: usize,
    pub unchanged: usize,
    /// Routes the kernel refused; `failures` says which and why.
    pub errors: usize,
    pub failures: Vec<RouteFailure>,
    /// Interfaces that desired routes need but that do not exist (yet): those routes are
    /// retried on the next apply.
    pub missing_interfaces: BTreeSet<String>,
    /// Desired routes waiting for a missing interface.
    pub waiting: usize,
    /// Desired routes not installed because a route margay neither owns nor takes over has
    /// the same destination and metric.
    pub conflicts: Vec<RouteKey>,
    pub duration: Duration,
}

impl RouteReport {
    /// Something is left to do: apply again later.
    pub fn needs_retry(&self) -> bool {
        self.errors > 0 || self.waiting > 0
    }

    pub fn changed(&self) -> bool {
        self.added + self.replaced + self.removed + self.taken_over > 0
    }
}

/// A main-table route as read from the kernel.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Observed {
    pub(super) key: RouteKey,
    pub(super) tos: u8,
    pub(super) protocol: u8,
    pub(super) kind: RouteType,
    pub(super) scope: RouteScope,
    pub(super) oif: Option<u32>,
    pub(super) gateway: Option<IpAddr>,
    pub(super) onlink: bool,
    pub(super) src: Option<IpAddr>,
}

pub(super) fn parse_route(m: &RouteMessage) -> Option<Observed> {
    let h = &m.header;
    if h.flags.contains(RouteFlags::Cloned) {
        return None;
    }
    let mut table = u32::from(h.table);
    let mut dst = None;
    let mut oif = None;
    let mut gateway = None;
    let mut src = None;
    let mut priority = 0;
    for a in &m.attributes {
        match a {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::PrefSource(a) => src = route_ip(a),
            RouteAttribute::Destination(d) => dst = route_ip(d),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Gateway(g) => gateway = route_ip(g),
            RouteAttribute::Priority(p) => priority = *p,
            _ => {}
        }
    }
    if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
        return None;
    }
    let dst = match (dst, h.address_family) {
        (Some(ip), _) => ip,
        (None, AddressFamily::Inet) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        (None, AddressFamily::Inet6) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        _ => return None,
    };
    let dst = Cidr::new(dst, h.destination_prefix_length).ok()?;
    Some(Observed {
        key: RouteKey { dst, priority },
        tos: h.tos,
        protocol: u8::from(h.protocol),
        kind: h.kind,
        scope: h.scope,
        oif,
        gateway,
        onlink: h.flags.contains(RouteFlags::Onlink),
        src,
    })
}

/// Whether the kernel's route is the wanted one.
pub(super) fn same(want: &KernelRoute, oif: Option<u32>, have: &Observed) -> bool {
    let v4 = want.dst.is_ipv4();
    if want.target != RouteTarget::Blackhole && have.src != want.src {
        return false;
    }
    match &want.target {
        RouteTarget::Blackhole => have.kind == RouteType::BlackHole,
        RouteTarget::Interface { .. } => {
            have.kind == RouteType::Unicast
                && have.oif == oif
                && have.gateway.is_none()
                // IPv6 routes are all reported with universe scope.
                && (!v4 || have.scope == RouteScope::Link)
        }
        RouteTarget::Gateway {
            gateway, onlink, ..
        } => {
            have.kind == RouteType::Unicast
                && have.oif == oif
                && have.gateway == Some(*gateway)
                && have.onlink == *onlink
        }
    }
}

pub(super) fn family_of(c: &Cidr) -> AddressFamily {
    if c.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

/// The netlink message that installs `r` (with `oif` resolved).
pub(super) fn route_message(r: &KernelRoute, oif: Option<u32>) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = family_of(&r.dst);
    m.header.destination_prefix_length = r.dst.prefix();
    m.header.table = RouteHeader::RT_TABLE_MAIN;
    m.header.protocol = RouteProtocol::from(ROUTE_PROTOCOL);
    m.header.kind = RouteType::Unicast;
    m.header.scope = RouteScope::Universe;
    m.attributes
        .push(RouteAttribute::Destination(RouteAddress::from(
            r.dst.network().addr(),
        )));
    match &r.target {
        RouteTarget::Blackhole => m.header.kind = RouteType::BlackHole,
        RouteTarget::Interface { .. } => m.header.scope = RouteScope::Link,
        RouteTarget::Gateway {
            gateway, onlink, ..
        } => {
            if *onlink {
                m.header.flags = RouteFlags::Onlink;
            }
            m.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(*gateway)));
        }
    }
    if let Some(oif) = oif {
        m.attributes.push(RouteAttribute::Oif(oif));
    }
    if let Some(src) = r.src {
        m.attributes
            .push(RouteAttribute::PrefSource(RouteAddress::from(src)));
    }
    if r.priority != 0 {
        m.attributes.push(RouteAttribute::Priority(r.priority));
    }
    m
}

/// The netlink message that deletes exactly this route: margay's (protocol 80) or one it takes
/// over (never protocol 0, which the kernel would read as "any protocol").
pub(super) fn delete_message(o: &Observed) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = family_of(&o.key.dst);
    m.header.destination_prefix_length = o.key.dst.prefix();
    m.header.tos = o.tos;
    m.header.table = RouteHeader::RT_TABLE_MAIN;
    // The kernel only deletes a route whose protocol matches: never another protocol's route
    // with the same destination (margay's own, or BIRD's).
    m.header.protocol = RouteProtocol::from(o.protocol);
    m.header.scope = RouteScope::NoWhere;
    m.header.kind = o.kind;
    m.attributes
        .push(RouteAttribute::Destination(RouteAddress::from(
            o.key.dst.addr(),
        )));
    if o.key.priority != 0 {
        m.attributes.push(RouteAttribute::Priority(o.key.priority));
    }
    if o.kind != RouteType::BlackHole {
        if let Some(oif) = o.oif {
            m.attributes.push(RouteAttribute::Oif(oif));
        }
        if let Some(gw) = o.gateway {
            m.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
        }
    }
    m
}

/// BIRD's route protocol (`proto bird`): routes learned over BGP. margay never deletes one.
pub(super) const BIRD_PROTOCOL: u8 = 12;

/// One route to add or replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RouteWrite {
    pub(super) route: KernelRoute,
    pub(super) oif: Option<u32>,
    /// A route with the same key is there already (margay's, or one margay takes over): the
    /// kernel replaces it in place.
    pub(super) replacing: bool,
}

/// Why a kernel route is to go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RemovalKind {
    /// margay's, and nobody wants it.
    Unwanted,
    /// margay's, and the first with the key of a route being written: the kernel replaces it
    /// in place when that write succeeds, so it is deleted only when the write fails.
    ReplacedBy(RouteKey),
    /// Another protocol's route through a local workload's interface to one of that
    /// workload's addresses (the CNI plugin's): deleted only once margay's route to this
    /// destination is in place, so the workload is never without a route.
    TakenOver(Cidr),
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Removal {
    pub(super) route: Observed,
    pub(super) kind: RemovalKind,
}

/// The diff between the desired routes and the kernel's main table: what one apply does.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct RoutePlan {
    /// Desired routes that are in place already.
    pub(super) unchanged: BTreeSet<RouteKey>,
    /// Adds and replaces, in the order of the desired routes.
    pub(super) writes: Vec<RouteWrite>,
    /// Deletions, done after every write (add first, then delete).
    pub(super) removals: Vec<Removal>,
    pub(super) missing_interfaces: BTreeSet<String>,
    /// Desired routes waiting for a missing interface.
    pub(super) waiting: usize,
    /// Desired routes left out because a route margay neither owns nor takes over has their
    /// key.
    pub(super) conflicts: Vec<KernelRoute>,
}

/// Whether margay takes over `o`, a route of another protocol: it goes through the host-side
/// interface of a local workload (`workload_nets`: interface index → that workload's
/// addresses) to one of that workload's addresses. Calico's route table claims every route on
/// its workload interfaces the same way; margay claims only those of workloads it knows.
pub(super) fn taken_over(o: &Observed, workload_nets: &HashMap<u32, BTreeSet<Cidr>>) -> bool {
    // Protocol 0 in a delete request matches any protocol (margay's own route included), and
    // BIRD's routes are never margay's to delete.
    if o.protocol == ROUTE_PROTOCOL || o.protocol == 0 || o.protocol == BIRD_PROTOCOL {
        return false;
    }
    o.oif
        .and_then(|i| workload_nets.get(&i))
        .is_some_and(|nets| nets.contains(&o.key.dst))
}

/// The pure diff: what makes the main table hold exactly `desired` as margay's routes.
///
/// `kernel` is the main table as read, `index_of` the interfaces by name, `workloads` the
/// host-side interface and addresses of each local workload. IPv6 routes are ignored unless
/// `ipv6`.
pub(super) fn plan_routes(
    desired: &[KernelRoute],
    kernel: &[Observed],
    index_of: &HashMap<&str, u32>,
    workloads: &[(String, Vec<Cidr>)],
    ipv6: bool,
) -> RoutePlan {
    let mut plan = RoutePlan::default();
    let mut workload_nets: HashMap<u32, BTreeSet<Cidr>> = HashMap::new();
    for (ifname, nets) in workloads {
        if let Some(i) = index_of.get(ifname.as_str()) {
            workload_nets
                .entry(*i)
                .or_default()
                .extend(nets.iter().copied());
        }
    }
    let mut owned: BTreeMap<RouteKey, Vec<&Observed>> = BTreeMap::new();
    let mut foreign: BTreeSet<RouteKey> = BTreeSet::new();
    let mut claimed: Vec<&Observed> = Vec::new();
    for o in kernel {
        if !o.key.dst.is_ipv4() && !ipv6 {
            continue;
        }
        if o.protocol == ROUTE_PROTOCOL {
            owned.entry(o.key).or_default().push(o);
        } else if taken_over(o, &workload_nets) {
            claimed.push(o);
        } else if o.tos == 0 {
            foreign.insert(o.key);
        }
    }
    let claimed_keys: BTreeSet<RouteKey> = claimed.iter().map(|o| o.key).collect();

    let mut seen = BTreeSet::new();
    // Observed routes of margay's to keep: (key, index in `owned[key]`).
    let mut keep: BTreeSet<(RouteKey, usize)> = BTreeSet::new();
    for want in desired {
        if !want.dst.is_ipv4() && !ipv6 {
            continue;
        }
        let key = want.key();
        if !seen.insert(key) {
            continue;
        }
        let oif = match want.ifname() {
            None => None,
            Some(name) => match index_of.get(name) {
                Some(i) => Some(*i),
                None => {
                    plan.missing_interfaces.insert(name.to_string());
                    plan.waiting += 1;
                    continue;
                }
            },
        };
        let mine = owned.get(&key).map(Vec::as_slice).unwrap_or_default();
        if let Some(i) = mine.iter().position(|o| same(want, oif, o)) {
            keep.insert((key, i));
            plan.unchanged.insert(key);
            continue;
        }
        if foreign.contains(&key) {
            plan.conflicts.push(want.clone());
            continue;
        }
        if let Some(first) = mine.first() {
            keep.insert((key, 0));
            plan.removals.push(Removal {
                route: (*first).clone(),
                kind: RemovalKind::ReplacedBy(key),
            });
        }
        plan.writes.push(RouteWrite {
            route: want.clone(),
            oif,
            // A taken-over route with this key (IPv6 stores the CNI plugin's metric 0 as
            // 1024, Felix's metric) is replaced in place, so the workload keeps a route
            // throughout; its removal below then finds nothing.
            replacing: !mine.is_empty() || claimed_keys.contains(&key),
        });
    }
    for (key, list) in &owned {
        for (i, o) in list.iter().enumerate() {
            if !keep.contains(&(*key, i)) {
                plan.removals.push(Removal {
                    route: (*o).clone(),
                    kind: RemovalKind::Unwanted,
                });
            }
        }
    }
    for o in claimed {
        plan.removals.push(Removal {
            route: o.clone(),
            kind: RemovalKind::TakenOver(o.key.dst),
        });
    }
    plan
}

/// Whether a planned removal is to be carried out, given the keys the writes of this apply
/// installed (`written`) and the destinations whose desired route is now in the kernel
/// (`in_place`).
pub(super) fn removal_due(
    kind: RemovalKind,
    written: &BTreeSet<RouteKey>,
    in_place: &BTreeSet<Cidr>,
) -> bool {
    match kind {
        RemovalKind::Unwanted => true,
        RemovalKind::ReplacedBy(key) => !written.contains(&key),
        // Add first, then delete: never leave a workload without a route.
        RemovalKind::TakenOver(dst) => in_place.contains(&dst),
    }
}
