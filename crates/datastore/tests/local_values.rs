//! The backend stores values as opaque bytes, and key ranges are byte ranges.
#![cfg(feature = "local")]
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use margay_datastore::local::{LocalBackend, LocalOptions};
use margay_datastore::{KvBackend, KvEvent};

fn open(dir: &tempfile::TempDir) -> LocalBackend {
    LocalBackend::open(LocalOptions::new(dir.path().join("datastore.db"))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_values_come_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(&dir);
    let values: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("not-utf8", vec![0xff, 0xfe, 0x00, 0xc3, 0x28]),
        ("nul", b"a\0b\0".to_vec()),
        ("broken-json", b"{\"kind\": \"IPPool\", \"spec\": ".to_vec()),
        ("text-like", b"12345".to_vec()),
        ("big", (0..(1 << 20)).map(|i| (i % 251) as u8).collect()),
    ];
    let start = b.revision().await.unwrap();
    let mut w = b.watch("/v/", start).await.unwrap();
    for (name, value) in &values {
        let kv = b
            .create(&format!("/v/{name}"), value.clone(), None)
            .await
            .unwrap();
        assert_eq!(&kv.value, value);
        let got = b.get(&format!("/v/{name}")).await.unwrap().unwrap();
        assert_eq!(&got.value, value, "{name}");
    }
    let listed = b.list("/v/").await.unwrap();
    assert_eq!(listed.kvs.len(), values.len());
    for kv in &listed.kvs {
        let name = kv.key.trim_start_matches("/v/");
        let (_, want) = values.iter().find(|(n, _)| *n == name).unwrap();
        assert_eq!(&kv.value, want, "{name}");
    }
    let mut seen = Vec::new();
    while seen.len() < values.len() {
        let batch = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.extend(batch);
    }
    for (e, (_, want)) in seen.iter().zip(&values) {
        assert!(
            matches!(e, KvEvent::Put { kv, .. } if &kv.value == want),
            "{e:?}"
        );
    }
    // Updates and deletes carry the previous bytes too.
    let old = b.delete("/v/not-utf8", None).await.unwrap();
    assert_eq!(old.value, values[1].1);
}

/// A value some other tool stored with another SQLite type is still handed back as bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_stored_with_other_sqlite_types_are_returned_as_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("datastore.db");
    let b = LocalBackend::open(LocalOptions::new(&path)).unwrap();
    b.create("/odd/text", b"x".to_vec(), None).await.unwrap();
    b.create("/odd/int", b"x".to_vec(), None).await.unwrap();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn.execute(
            "UPDATE kv SET value = 'plain text' WHERE key = '/odd/text'",
            [],
        )
        .unwrap();
        conn.execute("UPDATE kv SET value = 42 WHERE key = '/odd/int'", [])
            .unwrap();
    }
    assert_eq!(
        b.get("/odd/text").await.unwrap().unwrap().value,
        b"plain text"
    );
    assert_eq!(b.get("/odd/int").await.unwrap().unwrap().value, b"42");
    let listed = b.list("/odd/").await.unwrap();
    let values: Vec<_> = listed.kvs.iter().map(|kv| kv.value.clone()).collect();
    assert_eq!(values, vec![b"42".to_vec(), b"plain text".to_vec()]);
    // And it can be overwritten normally.
    let kv = b
        .update("/odd/int", b"43".to_vec(), None, None)
        .await
        .unwrap();
    assert_eq!(b.get("/odd/int").await.unwrap(), Some(kv));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_are_byte_ranges_including_multibyte_ends() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(&dir);
    for key in [
        "/u/ü",
        "/u/üx",
        "/u/ý",
        "/u/\u{10FFFF}",
        "/u/\u{10FFFF}a",
        "/u/\u{10FFFE}",
        "/u0",
    ] {
        b.create(key, key.as_bytes().to_vec(), None).await.unwrap();
    }
    let keys = |l: margay_datastore::ListResult| -> Vec<String> {
        l.kvs.into_iter().map(|kv| kv.key).collect()
    };
    assert_eq!(keys(b.list("/u/ü").await.unwrap()), vec!["/u/ü", "/u/üx"]);
    // The range end of this prefix is not valid UTF-8; it must still bound the range.
    assert_eq!(
        keys(b.list("/u/\u{10FFFF}").await.unwrap()),
        vec!["/u/\u{10FFFF}", "/u/\u{10FFFF}a"]
    );
    assert_eq!(keys(b.list("/u/").await.unwrap()).len(), 6);
    // The empty prefix is everything.
    assert_eq!(keys(b.list("").await.unwrap()).len(), 7);
    let mut w = b.watch("", 0).await.unwrap();
    let batch = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(batch.len(), 7);
}
