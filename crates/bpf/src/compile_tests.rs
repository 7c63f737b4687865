//! The compiler's semantics, checked by evaluating its output with the userspace model of
//! the program ([`crate::sim`]).

use std::net::Ipv4Addr;
use std::sync::Arc;

use margay_api::net::Cidr;
use margay_calc::{
    DataplaneModel, IcmpMatch, IpSetKind, IpSetMember, PolicyId, PortProtocol, PortRange,
    ResolvedMatch, ResolvedPolicy, ResolvedProfile, ResolvedRule, RuleAction, TierInfo,
    WorkloadEndpointData, WorkloadEndpointId,
};

use std::collections::BTreeMap;

use crate::compile::{BlockKey, CompileError, Compiled, Compiler, Step};
use crate::index::{Summary, build, summary};
use crate::layout::*;
use crate::sim::{Packet, allows, allows_indexed};

fn ip(s: &str) -> Ipv4Addr {
    s.parse().expect("test address")
}

fn cidr(s: &str) -> Cidr {
    Cidr::parse(s).expect("test cidr")
}

fn rule(action: RuleAction) -> ResolvedRule {
    ResolvedRule {
        action,
        ip_version: None,
        protocol: None,
        not_protocol: None,
        icmp: None,
        not_icmp: None,
        src: ResolvedMatch::default(),
        dst: ResolvedMatch::default(),
        rule_id: String::new(),
    }
}

fn tcp_port(action: RuleAction, port: u16) -> ResolvedRule {
    let mut r = rule(action);
    r.protocol = Some(6);
    r.dst.ports = vec![PortRange {
        first: port,
        last: port,
    }];
    r
}

fn pid(tier: &str, name: &str) -> PolicyId {
    PolicyId {
        tier: tier.into(),
        namespace: String::new(),
        name: name.into(),
    }
}

const A: &str = "10.0.0.1";
const B: &str = "10.0.0.2";
const C: &str = "10.0.0.3";

/// Endpoint `b` (10.0.0.2 on cali-b) with the given tiers and profiles.
struct M {
    model: DataplaneModel,
}

impl M {
    fn new() -> M {
        let mut model = DataplaneModel::default();
        model.profiles.insert(
            "allow-all".into(),
            Arc::new(ResolvedProfile {
                inbound: vec![rule(RuleAction::Allow)],
                outbound: vec![rule(RuleAction::Allow)],
            }),
        );
        model
            .profiles
            .insert("none".into(), Arc::new(ResolvedProfile::default()));
        M { model }
    }

    fn policy(&mut self, id: PolicyId, inbound: Vec<ResolvedRule>, outbound: Vec<ResolvedRule>) {
        self.model.policies.insert(
            id.clone(),
            Arc::new(ResolvedPolicy {
                tier: id.tier.clone(),
                inbound,
                outbound,
                ..ResolvedPolicy::default()
            }),
        );
    }

    fn set(&mut self, id: &str, members: Vec<IpSetMember>) {
        let kind = if matches!(members.first(), Some(IpSetMember::IpPort { .. })) {
            IpSetKind::IpAndPort
        } else {
            IpSetKind::Net
        };
        self.model
            .ip_sets
            .insert(id.into(), (kind, members.into_iter().collect()));
    }

    fn endpoint(&mut self, iface: &str, addr: &str, tiers: Vec<TierInfo>, profiles: &[&str]) {
        self.model.workload_endpoints.insert(
            WorkloadEndpointId {
                orchestrator: "k8s".into(),
                workload: format!("default/{iface}"),
                endpoint: "eth0".into(),
            },
            Arc::new(WorkloadEndpointData {
                interface: iface.into(),
                mac: String::new(),
                ipv4_nets: vec![cidr(&format!("{addr}/32"))],
                ipv6_nets: vec![],
                profile_ids: profiles.iter().map(|s| s.to_string()).collect(),
                tiers,
                name: iface.into(),
                namespace: "default".into(),
                allow_spoofed_source_prefixes: vec![],
            }),
        );
    }

