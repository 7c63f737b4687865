//! `margay node allocate-tunnel-addrs`: this node's VXLAN tunnel addresses from IPAM
//! (calico-node's `-allocate-tunnel-addrs`, one shot).
//!
//! For each IP version: when an IP pool that uses VXLAN (`vxlanMode` Always or CrossSubnet,
//! enabled, not being deleted, selecting this node, allowing tunnel use) exists, the node gets
//! one address from such a pool under the handle `vxlan-tunnel-addr-<node>`
//! (`vxlan-v6-tunnel-addr-<node>`) with the attributes `node=<node>` and
//! `type=vxlanTunnelAddress` (`vxlanV6TunnelAddress`), recorded in the Node's
//! `ipv4VXLANTunnelAddr` (`ipv6VXLANTunnelAddr`). An address the handle already holds in a
//! VXLAN pool is kept; one in a pool that no longer uses VXLAN is released and replaced; with
//! no VXLAN pool left the address is released and cleared. The VTEP MAC
//! (`vxlanTunnelMACAddr`, `vxlanTunnelMACAddrV6`) is filled in when empty with the one the
//! calculation graph would derive anyway (`margay_calc::vxlan_mac_for_node`), so every node
//! sees the same MAC. The Node is written with compare-and-swap and the whole step is re-run on
//! a concurrent change; running it again changes nothing.

use std::collections::BTreeMap;
use std::net::IpAddr;

use margay_api::ippool::{AllowedUse, EncapMode};
use margay_api::net::Cidr;
use margay_api::{Kind, Node, Resource, ResourceKey};
use margay_datastore::{Client, DatastoreError, KvBackend};
use margay_ipam::{AssignArgs, Ipam, IpamError, PoolInfo, ReleaseIp, vxlan_tunnel_handle};

/// Allocation attribute naming the node.
pub const ATTR_NODE: &str = "node";
/// Allocation attribute naming what the address is for.
pub const ATTR_TYPE: &str = "type";
/// `type` of an IPv4 VXLAN tunnel address.
pub const TYPE_VXLAN: &str = "vxlanTunnelAddress";
/// `type` of an IPv6 VXLAN tunnel address.
pub const TYPE_VXLAN_V6: &str = "vxlanV6TunnelAddress";

const WRITE_ATTEMPTS: usize = 5;

/// Handle of a node's IPv6 VXLAN tunnel address.
pub fn vxlan_v6_tunnel_handle(node: &str) -> String {
    format!("vxlan-v6-tunnel-addr-{node}")
}

/// Why the tunnel addresses could not be allocated; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error("node {0:?} is not registered; run `margay node startup` first")]
    NoNode(String),
    #[error("datastore: {0}")]
    Datastore(#[from] DatastoreError),
    #[error("IPAM: {0}")]
    Ipam(#[from] IpamError),
    #[error(
        "node {node:?} changed concurrently {attempts} times while its tunnel addresses were recorded; run the command again"
    )]
    Contention { node: String, attempts: usize },
}

/// What the step did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TunnelOutcome {
    /// The node's VXLAN tunnel addresses now.
    pub ipv4: Option<IpAddr>,
    pub ipv6: Option<IpAddr>,
    /// Addresses newly assigned by this run.
    pub assigned: Vec<IpAddr>,
    /// Addresses released by this run.
    pub released: Vec<IpAddr>,
    /// The Node was changed.
    pub node_written: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn version(self) -> u8 {
        match self {
            Family::V4 => 4,
            Family::V6 => 6,
        }
    }
    fn handle(self, node: &str) -> String {
        match self {
            Family::V4 => vxlan_tunnel_handle(node),
            Family::V6 => vxlan_v6_tunnel_handle(node),
        }
    }
    fn attr_type(self) -> &'static str {
        match self {
            Family::V4 => TYPE_VXLAN,
            Family::V6 => TYPE_VXLAN_V6,
        }
    }
    /// The MAC the calculation graph derives for a node that publishes none.
    fn default_mac(self, node: &str) -> String {
        match self {
            Family::V4 => margay_calc::vxlan_mac_for_node(node),
            Family::V6 => margay_calc::vxlan_mac_for_node(&format!("{node}/v6")),
        }
    }
    fn addr(self, node: &mut Node) -> &mut String {
        match self {
            Family::V4 => &mut node.spec.ipv4_vxlan_tunnel_addr,
            Family::V6 => &mut node.spec.ipv6_vxlan_tunnel_addr,
        }
    }
    fn mac(self, node: &mut Node) -> &mut String {
        match self {
            Family::V4 => &mut node.spec.vxlan_tunnel_mac_addr,
            Family::V6 => &mut node.spec.vxlan_tunnel_mac_addr_v6,
        }
    }
}

