//! Read-side helpers: get, list and read-only transactions from one snapshot, and the log
//! batches watches read.

use super::*;

pub(super) fn read_list(conn: &mut Connection, prefix: &str) -> TxResult<ListResult> {
    let now = now_ms();
    let tx = conn.transaction()?;
    let revision = current_revision(&tx)?;
    let kvs = list_rows(&tx, prefix, now)?;
    tx.commit()?;
    Ok(ListResult { kvs, revision })
}

/// The live keys under `prefix`, in key order.
pub(super) fn list_rows(conn: &Connection, prefix: &str, now: i64) -> TxResult<Vec<KeyValue>> {
    let end = prefix_end(prefix);
    let mut kvs = Vec::new();
    let mut st;
    let mut rows = if end == [0] {
        st = conn.prepare_cached(SQL_LIST_FROM)?;
        st.query((prefix, now))?
    } else {
        st = conn.prepare_cached(SQL_LIST_RANGE)?;
        st.query((prefix, TextBytes(&end), now))?
    };
    while let Some(r) = rows.next()? {
        // A key that is not text (written by another tool) must not fail the whole listing.
        let key = match key_text(r.get_ref(0)?) {
            Ok(k) => k,
            Err(e) => {
                note_skipped("local", raw_key(r.get_ref(0)?), &fail_text(&e));
                continue;
            }
        };
        kvs.push(KeyValue {
            key,
            value: bytes(r.get_ref(1)?),
            create_revision: r.get(2)?,
            mod_revision: r.get(3)?,
        });
    }
    Ok(kvs)
}

/// The key's live value, without writing (expired rows count as missing).
pub(super) fn read_live(conn: &Connection, key: &str, now: i64) -> TxResult<Option<KeyValue>> {
    let mut st = conn.prepare_cached(SQL_GET)?;
    Ok(st
        .query_row((key, now), |r| {
            Ok(KeyValue {
                key: key.to_string(),
                value: bytes(r.get_ref(0)?),
                create_revision: r.get(1)?,
                mod_revision: r.get(2)?,
            })
        })
        .optional()?)
}

/// A transaction without writes: compares and reads on one snapshot of a read connection.
pub(super) fn read_txn(
    conn: &mut Connection,
    compares: &[Compare],
    ops: Vec<TxnOp>,
) -> TxResult<TxnResponse> {
    let now = now_ms();
    let tx = conn.transaction()?;
    for c in compares {
        let current = read_live(&tx, c.key(), now)?.map(|kv| kv.mod_revision);
        if let Some(e) = c.failure(current) {
            return Err(Fail::Kv(e));
        }
    }
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        results.push(match op {
            TxnOp::Get { key } => TxnOpResult::Get(read_live(&tx, &key, now)?),
            TxnOp::List { prefix } => TxnOpResult::List(list_rows(&tx, &prefix, now)?),
            TxnOp::Put { .. } | TxnOp::Delete { .. } => {
                return Err(Fail::Kv(DatastoreError::invalid(
                    "a write in a read-only transaction",
                )));
            }
        });
    }
    let revision = current_revision(&tx)?;
    tx.commit()?;
    Ok(TxnResponse { revision, results })
}

/// One batch of log rows under `prefix` after `after`, read from one snapshot.
pub(super) struct LogBatch {
    pub(super) events: Vec<KvEvent>,
    /// The revision the watcher has now seen everything up to.
    pub(super) last: i64,
    /// The batch was full: read again without waiting.
    pub(super) more: bool,
}

pub(super) fn read_log(conn: &mut Connection, prefix: &str, after: i64) -> TxResult<LogBatch> {
    let tx = conn.transaction()?;
    let compacted = compacted_revision(&tx)?;
    if after < compacted {
        return Err(Fail::Kv(DatastoreError::Compacted {
            requested: after,
            compacted,
        }));
    }
    let current = current_revision(&tx)?;
    let end = prefix_end(prefix);
    let mut events = Vec::new();
    // Rows read (skipped ones included): a batch is full by rows, and the watcher moves past
    // a skipped row as past any other.
    let (mut rows_read, mut last_row) = (0i64, after);
    {
        let mut st;
        let mut rows = if end == [0] {
            st = tx.prepare_cached(SQL_LOG_FROM)?;
            st.query((after, current, prefix, WATCH_BATCH))?
        } else {
            st = tx.prepare_cached(SQL_LOG_RANGE)?;
            st.query((after, current, prefix, TextBytes(&end), WATCH_BATCH))?
        };
        while let Some(r) = rows.next()? {
            let revision: i64 = r.get(0)?;
            rows_read += 1;
            last_row = revision;
            let key = match key_text(r.get_ref(1)?) {
                Ok(k) => k,
                Err(e) => {
                    note_skipped("local", raw_key(r.get_ref(1)?), &fail_text(&e));
                    continue;
                }
            };
            let deleted: bool = r.get(2)?;
            let create_revision: i64 = r.get(4)?;
            let prev = match r.get::<_, Option<i64>>(6)? {
                Some(mod_revision) => Some(KeyValue {
                    key: key.clone(),
                    value: bytes(r.get_ref(5)?),
                    create_revision,
                    mod_revision,
                }),
                None => None,
            };
            events.push(if deleted {
                KvEvent::Delete {
                    key,
                    revision,
                    prev,
                }
            } else {
                KvEvent::Put {
                    kv: KeyValue {
                        key,
                        value: bytes(r.get_ref(3)?),
                        create_revision,
                        mod_revision: revision,
                    },
                    prev,
                }
            });
        }
    }
    tx.commit()?;
    let full = rows_read >= WATCH_BATCH;
    let last = if full { last_row } else { after.max(current) };
    Ok(LogBatch {
        events,
        last,
        more: full,
    })
}
