//! margay's daemon HTTP surface, shared by Felix, Typha and kube-controllers (and whatever
//! serves HTTP next): health endpoints with Calico's `/liveness` and `/readiness` semantics,
//! Prometheus `/metrics` from a [`metrics::Registry`] (prometheus-client, Calico's names
//! kept), optional TLS with optional client-certificate auth, bounded requests and a
//! graceful stop. See DESIGN.md.
#![forbid(unsafe_code)]

pub mod metrics;
pub mod server;
pub mod tls;

pub use server::{Handler, Limits, METRICS_CONTENT_TYPE, Response, Router, bind, serve};
pub use tls::{ClientAuth, TlsError, TlsFiles, TlsSource};

use std::time::Duration;

/// A daemon's health, as its health server reports it: (HTTP status, body) for each probe.
/// Calico's convention: 200 when good, 503 when not, a body saying why.
pub trait Health: Send + Sync {
    fn liveness(&self) -> (u16, String);
    fn readiness(&self) -> (u16, String);
}

/// Something that renders a Prometheus text exposition at each scrape.
pub trait Exposition: Send + Sync {
    fn render(&self) -> String;
}

/// A one-shot `GET http://addr/path` (tests, probes, `check-status`): status and body, with
/// a 5 s connect and 10 s read deadline and at most 16 MiB read.
pub async fn get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let timed_out =
        |what: &str| std::io::Error::new(std::io::ErrorKind::TimedOut, what.to_string());
    let mut s = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| timed_out("connect timed out"))??;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        (&mut s).take(16 * 1024 * 1024).read_to_end(&mut out),
    )
    .await
    .map_err(|_| timed_out("read timed out"))??;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}
