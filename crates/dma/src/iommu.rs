//! [`Iommu`]: IOVAs from an allocator, IOTLB records to the enforcer.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use iopath_heap::Buffer;
use iopath_sys::lock;

use crate::iova::IovaAllocator;
use crate::table::{alloc_shared, check_map, take_space, MapTable, Pinned, RegionTable};
use crate::{
    Coherent, Direction, DmaOps, Error, IotlbRecord, IotlbSink, MapWait, Mapping, Perm, Result,
    SharedRegion,
};

/// Where IOVAs start by default (IOVA 0 is never handed out).
pub const DEFAULT_IOVA_BASE: u64 = 1 << 20;
/// Default IOVA space size.
pub const DEFAULT_IOVA_SIZE: u64 = 1 << 40;

/// IOMMU DMA: each mapping gets an IOVA range from an allocator and an
/// IOTLB update record (`iova → uaddr`, permission from the direction) that
/// the transport forwards to the enforcer; unmapping sends an invalidate
/// before the IOVA is reused. The device can reach only what is mapped, with
/// the mapped permission, and only for the mapped length.
///
/// Buffers must still be registered ([`DmaOps::register`]): their fds are
/// shared as regions so the enforcer can reach the translated user
/// addresses, as in vhost-user.
#[derive(Debug)]
pub struct Iommu {
    state: Mutex<State>,
    freed: Condvar,
}

#[derive(Debug)]
struct Entry {
    pinned: Pinned,
    iova: u64,
}

#[derive(Debug)]
struct CoherentEntry {
    buffer: Buffer,
    len: u64,
}

#[derive(Debug)]
struct State {
    regions: RegionTable,
    maps: MapTable<Entry>,
    coherent: HashMap<u64, CoherentEntry>,
    iova: IovaAllocator,
    sink: Option<Arc<dyn IotlbSink>>,
}

impl State {
    fn send(&self, rec: IotlbRecord) -> Result<()> {
        match &self.sink {
            Some(s) => s.send(rec).map_err(Error::Sink),
            // No enforcer yet: the record is replayed from the tables when one
            // is connected.
            None => Ok(()),
        }
    }
}

impl Default for Iommu {
    fn default() -> Self {
        Self::new()
    }
}

impl Iommu {
    /// Ops over the default IOVA space, page granule.
    pub fn new() -> Self {
        Self::with_space(DEFAULT_IOVA_BASE, DEFAULT_IOVA_SIZE)
    }

    /// Ops over IOVAs `[base, base+size)` (small spaces make exhaustion
    /// testable), page granule.
    pub fn with_space(base: u64, size: u64) -> Self {
        Iommu {
            state: Mutex::new(State {
                regions: RegionTable::new(),
                maps: MapTable::new(),
                coherent: HashMap::new(),
                iova: IovaAllocator::new(base, size, iopath_heap::page_size() as u64),
                sink: None,
            }),
            freed: Condvar::new(),
        }
    }

    /// Free IOVA bytes (for leak checks).
    pub fn free_iova_bytes(&self) -> u64 {
        lock(&self.state).iova.free_bytes()
    }

    /// Waits per `wait` until `len` bytes of IOVA space can be allocated.
    fn alloc_iova<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        len: usize,
        wait: MapWait,
    ) -> Result<(MutexGuard<'a, State>, u64)> {
        take_space(&self.freed, st, wait, len, "IOVA space", |s| {
            s.iova.alloc(len as u64)
        })
    }
}

