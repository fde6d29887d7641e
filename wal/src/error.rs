//! The log's one error type.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// What went wrong in the log.
///
/// `Clone`, so that a poisoned log can hand every later caller the very error that
/// poisoned it; the `io::Error` inside is shared through an `Arc` for that.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum WalError {
    /// A storage operation failed. If it was a write or a sync of the log, the log is
    /// poisoned: this error is returned by every later call, and nothing is retried.
    Io {
        /// The file or directory the operation was on.
        path: PathBuf,
        /// The operation: `"write"`, `"fdatasync"`, `"create"`, `"read"`, ….
        op: &'static str,
        /// What the operating system (or the fake disk) said.
        source: Arc<io::Error>,
    },
    /// The disk is full: a new segment, or a snapshot, could not be allocated. The append
    /// that needed it failed whole (nothing of it was written), or the snapshot was left
    /// out, and the log is not poisoned; it may succeed once space is freed, e.g. by
    /// [`Wal::remove_before`](crate::Wal::remove_before).
    NoSpace {
        /// The segment or snapshot file that could not be allocated.
        path: PathBuf,
    },
    /// A damaged record, an LSN gap or a damaged snapshot anywhere but the torn tail of the
    /// log: recovery refuses to go on.
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// The byte offset in that file where the damage starts.
        offset: u64,
        /// What is wrong there.
        detail: String,
    },
    /// Another opener holds the directory's lock.
    Locked {
        /// The locked directory.
        path: PathBuf,
    },
    /// A record larger than [`Options::max_record_bytes`](crate::Options::max_record_bytes).
    TooLarge {
        /// The payload's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// [`Options`](crate::Options) that cannot work, with the reason.
    InvalidOptions(String),
    /// The disk is not keeping up: more than
    /// [`Options::max_unsynced_bytes`](crate::Options::max_unsynced_bytes) were appended
    /// and are not durable yet, or an fsync has run for longer than
    /// [`Options::stall_after`](crate::Options::stall_after).
    /// [`Wal::reserve`](crate::Wal::reserve) refused the change whole; the log is not
    /// poisoned, and goes on once the disk catches up.
    Behind {
        /// Bytes appended and not durable.
        unsynced: u64,
        /// How long the fsync in flight has run, if one has run past `stall_after`.
        stalled: Option<std::time::Duration>,
    },
}

impl WalError {
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: io::Error) -> WalError {
        WalError::Io {
            path: path.into(),
            op,
            source: Arc::new(source),
        }
    }

    pub(crate) fn corrupt(
        path: impl Into<PathBuf>,
        offset: u64,
        detail: impl Into<String>,
    ) -> WalError {
        WalError::Corrupt {
            path: path.into(),
            offset,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for WalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WalError::Io { path, op, source } => {
                write!(f, "{op} failed on {}: {source}", path.display())
            }
            WalError::NoSpace { path } => {
                write!(f, "no space left to allocate {}", path.display())
            }
            WalError::Corrupt {
                path,
                offset,
                detail,
            } => write!(f, "damaged {} at byte {offset}: {detail}", path.display()),
            WalError::Locked { path } => {
                write!(f, "{} is locked by another opener", path.display())
            }
            WalError::TooLarge { len, max } => {
                write!(f, "record of {len} bytes exceeds the limit of {max}")
            }
            WalError::InvalidOptions(why) => write!(f, "invalid log options: {why}"),
            WalError::Behind {
                unsynced,
                stalled: Some(stalled),
            } => write!(
                f,
                "the disk is not keeping up: an fsync has not returned for {stalled:?}, \
                 with {unsynced} bytes waiting for it"
            ),
            WalError::Behind { unsynced, .. } => write!(
                f,
                "the disk is not keeping up: {unsynced} bytes were written and wait for fsync"
            ),
        }
    }
}

impl std::error::Error for WalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WalError::Io { source, .. } => Some(&**source),
            _ => None,
        }
    }
}
