//! The etcd-mode mirror controllers (edge): Kubernetes NetworkPolicies → `knp.default.<name>`
//! NetworkPolicies, Namespaces → `kns.<ns>` Profiles, ServiceAccounts → `ksa.<ns>.<sa>`
//! Profiles, Pod labels and service accounts → WorkloadEndpoints. Each reacts to the changes
//! its informer announces (one object at a time) and compares everything every reconciler
//! period; what [`crate::mirror`] plans is written through the typed client (validated,
//! compare-and-swap), failures retried with backoff.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use margay_api::{Kind, Resource, ResourceKey};
use margay_datastore::{Client, DatastoreError, KvBackend};
use tokio::sync::{mpsc, watch};

use crate::informer::{Change, Informer, Projection};
use crate::metrics::Metrics;
use crate::mirror::{Action, endpoint_update, plan};
use crate::pods::{PodView, pod_key};

/// A Kubernetes object converted (or why it does not convert).
pub type Converted = Result<Resource, String>;

pub const POLICY_PREFIX: &str = "knp.default.";
pub const NAMESPACE_PREFIX: &str = "kns.";
pub const SERVICE_ACCOUNT_PREFIX: &str = "ksa.";

pub fn policy_projection() -> Projection<Converted> {
    Arc::new(|v| {
        Some(margay_kdd::netpol::k8s_network_policy_to_calico(v).map_err(|e| e.to_string()))
    })
}

pub fn namespace_projection() -> Projection<Converted> {
    Arc::new(|v| Some(margay_kdd::profile::namespace_to_profile(v).map_err(|e| e.to_string())))
}

pub fn service_account_projection() -> Projection<Converted> {
    Arc::new(|v| {
        Some(margay_kdd::profile::service_account_to_profile(v).map_err(|e| e.to_string()))
    })
}

fn split_key(k: &str) -> Option<(&str, &str)> {
    k.split_once('/')
}

/// Which Calico resource a Kubernetes object's key stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MirrorKind {
    Policy,
    Namespace,
    ServiceAccount,
}

impl MirrorKind {
    pub fn name(self) -> &'static str {
        match self {
            MirrorKind::Policy => "policy",
            MirrorKind::Namespace => "namespace",
            MirrorKind::ServiceAccount => "serviceaccount",
        }
    }

    fn kind(self) -> Kind {
        match self {
            MirrorKind::Policy => Kind::NetworkPolicy,
            _ => Kind::Profile,
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            MirrorKind::Policy => POLICY_PREFIX,
            MirrorKind::Namespace => NAMESPACE_PREFIX,
            MirrorKind::ServiceAccount => SERVICE_ACCOUNT_PREFIX,
        }
    }

    /// The resource key of the object under `key` (`ns/name` or `name`).
    pub fn resource_key(self, key: &str) -> Option<ResourceKey> {
        let (namespace, name) = match self {
            MirrorKind::Policy => {
                let (ns, n) = split_key(key)?;
                (ns.to_string(), format!("{POLICY_PREFIX}{n}"))
            }
            MirrorKind::Namespace => (String::new(), format!("{NAMESPACE_PREFIX}{key}")),
            MirrorKind::ServiceAccount => {
                let (ns, n) = split_key(key)?;
                (
                    String::new(),
                    margay_kdd::pod::service_account_profile_name(ns, n),
                )
            }
        };
        Some(ResourceKey {
            kind: self.kind(),
            namespace,
            name,
        })
    }
}

/// A reconciler the loop drives.
trait Reconcile {
    fn name(&self) -> &'static str;
    async fn full(&self) -> Result<(), String>;
    async fn one(&self, key: &str) -> Result<(), String>;
}

