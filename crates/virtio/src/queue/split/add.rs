//! Adding a request to a [`SplitQueue`]: its segments ([`Seg`]) mapped
//! through the DMA ops, its descriptors written (one indirect table when
//! negotiated), and its head published on the available ring (§2.7.13).

use std::sync::atomic::Ordering;

use iopath_dma::{Coherent, Direction, DmaAddr, DmaOps, MapWait, Mapping};
use iopath_heap::Buffer;

use smallvec::SmallVec;

use super::{InFlight, Maps, SplitQueue, INDIRECT_MAX};
use crate::queue::event::ring_slot;
use crate::queue::ring::{DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE, DESC_SIZE};
use crate::{Error, Result};

/// One buffer segment of a request.
#[derive(Debug, Clone, Copy)]
pub enum Seg<'a> {
    /// A heap buffer range: the queue maps it through the DMA ops when the
    /// request is added and unmaps it when the request completes (so bounced
    /// data is copied back before the completion is returned).
    Buf {
        /// The buffer.
        buf: &'a Buffer,
        /// Start in the buffer.
        offset: usize,
        /// Length in bytes.
        len: usize,
    },
    /// A range of coherent memory (already visible to the device; no mapping).
    Coherent {
        /// The memory.
        mem: &'a Coherent,
        /// Start in it.
        offset: usize,
        /// Length in bytes.
        len: usize,
    },
    /// A mapping the caller made and keeps (the queue does not unmap it).
    Mapped(&'a Mapping),
    /// A range of the queue's own driver area
    /// ([`SplitQueue::with_area`]; coherent, no mapping).
    Area {
        /// Start in the area.
        offset: usize,
        /// Length in bytes.
        len: usize,
    },
}

impl<'a> Seg<'a> {
    /// `len` bytes of `buf` at `offset`.
    pub fn buf(buf: &'a Buffer, offset: usize, len: usize) -> Self {
        Seg::Buf { buf, offset, len }
    }

    /// All of `buf`.
    pub fn whole(buf: &'a Buffer) -> Self {
        Seg::Buf {
            buf,
            offset: 0,
            len: buf.len(),
        }
    }

    /// `len` bytes of coherent memory at `offset`.
    pub fn coherent(mem: &'a Coherent, offset: usize, len: usize) -> Self {
        Seg::Coherent { mem, offset, len }
    }

    /// `len` bytes at `offset` of the queue's driver area.
    pub fn area(offset: usize, len: usize) -> Self {
        Seg::Area { offset, len }
    }

    fn len(&self) -> usize {
        match self {
            Seg::Buf { len, .. } | Seg::Coherent { len, .. } | Seg::Area { len, .. } => *len,
            Seg::Mapped(m) => m.len(),
        }
    }
}

impl<O: DmaOps + ?Sized> SplitQueue<O> {
    /// Adds a request: `out` segments the device reads, then `inp` segments
    /// it writes. `token` comes back in the [`Completion`](super::Completion). The caller then
    /// asks [`SplitQueue::should_notify`] and kicks the transport if so.
    ///
    /// Uses one indirect descriptor when negotiated and the request has more
    /// than one segment, unless it is short enough to chain
    /// ([`SplitQueue::chain_up_to`]) and the table has room.
    ///
    /// # Errors
    /// [`Error::EmptyRequest`], [`Error::SegmentTooLong`],
    /// [`Error::QueueFull`] (nothing was added; retry after completions),
    /// [`Error::Dma`] (a mapping failed; nothing stays mapped),
    /// [`Error::Broken`].
    pub fn add(&mut self, out: &[Seg<'_>], inp: &[Seg<'_>], token: u64) -> Result<u16> {
        self.add_wait(out, inp, token, MapWait::Block)
    }

