//! Calico's kinds stored as `crd.projectcalico.org/v1` custom resources, and the mapping
//! between a v3 resource and its custom resource.
//!
//! The mapping (Calico's `ConvertCalicoResourceToK8sResource` /
//! `ConvertK8sResourceToCalicoResource`, `lk8s/resources/resources.go`):
//!
//! - same name and namespace; spec and status copied as they are (same JSON);
//! - the v3 metadata, minus namespace, resourceVersion and uid (and minus the name, except for
//!   policies), is kept as JSON in the annotation `projectcalico.org/metadata`; on the custom
//!   resource itself only the labels and annotations Calico owns (keys containing
//!   `projectcalico.org/` or `operator.tigera.io/`);
//! - uid: the custom resource's uid is the v3 uid converted ([`crate::names::convert_uid`]),
//!   and so are the uids of owner references to `projectcalico.org/v3` objects, which point at
//!   `crd.projectcalico.org/v1` instead;
//! - reading: labels and annotations of the custom resource overlaid by those of the
//!   annotation, the name from the annotation else the custom resource's (without a leading
//!   `default.` for policies of the default tier, as written before Calico 3.32), the
//!   creationTimestamp from the annotation else the custom resource's, and the
//!   resourceVersion, namespace and (converted) uid of the custom resource. A custom resource
//!   without the annotation (written by hand, e.g. with kubectl) keeps its own metadata.

use margay_api::meta::OwnerReference;
use margay_api::{Kind, ObjectMeta, Resource};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::json::{annotation_path, decode, decode_str, label, null_as_default, value_label};
/// The annotation holding a v3 resource's metadata on its custom resource.
pub use crate::meta::METADATA_ANNOTATION;
use crate::meta::{K8sMeta, StoredMeta, is_ours};
use crate::names::convert_uid;
use crate::{CRD_API_VERSION, CRD_GROUP, CRD_VERSION, KddError, Result};

/// One of Calico's custom resource definitions (`crd.projectcalico.org/v1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CrdInfo {
    /// `crd.projectcalico.org`.
    pub group: &'static str,
    /// `v1`.
    pub version: &'static str,
    /// The custom resource's `kind` (`IPAMConfig` for the IPAM configuration).
    pub kind: &'static str,
    /// The kind of a list (`IPPoolList`).
    pub list_kind: &'static str,
    /// The resource's plural, in URLs (`ippools`).
    pub plural: &'static str,
    /// The resource's singular name (`ippool`).
    pub singular: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Whether the CRD has the status subresource (status written with `PUT …/status`).
    pub has_status: bool,
    /// The kind in `projectcalico.org/v3` (differs only for the IPAM configuration).
    pub v3_kind: &'static str,
    /// The plural in `projectcalico.org/v3` (differs only for the IPAM configuration).
    pub v3_plural: &'static str,
    /// The margay kind stored as this custom resource; None for the kinds margay keeps in
    /// another form (IPAM blocks, affinities and handles, see [`crate::ipam`]) or does not
    /// model (CalicoNodeStatus, the Staged* policies).
    pub model: Option<Kind>,
}

impl CrdInfo {
    /// `crd.projectcalico.org/v1`.
    pub fn api_version(&self) -> &'static str {
        CRD_API_VERSION
    }

    /// The CRD's own name: `<plural>.crd.projectcalico.org`.
    pub fn crd_name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    /// The URL path of the collection (`/apis/crd.projectcalico.org/v1/namespaces/<ns>/<plural>`
    /// for namespaced kinds when `namespace` is not empty; all namespaces otherwise).
    pub fn collection_path(&self, namespace: &str) -> String {
        if self.namespaced && !namespace.is_empty() {
            format!(
                "/apis/{}/{}/namespaces/{namespace}/{}",
                self.group, self.version, self.plural
            )
        } else {
            format!("/apis/{}/{}/{}", self.group, self.version, self.plural)
        }
    }

    /// The URL path of one object.
    pub fn object_path(&self, namespace: &str, name: &str) -> String {
        format!("{}/{name}", self.collection_path(namespace))
    }
}

