//! What the etcd-mode mirror controllers write (pure): the differences between the Calico
//! resources Kubernetes objects convert to and the ones stored, and the label updates of
//! WorkloadEndpoints (Calico's policy, namespace, serviceaccount and pod controllers).
//!
//! Only the spec is compared and written (Calico's controllers copy `Spec` onto what they
//! read), so an update keeps the stored metadata and is a compare-and-swap on its version.
//! Stored resources of the controller's prefix with no Kubernetes object are deleted, except
//! those whose object exists but does not convert: the last good copy stays (deleting it
//! would drop a policy, which fails open) and the error is reported.

use std::collections::{BTreeMap, BTreeSet};

use margay_api::{Resource, ResourceKey, WorkloadEndpoint};

use crate::pods::PodView;

/// One write.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Create(Resource),
    /// The stored resource with the new spec (its resourceVersion: compare-and-swap).
    Update(Resource),
    Delete {
        key: ResourceKey,
        resource_version: String,
    },
}

/// The stored resource with the spec of `desired`, or None when the specs are the same (or
/// the kinds differ, which cannot be merged).
pub fn updated(current: &Resource, desired: &Resource) -> Option<Resource> {
    let mut out = current.clone();
    match (&mut out, desired) {
        (Resource::Profile(c), Resource::Profile(d)) if c.spec != d.spec => {
            c.spec = d.spec.clone();
        }
        (Resource::NetworkPolicy(c), Resource::NetworkPolicy(d)) if c.spec != d.spec => {
            c.spec = d.spec.clone();
        }
        _ => return None,
    }
    Some(out)
}

/// The writes that make `current` (stored resources of the controller) follow `desired` (the
/// converted Kubernetes objects). `keep`: keys whose object exists but does not convert.
pub fn plan(
    desired: &BTreeMap<ResourceKey, Resource>,
    current: &BTreeMap<ResourceKey, Resource>,
    keep: &BTreeSet<ResourceKey>,
) -> Vec<Action> {
    let mut out = Vec::new();
    for (k, d) in desired {
        match current.get(k) {
            None => {
                let mut r = d.clone();
                // A new resource gets its own version (and the datastore refuses one given).
                r.metadata_mut().resource_version.clear();
                out.push(Action::Create(r));
            }
            Some(c) => {
                if let Some(u) = updated(c, d) {
                    out.push(Action::Update(u));
                }
            }
        }
    }
    for (k, c) in current {
        if !desired.contains_key(k) && !keep.contains(k) {
            out.push(Action::Delete {
                key: k.clone(),
                resource_version: c.metadata().resource_version.clone(),
            });
        }
    }
    out
}

/// A pod the pod controller acts on (Calico's isReadyCalicoPod): scheduled, not host
/// networked, with an address.
pub fn ready_calico_pod(pod: &PodView) -> bool {
    !pod.host_network && pod.has_pod_ip && !pod.node.is_empty()
}

/// The endpoint with the pod's labels and service account, when they differ (Calico's pod
/// controller: endpoints are created and deleted by the CNI plugin; only these follow the pod).
pub fn endpoint_update(wep: &WorkloadEndpoint, pod: &PodView) -> Option<WorkloadEndpoint> {
    if !ready_calico_pod(pod) {
        return None;
    }
    let data = pod.endpoint.as_ref()?;
    if wep.metadata.labels == data.labels && wep.spec.service_account_name == data.service_account {
        return None;
    }
    let mut w = wep.clone();
    w.metadata.labels = data.labels.clone();
    w.spec.service_account_name = data.service_account.clone();
    Some(w)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use margay_api::endpoint::WorkloadEndpointSpec;
    use margay_api::policy::{Action as RuleAction, ProfileSpec, Rule};
    use margay_api::{Kind, ObjectMeta, Profile};
    use std::collections::BTreeMap;

    fn profile(name: &str, rv: &str, label: &str) -> Resource {
        Resource::Profile(Profile::new(
            ObjectMeta {
                name: name.into(),
                resource_version: rv.into(),
                ..ObjectMeta::default()
            },
            ProfileSpec {
                ingress: vec![Rule::new(RuleAction::Allow)],
                labels_to_apply: BTreeMap::from([("pcns.team".to_string(), label.to_string())]),
                ..ProfileSpec::default()
            },
        ))
    }

    fn map(rs: &[Resource]) -> BTreeMap<ResourceKey, Resource> {
        rs.iter().map(|r| (r.key(), r.clone())).collect()
    }

    #[test]
    fn creates_updates_and_deletes_only_what_differs() {
        let desired = map(&[
            profile("kns.a", "11", "x"),
            profile("kns.b", "12", "y"),
            profile("kns.c", "13", "z"),
        ]);
        let current = map(&[
            profile("kns.b", "5", "y"),
            profile("kns.c", "6", "old"),
            profile("kns.gone", "7", "q"),
            profile("kns.broken", "8", "q"),
        ]);
        let keep = BTreeSet::from([ResourceKey {
            kind: Kind::Profile,
            namespace: String::new(),
            name: "kns.broken".into(),
        }]);
        let actions = plan(&desired, &current, &keep);
        assert_eq!(actions.len(), 3, "{actions:#?}");
        match &actions[0] {
            Action::Create(r) => {
                assert_eq!(r.name(), "kns.a");
                assert!(r.metadata().resource_version.is_empty());
            }
            other => panic!("{other:?}"),
        }
        match &actions[1] {
            Action::Update(Resource::Profile(p)) => {
                assert_eq!(p.metadata.name, "kns.c");
                assert_eq!(
                    p.metadata.resource_version, "6",
                    "CAS on the stored version"
                );
                assert_eq!(p.spec.labels_to_apply["pcns.team"], "z");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            actions[2],
            Action::Delete {
                key: ResourceKey {
                    kind: Kind::Profile,
                    namespace: String::new(),
                    name: "kns.gone".into()
                },
                resource_version: "7".into()
            }
        );
        // Applying the plan leaves nothing to do.
        let after = map(&[
            profile("kns.a", "20", "x"),
            profile("kns.b", "5", "y"),
            profile("kns.c", "21", "z"),
            profile("kns.broken", "8", "q"),
        ]);
        assert!(plan(&desired, &after, &keep).is_empty());
    }

    fn pod(labels: &[(&str, &str)], sa: &str, ip: bool) -> PodView {
        PodView {
            namespace: "ns".into(),
            name: "web".into(),
            node: "n1".into(),
            host_network: false,
            has_pod_ip: ip,
            ips_reported: ip,
            evicted: false,
            endpoint_ips: Some(Vec::new()),
            endpoint: Some(crate::pods::EndpointData {
                name: "n1-k8s-web-eth0".into(),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                service_account: sa.into(),
            }),
        }
    }

    #[test]
    fn endpoints_follow_their_pods_labels_and_service_account() {
        let mut wep = WorkloadEndpoint::new(
            ObjectMeta::namespaced("ns", "n1-k8s-web-eth0"),
            WorkloadEndpointSpec::default(),
        );
        wep.metadata.labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        assert_eq!(
            endpoint_update(&wep, &pod(&[("app", "web")], "", true)),
            None
        );
        let u = endpoint_update(&wep, &pod(&[("app", "api")], "sa", true)).unwrap();
        assert_eq!(u.metadata.labels["app"], "api");
        assert_eq!(u.spec.service_account_name, "sa");
        // Pods without an address are not acted on (the CNI plugin has not run yet).
        assert_eq!(
            endpoint_update(&wep, &pod(&[("app", "api")], "", false)),
            None
        );
    }
}
