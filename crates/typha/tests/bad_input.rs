#![allow(clippy::unwrap_used)]
//! Bad input against a live Typha: garbage, truncated and oversized frames, a client that
//! never reads, protocol version mismatches (both directions) and bad client certificates.
//! In every case the bad connection is closed within a bounded time, the server says why
//! (a counter and a log line), and a well-behaved client connected at the same time keeps
//! receiving updates without reconnecting.

mod common;

use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::*;
use margay_datastore::{KvBackend, MemBackend};
use margay_typha::TyphaConfig;
use margay_typha::client::ConnectionState;
use margay_typha::daemon::Embedded;
use margay_typha::proto::{self, ClientHello, Message, codes};
use margay_typha::tls::{ClientTls, ExpectedPeer, FELIX_PARAMS, ServerTls, TYPHA_PARAMS, TlsFiles};
use margay_typha::wire;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long any bad connection may live (beyond the timeouts the test configures).
const BOUND: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------
// Log capture: the server's log lines are asserted on (every test shares one subscriber,
// so assertions look for something unique to the test, such as a client hostname).

static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;
impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(|| Capture)
            .try_init();
    });
}

fn logged(needle: &str) -> bool {
    String::from_utf8_lossy(&LOGS.lock().unwrap()).contains(needle)
}

// ---------------------------------------------------------------------------------------

/// A Typha over a MemBackend with `n` resources and one well-behaved client in sync.
struct Setup {
    kv: MemBackend,
    typha: Embedded,
    good: TestClient,
    generation: u64,
}

async fn setup(cfg: &TyphaConfig, tls: Option<(ServerTls, ClientTls)>, n: usize) -> Setup {
    capture_logs();
    let kv = MemBackend::new();
    for i in 0..n {
        put(&kv, i, 0).await;
    }
    let (server_tls, client_tls) = match tls {
        Some((s, c)) => (Some(s), Some(c)),
        None => (None, None),
    };
    let typha = Embedded::start(kv.clone(), cfg, server_tls, "127.0.0.1:0")
        .await
        .unwrap();
    let mut opts = client_opts(vec![typha.addr.to_string()], "good-felix");
    opts.tls = client_tls;
    let good = TestClient::start(opts);
    wait_for("the good client in sync", Duration::from_secs(20), || {
        good.in_sync()
    })
    .await;
    let s = Setup {
        kv,
        typha,
        good,
        generation: 0,
    };
    s.good_client_converges().await;
    s
}

impl Setup {
    fn addr(&self) -> String {
        self.typha.addr.to_string()
    }

    /// The well-behaved client's view equals the datastore's.
    async fn good_client_converges(&self) {
        let t = Instant::now();
        loop {
            let want = store_view(&self.kv).await;
            if self.good.view() == want {
                return;
            }
            assert!(
                t.elapsed() < BOUND,
                "the good client did not converge within {BOUND:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Writes a few keys and checks that the good client receives them, on the connection
    /// it always had.
    async fn good_client_still_receives(&mut self) {
        self.generation += 1;
        for i in 0..5 {
            put(&self.kv, i * 3, self.generation).await;
        }
        self.good_client_converges().await;
        assert_eq!(
            self.good.stats.connects.load(Ordering::Relaxed),
            1,
            "the good client had to reconnect"
        );
        let s = self.good.seen.lock().unwrap();
        assert!(
            !s.connections
                .iter()
                .any(|c| matches!(c, ConnectionState::Disconnected { .. })),
            "the good client was disconnected: {:?}",
            s.connections
        );
        assert!(s.deletes.is_empty(), "spurious deletes {:?}", s.deletes);
    }

    /// The server counts only the good client (the bad connection is gone) within `bound`.
    async fn only_good_client_left(&self, bound: Duration) {
        let server = self.typha.server.clone();
        wait_for("the bad connection to go", bound, || {
            server.connections() == 1
        })
        .await;
    }
}

fn hello(min: u32, max: u32, host: &str) -> Message {
    Message::ClientHello(ClientHello {
        min_version: min,
        max_version: max,
        hostname: host.into(),
        info: "bad_input test".into(),
        syncer_type: "felix".into(),
        compression: vec![],
        capabilities: vec![],
    })
}

/// Reads until the peer closes (EOF or an error) within `bound`; returns what was read.
async fn read_until_closed<S: AsyncRead + Unpin>(s: &mut S, bound: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let t = Instant::now();
    loop {
        let left = bound.saturating_sub(t.elapsed());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return out,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "the server kept the connection open for more than {bound:?} (read {} bytes)",
                out.len()
            ),
        }
    }
}

/// The frames in what the server sent before closing; the last one must be an Error with
/// `code` when given.
fn expect_error_frame(bytes: &[u8], code: &str) -> String {
    let (msgs, err) = proto::decode_stream(bytes, proto::DEFAULT_MAX_CLIENT_INBOUND);
    assert_eq!(err, None, "the server's answer does not decode: {bytes:?}");
    match msgs.last() {
        Some(Message::Error { code: c, message }) if c == code => message.clone(),
        other => panic!("expected an Error ({code}) before the close, got {other:?}"),
    }
}

/// Connects and completes a handshake by hand (the connection is then a client in sync
/// or getting there); returns the stream after the ServerHello.
async fn handshaken(addr: &str, host: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&proto::encode(&hello(1, 1, host), false))
        .await
        .unwrap();
    match wire::read_frame_timeout(&mut s, 1 << 24, BOUND)
        .await
        .unwrap()
    {
        Message::ServerHello(h) => assert_eq!(h.version, proto::PROTOCOL_VERSION),
        other => panic!("expected a ServerHello, got {other:?}"),
    }
    s
}

// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bytes_are_refused() {
    let cfg = fast_config();
    let mut s = setup(&cfg, None, 50).await;
    let bad_before = s.typha.server.stats.bad_frames.load(Ordering::Relaxed);

    // An HTTP request: its first four bytes read as a length of ~1.2 GB.
    let mut c = TcpStream::connect(s.addr()).await.unwrap();
    c.write_all(b"GET /readiness HTTP/1.1\r\nHost: typha\r\n\r\n")
        .await
        .unwrap();
    let t = Instant::now();
    let answer = read_until_closed(&mut c, BOUND).await;
    let why = expect_error_frame(&answer, codes::BAD_HELLO);
    assert!(why.contains("exceeds the limit"), "{why}");
    eprintln!("HTTP request closed after {:?}: {why}", t.elapsed());

    // Pseudo-random bytes (fixed seed), and a well-sized frame of an unknown type.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let noise: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let unknown_type = [0u8, 0, 0, 3, 0xee, 0, 1];
    for junk in [&noise[..], &unknown_type[..]] {
        let mut c = TcpStream::connect(s.addr()).await.unwrap();
        // The server may close before it read everything: a failed write is fine.
        let _ = c.write_all(junk).await;
        let answer = read_until_closed(&mut c, BOUND).await;
        expect_error_frame(&answer, codes::BAD_HELLO);
        s.good_client_still_receives().await;
    }

    // Garbage after a good handshake: the reader side of the connection gives up.
    let mut c = handshaken(&s.addr(), "garbage-after-hello").await;
    let _ = c.write_all(&noise).await;
    read_until_closed(&mut c, BOUND).await;
    s.only_good_client_left(BOUND).await;
    s.good_client_still_receives().await;

    assert!(s.typha.server.stats.bad_frames.load(Ordering::Relaxed) >= bad_before + 4);
    assert!(logged("handshake failed; closing the connection"));
    assert!(logged("garbage-after-hello"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_frames_are_closed() {
    let cfg = fast_config();
    let mut s = setup(&cfg, None, 50).await;
    let failures = s
        .typha
        .server
        .stats
        .handshake_failures
        .load(Ordering::Relaxed);

    // Half a ClientHello, then EOF.
    let full = proto::encode(&hello(1, 1, "truncated"), false);
    let mut c = TcpStream::connect(s.addr()).await.unwrap();
    c.write_all(&full[..full.len() / 2]).await.unwrap();
    c.shutdown().await.unwrap();
    let answer = read_until_closed(&mut c, BOUND).await;
    assert!(answer.is_empty(), "nothing is owed to a truncated hello");
    s.good_client_still_receives().await;

    // Three bytes of a length, then EOF.
    let mut c = TcpStream::connect(s.addr()).await.unwrap();
    c.write_all(&[0, 0, 0]).await.unwrap();
    c.shutdown().await.unwrap();
    read_until_closed(&mut c, BOUND).await;

    // Half a frame and then silence (no EOF): the handshake timeout closes it.
    let mut c = TcpStream::connect(s.addr()).await.unwrap();
    c.write_all(&full[..full.len() / 2]).await.unwrap();
    let t = Instant::now();
    read_until_closed(&mut c, cfg.server_handshake_timeout + BOUND).await;
    assert!(t.elapsed() >= cfg.server_handshake_timeout - Duration::from_millis(100));
    s.good_client_still_receives().await;

    // After the handshake: half a Pong, then EOF.
    let mut c = handshaken(&s.addr(), "truncated-pong").await;
    let pong = proto::encode(&Message::Pong(7), false);
    c.write_all(&pong[..pong.len() - 1]).await.unwrap();
    c.shutdown().await.unwrap();
    read_until_closed(&mut c, BOUND).await;
    s.only_good_client_left(BOUND).await;
    s.good_client_still_receives().await;

    assert!(
        s.typha
            .server
            .stats
            .handshake_failures
            .load(Ordering::Relaxed)
            >= failures + 3
    );
    assert!(logged("truncated-pong"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frames_are_refused_without_reading_them() {
    let cfg = fast_config();
    let mut s = setup(&cfg, None, 50).await;
    // Clients only send a hello and pongs: the server reads at most 16 KiB per frame.
    let limit = cfg.server_max_inbound_bytes.min(proto::MAX_CLIENT_FRAME);

    // A header announcing one byte over the limit: refused on the header alone (the server
    // does not wait for, or allocate, the body).
    let mut c = TcpStream::connect(s.addr()).await.unwrap();
    let mut header = ((limit + 3) as u32).to_be_bytes().to_vec();
    header.extend_from_slice(&[proto::MsgType::ClientHello as u8, 0]);
    c.write_all(&header).await.unwrap();
    let t = Instant::now();
    let answer = read_until_closed(&mut c, BOUND).await;
    let why = expect_error_frame(&answer, codes::BAD_HELLO);
    assert!(why.contains(&format!("limit of {limit} bytes")), "{why}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    s.good_client_still_receives().await;

    // The largest length a header can say.
    let mut c = TcpStream::connect(s.addr()).await.unwrap();
    c.write_all(&[0xff, 0xff, 0xff, 0xff, 1, 0]).await.unwrap();
    let answer = read_until_closed(&mut c, BOUND).await;
    expect_error_frame(&answer, codes::BAD_HELLO);

    // After the handshake, an oversized "pong" ends that connection only.
    let mut c = handshaken(&s.addr(), "oversized-pong").await;
    let mut big = ((limit + 100) as u32).to_be_bytes().to_vec();
    big.extend_from_slice(&[proto::MsgType::Pong as u8, 0]);
    c.write_all(&big).await.unwrap();
    read_until_closed(&mut c, BOUND).await;
    s.only_good_client_left(BOUND).await;
    s.good_client_still_receives().await;
    assert!(logged("exceeds the limit"));
}

/// A value of about `nets` × 18 bytes (a NetworkSet with that many /32s).
fn big_value(i: usize, generation: u64, nets: usize) -> Vec<u8> {
    let list: Vec<String> = (0..nets)
        .map(|j| format!("\"10.{}.{}.{}/32\"", i & 0xff, (j >> 8) & 0xff, j & 0xff))
        .collect();
    format!(
        r#"{{"apiVersion":"projectcalico.org/v3","kind":"NetworkSet","metadata":{{"name":"big-{i}","namespace":"ns","labels":{{"gen":"g{generation}"}}}},"spec":{{"nets":[{}]}}}}"#,
        list.join(",")
    )
    .into_bytes()
}

fn big_key(i: usize) -> String {
    format!("/calico/resources/v3/projectcalico.org/networksets/ns/big-{i}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_dropped_after_the_write_timeout() {
    let mut cfg = fast_config();
    cfg.server_write_timeout = Duration::from_secs(2);
    // Long enough that only the write timeout can be what drops the client.
    cfg.server_pong_timeout = Duration::from_secs(60);
    let mut s = setup(&cfg, None, 20).await;
    // About 10 MB of snapshot: more than the server's socket send buffer (4 MiB at most
    // here) plus the stuck client's tiny receive buffer, so the server's writes block.
    for i in 0..500 {
        s.kv.create(&big_key(i), big_value(i, 0, 1100), None)
            .await
            .unwrap();
    }
    s.good_client_converges().await;
    assert!(
        s.typha.caches[&margay_typha::SyncerType::Felix]
            .latest()
            .snapshot
            .len()
            >= 520,
        "the big values passed the validation filter"
    );

    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut stuck = sock.connect(s.typha.addr).await.unwrap();
    stuck
        .write_all(&proto::encode(&hello(1, 1, "never-reads"), false))
        .await
        .unwrap();
    // The ServerHello and the first part of the snapshot sit unread in the socket buffers.
    let t = Instant::now();
    let server = s.typha.server.clone();
    wait_for("the stuck client to be connected", BOUND, || {
        server.connections() == 2
    })
    .await;

    // While the server is blocked writing to it, the good client is served as usual.
    s.good_client_still_receives().await;
    assert_eq!(server.connections(), 2, "dropped before the write timeout");

    // Dropped once a write took longer than the write timeout; nothing else was.
    s.only_good_client_left(cfg.server_write_timeout + BOUND)
        .await;
    let after = t.elapsed();
    assert!(after >= cfg.server_write_timeout - Duration::from_millis(100));
    assert_eq!(
        server.stats.dropped_write_timeout.load(Ordering::Relaxed),
        1
    );
    eprintln!("the stuck client was dropped {after:?} after it connected");
    s.good_client_still_receives().await;
    // The stuck client finds the connection closed once it reads what was buffered.
    read_until_closed(&mut stuck, BOUND).await;
    assert!(logged("never-reads"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_version_mismatches_are_clear_errors_on_both_sides() {
    let cfg = fast_config();
    let mut s = setup(&cfg, None, 50).await;

    // A client from the future (v99 only), by hand: an Error naming both ranges, then EOF.
    let mut c = TcpStream::connect(s.addr()).await.unwrap();
    c.write_all(&proto::encode(
        &hello(99, 99, "felix-from-the-future"),
        false,
    ))
    .await
    .unwrap();
    let t = Instant::now();
    let answer = read_until_closed(&mut c, BOUND).await;
    let why = expect_error_frame(&answer, codes::VERSION_MISMATCH);
    assert!(why.contains("speaks versions 1..=1"), "{why}");
    assert!(why.contains("99..=99"), "{why}");
    assert!(t.elapsed() < Duration::from_secs(1));
    assert!(logged("protocol version mismatch"));
    assert!(logged("felix-from-the-future"));
    s.good_client_still_receives().await;

    // The real client, too old for this Typha: it reports the mismatch (not a hang, not
    // just "unreachable") and keeps retrying with backoff.
    let mut o = client_opts(vec![s.addr()], "felix-from-the-past");
    o.min_version = 0;
    o.max_version = 0;
    let old = TestClient::start(o);
    wait_for("the old client to report", BOUND, || {
        !old.seen.lock().unwrap().connections.is_empty()
    })
    .await;
    match &old.seen.lock().unwrap().connections[0] {
        ConnectionState::Disconnected { reason } => {
            assert!(reason.contains(codes::VERSION_MISMATCH), "{reason}");
            assert!(reason.contains("upgrade the older side"), "{reason}");
        }
        other => panic!("expected Disconnected, got {other:?}"),
    }
    assert!(!old.in_sync());
    assert!(
        s.typha
            .server
            .stats
            .version_mismatches
            .load(Ordering::Relaxed)
            >= 2
    );
    drop(old);
    s.good_client_still_receives().await;

    // The other direction: a "Typha" that answers with a version the client does not speak.
    let fake = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake_addr = fake.local_addr().unwrap().to_string();
    let fake_task = tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = fake.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let _ = wire::read_frame(&mut c, 1 << 20).await;
                let h = Message::ServerHello(proto::ServerHello {
                    version: 99,
                    syncer_type: "felix".into(),
                    server_id: "future-typha".into(),
                    compression: String::new(),
                    capabilities: vec![],
                });
                let _ = c.write_all(&proto::encode(&h, false)).await;
                // Keep the connection open: the client must not wait for more.
                tokio::time::sleep(Duration::from_secs(60)).await;
            });
        }
    });
    let c = TestClient::start(client_opts(vec![fake_addr], "felix-vs-future-typha"));
    wait_for("the client to report", BOUND, || {
        !c.seen.lock().unwrap().connections.is_empty()
    })
    .await;
    match &c.seen.lock().unwrap().connections[0] {
        ConnectionState::Disconnected { reason } => {
            assert!(reason.contains("chose protocol version 99"), "{reason}");
        }
        other => panic!("expected Disconnected, got {other:?}"),
    }
    fake_task.abort();
    s.good_client_still_receives().await;
}

// ---------------------------------------------------------------------------------------
// TLS

struct Pki {
    dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    ca_params: rcgen::CertificateParams,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new() -> Pki {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "margay test CA");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = p.self_signed(&ca_key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Pki {
            dir,
            ca,
            ca_params: p,
            ca_key,
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().into_owned()
    }

    /// A leaf certificate with CN `cn` (signed by this CA, or self-signed when `rogue`),
    /// written as `<name>.pem` / `<name>-key.pem`.
    fn leaf(&self, name: &str, cn: &str, rogue: bool) {
        let mut p =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = if rogue {
            p.self_signed(&key).unwrap()
        } else {
            let issuer = rcgen::Issuer::from_params(&self.ca_params, &self.ca_key);
            p.signed_by(&key, &issuer).unwrap()
        };
        std::fs::write(self.path(&format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{name}-key.pem")), key.serialize_pem()).unwrap();
    }

    fn files(&self, name: &str, peer_cn: &str) -> TlsFiles {
        TlsFiles {
            key_file: self.path(&format!("{name}-key.pem")),
            cert_file: self.path(&format!("{name}.pem")),
            ca_file: self.path("ca.pem"),
            expected: ExpectedPeer {
                cn: peer_cn.into(),
                uri_san: String::new(),
            },
        }
    }

    fn client(&self, name: &str) -> ClientTls {
        ClientTls::from_files(&self.files(name, "typha"), FELIX_PARAMS).unwrap()
    }
}

/// Sends a hello over an established stream and expects the server to end the connection
/// without ever sending a ServerHello; returns the error code if it sent one.
async fn refused_after_hello<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    host: &str,
) -> Option<String> {
    let _ = s.write_all(&proto::encode(&hello(1, 1, host), false)).await;
    let _ = s.flush().await;
    let answer = read_until_closed(&mut s, BOUND).await;
    let (msgs, _) = proto::decode_stream(&answer, proto::DEFAULT_MAX_CLIENT_INBOUND);
    assert!(
        !msgs.iter().any(|m| matches!(m, Message::ServerHello(_))),
        "the server accepted {host}: {msgs:?}"
    );
    msgs.into_iter().find_map(|m| match m {
        Message::Error { code, .. } => Some(code),
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_client_certificates_are_refused() {
    let pki = Pki::new();
    pki.leaf("typha", "typha", false);
    pki.leaf("felix", "felix", false);
    pki.leaf("rogue", "felix", true);
    pki.leaf("intruder", "intruder", false);
    let server_tls = ServerTls::from_files(&pki.files("typha", "felix"), TYPHA_PARAMS).unwrap();
    let cfg = fast_config();
    let mut s = setup(&cfg, Some((server_tls, pki.client("felix"))), 50).await;
    let stats = s.typha.server.clone();
    let tls_failures = || stats.stats.tls_failures.load(Ordering::Relaxed);

    // 1. No TLS at all: a plaintext hello is not a TLS ClientHello.
    let c = TcpStream::connect(s.addr()).await.unwrap();
    assert_eq!(refused_after_hello(c, "plaintext").await, None);
    s.good_client_still_receives().await;
    wait_for("the TLS failure counted", BOUND, || tls_failures() >= 1).await;

    // 2. TLS without a client certificate (the server's chain is trusted).
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca.der().clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(s.addr()).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    // TLS 1.3 may complete the client's side before the server refuses; either way no
    // ServerHello ever comes.
    if let Ok(Ok(tls)) = tokio::time::timeout(BOUND, connector.connect(name, tcp)).await {
        assert_eq!(refused_after_hello(tls, "no-cert").await, None);
    }
    s.good_client_still_receives().await;
    wait_for("the TLS failure counted", BOUND, || tls_failures() >= 2).await;

    // 3. A certificate from another CA, through the real client: never in sync, and its
    //    state says TLS / handshake.
    let rogue = TestClient::start({
        let mut o = client_opts(vec![s.addr()], "rogue-felix");
        o.tls = Some(pki.client("rogue"));
        o
    });
    wait_for("the rogue client to report", BOUND, || {
        !rogue.seen.lock().unwrap().connections.is_empty()
    })
    .await;
    let reason = format!("{:?}", rogue.seen.lock().unwrap().connections[0]);
    assert!(reason.contains("Disconnected"), "{reason}");
    assert!(!rogue.in_sync());
    drop(rogue);
    wait_for("the TLS failure counted", BOUND, || tls_failures() >= 3).await;
    s.good_client_still_receives().await;

    // 4. A certificate from the right CA with the wrong CN: a clear refusal.
    let intruder = TestClient::start({
        let mut o = client_opts(vec![s.addr()], "intruder-felix");
        o.tls = Some(pki.client("intruder"));
        o
    });
    wait_for("the intruder to report", BOUND, || {
        !intruder.seen.lock().unwrap().connections.is_empty()
    })
    .await;
    let reason = format!("{:?}", intruder.seen.lock().unwrap().connections[0]);
    assert!(reason.contains(codes::CERTIFICATE_REFUSED), "{reason}");
    assert!(!intruder.in_sync());
    drop(intruder);
    s.good_client_still_receives().await;

    // 5. A TCP connection that never starts TLS: closed after the handshake timeout.
    let mut silent = TcpStream::connect(s.addr()).await.unwrap();
    read_until_closed(&mut silent, cfg.server_handshake_timeout + BOUND).await;

    s.only_good_client_left(BOUND).await;
    s.good_client_still_receives().await;
    assert!(logged("client certificate refused"));
    assert!(logged("TLS handshake failed"));
    let _ = std::io::stderr().flush();
}

/// A hostname with a newline cannot forge a line in Typha's log: client strings are logged
/// escaped (before the fix the newline went into the log as is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_strings_cannot_forge_log_lines() {
    let cfg = fast_config();
    let mut s = setup(&cfg, None, 5).await;
    let forged = "FORGED-by-hostname level=ERROR";
    let mut c = handshaken(&s.addr(), &format!("forger\n{forged}\r")).await;
    wait_for("the forger connected", BOUND, || {
        s.typha.server.connections() == 2
    })
    .await;
    c.shutdown().await.unwrap();
    drop(c);
    s.only_good_client_left(BOUND).await;
    s.good_client_still_receives().await;
    let logs = String::from_utf8_lossy(&LOGS.lock().unwrap()).to_string();
    assert!(
        logs.contains(&format!("forger\\n{forged}\\r")),
        "escaped in the log"
    );
    assert!(
        !logs.lines().any(|l| l.starts_with(forged)),
        "a line was forged:\n{logs}"
    );
}

/// A stored value larger than any client accepts in one frame: before the fix Typha sent
/// it and every client refused the frame and reconnected forever; now it is served as
/// deleted and reported (a counter and a log line naming the key), and the clients stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_too_large_for_clients_are_reported_not_sent() {
    // Another writer stored it (margay's own writers refuse it): lift this process's limit.
    margay_datastore::kv::set_max_value_size(64 << 20);
    let cfg = fast_config();
    let s = setup(&cfg, None, 5).await;
    // An IPAM block: served as stored, without decoding.
    let key = "/calico/ipam/v2/assignment/ipv4/block/10.9.0.0-26";
    let huge = vec![b'x'; proto::DEFAULT_MAX_CLIENT_INBOUND + 1];
    s.kv.create(key, huge, None).await.unwrap();
    let stats = s.typha.upstream[&margay_typha::SyncerType::Felix].clone();
    wait_for("the huge value reported", BOUND, || {
        stats.oversized.load(Ordering::Relaxed) == 1
    })
    .await;
    assert!(logged("block/10.9.0.0-26"));
    // Later updates still arrive, on the same connection; the huge value never does.
    put(&s.kv, 1, 42).await;
    wait_for("an update after the huge value", BOUND, || {
        s.good
            .view()
            .get(&common::key(1))
            .is_some_and(|(v, _)| *v == value(1, 42))
    })
    .await;
    assert!(!s.good.view().contains_key(key));
    assert_eq!(
        s.good.stats.connects.load(Ordering::Relaxed),
        1,
        "the client reconnected"
    );
    // A value just within the limit goes out (the check is not too tight), in a frame of
    // its own even when other changes are batched with it.
    let fits = vec![b'y'; proto::max_served_value(key)];
    s.kv.update(key, fits, None, None).await.unwrap();
    put(&s.kv, 2, 43).await;
    wait_for(
        "the value that fits delivered",
        Duration::from_secs(10),
        || {
            s.good
                .view()
                .get(key)
                .is_some_and(|(v, _)| v.len() == proto::max_served_value(key))
        },
    )
    .await;
    assert_eq!(s.good.stats.connects.load(Ordering::Relaxed), 1);
    // A new client gets it in its snapshot too.
    let late = TestClient::start(client_opts(vec![s.addr()], "late-felix"));
    wait_for("the late client in sync", Duration::from_secs(10), || {
        late.view().contains_key(key)
    })
    .await;
    assert_eq!(late.stats.connects.load(Ordering::Relaxed), 1);
}
