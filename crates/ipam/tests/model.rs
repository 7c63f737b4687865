//! IPAM against the in-memory backend: random sequences of assignments and releases across
//! hosts and pools never hand out an address twice, never lose one, and end with a clean
//! `ipam check`.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use margay_api::ippool::IPPoolSpec;
use margay_api::{IPPool, IPReservation, ObjectMeta, Resource};
use margay_datastore::{Client, MemBackend};
use margay_ipam::{AssignArgs, Ipam, IpamError, ReleaseIp, Users, check};
use proptest::prelude::*;

async fn setup(strict: bool) -> Ipam<MemBackend> {
    let kv = MemBackend::new();
    let client = Client::new(kv.clone());
    for (name, cidr, block) in [
        ("pool-a", "10.0.0.0/26", 29),
        ("pool-b", "10.1.0.0/27", 30),
        ("pool-v6", "fd00::/120", 124),
    ] {
        client
            .create(Resource::from(IPPool::new(
                ObjectMeta::named(name),
                IPPoolSpec {
                    cidr: cidr.into(),
                    block_size: Some(block),
                    ..IPPoolSpec::default()
                },
            )))
            .await
            .unwrap();
    }
    client
        .create(Resource::from(IPReservation::new(
            ObjectMeta::named("res"),
            margay_api::ippool::IPReservationSpec {
                reserved_cidrs: vec!["10.0.0.8/30".into()],
            },
        )))
        .await
        .unwrap();
    if strict {
        client
            .create(Resource::from(margay_api::IPAMConfiguration::new(
                ObjectMeta::named("default"),
                margay_api::ippool::IPAMConfigurationSpec {
                    strict_affinity: true,
                    max_blocks_per_host: Some(3),
                    ..Default::default()
                },
            )))
            .await
            .unwrap();
    }
    Ipam::new(kv)
}

#[derive(Debug, Clone)]
enum Op {
    Assign {
        host: u8,
        handle: u8,
        v4: u8,
        v6: u8,
    },
    ReleaseHandle {
        handle: u8,
    },
    ReleaseIp {
        pick: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4, 0u8..20, 0u8..4, 0u8..2).prop_map(|(host, handle, v4, v6)| Op::Assign { host, handle, v4, v6 }),
        2 => (0u8..20).prop_map(|handle| Op::ReleaseHandle { handle }),
        1 => any::<usize>().prop_map(|pick| Op::ReleaseIp { pick }),
    ]
}

async fn verify(ipam: &Ipam<MemBackend>, model: &BTreeMap<String, BTreeSet<IpAddr>>) {
    // What the blocks say equals what the callers were told.
    let blocks = ipam.blocks().await.unwrap();
    let mut stored: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
    for b in &blocks {
        b.check().unwrap();
        for a in b.allocated() {
            let h = a.attribute.handle_id.clone().unwrap();
            assert!(stored.entry(h).or_default().insert(a.ip), "{} twice", a.ip);
        }
    }
    let expected: BTreeMap<String, BTreeSet<IpAddr>> = model
        .iter()
        .filter(|(_, s)| !s.is_empty())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(stored, expected);
    let mut users = Users::default();
    for (h, ips) in model {
        for ip in ips {
            users.add(*ip, h.clone());
        }
    }
    let handles = ipam.handles().await.unwrap();
    let report = check(&blocks, &handles, &users, &|_| true);
    assert!(report.is_clean(), "{report:#?}");
    assert!(report.stale_handles.is_empty(), "{report:#?}");
    // Handle records count exactly what they hold.
    for (id, h) in &handles {
        let total: usize = h.block.values().sum();
        assert_eq!(
            total,
            expected.get(id).map_or(0, BTreeSet::len),
            "handle {id}"
        );
    }
}

fn run(ops: Vec<Op>, strict: bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let ipam = setup(strict).await;
        let mut model: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Assign {
                    host,
                    handle,
                    v4,
                    v6,
                } => {
                    let mut args = AssignArgs::new(format!("h{handle}"), format!("host{host}"));
                    args.num_v4 = usize::from(v4);
                    args.num_v6 = usize::from(v6);
                    match ipam.auto_assign(&args).await {
                        Ok(got) => {
                            assert_eq!(got.v4.len(), usize::from(v4));
                            assert_eq!(got.v6.len(), usize::from(v6));
                            let set = model.entry(args.handle.clone()).or_default();
                            for a in got.all() {
                                assert!(
                                    !"10.0.0.8/30"
                                        .parse::<margay_api::net::Cidr>()
                                        .unwrap()
                                        .contains(a.ip),
                                    "reserved {}",
                                    a.ip
                                );
                                assert!(a.block.contains(a.ip));
                                assert!(set.insert(a.ip));
                            }
                        }
                        Err(IpamError::Exhausted { .. }) => {}
                        Err(e) => panic!("unexpected: {e}"),
                    }
                }
                Op::ReleaseHandle { handle } => {
                    let h = format!("h{handle}");
                    let released: BTreeSet<IpAddr> = ipam
                        .release_by_handle(&h)
                        .await
                        .unwrap()
                        .into_iter()
                        .collect();
                    assert_eq!(released, model.remove(&h).unwrap_or_default());
                }
                Op::ReleaseIp { pick } => {
                    let all: Vec<(String, IpAddr)> = model
                        .iter()
                        .flat_map(|(h, s)| s.iter().map(move |ip| (h.clone(), *ip)))
                        .collect();
                    if all.is_empty() {
                        continue;
                    }
                    let (h, ip) = all[pick % all.len()].clone();
                    let released = ipam
                        .release_ips(&[ReleaseIp {
                            ip,
                            sequence_number: None,
                        }])
                        .await
                        .unwrap();
                    assert_eq!(released, vec![ip]);
                    model.get_mut(&h).unwrap().remove(&ip);
                    // Releasing again is a no-op.
                    assert!(
                        ipam.release_ips(&[ReleaseIp {
                            ip,
                            sequence_number: None
                        }])
                        .await
                        .unwrap()
                        .is_empty()
                    );
                }
            }
            verify(&ipam, &model).await;
        }
        // Release everything: nothing may be left.
        let handles: Vec<String> = model.keys().cloned().collect();
        for h in handles {
            ipam.release_by_handle(&h).await.unwrap();
        }
        model.clear();
        verify(&ipam, &model).await;
        assert!(ipam.handles().await.unwrap().is_empty());
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn random_assign_release_never_duplicates_or_leaks(ops in prop::collection::vec(op(), 1..40)) {
        run(ops, false);
    }

    #[test]
    fn strict_affinity_never_duplicates_or_leaks(ops in prop::collection::vec(op(), 1..40)) {
        run(ops, true);
    }
}

