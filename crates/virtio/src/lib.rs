//! iopath-virtio: virtio queues and transports.
//!
//! Driver side: a split virtqueue ([`SplitQueue`]) whose every descriptor
//! address comes from `iopath-dma`, feature negotiation ([`driver`]),
//! `EVENT_IDX` notification suppression and indirect descriptors.
//! Transports implement
//! [`Transport`]: [`transport::vhost_user::VhostUser`] is a vhost-user front
//! end (regions passed as fds, `IOTLB_MSG` for IOMMU ops);
//! [`transport::loopback::Loopback`] runs a device in a second thread on
//! rust-vmm's `virtio-queue` over its own mappings of the shared fds.
//! The platform hook, [`Policy`], picks each device's DMA ops after feature
//! negotiation (direct, IOMMU or bounce). Device side: [`device`], a
//! vhost-user back end with IOTLB enforcement. Both sides wait through
//! [`Poller`] ([`poll`]): poll the ring for a while after work, then
//! re-enable notifications, look again, and sleep.
//!
//! ```text
//!  driver ── Seg(Buffer) ─► SplitQueue::add ─► DmaOps::map ─► descriptors
//!     ▲                         │ avail.idx               (coherent ring)
//!     │                         ▼ should_notify ─► Transport::notify ─► device
//!  Completion{token,len} ◄─ pop_used ◄─ unmap ◄─ used ring ◄─ interrupt
//! ```
//!
//! How a device driver uses it:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use iopath_dma::{Direct, DmaOps};
//! use iopath_heap::{Heap, HugePages, MemfdHeap};
//! use iopath_virtio::transport::loopback::{Echo, Loopback};
//! use iopath_virtio::{driver, features, share_memory, QueueFeatures, Seg, SplitQueue, Transport};
//!
//! let dev = Loopback::new(Echo::default())?;
//! let wanted = features::VIRTIO_F_EVENT_IDX | features::VIRTIO_F_INDIRECT_DESC;
//! let negotiated = driver::negotiate(&dev, wanted, 0)?;
//!
//! let ops = Arc::new(Direct::new());          // a device driver asks the Policy instead
//! let mut q = SplitQueue::new(ops.clone(), 0, 64, QueueFeatures::from_bits(negotiated))?;
//! dev.setup_queue(0, &q.config())?;
//!
//! let heap = MemfdHeap::new(HugePages::None);
//! let (req, resp) = (heap.alloc(4096)?, heap.alloc(4096)?);
//! ops.register(&req)?;                         // Direct: the device must see them
//! ops.register(&resp)?;
//! share_memory(&dev, &*ops)?;                  // rings + buffers -> device
//! driver::driver_ok(&dev)?;
//!
//! req.write_at(0, b"ping")?;
//! q.add(&[Seg::buf(&req, 0, 4)], &[Seg::buf(&resp, 0, 4)], 7)?;
//! if q.should_notify() { dev.notify(0)?; }
//! let done = loop {
//!     if let Some(c) = q.pop_used()? { break c; }
//!     dev.wait_interrupt(0, Some(Duration::from_secs(5)))?;
//! };
//! assert_eq!((done.token, done.len), (7, 4));
//! let mut out = [0u8; 4];
//! resp.read_at(0, &mut out)?;
//! assert_eq!(&out, b"ping");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod device;
pub mod driver;
mod error;
pub mod features;
pub mod policy;
pub mod poll;
pub mod queue;
pub mod transport;
pub mod vhost_wire;

pub use error::{DeviceError, Error, Result};
pub use features::QueueFeatures;
pub use policy::{BounceGeometry, Choice, Platform, Policy, PolicyError, PolicyOps};
pub use poll::{PollMode, Polled, Poller, Waited};
pub use queue::{Completion, RingPlacement, Seg, SplitQueue};
pub use transport::{share_memory, QueueConfig, Transport};
