//! IPAM errors. Each says what is wrong and what to do about it.

use std::net::IpAddr;

use margay_datastore::DatastoreError;

#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    #[error("IP pool {pool:?} is unusable: {reason}; fix the pool with `margay ctl apply`")]
    BadPool { pool: String, reason: String },
    #[error(
        "no IPv{version} pool is named or has CIDR {pool:?}; list pools with `margay ctl get ippools`"
    )]
    NoSuchPool { pool: String, version: u8 },
    #[error("IP pool {pool:?} cannot be used here: {reason}")]
    PoolUnusable { pool: String, reason: String },
    #[error(
        "no enabled IPv{version} pool can be used by node {node:?} (check the pools' disabled, nodeSelector and allowedUses); create one with `margay ctl apply`"
    )]
    NoPools { version: u8, node: String },
    #[error(
        "IPv{version} pools {pools:?} have no free address for node {node:?} (wanted {wanted}, got {got}){hint}"
    )]
    Exhausted {
        version: u8,
        pools: Vec<String>,
        node: String,
        wanted: usize,
        got: usize,
        hint: String,
    },
    #[error("{ip} is not in any IP pool; add a pool covering it or choose another address")]
    NotInPool { ip: IpAddr },
    #[error("{ip} is already allocated to handle {handle:?}")]
    InUse { ip: IpAddr, handle: Option<String> },
    #[error("{ip} is reserved by an IPReservation")]
    Reserved { ip: IpAddr },
    #[error(
        "{ip} was reallocated since it was read (sequence number {expected}, now {actual}); nothing was released"
    )]
    BadSequenceNumber {
        ip: IpAddr,
        expected: u64,
        actual: u64,
    },
    #[error("gave up on {what} after {attempts} conflicting concurrent updates; try again")]
    TooManyRetries { what: String, attempts: usize },
    #[error("stored IPAM data at {key} is unreadable: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("host lock {path}: {reason}")]
    Lock { path: String, reason: String },
    #[error(transparent)]
    Datastore(#[from] DatastoreError),
}
