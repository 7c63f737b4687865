use super::*;
use margay_calc::PortRange;

fn rule(action: RuleAction, protocol: Option<u8>, ports: &[(u16, u16)]) -> ResolvedRule {
    ResolvedRule {
        action,
        ip_version: None,
        protocol,
        not_protocol: None,
        icmp: None,
        not_icmp: None,
        src: ResolvedMatch::default(),
        dst: ResolvedMatch {
            ports: ports
                .iter()
                .map(|&(first, last)| PortRange { first, last })
                .collect(),
            ..ResolvedMatch::default()
        },
        rule_id: String::new(),
    }
}

fn allow(protocol: Option<u8>, ports: &[(u16, u16)]) -> ResolvedRule {
    rule(RuleAction::Allow, protocol, ports)
}

#[test]
fn guard_of_one_protocol_and_port() {
    assert_eq!(
        jump_guard(&[allow(Some(6), &[(80, 80)])]).as_deref(),
        Some("meta l4proto 6 th dport 80")
    );
}

#[test]
fn no_guard_for_no_rules_or_a_rule_without_protocol() {
    assert_eq!(jump_guard(&[]), None);
    assert_eq!(jump_guard(&[allow(None, &[])]), None);
    // One rule without a protocol matches any packet: no guard, whatever the others say.
    assert_eq!(
        jump_guard(&[allow(Some(6), &[(80, 80)]), allow(None, &[(80, 80)])]),
        None
    );
}

#[test]
fn not_protocol_alone_gives_no_guard() {
    let mut r = allow(None, &[]);
    r.not_protocol = Some(17);
    assert_eq!(jump_guard(&[r.clone()]), None);
    // With a protocol as well, the protocol is still necessary.
    r.protocol = Some(6);
    assert_eq!(jump_guard(&[r]).as_deref(), Some("meta l4proto 6"));
}

#[test]
fn icmp_gets_a_protocol_guard_only() {
    let mut r = rule(RuleAction::Deny, Some(1), &[]);
    r.icmp = Some(margay_calc::IcmpMatch {
        icmp_type: 8,
        code: None,
    });
    assert_eq!(jump_guard(&[r.clone()]).as_deref(), Some("meta l4proto 1"));
    // Mixed with TCP on a port: the union of protocols, no port part (ICMP has no ports).
    assert_eq!(
        jump_guard(&[r, allow(Some(6), &[(80, 80)])]).as_deref(),
        Some("meta l4proto { 1, 6 }")
    );
}

#[test]
fn named_ports_drop_the_port_part() {
    let mut r = allow(Some(6), &[(80, 80)]);
    r.dst.named_port_ip_set_ids = vec!["n:abc".into()];
    // The named port is an alternative to port 80: the rule matches other ports too.
    assert_eq!(jump_guard(&[r]).as_deref(), Some("meta l4proto 6"));
}

#[test]
fn a_rule_without_ports_drops_the_port_part() {
    assert_eq!(
        jump_guard(&[allow(Some(6), &[(80, 80)]), allow(Some(6), &[])]).as_deref(),
        Some("meta l4proto 6")
    );
    // Not-ports only narrow the rule; they say nothing about the ports it matches.
    let mut r = allow(Some(6), &[]);
    r.dst.not_ports = vec![PortRange {
        first: 22,
        last: 22,
    }];
    assert_eq!(jump_guard(&[r]).as_deref(), Some("meta l4proto 6"));
    // Source ports are not destination ports.
    let mut r = allow(Some(6), &[]);
    r.src.ports = vec![PortRange {
        first: 22,
        last: 22,
    }];
    assert_eq!(jump_guard(&[r]).as_deref(), Some("meta l4proto 6"));
}

#[test]
fn mixed_protocols_and_ports_make_the_union() {
    let rules = [
        allow(Some(6), &[(443, 443), (80, 80)]),
        rule(RuleAction::Deny, Some(17), &[(53, 53)]),
        rule(
            RuleAction::Pass,
            Some(6),
            &[(1000, 2000), (1500, 2500), (2501, 2600)],
        ),
        rule(RuleAction::Log, Some(132), &[(80, 80)]),
    ];
    assert_eq!(
        jump_guard(&rules).as_deref(),
        Some("meta l4proto { 6, 17, 132 } th dport { 53, 80, 443, 1000-2600 }")
    );
}

#[test]
fn a_protocol_without_ports_drops_the_port_part() {
    // Validation refuses ports with such a protocol; the guard must not rely on it.
    assert_eq!(
        jump_guard(&[allow(Some(6), &[(80, 80)]), allow(Some(47), &[(80, 80)])]).as_deref(),
        Some("meta l4proto { 6, 47 }")
    );
}

fn rendered(
    cfg: &NftConfig,
    policies: &[(&str, Vec<ResolvedRule>)],
) -> (Vec<PolicyId>, HashMap<PolicyId, RenderedPolicy>) {
    let mut ids = Vec::new();
    let mut map = HashMap::new();
    for (name, inbound) in policies {
        let id = PolicyId {
            tier: "default".into(),
            namespace: "ns".into(),
            name: (*name).into(),
        };
        let pol = ResolvedPolicy {
            inbound: inbound.clone(),
            outbound: inbound.clone(),
            ..ResolvedPolicy::default()
        };
        let entry = (
            Arc::new(pol.clone()),
            (
                rules_chain(&pol.inbound, cfg, &LogOwner::profile(name), true),
                PolicyCall::new(&pol.inbound, cfg, true),
            ),
            (
                rules_chain(&pol.outbound, cfg, &LogOwner::profile(name), false),
                PolicyCall::new(&pol.outbound, cfg, false),
            ),
        );
        map.insert(id.clone(), entry);
        ids.push(id);
    }
    (ids, map)
}

