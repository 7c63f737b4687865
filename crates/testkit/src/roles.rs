//! A node running margay roles, for the end-to-end suites: a work directory (and, for root
//! tests, a network namespace to run in), `margay node startup`, and long-running roles
//! (`felix`, `typha`, `confd`, …) under supervision, with bounded readiness waits.
//!
//! - [`Role`]: one long-running child with its log file (stderr; stdout beside it as
//!   `.out`), killed and reaped on drop. Every wait is bounded and fails the test with the
//!   role's log; a role that exits while waited on fails at once.
//! - [`Node`]: the work directory (plus an optional [`Netns`]) the roles of one node share.
//!   When the test fails (the node is dropped while panicking) the directory is kept and its
//!   path printed, so the logs survive for a look.
//! - [`wait_until`] and [`http_get`]: the loop and the probe every readiness wait is made of.
//! - [`run_within`], [`run_with_input`], [`spawn_with_input`] and [`output_within`]: a
//!   command run to its end (with input on its stdin), bounded, output captured (read while it
//!   runs).
//!
//! ```no_run
//! # use std::process::Command;
//! # use std::time::Duration;
//! use margay_testkit::roles::{Node, http_get};
//! let node = Node::new("felix").unwrap();
//! let port = margay_testkit::free_port().unwrap();
//! let mut c = Command::new("margay");
//! c.args(["felix", "run"]).env("FELIX_HEALTHPORT", port.to_string());
//! let mut felix = node.spawn("felix", c);
//! felix.wait_http_ok(port, "/readiness", Duration::from_secs(30));
//! ```

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::netns::Netns;

/// How many lines of a role's log a failure message shows.
const LOG_TAIL: usize = 60;
/// How often waits look again.
const POLL: Duration = Duration::from_millis(50);
/// Longest answer [`http_get`] reads.
const MAX_ANSWER: u64 = 1 << 20;

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Calls `f` until it returns `Ok`, every 50 ms, for at most `within`; then fails the test
/// with `what` and the last error.
pub fn wait_until<T>(what: &str, within: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + within;
    loop {
        let last = match f() {
            Ok(v) => return v,
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            panic!("{what}: not within {within:?}; last: {last}");
        }
        std::thread::sleep(POLL);
    }
}

/// How long the output of a finished command may take to reach EOF (a grandchild that kept
/// the pipe open must not hang the test).
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(10);

/// Reads `r` to its end on a thread; the receiver gets everything read.
fn drain<R: Read + Send + 'static>(r: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut r) = r {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            let _ = tx.send(v);
        });
    }
    rx
}

/// Waits for `child` (its stdout and stderr piped, or not) at most `within`, reading its
/// output meanwhile (so a chatty child never blocks on a full pipe). A child still running
/// then is killed and fails the test with `what` and its stderr so far.
pub fn output_within(what: &str, mut child: Child, within: Duration) -> Output {
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + within;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(e) => panic!("{what}: cannot wait for it: {e}"),
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = err.recv_timeout(Duration::from_secs(1)).unwrap_or_default();
            panic!(
                "{what} took longer than {within:?}; stderr:\n{}",
                String::from_utf8_lossy(&stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    Output {
        status,
        stdout: out.recv_timeout(DRAIN_AFTER_EXIT).unwrap_or_default(),
        stderr: err.recv_timeout(DRAIN_AFTER_EXIT).unwrap_or_default(),
    }
}

/// Runs `cmd` to its end (stdin closed, output captured), at most `within` (see
/// [`output_within`]).
pub fn run_within(mut cmd: Command, within: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let what = format!("{cmd:?}");
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    output_within(&what, child, within)
}

/// Starts `cmd` with `input` on its stdin (written from a thread, then closed) and its
/// stdout and stderr piped, for [`output_within`]: how a CNI runtime runs a plugin.
pub fn spawn_with_input(mut cmd: Command, input: &[u8]) -> Child {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        let input = input.to_vec();
        // A child that exits without reading its input is not this helper's failure.
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
    }
    child
}

/// Runs `cmd` with `input` on its stdin to its end, at most `within` (see
/// [`spawn_with_input`], [`output_within`]).
pub fn run_with_input(cmd: Command, input: &[u8], within: Duration) -> Output {
    let what = format!("{cmd:?}");
    output_within(&what, spawn_with_input(cmd, input), within)
}

/// One `GET path` on 127.0.0.1:`port` (5 s at most, 1 MiB at most): the status code and the
/// body; None when nothing answers or the answer is not HTTP.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // One write: a server that reads one segment and closes must see the whole request.
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).ok()?;
    let mut raw = String::new();
    let _ = s.take(MAX_ANSWER).read_to_string(&mut raw);
    let code = raw.split_whitespace().nth(1)?.parse().ok()?;
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// A long-running child process with its log, killed and reaped when dropped (also when a
/// test fails).
#[derive(Debug)]
pub struct Role {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Role {
    /// Starts `cmd` with stdin closed, stderr to `log` and stdout to `log` with the extension
    /// `.out`.
    pub fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Role {
        let file = |p: &Path| {
            std::fs::File::create(p)
                .unwrap_or_else(|e| panic!("cannot create the log {}: {e}", p.display()))
        };
        cmd.stdin(Stdio::null())
            .stdout(file(&log.with_extension("out")))
            .stderr(file(&log));
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Role {
            name: name.to_string(),
            child: Some(child),
            log,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The role's log (stderr) so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The process id (0 once it has been reaped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Its exit status, if it has exited (reaping it).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(s)) => {
                self.child = None;
                Some(s)
            }
            _ => None,
        }
    }

