//! Prometheus metrics with Calico's names (`kube-controllers/pkg/controllers/node/ipam.go`):
//! per pool (label `ippool`, `no_ippool` for blocks outside every pool) and node (label
//! `node`: the allocation's node, `unknown_node` without one; for blocks the affine node,
//! `no_affinity` without one). Rendering is pure; [`Metrics`] holds what the controllers last
//! reported and the counters.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::sync::Mutex;

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

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

type ByPoolNode = BTreeMap<String, BTreeMap<String, u64>>;

fn series(out: &mut String, name: &str, values: &ByPoolNode) {
    for (pool, nodes) in values {
        for (node, v) in nodes {
            let _ = writeln!(
                out,
                "{name}{{ippool=\"{}\",node=\"{}\"}} {v}",
                escape(pool),
                escape(node)
            );
        }
    }
}

/// The IPAM gauges of one scan. `flagged` says whether an allocation is a GC candidate (or
/// confirmed leak); `nodes` are the known nodes, reported with explicit zeros per pool (as
/// Calico does, so utilisation expressions never see missing data).
pub fn render_ipam(
    blocks: &[AllocationBlock],
    pools: &[PoolInfo],
    reservations: &[Cidr],
    flagged: &dyn Fn(&AllocKey) -> bool,
    nodes: &BTreeSet<String>,
) -> String {
    let mut in_use = ByPoolNode::new();
    let mut borrowed = ByPoolNode::new();
    let mut candidates = ByPoolNode::new();
    let mut block_count = ByPoolNode::new();
    let mut legacy_allocs: BTreeMap<String, u64> = BTreeMap::new();
    let mut legacy_borrowed: BTreeMap<String, u64> = BTreeMap::new();
    let mut legacy_blocks: BTreeMap<String, u64> = BTreeMap::new();
    for p in pools {
        for m in [&mut in_use, &mut borrowed, &mut candidates] {
            let e = m.entry(p.name.clone()).or_default();
            for n in nodes {
                e.insert(n.clone(), 0);
            }
        }
        block_count.entry(p.name.clone()).or_default();
    }
    for b in blocks {
        let pool = pool_of(&b.cidr, pools).to_string();
        let affine = b.host().unwrap_or(NO_AFFINITY).to_string();
        *block_count
            .entry(pool.clone())
            .or_default()
            .entry(affine.clone())
            .or_default() += 1;
        *legacy_blocks.entry(affine.clone()).or_default() += 1;
        for a in b.allocated() {
            let node = a
                .attribute
                .attrs
                .get(margay_ipam::block::ATTR_NODE)
                .filter(|n| !n.is_empty())
                .cloned()
                .unwrap_or_else(|| UNKNOWN_NODE.to_string());
            *in_use
                .entry(pool.clone())
                .or_default()
                .entry(node.clone())
                .or_default() += 1;
            *legacy_allocs.entry(node.clone()).or_default() += 1;
            if node != UNKNOWN_NODE && b.host() != Some(node.as_str()) {
                *borrowed
                    .entry(pool.clone())
                    .or_default()
                    .entry(node.clone())
                    .or_default() += 1;
                *legacy_borrowed.entry(node.clone()).or_default() += 1;
            }
            let key = AllocKey {
                ip: a.ip,
                handle: a.attribute.handle_id.clone(),
                sequence_number: a.sequence_number,
            };
            if flagged(&key) {
                *candidates
                    .entry(pool.clone())
                    .or_default()
                    .entry(node)
                    .or_default() += 1;
            }
        }
    }
    let mut out = String::new();
    header(
        &mut out,
        "ipam_allocations_in_use",
        "gauge",
        "IPs currently allocated in IPAM to a workload or tunnel endpoint.",
    );
    series(&mut out, "ipam_allocations_in_use", &in_use);
    header(
        &mut out,
        "ipam_allocations_borrowed",
        "gauge",
        "IPs currently allocated in IPAM to a workload or tunnel endpoint, where the allocation was borrowed from a block affine to another node.",
    );
    series(&mut out, "ipam_allocations_borrowed", &borrowed);
    header(
        &mut out,
        "ipam_blocks",
        "gauge",
        "IPAM blocks currently allocated for the IP pool.",
    );
    series(&mut out, "ipam_blocks", &block_count);
    header(
        &mut out,
        "ipam_allocations_gc_candidates",
        "gauge",
        "Allocations that are currently marked by the garbage collector as potential candidates to reclaim.",
    );
    series(&mut out, "ipam_allocations_gc_candidates", &candidates);
    header(
        &mut out,
        "ipam_ippool_size",
        "gauge",
        "Total number of addresses in the IP Pool",
    );
    for p in pools {
        let _ = writeln!(
            out,
            "ipam_ippool_size{{ippool=\"{}\"}} {}",
            escape(&p.name),
            p.cidr.size() as f64
        );
    }
    header(
        &mut out,
        "ipam_ippool_reserved",
        "gauge",
        "Number of addresses in the IP Pool that an IPReservation covers, and so cannot be assigned.",
    );
    for p in pools {
        let reserved = margay_ipam::usage::pool_usage(p, &[], reservations).reserved;
        let _ = writeln!(
            out,
            "ipam_ippool_reserved{{ippool=\"{}\"}} {}",
            escape(&p.name),
            reserved as f64
        );
    }
    for (name, help, values) in [
        (
            "ipam_allocations_per_node",
            "Number of IPs allocated",
            &legacy_allocs,
        ),
        (
            "ipam_allocations_borrowed_per_node",
            "Number of allocated IPs that are from non-affine blocks.",
            &legacy_borrowed,
        ),
        (
            "ipam_blocks_per_node",
            "Number of blocks in IPAM",
            &legacy_blocks,
        ),
    ] {
        header(&mut out, name, "gauge", help);
        for (node, v) in values {
            let _ = writeln!(out, "{name}{{node=\"{}\"}} {v}", escape(node));
        }
    }
    out
}

