//! An in-process Kubernetes API server double (test-only and lab use).
#![forbid(unsafe_code)]
