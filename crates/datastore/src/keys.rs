//! Calico's etcd key layout for v3 resources:
//! `/calico/resources/v3/projectcalico.org/<plural>[/<namespace>]/<name>`.

use margay_api::{Kind, ResourceKey};

pub const RESOURCE_ROOT: &str = "/calico/resources/v3/projectcalico.org/";

/// The key a resource is stored under.
pub fn resource_path(key: &ResourceKey) -> String {
    if key.kind.is_namespaced() {
        format!(
            "{RESOURCE_ROOT}{}/{}/{}",
            key.kind.plural(),
            key.namespace,
            key.name
        )
    } else {
        format!("{RESOURCE_ROOT}{}/{}", key.kind.plural(), key.name)
    }
}

/// The prefix of every key of a kind, or of one namespace of a namespaced kind, optionally
/// narrowed to names starting with `name_prefix`.
pub fn kind_prefix(kind: Kind, namespace: Option<&str>, name_prefix: &str) -> String {
    match namespace {
        Some(ns) if kind.is_namespaced() => {
            format!("{RESOURCE_ROOT}{}/{ns}/{name_prefix}", kind.plural())
        }
        _ if kind.is_namespaced() && !name_prefix.is_empty() => {
            // Without a namespace a name prefix cannot be a key prefix; the caller filters.
            format!("{RESOURCE_ROOT}{}/", kind.plural())
        }
        _ => format!("{RESOURCE_ROOT}{}/{name_prefix}", kind.plural()),
    }
}

/// Parses a resource key path back into kind, namespace and name.
pub fn parse_resource_path(path: &str) -> Option<ResourceKey> {
    let rest = path.strip_prefix(RESOURCE_ROOT)?;
    let mut parts = rest.split('/');
    let plural = parts.next()?;
    let kind = Kind::ALL.iter().copied().find(|k| k.plural() == plural)?;
    let (namespace, name) = if kind.is_namespaced() {
        (parts.next()?.to_string(), parts.next()?.to_string())
    } else {
        (String::new(), parts.next()?.to_string())
    };
    if parts.next().is_some() || name.is_empty() || (kind.is_namespaced() && namespace.is_empty()) {
        return None;
    }
    Some(ResourceKey {
        kind,
        namespace,
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_round_trip() {
        for (kind, ns) in [
            (Kind::IPPool, ""),
            (Kind::NetworkPolicy, "prod"),
            (Kind::WorkloadEndpoint, "kube-system"),
        ] {
            let key = ResourceKey {
                kind,
                namespace: ns.into(),
                name: "a.b-c".into(),
            };
            let path = resource_path(&key);
            assert_eq!(parse_resource_path(&path), Some(key));
        }
        assert_eq!(
            resource_path(&ResourceKey {
                kind: Kind::GlobalNetworkPolicy,
                namespace: String::new(),
                name: "deny".into()
            }),
            "/calico/resources/v3/projectcalico.org/globalnetworkpolicies/deny"
        );
        assert_eq!(
            parse_resource_path("/calico/resources/v3/projectcalico.org/ippools/a/b"),
            None
        );
        assert_eq!(
            parse_resource_path("/calico/resources/v3/projectcalico.org/networkpolicies/ns"),
            None
        );
        assert_eq!(parse_resource_path("/calico/ipam/v2/config"), None);
    }

    #[test]
    fn prefixes() {
        assert_eq!(
            kind_prefix(Kind::NetworkPolicy, Some("prod"), ""),
            "/calico/resources/v3/projectcalico.org/networkpolicies/prod/"
        );
        assert_eq!(
            kind_prefix(Kind::IPPool, None, "default-"),
            "/calico/resources/v3/projectcalico.org/ippools/default-"
        );
    }
}
