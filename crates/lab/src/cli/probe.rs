//! `lab probe`, `lab matrix` and `lab bench`: reachability between pods and throughput.

use super::*;

/// What a probe connects to: an address, a port and a protocol, and how to name it.
#[derive(Debug, Clone)]
pub struct ProbeTarget {
    pub label: String,
    pub ip: String,
    pub port: u16,
    pub udp: bool,
}

/// A probe's target: a pod (`namespace/pod`, on `port`), a Service (`svc/<ns>/<name>[:port]`:
/// its ClusterIP and the port given by number or name, else its first; the port's protocol),
/// a node (`node/<name>`: its address, on `port`, e.g. a NodePort) or an address (on `port`).
pub fn resolve_target(
    st: &LabState,
    to: &str,
    port: u16,
    udp: bool,
) -> Result<ProbeTarget, LabError> {
    resolve_target_in(st, to, port, udp, 4)
}

/// `--family`: 4 or 6, anything else refused.
pub(super) fn check_family(family: u8) -> Result<u8, LabError> {
    match family {
        4 | 6 => Ok(family),
        f => Err(other(format!(
            "--family {f}: use 4 or 6 (6 needs a dual-stack lab: `lab up --ipv6`)"
        ))),
    }
}

/// [`resolve_target`] in one address family: with 6 a pod or node is reached at its IPv6
/// address (a dual-stack lab, `up --ipv6`); Services and bare addresses are what they are.
pub fn resolve_target_in(
    st: &LabState,
    to: &str,
    port: u16,
    udp: bool,
    family: u8,
) -> Result<ProbeTarget, LabError> {
    if family == 6 && !st.ipv6 {
        return Err(other(format!(
            "lab {:?} is IPv4 only: IPv6 probes need `margay lab up --ipv6`",
            st.name
        )));
    }
    if let Some(rest) = to.strip_prefix("svc/") {
        let api = crate::ops::api_for(st)?.ok_or_else(|| {
            other(format!(
                "{to}: Services need a lab on the Kubernetes API (`lab up --datastore kubernetes`)"
            ))
        })?;
        let (id, want) = match rest.split_once(':') {
            Some((id, p)) => (id, Some(p)),
            None => (rest, None),
        };
        let (ns, name) = id
            .split_once('/')
            .ok_or_else(|| other(format!("{to}: write svc/<namespace>/<name>[:port]")))?;
        let svc = api
            .get(&margay_datastore::kube::route::SERVICES, Some(ns), name)?
            .ok_or_else(|| other(format!("no Service {ns}/{name}")))?;
        let ip = svc
            .pointer("/spec/clusterIP")
            .and_then(serde_json::Value::as_str)
            .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
            .ok_or_else(|| other(format!("Service {ns}/{name} has no ClusterIP")))?;
        let ports = svc
            .pointer("/spec/ports")
            .and_then(serde_json::Value::as_array)
            .cloned()
            .unwrap_or_default();
        let chosen = ports
            .iter()
            .find(|p| match want {
                None => true,
                Some(w) => {
                    p["name"].as_str() == Some(w)
                        || p["port"].as_u64().map(|n| n.to_string()).as_deref() == Some(w)
                }
            })
            .ok_or_else(|| {
                other(format!(
                    "Service {ns}/{name} has no port {}",
                    want.unwrap_or("at all")
                ))
            })?;
        let port = chosen["port"]
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| other(format!("Service {ns}/{name}: a port is not a number")))?;
        return Ok(ProbeTarget {
            label: to.to_string(),
            ip: ip.to_string(),
            port,
            udp: chosen["protocol"].as_str() == Some("UDP"),
        });
    }
    if let Ok(ip) = to.parse::<std::net::IpAddr>() {
        // A bare address (a LoadBalancer ingress address, an ExternalIP), on `port`.
        return Ok(ProbeTarget {
            label: to.to_string(),
            ip: ip.to_string(),
            port,
            udp,
        });
    }
    if let Some(node) = to.strip_prefix("node/") {
        let n = st
            .node(node)
            .ok_or_else(|| other(format!("no node {node:?}")))?;
        let ip = if family == 6 {
            n.ip6
                .clone()
                .ok_or_else(|| other(format!("node {node} has no IPv6 address")))?
        } else {
            n.ip.clone()
        };
        return Ok(ProbeTarget {
            label: to.to_string(),
            ip,
            port,
            udp,
        });
    }
    let dst = st
        .pod(to)
        .ok_or_else(|| other(format!("no pod {to:?} (pods: {:?})", pod_ids(st))))?;
    let ip = if family == 6 { &dst.ip6 } else { &dst.ip };
    let ip = ip.as_deref().ok_or_else(|| {
        other(format!(
            "pod {to} has no IPv{family} address{}",
            if family == 6 { "" } else { " yet" }
        ))
    })?;
    Ok(ProbeTarget {
        label: to.to_string(),
        ip: ip.to_string(),
        port,
        udp,
    })
}

