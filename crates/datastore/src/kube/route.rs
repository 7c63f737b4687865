//! Where each of Calico's etcd-layout keys lives in the Kubernetes API (pure).
//!
//! The rest of margay speaks Calico's etcd key layout (`/calico/resources/v3/...`,
//! `/calico/ipam/v2/...`); in the Kubernetes datastore every such key is one object of one API
//! resource (a custom resource, or a Pod, Namespace, ServiceAccount, Node or NetworkPolicy the
//! key is derived from). [`route_key`] names that object; [`route_prefix`] names the API
//! resources (with the narrowest namespace and label selectors the prefix allows) whose objects
//! can have keys under a prefix.

use margay_api::Kind;
use margay_kdd::crd::crd_for;
use margay_kdd::names;

use crate::keys::RESOURCE_ROOT;

pub const IPAM_BLOCKS_ROOT: &str = "/calico/ipam/v2/assignment/";
pub const IPAM_HOSTS_ROOT: &str = "/calico/ipam/v2/host/";
pub const IPAM_HANDLES_ROOT: &str = "/calico/ipam/v2/handle/";
/// Calico's etcd-only IPAM configuration key. In the Kubernetes datastore the configuration
/// is the IPAMConfig custom resource, read through the v3 `ipamconfigurations` key; this key
/// is never present there.
pub const IPAM_CONFIG_KEY: &str = "/calico/ipam/v2/config";

/// Labels Calico puts on BlockAffinity custom resources, so that one host's can be listed.
pub const LABEL_HOSTNAME_HASH: &str = "projectcalico.org/hostname-hash";
pub const LABEL_IP_VERSION: &str = "projectcalico.org/ip-version";

/// The one static profile Calico's Kubernetes datastore serves.
pub const DEFAULT_ALLOW_PROFILE: &str = "projectcalico-default-allow";
const KNP_PREFIX: &str = "knp.default.";

/// An API resource that keys come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// A v3 kind stored as a `crd.projectcalico.org/v1` custom resource.
    Crd(Kind),
    /// WorkloadEndpoints, derived from Pods.
    Pods,
    /// Profiles `kns.<namespace>`, derived from Namespaces.
    Namespaces,
    /// Profiles `ksa.<namespace>.<name>`, derived from ServiceAccounts.
    ServiceAccounts,
    /// The profile `projectcalico-default-allow`, which exists in no API.
    DefaultAllow,
    /// Calico Nodes, derived from Kubernetes Nodes (and written as their annotations).
    Nodes,
    /// NetworkPolicies `knp.default.<name>`, derived from networking.k8s.io/v1 NetworkPolicies.
    K8sNetworkPolicies,
    /// IPAM blocks (IPAMBlock custom resources).
    IpamBlocks,
    /// IPAM block affinities (BlockAffinity custom resources).
    BlockAffinities,
    /// IPAM handles (IPAMHandle custom resources).
    IpamHandles,
    /// Kubernetes Services, as they are (margay's key space, for Typha's clients).
    Services,
    /// Kubernetes EndpointSlices, as they are (margay's key space, for Typha's clients).
    EndpointSlices,
}

/// An API resource's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiResource {
    /// "" for the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
}

impl ApiResource {
    const fn core(plural: &'static str, kind: &'static str, namespaced: bool) -> Self {
        ApiResource {
            group: "",
            version: "v1",
            plural,
            kind,
            namespaced,
        }
    }

