//! Kubernetes Services without kube-proxy: the service NAT section of `inet margay`, in the
//! style of kube-proxy's nftables mode (pure).
//!
//! Most services (Cluster traffic policies, no session affinity) are nothing but map
//! elements: the frontend's verdict names a chain shared by every service with the same
//! protocol and backend count, which picks a backend and translates in one rule, so an
//! endpoint change is an element change written over netlink, whatever the number of
//! services (a chain change makes `nft` read every chain of the table first):
//!
//! ```text
//! nat prerouting/output (dstnat) ─► services:
//!     ip daddr . meta l4proto . th dport vmap @svc-ips-4   ─► goto svc-pick4-<proto>-<c|x>-<N>
//!     fib daddr type local … meta l4proto . th dport vmap @svc-nodeports-4 ─► goto svc-npick4-<proto>-<N>
//!   svc-pick4-tcp-c-N: ip saddr != @all-pools-4 jump svc-mark-masq   (x: always; ETP Cluster)
//!                      meta l4proto tcp dnat ip to ip daddr . meta l4proto . th dport
//!                          . numgen random mod N map @svc-be-4     (frontend . slot → backend)
//!   svc-npick4-tcp-N:  jump svc-mark-masq; dnat … meta l4proto . th dport . numgen … @svc-npbe-4
//! nat postrouting: ct status dnat, client . backend . ClusterIP . proto . port in
//!     @svc-hairpin-4 (a backend reaching itself through its service) ⇒ masquerade
//! ```
//!
//! Services with a Local traffic policy or ClientIP affinity get chains of their own:
//!
//! ```text
//!   si4-<h> (ClusterIP entry): non-pod source ⇒ mark for masquerade; ITP Local ⇒ sl4-<h>
//!   sx4-<h> (external entry):  ETP Cluster ⇒ mark, sc4-<h>; ETP Local ⇒ pods and the host
//!                              to sc4-<h> (the host masqueraded), others to sl4-<h>
//!   sc4-<h> / sl4-<h>: [ip saddr @aff4-<e> goto ep4-<e>]… numgen random mod N-i 0 goto ep4-<e>…
//!   ep4-<e>: hairpin ⇒ mark; [update @aff4-<e>]; dnat to backend
//! filter input/forward/output (priority filter - 10), new connections:
//!     ip daddr . meta l4proto . th dport vmap @svc-noep-4       (no usable endpoint: reject)
//!     input only: fib daddr type local … vmap @svc-noep-np-4    (NodePorts likewise)
//! nat postrouting: the masquerade mark ⇒ masquerade fully-random
//! ```
//!
//! `<h>` hashes the service port's identity, `<e>` that and the backend, so a backend change
//! rewrites only its own service's chains and map elements. Policy runs in the filter forward
//! hook, after the dstnat hook: it sees the backend, as Calico's does. The section exists only
//! while the model has services.

use margay_calc::services::{Backend, FrontendKind, ServicePort, ServicePortId};

use super::*;

pub const SET_SERVICE_IPS: &str = "svc-ips";
pub const SET_SERVICE_NODEPORTS: &str = "svc-nodeports";
pub const SET_NO_ENDPOINTS: &str = "svc-noep";
pub const SET_NO_ENDPOINT_NODEPORTS: &str = "svc-noep-np";
/// Frontend `. slot` → backend, for the shared pick chains.
pub const SET_BACKENDS: &str = "svc-be";
/// NodePort `. slot` → backend.
pub const SET_NODEPORT_BACKENDS: &str = "svc-npbe";
/// Client . backend . ClusterIP . protocol . port of every backend of the shared path.
pub const SET_HAIRPIN: &str = "svc-hairpin";
const CHAIN_MARK: &str = "svc-mark-masq";
const CHAIN_REJECT: &str = "svc-reject";
const CHAIN_NOEP: &str = "svc-noep";

impl NftConfig {
    /// The mark bit that asks postrouting to masquerade a service connection: kube-proxy's
    /// 0x4000, or the bit above the policy bits if one of them is 0x4000.
    pub fn service_masq_mark(&self) -> u32 {
        let used = self.mark_accept | self.mark_pass;
        if used & 0x4000 == 0 {
            0x4000
        } else {
            let top = 31 - used.leading_zeros();
            1u32.checked_shl(top + 1).unwrap_or(0x8000_0000)
        }
    }
}

/// What one service port contributes to the table. Everything but `picks` belongs to this
/// service port alone (names and keys carry its identity), so a change is planned by
/// comparing the port's old and new rendering only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderedService {
    pub chains: Vec<(String, ChainSpec)>,
    pub sets: Vec<(String, SetSpec)>,
    /// (map, key, verdict or data).
    pub elements: Vec<(String, String, String)>,
    /// (set, element).
    pub set_elements: Vec<(String, String)>,
    /// The shared pick chains and backend-count sets this port needs (the renderer keeps
    /// them while any port does).
    pub picks: Vec<Pick>,
}

/// A shared pick chain's rule for one backend count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pick {
    pub family: u8,
    pub proto: margay_calc::PortProtocol,
    /// 'c' ClusterIP, 'x' external address, 'n' NodePort.
    pub variant: char,
    pub backends: usize,
}

