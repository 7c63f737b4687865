//! `margay lab`: a real multi-node cluster on one Linux machine, built from network
//! namespaces — the demo and the end-to-end test bed.
//!
//! ```text
//!   fabric ns (bridge br0, 172.30.0.1/24) ── veth ── node ns (eth0 172.30.0.1x, runs
//!                                                     margay node startup + supervised felix)
//!                                                       └─ cali* veth ── pod ns (eth0, margay lab serve)
//! ```
//!
//! Every namespace is named `mgy-<lab>-…`; every process is started detached in its own
//! process group through `margay lab supervise`, which records its pid; the state file in the
//! lab's directory lists all of it, so `lab down` removes everything even after a crash (and
//! also sweeps namespaces with the lab's prefix and processes inside them).
#![forbid(unsafe_code)]

pub mod bgp;
pub mod cli;
pub mod k8s;
pub mod kube;
pub mod net;
pub mod ops;
pub mod services;
pub mod state;
pub mod topology;

pub use cli::{LabArgs, run};
