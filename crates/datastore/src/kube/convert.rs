//! API objects ⇄ Calico's key/value pairs, per [`Source`]: the glue between the routing table
//! and the pure KDD mapping in `margay-kdd`.

use margay_api::{Kind, Resource};
use margay_kdd as kdd;
use serde_json::Value;

use super::api::{parse_revision, resource_version};
use super::route::{self, DEFAULT_ALLOW_PROFILE, Source, Target};
use crate::keys::resource_path;
use crate::kv::KeyValue;

/// Settings the conversions need.
#[derive(Debug, Clone)]
pub struct Converter {
    /// The host-side interface name prefix of pods' veths (first item of
    /// FELIX_INTERFACEPREFIX, `cali` by default): part of each derived WorkloadEndpoint.
    pub interface_prefix: String,
}

impl Default for Converter {
    fn default() -> Self {
        Converter {
            interface_prefix: "cali".to_string(),
        }
    }
}

/// The revision of the static default-allow profile (it never changes).
pub const DEFAULT_ALLOW_REVISION: i64 = 1;

/// How a write reaches the API.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteBody {
    /// The whole object (POST to create, PUT to replace).
    Object(Value),
    /// A JSON merge patch on the object's `status` subresource (Pods and Nodes: Calico writes
    /// its annotations there, which is what its RBAC grants).
    StatusPatch(Value),
}

fn obj_name(obj: &Value) -> String {
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("?");
    if ns.is_empty() {
        name.to_string()
    } else {
        format!("{ns}/{name}")
    }
}

fn encode_resource(r: &Resource) -> Result<(String, Vec<u8>), String> {
    let mut r = r.clone();
    r.metadata_mut().resource_version.clear();
    let key = resource_path(&r.key());
    let value = serde_json::to_vec(&r).map_err(|e| format!("{}: cannot encode: {e}", r.key()))?;
    Ok((key, value))
}

impl Converter {
    /// The key and value an object stands for; None when it stands for nothing (a host-network
    /// or unscheduled pod, an IPAM object Calico is deleting). Errors name the object.
    pub fn to_kv(&self, source: Source, obj: &Value) -> Result<Option<KeyValue>, String> {
        let rv = resource_version(obj).unwrap_or_default();
        let Some(revision) = parse_revision(rv) else {
            return Err(format!(
                "{}: resourceVersion {rv:?} is not a number (margay needs an API server whose resourceVersions are etcd revisions)",
                obj_name(obj)
            ));
        };
        let kv = |(key, value): (String, Vec<u8>)| KeyValue {
            key,
            value,
            create_revision: revision,
            mod_revision: revision,
        };
        let err = |e: &dyn std::fmt::Display| format!("{}: {e}", obj_name(obj));
        Ok(match source {
            Source::Crd(kind) => {
                let r = kdd::crd::cr_to_resource(kind, obj).map_err(|e| err(&e))?;
                // A Calico NetworkPolicy may not take the names of converted Kubernetes ones.
                if kind == Kind::NetworkPolicy && r.name().starts_with("knp.default.") {
                    return Ok(None);
                }
                Some(kv(encode_resource(&r)?))
            }
            Source::Pods => {
                match kdd::pod::pod_to_workload_endpoint(obj, &self.interface_prefix)
                    .map_err(|e| err(&e))?
                {
                    Some(r) => Some(kv(encode_resource(&r)?)),
                    None => None,
                }
            }
            Source::Namespaces => {
                let r = kdd::profile::namespace_to_profile(obj).map_err(|e| err(&e))?;
                Some(kv(encode_resource(&r)?))
            }
            Source::ServiceAccounts => {
                let r = kdd::profile::service_account_to_profile(obj).map_err(|e| err(&e))?;
                Some(kv(encode_resource(&r)?))
            }
            Source::DefaultAllow => Some(self.default_allow()?),
            Source::Nodes => {
                let r = kdd::node::k8s_node_to_calico(obj).map_err(|e| err(&e))?;
                Some(kv(encode_resource(&r)?))
            }
            Source::K8sNetworkPolicies => {
                let r = kdd::netpol::k8s_network_policy_to_calico(obj).map_err(|e| err(&e))?;
                Some(kv(encode_resource(&r)?))
            }
            Source::IpamBlocks => match kdd::ipam::cr_to_block(obj).map_err(|e| err(&e))? {
                Some(json) => {
                    let cidr = json.get("cidr").and_then(Value::as_str).unwrap_or_default();
                    let key = route::block_key(cidr)
                        .ok_or_else(|| err(&format!("spec.cidr {cidr:?} is not a CIDR")))?;
                    Some(kv((key, to_bytes(&json)?)))
                }
                None => None,
            },
            Source::BlockAffinities => match kdd::ipam::cr_to_affinity(obj).map_err(|e| err(&e))? {
                Some((host, cidr, json)) => {
                    let key = route::affinity_key(&host, &cidr)
                        .ok_or_else(|| err(&format!("spec.cidr {cidr:?} is not a CIDR")))?;
                    Some(kv((key, to_bytes(&json)?)))
                }
                None => None,
            },
            Source::IpamHandles => match kdd::ipam::cr_to_handle(obj).map_err(|e| err(&e))? {
                Some((id, json)) => Some(kv((route::handle_key(&id), to_bytes(&json)?))),
                None => None,
            },
            Source::Services | Source::EndpointSlices => {
                let key = derived_key(source, obj).ok_or_else(|| err(&"no namespace or name"))?;
                Some(kv((key, to_bytes(&proxy_view(obj))?)))
            }
        })
    }