impl Pick {
    fn chain_name(&self) -> String {
        let (f, proto) = (self.family, self.proto);
        match self.variant {
            'n' => format!("svc-npick{f}-{proto}"),
            v => format!("svc-pick{f}-{proto}-{v}"),
        }
    }

    /// The set of frontends (`addr . port`, NodePorts: `port`) with this many backends.
    fn set_name(&self) -> String {
        let (f, proto, n) = (self.family, self.proto, self.backends);
        match self.variant {
            'n' => format!("svc-npn{n}-{proto}-{f}"),
            _ => format!("svc-n{n}-{proto}-{f}"),
        }
    }

    fn set_decl(&self) -> String {
        let addr = if self.family == 4 {
            "ipv4_addr"
        } else {
            "ipv6_addr"
        };
        match self.variant {
            'n' => "type inet_service;".to_string(),
            _ => format!("type {addr} . inet_service;"),
        }
    }
}

/// The shared pick chains and backend-count sets for the picks in use: one chain per family,
/// protocol and kind of frontend, one rule per backend count (a set lookup), so a frontend
/// whose backend count changes moves between sets — element changes only. (A verdict-map
/// element naming a chain per count would make the kernel re-validate every verdict map of
/// the table on each such change: 20 ms of kernel time per change with 10k services.)
pub(super) fn add_picks(st: &mut NftState, picks: impl Iterator<Item = Pick>) {
    for p in picks {
        let fam = fam_prefix(p.family);
        let (f, proto, n) = (p.family, p.proto, p.backends);
        st.sets.entry(p.set_name()).or_insert_with(|| SetSpec {
            decl: p.set_decl(),
            elements: BTreeSet::new(),
        });
        let chain = st.chains.entry(p.chain_name()).or_insert_with(|| {
            let mark = match p.variant {
                // ClusterIP: only sources outside the pods are masqueraded.
                'c' => format!("{fam} saddr != @all-pools-{f} jump {CHAIN_MARK}"),
                // External addresses and NodePorts under ETP Cluster: always.
                _ => format!("jump {CHAIN_MARK}"),
            };
            ChainSpec {
                base: None,
                rules: vec![NftRule::new(mark)],
            }
        });
        // The maps are per protocol: nft 1.0.6 cannot read back a `typeof … th dport` map
        // key under a protocol match ("conflicting protocols specified: tcp vs. th").
        let rule = if p.variant == 'n' {
            format!(
                "{proto} dport @{} dnat {fam} to {proto} dport . numgen random mod {n} map @{SET_NODEPORT_BACKENDS}-{proto}-{f}",
                p.set_name()
            )
        } else {
            format!(
                "{fam} daddr . {proto} dport @{} dnat {fam} to {fam} daddr . {proto} dport . numgen random mod {n} map @{SET_BACKENDS}-{proto}-{f}",
                p.set_name()
            )
        };
        chain.rules.push(NftRule::new(rule));
    }
}

fn backend_data(b: &Backend) -> String {
    format!("{} . {}", b.addr, b.port)
}

fn chain(rules: Vec<String>) -> ChainSpec {
    ChainSpec {
        base: None,
        rules: rules.into_iter().map(NftRule::new).collect(),
    }
}

fn of_family(backends: &[Backend], family: u8) -> Vec<Backend> {
    backends
        .iter()
        .filter(|b| b.addr.is_ipv4() == (family == 4))
        .copied()
        .collect()
}

fn addr_port(b: &Backend) -> String {
    match b.addr {
        IpAddr::V4(a) => format!("{a}:{}", b.port),
        IpAddr::V6(a) => format!("[{a}]:{}", b.port),
    }
}

