//! The syncer types Typha serves and what each carries (pure).

use margay_api::{Kind, ResourceKey};

/// What Felix syncs: the v3 kinds (Calico's felixsyncer, less what margay does not model) and
/// the IPAM blocks (for routes to remote blocks).
pub const FELIX_KINDS: &[Kind] = &[
    Kind::ClusterInformation,
    Kind::FelixConfiguration,
    Kind::Node,
    Kind::IPPool,
    Kind::Tier,
    Kind::GlobalNetworkPolicy,
    Kind::NetworkPolicy,
    Kind::Profile,
    Kind::WorkloadEndpoint,
    Kind::HostEndpoint,
    Kind::NetworkSet,
    Kind::GlobalNetworkSet,
    // The service addresses of BGPConfiguration `default` (ServiceLoopPrevention).
    Kind::BGPConfiguration,
];

/// What confd needs (Calico's bgpsyncer): nodes, BGP configuration, peers, filters, pools and
/// the IPAM block affinities.
pub const BGP_KINDS: &[Kind] = &[
    Kind::Node,
    Kind::BGPConfiguration,
    Kind::BGPPeer,
    Kind::BGPFilter,
    Kind::IPPool,
];

/// Where the IPAM blocks live.
pub const IPAM_BLOCKS_PREFIX: &str = "/calico/ipam/v2/assignment/";
/// Where the IPAM block affinities live.
pub const IPAM_AFFINITIES_PREFIX: &str = "/calico/ipam/v2/host/";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SyncerType {
    Felix,
    Bgp,
}

/// What a key is to a syncer type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyClass {
    /// A v3 resource: validated before it is served.
    Resource(ResourceKey),
    /// A raw key (IPAM): served as stored.
    Raw,
}

impl SyncerType {
    pub const ALL: &'static [SyncerType] = &[SyncerType::Felix, SyncerType::Bgp];

    pub fn parse(s: &str) -> Option<SyncerType> {
        match s.trim().to_ascii_lowercase().as_str() {
            "felix" => Some(SyncerType::Felix),
            "bgp" => Some(SyncerType::Bgp),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SyncerType::Felix => "felix",
            SyncerType::Bgp => "bgp",
        }
    }

    pub fn kinds(self) -> &'static [Kind] {
        match self {
            SyncerType::Felix => FELIX_KINDS,
            SyncerType::Bgp => BGP_KINDS,
        }
    }

    pub fn raw_prefix(self) -> &'static str {
        match self {
            SyncerType::Felix => IPAM_BLOCKS_PREFIX,
            SyncerType::Bgp => IPAM_AFFINITIES_PREFIX,
        }
    }

    /// The key prefixes a pipeline lists and watches: each kind's and the raw one. etcd and the
    /// embedded store serve them as one list + watch of their common prefix (one revision
    /// order, which is what makes `as_of` meaningful); the Kubernetes datastore watches only
    /// the API resources behind them.
    pub fn watch_prefixes(self) -> Vec<String> {
        let mut v: Vec<String> = self
            .kinds()
            .iter()
            .map(|k| margay_datastore::keys::kind_prefix(*k, None, ""))
            .collect();
        v.push(self.raw_prefix().to_string());
        v
    }

    /// Kubernetes Services and EndpointSlices (margay's key space outside `/calico/`), which
    /// the felix syncer also carries when the datastore is the Kubernetes API: Felix's service
    /// proxy reads them (Calico's felixsyncer watches them in KDD mode).
    pub fn service_prefixes(self) -> &'static [&'static str] {
        use margay_datastore::kube::services::{ENDPOINT_SLICES_KEY_ROOT, SERVICES_KEY_ROOT};
        match self {
            SyncerType::Felix => &[SERVICES_KEY_ROOT, ENDPOINT_SLICES_KEY_ROOT],
            SyncerType::Bgp => &[],
        }
    }

    /// [`SyncerType::classify`], with the service keys when `services` says they are carried
    /// (served as stored, like the IPAM keys).
    pub fn classify_with(self, key: &str, services: bool) -> Option<KeyClass> {
        if services && self.service_prefixes().iter().any(|p| key.starts_with(p)) {
            return Some(KeyClass::Raw);
        }
        self.classify(key)
    }

    /// Whether this syncer type carries `key`, and as what.
    pub fn classify(self, key: &str) -> Option<KeyClass> {
        if key.starts_with(self.raw_prefix()) {
            return Some(KeyClass::Raw);
        }
        let rk = margay_datastore::keys::parse_resource_path(key)?;
        self.kinds()
            .contains(&rk.kind)
            .then_some(KeyClass::Resource(rk))
    }
}

impl std::fmt::Display for SyncerType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let pol = "/calico/resources/v3/projectcalico.org/networkpolicies/ns/p";
        assert!(matches!(
            SyncerType::Felix.classify(pol),
            Some(KeyClass::Resource(_))
        ));
        assert_eq!(SyncerType::Bgp.classify(pol), None);
        let peer = "/calico/resources/v3/projectcalico.org/bgppeers/p";
        assert_eq!(SyncerType::Felix.classify(peer), None);
        assert!(SyncerType::Bgp.classify(peer).is_some());
        let block = "/calico/ipam/v2/assignment/ipv4/block/10.0.0.0-26";
        assert_eq!(SyncerType::Felix.classify(block), Some(KeyClass::Raw));
        assert_eq!(SyncerType::Bgp.classify(block), None);
        let aff = "/calico/ipam/v2/host/n1/ipv4/block/10.0.0.0-26";
        assert_eq!(SyncerType::Bgp.classify(aff), Some(KeyClass::Raw));
        assert_eq!(SyncerType::Felix.classify("/calico/ipam/v2/handle/x"), None);
        assert_eq!(SyncerType::Felix.classify("/calico/felix/v2/x"), None);
        let svc = "/margay/kubernetes/services/ns1/web";
        assert_eq!(SyncerType::Felix.classify(svc), None);
        assert_eq!(SyncerType::Felix.classify_with(svc, false), None);
        assert_eq!(
            SyncerType::Felix.classify_with(svc, true),
            Some(KeyClass::Raw)
        );
        assert_eq!(SyncerType::Bgp.classify_with(svc, true), None);
        assert!(matches!(
            SyncerType::Felix.classify_with(pol, true),
            Some(KeyClass::Resource(_))
        ));
    }

    #[test]
    fn watch_prefixes_cover_what_is_classified() {
        for ty in SyncerType::ALL {
            let prefixes = ty.watch_prefixes();
            assert_eq!(margay_datastore::kv::common_prefix(&prefixes), "/calico/");
            for k in ty.kinds() {
                let key = margay_datastore::keys::kind_prefix(*k, None, "x");
                assert!(
                    prefixes.iter().any(|p| key.starts_with(p.as_str())),
                    "{key}"
                );
            }
        }
    }
}
