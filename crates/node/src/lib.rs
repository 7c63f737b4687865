//! `margay node`: registering a node the way calico-node's start-up does, and its health check.
#![forbid(unsafe_code)]

pub mod autodetect;
pub mod cli;
pub mod config;
pub mod health;
pub mod netlink;
pub mod startup;
pub mod tunnel;
