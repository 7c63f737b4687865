//! `ipam show | check | release`: what IPAM has handed out, whether it agrees with what uses
//! addresses, and freeing one address by hand (calicoctl's `ipam` commands).

use std::collections::BTreeSet;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use margay_api::net::Cidr;
use margay_api::{Kind, Resource};
use margay_datastore::{Client, KvBackend};
use margay_ipam::usage::{PoolUsage, utilization};
use margay_ipam::{Ipam, IpamError, ReleaseIp, Users};

use crate::datastore::{Access, Connector, connect_or_report};
use crate::{EXIT_INVALID, EXIT_OK, EXIT_USAGE};

#[derive(Debug, Subcommand)]
pub enum IpamCommand {
    /// Show how much of each IP pool is in use (and, with --show-blocks, of each block).
    #[command(after_help = "Examples:
  margay ctl ipam show
  margay ctl ipam show --show-blocks
  margay ctl ipam show --ip 10.65.0.7")]
    Show(ShowArgs),
    /// Look for inconsistencies: leaked addresses, addresses in use but not allocated,
    /// addresses with several users, handles without addresses, broken blocks.
    ///
    /// Leaked means allocated while no WorkloadEndpoint or node tunnel address uses it.
    /// Exits 1 if any problem was found, 0 if IPAM is consistent.
    Check(CheckArgs),
    /// Release an address that IPAM has allocated (e.g. one `ipam check` reported leaked), or
    /// every address and handle that reports written by `ipam check -o` all found leaked.
    ///
    /// With --from-report (calicoctl's IPAM-leak runbook): the reports must come from this
    /// cluster, at least one must have been written after the datastore was locked (and not
    /// changed since), and the datastore must still be locked (--force: proceed unlocked or
    /// with another version's report). Each address is released only if its block's sequence
    /// number is still the report's, each handle deleted only if its revision is: anything
    /// reused since the report is left alone. Exits 1 if any release failed.
    #[command(after_help = "Examples:
  margay ctl ipam release --ip 10.65.0.7

  # The IPAM-leak runbook.
  margay ctl datastore migrate lock
  margay ctl ipam check -o report.json
  margay ctl ipam release --from-report report.json
  margay ctl datastore migrate unlock")]
    Release(ReleaseArgs),
    /// Change the IPAM configuration (IPAMConfiguration `default`): strict affinity, blocks
    /// per host.
    #[command(after_help = "Examples:
  margay ctl ipam configure --strictaffinity=true
  margay ctl ipam configure --max-blocks-per-host=4")]
    Configure(ConfigureArgs),
    /// Replace an IP pool by NUMBER (a power of 2) equal pools covering the same addresses,
    /// so that parts of it can get their own settings.
    ///
    /// The datastore must be locked (`datastore migrate lock`) so that nothing is assigned
    /// meanwhile. The old pool is disabled, the new pools `split-<old>-<i>` are created with
    /// its settings, then it is deleted; allocated addresses, blocks and affinities stay as
    /// they are. Everything is checked before anything changes.
    #[command(after_help = "Examples:
  margay ctl datastore migrate lock
  margay ctl ipam split --cidr=172.0.0.0/8 2
  margay ctl ipam split --name=default-ipv4-ippool 4
  margay ctl datastore migrate unlock")]
    Split(SplitArgs),
}