fn texts(c: &ChainSpec) -> Vec<String> {
    c.rules.iter().map(|r| r.text.clone()).collect()
}

#[test]
fn tier_chain_guards_jumps_and_tests_marks_only_when_a_policy_can_set_them() {
    let cfg = NftConfig::default();
    let (ids, map) = rendered(
        &cfg,
        &[
            ("web", vec![allow(Some(6), &[(80, 80)])]),
            ("empty", vec![]),
            ("pass", vec![rule(RuleAction::Pass, Some(17), &[(53, 53)])]),
            ("deny", vec![rule(RuleAction::Deny, None, &[])]),
        ],
    );
    let tier = TierInfo {
        name: "default".into(),
        default_action: RuleAction::Deny,
        ingress_policies: ids.clone(),
        egress_policies: ids.clone(),
    };
    let ch = |ingress| texts(&tier_chain(&tier, &ids, ingress, &cfg, &map));
    let (web, pass, deny) = (0, 2, 3);
    let ingress = ch(true);
    assert_eq!(
        ingress,
        vec![
            "meta mark set meta mark and 0xfffcffff".to_string(),
            format!(
                "meta l4proto 6 th dport 80 jump {}",
                policy_chain(&ids[web], true)
            ),
            format!(
                "meta l4proto 17 th dport 53 jump {}",
                policy_chain(&ids[pass], true)
            ),
            "meta mark and 0x20000 != 0 return".to_string(),
            format!("jump {}", policy_chain(&ids[deny], true)),
            "drop comment \"end of tier default\"".to_string(),
        ]
    );
    let egress = ch(false);
    assert_eq!(
        egress,
        vec![
            "meta mark set meta mark and 0xfffcffff".to_string(),
            format!(
                "meta l4proto 6 th dport 80 jump {}",
                policy_chain(&ids[web], false)
            ),
            "meta mark and 0x10000 != 0 return".to_string(),
            format!(
                "meta l4proto 17 th dport 53 jump {}",
                policy_chain(&ids[pass], false)
            ),
            "meta mark and 0x20000 != 0 return".to_string(),
            format!("jump {}", policy_chain(&ids[deny], false)),
            "drop comment \"end of tier default\"".to_string(),
        ]
    );
}

#[test]
fn an_unknown_policy_is_jumped_to_unguarded_and_tested() {
    let cfg = NftConfig::default();
    let id = PolicyId {
        tier: "default".into(),
        namespace: String::new(),
        name: "gone".into(),
    };
    let tier = TierInfo {
        name: "default".into(),
        default_action: RuleAction::Pass,
        ingress_policies: vec![id.clone()],
        egress_policies: vec![],
    };
    assert_eq!(
        texts(&tier_chain(
            &tier,
            &tier.ingress_policies,
            true,
            &cfg,
            &HashMap::new()
        )),
        vec![
            "meta mark set meta mark and 0xfffcffff".to_string(),
            format!("jump {}", policy_chain(&id, true)),
            "meta mark and 0x30000 != 0 return".to_string(),
            "meta mark set meta mark | 0x20000 return".to_string(),
        ]
    );
}

#[test]
fn allow_accepts_in_ingress_and_returns_in_egress() {
    let cfg = NftConfig::default();
    let r = allow(Some(6), &[(80, 80)]);
    let ingress = render_rule(&r, &cfg, &LogOwner::profile("p"), true);
    let egress = render_rule(&r, &cfg, &LogOwner::profile("p"), false);
    assert!(
        ingress
            .iter()
            .all(|t| t.ends_with("meta mark set meta mark | 0x10000 accept")),
        "{ingress:?}"
    );
    assert!(
        egress
            .iter()
            .all(|t| t.ends_with("meta mark set meta mark | 0x10000 return")),
        "{egress:?}"
    );
    // Pass returns in both directions: the tier chain must skip the rest of the tier.
    let p = rule(RuleAction::Pass, Some(6), &[]);
    assert!(
        render_rule(&p, &cfg, &LogOwner::profile("p"), true)
            .iter()
            .all(|t| t.ends_with("| 0x20000 return"))
    );
}

fn workload(ifname: &str, tiers: Vec<TierInfo>) -> WorkloadEndpointData {
    WorkloadEndpointData {
        interface: ifname.into(),
        mac: String::new(),
        ipv4_nets: vec![Cidr::parse("10.65.0.5/32").unwrap()],
        ipv6_nets: Vec::new(),
        profile_ids: vec!["prof".into()],
        tiers,
        name: "w".into(),
        namespace: "ns".into(),
        allow_spoofed_source_prefixes: Vec::new(),
    }
}

