//! Device side: a vhost-user back end for virtio devices, with IOTLB
//! enforcement.
//!
//! ```text
//!  front end (QEMU, iopath driver)
//!      | unix socket: vhost-user messages, memory fds, eventfds
//!      v
//!  VhostUserServer --accept--> connection loop --IOTLB_MSG--> VhostIommu
//!      |                            |
//!      |               vhost::BackendReqHandler (every other message)
//!      |                            |
//!      |                     Handler: memory table, vrings, features
//!      |                            | one thread per started vring
//!      v                            v
//!  VirtioDevice::run_queue(QueueContext)  -- virtio-queue over DeviceMemory
//! ```
//!
//! `DeviceMemory` is vm-memory's `IommuMemory`: without
//! `VIRTIO_F_ACCESS_PLATFORM` it is the front end's memory keyed by guest
//! physical address; with it, every ring and buffer address is an IOVA that
//! must be mapped by the IOTLB with the right permission, or the access
//! fails without touching memory.
//!
//! Why not `vhost-user-backend`'s `VhostUserDaemon`: its handler converts
//! ring addresses from front-end virtual to guest physical addresses and
//! ties vrings to a plain `GuestMemoryMmap`, so IOVAs cannot be expressed;
//! and the `vhost` crate's request handler drops the connection on
//! `IOTLB_MSG` (rust-vmm/vhost issue 312). So this module implements the
//! message handler (`vhost`'s `VhostUserBackendReqHandlerMut`) itself, and
//! the connection loop peeks at each header to take `IOTLB_MSG` before the
//! `vhost` crate sees it.
//!
//! One concern per file: `server` (the connection loop), `intercept` (the
//! messages it takes before the `vhost` crate sees them), `handler` (the
//! requests and the queue workers), `memory` (mapping the front end's
//! regions, guarded against SIGBUS by the heap's `SigbusGuard`), `iotlb`
//! (the IOMMU), `inflight` (the record of requests in flight that the
//! front end keeps across a back-end restart, `INFLIGHT_SHMFD`) and `chain`
//! (the descriptor chain at a head that record names); the message framing
//! is [`crate::vhost_wire`].
//!
//! With an inflight record, a device pops chains with
//! [`QueueContext::pop_chain`] and puts them with
//! [`QueueContext::add_used`] (which keep the record), and runs
//! [`QueueContext::take_resubmits`] first: the heads a killed predecessor
//! left in flight.

mod access;
mod chain;
mod handler;
mod inflight;
mod intercept;
mod iotlb;
mod iotlb_stats;
mod memory;
mod polling;
mod server;

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{
    GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard, GuestMemoryMmap, IommuMemory,
};

pub use access::{CallSignal, MemoryAccess};
pub use chain::HeadChain;
pub use inflight::InflightError;
pub use iopath_dma::Perm;
pub(crate) use iotlb::permissions;
pub use iotlb::{IotlbMsg, IotlbMsgError, VhostIommu, IOTLB_MSG_SIZE};
pub use iotlb_stats::IotlbStats;
pub use server::{
    serve_connection, serve_connection_with, ServerError, ServerOptions, VhostUserServer,
    IOTLB_STATS_TARGET,
};

/// Feature bits device models use, re-exported from [`crate::features`]
/// (where they are defined once); the ring bits under their
/// `VIRTIO_RING_F_*` names.
pub use crate::features::{
    VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_ACCESS_PLATFORM,
    VIRTIO_F_EVENT_IDX as VIRTIO_RING_F_EVENT_IDX,
    VIRTIO_F_INDIRECT_DESC as VIRTIO_RING_F_INDIRECT_DESC, VIRTIO_F_VERSION_1,
};

/// The memory a device accesses: the front end's regions behind an IOMMU
/// that is enabled exactly when `VIRTIO_F_ACCESS_PLATFORM` is negotiated.
pub type DeviceMemory = IommuMemory<GuestMemoryMmap<()>, VhostIommu>;
/// A snapshot of [`DeviceMemory`]; holding it keeps every mapping alive.
pub type DeviceMemoryGuard = GuestMemoryLoadGuard<DeviceMemory>;

/// A virtio device model served over vhost-user.
pub trait VirtioDevice: Send + Sync + 'static {
    /// The virtio feature bits the device offers (without
    /// `VHOST_USER_F_PROTOCOL_FEATURES`, which the server adds).
    fn features(&self) -> u64;
    /// Number of virtqueues.
    fn num_queues(&self) -> usize;
    /// Largest queue size accepted from the front end.
    fn max_queue_size(&self) -> u16;
    /// Bytes `offset..offset + len` of the device configuration space;
    /// must return exactly `len` bytes (zeros past the end of the layout).
    fn read_config(&self, offset: u32, len: u32) -> Vec<u8>;
    /// Serves one started virtqueue until [`QueueContext::wait`] reports
    /// [`Wake::stop`]; then finishes what is in flight and returns the queue
    /// (its indices are kept for the next start).
    fn run_queue(&self, ctx: QueueContext) -> Queue;
}