#[derive(Debug, Args)]
pub struct SplitArgs {
    /// How many pools to make (a power of 2, at least 2).
    #[arg(value_name = "NUMBER")]
    pub number: String,
    /// The pool to split, by its exact `spec.cidr`.
    #[arg(long, value_name = "CIDR")]
    pub cidr: Option<String>,
    /// The pool to split, by name (takes precedence over --cidr).
    #[arg(long, value_name = "POOL_NAME")]
    pub name: Option<String>,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Also show each block: its CIDR, the host it is affine to, and its use.
    #[arg(long)]
    pub show_blocks: bool,
    /// Show whether this address is allocated, and to whom.
    #[arg(long, value_name = "IP", conflicts_with = "show_blocks")]
    pub ip: Option<String>,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Also list every allocation of every block.
    #[arg(long)]
    pub show_all_ips: bool,
    /// Accepted for calicoctl's runbooks; margay always lists the addresses with a problem.
    #[arg(long)]
    pub show_problem_ips: bool,
    /// Write a report (calicoctl's JSON format) for `ipam release --from-report`.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Accepted for calicoctl compatibility (margay reads no Services for the check).
    #[arg(long, value_name = "KUBECONFIG", hide = true)]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["ip", "from_report"])))]
pub struct ReleaseArgs {
    /// The address to release.
    #[arg(long, value_name = "IP")]
    pub ip: Option<String>,
    /// Release what this report (from `ipam check -o`) found leaked; repeat to release only
    /// what every report found.
    #[arg(long = "from-report", value_name = "REPORT", conflicts_with = "ip")]
    pub from_report: Vec<PathBuf>,
    /// With --from-report: release even though the datastore is not locked or the report
    /// was written by another version.
    #[arg(long, requires = "from_report")]
    pub force: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("setting").required(true).multiple(true).args(["strict_affinity", "max_blocks_per_host"])))]
pub struct ConfigureArgs {
    /// Only ever assign addresses from blocks affine to the node (no borrowing).
    #[arg(long = "strictaffinity", value_name = "true|false", value_parser = parse_go_bool)]
    pub strict_affinity: Option<bool>,
    /// The most blocks one node may claim (0: no limit beyond the default).
    #[arg(long = "max-blocks-per-host", value_name = "N")]
    pub max_blocks_per_host: Option<u32>,
}

/// Go's ParseBool spellings, as calicoctl accepts them.
fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err("invalid value. Use true or false to set strictaffinity".into()),
    }
}

/// Go's `%.5g` of an integer count, as calicoctl prints its utilization.
pub(crate) fn go_g5(n: u128) -> String {
    if n < 100_000 {
        return n.to_string();
    }
    #[allow(clippy::cast_precision_loss)]
    let s = format!("{:.4e}", n as f64);
    // Rust: `1.0486e6`; Go: `1.0486e+06` (trailing mantissa zeros dropped).
    let (mantissa, exp) = s.split_once('e').unwrap_or((s.as_str(), "0"));
    let mantissa = if mantissa.contains('.') {
        mantissa.trim_end_matches('0').trim_end_matches('.')
    } else {
        mantissa
    };
    let exp: i32 = exp.parse().unwrap_or(0);
    format!("{mantissa}e+{exp:02}")
}

fn pct(n: u128, of: u128) -> String {
    #[allow(clippy::cast_precision_loss)]
    let p = if of == 0 {
        0.0
    } else {
        100.0 * n as f64 / of as f64
    };
    format!("{} ({p:.0}%)", go_g5(n))
}

/// A table with go-pretty's default box style (calicoctl's).
fn boxed(headers: &[&str], rows: &[Vec<String>], right: &[bool]) -> String {
    let widths: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .chain(std::iter::once(h.len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let rule: String = widths
        .iter()
        .map(|w| format!("+{}", "-".repeat(w + 2)))
        .collect::<String>()
        + "+\n";
    let line = |cells: Vec<&str>, align: bool| -> String {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let w = widths[i];
            if align && right.get(i).copied().unwrap_or(false) {
                s.push_str(&format!("| {c:>w$} "));
            } else {
                s.push_str(&format!("| {c:<w$} "));
            }
        }
        s + "|\n"
    };
    let mut out = rule.clone();
    out.push_str(&line(headers.to_vec(), false));
    out.push_str(&rule);
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect(), true));
    }
    out.push_str(&rule);
    out
}

/// The utilization table.
pub(crate) fn render_usage(usage: &[PoolUsage], show_blocks: bool) -> String {
    let mut headers = vec![
        "GROUPING",
        "CIDR",
        "IPS TOTAL",
        "IPS IN USE",
        "IPS RESERVED",
        "IPS FREE",
    ];
    let mut right = vec![false, false, true, true, true, true];
    if show_blocks {
        headers.push("AFFINITY");
        right.push(false);
    }
    let mut rows = Vec::new();
    for p in usage {
        let mut row = vec![
            "IP Pool".to_string(),
            p.cidr.to_string(),
            go_g5(p.capacity),
            pct(p.in_use, p.capacity),
            pct(p.reserved, p.capacity),
            pct(p.free(), p.capacity),
        ];
        if show_blocks {
            row.push(String::new());
        }
        rows.push(row);
        if show_blocks {
            for b in &p.blocks {
                rows.push(vec![
                    "Block".to_string(),
                    b.cidr.to_string(),
                    go_g5(b.capacity),
                    pct(b.in_use, b.capacity),
                    pct(b.reserved, b.capacity),
                    pct(b.free(), b.capacity),
                    b.affinity.clone().unwrap_or_else(|| "<none>".to_string()),
                ]);
            }
        }
    }
    boxed(&headers, &rows, &right)
}

