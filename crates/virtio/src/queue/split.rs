//! [`SplitQueue`]: the driver side of a split virtqueue (virtio 1.x §2.7)
//! whose every device address comes from the DMA ops.
//!
//! Hand-written: no maintained crate offers a hosted driver-side queue built
//! on pluggable DMA ops (rust-vmm's `virtio-queue` is the device side).

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use iopath_dma::{DmaOps, Mapping};

use super::event::{need_event, ring_slot, used_pending};
use super::ring::{Layout, RingMem, AVAIL_F_NO_INTERRUPT, USED_F_NO_NOTIFY};
use crate::{DeviceError, Error, QueueConfig, QueueFeatures, Result};

mod add;
mod memory;

pub use add::Seg;
pub use memory::RingPlacement;
use memory::Tables;

/// Most entries in one indirect table (per request).
pub const INDIRECT_MAX: usize = 32;

/// A completed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The token given to [`SplitQueue::add`].
    pub token: u64,
    /// Bytes the device wrote into the request's device-writable segments
    /// (checked against their total length).
    pub len: u32,
}

/// The mappings of one request: most have one or two buffer segments
/// (the rest is coherent memory), kept without a heap allocation.
type Maps = smallvec::SmallVec<[Mapping; 2]>;

#[derive(Debug)]
struct InFlight {
    token: u64,
    /// Mappings the queue made for this request (unmapped on completion).
    maps: Maps,
    /// Descriptors taken from the main table.
    ndesc: u16,
    /// Total device-writable bytes offered.
    writable: u64,
}

/// Driver side of one split virtqueue over DMA ops `O`.
///
/// `O` may be a concrete ops type (static dispatch) or `dyn DmaOps`
/// (dynamic dispatch, chosen at run time): `SplitQueue<Direct>` and
/// `SplitQueue<dyn DmaOps>` are the same code.
///
/// The ring memory (with the indirect tables, when negotiated, and the
/// driver's area of [`SplitQueue::with_area`]) is coherent memory from
/// the ops; the transport must share the ops' regions
/// with the device before the device uses the queue. Drop the queue only
/// after the device has been reset or has stopped using it.
#[derive(Debug)]
pub struct SplitQueue<O: DmaOps + ?Sized> {
    ops: Arc<O>,
    index: u16,
    layout: Layout,
    ring: Option<RingMem>,
    /// Indirect tables: one of `INDIRECT_MAX` entries per descriptor head.
    indirect: Option<Tables>,
    /// The driver's area ([`SplitQueue::with_area`]): its offset in the
    /// ring memory and its length.
    area: (usize, usize),
    features: QueueFeatures,
    /// Shadow of each descriptor's `next` (never read back from shared memory).
    next: Vec<u16>,
    free_head: u16,
    num_free: u16,
    /// Next available ring entry to write (requests added so far).
    avail_idx: u16,
    /// `avail.idx` as published: entries from it to `avail_idx` are held
    /// (see [`SplitQueue::hold`]).
    published: u16,
    /// Whether added requests wait for [`SplitQueue::publish`].
    hold: bool,
    /// The heads held, oldest first (a shadow: the ring entries are in
    /// shared memory).
    held_heads: std::collections::VecDeque<u16>,
    /// `avail.idx` at the last notification decision.
    kicked_idx: u16,
    /// Next used index to consume.
    last_used: u16,
    avail_flags: u16,
    inflight: Vec<Option<InFlight>>,
    /// Entries of `inflight` that are `Some` (asked per submission: not
    /// counted by a scan).
    in_flight: usize,
    broken: bool,
    /// The rings are a [`RingPlacement`]: not ours to free.
    placed: bool,
    /// Report length 0 for completions of requests with nothing for the
    /// device to write, whatever length the device put (see
    /// [`SplitQueue::ignore_readonly_used_len`]).
    ignore_readonly_len: bool,
    /// Requests of at most this many segments are chained in the main
    /// table while it has room, even with indirect descriptors (see
    /// [`SplitQueue::chain_up_to`]).
    chain_max: usize,
}