    /// `/api/v1` or `/apis/<group>/<version>`.
    pub fn group_path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    /// The collection URL path (in one namespace, or across all).
    pub fn collection_path(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if self.namespaced => {
                format!("{}/namespaces/{ns}/{}", self.group_path(), self.plural)
            }
            _ => format!("{}/{}", self.group_path(), self.plural),
        }
    }

    /// `apiVersion` of objects of this resource.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `<plural>` or `<plural>.<group>`, for messages.
    pub fn display(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

pub const PODS: ApiResource = ApiResource::core("pods", "Pod", true);
pub const NAMESPACES: ApiResource = ApiResource::core("namespaces", "Namespace", false);
pub const SERVICE_ACCOUNTS: ApiResource =
    ApiResource::core("serviceaccounts", "ServiceAccount", true);
pub const NODES: ApiResource = ApiResource::core("nodes", "Node", false);
pub const SERVICES: ApiResource = ApiResource::core("services", "Service", true);
pub const K8S_NETWORK_POLICIES: ApiResource = ApiResource {
    group: "networking.k8s.io",
    version: "v1",
    plural: "networkpolicies",
    kind: "NetworkPolicy",
    namespaced: true,
};
pub const ENDPOINT_SLICES: ApiResource = ApiResource {
    group: "discovery.k8s.io",
    version: "v1",
    plural: "endpointslices",
    kind: "EndpointSlice",
    namespaced: true,
};
const CALICO_GROUP: &str = "crd.projectcalico.org";
pub const IPAM_BLOCKS: ApiResource = ApiResource {
    group: CALICO_GROUP,
    version: "v1",
    plural: "ipamblocks",
    kind: "IPAMBlock",
    namespaced: false,
};
pub const BLOCK_AFFINITIES: ApiResource = ApiResource {
    group: CALICO_GROUP,
    version: "v1",
    plural: "blockaffinities",
    kind: "BlockAffinity",
    namespaced: false,
};
pub const IPAM_HANDLES: ApiResource = ApiResource {
    group: CALICO_GROUP,
    version: "v1",
    plural: "ipamhandles",
    kind: "IPAMHandle",
    namespaced: false,
};

/// Every source, in the order lists visit them.
pub fn all_sources() -> Vec<Source> {
    let mut v: Vec<Source> = Kind::ALL
        .iter()
        .copied()
        .filter(|k| crd_for(*k).is_some())
        .map(Source::Crd)
        .collect();
    v.extend([
        Source::Pods,
        Source::Namespaces,
        Source::ServiceAccounts,
        Source::DefaultAllow,
        Source::Nodes,
        Source::K8sNetworkPolicies,
        Source::IpamBlocks,
        Source::BlockAffinities,
        Source::IpamHandles,
        Source::Services,
        Source::EndpointSlices,
    ]);
    v
}

impl Source {
    /// The API resource behind the source (None: the static default-allow profile).
    pub fn api(self) -> Option<ApiResource> {
        match self {
            Source::Crd(kind) => crd_for(kind).map(|c| ApiResource {
                group: c.group,
                version: c.version,
                plural: c.plural,
                kind: c.kind,
                namespaced: c.namespaced,
            }),
            Source::Pods => Some(PODS),
            Source::Namespaces => Some(NAMESPACES),
            Source::ServiceAccounts => Some(SERVICE_ACCOUNTS),
            Source::DefaultAllow => None,
            Source::Nodes => Some(NODES),
            Source::K8sNetworkPolicies => Some(K8S_NETWORK_POLICIES),
            Source::IpamBlocks => Some(IPAM_BLOCKS),
            Source::BlockAffinities => Some(BLOCK_AFFINITIES),
            Source::IpamHandles => Some(IPAM_HANDLES),
            Source::Services => Some(SERVICES),
            Source::EndpointSlices => Some(ENDPOINT_SLICES),
        }
    }

    /// Every key of this source starts with this.
    pub fn root(self) -> String {
        let v3 = |plural: &str| format!("{RESOURCE_ROOT}{plural}/");
        match self {
            Source::Crd(kind) => v3(kind.plural()),
            Source::Pods => v3(Kind::WorkloadEndpoint.plural()),
            Source::Namespaces => format!("{}kns.", v3(Kind::Profile.plural())),
            Source::ServiceAccounts => format!("{}ksa.", v3(Kind::Profile.plural())),
            Source::DefaultAllow => {
                format!("{}{DEFAULT_ALLOW_PROFILE}", v3(Kind::Profile.plural()))
            }
            Source::Nodes => v3(Kind::Node.plural()),
            Source::K8sNetworkPolicies => v3(Kind::NetworkPolicy.plural()),
            Source::IpamBlocks => IPAM_BLOCKS_ROOT.to_string(),
            Source::BlockAffinities => IPAM_HOSTS_ROOT.to_string(),
            Source::IpamHandles => IPAM_HANDLES_ROOT.to_string(),
            Source::Services => super::services::SERVICES_KEY_ROOT.to_string(),
            Source::EndpointSlices => super::services::ENDPOINT_SLICES_KEY_ROOT.to_string(),
        }
    }

    /// Whether the source's keys are `<root><namespace>/<name>`.
    fn namespaced_keys(self) -> bool {
        match self {
            Source::Crd(kind) => kind.is_namespaced(),
            Source::Pods
            | Source::K8sNetworkPolicies
            | Source::Services
            | Source::EndpointSlices => true,
            _ => false,
        }
    }

    /// For messages: what the keys of this source are derived from.
    pub fn describe(self) -> String {
        match self {
            Source::Crd(kind) => format!("{kind} custom resources"),
            Source::Pods => "WorkloadEndpoints (derived from Pods)".into(),
            Source::Namespaces => "Profiles kns.* (derived from Namespaces)".into(),
            Source::ServiceAccounts => "Profiles ksa.* (derived from ServiceAccounts)".into(),
            Source::DefaultAllow => format!("the profile {DEFAULT_ALLOW_PROFILE}"),
            Source::Nodes => "Nodes (derived from Kubernetes Nodes)".into(),
            Source::K8sNetworkPolicies => {
                "NetworkPolicies knp.default.* (derived from Kubernetes NetworkPolicies)".into()
            }
            Source::IpamBlocks => "IPAM blocks".into(),
            Source::BlockAffinities => "IPAM block affinities".into(),
            Source::IpamHandles => "IPAM handles".into(),
            Source::Services => "Kubernetes Services".into(),
            Source::EndpointSlices => "Kubernetes EndpointSlices".into(),
        }
    }
}

/// The one API object a key names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub source: Source,
    /// The object's namespace (namespaced API resources only).
    pub namespace: Option<String>,
    /// The API object's name.
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error(
        "{0} has no place in the Kubernetes datastore (only Calico's v3 resources and IPAM keys are stored there)"
    )]
    Unmapped(String),
    #[error("{key}: {why}")]
    Malformed { key: String, why: String },
}

