//! The validation filter (each resource's own validation plus Felix's checks; what fails
//! reaches the graph as a deletion) and the configuration watch (a change that cannot be
//! applied live stops Felix for a restart).

use std::sync::Arc;
use std::sync::mpsc as smpsc;

use margay_api::{Resource, ResourceKey};
use margay_datastore::{SyncStatus, SyncerEvent};
use margay_felix_config::{Config, WarnOnce, load};
use tokio::sync::mpsc;

use super::{CalcInput, Reason, Shared, lock};
use crate::inputs::{DatastoreInputs, LocalInputs};

// ---- validation filter and configuration watch ------------------------------------------------

pub(super) struct ConfigWatch {
    pub(super) local: LocalInputs,
    pub(super) inputs: DatastoreInputs,
    pub(super) hostname: String,
    pub(super) startup: Config,
    pub(super) current: Config,
    pub(super) in_sync: bool,
    pub(super) stopping: bool,
    pub(super) warn_once: WarnOnce,
}

impl ConfigWatch {
    /// Reloads configuration from the synced resources; a change that cannot be applied live
    /// stops Felix for a restart.
    fn recheck(&mut self, shared: &Shared) {
        if self.stopping {
            return;
        }
        let inputs = self.inputs.config_inputs(&self.local, &self.hostname);
        let new = match load(&inputs) {
            Ok(l) => l,
            Err(e) => {
                self.stopping = true;
                tracing::error!(error = %e, "Configuration from the datastore no longer loads");
                shared.stop_with(Reason::Fatal(format!(
                    "configuration update failed: {e} (fix the FelixConfiguration or Node resource)"
                )));
                return;
            }
        };
        for w in self.warn_once.fresh(&new.warnings) {
            tracing::warn!("{w}");
        }
        if new.datastore_ready != Some(true) {
            self.stopping = true;
            tracing::warn!(
                "Datastore became unready (ClusterInformation \"default\" no longer has \
                 datastoreReady: true), need to restart."
            );
            shared.stop_with(Reason::DatastoreNotReady);
            return;
        }
        let restart = self.startup.restart_required(&new.config);
        if !restart.is_empty() {
            self.stopping = true;
            for c in &restart {
                tracing::warn!(
                    param = c.name,
                    old = %c.old,
                    new = %c.new,
                    "Configuration value changed; change DOES require Felix to restart: {} changed from {:?} to {:?}",
                    c.name,
                    c.old,
                    c.new
                );
            }
            let summary: Vec<String> = restart
                .iter()
                .map(|c| format!("{} {:?} -> {:?}", c.name, c.old, c.new))
                .collect();
            shared.stop_with(Reason::ConfigChanged(summary.join(", ")));
            return;
        }
        for c in self.current.changed_params(&new.config) {
            tracing::info!(
                param = c.name,
                old = %c.old,
                new = %c.new,
                "Configuration value changed; change DOES NOT require Felix to restart"
            );
        }
        if self.current.health_timeout_overrides != new.config.health_timeout_overrides {
            shared
                .health
                .set_overrides(new.config.health_timeout_overrides.clone());
        }
        self.current = new.config.clone();
        *lock(&shared.config_json) = new.to_json();
    }
}

pub(super) fn validation_loop(
    mut rx: mpsc::Receiver<SyncerEvent>,
    calc_tx: smpsc::Sender<CalcInput>,
    shared: Arc<Shared>,
    mut watch: ConfigWatch,
) {
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            SyncerEvent::Status(s) => {
                if calc_tx.send(CalcInput::Status(s)).is_err() {
                    return;
                }
                if s == SyncStatus::InSync && !watch.in_sync {
                    tracing::info!("Datastore now in sync");
                    watch.in_sync = true;
                    watch.recheck(&shared);
                }
            }
            SyncerEvent::Updates(updates) => {
                let mut out = Vec::with_capacity(updates.len());
                let mut config_touched = false;
                for u in updates {
                    let key = u.key;
                    let value = match u.value {
                        Some(r) => match r
                            .validate()
                            .map_err(|e| e.to_string())
                            .and_then(|()| felix_checks(&r, &watch.startup))
                        {
                            Ok(()) => {
                                clear_invalid(&shared, &key);
                                Some(r)
                            }
                            Err(reason) => {
                                tracing::warn!(
                                    resource = %key,
                                    reason = %reason,
                                    "Resource failed validation; treating it as deleted"
                                );
                                shared.metrics.invalid_resources.add(key.kind.name(), 1);
                                lock(&shared.invalid).insert(key.to_string(), reason);
                                None
                            }
                        },
                        None => {
                            clear_invalid(&shared, &key);
                            None
                        }
                    };
                    config_touched |= watch.inputs.apply(&key, value.as_ref(), &watch.hostname);
                    out.push((key, value));
                }
                if calc_tx.send(CalcInput::Updates(out)).is_err() {
                    return;
                }
                if config_touched && watch.in_sync {
                    watch.recheck(&shared);
                }
            }
        }
    }
}

/// Felix's own checks on top of each resource's validation (Calico's validation filter): a
/// WorkloadEndpoint that asks to send from addresses other than its own is refused unless
/// WorkloadSourceSpoofing is `Any` (then it reaches the dataplane, which lets those sources
/// through and turns the interface's reverse-path filter off).
pub fn felix_checks(r: &Resource, config: &Config) -> Result<(), String> {
    if let Resource::WorkloadEndpoint(w) = r
        && !w.spec.allow_spoofed_source_prefixes.is_empty()
        && !config.workload_source_spoofing.eq_ignore_ascii_case("Any")
    {
        return Err(
            "spec.allowSpoofedSourcePrefixes: source address spoofing is requested but not \
             enabled in Felix's configuration (set WorkloadSourceSpoofing to Any)"
                .into(),
        );
    }
    Ok(())
}

fn clear_invalid(shared: &Shared, key: &ResourceKey) {
    let mut invalid = lock(&shared.invalid);
    if !invalid.is_empty() {
        invalid.remove(&key.to_string());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn spoofing_endpoints_need_workload_source_spoofing_any() {
        let wep = margay_api::decode_one(
            "apiVersion: projectcalico.org/v3\nkind: WorkloadEndpoint\nmetadata: {name: n-k8s-p-eth0, namespace: ns}\nspec: {orchestrator: k8s, node: n, pod: p, endpoint: eth0, interfaceName: calip, ipNetworks: [10.65.0.1/32], allowSpoofedSourcePrefixes: [10.99.0.0/24]}",
        )
        .unwrap();
        let mut c = Config::defaults().clone();
        let e = felix_checks(&wep, &c).unwrap_err();
        assert!(e.contains("WorkloadSourceSpoofing"), "{e}");
        c.workload_source_spoofing = "Any".into();
        assert_eq!(felix_checks(&wep, &c), Ok(()));
        let pool = margay_api::decode_one(
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p}\nspec: {cidr: 10.0.0.0/16}",
        )
        .unwrap();
        assert_eq!(felix_checks(&pool, &Config::defaults().clone()), Ok(()));
    }
}
