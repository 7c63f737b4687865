//! Running code inside another network namespace.
//!
//! The container side is configured from a short-lived thread that has entered the
//! container's namespace with `setns(CLONE_NEWNET)`; only that thread changes namespace, and it
//! ends when its work is done, so no other thread (and never the plugin's own namespace) is
//! affected. What it opens there (a netlink socket, `/proc/sys/net` files) stays bound to the
//! container's namespace.

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
        handle.join().map_err(|_| {
            io::Error::other("the thread working in the container's namespace panicked")
        })?
    })
}

/// Writes a sysctl under /proc/sys (in the calling thread's network namespace for `net.*`).
pub fn write_sysctl(path: &str, value: &str) -> io::Result<()> {
    std::fs::write(format!("/proc/sys/{path}"), value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot set {} = {value}: {e}", path.replace('/', ".")),
        )
    })
}

/// Reads a sysctl under /proc/sys.
pub fn read_sysctl(path: &str) -> io::Result<String> {
    std::fs::read_to_string(format!("/proc/sys/{path}")).map(|s| s.trim().to_string())
}
