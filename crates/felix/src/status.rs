//! Felix's node-local status API: a unix socket (default `/var/run/margay/felix.sock`, mode
//! 0600) that answers one request per connection with JSON and closes.
//!
//! Protocol: the client writes one line naming what it wants — `status` (everything but the
//! configuration), `config`, `endpoints`, `ipsets`, `problems`, `bootstrap`, `health` or
//! `all` — and reads JSON until the server closes. An HTTP `GET /<name>` request works too
//! (`curl --unix-socket /var/run/margay/felix.sock http://felix/status`).
//! `margay felix status` is the client and renders the answer for people.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::FelixError;
use crate::bootstrap::PhaseTiming;
use crate::health::ComponentHealth;

/// Where the status socket is unless `--status-socket` / MARGAY_FELIX_STATUS_SOCKET say
/// otherwise.
pub const DEFAULT_SOCKET: &str = "/var/run/margay/felix.sock";
/// The requests the server knows.
pub const REQUESTS: &[&str] = &[
    "status",
    "all",
    "config",
    "endpoints",
    "ipsets",
    "problems",
    "bootstrap",
    "health",
];

/// One tier of policies applied to an endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TierView {
    pub name: String,
    /// `normal`, or for host endpoints `untracked`, `pre-dnat`, `forward`.
    #[serde(default)]
    pub stage: String,
    pub default_action: String,
    pub ingress: Vec<String>,
    pub egress: Vec<String>,
}

/// A local endpoint with its policy, as the dataplane was told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointView {
    /// `workload` or `host`.
    pub kind: String,
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    pub interface: String,
    pub addresses: Vec<String>,
    pub profiles: Vec<String>,
    pub tiers: Vec<TierView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IpSetView {
    pub id: String,
    pub kind: String,
    pub members: usize,
    pub users: u32,
    pub source: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProblemView {
    pub resource: String,
    /// `validation` (the validation filter turned it into a deletion) or `graph` (the
    /// calculation graph could not use it).
    pub stage: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataplaneView {
    pub driver: String,
    pub in_sync: bool,
    pub messages_applied: u64,
    /// The Linux driver's nftables state: transactions, repairs, sizes, per-endpoint chains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nft: Option<serde_json::Value>,
    /// The eBPF driver's state (BPFEnabled): programs, endpoints, rule blocks, conntrack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpf: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct BootstrapView {
    pub phases: Vec<PhaseTiming>,
    /// Seconds from start to ready, once ready.
    pub ready_after_seconds: Option<f64>,
}

/// The answer while Felix is still starting (before its pipeline runs): what it waits for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartingDoc {
    pub starting: bool,
    pub pid: u32,
    pub version: String,
    pub uptime_seconds: f64,
    /// What start-up waits for now: configuration, the datastore (and why it is not there
    /// yet), its initialisation, Typha, …
    pub waiting_for: String,
    pub waiting_seconds: f64,
    /// The start-up phases done so far.
    pub phases: Vec<PhaseTiming>,
    /// The one-line summary (also what older clients print as the error).
    pub error: String,
}

/// The human form of a [`StartingDoc`].
pub fn render_starting(doc: &StartingDoc) -> String {
    let mut out = format!(
        "Felix is starting (pid {}, version {}, up {:.1}s)\nwaiting for: {} (for {:.1}s)\n",
        doc.pid, doc.version, doc.uptime_seconds, doc.waiting_for, doc.waiting_seconds
    );
    if doc.phases.is_empty() {
        out.push_str("phases done: none yet\n");
    } else {
        let done: Vec<String> = doc
            .phases
            .iter()
            .map(|p| format!("{} {:.3}s", p.phase, p.seconds))
            .collect();
        out.push_str(&format!("phases done: {}\n", done.join(", ")));
    }
    out
}

/// Everything `status` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusDoc {
    pub hostname: String,
    pub version: String,
    pub pid: u32,
    pub uptime_seconds: f64,
    pub live: bool,
    pub ready: bool,
    pub health: Vec<ComponentHealth>,
    /// The syncer's status: `wait-for-datastore`, `resync-in-progress`, `in-sync`.
    pub sync_status: String,
    /// The calculation graph has sent the dataplane the complete state.
    pub in_sync: bool,
    pub datastore: String,
    pub dataplane: DataplaneView,
    /// The calculation graph's counters (`CalcGraph::counts()`).
    pub counts: BTreeMap<String, u64>,
    pub bootstrap: BootstrapView,
    pub endpoints: Vec<EndpointView>,
    pub ip_sets: Vec<IpSetView>,
    pub problems: Vec<ProblemView>,
    /// The service ports the dataplane has (`<ns>/<name>/<protocol>/<port name>` → frontends
    /// and backends).
    #[serde(default)]
    pub services: BTreeMap<String, serde_json::Value>,
    /// Only in `all`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<serde_json::Value>,
}

