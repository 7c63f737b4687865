//! `margay ctl node status`: this node's BGP sessions as BIRD reports them (calicoctl's
//! `node status`); `checksystem` and `diags` live in `node_system`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use margay_bird::{BgpPeer, Client, bgp_peers};

use crate::{EXIT_INVALID, EXIT_OK, EXIT_USAGE};

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Show this node's BGP sessions: peer address, peer type (node-to-node mesh, global,
    /// node specific), state, since, info — read from BIRD's control socket.
    ///
    /// Exits 1 when no margay Felix is running on this machine (as calicoctl does when
    /// calico-node is not), 0 otherwise; a BIRD that is not running is reported, not an
    /// error.
    #[command(after_help = "Examples:
  margay ctl node status
  margay ctl node status --bird-socket /var/run/margay/lab/lab/nodes/node1/bird.ctl -o json")]
    Status(StatusArgs),
    /// Check that this machine's kernel and programs have what margay needs (nftables, NAT,
    /// connection tracking, veth; VXLAN, IPv6 and BPF for the backends that use them).
    ///
    /// Exits 1 if something required is missing; a feature only some backends use is a
    /// warning.
    #[command(
        name = "checksystem",
        after_help = "Example:
  margay ctl node checksystem
  margay ctl node checksystem --kernel-config /boot/config-$(uname -r)"
    )]
    CheckSystem(crate::node_system::CheckSystemArgs),
    /// Collect what support needs into a tarball: routes, addresses, the nftables ruleset,
    /// sockets, conntrack statistics, the units' journal, Felix's status and margay's logs.
    #[command(after_help = "Example:
  margay ctl node diags --log-dir /var/log/calico")]
    Diags(crate::node_system::DiagsArgs),
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// BIRD's control socket (default /var/run/calico/bird.ctl, else /var/run/bird/bird.ctl).
    #[arg(long, value_name = "PATH", env = "MARGAY_BIRD_SOCKET")]
    pub bird_socket: Option<PathBuf>,
    /// BIRD6's control socket (default /var/run/calico/bird6.ctl).
    #[arg(long, value_name = "PATH", env = "MARGAY_BIRD6_SOCKET")]
    pub bird6_socket: Option<PathBuf>,
    /// table (calicoctl's) or json.
    #[arg(short = 'o', long, default_value = "table")]
    pub output: String,
    /// Do not require a running Felix (report BGP only).
    #[arg(long)]
    pub skip_felix_check: bool,
}

/// What one BIRD said (or why it could not be asked).
#[derive(Debug)]
pub(crate) enum Sessions {
    NotRunning,
    Unreachable(String),
    Peers(Vec<BgpPeer>),
}

pub(crate) fn query(socket: &Path) -> Sessions {
    if !socket.exists() {
        return Sessions::NotRunning;
    }
    match Client::connect(socket, margay_bird::DEFAULT_TIMEOUT).and_then(|mut c| c.show_protocols())
    {
        Ok(p) => Sessions::Peers(bgp_peers(&p)),
        Err(e) => Sessions::Unreachable(e.to_string()),
    }
}

/// calicoctl's box table.
pub(crate) fn render_peers(peers: &[BgpPeer]) -> String {
    let head = ["PEER ADDRESS", "PEER TYPE", "STATE", "SINCE", "INFO"];
    let rows: Vec<[String; 5]> = peers
        .iter()
        .map(|p| {
            [
                p.peer_ip.to_string(),
                p.peer_type.to_string(),
                p.state.clone(),
                p.since.clone(),
                p.info_column(),
            ]
        })
        .collect();
    let mut width = head.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let rule: String = width.iter().fold(String::from("+"), |mut s, w| {
        s.push_str(&"-".repeat(w + 2));
        s.push('+');
        s
    });
    let line = |cells: &[String]| {
        let mut s = String::from("|");
        for (c, w) in cells.iter().zip(width) {
            s.push_str(&format!(" {c:<w$} |"));
        }
        s
    };
    let mut out = vec![rule.clone(), line(&head.map(str::to_string)), rule.clone()];
    out.extend(rows.iter().map(|r| line(r)));
    out.push(rule);
    out.join("\n") + "\n"
}

