//! The resource kinds, their names and aliases, and the [`Resource`] sum type.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::bgp::{BGPConfigurationSpec, BGPFilterSpec, BGPPeerSpec};
use crate::endpoint::{HostEndpointSpec, NodeSpec, NodeStatus, WorkloadEndpointSpec};
use crate::felix::FelixConfigurationSpec;
use crate::ippool::{
    ClusterInformationSpec, IPAMConfigurationSpec, IPPoolSpec, IPPoolStatus, IPReservationSpec,
};
use crate::kubecontrollers::{
    KubeControllersConfigurationSpec, KubeControllersConfigurationStatus,
};
use crate::meta::ObjectMeta;
use crate::policy::{
    GlobalNetworkPolicySpec, NetworkPolicySpec, NetworkSetSpec, ProfileSpec, TierSpec, TierStatus,
};

/// `apiVersion` of every margay resource.
pub const API_VERSION: &str = "projectcalico.org/v3";
/// The API group, accepted as a prefix of `apiVersion`.
pub const API_GROUP: &str = "projectcalico.org";

/// Identifies one resource: kind, namespace (empty for cluster-scoped kinds) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {:?}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

macro_rules! resources {
    ($(
        $(#[$doc:meta])*
        $name:ident {
            spec: $spec:ty,
            $(status: $status:ty,)?
            plural: $plural:literal,
            namespaced: $namespaced:literal,
            aliases: [$($alias:literal),* $(,)?] $(,)?
        }
    ),* $(,)?) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            #[serde(rename_all = "camelCase", deny_unknown_fields)]
            // `kind` before `apiVersion`: Go's TypeMeta order, so JSON written from these
            // (calicoctl's `-o json`, stored values) has Calico's key order.
            pub struct $name {
                #[serde(default)]
                pub kind: String,
                #[serde(default)]
                pub api_version: String,
                #[serde(default)]
                pub metadata: ObjectMeta,
                #[serde(default)]
                pub spec: $spec,
                $(
                    #[serde(default, skip_serializing_if = "Option::is_none")]
                    pub status: Option<$status>,
                )?
            }

            impl $name {
                pub const KIND: Kind = Kind::$name;

                /// A resource with the given metadata and spec, `apiVersion` and `kind` filled in.
                pub fn new(metadata: ObjectMeta, spec: $spec) -> Self {
                    $name {
                        api_version: API_VERSION.to_string(),
                        kind: stringify!($name).to_string(),
                        metadata,
                        spec,
                        $( status: None::<$status>, )?
                    }
                }
            }

            impl From<$name> for Resource {
                fn from(r: $name) -> Resource {
                    Resource::$name(r)
                }
            }
        )*

        /// Every resource kind margay understands.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Kind {
            $($name),*
        }

        impl Kind {
            pub const ALL: &'static [Kind] = &[$(Kind::$name),*];

            /// The kind as written in `kind:` (e.g. `GlobalNetworkPolicy`).
            pub fn name(self) -> &'static str {
                match self { $(Kind::$name => stringify!($name)),* }
            }

            /// The list kind (e.g. `GlobalNetworkPolicyList`).
            pub fn list_name(self) -> &'static str {
                match self { $(Kind::$name => concat!(stringify!($name), "List")),* }
            }

            /// Lower-case plural, as used in datastore keys and the Kubernetes API.
            pub fn plural(self) -> &'static str {
                match self { $(Kind::$name => $plural),* }
            }

            /// Whether resources of this kind live in a namespace.
            pub fn is_namespaced(self) -> bool {
                match self { $(Kind::$name => $namespaced),* }
            }

            /// The names `margay ctl` accepts for this kind, as calicoctl does (singular, plural,
            /// short forms), all lower case.
            pub fn aliases(self) -> &'static [&'static str] {
                match self { $(Kind::$name => &[$($alias),*]),* }
            }

            /// Looks up a kind by its exact `kind:` name.
            pub fn from_name(name: &str) -> Option<Kind> {
                match name { $(stringify!($name) => Some(Kind::$name),)* _ => None }
            }

            /// Looks up a list kind (`NetworkPolicyList`) and returns the item kind.
            pub fn from_list_name(name: &str) -> Option<Kind> {
                match name { $(concat!(stringify!($name), "List") => Some(Kind::$name),)* _ => None }
            }
        }

        /// One resource of any kind.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(untagged)]
        #[allow(clippy::large_enum_variant)]
        pub enum Resource {
            $($name($name)),*
        }

        impl Resource {
            pub fn kind(&self) -> Kind {
                match self { $(Resource::$name(_) => Kind::$name),* }
            }

            pub fn metadata(&self) -> &ObjectMeta {
                match self { $(Resource::$name(r) => &r.metadata),* }
            }

            pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
                match self { $(Resource::$name(r) => &mut r.metadata),* }
            }

            /// Sets `apiVersion` and `kind` to their canonical values.
            pub(crate) fn set_type_meta(&mut self) {
                match self {
                    $(Resource::$name(r) => {
                        r.api_version = API_VERSION.to_string();
                        r.kind = stringify!($name).to_string();
                    })*
                }
            }

            /// Decodes a JSON value already known to hold a resource of `kind`, reporting the
            /// path of the first field that does not fit.
            pub(crate) fn from_value_of_kind(
                kind: Kind,
                value: serde_json::Value,
            ) -> Result<Resource, serde_path_to_error::Error<serde_json::Error>> {
                let mut r = match kind {
                    $(Kind::$name => Resource::$name(serde_path_to_error::deserialize(value)?),)*
                };
                r.set_type_meta();
                Ok(r)
            }

            /// Decodes JSON bytes known to hold a resource of `kind` in one pass (the fast path
            /// for stored values). Returns None if the bytes do not decode, or if their
            /// apiVersion or kind is not what was expected; callers then take the slow path
            /// ([`crate::codec::decode_value`]) for an error that names the field.
            pub fn from_json_slice_fast(kind: Kind, bytes: &[u8]) -> Option<Resource> {
                match kind {
                    $(Kind::$name => {
                        let r: $name = serde_json::from_slice(bytes).ok()?;
                        (r.api_version == API_VERSION && r.kind == stringify!($name))
                            .then_some(Resource::$name(r))
                    })*
                }
            }
        }
    };
}

