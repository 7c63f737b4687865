//! `margay node network-condition`: the Kubernetes Node's `NetworkUnavailable` condition, kept
//! as calico-node keeps it.
//!
//! calico-node clears the condition once Felix (and BIRD) are ready or a timeout passed
//! (`-complete-startup`, which then sleeps), and sets it again from its container's preStop
//! hook (`-shutdown`). margay's start-up is a one-shot init container that ends before Felix
//! starts, so this is a small process of its own beside Felix (a container of the DaemonSet's
//! pod): it waits for readiness with `margay node health`'s checks, clears the condition,
//! stays up, and on SIGTERM (the pod going away) sets it and exits. What it waits for and
//! whether it writes at all are decided from calico-node's variables ([`plan`], pure).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::config::NetworkingBackend;
use crate::health::{HealthChecks, HealthOptions, check};
use crate::kubernetes::{KubeCluster, KubeError};

/// calico-node's patience for Felix and BIRD before it clears the condition anyway.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(300);
/// How long setting the condition on shutdown is retried (the kubelet's grace period usually
/// ends it sooner).
pub const SHUTDOWN_RETRY: Duration = Duration::from_secs(30);
/// Between readiness checks.
const POLL: Duration = Duration::from_secs(1);

/// What the process does (pure decision from the environment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Write nothing; only wait for SIGTERM (a sidecar that exited would be restarted).
    Idle(String),
    /// Wait for these checks, then clear the condition; set it on SIGTERM.
    Manage(HealthChecks),
}

impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Plan::Idle(why) => write!(f, "write nothing: {why}"),
            Plan::Manage(c) => {
                let waits: Vec<&str> = [
                    (c.felix_ready, "Felix"),
                    (c.bird_ready, "BIRD"),
                    (c.bird6_ready, "BIRD6"),
                ]
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, what)| *what)
                .collect();
                match waits.len() {
                    0 => write!(
                        f,
                        "clear it at once (nothing to wait for), set it on SIGTERM"
                    ),
                    1 => write!(f, "clear it once {} is ready, set it on SIGTERM", waits[0]),
                    _ => write!(
                        f,
                        "clear it once {} are ready, set it on SIGTERM",
                        waits.join(" and ")
                    ),
                }
            }
        }
    }
}