    /// The key an object stands for even when [`Converter::to_kv`] says it stands for nothing
    /// right now (an IPAM object mid-delete) or cannot convert it (what readers had under that
    /// key must go, as a fresh list would not have it): what a DELETED event removes.
    pub fn key_of(&self, source: Source, obj: &Value) -> Option<String> {
        match self.to_kv(source, obj) {
            Ok(Some(kv)) => return Some(kv.key),
            // Deliberately nothing (a host-network pod, a Calico policy under a knp. name).
            Ok(None) if !is_ipam(source) => return None,
            Ok(None) => {}
            Err(_) => {
                if let Some(key) = derived_key(source, obj) {
                    return Some(key);
                }
            }
        }
        match source {
            Source::IpamBlocks => obj
                .pointer("/spec/cidr")
                .and_then(Value::as_str)
                .and_then(route::block_key),
            Source::BlockAffinities => {
                let node = obj.pointer("/spec/node").and_then(Value::as_str)?;
                let cidr = obj.pointer("/spec/cidr").and_then(Value::as_str)?;
                route::affinity_key(node, cidr)
            }
            Source::IpamHandles => obj
                .pointer("/spec/handleID")
                .and_then(Value::as_str)
                .map(route::handle_key),
            _ => None,
        }
    }

    pub fn default_allow(&self) -> Result<KeyValue, String> {
        let r = kdd::profile::default_allow_profile();
        let (key, value) = encode_resource(&r)?;
        debug_assert!(key.ends_with(DEFAULT_ALLOW_PROFILE));
        Ok(KeyValue {
            key,
            value,
            create_revision: DEFAULT_ALLOW_REVISION,
            mod_revision: DEFAULT_ALLOW_REVISION,
        })
    }

