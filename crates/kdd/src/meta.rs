//! Kubernetes object metadata as the API server sends it, and the `projectcalico.org/metadata`
//! annotation in which Calico keeps a v3 resource's metadata on its custom resource.

use std::collections::BTreeMap;

use margay_api::ObjectMeta;
use margay_api::meta::OwnerReference;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::json::null_as_default;

/// The annotation holding a v3 resource's metadata on its custom resource.
pub const METADATA_ANNOTATION: &str = "projectcalico.org/metadata";

/// Label and annotation keys Calico owns: kept on the custom resource itself as well.
pub(crate) fn is_ours(key: &str) -> bool {
    key.contains("projectcalico.org/") || key.contains("operator.tigera.io/")
}

/// Kubernetes ObjectMeta read leniently, as Go's decoder does: unknown fields ignored, `null`
/// where Go writes nil slices and maps.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct K8sMeta {
    #[serde(deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(deserialize_with = "null_as_default")]
    pub generate_name: String,
    #[serde(deserialize_with = "null_as_default")]
    pub namespace: String,
    #[serde(deserialize_with = "null_as_default")]
    pub self_link: String,
    #[serde(deserialize_with = "null_as_default")]
    pub uid: String,
    #[serde(deserialize_with = "null_as_default")]
    pub resource_version: String,
    pub generation: Option<i64>,
    pub creation_timestamp: Option<String>,
    pub deletion_timestamp: Option<String>,
    pub deletion_grace_period_seconds: Option<i64>,
    /// None when absent (the Kubernetes Node conversion tells "no labels" from "{}").
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(deserialize_with = "null_as_default")]
    pub annotations: BTreeMap<String, String>,
    #[serde(deserialize_with = "null_as_default")]
    pub owner_references: Vec<K8sOwnerRef>,
    #[serde(deserialize_with = "null_as_default")]
    pub finalizers: Vec<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub managed_fields: Vec<Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct K8sOwnerRef {
    #[serde(deserialize_with = "null_as_default")]
    pub api_version: String,
    #[serde(deserialize_with = "null_as_default")]
    pub kind: String,
    #[serde(deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(deserialize_with = "null_as_default")]
    pub uid: String,
    pub controller: Option<bool>,
    pub block_owner_deletion: Option<bool>,
}

impl From<K8sOwnerRef> for OwnerReference {
    fn from(r: K8sOwnerRef) -> OwnerReference {
        OwnerReference {
            api_version: r.api_version,
            kind: r.kind,
            name: r.name,
            uid: r.uid,
            controller: r.controller,
            block_owner_deletion: r.block_owner_deletion,
        }
    }
}

impl K8sMeta {
    /// margay's ObjectMeta with every field of this one.
    pub fn into_object_meta(self) -> ObjectMeta {
        ObjectMeta {
            name: self.name,
            generate_name: self.generate_name,
            namespace: self.namespace,
            self_link: self.self_link,
            uid: self.uid,
            resource_version: self.resource_version,
            generation: self.generation,
            creation_timestamp: self.creation_timestamp,
            deletion_timestamp: self.deletion_timestamp,
            deletion_grace_period_seconds: self.deletion_grace_period_seconds,
            labels: self.labels.unwrap_or_default(),
            annotations: self.annotations,
            owner_references: self
                .owner_references
                .into_iter()
                .map(OwnerReference::from)
                .collect(),
            finalizers: self.finalizers,
            managed_fields: self.managed_fields,
        }
    }
}

/// The annotation's JSON, field for field as Go's `json.Marshal(metav1.ObjectMeta)` writes it:
/// fields in ObjectMeta's order, empty ones left out, except `creationTimestamp`, which Go
/// always writes (`null` when unset; metav1.Time is a struct, so omitempty does not apply).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StoredMeta<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    pub name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub generate_name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub self_link: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    pub creation_timestamp: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deletion_grace_period_seconds: Option<i64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub owner_references: &'a [OwnerReference],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub finalizers: &'a [String],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub managed_fields: &'a [Value],
}
/// The annotation of an object whose only metadata is its name (IPAM objects):
/// `{"creationTimestamp":null}` plus its labels.
pub(crate) fn bare_metadata_annotation(labels: &BTreeMap<String, String>) -> String {
    let empty = BTreeMap::new();
    let stored = StoredMeta {
        name: "",
        generate_name: "",
        self_link: "",
        generation: None,
        creation_timestamp: None,
        deletion_timestamp: None,
        deletion_grace_period_seconds: None,
        labels,
        annotations: &empty,
        owner_references: &[],
        finalizers: &[],
        managed_fields: &[],
    };
    // Serialising strings and maps of strings cannot fail; fall back to Go's minimal form.
    serde_json::to_string(&stored).unwrap_or_else(|_| r#"{"creationTimestamp":null}"#.to_string())
}
