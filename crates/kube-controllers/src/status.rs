//! Readiness as Calico's kube-controllers reports it: named conditions (`Startup`,
//! `CalicoDatastore`, `KubeAPIServer`), written to a status file (`/status/status.json`, read
//! by `check-status -r`) and served on the health port. Ready when every condition is.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

pub const DEFAULT_STATUS_FILE: &str = "/status/status.json";
pub const STARTUP: &str = "Startup";
pub const CALICO_DATASTORE: &str = "CalicoDatastore";
pub const KUBE_API_SERVER: &str = "KubeAPIServer";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    #[serde(rename = "Ready")]
    pub ready: bool,
    #[serde(rename = "Reason")]
    pub reason: String,
}

/// Calico's status file body: `{"Readiness":{"Startup":{"Ready":true,"Reason":""},…}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusFile {
    #[serde(rename = "Readiness", default)]
    pub readiness: BTreeMap<String, Condition>,
}

impl StatusFile {
    /// Ready iff there is a condition and every one is ready.
    pub fn ready(&self) -> bool {
        !self.readiness.is_empty() && self.readiness.values().all(|c| c.ready)
    }

    /// The reasons of the conditions that are not ready, `; `-joined.
    pub fn not_ready(&self) -> String {
        let v: Vec<String> = self
            .readiness
            .iter()
            .filter(|(_, c)| !c.ready)
            .map(|(k, c)| {
                if c.reason.is_empty() {
                    format!("{k}: not ready")
                } else {
                    format!("{k}: {}", c.reason)
                }
            })
            .collect();
        v.join("; ")
    }
}

/// The live conditions, written to the status file on every change.
pub struct Status {
    file: Option<PathBuf>,
    state: Mutex<StatusFile>,
}

impl Status {
    /// `file`: where to write (None: nowhere).
    pub fn new(file: Option<PathBuf>) -> Status {
        Status {
            file,
            state: Mutex::new(StatusFile::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StatusFile> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set(&self, key: &str, ready: bool, reason: impl Into<String>) {
        let c = Condition {
            ready,
            reason: reason.into(),
        };
        let mut s = self.lock();
        if s.readiness.get(key) == Some(&c) {
            return;
        }
        tracing::debug!(condition = key, ready, reason = %c.reason, "readiness changed");
        s.readiness.insert(key.to_string(), c);
        // Written under the lock, so the file never goes back to an older state.
        self.write(&s);
    }

    /// Drops a condition (a check that no longer runs).
    pub fn remove(&self, key: &str) {
        let mut s = self.lock();
        if s.readiness.remove(key).is_some() {
            self.write(&s);
        }
    }

    fn write(&self, snapshot: &StatusFile) {
        let Some(path) = &self.file else { return };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let body = serde_json::to_vec(snapshot).unwrap_or_default();
            // Written whole and renamed, so a probe never reads half a file.
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, body)?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            tracing::warn!(file = %path.display(), "cannot write the status file: {e}");
        }
    }

    pub fn snapshot(&self) -> StatusFile {
        self.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn file_has_calicos_shape_and_follows_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status/status.json");
        let s = Status::new(Some(path.clone()));
        s.set(STARTUP, false, "initialized to false");
        let f: StatusFile = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert!(!f.ready());
        assert_eq!(f.not_ready(), "Startup: initialized to false");
        s.set(STARTUP, true, "");
        s.set(CALICO_DATASTORE, true, "");
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            r#"{"Readiness":{"CalicoDatastore":{"Ready":true,"Reason":""},"Startup":{"Ready":true,"Reason":""}}}"#
        );
        assert!(s.snapshot().ready());
        assert!(!StatusFile::default().ready());
    }
}
