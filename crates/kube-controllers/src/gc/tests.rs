#![allow(clippy::unwrap_used)]
use super::*;
use crate::pods::EndpointData;

fn cidr(s: &str) -> Cidr {
    Cidr::parse(s).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn pod_attrs(node: &str, ns: &str, pod: &str) -> BTreeMap<String, String> {
    attrs(&[("node", node), ("namespace", ns), ("pod", pod)])
}

fn tunnel_attrs(node: &str) -> BTreeMap<String, String> {
    attrs(&[("node", node), ("type", "vxlanTunnelAddress")])
}

/// A running pod holding `ips` on `node`.
fn pod(ns: &str, name: &str, node: &str, ips: &[&str]) -> PodView {
    PodView {
        namespace: ns.into(),
        name: name.into(),
        node: node.into(),
        host_network: false,
        has_pod_ip: !ips.is_empty(),
        ips_reported: !ips.is_empty(),
        evicted: false,
        endpoint_ips: Some(ips.iter().map(|i| ip(i)).collect()),
        endpoint: Some(EndpointData {
            name: format!("{node}-k8s-{name}-eth0"),
            labels: BTreeMap::new(),
            service_account: String::new(),
        }),
    }
}

struct Fixture {
    blocks: Vec<AllocationBlock>,
    affinities: Vec<(String, Cidr)>,
    pods: HashMap<String, PodView>,
    nodes: HashSet<String>,
    calico: Option<HashMap<String, Option<String>>>,
    grace: Option<Duration>,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture {
            blocks: vec![AllocationBlock::new(cidr("10.0.0.0/26"), Some("n1"))],
            affinities: vec![("n1".into(), cidr("10.0.0.0/26"))],
            pods: HashMap::new(),
            nodes: ["n1".to_string()].into(),
            calico: None,
            grace: Some(Duration::from_secs(10)),
        }
    }

    fn assign(&mut self, block: usize, addr: &str, handle: &str, a: BTreeMap<String, String>) {
        self.blocks[block].assign_ip(ip(addr), handle, &a).unwrap();
    }

    fn add_pod(&mut self, p: PodView) {
        self.pods.insert(pod_key(&p.namespace, &p.name), p);
    }

    fn scan(&self, st: &mut GcState, now: Instant) -> ScanOutcome {
        let names = match &self.calico {
            Some(m) => NodeNames::Calico(m),
            None => NodeNames::Same,
        };
        st.scan(&ScanInput {
            blocks: &self.blocks,
            affinities: &self.affinities,
            world: World {
                pods: &self.pods,
                nodes: &self.nodes,
                node_names: names,
            },
            grace: self.grace,
            now,
        })
    }

    fn recheck(&self, st: &mut GcState, r: Vec<Release>, now: Instant) -> Vec<Release> {
        let names = match &self.calico {
            Some(m) => NodeNames::Calico(m),
            None => NodeNames::Same,
        };
        let world = World {
            pods: &self.pods,
            nodes: &self.nodes,
            node_names: names,
        };
        st.recheck(r, &world, now)
    }
}

fn released_ips(o: &ScanOutcome) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = o.releases.iter().map(|r| r.allocation.key.ip).collect();
    v.sort();
    v
}

#[test]
fn deleted_pod_on_live_node_is_released_only_after_the_grace_period() {
    let mut f = Fixture::new();
    f.assign(
        0,
        "10.0.0.1",
        "k8s-pod-network.a",
        pod_attrs("n1", "ns", "a"),
    );
    f.assign(
        0,
        "10.0.0.2",
        "k8s-pod-network.b",
        pod_attrs("n1", "ns", "b"),
    );
    f.add_pod(pod("ns", "b", "n1", &["10.0.0.2"]));
    let mut st = GcState::default();
    let t0 = Instant::now();
    let g = Duration::from_secs(10);
    let o = f.scan(&mut st, t0);
    assert_eq!((o.allocations, o.flagged), (2, 1));
    assert!(o.releases.is_empty());
    assert_eq!(o.next_due, Some(t0 + g + Duration::from_millis(1)));
    // Grace periods are "longer than": at exactly the period, still a candidate.
    let o = f.scan(&mut st, t0 + g);
    assert!(o.releases.is_empty());
    let o = f.scan(&mut st, t0 + g + Duration::from_millis(1));
    assert_eq!(released_ips(&o), vec![ip("10.0.0.1")]);
    assert_eq!(o.releases[0].reason, Confirmed::GracePeriod);
    assert_eq!(o.flagged, 1);
    assert_eq!(o.next_due, None);
}

