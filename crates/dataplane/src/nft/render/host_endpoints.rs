//! Host endpoints: policy for traffic to, from and through the host's own interfaces.
//!
//! Each host endpoint of this node with an interface name (`*`: every interface no other host
//! endpoint names; a workload interface never) gets chains per place its policies apply,
//! reached from per-hook dispatch chains that `goto` the chain of the packet's interface (so
//! a named endpoint's chain is the only one that runs, and a `*` endpoint covers the rest):
//!
//! ```text
//! raw prerouting/output (doNotTrack, named only) ─► hep-raw-in/out ─► hri-/hro-<if>:
//!     failsafe-*-raw ─► clear marks ─► tiers (Pass at end) ─► [accept bit ⇒ notrack accept]
//! mangle prerouting (preDNAT, ingress): established accept ─► raw-accepted accept ─►
//!     hep-pre ─► hpi-<if>: failsafe-in ─► clear marks ─► tiers (Pass at end)
//! input:   … workloads … ─► raw/mangle-accepted accept ─► hep-in ─► hi-<if>
//! output:  raw-accepted accept ─► workloads return ─► hep-out ─► ho-<if>
//! hi-/ho-<if>: established accept ─► invalid drop ─► failsafe-in/out ─► clear marks ─►
//!     tiers ─► profiles ─► drop
//! forward: established ─► hep-fwd-in (hfi-<if>) ─► from-wl ─► to-wl ─► hep-fwd-out (hfo-<if>)
//! hfi-/hfo-<if> (only with applyOnForward policies in that direction, else the default
//!     accepts): clear marks ─► tiers ─► profiles ─► drop
//! ```
//!
//! Policy chains in the forward hook and in raw must return (the workload's policy comes
//! after, or the notrack), so ingress policies and profiles get a returning copy there
//! (`pir-`/`prir-`); everywhere else they are the workloads' chains. An endpoint with only
//! expected IPs (no interface name) gets no chains: margay does not learn interface addresses.

use super::*;

/// One failsafe entry (FailsafeInboundHostPorts / FailsafeOutboundHostPorts): a protocol
/// (6 or 17), a port and, optionally, the network on the other side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailsafePort {
    pub protocol: u8,
    pub port: u16,
    pub net: Option<Cidr>,
}

impl FailsafePort {
    pub const fn tcp(port: u16) -> FailsafePort {
        FailsafePort {
            protocol: 6,
            port,
            net: None,
        }
    }

    pub const fn udp(port: u16) -> FailsafePort {
        FailsafePort {
            protocol: 17,
            port,
            net: None,
        }
    }
}

/// Calico's default FailsafeInboundHostPorts.
pub const DEFAULT_FAILSAFE_IN: [FailsafePort; 9] = [
    FailsafePort::tcp(22),
    FailsafePort::udp(68),
    FailsafePort::tcp(179),
    FailsafePort::tcp(2379),
    FailsafePort::tcp(2380),
    FailsafePort::tcp(5473),
    FailsafePort::tcp(6443),
    FailsafePort::tcp(6666),
    FailsafePort::tcp(6667),
];

/// Calico's default FailsafeOutboundHostPorts.
pub const DEFAULT_FAILSAFE_OUT: [FailsafePort; 9] = [
    FailsafePort::udp(53),
    FailsafePort::udp(67),
    FailsafePort::tcp(179),
    FailsafePort::tcp(2379),
    FailsafePort::tcp(2380),
    FailsafePort::tcp(5473),
    FailsafePort::tcp(6443),
    FailsafePort::tcp(6666),
    FailsafePort::tcp(6667),
];

/// The chain of kind `kind` (`hi`, `ho`, `hfi`, `hfo`, `hpi`, `hri`, `hro`) for a host
/// endpoint's interface; `*` gets `<kind>_any`, which never collides with a named one
/// (those are `<kind>-<if>`).
pub fn hep_chain(kind: &str, iface: &str) -> String {
    if iface == "*" {
        format!("{kind}_any")
    } else {
        format!("{kind}-{iface}")
    }
}

/// Ingress policy chain that returns with the accept bit instead of accepting (forward hook
/// and raw, where more must run after an Allow).
pub fn returning_policy_chain(id: &PolicyId) -> String {
    let key = format!("{}/{}/{}", id.tier, id.namespace, id.name);
    format!("pir-{}", short_hash(&key))
}

