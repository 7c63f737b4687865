//! The embedded single-machine datastore: one SQLite file (bundled SQLite, WAL mode) holding a
//! revisioned key/value log with etcd v3 semantics, shared safely by every margay process on
//! the machine.
//!
//! # Schema
//!
//! - `kv` (`WITHOUT ROWID`, clustered on `key`): the live keys with their value, create and mod
//!   revisions and an optional expiry (`expires_at`, Unix milliseconds). Because rows are stored
//!   in key order, `list(prefix)` is a single range scan, independent of history length; kine's
//!   single-table design has to pick the newest row per key out of the whole log instead.
//! - `log` (`revision INTEGER PRIMARY KEY AUTOINCREMENT`): one row per write, holding the new
//!   value and the previous one, so watch events carry `prev` without a second lookup. A row's
//!   rowid *is* its revision. `create_revision` is NULL when the write created the key (it then
//!   equals the row's own revision, unknown until the insert).
//! - `meta`: the schema version and the compacted revision.
//!
//! Every write is one `BEGIN IMMEDIATE` transaction: expire due keys, check the condition,
//! append to `log`, update `kv`. The current revision is `sqlite_sequence`'s counter for `log`,
//! the highest revision ever assigned, so it never goes backwards, even after compaction has
//! emptied the log or the file is reopened.
//!
//! # Watches
//!
//! A watch is a task that reads `log` rows with revision above the last one it delivered (in
//! batches of at most [`WATCH_BATCH`]) and then sleeps until the store's revision moves. Two
//! things move it: a write through this backend publishes its revision at once, and one poller
//! thread per opened backend polls `PRAGMA data_version` on its own connection every
//! [`LocalOptions::poll_interval`]. That value changes whenever *another* connection (any
//! process) commits, which is how writes from other processes are seen within a few
//! milliseconds; the poller's connection never writes, or it would miss its own commits. Reads
//! check the compacted revision in the same snapshot, so a watcher overtaken by compaction gets
//! [`DatastoreError::Compacted`] rather than a silent gap.
//!
//! The poller thread also deletes expired keys (every [`SWEEP_INTERVAL`]; writes expire due keys
//! too) with ordinary Delete log entries, and applies the retention policy
//! ([`LocalOptions::retain_revisions`]).
//!
//! # Durability
//!
//! With the default `synchronous=NORMAL`, a committed write survives the crash of any process,
//! but a power loss or kernel crash can lose the last transactions before a checkpoint (the
//! file stays consistent). [`LocalOptions::synchronous_full`] syncs the WAL on every commit.
//! TTLs use the wall clock, since several processes must agree on them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::types::{ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};
use tokio::sync::{mpsc, watch};

use crate::error::{DatastoreError, Result};
use crate::kv::{
    Compare, KeyValue, KvBackend, KvEvent, ListResult, TxnOp, TxnOpResult, TxnResponse, Watch,
    check_txn_ops, check_value_size, conflict_or_missing, note_skipped, prefix_end,
};

mod write;
use write::*;

mod read;
use read::*;

/// Where the datastore lives unless configured otherwise.
pub const DEFAULT_PATH: &str = crate::config::DEFAULT_LOCAL_PATH;

