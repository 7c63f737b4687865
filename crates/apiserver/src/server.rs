//! The HTTP side: connections (TLS with ALPN h2/http1.1, or plain), authentication, routing
//! of `/api`, `/apis`, `/openapi`, `/version`, and the verbs on resources.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch as tokio_watch;

use crate::resources::ResourceDef;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{
    DeleteOpts, ListQuery, Obj, PatchType, RvMatch, Sub, WriteOpts, name_of, parse_rv,
};
use crate::table::{self, Shape};
use crate::watch::{self, Filter, WatchParams};
use crate::{Shared, discovery, util};

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Largest request body (the real server's default).
pub const MAX_BODY: usize = 3 * 1024 * 1024;
/// Most bytes of an oversized body read (and dropped) before answering 413.
const MAX_DRAIN: usize = 16 * 1024 * 1024;
/// Longest path + query accepted.
pub const MAX_URL: usize = 16 * 1024;
/// Most connections served at once.
const MAX_CONNECTIONS: usize = 1024;
/// How long a client that asks for `resourceVersion=N` beyond the current revision waits.
const TOO_LARGE_WAIT: Duration = Duration::from_secs(3);

fn full(b: impl Into<Bytes>) -> Body {
    UnsyncBoxBody::new(Full::new(b.into()))
}

fn json_bytes(code: StatusCode, body: Bytes, ct: &'static str) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    r
}

fn json_value(code: StatusCode, v: &Value) -> Response<Body> {
    json_bytes(
        code,
        Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
        "application/json",
    )
}

pub fn error_response(e: &ApiError) -> Response<Body> {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = json_value(code, &e.to_status());
    if let Some(s) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&s.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

// ---------------------------------------------------------------- connections

/// Serves connections from `listener` until `stop` turns true; then every connection this
/// loop started is dropped too.
pub async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: tokio_watch::Receiver<bool>,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut stop_rx = stop.clone();
    loop {
        tokio::select! {
            _ = stopped(&mut stop_rx) => break,
            r = listener.accept() => {
                let (sock, _) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    tracing::warn!("connection limit reached; dropping a connection");
                    continue;
                };
                let _ = sock.set_nodelay(true);
                let (shared, tls, mut stop) = (shared.clone(), tls.clone(), stop.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    tokio::select! {
                        _ = serve_conn(sock, shared, tls) => {}
                        _ = stopped(&mut stop) => {}
                    }
                });
            }
        }
    }
}

/// Resolves once `rx` holds `true` (or its sender is gone).
async fn stopped(rx: &mut tokio_watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

async fn serve_conn(
    sock: tokio::net::TcpStream,
    shared: Arc<Shared>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let svc = hyper::service::service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(handle(shared, req).await) }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .max_buf_size(MAX_URL * 4);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size((MAX_URL * 4) as u32)
        .max_concurrent_streams(250)
        .initial_stream_window_size(4 * 1024 * 1024)
        .initial_connection_window_size(8 * 1024 * 1024);
    match tls {
        Some(acceptor) => {
            let stream =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(sock)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                };
            if let Err(e) = builder.serve_connection(TokioIo::new(stream), svc).await {
                tracing::debug!(error = %e, "connection ended");
            }
        }
        None => {
            if let Err(e) = builder.serve_connection(TokioIo::new(sock), svc).await {
                tracing::debug!(error = %e, "connection ended");
            }
        }
    }
}

// ---------------------------------------------------------------- requests

struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: &str) -> Query {
        Query(
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (util::percent_decode(k, true), util::percent_decode(v, true))
                })
                .collect(),
        )
    }
    fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str())
    }
    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1" | "True"))
    }
    fn dry_run(&self) -> bool {
        self.0.iter().any(|(k, v)| k == "dryRun" && v == "All")
    }
}

