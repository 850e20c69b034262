//! Which ranges of a file are in the page cache.
//!
//! `cachestat(2)` (Linux 6.5 and later) counts the cached pages of a file
//! range without mapping it; a range that is partly cached is halved, and
//! the halves asked again, down to [`CACHE_GRAIN`] bytes. On older kernels (the
//! call fails with `ENOSYS`, remembered for the process), `mincore(2)` over
//! a read-only shared mapping of the range answers page by page (mapping
//! a file faults nothing in).
//!
//! A grain counts as cached only when every page of it is: a buffered read
//! of a cached run must never bring a cold page into the cache.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::file::IoFile;
use crate::{Error, Result};

/// The smallest run told apart: 64 KiB. A grain with any page missing
/// counts as cold.
pub const CACHE_GRAIN: u64 = 64 << 10;

/// A run of a file range that is all cached or all cold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheRun {
    /// Offset in the file.
    pub off: u64,
    /// Bytes.
    pub len: u64,
    /// Whether every page of the run is in the page cache.
    pub cached: bool,
}

/// How residency is learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheLookup {
    /// `cachestat(2)` where the kernel has it, else `mincore(2)`.
    Auto,
    /// `cachestat(2)` (fails with [`Error::Sys`] on a kernel before 6.5).
    Cachestat,
    /// `mincore(2)` over a temporary read-only mapping.
    Mincore,
}

/// Set once `cachestat(2)` failed with `ENOSYS` (or `EPERM` from a seccomp
/// filter): every later lookup goes to `mincore`.
static NO_CACHESTAT: AtomicBool = AtomicBool::new(false);

/// The runs of `file[off..off + len]` (cut at the file's end), cached or
/// cold, in file order, neighbours of the same kind merged.
///
/// # Errors
/// [`Error::Sys`] when the lookup fails (`mmap` or `mincore` for
/// [`CacheLookup::Mincore`] and the fall-back of [`CacheLookup::Auto`]; `cachestat`
/// for [`CacheLookup::Cachestat`]); [`Error::Open`] if `fstat` fails.
pub fn cache_runs(file: &IoFile, off: u64, len: u64, how: CacheLookup) -> Result<Vec<CacheRun>> {
    let end = off.saturating_add(len).min(file.size()?);
    let mut runs = Runs(Vec::new());
    if end <= off {
        return Ok(runs.0);
    }
    let fd = file.fd();
    let use_cachestat = match how {
        CacheLookup::Cachestat => true,
        CacheLookup::Mincore => false,
        CacheLookup::Auto => !NO_CACHESTAT.load(Ordering::Relaxed),
    };
    if use_cachestat {
        match bisect(fd, off, end, &mut runs) {
            Ok(()) => return Ok(runs.0),
            Err(e) if how == CacheLookup::Auto && unsupported(&e) => {
                tracing::debug!("cachestat: {e}; page-cache residency by mincore from now on");
                NO_CACHESTAT.store(true, Ordering::Relaxed);
                runs.0.clear();
            }
            Err(e) => return Err(Error::sys("cachestat", e)),
        }
    }
    by_mincore(fd, off, end, &mut runs)?;
    Ok(runs.0)
}

/// Whether a `cachestat` error means the kernel (or a filter) lacks it.
fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM))
}

/// Runs being built: a new run merges into the last when of the same kind.
struct Runs(Vec<CacheRun>);

impl Runs {
    fn push(&mut self, off: u64, end: u64, cached: bool) {
        if end <= off {
            return;
        }
        if let Some(last) = self.0.last_mut() {
            if last.cached == cached && last.off + last.len == off {
                last.len = end - last.off;
                return;
            }
        }
        self.0.push(CacheRun {
            off,
            len: end - off,
            cached,
        });
    }
}

/// Pages that `off..end` touches.
fn pages(off: u64, end: u64) -> u64 {
    let page = crate::page_size() as u64;
    (end - 1) / page - off / page + 1
}

