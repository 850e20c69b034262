//! The one owning type around a shared mapping.

use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};

use crate::{Error, Result};

/// A `MAP_SHARED` read/write mapping of a whole file descriptor, unmapped on
/// drop.
#[derive(Debug)]
pub(crate) struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory with no thread affinity; all
// access goes through raw pointers with volatile or copy semantics.
unsafe impl Send for Mmap {}
// SAFETY: as above; `Mmap` hands out no references, only raw pointers.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// Maps `len` bytes of `fd` from offset 0, shared and read/write.
    pub(crate) fn new(fd: BorrowedFd<'_>, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::BadSize {
                size: 0,
                page: crate::page_size(),
            });
        }
        // SAFETY: a fresh mapping at an address the kernel picks cannot alias
        // any Rust object; we own it until `munmap` in `drop`.
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .map_err(|e| Error::sys("mmap", e))?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(Error::BadMessage("mmap returned null"))?;
        Ok(Mmap { ptr, len })
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// `madvise(MADV_POPULATE_WRITE)`: faults every page of the mapping in
    /// now (Linux 5.14+).
    pub(crate) fn populate_write(&self) -> Result<()> {
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        // SAFETY: the range is exactly this live mapping; populating only
        // allocates its pages, it does not change their contents.
        let rc = unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.len, MADV_POPULATE_WRITE) };
        if rc != 0 {
            return Err(Error::sys(
                "madvise(MADV_POPULATE_WRITE)",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe exactly the mapping made in `new`, and
        // no pointer into it outlives `self` (borrowers hold the `Buffer`).
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Resident pages of the first `len` bytes of `fd` (`mincore(2)` on a
/// temporary read-only shared mapping).
pub(crate) fn resident_pages(fd: BorrowedFd<'_>, len: usize) -> Result<usize> {
    // SAFETY: a fresh read-only mapping that no Rust reference points into;
    // unmapped below before returning.
    let ptr = unsafe {
        mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ,
            MapFlags::SHARED,
            fd,
            0,
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
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count())
}
