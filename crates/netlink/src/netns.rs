//! Running code inside another network namespace.
//!
//! Work is done on a short-lived thread that has entered the namespace with
//! `setns(CLONE_NEWNET)`; only that thread changes namespace, and it ends when its work is
//! done, so no other thread (and never the caller's own namespace) is affected. What it opens
//! there (a netlink socket, `/proc/sys/net` files) stays bound to that namespace.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use nix::sched::CloneFlags;

/// Opens a network namespace file (`/run/netns/NAME`, `/proc/PID/ns/net`); a file that is not
/// a namespace is refused (InvalidInput).
pub fn open(path: &Path) -> io::Result<File> {
    let f = File::open(path)?;
    let fs = nix::sys::statfs::fstatfs(&f).map_err(io::Error::from)?;
    if fs.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a namespace file (expected e.g. /run/netns/NAME or /proc/PID/ns/net)",
        ));
    }
    Ok(f)
}

/// Runs `f` on a thread inside the namespace `ns` and returns its result.
pub fn run_in<T: Send>(ns: &File, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name("margay-netns".into())
            .spawn_scoped(s, || {
                nix::sched::setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| {
                    io::Error::new(
                        io::Error::from(e).kind(),
                        format!("cannot enter the network namespace: {e}"),
                    )
                })?;
                f()
            })?;
        handle
            .join()
            .map_err(|_| io::Error::other("the thread working in another namespace panicked"))?
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_a_namespace_is_refused() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let e = open(f.path()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }

    /// Entering our own namespace is harmless and shows the closure runs and returns.
    #[test]
    fn runs_in_the_current_namespace() {
        let ns = open(Path::new("/proc/self/ns/net")).unwrap();
        match run_in(&ns, || Ok(7)) {
            Ok(v) => assert_eq!(v, 7),
            // Without CAP_SYS_ADMIN setns fails: that is the error we must see, named.
            Err(e) => assert!(e.to_string().contains("cannot enter"), "{e}"),
        }
    }
}
