//! A [`SplitQueue`]'s memory: where its rings, indirect tables and the
//! driver's area are, allocated from the DMA ops as one region or placed
//! by the platform, and the driver's reads and writes of its area.

use std::sync::Arc;

use iopath_dma::{Coherent, DmaOps};

use super::{SplitQueue, INDIRECT_MAX};
use crate::queue::ring::{Layout, RingMem, DESC_SIZE};
use crate::{Error, QueueFeatures, Result};

/// Where a queue's rings go when the platform fixes it rather than the ops
/// allocating them: a window of coherent memory the device already sees
/// (e.g. a remoteproc resource table's vring `{da, align, num}` inside the
/// shared memory: `mem` is the whole region, `offset` is `da` minus its
/// device base). The legacy layout is used: the used ring starts at the
/// next multiple of `align`. The queue zeroes the window and never frees
/// `mem`.
#[derive(Debug)]
pub struct RingPlacement {
    /// The region holding the rings.
    pub mem: Coherent,
    /// Start of the descriptor table in `mem` (16-byte aligned).
    pub offset: usize,
    /// Used-ring alignment (a power of two, at least 4).
    pub align: usize,
}

/// Where a queue's indirect tables are.
#[derive(Debug)]
pub(super) enum Tables {
    /// After the rings, at this offset of the ring memory.
    InRing(usize),
    /// In coherent memory of their own (rings the platform placed).
    Own(RingMem),
}

/// A queue size is a power of two up to 32768 (§2.7).
fn check_size(size: u16) -> Result<()> {
    match size.is_power_of_two() && size <= 32768 {
        true => Ok(()),
        false => Err(Error::BadQueueSize { size, max: 32768 }),
    }
}

impl<O: DmaOps + ?Sized> SplitQueue<O> {
    /// Allocates queue `index` with `size` entries (a power of two up to
    /// 32768) in coherent memory from `ops`, using the negotiated `features`.
    ///
    /// # Errors
    /// [`Error::BadQueueSize`], [`Error::Dma`] if the ops cannot allocate.
    pub fn new(ops: Arc<O>, index: u16, size: u16, features: QueueFeatures) -> Result<Self> {
        Self::with_area(ops, index, size, features, 0)
    }

    /// [`SplitQueue::new`] with `per_entry` bytes of coherent memory per
    /// ring entry for the driver's own use (a block request's header and
    /// status): see [`Seg::area`](super::Seg::area),
    /// [`SplitQueue::area_write`] and [`SplitQueue::area_read`].
    ///
    /// The rings, the indirect tables and the area are one allocation, so
    /// the device sees one region for the queue: a vhost-user back end
    /// looks every address up among the regions it was given, and each
    /// region more lengthens that search. The allocation is about
    /// `size × (512 + per_entry)` bytes with indirect tables (their 32
    /// entries per head), plus the rings.
    ///
    /// # Errors
    /// As [`SplitQueue::new`].
    pub fn with_area(
        ops: Arc<O>,
        index: u16,
        size: u16,
        features: QueueFeatures,
        per_entry: usize,
    ) -> Result<Self> {
        check_size(size)?;
        let layout = Layout::new(size);
        // Each part starts on a cache line of its own.
        let tables = layout.total.next_multiple_of(64);
        let tables_len = match features.indirect {
            true => usize::from(size) * INDIRECT_MAX * DESC_SIZE,
            false => 0,
        };
        let area = (tables + tables_len).next_multiple_of(64);
        let area_len = per_entry.saturating_mul(usize::from(size));
        let ring = RingMem::new(ops.alloc_coherent(area.saturating_add(area_len))?);
        let mut q = Self::build(ops, index, layout, ring, features);
        q.indirect = features.indirect.then_some(Tables::InRing(tables));
        q.area = (area, area_len);
        Ok(q)
    }