impl<O: DmaOps + ?Sized> SplitQueue<O> {
    /// Queue index.
    pub fn index(&self) -> u16 {
        self.index
    }

    /// Number of entries.
    pub fn size(&self) -> u16 {
        self.layout.size
    }

    /// The DMA ops.
    pub fn ops(&self) -> &Arc<O> {
        &self.ops
    }

    /// Free descriptors.
    pub fn num_free(&self) -> u16 {
        self.num_free
    }

    /// Requests added and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether an earlier device error broke the queue.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Whether to accept any used length for a request that offered the
    /// device nothing to write, reporting 0 (off by default: such a length
    /// breaks the queue). For rpmsg: OpenAMP's device role returns sent
    /// buffers with their full length as used length, and Linux's
    /// `virtio_rpmsg_bus` ignores it.
    pub fn ignore_readonly_used_len(&mut self, on: bool) {
        self.ignore_readonly_len = on;
    }

    /// Chains requests of at most `segs` segments in the main descriptor
    /// table while it has room for them, and puts only longer ones (or
    /// any, when the table is short of room) in an indirect table. By
    /// default (1) every request of several segments goes indirect when
    /// negotiated, as Linux's `virtqueue_use_indirect` does ("FIXME: tune
    /// this threshold"). An indirect table costs the device one more read
    /// and translation per request: for a block driver's small requests
    /// (header, data, status) a chain of three is cheaper, and a ring of
    /// 256 holds 85 of them.
    pub fn chain_up_to(&mut self, segs: usize) {
        self.chain_max = segs.max(1);
    }

    /// What the transport tells the device about this queue.
    pub fn config(&self) -> QueueConfig {
        let base = self.ring().addr();
        QueueConfig {
            size: self.layout.size,
            desc: base,
            avail: base + self.layout.avail as u64,
            used: base + self.layout.used as u64,
            event_idx: self.features.event_idx,
        }
    }

    /// Whether the device wants a notification for the requests added since
    /// the last call (§2.7.13.4): with `EVENT_IDX`, whether `avail_event` was
    /// passed; without, whether `VIRTQ_USED_F_NO_NOTIFY` is clear. `false`
    /// when nothing was added since the last call.
    pub fn should_notify(&mut self) -> bool {
        let old = self.kicked_idx;
        let new = self.published;
        if old == new {
            // Nothing published since the last decision: nothing to order
            // (a wait for completions asks this before every sleep).
            return false;
        }
        self.kicked_idx = new;
        // §2.7.13.4: a full barrier between publishing avail.idx and reading
        // the device's suppression fields, or a notification may be missed.
        fence(Ordering::SeqCst);
        if self.features.event_idx {
            let event = self.ring().read_u16(self.layout.avail_event());
            need_event(event, new, old)
        } else {
            self.ring().read_u16(self.layout.used_flags()) & USED_F_NO_NOTIFY == 0
        }
    }

    /// Holds the requests added from now on back from the device (`true`):
    /// their descriptors and ring entries are written, but `avail.idx`
    /// moves only with [`SplitQueue::publish`]. A driver can so build its
    /// next request while the device works on the last one, and hand it
    /// over with one store when a completion frees its turn. `false`
    /// publishes what is held.
    pub fn hold(&mut self, on: bool) {
        self.hold = on;
        if !on {
            self.publish(u16::MAX);
        }
    }

    /// Requests added and not yet published.
    pub fn held(&self) -> u16 {
        self.avail_idx.wrapping_sub(self.published)
    }

    /// Publishes up to `n` held requests, oldest first (§2.7.13.3: a
    /// Release store of `avail.idx` after their entries). Returns how many.
    /// The caller then asks [`SplitQueue::should_notify`].
    pub fn publish(&mut self, n: u16) -> u16 {
        self.publish_each(n, |_| {})
    }

