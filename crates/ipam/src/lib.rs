//! Calico-compatible IPAM.
//!
//! Pools are split into blocks (`blockSize`); a host claims blocks (affinity, two-phase:
//! pending → confirmed) and allocates from them; with `strictAffinity` off it may borrow from
//! other hosts' blocks when it cannot claim more. Allocations are recorded in the block
//! (ordinal → handle and attributes) and counted per handle, so a pod's addresses are released
//! by its handle. The stored JSON and keys are Calico's (`/calico/ipam/v2/...`), so margay and
//! Calico can share an etcd.
//!
//! `block`, `pools` and `check` are pure; `client` is the datastore adapter (every write
//! compare-and-swap with bounded retries). See `DESIGN.md`.
#![forbid(unsafe_code)]

pub mod block;
pub mod check;
pub mod client;
pub mod error;
pub mod pools;
pub mod usage;

pub use block::{AllocationBlock, BlockAffinity, IpamHandle};
pub use check::{CheckReport, Users, check};
pub use client::{
    AffinityRelease, AssignArgs, Assigned, AssignedIp, DEFAULT_MAX_BLOCKS_PER_HOST, HostLock, Ipam,
    IpamConfig, MAX_RETRIES, ReleaseIp,
};
pub use error::IpamError;
pub use pools::PoolInfo;

/// Handle of a Kubernetes pod's addresses (`<network>.<containerID>`).
pub fn workload_handle(network: &str, container_id: &str) -> String {
    format!("{network}.{container_id}")
}

/// Handle of a node's VXLAN tunnel address.
pub fn vxlan_tunnel_handle(node: &str) -> String {
    format!("vxlan-tunnel-addr-{node}")
}