fn ep_rules(
    cfg: &NftConfig,
    ingress: bool,
    rendered: &HashMap<PolicyId, RenderedPolicy>,
    tiers: Vec<TierInfo>,
) -> Vec<String> {
    let id = WorkloadEndpointId {
        orchestrator: "k8s".into(),
        workload: "ns/w".into(),
        endpoint: "eth0".into(),
    };
    let chains = endpoint_chains(&id, &workload("cali1", tiers), ingress, cfg, rendered);
    chains.iter().flat_map(|(_, c)| texts(c)).collect()
}

fn base(cfg: &NftConfig, model: &DataplaneModel) -> NftState {
    Renderer::new().render(model, cfg).0
}

#[test]
fn the_deny_verdict_is_used_wherever_margay_refuses() {
    let cfg = NftConfig {
        deny: DenyVerdict::Reject,
        ..NftConfig::default()
    };
    let (ids, map) = rendered(&cfg, &[("d", vec![rule(RuleAction::Deny, None, &[])])]);
    let tier = TierInfo {
        name: "default".into(),
        default_action: RuleAction::Deny,
        ingress_policies: ids.clone(),
        egress_policies: ids.clone(),
    };
    let tier_rules = texts(&tier_chain(&tier, &ids, true, &cfg, &map));
    assert!(
        tier_rules
            .iter()
            .any(|r| r == "reject comment \"end of tier default\""),
        "{tier_rules:?}"
    );
    let policy = texts(&map[&ids[0]].1.0);
    assert!(policy.iter().all(|r| r.ends_with(" reject")), "{policy:?}");
    let egress = ep_rules(&cfg, false, &map, vec![tier.clone()]);
    assert!(
        egress.contains(&"reject comment \"no policy or profile allowed the packet\"".to_string()),
        "{egress:?}"
    );
    assert!(
        egress
            .iter()
            .any(|r| r.starts_with("ip saddr != { 10.65.0.5 } reject")),
        "{egress:?}"
    );
    let st = base(&cfg, &DataplaneModel::default());
    let chain = |n: &str| texts(&st.chains[n]);
    assert!(chain("forward").contains(&"ct state invalid reject".to_string()));
    assert!(chain("from-wl")[0].starts_with("iifname != @wl-ifaces reject"));
    // Nothing drops with REJECT configured.
    let dropping: Vec<String> = st
        .chains
        .iter()
        .filter(|(n, _)| *n != "wl-to-host")
        .flat_map(|(_, c)| texts(c))
        .filter(|r| r.contains("drop"))
        .collect();
    assert!(dropping.is_empty(), "{dropping:?}");
    // DROP (the default) drops.
    let st = base(&NftConfig::default(), &DataplaneModel::default());
    assert!(texts(&st.chains["forward"]).contains(&"ct state invalid drop".to_string()));
}

#[test]
fn the_return_allow_verdict_returns_from_ingress_too() {
    let cfg = NftConfig {
        allow: AllowVerdict::Return,
        ..NftConfig::default()
    };
    let r = allow(Some(6), &[(80, 80)]);
    let ingress = render_rule(&r, &cfg, &LogOwner::profile("p"), true);
    assert!(
        ingress
            .iter()
            .all(|t| t.ends_with("meta mark set meta mark | 0x10000 return")),
        "{ingress:?}"
    );
    let (ids, map) = rendered(&cfg, &[("web", vec![allow(Some(6), &[(80, 80)])])]);
    let tier = TierInfo {
        name: "default".into(),
        default_action: RuleAction::Deny,
        ingress_policies: ids.clone(),
        egress_policies: ids.clone(),
    };
    // The tier and endpoint chains test the accept bit after ingress jumps as well.
    let t = texts(&tier_chain(&tier, &ids, true, &cfg, &map));
    assert!(
        t.contains(&"meta mark and 0x10000 != 0 return".to_string()),
        "{t:?}"
    );
    let e = ep_rules(&cfg, true, &map, vec![tier]);
    assert_eq!(
        e.iter()
            .filter(|r| *r == "meta mark and 0x10000 != 0 return")
            .count(),
        3,
        "{e:?}"
    );
    // ACCEPT: ingress accepts directly and nothing is tested after it.
    let acc = NftConfig::default();
    let (ids, map) = rendered(&acc, &[("web", vec![allow(Some(6), &[(80, 80)])])]);
    let tier = TierInfo {
        name: "default".into(),
        default_action: RuleAction::Deny,
        ingress_policies: ids.clone(),
        egress_policies: ids.clone(),
    };
    let e = ep_rules(&acc, true, &map, vec![tier]);
    assert!(
        !e.iter().any(|r| r.contains("0x10000 != 0 return")),
        "{e:?}"
    );
}