/// The API object behind `key`.
pub fn route_key(key: &str) -> Result<Target, RouteError> {
    let malformed = |why: &str| RouteError::Malformed {
        key: key.to_string(),
        why: why.to_string(),
    };
    if let Some(rest) = key.strip_prefix(RESOURCE_ROOT) {
        let rk = crate::keys::parse_resource_path(key)
            .ok_or_else(|| malformed("not a v3 resource key"))?;
        let ns = || Some(rk.namespace.clone());
        let _ = rest;
        return Ok(match rk.kind {
            Kind::WorkloadEndpoint => {
                let (node, orchestrator, pod, _endpoint) =
                    names::parse_workload_endpoint_name(&rk.name).ok_or_else(|| {
                        malformed("not a workload endpoint name (<node>-k8s-<pod>-<endpoint>)")
                    })?;
                if orchestrator != "k8s" {
                    return Err(malformed(&format!(
                        "orchestrator {orchestrator:?}: the Kubernetes datastore holds only Kubernetes pods' endpoints (k8s)"
                    )));
                }
                let _ = node;
                Target {
                    source: Source::Pods,
                    namespace: ns(),
                    name: pod,
                }
            }
            Kind::Profile => {
                if let Some(ns_name) = rk.name.strip_prefix("kns.") {
                    Target {
                        source: Source::Namespaces,
                        namespace: None,
                        name: ns_name.to_string(),
                    }
                } else if let Some(rest) = rk.name.strip_prefix("ksa.") {
                    // Namespace names are DNS labels (no dots); service account names may hold dots.
                    let (ns_name, sa) = rest
                        .split_once('.')
                        .ok_or_else(|| malformed("ksa.<namespace>.<service account> expected"))?;
                    Target {
                        source: Source::ServiceAccounts,
                        namespace: Some(ns_name.to_string()),
                        name: sa.to_string(),
                    }
                } else if rk.name == DEFAULT_ALLOW_PROFILE {
                    Target {
                        source: Source::DefaultAllow,
                        namespace: None,
                        name: rk.name.clone(),
                    }
                } else {
                    return Err(malformed(
                        "in the Kubernetes datastore profiles are kns.<namespace>, ksa.<namespace>.<service account> or projectcalico-default-allow: they come from Namespaces and ServiceAccounts",
                    ));
                }
            }
            Kind::Node => Target {
                source: Source::Nodes,
                namespace: None,
                name: rk.name.clone(),
            },
            Kind::NetworkPolicy if rk.name.starts_with(KNP_PREFIX) => Target {
                source: Source::K8sNetworkPolicies,
                namespace: ns(),
                name: rk.name[KNP_PREFIX.len()..].to_string(),
            },
            kind => {
                if crd_for(kind).is_none() {
                    return Err(RouteError::Unmapped(key.to_string()));
                }
                Target {
                    source: Source::Crd(kind),
                    namespace: kind.is_namespaced().then(ns).flatten(),
                    name: rk.name.clone(),
                }
            }
        });
    }
    if let Some(rest) = key.strip_prefix(IPAM_BLOCKS_ROOT) {
        // ipv4/block/10.0.0.0-26
        let cidr =
            ipam_cidr(rest).ok_or_else(|| malformed("ipv<N>/block/<a.b.c.d-NN> expected"))?;
        return Ok(Target {
            source: Source::IpamBlocks,
            namespace: None,
            name: names::cidr_name(&cidr),
        });
    }
    if let Some(rest) = key.strip_prefix(IPAM_HOSTS_ROOT) {
        // <host>/ipv4/block/10.0.0.0-26
        let (host, tail) = rest
            .split_once('/')
            .ok_or_else(|| malformed("<host>/ipv<N>/block/<cidr> expected"))?;
        let cidr =
            ipam_cidr(tail).ok_or_else(|| malformed("<host>/ipv<N>/block/<cidr> expected"))?;
        if host.is_empty() {
            return Err(malformed("empty host name"));
        }
        return Ok(Target {
            source: Source::BlockAffinities,
            namespace: None,
            name: names::block_affinity_name(host, &cidr),
        });
    }
    if let Some((kind, ns, name)) = super::services::parse_object_key(key) {
        return Ok(Target {
            source: match kind {
                super::services::ServiceObjectKind::Service => Source::Services,
                super::services::ServiceObjectKind::EndpointSlice => Source::EndpointSlices,
            },
            namespace: Some(ns.to_string()),
            name: name.to_string(),
        });
    }
    if let Some(id) = key.strip_prefix(IPAM_HANDLES_ROOT) {
        if id.is_empty() || id.contains('/') {
            return Err(malformed("handle/<id> expected"));
        }
        return Ok(Target {
            source: Source::IpamHandles,
            namespace: None,
            name: id.to_ascii_lowercase(),
        });
    }
    Err(RouteError::Unmapped(key.to_string()))
}

