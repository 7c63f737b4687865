//! Messages in calicoctl's style, and the progress bar for long batches.

use std::io::Write;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use margay_api::ResourceKey;
use margay_datastore::DatastoreError;

use crate::kinds::ident;

/// Batches longer than this show a progress bar (on a terminal's stderr only).
pub(crate) const PROGRESS_THRESHOLD: usize = 50;

/// Why an operation on one resource failed, worded like calicoctl (libcalico-go's errors)
/// and naming the resource.
pub(crate) fn reason(e: &DatastoreError, key: &ResourceKey) -> String {
    let id = ident(key);
    match e {
        DatastoreError::NotFound { .. } => format!("resource does not exist: {id}"),
        DatastoreError::AlreadyExists { .. } => format!("resource already exists: {id}"),
        DatastoreError::Conflict {
            expected, current, ..
        } => {
            let now = current.map_or_else(
                || "it has been deleted".to_string(),
                |c| format!("the latest is {c}"),
            );
            format!(
                "update conflict: {id}: resource was modified (resourceVersion {expected} is out of date, {now}), re-read it and retry"
            )
        }
        DatastoreError::Validation { errors, .. } => format!("{id} is invalid: {errors}"),
        DatastoreError::Invalid { reason } => reason.clone(),
        DatastoreError::Unavailable { reason } => format!("datastore unavailable: {reason}"),
        DatastoreError::Compacted { .. } => format!("{id}: {e}"),
    }
}

/// The message for a resourceVersion in the input that is not the stored one.
pub(crate) fn stale(key: &ResourceKey, given: &str, latest: &str) -> String {
    format!(
        "update conflict: {}: resource was modified (resourceVersion {given} is out of date, the latest is {latest}), re-read it and retry",
        ident(key)
    )
}

/// A progress bar over `total` resources, drawn only when allowed (stderr is a terminal) and
/// the batch is long; lines written through it do not tear the bar.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    pub fn new(total: usize, enabled: bool, verb: &str) -> Progress {
        let bar = (enabled && total > PROGRESS_THRESHOLD).then(|| {
            let bar =
                ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({eta})")
                .map(|s| s.progress_chars("=> "))
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_message(verb.to_string());
            bar
        });
        Progress { bar }
    }

    pub fn inc(&self) {
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }

    /// Writes a line to `err` without tearing the bar.
    pub fn line(&self, err: &mut dyn Write, line: &str) -> std::io::Result<()> {
        match &self.bar {
            Some(b) => b.suspend(|| writeln!(err, "{line}")),
            None => writeln!(err, "{line}"),
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
