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
    next_cluster_ip: u32,
    pub pods_graceful: bool,
}

pub struct WatchStart {
    pub initial: Vec<Obj>,
    pub next_rv: u64,
    pub def: Arc<ResourceDef>,
}

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
            next_cluster_ip: 1,
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

    fn validate(&self, def: &ResourceDef, obj: &Value, name: &str) -> Result<(), ApiError> {
        let mut causes = Vec::new();
        let name_ok = match def.kind.as_str() {
            "Namespace" => util::is_dns1123_label(name),
            "Service" => util::is_dns1035_label(name),
            _ => util::is_dns1123_subdomain(name),
        };
        if !name_ok {
            let what = match def.kind.as_str() {
                "Namespace" => {
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"
                }
                "Service" => {
                    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character"
                }
                _ => {
                    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                }
            };
            causes.push(Cause::invalid("metadata.name", name, what));
        }
        if let Some(labels) = meta(obj).and_then(|m| m.get("labels")) {
            match labels.as_object() {
                Some(l) => {
                    for (k, v) in l {
                        if !crate::selector::valid_label_key(k) {
                            causes.push(Cause::invalid("metadata.labels", k, "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"));
                        }
                        match v.as_str() {
                            Some(s) if crate::selector::valid_label_value(s) => {}
                            _ => causes.push(Cause::invalid("metadata.labels".to_string(), &v.to_string(), "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")),
                        }
                    }
                }
                None if labels.is_null() => {}
                None => causes.push(Cause::invalid(
                    "metadata.labels",
                    "",
                    "must be a map of strings",
                )),
            }
        }
        if let Some(a) = meta(obj).and_then(|m| m.get("annotations"))
            && !a.is_null()
            && !a
                .as_object()
                .is_some_and(|m| m.values().all(Value::is_string))
        {
            causes.push(Cause::invalid(
                "metadata.annotations",
                "",
                "must be a map of strings",
            ));
        }
        match def.kind.as_str() {
            "Pod" if def.builtin => {
                let containers = obj.pointer("/spec/containers").and_then(Value::as_array);
                match containers {
                    None => causes.push(Cause::required("spec.containers", "")),
                    Some(cs) if cs.is_empty() => {
                        causes.push(Cause::required("spec.containers", ""))
                    }
                    Some(cs) => {
                        for (i, c) in cs.iter().enumerate() {
                            if c.get("name")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .is_empty()
                            {
                                causes.push(Cause::required(
                                    format!("spec.containers[{i}].name"),
                                    "",
                                ));
                            }
                            if c.get("image")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .is_empty()
                            {
                                causes.push(Cause::required(
                                    format!("spec.containers[{i}].image"),
                                    "",
                                ));
                            }
                        }
                    }
                }
            }
            "CustomResourceDefinition" if def.builtin => {
                if let Err(c) = crd_to_def(obj) {
                    causes.extend(c);
                }
            }
            _ => {}
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(&def.ctx(), name, causes))
        }
    }

    /// The defaults and status resets the real server's create strategies apply.
    fn prepare_create(
        &mut self,
        def: &ResourceDef,
        obj: &mut Value,
        name: &str,
        keep_status: bool,
    ) {
        if def.status
            && !keep_status
            && def.kind != "Node"
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        if !def.builtin {
            return;
        }
        match def.kind.as_str() {
            "Namespace" => {
                let m = meta_mut(obj);
                let labels = m.entry("labels").or_insert_with(|| json!({}));
                if labels.is_object() {
                    labels["kubernetes.io/metadata.name"] = json!(name);
                }
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
                obj["status"] = json!({"phase": "Active"});
            }
            "Pod" => {
                if obj.pointer("/status/phase").is_none() {
                    if !obj.get("status").is_some_and(Value::is_object) {
                        obj["status"] = json!({});
                    }
                    obj["status"]["phase"] = json!("Pending");
                }
                if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.entry("restartPolicy").or_insert(json!("Always"));
                    spec.entry("dnsPolicy").or_insert(json!("ClusterFirst"));
                    spec.entry("schedulerName")
                        .or_insert(json!("default-scheduler"));
                    spec.entry("terminationGracePeriodSeconds")
                        .or_insert(json!(30));
                }
            }
            "Service" => {
                if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                    let ty = spec
                        .entry("type")
                        .or_insert(json!("ClusterIP"))
                        .as_str()
                        .unwrap_or("")
                        .to_string();
                    spec.entry("sessionAffinity").or_insert(json!("None"));
                    if ty != "ExternalName"
                        && spec
                            .get("clusterIP")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .is_empty()
                    {
                        // 10.96.0.0/12, handed out in order like a fresh cluster's allocator.
                        let n = self.next_cluster_ip;
                        self.next_cluster_ip = self.next_cluster_ip.wrapping_add(1) % (1 << 20);
                        let ip = (10u32 << 24 | 96 << 16) + n;
                        let s = format!(
                            "{}.{}.{}.{}",
                            ip >> 24,
                            (ip >> 16) & 255,
                            (ip >> 8) & 255,
                            ip & 255
                        );
                        spec.insert("clusterIP".into(), json!(s));
                        spec.insert("clusterIPs".into(), json!([s]));
                    }
                    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
                        for p in ports {
                            if let Some(pm) = p.as_object_mut() {
                                pm.entry("protocol").or_insert(json!("TCP"));
                                if let Some(port) = pm.get("port").cloned() {
                                    pm.entry("targetPort").or_insert(port);
                                }
                            }
                        }
                    }
                }
                if obj.get("status").is_none() {
                    obj["status"] = json!({"loadBalancer": {}});
                }
            }
            "CustomResourceDefinition" => {
                let names = obj.pointer("/spec/names").cloned().unwrap_or(json!({}));
                let stored: Vec<Value> = obj
                    .pointer("/spec/versions")
                    .and_then(Value::as_array)
                    .map(|vs| {
                        vs.iter()
                            .filter(|v| v.get("storage") == Some(&json!(true)))
                            .filter_map(|v| v.get("name").cloned())
                            .collect()
                    })
                    .unwrap_or_default();
                let now = util::rfc3339(util::now_secs());
                obj["status"] = json!({
                    "acceptedNames": names,
                    "storedVersions": stored,
                    "conditions": [
                        {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
                        {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
                    ],
                });
            }
            _ => {}
        }
    }

    /// POST: a new object (201 on success).
    pub fn create(
        &mut self,
        key: &str,
        ns: &str,
        mut obj: Value,
        opts: &WriteOpts,
    ) -> Result<Obj, ApiError> {
        let def = self.def(key)?;
        let version = if opts.version.is_empty() {
            def.version().to_string()
        } else {
            opts.version.clone()
        };
        Self::normalize_type(&def, &version, &mut obj)?;
        let m = meta_mut(&mut obj);
        if def.namespaced {
            match m.get("namespace").and_then(Value::as_str) {
                None | Some("") => {
                    m.insert("namespace".into(), json!(ns));
                }
                Some(x) if x == ns => {}
                Some(_) => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
            }
        } else {
            m.remove("namespace");
        }
        let mut name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            let gen_name = m
                .get("generateName")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if gen_name.is_empty() {
                return Err(ApiError::invalid(
                    &def.ctx(),
                    "",
                    vec![Cause::required(
                        "metadata.name",
                        "name or generateName is required",
                    )],
                ));
            }
            name = format!("{gen_name}{}", util::name_suffix());
            m.insert("name".into(), json!(name));
        }
        for f in [
            "uid",
            "resourceVersion",
            "selfLink",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "creationTimestamp",
        ] {
            m.remove(f);
        }
        m.insert("uid".into(), json!(util::uuid_v4()));
        m.insert(
            "creationTimestamp".into(),
            json!(util::rfc3339(util::now_secs())),
        );
        if def.has_generation() {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
        if def.namespaced && !self.namespace_exists(ns) {
            return Err(ApiError::namespace_not_found(ns));
        }
        self.validate(&def, &obj, &name)?;
        let k = (
            if def.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name.clone(),
        );
        if self
            .resources
            .get(key)
            .is_some_and(|c| c.objects.contains_key(&k))
        {
            return Err(ApiError::already_exists(&def.ctx(), &name));
        }
        self.prepare_create(&def, &mut obj, &name, opts.keep_status);
        let new_def = if def.kind == "CustomResourceDefinition" && def.builtin {
            let nd = crd_to_def(&obj).map_err(|c| ApiError::invalid(&def.ctx(), &name, c))?;
            if self.resources.get(&nd.key()).is_some_and(|c| c.def.builtin) {
                return Err(ApiError::invalid(
                    &def.ctx(),
                    &name,
                    vec![Cause::invalid(
                        "spec.names.plural",
                        &nd.plural,
                        "is already served by a built-in resource",
                    )],
                ));
            }
            Some(nd)
        } else {
            None
        };
        if opts.dry_run {
            return Ok(Stored::new(obj, self.rv));
        }
        let out = self.commit(key, &k.0, &k.1, EventType::Added, obj, None);
        if let Some(nd) = new_def {
            self.register(nd);
        }
        Ok(out)
    }

    /// PUT (and the second half of PATCH): replaces an object, subject to preconditions.
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        key: &str,
        ns: &str,
        name: &str,
        mut obj: Value,
        sub: Sub,
        opts: &WriteOpts,
        from_patch: bool,
    ) -> Result<Obj, ApiError> {
        let def = self.def(key)?;
        let old = self.get(key, ns, name)?;
        let version = if opts.version.is_empty() {
            def.version().to_string()
        } else {
            opts.version.clone()
        };
        Self::normalize_type(&def, &version, &mut obj)?;
        let body_name = meta_str(&obj, "name").to_string();
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if def.namespaced {
            let bns = meta_str(&obj, "namespace").to_string();
            if bns.is_empty() {
                meta_mut(&mut obj).insert("namespace".into(), json!(ns));
            } else if bns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        } else {
            meta_mut(&mut obj).remove("namespace");
        }
        let body_rv = meta_str(&obj, "resourceVersion").to_string();
        let old_rv = meta_str(&old.value, "resourceVersion").to_string();
        if !body_rv.is_empty() && body_rv != old_rv {
            return Err(ApiError::modified(&def.ctx(), name));
        }
        if body_rv.is_empty() && !def.builtin && !from_patch {
            return Err(ApiError::invalid(
                &def.ctx(),
                name,
                vec![Cause {
                    reason: "FieldValueInvalid",
                    field: "metadata.resourceVersion".into(),
                    message: "Invalid value: 0x0: must be specified for an update".into(),
                }],
            ));
        }
        let old_uid = meta_str(&old.value, "uid").to_string();
        let body_uid = meta_str(&obj, "uid").to_string();
        if !body_uid.is_empty() && body_uid != old_uid {
            return Err(ApiError::conflict(
                &def.ctx(),
                name,
                &format!(
                    "Precondition failed: UID in precondition: {body_uid}, UID in object meta: {old_uid}"
                ),
            ));
        }
        // What the write may change.
        let mut new = match sub {
            Sub::Main => {
                let mut n = obj;
                if def.status {
                    match old.value.get("status") {
                        Some(s) if n.get("status") == Some(s) => {}
                        Some(s) => n["status"] = s.clone(),
                        None => {
                            if let Some(m) = n.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
                n
            }
            Sub::Status if def.builtin => {
                // Built-in status strategies keep the new metadata (Calico writes Node and Pod
                // annotations through status) but never the spec.
                let mut n = old.value.clone();
                if let (Some(nm), Some(src)) = (n.as_object_mut(), obj.as_object()) {
                    for (k, v) in src {
                        if k == "metadata" || k == "status" {
                            nm.insert(k.clone(), v.clone());
                        }
                    }
                    if !src.contains_key("status") {
                        nm.remove("status");
                    }
                }
                n
            }
            Sub::Status => {
                let mut n = old.value.clone();
                match obj.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        if let Some(m) = n.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                n
            }
        };
        {
            let empty = Map::new();
            let om = meta(&old.value).unwrap_or(&empty);
            let m = meta_mut(&mut new);
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
                "name",
            ] {
                match om.get(f) {
                    Some(v) if m.get(f) == Some(v) => {}
                    Some(v) => {
                        m.insert(f.into(), v.clone());
                    }
                    None => {
                        m.remove(f);
                    }
                }
            }
            m.remove("managedFields");
            m.remove("selfLink");
            m.insert("resourceVersion".into(), json!(old_rv));
        }
        if meta(&old.value).is_some_and(|m| m.contains_key("deletionTimestamp")) {
            let old_f: Vec<Value> = meta(&old.value)
                .and_then(|m| m.get("finalizers"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let new_f: Vec<Value> = meta(&new)
                .and_then(|m| m.get("finalizers"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if new_f.iter().any(|f| !old_f.contains(f)) {
                return Err(ApiError::invalid(
                    &def.ctx(),
                    name,
                    vec![Cause {
                        reason: "FieldValueForbidden",
                        field: "metadata.finalizers".into(),
                        message: "Forbidden: no new finalizers can be added if the object is being deleted".into(),
                    }],
                ));
            }
        }
        self.validate(&def, &new, name)?;
        if def.has_generation() && spec_part(&new) != spec_part(&old.value) {
            let g = meta(&old.value)
                .and_then(|m| m.get("generation"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut new).insert("generation".into(), json!(g + 1));
        }
        let new_def = if def.kind == "CustomResourceDefinition" && def.builtin {
            let nd = crd_to_def(&new).map_err(|c| ApiError::invalid(&def.ctx(), name, c))?;
            if nd.key() != crd_to_def(&old.value).map(|d| d.key()).unwrap_or_default() {
                return Err(ApiError::invalid(
                    &def.ctx(),
                    name,
                    vec![Cause::invalid(
                        "spec.group",
                        &nd.group,
                        "field is immutable",
                    )],
                ));
            }
            Some(nd)
        } else {
            None
        };
        // An update that changes nothing writes nothing (etcd's GuaranteedUpdate).
        if new == old.value {
            return Ok(old);
        }
        if opts.dry_run {
            return Ok(Stored::new(new, old.rv));
        }
        let k = (
            if def.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name.to_string(),
        );
        if meta(&new).is_some_and(|m| m.contains_key("deletionTimestamp")) && finalizers(&new) == 0
        {
            return Ok(self.remove(key, &k, new, Some(old)));
        }
        let out = self.commit(key, &k.0, &k.1, EventType::Modified, new, Some(old));
        if let Some(nd) = new_def
            && self.resources.get(&nd.key()).is_some_and(|c| *c.def != nd)
        {
            self.register(nd);
        }
        Ok(out)
    }

    /// PATCH. Returns the object and whether it was created (server-side apply).
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        key: &str,
        ns: &str,
        name: &str,
        ptype: PatchType,
        patch: &Value,
        sub: Sub,
        opts: &WriteOpts,
    ) -> Result<(Obj, bool), ApiError> {
        let def = self.def(key)?;
        if ptype == PatchType::Strategic && !def.builtin {
            return Err(ApiError::unsupported_media_type(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        let old = match self.get(key, ns, name) {
            Ok(o) => o,
            Err(e) if e.code == 404 && ptype == PatchType::Apply && sub == Sub::Main => {
                let mut obj = patch.clone();
                if !obj.is_object() {
                    return Err(ApiError::bad_request(
                        "the body of the request must be a JSON object",
                    ));
                }
                let bn = meta_str(&obj, "name").to_string();
                if !bn.is_empty() && bn != name {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({bn}) does not match the name on the URL ({name})"
                    )));
                }
                meta_mut(&mut obj).insert("name".into(), json!(name));
                return self.create(key, ns, obj, opts).map(|o| (o, true));
            }
            Err(e) => return Err(e),
        };
        let mut cur = old.value.clone();
        let res = match ptype {
            PatchType::Merge => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request(
                        "json: cannot unmarshal into a merge patch: the patch must be a JSON object",
                    ));
                }
                patch::merge_patch(&mut cur, patch);
                Ok(())
            }
            PatchType::Json => patch::json_patch(&mut cur, patch),
            PatchType::Strategic => patch::strategic_merge(&mut cur, patch, &def.kind),
            PatchType::Apply => {
                let av = patch
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let kd = patch.get("kind").and_then(Value::as_str).unwrap_or("");
                if av.is_empty() || kd.is_empty() {
                    return Err(ApiError::bad_request(
                        "apiVersion and kind must be set in an apply patch",
                    ));
                }
                patch::apply_merge(&mut cur, patch, def.builtin, &def.kind)
            }
        };
        match res {
            Ok(()) => {}
            Err(PatchError::Bad(m)) => return Err(ApiError::bad_request(m)),
            Err(PatchError::Unapplicable(m)) => return Err(ApiError::new(422, "Invalid", m)),
        }
        if !cur.is_object() {
            return Err(ApiError::bad_request(
                "the patched object is not a JSON object",
            ));
        }
        let prv = meta_str(&cur, "resourceVersion").to_string();
        if !prv.is_empty() && prv != meta_str(&old.value, "resourceVersion") {
            return Err(ApiError::modified(&def.ctx(), name));
        }
        let bn = meta_str(&cur, "name").to_string();
        if bn != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({bn}) does not match the name on the URL ({name})"
            )));
        }
        self.update(key, ns, name, cur, sub, opts, true)
            .map(|o| (o, false))
    }

    /// Removes an object for good (the DELETED event carries its last state).
    fn remove(&mut self, key: &str, k: &Key, last: Value, prev: Option<Obj>) -> Obj {
        let def = self.resources.get(key).map(|c| c.def.clone());
        // Deleting a namespace deletes its objects; deleting a CRD, its custom resources.
        if let Some(def) = &def {
            if def.builtin && def.kind == "Namespace" {
                let keys: Vec<String> = self.order.clone();
                for rk in keys {
                    let victims: Vec<Key> = match self.resources.get(&rk) {
                        Some(c) if c.def.namespaced => c
                            .objects
                            .range((k.1.clone(), String::new())..)
                            .take_while(|(kk, _)| kk.0 == k.1)
                            .map(|(kk, _)| kk.clone())
                            .collect(),
                        _ => vec![],
                    };
                    for v in victims {
                        if let Some(o) = self
                            .resources
                            .get(&rk)
                            .and_then(|c| c.objects.get(&v))
                            .cloned()
                        {
                            self.commit(
                                &rk,
                                &v.0,
                                &v.1,
                                EventType::Deleted,
                                o.value.clone(),
                                Some(o),
                            );
                        }
                    }
                }
            }
            if def.builtin
                && def.kind == "CustomResourceDefinition"
                && let Ok(nd) = crd_to_def(&last)
            {
                let rk = nd.key();
                let victims: Vec<Obj> = self
                    .resources
                    .get(&rk)
                    .map(|c| c.objects.values().cloned().collect())
                    .unwrap_or_default();
                for o in victims {
                    let (ns, n) = (
                        meta_str(&o.value, "namespace").to_string(),
                        name_of(&o.value).to_string(),
                    );
                    self.commit(
                        &rk,
                        &ns,
                        &n,
                        EventType::Deleted,
                        o.value.clone(),
                        Some(o.clone()),
                    );
                }
                if self.resources.get(&rk).is_some_and(|c| !c.def.builtin) {
                    self.resources.remove(&rk);
                    self.order.retain(|x| *x != rk);
                    self.registry_gen += 1;
                }
            }
        }
        self.commit(key, &k.0, &k.1, EventType::Deleted, last, prev)
    }

    /// DELETE. Objects with finalizers (and, with the graceful option, pods) are only marked.
    pub fn delete(
        &mut self,
        key: &str,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Obj, ApiError> {
        let def = self.def(key)?;
        let old = self.get(key, ns, name)?;
        let uid = meta_str(&old.value, "uid");
        if let Some(want) = opts.uid.as_deref().filter(|u| !u.is_empty())
            && want != uid
        {
            return Err(ApiError::conflict(
                &def.ctx(),
                name,
                &format!(
                    "Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
                ),
            ));
        }
        let rv = meta_str(&old.value, "resourceVersion");
        if let Some(want) = opts.rv.as_deref().filter(|r| !r.is_empty())
            && want != rv
        {
            return Err(ApiError::conflict(
                &def.ctx(),
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rv}"
                ),
            ));
        }
        let k = (
            if def.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name.to_string(),
        );
        let graceful_pod =
            def.builtin && def.kind == "Pod" && self.pods_graceful && opts.grace_seconds != Some(0);
        if finalizers(&old.value) > 0 || graceful_pod {
            if meta(&old.value).is_some_and(|m| m.contains_key("deletionTimestamp")) {
                return Ok(old);
            }
            let mut new = old.value.clone();
            let grace = if graceful_pod {
                opts.grace_seconds
                    .or_else(|| {
                        old.value
                            .pointer("/spec/terminationGracePeriodSeconds")
                            .and_then(Value::as_i64)
                    })
                    .unwrap_or(30)
                    // A request may ask for any number; keep the timestamp representable.
                    .clamp(0, 365 * 86_400)
            } else {
                0
            };
            let m = meta_mut(&mut new);
            m.insert(
                "deletionTimestamp".into(),
                json!(util::rfc3339(util::now_secs() + grace)),
            );
            m.insert("deletionGracePeriodSeconds".into(), json!(grace));
            if opts.dry_run {
                return Ok(Stored::new(new, old.rv));
            }
            return Ok(self.commit(key, &k.0, &k.1, EventType::Modified, new, Some(old)));
        }
        if opts.dry_run {
            return Ok(old);
        }
        Ok(self.remove(key, &k, old.value.clone(), Some(old)))
    }

    /// The state of one resource at revision `at` for keys after `start`: current objects,
    /// with everything written after `at` undone from the history.
    /// Calls `f` for each object in key order until it returns false.
    fn snapshot_for_each(
        &self,
        c: &Collection,
        at: u64,
        start: Option<&Key>,
        ns: Option<&str>,
        f: &mut dyn FnMut(&Key, &Obj) -> bool,
    ) {
        let mut overrides: BTreeMap<Key, Option<Obj>> = BTreeMap::new();
        if at < self.rv {
            let first = self.history.front().map_or(self.rv + 1, |e| e.rv);
            let from = (at + 1).saturating_sub(first) as usize;
            for e in self.history.iter().skip(from) {
                if *e.gr != *c.gr {
                    continue;
                }
                let k = (e.ns.clone(), name_of(&e.obj.value).to_string());
                overrides.entry(k).or_insert_with(|| e.prev.clone());
            }
        }
        let lower = match (start, ns) {
            (Some(s), _) => std::ops::Bound::Excluded(s.clone()),
            (None, Some(n)) => std::ops::Bound::Included((n.to_string(), String::new())),
            (None, None) => std::ops::Bound::Unbounded,
        };
        let in_ns = |k: &Key| ns.is_none_or(|n| k.0 == n);
        let mut cur = c
            .objects
            .range((lower.clone(), std::ops::Bound::Unbounded))
            .peekable();
        let mut ovr = overrides
            .range((lower, std::ops::Bound::Unbounded))
            .peekable();
        loop {
            let pick_cur = match (cur.peek(), ovr.peek()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((a, _)), Some((b, _))) => a < b,
            };
            if pick_cur {
                if let Some((k, o)) = cur.next() {
                    if let Some(n) = ns
                        && k.0.as_str() > n
                    {
                        break;
                    }
                    if in_ns(k) && !f(k, o) {
                        break;
                    }
                }
            } else if let Some((k, o)) = ovr.next() {
                if cur.peek().is_some_and(|(ck, _)| *ck == k) {
                    cur.next();
                }
                if let Some(n) = ns
                    && k.0.as_str() > n
                {
                    break;
                }
                if let (true, Some(o)) = (in_ns(k), o)
                    && !f(k, o)
                {
                    break;
                }
            }
        }
    }

    pub fn list(&self, key: &str, q: &ListQuery) -> Result<ListResult, ApiError> {
        let c = self.resources.get(key).ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        })?;
        let (at, start) = match &q.cont {
            Some(tok) => {
                let (rv, k) = decode_continue(tok)?;
                if rv < self.floor || rv > self.rv {
                    return Err(ApiError::expired(CONTINUE_EXPIRED));
                }
                (rv, Some(k))
            }
            None => match q.rv {
                RvMatch::Exact(n) => {
                    if n < self.floor {
                        return Err(ApiError::too_old(n, self.floor));
                    }
                    (n.min(self.rv), None)
                }
                RvMatch::Latest => (self.rv, None),
            },
        };
        let ns =
            q.ns.as_deref()
                .filter(|n| !n.is_empty() && c.def.namespaced);
        let matches = |o: &Obj| q.label.matches(&o.value) && q.field.matches(&o.value);
        let limit = q.limit.filter(|l| *l > 0);
        let unfiltered = q.label.is_empty() && q.field.is_empty();
        let mut items: Vec<Obj> = Vec::new();
        let mut last: Option<Key> = None;
        let mut full = false;
        let mut more: u64 = 0;
        self.snapshot_for_each(c, at, start.as_ref(), ns, &mut |k, o| {
            if full {
                // Past a full page: count what is left (only reported without selectors).
                more += 1;
                return unfiltered;
            }
            if !matches(o) {
                return true;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                full = true;
                more = 1;
                return unfiltered;
            }
            items.push(o.clone());
            last = Some(k.clone());
            true
        });
        let cont = if full {
            last.as_ref().map(|k| encode_continue(at, k))
        } else {
            None
        };
        let remaining = (full && unfiltered).then_some(more);
        Ok(ListResult {
            items,
            rv: at,
            cont,
            remaining,
        })
    }

    /// Where a watch starts: the synthetic ADDED objects (none when resuming from a revision)
    /// and the first revision to deliver.
    pub fn watch_start(
        &self,
        key: &str,
        from: Option<u64>,
        initial_events: bool,
        filter: &dyn Fn(&Key, &Obj) -> bool,
    ) -> Result<WatchStart, ApiError> {
        let c = self.resources.get(key).ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        })?;
        match from {
            Some(n) if n > 0 && !initial_events => {
                if n < self.floor {
                    return Err(ApiError::too_old(n, self.floor));
                }
                Ok(WatchStart {
                    initial: vec![],
                    next_rv: n + 1,
                    def: c.def.clone(),
                })
            }
            _ => {
                if let Some(n) = from.filter(|n| *n > 0 && *n < self.floor) {
                    return Err(ApiError::too_old(n, self.floor));
                }
                let initial = c
                    .objects
                    .iter()
                    .filter(|(k, o)| filter(k, o))
                    .map(|(_, o)| o.clone())
                    .collect();
                Ok(WatchStart {
                    initial,
                    next_rv: self.rv + 1,
                    def: c.def.clone(),
                })
            }
        }
    }

    /// Events from `next_rv` on (at most `max_scan` looked at). `None` when the watcher fell
    /// behind the retained history or its resource is gone (the stream must end).
    pub fn events_since(
        &self,
        gr: &str,
        def: &Arc<ResourceDef>,
        next_rv: u64,
        max_scan: usize,
    ) -> Option<(Vec<Arc<Event>>, u64)> {
        // A resource that stopped being served (CRD deleted or changed) still delivers the
        // events written before that (its objects' deletions), then its watches end.
        let alive = matches!(self.resources.get(&gr_key(&def.group, &def.plural)), Some(c) if Arc::ptr_eq(&c.def, def));
        if next_rv <= self.floor {
            return None;
        }
        let Some(first) = self.history.front().map(|e| e.rv) else {
            return alive.then(|| (vec![], next_rv.max(self.rv + 1)));
        };
        let from = next_rv.saturating_sub(first) as usize;
        let mut out = Vec::new();
        let mut next = next_rv.max(first);
        for e in self.history.iter().skip(from).take(max_scan) {
            next = e.rv + 1;
            if *e.gr == *gr {
                out.push(e.clone());
            }
        }
        if !alive && out.is_empty() {
            return None;
        }
        Some((out, next))
    }

    /// Objects in every collection, for the memory report and tests.
    pub fn object_count(&self) -> usize {
        self.resources.values().map(|c| c.objects.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pod(name: &str, labels: Value) -> Value {
        json!({"metadata": {"name": name, "labels": labels}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
    }

    fn opts() -> WriteOpts {
        WriteOpts::default()
    }

    #[test]
    fn one_revision_per_write_and_history_positions() {
        let mut s = State::new(100, false);
        let start = s.rv;
        let a = s
            .create("/pods", "default", pod("a", json!({})), &opts())
            .unwrap();
        assert_eq!(a.rv, start + 1);
        assert_eq!(
            meta_str(&a.value, "resourceVersion"),
            (start + 1).to_string()
        );
        let b = s
            .create("/pods", "default", pod("b", json!({})), &opts())
            .unwrap();
        assert_eq!(b.rv, start + 2);
        let (evs, next) = s
            .events_since("/pods", &s.resources["/pods"].def.clone(), start + 1, 100)
            .unwrap();
        assert_eq!(evs.len(), 2);
        assert_eq!(next, start + 3);
        // A no-op update writes nothing.
        let same = s
            .update(
                "/pods",
                "default",
                "a",
                a.value.clone(),
                Sub::Main,
                &opts(),
                false,
            )
            .unwrap();
        assert_eq!(same.rv, a.rv);
        assert_eq!(s.rv, start + 2);
    }

    #[test]
    fn history_bound_and_compaction_expire_old_revisions() {
        let mut s = State::new(3, false);
        let def = s.resources["/pods"].def.clone();
        for i in 0..5 {
            s.create(
                "/pods",
                "default",
                pod(&format!("p{i}"), json!({})),
                &opts(),
            )
            .unwrap();
        }
        assert_eq!(s.history.len(), 3);
        assert_eq!(s.floor, s.rv - 3);
        assert!(
            s.events_since("/pods", &def, s.floor, 10).is_none(),
            "needs the event at floor, which is gone"
        );
        assert_eq!(
            s.events_since("/pods", &def, s.floor + 1, 10)
                .unwrap()
                .0
                .len(),
            3
        );
        let err = s
            .watch_start("/pods", Some(s.floor - 1), false, &|_, _| true)
            .err()
            .unwrap();
        assert_eq!((err.code, err.reason), (410, "Expired"));
        assert!(
            s.watch_start("/pods", Some(s.floor), false, &|_, _| true)
                .is_ok()
        );
        s.compact();
        assert!(
            s.watch_start("/pods", Some(s.rv - 1), false, &|_, _| true)
                .is_err()
        );
        assert!(
            s.watch_start("/pods", Some(s.rv), false, &|_, _| true)
                .is_ok()
        );
    }

    #[test]
    fn continue_tokens_read_a_consistent_snapshot() {
        let mut s = State::new(1000, false);
        for i in 0..10 {
            s.create(
                "/pods",
                "default",
                pod(&format!("p{i}"), json!({})),
                &opts(),
            )
            .unwrap();
        }
        let q = ListQuery {
            limit: Some(4),
            ..Default::default()
        };
        let r1 = s.list("/pods", &q).unwrap();
        assert_eq!(r1.items.len(), 4);
        assert_eq!(r1.remaining, Some(6));
        // Changes after the first page do not show in later pages.
        s.delete("/pods", "default", "p5", &DeleteOpts::default())
            .unwrap();
        s.create("/pods", "default", pod("p99", json!({})), &opts())
            .unwrap();
        let mut p7 = s.get("/pods", "default", "p7").unwrap().value.clone();
        p7["metadata"]["labels"] = json!({"x": "y"});
        s.update("/pods", "default", "p7", p7, Sub::Main, &opts(), false)
            .unwrap();
        let mut names = vec![];
        let mut tok = r1.cont.clone();
        names.extend(r1.items.iter().map(|o| name_of(&o.value).to_string()));
        while let Some(t) = tok {
            let r = s
                .list(
                    "/pods",
                    &ListQuery {
                        limit: Some(4),
                        cont: Some(t),
                        ..Default::default()
                    },
                )
                .unwrap();
            assert_eq!(r.rv, r1.rv);
            for o in &r.items {
                if name_of(&o.value) == "p7" {
                    assert!(
                        o.value["metadata"]
                            .get("labels")
                            .is_none_or(|l| l.get("x").is_none())
                    );
                }
            }
            names.extend(r.items.iter().map(|o| name_of(&o.value).to_string()));
            tok = r.cont;
        }
        assert_eq!(names, (0..10).map(|i| format!("p{i}")).collect::<Vec<_>>());
        // Compaction expires the token.
        let r = s.list("/pods", &q).unwrap();
        s.create("/pods", "default", pod("late", json!({})), &opts())
            .unwrap();
        s.compact();
        let err = s
            .list(
                "/pods",
                &ListQuery {
                    limit: Some(4),
                    cont: r.cont,
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert_eq!((err.code, err.reason), (410, "Expired"));
    }

    #[test]
    fn namespaces_and_preconditions() {
        let mut s = State::new(100, false);
        let e = s
            .create("/pods", "nope", pod("a", json!({})), &opts())
            .unwrap_err();
        assert_eq!(e.message, "namespaces \"nope\" not found");
        let a = s
            .create("/pods", "default", pod("a", json!({})), &opts())
            .unwrap();
        let e = s
            .create("/pods", "default", pod("a", json!({})), &opts())
            .unwrap_err();
        assert_eq!(e.reason, "AlreadyExists");
        let e = s
            .delete(
                "/pods",
                "default",
                "a",
                &DeleteOpts {
                    uid: Some("x".into()),
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert!(
            e.message
                .contains("Precondition failed: UID in precondition: x, UID in object meta: "),
            "{}",
            e.message
        );
        let e = s
            .delete(
                "/pods",
                "default",
                "a",
                &DeleteOpts {
                    rv: Some("1".into()),
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert!(
            e.message
                .contains("Precondition failed: ResourceVersion in precondition: 1"),
            "{}",
            e.message
        );
        let mut stale = a.value.clone();
        s.patch(
            "/pods",
            "default",
            "a",
            PatchType::Merge,
            &json!({"metadata": {"labels": {"x": "1"}}}),
            Sub::Main,
            &opts(),
        )
        .unwrap();
        stale["metadata"]["labels"] = json!({"y": "2"});
        let e = s
            .update("/pods", "default", "a", stale, Sub::Main, &opts(), false)
            .unwrap_err();
        assert_eq!(e.reason, "Conflict");
        let e = s
            .patch(
                "/pods",
                "default",
                "a",
                PatchType::Merge,
                &json!({"metadata": {"resourceVersion": "1"}}),
                Sub::Main,
                &opts(),
            )
            .unwrap_err();
        assert_eq!(e.reason, "Conflict");
        // Deleting the namespace deletes the pod.
        s.delete("/namespaces", "", "default", &DeleteOpts::default())
            .unwrap();
        assert_eq!(s.get("/pods", "default", "a").unwrap_err().code, 404);
    }

    #[test]
    fn finalizers_delay_deletion() {
        let mut s = State::new(100, false);
        s.create(
            "/configmaps",
            "default",
            json!({"metadata": {"name": "c", "finalizers": ["x/y"]}}),
            &opts(),
        )
        .unwrap();
        let d = s
            .delete("/configmaps", "default", "c", &DeleteOpts::default())
            .unwrap();
        assert!(d.value["metadata"]["deletionTimestamp"].is_string());
        assert!(s.get("/configmaps", "default", "c").is_ok());
        s.patch(
            "/configmaps",
            "default",
            "c",
            PatchType::Merge,
            &json!({"metadata": {"finalizers": null}}),
            Sub::Main,
            &opts(),
        )
        .unwrap();
        assert_eq!(s.get("/configmaps", "default", "c").unwrap_err().code, 404);
        assert_eq!(s.history.back().unwrap().etype, EventType::Deleted);
    }

    #[test]
    fn crds_serve_and_unserve_resources() {
        let mut s = State::new(100, false);
        for c in crate::resources::calico_crds() {
            s.create(
                "apiextensions.k8s.io/customresourcedefinitions",
                "",
                c,
                &opts(),
            )
            .unwrap();
        }
        let key = gr_key("crd.projectcalico.org", "ippools");
        s.create(
            &key,
            "",
            json!({"metadata": {"name": "p"}, "spec": {"cidr": "10.0.0.0/16"}, "status": {"x": 1}}),
            &opts(),
        )
        .unwrap();
        let p = s.get(&key, "", "p").unwrap();
        assert!(
            p.value.get("status").is_none(),
            "status is dropped on create with a status subresource"
        );
        assert_eq!(p.value["metadata"]["generation"], 1);
        // A CR update without resourceVersion is refused.
        let mut v = p.value.clone();
        v["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
        assert_eq!(
            s.update(&key, "", "p", v, Sub::Main, &opts(), false)
                .unwrap_err()
                .code,
            422
        );
        // Strategic merge patch is refused for custom resources.
        let e = s
            .patch(
                &key,
                "",
                "p",
                PatchType::Strategic,
                &json!({}),
                Sub::Main,
                &opts(),
            )
            .unwrap_err();
        assert_eq!(e.code, 415);
        // Status writes change only status.
        let mut v = p.value.clone();
        v["spec"]["cidr"] = json!("1.0.0.0/8");
        v["status"] = json!({"conditions": []});
        let u = s
            .update(&key, "", "p", v, Sub::Status, &opts(), false)
            .unwrap();
        assert_eq!(u.value["spec"]["cidr"], "10.0.0.0/16");
        assert_eq!(u.value["status"], json!({"conditions": []}));
        assert_eq!(u.value["metadata"]["generation"], 1);
        s.delete(
            "apiextensions.k8s.io/customresourcedefinitions",
            "",
            "ippools.crd.projectcalico.org",
            &DeleteOpts::default(),
        )
        .unwrap();
        assert!(s.lookup("crd.projectcalico.org", "v1", "ippools").is_err());
    }

    #[test]
    fn crd_deletion_delivers_its_objects_deletions_then_ends_watches() {
        let mut s = State::new(100, false);
        let crds = "apiextensions.k8s.io/customresourcedefinitions";
        s.create(
            crds,
            "",
            crate::resources::calico_crds().remove(13),
            &opts(),
        )
        .unwrap();
        let key = gr_key("crd.projectcalico.org", "ippools");
        s.create(
            &key,
            "",
            json!({"metadata": {"name": "a"}, "spec": {}}),
            &opts(),
        )
        .unwrap();
        let def = s.resources[&key].def.clone();
        let from = s.rv + 1;
        s.delete(
            crds,
            "",
            "ippools.crd.projectcalico.org",
            &DeleteOpts::default(),
        )
        .unwrap();
        let (evs, next) = s.events_since(&key, &def, from, 100).unwrap();
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].etype, EventType::Deleted);
        assert!(
            s.events_since(&key, &def, next, 100).is_none(),
            "then the watch ends"
        );
    }

    #[test]
    fn node_status_keeps_metadata_and_spec() {
        let mut s = State::new(100, false);
        s.create(
            "/nodes",
            "",
            json!({"metadata": {"name": "n"}, "spec": {"podCIDR": "10.0.0.0/24"}}),
            &opts(),
        )
        .unwrap();
        let (n, _) = s
            .patch(
                "/nodes",
                "",
                "n",
                PatchType::Strategic,
                &json!({"metadata": {"annotations": {"projectcalico.org/IPv4Address": "10.0.0.5/24"}}, "spec": {"podCIDR": "x"}, "status": {"conditions": [{"type": "NetworkUnavailable", "status": "False"}]}}),
                Sub::Status,
                &opts(),
            )
            .unwrap();
        assert_eq!(
            n.value["metadata"]["annotations"]["projectcalico.org/IPv4Address"],
            "10.0.0.5/24"
        );
        assert_eq!(n.value["spec"]["podCIDR"], "10.0.0.0/24");
        assert_eq!(n.value["status"]["conditions"][0]["status"], "False");
    }
}