fn ipam_failure(err: &mut dyn Write, e: &IpamError) -> std::io::Result<u8> {
    writeln!(err, "error: {e}")?;
    Ok(EXIT_INVALID)
}

pub(crate) async fn run<C: Connector>(
    cmd: &IpamCommand,
    config: Option<&Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
) -> std::io::Result<u8>
where
    C::Backend: Clone,
{
    // Arguments first: a typo needs no datastore.
    let ip = match cmd {
        IpamCommand::Show(ShowArgs { ip: Some(ip), .. })
        | IpamCommand::Release(ReleaseArgs { ip: Some(ip), .. }) => {
            match margay_api::net::parse_ip(ip) {
                Ok(ip) => Some(ip),
                Err(e) => {
                    writeln!(err, "error: --ip {ip:?} is not an IP address: {e}")?;
                    return Ok(EXIT_USAGE);
                }
            }
        }
        _ => None,
    };
    let conn = match connect_or_report(connector, config, Access::Existing, err).await? {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let ipam = Ipam::new(conn.client.backend().clone());
    match cmd {
        IpamCommand::Show(a) => match ip {
            Some(ip) => show_ip(&ipam, ip, out, err).await,
            None => show(&ipam, a.show_blocks, out, err).await,
        },
        IpamCommand::Check(a) => check(&ipam, &conn.client, a, out, err).await,
        IpamCommand::Release(a) if !a.from_report.is_empty() => {
            crate::ipam_report::release_from_reports(
                &ipam,
                &conn.client,
                &a.from_report,
                a.force,
                out,
                err,
            )
            .await
        }
        IpamCommand::Release(_) => match ip {
            Some(ip) => release(&ipam, &conn.client, ip, out, err).await,
            None => Ok(EXIT_USAGE),
        },
        IpamCommand::Configure(a) => configure(&ipam, &conn.client, a, out, err).await,
        IpamCommand::Split(a) => {
            crate::ipam_split::split(
                &conn.client,
                &a.number,
                a.cidr.as_deref(),
                a.name.as_deref(),
                out,
                err,
            )
            .await
        }
    }
}

async fn show<B: KvBackend + Clone>(
    ipam: &Ipam<B>,
    show_blocks: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<u8> {
    let (pools, blocks, reservations) =
        tokio::join!(ipam.pools(), ipam.blocks(), ipam.reservations());
    let (pools, blocks, reservations) = match (pools, blocks, reservations) {
        (Ok(p), Ok(b), Ok(r)) => (p, b, r),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return ipam_failure(err, &e),
    };
    let usage = utilization(&pools, &blocks, &reservations);
    out.write_all(render_usage(&usage, show_blocks).as_bytes())?;
    // Blocks outside every pool (the pool was deleted) are still IPAM's.
    let orphans: Vec<String> = blocks
        .iter()
        .filter(|b| !pools.iter().any(|p| p.cidr.contains(b.cidr.addr())))
        .map(|b| format!("{} ({} in use)", b.cidr, b.in_use()))
        .collect();
    if !orphans.is_empty() {
        writeln!(
            err,
            "note: {} block(s) belong to no IP pool: {}",
            orphans.len(),
            orphans.join(", ")
        )?;
    }
    Ok(EXIT_OK)
}

async fn show_ip<B: KvBackend + Clone>(
    ipam: &Ipam<B>,
    ip: IpAddr,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<u8> {
    let blocks = match ipam.blocks().await {
        Ok(b) => b,
        Err(e) => return ipam_failure(err, &e),
    };
    let found = blocks
        .iter()
        .flat_map(|b| b.allocated())
        .find(|a| a.ip == ip)
        .map(|a| (a.attribute.handle_id.clone(), a.attribute.attrs.clone()));
    match found {
        None => writeln!(out, "{ip} is not assigned")?,
        Some((handle, attrs)) => {
            writeln!(out, "IP {ip} is in use")?;
            writeln!(out, "Handle ID: {}", handle.as_deref().unwrap_or("<none>"))?;
            if attrs.is_empty() {
                writeln!(out, "No Active Owner attributes defined")?;
            } else {
                writeln!(out, "Active Owner Attributes:")?;
                for (k, v) in attrs {
                    writeln!(out, "  {k}: {v}")?;
                }
            }
        }
    }
    Ok(EXIT_OK)
}

/// What uses addresses: every WorkloadEndpoint's ipNetworks and every Node's tunnel and
/// WireGuard interface addresses.
async fn users<B: KvBackend>(client: &Client<B>) -> Result<(Users, usize, usize), String> {
    let mut users = Users::default();
    let (weps, nodes) = tokio::join!(
        client.list(Kind::WorkloadEndpoint, None, ""),
        client.list(Kind::Node, None, "")
    );
    let weps = weps.map_err(|e| format!("listing WorkloadEndpoints: {e}"))?;
    let nodes = nodes.map_err(|e| format!("listing Nodes: {e}"))?;
    let mut wep_ips = 0;
    for r in &weps.items {
        if let Resource::WorkloadEndpoint(w) = r {
            for net in &w.spec.ip_networks {
                if let Ok(c) = Cidr::parse_cidr_or_ip(net) {
                    users.add(
                        c.addr(),
                        format!("Workload({}/{})", w.metadata.namespace, w.metadata.name),
                    );
                    wep_ips += 1;
                }
            }
        }
    }
    let mut node_ips = 0;
    for r in &nodes.items {
        if let Resource::Node(n) = r {
            let s = &n.spec;
            let mut addrs = vec![
                (s.ipv4_vxlan_tunnel_addr.as_str(), "VXLAN tunnel"),
                (s.ipv6_vxlan_tunnel_addr.as_str(), "VXLAN tunnel"),
            ];
            if let Some(b) = &s.bgp {
                addrs.push((b.ipv4_ipip_tunnel_addr.as_str(), "IPIP tunnel"));
            }
            if let Some(w) = &s.wireguard {
                addrs.push((w.interface_ipv4_address.as_str(), "WireGuard"));
                addrs.push((w.interface_ipv6_address.as_str(), "WireGuard"));
            }
            for (a, what) in addrs {
                if let Ok(c) = Cidr::parse_cidr_or_ip(a) {
                    users.add(c.addr(), format!("Node({}) {what}", n.metadata.name));
                    node_ips += 1;
                }
            }
        }
    }
    Ok((users, wep_ips, node_ips))
}

async fn check<B: KvBackend + Clone>(
    ipam: &Ipam<B>,
    client: &Client<B>,
    a: &CheckArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<u8> {
    writeln!(out, "Checking IPAM for inconsistencies...\n")?;
    writeln!(out, "Loading all IPAM blocks...")?;
    let blocks = match ipam.blocks().await {
        Ok(b) => b,
        Err(e) => return ipam_failure(err, &e),
    };
    writeln!(out, "Found {} IPAM blocks.", blocks.len())?;
    let mut allocations = 0;
    for b in &blocks {
        writeln!(
            out,
            " IPAM block {} affinity={}:",
            b.cidr,
            b.affinity.as_deref().unwrap_or("<none>")
        )?;
        for al in b.allocated() {
            allocations += 1;
            if a.show_all_ips {
                writeln!(
                    out,
                    "  {} allocated; handle {}",
                    al.ip,
                    al.attribute.handle_id.as_deref().unwrap_or("<none>")
                )?;
            }
        }
    }
    writeln!(out, "IPAM blocks record {allocations} allocations.\n")?;

    writeln!(out, "Loading all IPAM pools...")?;
    let pools = match ipam.pools().await {
        Ok(p) => p,
        Err(e) => return ipam_failure(err, &e),
    };
    for p in &pools {
        writeln!(out, "  {}", p.cidr)?;
    }
    writeln!(out, "Found {} IP pools.\n", pools.len())?;

    writeln!(out, "Loading all nodes and workload endpoints...")?;
    let (users, wep_ips, node_ips) = match users(client).await {
        Ok(u) => u,
        Err(e) => {
            writeln!(err, "error: {e}")?;
            return Ok(EXIT_INVALID);
        }
    };
    writeln!(out, "Found {node_ips} node tunnel IPs.")?;
    writeln!(out, "Found {wep_ips} workload IPs.")?;
    writeln!(
        out,
        "Workloads and nodes are using {} IPs.\n",
        users.by_ip.len()
    )?;

    writeln!(out, "Loading all handles")?;
    let handles = match ipam.handles().await {
        Ok(h) => h,
        Err(e) => return ipam_failure(err, &e),
    };
    writeln!(out, "Found {} handles.\n", handles.len())?;

    let in_pools = |ip: IpAddr| pools.iter().any(|p| p.cidr.contains(ip));
    let report = margay_ipam::check(&blocks, &handles, &users, &in_pools);

    writeln!(
        out,
        "Scanning for IPs that are allocated but not actually in use..."
    )?;
    for l in &report.leaked {
        let attrs: Vec<String> = l.attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        writeln!(
            out,
            "  {} leaked; handle {}; attrs {}",
            l.ip,
            l.handle.as_deref().unwrap_or("<none>"),
            attrs.join(",")
        )?;
    }
    writeln!(
        out,
        "Found {} IPs that are allocated in IPAM but not actually in use.\n",
        report.leaked.len()
    )?;

    writeln!(
        out,
        "Scanning for IPs that are in use by a workload or node but not allocated in IPAM..."
    )?;
    for (ip, who) in &report.duplicates {
        writeln!(out, "  {ip} has multiple owners: {}.", who.join(", "))?;
    }
    let outside: Vec<(&IpAddr, &Vec<String>)> = users
        .by_ip
        .iter()
        .filter(|(ip, _)| !in_pools(**ip))
        .collect();
    for (ip, who) in &outside {
        writeln!(
            out,
            "  {ip} in use by {} is not in any IP pool.",
            who.join(", ")
        )?;
    }
    for (ip, who) in &report.not_allocated {
        writeln!(
            out,
            "  {ip} in use by {} and in an IP pool but has no IPAM allocation.",
            who.join(", ")
        )?;
    }
    writeln!(
        out,
        "Found {} in-use IPs that are not in any IP pool.",
        outside.len()
    )?;
    writeln!(
        out,
        "Found {} in-use IPs that are in IP pools but have no corresponding IPAM allocation.",
        report.not_allocated.len()
    )?;
    writeln!(
        out,
        "Found {} IPs with more than one user.\n",
        report.duplicates.len()
    )?;

    writeln!(out, "Scanning for IPAM handles with no matching IPs...")?;
    let stale: BTreeSet<&String> = report.stale_handles.iter().collect();
    for h in &stale {
        writeln!(out, "  {h} doesn't have any active IPs.")?;
    }
    writeln!(
        out,
        "Found {} handles with no matching IPs (and {} handles with matches).\n",
        stale.len(),
        handles.len() - stale.len()
    )?;

    writeln!(out, "Validating IPAMBlock structures...")?;
    for (cidr, why) in &report.broken_blocks {
        writeln!(out, "  IPAMBlock {cidr} is invalid: {why}")?;
    }
    writeln!(
        out,
        "Found {} invalid IPAMBlocks.\n",
        report.broken_blocks.len()
    )?;

    let problems = report.leaked.len()
        + report.not_allocated.len()
        + report.duplicates.len()
        + report.stale_handles.len()
        + report.broken_blocks.len();
    writeln!(
        out,
        "Check complete; found {problems} problems: {} leaked, {} not allocated, {} duplicate, {} stale handles, {} invalid blocks.",
        report.leaked.len(),
        report.not_allocated.len(),
        report.duplicates.len(),
        report.stale_handles.len(),
        report.broken_blocks.len()
    )?;
    if problems > 0 && !report.leaked.is_empty() {
        writeln!(
            out,
            "Release a leaked address with `margay ctl ipam release --ip ADDR`."
        )?;
    }
    if let Some(path) = &a.output {
        let written = async {
            let ci = crate::cluster_cmd::cluster_information(client)
                .await
                .map_err(|e| format!("reading ClusterInformation: {e}"))?;
            let leaked =
                crate::ipam_report::leaked_handles(client.backend(), &report.stale_handles)
                    .await
                    .map_err(|e| format!("reading IPAM handles: {e}"))?;
            let r = crate::ipam_report::build_report(ci.as_ref(), &blocks, &users, leaked);
            crate::ipam_report::write_report(path, &r)
        };
        match written.await {
            Ok(()) => writeln!(out, "Report written to {}.", path.display())?,
            Err(e) => {
                writeln!(err, "error: {e}")?;
                return Ok(EXIT_INVALID);
            }
        }
    }
    Ok(if problems == 0 { EXIT_OK } else { EXIT_INVALID })
}

async fn configure<B: KvBackend + Clone>(
    ipam: &Ipam<B>,
    client: &Client<B>,
    a: &ConfigureArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<u8> {
    use margay_api::ResourceKey;
    let key = ResourceKey {
        kind: Kind::IPAMConfiguration,
        namespace: String::new(),
        name: "default".into(),
    };
    // The resource if it exists; else one holding the configuration in effect (Calico's v1
    // key, or the defaults), so that setting one option changes nothing else.
    let mut config = match client.get(&key).await {
        Ok(Resource::IPAMConfiguration(c)) => c,
        Ok(_) | Err(margay_datastore::DatastoreError::NotFound { .. }) => {
            let current = match ipam.config().await {
                Ok(c) => c,
                Err(e) => return ipam_failure(err, &e),
            };
            let meta = margay_api::ObjectMeta {
                name: "default".into(),
                ..Default::default()
            };
            let mut c = margay_api::IPAMConfiguration::new(meta, Default::default());
            c.spec.strict_affinity = current.strict_affinity;
            c.spec.auto_allocate_blocks = current.auto_allocate_blocks;
            if current.max_blocks_per_host > 0 {
                c.spec.max_blocks_per_host = i64::try_from(current.max_blocks_per_host).ok();
            }
            c
        }
        Err(e) => {
            writeln!(err, "error: {e}")?;
            return Ok(EXIT_INVALID);
        }
    };
    if let Some(v) = a.strict_affinity {
        config.spec.strict_affinity = v;
    }
    if let Some(n) = a.max_blocks_per_host {
        config.spec.max_blocks_per_host = Some(i64::from(n));
    }
    if let Err(e) = client.apply(Resource::IPAMConfiguration(config)).await {
        writeln!(err, "error: {e}")?;
        return Ok(EXIT_INVALID);
    }
    if let Some(v) = a.strict_affinity {
        writeln!(out, "Successfully set StrictAffinity to: {v}")?;
    }
    if let Some(n) = a.max_blocks_per_host {
        writeln!(out, "Successfully set MaxBlocksPerHost to: {n}")?;
    }
    Ok(EXIT_OK)
}

async fn release<B: KvBackend + Clone>(
    ipam: &Ipam<B>,
    client: &Client<B>,
    ip: IpAddr,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<u8> {
    // Releasing an address a workload still uses makes IPAM hand it out twice: say so.
    if let Ok((users, _, _)) = users(client).await
        && let Some(who) = users.by_ip.get(&ip)
    {
        writeln!(
            err,
            "warning: {ip} is still used by {}; it may be handed out again while in use",
            who.join(", ")
        )?;
    }
    match ipam
        .release_ips(&[ReleaseIp {
            ip,
            sequence_number: None,
        }])
        .await
    {
        Ok(freed) if freed.contains(&ip) => {
            writeln!(out, "Successfully released IP address {ip}")?;
            Ok(EXIT_OK)
        }
        Ok(_) => {
            writeln!(
                err,
                "error: IP address {ip} is not assigned (nothing to release; see `margay ctl ipam show --ip {ip}`)"
            )?;
            Ok(EXIT_INVALID)
        }
        Err(e) => ipam_failure(err, &e),
    }
}
