//! The etcd v3 backend: Calico's key layout on a real etcd, every write a transaction.
//!
//! create = txn `version(key) == 0` → put; update = txn `mod_revision(key) == expected` → put;
//! delete = txn `mod_revision(key) == expected` → delete. TTLs are leases. Lists are paginated
//! at one revision so 100k-key kinds stay within gRPC message limits; watches start at the
//! revision after the one asked for and carry previous values.

use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions,
    Identity, PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OnceCell, mpsc};

use crate::config::EtcdConfig;
use crate::error::{DatastoreError, Result};
use crate::kv::{
    Compare as KvCompare, KeyValue, KvBackend, KvEvent, ListResult, TxnOp as KvTxnOp, TxnOpResult,
    TxnResponse, Watch, check_txn_ops, check_value_size, conflict_or_missing, note_skipped,
    prefix_end,
};

/// Keys fetched per list page.
const LIST_PAGE: i64 = 5_000;
/// Responses may be large (a page of big values); etcd's own limit governs requests.
const MAX_MESSAGE: usize = 64 * 1024 * 1024;
/// Events per batch handed to a watcher.
const WATCH_BATCH: usize = 1_000;

/// One client per member, and the member currently in use: requests stick to one member and
/// move to the next when it stops answering (the way etcd's own clients fail over), so a dead
/// member costs one failed attempt, not a share of every request.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<String>,
    label: String,
    options: ConnectOptions,
    clients: Vec<OnceCell<Client>>,
    current: AtomicUsize,
}

impl EtcdBackend {
    /// Prepares clients for the members in `cfg.endpoints`. Connections are made lazily: an
    /// unreachable etcd shows up as `Unavailable` on the first request, not here (except when
    /// a username is set, which needs a token from a live member).
    pub async fn connect(cfg: &EtcdConfig) -> Result<EtcdBackend> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(15))
            // Notice a dead member within seconds, so requests move to a live one.
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3))
            .with_keep_alive_while_idle(true);
        if let (Some(user), Some(password)) = (&cfg.username, &cfg.password) {
            opts = opts.with_user(user.clone(), password.clone());
        }
        if cfg.ca_cert_file.is_some() || cfg.cert_file.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &cfg.ca_cert_file {
                tls =
                    tls.ca_certificate(Certificate::from_pem(read_file(ca, "ETCD_CA_CERT_FILE")?));
            }
            if let (Some(cert), Some(key)) = (&cfg.cert_file, &cfg.key_file) {
                tls = tls.identity(Identity::from_pem(
                    read_file(cert, "ETCD_CERT_FILE")?,
                    read_file(key, "ETCD_KEY_FILE")?,
                ));
            }
            opts = opts.with_tls(tls);
        }
        if cfg.endpoints.is_empty() {
            return Err(DatastoreError::invalid(
                "no etcd endpoints given (set ETCD_ENDPOINTS)",
            ));
        }
        let backend = EtcdBackend {
            inner: Arc::new(Inner {
                endpoints: cfg.endpoints.clone(),
                label: cfg.endpoints.join(","),
                options: opts,
                clients: cfg.endpoints.iter().map(|_| OnceCell::new()).collect(),
                current: AtomicUsize::new(0),
            }),
        };
        if cfg.username.is_some() {
            // Authentication needs a live member: find one now, so a wrong password fails here.
            backend
                .retry(true, |_| async { Ok(()) })
                .await
                .map_err(|e| {
                    DatastoreError::unavailable(format!(
                        "cannot connect to etcd at {}: {e}",
                        backend.inner.label
                    ))
                })?;
        }
        Ok(backend)
    }

    async fn member(&self, idx: usize) -> std::result::Result<Client, etcd_client::Error> {
        let endpoint = &self.inner.endpoints[idx];
        self.inner.clients[idx]
            .get_or_try_init(|| {
                Client::connect([endpoint.as_str()], Some(self.inner.options.clone()))
            })
            .await
            .cloned()
    }

    fn err(&self, op: &str, key: &str, e: etcd_client::Error) -> DatastoreError {
        map_error(&self.inner.label, op, key, e)
    }
}

fn read_file(path: &std::path::Path, var: &str) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| DatastoreError::invalid(format!("{var} {}: {e}", path.display())))
}

