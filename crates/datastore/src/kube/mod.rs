//! The Kubernetes API as a [`KvBackend`] (Calico's "KDD"): the same contract as etcd where the
//! API allows it, over Calico's mapping of its keys onto API objects.
//!
//! - `route` (pure): which API object a key is, which API resources a prefix covers.
//! - `convert`: API objects ⇄ key/value pairs through the pure mapping of `margay-kdd`.
//! - `api`: one kube-rs request at a time, objects as JSON.
//! - `watch`: one watch loop per API resource (bookmarks, re-watch from the last version,
//!   410 → `Compacted` so consumers re-list).
//!
//! Differences from the etcd contract (see DESIGN.md): revisions are the API server's
//! resourceVersions (etcd revisions on every real API server; margay refuses any that are not
//! numbers); a list that spans several API resources is several lists, and a watch from its
//! revision resumes each of them from its own list's version (remembered per listing), so no
//! change is missed or replayed; `txn` is not atomic across objects: compares are checked
//! first, then writes are applied in order, each conditional on its own compare, and the
//! earlier ones are undone (compare-and-swap) if a later one fails; `compact` is the API
//! server's business; TTLs are not supported; a watch from revision 0 starts now (the API keeps
//! no history from the beginning of time).

pub mod api;
pub mod convert;
pub mod route;
pub mod services;
mod watch;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::try_join_all;
use serde_json::Value;
use tokio::sync::mpsc;

use self::api::{ApiError, KubeApi, parse_revision};
use self::convert::{Converter, WriteBody, read_only};
use self::route::{NAMESPACES, Query, RouteError, Source, Target, route_key, route_prefix};
use crate::config::KubeSettings;
use crate::error::{DatastoreError, Result};
use crate::kv::{
    Compare, KeyValue, KvBackend, ListResult, TxnOp, TxnOpResult, TxnResponse, Watch, check_txn_ops,
};

/// Listings remembered for the watches that follow them.
const LIST_MEMO_SIZE: usize = 256;
/// Attempts of an unconditional write that keeps meeting concurrent writers.
const UNCONDITIONAL_RETRIES: usize = 10;

/// The Kubernetes datastore.
#[derive(Clone)]
pub struct KubeBackend {
    inner: Arc<Inner>,
}

struct Inner {
    api: KubeApi,
    conv: Converter,
    /// (prefixes, revision) of a listing → the resourceVersion each of its API lists had.
    memo: Mutex<ListMemo>,
}

#[derive(Default)]
struct ListMemo {
    order: VecDeque<(String, i64)>,
    entries: HashMap<(String, i64), Vec<(Query, String)>>,
}

impl ListMemo {
    fn insert(&mut self, key: (String, i64), versions: Vec<(Query, String)>) {
        if self.entries.insert(key.clone(), versions).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > LIST_MEMO_SIZE {
            if let Some(old) = self.order.pop_front() {
                self.entries.remove(&old);
            }
        }
    }
}

fn map_err(e: ApiError, key: &str) -> DatastoreError {
    match e {
        ApiError::NotFound => DatastoreError::NotFound {
            key: key.to_string(),
        },
        ApiError::AlreadyExists => DatastoreError::AlreadyExists {
            key: key.to_string(),
        },
        // The API does not say what the current version is; callers re-read.
        ApiError::Conflict(_) => DatastoreError::Conflict {
            key: key.to_string(),
            expected: 0,
            current: None,
        },
        ApiError::Gone(m) => DatastoreError::unavailable(format!("Kubernetes API: {m}")),
        ApiError::Denied(m) => DatastoreError::invalid(format!("{key}: {m}")),
        ApiError::Rejected(m) => DatastoreError::invalid(format!("{key}: {m}")),
        ApiError::Unavailable(m) => DatastoreError::unavailable(format!("Kubernetes API: {m}")),
    }
}

fn route_err(e: RouteError) -> DatastoreError {
    DatastoreError::invalid(e.to_string())
}

fn conv_err(e: String) -> DatastoreError {
    DatastoreError::invalid(e)
}

fn bad_revision(rv: &str, what: &str) -> DatastoreError {
    DatastoreError::invalid(format!(
        "{what}: resourceVersion {rv:?} is not a number (margay needs an API server whose resourceVersions are etcd revisions)"
    ))
}

