//! Transfer engines: move a file range into a buffer range and back.
//!
//! | method | how | page cache |
//! |---|---|---|
//! | `buffered` | `pread`/`pwrite` | fills it |
//! | `direct` | `O_DIRECT` `pread`/`pwrite` straight into the buffer's mapping; unaligned heads and tails staged through an aligned buffer | bypassed |
//! | `sendfile` | file → memfd: `sendfile(2)` into the memfd; other buffers: `splice(2)` into a pipe, `read(2)` out of it. buffer → file: `vmsplice(2)` into a pipe, `splice(2)` to the file | fills it |
//! | `uring` | io_uring `READ_FIXED`/`WRITE_FIXED` on `O_DIRECT`, the buffer registered as a fixed buffer, many requests in flight | bypassed |
//! | `bounce` | io_uring `READ_FIXED` on `O_DIRECT` into a registered memfd bounce buffer, then a copy into the buffer | bypassed |
//! | `auto` | runs already in the page cache ([`cache_runs`]) copied out of it on a thread of its own; the cold runs at the same time through `uring` or `direct`, whichever the first requests measure faster ([`AutoEngine`]); `direct` when io_uring does not work here. For a buffer whose mapping refuses direct I/O (a dma-heap's): `bounce` or `buffered`, whichever measures faster | left as it was (cold runs bypass it), or fills it |
//!
//! Every direct engine falls back to buffered I/O for a request when the file
//! system refuses `O_DIRECT` (`EINVAL`) or when the buffer's mapping cannot
//! take direct I/O ([`Buffer::takes_direct_io`]: a dma-buf's own mapping,
//! which the kernel fails with `EFAULT`), and counts it in
//! [`Transfer::fallbacks`].

mod auto;
mod bounce;
mod buffered;
mod cached;
mod direct;
mod probe;
mod residency;
mod sendfile;
mod shared;
mod uring;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

pub use auto::AutoEngine;
pub use bounce::BounceEngine;
pub use buffered::BufferedEngine;
pub use direct::DirectEngine;
pub use probe::{Probe, DIRECT_MARGIN, PROBE_BYTES, PROBE_SLICES};
pub use residency::{cache_runs, CacheLookup, CacheRun, CACHE_GRAIN};
pub use sendfile::SendfileEngine;
pub use shared::SharedChoice;
pub use uring::UringEngine;

use crate::file::IoFile;
use crate::range::BufRange;
use crate::{Buffer, Error, Result};

/// A transfer method, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// The fastest that works here (see [`new_engine`]).
    Auto,
    /// `pread`/`pwrite` through the page cache.
    Buffered,
    /// `O_DIRECT` `pread`/`pwrite`.
    Direct,
    /// `sendfile`/`splice`.
    Sendfile,
    /// io_uring with fixed buffers on `O_DIRECT`.
    Uring,
    /// Direct I/O into a memfd bounce buffer, then a copy.
    Bounce,
}

impl Method {
    /// Every method, `auto` first.
    pub const ALL: [Method; 6] = [
        Method::Auto,
        Method::Buffered,
        Method::Direct,
        Method::Sendfile,
        Method::Uring,
        Method::Bounce,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Method::Auto => "auto",
            Method::Buffered => "buffered",
            Method::Direct => "direct",
            Method::Sendfile => "sendfile",
            Method::Uring => "uring",
            Method::Bounce => "bounce",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Method {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Method::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| Error::UnknownMethod(s.to_string()))
    }
}

/// What one transfer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfer {
    /// Bytes moved.
    pub bytes: u64,
    /// Requests that fell back to buffered I/O because the file system
    /// refused direct I/O.
    pub fallbacks: u32,
    /// Of `bytes`, those copied from the page cache because they were there
    /// already (`auto`'s cache-aware reads); buffered reads of other
    /// engines do not count them.
    pub cached: u64,
}

impl Transfer {
    /// `bytes` moved the way the engine moves them.
    pub(crate) fn moved(bytes: u64) -> Self {
        Transfer {
            bytes,
            ..Transfer::default()
        }
    }

