//! Keeps a decoded mirror of the keys under one prefix and reports what changes: list, diff
//! against what was known, report in-sync once, watch from the listed revision, and list
//! again after a watch error (sending only the real differences, so removals missed while
//! disconnected are still reported).
//!
//! For keys outside the v3 resources that the [`WatcherSyncer`](crate::WatcherSyncer) does not
//! carry — Felix's IPAM blocks, confd's block affinities.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::kv::{KvBackend, KvEvent};

/// The first wait after a failed list, and the wait before relisting when a watch cannot start.
const FIRST_DELAY: Duration = Duration::from_millis(200);
/// Failed lists back off (doubling) up to this.
const MAX_DELAY: Duration = Duration::from_secs(10);

/// One change to the mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MirrorEvent<T> {
    /// The key is new, or its decoded value differs from the last one sent.
    Changed(String, T),
    /// The key is gone, or its value no longer decodes; carries the last value sent for it.
    Removed(String, T),
    /// Everything under the prefix has been listed once (sent exactly once).
    InSync,
}

/// A list-then-watch of one prefix. `decode(key, value)` returns None for a key that is not
/// interesting or a value that does not decode; such a key counts as absent.
#[derive(Debug, Clone)]
pub struct PrefixMirror<F> {
    prefix: String,
    /// The keys in log lines, plural ("IPAM blocks") and as a watch ("IPAM block watch").
    items: String,
    watch_name: String,
    decode: F,
}

impl<F> PrefixMirror<F> {
    pub fn new(prefix: impl Into<String>, decode: F) -> Self {
        let prefix = prefix.into();
        PrefixMirror {
            items: format!("keys under {prefix}"),
            watch_name: format!("{prefix} watch"),
            prefix,
            decode,
        }
    }

    /// Names the keys in log lines: `items` plural ("block affinities"), `item` singular
    /// ("block affinity"; the watch is logged as "block affinity watch").
    pub fn named(mut self, items: &str, item: &str) -> Self {
        self.items = items.to_string();
        self.watch_name = format!("{item} watch");
        self
    }

    /// Mirrors the prefix into `out` until the receiver is gone. Never returns an error:
    /// datastore trouble is logged and retried (list failures back off up to 10 s).
    pub async fn run<B, T, M>(self, backend: B, out: mpsc::Sender<M>)
    where
        B: KvBackend,
        F: Fn(&str, &[u8]) -> Option<T>,
        T: Clone + PartialEq,
        M: From<MirrorEvent<T>>,
    {
        // Returns early once nobody listens, even while waiting on a quiet watch or a delay.
        tokio::select! {
            () = self.mirror(&backend, &out) => {}
            () = out.closed() => {}
        }
    }