/// Bumped when the schema changes incompatibly; a file from a newer margay is refused.
const SCHEMA_VERSION: i64 = 1;
/// How long a write waits for another process's write transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Most events in one watch batch (bounds memory per batch).
pub const WATCH_BATCH: i64 = 1000;
/// How often the poller thread looks for expired keys.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(250);
/// How often the poller thread applies the retention policy.
const RETENTION_INTERVAL: Duration = Duration::from_secs(1);
/// Most expired keys deleted by one transaction, so a mass expiry cannot stall writers.
const SWEEP_LIMIT: i64 = 1000;
/// Most log rows deleted by one compaction transaction, for the same reason.
const COMPACT_CHUNK: i64 = 10_000;
/// Idle read connections kept open for reuse.
const MAX_IDLE_READERS: usize = 8;
/// Batches a watch may queue before its reader waits for the consumer.
const WATCH_CHANNEL: usize = 16;
/// Page size for new files: 8 KiB keeps typical resources (1–2 KiB of JSON) inside the
/// clustered `kv` b-tree instead of spilling to overflow pages, which keeps lists fast.
const PAGE_SIZE: i64 = 8192;
/// Bounds the WAL file after checkpoints.
const JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS kv (
    key             TEXT PRIMARY KEY,
    value           BLOB NOT NULL,
    create_revision INTEGER NOT NULL,
    mod_revision    INTEGER NOT NULL,
    expires_at      INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_expires_at ON kv (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS log (
    revision          INTEGER PRIMARY KEY AUTOINCREMENT,
    key               TEXT NOT NULL,
    deleted           INTEGER NOT NULL,
    value             BLOB,
    create_revision   INTEGER,
    prev_value        BLOB,
    prev_mod_revision INTEGER
);
INSERT OR IGNORE INTO meta (name, value) VALUES ('compacted', 0);
";

const SQL_REVISION: &str = "SELECT seq FROM sqlite_sequence WHERE name = 'log'";
const SQL_COMPACTED: &str = "SELECT value FROM meta WHERE name = 'compacted'";
const SQL_GET: &str = "SELECT value, create_revision, mod_revision FROM kv
    WHERE key = ?1 AND (expires_at IS NULL OR expires_at > ?2)";
const SQL_LOAD: &str =
    "SELECT value, create_revision, mod_revision, expires_at FROM kv WHERE key = ?1";
const SQL_LIST_RANGE: &str = "SELECT key, value, create_revision, mod_revision FROM kv
    WHERE key >= ?1 AND key < ?2 AND (expires_at IS NULL OR expires_at > ?3) ORDER BY key";
const SQL_LIST_FROM: &str = "SELECT key, value, create_revision, mod_revision FROM kv
    WHERE key >= ?1 AND (expires_at IS NULL OR expires_at > ?2) ORDER BY key";
const SQL_LOG_RANGE: &str = "SELECT revision, key, deleted, value,
    COALESCE(create_revision, revision), prev_value, prev_mod_revision FROM log
    WHERE revision > ?1 AND revision <= ?2 AND key >= ?3 AND key < ?4
    ORDER BY revision LIMIT ?5";
const SQL_LOG_FROM: &str = "SELECT revision, key, deleted, value,
    COALESCE(create_revision, revision), prev_value, prev_mod_revision FROM log
    WHERE revision > ?1 AND revision <= ?2 AND key >= ?3
    ORDER BY revision LIMIT ?4";
const SQL_DUE: &str = "SELECT key, value, create_revision, mod_revision FROM kv
    WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2";
const SQL_ANY_DUE: &str = "SELECT EXISTS (SELECT 1 FROM kv WHERE expires_at <= ?1)";
const SQL_LOG_PUT: &str = "INSERT INTO log
    (key, deleted, value, create_revision, prev_value, prev_mod_revision)
    VALUES (?1, 0, ?2, ?3, ?4, ?5)";
const SQL_LOG_DELETE: &str = "INSERT INTO log
    (key, deleted, value, create_revision, prev_value, prev_mod_revision)
    VALUES (?1, 1, NULL, ?2, ?3, ?4)";
const SQL_KV_INSERT: &str = "INSERT INTO kv
    (key, value, create_revision, mod_revision, expires_at) VALUES (?1, ?2, ?3, ?3, ?4)";
const SQL_KV_UPDATE: &str =
    "UPDATE kv SET value = ?2, mod_revision = ?3, expires_at = ?4 WHERE key = ?1";
const SQL_KV_DELETE: &str = "DELETE FROM kv WHERE key = ?1";

/// How to open a [`LocalBackend`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalOptions {
    /// The database file; its directory is created if missing.
    pub path: PathBuf,
    /// Sync the WAL on every commit (`synchronous=FULL`): survives power loss, at the cost of
    /// one fsync per write. The default (`NORMAL`) only survives process crashes.
    pub synchronous_full: bool,
    /// Keep at least this many of the newest revisions of history for watchers to resume
    /// from; older log rows are compacted automatically. 0 disables automatic compaction.
    pub retain_revisions: u64,
    /// How often to look for commits by other processes (bounds cross-process watch latency).
    pub poll_interval: Duration,
    /// Fail instead of creating the file when it does not exist (for commands that only read
    /// or change existing data: a mistyped DATASTORE_PATH must not create an empty store).
    pub must_exist: bool,
}

impl LocalOptions {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        LocalOptions {
            path: path.into(),
            ..LocalOptions::default()
        }
    }
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            path: PathBuf::from(DEFAULT_PATH),
            synchronous_full: false,
            retain_revisions: 100_000,
            poll_interval: Duration::from_millis(5),
            must_exist: false,
        }
    }
}

