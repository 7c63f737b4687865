//! An in-process Kubernetes API server double for margay's tests and lab.
//!
//! [`ApiServer::start`] serves the Kubernetes REST API (core v1 namespaces, pods, nodes,
//! serviceaccounts, services, endpoints, configmaps, secrets; networking.k8s.io/v1
//! networkpolicies; discovery.k8s.io/v1 endpointslices; CRDs and the custom resources they
//! define, Calico's pre-installed on request) over HTTPS with a bearer token, on its own thread
//! and tokio runtime. It is faithful enough for the real `kubectl` and kube-rs to work against
//! it unchanged: one global resourceVersion, watches from a revision with 410 on expiry,
//! bookmarks, paging, selectors, the four patch types, finalizers, discovery and OpenAPI.
//! [`StoreHandle`] reads and writes the same store without HTTP; faults, compaction, watch
//! closure and restarts are injected through [`ApiServer`]. See `DESIGN.md`.
#![forbid(unsafe_code)]

mod discovery;
mod patch;
mod resources;
mod selector;
mod server;
mod services;
mod status;
mod store;
mod table;
mod tls;
mod util;
mod watch;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;

pub use resources::{CALICO_GROUP, CALICO_KINDS};
pub use status::ApiError;
pub use store::PatchType;

use resources::gr_key;
use store::{DeleteOpts, ListQuery, State, Sub, WriteOpts};

/// Errors starting or running the server (request errors are [`ApiError`]s).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS set-up: {0}")]
    Tls(String),
    #[error("starting the server runtime: {0}")]
    Runtime(std::io::Error),
    #[error("the server thread is gone")]
    Gone,
    #[error("loading objects: {0}")]
    Load(String),
    /// A server option that cannot be used (names the option).
    #[error("server options: {0}")]
    Config(String),
    #[error(transparent)]
    Api(#[from] ApiError),
}

/// How to run the server.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// HTTPS with a bearer token (default). `false`: plain HTTP, no authentication.
    pub tls: bool,
    /// The bearer token; generated when `None`.
    pub token: Option<String>,
    /// Where to listen (default `127.0.0.1:0`: any free port).
    pub bind: SocketAddr,
    /// How often watches that allow bookmarks get one (real servers: about 60 s).
    pub bookmark_interval: Duration,
    /// Events kept for watches and lists from older revisions; older → 410 Gone.
    pub event_history: usize,
    /// Pre-install Calico's `crd.projectcalico.org/v1` CRDs.
    pub calico_crds: bool,
    /// Pods deleted with a grace period keep existing with a `deletionTimestamp` until deleted
    /// again with `gracePeriodSeconds=0` (as with a kubelet). Default: deleted at once.
    pub graceful_pod_deletion: bool,
    /// Worker threads of the server's runtime.
    pub worker_threads: usize,
    /// Where ClusterIPs come from (kube-apiserver's `--service-cluster-ip-range`; IPv4).
    pub service_cidr: String,
    /// NodePorts (`--service-node-port-range`).
    pub node_port_range: (u16, u16),
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            tls: true,
            token: None,
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            bookmark_interval: Duration::from_secs(1),
            event_history: 10_000,
            calico_crds: false,
            graceful_pod_deletion: false,
            worker_threads: 2,
            service_cidr: services::DEFAULT_SERVICE_CIDR.to_string(),
            node_port_range: services::DEFAULT_NODE_PORTS,
        }
    }
}

