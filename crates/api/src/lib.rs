//! The `projectcalico.org/v3` resource model: serde types with Calico's field names, YAML and
//! JSON codecs (multi-document, list kinds), and validation with field-path errors.
//!
//! Decoding is structural: unknown fields, wrong types and unknown enum values are rejected
//! with the path of the offending field. Validation is semantic and reports every problem of a
//! resource at once. Nothing should store or act on a resource that has not passed both.
#![forbid(unsafe_code)]
// Type names follow Calico's kinds exactly (IPPool, BGPPeer) so code reads like the YAML.
#![allow(clippy::upper_case_acronyms)]

pub mod bgp;
mod bounded;
pub mod codec;
pub mod duration;
pub mod endpoint;
pub mod felix;
pub mod ippool;
pub mod k8s;
pub mod kubecontrollers;
pub mod meta;
pub mod net;
pub mod numorstring;
pub mod policy;
pub mod resource;
pub mod suggest;
pub mod validate;
pub mod yaml_out;

pub use codec::{DecodeError, Decoded, DocPosition, SyntaxError, decode_documents, decode_one};
pub use meta::ObjectMeta;
pub use resource::{
    API_VERSION, BGPConfiguration, BGPFilter, BGPPeer, ClusterInformation, FelixConfiguration,
    GlobalNetworkPolicy, GlobalNetworkSet, HostEndpoint, IPAMConfiguration, IPPool, IPReservation,
    Kind, KubeControllersConfiguration, NetworkPolicy, NetworkSet, Node, Profile, Resource,
    ResourceKey, Tier, WorkloadEndpoint,
};
pub use validate::{FieldError, ValidationErrors};
