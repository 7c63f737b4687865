//! A model dataplane: applies messages to plain maps and checks the ordering contract.
//!
//! Used by the recording driver and by tests: two message streams describe the same dataplane
//! exactly when applying them yields equal models.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use margay_api::net::Cidr;
use serde::Serialize;

use crate::messages::*;

/// The dataplane state a message stream describes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DataplaneModel {
    pub in_sync: bool,
    pub ip_sets: BTreeMap<String, (IpSetKind, BTreeSet<IpSetMember>)>,
    pub policies: BTreeMap<PolicyId, Arc<ResolvedPolicy>>,
    pub profiles: BTreeMap<String, Arc<ResolvedProfile>>,
    pub workload_endpoints: BTreeMap<WorkloadEndpointId, Arc<WorkloadEndpointData>>,
    pub host_endpoints: BTreeMap<String, Arc<HostEndpointData>>,
    pub hosts: BTreeMap<String, (Option<Cidr>, Option<Cidr>)>,
    pub pools: BTreeMap<String, PoolData>,
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    pub service_accounts: BTreeMap<String, BTreeMap<String, String>>,
    pub routes: BTreeMap<Cidr, Route>,
    pub vteps: BTreeMap<String, Vtep>,
    pub encapsulation: Option<(bool, bool, bool)>,
    pub service_cidrs: crate::ServiceCidrs,
    pub services: BTreeMap<crate::services::ServicePortId, Arc<crate::services::ServicePort>>,
}

/// A message that broke the dataplane's ordering contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    #[error("{0} references IP set {1} which the dataplane does not have")]
    MissingIpSet(String, String),
    #[error("endpoint {0} references policy {1} which the dataplane does not have")]
    MissingPolicy(String, String),
    #[error("endpoint {0} references profile {1} which the dataplane does not have")]
    MissingProfile(String, String),
    #[error("IP set {0} removed while policy or profile {1} still uses it")]
    IpSetInUse(String, String),
    #[error("policy {0} removed while endpoint {1} still uses it")]
    PolicyInUse(String, String),
    #[error("profile {0} removed while endpoint {1} still uses it")]
    ProfileInUse(String, String),
    #[error("delta for IP set {0} which the dataplane does not have")]
    DeltaForMissingSet(String),
    #[error("removal of {0} which the dataplane does not have")]
    RemoveMissing(String),
}