fn fmt_secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.1}ms", s * 1000.0)
    } else {
        format!("{s:.3}s")
    }
}

fn fmt_uptime(s: f64) -> String {
    let total = s as u64;
    let (h, m, sec) = (total / 3600, (total / 60) % 60, total % 60);
    if h > 0 {
        format!("{h}h{m}m{sec}s")
    } else if m > 0 {
        format!("{m}m{sec}s")
    } else {
        format!("{s:.1}s")
    }
}

/// Aligned columns, two spaces apart, indented by two.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut s = String::from(" ");
        for (i, c) in cells.iter().enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            if i + 1 == cells.len() {
                let _ = write!(s, " {c}");
            } else {
                let _ = write!(s, " {c:<w$} ");
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(headers.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
    out
}

fn list_or_dash(v: &[String]) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.join(", ")
    }
}

/// What `margay felix status` prints.
pub fn render(doc: &StatusDoc) -> String {
    let mut out = String::new();
    let yes = |b: bool, y: &str, n: &str| if b { y.to_string() } else { n.to_string() };
    let _ = writeln!(
        out,
        "Felix on {} (margay {}, pid {}): {}, {}; up {}",
        doc.hostname,
        doc.version,
        doc.pid,
        yes(doc.live, "live", "NOT LIVE"),
        yes(doc.ready, "ready", "NOT READY"),
        fmt_uptime(doc.uptime_seconds)
    );
    let _ = writeln!(out, "Datastore:  {} ({})", doc.datastore, doc.sync_status);
    let _ = writeln!(
        out,
        "Dataplane:  {} driver, {}; {} messages applied",
        doc.dataplane.driver,
        yes(doc.dataplane.in_sync, "in sync", "not in sync yet"),
        doc.dataplane.messages_applied
    );
    if let Some(bpf) = &doc.dataplane.bpf {
        let n = |k: &str| bpf.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        let _ = writeln!(
            out,
            "eBPF:       {} interfaces with programs, {} endpoints, {} rule blocks ({} rules), {} IP-set entries; conntrack {} entries ({} deleted by the last sweep); restored at start: {} endpoints, {} interfaces ({} programs replaced); pins in {}",
            n("interfaces_attached"),
            n("endpoints"),
            n("blocks"),
            n("rules"),
            n("set_entries"),
            n("conntrack_entries"),
            n("conntrack_deleted"),
            n("restored_endpoints"),
            n("restored_interfaces"),
            n("programs_replaced"),
            bpf.get("pin_dir")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("?"),
        );
    }
    if let Some(nft) = &doc.dataplane.nft {
        let n = |k: &str| nft.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        let _ = writeln!(
            out,
            "nftables:   table inet margay: {} chains, {} rules, {} set elements; {} transactions ({} failed), {} drift repairs in {} refreshes; last apply {}",
            n("chains"),
            n("rules"),
            n("elements"),
            n("transactions"),
            n("failed_transactions"),
            n("repairs"),
            n("refreshes"),
            fmt_secs(
                nft.get("last_apply_seconds")
                    .and_then(serde_json::Value::as_f64)
                    .unwrap_or(0.0)
            ),
        );
        if let Some(err) = nft.get("last_error").and_then(serde_json::Value::as_str) {
            let _ = writeln!(out, "            last error: {err}");
        }
        for ep in nft
            .get("endpoints")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
        {
            let iface = ep
                .get("interface")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("?");
            let chains: Vec<&str> = ep
                .get("chains")
                .and_then(serde_json::Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(serde_json::Value::as_str)
                .collect();
            let _ = writeln!(
                out,
                "            {iface}: {} rules in chains {}",
                ep.get("rules")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0),
                chains.join(", ")
            );
        }
    }
    let c = |k: &str| doc.counts.get(k).copied().unwrap_or(0);
    let _ = writeln!(
        out,
        "Counts:     {} local endpoints of {} workload endpoints; {} of {} policies active; {} of {} profiles active; {} IP sets ({} members); {} selectors; {} hosts; {} pools; {} routes",
        c("local_endpoints"),
        c("workload_endpoints"),
        c("active_policies"),
        c("policies"),
        c("active_profiles"),
        c("profiles"),
        c("active_ip_sets"),
        c("ip_set_members"),
        c("selectors"),
        c("hosts"),
        c("pools"),
        c("routes"),
    );

    let _ = writeln!(out, "\nHealth:");
    let rows: Vec<Vec<String>> = doc
        .health
        .iter()
        .map(|h| {
            vec![
                h.name.clone(),
                h.timeout.clone(),
                h.liveness.clone(),
                h.readiness.clone(),
                if h.detail.is_empty() {
                    "-".into()
                } else {
                    h.detail.clone()
                },
            ]
        })
        .collect();
    out.push_str(&table(
        &["COMPONENT", "TIMEOUT", "LIVENESS", "READINESS", "DETAIL"],
        &rows,
    ));

    let _ = match doc.bootstrap.ready_after_seconds {
        Some(s) => writeln!(out, "\nStart-up (ready {} after start):", fmt_secs(s)),
        None => writeln!(out, "\nStart-up (not ready yet):"),
    };
    let rows: Vec<Vec<String>> = doc
        .bootstrap
        .phases
        .iter()
        .map(|p| vec![p.phase.clone(), fmt_secs(p.seconds), fmt_secs(p.at_seconds)])
        .collect();
    out.push_str(&table(&["PHASE", "TOOK", "DONE AT"], &rows));

    let _ = writeln!(out, "\nLocal endpoints ({}):", doc.endpoints.len());
    if doc.endpoints.is_empty() {
        let _ = writeln!(out, "  (none)");
    } else {
        let mut rows = Vec::new();
        for e in &doc.endpoints {
            let first = vec![
                e.id.clone(),
                e.interface.clone(),
                list_or_dash(&e.addresses),
                list_or_dash(&e.profiles),
            ];
            if e.tiers.is_empty() {
                let mut r = first;
                r.extend(["-".to_string(), "-".to_string(), "-".to_string()]);
                rows.push(r);
                continue;
            }
            for (i, t) in e.tiers.iter().enumerate() {
                let mut r = if i == 0 {
                    first.clone()
                } else {
                    vec![String::new(); 4]
                };
                let mut tier = format!("{} ({})", t.name, t.default_action.to_lowercase());
                if !t.stage.is_empty() && t.stage != "normal" {
                    tier = format!("{}: {tier}", t.stage);
                }
                r.extend([tier, list_or_dash(&t.ingress), list_or_dash(&t.egress)]);
                rows.push(r);
            }
        }
        out.push_str(&table(
            &[
                "ENDPOINT",
                "INTERFACE",
                "ADDRESSES",
                "PROFILES",
                "TIER (DEFAULT)",
                "INGRESS POLICIES (IN ORDER)",
                "EGRESS POLICIES (IN ORDER)",
            ],
            &rows,
        ));
    }

    let _ = writeln!(out, "\nIP sets ({}):", doc.ip_sets.len());
    if doc.ip_sets.is_empty() {
        let _ = writeln!(out, "  (none)");
    } else {
        let rows: Vec<Vec<String>> = doc
            .ip_sets
            .iter()
            .map(|s| {
                vec![
                    s.id.clone(),
                    s.kind.clone(),
                    s.members.to_string(),
                    s.users.to_string(),
                    s.source.clone(),
                ]
            })
            .collect();
        out.push_str(&table(&["ID", "KIND", "MEMBERS", "USERS", "SOURCE"], &rows));
    }

    let _ = writeln!(out, "\nProblems ({}):", doc.problems.len());
    if doc.problems.is_empty() {
        let _ = writeln!(out, "  (none: every resource was accepted)");
    } else {
        let rows: Vec<Vec<String>> = doc
            .problems
            .iter()
            .map(|p| vec![p.resource.clone(), p.stage.clone(), p.reason.clone()])
            .collect();
        out.push_str(&table(&["RESOURCE", "STAGE", "REASON"], &rows));
    }
    out
}

