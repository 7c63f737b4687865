//! The Typha client (Felix's side, and confd's later): connects to one of several Typhas with
//! backoff, feeds what it receives through the [`Dedupe`] buffer and emits only real changes.
//!
//! - Connection failure: the next address is tried (with backoff once every address failed);
//!   the new connection is staged and committed once in sync and caught up, so downstream
//!   sees exactly the differences.
//! - `Migrate` from the server: the client connects to another Typha (saying it is migrating,
//!   so a Typha that is itself full refuses it and the next is tried) while the old connection
//!   keeps delivering; once the new one is in sync the old one is closed, and the staged state
//!   is committed as soon as it is at least as new as what was delivered. No update is lost:
//!   everything after the commit comes from the new connection, whose state includes
//!   everything up to the old one's last revision.
//! - Keepalive: every Ping is answered; nothing received for the read timeout (Typha pings
//!   every 10 s) ends the connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use margay_datastore::SyncStatus;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::dedupe::Dedupe;
use crate::proto::{self, ClientHello, Kv, Message};
use crate::syncers::SyncerType;
use crate::tls::ClientTls;
use crate::wire::{self, ReadError};

#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// `host:port` of each Typha.
    pub addrs: Vec<String>,
    pub hostname: String,
    pub info: String,
    pub syncer_type: SyncerType,
    pub tls: Option<ClientTls>,
    /// Nothing received for this long ends the connection (Felix's TyphaReadTimeout, 30 s).
    pub read_timeout: Duration,
    /// Felix's TyphaWriteTimeout (10 s).
    pub write_timeout: Duration,
    pub connect_timeout: Duration,
    pub compression: bool,
    pub max_frame: usize,
    /// First pause after every address failed; doubles up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Protocol versions offered (tests use other ranges to check mismatches).
    pub min_version: u32,
    pub max_version: u32,
}

impl ClientOptions {
    pub fn new(addrs: Vec<String>, hostname: impl Into<String>, syncer_type: SyncerType) -> Self {
        ClientOptions {
            addrs,
            hostname: hostname.into(),
            info: format!("margay {}", env!("CARGO_PKG_VERSION")),
            syncer_type,
            tls: None,
            read_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            compression: true,
            max_frame: proto::DEFAULT_MAX_CLIENT_INBOUND,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            min_version: proto::MIN_PROTOCOL_VERSION,
            max_version: proto::PROTOCOL_VERSION,
        }
    }
}

/// What the client emits.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientEvent {
    /// Sync status (WaitForDatastore / ResyncInProgress before the first InSync; InSync once).
    Status(SyncStatus),
    /// Real changes only.
    Kvs(Vec<Kv>),
    /// The connection changed (for health and logs).
    Connection(ConnectionState),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionState {
    /// Connected to `addr` and delivering from it.
    Connected { addr: String, server_id: String },
    /// No connection delivers right now.
    Disconnected { reason: String },
}

/// Client counters.
#[derive(Debug, Default)]
pub struct ClientStats {
    pub connects: AtomicU64,
    pub connect_failures: AtomicU64,
    pub migrations: AtomicU64,
    pub resyncs: AtomicU64,
    pub resync_deletes: AtomicU64,
    pub suppressed: AtomicU64,
}

/// Why a connection attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot connect to Typha at {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("TLS with Typha at {addr} failed: {reason}")]
    Tls { addr: String, reason: String },
    #[error("Typha at {addr} refused the connection ({code}): {message}")]
    Refused {
        addr: String,
        code: String,
        message: String,
    },
    #[error("handshake with Typha at {addr} failed: {reason}")]
    Handshake { addr: String, reason: String },
}

impl ConnectError {
    pub fn is_version_mismatch(&self) -> bool {
        matches!(self, ConnectError::Refused { code, .. } if code == proto::codes::VERSION_MISMATCH)
    }
}

/// A message from one connection's task.
enum FromConn {
    Msg(Message),
    Ended(String),
}