/// Ingress profile chain that returns with the accept bit (see [`returning_policy_chain`]).
pub fn returning_profile_chain(id: &str) -> String {
    format!("prir-{}", short_hash(id))
}

pub const CHAIN_FAILSAFE_IN: &str = "failsafe-in";
pub const CHAIN_FAILSAFE_OUT: &str = "failsafe-out";
pub const CHAIN_FAILSAFE_IN_RAW: &str = "failsafe-in-raw";
pub const CHAIN_FAILSAFE_OUT_RAW: &str = "failsafe-out-raw";

/// The host endpoints that get chains, by interface: the lowest id wins an interface (and
/// `*`); workload interfaces and endpoints without an interface name are left out.
pub fn active_host_endpoints<'a>(
    model: &'a DataplaneModel,
    cfg: &NftConfig,
) -> BTreeMap<&'a str, &'a HostEndpointData> {
    let mut out: BTreeMap<&str, &HostEndpointData> = BTreeMap::new();
    for ep in model.host_endpoints.values() {
        let iface = ep.interface.as_str();
        if iface.is_empty() {
            continue;
        }
        // The name goes into nft text (a match and chain names): only what the API allows,
        // so a stored value that bypassed validation cannot break the whole ruleset.
        let valid = iface == "*"
            || (iface.len() <= 15
                && iface
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-')));
        if !valid {
            tracing::warn!(interface = ?iface, "host endpoint with an invalid interface name ignored");
            continue;
        }
        if cfg
            .workload_prefixes
            .iter()
            .any(|p| iface != "*" && iface.starts_with(p.as_str()))
        {
            continue;
        }
        out.entry(iface).or_insert(ep);
    }
    out
}

/// What the base chains need to know about the host endpoints rendered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct HepHooks {
    /// Any host endpoint: input and output dispatch to them, forward dispatches too.
    pub any: bool,
}

fn failsafe_rules(ports: &[FailsafePort], cfg: &NftConfig, src: bool, sport: bool) -> Vec<String> {
    let mut out = Vec::new();
    for p in ports {
        let port_kw = if sport { "sport" } else { "dport" };
        let l4 = format!("meta l4proto {} th {port_kw} {}", p.protocol, p.port);
        match p.net {
            None => out.push(format!("{l4} accept")),
            Some(net) => {
                if !net.is_ipv4() && !cfg.ipv6 {
                    continue;
                }
                let fam = fam_prefix(net.version());
                let dir = if src { "saddr" } else { "daddr" };
                out.push(format!("{fam} {dir} {} {l4} accept", cidr_elem(&net)));
            }
        }
    }
    out
}

fn plain(rules: Vec<String>) -> ChainSpec {
    ChainSpec {
        base: None,
        rules: rules.into_iter().map(NftRule::new).collect(),
    }
}

/// How one host endpoint chain calls its policies and profiles.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flavor {
    /// The workloads' chains (ingress accepts on Allow with the ACCEPT verdict).
    Shared,
    /// Ingress policies and profiles return with the accept bit (`pir-`/`prir-`).
    Returning,
}

struct HepChain<'a> {
    name: String,
    tiers: &'a [TierInfo],
    ingress: bool,
    flavor: Flavor,
    /// Tiers end in Pass whatever their default (doNotTrack and preDNAT).
    force_pass: bool,
    /// Rules before the marks are cleared (conntrack, failsafe).
    head: Vec<String>,
    /// After each tier: what to do when the accept bit is set.
    on_accept: &'static str,
    profiles: &'a [String],
    /// Drop at the end (normal and forward chains); otherwise return.
    final_drop: bool,
}

