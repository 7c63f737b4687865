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
    if let Some(mut i) = child.stdin.take() {
        i.write_all(stdin).map_err(failed)?;
    }
    let mut so = child.stdout.take();
    let mut se = child.stderr.take();
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(s) = so.as_mut() {
            let _ = s.read_to_end(&mut v);
        }
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(s) = se.as_mut() {
            let _ = s.read_to_end(&mut v);
        }
        v
    });
    let deadline = Instant::now() + DELEGATE_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().map_err(failed)? {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(CniError::new(
                code::TRY_AGAIN_LATER,
                format!(
                    "the IPAM plugin {plugin} did not answer {command} within {DELEGATE_TIMEOUT:?}"
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
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
