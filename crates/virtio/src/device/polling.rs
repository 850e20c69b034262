//! What a device's queue thread needs to wait through a
//! [`crate::poll::Poller`]: look at the available ring without blocking,
//! suppress the driver's kicks while polling, re-enable them with the
//! re-check (a stop request is seen with
//! [`QueueContext::stop_requested`]).

use std::sync::atomic::Ordering;

use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress};

use super::{DeviceMemory, QueueContext};

/// `flags` and `idx` of the used ring, before its elements (§2.7.8).
const USED_HEADER: u64 = 4;
/// One used element: `id` and `len`.
const USED_ELEM: u64 = 8;

impl QueueContext {
    /// Whether the driver has made entries available that were not taken
    /// yet (an unreadable ring counts as none: the next kick tells).
    pub fn avail_pending(&self, mem: &DeviceMemory) -> bool {
        self.queue
            .avail_idx(mem, Ordering::Acquire)
            .is_ok_and(|idx| idx.0 != self.queue.next_avail())
    }

    /// Asks the driver not to kick while this thread polls (§2.7.10):
    /// without `EVENT_IDX` the used ring's `NO_NOTIFY` flag; with it an
    /// `avail_event` the driver has already passed, so that it kicks again
    /// only after 2^16 requests (the poller re-enables long before). Once
    /// asked, it is not written again until [`QueueContext::rearm_kicks`]:
    /// a driver reads that word on every request it publishes, and a write
    /// on each of this thread's polls made it bounce between the CPUs.
    pub fn suppress_kicks(&mut self, mem: &DeviceMemory) {
        if std::mem::replace(&mut self.kicks_suppressed, true) {
            return;
        }
        let r = if self.queue.event_idx_enabled() {
            let at = self
                .queue
                .used_ring()
                .checked_add(USED_HEADER + USED_ELEM * u64::from(self.queue.size()));
            match at {
                Some(at) => mem
                    .store(
                        self.queue.next_avail().wrapping_sub(1).to_le(),
                        GuestAddress(at),
                        Ordering::Relaxed,
                    )
                    .map_err(|e| e.to_string()),
                None => Err("used ring address overflows".into()),
            }
        } else {
            self.queue
                .disable_notification(mem)
                .map_err(|e| e.to_string())
        };
        if let Err(e) = r {
            tracing::debug!("queue {}: cannot suppress kicks: {e}", self.index);
        }
    }

    /// Asks the driver to kick again, then (after a full barrier, as
    /// `virtio-queue` does) looks at the available ring again: `true` when
    /// entries came meanwhile, and the thread must not sleep.
    pub fn rearm_kicks(&mut self, mem: &DeviceMemory) -> bool {
        self.kicks_suppressed = false;
        match self.queue.enable_notification(mem) {
            Ok(more) => more,
            Err(e) => {
                tracing::debug!("queue {}: cannot re-enable kicks: {e}", self.index);
                false
            }
        }
    }
}