    fn compile(&self) -> Compiled {
        Compiler::default().compile(&self.model)
    }
}

fn tier(name: &str, default: RuleAction, ingress: &[PolicyId], egress: &[PolicyId]) -> TierInfo {
    TierInfo {
        name: name.into(),
        default_action: default,
        ingress_policies: ingress.to_vec(),
        egress_policies: egress.to_vec(),
    }
}

/// Does endpoint `iface` accept `p` as a new flow into it (`to_wl`) or out of it? Every
/// verdict is also taken through the hook's index, which must agree with the linear walk.
fn verdict(c: &Compiled, iface: &str, hook: usize, p: &Packet) -> bool {
    let steps = c.resolved(iface, hook);
    let linear = allows(&steps, p, &c.sets);
    let indexed = allows_indexed(&steps, &index_of(&steps), p, &c.sets);
    assert_eq!(
        linear, indexed,
        "index disagrees on {p:?} at {iface} hook {hook}"
    );
    linear
}

/// The hook's index as the syncer builds it.
fn index_of(steps: &[(Step, Arc<Vec<Rule>>)]) -> BTreeMap<u32, StepEnc> {
    let sums: Vec<Option<Summary>> = steps
        .iter()
        .map(|(s, rules)| match s {
            Step::Deny(_) => None,
            Step::Block { .. } => Some(summary(rules)),
        })
        .collect();
    let refs: Vec<Option<&Summary>> = sums.iter().map(Option::as_ref).collect();
    build(&refs).into_iter().collect()
}

fn to_b(c: &Compiled, from: &str, port: u16) -> bool {
    verdict(c, "cali-b", HOOK_TO_WL, &Packet::tcp(ip(from), ip(B), port))
}

#[test]
fn allow_by_port_and_default_deny_at_the_end_of_a_tier() {
    let mut m = M::new();
    let p = pid("default", "web");
    m.policy(p.clone(), vec![tcp_port(RuleAction::Allow, 80)], vec![]);
    m.endpoint(
        "cali-b",
        B,
        vec![tier("default", RuleAction::Deny, &[p], &[])],
        &["allow-all"],
    );
    let c = m.compile();
    assert!(c.errors.is_empty());
    assert!(to_b(&c, A, 80));
    // The tier had a policy applying: its end denies; the profile is never reached.
    assert!(!to_b(&c, A, 81));
    let udp = Packet {
        proto: 17,
        ..Packet::tcp(ip(A), ip(B), 80)
    };
    assert!(!verdict(&c, "cali-b", HOOK_TO_WL, &udp));
}

#[test]
fn profiles_decide_when_no_tier_applies_and_nothing_means_deny() {
    let mut m = M::new();
    m.endpoint("cali-b", B, vec![], &["allow-all"]);
    m.endpoint("cali-c", C, vec![], &["none"]);
    let c = m.compile();
    assert!(to_b(&c, A, 1234));
    let p = Packet::tcp(ip(A), ip(C), 80);
    assert!(!verdict(&c, "cali-c", HOOK_TO_WL, &p));
}

#[test]
fn pass_skips_the_rest_of_the_tier_and_tier_default_pass_reaches_profiles() {
    let mut m = M::new();
    let pass = pid("t1", "pass");
    let deny = pid("t1", "deny");
    let mut pass_rule = tcp_port(RuleAction::Pass, 80);
    pass_rule.src.nets = vec![cidr(&format!("{A}/32"))];
    m.policy(pass.clone(), vec![pass_rule], vec![]);
    m.policy(deny.clone(), vec![rule(RuleAction::Deny)], vec![]);
    let allow = pid("t2", "allow80");
    m.policy(allow.clone(), vec![tcp_port(RuleAction::Allow, 80)], vec![]);
    m.endpoint(
        "cali-b",
        B,
        vec![
            tier("t1", RuleAction::Deny, &[pass, deny], &[]),
            tier("t2", RuleAction::Pass, &[allow], &[]),
        ],
        &["none"],
    );
    let c = m.compile();
    // A:80 passes t1 and is allowed by t2; C:80 hits t1's deny.
    assert!(to_b(&c, A, 80));
    assert!(!to_b(&c, C, 80));
    // A:81 passes t1 (no: the pass rule needs port 80), so it is denied in t1.
    assert!(!to_b(&c, A, 81));

    // A t2 whose default is Pass hands A:80 on to the profiles when t2 does not decide.
    let mut m2 = M::new();
    let pass_all = pid("t1", "pass-all");
    m2.policy(pass_all.clone(), vec![rule(RuleAction::Pass)], vec![]);
    m2.endpoint(
        "cali-b",
        B,
        vec![tier("t1", RuleAction::Pass, &[pass_all], &[])],
        &["allow-all"],
    );
    let c2 = m2.compile();
    assert!(to_b(&c2, A, 9999));
}

