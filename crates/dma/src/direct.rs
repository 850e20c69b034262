//! [`Direct`]: the device sees the driver's registered memory as is.

use std::sync::Mutex;

use iopath_heap::Buffer;
use iopath_sys::lock;

use crate::table::{alloc_shared, check_map, MapTable, Pinned, RegionTable};
use crate::{Coherent, Direction, DmaOps, MapWait, Mapping, Result, SharedRegion};

/// Direct DMA: the device address of a byte is its address in a registered
/// region (the legacy virtio path, where the device is handed guest-physical
/// addresses). Zero copy; mapping only pins the buffer and checks that the
/// device can see it.
///
/// Buffers must be registered first ([`DmaOps::register`]); mapping a buffer
/// that is not is [`Error::NotRegistered`], because the device could not
/// reach it.
///
/// [`Error::NotRegistered`]: crate::Error::NotRegistered
#[derive(Debug)]
pub struct Direct {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    regions: RegionTable,
    maps: MapTable<Pinned>,
}

impl Direct {
    /// Registers `buf` at a device address fixed by the platform rather
    /// than picked by the ops: e.g. a remoteproc shared-memory file whose
    /// device addresses are offsets into it (`gpa` 0), as OpenAMP's Linux
    /// demo and rpmsg resource tables use. Mappings of `buf` then get
    /// `gpa + offset`.
    ///
    /// # Errors
    /// [`Error::AlreadyRegistered`]; [`Error::AddressSpace`] if the range
    /// overlaps another region or runs past the device's address space.
    ///
    /// [`Error::AlreadyRegistered`]: crate::Error::AlreadyRegistered
    /// [`Error::AddressSpace`]: crate::Error::AddressSpace
    pub fn register_at(&self, buf: &Buffer, gpa: u64) -> Result<u64> {
        lock(&self.state).regions.register_at(buf, gpa)
    }
}

impl Default for Direct {
    fn default() -> Self {
        Self::new()
    }
}

impl Direct {
    /// Ops with no regions yet.
    pub fn new() -> Self {
        Direct {
            state: Mutex::new(State {
                regions: RegionTable::new(),
                maps: MapTable::new(),
            }),
        }
    }
}

impl DmaOps for Direct {
    fn name(&self) -> &'static str {
        "direct"
    }

    fn register(&self, buf: &Buffer) -> Result<()> {
        lock(&self.state).regions.register(buf).map(drop)
    }

    fn unregister(&self, buf: &Buffer) -> Result<()> {
        lock(&self.state).regions.unregister_idle(buf, "direct")
    }

    fn map(
        &self,
        buf: &Buffer,
        offset: usize,
        len: usize,
        dir: Direction,
        _wait: MapWait,
    ) -> Result<Mapping> {
        check_map(buf, offset, len, self.max_mapping_size())?;
        let mut st = lock(&self.state);
        let base = st.regions.registered(buf, "direct")?.gpa;
        Ok(st.maps.insert(
            |id| Mapping::new(id, base + offset as u64, len, dir),
            Pinned::new(buf, offset),
        ))
    }

    fn unmap(&self, mapping: &Mapping) -> Result<()> {
        // The pin drops with the entry: the buffer is the CPU's again. No copy:
        // the device wrote the buffer itself.
        lock(&self.state).maps.remove(mapping).map(drop)
    }

    fn sync_for_cpu(&self, mapping: &Mapping, offset: usize, len: usize) -> Result<()> {
        mapping.check_range(offset, len)?;
        lock(&self.state).maps.get_mut(mapping)?.release();
        Ok(())
    }

    fn sync_for_device(&self, mapping: &Mapping, offset: usize, len: usize) -> Result<()> {
        mapping.check_range(offset, len)?;
        lock(&self.state).maps.get_mut(mapping)?.repin();
        Ok(())
    }

    fn alloc_coherent(&self, len: usize) -> Result<Coherent> {
        let buf = alloc_shared(len)?;
        lock(&self.state).regions.add_coherent(buf)
    }

    fn free_coherent(&self, mem: Coherent) -> Result<()> {
        lock(&self.state).regions.free_coherent(&mem, None)
    }

    fn max_mapping_size(&self) -> usize {
        usize::MAX
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
