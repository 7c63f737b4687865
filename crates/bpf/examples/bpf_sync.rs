//! Benchmark (root): how long the eBPF dataplane takes to load a large policy set into its
//! maps, and a policy change and a membership change into the kernel.
//!
//! `cargo run --release -p margay-bpf --example bpf_sync [POLICIES [ENDPOINTS]]`
//! (default 1000 policies × 100 endpoints, each policy applying to every endpoint). Maps
//! only: programs are not attached (that needs interfaces); the map writes are the cost.
//! Uses a private bpffs on a temporary directory.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use margay_api::net::Cidr;
use margay_bpf::layout::{Block, Endpoint, IpSetEntry, Rule, StepEnc};
use margay_bpf::loader::{BpfMaps, ensure_bpffs};
use margay_bpf::sync::{Kernel, Syncer};
use margay_calc::{
    DataplaneModel, IpSetKind, IpSetMember, PolicyId, PortRange, ResolvedMatch, ResolvedPolicy,
    ResolvedProfile, ResolvedRule, RuleAction, TierInfo, WorkloadEndpointData, WorkloadEndpointId,
};

/// The real maps with interfaces faked (ifindex = position), nothing attached.
struct MapsOnly(BpfMaps, Vec<String>);

impl Kernel for MapsOnly {
    type Error = margay_bpf::loader::KernelError;
    fn interfaces(&self) -> Vec<(String, u32)> {
        self.1
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), 1000 + i as u32))
            .collect()
    }
    fn ifindex(&self, iface: &str) -> Option<u32> {
        self.1
            .iter()
            .position(|n| n == iface)
            .map(|i| 1000 + i as u32)
    }
    fn attach(&mut self, _: &str, _: u32) -> Result<(), Self::Error> {
        Ok(())
    }
    fn detach(&mut self, _: &str) {}
    fn put_rule(&mut self, s: u32, i: u32, r: &Rule) -> Result<(), Self::Error> {
        self.0.put_rule(s, i, r)
    }
    fn del_rule(&mut self, s: u32, i: u32) -> Result<(), Self::Error> {
        self.0.del_rule(s, i)
    }
    fn put_step(&mut self, s: u32, i: u32, st: &StepEnc) -> Result<(), Self::Error> {
        self.0.put_step(s, i, st)
    }
    fn del_step(&mut self, s: u32, i: u32) -> Result<(), Self::Error> {
        self.0.del_step(s, i)
    }
    fn put_block(&mut self, id: u32, b: &Block) -> Result<(), Self::Error> {
        self.0.put_block(id, b)
    }
    fn del_block(&mut self, id: u32) -> Result<(), Self::Error> {
        self.0.del_block(id)
    }
    fn put_endpoint(&mut self, i: u32, e: &Endpoint) -> Result<(), Self::Error> {
        self.0.put_endpoint(i, e)
    }
    fn del_endpoint(&mut self, i: u32) -> Result<(), Self::Error> {
        self.0.del_endpoint(i)
    }
    fn put_set_entry(&mut self, e: &IpSetEntry) -> Result<(), Self::Error> {
        self.0.put_set_entry(e)
    }
    fn del_set_entry(&mut self, e: &IpSetEntry) -> Result<(), Self::Error> {
        self.0.del_set_entry(e)
    }
}

fn policy(i: usize, port: u16) -> Arc<ResolvedPolicy> {
    policy_from(i % 50, port)
}

fn policy_from(set: usize, port: u16) -> Arc<ResolvedPolicy> {
    let rule = ResolvedRule {
        action: RuleAction::Allow,
        ip_version: None,
        protocol: Some(6),
        not_protocol: None,
        icmp: None,
        not_icmp: None,
        src: ResolvedMatch {
            ip_set_ids: vec![format!("s:{set}")],
            ..ResolvedMatch::default()
        },
        dst: ResolvedMatch {
            ports: vec![PortRange {
                first: port,
                last: port,
            }],
            ..ResolvedMatch::default()
        },
        rule_id: String::new(),
    };
    Arc::new(ResolvedPolicy {
        tier: "default".into(),
        inbound: vec![rule],
        ..ResolvedPolicy::default()
    })
}

