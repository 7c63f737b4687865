//! Write-side helpers, each called inside one BEGIN IMMEDIATE transaction: load, put, delete,
//! expiry sweep, conditions, and write transactions.

use super::*;

/// A key's row, expired or not.
pub(super) struct Row {
    kv: KeyValue,
    expires_at: Option<i64>,
}

pub(super) fn load(conn: &Connection, key: &str) -> TxResult<Option<Row>> {
    let mut st = conn.prepare_cached(SQL_LOAD)?;
    let row = st
        .query_row([key], |r| {
            Ok(Row {
                kv: KeyValue {
                    key: key.to_string(),
                    value: bytes(r.get_ref(0)?),
                    create_revision: r.get(1)?,
                    mod_revision: r.get(2)?,
                },
                expires_at: r.get(3)?,
            })
        })
        .optional()?;
    Ok(row)
}

/// Deletes a key, logging the Delete; returns its revision.
pub(super) fn delete_row(conn: &Connection, prev: &KeyValue) -> TxResult<i64> {
    conn.prepare_cached(SQL_LOG_DELETE)?.execute((
        prev.key.as_str(),
        prev.create_revision,
        prev.value.as_slice(),
        prev.mod_revision,
    ))?;
    let revision = conn.last_insert_rowid();
    conn.prepare_cached(SQL_KV_DELETE)?
        .execute([prev.key.as_str()])?;
    Ok(revision)
}

/// Writes a key (creating it if `prev` is None), logging the Put.
pub(super) fn put_row(
    conn: &Connection,
    key: &str,
    value: Vec<u8>,
    prev: Option<&KeyValue>,
    expires_at: Option<i64>,
) -> TxResult<KeyValue> {
    conn.prepare_cached(SQL_LOG_PUT)?.execute((
        key,
        value.as_slice(),
        prev.map(|p| p.create_revision),
        prev.map(|p| p.value.as_slice()),
        prev.map(|p| p.mod_revision),
    ))?;
    let revision = conn.last_insert_rowid();
    let create_revision = match prev {
        None => {
            conn.prepare_cached(SQL_KV_INSERT)?.execute((
                key,
                value.as_slice(),
                revision,
                expires_at,
            ))?;
            revision
        }
        Some(p) => {
            conn.prepare_cached(SQL_KV_UPDATE)?.execute((
                key,
                value.as_slice(),
                revision,
                expires_at,
            ))?;
            p.create_revision
        }
    };
    Ok(KeyValue {
        key: key.to_string(),
        value,
        create_revision,
        mod_revision: revision,
    })
}

/// Deletes up to `limit` expired keys; returns the last revision used, if any. Idempotent
/// across processes: the due keys are read inside the write transaction, so a key another
/// process already swept is simply not found.
pub(super) fn sweep(conn: &Connection, now: i64, limit: i64) -> TxResult<Option<i64>> {
    let due = {
        let mut st = conn.prepare_cached(SQL_DUE)?;
        let mut rows = st.query((now, limit))?;
        let mut due = Vec::new();
        while let Some(r) = rows.next()? {
            due.push(KeyValue {
                key: key_text(r.get_ref(0)?)?,
                value: bytes(r.get_ref(1)?),
                create_revision: r.get(2)?,
                mod_revision: r.get(3)?,
            });
        }
        due
    };
    let mut last = None;
    for kv in &due {
        last = Some(delete_row(conn, kv)?);
    }
    Ok(last)
}

/// The key's live row; an expired one is deleted (and logged) first, as a sweep would.
pub(super) fn live(conn: &Connection, key: &str, now: i64) -> TxResult<Option<KeyValue>> {
    match load(conn, key)? {
        Some(row) if row.expires_at.is_some_and(|e| e <= now) => {
            delete_row(conn, &row.kv)?;
            Ok(None)
        }
        other => Ok(other.map(|r| r.kv)),
    }
}

pub(super) fn check_expected(key: &str, current: &KeyValue, expected: Option<i64>) -> TxResult<()> {
    match expected {
        Some(e) if e != current.mod_revision => Err(Fail::Kv(conflict_or_missing(
            key,
            e,
            Some(current.mod_revision),
        ))),
        _ => Ok(()),
    }
}

pub(super) fn not_found(key: &str) -> Fail {
    Fail::Kv(DatastoreError::NotFound {
        key: key.to_string(),
    })
}

pub(super) enum WriteOp {
    Create {
        value: Vec<u8>,
        ttl: Option<Duration>,
    },
    Update {
        value: Vec<u8>,
        expected: Option<i64>,
        ttl: Option<Duration>,
    },
    Delete {
        expected: Option<i64>,
    },
}

impl WriteOp {
    pub(super) fn name(&self) -> &'static str {
        match self {
            WriteOp::Create { .. } => "create",
            WriteOp::Update { .. } => "update",
            WriteOp::Delete { .. } => "delete",
        }
    }
}

/// Runs one write; returns what the caller gets and the revision to publish.
pub(super) fn apply(conn: &Connection, key: &str, op: WriteOp) -> TxResult<(KeyValue, i64)> {
    let now = now_ms();
    sweep(conn, now, SWEEP_LIMIT)?;
    let current = live(conn, key, now)?;
    match op {
        WriteOp::Create { value, ttl } => {
            if current.is_some() {
                return Err(Fail::Kv(DatastoreError::AlreadyExists {
                    key: key.to_string(),
                }));
            }
            let kv = put_row(conn, key, value, None, expiry(ttl, now))?;
            let rev = kv.mod_revision;
            Ok((kv, rev))
        }
        WriteOp::Update {
            value,
            expected,
            ttl,
        } => {
            let current = current.ok_or_else(|| not_found(key))?;
            check_expected(key, &current, expected)?;
            let kv = put_row(conn, key, value, Some(&current), expiry(ttl, now))?;
            let rev = kv.mod_revision;
            Ok((kv, rev))
        }
        WriteOp::Delete { expected } => {
            let current = current.ok_or_else(|| not_found(key))?;
            check_expected(key, &current, expected)?;
            let rev = delete_row(conn, &current)?;
            Ok((current, rev))
        }
    }
}

/// A transaction with writes, inside the caller's BEGIN IMMEDIATE transaction.
pub(super) fn write_txn(
    conn: &Connection,
    compares: &[Compare],
    ops: Vec<TxnOp>,
) -> TxResult<TxnResponse> {
    let now = now_ms();
    sweep(conn, now, SWEEP_LIMIT)?;
    for c in compares {
        let current = live(conn, c.key(), now)?.map(|kv| kv.mod_revision);
        if let Some(e) = c.failure(current) {
            return Err(Fail::Kv(e));
        }
    }
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        results.push(match op {
            TxnOp::Put { key, value } => {
                let current = live(conn, &key, now)?;
                TxnOpResult::Put(put_row(conn, &key, value, current.as_ref(), None)?)
            }
            TxnOp::Delete { key } => {
                let current = live(conn, &key, now)?;
                if let Some(kv) = &current {
                    delete_row(conn, kv)?;
                }
                TxnOpResult::Delete(current)
            }
            TxnOp::Get { key } => TxnOpResult::Get(live(conn, &key, now)?),
            TxnOp::List { prefix } => TxnOpResult::List(list_rows(conn, &prefix, now)?),
        });
    }
    Ok(TxnResponse {
        revision: current_revision(conn)?,
        results,
    })
}