/// Which requests a fault applies to (`None` = any).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultMatcher {
    /// Kubernetes verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: Option<String>,
    pub group: Option<String>,
    /// The plural (`pods`, `ippools`).
    pub resource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl FaultMatcher {
    pub fn any() -> FaultMatcher {
        FaultMatcher::default()
    }
    pub fn verb(mut self, v: &str) -> Self {
        self.verb = Some(v.into());
        self
    }
    pub fn group(mut self, g: &str) -> Self {
        self.group = Some(g.into());
        self
    }
    pub fn resource(mut self, r: &str) -> Self {
        self.resource = Some(r.into());
        self
    }
    pub fn namespace(mut self, n: &str) -> Self {
        self.namespace = Some(n.into());
        self
    }
    pub fn name(mut self, n: &str) -> Self {
        self.name = Some(n.into());
        self
    }
    fn matches(
        &self,
        verb: &str,
        group: &str,
        resource: &str,
        ns: Option<&str>,
        name: Option<&str>,
    ) -> bool {
        self.verb.as_deref().is_none_or(|v| v == verb)
            && self.group.as_deref().is_none_or(|g| g == group)
            && self.resource.as_deref().is_none_or(|r| r == resource)
            && self.namespace.as_deref().is_none_or(|n| Some(n) == ns)
            && self.name.as_deref().is_none_or(|n| Some(n) == name)
    }
}

#[derive(Debug)]
struct Fault {
    matcher: FaultMatcher,
    code: u16,
    remaining: u32,
}

/// Counters for assertions (`(group, resource)` keys; core group is "").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Watches open right now.
    pub open_watches: BTreeMap<(String, String), usize>,
    /// Requests served per `(verb, group, resource)` since start.
    pub requests: BTreeMap<(String, String, String), u64>,
    /// The store's current resourceVersion.
    pub resource_version: u64,
    /// Objects stored, all resources together.
    pub objects: usize,
}

impl Stats {
    pub fn watches(&self, group: &str, resource: &str) -> usize {
        self.open_watches
            .get(&(group.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    }
    pub fn request_count(&self, verb: &str, group: &str, resource: &str) -> u64 {
        self.requests
            .get(&(verb.to_string(), group.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    }
}

/// State shared by the HTTP side, watches and the [`StoreHandle`].
pub(crate) struct Shared {
    state: Mutex<State>,
    rv_tx: tokio::sync::watch::Sender<u64>,
    close_tx: tokio::sync::watch::Sender<u64>,
    stats: Mutex<Stats>,
    faults: Mutex<Vec<Fault>>,
    token: Option<String>,
    bookmark_interval: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the store half-written in a way later
    // requests care about more than about availability; keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
    fn stats(&self) -> MutexGuard<'_, Stats> {
        lock(&self.stats)
    }
    /// Runs a write and wakes the watches if the revision moved.
    fn write<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let (r, rv) = {
            let mut st = self.lock();
            let before = st.rv;
            let r = f(&mut st);
            (r, (st.rv != before).then_some(st.rv))
        };
        if let Some(rv) = rv {
            self.rv_tx.send_replace(rv);
        }
        r
    }
    fn defs(&self) -> Vec<Arc<resources::ResourceDef>> {
        self.defs_and_gen().0
    }
    fn defs_and_gen(&self) -> (Vec<Arc<resources::ResourceDef>>, u64) {
        let st = self.lock();
        (
            st.order
                .iter()
                .filter_map(|k| st.resources.get(k))
                .map(|c| c.def.clone())
                .collect(),
            st.registry_gen,
        )
    }
    fn count_request(&self, verb: &str, group: &str, resource: &str) {
        *self
            .stats()
            .requests
            .entry((verb.to_string(), group.to_string(), resource.to_string()))
            .or_insert(0) += 1;
    }
    fn take_fault(
        &self,
        verb: &str,
        group: &str,
        resource: &str,
        ns: Option<&str>,
        name: Option<&str>,
    ) -> Option<ApiError> {
        let mut faults = lock(&self.faults);
        let i = faults
            .iter()
            .position(|f| f.remaining > 0 && f.matcher.matches(verb, group, resource, ns, name))?;
        let f = &mut faults[i];
        f.remaining -= 1;
        let code = f.code;
        if f.remaining == 0 {
            faults.remove(i);
        }
        Some(ApiError::for_code(code, None))
    }
}

/// A group/version/resource as the store API takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gvr<'a> {
    pub group: &'a str,
    pub version: &'a str,
    pub plural: &'a str,
}

impl<'a> Gvr<'a> {
    pub const fn new(group: &'a str, version: &'a str, plural: &'a str) -> Self {
        Gvr {
            group,
            version,
            plural,
        }
    }
    /// A core v1 resource (`pods`, `nodes`, …).
    pub const fn core(plural: &'a str) -> Self {
        Gvr {
            group: "",
            version: "v1",
            plural,
        }
    }
    /// A Calico `crd.projectcalico.org/v1` resource.
    pub const fn calico(plural: &'a str) -> Self {
        Gvr {
            group: CALICO_GROUP,
            version: "v1",
            plural,
        }
    }
}

/// Direct, HTTP-free access to the server's store, with the same semantics as the API
/// (revision bumps, watch events, preconditions). Objects are `serde_json::Value`s; `ns` is
/// ignored for cluster-scoped resources. Writes here keep a `status` given on create (over
/// HTTP it is reset where the real server resets it), so tests can seed pods with IPs.
#[derive(Clone)]
pub struct StoreHandle {
    shared: Arc<Shared>,
}

impl StoreHandle {
    fn key(&self, r: &Gvr) -> Result<String, ApiError> {
        let st = self.shared.lock();
        st.lookup(r.group, r.version, r.plural).map(|c| c.def.key())
    }
    fn wopts(r: &Gvr) -> WriteOpts {
        WriteOpts {
            dry_run: false,
            keep_status: true,
            version: r.version.to_string(),
        }
    }