fn map_error(endpoints: &str, op: &str, key: &str, e: etcd_client::Error) -> DatastoreError {
    use etcd_client::Error as E;
    match &e {
        E::GRpcStatus(s) => match i32::from(s.code()) {
            tonic_code::OUT_OF_RANGE if s.message().contains("compacted") => {
                DatastoreError::Compacted {
                    requested: 0,
                    compacted: 0,
                }
            }
            // etcd answers InvalidArgument when authentication is on and no user was given.
            tonic_code::INVALID_ARGUMENT if s.message().contains("user name is empty") => {
                DatastoreError::unavailable(format!(
                    "etcd at {endpoints} requires authentication for {op} {key}: set ETCD_USERNAME and ETCD_PASSWORD"
                ))
            }
            tonic_code::INVALID_ARGUMENT | tonic_code::FAILED_PRECONDITION => {
                DatastoreError::invalid(format!("etcd rejected {op} {key}: {}", s.message()))
            }
            tonic_code::PERMISSION_DENIED | tonic_code::UNAUTHENTICATED => {
                DatastoreError::unavailable(format!(
                    "etcd at {endpoints} refused {op} {key}: {} (check ETCD_USERNAME/ETCD_PASSWORD or the client certificate)",
                    s.message()
                ))
            }
            _ => DatastoreError::unavailable(format!(
                "etcd at {endpoints}: {op} {key}: {}",
                s.message()
            )),
        },
        _ => DatastoreError::unavailable(format!("etcd at {endpoints}: {op} {key}: {e}")),
    }
}

/// gRPC status codes, by number (etcd-client does not re-export tonic's `Code`).
mod tonic_code {
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const UNAUTHENTICATED: i32 = 16;
    pub const UNKNOWN: i32 = 2;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const UNAVAILABLE: i32 = 14;
}

fn convert(kv: &etcd_client::KeyValue) -> Result<KeyValue> {
    Ok(KeyValue {
        key: kv
            .key_str()
            .map_err(|e| DatastoreError::invalid(format!("etcd key is not UTF-8: {e}")))?
            .to_string(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
    })
}

fn ttl_secs(ttl: Duration) -> i64 {
    // etcd leases are whole seconds; never round a TTL down to 0 (which would mean "no TTL").
    i64::try_from(ttl.as_secs().max(1) + u64::from(ttl.subsec_nanos() > 0)).unwrap_or(i64::MAX)
}

/// Attempts per request when an etcd member is unreachable (the balanced channel may pick a
/// dead member; the next attempt usually reaches a live one).
const ATTEMPTS: u32 = 8;

/// Whether the request certainly never reached etcd (so even a write may be retried).
fn not_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(s) => {
            i32::from(s.code()) == tonic_code::UNAVAILABLE && s.message().contains("connect")
        }
        _ => false,
    }
}

