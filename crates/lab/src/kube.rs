//! The lab's Kubernetes API (`--datastore kubernetes`): the API server process and the lab's
//! own client of it.
//!
//! Where it listens: `margay lab apiserver` runs margay's API server double
//! (`margay_apiserver`, TLS with a bearer token, Calico's CRDs installed) on **127.0.0.1 of the
//! root namespace**, on a free port P — loopback only, so plain `kubectl --kubeconfig $(margay
//! lab kubeconfig)` works from the machine's shell and nothing is reachable from outside. The
//! same process also listens on 127.0.0.1:P **inside the fabric namespace and every node's
//! namespace** (sockets opened from a thread that entered each namespace) and forwards those
//! connections, bytes unchanged (TLS end to end), to the server. So every component — Felix,
//! node start-up, confd, the CNI plugin, kube-controllers, `margay lab ctl` — uses the one
//! kubeconfig the server wrote (`https://127.0.0.1:P`, whose certificate names 127.0.0.1), as
//! on clusters where each node reaches the API server through a local proxy on its loopback
//! (kubespray's localhost load balancer, k3s/RKE2 agents). No address, route or link is added
//! anywhere for it.
//!
//! The server keeps its objects in memory: it is started once (supervised without restarts)
//! and the lab is rebuilt if it dies. Its files are in the lab's directory: `kubeconfig`
//! (written once every listener is up, so its presence means the API is reachable) and
//! `apiserver/` (pid file and log).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use margay_apiserver::{ServerOptions, run_until};
use margay_datastore::KubeSettings;
use margay_datastore::kube::KubeBackend;
use margay_datastore::kube::api::{ApiError, KubeApi};
use margay_datastore::kube::route::ApiResource;
use serde_json::Value;

use crate::net::{LabError, other};

pub use margay_datastore::kube::route::{
    K8S_NETWORK_POLICIES, NAMESPACES, NODES, PODS, SERVICE_ACCOUNTS,
};

pub const CONFIGMAPS: ApiResource = ApiResource {
    group: "",
    version: "v1",
    plural: "configmaps",
    kind: "ConfigMap",
    namespaced: true,
};

/// How long one API request of the lab may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Forwarded connections open at once, per namespace (the server takes 1024 in all).
const MAX_FORWARDED: usize = 256;

/// `margay lab apiserver`: serves until SIGTERM/SIGINT. Writes `kubeconfig` once the server
/// and the listeners in `namespaces` are up.
pub fn serve(kubeconfig: &Path, namespaces: &[String]) -> Result<u8, LabError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| other(format!("cannot start the runtime: {e}")))?;
    let opts = ServerOptions {
        calico_crds: true,
        // Watches get a bookmark every few seconds (a real server: about a minute).
        bookmark_interval: Duration::from_secs(5),
        event_history: 50_000,
        ..ServerOptions::default()
    };
    let served: Arc<Mutex<Option<(SocketAddr, String)>>> = Arc::new(Mutex::new(None));
    let failed: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let (served2, failed2) = (served.clone(), failed.clone());
    let kubeconfig = kubeconfig.to_path_buf();
    let namespaces = namespaces.to_vec();
    let result = rt.block_on(run_until(
        opts,
        move |server| {
            *lock(&served2) = Some((server.addr(), server.kubeconfig_yaml()));
            Ok(())
        },
        async move {
            // run_until calls `ready` before awaiting this, so the address is known.
            let Some((addr, config)) = lock(&served).clone() else {
                return;
            };
            if let Err(e) = forward_from(&namespaces, addr).and_then(|()| {
                write_private(&kubeconfig, &config)
                    .map_err(|e| other(format!("{}: {e}", kubeconfig.display())))
            }) {
                *lock(&failed) = Some(e.to_string());
                return;
            }
            eprintln!(
                "margay lab apiserver: serving https://{addr} (and on 127.0.0.1:{} in {namespaces:?}); kubeconfig {}",
                addr.port(),
                kubeconfig.display()
            );
            // No kube-controller-manager runs in the lab: this process keeps the Services'
            // EndpointSlices in step with their pods, as its EndpointSlice controller would.
            let settings = KubeSettings {
                kubeconfig: vec![kubeconfig.clone()],
                ..KubeSettings::default()
            };
            let _controller = match KubeBackend::connect(&settings).await {
                Ok(b) => Some(AbortOnDrop(tokio::spawn(crate::services::run(
                    b.api().clone(),
                )))),
                Err(e) => {
                    eprintln!("margay lab apiserver: no EndpointSlice controller: {e}");
                    None
                }
            };
            wait_for_signal().await;
        },
    ));
    if let Some(e) = lock(&failed2).take() {
        return Err(other(e));
    }
    result.map_err(|e| other(format!("API server: {e}")))?;
    Ok(0)
}

/// Aborts the task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending::<()>().await,
    }
}