/// The chains, sets and map elements of one service port (both families as configured).
pub fn render_service(id: &ServicePortId, sp: &ServicePort, cfg: &NftConfig) -> RenderedService {
    let mut out = RenderedService::default();
    let families: &[u8] = if cfg.ipv6 { &[4, 6] } else { &[4] };
    let h = short_hash(&id.to_string());
    let proto = id.protocol.to_string();
    for &f in families {
        // kube-proxy's per-family proxiers: a family is served when the service has a
        // ClusterIP of it (NodePorts and external addresses follow).
        if !sp
            .frontends
            .iter()
            .any(|fe| fe.kind == FrontendKind::ClusterIp && fe.addr.is_ipv4() == (f == 4))
        {
            continue;
        }
        let fam = fam_prefix(f);
        let cluster = of_family(&sp.cluster_backends, f);
        let local = of_family(&sp.local_backends, f);
        let ep_name =
            |b: &Backend| format!("ep{f}-{}", short_hash(&format!("{h}/{}", addr_port(b))));
        let aff_name =
            |b: &Backend| format!("aff{f}-{}", short_hash(&format!("{h}/{}", addr_port(b))));
        let fe_keys: Vec<(bool, String)> = sp
            .frontends
            .iter()
            .filter(|fe| fe.addr.is_ipv4() == (f == 4))
            .map(|fe| {
                (
                    fe.kind == FrontendKind::ClusterIp,
                    format!("{} . {proto} . {}", fe.addr, fe.port),
                )
            })
            .collect();
        // The same frontends in the per-protocol backend maps.
        let fe_slot_keys: Vec<String> = sp
            .frontends
            .iter()
            .filter(|fe| fe.addr.is_ipv4() == (f == 4))
            .map(|fe| format!("{} . {}", fe.addr, fe.port))
            .collect();
        let np_key = sp.node_port.map(|p| format!("{proto} . {p}"));
        if cluster.is_empty() {
            // No usable endpoint anywhere: no translation; the filter hooks reject.
            for (_, key) in fe_keys {
                out.elements.push((
                    format!("{SET_NO_ENDPOINTS}-{f}"),
                    key,
                    format!("goto {CHAIN_REJECT}"),
                ));
            }
            if let Some(key) = np_key {
                out.elements.push((
                    format!("{SET_NO_ENDPOINT_NODEPORTS}-{f}"),
                    key,
                    format!("goto {CHAIN_REJECT}"),
                ));
            }
            continue;
        }
        if !sp.internal_local && !sp.external_local && sp.affinity_timeout.is_none() {
            let n = cluster.len();
            for ((cip, key), slot_key) in fe_keys.iter().zip(&fe_slot_keys) {
                let pick = Pick {
                    family: f,
                    proto: id.protocol,
                    variant: if *cip { 'c' } else { 'x' },
                    backends: n,
                };
                out.elements.push((
                    format!("{SET_SERVICE_IPS}-{f}"),
                    key.clone(),
                    format!("goto {}", pick.chain_name()),
                ));
                out.set_elements.push((pick.set_name(), slot_key.clone()));
                if !out.picks.contains(&pick) {
                    out.picks.push(pick);
                }
                for (slot, b) in cluster.iter().enumerate() {
                    out.elements.push((
                        format!("{SET_BACKENDS}-{proto}-{f}"),
                        format!("{slot_key} . {slot}"),
                        backend_data(b),
                    ));
                }
            }
            for fe in sp
                .frontends
                .iter()
                .filter(|fe| fe.kind == FrontendKind::ClusterIp && fe.addr.is_ipv4() == (f == 4))
            {
                for b in &cluster {
                    out.set_elements.push((
                        format!("{SET_HAIRPIN}-{f}"),
                        format!(
                            "{} . {} . {} . {proto} . {}",
                            b.addr, b.addr, fe.addr, fe.port
                        ),
                    ));
                }
            }
            if let (Some(key), Some(np)) = (np_key, sp.node_port) {
                let pick = Pick {
                    family: f,
                    proto: id.protocol,
                    variant: 'n',
                    backends: n,
                };
                out.elements.push((
                    format!("{SET_SERVICE_NODEPORTS}-{f}"),
                    key,
                    format!("goto {}", pick.chain_name()),
                ));
                out.set_elements.push((pick.set_name(), np.to_string()));
                out.picks.push(pick);
                for (slot, b) in cluster.iter().enumerate() {
                    out.elements.push((
                        format!("{SET_NODEPORT_BACKENDS}-{proto}-{f}"),
                        format!("{np} . {slot}"),
                        backend_data(b),
                    ));
                }
            }
            continue;
        }
        let sc = format!("sc{f}-{h}");
        let sl = format!("sl{f}-{h}");
        let si = format!("si{f}-{h}");
        let sx = format!("sx{f}-{h}");
        let pods = format!("@all-pools-{f}");
        let pick = |list: &[Backend]| -> Vec<String> {
            let mut rules = Vec::new();
            if sp.affinity_timeout.is_some() {
                for b in list {
                    rules.push(format!("{fam} saddr @{} goto {}", aff_name(b), ep_name(b)));
                }
            }
            if list.is_empty() {
                rules.push("drop comment \"no local endpoint\"".to_string());
            }
            // A uniform choice as a cascade: rule i takes the packet with probability
            // 1/(N-i) given it got there (one draw per rule, as iptables' statistic mode).
            // kube-proxy writes one `numgen random mod N vmap { … }`, but every such rule
            // is an anonymous set, and loading thousands of them is quadratic here (3,000:
            // 2.4 s against 0.4 s for 1,000; 10,000 services did not load within 60 s),
            // while the cascade loads in linear time.
            for (i, b) in list.iter().enumerate() {
                let left = list.len() - i;
                if left > 1 {
                    rules.push(format!("numgen random mod {left} 0 goto {}", ep_name(b)));
                } else {
                    rules.push(format!("goto {}", ep_name(b)));
                }
            }
            rules
        };
        out.chains.push((sc.clone(), chain(pick(&cluster))));
        let uses_local = sp.internal_local || sp.external_local;
        if uses_local {
            out.chains.push((sl.clone(), chain(pick(&local))));
        }
        let mut backends: BTreeSet<Backend> = cluster.iter().copied().collect();
        if uses_local {
            backends.extend(local.iter().copied());
        }
        for b in &backends {
            let mut rules = vec![format!(
                "{fam} saddr {} jump {CHAIN_MARK} comment \"hairpin\"",
                b.addr
            )];
            if let Some(t) = sp.affinity_timeout {
                let set = aff_name(b);
                out.sets.push((
                    set.clone(),
                    SetSpec {
                        decl: format!(
                            "type {}; flags dynamic,timeout; timeout {t}s;",
                            if f == 4 { "ipv4_addr" } else { "ipv6_addr" }
                        ),
                        elements: BTreeSet::new(),
                    },
                ));
                rules.push(format!("update @{set} {{ {fam} saddr }}"));
            }
            rules.push(format!(
                "meta l4proto {proto} dnat {fam} to {}",
                addr_port(b)
            ));
            out.chains.push((ep_name(b), chain(rules)));
        }
        // ClusterIP entry: sources outside the pods (the host, other networks) are
        // masqueraded so the replies come back through this node.
        let mut entry = vec![format!("{fam} saddr != {pods} jump {CHAIN_MARK}")];
        if sp.internal_local {
            entry.push(format!("{fam} saddr != {pods} goto {sc}"));
            entry.push(format!("goto {sl}"));
        } else {
            entry.push(format!("goto {sc}"));
        }
        out.chains.push((si.clone(), chain(entry)));
        // External entry (NodePort, ExternalIP, LB IP).
        let external = if sp.external_local {
            vec![
                format!("{fam} saddr {pods} goto {sc}"),
                format!("fib saddr type local jump {CHAIN_MARK}"),
                format!("fib saddr type local goto {sc}"),
                format!("goto {sl}"),
            ]
        } else {
            vec![format!("jump {CHAIN_MARK}"), format!("goto {sc}")]
        };
        let has_external = fe_keys.iter().any(|(cip, _)| !cip) || np_key.is_some();
        if has_external {
            out.chains.push((sx.clone(), chain(external)));
        }
        for (cip, key) in fe_keys {
            let target = if cip { &si } else { &sx };
            out.elements.push((
                format!("{SET_SERVICE_IPS}-{f}"),
                key,
                format!("goto {target}"),
            ));
        }
        if let Some(key) = np_key {
            out.elements.push((
                format!("{SET_SERVICE_NODEPORTS}-{f}"),
                key,
                format!("goto {sx}"),
            ));
        }
    }
    out
}

