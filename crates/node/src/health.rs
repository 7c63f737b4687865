//! `margay node health`: the liveness/readiness check Kubernetes runs (calico-node's
//! `-felix-live -felix-ready -bird-live -bird-ready`).
//!
//! BIRD checks follow calico-node's rules. Live: BIRD answers `show status` on its control
//! socket. Ready: with no BGP peers, ready; within the threshold (default 30 s) after node
//! start-up (the node name file's modification time), every peer must be Established and no
//! graceful restart may be in progress, so a rolling update waits for BGP; after that, one
//! Established peer is enough, so a few dead nodes do not make the whole mesh unready.
//! When a session is down, the reason BIRD gives is added, and the node's configured BGP
//! address is compared with the addresses it really has (the multi-NIC mistake).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use margay_api::net::Cidr;
use margay_bird::{BgpPeer, Client, ProtocolDetail, bgp_peers};

/// What to check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HealthChecks {
    pub felix_live: bool,
    pub felix_ready: bool,
    pub bird_live: bool,
    pub bird_ready: bool,
    pub bird6_live: bool,
    pub bird6_ready: bool,
}

/// Where BIRD is and how patient readiness is.
#[derive(Debug, Clone)]
pub struct HealthOptions {
    pub bird_socket: PathBuf,
    pub bird6_socket: PathBuf,
    /// After start-up, how long every peer must be Established (calico-node's
    /// `-threshold-time`, 30 s).
    pub threshold: Duration,
    /// The node name file, whose modification time marks start-up.
    pub nodename_file: PathBuf,
}

impl Default for HealthOptions {
    fn default() -> Self {
        HealthOptions {
            bird_socket: margay_bird::default_socket(false),
            bird6_socket: margay_bird::default_socket(true),
            threshold: DEFAULT_THRESHOLD,
            nodename_file: PathBuf::from(crate::config::DEFAULT_NODENAME_FILE),
        }
    }
}

/// calico-node's default `-threshold-time`.
pub const DEFAULT_THRESHOLD: Duration = Duration::from_secs(30);

const TIMEOUT: Duration = Duration::from_secs(2);

/// Runs the checks; Ok(summary) when all pass, Err(one-line reason) otherwise.
pub fn check(
    checks: HealthChecks,
    opts: &HealthOptions,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    if !(checks.felix_live
        || checks.felix_ready
        || checks.bird_live
        || checks.bird_ready
        || checks.bird6_live
        || checks.bird6_ready)
    {
        return Err("nothing to check: give at least one of --felix-live, --felix-ready, --bird-live, --bird-ready".into());
    }
    let mut passed = Vec::new();
    if checks.felix_live || checks.felix_ready {
        passed.push(felix(checks, get)?);
    }
    for (enabled, v6) in [(checks.bird_live, false), (checks.bird6_live, true)] {
        if enabled {
            passed.push(bird_live(v6, opts)?);
        }
    }
    for (enabled, v6) in [(checks.bird_ready, false), (checks.bird6_ready, true)] {
        if enabled {
            passed.push(bird_ready(v6, opts, get)?);
        }
    }
    Ok(passed.join(", "))
}

fn felix(checks: HealthChecks, get: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let host = get("FELIX_HEALTHHOST")
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    let port = match get("FELIX_HEALTHPORT").filter(|p| !p.is_empty()) {
        None => 9099,
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| format!("FELIX_HEALTHPORT={p:?} is not a port number"))?,
    };
    let mut passed = Vec::new();
    for (enabled, path, what) in [
        (checks.felix_live, "/liveness", "live"),
        (checks.felix_ready, "/readiness", "ready"),
    ] {
        if !enabled {
            continue;
        }
        let (status, body) = http_get(&host, port, path)?;
        match status {
            200 | 204 => passed.push(format!("felix is {what}")),
            _ => {
                let detail = body.split_whitespace().collect::<Vec<_>>().join(" ");
                let detail: String = detail.chars().take(300).collect();
                return Err(
                    format!("felix is not {what}: {path} answered {status} {detail}")
                        .trim_end()
                        .to_string(),
                );
            }
        }
    }
    Ok(passed.join(", "))
}

