//! The object store: every object as JSON (and its serialized bytes), one global revision
//! counter with etcd semantics, and a bounded event history that watches read from. All
//! writes go through [`State`] under one lock, so HTTP and [`crate::StoreHandle`] writes have
//! the same semantics.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::patch::{self, PatchError};
use crate::resources::{ResourceDef, crd_to_def, gr_key};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::{ApiError, Cause};
use crate::util;

/// One stored object version: the value and its JSON bytes (serialized once, shared by every
/// list page and watch event that carries it).
#[derive(Debug)]
pub struct Stored {
    pub value: Value,
    pub json: Bytes,
    pub rv: u64,
}

pub type Obj = Arc<Stored>;

impl Stored {
    pub fn new(value: Value, rv: u64) -> Obj {
        let json = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        Arc::new(Stored { value, json, rv })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One write. Every revision has exactly one event, so history positions are `rv - first`.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub gr: Arc<str>,
    pub ns: String,
    pub etype: EventType,
    /// The object after the write (for deletions: its last state, at the deletion revision).
    pub obj: Obj,
    /// The object before the write (none for creations).
    pub prev: Option<Obj>,
}

pub type Key = (String, String);

#[derive(Debug)]
pub struct Collection {
    pub def: Arc<ResourceDef>,
    pub gr: Arc<str>,
    pub objects: BTreeMap<Key, Obj>,
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sub {
    Main,
    Status,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<PatchType> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml"
            | "application/apply-patch+json"
            | "application/apply-patch+cbor" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

/// Options of one write.
#[derive(Debug, Clone, Default)]
pub struct WriteOpts {
    pub dry_run: bool,
    /// Keep `status` on create even where the real server resets it (direct store access only).
    pub keep_status: bool,
    /// The version the request used (objects are answered in it).
    pub version: String,
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    pub dry_run: bool,
    pub uid: Option<String>,
    pub rv: Option<String>,
    pub grace_seconds: Option<i64>,
}

/// Which revision a list reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RvMatch {
    /// Most recent (also `NotOlderThan` and legacy `resourceVersion=N`, which we always satisfy
    /// with the current state once it is at least N).
    #[default]
    Latest,
    /// State exactly at this revision (from history), or 410.
    Exact(u64),
}

#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub ns: Option<String>,
    pub label: LabelSelector,
    pub field: FieldSelector,
    pub limit: Option<usize>,
    pub cont: Option<String>,
    pub rv: RvMatch,
}

#[derive(Debug)]
pub struct ListResult {
    pub items: Vec<Obj>,
    pub rv: u64,
    pub cont: Option<String>,
    pub remaining: Option<u64>,
}

pub const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// The whole store.
#[derive(Debug)]
pub struct State {
    pub rv: u64,
    /// History holds every event with `floor < rv <= self.rv`.
    pub floor: u64,
    pub history: VecDeque<Arc<Event>>,
    pub history_cap: usize,
    pub resources: BTreeMap<String, Collection>,
    /// Resource keys in discovery order: built-ins, then CRDs as created.
    pub order: Vec<String>,
    /// Bumped whenever the set of served resources changes (discovery and OpenAPI hashes).
    pub registry_gen: u64,
    /// ClusterIPs and NodePorts handed out (kept by `commit`).
    pub services: crate::services::Allocator,
    pub pods_graceful: bool,
}

pub struct WatchStart {
    pub initial: Vec<Obj>,
    pub next_rv: u64,
    pub def: Arc<ResourceDef>,
}

mod read;
mod write;

fn meta(v: &Value) -> Option<&Map<String, Value>> {
    v.get("metadata").and_then(Value::as_object)
}

fn meta_str<'a>(v: &'a Value, field: &str) -> &'a str {
    meta(v)
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn meta_mut(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    if !v.get("metadata").is_some_and(Value::is_object) {
        v["metadata"] = Value::Object(Map::new());
    }
    match v.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        // Both were made objects just above.
        _ => unreachable!("metadata is an object"),
    }
}

pub fn name_of(v: &Value) -> &str {
    meta_str(v, "name")
}