impl DataplaneModel {
    /// Applies one message, checking that it respects the dependency order.
    pub fn apply(&mut self, m: &Message) -> Result<(), ContractError> {
        match m {
            Message::InSync => self.in_sync = true,
            Message::ConfigUpdate { .. } => {}
            Message::IpSetUpdate { id, kind, members } => {
                self.ip_sets
                    .insert(id.clone(), (*kind, members.iter().copied().collect()));
            }
            Message::IpSetDeltaUpdate { id, added, removed } => {
                let (_, set) = self
                    .ip_sets
                    .get_mut(id)
                    .ok_or_else(|| ContractError::DeltaForMissingSet(id.clone()))?;
                for r in removed {
                    set.remove(r);
                }
                set.extend(added.iter().copied());
            }
            Message::IpSetRemove { id } => {
                for (pid, p) in &self.policies {
                    if p.ip_set_ids().contains(id) {
                        return Err(ContractError::IpSetInUse(id.clone(), pid.to_string()));
                    }
                }
                for (pid, p) in &self.profiles {
                    if rules_use(&p.inbound, &p.outbound, id) {
                        return Err(ContractError::IpSetInUse(id.clone(), pid.clone()));
                    }
                }
                self.ip_sets
                    .remove(id)
                    .ok_or_else(|| ContractError::RemoveMissing(format!("IP set {id}")))?;
            }
            Message::ActivePolicyUpdate { id, policy } => {
                for set in policy.ip_set_ids() {
                    if !self.ip_sets.contains_key(set) {
                        return Err(ContractError::MissingIpSet(
                            format!("policy {id}"),
                            set.clone(),
                        ));
                    }
                }
                self.policies.insert(id.clone(), policy.clone());
            }
            Message::ActivePolicyRemove { id } => {
                for (eid, ep) in &self.workload_endpoints {
                    if ep.policy_ids().any(|p| p == id) {
                        return Err(ContractError::PolicyInUse(id.to_string(), eid.to_string()));
                    }
                }
                for (eid, ep) in &self.host_endpoints {
                    if ep.policy_ids().any(|p| p == id) {
                        return Err(ContractError::PolicyInUse(id.to_string(), eid.clone()));
                    }
                }
                self.policies
                    .remove(id)
                    .ok_or_else(|| ContractError::RemoveMissing(format!("policy {id}")))?;
            }
            Message::ActiveProfileUpdate { id, profile } => {
                for r in profile.inbound.iter().chain(&profile.outbound) {
                    for set in r.ip_set_ids() {
                        if !self.ip_sets.contains_key(set) {
                            return Err(ContractError::MissingIpSet(
                                format!("profile {id}"),
                                set.clone(),
                            ));
                        }
                    }
                }
                self.profiles.insert(id.clone(), profile.clone());
            }
            Message::ActiveProfileRemove { id } => {
                for (eid, ep) in &self.workload_endpoints {
                    if ep.profile_ids.contains(id) {
                        return Err(ContractError::ProfileInUse(id.clone(), eid.to_string()));
                    }
                }
                for (eid, ep) in &self.host_endpoints {
                    if ep.profile_ids.contains(id) {
                        return Err(ContractError::ProfileInUse(id.clone(), eid.clone()));
                    }
                }
                self.profiles
                    .remove(id)
                    .ok_or_else(|| ContractError::RemoveMissing(format!("profile {id}")))?;
            }
            Message::WorkloadEndpointUpdate { id, endpoint } => {
                self.check_refs(
                    &id.to_string(),
                    endpoint.policy_ids(),
                    &endpoint.profile_ids,
                )?;
                self.workload_endpoints.insert(id.clone(), endpoint.clone());
            }
            Message::WorkloadEndpointRemove { id } => {
                self.workload_endpoints
                    .remove(id)
                    .ok_or_else(|| ContractError::RemoveMissing(format!("endpoint {id}")))?;
            }
            Message::HostEndpointUpdate { id, endpoint } => {
                self.check_refs(id, endpoint.policy_ids(), &endpoint.profile_ids)?;
                self.host_endpoints.insert(id.clone(), endpoint.clone());
            }
            Message::HostEndpointRemove { id } => {
                self.host_endpoints
                    .remove(id)
                    .ok_or_else(|| ContractError::RemoveMissing(format!("host endpoint {id}")))?;
            }
            Message::HostMetadataUpdate {
                hostname,
                ipv4,
                ipv6,
                ..
            } => {
                self.hosts.insert(hostname.clone(), (*ipv4, *ipv6));
            }
            Message::HostMetadataRemove { hostname } => {
                self.hosts.remove(hostname);
            }
            Message::IpamPoolUpdate { id, pool } => {
                self.pools.insert(id.clone(), pool.clone());
            }
            Message::IpamPoolRemove { id } => {
                self.pools.remove(id);
            }
            Message::NamespaceUpdate { id, labels } => {
                self.namespaces.insert(id.clone(), labels.clone());
            }
            Message::NamespaceRemove { id } => {
                self.namespaces.remove(id);
            }
            Message::ServiceAccountUpdate { id, labels } => {
                self.service_accounts.insert(id.clone(), labels.clone());
            }
            Message::ServiceAccountRemove { id } => {
                self.service_accounts.remove(id);
            }
            Message::RouteUpdate(r) => {
                self.routes.insert(r.dst, r.clone());
            }
            Message::RouteRemove { dst } => {
                self.routes
                    .remove(dst)
                    .ok_or_else(|| ContractError::RemoveMissing(format!("route {dst}")))?;
            }
            Message::VtepUpdate(v) => {
                self.vteps.insert(v.node.clone(), v.clone());
            }
            Message::VtepRemove { node } => {
                self.vteps.remove(node);
            }
            Message::Encapsulation {
                ipip,
                vxlan,
                vxlan_v6,
            } => self.encapsulation = Some((*ipip, *vxlan, *vxlan_v6)),
            Message::GlobalBgpConfig(s) => self.service_cidrs = s.clone(),
            Message::ServiceUpdate { id, service } => {
                self.services.insert(id.clone(), service.clone());
            }
            Message::ServiceRemove { id } => {
                self.services
                    .remove(id)
                    .ok_or_else(|| ContractError::RemoveMissing(format!("service port {id}")))?;
            }
        }
        Ok(())
    }

    pub fn apply_all<'a>(
        &mut self,
        messages: impl IntoIterator<Item = &'a Message>,
    ) -> Result<(), ContractError> {
        for m in messages {
            self.apply(m)?;
        }
        Ok(())
    }

    fn check_refs<'a>(
        &self,
        endpoint: &str,
        policies: impl Iterator<Item = &'a PolicyId>,
        profiles: &[String],
    ) -> Result<(), ContractError> {
        for p in policies {
            if !self.policies.contains_key(p) {
                return Err(ContractError::MissingPolicy(
                    endpoint.to_string(),
                    p.to_string(),
                ));
            }
        }
        for p in profiles {
            if !self.profiles.contains_key(p) {
                return Err(ContractError::MissingProfile(
                    endpoint.to_string(),
                    p.clone(),
                ));
            }
        }
        Ok(())
    }

    /// Members of an IP set, for assertions.
    pub fn members(&self, id: &str) -> Option<&BTreeSet<IpSetMember>> {
        self.ip_sets.get(id).map(|(_, m)| m)
    }
}

fn rules_use(inbound: &[ResolvedRule], outbound: &[ResolvedRule], id: &str) -> bool {
    inbound
        .iter()
        .chain(outbound)
        .any(|r| r.ip_set_ids().any(|s| s == id))
}