/// `ipv4/block/10.0.0.0-26` → `10.0.0.0/26`, checking the version matches.
pub fn ipam_cidr(rest: &str) -> Option<String> {
    let mut parts = rest.split('/');
    let version = parts.next()?;
    if parts.next()? != "block" {
        return None;
    }
    let segment = parts.next()?;
    if parts.next().is_some() {
        return None;
    }
    let (addr, len) = segment.rsplit_once('-')?;
    let cidr = format!("{addr}/{len}");
    let parsed = margay_api::net::Cidr::parse(&cidr).ok()?;
    (format!("ipv{}", parsed.version()) == version).then_some(cidr)
}

/// The etcd-layout key segment of a CIDR: `10.0.0.0/26` → `10.0.0.0-26`.
pub fn cidr_segment(cidr: &str) -> String {
    cidr.replace('/', "-")
}

/// A list (or watch) of one API resource that covers part of a key prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Query {
    pub source: Source,
    /// Only this namespace (namespaced API resources).
    pub namespace: Option<String>,
    /// A Kubernetes label selector narrowing the list.
    pub label_selector: Option<String>,
}

/// The queries whose objects may have keys under `prefix`. Their converted keys must still
/// be filtered by the prefix: selectors narrow, they do not decide.
pub fn route_prefix(prefix: &str) -> Vec<Query> {
    let mut out = Vec::new();
    for source in all_sources() {
        let root = source.root();
        if root.starts_with(prefix) {
            out.push(Query {
                source,
                namespace: None,
                label_selector: None,
            });
        } else if let Some(rest) = prefix.strip_prefix(root.as_str()) {
            out.push(narrow(source, rest));
        }
    }
    out
}

