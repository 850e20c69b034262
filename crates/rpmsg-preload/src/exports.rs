//! The interposed symbols, and the library's constructor. Each checks,
//! cheaply, whether the call is about an rpmsg path or fd and otherwise
//! tail-calls libc's definition; the rpmsg work is out of line (`#[cold]`),
//! so the common path saves no register and sets up no frame.
//!
//! C declares `open`, `openat`, `ioctl` and `fcntl` variadic; they are
//! defined here with their one optional argument as a fixed parameter, as
//! interposers do: on x86_64 and aarch64 Linux a variadic caller passes it
//! in the same register, and for calls that do not pass it the value read
//! is unused (`mode` without `O_CREAT`/`O_TMPFILE`, `arg` of an `F_GETFD`).

use libc::{c_char, c_int, c_uint, c_ulong, c_void, nfds_t, pollfd, size_t, ssize_t};

use crate::fds::{self, Kind};
use crate::fork::Handlers;
use crate::{ctrl, ept, path, real};

/// The modules' fork handlers, in the order they take their locks: the
/// control fds' node directory and channel list, then the fd table.
static FORK_HANDLERS: [&Handlers; 2] = [&ctrl::fork::HANDLERS, &fds::fork::HANDLERS];

/// The library's constructor (run by the dynamic loader before `main`):
/// looks up libc's definitions and registers the fork handlers.
extern "C" fn init() {
    real::resolve_all();
    crate::fork::register(&FORK_HANDLERS);
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// The rpmsg open of `path`, if it is one and the service is configured.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn rpmsg_open(path: *const c_char, flags: c_int) -> Option<c_int> {
    // SAFETY: as the caller promises.
    let dev = unsafe { path::classify_c(path) }?;
    let ctrl = ctrl::service_path()?;
    Some(match ctrl::open(dev, flags, &ctrl) {
        Ok(fd) => fd,
        Err(e) => {
            crate::set_errno(e);
            -1
        }
    })
}

/// A new fd from libc: an entry left for its number is stale (closed
/// behind the library's back). Only needed with some rpmsg fd open: with
/// none, there is no entry to be stale.
fn fresh(fd: c_int) -> c_int {
    if fd >= 0 && fds::is_ours(fd) {
        fds::discard(fd);
    }
    fd
}

/// Declares an interposed `open`-like function: `NAME` checks the path's
/// prefix and the fd count inline and jumps to libc's `REAL`; `SLOW`, out
/// of line, serves rpmsg paths and the bookkeeping with rpmsg fds open.
macro_rules! open_like {
    ($name:ident, $slow:ident, $real:ident, ($($pre:ident: $pt:ty),*) $(, $mode:ident)?) => {
        #[cold]
        #[inline(never)]
        unsafe extern "C" fn $slow($($pre: $pt,)* path: *const c_char, flags: c_int $(, $mode: c_uint)?) -> c_int {
            // SAFETY: `path` is the program's NUL-terminated path.
            if let Some(r) = unsafe { rpmsg_open(path, flags) } {
                return r;
            }
            // SAFETY: the program's own arguments, passed on.
            let fd = unsafe { real::$real($($pre,)* path, flags $(, $mode)?) };
            if fds::any() {
                return fresh(fd);
            }
            fd
        }

        /// Interposed; see the module doc.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($pre: $pt,)* path: *const c_char, flags: c_int $(, $mode: c_uint)?) -> c_int {
            // SAFETY: `path` is the program's NUL-terminated path.
            if unsafe { path::has_prefix(path) } || fds::any() {
                // SAFETY: the program's own arguments, passed on.
                return unsafe { $slow($($pre,)* path, flags $(, $mode)?) };
            }
            // SAFETY: the program's own arguments, passed on.
            unsafe { real::$real($($pre,)* path, flags $(, $mode)?) }
        }
    };
}

open_like!(open, open_slow, open, (), mode);
open_like!(open64, open64_slow, open64, (), mode);
open_like!(openat, openat_slow, openat, (dirfd: c_int), mode);
open_like!(openat64, openat64_slow, openat64, (dirfd: c_int), mode);
open_like!(__open_2, open_2_slow, open_2, ());
open_like!(__open64_2, open64_2_slow, open64_2, ());
open_like!(__openat_2, openat_2_slow, openat_2, (dirfd: c_int));
open_like!(__openat64_2, openat64_2_slow, openat64_2, (dirfd: c_int));

#[cold]
fn rpmsg_ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> Option<c_int> {
    // The kernel takes the request as an unsigned int.
    let cmd = request as u32;
    let r = match fds::get(fd)? {
        Kind::Ctrl(c) => ctrl::ioctl(fd, &c, cmd, arg as usize)?,
        Kind::Ept(e) => ept::ioctl(fd, &e, cmd, arg as usize)?,
    };
    Some(r.unwrap_or_else(|e| {
        crate::set_errno(e);
        -1
    }))
}

