//! Flow logs (FlowLogsLocalReporter=Enabled): what decided each new connection, from one of
//! two sources — the packets the nftables rules hand to NFLOG groups 1 (ingress) and 2
//! (egress) ([`FlowLogs::start`]), or the eBPF program's flow events from its ring buffer
//! ([`FlowLogs::start_bpf`]) — turned into flow records naming the rule that decided, kept
//! in a bounded ring that `margay flows` reads over the status socket.
//!
//! Threads: one reader per NFLOG group, or one ring-buffer reader (bounded reads of 200 ms
//! so they stop promptly), and a flusher that closes the aggregation interval every second
//! (a flow is visible ≤ 1 s after its first packet). With nftables, a conntrack poller
//! (every [`CONNTRACK_POLL`], as Calico's Felix) adds the packets and bytes of the allowed
//! connections it saw start, in a record per interval while they move data, and marks their
//! end (`nf_conntrack_acct=1` is set in Felix's namespace, as Calico does).
//!
//! Both ends of a flow are named from a [`PeerDirectory`] of the whole cluster (every
//! workload endpoint on every node, host endpoints, network sets) that the calculation thread
//! keeps from the datastore's updates; the local dataplane model is the fallback. Everything is bounded: per interval at
//! most [`MAX_FLOWS`] flows (what is shed is counted), the ring [`Ring::DEFAULT_CAPACITY`]
//! flows, a query [`MAX_ANSWER`]; the ring buffer's overflow is counted by the program.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use margay_api::{Kind, Resource, ResourceKey};
use margay_bpf::flows::FlowReader;
use margay_bpf::layout::FlowEvent;
use margay_dataplane::Recording;
use margay_dataplane::bpf_driver::BpfFlowSource;
use margay_dataplane::nft::render::{
    FLOW_LOG_GROUP_EGRESS, FLOW_LOG_GROUP_INGRESS, FLOW_LOG_SNAPLEN,
};
use margay_flows::peers::{label_strings, parse_net};
use margay_flows::{
    Aggregator, Count, Filter, Numbered, Observation, Peer, PeerDirectory, PrefixTable, Ring,
    Traffic, Tuple,
};
use margay_netlink::nflog::{Nflog, NflogPacket};
use serde::{Deserialize, Serialize};

/// New flows kept per one-second interval (a flood beyond is shed and counted).
pub const MAX_FLOWS: usize = 10_000;
/// Log rules' packet lines (eBPF dataplane) written a second, at most.
const LOG_LINES: u32 = 10;
/// Most flows one answer carries.
pub const MAX_ANSWER: usize = 4095;
/// How often the rule table and the address map are rebuilt from the dataplane model, at
/// most (on a prefix or address not known yet).
const REFRESH: Duration = Duration::from_secs(1);
/// How often conntrack is read for the traffic of allowed connections (Calico's 5 s; longer
/// when a read takes over 1/20 of it).
pub const CONNTRACK_POLL: Duration = Duration::from_secs(5);
/// Allowed connections followed in conntrack at once; more are not counted (and counted).
pub const MAX_LIVE: usize = 20_000;
/// Entries one conntrack read looks at, at most, and how long it may take.
const CONNTRACK_MAX_ENTRIES: usize = 2_000_000;
const CONNTRACK_DEADLINE: Duration = Duration::from_secs(3);

/// Who each address of the cluster is, kept by the calculation thread.
pub type PeerFeed = Arc<RwLock<PeerDirectory>>;

