//! The one type that touches ring memory: [`RingMem`], a coherent DMA
//! allocation accessed with volatile and atomic operations only.

use std::sync::atomic::Ordering;

use iopath_dma::{Coherent, DmaAddr};
use iopath_heap::BufRange;

use virtio_bindings::virtio_ring as vr;

/// Split-ring descriptor flags (§2.7.5), from `virtio-bindings`.
pub(crate) const DESC_F_NEXT: u16 = vr::VRING_DESC_F_NEXT as u16;
pub(crate) const DESC_F_WRITE: u16 = vr::VRING_DESC_F_WRITE as u16;
pub(crate) const DESC_F_INDIRECT: u16 = vr::VRING_DESC_F_INDIRECT as u16;
/// `VIRTQ_AVAIL_F_NO_INTERRUPT` (§2.7.6).
pub(crate) const AVAIL_F_NO_INTERRUPT: u16 = vr::VRING_AVAIL_F_NO_INTERRUPT as u16;
/// `VIRTQ_USED_F_NO_NOTIFY` (§2.7.8).
pub(crate) const USED_F_NO_NOTIFY: u16 = vr::VRING_USED_F_NO_NOTIFY as u16;
/// Size of one descriptor (§2.7.5).
pub(crate) const DESC_SIZE: usize = 16;

/// Coherent memory shared with the device. The device may write it at any
/// time, so it is reached only through the heap's bounds-checked range
/// ([`BufRange`]): volatile copies and atomics, never a Rust reference.
///
/// A queue's own allocation also holds its indirect tables and the
/// driver's area after the rings. The ring may instead be a window
/// (`base..base + len`) of a larger coherent region, when the platform
/// fixes where rings go (a remoteproc resource table's vrings inside the
/// shared memory).
#[derive(Debug)]
pub(crate) struct RingMem {
    mem: Coherent,
    base: usize,
    len: usize,
}

impl RingMem {
    pub(crate) fn new(mem: Coherent) -> Self {
        let len = mem.len();
        RingMem { mem, base: 0, len }
    }

    /// The window `base..base + len` of `mem`; `None` if it does not fit or
    /// is not 16-byte aligned (descriptor table alignment, §2.7).
    pub(crate) fn window(mem: Coherent, base: usize, len: usize) -> Option<Self> {
        let fits = base.checked_add(len).is_some_and(|e| e <= mem.len());
        (fits && base % DESC_SIZE == 0 && mem.buffer().addr() % DESC_SIZE == 0).then_some(RingMem {
            mem,
            base,
            len,
        })
    }

    pub(crate) fn addr(&self) -> DmaAddr {
        self.mem.addr() + self.base as u64
    }

    pub(crate) fn into_inner(self) -> Coherent {
        self.mem
    }

    /// The ring's bytes (the window was checked to fit when made). Coherent
    /// memory: the region may also hold buffers mapped for the device (an
    /// rpmsg shared-memory region), which must not stop ring updates.
    #[inline]
    fn range(&self) -> BufRange<'_> {
        ring_access(
            self.mem.buffer().coherent_range(self.base, self.len),
            self,
            0,
        )
    }

    /// Copies `src` in at `off` (the driver's area of the queue's memory).
    pub(crate) fn write(&self, off: usize, src: &[u8]) -> iopath_heap::Result<()> {
        self.range().sub(off, src.len())?.copy_from(src)
    }

    /// Copies `dst.len()` bytes out from `off`.
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) -> iopath_heap::Result<()> {
        self.range().sub(off, dst.len())?.copy_to(dst)
    }

    /// Zeroes the whole ring (a window is not fresh from `alloc_coherent`).
    pub(crate) fn zero(&self) {
        ring_access(self.range().fill(0), self, 0);
    }

    pub(crate) fn write_u16(&self, off: usize, v: u16) {
        ring_access(self.range().write_u16(off, v.to_le()), self, off);
    }

    pub(crate) fn read_u16(&self, off: usize) -> u16 {
        u16::from_le(ring_access(self.range().read_u16(off), self, off))
    }

    pub(crate) fn read_u32(&self, off: usize) -> u32 {
        u32::from_le(ring_access(self.range().read_u32(off), self, off))
    }

    /// Writes descriptor `i` of a table starting at `base` (§2.7.5:
    /// le64 addr, le32 len, le16 flags, le16 next).
    pub(crate) fn write_desc(
        &self,
        base: usize,
        i: usize,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let off = base + i * DESC_SIZE;
        // One copy of the whole descriptor: the device reads it only after
        // the avail index's Release store, so it need not be written field
        // by field (one bounds check instead of five).
        let mut d = [0u8; DESC_SIZE];
        d[..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..].copy_from_slice(&next.to_le_bytes());
        let wrote = self
            .range()
            .sub(off, DESC_SIZE)
            .and_then(|r| r.copy_from(&d));
        ring_access(wrote, self, off);
    }

    /// Atomic store of a little-endian u16 index (`avail.idx`), so that
    /// Release orders the ring contents before it.
    pub(crate) fn store_idx(&self, off: usize, v: u16, order: Ordering) {
        ring_access(self.range().store_u16(off, v.to_le(), order), self, off);
    }

    /// Atomic load of a little-endian u16 index (`used.idx`), so that
    /// Acquire orders the ring contents after it.
    pub(crate) fn load_idx(&self, off: usize, order: Ordering) -> u16 {
        u16::from_le(ring_access(self.range().load_u16(off, order), self, off))
    }
}

