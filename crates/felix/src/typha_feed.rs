//! Felix's inputs through Typha (TyphaAddr, or TyphaK8sServiceName: Typha's Service in
//! Kubernetes): the Typha client (failover, migration, dedupe buffer) turned into exactly what
//! the datastore path produces — the syncer's `SyncerEvent`s for the v3 resources and
//! `BlockEvent`s for the IPAM blocks — so the rest of the pipeline is unchanged and Felix
//! never talks to the datastore.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use margay_api::net::Cidr;
use margay_datastore::{SyncStatus, SyncerEvent, Update};
use margay_felix_config::Config;
use margay_typha::client::{self, ClientEvent, ClientOptions, ClientStats, ConnectionState};
use margay_typha::discovery::{self, Discovered, Discovery, ServiceRef};
use margay_typha::proto::Kv;
use margay_typha::syncers::{IPAM_BLOCKS_PREFIX, SyncerType};
use margay_typha::tls::{ClientTls, ExpectedPeer, FELIX_PARAMS, TlsFiles};
use tokio::sync::mpsc;

use crate::FelixError;
use crate::blocks::BlockEvent;

/// The health reporter that follows the Typha connection.
pub const TYPHA_CONNECTION: &str = "TyphaConnection";

/// One input for the pipeline.
#[derive(Debug, Clone, PartialEq)]
pub enum FeedItem {
    Syncer(SyncerEvent),
    Block(BlockEvent),
    /// Kubernetes Services and EndpointSlices (Typha in the Kubernetes datastore carries them).
    Services(Vec<margay_datastore::kube::services::ServiceEvent>),
    Connection(ConnectionState),
}

/// Where Felix finds Typha.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TyphaTarget {
    /// TyphaAddr: these addresses.
    Addrs(Vec<String>),
    /// TyphaK8sServiceName (with TyphaAddr empty): the endpoints of this Service.
    Kubernetes(ServiceRef),
}

/// Calico's rule: TyphaAddr wins; else TyphaK8sServiceName in TyphaK8sNamespace (empty or
/// `none`: no Typha); None means Felix reads the datastore itself.
pub fn typha_target(c: &Config) -> Option<TyphaTarget> {
    let addrs: Vec<String> = c
        .typha_addr
        .split(',')
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .collect();
    if !addrs.is_empty() {
        return Some(TyphaTarget::Addrs(addrs));
    }
    let name = c.typha_k8s_service_name.trim();
    if name.is_empty() || name.eq_ignore_ascii_case("none") {
        return None;
    }
    Some(TyphaTarget::Kubernetes(ServiceRef::new(
        &c.typha_k8s_namespace,
        name,
    )))
}

/// The lookup of Typha's Service for this Felix: endpoints on FelixHostname first, over the
/// Kubernetes connection the datastore settings describe (KUBECONFIG, K8S_API_ENDPOINT, …;
/// in a pod without them, its service account).
pub fn discovery(
    env: &BTreeMap<String, String>,
    c: &Config,
    service: ServiceRef,
) -> Result<Discovery, FelixError> {
    let ds = margay_datastore::DatastoreConfig::from_lookup(|k| env.get(k).cloned())
        .map_err(|e| FelixError::Datastore(e.to_string()))?;
    Ok(Discovery::new(ds.kube, service, c.felix_hostname.clone()))
}