fn header_str(req: &Request<Incoming>, h: header::HeaderName) -> &str {
    req.headers()
        .get(h)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The resource a request names.
#[derive(Debug, Default)]
struct Target {
    group: String,
    version: String,
    plural: String,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    watch_prefix: bool,
}

fn parse_target(group: &str, version: &str, rest: &[String]) -> Option<Target> {
    let mut t = Target {
        group: group.into(),
        version: version.into(),
        ..Default::default()
    };
    let mut rest = rest;
    if rest.first().map(String::as_str) == Some("watch") {
        t.watch_prefix = true;
        rest = &rest[1..];
    }
    let ns_path = rest.len() >= 3
        && rest[0] == "namespaces"
        && !(group.is_empty()
            && rest.len() == 3
            && matches!(rest[2].as_str(), "status" | "finalize"));
    if ns_path {
        t.ns = Some(rest[1].clone());
        t.plural = rest[2].clone();
        match &rest[3..] {
            [] => {}
            [name] => t.name = Some(name.clone()),
            [name, sub] => {
                t.name = Some(name.clone());
                t.sub = Some(sub.clone());
            }
            _ => return None,
        }
        return Some(t);
    }
    match rest {
        [plural] => t.plural = plural.clone(),
        [plural, name] => {
            t.plural = plural.clone();
            t.name = Some(name.clone());
        }
        [plural, name, sub] => {
            t.plural = plural.clone();
            t.name = Some(name.clone());
            t.sub = Some(sub.clone());
        }
        _ => return None,
    }
    Some(t)
}

fn not_found() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// One request, start to end. Never panics on input; every error is a Status.
pub async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let (method, uri) = (req.method().clone(), req.uri().clone());
    let r = match route(shared, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    };
    tracing::debug!(%method, %uri, status = r.status().as_u16(), "request");
    r
}

async fn route(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let pq_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if pq_len > MAX_URL {
        return Err(ApiError::new(
            414,
            "RequestURITooLong",
            "Request-URI Too Long",
        ));
    }
    if let Some(token) = &shared.token {
        let auth = header_str(&req, header::AUTHORIZATION);
        let ok = auth
            .strip_prefix("Bearer ")
            .is_some_and(|t| constant_time_eq(t.trim().as_bytes(), token.as_bytes()));
        if !ok {
            return Err(ApiError::unauthorized());
        }
    }
    let path = req.uri().path().to_string();
    let query = Query::parse(req.uri().query().unwrap_or(""));
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| util::percent_decode(s, false))
        .collect();
    let seg: Vec<&str> = segs.iter().map(String::as_str).collect();
    let accept = header_str(&req, header::ACCEPT).to_string();
    let get = req.method() == Method::GET;
    match seg.as_slice() {
        ["version"] if get => return Ok(json_value(StatusCode::OK, &version())),
        ["healthz" | "livez" | "readyz", ..] if get => {
            let mut r = Response::new(full("ok"));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            return Ok(r);
        }
        ["api"] if get => {
            if discovery::wants_aggregated(&accept) {
                let defs = shared.defs();
                return Ok(json_bytes(
                    StatusCode::OK,
                    to_bytes(&discovery::aggregated(&defs, true)),
                    discovery::AGGREGATED_CT,
                ));
            }
            return Ok(json_value(StatusCode::OK, &discovery::legacy_api()));
        }
        ["apis"] if get => {
            let defs = shared.defs();
            if discovery::wants_aggregated(&accept) {
                return Ok(json_bytes(
                    StatusCode::OK,
                    to_bytes(&discovery::aggregated(&defs, false)),
                    discovery::AGGREGATED_CT,
                ));
            }
            return Ok(json_value(StatusCode::OK, &discovery::legacy_apis(&defs)));
        }
        ["api", "v1"] if get => {
            return discovery::resource_list(&shared.defs(), "", "v1")
                .map(|v| json_value(StatusCode::OK, &v))
                .ok_or_else(not_found);
        }
        ["apis", g] if get => {
            return discovery::legacy_group(&shared.defs(), g)
                .map(|v| json_value(StatusCode::OK, &v))
                .ok_or_else(not_found);
        }
        ["apis", g, v] if get => {
            return discovery::resource_list(&shared.defs(), g, v)
                .map(|v| json_value(StatusCode::OK, &v))
                .ok_or_else(not_found);
        }
        ["openapi", "v3"] if get => {
            let (defs, hash) = shared.defs_and_gen();
            return Ok(json_value(
                StatusCode::OK,
                &discovery::openapi_index(&defs, hash),
            ));
        }
        ["openapi", "v3", "api", v] if get => {
            return discovery::openapi_doc(&shared.defs(), "", v)
                .map(|d| json_value(StatusCode::OK, &d))
                .ok_or_else(not_found);
        }
        ["openapi", "v3", "apis", g, v] if get => {
            return discovery::openapi_doc(&shared.defs(), g, v)
                .map(|d| json_value(StatusCode::OK, &d))
                .ok_or_else(not_found);
        }
        _ => {}
    }
    let target = match seg.as_slice() {
        ["api", "v1", ..] => parse_target("", "v1", &segs[2..]),
        ["apis", g, v, ..] => parse_target(g, v, &segs[3..]),
        _ => None,
    }
    .ok_or_else(not_found)?;
    resource_request(shared, req, target, query, accept).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn to_bytes(v: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(v).unwrap_or_default())
}

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.0",
        "gitCommit": "margay-apiserver",
        "gitTreeState": "clean",
        "buildDate": "2024-12-11T00:00:00Z",
        "goVersion": "go1.23.4",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// Reads a request body of at most [`MAX_BODY`] bytes. A larger one is read on and dropped
