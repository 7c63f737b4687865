//! Stale UDP service flows, removed from the kernel's connection tracking as kube-proxy does.
//!
//! A UDP "connection" to a service is a conntrack entry holding its translation: while
//! packets keep coming (DNS clients reuse their source port), it keeps sending them to the
//! backend chosen first, even after that backend left the service, and an entry made while
//! the service had no endpoint keeps the packets untranslated after endpoints appear. So,
//! after the table is written: entries from a frontend to a backend that left are deleted,
//! and entries to a frontend that just got its first endpoint. TCP needs nothing: the
//! backend's reset (or its absence) ends the flow. Calico's Felix and kube-proxy use the
//! `conntrack` program for this too.

use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use margay_calc::PortProtocol;
use margay_calc::services::ServicePort;

/// One set of entries to delete: UDP to `frontend` (any local address for a NodePort) and
/// `port`, from `backend` (any when None).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct StaleUdp {
    pub frontend: Option<IpAddr>,
    pub port: u16,
    pub backend: Option<IpAddr>,
    pub ipv6: bool,
}

/// Most deletions one write runs (each is a process); the rest are logged and left to time
/// out (UDP entries live 30–120 s).
pub const MAX_PER_WRITE: usize = 256;

/// What a service port's change leaves stale (pure). `before`/`after` None: the port
/// appeared / went.
pub fn stale_udp(
    protocol: PortProtocol,
    before: Option<&ServicePort>,
    after: Option<&ServicePort>,
) -> Vec<StaleUdp> {
    if protocol != PortProtocol::Udp {
        return Vec::new();
    }
    let Some(before) = before else {
        return Vec::new();
    };
    let backends = |p: &ServicePort| {
        let mut all: Vec<IpAddr> = p
            .cluster_backends
            .iter()
            .chain(&p.local_backends)
            .map(|b| b.addr)
            .collect();
        all.sort();
        all.dedup();
        all
    };
    let old = backends(before);
    let new = after.map(backends).unwrap_or_default();
    let mut frontends: Vec<(Option<IpAddr>, u16, bool)> = before
        .frontends
        .iter()
        .map(|fe| (Some(fe.addr), fe.port, fe.addr.is_ipv6()))
        .collect();
    if let Some(np) = before.node_port {
        for ipv6 in [false, true] {
            frontends.push((None, np, ipv6));
        }
    }
    let mut out = Vec::new();
    for (frontend, port, ipv6) in frontends {
        for b in old
            .iter()
            .filter(|b| !new.contains(b) && b.is_ipv6() == ipv6)
        {
            out.push(StaleUdp {
                frontend,
                port,
                backend: Some(*b),
                ipv6,
            });
        }
        // First endpoints: entries made while packets were refused hold no translation.
        if old.is_empty() && !new.is_empty() {
            out.push(StaleUdp {
                frontend,
                port,
                backend: None,
                ipv6,
            });
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The `conntrack` arguments that delete one set of entries (pure).
pub fn delete_args(s: &StaleUdp) -> Vec<String> {
    let mut args = vec![
        "-D".to_string(),
        "-f".to_string(),
        if s.ipv6 { "ipv6" } else { "ipv4" }.to_string(),
        "-p".to_string(),
        "udp".to_string(),
    ];
    if let Some(fe) = s.frontend {
        args.extend(["--orig-dst".to_string(), fe.to_string()]);
    }
    args.extend(["--orig-port-dst".to_string(), s.port.to_string()]);
    if let Some(b) = s.backend {
        args.extend(["--reply-src".to_string(), b.to_string()]);
    }
    args
}

/// Runs the deletions (in `netns` when set). Returns how many ran and the first failure.
pub fn delete(stale: &[StaleUdp], netns: Option<&str>) -> (usize, Option<String>) {
    let mut ran = 0;
    let mut failure = None;
    for s in stale.iter().take(MAX_PER_WRITE) {
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "conntrack"]);
                c
            }
            None => Command::new("conntrack"),
        };
        cmd.args(delete_args(s));
        match crate::exec::run(&mut cmd, b"", Duration::from_secs(5), 64 * 1024) {
            Ok(done) => {
                ran += 1;
                let stderr = String::from_utf8_lossy(&done.stderr);
                // Exit status 1 with "0 flow entries" just means there were none.
                if !done.status.success() && !stderr.contains(" 0 flow entries") {
                    failure.get_or_insert_with(|| format!("conntrack {s:?}: {}", stderr.trim()));
                }
            }
            Err(e) => {
                failure.get_or_insert_with(|| {
                    format!("conntrack (is the conntrack program installed?): {e}")
                });
                break;
            }
        }
    }
    if stale.len() > MAX_PER_WRITE {
        failure.get_or_insert_with(|| {
            format!(
                "{} stale UDP flow sets left to time out (at most {MAX_PER_WRITE} per write)",
                stale.len() - MAX_PER_WRITE
            )
        });
    }
    (ran, failure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use margay_calc::services::{Backend, Frontend, FrontendKind};

    fn port(backends: &[&str]) -> ServicePort {
        ServicePort {
            frontends: vec![Frontend {
                kind: FrontendKind::ClusterIp,
                addr: "10.96.0.10".parse().unwrap(),
                port: 53,
            }],
            node_port: None,
            cluster_backends: backends
                .iter()
                .map(|a| Backend {
                    addr: a.parse().unwrap(),
                    port: 5353,
                })
                .collect(),
            local_backends: Vec::new(),
            external_local: false,
            internal_local: false,
            affinity_timeout: None,
        }
    }

    #[test]
    fn a_backend_leaving_a_udp_service_stales_its_flows_only() {
        let s = stale_udp(
            PortProtocol::Udp,
            Some(&port(&["10.65.0.1", "10.65.0.2"])),
            Some(&port(&["10.65.0.2", "10.65.0.3"])),
        );
        assert_eq!(
            s,
            vec![StaleUdp {
                frontend: Some("10.96.0.10".parse().unwrap()),
                port: 53,
                backend: Some("10.65.0.1".parse().unwrap()),
                ipv6: false
            }]
        );
        assert_eq!(
            delete_args(&s[0]).join(" "),
            "-D -f ipv4 -p udp --orig-dst 10.96.0.10 --orig-port-dst 53 --reply-src 10.65.0.1"
        );
        // TCP: nothing; a new port: nothing; a port that went: all its backends.
        assert!(stale_udp(PortProtocol::Tcp, Some(&port(&["10.65.0.1"])), None).is_empty());
        assert!(stale_udp(PortProtocol::Udp, None, Some(&port(&["10.65.0.1"]))).is_empty());
        assert_eq!(
            stale_udp(PortProtocol::Udp, Some(&port(&["10.65.0.1"])), None).len(),
            1
        );
    }

    #[test]
    fn first_endpoints_clear_the_untranslated_entries() {
        let mut before = port(&[]);
        before.node_port = Some(30053);
        let mut after = port(&["10.65.0.1"]);
        after.node_port = Some(30053);
        let s = stale_udp(PortProtocol::Udp, Some(&before), Some(&after));
        let args: Vec<String> = s.iter().map(|s| delete_args(s).join(" ")).collect();
        assert_eq!(
            args,
            vec![
                "-D -f ipv4 -p udp --orig-port-dst 30053",
                "-D -f ipv6 -p udp --orig-port-dst 30053",
                "-D -f ipv4 -p udp --orig-dst 10.96.0.10 --orig-port-dst 53",
            ]
        );
    }
}