/// The query for a prefix that is `source.root() + rest`.
fn narrow(source: Source, rest: &str) -> Query {
    let mut q = Query {
        source,
        namespace: None,
        label_selector: None,
    };
    match source {
        _ if source.namespaced_keys() => {
            if let Some((ns, _)) = rest.split_once('/')
                && !ns.is_empty()
            {
                q.namespace = Some(ns.to_string());
            }
        }
        Source::ServiceAccounts => {
            if let Some((ns, _)) = rest.split_once('.')
                && !ns.is_empty()
            {
                q.namespace = Some(ns.to_string());
            }
        }
        Source::BlockAffinities => {
            if let Some((host, tail)) = rest.split_once('/')
                && !host.is_empty()
            {
                let mut sel = format!("{LABEL_HOSTNAME_HASH}={}", names::hostname_hash(host));
                if let Some(v) = tail
                    .strip_prefix("ipv")
                    .and_then(|t| t.split_once('/'))
                    .map(|(v, _)| v)
                    .filter(|v| *v == "4" || *v == "6")
                {
                    sel.push_str(&format!(",{LABEL_IP_VERSION}={v}"));
                }
                q.label_selector = Some(sel);
            }
        }
        _ => {}
    }
    q
}

/// The key a block, affinity or handle is stored under in Calico's etcd layout.
pub fn block_key(cidr: &str) -> Option<String> {
    let v = margay_api::net::Cidr::parse(cidr).ok()?.version();
    Some(format!(
        "{IPAM_BLOCKS_ROOT}ipv{v}/block/{}",
        cidr_segment(cidr)
    ))
}

pub fn affinity_key(host: &str, cidr: &str) -> Option<String> {
    let v = margay_api::net::Cidr::parse(cidr).ok()?.version();
    Some(format!(
        "{IPAM_HOSTS_ROOT}{host}/ipv{v}/block/{}",
        cidr_segment(cidr)
    ))
}