macro_rules! crds {
    ($( $kind:literal, $plural:literal, $singular:literal, namespaced: $ns:literal,
        status: $status:literal, v3: ($v3kind:literal, $v3plural:literal), model: $model:expr; )*) => {
        /// Every Calico custom resource definition (calico-kdd.md §2;
        /// `libcalico-go/config/crd/crd.projectcalico.org_*.yaml`), sorted by plural.
        pub const CALICO_CRDS: &[CrdInfo] = &[
            $(CrdInfo {
                group: CRD_GROUP,
                version: CRD_VERSION,
                kind: $kind,
                list_kind: concat!($kind, "List"),
                plural: $plural,
                singular: $singular,
                namespaced: $ns,
                has_status: $status,
                v3_kind: $v3kind,
                v3_plural: $v3plural,
                model: $model,
            },)*
        ];
    };
}

crds! {
    "BGPConfiguration", "bgpconfigurations", "bgpconfiguration", namespaced: false, status: false,
        v3: ("BGPConfiguration", "bgpconfigurations"), model: Some(Kind::BGPConfiguration);
    "BGPFilter", "bgpfilters", "bgpfilter", namespaced: false, status: false,
        v3: ("BGPFilter", "bgpfilters"), model: Some(Kind::BGPFilter);
    "BGPPeer", "bgppeers", "bgppeer", namespaced: false, status: false,
        v3: ("BGPPeer", "bgppeers"), model: Some(Kind::BGPPeer);
    "BlockAffinity", "blockaffinities", "blockaffinity", namespaced: false, status: false,
        v3: ("BlockAffinity", "blockaffinities"), model: None;
    "CalicoNodeStatus", "caliconodestatuses", "caliconodestatus", namespaced: false, status: true,
        v3: ("CalicoNodeStatus", "caliconodestatuses"), model: None;
    "ClusterInformation", "clusterinformations", "clusterinformation", namespaced: false, status: false,
        v3: ("ClusterInformation", "clusterinformations"), model: Some(Kind::ClusterInformation);
    "FelixConfiguration", "felixconfigurations", "felixconfiguration", namespaced: false, status: false,
        v3: ("FelixConfiguration", "felixconfigurations"), model: Some(Kind::FelixConfiguration);
    "GlobalNetworkPolicy", "globalnetworkpolicies", "globalnetworkpolicy", namespaced: false, status: false,
        v3: ("GlobalNetworkPolicy", "globalnetworkpolicies"), model: Some(Kind::GlobalNetworkPolicy);
    "GlobalNetworkSet", "globalnetworksets", "globalnetworkset", namespaced: false, status: false,
        v3: ("GlobalNetworkSet", "globalnetworksets"), model: Some(Kind::GlobalNetworkSet);
    "HostEndpoint", "hostendpoints", "hostendpoint", namespaced: false, status: false,
        v3: ("HostEndpoint", "hostendpoints"), model: Some(Kind::HostEndpoint);
    "IPAMBlock", "ipamblocks", "ipamblock", namespaced: false, status: false,
        v3: ("IPAMBlock", "ipamblocks"), model: None;
    "IPAMConfig", "ipamconfigs", "ipamconfig", namespaced: false, status: false,
        v3: ("IPAMConfiguration", "ipamconfigurations"), model: Some(Kind::IPAMConfiguration);
    "IPAMHandle", "ipamhandles", "ipamhandle", namespaced: false, status: false,
        v3: ("IPAMHandle", "ipamhandles"), model: None;
    "IPPool", "ippools", "ippool", namespaced: false, status: true,
        v3: ("IPPool", "ippools"), model: Some(Kind::IPPool);
    "IPReservation", "ipreservations", "ipreservation", namespaced: false, status: false,
        v3: ("IPReservation", "ipreservations"), model: Some(Kind::IPReservation);
    "KubeControllersConfiguration", "kubecontrollersconfigurations", "kubecontrollersconfiguration",
        namespaced: false, status: true,
        v3: ("KubeControllersConfiguration", "kubecontrollersconfigurations"),
        model: Some(Kind::KubeControllersConfiguration);
    "NetworkPolicy", "networkpolicies", "networkpolicy", namespaced: true, status: false,
        v3: ("NetworkPolicy", "networkpolicies"), model: Some(Kind::NetworkPolicy);
    "NetworkSet", "networksets", "networkset", namespaced: true, status: false,
        v3: ("NetworkSet", "networksets"), model: Some(Kind::NetworkSet);
    "StagedGlobalNetworkPolicy", "stagedglobalnetworkpolicies", "stagedglobalnetworkpolicy",
        namespaced: false, status: false,
        v3: ("StagedGlobalNetworkPolicy", "stagedglobalnetworkpolicies"), model: None;
    "StagedKubernetesNetworkPolicy", "stagedkubernetesnetworkpolicies", "stagedkubernetesnetworkpolicy",
        namespaced: true, status: false,
        v3: ("StagedKubernetesNetworkPolicy", "stagedkubernetesnetworkpolicies"), model: None;
    "StagedNetworkPolicy", "stagednetworkpolicies", "stagednetworkpolicy", namespaced: true, status: false,
        v3: ("StagedNetworkPolicy", "stagednetworkpolicies"), model: None;
    "Tier", "tiers", "tier", namespaced: false, status: true,
        v3: ("Tier", "tiers"), model: Some(Kind::Tier);
}