/// The embedded SQLite datastore. Cheap to clone; the last clone (or watch) dropped closes the
/// file and stops the poller thread.
#[derive(Clone)]
pub struct LocalBackend {
    inner: Arc<Inner>,
}

/// Owns the poller thread's lifetime; everything the thread needs lives in [`Db`], so the
/// thread does not keep the backend alive.
struct Inner {
    db: Arc<Db>,
    stop: Option<std_mpsc::Sender<()>>,
    poller: Option<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropping the sender wakes the poller at once; it finishes at most one sweep first.
        self.stop.take();
        if let Some(handle) = self.poller.take()
            && handle.thread().id() != std::thread::current().id()
            && handle.join().is_err()
        {
            tracing::warn!(path = %self.db.path.display(), "datastore poller thread panicked");
        }
    }
}

struct Db {
    path: PathBuf,
    synchronous_full: bool,
    /// Writes from one process are serialised by SQLite anyway; one connection suffices.
    writer: Mutex<Connection>,
    /// Idle read connections: reads run concurrently with writes and each other (WAL).
    readers: Mutex<Vec<Connection>>,
    /// The newest revision this process knows of; watchers wait for it to change.
    notify: watch::Sender<i64>,
}

/// What went wrong inside a transaction: SQLite, or an answer for the caller.
enum Fail {
    Sql(rusqlite::Error),
    Kv(DatastoreError),
}

impl From<rusqlite::Error> for Fail {
    fn from(e: rusqlite::Error) -> Self {
        Fail::Sql(e)
    }
}

impl From<DatastoreError> for Fail {
    fn from(e: DatastoreError) -> Self {
        Fail::Kv(e)
    }
}

type TxResult<T> = std::result::Result<T, Fail>;

/// Binds bytes as TEXT: a prefix's range end may not be valid UTF-8, and it must compare as
/// text (SQLite orders every TEXT before every BLOB).
struct TextBytes<'a>(&'a [u8]);

impl ToSql for TextBytes<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(ValueRef::Text(self.0)))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic inside a transaction rolls it back when the Transaction drops, so the
    // connection behind a poisoned lock is still in a clean state.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn expiry(ttl: Option<Duration>, now: i64) -> Option<i64> {
    ttl.map(|t| now.saturating_add(i64::try_from(t.as_millis()).unwrap_or(i64::MAX)))
}

/// Values are opaque bytes: whatever type a row holds, hand back its bytes.
fn bytes(v: ValueRef<'_>) -> Vec<u8> {
    match v {
        ValueRef::Blob(b) | ValueRef::Text(b) => b.to_vec(),
        ValueRef::Null => Vec::new(),
        ValueRef::Integer(i) => i.to_string().into_bytes(),
        ValueRef::Real(f) => f.to_string().into_bytes(),
    }
}

fn key_text(v: ValueRef<'_>) -> TxResult<String> {
    match v {
        ValueRef::Text(b) | ValueRef::Blob(b) => String::from_utf8(b.to_vec()).map_err(|_| {
            Fail::Kv(DatastoreError::invalid(format!(
                "stored key {} is not UTF-8",
                String::from_utf8_lossy(b)
            )))
        }),
        other => Err(Fail::Kv(DatastoreError::invalid(format!(
            "stored key has type {:?}, not text",
            other.data_type()
        )))),
    }
}

/// A stored key's bytes, whatever its type, for a report.
fn raw_key(v: ValueRef<'_>) -> &[u8] {
    match v {
        ValueRef::Text(b) | ValueRef::Blob(b) => b,
        _ => b"",
    }
}

fn fail_text(f: &Fail) -> String {
    match f {
        Fail::Kv(e) => e.to_string(),
        Fail::Sql(e) => e.to_string(),
    }
}

