//! A minimal HTTP/1.x server for the health and metrics endpoints (GET only, one response
//! per connection).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// A response: status, content type, body.
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
}

pub type Handler = Arc<dyn Fn(&str) -> Response + Send + Sync>;

/// Binds `host:port` (an empty host means every address).
pub async fn bind(host: &str, port: u16) -> std::io::Result<TcpListener> {
    let host = if host.is_empty() { "0.0.0.0" } else { host };
    TcpListener::bind((host, port)).await
}

/// Serves until `stop` turns true.
pub async fn serve(listener: TcpListener, handler: Handler, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            r = listener.accept() => {
                let Ok((mut s, _)) = r else { continue };
                let handler = handler.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut n = 0;
                    let read = tokio::time::timeout(Duration::from_secs(5), async {
                        while n < buf.len() {
                            match s.read(&mut buf[n..]).await {
                                Ok(0) | Err(_) => break,
                                Ok(k) => {
                                    n += k;
                                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                                        break;
                                    }
                                }
                            }
                        }
                    })
                    .await;
                    if read.is_err() {
                        return;
                    }
                    let req = String::from_utf8_lossy(&buf[..n]);
                    let path = req
                        .lines()
                        .next()
                        .and_then(|l| l.split_whitespace().nth(1))
                        .unwrap_or("/")
                        .to_string();
                    let r = handler(&path);
                    let reason = match r.status {
                        200 => "OK",
                        204 => "No Content",
                        404 => "Not Found",
                        _ => "Service Unavailable",
                    };
                    let head = format!(
                        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        r.status,
                        r.content_type,
                        r.body.len()
                    );
                    let _ = s.write_all(head.as_bytes()).await;
                    let _ = s.write_all(&r.body).await;
                    let _ = s.shutdown().await;
                });
            }
            _ = stop.changed() => return,
        }
    }
}