fn http_get(host: &str, port: u16, path: &str) -> Result<(u16, String), String> {
    let unreachable = |e: &dyn std::fmt::Display| {
        format!(
            "cannot reach felix's health endpoint at {host}:{port}{path}: {e} (is felix running with FELIX_HEALTHENABLED=true? FELIX_HEALTHHOST/FELIX_HEALTHPORT choose the address)"
        )
    };
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| unreachable(&e))?
        .collect();
    let mut last = String::from("no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, TIMEOUT) {
            Ok(mut s) => {
                s.set_read_timeout(Some(TIMEOUT))
                    .map_err(|e| unreachable(&e))?;
                s.set_write_timeout(Some(TIMEOUT))
                    .map_err(|e| unreachable(&e))?;
                write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n")
                    .map_err(|e| unreachable(&e))?;
                let mut raw = Vec::new();
                s.take(64 * 1024)
                    .read_to_end(&mut raw)
                    .map_err(|e| unreachable(&e))?;
                let text = String::from_utf8_lossy(&raw);
                let status = text
                    .lines()
                    .next()
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|c| c.parse::<u16>().ok())
                    .ok_or_else(|| unreachable(&"the answer is not HTTP"))?;
                let body = text
                    .split("\r\n\r\n")
                    .nth(1)
                    .unwrap_or_default()
                    .to_string();
                return Ok((status, body));
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(unreachable(&last))
}

fn bird_name(v6: bool) -> &'static str {
    if v6 { "BIRD6" } else { "BIRD" }
}

fn bird_live(v6: bool, opts: &HealthOptions) -> Result<String, String> {
    let sock = if v6 {
        &opts.bird6_socket
    } else {
        &opts.bird_socket
    };
    let name = bird_name(v6);
    let status = Client::connect(sock, margay_bird::DEFAULT_TIMEOUT)
        .and_then(|mut c| c.show_status())
        .map_err(|e| format!("{name} is not live: {e}"))?;
    if !status.up || !status.version.starts_with("BIRD") {
        return Err(format!(
            "{name} is not live: `show status` on {} did not say it is up and running ({:?})",
            sock.display(),
            status.version
        ));
    }
    Ok(format!(
        "{} is live ({})",
        name.to_lowercase(),
        status.version
    ))
}

/// The readiness decision (pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ready(String),
    /// Not ready: the sessions that are not Established (all of them when that is the
    /// reason), or none when graceful restart is the reason.
    NotReady {
        unestablished: Vec<BgpPeer>,
        graceful_restart: bool,
    },
}

/// calico-node's rule (see the module docs). `since_start` is the time since start-up;
/// `graceful_restart` whether BIRD reports a graceful-restart recovery in progress.
pub fn verdict(
    peers: &[BgpPeer],
    since_start: Duration,
    threshold: Duration,
    graceful_restart: bool,
) -> Verdict {
    if peers.is_empty() {
        return Verdict::Ready("no BGP peers".into());
    }
    let unestablished: Vec<BgpPeer> = peers
        .iter()
        .filter(|p| !p.is_established())
        .cloned()
        .collect();
    let established = peers.len() - unestablished.len();
    if since_start < threshold {
        if !unestablished.is_empty() {
            return Verdict::NotReady {
                unestablished,
                graceful_restart: false,
            };
        }
        if graceful_restart {
            return Verdict::NotReady {
                unestablished: Vec::new(),
                graceful_restart: true,
            };
        }
        return Verdict::Ready(format!("all {established} BGP peers established"));
    }
    if established > 0 {
        Verdict::Ready(format!(
            "{established} of {} BGP peers established",
            peers.len()
        ))
    } else {
        Verdict::NotReady {
            unestablished,
            graceful_restart: false,
        }
    }
}

/// This node's configured BGP address next to the addresses it really has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressCheck {
    pub node: String,
    /// Node spec.bgp.ipv4Address (or ipv6Address).
    pub configured: Cidr,
    /// Every address on this namespace's interfaces (interface name, address).
    pub local: Vec<(String, Cidr)>,
}

impl AddressCheck {
    /// The configured address is on no interface.
    pub fn mismatch(&self) -> bool {
        !self
            .local
            .iter()
            .any(|(_, a)| a.addr() == self.configured.addr())
    }
}

