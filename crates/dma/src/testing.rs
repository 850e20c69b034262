//! Test support (feature `test-util`): the device's side of the DMA ops and
//! a fake ops that always bounces.
//!
//! [`DeviceView`] is what a device (or a vhost-user back end) does with the
//! ops' output: it maps the shared regions' fds itself and, for IOTLB ops,
//! translates every access through the records it received, refusing
//! unmapped or wrong-permission access. [`AlwaysBounce`] copies every
//! mapping through its own window and poisons device-writable slots, so a
//! forgotten unmap or sync shows up as wrong bytes (as virtio-drivers'
//! `FakeHal` does).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use iopath_heap::{Buffer, HeapKind};
use iopath_sys::{lock, read_lock, write_lock};

use crate::table::{alloc_shared, check_map, copy, MapTable, Pinned, RegionTable};
use crate::{
    Coherent, Direction, DmaAddr, DmaOps, Error, IotlbRecord, IotlbSink, IovaAllocator, MapWait,
    Mapping, Perm, Result, SharedRegion,
};

/// Why the device could not access an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    /// No IOTLB entry covers the range.
    #[error("IOVA {addr:#x}+{len} is not mapped")]
    NotMapped {
        /// Address.
        addr: u64,
        /// Length.
        len: usize,
    },
    /// An IOTLB entry covers it without the needed permission.
    #[error("IOVA {addr:#x}+{len} is mapped without {need:?} permission")]
    Permission {
        /// Address.
        addr: u64,
        /// Length.
        len: usize,
        /// What was needed.
        need: Perm,
    },
    /// The (translated) address is in no shared region.
    #[error("address {addr:#x}+{len} is outside every shared region")]
    OutsideRegions {
        /// Address.
        addr: u64,
        /// Length.
        len: usize,
    },
}

#[derive(Debug, Clone, Copy)]
struct TlbEntry {
    size: u64,
    uaddr: u64,
    perm: Perm,
}

/// An IOTLB the test enforcer fills from the ops' records.
#[derive(Debug, Default)]
pub struct TestIotlb {
    entries: Mutex<BTreeMap<u64, TlbEntry>>,
    records: Mutex<Vec<IotlbRecord>>,
}

impl TestIotlb {
    /// Every record received, in order.
    pub fn records(&self) -> Vec<IotlbRecord> {
        lock(&self.records).clone()
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    /// Whether no entry is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn translate(&self, addr: u64, len: usize, need: Perm) -> Result<u64, Fault> {
        let entries = lock(&self.entries);
        let end = addr
            .checked_add(len as u64)
            .ok_or(Fault::NotMapped { addr, len })?;
        let (&iova, e) = entries
            .range(..=addr)
            .next_back()
            .filter(|(&iova, e)| end <= iova + e.size)
            .ok_or(Fault::NotMapped { addr, len })?;
        if !e.perm.allows(need) {
            return Err(Fault::Permission { addr, len, need });
        }
        Ok(e.uaddr + (addr - iova))
    }
}

impl IotlbSink for TestIotlb {
    fn send(&self, record: IotlbRecord) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let mut entries = lock(&self.entries);
        match record {
            IotlbRecord::Update {
                iova,
                size,
                uaddr,
                perm,
            } => {
                entries.insert(iova, TlbEntry { size, uaddr, perm });
            }
            IotlbRecord::Invalidate { iova, size } => match entries.get(&iova) {
                Some(e) if e.size == size => {
                    entries.remove(&iova);
                }
                _ => return Err(format!("invalidate of unknown range {iova:#x}+{size}").into()),
            },
        }
        lock(&self.records).push(record);
        Ok(())
    }
}

#[derive(Debug)]
struct DevRegion {
    gpa: u64,
    uaddr: u64,
    /// The device's own mapping of the region's fd.
    map: Buffer,
}

/// The device's side: its own mappings of the shared regions, plus the IOTLB
/// when the ops translate.
#[derive(Debug)]
pub struct DeviceView {
    regions: RwLock<Vec<DevRegion>>,
    iotlb: Option<Arc<TestIotlb>>,
}

impl DeviceView {
    /// Connects to `ops` as a device would: maps its regions and, if it uses
    /// an IOTLB, becomes its sink.
    ///
    /// # Errors
    /// [`Error::Heap`] if a region cannot be mapped, [`Error::Sink`].
    pub fn connect(ops: &dyn DmaOps) -> Result<Self> {
        let iotlb = if ops.uses_iotlb() {
            let t = Arc::new(TestIotlb::default());
            ops.set_iotlb_sink(t.clone())?;
            Some(t)
        } else {
            None
        };
        let view = DeviceView {
            regions: RwLock::new(Vec::new()),
            iotlb,
        };
        view.refresh(ops)?;
        Ok(view)
    }

    /// Maps the ops' current regions again (after registrations).
    ///
    /// # Errors
    /// [`Error::Heap`].
    pub fn refresh(&self, ops: &dyn DmaOps) -> Result<()> {
        let mut list = Vec::new();
        for r in ops.regions() {
            let fd = r.buffer.fd().try_clone_to_owned().map_err(|e| {
                Error::Heap(iopath_heap::Error::Sys {
                    op: "dup",
                    source: e,
                })
            })?;
            list.push(DevRegion {
                gpa: r.gpa,
                uaddr: r.uaddr(),
                map: Buffer::from_fd(fd, r.len(), HeapKind::Memfd)?,
            });
        }
        *write_lock(&self.regions) = list;
        Ok(())
    }

