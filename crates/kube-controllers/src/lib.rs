//! `margay kube-controllers`: Calico's calico-kube-controllers.
//!
//! - IPAM garbage collection and node clean-up (the node controller): addresses whose pod or
//!   node is gone are released after the leak grace period (at once when the node is gone),
//!   a deleted node's affinities, empty blocks and tunnel addresses go, empty blocks of live
//!   nodes lose their affinity; Calico's `ipam_*` metrics.
//! - In etcd mode, the mirrors of Kubernetes objects Calico's kube-controllers keeps:
//!   NetworkPolicies → `knp.default.<name>`, Namespaces → `kns.<ns>`, ServiceAccounts →
//!   `ksa.<ns>.<sa>` Profiles, Pod labels → WorkloadEndpoints; and Calico Nodes whose
//!   Kubernetes Node is gone are deleted.
//! - The loadbalancer controller (`loadbalancer`): Services of type LoadBalancer get an
//!   ingress address from the pools that allow `LoadBalancer`, released when they go.
//! - Automatic host endpoints (`<node>-auto-hep`, [`auto_hep`]) when the node controller's
//!   `hostEndpoint.autoCreate` is Enabled.
//! - KubeControllersConfiguration `default` merged with the environment ([`config`]), health
//!   (`/status/status.json`, `/liveness`, `/readiness`) and Prometheus metrics.
//!
//! Pure: [`config`], [`gc`], [`pods`], [`mirror`], [`metrics`] (rendering). Edges: [`status`]
//! (the status file), [`informer`] (Kubernetes list+watch), [`ipam_controller`], [`mirrors`],
//! [`daemon`], [`http`], [`cli`]. See `DESIGN.md`.
#![forbid(unsafe_code)]

pub mod auto_hep;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod gc;
/// The one-shot HTTP GET the tests and `check-status` use (the server is
/// `margay-daemon-http`).
pub mod http {
    pub use margay_daemon_http::get;
}
pub mod informer;
pub mod ipam_controller;
pub mod loadbalancer;
pub mod metrics;
pub mod mirror;
pub mod mirrors;
pub mod pods;
pub mod status;
