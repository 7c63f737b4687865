//! IPAM data: margay's IPAM keeps Calico's etcd JSON (`/calico/ipam/v2/...`, see
//! `crates/ipam/src/block.rs`); in the Kubernetes datastore the same data lives in the
//! IPAMBlock, BlockAffinity, IPAMHandle and IPAMConfig custom resources. These functions
//! convert between the two, as Calico's IPAM clients do (`lk8s/resources/ipam_block.go`,
//! `ipam_affinity_v1.go`, `ipam_handle.go`, `ipam_config_v1.go`).
//!
//! Calico deletes these objects in two steps, because the Kubernetes API has no
//! compare-and-delete: an update marking the object `deleted` at the revision read, then a
//! DELETE with a uid precondition. A reader that finds an object marked deleted treats it as
//! absent (and may finish the delete): the `cr_to_*` functions return None for it.
//!
//! Every body written carries the `projectcalico.org/metadata` annotation Calico's IPAM
//! writes (`{"creationTimestamp":null}`, plus the labels of a BlockAffinity). An update (PUT)
//! needs the revision read: [`crate::crd::set_resource_version`].

use std::collections::BTreeMap;

use margay_api::net::Cidr;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::json::{decode, null_as_default, value_label};
use crate::meta::{METADATA_ANNOTATION, bare_metadata_annotation};
use crate::names::{block_affinity_name, cidr_name, hostname_hash};
use crate::{CRD_API_VERSION, KddError, Result};

/// BlockAffinity labels, so that one host's (and one IP version's) can be listed.
pub const LABEL_HOSTNAME_HASH: &str = "projectcalico.org/hostname-hash";
pub const LABEL_AFFINITY_TYPE: &str = "projectcalico.org/affinity-type";
pub const LABEL_IP_VERSION: &str = "projectcalico.org/ip-version";
/// The only affinity type margay's IPAM has (Calico also has `virtual`, for KubeVirt).
pub const AFFINITY_TYPE_HOST: &str = "host";
/// The name of the IPAM configuration singleton.
pub const IPAM_CONFIG_NAME: &str = "default";

/// The label selector that lists the BlockAffinities of `host` (and of one IP version when
/// given), as Calico's affinity List does; callers still filter by host, since the hash is a
/// hash, and drop deleted ones.
pub fn affinity_label_selector(host: &str, ip_version: Option<u8>) -> String {
    let mut s = format!(
        "{LABEL_AFFINITY_TYPE}={AFFINITY_TYPE_HOST},{LABEL_HOSTNAME_HASH}={}",
        hostname_hash(host)
    );
    if let Some(v) = ip_version {
        s.push_str(&format!(",{LABEL_IP_VERSION}={v}"));
    }
    s
}

/// A custom resource body with Calico's IPAM metadata.
fn ipam_cr(kind: &str, name: &str, labels: BTreeMap<String, String>, spec: Value) -> Value {
    let mut meta = Map::new();
    meta.insert("name".into(), Value::String(name.into()));
    meta.insert(
        "annotations".into(),
        json!({ METADATA_ANNOTATION: bare_metadata_annotation(&labels) }),
    );
    if !labels.is_empty() {
        meta.insert("labels".into(), json!(labels));
    }
    json!({
        "apiVersion": CRD_API_VERSION,
        "kind": kind,
        "metadata": meta,
        "spec": spec,
    })
}

/// A custom resource as read: checks apiVersion and kind (when present), returns the spec.
fn cr_spec<'a>(cr: &'a Value, kind: &str, object: &str) -> Result<&'a Value> {
    if !cr.is_object() {
        return Err(KddError::new(object, "<object>", "not a JSON object"));
    }
    if let Some(v) = cr
        .get("apiVersion")
        .filter(|v| **v != json!(CRD_API_VERSION))
    {
        return Err(KddError::new(
            object,
            "apiVersion",
            format!("{v}: expected {CRD_API_VERSION}"),
        ));
    }
    if let Some(k) = cr.get("kind").filter(|k| **k != json!(kind)) {
        return Err(KddError::new(
            object,
            "kind",
            format!("{k}: expected {kind}"),
        ));
    }
    Ok(cr.get("spec").unwrap_or(&Value::Null))
}