/// A pool usable for this node's VXLAN tunnel address of one IP version.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TunnelPool {
    name: String,
    cidr: Cidr,
}

/// The enabled VXLAN pools of `family` that may give `node` a tunnel address (Calico's
/// determineEnabledPoolCIDRs), in the datastore's order.
fn vxlan_pools(node: &Node, pools: &[Resource], family: Family) -> Vec<TunnelPool> {
    let labels: &BTreeMap<String, String> = &node.metadata.labels;
    pools
        .iter()
        .filter_map(|r| match r {
            Resource::IPPool(p) => Some(p),
            _ => None,
        })
        .filter(|p| {
            matches!(p.spec.vxlan(), EncapMode::Always | EncapMode::CrossSubnet)
                && !p.spec.disabled
                && p.metadata.deletion_timestamp.is_none()
        })
        .filter_map(|p| match PoolInfo::from_resource(p) {
            Ok(info) => Some(info),
            Err(e) => {
                tracing::warn!("ignoring IP pool for tunnel addresses: {e}");
                None
            }
        })
        .filter(|p| {
            p.cidr.version() == family.version()
                && p.allowed_uses.contains(&AllowedUse::Tunnel)
                && p.node_selector.matches(labels)
        })
        .map(|p| TunnelPool {
            name: p.name,
            cidr: p.cidr,
        })
        .collect()
}

/// Allocates (or keeps, or releases) `node_name`'s VXLAN tunnel addresses and records them on
/// its Node. Idempotent.
pub async fn allocate_tunnel_addrs<B: KvBackend + Clone>(
    client: &Client<B>,
    ipam: &Ipam<B>,
    node_name: &str,
) -> Result<TunnelOutcome, TunnelError> {
    let mut outcome = TunnelOutcome::default();
    let result = reconcile(client, ipam, node_name, &mut outcome).await;
    if result.is_err() && !outcome.assigned.is_empty() {
        // As Calico does: what this run assigned is given back when the run fails.
        let ips: Vec<ReleaseIp> = outcome
            .assigned
            .iter()
            .map(|ip| ReleaseIp {
                ip: *ip,
                sequence_number: None,
            })
            .collect();
        if let Err(e) = ipam.release_ips(&ips).await {
            tracing::error!(addresses = ?outcome.assigned, "releasing tunnel addresses after a failure: {e}");
        }
    }
    result.map(|()| outcome)
}

