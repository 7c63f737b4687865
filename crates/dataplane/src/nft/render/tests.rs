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