/// Decodes the spec of a custom resource, with `spec.` in front of the field in errors.
fn decode_spec<T: serde::de::DeserializeOwned>(spec: &Value, object: &str) -> Result<T> {
    let spec = if spec.is_null() { &json!({}) } else { spec };
    decode(spec, object).map_err(|mut e| {
        e.field = if e.field == "<object>" {
            "spec".to_string()
        } else if e.field.starts_with('[') {
            format!("spec{}", e.field)
        } else {
            format!("spec.{}", e.field)
        };
        e
    })
}

/// A masked CIDR, or an error naming `field`.
fn masked(cidr: &str, object: &str, field: &str) -> Result<Cidr> {
    Cidr::parse(cidr)
        .map(|c| c.network())
        .map_err(|e| KddError::new(object, field, e))
}

/// `/calico/ipam/v2/assignment/...` (`AllocationBlock` of crates/ipam): the fields Calico's
/// IPAMBlock custom resource holds.
#[derive(Deserialize)]
struct EtcdBlock {
    cidr: String,
    #[serde(default)]
    affinity: Option<String>,
    #[serde(default)]
    affinity_claim_time: Option<String>,
    #[serde(default)]
    allocations: Option<Vec<Option<u64>>>,
    #[serde(default)]
    unallocated: Option<Vec<u64>>,
    #[serde(default)]
    attributes: Option<Vec<Map<String, Value>>>,
    #[serde(default, rename = "sequenceNumber")]
    sequence_number: u64,
    #[serde(default, rename = "sequenceNumberForAllocation")]
    sequence_number_for_allocation: Option<BTreeMap<String, u64>>,
    #[serde(default)]
    deleted: bool,
}

/// The spec of an IPAMBlock custom resource.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockSpec {
    cidr: String,
    #[serde(default)]
    affinity: Option<String>,
    #[serde(default)]
    affinity_claim_time: Option<String>,
    #[serde(default)]
    allocations: Option<Vec<Option<u64>>>,
    #[serde(default)]
    unallocated: Option<Vec<u64>>,
    #[serde(default)]
    attributes: Option<Vec<Map<String, Value>>>,
    #[serde(default)]
    sequence_number: u64,
    #[serde(default)]
    sequence_number_for_allocation: Option<BTreeMap<String, u64>>,
    #[serde(default)]
    deleted: bool,
}

/// The IPAMBlock custom resource of a block's etcd JSON: named after the block's CIDR
/// ([`cidr_name`]); spec cidr, affinity, affinityClaimTime, allocations, unallocated,
/// attributes, sequenceNumber, sequenceNumberForAllocation, deleted, and Calico's deprecated
/// `strictAffinity: false`. Fields Calico's custom resource has no place for (the legacy
/// `hostAffinity`) are not carried.
pub fn block_to_cr(etcd_json: &Value) -> Result<Value> {
    let object = "IPAM block";
    let b: EtcdBlock = decode(etcd_json, object)?;
    let cidr = masked(&b.cidr, object, "cidr")?.to_string();
    let mut spec = Map::new();
    spec.insert("cidr".into(), json!(cidr));
    if let Some(a) = b.affinity {
        spec.insert("affinity".into(), json!(a));
    }
    if let Some(t) = b.affinity_claim_time {
        spec.insert("affinityClaimTime".into(), json!(t));
    }
    spec.insert("allocations".into(), json!(b.allocations));
    spec.insert("unallocated".into(), json!(b.unallocated));
    spec.insert("attributes".into(), json!(b.attributes));
    spec.insert("sequenceNumber".into(), json!(b.sequence_number));
    spec.insert(
        "sequenceNumberForAllocation".into(),
        json!(b.sequence_number_for_allocation),
    );
    spec.insert("deleted".into(), json!(b.deleted));
    spec.insert("strictAffinity".into(), json!(false));
    Ok(ipam_cr(
        "IPAMBlock",
        &cidr_name(&cidr),
        BTreeMap::new(),
        Value::Object(spec),
    ))
}

