//! iopath-blk: virtio-blk both ways.
//!
//! The driver ([`driver`]) is a block-device API over any virtio transport
//! and any DMA ops: every request is a header, data and status descriptor
//! chain whose addresses come from the DMA ops.
//!
//! ```text
//!   BlkDriver::write(offset, Buffer) ─► DmaOps::map ─► split virtqueue ─► transport ─► device
//! ```

pub mod driver;

pub use driver::BlkConfig;