/// The Typha client's options from Felix's configuration, for these addresses.
pub fn client_options(c: &Config, addrs: Vec<String>) -> Result<ClientOptions, FelixError> {
    let mut o = ClientOptions::new(addrs, c.felix_hostname.clone(), SyncerType::Felix);
    o.info = format!("margay felix {}", env!("CARGO_PKG_VERSION"));
    if !c.typha_read_timeout.is_zero() {
        o.read_timeout = c.typha_read_timeout;
    }
    if !c.typha_write_timeout.is_zero() {
        o.write_timeout = c.typha_write_timeout;
    }
    let any_tls = [&c.typha_key_file, &c.typha_cert_file, &c.typha_ca_file]
        .iter()
        .any(|s| !s.is_empty());
    if any_tls {
        let files = TlsFiles {
            key_file: c.typha_key_file.clone(),
            cert_file: c.typha_cert_file.clone(),
            ca_file: c.typha_ca_file.clone(),
            expected: ExpectedPeer {
                cn: c.typha_cn.clone(),
                uri_san: c.typha_uri_san.clone(),
            },
        };
        let tls = ClientTls::from_files(&files, FELIX_PARAMS)
            .map_err(|e| FelixError::Config(format!("Typha TLS: {e}")))?;
        o.tls = Some(tls);
    }
    Ok(o)
}

/// A running Typha client.
pub struct TyphaFeed {
    rx: mpsc::Receiver<ClientEvent>,
    task: tokio::task::JoinHandle<()>,
    pub stats: Arc<ClientStats>,
    converter: Converter,
    last_disconnect: Option<String>,
}

impl Drop for TyphaFeed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TyphaFeed {
    /// The client over fixed addresses (TyphaAddr).
    pub fn start(opts: ClientOptions) -> TyphaFeed {
        let (tx, rx) = mpsc::channel(16);
        let stats = Arc::new(ClientStats::default());
        let task = tokio::spawn(client::run(opts, tx, stats.clone()));
        TyphaFeed::new(rx, task, stats)
    }

    /// The client over what `found` found, looked up again through `discovery` as
    /// [`discovery::run_client`] describes (TyphaK8sServiceName).
    pub fn start_discovered(
        opts: ClientOptions,
        discovery: Discovery,
        found: Discovered,
    ) -> TyphaFeed {
        let (tx, rx) = mpsc::channel(16);
        let stats = Arc::new(ClientStats::default());
        let task = tokio::spawn(discovery::run_client(
            opts,
            discovery,
            found,
            tx,
            stats.clone(),
        ));
        TyphaFeed::new(rx, task, stats)
    }

    fn new(
        rx: mpsc::Receiver<ClientEvent>,
        task: tokio::task::JoinHandle<()>,
        stats: Arc<ClientStats>,
    ) -> TyphaFeed {
        TyphaFeed {
            rx,
            task,
            stats,
            converter: Converter::default(),
            last_disconnect: None,
        }
    }

    /// The next inputs (None: the client stopped).
    pub async fn next(&mut self) -> Option<Vec<FeedItem>> {
        let ev = self.rx.recv().await?;
        if let ClientEvent::Connection(ConnectionState::Disconnected { reason }) = &ev {
            self.last_disconnect = Some(reason.clone());
        }
        Some(self.converter.convert(ev))
    }

    /// Why the client stopped, for the exit message: the last reason it gave for having no
    /// connection.
    pub fn stop_reason(&self) -> String {
        match &self.last_disconnect {
            Some(r) => format!("the Typha client stopped: {r}"),
            None => "the Typha client stopped".to_string(),
        }
    }
}

/// Turns client events into pipeline inputs; remembers each block key's CIDR so that a
/// deleted block can be named.
#[derive(Debug, Default)]
pub struct Converter {
    blocks: HashMap<String, Cidr>,
}

impl Converter {
    pub fn convert(&mut self, ev: ClientEvent) -> Vec<FeedItem> {
        match ev {
            ClientEvent::Status(s) => {
                let mut out = Vec::new();
                if s == SyncStatus::InSync {
                    // Blocks travel in the same stream: they are complete too.
                    out.push(FeedItem::Block(BlockEvent::InSync));
                    // So are the services (a Typha that carries none has none to give).
                    out.push(FeedItem::Services(vec![
                        margay_datastore::kube::services::ServiceEvent::InSync,
                    ]));
                }
                out.push(FeedItem::Syncer(SyncerEvent::Status(s)));
                out
            }
            ClientEvent::Connection(c) => vec![FeedItem::Connection(c)],
            ClientEvent::Kvs(kvs) => self.kvs(kvs),
        }
    }

