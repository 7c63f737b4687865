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
use tokio::sync::mpsc;

use crate::config::EtcdConfig;
use crate::error::{DatastoreError, Result};
use crate::kv::{KeyValue, KvBackend, KvEvent, ListResult, Watch, conflict_or_missing, prefix_end};

/// Keys fetched per list page.
const LIST_PAGE: i64 = 5_000;
/// Responses may be large (a page of big values); etcd's own limit governs requests.
const MAX_MESSAGE: usize = 64 * 1024 * 1024;
/// Events per batch handed to a watcher.
const WATCH_BATCH: usize = 1_000;

#[derive(Clone)]
pub struct EtcdBackend {
    client: Client,
    endpoints: String,
}

impl EtcdBackend {
    /// Connects to the members in `cfg.endpoints` (the client fails over between them). The
    /// connection is lazy: an unreachable etcd shows up as `Unavailable` on the first request.
    pub async fn connect(cfg: &EtcdConfig) -> Result<EtcdBackend> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
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
        let endpoints = cfg.endpoints.join(",");
        let client = Client::connect(&cfg.endpoints, Some(opts))
            .await
            .map_err(|e| {
                DatastoreError::unavailable(format!("cannot connect to etcd at {endpoints}: {e}"))
            })?;
        Ok(EtcdBackend { client, endpoints })
    }

    fn err(&self, op: &str, key: &str, e: etcd_client::Error) -> DatastoreError {
        map_error(&self.endpoints, op, key, e)
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

impl EtcdBackend {
    async fn lease(&self, key: &str, ttl: Option<Duration>) -> Result<Option<PutOptions>> {
        let Some(ttl) = ttl else { return Ok(None) };
        let lease = self
            .client
            .clone()
            .lease_grant(ttl_secs(ttl), None)
            .await
            .map_err(|e| self.err("lease grant for", key, e))?;
        Ok(Some(PutOptions::new().with_lease(lease.id())))
    }

    /// Runs `txn`; on failure returns the current value from the txn's `or_else` get.
    async fn txn(&self, op: &str, key: &str, txn: Txn) -> Result<(bool, i64, Option<KeyValue>)> {
        let resp = self
            .client
            .clone()
            .txn(txn)
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
            .client
            .kv_client()
            .max_decoding_message_size(MAX_MESSAGE)
            .get(key, None)
            .await
            .map_err(|e| self.err("get", key, e))?;
        resp.kvs().first().map(convert).transpose()
    }

    async fn list(&self, prefix: &str) -> Result<ListResult> {
        let end = prefix_end(prefix);
        let mut kv = self
            .client
            .kv_client()
            .max_decoding_message_size(MAX_MESSAGE);
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
            let resp = kv
                .get(start.clone(), Some(opts))
                .await
                .map_err(|e| self.err("list", prefix, e))?;
            if out.revision == 0 {
                out.revision = resp.header().map_or(0, |h| h.revision());
            }
            for item in resp.kvs() {
                out.kvs.push(convert(item)?);
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
            .client
            .clone()
            .txn(txn)
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

    async fn watch(&self, prefix: &str, after_revision: i64) -> Result<Watch> {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(after_revision + 1)
            .with_prev_key();
        let mut stream = self
            .client
            .clone()
            .watch(prefix, Some(opts))
            .await
            .map_err(|e| self.err("watch", prefix, e))?;
        let (tx, rx) = mpsc::channel(16);
        let endpoints = self.endpoints.clone();
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
                    let prev = ev.prev_kv().map(convert).transpose();
                    let converted = convert(kv).and_then(|kv| prev.map(|p| (kv, p)));
                    let (kv, prev) = match converted {
                        Ok(x) => x,
                        Err(e) => {
                            fail(e).await;
                            return;
                        }
                    };
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
        self.client
            .clone()
            .compact(revision, None)
            .await
            .map(|_| ())
            .map_err(|e| self.err("compact to revision", &revision.to_string(), e))
    }

    async fn revision(&self) -> Result<i64> {
        let resp = self
            .client
            .clone()
            .get("/", Some(GetOptions::new().with_count_only()))
            .await
            .map_err(|e| self.err("read revision", "", e))?;
        Ok(resp.header().map_or(0, |h| h.revision()))
    }
}
