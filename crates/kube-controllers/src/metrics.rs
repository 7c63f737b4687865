//! Prometheus metrics with Calico's names (`kube-controllers/pkg/controllers/node/ipam.go`):
//! per pool (label `ippool`, `no_ippool` for blocks outside every pool) and node (label
//! `node`: the allocation's node, `unknown_node` without one; for blocks the affine node,
//! `no_affinity` without one). [`IpamGauges::compute`] is pure; [`Metrics`] holds what the
//! controllers last reported and the counters, in a `margay-daemon-http` registry:
//! prometheus-client collectors and counters, and `ipam_allocations_gc_reclamations` as a
//! Calico-named counter (Calico exports it without `_total`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use margay_daemon_http::metrics::{Kind, Registry, SampleWriter};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;

use margay_api::net::Cidr;
use margay_ipam::{AllocationBlock, PoolInfo};

use crate::gc::AllocKey;

pub const UNKNOWN_NODE: &str = "unknown_node";
pub const NO_AFFINITY: &str = "no_affinity";
pub const NO_POOL: &str = "no_ippool";

/// The pool a block belongs to: the most specific pool containing it.
pub fn pool_of<'a>(block: &Cidr, pools: &'a [PoolInfo]) -> &'a str {
    pools
        .iter()
        .filter(|p| p.cidr.contains(block.addr()) && p.cidr.prefix() <= block.prefix())
        .max_by_key(|p| p.cidr.prefix())
        .map_or(NO_POOL, |p| p.name.as_str())
}

/// A label value as the exposition format wants it.
pub fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

type ByPoolNode = BTreeMap<String, BTreeMap<String, u64>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Counters stay meaningful whatever a panicking holder left behind.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn to_i64(v: impl TryInto<i64>) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}

/// The IPAM gauges of one scan (a collector: the families are replaced as a whole at each
/// scan, so a pool or node that went away leaves no stale series).
#[derive(Debug, Clone, Default)]
pub struct IpamGauges {
    in_use: ByPoolNode,
    borrowed: ByPoolNode,
    candidates: ByPoolNode,
    blocks: ByPoolNode,
    /// (pool, addresses in it, addresses reserved).
    pools: Vec<(String, u128, u128)>,
    legacy_allocs: BTreeMap<String, u64>,
    legacy_borrowed: BTreeMap<String, u64>,
    legacy_blocks: BTreeMap<String, u64>,
}

impl IpamGauges {
    /// `flagged` says whether an allocation is a GC candidate (or confirmed leak); `nodes`
    /// are the known nodes, reported with explicit zeros per pool (as Calico does, so
    /// utilisation expressions never see missing data).
    pub fn compute(
        blocks: &[AllocationBlock],
        pools: &[PoolInfo],
        reservations: &[Cidr],
        flagged: &dyn Fn(&AllocKey) -> bool,
        nodes: &BTreeSet<String>,
    ) -> IpamGauges {
        let mut g = IpamGauges::default();
        for p in pools {
            for m in [&mut g.in_use, &mut g.borrowed, &mut g.candidates] {
                let e = m.entry(p.name.clone()).or_default();
                for n in nodes {
                    e.insert(n.clone(), 0);
                }
            }
            g.blocks.entry(p.name.clone()).or_default();
            let reserved = margay_ipam::usage::pool_usage(p, &[], reservations).reserved;
            g.pools.push((p.name.clone(), p.cidr.size(), reserved));
        }
        for b in blocks {
            let pool = pool_of(&b.cidr, pools).to_string();
            let affine = b.host().unwrap_or(NO_AFFINITY).to_string();
            *g.blocks
                .entry(pool.clone())
                .or_default()
                .entry(affine.clone())
                .or_default() += 1;
            *g.legacy_blocks.entry(affine.clone()).or_default() += 1;
            for a in b.allocated() {
                let node = a
                    .attribute
                    .attrs
                    .get(margay_ipam::block::ATTR_NODE)
                    .filter(|n| !n.is_empty())
                    .cloned()
                    .unwrap_or_else(|| UNKNOWN_NODE.to_string());
                *g.in_use
                    .entry(pool.clone())
                    .or_default()
                    .entry(node.clone())
                    .or_default() += 1;
                *g.legacy_allocs.entry(node.clone()).or_default() += 1;
                if node != UNKNOWN_NODE && b.host() != Some(node.as_str()) {
                    *g.borrowed
                        .entry(pool.clone())
                        .or_default()
                        .entry(node.clone())
                        .or_default() += 1;
                    *g.legacy_borrowed.entry(node.clone()).or_default() += 1;
                }
                let key = AllocKey {
                    ip: a.ip,
                    handle: a.attribute.handle_id.clone(),
                    sequence_number: a.sequence_number,
                };
                if flagged(&key) {
                    *g.candidates
                        .entry(pool.clone())
                        .or_default()
                        .entry(node)
                        .or_default() += 1;
                }
            }
        }
        g
    }
}

