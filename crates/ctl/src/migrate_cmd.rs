//! `datastore migrate export | import`: moving a cluster from etcd (or the embedded store) to
//! the Kubernetes datastore, in calicoctl's file format, so a file exported by either tool
//! imports with either:
//!
//! 1. one `<Kind>List` YAML document per kind, each followed by a `---` line (cluster-specific
//!    metadata removed; converted Kubernetes policies `knp.default.*` left out, as the
//!    Kubernetes datastore derives them; Nodes renamed to their Kubernetes names);
//! 2. a line `===`, then ClusterInformation `default` as JSON;
//! 3. a line `===`, then the IPAM state as JSON: `block_affinities`, `blocks`, `handles`
//!    (each `{"Key": <etcd key>, "Value": <stored JSON>, "TTL": 0}`) and `config`.
//!
//! Export needs a locked datastore (nothing may be assigned meanwhile); import needs a
//! Kubernetes datastore with no Calico data yet, locks it, and leaves it locked for the
//! operator to check and `unlock`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use margay_api::codec::{decode_documents, to_yaml};
use margay_api::resource::API_VERSION;
use margay_api::{Kind, Resource};
use margay_datastore::{Client, DatastoreError, KvBackend};
use serde_json::{Value, json};

use crate::cluster_cmd::cluster_information;
use crate::datastore::{Access, Connector, connect_or_report};
use crate::input::{clip_line, read_bounded, read_file};
use crate::{EXIT_INVALID, EXIT_OK, EXIT_USAGE};

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The file `datastore migrate export` wrote (`-` reads standard input).
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true)]
    pub filename: PathBuf,
}

/// The kinds exported, in calicoctl's order (the ones margay has).
const EXPORTED: [Kind; 14] = [
    Kind::IPPool,
    Kind::BGPPeer,
    Kind::Tier,
    Kind::GlobalNetworkPolicy,
    Kind::GlobalNetworkSet,
    Kind::HostEndpoint,
    Kind::KubeControllersConfiguration,
    Kind::NetworkPolicy,
    Kind::NetworkSet,
    Kind::Node,
    Kind::BGPConfiguration,
    Kind::FelixConfiguration,
    Kind::IPReservation,
    Kind::BGPFilter,
];

const BLOCKS: &str = "/calico/ipam/v2/assignment/";
const AFFINITIES: &str = "/calico/ipam/v2/host/";
const HANDLES: &str = "/calico/ipam/v2/handle/";
const IPAM_CONFIG: &str = "/calico/ipam/v2/config";

/// Tiers every Kubernetes datastore has; their presence does not make it "not empty".
const PROTECTED_TIERS: [&str; 3] = ["default", "kube-admin", "kube-baseline"];

fn locked(ci: Option<&margay_api::ClusterInformation>) -> bool {
    ci.is_some_and(|c| c.spec.datastore_ready == Some(false))
}

/// `node.<old>` configuration names follow their node's new name.
fn renamed_config(name: &str, names: &BTreeMap<String, String>) -> Option<String> {
    let node = name.strip_prefix("node.")?;
    names.get(node).map(|k8s| format!("node.{k8s}"))
}

