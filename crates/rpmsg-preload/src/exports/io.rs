//! Reads and writes: `read`, `recv`, `write`, `send`, `readv`, `writev`
//! and the fortified `__read_chk` and `__recv_chk`, served by the endpoint
//! on endpoint fds and answered `EINVAL` on control fds (rpmsg_ctrl has
//! neither read nor write).

use libc::{c_int, c_void, size_t, ssize_t};

use crate::fds::{self, Kind};
use crate::{ept, real};

#[cold]
fn rpmsg_read(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> Option<ssize_t> {
    match fds::get(fd)? {
        // SAFETY: the program's buffer, as it passed it to read(2).
        Kind::Ept(e) => Some(unsafe { ept::read(fd, &e, buf, n, flags) }),
        // rpmsg_ctrl has no read: vfs_read answers EINVAL.
        Kind::Ctrl(_) => {
            crate::set_errno(libc::EINVAL);
            Some(-1)
        }
    }
}

#[cold]
fn rpmsg_write(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> Option<ssize_t> {
    match fds::get(fd)? {
        // SAFETY: the program's buffer, as it passed it to write(2).
        Kind::Ept(e) => Some(unsafe { ept::write(fd, &e, buf, n, flags) }),
        // rpmsg_ctrl has no write: vfs_write answers EINVAL.
        Kind::Ctrl(_) => {
            crate::set_errno(libc::EINVAL);
            Some(-1)
        }
    }
}

/// `read` of an rpmsg fd.
#[cold]
#[inline(never)]
unsafe extern "C" fn read_slow(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if let Some(r) = rpmsg_read(fd, buf, n, 0) {
        return r;
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::read(fd, buf, n) }
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if fds::is_ours(fd) {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { read_slow(fd, buf, n) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::read(fd, buf, n) }
}

/// `recv` of an rpmsg fd.
#[cold]
#[inline(never)]
unsafe extern "C" fn recv_slow(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    if let Some(r) = rpmsg_read(fd, buf, n, flags) {
        return r;
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::recv(fd, buf, n, flags) }
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    if fds::is_ours(fd) {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { recv_slow(fd, buf, n, flags) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::recv(fd, buf, n, flags) }
}

/// `write` to an rpmsg fd.
#[cold]
#[inline(never)]
unsafe extern "C" fn write_slow(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if let Some(r) = rpmsg_write(fd, buf, n, 0) {
        return r;
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::write(fd, buf, n) }
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if fds::is_ours(fd) {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { write_slow(fd, buf, n) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::write(fd, buf, n) }
}

/// `send` to an rpmsg fd.
#[cold]
#[inline(never)]
unsafe extern "C" fn send_slow(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    if let Some(r) = rpmsg_write(fd, buf, n, flags) {
        return r;
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::send(fd, buf, n, flags) }
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    if fds::is_ours(fd) {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { send_slow(fd, buf, n, flags) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::send(fd, buf, n, flags) }
}

#[cold]
fn rpmsg_readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> Option<ssize_t> {
    match fds::get(fd)? {
        // SAFETY: the program's iovecs, as it passed them to readv(2).
        Kind::Ept(e) => Some(unsafe { ept::readv(fd, &e, iov, n) }),
        Kind::Ctrl(_) => {
            crate::set_errno(libc::EINVAL);
            Some(-1)
        }
    }
}

#[cold]
fn rpmsg_writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> Option<ssize_t> {
    match fds::get(fd)? {
        // SAFETY: the program's iovecs, as it passed them to writev(2).
        Kind::Ept(e) => Some(unsafe { ept::writev(fd, &e, iov, n) }),
        Kind::Ctrl(_) => {
            crate::set_errno(libc::EINVAL);
            Some(-1)
        }
    }
}

/// `readv` of an rpmsg fd.
#[cold]
#[inline(never)]
unsafe extern "C" fn readv_slow(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    if let Some(r) = rpmsg_readv(fd, iov, n) {
        return r;
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::readv(fd, iov, n) }
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    if fds::is_ours(fd) {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { readv_slow(fd, iov, n) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::readv(fd, iov, n) }
}

/// `writev` to an rpmsg fd.
#[cold]
#[inline(never)]
unsafe extern "C" fn writev_slow(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    if let Some(r) = rpmsg_writev(fd, iov, n) {
        return r;
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::writev(fd, iov, n) }
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    if fds::is_ours(fd) {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { writev_slow(fd, iov, n) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::writev(fd, iov, n) }
}

// The fortified variants glibc calls under _FORTIFY_SOURCE when a size is
// known only at run time. A size over the buffer goes to libc's own check
// (which aborts the program, as without the preload).

/// `__read_chk` of an rpmsg fd.
#[cold]
#[inline(never)]
unsafe extern "C" fn read_chk_slow(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if let Some(r) = rpmsg_read(fd, buf, n, 0) {
        return r;
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::read_chk(fd, buf, n, buflen) }
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if n <= buflen && fds::is_ours(fd) {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { read_chk_slow(fd, buf, n, buflen) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::read_chk(fd, buf, n, buflen) }
}

/// `__recv_chk` of an rpmsg fd.
#[cold]
#[inline(never)]
unsafe extern "C" fn recv_chk_slow(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if let Some(r) = rpmsg_read(fd, buf, n, flags) {
        return r;
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::recv_chk(fd, buf, n, buflen, flags) }
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if n <= buflen && fds::is_ours(fd) {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { recv_chk_slow(fd, buf, n, buflen, flags) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::recv_chk(fd, buf, n, buflen, flags) }
}