/// The namespace a probe starts in: a pod's (`namespace/pod`) or a node's (`node/<name>`).
fn source_netns(st: &LabState, from: &str) -> Result<String, LabError> {
    if let Some(node) = from.strip_prefix("node/") {
        return st
            .node(node)
            .map(|n| n.netns.clone())
            .ok_or_else(|| other(format!("no node {node:?}")));
    }
    st.pod(from)
        .map(|p| p.netns.clone())
        .ok_or_else(|| other(format!("no pod {from:?} (pods: {:?})", pod_ids(st))))
}

/// One probe between pods (true: reached).
pub fn probe(
    st: &LabState,
    from: &str,
    to: &str,
    port: u16,
    udp: bool,
    timeout_ms: u64,
) -> Result<bool, LabError> {
    let target = resolve_target(st, to, port, udp)?;
    Ok(probe_to(st, from, &target, timeout_ms)?.is_some())
}

/// One probe to a resolved target: the server's answer (None: not reached).
pub fn probe_to(
    st: &LabState,
    from: &str,
    target: &ProbeTarget,
    timeout_ms: u64,
) -> Result<Option<String>, LabError> {
    let netns = source_netns(st, from)?;
    let mut c = net::in_netns(&netns, exe()?);
    c.args([
        "lab",
        "connect",
        "--show",
        "--to",
        &target.ip,
        "--port",
        &target.port.to_string(),
        "--timeout-ms",
        &timeout_ms.to_string(),
    ]);
    if target.udp {
        c.arg("--udp");
    }
    let out = c
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| other(format!("probing {from} -> {}: {e}", target.label)))?;
    Ok(out
        .status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()))
}

pub(super) fn pod_ids(st: &LabState) -> Vec<&str> {
    st.pods.iter().map(|p| p.id.as_str()).collect()
}

