//! Watch streams. A watch holds no queue of its own: it is a cursor into the store's shared,
//! bounded event history, woken when the revision moves. A watcher that falls behind the
//! retained history has its stream closed (the client re-watches and gets 410 if its revision
//! is gone), so a slow watcher costs O(1) memory.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::Stream;
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::Shared;
use crate::resources::ResourceDef;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{EventType, Key, Obj};
use crate::table::{self, Shape};

/// Events looked at per wake-up (bounds the time the store lock is held).
const MAX_SCAN: usize = 4096;
/// Least time between two event chunks of one watch while events keep coming.
const COALESCE: Duration = Duration::from_millis(1);
/// Synthetic ADDED events per chunk.
const INITIAL_BATCH: usize = 500;

pub struct Filter {
    pub ns: Option<String>,
    pub label: LabelSelector,
    pub field: FieldSelector,
}

impl Filter {
    pub fn matches(&self, ns: &str, obj: &Obj) -> bool {
        self.ns.as_deref().is_none_or(|n| n == ns)
            && self.label.matches(&obj.value)
            && self.field.matches(&obj.value)
    }
    pub fn matches_key(&self, k: &Key, obj: &Obj) -> bool {
        self.matches(&k.0, obj)
    }
}

pub struct WatchParams {
    pub def: Arc<ResourceDef>,
    pub api_version: String,
    pub filter: Filter,
    pub shape: Shape,
    pub bookmarks: bool,
    pub initial: Vec<Obj>,
    /// Send the `k8s.io/initial-events-end` bookmark after the initial events.
    pub initial_end: bool,
    pub next_rv: u64,
    pub deadline: Instant,
    pub bookmark_interval: Duration,
}

/// Counts the watch as open for [`crate::Stats`] until dropped.
pub struct WatchGuard {
    shared: Arc<Shared>,
    key: (String, String),
}

impl WatchGuard {
    pub fn new(shared: Arc<Shared>, group: &str, resource: &str) -> WatchGuard {
        let key = (group.to_string(), resource.to_string());
        *shared.stats().open_watches.entry(key.clone()).or_insert(0) += 1;
        WatchGuard { shared, key }
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let mut s = self.shared.stats();
        if let Some(n) = s.open_watches.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.open_watches.remove(&self.key);
            }
        }
    }
}

struct Cursor {
    shared: Arc<Shared>,
    p: WatchParams,
    gr: String,
    rv_rx: watch::Receiver<u64>,
    close_rx: watch::Receiver<u64>,
    next_bookmark: Instant,
    last_chunk: Option<Instant>,
    done: bool,
    _guard: WatchGuard,
}

/// Appends one `{"type":…,"object":…}` line.
fn push_event(buf: &mut BytesMut, ty: &str, object: &[u8]) {
    buf.put_slice(b"{\"type\":\"");
    buf.put_slice(ty.as_bytes());
    buf.put_slice(b"\",\"object\":");
    buf.put_slice(object);
    buf.put_slice(b"}\n");
}

