//! The shared daemon server over loopback: health and metrics routes, methods, the request
//! bounds (head size, slow clients, connection cap), the graceful stop, and TLS with client
//! certificates.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use margay_daemon_http::metrics::{Counter, Kind, Registry};
use margay_daemon_http::{
    ClientAuth, Handler, Health, Limits, Router, TlsFiles, TlsSource, get, serve, tls::Settings,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

struct Flag(Arc<AtomicBool>);

impl Health for Flag {
    fn liveness(&self) -> (u16, String) {
        (200, "live\n".into())
    }
    fn readiness(&self) -> (u16, String) {
        if self.0.load(Ordering::SeqCst) {
            (200, "ready\n".into())
        } else {
            (503, "not ready: syncing\n".into())
        }
    }
}

struct Running {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(handler: Handler, tls: Option<Arc<dyn TlsSource>>, limits: Limits) -> Running {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(serve(l, handler, tls, limits, rx));
    Running { addr, stop, task }
}

/// Sends `raw` and reads the whole answer (the server closes after one response).
async fn raw(addr: SocketAddr, raw: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

fn router(ready: Arc<AtomicBool>) -> (Handler, Counter) {
    let mut reg = Registry::new();
    let c = Counter::default();
    reg.register_calico("t_started", "Started.", Kind::Counter, c.clone());
    let h = Router::new()
        .health(Arc::new(Flag(ready)))
        .metrics(Arc::new(reg))
        .into_handler();
    (h, c)
}

#[tokio::test]
async fn health_and_metrics_routes_answer_as_calicos_do() {
    let ready = Arc::new(AtomicBool::new(false));
    let (h, c) = router(ready.clone());
    let s = start(h, None, Limits::default()).await;
    assert_eq!(
        get(s.addr, "/liveness").await.unwrap(),
        (200, "live\n".into())
    );
    assert_eq!(
        get(s.addr, "/readiness").await.unwrap(),
        (503, "not ready: syncing\n".into())
    );
    ready.store(true, Ordering::SeqCst);
    assert_eq!(
        get(s.addr, "/readiness?verbose=1").await.unwrap(),
        (200, "ready\n".into())
    );
    c.add(2);
    let (code, body) = get(s.addr, "/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        body.contains("# TYPE t_started counter\nt_started 2\n"),
        "{body}"
    );
    assert_eq!(get(s.addr, "/").await.unwrap().1, body);
    assert_eq!(
        get(s.addr, "/nope").await.unwrap(),
        (404, "404 page not found\n".into())
    );

    let head = raw(s.addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(
        head.contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{head}"
    );
    // HEAD: the headers, no body.
    let r = raw(s.addr, b"HEAD /liveness HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert!(
        r.contains("content-length: 5\r\n") && r.ends_with("\r\n\r\n"),
        "{r}"
    );
    // Other methods: 405 with Allow.
    let r = raw(
        s.addr,
        b"POST /liveness HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 405 "), "{r}");
    assert!(r.contains("allow: GET, HEAD\r\n"), "{r}");
    // Not HTTP at all: 400, and the server goes on.
    let r = raw(s.addr, b"\x16\x03\x01 garbage\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 400 "), "{r}");
    assert_eq!(get(s.addr, "/liveness").await.unwrap().0, 200);

    s.stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), s.task)
        .await
        .unwrap()
        .unwrap();
    assert!(TcpStream::connect(s.addr).await.is_err(), "still listening");
}

