//! NetworkPolicies derived from Kubernetes `networking.k8s.io/v1` NetworkPolicies
//! (calico-kdd.md §4c; `lk8s/conversion/conversion.go` K8sNetworkPolicyToCalico). The rules
//! are margay-api's ([`margay_api::k8s`]), which margay also uses when such a policy is
//! applied in etcd mode.

use margay_api::k8s::{self, K8sNetworkPolicy};
use margay_api::{Resource, ValidationErrors};
use serde_json::Value;

use crate::json::{decode, label, value_label};
use crate::names::convert_uid;
use crate::{KddError, Result};

/// The v3 NetworkPolicy of a Kubernetes NetworkPolicy: named `knp.default.<name>` (the name
/// margay gives it in etcd mode too; Calico's KDD names it `<name>` with kind
/// KubernetesNetworkPolicy), same namespace, tier `default`, order 1000, with the policy's
/// resourceVersion and creationTimestamp and its uid converted
/// ([`crate::names::convert_uid`]).
///
/// A policy that cannot be converted exactly (margay refuses what Calico would convert only
/// in part) is an error naming each field at fault, joined with `; `.
pub fn k8s_network_policy_to_calico(np: &Value) -> Result<Resource> {
    let object = value_label("NetworkPolicy (networking.k8s.io/v1)", np);
    if let Some(v) = np.get("apiVersion").and_then(Value::as_str)
        && v != k8s::API_VERSION
    {
        return Err(KddError::new(
            &object,
            "apiVersion",
            format!("{v:?}: expected {}", k8s::API_VERSION),
        ));
    }
    let policy: K8sNetworkPolicy = decode(np, &object)?;
    let object = label(
        "NetworkPolicy (networking.k8s.io/v1)",
        &policy.metadata.namespace,
        &policy.metadata.name,
    );
    if policy.metadata.namespace.is_empty() {
        return Err(KddError::new(&object, "metadata.namespace", "required"));
    }
    let mut converted = k8s::convert(&policy).map_err(|e| joined(&object, &e))?;
    let m = &policy.metadata;
    converted.metadata.resource_version = m.resource_version.clone();
    converted.metadata.creation_timestamp = m.creation_timestamp.clone();
    if !m.uid.is_empty() {
        converted.metadata.uid = convert_uid(&m.uid).ok_or_else(|| {
            KddError::new(
                &object,
                "metadata.uid",
                format!("{:?} is not a UUID", m.uid),
            )
        })?;
    }
    Ok(Resource::NetworkPolicy(converted))
}

/// Every problem in one error: the first field in `field`, all of them in the message.
fn joined(object: &str, errors: &ValidationErrors) -> KddError {
    let field = errors
        .0
        .first()
        .map_or_else(|| "<object>".to_string(), |e| e.path.clone());
    let message = errors
        .0
        .iter()
        .map(|e| {
            if e.path == field {
                e.message.clone()
            } else {
                format!("{}: {}", e.path, e.message)
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    KddError::new(object, field, message)
}
