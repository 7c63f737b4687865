//! Watching API resources as one stream of key/value events.
//!
//! One loop per query (API resource, namespace, label selector). Each keeps the last
//! resourceVersion it saw — objects and bookmarks alike — and, when the server ends the
//! stream (its timeout, a restart, a dropped connection), watches again from there, so nothing
//! is missed and nothing repeated. A 410 Gone (history compacted) ends the whole watch with
//! `Compacted`: the consumer re-lists and receives only differences. Repeated failures without
//! progress end it with `Unavailable`, after which consumers re-list too.

use futures_util::StreamExt;
use kube::core::WatchEvent;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::api::{ApiError, KubeApi, parse_revision, resource_version};
use super::convert::Converter;
use super::route::{Query, Source};
use crate::error::DatastoreError;
use crate::kv::{KvEvent, StreamMsg, WatchItem};

/// Failed watch requests in a row (no event in between) before the watch gives up.
const MAX_FAILURES: u32 = 5;
/// Events forwarded in one batch at most.
const MAX_BATCH: usize = 512;

pub(super) async fn run(
    api: KubeApi,
    conv: Converter,
    plan: Vec<(Query, String)>,
    prefixes: Vec<String>,
    tx: mpsc::Sender<StreamMsg>,
) {
    let mut loops = JoinSet::new();
    for (slot, (query, rv)) in plan.into_iter().enumerate() {
        loops.spawn(one(
            api.clone(),
            conv.clone(),
            query,
            rv,
            prefixes.clone(),
            Out {
                tx: tx.clone(),
                slot,
            },
        ));
    }
    drop(tx);
    // The first loop to end (an error was sent, or the consumer is gone) ends them all.
    let _ = loops.join_next().await;
    loops.abort_all();
}

/// One stream's end of the watch's channel: its events, and how far it is complete.
struct Out {
    tx: mpsc::Sender<StreamMsg>,
    slot: usize,
}

impl Out {
    async fn item(&self, item: WatchItem, complete_to: &str) -> bool {
        self.tx
            .send(StreamMsg {
                stream: self.slot,
                complete_to: parse_revision(complete_to).unwrap_or(0),
                item: Some(item),
            })
            .await
            .is_ok()
    }

    /// The stream moved on (a bookmark, events outside the prefixes) with nothing to deliver.
    async fn progress(&self, complete_to: &str) -> bool {
        let Some(r) = parse_revision(complete_to) else {
            return !self.tx.is_closed();
        };
        self.tx
            .send(StreamMsg {
                stream: self.slot,
                complete_to: r,
                item: None,
            })
            .await
            .is_ok()
    }

    /// A stream with nothing to watch never holds the others back.
    async fn idle(&self) {
        let _ = self
            .tx
            .send(StreamMsg {
                stream: self.slot,
                complete_to: i64::MAX,
                item: None,
            })
            .await;
        self.tx.closed().await;
    }

    async fn fail(&self, e: DatastoreError) {
        let _ = self
            .tx
            .send(StreamMsg {
                stream: self.slot,
                complete_to: 0,
                item: Some(Err(e)),
            })
            .await;
    }
}

