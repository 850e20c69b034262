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
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe exactly the mapping made in `new`, and
        // no pointer into it outlives `self` (borrowers hold the `Buffer`).
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