impl KubeBackend {
    /// Connects as the settings say (kubeconfig, overrides, or in-cluster).
    pub async fn connect(settings: &KubeSettings) -> Result<KubeBackend> {
        let config = connect::config(settings).await?;
        let client = kube::Client::try_from(config).map_err(|e| {
            DatastoreError::unavailable(format!("cannot set up the Kubernetes client: {e}"))
        })?;
        Ok(KubeBackend::from_client(client, &settings.interface_prefix))
    }

    /// Over an existing kube-rs client.
    pub fn from_client(client: kube::Client, interface_prefix: &str) -> KubeBackend {
        let prefix = if interface_prefix.is_empty() {
            "cali"
        } else {
            interface_prefix
        };
        KubeBackend {
            inner: Arc::new(Inner {
                api: KubeApi::new(client),
                conv: Converter {
                    interface_prefix: prefix.to_string(),
                },
                memo: Mutex::new(ListMemo::default()),
            }),
        }
    }

    /// The API layer (for callers that read other Kubernetes objects: Typha discovery).
    pub fn api(&self) -> &KubeApi {
        &self.inner.api
    }

    fn api_of(source: Source, key: &str) -> Result<route::ApiResource> {
        source.api().ok_or_else(|| conv_err(read_only(source, key)))
    }

    /// The object behind `target`, if any.
    async fn fetch(&self, target: &Target, key: &str) -> Result<Option<Value>> {
        let res = Self::api_of(target.source, key)?;
        self.inner
            .api
            .get(&res, target.namespace.as_deref(), &target.name)
            .await
            .map_err(|e| map_err(e, key))
    }

    /// `fetch` converted; None also when the object stands for another key (a pod on another
    /// node than the key names, a hash collision of affinity names).
    async fn get_kv(&self, key: &str) -> Result<Option<(KeyValue, Value)>> {
        let target = match route_key(key) {
            Ok(t) => t,
            Err(RouteError::Unmapped(_)) => return Ok(None),
            Err(e) => return Err(route_err(e)),
        };
        if target.source == Source::DefaultAllow {
            let kv = self.inner.conv.default_allow().map_err(conv_err)?;
            return Ok(Some((kv, Value::Null)));
        }
        let Some(obj) = self.fetch(&target, key).await? else {
            return Ok(None);
        };
        match self
            .inner
            .conv
            .to_kv(target.source, &obj)
            .map_err(conv_err)?
        {
            Some(kv) if kv.key == key => Ok(Some((kv, obj))),
            _ => Ok(None),
        }
    }

    /// Lists the queries, converted and filtered to keys under one of `prefixes`.
    async fn list_queries(&self, queries: Vec<Query>, prefixes: &[String]) -> Result<ListResult> {
        let api = &self.inner.api;
        let lists = try_join_all(queries.iter().map(|q| async move {
            let Some(res) = q.source.api() else {
                return Ok((q.clone(), Vec::new(), String::new()));
            };
            match api
                .list_all(&res, q.namespace.as_deref(), q.label_selector.as_deref())
                .await
            {
                Ok(l) => Ok((q.clone(), l.items, l.resource_version)),
                // The resource is not served (a CRD not installed): nothing of it exists.
                Err(ApiError::NotFound) => {
                    tracing::warn!(resource = %res.display(), "the API server does not serve this resource (is the CRD installed?); treating it as empty");
                    Ok((q.clone(), Vec::new(), String::new()))
                }
                Err(e) => Err(map_err(e, &res.display())),
            }
        }))
        .await?;
        let mut revision = 0i64;
        let mut kvs = Vec::new();
        let mut versions = Vec::with_capacity(lists.len());
        for (q, items, rv) in lists {
            if q.source == Source::DefaultAllow {
                let kv = self.inner.conv.default_allow().map_err(conv_err)?;
                if prefixes.iter().any(|p| kv.key.starts_with(p.as_str())) {
                    kvs.push(kv);
                }
                continue;
            }
            if !rv.is_empty() {
                let r = parse_revision(&rv).ok_or_else(|| bad_revision(&rv, "a list"))?;
                revision = revision.max(r);
            }
            for obj in items {
                match self.inner.conv.to_kv(q.source, &obj) {
                    Ok(Some(kv)) if prefixes.iter().any(|p| kv.key.starts_with(p.as_str())) => {
                        kvs.push(kv)
                    }
                    Ok(_) => {}
                    // One bad object never hides the rest; the syncer reports undecodable values.
                    Err(e) => {
                        let name = obj
                            .pointer("/metadata/name")
                            .and_then(|n| n.as_str())
                            .unwrap_or_default();
                        crate::kv::note_skipped("kubernetes", name.as_bytes(), &e.to_string());
                    }
                }
            }
            versions.push((q, rv));
        }
        if revision == 0 {
            let rv = api
                .current_revision(&NAMESPACES)
                .await
                .map_err(|e| map_err(e, "namespaces"))?;
            revision = parse_revision(&rv).ok_or_else(|| bad_revision(&rv, "namespaces"))?;
        }
        // A version-less query (nothing served) starts its watch from the listing's revision.
        for (_, rv) in versions.iter_mut() {
            if rv.is_empty() {
                *rv = revision.to_string();
            }
        }
        kvs.sort_by(|a, b| a.key.cmp(&b.key));
        kvs.dedup_by(|a, b| a.key == b.key);
        if let Ok(mut memo) = self.inner.memo.lock() {
            memo.insert((prefixes.join("\n"), revision), versions);
        }
        Ok(ListResult { kvs, revision })
    }

