//! The typed resource client: projectcalico.org/v3 resources on top of any [`KvBackend`],
//! stored the way Calico stores them in etcd (JSON under the v3 resource keys, with the key's
//! mod revision as `metadata.resourceVersion`).

use std::time::Duration;

use margay_api::{Kind, Resource, ResourceKey};

use crate::error::{DatastoreError, Result};
use crate::keys::{kind_prefix, parse_resource_path, resource_path};
use crate::kv::{KeyValue, KvBackend, KvEvent, Watch};
use crate::util::{new_uid, now_rfc3339};

/// What `apply` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Created,
    Updated,
    /// The stored resource already had this content; nothing was written.
    Unchanged,
}

/// The result of a list: the resources, the revision they are consistent with, and the keys
/// whose stored value could not be decoded (reported, never fatal).
#[derive(Debug, Clone, Default)]
pub struct ResourceList {
    pub items: Vec<Resource>,
    pub revision: i64,
    pub undecodable: Vec<(String, String)>,
}

/// One change to a watched kind.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // events are consumed right away, never stored in bulk
pub enum ResourceEvent {
    /// Created or modified; `old` is the previous value when there was one.
    Put {
        key: ResourceKey,
        resource: Resource,
        /// The previous stored value, undecoded (see [`decode`]): most consumers never need it.
        old: Option<KeyValue>,
        revision: i64,
    },
    Deleted {
        key: ResourceKey,
        old: Option<KeyValue>,
        revision: i64,
    },
    /// A stored value that could not be decoded: the watch goes on.
    Undecodable {
        path: String,
        revision: i64,
        error: String,
    },
}

#[derive(Clone)]
pub struct Client<B> {
    kv: B,
}

impl<B: KvBackend> Client<B> {
    pub fn new(kv: B) -> Self {
        Client { kv }
    }

    pub fn backend(&self) -> &B {
        &self.kv
    }

    pub async fn get(&self, key: &ResourceKey) -> Result<Resource> {
        let path = resource_path(key);
        match self.kv.get(&path).await? {
            Some(kv) => decode(&kv),
            None => Err(DatastoreError::NotFound {
                key: key.to_string(),
            }),
        }
    }

    /// Every resource of a kind (in one namespace, or all when `namespace` is None), whose name
    /// starts with `name_prefix`.
    pub async fn list(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        name_prefix: &str,
    ) -> Result<ResourceList> {
        let prefix = kind_prefix(kind, namespace, name_prefix);
        let listed = self.kv.list(&prefix).await?;
        let mut out = ResourceList {
            revision: listed.revision,
            ..ResourceList::default()
        };
        out.items.reserve(listed.kvs.len());
        // Consume the raw values as they are decoded, so both copies never coexist in full.
        for kv in listed.kvs {
            match decode(&kv) {
                Ok(r) if r.kind() == kind && r.name().starts_with(name_prefix) => out.items.push(r),
                Ok(_) => {}
                Err(e) => out.undecodable.push((kv.key, e.to_string())),
            }
        }
        Ok(out)
    }

    /// Validates and stores a new resource. Fails with `AlreadyExists` if it exists.
    pub async fn create(&self, resource: Resource) -> Result<Resource> {
        self.create_with_ttl(resource, None).await
    }

    /// Like [`Client::create`], with the key expiring after `ttl` (status resources).
    pub async fn create_with_ttl(
        &self,
        mut resource: Resource,
        ttl: Option<Duration>,
    ) -> Result<Resource> {
        prepare(&mut resource)?;
        let key = resource.key();
        let meta = resource.metadata_mut();
        if !meta.resource_version.is_empty() {
            return Err(DatastoreError::invalid(format!(
                "{key}: metadata.resourceVersion must not be set when creating (remove it, or use apply/replace)"
            )));
        }
        if meta.uid.is_empty() {
            meta.uid = new_uid();
        }
        if meta.creation_timestamp.is_none() {
            meta.creation_timestamp = Some(now_rfc3339());
        }
        let value = encode(&resource)?;
        let kv = self
            .kv
            .create(&resource_path(&key), value, ttl)
            .await
            .map_err(|e| rename(e, &key))?;
        with_version(resource, &kv)
    }

    /// Replaces an existing resource. With `metadata.resourceVersion` set the write is a
    /// compare-and-swap and fails with `Conflict` if the resource changed; without it the
    /// current version is overwritten.
    pub async fn update(&self, mut resource: Resource) -> Result<Resource> {
        prepare(&mut resource)?;
        let key = resource.key();
        let path = resource_path(&key);
        let expected = parse_version(&key, &resource.metadata().resource_version)?;
        // Keep the identity fields Calico set at creation when the caller left them out.
        let meta = resource.metadata();
        if (meta.uid.is_empty() || meta.creation_timestamp.is_none())
            && let Some(current) = self.kv.get(&path).await?
        {
            {
                let current = decode(&current)?;
                let cm = current.metadata();
                let (uid, ts) = (cm.uid.clone(), cm.creation_timestamp.clone());
                let meta = resource.metadata_mut();
                if meta.uid.is_empty() {
                    meta.uid = uid;
                }
                if meta.creation_timestamp.is_none() {
                    meta.creation_timestamp = ts;
                }
            }
        }
        let value = encode(&resource)?;
        let kv = self
            .kv
            .update(&path, value, expected, None)
            .await
            .map_err(|e| rename(e, &key))?;
        with_version(resource, &kv)
    }

