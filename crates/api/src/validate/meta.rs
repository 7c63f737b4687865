//! apiVersion/kind and metadata rules shared by every kind.

use crate::meta::ObjectMeta;
use crate::resource::{API_VERSION, Kind, Resource};

use super::syntax::{dns1123_label, dns1123_subdomain, label_chars_ok, qualified_name};
use super::{Path, Validator};

const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

pub(super) fn check_type_meta(v: &mut Validator, r: &Resource) {
    let (api_version, kind) = match r {
        Resource::BGPConfiguration(x) => (&x.api_version, &x.kind),
        Resource::BGPFilter(x) => (&x.api_version, &x.kind),
        Resource::BGPPeer(x) => (&x.api_version, &x.kind),
        Resource::ClusterInformation(x) => (&x.api_version, &x.kind),
        Resource::FelixConfiguration(x) => (&x.api_version, &x.kind),
        Resource::GlobalNetworkPolicy(x) => (&x.api_version, &x.kind),
        Resource::GlobalNetworkSet(x) => (&x.api_version, &x.kind),
        Resource::HostEndpoint(x) => (&x.api_version, &x.kind),
        Resource::IPAMConfiguration(x) => (&x.api_version, &x.kind),
        Resource::IPPool(x) => (&x.api_version, &x.kind),
        Resource::IPReservation(x) => (&x.api_version, &x.kind),
        Resource::KubeControllersConfiguration(x) => (&x.api_version, &x.kind),
        Resource::NetworkPolicy(x) => (&x.api_version, &x.kind),
        Resource::NetworkSet(x) => (&x.api_version, &x.kind),
        Resource::Node(x) => (&x.api_version, &x.kind),
        Resource::Profile(x) => (&x.api_version, &x.kind),
        Resource::Tier(x) => (&x.api_version, &x.kind),
        Resource::WorkloadEndpoint(x) => (&x.api_version, &x.kind),
    };
    if !api_version.is_empty() && api_version != API_VERSION {
        v.err(
            Path::ROOT.field("apiVersion"),
            format!("{api_version:?} is not supported (use {API_VERSION})"),
        );
    }
    if !kind.is_empty() && kind != r.kind().name() {
        v.err(
            Path::ROOT.field("kind"),
            format!("{kind:?} does not match the resource type {}", r.kind()),
        );
    }
}

pub(super) fn check_metadata(v: &mut Validator, p: Path<'_>, kind: Kind, m: &ObjectMeta) {
    check_name(v, p.field("name"), kind, &m.name);
    let ns = p.field("namespace");
    if kind.is_namespaced() {
        if !m.namespace.is_empty()
            && let Err(e) = dns1123_label(&m.namespace)
        {
            v.err(ns, format!("namespace {e}"));
        }
    } else if !m.namespace.is_empty() {
        v.err(
            ns,
            format!(
                "{kind} is cluster-scoped and cannot have a namespace (remove metadata.namespace)"
            ),
        );
    }
    let labels = p.field("labels");
    v.labels(&m.labels, labels);
    if matches!(kind, Kind::NetworkSet | Kind::GlobalNetworkSet)
        && m.labels.contains_key("projectcalico.org/namespace")
    {
        v.err(
            labels.key("projectcalico.org/namespace"),
            "label projectcalico.org/namespace is reserved (Calico sets it from the namespace)",
        );
    }
    annotations(v, p.field("annotations"), &m.annotations);
}

pub(super) fn annotations(
    v: &mut Validator,
    p: Path<'_>,
    annotations: &std::collections::BTreeMap<String, String>,
) {
    let mut total = 0usize;
    for (k, val) in annotations {
        if let Err(e) = qualified_name(&k.to_ascii_lowercase()) {
            v.err(p.key(k), format!("annotation key {k:?} is invalid: {e}"));
        }
        total += k.len() + val.len();
    }
    if total > ANNOTATIONS_MAX_BYTES {
        v.err(
            p,
            format!("annotations total {total} bytes (max {ANNOTATIONS_MAX_BYTES})"),
        );
    }
}

fn check_name(v: &mut Validator, p: Path<'_>, kind: Kind, name: &str) {
    if name.is_empty() {
        // A WorkloadEndpoint's name is derived from its spec when left out.
        if kind != Kind::WorkloadEndpoint {
            v.err(p, "required: every resource needs metadata.name");
        }
        return;
    }
    match kind {
        Kind::ClusterInformation | Kind::IPAMConfiguration | Kind::KubeControllersConfiguration => {
            if name != "default" {
                v.err(
                    p,
                    format!("{kind} is a singleton: its name must be \"default\", not {name:?}"),
                );
            }
        }
        Kind::Tier => {
            if let Err(e) = dns1123_label(name) {
                v.err(p, format!("tier name {e}"));
            }
        }
        Kind::NetworkPolicy => {
            if name.len() > 253 {
                v.err(
                    p,
                    format!("name must be at most 253 characters (is {})", name.len()),
                );
            } else if !network_policy_name_ok(name) {
                v.err(
                    p,
                    format!(
                        "{name:?} is not a valid NetworkPolicy name: use a DNS label (lower case letters, digits, '-'), optionally prefixed by a tier name and '.', e.g. \"allow-dns\" or \"security.allow-dns\""
                    ),
                );
            }
        }
        Kind::GlobalNetworkPolicy => {
            if name.len() > 253 {
                v.err(
                    p,
                    format!("name must be at most 253 characters (is {})", name.len()),
                );
            } else if !global_policy_name_ok(name) {
                v.err(
                    p,
                    format!(
                        "{name:?} is not a valid GlobalNetworkPolicy name: use a DNS label (lower case letters, digits, '-'), optionally prefixed by a tier name and '.', e.g. \"deny-all\" or \"security.deny-all\""
                    ),
                );
            }
        }
        _ => {
            if let Err(e) = dns1123_subdomain(name) {
                v.err(p, format!("name {e}"));
            }
        }
    }
}

/// `label` or `tier.label`, or the names Calico gives converted Kubernetes and OpenStack
/// policies (`knp.default.<subdomain>`, `ossg.default.<subdomain>`).
fn network_policy_name_ok(name: &str) -> bool {
    for prefix in ["knp.default.", "ossg.default."] {
        if let Some(rest) = name.strip_prefix(prefix)
            && dns1123_subdomain(rest).is_ok()
        {
            return true;
        }
    }
    global_policy_name_ok(name)
}

fn global_policy_name_ok(name: &str) -> bool {
    match name.split_once('.') {
        Some((tier, rest)) => label_chars_ok(tier) && label_chars_ok(rest),
        None => label_chars_ok(name),
    }
}
