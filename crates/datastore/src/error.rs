//! Datastore errors. Every variant names the key (or the endpoint) involved.

use margay_api::ValidationErrors;

pub type Result<T> = std::result::Result<T, DatastoreError>;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DatastoreError {
    /// The key does not exist.
    #[error("{key} not found")]
    NotFound { key: String },
    /// A create found the key already there.
    #[error("{key} already exists")]
    AlreadyExists { key: String },
    /// A compare-and-swap lost: the key changed since the given revision.
    #[error("{key} was modified concurrently (expected revision {expected}, it is now {}): re-read it and try again", current.map_or_else(|| "deleted".to_string(), |c| c.to_string()))]
    Conflict {
        key: String,
        expected: i64,
        /// The key's current revision, or None if it was deleted meanwhile.
        current: Option<i64>,
    },
    /// A watch or read asked for history the store has already discarded.
    #[error(
        "revision {requested} has been compacted (the oldest revision kept is {compacted}): re-list and watch again"
    )]
    Compacted { requested: i64, compacted: i64 },
    /// The store cannot be reached or did not answer in time.
    #[error("datastore unavailable: {reason}")]
    Unavailable { reason: String },
    /// The request or the stored data is not acceptable.
    #[error("invalid: {reason}")]
    Invalid { reason: String },
    /// A resource failed validation; nothing was written.
    #[error("{key} is invalid: {errors}")]
    Validation {
        key: String,
        errors: ValidationErrors,
    },
}

impl DatastoreError {
    pub fn unavailable(reason: impl std::fmt::Display) -> Self {
        DatastoreError::Unavailable {
            reason: reason.to_string(),
        }
    }

    pub fn invalid(reason: impl std::fmt::Display) -> Self {
        DatastoreError::Invalid {
            reason: reason.to_string(),
        }
    }

    /// Worth retrying after a pause (the store may come back).
    pub fn is_transient(&self) -> bool {
        matches!(self, DatastoreError::Unavailable { .. })
    }
}