    /// Creates the resource, or updates it if it exists. With `metadata.resourceVersion` set
    /// the update is a compare-and-swap on that version (and fails with `Conflict`); without
    /// it, on the version just read, retrying a few times if another writer gets in between.
    pub async fn apply(&self, resource: Resource) -> Result<(Resource, Applied)> {
        let mut resource = resource;
        prepare(&mut resource)?;
        if !resource.metadata().resource_version.is_empty() {
            return self.update(resource).await.map(|r| (r, Applied::Updated));
        }
        let key = resource.key();
        let path = resource_path(&key);
        let mut last_conflict = None;
        for _ in 0..5 {
            match self.kv.get(&path).await? {
                None => {
                    let mut r = resource.clone();
                    r.metadata_mut().resource_version.clear();
                    match self.create(r).await {
                        Ok(created) => return Ok((created, Applied::Created)),
                        Err(DatastoreError::AlreadyExists { .. }) => continue,
                        Err(e) => return Err(e),
                    }
                }
                Some(current_kv) => {
                    let current = decode(&current_kv)?;
                    let mut r = resource.clone();
                    {
                        let (cm, m) = (current.metadata(), r.metadata_mut());
                        m.resource_version = current_kv.mod_revision.to_string();
                        if m.uid.is_empty() {
                            m.uid = cm.uid.clone();
                        }
                        if m.creation_timestamp.is_none() {
                            m.creation_timestamp = cm.creation_timestamp.clone();
                        }
                    }
                    if same_content(&current, &r) {
                        return Ok((current, Applied::Unchanged));
                    }
                    match self.update(r).await {
                        Ok(updated) => return Ok((updated, Applied::Updated)),
                        Err(e @ DatastoreError::Conflict { .. }) => last_conflict = Some(e),
                        Err(DatastoreError::NotFound { .. }) => continue,
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Err(last_conflict.unwrap_or_else(|| {
            DatastoreError::unavailable(format!("{key}: gave up after repeated concurrent changes"))
        }))
    }

    /// Deletes a resource (compare-and-swap when `resource_version` is given) and returns it.
    pub async fn delete(
        &self,
        key: &ResourceKey,
        resource_version: Option<&str>,
    ) -> Result<Resource> {
        let expected = match resource_version {
            Some(v) => parse_version(key, v)?,
            None => None,
        };
        let kv = self
            .kv
            .delete(&resource_path(key), expected)
            .await
            .map_err(|e| rename(e, key))?;
        match decode(&kv) {
            Ok(r) => Ok(r),
            // The value is gone, which is what the caller asked for: a value that no longer
            // decodes (an older schema, another writer) must be removable, and the deletion
            // must not be reported as a failure.
            Err(e) => {
                tracing::warn!(resource = %key, error = %e, "deleted a stored value that does not decode");
                Ok(placeholder(key, kv.mod_revision).ok_or(e)?)
            }
        }
    }

    /// Watches a kind (optionally one namespace) for changes after `revision` (the revision a
    /// list returned).
    pub async fn watch(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        revision: i64,
    ) -> Result<ResourceWatch> {
        let prefix = kind_prefix(kind, namespace, "");
        Ok(ResourceWatch {
            inner: self.kv.watch(&prefix, revision).await?,
        })
    }
}

/// A watch of resources; decoding happens here, so one bad value never ends the watch.
pub struct ResourceWatch {
    inner: Watch,
}

impl ResourceWatch {
    /// The next batch of events, an error that ended the watch, or None when it closed.
    pub async fn next(&mut self) -> Option<Result<Vec<ResourceEvent>>> {
        let batch = self.inner.next().await?;
        Some(batch.map(|events| events.iter().map(resource_event).collect()))
    }
}

/// Turns a raw event into a typed one.
pub fn resource_event(e: &KvEvent) -> ResourceEvent {
    let Some(key) = parse_resource_path(e.key()) else {
        return ResourceEvent::Undecodable {
            path: e.key().to_string(),
            revision: e.revision(),
            error: "not a v3 resource key".into(),
        };
    };
    match e {
        KvEvent::Put { kv, prev } => match decode(kv) {
            Ok(resource) => ResourceEvent::Put {
                key,
                resource,
                old: prev.clone(),
                revision: kv.mod_revision,
            },
            Err(err) => ResourceEvent::Undecodable {
                path: kv.key.clone(),
                revision: kv.mod_revision,
                error: err.to_string(),
            },
        },
        KvEvent::Delete { revision, prev, .. } => ResourceEvent::Deleted {
            key,
            old: prev.clone(),
            revision: *revision,
        },
    }
}

/// Decodes a stored value, checks it belongs at its key, and sets resourceVersion.
pub fn decode(kv: &KeyValue) -> Result<Resource> {
    let bad = |why: String| DatastoreError::invalid(format!("stored value at {}: {why}", kv.key));
    let key = parse_resource_path(&kv.key);
    // The key names the kind, so a well-formed value decodes in one pass; anything else takes
    // the slow path, which explains what is wrong.
    let fast = key
        .as_ref()
        .and_then(|k| Resource::from_json_slice_fast(k.kind, &kv.value));
    let mut r = match fast {
        Some(r) => r,
        None => {
            let value: serde_json::Value =
                serde_json::from_slice(&kv.value).map_err(|e| bad(format!("not JSON: {e}")))?;
            margay_api::codec::decode_value(value).map_err(|e| bad(e.to_string()))?
        }
    };
    if let Some(key) = key
        && (key.kind != r.kind() || key.name != r.name() || key.namespace != r.namespace())
    {
        return Err(bad(format!("holds {} instead of {key}", r.key())));
    }
    r.metadata_mut().resource_version = kv.mod_revision.to_string();
    Ok(r)
}

fn encode(resource: &Resource) -> Result<Vec<u8>> {
    let mut r = resource.clone();
    // The version is the key's revision, never part of the stored value.
    r.metadata_mut().resource_version.clear();
    let value = serde_json::to_vec(&r)
        .map_err(|e| DatastoreError::invalid(format!("{}: cannot encode: {e}", r.key())))?;
    // Checked here too so that the error names the resource, not its storage path.
    let max = crate::kv::max_value_size();
    if value.len() > max {
        return Err(DatastoreError::invalid(format!(
            "{} is {} bytes when stored, more than the datastore accepts ({max} bytes, \
             DATASTORE_MAX_VALUE_SIZE): split it into several smaller resources",
            r.key(),
            value.len()
        )));
    }
    Ok(value)
}

/// A resource with only its identity, for a deleted value that did not decode.
fn placeholder(key: &ResourceKey, revision: i64) -> Option<Resource> {
    let mut meta = serde_json::json!({ "name": key.name });
    if !key.namespace.is_empty() {
        meta["namespace"] = serde_json::Value::from(key.namespace.clone());
    }
    let value = serde_json::json!({
        "apiVersion": "projectcalico.org/v3",
        "kind": key.kind.name(),
        "metadata": meta,
    });
    let mut r = margay_api::codec::decode_value(value).ok()?;
    r.metadata_mut().resource_version = revision.to_string();
    Some(r)
}

/// What was stored: the backend's copy (the Kubernetes datastore's server sets uid and
/// creationTimestamp itself), else the resource written with its new version.
fn with_version(mut resource: Resource, kv: &KeyValue) -> Result<Resource> {
    if let Ok(stored) = decode(kv) {
        return Ok(stored);
    }
    resource.metadata_mut().resource_version = kv.mod_revision.to_string();
    Ok(resource)
}

/// Normalises and validates a resource before any write: namespaced kinds get the `default`
/// namespace when none is given, workload endpoints get their derived name.
fn prepare(resource: &mut Resource) -> Result<()> {
    let kind = resource.kind();
    if kind.is_namespaced() && resource.namespace().is_empty() {
        resource.metadata_mut().namespace = "default".to_string();
    }
    if let Resource::WorkloadEndpoint(w) = resource
        && w.metadata.name.is_empty()
        && let Ok(name) = w.spec.expected_name()
    {
        w.metadata.name = name;
    }
    resource
        .validate()
        .map_err(|errors| DatastoreError::Validation {
            key: resource.key().to_string(),
            errors,
        })
}

fn parse_version(key: &ResourceKey, v: &str) -> Result<Option<i64>> {
    if v.is_empty() {
        return Ok(None);
    }
    v.parse::<i64>().map(Some).map_err(|_| {
        DatastoreError::invalid(format!(
            "{key}: metadata.resourceVersion {v:?} is not a revision number"
        ))
    })
}

/// Rewrites a backend error so it names the resource rather than its storage path.
fn rename(e: DatastoreError, key: &ResourceKey) -> DatastoreError {
    let name = key.to_string();
    match e {
        DatastoreError::NotFound { .. } => DatastoreError::NotFound { key: name },
        DatastoreError::AlreadyExists { .. } => DatastoreError::AlreadyExists { key: name },
        DatastoreError::Conflict {
            expected, current, ..
        } => DatastoreError::Conflict {
            key: name,
            expected,
            current,
        },
        other => other,
    }
}

/// Equal apart from the version bookkeeping.
fn same_content(a: &Resource, b: &Resource) -> bool {
    let mut a = a.clone();
    let mut b = b.clone();
    a.metadata_mut().resource_version.clear();
    b.metadata_mut().resource_version.clear();
    a == b
}