#[test]
fn log_prefix_specifiers_and_rate_limit_are_calicos() {
    let id = PolicyId {
        tier: "security".into(),
        namespace: "prod".into(),
        name: "web".into(),
    };
    let owner = LogOwner::policy(&id);
    assert_eq!(
        log_prefix("drop %t/%k/%n %p %x", &owner),
        "drop security/np/web prod/web %x"
    );
    assert_eq!(log_prefix("", &owner), "calico-packet");
    let g = PolicyId {
        tier: "default".into(),
        namespace: String::new(),
        name: "g".into(),
    };
    assert_eq!(log_prefix("%k %p", &LogOwner::policy(&g)), "gnp g");
    let k = PolicyId {
        tier: "default".into(),
        namespace: "ns".into(),
        name: "knp.default.x".into(),
    };
    assert_eq!(log_prefix("%k", &LogOwner::policy(&k)), "knp");
    assert_eq!(
        log_prefix("%k:%n", &LogOwner::profile("kns.a")),
        "pro:kns.a"
    );
    assert_eq!(log_prefix(&"x".repeat(300), &owner).len(), 127);
    assert_eq!(log_prefix("a\"b", &owner), "ab");
    let cfg = NftConfig {
        log_prefix: "p-%n".into(),
        log_rate: Some(("10/second".into(), 3)),
        ..NftConfig::default()
    };
    let log = render_rule(&rule(RuleAction::Log, None, &[]), &cfg, &owner, false);
    assert_eq!(
        log[0],
        "meta nfproto ipv4 limit rate 10/second burst 3 packets log prefix \"p-web\" level info"
    );
    let cfg = NftConfig {
        log_rate: Some(("1/minute".into(), 0)),
        ..cfg
    };
    let log = render_rule(&rule(RuleAction::Log, None, &[]), &cfg, &owner, false);
    assert!(
        log[0].contains(" limit rate 1/minute log prefix"),
        "{log:?}"
    );
}

#[test]
fn encapsulated_packets_from_workloads_are_refused_unless_allowed() {
    let cfg = NftConfig::default();
    let e = ep_rules(&cfg, false, &HashMap::new(), Vec::new());
    assert!(
        e.contains(&"udp dport 4789 drop comment \"VXLAN from a workload\"".to_string()),
        "{e:?}"
    );
    assert!(
        e.contains(&"meta l4proto 4 drop comment \"IP-in-IP from a workload\"".to_string()),
        "{e:?}"
    );
    let allowed = NftConfig {
        workload_vxlan_port: None,
        drop_ipip_from_workloads: false,
        ..NftConfig::default()
    };
    let e = ep_rules(&allowed, false, &HashMap::new(), Vec::new());
    assert!(!e.iter().any(|r| r.contains("from a workload")), "{e:?}");
}

#[test]
fn the_conntrack_invalid_check_can_be_disabled() {
    let cfg = NftConfig {
        conntrack_invalid_drop: false,
        ..NftConfig::default()
    };
    let st = base(&cfg, &DataplaneModel::default());
    let all: Vec<String> = st.chains.values().flat_map(texts).collect();
    assert!(
        !all.iter().any(|r| r.contains("ct state invalid")),
        "{all:?}"
    );
}

fn masq_model() -> DataplaneModel {
    let mut m = DataplaneModel::default();
    m.pools.insert(
        "p".into(),
        margay_calc::PoolData {
            cidr: Cidr::parse("10.65.0.0/16").unwrap(),
            masquerade: true,
            ipip: EncapMode::Never,
            vxlan: EncapMode::Never,
            disabled: false,
        },
    );
    m
}

#[test]
fn nat_outgoing_follows_exclusions_interface_ports_and_address() {
    let plain = nat_outgoing_rules(&NatOutgoing::default(), 4);
    assert_eq!(
        plain,
        vec!["ip saddr @masq-pools-4 ip daddr != @all-pools-4 masquerade fully-random".to_string()]
    );
    let nat = NatOutgoing {
        exclude_hosts: true,
        oif: Some("eth*".into()),
        port_range: Some((40000, 41000)),
        address: None,
    };
    let m =
        "ip saddr @masq-pools-4 ip daddr != @all-pools-4 ip daddr != @all-hosts-4 oifname \"eth*\"";
    assert_eq!(
        nat_outgoing_rules(&nat, 4),
        vec![
            format!("{m} meta l4proto tcp masquerade to :40000-41000 fully-random"),
            format!("{m} meta l4proto udp masquerade to :40000-41000 fully-random"),
            format!("{m} masquerade fully-random"),
        ]
    );
    let snat = NatOutgoing {
        address: Some("192.0.2.9".parse().unwrap()),
        port_range: Some((40000, 41000)),
        ..NatOutgoing::default()
    };
    let r = nat_outgoing_rules(&snat, 4);
    assert!(
        r[0].ends_with("meta l4proto tcp snat ip to 192.0.2.9:40000-41000 fully-random"),
        "{r:?}"
    );
    assert!(
        r[2].ends_with("ip daddr != @all-pools-4 snat ip to 192.0.2.9 fully-random"),
        "{r:?}"
    );
    // NATOutgoingAddress is IPv4: IPv6 still masquerades.
    assert!(nat_outgoing_rules(&snat, 6)[2].ends_with("masquerade fully-random"));
    let st = base(
        &NftConfig {
            nat,
            ipv6: false,
            ..NftConfig::default()
        },
        &masq_model(),
    );
    assert_eq!(texts(&st.chains["postrouting"]).len(), 3);
}