pub(super) fn udp_flag(protocol: &str) -> Result<bool, LabError> {
    match protocol {
        "tcp" => Ok(false),
        "udp" => Ok(true),
        other_p => Err(other(format!("--protocol {other_p:?}: use tcp or udp"))),
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn probe_cmd(
    which: &Which,
    from: &str,
    to: &str,
    port: u16,
    protocol: &str,
    timeout_ms: u64,
    show: bool,
    family: u8,
    out: &mut dyn Write,
) -> Result<u8, LabError> {
    let st = load(which)?;
    let target = resolve_target_in(&st, to, port, udp_flag(protocol)?, check_family(family)?)?;
    let reply = probe_to(&st, from, &target, timeout_ms)?;
    let proto = if target.udp { "udp" } else { "tcp" };
    let _ = writeln!(
        out,
        "{from} -> {to} {proto}/{}: {}",
        target.port,
        match (&reply, show) {
            (Some(r), true) => format!("allowed ({r})"),
            (Some(_), false) => "allowed".to_string(),
            (None, _) => "denied".to_string(),
        }
    );
    Ok(if reply.is_some() { 0 } else { 1 })
}

/// Every pod to every pod (itself included), probed in parallel.
pub fn matrix(
    st: &LabState,
    port: u16,
    udp: bool,
    timeout_ms: u64,
    services: &[String],
) -> Result<BTreeMap<String, BTreeMap<String, bool>>, LabError> {
    matrix_in(st, port, udp, timeout_ms, services, 4)
}

/// [`matrix`] with the pods reached at their addresses of `family` (4 or 6).
pub fn matrix_in(
    st: &LabState,
    port: u16,
    udp: bool,
    timeout_ms: u64,
    services: &[String],
    family: u8,
) -> Result<BTreeMap<String, BTreeMap<String, bool>>, LabError> {
    let mut targets: Vec<ProbeTarget> = Vec::new();
    for p in &st.pods {
        targets.push(resolve_target_in(st, &p.id, port, udp, family)?);
    }
    // Services as extra columns (resolved once).
    for s in services {
        targets.push(resolve_target(st, s, port, udp)?);
    }
    let pairs: Vec<(String, &ProbeTarget)> = st
        .pods
        .iter()
        .flat_map(|a| targets.iter().map(move |t| (a.id.clone(), t)))
        .collect();
    let mut out: BTreeMap<String, BTreeMap<String, bool>> = BTreeMap::new();
    // All at once (bounded): a matrix costs about one probe timeout.
    for chunk in pairs.chunks(128) {
        let results: Vec<Result<(String, String, bool), LabError>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|(a, t)| {
                    s.spawn(move || {
                        probe_to(st, a, t, timeout_ms)
                            .map(|r| (a.clone(), t.label.clone(), r.is_some()))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(other("a probe thread panicked")))
                })
                .collect()
        });
        for r in results {
            let (a, b, ok) = r?;
            out.entry(a).or_default().insert(b, ok);
        }
    }
    Ok(out)
}

/// The matrix as a grid: rows are sources, columns destinations.
pub fn render_matrix(m: &BTreeMap<String, BTreeMap<String, bool>>, colour: bool) -> String {
    let cols: Vec<&String> = m
        .values()
        .next()
        .map(|r| r.keys().collect())
        .unwrap_or_default();
    let mut s = String::from("from\\to ");
    for c in &cols {
        s.push_str(&format!("{c:>5}"));
    }
    s.push('\n');
    for (row, cells) in m {
        s.push_str(&format!("{row:<8}"));
        for c in &cols {
            let ok = cells.get(*c).copied().unwrap_or(false);
            let mark = match (ok, colour) {
                (true, true) => "\x1b[32m    .\x1b[0m".to_string(),
                (false, true) => "\x1b[31m    X\x1b[0m".to_string(),
                (true, false) => "    .".to_string(),
                (false, false) => "    X".to_string(),
            };
            s.push_str(&mark);
        }
        s.push('\n');
    }
    s.push_str("(. reached, X blocked)\n");
    s
}

#[allow(clippy::too_many_arguments)]
pub(super) fn matrix_cmd(
    which: &Which,
    port: u16,
    protocol: &str,
    timeout_ms: u64,
    output: &str,
    explain: bool,
    services: &[String],
    family: u8,
    out: &mut dyn Write,
) -> Result<u8, LabError> {
    let st = load(which)?;
    let since = now_ms();
    let family = check_family(family)?;
    let m = matrix_in(&st, port, udp_flag(protocol)?, timeout_ms, services, family)?;
    if explain {
        // The flow records of the matrix's denied probes (flows are closed every second).
        std::thread::sleep(Duration::from_millis(1500));
        let flows = lab_flows(
            &st,
            &FlowFilter {
                denied: true,
                last: 4095,
                ..FlowFilter::default()
            },
        )?;
        let proto = if udp_flag(protocol)? { 17 } else { 6 };
        let ip_of = |id: &str| {
            st.pod(id)
                .and_then(|p| {
                    if family == 6 {
                        p.ip6.clone()
                    } else {
                        p.ip.clone()
                    }
                })
                .unwrap_or_default()
        };
        let mut lines = Vec::new();
        for (from, row) in &m {
            for (to, ok) in row {
                if *ok || from == to {
                    continue;
                }
                let (src, dst) = (ip_of(from), ip_of(to));
                let why = flows
                    .iter()
                    .find(|f| {
                        f["tuple"]["src"] == src.as_str()
                            && f["tuple"]["dst"] == dst.as_str()
                            && f["tuple"]["proto"] == proto
                            && f["tuple"]["dst_port"] == port
                            && f["end_ms"].as_u64().unwrap_or(0) >= since
                    })
                    .map(|f| {
                        format!(
                            "{} (node {})",
                            describe(f),
                            f["node"].as_str().unwrap_or("?")
                        )
                    })
                    .unwrap_or_else(|| {
                        "no flow record (flow logs are off on the eBPF dataplane)".into()
                    });
                lines.push(format!("{from} -> {to}: {why}"));
            }
        }
        if output == "json" {
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({"matrix": m, "denied": lines}))
                    .unwrap_or_default()
            );
            return Ok(0);
        }
        let _ = writeln!(out, "{protocol}/{port}:");
        let _ = write!(
            out,
            "{}",
            render_matrix(&m, std::io::stdout().is_terminal())
        );
        if !lines.is_empty() {
            let _ = writeln!(out, "denied:");
            for l in lines {
                let _ = writeln!(out, "  {l}");
            }
        }
        return Ok(0);
    }
    match output {
        "json" => {
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&m).unwrap_or_default()
            );
        }
        "table" => {
            let _ = writeln!(out, "{protocol}/{port}:");
            let _ = write!(
                out,
                "{}",
                render_matrix(&m, std::io::stdout().is_terminal())
            );
        }
        other_o => return Err(other(format!("-o {other_o:?}: use table or json"))),
    }
    Ok(0)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(0))
        .unwrap_or(0)
}

