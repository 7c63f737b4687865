//! margay typha: the fan-out cache between the datastore and many Felix instances.
//!
//! - Pure: [`proto`] (frames and messages), [`cache`] (breadcrumb snapshot cache),
//!   [`dedupe`] (the client's dedupe buffer), [`config`] (TYPHA_* and typha.cfg),
//!   [`syncers`] (what each syncer type carries).
//! - Edge: [`upstream`] (datastore → validation filter → cache), [`server`], [`client`],
//!   [`tls`], [`wire`] (frames on sockets), [`daemon`] (`margay typha`), [`bench`].
//! - [`discovery`]: Typha in Kubernetes — clients finding Typha through its Service's
//!   EndpointSlices and the connection limit following them (the choice and the counts are
//!   pure, the lookups are the edge).
//!
//! See `DESIGN.md` and `PROTOCOL.md` in this crate.
#![forbid(unsafe_code)]

pub mod bench;
pub mod cache;
pub mod cli;
pub mod client;
pub mod config;
pub mod daemon;
pub mod dedupe;
pub mod discovery;
pub mod proto;
pub mod server;
pub mod syncers;
pub mod tls;
pub mod upstream;
pub mod wire;

pub use client::{ClientEvent, ClientOptions, ClientStats, ConnectionState};
pub use config::TyphaConfig;
pub use syncers::SyncerType;
