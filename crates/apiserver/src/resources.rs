//! What the server serves: the built-in resources, the Calico CRDs, and how a
//! CustomResourceDefinition object becomes a served resource. Pure.

use serde_json::{Value, json};

use crate::status::{Cause, ErrCtx};

/// Verbs of an ordinary resource.
pub const ALL_VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// One served resource (a group, a plural, its versions and names).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceDef {
    pub group: String,
    /// Served versions, preferred (storage) first.
    pub versions: Vec<String>,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Has a `/status` subresource.
    pub status: bool,
    /// A kind compiled into Kubernetes (strategic merge patch works; unconditional update allowed).
    pub builtin: bool,
    /// Extra table columns from the CRD (`name`, `type`, `jsonPath`, `priority`) per version.
    pub printer_columns: Vec<Value>,
    /// Fields a field selector may use besides `metadata.name` / `metadata.namespace`.
    pub field_labels: Vec<&'static str>,
}

impl ResourceDef {
    pub fn key(&self) -> String {
        gr_key(&self.group, &self.plural)
    }
    pub fn version(&self) -> &str {
        self.versions.first().map(String::as_str).unwrap_or("v1")
    }
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }
    pub fn ctx(&self) -> ErrCtx<'_> {
        ErrCtx {
            group: &self.group,
            plural: &self.plural,
            kind: &self.kind,
        }
    }
    /// Whether writes bump `metadata.generation` on spec changes (custom resources, CRDs and
    /// the built-ins that carry one).
    pub fn has_generation(&self) -> bool {
        !self.builtin
            || matches!(
                self.kind.as_str(),
                "CustomResourceDefinition"
                    | "NetworkPolicy"
                    | "DaemonSet"
                    | "Deployment"
                    | "PodDisruptionBudget"
            )
    }
    pub fn field_supported(&self, f: &str) -> bool {
        f == "metadata.name" || f == "metadata.namespace" || self.field_labels.contains(&f)
    }
}