    async fn watch_queries(
        &self,
        queries: Vec<Query>,
        prefixes: Vec<String>,
        after: i64,
    ) -> Result<Watch> {
        let remembered = self
            .inner
            .memo
            .lock()
            .ok()
            .and_then(|m| m.entries.get(&(prefixes.join("\n"), after)).cloned());
        let start = if after <= 0 {
            // There is no history from the beginning of time: start now.
            let rv = self
                .inner
                .api
                .current_revision(&NAMESPACES)
                .await
                .map_err(|e| map_err(e, "namespaces"))?;
            parse_revision(&rv).ok_or_else(|| bad_revision(&rv, "namespaces"))?
        } else {
            after
        };
        let plan: Vec<(Query, String)> = queries
            .into_iter()
            .filter(|q| q.source != Source::DefaultAllow)
            .map(|q| {
                let rv = remembered
                    .as_ref()
                    .and_then(|v| v.iter().find(|(mq, _)| *mq == q).map(|(_, rv)| rv.clone()))
                    .unwrap_or_else(|| start.to_string());
                (q, rv)
            })
            .collect();
        let (tx, rx) = mpsc::channel(64);
        let starts: Vec<i64> = plan
            .iter()
            .map(|(_, rv)| parse_revision(rv).unwrap_or(start))
            .collect();
        let task = tokio::spawn(watch::run(
            self.inner.api.clone(),
            self.inner.conv.clone(),
            plan,
            prefixes,
            tx,
        ));
        Ok(Watch::from_streams(rx, starts, Some(task.abort_handle())))
    }

    /// Creates the object a key names from its value.
    async fn create_kv(&self, key: &str, value: &[u8]) -> Result<KeyValue> {
        let target = route_key(key).map_err(route_err)?;
        let res = Self::api_of(target.source, key)?;
        let ns = target.namespace.as_deref();
        let stored = match target.source {
            // Derived kinds "exist" whenever their Kubernetes object does: a create is a write.
            Source::Pods | Source::Nodes => return self.update_kv(key, value, None).await,
            _ => {
                let body = match self
                    .inner
                    .conv
                    .write_body(&target, key, value, None)
                    .map_err(conv_err)?
                {
                    WriteBody::Object(mut b) => {
                        strip_write_metadata(&mut b, None);
                        b
                    }
                    WriteBody::StatusPatch(_) => {
                        return Err(conv_err(read_only(target.source, key)));
                    }
                };
                self.inner
                    .api
                    .create(&res, ns, &body)
                    .await
                    .map_err(|e| map_err(e, key))?
            }
        };
        self.stored(target.source, key, &stored)
    }

