//! The DMA ops trait and the plain data it trades in.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use iopath_heap::Buffer;
use vhost::VhostAccess;

use crate::{Error, Result};

/// A device address: an address in the device's view of memory (a
/// guest-physical address for [`crate::Direct`] and [`crate::Bounce`], an IOVA
/// for [`crate::Iommu`]).
pub type DmaAddr = u64;

/// Which way the data of a mapping flows (the kernel's
/// `enum dma_data_direction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// The device reads the buffer (driver → device).
    ToDevice,
    /// The device writes the buffer (device → driver).
    FromDevice,
    /// Both.
    Bidirectional,
}

impl Direction {
    /// Whether the device may read the mapping.
    pub fn device_reads(self) -> bool {
        matches!(self, Direction::ToDevice | Direction::Bidirectional)
    }

    /// Whether the device may write the mapping.
    pub fn device_writes(self) -> bool {
        matches!(self, Direction::FromDevice | Direction::Bidirectional)
    }

    /// The IOTLB permission this direction grants the device.
    pub fn perm(self) -> Perm {
        match self {
            Direction::ToDevice => Perm::ReadOnly,
            Direction::FromDevice => Perm::WriteOnly,
            Direction::Bidirectional => Perm::ReadWrite,
        }
    }
}

/// What to do when a mapping cannot be made right now because the ops'
/// space (bounce slots, IOVAs) is in use: the caller's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapWait {
    /// Fail at once with [`Error::NoSpace`].
    Fail,
    /// Block until enough space is unmapped.
    Block,
    /// Block at most this long, then fail with [`Error::NoSpace`].
    Timeout(Duration),
}

/// A live DMA mapping: the device address and length the device may use.
///
/// Plain data, like the kernel's `dma_addr_t` plus length: the ops keep the
/// state (pin, bounce slot, IOTLB entry) and find it by `id`. Unmapping the
/// same mapping twice, or a mapping the ops never made, is
/// [`Error::NotMapped`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mapping {
    id: u64,
    addr: DmaAddr,
    len: usize,
    dir: Direction,
}

impl Mapping {
    /// Makes the handle; ops implementations call this from `map`.
    pub fn new(id: u64, addr: DmaAddr, len: usize, dir: Direction) -> Self {
        Mapping { id, addr, len, dir }
    }

    /// The ops' id of this mapping.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Device address of the first byte.
    pub fn addr(&self) -> DmaAddr {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never true: zero-length maps are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Direction it was mapped for.
    pub fn dir(&self) -> Direction {
        self.dir
    }

    /// Checks that `offset..offset+len` lies inside the mapping.
    ///
    /// # Errors
    /// [`Error::OutsideMapping`] otherwise.
    pub fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutsideMapping {
                offset,
                len,
                map_len: self.len,
            }),
        }
    }
}

/// Coherent memory: a buffer that both the CPU and the device may access at
/// any time without syncs (virtqueue rings, indirect tables, small headers).
/// It lies in a [`SharedRegion`] and has a fixed device address.
#[derive(Debug)]
pub struct Coherent {
    buffer: Buffer,
    addr: DmaAddr,
}

impl Coherent {
    /// Makes the handle; ops implementations call this from `alloc_coherent`.
    pub fn new(buffer: Buffer, addr: DmaAddr) -> Self {
        Coherent { buffer, addr }
    }

    /// The memory, for CPU access.
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// Device address of the first byte.
    pub fn addr(&self) -> DmaAddr {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Whether it has no bytes (never true).
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }
}

/// A memory region the device must be able to see: what a vhost-user front
/// end puts in `SET_MEM_TABLE` (guest address, size, user address, fd, mmap
/// offset 0) and what a back end maps.
#[derive(Debug, Clone)]
pub struct SharedRegion {
    /// The memory (its fd is what gets shared).
    pub buffer: Buffer,
    /// Where the region starts in the device's physical view
    /// ("guest physical address").
    pub gpa: u64,
}

impl SharedRegion {
    /// The driver's userspace address of the region (the mem-table's
    /// `userspace_addr`; IOTLB records translate IOVAs to these).
    pub fn uaddr(&self) -> u64 {
        self.buffer.addr() as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Whether the region is empty (never true).
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }
}

/// What the device may do through an IOTLB entry: vhost's `VHOST_ACCESS_*`
/// permission ([`VhostAccess`]) without its "no access" value, which no
/// mapping carries. The one permission type of iopath: the DMA ops, the
/// vhost-user codec and the IOTLBs that enforce it all use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Perm {
    /// Device may read (`VHOST_ACCESS_RO`).
    ReadOnly,
    /// Device may write (`VHOST_ACCESS_WO`).
    WriteOnly,
    /// Device may read and write (`VHOST_ACCESS_RW`).
    ReadWrite,
}

