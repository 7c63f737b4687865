//! Test-only helpers. Everything here cleans up after itself, also when a test panics.
//!
//! - [`alloc`]: a counting global allocator (per-thread live and peak bytes) for memory bounds.
//! - [`etcd`]: private etcd servers and clusters on loopback ports, with temp data dirs.
//! - [`netns`]: throw-away network namespaces (named `mgy-…`) with veth pairs, for root tests.
//! - [`roles`]: a node running margay roles — work directory (and namespace), supervised
//!   long-running roles with their logs, bounded readiness waits, logs kept on failure.
// Denied, not forbidden: `alloc` (a GlobalAlloc impl) is the one module allowed unsafe code.
#![deny(unsafe_code)]

pub mod alloc;
pub mod etcd;
pub mod netns;
pub mod roles;

/// A free TCP port on 127.0.0.1 (bound and released; good enough for tests).
pub fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}