// ---- the socket ---------------------------------------------------------------------------

/// The listening socket; removes its file when dropped.
pub struct StatusSocket {
    pub listener: tokio::net::UnixListener,
    path: PathBuf,
}

impl Drop for StatusSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl StatusSocket {
    /// Creates the directory, replaces a stale socket (refuses to take over one another Felix
    /// is answering on), binds and restricts the socket to its owner.
    pub fn bind(path: &Path) -> Result<StatusSocket, FelixError> {
        let err = |reason: String| FelixError::StatusSocket {
            path: path.to_path_buf(),
            reason,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => {
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    return Err(err(
                        "another felix is answering on it; stop it or choose another path with \
                         --status-socket"
                            .into(),
                    ));
                }
                tracing::info!(path = %path.display(), "removing a stale status socket");
                std::fs::remove_file(path)
                    .map_err(|e| err(format!("cannot remove the stale socket: {e}")))?;
            }
            Ok(_) => {
                return Err(err(
                    "the path exists and is not a socket; remove it or choose another path with \
                     --status-socket"
                        .into(),
                ));
            }
            Err(_) => {}
        }
        let listener = tokio::net::UnixListener::bind(path).map_err(|e| err(e.to_string()))?;
        let sock = StatusSocket {
            listener,
            path: path.to_path_buf(),
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| err(format!("cannot restrict its permissions: {e}")))?;
        Ok(sock)
    }
}