#[derive(Default)]
struct Inner {
    ipam: String,
    reclaimed: ByPoolNode,
    scans: u64,
    released_affinities: u64,
    deleted_nodes: u64,
    mirror_writes: BTreeMap<(String, &'static str), u64>,
    errors: BTreeMap<String, u64>,
}

/// What `/metrics` serves.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Counters stay meaningful whatever a panicking holder left behind.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The gauges of the latest IPAM scan.
    pub fn set_ipam(&self, text: String) {
        let mut i = self.lock();
        i.ipam = text;
        i.scans += 1;
    }

    pub fn add_reclaimed(&self, pool: &str, node: &str, n: u64) {
        let node = if node.is_empty() { UNKNOWN_NODE } else { node };
        *self
            .lock()
            .reclaimed
            .entry(pool.to_string())
            .or_default()
            .entry(node.to_string())
            .or_default() += n;
    }

    /// Reclaimed addresses so far, all pools and nodes.
    pub fn reclaimed_total(&self) -> u64 {
        self.lock()
            .reclaimed
            .values()
            .flat_map(|m| m.values())
            .sum()
    }

    pub fn add_released_affinities(&self, n: u64) {
        self.lock().released_affinities += n;
    }

    pub fn add_deleted_node(&self) {
        self.lock().deleted_nodes += 1;
    }

    /// A create, update or delete by a mirror controller.
    pub fn add_mirror_write(&self, controller: &str, op: &'static str) {
        *self
            .lock()
            .mirror_writes
            .entry((controller.to_string(), op))
            .or_default() += 1;
    }

    pub fn add_error(&self, controller: &str) {
        *self
            .lock()
            .errors
            .entry(controller.to_string())
            .or_default() += 1;
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let i = self.lock();
        let mut out = i.ipam.clone();
        header(
            &mut out,
            "ipam_allocations_gc_reclamations",
            "counter",
            "The total allocations that have been reclaimed by the garbage collector over time.",
        );
        series(&mut out, "ipam_allocations_gc_reclamations", &i.reclaimed);
        for (name, help, v) in [
            (
                "margay_kube_controllers_ipam_scans_total",
                "IPAM garbage collection scans completed.",
                i.scans,
            ),
            (
                "margay_kube_controllers_released_affinities_total",
                "Block affinities released (deleted nodes, empty blocks).",
                i.released_affinities,
            ),
            (
                "margay_kube_controllers_deleted_nodes_total",
                "Calico Nodes deleted because their Kubernetes Node was gone (etcd).",
                i.deleted_nodes,
            ),
        ] {
            header(&mut out, name, "counter", help);
            let _ = writeln!(out, "{name} {v}");
        }
        header(
            &mut out,
            "margay_kube_controllers_mirror_writes_total",
            "counter",
            "Writes of the etcd-mode mirror controllers.",
        );
        for ((c, op), v) in &i.mirror_writes {
            let _ = writeln!(
                out,
                "margay_kube_controllers_mirror_writes_total{{controller=\"{}\",op=\"{op}\"}} {v}",
                escape(c)
            );
        }
        header(
            &mut out,
            "margay_kube_controllers_errors_total",
            "counter",
            "Failed reconciliations per controller (each is retried).",
        );
        for (c, v) in &i.errors {
            let _ = writeln!(
                out,
                "margay_kube_controllers_errors_total{{controller=\"{}\"}} {v}",
                escape(c)
            );
        }
        out
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
        m.set_ipam(String::new());
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
}
