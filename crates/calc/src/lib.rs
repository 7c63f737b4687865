//! Felix's calculation graph for margay: datastore resources in, the dataplane messages one
//! node needs out. Pure: no I/O, no clocks, no threads; every decision is a function of the
//! resources it has been given.
//!
//! ```text
//! on_update(key, value) ──► label index ──► IP-set membership ─┐
//!                      ├──► policy matches for local endpoints ─┼─► dirty sets ──► flush()
//!                      ├──► profiles (labels, rules)            │       (event sequencer:
//!                      └──► routes, VTEPs, hosts, pools ────────┘        Calico's order)
//! ```
//!
//! See `DESIGN.md` in this crate for the invariants and how they are tested.
#![forbid(unsafe_code)]

mod graph;
pub mod labels;
pub mod messages;
pub mod model;
pub mod rules;
pub mod services;

pub use graph::{
    CalcConfig, CalcCounts, CalcGraph, IpSetStatus, Problem, RouteSource, vxlan_mac_for_node,
};
pub use messages::*;
pub use model::{ContractError, DataplaneModel};
