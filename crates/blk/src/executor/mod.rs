//! The request executor of one queue of the back end: takes chains off
//! the available ring, parses them ([`Request::parse`]) and runs them on
//! the image with its own io_uring, then writes the status byte and the
//! used ring. Runs on the queue's worker thread, started by
//! [`crate::backend::BlkBackend`].
//!
//! The io_uring side (requests in flight, completions into status bytes)
//! is in `uring.rs`, discard and write-zeroes in `discard.rs`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use io_uring::{opcode, types, IoUring};
use iopath_heap::AlignedBuf;
use iopath_sys::lock;
use iopath_virtio::device::{DeviceMemory, DeviceMemoryGuard, QueueContext};
use iopath_virtio::{PollMode, Poller};
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, Permissions};

use crate::image::{Image, BUF_ALIGN, DIRECT_ALIGN, INLINE_MAX};
use crate::request::{Rejected, Request, RequestKind, Segment};
use crate::wire::{SECTOR_SIZE, VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK};
use uring::{guest_iovecs, InFlight, IoState, Op, IOV_MAX};

mod discard;
mod uring;
mod wait;

/// One queue's executor.
pub(crate) struct Executor {
    image: Arc<Image>,
    id: [u8; VIRTIO_BLK_ID_BYTES],
    io: Arc<Mutex<IoState>>,
    eventfd: OwnedFd,
    /// Used entries written since the last notification.
    pending_notify: bool,
    /// The server asked the queue to stop: finish what is in flight only.
    stopping: bool,
    /// The driver's available index jumped by more than the queue holds:
    /// nothing more is taken from this queue until it is set up again.
    broken: bool,
    /// How the thread waits for work.
    poll: PollMode,
}

impl Executor {
    /// An executor with an io_uring sized for `queue_size` requests,
    /// waiting for work as `poll` says.
    pub(crate) fn new(
        image: Arc<Image>,
        id: [u8; VIRTIO_BLK_ID_BYTES],
        queue_size: u16,
        poll: PollMode,
    ) -> io::Result<Self> {
        let entries = u32::from(queue_size.max(8)).next_power_of_two();
        let ring = IoUring::new(entries)?;
        let eventfd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        ring.submitter().register_eventfd(eventfd.as_raw_fd())?;
        let n = usize::from(queue_size.max(1));
        Ok(Self {
            image,
            id,
            io: Arc::new(Mutex::new(IoState {
                ring,
                slots: (0..n).map(|_| None).collect(),
                free: (0..n).rev().collect(),
                in_flight: 0,
                done: Vec::new(),
            })),
            eventfd,
            pending_notify: false,
            stopping: false,
            broken: false,
            poll,
        })
    }

    /// Serves the queue until the server asks it to stop and what is in
    /// flight has finished.
    pub(crate) fn run(&mut self, ctx: &mut QueueContext) -> io::Result<()> {
        // Before this thread waits for the front end to answer an IOTLB
        // miss, its own I/O finishes: the front end may be waiting for an
        // invalidation's acknowledgement, which waits for that I/O. (A lock
        // held up the stack means nothing can be taken now; skip.)
        let io = Arc::clone(&self.io);
        ctx.set_before_miss_wait(move || {
            let st = match io.try_lock() {
                Ok(st) => Some(st),
                Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            };
            if let Some(mut st) = st {
                st.finish_in_flight();
            }
        });
        // What the previous back end left in flight runs first, then what
        // may already be waiting (a restarted ring).
        self.resubmit(ctx)?;
        self.process_avail(ctx)?;
        let mut poller = Poller::new(self.poll);
        poller.set_peer(ctx.peer());
        loop {
            if self.stopping {
                let (in_flight, done) = {
                    let st = lock(&self.io);
                    (st.in_flight, st.done.len())
                };
                if in_flight == 0 && done == 0 {
                    return Ok(());
                }
                if in_flight > 0 {
                    let waited = lock(&self.io).ring.submit_and_wait(1);
                    match waited {
                        Ok(_) => {}
                        Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                        Err(e) => return Err(e),
                    }
                }
                self.reap(ctx);
                continue;
            }
            let mut sources = wait::QueueSources {
                ctx: &mut *ctx,
                io: &self.io,
                eventfd: &self.eventfd,
                broken: self.broken,
                stop: false,
                looks: 0,
            };
            poller.wait(&mut sources, None)?;
            let stop = sources.stop;
            self.reap(ctx);
            if stop {
                self.stopping = true;
                continue;
            }
            self.process_avail(ctx)?;
        }
    }