async fn reconcile<B: KvBackend + Clone>(
    client: &Client<B>,
    ipam: &Ipam<B>,
    node_name: &str,
    outcome: &mut TunnelOutcome,
) -> Result<(), TunnelError> {
    let key = ResourceKey {
        kind: Kind::Node,
        namespace: String::new(),
        name: node_name.to_string(),
    };
    for attempt in 1..=WRITE_ATTEMPTS {
        let mut node = match client.get(&key).await {
            Ok(Resource::Node(n)) => n,
            Ok(_) | Err(DatastoreError::NotFound { .. }) => {
                return Err(TunnelError::NoNode(node_name.to_string()));
            }
            Err(e) => return Err(e.into()),
        };
        let pools = client.list(Kind::IPPool, None, "").await?.items;
        let before = node.clone();
        for family in [Family::V4, Family::V6] {
            let usable = vxlan_pools(&node, &pools, family);
            let ip = if usable.is_empty() {
                remove(ipam, &mut node, family, outcome).await?;
                None
            } else {
                Some(ensure(ipam, &mut node, family, &usable, outcome).await?)
            };
            match family {
                Family::V4 => outcome.ipv4 = ip,
                Family::V6 => outcome.ipv6 = ip,
            }
        }
        if node == before {
            tracing::info!(node = node_name, ipv4 = ?outcome.ipv4, ipv6 = ?outcome.ipv6, "tunnel addresses are up to date");
            return Ok(());
        }
        match client.update(Resource::Node(node)).await {
            Ok(_) => {
                outcome.node_written = true;
                tracing::info!(node = node_name, ipv4 = ?outcome.ipv4, ipv6 = ?outcome.ipv6, "recorded the node's tunnel addresses");
                return Ok(());
            }
            Err(DatastoreError::Conflict { .. }) if attempt < WRITE_ATTEMPTS => {
                // Addresses assigned this round stay with the handle and are reused next
                // round.
                tracing::info!(
                    node = node_name,
                    attempt,
                    "Node changed concurrently; re-reading"
                );
            }
            Err(DatastoreError::Conflict { .. }) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Err(TunnelError::Contention {
        node: node_name.to_string(),
        attempts: WRITE_ATTEMPTS,
    })
}

/// Makes sure the node has an address of `family` from `usable`; returns it.
async fn ensure<B: KvBackend + Clone>(
    ipam: &Ipam<B>,
    node: &mut Node,
    family: Family,
    usable: &[TunnelPool],
    outcome: &mut TunnelOutcome,
) -> Result<IpAddr, TunnelError> {
    let name = node.metadata.name.clone();
    let handle = family.handle(&name);
    let in_pool = |ip: &IpAddr| usable.iter().any(|p| p.cidr.contains(*ip));
    let held: Vec<IpAddr> = ipam
        .ips_by_handle(&handle)
        .await?
        .into_iter()
        .map(|a| a.ip)
        .collect();
    let recorded: Option<IpAddr> = family.addr(node).parse().ok();
    // The recorded address if the handle still holds it in a VXLAN pool, else any address
    // the handle holds in one (the Node lost its record), else a new one.
    let keep = recorded
        .filter(|ip| held.contains(ip) && in_pool(ip))
        .or_else(|| held.iter().copied().find(in_pool));
    let stale: Vec<ReleaseIp> = held
        .iter()
        .filter(|ip| Some(**ip) != keep)
        .map(|ip| ReleaseIp {
            ip: *ip,
            sequence_number: None,
        })
        .collect();
    if !stale.is_empty() {
        let released = ipam.release_ips(&stale).await?;
        tracing::info!(node = %name, handle = %handle, released = ?released, "released tunnel addresses outside the VXLAN pools");
        outcome.released.extend(released);
    }
    let ip = match keep {
        Some(ip) => {
            if recorded != Some(ip) {
                tracing::info!(node = %name, %ip, "reusing the tunnel address the handle holds");
            }
            ip
        }
        None => {
            let mut args = AssignArgs::new(handle.clone(), name.clone());
            args.attrs.insert(ATTR_NODE.to_string(), name.clone());
            args.attrs
                .insert(ATTR_TYPE.to_string(), family.attr_type().to_string());
            args.intended_use = AllowedUse::Tunnel;
            let pools: Vec<String> = usable.iter().map(|p| p.name.clone()).collect();
            match family {
                Family::V4 => {
                    args.num_v4 = 1;
                    args.v4_pools = pools;
                }
                Family::V6 => {
                    args.num_v4 = 0;
                    args.num_v6 = 1;
                    args.v6_pools = pools;
                }
            }
            let assigned = ipam.auto_assign(&args).await?;
            let ip = assigned
                .all()
                .next()
                .map(|a| a.ip)
                .ok_or_else(|| IpamError::Exhausted {
                    version: family.version(),
                    pools: usable.iter().map(|p| p.name.clone()).collect(),
                    node: name.clone(),
                    wanted: 1,
                    got: 0,
                    hint: String::new(),
                })?;
            outcome.assigned.push(ip);
            tracing::info!(node = %name, %ip, handle = %handle, "assigned a VXLAN tunnel address");
            ip
        }
    };
    *family.addr(node) = ip.to_string();
    if family.mac(node).is_empty() {
        *family.mac(node) = family.default_mac(&name);
    }
    Ok(ip)
}

/// No VXLAN pool for `family`: release the node's address and clear it.
async fn remove<B: KvBackend + Clone>(
    ipam: &Ipam<B>,
    node: &mut Node,
    family: Family,
    outcome: &mut TunnelOutcome,
) -> Result<(), TunnelError> {
    let name = node.metadata.name.clone();
    let handle = family.handle(&name);
    let released = ipam.release_by_handle(&handle).await?;
    let recorded = std::mem::take(family.addr(node));
    if !released.is_empty() || !recorded.is_empty() {
        tracing::info!(node = %name, handle = %handle, released = ?released, recorded = %recorded, "no VXLAN pool: released the tunnel address");
    }
    outcome.released.extend(released);
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use margay_api::decode_one;
    use margay_datastore::MemBackend;

    fn res(yaml: &str) -> Resource {
        let r = decode_one(yaml).unwrap();
        r.validate().unwrap();
        r
    }

    fn pool(name: &str, cidr: &str, extra: &str) -> Resource {
        res(&format!(
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: {name}}}\nspec: {{cidr: {cidr}{extra}}}"
        ))
    }

    struct Fixture {
        client: Client<MemBackend>,
        ipam: Ipam<MemBackend>,
    }

    async fn fixture(labels: &str) -> Fixture {
        let kv = MemBackend::new();
        let client = Client::new(kv.clone());
        let node = res(&format!(
            "apiVersion: projectcalico.org/v3\nkind: Node\nmetadata:\n  name: node-1\n  labels: {{{labels}}}\nspec:\n  bgp:\n    ipv4Address: 10.0.0.5/24"
        ));
        client.create(node).await.unwrap();
        Fixture {
            client,
            ipam: Ipam::new(kv),
        }
    }

    impl Fixture {
        async fn node(&self) -> Node {
            let key = ResourceKey {
                kind: Kind::Node,
                namespace: String::new(),
                name: "node-1".into(),
            };
            match self.client.get(&key).await.unwrap() {
                Resource::Node(n) => n,
                _ => unreachable!(),
            }
        }
        async fn run(&self) -> TunnelOutcome {
            allocate_tunnel_addrs(&self.client, &self.ipam, "node-1")
                .await
                .unwrap()
        }
        async fn put(&self, r: Resource) {
            self.client.apply(r).await.unwrap();
        }
    }

    #[tokio::test]
    async fn assigns_records_and_is_idempotent() {
        let f = fixture("").await;
        f.put(pool("vx", "10.244.0.0/16", ", vxlanMode: Always"))
            .await;
        let out = f.run().await;
        let ip = out.ipv4.unwrap();
        assert!(Cidr::parse("10.244.0.0/16").unwrap().contains(ip));
        assert_eq!(out.assigned, vec![ip]);
        assert!(out.node_written && out.ipv6.is_none());
        let n = f.node().await;
        assert_eq!(n.spec.ipv4_vxlan_tunnel_addr, ip.to_string());
        assert_eq!(
            n.spec.vxlan_tunnel_mac_addr,
            margay_calc::vxlan_mac_for_node("node-1")
        );
        // The IPAM record: the handle and the attributes Calico uses.
        let held = f
            .ipam
            .ips_by_handle("vxlan-tunnel-addr-node-1")
            .await
            .unwrap();
        assert_eq!(held.len(), 1);
        let blocks = f.ipam.blocks().await.unwrap();
        let a = blocks
            .iter()
            .flat_map(|b| b.allocated())
            .find(|a| a.ip == ip)
            .unwrap();
        assert_eq!(
            a.attribute.attrs.get(ATTR_TYPE).map(String::as_str),
            Some(TYPE_VXLAN)
        );
        assert_eq!(
            a.attribute.attrs.get(ATTR_NODE).map(String::as_str),
            Some("node-1")
        );
        // Again: nothing changes.
        let rv = n.metadata.resource_version.clone();
        let again = f.run().await;
        assert_eq!(again.ipv4, Some(ip));
        assert!(again.assigned.is_empty() && again.released.is_empty() && !again.node_written);
        assert_eq!(f.node().await.metadata.resource_version, rv);
    }

    #[tokio::test]
    async fn a_published_mac_is_kept() {
        let f = fixture("").await;
        f.put(pool("vx", "10.244.0.0/16", ", vxlanMode: CrossSubnet"))
            .await;
        let mut n = f.node().await;
        n.spec.vxlan_tunnel_mac_addr = "66:00:00:00:00:01".into();
        f.client.update(Resource::Node(n)).await.unwrap();
        assert!(f.run().await.ipv4.is_some());
        assert_eq!(
            f.node().await.spec.vxlan_tunnel_mac_addr,
            "66:00:00:00:00:01"
        );
    }

    #[tokio::test]
    async fn no_vxlan_pool_no_address_and_release_when_it_goes() {
        let f = fixture("").await;
        f.put(pool("plain", "10.244.0.0/16", "")).await;
        f.put(pool("ipip", "10.245.0.0/16", ", ipipMode: Always"))
            .await;
        let out = f.run().await;
        assert_eq!(out, TunnelOutcome::default());

        f.put(pool("vx", "10.246.0.0/16", ", vxlanMode: Always"))
            .await;
        let ip = f.run().await.ipv4.unwrap();
        assert!(Cidr::parse("10.246.0.0/16").unwrap().contains(ip));
        // The pool stops using VXLAN: the address is released and cleared.
        f.put(pool("vx", "10.246.0.0/16", ", vxlanMode: Never"))
            .await;
        let out = f.run().await;
        assert_eq!(out.released, vec![ip]);
        assert!(out.ipv4.is_none() && out.node_written);
        assert_eq!(f.node().await.spec.ipv4_vxlan_tunnel_addr, "");
        assert!(
            f.ipam
                .ips_by_handle("vxlan-tunnel-addr-node-1")
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn an_address_in_a_pool_that_left_vxlan_moves_to_one_that_uses_it() {
        let f = fixture("").await;
        f.put(pool("a", "10.244.0.0/16", ", vxlanMode: Always"))
            .await;
        let old = f.run().await.ipv4.unwrap();
        f.put(pool("a", "10.244.0.0/16", ", vxlanMode: Never"))
            .await;
        f.put(pool("b", "10.250.0.0/16", ", vxlanMode: Always"))
            .await;
        let out = f.run().await;
        let new = out.ipv4.unwrap();
        assert!(Cidr::parse("10.250.0.0/16").unwrap().contains(new));
        assert_eq!(out.released, vec![old]);
        assert_eq!(out.assigned, vec![new]);
        assert_eq!(
            f.ipam
                .ips_by_handle("vxlan-tunnel-addr-node-1")
                .await
                .unwrap()
                .iter()
                .map(|a| a.ip)
                .collect::<Vec<_>>(),
            vec![new]
        );
    }

    #[tokio::test]
    async fn a_lost_record_is_recovered_from_the_handle() {
        let f = fixture("").await;
        f.put(pool("vx", "10.244.0.0/16", ", vxlanMode: Always"))
            .await;
        let ip = f.run().await.ipv4.unwrap();
        // Someone edits the Node and drops (or garbles) the address.
        let mut n = f.node().await;
        n.spec.ipv4_vxlan_tunnel_addr = String::new();
        f.client.update(Resource::Node(n)).await.unwrap();
        let out = f.run().await;
        assert_eq!(out.ipv4, Some(ip));
        assert!(out.assigned.is_empty() && out.node_written);
        assert_eq!(f.node().await.spec.ipv4_vxlan_tunnel_addr, ip.to_string());
    }

    #[tokio::test]
    async fn pools_that_do_not_select_the_node_or_forbid_tunnels_are_skipped() {
        let f = fixture("zone: a").await;
        f.put(pool(
            "other-zone",
            "10.244.0.0/16",
            ", vxlanMode: Always, nodeSelector: \"zone == 'b'\"",
        ))
        .await;
        f.put(pool(
            "workloads-only",
            "10.245.0.0/16",
            ", vxlanMode: Always, allowedUses: [Workload]",
        ))
        .await;
        f.put(pool(
            "disabled",
            "10.246.0.0/16",
            ", vxlanMode: Always, disabled: true",
        ))
        .await;
        assert_eq!(f.run().await.ipv4, None);
        f.put(pool(
            "this-zone",
            "10.247.0.0/16",
            ", vxlanMode: Always, nodeSelector: \"zone == 'a'\"",
        ))
        .await;
        let ip = f.run().await.ipv4.unwrap();
        assert!(Cidr::parse("10.247.0.0/16").unwrap().contains(ip));
    }

    #[tokio::test]
    async fn ipv6_pools_give_an_ipv6_address() {
        let f = fixture("").await;
        f.put(pool(
            "vx6",
            "fd00:244::/48",
            ", vxlanMode: Always, blockSize: 122",
        ))
        .await;
        let out = f.run().await;
        let ip = out.ipv6.unwrap();
        assert!(Cidr::parse("fd00:244::/48").unwrap().contains(ip));
        let n = f.node().await;
        assert_eq!(n.spec.ipv6_vxlan_tunnel_addr, ip.to_string());
        assert_eq!(
            n.spec.vxlan_tunnel_mac_addr_v6,
            margay_calc::vxlan_mac_for_node("node-1/v6")
        );
        assert!(
            !f.ipam
                .ips_by_handle("vxlan-v6-tunnel-addr-node-1")
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn an_unregistered_node_is_an_error_that_says_what_to_do() {
        let f = fixture("").await;
        let err = allocate_tunnel_addrs(&f.client, &f.ipam, "nope")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("margay node startup"), "{err}");
    }
}