/// The map key of a resource: `group/plural` (`/pods` for core).
pub fn gr_key(group: &str, plural: &str) -> String {
    format!("{group}/{plural}")
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    short: &[&str],
    all: bool,
    status: bool,
    field_labels: Vec<&'static str>,
) -> ResourceDef {
    ResourceDef {
        group: group.into(),
        versions: vec!["v1".into()],
        plural: plural.into(),
        singular: kind.to_ascii_lowercase(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        namespaced,
        short_names: short.iter().map(|s| s.to_string()).collect(),
        categories: if all { vec!["all".into()] } else { vec![] },
        status,
        builtin: true,
        printer_columns: vec![],
        field_labels,
    }
}

/// The built-in resources, in discovery order (group order matters: kubectl resolves an
/// ambiguous plural to the first group listing it).
pub fn builtins() -> Vec<ResourceDef> {
    vec![
        builtin(
            "",
            "namespaces",
            "Namespace",
            false,
            &["ns"],
            false,
            true,
            vec!["status.phase"],
        ),
        builtin(
            "",
            "nodes",
            "Node",
            false,
            &["no"],
            false,
            true,
            vec!["spec.unschedulable"],
        ),
        builtin(
            "",
            "pods",
            "Pod",
            true,
            &["po"],
            true,
            true,
            vec![
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ],
        ),
        builtin(
            "",
            "serviceaccounts",
            "ServiceAccount",
            true,
            &["sa"],
            false,
            false,
            vec![],
        ),
        builtin(
            "",
            "services",
            "Service",
            true,
            &["svc"],
            true,
            true,
            vec![],
        ),
        builtin(
            "",
            "endpoints",
            "Endpoints",
            true,
            &["ep"],
            false,
            false,
            vec![],
        ),
        builtin(
            "",
            "configmaps",
            "ConfigMap",
            true,
            &["cm"],
            false,
            false,
            vec![],
        ),
        builtin(
            "",
            "events",
            "Event",
            true,
            &["ev"],
            false,
            false,
            vec![
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ],
        ),
        builtin(
            "",
            "secrets",
            "Secret",
            true,
            &[],
            false,
            false,
            vec!["type"],
        ),
        // Workloads, disruption budgets and RBAC: served so that deployment manifests (margay's
        // `deploy/`) apply; stored like any object (no controllers, no authorization). Group
        // order as a real server lists them: apps before networking, policy and RBAC after.
        builtin(
            "apps",
            "daemonsets",
            "DaemonSet",
            true,
            &["ds"],
            true,
            true,
            vec![],
        ),
        builtin(
            "apps",
            "deployments",
            "Deployment",
            true,
            &["deploy"],
            true,
            true,
            vec![],
        ),
        builtin(
            "networking.k8s.io",
            "networkpolicies",
            "NetworkPolicy",
            true,
            &["netpol"],
            false,
            false,
            vec![],
        ),
        builtin(
            "policy",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            true,
            &["pdb"],
            false,
            true,
            vec![],
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "clusterroles",
            "ClusterRole",
            false,
            &[],
            false,
            false,
            vec![],
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
            &[],
            false,
            false,
            vec![],
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "roles",
            "Role",
            true,
            &[],
            false,
            false,
            vec![],
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "rolebindings",
            "RoleBinding",
            true,
            &[],
            false,
            false,
            vec![],
        ),
        builtin(
            "discovery.k8s.io",
            "endpointslices",
            "EndpointSlice",
            true,
            &[],
            false,
            false,
            vec![],
        ),
        builtin(
            "coordination.k8s.io",
            "leases",
            "Lease",
            true,
            &[],
            false,
            false,
            vec![],
        ),
        ResourceDef {
            singular: "customresourcedefinition".into(),
            ..builtin(
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                "CustomResourceDefinition",
                false,
                &["crd", "crds"],
                false,
                true,
                vec![],
            )
        },
    ]
}

/// Calico's `crd.projectcalico.org/v1` kinds: (Kind, plural, namespaced, status subresource).
pub const CALICO_KINDS: [(&str, &str, bool, bool); 22] = [
    ("BGPConfiguration", "bgpconfigurations", false, false),
    ("BGPFilter", "bgpfilters", false, false),
    ("BGPPeer", "bgppeers", false, false),
    ("BlockAffinity", "blockaffinities", false, false),
    ("CalicoNodeStatus", "caliconodestatuses", false, true),
    ("ClusterInformation", "clusterinformations", false, false),
    ("FelixConfiguration", "felixconfigurations", false, false),
    ("GlobalNetworkPolicy", "globalnetworkpolicies", false, false),
    ("GlobalNetworkSet", "globalnetworksets", false, false),
    ("HostEndpoint", "hostendpoints", false, false),
    ("IPAMBlock", "ipamblocks", false, false),
    ("IPAMConfig", "ipamconfigs", false, false),
    ("IPAMHandle", "ipamhandles", false, false),
    ("IPPool", "ippools", false, true),
    ("IPReservation", "ipreservations", false, false),
    (
        "KubeControllersConfiguration",
        "kubecontrollersconfigurations",
        false,
        true,
    ),
    ("NetworkPolicy", "networkpolicies", true, false),
    ("NetworkSet", "networksets", true, false),
    (
        "StagedGlobalNetworkPolicy",
        "stagedglobalnetworkpolicies",
        false,
        false,
    ),
    (
        "StagedKubernetesNetworkPolicy",
        "stagedkubernetesnetworkpolicies",
        true,
        false,
    ),
    ("StagedNetworkPolicy", "stagednetworkpolicies", true, false),
    ("Tier", "tiers", false, true),
];

pub const CALICO_GROUP: &str = "crd.projectcalico.org";

/// The CustomResourceDefinition objects Calico's manifests install (schemas open:
/// `x-kubernetes-preserve-unknown-fields`).
pub fn calico_crds() -> Vec<Value> {
    CALICO_KINDS
        .iter()
        .map(|(kind, plural, namespaced, status)| {
            let mut version = json!({
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            });
            if *status {
                version["subresources"] = json!({"status": {}});
            }
            json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("{plural}.{CALICO_GROUP}")},
                "spec": {
                    "group": CALICO_GROUP,
                    "names": {
                        "kind": kind,
                        "listKind": format!("{kind}List"),
                        "plural": plural,
                        "singular": kind.to_ascii_lowercase(),
                    },
                    "scope": if *namespaced { "Namespaced" } else { "Cluster" },
                    "versions": [version],
                },
            })
        })
        .collect()
}

