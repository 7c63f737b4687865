//! The IPAM-leak runbook: `ipam check -o REPORT` writes what IPAM holds and what uses it, in
//! calicoctl's report format; `ipam release --from-report REPORT...` frees what every report
//! found leaked, only if the cluster has not moved since (calicoctl's checks: same cluster,
//! an up-to-date report, a locked datastore), and each release is a compare-and-swap on the
//! block's sequence number and the handle's revision, so an address or handle reused since the
//! report is never touched.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use margay_api::ClusterInformation;
use margay_datastore::{Client, DatastoreError, KvBackend};
use margay_ipam::{AllocationBlock, Ipam, ReleaseIp, Users};
use serde::{Deserialize, Serialize};

use crate::cluster_cmd::{client_version, cluster_information};
use crate::input::read_file;
use crate::{EXIT_INVALID, EXIT_OK, EXIT_USAGE};

/// calicoctl's report, field for field (`ipam check -o`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Report {
    pub version: String,
    #[serde(rename = "clusterGUID")]
    pub cluster_guid: String,
    #[serde(rename = "datastoreLocked", default)]
    pub datastore_locked: bool,
    #[serde(rename = "clusterInformationRevision")]
    pub cluster_information_revision: String,
    #[serde(rename = "clusterType", default)]
    pub cluster_type: String,
    /// Address → its allocations (one, unless IPAM is corrupt).
    #[serde(default)]
    pub allocations: BTreeMap<String, Vec<ReportAllocation>>,
    #[serde(
        rename = "leakedHandles",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub leaked_handles: Vec<HandleInfo>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ReportAllocation {
    pub ip: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub handle: String,
    #[serde(
        rename = "sequenceNumber",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub sequence_number: Option<u64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(
        rename = "creationTimestamp",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub creation_timestamp: String,
    #[serde(rename = "inUse")]
    pub in_use: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub borrowed: bool,
    /// `null` when nothing uses the address, as calicoctl writes it.
    #[serde(default)]
    pub owners: Option<Vec<String>>,
}

/// A handle record no allocation refers to (Go field names, as calicoctl writes them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HandleInfo {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "UID", default)]
    pub uid: Option<String>,
    #[serde(rename = "Revision")]
    pub revision: String,
}

/// Builds the report from what `ipam check` read.
pub(crate) fn build_report(
    ci: Option<&ClusterInformation>,
    blocks: &[AllocationBlock],
    users: &Users,
    leaked_handles: Vec<HandleInfo>,
) -> Report {
    let mut allocations: BTreeMap<String, Vec<ReportAllocation>> = BTreeMap::new();
    for b in blocks {
        let block_host = b
            .affinity
            .as_deref()
            .and_then(|a| a.strip_prefix("host:"))
            .unwrap_or_default();
        for a in b.allocated() {
            let attr = |k: &str| a.attribute.attrs.get(k).cloned().unwrap_or_default();
            let node_attr = attr("node");
            let node = if node_attr.is_empty() {
                block_host.to_string()
            } else {
                node_attr.clone()
            };
            let owners = users.by_ip.get(&a.ip).cloned();
            allocations
                .entry(a.ip.to_string())
                .or_default()
                .push(ReportAllocation {
                    ip: a.ip.to_string(),
                    handle: a.attribute.handle_id.clone().unwrap_or_default(),
                    sequence_number: (a.sequence_number != 0).then_some(a.sequence_number),
                    pod: attr("pod"),
                    namespace: attr("namespace"),
                    node,
                    kind: attr("type"),
                    creation_timestamp: attr("timestamp"),
                    in_use: owners.is_some(),
                    borrowed: !node_attr.is_empty() && node_attr != block_host,
                    owners,
                });
        }
    }
    Report {
        version: client_version().to_string(),
        cluster_guid: ci.map(|c| c.spec.cluster_guid.clone()).unwrap_or_default(),
        datastore_locked: ci.is_some_and(|c| c.spec.datastore_ready == Some(false)),
        cluster_information_revision: ci
            .map(|c| c.metadata.resource_version.clone())
            .unwrap_or_default(),
        cluster_type: ci.map(|c| c.spec.cluster_type.clone()).unwrap_or_default(),
        allocations,
        leaked_handles,
    }
}

