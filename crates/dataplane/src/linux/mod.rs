//! The Linux dataplane: kernel state margay owns, applied over netlink, and the host settings
//! under `/proc/sys` that workloads need.
pub mod interfaces;
pub mod mtu;
/// Kernel access lives in `margay-netlink`; re-exported under its old path for the dataplane's users.
pub use margay_netlink as netlink;
pub mod routes;
pub mod routing;
pub mod sysctl;
pub mod vxlan;