/// A gauge family labelled by pool and node.
fn by_pool_node(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &ByPoolNode,
) -> Result<(), std::fmt::Error> {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (pool, nodes) in values {
        for (node, v) in nodes {
            let labels = [("ippool", pool.as_str()), ("node", node.as_str())];
            ConstGauge::new(to_i64(*v)).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// A pool's address count: whole while it fits (Go prints whole numbers so), else a float.
fn encode_count(
    m: &mut prometheus_client::encoding::MetricEncoder,
    labels: &[(&str, &str); 1],
    v: u128,
) -> Result<(), std::fmt::Error> {
    match i64::try_from(v) {
        Ok(v) => ConstGauge::new(v).encode(m.encode_family(labels)?),
        Err(_) => ConstGauge::new(v as f64).encode(m.encode_family(labels)?),
    }
}

impl Collector for IpamGauges {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        by_pool_node(
            &mut e,
            "ipam_allocations_in_use",
            "IPs currently allocated in IPAM to a workload or tunnel endpoint.",
            &self.in_use,
        )?;
        by_pool_node(
            &mut e,
            "ipam_allocations_borrowed",
            "IPs currently allocated in IPAM to a workload or tunnel endpoint, where the allocation was borrowed from a block affine to another node.",
            &self.borrowed,
        )?;
        by_pool_node(
            &mut e,
            "ipam_blocks",
            "IPAM blocks currently allocated for the IP pool.",
            &self.blocks,
        )?;
        by_pool_node(
            &mut e,
            "ipam_allocations_gc_candidates",
            "Allocations that are currently marked by the garbage collector as potential candidates to reclaim.",
            &self.candidates,
        )?;
        let mut m = e.encode_descriptor(
            "ipam_ippool_size",
            "Total number of addresses in the IP Pool",
            None,
            MetricType::Gauge,
        )?;
        for (pool, size, _) in &self.pools {
            encode_count(&mut m, &[("ippool", pool.as_str())], *size)?;
        }
        let mut m = e.encode_descriptor(
            "ipam_ippool_reserved",
            "Number of addresses in the IP Pool that an IPReservation covers, and so cannot be assigned.",
            None,
            MetricType::Gauge,
        )?;
        for (pool, _, reserved) in &self.pools {
            encode_count(&mut m, &[("ippool", pool.as_str())], *reserved)?;
        }
        for (name, help, values) in [
            (
                "ipam_allocations_per_node",
                "Number of IPs allocated",
                &self.legacy_allocs,
            ),
            (
                "ipam_allocations_borrowed_per_node",
                "Number of allocated IPs that are from non-affine blocks.",
                &self.legacy_borrowed,
            ),
            (
                "ipam_blocks_per_node",
                "Number of blocks in IPAM",
                &self.legacy_blocks,
            ),
        ] {
            let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (node, v) in values {
                let labels = [("node", node.as_str())];
                ConstGauge::new(to_i64(*v)).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The IPAM gauges of one scan as exposition text (tests, tools).
pub fn render_ipam(
    blocks: &[AllocationBlock],
    pools: &[PoolInfo],
    reservations: &[Cidr],
    flagged: &dyn Fn(&AllocKey) -> bool,
    nodes: &BTreeSet<String>,
) -> String {
    let mut r = Registry::new();
    r.register_collector(Box::new(IpamGauges::compute(
        blocks,
        pools,
        reservations,
        flagged,
        nodes,
    )));
    r.render()
}

/// The latest scan's gauges, shared between the controller and the registry.
#[derive(Debug, Clone, Default)]
struct LatestIpam(Arc<Mutex<IpamGauges>>);

impl Collector for LatestIpam {
    fn encode(&self, e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        lock(&self.0).encode(e)
    }
}

type Labels = Vec<(&'static str, String)>;

/// What `/metrics` serves.
pub struct Metrics {
    ipam: LatestIpam,
    reclaimed: Arc<Mutex<ByPoolNode>>,
    scans: Counter,
    released_affinities: Counter,
    deleted_nodes: Counter,
    mirror_writes: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::new();
        let ipam = LatestIpam::default();
        r.register_collector(Box::new(ipam.clone()));
        let reclaimed: Arc<Mutex<ByPoolNode>> = Arc::default();
        {
            let reclaimed = reclaimed.clone();
            r.register_calico(
                "ipam_allocations_gc_reclamations",
                "The total allocations that have been reclaimed by the garbage collector over time.",
                Kind::Counter,
                move |w: &mut SampleWriter<'_>| {
                    for (pool, nodes) in lock(&reclaimed).iter() {
                        for (node, v) in nodes {
                            w.sample_u64(&[("ippool", pool), ("node", node)], *v);
                        }
                    }
                },
            );
        }
        // prometheus-client appends `_total` to these counters' names.
        let mut counter = |name: &str, help: &str| {
            let c = Counter::default();
            r.register(name, help, c.clone());
            c
        };
        let scans = counter(
            "margay_kube_controllers_ipam_scans",
            "IPAM garbage collection scans completed.",
        );
        let released_affinities = counter(
            "margay_kube_controllers_released_affinities",
            "Block affinities released (deleted nodes, empty blocks).",
        );
        let deleted_nodes = counter(
            "margay_kube_controllers_deleted_nodes",
            "Calico Nodes deleted because their Kubernetes Node was gone (etcd).",
        );
        let mirror_writes = Family::default();
        r.register(
            "margay_kube_controllers_mirror_writes",
            "Writes of the etcd-mode mirror controllers.",
            mirror_writes.clone(),
        );
        let errors = Family::default();
        r.register(
            "margay_kube_controllers_errors",
            "Failed reconciliations per controller (each is retried).",
            errors.clone(),
        );
        Metrics {
            ipam,
            reclaimed,
            scans,
            released_affinities,
            deleted_nodes,
            mirror_writes,
            errors,
            registry: r,
        }
    }
}

impl Metrics {
    /// The gauges of the latest IPAM scan.
    pub fn set_ipam(&self, gauges: IpamGauges) {
        *lock(&self.ipam.0) = gauges;
        self.scans.inc();
    }

    pub fn add_reclaimed(&self, pool: &str, node: &str, n: u64) {
        let node = if node.is_empty() { UNKNOWN_NODE } else { node };
        *lock(&self.reclaimed)
            .entry(pool.to_string())
            .or_default()
            .entry(node.to_string())
            .or_default() += n;
    }

    /// Reclaimed addresses so far, all pools and nodes.
    pub fn reclaimed_total(&self) -> u64 {
        lock(&self.reclaimed)
            .values()
            .flat_map(|m| m.values())
            .sum()
    }

    pub fn add_released_affinities(&self, n: u64) {
        self.released_affinities.inc_by(n);
    }

    pub fn add_deleted_node(&self) {
        self.deleted_nodes.inc();
    }

    /// A create, update or delete by a mirror controller.
    pub fn add_mirror_write(&self, controller: &str, op: &'static str) {
        self.mirror_writes
            .get_or_create(&vec![
                ("controller", controller.to_string()),
                ("op", op.to_string()),
            ])
            .inc();
    }

    pub fn add_error(&self, controller: &str) {
        self.errors
            .get_or_create(&vec![("controller", controller.to_string())])
            .inc();
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        self.registry.render()
    }
}

impl margay_daemon_http::Exposition for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }
}

/// The value of one series in exposition text (tests, the benchmark): `name{labels}`
/// exactly as rendered, or the sum over every series of `name` when `labels` is None.
pub fn sample(text: &str, name: &str, labels: Option<&str>) -> Option<f64> {
    let mut sum = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (n, l) = match series.split_once('{') {
            Some((n, rest)) => (n, Some(rest.trim_end_matches('}'))),
            None => (series, None),
        };
        if n != name {
            continue;
        }
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        match labels {
            Some(want) if l == Some(want) => return Some(v),
            Some(_) => {}
            None => *sum.get_or_insert(0.0) += v,
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use margay_api::IPPool;
    use margay_api::ippool::IPPoolSpec;

    fn pool(name: &str, cidr: &str) -> PoolInfo {
        PoolInfo::from_resource(&IPPool::new(
            margay_api::ObjectMeta::named(name),
            IPPoolSpec {
                cidr: cidr.into(),
                block_size: Some(26),
                ..IPPoolSpec::default()
            },
        ))
        .unwrap()
    }

    fn attrs(node: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("node".to_string(), node.to_string())])
    }

    #[test]
    fn calicos_gauges_by_pool_and_node() {
        let pools = vec![pool("p1", "10.0.0.0/16")];
        let mut b1 = AllocationBlock::new(Cidr::parse("10.0.0.0/26").unwrap(), Some("n1"));
        b1.assign_ip("10.0.0.1".parse().unwrap(), "a", &attrs("n1"))
            .unwrap();
        b1.assign_ip("10.0.0.2".parse().unwrap(), "b", &attrs("n2"))
            .unwrap();
        b1.assign_ip("10.0.0.3".parse().unwrap(), "c", &BTreeMap::new())
            .unwrap();
        let b2 = AllocationBlock::new(Cidr::parse("192.168.0.0/26").unwrap(), None);
        let nodes: BTreeSet<String> = ["n1", "n2", "n3"].iter().map(|s| s.to_string()).collect();
        let flagged = |k: &AllocKey| k.handle.as_deref() == Some("b");
        let text = render_ipam(&[b1, b2], &pools, &[], &flagged, &nodes);
        let s = |n: &str, l: &str| sample(&text, n, Some(l));
        assert_eq!(
            s("ipam_allocations_in_use", r#"ippool="p1",node="n1""#),
            Some(1.0)
        );
        assert_eq!(
            s("ipam_allocations_in_use", r#"ippool="p1",node="n3""#),
            Some(0.0)
        );
        assert_eq!(
            s(
                "ipam_allocations_in_use",
                r#"ippool="p1",node="unknown_node""#
            ),
            Some(1.0)
        );
        assert_eq!(
            s("ipam_allocations_borrowed", r#"ippool="p1",node="n2""#),
            Some(1.0)
        );
        assert_eq!(
            s("ipam_allocations_borrowed", r#"ippool="p1",node="n1""#),
            Some(0.0)
        );
        assert_eq!(
            s("ipam_allocations_gc_candidates", r#"ippool="p1",node="n2""#),
            Some(1.0)
        );
        assert_eq!(s("ipam_blocks", r#"ippool="p1",node="n1""#), Some(1.0));
        assert_eq!(
            s("ipam_blocks", r#"ippool="no_ippool",node="no_affinity""#),
            Some(1.0)
        );
        assert_eq!(s("ipam_ippool_size", r#"ippool="p1""#), Some(65536.0));
        assert_eq!(s("ipam_blocks_per_node", r#"node="n1""#), Some(1.0));
        assert_eq!(sample(&text, "ipam_allocations_in_use", None), Some(3.0));
    }

    #[test]
    fn counters_accumulate() {
        let m = Metrics::default();
        m.set_ipam(IpamGauges::default());
        m.add_reclaimed("p1", "n1", 2);
        m.add_reclaimed("p1", "", 1);
        m.add_reclaimed("p1", "n1", 3);
        let text = m.render();
        assert_eq!(
            sample(
                &text,
                "ipam_allocations_gc_reclamations",
                Some(r#"ippool="p1",node="n1""#)
            ),
            Some(5.0)
        );
        assert_eq!(m.reclaimed_total(), 6);
        assert_eq!(
            sample(&text, "margay_kube_controllers_ipam_scans_total", None),
            Some(1.0)
        );
        assert_eq!(escape("a\"b\\c\n"), "a\\\"b\\\\c\\n");
    }

    /// The full list of families (name and type) kube-controllers exported before its
    /// metrics moved to prometheus-client: not one may change.
    #[test]
    fn metric_families_are_unchanged() {
        let m = Metrics::default();
        let pools = vec![pool("p1", "10.0.0.0/16")];
        let nodes: BTreeSet<String> = ["n1".to_string()].into();
        m.set_ipam(IpamGauges::compute(&[], &pools, &[], &|_| false, &nodes));
        m.add_reclaimed("p1", "n1", 1);
        m.add_mirror_write("node", "create");
        m.add_error("node");
        let text = m.render();
        let got = margay_daemon_http::metrics::families(&text);
        let want = [
            ("ipam_allocations_in_use", "gauge"),
            ("ipam_allocations_borrowed", "gauge"),
            ("ipam_blocks", "gauge"),
            ("ipam_allocations_gc_candidates", "gauge"),
            ("ipam_ippool_size", "gauge"),
            ("ipam_ippool_reserved", "gauge"),
            ("ipam_allocations_per_node", "gauge"),
            ("ipam_allocations_borrowed_per_node", "gauge"),
            ("ipam_blocks_per_node", "gauge"),
            ("ipam_allocations_gc_reclamations", "counter"),
            ("margay_kube_controllers_ipam_scans_total", "counter"),
            (
                "margay_kube_controllers_released_affinities_total",
                "counter",
            ),
            ("margay_kube_controllers_deleted_nodes_total", "counter"),
            ("margay_kube_controllers_mirror_writes_total", "counter"),
            ("margay_kube_controllers_errors_total", "counter"),
        ]
        .map(|(n, k)| (n.to_string(), k.to_string()));
        assert_eq!(got, want, "{text}");
        for series in [
            "ipam_ippool_size{ippool=\"p1\"} 65536",
            "ipam_allocations_in_use{ippool=\"p1\",node=\"n1\"} 0",
            "margay_kube_controllers_mirror_writes_total{controller=\"node\",op=\"create\"} 1",
            "margay_kube_controllers_errors_total{controller=\"node\"} 1",
        ] {
            assert!(
                text.contains(&format!("{series}\n")),
                "missing {series} in\n{text}"
            );
        }
    }
}
