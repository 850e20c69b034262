//! [`Mmap`]: the one owning type around a mapping of a file descriptor,
//! with the populate and advice calls the buffers make on it.

use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

use rustix::mm::{mmap, munmap, Advice, MapFlags, ProtFlags};

use super::guard::{self, SigbusGuard};
use crate::{Error, Result};

/// Bytes [`Mmap::populate_write`] populates per `madvise` call. The kernel
/// holds the process's `mmap_lock` (for reading) across one call, and an
/// `mmap`/`munmap` of another thread (an io_uring ring set up for the next
/// shard, a thread's stack) waits for it, and every later reader of the
/// lock (an io_uring buffer registration) waits behind that: a 32 MiB
/// buffer populated in one call stalled them for its whole duration (a
/// sharded load's context switches were half `mmap`/`munmap` waiting on
/// the lock). 2 MiB per call keeps each hold to a millisecond or two.
const POPULATE_STEP: usize = 2 << 20;

/// `off..off + len` rounded out to whole pages: `(first byte, end)`.
pub(super) fn page_bounds(off: usize, len: usize) -> (usize, usize) {
    let page = crate::page_size();
    (off / page * page, (off + len).div_ceil(page) * page)
}

/// A `MAP_SHARED` read/write mapping of a file descriptor, unmapped on drop;
/// optionally guarded against SIGBUS ([`SigbusGuard`]).
#[derive(Debug)]
pub(crate) struct Mmap {
    // Declared first: the guard stops watching before the mapping goes.
    guard: Option<SigbusGuard>,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory with no thread affinity; all
// access goes through raw pointers with volatile or copy semantics.
unsafe impl Send for Mmap {}
// SAFETY: as above; `Mmap` hands out no references, only raw pointers.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// Maps `len` bytes of `fd` from `offset` (a page multiple), shared and
    /// read/write; with `guarded`, a SIGBUS in it (the file shrunk under
    /// the mapping) is caught (see [`SigbusGuard`]), and the mapping is
    /// refused ([`Error::Unguarded`]) if it cannot be.
    pub(crate) fn map(fd: BorrowedFd<'_>, offset: u64, len: usize, guarded: bool) -> Result<Self> {
        Self::map_prot(
            fd,
            offset,
            len,
            guarded,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
        )
    }

    /// Maps the first `len` bytes of `fd` private (copy-on-write: writes
    /// make private copies of the pages and never reach the file) and
    /// read/write; with `guarded` as [`Mmap::map`]. `fd` may be opened
    /// read-only.
    pub(crate) fn map_private(fd: BorrowedFd<'_>, len: usize, guarded: bool) -> Result<Self> {
        Self::map_prot(
            fd,
            0,
            len,
            guarded,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE,
        )
    }

    pub(super) fn map_prot(
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        guarded: bool,
        prot: ProtFlags,
        flags: MapFlags,
    ) -> Result<Self> {
        if len == 0 {
            return Err(Error::BadSize {
                size: 0,
                page: crate::page_size(),
            });
        }
        // SAFETY: a fresh mapping at an address the kernel picks cannot alias
        // any Rust object; we own it until `munmap` in `drop`.
        let ptr = unsafe { mmap(std::ptr::null_mut(), len, prot, flags, fd, offset) }
            .map_err(|e| Error::sys("mmap", e))?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(Error::BadMessage("mmap returned null"))?;
        let guard = if guarded {
            let g = guard::watch(ptr.as_ptr() as usize, len);
            if g.is_none() {
                // A mapping that a shrinking file could kill the process
                // through is not handed out.
                // SAFETY: the mapping was made just above and nothing
                // points into it yet.
                let _ = unsafe { munmap(ptr.as_ptr().cast(), len) };
                return Err(Error::Unguarded { len });
            }
            g
        } else {
            None
        };
        Ok(Mmap { guard, ptr, len })
    }

    /// Whether a SIGBUS in the mapping is caught.
    pub(crate) fn is_guarded(&self) -> bool {
        self.guard.is_some()
    }

    /// Whether the guard caught a SIGBUS in the mapping: the file was
    /// shrunk under it, and the pages past its end now read as zeros.
    pub(crate) fn faulted(&self) -> bool {
        self.guard.as_ref().is_some_and(SigbusGuard::faulted)
    }

    /// Whether the guard caught a SIGBUS in a page below offset `end`:
    /// the file lost a page there (or could not read it in).
    fn faulted_below(&self, end: usize) -> bool {
        let first = self.guard.as_ref().and_then(SigbusGuard::first_fault);
        first.is_some_and(|at| at < self.ptr.as_ptr() as usize + end)
    }