#[test]
fn selectors_nets_and_negations_use_the_set_trie() {
    let mut m = M::new();
    m.set(
        "s:frontend",
        vec![IpSetMember::Net(cidr(&format!("{A}/32")))],
    );
    let p = pid("default", "from-frontend");
    let mut r = tcp_port(RuleAction::Allow, 80);
    r.src.ip_set_ids = vec!["s:frontend".into()];
    let mut net = rule(RuleAction::Allow);
    net.src.nets = vec![cidr("10.0.0.0/30")];
    net.src.not_nets = vec![cidr(&format!("{A}/32"))];
    net.protocol = Some(17);
    m.policy(p.clone(), vec![r, net], vec![]);
    m.endpoint(
        "cali-b",
        B,
        vec![tier("default", RuleAction::Deny, &[p], &[])],
        &["none"],
    );
    let c = m.compile();
    assert!(to_b(&c, A, 80));
    assert!(!to_b(&c, C, 80));
    let udp = |src: &str| Packet {
        proto: 17,
        ..Packet::tcp(ip(src), ip(B), 53)
    };
    // 10.0.0.3 is in 10.0.0.0/30 and not excluded; 10.0.0.1 is excluded; 10.0.0.9 outside.
    assert!(verdict(&c, "cali-b", HOOK_TO_WL, &udp(C)));
    assert!(!verdict(&c, "cali-b", HOOK_TO_WL, &udp(A)));
    assert!(!verdict(&c, "cali-b", HOOK_TO_WL, &udp("10.0.0.9")));
}

#[test]
fn named_ports_icmp_and_not_protocol() {
    let mut m = M::new();
    m.set(
        "n:http",
        vec![IpSetMember::IpPort {
            ip: B.parse().expect("ip"),
            protocol: PortProtocol::Tcp,
            port: 8080,
        }],
    );
    let p = pid("default", "mixed");
    let mut named = rule(RuleAction::Allow);
    named.protocol = Some(6);
    named.dst.named_port_ip_set_ids = vec!["n:http".into()];
    let mut icmp = rule(RuleAction::Allow);
    icmp.protocol = Some(1);
    icmp.icmp = Some(IcmpMatch {
        icmp_type: 8,
        code: None,
    });
    let mut not_tcp = rule(RuleAction::Allow);
    not_tcp.not_protocol = Some(6);
    not_tcp.dst.nets = vec![cidr("192.168.0.0/16")];
    m.policy(p.clone(), vec![named, icmp, not_tcp], vec![]);
    m.endpoint(
        "cali-b",
        B,
        vec![tier("default", RuleAction::Deny, &[p], &[])],
        &["none"],
    );
    let c = m.compile();
    assert!(to_b(&c, A, 8080));
    assert!(!to_b(&c, A, 8081));
    let ping = |t: u8| Packet {
        proto: 1,
        sport: 0,
        dport: 0,
        icmp_type: t,
        ..Packet::tcp(ip(A), ip(B), 0)
    };
    assert!(verdict(&c, "cali-b", HOOK_TO_WL, &ping(8)));
    assert!(!verdict(&c, "cali-b", HOOK_TO_WL, &ping(13)));
}