/// Files the datastore updates that name addresses (workload and host endpoints, network
/// sets) in the directory; other kinds are ignored. One write lock per batch.
pub fn feed_peers(dir: &RwLock<PeerDirectory>, updates: &[(ResourceKey, Option<Resource>)]) {
    let named = |k: &ResourceKey| {
        matches!(
            k.kind,
            Kind::WorkloadEndpoint | Kind::HostEndpoint | Kind::NetworkSet | Kind::GlobalNetworkSet
        )
    };
    if !updates.iter().any(|(k, _)| named(k)) {
        return;
    }
    let mut dir = dir.write().unwrap_or_else(|e| e.into_inner());
    for (key, value) in updates.iter().filter(|(k, _)| named(k)) {
        let id = format!("{}/{}/{}", key.kind.name(), key.namespace, key.name);
        let nets = |list: &[String]| list.iter().filter_map(|n| parse_net(n)).collect();
        let peer = |kind: &str, namespace: &str, name: &str, labels| Peer {
            kind: kind.into(),
            namespace: if namespace.is_empty() { "-" } else { namespace }.into(),
            name: name.into(),
            labels,
        };
        let entry = match value {
            Some(Resource::WorkloadEndpoint(w)) => {
                let name = [&w.spec.pod, &w.spec.workload, &w.metadata.name]
                    .into_iter()
                    .find(|n| !n.is_empty())
                    .map_or("", |n| n.as_str());
                Some((
                    peer(
                        "wep",
                        &key.namespace,
                        name,
                        label_strings(&w.metadata.labels),
                    ),
                    nets(&w.spec.ip_networks),
                ))
            }
            Some(Resource::HostEndpoint(h)) => Some((
                peer("hep", "", &key.name, label_strings(&h.metadata.labels)),
                nets(&h.spec.expected_ips),
            )),
            Some(Resource::NetworkSet(n)) => Some((
                peer(
                    "ns",
                    &key.namespace,
                    &key.name,
                    label_strings(&n.metadata.labels),
                ),
                nets(&n.spec.nets),
            )),
            Some(Resource::GlobalNetworkSet(n)) => Some((
                peer("ns", "", &key.name, label_strings(&n.metadata.labels)),
                nets(&n.spec.nets),
            )),
            _ => None,
        };
        match entry {
            Some((p, n)) => dir.upsert(&id, p, n),
            None => dir.remove(&id),
        }
    }
}

/// An allowed connection followed in conntrack.
struct LiveFlow {
    rule: margay_flows::RuleRef,
    tier: String,
    /// Shared with the directory (or the one copy for a peer it does not know).
    source: Arc<Peer>,
    dest: Arc<Peer>,
    /// Its counters at the last read.
    last: Traffic,
    /// Whether a read has found its conntrack entry (one that never has — a packet dropped
    /// further on, before conntrack confirmed it — ends without a record).
    found: bool,
    /// When its first packet was seen (a read that started before cannot have seen it).
    since_ms: u64,
}

/// The allowed connections being counted, by tuple (a connection between two local
/// endpoints has two: the source's egress rule and the destination's ingress rule).
#[derive(Default)]
struct Live {
    flows: HashMap<Tuple, Vec<LiveFlow>>,
    len: usize,
    /// Connections not followed because [`MAX_LIVE`] were.
    shed: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// What the rule table and address map were built from, and when.
struct Lookup {
    table: PrefixTable,
    peers: HashMap<IpAddr, Peer>,
    built: Option<Instant>,
}

/// FlowLogsFile*: flows also written as JSON lines, aggregated over FlowLogsFlushInterval.
#[derive(Debug, Clone)]
pub struct FileSink {
    pub path: std::path::PathBuf,
    pub rotation: margay_logging::Rotation,
    pub interval: Duration,
}

/// The running flow collector.
pub struct FlowLogs {
    recording: Recording,
    lookup: Mutex<Lookup>,
    aggregator: Mutex<Aggregator>,
    /// The file's own interval (None: no file).
    file: Option<(Mutex<Aggregator>, Mutex<margay_logging::LogFile>)>,
    file_errors: AtomicU64,
    /// Logged packets per rule (bounded by the rules rendered: only known prefixes count).
    per_rule: Mutex<HashMap<margay_flows::RuleRef, u64>>,
    /// Denied flows by the namespace of the endpoint whose policy denied them.
    denied_by_namespace: Mutex<std::collections::BTreeMap<String, u64>>,
    ring: Mutex<Ring>,
    stop: AtomicBool,
    unknown_prefixes: AtomicU64,
    overruns: AtomicU64,
    /// eBPF: events the program could not queue (ring buffer full).
    ring_drops: AtomicU64,
    /// The cluster's addresses, by the calculation thread.
    peers: PeerFeed,
    /// Allowed connections counted from conntrack (nftables only).
    live: Option<Mutex<Live>>,
    /// Conntrack reads that failed or were cut short.
    conntrack_errors: AtomicU64,
}

/// A `flows` request: `flows?last=20&after=5&denied=1&namespace=shop&pod=web&policy=x`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    pub last: usize,
    pub after: Option<u64>,
    pub filter: Filter,
}