fn current_revision(conn: &Connection) -> rusqlite::Result<i64> {
    Ok(conn
        .prepare_cached(SQL_REVISION)?
        .query_row([], |r| r.get::<_, i64>(0))
        .optional()?
        .unwrap_or(0))
}

fn compacted_revision(conn: &Connection) -> rusqlite::Result<i64> {
    Ok(conn
        .prepare_cached(SQL_COMPACTED)?
        .query_row([], |r| r.get::<_, i64>(0))
        .optional()?
        .unwrap_or(0))
}

fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("PRAGMA data_version")?
        .query_row([], |r| r.get(0))
}

/// Opens a connection that only reads (`query_only` makes SQLite refuse writes on it).
fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "query_only", true)?;
    Ok(conn)
}

// ---------------------------------------------------------------------------------------------

impl Db {
    fn describe(&self, what: &str, e: rusqlite::Error) -> DatastoreError {
        describe_sql(&self.path, what, e)
    }

    fn fail(&self, what: &str, f: Fail) -> DatastoreError {
        match f {
            Fail::Kv(e) => e,
            Fail::Sql(e) => self.describe(what, e),
        }
    }

    fn publish(&self, revision: i64) {
        self.notify.send_if_modified(|known| {
            if revision > *known {
                *known = revision;
                true
            } else {
                false
            }
        });
    }

    fn with_reader<T>(
        &self,
        what: &str,
        f: impl FnOnce(&mut Connection) -> TxResult<T>,
    ) -> Result<T> {
        let idle = lock(&self.readers).pop();
        let mut conn = match idle {
            Some(c) => c,
            None => open_reader(&self.path).map_err(|e| self.describe(what, e))?,
        };
        let result = f(&mut conn);
        // A connection that hit an SQLite error is dropped rather than reused.
        if !matches!(result, Err(Fail::Sql(_))) {
            let mut idle = lock(&self.readers);
            if idle.len() < MAX_IDLE_READERS {
                idle.push(conn);
            }
        }
        result.map_err(|e| self.fail(what, e))
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction, committing only if it succeeds.
    fn with_writer<T>(&self, what: &str, f: impl FnOnce(&Connection) -> TxResult<T>) -> Result<T> {
        let mut conn = lock(&self.writer);
        let run = || -> TxResult<T> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        };
        run().map_err(|e| self.fail(what, e))
    }

    fn write(&self, key: &str, op: WriteOp) -> Result<KeyValue> {
        let what = op.name();
        let (kv, revision) = self.with_writer(what, |tx| apply(tx, key, op))?;
        self.publish(revision);
        Ok(kv)
    }

    fn sweep_expired(&self) -> Result<()> {
        loop {
            let last = self.with_writer("expiring keys", |tx| sweep(tx, now_ms(), SWEEP_LIMIT))?;
            match last {
                Some(revision) => self.publish(revision),
                None => return Ok(()),
            }
        }
    }

    /// Discards log rows up to `revision`: records the new compacted revision first (readers
    /// never look below it), then deletes in chunks so writers are not stalled.
    fn compact_to(&self, revision: i64) -> Result<()> {
        self.with_writer("compacting", |tx| {
            let current = current_revision(tx)?;
            if revision > current {
                return Err(Fail::Kv(DatastoreError::invalid(format!(
                    "cannot compact to revision {revision}: the store is only at {current}"
                ))));
            }
            if revision > compacted_revision(tx)? {
                tx.prepare_cached("UPDATE meta SET value = ?1 WHERE name = 'compacted'")?
                    .execute([revision])?;
            }
            Ok(())
        })?;
        loop {
            let deleted = self.with_writer("compacting", |tx| {
                let compacted = compacted_revision(tx)?;
                Ok(tx
                    .prepare_cached(
                        "DELETE FROM log WHERE revision IN
                         (SELECT revision FROM log WHERE revision <= ?1 ORDER BY revision LIMIT ?2)",
                    )?
                    .execute((compacted, COMPACT_CHUNK))?)
            })?;
            if i64::try_from(deleted).unwrap_or(i64::MAX) < COMPACT_CHUNK {
                return Ok(());
            }
        }
    }
}

