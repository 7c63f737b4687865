//! Policy resources: NetworkPolicy, GlobalNetworkPolicy, Tier, Profile, NetworkSet,
//! GlobalNetworkSet, and the rule model they share.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::meta::Condition;
use crate::numorstring::{Port, Protocol, serialize_opt_f64};

/// What a rule does with a packet it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Action {
    Allow,
    Deny,
    Log,
    Pass,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PolicyType {
    Ingress,
    Egress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PerformanceHint {
    AssumeNeededOnEveryNode,
}

/// One ingress or egress rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    pub action: Action,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_version: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp: Option<IcmpFields>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_protocol: Option<Protocol>,
    #[serde(default, rename = "notICMP", skip_serializing_if = "Option::is_none")]
    pub not_icmp: Option<IcmpFields>,
    #[serde(default, skip_serializing_if = "EntityRule::is_empty")]
    pub source: EntityRule,
    #[serde(default, skip_serializing_if = "EntityRule::is_empty")]
    pub destination: EntityRule,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RuleMetadata>,
}

impl Rule {
    pub fn new(action: Action) -> Rule {
        Rule {
            action,
            ip_version: None,
            protocol: None,
            icmp: None,
            not_protocol: None,
            not_icmp: None,
            source: EntityRule::default(),
            destination: EntityRule::default(),
            http: None,
            metadata: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IcmpFields {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i64>,
}

/// The source or destination half of a rule. All set fields must match (AND).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EntityRule {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nets: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace_selector: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<ServiceMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_nets: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub not_selector: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_ports: Vec<Port>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_accounts: Option<ServiceAccountMatch>,
}

impl EntityRule {
    pub fn is_empty(&self) -> bool {
        self == &EntityRule::default()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceMatch {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceAccountMatch {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpMatch {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<HttpPath>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpPath {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub exact: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleMetadata {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicySpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tier: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_opt_f64"
    )]
    pub order: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<Rule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<Rule>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<PolicyType>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_account_selector: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub performance_hints: Vec<PerformanceHint>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GlobalNetworkPolicySpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tier: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_opt_f64"
    )]
    pub order: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<Rule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<Rule>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<PolicyType>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub do_not_track: bool,
    #[serde(
        default,
        rename = "preDNAT",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub pre_dnat: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub apply_on_forward: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_account_selector: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace_selector: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub performance_hints: Vec<PerformanceHint>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TierSpec {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_opt_f64"
    )]
    pub order: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_action: Option<Action>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TierStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<Rule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<Rule>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels_to_apply: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkSetSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nets: Vec<String>,
}

/// Tier names Calico creates and protects.
pub const DEFAULT_TIER: &str = "default";
pub const KUBE_ADMIN_TIER: &str = "kube-admin";
pub const KUBE_BASELINE_TIER: &str = "kube-baseline";
pub const DEFAULT_TIER_ORDER: f64 = 1_000_000.0;
pub const KUBE_ADMIN_TIER_ORDER: f64 = 1_000.0;
pub const KUBE_BASELINE_TIER_ORDER: f64 = 10_000_000.0;
