//! `margay node`: registering a node the way calico-node's start-up does, its health check,
//! and the Kubernetes Node's NetworkUnavailable condition.
#![forbid(unsafe_code)]

pub mod autodetect;
pub mod cli;
pub mod condition;
pub mod config;
pub mod health;
pub mod kubernetes;
pub mod startup;
pub mod system_net;
pub mod tunnel;
