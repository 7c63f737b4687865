//! Who the workload is and what margay records about it (pure): the identifiers Calico
//! derives from the CNI call, the host-side interface name, the IPAM handle and attributes,
//! and the WorkloadEndpoint.

use std::collections::BTreeMap;
use std::net::IpAddr;

use margay_api::endpoint::WorkloadEndpointSpec;
use margay_api::policy::{Action, ProfileSpec, Rule};
use margay_api::{ObjectMeta, Profile, WorkloadEndpoint};

use crate::config::{CmdArgs, WorkloadArgs};
use crate::spec::{CniError, code};

/// The host side's MAC (Calico's): every pod sees the same gateway MAC.
pub const HOST_MAC: [u8; 6] = [0xee; 6];
/// The IPv4 next hop pods route through (answered by proxy ARP on the host side).
pub const GATEWAY_V4: std::net::Ipv4Addr = std::net::Ipv4Addr::new(169, 254, 1, 1);

pub const LABEL_NAMESPACE: &str = "projectcalico.org/namespace";
pub const LABEL_ORCHESTRATOR: &str = "projectcalico.org/orchestrator";
pub const LABEL_SERVICE_ACCOUNT: &str = "projectcalico.org/serviceaccount";

pub fn mac_string(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The identifiers of one workload interface (Calico's `WEPIdentifiers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `k8s` when the pod name and namespace were given, else `cni`.
    pub orchestrator: String,
    pub namespace: String,
    pub pod: String,
    pub container_id: String,
    pub node: String,
    /// The container-side interface (CNI_IFNAME).
    pub endpoint: String,
    /// The network's name (the config's `name`).
    pub network: String,
    /// The host-side interface prefix of Kubernetes pods (FELIX_INTERFACEPREFIX's first item).
    pub interface_prefix: String,
}

impl Identity {
    pub fn new(args: &CmdArgs, w: &WorkloadArgs, node: &str, network: &str) -> Identity {
        let k8s = w.is_k8s();
        Identity {
            orchestrator: if k8s { "k8s" } else { "cni" }.to_string(),
            namespace: if k8s {
                w.pod_namespace.clone()
            } else {
                "default".to_string()
            },
            pod: if k8s {
                w.pod_name.clone()
            } else {
                String::new()
            },
            container_id: args.container_id.clone(),
            node: node.to_string(),
            endpoint: args.ifname.clone(),
            network: network.to_string(),
            interface_prefix: "cali".to_string(),
        }
    }

    /// With the host-side interface prefix the Kubernetes datastore and Felix use.
    pub fn with_interface_prefix(mut self, prefix: &str) -> Identity {
        if !prefix.is_empty() {
            self.interface_prefix = prefix.to_string();
        }
        self
    }

    pub fn is_k8s(&self) -> bool {
        self.orchestrator == "k8s"
    }

    /// The host-side interface: the interface prefix (`cali`) + the first 11 hex digits of
    /// SHA-1("<ns>.<pod>") for Kubernetes pods (the name the Kubernetes datastore derives from
    /// the pod), else `cali` + the first 11 characters of the container ID.
    pub fn host_veth_name(&self) -> String {
        if self.is_k8s() {
            margay_kdd::names::k8s_interface_name(
                &self.interface_prefix,
                &self.namespace,
                &self.pod,
            )
        } else {
            let id: String = self.container_id.chars().take(11).collect();
            format!("cali{id}")
        }
    }

    /// The IPAM handle of this container's addresses: `<network>.<containerID>`.
    pub fn handle(&self) -> String {
        margay_ipam::workload_handle(&self.network, &self.container_id)
    }

    /// The handle Calico v2.x used (`<namespace>.<pod>` or the container ID); DEL releases it
    /// too, as Calico does, so upgraded clusters leak nothing.
    pub fn legacy_handle(&self) -> String {
        if self.is_k8s() {
            format!("{}.{}", self.namespace, self.pod)
        } else {
            self.container_id.clone()
        }
    }

    /// Attributes stored with each allocation (Calico's `node`, `namespace`, `pod`,
    /// `timestamp`).
    pub fn ipam_attrs(&self, timestamp: &str) -> BTreeMap<String, String> {
        let mut a = BTreeMap::from([
            ("node".to_string(), self.node.clone()),
            ("timestamp".to_string(), timestamp.to_string()),
        ]);
        if self.is_k8s() {
            a.insert("namespace".into(), self.namespace.clone());
            a.insert("pod".into(), self.pod.clone());
        }
        a
    }

    fn spec_skeleton(&self) -> WorkloadEndpointSpec {
        WorkloadEndpointSpec {
            orchestrator: self.orchestrator.clone(),
            node: self.node.clone(),
            pod: self.pod.clone(),
            container_id: self.container_id.clone(),
            endpoint: self.endpoint.clone(),
            workload: if self.is_k8s() {
                String::new()
            } else {
                self.container_id.clone()
            },
            ..WorkloadEndpointSpec::default()
        }
    }

    /// The WorkloadEndpoint's name (`<node>-<orchestrator>-<pod|containerID>-<endpoint>`).
    pub fn endpoint_name(&self) -> Result<String, CniError> {
        self.spec_skeleton()
            .expected_name()
            .map_err(|(field, why)| {
                CniError::new(
                    code::INVALID_ENV,
                    format!("cannot name the WorkloadEndpoint: {field}: {why}"),
                )
            })
    }

    /// The WorkloadEndpoint for this interface. `from_pod` is the endpoint the Kubernetes
    /// datastore derives from the pod (when the plugin read it from the API): its labels,
    /// profiles, ports, service account, generateName and allowed source prefixes are
    /// Calico's, as its plugin takes them; without it they come from `w` (`args.cni`).
    pub fn endpoint(
        &self,
        w: &WorkloadArgs,
        from_pod: Option<&WorkloadEndpoint>,
        host_veth: &str,
        container_mac: &str,
        ips: &[IpAddr],
    ) -> Result<WorkloadEndpoint, CniError> {
        let name = self.endpoint_name()?;
        let mut labels = w.labels.clone();
        labels.insert(LABEL_NAMESPACE.into(), self.namespace.clone());
        labels.insert(LABEL_ORCHESTRATOR.into(), self.orchestrator.clone());
        let mut profiles = Vec::new();
        if self.is_k8s() {
            profiles.push(format!("kns.{}", self.namespace));
            if !w.service_account.is_empty() {
                labels.insert(LABEL_SERVICE_ACCOUNT.into(), w.service_account.clone());
                profiles.push(format!("ksa.{}.{}", self.namespace, w.service_account));
            }
        } else {
            profiles.push(self.network.clone());
        }
        let mut spec = self.spec_skeleton();
        let mut generate_name = String::new();
        let mut service_account = w.service_account.clone();
        if let Some(p) = from_pod {
            labels = p.metadata.labels.clone();
            profiles = p.spec.profiles.clone();
            spec.ports = p.spec.ports.clone();
            spec.allow_spoofed_source_prefixes = p.spec.allow_spoofed_source_prefixes.clone();
            service_account = p.spec.service_account_name.clone();
            generate_name = p.metadata.generate_name.clone();
        }
        spec.interface_name = host_veth.to_string();
        spec.mac = container_mac.to_string();
        spec.ip_networks = ips
            .iter()
            .map(|ip| match ip {
                IpAddr::V4(a) => format!("{a}/32"),
                IpAddr::V6(a) => format!("{a}/128"),
            })
            .collect();
        spec.profiles = profiles;
        spec.service_account_name = service_account;
        let meta = ObjectMeta {
            name,
            namespace: self.namespace.clone(),
            labels,
            generate_name,
            ..ObjectMeta::default()
        };
        Ok(WorkloadEndpoint::new(meta, spec))
    }
}

/// The profile Calico's plugin creates for a network when it is missing (and the config names
/// no policy handler): named after the network, egress allowed, and ingress allowed from
/// everything for Kubernetes (its pods' policy comes from elsewhere) or, for any other
/// orchestrator, only from endpoints carrying the network's label, which the profile applies
/// to its own endpoints: workloads on one network reach each other, nothing else reaches them.
pub fn network_profile(network: &str, k8s: bool) -> Profile {
    let ingress = if k8s {
        Rule::new(Action::Allow)
    } else {
        let mut r = Rule::new(Action::Allow);
        r.source.selector = format!("has({network})");
        r
    };
    Profile::new(
        ObjectMeta {
            name: network.to_string(),
            ..ObjectMeta::default()
        },
        ProfileSpec {
            ingress: vec![ingress],
            egress: vec![Rule::new(Action::Allow)],
            labels_to_apply: BTreeMap::from([(network.to_string(), String::new())]),
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use sha1::{Digest, Sha1};

    fn ident(k8s: bool) -> Identity {
        let args = CmdArgs {
            container_id: "0123456789abcdef".into(),
            ifname: "eth0".into(),
            ..CmdArgs::default()
        };
        let w = if k8s {
            WorkloadArgs {
                pod_name: "web-0".into(),
                pod_namespace: "default".into(),
                ..WorkloadArgs::default()
            }
        } else {
            WorkloadArgs::default()
        };
        Identity::new(&args, &w, "node-1", "k8s-pod-network")
    }

    #[test]
    fn host_side_names_are_calicos() {
        // SHA-1("default.web-0") = 5c1b32f3f4ea…; Calico takes the first 11 hex digits.
        let hex: String = Sha1::digest(b"default.web-0")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let k = ident(true);
        assert_eq!(k.host_veth_name(), format!("cali{}", &hex[..11]));
        assert_eq!(k.host_veth_name().len(), 15);
        assert_eq!(ident(false).host_veth_name(), "cali0123456789a");
        // A known vector, so the digest itself is checked too.
        let abc: String = Sha1::digest(b"abc")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(abc, "a9993e364706816aba3e25717850c26c9cd0d89d");
    }

    #[test]
    fn the_interface_prefix_is_felixs_and_names_match_the_datastores() {
        let k = ident(true).with_interface_prefix("tap");
        assert_eq!(
            k.host_veth_name(),
            margay_kdd::names::k8s_interface_name("tap", "default", "web-0")
        );
        assert!(k.host_veth_name().starts_with("tap"));
        // Non-Kubernetes workloads keep Calico's cali + container ID.
        assert_eq!(
            ident(false).with_interface_prefix("tap").host_veth_name(),
            "cali0123456789a"
        );
        // The endpoint name is the one the Kubernetes datastore derives from the pod.
        let derived =
            margay_kdd::names::workload_endpoint_name("node-1", "k8s", "web-0", "eth0").unwrap();
        assert_eq!(ident(true).endpoint_name().unwrap(), derived);
    }

    #[test]
    fn endpoints_from_the_pod_take_its_labels_ports_and_service_account() {
        let k = ident(true);
        let pod = serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "default", "generateName": "web-",
                         "labels": {"app": "web"},
                         "annotations": {"cni.projectcalico.org/allowedSourcePrefixes": "[\"10.9.0.0/16\"]"}},
            "spec": {"nodeName": "node-1", "serviceAccountName": "sa9",
                     "containers": [{"ports": [{"name": "http", "containerPort": 80}]}]}
        });
        let Some(margay_api::Resource::WorkloadEndpoint(derived)) =
            margay_kdd::pod::pod_to_workload_endpoint(&pod, "cali").unwrap()
        else {
            panic!("no endpoint")
        };
        // args.cni says otherwise: the pod wins.
        let w = WorkloadArgs {
            pod_name: "web-0".into(),
            pod_namespace: "default".into(),
            service_account: "other".into(),
            labels: BTreeMap::from([("app".to_string(), "not-web".to_string())]),
            ..WorkloadArgs::default()
        };
        let ips: Vec<IpAddr> = vec!["10.0.0.5".parse().unwrap()];
        let wep = k
            .endpoint(
                &w,
                Some(&derived),
                &k.host_veth_name(),
                "aa:bb:cc:dd:ee:ff",
                &ips,
            )
            .unwrap();
        assert_eq!(wep.metadata.labels["app"], "web");
        assert_eq!(wep.metadata.labels[LABEL_SERVICE_ACCOUNT], "sa9");
        assert_eq!(wep.metadata.generate_name, "web-");
        assert_eq!(wep.spec.service_account_name, "sa9");
        assert_eq!(wep.spec.profiles, vec!["kns.default", "ksa.default.sa9"]);
        assert_eq!(wep.spec.ports.len(), 1);
        assert_eq!(wep.spec.allow_spoofed_source_prefixes, vec!["10.9.0.0/16"]);
        assert_eq!(wep.spec.ip_networks, vec!["10.0.0.5/32"]);
        assert_eq!(wep.metadata.name, derived.metadata.name);
        assert_eq!(wep.spec.interface_name, derived.spec.interface_name);
        margay_api::Resource::WorkloadEndpoint(wep)
            .validate()
            .unwrap();
    }

    #[test]
    fn handles_and_names() {
        let k = ident(true);
        assert_eq!(k.handle(), "k8s-pod-network.0123456789abcdef");
        assert_eq!(k.legacy_handle(), "default.web-0");
        assert_eq!(k.endpoint_name().unwrap(), "node--1-k8s-web--0-eth0");
        let c = ident(false);
        assert_eq!(c.legacy_handle(), "0123456789abcdef");
        assert_eq!(
            c.endpoint_name().unwrap(),
            "node--1-cni-0123456789abcdef-eth0"
        );
    }

    #[test]
    fn endpoints_carry_calicos_labels_and_profiles_and_validate() {
        let k = ident(true);
        let w = WorkloadArgs {
            pod_name: "web-0".into(),
            pod_namespace: "default".into(),
            service_account: "sa1".into(),
            labels: BTreeMap::from([("app".to_string(), "web".to_string())]),
            ..WorkloadArgs::default()
        };
        let ips: Vec<IpAddr> = vec!["10.0.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
        let wep = k
            .endpoint(&w, None, &k.host_veth_name(), "aa:bb:cc:dd:ee:ff", &ips)
            .unwrap();
        assert_eq!(wep.metadata.namespace, "default");
        assert_eq!(wep.metadata.labels[LABEL_ORCHESTRATOR], "k8s");
        assert_eq!(wep.metadata.labels[LABEL_NAMESPACE], "default");
        assert_eq!(wep.metadata.labels["app"], "web");
        assert_eq!(wep.spec.profiles, vec!["kns.default", "ksa.default.sa1"]);
        assert_eq!(wep.spec.ip_networks, vec!["10.0.0.5/32", "fd00::5/128"]);
        assert_eq!(wep.spec.endpoint, "eth0");
        let r = margay_api::Resource::WorkloadEndpoint(wep);
        r.validate().unwrap();
        let attrs = k.ipam_attrs("now");
        assert_eq!(attrs["pod"], "web-0");
        assert_eq!(attrs["node"], "node-1");
    }

    #[test]
    fn network_profiles_are_calicos() {
        let p = network_profile("margaynet", false);
        assert_eq!(p.metadata.name, "margaynet");
        assert_eq!(p.spec.egress, vec![Rule::new(Action::Allow)]);
        assert_eq!(p.spec.ingress.len(), 1);
        assert_eq!(p.spec.ingress[0].action, Action::Allow);
        assert_eq!(p.spec.ingress[0].source.selector, "has(margaynet)");
        assert_eq!(
            p.spec.labels_to_apply,
            BTreeMap::from([("margaynet".to_string(), String::new())])
        );
        let r = margay_api::Resource::Profile(p);
        assert!(r.validate().is_ok(), "{:?}", r.validate());
        let k = network_profile("k8s-pod-network", true);
        assert_eq!(k.spec.ingress, vec![Rule::new(Action::Allow)]);
    }
}
