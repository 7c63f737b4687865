//! The Linux dataplane: kernel state margay owns, applied over netlink, and the host settings
//! under `/proc/sys` that workloads need.
pub mod interfaces;
pub mod mtu;
pub mod netlink;
pub mod routes;
pub mod routing;
pub mod sysctl;
pub mod vxlan;
