//! The server: HTTP/1.1 on hyper, plain or TLS, one request per connection, every connection
//! bounded (head size, header count, one deadline for the whole exchange, a cap on how many
//! are served at once), and a graceful stop on a watch signal.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::tls::TlsSource;

/// The content type of the Prometheus text format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Bytes,
}

impl Response {
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: Bytes::from(body.into()),
        }
    }

    pub fn json(status: u16, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            content_type: "application/json",
            body: Bytes::from(body.into()),
        }
    }

    /// A Prometheus text exposition.
    pub fn metrics(text: String) -> Response {
        Response {
            status: 200,
            content_type: METRICS_CONTENT_TYPE,
            body: Bytes::from(text),
        }
    }

    /// Go's `http.NotFound`, which Calico's daemons answer for unknown paths.
    pub fn not_found() -> Response {
        Response::text(404, "404 page not found\n")
    }
}

/// Answers a request path (without its query). Handlers run on the async runtime and must
/// not block: they read state that other threads keep up to date.
pub type Handler = Arc<dyn Fn(&str) -> Response + Send + Sync>;

/// What one connection may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The request head (request line and headers) at most this many bytes; more is 431.
    pub max_header_bytes: usize,
    /// At most this many headers; more is 431.
    pub max_headers: usize,
    /// Reading the request, the TLS handshake, answering and writing the answer all within
    /// this; a slower peer is disconnected.
    pub request_timeout: Duration,
    /// Connections served at once; more wait in the kernel's listen queue.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // Probes and Prometheus send a few hundred bytes.
            max_header_bytes: 16 * 1024,
            max_headers: 64,
            request_timeout: Duration::from_secs(10),
            max_connections: 64,
        }
    }
}

/// hyper refuses (panics on) a read buffer smaller than this.
const MIN_BUF: usize = 8 * 1024;

/// Binds `host:port` as Go's `net.Listen` does: an empty host means every address (IPv6 and
/// IPv4 where the kernel allows, else IPv4); brackets around an IPv6 literal are accepted.
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

/// Serves `listener` until `stop` turns true (or its sender goes away): over TLS when `tls`
/// is given (its configuration is asked for on every connection, so rotated certificates are
/// used without a restart). On stop, no new connection is accepted and those in flight get
/// up to `limits.request_timeout` to finish.
pub async fn serve(
    listener: TcpListener,
    handler: Handler,
    tls: Option<Arc<dyn TlsSource>>,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut tasks = JoinSet::new();
    loop {
        while tasks.try_join_next().is_some() {}
        // A free slot first, so a flood of connections waits in the kernel's queue rather
        // than in tasks here.
        let permit = tokio::select! {
            () = stopped(&mut stop) => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            () = stopped(&mut stop) => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, usually: back off rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let handler = handler.clone();
        let tls = tls.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let Some(tls) = tls else {
                connection(stream, handler, limits).await;
                return;
            };
            let config = match tls.server_config() {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!("TLS configuration: {e}; closing the connection from {peer}");
                    return;
                }
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            match tokio::time::timeout(limits.request_timeout, acceptor.accept(stream)).await {
                Ok(Ok(s)) => connection(s, handler, limits).await,
                Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.request_timeout, drain)
        .await
        .is_err()
    {
        tasks.abort_all();
    }
}

/// Resolves once `stop` is true or its sender is gone.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// Serves one connection: one request, answered, then closed, all within the deadline.
async fn connection<S>(io: S, handler: Handler, limits: Limits)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let r = respond(&handler, &req);
        async move { Ok::<_, Infallible>(r) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        // One request per connection: probes and scrapes are seconds apart, and a
        // connection that cannot idle cannot hold a slot.
        .keep_alive(false)
        .timer(TokioTimer::new())
        .header_read_timeout(limits.request_timeout)
        .max_buf_size(limits.max_header_bytes.max(MIN_BUF))
        .max_header_size(limits.max_header_bytes)
        .max_headers(limits.max_headers);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    match tokio::time::timeout(limits.request_timeout, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!("HTTP connection ended: {e}"),
        Err(_) => tracing::debug!("HTTP connection took too long; closed"),
    }
}

/// GET and HEAD go to the handler (hyper leaves the body out for HEAD); anything else is 405.
fn respond(handler: &Handler, req: &Request<Incoming>) -> hyper::Response<Full<Bytes>> {
    let r = if req.method() == Method::GET || req.method() == Method::HEAD {
        handler(req.uri().path())
    } else {
        Response::text(405, "only GET and HEAD are supported\n")
    };
    let mut out = hyper::Response::new(Full::new(r.body));
    *out.status_mut() = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    // 204 carries no body, so no type either (as before, and as Go's health handlers).
    if r.status != 204
        && let Ok(v) = header::HeaderValue::from_str(r.content_type)
    {
        out.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    if r.status == 405 {
        out.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
    }
    out
}

/// Routes exact paths to handlers; anything else is 404 (Go's `http.NotFound`).
#[derive(Default, Clone)]
pub struct Router {
    routes: Vec<(String, Arc<dyn Fn() -> Response + Send + Sync>)>,
}

impl Router {
    pub fn new() -> Router {
        Router::default()
    }

    /// Answers `path` with `f()`.
    pub fn route(
        mut self,
        path: impl Into<String>,
        f: impl Fn() -> Response + Send + Sync + 'static,
    ) -> Router {
        self.routes.push((path.into(), Arc::new(f)));
        self
    }

    /// `/liveness` and `/readiness`, with the status and body `health` gives: Calico's
    /// health server (200 when good, 503 when not).
    pub fn health(self, health: Arc<dyn crate::Health>) -> Router {
        let h = health.clone();
        self.route("/liveness", move || {
            let (s, b) = h.liveness();
            Response::text(s, b)
        })
        .route("/readiness", move || {
            let (s, b) = health.readiness();
            Response::text(s, b)
        })
    }

    /// `/metrics` (and `/`, as Calico's metrics servers answer any path with the metrics)
    /// rendered from `metrics` at each request.
    pub fn metrics(self, metrics: Arc<dyn crate::Exposition>) -> Router {
        let m = metrics.clone();
        self.route("/metrics", move || Response::metrics(m.render()))
            .route("/", move || Response::metrics(metrics.render()))
    }

    pub fn into_handler(self) -> Handler {
        Arc::new(move |path: &str| {
            self.routes
                .iter()
                .find(|(p, _)| p == path)
                .map_or_else(Response::not_found, |(_, f)| f())
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn router_answers_exact_paths_and_404s_the_rest() {
        let h = Router::new()
            .route("/a", || Response::text(200, "a\n"))
            .into_handler();
        assert_eq!(h("/a").body, Bytes::from("a\n"));
        assert_eq!(h("/b"), Response::not_found());
        assert_eq!(h("/a/"), Response::not_found());
    }
}