#[test]
fn egress_checks_the_source_address_and_encapsulation_first() {
    let mut m = M::new();
    m.endpoint("cali-b", B, vec![], &["allow-all"]);
    let c = m.compile();
    let out = |src: &str, proto: u8, dport: u16| Packet {
        proto,
        ..Packet::tcp(ip(src), ip(A), dport)
    };
    assert!(verdict(&c, "cali-b", HOOK_FROM_WL, &out(B, 6, 80)));
    assert!(
        !verdict(&c, "cali-b", HOOK_FROM_WL, &out(C, 6, 80)),
        "spoofed source"
    );
    assert!(
        !verdict(&c, "cali-b", HOOK_FROM_WL, &out(B, 17, 4789)),
        "VXLAN"
    );
    assert!(
        !verdict(&c, "cali-b", HOOK_FROM_WL, &out(B, 4, 0)),
        "IP-in-IP"
    );
}

#[test]
fn a_rule_beyond_the_limits_is_refused_whole_with_a_clear_error() {
    let mut m = M::new();
    let p = pid("default", "many-ports");
    let mut r = rule(RuleAction::Allow);
    r.protocol = Some(6);
    // Ten separate ranges (adjacent ones would merge).
    r.dst.ports = (0..10u16)
        .map(|i| PortRange {
            first: 100 + i * 10,
            last: 100 + i * 10,
        })
        .collect();
    m.policy(p.clone(), vec![tcp_port(RuleAction::Allow, 22), r], vec![]);
    m.endpoint(
        "cali-b",
        B,
        vec![tier("default", RuleAction::Deny, &[p], &[])],
        &["allow-all"],
    );
    let c = m.compile();
    assert_eq!(c.errors.len(), 1);
    let msg = c.errors[0].to_string();
    assert!(
        msg.contains("policy many-ports") && msg.contains("rule 1"),
        "{msg}"
    );
    assert!(msg.contains("limit of 8"), "{msg}");
    // Nothing of the policy is loaded for that direction: even port 22 is denied.
    assert!(c.endpoints["cali-b"].steps[HOOK_TO_WL].is_empty());
    assert!(!to_b(&c, A, 22));
    // The other direction is unaffected.
    assert!(!c.endpoints["cali-b"].steps[HOOK_FROM_WL].is_empty());
}

#[test]
fn too_many_rules_for_one_endpoint_is_refused() {
    let mut m = M::new();
    let p = pid("default", "huge");
    m.policy(
        p.clone(),
        vec![tcp_port(RuleAction::Allow, 1); MAX_RULES],
        vec![],
    );
    m.endpoint(
        "cali-b",
        B,
        vec![tier("default", RuleAction::Deny, &[p], &[])],
        &["allow-all"],
    );
    let c = m.compile();
    assert!(matches!(
        &c.errors[..],
        // The policy's rules, the profile's rule, and three steps (policy, tier end, profile).
        [CompileError::TooManyRules { count, .. }] if *count == MAX_RULES + 4
    ));
    assert!(c.endpoints["cali-b"].steps[HOOK_TO_WL].is_empty());
}

#[test]
fn set_ids_are_stable_while_referenced_and_sets_carry_only_ipv4() {
    let mut m = M::new();
    m.set(
        "s:x",
        vec![
            IpSetMember::Net(cidr("10.1.0.0/16")),
            IpSetMember::Net(cidr("fd00::/64")),
        ],
    );
    let p = pid("default", "x");
    let mut r = rule(RuleAction::Allow);
    r.src.ip_set_ids = vec!["s:x".into()];
    m.policy(p.clone(), vec![r], vec![]);
    m.endpoint(
        "cali-b",
        B,
        vec![tier(
            "default",
            RuleAction::Deny,
            std::slice::from_ref(&p),
            &[],
        )],
        &[],
    );
    let mut comp = Compiler::default();
    let c1 = comp.compile(&m.model);
    let c2 = comp.compile(&m.model);
    assert_eq!(c1.endpoints, c2.endpoints);
    assert_eq!(c1.sets, c2.sets);
    let id = c1.blocks[&BlockKey::Policy(p, HOOK_TO_WL)][0].src.sets[0];
    assert_eq!(c1.sets[&id].len(), 1, "the IPv6 member is left out");
    assert!(to_b(&c1, "10.1.2.3", 1));
    assert!(!to_b(&c1, A, 1));
}

