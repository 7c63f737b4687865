//! Automatic host endpoints (the node controller's `hostEndpoint.autoCreate: Enabled`, or
//! AUTO_HOST_ENDPOINTS=enabled): one `<node>-auto-hep` per Calico Node, `interfaceName: "*"`,
//! the node's labels plus `projectcalico.org/created-by=calico-kube-controllers`, profile
//! `projectcalico-default-allow`, and expectedIPs from the node's addresses (Calico's default
//! host endpoint). Managed endpoints (those with the label) are updated when they differ and
//! deleted with their node, or all of them when auto-creation is off.
//!
//! [`plan`] is pure; [`reconcile`] reads the datastore and writes the plan; [`run`] repeats it
//! every period (level-triggered: a missed change is made at the next pass).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use base64::Engine as _;
use margay_api::endpoint::HostEndpointSpec;
use margay_api::{HostEndpoint, Kind, ObjectMeta, Resource, ResourceKey};
use margay_datastore::{Client, DatastoreError, KvBackend};
use sha2::Digest as _;
use tokio::sync::watch;

pub const CREATED_BY_LABEL: &str = "projectcalico.org/created-by";
pub const CREATED_BY_VALUE: &str = "calico-kube-controllers";
pub const DEFAULT_ALLOW_PROFILE: &str = "projectcalico-default-allow";
const SUFFIX: &str = "-auto-hep";
/// Kubernetes' limit on a name.
const MAX_NAME: usize = 253;

/// The default host endpoint's name: `<node>-auto-hep`; a name over 253 characters becomes
/// the lowercase base64url of its SHA-256 without `-`, `_` and `.`, then `-auto-hep`.
pub fn hep_name(node: &str) -> String {
    let name = format!("{node}{SUFFIX}");
    if name.len() <= MAX_NAME {
        return name;
    }
    let digest = sha2::Sha256::digest(name.as_bytes());
    let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest);
    let cleaned: String = encoded
        .chars()
        .filter(|c| !matches!(c, '-' | '_' | '.'))
        .collect::<String>()
        .to_lowercase();
    format!("{cleaned}{SUFFIX}")
}

/// An address as written in a Node (`10.0.0.1/24` or `10.0.0.1`), without its prefix.
fn bare_ip(s: &str) -> Option<IpAddr> {
    s.split('/').next()?.trim().parse().ok()
}

/// The node's addresses Calico puts in its default host endpoint, deduplicated in order: BGP
/// v4/v6, the IPIP and VXLAN v4/v6 tunnel addresses, WireGuard v4/v6, the InternalIPs, the
/// addresses of `spec.interfaces`. What does not parse is left out.
pub fn expected_ips(node: &margay_api::Node) -> Vec<String> {
    let s = &node.spec;
    let mut raw: Vec<&str> = Vec::new();
    if let Some(bgp) = &s.bgp {
        raw.extend([
            bgp.ipv4_address.as_str(),
            bgp.ipv6_address.as_str(),
            bgp.ipv4_ipip_tunnel_addr.as_str(),
        ]);
    }
    raw.extend([
        s.ipv4_vxlan_tunnel_addr.as_str(),
        s.ipv6_vxlan_tunnel_addr.as_str(),
    ]);
    if let Some(wg) = &s.wireguard {
        raw.extend([
            wg.interface_ipv4_address.as_str(),
            wg.interface_ipv6_address.as_str(),
        ]);
    }
    raw.extend(
        s.addresses
            .iter()
            .filter(|a| a.type_ == "InternalIP")
            .map(|a| a.address.as_str()),
    );
    raw.extend(
        s.interfaces
            .iter()
            .flat_map(|i| i.addresses.iter().map(String::as_str)),
    );
    let mut seen = BTreeSet::new();
    raw.into_iter()
        .filter_map(bare_ip)
        .filter(|ip| seen.insert(*ip))
        .map(|ip| ip.to_string())
        .collect()
}

/// The host endpoint the controller wants for `node`.
pub fn desired_hep(node: &margay_api::Node) -> HostEndpoint {
    let mut labels = node.metadata.labels.clone();
    labels.insert(CREATED_BY_LABEL.into(), CREATED_BY_VALUE.into());
    HostEndpoint::new(
        ObjectMeta {
            name: hep_name(&node.metadata.name),
            labels,
            ..ObjectMeta::default()
        },
        HostEndpointSpec {
            node: node.metadata.name.clone(),
            interface_name: "*".into(),
            expected_ips: expected_ips(node),
            profiles: vec![DEFAULT_ALLOW_PROFILE.into()],
            ports: Vec::new(),
        },
    )
}

