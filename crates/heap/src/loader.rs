//! The loader: N buffers of one size filled from a file, allocation
//! overlapped with I/O.
//!
//! ```text
//!   allocator thread:  alloc+populate #0 ─► #1 ─► #2 ─► ...
//!                            │ channel      │       │
//!   caller's thread:         └─► read #0 ───┴► read #1 ┴► read #2 ...
//! ```
//!
//! The allocator thread allocates each buffer and its pages (see
//! [`Prefault`]) while the caller's thread is reading into the previous ones,
//! so page allocation overlaps the I/O instead of adding to it.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::engine::{new_engine, Engine, EngineOptions, Method, Probe, Pull, ReadReq, Transfer};
use crate::file::IoFile;
use crate::{Buffer, Error, Heap, Result};

/// What to load and how.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// Bytes per buffer (a page multiple).
    pub buffer_size: usize,
    /// How many buffers; `None` for as many as the file needs (the last one
    /// partly filled). With `Some(n)` the file must hold `n * buffer_size`
    /// bytes.
    pub buffers: Option<usize>,
    /// Transfer method.
    pub method: Method,
    /// Engine tunables (io_uring queue depth, request size).
    pub engine: EngineOptions,
    /// What the allocator threads do to a new buffer's pages.
    pub prefault: Prefault,
    /// Allocator threads (default 1); for a sharded checkpoint, that many
    /// for each shard loading at once, all of them making every shard's
    /// buffers in turn.
    pub alloc_threads: usize,
    /// Safetensors loads only (`map` by name, see
    /// [`LoadOptions::set_method`]): a tensor whose bytes are all in the
    /// page cache when the load starts becomes a view of the file itself
    /// (a [`crate::HeapKind::File`] buffer: the file mapped private, its
    /// pages made resident, nothing copied) instead of a copy; the other
    /// tensors are read by `method` as usual. Such views share the page
    /// cache: a later write to the file shows through them, and a file
    /// truncated under them loses its pages (read as zeros, see
    /// [`crate::Buffer::map_file`]). Default off: every tensor is memory of
    /// its own.
    pub map_cached: bool,
}

impl LoadOptions {
    /// Sets the method by its command-line name: one of [`Method`]'s, or
    /// `map` ([`Method::Auto`] with [`LoadOptions::map_cached`]).
    ///
    /// # Errors
    /// [`Error::UnknownMethod`] for any other name.
    pub fn set_method(&mut self, name: &str) -> Result<()> {
        (self.method, self.map_cached) = match name {
            "map" => (Method::Auto, true),
            other => (other.parse()?, false),
        };
        Ok(())
    }

    /// The method's command-line name (`map` with
    /// [`LoadOptions::map_cached`]).
    pub fn method_name(&self) -> &'static str {
        if self.map_cached {
            "map"
        } else {
            self.method.name()
        }
    }

    /// The page size, once `buffer_size` is checked to be a non-zero
    /// multiple of it (both loaders start here).
    pub(crate) fn checked_page(&self) -> Result<usize> {
        let page = crate::page_size();
        if self.buffer_size == 0 || self.buffer_size % page != 0 {
            return Err(Error::BadSize {
                size: self.buffer_size,
                page,
            });
        }
        Ok(page)
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            buffer_size: 32 << 20,
            buffers: None,
            method: Method::Auto,
            engine: EngineOptions::default(),
            prefault: Prefault::Auto,
            alloc_threads: 1,
            map_cached: false,
        }
    }
}

/// How the loader's allocator threads prepare a new buffer's pages, so the
/// reading thread does not pay for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefault {
    /// [`Prefault::Map`] for every method. The default. (`Allocate` for
    /// io_uring was measured slower: see [`Prefault::Allocate`].)
    Auto,
    /// Nothing: pages are allocated when the transfer first touches them.
    None,
    /// Allocate (and zero) the pages up front with `fallocate(2)`; mapping
    /// them into page tables is left to the transfer (io_uring's buffer
    /// registration does it on the reading thread). Splits the page work
    /// across two threads, but the reading thread then faults in every
    /// page of a buffer before its first request can go: cold 1 GiB
    /// safetensors loads with `uring` ran 0.41-0.66 GiB/s this way against
    /// 0.61-1.06 with [`Prefault::Map`], lower in each of 6 alternating
    /// rounds.
    Allocate,
    /// Allocate and map every page up front (`MADV_POPULATE_WRITE`).
    Map,
}

impl std::str::FromStr for Prefault {
    type Err = Error;