    pub fn create(&self, r: Gvr, ns: &str, obj: Value) -> Result<Value, ApiError> {
        let key = self.key(&r)?;
        self.shared
            .write(|st| st.create(&key, ns, obj, &Self::wopts(&r)))
            .map(|o| o.value.clone())
    }

    /// Creates many objects under one lock (benchmarks, large fixtures). Stops at the first error.
    pub fn create_many(
        &self,
        r: Gvr,
        ns: &str,
        objs: impl IntoIterator<Item = Value>,
    ) -> Result<usize, ApiError> {
        let key = self.key(&r)?;
        let opts = Self::wopts(&r);
        self.shared.write(|st| {
            let mut n = 0;
            for o in objs {
                st.create(&key, ns, o, &opts)?;
                n += 1;
            }
            Ok(n)
        })
    }

    pub fn get(&self, r: Gvr, ns: &str, name: &str) -> Result<Value, ApiError> {
        let key = self.key(&r)?;
        let ns = self.scope_ns(&r, ns);
        self.shared
            .lock()
            .get(&key, &ns, name)
            .map(|o| o.value.clone())
    }

    /// Every object of the resource (in `ns`, or all namespaces when `None`) matching the
    /// label selector (`""` for all).
    pub fn list(
        &self,
        r: Gvr,
        ns: Option<&str>,
        label_selector: &str,
    ) -> Result<Vec<Value>, ApiError> {
        let key = self.key(&r)?;
        let label = selector::LabelSelector::parse(label_selector)
            .map_err(|e| ApiError::bad_request(e.0))?;
        let q = ListQuery {
            ns: ns.map(String::from),
            label,
            ..Default::default()
        };
        self.shared
            .lock()
            .list(&key, &q)
            .map(|l| l.items.iter().map(|o| o.value.clone()).collect())
    }

    /// PUT semantics: a non-empty `metadata.resourceVersion` is a precondition.
    pub fn update(&self, r: Gvr, ns: &str, obj: Value) -> Result<Value, ApiError> {
        self.update_sub(r, ns, obj, Sub::Main)
    }

    /// PUT on `/status`.
    pub fn update_status(&self, r: Gvr, ns: &str, obj: Value) -> Result<Value, ApiError> {
        self.update_sub(r, ns, obj, Sub::Status)
    }

