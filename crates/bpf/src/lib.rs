//! margay's eBPF dataplane: the C programs (compiled by build.rs with clang and embedded
//! here), the maps' byte layouts, the policy compiler (a pure function of the calculation
//! graph's model, unit-tested without root) and the loader that writes maps and attaches
//! programs. See DESIGN.md.
#![forbid(unsafe_code)]

pub mod compile;
pub mod flows;
pub mod index;
pub mod inspect;
pub mod layout;
pub mod loader;
pub mod sim;
pub mod sync;

/// The policy program object (bpf/policy.c), compiled for the BPF target at build time.
pub const POLICY_OBJ: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/policy.o"));

#[cfg(test)]
mod compile_tests;
