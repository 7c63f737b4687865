//! The backend conformance suite against the in-memory backend.

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mem_backend_conforms() {
    let b = margay_datastore::MemBackend::new();
    common::run_all(&b, "/conformance/mem/").await;
}

#[tokio::test]
async fn client_apply_creates_updates_and_honours_a_given_version() {
    use margay_api::{ObjectMeta, Resource, Tier};
    use margay_datastore::{Applied, Client, DatastoreError};
    let c = Client::new(margay_datastore::MemBackend::new());
    let tier = |order: f64| {
        let spec = margay_api::policy::TierSpec {
            order: Some(order),
            ..Default::default()
        };
        Resource::Tier(Tier::new(ObjectMeta::named("t"), spec))
    };
    let (created, how) = c.apply(tier(1.0)).await.unwrap();
    assert_eq!(how, Applied::Created);
    assert_eq!(c.apply(tier(1.0)).await.unwrap().1, Applied::Unchanged);
    let (updated, how) = c.apply(tier(2.0)).await.unwrap();
    assert_eq!(how, Applied::Updated);
    assert_eq!(
        updated.metadata().uid,
        created.metadata().uid,
        "uid kept across updates"
    );
    // A stale version given by the caller loses.
    let mut stale = tier(3.0);
    stale.metadata_mut().resource_version = created.metadata().resource_version.clone();
    assert!(matches!(
        c.apply(stale).await,
        Err(DatastoreError::Conflict { .. })
    ));
}