#[test]
fn a_recompile_reuses_what_did_not_change() {
    let mut m = M::new();
    let web = pid("default", "web");
    let other = pid("default", "other");
    m.policy(web.clone(), vec![tcp_port(RuleAction::Allow, 80)], vec![]);
    m.policy(other.clone(), vec![tcp_port(RuleAction::Allow, 22)], vec![]);
    m.endpoint(
        "cali-b",
        B,
        vec![tier(
            "default",
            RuleAction::Deny,
            std::slice::from_ref(&web),
            &[],
        )],
        &[],
    );
    m.endpoint(
        "cali-c",
        C,
        vec![tier(
            "default",
            RuleAction::Deny,
            std::slice::from_ref(&other),
            &[],
        )],
        &[],
    );
    let mut comp = Compiler::default();
    let c1 = comp.compile(&m.model);
    // Only `web` changes: its block is rebuilt, every endpoint's steps are the very same
    // allocation (steps name blocks), the other policy's block too.
    m.policy(web.clone(), vec![tcp_port(RuleAction::Allow, 443)], vec![]);
    let c2 = comp.compile(&m.model);
    for iface in ["cali-b", "cali-c"] {
        for hook in [HOOK_FROM_WL, HOOK_TO_WL] {
            assert!(Arc::ptr_eq(
                &c1.endpoints[iface].steps[hook],
                &c2.endpoints[iface].steps[hook]
            ));
        }
    }
    let key = |p: &PolicyId| Arc::new(BlockKey::Policy(p.clone(), HOOK_TO_WL));
    assert!(Arc::ptr_eq(
        &c1.blocks[&key(&other)],
        &c2.blocks[&key(&other)]
    ));
    assert!(!Arc::ptr_eq(&c1.blocks[&key(&web)], &c2.blocks[&key(&web)]));
    assert!(to_b(&c2, A, 443) && !to_b(&c2, A, 80));
}

#[test]
fn a_replaced_policy_that_changes_shape_or_grows_past_the_limit_is_seen_by_its_endpoints() {
    let mut m = M::new();
    let web = pid("default", "web");
    m.policy(web.clone(), vec![tcp_port(RuleAction::Allow, 80)], vec![]);
    m.endpoint(
        "cali-b",
        B,
        vec![tier(
            "default",
            RuleAction::Deny,
            std::slice::from_ref(&web),
            &[],
        )],
        &["allow-all"],
    );
    let mut comp = Compiler::default();
    let c1 = comp.compile(&m.model);
    assert!(to_b(&c1, A, 80));
    // Same shape: the steps are the same allocation, the verdict follows the new rules.
    m.policy(web.clone(), vec![tcp_port(RuleAction::Allow, 81)], vec![]);
    let c2 = comp.compile(&m.model);
    assert!(Arc::ptr_eq(
        &c1.endpoints["cali-b"].steps[HOOK_TO_WL],
        &c2.endpoints["cali-b"].steps[HOOK_TO_WL]
    ));
    assert!(to_b(&c2, A, 81) && !to_b(&c2, A, 80));
    // Grown past the limit: refused whole, as a fresh compile would.
    m.policy(
        web.clone(),
        vec![tcp_port(RuleAction::Allow, 1); MAX_RULES],
        vec![],
    );
    let c3 = comp.compile(&m.model);
    assert!(matches!(
        &c3.errors[..],
        [CompileError::TooManyRules { .. }]
    ));
    assert!(c3.endpoints["cali-b"].steps[HOOK_TO_WL].is_empty());
    // Empty now: its step goes; the tier's end denies, the profile is never reached.
    m.policy(web, vec![], vec![]);
    let c4 = comp.compile(&m.model);
    assert!(c4.errors.is_empty());
    assert!(!to_b(&c4, A, 81));
    assert_eq!(
        c4.endpoints["cali-b"].steps[HOOK_TO_WL].len(),
        2,
        "tier end and profile"
    );
}

