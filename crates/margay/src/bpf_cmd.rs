//! `margay bpf` (like `calico-node -bpf`): what the eBPF dataplane has pinned on this node,
//! read from the maps and link pins only (Felix need not run). The reading is
//! `margay_bpf::inspect`; this module is the command line and the printing.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use margay_bpf::inspect::{Pinned, StepView};
use margay_bpf::layout::*;
use serde_json::{Value, json};

/// Inspect the eBPF dataplane's pinned programs and maps (like calico-node -bpf).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Felix (BPFEnabled=true) pins its maps and TCX links under \
    /sys/fs/bpf/margay/<node>. These commands read them and change nothing; run them as root \
    in Felix's mount namespace (a bpffs mounted elsewhere is another instance).\n\n\
    Examples:\n  margay bpf programs\n  margay bpf conntrack --proto tcp --dst 10.65.0.1\n  \
    margay bpf policy cali12345678 -o json\n  margay bpf --pin-dir /mnt/bpf/margay/node1 ipsets"
)]
pub struct BpfArgs {
    /// The pin directory to read (default: /sys/fs/bpf/margay/<node>).
    #[arg(long, global = true, value_name = "DIR", conflicts_with = "node")]
    pin_dir: Option<PathBuf>,
    /// The node whose pin directory to read (default: NODENAME, else this host's name).
    #[arg(long, global = true, value_name = "NAME")]
    node: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "table")]
    output: Output,
    #[command(subcommand)]
    command: BpfCommand,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Debug, clap::Subcommand)]
enum BpfCommand {
    /// Interfaces with the policy programs attached (one TCX link per hook), and which have
    /// an endpoint entry (without one, the program drops everything: fail closed).
    Programs,
    /// Conntrack entries: the flow as its first packet was judged, its TCP state and idle time.
    Conntrack {
        /// Only flows from this address.
        #[arg(long, value_name = "IP")]
        src: Option<Ipv4Addr>,
        /// Only flows to this address.
        #[arg(long, value_name = "IP")]
        dst: Option<Ipv4Addr>,
        /// Only this protocol: tcp, udp, icmp, sctp or a number.
        #[arg(long, value_name = "PROTO", value_parser = parse_proto)]
        proto: Option<u8>,
    },
    /// IP-set entries (selectors, named ports, rule networks) by numeric set id.
    Ipsets,
    /// An interface's policy: per hook, its steps (rule blocks and tier-end denies) and each
    /// block's rules, as the program evaluates them.
    Policy {
        /// The workload's host-side interface (in this network namespace).
        iface: String,
    },
    /// Detach the programs and remove the pinned maps (switching the eBPF dataplane off;
    /// Felix does it itself when it starts with BPFEnabled=false). Stop Felix first.
    Cleanup,
    /// Per-rule counters: packets and bytes of the new flows each rule decided (allowed or
    /// denied), for every rule of every stored block. Established flows pass by conntrack
    /// and are not counted again.
    Counters,
}

fn parse_proto(s: &str) -> Result<u8, String> {
    match s.to_ascii_lowercase().as_str() {
        "tcp" => Ok(6),
        "udp" => Ok(17),
        "icmp" => Ok(1),
        "sctp" => Ok(132),
        n => n
            .parse()
            .map_err(|_| format!("unknown protocol {s:?}: use tcp, udp, icmp, sctp or 0-255")),
    }
}

fn proto_name(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        1 => "icmp".into(),
        132 => "sctp".into(),
        n => n.to_string(),
    }
}

fn pin_dir(args: &BpfArgs) -> PathBuf {
    if let Some(d) = &args.pin_dir {
        return d.clone();
    }
    let node = args
        .node
        .clone()
        .or_else(|| std::env::var("NODENAME").ok().filter(|n| !n.is_empty()))
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_default();
    margay_bpf::loader::pin_dir_for(Path::new("/sys/fs/bpf/margay"), &node)
}

fn ct_state(v: &CtVal) -> &'static str {
    if v.proto != 6 {
        return "-";
    }
    if v.flags & CT_RST != 0 {
        "reset"
    } else if v.flags & (CT_FIN_FWD | CT_FIN_REV) == CT_FIN_FWD | CT_FIN_REV {
        "closed"
    } else if v.flags & (CT_FIN_FWD | CT_FIN_REV) != 0 {
        "closing"
    } else if v.flags & CT_REPLY_SEEN != 0 {
        "established"
    } else {
        "syn-sent"
    }
}

fn hook_name(h: usize) -> &'static str {
    if h == HOOK_FROM_WL {
        "from-workload (egress policy)"
    } else {
        "to-workload (ingress policy)"
    }
}