    /// Replaces (compare-and-swap on `expected` when given) the object a key names.
    async fn update_kv(&self, key: &str, value: &[u8], expected: Option<i64>) -> Result<KeyValue> {
        let target = route_key(key).map_err(route_err)?;
        let res = Self::api_of(target.source, key)?;
        let ns = target.namespace.as_deref();
        let api = &self.inner.api;
        // Unconditional writes still need the object, and its current version to write over.
        let live = match (target.source, expected) {
            (Source::Nodes, _) | (_, None) => Some(
                self.fetch(&target, key)
                    .await?
                    .ok_or_else(|| not_found(key))?,
            ),
            _ => None,
        };
        let version = match expected {
            Some(r) => r.to_string(),
            None => live
                .as_ref()
                .and_then(api::resource_version)
                .unwrap_or_default()
                .to_string(),
        };
        if let (Some(r), Some(obj)) = (expected, &live)
            && api::resource_version(obj) != Some(r.to_string().as_str())
        {
            return Err(DatastoreError::Conflict {
                key: key.to_string(),
                expected: r,
                current: api::resource_version(obj).and_then(parse_revision),
            });
        }
        let body = self
            .inner
            .conv
            .write_body(&target, key, value, live.as_ref())
            .map_err(conv_err)?;
        let stored = match body {
            WriteBody::Object(mut b) => {
                strip_write_metadata(&mut b, Some(&version));
                api.replace(&res, ns, &target.name, &b).await
            }
            WriteBody::StatusPatch(mut p) => {
                set_patch_version(&mut p, &version);
                api.merge_patch(&res, ns, &target.name, Some("status"), &p)
                    .await
            }
        };
        let stored = match stored {
            Ok(obj) => obj,
            Err(ApiError::Conflict(_)) => return Err(self.conflict(key, expected).await),
            Err(ApiError::NotFound) => return Err(not_found(key)),
            Err(e) => return Err(map_err(e, key)),
        };
        self.stored(target.source, key, &stored)
    }

    /// A lost compare-and-swap, naming the key's current revision (None: it is gone).
    async fn conflict(&self, key: &str, expected: Option<i64>) -> DatastoreError {
        let current = match self.get_kv(key).await {
            Ok(found) => found.map(|(kv, _)| kv.mod_revision),
            Err(e) => return e,
        };
        match (current, expected) {
            (None, _) => DatastoreError::NotFound {
                key: key.to_string(),
            },
            (current, expected) => DatastoreError::Conflict {
                key: key.to_string(),
                expected: expected.unwrap_or(0),
                current,
            },
        }
    }

    async fn delete_kv(&self, key: &str, expected: Option<i64>) -> Result<KeyValue> {
        let target = route_key(key).map_err(route_err)?;
        let res = Self::api_of(target.source, key)?;
        let ns = target.namespace.as_deref();
        let api = &self.inner.api;
        match target.source {
            Source::Pods => {
                // Calico's CNI DEL: the pod's addresses are cleared; the pod is the kubelet's.
                let (kv, obj) = self.get_kv(key).await?.ok_or_else(|| not_found(key))?;
                if let Some(r) = expected
                    && r != kv.mod_revision
                {
                    return Err(DatastoreError::Conflict {
                        key: key.to_string(),
                        expected: r,
                        current: Some(kv.mod_revision),
                    });
                }
                let uid = obj
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let patch = margay_kdd::pod::workload_endpoint_release_patch(
                    api::resource_version(&obj).unwrap_or_default(),
                    uid,
                );
                api.merge_patch(&res, ns, &target.name, Some("status"), &patch)
                    .await
                    .map_err(|e| map_err(e, key))?;
                Ok(kv)
            }
            Source::Nodes
            | Source::Namespaces
            | Source::ServiceAccounts
            | Source::DefaultAllow
            | Source::K8sNetworkPolicies
            | Source::Services
            | Source::EndpointSlices => Err(conv_err(read_only(target.source, key))),
            _ => {
                // The reply holds the object as it was; without one (a Status), read it first.
                // One that does not convert is deleted all the same (as an undecodable etcd
                // value is): the caller then hears why it could not be read.
                let before = match expected {
                    Some(_) => None,
                    None => match self.get_kv(key).await {
                        Ok(found) => found.map(|(kv, _)| kv),
                        Err(DatastoreError::Invalid { .. }) => None,
                        Err(e) => return Err(e),
                    },
                };
                let reply = match api
                    .delete(&res, ns, &target.name, expected.map(|r| r.to_string()))
                    .await
                {
                    Ok(r) => r,
                    Err(ApiError::Conflict(_)) => return Err(self.conflict(key, expected).await),
                    Err(e) => return Err(map_err(e, key)),
                };
                // API servers differ on the version a DELETE reply carries (the object's last,
                // or the deletion's); the contract returns the last stored value.
                match (reply, before, expected) {
                    (_, Some(kv), _) => Ok(kv),
                    (Some(obj), None, Some(r)) => {
                        let mut kv = self.stored(target.source, key, &obj)?;
                        kv.mod_revision = r;
                        kv.create_revision = r;
                        Ok(kv)
                    }
                    (Some(obj), None, None) => self.stored(target.source, key, &obj),
                    (None, None, _) => Err(not_found(key)),
                }
            }
        }
    }

