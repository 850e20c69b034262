//! iopath-heap: fd-backed shareable buffers and the fastest ways to fill them.
//!
//! A [`Buffer`] is an owned file descriptor (a memfd, a udmabuf or a dma-heap
//! dma-buf), its length and a shared mapping of it. Buffers come from a
//! [`Heap`], can be handed to another process over a unix socket
//! ([`Buffer::export`], [`Buffer::import`]) and are only ever touched through
//! volatile-aware accessors ([`Buffer::read_at`], [`Buffer::write_at`], or a
//! bounds-checked [`BufRange`] borrowed from the buffer, as vm-memory's
//! `VolatileSlice`), because another process or a device may be writing
//! them at the same time. A raw pointer comes out only through a range's
//! [`BufRange::ptr_guard`], for code that can take nothing else.
//!
//! ```text
//!   open_heap / choose_heap ──► Heap::alloc ──► Buffer { fd, len, mapping } ──export / Share──► other process
//!                                                 ▲
//!   IoFile ──Engine::read─────────────────────────┘  (buffered | direct | sendfile | uring | bounce | auto)
//!              ▲
//!   load, load_safetensors (buffers allocated on a thread of their own,
//!                           overlapped with the reads)
//! ```
//!
//! Files are moved in and out of buffers by an [`Engine`] (chosen at run
//! time with [`new_engine`]): file range to buffer range and back, unaligned
//! heads and tails staged through an aligned buffer for direct I/O, a
//! per-request fall-back to buffered I/O where the file system refuses
//! `O_DIRECT`. `auto` is cache-aware: the runs of a file already in the
//! page cache ([`cache_runs`]) are copied out of it while the cold ones are
//! read with direct I/O, at the same time, and the cold ones stay out of
//! the cache. [`load`] fills N buffers from a file with allocation on its
//! own thread, overlapped with the reads:
//!
//! ```
//! use iopath_heap::{load, open_heap, LoadOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("model.bin");
//! let data: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
//! std::fs::write(&path, &data)?;
//! let heap = open_heap("memfd")?;
//! let loaded = load(&path, heap.as_ref(), &LoadOptions::default(), &mut |p| {
//!     eprintln!("{}/{} bytes", p.bytes, p.total);
//! })?;
//! loaded.verify(&path)?; // every buffer equals its part of the file
//! let mut head = [0u8; 4];
//! loaded.buffers[0].read_at(0, &mut head)?;
//! assert_eq!(head, [0, 1, 2, 3]);
//! println!("{:.2} GiB/s with {}", loaded.stats.gib_per_s(), loaded.stats.method);
//! # Ok(())
//! # }
//! ```
//!
//! [`load_safetensors`] lays a safetensors checkpoint out tensor by tensor
//! (each whole in one buffer, aligned for its dtype; header parsed and
//! checked by the `safetensors` crate) and returns name → [`Tensor`]
//! (buffer, offset, dtype, shape): one file, or every shard of a sharded
//! checkpoint (a directory or its `model.safetensors.index.json`), several
//! shards at once, all or nothing. With [`LoadOptions::map_cached`]
//! (`map`), a tensor the page cache holds whole is not copied: it is a
//! view of its file, a [`Buffer::map_file`] buffer (the file mapped
//! private, its pages made resident). [`Loaded::verify`] and
//! [`Tensors::verify`] compare what was loaded with the files, read again.
//!
//! A loaded model can be handed to other processes of the same user:
//! [`Share::serve`] serves its buffers' fds and a table of its tensors on a
//! unix socket; [`attach`] with the share's handle maps the same buffers
//! there, with no read and no copy, once it has checked what it got: a
//! server of its own user, and buffers no one can shrink under it.
//!
//! Heaps are chosen per kernel by [`choose_heap`] (`open_heap("auto")`): a
//! dma-heap whose mapping takes direct I/O, else udmabuf (whose buffers are
//! mapped through the memfd under the dma-buf, so direct I/O fills them),
//! else memfd. A [`Pool`] wraps a heap and keeps dropped buffers for the
//! next load.
//!
//! A buffer that is mapped for a device (see the `iopath-dma` crate) is
//! *busy*: CPU writes through [`Buffer::write_at`] or a [`BufRange`] and file
//! transfers into it are refused with [`Error::Busy`] until the device
//! mapping is gone.

mod align;
mod aligned;
mod buffer;
mod choose;
mod engine;
mod error;
mod file;
mod header_keys;
mod heap;
mod limits;
mod loader;
mod mmap;
mod pool;
mod range;
mod ring;
mod share;
mod summary;
mod survey;
mod sys;
mod tensors;
mod verify;

pub use align::DioAlign;
pub use aligned::AlignedBuf;
pub use buffer::{Buffer, DevicePin, POPULATE_READ, TOUCH_READ};
pub use choose::{choose_heap, open_heap, HeapChoice};
pub use engine::{
    cache_runs, new_engine, new_engine_sharing, AutoEngine, BounceEngine, BufferedEngine,
    CacheLookup, CacheRun, CheckedRead, DirectEngine, Engine, EngineOptions, Method, NextReq,
    Probe, Pull, ReadReq, ReqDone, SendfileEngine, SharedChoice, Transfer, UringEngine,
    CACHE_GRAIN, DIRECT_MARGIN, PROBE_BYTES, PROBE_SLICES,
};
pub use error::{Error, Result};
pub use file::IoFile;
pub use heap::{DmaHeap, Heap, HeapKind, HugePages, MemfdHeap, UdmabufHeap};
pub use loader::{load, LoadOptions, LoadStats, Loaded, Prefault, Progress};
pub use mmap::{SharedMapping, SigbusGuard};
pub use pool::Pool;
pub use range::{BufRange, PtrGuard};
pub use share::{attach, Attached, Share, SharedTensor, DEFAULT_ATTACH_TIMEOUT};
pub use survey::{survey_heaps, HeapStatus};
pub use tensors::{
    dtype_align, load_checkpoint, load_safetensors, Dtype, Shard, Tensor, Tensors,
    DEFAULT_SHARDS_AT_ONCE, MAX_HEADER,
};
#[doc(hidden)]
pub use tensors::{fuzz_checkpoint_index, fuzz_safetensors};

/// The system page size in bytes.
pub fn page_size() -> usize {
    rustix::param::page_size()
}
