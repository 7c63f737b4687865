//! KubeControllersConfiguration: settings of the Kubernetes controllers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::bgp::EnabledDisabled;
use crate::duration::Duration;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeControllersConfigurationSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub log_severity_screen: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_checks: Option<EnabledDisabled>,
    #[serde(
        default,
        rename = "etcdV3CompactionPeriod",
        skip_serializing_if = "Option::is_none"
    )]
    pub etcd_v3_compaction_period: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus_metrics_port: Option<i64>,
    #[serde(default)]
    pub controllers: ControllersConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debug_profile_port: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControllersConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeControllerConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<ReconcilerConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_endpoint: Option<ReconcilerConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<ReconcilerConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<ReconcilerConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerControllerConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationControllerConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeControllerConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciler_period: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_labels: Option<EnabledDisabled>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_endpoint: Option<AutoHostEndpointConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leak_grace_period: Option<Duration>,
}

/// The policy, workloadEndpoint, serviceAccount and namespace controllers take only a period.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReconcilerConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciler_period: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AutoHostEndpointConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_create: Option<EnabledDisabled>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_default_host_endpoint: Option<EnabledDisabled>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub templates: Vec<HostEndpointTemplate>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostEndpointTemplate {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub generate_name: String,
    #[serde(
        default,
        rename = "interfaceCIDRs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub interface_cidrs: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub interface_pattern: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_selector: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AssignIps {
    AllServices,
    RequestedServicesOnly,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancerControllerConfig {
    #[serde(default, rename = "assignIPs", skip_serializing_if = "Option::is_none")]
    pub assign_ips: Option<AssignIps>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigrationControllerConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_name_migrator: Option<EnabledDisabled>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeControllersConfigurationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_config: Option<KubeControllersConfigurationSpec>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub environment_vars: BTreeMap<String, String>,
}

impl KubeControllersConfigurationStatus {
    pub fn is_empty(&self) -> bool {
        self == &KubeControllersConfigurationStatus::default()
    }
}