fn render_hep_chain(
    st: &mut NftState,
    summary: &mut EndpointChains,
    c: HepChain<'_>,
    cfg: &NftConfig,
    ret_cfg: &NftConfig,
    model: &DataplaneModel,
    rendered: &HashMap<PolicyId, RenderedPolicy>,
) {
    let both = cfg.mark_accept | cfg.mark_pass;
    let mut rules = c.head;
    rules.push(format!("meta mark set meta mark and {:#x}", !both));
    // Whether an Allow in an ingress chain called from here accepts by itself.
    let accepts_directly = c.ingress && c.flavor == Flavor::Shared && cfg.ingress_accepts();
    for (i, tier) in c.tiers.iter().enumerate() {
        let policies = if c.ingress {
            &tier.ingress_policies
        } else {
            &tier.egress_policies
        };
        if policies.is_empty() {
            continue;
        }
        let mut tier = tier.clone();
        if c.force_pass {
            tier.default_action = RuleAction::Pass;
        }
        let name = format!("{}-{i}", c.name);
        summary.chains.push(name.clone());
        let chain = match c.flavor {
            Flavor::Returning => {
                let call_of = |p: &PolicyId| {
                    model.policies.get(p).map(|pol| {
                        let rules = if c.ingress {
                            &pol.inbound
                        } else {
                            &pol.outbound
                        };
                        PolicyCall::new(rules, ret_cfg, c.ingress)
                    })
                };
                let chain_of = |p: &PolicyId| {
                    if c.ingress {
                        returning_policy_chain(p)
                    } else {
                        policy_chain(p, false)
                    }
                };
                tier_chain_with(&tier, policies, c.ingress, cfg, &call_of, &chain_of)
            }
            Flavor::Shared => tier_chain(&tier, policies, c.ingress, cfg, rendered),
        };
        summary.rules += chain.rules.len();
        st.chains.insert(name.clone(), chain);
        rules.push(format!("jump {name}"));
        if !accepts_directly {
            rules.push(format!(
                "meta mark and {:#x} != 0 {}",
                cfg.mark_accept, c.on_accept
            ));
        }
    }
    for p in c.profiles {
        let chain = if c.ingress && c.flavor == Flavor::Returning {
            returning_profile_chain(p)
        } else {
            profile_chain(p, c.ingress)
        };
        rules.push(format!("jump {chain}"));
        if !accepts_directly {
            rules.push(format!(
                "meta mark and {:#x} != 0 {}",
                cfg.mark_accept, c.on_accept
            ));
        }
    }
    if c.final_drop {
        rules.push(format!(
            "{} comment \"no policy or profile allowed the packet\"",
            cfg.deny()
        ));
    }
    summary.rules += rules.len();
    summary.chains.push(c.name.clone());
    st.chains.insert(c.name, plain(rules));
}

fn has_direction(tiers: &[TierInfo], ingress: bool) -> bool {
    tiers.iter().any(|t| {
        if ingress {
            !t.ingress_policies.is_empty()
        } else {
            !t.egress_policies.is_empty()
        }
    })
}

