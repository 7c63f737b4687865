//! Kind names on the command line, and how resources are named in messages.

use margay_api::suggest::closest;
use margay_api::{Kind, ResourceKey};

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
