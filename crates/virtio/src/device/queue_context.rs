//! [`QueueContext`]: everything a device needs to serve one started
//! virtqueue: the ring, the front end's memory, the kick, call and stop
//! fds, the DMA fence and the inflight record. What a device serving
//! queues from a thread of its own needs is in `access`; what a polling
//! queue thread needs is in `polling`.

use std::fs::File;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};

use super::call::CallFd;
use super::chain::HeadChain;
use super::fence::{DmaFence, DmaTicket};
use super::inflight::InflightQueue;
use super::wake::{self, Wake};
use super::{DeviceMemory, DeviceMemoryGuard};

/// Everything a device needs to serve one started virtqueue.
#[derive(Debug)]
pub struct QueueContext {
    pub(super) index: usize,
    pub(super) queue: Queue,
    pub(super) mem: GuestMemoryAtomic<DeviceMemory>,
    pub(super) kick: File,
    pub(super) stop: Arc<OwnedFd>,
    pub(super) call: Arc<CallFd>,
    pub(super) fence: Arc<DmaFence>,
    pub(super) acked_features: u64,
    /// The queue's inflight record, when the front end shares one.
    pub(super) inflight: Option<InflightQueue>,
    /// Heads the previous back end left in flight, oldest first.
    pub(super) resubmit: Vec<u16>,
    /// Signal the driver at the next [`QueueContext::notify`] whatever
    /// `EVENT_IDX` says (set after a restart).
    pub(super) force_notify: bool,
    /// The front end's process, if known.
    pub(super) peer: Option<rustix::process::Pid>,
    /// Kicks are suppressed since the last re-arm (see
    /// [`QueueContext::suppress_kicks`]).
    pub(super) kicks_suppressed: bool,
}

impl QueueContext {
    /// Restores the ring from the inflight record, if there is one (run on
    /// the queue's thread before the device sees the queue: the used ring
    /// is read through the IOTLB, whose misses the connection answers).
    pub(super) fn recover_inflight(&mut self) {
        let Some(tracker) = self.inflight.as_mut() else {
            return;
        };
        let mem = self.mem.memory();
        let used = match self
            .queue
            .used_idx(&*mem, std::sync::atomic::Ordering::Acquire)
        {
            Ok(u) => u.0,
            Err(e) => {
                tracing::warn!(
                    "queue {}: cannot read the used index ({e}); in-flight requests not tracked",
                    self.index
                );
                self.inflight = None;
                return;
            }
        };
        let r = tracker.recover(used);
        if r.fresh {
            tracing::debug!("queue {}: inflight region initialised", self.index);
            return;
        }
        // A record with heads in flight means the last back end did not
        // stop cleanly (a clean stop finishes them): worth a warning.
        if r.next_avail != self.queue.next_avail() || !r.resubmit.is_empty() {
            tracing::warn!(
                "queue {}: {} request(s) were in flight when the last back end stopped \
                 (used index {}, next available {}); resubmitting heads {:?}",
                self.index,
                r.resubmit.len(),
                r.next_used,
                r.next_avail,
                r.resubmit
            );
        }
        self.queue.set_next_avail(r.next_avail);
        self.queue.set_next_used(r.next_used);
        self.resubmit = r.resubmit;
        // The last back end may have died between used-ring updates and
        // the interrupt for them: with EVENT_IDX the driver would then
        // wait for an interrupt that this back end's index arithmetic
        // (which starts afresh) never sends. Signal now, and at the next
        // notification whatever the driver asked for (as libvhost-user's
        // `signalled_used_valid = false` after a reconnect).
        self.call.signal();
        self.force_notify = true;
    }

    /// Takes the heads that were in flight when the previous back end
    /// stopped (oldest first): run them, through [`Self::chain_at`], before
    /// any new available entry; they are still recorded as in flight.
    pub fn take_resubmits(&mut self) -> Vec<u16> {
        std::mem::take(&mut self.resubmit)
    }