    /// Parses `auto`, `none`, `allocate` or `map`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Prefault::Auto),
            "none" => Ok(Prefault::None),
            "allocate" => Ok(Prefault::Allocate),
            "map" => Ok(Prefault::Map),
            _ => Err(Error::UnknownPrefault(s.to_string())),
        }
    }
}

/// Progress, reported after each buffer is filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Bytes loaded so far (of every shard of a checkpoint).
    pub bytes: u64,
    /// Bytes to load in all.
    pub total: u64,
    /// Reads done so far: one per buffer for [`load`]; a safetensors load
    /// may fill a buffer with several.
    pub buffers: usize,
    /// Reads in all.
    pub buffers_total: usize,
    /// The file the last read was in: 0 but for a sharded checkpoint,
    /// where it is the shard's index (files ordered by name).
    pub shard: usize,
    /// Files being loaded: 1 but for a sharded checkpoint.
    pub shards: usize,
    /// Bytes of that file loaded so far.
    pub shard_bytes: u64,
    /// Bytes to load from that file.
    pub shard_total: u64,
}

/// What a load took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadStats {
    /// Bytes read from the file.
    pub bytes: u64,
    /// Buffers filled.
    pub buffers: usize,
    /// Bytes per buffer: the size asked for, or less when the whole file
    /// fits in one smaller buffer (a buffer is never larger than what it
    /// holds, rounded up to the heap's granule).
    pub buffer_size: usize,
    /// Time spent allocating (and populating) buffers, on the allocator
    /// thread, overlapped with reads.
    pub alloc_time: Duration,
    /// Time spent in transfers on the reading thread (not counting waits for
    /// the allocator).
    pub read_time: Duration,
    /// Wall time from start to the last byte.
    pub elapsed: Duration,
    /// The method that moved the bytes (`auto` resolved).
    pub method: Method,
    /// Requests that fell back to buffered I/O.
    pub fallbacks: u64,
    /// Of `bytes`, those copied from the page cache because they were
    /// cached when the load began (`auto`); the rest were read from the
    /// device.
    pub from_cache: u64,
    /// What `auto` measured to choose its engine (`None` for the other
    /// methods).
    pub probe: Option<Probe>,
    /// Bytes of tensors that are views of their file (cached when the
    /// load began, [`LoadOptions::map_cached`]), made resident but neither
    /// read nor copied; not counted in `bytes`.
    pub mapped: u64,
    /// How the mapped bytes were made resident
    /// ([`crate::Buffer::populate_read_how`]); `None` when none were
    /// mapped.
    pub populate: Option<&'static str>,
}