/// The value of a ring access. Offsets are the queue's own arithmetic
/// (device-provided values are range-checked before they become offsets),
/// so a failure here is a bug in this crate.
#[inline]
#[track_caller]
fn ring_access<T>(r: iopath_heap::Result<T>, ring: &RingMem, off: usize) -> T {
    r.unwrap_or_else(|e| {
        panic!(
            "ring access at {off} of coherent memory of {} bytes: {e}",
            ring.len
        )
    })
}

/// Where the parts of a split ring of `size` entries sit in one allocation
/// (§2.7: descriptor table 16-aligned, available ring 2-aligned, used ring
/// 4-aligned), as byte offsets from the descriptor table. The one ring
/// layout of iopath: the driver's queues and rpmsg's ring placement
/// (remoteproc vrings `{da, align, num}`) both use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub(crate) size: u16,
    pub(crate) avail: usize,
    pub(crate) used: usize,
    pub(crate) total: usize,
}

impl Layout {
    pub(crate) fn new(size: u16) -> Self {
        Self::with_align(size, 4)
    }

    /// The legacy layout (§2.7.2 legacy interfaces): the used ring starts at
    /// the next multiple of `align` (a power of two, at least 4), as
    /// remoteproc vrings `{da, align, num}` are laid out.
    pub(crate) fn with_align(size: u16, align: usize) -> Self {
        let n = size as usize;
        let avail = DESC_SIZE * n;
        // flags, idx, ring[n], used_event
        let avail_len = 2 + 2 + 2 * n + 2;
        let used = (avail + avail_len).next_multiple_of(align);
        // flags, idx, ring[n] of {le32 id, le32 len}, avail_event
        let used_len = 2 + 2 + 8 * n + 2;
        Layout {
            size,
            avail,
            used,
            total: used + used_len,
        }
    }

    /// The legacy layout (§2.7.2) of a ring of `size` entries with the used
    /// ring aligned to `align`, checked: `None` unless `size` is a power of
    /// two (so at most 32768, the split ring's limit) and `align` a power of
    /// two of at least 4.
    pub fn legacy(size: u16, align: usize) -> Option<Self> {
        (size.is_power_of_two() && align.is_power_of_two() && align >= 4)
            .then(|| Self::with_align(size, align))
    }

    /// Entries.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Offset of the available ring.
    pub fn avail_offset(&self) -> usize {
        self.avail
    }

    /// Offset of the used ring.
    pub fn used_offset(&self) -> usize {
        self.used
    }

    /// Bytes from the descriptor table to the end of the used ring (the
    /// kernel's `vring_size()`).
    pub fn total(&self) -> usize {
        self.total
    }

    pub(crate) fn avail_flags(&self) -> usize {
        self.avail
    }
    pub(crate) fn avail_idx(&self) -> usize {
        self.avail + 2
    }
    pub(crate) fn avail_ring(&self, slot: u16) -> usize {
        self.avail + 4 + 2 * slot as usize
    }
    /// Offset of `used_event` (after the available ring's entries).
    pub fn used_event(&self) -> usize {
        self.avail + 4 + 2 * self.size as usize
    }
    pub(crate) fn used_flags(&self) -> usize {
        self.used
    }
    pub(crate) fn used_idx(&self) -> usize {
        self.used + 2
    }
    pub(crate) fn used_elem(&self, slot: u16) -> usize {
        self.used + 4 + 8 * slot as usize
    }
    /// Offset of `avail_event` (after the used ring's entries).
    pub fn avail_event(&self) -> usize {
        self.used + 4 + 8 * self.size as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// §2.7 alignment and sizes for every legal queue size: descriptor
        /// table 16-aligned at 0, available ring 2-aligned right after it,
        /// used ring 4-aligned after the available ring; every field inside
        /// the allocation and no part overlapping another.
        #[test]
        fn layout_alignment(shift in 0u32..16) {
            let size = 1u16 << shift;
            let l = Layout::new(size);
            let n = size as usize;
            prop_assert_eq!(l.avail, 16 * n);
            prop_assert_eq!(l.avail % 2, 0);
            prop_assert_eq!(l.used % 4, 0);
            prop_assert!(l.used >= l.used_event() + 2, "avail ring ends before the used ring");
            prop_assert_eq!(l.avail_ring(size - 1) + 2, l.used_event());
            prop_assert_eq!(l.used_elem(size - 1) + 8, l.avail_event());
            prop_assert_eq!(l.avail_event() + 2, l.total);
            prop_assert_eq!(l.used_elem(0) % 4, 0);
            prop_assert!(l.used - (l.used_event() + 2) < 4, "at most alignment padding");
        }
    }
}