pub(crate) async fn export<C: Connector>(
    config: Option<&Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
) -> std::io::Result<u8> {
    let conn = match connect_or_report(connector, config, Access::Existing, err).await? {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    if conn.kubernetes {
        writeln!(
            err,
            "error: invalid datastore type: kubernetes to export from for datastore migration. Export from etcd (DATASTORE_TYPE=etcdv3) or the embedded store"
        )?;
        return Ok(EXIT_USAGE);
    }
    let client = &conn.client;
    let ci = match cluster_information(client).await {
        Ok(ci) => ci,
        Err(e) => {
            writeln!(err, "error: reading ClusterInformation: {e}")?;
            return Ok(EXIT_INVALID);
        }
    };
    if !locked(ci.as_ref()) {
        writeln!(
            err,
            "error: datastore is not locked. Run the `margay ctl datastore migrate lock` command in order to begin migration"
        )?;
        return Ok(EXIT_INVALID);
    }
    // Nodes take their Kubernetes names (the orchestrator reference), as in the Kubernetes
    // datastore a Calico Node is the Kubernetes Node.
    let nodes = match client.list(Kind::Node, None, "").await {
        Ok(l) => l.items,
        Err(e) => {
            writeln!(err, "error: listing nodes: {e}")?;
            return Ok(EXIT_INVALID);
        }
    };
    let mut names = BTreeMap::new();
    for n in &nodes {
        let Resource::Node(node) = n else { continue };
        match node
            .spec
            .orch_refs
            .iter()
            .find(|r| r.orchestrator == "k8s" && !r.node_name.is_empty())
        {
            Some(r) => {
                names.insert(node.metadata.name.clone(), r.node_name.clone());
            }
            None => {
                writeln!(
                    err,
                    "error: node {} missing a 'k8s' orchestrator reference. Unable to export data unless every node has a 'k8s' orchestrator reference (spec.orchRefs: [{{nodeName: <Kubernetes node>, orchestrator: k8s}}])",
                    node.metadata.name
                )?;
                return Ok(EXIT_INVALID);
            }
        }
    }
    let mut text = String::new();
    for kind in EXPORTED {
        let list = match client.list(kind, None, "").await {
            Ok(l) => l,
            Err(e) => {
                writeln!(err, "error: listing {}: {e}", kind.plural())?;
                return Ok(EXIT_INVALID);
            }
        };
        let mut items = Vec::new();
        for mut r in list.items {
            if kind == Kind::NetworkPolicy && r.name().starts_with("knp.default.") {
                continue;
            }
            let new_name = match &r {
                Resource::Node(_) => names.get(r.name()).cloned(),
                Resource::FelixConfiguration(_) | Resource::BGPConfiguration(_) => {
                    renamed_config(r.name(), &names)
                }
                _ => None,
            };
            let m = r.metadata_mut();
            if let Some(n) = new_name {
                m.name = n;
            }
            m.uid.clear();
            m.resource_version.clear();
            m.creation_timestamp = None;
            m.deletion_timestamp = None;
            m.deletion_grace_period_seconds = None;
            match serde_json::to_value(&r) {
                Ok(v) => items.push(v),
                Err(e) => {
                    writeln!(err, "error: encoding {}: {e}", r.name())?;
                    return Ok(EXIT_INVALID);
                }
            }
        }
        let list = json!({
            "apiVersion": API_VERSION,
            "kind": kind.list_name(),
            "items": items,
            "metadata": {"resourceVersion": list.revision.to_string()},
        });
        match to_yaml(&list) {
            Ok(y) => text.push_str(&y),
            Err(e) => {
                writeln!(err, "error: {e}")?;
                return Ok(EXIT_INVALID);
            }
        }
        text.push_str("---\n");
    }
    text.push_str("===\n");
    let ci_json = ci
        .as_ref()
        .map(serde_json::to_string_pretty)
        .transpose()
        .unwrap_or_default()
        .unwrap_or_else(|| "{}".into());
    text.push_str(&ci_json);
    text.push('\n');
    text.push_str("===\n");
    let ipam = match export_ipam(client.backend(), &names).await {
        Ok(v) => v,
        Err(e) => {
            writeln!(err, "error: reading IPAM: {e}")?;
            return Ok(EXIT_INVALID);
        }
    };
    text.push_str(&serde_json::to_string_pretty(&ipam).unwrap_or_else(|_| "{}".into()));
    text.push('\n');
    out.write_all(text.as_bytes())?;
    Ok(EXIT_OK)
}

/// A node name inside IPAM keys and values, renamed.
fn rename_node(s: &str, names: &BTreeMap<String, String>) -> String {
    names.get(s).cloned().unwrap_or_else(|| s.to_string())
}

async fn export_ipam<B: KvBackend>(
    kv: &B,
    names: &BTreeMap<String, String>,
) -> Result<Value, DatastoreError> {
    let entry = |key: String, value: Value| json!({"Key": key, "Value": value, "TTL": 0});
    let parse = |bytes: &[u8], key: &str| -> Result<Value, DatastoreError> {
        serde_json::from_slice(bytes).map_err(|e| DatastoreError::Invalid {
            reason: format!("{key} does not hold JSON: {e}"),
        })
    };
    let mut blocks = Vec::new();
    for kv in kv.list(BLOCKS).await?.kvs {
        let mut v = parse(&kv.value, &kv.key)?;
        if let Some(a) = v.get("affinity").and_then(Value::as_str)
            && let Some(host) = a.strip_prefix("host:")
        {
            v["affinity"] = Value::String(format!("host:{}", rename_node(host, names)));
        }
        if let Some(attrs) = v.get_mut("attributes").and_then(Value::as_array_mut) {
            for a in attrs {
                if let Some(node) = a
                    .get_mut("secondary")
                    .and_then(|s| s.get_mut("node"))
                    .filter(|n| n.is_string())
                {
                    let renamed = rename_node(node.as_str().unwrap_or_default(), names);
                    *node = Value::String(renamed);
                }
                if let Some(h) = a.get_mut("handle_id").filter(|h| h.is_string()) {
                    *h = Value::String(rename_tunnel_handle(h.as_str().unwrap_or_default(), names));
                }
            }
        }
        blocks.push(entry(kv.key, v));
    }
    let mut affinities = Vec::new();
    for kv in kv.list(AFFINITIES).await?.kvs {
        let v = parse(&kv.value, &kv.key)?;
        // /calico/ipam/v2/host/<node>/ipv4/block/<cidr>
        let key = match kv
            .key
            .strip_prefix(AFFINITIES)
            .and_then(|r| r.split_once('/'))
        {
            Some((node, rest)) => format!("{AFFINITIES}{}/{rest}", rename_node(node, names)),
            None => kv.key.clone(),
        };
        affinities.push(entry(key, v));
    }
    let mut handles = Vec::new();
    for kv in kv.list(HANDLES).await?.kvs {
        let v = parse(&kv.value, &kv.key)?;
        let id = kv.key.strip_prefix(HANDLES).unwrap_or_default();
        handles.push(entry(
            format!("{HANDLES}{}", rename_tunnel_handle(id, names)),
            v,
        ));
    }
    let mut out = serde_json::Map::new();
    if !affinities.is_empty() {
        out.insert("block_affinities".into(), Value::Array(affinities));
    }
    if !blocks.is_empty() {
        out.insert("blocks".into(), Value::Array(blocks));
    }
    if !handles.is_empty() {
        out.insert("handles".into(), Value::Array(handles));
    }
    if let Some(kv) = kv.get(IPAM_CONFIG).await? {
        out.insert(
            "config".into(),
            entry(IPAM_CONFIG.into(), parse(&kv.value, &kv.key)?),
        );
    }
    Ok(Value::Object(out))
}

/// The tunnel addresses' handles name their node (`vxlan-tunnel-addr-<node>`).
fn rename_tunnel_handle(id: &str, names: &BTreeMap<String, String>) -> String {
    for prefix in [
        "ipip-tunnel-addr-",
        "vxlan-tunnel-addr-",
        "vxlan-v6-tunnel-addr-",
        "wireguard-tunnel-addr-",
        "wireguard-v6-tunnel-addr-",
    ] {
        if let Some(node) = id.strip_prefix(prefix) {
            return format!("{prefix}{}", rename_node(node, names));
        }
    }
    id.to_string()
}

/// The three parts of an export file.
fn split_parts(text: &str) -> Option<(&str, &str, &str)> {
    let mut parts = text.split("===\n");
    let (a, b, c) = (parts.next()?, parts.next()?, parts.next()?);
    parts.next().is_none().then_some((a, b, c))
}

pub(crate) async fn import<C: Connector>(
    a: &ImportArgs,
    config: Option<&Path>,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
    connector: &C,
) -> std::io::Result<u8> {
    let text = if a.filename.as_os_str() == "-" {
        read_bounded(stdin)
    } else {
        read_file(&a.filename)
    };
    let text = match text {
        Ok(t) => t,
        Err(e) => {
            writeln!(err, "error: cannot read {}: {e}", a.filename.display())?;
            return Ok(EXIT_USAGE);
        }
    };
    let Some((resources, ci_part, ipam_part)) = split_parts(&text) else {
        writeln!(
            err,
            "error while reading migration file: imported file: {} is improperly formatted. Try recreating with 'margay ctl datastore migrate export'",
            a.filename.display()
        )?;
        return Ok(EXIT_USAGE);
    };
    let exported_ci: Value = match serde_json::from_str(ci_part.trim()) {
        Ok(v) => v,
        Err(e) => {
            writeln!(err, "error: the ClusterInformation part is not JSON: {e}")?;
            return Ok(EXIT_USAGE);
        }
    };
    let ipam: Value = match serde_json::from_str(ipam_part.trim()) {
        Ok(v) => v,
        Err(e) => {
            writeln!(err, "error: the IPAM part is not JSON: {e}")?;
            return Ok(EXIT_USAGE);
        }
    };
    let docs = match decode_documents(resources) {
        Ok(d) => d,
        Err(e) => {
            writeln!(
                err,
                "error: the resources part: {}",
                clip_line(&e.to_string())
            )?;
            return Ok(EXIT_USAGE);
        }
    };
    let mut items = Vec::new();
    for d in docs {
        let label = format!("{} {}", d.position, d.label());
        match d.result {
            Ok(r) => items.push(r),
            Err(e) => {
                writeln!(
                    err,
                    "error: the resources part, {label}: {}",
                    clip_line(&e.to_string())
                )?;
                return Ok(EXIT_USAGE);
            }
        }
    }
    let conn = match connect_or_report(connector, config, Access::Existing, err).await? {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    if !conn.kubernetes {
        writeln!(
            err,
            "error: invalid datastore type to import to for datastore migration ({}). Datastore type must be kubernetes",
            conn.describe
        )?;
        return Ok(EXIT_USAGE);
    }
    let client = &conn.client;
    if let Some(found) = existing_calico_data(client).await {
        writeln!(
            err,
            "error: datastore already has Calico resources: found existing Calico {found}. Clear out all Calico resources first"
        )?;
        return Ok(EXIT_INVALID);
    }
    if let Err(e) = lock(client).await {
        writeln!(err, "error: locking the datastore: {e}")?;
        return Ok(EXIT_INVALID);
    }
    writeln!(out, "Datastore locked.")?;
    let mut applied = 0usize;
    let mut failures = Vec::new();
    for r in items {
        let label = format!("{} {}", r.kind(), r.name());
        match client.apply(r).await {
            Ok(_) => applied += 1,
            Err(DatastoreError::NotFound { .. }) if label.starts_with("Node ") => {
                writeln!(
                    err,
                    "[WARNING] Attempted to import node {} from etcd that references a nonexistent Kubernetes node. Skipping that node. Non-Kubernetes nodes are not supported in the Kubernetes datastore and will be skipped.",
                    label.trim_start_matches("Node ")
                )?;
            }
            Err(e) => failures.push(format!("{label}: {e}")),
        }
    }
    writeln!(out, "Successfully applied {applied} resource(s)")?;
    // ClusterInformation: the cluster keeps its identity; it stays locked.
    match cluster_information(client).await {
        Ok(Some(mut ci)) => {
            if let Some(g) = exported_ci
                .pointer("/spec/clusterGUID")
                .and_then(Value::as_str)
            {
                ci.spec.cluster_guid = g.to_string();
            }
            if let Some(v) = exported_ci
                .pointer("/spec/calicoVersion")
                .and_then(Value::as_str)
            {
                ci.spec.calico_version = v.to_string();
            }
            if let Err(e) = client.update(Resource::ClusterInformation(ci)).await {
                failures.push(format!("ClusterInformation default: {e}"));
            }
        }
        Ok(None) => failures.push("ClusterInformation default disappeared".into()),
        Err(e) => failures.push(format!("ClusterInformation default: {e}")),
    }
    writeln!(out, "Importing IPAM resources")?;
    let mut ipam_applied = 0usize;
    for section in ["block_affinities", "blocks", "handles"] {
        for entry in ipam
            .get(section)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            match import_entry(client.backend(), entry).await {
                Ok(()) => ipam_applied += 1,
                Err(e) => failures.push(format!("IPAM {section}: {e}")),
            }
        }
    }
    if let Some(entry) = ipam.get("config") {
        match import_entry(client.backend(), entry).await {
            Ok(()) => ipam_applied += 1,
            Err(e) => failures.push(format!("IPAM config: {e}")),
        }
    }
    writeln!(out, "Successfully applied {ipam_applied} IPAM resource(s)")?;
    if !failures.is_empty() {
        for f in &failures {
            writeln!(err, "hit error: {}", clip_line(f))?;
        }
        return Ok(EXIT_INVALID);
    }
    writeln!(
        out,
        "Datastore information successfully imported. Check it (margay ctl get ..., margay ctl ipam check), then `margay ctl datastore migrate unlock`."
    )?;
    Ok(EXIT_OK)
}

async fn import_entry<B: KvBackend>(kv: &B, entry: &Value) -> Result<(), String> {
    let key = entry
        .get("Key")
        .and_then(Value::as_str)
        .ok_or("an entry without a Key")?;
    if !key.starts_with("/calico/ipam/v2/") {
        return Err(format!("{key:?} is not an IPAM key"));
    }
    let value = entry.get("Value").ok_or("an entry without a Value")?;
    let bytes = serde_json::to_vec(value).map_err(|e| e.to_string())?;
    kv.create(key, bytes, None)
        .await
        .map(|_| ())
        .map_err(|e| format!("{key}: {e}"))
}

/// The first Calico object the target already holds, if any (the Kubernetes datastore's own
/// tiers and the policies it derives from Kubernetes ones do not count).
async fn existing_calico_data<B: KvBackend>(client: &Client<B>) -> Option<String> {
    for kind in EXPORTED {
        if kind == Kind::Node {
            continue;
        }
        let Ok(list) = client.list(kind, None, "").await else {
            continue;
        };
        if let Some(r) = list.items.iter().find(|r| match r {
            Resource::Tier(_) => !PROTECTED_TIERS.contains(&r.name()),
            Resource::NetworkPolicy(_) => !r.name().starts_with("knp.default."),
            _ => true,
        }) {
            return Some(format!("{} resource {}", kind.name(), r.name()));
        }
    }
    for prefix in [BLOCKS, AFFINITIES, HANDLES] {
        if let Ok(l) = client.backend().list(prefix).await
            && let Some(kv) = l.kvs.first()
        {
            return Some(format!("IPAM resource {}", kv.key));
        }
    }
    None
}

async fn lock<B: KvBackend>(client: &Client<B>) -> Result<(), DatastoreError> {
    let mut ci = match cluster_information(client).await? {
        Some(ci) => ci,
        None => {
            let meta = margay_api::ObjectMeta {
                name: "default".into(),
                ..Default::default()
            };
            let mut ci = margay_api::ClusterInformation::new(meta, Default::default());
            ci.spec.datastore_ready = Some(false);
            client.create(Resource::ClusterInformation(ci)).await?;
            return Ok(());
        }
    };
    if ci.spec.datastore_ready == Some(false) {
        return Ok(());
    }
    ci.spec.datastore_ready = Some(false);
    client
        .update(Resource::ClusterInformation(ci))
        .await
        .map(|_| ())
}