/// An object's JSON in the requested version (stored bytes when they already match).
pub fn render(obj: &Obj, api_version: &str) -> Bytes {
    if obj.value.get("apiVersion").and_then(Value::as_str) == Some(api_version) {
        return obj.json.clone();
    }
    let mut v = obj.value.clone();
    v["apiVersion"] = json!(api_version);
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

impl Cursor {
    fn object_bytes(&self, obj: &Obj) -> Bytes {
        match self.p.shape {
            Shape::Meta => {
                Bytes::from(serde_json::to_vec(&table::partial(&obj.value)).unwrap_or_default())
            }
            Shape::Table(inc) => {
                let now = crate::util::now_secs();
                let row = table::row(&self.p.def, &obj.value, inc, now);
                let t = table::table(
                    &self.p.def,
                    vec![row],
                    json!({"resourceVersion": obj.rv.to_string()}),
                );
                Bytes::from(serde_json::to_vec(&t).unwrap_or_default())
            }
            Shape::Object => render(obj, &self.p.api_version),
        }
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut m = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            m["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let o = json!({"kind": self.p.def.kind, "apiVersion": self.p.api_version, "metadata": m});
        let mut buf = BytesMut::new();
        push_event(
            &mut buf,
            "BOOKMARK",
            &serde_json::to_vec(&o).unwrap_or_default(),
        );
        buf.freeze()
    }

    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if !self.p.initial.is_empty() {
            let n = self.p.initial.len().min(INITIAL_BATCH);
            let mut buf = BytesMut::new();
            for o in self.p.initial.drain(..n).collect::<Vec<_>>() {
                push_event(&mut buf, "ADDED", &self.object_bytes(&o));
            }
            return Some(buf.freeze());
        }
        if self.p.initial_end {
            self.p.initial_end = false;
            if self.p.bookmarks {
                return Some(self.bookmark(self.p.next_rv.saturating_sub(1), true));
            }
        }
        // Under a sustained stream, send at most one chunk per COALESCE: events that arrive
        // meanwhile share it (per-chunk costs — wake-up, lock, TLS record, syscall — would
        // otherwise dominate). An event after a quiet spell goes out at once.
        self.coalesce().await;
        // Bounded: every pass either returns, or made progress through the history, or waits.
        loop {
            if Instant::now() >= self.p.deadline {
                self.done = true;
                return None;
            }
            self.rv_rx.borrow_and_update();
            let got = {
                let st = self.shared.lock();
                st.events_since(&self.gr, &self.p.def, self.p.next_rv, MAX_SCAN)
                    .map(|(evs, next)| (evs, next, st.rv))
            };
            let Some((evs, next, current)) = got else {
                self.done = true;
                return None;
            };
            self.p.next_rv = next;
            let mut buf = BytesMut::new();
            for e in evs {
                let now = self.p.filter.matches(&e.ns, &e.obj);
                let ty = match e.etype {
                    EventType::Added if now => EventType::Added,
                    EventType::Deleted if now => EventType::Deleted,
                    EventType::Modified => {
                        let before = e
                            .prev
                            .as_ref()
                            .is_some_and(|p| self.p.filter.matches(&e.ns, p));
                        match (before, now) {
                            (true, true) => EventType::Modified,
                            (true, false) => EventType::Deleted,
                            (false, true) => EventType::Added,
                            (false, false) => continue,
                        }
                    }
                    _ => continue,
                };
                push_event(&mut buf, ty.as_str(), &self.object_bytes(&e.obj));
            }
            if !buf.is_empty() {
                self.last_chunk = Some(Instant::now());
                return Some(buf.freeze());
            }
            if next <= current {
                continue;
            }
            let bookmark_at = if self.p.bookmarks {
                self.next_bookmark
            } else {
                self.p.deadline
            };
            tokio::select! {
                r = self.rv_rx.changed() => if r.is_err() { self.done = true; return None; },
                _ = self.close_rx.changed() => { self.done = true; return None; },
                _ = tokio::time::sleep_until(self.p.deadline) => { self.done = true; return None; },
                _ = tokio::time::sleep_until(bookmark_at), if self.p.bookmarks => {
                    self.next_bookmark = Instant::now() + self.p.bookmark_interval;
                    return Some(self.bookmark(self.p.next_rv.saturating_sub(1), false));
                }
            }
            self.coalesce().await;
        }
    }

    async fn coalesce(&self) {
        if let Some(last) = self.last_chunk.filter(|l| l.elapsed() < COALESCE) {
            tokio::time::sleep_until(last + COALESCE).await;
        }
    }
}

/// The body stream of one watch.
pub fn stream(
    shared: Arc<Shared>,
    p: WatchParams,
) -> impl Stream<Item = Result<Frame<Bytes>, Infallible>> + Send {
    let gr = p.def.key();
    let mut close_rx = shared.close_tx.subscribe();
    close_rx.borrow_and_update();
    let guard = WatchGuard::new(shared.clone(), &p.def.group, &p.def.plural);
    let cursor = Cursor {
        rv_rx: shared.rv_tx.subscribe(),
        close_rx,
        next_bookmark: Instant::now() + p.bookmark_interval,
        last_chunk: None,
        shared,
        gr,
        p,
        done: false,
        _guard: guard,
    };
    futures_util::stream::unfold(cursor, |mut c| async move {
        c.next_chunk().await.map(|b| (Ok(Frame::data(b)), c))
    })
}

/// A one-event stream: an ERROR event carrying `status` (e.g. 410 Expired), then the end.
pub fn error_event(status: &Value) -> Bytes {
    let mut buf = BytesMut::new();
    push_event(
        &mut buf,
        "ERROR",
        &serde_json::to_vec(status).unwrap_or_default(),
    );
    buf.freeze()
}
