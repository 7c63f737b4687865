//! Address management resources: IPPool, IPReservation, IPAMConfiguration, and the
//! cluster-wide ClusterInformation.

use serde::{Deserialize, Serialize};

use crate::meta::Condition;

/// When to encapsulate traffic between nodes for a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum EncapMode {
    #[default]
    Never,
    Always,
    CrossSubnet,
}

impl EncapMode {
    pub fn is_enabled(self) -> bool {
        self != EncapMode::Never
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AllowedUse {
    Workload,
    Tunnel,
    LoadBalancer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AssignmentMode {
    Automatic,
    Manual,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IPPoolSpec {
    #[serde(default)]
    pub cidr: String,
    #[serde(default, rename = "vxlanMode", skip_serializing_if = "Option::is_none")]
    pub vxlan_mode: Option<EncapMode>,
    #[serde(default, rename = "ipipMode", skip_serializing_if = "Option::is_none")]
    pub ipip_mode: Option<EncapMode>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nat_outgoing: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
    #[serde(
        default,
        rename = "disableBGPExport",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub disable_bgp_export: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<i64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_selector: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace_selector: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_uses: Vec<AllowedUse>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment_mode: Option<AssignmentMode>,
}

impl IPPoolSpec {
    pub const DEFAULT_BLOCK_SIZE_V4: u8 = 26;
    pub const DEFAULT_BLOCK_SIZE_V6: u8 = 122;

    pub fn vxlan(&self) -> EncapMode {
        self.vxlan_mode.unwrap_or_default()
    }

    pub fn ipip(&self) -> EncapMode {
        self.ipip_mode.unwrap_or_default()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IPPoolStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IPReservationSpec {
    #[serde(
        default,
        rename = "reservedCIDRs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub reserved_cidrs: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum VmAddressPersistence {
    Enabled,
    Disabled,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IPAMConfigurationSpec {
    #[serde(default)]
    pub strict_affinity: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_blocks_per_host: Option<i64>,
    #[serde(default = "default_true")]
    pub auto_allocate_blocks: bool,
    #[serde(
        default,
        rename = "kubeVirtVMAddressPersistence",
        skip_serializing_if = "Option::is_none"
    )]
    pub kube_virt_vm_address_persistence: Option<VmAddressPersistence>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_cooldown_seconds: Option<i64>,
}

impl Default for IPAMConfigurationSpec {
    fn default() -> Self {
        IPAMConfigurationSpec {
            strict_affinity: false,
            max_blocks_per_host: None,
            auto_allocate_blocks: true,
            kube_virt_vm_address_persistence: None,
            ip_cooldown_seconds: None,
        }
    }
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterInformationSpec {
    #[serde(
        default,
        rename = "clusterGUID",
        skip_serializing_if = "String::is_empty"
    )]
    pub cluster_guid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub calico_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datastore_ready: Option<bool>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub variant: String,
}
