//! iopath-dma: the DMA API for iopath devices.
//!
//! Every buffer a driver gives a device goes through a [`DmaOps`]
//! implementation, modelled on the kernel's per-device `dma_map_ops`:
//!
//! - [`Direct`]: the device address is the buffer's address in a registered
//!   region (zero copy);
//! - [`Iommu`]: IOVAs from an allocator; every map/unmap sends an IOTLB
//!   update/invalidate ([`IotlbRecord`]) to the enforcer's [`IotlbSink`];
//! - [`Bounce`]: a small shared window cut into slots; map copies in, unmap
//!   copies out; only the window (and coherent ring memory) is ever shared.
//!
//! Which of them a device gets is virtio's decision, made after feature
//! negotiation: `iopath_virtio::Policy`, the platform hook.
//!
//! ```text
//!  driver ─ Buffer ─► DmaOps::map ─► Mapping { addr, len } ─► descriptor
//!                        │   pins the Buffer (busy) until unmap
//!                        ├─ regions(): fds + addresses the transport shares
//!                        └─ IotlbSink: IOTLB records (Iommu only)
//! ```
//!
//! How a driver uses it:
//!
//! ```
//! use iopath_dma::{Direct, Direction, DmaOps, MapWait};
//! use iopath_heap::{Heap, HugePages, MemfdHeap};
//!
//! let ops = Direct::new();
//! let buf = MemfdHeap::new(HugePages::None).alloc(4096)?;
//! ops.register(&buf)?;                       // the device can now see it
//! buf.write_at(0, b"request")?;
//! let m = ops.map(&buf, 0, 7, Direction::ToDevice, MapWait::Block)?;
//! // m.addr() goes into a descriptor; the buffer is busy meanwhile:
//! assert!(buf.write_at(0, b"x").is_err());
//! ops.unmap(&m)?;
//! buf.write_at(0, b"x")?;                    // the CPU's again
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

mod bounce;
mod direct;
mod error;
mod iommu;
mod iova;
mod ops;
mod table;
#[cfg(feature = "test-util")]
pub mod testing;

pub use bounce::{Bounce, DEFAULT_SLOT};
pub use direct::Direct;
pub use error::{Error, Result};
pub use iommu::{Iommu, DEFAULT_IOVA_BASE, DEFAULT_IOVA_SIZE};
pub use iova::IovaAllocator;
pub use ops::{
    Coherent, Direction, DmaAddr, DmaOps, IotlbRecord, IotlbSink, MapWait, Mapping, Perm,
    SharedRegion,
};