fn managed(h: &HostEndpoint) -> bool {
    h.metadata.labels.get(CREATED_BY_LABEL).map(String::as_str) == Some(CREATED_BY_VALUE)
}

/// One write the controller makes.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Create(HostEndpoint),
    /// The stored endpoint (its resourceVersion kept) with the wanted labels and spec.
    Update(HostEndpoint),
    Delete {
        name: String,
        version: String,
    },
}

/// What to write so that the managed host endpoints are exactly one per node (none when
/// `enabled` is false). Endpoints without the managed label are never touched; a wanted name
/// taken by one of them is left alone (and reported by the caller as a conflict).
pub fn plan(enabled: bool, nodes: &[margay_api::Node], heps: &[HostEndpoint]) -> Vec<Change> {
    let existing: BTreeMap<&str, &HostEndpoint> =
        heps.iter().map(|h| (h.metadata.name.as_str(), h)).collect();
    let mut wanted: BTreeMap<String, HostEndpoint> = BTreeMap::new();
    if enabled {
        for n in nodes {
            let h = desired_hep(n);
            wanted.insert(h.metadata.name.clone(), h);
        }
    }
    let mut out = Vec::new();
    for (name, want) in &wanted {
        match existing.get(name.as_str()) {
            None => out.push(Change::Create(want.clone())),
            Some(have) if !managed(have) => {}
            Some(have) => {
                let differs = have.metadata.labels != want.metadata.labels
                    || have.spec.expected_ips != want.spec.expected_ips
                    || have.spec.interface_name != want.spec.interface_name
                    || have.spec.node != want.spec.node
                    || have.spec.profiles != want.spec.profiles;
                if differs {
                    let mut h = (*have).clone();
                    h.metadata.labels = want.metadata.labels.clone();
                    h.spec = want.spec.clone();
                    out.push(Change::Update(h));
                }
            }
        }
    }
    for h in heps {
        if managed(h) && !wanted.contains_key(&h.metadata.name) {
            out.push(Change::Delete {
                name: h.metadata.name.clone(),
                version: h.metadata.resource_version.clone(),
            });
        }
    }
    out
}

/// One pass: reads the Calico Nodes and host endpoints, writes [`plan`]. Returns the number
/// of writes made; a write that fails is logged and left to the next pass.
pub async fn reconcile<B: KvBackend>(
    client: &Client<B>,
    enabled: bool,
) -> Result<usize, DatastoreError> {
    let nodes: Vec<margay_api::Node> = if enabled {
        client
            .list(Kind::Node, None, "")
            .await?
            .items
            .into_iter()
            .filter_map(|r| match r {
                Resource::Node(n) => Some(n),
                _ => None,
            })
            .collect()
    } else {
        Vec::new()
    };
    let heps: Vec<HostEndpoint> = client
        .list(Kind::HostEndpoint, None, "")
        .await?
        .items
        .into_iter()
        .filter_map(|r| match r {
            Resource::HostEndpoint(h) => Some(h),
            _ => None,
        })
        .collect();
    let mut written = 0;
    for change in plan(enabled, &nodes, &heps) {
        let result = match change {
            Change::Create(h) => {
                let name = h.metadata.name.clone();
                tracing::info!(hostendpoint = %name, "creating automatic host endpoint");
                client.create(h.into()).await.map(drop)
            }
            Change::Update(h) => {
                tracing::info!(hostendpoint = %h.metadata.name, "updating automatic host endpoint");
                client.update(h.into()).await.map(drop)
            }
            Change::Delete { name, version } => {
                tracing::info!(hostendpoint = %name, "deleting automatic host endpoint");
                let key = ResourceKey {
                    kind: Kind::HostEndpoint,
                    namespace: String::new(),
                    name,
                };
                let v = (!version.is_empty()).then_some(version.as_str());
                client.delete(&key, v).await.map(drop)
            }
        };
        match result {
            Ok(()) => written += 1,
            Err(e) => tracing::warn!("automatic host endpoints: {e}; retried at the next pass"),
        }
    }
    Ok(written)
}

