//! Errors of the vhost-user front end.

use std::path::PathBuf;
use std::time::Duration;

/// Errors of the vhost-user front end.
#[derive(Debug, thiserror::Error)]
pub enum VhostUserError {
    /// The socket could not be connected.
    #[error("Cannot connect to vhost-user socket {path}")]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A vhost-user request failed or the back end refused it.
    #[error("vhost-user {request} failed")]
    Request {
        /// Request name.
        request: &'static str,
        /// Cause.
        #[source]
        source: vhost::Error,
    },
    /// The back end did not answer a request in time; the connection was
    /// shut down.
    #[error("No answer from the vhost-user back end at {path} to {request} within {after:?} (the reply timeout)")]
    Timeout {
        /// The request left unanswered.
        request: &'static str,
        /// Socket path.
        path: PathBuf,
        /// The reply timeout.
        after: Duration,
    },
    /// Socket or eventfd I/O failed.
    #[error("{op} failed")]
    Io {
        /// What was being done.
        op: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The back end lacks something the driver needs.
    #[error("Back end does not support {what}")]
    Unsupported {
        /// The missing feature.
        what: &'static str,
    },
    /// The back end answered with a malformed or negative reply.
    #[error("Bad reply from the back end to {request}: {why}")]
    BadReply {
        /// Request name.
        request: &'static str,
        /// What was wrong.
        why: &'static str,
    },
    /// A device address lies in no shared region.
    #[error("Device address {addr:#x}+{len:#x} is not inside any shared region")]
    NotShared {
        /// Device address.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// Shared regions overlap in device address space or are empty.
    #[error("Shared region at {addr:#x}+{len:#x} overlaps another or is empty")]
    BadRegion {
        /// Device address.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// More regions than the back end accepts.
    #[error("Too many shared regions: {count} (back end accepts {max})")]
    TooManyRegions {
        /// Regions requested.
        count: usize,
        /// Back end's limit.
        max: usize,
    },
    /// A queue index past the back end's queue count.
    #[error("Queue {index} out of range (back end has {count})")]
    BadQueue {
        /// Index asked for.
        index: u16,
        /// Queues the back end has.
        count: u16,
    },
    /// A queue was used before it was set up and the device started.
    #[error("Queue {index} is not running (set it up, then DRIVER_OK)")]
    QueueNotReady {
        /// Queue index.
        index: u16,
    },
}

/// Result of the vhost-user front end.
pub type Result<T, E = VhostUserError> = std::result::Result<T, E>;

/// A vhost-user failure is the transport's: the crate-wide error carries
/// it without naming it.
impl From<VhostUserError> for crate::Error {
    fn from(e: VhostUserError) -> Self {
        crate::Error::Transport(Box::new(e))
    }
}