/// (up to [`MAX_DRAIN`] bytes, for at most 10 s) so the client sees the 413 rather than a reset.
async fn read_body(req: Request<Incoming>) -> Result<(Bytes, String), ApiError> {
    let ct = header_str(&req, header::CONTENT_TYPE).to_string();
    let mut body = req.into_body();
    let mut buf = bytes::BytesMut::new();
    let mut total = 0usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(f))) => f,
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(ApiError::bad_request(format!(
                    "unable to read the request body: {e}"
                )));
            }
            Err(_) if total > MAX_BODY => break,
            Err(_) => {
                return Err(ApiError::new(
                    408,
                    "Timeout",
                    "timed out reading the request body",
                ));
            }
        };
        if let Ok(data) = frame.into_data() {
            total += data.len();
            if total <= MAX_BODY {
                buf.extend_from_slice(&data);
            } else if total > MAX_DRAIN {
                break;
            }
        }
    }
    if total > MAX_BODY {
        return Err(ApiError::too_large(MAX_BODY));
    }
    Ok((buf.freeze(), ct))
}

/// Decodes a request body as JSON, or YAML when the Content-Type says so.
fn decode(body: &[u8], ct: &str) -> Result<Value, ApiError> {
    let base = ct.split(';').next().unwrap_or("").trim();
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    if base.contains("yaml") {
        if let Ok(v) = serde_json::from_slice::<Value>(body) {
            return Ok(v);
        }
        let text = std::str::from_utf8(body)
            .map_err(|_| ApiError::bad_request("the request body is not UTF-8"))?;
        return serde_norway::from_str::<Value>(text)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")));
    }
    if base.contains("protobuf") || base.contains("cbor") {
        return Err(ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml ({base} is not served)"
        )));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding the request body as JSON: {e}")))
}