/// Opens 127.0.0.1:<port> inside each namespace and forwards what arrives to `upstream`.
/// Must run inside the runtime.
fn forward_from(namespaces: &[String], upstream: SocketAddr) -> Result<(), LabError> {
    for ns in namespaces {
        let path = format!("/run/netns/{ns}");
        let file = margay_netlink::netns::open(Path::new(&path))
            .map_err(|e| other(format!("namespace {ns}: {e}")))?;
        let listener = margay_netlink::netns::run_in(&file, || {
            let l = std::net::TcpListener::bind(("127.0.0.1", upstream.port()))?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .map_err(|e| {
            other(format!(
                "listening on 127.0.0.1:{} in {ns}: {e}",
                upstream.port()
            ))
        })?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| other(format!("listener in {ns}: {e}")))?;
        tokio::spawn(forward(listener, upstream, ns.clone()));
    }
    Ok(())
}

/// Accepts for the life of the process; each connection is relayed until either side closes.
async fn forward(listener: tokio::net::TcpListener, upstream: SocketAddr, ns: String) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_FORWARDED));
    loop {
        let (mut inbound, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("margay lab apiserver: accepting in {ns}: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            eprintln!(
                "margay lab apiserver: {MAX_FORWARDED} connections from {ns} already; refusing one"
            );
            continue;
        };
        tokio::spawn(async move {
            let _permit = permit;
            let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await else {
                return;
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
        });
    }
}

/// Writes a file readable by its owner only (a kubeconfig holds the token), atomically.
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(tmp, path)
}

/// The lab's client of its API server (from the root namespace, as `kubectl` is): the writes
/// an installer, the service-account controller and the kubelet make. Blocking; every
/// request is bounded.
pub struct Api {
    rt: tokio::runtime::Runtime,
    api: KubeApi,
}

fn api_err(what: &str, e: ApiError) -> LabError {
    other(format!("Kubernetes API, {what}: {e}"))
}

impl Api {
    pub fn connect(kubeconfig: &Path) -> Result<Api, LabError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| other(format!("cannot start the runtime: {e}")))?;
        let settings = KubeSettings {
            kubeconfig: vec![kubeconfig.to_path_buf()],
            ..KubeSettings::default()
        };
        let backend = rt
            .block_on(KubeBackend::connect(&settings))
            .map_err(|e| other(format!("Kubernetes API ({}): {e}", kubeconfig.display())))?;
        Ok(Api {
            rt,
            api: backend.api().clone(),
        })
    }

    fn run<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        self.rt
            .block_on(async { tokio::time::timeout(REQUEST_TIMEOUT, f).await })
            .unwrap_or_else(|_| {
                Err(ApiError::Unavailable(format!(
                    "{what}: no answer within {REQUEST_TIMEOUT:?}"
                )))
            })
    }

    fn ns<'a>(res: &ApiResource, obj: &'a Value) -> Option<&'a str> {
        res.namespaced
            .then(|| obj.pointer("/metadata/namespace").and_then(Value::as_str))
            .flatten()
    }

    fn describe(res: &ApiResource, ns: Option<&str>, name: &str) -> String {
        match ns {
            Some(ns) => format!("{} {ns}/{name}", res.kind),
            None => format!("{} {name}", res.kind),
        }
    }

    pub fn create(&self, res: &ApiResource, obj: &Value) -> Result<Value, LabError> {
        let ns = Self::ns(res, obj);
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let what = format!("creating {}", Self::describe(res, ns, name));
        self.run(&what, self.api.create(res, ns, obj))
            .map_err(|e| api_err(&what, e))
    }

    /// Creates the object unless it exists (then leaves it as it is).
    pub fn ensure(&self, res: &ApiResource, obj: &Value) -> Result<(), LabError> {
        let ns = Self::ns(res, obj);
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let what = format!("creating {}", Self::describe(res, ns, name));
        match self.run(&what, self.api.create(res, ns, obj)) {
            Ok(_) | Err(ApiError::AlreadyExists) => Ok(()),
            Err(e) => Err(api_err(&what, e)),
        }
    }

    pub fn get(
        &self,
        res: &ApiResource,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, LabError> {
        let what = format!("reading {}", Self::describe(res, ns, name));
        self.run(&what, self.api.get(res, ns, name))
            .map_err(|e| api_err(&what, e))
    }

    pub fn list(&self, res: &ApiResource, ns: Option<&str>) -> Result<Vec<Value>, LabError> {
        let what = format!("listing {}", res.display());
        self.run(&what, self.api.list_all(res, ns, None))
            .map(|l| l.items)
            .map_err(|e| api_err(&what, e))
    }

    /// A merge patch of the object's status (as the kubelet writes pod and node status).
    pub fn patch_status(
        &self,
        res: &ApiResource,
        ns: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<(), LabError> {
        let what = format!("updating the status of {}", Self::describe(res, ns, name));
        self.run(
            &what,
            self.api.merge_patch(res, ns, name, Some("status"), patch),
        )
        .map(drop)
        .map_err(|e| api_err(&what, e))
    }

    /// Deletes the object; one that is gone already counts as deleted.
    pub fn delete(&self, res: &ApiResource, ns: Option<&str>, name: &str) -> Result<(), LabError> {
        let what = format!("deleting {}", Self::describe(res, ns, name));
        match self.run(&what, self.api.delete(res, ns, name, None)) {
            Ok(_) | Err(ApiError::NotFound) => Ok(()),
            Err(e) => Err(api_err(&what, e)),
        }
    }
}