/// Writes the actions; returns the first error (after trying every action).
async fn apply<B: KvBackend>(
    client: &Client<B>,
    actions: Vec<Action>,
    controller: &str,
    metrics: &Metrics,
) -> Result<(), String> {
    let mut first = None;
    for a in actions {
        let (op, res) = match a {
            Action::Create(r) => {
                let key = r.key();
                tracing::info!(controller, resource = %key, "creating");
                ("create", client.create(r).await.map(|_| ()))
            }
            Action::Update(r) => {
                let key = r.key();
                tracing::info!(controller, resource = %key, "updating");
                ("update", client.update(r).await.map(|_| ()))
            }
            Action::Delete {
                key,
                resource_version,
            } => {
                tracing::info!(controller, resource = %key, "deleting");
                let rv = (!resource_version.is_empty()).then_some(resource_version.as_str());
                match client.delete(&key, rv).await {
                    Err(DatastoreError::NotFound { .. }) => ("delete", Ok(())),
                    other => ("delete", other.map(|_| ())),
                }
            }
        };
        match res {
            Ok(()) => metrics.add_mirror_write(controller, op),
            Err(e) => {
                tracing::warn!(controller, "{op} failed (retried): {e}");
                first.get_or_insert(e.to_string());
            }
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Policies, namespaces, service accounts.
pub struct ResourceMirror<B> {
    pub kind: MirrorKind,
    pub informer: Arc<Informer<Converted>>,
    pub client: Client<B>,
    pub metrics: Arc<Metrics>,
}

impl<B: KvBackend> ResourceMirror<B> {
    fn desired_one(&self, key: &str) -> (BTreeMap<ResourceKey, Resource>, BTreeSet<ResourceKey>) {
        let mut desired = BTreeMap::new();
        let mut keep = BTreeSet::new();
        let (Some(rk), Some(conv)) = (
            self.kind.resource_key(key),
            self.informer.read().get(key).cloned(),
        ) else {
            return (desired, keep);
        };
        match conv {
            Ok(r) => {
                desired.insert(r.key(), r);
            }
            Err(e) => {
                tracing::warn!(
                    controller = self.kind.name(),
                    object = key,
                    "cannot convert (the stored copy, if any, is kept): {e}"
                );
                keep.insert(rk);
            }
        }
        (desired, keep)
    }
}

impl<B: KvBackend> Reconcile for ResourceMirror<B> {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    async fn full(&self) -> Result<(), String> {
        let (mut desired, mut keep) = (BTreeMap::new(), BTreeSet::new());
        for (k, conv) in self.informer.read().iter() {
            match conv {
                Ok(r) => {
                    desired.insert(r.key(), r.clone());
                }
                Err(e) => {
                    if let Some(rk) = self.kind.resource_key(k) {
                        tracing::warn!(controller = self.kind.name(), object = %k, "cannot convert (the stored copy, if any, is kept): {e}");
                        keep.insert(rk);
                    }
                }
            }
        }
        let listed = self
            .client
            .list(self.kind.kind(), None, self.kind.prefix())
            .await
            .map_err(|e| e.to_string())?;
        let current: BTreeMap<ResourceKey, Resource> =
            listed.items.into_iter().map(|r| (r.key(), r)).collect();
        let actions = plan(&desired, &current, &keep);
        apply(&self.client, actions, self.kind.name(), &self.metrics).await
    }

    async fn one(&self, key: &str) -> Result<(), String> {
        let Some(rk) = self.kind.resource_key(key) else {
            return Ok(());
        };
        let (desired, keep) = self.desired_one(key);
        let mut current = BTreeMap::new();
        match self.client.get(&rk).await {
            Ok(r) => {
                current.insert(rk, r);
            }
            Err(DatastoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.to_string()),
        }
        let actions = plan(&desired, &current, &keep);
        apply(&self.client, actions, self.kind.name(), &self.metrics).await
    }
}

/// Pods → WorkloadEndpoint labels and service account.
pub struct EndpointMirror<B> {
    pub pods: Arc<Informer<PodView>>,
    pub client: Client<B>,
    pub metrics: Arc<Metrics>,
}

impl<B: KvBackend> EndpointMirror<B> {
    async fn update_one(&self, key: ResourceKey, pod: &PodView) -> Result<(), String> {
        let wep = match self.client.get(&key).await {
            Ok(Resource::WorkloadEndpoint(w)) => w,
            // No endpoint yet: the CNI plugin writes it (with the labels of that moment).
            Ok(_) | Err(DatastoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        };
        match endpoint_update(&wep, pod) {
            None => Ok(()),
            Some(u) => {
                apply(
                    &self.client,
                    vec![Action::Update(Resource::WorkloadEndpoint(u))],
                    "workloadendpoint",
                    &self.metrics,
                )
                .await
            }
        }
    }
}

impl<B: KvBackend> Reconcile for EndpointMirror<B> {
    fn name(&self) -> &'static str {
        "workloadendpoint"
    }

    async fn full(&self) -> Result<(), String> {
        let listed = self
            .client
            .list(Kind::WorkloadEndpoint, None, "")
            .await
            .map_err(|e| e.to_string())?;
        let mut updates = Vec::new();
        {
            let pods = self.pods.read();
            for r in &listed.items {
                let Resource::WorkloadEndpoint(w) = r else {
                    continue;
                };
                if w.spec.orchestrator != "k8s" {
                    continue;
                }
                if let Some(p) = pods.get(&pod_key(&w.metadata.namespace, &w.spec.pod))
                    && let Some(u) = endpoint_update(w, p)
                {
                    updates.push(Action::Update(Resource::WorkloadEndpoint(u)));
                }
            }
        }
        apply(&self.client, updates, "workloadendpoint", &self.metrics).await
    }

    async fn one(&self, key: &str) -> Result<(), String> {
        let Some(pod) = self.pods.read().get(key).cloned() else {
            return Ok(());
        };
        let Some(ep) = &pod.endpoint else {
            return Ok(());
        };
        let wkey = ResourceKey {
            kind: Kind::WorkloadEndpoint,
            namespace: pod.namespace.clone(),
            name: ep.name.clone(),
        };
        self.update_one(wkey, &pod).await
    }
}

/// Drives a reconciler: a full pass when the informer has listed and every `period`, one
/// object per announced change, failed ones again with backoff, until `stop`.
async fn drive<R: Reconcile, T: Clone + PartialEq + Send + Sync + 'static>(
    r: R,
    informer: Arc<Informer<T>>,
    mut changes: mpsc::UnboundedReceiver<Change>,
    period: Duration,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    tokio::select! {
        _ = informer.wait_synced() => {}
        _ = stop.changed() => return,
    }
    tracing::info!(controller = r.name(), period = ?period, "mirror controller running");
    let mut next_full = Instant::now();
    let mut retry: BTreeSet<String> = BTreeSet::new();
    let mut retry_at: Option<Instant> = None;
    let mut full_failed = false;
    let mut attempts = 0u32;
    loop {
        let mut pending: BTreeSet<String> = BTreeSet::new();
        let deadline = retry_at.map_or(next_full, |t| t.min(next_full));
        tokio::select! {
            _ = stop.changed() => return,
            Some(c) = changes.recv() => { pending.insert(c.key().to_string()); }
            _ = tokio::time::sleep_until(deadline.into()) => {}
        }
        if *stop.borrow() {
            return;
        }
        while let Ok(c) = changes.try_recv() {
            pending.insert(c.key().to_string());
        }
        let now = Instant::now();
        let mut do_full = now >= next_full;
        if retry_at.is_some_and(|t| now >= t) {
            retry_at = None;
            pending.append(&mut retry);
            do_full |= full_failed;
        }
        let mut failed = false;
        if do_full {
            // The full pass covers every object.
            pending.clear();
            retry.clear();
            full_failed = false;
            // A zero period means no periodic pass (only the one at start and events).
            next_full = if period.is_zero() {
                now + Duration::from_secs(10 * 365 * 24 * 3600)
            } else {
                now + period
            };
            if let Err(e) = r.full().await {
                tracing::warn!(
                    controller = r.name(),
                    "reconciliation failed (retried): {e}"
                );
                metrics.add_error(r.name());
                full_failed = true;
                failed = true;
            }
        }
        for key in pending {
            if let Err(e) = r.one(&key).await {
                tracing::warn!(controller = r.name(), object = %key, "sync failed (retried): {e}");
                metrics.add_error(r.name());
                retry.insert(key);
                failed = true;
            }
        }
        if failed {
            attempts += 1;
            let wait = Duration::from_millis(250u64 << attempts.min(7));
            retry_at = Some(retry_at.map_or(now + wait, |t| t.min(now + wait)));
        } else if retry.is_empty() && !full_failed {
            attempts = 0;
        }
    }
}

/// Runs a policy, namespace or service account mirror until `stop`.
pub async fn run_resource_mirror<B: KvBackend>(
    m: ResourceMirror<B>,
    changes: mpsc::UnboundedReceiver<Change>,
    period: Duration,
    stop: watch::Receiver<bool>,
) {
    let informer = m.informer.clone();
    let metrics = m.metrics.clone();
    drive(m, informer, changes, period, metrics, stop).await
}

/// Runs the workload endpoint (pod) mirror until `stop`.
pub async fn run_endpoint_mirror<B: KvBackend>(
    m: EndpointMirror<B>,
    changes: mpsc::UnboundedReceiver<Change>,
    period: Duration,
    stop: watch::Receiver<bool>,
) {
    let informer = m.pods.clone();
    let metrics = m.metrics.clone();
    drive(m, informer, changes, period, metrics, stop).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn keys_of_mirrored_objects() {
        let k = MirrorKind::Policy.resource_key("shop/deny-all").unwrap();
        assert_eq!(
            (k.kind, k.namespace.as_str(), k.name.as_str()),
            (Kind::NetworkPolicy, "shop", "knp.default.deny-all")
        );
        let k = MirrorKind::Namespace.resource_key("shop").unwrap();
        assert_eq!((k.kind, k.name.as_str()), (Kind::Profile, "kns.shop"));
        let k = MirrorKind::ServiceAccount.resource_key("shop/api").unwrap();
        assert_eq!(k.name, "ksa.shop.api");
        assert!(MirrorKind::Policy.resource_key("nonamespace").is_none());
    }
}
