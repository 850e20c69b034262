//! What the bus needs from a role: take the next message the peer sent,
//! send one, and the notification bookkeeping. [`crate::HostLink`] (virtio
//! driver) and [`crate::RemoteLink`] (virtio device) implement it.

use std::fmt;

use thiserror::Error;

use crate::shm::ShmError;

/// Why a link stopped working.
#[derive(Debug, Error)]
pub enum LinkError {
    /// A shared-memory access failed (outside the region).
    #[error("Shared memory access failed")]
    Shm(#[from] ShmError),
    /// The peer broke the ring protocol; the link is unusable.
    #[error("Ring broken: {0}")]
    Broken(String),
    /// The driver reset the device (status lost DRIVER_OK, or NEEDS_RESET).
    #[error("Device reset (status {status:#x})")]
    Reset {
        /// The status byte seen.
        status: u8,
    },
    /// The host never set DRIVER_OK in time.
    #[error("Host did not set DRIVER_OK within {secs} s")]
    NotReady {
        /// Seconds waited.
        secs: u64,
    },
    /// The notifier failed (peer gone included).
    #[error("Notification failed")]
    Notify(#[from] crate::notify::NotifyError),
    /// rust-vmm's queue refused the configuration.
    #[error("Queue setup failed: {0}")]
    Queue(String),
}

/// The outcome of one receive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rx {
    /// A message was copied out; its buffer went back to the peer.
    Message,
    /// The peer's buffer was unusable (reason given); it went back to the
    /// peer and nothing was delivered.
    Refused(String),
}

/// Which side of the link this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Virtio driver: owns the buffers.
    Host,
    /// Virtio device.
    Remote,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Host => "host",
            Role::Remote => "remote",
        })
    }
}

/// One side of an rpmsg link over two vrings.
pub trait Link: Send + fmt::Debug {
    /// Host or remote.
    fn role(&self) -> Role;

    /// Copies the next message from the peer into `out` (header included)
    /// and gives the buffer back. `Ok(None)` when nothing is pending.
    ///
    /// # Errors
    /// [`LinkError`] when the ring itself is broken.
    fn recv(&mut self, out: &mut Vec<u8>) -> Result<Option<Rx>, LinkError>;

    /// Sends one encoded message (header included). `Ok(false)` when no
    /// buffer is free right now.
    ///
    /// # Errors
    /// [`LinkError`] when the ring is broken.
    fn send(&mut self, msg: &[u8]) -> Result<bool, LinkError>;

    /// Bytes one message may take, header included.
    fn buf_size(&self) -> usize;

    /// Whether the peer must be notified for the work done since the last
    /// call (honours `EVENT_IDX` and `NO_NOTIFY`).
    fn take_kick(&mut self) -> bool;

    /// Asks the peer for notifications before sleeping; returns whether
    /// work arrived in the meantime (then do not sleep).
    ///
    /// # Errors
    /// [`LinkError`] when the ring is broken.
    fn arm(&mut self) -> Result<bool, LinkError>;

    /// Checks that the link is still up (the status byte).
    ///
    /// # Errors
    /// [`LinkError::Reset`].
    fn check(&mut self) -> Result<(), LinkError>;

    /// The negotiated feature word.
    fn features(&self) -> u32;

    /// Sent buffers the peer has not given back yet.
    ///
    /// # Errors
    /// [`LinkError`] when the ring is broken.
    fn tx_in_flight(&mut self) -> Result<usize, LinkError> {
        Ok(0)
    }

    /// Called once when the bus stops (the host resets the status byte).
    fn shutdown(&mut self) {}
}
