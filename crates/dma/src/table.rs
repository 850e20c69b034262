//! Bookkeeping shared by the ops: registered regions and live mappings.

use foldhash::HashMap;
use std::sync::{Condvar, MutexGuard};
use std::time::Instant;

use iopath_heap::{Buffer, DevicePin, Heap, HugePages, MemfdHeap};

use crate::{Coherent, Direction, DmaAddr, Error, MapWait, Mapping, Result, SharedRegion};

/// Where the first region goes in the device's physical view. Address 0 is
/// never valid, so a zeroed descriptor cannot point at real memory.
const GPA_BASE: u64 = 1 << 32;
/// Regions start on this boundary, with at least this much unmapped space
/// between them (so a length run past one region hits nothing).
const GPA_ALIGN: u64 = 2 << 20;
/// End of the device's physical view (47-bit, like x86-64 user space).
const GPA_LIMIT: u64 = 1 << 47;

/// Regions registered with an ops instance.
#[derive(Debug, Default)]
pub(crate) struct RegionTable {
    regions: Vec<SharedRegion>,
    /// Mapping address of each region's buffer → index in `regions`, so a
    /// map finds its region in O(1) however many buffers are registered.
    by_ptr: HashMap<usize, usize>,
    next_gpa: u64,
    generation: u64,
}

impl RegionTable {
    pub(crate) fn new() -> Self {
        RegionTable {
            regions: Vec::new(),
            by_ptr: HashMap::default(),
            next_gpa: GPA_BASE,
            generation: 0,
        }
    }

    /// Adds `buf` as a region and returns its guest-physical base.
    pub(crate) fn register(&mut self, buf: &Buffer) -> Result<DmaAddr> {
        if let Some(r) = self.find(buf) {
            return Err(Error::AlreadyRegistered { addr: r.gpa });
        }
        let gpa = self.next_gpa;
        let end = gpa
            .checked_add(buf.len() as u64)
            .and_then(|e| e.checked_add(GPA_ALIGN))
            .map(|e| e.next_multiple_of(GPA_ALIGN))
            .filter(|&e| e <= GPA_LIMIT)
            .ok_or(Error::AddressSpace)?;
        self.next_gpa = end;
        self.push(buf, gpa);
        Ok(gpa)
    }

    /// Adds `buf` as a region at the device address `gpa` the platform
    /// fixes (a remoteproc carveout: device address = offset into the
    /// shared memory, so 0 is allowed here). Later automatic placements
    /// start past it.
    pub(crate) fn register_at(&mut self, buf: &Buffer, gpa: DmaAddr) -> Result<DmaAddr> {
        if let Some(r) = self.find(buf) {
            return Err(Error::AlreadyRegistered { addr: r.gpa });
        }
        let end = gpa
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= GPA_LIMIT)
            .ok_or(Error::AddressSpace)?;
        if self
            .regions
            .iter()
            .any(|r| gpa < r.gpa + r.buffer.len() as u64 && r.gpa < end)
        {
            return Err(Error::AddressSpace);
        }
        if let Some(next) = end
            .checked_add(GPA_ALIGN)
            .map(|e| e.next_multiple_of(GPA_ALIGN))
        {
            self.next_gpa = self.next_gpa.max(next);
        }
        self.push(buf, gpa);
        Ok(gpa)
    }

    /// Records `buf` as a region at `gpa` (placement already checked).
    fn push(&mut self, buf: &Buffer, gpa: DmaAddr) {
        self.by_ptr.insert(buf.addr(), self.regions.len());
        self.regions.push(SharedRegion {
            buffer: buf.clone(),
            gpa,
        });
        self.generation += 1;
    }

    /// Removes the region of `buf`; `false` if it was not registered.
    pub(crate) fn unregister(&mut self, buf: &Buffer) -> bool {
        let before = self.regions.len();
        self.regions.retain(|r| !r.buffer.same_as(buf));
        let removed = self.regions.len() != before;
        if removed {
            self.generation += 1;
            self.by_ptr = self
                .regions
                .iter()
                .enumerate()
                .map(|(i, r)| (r.buffer.addr(), i))
                .collect();
        }
        removed
    }

    pub(crate) fn find(&self, buf: &Buffer) -> Option<&SharedRegion> {
        let i = *self.by_ptr.get(&(buf.addr()))?;
        self.regions.get(i).filter(|r| r.buffer.same_as(buf))
    }

    /// The region of `buf`, or [`Error::NotRegistered`] naming the `ops`
    /// that refuse it.
    pub(crate) fn registered(&self, buf: &Buffer, ops: &'static str) -> Result<&SharedRegion> {
        self.find(buf).ok_or(Error::NotRegistered {
            ops,
            buf_len: buf.len(),
        })
    }

    /// `DmaOps::unregister` for ops that map only registered buffers: `buf`
    /// must be registered and no longer mapped for the device.
    pub(crate) fn unregister_idle(&mut self, buf: &Buffer, ops: &'static str) -> Result<()> {
        self.registered(buf, ops)?;
        buf.check_not_busy()?;
        self.unregister(buf);
        Ok(())
    }

    /// Registers freshly allocated coherent memory and hands it out at its
    /// region's base.
    pub(crate) fn add_coherent(&mut self, buf: Buffer) -> Result<Coherent> {
        let addr = self.register(&buf)?;
        Ok(Coherent::new(buf, addr))
    }

    /// Unregisters coherent memory from [`RegionTable::add_coherent`].
    /// `owned` is a region the ops keep for themselves (a bounce window): it
    /// is never freed this way. Anything else not registered is
    /// [`Error::NotMapped`].
    pub(crate) fn free_coherent(&mut self, mem: &Coherent, owned: Option<&Buffer>) -> Result<()> {
        if owned.is_some_and(|o| mem.buffer().same_as(o)) || !self.unregister(mem.buffer()) {
            return Err(Error::NotMapped {
                id: 0,
                addr: mem.addr(),
            });
        }
        Ok(())
    }

    pub(crate) fn regions(&self) -> Vec<SharedRegion> {
        self.regions.clone()
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }
}

