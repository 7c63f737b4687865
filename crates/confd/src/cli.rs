//! `margay confd`: the command line and the wiring of the daemon's edges.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use margay_datastore::DatastoreConfig;
use margay_typha::client::{ClientEvent, ClientOptions, ClientStats};
use margay_typha::discovery::{self, Discovered, Discovery, ServiceRef};
use margay_typha::syncers::SyncerType;
use margay_typha::tls::{ClientTls, ExpectedPeer, FELIX_PARAMS, TlsFiles};
use tokio::sync::mpsc;

use crate::bird::{FileInstaller, FileSecrets, SocketReloader};
use crate::daemon::{Confd, LoopOptions, Status, run};
use crate::model::BirdInputs;
use crate::secrets::DEFAULT_SECRETS_DIR;

pub const DEFAULT_CONFIG_DIR: &str = "/etc/calico/confd/config";
pub const DEFAULT_BIRD_SOCKET: &str = "/var/run/calico/bird.ctl";
pub const DEFAULT_BIRD6_SOCKET: &str = "/var/run/calico/bird6.ctl";
/// The status file's name inside the config directory.
pub const STATUS_FILE: &str = "confd-status.json";

#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Keeps BIRD's configuration in step with the datastore, as Calico's confd \
does: the Node, BGPConfiguration, BGPPeer, BGPFilter and IPPool resources and this node's IPAM \
block affinities become bird.cfg (IPv4) and bird6.cfg (IPv6) in the config directory, for BIRD 2. \
Each file is checked with `bird -p -c` before it replaces the old one, and BIRD is told to \
reconfigure through its control socket only when the text changed.

The datastore is the one DATASTORE_TYPE / DATASTORE_PATH / ETCD_ENDPOINTS name (the embedded \
store by default); with FELIX_TYPHAADDR (or CALICO_TYPHAADDR) set, inputs come from Typha's bgp \
syncer instead, and so they do when FELIX_TYPHAK8SSERVICENAME names Typha's Service (empty or none: \
no Typha): its EndpointSlices in FELIX_TYPHAK8SNAMESPACE (kube-system) say where Typha is, read \
with the datastore's Kubernetes settings (KUBECONFIG, K8S_API_ENDPOINT, …, or in-cluster) (TLS: \
FELIX_TYPHAKEYFILE, FELIX_TYPHACERTFILE, FELIX_TYPHACAFILE, FELIX_TYPHACN, FELIX_TYPHAURISAN). The node name: --nodename, else NODENAME, the node name file \
(CALICO_NODENAME_FILE), HOSTNAME, the host name. CALICO_ROUTER_ID sets the router id (an IPv4 \
address or `hash`). BGP passwords (secretKeyRef name/key) are read from \
MARGAY_BGP_SECRETS_DIR/<name>/<key>. After every render, <config-dir>/confd-status.json says what \
happened.

Exit codes: 0 stopped by SIGTERM/SIGINT, or --once succeeded; 1 --once failed, or a fatal error."
)]
pub struct ConfdArgs {
    /// Render once (after syncing with the datastore), install, reconfigure BIRD, and exit.
    #[arg(long)]
    pub once: bool,
    /// The node to render for (default: NODENAME, the node name file, HOSTNAME, host name).
    #[arg(long, value_name = "NAME")]
    pub nodename: Option<String>,
    /// Where bird.cfg and bird6.cfg are written.
    #[arg(long, value_name = "DIR", env = "MARGAY_CONFD_CONFIG_DIR", default_value = DEFAULT_CONFIG_DIR)]
    pub config_dir: PathBuf,
    /// The IPv4 BIRD's control socket.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_BIRD_SOCKET)]
    pub bird_socket: PathBuf,
    /// The IPv6 BIRD's control socket.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_BIRD6_SOCKET)]
    pub bird6_socket: PathBuf,
    /// Write the files but never ask BIRD to reconfigure.
    #[arg(long)]
    pub no_reload: bool,
    /// The BIRD binary that checks configurations (`bird -p -c`).
    #[arg(long, value_name = "PATH", default_value = "bird")]
    pub bird_binary: PathBuf,
    /// Where BGP password files live (<dir>/<secret name>/<key>).
    #[arg(long, value_name = "DIR", env = "MARGAY_BGP_SECRETS_DIR", default_value = DEFAULT_SECRETS_DIR)]
    pub secrets_dir: PathBuf,
}

