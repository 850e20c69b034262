//! [`Bounce`]: every mapping is copied through a small shared window (like
//! the kernel's SWIOTLB for protected guests).

use std::sync::{Condvar, Mutex};

use iopath_heap::Buffer;
use iopath_sys::lock;

use crate::table::{alloc_shared, check_map, copy, take_space, MapTable, Pinned, RegionTable};
use crate::{Coherent, Direction, DmaAddr, DmaOps, Error, MapWait, Mapping, Result, SharedRegion};

/// Default slot size: the kernel's `IO_TLB_SIZE` (2 KiB).
pub const DEFAULT_SLOT: usize = 2048;

/// Bounce-buffer DMA: a fixed window (its own memfd) cut into slots. Map
/// takes contiguous slots and copies the buffer in; unmap copies
/// device-written bytes back and frees the slots. The device only ever sees
/// the window (and coherent memory, which a protected guest shares
/// deliberately), never the driver's buffers.
///
/// Like SWIOTLB since Linux 5.19 (the `DMA_FROM_DEVICE` info-leak fix), map
/// copies the buffer in for every direction, so bytes the device does not
/// write come back unchanged rather than as stale window contents.
#[derive(Debug)]
pub struct Bounce {
    window: Buffer,
    window_gpa: DmaAddr,
    slot: usize,
    state: Mutex<State>,
    freed: Condvar,
}

#[derive(Debug)]
struct Entry {
    pinned: Pinned,
    first: usize,
    count: usize,
}

#[derive(Debug)]
struct State {
    /// Which slots are taken.
    used: Vec<bool>,
    free: usize,
    maps: MapTable<Entry>,
    regions: RegionTable,
}

impl State {
    /// First fit of `n` contiguous free slots.
    fn take(&mut self, n: usize) -> Option<usize> {
        if n > self.free {
            return None;
        }
        let mut run = 0;
        for i in 0..self.used.len() {
            if self.used[i] {
                run = 0;
                continue;
            }
            run += 1;
            if run == n {
                let first = i + 1 - n;
                self.used[first..=i].iter_mut().for_each(|u| *u = true);
                self.free -= n;
                return Some(first);
            }
        }
        None
    }

    fn give(&mut self, first: usize, n: usize) {
        self.used[first..first + n]
            .iter_mut()
            .for_each(|u| *u = false);
        self.free += n;
    }
}

impl Bounce {
    /// A window of `window_len` bytes (rounded up to pages) cut into
    /// `slot`-byte slots (a power of two).
    ///
    /// # Errors
    /// [`Error::ZeroLength`], [`Error::Policy`] for a bad slot size,
    /// [`Error::Heap`] if the memfd cannot be made.
    pub fn new(window_len: usize, slot: usize) -> Result<Self> {
        if !slot.is_power_of_two() {
            return Err(Error::Policy("bounce slot size must be a power of two"));
        }
        let window = alloc_shared(window_len)?;
        // The window is set up once, like swiotlb's at boot: its pages are
        // allocated now, not on the first requests that bounce through it.
        if window.populate().is_err() {
            window.fill(0, window.len(), 0)?;
        }
        let mut regions = RegionTable::new();
        let window_gpa = regions.register(&window)?;
        let slots = window.len() / slot;
        if slots == 0 {
            return Err(Error::Policy("bounce window smaller than one slot"));
        }
        Ok(Bounce {
            window,
            window_gpa,
            slot,
            state: Mutex::new(State {
                used: vec![false; slots],
                free: slots,
                maps: MapTable::new(),
                regions,
            }),
            freed: Condvar::new(),
        })
    }

    /// Slot size in bytes.
    pub fn slot_size(&self) -> usize {
        self.slot
    }

    /// Free slots (for leak checks).
    pub fn free_slots(&self) -> usize {
        lock(&self.state).free
    }

    /// Total slots.
    pub fn total_slots(&self) -> usize {
        self.window.len() / self.slot
    }

    fn slot_off(&self, first: usize) -> usize {
        first * self.slot
    }
}

impl DmaOps for Bounce {
    fn name(&self) -> &'static str {
        "bounce"
    }

    fn register(&self, _buf: &Buffer) -> Result<()> {
        // Only the window is shared; any buffer can be bounced.
        Ok(())
    }

    fn unregister(&self, _buf: &Buffer) -> Result<()> {
        Ok(())
    }

    fn map(
        &self,
        buf: &Buffer,
        offset: usize,
        len: usize,
        dir: Direction,
        wait: MapWait,
    ) -> Result<Mapping> {
        check_map(buf, offset, len, self.max_mapping_size())?;
        let n = len.div_ceil(self.slot);
        let (st, first) = take_space(
            &self.freed,
            lock(&self.state),
            wait,
            len,
            "bounce slots",
            |s| s.take(n),
        )?;
        let pinned = Pinned::new(buf, offset);
        drop(st);
        // Copy outside the lock: the slots are ours.
        if let Err(e) = copy(buf, offset, &self.window, self.slot_off(first), len) {
            lock(&self.state).give(first, n);
            self.freed.notify_all();
            return Err(e);
        }
        let addr = self.window_gpa + self.slot_off(first) as u64;
        Ok(lock(&self.state).maps.insert(
            |id| Mapping::new(id, addr, len, dir),
            Entry {
                pinned,
                first,
                count: n,
            },
        ))
    }

    fn unmap(&self, mapping: &Mapping) -> Result<()> {
        let e = lock(&self.state).maps.remove(mapping)?;
        let res = if mapping.dir().device_writes() {
            // The device's bytes go back to the driver's buffer.
            copy(
                &self.window,
                self.slot_off(e.first),
                &e.pinned.buffer,
                e.pinned.offset,
                mapping.len(),
            )
        } else {
            Ok(())
        };
        lock(&self.state).give(e.first, e.count);
        self.freed.notify_all();
        drop(e);
        res
    }

    fn sync_for_cpu(&self, mapping: &Mapping, offset: usize, len: usize) -> Result<()> {
        mapping.check_range(offset, len)?;
        let mut st = lock(&self.state);
        let e = st.maps.get_mut(mapping)?;
        let at = self.slot_off(e.first);
        e.pinned
            .bounce_for_cpu(mapping.dir(), &self.window, at, offset, len)
    }

    fn sync_for_device(&self, mapping: &Mapping, offset: usize, len: usize) -> Result<()> {
        mapping.check_range(offset, len)?;
        let mut st = lock(&self.state);
        let e = st.maps.get_mut(mapping)?;
        let at = self.slot_off(e.first);
        e.pinned
            .bounce_for_device(mapping.dir(), &self.window, at, offset, len)
    }

    fn alloc_coherent(&self, len: usize) -> Result<Coherent> {
        let buf = alloc_shared(len)?;
        lock(&self.state).regions.add_coherent(buf)
    }

    fn free_coherent(&self, mem: Coherent) -> Result<()> {
        lock(&self.state)
            .regions
            .free_coherent(&mem, Some(&self.window))
    }

    fn max_mapping_size(&self) -> usize {
        self.window.len()
    }

    fn regions(&self) -> Vec<SharedRegion> {
        lock(&self.state).regions.regions()
    }

    fn regions_generation(&self) -> u64 {
        lock(&self.state).regions.generation()
    }

    fn live_mappings(&self) -> usize {
        lock(&self.state).maps.len()
    }
}
