//! The lab's declarative topology (pure): nodes, namespaces with labels, pods.
//!
//! ```yaml
//! nodes: [node1, node2]
//! namespaces:
//!   - {name: x, labels: {team: red}}
//! pods:
//!   - {name: a, namespace: x, node: node1, labels: {pod: a}, tcp: [80, 81], udp: [80, 81]}
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub nodes: Vec<String>,
    #[serde(default)]
    pub namespaces: Vec<NamespaceSpec>,
    #[serde(default)]
    pub pods: Vec<PodSpec>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceSpec {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    /// Empty: spread over the nodes in order.
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub tcp: Vec<u16>,
    #[serde(default)]
    pub udp: Vec<u16>,
}

impl PodSpec {
    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("topology file: {0}")]
    Parse(String),
    #[error("topology: {0}")]
    Invalid(String),
}

/// Kubernetes' network-policy test model: namespaces x, y, z; pods a, b, c in each (label
/// `pod=<name>`), every pod serving TCP and UDP on 80 and 81; spread over `nodes` nodes.
pub fn default_topology(nodes: usize) -> Topology {
    let nodes: Vec<String> = (1..=nodes.max(1)).map(|i| format!("node{i}")).collect();
    let mut pods = Vec::new();
    let mut i = 0;
    for ns in ["x", "y", "z"] {
        for pod in ["a", "b", "c"] {
            pods.push(PodSpec {
                name: pod.into(),
                namespace: ns.into(),
                node: nodes[i % nodes.len()].clone(),
                labels: BTreeMap::from([("pod".to_string(), pod.to_string())]),
                tcp: vec![80, 81],
                udp: vec![80, 81],
            });
            i += 1;
        }
    }
    Topology {
        nodes,
        namespaces: ["x", "y", "z"]
            .iter()
            .map(|n| NamespaceSpec {
                name: n.to_string(),
                labels: BTreeMap::from([("ns".to_string(), n.to_string())]),
            })
            .collect(),
        pods,
    }
}

fn dns_label(kind: &str, s: &str) -> Result<(), TopologyError> {
    let ok = !s.is_empty()
        && s.len() <= 20
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(TopologyError::Invalid(format!(
            "{kind} name {s:?} must be 1-20 lower-case letters, digits or '-' (it becomes part of namespace and interface names)"
        )))
    }
}

impl Topology {
    pub fn parse(text: &str) -> Result<Topology, TopologyError> {
        let mut t: Topology =
            serde_norway::from_str(text).map_err(|e| TopologyError::Parse(e.to_string()))?;
        t.fill_in()?;
        Ok(t)
    }

    /// Checks names and references; spreads pods without a node; adds namespaces that pods
    /// use but the file does not list.
    pub fn fill_in(&mut self) -> Result<(), TopologyError> {
        if self.nodes.is_empty() {
            return Err(TopologyError::Invalid("at least one node is needed".into()));
        }
        if self.nodes.len() > 50 {
            return Err(TopologyError::Invalid("at most 50 nodes".into()));
        }
        let mut seen = BTreeSet::new();
        for n in &self.nodes {
            dns_label("node", n)?;
            if !seen.insert(n.clone()) {
                return Err(TopologyError::Invalid(format!(
                    "node {n:?} is listed twice"
                )));
            }
        }
        let mut namespaces: BTreeSet<String> = BTreeSet::new();
        for ns in &self.namespaces {
            dns_label("namespace", &ns.name)?;
            if !namespaces.insert(ns.name.clone()) {
                return Err(TopologyError::Invalid(format!(
                    "namespace {:?} is listed twice",
                    ns.name
                )));
            }
        }
        let mut pods = BTreeSet::new();
        for (i, p) in self.pods.iter_mut().enumerate() {
            dns_label("pod", &p.name)?;
            dns_label("namespace", &p.namespace)?;
            if !pods.insert(p.id()) {
                return Err(TopologyError::Invalid(format!(
                    "pod {} is listed twice",
                    p.id()
                )));
            }
            if p.node.is_empty() {
                p.node = self.nodes[i % self.nodes.len()].clone();
            } else if !self.nodes.contains(&p.node) {
                return Err(TopologyError::Invalid(format!(
                    "pod {} is on node {:?}, which is not in nodes {:?}",
                    p.id(),
                    p.node,
                    self.nodes
                )));
            }
            if !namespaces.contains(&p.namespace) {
                namespaces.insert(p.namespace.clone());
                self.namespaces.push(NamespaceSpec {
                    name: p.namespace.clone(),
                    labels: BTreeMap::new(),
                });
            }
        }
        Ok(())
    }