    /// Starts the heads the previous back end left in flight (its inflight
    /// record), oldest first; they are within the queue size, so each has
    /// a slot.
    fn resubmit(&mut self, ctx: &mut QueueContext) -> io::Result<()> {
        let heads = ctx.take_resubmits();
        if heads.is_empty() {
            return Ok(());
        }
        let _dma = ctx.dma_batch();
        let mem = ctx.memory();
        for head in heads {
            if lock(&self.io).free.is_empty() {
                // Cannot happen (heads are distinct and below the queue
                // size); a request never started is one the guest waits on.
                tracing::warn!("queue {}: no slot to resubmit head {head}", ctx.index());
                break;
            }
            let parsed = Request::parse_descriptors(
                head,
                ctx.chain_at(&mem, head),
                &*mem,
                &self.image.limits,
            );
            self.start(ctx, &mem, parsed);
        }
        self.submit()?;
        if self.pending_notify {
            self.pending_notify = false;
            ctx.notify(&mem);
        }
        Ok(())
    }

    /// Pops every available chain there is a slot for and starts it
    /// (kicks are suppressed and re-enabled by the thread's wait).
    fn process_avail(&mut self, ctx: &mut QueueContext) -> io::Result<()> {
        if self.broken {
            return Ok(());
        }
        let _dma = ctx.dma_batch();
        let mem = ctx.memory();
        // An index that moved by more than the queue holds is no index at
        // all (a hostile driver, or memory that was taken away):
        // virtio-queue would refuse every chain while the poller kept
        // finding "more", a busy loop.
        let next = ctx.queue_mut().next_avail();
        let size = ctx.queue_mut().size();
        let readable = match ctx
            .queue_mut()
            .avail_idx(&*mem, std::sync::atomic::Ordering::Acquire)
        {
            Ok(avail) if avail.0.wrapping_sub(next) <= size => true,
            Ok(avail) => {
                tracing::warn!(
                    "queue {}: the driver's available index jumped from {next} to {}; queue stopped",
                    ctx.index(),
                    avail.0
                );
                self.broken = true;
                false
            }
            Err(e) => {
                tracing::warn!("queue {}: cannot read the ring: {e}", ctx.index());
                false
            }
        };
        // Out of slots, completions call this again.
        while readable && !lock(&self.io).free.is_empty() {
            let Some(chain) = ctx.pop_chain(&mem) else {
                break;
            };
            let parsed = Request::parse(chain, &*mem, &self.image.limits);
            self.start(ctx, &mem, parsed);
        }
        self.submit()?;
        if self.pending_notify {
            self.pending_notify = false;
            ctx.notify(&mem);
        }
        Ok(())
    }

