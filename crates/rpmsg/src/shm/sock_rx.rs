//! Messages off a `SOCK_SEQPACKET` socket straight into buffers of the
//! shared memory: one `recvmmsg(2)` (one `recv(2)` for a single buffer),
//! the kernel copying each message into its place, so a relay from a
//! socket to the ring makes no copy of its own.

use std::os::fd::{AsRawFd, BorrowedFd};

use super::SharedMem;

/// Buffers per call, at most.
pub(crate) const MAX_RANGES: usize = 16;

/// Receives up to `ranges.len()` (at most [`MAX_RANGES`]) messages from
/// `fd` without waiting, message `i` into `ranges[i]` (`(address, length)`
/// in `shm`), with `MSG_TRUNC`: `full[i]` is its whole length, the part
/// past its range dropped by the kernel. Returns how many; fewer than
/// asked means the socket had no more. End of file reads as one empty
/// message.
///
/// # Errors
/// The call's errno when it took nothing (`EAGAIN`: none queued);
/// `EFAULT` for a range outside the shared memory (nothing is received).
pub(crate) fn recv_into(
    shm: &SharedMem,
    fd: BorrowedFd<'_>,
    ranges: &[(u64, usize)],
    full: &mut [usize],
) -> rustix::io::Result<usize> {
    let n = ranges.len().min(MAX_RANGES).min(full.len());
    if n == 0 {
        return Ok(0);
    }
    // Each range checked against the mapping, which stays mapped while
    // `shm` is borrowed (for the whole call).
    // SAFETY: iovec is a plain C struct for which all zero bytes is a
    // valid value (null pointer, zero length).
    let mut iov: [libc::iovec; MAX_RANGES] = unsafe { std::mem::zeroed() };
    for (v, &(addr, len)) in iov.iter_mut().zip(&ranges[..n]) {
        let r = usize::try_from(addr)
            .ok()
            .and_then(|a| shm.buffer().coherent_range(a, len).ok())
            .ok_or(rustix::io::Errno::FAULT)?;
        v.iov_base = r.ptr_guard().as_ptr().cast();
        v.iov_len = len;
    }
    // SAFETY: each of the first `n` iovecs names one checked range of the
    // live shared mapping (`shm` keeps it mapped), which no Rust reference
    // covers. Another process may write the same bytes: only the kernel's
    // copy touches them here.
    unsafe { recv_iovecs(fd, &mut iov[..n], full) }
}

/// Receives up to `iov.len()` (at most [`MAX_RANGES`]) messages from `fd`
/// without waiting, message `i` into `iov[i]`, with `MSG_TRUNC`: `full[i]`
/// is its whole length. One `recv(2)` for one buffer (it costs the kernel
/// less), else one `recvmmsg(2)`. Returns how many; fewer than asked
/// means the socket had no more. End of file reads as one empty message.
/// The raw calls are here because rustix has no `recvmmsg`.
///
/// # Errors
/// The call's errno when it took nothing (`EAGAIN`: none queued).
///
/// # Safety
/// Each iovec names memory that stays valid and writable for its whole
/// length during the call and that no Rust reference covers.
pub(crate) unsafe fn recv_iovecs(
    fd: BorrowedFd<'_>,
    iov: &mut [libc::iovec],
    full: &mut [usize],
) -> rustix::io::Result<usize> {
    let n = iov.len().min(MAX_RANGES).min(full.len());
    let flags = libc::MSG_DONTWAIT | libc::MSG_TRUNC;
    if n == 0 {
        return Ok(0);
    }
    if n == 1 {
        // SAFETY: the caller's: `iov[0]` is writable for its length.
        let r = unsafe { libc::recv(fd.as_raw_fd(), iov[0].iov_base, iov[0].iov_len, flags) };
        if r < 0 {
            return Err(rustix::io::Errno::from_raw_os_error(errno()));
        }
        full[0] = r as usize;
        return Ok(1);
    }
    // SAFETY: mmsghdr is a plain C struct for which all zero bytes is a
    // valid value (null pointers, zero lengths).
    let mut hdrs: [libc::mmsghdr; MAX_RANGES] = unsafe { std::mem::zeroed() };
    for (h, v) in hdrs.iter_mut().zip(iov.iter_mut()) {
        h.msg_hdr.msg_iov = v;
        h.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: the first `n` headers each name one iovec of `iov`, whose
    // memory the caller keeps writable; no address, no control buffer;
    // the kernel writes at most each iovec's length and the headers'
    // lengths and flags; a null timeout is allowed.
    let r = unsafe {
        libc::recvmmsg(
            fd.as_raw_fd(),
            hdrs.as_mut_ptr(),
            n as libc::c_uint,
            flags,
            std::ptr::null_mut(),
        )
    };
    if r < 0 {
        return Err(rustix::io::Errno::from_raw_os_error(errno()));
    }
    let k = (r as usize).min(n);
    for (f, h) in full.iter_mut().zip(&hdrs).take(k) {
        *f = h.msg_len as usize;
    }
    Ok(k)
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rsc_table::ShmLayout;
    use rustix::net::{AddressFamily, SendFlags, SocketFlags, SocketType};
    use std::os::fd::AsFd;

    #[test]
    fn messages_land_in_their_ranges_and_lengths_are_whole() {
        let dir = tempfile::tempdir().unwrap();
        let shm = SharedMem::create(&dir.path().join("shm"), &ShmLayout::openamp_demo()).unwrap();
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let base = 0x10000u64;
        let ranges: Vec<(u64, usize)> = (0..4).map(|i| (base + i * 64, 32)).collect();
        let mut full = [0usize; 4];
        assert_eq!(
            recv_into(&shm, b.as_fd(), &ranges, &mut full),
            Err(rustix::io::Errno::AGAIN)
        );
        shm.write(base, &[0xEE; 256]).unwrap();
        for m in [&b"one"[..], &[7u8; 40][..], &b""[..]] {
            rustix::net::send(&a, m, SendFlags::empty()).unwrap();
        }
        assert_eq!(recv_into(&shm, b.as_fd(), &ranges, &mut full), Ok(3));
        assert_eq!(full[..3], [3, 40, 0]);
        let mut got = [0u8; 64];
        shm.read(base, &mut got).unwrap();
        assert_eq!(&got[..4], b"one\xEE");
        shm.read(base + 64, &mut got).unwrap();
        // Cut at the range: 32 bytes in, the rest untouched.
        assert_eq!(&got[..32], &[7u8; 32]);
        assert_eq!(got[32], 0xEE);
        // One range: the same through recv(2); a range outside refused.
        rustix::net::send(&a, b"four", SendFlags::empty()).unwrap();
        assert_eq!(
            recv_into(&shm, b.as_fd(), &[(shm.len() as u64 - 2, 4)], &mut full),
            Err(rustix::io::Errno::FAULT)
        );
        assert_eq!(recv_into(&shm, b.as_fd(), &ranges[3..], &mut full), Ok(1));
        assert_eq!(full[0], 4);
        shm.read(base + 192, &mut got[..4]).unwrap();
        assert_eq!(&got[..4], b"four");
        // End of file: empty messages (recvmmsg(2) takes as many as asked).
        drop(a);
        assert_eq!(recv_into(&shm, b.as_fd(), &ranges[..1], &mut full), Ok(1));
        assert_eq!(full[0], 0);
        assert_eq!(recv_into(&shm, b.as_fd(), &ranges, &mut full), Ok(4));
        assert_eq!(full, [0; 4]);
    }
}