    pub fn pod(&self, id: &str) -> Option<&PodSpec> {
        self.pods.iter().find(|p| p.id() == id)
    }

    /// Adds a pod to a running lab's topology, checked as a topology file's pods are (its
    /// namespace is added when new); nothing changes when it is refused.
    pub fn add_pod(&mut self, pod: PodSpec) -> Result<(), TopologyError> {
        if pod.node.is_empty() {
            return Err(TopologyError::Invalid(format!(
                "pod {} needs a node",
                pod.id()
            )));
        }
        let mut next = self.clone();
        next.pods.push(pod);
        next.fill_in()?;
        *self = next;
        Ok(())
    }

    /// Adds a namespace unless it is listed already.
    pub fn add_namespace(&mut self, ns: NamespaceSpec) -> Result<(), TopologyError> {
        dns_label("namespace", &ns.name)?;
        if !self.namespaces.iter().any(|n| n.name == ns.name) {
            self.namespaces.push(ns);
        }
        Ok(())
    }

    pub fn remove_pod(&mut self, id: &str) {
        self.pods.retain(|p| p.id() != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_the_kubernetes_model() {
        let t = default_topology(2);
        assert_eq!(t.nodes, vec!["node1", "node2"]);
        assert_eq!(t.pods.len(), 9);
        assert_eq!(t.pods.iter().filter(|p| p.node == "node1").count(), 5);
        assert!(
            t.pods
                .iter()
                .all(|p| p.tcp == vec![80, 81] && p.udp == vec![80, 81])
        );
        assert_eq!(t.pods[4].id(), "y/b");
    }

    #[test]
    fn parse_fills_in_and_checks() {
        let t = Topology::parse(
            "nodes: [n1, n2]\npods:\n  - {name: web, namespace: prod, tcp: [80]}\n  - {name: db, namespace: prod, node: n1}\n",
        )
        .unwrap();
        assert_eq!(t.pods[0].node, "n1");
        assert_eq!(t.namespaces[0].name, "prod");
        assert!(Topology::parse("nodes: [n1]\npods: [{name: a, namespace: x, node: n9}]").is_err());
        assert!(Topology::parse("nodes: [N1]").is_err());
        assert!(Topology::parse("nodes: [n1]\nbogus: 1").is_err());
    }

    #[test]
    fn pods_are_added_as_a_file_would_list_them() {
        let mut t = default_topology(2);
        let pod = |ns: &str, name: &str, node: &str| PodSpec {
            name: name.into(),
            namespace: ns.into(),
            node: node.into(),
            labels: BTreeMap::new(),
            tcp: vec![80],
            udp: vec![],
        };
        t.add_pod(pod("w", "d", "node2")).unwrap();
        assert_eq!(t.pod("w/d").unwrap().node, "node2");
        assert!(
            t.namespaces.iter().any(|n| n.name == "w"),
            "namespace added"
        );
        let before = t.clone();
        for bad in [
            pod("w", "d", "node1"),
            pod("w", "e", "node9"),
            pod("w", "E", "node1"),
            pod("w", "e", ""),
        ] {
            assert!(t.add_pod(bad).is_err());
            assert_eq!(t, before, "a refused pod changes nothing");
        }
        t.remove_pod("w/d");
        assert!(t.pod("w/d").is_none());
    }
}