#[tokio::test]
async fn fills_affine_blocks_then_claims_then_borrows() {
    let ipam = setup(false).await;
    // pool-a: /26 in /29 blocks = 8 blocks, 4 addresses reserved; pool-b: /27 in /30 = 8.
    let mut a = AssignArgs::new("first", "host-a");
    a.num_v4 = 3;
    let got = ipam.auto_assign(&a).await.unwrap();
    let block = got.v4[0].block;
    assert!(
        got.v4.iter().all(|x| x.block == block),
        "one block fills first: {got:?}"
    );
    let affs = ipam.affinities().await.unwrap();
    assert_eq!(affs.len(), 1);
    assert_eq!(affs[0].0, "host-a");
    // Exhaust everything from host-b: it claims blocks up to the pools' size, then borrows.
    let mut b = AssignArgs::new("bulk", "host-b");
    b.num_v4 = 64 + 32 - 4 - 3;
    let got = ipam.auto_assign(&b).await.unwrap();
    assert_eq!(got.v4.len(), 89);
    let borrowed = got.v4.iter().filter(|x| x.block == block).count();
    assert_eq!(borrowed, 5, "host-b borrowed the rest of host-a's block");
    let mut c = AssignArgs::new("one-more", "host-c");
    c.num_v4 = 1;
    let err = ipam.auto_assign(&c).await.unwrap_err();
    assert!(matches!(err, IpamError::Exhausted { .. }), "{err}");
    assert!(err.to_string().contains("no free address"), "{err}");
}

#[tokio::test]
async fn strict_affinity_caps_blocks_and_does_not_borrow() {
    let ipam = setup(true).await;
    let mut a = AssignArgs::new("a", "host-a");
    a.num_v4 = 1;
    let first = ipam.auto_assign(&a).await.unwrap();
    let mut b = AssignArgs::new("b", "host-b");
    // 3 blocks at most: /29 and /30 blocks, at most 3 * 8 addresses.
    b.num_v4 = 40;
    let err = ipam.auto_assign(&b).await.unwrap_err();
    assert!(err.to_string().contains("maxBlocksPerHost"), "{err}");
    // Nothing of the failed request stays allocated.
    assert!(ipam.ips_by_handle("b").await.unwrap().is_empty());
    let blocks = ipam.blocks().await.unwrap();
    let used: usize = blocks.iter().map(|b| b.in_use()).sum();
    assert_eq!(used, 1);
    assert_eq!(ipam.ips_by_handle("a").await.unwrap()[0].ip, first.v4[0].ip);
}

#[tokio::test]
async fn specific_addresses_and_sequence_numbers() {
    let ipam = setup(false).await;
    let ip: IpAddr = "10.1.0.5".parse().unwrap();
    let got = ipam
        .assign_ip(ip, "static", &BTreeMap::new(), "host-a")
        .await
        .unwrap();
    assert_eq!(got.block.to_string(), "10.1.0.4/30");
    let err = ipam
        .assign_ip(ip, "other", &BTreeMap::new(), "host-b")
        .await
        .unwrap_err();
    assert!(matches!(err, IpamError::InUse { .. }), "{err}");
    let err = ipam
        .assign_ip("10.0.0.9".parse().unwrap(), "r", &BTreeMap::new(), "host-a")
        .await
        .unwrap_err();
    assert!(matches!(err, IpamError::Reserved { .. }), "{err}");
    let err = ipam
        .assign_ip(
            "192.0.2.1".parse().unwrap(),
            "r",
            &BTreeMap::new(),
            "host-a",
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not in any IP pool"), "{err}");
    // A release with a stale sequence number frees nothing.
    let blocks = ipam.blocks().await.unwrap();
    let seq = blocks
        .iter()
        .flat_map(|b| {
            b.allocated()
                .map(|a| (a.ip, a.sequence_number))
                .collect::<Vec<_>>()
        })
        .find(|(i, _)| *i == ip)
        .unwrap()
        .1;
    let err = ipam
        .release_ips(&[ReleaseIp {
            ip,
            sequence_number: Some(seq + 1),
        }])
        .await
        .unwrap_err();
    assert!(matches!(err, IpamError::BadSequenceNumber { .. }));
    assert_eq!(
        ipam.release_ips(&[ReleaseIp {
            ip,
            sequence_number: Some(seq)
        }])
        .await
        .unwrap(),
        vec![ip]
    );
    assert!(ipam.handles().await.unwrap().is_empty());
}
