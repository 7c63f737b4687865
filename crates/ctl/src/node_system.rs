//! `node checksystem` and `node diags` (calicoctl's): whether this machine's kernel has what
//! margay needs, and a bundle of what support asks for first.
//!
//! checksystem looks for kernel features, not module names: a feature built into the kernel
//! has no module, so each is found as a loaded module (`/proc/modules`), a built-in one
//! (`modules.builtin`, `/sys/module`), or a `CONFIG_` symbol of the kernel's configuration
//! (`/proc/config.gz`, `/boot/config-<release>`, or `--kernel-config`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

use crate::{EXIT_INVALID, EXIT_OK, EXIT_USAGE};

#[derive(Debug, Args)]
pub struct CheckSystemArgs {
    /// The kernel's configuration file to read `CONFIG_` symbols from (default: the first of
    /// /proc/config.gz, /boot/config-<release>, /usr/src/linux/.config that exists).
    #[arg(short = 'f', long = "kernel-config", value_name = "FILE")]
    pub kernel_config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct DiagsArgs {
    /// Where margay's logs are (copied into the bundle).
    #[arg(long, value_name = "DIR", default_value = "/var/log/calico")]
    pub log_dir: PathBuf,
}

/// The oldest kernel margay is built for: nftables verdict maps, inet NAT and clsact.
const MIN_KERNEL: (u32, u32) = (5, 4);

/// A kernel feature margay uses.
struct Feature {
    what: &'static str,
    /// Module names that provide it.
    modules: &'static [&'static str],
    config: &'static str,
    /// Needed by every node (false: only by some backends, reported as a warning).
    required: bool,
}

const FEATURES: &[Feature] = &[
    Feature {
        what: "nftables",
        modules: &["nf_tables"],
        config: "CONFIG_NF_TABLES",
        required: true,
    },
    Feature {
        what: "nftables inet family",
        modules: &["nf_tables_inet"],
        config: "CONFIG_NF_TABLES_INET",
        required: true,
    },
    Feature {
        what: "nftables NAT",
        modules: &["nft_nat", "nft_chain_nat"],
        config: "CONFIG_NFT_NAT",
        required: true,
    },
    Feature {
        what: "connection tracking",
        modules: &["nf_conntrack"],
        config: "CONFIG_NF_CONNTRACK",
        required: true,
    },
    Feature {
        what: "conntrack over netlink",
        modules: &["nf_conntrack_netlink"],
        config: "CONFIG_NF_CT_NETLINK",
        required: true,
    },
    Feature {
        what: "veth pairs (workload interfaces)",
        modules: &["veth"],
        config: "CONFIG_VETH",
        required: true,
    },
    Feature {
        what: "VXLAN (VXLAN backend)",
        modules: &["vxlan"],
        config: "CONFIG_VXLAN",
        required: false,
    },
    Feature {
        what: "IPv6",
        modules: &["ipv6"],
        config: "CONFIG_IPV6",
        required: false,
    },
    Feature {
        what: "BPF (eBPF dataplane)",
        modules: &[],
        config: "CONFIG_BPF_SYSCALL",
        required: false,
    },
    Feature {
        what: "tc BPF classifier (eBPF dataplane)",
        modules: &["cls_bpf"],
        config: "CONFIG_NET_CLS_BPF",
        required: false,
    },
];

/// How long one outside command may run (diags, reading a gzip'd config).
const COMMAND_DEADLINE: Duration = Duration::from_secs(20);
/// The most output kept from one command.
const MAX_OUTPUT: u64 = 16 << 20;

/// Runs `program args`, reading at most [`MAX_OUTPUT`] of its output within
/// [`COMMAND_DEADLINE`]; Err says why it failed.
fn run_bounded(program: &str, args: &[&str]) -> Result<Vec<u8>, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let Some(stdout) = child.stdout.take() else {
        return Err(format!("{program}: no output pipe"));
    };
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.take(MAX_OUTPUT).read_to_end(&mut buf);
        buf
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() < COMMAND_DEADLINE => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let out = reader.join().unwrap_or_default();
    match status {
        Some(s) if s.success() => Ok(out),
        Some(s) => Err(format!("{program} {}: {s}", args.join(" "))),
        None => Err(format!(
            "{program} {} did not finish within {COMMAND_DEADLINE:?}",
            args.join(" ")
        )),
    }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn parse_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The kernel's configuration text, from the first source that has it.