/// The service section's maps, base chains and shared chains.
pub(super) fn service_base(st: &mut NftState, cfg: &NftConfig) {
    let families: &[u8] = if cfg.ipv6 { &[4, 6] } else { &[4] };
    let mark = cfg.service_masq_mark();
    let mut services = Vec::new();
    let mut noep = Vec::new();
    let mut noep_np = Vec::new();
    let mut hairpin = Vec::new();
    for &f in families {
        let (fam, addr, lo) = if f == 4 {
            ("ip", "ipv4_addr", "127.0.0.0/8")
        } else {
            ("ip6", "ipv6_addr", "::1")
        };
        let nfproto = if f == 4 { "ipv4" } else { "ipv6" };
        for (name, decl) in [
            (
                SET_SERVICE_IPS,
                format!("type {addr} . inet_proto . inet_service : verdict;"),
            ),
            (
                SET_NO_ENDPOINTS,
                format!("type {addr} . inet_proto . inet_service : verdict;"),
            ),
            (
                SET_SERVICE_NODEPORTS,
                "type inet_proto . inet_service : verdict;".to_string(),
            ),
            (
                SET_NO_ENDPOINT_NODEPORTS,
                "type inet_proto . inet_service : verdict;".to_string(),
            ),
        ] {
            st.maps.entry(format!("{name}-{f}")).or_insert(MapSpec {
                decl,
                elements: BTreeMap::new(),
            });
        }
        for proto in ["tcp", "udp", "sctp"] {
            for (name, key) in [
                (SET_BACKENDS, format!("{fam} daddr . {proto} dport")),
                (SET_NODEPORT_BACKENDS, format!("{proto} dport")),
            ] {
                st.maps
                    .entry(format!("{name}-{proto}-{f}"))
                    .or_insert(MapSpec {
                        decl: format!(
                            "typeof {key} . numgen random mod 1 : {fam} daddr . {proto} dport;"
                        ),
                        elements: BTreeMap::new(),
                    });
            }
        }
        st.sets
            .entry(format!("{SET_HAIRPIN}-{f}"))
            .or_insert(SetSpec {
                decl: format!("type {addr} . {addr} . {addr} . inet_proto . inet_service;"),
                elements: BTreeSet::new(),
            });
        hairpin.push(format!(
            "ct status dnat meta l4proto {{ tcp, udp, sctp }} {fam} saddr . {fam} daddr . ct original {fam} daddr . meta l4proto . ct original proto-dst @{SET_HAIRPIN}-{f} masquerade fully-random comment \"service hairpin\""
        ));
        services.push(format!(
            "{fam} daddr . meta l4proto . th dport vmap @{SET_SERVICE_IPS}-{f}"
        ));
        // NodePorts on every local address but loopback (kube-proxy: no localhost NodePorts).
        services.push(format!(
            "meta nfproto {nfproto} fib daddr type local {fam} daddr != {lo} meta l4proto . th dport vmap @{SET_SERVICE_NODEPORTS}-{f}"
        ));
        noep.push(format!(
            "{fam} daddr . meta l4proto . th dport vmap @{SET_NO_ENDPOINTS}-{f}"
        ));
        noep_np.push(format!(
            "ct state new meta nfproto {nfproto} fib daddr type local meta l4proto . th dport vmap @{SET_NO_ENDPOINT_NODEPORTS}-{f}"
        ));
    }
    let base = |hook: &str, rules: Vec<String>, kind: &str, prio: &str| ChainSpec {
        base: Some(format!(
            "type {kind} hook {hook} priority {prio}; policy accept;"
        )),
        rules: rules.into_iter().map(NftRule::new).collect(),
    };
    st.chains.insert("services".into(), chain(services));
    st.chains.insert(
        "svc-nat-pre".into(),
        base("prerouting", vec!["jump services".into()], "nat", "dstnat"),
    );
    st.chains.insert(
        "svc-nat-out".into(),
        // nft 1.0 knows `dstnat` in prerouting only: -100 is its value.
        base("output", vec!["jump services".into()], "nat", "-100"),
    );
    st.chains.insert(CHAIN_NOEP.into(), chain(noep));
    let mut input = vec![format!("ct state new jump {CHAIN_NOEP}")];
    input.extend(noep_np);
    st.chains.insert(
        "svc-filter-in".into(),
        base("input", input, "filter", "filter - 10"),
    );
    for (name, hook) in [("svc-filter-fwd", "forward"), ("svc-filter-out", "output")] {
        st.chains.insert(
            name.into(),
            base(
                hook,
                vec![format!("ct state new jump {CHAIN_NOEP}")],
                "filter",
                "filter - 10",
            ),
        );
    }
    st.chains.insert(
        CHAIN_MARK.into(),
        chain(vec![format!("meta mark set meta mark or {mark:#x}")]),
    );
    st.chains.insert(
        CHAIN_REJECT.into(),
        chain(vec![
            "meta l4proto tcp reject with tcp reset comment \"service without endpoints\"".into(),
            "reject with icmpx port-unreachable comment \"service without endpoints\"".into(),
        ]),
    );
    if let Some(post) = st.chains.get_mut("postrouting") {
        post.rules.insert(
            0,
            NftRule::new(format!(
                "meta mark and {mark:#x} != 0 masquerade fully-random comment \"service masquerade\""
            )),
        );
        for (i, rule) in hairpin.into_iter().enumerate() {
            post.rules.insert(1 + i, NftRule::new(rule));
        }
    }
}

