//! The one owning type around a shared mapping, and the SIGBUS guard that
//! keeps a peer who truncates a shared file from killing the process.
//!
//! Raw pointers into buffer memory live here, in the borrowed range
//! ([`crate::BufRange`]) that everything else goes through, and in the
//! syscall wrappers ([`crate::sys`], [`crate::ring`]) that take a range: its
//! lifetime borrows the [`crate::Buffer`], so the mapping outlives every use
//! of the pointer, and its bounds are checked once, when it is made.
//! Engines never see a pointer.

use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

use rustix::mm::{mmap, munmap, Advice, MapFlags, ProtFlags};

use crate::{Error, Result};

/// Bytes [`Mmap::populate_write`] populates per `madvise` call. The kernel
/// holds the process's `mmap_lock` (for reading) across one call, and an
/// `mmap`/`munmap` of another thread (an io_uring ring set up for the next
/// shard, a thread's stack) waits for it, and every later reader of the
/// lock (an io_uring buffer registration) waits behind that: a 32 MiB
/// buffer populated in one call stalled them for its whole duration (a
/// sharded load's context switches were half `mmap`/`munmap` waiting on
/// the lock). 2 MiB per call keeps each hold to a millisecond or two.
pub(crate) const POPULATE_STEP: usize = 2 << 20;

/// `off..off + len` rounded out to whole pages: `(first byte, end)`.
fn page_bounds(off: usize, len: usize) -> (usize, usize) {
    let page = crate::page_size();
    (off / page * page, (off + len).div_ceil(page) * page)
}

/// A `MAP_SHARED` read/write mapping of a file descriptor, unmapped on drop;
/// optionally [guarded](guard) against SIGBUS.
#[derive(Debug)]
pub(crate) struct Mmap {
    // Declared first: the guard stops watching before the mapping goes.
    guard: Option<Guard>,
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
    /// the mapping) is caught (see [`guard`]) when a guard slot is free.
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

    fn map_prot(
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
                tracing::info!("shared mapping of {len} bytes: not guarded against SIGBUS");
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
        self.guard.as_ref().is_some_and(Guard::faulted)
    }

