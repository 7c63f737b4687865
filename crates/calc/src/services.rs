//! Kubernetes Services as a proxy sees them (pure): Services and EndpointSlices in, per
//! service port its frontends and usable backends out, with kube-proxy's semantics.
//!
//! The inputs are the Kubernetes objects themselves (`core/v1` Service, `discovery.k8s.io/v1`
//! EndpointSlice), decoded straight from the API server's JSON; only the fields a proxy reads
//! are kept. [`ServiceIndex`] holds them and answers, per service, the [`ServicePort`]s the
//! dataplane programs and the members of Calico's `destination.services` IP sets.
//!
//! Facts (kube-proxy, `pkg/proxy`): an endpoint's `ready` defaults to true, `serving` to
//! `ready`, `terminating` to false; only an endpoint's first address is used; the Cluster
//! backends are the ready endpoints, or when none is ready the serving-and-terminating ones;
//! the Local backends the same among this node's endpoints; headless and ExternalName services
//! and those naming another proxy (`service.kubernetes.io/service-proxy-name`) are skipped;
//! sessionAffinity ClientIP defaults to 10800 s (at most 86400).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::messages::{IpSetMember, PortProtocol};

/// Services labelled with it belong to another proxy.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// The label that ties an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Slices of headless services carry it; a proxy ignores them.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// kube-apiserver's default and maximum for `sessionAffinityConfig.clientIP.timeoutSeconds`.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;
pub const MAX_AFFINITY_TIMEOUT: u32 = 86_400;
/// The API server's limits (a slice holds at most 1000 endpoints and 100 ports; a Service
/// at most as many ports as fit in an object): beyond them an object is refused whole, so a
/// hostile object cannot make the model grow without bound.
pub const MAX_SLICE_ENDPOINTS: usize = 1000;
pub const MAX_PORTS: usize = 100;
pub const MAX_ADDRESSES: usize = 64;

