//! margay's CNI plugins (Calico's `calico` and `calico-ipam`): the CNI protocol, the network
//! configuration, the workload's identity and endpoint (pure), and the Linux dataplane
//! (netlink, sysctls, network namespaces) and datastore adapters that ADD, DEL, CHECK,
//! STATUS and GC drive.
//!
//! `spec`, `config`, `k8s` (the pod and its annotations) and `workload` are pure; `netlink`, `netns` and `dataplane` touch the
//! kernel; `plugin` ties them to the datastore and IPAM (margay's own, or another IPAM plugin
//! through `delegate`); `cli` is the binary edge.
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod dataplane;
pub mod delegate;
pub mod install;
pub mod k8s;
pub mod plugin;
pub mod spec;
pub mod storm;
pub mod workload;

pub use plugin::{PluginKind, run};