    /// `bytes` moved by one buffered request in place of a direct one.
    pub(crate) fn fell_back(bytes: u64) -> Self {
        Transfer {
            bytes,
            fallbacks: 1,
            cached: 0,
        }
    }
}

impl std::ops::AddAssign for Transfer {
    fn add_assign(&mut self, o: Transfer) {
        self.bytes += o.bytes;
        self.fallbacks += o.fallbacks;
        self.cached += o.cached;
    }
}

/// Tunables for [`new_engine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// io_uring: requests in flight.
    pub queue_depth: u32,
    /// io_uring: bytes per request (a multiple of 4096).
    pub chunk: usize,
}

impl Default for EngineOptions {
    /// 16 requests of 4 MiB in flight. 4 MiB is the largest request many
    /// block devices take whole (`max_sectors_kb` is 4096 for virtio-blk
    /// and typical NVMe), so each request is one device command; 1 MiB
    /// requests were 5-15% slower cold on this VM's virtio-blk disk
    /// (`examples/engines.rs`).
    fn default() -> Self {
        EngineOptions {
            queue_depth: 16,
            chunk: 4 << 20,
        }
    }
}

impl EngineOptions {
    /// Checks the tunables: a queue depth of 1 to 4096, a request size that
    /// is a non-zero multiple of 4096 up to 1 GiB.
    ///
    /// # Errors
    /// [`Error::BadQueueDepth`], [`Error::BadChunk`].
    pub fn check(&self) -> Result<()> {
        if self.queue_depth == 0 || self.queue_depth > 4096 {
            return Err(Error::BadQueueDepth {
                depth: self.queue_depth,
            });
        }
        if self.chunk == 0 || self.chunk % 4096 != 0 || self.chunk > (1 << 30) {
            return Err(Error::BadChunk { chunk: self.chunk });
        }
        Ok(())
    }
}

/// One read of a batch ([`Engine::read_batch`]): `len` bytes of the file at
/// `file_off` into `buf` at `buf_off`.
#[derive(Debug, Clone)]
pub struct ReadReq {
    /// Destination buffer (kept alive by the engine until the read is done).
    pub buf: Buffer,
    /// Offset in the buffer.
    pub buf_off: usize,
    /// Offset in the file.
    pub file_off: u64,
    /// Bytes to read.
    pub len: usize,
}

/// What a batch's request source answers ([`NextReq`]).
#[derive(Debug)]
pub enum Pull {
    /// The next request.
    Req(ReadReq),
    /// None ready yet (only when asked not to wait).
    Later,
    /// No more requests.
    End,
}

/// Where [`Engine::read_batch`] gets its next request. The argument says
/// whether it may block (e.g. until the next buffer is allocated); when it
/// is `false` the source answers [`Pull::Later`] instead of blocking, so an
/// engine with requests queued can keep the device busy meanwhile.
pub type NextReq<'a> = dyn FnMut(bool) -> Result<Pull> + 'a;

/// Told when request `i` (in the order `next` produced them) is complete.
pub type ReqDone<'a> = dyn FnMut(usize, Transfer) + 'a;

/// Moves bytes between a file range and a buffer range.
///
/// Object safe: the method is chosen at run time ([`new_engine`]). Engines
/// are `Sync`; the io_uring engine serialises callers on its ring.
pub trait Engine: Send + Sync + fmt::Debug {
    /// The method that really moves the bytes (`auto` reports what it chose).
    fn method(&self) -> Method;

    /// What `auto` measured on the last batch to choose its engine; `None`
    /// for the other methods.
    fn probe(&self) -> Option<Probe> {
        None
    }

    /// Copies `len` bytes of `file` at `file_off` into `buf` at `buf_off`:
    /// checks the request ([`CheckedRead`]), then moves it the engine's way
    /// ([`Engine::read_checked`]).
    ///
    /// # Errors
    /// [`Error::Busy`] while `buf` is mapped for a device;
    /// [`Error::OutOfRange`] if the range is not inside `buf`;
    /// [`Error::ShortFile`] if the file ends before `file_off + len`;
    /// [`Error::FileIo`] when the kernel fails a read.
    fn read(
        &self,
        file: &IoFile,
        file_off: u64,
        buf: &Buffer,
        buf_off: usize,
        len: usize,
    ) -> Result<Transfer> {
        self.read_checked(CheckedRead::new(file, file_off, buf, buf_off, len)?)
    }

