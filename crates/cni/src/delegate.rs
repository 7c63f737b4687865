//! Delegating to another IPAM plugin (`ipam.type` other than margay's own), as the CNI spec
//! describes: the plugin is found in CNI_PATH and executed with the same CNI_* variables and
//! the same network configuration on stdin.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::config::Env;
use crate::spec::{CniError, code};

/// How long a delegated IPAM plugin may run.
const DELEGATE_TIMEOUT: Duration = Duration::from_secs(60);
/// The most of a delegated plugin's stdout (and of its stderr) that is read.
const DELEGATE_MAX_OUTPUT: u64 = 16 << 20;

/// Finds `plugin` in the colon-separated CNI_PATH.
pub fn find(plugin: &str, cni_path: &str) -> Result<PathBuf, CniError> {
    if plugin.contains('/') || plugin.is_empty() {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            format!("ipam.type {plugin:?} is not a plugin name"),
        ));
    }
    cni_path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CniError::new(
                code::INVALID_CONFIG,
                format!(
                    "the IPAM plugin {plugin:?} (ipam.type) is not in CNI_PATH {cni_path:?}; install it there or use \"margay-ipam\""
                ),
            )
        })
}

/// Runs the IPAM plugin for `command`; returns its JSON answer (None when it printed nothing).
pub fn exec(
    plugin: &str,
    command: &str,
    env: &Env,
    stdin: &[u8],
) -> Result<Option<Value>, CniError> {
    let cni_path = env.get("CNI_PATH").map(String::as_str).unwrap_or("");
    let path = find(plugin, cni_path)?;
    let failed = |e: std::io::Error| {
        CniError::new(
            code::PLUGIN,
            format!("running the IPAM plugin {}", path.display()),
        )
        .with_details(e)
    };
    let mut child = Command::new(&path)
        .env_clear()
        .envs(env)
        .env("CNI_COMMAND", command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(failed)?;
    // stdin is written while stdout and stderr are read, each on its own thread, and one
    // deadline covers the whole call: a plugin that answers before reading all its input
    // cannot deadlock us on a full pipe, nor a stuck one hold the runtime past the deadline.
    let deadline = Instant::now() + DELEGATE_TIMEOUT;
    if let Some(mut i) = child.stdin.take() {
        let input = stdin.to_vec();
        std::thread::spawn(move || {
            // A plugin that exits without reading it all says what went wrong itself.
            let _ = i.write_all(&input);
        });
    }
    let (tx, rx) = std::sync::mpsc::channel::<(bool, Vec<u8>)>();
    let pipes: [(bool, Option<Box<dyn Read + Send>>); 2] = [
        (
            true,
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ),
        (
            false,
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ),
    ];
    for (is_out, pipe) in pipes {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(p) = pipe {
                // An IPAM result is a few KB; more is cut off (and fails to parse).
                let _ = p.take(DELEGATE_MAX_OUTPUT).read_to_end(&mut v);
            }
            let _ = tx.send((is_out, v));
        });
    }
    drop(tx);
    let timed_out = || {
        CniError::new(
            code::TRY_AGAIN_LATER,
            format!(
                "the IPAM plugin {plugin} did not answer {command} within {DELEGATE_TIMEOUT:?}"
            ),
        )
    };
    let status = loop {
        if let Some(s) = child.try_wait().map_err(failed)? {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(timed_out());
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        // A process the plugin left running may still hold its pipes.
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((true, v)) => stdout = v,
            Ok((false, v)) => stderr = v,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return Err(timed_out()),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let answer: Option<Value> = if stdout.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        serde_json::from_slice(&stdout).ok()
    };
    if status.success() {
        return Ok(answer);
    }
    match answer {
        Some(v) if v.get("code").is_some() => Err(CniError {
            code: v
                .get("code")
                .and_then(Value::as_u64)
                .and_then(|c| u32::try_from(c).ok())
                .unwrap_or(code::PLUGIN),
            msg: format!(
                "IPAM plugin {plugin}: {}",
                v.get("msg").and_then(Value::as_str).unwrap_or("failed")
            ),
            details: v
                .get("details")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        }),
        _ => Err(CniError::new(
            code::PLUGIN,
            format!("IPAM plugin {plugin} failed ({status})"),
        )
        .with_details(String::from_utf8_lossy(&stderr).trim())),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A plugin that writes 256 KiB to stderr (more than a pipe holds) before reading its
    /// input, then answers.
    const CHATTY: &str = "#!/bin/sh\nhead -c 262144 /dev/zero >&2\ncat >/dev/null\n\
                          echo '{\"cniVersion\":\"1.0.0\",\"ips\":[]}'\n";

    #[test]
    fn a_plugin_that_writes_before_reading_a_large_input_does_not_deadlock() {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join("chatty");
        std::fs::write(&plugin, CHATTY).unwrap();
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let env: Env = [("CNI_PATH".to_string(), dir.path().display().to_string())].into();
        // Before: stdin was written in full first, while the plugin waited on a full stderr
        // pipe: both waited forever. Run on a thread so a regression fails instead of hanging.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let input = vec![b' '; 4 << 20];
            let mut r = exec("chatty", "ADD", &env, &input);
            // Another test's fork may briefly hold the new file open for writing.
            for _ in 0..20 {
                match &r {
                    Err(e) if format!("{e:?}").contains("busy") => {
                        std::thread::sleep(Duration::from_millis(50));
                        r = exec("chatty", "ADD", &env, &input);
                    }
                    _ => break,
                }
            }
            let _ = tx.send(r);
        });
        let answer = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the delegated call deadlocked")
            .unwrap()
            .unwrap();
        assert_eq!(answer["cniVersion"], "1.0.0");
    }
}