fn finalizers(v: &Value) -> usize {
    meta(v)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

/// Everything that is not metadata, status or type information.
fn spec_part(v: &Value) -> Map<String, Value> {
    v.as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fn encode_continue(rv: u64, key: &Key) -> String {
    use base64::Engine;
    let t = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{}/{}\u{0}", key.0, key.1)});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(t.to_string())
}

fn decode_continue(tok: &str) -> Result<(u64, Key), ApiError> {
    use base64::Engine;
    let bad = |why: &str| ApiError::bad_request(format!("continue key is not valid: {why}"));
    if tok.len() > 4096 {
        return Err(bad("too long"));
    }
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(tok.trim_end_matches('='))
        .map_err(|_| bad("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))?;
    let v: Value = serde_json::from_slice(&raw)
        .map_err(|_| bad("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))?;
    if v.get("v").and_then(Value::as_str) != Some("meta.k8s.io/v1") {
        return Err(bad("server does not recognize this encoded version"));
    }
    let rv = v
        .get("rv")
        .and_then(Value::as_u64)
        .filter(|r| *r > 0)
        .ok_or_else(|| bad("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))?;
    let start = v
        .get("start")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing start"))?;
    let start = start.strip_suffix('\u{0}').unwrap_or(start);
    let (ns, name) = start.split_once('/').ok_or_else(|| bad("bad start key"))?;
    Ok((rv, (ns.to_string(), name.to_string())))
}

/// Parses a `resourceVersion` parameter: "" → None, else a decimal.
pub fn parse_rv(s: &str) -> Result<Option<u64>, ApiError> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse::<u64>()
        .map(Some)
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))
}

impl State {
    pub fn new(history_cap: usize, pods_graceful: bool) -> State {
        let mut s = State {
            rv: 0,
            floor: 0,
            history: VecDeque::new(),
            history_cap: history_cap.max(1),
            resources: BTreeMap::new(),
            order: Vec::new(),
            registry_gen: 1,
            services: crate::services::Allocator::new(
                (0x0a60_0000, 12),
                crate::services::DEFAULT_NODE_PORTS,
            ),
            pods_graceful,
        };
        for def in crate::resources::builtins() {
            s.register(def);
        }
        let opts = WriteOpts {
            keep_status: true,
            ..WriteOpts::default()
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let _ = s.create(
                "/namespaces",
                "",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                &opts,
            );
        }
        s
    }

    fn register(&mut self, def: ResourceDef) {
        let key = def.key();
        let gr: Arc<str> = Arc::from(key.as_str());
        let def = Arc::new(def);
        match self.resources.get_mut(&key) {
            Some(c) => c.def = def,
            None => {
                self.resources.insert(
                    key.clone(),
                    Collection {
                        def,
                        gr,
                        objects: BTreeMap::new(),
                    },
                );
                self.order.push(key);
            }
        }
        self.registry_gen += 1;
    }

    /// The collection serving `group/version/plural`, or the real server's 404.
    pub fn lookup(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Result<&Collection, ApiError> {
        match self.resources.get(&gr_key(group, plural)) {
            Some(c) if c.def.versions.iter().any(|v| v == version) => Ok(c),
            _ => Err(ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )),
        }
    }

    pub fn find_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceDef>> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        self.resources
            .values()
            .find(|c| {
                c.def.kind == kind
                    && c.def.group == group
                    && c.def.versions.iter().any(|v| v == version)
            })
            .map(|c| c.def.clone())
    }

    fn def(&self, key: &str) -> Result<Arc<ResourceDef>, ApiError> {
        self.resources
            .get(key)
            .map(|c| c.def.clone())
            .ok_or_else(|| {
                ApiError::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                )
            })
    }

    pub fn get(&self, key: &str, ns: &str, name: &str) -> Result<Obj, ApiError> {
        let c = self.resources.get(key).ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        })?;
        c.objects
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&c.def.ctx(), name))
    }

    fn namespace_exists(&self, ns: &str) -> bool {
        self.resources
            .get("/namespaces")
            .is_some_and(|c| c.objects.contains_key(&(String::new(), ns.to_string())))
    }

    /// Records a write: assigns the next revision, stores or removes, appends the event.
    fn commit(
        &mut self,
        key: &str,
        ns: &str,
        name: &str,
        etype: EventType,
        mut value: Value,
        prev: Option<Obj>,
    ) -> Obj {
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut value).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let obj = Stored::new(value, rv);
        let gr = match self.resources.get_mut(key) {
            Some(c) => {
                let k = (ns.to_string(), name.to_string());
                if key == crate::services::SERVICES_KEY {
                    let old = c.objects.get(&k).map(|o| &o.value);
                    let new = (etype != EventType::Deleted).then_some(&obj.value);
                    self.services.on_commit(old, new);
                }
                if etype == EventType::Deleted {
                    c.objects.remove(&k);
                } else {
                    c.objects.insert(k, obj.clone());
                }
                c.gr.clone()
            }
            None => Arc::from(key),
        };
        self.history.push_back(Arc::new(Event {
            rv,
            gr,
            ns: ns.to_string(),
            etype,
            obj: obj.clone(),
            prev,
        }));
        while self.history.len() > self.history_cap {
            if let Some(e) = self.history.pop_front() {
                self.floor = e.rv;
            }
        }
        obj
    }

    /// Simulated etcd compaction at the current revision: older revisions are gone.
    pub fn compact(&mut self) {
        self.history.clear();
        self.floor = self.rv;
    }

    /// Checks apiVersion/kind against the resource (filling them in when absent).
    fn normalize_type(def: &ResourceDef, version: &str, obj: &mut Value) -> Result<(), ApiError> {
        let Some(m) = obj.as_object_mut() else {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        };
        let want_av = def.api_version(version);
        match m.get("apiVersion").and_then(Value::as_str) {
            None | Some("") => {
                m.insert("apiVersion".into(), Value::String(want_av));
            }
            Some(av) if av == want_av => {}
            Some(av) if def.versions.iter().any(|v| def.api_version(v) == av) => {
                m.insert("apiVersion".into(), Value::String(want_av));
            }
            Some(av) => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({want_av})"
                )));
            }
        }
        match m.get("kind").and_then(Value::as_str) {
            None | Some("") => {
                m.insert("kind".into(), Value::String(def.kind.clone()));
            }
            Some(k) if k == def.kind => {}
            Some(k) => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    def.kind
                )));
            }
        }
        Ok(())
    }

    /// Objects in every collection, for the memory report and tests.
    pub fn object_count(&self) -> usize {
        self.resources.values().map(|c| c.objects.len()).sum()
    }
}

#[cfg(test)]
mod tests;
