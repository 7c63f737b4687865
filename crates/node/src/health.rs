//! `margay node health`: the liveness/readiness check Kubernetes runs (calico-node's
//! `-felix-live -felix-ready -bird-live -bird-ready`).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// What to check.
#[derive(Debug, Clone, Copy, Default)]
pub struct HealthChecks {
    pub felix_live: bool,
    pub felix_ready: bool,
    pub bird_live: bool,
    pub bird_ready: bool,
    pub bird6_live: bool,
    pub bird6_ready: bool,
}

const TIMEOUT: Duration = Duration::from_secs(2);

/// Runs the checks; Ok(summary) when all pass, Err(one-line reason) otherwise.
pub fn check(checks: HealthChecks, get: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    if !(checks.felix_live
        || checks.felix_ready
        || checks.bird_live
        || checks.bird_ready
        || checks.bird6_live
        || checks.bird6_ready)
    {
        return Err("nothing to check: give at least one of --felix-live, --felix-ready, --bird-live, --bird-ready".into());
    }
    if checks.bird_live || checks.bird_ready || checks.bird6_live || checks.bird6_ready {
        return Err("BIRD health checks are not supported yet (margay's BGP support is not built): drop --bird-* from the probe".into());
    }
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
            &env(port),
        )
        .unwrap_err();
        assert!(
            r.contains(&format!("127.0.0.1:{port}/liveness")) && r.contains("FELIX_HEALTHENABLED"),
            "{r}"
        );
    }

    #[test]
    fn bird_checks_are_unsupported_and_nothing_is_an_error() {
        let r = check(
            HealthChecks {
                bird_ready: true,
                ..Default::default()
            },
            &|_| None,
        );
        assert!(r.unwrap_err().contains("not supported yet"));
        assert!(
            check(HealthChecks::default(), &|_| None)
                .unwrap_err()
                .contains("nothing to check")
        );
    }
}