    /// What writing `value` at the key `target` names sends to the API. `live` is the current
    /// Kubernetes Node, for Node writes (Calico's annotations are merged into it).
    pub fn write_body(
        &self,
        target: &Target,
        key: &str,
        value: &[u8],
        live: Option<&Value>,
    ) -> Result<WriteBody, String> {
        let json: Value =
            serde_json::from_slice(value).map_err(|e| format!("{key}: not JSON: {e}"))?;
        let resource = || -> Result<Resource, String> {
            margay_api::codec::decode_value(json.clone()).map_err(|e| format!("{key}: {e}"))
        };
        match target.source {
            Source::Crd(_) => {
                let r = resource()?;
                kdd::crd::resource_to_cr(&r)
                    .map(WriteBody::Object)
                    .map_err(|e| format!("{key}: {e}"))
            }
            Source::Pods => {
                let r = resource()?;
                Ok(WriteBody::StatusPatch(kdd::pod::workload_endpoint_patch(
                    &r,
                )))
            }
            Source::Nodes => {
                let r = resource()?;
                let live = live.ok_or_else(|| format!("{key}: the Kubernetes Node is needed"))?;
                kdd::node::calico_node_patch(&r, live)
                    .map(WriteBody::StatusPatch)
                    .map_err(|e| format!("{key}: {e}"))
            }
            Source::IpamBlocks => kdd::ipam::block_to_cr(&json)
                .map(WriteBody::Object)
                .map_err(|e| format!("{key}: {e}")),
            Source::BlockAffinities => {
                let rest = key.strip_prefix(route::IPAM_HOSTS_ROOT).unwrap_or_default();
                let (host, tail) = rest.split_once('/').unwrap_or_default();
                let cidr = route::ipam_cidr(tail).ok_or_else(|| format!("{key}: no block CIDR"))?;
                kdd::ipam::affinity_to_cr(host, &cidr, &json)
                    .map(WriteBody::Object)
                    .map_err(|e| format!("{key}: {e}"))
            }
            Source::IpamHandles => {
                let id = key
                    .strip_prefix(route::IPAM_HANDLES_ROOT)
                    .unwrap_or_default();
                kdd::ipam::handle_to_cr(id, &json)
                    .map(WriteBody::Object)
                    .map_err(|e| format!("{key}: {e}"))
            }
            Source::Namespaces
            | Source::ServiceAccounts
            | Source::DefaultAllow
            | Source::K8sNetworkPolicies
            | Source::Services
            | Source::EndpointSlices => Err(read_only(target.source, key)),
        }
    }
}

/// A Service or EndpointSlice without what no proxy reads and what makes objects large
/// (managed fields, annotations such as kubectl's last-applied configuration).
fn proxy_view(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
        meta.remove("annotations");
    }
    v
}

fn is_ipam(source: Source) -> bool {
    matches!(
        source,
        Source::IpamBlocks | Source::BlockAffinities | Source::IpamHandles
    )
}