fn describe_sql(path: &Path, what: &str, e: rusqlite::Error) -> DatastoreError {
    let path = path.display();
    let reason = match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => format!(
            "datastore {path} is locked by another process (waited {}s while {what}): {e}",
            BUSY_TIMEOUT.as_secs()
        ),
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => format!(
            "datastore {path} is corrupt or not a margay datastore ({e}): move it aside and \
             restore a backup, or set DATASTORE_PATH"
        ),
        Some(ErrorCode::PermissionDenied | ErrorCode::ReadOnly | ErrorCode::CannotOpen) => {
            format!(
                "cannot open datastore at {path} for writing ({e}): check its permissions \
                 (run as root or set DATASTORE_PATH)"
            )
        }
        Some(ErrorCode::DiskFull) => {
            format!("datastore {path}: the disk is full ({what}): free some space")
        }
        _ => match e {
            rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::IntegralValueOutOfRange(..) => {
                return DatastoreError::invalid(format!(
                    "datastore {path} holds data margay did not write ({what}): {e}"
                ));
            }
            _ => format!("datastore {path}: {what} failed: {e}"),
        },
    };
    DatastoreError::unavailable(reason)
}

fn io_unavailable(path: &Path, what: &str, e: &std::io::Error) -> DatastoreError {
    let path = path.display();
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        DatastoreError::unavailable(format!(
            "cannot open datastore at {path}: permission denied (run as root or set DATASTORE_PATH)"
        ))
    } else {
        DatastoreError::unavailable(format!(
            "cannot open datastore at {path}: {what}: {e} (set DATASTORE_PATH to a writable file)"
        ))
    }
}

/// Creates the file (owner-only) if missing, so permission problems surface as a clear I/O
/// error rather than SQLite's generic "unable to open database file".
fn touch(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| io_unavailable(path, &format!("creating {}", dir.display()), &e))?;
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    opts.open(path)
        .map(drop)
        .map_err(|e| io_unavailable(path, "opening the file", &e))
}

fn open_writer(options: &LocalOptions) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        &options.path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Only takes effect while the file is still empty.
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(
            path = %options.path.display(),
            mode,
            "datastore could not switch to WAL mode (unsupported filesystem?): readers will \
             block writers"
        );
    }
    let sync = if options.synchronous_full {
        "FULL"
    } else {
        "NORMAL"
    };
    conn.pragma_update(None, "synchronous", sync)?;
    conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)?;
    Ok(conn)
}

fn init_schema(conn: &mut Connection) -> TxResult<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(SCHEMA)?;
    let version: Option<i64> = tx
        .query_row(
            "SELECT value FROM meta WHERE name = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    match version {
        None => {
            tx.execute(
                "INSERT INTO meta (name, value) VALUES ('schema_version', ?1)",
                [SCHEMA_VERSION],
            )?;
        }
        Some(v) if v > SCHEMA_VERSION => {
            return Err(Fail::Kv(DatastoreError::unavailable(format!(
                "schema version {v} was written by a newer margay (this one knows \
                 {SCHEMA_VERSION}): upgrade margay"
            ))));
        }
        Some(_) => {}
    }
    tx.commit()?;
    Ok(())
}

struct Poller {
    db: Arc<Db>,
    conn: Connection,
    stop: std_mpsc::Receiver<()>,
    interval: Duration,
    retain: i64,
    /// The last error of each kind of background work (poll, sweep, retention).
    last_errors: [Option<String>; 3],
}

impl Poller {
    fn run(mut self) {
        let mut version = None;
        let mut next_sweep = Instant::now();
        let mut next_retention = Instant::now() + RETENTION_INTERVAL;
        loop {
            match self.stop.recv_timeout(self.interval) {
                Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
            }
            let result = self.poll(&mut version);
            self.report(0, result);
            let now = Instant::now();
            if now >= next_sweep {
                next_sweep = now + SWEEP_INTERVAL;
                let result = self.sweep();
                self.report(1, result);
            }
            if self.retain > 0 && now >= next_retention {
                next_retention = now + RETENTION_INTERVAL;
                let result = self.retention();
                self.report(2, result);
            }
        }
    }

    /// Wakes watchers if another connection committed since the last poll.
    fn poll(&self, version: &mut Option<i64>) -> Result<()> {
        let v = data_version(&self.conn).map_err(|e| self.db.describe("polling", e))?;
        if *version != Some(v) {
            *version = Some(v);
            let revision =
                current_revision(&self.conn).map_err(|e| self.db.describe("polling", e))?;
            self.db.publish(revision);
        }
        Ok(())
    }