resources! {
    /// Cluster-wide BGP settings (`default`) and per-node overrides (`node.<name>`).
    BGPConfiguration {
        spec: BGPConfigurationSpec,
        plural: "bgpconfigurations",
        namespaced: false,
        aliases: ["bgpconfiguration", "bgpconfigurations", "bgpconfig", "bgpconfigs"],
    },
    /// Import/export filters applied to BGP peerings.
    BGPFilter {
        spec: BGPFilterSpec,
        plural: "bgpfilters",
        namespaced: false,
        aliases: ["bgpfilter", "bgpfilters", "bgpf", "bgpfs", "bf", "bfs"],
    },
    /// A BGP peering: global, per node, or selected.
    BGPPeer {
        spec: BGPPeerSpec,
        plural: "bgppeers",
        namespaced: false,
        aliases: ["bgppeer", "bgppeers", "bgpp", "bgpps", "bp", "bps"],
    },
    /// Cluster identity and readiness (`default`).
    ClusterInformation {
        spec: ClusterInformationSpec,
        plural: "clusterinformations",
        namespaced: false,
        aliases: ["clusterinformation", "clusterinformations", "clusterinfo", "clusterinfos"],
    },
    /// Felix settings: cluster-wide (`default`), per node (`node.<name>`) or node-selected.
    FelixConfiguration {
        // Boxed: the spec has ~190 optional fields and would make every Resource ~4 KiB.
        spec: Box<FelixConfigurationSpec>,
        plural: "felixconfigurations",
        namespaced: false,
        aliases: ["felixconfiguration", "felixconfigurations", "felixconfig", "felixconfigs"],
    },
    /// A policy that applies across namespaces and to host endpoints.
    GlobalNetworkPolicy {
        spec: GlobalNetworkPolicySpec,
        plural: "globalnetworkpolicies",
        namespaced: false,
        aliases: ["globalnetworkpolicy", "globalnetworkpolicies", "gnp", "gnps"],
    },
    /// A labelled set of networks usable in any policy's selectors.
    GlobalNetworkSet {
        spec: NetworkSetSpec,
        plural: "globalnetworksets",
        namespaced: false,
        aliases: ["globalnetworkset", "globalnetworksets", "gnetsets"],
    },
    /// A host interface (or the host's IPs) that policy applies to.
    HostEndpoint {
        spec: HostEndpointSpec,
        plural: "hostendpoints",
        namespaced: false,
        aliases: ["hostendpoint", "hostendpoints", "hep", "heps"],
    },
    /// IPAM settings (`default`).
    IPAMConfiguration {
        spec: IPAMConfigurationSpec,
        plural: "ipamconfigurations",
        namespaced: false,
        aliases: ["ipamconfiguration", "ipamconfigurations", "ipamconfig", "ipamconfigs"],
    },
    /// A range of addresses for workloads, with its encapsulation and NAT settings.
    IPPool {
        spec: IPPoolSpec,
        status: IPPoolStatus,
        plural: "ippools",
        namespaced: false,
        aliases: ["ippool", "ippools", "ipp", "ipps", "pool", "pools"],
    },
    /// Addresses IPAM must never hand out.
    IPReservation {
        spec: IPReservationSpec,
        plural: "ipreservations",
        namespaced: false,
        aliases: ["ipreservation", "ipreservations", "reservation", "reservations"],
    },
    /// Settings of the Kubernetes controllers (`default`).
    KubeControllersConfiguration {
        spec: KubeControllersConfigurationSpec,
        status: KubeControllersConfigurationStatus,
        plural: "kubecontrollersconfigurations",
        namespaced: false,
        aliases: [
            "kubecontrollersconfiguration",
            "kubecontrollersconfigurations",
            "kubecontrollersconfig",
            "kubecontrollersconfigs",
        ],
    },
    /// A namespaced policy.
    NetworkPolicy {
        spec: NetworkPolicySpec,
        plural: "networkpolicies",
        namespaced: true,
        aliases: ["networkpolicy", "networkpolicies", "policy", "np", "policies", "pol", "pols"],
    },
    /// A namespaced, labelled set of networks.
    NetworkSet {
        spec: NetworkSetSpec,
        plural: "networksets",
        namespaced: true,
        aliases: ["networkset", "networksets", "netsets"],
    },
    /// A node of the cluster: its addresses, AS number, tunnel addresses.
    Node {
        spec: NodeSpec,
        status: NodeStatus,
        plural: "nodes",
        namespaced: false,
        aliases: ["node", "nodes", "no", "nos"],
    },
    /// Rules and labels applied to the endpoints that reference the profile.
    Profile {
        spec: ProfileSpec,
        plural: "profiles",
        namespaced: false,
        aliases: ["profile", "profiles", "pro", "pros"],
    },
    /// An ordered group of policies.
    Tier {
        spec: TierSpec,
        status: TierStatus,
        plural: "tiers",
        namespaced: false,
        aliases: ["tier", "tiers"],
    },
    /// A workload's (pod's) network interface.
    WorkloadEndpoint {
        spec: WorkloadEndpointSpec,
        plural: "workloadendpoints",
        namespaced: true,
        aliases: ["workloadendpoint", "workloadendpoints", "wep", "weps"],
    },
}