#[test]
fn service_cidrs_and_external_nodes_fill_their_sets() {
    let model = DataplaneModel {
        service_cidrs: margay_calc::ServiceCidrs {
            cluster: vec![Cidr::parse("10.96.0.0/12").unwrap()],
            external: vec![Cidr::parse("fd00:96::/108").unwrap()],
            load_balancer: vec![Cidr::parse("198.51.100.0/24").unwrap()],
        },
        ..DataplaneModel::default()
    };
    let cfg = NftConfig {
        external_nodes: vec![Cidr::parse("203.0.113.0/24").unwrap()],
        vxlan_port: Some(4789),
        ..NftConfig::default()
    };
    let st = base(&cfg, &model);
    let elems = |n: &str| st.sets[n].elements.iter().cloned().collect::<Vec<_>>();
    assert_eq!(
        elems("svc-cidrs-4"),
        vec!["10.96.0.0/12".to_string(), "198.51.100.0/24".to_string()]
    );
    assert_eq!(elems("svc-cidrs-6"), vec!["fd00:96::/108".to_string()]);
    assert_eq!(elems("all-hosts-4"), vec!["203.0.113.0/24".to_string()]);
    let fwd = texts(&st.chains["forward"]);
    assert_eq!(
        fwd.last().unwrap(),
        "ip6 daddr @svc-cidrs-6 drop comment \"service address not translated\""
    );
    let input = texts(&st.chains["input"]);
    assert!(
        input.contains(
            &"udp dport 4789 ip saddr != @all-hosts-4 drop comment \"VXLAN from an unknown host\""
                .to_string()
        ),
        "{input:?}"
    );
    let rej = base(
        &NftConfig {
            service_loop: ServiceLoop::Reject,
            ..cfg.clone()
        },
        &model,
    );
    assert!(
        texts(&rej.chains["forward"])
            .iter()
            .any(|r| r.starts_with("ip daddr @svc-cidrs-4 reject"))
    );
    let off = base(
        &NftConfig {
            service_loop: ServiceLoop::Disabled,
            ..cfg.clone()
        },
        &model,
    );
    assert!(
        !texts(&off.chains["forward"])
            .iter()
            .any(|r| r.contains("svc-cidrs"))
    );
    // No service CIDRs: no rule.
    let none = base(&cfg, &DataplaneModel::default());
    assert!(
        !texts(&none.chains["forward"])
            .iter()
            .any(|r| r.contains("svc-cidrs"))
    );
}

#[test]
fn flow_offload_adds_the_flowtable_rule_first() {
    let on = base(
        &NftConfig {
            flow_offload: true,
            ..NftConfig::default()
        },
        &DataplaneModel::default(),
    );
    let fwd = texts(&on.chains["forward"]);
    assert_eq!(
        fwd[0],
        "ct state established,related flow add @ft comment \"offload established flows\""
    );
    assert_eq!(fwd[1], "ct state established,related accept");
    let off = base(&NftConfig::default(), &DataplaneModel::default());
    assert!(
        !texts(&off.chains["forward"])
            .iter()
            .any(|r| r.contains("flow add"))
    );
    assert_eq!(
        flowtable_decl("margay", &[]),
        "add flowtable inet margay ft { hook ingress priority filter; }"
    );
    assert_eq!(
        flowtable_decl("margay", &["cali1".into(), "eth0".into()]),
        "add flowtable inet margay ft { hook ingress priority filter; devices = { \"cali1\", \"eth0\" }; }"
    );
}

#[test]
fn flow_logs_name_every_verdict_with_calicos_prefixes() {
    let cfg = NftConfig {
        flow_logs: true,
        ..NftConfig::default()
    };
    let mut model = DataplaneModel::default();
    let id = PolicyId {
        tier: "default".into(),
        namespace: "shop".into(),
        name: "allow-web".into(),
    };
    model.policies.insert(
        id.clone(),
        Arc::new(ResolvedPolicy {
            inbound: vec![
                allow(Some(6), &[(80, 80)]),
                rule(RuleAction::Deny, None, &[]),
                rule(RuleAction::Log, None, &[]),
            ],
            ..ResolvedPolicy::default()
        }),
    );
    let st = base(&cfg, &model);
    let pol = texts(&st.chains[&policy_chain(&id, true)]);
    assert!(
        pol[0].ends_with(
            "log prefix \"API0|np/shop/allow-web\" group 1 snaplen 80 meta mark set meta mark | 0x10000 accept"
        ),
        "{pol:?}"
    );
    // (Each rule is one line per family.)
    assert!(
        pol[2].ends_with("log prefix \"DPI1|np/shop/allow-web\" group 1 snaplen 80 drop"),
        "{pol:?}"
    );
    // A Log rule keeps its own log statement only.
    assert!(!pol[4].contains("group 1"), "{pol:?}");
    let tier = TierInfo {
        name: "default".into(),
        default_action: RuleAction::Deny,
        ingress_policies: vec![id.clone()],
        egress_policies: vec![id.clone()],
    };
    let (ids, map) = rendered(&cfg, &[("p", vec![allow(None, &[])])]);
    let tier_rules = texts(&tier_chain(&tier, &ids, false, &cfg, &map));
    assert!(
        tier_rules
            .last()
            .unwrap()
            .starts_with("log prefix \"DPE|default\" group 2 snaplen 80 drop"),
        "{tier_rules:?}"
    );
    let egress = ep_rules(&cfg, false, &map, vec![tier.clone()]);
    assert!(
        egress
            .last()
            .unwrap()
            .starts_with("log prefix \"DRE\" group 2 snaplen 80 drop"),
        "{egress:?}"
    );
    // Off (the default): no flow-log statements at all.
    let plain = base(&NftConfig::default(), &model);
    assert!(
        plain
            .chains
            .values()
            .flat_map(texts)
            .all(|r| !r.contains(" group ")),
        "flow logs rendered while off"
    );
    // Felix's table names every prefix rendered.
    model.workload_endpoints.insert(
        WorkloadEndpointId {
            orchestrator: "k8s".into(),
            workload: "shop/w".into(),
            endpoint: "eth0".into(),
        },
        Arc::new(workload("cali1", vec![tier])),
    );
    let table = flow_prefix_table(&model);
    let (rule, tier_name) = table.lookup("API0|np/shop/allow-web").unwrap();
    assert_eq!(tier_name, "default");
    assert_eq!(rule.rule_index, Some(0));
    assert!(table.lookup("DPE|default").is_some());
    assert!(table.lookup("DRI").is_some());
}

