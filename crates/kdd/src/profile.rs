//! Profiles derived from Namespaces and ServiceAccounts, and the synthetic
//! `projectcalico-default-allow` (calico-kdd.md §4b; `lk8s/conversion/conversion.go`
//! NamespaceToProfile / ServiceAccountToProfile, `libcalico-go/lib/resources/static.go`).
//!
//! Revisions: Calico gives these profiles the pair `<namespace RV>/<service account RV>`;
//! margay has one store-wide revision, so a profile's resourceVersion is simply the
//! resourceVersion of the object it comes from.

use std::collections::BTreeMap;

use margay_api::policy::{Action, ProfileSpec, Rule};
use margay_api::{ObjectMeta, Profile, Resource};
use serde::Deserialize;
use serde_json::Value;

use crate::json::{decode, label, null_as_default, value_label};
use crate::meta::K8sMeta;
use crate::names::convert_uid;
use crate::pod::{
    NAMESPACE_PROFILE_PREFIX, SERVICE_ACCOUNT_PROFILE_PREFIX, service_account_profile_name,
};
use crate::{KddError, Result};

/// The profile Calico serves in the Kubernetes datastore that allows everything (for host
/// endpoints, e.g. auto host endpoints).
pub const DEFAULT_ALLOW_PROFILE: &str = "projectcalico-default-allow";
/// Prefix of the labels a namespace profile applies (`pcns.<label>`).
pub const NAMESPACE_LABEL_PREFIX: &str = "pcns.";
/// Prefix of the labels a service account profile applies (`pcsa.<label>`).
pub const SERVICE_ACCOUNT_LABEL_PREFIX: &str = "pcsa.";
/// The label (after the prefix) holding the namespace's or service account's name.
pub const NAME_LABEL: &str = "projectcalico.org/name";

#[derive(Deserialize, Default)]
#[serde(default)]
struct Object {
    #[serde(deserialize_with = "null_as_default")]
    metadata: K8sMeta,
}

/// Metadata of a derived profile: its name, the source's creationTimestamp and
/// resourceVersion, and the source's uid converted (so the two never share a uid).
fn profile_meta(name: String, source: &K8sMeta, object: &str) -> Result<ObjectMeta> {
    let uid = if source.uid.is_empty() {
        String::new()
    } else {
        convert_uid(&source.uid).ok_or_else(|| {
            KddError::new(
                object,
                "metadata.uid",
                format!("{:?} is not a UUID", source.uid),
            )
        })?
    };
    Ok(ObjectMeta {
        name,
        uid,
        creation_timestamp: source.creation_timestamp.clone(),
        resource_version: source.resource_version.clone(),
        ..ObjectMeta::default()
    })
}

fn labels_to_apply(prefix: &str, source: &K8sMeta) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = source
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (format!("{prefix}{k}"), v.clone()))
        .collect();
    labels.insert(format!("{prefix}{NAME_LABEL}"), source.name.clone());
    labels
}

/// The profile `kns.<namespace>` of a Namespace: allow all ingress and egress, and apply the
/// namespace's labels as `pcns.<label>` plus `pcns.projectcalico.org/name: <namespace>` to its
/// endpoints (namespaceSelectors match these).
pub fn namespace_to_profile(ns: &Value) -> Result<Resource> {
    let object = value_label("Namespace", ns);
    let ns: Object = decode(ns, &object)?;
    let m = &ns.metadata;
    if m.name.is_empty() {
        return Err(KddError::new(&object, "metadata.name", "required"));
    }
    let meta = profile_meta(format!("{NAMESPACE_PROFILE_PREFIX}{}", m.name), m, &object)?;
    Ok(Resource::Profile(Profile::new(
        meta,
        ProfileSpec {
            ingress: vec![Rule::new(Action::Allow)],
            egress: vec![Rule::new(Action::Allow)],
            labels_to_apply: labels_to_apply(NAMESPACE_LABEL_PREFIX, m),
        },
    )))
}

/// The profile `ksa.<namespace>.<name>` of a ServiceAccount: no rules; applies the service
/// account's labels as `pcsa.<label>` plus `pcsa.projectcalico.org/name: <name>`
/// (serviceAccountSelectors match these).
pub fn service_account_to_profile(sa: &Value) -> Result<Resource> {
    let object = value_label("ServiceAccount", sa);
    let sa: Object = decode(sa, &object)?;
    let m = &sa.metadata;
    let object = label("ServiceAccount", &m.namespace, &m.name);
    if m.name.is_empty() {
        return Err(KddError::new(&object, "metadata.name", "required"));
    }
    let meta = profile_meta(
        service_account_profile_name(&m.namespace, &m.name),
        m,
        &object,
    )?;
    Ok(Resource::Profile(Profile::new(
        meta,
        ProfileSpec {
            labels_to_apply: labels_to_apply(SERVICE_ACCOUNT_LABEL_PREFIX, m),
            ..ProfileSpec::default()
        },
    )))
}

/// `projectcalico-default-allow`: allow all ingress and egress. It exists in no API; Calico
/// serves it with revision `1`, and so does this.
pub fn default_allow_profile() -> Resource {
    Resource::Profile(Profile::new(
        ObjectMeta {
            name: DEFAULT_ALLOW_PROFILE.to_string(),
            resource_version: "1".to_string(),
            ..ObjectMeta::default()
        },
        ProfileSpec {
            ingress: vec![Rule::new(Action::Allow)],
            egress: vec![Rule::new(Action::Allow)],
            ..ProfileSpec::default()
        },
    ))
}

/// Where a profile comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileSource<'a> {
    /// `kns.<namespace>`.
    Namespace(&'a str),
    /// `ksa.<namespace>.<service account>` (namespace names have no dots; service account
    /// names may).
    ServiceAccount { namespace: &'a str, name: &'a str },
    /// `projectcalico-default-allow`.
    DefaultAllow,
}

/// The object a profile name is derived from; None for names no Kubernetes object gives.
pub fn profile_source(name: &str) -> Option<ProfileSource<'_>> {
    if name == DEFAULT_ALLOW_PROFILE {
        return Some(ProfileSource::DefaultAllow);
    }
    if let Some(ns) = name.strip_prefix(NAMESPACE_PROFILE_PREFIX) {
        return (!ns.is_empty()).then_some(ProfileSource::Namespace(ns));
    }
    let rest = name.strip_prefix(SERVICE_ACCOUNT_PROFILE_PREFIX)?;
    let (namespace, name) = rest.split_once('.')?;
    (!namespace.is_empty() && !name.is_empty())
        .then_some(ProfileSource::ServiceAccount { namespace, name })
}