impl Kind {
    /// Looks up a kind by any accepted spelling: the kind name in any case, its plural, or a
    /// calicoctl short form (`gnp`, `ippool`, `ipps`, `wep`).
    pub fn from_alias(name: &str) -> Option<Kind> {
        let lower = name.to_ascii_lowercase();
        Kind::ALL
            .iter()
            .copied()
            .find(|k| k.aliases().contains(&lower.as_str()))
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Resource {
    pub fn name(&self) -> &str {
        &self.metadata().name
    }

    pub fn namespace(&self) -> &str {
        &self.metadata().namespace
    }

    pub fn key(&self) -> ResourceKey {
        ResourceKey {
            kind: self.kind(),
            namespace: self.metadata().namespace.clone(),
            name: self.metadata().name.clone(),
        }
    }

    /// Checks every rule for this kind; returns every problem found.
    pub fn validate(&self) -> Result<(), crate::validate::ValidationErrors> {
        crate::validate::validate_resource(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_resolve_to_their_kind() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_alias(kind.name()), Some(*kind));
            assert_eq!(Kind::from_alias(kind.plural()), Some(*kind));
            for alias in kind.aliases() {
                assert_eq!(Kind::from_alias(alias), Some(*kind), "{alias}");
            }
            assert_eq!(Kind::from_list_name(kind.list_name()), Some(*kind));
        }
        assert_eq!(Kind::from_alias("GNP"), Some(Kind::GlobalNetworkPolicy));
        assert_eq!(Kind::from_alias("pools"), Some(Kind::IPPool));
        assert_eq!(Kind::from_alias("nope"), None);
    }

    #[test]
    fn aliases_are_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for kind in Kind::ALL {
            for alias in kind.aliases() {
                assert!(seen.insert(*alias), "alias {alias} used twice");
            }
        }
    }
}