/// Adds one rendered service to the table.
/// (The picks' chains and sets are the renderer's: see [`add_picks`].)
pub(super) fn add_service(st: &mut NftState, r: &RenderedService) {
    for (name, c) in &r.chains {
        st.chains.insert(name.clone(), c.clone());
    }
    for (set, elem) in &r.set_elements {
        if let Some(s) = st.sets.get_mut(set) {
            s.elements.insert(elem.clone());
        }
    }
    for (name, s) in &r.sets {
        st.sets.insert(name.clone(), s.clone());
    }
    for (map, key, verdict) in &r.elements {
        if let Some(m) = st.maps.get_mut(map) {
            m.elements.insert(key.clone(), verdict.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use margay_calc::PortProtocol;
    use margay_calc::services::Frontend;

    fn id(name: &str) -> ServicePortId {
        ServicePortId {
            namespace: "default".into(),
            name: name.into(),
            port_name: "http".into(),
            protocol: PortProtocol::Tcp,
        }
    }

    fn be(a: &str, port: u16) -> Backend {
        Backend {
            addr: a.parse().unwrap(),
            port,
        }
    }

    fn port(backends: &[Backend], local: &[Backend]) -> ServicePort {
        ServicePort {
            frontends: vec![
                Frontend {
                    kind: FrontendKind::ClusterIp,
                    addr: "10.96.0.10".parse().unwrap(),
                    port: 80,
                },
                Frontend {
                    kind: FrontendKind::ExternalIp,
                    addr: "192.0.2.7".parse().unwrap(),
                    port: 80,
                },
            ],
            node_port: Some(30080),
            cluster_backends: backends.to_vec(),
            local_backends: local.to_vec(),
            external_local: false,
            internal_local: false,
            affinity_timeout: None,
        }
    }

    fn cfg() -> NftConfig {
        NftConfig {
            ipv6: false,
            ..NftConfig::default()
        }
    }

    fn model(ports: &[(ServicePortId, ServicePort)]) -> DataplaneModel {
        let mut m = DataplaneModel {
            in_sync: true,
            ..DataplaneModel::default()
        };
        for (id, p) in ports {
            m.services.insert(id.clone(), Arc::new(p.clone()));
        }
        m
    }

    fn texts(c: &ChainSpec) -> Vec<&str> {
        c.rules.iter().map(|r| r.text.as_str()).collect()
    }

    fn flat(st: NftState) -> NftState {
        st.flattened()
    }

    #[test]
    fn cluster_ip_spreads_with_one_lookup_and_numgen() {
        let backends = [
            be("10.65.0.1", 8080),
            be("10.65.0.2", 8080),
            be("10.65.0.3", 8080),
        ];
        let (st, _) = Renderer::new().render(&model(&[(id("web"), port(&backends, &[]))]), &cfg());
        // The service itself is nothing but elements: no chain of its own.
        assert_eq!(st.services.all.len(), 1);
        assert!(st.services.all.iter().all(|r| r.chains.is_empty()));
        let st = flat(st);
        let ips = &st.maps["svc-ips-4"].elements;
        assert_eq!(ips["10.96.0.10 . tcp . 80"], "goto svc-pick4-tcp-c");
        assert_eq!(ips["192.0.2.7 . tcp . 80"], "goto svc-pick4-tcp-x");
        assert_eq!(
            st.maps["svc-nodeports-4"].elements["tcp . 30080"],
            "goto svc-npick4-tcp"
        );
        // Frontends are filed by backend count.
        assert_eq!(
            st.sets["svc-n3-tcp-4"].elements,
            BTreeSet::from(["10.96.0.10 . 80".to_string(), "192.0.2.7 . 80".to_string()])
        );
        assert_eq!(
            st.sets["svc-npn3-tcp-4"].elements,
            BTreeSet::from(["30080".to_string()])
        );
        assert!(st.maps["svc-noep-4"].elements.is_empty());
        let be = &st.maps["svc-be-tcp-4"].elements;
        assert_eq!(be.len(), 6, "{be:?}");
        assert_eq!(be["10.96.0.10 . 80 . 0"], "10.65.0.1 . 8080");
        assert_eq!(be["10.96.0.10 . 80 . 2"], "10.65.0.3 . 8080");
        assert_eq!(be["192.0.2.7 . 80 . 1"], "10.65.0.2 . 8080");
        assert!(st.maps["svc-be-udp-4"].elements.is_empty());
        assert_eq!(
            st.maps["svc-npbe-tcp-4"].elements["30080 . 2"],
            "10.65.0.3 . 8080"
        );
        assert_eq!(
            texts(&st.chains["svc-pick4-tcp-c"]),
            vec![
                "ip saddr != @all-pools-4 jump svc-mark-masq",
                "ip daddr . tcp dport @svc-n1-tcp-4 dnat ip to ip daddr . tcp dport . numgen random mod 1 map @svc-be-tcp-4",
                "ip daddr . tcp dport @svc-n2-tcp-4 dnat ip to ip daddr . tcp dport . numgen random mod 2 map @svc-be-tcp-4",
                "ip daddr . tcp dport @svc-n3-tcp-4 dnat ip to ip daddr . tcp dport . numgen random mod 3 map @svc-be-tcp-4"
            ]
        );
        assert_eq!(
            texts(&st.chains["svc-pick4-tcp-x"])[0],
            "jump svc-mark-masq"
        );
        assert_eq!(
            texts(&st.chains["svc-npick4-tcp"])[3],
            "tcp dport @svc-npn3-tcp-4 dnat ip to tcp dport . numgen random mod 3 map @svc-npbe-tcp-4"
        );
        assert!(
            !st.chains
                .keys()
                .any(|c| c.starts_with("sc4-") || c.starts_with("ep4-"))
        );
        // Hairpin: a backend reaching itself through the ClusterIP is masqueraded.
        assert!(
            st.sets["svc-hairpin-4"]
                .elements
                .contains("10.65.0.2 . 10.65.0.2 . 10.96.0.10 . tcp . 80")
        );
        assert_eq!(st.sets["svc-hairpin-4"].elements.len(), 3);
        // One map lookup per packet in the NAT hooks; post-DNAT policy in the filter hooks.
        assert_eq!(
            texts(&st.chains["services"])[0],
            "ip daddr . meta l4proto . th dport vmap @svc-ips-4"
        );
        assert_eq!(
            st.chains["svc-nat-pre"].base.as_deref(),
            Some("type nat hook prerouting priority dstnat; policy accept;")
        );
        let post = texts(&st.chains["postrouting"]);
        assert!(post[0].contains("masquerade"));
        assert!(post[1].contains("@svc-hairpin-4 masquerade"), "{post:?}");
    }

    /// The per-service plan (from the last written state) and the plan from a read-back
    /// (everything compared) change the same things.
    fn assert_same_as_flat_plan(s1: &NftState, s2: &NftState) -> crate::nft::diff::Plan {
        use crate::nft::diff::{Fingerprint, plan};
        // The per-service path is taken only from the renderer's previous state.
        assert_eq!(s1.services.generation + 1, s2.services.generation);
        let inc = plan("margay", &Fingerprint::of(s1), s2);
        let full = plan("margay", &Fingerprint::of(s1).flattened(), s2);
        let norm = |p: &crate::nft::diff::Plan| {
            let mut elems: BTreeSet<(String, String, bool, Option<String>)> = BTreeSet::new();
            for c in p.elements_before.iter().chain(&p.elements_after) {
                for (k, v) in &c.add {
                    elems.insert((c.set.clone(), k.clone(), true, v.clone()));
                }
                for (k, _) in &c.delete {
                    elems.insert((c.set.clone(), k.clone(), false, None));
                }
            }
            let lines = |t: &str| t.lines().map(str::to_string).collect::<BTreeSet<_>>();
            (
                elems,
                lines(&p.declare),
                lines(&p.chains),
                lines(&p.cleanup),
            )
        };
        assert_eq!(norm(&inc), norm(&full));
        assert_eq!(inc.stats, full.stats);
        inc
    }

    #[test]
    fn a_backend_change_is_an_element_change_of_its_service_only() {
        let a = [be("10.65.0.1", 80), be("10.65.0.2", 80)];
        let mut other = port(&a, &[]);
        other.frontends[0].addr = "10.96.0.11".parse().unwrap();
        other.frontends.truncate(1);
        other.node_port = None;
        let mut r = Renderer::new();
        let (s1, _) = r.render(
            &model(&[(id("web"), port(&a, &[])), (id("api"), other.clone())]),
            &cfg(),
        );
        // A backend replaced (a pod restarted elsewhere): elements only, no nft text at all.
        let moved = [be("10.65.0.1", 80), be("10.65.0.9", 80)];
        let (s2, _) = r.render(
            &model(&[(id("web"), port(&moved, &[])), (id("api"), other.clone())]),
            &cfg(),
        );
        let plan = assert_same_as_flat_plan(&s1, &s2);
        assert!(plan.chains.is_empty() && plan.cleanup.is_empty() && plan.declare.is_empty());
        let changed: Vec<(&str, usize, usize)> = plan
            .elements_after
            .iter()
            .map(|c| (c.set.as_str(), c.add.len(), c.delete.len()))
            .collect();
        assert_eq!(
            changed,
            vec![
                ("svc-be-tcp-4", 2, 2),
                ("svc-hairpin-4", 1, 1),
                ("svc-npbe-tcp-4", 1, 1)
            ]
        );
        assert!(
            plan.elements_after
                .iter()
                .flat_map(|c| c.add.iter().chain(&c.delete))
                .all(|(k, _)| !k.contains("10.96.0.11"))
        );
        // One backend fewer: the frontends move to the set for one backend (the chains have
        // a rule for every count up to the highest seen); the ClusterIP map entries stay.
        let (s3, _) = r.render(
            &model(&[(id("web"), port(&a[..1], &[])), (id("api"), other.clone())]),
            &cfg(),
        );
        let plan = assert_same_as_flat_plan(&s2, &s3);
        assert!(plan.declare.is_empty() && plan.chains.is_empty() && plan.cleanup.is_empty());
        let moved = |p: &crate::nft::diff::Plan, set: &str| -> (Vec<String>, Vec<String>) {
            p.elements_after
                .iter()
                .filter(|c| c.set == set)
                .map(|c| {
                    (
                        c.add.iter().map(|(k, _)| k.clone()).collect(),
                        c.delete.iter().map(|(k, _)| k.clone()).collect(),
                    )
                })
                .next()
                .unwrap_or_default()
        };
        assert_eq!(
            moved(&plan, "svc-n1-tcp-4"),
            (
                vec!["10.96.0.10 . 80".into(), "192.0.2.7 . 80".into()],
                vec![]
            )
        );
        assert_eq!(
            moved(&plan, "svc-n2-tcp-4"),
            (
                vec![],
                vec!["10.96.0.10 . 80".into(), "192.0.2.7 . 80".into()]
            )
        );
        assert!(moved(&plan, "svc-ips-4").0.is_empty());
        // Back to two, and up to three: a new highest count adds its set and rules.
        let (s4, _) = r.render(
            &model(&[(id("web"), port(&a, &[])), (id("api"), other.clone())]),
            &cfg(),
        );
        let plan = assert_same_as_flat_plan(&s3, &s4);
        assert!(plan.declare.is_empty() && plan.chains.is_empty() && plan.cleanup.is_empty());
        let three = [a[0], a[1], be("10.65.0.3", 80)];
        let (s5, _) = r.render(
            &model(&[(id("web"), port(&three, &[])), (id("api"), other)]),
            &cfg(),
        );
        let plan = assert_same_as_flat_plan(&s4, &s5);
        assert!(plan.declare.contains("add set inet margay svc-n3-tcp-4"));
        assert!(
            plan.chains
                .contains("flush chain inet margay svc-pick4-tcp-c")
        );
    }

    #[test]
    fn per_service_plans_match_full_comparison() {
        let a = [
            be("10.65.0.1", 80),
            be("10.65.0.2", 80),
            be("10.65.1.1", 80),
        ];
        let mut affinity = port(&a, &a[2..]);
        affinity.affinity_timeout = Some(60);
        let mut local = port(&a, &a[..1]);
        local.external_local = true;
        // Frontends are unique per service port (ClusterIPs are allocated; two services
        // claiming one external address and port is a conflict kube-proxy cannot serve either).
        let db = |backends: &[Backend], local: &[Backend]| {
            let mut p = port(backends, local);
            p.frontends[0].addr = "10.96.0.20".parse().unwrap();
            p.frontends[1].addr = "192.0.2.20".parse().unwrap();
            p.node_port = Some(30020);
            p
        };
        let mut db_affinity = db(&a, &a[2..]);
        db_affinity.affinity_timeout = Some(60);
        let models = [
            model(&[]),
            model(&[(id("web"), port(&a, &[]))]),
            model(&[(id("web"), port(&a[1..], &[])), (id("db"), db(&[], &[]))]),
            model(&[(id("web"), affinity), (id("db"), db(&a[..1], &[]))]),
            model(&[(id("web"), local), (id("db"), db_affinity)]),
            model(&[(id("web"), port(&a, &[]))]),
            model(&[]),
        ];
        // Every model after every other one, each step from the renderer's previous state.
        let mut r = Renderer::new();
        let mut prev = r.render(&models[0], &cfg()).0;
        for i in 0..models.len() {
            for j in 0..models.len() {
                for m in [&models[i], &models[j]] {
                    let next = r.render(m, &cfg()).0;
                    assert_same_as_flat_plan(&prev, &next);
                    prev = next;
                }
            }
        }
    }

    #[test]
    fn scaling_to_zero_moves_elements_only() {
        let mut r = Renderer::new();
        let (s1, _) = r.render(
            &model(&[(id("web"), port(&[be("10.65.0.1", 80)], &[]))]),
            &cfg(),
        );
        let (s2, _) = r.render(&model(&[(id("web"), port(&[], &[]))]), &cfg());
        let plan = assert_same_as_flat_plan(&s1, &s2);
        assert!(plan.full_replacement.is_none());
        let moved: Vec<(&str, usize, usize)> = plan
            .elements_after
            .iter()
            .map(|c| (c.set.as_str(), c.add.len(), c.delete.len()))
            .collect();
        assert_eq!(
            moved,
            vec![
                ("svc-be-tcp-4", 0, 2),
                ("svc-hairpin-4", 0, 1),
                ("svc-ips-4", 0, 2),
                ("svc-n1-tcp-4", 0, 2),
                ("svc-nodeports-4", 0, 1),
                ("svc-noep-4", 2, 0),
                ("svc-noep-np-4", 1, 0),
                ("svc-npbe-tcp-4", 0, 1),
                ("svc-npn1-tcp-4", 0, 1),
            ]
        );
        // The pick chains stay while there are services (a count comes back cheaply).
        assert!(plan.cleanup.is_empty(), "{}", plan.cleanup);
    }

    #[test]
    fn no_endpoints_rejects_in_the_filter_hooks() {
        let (st, _) = Renderer::new().render(&model(&[(id("web"), port(&[], &[]))]), &cfg());
        let st = st.flattened();
        assert!(st.maps["svc-ips-4"].elements.is_empty());
        assert!(st.maps["svc-nodeports-4"].elements.is_empty());
        assert_eq!(
            st.maps["svc-noep-4"].elements["10.96.0.10 . tcp . 80"],
            "goto svc-reject"
        );
        assert_eq!(
            st.maps["svc-noep-np-4"].elements["tcp . 30080"],
            "goto svc-reject"
        );
        assert!(!st.chains.keys().any(|c| c.starts_with("sc4-")));
        let reject = texts(&st.chains["svc-reject"]);
        assert!(reject[0].starts_with("meta l4proto tcp reject with tcp reset"));
        for hook in ["svc-filter-in", "svc-filter-fwd", "svc-filter-out"] {
            assert!(
                st.chains[hook]
                    .base
                    .as_deref()
                    .unwrap()
                    .contains("filter - 10")
            );
        }
    }

    #[test]
    fn local_policies_and_affinity() {
        let mut p = port(
            &[be("10.65.0.1", 80), be("10.65.1.1", 80)],
            &[be("10.65.0.1", 80)],
        );
        p.external_local = true;
        p.affinity_timeout = Some(600);
        let (st, _) = Renderer::new().render(&model(&[(id("web"), p.clone())]), &cfg());
        let st = st.flattened();
        let h = short_hash(&id("web").to_string());
        let sx = texts(&st.chains[&format!("sx4-{h}")]);
        assert_eq!(sx[0], format!("ip saddr @all-pools-4 goto sc4-{h}"));
        assert_eq!(sx.last().copied(), Some(format!("goto sl4-{h}").as_str()));
        let sl = texts(&st.chains[&format!("sl4-{h}")]);
        assert!(sl.last().unwrap().starts_with("goto ep4-"), "{sl:?}");
        let aff: Vec<_> = st
            .sets
            .iter()
            .filter(|(n, _)| n.starts_with("aff4-"))
            .collect();
        assert_eq!(aff.len(), 2);
        assert!(
            aff[0]
                .1
                .decl
                .contains("flags dynamic,timeout; timeout 600s;")
        );
        assert!(sl[0].starts_with("ip saddr @aff4-"), "{sl:?}");

        // No local endpoint under Local: external traffic is dropped.
        p.local_backends.clear();
        let (st, _) = Renderer::new().render(&model(&[(id("web"), p)]), &cfg());
        let st = st.flattened();
        assert_eq!(
            texts(&st.chains[&format!("sl4-{h}")]),
            vec!["drop comment \"no local endpoint\""]
        );
        // The kernel's affinity entries survive a plan (they are not margay's elements).
        let mut from = crate::nft::diff::Fingerprint::of(&st);
        let (name, _) = st
            .sets
            .iter()
            .find(|(n, _)| n.starts_with("aff4-"))
            .unwrap();
        from.sets
            .get_mut(name)
            .unwrap()
            .1
            .insert("10.65.0.9".into());
        let plan = crate::nft::diff::plan("margay", &from, &st);
        assert!(plan.is_empty(), "{plan:?}");
    }

    #[test]
    fn the_section_exists_only_with_services() {
        let (st, _) = Renderer::new().render(&model(&[]), &cfg());
        let st = st.flattened();
        assert!(!st.chains.contains_key("services"));
        assert!(!st.maps.contains_key("svc-ips-4"));
        let cfg6 = NftConfig::default();
        let (st, _) = Renderer::new().render(
            &model(&[(id("web"), port(&[be("10.65.0.1", 80)], &[]))]),
            &cfg6,
        );
        let st = st.flattened();
        // A v4-only service: the v6 maps exist but hold nothing.
        assert!(st.maps["svc-ips-6"].elements.is_empty());
        assert_eq!(st.maps["svc-ips-4"].elements.len(), 2);
    }

    #[test]
    fn masquerade_mark_avoids_the_policy_bits() {
        assert_eq!(cfg().service_masq_mark(), 0x4000);
        let c = NftConfig {
            mark_accept: 0x4000,
            mark_pass: 0x8000,
            ..cfg()
        };
        assert_eq!(c.service_masq_mark(), 0x10000);
    }
}