impl Query {
    /// Parses the request line (`flows` with an optional `?key=value&…`).
    pub fn parse(request: &str) -> Result<Query, String> {
        let mut q = Query {
            last: 20,
            ..Query::default()
        };
        let Some((_, params)) = request.split_once('?') else {
            return Ok(q);
        };
        for pair in params.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let text = || Some(v.to_string()).filter(|v| !v.is_empty());
            match k {
                "last" => {
                    q.last = v
                        .parse::<usize>()
                        .map_err(|_| format!("last={v:?} is not a number"))?
                        .min(MAX_ANSWER)
                }
                "after" => {
                    q.after = Some(
                        v.parse()
                            .map_err(|_| format!("after={v:?} is not a number"))?,
                    )
                }
                "denied" => q.filter.denied = matches!(v, "" | "1" | "true"),
                "namespace" => q.filter.namespace = text(),
                "pod" => q.filter.pod = text(),
                "policy" => q.filter.policy = text(),
                other => {
                    return Err(format!(
                        "unknown flows parameter {other:?}; use last, after, denied, namespace, pod, policy"
                    ));
                }
            }
        }
        Ok(q)
    }
}

/// What /metrics says of flow logs.
#[derive(Debug, Clone, Default)]
pub struct FlowCounters {
    pub packets: u64,
    pub shed: u64,
    pub overruns: u64,
    pub unknown_prefixes: u64,
    /// eBPF: flow events dropped because the ring buffer was full.
    pub ring_drops: u64,
    pub per_rule: Vec<(margay_flows::RuleRef, u64)>,
    pub denied_by_namespace: std::collections::BTreeMap<String, u64>,
}

/// The answer to a `flows` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    pub flows: Vec<Numbered>,
    /// Ask `after=<next_seq - 1>` to follow.
    pub next_seq: u64,
    /// Logged packets seen, and those shed because an interval was full.
    pub packets_seen: u64,
    pub packets_shed: u64,
    /// Datagrams the kernel could not queue for Felix (NFLOG buffer overruns).
    pub overruns: u64,
    /// Packets whose prefix named no rule Felix rendered (eBPF: events naming no rule).
    pub unknown_prefixes: u64,
    /// eBPF: flow events the program dropped because the ring buffer was full.
    #[serde(default)]
    pub ring_drops: u64,
    /// Allowed connections whose traffic is being counted from conntrack, and those not
    /// counted because too many were.
    #[serde(default)]
    pub live_flows: u64,
    #[serde(default)]
    pub live_shed: u64,
}

