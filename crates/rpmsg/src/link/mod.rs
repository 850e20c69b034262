//! What the bus needs from a role: take the next message the peer sent,
//! send one, and the notification bookkeeping. [`HostLink`] (virtio
//! driver) and [`RemoteLink`] (virtio device) implement it over a
//! shared-memory file, [`crate::vhost_user::VhostUserLink`] (virtio device)
//! over a vhost-user front end's memory.

mod host;
pub(crate) mod mismatch;
pub(crate) mod remote;

pub use host::{HostLink, HostOptions, HOST_FEATURES};
pub use remote::RemoteLink;

use std::fmt;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use thiserror::Error;

use crate::role::Role;
use crate::shm::{SharedMem, ShmError};

/// The memory a link's buffers live in, addressed as the peer's
/// descriptors address it: offsets into a shared-memory file, or a
/// vhost-user front end's guest addresses. Every access is checked; an
/// address outside what the peer shared is an error, never a stray access.
pub trait LinkMemory: Send + Sync + fmt::Debug {
    /// Copies `dst.len()` bytes at `addr` out.
    ///
    /// # Errors
    /// [`ShmError::Outside`] when the range is not in the shared memory.
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), ShmError>;

    /// Copies `src` in at `addr`.
    ///
    /// # Errors
    /// [`ShmError::Outside`] when the range is not in the shared memory.
    fn write(&self, addr: u64, src: &[u8]) -> Result<(), ShmError>;

    /// Receives up to `ranges.len()` messages from the socket `fd` without
    /// waiting, message `i` straight into `ranges[i]` (`(address, length)`),
    /// its whole length in `full[i]`; how many. `None` when this memory
    /// cannot be received into (the caller receives and copies).
    fn recv_from(
        &self,
        fd: BorrowedFd<'_>,
        ranges: &[(u64, usize)],
        full: &mut [usize],
    ) -> Option<rustix::io::Result<usize>> {
        let _ = (fd, ranges, full);
        None
    }
}

impl LinkMemory for SharedMem {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), ShmError> {
        SharedMem::read(self, addr, dst)
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<(), ShmError> {
        SharedMem::write(self, addr, src)
    }

    fn recv_from(
        &self,
        fd: BorrowedFd<'_>,
        ranges: &[(u64, usize)],
        full: &mut [usize],
    ) -> Option<rustix::io::Result<usize>> {
        Some(crate::shm::sock_rx::recv_into(self, fd, ranges, full))
    }
}