/// The key of a v3 resource from the names of its object alone, for objects that do not
/// convert; None where the object would stand for no key anyway.
fn derived_key(source: Source, obj: &Value) -> Option<String> {
    let meta = obj.get("metadata")?;
    let field = |f: &str| {
        meta.get(f)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    let key = |kind: Kind, namespace: &str, name: String| {
        resource_path(&margay_api::ResourceKey {
            kind,
            namespace: namespace.to_string(),
            name,
        })
    };
    match source {
        Source::Crd(kind) => {
            let (ns, name) = kdd::crd::cr_resource_name(kind, obj)?;
            // A Calico policy under a converted Kubernetes policy's name stands for nothing.
            if kind == Kind::NetworkPolicy && name.starts_with("knp.default.") {
                return None;
            }
            Some(key(kind, &ns, name))
        }
        Source::Pods => {
            let spec = obj.get("spec")?;
            if spec.get("hostNetwork").and_then(Value::as_bool) == Some(true) {
                return None;
            }
            let node = spec.get("nodeName").and_then(Value::as_str)?;
            let name = kdd::names::workload_endpoint_name(
                node,
                kdd::pod::ORCHESTRATOR_K8S,
                field("name")?,
                kdd::pod::ENDPOINT_ETH0,
            )
            .ok()?;
            Some(key(Kind::WorkloadEndpoint, field("namespace")?, name))
        }
        Source::Namespaces => Some(key(
            Kind::Profile,
            "",
            format!("{}{}", kdd::pod::NAMESPACE_PROFILE_PREFIX, field("name")?),
        )),
        Source::ServiceAccounts => Some(key(
            Kind::Profile,
            "",
            kdd::pod::service_account_profile_name(field("namespace")?, field("name")?),
        )),
        Source::Nodes => Some(key(Kind::Node, "", field("name")?.to_string())),
        Source::K8sNetworkPolicies => Some(key(
            Kind::NetworkPolicy,
            field("namespace")?,
            format!("knp.default.{}", field("name")?),
        )),
        Source::Services => Some(super::services::object_key(
            super::services::ServiceObjectKind::Service,
            field("namespace")?,
            field("name")?,
        )),
        Source::EndpointSlices => Some(super::services::object_key(
            super::services::ServiceObjectKind::EndpointSlice,
            field("namespace")?,
            field("name")?,
        )),
        Source::DefaultAllow
        | Source::IpamBlocks
        | Source::BlockAffinities
        | Source::IpamHandles => None,
    }
}

/// Why a derived key cannot be written.
pub fn read_only(source: Source, key: &str) -> String {
    let how = match source {
        Source::Namespaces => "change the Namespace with kubectl (its labels become pcns.* labels)",
        Source::ServiceAccounts => {
            "change the ServiceAccount with kubectl (its labels become pcsa.* labels)"
        }
        Source::DefaultAllow => "it is built in",
        Source::K8sNetworkPolicies => {
            "change the Kubernetes NetworkPolicy with kubectl, or write a Calico NetworkPolicy under another name"
        }
        Source::Pods => "WorkloadEndpoints follow their Pods",
        Source::Nodes => "Calico Nodes are the cluster's Kubernetes Nodes",
        Source::Services | Source::EndpointSlices => {
            "margay only reads them for its service proxy; change them with kubectl"
        }
        _ => "it is derived",
    };
    format!(
        "{key} is read-only in the Kubernetes datastore: it is one of the {}; {how}",
        source.describe()
    )
}

fn to_bytes(v: &Value) -> Result<Vec<u8>, String> {
    serde_json::to_vec(v).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    const V3: &str = "/calico/resources/v3/projectcalico.org/";

    /// Objects that do not convert still name the key readers must drop.
    #[test]
    fn unconvertible_objects_still_name_their_keys() {
        let c = Converter::default();
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-2", "namespace": "shop", "resourceVersion": "7",
                         "annotations": {"cni.projectcalico.org/podIP": "not-an-ip"}},
            "spec": {"nodeName": "node-1", "containers": []}});
        assert!(c.to_kv(Source::Pods, &pod).is_err());
        assert_eq!(
            c.key_of(Source::Pods, &pod).unwrap(),
            format!("{V3}workloadendpoints/shop/node--1-k8s-web--2-eth0")
        );
        let mut host = pod.clone();
        host["spec"]["hostNetwork"] = json!(true);
        assert_eq!(c.key_of(Source::Pods, &host), None);

        let gnp = json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "GlobalNetworkPolicy",
            "metadata": {"name": "allow-dns", "resourceVersion": "9",
                         "annotations": {"projectcalico.org/metadata": "{\"name\":\"allow-dns\"}"}},
            "spec": {"egress": [{"action": "Allowed"}]}});
        assert!(
            c.to_kv(Source::Crd(Kind::GlobalNetworkPolicy), &gnp)
                .is_err()
        );
        assert_eq!(
            c.key_of(Source::Crd(Kind::GlobalNetworkPolicy), &gnp)
                .unwrap(),
            format!("{V3}globalnetworkpolicies/allow-dns")
        );
        // A broken Calico policy under a converted Kubernetes policy's name names nothing: it
        // must not take the Kubernetes policy's key down with it.
        let shadow = json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "knp.default.x", "namespace": "shop", "resourceVersion": "9"},
            "spec": {"ingress": [{"action": "Allowed"}]}});
        assert_eq!(c.key_of(Source::Crd(Kind::NetworkPolicy), &shadow), None);

        let np = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "deny", "namespace": "shop", "resourceVersion": "3"},
            "spec": {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "not-a-cidr"}}]}]}});
        assert!(c.to_kv(Source::K8sNetworkPolicies, &np).is_err());
        assert_eq!(
            c.key_of(Source::K8sNetworkPolicies, &np).unwrap(),
            format!("{V3}networkpolicies/shop/knp.default.deny")
        );
        let sa = json!({"metadata": {"name": "bot", "namespace": "ci", "resourceVersion": "x"}});
        assert_eq!(
            c.key_of(Source::ServiceAccounts, &sa).unwrap(),
            format!("{V3}profiles/ksa.ci.bot")
        );
        let ns = json!({"metadata": {"name": "ci", "resourceVersion": "x"}});
        assert_eq!(
            c.key_of(Source::Namespaces, &ns).unwrap(),
            format!("{V3}profiles/kns.ci")
        );
    }
}
