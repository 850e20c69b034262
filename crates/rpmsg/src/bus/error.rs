//! Why a bus operation failed.

use thiserror::Error;

use crate::link::LinkError;
use crate::notify::NotifyError;
use crate::wire::WireError;

/// Why a bus operation failed.
#[derive(Debug, Error)]
pub enum BusError {
    /// The link is down (reason given).
    #[error("Link down: {0}")]
    LinkDown(String),
    /// No buffer free and the caller asked not to wait.
    #[error("No free buffer")]
    WouldBlock,
    /// No buffer became free in time, or nothing arrived in time.
    #[error("Timed out")]
    Timeout,
    /// The payload does not fit a buffer.
    #[error("Payload of {len} bytes is larger than {max}")]
    TooLarge {
        /// Payload length.
        len: usize,
        /// Largest payload.
        max: usize,
    },
    /// The endpoint has no destination yet.
    #[error("Endpoint {addr} is not bound to a remote address")]
    NotBound {
        /// The endpoint.
        addr: u32,
    },
    /// The source address is taken.
    #[error("Address {addr} is in use")]
    AddrInUse {
        /// The address.
        addr: u32,
    },
    /// A bad name.
    #[error("Bad endpoint name")]
    Name(#[from] WireError),
    /// The remote service this endpoint was bound to is gone.
    #[error("Remote service gone")]
    Unbound,
    /// The endpoint delivers to a callback, not a queue.
    #[error("Endpoint delivers to a callback")]
    CallbackEndpoint,
    /// Starting the link failed.
    #[error("Link setup failed")]
    Link(#[from] LinkError),
    /// The notifier failed while starting.
    #[error("Notification failed")]
    Notify(#[from] NotifyError),
}
