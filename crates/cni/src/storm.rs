//! Storm protection: bounds how many plugin calls on one host work against the datastore at
//! once.
//!
//! IPAM operations are serialised by the IPAM host lock (`margay_ipam::HostLock`, Calico's
//! `/var/run/calico/ipam.lock`). On top of that, a call holds one of N slot files (advisory
//! file locks next to the IPAM lock, N = MARGAY_CNI_MAX_CONCURRENT, default 8) while it talks
//! to the datastore and programs interfaces, so a burst of hundreds of ADDs queues instead of
//! opening hundreds of datastore sessions. Like Calico's lock, it is best effort: if the slot
//! files cannot be used, the call goes ahead unbounded (and says so in the log).

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use crate::config::Env;

/// Default number of concurrent plugin calls per host.
pub const DEFAULT_SLOTS: usize = 8;
/// Overrides the number of slots (0 disables the bound).
pub const ENV_MAX_CONCURRENT: &str = "MARGAY_CNI_MAX_CONCURRENT";

/// A held slot; released when dropped (or when the process ends, however it ends).
#[derive(Debug)]
pub struct Slot {
    _file: Option<File>,
}

fn slot_path(lock: &Path, i: usize) -> PathBuf {
    let dir = lock.parent().unwrap_or_else(|| Path::new("/"));
    dir.join(format!("margay-cni-slot-{i}.lock"))
}

fn open(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
}

impl Slot {
    /// Takes a free slot, waiting for one if all are busy.
    pub async fn acquire(ipam_lock: &Path, env: &Env) -> Slot {
        let n = env
            .get(ENV_MAX_CONCURRENT)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_SLOTS);
        if n == 0 {
            return Slot { _file: None };
        }
        let start = std::process::id() as usize % n;
        let mut first = None;
        for k in 0..n {
            let i = (start + k) % n;
            let path = slot_path(ipam_lock, i);
            let file = match open(&path) {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(path = %path.display(), "cannot use the concurrency slot file ({e}); going ahead without it");
                    return Slot { _file: None };
                }
            };
            match file.try_lock() {
                Ok(()) => return Slot { _file: Some(file) },
                Err(TryLockError::WouldBlock) => {
                    if first.is_none() {
                        first = Some(file);
                    }
                }
                Err(TryLockError::Error(e)) => {
                    tracing::warn!(path = %path.display(), "cannot lock the concurrency slot file ({e}); going ahead without it");
                    return Slot { _file: None };
                }
            }
        }
        let Some(file) = first else {
            return Slot { _file: None };
        };
        tracing::debug!("all {n} plugin slots busy; waiting");
        match tokio::task::spawn_blocking(move || file.lock().map(|()| file)).await {
            Ok(Ok(file)) => Slot { _file: Some(file) },
            Ok(Err(e)) => {
                tracing::warn!("waiting for a plugin slot failed ({e}); going ahead without it");
                Slot { _file: None }
            }
            Err(e) => {
                tracing::warn!("waiting for a plugin slot failed ({e}); going ahead without it");
                Slot { _file: None }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_bound_concurrency() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("ipam.lock");
        let env: Env = [(ENV_MAX_CONCURRENT.to_string(), "2".to_string())].into();
        let a = Slot::acquire(&lock, &env).await;
        let b = Slot::acquire(&lock, &env).await;
        assert!(a._file.is_some() && b._file.is_some());
        // A third waits until one is released.
        let lock2 = lock.clone();
        let env2 = env.clone();
        let third = tokio::spawn(async move { Slot::acquire(&lock2, &env2).await });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!third.is_finished());
        drop(a);
        let c = tokio::time::timeout(std::time::Duration::from_secs(5), third)
            .await
            .unwrap()
            .unwrap();
        assert!(c._file.is_some());
        drop(b);
    }
}
