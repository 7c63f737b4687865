//! margay's datastore layer.
//!
//! - [`kv`]: the key/value contract (etcd v3 semantics) every backend implements.
//! - Backends: [`mem`] (in-memory, tests), `local` (embedded SQLite, the single-machine
//!   default), `etcd` (etcd v3, Calico's key layout), `kube` (the Kubernetes API, Calico's
//!   KDD mapping).
//! - [`client`]: typed projectcalico.org/v3 resources on any backend, validated before writes.
//! - [`keys`]: Calico's etcd key layout.
//! - [`prefix_mirror`]: list-then-watch of one key prefix, reporting only differences.
#![forbid(unsafe_code)]

pub mod any;
pub mod client;
pub mod config;
pub mod error;
pub mod keys;
pub mod kv;
pub mod mem;
pub mod prefix_mirror;
pub mod syncer;
pub mod util;

pub use any::AnyBackend;
pub use client::{Applied, Client, ResourceEvent, ResourceList, ResourceWatch};
pub use config::{DatastoreConfig, DatastoreType, KubeSettings};
pub use error::{DatastoreError, Result};
pub use kv::{
    Compare, KeyValue, KvBackend, KvEvent, ListResult, TxnOp, TxnOpResult, TxnResponse, Watch,
};
pub use mem::MemBackend;
pub use prefix_mirror::{MirrorEvent, PrefixMirror};
pub use syncer::{SyncStatus, SyncerEvent, SyncerOptions, Update, UpdateType, WatcherSyncer};

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "kubernetes")]
pub mod kube;
#[cfg(feature = "local")]
pub mod local;