fn rule_text(r: &Rule) -> String {
    let mut parts = vec![match r.action {
        ACT_ALLOW => "allow".to_string(),
        ACT_DENY => "deny".to_string(),
        ACT_PASS => "pass".to_string(),
        ACT_LOG => "log".to_string(),
        a => format!("action-{a}"),
    }];
    if r.flags & F_PROTO != 0 {
        parts.push(format!("proto {}", proto_name(r.proto)));
    }
    if r.flags & F_NOT_PROTO != 0 {
        parts.push(format!("!proto {}", proto_name(r.not_proto)));
    }
    if r.flags & F_ICMP_TYPE != 0 {
        parts.push(format!("icmp type {}", r.icmp_type));
    }
    for (name, s) in [("src", &r.src), ("dst", &r.dst)] {
        let sets = |v: &Vec<u32>| {
            v.iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let ports = |v: &Vec<(u16, u16)>| {
            v.iter()
                .map(|(a, b)| {
                    if a == b {
                        a.to_string()
                    } else {
                        format!("{a}-{b}")
                    }
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        if !s.sets.is_empty() {
            parts.push(format!("{name} in sets {}", sets(&s.sets)));
        }
        if !s.not_sets.is_empty() {
            parts.push(format!("{name} not in sets {}", sets(&s.not_sets)));
        }
        if !s.ports.is_empty() {
            parts.push(format!("{name} ports {}", ports(&s.ports)));
        }
        if !s.not_ports.is_empty() {
            parts.push(format!("{name} not ports {}", ports(&s.not_ports)));
        }
        if !s.named.is_empty() {
            parts.push(format!("{name} named-port sets {}", sets(&s.named)));
        }
        if !s.not_named.is_empty() {
            parts.push(format!("{name} not named-port sets {}", sets(&s.not_named)));
        }
    }
    parts.join(" ")
}

fn step_json(v: &StepView) -> Value {
    if v.step.kind == STEP_DENY {
        return json!({"kind": "deny"});
    }
    json!({
        "kind": if v.step.kind == STEP_BLOCK { "block" } else { "missing" },
        "block": v.step.block,
        "pass_to": v.step.pass_to,
        "rules": v.rules.iter().map(rule_text).collect::<Vec<_>>(),
        "present": v.block.is_some(),
    })
}

/// Runs `margay bpf`; returns the exit code.
pub fn run(args: BpfArgs, out: &mut impl Write, err: &mut impl Write) -> u8 {
    match run_inner(&args, out) {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(err, "margay bpf: {e}");
            1
        }
    }
}

fn run_inner(args: &BpfArgs, out: &mut impl Write) -> Result<u8, String> {
    let dir = pin_dir(args);
    if let BpfCommand::Cleanup = args.command {
        if !dir.is_dir() {
            return Err(
                margay_bpf::inspect::InspectError::NoPinDir(dir.display().to_string()).to_string(),
            );
        }
        let n = margay_bpf::inspect::remove_pins(&dir)
            .map_err(|e| format!("removing the pins in {}: {e}", dir.display()))?;
        writeln!(out, "removed {n} pins from {}", dir.display()).map_err(|e| e.to_string())?;
        return Ok(0);
    }
    let p = Pinned::open(&dir).map_err(|e| e.to_string())?;
    let json = args.output == Output::Json;
    let w = |out: &mut dyn Write, s: String| writeln!(out, "{s}").map_err(|e| e.to_string());
    match &args.command {
        BpfCommand::Programs => {
            let eps = p.endpoints();
            let names: std::collections::BTreeMap<String, u32> = nix_ifaces();
            let links = p.programs();
            if json {
                let v: Vec<Value> = links
                    .iter()
                    .map(|l| {
                        let idx = names.get(&l.iface).copied();
                        json!({"iface": l.iface, "hook": l.hook, "link_id": l.link_id,
                               "program_id": l.program_id, "ifindex": idx,
                               "endpoint": idx.is_some_and(|i| eps.contains_key(&i))})
                    })
                    .collect();
                w(out, Value::Array(v).to_string())?;
            } else {
                w(
                    out,
                    format!(
                        "{:<16} {:<8} {:>8} {:>8} ENDPOINT",
                        "INTERFACE", "HOOK", "LINK", "PROGRAM"
                    ),
                )?;
                for l in &links {
                    let idx = names.get(&l.iface).copied();
                    let ep = match idx {
                        None => "interface not in this namespace",
                        Some(i) if eps.contains_key(&i) => "yes",
                        Some(_) => "no (drops everything)",
                    };
                    let id = |v: Option<u32>| v.map_or("?".to_string(), |v| v.to_string());
                    w(
                        out,
                        format!(
                            "{:<16} {:<8} {:>8} {:>8} {ep}",
                            l.iface,
                            l.hook,
                            id(l.link_id),
                            id(l.program_id)
                        ),
                    )?;
                }
                let (blocks, rules) = p.counts();
                w(
                    out,
                    format!(
                        "{} links, {} endpoint entries, {blocks} rule blocks, {rules} rules ({})",
                        links.len(),
                        eps.len(),
                        p.dir().display()
                    ),
                )?;
            }
        }
        BpfCommand::Conntrack { src, dst, proto } => {
            let now = margay_bpf::loader::monotonic_ns();
            let mut rows = p.conntrack();
            rows.retain(|(k, _)| {
                src.is_none_or(|s| k.src == s)
                    && dst.is_none_or(|d| k.dst == d)
                    && proto.is_none_or(|p| k.proto == p)
            });
            rows.sort_by_key(|(k, _)| (k.src, k.dst, k.sport, k.dport, k.proto));
            if json {
                let v: Vec<Value> = rows
                    .iter()
                    .map(|(k, v)| {
                        json!({"ifindex": k.ifindex, "src": k.src.to_string(), "sport": k.sport,
                               "dst": k.dst.to_string(), "dport": k.dport,
                               "proto": proto_name(k.proto),
                               "hook": if k.hook == 0 { "from_wl" } else { "to_wl" },
                               "state": ct_state(v), "flags": v.flags,
                               "idle_s": now.saturating_sub(v.last_seen_ns) / 1_000_000_000,
                               "expired": v.expired(now)})
                    })
                    .collect();
                w(out, Value::Array(v).to_string())?;
            } else {
                for (k, v) in &rows {
                    w(
                        out,
                        format!(
                            "{} {}:{} -> {}:{} ifindex {} {} {} idle {}s{}",
                            proto_name(k.proto),
                            k.src,
                            k.sport,
                            k.dst,
                            k.dport,
                            k.ifindex,
                            if k.hook == 0 { "from_wl" } else { "to_wl" },
                            ct_state(v),
                            now.saturating_sub(v.last_seen_ns) / 1_000_000_000,
                            if v.expired(now) { " (expired)" } else { "" }
                        ),
                    )?;
                }
                w(out, format!("{} entries", rows.len()))?;
            }
        }
        BpfCommand::Ipsets => {
            let sets = p.ipsets();
            let member = |e: &IpSetEntry| match e.prefix {
                Some(p) => format!("{}/{p}", e.addr),
                None => format!("{},{}:{}", e.addr, proto_name(e.proto), e.port),
            };
            if json {
                let v: serde_json::Map<String, Value> = sets
                    .iter()
                    .map(|(id, es)| {
                        (
                            id.to_string(),
                            Value::Array(es.iter().map(|e| Value::String(member(e))).collect()),
                        )
                    })
                    .collect();
                w(out, Value::Object(v).to_string())?;
            } else {
                for (id, es) in &sets {
                    let ms: Vec<String> = es.iter().map(member).collect();
                    w(out, format!("set {id}: {}", ms.join(" ")))?;
                }
                w(out, format!("{} sets", sets.len()))?;
            }
        }
        BpfCommand::Policy { iface } => {
            let ifindex = nix_ifaces().get(iface).copied().ok_or_else(|| {
                format!("no interface {iface} in this network namespace (run in Felix's)")
            })?;
            let Some(hooks) = p.policy(ifindex) else {
                return Err(format!(
                    "{iface} (ifindex {ifindex}) has no endpoint entry: if programs are \
                     attached (see `margay bpf programs`) they drop all its traffic"
                ));
            };
            if json {
                let v = json!({
                    "iface": iface, "ifindex": ifindex,
                    "from_wl": hooks[0].iter().map(step_json).collect::<Vec<_>>(),
                    "to_wl": hooks[1].iter().map(step_json).collect::<Vec<_>>(),
                });
                w(out, v.to_string())?;
            } else {
                for (h, steps) in hooks.iter().enumerate() {
                    w(out, format!("{iface} {}:", hook_name(h)))?;
                    for (i, s) in steps.iter().enumerate() {
                        if s.step.kind == STEP_DENY {
                            w(out, format!("  step {i}: deny (end of tier)"))?;
                            continue;
                        }
                        if s.block.is_none() {
                            w(
                                out,
                                format!("  step {i}: block {} MISSING (drops)", s.step.block),
                            )?;
                            continue;
                        }
                        w(
                            out,
                            format!(
                                "  step {i}: block {} (pass continues at step {})",
                                s.step.block, s.step.pass_to
                            ),
                        )?;
                        for (j, r) in s.rules.iter().enumerate() {
                            w(out, format!("    {j}: {}", rule_text(r)))?;
                        }
                    }
                    w(out, "  end: deny".to_string())?;
                }
            }
        }
        BpfCommand::Cleanup => {}
        BpfCommand::Counters => {
            let rows = p.counters();
            if json {
                let v: Vec<Value> = rows
                    .iter()
                    .map(|c| {
                        json!({"block": c.block, "rule": c.index, "packets": c.packets,
                               "bytes": c.bytes, "match": rule_text(&c.rule)})
                    })
                    .collect();
                w(out, Value::Array(v).to_string())?;
            } else {
                w(
                    out,
                    format!(
                        "{:>6} {:>5} {:>10} {:>12}  RULE",
                        "BLOCK", "RULE", "PACKETS", "BYTES"
                    ),
                )?;
                for c in &rows {
                    w(
                        out,
                        format!(
                            "{:>6} {:>5} {:>10} {:>12}  {}",
                            c.block,
                            c.index,
                            c.packets,
                            c.bytes,
                            rule_text(&c.rule)
                        ),
                    )?;
                }
            }
        }
    }
    Ok(0)
}

/// Interfaces of this network namespace by name.
fn nix_ifaces() -> std::collections::BTreeMap<String, u32> {
    std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let idx = std::fs::read_to_string(e.path().join("ifindex")).ok()?;
                    Some((name, idx.trim().parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default()
}