/// Handles no block refers to, with the revision a later delete must still find.
pub(crate) async fn leaked_handles<B: KvBackend>(
    kv: &B,
    stale: &[String],
) -> Result<Vec<HandleInfo>, DatastoreError> {
    let stale: BTreeSet<&String> = stale.iter().collect();
    let prefix = margay_ipam::pools::handles_prefix();
    let mut out = Vec::new();
    for kv in kv.list(&prefix).await?.kvs {
        let id = kv.key.strip_prefix(&prefix).unwrap_or_default().to_string();
        if stale.contains(&id) {
            out.push(HandleInfo {
                id,
                uid: None,
                revision: kv.mod_revision.to_string(),
            });
        }
    }
    Ok(out)
}

/// Writes the report (2-space indented JSON, as calicoctl's), mode 0600: it lists pods and
/// nodes.
pub(crate) fn write_report(path: &Path, report: &Report) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let json = serde_json::to_vec_pretty(report).map_err(|e| e.to_string())?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot write the report {}: {e}", path.display()))?;
    f.write_all(&json)
        .map_err(|e| format!("cannot write the report {}: {e}", path.display()))
}

fn read_report(path: &Path) -> Result<Report, String> {
    let text = read_file(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not an IPAM report (`margay ctl ipam check -o FILE` writes one): {e}",
            path.display()
        )
    })
}

/// What every report agrees is leaked: addresses with their handle and sequence number (from
/// the last report), and handles with the same revision in each.
pub(crate) fn leaked_in_all(reports: &[Report]) -> (Vec<ReportAllocation>, Vec<HandleInfo>) {
    let Some((last, earlier)) = reports.split_last() else {
        return (Vec::new(), Vec::new());
    };
    let leaked = |r: &Report| -> BTreeSet<String> {
        r.allocations
            .iter()
            .filter(|(_, allocs)| allocs.iter().any(|a| !a.in_use))
            .map(|(ip, _)| ip.clone())
            .collect()
    };
    let mut ips = leaked(last);
    for r in earlier {
        ips = ips.intersection(&leaked(r)).cloned().collect();
    }
    let allocations = ips
        .iter()
        .filter_map(|ip| last.allocations.get(ip))
        .flat_map(|allocs| allocs.iter().filter(|a| !a.in_use).cloned())
        .collect();
    let handles = last
        .leaked_handles
        .iter()
        .filter(|h| {
            earlier.iter().all(|r| {
                r.leaked_handles
                    .iter()
                    .any(|o| o.id == h.id && o.revision == h.revision)
            })
        })
        .cloned()
        .collect();
    (allocations, handles)
}