    fn update_sub(&self, r: Gvr, ns: &str, obj: Value, sub: Sub) -> Result<Value, ApiError> {
        let key = self.key(&r)?;
        let ns = self.scope_ns(&r, ns);
        let name = store::name_of(&obj).to_string();
        self.shared
            .write(|st| st.update(&key, &ns, &name, obj, sub, &Self::wopts(&r), false))
            .map(|o| o.value.clone())
    }

    pub fn patch(
        &self,
        r: Gvr,
        ns: &str,
        name: &str,
        ptype: PatchType,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        let key = self.key(&r)?;
        let ns = self.scope_ns(&r, ns);
        self.shared
            .write(|st| st.patch(&key, &ns, name, ptype, patch, Sub::Main, &Self::wopts(&r)))
            .map(|(o, _)| o.value.clone())
    }

    pub fn patch_status(
        &self,
        r: Gvr,
        ns: &str,
        name: &str,
        ptype: PatchType,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        let key = self.key(&r)?;
        let ns = self.scope_ns(&r, ns);
        self.shared
            .write(|st| st.patch(&key, &ns, name, ptype, patch, Sub::Status, &Self::wopts(&r)))
            .map(|(o, _)| o.value.clone())
    }

    /// DELETE (finalizers respected). Returns the deleted (or marked) object.
    pub fn delete(&self, r: Gvr, ns: &str, name: &str) -> Result<Value, ApiError> {
        let key = self.key(&r)?;
        let ns = self.scope_ns(&r, ns);
        self.shared
            .write(|st| st.delete(&key, &ns, name, &DeleteOpts::default()))
            .map(|o| o.value.clone())
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    /// Creates every object of a YAML or JSON text (multi-document YAML, and `List` kinds),
    /// routing each by apiVersion and kind; CRDs first, then namespaces, then the rest. Returns how
    /// many were created.
    pub fn load(&self, text: &str) -> Result<usize, Error> {
        let mut objs = Vec::new();
        if let Ok(v) = serde_json::from_str::<Value>(text) {
            objs.push(v);
        } else {
            use serde::Deserialize;
            for doc in serde_norway::Deserializer::from_str(text) {
                let v = Value::deserialize(doc).map_err(|e| Error::Load(e.to_string()))?;
                if !v.is_null() {
                    objs.push(v);
                }
            }
        }
        let mut flat = Vec::new();
        for o in objs {
            match o.get("items").and_then(Value::as_array) {
                Some(items)
                    if o.get("kind")
                        .and_then(Value::as_str)
                        .is_some_and(|k| k.ends_with("List")) =>
                {
                    flat.extend(items.iter().cloned())
                }
                _ => flat.push(o),
            }
        }
        // CRDs first (their resources must exist), then namespaces (their objects need them).
        flat.sort_by_key(|o| match o.get("kind").and_then(Value::as_str) {
            Some("CustomResourceDefinition") => 0,
            Some("Namespace") => 1,
            _ => 2,
        });
        let mut n = 0;
        for o in flat {
            let av = o
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let kind = o
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let def = self
                .shared
                .lock()
                .find_kind(&av, &kind)
                .ok_or_else(|| Error::Load(format!("no resource serves {av} {kind}")))?;
            let ns = o
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("default")
                .to_string();
            let version = av.rsplit('/').next().unwrap_or("v1").to_string();
            self.create(Gvr::new(&def.group, &version, &def.plural), &ns, o)?;
            n += 1;
        }
        Ok(n)
    }

    fn scope_ns(&self, r: &Gvr, ns: &str) -> String {
        let st = self.shared.lock();
        match st.resources.get(&gr_key(r.group, r.plural)) {
            Some(c) if !c.def.namespaced => String::new(),
            _ => ns.to_string(),
        }
    }
}

struct Incarnation {
    stop: tokio::sync::watch::Sender<bool>,
    done: std::sync::mpsc::Receiver<()>,
}

/// A running API server double. Dropping it stops it.
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tls: Option<(String, tokio_rustls::TlsAcceptor)>,
    token: String,
    rt: tokio::runtime::Handle,
    thread: Option<std::thread::JoinHandle<()>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    running: Mutex<Option<Incarnation>>,
}

impl ApiServer {
    /// Starts the server on its own thread and runtime; returns once it accepts connections.
    pub fn start(opts: ServerOptions) -> Result<ApiServer, Error> {
        let tls = if opts.tls {
            let m = tls::generate()?;
            Some((m.ca_pem, tokio_rustls::TlsAcceptor::from(m.config)))
        } else {
            None
        };
        let token = opts.token.clone().unwrap_or_else(util::random_hex::<24>);
        let mut state = State::new(opts.event_history, opts.graceful_pod_deletion);
        let cidr = services::parse_cidr(&opts.service_cidr).map_err(Error::Config)?;
        if opts.node_port_range.0 == 0 || opts.node_port_range.0 > opts.node_port_range.1 {
            return Err(Error::Config(format!(
                "node port range {}-{}: expected first <= last, both 1-65535",
                opts.node_port_range.0, opts.node_port_range.1
            )));
        }
        state.services = services::Allocator::new(cidr, opts.node_port_range);
        if opts.calico_crds {
            let wo = WriteOpts::default();
            for crd in resources::calico_crds() {
                state.create(
                    "apiextensions.k8s.io/customresourcedefinitions",
                    "",
                    crd,
                    &wo,
                )?;
            }
        }
        let rv = state.rv;
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            rv_tx: tokio::sync::watch::Sender::new(rv),
            close_tx: tokio::sync::watch::Sender::new(0),
            stats: Mutex::new(Stats::default()),
            faults: Mutex::new(Vec::new()),
            token: opts.tls.then(|| token.clone()),
            bookmark_interval: opts.bookmark_interval.max(Duration::from_millis(10)),
        });
        let listener = server::bind(opts.bind).map_err(|source| Error::Bind {
            addr: opts.bind,
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: opts.bind,
            source,
        })?;
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let workers = opts.worker_threads.clamp(1, 16);
        let thread = std::thread::Builder::new()
            .name(format!("apiserver-{}", addr.port()))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(workers)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(rt.handle().clone()));
                rt.block_on(async {
                    let _ = shutdown_rx.await;
                });
                rt.shutdown_timeout(Duration::from_secs(2));
            })
            .map_err(Error::Runtime)?;
        let rt = handle_rx
            .recv()
            .map_err(|_| Error::Gone)?
            .map_err(Error::Runtime)?;
        let server = ApiServer {
            shared,
            addr,
            tls,
            token,
            rt,
            thread: Some(thread),
            shutdown: Some(shutdown_tx),
            running: Mutex::new(None),
        };
        server.serve(listener);
        tracing::info!(url = %server.url(), "API server double started");
        Ok(server)
    }

    fn serve(&self, listener: std::net::TcpListener) {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let shared = self.shared.clone();
        let acceptor = self.tls.as_ref().map(|(_, a)| a.clone());
        self.rt.spawn(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => server::accept_loop(l, shared, acceptor, stop_rx).await,
                Err(e) => tracing::error!(error = %e, "cannot serve the listener"),
            }
            let _ = done_tx.send(());
        });
        *lock(&self.running) = Some(Incarnation {
            stop: stop_tx,
            done: done_rx,
        });
    }

    /// `https://127.0.0.1:PORT` (or `http://` without TLS).
    pub fn url(&self) -> String {
        format!(
            "{}://{}",
            if self.tls.is_some() { "https" } else { "http" },
            self.addr
        )
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bearer token clients must send (unused without TLS).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The CA certificate (PEM) that signed the server's certificate; empty without TLS.
    pub fn ca_pem(&self) -> &str {
        self.tls.as_ref().map_or("", |(c, _)| c.as_str())
    }

    /// A kubeconfig for kubectl and kube::Config (context `margay`, namespace `default`).
    pub fn kubeconfig_yaml(&self) -> String {
        use base64::Engine;
        let (cluster_extra, user) = match &self.tls {
            Some((ca, _)) => (
                format!(
                    "    certificate-authority-data: {}\n",
                    base64::engine::general_purpose::STANDARD.encode(ca)
                ),
                format!("    token: {}\n", self.token),
            ),
            None => (String::new(), "    {}\n".to_string()),
        };
        let user = if self.tls.is_some() {
            format!("  user:\n{user}")
        } else {
            "  user: {}\n".to_string()
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: margay\n  cluster:\n    server: {}\n{cluster_extra}contexts:\n- name: margay\n  context:\n    cluster: margay\n    user: margay\n    namespace: default\ncurrent-context: margay\nusers:\n- name: margay\n{user}preferences: {{}}\n",
            self.url()
        )
    }

    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    pub fn store(&self) -> StoreHandle {
        StoreHandle {
            shared: self.shared.clone(),
        }
    }

    /// Simulated etcd compaction at the current revision: lists, continue tokens and watches
    /// from any older revision get 410 Gone; watches that are behind are closed.
    pub fn compact(&self) {
        self.shared.write(|st| st.compact());
        // Wake the watches so those now behind the history end.
        let rv = self.shared.lock().rv;
        self.shared.rv_tx.send_replace(rv);
    }

    /// Ends every open watch stream cleanly (clients re-watch from their last revision).
    pub fn close_watches(&self) {
        self.shared.close_tx.send_modify(|g| *g += 1);
    }

    /// Stops serving (the port closes; open connections and watches are cut). State is kept.
    pub fn stop(&self) {
        let inc = lock(&self.running).take();
        if let Some(inc) = inc {
            let _ = inc.stop.send(true);
            let _ = inc.done.recv_timeout(Duration::from_secs(5));
        }
    }

    /// Serves again on the same port with the same state, certificate and token.
    pub fn start_again(&self) -> Result<(), Error> {
        if lock(&self.running).is_some() {
            return Ok(());
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let listener = loop {
            match server::bind(self.addr) {
                Ok(l) => break l,
                Err(e)
                    if std::time::Instant::now() < deadline
                        && e.kind() == std::io::ErrorKind::AddrInUse =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(source) => {
                    return Err(Error::Bind {
                        addr: self.addr,
                        source,
                    });
                }
            }
        };
        self.serve(listener);
        Ok(())
    }

    pub fn stats(&self) -> Stats {
        let mut s = self.shared.stats().clone();
        let st = self.shared.lock();
        s.resource_version = st.rv;
        s.objects = st.object_count();
        s
    }

    /// The next `count` requests matching `matcher` fail with `status_code` (a `Status` with
    /// the real server's reason for that code; a 410 on a watch is an ERROR event, as the
    /// real server sends it; 429/503 carry `Retry-After: 1`).
    pub fn fail_next(&self, matcher: FaultMatcher, status_code: u16, count: u32) {
        if count > 0 {
            lock(&self.shared.faults).push(Fault {
                matcher,
                code: status_code,
                remaining: count,
            });
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs a server until `shutdown` completes: the entry point of a standalone process.
/// `ready` is called once it serves (write the kubeconfig, load fixtures with
/// [`ApiServer::store`] and [`StoreHandle::load`]).
pub async fn run_until<F>(
    opts: ServerOptions,
    ready: impl FnOnce(&ApiServer) -> Result<(), Error>,
    shutdown: F,
) -> Result<(), Error>
where
    F: Future<Output = ()>,
{
    let server = ApiServer::start(opts)?;
    ready(&server)?;
    shutdown.await;
    // Dropping joins the server's thread; do it off the caller's runtime threads.
    let _ = std::thread::spawn(move || drop(server)).join();
    Ok(())
}