    async fn mirror<B, T, M>(&self, backend: &B, out: &mpsc::Sender<M>)
    where
        B: KvBackend,
        F: Fn(&str, &[u8]) -> Option<T>,
        T: Clone + PartialEq,
        M: From<MirrorEvent<T>>,
    {
        let send = |ev: MirrorEvent<T>| out.send(M::from(ev));
        let mut known: BTreeMap<String, T> = BTreeMap::new();
        let mut reported_in_sync = false;
        let mut delay = FIRST_DELAY;
        loop {
            let listed = match backend.list(&self.prefix).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!("listing {} failed (retrying): {e}", self.items);
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(MAX_DELAY);
                    continue;
                }
            };
            delay = FIRST_DELAY;
            let seen: BTreeMap<String, T> = listed
                .kvs
                .iter()
                .filter_map(|kv| Some((kv.key.clone(), (self.decode)(&kv.key, &kv.value)?)))
                .collect();
            // Removals first: a consumer that keys by the decoded value (a CIDR) must end with
            // a value that moved to another key present, not removed.
            for (key, last) in &known {
                if !seen.contains_key(key)
                    && send(MirrorEvent::Removed(key.clone(), last.clone()))
                        .await
                        .is_err()
                {
                    return;
                }
            }
            for (key, value) in &seen {
                if known.get(key) != Some(value)
                    && send(MirrorEvent::Changed(key.clone(), value.clone()))
                        .await
                        .is_err()
                {
                    return;
                }
            }
            known = seen;
            if !reported_in_sync {
                reported_in_sync = true;
                if send(MirrorEvent::InSync).await.is_err() {
                    return;
                }
            }
            let mut watch = match backend.watch(&self.prefix, listed.revision).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!("watching {} failed (relisting): {e}", self.items);
                    tokio::time::sleep(delay).await;
                    continue;
                }
            };
            while let Some(item) = watch.next().await {
                let events = match item {
                    Ok(ev) => ev,
                    Err(e) => {
                        tracing::info!("{} ended ({e}); relisting", self.watch_name);
                        break;
                    }
                };
                for ev in events {
                    let key = ev.key().to_string();
                    let value = match &ev {
                        KvEvent::Put { kv, .. } => (self.decode)(&key, &kv.value),
                        KvEvent::Delete { .. } => None,
                    };
                    let msg = match value {
                        Some(v) => {
                            if known.get(&key) == Some(&v) {
                                continue;
                            }
                            known.insert(key.clone(), v.clone());
                            MirrorEvent::Changed(key, v)
                        }
                        None => match known.remove(&key) {
                            Some(last) => MirrorEvent::Removed(key, last),
                            None => continue,
                        },
                    };
                    if send(msg).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemBackend;

    const P: &str = "/test/";

    type Ev = MirrorEvent<String>;

    /// Values are UTF-8 text; an empty value does not decode and keys ending in `/skip` are
    /// not interesting.
    fn decode(key: &str, value: &[u8]) -> Option<String> {
        if key.ends_with("/skip") {
            return None;
        }
        let text = std::str::from_utf8(value).ok()?;
        (!text.is_empty()).then(|| text.to_string())
    }

    fn start(kv: &MemBackend) -> (mpsc::Receiver<Ev>, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(16);
        let mirror = PrefixMirror::new(P, decode).named("test keys", "test key");
        (rx, tokio::spawn(mirror.run(kv.clone(), tx)))
    }

    async fn next(rx: &mut mpsc::Receiver<Ev>) -> Ev {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("an event within 5 s")
            .expect("channel open")
    }

    fn changed(key: &str, value: &str) -> Ev {
        MirrorEvent::Changed(format!("{P}{key}"), value.to_string())
    }

    fn removed(key: &str, last: &str) -> Ev {
        MirrorEvent::Removed(format!("{P}{key}"), last.to_string())
    }

    async fn put(kv: &MemBackend, key: &str, value: &str) {
        let key = format!("{P}{key}");
        match kv.get(&key).await.expect("get") {
            Some(cur) => {
                kv.update(&key, value.into(), Some(cur.mod_revision), None)
                    .await
            }
            None => kv.create(&key, value.into(), None).await,
        }
        .expect("write");
    }

    async fn delete(kv: &MemBackend, key: &str) {
        kv.delete(&format!("{P}{key}"), None).await.expect("delete");
    }

    #[tokio::test]
    async fn lists_then_follows_updates_and_deletes() {
        let kv = MemBackend::new();
        put(&kv, "a", "1").await;
        put(&kv, "bad", "").await;
        put(&kv, "skip", "x").await;
        kv.create("/other/a", b"1".to_vec(), None)
            .await
            .expect("create");
        let (mut rx, task) = start(&kv);
        assert_eq!(next(&mut rx).await, changed("a", "1"));
        assert_eq!(next(&mut rx).await, MirrorEvent::InSync);

        put(&kv, "c", "3").await;
        assert_eq!(next(&mut rx).await, changed("c", "3"));
        // Rewriting the same value is not a change.
        put(&kv, "a", "1").await;
        put(&kv, "a", "2").await;
        assert_eq!(next(&mut rx).await, changed("a", "2"));
        // A value that stops decoding counts as removed.
        put(&kv, "c", "").await;
        assert_eq!(next(&mut rx).await, removed("c", "3"));
        delete(&kv, "a").await;
        assert_eq!(next(&mut rx).await, removed("a", "2"));
        // Deleting keys that were never reported says nothing.
        delete(&kv, "bad").await;
        delete(&kv, "skip").await;
        put(&kv, "d", "4").await;
        assert_eq!(next(&mut rx).await, changed("d", "4"));
        task.abort();
    }

    #[tokio::test]
    async fn relists_after_a_watch_error_sending_only_differences() {
        let kv = MemBackend::new();
        put(&kv, "a", "1").await;
        put(&kv, "b", "2").await;
        put(&kv, "c", "3").await;
        let (mut rx, task) = start(&kv);
        for want in [changed("a", "1"), changed("b", "2"), changed("c", "3")] {
            assert_eq!(next(&mut rx).await, want);
        }
        assert_eq!(next(&mut rx).await, MirrorEvent::InSync);

        // None of these awaits yields, so the watch sees none of the writes before the
        // compaction ends it; the relist must find the net result only (the watch would have
        // shown b's intermediate value and x coming and going).
        delete(&kv, "a").await;
        put(&kv, "b", "20").await;
        put(&kv, "b", "21").await;
        put(&kv, "c", "3").await;
        put(&kv, "d", "4").await;
        put(&kv, "x", "9").await;
        delete(&kv, "x").await;
        let rev = kv.revision().await.expect("revision");
        kv.compact(rev).await.expect("compact");

        assert_eq!(next(&mut rx).await, removed("a", "1"));
        assert_eq!(next(&mut rx).await, changed("b", "21"));
        assert_eq!(next(&mut rx).await, changed("d", "4"));
        // Watching again, and in sync was not reported a second time.
        put(&kv, "e", "5").await;
        assert_eq!(next(&mut rx).await, changed("e", "5"));
        task.abort();
    }

    #[tokio::test]
    async fn stops_when_the_receiver_is_gone() {
        let kv = MemBackend::new();
        let (mut rx, task) = start(&kv);
        assert_eq!(next(&mut rx).await, MirrorEvent::InSync);
        drop(rx);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the mirror ends within 5 s")
            .expect("no panic");
    }
}
