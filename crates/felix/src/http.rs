//! A minimal HTTP/1.1 server for GET requests (health and metrics endpoints): one request per
//! connection, answered and closed. Enough for Kubernetes probes, Prometheus and curl.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// Longest request head accepted.
const MAX_HEAD: usize = 16 * 1024;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// An answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into().into_bytes(),
        }
    }

    pub fn json(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "application/json",
            body: body.into().into_bytes(),
        }
    }
}

pub type Handler = Arc<dyn Fn(&str) -> Response + Send + Sync>;

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// A parsed request line.
#[derive(Debug, PartialEq, Eq)]
pub struct RequestLine<'a> {
    pub method: &'a str,
    /// The path without its query string.
    pub path: &'a str,
}

/// Parses `GET /path?query HTTP/1.1`.
pub fn parse_request_line(line: &str) -> Option<RequestLine<'_>> {
    let mut parts = line.split_ascii_whitespace();
    let method = parts.next()?;
    let target = parts.next()?;
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return None;
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    Some(RequestLine { method, path })
}

/// Reads a request head (up to the blank line).
pub async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> Result<String, u16> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let read = async {
        loop {
            if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
                return Ok(());
            }
            if buf.len() > MAX_HEAD {
                return Err(431);
            }
            match s.read(&mut chunk).await {
                Ok(0) => {
                    return if buf.is_empty() { Err(400) } else { Ok(()) };
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(_) => return Err(400),
            }
        }
    };
    match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(Ok(())) => Ok(String::from_utf8_lossy(&buf).into_owned()),
        Ok(Err(code)) => Err(code),
        Err(_) => Err(408),
    }
}

/// Writes a complete response (with `Connection: close`); HEAD requests get no body.
pub async fn write_response<S: AsyncWrite + Unpin>(
    s: &mut S,
    r: &Response,
    head_only: bool,
) -> std::io::Result<()> {
    let mut out = format!("HTTP/1.1 {} {}\r\n", r.status, reason(r.status));
    if r.status != 204 {
        out.push_str(&format!(
            "Content-Type: {}\r\nContent-Length: {}\r\n",
            r.content_type,
            r.body.len()
        ));
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut bytes = out.into_bytes();
    if !head_only && r.status != 204 {
        bytes.extend_from_slice(&r.body);
    }
    s.write_all(&bytes).await?;
    s.flush().await?;
    s.shutdown().await
}

/// Answers one connection with `handler(path)`.
pub async fn handle<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, handler: &Handler) {
    let resp;
    let mut head_only = false;
    match read_head(&mut s).await {
        Err(code) => resp = Response::text(code, "bad request\n"),
        Ok(head) => {
            let first = head.lines().next().unwrap_or_default();
            match parse_request_line(first) {
                None => resp = Response::text(400, "bad request\n"),
                Some(req) if req.method == "GET" || req.method == "HEAD" => {
                    head_only = req.method == "HEAD";
                    resp = handler(req.path);
                }
                Some(_) => resp = Response::text(405, "only GET is supported\n"),
            }
        }
    }
    let _ = write_response(&mut s, &resp, head_only).await;
}

/// Serves `listener` until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    handler: Handler,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => {
                if *stop.borrow() {
                    return;
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let h = handler.clone();
                    tokio::spawn(async move { handle(stream, &h).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Serves `listener` over TLS until `stop` turns true. The TLS settings are read again for
/// every connection (rotated certificates are picked up); a connection whose handshake fails
/// or takes longer than the read timeout is closed.
pub async fn serve_tls(
    listener: TcpListener,
    handler: Handler,
    tls: crate::metrics_tls::MetricsTls,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => {
                if *stop.borrow() {
                    return;
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let config = match tls.server_config() {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::error!("metrics TLS configuration: {e}; closing the connection from {peer}");
                            continue;
                        }
                    };
                    let h = handler.clone();
                    tokio::spawn(async move {
                        let acceptor = tokio_rustls::TlsAcceptor::from(config);
                        match tokio::time::timeout(READ_TIMEOUT, acceptor.accept(stream)).await {
                            Ok(Ok(s)) => handle(s, &h).await,
                            Ok(Err(e)) => tracing::debug!(%peer, "metrics TLS handshake failed: {e}"),
                            Err(_) => tracing::debug!(%peer, "metrics TLS handshake timed out"),
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Binds `host:port` the way Go's net.Listen does: an empty host means every address.
pub async fn bind(host: &str, port: u16) -> std::io::Result<TcpListener> {
    if host.is_empty() {
        match TcpListener::bind(("::", port)).await {
            Ok(l) => Ok(l),
            Err(_) => TcpListener::bind(("0.0.0.0", port)).await,
        }
    } else {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        TcpListener::bind((host, port)).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn request_lines() {
        assert_eq!(
            parse_request_line("GET /readiness?x=1 HTTP/1.1"),
            Some(RequestLine {
                method: "GET",
                path: "/readiness"
            })
        );
        assert!(parse_request_line("GET /x").is_none());
        assert!(parse_request_line("GET /x SPDY/3").is_none());
    }

    #[tokio::test]
    async fn answers_get_and_refuses_other_methods() {
        let handler: Handler = Arc::new(|p: &str| match p {
            "/ok" => Response::text(200, "fine\n"),
            _ => Response::text(404, "no\n"),
        });
        let (mut client, server) = tokio::io::duplex(4096);
        let h = handler.clone();
        let task = tokio::spawn(async move { handle(server, &h).await });
        client
            .write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        client.read_to_string(&mut out).await.unwrap();
        task.await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains("Content-Length: 5\r\n"));
        assert!(out.ends_with("\r\n\r\nfine\n"));

        let (mut client, server) = tokio::io::duplex(4096);
        let task = tokio::spawn(async move { handle(server, &handler).await });
        client
            .write_all(b"POST /ok HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        client.read_to_string(&mut out).await.unwrap();
        task.await.unwrap();
        assert!(out.starts_with("HTTP/1.1 405 "), "{out}");
    }
}