    /// The descriptor chain at `head` of this queue's descriptor table.
    pub fn chain_at<'m>(&self, mem: &'m DeviceMemory, head: u16) -> HeadChain<'m> {
        HeadChain::new(
            mem,
            vm_memory::GuestAddress(self.queue.desc_table()),
            self.queue.size(),
            head,
        )
    }

    /// Pops the next available chain and, with an inflight record, marks
    /// its head as in flight before anything is done with it.
    pub fn pop_chain(
        &mut self,
        mem: &DeviceMemoryGuard,
    ) -> Option<DescriptorChain<DeviceMemoryGuard>> {
        let chain = self.queue.pop_descriptor_chain(mem.clone())?;
        if let Some(t) = self.inflight.as_mut() {
            t.pop(chain.head_index());
        }
        Some(chain)
    }

    /// Puts `head` on the used ring with `len` bytes written; with an
    /// inflight record, in the specification's order (`last_batch_head`,
    /// the used ring, the head cleared, the recorded used index).
    ///
    /// # Errors
    /// `virtio-queue`'s, when the used ring cannot be written.
    pub fn add_used(
        &mut self,
        mem: &DeviceMemory,
        head: u16,
        len: u32,
    ) -> Result<(), virtio_queue::Error> {
        if let Some(t) = &self.inflight {
            t.pre_put(head);
        }
        self.queue.add_used(mem, head, len)?;
        if let Some(t) = &self.inflight {
            t.post_put(head, self.queue.next_used());
        }
        Ok(())
    }

    /// A ticket to hold while I/O into front-end memory is in flight:
    /// IOTLB invalidations are acknowledged only once the accesses begun
    /// before them are over.
    pub fn dma_ticket(&self) -> DmaTicket {
        self.fence.ticket()
    }

    /// A ticket for a batch of work on this thread (translating, reading
    /// and writing rings and buffers); drop it on this thread.
    pub fn dma_batch(&self) -> DmaTicket {
        self.fence.batch()
    }

    /// Sets what this queue does before it waits for the front end to
    /// answer an IOTLB miss, replacing any earlier hook; the server clears
    /// it once [`VirtioDevice::run_queue`](super::VirtioDevice::run_queue)
    /// returns.
    ///
    /// The front end may be unable to answer until it has the
    /// acknowledgement of an invalidation it sent, and that waits (see
    /// [`DmaFence`]) for every access under way through the old
    /// translations, this queue's I/O in flight included. A device whose I/O
    /// holds tickets finishes it here (and keeps the completions for
    /// later): otherwise the miss, the invalidation and the I/O wait for
    /// each other until the miss times out.
    ///
    /// The hook runs on the thread that translates through this queue's
    /// [`memory`](Self::memory) (normally the queue's own thread), perhaps
    /// while that thread holds the device's locks: it must not block on
    /// them. A miss taken inside the hook does not run it again.
    pub fn set_before_miss_wait(&self, hook: impl FnMut() + Send + 'static) {
        self.mem
            .memory()
            .iommu()
            .set_before_miss_wait(Some(Box::new(hook)));
    }

    /// The front end's process (`SO_PEERCRED` of its connection), for a
    /// [`crate::Poller::set_peer`]; `None` when the socket does not say.
    pub fn peer(&self) -> Option<rustix::process::Pid> {
        self.peer
    }

    /// Index of the queue.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Features the driver acknowledged.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// The virtqueue state (indices, ring addresses).
    pub fn queue_mut(&mut self) -> &mut Queue {
        &mut self.queue
    }

    /// The current memory; take a fresh snapshot per batch of requests, so
    /// that a new memory table or IOMMU mode takes effect.
    pub fn memory(&self) -> DeviceMemoryGuard {
        self.mem.memory()
    }

    /// Signals the driver that used buffers are available (if, with
    /// `EVENT_IDX`, it asked to be told); `mem` must be the snapshot the
    /// used entries were written through.
    pub fn notify(&mut self, mem: &DeviceMemory) {
        if std::mem::take(&mut self.force_notify) {
            // Still asked, to keep virtio-queue's count of what was added.
            let _ = self.queue.needs_notification(mem);
            self.call.signal();
            return;
        }
        match self.queue.needs_notification(mem) {
            Ok(false) => {}
            // If the ring cannot even be read, wake the driver anyway.
            Ok(true) | Err(_) => self.call.signal(),
        }
    }

    /// Blocks until the queue is kicked, stopped, or `extra` (e.g. an
    /// io_uring completion eventfd) becomes readable. Kicks are consumed.
    ///
    /// # Errors
    /// The `poll(2)` error, other than `EINTR`.
    pub fn wait(&self, extra: Option<BorrowedFd<'_>>) -> io::Result<Wake> {
        wake::wait(&self.kick, &self.stop, extra)
    }

    /// Ends the context and hands the queue back to the server.
    pub fn into_queue(self) -> Queue {
        self.queue
    }
}