    /// Fails the test, with the log, if the role has exited.
    pub fn assert_running(&mut self) {
        if self.child.is_none() {
            panic!(
                "{} was already reaped; log:\n{}",
                self.name,
                self.log_tail()
            );
        }
        if let Some(s) = self.exited() {
            panic!("{} exited ({s}); log:\n{}", self.name, self.log_tail());
        }
    }

    fn log_tail(&self) -> String {
        tail(&self.log(), LOG_TAIL)
    }

    /// Fails the test, with the log, if the role has exited. Takes `&self` (for closures
    /// that only borrow): an exited child that is not reaped yet is a zombie in `/proc`.
    pub fn assert_alive(&self) {
        let pid = self.pid();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .map(|(_, r)| r.trim_start())
            .unwrap_or("");
        assert!(
            pid != 0 && !stat.is_empty() && !state.starts_with('Z'),
            "{} exited; log:\n{}",
            self.name,
            self.log_tail()
        );
    }

    /// SIGTERM, as a kubelet stops a container, then its exit code within `within`.
    pub fn stop(&mut self, within: Duration) -> Option<i32> {
        if let Err(e) = self.terminate() {
            panic!("cannot stop {}: {e}", self.name);
        }
        self.wait_exit(within).code()
    }

    /// Waits until `f` returns `Ok`, failing the test with the log if the role exits first or
    /// `within` passes.
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        within: Duration,
        mut f: impl FnMut() -> Result<T, String>,
    ) -> T {
        let deadline = Instant::now() + within;
        loop {
            let last = match f() {
                Ok(v) => return v,
                Err(e) => e,
            };
            if let Some(s) = self.exited() {
                panic!(
                    "{} exited ({s}) before {what}; last: {last}; log:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "{}: {what} not within {within:?}; last: {last}; log:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until the role's log contains `text`.
    pub fn wait_log(&mut self, text: &str, within: Duration) {
        let log = self.log.clone();
        self.wait_for(&format!("{text:?} in the log"), within, || {
            let now = std::fs::read_to_string(&log).unwrap_or_default();
            if now.contains(text) {
                Ok(())
            } else {
                Err("not yet".into())
            }
        });
    }

    /// Waits until `GET path` on 127.0.0.1:`port` answers 200 (a health port's `/readiness`
    /// or `/liveness`).
    pub fn wait_http_ok(&mut self, port: u16, path: &str, within: Duration) {
        self.wait_for(
            &format!("200 from :{port}{path}"),
            within,
            || match http_get(port, path) {
                Some((200, _)) => Ok(()),
                Some((code, body)) => Err(format!("{code} {body}")),
                None => Err("no answer".into()),
            },
        );
    }

    /// Sends SIGTERM (through `kill(1)`: the testkit has no libc of its own).
    pub fn terminate(&self) -> io::Result<()> {
        let pid = self.pid();
        if pid == 0 {
            return Ok(());
        }
        let s = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        if s.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("kill -TERM {pid}: {s}")))
        }
    }

    /// Waits (bounded) for the process to exit; fails the test with the log if it does not.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.exited() {
                return s;
            }
            if self.child.is_none() || Instant::now() >= deadline {
                panic!(
                    "{} did not exit within {within:?}; log:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- {} log ({}), last {LOG_TAIL} lines:\n{}",
                self.name,
                self.log.display(),
                self.log_tail()
            );
        }
    }
}

/// One node's work directory and, for root tests, the network namespace its roles run in.
#[derive(Debug)]
pub struct Node {
    // Dropped in this order: the namespace first (its processes are the roles, dropped by
    // the test before), then the directory, unless the test failed.
    netns: Option<Netns>,
    dir: Option<tempfile::TempDir>,
}

