//! What a running lab consists of, persisted as JSON so any later command (and `down` after a
//! crash) can find it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::topology::{PodSpec, Topology};

/// Default parent of every lab's directory.
pub const DEFAULT_STATE_ROOT: &str = "/var/run/margay/lab";
/// The fabric's subnet: the bridge is .1, nodes are .11, .12, ...
pub const FABRIC_PREFIX: &str = "172.30.0";
pub const POD_CIDR: &str = "10.244.0.0/16";
/// `--ipv6`: the fabric's IPv6 subnet (/64; the bridge is ::1, nodes ::11, ::12, ...).
pub const FABRIC_PREFIX_V6: &str = "fd00:172:30::";
/// `--ipv6`: the pods' IPv6 pool (Calico's default block size /122 inside it).
pub const POD_CIDR_V6: &str = "fd00:10:244::/64";
/// The simulated top-of-rack router's address on the fabric (`--tor`).
pub const TOR_IP: &str = "172.30.0.2";
/// The nodes' AS number (Calico's default).
pub const NODE_AS: u32 = 64512;

/// The simulated top-of-rack router: a namespace on the fabric running BIRD with its own AS,
/// peering with every node (eBGP).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TorState {
    pub netns: String,
    pub ip: String,
    pub asn: u32,
    /// `--ipv6`: its IPv6 address on the fabric (a second BIRD peers with the nodes over it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip6: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    pub name: String,
    pub netns: String,
    pub ip: String,
    /// `--ipv6`: its IPv6 address on the fabric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip6: Option<String>,
    /// `lab node stop` stopped its roles (Felix, and confd and BIRD with --backend bird);
    /// `lab node start` runs them again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodState {
    /// `namespace/name`.
    pub id: String,
    pub netns: String,
    pub node: String,
    pub container_id: String,
    pub ip: Option<String>,
    /// `--ipv6`: its IPv6 address (the CNI plugin gives a pod one address of each family).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip6: Option<String>,
}

impl PodState {
    /// A pod of lab `lab` (namespace prefix `prefix`); `sandbox` tells the container IDs of
    /// pods added later apart from earlier pods of the same name (a kubelet makes a new
    /// sandbox ID for every pod).
    pub fn new(prefix: &str, lab: &str, p: &PodSpec, sandbox: &str) -> PodState {
        PodState {
            id: p.id(),
            netns: format!("{prefix}{}-{}", p.namespace, p.name),
            node: p.node.clone(),
            container_id: format!("lab{lab}{}{}{sandbox}", p.namespace, p.name).replace('-', ""),
            ip: None,
            ip6: None,
        }
    }

