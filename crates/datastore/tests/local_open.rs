//! Opening the datastore: directories, options, and clear errors for files it cannot use.
#![cfg(feature = "local")]
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use margay_datastore::local::{DEFAULT_PATH, LocalBackend, LocalOptions};
use margay_datastore::{DatastoreError, KvBackend};

fn unavailable_reason(r: margay_datastore::Result<LocalBackend>) -> String {
    match r {
        Err(DatastoreError::Unavailable { reason }) => reason,
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn options_default_to_the_system_path() {
    let o = LocalOptions::default();
    assert_eq!(o.path, std::path::PathBuf::from(DEFAULT_PATH));
    assert!(!o.synchronous_full);
    assert!(o.retain_revisions > 0);
    assert!(o.poll_interval <= Duration::from_millis(50));
    assert_eq!(
        LocalOptions::new("/x/y.db").path,
        std::path::PathBuf::from("/x/y.db")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_missing_directories_and_honours_full_sync() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a/b/c/datastore.db");
    let mut opts = LocalOptions::new(&path);
    opts.synchronous_full = true;
    let b = LocalBackend::open(opts).unwrap();
    assert_eq!(b.path(), path);
    let kv = b.create("/k", b"v".to_vec(), None).await.unwrap();
    assert_eq!(b.get("/k").await.unwrap(), Some(kv));
    assert!(path.exists());
    assert!(format!("{b:?}").contains("datastore.db"));
}

#[test]
fn a_parent_that_is_a_file_is_reported_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let path = file.join("datastore.db");
    let reason = unavailable_reason(LocalBackend::open(LocalOptions::new(&path)));
    assert!(reason.contains(&path.display().to_string()), "{reason}");
    assert!(reason.contains("DATASTORE_PATH"), "{reason}");
}

#[test]
fn a_file_that_is_not_a_database_is_refused_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("datastore.db");
    std::fs::write(&path, vec![0x5a; 64 * 1024]).unwrap();
    let reason = unavailable_reason(LocalBackend::open(LocalOptions::new(&path)));
    assert!(reason.contains(&path.display().to_string()), "{reason}");
    assert!(reason.contains("not a margay datastore"), "{reason}");
    // The file was left alone.
    assert_eq!(std::fs::read(&path).unwrap(), vec![0x5a; 64 * 1024]);
}

#[test]
fn a_schema_from_a_newer_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("datastore.db");
    drop(LocalBackend::open(LocalOptions::new(&path)).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "UPDATE meta SET value = 999 WHERE name = 'schema_version'",
        [],
    )
    .unwrap();
    drop(conn);
    let reason = unavailable_reason(LocalBackend::open(LocalOptions::new(&path)));
    assert!(reason.contains("newer margay"), "{reason}");
    assert!(reason.contains(&path.display().to_string()), "{reason}");
}

#[test]
fn permission_denied_says_what_to_do() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
    // Root ignores directory permissions: nothing to check then.
    if std::fs::write(locked.join("probe"), b"x").is_ok() {
        return;
    }
    let path = locked.join("datastore.db");
    let reason = unavailable_reason(LocalBackend::open(LocalOptions::new(&path)));
    assert!(reason.contains(&path.display().to_string()), "{reason}");
    assert!(reason.contains("permission denied"), "{reason}");
    assert!(
        reason.contains("run as root or set DATASTORE_PATH"),
        "{reason}"
    );
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
}