impl FlowLogs {
    /// Binds the two NFLOG groups in Felix's network namespace and starts the threads
    /// (and opens the flow log file, with `file`).
    pub fn start(
        node: &str,
        recording: Recording,
        file: Option<FileSink>,
        peers: PeerFeed,
    ) -> std::io::Result<Arc<FlowLogs>> {
        let ingress = Nflog::bind(FLOW_LOG_GROUP_INGRESS, FLOW_LOG_SNAPLEN)?;
        let egress = Nflog::bind(FLOW_LOG_GROUP_EGRESS, FLOW_LOG_SNAPLEN)?;
        let (logs, file_interval) = Self::new(node, recording, file, peers, true)?;
        for (name, mut sock) in [("flows-ingress", ingress), ("flows-egress", egress)] {
            let l = logs.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    let mut seen_overruns = 0;
                    while !l.stop.load(Ordering::Relaxed) {
                        match sock.recv(Duration::from_millis(200)) {
                            Ok(packets) => {
                                for p in packets {
                                    l.observe(&p);
                                }
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, group = sock.group(), "reading flow logs failed; stopping this reader");
                                return;
                            }
                        }
                        let o = sock.overruns();
                        if o > seen_overruns {
                            l.overruns.fetch_add(o - seen_overruns, Ordering::Relaxed);
                            seen_overruns = o;
                        }
                    }
                })?;
        }
        logs.spawn_flusher(file_interval)?;
        logs.spawn_conntrack_poller()?;
        Ok(logs)
    }

    /// The eBPF dataplane's source: opens the program's ring buffer (turning its events on)
    /// and starts one reader thread (at most [`MAX_EVENTS_PER_POLL`] events per read) and
    /// the flusher. Rules are named from the driver's published slot names.
    ///
    /// [`MAX_EVENTS_PER_POLL`]: margay_bpf::flows::MAX_EVENTS_PER_POLL
    pub fn start_bpf(
        node: &str,
        recording: Recording,
        file: Option<FileSink>,
        peers: PeerFeed,
        source: BpfFlowSource,
    ) -> std::io::Result<Arc<FlowLogs>> {
        let mut reader = FlowReader::open(&source.pin_dir).map_err(std::io::Error::other)?;
        source.want();
        let (logs, file_interval) = Self::new(node, recording, file, peers, false)?;
        let l = logs.clone();
        std::thread::Builder::new()
            .name("flows-bpf".into())
            .spawn(move || {
                // CLOCK_MONOTONIC (the events' clock) to wall-clock milliseconds.
                let offset_ms =
                    || now_ms().saturating_sub(margay_bpf::loader::monotonic_ns() / 1_000_000);
                let mut offset = offset_ms();
                let mut names = source.names();
                let mut names_at = Instant::now();
                // Log rules' lines: at most LOG_LINES a second, the rest counted.
                let (mut log_window, mut log_lines, mut log_suppressed) = (Instant::now(), 0, 0u64);
                while !l.stop.load(Ordering::Relaxed) {
                    if names_at.elapsed() >= Duration::from_millis(100) {
                        names = source.names();
                        names_at = Instant::now();
                        offset = offset_ms();
                    }
                    reader.poll(Duration::from_millis(200), MAX_FLOWS, |e| {
                        if e.action == margay_bpf::layout::ACT_LOG {
                            if log_window.elapsed() >= Duration::from_secs(1) {
                                if log_suppressed > 0 {
                                    tracing::info!(
                                        suppressed = log_suppressed,
                                        "Log rule lines over {LOG_LINES}/s not written"
                                    );
                                }
                                (log_window, log_lines, log_suppressed) = (Instant::now(), 0, 0);
                            }
                            if log_lines >= LOG_LINES {
                                log_suppressed += 1;
                            } else if let Some(line) = BpfFlowSource::log_line(&names, &e) {
                                log_lines += 1;
                                tracing::info!("{line}");
                            }
                            return;
                        }
                        // A slot written since the names were taken: take them again.
                        let mut r = BpfFlowSource::resolve(&names, &e);
                        if r.is_none() && names_at.elapsed() >= Duration::from_millis(20) {
                            names = source.names();
                            names_at = Instant::now();
                            r = BpfFlowSource::resolve(&names, &e);
                        }
                        l.observe_event(&e, r, offset);
                    });
                    l.ring_drops.store(reader.drops(), Ordering::Relaxed);
                }
            })?;
        logs.spawn_flusher(file_interval)?;
        Ok(logs)
    }

    /// The collector's state, without threads.
    fn new(
        node: &str,
        recording: Recording,
        file: Option<FileSink>,
        peers: PeerFeed,
        counting: bool,
    ) -> std::io::Result<(Arc<FlowLogs>, Option<Duration>)> {
        let sink = match &file {
            Some(f) => Some((
                Mutex::new(Aggregator::new(node, MAX_FLOWS)),
                Mutex::new(
                    margay_logging::LogFile::open(&f.path, f.rotation).map_err(|e| {
                        std::io::Error::new(
                            e.kind(),
                            format!("cannot open the flow log file {}: {e}", f.path.display()),
                        )
                    })?,
                ),
            )),
            None => None,
        };
        let file_interval = file
            .as_ref()
            .map(|f| f.interval.max(Duration::from_secs(1)));
        let logs = Arc::new(FlowLogs {
            file: sink,
            file_errors: AtomicU64::new(0),
            per_rule: Mutex::new(HashMap::new()),
            denied_by_namespace: Mutex::new(std::collections::BTreeMap::new()),
            recording,
            lookup: Mutex::new(Lookup {
                table: PrefixTable::default(),
                peers: HashMap::new(),
                built: None,
            }),
            aggregator: Mutex::new(Aggregator::new(node, MAX_FLOWS)),
            ring: Mutex::new(Ring::new(Ring::DEFAULT_CAPACITY)),
            stop: AtomicBool::new(false),
            unknown_prefixes: AtomicU64::new(0),
            overruns: AtomicU64::new(0),
            ring_drops: AtomicU64::new(0),
            peers,
            live: counting.then(|| Mutex::new(Live::default())),
            conntrack_errors: AtomicU64::new(0),
        });
        Ok((logs, file_interval))
    }

    fn spawn_flusher(self: &Arc<Self>, file_interval: Option<Duration>) -> std::io::Result<()> {
        let l = self.clone();
        std::thread::Builder::new()
            .name("flows-flush".into())
            .spawn(move || {
                let mut file_due = file_interval.map(|i| Instant::now() + i);
                while !l.stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_secs(1));
                    l.flush();
                    if let (Some(due), Some(i)) = (file_due, file_interval)
                        && Instant::now() >= due
                    {
                        l.flush_file();
                        file_due = Some(due + i);
                    }
                }
                // What the last interval holds is not lost on a clean stop.
                l.flush_file();
            })?;
        Ok(())
    }

    /// Stops the threads (within a read timeout).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Rebuilds the rule table and the address map from the dataplane's model.
    fn rebuild(&self, lookup: &mut Lookup) {
        let rec = self.recording.lock();
        let model = &rec.model;
        lookup.table = margay_dataplane::nft::render::flow_prefix_table(model);
        lookup.peers.clear();
        for (id, ep) in &model.workload_endpoints {
            let (namespace, name) = match id.workload.split_once('/') {
                Some((ns, pod)) => (ns.to_string(), pod.to_string()),
                None => (ep.namespace.clone(), id.workload.clone()),
            };
            for net in ep.ipv4_nets.iter().chain(&ep.ipv6_nets) {
                lookup.peers.insert(
                    net.addr(),
                    Peer {
                        kind: "wep".into(),
                        namespace: namespace.clone(),
                        name: name.clone(),
                        labels: Vec::new(),
                    },
                );
            }
        }
        lookup.built = Some(Instant::now());
    }

    fn observe(&self, p: &NflogPacket) {
        let Some(tuple) = margay_flows::tuple(&p.payload) else {
            return;
        };
        let mut lookup = lock(&self.lookup);
        let stale = lookup.built.is_none_or(|t| t.elapsed() >= REFRESH);
        let known = lookup.table.lookup(&p.prefix).is_some()
            && lookup.peers.contains_key(&tuple.src) | lookup.peers.contains_key(&tuple.dst);
        if stale && !known {
            self.rebuild(&mut lookup);
        }
        let Some((rule, tier)) = lookup.table.lookup(&p.prefix) else {
            self.unknown_prefixes.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.record(lookup, now_ms(), tuple, p.payload.len() as u64, rule, tier);
    }

    /// One eBPF flow event, with the rule it names (None: unknown, counted) and the offset
    /// from the program's clock to wall-clock milliseconds.
    fn observe_event(
        &self,
        e: &FlowEvent,
        rule: Option<(margay_flows::RuleRef, String)>,
        offset_ms: u64,
    ) {
        let Some((rule, tier)) = rule else {
            self.unknown_prefixes.fetch_add(1, Ordering::Relaxed);
            return;
        };
        // Calico's ICMP "ports": the echo id, and type << 8 | code.
        let (src_port, dst_port) = if e.proto == 1 {
            (
                e.sport,
                u16::from(e.icmp_type) << 8 | u16::from(e.icmp_code),
            )
        } else {
            (e.sport, e.dport)
        };
        let tuple = margay_flows::Tuple {
            src: IpAddr::V4(e.src),
            dst: IpAddr::V4(e.dst),
            proto: e.proto,
            src_port,
            dst_port,
        };
        let mut lookup = lock(&self.lookup);
        let stale = lookup.built.is_none_or(|t| t.elapsed() >= REFRESH);
        if stale && !(lookup.peers.contains_key(&tuple.src) | lookup.peers.contains_key(&tuple.dst))
        {
            self.rebuild(&mut lookup);
        }
        let at = offset_ms.saturating_add(e.ts_ns / 1_000_000);
        self.record(lookup, at, tuple, u64::from(e.len), rule, tier);
    }

    /// Counts one decided packet and hands it to the aggregators.
    fn record(
        &self,
        lookup: MutexGuard<'_, Lookup>,
        at_ms: u64,
        tuple: margay_flows::Tuple,
        bytes: u64,
        rule: margay_flows::RuleRef,
        tier: String,
    ) {
        *lock(&self.per_rule).entry(rule.clone()).or_default() += 1;
        let (source, dest) = {
            let dir = self.peers.read().unwrap_or_else(|e| e.into_inner());
            // The cluster's directory first (remote endpoints, network sets, labels), then
            // the local model (endpoints the datastore feed has not named yet).
            let peer = |ip: IpAddr| match dir.lookup(ip) {
                Some(p) => p,
                None => Arc::new(
                    lookup
                        .peers
                        .get(&ip)
                        .cloned()
                        .unwrap_or_else(|| Peer::network(ip)),
                ),
            };
            (peer(tuple.src), peer(tuple.dst))
        };
        drop(lookup);
        if rule.action == margay_flows::Action::Allow
            && let Some(live) = &self.live
        {
            let mut live = lock(live);
            let followed = live
                .flows
                .get(&tuple)
                .is_some_and(|v| v.iter().any(|f| f.rule == rule));
            if !followed {
                if live.len >= MAX_LIVE {
                    live.shed += 1;
                } else {
                    live.len += 1;
                    live.flows.entry(tuple).or_default().push(LiveFlow {
                        rule: rule.clone(),
                        tier: tier.clone(),
                        source: source.clone(),
                        dest: dest.clone(),
                        last: Traffic::default(),
                        found: false,
                        since_ms: at_ms,
                    });
                }
            }
        }
        let o = Observation {
            at_ms,
            tuple,
            bytes,
            rule,
            tier,
            source: (*source).clone(),
            dest: (*dest).clone(),
        };
        if let Some((agg, _)) = &self.file {
            lock(agg).observe(o.clone());
        }
        lock(&self.aggregator).observe(o);
    }

    /// Reads conntrack every [`CONNTRACK_POLL`] (nftables only: the eBPF dataplane's
    /// conntrack is its own map).
    fn spawn_conntrack_poller(self: &Arc<Self>) -> std::io::Result<()> {
        if self.live.is_none() {
            return Ok(());
        }
        // Packet and byte counters need accounting on (a per-namespace setting; Calico's
        // Felix sets it too). Without it connections are still followed to their end.
        let procsys = margay_netlink::sysctl::ProcSys::default();
        if let Err(e) = procsys.write("net/netfilter/nf_conntrack_acct", "1") {
            tracing::warn!(error = %e, "cannot turn conntrack accounting on; flow records will have no packet/byte counts");
        }
        let l = self.clone();
        std::thread::Builder::new()
            .name("flows-conntrack".into())
            .spawn(move || {
                let mut next = Instant::now() + CONNTRACK_POLL;
                while !l.stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    if Instant::now() < next {
                        continue;
                    }
                    let t = Instant::now();
                    l.poll_conntrack();
                    // A big table costs the kernel ~µs per entry to dump: read at most 5%
                    // of the time (a 1 s read waits 20 s), never more often than every 5 s.
                    next = Instant::now() + CONNTRACK_POLL.max(t.elapsed() * 20);
                }
            })?;
        Ok(())
    }

    /// One conntrack read: the traffic each followed connection moved since the last read,
    /// and the end of those that closed or are gone, into the current interval.
    fn poll_conntrack(&self) {
        let Some(live) = &self.live else { return };
        let started = now_ms();
        let wanted: std::collections::HashSet<Tuple> = lock(live).flows.keys().copied().collect();
        if wanted.is_empty() {
            return;
        }
        let tuple_of = |t: &margay_netlink::conntrack::CtTuple| Tuple {
            src: t.src,
            dst: t.dst,
            proto: t.proto,
            src_port: t.src_port,
            dst_port: t.dst_port,
        };
        // A connection's first packet is logged after any DNAT (a Service's backend) and
        // before SNAT (NAT outgoing): the reply tuple reversed matches the first, the
        // original tuple the second.
        let mut found: HashMap<Tuple, (Traffic, bool)> = HashMap::new();
        let result =
            margay_netlink::conntrack::dump(CONNTRACK_MAX_ENTRIES, CONNTRACK_DEADLINE, |e| {
                let orig = tuple_of(&e.orig);
                let reply = tuple_of(&e.reply);
                let reversed = Tuple {
                    src: reply.dst,
                    dst: reply.src,
                    proto: reply.proto,
                    src_port: reply.dst_port,
                    dst_port: reply.src_port,
                };
                let key = if wanted.contains(&orig) {
                    orig
                } else if e.orig.proto != 1 && e.orig.proto != 58 && wanted.contains(&reversed) {
                    reversed
                } else {
                    return;
                };
                let (o, r) = (
                    e.orig_counters.unwrap_or_default(),
                    e.reply_counters.unwrap_or_default(),
                );
                found.insert(
                    key,
                    (
                        Traffic {
                            orig_packets: o.packets,
                            orig_bytes: o.bytes,
                            reply_packets: r.packets,
                            reply_bytes: r.bytes,
                        },
                        e.tcp_ended(),
                    ),
                );
            });
        let complete = match result {
            Ok(stats) if !stats.truncated => true,
            Ok(_) => {
                // Not read whole: counts are kept, but nothing is declared ended.
                self.conntrack_errors.fetch_add(1, Ordering::Relaxed);
                false
            }
            Err(e) => {
                if self.conntrack_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(error = %e, "cannot read conntrack; flow records go without packet/byte counts (further errors are only counted)");
                }
                return;
            }
        };
        let at = now_ms();
        let mut counts = Vec::new();
        {
            let mut live = lock(live);
            let mut ended = 0;
            live.flows.retain(|tuple, flows| {
                let seen = found.get(tuple);
                flows.retain_mut(|f| {
                    let (traffic, gone) = match seen {
                        Some((now, closed)) => (now.since(&f.last), *closed),
                        // Gone from the table, unless it started after the read did.
                        None => (Traffic::default(), complete && f.since_ms < started),
                    };
                    if let Some((now, _)) = seen {
                        f.last = *now;
                        f.found = true;
                    }
                    if !traffic.is_zero() || (gone && f.found) {
                        counts.push(Count {
                            at_ms: at,
                            tuple: *tuple,
                            rule: f.rule.clone(),
                            tier: f.tier.clone(),
                            source: (*f.source).clone(),
                            dest: (*f.dest).clone(),
                            traffic,
                            completed: gone,
                        });
                    }
                    if gone {
                        ended += 1;
                    }
                    !gone
                });
                !flows.is_empty()
            });
            live.len -= ended;
        }
        for c in counts {
            if let Some((agg, _)) = &self.file {
                lock(agg).count(c.clone());
            }
            lock(&self.aggregator).count(c);
        }
    }

    /// Writes the file interval's flows, one JSON object per line.
    pub fn flush_file(&self) {
        let Some((agg, file)) = &self.file else {
            return;
        };
        let flows = lock(agg).flush();
        let mut file = lock(file);
        for f in flows {
            let mut line = serde_json::to_string(&f).unwrap_or_default();
            line.push('\n');
            if let Err(e) = file.write_line(line.as_bytes())
                && self.file_errors.fetch_add(1, Ordering::Relaxed) == 0
            {
                tracing::error!(error = %e, path = %file.path().display(), "cannot write the flow log file (further errors are only counted)");
            }
        }
    }

    /// Closes the interval: its flows go to the ring.
    pub fn flush(&self) {
        let flows = lock(&self.aggregator).flush();
        if flows.is_empty() {
            return;
        }
        {
            let mut by_ns = lock(&self.denied_by_namespace);
            for f in flows.iter().filter(|f| f.denied()) {
                // The endpoint whose policy decided: the destination for ingress.
                let end = if f.reporter == "dst" {
                    &f.dest
                } else {
                    &f.source
                };
                let ns = if end.kind == "wep" {
                    end.namespace.as_str()
                } else {
                    "-"
                };
                // At most 1000 namespaces as labels; the rest are counted together.
                let key = if by_ns.contains_key(ns) || by_ns.len() < 1000 {
                    ns.to_string()
                } else {
                    "(other)".to_string()
                };
                *by_ns.entry(key).or_default() += 1;
            }
        }
        lock(&self.ring).push(flows);
    }

    /// Logged packets per rule, denied flows per namespace, and the totals (for /metrics).
    pub fn counters(&self) -> FlowCounters {
        let (seen, shed) = lock(&self.aggregator).counts();
        FlowCounters {
            packets: seen,
            shed,
            overruns: self.overruns.load(Ordering::Relaxed),
            unknown_prefixes: self.unknown_prefixes.load(Ordering::Relaxed),
            ring_drops: self.ring_drops.load(Ordering::Relaxed),
            per_rule: lock(&self.per_rule)
                .iter()
                .map(|(r, n)| (r.clone(), *n))
                .collect(),
            denied_by_namespace: lock(&self.denied_by_namespace).clone(),
        }
    }

    pub fn query(&self, q: &Query) -> Answer {
        let ring = lock(&self.ring);
        let flows = match q.after {
            Some(seq) => ring.after(seq, MAX_ANSWER, &q.filter),
            None => ring.last(q.last, &q.filter),
        };
        let (seen, shed) = lock(&self.aggregator).counts();
        Answer {
            flows,
            next_seq: ring.next_seq(),
            packets_seen: seen,
            packets_shed: shed,
            overruns: self.overruns.load(Ordering::Relaxed),
            unknown_prefixes: self.unknown_prefixes.load(Ordering::Relaxed),
            ring_drops: self.ring_drops.load(Ordering::Relaxed),
            live_flows: self.live.as_ref().map_or(0, |l| lock(l).len as u64),
            live_shed: self.live.as_ref().map_or(0, |l| lock(l).shed),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn queries_parse_and_bad_ones_say_why() {
        let q = Query::parse("flows").unwrap();
        assert_eq!(q.last, 20);
        let q = Query::parse("flows?denied=1&namespace=shop&pod=shop/web&policy=allow&after=7")
            .unwrap();
        assert!(q.filter.denied);
        assert_eq!(q.filter.namespace.as_deref(), Some("shop"));
        assert_eq!(q.filter.pod.as_deref(), Some("shop/web"));
        assert_eq!(q.filter.policy.as_deref(), Some("allow"));
        assert_eq!(q.after, Some(7));
        assert_eq!(Query::parse("flows?last=99999").unwrap().last, MAX_ANSWER);
        assert!(Query::parse("flows?last=x").unwrap_err().contains("last"));
        assert!(
            Query::parse("flows?color=red")
                .unwrap_err()
                .contains("unknown")
        );
    }
}
