//! The Linux dataplane driver: nftables policy (and, as they land, routes and VXLAN) kept
//! equal to the calculation graph's messages.
//!
//! Each batch goes into the model first (no kernel access, contract checked); the kernel is
//! written once per batch, and only after `InSync`. A failed write is retried by
//! [`DataplaneDriver::housekeeping`], which also runs the periodic drift refresh.

use std::time::Instant;

use margay_calc::Message;

use crate::nft_driver::{NftDriver, NftDriverConfig, NftStatsHandle};
use crate::{DataplaneDriver, DataplaneError, Recording, StatusUpdate};

#[derive(Debug, Clone)]
pub struct LinuxDriverConfig {
    pub nft: NftDriverConfig,
}

pub struct LinuxDriver {
    state: Recording,
    nft: NftDriver,
    /// `InSync` arrived but the kernel write it needs has not succeeded yet.
    in_sync_pending: bool,
    in_sync_reported: bool,
}

impl LinuxDriver {
    pub fn new(cfg: LinuxDriverConfig) -> (LinuxDriver, Recording, NftStatsHandle) {
        let state = Recording::default();
        let (nft, stats) = NftDriver::new(cfg.nft);
        (
            LinuxDriver {
                state: state.clone(),
                nft,
                in_sync_pending: false,
                in_sync_reported: false,
            },
            state,
            stats,
        )
    }

    fn write(&mut self) -> Result<Vec<StatusUpdate>, DataplaneError> {
        let st = self.state.lock();
        self.nft.sync(&st.model)?;
        drop(st);
        let mut out = Vec::new();
        if self.in_sync_pending {
            self.in_sync_pending = false;
            if !self.in_sync_reported {
                self.in_sync_reported = true;
                out.push(StatusUpdate::DataplaneInSync);
            }
        }
        Ok(out)
    }
}

impl DataplaneDriver for LinuxDriver {
    fn name(&self) -> &'static str {
        "linux"
    }

    fn apply(&mut self, batch: &[Message]) -> Result<Vec<StatusUpdate>, DataplaneError> {
        {
            let mut st = self.state.lock();
            st.model.apply_all(batch)?;
            st.messages_applied += batch.len() as u64;
        }
        if batch.contains(&Message::InSync) {
            self.in_sync_pending = true;
        }
        if !batch.is_empty() {
            self.nft.mark_dirty();
        }
        let mut status = self.write()?;
        status.extend(self.nft.endpoint_statuses(batch));
        Ok(status)
    }

    fn housekeeping(&mut self) -> Result<Vec<StatusUpdate>, DataplaneError> {
        let mut out = Vec::new();
        if self.nft.is_dirty() {
            out.extend(self.write()?);
        }
        let st = self.state.lock();
        self.nft.refresh_if_due(&st.model, Instant::now())?;
        Ok(out)
    }
}