fn pid(i: usize) -> PolicyId {
    PolicyId {
        tier: "default".into(),
        namespace: String::new(),
        name: format!("p{i}"),
    }
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (np, ne) = (
        args.first().copied().unwrap_or(1000),
        args.get(1).copied().unwrap_or(100),
    );
    let dir = tempfile::tempdir().unwrap();
    ensure_bpffs(dir.path()).unwrap();
    let mut m = DataplaneModel::default();
    for s in 0..50 {
        let members: BTreeSet<IpSetMember> = (0..20)
            .map(|k| IpSetMember::Net(Cidr::parse(&format!("10.{s}.{k}.0/24")).unwrap()))
            .collect();
        m.ip_sets
            .insert(format!("s:{s}"), (IpSetKind::Net, members));
    }
    for i in 0..np {
        m.policies.insert(pid(i), policy(i, 1000 + i as u16));
    }
    m.profiles
        .insert("prof".into(), Arc::new(ResolvedProfile::default()));
    let mut names = Vec::new();
    for e in 0..ne {
        let iface = format!("cali{e:07}");
        names.push(iface.clone());
        m.workload_endpoints.insert(
            WorkloadEndpointId {
                orchestrator: "k8s".into(),
                workload: format!("ns/pod{e}"),
                endpoint: "eth0".into(),
            },
            Arc::new(WorkloadEndpointData {
                interface: iface,
                mac: String::new(),
                ipv4_nets: vec![
                    Cidr::parse(&format!("10.200.{}.{}/32", e / 250, e % 250 + 1)).unwrap(),
                ],
                ipv6_nets: vec![],
                profile_ids: vec!["prof".into()],
                tiers: vec![TierInfo {
                    name: "default".into(),
                    default_action: RuleAction::Deny,
                    ingress_policies: (0..np).map(pid).collect(),
                    egress_policies: vec![],
                }],
                name: format!("pod{e}"),
                namespace: "ns".into(),
                allow_spoofed_source_prefixes: vec![],
            }),
        );
    }
    let t = Instant::now();
    let maps = BpfMaps::load(dir.path()).unwrap();
    let load = t.elapsed();
    let mut k = MapsOnly(maps, names);
    let mut s = Syncer::default();
    let t = Instant::now();
    let r = s.sync(&m, &mut k).unwrap();
    let cold = t.elapsed();
    println!(
        "load+verify: {load:?}; cold start {np} policies x {ne} endpoints: {cold:?} \
         ({} rules in {} blocks, {} steps, {} set entries written)",
        r.rules_written, r.blocks_flipped, r.steps_written, r.set_entries_added
    );
    // Policy changes: one policy's source set (same ports), 20 times.
    let mut times = Vec::new();
    for n in 0..20 {
        let port = 1000 + (n % np) as u16;
        m.policies
            .insert(pid(n % np), policy_from((n + 1 + n % np) % 50, port));
        let t = Instant::now();
        let r = s.sync(&m, &mut k).unwrap();
        times.push(t.elapsed());
        // One block (the policy, stored once) rewritten; no endpoint touched.
        assert_eq!((r.blocks_flipped, r.endpoints_flipped), (1, 0), "{r:?}");
    }
    println!(
        "policy change (its source set) applying to all {ne} endpoints: p50 {:?}, p99 {:?}",
        pct(&mut times, 0.5),
        pct(&mut times, 0.99)
    );
    // A policy's port changes: the block flips, then the endpoints whose per-hook index
    // names it get new steps and index (unindexed ones, beyond the index budget, do not).
    let mut times = Vec::new();
    let mut flipped = 0;
    for n in 0..20 {
        m.policies
            .insert(pid(n % np), policy(n % np, 30000 + n as u16));
        let t = Instant::now();
        let r = s.sync(&m, &mut k).unwrap();
        times.push(t.elapsed());
        assert_eq!(r.blocks_flipped, 1, "{r:?}");
        flipped = r.endpoints_flipped;
    }
    println!(
        "policy change (its port) applying to all {ne} endpoints: p50 {:?}, p99 {:?} \
         ({flipped} indexed endpoints rewritten)",
        pct(&mut times, 0.5),
        pct(&mut times, 0.99)
    );
    // Membership changes: one member added to a set, 100 times.
    let mut times = Vec::new();
    for n in 0..100 {
        if let Some((_, set)) = m.ip_sets.get_mut("s:0") {
            set.insert(IpSetMember::Net(
                Cidr::parse(&format!("10.250.{}.{}/32", n / 250, n % 250)).unwrap(),
            ));
        }
        let t = Instant::now();
        let r = s.sync(&m, &mut k).unwrap();
        times.push(t.elapsed());
        assert_eq!((r.set_entries_added, r.rules_written), (1, 0));
    }
    println!(
        "IP-set membership change: p50 {:?}, p99 {:?} (whole-model compile and diff included)",
        pct(&mut times, 0.5),
        pct(&mut times, 0.99)
    );
    // A restart: a new loader and syncer adopt what the maps hold, then the first sync.
    let names = k.1.clone();
    drop(k);
    drop(s);
    let t = Instant::now();
    let mut maps = BpfMaps::load(dir.path()).unwrap();
    let restored = maps.take_restored();
    let mut k = MapsOnly(maps, names);
    let mut s = Syncer::default();
    let a = s.adopt(restored, &k);
    let adopted = t.elapsed();
    let r = s.sync(&m, &mut k).unwrap();
    println!(
        "restart: load+verify+adopt {adopted:?} ({} endpoints, {} blocks, {} rules read), \
         in sync after {:?} (first sync: {} rules in {} blocks, {} steps, {} endpoints flipped)",
        a.endpoints,
        a.blocks,
        a.rules,
        t.elapsed(),
        r.rules_written,
        r.blocks_flipped,
        r.steps_written,
        r.endpoints_flipped
    );
    drop(k);
    let _ = std::process::Command::new("umount")
        .arg("-l")
        .arg(dir.path())
        .status();
}
