//! The one owning type around a shared mapping, and the borrowed range of it
//! that everything else in the crate goes through.
//!
//! Raw pointers into buffer memory live here and in the syscall wrappers
//! ([`crate::sys`], [`crate::ring`]) that take a [`BufRange`]: the range's
//! lifetime borrows the [`Buffer`], so the mapping outlives every use of the
//! pointer, and its bounds are checked once, when it is made. Engines never
//! see a pointer.

use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

use rustix::mm::{mmap, munmap, Advice, MapFlags, ProtFlags};

use crate::{Buffer, Error, Result};

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
        // SAFETY: `ptr`/`len` describe exactly the mapping made in `new`, and
        // no pointer into it outlives `self` (borrowers hold the `Buffer`).
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A bounds-checked range of a [`Buffer`]'s mapping, borrowed for `'a`.
///
/// The only way the crate reaches buffer memory: bytes are copied in and out
/// (never referenced, since another process or a device may write them at any
/// time), and the syscall wrappers in [`crate::sys`] and [`crate::ring`] take
/// a range instead of a pointer. Invariant: `off + len <= buf.len()`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BufRange<'a> {
    buf: &'a Buffer,
    off: usize,
    len: usize,
}

impl<'a> BufRange<'a> {
    /// `buf[off..off + len]`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] unless the range is inside the buffer.
    pub(crate) fn new(buf: &'a Buffer, off: usize, len: usize) -> Result<Self> {
        buf.check_range(off, len)?;
        Ok(BufRange { buf, off, len })
    }

    /// Bytes in the range.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The buffer the range is in.
    pub(crate) fn buffer(&self) -> &'a Buffer {
        self.buf
    }

    /// Offset of the range in its buffer.
    pub(crate) fn offset(&self) -> usize {
        self.off
    }

    /// Address of the first byte (for alignment maths only).
    pub(crate) fn addr(&self) -> usize {
        self.buf.as_ptr() as usize + self.off
    }

    /// The first byte, for a syscall wrapper to hand to the kernel together
    /// with [`BufRange::len`].
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.buf.as_ptr().wrapping_add(self.off)
    }

    /// `self[off..off + len]`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] unless the sub-range is inside this range.
    pub(crate) fn sub(&self, off: usize, len: usize) -> Result<BufRange<'a>> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(BufRange {
                buf: self.buf,
                off: self.off + off,
                len,
            }),
            _ => Err(Error::OutOfRange {
                offset: off,
                len,
                buf_len: self.len,
            }),
        }
    }

    /// `self[off..]`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if `off > len`.
    pub(crate) fn skip(&self, off: usize) -> Result<BufRange<'a>> {
        self.sub(off, self.len.saturating_sub(off))
    }

    /// Copies the range out into `dst` (which must be as long).
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if the lengths differ.
    pub(crate) fn copy_to(&self, dst: &mut [u8]) -> Result<()> {
        self.same_len(dst.len())?;
        // SAFETY: the range is inside the live mapping (invariant; `'a`
        // borrows the buffer that owns it), `dst` is a distinct Rust slice of
        // the same length, and the copy only reads the shared memory, never
        // references it.
        unsafe { std::ptr::copy_nonoverlapping(self.as_ptr(), dst.as_mut_ptr(), self.len) };
        Ok(())
    }

    /// Copies `src` (which must be as long) into the range.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] if the lengths differ.
    pub(crate) fn copy_from(&self, src: &[u8]) -> Result<()> {
        self.same_len(src.len())?;
        // SAFETY: as in `copy_to`, in the other direction; writing plain
        // bytes into shared memory creates no Rust references.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_ptr(), self.len) };
        Ok(())
    }

    /// Sets every byte of the range to `byte`.
    pub(crate) fn fill(&self, byte: u8) {
        // SAFETY: the range is inside the live mapping (invariant); writing
        // plain bytes creates no Rust references.
        unsafe { std::ptr::write_bytes(self.as_ptr(), byte, self.len) };
    }

    fn same_len(&self, other: usize) -> Result<()> {
        if other == self.len {
            Ok(())
        } else {
            Err(Error::OutOfRange {
                offset: self.off,
                len: other,
                buf_len: self.len,
            })
        }
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