    /// Moves a read that [`Engine::read`] has checked: what each engine
    /// does its own way.
    ///
    /// # Errors
    /// [`Error::ShortFile`] if the file shrank meanwhile;
    /// [`Error::FileIo`] when the kernel fails a read.
    fn read_checked(&self, req: CheckedRead<'_>) -> Result<Transfer>;

    /// Runs a stream of reads, possibly overlapping them (io_uring keeps the
    /// next buffer's requests in flight while the last ones complete). The
    /// default runs them one after the other with [`Engine::read`].
    ///
    /// # Errors
    /// The first error of any request (as [`Engine::read`]) or of `next`;
    /// requests already in flight are completed first.
    fn read_batch(
        &self,
        file: &IoFile,
        next: &mut NextReq<'_>,
        done: &mut ReqDone<'_>,
    ) -> Result<Transfer> {
        one_by_one(next, done, |r| {
            self.read(file, r.file_off, &r.buf, r.buf_off, r.len)
        })
    }

    /// Copies `len` bytes of `buf` at `buf_off` into `file` at `file_off`,
    /// growing the file if needed (`file` must be opened with
    /// [`IoFile::open_rw`]): takes the range, then moves it the engine's way
    /// ([`Engine::write_range`]).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if the range is not inside `buf`;
    /// [`Error::FileIo`] when the kernel fails a write;
    /// [`Error::Unsupported`] when the method cannot write from this buffer.
    fn write(
        &self,
        buf: &Buffer,
        buf_off: usize,
        len: usize,
        file: &IoFile,
        file_off: u64,
    ) -> Result<Transfer> {
        self.write_range(buf.range(buf_off, len)?, file, file_off)
    }

    /// Copies all of `src` into `file` at `file_off`, growing the file if
    /// needed: what each engine does its own way.
    ///
    /// # Errors
    /// [`Error::FileIo`] when the kernel fails a write;
    /// [`Error::Unsupported`] when the method cannot write from this buffer.
    fn write_range(&self, src: BufRange<'_>, file: &IoFile, file_off: u64) -> Result<Transfer>;
}

/// A read [`Engine::read`] has checked: its destination lies inside its
/// buffer, the buffer is not mapped for a device, and the file holds the
/// bytes. Only this crate makes one, so [`Engine::read_checked`] is never
/// reached past the checks.
#[derive(Debug, Clone, Copy)]
pub struct CheckedRead<'a> {
    file: &'a IoFile,
    file_off: u64,
    mem: BufRange<'a>,
}

impl<'a> CheckedRead<'a> {
    /// Checks a read of `len` bytes of `file` at `file_off` into `buf` at
    /// `buf_off`.
    ///
    /// # Errors
    /// As [`Engine::read`]'s checks: [`Error::Busy`],
    /// [`Error::OutOfRange`], [`Error::ShortFile`].
    fn new(
        file: &'a IoFile,
        file_off: u64,
        buf: &'a Buffer,
        buf_off: usize,
        len: usize,
    ) -> Result<Self> {
        let mem = check_read(file, file_off, buf, buf_off, len)?;
        Ok(CheckedRead {
            file,
            file_off,
            mem,
        })
    }

    /// The file read from.
    pub fn file(&self) -> &'a IoFile {
        self.file
    }

    /// Offset in the file.
    pub fn file_off(&self) -> u64 {
        self.file_off
    }

    /// The destination: a range of the buffer.
    pub fn mem(&self) -> BufRange<'a> {
        self.mem
    }
}

