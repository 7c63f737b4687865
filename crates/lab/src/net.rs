//! The lab's edges: `ip` commands, namespaces, detached processes, and the probe client and
//! server that run inside pods.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("{what}: {reason}")]
    Command { what: String, reason: String },
    #[error("{0}")]
    Other(String),
}

pub fn other(s: impl Into<String>) -> LabError {
    LabError::Other(s.into())
}

/// Runs a command to completion; stdout on success, an error naming the command otherwise.
pub fn run(cmd: &mut Command) -> Result<String, LabError> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::Command {
            what: shown.clone(),
            reason: format!("cannot run it: {e}"),
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(LabError::Command {
            what: shown,
            reason: format!(
                "{}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            ),
        })
    }
}

/// Runs a command with `input` on its stdin, collecting its output; killed (and an error)
/// when it has not finished within `limit`.
pub fn run_with_input(
    cmd: &mut Command,
    input: &[u8],
    limit: Duration,
) -> Result<std::process::Output, String> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run it: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input);
    }
    // Readers on their own threads, so a full pipe never blocks the child.
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = reader(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = reader(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {limit:?} (killed)"));
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    Ok(std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

pub fn ip(ns: &str, args: &[&str]) -> Result<String, LabError> {
    run(Command::new("ip").arg("-n").arg(ns).args(args))
}

pub fn in_netns(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    c
}

pub fn sysctl(ns: &str, key: &str, value: &str) -> Result<(), LabError> {
    run(in_netns(ns, "sysctl").args(["-q", "-w", &format!("{key}={value}")])).map(drop)
}

pub fn add_netns(name: &str) -> Result<(), LabError> {
    run(Command::new("ip").args(["netns", "add", name]))?;
    ip(name, &["link", "set", "lo", "up"]).map(drop)
}

/// Every network namespace whose name starts with `prefix`.
pub fn netns_with_prefix(prefix: &str) -> Vec<String> {
    let Ok(out) = run(Command::new("ip").args(["netns", "list"])) else {
        return Vec::new();
    };
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

/// Kills every process inside the given namespaces (identified by their network namespace
/// inode), then deletes the namespaces. Returns what could not be removed.
pub fn remove_netns(names: &[String]) -> Vec<String> {
    let inodes: Vec<u64> = names
        .iter()
        .filter_map(|n| std::fs::metadata(format!("/run/netns/{n}")).ok())
        .map(|m| m.ino())
        .collect();
    if !inodes.is_empty() {
        kill_where(|pid| {
            std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .map(|m| inodes.contains(&m.ino()))
                .unwrap_or(false)
        });
    }
    let mut failed = Vec::new();
    for n in names {
        if run(Command::new("ip").args(["netns", "delete", n])).is_err() {
            failed.push(n.clone());
        }
    }
    failed
}

fn pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// SIGKILLs every process matching `pred` (never this one), twice over to catch children
/// forked meanwhile.
pub fn kill_where(pred: impl Fn(u32) -> bool) {
    let me = std::process::id();
    for _ in 0..2 {
        let victims: Vec<String> = pids()
            .into_iter()
            .filter(|p| *p != me && pred(*p))
            .map(|p| p.to_string())
            .collect();
        if victims.is_empty() {
            return;
        }
        let _ = Command::new("kill")
            .arg("-9")
            .args(&victims)
            .stderr(Stdio::null())
            .status();
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills the process group a pid file names (written by `margay lab supervise`, which leads
/// its own group).
pub fn kill_pid_file(path: &Path) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let Ok(pid) = text.trim().parse::<u32>() else {
        return;
    };
    // Only if it is still one of ours (pids are reused): its command line names the file.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let needle = path.display().to_string();
    if String::from_utf8_lossy(&cmdline).contains(needle.as_str()) {
        let _ = Command::new("kill")
            .args(["-9", "--", &format!("-{pid}")])
            .stderr(Stdio::null())
            .status();
    }
    let _ = std::fs::remove_file(path);
}

/// Whether the process a pid file names still runs (and is still the one that wrote it).
pub fn pid_file_alive(path: &Path) -> bool {
    let Some(pid) = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
    else {
        return false;
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&cmdline).contains(path.display().to_string().as_str())
}

/// Stops the process group a pid file names as a service manager does: SIGTERM (the
/// supervisor and its child both get it, so nothing is restarted), then SIGKILL for whatever
/// is left after `grace`. Returns whether the group had to be killed.
pub fn stop_pid_file(path: &Path, grace: Duration) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    let Ok(pid) = text.trim().parse::<u32>() else {
        return false;
    };
    let ours = || pid_file_alive(path);
    let group_alive = || {
        pids().into_iter().any(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    // pgrp is the 3rd field after the parenthesised command name.
                    let rest = s.rsplit_once(')')?.1;
                    rest.split_whitespace().nth(2)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
    };
    let mut killed = false;
    if ours() {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{pid}")])
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + grace;
        while group_alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if group_alive() {
            killed = true;
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
        }
    }
    let _ = std::fs::remove_file(path);
    killed
}

/// Starts `margay lab supervise` detached (own session and process group), which runs
/// `argv` and writes its pid to `pid_file`. Waits until the pid file exists.
pub fn spawn_supervised(
    exe: &Path,
    pid_file: &Path,
    log: &Path,
    restart: bool,
    env: &[(String, String)],
    argv: &[String],
) -> Result<(), LabError> {
    let _ = std::fs::remove_file(pid_file);
    let mut c = Command::new("setsid");
    c.arg("-f")
        .arg(exe)
        .args(["lab", "supervise", "--pid-file"])
        .arg(pid_file);
    c.arg("--log").arg(log);
    if !restart {
        c.arg("--once");
    }
    c.arg("--").args(argv);
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let status = c.status().map_err(|e| LabError::Command {
        what: "setsid".into(),
        reason: format!("{e} (util-linux's setsid is needed)"),
    })?;
    if !status.success() {
        return Err(other(format!("starting {argv:?} failed: {status}")));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pid_file.exists() {
        if Instant::now() > deadline {
            return Err(other(format!(
                "{argv:?} did not start within 10 s (see {})",
                log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// `margay lab supervise`: runs a command, restarting it when it exits (as runit does:
/// at once after exit 129 — Felix asking for a restart — else after a second), logging its
/// output to a file. With `once`, runs it a single time.
pub fn supervise(pid_file: &Path, log: &Path, once: bool, argv: &[String]) -> Result<u8, LabError> {
    let Some((program, args)) = argv.split_first() else {
        return Err(other("supervise: no command given"));
    };
    std::fs::write(pid_file, format!("{}\n", std::process::id()))
        .map_err(|e| other(format!("{}: {e}", pid_file.display())))?;
    let mut delay = Duration::from_millis(0);
    loop {
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| other(format!("{}: {e}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(|e| other(format!("{}: {e}", log.display())))?;
        let status = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .status();
        let code = match status {
            Ok(s) => s.code().unwrap_or(255),
            Err(e) => {
                let _ = std::fs::OpenOptions::new()
                    .append(true)
                    .open(log)
                    .and_then(|mut f| writeln!(f, "supervise: cannot start {program}: {e}"));
                255
            }
        };
        if once {
            return Ok(u8::try_from(code).unwrap_or(1));
        }
        delay = if code == 129 {
            Duration::ZERO
        } else {
            Duration::from_secs(1)
        };
        let _ = std::fs::OpenOptions::new()
            .append(true)
            .open(log)
            .and_then(|mut f| writeln!(f, "supervise: {program} exited with {code}; restarting"));
    }
}

/// `margay lab serve`: answers TCP connections and UDP datagrams with this pod's name.
pub fn serve(
    name: &str,
    tcp: &[u16],
    udp: &[u16],
    pid_file: Option<&PathBuf>,
) -> Result<(), LabError> {
    if let Some(p) = pid_file {
        let _ = std::fs::write(p, format!("{}\n", std::process::id()));
    }
    let mut threads = Vec::new();
    for &port in tcp {
        // `::` takes both families (IPv4 arrives as ::ffff:a.b.c.d); a pod without IPv6
        // falls back to IPv4 only.
        let listener = TcpListener::bind((Ipv6Addr::UNSPECIFIED, port))
            .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))
            .map_err(|e| other(format!("tcp port {port}: {e}")))?;
        let name = name.to_string();
        threads.push(std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                // The client's address as this pod sees it (after any NAT): Services'
                // source-address tests read it.
                let reply = match conn.peer_addr() {
                    Ok(peer) => format!("{name} {}\n", peer.ip().to_canonical()),
                    Err(_) => format!("{name}\n"),
                };
                std::thread::spawn(move || {
                    let mut conn = conn;
                    let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
                    let _ = conn.write_all(reply.as_bytes());
                });
            }
        }));
    }
    for &port in udp {
        let socket = UdpSocket::bind((Ipv6Addr::UNSPECIFIED, port))
            .or_else(|_| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)))
            .map_err(|e| other(format!("udp port {port}: {e}")))?;
        let name = name.to_string();
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((_, from)) = socket.recv_from(&mut buf) {
                let reply = format!("{name} {}\n", from.ip().to_canonical());
                let _ = socket.send_to(reply.as_bytes(), from);
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// `margay lab connect`: one probe. TCP: the connection is established and the server's
/// greeting arrives; UDP: the server answers a datagram. Within `timeout`.
pub fn connect(to: IpAddr, port: u16, udp: bool, timeout: Duration) -> bool {
    connect_reply(to, port, udp, timeout).is_some()
}

/// [`connect`], returning the server's answer (`lab serve`: its pod's name and the client
/// address it saw).
pub fn connect_reply(to: IpAddr, port: u16, udp: bool, timeout: Duration) -> Option<String> {
    let addr = SocketAddr::new(to, port);
    if udp {
        let bind = if to.is_ipv4() {
            SocketAddr::from(([0u8, 0, 0, 0], 0))
        } else {
            SocketAddr::from(([0u16; 8], 0))
        };
        let sock = UdpSocket::bind(bind).ok()?;
        let _ = sock.set_read_timeout(Some(timeout));
        sock.send_to(b"probe", addr).ok()?;
        let mut buf = [0u8; 128];
        match sock.recv_from(&mut buf) {
            Ok((n, from)) if n > 0 && from == addr => Some(reply_text(&buf[..n])),
            _ => None,
        }
    } else {
        let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
        let _ = s.set_read_timeout(Some(timeout));
        let mut buf = [0u8; 128];
        match s.read(&mut buf) {
            Ok(n) if n > 0 => Some(reply_text(&buf[..n])),
            _ => None,
        }
    }
}

fn reply_text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_string()
}