#[test]
fn a_pod_that_comes_back_resets_the_timer() {
    let mut f = Fixture::new();
    f.assign(0, "10.0.0.1", "h", pod_attrs("n1", "ns", "a"));
    let mut st = GcState::default();
    let t0 = Instant::now();
    f.scan(&mut st, t0);
    f.add_pod(pod("ns", "a", "n1", &["10.0.0.1"]));
    let o = f.scan(&mut st, t0 + Duration::from_secs(5));
    assert_eq!(o.flagged, 0);
    f.pods.clear();
    let t2 = t0 + Duration::from_secs(8);
    f.scan(&mut st, t2);
    let o = f.scan(&mut st, t0 + Duration::from_secs(11));
    assert!(o.releases.is_empty(), "the timer restarted at {t2:?}");
    let o = f.scan(&mut st, t2 + Duration::from_secs(11));
    assert_eq!(released_ips(&o), vec![ip("10.0.0.1")]);
}

#[test]
fn node_gone_confirms_at_once_and_cleans_the_node() {
    let mut f = Fixture::new();
    f.assign(0, "10.0.0.1", "h1", pod_attrs("n1", "ns", "a"));
    f.assign(0, "10.0.0.2", "vxlan-tunnel-addr-n1", tunnel_attrs("n1"));
    f.nodes.clear();
    let mut st = GcState::default();
    let o = f.scan(&mut st, Instant::now());
    assert_eq!(released_ips(&o), vec![ip("10.0.0.1"), ip("10.0.0.2")]);
    assert!(o.releases.iter().all(|r| r.reason == Confirmed::NodeGone));
    assert_eq!(o.nodes_to_clean, vec!["n1".to_string()]);
}

#[test]
fn node_gone_with_a_live_pod_keeps_everything() {
    let mut f = Fixture::new();
    f.assign(0, "10.0.0.1", "h1", pod_attrs("n1", "ns", "a"));
    f.assign(0, "10.0.0.2", "h2", pod_attrs("n1", "ns", "b"));
    f.assign(0, "10.0.0.3", "vxlan-tunnel-addr-n1", tunnel_attrs("n1"));
    f.add_pod(pod("ns", "b", "n1", &["10.0.0.2"]));
    f.nodes.clear();
    let mut st = GcState::default();
    let o = f.scan(&mut st, Instant::now());
    // The dead pod's address goes; the live pod's and the tunnel address stay.
    assert_eq!(released_ips(&o), vec![ip("10.0.0.1")]);
    assert!(o.nodes_to_clean.is_empty());
    assert!(!st.is_flagged(&AllocKey {
        ip: ip("10.0.0.3"),
        handle: Some("vxlan-tunnel-addr-n1".into()),
        sequence_number: 0
    }));
}

#[test]
fn tunnel_addresses_are_valid_while_their_node_exists() {
    let mut f = Fixture::new();
    f.assign(0, "10.0.0.3", "vxlan-tunnel-addr-n1", tunnel_attrs("n1"));
    let mut st = GcState::default();
    let t0 = Instant::now();
    for s in [0, 100, 10_000] {
        let o = f.scan(&mut st, t0 + Duration::from_secs(s));
        assert_eq!((o.flagged, o.releases.len()), (0, 0));
    }
}

#[test]
fn a_handle_with_one_live_address_is_never_released() {
    let mut f = Fixture::new();
    f.blocks
        .push(AllocationBlock::new(cidr("fd00::/122"), Some("n1")));
    // A dual-stack pod whose status reports only the IPv4 address.
    f.assign(0, "10.0.0.1", "h", pod_attrs("n1", "ns", "a"));
    f.assign(1, "fd00::1", "h", pod_attrs("n1", "ns", "a"));
    f.add_pod(pod("ns", "a", "n1", &["10.0.0.1"]));
    let mut st = GcState::default();
    let t0 = Instant::now();
    for s in [0, 11, 100, 1000] {
        let o = f.scan(&mut st, t0 + Duration::from_secs(s));
        assert!(o.releases.is_empty());
    }
    assert_eq!(st.flagged(), 1, "the IPv6 address is a (confirmed) leak…");
    // …released once the pod holds neither.
    f.pods.clear();
    f.scan(&mut st, t0 + Duration::from_secs(1001));
    let o = f.scan(&mut st, t0 + Duration::from_secs(1012));
    assert_eq!(released_ips(&o), vec![ip("10.0.0.1"), ip("fd00::1")]);
}

