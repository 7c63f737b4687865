//! Per-endpoint status files: Felix writes one when an endpoint's policy is in the kernel and
//! removes it when the endpoint goes, so the CNI plugin can wait for policy before it lets a
//! pod start (Calico's EndpointStatusPathPrefix/endpoint-status, same names and content).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use margay_calc::{DataplaneModel, WorkloadEndpointData, WorkloadEndpointId};
use serde::Serialize;

/// The directory under EndpointStatusPathPrefix.
pub const STATUS_SUBDIR: &str = "endpoint-status";

/// Content of one file (Calico's field names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndpointStatusFile {
    #[serde(rename = "ifaceName", skip_serializing_if = "String::is_empty")]
    pub iface_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(rename = "ipv4Nets", skip_serializing_if = "Vec::is_empty")]
    pub ipv4_nets: Vec<String>,
    #[serde(rename = "ipv6Nets", skip_serializing_if = "Vec::is_empty")]
    pub ipv6_nets: Vec<String>,
}

/// `<orchestrator> <workload> <endpoint>`, each path-escaped (Calico's file name).
pub fn file_name(id: &WorkloadEndpointId) -> String {
    margay_api::endpoint::endpoint_status_file_name(&id.orchestrator, &id.workload, &id.endpoint)
}

fn content(ep: &WorkloadEndpointData) -> EndpointStatusFile {
    EndpointStatusFile {
        iface_name: ep.interface.clone(),
        mac: ep.mac.clone(),
        ipv4_nets: ep.ipv4_nets.iter().map(|c| c.to_string()).collect(),
        ipv6_nets: ep.ipv6_nets.iter().map(|c| c.to_string()).collect(),
    }
}

/// Keeps the directory equal to the model's workload endpoints.
#[derive(Debug)]
pub struct StatusFiles {
    dir: PathBuf,
    written: BTreeMap<String, String>,
    reconciled: bool,
}

impl StatusFiles {
    pub fn new(prefix: &Path) -> StatusFiles {
        StatusFiles {
            dir: prefix.join(STATUS_SUBDIR),
            written: BTreeMap::new(),
            reconciled: false,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes new and changed files, removes stale ones (on the first call: every file in the
    /// directory that no endpoint accounts for).
    pub fn sync(&mut self, model: &DataplaneModel) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let mut desired: BTreeMap<String, String> = BTreeMap::new();
        for (id, ep) in &model.workload_endpoints {
            let json = serde_json::to_string(&content(ep)).unwrap_or_default();
            desired.insert(file_name(id), json);
        }
        if !self.reconciled {
            let mut present = BTreeSet::new();
            for entry in std::fs::read_dir(&self.dir)? {
                let entry = entry?;
                present.insert(entry.file_name().to_string_lossy().into_owned());
            }
            for name in &present {
                if !desired.contains_key(name) {
                    let _ = std::fs::remove_file(self.dir.join(name));
                }
            }
            self.written.clear();
            self.reconciled = true;
        }
        for (name, json) in &desired {
            if self.written.get(name) != Some(json) {
                // Written whole then renamed, so a reader never sees half a file.
                let tmp = self.dir.join(format!(".{name}.tmp"));
                std::fs::write(&tmp, json)?;
                std::fs::rename(&tmp, self.dir.join(name))?;
                self.written.insert(name.clone(), json.clone());
            }
        }
        let stale: Vec<String> = self
            .written
            .keys()
            .filter(|k| !desired.contains_key(*k))
            .cloned()
            .collect();
        for name in stale {
            match std::fs::remove_file(self.dir.join(&name)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            self.written.remove(&name);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_calico() {
        let id = WorkloadEndpointId {
            orchestrator: "k8s".into(),
            workload: "default/nginx-1".into(),
            endpoint: "eth0".into(),
        };
        assert_eq!(file_name(&id), "k8s default%2Fnginx-1 eth0");
    }
}