/// Why a link stopped working.
#[derive(Debug, Error)]
pub enum LinkError {
    /// A shared-memory access failed (outside the region).
    #[error("Shared memory access failed")]
    Shm(#[from] ShmError),
    /// The peer broke the ring protocol; the link is unusable.
    #[error("Ring broken: {0}")]
    Broken(String),
    /// The driver reset the device (status lost DRIVER_OK, or NEEDS_RESET;
    /// over vhost-user: the front end stopped a queue).
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
    /// The buffer sizes the device offered were refused.
    #[error("Device refused")]
    BufSize(#[from] crate::bufsz::BufSizeError),
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

/// A buffer the peer filled, held until [`Link::release_rx`] gives it back.
#[derive(Debug, PartialEq, Eq)]
pub struct Held {
    /// Which buffer (the link's own bookkeeping).
    pub(crate) token: u64,
    /// Where it is in the shared memory.
    pub addr: u64,
    /// Bytes the peer put there (header included); inside the shared memory.
    pub len: usize,
}

impl Held {
    /// A held buffer, for a [`Link`] written outside this crate: `token` is
    /// the link's own, `addr..addr + len` where the peer put the message.
    /// The bus reads it only through the shared memory's bounds checks, so
    /// a range that lies is an error, never a stray access.
    pub fn new(token: u64, addr: u64, len: usize) -> Self {
        Held { token, addr, len }
    }

    /// The link's bookkeeping token.
    pub fn token(&self) -> u64 {
        self.token
    }
}

/// A buffer free for sending, until [`Link::put_tx`] or [`Link::drop_tx`].
#[derive(Debug, PartialEq, Eq)]
pub struct Slot {
    /// Which buffer (the link's own bookkeeping).
    pub(crate) token: u64,
    /// Where it is in the shared memory.
    pub addr: u64,
    /// Its size (header included); inside the shared memory.
    pub cap: usize,
}

impl Slot {
    /// A free buffer, for a [`Link`] written outside this crate (see
    /// [`Held::new`]).
    pub fn new(token: u64, addr: u64, cap: usize) -> Self {
        Slot { token, addr, cap }
    }

    /// The link's bookkeeping token.
    pub fn token(&self) -> u64 {
        self.token
    }
}

/// One side of an rpmsg link over two vrings. Buffers are handed out and
/// taken back without copying; [`Link::recv`] and [`Link::send`] are the
/// copying conveniences on top.
pub trait Link: Send + fmt::Debug {
    /// Host or remote.
    fn role(&self) -> Role;

    /// The memory the buffers live in (the bus reads and writes messages
    /// through it).
    fn memory(&self) -> &Arc<dyn LinkMemory>;

    /// Takes the next buffer the peer filled. `Ok(None)` when nothing is
    /// pending; `Ok(Some(Err(reason)))` when the peer's buffer was unusable
    /// (it was given back already).
    ///
    /// # Errors
    /// [`LinkError`] when the ring itself is broken.
    fn hold_rx(&mut self) -> Result<Option<Result<Held, String>>, LinkError>;

    /// Gives a held buffer back to the peer.
    ///
    /// # Errors
    /// [`LinkError`] when the ring is broken.
    fn release_rx(&mut self, held: Held) -> Result<(), LinkError>;

    /// A free buffer to send in, if any.
    ///
    /// # Errors
    /// [`LinkError`] when the ring is broken.
    fn get_tx(&mut self) -> Result<Option<Slot>, LinkError>;

    /// Hands a filled buffer (`len` bytes, header included) to the peer.
    ///
    /// # Errors
    /// [`LinkError`] when the ring is broken or `len` exceeds the slot.
    fn put_tx(&mut self, slot: Slot, len: usize) -> Result<(), LinkError>;

    /// Takes back a slot that will not be sent.
    fn drop_tx(&mut self, slot: Slot);

    /// Copies the next message from the peer into `out` (header included)
    /// and gives the buffer back. `Ok(None)` when nothing is pending.
    ///
    /// # Errors
    /// [`LinkError`] when the ring itself is broken.
    fn recv(&mut self, out: &mut Vec<u8>) -> Result<Option<Rx>, LinkError> {
        match self.hold_rx()? {
            None => Ok(None),
            Some(Err(reason)) => Ok(Some(Rx::Refused(reason))),
            Some(Ok(h)) => {
                out.resize(h.len, 0);
                let r = self.memory().read(h.addr, out);
                self.release_rx(h)?;
                r?;
                Ok(Some(Rx::Message))
            }
        }
    }

    /// Sends one encoded message (header included). `Ok(false)` when no
    /// buffer is free right now.
    ///
    /// # Errors
    /// [`LinkError`] when the ring is broken or the message does not fit.
    fn send(&mut self, msg: &[u8]) -> Result<bool, LinkError> {
        let Some(slot) = self.get_tx()? else {
            return Ok(false);
        };
        if msg.len() > slot.cap {
            let cap = slot.cap;
            self.drop_tx(slot);
            return Err(LinkError::Broken(format!(
                "message of {} bytes for a {cap}-byte buffer",
                msg.len()
            )));
        }
        if let Err(e) = self.memory().write(slot.addr, msg) {
            self.drop_tx(slot);
            return Err(e.into());
        }
        self.put_tx(slot, msg.len())?;
        Ok(true)
    }

    /// Bytes one message this side sends may take, header included.
    fn buf_size(&self) -> usize;

    /// Bytes one message from the peer may take, header included.
    fn rx_buf_size(&self) -> usize {
        self.buf_size()
    }

    /// Whether the peer must be notified for the work done since the last
    /// call (honours `EVENT_IDX` and `NO_NOTIFY`).
    fn take_kick(&mut self) -> bool;

    /// Asks the peer for notifications before sleeping; returns whether
    /// work arrived in the meantime (then do not sleep).
    ///
    /// # Errors
    /// [`LinkError`] when the ring is broken.
    fn arm(&mut self) -> Result<bool, LinkError>;

    /// Tells the peer it need not notify for now: the caller keeps passing
    /// over the rings (it calls [`Link::arm`] again before it sleeps).
    ///
    /// # Errors
    /// [`LinkError`] when the ring is broken.
    fn disarm(&mut self) -> Result<(), LinkError> {
        Ok(())
    }

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