#[test]
fn allocations_of_unknown_origin_are_never_flagged_and_keep_their_node() {
    let mut f = Fixture::new();
    f.assign(0, "10.0.0.1", "manual", attrs(&[("node", "n1")]));
    f.assign(0, "10.0.0.2", "nonode", pod_attrs("", "ns", "gone"));
    f.assign(
        0,
        "10.0.0.3",
        WINDOWS_RESERVED_HANDLE,
        pod_attrs("n1", "ns", "x"),
    );
    f.nodes.clear();
    let mut st = GcState::default();
    let o = f.scan(&mut st, Instant::now());
    assert_eq!(o.flagged, 0);
    assert!(o.releases.is_empty());
    assert!(o.nodes_to_clean.is_empty());
}

#[test]
fn grace_unset_or_zero() {
    let mut f = Fixture::new();
    f.assign(0, "10.0.0.1", "h", pod_attrs("n1", "ns", "a"));
    let t0 = Instant::now();
    f.grace = None;
    let mut st = GcState::default();
    let o = f.scan(&mut st, t0);
    assert_eq!(o.flagged, 0);
    f.grace = Some(Duration::ZERO);
    for s in [0, 10, 10_000] {
        let o = f.scan(&mut st, t0 + Duration::from_secs(s));
        assert_eq!((o.flagged, o.releases.len(), o.next_due), (1, 0, None));
    }
    // A node that is gone needs no grace period, whatever it is.
    f.nodes.clear();
    f.grace = None;
    let o = f.scan(&mut st, t0);
    assert_eq!(released_ips(&o), vec![ip("10.0.0.1")]);
}

#[test]
fn pod_rescheduled_elsewhere_no_longer_holds_the_old_address() {
    let mut f = Fixture::new();
    f.nodes.insert("n2".into());
    f.assign(0, "10.0.0.1", "h", pod_attrs("n1", "ns", "a"));
    f.add_pod(pod("ns", "a", "n2", &["10.0.0.1"]));
    let mut st = GcState::default();
    let o = f.scan(&mut st, Instant::now());
    assert_eq!(o.flagged, 1);
}

#[test]
fn etcd_node_names_come_from_orch_refs() {
    let mut f = Fixture::new();
    f.blocks
        .push(AllocationBlock::new(cidr("10.0.1.0/26"), Some("c2")));
    f.assign(0, "10.0.0.1", "h1", pod_attrs("n1", "ns", "a"));
    f.assign(1, "10.0.1.1", "h2", pod_attrs("c2", "ns", "b"));
    f.assign(1, "10.0.1.2", "h3", pod_attrs("gone", "ns", "c"));
    f.nodes = ["k2".to_string()].into();
    // n1: not a Kubernetes node; c2 is Kubernetes node k2 (which exists); "gone" has no
    // Calico Node at all.
    f.calico = Some(HashMap::from([
        ("n1".to_string(), None),
        ("c2".to_string(), Some("k2".to_string())),
    ]));
    let mut st = GcState::default();
    let o = f.scan(&mut st, Instant::now());
    assert_eq!(released_ips(&o), vec![ip("10.0.1.2")]);
    assert_eq!(o.flagged, 2, "b is a candidate, c confirmed, a untouched");
    assert_eq!(o.nodes_to_clean, vec!["gone".to_string()]);
}

