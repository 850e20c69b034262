//! Safe syscall wrappers over buffer memory ([`BufRange`]) and the heaps'
//! ioctls.
//!
//! The kernel copies to or from buffer memory that another process may
//! share, so no Rust slice is ever made over it; rustix's wrappers take
//! slices, so these take a [`BufRange`], whose lifetime keeps the mapping
//! alive for the call and whose bounds were checked when it was made. This
//! is `rustix`'s pattern (a safe wrapper per syscall) with `vm-memory`'s rule
//! (a borrowed range type instead of raw pointers).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use rustix::ioctl::{opcode, Opcode};

use crate::range::BufRange;

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

/// [`pread(2)`](https://man7.org/linux/man-pages/man2/pread.2.html) into
/// buffer memory, at most [`MAX_RW`] bytes. Retries on `EINTR`.
pub(crate) fn pread(fd: BorrowedFd<'_>, dst: BufRange<'_>, off: u64) -> io::Result<usize> {
    retry_on_intr(|| {
        // SAFETY: `dst` is writable mapped memory of `dst.len()` bytes, kept
        // mapped for the call by the range's borrow of its buffer.
        unsafe {
            libc::pread(
                fd.as_raw_fd(),
                dst.as_ptr().cast(),
                dst.len().min(MAX_RW),
                off as libc::off_t,
            )
        }
    })
}

/// [`pwrite(2)`](https://man7.org/linux/man-pages/man2/pwrite.2.html) from
/// buffer memory, at most [`MAX_RW`] bytes. Retries on `EINTR`.
pub(crate) fn pwrite(fd: BorrowedFd<'_>, src: BufRange<'_>, off: u64) -> io::Result<usize> {
    retry_on_intr(|| {
        // SAFETY: `src` is readable mapped memory of `src.len()` bytes, kept
        // mapped for the call by the range's borrow of its buffer.
        unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                src.as_ptr().cast(),
                src.len().min(MAX_RW),
                off as libc::off_t,
            )
        }
    })
}

/// [`read(2)`](https://man7.org/linux/man-pages/man2/read.2.html) (from a
/// pipe) into buffer memory. Retries on `EINTR`.
pub(crate) fn read(fd: BorrowedFd<'_>, dst: BufRange<'_>) -> io::Result<usize> {
    retry_on_intr(|| {
        // SAFETY: as in `pread`.
        unsafe { libc::read(fd.as_raw_fd(), dst.as_ptr().cast(), dst.len().min(MAX_RW)) }
    })
}

/// [`vmsplice(2)`](https://man7.org/linux/man-pages/man2/vmsplice.2.html)
/// of buffer memory into the write end of a pipe (no flags: the pages are
/// referenced, never gifted). Retries on `EINTR`.
///
/// The pipe references the pages themselves, so later writes to the buffer
/// show through until the pipe is drained; callers drain it before
/// returning to theirs.
pub(crate) fn vmsplice(pipe_w: BorrowedFd<'_>, src: BufRange<'_>) -> io::Result<usize> {
    let iov = libc::iovec {
        iov_base: src.as_ptr().cast(),
        iov_len: src.len(),
    };
    retry_on_intr(|| {
        // SAFETY: one iovec describing readable mapped memory that the range
        // keeps mapped for the call; the kernel takes page references, so
        // nothing in user space is touched afterwards.
        unsafe { libc::vmsplice(pipe_w.as_raw_fd(), &iov, 1, 0) }
    })
}

/// Whether the kernel can pin `mem`'s pages, as direct I/O must: one
/// `vmsplice(2)` of it into a fresh pipe, which takes page references
/// through the same `get_user_pages` path as `O_DIRECT` (a dma-buf mapping
/// made of PFNs fails it with `EFAULT`).
pub(crate) fn pin_probe(mem: BufRange<'_>) -> io::Result<()> {
    let (_r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    vmsplice(w.as_fd(), mem).map(|_| ())
}

/// Whether an error is the file system refusing direct I/O.
pub(crate) fn is_einval(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

/// `struct udmabuf_create` from include/uapi/linux/udmabuf.h.
#[repr(C)]
struct UdmabufCreate {
    memfd: u32,
    flags: u32,
    offset: u64,
    size: u64,
}
/// `_IOW('u', 0x42, struct udmabuf_create)`.
const UDMABUF_CREATE: Opcode = opcode::write::<UdmabufCreate>(b'u', 0x42);
const UDMABUF_FLAGS_CLOEXEC: u32 = 1;

/// `ioctl(UDMABUF_CREATE)` on `/dev/udmabuf`: a close-on-exec dma-buf over
/// `len` bytes of `memfd` from offset 0 (include/uapi/linux/udmabuf.h).
pub(crate) fn udmabuf_create(
    dev: BorrowedFd<'_>,
    memfd: BorrowedFd<'_>,
    len: usize,
) -> io::Result<OwnedFd> {
    let mut req = UdmabufCreate {
        memfd: memfd.as_raw_fd() as u32,
        flags: UDMABUF_FLAGS_CLOEXEC,
        offset: 0,
        size: len as u64,
    };
    // SAFETY: UDMABUF_CREATE reads a `struct udmabuf_create`, which `req` is
    // (repr(C), same layout); both fds stay open across the call.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), UDMABUF_CREATE as libc::c_ulong, &mut req) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success the ioctl returns a new dma-buf fd that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `struct dma_heap_allocation_data` from include/uapi/linux/dma-heap.h.
#[repr(C)]
struct DmaHeapAllocationData {
    len: u64,
    fd: u32,
    fd_flags: u32,
    heap_flags: u64,
}
/// `_IOWR('H', 0x0, struct dma_heap_allocation_data)`.
const DMA_HEAP_IOCTL_ALLOC: Opcode = opcode::read_write::<DmaHeapAllocationData>(b'H', 0x0);

/// `ioctl(DMA_HEAP_IOCTL_ALLOC)` on a `/dev/dma_heap/<name>` node: a new
/// read/write, close-on-exec dma-buf of `len` bytes
/// (include/uapi/linux/dma-heap.h).
pub(crate) fn dma_heap_alloc(dev: BorrowedFd<'_>, len: usize) -> io::Result<OwnedFd> {
    let mut req = DmaHeapAllocationData {
        len: len as u64,
        fd: 0,
        fd_flags: (libc::O_RDWR | libc::O_CLOEXEC) as u32,
        heap_flags: 0,
    };
    // SAFETY: DMA_HEAP_IOCTL_ALLOC reads and writes a
    // `struct dma_heap_allocation_data`, which `req` is (repr(C)).
    let rc = unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            DMA_HEAP_IOCTL_ALLOC as libc::c_ulong,
            &mut req,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success the kernel stored a new dma-buf fd that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(req.fd as i32) })
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;

    use super::*;

    #[test]
    fn ioctl_numbers_are_linux_s() {
        // The values in DESIGN.md "Facts" and the kernel's headers.
        assert_eq!(size_of::<UdmabufCreate>(), 24);
        assert_eq!(size_of::<DmaHeapAllocationData>(), 24);
        assert_eq!(UDMABUF_CREATE, 0x4018_7542);
        assert_eq!(DMA_HEAP_IOCTL_ALLOC, 0xC018_4800);
    }
}
