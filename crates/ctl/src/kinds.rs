//! Kind names on the command line, and how resources are named in messages.

use margay_api::suggest::closest;
use margay_api::{Kind, Resource, ResourceKey, k8s};

/// kubectl's names for Kubernetes NetworkPolicies (any case). `get` and `delete` take them to
/// mean the v3 NetworkPolicies converted from Kubernetes ones (`knp.default.<name>`).
const K8S_POLICY_KINDS: [&str; 4] = [
    "networkpolicies.networking.k8s.io",
    "networkpolicy.networking.k8s.io",
    "netpol",
    "netpols",
];

/// A kind named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KindArg {
    pub kind: Kind,
    /// Kubernetes NetworkPolicies: names are the Kubernetes names, listings show only the
    /// converted policies.
    pub k8s_policies: bool,
}

impl KindArg {
    /// The stored name of a resource named on the command line: `knp.default.<name>` for a
    /// Kubernetes policy (a name that already has the prefix is kept).
    pub fn stored_name(&self, name: &str) -> String {
        if self.k8s_policies && !name.starts_with(k8s::NAME_PREFIX) {
            k8s::policy_name(name)
        } else {
            name.to_string()
        }
    }

    /// Whether a resource of the kind belongs in a listing of this kind argument.
    pub fn lists(&self, r: &Resource) -> bool {
        !self.k8s_policies || r.name().starts_with(k8s::NAME_PREFIX)
    }
}

/// Like [`parse_kind`], and also kubectl's names for Kubernetes NetworkPolicies.
pub(crate) fn parse_kind_arg(input: &str) -> Result<KindArg, String> {
    if K8S_POLICY_KINDS
        .iter()
        .any(|k| k.eq_ignore_ascii_case(input))
    {
        return Ok(KindArg {
            kind: Kind::NetworkPolicy,
            k8s_policies: true,
        });
    }
    parse_kind(input).map(|kind| KindArg {
        kind,
        k8s_policies: false,
    })
}

/// Looks up a kind as calicoctl accepts it (singular, plural, short form, any case), or says
/// which kinds there are and which one was probably meant.
pub(crate) fn parse_kind(input: &str) -> Result<Kind, String> {
    if let Some(k) = Kind::from_alias(input) {
        return Ok(k);
    }
    let candidates = Kind::ALL.iter().flat_map(|k| k.aliases().iter().copied());
    let hint = closest(input, candidates)
        .map(|s| format!(" (did you mean '{s}'?)"))
        .unwrap_or_default();
    let valid: Vec<&str> = Kind::ALL.iter().map(|k| k.aliases()[0]).collect();
    Err(format!(
        "resource type '{input}' is not supported{hint}; valid resource types are: {}",
        valid.join(", ")
    ))
}

/// A resource as Calico's errors name it: `IPPool(default-ipv4-ippool)`,
/// `NetworkPolicy(prod/allow-dns)`.
pub(crate) fn ident(key: &ResourceKey) -> String {
    if key.namespace.is_empty() {
        format!("{}({})", key.kind, key.name)
    } else {
        format!("{}({}/{})", key.kind, key.namespace, key.name)
    }
}

/// The key of `name` of `kind`, in `namespace` when the kind is namespaced.
pub(crate) fn key_of(kind: Kind, namespace: &str, name: &str) -> ResourceKey {
    ResourceKey {
        kind,
        namespace: if kind.is_namespaced() {
            namespace.to_string()
        } else {
            String::new()
        },
        name: name.to_string(),
    }
}

/// The namespace to use for a namespaced kind named on the command line: `-n`, else
/// `default`.
pub(crate) fn namespace_or_default(ns: Option<&str>) -> &str {
    match ns {
        Some(ns) if !ns.is_empty() => ns,
        _ => "default",
    }
}