impl Node {
    /// A node with a fresh work directory, running in the test's own namespace (for roles
    /// that touch no kernel state, e.g. with `MARGAY_DATAPLANE=recording`).
    pub fn new(prefix: &str) -> io::Result<Node> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("margay-{prefix}-"))
            .tempdir()?;
        Ok(Node {
            netns: None,
            dir: Some(dir),
        })
    }

    /// A node in a network namespace of its own (`mgy-<prefix>-…`, deleted on drop). Root.
    pub fn in_netns(prefix: &str) -> io::Result<Node> {
        let mut node = Node::new(prefix)?;
        node.netns = Some(Netns::new(prefix)?);
        Ok(node)
    }

    /// The work directory (named like `tempfile::TempDir::path`, so a suite can swap one for
    /// the other).
    pub fn path(&self) -> &Path {
        self.dir
            .as_ref()
            .map_or(Path::new("/nonexistent"), |d| d.path())
    }

    /// A path inside the work directory.
    pub fn file(&self, rel: &str) -> PathBuf {
        self.path().join(rel)
    }

    pub fn netns(&self) -> Option<&Netns> {
        self.netns.as_ref()
    }

    /// `program` as it runs on this node: inside its namespace (`ip netns exec`) when it has
    /// one.
    pub fn command(&self, program: &Path) -> Command {
        match &self.netns {
            Some(ns) => ns.exec(program),
            None => Command::new(program),
        }
    }

    /// Starts a role on this node, logging to `<dir>/<name>.log`.
    pub fn spawn(&self, name: &str, cmd: Command) -> Role {
        Role::spawn(name, cmd, self.file(&format!("{name}.log")))
    }

    /// Runs `cmd` (e.g. `margay node startup`) to completion, bounded by `within`; fails the
    /// test with its output if it fails or hangs. Returns its stdout.
    pub fn run_ok(&self, name: &str, cmd: Command, within: Duration) -> String {
        let mut role = self.spawn(name, cmd);
        let status = role.wait_exit(within);
        assert!(
            status.success(),
            "{name} failed ({status}); log:\n{}",
            role.log_tail()
        );
        std::fs::read_to_string(role.log_path().with_extension("out")).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.dir.take()
        {
            let kept = dir.keep();
            eprintln!("--- the node's work directory is kept: {}", kept.display());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn a_role_is_killed_on_drop_and_its_log_kept_until_then() {
        let node = Node::new("roles").unwrap();
        let mut role = node.spawn("sleeper", sh("echo started >&2; exec sleep 30"));
        role.wait_for("the log line", Duration::from_secs(10), || {
            if role_log(&node, "sleeper").contains("started") {
                Ok(())
            } else {
                Err("no line yet".into())
            }
        });
        let pid = role.pid();
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        drop(role);
        // Reaped: no such process (or, if the pid was reused at once, not our sleeper).
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(!cmdline.contains("sleep"), "{cmdline}");
    }

    fn role_log(node: &Node, name: &str) -> String {
        std::fs::read_to_string(node.file(&format!("{name}.log"))).unwrap_or_default()
    }

    #[test]
    fn run_ok_returns_stdout_and_exit_is_seen() {
        let node = Node::new("roles").unwrap();
        let out = node.run_ok("echo", sh("echo hello"), Duration::from_secs(10));
        assert_eq!(out.trim(), "hello");
        let mut r = node.spawn("quick", sh("exit 3"));
        assert_eq!(r.wait_exit(Duration::from_secs(10)).code(), Some(3));
    }

    #[test]
    fn a_role_that_exits_while_waited_on_fails_the_wait_with_its_log() {
        let node = Node::new("roles").unwrap();
        let mut r = node.spawn("failing", sh("echo 'bad config' >&2; exit 1"));
        let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            r.wait_for("never", Duration::from_secs(10), || {
                Err::<(), _>("no".into())
            })
        }))
        .unwrap_err();
        let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("failing exited"), "{msg}");
        assert!(msg.contains("bad config"), "{msg}");
    }

    #[test]
    fn http_get_reads_status_and_body() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            // The whole request first: closing with unread bytes would reset the connection
            // and lose the answer.
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "the request ended early");
                req.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\nno")
                .unwrap();
        });
        assert_eq!(http_get(port, "/readiness"), Some((503, "no".to_string())));
        server.join().unwrap();
        assert_eq!(http_get(free_port_closed(), "/"), None);
    }

    fn free_port_closed() -> u16 {
        crate::free_port().unwrap()
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
    }
}