/// Whether retrying is worth it for a read (anything transient).
fn transient(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => matches!(
            i32::from(s.code()),
            tonic_code::UNAVAILABLE | tonic_code::DEADLINE_EXCEEDED | tonic_code::UNKNOWN
        ),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

impl EtcdBackend {
    /// Runs `f` against the current member; while members are unreachable, moves to the next
    /// one and tries again (pausing after each full round): reads on any transient error,
    /// writes (`idempotent == false`) only when the request was never sent.
    async fn retry<T, F, Fut>(
        &self,
        idempotent: bool,
        mut f: F,
    ) -> std::result::Result<T, etcd_client::Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let n = self.inner.endpoints.len();
        let mut idx = self.inner.current.load(Ordering::Relaxed) % n;
        let mut delay = Duration::from_millis(50);
        let mut attempt = 1;
        loop {
            let result = match self.member(idx).await {
                Ok(client) => f(client).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(v) => {
                    self.inner.current.store(idx, Ordering::Relaxed);
                    return Ok(v);
                }
                Err(e)
                    if attempt < ATTEMPTS.max(2 * n as u32)
                        && (not_sent(&e) || (idempotent && transient(&e))) =>
                {
                    tracing::debug!(endpoint = %self.inner.endpoints[idx], error = %e, attempt, "etcd request failed; trying again");
                    idx = (idx + 1) % n;
                    self.inner.current.store(idx, Ordering::Relaxed);
                    if attempt % n as u32 == 0 {
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_millis(800));
                    }
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn lease(&self, key: &str, ttl: Option<Duration>) -> Result<Option<PutOptions>> {
        let Some(ttl) = ttl else { return Ok(None) };
        let lease = self
            .retry(false, |mut c| async move {
                c.lease_grant(ttl_secs(ttl), None).await
            })
            .await
            .map_err(|e| self.err("lease grant for", key, e))?;
        Ok(Some(PutOptions::new().with_lease(lease.id())))
    }

    /// Runs `txn`; on failure returns the current value from the txn's `or_else` get.
    async fn txn(&self, op: &str, key: &str, txn: Txn) -> Result<(bool, i64, Option<KeyValue>)> {
        let resp = self
            .retry(false, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
            .map_err(|e| self.err(op, key, e))?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut current = None;
        for r in resp.op_responses() {
            match r {
                TxnOpResponse::Get(g) => {
                    if let Some(kv) = g.kvs().first() {
                        current = Some(convert(kv)?);
                    }
                }
                TxnOpResponse::Delete(d) => {
                    if let Some(kv) = d.prev_kvs().first() {
                        current = Some(convert(kv)?);
                    }
                }
                _ => {}
            }
        }
        Ok((resp.succeeded(), revision, current))
    }
}

impl KvBackend for EtcdBackend {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let resp = self
            .retry(true, |c| async move {
                c.kv_client()
                    .max_decoding_message_size(MAX_MESSAGE)
                    .get(key, None)
                    .await
            })
            .await
            .map_err(|e| self.err("get", key, e))?;
        resp.kvs().first().map(convert).transpose()
    }

    async fn list(&self, prefix: &str) -> Result<ListResult> {
        let end = prefix_end(prefix);
        let mut out = ListResult::default();
        let mut start: Vec<u8> = prefix.as_bytes().to_vec();
        loop {
            let mut opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(LIST_PAGE);
            if out.revision > 0 {
                // Later pages read the same snapshot as the first.
                opts = opts.with_revision(out.revision);
            }
            let resp = self
                .retry(true, |c| {
                    let (start, opts) = (start.clone(), opts.clone());
                    async move {
                        c.kv_client()
                            .max_decoding_message_size(MAX_MESSAGE)
                            .get(start, Some(opts))
                            .await
                    }
                })
                .await
                .map_err(|e| self.err("list", prefix, e))?;
            if out.revision == 0 {
                out.revision = resp.header().map_or(0, |h| h.revision());
            }
            for item in resp.kvs() {
                // One key that does not decode must not fail the whole listing.
                match convert(item) {
                    Ok(kv) => out.kvs.push(kv),
                    Err(e) => note_skipped("etcd", item.key(), &e.to_string()),
                }
            }
            match (resp.more(), resp.kvs().last()) {
                (true, Some(last)) => {
                    start = last.key().to_vec();
                    start.push(0);
                }
                _ => return Ok(out),
            }
        }
    }

    async fn create(&self, key: &str, value: Vec<u8>, ttl: Option<Duration>) -> Result<KeyValue> {
        check_value_size(key, &value)?;
        let put = self.lease(key, ttl).await?;
        let txn = Txn::new()
            .when([Compare::version(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, value.clone(), put)])
            .or_else([TxnOp::get(key, None)]);
        let (ok, revision, _) = self.txn("create", key, txn).await?;
        if !ok {
            return Err(DatastoreError::AlreadyExists {
                key: key.to_string(),
            });
        }
        Ok(KeyValue {
            key: key.to_string(),
            value,
            create_revision: revision,
            mod_revision: revision,
        })
    }

    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Option<i64>,
        ttl: Option<Duration>,
    ) -> Result<KeyValue> {
        check_value_size(key, &value)?;
        let put = self.lease(key, ttl).await?;
        let cond = match expected {
            Some(rev) => Compare::mod_revision(key, CompareOp::Equal, rev),
            // Unconditional update still requires the key to exist.
            None => Compare::version(key, CompareOp::Greater, 0),
        };
        let txn = Txn::new()
            .when([cond])
            .and_then([TxnOp::put(
                key,
                value.clone(),
                put.map(PutOptions::with_prev_key)
                    .or(Some(PutOptions::new().with_prev_key())),
            )])
            .or_else([TxnOp::get(key, None)]);
        let resp = self
            .retry(false, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
            .map_err(|e| self.err("update", key, e))?;
        let revision = resp.header().map_or(0, |h| h.revision());
        if resp.succeeded() {
            let mut create_revision = revision;
            for r in resp.op_responses() {
                if let TxnOpResponse::Put(p) = r
                    && let Some(prev) = p.prev_key()
                {
                    create_revision = prev.create_revision();
                }
            }
            return Ok(KeyValue {
                key: key.to_string(),
                value,
                create_revision,
                mod_revision: revision,
            });
        }
        let mut current = None;
        for r in resp.op_responses() {
            if let TxnOpResponse::Get(g) = r {
                current = g.kvs().first().map(etcd_client::KeyValue::mod_revision);
            }
        }
        Err(match expected {
            Some(e) => conflict_or_missing(key, e, current),
            None => DatastoreError::NotFound {
                key: key.to_string(),
            },
        })
    }

    async fn delete(&self, key: &str, expected: Option<i64>) -> Result<KeyValue> {
        let cond = match expected {
            Some(rev) => Compare::mod_revision(key, CompareOp::Equal, rev),
            None => Compare::version(key, CompareOp::Greater, 0),
        };
        let txn = Txn::new()
            .when([cond])
            .and_then([TxnOp::delete(
                key,
                Some(DeleteOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(key, None)]);
        let (ok, _, current) = self.txn("delete", key, txn).await?;
        match (ok, current, expected) {
            (true, Some(prev), _) => Ok(prev),
            (true, None, _) => Err(DatastoreError::NotFound {
                key: key.to_string(),
            }),
            (false, current, Some(e)) => {
                Err(conflict_or_missing(key, e, current.map(|c| c.mod_revision)))
            }
            (false, _, None) => Err(DatastoreError::NotFound {
                key: key.to_string(),
            }),
        }
    }

    async fn txn(&self, compares: Vec<KvCompare>, ops: Vec<KvTxnOp>) -> Result<TxnResponse> {
        check_txn_ops(&ops)?;
        let when: Vec<Compare> = compares
            .iter()
            .map(|c| match c {
                KvCompare::Absent(k) => Compare::version(k.as_str(), CompareOp::Equal, 0),
                KvCompare::Exists(k) => Compare::version(k.as_str(), CompareOp::Greater, 0),
                KvCompare::ModRevision(k, r) => {
                    Compare::mod_revision(k.as_str(), CompareOp::Equal, *r)
                }
            })
            .collect();
        let then: Vec<TxnOp> = ops
            .iter()
            .map(|op| match op {
                KvTxnOp::Put { key, value } => TxnOp::put(
                    key.as_str(),
                    value.clone(),
                    Some(PutOptions::new().with_prev_key()),
                ),
                KvTxnOp::Delete { key } => {
                    TxnOp::delete(key.as_str(), Some(DeleteOptions::new().with_prev_key()))
                }
                KvTxnOp::Get { key } => TxnOp::get(key.as_str(), None),
                KvTxnOp::List { prefix } => TxnOp::get(
                    prefix.as_str(),
                    Some(GetOptions::new().with_range(prefix_end(prefix))),
                ),
            })
            .collect();
        // On failure, read every compared key (in the same atomic step) to say which failed.
        let or_else: Vec<TxnOp> = compares.iter().map(|c| TxnOp::get(c.key(), None)).collect();
        let txn = Txn::new().when(when).and_then(then).or_else(or_else);
        let first_key = compares
            .first()
            .map(KvCompare::key)
            .or_else(|| {
                ops.first().map(|op| match op {
                    KvTxnOp::Put { key, .. } | KvTxnOp::Delete { key } | KvTxnOp::Get { key } => {
                        key.as_str()
                    }
                    KvTxnOp::List { prefix } => prefix.as_str(),
                })
            })
            .unwrap_or_default()
            .to_string();
        // Reads may be retried on any transient error; writes only when never sent.
        let idempotent = !ops.iter().any(KvTxnOp::is_write);
        let resp = self
            .retry(idempotent, |c| {
                let txn = txn.clone();
                async move {
                    c.kv_client()
                        .max_decoding_message_size(MAX_MESSAGE)
                        .txn(txn)
                        .await
                }
            })
            .await
            .map_err(|e| self.err("transaction on", &first_key, e))?;
        let revision = resp.header().map_or(0, |h| h.revision());
        if !resp.succeeded() {
            for (c, r) in compares.iter().zip(resp.op_responses()) {
                let current = match r {
                    TxnOpResponse::Get(g) => {
                        g.kvs().first().map(etcd_client::KeyValue::mod_revision)
                    }
                    _ => None,
                };
                if let Some(e) = c.failure(current) {
                    return Err(e);
                }
            }
            // Unreachable unless etcd and this check disagree: still report a conflict.
            return Err(DatastoreError::Conflict {
                key: first_key,
                expected: 0,
                current: None,
            });
        }
        let mut results = Vec::with_capacity(ops.len());
        for (op, r) in ops.into_iter().zip(resp.op_responses()) {
            results.push(match (op, r) {
                (KvTxnOp::Put { key, value }, TxnOpResponse::Put(p)) => {
                    TxnOpResult::Put(KeyValue {
                        key,
                        value,
                        create_revision: p.prev_key().map_or(revision, |k| k.create_revision()),
                        mod_revision: revision,
                    })
                }
                (KvTxnOp::Delete { .. }, TxnOpResponse::Delete(d)) => {
                    TxnOpResult::Delete(d.prev_kvs().first().map(convert).transpose()?)
                }
                (KvTxnOp::Get { .. }, TxnOpResponse::Get(g)) => {
                    TxnOpResult::Get(g.kvs().first().map(convert).transpose()?)
                }
                (KvTxnOp::List { .. }, TxnOpResponse::Get(g)) => {
                    TxnOpResult::List(g.kvs().iter().map(convert).collect::<Result<_>>()?)
                }
                _ => {
                    return Err(DatastoreError::unavailable(format!(
                        "etcd at {}: transaction on {first_key}: answers do not match the operations",
                        self.inner.label
                    )));
                }
            });
        }
        Ok(TxnResponse { revision, results })
    }

    async fn watch(&self, prefix: &str, after_revision: i64) -> Result<Watch> {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(after_revision + 1)
            .with_prev_key()
            .with_fragment();
        let mut stream = self
            .retry(true, |c| {
                let opts = opts.clone();
                async move {
                    // A catch-up response can hold thousands of events; tonic's default 4 MiB
                    // limit would fail the watch.
                    c.watch_client()
                        .max_decoding_message_size(MAX_MESSAGE)
                        .watch(prefix, Some(opts))
                        .await
                }
            })
            .await
            .map_err(|e| self.err("watch", prefix, e))?;
        let (tx, rx) = mpsc::channel(16);
        let endpoints = self.inner.label.clone();
        let prefix = prefix.to_string();
        let task = tokio::spawn(async move {
            let fail = |e: DatastoreError| async { tx.send(Err(e)).await.ok() };
            loop {
                let resp = match stream.message().await {
                    Ok(Some(r)) => r,
                    Ok(None) => {
                        fail(DatastoreError::unavailable(format!(
                            "etcd at {endpoints} closed the watch on {prefix}"
                        )))
                        .await;
                        return;
                    }
                    Err(e) => {
                        fail(map_error(&endpoints, "watch", &prefix, e)).await;
                        return;
                    }
                };
                if resp.compact_revision() > 0 {
                    fail(DatastoreError::Compacted {
                        requested: after_revision,
                        compacted: resp.compact_revision(),
                    })
                    .await;
                    return;
                }
                if resp.canceled() {
                    fail(DatastoreError::unavailable(format!(
                        "etcd at {endpoints} cancelled the watch on {prefix}: {}",
                        resp.cancel_reason()
                    )))
                    .await;
                    return;
                }
                let mut batch = Vec::with_capacity(resp.events().len().min(WATCH_BATCH));
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    // A key that does not decode is skipped (and reported), as in a list:
                    // ending the watch would only make the consumer list and watch it again.
                    let kv = match convert(kv) {
                        Ok(kv) => kv,
                        Err(e) => {
                            note_skipped("etcd", kv.key(), &e.to_string());
                            continue;
                        }
                    };
                    let prev = ev.prev_kv().and_then(|p| convert(p).ok());
                    batch.push(match ev.event_type() {
                        EventType::Put => KvEvent::Put { kv, prev },
                        EventType::Delete => KvEvent::Delete {
                            key: kv.key,
                            revision: kv.mod_revision,
                            prev,
                        },
                    });
                    if batch.len() >= WATCH_BATCH
                        && tx.send(Ok(std::mem::take(&mut batch))).await.is_err()
                    {
                        return;
                    }
                }
                if !batch.is_empty() && tx.send(Ok(batch)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Watch::new(rx, Some(task.abort_handle())))
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        self.retry(true, |mut c| async move { c.compact(revision, None).await })
            .await
            .map(|_| ())
            .map_err(|e| self.err("compact to revision", &revision.to_string(), e))
    }

    async fn revision(&self) -> Result<i64> {
        let resp = self
            .retry(true, |mut c| async move {
                c.get("/", Some(GetOptions::new().with_count_only())).await
            })
            .await
            .map_err(|e| self.err("read revision", "", e))?;
        Ok(resp.header().map_or(0, |h| h.revision()))
    }
}
