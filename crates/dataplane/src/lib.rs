//! The dataplane driver interface: the calculation graph's messages in, status out.
//!
//! Felix hands a driver one batch per calculation-graph flush. A batch is already in
//! dependency order (IP sets before the policies that use them, and so on); the driver applies
//! it as a unit and reports what it can about the result. `InSync` inside a batch means the
//! batch completes the datastore's state: the driver may then remove what it owns and nobody
//! asked for.
//!
//! The Linux dataplane (nftables, routes, VXLAN) implements this trait in its own module; the
//! [`RecordingDriver`] keeps the state the messages describe, for tests and for running Felix
//! as a pure control plane.
#![forbid(unsafe_code)]

pub mod bpf_driver;
pub mod bpf_host_nft;
pub mod conntrack;
pub mod exec;
pub mod linux;
pub mod linux_driver;
pub mod nft;
pub mod nft_driver;
pub mod status_files;

use std::sync::{Arc, Mutex, MutexGuard};

use margay_calc::{ContractError, DataplaneModel, Message, WorkloadEndpointId};
use serde::Serialize;

/// What a driver reports back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum StatusUpdate {
    /// Everything up to and including the batch with `InSync` has been applied.
    DataplaneInSync,
    WorkloadEndpoint {
        id: WorkloadEndpointId,
        status: EndpointStatus,
    },
    WorkloadEndpointRemoved {
        id: WorkloadEndpointId,
    },
    HostEndpoint {
        id: String,
        status: EndpointStatus,
    },
    HostEndpointRemoved {
        id: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EndpointStatus {
    Up,
    Down,
    Error,
}

#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// A message arrived out of dependency order: a bug upstream, never retried.
    #[error("dataplane contract broken: {0}")]
    Contract(#[from] ContractError),
    /// The kernel refused a change; the driver retries on the next batch or resync.
    #[error("applying {what} failed: {reason}")]
    Apply { what: String, reason: String },
}

/// Applies calculation-graph output to a dataplane.
pub trait DataplaneDriver: Send {
    /// A short name for logs and the status API (`linux`, `recording`).
    fn name(&self) -> &'static str;

    /// Applies one batch. Returns the status changes it caused.
    fn apply(&mut self, batch: &[Message]) -> Result<Vec<StatusUpdate>, DataplaneError>;

    /// Periodic work between batches: retrying a failed write, refreshing against drift.
    /// Felix calls it about once a second.
    fn housekeeping(&mut self) -> Result<Vec<StatusUpdate>, DataplaneError> {
        Ok(Vec::new())
    }
}

/// Everything a [`RecordingDriver`] saw, shared with whoever holds a [`Recording`].
#[derive(Debug, Default)]
pub struct RecordingState {
    pub model: DataplaneModel,
    pub batches: Vec<Vec<Message>>,
    /// Keep every batch (tests) or only the model (a long-running Felix).
    pub keep_batches: bool,
    pub messages_applied: u64,
}

/// A handle on a recording driver's state.
#[derive(Debug, Clone, Default)]
pub struct Recording(Arc<Mutex<RecordingState>>);

impl Recording {
    pub fn lock(&self) -> MutexGuard<'_, RecordingState> {
        // A panic while holding the lock leaves a consistent-enough model for diagnostics.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Applies messages to a [`DataplaneModel`], checking the ordering contract, and reports
/// every workload and host endpoint as up.
#[derive(Debug, Default)]
pub struct RecordingDriver {
    state: Recording,
}

impl RecordingDriver {
    pub fn new(keep_batches: bool) -> (RecordingDriver, Recording) {
        let state = Recording::default();
        state.lock().keep_batches = keep_batches;
        (
            RecordingDriver {
                state: state.clone(),
            },
            state,
        )
    }
}

impl DataplaneDriver for RecordingDriver {
    fn name(&self) -> &'static str {
        "recording"
    }

    fn apply(&mut self, batch: &[Message]) -> Result<Vec<StatusUpdate>, DataplaneError> {
        let mut st = self.state.lock();
        let mut status = Vec::new();
        let mut in_sync = false;
        for m in batch {
            st.model.apply(m)?;
            st.messages_applied += 1;
            match m {
                Message::WorkloadEndpointUpdate { id, .. } => {
                    status.push(StatusUpdate::WorkloadEndpoint {
                        id: id.clone(),
                        status: EndpointStatus::Up,
                    })
                }
                Message::WorkloadEndpointRemove { id } => {
                    status.push(StatusUpdate::WorkloadEndpointRemoved { id: id.clone() })
                }
                Message::HostEndpointUpdate { id, .. } => status.push(StatusUpdate::HostEndpoint {
                    id: id.clone(),
                    status: EndpointStatus::Up,
                }),
                Message::HostEndpointRemove { id } => {
                    status.push(StatusUpdate::HostEndpointRemoved { id: id.clone() })
                }
                Message::InSync => in_sync = true,
                _ => {}
            }
        }
        if st.keep_batches {
            st.batches.push(batch.to_vec());
        }
        if in_sync {
            status.push(StatusUpdate::DataplaneInSync);
        }
        Ok(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recording_driver_checks_order_and_reports_in_sync() {
        let (mut d, rec) = RecordingDriver::new(true);
        let st = d.apply(&[Message::InSync]).expect("apply");
        assert_eq!(st, vec![StatusUpdate::DataplaneInSync]);
        assert!(rec.lock().model.in_sync);
        // Removing a set the dataplane never had breaks the contract.
        let err = d
            .apply(&[Message::IpSetRemove { id: "s:x".into() }])
            .expect_err("contract");
        assert!(matches!(err, DataplaneError::Contract(_)));
        assert_eq!(rec.lock().batches.len(), 1);
    }
}