/// Live mappings of an ops instance, in a slab: a mapping's id holds its
/// slot (low 32 bits) and a serial number (high 32 bits) that makes it
/// unique, so a map and an unmap index a vector rather than hash (the
/// table is on every virtio buffer's path; a hash map's two probes showed
/// in the block driver's profile). Slots are reused last-freed first.
#[derive(Debug)]
pub(crate) struct MapTable<E> {
    serial: u32,
    slots: Vec<Option<(Mapping, E)>>,
    /// The empty slots.
    free: Vec<u32>,
}

impl<E> MapTable<E> {
    pub(crate) fn new() -> Self {
        MapTable {
            serial: 0,
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Records the mapping `make` builds from the id it is given, with
    /// `e`, and returns it.
    pub(crate) fn insert(&mut self, make: impl FnOnce(u64) -> Mapping, e: E) -> Mapping {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 live mappings")
        });
        self.serial = self.serial.wrapping_add(1);
        let m = make(u64::from(self.serial) << 32 | u64::from(slot));
        self.slots[slot as usize] = Some((m, e));
        m
    }

    /// The slot of `m`, if `m` is exactly a live mapping.
    fn slot(&self, m: &Mapping) -> Result<usize> {
        let slot = (m.id() & u64::from(u32::MAX)) as usize;
        match self.slots.get(slot) {
            Some(Some((live, _))) if live == m => Ok(slot),
            _ => Err(not_mapped(m)),
        }
    }

    /// The entry of `m`, if `m` is exactly a live mapping.
    pub(crate) fn get_mut(&mut self, m: &Mapping) -> Result<&mut E> {
        let slot = self.slot(m)?;
        Ok(&mut self.slots[slot].as_mut().expect("live slot").1)
    }

    pub(crate) fn remove(&mut self, m: &Mapping) -> Result<E> {
        let slot = self.slot(m)?;
        let (_, e) = self.slots[slot].take().expect("live slot");
        self.free.push(slot as u32);
        Ok(e)
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &(Mapping, E)> {
        self.slots.iter().flatten()
    }
}

fn not_mapped(m: &Mapping) -> Error {
    Error::NotMapped {
        id: m.id(),
        addr: m.addr(),
    }
}

/// The pin a mapping holds on its buffer; dropped while the CPU owns the
/// buffer (between `sync_for_cpu` and `sync_for_device`).
#[derive(Debug)]
pub(crate) struct Pinned {
    pub(crate) buffer: Buffer,
    pub(crate) offset: usize,
    pin: Option<DevicePin>,
}

impl Pinned {
    pub(crate) fn new(buffer: &Buffer, offset: usize) -> Self {
        Pinned {
            pin: Some(buffer.pin_for_device()),
            buffer: buffer.clone(),
            offset,
        }
    }