fn list_query(q: &Query, def: &ResourceDef, ns: Option<&str>) -> Result<ListQuery, ApiError> {
    let label = LabelSelector::parse(q.get("labelSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.0))?;
    let field = FieldSelector::parse(q.get("fieldSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.0))?;
    field
        .check_supported(&|f| def.field_supported(f))
        .map_err(|e| ApiError::bad_request(e.0))?;
    let limit = match q.get("limit") {
        None | Some("") => None,
        Some(l) => Some(
            l.parse::<i64>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?
                .max(0) as usize,
        ),
    };
    let cont = q
        .get("continue")
        .filter(|c| !c.is_empty())
        .map(String::from);
    let rv = parse_rv(q.get("resourceVersion").unwrap_or(""))?;
    let rv = match q.get("resourceVersionMatch").unwrap_or("") {
        "" | "NotOlderThan" => RvMatch::Latest,
        "Exact" => match rv {
            Some(n) if n > 0 => RvMatch::Exact(n),
            _ => {
                return Err(ApiError::bad_request(
                    "resourceVersionMatch \"Exact\" requires a resourceVersion other than \"\" and \"0\"",
                ));
            }
        },
        other => {
            return Err(ApiError::bad_request(format!(
                "resourceVersionMatch: Unsupported value: \"{other}\""
            )));
        }
    };
    if cont.is_some()
        && q.get("resourceVersion")
            .is_some_and(|r| !r.is_empty() && r != "0")
    {
        return Err(ApiError::bad_request(
            "specifying resource version is not allowed when using continue",
        ));
    }
    Ok(ListQuery {
        ns: ns.map(String::from),
        label,
        field,
        limit,
        cont,
        rv,
    })
}

/// Waits (bounded) until the store reaches revision `want`; 504 otherwise, as the real server.
async fn wait_for_rv(shared: &Shared, want: u64) -> Result<(), ApiError> {
    let mut rx = shared.rv_tx.subscribe();
    let ok = tokio::time::timeout(TOO_LARGE_WAIT, rx.wait_for(|rv| *rv >= want)).await;
    match ok {
        Ok(Ok(_)) => Ok(()),
        _ => {
            let cur = *shared.rv_tx.borrow();
            let mut e = ApiError::new(
                504,
                "Timeout",
                format!("Too large resource version: {want}, current: {cur}"),
            );
            e.details = Some(
                json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
            );
            Err(e)
        }
    }
}

fn verb_of(method: &Method, t: &Target, watch: bool) -> Result<&'static str, ApiError> {
    Ok(match (method.as_str(), t.name.is_some()) {
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("GET", true) if watch => "watch",
        ("GET", true) => "get",
        ("POST", false) => "create",
        ("PUT", true) => "update",
        ("PATCH", true) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource".to_string(),
            ));
        }
    })
}