impl Perm {
    const ALL: [Perm; 3] = [Perm::ReadOnly, Perm::WriteOnly, Perm::ReadWrite];

    /// The vhost permission.
    pub fn access(self) -> VhostAccess {
        match self {
            Perm::ReadOnly => VhostAccess::ReadOnly,
            Perm::WriteOnly => VhostAccess::WriteOnly,
            Perm::ReadWrite => VhostAccess::ReadWrite,
        }
    }

    /// The vhost-user wire value (the `perm` byte of `struct vhost_iotlb_msg`).
    pub fn to_wire(self) -> u8 {
        self.access() as u8
    }

    /// Parses the wire value; `None` for "no access" and anything unknown.
    pub fn from_wire(perm: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.to_wire() == perm)
    }

    /// Whether this permission allows `other`.
    pub fn allows(self, other: Perm) -> bool {
        self == Perm::ReadWrite || self == other
    }
}

impl From<Perm> for VhostAccess {
    fn from(p: Perm) -> Self {
        p.access()
    }
}

/// One IOTLB message for the enforcer (vhost-user `VHOST_USER_IOTLB_MSG`
/// payload, `struct vhost_iotlb_msg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IotlbRecord {
    /// `VHOST_IOTLB_UPDATE`: IOVA range → driver userspace address.
    Update {
        /// First IOVA.
        iova: u64,
        /// Length in bytes.
        size: u64,
        /// Driver userspace address the IOVA maps to (inside a shared region).
        uaddr: u64,
        /// What the device may do.
        perm: Perm,
    },
    /// `VHOST_IOTLB_INVALIDATE`: the IOVA range is gone.
    Invalidate {
        /// First IOVA.
        iova: u64,
        /// Length in bytes.
        size: u64,
    },
}

/// Whoever enforces IOTLB records: a vhost-user front end forwards them as
/// `IOTLB_MSG` to the back end, the loopback transport applies them to its
/// device-side IOMMU. `send` must not return before the record is in effect
/// (for an invalidate: before the device can no longer use the range).
pub trait IotlbSink: Send + Sync + fmt::Debug {
    /// Delivers one record.
    ///
    /// # Errors
    /// Whatever the channel fails with; the map or unmap then fails with
    /// [`Error::Sink`].
    fn send(&self, record: IotlbRecord) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}

/// Per-device DMA ops, after the kernel's `struct dma_map_ops`: every
/// buffer a driver hands a device goes through one of these.
///
/// Object-safe: a driver may hold `Arc<dyn DmaOps>` (chosen at run time by
/// `iopath_virtio::Policy`) or be generic over one concrete type.
pub trait DmaOps: Send + Sync + fmt::Debug {
    /// Short name ("direct", "iommu", "bounce", ...).
    fn name(&self) -> &'static str;

    /// Makes `buf` mappable: ops whose device sees driver memory ([`crate::Direct`],
    /// [`crate::Iommu`]) add it to their shared regions (the transport must
    /// share them again); [`crate::Bounce`] needs nothing and accepts any buffer.
    ///
    /// # Errors
    /// [`Error::AlreadyRegistered`], [`Error::AddressSpace`].
    fn register(&self, buf: &Buffer) -> Result<()>;

    /// Withdraws a registered buffer.
    ///
    /// # Errors
    /// [`Error::NotRegistered`]; [`Error::Heap`] (busy) while it is mapped.
    fn unregister(&self, buf: &Buffer) -> Result<()>;

    /// Maps `len` bytes of `buf` at `offset` for `dir` and returns the device
    /// address. The buffer is pinned ([`Buffer::pin_for_device`]): CPU
    /// writes and file transfers into it are refused until it is unmapped (or
    /// handed back with [`DmaOps::sync_for_cpu`]).
    ///
    /// # Errors
    /// [`Error::ZeroLength`], [`Error::Heap`] (range outside the buffer, or
    /// the buffer is busy with a transfer), [`Error::NotRegistered`] (the
    /// device cannot see it), [`Error::TooLarge`], [`Error::NoSpace`] (per
    /// `wait`), [`Error::Sink`].
    fn map(
        &self,
        buf: &Buffer,
        offset: usize,
        len: usize,
        dir: Direction,
        wait: MapWait,
    ) -> Result<Mapping>;

    /// Ends a mapping: from-device data is in the buffer afterwards and the
    /// buffer is no longer pinned by it.
    ///
    /// # Errors
    /// [`Error::NotMapped`] for a mapping these ops do not hold (double
    /// unmap included), [`Error::Sink`].
    fn unmap(&self, mapping: &Mapping) -> Result<()>;

