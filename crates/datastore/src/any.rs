//! A backend chosen at run time.

use std::time::Duration;

use crate::error::Result;
use crate::kv::{Compare, KeyValue, KvBackend, ListResult, TxnOp, TxnResponse, Watch};
use crate::mem::MemBackend;

/// Any of margay's backends, behind one type (static dispatch per call).
#[derive(Clone)]
pub enum AnyBackend {
    Mem(MemBackend),
    #[cfg(feature = "local")]
    Local(crate::local::LocalBackend),
    #[cfg(feature = "etcd")]
    Etcd(crate::etcd::EtcdBackend),
    #[cfg(feature = "kubernetes")]
    Kube(crate::kube::KubeBackend),
}

macro_rules! dispatch {
    ($self:ident, $b:ident => $e:expr) => {
        match $self {
            AnyBackend::Mem($b) => $e,
            #[cfg(feature = "local")]
            AnyBackend::Local($b) => $e,
            #[cfg(feature = "etcd")]
            AnyBackend::Etcd($b) => $e,
            #[cfg(feature = "kubernetes")]
            AnyBackend::Kube($b) => $e,
        }
    };
}

impl KvBackend for AnyBackend {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        dispatch!(self, b => b.get(key).await)
    }
    async fn list(&self, prefix: &str) -> Result<ListResult> {
        dispatch!(self, b => b.list(prefix).await)
    }
    async fn create(&self, key: &str, value: Vec<u8>, ttl: Option<Duration>) -> Result<KeyValue> {
        dispatch!(self, b => b.create(key, value, ttl).await)
    }
    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Option<i64>,
        ttl: Option<Duration>,
    ) -> Result<KeyValue> {
        dispatch!(self, b => b.update(key, value, expected, ttl).await)
    }
    async fn delete(&self, key: &str, expected: Option<i64>) -> Result<KeyValue> {
        dispatch!(self, b => b.delete(key, expected).await)
    }
    async fn txn(&self, compares: Vec<Compare>, ops: Vec<TxnOp>) -> Result<TxnResponse> {
        dispatch!(self, b => b.txn(compares, ops).await)
    }
    async fn watch(&self, prefix: &str, after_revision: i64) -> Result<Watch> {
        dispatch!(self, b => b.watch(prefix, after_revision).await)
    }
    async fn compact(&self, revision: i64) -> Result<()> {
        dispatch!(self, b => b.compact(revision).await)
    }
    async fn revision(&self) -> Result<i64> {
        dispatch!(self, b => b.revision().await)
    }
    async fn list_many(&self, prefixes: &[String]) -> Result<ListResult> {
        dispatch!(self, b => b.list_many(prefixes).await)
    }
    async fn watch_many(&self, prefixes: &[String], after_revision: i64) -> Result<Watch> {
        dispatch!(self, b => b.watch_many(prefixes, after_revision).await)
    }
}