struct Conn {
    id: u64,
    addr: String,
    server_id: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Connects and completes the handshake; the returned connection forwards its messages.
async fn connect(
    opts: &ClientOptions,
    addr: &str,
    migrating: bool,
    id: u64,
    tx: mpsc::Sender<(u64, FromConn)>,
) -> Result<Conn, ConnectError> {
    let tcp = match tokio::time::timeout(opts.connect_timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return Err(ConnectError::Connect {
                addr: addr.into(),
                reason: e.to_string(),
            });
        }
        Err(_) => {
            return Err(ConnectError::Connect {
                addr: addr.into(),
                reason: format!("timed out after {:?}", opts.connect_timeout),
            });
        }
    };
    let _ = tcp.set_nodelay(true);
    match &opts.tls {
        None => handshake(opts, addr, migrating, id, tcp, tx).await,
        Some(tls) => {
            let host = addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr);
            let name =
                rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_string())
                    .unwrap_or_else(|_| {
                        rustls::pki_types::ServerName::DnsName(
                            rustls::pki_types::DnsName::try_from("typha")
                                .expect("static name is valid")
                                .to_owned(),
                        )
                    });
            let s = tokio::time::timeout(opts.connect_timeout, tls.connector.connect(name, tcp))
                .await
                .map_err(|_| ConnectError::Tls {
                    addr: addr.into(),
                    reason: "TLS handshake timed out".into(),
                })?
                .map_err(|e| ConnectError::Tls {
                    addr: addr.into(),
                    reason: e.to_string(),
                })?;
            handshake(opts, addr, migrating, id, s, tx).await
        }
    }
}

async fn handshake<S: AsyncRead + AsyncWrite + Send + 'static>(
    opts: &ClientOptions,
    addr: &str,
    migrating: bool,
    id: u64,
    stream: S,
    tx: mpsc::Sender<(u64, FromConn)>,
) -> Result<Conn, ConnectError> {
    let (rd, mut wr) = tokio::io::split(stream);
    // Buffered: a burst of small frames (a crumb's KVs and status) is one read, not two
    // per frame (length, then body).
    let mut rd = tokio::io::BufReader::with_capacity(64 << 10, rd);
    let mut caps = vec![proto::CAP_MIGRATE.to_string()];
    if migrating {
        caps.push(proto::CAP_MIGRATING.into());
    }
    let hello = Message::ClientHello(ClientHello {
        min_version: opts.min_version,
        max_version: opts.max_version,
        hostname: opts.hostname.clone(),
        info: opts.info.clone(),
        syncer_type: opts.syncer_type.name().into(),
        compression: if opts.compression {
            vec![proto::COMPRESSION_SNAPPY.into()]
        } else {
            vec![]
        },
        capabilities: caps,
    });
    let hs = |reason: String| ConnectError::Handshake {
        addr: addr.into(),
        reason,
    };
    wire::write_frame(&mut wr, &proto::encode(&hello, false), opts.write_timeout)
        .await
        .map_err(|e| hs(e.to_string()))?;
    let server_id = match wire::read_frame_timeout(&mut rd, opts.max_frame, opts.connect_timeout)
        .await
    {
        Ok(Message::ServerHello(h)) => {
            if h.version < opts.min_version || h.version > opts.max_version {
                return Err(ConnectError::Refused {
                    addr: addr.into(),
                    code: proto::codes::VERSION_MISMATCH.into(),
                    message: format!(
                        "Typha chose protocol version {}, but this client speaks {}..={}; upgrade the older side",
                        h.version, opts.min_version, opts.max_version
                    ),
                });
            }
            if h.syncer_type != opts.syncer_type.name() {
                return Err(hs(format!(
                    "Typha answered for syncer type {:?}",
                    h.syncer_type
                )));
            }
            h.server_id
        }
        Ok(Message::Error { code, message }) => {
            return Err(ConnectError::Refused {
                addr: addr.into(),
                code,
                message,
            });
        }
        Ok(other) => {
            return Err(hs(format!(
                "expected a ServerHello, got {:?}",
                other.msg_type()
            )));
        }
        Err(e) => return Err(hs(e.to_string())),
    };
    let (read_timeout, write_timeout, max) =
        (opts.read_timeout, opts.write_timeout, opts.max_frame);
    let task = tokio::spawn(async move {
        let why = loop {
            match wire::read_frame_timeout(&mut rd, max, read_timeout).await {
                Ok(Message::Ping(t)) => {
                    let pong = proto::encode(&Message::Pong(t), false);
                    if let Err(e) = wire::write_frame(&mut wr, &pong, write_timeout).await {
                        break format!("answering a ping failed: {e}");
                    }
                }
                Ok(Message::Error { code, message }) => {
                    break format!("Typha closed the connection ({code}): {message}");
                }
                Ok(
                    m @ (Message::Kvs(_) | Message::SyncStatus { .. } | Message::Migrate { .. }),
                ) => {
                    if tx.send((id, FromConn::Msg(m))).await.is_err() {
                        return;
                    }
                }
                Ok(other) => break format!("unexpected {:?} message from Typha", other.msg_type()),
                Err(ReadError::Closed) => break "Typha closed the connection".into(),
                Err(e) => break e.to_string(),
            }
        };
        let _ = tx.send((id, FromConn::Ended(why))).await;
    });
    Ok(Conn {
        id,
        addr: addr.to_string(),
        server_id,
        task,
    })
}