    /// [`SplitQueue::publish`], then `each` with the token of every
    /// request published, oldest first (after the store: nothing it does
    /// delays the device).
    pub fn publish_each(&mut self, n: u16, mut each: impl FnMut(u64)) -> u16 {
        let n = n.min(self.held());
        if n > 0 {
            self.published = self.published.wrapping_add(n);
            self.ring()
                .store_idx(self.layout.avail_idx(), self.published, Ordering::Release);
            for head in self.held_heads.drain(..usize::from(n)) {
                if let Some(r) = &self.inflight[usize::from(head)] {
                    each(r.token);
                }
            }
        }
        n
    }

    /// Completions the device has published and the driver not yet taken.
    pub fn used_pending(&self) -> u16 {
        let used = self
            .ring()
            .load_idx(self.layout.used_idx(), Ordering::Acquire);
        used.wrapping_sub(self.last_used)
    }

    /// Whether the device has published completions not yet taken.
    pub fn has_used(&self) -> bool {
        self.ring()
            .load_idx(self.layout.used_idx(), Ordering::Acquire)
            != self.last_used
    }

    /// Takes the next completion, if any: unmaps its segments (bounced data
    /// is copied back) and frees its descriptors.
    ///
    /// # Errors
    /// [`Error::Device`] when the device published an id out of range or not
    /// in flight, a length above the writable bytes, or moved `used.idx` by
    /// more than the queue size: the queue is then broken
    /// ([`Error::Broken`] afterwards). [`Error::Dma`] if unmapping failed
    /// (the descriptors are freed anyway).
    pub fn pop_used(&mut self) -> Result<Option<Completion>> {
        if self.broken {
            return Err(Error::Broken);
        }
        let size = self.layout.size;
        // §2.7.14: read used.idx, then the elements it covers; Acquire keeps
        // the element reads after the index read.
        let used_idx = self
            .ring()
            .load_idx(self.layout.used_idx(), Ordering::Acquire);
        match used_pending(used_idx, self.last_used, size) {
            None => {
                return Err(self.break_queue(DeviceError::UsedIdxJump {
                    last: self.last_used,
                    idx: used_idx,
                    size,
                }))
            }
            Some(0) => return Ok(None),
            Some(_) => {}
        }
        let elem = self.layout.used_elem(ring_slot(self.last_used, size));
        let id = self.ring().read_u32(elem);
        let mut len = self.ring().read_u32(elem + 4);
        if id >= size as u32 {
            return Err(self.break_queue(DeviceError::UsedIdOutOfRange { id, size }));
        }
        // A request held back was never given to the device (a scan of
        // the few held, only while some are).
        if self.held_heads.contains(&(id as u16)) {
            return Err(self.break_queue(DeviceError::UsedIdNotInFlight { id }));
        }
        let Some(req) = self.inflight[id as usize].take() else {
            return Err(self.break_queue(DeviceError::UsedIdNotInFlight { id }));
        };
        if req.writable == 0 && self.ignore_readonly_len {
            len = 0;
        }
        if len as u64 > req.writable {
            let max = req.writable;
            self.inflight[id as usize] = Some(req);
            return Err(self.break_queue(DeviceError::UsedLenTooLarge { id, len, max }));
        }
        self.last_used = self.last_used.wrapping_add(1);
        self.in_flight -= 1;
        self.free_chain(id as u16, req.ndesc);
        if self.avail_flags & AVAIL_F_NO_INTERRUPT == 0 && self.features.event_idx {
            // §2.7.10: ask for an interrupt at the next used entry; the full
            // barrier orders this store before the next used.idx read.
            self.ring()
                .write_u16(self.layout.used_event(), self.last_used);
            fence(Ordering::SeqCst);
        }
        let mut first_err = None;
        for m in &req.maps {
            if let Err(e) = self.ops.unmap(m) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(Some(Completion {
                token: req.token,
                len,
            })),
        }
    }

