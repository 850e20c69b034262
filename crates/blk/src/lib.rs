//! iopath-blk: virtio-blk both ways.
//!
//! The driver ([`BlkDriver`]) is a block-device API over any virtio
//! [`Transport`](iopath_virtio::Transport) and any DMA ops: every request is
//! a header, data and status descriptor chain whose data addresses come
//! from the ops.
//!
//! ```text
//!   BlkQueue::submit(Request::Write{..}) ─► cut by size_max/seg_max/max mapping
//!        ─► SplitQueue::add ─► DmaOps::map ─► transport notify ─► device
//!   BlkQueue::complete() ◄─ status byte ◄─ unmap ◄─ used ring ◄─ interrupt
//! ```

pub mod driver;

pub use driver::{BlkConfig, BlkDriver, BlkError, BlkQueue, Done, DriverOptions, Request};