async fn resource_request(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    t: Target,
    q: Query,
    accept: String,
) -> Result<Response<Body>, ApiError> {
    let (def, key) = {
        let st = shared.lock();
        let c = st.lookup(&t.group, &t.version, &t.plural)?;
        (c.def.clone(), c.def.key())
    };
    // Scope: a namespaced path for a cluster-scoped resource (and vice versa for names) is 404.
    if t.ns.is_some() && !def.namespaced {
        return Err(not_found());
    }
    if def.namespaced && t.name.is_some() && t.ns.is_none() {
        return Err(not_found());
    }
    let sub = match t.sub.as_deref() {
        None => Sub::Main,
        Some("status") if def.status => Sub::Status,
        // Namespace finalization: accepted as a status-like write of spec.finalizers.
        Some("finalize") if def.builtin && def.kind == "Namespace" => Sub::Main,
        Some(_) => return Err(not_found()),
    };
    let watch = t.watch_prefix || q.flag("watch");
    let verb = verb_of(req.method(), &t, watch)?;
    if sub == Sub::Status && !matches!(verb, "get" | "update" | "patch") {
        return Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    shared.count_request(verb, &def.group, &def.plural);
    let ns = if def.namespaced {
        t.ns.clone().unwrap_or_default()
    } else {
        String::new()
    };
    let name = t.name.clone().unwrap_or_default();
    if let Some(e) = shared.take_fault(
        verb,
        &def.group,
        &def.plural,
        t.ns.as_deref(),
        t.name.as_deref(),
    ) {
        if verb == "watch" && e.code == 410 {
            return Ok(stream_response(futures_util::stream::iter([Ok(
                hyper::body::Frame::data(watch::error_event(&e.to_status())),
            )])));
        }
        return Err(e);
    }
    let api_version = def.api_version(&t.version);
    let shape = Shape::from_accept(&accept, q.get("includeObject").unwrap_or(""));
    let wopts = WriteOpts {
        dry_run: q.dry_run(),
        keep_status: false,
        version: t.version.clone(),
    };
    match verb {
        "get" => {
            let o = shared.lock().get(&key, &ns, &name)?;
            Ok(object_response(
                StatusCode::OK,
                &def,
                &o,
                &api_version,
                shape,
            ))
        }
        "list" => {
            let lq = list_query(&q, &def, t.ns.as_deref())?;
            if let (RvMatch::Latest, Some(n)) =
                (lq.rv, parse_rv(q.get("resourceVersion").unwrap_or(""))?)
                && lq.cont.is_none()
            {
                wait_for_rv(&shared, n).await?;
            }
            let res = shared.lock().list(&key, &lq)?;
            Ok(list_response(&def, &api_version, res, shape))
        }
        "watch" => {
            let mut lq = list_query(&q, &def, t.ns.as_deref())?;
            if let Some(n) = &t.name {
                lq.field.terms.push(crate::selector::FieldTerm {
                    field: "metadata.name".into(),
                    equal: true,
                    value: n.clone(),
                });
            }
            let from = parse_rv(q.get("resourceVersion").unwrap_or(""))?;
            let initial_events = q.flag("sendInitialEvents");
            if let Some(n) = from
                && let Err(e) = wait_for_rv(&shared, n).await
            {
                return Ok(stream_response(futures_util::stream::iter([Ok(
                    hyper::body::Frame::data(watch::error_event(&e.to_status())),
                )])));
            }
            let filter = Filter {
                ns: lq.ns.clone().filter(|n| !n.is_empty()),
                label: lq.label,
                field: lq.field,
            };
            let start = shared
                .lock()
                .watch_start(&key, from, initial_events, &|k, o| filter.matches_key(k, o));
            let start = match start {
                Ok(s) => s,
                // The real server answers an expired revision with 200 and one ERROR event.
                Err(e) => {
                    return Ok(stream_response(futures_util::stream::iter([Ok(
                        hyper::body::Frame::data(watch::error_event(&e.to_status())),
                    )])));
                }
            };
            let timeout = match q.get("timeoutSeconds").and_then(|s| s.parse::<u64>().ok()) {
                Some(s) if s > 0 => Duration::from_secs(s.min(24 * 3600)),
                // Like the real server's --min-request-timeout (1800 s), randomised up to 2x.
                _ => Duration::from_secs(1800 + u64::from(util::random_bytes::<2>()[0]) * 7),
            };
            let params = WatchParams {
                def: start.def,
                api_version,
                filter,
                shape,
                bookmarks: q.flag("allowWatchBookmarks"),
                initial: start.initial,
                initial_end: initial_events,
                next_rv: start.next_rv,
                deadline: tokio::time::Instant::now() + timeout,
                bookmark_interval: shared.bookmark_interval,
            };
            Ok(stream_response(watch::stream(shared.clone(), params)))
        }
        "create" => {
            let (body, ct) = read_body(req).await?;
            let obj = decode(&body, &ct)?;
            let o = shared.write(|st| st.create(&key, &ns, obj, &wopts))?;
            Ok(object_response(
                StatusCode::CREATED,
                &def,
                &o,
                &api_version,
                Shape::Object,
            ))
        }
        "update" => {
            let (body, ct) = read_body(req).await?;
            let obj = decode(&body, &ct)?;
            let o = shared.write(|st| st.update(&key, &ns, &name, obj, sub, &wopts, false))?;
            Ok(object_response(
                StatusCode::OK,
                &def,
                &o,
                &api_version,
                Shape::Object,
            ))
        }
        "patch" => {
            let (body, ct) = read_body(req).await?;
            let ptype = PatchType::from_content_type(&ct).ok_or_else(|| {
                ApiError::unsupported_media_type(if def.builtin {
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
                } else {
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
                })
            })?;
            let patch = if ptype == PatchType::Apply {
                decode(&body, "application/yaml")?
            } else {
                decode(&body, "application/json")?
            };
            if ptype == PatchType::Apply && q.get("fieldManager").unwrap_or("").is_empty() {
                return Err(ApiError::bad_request(
                    "PATCH requests with apply content type must have a fieldManager query parameter",
                ));
            }
            let (o, created) =
                shared.write(|st| st.patch(&key, &ns, &name, ptype, &patch, sub, &wopts))?;
            Ok(object_response(
                if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                &def,
                &o,
                &api_version,
                Shape::Object,
            ))
        }
        "delete" => {
            let (body, _) = read_body(req).await?;
            let dopts = delete_opts(&body, &q)?;
            let o = shared.write(|st| st.delete(&key, &ns, &name, &dopts))?;
            Ok(object_response(
                StatusCode::OK,
                &def,
                &o,
                &api_version,
                Shape::Object,
            ))
        }
        "deletecollection" => {
            let (body, _) = read_body(req).await?;
            let dopts = delete_opts(&body, &q)?;
            let mut lq = list_query(&q, &def, t.ns.as_deref())?;
            lq.limit = None;
            lq.cont = None;
            let res = shared.write(|st| -> Result<_, ApiError> {
                let listed = st.list(&key, &lq)?;
                let mut out = Vec::new();
                for o in listed.items {
                    let ons = o
                        .value
                        .pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    match st.delete(&key, &ons, name_of(&o.value), &dopts) {
                        Ok(d) => out.push(d),
                        Err(e) if e.code == 404 => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(crate::store::ListResult {
                    items: out,
                    rv: st.rv,
                    cont: None,
                    remaining: None,
                })
            })?;
            Ok(list_response(&def, &api_version, res, Shape::Object))
        }
        _ => Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )),
    }
}

fn delete_opts(body: &[u8], q: &Query) -> Result<DeleteOpts, ApiError> {
    let mut d = DeleteOpts {
        dry_run: q.dry_run(),
        ..Default::default()
    };
    if let Some(g) = q.get("gracePeriodSeconds") {
        d.grace_seconds = Some(
            g.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds: {g}")))?,
        );
    }
    if body.iter().any(|b| !b.is_ascii_whitespace()) {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
        if let Some(u) = v.pointer("/preconditions/uid").and_then(Value::as_str) {
            d.uid = Some(u.into());
        }
        if let Some(r) = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
        {
            d.rv = Some(r.into());
        }
        if let Some(g) = v.get("gracePeriodSeconds").and_then(Value::as_i64) {
            d.grace_seconds = Some(g);
        }
        if v.get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x == "All"))
        {
            d.dry_run = true;
        }
    }
    Ok(d)
}

