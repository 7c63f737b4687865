//! What the renderer reads: the resources confd syncs, as plain values (pure).
//!
//! `BirdInputs` is the whole input of [`crate::render::render`]: the v3 resources of the BGP
//! syncer (Node, BGPConfiguration, BGPPeer, BGPFilter, IPPool), this node's block affinities,
//! the BGP passwords already read from their files, and the router-id override. It is
//! updated from syncer updates ([`BirdInputs::apply`]) and affinity events, so the daemon and
//! the golden tests build it the same way.

use std::collections::{BTreeMap, BTreeSet};

use margay_api::bgp::BgpPassword;
use margay_api::net::Cidr;
use margay_api::{BGPConfiguration, BGPFilter, BGPPeer, IPPool, Node, Resource};
use margay_ipam::block::AffinityState;

/// A password reference: Calico's `secretKeyRef` (secret name, key).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretRef {
    pub name: String,
    pub key: String,
}

impl SecretRef {
    pub fn of(p: &BgpPassword) -> Option<SecretRef> {
        let r = p.secret_key_ref.as_ref()?;
        Some(SecretRef {
            name: r.name.clone(),
            key: r.key.clone(),
        })
    }
}

impl std::fmt::Display for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.name, self.key)
    }
}

#[derive(Clone, Default, PartialEq)]
pub struct BirdInputs {
    /// This node's name (NODENAME).
    pub node_name: String,
    pub nodes: BTreeMap<String, Node>,
    /// `default` and `node.<name>`.
    pub bgp_configs: BTreeMap<String, BGPConfiguration>,
    pub peers: BTreeMap<String, BGPPeer>,
    pub filters: BTreeMap<String, BGPFilter>,
    pub pools: BTreeMap<String, IPPool>,
    /// The blocks affine to this node and the state of each claim.
    pub affinities: BTreeMap<Cidr, AffinityState>,
    /// Passwords read for the secret references in use (see [`BirdInputs::secret_refs`]).
    pub secrets: BTreeMap<SecretRef, String>,
    /// CALICO_ROUTER_ID: an address, `hash`, or unset (the node's IPv4 address).
    pub router_id: Option<String>,
}

/// Every field but the passwords, which show as `<redacted>` (inputs end up in logs and test
/// failure messages).
impl std::fmt::Debug for BirdInputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secrets: BTreeMap<&SecretRef, &str> =
            self.secrets.keys().map(|k| (k, "<redacted>")).collect();
        f.debug_struct("BirdInputs")
            .field("node_name", &self.node_name)
            .field("nodes", &self.nodes)
            .field("bgp_configs", &self.bgp_configs)
            .field("peers", &self.peers)
            .field("filters", &self.filters)
            .field("pools", &self.pools)
            .field("affinities", &self.affinities)
            .field("secrets", &secrets)
            .field("router_id", &self.router_id)
            .finish()
    }
}

impl BirdInputs {
    pub fn new(node_name: impl Into<String>) -> BirdInputs {
        BirdInputs {
            node_name: node_name.into(),
            ..BirdInputs::default()
        }
    }

    /// Applies one resource (Some) or its deletion (None, by kind and name). Kinds confd
    /// does not use are ignored. Returns whether anything changed.
    pub fn apply(&mut self, kind: margay_api::Kind, name: &str, value: Option<Resource>) -> bool {
        use margay_api::Kind as K;
        fn put<T: PartialEq>(m: &mut BTreeMap<String, T>, name: &str, v: Option<T>) -> bool {
            match v {
                Some(v) => {
                    if m.get(name) == Some(&v) {
                        return false;
                    }
                    m.insert(name.to_string(), v);
                    true
                }
                None => m.remove(name).is_some(),
            }
        }
        match (kind, value) {
            (K::Node, Some(Resource::Node(r))) => put(&mut self.nodes, name, Some(r)),
            (K::Node, None) => put(&mut self.nodes, name, None::<Node>),
            (K::BGPConfiguration, Some(Resource::BGPConfiguration(r))) => {
                put(&mut self.bgp_configs, name, Some(r))
            }
            (K::BGPConfiguration, None) => {
                put(&mut self.bgp_configs, name, None::<BGPConfiguration>)
            }
            (K::BGPPeer, Some(Resource::BGPPeer(r))) => put(&mut self.peers, name, Some(r)),
            (K::BGPPeer, None) => put(&mut self.peers, name, None::<BGPPeer>),
            (K::BGPFilter, Some(Resource::BGPFilter(r))) => put(&mut self.filters, name, Some(r)),
            (K::BGPFilter, None) => put(&mut self.filters, name, None::<BGPFilter>),
            (K::IPPool, Some(Resource::IPPool(r))) => put(&mut self.pools, name, Some(r)),
            (K::IPPool, None) => put(&mut self.pools, name, None::<IPPool>),
            _ => false,
        }
    }

    /// Sets (Some) or removes (None) this node's affinity for `block`.
    pub fn set_affinity(&mut self, block: Cidr, state: Option<AffinityState>) -> bool {
        match state {
            Some(s) => self.affinities.insert(block, s) != Some(s),
            None => self.affinities.remove(&block).is_some(),
        }
    }

    /// Every password reference the renderer may need: the node-mesh password and those of
    /// the BGPPeers. The edge reads them and fills `secrets` before rendering.
    pub fn secret_refs(&self) -> BTreeSet<SecretRef> {
        let mut out = BTreeSet::new();
        if let Some(r) = self
            .global_config()
            .and_then(|c| c.spec.node_mesh_password.as_ref())
            .and_then(SecretRef::of)
        {
            out.insert(r);
        }
        for p in self.peers.values() {
            if let Some(r) = p.spec.password.as_ref().and_then(SecretRef::of) {
                out.insert(r);
            }
        }
        out
    }

    /// BGPConfiguration `default`.
    pub fn global_config(&self) -> Option<&BGPConfiguration> {
        self.bgp_configs.get("default")
    }

    /// BGPConfiguration `node.<name>`.
    pub fn node_config(&self, node: &str) -> Option<&BGPConfiguration> {
        self.bgp_configs.get(&format!("node.{node}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_a_password() {
        let mut inputs = BirdInputs::new("node1");
        let r = SecretRef {
            name: "bgp-secrets".into(),
            key: "peer-a".into(),
        };
        inputs.secrets.insert(r, "hunter2-s3cret".into());
        let shown = format!("{inputs:?} {inputs:#?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("peer-a") && shown.contains("<redacted>"),
            "{shown}"
        );
    }
}