    fn kvs(&mut self, kvs: Vec<Kv>) -> Vec<FeedItem> {
        let mut out = Vec::new();
        let mut updates: Vec<Update> = Vec::new();
        for kv in kvs {
            if kv.key.starts_with(IPAM_BLOCKS_PREFIX) {
                if let Some(ev) = self.block(&kv) {
                    if !updates.is_empty() {
                        out.push(FeedItem::Syncer(SyncerEvent::Updates(std::mem::take(
                            &mut updates,
                        ))));
                    }
                    out.push(FeedItem::Block(ev));
                }
                continue;
            }
            if let Some(ev) =
                margay_datastore::kube::services::event_from_kv(&kv.key, kv.value.as_deref())
            {
                if !updates.is_empty() {
                    out.push(FeedItem::Syncer(SyncerEvent::Updates(std::mem::take(
                        &mut updates,
                    ))));
                }
                out.push(FeedItem::Services(vec![ev]));
                continue;
            }
            match client::to_update_or_deleted(&kv) {
                Some(u) => updates.push(u),
                None => tracing::debug!(key = %kv.key, "ignoring a key Felix does not use"),
            }
        }
        if !updates.is_empty() {
            out.push(FeedItem::Syncer(SyncerEvent::Updates(updates)));
        }
        out
    }

