//! The backend conformance suite against the embedded SQLite backend.
#![cfg(feature = "local")]

mod common;

use margay_datastore::local::{LocalBackend, LocalOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_backend_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let b = LocalBackend::open(LocalOptions::new(dir.path().join("datastore.db"))).unwrap();
    common::run_all(&b, "/conformance/local/").await;
}
