//! What a device needs that serves several queues from one thread of its
//! own instead of the queue's worker (rpmsg's bus serves both of its rings
//! on its service thread): the queue's fds to wait on, a handle that
//! signals its call fd, and the front end's memory as bytes to copy in and
//! out, checked and translated as the queue's own accesses are.
//!
//! ```text
//!  run_queue(ctx) ──► device keeps ctx ──► its thread: poll kick/stop fds,
//!                                           pop/put through ctx,
//!                                           MemoryAccess::read/write,
//!                                           CallSignal::signal
//! ```

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use virtio_queue::QueueT;
use vm_memory::{
    Bytes, GuestAddress, GuestAddressSpace, GuestMemory, GuestMemoryAtomic, GuestMemoryError,
    Permissions,
};

use super::call::CallFd;
use super::{DeviceMemory, DmaFence, QueueContext};

/// `VRING_AVAIL_F_NO_INTERRUPT` (virtio 1.x §2.7.7.1), as the ring's u16
/// holds it.
const AVAIL_F_NO_INTERRUPT: u16 = virtio_bindings::virtio_ring::VRING_AVAIL_F_NO_INTERRUPT as u16;

/// The front end's memory, for copying bytes in and out at the addresses
/// its descriptors name (guest physical addresses, or IOVAs checked
/// against the IOTLB when `VIRTIO_F_ACCESS_PLATFORM` is negotiated). It
/// follows a new memory table; each access holds a [`DmaTicket`](super::DmaTicket)
/// so that an IOTLB invalidation waits for it.
#[derive(Clone, Debug)]
pub struct MemoryAccess {
    mem: GuestMemoryAtomic<DeviceMemory>,
    fence: Arc<DmaFence>,
}

impl MemoryAccess {
    /// Copies `dst.len()` bytes at `addr` out of the front end's memory.
    ///
    /// # Errors
    /// vm-memory's, when any byte is outside the memory the device may
    /// read.
    pub fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), GuestMemoryError> {
        let _t = self.fence.batch();
        self.mem.memory().read_slice(dst, GuestAddress(addr))
    }

    /// Copies `src` into the front end's memory at `addr`.
    ///
    /// # Errors
    /// vm-memory's, when any byte is outside the memory the device may
    /// write.
    pub fn write(&self, addr: u64, src: &[u8]) -> Result<(), GuestMemoryError> {
        let _t = self.fence.batch();
        self.mem.memory().write_slice(src, GuestAddress(addr))
    }

    /// Whether `len` bytes at `addr` may be accessed with `access`.
    pub fn check_range(&self, addr: u64, len: usize, access: Permissions) -> bool {
        let _t = self.fence.batch();
        self.mem
            .memory()
            .check_range(GuestAddress(addr), len, access)
    }
}

/// Signals a vring's call fd, whichever fd the front end has set by then.
#[derive(Clone, Debug)]
pub struct CallSignal(Arc<CallFd>);

impl CallSignal {
    /// Tells the driver that used buffers are there.
    pub fn signal(&self) {
        self.0.signal();
    }
}

impl QueueContext {
    /// The front end's memory as bytes, through this queue's view.
    pub fn memory_access(&self) -> MemoryAccess {
        MemoryAccess {
            mem: self.mem.clone(),
            fence: Arc::clone(&self.fence),
        }
    }

    /// A handle that signals this queue's call fd.
    pub fn call_signal(&self) -> CallSignal {
        CallSignal(Arc::clone(&self.call))
    }

    /// The kick eventfd: readable when the driver kicked. Read it (8
    /// bytes) to consume the kicks, or use [`QueueContext::wait`].
    pub fn kick_fd(&self) -> BorrowedFd<'_> {
        self.kick.as_fd()
    }

    /// Readable once the server asks the queue to stop (never consumed).
    pub fn stop_fd(&self) -> BorrowedFd<'_> {
        self.stop.as_fd()
    }

    /// Whether the server has asked the queue to stop.
    pub fn stop_requested(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(&*self.stop, PollFlags::IN)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
    }

    /// Whether the driver wants a notification for the used entries added
    /// since the last call (`mem`: the snapshot they were written through).
    /// Honours `EVENT_IDX` and, without it, `VRING_AVAIL_F_NO_INTERRUPT`
    /// (virtio-queue answers for `EVENT_IDX` only); true after a restart
    /// whatever the driver asked, and when the ring cannot be read.
    pub fn needs_notification(&mut self, mem: &DeviceMemory) -> bool {
        let by_queue = self.queue.needs_notification(mem);
        if std::mem::take(&mut self.force_notify) {
            return true;
        }
        match by_queue {
            Ok(n) if self.queue.event_idx_enabled() => n,
            // needs_notification fenced after the used-ring writes.
            Ok(_) => match mem.read_obj::<u16>(GuestAddress(self.queue.avail_ring())) {
                Ok(flags) => u16::from_le(flags) & AVAIL_F_NO_INTERRUPT == 0,
                Err(_) => true,
            },
            Err(_) => true,
        }
    }
}
