//! Which pages of a file are in the page cache: `mincore(2)` on a
//! temporary mapping.

use std::os::fd::BorrowedFd;

use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};

use crate::{Error, Result};

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