/// `cachestat(2)` on `off..end`, halving partly cached ranges down to
/// [`CACHE_GRAIN`].
fn bisect(fd: BorrowedFd<'_>, off: u64, end: u64, runs: &mut Runs) -> io::Result<()> {
    let cached = cachestat(fd, off, end - off)?;
    if cached == 0 {
        runs.push(off, end, false);
    } else if cached >= pages(off, end) {
        runs.push(off, end, true);
    } else if end - off <= CACHE_GRAIN {
        runs.push(off, end, false);
    } else {
        // Cut on a grain boundary, so runs start and end on grains.
        let mid = ((off + (end - off) / 2) / CACHE_GRAIN * CACHE_GRAIN)
            .max(off / CACHE_GRAIN * CACHE_GRAIN + CACHE_GRAIN);
        let mid = mid.min(end);
        bisect(fd, off, mid, runs)?;
        bisect(fd, mid, end, runs)?;
    }
    Ok(())
}

/// `struct cachestat_range` of include/uapi/linux/mman.h.
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

/// `struct cachestat` of include/uapi/linux/mman.h.
#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// `__NR_cachestat`: 451 on every architecture that uses the common system
/// call table (include/uapi/asm-generic/unistd.h, and x86's tables); the
/// `libc` crate names it only for some targets.
const SYS_CACHESTAT: libc::c_long = 451;

/// [`cachestat(2)`](https://man7.org/linux/man-pages/man2/cachestat.2.html):
/// pages of `fd[off..off + len]` in the page cache (dirty and under
/// writeback included).
fn cachestat(fd: BorrowedFd<'_>, off: u64, len: u64) -> io::Result<u64> {
    let range = CachestatRange { off, len };
    let mut st = Cachestat::default();
    // SAFETY: cachestat reads one `struct cachestat_range` and writes one
    // `struct cachestat`, which `range` and `st` are (repr(C), the uapi
    // layout), both alive for the call; flags must be 0.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd.as_raw_fd() as libc::c_uint,
            &range as *const CachestatRange,
            &mut st as *mut Cachestat,
            0 as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.nr_cache)
}

/// `mincore(2)` over `off..end`, a grain at a time.
fn by_mincore(fd: BorrowedFd<'_>, off: u64, end: u64, runs: &mut Runs) -> Result<()> {
    let page = crate::page_size() as u64;
    let base = off / page * page;
    let len = usize::try_from(end - base).map_err(|_| Error::BadSize {
        size: usize::MAX,
        page: page as usize,
    })?;
    let resident = crate::mmap::resident_map(fd, base, len)?;
    let mut at = off;
    while at < end {
        let stop = ((at / CACHE_GRAIN + 1) * CACHE_GRAIN).min(end);
        let first = ((at - base) / page) as usize;
        let last = ((stop - 1 - base) / page) as usize;
        let cached = resident[first..=last].iter().all(|&r| r);
        runs.push(at, stop, cached);
        at = stop;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_neighbours_of_a_kind() {
        let mut r = Runs(Vec::new());
        r.push(0, 10, true);
        r.push(10, 20, true);
        r.push(20, 20, false);
        r.push(20, 30, false);
        r.push(30, 40, true);
        assert_eq!(
            r.0,
            [
                CacheRun {
                    off: 0,
                    len: 20,
                    cached: true
                },
                CacheRun {
                    off: 20,
                    len: 10,
                    cached: false
                },
                CacheRun {
                    off: 30,
                    len: 10,
                    cached: true
                },
            ]
        );
    }

    #[test]
    fn pages_count_partial_ends() {
        let p = crate::page_size() as u64;
        assert_eq!(pages(0, 1), 1);
        assert_eq!(pages(0, p), 1);
        assert_eq!(pages(p - 1, p + 1), 2);
        assert_eq!(pages(3, 3 * p), 3);
    }

    #[test]
    fn the_uapi_layouts() {
        assert_eq!(std::mem::size_of::<CachestatRange>(), 16);
        assert_eq!(std::mem::size_of::<Cachestat>(), 40);
    }
}