/// The call eventfd of a vring; the front end may replace it at any time.
#[derive(Debug, Default)]
pub(crate) struct CallFd {
    fd: Mutex<Option<File>>,
}

impl CallFd {
    fn set(&self, fd: Option<File>) {
        *self.fd.lock().unwrap_or_else(|e| e.into_inner()) = fd;
    }

    fn signal(&self) {
        let guard = self.fd.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(fd) = guard.as_ref() {
            // An eventfd write only fails when the counter would overflow,
            // in which case the front end has a wake-up pending anyway.
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }
}

/// Makes an IOTLB invalidation wait for the device accesses that may still
/// use the old translation.
///
/// Every device access to front-end memory happens under a [`DmaTicket`]
/// (a batch of ring work, or one request's I/O in flight). An invalidation
/// is applied to the IOTLB first, then [`DmaFence::wait_older`] opens a new
/// generation and waits until every ticket of the previous one is gone; only
/// then is it acknowledged, so the front end may reuse the memory. Two
/// generations suffice because invalidations are handled one at a time.
///
/// A batch whose thread waits for the front end to answer an IOTLB miss
/// holds no translation meanwhile, and the front end may be waiting for this
/// very acknowledgement before it answers: such a thread is parked
/// ([`DmaFence::park`]) and does not hold the invalidation up.
#[derive(Debug, Default)]
pub struct DmaFence {
    state: Mutex<FenceState>,
    idle: Condvar,
}

#[derive(Debug, Default)]
struct FenceState {
    generation: u64,
    live: [u64; 2],
    parked: [u64; 2],
    /// Threads in [`DmaFence::wait_older`]: a ticket dropped or parked
    /// wakes them, and with none it makes no `futex` call (one per batch
    /// of requests otherwise).
    waiters: usize,
}

thread_local! {
    /// Batch tickets held by this thread: (fence address, slot).
    static BATCHES: std::cell::RefCell<Vec<(usize, usize)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl DmaFence {
    fn lock(&self) -> std::sync::MutexGuard<'_, FenceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn id(&self) -> usize {
        self as *const Self as usize
    }

    /// Takes a ticket in the current generation (for I/O in flight).
    pub fn ticket(self: &Arc<Self>) -> DmaTicket {
        let mut st = self.lock();
        let slot = (st.generation % 2) as usize;
        st.live[slot] += 1;
        DmaTicket {
            fence: Arc::clone(self),
            slot,
            batch: false,
        }
    }

    /// Takes a ticket for work done by this thread (parked while the thread
    /// waits for an IOTLB miss to be answered); drop it on this thread.
    pub fn batch(self: &Arc<Self>) -> DmaTicket {
        let mut t = self.ticket();
        t.batch = true;
        BATCHES.with(|b| b.borrow_mut().push((self.id(), t.slot)));
        t
    }

    /// Parks this thread's batch tickets until the guard is dropped.
    pub fn park(&self) -> Parked<'_> {
        let slots: Vec<usize> = BATCHES.with(|b| {
            b.borrow()
                .iter()
                .filter(|(id, _)| *id == self.id())
                .map(|&(_, slot)| slot)
                .collect()
        });
        let mut st = self.lock();
        for &slot in &slots {
            st.parked[slot] += 1;
        }
        let wake = st.waiters > 0;
        drop(st);
        if wake {
            self.idle.notify_all();
        }
        Parked { fence: self, slots }
    }

    /// Starts a new generation and waits (at most `limit`) until no ticket
    /// of the previous one is left but parked ones. Returns whether they
    /// all went.
    pub fn wait_older(&self, limit: Duration) -> bool {
        let mut st = self.lock();
        let old = (st.generation % 2) as usize;
        st.generation += 1;
        // Counted under the lock, so a ticket dropped after this sees a
        // waiter to wake, and one dropped before is seen by the predicate.
        st.waiters += 1;
        let (mut st, timeout) = self
            .idle
            .wait_timeout_while(st, limit, |st| st.live[old] > st.parked[old])
            .unwrap_or_else(|e| e.into_inner());
        st.waiters -= 1;
        drop(st);
        !timeout.timed_out()
    }
}