    fn sweep(&self) -> Result<()> {
        // Checked on the read connection so an idle store never takes the write lock.
        let due: bool = self
            .conn
            .prepare_cached(SQL_ANY_DUE)
            .and_then(|mut st| st.query_row([now_ms()], |r| r.get(0)))
            .map_err(|e| self.db.describe("looking for expired keys", e))?;
        if due {
            self.db.sweep_expired()?;
        }
        Ok(())
    }

    fn retention(&self) -> Result<()> {
        let (current, compacted) = current_revision(&self.conn)
            .and_then(|c| Ok((c, compacted_revision(&self.conn)?)))
            .map_err(|e| self.db.describe("checking retention", e))?;
        let target = current.saturating_sub(self.retain);
        if target > compacted {
            self.db.compact_to(target)?;
        }
        Ok(())
    }

    /// Logs an error when it first appears (the poller retries every few milliseconds, so
    /// logging each repeat would flood the log) and when it clears.
    fn report(&mut self, kind: usize, result: Result<()>) {
        let Some(last) = self.last_errors.get_mut(kind) else {
            return;
        };
        match result {
            Ok(()) => {
                if last.take().is_some() {
                    tracing::info!(path = %self.db.path.display(), "datastore background work recovered");
                }
            }
            Err(e) => {
                let msg = e.to_string();
                if last.as_deref() != Some(msg.as_str()) {
                    tracing::warn!(error = %msg, "datastore background work failed; will retry");
                    *last = Some(msg);
                }
            }
        }
    }
}