/// The custom resource a margay kind is stored as; None for the kinds derived from Kubernetes
/// objects (Node, WorkloadEndpoint, Profile).
pub fn crd_for(kind: Kind) -> Option<CrdInfo> {
    CALICO_CRDS.iter().find(|c| c.model == Some(kind)).copied()
}

/// The CRD with this custom resource `kind` (`IPAMConfig`, not `IPAMConfiguration`).
pub fn crd_by_kind(kind: &str) -> Option<CrdInfo> {
    CALICO_CRDS.iter().find(|c| c.kind == kind).copied()
}

/// The CRD with this plural (`ipamconfigs`).
pub fn crd_by_plural(plural: &str) -> Option<CrdInfo> {
    CALICO_CRDS.iter().find(|c| c.plural == plural).copied()
}

/// Sets `metadata.resourceVersion` of a custom resource body: an update (PUT) carries the
/// revision it was read at, so the API server refuses it (409) if the object changed since.
pub fn set_resource_version(body: &mut Value, resource_version: &str) {
    if let Value::Object(obj) = body {
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = meta {
            m.insert(
                "resourceVersion".to_string(),
                Value::String(resource_version.to_string()),
            );
        }
    }
}

/// The kinds whose v3 name is kept in the metadata annotation (Calico also keeps it for the
/// Staged policies, which margay does not model).
fn is_policy(kind: Kind) -> bool {
    matches!(kind, Kind::NetworkPolicy | Kind::GlobalNetworkPolicy)
}

const V3_API_VERSION: &str = margay_api::resource::API_VERSION;