    /// On a caught SIGBUS, also `shutdown(2)` the socket `sock` (a duplicate
    /// of it is kept, so the number cannot be reused meanwhile).
    pub(crate) fn shutdown_on_fault(&self, sock: BorrowedFd<'_>) -> Result<()> {
        match &self.guard {
            Some(g) => g.shutdown_on_fault(sock),
            None => Ok(()),
        }
    }

    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// `madvise(MADV_POPULATE_WRITE)`: faults every page of the mapping in
    /// now (Linux 5.14+), [`POPULATE_STEP`] bytes per call.
    pub(crate) fn populate_write(&self) -> Result<()> {
        let mut off = 0;
        while off < self.len {
            let len = POPULATE_STEP.min(self.len - off);
            self.populate(off, len, Advice::LinuxPopulateWrite)
                .map_err(|e| Error::sys("madvise(MADV_POPULATE_WRITE)", e))?;
            off += len;
        }
        Ok(())
    }

    /// Maps the pages holding `off..off + len` now, readable, without
    /// writing them (a private file mapping's pages stay the page cache's,
    /// not copied). A page not in the page cache is read into it. On a
    /// guarded mapping this reads one byte of every page
    /// ([`Mmap::touch_pages`]); else `madvise(MADV_POPULATE_READ)` (Linux
    /// 5.14+), which cannot raise SIGBUS. A page past the file's end (or
    /// one that cannot be read in) fails the call either way; on a guarded
    /// mapping it reads as zeros from then on.
    pub(crate) fn populate_read(&self, off: usize, len: usize) -> Result<()> {
        if off.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error::OutOfRange {
                offset: off,
                len,
                buf_len: self.len,
            });
        }
        if len == 0 {
            return Ok(());
        }
        let (lo, hi) = page_bounds(off, len);
        if self.guard.is_some() {
            self.touch_pages(lo, hi);
            // A page of the range the file lost faulted just now (or did
            // before, and reads the guard's zeros since), so the lowest
            // fault is below the range's end: fail, as MADV_POPULATE_READ
            // would have.
            if self.faulted_below(hi) {
                return Err(Error::sys(
                    "reading a mapped file's pages",
                    rustix::io::Errno::FAULT,
                ));
            }
            return Ok(());
        }
        self.populate(lo, hi - lo, Advice::LinuxPopulateRead)
            .map_err(|e| Error::sys("madvise(MADV_POPULATE_READ)", e))
    }

    /// Reads one byte of every page of `lo..hi` (page-aligned, inside this
    /// guarded mapping). Each read fault maps the page-cache pages around
    /// it (the kernel's fault-around, 64 KiB by default) and leaves them
    /// as they are on the LRU. `MADV_POPULATE_READ` marks every page
    /// accessed, which moves a page read once before (a file warmed by
    /// `read`) to the active list under the LRU lock, one page at a time:
    /// `method="map"` of a 1 GiB file warmed by `pread` took a median of
    /// 68 ms that way against 30 ms with these reads (6 fresh processes
    /// each, alternating, two threads).
    fn touch_pages(&self, lo: usize, hi: usize) {
        let page = crate::page_size();
        debug_assert!(self.guard.is_some() && hi <= self.len.div_ceil(page) * page);
        for at in (lo..hi).step_by(page) {
            // SAFETY: `at` is inside this live mapping (the caller's
            // bounds), which is readable; it is guarded, so a page the
            // file lost reads as zeros instead of raising SIGBUS (unless
            // the handler cannot map its zero page, as for any access to
            // a guarded mapping).
            unsafe { std::ptr::read_volatile(self.ptr.as_ptr().wrapping_add(at)) };
        }
    }

    /// `madvise(advice)`, one of the populate advices, over
    /// `off..off + len`: page-aligned and inside the mapping (a mapping
    /// covers whole pages), as both callers make it.
    fn populate(&self, off: usize, len: usize, advice: Advice) -> rustix::io::Result<()> {
        debug_assert!(off + len <= self.len.div_ceil(crate::page_size()) * crate::page_size());
        // SAFETY: `off..off + len` is inside this live mapping (the
        // callers' bounds); populating maps or allocates its pages, it
        // does not change their contents.
        unsafe { rustix::mm::madvise(self.ptr.as_ptr().wrapping_add(off).cast(), len, advice) }
    }

    /// `madvise(MADV_HUGEPAGE)` over the whole mapping.
    pub(crate) fn advise_hugepage(&self) -> Result<()> {
        // SAFETY: the range is exactly this live mapping; advice does not
        // change its contents.
        unsafe { rustix::mm::madvise(self.ptr.as_ptr().cast(), self.len, Advice::LinuxHugepage) }
            .map_err(|e| Error::sys("madvise(MADV_HUGEPAGE)", e))
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // Stop watching before the address range can be reused.
        drop(self.guard.take());
        // SAFETY: `ptr`/`len` describe exactly the mapping made in `map`,
        // and no pointer into it outlives `self` (borrowers hold the
        // `Buffer` or `SharedMapping`).
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;
    use crate::heap::{Heap, HugePages, MemfdHeap};
    use crate::mmap::mincore::resident_pages;

    /// A file of `pages` pages of `byte`, opened read-only.
    fn pages_file(
        pages: usize,
        byte: u8,
    ) -> (tempfile::TempDir, std::path::PathBuf, std::fs::File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![byte; pages * crate::page_size()]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        (dir, path, file)
    }

    /// Whether the page at `addr` is mapped in this process (bit 63 of its
    /// `/proc/self/pagemap` entry).
    fn present(addr: usize) -> bool {
        use std::os::unix::fs::FileExt;
        let page = crate::page_size();
        let map = std::fs::File::open("/proc/self/pagemap").unwrap();
        let mut e = [0u8; 8];
        map.read_exact_at(&mut e, (addr / page * 8) as u64).unwrap();
        u64::from_le_bytes(e) >> 63 == 1
    }

    #[test]
    fn populate_read_maps_every_page_of_the_range() {
        let page = crate::page_size();
        // Four times the kernel's default fault-around window (64 KiB), so
        // a populate that faulted only the first page of each window, or
        // of the range, leaves pages unmapped.
        let (_dir, _path, file) = pages_file(64, 3);
        for guarded in [true, false] {
            let map = Mmap::map_private(file.as_fd(), 64 * page, guarded).unwrap();
            assert_eq!(map.is_guarded(), guarded);
            let at = |i: usize| map.as_ptr() as usize + i * page;
            assert!((0..64).all(|i| !present(at(i))), "guarded {guarded}");
            map.populate_read(20 * page + 1, 30 * page).unwrap();
            assert!((20..51).all(|i| present(at(i))), "guarded {guarded}");
            map.populate_read(0, 64 * page).unwrap();
            assert!((0..64).all(|i| present(at(i))), "guarded {guarded}");
        }
    }

    #[test]
    fn populate_read_fails_only_for_pages_a_shrunk_file_lost() {
        let page = crate::page_size();
        for guarded in [true, false] {
            let (_dir, path, file) = pages_file(8, 9);
            let map = Mmap::map_private(file.as_fd(), 8 * page, guarded).unwrap();
            let shrink = std::fs::OpenOptions::new().write(true).open(&path);
            shrink.and_then(|f| f.set_len(2 * page as u64)).unwrap();
            map.populate_read(0, 2 * page).unwrap();
            let lost = map.populate_read(page, 2 * page);
            assert!(
                matches!(&lost, Err(Error::Sys { source, .. }) if source.raw_os_error() == Some(libc::EFAULT)),
                "guarded {guarded}: {lost:?}"
            );
            // The pages the file still has populate as before, and keep
            // its bytes.
            map.populate_read(0, 2 * page).unwrap();
            map.populate_read(page, 0).unwrap();
            // SAFETY: the first two pages are inside the mapping and the
            // file; nothing writes them meanwhile.
            let kept = unsafe { std::slice::from_raw_parts(map.as_ptr(), 2 * page) };
            assert!(kept.iter().all(|&b| b == 9), "guarded {guarded}");
            assert_eq!(map.faulted(), guarded);
        }
    }

    #[test]
    fn populate_allocates_every_page_past_its_step() {
        // Two steps and a page: a loop that stopped after its first call,
        // or that missed the short last step, leaves pages out.
        let page = crate::page_size();
        let len = 2 * POPULATE_STEP + page;
        let buf = MemfdHeap::new(HugePages::None).alloc(len).unwrap();
        assert_eq!(resident_pages(buf.fd(), len).unwrap(), 0);
        buf.populate().unwrap();
        assert_eq!(resident_pages(buf.fd(), len).unwrap(), len / page);
    }
}
