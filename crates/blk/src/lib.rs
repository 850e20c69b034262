//! iopath-blk: virtio-blk both ways.
//!
//! The driver ([`BlkDriver`]) is a block-device API over any virtio
//! [`Transport`](iopath_virtio::Transport), with the DMA ops the platform
//! [`Policy`](iopath_virtio::Policy) picks after feature negotiation: every
//! request is a header, data and status descriptor chain whose data
//! addresses come from the ops.
//!
//! ```text
//!   BlkQueue::submit(Command::Write{..}) ─► cut by size_max/seg_max/max mapping
//!        ─► SplitQueue::add ─► DmaOps::map ─► transport notify ─► device
//!   BlkQueue::complete() ◄─ status byte ◄─ unmap ◄─ used ring ◄─ interrupt
//! ```
//!
//! The workload API ([`workload`]) drives a driver like `dd` or fio: many
//! blocks in flight per queue, sequential or random offsets, a pattern and
//! its verification, per-run timings. [`dd::run`] is the whole of it
//! against a vhost-user-blk socket: connect, apply the platform policy (or
//! the [`DmaMode`] override), drive, report; `iopath blk dd` and `iopath
//! bench blk` both call it.
//!
//! The back end ([`BlkBackend`]) is a vhost-user-blk device that serves a
//! raw image file with direct I/O through io_uring, one worker thread per
//! queue, on `iopath_virtio::device::VhostUserServer`:
//!
//! ```text
//!  descriptor chain ─► request::Request::parse ─► checked segments
//!     ─► io_uring readv/writev/fsync on the image (O_DIRECT; staged in an
//!        aligned buffer when the front end's is not) ─► status byte + used ring ─► call eventfd
//! ```
//!
//! [`Exports`] serves many images from one process, each on its own socket
//! with its own settings ([`ExportSpec`], parsed from `image=PATH,
//! socket=PATH[,readonly][,queues=N]...`), each by its own server thread:
//! what `iopath blk serve` runs.
//!
//! Both sides read and write the wire format through the same `#[repr(C)]`
//! structs ([`wire`]: `virtio-bindings`' layouts with
//! [`ByteValued`](vm_memory::ByteValued)):
//!
//! ```
//! use iopath_blk::wire::{OutHeader, HEADER_LEN, VIRTIO_BLK_T_OUT};
//! use vm_memory::ByteValued;
//!
//! // The driver writes a header...
//! let sent = OutHeader::new(VIRTIO_BLK_T_OUT, 8);
//! assert_eq!(sent.as_slice().len(), HEADER_LEN);
//! // ...and the back end reads it back whole.
//! let mut got = OutHeader::default();
//! got.as_mut_slice().copy_from_slice(sent.as_slice());
//! assert_eq!((got.kind(), got.sector()), (VIRTIO_BLK_T_OUT, 8));
//! ```

pub mod backend;
mod command;
pub mod config;
pub mod dd;
pub mod driver;
mod error;
mod executor;
pub mod export;
mod image;
mod names;
mod plan;
mod queue;
mod queue_wait;
pub mod request;
pub mod wire;
pub mod workload;

pub use backend::{BackendError, BlkBackend, BlkOptions};
pub use dd::{DdConfig, DdError, DdReport, DmaMode};
pub use driver::{BlkDriver, BlkError, BlkQueue, Command, DeviceConfig, Done, DriverOptions};
pub use export::{ExportError, ExportSpec, Exports};
pub use iopath_virtio::PollMode;
pub use names::UnknownName;
pub use workload::{Access, Blocks, Outcome, Workload, WorkloadError};