/// `margay lab flows`' filters (each node's `margay flows` flags).
#[derive(Debug, Clone, Default)]
pub(super) struct FlowFilter {
    pub denied: bool,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub policy: Option<String>,
    pub last: usize,
    /// Keep printing every node's new flows (each node's `margay flows --follow`).
    pub follow: bool,
    /// With `follow`: stop after this many seconds.
    pub until_seconds: Option<u64>,
}

/// `margay flows` for one node, with the filter's selections.
fn node_flows_command(
    st: &LabState,
    node: &str,
    filter: &FlowFilter,
    last: usize,
) -> Result<Command, LabError> {
    let mut c = Command::new(exe()?);
    c.args([
        "flows",
        "-o",
        "json",
        "--last",
        &last.to_string(),
        "--status-socket",
    ])
    .arg(st.node_dir(node).join("felix.sock"));
    if filter.denied {
        c.arg("--denied");
    }
    for (flag, v) in [
        ("--namespace", &filter.namespace),
        ("--pod", &filter.pod),
        ("--policy", &filter.policy),
    ] {
        if let Some(v) = v {
            c.args([flag, v]);
        }
    }
    Ok(c)
}

/// A flow record's rule, for people (what `margay flows` prints after "by").
fn describe(f: &Value) -> String {
    match serde_json::from_value::<margay_flows::RuleRef>(f["rule"].clone()) {
        Ok(r) => r.describe(),
        Err(_) => f["policy"].as_str().unwrap_or("?").to_string(),
    }
}

/// Every running node's recent flows (its Felix's `margay flows -o json`), by time.
pub(super) fn lab_flows(st: &LabState, filter: &FlowFilter) -> Result<Vec<Value>, LabError> {
    let mut all = Vec::new();
    for node in st.nodes.iter().filter(|n| !n.stopped) {
        let mut c = node_flows_command(st, &node.name, filter, filter.last)?;
        let o = c
            .stdin(Stdio::null())
            .output()
            .map_err(|e| other(format!("margay flows on {}: {e}", node.name)))?;
        if !o.status.success() {
            // A node whose Felix is restarting or keeps no flows (flow logs off): said on
            // stderr, and the other nodes' flows still shown.
            eprintln!(
                "margay lab flows: node {} left out: {}",
                node.name,
                String::from_utf8_lossy(&o.stderr).trim()
            );
            continue;
        }
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            if let Ok(v) = serde_json::from_str::<Value>(line) {
                all.push(v);
            }
        }
    }
    all.sort_by_key(|f| f["start_ms"].as_u64().unwrap_or(0));
    Ok(all)
}