fn str_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Validates a CRD object and derives the resource it serves (422 causes otherwise).
pub fn crd_to_def(crd: &Value) -> Result<ResourceDef, Vec<Cause>> {
    let mut causes = Vec::new();
    let spec = crd.get("spec").cloned().unwrap_or(Value::Null);
    let s = |p: &str| {
        spec.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let group = s("/group");
    let plural = s("/names/plural");
    let kind = s("/names/kind");
    let scope = s("/scope");
    if group.is_empty() {
        causes.push(Cause::required("spec.group", ""));
    } else if !group.contains('.') {
        causes.push(Cause::invalid(
            "spec.group",
            &group,
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        causes.push(Cause::required("spec.names.plural", ""));
    } else if !crate::util::is_dns1123_label(&plural) {
        causes.push(Cause::invalid(
            "spec.names.plural",
            &plural,
            "a lowercase RFC 1123 label",
        ));
    }
    if kind.is_empty() {
        causes.push(Cause::required("spec.names.kind", ""));
    }
    if scope != "Namespaced" && scope != "Cluster" {
        causes.push(Cause {
            reason: "FieldValueNotSupported",
            field: "spec.scope".into(),
            message: format!(
                "Unsupported value: \"{scope}\": supported values: \"Cluster\", \"Namespaced\""
            ),
        });
    }
    let name = crd
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        causes.push(Cause::invalid(
            "metadata.name",
            name,
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        causes.push(Cause::required(
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
    }
    let storage: Vec<&Value> = versions
        .iter()
        .filter(|v| v.get("storage") == Some(&Value::Bool(true)))
        .collect();
    if !versions.is_empty() && storage.len() != 1 {
        causes.push(Cause::invalid(
            "spec.versions",
            "",
            "must have exactly one version marked as storage version",
        ));
    }
    if !causes.is_empty() {
        return Err(causes);
    }
    // Served versions, the storage version first.
    let mut served: Vec<&Value> = versions
        .iter()
        .filter(|v| v.get("served") == Some(&Value::Bool(true)))
        .collect();
    served.sort_by_key(|v| v.get("storage") != Some(&Value::Bool(true)));
    let status = served
        .first()
        .is_some_and(|v| v.pointer("/subresources/status").is_some());
    let printer_columns = served
        .first()
        .and_then(|v| v.get("additionalPrinterColumns"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let singular = match s("/names/singular") {
        x if x.is_empty() => kind.to_ascii_lowercase(),
        x => x,
    };
    let list_kind = match s("/names/listKind") {
        x if x.is_empty() => format!("{kind}List"),
        x => x,
    };
    Ok(ResourceDef {
        group,
        versions: served
            .iter()
            .filter_map(|v| v.get("name").and_then(Value::as_str).map(String::from))
            .collect(),
        plural,
        singular,
        kind,
        list_kind,
        namespaced: scope == "Namespaced",
        short_names: str_list(spec.pointer("/names/shortNames")),
        categories: str_list(spec.pointer("/names/categories")),
        status,
        builtin: false,
        printer_columns,
        field_labels: vec![],
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn calico_crds_derive_their_resources() {
        let crds = calico_crds();
        assert_eq!(crds.len(), 22);
        let defs: Vec<ResourceDef> = crds.iter().map(|c| crd_to_def(c).unwrap()).collect();
        let pool = defs.iter().find(|d| d.plural == "ippools").unwrap();
        assert_eq!(
            (
                pool.kind.as_str(),
                pool.namespaced,
                pool.status,
                pool.builtin
            ),
            ("IPPool", false, true, false)
        );
        let np = defs.iter().find(|d| d.plural == "networkpolicies").unwrap();
        assert!(np.namespaced && !np.status);
        assert_eq!(np.list_kind, "NetworkPolicyList");
        assert_eq!(defs.iter().filter(|d| d.namespaced).count(), 4);
        assert_eq!(defs.iter().filter(|d| d.status).count(), 4);
    }

    #[test]
    fn builtins_serve_what_kubectl_and_calico_use() {
        let b = builtins();
        let find = |p: &str| b.iter().find(|d| d.plural == p).unwrap();
        assert!(find("events").field_supported("involvedObject.name"));
        assert_eq!(find("leases").group, "coordination.k8s.io");
        assert_eq!(find("pods").short_names, ["po"]);
        assert!(find("pods").field_supported("spec.nodeName"));
        assert!(!find("pods").field_supported("spec.bogus"));
        assert_eq!(find("services").categories, ["all"]);
        assert!(!find("nodes").namespaced);
        // What deployment manifests use, with the real server's scopes and names.
        let ds = find("daemonsets");
        assert_eq!(
            (
                ds.group.as_str(),
                ds.kind.as_str(),
                ds.namespaced,
                ds.status
            ),
            ("apps", "DaemonSet", true, true)
        );
        assert_eq!(ds.short_names, ["ds"]);
        assert_eq!(ds.categories, ["all"]);
        assert!(ds.has_generation());
        let deploy = find("deployments");
        assert_eq!(deploy.short_names, ["deploy"]);
        assert!(deploy.namespaced && deploy.status && deploy.has_generation());
        let pdb = find("poddisruptionbudgets");
        assert_eq!(
            (pdb.group.as_str(), pdb.namespaced, pdb.status),
            ("policy", true, true)
        );
        assert_eq!(pdb.short_names, ["pdb"]);
        assert!(pdb.categories.is_empty());
        for (plural, kind, namespaced) in [
            ("clusterroles", "ClusterRole", false),
            ("clusterrolebindings", "ClusterRoleBinding", false),
            ("roles", "Role", true),
            ("rolebindings", "RoleBinding", true),
        ] {
            let d = find(plural);
            assert_eq!(
                (d.group.as_str(), d.kind.as_str(), d.namespaced, d.status),
                ("rbac.authorization.k8s.io", kind, namespaced, false)
            );
            assert!(d.short_names.is_empty() && d.categories.is_empty());
            assert!(!d.has_generation());
        }
        // kubectl resolves an ambiguous plural to the first group: no two built-ins share one.
        let mut plurals: Vec<&str> = b.iter().map(|d| d.plural.as_str()).collect();
        plurals.sort_unstable();
        plurals.dedup();
        assert_eq!(plurals.len(), b.len());
    }

    #[test]
    fn bad_crds_are_invalid() {
        let mut c = calico_crds().remove(0);
        c["metadata"]["name"] = json!("wrong");
        c["spec"]["scope"] = json!("Galaxy");
        let causes = crd_to_def(&c).unwrap_err();
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["spec.scope", "metadata.name"]);
    }
}
