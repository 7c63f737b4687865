//! `margay flows`: the recent connections Felix saw and what decided each (like `hubble
//! observe`), read from Felix's status socket.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;

use crate::flows::Answer;
use crate::status::{DEFAULT_SOCKET, request};

#[derive(Debug, Args)]
#[command(
    after_help = "Felix keeps flows when FlowLogsLocalReporter is Enabled \
(FELIX_FLOWLOGSLOCALREPORTER=Enabled): the nftables rules then hand each connection's \
first packet (every packet of a denied one) to Felix with the rule that decided it.

Examples:
  margay flows                         # the last 20 flows
  margay flows --denied --follow       # denied connections as they happen
  margay flows --pod shop/web -o json  # JSON lines, for jq"
)]
pub struct FlowsArgs {
    /// Keep printing new flows as they arrive (until interrupted, or --until-seconds).
    #[arg(short, long)]
    pub follow: bool,
    /// Only denied connections.
    #[arg(long)]
    pub denied: bool,
    /// Only flows with an end in this namespace.
    #[arg(short, long, value_name = "NS")]
    pub namespace: Option<String>,
    /// Only flows to or from pods whose name starts with this (`[namespace/]name`).
    #[arg(long, value_name = "[NS/]POD")]
    pub pod: Option<String>,
    /// Only flows decided by a policy or profile whose name contains this.
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    /// How many recent flows to print first.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub last: usize,
    /// `table` (the default) or `json` (one object per line).
    #[arg(short, long, value_name = "FORMAT", default_value = "table")]
    pub output: String,
    /// With --follow: stop after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub until_seconds: Option<u64>,
    /// The running Felix's status socket.
    #[arg(long, value_name = "PATH", env = "MARGAY_FELIX_STATUS_SOCKET", default_value = DEFAULT_SOCKET)]
    pub status_socket: PathBuf,
}

fn query_string(a: &FlowsArgs, after: Option<u64>) -> String {
    let mut q = vec![format!("last={}", a.last)];
    if let Some(s) = after {
        q.push(format!("after={s}"));
    }
    if a.denied {
        q.push("denied=1".into());
    }
    for (k, v) in [
        ("namespace", &a.namespace),
        ("pod", &a.pod),
        ("policy", &a.policy),
    ] {
        if let Some(v) = v {
            // The request is one line of plain words: no separators inside a value.
            let v: String = v
                .chars()
                .filter(|c| !c.is_whitespace() && *c != '&' && *c != '=' && *c != '?')
                .take(253)
                .collect();
            q.push(format!("{k}={v}"));
        }
    }
    format!("flows?{}", q.join("&"))
}

fn time_of(ms: u64) -> String {
    let secs = ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60,
        ms % 1000
    )
}

fn print(a: &FlowsArgs, answer: &Answer, out: &mut dyn Write) -> std::io::Result<()> {
    for f in &answer.flows {
        if a.output == "json" {
            writeln!(out, "{}", serde_json::to_string(f).unwrap_or_default())?;
            continue;
        }
        let r = &f.flow;
        let end = |p: &margay_flows::Peer, ip: std::net::IpAddr, port: u16| {
            let who = p.display();
            if port == 0 || r.tuple.proto == 1 || r.tuple.proto == 58 {
                format!("{who} ({ip})")
            } else {
                format!("{who} ({ip}:{port})")
            }
        };
        // What conntrack counted of an allowed connection in the interval, and its end.
        let mut traffic = String::new();
        if r.packets_in + r.packets_out > 0 {
            traffic = format!(
                " · in {} pkt {} B, out {} pkt {} B",
                r.packets_in, r.bytes_in, r.packets_out, r.bytes_out
            );
        }
        if r.num_flows_completed > 0 {
            traffic.push_str(" · ended");
        }
        writeln!(
            out,
            "{} {} -> {} {} {} by {}{traffic}",
            time_of(r.start_ms),
            end(&r.source, r.tuple.src, r.tuple.src_port),
            end(&r.dest, r.tuple.dst, r.tuple.dst_port),
            r.proto,
            if r.denied() { "DENIED" } else { "ALLOWED" },
            r.rule.describe()
        )?;
    }
    Ok(())
}

fn ask(a: &FlowsArgs, after: Option<u64>) -> Result<Answer, String> {
    let text = request(
        &a.status_socket,
        &query_string(a, after),
        Duration::from_secs(10),
    )
    .map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("the answer is not JSON ({e}); is that socket Felix's?"))?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return Err(format!("felix answered: {e}"));
    }
    serde_json::from_value(v)
        .map_err(|e| format!("unexpected answer ({e}); is felix the same version?"))
}

/// Runs `margay flows`; exit 0, 1 (Felix refused or went away), 2 (bad arguments).
pub fn run_flows(a: FlowsArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    if a.output != "table" && a.output != "json" {
        let _ = writeln!(
            err,
            "margay flows: unknown output {:?}: use table or json",
            a.output
        );
        return 2;
    }
    let mut answer = match ask(&a, None) {
        Ok(x) => x,
        Err(e) => {
            let _ = writeln!(err, "margay flows: {e}");
            return 1;
        }
    };
    let mut reported = (
        answer.packets_shed,
        answer.overruns.saturating_add(answer.ring_drops),
    );
    if print(&a, &answer, out).is_err() {
        return 0;
    }
    if answer.packets_shed > 0 || answer.overruns.saturating_add(answer.ring_drops) > 0 {
        let _ = writeln!(
            err,
            "note: Felix shed {} logged packets (more new flows per second than it keeps) and the kernel dropped {} batches (NFLOG) or events (eBPF)",
            answer.packets_shed,
            answer.overruns.saturating_add(answer.ring_drops)
        );
    }
    if !a.follow {
        return 0;
    }
    let deadline = a
        .until_seconds
        .map(|s| Instant::now() + Duration::from_secs(s));
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return 0;
        }
        std::thread::sleep(Duration::from_millis(250));
        let after = answer.next_seq.saturating_sub(1);
        answer = match ask(&a, Some(after)) {
            Ok(x) => x,
            Err(e) => {
                let _ = writeln!(err, "margay flows: {e}");
                return 1;
            }
        };
        if print(&a, &answer, out).and_then(|()| out.flush()).is_err() {
            // The reader went away (a closed pipe).
            return 0;
        }
        if (
            answer.packets_shed,
            answer.overruns.saturating_add(answer.ring_drops),
        ) != reported
        {
            let _ = writeln!(
                err,
                "note: {} logged packets shed, {} kernel batches or events dropped so far",
                answer.packets_shed,
                answer.overruns.saturating_add(answer.ring_drops)
            );
            reported = (
                answer.packets_shed,
                answer.overruns.saturating_add(answer.ring_drops),
            );
        }
    }
}