/// Where to start in the address list: spread clients over the Typhas by hostname.
fn start_index(hostname: &str, n: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in hostname.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (h % n.max(1) as u64) as usize
}

/// Runs the client until `out` closes.
pub async fn run(opts: ClientOptions, out: mpsc::Sender<ClientEvent>, stats: Arc<ClientStats>) {
    if opts.addrs.is_empty() {
        tracing::error!("no Typha address configured");
        return;
    }
    let (tx, mut rx) = mpsc::channel::<(u64, FromConn)>(64);
    let mut dedupe = Dedupe::new();
    let mut next_id = 1u64;
    let mut active: Option<Conn> = None;
    let mut staged: Option<Conn> = None;
    // Migration: until when the old connection may be kept, and where to try next.
    let mut migrate_until: Option<Instant> = None;
    let mut next_migrate_try = Instant::now();
    let mut cursor = start_index(&opts.hostname, opts.addrs.len());
    let mut backoff = opts.backoff;
    let mut reported_disconnected = false;

    macro_rules! emit {
        ($ev:expr) => {
            if out.send($ev).await.is_err() {
                return;
            }
        };
    }

    loop {
        // No connection at all: connect (staged if downstream already has state).
        if active.is_none() && staged.is_none() {
            let mut connected = None;
            // Kept for the Disconnected event, so health and status say why (a version
            // mismatch, a refused certificate) instead of only that no Typha answered.
            let mut last_error = String::new();
            for _ in 0..opts.addrs.len() {
                let addr = opts.addrs[cursor % opts.addrs.len()].clone();
                cursor = cursor.wrapping_add(1);
                let id = next_id;
                next_id += 1;
                match connect(&opts, &addr, false, id, tx.clone()).await {
                    Ok(c) => {
                        connected = Some(c);
                        break;
                    }
                    Err(e) => {
                        stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                        if e.is_version_mismatch() {
                            tracing::error!("{e}");
                        } else {
                            tracing::warn!("{e}; trying the next Typha");
                        }
                        last_error = e.to_string();
                    }
                }
            }
            let Some(c) = connected else {
                if !reported_disconnected {
                    reported_disconnected = true;
                    emit!(ClientEvent::Connection(ConnectionState::Disconnected {
                        reason: format!("no Typha could be reached (last error: {last_error})")
                    }));
                }
                tracing::warn!(retry_in = ?backoff, addrs = ?opts.addrs, "no Typha could be reached; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(opts.max_backoff);
                continue;
            };
            backoff = opts.backoff;
            stats.connects.fetch_add(1, Ordering::Relaxed);
            tracing::info!(addr = %c.addr, server = %c.server_id, "Connected to Typha");
            if dedupe.has_state() {
                dedupe.stage_begin();
                staged = Some(c);
            } else {
                reported_disconnected = false;
                emit!(ClientEvent::Connection(ConnectionState::Connected {
                    addr: c.addr.clone(),
                    server_id: c.server_id.clone()
                }));
                active = Some(c);
            }
        }

        // Migrating and no staged connection yet: try another Typha (not the current one).
        if let (Some(until), None) = (migrate_until, &staged)
            && Instant::now() >= next_migrate_try
        {
            let current = active.as_ref().map(|c| c.addr.clone());
            let mut found = None;
            for _ in 0..opts.addrs.len() {
                let addr = opts.addrs[cursor % opts.addrs.len()].clone();
                cursor = cursor.wrapping_add(1);
                if Some(&addr) == current.as_ref() && opts.addrs.len() > 1 {
                    continue;
                }
                let id = next_id;
                next_id += 1;
                match connect(&opts, &addr, true, id, tx.clone()).await {
                    Ok(c) => {
                        found = Some(c);
                        break;
                    }
                    Err(e) => {
                        stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::info!("migration: {e}");
                    }
                }
            }
            match found {
                Some(c) => {
                    tracing::info!(to = %c.addr, server = %c.server_id, "Migration: connected to another Typha; it is in sync before the old connection is dropped");
                    dedupe.stage_begin();
                    staged = Some(c);
                }
                None => {
                    next_migrate_try = Instant::now() + Duration::from_secs(1);
                    if Instant::now() >= until {
                        tracing::warn!(
                            "Migration: no other Typha accepted within the grace period; staying until the server closes the connection"
                        );
                        migrate_until = None;
                    }
                }
            }
        }

        let wait = if migrate_until.is_some() && staged.is_none() {
            next_migrate_try.saturating_duration_since(Instant::now())
        } else {
            Duration::from_secs(3600)
        };
        let (id, msg) = tokio::select! {
            m = rx.recv() => match m {
                Some(m) => m,
                None => return,
            },
            _ = tokio::time::sleep(wait) => continue,
            _ = out.closed() => return,
        };
        let is_active = active.as_ref().is_some_and(|c| c.id == id);
        let is_staged = staged.as_ref().is_some_and(|c| c.id == id);
        if !is_active && !is_staged {
            continue; // a connection already dropped
        }
        match msg {
            FromConn::Ended(why) => {
                if is_active {
                    let c = active.take();
                    tracing::warn!(addr = ?c.as_ref().map(|c| &c.addr), reason = %why, "Typha connection lost");
                    migrate_until = None;
                    if staged.is_none() {
                        reported_disconnected = true;
                        emit!(ClientEvent::Connection(ConnectionState::Disconnected {
                            reason: why
                        }));
                    }
                } else {
                    let c = staged.take();
                    tracing::warn!(addr = ?c.as_ref().map(|c| &c.addr), reason = %why, "Typha connection lost before it was in sync");
                    dedupe.stage_abort();
                }
            }
            FromConn::Msg(Message::Kvs(kvs)) => {
                if is_active {
                    let passed = dedupe.pass_kvs(kvs);
                    if !passed.is_empty() {
                        emit!(ClientEvent::Kvs(passed));
                    }
                } else {
                    dedupe.stage_kvs(kvs);
                }
            }
            FromConn::Msg(Message::SyncStatus { status, as_of }) => {
                if is_active {
                    if let Some(s) = dedupe.pass_status(status, as_of) {
                        emit!(ClientEvent::Status(s));
                    }
                } else {
                    dedupe.stage_status(status, as_of);
                    if dedupe.stage_in_sync() && active.is_some() {
                        // The new connection is in sync: stop taking from the old one, so the
                        // target revision stops moving; the new one catches up to it.
                        if let Some(old) = active.take() {
                            tracing::info!(from = %old.addr, "Migration: the new connection is in sync; closing the old one");
                            stats.migrations.fetch_add(1, Ordering::Relaxed);
                        }
                        migrate_until = None;
                    }
                    if dedupe.stage_ready() {
                        let before = dedupe.stats();
                        let committed = dedupe.stage_commit();
                        let after = dedupe.stats();
                        stats.resyncs.fetch_add(1, Ordering::Relaxed);
                        stats.resync_deletes.fetch_add(
                            after.resync_deletes - before.resync_deletes,
                            Ordering::Relaxed,
                        );
                        stats.suppressed.store(after.suppressed, Ordering::Relaxed);
                        let c = staged.take();
                        if let Some(c) = &c {
                            tracing::info!(addr = %c.addr, changes = committed.kvs.len(), "Now delivering from Typha at {} (only differences were passed on)", c.addr);
                            emit!(ClientEvent::Connection(ConnectionState::Connected {
                                addr: c.addr.clone(),
                                server_id: c.server_id.clone()
                            }));
                        }
                        reported_disconnected = false;
                        active = c;
                        if !committed.kvs.is_empty() {
                            emit!(ClientEvent::Kvs(committed.kvs));
                        }
                        if let Some(s) = committed.status {
                            emit!(ClientEvent::Status(s));
                        }
                    }
                }
            }
            FromConn::Msg(Message::Migrate { grace_ms, reason }) => {
                if is_active && migrate_until.is_none() && staged.is_none() {
                    tracing::info!(reason = %reason, grace_ms, "Typha asks this client to migrate");
                    // Leave a margin so the switch completes before the server gives up.
                    let grace = Duration::from_millis(grace_ms);
                    migrate_until = Some(Instant::now() + grace.mul_f32(0.8));
                    next_migrate_try = Instant::now();
                }
            }
            FromConn::Msg(_) => {}
        }
    }
}

/// [`to_update`] for a client that feeds a syncer pipeline (None: not a v3 resource key). A
/// value that does not decode becomes a deletion of its key, with a warning: Typha validated
/// it, so a client that cannot decode it (version skew) treats it as absent, as the datastore
/// syncer does.
pub fn to_update_or_deleted(kv: &Kv) -> Option<margay_datastore::Update> {
    match to_update(kv)? {
        Ok(u) => Some(u),
        Err(e) => {
            tracing::warn!(key = %kv.key, error = %e, "a value from Typha does not decode; treating it as deleted");
            Some(margay_datastore::Update {
                key: margay_datastore::keys::parse_resource_path(&kv.key)?,
                value: None,
                revision: kv.revision,
                update_type: margay_datastore::UpdateType::Deleted,
            })
        }
    }
}

/// Turns a v3 resource KV into the syncer's `Update` (None: not a v3 resource key).
pub fn to_update(kv: &Kv) -> Option<Result<margay_datastore::Update, String>> {
    use margay_datastore::{KeyValue, Update, UpdateType};
    let key = margay_datastore::keys::parse_resource_path(&kv.key)?;
    let update_type = match kv.kind {
        proto::UpdateKind::New => UpdateType::New,
        proto::UpdateKind::Updated => UpdateType::Updated,
        proto::UpdateKind::Deleted => UpdateType::Deleted,
    };
    let value = match &kv.value {
        None => None,
        Some(v) => {
            let stored = KeyValue {
                key: kv.key.clone(),
                value: v.to_vec(),
                create_revision: 0,
                mod_revision: kv.revision,
            };
            match margay_datastore::client::decode(&stored) {
                Ok(r) => Some(r),
                Err(e) => return Some(Err(e.to_string())),
            }
        }
    };
    Some(Ok(Update {
        key,
        value,
        revision: kv.revision,
        update_type,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use margay_datastore::UpdateType;

    fn kv(key: &str, value: &[u8]) -> Kv {
        Kv {
            key: key.into(),
            value: Some(Bytes::copy_from_slice(value)),
            revision: 7,
            kind: proto::UpdateKind::Updated,
        }
    }

    #[test]
    fn undecodable_values_become_deletions() {
        let peer = br#"{"apiVersion":"projectcalico.org/v3","kind":"BGPPeer","metadata":{"name":"tor"},"spec":{"peerIP":"10.0.0.254","asNumber":65000}}"#;
        let key = "/calico/resources/v3/projectcalico.org/bgppeers/tor";
        let u = to_update_or_deleted(&kv(key, peer)).expect("a v3 key");
        assert_eq!(u.update_type, UpdateType::Updated);
        assert!(u.value.is_some());

        let u = to_update_or_deleted(&kv(key, b"{not json")).expect("a v3 key");
        assert_eq!(u.key.name, "tor");
        assert_eq!(u.value, None);
        assert_eq!(u.revision, 7);
        assert_eq!(u.update_type, UpdateType::Deleted);

        assert_eq!(
            to_update_or_deleted(&kv("/calico/ipam/v2/host/n1/ipv4/block/10.0.0.0-26", b"{}")),
            None
        );
    }
}