/// Batch tickets of one thread, parked (see [`DmaFence::park`]).
#[derive(Debug)]
pub struct Parked<'a> {
    fence: &'a DmaFence,
    slots: Vec<usize>,
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        let mut st = self.fence.lock();
        for &slot in &self.slots {
            st.parked[slot] -= 1;
        }
    }
}

/// Permission to access front-end memory through the translations current
/// when it was taken; dropping it ends the access.
#[derive(Debug)]
pub struct DmaTicket {
    fence: Arc<DmaFence>,
    slot: usize,
    batch: bool,
}

impl Drop for DmaTicket {
    fn drop(&mut self) {
        if self.batch {
            let key = (self.fence.id(), self.slot);
            BATCHES.with(|b| {
                let mut b = b.borrow_mut();
                if let Some(i) = b.iter().rposition(|e| *e == key) {
                    b.remove(i);
                }
            });
        }
        let mut st = self.fence.lock();
        st.live[self.slot] -= 1;
        let wake = st.waiters > 0;
        drop(st);
        if wake {
            self.fence.idle.notify_all();
        }
    }
}

/// What woke [`QueueContext::wait`].
#[derive(Clone, Copy, Debug, Default, Eq, PartialEq)]
pub struct Wake {
    /// The driver kicked the queue.
    pub kick: bool,
    /// The server asks the queue to stop.
    pub stop: bool,
    /// The extra descriptor passed to `wait` is readable.
    pub extra: bool,
}

/// Everything a device needs to serve one started virtqueue.
#[derive(Debug)]
pub struct QueueContext {
    index: usize,
    queue: Queue,
    mem: GuestMemoryAtomic<DeviceMemory>,
    kick: File,
    stop: Arc<OwnedFd>,
    call: Arc<CallFd>,
    fence: Arc<DmaFence>,
    acked_features: u64,
    /// The queue's inflight record, when the front end shares one.
    inflight: Option<inflight::InflightQueue>,
    /// Heads the previous back end left in flight, oldest first.
    resubmit: Vec<u16>,
    /// Signal the driver at the next [`QueueContext::notify`] whatever
    /// `EVENT_IDX` says (set after a restart).
    force_notify: bool,
    /// The front end's process, if known.
    peer: Option<rustix::process::Pid>,
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
    /// it once [`VirtioDevice::run_queue`] returns.
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
        use rustix::event::{poll, PollFd, PollFlags};
        loop {
            let mut fds = vec![
                PollFd::new(&self.kick, PollFlags::IN),
                PollFd::new(&*self.stop, PollFlags::IN),
            ];
            if let Some(fd) = extra.as_ref() {
                fds.push(PollFd::from_borrowed_fd(fd.as_fd(), PollFlags::IN));
            }
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let ready = |i: usize| fds.get(i).is_some_and(|f| !f.revents().is_empty());
            let wake = Wake {
                kick: ready(0),
                stop: ready(1),
                extra: ready(2),
            };
            drop(fds);
            if wake.kick {
                let mut buf = [0u8; 8];
                // A kick fd that is not an eventfd may fail to read; the
                // wake-up still counts as a kick.
                let _ = rustix::io::read(&self.kick, &mut buf);
            }
            return Ok(wake);
        }
    }

    /// Ends the context and hands the queue back to the server.
    pub fn into_queue(self) -> Queue {
        self.queue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_waits_for_older_tickets_only() {
        let fence = Arc::new(DmaFence::default());
        let held = fence.ticket();
        // A held ticket keeps the invalidation from completing.
        assert!(!fence.wait_older(Duration::from_millis(20)));
        drop(held);

        let older = fence.ticket();
        let f2 = Arc::clone(&fence);
        let waiter = std::thread::spawn(move || f2.wait_older(Duration::from_secs(10)));
        // Wait (without a timing guess) until the waiter has started the new
        // generation: it bumps it and blocks under the same lock.
        while fence.state.lock().unwrap().generation < 2 {
            std::thread::yield_now();
        }
        assert!(!waiter.is_finished(), "did not wait for the older ticket");
        // A ticket taken after the invalidation began does not hold it up.
        let newer = fence.ticket();
        drop(older);
        assert!(waiter.join().unwrap());
        drop(newer);
        assert!(fence.wait_older(Duration::from_millis(1)));
    }

    #[test]
    fn parked_batches_do_not_hold_invalidations() {
        let fence = Arc::new(DmaFence::default());
        let batch = fence.batch();
        assert!(!fence.wait_older(Duration::from_millis(10)));
        {
            let _parked = fence.park();
            assert!(fence.wait_older(Duration::from_secs(1)));
        }
        // An I/O ticket is never parked.
        let io = fence.ticket();
        let _parked = fence.park();
        assert!(!fence.wait_older(Duration::from_millis(10)));
        drop(io);
        drop(batch);
    }
}