/// `ipam release --from-report`.
pub(crate) async fn release_from_reports<B: KvBackend + Clone>(
    ipam: &Ipam<B>,
    client: &Client<B>,
    files: &[PathBuf],
    force: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<u8> {
    let mut reports = Vec::new();
    for f in files {
        match read_report(f) {
            Ok(r) => reports.push((f, r)),
            Err(e) => {
                writeln!(err, "error: {e}")?;
                return Ok(EXIT_USAGE);
            }
        }
    }
    let ci = match cluster_information(client).await {
        Ok(Some(ci)) => ci,
        Ok(None) => {
            writeln!(
                err,
                "error: the datastore has no ClusterInformation \"default\": the reports cannot be matched to this cluster"
            )?;
            return Ok(EXIT_INVALID);
        }
        Err(e) => {
            writeln!(err, "error: reading ClusterInformation: {e}")?;
            return Ok(EXIT_INVALID);
        }
    };
    for (f, r) in &reports {
        // Never overridable: a report from another cluster names someone else's addresses.
        if r.cluster_guid != ci.spec.cluster_guid {
            writeln!(
                err,
                "error: cluster does not match the provided report ({}): mismatched cluster GUID. Refusing to release",
                f.display()
            )?;
            return Ok(EXIT_INVALID);
        }
        if r.version != client_version() {
            if force {
                writeln!(
                    out,
                    "WARNING: Report was produced using a different version of margay ctl. Ignoring due to --force option"
                )?;
            } else {
                writeln!(
                    err,
                    "error: the provided report ({}) was produced using a different version ({}) of margay ctl. Refusing to release (--force overrides)",
                    f.display(),
                    r.version
                )?;
                return Ok(EXIT_INVALID);
            }
        }
    }
    // Locking bumps ClusterInformation's version: a report made after locking proves nothing
    // has been assigned since it was written.
    if !reports
        .iter()
        .any(|(_, r)| r.cluster_information_revision == ci.metadata.resource_version)
    {
        writeln!(
            err,
            "error: the provided reports are all stale - at least one should be up-to-date. Please generate a new report while the data store is locked and try again"
        )?;
        return Ok(EXIT_INVALID);
    }
    if ci.spec.datastore_ready != Some(false) {
        if force {
            writeln!(
                out,
                "WARNING: Data store is not locked. Ignoring due to --force option"
            )?;
        } else {
            writeln!(
                err,
                "error: data store is not locked. Either lock the data store (`margay ctl datastore migrate lock`), or re-run with --force"
            )?;
            return Ok(EXIT_INVALID);
        }
    }
    let reports: Vec<Report> = reports.into_iter().map(|(_, r)| r).collect();
    let (ips, handles) = leaked_in_all(&reports);
    let mut failures = 0usize;
    if ips.is_empty() {
        writeln!(out, "Report didn't contain any leaked IPs to clean up.")?;
    } else {
        writeln!(out, "Releasing {} old IPs...", ips.len())?;
        let (mut released, mut gone) = (0usize, 0usize);
        for a in &ips {
            let Ok(ip) = a.ip.parse::<IpAddr>() else {
                writeln!(err, "error: {:?} in the report is not an IP address", a.ip)?;
                failures += 1;
                continue;
            };
            // One address per write: a stale entry (its sequence number moved on) fails alone.
            let release = ReleaseIp {
                ip,
                sequence_number: a.sequence_number,
            };
            match ipam.release_ips(&[release]).await {
                Ok(freed) if freed.contains(&ip) => released += 1,
                Ok(_) => gone += 1,
                Err(e) => {
                    failures += 1;
                    writeln!(
                        err,
                        "An error occurred while releasing {ip}: {e}.  Problems are often caused by an out-of-date IPAM report.  Try regenerating the IPAM report and retry."
                    )?;
                }
            }
        }
        writeln!(out, "Released {released} IPs successfully")?;
        if gone > 0 {
            writeln!(
                out,
                "{gone} addresses marked as leaked in the report had already been cleaned up."
            )?;
        }
    }
    if handles.is_empty() {
        writeln!(out, "Report didn't contain any handles to clean up.")?;
    } else {
        writeln!(out, "Deleting {} handles...", handles.len())?;
        writeln!(
            out,
            "Key: '.' = Deleted OK; 'x' = skip, handle missing/changed."
        )?;
        let (mut deleted, mut skipped, mut errors) = (0usize, 0usize, 0usize);
        for h in &handles {
            let key = margay_ipam::pools::handle_key(&h.id);
            let Ok(revision) = h.revision.parse::<i64>() else {
                write!(out, "x")?;
                skipped += 1;
                continue;
            };
            // Deleted only if untouched since the report.
            match client.backend().delete(&key, Some(revision)).await {
                Ok(_) => {
                    write!(out, ".")?;
                    deleted += 1;
                }
                Err(DatastoreError::NotFound { .. } | DatastoreError::Conflict { .. }) => {
                    write!(out, "x")?;
                    skipped += 1;
                }
                Err(e) => {
                    writeln!(out, "\nDeleting handle {} failed: {e}.", h.id)?;
                    errors += 1;
                }
            }
        }
        writeln!(out)?;
        writeln!(
            out,
            "Released {deleted} handles; {skipped} skipped; {errors} errors."
        )?;
        failures += errors;
    }
    writeln!(out, "You may now unlock the data store.")?;
    Ok(if failures == 0 { EXIT_OK } else { EXIT_INVALID })
}