/// Renders every host endpoint chain, the dispatch and failsafe chains, the raw and mangle
/// base chains (only while doNotTrack / preDNAT policy applies) and the returning policy
/// copies; adds one summary per host endpoint (its interface, or `*`). Returns what the
/// filter base chains must add.
pub(super) fn render_host_endpoints(
    st: &mut NftState,
    summaries: &mut Vec<EndpointChains>,
    model: &DataplaneModel,
    cfg: &NftConfig,
    rendered: &HashMap<PolicyId, RenderedPolicy>,
) -> HepHooks {
    let heps = active_host_endpoints(model, cfg);
    if heps.is_empty() {
        return HepHooks::default();
    }
    let ret_cfg = NftConfig {
        allow: AllowVerdict::Return,
        ..cfg.clone()
    };
    let mut ct_head = vec!["ct state established,related accept".to_string()];
    if cfg.ipv6 {
        // Neighbour discovery is never tracked (conntrack may call it invalid): without it
        // the host loses IPv6 on the interface, which no failsafe port would bring back.
        ct_head.push(
            "icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert } accept"
                .to_string(),
        );
    }
    if cfg.conntrack_invalid_drop {
        ct_head.push(format!("ct state invalid {}", cfg.deny()));
    }

    // Failsafe chains: reached only from host endpoint chains.
    st.chains.insert(
        CHAIN_FAILSAFE_IN.into(),
        plain(failsafe_rules(&cfg.failsafe_in, cfg, true, false)),
    );
    st.chains.insert(
        CHAIN_FAILSAFE_OUT.into(),
        plain(failsafe_rules(&cfg.failsafe_out, cfg, false, false)),
    );

    // The returning ingress copies that forward and raw chains call.
    let mut returning_policies = BTreeSet::new();
    let mut returning_profiles = BTreeSet::new();

    let mut d_in = Vec::new();
    let mut d_out = Vec::new();
    let mut d_fwd_in = Vec::new();
    let mut d_fwd_out = Vec::new();
    let mut d_pre = Vec::new();
    let mut d_raw_in = Vec::new();
    let mut d_raw_out = Vec::new();
    for p in &cfg.workload_prefixes {
        let p = p.replace('"', "");
        for d in [&mut d_in, &mut d_fwd_in, &mut d_pre] {
            d.push(format!("iifname \"{p}*\" return"));
        }
        d_fwd_out.push(format!("oifname \"{p}*\" return"));
    }
    // Named endpoints first: the `*` endpoint takes what is left.
    let mut ordered: Vec<(&str, &HostEndpointData)> = heps
        .iter()
        .filter(|(i, _)| **i != "*")
        .map(|(i, e)| (*i, *e))
        .collect();
    if let Some(star) = heps.get("*") {
        ordered.push(("*", star));
    }
    for (iface, ep) in ordered {
        let mut summary = EndpointChains {
            interface: iface.to_string(),
            ..EndpointChains::default()
        };
        let star = iface == "*";
        let m_in = if star {
            String::new()
        } else {
            format!("iifname \"{iface}\" ")
        };
        let m_out = if star {
            String::new()
        } else {
            format!("oifname \"{iface}\" ")
        };
        // Normal policy: traffic to and from the host itself.
        for ingress in [true, false] {
            let name = hep_chain(if ingress { "hi" } else { "ho" }, iface);
            let mut head = ct_head.clone();
            head.push(format!(
                "jump {}",
                if ingress {
                    CHAIN_FAILSAFE_IN
                } else {
                    CHAIN_FAILSAFE_OUT
                }
            ));
            render_hep_chain(
                st,
                &mut summary,
                HepChain {
                    name: name.clone(),
                    tiers: &ep.tiers,
                    ingress,
                    flavor: Flavor::Shared,
                    force_pass: false,
                    head,
                    on_accept: "return",
                    profiles: &ep.profile_ids,
                    final_drop: true,
                },
                cfg,
                &ret_cfg,
                model,
                rendered,
            );
            if ingress {
                d_in.push(format!("{m_in}goto {name}"));
            } else {
                d_out.push(format!("{m_out}goto {name}"));
            }
        }
        // applyOnForward policy: forwarded traffic; without any in a direction, the
        // default lets it through.
        for ingress in [true, false] {
            let (d, m) = if ingress {
                (&mut d_fwd_in, &m_in)
            } else {
                (&mut d_fwd_out, &m_out)
            };
            if !has_direction(&ep.forward_tiers, ingress) {
                if !star {
                    d.push(format!("{m}return"));
                }
                continue;
            }
            let name = hep_chain(if ingress { "hfi" } else { "hfo" }, iface);
            if ingress {
                returning_policies.extend(
                    ep.forward_tiers
                        .iter()
                        .flat_map(|t| t.ingress_policies.iter().cloned()),
                );
                returning_profiles.extend(ep.profile_ids.iter().cloned());
            }
            render_hep_chain(
                st,
                &mut summary,
                HepChain {
                    name: name.clone(),
                    tiers: &ep.forward_tiers,
                    ingress,
                    flavor: Flavor::Returning,
                    force_pass: false,
                    head: Vec::new(),
                    on_accept: "return",
                    profiles: &ep.profile_ids,
                    final_drop: true,
                },
                cfg,
                &ret_cfg,
                model,
                rendered,
            );
            d.push(format!("{m}goto {name}"));
        }
        // preDNAT policy: ingress only, before DNAT, new flows only.
        if has_direction(&ep.pre_dnat_tiers, true) {
            let name = hep_chain("hpi", iface);
            render_hep_chain(
                st,
                &mut summary,
                HepChain {
                    name: name.clone(),
                    tiers: &ep.pre_dnat_tiers,
                    ingress: true,
                    flavor: Flavor::Shared,
                    force_pass: true,
                    head: vec![format!("jump {CHAIN_FAILSAFE_IN}")],
                    on_accept: "return",
                    profiles: &[],
                    final_drop: false,
                },
                cfg,
                &ret_cfg,
                model,
                rendered,
            );
            d_pre.push(format!("{m_in}goto {name}"));
        } else if !star {
            d_pre.push(format!("{m_in}return"));
        }
        // doNotTrack policy: raw, both directions; Calico ignores it on `*`.
        if star {
            if has_direction(&ep.untracked_tiers, true) || has_direction(&ep.untracked_tiers, false)
            {
                tracing::warn!(
                    "doNotTrack policy on the \"*\" host endpoint is ignored (as Calico)"
                );
            }
            summaries.push(summary);
            continue;
        }
        for ingress in [true, false] {
            let (d, m) = if ingress {
                (&mut d_raw_in, &m_in)
            } else {
                (&mut d_raw_out, &m_out)
            };
            if !has_direction(&ep.untracked_tiers, ingress) {
                continue;
            }
            let name = hep_chain(if ingress { "hri" } else { "hro" }, iface);
            if ingress {
                returning_policies.extend(
                    ep.untracked_tiers
                        .iter()
                        .flat_map(|t| t.ingress_policies.iter().cloned()),
                );
            }
            render_hep_chain(
                st,
                &mut summary,
                HepChain {
                    name: name.clone(),
                    tiers: &ep.untracked_tiers,
                    ingress,
                    flavor: Flavor::Returning,
                    force_pass: true,
                    head: vec![format!(
                        "jump {}",
                        if ingress {
                            CHAIN_FAILSAFE_IN_RAW
                        } else {
                            CHAIN_FAILSAFE_OUT_RAW
                        }
                    )],
                    on_accept: "notrack accept",
                    profiles: &[],
                    final_drop: false,
                },
                cfg,
                &ret_cfg,
                model,
                rendered,
            );
            d.push(format!("{m}goto {name}"));
        }
        summaries.push(summary);
    }

    for id in &returning_policies {
        if let Some(pol) = model.policies.get(id) {
            let owner = LogOwner::policy(id);
            st.chains.insert(
                returning_policy_chain(id),
                rules_chain(&pol.inbound, &ret_cfg, &owner, true),
            );
        }
    }
    for id in &returning_profiles {
        if let Some(prof) = model.profiles.get(id) {
            let owner = LogOwner::profile(id);
            st.chains.insert(
                returning_profile_chain(id),
                rules_chain(&prof.inbound, &ret_cfg, &owner, true),
            );
        }
    }

    let accept_bit = format!("meta mark and {:#x} != 0", cfg.mark_accept);
    for (name, rules) in [
        ("hep-in", d_in),
        ("hep-out", d_out),
        ("hep-fwd-in", d_fwd_in),
        ("hep-fwd-out", d_fwd_out),
    ] {
        st.chains.insert(name.into(), plain(rules));
    }
    if d_pre.iter().any(|r| r.contains("goto")) {
        st.chains.insert("hep-pre".into(), plain(d_pre));
        st.chains.insert(
            "mangle-prerouting".into(),
            ChainSpec {
                base: Some("type filter hook prerouting priority mangle; policy accept;".into()),
                rules: [
                    // preDNAT policy sees new flows only.
                    "ct state established,related accept".to_string(),
                    format!("{accept_bit} accept comment \"allowed by doNotTrack policy\""),
                    "jump hep-pre".to_string(),
                ]
                .into_iter()
                .map(NftRule::new)
                .collect(),
            },
        );
    }
    if !d_raw_in.is_empty() || !d_raw_out.is_empty() {
        // Replies of failsafe connections must escape doNotTrack policy too.
        let mut raw_in = failsafe_rules(&cfg.failsafe_in, cfg, true, false);
        raw_in.extend(failsafe_rules(&cfg.failsafe_out, cfg, true, true));
        let mut raw_out = failsafe_rules(&cfg.failsafe_out, cfg, false, false);
        raw_out.extend(failsafe_rules(&cfg.failsafe_in, cfg, false, true));
        st.chains
            .insert(CHAIN_FAILSAFE_IN_RAW.into(), plain(raw_in));
        st.chains
            .insert(CHAIN_FAILSAFE_OUT_RAW.into(), plain(raw_out));
        for (name, hook, dispatch, rules) in [
            ("raw-prerouting", "prerouting", "hep-raw-in", d_raw_in),
            ("raw-output", "output", "hep-raw-out", d_raw_out),
        ] {
            st.chains.insert(dispatch.into(), plain(rules));
            st.chains.insert(
                name.into(),
                ChainSpec {
                    base: Some(format!(
                        "type filter hook {hook} priority raw; policy accept;"
                    )),
                    rules: vec![NftRule::new(format!("jump {dispatch}"))],
                },
            );
        }
    }
    HepHooks { any: true }
}