impl LocalBackend {
    /// Opens (creating if needed) the datastore file and starts its poller thread.
    pub fn open(options: LocalOptions) -> Result<LocalBackend> {
        let path = options.path.clone();
        if options.must_exist && !path.exists() {
            return Err(DatastoreError::unavailable(format!(
                "no datastore at {}: nothing has been stored there yet (check DATASTORE_PATH, or create resources first)",
                path.display()
            )));
        }
        touch(&path)?;
        let mut writer = open_writer(&options).map_err(|e| describe_sql(&path, "opening", e))?;
        init_schema(&mut writer).map_err(|f| match f {
            Fail::Kv(DatastoreError::Unavailable { reason }) => DatastoreError::unavailable(
                format!("cannot open datastore at {}: {reason}", path.display()),
            ),
            Fail::Kv(e) => e,
            Fail::Sql(e) => describe_sql(&path, "creating the schema", e),
        })?;
        let poll_conn = open_reader(&path).map_err(|e| describe_sql(&path, "opening", e))?;
        let revision =
            current_revision(&poll_conn).map_err(|e| describe_sql(&path, "opening", e))?;
        let db = Arc::new(Db {
            path: path.clone(),
            synchronous_full: options.synchronous_full,
            writer: Mutex::new(writer),
            readers: Mutex::new(Vec::new()),
            notify: watch::channel(revision).0,
        });
        let (stop_tx, stop_rx) = std_mpsc::channel();
        let poller = Poller {
            db: db.clone(),
            conn: poll_conn,
            stop: stop_rx,
            interval: options.poll_interval.max(Duration::from_millis(1)),
            retain: i64::try_from(options.retain_revisions).unwrap_or(i64::MAX),
            last_errors: [None, None, None],
        };
        let handle = std::thread::Builder::new()
            .name("margay-ds-poll".to_string())
            .spawn(move || poller.run())
            .map_err(|e| {
                DatastoreError::unavailable(format!(
                    "cannot open datastore at {}: starting its poller thread: {e}",
                    path.display()
                ))
            })?;
        Ok(LocalBackend {
            inner: Arc::new(Inner {
                db,
                stop: Some(stop_tx),
                poller: Some(handle),
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.db.path
    }

    /// The newest revision whose history has been discarded (0 if none).
    pub async fn compacted_revision(&self) -> Result<i64> {
        self.blocking(|db| {
            db.with_reader("reading the compacted revision", |c| {
                Ok(compacted_revision(c)?)
            })
        })
        .await
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Db) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let db = self.inner.db.clone();
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(|e| {
                DatastoreError::unavailable(format!(
                    "datastore {}: background task failed: {e}",
                    self.inner.db.path.display()
                ))
            })?
    }

    async fn write(&self, key: &str, op: WriteOp) -> Result<KeyValue> {
        let key = key.to_string();
        self.blocking(move |db| db.write(&key, op)).await
    }
}

impl fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalBackend")
            .field("path", &self.inner.db.path)
            .field("synchronous_full", &self.inner.db.synchronous_full)
            .finish_non_exhaustive()
    }
}

impl KvBackend for LocalBackend {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let key = key.to_string();
        self.blocking(move |db| {
            db.with_reader("reading", |conn| {
                let mut st = conn.prepare_cached(SQL_GET)?;
                Ok(st
                    .query_row((key.as_str(), now_ms()), |r| {
                        Ok(KeyValue {
                            key: key.clone(),
                            value: bytes(r.get_ref(0)?),
                            create_revision: r.get(1)?,
                            mod_revision: r.get(2)?,
                        })
                    })
                    .optional()?)
            })
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<ListResult> {
        let prefix = prefix.to_string();
        self.blocking(move |db| db.with_reader("listing", |conn| read_list(conn, &prefix)))
            .await
    }

    async fn create(&self, key: &str, value: Vec<u8>, ttl: Option<Duration>) -> Result<KeyValue> {
        check_value_size(key, &value)?;
        self.write(key, WriteOp::Create { value, ttl }).await
    }

    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected_mod_revision: Option<i64>,
        ttl: Option<Duration>,
    ) -> Result<KeyValue> {
        check_value_size(key, &value)?;
        let op = WriteOp::Update {
            value,
            expected: expected_mod_revision,
            ttl,
        };
        self.write(key, op).await
    }

    async fn delete(&self, key: &str, expected_mod_revision: Option<i64>) -> Result<KeyValue> {
        let op = WriteOp::Delete {
            expected: expected_mod_revision,
        };
        self.write(key, op).await
    }

    async fn txn(&self, compares: Vec<Compare>, ops: Vec<TxnOp>) -> Result<TxnResponse> {
        check_txn_ops(&ops)?;
        if ops.iter().any(TxnOp::is_write) {
            self.blocking(move |db| {
                let resp = db.with_writer("transaction", |tx| write_txn(tx, &compares, ops))?;
                db.publish(resp.revision);
                Ok(resp)
            })
            .await
        } else {
            // Reads only: a read connection, so writers are not held up.
            self.blocking(move |db| {
                db.with_reader("reading (transaction)", |conn| {
                    read_txn(conn, &compares, ops)
                })
            })
            .await
        }
    }

    async fn watch(&self, prefix: &str, after_revision: i64) -> Result<Watch> {
        let compacted = self.compacted_revision().await?;
        if after_revision < compacted {
            return Err(DatastoreError::Compacted {
                requested: after_revision,
                compacted,
            });
        }
        let (tx, rx) = mpsc::channel(WATCH_CHANNEL);
        // Holding a clone keeps the poller (cross-process wake-ups) alive as long as the watch.
        let this = self.clone();
        let prefix = prefix.to_string();
        let mut wake = self.inner.db.notify.subscribe();
        let task = tokio::spawn(async move {
            let mut last = after_revision;
            loop {
                // Marked seen before reading, so a write committed after the read wakes us.
                wake.borrow_and_update();
                loop {
                    let p = prefix.clone();
                    let batch = this
                        .blocking(move |db| {
                            db.with_reader("watching", |conn| read_log(conn, &p, last))
                        })
                        .await;
                    match batch {
                        Ok(b) => {
                            last = b.last;
                            if !b.events.is_empty() && tx.send(Ok(b.events)).await.is_err() {
                                return;
                            }
                            if !b.more {
                                break;
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                    }
                }
                tokio::select! {
                    changed = wake.changed() => if changed.is_err() { return },
                    () = tx.closed() => return,
                }
            }
        });
        Ok(Watch::new(rx, Some(task.abort_handle())))
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        self.blocking(move |db| db.compact_to(revision)).await
    }

    async fn revision(&self) -> Result<i64> {
        self.blocking(|db| db.with_reader("reading the revision", |c| Ok(current_revision(c)?)))
            .await
    }
}