pub(super) fn flows_cmd(
    which: &Which,
    filter: &FlowFilter,
    output: &str,
    out: &mut dyn Write,
) -> Result<u8, LabError> {
    if output != "table" && output != "json" {
        return Err(other(format!("-o {output:?}: use table or json")));
    }
    let st = load(which)?;
    for f in lab_flows(&st, filter)? {
        print_flow(out, &f, output);
    }
    if filter.follow {
        follow_flows(&st, filter, output, out)?;
    }
    Ok(0)
}

/// Children killed and reaped on drop (the followers of `lab flows --follow`).
struct Followers(Vec<std::process::Child>);

impl Drop for Followers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Every running node's new flows as they come, until the followers end (`until_seconds`)
/// or the lab command is interrupted.
fn follow_flows(
    st: &LabState,
    filter: &FlowFilter,
    output: &str,
    out: &mut dyn Write,
) -> Result<(), LabError> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    let mut followers = Followers(Vec::new());
    let mut readers = Vec::new();
    for node in st.nodes.iter().filter(|n| !n.stopped) {
        let mut c = node_flows_command(st, &node.name, filter, 0)?;
        c.arg("--follow");
        if let Some(s) = filter.until_seconds {
            c.args(["--until-seconds", &s.to_string()]);
        }
        let mut child = c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| other(format!("margay flows --follow on {}: {e}", node.name)))?;
        if let Some(stdout) = child.stdout.take() {
            let tx = tx.clone();
            readers.push(std::thread::spawn(move || {
                // Lines are bounded by what Felix sends (one flow record each).
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Ok(v) = serde_json::from_str::<Value>(&line)
                        && tx.send(v).is_err()
                    {
                        break;
                    }
                }
            }));
        }
        followers.0.push(child);
    }
    drop(tx);
    // Ends when every follower has ended (their stdout closed).
    for f in rx {
        print_flow(out, &f, output);
        let _ = out.flush();
    }
    for r in readers {
        let _ = r.join();
    }
    Ok(())
}

/// One flow record as a table line or a JSON line.
fn print_flow(out: &mut dyn Write, f: &Value, output: &str) {
    {
        if output == "json" {
            let _ = writeln!(out, "{f}");
            return;
        }
        let end = |p: &Value, ip: &Value| {
            let who = match (p["namespace"].as_str(), p["name"].as_str()) {
                (Some(ns), Some(n)) if !ns.is_empty() && ns != "-" => format!("{ns}/{n}"),
                (_, Some(n)) => n.to_string(),
                _ => "?".into(),
            };
            format!("{who} ({})", ip.as_str().unwrap_or("?"))
        };
        let _ = writeln!(
            out,
            "{:<8} {} -> {} {}/{} {} by {}",
            f["node"].as_str().unwrap_or("?"),
            end(&f["source"], &f["tuple"]["src"]),
            end(&f["dest"], &f["tuple"]["dst"]),
            f["proto"].as_str().unwrap_or("?"),
            f["tuple"]["dst_port"],
            if f["action"] == "deny" {
                "DENIED"
            } else {
                "ALLOWED"
            },
            describe(f)
        );
    }
}