/// The etcd JSON of an IPAMBlock custom resource, in the form margay's IPAM writes it (every
/// field present; `affinity` null when the block is affine to nobody); None when the block is
/// marked deleted.
pub fn cr_to_block(cr: &Value) -> Result<Option<Value>> {
    let object = value_label("IPAMBlock", cr);
    let spec = cr_spec(cr, "IPAMBlock", &object)?;
    let b: BlockSpec = decode_spec(spec, &object)?;
    if b.deleted {
        return Ok(None);
    }
    let cidr = masked(&b.cidr, &object, "spec.cidr")?.to_string();
    let mut out = Map::new();
    out.insert("cidr".into(), json!(cidr));
    out.insert("affinity".into(), json!(b.affinity));
    if let Some(t) = b.affinity_claim_time {
        out.insert("affinity_claim_time".into(), json!(t));
    }
    out.insert("allocations".into(), json!(b.allocations));
    out.insert("unallocated".into(), json!(b.unallocated));
    out.insert("attributes".into(), json!(b.attributes));
    out.insert("sequenceNumber".into(), json!(b.sequence_number));
    out.insert(
        "sequenceNumberForAllocation".into(),
        json!(b.sequence_number_for_allocation),
    );
    out.insert("deleted".into(), json!(false));
    Ok(Some(Value::Object(out)))
}

/// `/calico/ipam/v2/host/<host>/ipv<N>/block/<cidr>`.
#[derive(Deserialize)]
struct EtcdAffinity {
    #[serde(default, deserialize_with = "null_as_default")]
    state: String,
    #[serde(default)]
    deleted: bool,
}

