//! A minimal HTTP/1.x server for the health and metrics endpoints: GET only, one response
//! per connection, bounded reads. (Each daemon has one of these until they share a server.)

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

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

    pub fn json(status: u16, body: Vec<u8>) -> Response {
        Response {
            status,
            content_type: "application/json",
            body,
        }
    }
}

pub type Handler = Arc<dyn Fn(&str) -> Response + Send + Sync>;

/// The request path (without the query) of a request's head.
fn path_of(head: &str) -> String {
    let target = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("/");
    target.split('?').next().unwrap_or("/").to_string()
}

/// Serves until `stop` changes (or its sender is dropped).
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
                    let r = handler(&path_of(&String::from_utf8_lossy(&buf[..n])));
                    let reason = match r.status {
                        200 => "OK",
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

/// A blocking GET of `http://addr/path` (tests, `check-status`): status and body.
pub async fn get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "read timed out"))??;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(path_of("GET /readiness?x=1 HTTP/1.1\r\n"), "/readiness");
        assert_eq!(path_of(""), "/");
    }

    #[tokio::test]
    async fn serves_and_stops() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = watch::channel(false);
        let h: Handler = Arc::new(|p: &str| match p {
            "/liveness" => Response::text(200, "live\n"),
            _ => Response::text(404, "404 page not found\n"),
        });
        let task = tokio::spawn(serve(l, h, rx));
        assert_eq!(
            get(addr, "/liveness").await.unwrap(),
            (200, "live\n".into())
        );
        assert_eq!(get(addr, "/x").await.unwrap().0, 404);
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }
}
