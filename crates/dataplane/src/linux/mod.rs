//! The Linux dataplane: kernel state margay owns, applied over netlink.
pub mod netlink;
pub mod routes;
pub mod routing;
pub mod vxlan;