    /// CPU ownership: the buffer is no longer busy because of this mapping.
    pub(crate) fn release(&mut self) {
        self.pin = None;
    }

    /// Device ownership again.
    pub(crate) fn repin(&mut self) {
        if self.pin.is_none() {
            self.pin = Some(self.buffer.pin_for_device());
        }
    }

    /// `sync_for_cpu` of `offset..offset+len` of a bounced mapping (`dir`)
    /// whose device copy starts at `at` in `window`: device-written bytes
    /// come back to the buffer, then the CPU owns it.
    pub(crate) fn bounce_for_cpu(
        &mut self,
        dir: Direction,
        window: &Buffer,
        at: usize,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        if dir.device_writes() {
            copy(window, at + offset, &self.buffer, self.offset + offset, len)?;
        }
        self.release();
        Ok(())
    }

    /// `sync_for_device` of the same: the device owns the buffer again and
    /// sees the CPU's bytes in the window.
    pub(crate) fn bounce_for_device(
        &mut self,
        dir: Direction,
        window: &Buffer,
        at: usize,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        self.repin();
        if dir.device_reads() {
            copy(&self.buffer, self.offset + offset, window, at + offset, len)?;
        }
        Ok(())
    }
}

/// Copies `len` bytes from `src` at `src_off` to `dst` at `dst_off`
/// (bounce windows and the buffers bounced through them).
///
/// Writes `dst` even while it is busy: the callers are the device side of a
/// mapping (they hold the buffer's pin, or `dst` is their own window), so
/// the copy goes through a device-side range, as
/// [`iopath_heap::DevicePin::write_back`] does, without a staging copy.
pub(crate) fn copy(
    src: &Buffer,
    src_off: usize,
    dst: &Buffer,
    dst_off: usize,
    len: usize,
) -> Result<()> {
    let pin = dst.pin_for_device();
    src.range(src_off, len)?
        .copy_to_range(&pin.range(dst_off, len)?)?;
    Ok(())
}

/// Validates a map request against the buffer.
pub(crate) fn check_map(buf: &Buffer, offset: usize, len: usize, max: usize) -> Result<()> {
    if len == 0 {
        return Err(Error::ZeroLength);
    }
    buf.check_range(offset, len)?;
    if len > max {
        return Err(Error::TooLarge { len, max });
    }
    Ok(())
}

/// Takes `len` bytes of mapping space (bounce slots, IOVAs) with `take`,
/// waiting per `wait` on `freed` (notified by unmaps) while there is none;
/// [`Error::NoSpace`] about `what` when `wait` gives up.
pub(crate) fn take_space<'a, S, T>(
    freed: &Condvar,
    mut st: MutexGuard<'a, S>,
    wait: MapWait,
    len: usize,
    what: &'static str,
    mut take: impl FnMut(&mut S) -> Option<T>,
) -> Result<(MutexGuard<'a, S>, T)> {
    let deadline = match wait {
        MapWait::Timeout(d) => Some(Instant::now() + d),
        _ => None,
    };
    loop {
        if let Some(t) = take(&mut st) {
            return Ok((st, t));
        }
        let no_space = Error::NoSpace { len, what };
        st = match (wait, deadline) {
            (MapWait::Fail, _) | (MapWait::Timeout(_), None) => return Err(no_space),
            (MapWait::Block, _) => iopath_sys::wait(freed, st),
            (MapWait::Timeout(_), Some(d)) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(no_space);
                }
                iopath_sys::wait_timeout(freed, st, left).0
            }
        };
    }
}

/// Allocates zeroed shareable memory for coherent use, page-rounded.
pub(crate) fn alloc_shared(len: usize) -> Result<Buffer> {
    if len == 0 {
        return Err(Error::ZeroLength);
    }
    let page = iopath_heap::page_size();
    let len = len.checked_next_multiple_of(page).ok_or(Error::TooLarge {
        len,
        max: usize::MAX - page,
    })?;
    Ok(MemfdHeap::new(HugePages::None).alloc(len)?)
}