impl LoadStats {
    /// Bytes made resident (read, copied or mapped) per second over the
    /// wall time, in GiB/s.
    pub fn gib_per_s(&self) -> f64 {
        (self.bytes + self.mapped) as f64
            / (1u64 << 30) as f64
            / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Loaded buffers and what it took.
#[derive(Debug)]
pub struct Loaded {
    /// The buffers, in file order; buffer `i` holds file bytes from
    /// `i * buffer_size`.
    pub buffers: Vec<Buffer>,
    /// Bytes of the file in each buffer (the last may be partial).
    pub lens: Vec<usize>,
    /// Statistics.
    pub stats: LoadStats,
}

/// How many buffers of what size for `size` bytes: `(buffers, bytes to
/// load, buffer size)`, refused up front when it cannot fit.
fn plan(
    file: &IoFile,
    size: u64,
    heap: &dyn Heap,
    opts: &LoadOptions,
) -> Result<(usize, u64, usize)> {
    let granule = heap.granule().max(1) as u64;
    let asked = opts.buffer_size as u64;
    let (n, total, bs) = match opts.buffers {
        Some(0) => return Err(Error::NoBuffers),
        Some(n) => {
            let total = (n as u64).saturating_mul(asked);
            if total > size {
                return Err(file.short(size, 0, usize::try_from(total).unwrap_or(usize::MAX)));
            }
            (n as u64, total, asked)
        }
        None => {
            let whole = size.div_ceil(granule).saturating_mul(granule);
            let bs = asked.min(whole);
            (size.div_ceil(bs), size, bs)
        }
    };
    heap.check_len(bs as usize)?;
    let needed = n.saturating_mul(bs);
    if let Some((available, what)) = heap.available() {
        if needed > available {
            return Err(Error::OutOfMemory {
                needed,
                available,
                what,
            });
        }
    }
    let room = crate::limits::buffer_room(usize::try_from(n).unwrap_or(usize::MAX));
    if n > room.buffers {
        let per = total.div_ceil(room.buffers.max(1));
        return Err(Error::TooManyBuffers {
            buffers: n,
            buffer_size: bs as usize,
            room: room.buffers,
            what: room.what,
            min_buffer_size: per.div_ceil(granule).saturating_mul(granule),
        });
    }
    Ok((usize::try_from(n).unwrap_or(usize::MAX), total, bs as usize))
}

/// Loads `path` into buffers from `heap`.
///
/// A buffer is never larger than what it will hold: when the whole file
/// fits in less than `opts.buffer_size`, one buffer of the file's size
/// (rounded up to the heap's granule) is made. Before anything is
/// allocated, the load is refused if its buffers cannot fit in the memory
/// the heap can give now ([`Heap::available`]) or if more buffers would be
/// needed than the process may have open files and mappings (the soft
/// open-file limit is raised to the hard one first).
///
/// # Errors
/// [`Error::Open`]/[`Error::NotAFile`] for a bad path, [`Error::EmptyFile`],
/// [`Error::UnknownSize`] for a file whose size is not its length (a /proc
/// or /sys file: size 0 with data, or 4096 with a line of text),
/// [`Error::BadSize`] for a buffer size that is not a page multiple,
/// [`Error::NoBuffers`] for `opts.buffers == Some(0)`,
/// [`Error::ShortFile`] when `opts.buffers` asks for more than the file has,
/// [`Error::OutOfMemory`], [`Error::TooManyBuffers`],
/// [`Error::BadQueueDepth`]/[`Error::BadChunk`] for bad engine tunables,
/// and any allocation or transfer error.
pub fn load(
    path: &Path,
    heap: &dyn Heap,
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Loaded> {
    let start = Instant::now();
    opts.checked_page()?;
    let file = IoFile::open(path)?;
    let size = file.size()?;
    if let Some(what) = file.size_is_not_length(size) {
        return Err(Error::UnknownSize {
            path: path.to_path_buf(),
            size,
            what,
        });
    }
    if size == 0 {
        return Err(Error::EmptyFile {
            path: path.to_path_buf(),
        });
    }
    let (n, total, buffer_size) = plan(&file, size, heap, opts)?;
    let bs = buffer_size as u64;
    let reads: Vec<Planned> = (0..n)
        .map(|i| {
            let off = i as u64 * bs;
            Planned {
                buf: i,
                buf_off: 0,
                file_off: off,
                len: (total - off).min(bs) as usize,
            }
        })
        .collect();
    let lens = reads.iter().map(|r| r.len).collect();
    let engine = new_engine(opts.method, opts.engine)?;
    let sizes = vec![buffer_size; n];
    let (buffers, mut stats) = fill(&file, heap, engine.as_ref(), &sizes, &reads, opts, progress)?;
    stats.buffer_size = buffer_size;
    stats.elapsed = start.elapsed();
    Ok(Loaded {
        buffers,
        lens,
        stats,
    })
}

/// One read of a planned load: `len` bytes of the file at `file_off` into
/// buffer number `buf` at `buf_off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Planned {
    pub buf: usize,
    pub buf_off: usize,
    pub file_off: u64,
    pub len: usize,
}

/// One allocated buffer (its index among the load's buffers), or the
/// allocation's error, with the time it took.
pub(crate) type Allocated = (usize, Result<(Buffer, Duration)>);

/// Allocates a buffer of `size` bytes from `heap` and prepares its pages
/// as `prefault` says; the time it took.
pub(crate) fn alloc_one(
    heap: &dyn Heap,
    size: usize,
    prefault: Prefault,
) -> Result<(Buffer, Duration)> {
    let t = Instant::now();
    let b = heap.alloc(size)?;
    // Every engine does best with pages mapped by the allocator thread
    // (io_uring registration then only pins them).
    let r = match prefault {
        Prefault::None => Ok(()),
        Prefault::Allocate => b.allocate_pages(),
        Prefault::Auto | Prefault::Map => b.populate(),
    };
    if let Err(e) = r {
        tracing::debug!("prefault failed ({e}); pages fault in during I/O");
    }
    Ok((b, t.elapsed()))
}

/// Allocates buffers of `sizes` from `heap` on allocator threads and runs
/// `reads` (ordered by buffer) through `engine` as the buffers arrive, so
/// allocation overlaps the I/O. `stats.elapsed` and `stats.buffer_size` are
/// left for the caller.
pub(crate) fn fill(
    file: &IoFile,
    heap: &dyn Heap,
    engine: &dyn Engine,
    sizes: &[usize],
    reads: &[Planned],
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(Vec<Buffer>, LoadStats)> {
    let n = sizes.len();
    let (tx, rx) = mpsc::channel::<Allocated>();
    let claimed = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..opts.alloc_threads.max(1) {
            let tx = tx.clone();
            let claimed = &claimed;
            s.spawn(move || loop {
                let i = claimed.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let r = alloc_one(heap, sizes[i], opts.prefault);
                let stop = r.is_err();
                if tx.send((i, r)).is_err() || stop {
                    break;
                }
            });
        }
        drop(tx);
        fill_from(file, engine, n, reads, &rx, progress)
    })
}

/// Runs `reads` (ordered by buffer) through `engine` as the `n` buffers
/// they go into arrive on `rx` (from allocator threads that end by
/// dropping their senders), so allocation overlaps the I/O.
/// `stats.elapsed` and `stats.buffer_size` are left for the caller.
pub(crate) fn fill_from(
    file: &IoFile,
    engine: &dyn Engine,
    n: usize,
    reads: &[Planned],
    rx: &mpsc::Receiver<Allocated>,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(Vec<Buffer>, LoadStats)> {
    let total: u64 = reads.iter().map(|r| r.len as u64).sum();
    let mut arrived: Vec<Option<Buffer>> = vec![None; n];
    let mut alloc_time = Duration::ZERO;
    let mut waited = Duration::ZERO;
    let mut next_read = 0;
    let mut next = |wait: bool| -> Result<Pull> {
        let Some(r) = reads.get(next_read) else {
            return Ok(Pull::End);
        };
        while arrived.get(r.buf).is_some_and(Option::is_none) {
            if wait {
                let t = Instant::now();
                let got = rx.recv().ok();
                waited += t.elapsed();
                let got =
                    got.ok_or_else(|| Error::Loader("allocator thread stopped early".into()))?;
                take(&mut arrived, &mut alloc_time, got)?;
            } else {
                match rx.try_recv() {
                    Ok(g) => take(&mut arrived, &mut alloc_time, g)?,
                    Err(mpsc::TryRecvError::Empty) => return Ok(Pull::Later),
                    Err(mpsc::TryRecvError::Disconnected) => {
                        return Err(Error::Loader("allocator thread stopped early".into()))
                    }
                }
            }
        }
        let buf = arrived
            .get(r.buf)
            .and_then(Option::clone)
            .ok_or_else(|| Error::Loader(format!("read planned into buffer {} of {n}", r.buf)))?;
        next_read += 1;
        Ok(Pull::Req(ReadReq {
            buf,
            buf_off: r.buf_off,
            file_off: r.file_off,
            len: r.len,
        }))
    };
    let mut bytes = 0;
    let mut filled = 0;
    let mut done = |_i: usize, t: Transfer| {
        bytes += t.bytes;
        filled += 1;
        progress(&Progress {
            bytes,
            total,
            buffers: filled,
            buffers_total: reads.len(),
            shard: 0,
            shards: 1,
            shard_bytes: bytes,
            shard_total: total,
        });
    };
    let t = Instant::now();
    let tr = engine.read_batch(file, &mut next, &mut done)?;
    let read_time = t.elapsed().saturating_sub(waited);
    // Buffers no read went into (none today) still arrive.
    while arrived.iter().any(Option::is_none) {
        let got = rx
            .recv()
            .map_err(|_| Error::Loader("a buffer was never allocated".into()))?;
        take(&mut arrived, &mut alloc_time, got)?;
    }
    let buffers = arrived
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::Loader("a buffer was never allocated".into()))?;
    Ok((
        buffers,
        LoadStats {
            bytes: tr.bytes,
            buffers: n,
            buffer_size: 0,
            alloc_time,
            read_time,
            elapsed: Duration::ZERO,
            method: engine.method(),
            fallbacks: u64::from(tr.fallbacks),
            from_cache: tr.cached,
            probe: engine.probe(),
            mapped: 0,
            populate: None,
        },
    ))
}

/// Files an allocated buffer (or its allocation error) under its index.
fn take(
    arrived: &mut [Option<Buffer>],
    alloc_time: &mut Duration,
    (i, r): (usize, Result<(Buffer, Duration)>),
) -> Result<()> {
    let (buf, t_alloc) = r?;
    *alloc_time += t_alloc;
    if let Some(slot) = arrived.get_mut(i) {
        *slot = Some(buf);
    }
    Ok(())
}
