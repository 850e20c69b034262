//! How a driver queue waits for completions: through the spine's
//! [`Poller`](iopath_virtio::Poller) (poll the used ring for a while, then
//! re-enable interrupts, look again and sleep), and what it names when
//! nothing comes in time.

use std::time::Duration;

use iopath_dma::DmaOps;
use iopath_virtio::{Polled, SplitQueue, Transport};

use crate::error::BlkError;
use crate::wire::{
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES,
};

/// Looks between which a polling driver asks the transport whether the
/// back end is still there (a zero-timeout wait; some 0.1 to 1 ms of
/// polling), so that a busy poller sees a closed socket as a sleeping
/// one does.
const LIVENESS_EVERY: u32 = 4096;

/// One queue's used ring and interrupt, as the poller sees them.
pub(crate) struct UsedRing<'a, O: DmaOps + ?Sized> {
    pub(crate) vq: &'a mut SplitQueue<O>,
    pub(crate) transport: &'a dyn Transport,
    pub(crate) looks: u32,
    /// Completions to let pass before an interrupt (see
    /// [`SplitQueue::enable_interrupts_after`]).
    pub(crate) after: u16,
    /// A sleep ended with an interrupt left pending: the next re-arm takes
    /// it (see [`Transport::wait_interrupt_pending`]), after the requests
    /// that the wake-up lets the caller submit.
    pub(crate) pending: &'a mut bool,
}

impl<O: DmaOps + ?Sized> Polled for UsedRing<'_, O> {
    type Error = BlkError;

    fn ready(&mut self) -> Result<bool, BlkError> {
        if self.vq.has_used() {
            return Ok(true);
        }
        self.looks = self.looks.wrapping_add(1);
        if self.looks % LIVENESS_EVERY == 0 {
            // Takes a pending interrupt too; harmless while polling.
            self.transport
                .wait_interrupt(self.vq.index(), Some(Duration::ZERO))?;
            return Ok(self.vq.has_used());
        }
        Ok(false)
    }

    fn suppress(&mut self) -> Result<(), BlkError> {
        self.vq.disable_interrupts();
        Ok(())
    }

    fn rearm(&mut self) -> Result<bool, BlkError> {
        if std::mem::take(self.pending) {
            self.transport.take_interrupt(self.vq.index())?;
        }
        Ok(!self.vq.enable_interrupts_after(self.after))
    }

    fn sleep(&mut self, timeout: Option<Duration>) -> Result<(), BlkError> {
        // The interrupt stays pending until the next re-arm: the caller
        // takes the completion and submits what it frees first.
        let index = self.vq.index();
        *self.pending |= self.transport.wait_interrupt_pending(index, timeout)?;
        Ok(())
    }
}

/// A request type by name, for messages.
pub(crate) fn kind_name(kind: u32) -> &'static str {
    match kind {
        VIRTIO_BLK_T_IN => "read",
        VIRTIO_BLK_T_OUT => "write",
        VIRTIO_BLK_T_FLUSH => "flush",
        VIRTIO_BLK_T_GET_ID => "get-id",
        VIRTIO_BLK_T_DISCARD => "discard",
        VIRTIO_BLK_T_WRITE_ZEROES => "write-zeroes",
        _ => "request",
    }
}