fn stream_response<S>(s: S) -> Response<Body>
where
    S: futures_util::Stream<Item = Result<hyper::body::Frame<Bytes>, Infallible>> + Send + 'static,
{
    let mut r = Response::new(UnsyncBoxBody::new(StreamBody::new(s)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    r
}

fn object_response(
    code: StatusCode,
    def: &ResourceDef,
    o: &Obj,
    api_version: &str,
    shape: Shape,
) -> Response<Body> {
    match shape {
        Shape::Meta => json_value(code, &table::partial(&o.value)),
        Shape::Table(inc) => {
            let row = table::row(def, &o.value, inc, util::now_secs());
            let t = table::table(def, vec![row], json!({"resourceVersion": o.rv.to_string()}));
            json_value(code, &t)
        }
        Shape::Object => json_bytes(code, watch::render(o, api_version), "application/json"),
    }
}

fn list_response(
    def: &ResourceDef,
    api_version: &str,
    res: crate::store::ListResult,
    shape: Shape,
) -> Response<Body> {
    let mut meta = json!({"resourceVersion": res.rv.to_string()});
    if let Some(c) = &res.cont {
        meta["continue"] = json!(c);
    }
    if let Some(r) = res.remaining {
        meta["remainingItemCount"] = json!(r);
    }
    if shape == Shape::Meta {
        let items: Vec<Value> = res.items.iter().map(|o| table::partial(&o.value)).collect();
        let l = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items});
        return json_value(StatusCode::OK, &l);
    }
    if let Shape::Table(inc) = shape {
        let now = util::now_secs();
        let rows = res
            .items
            .iter()
            .map(|o| table::row(def, &o.value, inc, now))
            .collect();
        return json_value(StatusCode::OK, &table::table(def, rows, meta));
    }
    // Items are the stored bytes, concatenated: no re-serialization per list.
    let head =
        json!({"kind": def.list_kind, "apiVersion": api_version, "metadata": meta}).to_string();
    let mut out = Vec::with_capacity(
        head.len() + res.items.iter().map(|o| o.json.len() + 1).sum::<usize>() + 16,
    );
    out.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    out.extend_from_slice(b",\"items\":[");
    for (i, o) in res.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&watch::render(o, api_version));
    }
    out.extend_from_slice(b"]}");
    json_bytes(StatusCode::OK, Bytes::from(out), "application/json")
}

/// Binds the listener for `addr` (a std listener, so the port is known before the runtime
/// serves it).
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    Ok(l)
}