#[test]
fn a_reallocated_address_starts_from_scratch() {
    let mut f = Fixture::new();
    f.assign(0, "10.0.0.1", "h", pod_attrs("n1", "ns", "a"));
    let first = f.blocks[0].sequence_number_for(1);
    let mut st = GcState::default();
    let t0 = Instant::now();
    f.scan(&mut st, t0);
    // Released and handed out again to the same handle (new sequence number).
    f.blocks[0].release(ip("10.0.0.1"), None).unwrap();
    f.assign(0, "10.0.0.1", "h", pod_attrs("n1", "ns", "a"));
    f.scan(&mut st, t0 + Duration::from_secs(5));
    let o = f.scan(&mut st, t0 + Duration::from_secs(11));
    assert!(o.releases.is_empty());
    let o = f.scan(&mut st, t0 + Duration::from_secs(16));
    assert_eq!(released_ips(&o), vec![ip("10.0.0.1")]);
    assert_ne!(o.releases[0].allocation.key.sequence_number, first);
}

#[test]
fn empty_blocks_lose_their_affinity_but_never_the_last_one() {
    let mut f = Fixture::new();
    f.blocks
        .push(AllocationBlock::new(cidr("10.0.1.0/26"), Some("n1")));
    f.blocks
        .push(AllocationBlock::new(cidr("10.0.2.0/26"), Some("n1")));
    f.blocks
        .push(AllocationBlock::new(cidr("10.0.3.0/26"), Some("n3")));
    f.nodes.insert("n3".into());
    f.assign(2, "10.0.2.1", "m", attrs(&[("node", "n1")]));
    let mut st = GcState::default();
    let t0 = Instant::now();
    let o = f.scan(&mut st, t0);
    assert!(o.empty_blocks.is_empty());
    assert_eq!(o.next_due, Some(t0 + Duration::from_millis(10_001)));
    let o = f.scan(&mut st, t0 + Duration::from_secs(11));
    // n1 has three blocks, two empty: both may go (one non-empty stays); n3's only block
    // stays.
    assert_eq!(
        o.empty_blocks,
        vec![
            ("n1".to_string(), cidr("10.0.0.0/26")),
            ("n1".to_string(), cidr("10.0.1.0/26"))
        ]
    );
    // Two empty blocks and nothing else: only one goes.
    f.blocks[2].release(ip("10.0.2.1"), None).unwrap();
    f.blocks.remove(0);
    let o = f.scan(&mut st, t0 + Duration::from_secs(30));
    assert_eq!(o.empty_blocks.len(), 1);
    // A block that fills up again restarts its timer.
    f.assign(0, "10.0.1.7", "m", attrs(&[("node", "n1")]));
    f.scan(&mut st, t0 + Duration::from_secs(31));
    f.blocks[0].release(ip("10.0.1.7"), None).unwrap();
    let o = f.scan(&mut st, t0 + Duration::from_secs(32));
    assert!(
        !o.empty_blocks
            .iter()
            .any(|(_, c)| *c == cidr("10.0.1.0/26"))
    );
}