    /// The key/value an API reply stands for.
    fn stored(&self, source: Source, key: &str, obj: &Value) -> Result<KeyValue> {
        match self.inner.conv.to_kv(source, obj).map_err(conv_err)? {
            Some(kv) => Ok(kv),
            None => Err(DatastoreError::invalid(format!(
                "{key}: the API server's copy no longer stands for this key"
            ))),
        }
    }
}

fn not_found(key: &str) -> DatastoreError {
    DatastoreError::NotFound {
        key: key.to_string(),
    }
}

/// The server owns uid and creationTimestamp; resourceVersion is the precondition.
fn strip_write_metadata(body: &mut Value, version: Option<&str>) {
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("uid");
        meta.remove("creationTimestamp");
        meta.remove("generation");
        meta.remove("managedFields");
        match version {
            Some(v) if !v.is_empty() => {
                meta.insert("resourceVersion".into(), Value::String(v.to_string()));
            }
            _ => {
                meta.remove("resourceVersion");
            }
        }
    }
}

/// A merge patch carrying `metadata.resourceVersion` is conditional on it.
fn set_patch_version(patch: &mut Value, version: &str) {
    if version.is_empty() {
        return;
    }
    if let Some(obj) = patch.as_object_mut() {
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(m) = meta.as_object_mut() {
            m.insert("resourceVersion".into(), Value::String(version.to_string()));
        }
    }
}

