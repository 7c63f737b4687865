//! Settings under `/proc/sys`: read each, write only those that differ.
//!
//! `/proc/sys/net` belongs to the network namespace of the thread that opens the file: use a
//! [`ProcSys`] only on a thread in the namespace meant (see [`crate::netns::run_in`]). Which
//! settings, with which values, is decided by the callers' pure functions (Felix's in
//! `margay-dataplane`'s `linux::sysctl`, the CNI plugin's container settings).

use std::io;
use std::path::{Path, PathBuf};

/// One setting: a path under `/proc/sys` and the value it must have.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sysctl {
    /// Relative to `/proc/sys`, e.g. `net/ipv4/ip_forward`.
    pub path: String,
    pub value: String,
    /// A failure is worth a warning but does not make the interface's configuration fail
    /// (Calico: `proxy_delay`, `accept_ra`).
    pub best_effort: bool,
}

impl Sysctl {
    /// A setting that must be made.
    pub fn new(path: String, value: &str) -> Sysctl {
        Sysctl {
            path,
            value: value.to_string(),
            best_effort: false,
        }
    }

    /// A setting whose failure is only worth a warning.
    pub fn best_effort(path: String, value: &str) -> Sysctl {
        Sysctl {
            best_effort: true,
            ..Sysctl::new(path, value)
        }
    }

    /// `net.ipv4.ip_forward` form, for messages.
    pub fn dotted(&self) -> String {
        self.path.replace('/', ".")
    }
}

/// What [`ProcSys::apply`] did.
#[derive(Debug, Default)]
pub struct SysctlReport {
    /// Settings that had another value and were written.
    pub written: Vec<Sysctl>,
    pub unchanged: usize,
    /// Settings that could not be read or written, and why.
    pub failed: Vec<(Sysctl, io::Error)>,
}

impl SysctlReport {
    /// A setting that is not best effort failed.
    pub fn failed_hard(&self) -> bool {
        self.failed.iter().any(|(s, _)| !s.best_effort)
    }
}

/// Reads and writes settings under a `/proc/sys` root (the real one, or a directory in unit
/// tests of the adapter).
#[derive(Debug, Clone)]
pub struct ProcSys {
    root: PathBuf,
}

impl Default for ProcSys {
    fn default() -> Self {
        ProcSys {
            root: PathBuf::from("/proc/sys"),
        }
    }
}

impl ProcSys {
    /// Settings under `root` instead of `/proc/sys`.
    pub fn with_root(root: impl Into<PathBuf>) -> ProcSys {
        ProcSys { root: root.into() }
    }

    fn file(&self, path: &str) -> PathBuf {
        self.root.join(path)
    }

    /// The current value of a setting, trimmed.
    pub fn read(&self, path: &str) -> io::Result<String> {
        let f = self.file(path);
        std::fs::read_to_string(&f)
            .map(|s| s.trim().to_string())
            .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", f.display())))
    }

    /// Whether the interface exists for IPv4 settings (its `conf` directory is there).
    pub fn has_interface(&self, iface: &str) -> bool {
        Path::new(&self.file(&format!("net/ipv4/conf/{iface}"))).is_dir()
    }

    /// Writes one setting unconditionally.
    pub fn write(&self, path: &str, value: &str) -> io::Result<()> {
        std::fs::write(self.file(path), value).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot set {} = {value}: {e}", path.replace('/', ".")),
            )
        })
    }

    /// Reads each setting and writes the ones that differ.
    pub fn apply(&self, settings: &[Sysctl]) -> SysctlReport {
        let mut report = SysctlReport::default();
        for s in settings {
            match self.read(&s.path) {
                Ok(v) if v == s.value => {
                    report.unchanged += 1;
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    report.failed.push((s.clone(), e));
                    continue;
                }
            }
            let f = self.file(&s.path);
            match std::fs::write(&f, &s.value) {
                Ok(()) => report.written.push(s.clone()),
                Err(e) => report.failed.push((
                    s.clone(),
                    io::Error::new(
                        e.kind(),
                        format!("writing {} to {}: {e}", s.value, f.display()),
                    ),
                )),
            }
        }
        report
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_adapter_writes_only_what_differs() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("net/ipv4/conf/cali1");
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::write(conf.join("proxy_arp"), "0\n").unwrap();
        std::fs::write(conf.join("forwarding"), "1\n").unwrap();
        let ps = ProcSys::with_root(dir.path());
        assert!(ps.has_interface("cali1"));
        assert!(!ps.has_interface("cali2"));
        let want = [
            Sysctl::new("net/ipv4/conf/cali1/proxy_arp".into(), "1"),
            Sysctl::new("net/ipv4/conf/cali1/forwarding".into(), "1"),
            Sysctl::best_effort("net/ipv4/conf/cali1/missing".into(), "1"),
        ];
        let r = ps.apply(&want);
        assert_eq!(r.written.len(), 1);
        assert_eq!(r.unchanged, 1);
        assert_eq!(r.failed.len(), 1);
        assert!(!r.failed_hard(), "only a best-effort setting failed");
        assert_eq!(
            std::fs::read_to_string(conf.join("proxy_arp")).unwrap(),
            "1"
        );
        let again = ps.apply(&want[..2]);
        assert!(again.written.is_empty());
        assert_eq!(again.unchanged, 2);
    }
}