    /// The IOTLB, for IOTLB ops.
    pub fn iotlb(&self) -> Option<&Arc<TestIotlb>> {
        self.iotlb.as_ref()
    }

    fn locate(&self, addr: u64, len: usize, need: Perm) -> Result<(usize, usize), Fault> {
        let (key, by_uaddr) = match &self.iotlb {
            Some(t) => (t.translate(addr, len, need)?, true),
            None => (addr, false),
        };
        let regions = read_lock(&self.regions);
        let end = key.checked_add(len as u64);
        regions
            .iter()
            .enumerate()
            .find_map(|(i, r)| {
                let base = if by_uaddr { r.uaddr } else { r.gpa };
                let inside = key >= base && end.is_some_and(|e| e <= base + r.map.len() as u64);
                inside.then(|| (i, (key - base) as usize))
            })
            .ok_or(Fault::OutsideRegions { addr, len })
    }

    /// Device reads `dst.len()` bytes at device address `addr`.
    ///
    /// # Errors
    /// A [`Fault`].
    pub fn read(&self, addr: DmaAddr, dst: &mut [u8]) -> Result<(), Fault> {
        let (i, off) = self.locate(addr, dst.len(), Perm::ReadOnly)?;
        let regions = read_lock(&self.regions);
        regions[i].map.read_at(off, dst).expect("range checked");
        Ok(())
    }

    /// Device writes `src` at device address `addr`.
    ///
    /// # Errors
    /// A [`Fault`].
    pub fn write(&self, addr: DmaAddr, src: &[u8]) -> Result<(), Fault> {
        let (i, off) = self.locate(addr, src.len(), Perm::WriteOnly)?;
        let regions = read_lock(&self.regions);
        regions[i]
            .map
            .write_at(off, src)
            .expect("range checked; device mapping never pinned");
        Ok(())
    }
}

/// Poison written into device-writable bounce space.
pub const POISON: u8 = 0xa5;

/// A fake DMA ops that always bounces, through its own 64 MiB window, and
/// poisons what it does not copy: from-device mappings start as [`POISON`]
/// (not as the buffer's bytes) and slots are poisoned after unmap. A driver
/// that forgets to unmap or sync reads poison.
#[derive(Debug)]
pub struct AlwaysBounce {
    window: Buffer,
    gpa: DmaAddr,
    state: Mutex<FakeState>,
}

#[derive(Debug)]
struct FakeState {
    space: IovaAllocator,
    maps: MapTable<(Pinned, u64)>,
    regions: RegionTable,
}

impl AlwaysBounce {
    /// Window size.
    pub const WINDOW: usize = 64 << 20;

    /// A fake with a fresh window.
    ///
    /// # Errors
    /// [`Error::Heap`].
    pub fn new() -> Result<Self> {
        let window = alloc_shared(Self::WINDOW)?;
        let mut regions = RegionTable::new();
        let gpa = regions.register(&window)?;
        Ok(AlwaysBounce {
            window,
            gpa,
            state: Mutex::new(FakeState {
                space: IovaAllocator::new(0, Self::WINDOW as u64, 64),
                maps: MapTable::new(),
                regions,
            }),
        })
    }

    /// Free window bytes (for leak checks).
    pub fn free_bytes(&self) -> u64 {
        lock(&self.state).space.free_bytes()
    }
}

impl DmaOps for AlwaysBounce {
    fn name(&self) -> &'static str {
        "always-bounce"
    }

    fn register(&self, _buf: &Buffer) -> Result<()> {
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
        _wait: MapWait,
    ) -> Result<Mapping> {
        check_map(buf, offset, len, Self::WINDOW)?;
        let mut st = lock(&self.state);
        let at = st.space.alloc(len as u64).ok_or(Error::NoSpace {
            len,
            what: "fake bounce window",
        })?;
        if dir.device_reads() {
            copy(buf, offset, &self.window, at as usize, len)?;
        } else {
            self.window.fill(at as usize, len, POISON)?;
        }
        let gpa = self.gpa + at;
        Ok(st.maps.insert(
            |id| Mapping::new(id, gpa, len, dir),
            (Pinned::new(buf, offset), at),
        ))
    }

    fn unmap(&self, mapping: &Mapping) -> Result<()> {
        let mut st = lock(&self.state);
        let (pinned, at) = st.maps.remove(mapping)?;
        if mapping.dir().device_writes() {
            copy(
                &self.window,
                at as usize,
                &pinned.buffer,
                pinned.offset,
                mapping.len(),
            )?;
        }
        self.window.fill(at as usize, mapping.len(), POISON)?;
        st.space.free(at, mapping.len() as u64);
        Ok(())
    }

    fn sync_for_cpu(&self, mapping: &Mapping, offset: usize, len: usize) -> Result<()> {
        mapping.check_range(offset, len)?;
        let mut st = lock(&self.state);
        let (pinned, at) = st.maps.get_mut(mapping)?;
        pinned.bounce_for_cpu(mapping.dir(), &self.window, *at as usize, offset, len)
    }

    fn sync_for_device(&self, mapping: &Mapping, offset: usize, len: usize) -> Result<()> {
        mapping.check_range(offset, len)?;
        let mut st = lock(&self.state);
        let (pinned, at) = st.maps.get_mut(mapping)?;
        pinned.bounce_for_device(mapping.dir(), &self.window, *at as usize, offset, len)
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
        Self::WINDOW
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