/// How much one status connection may cost.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// The request (its line, and for HTTP its whole head) at most this many bytes.
    pub max_request: u64,
    /// Reading the request, answering and writing the answer all within this.
    pub deadline: Duration,
    /// Connections served at once; more wait in the listen queue.
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            // A request is a word or a short HTTP head; curl's is about 100 bytes.
            max_request: 8 * 1024,
            deadline: Duration::from_secs(10),
            max_connections: 16,
        }
    }
}

/// Serves status connections until `stop` says so: at most `limits.max_connections` at once,
/// each with [`serve_connection`].
pub async fn serve<F, Fut>(
    listener: &tokio::net::UnixListener,
    limits: ConnLimits,
    answer: F,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = (u16, serde_json::Value)> + Send,
{
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    loop {
        // A free slot first, so a flood of connections waits in the kernel's queue rather
        // than in tasks here.
        let permit = tokio::select! {
            r = stop.changed() => if r.is_err() || *stop.borrow() { return } else { continue },
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        tokio::select! {
            r = stop.changed() => if r.is_err() || *stop.borrow() { return },
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let answer = answer.clone();
                    tokio::spawn(async move {
                        if let Err(why) = serve_connection(stream, limits, answer).await {
                            tracing::debug!(why, "status socket: connection dropped");
                        }
                        drop(permit);
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "status socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Answers one connection: reads a request of at most `limits.max_request` bytes, answers,
/// and closes, all within `limits.deadline`. Returns why it gave up, if it did.
pub async fn serve_connection<F, Fut>(
    stream: tokio::net::UnixStream,
    limits: ConnLimits,
    answer: F,
) -> Result<(), &'static str>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = (u16, serde_json::Value)>,
{
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let work = async move {
        let (r, mut w) = stream.into_split();
        // One budget for the whole request head, however it is split into lines.
        let mut reader = BufReader::new(r.take(limits.max_request));
        let mut first = String::new();
        match reader.read_line(&mut first).await {
            Ok(n) if n > 0 && first.ends_with('\n') => {}
            Ok(0) => return Err("closed before a request"),
            Ok(_) => return Err("request too long"),
            Err(_) => return Err("unreadable request"),
        }
        let (what, is_http) = parse_request(&first);
        if is_http {
            // The rest of the request head, up to its blank line.
            let mut line = String::new();
            loop {
                line.clear();
                match reader.read_line(&mut line).await {
                    Ok(n) if n > 0 && line.ends_with('\n') && !line.trim().is_empty() => {}
                    Ok(n) if n > 0 && line.ends_with('\n') => break,
                    Ok(_) => return Err("request too long"),
                    Err(_) => return Err("unreadable request"),
                }
            }
        }
        let (code, v) = answer(what).await;
        let body = serde_json::to_string_pretty(&v).unwrap_or_else(|_| "{}".into()) + "\n";
        let written = if is_http {
            write_http_json(&mut w, code, body.as_bytes()).await
        } else {
            match w.write_all(body.as_bytes()).await {
                Ok(()) => w.shutdown().await,
                Err(e) => Err(e),
            }
        };
        written.map_err(|_| "the client went away")
    };
    tokio::time::timeout(limits.deadline, work)
        .await
        .unwrap_or(Err("deadline passed"))
}

/// What a connection asked for: the request name and whether to answer in HTTP.
pub fn parse_request(first_line: &str) -> (String, bool) {
    let line = first_line.trim();
    if let Some(path) = http_request_path(line) {
        return (path.trim_matches('/').to_string(), true);
    }
    (line.to_ascii_lowercase(), false)
}

/// The path (without its query) of an HTTP/1.x request line such as
/// `GET /status?x HTTP/1.1`; None when the line is not one.
fn http_request_path(line: &str) -> Option<&str> {
    let mut parts = line.split_ascii_whitespace();
    let _method = parts.next()?;
    let target = parts.next()?;
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return None;
    }
    target.split(['?', '#']).next()
}

/// Writes a complete HTTP/1.1 JSON response and closes the stream.
async fn write_http_json<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    code: u16,
    body: &[u8],
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    w.write_all(head.as_bytes()).await?;
    w.write_all(body).await?;
    w.flush().await?;
    w.shutdown().await
}

/// Asks a running Felix over its status socket.
pub fn request(path: &Path, what: &str, timeout: Duration) -> Result<String, FelixError> {
    let err = |reason: String| FelixError::StatusClient {
        path: path.to_path_buf(),
        reason,
    };
    let mut s = match std::os::unix::net::UnixStream::connect(path) {
        Ok(s) => s,
        Err(e) => {
            let reason = match e.kind() {
                std::io::ErrorKind::NotFound => "socket not found".to_string(),
                std::io::ErrorKind::ConnectionRefused => {
                    "nothing is listening (a stale socket?)".to_string()
                }
                std::io::ErrorKind::PermissionDenied => {
                    "permission denied (the socket is readable by its owner only: run as root)"
                        .to_string()
                }
                _ => e.to_string(),
            };
            return Err(err(reason));
        }
    };
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.set_write_timeout(Some(timeout)))
        .map_err(|e| err(e.to_string()))?;
    s.write_all(format!("{what}\n").as_bytes())
        .map_err(|e| err(e.to_string()))?;
    let mut out = String::new();
    // Felix's answers are a few MB at most (every endpoint and IP set).
    let limit: u64 = 256 << 20;
    let n = (&mut s)
        .take(limit + 1)
        .read_to_string(&mut out)
        .map_err(|e| err(format!("reading the answer: {e}")))?;
    if n as u64 > limit {
        return Err(err(format!(
            "the answer is larger than {} MiB",
            limit >> 20
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn doc() -> StatusDoc {
        StatusDoc {
            hostname: "node1".into(),
            version: "0.1.0".into(),
            pid: 42,
            uptime_seconds: 75.0,
            live: true,
            ready: false,
            health: vec![ComponentHealth {
                name: "CalculationGraph".into(),
                timeout: "30s".into(),
                liveness: "reporting live".into(),
                readiness: "reporting non-ready".into(),
                detail: String::new(),
            }],
            sync_status: "in-sync".into(),
            in_sync: true,
            datastore: "local datastore at /tmp/x.db".into(),
            dataplane: DataplaneView {
                driver: "recording".into(),
                in_sync: true,
                messages_applied: 12,
                nft: None,
                bpf: None,
            },
            counts: BTreeMap::from([
                ("local_endpoints".to_string(), 1),
                ("policies".to_string(), 2),
            ]),
            bootstrap: BootstrapView {
                phases: vec![PhaseTiming {
                    phase: "config_load".into(),
                    seconds: 0.0021,
                    at_seconds: 0.0021,
                }],
                ready_after_seconds: None,
            },
            endpoints: vec![EndpointView {
                kind: "workload".into(),
                id: "k8s/ns1/pod1/eth0".into(),
                name: "node1-k8s-pod1-eth0".into(),
                namespace: "ns1".into(),
                interface: "calipod1".into(),
                addresses: vec!["10.65.0.2/32".into()],
                profiles: vec!["kns.ns1".into()],
                tiers: vec![
                    TierView {
                        name: "security".into(),
                        stage: "normal".into(),
                        default_action: "Pass".into(),
                        ingress: vec!["quarantine".into()],
                        egress: vec![],
                    },
                    TierView {
                        name: "default".into(),
                        stage: "normal".into(),
                        default_action: "Deny".into(),
                        ingress: vec!["allow-web".into(), "ns1/allow-dns".into()],
                        egress: vec!["allow-dns".into()],
                    },
                ],
            }],
            ip_sets: vec![IpSetView {
                id: "s:abc".into(),
                kind: "Net".into(),
                members: 3,
                users: 1,
                source: "selector role == 'db'".into(),
            }],
            problems: vec![ProblemView {
                resource: "NetworkPolicy ns1/bad".into(),
                stage: "validation".into(),
                reason: "spec.selector: bad".into(),
            }],
            services: BTreeMap::new(),
            config: None,
        }
    }

    #[test]
    fn renders_every_section_aligned() {
        let text = render(&doc());
        assert!(
            text.starts_with("Felix on node1 (margay 0.1.0, pid 42): live, NOT READY; up 1m15s\n"),
            "{text}"
        );
        assert!(text.contains("Start-up (not ready yet):"));
        assert!(text.contains("config_load  2.1ms"), "{text}");
        // The endpoint's tiers are one row each, in order, with the endpoint on the first.
        let lines: Vec<&str> = text.lines().collect();
        let i = lines
            .iter()
            .position(|l| l.contains("k8s/ns1/pod1/eth0"))
            .unwrap();
        assert!(lines[i].contains("security (pass)") && lines[i].contains("quarantine"));
        assert!(
            lines[i + 1].trim_start().starts_with("default (deny)"),
            "{}",
            lines[i + 1]
        );
        assert!(lines[i + 1].contains("allow-web, ns1/allow-dns"));
        // Columns line up with the header.
        let header = lines[i - 1];
        let col = header.find("TIER (DEFAULT)").unwrap();
        assert_eq!(lines[i].find("security").unwrap(), col);
        assert_eq!(lines[i + 1].find("default").unwrap(), col);
        assert!(text.contains("s:abc"));
        assert!(
            text.contains("NetworkPolicy ns1/bad  validation  spec.selector: bad"),
            "{text}"
        );
    }

    #[test]
    fn the_ebpf_driver_state_is_one_line() {
        let mut d = doc();
        d.dataplane.driver = "bpf".into();
        d.dataplane.bpf = Some(serde_json::json!({
            "pin_dir": "/sys/fs/bpf/margay/node1", "interfaces_attached": 3, "endpoints": 2,
            "blocks": 5, "rules": 9, "set_entries": 4, "conntrack_entries": 7,
            "conntrack_deleted": 1, "restored_endpoints": 2, "restored_interfaces": 3,
            "programs_replaced": 0
        }));
        let text = render(&d);
        assert!(
            text.contains(
                "eBPF:       3 interfaces with programs, 2 endpoints, 5 rule blocks (9 rules), \
                 4 IP-set entries; conntrack 7 entries (1 deleted by the last sweep); restored \
                 at start: 2 endpoints, 3 interfaces (0 programs replaced); pins in \
                 /sys/fs/bpf/margay/node1"
            ),
            "{text}"
        );
        let back: StatusDoc = serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn round_trips_as_json() {
        let d = doc();
        let text = serde_json::to_string(&d).unwrap();
        let back: StatusDoc = serde_json::from_str(&text).unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn requests_by_line_or_http() {
        assert_eq!(parse_request("status\n"), ("status".into(), false));
        assert_eq!(
            parse_request("GET /endpoints HTTP/1.1"),
            ("endpoints".into(), true)
        );
    }

    /// Serves one connection on a fresh socket while `client` runs on a thread; returns the
    /// server's verdict, the client's result and how long the server took.
    fn one_connection<T: Send + 'static>(
        limits: ConnLimits,
        client: impl FnOnce(std::os::unix::net::UnixStream) -> T + Send + 'static,
    ) -> (Result<(), &'static str>, T, Duration) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("felix.sock");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::UnixListener::bind(&path).unwrap();
            let c = std::os::unix::net::UnixStream::connect(&path).unwrap();
            let client = std::thread::spawn(move || client(c));
            let (stream, _) = listener.accept().await.unwrap();
            let start = std::time::Instant::now();
            let verdict = serve_connection(stream, limits, |what: String| async move {
                (200, serde_json::json!({ "asked": what }))
            })
            .await;
            let took = start.elapsed();
            (verdict, client.join().unwrap(), took)
        })
    }

    #[test]
    fn a_request_is_answered_once() {
        let (verdict, answer, _) = one_connection(ConnLimits::default(), |mut c| {
            c.write_all(b"STATUS\n").unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).unwrap();
            out
        });
        assert_eq!(verdict, Ok(()));
        assert!(answer.contains("\"asked\": \"status\""), "{answer}");
    }

    #[test]
    fn an_endless_request_line_is_cut_off_at_the_limit() {
        // Before: read_line kept every byte (one 21 MB line took Felix from 21 to 431 MB).
        let (verdict, sent, _) = one_connection(ConnLimits::default(), |mut c| {
            let chunk = vec![b'a'; 64 * 1024];
            let mut sent = 0usize;
            while sent < 64 << 20 {
                match c.write(&chunk) {
                    Ok(n) => sent += n,
                    Err(_) => break,
                }
            }
            sent
        });
        assert_eq!(verdict, Err("request too long"));
        // The server stopped reading: the client could not push 64 MiB into it.
        assert!(sent < 8 << 20, "the server took {sent} bytes");
    }

    #[test]
    fn a_request_head_dribbled_forever_meets_one_deadline() {
        let limits = ConnLimits {
            deadline: Duration::from_millis(300),
            ..ConnLimits::default()
        };
        let (verdict, (), took) = one_connection(limits, |mut c| {
            let _ = c.write_all(b"GET /status HTTP/1.1\r\n");
            // A header line every 50 ms: each read is quick, the whole request never ends.
            for i in 0..100 {
                if c.write_all(format!("X-{i}: y\r\n").as_bytes()).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        assert_eq!(verdict, Err("deadline passed"));
        assert!(took < Duration::from_secs(3), "{took:?}");
    }

    #[test]
    fn socket_replaces_stale_and_refuses_live() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/felix.sock");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let s = StatusSocket::bind(&path).unwrap();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            let e = StatusSocket::bind(&path).err().unwrap().to_string();
            assert!(e.contains("another felix"), "{e}");
            // Leave a stale socket file behind (as after kill -9).
            let stale =
                std::os::unix::net::UnixListener::bind(dir.path().join("stale.sock")).unwrap();
            drop(stale);
            drop(s);
            assert!(!path.exists());
            let stale_path = dir.path().join("stale.sock");
            assert!(stale_path.exists());
            let again = StatusSocket::bind(&stale_path).unwrap();
            drop(again);
        });
        let e = request(&path, "status", Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("socket not found") && e.contains(path.to_str().unwrap()),
            "{e}"
        );
    }
}