#[tokio::test]
async fn oversized_heads_slow_clients_and_floods_are_bounded() {
    let (h, _) = router(Arc::new(AtomicBool::new(true)));
    let limits = Limits {
        max_header_bytes: 8 * 1024,
        max_headers: 16,
        request_timeout: Duration::from_millis(500),
        max_connections: 2,
    };
    let s = start(h, None, limits).await;

    // A head over the limit: 431, not a buffer that grows.
    let mut req = b"GET /liveness HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    req.extend(std::iter::repeat_n(b'a', 64 * 1024));
    req.extend(b"\r\n\r\n");
    let r = raw(s.addr, &req).await;
    assert!(r.starts_with("HTTP/1.1 431 "), "{r}");
    // Too many headers: 431 as well.
    let mut req = b"GET /liveness HTTP/1.1\r\n".to_vec();
    for i in 0..40 {
        req.extend(format!("X-{i}: y\r\n").as_bytes());
    }
    req.extend(b"\r\n");
    let r = raw(s.addr, &req).await;
    assert!(r.starts_with("HTTP/1.1 431 "), "{r}");

    // Two silent clients fill both slots; a third waits, and is answered once the silent
    // ones are cut off at the deadline.
    let silent1 = TcpStream::connect(s.addr).await.unwrap();
    let silent2 = TcpStream::connect(s.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    let (code, _) = get(s.addr, "/liveness").await.unwrap();
    let waited = t.elapsed();
    assert_eq!(code, 200);
    assert!(
        waited >= Duration::from_millis(300),
        "answered after {waited:?}, before the silent connections were closed"
    );
    for mut c in [silent1, silent2] {
        let mut buf = Vec::new();
        // Closed by the server (EOF or a 408), well within the hang bound.
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut buf))
            .await
            .unwrap();
    }
    s.stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), s.task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn stop_waits_for_requests_in_flight_within_the_deadline() {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = Arc::new(std::sync::Mutex::new(rx));
    // A handler that blocks until told (a slow metrics render).
    let h: Handler = Arc::new(move |_p: &str| {
        let _ = rx.lock().unwrap().recv_timeout(Duration::from_millis(300));
        margay_daemon_http::Response::text(200, "done\n")
    });
    let s = start(h, None, Limits::default()).await;
    let addr = s.addr;
    let client = tokio::spawn(async move { get(addr, "/x").await.unwrap() });
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.stop.send(true).unwrap();
    let _ = tx.send(());
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), client)
            .await
            .unwrap()
            .unwrap(),
        (200, "done\n".into())
    );
    tokio::time::timeout(Duration::from_secs(5), s.task)
        .await
        .unwrap()
        .unwrap();
}

// ---- TLS ----------------------------------------------------------------------------------

struct Pki {
    dir: std::path::PathBuf,
    ca_params: rcgen::CertificateParams,
    ca_key: rcgen::KeyPair,
    ca_der: rustls::pki_types::CertificateDer<'static>,
}

impl Pki {
    fn new(tag: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("daemon-http-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "test CA");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = p.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Pki {
            dir,
            ca_params: p,
            ca_key,
            ca_der: ca.der().clone(),
        }
    }

    /// A leaf signed by the CA (or self-signed: `rogue`); returns (cert, key) DER.
    fn leaf(
        &self,
        name: &str,
        rogue: bool,
    ) -> (
        rustls::pki_types::CertificateDer<'static>,
        rustls::pki_types::PrivateKeyDer<'static>,
    ) {
        let p = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = if rogue {
            p.self_signed(&key).unwrap()
        } else {
            let issuer = rcgen::Issuer::from_params(&self.ca_params, &self.ca_key);
            p.signed_by(&key, &issuer).unwrap()
        };
        std::fs::write(self.dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(
            self.dir.join(format!("{name}-key.pem")),
            key.serialize_pem(),
        )
        .unwrap();
        (
            cert.der().clone(),
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
    }

    fn path(&self, f: &str) -> String {
        self.dir.join(f).display().to_string()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// GET /liveness over TLS with an optional client certificate: the status, or why not.
async fn tls_get(
    addr: SocketAddr,
    pki: &Pki,
    client: Option<(
        rustls::pki_types::CertificateDer<'static>,
        rustls::pki_types::PrivateKeyDer<'static>,
    )>,
) -> Result<u16, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der.clone()).unwrap();
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let cfg = match client {
        Some((c, k)) => b.with_client_auth_cert(vec![c], k).unwrap(),
        None => b.with_no_client_auth(),
    };
    let conn = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut s = conn.connect(name, tcp).await.map_err(|e| e.to_string())?;
    s.write_all(b"GET /liveness HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    // With TLS 1.3 a refused client certificate shows up on the first read.
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {text:?}"))
}

#[tokio::test]
async fn tls_with_verified_client_certificates() {
    let pki = Pki::new("tls");
    pki.leaf("server", false);
    let good = pki.leaf("client", false);
    let rogue = pki.leaf("rogue", true);
    let files = TlsFiles {
        cert_file: pki.path("server.pem"),
        key_file: pki.path("server-key.pem"),
        ca_file: pki.path("ca.pem"),
        client_auth: ClientAuth::RequireAndVerifyClientCert,
        settings: Settings {
            cert_file: "CertFile",
            key_file: "KeyFile",
            ca_file: "CAFile",
        },
    };
    let (h, _) = router(Arc::new(AtomicBool::new(true)));
    let s = start(h, Some(Arc::new(files)), Limits::default()).await;

    assert_eq!(tls_get(s.addr, &pki, Some(good)).await, Ok(200));
    assert!(tls_get(s.addr, &pki, None).await.is_err(), "no client cert");
    assert!(
        tls_get(s.addr, &pki, Some(rogue)).await.is_err(),
        "a client cert the CA did not sign"
    );
    // Plain HTTP to the TLS port: no answer.
    assert!(!matches!(get(s.addr, "/liveness").await, Ok((200, _))));
    s.stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), s.task)
        .await
        .unwrap()
        .unwrap();
}