pub fn handle_key(id: &str) -> String {
    format!("{IPAM_HANDLES_ROOT}{id}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn v3(rest: &str) -> String {
        format!("{RESOURCE_ROOT}{rest}")
    }

    #[test]
    fn keys_name_their_objects() {
        let t = route_key(&v3("ippools/default-ipv4-ippool")).unwrap();
        assert_eq!(t.source, Source::Crd(Kind::IPPool));
        assert_eq!(
            (t.namespace, t.name.as_str()),
            (None, "default-ipv4-ippool")
        );

        let t = route_key(&v3("networkpolicies/prod/allow-web")).unwrap();
        assert_eq!(t.source, Source::Crd(Kind::NetworkPolicy));
        assert_eq!(t.namespace.as_deref(), Some("prod"));

        let t = route_key(&v3("networkpolicies/prod/knp.default.deny-all")).unwrap();
        assert_eq!(t.source, Source::K8sNetworkPolicies);
        assert_eq!(
            (t.namespace.as_deref(), t.name.as_str()),
            (Some("prod"), "deny-all")
        );

        let t = route_key(&v3("workloadendpoints/prod/ip--1-k8s-web--x-eth0")).unwrap();
        assert_eq!(t.source, Source::Pods);
        assert_eq!(
            (t.namespace.as_deref(), t.name.as_str()),
            (Some("prod"), "web-x")
        );

        let t = route_key(&v3("profiles/kns.prod")).unwrap();
        assert_eq!((t.source, t.name.as_str()), (Source::Namespaces, "prod"));
        let t = route_key(&v3("profiles/ksa.prod.build.bot")).unwrap();
        assert_eq!(t.source, Source::ServiceAccounts);
        assert_eq!(
            (t.namespace.as_deref(), t.name.as_str()),
            (Some("prod"), "build.bot")
        );
        assert_eq!(
            route_key(&v3("profiles/projectcalico-default-allow"))
                .unwrap()
                .source,
            Source::DefaultAllow
        );
        assert!(route_key(&v3("profiles/my-own-profile")).is_err());

        let t = route_key(&v3("nodes/node-1")).unwrap();
        assert_eq!((t.source, t.name.as_str()), (Source::Nodes, "node-1"));

        let t = route_key("/calico/ipam/v2/assignment/ipv4/block/10.65.0.64-26").unwrap();
        assert_eq!(
            (t.source, t.name.as_str()),
            (Source::IpamBlocks, "10-65-0-64-26")
        );
        let t = route_key("/calico/ipam/v2/assignment/ipv6/block/fd00:1234::-122").unwrap();
        assert_eq!(t.name, "fd00-1234---122");
        assert!(route_key("/calico/ipam/v2/assignment/ipv6/block/10.0.0.0-26").is_err());

        let t = route_key("/calico/ipam/v2/host/node-1/ipv4/block/10.65.0.64-26").unwrap();
        assert_eq!(
            (t.source, t.name.as_str()),
            (Source::BlockAffinities, "node-1-10-65-0-64-26")
        );

        let t = route_key("/calico/ipam/v2/handle/k8s-pod-network.ABC").unwrap();
        assert_eq!(
            (t.source, t.name.as_str()),
            (Source::IpamHandles, "k8s-pod-network.abc")
        );

        assert!(matches!(
            route_key(IPAM_CONFIG_KEY),
            Err(RouteError::Unmapped(_))
        ));
        assert!(matches!(
            route_key("/calico/felix/v2/x"),
            Err(RouteError::Unmapped(_))
        ));
    }

    #[test]
    fn prefixes_name_the_sources_under_them() {
        let everything = route_prefix("/calico/");
        // Every source but the Services and EndpointSlices, which live outside `/calico/`.
        assert_eq!(everything.len(), all_sources().len() - 2);
        let services: Vec<Source> = route_prefix(super::super::services::KEY_ROOT)
            .iter()
            .map(|q| q.source)
            .collect();
        assert_eq!(services, [Source::Services, Source::EndpointSlices]);
        let one_ns = route_prefix("/margay/kubernetes/services/ns1/");
        assert_eq!(one_ns.len(), 1);
        assert_eq!(one_ns[0].namespace.as_deref(), Some("ns1"));
        let t = route_key("/margay/kubernetes/endpointslices/ns1/web-1").unwrap();
        assert_eq!(
            (t.source, t.namespace.as_deref(), t.name.as_str()),
            (Source::EndpointSlices, Some("ns1"), "web-1")
        );
        assert!(
            everything
                .iter()
                .all(|q| q.namespace.is_none() && q.label_selector.is_none())
        );

        let policies = route_prefix(&v3("networkpolicies/"));
        let sources: Vec<Source> = policies.iter().map(|q| q.source).collect();
        assert_eq!(
            sources,
            vec![Source::Crd(Kind::NetworkPolicy), Source::K8sNetworkPolicies]
        );

        let in_prod = route_prefix(&v3("networkpolicies/prod/"));
        assert!(
            in_prod
                .iter()
                .all(|q| q.namespace.as_deref() == Some("prod"))
        );

        let profiles = route_prefix(&v3("profiles/"));
        let sources: Vec<Source> = profiles.iter().map(|q| q.source).collect();
        assert_eq!(
            sources,
            vec![
                Source::Namespaces,
                Source::ServiceAccounts,
                Source::DefaultAllow
            ]
        );
        let sa = route_prefix(&v3("profiles/ksa.prod."));
        assert_eq!(sa.len(), 1);
        assert_eq!(sa[0].namespace.as_deref(), Some("prod"));

        let host = route_prefix("/calico/ipam/v2/host/node-1/ipv4/block/");
        assert_eq!(host.len(), 1);
        let sel = host[0].label_selector.clone().unwrap();
        assert!(sel.starts_with("projectcalico.org/hostname-hash="), "{sel}");
        assert!(sel.ends_with(",projectcalico.org/ip-version=4"), "{sel}");

        let blocks = route_prefix("/calico/ipam/v2/assignment/ipv6/");
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].source, Source::IpamBlocks);

        assert!(route_prefix("/calico/felix/").is_empty());
        assert!(route_prefix(IPAM_CONFIG_KEY).is_empty());
    }

    #[test]
    fn ipam_keys_round_trip() {
        assert_eq!(
            block_key("10.65.0.64/26").unwrap(),
            "/calico/ipam/v2/assignment/ipv4/block/10.65.0.64-26"
        );
        assert_eq!(
            affinity_key("n1", "fd00::40/122").unwrap(),
            "/calico/ipam/v2/host/n1/ipv6/block/fd00::40-122"
        );
        assert_eq!(
            ipam_cidr("ipv6/block/fd00::40-122").as_deref(),
            Some("fd00::40/122")
        );
    }
}
