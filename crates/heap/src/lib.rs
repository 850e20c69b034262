//! iopath-heap: fd-backed shareable buffers and the fastest ways to fill them.
//!
//! A [`Buffer`] is an owned file descriptor (a memfd, a udmabuf or a dma-heap
//! dma-buf), its length and a shared mapping of it. Buffers come from a
//! [`Heap`], can be handed to another process over a unix socket
//! ([`Buffer::export`], [`Buffer::import`]) and are only ever touched through
//! volatile-aware accessors, because another process or a device may be
//! writing them at the same time.
//!
//! ```text
//!   Heap::alloc ──► Buffer { fd, len, mapping } ──export──► other process
//!                        ▲
//!   file ──transfer──────┘   (buffered | direct | sendfile | uring | auto)
//! ```
//!
//! A buffer that is mapped for a device (see the `iopath-dma` crate) is
//! *busy*: CPU writes through [`Buffer::write_at`] and file transfers into it
//! are refused with [`Error::Busy`] until the device mapping is gone.

mod align;
mod bounce;
mod buffer;
mod engine;
mod error;
mod file;
mod heap;
mod loader;
mod mmap;
mod sys;

pub use align::DioAlign;
pub use buffer::{Buffer, DevicePin};
pub use engine::{
    new_engine, BufferedEngine, DirectEngine, Engine, EngineOptions, Method, NextReq, Pull,
    ReadReq, ReqDone, SendfileEngine, Transfer, UringEngine,
};
pub use error::{Error, Result};
pub use file::IoFile;
pub use heap::{open_heap, DmaHeap, Heap, HeapKind, HugePages, MemfdHeap, UdmabufHeap};
pub use loader::{load, LoadOptions, LoadStats, Loaded, Prefault, Progress};

/// The system page size in bytes.
pub fn page_size() -> usize {
    rustix::param::page_size()
}
