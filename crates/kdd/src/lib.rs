//! Calico's Kubernetes datastore (KDD) mapping, pure: values in, values out.
#![forbid(unsafe_code)]
