//! The one owning type for private, aligned direct-I/O memory.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use crate::{Error, Result};

/// A zeroed heap allocation aligned for `O_DIRECT`, freed on drop. Private to
/// this process, so handing out slices is sound.
#[derive(Debug)]
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: plain owned memory, like a `Box<[u8]>`.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// `len` bytes (non-zero) aligned to `align` (a power of two).
    pub(crate) fn new(len: usize, align: usize) -> Result<Self> {
        let layout =
            Layout::from_size_align(len.max(1), align.max(1)).map_err(|_| Error::BadSize {
                size: len,
                page: align,
            })?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            Error::sys(
                "allocate bounce buffer",
                std::io::Error::from(std::io::ErrorKind::OutOfMemory),
            )
        })?;
        Ok(AlignedBuf { ptr, layout })
    }

    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` owns `len` initialised (zeroed) bytes for our lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}