/// Runs `margay confd`; returns the exit code.
pub fn run_confd(args: ConfdArgs, err: &mut dyn Write) -> u8 {
    let get = margay_node::cli::env_var;
    match run_inner(args, &get) {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(err, "margay confd: {e}");
            1
        }
    }
}

fn node_name(args: &ConfdArgs, get: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    if let Some(n) = args
        .nodename
        .as_deref()
        .map(str::trim)
        .filter(|n| !n.is_empty())
    {
        return Ok(n.to_string());
    }
    let file = get("CALICO_NODENAME_FILE")
        .filter(|f| !f.trim().is_empty())
        .map_or_else(
            || PathBuf::from(margay_node::config::DEFAULT_NODENAME_FILE),
            PathBuf::from,
        );
    margay_node::startup::node_name(get, &file, &margay_node::startup::kernel_hostname)
        .map(|(n, _)| n)
        .map_err(|e| e.to_string())
}

/// Calico's Typha settings for confd (FELIX_ first, then CALICO_ prefixes): the client's
/// options, and the lookup that fills in its addresses when Typha is found through Kubernetes
/// (TyphaK8sServiceName, used only without TyphaAddr).
fn typha_options(
    node: &str,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(ClientOptions, Option<Discovery>)>, String> {
    let var = |name: &str| {
        ["FELIX_", "CALICO_"]
            .iter()
            .find_map(|p| get(&format!("{p}{name}")).filter(|v| !v.trim().is_empty()))
            .unwrap_or_default()
    };
    let addrs: Vec<String> = var("TYPHAADDR")
        .split(',')
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .collect();
    let discovery = if addrs.is_empty() {
        let name = var("TYPHAK8SSERVICENAME");
        let name = name.trim();
        if name.is_empty() || name.eq_ignore_ascii_case("none") {
            return Ok(None);
        }
        let namespace = var("TYPHAK8SNAMESPACE");
        if namespace.trim().eq_ignore_ascii_case("none") {
            return Err(
                "FELIX_TYPHAK8SNAMESPACE cannot be none: name the namespace of Typha's \
                        Service (default kube-system)"
                    .into(),
            );
        }
        let ds = DatastoreConfig::from_lookup(get)
            .map_err(|e| format!("datastore configuration (for finding Typha): {e}"))?;
        Some(Discovery::new(
            ds.kube,
            ServiceRef::new(&namespace, name),
            node,
        ))
    } else {
        None
    };
    let mut o = ClientOptions::new(addrs, node, SyncerType::Bgp);
    o.info = format!("margay confd {}", env!("CARGO_PKG_VERSION"));
    let files = TlsFiles {
        key_file: var("TYPHAKEYFILE"),
        cert_file: var("TYPHACERTFILE"),
        ca_file: var("TYPHACAFILE"),
        expected: ExpectedPeer {
            cn: var("TYPHACN"),
            uri_san: var("TYPHAURISAN"),
        },
    };
    if !(files.key_file.is_empty() && files.cert_file.is_empty() && files.ca_file.is_empty()) {
        o.tls = Some(
            ClientTls::from_files(&files, FELIX_PARAMS).map_err(|e| format!("Typha TLS: {e}"))?,
        );
    }
    Ok(Some((o, discovery)))
}

/// How long `--once` looks for Typha before it gives up.
const ONCE_DISCOVERY_LIMIT: Duration = Duration::from_secs(30);

/// Looks Typha up until it is found: every second, logging each new problem once; with
/// `once`, for at most [`ONCE_DISCOVERY_LIMIT`].
async fn find_typha(d: &Discovery, once: bool) -> Result<Discovered, String> {
    let mut rng = discovery::Rng::from_entropy();
    let started = std::time::Instant::now();
    let mut last = String::new();
    loop {
        match d.discover(&mut rng).await {
            Ok(found) => return Ok(found),
            Err(e) => {
                let text = e.to_string();
                if once && started.elapsed() >= ONCE_DISCOVERY_LIMIT {
                    return Err(text);
                }
                if text != last {
                    tracing::error!("{text}; retrying every second");
                    last = text;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The bgp syncer through Typha found in Kubernetes ([`discovery::run_client`]); ends (and
/// with it confd, for a restart) once every Typha it knew has left the Service.
async fn run_typha_discovered(
    opts: ClientOptions,
    d: Discovery,
    found: Discovered,
    node: String,
    out: mpsc::Sender<crate::daemon::Input>,
) {
    let (tx, mut rx) = mpsc::channel(16);
    let stats = std::sync::Arc::new(ClientStats::default());
    let client = tokio::spawn(discovery::run_client(opts, d, found, tx, stats));
    let mut last_disconnect = None;
    while let Some(ev) = rx.recv().await {
        if let ClientEvent::Connection(margay_typha::ConnectionState::Disconnected { reason }) = &ev
        {
            last_disconnect = Some(reason.clone());
        }
        for i in crate::feed::convert_typha(ev, &node) {
            if out.send(i).await.is_err() {
                client.abort();
                return;
            }
        }
    }
    tracing::error!(
        reason = last_disconnect.as_deref().unwrap_or("-"),
        "the Typha client stopped"
    );
}

/// Writes the status file (temporary file + rename, so readers never see half of it).
fn write_status(dir: &Path, s: &Status) {
    let path = dir.join(STATUS_FILE);
    let res = serde_json::to_vec_pretty(s)
        .map_err(std::io::Error::other)
        .and_then(|b| crate::bird::write_temp(dir, STATUS_FILE, &b, 0o644))
        .and_then(|tmp| {
            std::fs::rename(&tmp, &path).inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })
        });
    if let Err(e) = res {
        tracing::warn!("cannot write {}: {e}", path.display());
    }
}

fn run_inner(args: ConfdArgs, get: &dyn Fn(&str) -> Option<String>) -> Result<u8, String> {
    let node = node_name(&args, get)?;
    tracing::info!(node = %node, config_dir = %args.config_dir.display(), "margay confd starting");
    let typha = typha_options(&node, get)?;
    let ds = if typha.is_none() {
        Some(DatastoreConfig::from_env().map_err(|e| format!("datastore configuration: {e}"))?)
    } else {
        None
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    rt.block_on(async move {
        let (tx, rx) = mpsc::channel(64);
        let feed = match (typha, ds) {
            (Some((o, None)), _) => {
                tracing::info!(typha = ?o.addrs, "syncing through Typha (bgp syncer)");
                tokio::spawn(crate::feed::run_typha(o, node.clone(), tx))
            }
            (Some((o, Some(d))), _) => {
                let found = find_typha(&d, args.once).await?;
                tracing::info!(service = %found.service, typhas = %found.describe(), "syncing through Typha (bgp syncer), found through Kubernetes");
                tokio::spawn(run_typha_discovered(o, d, found, node.clone(), tx))
            }
            (None, Some(ds)) => {
                let backend = tokio::time::timeout(Duration::from_secs(30), ds.connect_existing())
                    .await
                    .map_err(|_| {
                        format!(
                            "the datastore did not answer within 30 s ({})",
                            ds.describe()
                        )
                    })?
                    .map_err(|e| format!("{e} ({})", ds.describe()))?;
                tokio::spawn(crate::feed::run_direct(backend, node.clone(), tx))
            }
            (None, None) => return Err("no datastore and no Typha configured".to_string()),
        };
        let sink = FileInstaller {
            dir: args.config_dir.clone(),
            bird: args.bird_binary.clone(),
        };
        let reloader = (!args.no_reload).then(|| SocketReloader {
            v4: args.bird_socket.clone(),
            v6: args.bird6_socket.clone(),
            timeout: Duration::from_secs(10),
        });
        let secrets = FileSecrets {
            dir: args.secrets_dir.clone(),
        };
        let mut confd = Confd::new(&node, sink, reloader, secrets);
        let mut inputs = BirdInputs::new(&node);
        inputs.router_id = get("CALICO_ROUTER_ID").filter(|v| !v.trim().is_empty());
        let opts = LoopOptions {
            once: args.once,
            ..LoopOptions::default()
        };
        let dir = args.config_dir.clone();
        let code = tokio::select! {
            pass = run(&mut confd, inputs, rx, &opts, |s| write_status(&dir, s)) => {
                match pass {
                    Some(p) if args.once => {
                        let st = confd.status();
                        if p.error.is_none() && st.reload_pending.is_empty() {
                            0
                        } else {
                            1
                        }
                    }
                    _ => {
                        tracing::error!("the input feed stopped");
                        1
                    }
                }
            }
            () = shutdown() => {
                tracing::info!("stopping (signal); BIRD keeps its configuration");
                0
            }
        };
        feed.abort();
        Ok(code)
    })
}

async fn shutdown() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn options(env: &[(&str, &str)]) -> Result<Option<(ClientOptions, Option<Discovery>)>, String> {
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        typha_options("node-1", &|k: &str| env.get(k).cloned())
    }

    #[test]
    fn where_confd_finds_typha() {
        assert!(options(&[]).expect("valid").is_none());
        for off in ["", "none", "None"] {
            assert!(
                options(&[("FELIX_TYPHAK8SSERVICENAME", off)])
                    .expect("valid")
                    .is_none(),
                "{off:?}"
            );
        }
        // TyphaAddr wins over the Service.
        let (o, d) = options(&[
            ("CALICO_TYPHAADDR", "10.0.0.1:5473,10.0.0.2:5473"),
            ("FELIX_TYPHAK8SSERVICENAME", "calico-typha"),
        ])
        .expect("valid")
        .expect("typha");
        assert_eq!(o.addrs, ["10.0.0.1:5473", "10.0.0.2:5473"]);
        assert!(d.is_none());
        assert_eq!(o.syncer_type, SyncerType::Bgp);

        let (o, d) = options(&[
            ("FELIX_TYPHAK8SSERVICENAME", "calico-typha"),
            ("KUBECONFIG", "/etc/kube/config"),
        ])
        .expect("valid")
        .expect("typha");
        assert!(o.addrs.is_empty());
        let d = d.expect("a lookup");
        assert_eq!(d.service.to_string(), "kube-system/calico-typha");
        assert_eq!(d.service.port_name, "calico-typha");
        assert_eq!(d.node, "node-1");
        assert_eq!(d.kube.kubeconfig, [PathBuf::from("/etc/kube/config")]);

        let (_, d) = options(&[
            ("CALICO_TYPHAK8SSERVICENAME", "typha"),
            ("CALICO_TYPHAK8SNAMESPACE", "calico-system"),
        ])
        .expect("valid")
        .expect("typha");
        assert_eq!(
            d.expect("a lookup").service.to_string(),
            "calico-system/typha"
        );

        let e = options(&[
            ("FELIX_TYPHAK8SSERVICENAME", "calico-typha"),
            ("FELIX_TYPHAK8SNAMESPACE", "none"),
        ])
        .expect_err("an error");
        assert!(e.contains("FELIX_TYPHAK8SNAMESPACE"), "{e}");
    }
}