// ---- host endpoints ----------------------------------------------------------------------

fn gnp(
    name: &str,
    inbound: Vec<ResolvedRule>,
    outbound: Vec<ResolvedRule>,
) -> (PolicyId, Arc<ResolvedPolicy>) {
    (
        PolicyId {
            tier: "default".into(),
            namespace: String::new(),
            name: name.into(),
        },
        Arc::new(ResolvedPolicy {
            namespace: String::new(),
            tier: "default".into(),
            inbound,
            outbound,
            untracked: false,
            pre_dnat: false,
            apply_on_forward: false,
            original_selector: String::new(),
        }),
    )
}

fn one_tier(ingress: &[&PolicyId], egress: &[&PolicyId]) -> Vec<TierInfo> {
    vec![TierInfo {
        name: "default".into(),
        default_action: RuleAction::Deny,
        ingress_policies: ingress.iter().map(|p| (*p).clone()).collect(),
        egress_policies: egress.iter().map(|p| (*p).clone()).collect(),
    }]
}

fn hep(iface: &str) -> HostEndpointData {
    HostEndpointData {
        interface: iface.into(),
        expected_ipv4: Vec::new(),
        expected_ipv6: Vec::new(),
        profile_ids: Vec::new(),
        tiers: Vec::new(),
        untracked_tiers: Vec::new(),
        pre_dnat_tiers: Vec::new(),
        forward_tiers: Vec::new(),
    }
}

fn hep_model(
    heps: Vec<(&str, HostEndpointData)>,
    pols: Vec<(PolicyId, Arc<ResolvedPolicy>)>,
) -> DataplaneModel {
    DataplaneModel {
        host_endpoints: heps
            .into_iter()
            .map(|(id, h)| (id.to_string(), Arc::new(h)))
            .collect(),
        policies: pols.into_iter().collect(),
        ..DataplaneModel::default()
    }
}

#[test]
fn without_host_endpoints_nothing_host_related_is_rendered() {
    let st = base(&NftConfig::default(), &DataplaneModel::default());
    for name in [
        "output",
        "hep-in",
        "failsafe-in",
        "raw-prerouting",
        "mangle-prerouting",
    ] {
        assert!(!st.chains.contains_key(name), "{name}");
    }
    assert!(
        !texts(&st.chains["input"])
            .iter()
            .any(|r| r.contains("hep-in"))
    );
}

#[test]
fn a_host_endpoint_without_policy_drops_all_but_failsafe_and_established() {
    let cfg = NftConfig {
        ipv6: false,
        failsafe_in: vec![
            FailsafePort::tcp(22),
            FailsafePort {
                protocol: 17,
                port: 68,
                net: Some(Cidr::parse("10.0.0.0/8").unwrap()),
            },
        ],
        failsafe_out: vec![FailsafePort::udp(53)],
        ..NftConfig::default()
    };
    let st = base(&cfg, &hep_model(vec![("h", hep("eth0"))], vec![]));
    assert_eq!(
        texts(&st.chains["hi-eth0"]),
        vec![
            "ct state established,related accept",
            "ct state invalid drop",
            "jump failsafe-in",
            "meta mark set meta mark and 0xfffcffff",
            "drop comment \"no policy or profile allowed the packet\"",
        ]
    );
    assert_eq!(texts(&st.chains["ho-eth0"])[2], "jump failsafe-out");
    assert_eq!(
        texts(&st.chains["failsafe-in"]),
        vec![
            "meta l4proto 6 th dport 22 accept",
            "ip saddr 10.0.0.0/8 meta l4proto 17 th dport 68 accept",
        ]
    );
    assert_eq!(
        texts(&st.chains["failsafe-out"]),
        vec!["meta l4proto 17 th dport 53 accept"]
    );
    // The host's own dispatch: workloads never reach host endpoint chains.
    assert_eq!(
        texts(&st.chains["hep-in"]),
        vec!["iifname \"cali*\" return", "iifname \"eth0\" goto hi-eth0"]
    );
    assert_eq!(
        texts(&st.chains["hep-out"]),
        vec!["oifname \"eth0\" goto ho-eth0"]
    );
    let input = texts(&st.chains["input"]);
    let wl = input.iter().position(|r| r.contains("wl-to-host")).unwrap();
    let hep_at = input.iter().position(|r| r == "jump hep-in").unwrap();
    assert!(wl < hep_at, "{input:?}");
    assert_eq!(hep_at, input.len() - 1);
    let output = texts(&st.chains["output"]);
    assert_eq!(
        output.first().unwrap(),
        "meta mark and 0x10000 != 0 accept comment \"allowed by doNotTrack or preDNAT policy\""
    );
    assert_eq!(output.last().unwrap(), "jump hep-out");
    // No applyOnForward policy: forwarded traffic through it is not affected.
    assert_eq!(
        texts(&st.chains["hep-fwd-in"]),
        vec!["iifname \"cali*\" return", "iifname \"eth0\" return"]
    );
    assert!(!st.chains.contains_key("hfi-eth0"));
    // Neither raw nor mangle without doNotTrack / preDNAT policy.
    assert!(!st.chains.contains_key("raw-prerouting"));
    assert!(!st.chains.contains_key("mangle-prerouting"));
}