/// `ioctl` on an rpmsg fd (or one whose bit was just cleared).
#[cold]
#[inline(never)]
unsafe extern "C" fn ioctl_slow(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    if let Some(r) = rpmsg_ioctl(fd, request, arg) {
        return r;
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::ioctl(fd, request, arg) }
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    if fds::is_ours(fd) {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { ioctl_slow(fd, request, arg) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::ioctl(fd, request, arg) }
}

/// `close` of an rpmsg fd.
#[cold]
#[inline(never)]
unsafe extern "C" fn close_slow(fd: c_int) -> c_int {
    fds::forget(fd);
    // SAFETY: the program's own argument, passed on.
    unsafe { real::close(fd) }
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if fds::is_ours(fd) {
        // SAFETY: the program's own argument, passed on.
        return unsafe { close_slow(fd) };
    }
    // SAFETY: the program's own argument, passed on.
    unsafe { real::close(fd) }
}

/// `close_range` with some rpmsg fd open.
#[cold]
#[inline(never)]
unsafe extern "C" fn close_range_slow(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe { real::close_range(first, last, flags) };
    // (CLOSE_RANGE_CLOEXEC only marks them.)
    if r == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        fds::forget_range(first, last);
    }
    r
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if fds::any() {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { close_range_slow(first, last, flags) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::close_range(first, last, flags) }
}

/// Bookkeeping after a successful dup of `old` into `new`.
#[cold]
fn after_dup(old: c_int, new: c_int) -> c_int {
    fds::discard(new);
    if !fds::copy(old, new) {
        // SAFETY: the copy just made, which the program has not seen.
        unsafe { real::close(new) };
        crate::set_errno(libc::EMFILE);
        return -1;
    }
    new
}

/// `new` is about to be closed by a dup onto it (if `old` is valid).
#[cold]
fn before_dup_onto(old: c_int, new: c_int) {
    // SAFETY: F_GETFD only reads `old`'s flags.
    if old != new && unsafe { real::fcntl(old, libc::F_GETFD, 0) } >= 0 {
        fds::forget(new);
    }
}

/// `dup` with some rpmsg fd open.
#[cold]
#[inline(never)]
unsafe extern "C" fn dup_slow(old: c_int) -> c_int {
    // SAFETY: the program's own argument, passed on.
    let r = unsafe { real::dup(old) };
    if r >= 0 && (fds::is_ours(old) || fds::is_ours(r)) {
        return after_dup(old, r);
    }
    r
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn dup(old: c_int) -> c_int {
    if fds::any() {
        // SAFETY: the program's own argument, passed on.
        return unsafe { dup_slow(old) };
    }
    // SAFETY: the program's own argument, passed on.
    unsafe { real::dup(old) }
}

/// `dup2` with some rpmsg fd open.
#[cold]
#[inline(never)]
unsafe extern "C" fn dup2_slow(old: c_int, new: c_int) -> c_int {
    if fds::is_ours(new) {
        before_dup_onto(old, new);
    }
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe { real::dup2(old, new) };
    if r >= 0 && old != new && fds::is_ours(old) {
        return after_dup(old, r);
    }
    r
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if fds::any() {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { dup2_slow(old, new) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::dup2(old, new) }
}

/// `dup3` with some rpmsg fd open.
#[cold]
#[inline(never)]
unsafe extern "C" fn dup3_slow(old: c_int, new: c_int, flags: c_int) -> c_int {
    if fds::is_ours(new) {
        before_dup_onto(old, new);
    }
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe { real::dup3(old, new, flags) };
    if r >= 0 && fds::is_ours(old) {
        return after_dup(old, r);
    }
    r
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if fds::any() {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { dup3_slow(old, new, flags) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::dup3(old, new, flags) }
}

/// `fcntl` (or `fcntl64`) with some rpmsg fd open: a `F_DUPFD*` copy of
/// one is one too.
#[cold]
#[inline(never)]
unsafe extern "C" fn fcntl_slow(is64: bool, fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the program's own arguments, passed on.
    let r = unsafe {
        if is64 {
            real::fcntl64(fd, cmd, arg)
        } else {
            real::fcntl(fd, cmd, arg)
        }
    };
    if r >= 0
        && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC)
        && (fds::is_ours(fd) || fds::is_ours(r))
    {
        return after_dup(fd, r);
    }
    r
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    if fds::any() {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { fcntl_slow(false, fd, cmd, arg) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::fcntl(fd, cmd, arg) }
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    if fds::any() {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { fcntl_slow(true, fd, cmd, arg) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::fcntl64(fd, cmd, arg) }
}

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

/// `POLLERR` for endpoints that are gone, after a poll that returned `r`
/// with some rpmsg fd open.
#[cold]
#[inline(never)]
extern "C" fn after_poll(fds_: *mut pollfd, n: nfds_t, r: c_int) -> c_int {
    if r > 0 && !fds_.is_null() {
        // SAFETY: the program's array of `n` entries, which the kernel
        // has just written (the poll succeeded).
        ept::fix_revents(unsafe { std::slice::from_raw_parts_mut(fds_, n as usize) });
    }
    r
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn poll(fds_: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    if !fds::any() {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { real::poll(fds_, n, timeout) };
    }
    // SAFETY: as above.
    let r = unsafe { real::poll(fds_, n, timeout) };
    after_poll(fds_, n, r)
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds_: *mut pollfd,
    n: nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    if !fds::any() {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { real::ppoll(fds_, n, ts, mask) };
    }
    // SAFETY: as above.
    let r = unsafe { real::ppoll(fds_, n, ts, mask) };
    after_poll(fds_, n, r)
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

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds_: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    if !fds::any() {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { real::poll_chk(fds_, n, timeout, fdslen) };
    }
    // SAFETY: as above.
    let r = unsafe { real::poll_chk(fds_, n, timeout, fdslen) };
    after_poll(fds_, n, r)
}

/// Interposed; see the module doc.
#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    fds_: *mut pollfd,
    n: nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
    fdslen: size_t,
) -> c_int {
    if !fds::any() {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { real::ppoll_chk(fds_, n, ts, mask, fdslen) };
    }
    // SAFETY: as above.
    let r = unsafe { real::ppoll_chk(fds_, n, ts, mask, fdslen) };
    after_poll(fds_, n, r)
}
