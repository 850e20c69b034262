//! The remote's [`Notifier`] over vhost-user: the driver's kicks come on
//! the queues' kick eventfds; a kick to the driver signals the call fd of
//! each queue whose used ring it asked to hear of (the link says which);
//! a stop request on either queue (device reset, front end gone) ends the
//! link.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use iopath_virtio::device::{CallSignal, QueueContext};

use crate::notify::{poll_in, Notifier, NotifyError, Wake};

/// Kicks from and calls to a vhost-user front end.
#[derive(Debug)]
pub struct VhostUserNotifier {
    /// Both queues' kick eventfds, then both stop fds.
    fds: [OwnedFd; 4],
    calls: [CallSignal; 2],
    pending: Arc<AtomicU8>,
}

impl VhostUserNotifier {
    pub(super) fn new(ctxs: &[QueueContext; 2]) -> std::io::Result<Self> {
        let dup = |fd: BorrowedFd<'_>| fd.try_clone_to_owned();
        Ok(VhostUserNotifier {
            fds: [
                dup(ctxs[0].kick_fd())?,
                dup(ctxs[1].kick_fd())?,
                dup(ctxs[0].stop_fd())?,
                dup(ctxs[1].stop_fd())?,
            ],
            calls: [ctxs[0].call_signal(), ctxs[1].call_signal()],
            pending: Arc::new(AtomicU8::new(0)),
        })
    }

    /// Where the link notes the queues to signal.
    pub(super) fn pending(&self) -> Arc<AtomicU8> {
        Arc::clone(&self.pending)
    }
}

impl Notifier for VhostUserNotifier {
    fn kick(&self) -> Result<(), NotifyError> {
        let queues = self.pending.swap(0, Ordering::AcqRel);
        for (q, call) in self.calls.iter().enumerate() {
            if queues & (1 << q) != 0 {
                call.signal();
            }
        }
        Ok(())
    }

    fn wait(&self, timeout: Duration) -> Result<Wake, NotifyError> {
        let ready = poll_in(&self.wait_fds(), timeout)?;
        if ready[2..].iter().any(|r| !r.is_empty()) {
            return Err(NotifyError::QueuesStopped);
        }
        let mut kicked = false;
        for (fd, r) in self.fds[..2].iter().zip(&ready) {
            if !r.is_empty() {
                kicked = true;
                // Readable: one read takes every kick counted so far.
                let mut b = [0u8; 8];
                let _ = rustix::io::read(fd, &mut b);
            }
        }
        Ok(if kicked { Wake::Kicked } else { Wake::Timeout })
    }

    fn wait_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.fds.iter().map(|f| f.as_fd()).collect()
    }

    fn kind(&self) -> &'static str {
        "vhost-user"
    }
}