#[test]
fn host_endpoint_policies_land_in_their_hooks_in_calicos_order() {
    let cfg = NftConfig {
        ipv6: false,
        ..NftConfig::default()
    };
    let (normal, normal_p) = gnp(
        "normal",
        vec![allow(Some(6), &[(80, 80)])],
        vec![allow(None, &[])],
    );
    let (fwd, fwd_p) = gnp("fwd", vec![allow(Some(6), &[(8080, 8080)])], vec![]);
    let (pre, pre_p) = gnp(
        "pre",
        vec![rule(RuleAction::Deny, Some(6), &[(81, 81)])],
        vec![],
    );
    let (dnt, dnt_p) = gnp(
        "dnt",
        vec![allow(Some(17), &[(5000, 5000)])],
        vec![allow(Some(17), &[(5000, 5000)])],
    );
    let mut h = hep("eth0");
    h.tiers = one_tier(&[&normal, &fwd], &[&normal]);
    h.forward_tiers = one_tier(&[&fwd], &[]);
    h.pre_dnat_tiers = one_tier(&[&pre], &[]);
    h.untracked_tiers = one_tier(&[&dnt], &[&dnt]);
    h.profile_ids = vec!["prof".into()];
    let mut model = hep_model(
        vec![("h", h)],
        vec![
            (normal.clone(), normal_p),
            (fwd.clone(), fwd_p),
            (pre.clone(), pre_p),
            (dnt.clone(), dnt_p),
        ],
    );
    model.profiles.insert(
        "prof".into(),
        Arc::new(ResolvedProfile {
            inbound: vec![],
            outbound: vec![],
        }),
    );
    let st = base(&cfg, &model);
    // Normal ingress: tiers (the workloads' accepting chains), then the profile, then drop.
    let hi = texts(&st.chains["hi-eth0"]);
    assert_eq!(
        &hi[2..],
        &[
            "jump failsafe-in".to_string(),
            "meta mark set meta mark and 0xfffcffff".into(),
            "jump hi-eth0-0".into(),
            format!("jump {}", profile_chain("prof", true)),
            "drop comment \"no policy or profile allowed the packet\"".into(),
        ]
    );
    let tier = texts(&st.chains["hi-eth0-0"]);
    assert!(
        tier.iter()
            .any(|r| r.ends_with(&format!("jump {}", policy_chain(&normal, true)))),
        "{tier:?}"
    );
    // Forward: only the applyOnForward policy, through its returning copy, no failsafe.
    let hfi = texts(&st.chains["hfi-eth0"]);
    assert!(!hfi.iter().any(|r| r.contains("failsafe")), "{hfi:?}");
    let tier = texts(&st.chains["hfi-eth0-0"]);
    assert!(
        tier.iter()
            .any(|r| r.ends_with(&format!("jump {}", returning_policy_chain(&fwd)))),
        "{tier:?}"
    );
    assert!(
        !tier
            .iter()
            .any(|r| r.contains(&returning_policy_chain(&normal))),
        "{tier:?}"
    );
    let pir = texts(&st.chains[&returning_policy_chain(&fwd)]);
    assert!(
        pir[0].ends_with("meta mark set meta mark | 0x10000 return"),
        "{pir:?}"
    );
    // The forward dispatch: egress has no applyOnForward policy, so it is left alone.
    assert_eq!(
        texts(&st.chains["hep-fwd-in"])[1],
        "iifname \"eth0\" goto hfi-eth0"
    );
    assert_eq!(
        texts(&st.chains["hep-fwd-out"])[1],
        "oifname \"eth0\" return"
    );
    let fwd_base = texts(&st.chains["forward"]);
    let pos = |s: &str| fwd_base.iter().position(|r| r.contains(s)).unwrap();
    assert!(
        pos("hep-fwd-in") < pos("from-wl") && pos("to-wl") < pos("hep-fwd-out"),
        "{fwd_base:?}"
    );
    // preDNAT: mangle prerouting, new flows only, failsafe first, the tier passes at its end.
    let mangle = &st.chains["mangle-prerouting"];
    assert_eq!(
        mangle.base.as_deref(),
        Some("type filter hook prerouting priority mangle; policy accept;")
    );
    assert_eq!(texts(mangle)[0], "ct state established,related accept");
    let hpi = texts(&st.chains["hpi-eth0"]);
    assert_eq!(hpi[0], "jump failsafe-in");
    assert!(!hpi.iter().any(|r| r.starts_with("drop")), "{hpi:?}");
    assert!(
        texts(&st.chains["hpi-eth0-0"])
            .last()
            .unwrap()
            .contains("0x20000 return")
    );
    // doNotTrack: raw, both directions, allowed packets are untracked.
    assert_eq!(
        st.chains["raw-prerouting"].base.as_deref(),
        Some("type filter hook prerouting priority raw; policy accept;")
    );
    assert_eq!(
        st.chains["raw-output"].base.as_deref(),
        Some("type filter hook output priority raw; policy accept;")
    );
    let hri = texts(&st.chains["hri-eth0"]);
    assert_eq!(hri[0], "jump failsafe-in-raw");
    assert!(
        hri.contains(&"meta mark and 0x10000 != 0 notrack accept".to_string()),
        "{hri:?}"
    );
    assert!(
        texts(&st.chains["hro-eth0"])
            .contains(&"meta mark and 0x10000 != 0 notrack accept".to_string())
    );
    // Replies of failsafe connections escape doNotTrack policy: source port 179 (outbound
    // failsafe) comes in, source port 22 (inbound failsafe) goes out.
    assert!(
        texts(&st.chains["failsafe-in-raw"])
            .contains(&"meta l4proto 6 th sport 179 accept".to_string())
    );
    assert!(
        texts(&st.chains["failsafe-out-raw"])
            .contains(&"meta l4proto 6 th sport 22 accept".to_string())
    );
}