impl KvBackend for KubeBackend {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        Ok(self.get_kv(key).await?.map(|(kv, _)| kv))
    }

    async fn list(&self, prefix: &str) -> Result<ListResult> {
        self.list_queries(route_prefix(prefix), &[prefix.to_string()])
            .await
    }

    async fn list_many(&self, prefixes: &[String]) -> Result<ListResult> {
        self.list_queries(queries_of(prefixes), prefixes).await
    }

    async fn create(&self, key: &str, value: Vec<u8>, ttl: Option<Duration>) -> Result<KeyValue> {
        refuse_ttl(key, ttl)?;
        crate::kv::check_value_size(key, &value)?;
        self.create_kv(key, &value).await
    }

    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Option<i64>,
        ttl: Option<Duration>,
    ) -> Result<KeyValue> {
        refuse_ttl(key, ttl)?;
        crate::kv::check_value_size(key, &value)?;
        if expected.is_some() {
            return self.update_kv(key, &value, expected).await;
        }
        // Unconditional: the API writes over a version read first, so a writer in between is
        // a conflict here that etcd would not report; read again and write over it.
        let mut last = None;
        for _ in 0..UNCONDITIONAL_RETRIES {
            match self.update_kv(key, &value, None).await {
                Err(e @ DatastoreError::Conflict { .. }) => last = Some(e),
                other => return other,
            }
        }
        Err(last.unwrap_or_else(|| not_found(key)))
    }

    async fn delete(&self, key: &str, expected: Option<i64>) -> Result<KeyValue> {
        if expected.is_some() {
            return self.delete_kv(key, expected).await;
        }
        let mut last = None;
        for _ in 0..UNCONDITIONAL_RETRIES {
            match self.delete_kv(key, None).await {
                Err(e @ DatastoreError::Conflict { .. }) => last = Some(e),
                other => return other,
            }
        }
        Err(last.unwrap_or_else(|| not_found(key)))
    }

    async fn txn(&self, compares: Vec<Compare>, ops: Vec<TxnOp>) -> Result<TxnResponse> {
        check_txn_ops(&ops)?;
        // 1. Every compare, checked up front and concurrently (so a lost race usually fails
        //    before any write); what they read serves the writes below.
        let mut current: HashMap<String, Option<KeyValue>> = HashMap::new();
        let read = try_join_all(compares.iter().map(|c| self.get(c.key()))).await?;
        for (c, kv) in compares.iter().zip(read) {
            if let Some(e) = c.failure(kv.as_ref().map(|kv| kv.mod_revision)) {
                return Err(e);
            }
            current.insert(c.key().to_string(), kv);
        }
        // 2a. Only reads: all at once (nothing they could see is written in between by us).
        if !ops.iter().any(TxnOp::is_write) {
            let answers = try_join_all(ops.iter().map(|op| async move {
                match op {
                    TxnOp::Get { key } => Ok((TxnOpResult::Get(self.get(key).await?), None)),
                    TxnOp::List { prefix } => {
                        let l = self.list(prefix).await?;
                        Ok((TxnOpResult::List(l.kvs), Some(l.revision)))
                    }
                    _ => Err(DatastoreError::invalid(
                        "a write in a read-only transaction",
                    )),
                }
            }))
            .await?;
            // A list's revision is the store's; without one, ask.
            let listed = answers.iter().filter_map(|(_, r)| *r).max();
            let revision = match listed {
                Some(r) => r,
                None => self.revision().await?,
            };
            let results = answers.into_iter().map(|(r, _)| r).collect();
            return Ok(TxnResponse { revision, results });
        }
        // 2b. The ops in order; each write conditional on its key's compare.
        let mut results = Vec::with_capacity(ops.len());
        let mut undo: Vec<Undo> = Vec::new();
        let mut revision = 0i64;
        for op in &ops {
            let outcome = self.txn_op(op, &compares, &current).await;
            match outcome {
                Ok((result, u)) => {
                    if let TxnOpResult::Put(kv) = &result {
                        revision = revision.max(kv.mod_revision);
                    }
                    undo.extend(u);
                    results.push(result);
                }
                Err(e) => {
                    self.roll_back(undo).await;
                    return Err(e);
                }
            }
        }
        // Deletes answer with the object as it was: ask for the revision after them.
        if revision == 0 || ops.iter().any(|o| matches!(o, TxnOp::Delete { .. })) {
            revision = revision.max(self.revision().await?);
        }
        Ok(TxnResponse { revision, results })
    }

    async fn watch(&self, prefix: &str, after_revision: i64) -> Result<Watch> {
        self.watch_queries(
            route_prefix(prefix),
            vec![prefix.to_string()],
            after_revision,
        )
        .await
    }

    async fn watch_many(&self, prefixes: &[String], after_revision: i64) -> Result<Watch> {
        self.watch_queries(queries_of(prefixes), prefixes.to_vec(), after_revision)
            .await
    }

    async fn compact(&self, _revision: i64) -> Result<()> {
        Err(DatastoreError::invalid(
            "the Kubernetes datastore is compacted by the API server's etcd, not by margay",
        ))
    }

    async fn revision(&self) -> Result<i64> {
        let rv = self
            .inner
            .api
            .current_revision(&NAMESPACES)
            .await
            .map_err(|e| map_err(e, "namespaces"))?;
        parse_revision(&rv).ok_or_else(|| bad_revision(&rv, "namespaces"))
    }
}

/// The queries of several prefixes, without repeats.
fn queries_of(prefixes: &[String]) -> Vec<Query> {
    let mut qs: Vec<Query> = prefixes.iter().flat_map(|p| route_prefix(p)).collect();
    qs.sort();
    qs.dedup();
    qs
}

fn refuse_ttl(key: &str, ttl: Option<Duration>) -> Result<()> {
    match ttl {
        Some(_) => Err(DatastoreError::invalid(format!(
            "{key}: keys with a time to live are not supported by the Kubernetes datastore"
        ))),
        None => Ok(()),
    }
}

