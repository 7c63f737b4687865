//! The lab's BGP backend (`margay lab up --backend bird`): every node runs `margay confd`
//! and BIRD (both supervised) in its namespace, nodes peer in Calico's node-to-node mesh,
//! and `--tor` adds a top-of-rack router — a namespace on the fabric running BIRD with its
//! own AS, configured by the lab (it is not margay's), peering with every node.
//!
//! The ToR's configuration is rendered here (pure); the nodes' comes from `margay confd`.

use std::path::Path;
use std::time::{Duration, Instant};

use margay_bird::{BgpPeer, Client, Protocol, bgp_peers};

use crate::net::{LabError, other};
use crate::state::{LabState, NODE_AS, NodeState, TorState};

/// How long the lab waits for BIRD to answer one question.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// BIRD protocol name of the ToR's session with a node (`node_<name>`).
pub fn tor_protocol_name(node: &str) -> String {
    format!("node_{}", node.replace('-', "_"))
}

/// The ToR's bird.cfg: eBGP with every node (it learns their blocks and installs them in
/// its own kernel table, where tests look), exporting nothing back. No graceful restart, so
/// a node that goes away has its routes withdrawn at once.
pub fn tor_config(tor: &TorState, nodes: &[NodeState]) -> String {
    let mut s = format!(
        "# The lab's top-of-rack router (written by margay lab; not a margay node).\n\
         router id {ip};\n\
         protocol device {{ scan time 2; }}\n\
         protocol kernel {{\n  scan time 2;\n  ipv4 {{ import none; export all; }};\n}}\n\
         template bgp node_template {{\n  local {ip} as {asn};\n  graceful restart off;\n  connect delay time 1;\n  connect retry time 2;\n  error wait time 1,5;\n  ipv4 {{ import all; export none; }};\n}}\n",
        ip = tor.ip,
        asn = tor.asn
    );
    for n in nodes {
        s.push_str(&format!(
            "protocol bgp {} from node_template {{\n  neighbor {} as {NODE_AS};\n}}\n",
            tor_protocol_name(&n.name),
            n.ip
        ));
    }
    s
}

/// The ToR's bird6.cfg on a dual-stack lab: the same eBGP sessions over IPv6 with every
/// node's IPv6 address, learning their IPv6 blocks. `None` without IPv6.
pub fn tor_config6(tor: &TorState, nodes: &[NodeState]) -> Option<String> {
    let ip6 = tor.ip6.as_ref()?;
    let mut s = format!(
        "# The lab's top-of-rack router, IPv6 (written by margay lab; not a margay node).\n\
         router id {ip};\n\
         protocol device {{ scan time 2; }}\n\
         protocol kernel {{\n  scan time 2;\n  ipv6 {{ import none; export all; }};\n}}\n\
         template bgp node_template {{\n  local {ip6} as {asn};\n  graceful restart off;\n  connect delay time 1;\n  connect retry time 2;\n  error wait time 1,5;\n  ipv6 {{ import all; export none; }};\n}}\n",
        ip = tor.ip,
        asn = tor.asn
    );
    for n in nodes {
        let Some(n6) = &n.ip6 else { continue };
        s.push_str(&format!(
            "protocol bgp {} from node_template {{\n  neighbor {n6} as {NODE_AS};\n}}\n",
            tor_protocol_name(&n.name),
        ));
    }
    Some(s)
}

/// The BGPPeer that makes every node peer with the ToR (and, dual-stack, its IPv6 twin).
pub fn tor_peer_yaml(tor: &TorState) -> String {
    let mut s = format!(
        "apiVersion: projectcalico.org/v3\nkind: BGPPeer\nmetadata:\n  name: lab-tor\nspec:\n  peerIP: {}\n  asNumber: {}\n",
        tor.ip, tor.asn
    );
    if let Some(ip6) = &tor.ip6 {
        s.push_str(&format!(
            "---\napiVersion: projectcalico.org/v3\nkind: BGPPeer\nmetadata:\n  name: lab-tor-v6\nspec:\n  peerIP: {ip6}\n  asNumber: {}\n",
            tor.asn
        ));
    }
    s
}

/// One node's BGP sessions as its BIRD reports them.
pub fn node_sessions(st: &LabState, node: &str) -> Result<Vec<BgpPeer>, String> {
    sessions(&st.bird_socket(node))
}

pub fn sessions(socket: &Path) -> Result<Vec<BgpPeer>, String> {
    let mut c = Client::connect(socket, ASK_TIMEOUT).map_err(|e| e.to_string())?;
    c.show_protocols()
        .map(|p| bgp_peers(&p))
        .map_err(|e| e.to_string())
}