    fn free_chain(&mut self, head: u16, ndesc: u16) {
        let mut last = head;
        for _ in 1..ndesc {
            last = self.next[last as usize];
        }
        self.next[last as usize] = self.free_head;
        self.free_head = head;
        self.num_free += ndesc;
    }

    fn break_queue(&mut self, e: DeviceError) -> Error {
        tracing::error!(queue = self.index, error = %e, "virtqueue broken by device");
        self.broken = true;
        Error::Device(e)
    }

    /// Asks the device not to interrupt (a hint, §2.7.7): the flag, or
    /// with `EVENT_IDX` a `used_event` the device has already passed, so
    /// that it interrupts again only after 2^16 completions (a poller
    /// re-enables long before).
    pub fn disable_interrupts(&mut self) {
        if self.avail_flags & AVAIL_F_NO_INTERRUPT != 0 {
            // Already asked (as Linux's `virtqueue_disable_cb`): a stale
            // `used_event` stays passed until 2^16 more completions.
            return;
        }
        self.avail_flags |= AVAIL_F_NO_INTERRUPT;
        if self.features.event_idx {
            self.ring()
                .write_u16(self.layout.used_event(), self.last_used.wrapping_sub(1));
        } else {
            self.ring()
                .write_u16(self.layout.avail_flags(), self.avail_flags);
        }
    }

    /// Asks the device to interrupt at the next completion. Returns `false`
    /// if completions are already pending (take them before sleeping, or an
    /// interrupt may never come; §2.7.10).
    pub fn enable_interrupts(&mut self) -> bool {
        self.enable_interrupts_after(0)
    }

    /// Asks the device to interrupt once more than `n` completions are
    /// pending: with `EVENT_IDX`, `used_event` set `n` entries ahead
    /// (§2.7.10; Linux's `virtqueue_enable_cb_delayed` does the same), so
    /// that a driver with many requests in flight wakes to a batch while
    /// the device still has work; without it, at the next completion
    /// (`n` is then taken as 0). Returns `false` if more than `n` are
    /// already pending (take them before sleeping).
    pub fn enable_interrupts_after(&mut self, n: u16) -> bool {
        self.avail_flags &= !AVAIL_F_NO_INTERRUPT;
        let n = if self.features.event_idx {
            self.ring()
                .write_u16(self.layout.used_event(), self.last_used.wrapping_add(n));
            n
        } else {
            self.ring()
                .write_u16(self.layout.avail_flags(), self.avail_flags);
            0
        };
        // §2.7.10: the suppression write must be visible before re-reading
        // used.idx, or a completion in between would go unsignalled.
        fence(Ordering::SeqCst);
        let used = self
            .ring()
            .load_idx(self.layout.used_idx(), Ordering::Acquire);
        used.wrapping_sub(self.last_used) <= n
    }

    /// Unmaps the mappings of every request still in flight and forgets the
    /// requests, returning their tokens. Call after the device was reset.
    ///
    /// # Errors
    /// [`Error::Dma`] (the first unmap error; all are attempted).
    pub fn detach_all(&mut self) -> Result<Vec<u64>> {
        let mut tokens = Vec::new();
        let mut first_err = None;
        self.held_heads.clear();
        for i in 0..self.inflight.len() {
            if let Some(req) = self.inflight[i].take() {
                self.in_flight -= 1;
                for m in &req.maps {
                    if let Err(e) = self.ops.unmap(m) {
                        first_err.get_or_insert(e);
                    }
                }
                self.free_chain(i as u16, req.ndesc);
                tokens.push(req.token);
            }
        }
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(tokens),
        }
    }
}

impl<O: DmaOps + ?Sized> Drop for SplitQueue<O> {
    fn drop(&mut self) {
        if let Err(e) = self.detach_all() {
            tracing::warn!(queue = self.index, error = %e, "unmap on queue drop failed");
        }
        self.free_memory();
    }
}