/// The body to create (POST) or replace (PUT) the custom resource of `r`: `apiVersion:
/// crd.projectcalico.org/v1`, the CRD's kind, metadata (name, namespace, resourceVersion when
/// set, the converted uid when set, the labels and annotations Calico owns, and the
/// `projectcalico.org/metadata` annotation with the rest), spec and status.
///
/// Errors for the derived kinds (Node, WorkloadEndpoint, Profile), a missing name or
/// namespace, and a uid (also an owner reference's) that is not a UUID.
pub fn resource_to_cr(r: &Resource) -> Result<Value> {
    let kind = r.kind();
    let meta = r.metadata();
    let object = label(kind.name(), &meta.namespace, &meta.name);
    let crd = crd_for(kind).ok_or_else(|| {
        KddError::new(
            &object,
            "kind",
            format!(
                "{kind} is not stored as a custom resource in the Kubernetes datastore (it is derived from Kubernetes objects)"
            ),
        )
    })?;
    if meta.name.is_empty() {
        return Err(KddError::new(&object, "metadata.name", "required"));
    }
    if crd.namespaced && meta.namespace.is_empty() {
        return Err(KddError::new(&object, "metadata.namespace", "required"));
    }

    let mut owner_references = Vec::with_capacity(meta.owner_references.len());
    for (i, o) in meta.owner_references.iter().enumerate() {
        let mut o = o.clone();
        if o.api_version == V3_API_VERSION {
            o.api_version = CRD_API_VERSION.to_string();
            o.uid = convert_uid(&o.uid).ok_or_else(|| {
                KddError::new(
                    &object,
                    format!("metadata.ownerReferences[{i}].uid"),
                    format!("{:?} is not a UUID", o.uid),
                )
            })?;
        }
        owner_references.push(o);
    }
    let stored = StoredMeta {
        name: if is_policy(kind) { &meta.name } else { "" },
        generate_name: &meta.generate_name,
        self_link: &meta.self_link,
        generation: meta.generation,
        creation_timestamp: meta.creation_timestamp.as_deref(),
        deletion_timestamp: meta.deletion_timestamp.as_deref(),
        deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
        labels: &meta.labels,
        annotations: &meta.annotations,
        owner_references: &owner_references,
        finalizers: &meta.finalizers,
        managed_fields: &meta.managed_fields,
    };
    let annotation = serde_json::to_string(&stored)
        .map_err(|e| KddError::new(&object, "metadata", e.to_string()))?;

    let mut cr_meta = Map::new();
    cr_meta.insert("name".into(), Value::String(meta.name.clone()));
    if crd.namespaced {
        cr_meta.insert("namespace".into(), Value::String(meta.namespace.clone()));
    }
    if !meta.resource_version.is_empty() {
        cr_meta.insert(
            "resourceVersion".into(),
            Value::String(meta.resource_version.clone()),
        );
    }
    if !meta.uid.is_empty() {
        let uid = convert_uid(&meta.uid).ok_or_else(|| {
            KddError::new(
                &object,
                "metadata.uid",
                format!("{:?} is not a UUID", meta.uid),
            )
        })?;
        cr_meta.insert("uid".into(), Value::String(uid));
    }
    let labels: Map<String, Value> = meta
        .labels
        .iter()
        .filter(|(k, _)| is_ours(k))
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    if !labels.is_empty() {
        cr_meta.insert("labels".into(), Value::Object(labels));
    }
    let mut annotations: Map<String, Value> = meta
        .annotations
        .iter()
        .filter(|(k, _)| is_ours(k))
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    // The metadata annotation is ours to write; a v3 annotation of that name cannot replace it.
    annotations.insert(METADATA_ANNOTATION.into(), Value::String(annotation));
    cr_meta.insert("annotations".into(), Value::Object(annotations));

    let whole =
        serde_json::to_value(r).map_err(|e| KddError::new(&object, "spec", e.to_string()))?;
    let mut body = Map::new();
    body.insert("apiVersion".into(), Value::String(CRD_API_VERSION.into()));
    body.insert("kind".into(), Value::String(crd.kind.into()));
    body.insert("metadata".into(), Value::Object(cr_meta));
    body.insert(
        "spec".into(),
        whole
            .get("spec")
            .cloned()
            .unwrap_or_else(|| Value::Object(Map::new())),
    );
    if let Some(status) = whole.get("status").filter(|s| !s.is_null()) {
        body.insert("status".into(), status.clone());
    }
    Ok(Value::Object(body))
}

/// The envelope of a custom resource, read leniently.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CrEnvelope {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    metadata: K8sMeta,
    #[serde(default)]
    spec: Value,
    #[serde(default)]
    status: Value,
}