    /// Whether the guard caught a SIGBUS in a page below offset `end`:
    /// the file lost a page there (or could not read it in).
    fn faulted_below(&self, end: usize) -> bool {
        let first = self.guard.as_ref().and_then(Guard::first_fault);
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

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

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

/// A read-only shared mapping of a file to copy its cached pages out of:
/// readahead off (`MADV_RANDOM`, so touching a page never reads the ones
/// after it into the page cache), guarded against SIGBUS (a file shrunk
/// during the copy reads as zeros and [`FileView::truncated`] says so).
#[derive(Debug)]
pub(crate) struct FileView {
    map: Mmap,
}

impl FileView {
    /// Maps the first `len` bytes of `fd`.
    ///
    /// # Errors
    /// [`Error::BadSize`] for a zero length; [`Error::Sys`] if `mmap` or
    /// `madvise` fails, or when the mapping cannot be guarded.
    pub(crate) fn new(fd: BorrowedFd<'_>, len: usize) -> Result<Self> {
        let map = Mmap::map_prot(fd, 0, len, true, ProtFlags::READ, MapFlags::SHARED)?;
        if !map.is_guarded() {
            return Err(Error::sys(
                "SIGBUS guard of a file mapping",
                std::io::Error::from(std::io::ErrorKind::OutOfMemory),
            ));
        }
        // SAFETY: the range is exactly this live mapping; advice does not
        // change its contents.
        unsafe { rustix::mm::madvise(map.as_ptr().cast(), map.len(), Advice::Random) }
            .map_err(|e| Error::sys("madvise(MADV_RANDOM)", e))?;
        Ok(FileView { map })
    }

    /// Copies `dst.len()` bytes of the file at `off` into `dst`, the copy
    /// faulting the pages in. (Populating them first does not pay: the
    /// first copy of a 1 GiB file warmed by `pread`, 8 MiB pieces, one
    /// thread, 4 alternating runs each, took 241-272 ms this way, 232-313
    /// ms after a read of every page and 259-268 ms after
    /// `MADV_POPULATE_READ`.) Where the file lost pages, they are copied
    /// as the guard's zeros and [`FileView::truncated`] says so.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] unless `off..off + dst.len()` is inside the
    /// mapping; [`Error::Busy`] as [`crate::BufRange::copy_from`].
    pub(crate) fn copy_out(&self, off: usize, dst: &crate::BufRange<'_>) -> Result<()> {
        let len = dst.len();
        if off.checked_add(len).is_none_or(|end| end > self.map.len()) {
            return Err(Error::OutOfRange {
                offset: off,
                len,
                buf_len: self.map.len(),
            });
        }
        let (lo, hi) = page_bounds(off, len);
        // SAFETY: `off..off + len` is inside the mapping (checked above),
        // which lives while `self` does; it is a file mapping, so it cannot
        // overlap the buffer's memfd or dma-buf mapping. A page the file
        // lost meanwhile reads as zeros (the guard), never faults.
        let copied = unsafe { dst.copy_from_ptr(self.map.as_ptr().wrapping_add(off)) };
        // Unmap the pages again (they stay in the page cache), so the
        // process's resident size counts the buffers once, not the file's
        // pages as well.
        // SAFETY: `lo..hi` lies inside this live mapping (`off..off + len`
        // does, rounded out to its pages); dropping a shared file
        // mapping's pages changes no data.
        let _ = unsafe {
            rustix::mm::madvise(
                self.map.as_ptr().wrapping_add(lo).cast(),
                hi - lo,
                Advice::LinuxDontNeed,
            )
        };
        copied
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the file shrank under the mapping since it was made (a copy
    /// may have read zeros).
    pub(crate) fn truncated(&self) -> bool {
        self.map.faulted()
    }
}

/// A shared read/write mapping of part of a file that a peer may shrink (a
/// vhost-user front end's memory region, an rpmsg shared-memory file),
/// guarded against SIGBUS and unmapped on drop.
///
/// If the peer truncates the file, the next access past its new end would
/// raise SIGBUS and kill the process. While the mapping lives, such a fault
/// is caught instead: the faulting page is replaced by a private zero page
/// (the access completes on zeros, and writes reach no one else),
/// [`SharedMapping::peer_truncated`] turns true, and the socket given to
/// [`SharedMapping::shutdown_on_fault`] (the peer's connection) is shut
/// down, so its owner drops that peer. A SIGBUS anywhere else gets the
/// disposition that was in place before.
#[derive(Debug)]
pub struct SharedMapping {
    map: Mmap,
}

impl SharedMapping {
    /// Maps `len` bytes of `fd` from `offset` (a multiple of the page size)
    /// and guards them. Check that the file holds the range first: a mapping
    /// past the end of a file faults at once.
    ///
    /// # Errors
    /// [`Error::BadSize`] for a zero length, [`Error::Sys`] if `mmap` fails.
    pub fn new(fd: BorrowedFd<'_>, offset: u64, len: usize) -> Result<Self> {
        Ok(SharedMapping {
            map: Mmap::map(fd, offset, len, true)?,
        })
    }

    /// Start of the mapping. Dereferencing it is up to the caller (e.g. to
    /// build a `vm-memory` region over it); it stays valid while `self` does.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it has no bytes (never true).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// Whether a SIGBUS in it is caught (false only when every guard slot
    /// was taken or the handler could not be installed).
    pub fn is_guarded(&self) -> bool {
        self.map.is_guarded()
    }

    /// Whether a SIGBUS was caught in it: the peer shrank the file.
    pub fn peer_truncated(&self) -> bool {
        self.map.faulted()
    }

    /// On a caught SIGBUS, also shut the socket `sock` down (for both
    /// directions), so whoever serves that peer sees it disconnect. A
    /// duplicate of the descriptor is kept while the mapping lives.
    ///
    /// # Errors
    /// [`Error::Sys`] if the descriptor cannot be duplicated.
    pub fn shutdown_on_fault(&self, sock: BorrowedFd<'_>) -> Result<()> {
        self.map.shutdown_on_fault(sock)
    }
}

/// What [`Mmap`] holds.
type Guard = SigbusGuard;

/// The process-wide SIGBUS handler and its table of guarded mappings.
///
/// Written by hand: no crate catches SIGBUS for a set of mappings. The
/// handler is installed once, on the first guarded mapping, and runs for
/// every SIGBUS in the process: inside a guarded mapping it repairs the page
/// and returns; anywhere else it puts the previous disposition back, so the
/// access faults again and gets what it would have got without us.
///
/// A mapping stops being watched before it is unmapped, and an access that
/// can fault needs a live borrow of the owner, so the owner cannot be
/// dropped while the handler repairs one of its pages.
mod guard;
pub use guard::SigbusGuard;

/// Resident pages of the first `len` bytes of `fd`.
pub(crate) fn resident_pages(fd: BorrowedFd<'_>, len: usize) -> Result<usize> {
    Ok(resident_map(fd, 0, len)?.into_iter().filter(|&r| r).count())
}

/// Whether each page of `fd[off..off + len]` is in the page cache
/// (`mincore(2)` on a temporary read-only shared mapping; `off` a page
/// multiple).
pub(crate) fn resident_map(fd: BorrowedFd<'_>, off: u64, len: usize) -> Result<Vec<bool>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: a fresh read-only mapping that no Rust reference points into;
    // unmapped below before returning.
    let ptr = unsafe {
        mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ,
            MapFlags::SHARED,
            fd,
            off,
        )
    }
    .map_err(|e| Error::sys("mmap(file)", e))?;
    let page = crate::page_size();
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `ptr..ptr+len` is the mapping made above; `vec` has one byte
    // per page of it.
    let rc = unsafe { libc::mincore(ptr, len, vec.as_mut_ptr()) };
    let err = std::io::Error::last_os_error();
    // SAFETY: exactly the mapping made above, no longer used.
    let _ = unsafe { munmap(ptr, len) };
    if rc != 0 {
        return Err(Error::sys("mincore", err));
    }
    Ok(vec.iter().map(|&b| b & 1 != 0).collect())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;
    use crate::heap::{Heap, HugePages, MemfdHeap};

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

    #[test]
    fn a_file_view_copies_and_says_when_the_file_shrank() {
        let page = crate::page_size();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..4 * page).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let view = FileView::new(file.as_fd(), data.len()).unwrap();
        let buf = MemfdHeap::new(HugePages::None).alloc(4 * page).unwrap();
        view.copy_out(7, &buf.range(0, 3 * page).unwrap()).unwrap();
        let mut got = vec![0u8; 3 * page];
        buf.read_at(0, &mut got).unwrap();
        assert_eq!(got, data[7..7 + 3 * page]);
        assert!(!view.truncated());
        assert!(matches!(
            view.copy_out(page, &buf.range(0, 3 * page + 1).unwrap()),
            Err(Error::OutOfRange { .. })
        ));
        // Shrunk to one page: the rest reads as zeros and is reported.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(page as u64)
            .unwrap();
        view.copy_out(0, &buf.range(0, 4 * page).unwrap()).unwrap();
        assert!(view.truncated());
        buf.read_at(0, &mut got).unwrap();
        assert_eq!(got[..page], data[..page]);
        assert!(got[page..].iter().all(|&b| b == 0));
    }
}
