//! Render time at cluster scale:
//!
//! - `mesh`: 1,000 nodes in the full node-to-node mesh (999 sessions) plus 10 global
//!   BGPPeers with BGPFilters, 4 pools and 8 affine blocks: one node's two files.
//! - `rr`: 1,000 nodes, mesh off, 10 route reflectors; one BGPPeer (peerSelector) gives each
//!   of the 990 clients 10 sessions per family, and each reflector the reverse sessions to
//!   every node: every node's configuration, one after another.
//!
//! `cargo run --release -p margay-confd --example render_bench`
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use margay_api::bgp::{
    BGPConfigurationSpec, BGPFilterSpec, BGPPeerSpec, BgpFilterAction, BgpFilterRule, MatchOperator,
};
use margay_api::endpoint::{NodeBgpSpec, NodeSpec};
use margay_api::ippool::{EncapMode, IPPoolSpec};
use margay_api::net::Cidr;
use margay_api::numorstring::AsNumber;
use margay_api::{BGPConfiguration, BGPFilter, BGPPeer, IPPool, Node, ObjectMeta};
use margay_confd::{BirdInputs, render};
use margay_ipam::block::AffinityState;

const NODES: usize = 1000;

fn meta(name: &str, labels: &[(&str, String)]) -> ObjectMeta {
    ObjectMeta {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect::<BTreeMap<_, _>>(),
        ..ObjectMeta::default()
    }
}

fn cluster(mesh: bool) -> BirdInputs {
    let mut inp = BirdInputs::new("node-0");
    for i in 0..NODES {
        let name = format!("node-{i}");
        let spec = NodeSpec {
            bgp: Some(NodeBgpSpec {
                ipv4_address: format!("10.1.{}.{}/16", i / 250, i % 250 + 1),
                ipv6_address: format!("fd00::{:x}/64", i + 1),
                ..NodeBgpSpec::default()
            }),
            ..NodeSpec::default()
        };
        let rr = !mesh && i < 10;
        let mut spec = spec;
        if rr && let Some(b) = spec.bgp.as_mut() {
            b.route_reflector_cluster_id = "224.0.0.1".into();
        }
        let labels: Vec<(&str, String)> = if rr {
            vec![("route-reflector", "true".into())]
        } else {
            Vec::new()
        };
        inp.nodes
            .insert(name.clone(), Node::new(meta(&name, &labels), spec));
    }
    inp.bgp_configs.insert(
        "default".into(),
        BGPConfiguration::new(
            meta("default", &[]),
            BGPConfigurationSpec {
                node_to_node_mesh_enabled: Some(mesh),
                ..BGPConfigurationSpec::default()
            },
        ),
    );
    for f in 0..10 {
        let name = format!("filter-{f}");
        let rule = |action, cidr: String| BgpFilterRule {
            cidr,
            prefix_length: None,
            source: None,
            interface: String::new(),
            match_operator: Some(MatchOperator::In),
            peer_type: None,
            communities: None,
            as_path_prefix: Vec::new(),
            priority: None,
            action,
            operations: Vec::new(),
        };
        let spec = BGPFilterSpec {
            import_v4: vec![rule(
                BgpFilterAction::Reject,
                format!("10.{}.0.0/16", 100 + f),
            )],
            export_v4: vec![rule(BgpFilterAction::Accept, "10.65.0.0/16".into())],
            ..BGPFilterSpec::default()
        };
        inp.filters
            .insert(name.clone(), BGPFilter::new(meta(&name, &[]), spec));
    }
    if mesh {
        for p in 0..10 {
            let name = format!("peer-{p}");
            let spec = BGPPeerSpec {
                peer_ip: format!("192.0.2.{}", p + 1),
                as_number: Some(AsNumber(65000 + p)),
                filters: vec![format!("filter-{p}")],
                ..BGPPeerSpec::default()
            };
            inp.peers
                .insert(name.clone(), BGPPeer::new(meta(&name, &[]), spec));
        }
    } else {
        let spec = BGPPeerSpec {
            node_selector: "all()".into(),
            peer_selector: "route-reflector == 'true'".into(),
            filters: vec!["filter-0".into()],
            ..BGPPeerSpec::default()
        };
        inp.peers
            .insert("to-rrs".into(), BGPPeer::new(meta("to-rrs", &[]), spec));
    }
    for (i, (cidr, vxlan)) in [
        ("10.65.0.0/16", false),
        ("10.66.0.0/16", true),
        ("fd00:65::/48", false),
        ("fd00:66::/48", true),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("pool-{i}");
        let spec = IPPoolSpec {
            cidr: cidr.into(),
            vxlan_mode: vxlan.then_some(EncapMode::Always),
            ..IPPoolSpec::default()
        };
        inp.pools
            .insert(name.clone(), IPPool::new(meta(&name, &[]), spec));
    }
    for b in 0..8 {
        inp.affinities.insert(
            Cidr::parse(&format!("10.65.{b}.0/26")).unwrap(),
            AffinityState::Confirmed,
        );
    }
    inp
}

fn stats(mut d: Vec<Duration>) -> (Duration, Duration, Duration) {
    d.sort();
    (d[0], d[d.len() / 2], d[d.len() - 1])
}

fn main() {
    let inp = cluster(true);
    let mut times = Vec::new();
    let mut size = 0;
    let mut peers = 0;
    for _ in 0..20 {
        let t = Instant::now();
        let cfg = render(&inp).unwrap();
        times.push(t.elapsed());
        size = cfg.bird.len() + cfg.bird6.len();
        peers = cfg.peers_v4 + cfg.peers_v6;
    }
    let (min, med, max) = stats(times);
    println!(
        "mesh:  {NODES} nodes, full mesh + 10 global peers: {peers} sessions (v4+v6), {} KiB; render min {:.1} ms, median {:.1} ms, max {:.1} ms",
        size / 1024,
        min.as_secs_f64() * 1e3,
        med.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );

    let mut inp = cluster(false);
    let names: Vec<String> = inp.nodes.keys().cloned().collect();
    let mut times = Vec::new();
    let mut sessions = 0usize;
    let t_all = Instant::now();
    for n in &names {
        inp.node_name.clone_from(n);
        let t = Instant::now();
        let cfg = render(&inp).unwrap();
        times.push(t.elapsed());
        sessions += cfg.peers_v4 + cfg.peers_v6;
    }
    let all = t_all.elapsed();
    let (min, med, max) = stats(times);
    println!(
        "rr:    {NODES} nodes, 10 route reflectors, mesh off: {:.1} sessions per node on average; every node's config in {:.0} ms; per node min {:.2} ms, median {:.2} ms, max {:.2} ms (a reflector)",
        sessions as f64 / NODES as f64,
        all.as_secs_f64() * 1e3,
        min.as_secs_f64() * 1e3,
        med.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );
}