/// The v3 resource of `kind` held by the custom resource `cr` (as the API server returns it:
/// GET, an item of a LIST, the object of a WATCH event). `metadata.resourceVersion` is the
/// custom resource's. A custom resource that does not decode is an error naming it and the
/// field (`IPPool "pool-1": spec.natOutgoing: invalid type: string "yes", expected a boolean`).
pub fn cr_to_resource(kind: Kind, cr: &Value) -> Result<Resource> {
    let crd = crd_for(kind).ok_or_else(|| {
        KddError::new(
            value_label(kind.name(), cr),
            "kind",
            format!("{kind} is not stored as a custom resource in the Kubernetes datastore"),
        )
    })?;
    let object = value_label(crd.kind, cr);
    if !cr.is_object() {
        return Err(KddError::new(&object, "<object>", "not a JSON object"));
    }
    let env: CrEnvelope = decode(cr, &object)?;
    if let Some(v) = env.api_version.as_deref().filter(|v| *v != CRD_API_VERSION) {
        return Err(KddError::new(
            &object,
            "apiVersion",
            format!("{v:?}: expected {CRD_API_VERSION}"),
        ));
    }
    if let Some(k) = env.kind.as_deref().filter(|k| *k != crd.kind) {
        return Err(KddError::new(
            &object,
            "kind",
            format!("{k:?}: expected {}", crd.kind),
        ));
    }
    let tier = env
        .spec
        .get("tier")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let meta = v3_metadata(kind, env.metadata, tier, &object)?;

    let mut v3 = Map::new();
    v3.insert("apiVersion".into(), Value::String(V3_API_VERSION.into()));
    v3.insert("kind".into(), Value::String(kind.name().into()));
    v3.insert(
        "metadata".into(),
        serde_json::to_value(&meta)
            .map_err(|e| KddError::new(&object, "metadata", e.to_string()))?,
    );
    v3.insert(
        "spec".into(),
        match env.spec {
            Value::Null => Value::Object(Map::new()),
            spec => spec,
        },
    );
    if crd.has_status && !env.status.is_null() {
        v3.insert("status".into(), env.status);
    }
    margay_api::codec::decode_value(Value::Object(v3)).map_err(|e| match e {
        margay_api::DecodeError::Field { path, message } => KddError::new(&object, path, message),
        other => KddError::new(&object, "<object>", other.to_string()),
    })
}

/// The v3 name: the annotation's, else the custom resource's (without the `default.` that
/// Calico before 3.32 put before the names of default-tier policies).
fn v3_name(kind: Kind, cr_name: String, stored_name: String, tier: &str) -> String {
    if !stored_name.is_empty() {
        stored_name
    } else if is_policy(kind) && (tier.is_empty() || tier == "default") {
        cr_name
            .strip_prefix("default.")
            .map(str::to_string)
            .unwrap_or(cr_name)
    } else {
        cr_name
    }
}