    /// [`SplitQueue::add`] with the caller's choice of waiting for DMA space
    /// (bounce slots, IOVAs).
    ///
    /// # Errors
    /// As [`SplitQueue::add`].
    pub fn add_wait(
        &mut self,
        out: &[Seg<'_>],
        inp: &[Seg<'_>],
        token: u64,
        wait: MapWait,
    ) -> Result<u16> {
        if self.broken {
            return Err(Error::Broken);
        }
        let total = out.len() + inp.len();
        if total == 0 {
            return Err(Error::EmptyRequest);
        }
        for s in out.iter().chain(inp) {
            if u32::try_from(s.len()).is_err() {
                return Err(Error::SegmentTooLong { len: s.len() });
            }
        }
        let chain = total <= self.chain_max && total <= self.num_free as usize;
        let use_indirect = self.indirect.is_some() && !chain && total > 1 && total <= INDIRECT_MAX;
        let needed = if use_indirect { 1 } else { total };
        if needed > self.num_free as usize {
            return Err(Error::QueueFull {
                needed,
                free: self.num_free as usize,
            });
        }

        // Map every segment first, so a failure leaves nothing behind.
        // A request of a few segments (a block request's header, data and
        // status) stays off the heap.
        let mut maps = Maps::new();
        let mut descs: SmallVec<[(DmaAddr, u32, u16); 4]> = SmallVec::with_capacity(total);
        let mut writable = 0u64;
        let segs = out
            .iter()
            .map(|s| (s, Direction::ToDevice))
            .chain(inp.iter().map(|s| (s, Direction::FromDevice)));
        for (seg, dir) in segs {
            let addr = match self.seg_addr(seg, dir, wait) {
                Ok((addr, made)) => {
                    maps.extend(made);
                    addr
                }
                Err(e) => {
                    for m in &maps {
                        let _ = self.ops.unmap(m);
                    }
                    return Err(e);
                }
            };
            let flags = if dir == Direction::FromDevice {
                writable += seg.len() as u64;
                DESC_F_WRITE
            } else {
                0
            };
            descs.push((addr, seg.len() as u32, flags));
        }

        let head = self.free_head;
        if use_indirect {
            let (table, at) = self.tables().expect("indirect checked");
            let base = at + head as usize * INDIRECT_MAX * DESC_SIZE;
            let n = descs.len();
            for (i, &(addr, len, flags)) in descs.iter().enumerate() {
                let (flags, next) = if i + 1 < n {
                    (flags | DESC_F_NEXT, (i + 1) as u16)
                } else {
                    (flags, 0)
                };
                table.write_desc(base, i, addr, len, flags, next);
            }
            let table_addr = table.addr() + base as u64;
            self.ring().write_desc(
                0,
                head as usize,
                table_addr,
                (n * DESC_SIZE) as u32,
                DESC_F_INDIRECT,
                0,
            );
            self.free_head = self.next[head as usize];
        } else {
            let mut id = head;
            let n = descs.len();
            for (i, &(addr, len, flags)) in descs.iter().enumerate() {
                let next = self.next[id as usize];
                let flags = if i + 1 < n {
                    flags | DESC_F_NEXT
                } else {
                    flags
                };
                self.ring()
                    .write_desc(0, id as usize, addr, len, flags, next);
                if i + 1 < n {
                    id = next;
                }
            }
            self.free_head = self.next[id as usize];
        }
        self.num_free -= needed as u16;
        self.in_flight += 1;
        self.inflight[head as usize] = Some(InFlight {
            token,
            maps,
            ndesc: needed as u16,
            writable,
        });
        if self.hold {
            self.held_heads.push_back(head);
        }

        // §2.7.13.2: put the head in the next available ring slot.
        let slot = ring_slot(self.avail_idx, self.layout.size);
        self.ring().write_u16(self.layout.avail_ring(slot), head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        if !self.hold {
            // §2.7.13.3: the descriptors and the ring entry must be visible
            // before the device sees the new idx; a Release store orders
            // them.
            self.published = self.avail_idx;
            self.ring()
                .store_idx(self.layout.avail_idx(), self.avail_idx, Ordering::Release);
        }
        Ok(head)
    }

    fn seg_addr(
        &self,
        seg: &Seg<'_>,
        dir: Direction,
        wait: MapWait,
    ) -> Result<(DmaAddr, Option<Mapping>)> {
        Ok(match *seg {
            Seg::Buf { buf, offset, len } => {
                let m = self.ops.map(buf, offset, len, dir, wait)?;
                (m.addr(), Some(m))
            }
            Seg::Coherent { mem, offset, len } => {
                mem.buffer()
                    .check_range(offset, len)
                    .map_err(iopath_dma::Error::from)?;
                (mem.addr() + offset as u64, None)
            }
            Seg::Mapped(m) => (m.addr(), None),
            Seg::Area { offset, len } => {
                let at = self.area_at(offset, len)?;
                (self.ring().addr() + at as u64, None)
            }
        })
    }
}