/// A small deterministic generator (no dependency): xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<T: Clone>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize].clone()
    }
}

/// The index against the linear walk over random tiers of random policies: protocols
/// (some none), single ports, narrow and wide ranges, named ports, negated ports, source
/// nets, all four actions, tier defaults Deny and Pass, and packets on the rules' ports,
/// next to them and elsewhere, TCP, UDP, ICMP.
#[test]
fn the_index_gives_the_linear_walks_verdict_on_random_policies() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let ports = [80u16, 81, 443, 8080, 1000, 1005, 53];
    let mut indexed_hooks = 0;
    let mut checked = 0;
    for round in 0..150 {
        let mut m = M::new();
        m.set(
            "s:named",
            vec![IpSetMember::IpPort {
                ip: ip(B).into(),
                protocol: PortProtocol::Tcp,
                port: 8080,
            }],
        );
        let mut tiers = Vec::new();
        for t in 0..1 + rng.below(3) {
            let mut ids = Vec::new();
            for n in 0..1 + rng.below(6) {
                let id = pid(&format!("t{t}"), &format!("p{round}-{n}"));
                let mut rules = Vec::new();
                for _ in 0..1 + rng.below(3) {
                    let action = rng.pick(&[
                        RuleAction::Allow,
                        RuleAction::Allow,
                        RuleAction::Deny,
                        RuleAction::Pass,
                        RuleAction::Log,
                    ]);
                    let mut r = rule(action);
                    r.protocol = rng.pick(&[Some(6), Some(6), Some(17), Some(1), None]);
                    match rng.below(7) {
                        0..=2 => {
                            let p = rng.pick(&ports);
                            r.dst.ports = vec![PortRange { first: p, last: p }];
                        }
                        3 => {
                            r.dst.ports = vec![PortRange {
                                first: 1000,
                                last: 1000 + rng.below(40) as u16,
                            }]
                        }
                        4 => r.dst.named_port_ip_set_ids = vec!["s:named".into()],
                        5 => {
                            let p = rng.pick(&ports);
                            r.dst.not_ports = vec![PortRange { first: p, last: p }];
                        }
                        _ => {}
                    }
                    if rng.below(3) == 0 {
                        r.src.nets = vec![cidr(&format!("{A}/32"))];
                    }
                    if r.protocol == Some(1) {
                        r.dst.ports.clear();
                        r.dst.not_ports.clear();
                        r.dst.named_port_ip_set_ids.clear();
                    }
                    rules.push(r);
                }
                m.policy(id.clone(), rules.clone(), rules);
                ids.push(id);
            }
            let default = rng.pick(&[RuleAction::Deny, RuleAction::Pass]);
            tiers.push(tier(&format!("t{t}"), default, &ids, &ids));
        }
        let profile = rng.pick(&["allow-all", "none"]);
        m.endpoint("cali-b", B, tiers, &[profile]);
        let c = m.compile();
        assert!(c.errors.is_empty(), "{:?}", c.errors);
        for hook in [HOOK_TO_WL, HOOK_FROM_WL] {
            if !index_of(&c.resolved("cali-b", hook)).is_empty() {
                indexed_hooks += 1;
            }
        }
        for src in [A, C] {
            for port in ports.iter().copied().chain([82, 1020, 1039, 9999]) {
                for proto in [6u8, 17, 1] {
                    let p = Packet {
                        proto,
                        dport: if proto == 1 { 0 } else { port },
                        icmp_type: 8,
                        ..Packet::tcp(ip(src), ip(B), port)
                    };
                    // (verdict asserts the index agrees.)
                    verdict(&c, "cali-b", HOOK_TO_WL, &p);
                    let out = Packet {
                        src: ip(B),
                        dst: ip(src),
                        ..p
                    };
                    verdict(&c, "cali-b", HOOK_FROM_WL, &out);
                    checked += 2;
                }
            }
        }
    }
    // The generator must exercise the index, not only the fallback.
    assert!(indexed_hooks > 50, "only {indexed_hooks} hooks indexed");
    assert!(checked > 10_000);
}