/// Makes the engine for `method`. `auto` is an [`AutoEngine`] (io_uring or
/// direct, chosen by measuring both on the first requests of each batch)
/// when a ring can be set up here, else direct.
///
/// # Errors
/// [`Error::Sys`] when `uring` or `bounce` is asked for and io_uring cannot be
/// set up (disabled by `kernel.io_uring_disabled`, seccomp, old kernel);
/// for `uring` and `auto`, [`EngineOptions::check`]'s errors.
pub fn new_engine(method: Method, opts: EngineOptions) -> Result<Box<dyn Engine>> {
    new_engine_sharing(method, opts, None)
}

/// As [`new_engine`]; an `auto` engine measures once with the other
/// engines given the same `choice` ([`SharedChoice`]: one probe for the
/// files of one load).
///
/// # Errors
/// As [`new_engine`].
pub fn new_engine_sharing(
    method: Method,
    opts: EngineOptions,
    choice: Option<Arc<SharedChoice>>,
) -> Result<Box<dyn Engine>> {
    if matches!(method, Method::Uring | Method::Auto | Method::Bounce) {
        opts.check()?;
    }
    Ok(match method {
        Method::Buffered => Box::new(BufferedEngine),
        Method::Direct => Box::new(DirectEngine),
        Method::Sendfile => Box::new(SendfileEngine),
        Method::Uring => Box::new(UringEngine::new(opts)?),
        Method::Bounce => Box::new(BounceEngine::new(opts)?),
        Method::Auto => {
            match choice.map_or_else(|| AutoEngine::new(opts), |c| AutoEngine::sharing(opts, c)) {
                Ok(u) => Box::new(u),
                Err(e) => {
                    tracing::info!("io_uring unavailable ({e}); auto uses direct");
                    Box::new(DirectEngine)
                }
            }
        }
    })
}

/// The checks of every read ([`CheckedRead`]); returns the destination range.
fn check_read<'b>(
    file: &IoFile,
    file_off: u64,
    buf: &'b Buffer,
    buf_off: usize,
    len: usize,
) -> Result<BufRange<'b>> {
    buf.check_not_busy()?;
    let mem = buf.range(buf_off, len)?;
    file.check_range(file_off, len)?;
    Ok(mem)
}

/// The next request of a batch, waiting for it; `None` at the end.
fn pull(next: &mut NextReq<'_>) -> Result<Option<ReadReq>> {
    loop {
        match next(true)? {
            Pull::Req(r) => return Ok(Some(r)),
            Pull::Later => {}
            Pull::End => return Ok(None),
        }
    }
}

/// Runs a batch one request after the other through `read`: the loop of
/// every engine (or case) that keeps nothing in flight.
fn one_by_one(
    next: &mut NextReq<'_>,
    done: &mut ReqDone<'_>,
    mut read: impl FnMut(&ReadReq) -> Result<Transfer>,
) -> Result<Transfer> {
    let mut total = Transfer::default();
    let mut i = 0;
    while let Some(r) = pull(next)? {
        let t = read(&r)?;
        total += t;
        done(i, t);
        i += 1;
    }
    Ok(total)
}

/// One checked read as a batch of one, for engines whose `read` is their
/// `read_batch`.
fn read_as_batch(engine: &dyn Engine, r: CheckedRead<'_>) -> Result<Transfer> {
    let mut req = Some(ReadReq {
        buf: r.mem.buffer().clone(),
        buf_off: r.mem.offset(),
        file_off: r.file_off,
        len: r.mem.len(),
    });
    let mut next = |_wait: bool| Ok(req.take().map_or(Pull::End, Pull::Req));
    engine.read_batch(r.file, &mut next, &mut |_, _| {})
}

/// Direction of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// File to buffer.
    Read,
    /// Buffer to file.
    Write,
}

/// Moves `mem` buffered in place of a direct transfer that was refused (by
/// the file system, or by a buffer mapping that cannot take direct I/O),
/// counted as one fallback: the one fallback path of every direct engine.
fn fall_back(file: &IoFile, dir: Dir, file_off: u64, mem: BufRange<'_>) -> Result<Transfer> {
    match dir {
        Dir::Read => buffered::read_into(file, file_off, mem)?,
        Dir::Write => buffered::write_from(file, file_off, mem)?,
    }
    Ok(Transfer::fell_back(mem.len() as u64))
}