fn felix_running() -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            return false;
        };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        let prog = args.first().copied().unwrap_or_default();
        let named = |n: &[u8]| prog.ends_with(n);
        (named(b"margay")
            && args.get(1) == Some(&&b"felix"[..])
            && args.get(2) != Some(&&b"status"[..]))
            || named(b"calico-felix")
    })
}

pub(crate) fn run(
    cmd: &NodeCommand,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<u8> {
    let a = match cmd {
        NodeCommand::Status(a) => a,
        NodeCommand::CheckSystem(a) => return crate::node_system::checksystem(a, out, err),
        NodeCommand::Diags(a) => return crate::node_system::diags(a, out, err),
    };
    if !matches!(a.output.as_str(), "table" | "json") {
        writeln!(err, "-o {:?}: use table or json", a.output)?;
        return Ok(EXIT_USAGE);
    }
    let felix = a.skip_felix_check || felix_running();
    let v4 = a
        .bird_socket
        .clone()
        .unwrap_or_else(|| margay_bird::default_socket(false));
    let v6 = a
        .bird6_socket
        .clone()
        .unwrap_or_else(|| margay_bird::default_socket(true));
    let families = [("4", query(&v4), &v4), ("6", query(&v6), &v6)];
    if a.output == "json" {
        let fams: Vec<serde_json::Value> = families
            .iter()
            .map(|(v, s, path)| {
                let (state, peers, error): (_, &[BgpPeer], _) = match s {
                    Sessions::NotRunning => ("not running", &[], None),
                    Sessions::Unreachable(e) => ("unreachable", &[], Some(e.clone())),
                    Sessions::Peers(p) => ("running", p, None),
                };
                serde_json::json!({
                    "ipVersion": v, "socket": path.display().to_string(),
                    "bird": state, "error": error, "peers": peers,
                })
            })
            .collect();
        let doc = serde_json::json!({"felixRunning": felix, "bgp": fams});
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&doc).unwrap_or_default()
        )?;
        return Ok(if felix { EXIT_OK } else { EXIT_INVALID });
    }
    if !felix {
        writeln!(
            err,
            "margay process is not running (no `margay felix` on this machine)."
        )?;
        return Ok(EXIT_INVALID);
    }
    if !a.skip_felix_check {
        writeln!(out, "margay process is running.")?;
    }
    if families
        .iter()
        .all(|(_, s, _)| matches!(s, Sessions::NotRunning))
    {
        writeln!(out, "\nThe BGP backend process (BIRD) is not running.\n")?;
        return Ok(EXIT_OK);
    }
    for (v, s, path) in &families {
        match s {
            Sessions::NotRunning => writeln!(
                out,
                "\nINFO: BIRDv{v} process is not running (no socket {}).",
                path.display()
            )?,
            Sessions::Unreachable(e) => {
                writeln!(out, "\nIPv{v} BGP status")?;
                writeln!(out, "Error querying BIRD: {e}")?;
            }
            Sessions::Peers(p) => {
                writeln!(out, "\nIPv{v} BGP status")?;
                if p.is_empty() {
                    writeln!(out, "No IPv{v} peers found.")?;
                } else {
                    write!(out, "{}", render_peers(p))?;
                }
            }
        }
    }
    writeln!(out)?;
    Ok(EXIT_OK)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn table_like_calicoctl() {
        let r =
            margay_bird::split_replies(include_str!("../../bird/tests/replies/show_protocols.txt"))
                .unwrap()
                .pop()
                .unwrap();
        let peers = bgp_peers(&margay_bird::Protocol::parse_table(&r).unwrap());
        let t = render_peers(&peers[..2]);
        assert_eq!(
            t,
            "\
+--------------+-------------------+-------+--------------+---------------------------------+
| PEER ADDRESS | PEER TYPE         | STATE | SINCE        | INFO                            |
+--------------+-------------------+-------+--------------+---------------------------------+
| 172.31.9.2   | node-to-node mesh | up    | 05:31:32.426 | Established                     |
| 172.31.9.77  | node specific     | start | 05:31:30.521 | Active Socket: No route to host |
+--------------+-------------------+-------+--------------+---------------------------------+
"
        );
    }

    #[test]
    fn missing_socket_is_not_running() {
        assert!(matches!(
            query(Path::new("/nonexistent/margay/bird.ctl")),
            Sessions::NotRunning
        ));
    }
}
