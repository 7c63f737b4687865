//! Typha's server: accepts clients, hands each the snapshot of its syncer type and then the
//! crumbs as they are published.
//!
//! Per connection: one reader task (pongs; anything malformed closes this connection only)
//! and one writer task that walks the crumb chain. Nothing is queued per client: the writer
//! writes the shared, pre-encoded frames of the crumb it is at straight to the socket, so a
//! client that does not read blocks only its own writer (dropped after the write timeout),
//! and memory per client is its task, its socket buffers and its place in the chain. A client
//! more than MaxFallBehind behind the newest crumb is disconnected.
//!
//! Memory a stranger can make the server hold is bounded (DESIGN.md "Hostile clients"):
//! what a client sends is read into a buffer that grows only with the bytes that arrived, up
//! to [`proto::MAX_CLIENT_FRAME`]; at most `max_pending_handshakes` connections may be
//! without a hello at once (a new one closes the oldest: a real client sends its hello at
//! once, so a flood of silent connections cannot lock it out); a snapshot is encoded once and
//! shared by every client that joins while it is still being sent, and its whole send has
//! one deadline (the write timeout), so clients that stop reading cannot pin one encoded
//! snapshot each.
//!
//! Balancing: over the connection limit, one connection per drop interval is asked to migrate
//! (a client that does not know `Migrate` is closed, as Calico does); on shutdown every
//! connection is asked, spread over the drain period. A migrating client connects elsewhere,
//! reaches in-sync there and only then closes this connection; after the grace period the
//! server closes it anyway.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use margay_datastore::SyncStatus;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

use crate::cache::{CacheReader, Crumb, Frames};
use crate::config::TyphaConfig;
use crate::proto::{self, ClientHello, Message, ServerHello, codes};
use crate::syncers::SyncerType;
use crate::tls::ServerTls;
use crate::wire::{self, ReadError};

/// Server settings (from [`TyphaConfig`]).
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub max_kvs_per_msg: usize,
    /// Target payload of one KV frame.
    pub max_frame_payload: usize,
    pub ping_interval: Duration,
    pub pong_timeout: Duration,
    pub handshake_timeout: Duration,
    pub write_timeout: Duration,
    pub max_fall_behind: Duration,
    pub new_client_grace: Duration,
    pub max_inbound: usize,
    /// Connections that have not finished their hello (TLS included) at once; over it, the
    /// oldest is closed to make room for the new one.
    pub max_pending_handshakes: usize,
    /// The connection limit at start; [`Server::set_connection_limit`] changes it while
    /// running (TYPHA_CONNECTIONREBALANCINGMODE=kubernetes).
    pub connection_limit: usize,
    pub migration_grace: Duration,
    pub drop_interval: Duration,
    pub shutdown_timeout: Duration,
    /// Clients joining within this long of a computed snapshot share it (and catch up
    /// through the crumbs published since).
    pub snapshot_reuse: Duration,
    pub server_id: String,
}

impl ServerOptions {
    pub fn from_config(c: &TyphaConfig, server_id: String) -> ServerOptions {
        ServerOptions {
            max_kvs_per_msg: c.server_max_message_size,
            max_frame_payload: 256 << 10,
            ping_interval: c.server_ping_interval,
            pong_timeout: c.server_pong_timeout,
            handshake_timeout: c.server_handshake_timeout,
            write_timeout: c.server_write_timeout,
            max_fall_behind: c.server_max_fall_behind,
            new_client_grace: c.server_new_client_fall_behind_grace_period,
            max_inbound: c.server_max_inbound_bytes.min(proto::MAX_CLIENT_FRAME),
            max_pending_handshakes: c.server_max_pending_handshakes,
            connection_limit: c.connection_limit(),
            migration_grace: c.migration_grace,
            drop_interval: c.connection_drop_interval,
            shutdown_timeout: c.shutdown_timeout,
            snapshot_reuse: Duration::from_secs(1),
            server_id,
        }
    }
}

