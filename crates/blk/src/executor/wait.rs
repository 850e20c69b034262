//! How a queue thread of the back end waits: through the spine's
//! [`Poller`](iopath_virtio::Poller). It looks at the available ring, at
//! its own io_uring's completions and (now and then) at the server's stop
//! request; while polling the driver is asked not to kick; before sleeping
//! kicks are re-enabled and the ring looked at again.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};

use iopath_sys::lock;
use iopath_virtio::device::QueueContext;
use iopath_virtio::Polled;

use super::uring::IoState;

/// Looks between two checks of the stop request (a system call; some
/// 0.1 to 1 ms of polling), so that a busy poller whose front end went
/// away stops and the next front end is served.
const STOP_EVERY: u32 = 4096;

/// One queue's sources of work, as the poller sees them.
pub(super) struct QueueSources<'a> {
    pub(super) ctx: &'a mut QueueContext,
    pub(super) io: &'a Arc<Mutex<IoState>>,
    pub(super) eventfd: &'a OwnedFd,
    /// The available ring is not to be looked at (the queue is broken).
    pub(super) broken: bool,
    /// The server asked the queue to stop.
    pub(super) stop: bool,
    pub(super) looks: u32,
}

impl QueueSources<'_> {
    /// Completions the kernel posted, or taken and not yet reported.
    fn io_done(&self) -> bool {
        let mut st = lock(self.io);
        !st.done.is_empty() || !st.ring.completion().is_empty()
    }

    fn avail(&self) -> bool {
        !self.broken && self.ctx.avail_pending(&self.ctx.memory())
    }
}

impl Polled for QueueSources<'_> {
    type Error = std::io::Error;

    fn ready(&mut self) -> std::io::Result<bool> {
        if self.stop || self.avail() || self.io_done() {
            return Ok(true);
        }
        self.looks = self.looks.wrapping_add(1);
        if self.looks % STOP_EVERY == 0 && self.ctx.stop_requested() {
            self.stop = true;
        }
        Ok(self.stop)
    }

    fn helpers_busy(&self) -> bool {
        // Requests on io_uring (large ones, or any on a file system with
        // non-blocking reads): its workers may run on this thread's CPU.
        lock(self.io).in_flight > 0
    }

    fn suppress(&mut self) -> std::io::Result<()> {
        let mem = self.ctx.memory();
        self.ctx.suppress_kicks(&mem);
        Ok(())
    }

    fn rearm(&mut self) -> std::io::Result<bool> {
        let mem = self.ctx.memory();
        let more = self.ctx.rearm_kicks(&mem) && !self.broken;
        Ok(more || self.io_done() || self.stop)
    }

    fn sleep(&mut self, _timeout: Option<std::time::Duration>) -> std::io::Result<()> {
        // Completions posted while polling left counts in the eventfd:
        // clear them, then look at the ring once more (a completion posted
        // after the read signals the eventfd again).
        let mut b = [0u8; 8];
        let _ = rustix::io::read(self.eventfd, &mut b);
        if self.io_done() {
            return Ok(());
        }
        let wake = self.ctx.wait(Some(self.eventfd.as_fd()))?;
        if wake.extra {
            let _ = rustix::io::read(self.eventfd, &mut b);
        }
        self.stop |= wake.stop;
        Ok(())
    }
}