/// The v3 namespace and name a custom resource of `kind` stands for, read from its metadata
/// and tier alone: the key of a resource whose spec (or the rest of its metadata) does not
/// convert, so that readers can drop what they had under it. None without a name.
pub fn cr_resource_name(kind: Kind, cr: &Value) -> Option<(String, String)> {
    let crd = crd_for(kind)?;
    let meta = cr.get("metadata")?;
    let cr_name = meta.get("name").and_then(Value::as_str).unwrap_or_default();
    if cr_name.is_empty() {
        return None;
    }
    let stored_name = meta
        .pointer(&format!(
            "/annotations/{}",
            METADATA_ANNOTATION.replace('~', "~0").replace('/', "~1")
        ))
        .and_then(Value::as_str)
        .and_then(|t| serde_json::from_str::<Value>(t).ok())
        .and_then(|m| m.get("name").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_default();
    let tier = cr
        .pointer("/spec/tier")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let namespace = if crd.namespaced {
        meta.get("namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    } else {
        String::new()
    };
    Some((
        namespace,
        v3_name(kind, cr_name.to_string(), stored_name, tier),
    ))
}

/// The v3 metadata of a custom resource (the rules in the module documentation).
fn v3_metadata(kind: Kind, cr: K8sMeta, tier: &str, object: &str) -> Result<ObjectMeta> {
    // The custom resource's uid is never used as is, so the v3 uid is the same whether or not
    // the annotation is present.
    let uid = if cr.uid.is_empty() {
        String::new()
    } else {
        convert_uid(&cr.uid).ok_or_else(|| {
            KddError::new(
                object,
                "metadata.uid",
                format!("{:?} is not a UUID", cr.uid),
            )
        })?
    };
    let Some(text) = cr.annotations.get(METADATA_ANNOTATION).cloned() else {
        let mut meta = cr.into_object_meta();
        meta.uid = uid;
        return Ok(meta);
    };
    let field = annotation_path(METADATA_ANNOTATION);
    let stored: K8sMeta = decode_str(&text, object, &field)?;

    let mut owner_references = Vec::with_capacity(stored.owner_references.len());
    for (i, o) in stored.owner_references.into_iter().enumerate() {
        let mut o = OwnerReference::from(o);
        // v3 owners written before Calico converted owner uids are converted too, as Calico does.
        if o.api_version == CRD_API_VERSION || o.api_version == V3_API_VERSION {
            o.api_version = V3_API_VERSION.to_string();
            o.uid = convert_uid(&o.uid).ok_or_else(|| {
                KddError::new(
                    object,
                    &field,
                    format!("ownerReferences[{i}].uid: {:?} is not a UUID", o.uid),
                )
            })?;
        }
        owner_references.push(o);
    }
    let mut annotations = cr.annotations;
    annotations.remove(METADATA_ANNOTATION);
    annotations.extend(stored.annotations);
    let mut labels = cr.labels.unwrap_or_default();
    labels.extend(stored.labels.unwrap_or_default());
    let name = v3_name(kind, cr.name, stored.name, tier);
    Ok(ObjectMeta {
        name,
        generate_name: stored.generate_name,
        namespace: cr.namespace,
        self_link: stored.self_link,
        uid,
        resource_version: cr.resource_version,
        generation: stored.generation,
        creation_timestamp: stored.creation_timestamp.or(cr.creation_timestamp),
        deletion_timestamp: stored.deletion_timestamp,
        deletion_grace_period_seconds: stored.deletion_grace_period_seconds,
        labels,
        annotations,
        owner_references,
        finalizers: stored.finalizers,
        managed_fields: stored.managed_fields,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_name_of_a_custom_resource_whose_spec_does_not_convert() {
        let bad_spec = serde_json::json!({"egress": [{"action": "Allowed"}]});
        let cr = |name: &str, ann: Option<&str>, ns: Option<&str>, tier: Option<&str>| {
            let mut spec = bad_spec.clone();
            if let Some(t) = tier {
                spec["tier"] = Value::String(t.into());
            }
            let mut meta = serde_json::json!({"name": name});
            if let Some(a) = ann {
                meta["annotations"] = serde_json::json!({METADATA_ANNOTATION: a});
            }
            if let Some(n) = ns {
                meta["namespace"] = Value::String(n.into());
            }
            serde_json::json!({"apiVersion": CRD_API_VERSION, "kind": "GlobalNetworkPolicy",
                               "metadata": meta, "spec": spec})
        };
        let gnp = cr(
            "allow-dns",
            Some(r#"{"name":"allow-dns","creationTimestamp":null}"#),
            None,
            None,
        );
        assert!(cr_to_resource(Kind::GlobalNetworkPolicy, &gnp).is_err());
        assert_eq!(
            cr_resource_name(Kind::GlobalNetworkPolicy, &gnp),
            Some((String::new(), "allow-dns".to_string()))
        );
        // Without the annotation: the CR's name, `default.` dropped in the default tier only.
        let old = cr("default.deny", None, None, None);
        assert_eq!(
            cr_resource_name(Kind::GlobalNetworkPolicy, &old).unwrap().1,
            "deny"
        );
        let tiered = cr("default.deny", None, None, Some("security"));
        assert_eq!(
            cr_resource_name(Kind::GlobalNetworkPolicy, &tiered)
                .unwrap()
                .1,
            "default.deny"
        );
        // Namespaced kinds keep their namespace; a broken annotation still leaves the CR name.
        let np = cr("p", Some("{not json"), Some("shop"), None);
        assert_eq!(
            cr_resource_name(Kind::NetworkPolicy, &np),
            Some(("shop".to_string(), "p".to_string()))
        );
        assert_eq!(
            cr_resource_name(
                Kind::GlobalNetworkPolicy,
                &serde_json::json!({"metadata": {}})
            ),
            None
        );
        assert_eq!(cr_resource_name(Kind::Node, &gnp), None);
    }

    #[test]
    fn every_crd_backed_kind_has_one_crd() {
        for kind in Kind::ALL {
            let derived = matches!(kind, Kind::Node | Kind::WorkloadEndpoint | Kind::Profile);
            match crd_for(*kind) {
                None => assert!(derived, "{kind} has no CRD"),
                Some(c) => {
                    assert!(!derived, "{kind} is derived");
                    assert_eq!(c.namespaced, kind.is_namespaced(), "{kind}");
                    assert_eq!(c.v3_kind, kind.name());
                    assert_eq!(c.v3_plural, kind.plural());
                }
            }
        }
    }
}