/// Server counters (exported as metrics).
#[derive(Debug, Default)]
pub struct ServerStats {
    pub accepted: AtomicU64,
    pub active: AtomicU64,
    pub handshake_failures: AtomicU64,
    pub tls_failures: AtomicU64,
    pub version_mismatches: AtomicU64,
    pub bad_frames: AtomicU64,
    pub dropped_fall_behind: AtomicU64,
    pub dropped_write_timeout: AtomicU64,
    pub dropped_pong_timeout: AtomicU64,
    pub migrations_requested: AtomicU64,
    pub closed_after_grace: AtomicU64,
    pub refused_full: AtomicU64,
    pub snapshots_encoded: AtomicU64,
    pub snapshots_shared: AtomicU64,
    pub frames_sent: AtomicU64,
    /// Connections accepted that have not finished their hello yet (a gauge).
    pub pending_handshakes: AtomicU64,
    /// Connections without a hello closed because `max_pending_handshakes` newer ones came.
    pub evicted_pending: AtomicU64,
    /// Bytes of encoded snapshots alive (being sent, or kept for clients about to join).
    pub snapshot_bytes: AtomicU64,
    /// Snapshots whose send did not finish within the write timeout.
    pub dropped_snapshot_deadline: AtomicU64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Command {
    None,
    Migrate {
        reason: String,
    },
    Close {
        reason: String,
    },
    /// Drop the connection without a word (tests: a Typha that dies).
    Abort,
}

/// A snapshot being shared: new clients reuse it while it is alive — held by a client still
/// sending it, or kept by the server for `snapshot_reuse` — and not older than half of
/// MaxFallBehind (the joiner catches up through the crumbs since, which whoever holds the
/// snapshot keeps alive anyway). So at most one encoded snapshot per syncer type and
/// compression is alive at a time, however many clients are slow to take it.
struct Share {
    base: std::sync::Weak<Crumb>,
    cell: std::sync::Weak<SnapshotCell>,
    /// Strong references for the reuse window (clients joining one after another).
    fresh: Option<(Arc<Crumb>, Arc<SnapshotCell>)>,
    at: Instant,
}

type SnapshotCell = tokio::sync::OnceCell<Frames>;

/// Counts a connection as pending its hello until dropped.
struct PendingGuard {
    server: Arc<Server>,
    id: u64,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        if lock(&self.server.pending).remove(&self.id).is_some() {
            self.server
                .stats
                .pending_handshakes
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A string a client sent, for a log line: control characters escaped (a newline cannot
/// forge a line), at most 200 characters.
pub fn shown(s: &str) -> String {
    const MAX: usize = 200;
    let mut out: String = s.chars().take(MAX).flat_map(char::escape_debug).collect();
    if s.chars().nth(MAX).is_some() {
        out.push('…');
    }
    out
}

struct ConnEntry {
    syncer: SyncerType,
    can_migrate: bool,
    commands: watch::Sender<Command>,
    asked: bool,
}

pub struct Server {
    opts: ServerOptions,
    caches: HashMap<SyncerType, CacheReader>,
    tls: Option<ServerTls>,
    conns: Mutex<HashMap<u64, ConnEntry>>,
    next_id: AtomicU64,
    /// Per (syncer type, compressed): the snapshot computed last (see [`Share`]).
    snapshot_base: Mutex<HashMap<(SyncerType, bool), Share>>,
    /// The connection limit in force (see `ServerOptions::connection_limit`).
    limit: AtomicUsize,
    shutting_down: AtomicBool,
    /// Connections without a hello yet, oldest first: sending on one closes it.
    pending: Mutex<std::collections::BTreeMap<u64, oneshot::Sender<()>>>,
    pub stats: ServerStats,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

impl Server {
    pub fn new(
        opts: ServerOptions,
        caches: HashMap<SyncerType, CacheReader>,
        tls: Option<ServerTls>,
    ) -> Arc<Server> {
        Arc::new(Server {
            limit: AtomicUsize::new(opts.connection_limit),
            opts,
            caches,
            tls,
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            snapshot_base: Mutex::new(HashMap::new()),
            shutting_down: AtomicBool::new(false),
            pending: Mutex::new(std::collections::BTreeMap::new()),
            stats: ServerStats::default(),
        })
    }

    pub fn options(&self) -> &ServerOptions {
        &self.opts
    }

    /// The connection limit in force: over it, clients are asked to migrate.
    pub fn connection_limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Changes the connection limit; the next housekeeping round acts on it.
    pub fn set_connection_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Connected clients.
    pub fn connections(&self) -> usize {
        lock(&self.conns).len()
    }

    /// Connected clients per syncer type.
    pub fn connections_by_type(&self) -> Vec<(SyncerType, usize)> {
        let conns = lock(&self.conns);
        SyncerType::ALL
            .iter()
            .map(|t| (*t, conns.values().filter(|c| c.syncer == *t).count()))
            .collect()
    }

    /// Accepts clients until `stop` turns true.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
        let _housekeeping = AbortOnDrop(tokio::spawn(self.clone().housekeeping(stop.clone())));
        loop {
            tokio::select! {
                r = listener.accept() => match r {
                    Ok((stream, peer)) => {
                        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
                        let (guard, evict) = self.register_pending();
                        let s = self.clone();
                        tokio::spawn(async move {
                            // Evicted before its hello: the connection is dropped (closed).
                            // After the hello the guard is gone, and so is the sender.
                            let evicted = async {
                                if evict.await.is_err() {
                                    std::future::pending::<()>().await;
                                }
                            };
                            tokio::select! {
                                _ = s.handle(stream, peer, guard) => {}
                                _ = evicted => {}
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                _ = stop.changed() => break,
            }
            if *stop.borrow() {
                break;
            }
        }
    }

    /// Registers a connection as waiting for its hello; over the cap, the oldest such
    /// connection is told to close.
    fn register_pending(self: &Arc<Self>) -> (PendingGuard, oneshot::Receiver<()>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let victim = {
            let mut p = lock(&self.pending);
            let victim = if p.len() >= self.opts.max_pending_handshakes.max(1) {
                p.pop_first()
            } else {
                None
            };
            p.insert(id, tx);
            victim
        };
        match victim {
            Some((_, v)) => {
                let _ = v.send(());
                let n = self.stats.evicted_pending.fetch_add(1, Ordering::Relaxed);
                // Once, then every 1000th: a flood must not flood the log too.
                if n.is_multiple_of(1000) {
                    tracing::warn!(
                        evicted = n + 1,
                        "{} connections have not finished their hello; closing the oldest for each new one (TYPHA_SERVERMAXPENDINGHANDSHAKES)",
                        self.opts.max_pending_handshakes
                    );
                }
            }
            None => {
                self.stats
                    .pending_handshakes
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        (
            PendingGuard {
                server: self.clone(),
                id,
            },
            rx,
        )
    }

    /// Drops stale shared snapshots; over the limit, asks one connection per drop interval
    /// to migrate.
    async fn housekeeping(self: Arc<Self>, _stop: watch::Receiver<bool>) {
        let mut tick =
            tokio::time::interval(self.opts.drop_interval.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut rng = now_ms() | 1;
        loop {
            tick.tick().await;
            let reuse = self.opts.snapshot_reuse;
            let mut alive = 0u64;
            lock(&self.snapshot_base).retain(|_, sh| {
                if sh.at.elapsed() > reuse * 2 {
                    sh.fresh = None;
                }
                let frames = sh.cell.upgrade().and_then(|c| c.get().cloned());
                alive += frames.map_or(0, |f| f.iter().map(|b| b.len() as u64).sum());
                sh.cell.strong_count() > 0
            });
            self.stats.snapshot_bytes.store(alive, Ordering::Relaxed);
            if self.shutting_down.load(Ordering::Relaxed) {
                continue;
            }
            let limit = self.connection_limit();
            let mut conns = lock(&self.conns);
            let unasked: Vec<u64> = conns
                .iter()
                .filter(|(_, c)| !c.asked)
                .map(|(id, _)| *id)
                .collect();
            if unasked.len() > limit {
                // xorshift: a pseudo-random victim, as Calico drops a random connection.
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let id = unasked[(rng % unasked.len() as u64) as usize];
                if let Some(c) = conns.get_mut(&id) {
                    c.asked = true;
                    self.stats
                        .migrations_requested
                        .fetch_add(1, Ordering::Relaxed);
                    let cmd = if c.can_migrate {
                        Command::Migrate {
                            reason: format!(
                                "this Typha has {} connections, over its limit of {limit}",
                                unasked.len(),
                            ),
                        }
                    } else {
                        Command::Close {
                            reason: "over the connection limit".into(),
                        }
                    };
                    let _ = c.commands.send(cmd);
                }
            }
        }
    }

    /// Graceful shutdown: stop taking clients (the caller stops `serve`), then ask every
    /// connection to migrate, spread over the drain period (at most one per drop interval),
    /// and wait until they are gone or the drain period is over.
    pub async fn drain(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + self.opts.shutdown_timeout;
        let ids: Vec<u64> = lock(&self.conns).keys().copied().collect();
        let n = ids.len().max(1) as u32;
        let spacing = (self.opts.shutdown_timeout / 2 / n).min(self.opts.drop_interval);
        tracing::info!(
            connections = ids.len(),
            ?spacing,
            "Draining: asking every client to move to another Typha"
        );
        for id in ids {
            if let Some(c) = lock(&self.conns).get_mut(&id) {
                c.asked = true;
                let cmd = if c.can_migrate {
                    Command::Migrate {
                        reason: "this Typha is shutting down".into(),
                    }
                } else {
                    Command::Close {
                        reason: "this Typha is shutting down".into(),
                    }
                };
                let _ = c.commands.send(cmd);
            }
            tokio::time::sleep(spacing).await;
        }
        while self.connections() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = self.connections();
        if left > 0 {
            tracing::warn!(left, "Drain period over; closing the remaining connections");
            for c in lock(&self.conns).values() {
                let _ = c.commands.send(Command::Close {
                    reason: "this Typha is shutting down".into(),
                });
            }
        }
    }

    /// Drops every connection at once, without telling the clients (as a killed Typha would);
    /// with `serve` stopped, this Typha is gone.
    pub fn abort_all(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
        for c in lock(&self.conns).values() {
            let _ = c.commands.send(Command::Abort);
        }
    }

    async fn handle(self: Arc<Self>, stream: TcpStream, peer: SocketAddr, pending: PendingGuard) {
        let _ = stream.set_nodelay(true);
        match &self.tls {
            None => self.connection(stream, peer, pending).await,
            Some(tls) => {
                let accepted =
                    tokio::time::timeout(self.opts.handshake_timeout, tls.acceptor.accept(stream))
                        .await;
                let stream = match accepted {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        self.stats.tls_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%peer, error = %e, "TLS handshake failed; connection refused (the client needs a certificate signed by CAFile)");
                        return;
                    }
                    Err(_) => {
                        self.stats.tls_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%peer, timeout = ?self.opts.handshake_timeout, "TLS handshake timed out; connection closed");
                        return;
                    }
                };
                let cert = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| c.as_ref().to_vec());
                let verdict = match cert {
                    Some(der) => tls.expected.check(&der),
                    None => Err("the client sent no certificate".into()),
                };
                if let Err(why) = verdict {
                    self.stats.tls_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, "client certificate refused: {why} (ClientCN / ClientURISAN)");
                    // The chain is the CA's, so the peer is probably a misconfigured Felix:
                    // answer its hello with a refusal it can log (without naming the identity
                    // required), as every other refusal is answered.
                    let mut stream = stream;
                    let _ = wire::read_frame_timeout(
                        &mut stream,
                        self.opts.max_inbound,
                        self.opts.handshake_timeout,
                    )
                    .await;
                    self.refuse(
                        &mut stream,
                        codes::CERTIFICATE_REFUSED,
                        "this Typha does not accept the client certificate's identity (ClientCN / ClientURISAN)".into(),
                    )
                    .await;
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        tokio::io::AsyncWriteExt::shutdown(&mut stream),
                    )
                    .await;
                    return;
                }
                self.connection(stream, peer, pending).await
            }
        }
    }

    async fn connection<S: AsyncRead + AsyncWrite + Send + 'static>(
        self: Arc<Self>,
        stream: S,
        peer: SocketAddr,
        pending: PendingGuard,
    ) {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let hello = match wire::read_frame_timeout(
            &mut rd,
            self.opts.max_inbound,
            self.opts.handshake_timeout,
        )
        .await
        {
            Ok(Message::ClientHello(h)) => h,
            Ok(other) => {
                self.stats
                    .handshake_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, got = ?other.msg_type(), "expected a ClientHello first; closing the connection");
                self.refuse(
                    &mut wr,
                    codes::BAD_HELLO,
                    "the first message must be a ClientHello".into(),
                )
                .await;
                return;
            }
            Err(e) => {
                self.stats
                    .handshake_failures
                    .fetch_add(1, Ordering::Relaxed);
                if matches!(e, ReadError::Malformed(_) | ReadError::Truncated) {
                    self.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                }
                tracing::warn!(%peer, error = %e, "handshake failed; closing the connection (is the peer a margay Felix?)");
                if let ReadError::Malformed(p) = &e {
                    self.refuse(&mut wr, codes::BAD_HELLO, p.to_string()).await;
                }
                return;
            }
        };
        drop(pending);
        let Some((version, syncer)) = self.check_hello(&hello, peer, &mut wr).await else {
            return;
        };
        let compress = hello
            .compression
            .iter()
            .any(|c| c.eq_ignore_ascii_case(proto::COMPRESSION_SNAPPY));
        let can_migrate = hello.capabilities.iter().any(|c| c == proto::CAP_MIGRATE);
        let migrating = hello.capabilities.iter().any(|c| c == proto::CAP_MIGRATING);
        let (cmd_tx, mut cmd_rx) = watch::channel(Command::None);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let full = {
            let mut conns = lock(&self.conns);
            let full = migrating && conns.len() >= self.connection_limit();
            if !full {
                conns.insert(
                    id,
                    ConnEntry {
                        syncer,
                        can_migrate,
                        commands: cmd_tx,
                        asked: false,
                    },
                );
            }
            full
        };
        if full {
            self.stats.refused_full.fetch_add(1, Ordering::Relaxed);
            tracing::info!(%peer, host = %shown(&hello.hostname), "refusing a migrating client: this Typha is at its connection limit too");
            let msg = format!(
                "this Typha is at its connection limit ({}); try another",
                self.connection_limit()
            );
            self.refuse(&mut wr, codes::FULL, msg).await;
            return;
        }
        self.stats.active.fetch_add(1, Ordering::Relaxed);
        let _registration = Registration {
            server: self.clone(),
            id,
        };
        tracing::info!(%peer, host = %shown(&hello.hostname), info = %shown(&hello.info), syncer = %syncer, compress, conn = id, "Client connected");

        let server_hello = Message::ServerHello(ServerHello {
            version,
            syncer_type: syncer.name().into(),
            server_id: self.opts.server_id.clone(),
            compression: if compress {
                proto::COMPRESSION_SNAPPY.into()
            } else {
                String::new()
            },
            capabilities: vec![proto::CAP_MIGRATE.into()],
        });
        if let Err(e) = wire::write_frame(
            &mut wr,
            &proto::encode(&server_hello, false),
            self.opts.write_timeout,
        )
        .await
        {
            tracing::info!(%peer, conn = id, error = %e, "client went away during the handshake");
            return;
        }

        // The reader: pongs; anything else from the client ends the connection.
        let last_pong = Arc::new(AtomicU64::new(now_ms()));
        let (reader_done_tx, mut reader_done) = oneshot::channel::<String>();
        let reader = {
            let last_pong = last_pong.clone();
            let max = self.opts.max_inbound;
            let server = self.clone();
            tokio::spawn(async move {
                let why = loop {
                    match wire::read_frame(&mut rd, max).await {
                        Ok(Message::Pong(_)) => last_pong.store(now_ms(), Ordering::Relaxed),
                        Ok(other) => {
                            server.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                            break format!(
                                "unexpected {:?} message from the client",
                                other.msg_type()
                            );
                        }
                        Err(ReadError::Closed) => break "client closed the connection".into(),
                        Err(e) => {
                            if matches!(e, ReadError::Malformed(_) | ReadError::Truncated) {
                                server.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                            }
                            break e.to_string();
                        }
                    }
                };
                let _ = reader_done_tx.send(why);
            })
        };
        let _abort_reader = AbortOnDrop(reader);

        let Some(cache) = self.caches.get(&syncer) else {
            return;
        };
        let started = Instant::now();
        let (mut crumb, cell, snapshot) = match self.join(syncer, compress, cache).await {
            (c, cell, Some(f)) => (c, cell, f),
            (_, _, None) => return,
        };
        if let Err(e) = wire::write_frames_within(&mut wr, &snapshot, self.opts.write_timeout).await
        {
            if matches!(e, wire::WriteError::Timeout(_)) {
                self.stats
                    .dropped_snapshot_deadline
                    .fetch_add(1, Ordering::Relaxed);
            }
            self.note_write_error(&e);
            tracing::warn!(%peer, conn = id, error = %e, "sending the snapshot failed (the whole snapshot must be sent within TYPHA_SERVERWRITETIMEOUTSECS); closing the connection");
            return;
        }
        self.stats
            .frames_sent
            .fetch_add(snapshot.len() as u64, Ordering::Relaxed);
        drop(snapshot);
        drop(cell);
        tracing::debug!(%peer, conn = id, seq = crumb.seq, keys = crumb.snapshot.len(), took = ?started.elapsed(), "snapshot sent");

        // The configuration refuses 0; options built in code must not panic the timer either.
        let mut ping = tokio::time::interval(self.opts.ping_interval.max(Duration::from_millis(1)));
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ping.tick().await;
        let mut grace_deadline: Option<tokio::time::Instant> = None;
        let reason: String = loop {
            tokio::select! {
                next = crumb.wait_next() => {
                    crumb = next;
                    if let Err(why) = self.send_crumbs(&mut wr, &mut crumb, compress, started).await {
                        break why;
                    }
                }
                _ = ping.tick() => {
                    let since = now_ms().saturating_sub(last_pong.load(Ordering::Relaxed));
                    if Duration::from_millis(since) > self.opts.pong_timeout {
                        self.stats.dropped_pong_timeout.fetch_add(1, Ordering::Relaxed);
                        break format!("no pong for {since} ms (pong timeout {:?})", self.opts.pong_timeout);
                    }
                    if let Err(e) = wire::write_frame(&mut wr, &proto::encode(&Message::Ping(now_ms()), false), self.opts.write_timeout).await {
                        self.note_write_error(&e);
                        break e.to_string();
                    }
                }
                r = cmd_rx.changed() => {
                    if r.is_err() {
                        break "server stopping".into();
                    }
                    let cmd = cmd_rx.borrow_and_update().clone();
                    match cmd {
                        Command::None => {}
                        Command::Migrate { reason } => {
                            let grace = self.opts.migration_grace;
                            tracing::info!(%peer, conn = id, reason = %reason, ?grace, "asking the client to migrate to another Typha");
                            let m = Message::Migrate { grace_ms: grace.as_millis() as u64, reason };
                            if let Err(e) = wire::write_frame(&mut wr, &proto::encode(&m, false), self.opts.write_timeout).await {
                                break e.to_string();
                            }
                            grace_deadline = Some(tokio::time::Instant::now() + grace);
                        }
                        Command::Abort => break "aborted".into(),
                        Command::Close { reason } => {
                            let m = Message::Error { code: codes::SHUTTING_DOWN.into(), message: reason.clone() };
                            let _ = wire::write_frame(&mut wr, &proto::encode(&m, false), Duration::from_secs(1)).await;
                            break reason;
                        }
                    }
                }
                _ = sleep_until(grace_deadline), if grace_deadline.is_some() => {
                    self.stats.closed_after_grace.fetch_add(1, Ordering::Relaxed);
                    break "the client did not migrate within the grace period".into();
                }
                why = &mut reader_done => {
                    break why.unwrap_or_else(|_| "reader stopped".into());
                }
            }
        };
        tracing::info!(%peer, host = %shown(&hello.hostname), conn = id, reason = %reason, "Client disconnected");
    }

    /// Sends `crumb` and every crumb after it that is already published; leaves `crumb` at
    /// the last one sent.
    async fn send_crumbs<W: AsyncWrite + Unpin>(
        &self,
        wr: &mut W,
        crumb: &mut Arc<Crumb>,
        compress: bool,
        started: Instant,
    ) -> Result<(), String> {
        loop {
            let behind = crumb.at.elapsed();
            if started.elapsed() > self.opts.new_client_grace && behind > self.opts.max_fall_behind
            {
                self.stats
                    .dropped_fall_behind
                    .fetch_add(1, Ordering::Relaxed);
                let why = format!(
                    "client fell {behind:?} behind (more than MaxFallBehind {:?})",
                    self.opts.max_fall_behind
                );
                let m = Message::Error {
                    code: codes::FELL_BEHIND.into(),
                    message: why.clone(),
                };
                let _ =
                    wire::write_frame(wr, &proto::encode(&m, false), Duration::from_millis(100))
                        .await;
                return Err(why);
            }
            // Every crumb already published goes out in one vectored write (up to about
            // 1 MiB): under a steady stream of small crumbs a client that is a few behind
            // costs one system call, not two per crumb.
            let mut frames: Vec<bytes::Bytes> = Vec::new();
            let mut size = 0usize;
            loop {
                let f = crumb.delta_frames(
                    compress,
                    self.opts.max_kvs_per_msg,
                    self.opts.max_frame_payload,
                );
                size += f.iter().map(|b| b.len()).sum::<usize>();
                frames.extend(f.iter().cloned());
                match crumb.next() {
                    Some(n) if size < 1 << 20 => *crumb = n.clone(),
                    _ => break,
                }
            }
            if let Err(e) = wire::write_frames(wr, &frames, self.opts.write_timeout).await {
                self.note_write_error(&e);
                return Err(e.to_string());
            }
            self.stats
                .frames_sent
                .fetch_add(frames.len() as u64, Ordering::Relaxed);
            match crumb.next() {
                Some(n) => *crumb = n.clone(),
                None => return Ok(()),
            }
        }
    }

    fn note_write_error(&self, e: &wire::WriteError) {
        if matches!(e, wire::WriteError::Timeout(_)) {
            self.stats
                .dropped_write_timeout
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn refuse<W: AsyncWrite + Unpin>(&self, wr: &mut W, code: &str, message: String) {
        let m = Message::Error {
            code: code.into(),
            message,
        };
        let _ = wire::write_frame(wr, &proto::encode(&m, false), Duration::from_secs(1)).await;
    }

    /// Checks the hello: the version range and the syncer type. Refuses with a clear error.
    async fn check_hello<W: AsyncWrite + Unpin>(
        &self,
        h: &ClientHello,
        peer: SocketAddr,
        wr: &mut W,
    ) -> Option<(u32, SyncerType)> {
        let version = h.max_version.min(proto::PROTOCOL_VERSION);
        if h.min_version > h.max_version
            || version < h.min_version
            || version < proto::MIN_PROTOCOL_VERSION
        {
            self.stats
                .version_mismatches
                .fetch_add(1, Ordering::Relaxed);
            let msg = format!(
                "protocol version mismatch: this Typha ({}) speaks versions {}..={}, the client \"{}\" speaks {}..={}; upgrade the older side",
                self.opts.server_id,
                proto::MIN_PROTOCOL_VERSION,
                proto::PROTOCOL_VERSION,
                shown(&h.hostname),
                h.min_version,
                h.max_version
            );
            tracing::error!(%peer, "{msg}");
            self.refuse(wr, codes::VERSION_MISMATCH, msg).await;
            return None;
        }
        if self.shutting_down.load(Ordering::Relaxed) {
            self.refuse(
                wr,
                codes::SHUTTING_DOWN,
                "this Typha is shutting down; try another".into(),
            )
            .await;
            return None;
        }
        let syncer = SyncerType::parse(&h.syncer_type).filter(|t| self.caches.contains_key(t));
        let Some(syncer) = syncer else {
            let served: Vec<&str> = self.caches.keys().map(|t| t.name()).collect();
            let msg = format!(
                "syncer type \"{}\" is not served here (served: {})",
                shown(&h.syncer_type),
                served.join(", ")
            );
            tracing::warn!(%peer, "{msg}");
            self.stats
                .handshake_failures
                .fetch_add(1, Ordering::Relaxed);
            self.refuse(wr, codes::UNKNOWN_SYNCER_TYPE, msg).await;
            return None;
        };
        Some((version, syncer))
    }

    /// The crumb a new client starts at, and its snapshot frames (with the cell that keeps
    /// them shared while the client sends them): the snapshot being shared when there is
    /// one (see [`Share`]), else the newest crumb's.
    async fn join(
        &self,
        syncer: SyncerType,
        compress: bool,
        cache: &CacheReader,
    ) -> (Arc<Crumb>, Arc<SnapshotCell>, Option<Frames>) {
        let latest = cache.latest();
        let max_age = (self.opts.max_fall_behind / 2).max(self.opts.snapshot_reuse);
        let (base, cell) = {
            let mut shares = lock(&self.snapshot_base);
            let reuse = shares.get(&(syncer, compress)).and_then(|sh| {
                let base = sh.base.upgrade()?;
                let cell = sh.cell.upgrade()?;
                (sh.at.elapsed() <= max_age && base.seq <= latest.seq).then_some((base, cell))
            });
            match reuse {
                Some(shared) => {
                    self.stats.snapshots_shared.fetch_add(1, Ordering::Relaxed);
                    shared
                }
                None => {
                    let cell = Arc::new(SnapshotCell::new());
                    shares.insert(
                        (syncer, compress),
                        Share {
                            base: Arc::downgrade(&latest),
                            cell: Arc::downgrade(&cell),
                            fresh: Some((latest.clone(), cell.clone())),
                            at: Instant::now(),
                        },
                    );
                    (latest, cell)
                }
            }
        };
        let (max_kvs, max_bytes) = (self.opts.max_kvs_per_msg, self.opts.max_frame_payload);
        let frames = cell
            .get_or_try_init(|| {
                let b = base.clone();
                self.stats.snapshots_encoded.fetch_add(1, Ordering::Relaxed);
                async move {
                    tokio::task::spawn_blocking(move || {
                        b.encode_snapshot(compress, max_kvs, max_bytes)
                    })
                    .await
                }
            })
            .await
            .ok()
            .cloned();
        if frames.is_none() {
            tracing::error!(syncer = %syncer, "encoding the snapshot failed");
        }
        (base, cell, frames)
    }

    /// The newest status of a syncer type's cache (for health).
    pub fn status(&self, syncer: SyncerType) -> Option<SyncStatus> {
        self.caches.get(&syncer).map(|c| c.latest().status)
    }
}

struct Registration {
    server: Arc<Server>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.server.conns).remove(&self.id);
        self.server.stats.active.fetch_sub(1, Ordering::Relaxed);
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
