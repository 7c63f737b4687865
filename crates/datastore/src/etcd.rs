//! etcd v3 backend (being written).