    fn block(&mut self, kv: &Kv) -> Option<BlockEvent> {
        match &kv.value {
            Some(v) => match crate::blocks::affinity(v) {
                Some((cidr, host)) => {
                    self.blocks.insert(kv.key.clone(), cidr);
                    Some(BlockEvent::Block(cidr, host))
                }
                None => {
                    tracing::warn!(key = %kv.key, "ignoring an unreadable IPAM block from Typha");
                    self.blocks
                        .remove(&kv.key)
                        .map(|cidr| BlockEvent::Block(cidr, None))
                }
            },
            None => self
                .blocks
                .remove(&kv.key)
                .map(|cidr| BlockEvent::Block(cidr, None)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use bytes::Bytes;
    use margay_typha::proto::UpdateKind;

    fn config(env: &[(&str, &str)]) -> Config {
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let local = crate::inputs::LocalInputs {
            env,
            config_file: "/nonexistent/felix.cfg".into(),
            config_text: None,
            kernel_hostname: Some("kernel-host".into()),
        };
        margay_felix_config::load(&local.config_inputs())
            .unwrap()
            .config
    }

    #[test]
    fn where_typha_is() {
        let k8s = |ns: &str, name: &str| Some(TyphaTarget::Kubernetes(ServiceRef::new(ns, name)));
        type Env<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(Env, Option<TyphaTarget>)] = &[
            (&[], None),
            (&[("FELIX_TYPHAK8SSERVICENAME", "none")], None),
            (&[("FELIX_TYPHAK8SSERVICENAME", "")], None),
            (
                &[("FELIX_TYPHAK8SSERVICENAME", "calico-typha")],
                k8s("kube-system", "calico-typha"),
            ),
            (
                &[
                    ("FELIX_TYPHAK8SSERVICENAME", "typha"),
                    ("FELIX_TYPHAK8SNAMESPACE", "calico-system"),
                ],
                k8s("calico-system", "typha"),
            ),
            // TyphaAddr wins.
            (
                &[
                    ("FELIX_TYPHAK8SSERVICENAME", "calico-typha"),
                    ("FELIX_TYPHAADDR", "10.0.0.1:5473, 10.0.0.2:5473"),
                ],
                Some(TyphaTarget::Addrs(vec![
                    "10.0.0.1:5473".into(),
                    "10.0.0.2:5473".into(),
                ])),
            ),
        ];
        for (env, want) in cases {
            assert_eq!(&typha_target(&config(env)), want, "{env:?}");
        }
        let t = typha_target(&config(&[("FELIX_TYPHAK8SSERVICENAME", "calico-typha")])).unwrap();
        let TyphaTarget::Kubernetes(svc) = t else {
            panic!("{t:?}")
        };
        assert_eq!(svc.port_name, "calico-typha");
        let c = config(&[
            ("FELIX_TYPHAK8SSERVICENAME", "calico-typha"),
            ("FELIX_FELIXHOSTNAME", "node-7"),
        ]);
        let env: BTreeMap<String, String> =
            [("KUBECONFIG".to_string(), "/etc/k/config".to_string())].into();
        let d = discovery(&env, &c, svc).unwrap();
        assert_eq!(d.node, "node-7");
        assert_eq!(
            d.kube.kubeconfig,
            vec![std::path::PathBuf::from("/etc/k/config")]
        );
    }

    #[test]
    fn converts_resources_and_blocks() {
        let mut c = Converter::default();
        let pool = br#"{"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{"name":"p1"},"spec":{"cidr":"10.0.0.0/16"}}"#;
        let block =
            margay_ipam::AllocationBlock::new(Cidr::parse("10.0.0.0/26").unwrap(), Some("n1"));
        let bkey = "/calico/ipam/v2/assignment/ipv4/block/10.0.0.0-26".to_string();
        let out = c.convert(ClientEvent::Kvs(vec![
            Kv {
                key: "/calico/resources/v3/projectcalico.org/ippools/p1".into(),
                value: Some(Bytes::from_static(pool)),
                revision: 7,
                kind: UpdateKind::New,
            },
            Kv {
                key: bkey.clone(),
                value: Some(Bytes::from(serde_json::to_vec(&block).unwrap())),
                revision: 8,
                kind: UpdateKind::New,
            },
        ]));
        assert_eq!(out.len(), 2);
        let FeedItem::Syncer(SyncerEvent::Updates(u)) = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(u[0].key.name, "p1");
        assert_eq!(u[0].revision, 7);
        assert_eq!(
            u[0].value.as_ref().unwrap().metadata().resource_version,
            "7"
        );
        let cidr = Cidr::parse("10.0.0.0/26").unwrap();
        assert_eq!(
            out[1],
            FeedItem::Block(BlockEvent::Block(cidr, Some("n1".into())))
        );
        let out = c.convert(ClientEvent::Kvs(vec![Kv {
            key: bkey,
            value: None,
            revision: 9,
            kind: UpdateKind::Deleted,
        }]));
        assert_eq!(out, vec![FeedItem::Block(BlockEvent::Block(cidr, None))]);
        let out = c.convert(ClientEvent::Status(SyncStatus::InSync));
        assert_eq!(
            out,
            vec![
                FeedItem::Block(BlockEvent::InSync),
                FeedItem::Services(vec![margay_datastore::kube::services::ServiceEvent::InSync]),
                FeedItem::Syncer(SyncerEvent::Status(SyncStatus::InSync))
            ]
        );
        // Services and EndpointSlices in margay's key space become service events; a key
        // Felix does not know is ignored, never a failure.
        let out = c.convert(ClientEvent::Kvs(vec![
            Kv {
                key: "/margay/kubernetes/endpointslices/ns1/web-1".into(),
                value: Some(Bytes::from_static(br#"{"metadata":{"name":"web-1"}}"#)),
                revision: 9,
                kind: UpdateKind::New,
            },
            Kv {
                key: "/margay/unknown/x".into(),
                value: Some(Bytes::from_static(b"{}")),
                revision: 9,
                kind: UpdateKind::New,
            },
        ]));
        assert_eq!(out.len(), 1, "{out:?}");
        let FeedItem::Services(evs) = &out[0] else {
            panic!("{out:?}")
        };
        assert!(matches!(
            &evs[0],
            margay_datastore::kube::services::ServiceEvent::Update { namespace, name, object: Some(_), .. }
                if namespace == "ns1" && name == "web-1"
        ));
    }
}