/// Why BIRD is not ready, as one line (pure): each session that is down with BIRD's own
/// reason, and — when the node's BGP address is on none of its interfaces — that mistake,
/// naming both addresses and the fix.
pub fn explain(
    v6: bool,
    unestablished: &[(BgpPeer, Option<ProtocolDetail>)],
    graceful_restart: bool,
    address: Option<&Result<AddressCheck, String>>,
) -> String {
    let mut msg = format!("{} is not ready: ", bird_name(v6));
    if graceful_restart && unestablished.is_empty() {
        msg.push_str("graceful restart in progress");
        return msg;
    }
    let sessions: Vec<String> = unestablished
        .iter()
        .map(|(p, d)| {
            let state = if p.bgp_state.is_empty() {
                p.state.clone()
            } else {
                p.bgp_state.clone()
            };
            let why = d
                .as_ref()
                .and_then(|d| d.last_error())
                .map(str::to_string)
                .or_else(|| (!p.info.is_empty()).then(|| p.info.clone()));
            match why {
                Some(why) => format!("{} ({}, {state}: {why})", p.peer_ip, p.peer_type),
                None => format!("{} ({}, {state})", p.peer_ip, p.peer_type),
            }
        })
        .collect();
    msg.push_str(&format!("BGP not established with {}", sessions.join(", ")));
    match address {
        Some(Ok(a)) if a.mismatch() => {
            let family = if v6 { "ipv6Address" } else { "ipv4Address" };
            let real: Vec<&(String, Cidr)> = a
                .local
                .iter()
                .filter(|(_, c)| c.is_ipv4() != v6 && !c.addr().is_loopback())
                .collect();
            let have = if real.is_empty() {
                "no address of that family".to_string()
            } else {
                real.iter()
                    .map(|(i, c)| format!("{} on {i}", c.addr()))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let fix = match real.first() {
                Some((i, c)) => format!("IP={} or IP_AUTODETECTION_METHOD=interface={i}", c.addr()),
                None => "IP=<an address of this node>".into(),
            };
            msg.push_str(&format!(
                "; address mismatch: this node's BGP address {} (Node {:?} spec.bgp.{family}) is on none of its interfaces, which have {have} — its peers expect it at {} but it can only connect from another address; correct the Node's address ({fix}, then margay node startup)",
                a.configured.addr(),
                a.node,
                a.configured.addr()
            ));
        }
        Some(Err(e)) => msg.push_str(&format!(
            " (could not compare this node's BGP address with its interfaces: {e})"
        )),
        _ => {}
    }
    msg
}

fn bird_ready(
    v6: bool,
    opts: &HealthOptions,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let name = bird_name(v6);
    let sock = if v6 {
        &opts.bird6_socket
    } else {
        &opts.bird_socket
    };
    let started = std::fs::metadata(&opts.nodename_file)
        .and_then(|m| m.modified())
        .map_err(|e| {
            format!(
                "{name} is not ready: cannot read the start-up time from the node name file {}: {e} (has margay node startup run? CALICO_NODENAME_FILE or --root name the file)",
                opts.nodename_file.display()
            )
        })?;
    let since_start = SystemTime::now()
        .duration_since(started)
        .unwrap_or_default();
    let mut client = Client::connect(sock, margay_bird::DEFAULT_TIMEOUT)
        .map_err(|e| format!("{name} is not ready: {e}"))?;
    let peers = bgp_peers(
        &client
            .show_protocols()
            .map_err(|e| format!("{name} is not ready: {e}"))?,
    );
    let all_up = peers.iter().all(BgpPeer::is_established);
    let gr = if since_start < opts.threshold && all_up && !peers.is_empty() {
        client
            .show_status()
            .map_err(|e| format!("{name} is not ready: {e}"))?
            .graceful_restart
    } else {
        false
    };
    match verdict(&peers, since_start, opts.threshold, gr) {
        Verdict::Ready(what) => Ok(format!("{} is ready ({what})", name.to_lowercase())),
        Verdict::NotReady {
            unestablished,
            graceful_restart,
        } => {
            // BIRD's reason per session (bounded: a probe must stay quick).
            let detailed: Vec<(BgpPeer, Option<ProtocolDetail>)> = unestablished
                .into_iter()
                .enumerate()
                .map(|(i, p)| {
                    let d = if i < 16 {
                        client.show_protocol_all(&p.name).ok().flatten()
                    } else {
                        None
                    };
                    (p, d)
                })
                .collect();
            let address = (!detailed.is_empty()).then(|| address_check(v6, opts, get));
            Err(explain(v6, &detailed, graceful_restart, address.as_ref()))
        }
    }
}

/// Reads this node's BGP address from its Node (bounded) and this namespace's addresses.
fn address_check(
    v6: bool,
    opts: &HealthOptions,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<AddressCheck, String> {
    use crate::autodetect::NetView;
    use margay_api::{Kind, Resource, ResourceKey};

    let node = match get("NODENAME").filter(|n| !n.trim().is_empty()) {
        Some(n) => n.trim().to_string(),
        None => std::fs::read_to_string(&opts.nodename_file)
            .map(|s| s.trim().to_string())
            .map_err(|e| format!("node name: {}: {e}", opts.nodename_file.display()))?,
    };
    let ds = margay_datastore::DatastoreConfig::from_env()
        .map_err(|e| format!("datastore configuration: {e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("async runtime: {e}"))?;
    let key = ResourceKey {
        kind: Kind::Node,
        namespace: String::new(),
        name: node.clone(),
    };
    let got = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(3), async {
            let backend = ds.connect_existing().await.map_err(|e| e.to_string())?;
            margay_datastore::Client::new(backend)
                .get(&key)
                .await
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|_| {
            format!(
                "the datastore did not answer within 3 s ({})",
                ds.describe()
            )
        })?
    })?;
    let Resource::Node(n) = got else {
        return Err(format!("{key} is not a Node"));
    };
    let bgp = n.spec.bgp.unwrap_or_default();
    let raw = if v6 {
        bgp.ipv6_address
    } else {
        bgp.ipv4_address
    };
    if raw.is_empty() {
        return Err(format!("Node {node:?} has no BGP address"));
    }
    let configured = Cidr::parse_cidr_or_ip(&raw)
        .map_err(|e| format!("Node {node:?} BGP address {raw:?}: {e}"))?;
    let interfaces = crate::system_net::SystemNet
        .interfaces()
        .map_err(|e| format!("listing interfaces: {e}"))?;
    let local = interfaces
        .into_iter()
        .filter(|i| i.name != "lo")
        .flat_map(|i| {
            let name = i.name;
            i.addrs.into_iter().map(move |a| (name.clone(), a))
        })
        .collect();
    Ok(AddressCheck {
        node,
        configured,
        local,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A one-shot HTTP server answering `status` with `body` to each of `n` requests.
    fn serve(status: &'static str, body: &'static str, n: usize) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for _ in 0..n {
                let Ok((mut s, _)) = l.accept() else { return };
                // Read the whole request before answering, or the client may see a reset.
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        port
    }

    fn env(port: u16) -> impl Fn(&str) -> Option<String> {
        move |k: &str| match k {
            "FELIX_HEALTHHOST" => Some("127.0.0.1".into()),
            "FELIX_HEALTHPORT" => Some(port.to_string()),
            _ => None,
        }
    }

    #[test]
    fn healthy_felix_passes() {
        let port = serve("204 No Content", "", 2);
        let r = check(
            HealthChecks {
                felix_live: true,
                felix_ready: true,
                ..Default::default()
            },
            &HealthOptions::default(),
            &env(port),
        );
        assert_eq!(r, Ok("felix is live, felix is ready".into()));
    }

    #[test]
    fn unhealthy_felix_fails_with_the_reason() {
        let port = serve(
            "503 Service Unavailable",
            "+-----------+\n| CalculationGraph | not ready |",
            1,
        );
        let r = check(
            HealthChecks {
                felix_ready: true,
                ..Default::default()
            },
            &HealthOptions::default(),
            &env(port),
        )
        .unwrap_err();
        assert!(
            r.starts_with("felix is not ready: /readiness answered 503"),
            "{r}"
        );
        assert!(r.contains("CalculationGraph"), "{r}");
    }

    #[test]
    fn unreachable_felix_names_the_address() {
        let port = margay_testkit::free_port().unwrap();
        let r = check(
            HealthChecks {
                felix_live: true,
                ..Default::default()
            },
            &HealthOptions::default(),
            &env(port),
        )
        .unwrap_err();
        assert!(
            r.contains(&format!("127.0.0.1:{port}/liveness")) && r.contains("FELIX_HEALTHENABLED"),
            "{r}"
        );
    }

    #[test]
    fn nothing_to_check_is_an_error() {
        assert!(
            check(HealthChecks::default(), &HealthOptions::default(), &|_| {
                None
            })
            .unwrap_err()
            .contains("nothing to check")
        );
    }

    fn peers() -> Vec<BgpPeer> {
        let r =
            margay_bird::split_replies(include_str!("../../bird/tests/replies/show_protocols.txt"))
                .unwrap()
                .pop()
                .unwrap();
        bgp_peers(&margay_bird::Protocol::parse_table(&r).unwrap())
    }

    const T: Duration = DEFAULT_THRESHOLD;

    #[test]
    fn no_peers_is_ready() {
        assert!(matches!(
            verdict(&[], Duration::ZERO, T, false),
            Verdict::Ready(_)
        ));
    }

    #[test]
    fn within_the_threshold_every_peer_must_be_established() {
        let all = peers();
        match verdict(&all, Duration::from_secs(5), T, false) {
            Verdict::NotReady { unestablished, .. } => {
                assert_eq!(unestablished.len(), 4);
                assert!(unestablished.iter().all(|p| !p.is_established()));
            }
            v => panic!("{v:?}"),
        }
        let up: Vec<BgpPeer> = all.into_iter().filter(BgpPeer::is_established).collect();
        assert_eq!(
            verdict(&up, Duration::from_secs(5), T, false),
            Verdict::Ready("all 1 BGP peers established".into())
        );
        // All up but graceful restart still recovering: not yet.
        assert_eq!(
            verdict(&up, Duration::from_secs(5), T, true),
            Verdict::NotReady {
                unestablished: vec![],
                graceful_restart: true
            }
        );
    }

    #[test]
    fn after_the_threshold_one_established_peer_is_enough() {
        let all = peers();
        assert_eq!(
            verdict(&all, Duration::from_secs(60), T, false),
            Verdict::Ready("1 of 5 BGP peers established".into())
        );
        let down: Vec<BgpPeer> = all.into_iter().filter(|p| !p.is_established()).collect();
        assert!(matches!(
            verdict(&down, Duration::from_secs(60), T, false),
            Verdict::NotReady { .. }
        ));
    }

    fn addr_check(configured: &str) -> AddressCheck {
        AddressCheck {
            node: "node3".into(),
            configured: Cidr::parse_cidr_or_ip(configured).unwrap(),
            local: vec![
                ("lo".into(), Cidr::parse("127.0.0.1/8").unwrap()),
                ("eth0".into(), Cidr::parse("172.30.0.13/24").unwrap()),
            ],
        }
    }

    #[test]
    fn the_reason_names_each_session_and_the_address_mismatch() {
        let down: Vec<(BgpPeer, Option<ProtocolDetail>)> = peers()
            .into_iter()
            .filter(|p| !p.is_established())
            .take(2)
            .map(|p| (p, None))
            .collect();
        let wrong = Ok(addr_check("172.30.0.99/24"));
        let msg = explain(false, &down, false, Some(&wrong));
        assert!(
            msg.starts_with(
                "BIRD is not ready: BGP not established with 172.31.9.77 (node specific, Active: Socket: No route to host), 10.192.0.3 (global, Connect)"
            ),
            "{msg}"
        );
        assert!(
            msg.contains("address mismatch")
                && msg.contains("172.30.0.99 (Node \"node3\" spec.bgp.ipv4Address)")
                && msg.contains("172.30.0.13 on eth0")
                && msg.contains("IP=172.30.0.13"),
            "{msg}"
        );
        // The right address: no mismatch claimed.
        let right = Ok(addr_check("172.30.0.13"));
        let msg = explain(false, &down, false, Some(&right));
        assert!(!msg.contains("mismatch"), "{msg}");
        // The check itself failing is said, not hidden.
        let failed = Err("the datastore did not answer within 3 s".to_string());
        let msg = explain(false, &down, false, Some(&failed));
        assert!(msg.contains("could not compare"), "{msg}");
    }

    #[test]
    fn bird_ready_from_a_socket_and_the_nodename_file() {
        use std::os::unix::net::UnixListener;
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("bird.ctl");
        let l = UnixListener::bind(&sock).unwrap();
        std::thread::spawn(move || {
            for _ in 0..2 {
                let Ok((mut s, _)) = l.accept() else { return };
                let _ = s.write_all(b"0001 BIRD 2.0.12 ready.\n");
                let mut buf = [0u8; 256];
                let _ = s.read(&mut buf);
                let answer = if buf.starts_with(b"show status") {
                    include_str!("../../bird/tests/replies/show_status.txt")
                } else {
                    "2002-Name Proto Table State Since Info\n1002-Mesh_10_0_0_2 BGP --- up 05:31:32.426 Established\n0000 \n"
                };
                let answer = answer.trim_start_matches("0001 BIRD 2.0.12 ready.\n");
                let _ = s.write_all(answer.as_bytes());
            }
        });
        let nodename = dir.path().join("nodename");
        std::fs::write(&nodename, "node1").unwrap();
        let opts = HealthOptions {
            bird_socket: sock,
            bird6_socket: dir.path().join("none6.ctl"),
            threshold: Duration::ZERO,
            nodename_file: nodename,
        };
        let ok = check(
            HealthChecks {
                bird_ready: true,
                bird_live: true,
                ..Default::default()
            },
            &opts,
            &|_| None,
        );
        assert_eq!(
            ok,
            Ok("bird is live (BIRD 2.0.12), bird is ready (1 of 1 BGP peers established)".into())
        );
        let e = check(
            HealthChecks {
                bird6_live: true,
                ..Default::default()
            },
            &opts,
            &|_| None,
        )
        .unwrap_err();
        assert!(
            e.starts_with("BIRD6 is not live") && e.contains("none6.ctl"),
            "{e}"
        );
    }
}