impl DmaOps for Iommu {
    fn name(&self) -> &'static str {
        "iommu"
    }

    fn register(&self, buf: &Buffer) -> Result<()> {
        lock(&self.state).regions.register(buf).map(drop)
    }

    fn unregister(&self, buf: &Buffer) -> Result<()> {
        lock(&self.state).regions.unregister_idle(buf, "iommu")
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
        let st = lock(&self.state);
        st.regions.registered(buf, "iommu")?;
        let (mut st, iova) = self.alloc_iova(st, len, wait)?;
        let rec = IotlbRecord::Update {
            iova,
            size: len as u64,
            uaddr: buf.addr() as u64 + offset as u64,
            perm: dir.perm(),
        };
        // The record is in effect before the mapping is handed out, so the
        // device can use the address as soon as it sees it.
        if let Err(e) = st.send(rec) {
            st.iova.free(iova, len as u64);
            return Err(e);
        }
        Ok(st.maps.insert(
            |id| Mapping::new(id, iova, len, dir),
            Entry {
                pinned: Pinned::new(buf, offset),
                iova,
            },
        ))
    }

    fn unmap(&self, mapping: &Mapping) -> Result<()> {
        let mut st = lock(&self.state);
        let e = st.maps.remove(mapping)?;
        // Invalidate before the IOVA can be handed out again.
        let sent = st.send(IotlbRecord::Invalidate {
            iova: e.iova,
            size: mapping.len() as u64,
        });
        st.iova.free(e.iova, mapping.len() as u64);
        drop(st);
        self.freed.notify_all();
        sent
    }

    fn sync_for_cpu(&self, mapping: &Mapping, offset: usize, len: usize) -> Result<()> {
        mapping.check_range(offset, len)?;
        lock(&self.state).maps.get_mut(mapping)?.pinned.release();
        Ok(())
    }

    fn sync_for_device(&self, mapping: &Mapping, offset: usize, len: usize) -> Result<()> {
        mapping.check_range(offset, len)?;
        lock(&self.state).maps.get_mut(mapping)?.pinned.repin();
        Ok(())
    }

    fn alloc_coherent(&self, len: usize) -> Result<Coherent> {
        let buf = alloc_shared(len)?;
        let mut st = lock(&self.state);
        st.regions.register(&buf)?;
        let Some(iova) = st.iova.alloc(buf.len() as u64) else {
            st.regions.unregister(&buf);
            return Err(Error::NoSpace {
                len,
                what: "IOVA space",
            });
        };
        let rec = IotlbRecord::Update {
            iova,
            size: buf.len() as u64,
            uaddr: buf.addr() as u64,
            perm: Perm::ReadWrite,
        };
        if let Err(e) = st.send(rec) {
            st.iova.free(iova, buf.len() as u64);
            st.regions.unregister(&buf);
            return Err(e);
        }
        st.coherent.insert(
            iova,
            CoherentEntry {
                buffer: buf.clone(),
                len: buf.len() as u64,
            },
        );
        Ok(Coherent::new(buf, iova))
    }

    fn free_coherent(&self, mem: Coherent) -> Result<()> {
        let mut st = lock(&self.state);
        match st.coherent.get(&mem.addr()) {
            Some(c) if c.buffer.same_as(mem.buffer()) => {}
            _ => {
                return Err(Error::NotMapped {
                    id: 0,
                    addr: mem.addr(),
                })
            }
        }
        let c = st.coherent.remove(&mem.addr()).expect("checked");
        let sent = st.send(IotlbRecord::Invalidate {
            iova: mem.addr(),
            size: c.len,
        });
        st.iova.free(mem.addr(), c.len);
        st.regions.unregister(&c.buffer);
        drop(st);
        self.freed.notify_all();
        sent
    }

    fn max_mapping_size(&self) -> usize {
        usize::try_from(lock(&self.state).iova.size()).unwrap_or(usize::MAX)
    }

    fn regions(&self) -> Vec<SharedRegion> {
        lock(&self.state).regions.regions()
    }

    fn regions_generation(&self) -> u64 {
        lock(&self.state).regions.generation()
    }

    fn uses_iotlb(&self) -> bool {
        true
    }

    fn set_iotlb_sink(&self, sink: Arc<dyn IotlbSink>) -> Result<()> {
        let mut st = lock(&self.state);
        // Replay what is live, so the enforcer starts complete.
        for (m, e) in st.maps.iter() {
            sink.send(IotlbRecord::Update {
                iova: e.iova,
                size: m.len() as u64,
                uaddr: e.pinned.buffer.addr() as u64 + e.pinned.offset as u64,
                perm: m.dir().perm(),
            })
            .map_err(Error::Sink)?;
        }
        for (&iova, c) in &st.coherent {
            sink.send(IotlbRecord::Update {
                iova,
                size: c.len,
                uaddr: c.buffer.addr() as u64,
                perm: Perm::ReadWrite,
            })
            .map_err(Error::Sink)?;
        }
        st.sink = Some(sink);
        Ok(())
    }

    fn live_mappings(&self) -> usize {
        lock(&self.state).maps.len()
    }
}