async fn one(
    api: KubeApi,
    conv: Converter,
    query: Query,
    mut rv: String,
    prefixes: Vec<String>,
    out: Out,
) {
    let Some(res) = query.source.api() else {
        // Nothing to watch (the static profile): stay until the watch is dropped.
        out.idle().await;
        return;
    };
    let mut failures = 0u32;
    loop {
        let stream = match api
            .watch(
                &res,
                query.namespace.as_deref(),
                query.label_selector.as_deref(),
                &rv,
            )
            .await
        {
            Ok(s) => s,
            Err(ApiError::Gone(m)) => {
                out.fail(compacted(&rv, &m)).await;
                return;
            }
            // A resource not served: it has nothing to report (the list treated it as empty).
            Err(ApiError::NotFound) => {
                out.idle().await;
                return;
            }
            Err(e) => {
                failures += 1;
                if failures > MAX_FAILURES {
                    out.fail(DatastoreError::unavailable(format!(
                        "watching {}: {e}",
                        res.display()
                    )))
                    .await;
                    return;
                }
                tracing::debug!(resource = %res.display(), error = %e, "watch request failed; retrying");
                tokio::time::sleep(KubeApi::backoff(failures)).await;
                continue;
            }
        };
        let mut stream = std::pin::pin!(stream.ready_chunks(MAX_BATCH));
        while let Some(chunk) = stream.next().await {
            let mut batch = Vec::with_capacity(chunk.len());
            for item in chunk {
                match item {
                    Ok(WatchEvent::Added(obj)) | Ok(WatchEvent::Modified(obj)) => {
                        advance(&mut rv, &obj);
                        failures = 0;
                        if let Some(ev) = put(&conv, query.source, &obj) {
                            batch.push(ev);
                        }
                    }
                    Ok(WatchEvent::Deleted(obj)) => {
                        advance(&mut rv, &obj);
                        failures = 0;
                        if let Some(ev) = deleted(&conv, query.source, &obj) {
                            batch.push(ev);
                        }
                    }
                    Ok(WatchEvent::Bookmark(b)) => {
                        if parse_revision(&b.metadata.resource_version).is_some() {
                            rv = b.metadata.resource_version;
                        }
                        failures = 0;
                    }
                    Ok(WatchEvent::Error(status)) if status.code == 410 => {
                        send(&out, batch, &prefixes, &rv).await;
                        out.fail(compacted(&rv, &status.message)).await;
                        return;
                    }
                    Ok(WatchEvent::Error(status)) => {
                        tracing::debug!(resource = %res.display(), code = status.code, message = %status.message, "watch ended with an error; watching again");
                        failures += 1;
                        break;
                    }
                    Err(ApiError::Gone(m)) => {
                        send(&out, batch, &prefixes, &rv).await;
                        out.fail(compacted(&rv, &m)).await;
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(resource = %res.display(), error = %e, "watch stream failed; watching again");
                        failures += 1;
                        break;
                    }
                }
            }
            if !send(&out, batch, &prefixes, &rv).await {
                return;
            }
        }
        if out.tx.is_closed() {
            return;
        }
        if failures > 0 {
            tokio::time::sleep(KubeApi::backoff(failures)).await;
        }
    }
}

fn advance(rv: &mut String, obj: &Value) {
    if let Some(v) = resource_version(obj)
        && parse_revision(v).is_some()
    {
        *rv = v.to_string();
    }
}

fn compacted(rv: &str, message: &str) -> DatastoreError {
    tracing::info!(
        resource_version = rv,
        message,
        "the API server no longer has this watch's history (410 Gone)"
    );
    DatastoreError::Compacted {
        requested: parse_revision(rv).unwrap_or(0),
        compacted: 0,
    }
}

fn put(conv: &Converter, source: Source, obj: &Value) -> Option<KvEvent> {
    match conv.to_kv(source, obj) {
        Ok(Some(kv)) => Some(KvEvent::Put { kv, prev: None }),
        // The object stands for nothing now (an IPAM object mid-delete): its key is gone.
        Ok(None) => {
            let key = conv.key_of(source, obj)?;
            let revision = resource_version(obj).and_then(parse_revision)?;
            Some(KvEvent::Delete {
                key,
                revision,
                prev: None,
            })
        }
        // What it stood for before is gone: a fresh list would not have it either, and
        // readers must not keep acting on its previous value.
        Err(e) => {
            let key = conv.key_of(source, obj);
            tracing::warn!(error = %e, key = key.as_deref().unwrap_or("?"), "an object no longer converts; its key is treated as deleted");
            let revision = resource_version(obj).and_then(parse_revision)?;
            Some(KvEvent::Delete {
                key: key?,
                revision,
                prev: None,
            })
        }
    }
}

fn deleted(conv: &Converter, source: Source, obj: &Value) -> Option<KvEvent> {
    let key = conv.key_of(source, obj)?;
    let revision = resource_version(obj).and_then(parse_revision)?;
    let prev = conv.to_kv(source, obj).ok().flatten();
    Some(KvEvent::Delete {
        key,
        revision,
        prev,
    })
}

/// Sends the events under the watched prefixes, with the stream's progress (also when there
/// is nothing to send, so a quiet stream does not hold the watch's progress back); false when
/// the consumer is gone.
async fn send(out: &Out, batch: Vec<KvEvent>, prefixes: &[String], rv: &str) -> bool {
    let batch: Vec<KvEvent> = batch
        .into_iter()
        .filter(|e| prefixes.iter().any(|p| e.key().starts_with(p.as_str())))
        .collect();
    if batch.is_empty() {
        return out.progress(rv).await;
    }
    out.item(Ok(batch), rv).await
}
