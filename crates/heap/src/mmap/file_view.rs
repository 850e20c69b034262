//! [`FileView`]: a read-only shared mapping of a file, to copy its cached
//! pages out of.

use std::os::fd::BorrowedFd;

use rustix::mm::{Advice, MapFlags, ProtFlags};

use super::mapping::{page_bounds, Mmap};
use crate::{Error, Result};

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
    /// `madvise` fails; [`Error::Unguarded`] when the mapping cannot be
    /// guarded.
    pub(crate) fn new(fd: BorrowedFd<'_>, len: usize) -> Result<Self> {
        let map = Mmap::map_prot(fd, 0, len, true, ProtFlags::READ, MapFlags::SHARED)?;
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

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;
    use crate::heap::{Heap, HugePages, MemfdHeap};

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