/// Throughput (Gbit/s) and connection rate (per second) from one namespace to an address.
pub(super) fn measure(
    client_ns: &str,
    server_ns: &str,
    to: &str,
    secs: u64,
) -> Result<(f64, f64), LabError> {
    let exe = exe()?;
    let mut server = net::in_netns(server_ns, "iperf3")
        .args(["-s", "-p", "5299", "-1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| other(format!("iperf3 (install it: apt-get install iperf3): {e}")))?;
    std::thread::sleep(Duration::from_millis(300));
    let result = net::run(net::in_netns(client_ns, "iperf3").args([
        "-c",
        to,
        "-p",
        "5299",
        "-t",
        &secs.to_string(),
        "-J",
    ]));
    let _ = server.kill();
    let _ = server.wait();
    let json: Value =
        serde_json::from_str(&result?).map_err(|e| other(format!("iperf3 output: {e}")))?;
    let gbps = json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e9;
    let mut acceptor = net::in_netns(server_ns, &exe)
        .args(["lab", "serve", "--name", "bench", "--tcp", "5300"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| other(format!("bench server: {e}")))?;
    // Each connection leaves a socket in TIME_WAIT on the client for 60 s: with the default
    // port range a few seconds of connecting use up the ports, and the next run would measure
    // port exhaustion instead of the datapath. Both settings are per namespace (the client's).
    net::sysctl(client_ns, "net.ipv4.ip_local_port_range", "1024 65535")?;
    net::sysctl(client_ns, "net.ipv4.tcp_tw_reuse", "1")?;
    std::thread::sleep(Duration::from_millis(300));
    let counted = net::run(net::in_netns(client_ns, &exe).args([
        "lab",
        "connect",
        "--to",
        to,
        "--port",
        "5300",
        "--timeout-ms",
        "500",
        "--loop-secs",
        &secs.to_string(),
    ]));
    let _ = acceptor.kill();
    let _ = acceptor.wait();
    let conns: f64 = counted?.trim().parse().unwrap_or(0.0);
    Ok((gbps, conns / secs as f64))
}

pub(super) fn bench(
    which: &Which,
    secs: u64,
    policies: usize,
    family: u8,
    out: &mut dyn Write,
) -> Result<u8, LabError> {
    let family = check_family(family)?;
    let st = load(which)?;
    if family == 6 && !st.ipv6 {
        return Err(other(format!(
            "lab {:?} is IPv4 only: --family 6 needs `margay lab up --ipv6`",
            st.name
        )));
    }
    // Client and server on different nodes when there are two.
    let client = st
        .pods
        .first()
        .ok_or_else(|| other("the lab has no pods"))?;
    let server = st
        .pods
        .iter()
        .find(|p| p.node != client.node)
        .or_else(|| st.pods.get(1))
        .ok_or_else(|| other("the bench needs two pods"))?;
    let server_ip = if family == 6 { &server.ip6 } else { &server.ip }
        .clone()
        .ok_or_else(|| other(format!("the server pod has no IPv{family} address")))?;
    let mut rows = Vec::new();
    // Baseline: two throw-away namespaces joined by a bare veth pair.
    let a = format!("{}bench-a", st.prefix);
    let b = format!("{}bench-b", st.prefix);
    net::add_netns(&a)?;
    net::add_netns(&b)?;
    let baseline = (|| {
        net::ip(
            &a,
            &[
                "link", "add", "veth0", "type", "veth", "peer", "name", "veth0", "netns", &b,
            ],
        )?;
        net::ip(&a, &["addr", "add", "192.0.2.1/24", "dev", "veth0"])?;
        net::ip(&b, &["addr", "add", "192.0.2.2/24", "dev", "veth0"])?;
        net::ip(&a, &["link", "set", "veth0", "up"])?;
        net::ip(&b, &["link", "set", "veth0", "up"])?;
        measure(&a, &b, "192.0.2.2", secs)
    })();
    net::remove_netns(&[a, b]);
    rows.push(("bare veth pair (no margay)".to_string(), baseline?));
    rows.push((
        format!(
            "{} -> {} (other node, {}{}), no policy",
            client.id,
            server.id,
            if st.backend == "bird" { "BGP" } else { "VXLAN" },
            if family == 6 { ", IPv6" } else { "" }
        ),
        measure(&client.netns, &server.netns, &server_ip, secs)?,
    ));
    // With policy: many policies on the server pod, the one allowing the traffic last.
    let (ns, pod) = server.id.split_once('/').unwrap_or(("", ""));
    let mut yaml = String::new();
    for i in 0..policies {
        yaml.push_str(&format!(
            "---\napiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata: {{name: bench-{i}, namespace: {ns}}}\nspec:\n  order: {i}\n  selector: pod == '{pod}'\n  ingress:\n  - action: Allow\n    protocol: TCP\n    source: {{selector: pod == 'nobody-{i}'}}\n    destination: {{ports: [{}]}}\n",
            10000 + i
        ));
    }
    yaml.push_str(&format!(
        "---\napiVersion: projectcalico.org/v3\nkind: NetworkPolicy\nmetadata: {{name: bench-allow, namespace: {ns}}}\nspec:\n  order: {policies}\n  selector: pod == '{pod}'\n  ingress: [{{action: Allow}}]\n"
    ));
    apply_yaml(&st, &yaml)?;
    std::thread::sleep(Duration::from_secs(2));
    let with = measure(&client.netns, &server.netns, &server_ip, secs);
    // Remove the bench policies again.
    let file = st.dir.join("bench-policies.yaml");
    let _ = std::fs::write(&file, &yaml);
    if let Ok(mut c) = margay_in(&st, &st.fabric_netns()) {
        c.args(["ctl", "delete", "-f"]).arg(&file);
        let _ = net::run(&mut c);
    }
    let _ = std::fs::remove_file(&file);
    rows.push((
        format!("same, with {} policies on {}", policies + 1, server.id),
        with?,
    ));
    let _ = writeln!(
        out,
        "{:<58} {:>10} {:>14}",
        "PATH", "TCP Gbit/s", "connections/s"
    );
    let base = rows[0].1;
    for (label, (gbps, rate)) in &rows {
        let _ = writeln!(
            out,
            "{label:<58} {gbps:>10.2} {rate:>14.0}   ({:.0}% / {:.0}% of the bare veth)",
            100.0 * gbps / base.0.max(f64::MIN_POSITIVE),
            100.0 * rate / base.1.max(f64::MIN_POSITIVE)
        );
    }
    Ok(0)
}

#[cfg(test)]
mod family_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::state::PodState;

    fn lab(ipv6: bool) -> LabState {
        let mut st = LabState::new(
            "t",
            Path::new("/tmp/t"),
            "local",
            "vxlan",
            default_topology(2),
        );
        if ipv6 {
            st = st.with_ipv6();
        }
        let pod: &mut PodState = &mut st.pods[0];
        pod.ip = Some("10.244.1.2".into());
        pod.ip6 = ipv6.then(|| "fd00:10:244::2".to_string());
        st
    }

    #[test]
    fn targets_in_each_family() {
        let st = lab(true);
        let t = resolve_target_in(&st, "x/a", 80, false, 6).unwrap();
        assert_eq!(t.ip, "fd00:10:244::2");
        assert_eq!(
            resolve_target_in(&st, "x/a", 80, false, 4).unwrap().ip,
            "10.244.1.2"
        );
        assert_eq!(
            resolve_target_in(&st, "node/node2", 80, false, 6)
                .unwrap()
                .ip,
            "fd00:172:30::12"
        );
        assert_eq!(
            resolve_target_in(&st, "node/node2", 80, false, 4)
                .unwrap()
                .ip,
            "172.30.0.12"
        );
        // A pod without its IPv6 address yet is an error naming it, never a wrong target.
        let e = resolve_target_in(&st, "x/b", 80, false, 6).unwrap_err();
        assert!(e.to_string().contains("pod x/b has no IPv6 address"), "{e}");
    }

    #[test]
    fn ipv6_probes_need_a_dual_stack_lab_and_families_are_4_or_6() {
        let e = resolve_target_in(&lab(false), "x/a", 80, false, 6).unwrap_err();
        assert!(e.to_string().contains("lab up --ipv6"), "{e}");
        for bad in [0, 5, 46, 255] {
            let e = check_family(bad).unwrap_err();
            assert!(e.to_string().contains("use 4 or 6"), "{e}");
        }
        assert_eq!(check_family(6).unwrap(), 6);
    }

    #[test]
    fn old_state_files_load_as_ipv4_only() {
        // A state file written before --ipv6 existed (no ipv6/ip6 fields).
        let mut v = serde_json::to_value(lab(false)).unwrap();
        assert!(v.get("ipv6").is_none() && v["nodes"][0].get("ip6").is_none());
        v["pods"][0].as_object_mut().unwrap().remove("ip6");
        let st: LabState = serde_json::from_value(v).unwrap();
        assert!(!st.ipv6 && st.nodes[0].ip6.is_none() && st.pods[0].ip6.is_none());
        let dual: LabState =
            serde_json::from_value(serde_json::to_value(lab(true)).unwrap()).unwrap();
        assert_eq!(dual, lab(true));
    }
}