/// Reconciles every `period` until stopped; with `enabled` false, one pass that removes the
/// managed endpoints, then returns.
pub async fn run<B: KvBackend>(
    client: Client<B>,
    enabled: bool,
    period: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if let Err(e) = reconcile(&client, enabled).await {
            tracing::warn!("automatic host endpoints: cannot read the datastore: {e}");
        }
        if !enabled {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use margay_api::endpoint::{NodeAddress, NodeBgpSpec, NodeInterface, NodeSpec};

    use super::*;

    fn node(name: &str, labels: &[(&str, &str)]) -> margay_api::Node {
        let mut n = margay_api::Node::new(
            ObjectMeta {
                name: name.into(),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..ObjectMeta::default()
            },
            NodeSpec::default(),
        );
        n.spec.bgp = Some(NodeBgpSpec {
            ipv4_address: "10.0.0.1/24".into(),
            ipv4_ipip_tunnel_addr: "10.65.0.1".into(),
            ..NodeBgpSpec::default()
        });
        n.spec.ipv4_vxlan_tunnel_addr = "10.65.0.2".into();
        n.spec.addresses = vec![
            NodeAddress {
                address: "10.0.0.1".into(),
                type_: "InternalIP".into(),
            },
            NodeAddress {
                address: "203.0.113.9".into(),
                type_: "ExternalIP".into(),
            },
        ];
        n.spec.interfaces = vec![NodeInterface {
            name: "eth1".into(),
            addresses: vec!["fd00::1".into(), "bogus".into()],
        }];
        n
    }

    #[test]
    fn the_default_host_endpoint_is_calicos() {
        let h = desired_hep(&node("n1", &[("zone", "a")]));
        assert_eq!(h.metadata.name, "n1-auto-hep");
        assert_eq!(h.metadata.labels["zone"], "a");
        assert_eq!(h.metadata.labels[CREATED_BY_LABEL], CREATED_BY_VALUE);
        assert_eq!(h.spec.interface_name, "*");
        assert_eq!(h.spec.node, "n1");
        assert_eq!(h.spec.profiles, vec![DEFAULT_ALLOW_PROFILE.to_string()]);
        // Prefix stripped, deduplicated, ExternalIP and what does not parse left out.
        assert_eq!(
            h.spec.expected_ips,
            vec!["10.0.0.1", "10.65.0.1", "10.65.0.2", "fd00::1"]
        );
        // It passes the API's validation.
        Resource::from(h).validate().unwrap();
    }

    #[test]
    fn long_names_are_hashed_into_a_valid_name() {
        let long = "n".repeat(250);
        let name = hep_name(&long);
        assert!(name.len() <= MAX_NAME && name.ends_with(SUFFIX), "{name}");
        assert!(
            name.trim_end_matches(SUFFIX)
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert_eq!(name, hep_name(&long));
        assert_ne!(name, hep_name(&"m".repeat(250)));
    }

    #[test]
    fn plan_creates_updates_and_deletes_only_managed_endpoints() {
        let n1 = node("n1", &[]);
        let n2 = node("n2", &[]);
        // n1's endpoint exists but is stale; n2's is missing; n3 is gone; a hand-made one
        // stays whatever it is.
        let mut stale = desired_hep(&n1);
        stale.spec.expected_ips = vec!["10.9.9.9".into()];
        stale.metadata.resource_version = "7".into();
        let mut gone = desired_hep(&node("n3", &[]));
        gone.metadata.resource_version = "9".into();
        let mut mine = desired_hep(&node("n9", &[]));
        mine.metadata.labels.clear();
        let plan1 = plan(
            true,
            &[n1.clone(), n2.clone()],
            &[stale, gone, mine.clone()],
        );
        assert_eq!(plan1.len(), 3, "{plan1:?}");
        assert!(
            matches!(&plan1[0], Change::Update(h) if h.metadata.resource_version == "7" && h.spec.expected_ips == desired_hep(&n1).spec.expected_ips)
        );
        assert!(matches!(&plan1[1], Change::Create(h) if h.metadata.name == "n2-auto-hep"));
        assert_eq!(
            plan1[2],
            Change::Delete {
                name: "n3-auto-hep".into(),
                version: "9".into()
            }
        );
        // Converged: nothing to do.
        let heps = [desired_hep(&n1), desired_hep(&n2), mine.clone()];
        assert!(plan(true, &[n1.clone(), n2.clone()], &heps).is_empty());
        // Turned off: every managed one goes, the hand-made one stays.
        let off = plan(false, &[n1, n2], &heps);
        assert_eq!(off.len(), 2);
        assert!(
            off.iter()
                .all(|c| matches!(c, Change::Delete { name, .. } if name != "n9-auto-hep"))
        );
    }
}