/// How to take back one write of a failed transaction.
enum Undo {
    /// It was created: delete it (if still at the version written).
    Delete { key: String, revision: i64 },
    /// It was replaced or deleted: put the old value back.
    Restore {
        key: String,
        old: KeyValue,
        written: Option<i64>,
    },
}

impl KubeBackend {
    async fn txn_op(
        &self,
        op: &TxnOp,
        compares: &[Compare],
        current: &HashMap<String, Option<KeyValue>>,
    ) -> Result<(TxnOpResult, Option<Undo>)> {
        let compare = |key: &str| compares.iter().find(|c| c.key() == key);
        match op {
            TxnOp::Get { key } => Ok((TxnOpResult::Get(self.get(key).await?), None)),
            TxnOp::List { prefix } => Ok((TxnOpResult::List(self.list(prefix).await?.kvs), None)),
            TxnOp::Put { key, value } => {
                let old = match current.get(key.as_str()) {
                    Some(known) => known.clone(),
                    None => self.get(key).await?,
                };
                let kv = match (compare(key), &old) {
                    (Some(Compare::Absent(_)), _) | (None, None) => {
                        self.create_kv(key, value).await?
                    }
                    (Some(Compare::ModRevision(_, r)), _) => {
                        self.update_kv(key, value, Some(*r)).await?
                    }
                    (Some(Compare::Exists(_)), Some(o)) | (None, Some(o)) => {
                        self.update_kv(key, value, Some(o.mod_revision)).await?
                    }
                    (Some(Compare::Exists(_)), None) => {
                        return Err(DatastoreError::NotFound { key: key.clone() });
                    }
                };
                let undo = match old {
                    None => Undo::Delete {
                        key: key.clone(),
                        revision: kv.mod_revision,
                    },
                    Some(o) => Undo::Restore {
                        key: key.clone(),
                        old: o,
                        written: Some(kv.mod_revision),
                    },
                };
                Ok((TxnOpResult::Put(kv), Some(undo)))
            }
            TxnOp::Delete { key } => {
                let expected = match compare(key) {
                    Some(Compare::ModRevision(_, r)) => Some(*r),
                    _ => None,
                };
                match self.delete_kv(key, expected).await {
                    Ok(old) => Ok((
                        TxnOpResult::Delete(Some(old.clone())),
                        Some(Undo::Restore {
                            key: key.clone(),
                            old,
                            written: None,
                        }),
                    )),
                    Err(DatastoreError::NotFound { .. }) if expected.is_none() => {
                        Ok((TxnOpResult::Delete(None), None))
                    }
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Takes back the writes of a failed transaction, newest first, each only if nobody wrote
    /// the key since (compare-and-swap). What cannot be undone is logged: IPAM's check and
    /// garbage collection find the leftovers, as in Calico's Kubernetes datastore.
    async fn roll_back(&self, undo: Vec<Undo>) {
        for u in undo.into_iter().rev() {
            let outcome = match &u {
                Undo::Delete { key, revision } => {
                    self.delete_kv(key, Some(*revision)).await.map(|_| ())
                }
                Undo::Restore {
                    key,
                    old,
                    written: Some(r),
                } => self.update_kv(key, &old.value, Some(*r)).await.map(|_| ()),
                Undo::Restore {
                    key,
                    old,
                    written: None,
                } => self.create_kv(key, &old.value).await.map(|_| ()),
            };
            if let Err(e) = outcome {
                let key = match &u {
                    Undo::Delete { key, .. } | Undo::Restore { key, .. } => key,
                };
                tracing::error!(key = %key, error = %e, "could not undo a write of a failed transaction (the Kubernetes datastore has no multi-object transactions)");
            }
        }
    }
}

mod connect {
    //! A kube-rs client configuration from Calico's settings.

    use kube::config::{KubeConfigOptions, Kubeconfig};

    use crate::config::KubeSettings;
    use crate::error::{DatastoreError, Result};

    fn invalid(what: impl std::fmt::Display) -> DatastoreError {
        DatastoreError::invalid(what)
    }

    /// Calico's precedence: an inline kubeconfig, else the KUBECONFIG files (first wins), else
    /// `$HOME/.kube/config`, else the in-cluster service account; then K8S_* overrides.
    pub async fn config(s: &KubeSettings) -> Result<kube::Config> {
        let opts = KubeConfigOptions {
            context: s.current_context.clone(),
            ..Default::default()
        };
        let kubeconfig = if let Some(text) = &s.kubeconfig_inline {
            Some(
                Kubeconfig::from_yaml(text)
                    .map_err(|e| invalid(format!("kubeconfigInline: {e}")))?,
            )
        } else if !s.kubeconfig.is_empty() {
            let mut merged: Option<Kubeconfig> = None;
            for path in &s.kubeconfig {
                if !path.exists() && s.kubeconfig.len() > 1 {
                    continue; // a missing file in a precedence list is skipped, as kubectl does
                }
                let k = Kubeconfig::read_from(path).map_err(|e| {
                    invalid(format!(
                        "KUBECONFIG {}: {e} (is the path right?)",
                        path.display()
                    ))
                })?;
                merged = Some(match merged {
                    None => k,
                    Some(m) => m
                        .merge(k)
                        .map_err(|e| invalid(format!("KUBECONFIG: {e}")))?,
                });
            }
            merged
        } else if let Some(home) = std::env::var_os("HOME") {
            let path = std::path::Path::new(&home).join(".kube/config");
            if path.exists() {
                Some(
                    Kubeconfig::read_from(&path)
                        .map_err(|e| invalid(format!("{}: {e}", path.display())))?,
                )
            } else {
                None
            }
        } else {
            None
        };
        let mut config = match kubeconfig {
            Some(k) => kube::Config::from_custom_kubeconfig(k, &opts)
                .await
                .map_err(|e| invalid(format!("kubeconfig: {e}")))?,
            None if s.api_endpoint.is_some() => {
                let url = s.api_endpoint.as_deref().unwrap_or_default();
                kube::Config::new(url.parse().map_err(|e| {
                    invalid(format!("K8S_API_ENDPOINT {url:?}: {e}"))
                })?)
            }
            None => kube::Config::incluster().map_err(|e| {
                invalid(format!(
                    "no kubeconfig (set KUBECONFIG, or kubeconfig in the config file) and not running in a pod: {e}"
                ))
            })?,
        };
        if let Some(url) = &s.api_endpoint {
            config.cluster_url = url
                .parse()
                .map_err(|e| invalid(format!("K8S_API_ENDPOINT {url:?}: {e}")))?;
        }
        if let Some(ca) = &s.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| invalid(format!("K8S_CA_FILE {}: {e}", ca.display())))?;
            config.root_cert = Some(
                pem_certificates(&pem)
                    .map_err(|e| invalid(format!("K8S_CA_FILE {}: {e}", ca.display())))?,
            );
        }
        if s.insecure_skip_tls_verify {
            config.accept_invalid_certs = true;
        }
        if let Some(token) = &s.token {
            config.auth_info.token = Some(token.clone().into());
        }
        if let (Some(cert), Some(key)) = (&s.cert_file, &s.key_file) {
            config.auth_info.client_certificate = Some(cert.display().to_string());
            config.auth_info.client_key = Some(key.display().to_string());
        }
        Ok(config)
    }

    /// The DER certificates of a PEM bundle.
    fn pem_certificates(pem: &[u8]) -> std::result::Result<Vec<Vec<u8>>, String> {
        let text = std::str::from_utf8(pem).map_err(|_| "not PEM text".to_string())?;
        let mut out = Vec::new();
        let mut inside: Option<String> = None;
        for line in text.lines() {
            let line = line.trim();
            if line == "-----BEGIN CERTIFICATE-----" {
                inside = Some(String::new());
            } else if line == "-----END CERTIFICATE-----" {
                let b64 = inside.take().ok_or("END without BEGIN")?;
                use base64::Engine as _;
                let der = base64::engine::general_purpose::STANDARD
                    .decode(b64.as_bytes())
                    .map_err(|e| format!("bad base64: {e}"))?;
                out.push(der);
            } else if let Some(buf) = inside.as_mut() {
                buf.push_str(line);
            }
        }
        if out.is_empty() {
            return Err("no certificate found".into());
        }
        Ok(out)
    }
}