fn kernel_config(explicit: Option<&Path>, release: &str) -> Option<String> {
    if let Some(p) = explicit {
        return std::fs::read_to_string(p).ok();
    }
    if Path::new("/proc/config.gz").exists()
        && let Ok(bytes) = run_bounded("gzip", &["-dc", "/proc/config.gz"])
    {
        return Some(String::from_utf8_lossy(&bytes).into_owned());
    }
    [
        format!("/boot/config-{release}"),
        "/usr/src/linux/.config".to_string(),
        format!("/usr/src/linux-{release}/.config"),
        format!("/lib/modules/{release}/build/.config"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
}

/// Where a feature was found, if anywhere.
fn find_feature(f: &Feature, loaded: &str, builtin: &str, config: Option<&str>) -> Option<String> {
    for m in f.modules {
        if loaded
            .lines()
            .any(|l| l.split_whitespace().next() == Some(m))
        {
            return Some(format!("module {m} loaded"));
        }
        if builtin.lines().any(|l| l.ends_with(&format!("/{m}.ko"))) {
            return Some(format!("module {m} built in"));
        }
    }
    if let Some(cfg) = config {
        let set = cfg
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{}=", f.config)));
        if let Some(v @ ("y" | "m")) = set {
            return Some(format!("{}={v}", f.config));
        }
        return None;
    }
    // No configuration to read: a module directory in sysfs still says it is there.
    f.modules
        .iter()
        .find(|m| Path::new("/sys/module").join(m).exists())
        .map(|m| format!("/sys/module/{m}"))
}

pub(crate) fn checksystem(
    a: &CheckSystemArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<u8> {
    if let Some(p) = &a.kernel_config
        && !p.is_file()
    {
        writeln!(
            err,
            "error: cannot read the kernel configuration {}",
            p.display()
        )?;
        return Ok(EXIT_USAGE);
    }
    let mut failed = false;
    let release = kernel_release();
    writeln!(out, "Checking kernel version...")?;
    let version_ok = parse_version(&release).is_some_and(|v| v >= MIN_KERNEL);
    writeln!(
        out,
        "\t\t{release:<40}\t{}",
        if version_ok { "OK" } else { "FAIL" }
    )?;
    if !version_ok {
        failed = true;
        writeln!(
            out,
            "Minimum kernel version to run margay is {}.{}. Detected kernel version: {release}",
            MIN_KERNEL.0, MIN_KERNEL.1
        )?;
    }
    writeln!(out, "Checking kernel features...")?;
    let loaded = std::fs::read_to_string("/proc/modules").unwrap_or_default();
    let builtin = std::fs::read_to_string(format!("/lib/modules/{release}/modules.builtin"))
        .unwrap_or_default();
    let config = kernel_config(a.kernel_config.as_deref(), &release);
    for f in FEATURES {
        match find_feature(f, &loaded, &builtin, config.as_deref()) {
            Some(how) => writeln!(out, "\t\t{:<40}\tOK ({how})", f.what)?,
            None if f.required => {
                failed = true;
                writeln!(out, "\t\t{:<40}\tFAIL ({} not found)", f.what, f.config)?;
            }
            None => writeln!(
                out,
                "\t\t{:<40}\tWARNING ({} not found: only needed for {})",
                f.what, f.config, f.what
            )?,
        }
    }
    writeln!(out, "Checking programs...")?;
    let nft = run_bounded("nft", &["--version"]).is_ok();
    writeln!(
        out,
        "\t\t{:<40}\t{}",
        "nft (nftables)",
        if nft { "OK" } else { "FAIL (install nftables)" }
    )?;
    failed |= !nft;
    if failed {
        writeln!(
            err,
            "system doesn't meet one or more minimum systems requirements to run margay"
        )?;
        return Ok(EXIT_INVALID);
    }
    writeln!(
        out,
        "System meets minimum system requirements to run margay!"
    )?;
    Ok(EXIT_OK)
}

/// What diags collects: (file, program, arguments, note printed first).
const DIAG_COMMANDS: &[(&str, &str, &[&str], &str)] = &[
    ("date", "date", &[], ""),
    ("hostname", "hostname", &[], ""),
    (
        "ipv4_route",
        "ip",
        &["-4", "route"],
        "Dumping routes (IPv4)",
    ),
    (
        "ipv6_route",
        "ip",
        &["-6", "route"],
        "Dumping routes (IPv6)",
    ),
    (
        "ipv4_addr",
        "ip",
        &["-4", "addr"],
        "Dumping interface info (IPv4)",
    ),
    (
        "ipv6_addr",
        "ip",
        &["-6", "addr"],
        "Dumping interface info (IPv6)",
    ),
    (
        "nft_ruleset",
        "nft",
        &["-n", "-a", "list", "ruleset"],
        "Dumping nftables",
    ),
    ("ss", "ss", &["-a", "-n"], "Dumping ss"),
    (
        "conntrack_stats",
        "conntrack",
        &["-S"],
        "Dumping conntrack statistics",
    ),
    (
        "journalctl_margay",
        "journalctl",
        &[
            "-u",
            "margay-felix",
            "-u",
            "margay-node",
            "-u",
            "margay-confd",
            "--no-pager",
            "-n",
            "5000",
        ],
        "Copying the margay units' journal",
    ),
];

pub(crate) fn diags(
    a: &DiagsArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<u8> {
    writeln!(out, "Collecting diagnostics")?;
    let tmp = match private_dir() {
        Ok(d) => d,
        Err(e) => {
            writeln!(err, "error: cannot create a temporary directory: {e}")?;
            return Ok(EXIT_INVALID);
        }
    };
    writeln!(out, "Using temp dir: {}", tmp.display())?;
    let dir = tmp.join("diagnostics");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        writeln!(err, "error: cannot create {}: {e}", dir.display())?;
        return Ok(EXIT_INVALID);
    }
    let mut commands: Vec<(String, String, Vec<String>, String)> = DIAG_COMMANDS
        .iter()
        .map(|(f, p, a, n)| {
            (
                f.to_string(),
                p.to_string(),
                a.iter().map(|s| s.to_string()).collect(),
                n.to_string(),
            )
        })
        .collect();
    // What Felix says about itself, through this very binary.
    if let Ok(me) = std::env::current_exe() {
        commands.push((
            "felix_status".into(),
            me.display().to_string(),
            vec!["felix".into(), "status".into()],
            "Asking Felix for its status".into(),
        ));
    }
    for (file, program, args, note) in &commands {
        if !note.is_empty() {
            writeln!(out, "{note}")?;
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match run_bounded(program, &args) {
            Ok(bytes) => {
                let _ = std::fs::write(dir.join(file), bytes);
            }
            Err(e) => writeln!(
                out,
                "Failed to run command: {program} {}\nError: {e}",
                args.join(" ")
            )?,
        }
    }
    writeln!(out, "Copying margay logs")?;
    if a.log_dir.is_dir() {
        let logs = dir.join("logs");
        if let Err(e) = copy_tree(&a.log_dir, &logs, 0) {
            writeln!(out, "Error copying log files: {e}")?;
        }
    } else {
        writeln!(
            out,
            "No logs found in {}; skipping log copying",
            a.log_dir.display()
        )?;
    }
    let stamp = run_bounded("date", &["+%Y%m%d_%H%M%S"])
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_else(|_| "now".into());
    let name = format!("diags-{stamp}.tar.gz");
    let tar = Command::new("tar")
        .arg("-zcf")
        .arg(tmp.join(&name))
        .arg("-C")
        .arg(&tmp)
        .arg("diagnostics")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    match tar {
        Ok(o) if o.status.success() => {
            writeln!(out, "\nDiags saved to {}", tmp.join(&name).display())?;
            writeln!(
                out,
                "If required, you can upload the diagnostics bundle to a file sharing service."
            )?;
            Ok(EXIT_OK)
        }
        Ok(o) => {
            writeln!(
                err,
                "error: tar failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )?;
            Ok(EXIT_INVALID)
        }
        Err(e) => {
            writeln!(err, "error: cannot run tar: {e}")?;
            Ok(EXIT_INVALID)
        }
    }
}

/// A new directory only root can read (the bundle holds the node's rules and logs).
fn private_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("margay-diags-{}-{nanos}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// Copies regular files of `from` into `to`, a few levels deep, following no symbolic links.
fn copy_tree(from: &Path, to: &Path, depth: usize) -> std::io::Result<()> {
    if depth > 8 {
        return Ok(());
    }
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let dest = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &dest, depth + 1)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), dest)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_are_found_by_module_or_config() {
        let nft = &FEATURES[0];
        assert!(find_feature(nft, "nf_tables 1 0 - Live\n", "", None).is_some());
        assert!(find_feature(nft, "", "kernel/net/netfilter/nf_tables.ko\n", None).is_some());
        assert!(find_feature(nft, "", "", Some("CONFIG_NF_TABLES=y\n")).is_some());
        assert!(find_feature(nft, "", "", Some("CONFIG_NF_TABLES=m\n")).is_some());
        assert!(find_feature(nft, "", "", Some("# CONFIG_NF_TABLES is not set\n")).is_none());
        // A similar name is not the module.
        assert!(find_feature(nft, "nf_tables_x 1 0\n", "", Some("")).is_none());
    }

    #[test]
    fn kernel_versions() {
        assert_eq!(parse_version("6.18.44-fc-v782"), Some((6, 18)));
        assert_eq!(parse_version("5.4.0-150-generic"), Some((5, 4)));
        assert!(parse_version("4.19.0").is_some_and(|v| v < MIN_KERNEL));
        assert_eq!(parse_version("garbage"), None);
    }
}