#[test]
fn named_host_endpoints_win_over_star_which_takes_the_rest_but_no_do_not_track() {
    let cfg = NftConfig {
        ipv6: false,
        ..NftConfig::default()
    };
    let (dnt, dnt_p) = gnp("dnt", vec![allow(None, &[])], vec![]);
    let mut star = hep("*");
    star.untracked_tiers = one_tier(&[&dnt], &[]);
    // Two endpoints on one interface: the lowest id wins.
    let mut second = hep("eth0");
    second.profile_ids = vec!["never".into()];
    let st = base(
        &cfg,
        &hep_model(
            vec![
                ("a", hep("eth0")),
                ("b", second),
                ("c", star),
                ("d", hep("cali123")),
            ],
            vec![(dnt, dnt_p)],
        ),
    );
    assert_eq!(
        texts(&st.chains["hep-in"]),
        vec![
            "iifname \"cali*\" return",
            "iifname \"eth0\" goto hi-eth0",
            "goto hi_any"
        ]
    );
    assert!(
        !texts(&st.chains["hi-eth0"])
            .iter()
            .any(|r| r.contains(&profile_chain("never", true)))
    );
    assert!(!st.chains.contains_key("hi-cali123"));
    assert!(!st.chains.contains_key("raw-prerouting"));
    assert!(!st.chains.contains_key("hri_any"));
}

#[test]
fn a_changed_host_endpoint_changes_only_its_chains() {
    let cfg = NftConfig::default();
    let (p, pp) = gnp("p", vec![allow(Some(6), &[(80, 80)])], vec![]);
    let mut r = Renderer::new();
    let before = r
        .render(
            &hep_model(
                vec![("a", hep("eth0")), ("b", hep("eth1"))],
                vec![(p.clone(), pp.clone())],
            ),
            &cfg,
        )
        .0;
    let mut h = hep("eth1");
    h.tiers = one_tier(&[&p], &[]);
    let after = r
        .render(
            &hep_model(vec![("a", hep("eth0")), ("b", h)], vec![(p, pp)]),
            &cfg,
        )
        .0;
    let changed: Vec<&String> = after
        .chains
        .iter()
        .filter(|(n, c)| before.chains.get(*n) != Some(*c))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(changed, vec!["hi-eth1", "hi-eth1-0"]);
}

#[test]
fn host_endpoints_are_summarised_for_the_status_api() {
    let (p, pp) = gnp("p", vec![allow(Some(6), &[(80, 80)])], vec![]);
    let mut h = hep("eth0");
    h.tiers = one_tier(&[&p], &[]);
    let (_, summaries) = Renderer::new().render(
        &hep_model(vec![("a", h), ("b", hep("*"))], vec![(p, pp)]),
        &NftConfig::default(),
    );
    let eth0 = summaries.iter().find(|s| s.interface == "eth0").unwrap();
    assert_eq!(eth0.chains, vec!["hi-eth0-0", "hi-eth0", "ho-eth0"]);
    assert!(eth0.rules > 5, "{eth0:?}");
    let star = summaries.iter().find(|s| s.interface == "*").unwrap();
    assert_eq!(star.chains, vec!["hi_any", "ho_any"]);
}

#[test]
fn host_endpoints_with_names_nft_cannot_take_are_ignored() {
    let st = base(
        &NftConfig::default(),
        &hep_model(
            vec![
                ("a", hep("eth0")),
                ("b", hep("x\"; flush ruleset")),
                ("c", hep("eth*")),
                ("d", hep("averyveryverylongname")),
            ],
            vec![],
        ),
    );
    let dispatch = texts(&st.chains["hep-in"]);
    assert_eq!(
        dispatch,
        vec!["iifname \"cali*\" return", "iifname \"eth0\" goto hi-eth0"]
    );
}