/// The ToR's BGP protocols (its own names, not Calico's).
pub fn tor_sessions(st: &LabState) -> Result<Vec<Protocol>, String> {
    let sock = st.tor_dir().join("bird.ctl");
    let mut c = Client::connect(&sock, ASK_TIMEOUT).map_err(|e| e.to_string())?;
    c.show_protocols()
        .map(|p| p.into_iter().filter(|p| p.proto == "BGP").collect())
        .map_err(|e| e.to_string())
}

/// How many sessions each node should have: the mesh (every other node) plus the ToR.
pub fn expected_sessions(st: &LabState) -> usize {
    st.nodes.len().saturating_sub(1) + usize::from(st.tor.is_some())
}

/// Waits until every node has at least `expected_sessions` BGP sessions, all Established.
/// Returns how long it took.
pub fn wait_established(st: &LabState, limit: Duration) -> Result<Duration, LabError> {
    let started = Instant::now();
    let want = expected_sessions(st);
    // Dual-stack: the IPv6 BIRD's sessions too (the mesh, and the ToR's IPv6 twin).
    let sockets = |n: &NodeState| {
        let mut v = vec![(st.bird_socket(&n.name), want, "")];
        if st.ipv6 {
            v.push((st.bird6_socket(&n.name), want, " (IPv6)"));
        }
        v
    };
    loop {
        let mut missing = Vec::new();
        for n in &st.nodes {
            for (socket, want, fam) in sockets(n) {
                match sessions(&socket) {
                    Ok(p) if p.len() >= want && p.iter().all(BgpPeer::is_established) => {}
                    Ok(p) => missing.push(format!(
                        "{}{fam}: {}",
                        n.name,
                        p.iter()
                            .map(|p| format!("{} {}", p.peer_ip, p.info_column()))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                    Err(e) => missing.push(format!("{}{fam}: {e}", n.name)),
                }
            }
        }
        if missing.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > limit {
            return Err(other(format!(
                "BGP sessions not all established within {limit:?} (want {want} per node): {}; see nodes/*/confd.log and bird.log",
                missing.join("; ")
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `proto bird` routes in a node's (or the ToR's) main table, as `ip route` prints them.
pub fn bird_routes(netns: &str) -> Result<Vec<String>, LabError> {
    bird_routes_of(netns, false)
}

/// [`bird_routes`] of one family (`ip -6 route` with `v6`).
pub fn bird_routes_of(netns: &str, v6: bool) -> Result<Vec<String>, LabError> {
    let args: &[&str] = if v6 {
        &["-6", "route", "show", "proto", "bird"]
    } else {
        &["route", "show", "proto", "bird"]
    };
    Ok(crate::net::ip(netns, args)?
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

/// Waits until every node has a BIRD route via every other node that hosts pods (their
/// blocks, learned over BGP). Returns how long it took.
pub fn wait_routes(st: &LabState, limit: Duration) -> Result<Duration, LabError> {
    let started = Instant::now();
    let hosting: Vec<&NodeState> = st
        .nodes
        .iter()
        .filter(|n| st.pods.iter().any(|p| p.node == n.name))
        .collect();
    loop {
        let mut missing = Vec::new();
        for n in &st.nodes {
            let routes = bird_routes(&n.netns)?;
            for h in hosting.iter().filter(|h| h.name != n.name) {
                let via = format!(" via {} ", h.ip);
                if !routes.iter().any(|r| r.contains(&via)) {
                    missing.push(format!("{} has no route via {}", n.name, h.name));
                }
            }
            if st.ipv6 {
                let routes = bird_routes_of(&n.netns, true)?;
                for h in hosting.iter().filter(|h| h.name != n.name) {
                    let Some(ip6) = &h.ip6 else { continue };
                    let via = format!(" via {ip6} ");
                    if !routes.iter().any(|r| r.contains(&via)) {
                        missing.push(format!("{} has no IPv6 route via {}", n.name, h.name));
                    }
                }
            }
        }
        if missing.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > limit {
            return Err(other(format!(
                "BIRD routes missing after {limit:?}: {}",
                missing.join("; ")
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The BGP part of `lab status`.
pub fn render_status(st: &LabState) -> String {
    let mut s =
        String::from("BGP NODE  PEER ADDRESS    PEER TYPE           STATE  SINCE         INFO\n");
    // Dual-stack nodes run a second BIRD for IPv6: its sessions follow the IPv4 ones.
    let sockets: Vec<(&NodeState, std::path::PathBuf)> = st
        .nodes
        .iter()
        .map(|n| (n, st.bird_socket(&n.name)))
        .chain(
            st.nodes
                .iter()
                .filter(|_| st.ipv6)
                .map(|n| (n, st.bird6_socket(&n.name))),
        )
        .collect();
    for (n, socket) in sockets {
        match sessions(&socket) {
            Ok(peers) if peers.is_empty() => s.push_str(&format!("{:<9} (no peers)\n", n.name)),
            Ok(peers) => {
                for p in peers {
                    s.push_str(&format!(
                        "{:<9} {:<15} {:<19} {:<6} {:<13} {}\n",
                        n.name,
                        p.peer_ip.to_string(),
                        p.peer_type.to_string(),
                        p.state,
                        p.since,
                        p.info_column()
                    ));
                }
            }
            Err(e) => s.push_str(&format!("{:<9} BIRD not answering: {e}\n", n.name)),
        }
    }
    if let Some(tor) = &st.tor {
        match tor_sessions(st) {
            Ok(p) => {
                let up = p.iter().filter(|p| p.bgp_state() == "Established").count();
                s.push_str(&format!(
                    "ToR {} (AS {}): {up}/{} sessions established\n",
                    tor.ip,
                    tor.asn,
                    p.len()
                ));
            }
            Err(e) => s.push_str(&format!("ToR {}: BIRD not answering: {e}\n", tor.ip)),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::topology::default_topology;

    #[test]
    fn tor_config_peers_with_every_node() {
        let st = LabState::new(
            "t",
            Path::new("/tmp/t"),
            "local",
            "bird",
            default_topology(3),
        )
        .with_tor(65000);
        let tor = st.tor.clone().unwrap();
        let cfg = tor_config(&tor, &st.nodes);
        assert!(cfg.contains("router id 172.30.0.2;"), "{cfg}");
        assert!(cfg.contains("local 172.30.0.2 as 65000;"), "{cfg}");
        for (n, ip) in [
            ("node1", "172.30.0.11"),
            ("node2", "172.30.0.12"),
            ("node3", "172.30.0.13"),
        ] {
            assert!(
                cfg.contains(&format!(
                    "protocol bgp node_{n} from node_template {{\n  neighbor {ip} as 64512;"
                )),
                "{cfg}"
            );
        }
        assert_eq!(expected_sessions(&st), 3);
        assert!(tor_peer_yaml(&tor).contains("peerIP: 172.30.0.2\n  asNumber: 65000"));
        assert_eq!(tor_protocol_name("rack-1"), "node_rack_1");
        assert_eq!(tor_config6(&tor, &st.nodes), None, "IPv4-only lab");
    }

    #[test]
    fn dual_stack_tor_peers_over_ipv6_too() {
        let st = LabState::new(
            "t",
            Path::new("/tmp/t"),
            "local",
            "bird",
            default_topology(2),
        )
        .with_tor(65000)
        .with_ipv6();
        let tor = st.tor.clone().unwrap();
        let cfg = tor_config6(&tor, &st.nodes).unwrap();
        assert!(cfg.contains("router id 172.30.0.2;"), "{cfg}");
        assert!(cfg.contains("local fd00:172:30::2 as 65000;"), "{cfg}");
        assert!(cfg.contains("ipv6 { import all; export none; };"), "{cfg}");
        assert!(
            cfg.contains(
                "protocol bgp node_node2 from node_template {\n  neighbor fd00:172:30::12 as 64512;"
            ),
            "{cfg}"
        );
        let peers = tor_peer_yaml(&tor);
        assert!(
            peers.contains("name: lab-tor-v6\nspec:\n  peerIP: fd00:172:30::2\n  asNumber: 65000"),
            "{peers}"
        );
        // BIRD itself accepts it (when installed).
        if std::process::Command::new("bird")
            .arg("--version")
            .output()
            .is_ok()
        {
            let dir = tempfile::tempdir().unwrap();
            let f = dir.path().join("tor6.cfg");
            std::fs::write(&f, cfg).unwrap();
            let out = std::process::Command::new("bird")
                .arg("-p")
                .arg("-c")
                .arg(&f)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// BIRD itself accepts the ToR's configuration (`bird -p` only parses; nothing runs).
    #[test]
    fn bird_parses_the_tor_config() {
        if std::process::Command::new("bird")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("skipped: bird is not installed (scripts/setup installs bird2)");
            return;
        }
        let st = LabState::new(
            "t",
            Path::new("/tmp/t"),
            "local",
            "bird",
            default_topology(2),
        )
        .with_tor(65000);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tor.cfg");
        std::fs::write(&f, tor_config(st.tor.as_ref().unwrap(), &st.nodes)).unwrap();
        let out = std::process::Command::new("bird")
            .arg("-p")
            .arg("-c")
            .arg(&f)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
