//! The backend conformance suite against the in-memory backend.

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mem_backend_conforms() {
    let b = margay_datastore::MemBackend::new();
    common::run_all(&b, "/conformance/mem/").await;
}