/// calico-node's rules: nothing when Calico does not do the networking
/// (CALICO_NETWORKING_BACKEND=none) or there is no Kubernetes API; otherwise wait for Felix
/// when its health endpoint is enabled (FELIX_HEALTHENABLED=true) and for BIRD with the bird
/// backend. calico-node always runs BIRD6 beside BIRD; margay runs it only for IPv6 (IP6 set),
/// so BIRD6 is waited for only then.
pub fn plan(
    backend: NetworkingBackend,
    kubernetes_api: bool,
    get: &dyn Fn(&str) -> Option<String>,
) -> Plan {
    if backend == NetworkingBackend::None {
        return Plan::Idle(
            "CALICO_NETWORKING_BACKEND=none: Calico does not do this node's networking, so the NetworkUnavailable condition is left alone".into(),
        );
    }
    if !kubernetes_api {
        return Plan::Idle(
            "no Kubernetes API is configured (neither the Kubernetes datastore nor etcd with KUBECONFIG or in a pod): there is no Node condition to set".into(),
        );
    }
    let felix = get("FELIX_HEALTHENABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let bird = backend == NetworkingBackend::Bird;
    let ip6 = get("IP6").is_some_and(|v| {
        let v = v.trim();
        !v.is_empty() && !v.eq_ignore_ascii_case("none")
    });
    Plan::Manage(HealthChecks {
        felix_ready: felix,
        bird_ready: bird,
        bird6_ready: bird && ip6,
        ..HealthChecks::default()
    })
}

/// An environment lookup the blocking health checks can take along.
pub type Env = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Everything the process needs.
pub struct ConditionOptions {
    /// The Kubernetes Node to write (CALICO_K8S_NODE_REF, else the node name).
    pub k8s_node: String,
    pub plan: Plan,
    pub health: HealthOptions,
    pub ready_timeout: Duration,
    pub clear_retry: Duration,
    pub shutdown_retry: Duration,
    /// Variables the health checks read (FELIX_HEALTHHOST/PORT, the datastore's).
    pub env: Env,
}

/// Runs until `stop` completes: waits for readiness, clears the condition, waits for `stop`,
/// sets the condition. `stop` may complete at any point: the condition is then set at once.
pub async fn run(
    opts: ConditionOptions,
    api: Option<KubeCluster>,
    stop: impl Future<Output = ()>,
) -> Result<(), KubeError> {
    let (checks, api) = match (&opts.plan, api) {
        (Plan::Manage(c), Some(api)) => (*c, api),
        (Plan::Idle(why), _) => {
            tracing::info!("{why}; waiting for SIGTERM");
            stop.await;
            return Ok(());
        }
        (Plan::Manage(_), None) => {
            tracing::info!("no Kubernetes API; waiting for SIGTERM");
            stop.await;
            return Ok(());
        }
    };
    tokio::pin!(stop);
    let up = async {
        wait_until_ready(checks, &opts).await;
        api.set_network_unavailable(&opts.k8s_node, false, opts.clear_retry)
            .await
    };
    tokio::select! {
        () = &mut stop => {}
        r = up => {
            // Clearing failed for the whole retry period: fail, so the kubelet restarts this
            // container and it tries again.
            r?;
            tracing::info!(node = %opts.k8s_node, "networking is up: NetworkUnavailable is False (CalicoIsUp); waiting for SIGTERM");
            stop.await;
        }
    }
    tracing::info!(node = %opts.k8s_node, "shutting down: setting NetworkUnavailable to True (CalicoIsDown)");
    api.set_network_unavailable(&opts.k8s_node, true, opts.shutdown_retry)
        .await
}

/// Polls the health checks until they pass or the timeout passes (then carries on, as calico-node
/// does: a node whose BGP peers are all down still gets pods).
async fn wait_until_ready(checks: HealthChecks, opts: &ConditionOptions) {
    if !(checks.felix_ready || checks.bird_ready || checks.bird6_ready) {
        return;
    }
    // A timeout too long to represent means waiting for ever.
    let deadline = tokio::time::Instant::now().checked_add(opts.ready_timeout);
    let mut last = String::new();
    loop {
        let env = opts.env.clone();
        let health = opts.health.clone();
        // The checks block (TCP, unix sockets) for up to their own timeouts.
        let result =
            tokio::task::spawn_blocking(move || check(checks, &health, &|k: &str| env(k))).await;
        match result {
            Ok(Ok(summary)) => {
                tracing::info!(%summary, "this node's networking is ready");
                return;
            }
            Ok(Err(reason)) => {
                if reason != last {
                    tracing::info!(%reason, "waiting for this node's networking to be ready");
                    last = reason;
                }
            }
            Err(e) => tracing::warn!(error = %e, "the readiness check failed to run"),
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() + POLL >= d) {
            tracing::warn!(
                timeout = ?opts.ready_timeout,
                last = %last,
                "networking is not ready in time; clearing NetworkUnavailable anyway (as calico-node does)"
            );
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn what_is_waited_for() {
        use NetworkingBackend::{Bird, Vxlan};
        let manage = |b, vars| match plan(b, true, &env(vars)) {
            Plan::Manage(c) => (c.felix_ready, c.bird_ready, c.bird6_ready),
            Plan::Idle(why) => panic!("idle: {why}"),
        };
        assert_eq!(manage(Vxlan, &[]), (false, false, false));
        assert_eq!(
            manage(Vxlan, &[("FELIX_HEALTHENABLED", "true")]),
            (true, false, false)
        );
        assert_eq!(
            manage(Vxlan, &[("FELIX_HEALTHENABLED", "false")]),
            (false, false, false)
        );
        assert_eq!(
            manage(Bird, &[("FELIX_HEALTHENABLED", "True")]),
            (true, true, false)
        );
        assert_eq!(manage(Bird, &[("IP6", "autodetect")]), (false, true, true));
        assert_eq!(manage(Bird, &[("IP6", "none")]), (false, true, false));
        assert_eq!(
            manage(Vxlan, &[("IP6", "fd00::5/64")]),
            (false, false, false)
        );
        assert!(
            matches!(plan(NetworkingBackend::None, true, &env(&[])), Plan::Idle(w) if w.contains("CALICO_NETWORKING_BACKEND=none"))
        );
        assert!(
            matches!(plan(Vxlan, false, &env(&[])), Plan::Idle(w) if w.contains("no Kubernetes API"))
        );
    }
}
