//! Raw-pointer `pread`/`pwrite`: the kernel copies to or from buffer memory
//! that another process may share, so no Rust slice is ever made over it.
//! (rustix's wrappers take slices; these are hand-written for that reason.)

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Largest byte count one `read`/`write` moves on Linux (`MAX_RW_COUNT`),
/// rounded down to a MiB.
pub(crate) const MAX_RW: usize = 0x7fe0_0000;

/// Runs a byte-count syscall until it is not interrupted: a non-negative
/// return is the count; `-1` is the `errno` error, or, for `EINTR`, another
/// try.
fn retry_on_intr(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `pread(2)` into raw memory. Retries on `EINTR`.
///
/// # Safety
/// `ptr..ptr+len` must be writable memory that stays mapped for the call.
pub(crate) unsafe fn pread(
    fd: BorrowedFd<'_>,
    ptr: *mut u8,
    len: usize,
    off: u64,
) -> io::Result<usize> {
    retry_on_intr(|| {
        // SAFETY: the caller guarantees the range is writable and mapped.
        unsafe {
            libc::pread(
                fd.as_raw_fd(),
                ptr.cast(),
                len.min(MAX_RW),
                off as libc::off_t,
            )
        }
    })
}

/// `pwrite(2)` from raw memory. Retries on `EINTR`.
///
/// # Safety
/// `ptr..ptr+len` must be readable memory that stays mapped for the call.
pub(crate) unsafe fn pwrite(
    fd: BorrowedFd<'_>,
    ptr: *const u8,
    len: usize,
    off: u64,
) -> io::Result<usize> {
    retry_on_intr(|| {
        // SAFETY: the caller guarantees the range is readable and mapped.
        unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                ptr.cast(),
                len.min(MAX_RW),
                off as libc::off_t,
            )
        }
    })
}

/// `read(2)` from a pipe into raw memory. Retries on `EINTR`.
///
/// # Safety
/// As [`pread`].
pub(crate) unsafe fn read(fd: BorrowedFd<'_>, ptr: *mut u8, len: usize) -> io::Result<usize> {
    retry_on_intr(|| {
        // SAFETY: the caller guarantees the range is writable and mapped.
        unsafe { libc::read(fd.as_raw_fd(), ptr.cast(), len.min(MAX_RW)) }
    })
}

/// Whether an error is the file system refusing direct I/O.
pub(crate) fn is_einval(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

/// `vmsplice(2)` of raw memory into the write end of a pipe (no flags: the
/// pages are referenced, never gifted). Retries on `EINTR`.
///
/// # Safety
/// `ptr..ptr+len` must be readable memory that stays mapped and unchanged
/// until the pipe's contents have been consumed.
pub(crate) unsafe fn vmsplice(
    pipe_w: BorrowedFd<'_>,
    ptr: *const u8,
    len: usize,
) -> io::Result<usize> {
    let iov = libc::iovec {
        iov_base: ptr as *mut libc::c_void,
        iov_len: len,
    };
    retry_on_intr(|| {
        // SAFETY: one iovec describing memory the caller vouches for.
        unsafe { libc::vmsplice(pipe_w.as_raw_fd(), &iov, 1, 0) }
    })
}