    /// Where its `margay lab serve` keeps its pid file and log (`<base>.pid`, `<base>.log`).
    pub fn file_base(&self) -> String {
        self.id.replace('/', "-")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabState {
    pub name: String,
    pub dir: PathBuf,
    /// Namespace name prefix (`mgy-<name>-`).
    pub prefix: String,
    /// `local`, `etcd` or `kubernetes`.
    pub datastore: String,
    pub backend: String,
    /// Felix's dataplane: empty (nftables) or `bpf`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dataplane: String,
    pub topology: Topology,
    pub nodes: Vec<NodeState>,
    pub pods: Vec<PodState>,
    /// With `--backend bird --tor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tor: Option<TorState>,
    /// `--ipv6`: dual-stack (IPv6 on the fabric, an IPv6 pool, pods with both families).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ipv6: bool,
}

impl LabState {
    pub fn new(
        name: &str,
        dir: &Path,
        datastore: &str,
        backend: &str,
        topology: Topology,
    ) -> LabState {
        let prefix = format!("mgy-{name}-");
        let nodes = topology
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| NodeState {
                name: n.clone(),
                netns: format!("{prefix}{n}"),
                ip: format!("{FABRIC_PREFIX}.{}", 11 + i),
                ip6: None,
                stopped: false,
            })
            .collect();
        let pods = topology
            .pods
            .iter()
            .map(|p| PodState::new(&prefix, name, p, ""))
            .collect();
        LabState {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            prefix,
            datastore: datastore.to_string(),
            backend: backend.to_string(),
            dataplane: String::new(),
            topology,
            nodes,
            pods,
            tor: None,
            ipv6: false,
        }
    }

    /// Makes the lab dual-stack: every node gets its IPv6 fabric address.
    pub fn with_ipv6(mut self) -> LabState {
        self.ipv6 = true;
        for (i, n) in self.nodes.iter_mut().enumerate() {
            n.ip6 = Some(format!("{FABRIC_PREFIX_V6}{}", 11 + i));
        }
        if let Some(tor) = &mut self.tor {
            tor.ip6 = Some(format!("{FABRIC_PREFIX_V6}2"));
        }
        self
    }

    /// Adds the top-of-rack router (`mgy-<lab>-tor`) with its AS number.
    pub fn with_tor(mut self, asn: u32) -> LabState {
        self.tor = Some(TorState {
            netns: format!("{}tor", self.prefix),
            ip: TOR_IP.to_string(),
            asn,
            ip6: None,
        });
        self
    }

    pub fn tor_dir(&self) -> PathBuf {
        self.dir.join("tor")
    }

    /// A node's BIRD control socket (BGP backend).
    pub fn bird_socket(&self, node: &str) -> PathBuf {
        self.node_dir(node).join("bird.ctl")
    }

    /// A dual-stack node's IPv6 BIRD control socket (BGP backend with `--ipv6`).
    pub fn bird6_socket(&self, node: &str) -> PathBuf {
        self.node_dir(node).join("bird6.ctl")
    }

    pub fn fabric_netns(&self) -> String {
        format!("{}fabric", self.prefix)
    }

    pub fn state_file(dir: &Path) -> PathBuf {
        dir.join("state.json")
    }

    pub fn load(dir: &Path) -> std::io::Result<LabState> {
        let text = std::fs::read_to_string(Self::state_file(dir))?;
        serde_json::from_str(&text)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    pub fn save(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join("state.json.tmp");
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(tmp, Self::state_file(&self.dir))
    }

    /// The kubeconfig of the lab's API server (`--datastore kubernetes`): the same file for
    /// every component and for kubectl.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    pub fn is_kubernetes(&self) -> bool {
        self.datastore == "kubernetes"
    }

    /// The datastore as environment variables (the same for every process of the lab).
    pub fn datastore_env(&self) -> Vec<(String, String)> {
        match self.datastore.as_str() {
            "kubernetes" => vec![
                ("DATASTORE_TYPE".into(), "kubernetes".into()),
                ("KUBECONFIG".into(), self.kubeconfig().display().to_string()),
            ],
            "etcd" => vec![
                ("DATASTORE_TYPE".into(), "etcdv3".into()),
                (
                    "ETCD_ENDPOINTS".into(),
                    format!("http://{FABRIC_PREFIX}.1:2379"),
                ),
            ],
            _ => vec![
                ("DATASTORE_TYPE".into(), "local".into()),
                (
                    "DATASTORE_PATH".into(),
                    self.dir.join("store.db").display().to_string(),
                ),
            ],
        }
    }

    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.dir.join("nodes").join(node)
    }

    pub fn pod(&self, id: &str) -> Option<&PodState> {
        self.pods.iter().find(|p| p.id == id)
    }

    pub fn node(&self, name: &str) -> Option<&NodeState> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Every pid file of the lab's supervised processes.
    pub fn pid_files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for sub in [
            "nodes",
            "pods",
            "etcd",
            "tor",
            "apiserver",
            "kube-controllers",
        ] {
            collect_pid_files(&self.dir.join(sub), &mut out);
        }
        out
    }
}

fn collect_pid_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect_pid_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "pid") {
            out.push(p);
        }
    }
}

/// A lab name: short, lower-case letters and digits (it becomes part of namespace names).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 10
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(format!(
            "lab name {name:?} must be 1-10 lower-case letters or digits"
        ));
    }
    Ok(())
}
