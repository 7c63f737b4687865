//! IPAM against the in-memory backend: random sequences of assignments and releases across
//! hosts and pools never hand out an address twice, never lose one, and end with a clean
//! `ipam check`.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use margay_api::ippool::IPPoolSpec;
use margay_api::{IPPool, IPReservation, ObjectMeta, Resource};
use margay_datastore::{
    Client, Compare, KeyValue, KvBackend, ListResult, MemBackend, TxnOp, TxnResponse, Watch,
};
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

/// A backend whose write transactions fail now and then: before anything is written, or after
/// (the acknowledgement lost: applied, but the caller sees an error).
#[derive(Clone)]
struct Flaky {
    inner: MemBackend,
    writes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

fn unavailable() -> margay_datastore::DatastoreError {
    margay_datastore::DatastoreError::unavailable("injected failure")
}

impl KvBackend for Flaky {
    async fn get(&self, key: &str) -> margay_datastore::Result<Option<KeyValue>> {
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str) -> margay_datastore::Result<ListResult> {
        self.inner.list(prefix).await
    }
    async fn create(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> margay_datastore::Result<KeyValue> {
        self.inner.create(key, value, ttl).await
    }
    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Option<i64>,
        ttl: Option<Duration>,
    ) -> margay_datastore::Result<KeyValue> {
        self.inner.update(key, value, expected, ttl).await
    }
    async fn delete(&self, key: &str, expected: Option<i64>) -> margay_datastore::Result<KeyValue> {
        self.inner.delete(key, expected).await
    }
    async fn txn(
        &self,
        compares: Vec<Compare>,
        ops: Vec<TxnOp>,
    ) -> margay_datastore::Result<TxnResponse> {
        if !ops.iter().any(TxnOp::is_write) {
            return self.inner.txn(compares, ops).await;
        }
        match self
            .writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            % 5
        {
            1 => Err(unavailable()),
            3 => {
                self.inner.txn(compares, ops).await?;
                Err(unavailable())
            }
            _ => self.inner.txn(compares, ops).await,
        }
    }
    async fn watch(&self, prefix: &str, after: i64) -> margay_datastore::Result<Watch> {
        self.inner.watch(prefix, after).await
    }
    async fn compact(&self, revision: i64) -> margay_datastore::Result<()> {
        self.inner.compact(revision).await
    }
    async fn revision(&self) -> margay_datastore::Result<i64> {
        self.inner.revision().await
    }
}

/// Handle records and blocks agree after every operation, even ones that failed at the write
/// (the block and its handle change are one transaction): every record counts exactly the
/// addresses the blocks hold for it, and every held address has its record.
#[tokio::test]
async fn failed_writes_never_leave_handles_and_blocks_disagreeing() {
    let plain = setup(false).await;
    let kv = Flaky {
        inner: plain.backend().clone(),
        writes: std::sync::Arc::default(),
    };
    let ipam = Ipam::new(kv);
    let agree = |blocks: &[margay_ipam::AllocationBlock],
                 handles: &[(String, margay_ipam::IpamHandle)]| {
        let mut held: BTreeMap<(String, String), usize> = BTreeMap::new();
        for b in blocks {
            for a in b.allocated() {
                let h = a.attribute.handle_id.clone().unwrap();
                *held.entry((h, b.cidr.to_string())).or_default() += 1;
            }
        }
        let recorded: BTreeMap<(String, String), usize> = handles
            .iter()
            .flat_map(|(id, h)| {
                h.block
                    .iter()
                    .map(move |(b, n)| ((id.clone(), b.clone()), *n))
            })
            .collect();
        assert_eq!(held, recorded);
    };
    let (mut failures, mut successes) = (0, 0);
    for i in 0..200u32 {
        let handle = format!("h{}", i % 13);
        let result = match i % 4 {
            0 | 1 => {
                let mut args = AssignArgs::new(handle, format!("host{}", i % 3));
                args.num_v4 = 1 + (i % 3) as usize;
                ipam.auto_assign(&args).await.map(|_| ())
            }
            2 => ipam.release_by_handle(&handle).await.map(|_| ()),
            _ => {
                let held = ipam.ips_by_handle(&handle).await.unwrap();
                let ips: Vec<ReleaseIp> = held
                    .iter()
                    .take(1)
                    .map(|a| ReleaseIp {
                        ip: a.ip,
                        sequence_number: None,
                    })
                    .collect();
                ipam.release_ips(&ips).await.map(|_| ())
            }
        };
        match result {
            Ok(()) => successes += 1,
            Err(IpamError::Exhausted { .. }) => {}
            Err(e) => {
                assert!(e.to_string().contains("injected failure"), "{e}");
                failures += 1;
            }
        }
        agree(
            &plain.blocks().await.unwrap(),
            &plain.handles().await.unwrap(),
        );
    }
    assert!(failures > 10 && successes > 10, "{failures} {successes}");
}

/// The block hint is only a guess: once the block went to another host, an assignment for
/// the old host does not use it.
#[tokio::test]
async fn a_stale_block_hint_is_not_used() {
    let ipam = setup(false).await;
    let first = ipam
        .auto_assign(&AssignArgs::new("a", "host-a"))
        .await
        .unwrap();
    let block = first.v4[0].block;
    ipam.release_by_handle("a").await.unwrap();
    // The block moves to host-b behind this process's back.
    let kv = ipam.backend();
    let aff_a = margay_ipam::pools::affinity_key("host-a", &block);
    kv.delete(&aff_a, None).await.unwrap();
    let aff_b = margay_ipam::pools::affinity_key("host-b", &block);
    let confirmed = br#"{"state":"confirmed","deleted":false}"#.to_vec();
    kv.create(&aff_b, confirmed, None).await.unwrap();
    let bkey = margay_ipam::pools::block_key(&block);
    let stored = kv.get(&bkey).await.unwrap().unwrap();
    let mut b: margay_ipam::AllocationBlock = serde_json::from_slice(&stored.value).unwrap();
    b.affinity = Some("host:host-b".into());
    kv.update(&bkey, serde_json::to_vec(&b).unwrap(), None, None)
        .await
        .unwrap();
    let again = ipam
        .auto_assign(&AssignArgs::new("a2", "host-a"))
        .await
        .unwrap();
    assert_ne!(again.v4[0].block, block);
    // And host-b uses it.
    let b_got = ipam
        .auto_assign(&AssignArgs::new("b", "host-b"))
        .await
        .unwrap();
    assert_eq!(b_got.v4[0].block, block);
}

/// Release by handle starts from the values this process wrote; when another process changed
/// the handle since, the write's condition fails and the release reads again, so it frees
/// what the handle holds now.
#[tokio::test]
async fn release_after_another_process_changed_the_handle_frees_everything() {
    let one = setup(false).await;
    let two = Ipam::new(one.backend().clone());
    let first = one
        .auto_assign(&AssignArgs::new("x", "host-a"))
        .await
        .unwrap();
    let second = two
        .auto_assign(&AssignArgs::new("x", "host-a"))
        .await
        .unwrap();
    let released: BTreeSet<IpAddr> = one
        .release_by_handle("x")
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(released, BTreeSet::from([first.v4[0].ip, second.v4[0].ip]));
    verify(&one, &BTreeMap::new()).await;
    assert!(one.handles().await.unwrap().is_empty());
}