    /// Gives the CPU ownership of `offset..offset+len` of a live mapping:
    /// device-written bytes become visible in the buffer, and the buffer is
    /// no longer busy on behalf of this mapping until
    /// [`DmaOps::sync_for_device`].
    ///
    /// # Errors
    /// [`Error::NotMapped`], [`Error::OutsideMapping`].
    fn sync_for_cpu(&self, mapping: &Mapping, offset: usize, len: usize) -> Result<()>;

    /// Gives the device ownership again: CPU-written bytes of
    /// `offset..offset+len` become visible to the device and the buffer is
    /// pinned again.
    ///
    /// # Errors
    /// [`Error::NotMapped`], [`Error::OutsideMapping`].
    fn sync_for_device(&self, mapping: &Mapping, offset: usize, len: usize) -> Result<()>;

    /// Allocates at least `len` bytes of zeroed coherent memory (page
    /// multiple) in a shared region, mapped read/write for the device.
    ///
    /// # Errors
    /// [`Error::ZeroLength`], [`Error::Heap`], [`Error::Sink`].
    fn alloc_coherent(&self, len: usize) -> Result<Coherent>;

    /// Frees coherent memory from [`DmaOps::alloc_coherent`]; the device can
    /// no longer reach it.
    ///
    /// # Errors
    /// [`Error::NotMapped`] if it did not come from these ops, [`Error::Sink`].
    fn free_coherent(&self, mem: Coherent) -> Result<()>;

    /// The largest single mapping.
    fn max_mapping_size(&self) -> usize;

    /// The regions the device must be able to see right now. A transport
    /// shares them (again) whenever the list changes; see
    /// [`DmaOps::regions_generation`].
    fn regions(&self) -> Vec<SharedRegion>;

    /// A counter that changes whenever [`DmaOps::regions`] does.
    fn regions_generation(&self) -> u64;

    /// Whether device addresses are translated through IOTLB records (the
    /// device needs `VIRTIO_F_ACCESS_PLATFORM` and an enforcer).
    fn uses_iotlb(&self) -> bool {
        false
    }

    /// Connects the enforcer. Ops that use an IOTLB replay every live mapping
    /// into the new sink, then send each later map/unmap to it. Others ignore it.
    ///
    /// # Errors
    /// [`Error::Sink`] if replaying fails.
    fn set_iotlb_sink(&self, sink: Arc<dyn IotlbSink>) -> Result<()> {
        let _ = sink;
        Ok(())
    }

    /// Number of live mappings (coherent allocations not included); for leak
    /// checks.
    fn live_mappings(&self) -> usize;
}

macro_rules! forward_ops {
    ($($ptr:ty),*) => {$(
        impl<T: DmaOps + ?Sized> DmaOps for $ptr {
            fn name(&self) -> &'static str { (**self).name() }
            fn register(&self, buf: &Buffer) -> Result<()> { (**self).register(buf) }
            fn unregister(&self, buf: &Buffer) -> Result<()> { (**self).unregister(buf) }
            fn map(&self, buf: &Buffer, offset: usize, len: usize, dir: Direction, wait: MapWait) -> Result<Mapping> {
                (**self).map(buf, offset, len, dir, wait)
            }
            fn unmap(&self, mapping: &Mapping) -> Result<()> { (**self).unmap(mapping) }
            fn sync_for_cpu(&self, mapping: &Mapping, offset: usize, len: usize) -> Result<()> {
                (**self).sync_for_cpu(mapping, offset, len)
            }
            fn sync_for_device(&self, mapping: &Mapping, offset: usize, len: usize) -> Result<()> {
                (**self).sync_for_device(mapping, offset, len)
            }
            fn alloc_coherent(&self, len: usize) -> Result<Coherent> { (**self).alloc_coherent(len) }
            fn free_coherent(&self, mem: Coherent) -> Result<()> { (**self).free_coherent(mem) }
            fn max_mapping_size(&self) -> usize { (**self).max_mapping_size() }
            fn regions(&self) -> Vec<SharedRegion> { (**self).regions() }
            fn regions_generation(&self) -> u64 { (**self).regions_generation() }
            fn uses_iotlb(&self) -> bool { (**self).uses_iotlb() }
            fn set_iotlb_sink(&self, sink: Arc<dyn IotlbSink>) -> Result<()> { (**self).set_iotlb_sink(sink) }
            fn live_mappings(&self) -> usize { (**self).live_mappings() }
        }
    )*};
}

forward_ops!(&T, Arc<T>, Box<T>);