    /// Submits what [`Self::push`] left queued (it submits at once; what
    /// stays is what the kernel refused then). Nothing queued, no system
    /// call.
    fn submit(&mut self) -> io::Result<()> {
        loop {
            let r = {
                let mut st = lock(&self.io);
                if st.ring.submission().is_empty() {
                    return Ok(());
                }
                st.ring.submit()
            };
            match r {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    // Completion queue full: reap first (the caller does).
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes the status byte and puts the chain on the used ring.
    fn complete(
        &mut self,
        ctx: &mut QueueContext,
        mem: &DeviceMemory,
        head: u16,
        status_at: Option<GuestAddress>,
        status: u8,
        data_len: u32,
    ) {
        let len = match status_at {
            Some(at) if mem.write_obj(status, at).is_ok() => data_len.saturating_add(1),
            _ => 0,
        };
        if let Err(e) = ctx.add_used(mem, head, len) {
            tracing::warn!("queue {}: cannot fill the used ring: {e}", ctx.index());
        }
        self.pending_notify = true;
    }

    fn start(
        &mut self,
        ctx: &mut QueueContext,
        mem: &DeviceMemoryGuard,
        parsed: Result<Request, Rejected>,
    ) {
        let req = match parsed {
            Ok(r) => r,
            Err(rej) => {
                tracing::debug!("queue {}: request refused: {}", ctx.index(), rej.error);
                self.complete(ctx, mem, rej.head, rej.status, rej.error.status(), 0);
                return;
            }
        };
        let (head, status) = (req.head, req.status);
        match req.kind {
            RequestKind::Read { sector, data } => {
                self.start_rw(ctx, mem, head, status, Op::Read, sector, data);
            }
            RequestKind::Write { sector, data } => {
                self.start_rw(ctx, mem, head, status, Op::Write, sector, data);
            }
            RequestKind::Flush => {
                let sqe = opcode::Fsync::new(types::Fd(self.image.file.as_raw_fd()))
                    .flags(types::FsyncFlags::DATASYNC)
                    .build();
                let flight = InFlight {
                    head,
                    status,
                    op: Op::Flush,
                    data: Vec::new(),
                    offset: 0,
                    total: 0,
                    iovecs: Box::new([]),
                    staging: None,
                    _mem: mem.clone(),
                    _dma: None,
                };
                self.push(ctx, mem, flight, sqe);
            }
            RequestKind::GetId { data } => {
                let mut off = 0usize;
                let mut ok = true;
                for s in &data {
                    let n = s.len as usize;
                    ok &= mem.write_slice(&self.id[off..off + n], s.addr).is_ok();
                    off += n;
                }
                let (st, len) = if ok {
                    (VIRTIO_BLK_S_OK, off as u32)
                } else {
                    (VIRTIO_BLK_S_IOERR, 0)
                };
                self.complete(ctx, mem, head, Some(status), st, len);
            }
            RequestKind::Discard(ranges) => {
                let st = discard::discard(&self.image.file, &ranges, false);
                self.complete(ctx, mem, head, Some(status), st, 0);
            }
            RequestKind::WriteZeroes(ranges) => {
                let st = discard::discard(&self.image.file, &ranges, true);
                self.complete(ctx, mem, head, Some(status), st, 0);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn start_rw(
        &mut self,
        ctx: &mut QueueContext,
        mem: &DeviceMemoryGuard,
        head: u16,
        status: GuestAddress,
        op: Op,
        sector: u64,
        data: Vec<Segment>,
    ) {
        let total: usize = data.iter().map(|s| s.len as usize).sum();
        if total == 0 {
            self.complete(ctx, mem, head, Some(status), VIRTIO_BLK_S_OK, 0);
            return;
        }
        let access = if op == Op::Read {
            Permissions::Write
        } else {
            Permissions::Read
        };
        let direct = match guest_iovecs(mem, &data, access) {
            Ok(v) => v,
            Err(()) => {
                self.complete(ctx, mem, head, Some(status), VIRTIO_BLK_S_IOERR, 0);
                return;
            }
        };
        let aligned = |v: &libc::iovec| {
            (v.iov_base as usize) % DIRECT_ALIGN == 0 && v.iov_len % DIRECT_ALIGN == 0
        };
        let use_direct =
            direct.len() <= IOV_MAX && (!self.image.direct || direct.iter().all(aligned));
        let (iovecs, staging) = if use_direct {
            (direct.into_boxed_slice(), None)
        } else {
            let Ok(mut buf) = AlignedBuf::new(total, BUF_ALIGN) else {
                tracing::warn!(
                    "queue {}: no memory for a {total}-byte staging buffer",
                    ctx.index()
                );
                self.complete(ctx, mem, head, Some(status), VIRTIO_BLK_S_IOERR, 0);
                return;
            };
            if op == Op::Write {
                let mut off = 0usize;
                for s in &data {
                    let n = s.len as usize;
                    if mem
                        .read_slice(&mut buf.as_mut_slice()[off..off + n], s.addr)
                        .is_err()
                    {
                        self.complete(ctx, mem, head, Some(status), VIRTIO_BLK_S_IOERR, 0);
                        return;
                    }
                    off += n;
                }
            }
            // The iovec points at the buffer's heap memory, which stays put
            // when `buf` moves into the request.
            let iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            (vec![iov].into_boxed_slice(), Some(buf))
        };
        let offset = sector * SECTOR_SIZE;
        let mut flight = InFlight {
            head,
            status,
            op,
            data,
            offset,
            total,
            iovecs,
            staging,
            _mem: mem.clone(),
            _dma: None,
        };
        if !self.image.nowait && total <= INLINE_MAX {
            // io_uring would hand this to a worker thread: copy it here,
            // under the batch's ticket (the caller's `dma_batch`).
            let (st, len) = flight.run_inline(&self.image.file, mem);
            self.complete(ctx, mem, head, Some(status), st, len);
            return;
        }
        // A staged write has already read the front end's memory.
        flight._dma = (op == Op::Read || flight.staging.is_none()).then(|| ctx.dma_ticket());
        let fd = types::Fd(self.image.file.as_raw_fd());
        // The iovecs are on the heap: moving them into `flight` left them
        // where the entry points.
        let (iov, n_iov) = (flight.iovecs.as_ptr(), flight.iovecs.len() as u32);
        let sqe = match op {
            Op::Read => opcode::Readv::new(fd, iov, n_iov).offset(offset).build(),
            _ => opcode::Writev::new(fd, iov, n_iov).offset(offset).build(),
        };
        self.push(ctx, mem, flight, sqe);
    }

    fn push(
        &mut self,
        ctx: &mut QueueContext,
        mem: &DeviceMemoryGuard,
        flight: InFlight,
        sqe: io_uring::squeue::Entry,
    ) {
        let popped = lock(&self.io).free.pop();
        let Some(slot) = popped else {
            // Cannot happen: callers check for a free slot first.
            self.complete(
                ctx,
                mem,
                flight.head,
                Some(flight.status),
                VIRTIO_BLK_S_IOERR,
                0,
            );
            return;
        };
        let sqe = sqe.user_data(slot as u64);
        loop {
            let mut st = lock(&self.io);
            // SAFETY: every pointer in `sqe` points at heap memory of
            // `flight` (its boxed iovec array, its staging buffer) or at the
            // front end's memory it keeps mapped; `flight` goes into
            // `slots[slot]` before the entry is submitted and stays there
            // until its completion is taken.
            if unsafe { st.ring.submission().push(&sqe) }.is_ok() {
                st.slots[slot] = Some(flight);
                st.in_flight += 1;
                // Submitted at once: an entry left in the queue would hold
                // its ticket while a later request's translation waits on
                // the front end.
                if let Err(e) = st.ring.submit() {
                    tracing::debug!("io_uring submit: {e} (retried at the next submit)");
                }
                return;
            }
            let r = st.ring.submit();
            drop(st);
            if let Err(e) = r {
                tracing::warn!("io_uring submit: {e}");
                self.reap(ctx);
            }
        }
    }

    /// Completes every request io_uring has finished.
    fn reap(&mut self, ctx: &mut QueueContext) {
        // The kernel is done with these requests' memory: their hold on
        // IOTLB invalidations ended when they were taken. The status and
        // used-ring writes below run under this batch's ticket, which a
        // miss wait parks (the front end may be waiting for an
        // invalidation's ack before it can answer that miss).
        let done = {
            let mut st = lock(&self.io);
            st.take_completions();
            std::mem::take(&mut st.done)
        };
        if done.is_empty() {
            return;
        }
        let _dma = ctx.dma_batch();
        let mem = ctx.memory();
        for (flight, res) in done {
            let (status, len) = flight.finish(&self.image.file, &mem, res);
            self.complete(ctx, &mem, flight.head, Some(flight.status), status, len);
        }
        if self.pending_notify {
            self.pending_notify = false;
            ctx.notify(&mem);
        }
        // Slots were freed: chains left waiting for one can start now
        // (unless the queue is stopping: then nothing new starts).
        if !self.stopping {
            if let Err(e) = self.process_avail(ctx) {
                tracing::warn!("queue {}: {e}", ctx.index());
            }
        }
    }
}