/// The spec of a BlockAffinity custom resource (`deleted` a string in v1, a bool in v3).
#[derive(Deserialize)]
struct AffinitySpec {
    #[serde(default, deserialize_with = "null_as_default")]
    state: String,
    #[serde(default, deserialize_with = "null_as_default")]
    node: String,
    #[serde(default, rename = "type", deserialize_with = "null_as_default")]
    type_: String,
    #[serde(default, deserialize_with = "null_as_default")]
    cidr: String,
    #[serde(default)]
    deleted: Option<StringOrBool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum StringOrBool {
    Bool(bool),
    String(String),
}

/// Go's strconv.ParseBool.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The BlockAffinity custom resource of `host`'s affinity to the block `cidr` (etcd JSON
/// `{"state": …, "deleted": …}`): named by [`block_affinity_name`], labelled with the
/// hostname hash, affinity type `host` and IP version, spec state, node, type `host`, cidr
/// (masked) and `deleted` as the string `"true"`/`"false"` (a string in Calico's v1 CRD).
pub fn affinity_to_cr(host: &str, cidr: &str, etcd_json: &Value) -> Result<Value> {
    let object = format!("block affinity of {host:?} for {cidr}");
    if host.is_empty() {
        return Err(KddError::new(&object, "host", "required"));
    }
    let cidr = masked(cidr, &object, "cidr")?;
    let a: EtcdAffinity = decode(etcd_json, &object)?;
    let labels: BTreeMap<String, String> = [
        (LABEL_HOSTNAME_HASH, hostname_hash(host)),
        (LABEL_AFFINITY_TYPE, AFFINITY_TYPE_HOST.to_string()),
        (LABEL_IP_VERSION, cidr.version().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let cidr = cidr.to_string();
    Ok(ipam_cr(
        "BlockAffinity",
        &block_affinity_name(host, &cidr),
        labels,
        json!({
            "state": a.state,
            "node": host,
            "type": AFFINITY_TYPE_HOST,
            "cidr": cidr,
            "deleted": if a.deleted { "true" } else { "false" },
        }),
    ))
}

/// The host, masked block CIDR and etcd JSON (`{"state": …, "deleted": false}`) of a
/// BlockAffinity custom resource; None when it is marked deleted. `deleted` may be a string
/// (`"true"`, any form Go's ParseBool takes, or empty) or a bool. Affinities of another type
/// than `host` (Calico's `virtual` ones, for KubeVirt) are errors: margay's IPAM keys have no
/// place for them.
pub fn cr_to_affinity(cr: &Value) -> Result<Option<(String, String, Value)>> {
    let object = value_label("BlockAffinity", cr);
    let spec = cr_spec(cr, "BlockAffinity", &object)?;
    let a: AffinitySpec = decode_spec(spec, &object)?;
    let deleted = match &a.deleted {
        None => false,
        Some(StringOrBool::Bool(b)) => *b,
        Some(StringOrBool::String(s)) if s.is_empty() => false,
        Some(StringOrBool::String(s)) => parse_go_bool(s).ok_or_else(|| {
            KddError::new(&object, "spec.deleted", format!("{s:?} is not a boolean"))
        })?,
    };
    if deleted {
        return Ok(None);
    }
    if !a.type_.is_empty() && a.type_ != AFFINITY_TYPE_HOST {
        return Err(KddError::new(
            &object,
            "spec.type",
            format!("{:?}: margay's IPAM has only host affinities", a.type_),
        ));
    }
    if a.node.is_empty() {
        return Err(KddError::new(&object, "spec.node", "required"));
    }
    let cidr = masked(&a.cidr, &object, "spec.cidr")?;
    Ok(Some((
        a.node,
        cidr.to_string(),
        json!({ "state": a.state, "deleted": false }),
    )))
}

/// `/calico/ipam/v2/handle/<id>`.
#[derive(Deserialize)]
struct EtcdHandle {
    #[serde(default)]
    block: Option<BTreeMap<String, u64>>,
    #[serde(default)]
    deleted: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HandleSpec {
    #[serde(default, rename = "handleID", deserialize_with = "null_as_default")]
    handle_id: String,
    #[serde(default)]
    block: Option<BTreeMap<String, u64>>,
    #[serde(default)]
    deleted: bool,
}

/// The IPAMHandle custom resource of a handle: named by the lower-cased handle ID (object
/// names are lower case), spec handleID (the ID as given), block (addresses held per block
/// CIDR) and deleted.
pub fn handle_to_cr(handle_id: &str, etcd_json: &Value) -> Result<Value> {
    let object = format!("IPAM handle {handle_id:?}");
    if handle_id.is_empty() {
        return Err(KddError::new(&object, "handleID", "required"));
    }
    let h: EtcdHandle = decode(etcd_json, &object)?;
    Ok(ipam_cr(
        "IPAMHandle",
        &handle_id.to_lowercase(),
        BTreeMap::new(),
        json!({ "handleID": handle_id, "block": h.block, "deleted": h.deleted }),
    ))
}

/// The handle ID (`spec.handleID`, with its case; the object's name if that is empty) and
/// etcd JSON (`{"block": …, "deleted": false}`) of an IPAMHandle custom resource; None when it
/// is marked deleted.
pub fn cr_to_handle(cr: &Value) -> Result<Option<(String, Value)>> {
    let object = value_label("IPAMHandle", cr);
    let spec = cr_spec(cr, "IPAMHandle", &object)?;
    let h: HandleSpec = decode_spec(spec, &object)?;
    if h.deleted {
        return Ok(None);
    }
    let id = if h.handle_id.is_empty() {
        cr.get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    } else {
        h.handle_id
    };
    if id.is_empty() {
        return Err(KddError::new(&object, "spec.handleID", "required"));
    }
    Ok(Some((id, json!({ "block": h.block, "deleted": false }))))
}

/// `/calico/ipam/v2/config` (`StoredIpamConfig` of crates/ipam).
#[derive(Deserialize)]
struct EtcdIpamConfig {
    #[serde(default)]
    strict_affinity: bool,
    /// Missing means true, as margay's IPAM reads it.
    #[serde(default)]
    auto_allocate_blocks: Option<bool>,
    #[serde(default, rename = "maxBlocksPerHost")]
    max_blocks_per_host: i64,
    #[serde(default, rename = "kubeVirtVMAddressPersistence")]
    kube_virt_vm_address_persistence: Option<String>,
    #[serde(default, rename = "ipCooldownSeconds")]
    ip_cooldown_seconds: i64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct IpamConfigSpec {
    #[serde(default)]
    strict_affinity: bool,
    #[serde(default)]
    auto_allocate_blocks: Option<bool>,
    #[serde(default)]
    max_blocks_per_host: i64,
    #[serde(default, rename = "kubeVirtVMAddressPersistence")]
    kube_virt_vm_address_persistence: Option<String>,
    #[serde(default)]
    ip_cooldown_seconds: i64,
}

/// The IPAMConfig custom resource `default` of the etcd IPAM configuration (the same object
/// the v3 IPAMConfiguration `default` maps to with [`crate::crd::resource_to_cr`]): spec
/// strictAffinity, autoAllocateBlocks, and maxBlocksPerHost, kubeVirtVMAddressPersistence and
/// ipCooldownSeconds when set.
pub fn ipam_config_to_cr(etcd_json: &Value) -> Result<Value> {
    let c: EtcdIpamConfig = decode(etcd_json, "IPAM configuration")?;
    let mut spec = Map::new();
    spec.insert("strictAffinity".into(), json!(c.strict_affinity));
    spec.insert(
        "autoAllocateBlocks".into(),
        json!(c.auto_allocate_blocks.unwrap_or(true)),
    );
    if c.max_blocks_per_host != 0 {
        spec.insert("maxBlocksPerHost".into(), json!(c.max_blocks_per_host));
    }
    if let Some(p) = c.kube_virt_vm_address_persistence {
        spec.insert("kubeVirtVMAddressPersistence".into(), json!(p));
    }
    if c.ip_cooldown_seconds != 0 {
        spec.insert("ipCooldownSeconds".into(), json!(c.ip_cooldown_seconds));
    }
    Ok(ipam_cr(
        "IPAMConfig",
        IPAM_CONFIG_NAME,
        BTreeMap::new(),
        Value::Object(spec),
    ))
}

/// The etcd IPAM configuration of the IPAMConfig custom resource, in the form margay's IPAM
/// writes it (`strict_affinity`, `auto_allocate_blocks` and `maxBlocksPerHost` always;
/// kubeVirtVMAddressPersistence and ipCooldownSeconds when set). A missing
/// autoAllocateBlocks reads as true, as margay's IPAMConfiguration does.
pub fn cr_to_ipam_config(cr: &Value) -> Result<Value> {
    let object = value_label("IPAMConfig", cr);
    let spec = cr_spec(cr, "IPAMConfig", &object)?;
    let c: IpamConfigSpec = decode_spec(spec, &object)?;
    let mut out = Map::new();
    out.insert("strict_affinity".into(), json!(c.strict_affinity));
    out.insert(
        "auto_allocate_blocks".into(),
        json!(c.auto_allocate_blocks.unwrap_or(true)),
    );
    out.insert("maxBlocksPerHost".into(), json!(c.max_blocks_per_host));
    if let Some(p) = c.kube_virt_vm_address_persistence {
        out.insert("kubeVirtVMAddressPersistence".into(), json!(p));
    }
    if c.ip_cooldown_seconds != 0 {
        out.insert("ipCooldownSeconds".into(), json!(c.ip_cooldown_seconds));
    }
    Ok(Value::Object(out))
}