    /// Queue `index` with `size` entries whose rings sit where `place` says
    /// (legacy layout, see [`RingPlacement`]) instead of in memory from the
    /// ops. Indirect tables, if negotiated, still come from the ops.
    ///
    /// # Errors
    /// [`Error::BadQueueSize`]; [`Error::BadPlacement`] if the alignment is
    /// not a power of two of at least 4, or the rings do not fit `mem` at a
    /// 16-byte aligned `offset`; [`Error::Dma`].
    pub fn with_placement(
        ops: Arc<O>,
        index: u16,
        size: u16,
        features: QueueFeatures,
        place: RingPlacement,
    ) -> Result<Self> {
        check_size(size)?;
        let RingPlacement { mem, offset, align } = place;
        if align < 4 || !align.is_power_of_two() {
            return Err(Error::BadPlacement {
                offset,
                align,
                region: mem.len(),
            });
        }
        let layout = Layout::with_align(size, align);
        let region = mem.len();
        let ring = RingMem::window(mem, offset, layout.total).ok_or(Error::BadPlacement {
            offset,
            align,
            region,
        })?;
        ring.zero();
        let indirect = match features.indirect {
            true => Some(Tables::Own(RingMem::new(
                ops.alloc_coherent(usize::from(size) * INDIRECT_MAX * DESC_SIZE)?,
            ))),
            false => None,
        };
        let mut q = Self::build(ops, index, layout, ring, features);
        (q.indirect, q.placed) = (indirect, true);
        Ok(q)
    }

    /// A queue on `ring`, with no indirect tables and no area (the
    /// constructors set them), not placed.
    fn build(
        ops: Arc<O>,
        index: u16,
        layout: Layout,
        ring: RingMem,
        features: QueueFeatures,
    ) -> Self {
        let size = layout.size;
        let next = (0..size).map(|i| i.wrapping_add(1)).collect();
        let mut q = SplitQueue {
            ops,
            index,
            layout,
            ring: Some(ring),
            indirect: None,
            area: (0, 0),
            features,
            next,
            free_head: 0,
            num_free: size,
            avail_idx: 0,
            published: 0,
            hold: false,
            held_heads: std::collections::VecDeque::new(),
            kicked_idx: 0,
            last_used: 0,
            avail_flags: 0,
            inflight: (0..size).map(|_| None).collect(),
            in_flight: 0,
            broken: false,
            placed: false,
            ignore_readonly_len: false,
            chain_max: 1,
        };
        // Interrupts on from the start: used_event 0 (§2.7.10).
        q.enable_interrupts();
        q
    }

    pub(super) fn ring(&self) -> &RingMem {
        self.ring.as_ref().expect("ring lives until drop")
    }

    /// The indirect tables' memory and where they start in it.
    pub(super) fn tables(&self) -> Option<(&RingMem, usize)> {
        match self.indirect.as_ref()? {
            Tables::InRing(at) => Some((self.ring(), *at)),
            Tables::Own(mem) => Some((mem, 0)),
        }
    }

    /// Where `len` bytes at `offset` of the driver's area are in the ring
    /// memory.
    pub(super) fn area_at(&self, offset: usize, len: usize) -> Result<usize> {
        match offset.checked_add(len) {
            Some(end) if end <= self.area.1 => Ok(self.area.0 + offset),
            _ => Err(iopath_dma::Error::from(iopath_heap::Error::OutOfRange {
                offset,
                len,
                buf_len: self.area.1,
            })
            .into()),
        }
    }

    /// Writes `src` at `offset` of the driver's area.
    ///
    /// # Errors
    /// [`Error::Dma`] if it does not fit the area.
    pub fn area_write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let at = self.area_at(offset, src.len())?;
        self.ring()
            .write(at, src)
            .map_err(|e| iopath_dma::Error::from(e).into())
    }

    /// Reads `dst.len()` bytes at `offset` of the driver's area.
    ///
    /// # Errors
    /// [`Error::Dma`] if it does not fit the area.
    pub fn area_read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let at = self.area_at(offset, dst.len())?;
        self.ring()
            .read(at, dst)
            .map_err(|e| iopath_dma::Error::from(e).into())
    }

    /// Frees the memory the queue allocated: its ring memory (unless the
    /// platform placed the rings) and indirect tables of their own.
    pub(super) fn free_memory(&mut self) {
        let ring = self.ring.take().filter(|_| !self.placed);
        let tables = match self.indirect.take() {
            Some(Tables::Own(mem)) => Some(mem),
            _ => None,
        };
        for mem in [ring, tables].into_iter().flatten() {
            if let Err(e) = self.ops.free_coherent(mem.into_inner()) {
                tracing::warn!(queue = self.index, error = %e, "free_coherent on queue drop failed");
            }
        }
    }
}
