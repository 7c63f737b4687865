//! Calico's Kubernetes datastore (KDD) mapping, pure: values in, values out.
//!
//! In the Kubernetes datastore Calico's resources live in the API server: most kinds as
//! `crd.projectcalico.org/v1` custom resources ([`crd`]), IPAM data as IPAMBlock,
//! BlockAffinity, IPAMHandle and IPAMConfig custom resources ([`ipam`]), and some kinds are
//! derived from Kubernetes objects: WorkloadEndpoints from Pods ([`pod`]), Profiles from
//! Namespaces and ServiceAccounts ([`profile`]), Nodes from Kubernetes Nodes ([`node`]) and
//! NetworkPolicies from `networking.k8s.io/v1` NetworkPolicies ([`netpol`]). [`names`] holds
//! the naming rules they share.
//!
//! Kubernetes objects are `serde_json::Value`s as the API server sends them. Nothing here does
//! I/O or reads a clock; the rules and their sources in Calico are in `DESIGN.md`.
#![forbid(unsafe_code)]
// Type names follow Calico's kinds (IPAMBlock, CrdInfo) so code reads like the YAML.
#![allow(clippy::upper_case_acronyms)]

pub mod crd;
pub mod ipam;
pub mod names;
pub mod netpol;
pub mod node;
pub mod pod;
pub mod profile;

mod json;
mod meta;
mod quantity;

/// A Kubernetes object or custom resource that cannot be mapped, naming the object and the
/// field at fault: `Pod default/web-0: metadata.annotations["cni.projectcalico.org/floatingIPs"]:
/// not a JSON list of strings`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {field}: {message}")]
pub struct KddError {
    /// The object, e.g. `IPPool "default-ipv4-ippool"` or `Pod default/web-0`.
    pub object: String,
    /// The field path inside the object (`spec.cidr`), or `<object>` for the whole object.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl KddError {
    pub(crate) fn new(
        object: impl Into<String>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> KddError {
        KddError {
            object: object.into(),
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Results of this crate.
pub type Result<T, E = KddError> = std::result::Result<T, E>;

/// `apiVersion` of Calico's custom resources.
pub const CRD_API_VERSION: &str = "crd.projectcalico.org/v1";
/// The API group of Calico's custom resources.
pub const CRD_GROUP: &str = "crd.projectcalico.org";
/// The version of Calico's custom resources.
pub const CRD_VERSION: &str = "v1";