// ---- inputs: the Kubernetes objects, as the API sends them --------------------------------

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// A `core/v1` Service (the fields a proxy reads).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeService {
    #[serde(default)]
    pub metadata: KubeMeta,
    #[serde(default)]
    pub spec: KubeServiceSpec,
    #[serde(default)]
    pub status: KubeServiceStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeServiceSpec {
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    #[serde(default, rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    #[serde(default, rename = "clusterIPs")]
    pub cluster_ips: Vec<String>,
    #[serde(default)]
    pub ports: Vec<KubeServicePort>,
    #[serde(default, rename = "externalIPs")]
    pub external_ips: Vec<String>,
    #[serde(default)]
    pub external_traffic_policy: Option<String>,
    #[serde(default)]
    pub internal_traffic_policy: Option<String>,
    #[serde(default)]
    pub session_affinity: Option<String>,
    #[serde(default)]
    pub session_affinity_config: Option<KubeAffinityConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeAffinityConfig {
    #[serde(default, rename = "clientIP")]
    pub client_ip: Option<KubeClientIpConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeClientIpConfig {
    #[serde(default)]
    pub timeout_seconds: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeServicePort {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub protocol: Option<String>,
    pub port: i64,
    #[serde(default)]
    pub node_port: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeServiceStatus {
    #[serde(default)]
    pub load_balancer: KubeLoadBalancerStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeLoadBalancerStatus {
    #[serde(default)]
    pub ingress: Vec<KubeLbIngress>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeLbIngress {
    #[serde(default)]
    pub ip: Option<String>,
}

/// A `discovery.k8s.io/v1` EndpointSlice (the fields a proxy reads).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeEndpointSlice {
    #[serde(default)]
    pub metadata: KubeMeta,
    #[serde(default)]
    pub address_type: String,
    #[serde(default)]
    pub endpoints: Vec<KubeEndpoint>,
    #[serde(default)]
    pub ports: Vec<KubeEndpointPort>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeEndpoint {
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub conditions: KubeConditions,
    #[serde(default)]
    pub node_name: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct KubeConditions {
    #[serde(default)]
    pub ready: Option<bool>,
    #[serde(default)]
    pub serving: Option<bool>,
    #[serde(default)]
    pub terminating: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct KubeEndpointPort {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub port: Option<i64>,
}

// ---- outputs --------------------------------------------------------------------------

/// One port of one Service: what a proxy programs as a unit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ServicePortId {
    pub namespace: String,
    pub name: String,
    /// The port's name (empty for a single unnamed port).
    pub port_name: String,
    pub protocol: PortProtocol,
}

impl fmt::Display for ServicePortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.namespace, self.name, self.protocol, self.port_name
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum FrontendKind {
    ClusterIp,
    ExternalIp,
    LoadBalancer,
}

/// An address and port a client reaches the service at (NodePorts are separate: they are
/// every local address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Frontend {
    pub kind: FrontendKind,
    pub addr: IpAddr,
    pub port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Backend {
    pub addr: IpAddr,
    pub port: u16,
}

/// A service port as the dataplane programs it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ServicePort {
    /// Sorted.
    pub frontends: Vec<Frontend>,
    pub node_port: Option<u16>,
    /// Where traffic under the Cluster policy goes (sorted, distinct).
    pub cluster_backends: Vec<Backend>,
    /// This node's usable endpoints (sorted, distinct): the only ones for external traffic
    /// under externalTrafficPolicy Local and for ClusterIP traffic under
    /// internalTrafficPolicy Local.
    pub local_backends: Vec<Backend>,
    pub external_local: bool,
    pub internal_local: bool,
    /// sessionAffinity ClientIP, in seconds.
    pub affinity_timeout: Option<u32>,
}

impl ServicePort {
    /// Backends for ClusterIP traffic.
    pub fn internal_backends(&self) -> &[Backend] {
        if self.internal_local {
            &self.local_backends
        } else {
            &self.cluster_backends
        }
    }

    /// Backends for traffic from outside the cluster (NodePort, ExternalIP, LB IP).
    pub fn external_backends(&self) -> &[Backend] {
        if self.external_local {
            &self.local_backends
        } else {
            &self.cluster_backends
        }
    }
}

/// Why a Service or EndpointSlice cannot be used (the proxy treats it as absent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {field}: {message}")]
pub struct ServiceError {
    pub object: String,
    pub field: String,
    pub message: String,
}

fn err(object: &str, field: impl Into<String>, message: impl Into<String>) -> ServiceError {
    ServiceError {
        object: object.to_string(),
        field: field.into(),
        message: message.into(),
    }
}

fn protocol(s: Option<&str>) -> Option<PortProtocol> {
    match s.unwrap_or("TCP") {
        "TCP" => Some(PortProtocol::Tcp),
        "UDP" => Some(PortProtocol::Udp),
        "SCTP" => Some(PortProtocol::Sctp),
        _ => None,
    }
}

fn port_u16(p: i64) -> Option<u16> {
    u16::try_from(p).ok().filter(|p| *p != 0)
}

/// A Service checked and reduced to what the model needs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ServiceInfo {
    /// None: skipped (headless, ExternalName, another proxy's): programs nothing.
    ports: Option<Vec<PortInfo>>,
    cluster_ips: Vec<IpAddr>,
    external_ips: Vec<IpAddr>,
    lb_ips: Vec<IpAddr>,
    external_local: bool,
    internal_local: bool,
    affinity_timeout: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PortInfo {
    name: String,
    protocol: PortProtocol,
    port: u16,
    node_port: Option<u16>,
}

fn parse_ips(object: &str, field: &str, list: &[String]) -> Result<Vec<IpAddr>, ServiceError> {
    if list.len() > MAX_ADDRESSES {
        return Err(err(
            object,
            field,
            format!("{} addresses, at most {MAX_ADDRESSES}", list.len()),
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let ip: IpAddr = s.parse().map_err(|_| {
            err(
                object,
                format!("{field}[{i}]"),
                format!("{s:?} is not an IP address"),
            )
        })?;
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

impl ServiceInfo {
    fn of(svc: &KubeService) -> Result<ServiceInfo, ServiceError> {
        let object = format!("Service {}/{}", svc.metadata.namespace, svc.metadata.name);
        let spec = &svc.spec;
        let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
        let mut cluster_ips = spec.cluster_ips.clone();
        if cluster_ips.is_empty()
            && let Some(ip) = &spec.cluster_ip
        {
            cluster_ips.push(ip.clone());
        }
        let headless = cluster_ips.is_empty() || cluster_ips.iter().any(|ip| ip == "None");
        let skipped = headless
            || type_ == "ExternalName"
            || svc.metadata.labels.contains_key(LABEL_SERVICE_PROXY_NAME);
        if spec.ports.len() > MAX_PORTS {
            return Err(err(
                &object,
                "spec.ports",
                format!("{} ports, at most {MAX_PORTS}", spec.ports.len()),
            ));
        }
        let node_ports = matches!(type_, "NodePort" | "LoadBalancer");
        let mut ports = Vec::with_capacity(spec.ports.len());
        for (i, p) in spec.ports.iter().enumerate() {
            let field = format!("spec.ports[{i}]");
            let proto = protocol(p.protocol.as_deref()).ok_or_else(|| {
                err(
                    &object,
                    format!("{field}.protocol"),
                    format!(
                        "{:?} is not TCP, UDP or SCTP",
                        p.protocol.as_deref().unwrap_or("")
                    ),
                )
            })?;
            let port = port_u16(p.port).ok_or_else(|| {
                err(
                    &object,
                    format!("{field}.port"),
                    format!("{} is not a port (1-65535)", p.port),
                )
            })?;
            let node_port = match p.node_port {
                Some(n) if node_ports && n != 0 => Some(port_u16(n).ok_or_else(|| {
                    err(
                        &object,
                        format!("{field}.nodePort"),
                        format!("{n} is not a port (1-65535)"),
                    )
                })?),
                _ => None,
            };
            if ports
                .iter()
                .any(|q: &PortInfo| q.name == p.name && q.protocol == proto)
            {
                return Err(err(
                    &object,
                    field,
                    format!("duplicate port name {:?}", p.name),
                ));
            }
            ports.push(PortInfo {
                name: p.name.clone(),
                protocol: proto,
                port,
                node_port,
            });
        }
        let affinity_timeout = match spec.session_affinity.as_deref() {
            Some("ClientIP") => {
                let t = spec
                    .session_affinity_config
                    .as_ref()
                    .and_then(|c| c.client_ip.as_ref())
                    .and_then(|c| c.timeout_seconds)
                    .unwrap_or(i64::from(DEFAULT_AFFINITY_TIMEOUT));
                if !(1..=i64::from(MAX_AFFINITY_TIMEOUT)).contains(&t) {
                    return Err(err(
                        &object,
                        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                        format!("{t} is not between 1 and {MAX_AFFINITY_TIMEOUT}"),
                    ));
                }
                u32::try_from(t).ok()
            }
            _ => None,
        };
        let lb: Vec<String> = if type_ == "LoadBalancer" {
            svc.status
                .load_balancer
                .ingress
                .iter()
                .filter_map(|i| i.ip.clone())
                .collect()
        } else {
            Vec::new()
        };
        Ok(ServiceInfo {
            ports: (!skipped).then_some(ports),
            cluster_ips: if skipped {
                Vec::new()
            } else {
                parse_ips(&object, "spec.clusterIPs", &cluster_ips)?
            },
            external_ips: parse_ips(&object, "spec.externalIPs", &spec.external_ips)?,
            lb_ips: parse_ips(&object, "status.loadBalancer.ingress", &lb)?,
            external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
            internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
            affinity_timeout,
        })
    }
}

/// One endpoint of a slice, conditions resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
struct EndpointInfo {
    addr: IpAddr,
    ready: bool,
    serving: bool,
    terminating: bool,
    local: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct SliceInfo {
    service: String,
    endpoints: Vec<EndpointInfo>,
    /// (name, protocol) → port number.
    ports: Vec<(String, PortProtocol, u16)>,
}

impl SliceInfo {
    /// `None` when the slice is none of a proxy's business (no service label, headless, FQDN).
    fn of(slice: &KubeEndpointSlice, hostname: &str) -> Result<Option<SliceInfo>, ServiceError> {
        let object = format!(
            "EndpointSlice {}/{}",
            slice.metadata.namespace, slice.metadata.name
        );
        let Some(service) = slice.metadata.labels.get(LABEL_SERVICE_NAME) else {
            return Ok(None);
        };
        if slice.metadata.labels.contains_key(LABEL_HEADLESS)
            || !matches!(slice.address_type.as_str(), "IPv4" | "IPv6")
        {
            return Ok(None);
        }
        if slice.endpoints.len() > MAX_SLICE_ENDPOINTS {
            return Err(err(
                &object,
                "endpoints",
                format!(
                    "{} endpoints, at most {MAX_SLICE_ENDPOINTS}",
                    slice.endpoints.len()
                ),
            ));
        }
        if slice.ports.len() > MAX_PORTS {
            return Err(err(
                &object,
                "ports",
                format!("{} ports, at most {MAX_PORTS}", slice.ports.len()),
            ));
        }
        let mut ports = Vec::with_capacity(slice.ports.len());
        for (i, p) in slice.ports.iter().enumerate() {
            // A port without a number or with an unknown protocol carries no traffic.
            let (Some(proto), Some(num)) =
                (protocol(p.protocol.as_deref()), p.port.and_then(port_u16))
            else {
                tracing::debug!(%object, port = i, "slice port without a usable number or protocol");
                continue;
            };
            ports.push((p.name.clone().unwrap_or_default(), proto, num));
        }
        let mut endpoints = Vec::with_capacity(slice.endpoints.len());
        for (i, e) in slice.endpoints.iter().enumerate() {
            // kube-proxy uses an endpoint's first address only.
            let Some(first) = e.addresses.first() else {
                continue;
            };
            let addr: IpAddr = first.parse().map_err(|_| {
                err(
                    &object,
                    format!("endpoints[{i}].addresses[0]"),
                    format!("{first:?} is not an IP address"),
                )
            })?;
            let ready = e.conditions.ready.unwrap_or(true);
            endpoints.push(EndpointInfo {
                addr,
                ready,
                serving: e.conditions.serving.unwrap_or(ready),
                terminating: e.conditions.terminating.unwrap_or(false),
                local: e.node_name.as_deref() == Some(hostname),
            });
        }
        Ok(Some(SliceInfo {
            service: service.clone(),
            endpoints,
            ports,
        }))
    }
}

/// kube-proxy's choice: ready endpoints, else serving-and-terminating ones.
fn usable<'a>(eps: impl Iterator<Item = (&'a EndpointInfo, u16)> + Clone) -> Vec<Backend> {
    let ready: BTreeSet<Backend> = eps
        .clone()
        .filter(|(e, _)| e.ready)
        .map(|(e, port)| Backend { addr: e.addr, port })
        .collect();
    let chosen = if ready.is_empty() {
        eps.filter(|(e, _)| e.serving && e.terminating)
            .map(|(e, port)| Backend { addr: e.addr, port })
            .collect()
    } else {
        ready
    };
    chosen.into_iter().collect()
}

fn service_ports(
    namespace: &str,
    name: &str,
    svc: &ServiceInfo,
    slices: &[&SliceInfo],
) -> BTreeMap<ServicePortId, ServicePort> {
    let mut out = BTreeMap::new();
    let Some(ports) = &svc.ports else {
        return out;
    };
    for p in ports {
        // The slice port of the same name and protocol carries the resolved target port
        // (named target ports differ per pod, hence per slice).
        let eps = slices.iter().flat_map(|s| {
            s.ports
                .iter()
                .find(|(n, proto, _)| *n == p.name && *proto == p.protocol)
                .map(|(_, _, num)| *num)
                .into_iter()
                .flat_map(move |num| s.endpoints.iter().map(move |e| (e, num)))
        });
        let mut frontends: Vec<Frontend> = svc
            .cluster_ips
            .iter()
            .map(|a| (FrontendKind::ClusterIp, a))
            .chain(
                svc.external_ips
                    .iter()
                    .map(|a| (FrontendKind::ExternalIp, a)),
            )
            .chain(svc.lb_ips.iter().map(|a| (FrontendKind::LoadBalancer, a)))
            .map(|(kind, addr)| Frontend {
                kind,
                addr: *addr,
                port: p.port,
            })
            .collect();
        frontends.sort();
        frontends.dedup();
        out.insert(
            ServicePortId {
                namespace: namespace.to_string(),
                name: name.to_string(),
                port_name: p.name.clone(),
                protocol: p.protocol,
            },
            ServicePort {
                frontends,
                node_port: p.node_port,
                cluster_backends: usable(eps.clone()),
                local_backends: usable(eps.filter(|(e, _)| e.local)),
                external_local: svc.external_local,
                internal_local: svc.internal_local,
                affinity_timeout: svc.affinity_timeout,
            },
        );
    }
    out
}

/// Services and EndpointSlices, and what the dataplane was last told about them.
#[derive(Debug, Default)]
pub struct ServiceIndex {
    hostname: String,
    services: BTreeMap<(String, String), ServiceInfo>,
    /// (namespace, slice name) → slice.
    slices: BTreeMap<(String, String), SliceInfo>,
    /// (namespace, service) → its slices' names.
    slices_by_service: BTreeMap<(String, String), BTreeSet<String>>,
    dirty: BTreeSet<(String, String)>,
    sent: BTreeMap<(String, String), BTreeMap<ServicePortId, Arc<ServicePort>>>,
}

/// A change for the dataplane.
#[derive(Debug, Clone, PartialEq)]
pub enum ServiceChange {
    Update(ServicePortId, Arc<ServicePort>),
    Remove(ServicePortId),
}

impl ServiceIndex {
    pub fn new(hostname: &str) -> ServiceIndex {
        ServiceIndex {
            hostname: hostname.to_string(),
            ..ServiceIndex::default()
        }
    }

    /// A Service created, changed (`Some`) or deleted (`None`). An unusable one counts as
    /// deleted; the error says why.
    pub fn on_service(
        &mut self,
        namespace: &str,
        name: &str,
        svc: Option<&KubeService>,
    ) -> Result<(), ServiceError> {
        let key = (namespace.to_string(), name.to_string());
        let parsed = svc.map(ServiceInfo::of).transpose();
        let info = parsed.as_ref().ok().cloned().flatten();
        let changed = match info {
            Some(i) => self.services.insert(key.clone(), i.clone()) != Some(i),
            None => self.services.remove(&key).is_some(),
        };
        if changed {
            self.dirty.insert(key);
        }
        parsed.map(drop)
    }

    /// An EndpointSlice created, changed or deleted. Returns the services whose endpoints
    /// changed (for their IP sets).
    pub fn on_endpoint_slice(
        &mut self,
        namespace: &str,
        name: &str,
        slice: Option<&KubeEndpointSlice>,
    ) -> Result<Vec<(String, String)>, ServiceError> {
        let key = (namespace.to_string(), name.to_string());
        let parsed = match slice {
            Some(s) => SliceInfo::of(s, &self.hostname),
            None => Ok(None),
        };
        let info = parsed.as_ref().ok().cloned().flatten();
        let mut touched = Vec::new();
        let old = self.slices.remove(&key);
        if let Some(old) = &old {
            let svc = (namespace.to_string(), old.service.clone());
            if let Some(set) = self.slices_by_service.get_mut(&svc) {
                set.remove(name);
                if set.is_empty() {
                    self.slices_by_service.remove(&svc);
                }
            }
            touched.push(svc);
        }
        if let Some(new) = info {
            let svc = (namespace.to_string(), new.service.clone());
            self.slices_by_service
                .entry(svc.clone())
                .or_default()
                .insert(name.to_string());
            if old.as_ref() == Some(&new) {
                touched.clear();
            } else if !touched.contains(&svc) {
                touched.push(svc);
            }
            self.slices.insert(key, new);
        }
        self.dirty.extend(touched.iter().cloned());
        parsed.map(|_| touched)
    }

    fn slices_of(&self, namespace: &str, name: &str) -> Vec<&SliceInfo> {
        self.slices_by_service
            .get(&(namespace.to_string(), name.to_string()))
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.get(&(namespace.to_string(), s.clone())))
            .collect()
    }

    /// The ports of one service as the dataplane should have them.
    pub fn ports_of(&self, namespace: &str, name: &str) -> BTreeMap<ServicePortId, ServicePort> {
        match self
            .services
            .get(&(namespace.to_string(), name.to_string()))
        {
            Some(svc) => service_ports(namespace, name, svc, &self.slices_of(namespace, name)),
            None => BTreeMap::new(),
        }
    }

    /// Calico's `destination.services` set: every serving endpoint address with each of its
    /// slice's ports. (Endpoints come from the slices alone, so a selector-less Service with
    /// hand-made slices works too; a Service that does not exist has none.)
    pub fn ip_set_members(&self, namespace: &str, name: &str) -> BTreeSet<IpSetMember> {
        if !self
            .services
            .contains_key(&(namespace.to_string(), name.to_string()))
        {
            return BTreeSet::new();
        }
        let mut out = BTreeSet::new();
        for s in self.slices_of(namespace, name) {
            for e in s.endpoints.iter().filter(|e| e.ready || e.serving) {
                for (_, protocol, port) in &s.ports {
                    out.insert(IpSetMember::IpPort {
                        ip: e.addr,
                        protocol: *protocol,
                        port: *port,
                    });
                }
            }
        }
        out
    }

    /// Whether anything awaits [`ServiceIndex::flush`].
    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    pub fn num_services(&self) -> usize {
        self.services.len()
    }

    /// What changed since the last flush, per service port; unchanged ports emit nothing.
    pub fn flush(&mut self, out: &mut Vec<ServiceChange>) {
        for key in std::mem::take(&mut self.dirty) {
            let desired = self.ports_of(&key.0, &key.1);
            let sent = self.sent.remove(&key).unwrap_or_default();
            let mut now = BTreeMap::new();
            for (id, old) in &sent {
                if !desired.contains_key(id) {
                    out.push(ServiceChange::Remove(id.clone()));
                } else {
                    now.insert(id.clone(), old.clone());
                }
            }
            for (id, port) in desired {
                if sent.get(&id).map(|p| **p != port).unwrap_or(true) {
                    let port = Arc::new(port);
                    out.push(ServiceChange::Update(id.clone(), port.clone()));
                    now.insert(id, port);
                }
            }
            if !now.is_empty() {
                self.sent.insert(key, now);
            }
        }
    }
}

#[cfg(test)]
mod tests;