#[test]
fn recheck_drops_what_came_back_and_whole_handles() {
    let mut f = Fixture::new();
    f.blocks
        .push(AllocationBlock::new(cidr("fd00::/122"), Some("n1")));
    f.assign(0, "10.0.0.1", "h", pod_attrs("n1", "ns", "a"));
    f.assign(1, "fd00::1", "h", pod_attrs("n1", "ns", "a"));
    f.assign(0, "10.0.0.2", "h2", pod_attrs("n1", "ns", "b"));
    f.assign(0, "10.0.0.3", "h3", pod_attrs("n1", "ns", "c"));
    f.nodes.clear();
    let mut st = GcState::default();
    let t0 = Instant::now();
    let o = f.scan(&mut st, t0);
    assert_eq!(o.releases.len(), 4);
    // Fresh read: pod a is back holding its IPv6 address only (a lagging cache had missed
    // it); n1 is back too; c is still gone.
    f.add_pod(pod("ns", "a", "n1", &["fd00::1"]));
    f.nodes.insert("n1".into());
    let left = f.recheck(&mut st, o.releases.clone(), t0);
    // a's IPv4 address is still not held, but its handle holds a live one: all of h stays.
    // b and c were confirmed because n1 was gone: only candidates now.
    assert!(left.is_empty());
    assert_eq!(st.flagged(), 3);
    assert!(!st.is_confirmed(&o.releases[0].allocation.key));
    // Nothing changed on a second look: everything passes.
    f.pods.clear();
    f.nodes.clear();
    let mut st = GcState::default();
    let o = f.scan(&mut st, t0);
    let left = f.recheck(&mut st, o.releases.clone(), t0);
    assert_eq!(left, o.releases);
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    /// A random cluster: 4 nodes (some gone), pods (some gone, some holding their address,
    /// some not yet reporting, some holding another one), tunnel and unknown allocations.
    #[derive(Debug, Clone)]
    struct Alloc {
        node: usize,
        kind: u8,
        pod: usize,
        pod_state: u8,
        handle: usize,
    }

    fn world_strategy() -> impl Strategy<Value = (Vec<bool>, Vec<Alloc>, Vec<u64>)> {
        (
            proptest::collection::vec(any::<bool>(), 4),
            proptest::collection::vec(
                (0usize..5, 0u8..4, 0usize..30, 0u8..5, 0usize..40).prop_map(
                    |(node, kind, pod, pod_state, handle)| Alloc {
                        node,
                        kind,
                        pod,
                        pod_state,
                        handle,
                    },
                ),
                0..60,
            ),
            proptest::collection::vec(0u64..30, 1..6),
        )
    }

    proptest! {
        /// Whatever the cluster and the timing, nothing released is in use: every released
        /// allocation is invalid in the world the scan saw, and no address of its handle is
        /// valid.
        #[test]
        fn never_releases_a_live_address((alive, list, steps) in world_strategy()) {
            let mut f = Fixture::new();
            f.blocks = (0..4).map(|n| AllocationBlock::new(cidr(&format!("10.0.{n}.0/26")), Some(&format!("n{n}")))).collect();
            f.affinities.clear();
            f.nodes = (0..4).filter(|n| alive[*n]).map(|n| format!("n{n}")).collect();
            for (i, a) in list.iter().enumerate() {
                let node = if a.node == 4 { String::new() } else { format!("n{}", a.node) };
                let block = i % 4;
                let addr = format!("10.0.{block}.{}", i / 4 + 1);
                let at = match a.kind {
                    0 | 1 => pod_attrs(&node, "ns", &format!("p{}", a.pod)),
                    2 => tunnel_attrs(&node),
                    _ => attrs(&[("node", &node)]),
                };
                f.assign(block, &addr, &format!("h{}", a.handle), at.clone());
                if a.kind <= 1 {
                    let key = pod_key("ns", &format!("p{}", a.pod));
                    match a.pod_state {
                        0 => {}
                        1 => { f.pods.entry(key).or_insert_with(|| pod("ns", &format!("p{}", a.pod), &node, &[])); }
                        2 => {
                            let p = f.pods.entry(key).or_insert_with(|| pod("ns", &format!("p{}", a.pod), &node, &[]));
                            p.ips_reported = true;
                            p.endpoint_ips.get_or_insert_with(Vec::new).push(ip(&addr));
                        }
                        _ => {
                            let p = f.pods.entry(key).or_insert_with(|| pod("ns", &format!("p{}", a.pod), &node, &[]));
                            p.ips_reported = true;
                        }
                    }
                }
            }
            let world_allocs = allocations(&f.blocks);
            let mut st = GcState::default();
            let t0 = Instant::now();
            let mut t = t0;
            for s in steps {
                t += Duration::from_secs(s);
                let o = f.scan(&mut st, t);
                let names = NodeNames::Same;
                let world = World { pods: &f.pods, nodes: &f.nodes, node_names: names };
                let left = st.recheck(o.releases.clone(), &world, t);
                prop_assert_eq!(&left, &o.releases, "re-checking the same world changes nothing");
                for r in &o.releases {
                    let a = &r.allocation;
                    let handle_live = world_allocs.iter()
                        .filter(|b| b.key.handle == a.key.handle)
                        .any(|b| match world.lookup(b.node()) {
                            NodeLookup::Skip => true,
                            NodeLookup::Node { knode, exists } =>
                                (b.pod().is_none() && !b.is_tunnel())
                                    || world.valid(b, knode.as_deref(), exists),
                        });
                    prop_assert!(!handle_live, "released {:?} of a live handle", a.key);
                    if r.reason == Confirmed::GracePeriod {
                        prop_assert!(t.duration_since(t0) > Duration::from_secs(10));
                    }
                }
            }
        }
    }
}
