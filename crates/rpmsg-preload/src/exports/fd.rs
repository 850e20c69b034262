//! Calls on fd numbers: `ioctl` on rpmsg fds, and the bookkeeping of
//! `close`, `close_range`, `dup`, `dup2`, `dup3` and `fcntl`'s `F_DUPFD*`
//! that keeps the fd table in step with the program's fds. `ioctl` and
//! `fcntl` take their optional argument as a fixed parameter ([`super`]
//! says why that is sound).

use libc::{c_int, c_uint, c_ulong, c_void};

use crate::fds::{self, Kind};
use crate::{ctrl, ept, real};

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
///
/// # Safety
/// As libc's `ioctl`: `arg` is what `request` takes. On an rpmsg fd the
/// rpmsg requests read (and `RPMSG_CREATE_EPT_FD_IOCTL` writes back) the
/// uAPI struct it points to, through `process_vm_readv`/`writev` so that
/// a bad pointer is `EFAULT` as in the kernel (trusted where a sandbox
/// forbids those calls); any other call is passed on untouched.
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
///
/// # Safety
/// As libc's: nothing is dereferenced; closing an fd another part of the
/// program still uses is the program's own bug, as without the library.
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
///
/// # Safety
/// As libc's: nothing is dereferenced; closing an fd another part of the
/// program still uses is the program's own bug, as without the library.
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
///
/// # Safety
/// As libc's: nothing is dereferenced; closing an fd another part of the
/// program still uses is the program's own bug, as without the library.
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
///
/// # Safety
/// As libc's: nothing is dereferenced; closing an fd another part of the
/// program still uses is the program's own bug, as without the library.
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
///
/// # Safety
/// As libc's: nothing is dereferenced; closing an fd another part of the
/// program still uses is the program's own bug, as without the library.
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
///
/// # Safety
/// As libc's `fcntl`: `arg` is what `cmd` takes, read only as a number
/// here (`F_DUPFD*`) and passed on untouched ([`super`] says why a fixed
/// parameter is sound for the variadic one).
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
///
/// # Safety
/// As libc's `fcntl`: `arg` is what `cmd` takes, read only as a number
/// here (`F_DUPFD*`) and passed on untouched ([`super`] says why a fixed
/// parameter is sound for the variadic one).
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    if fds::any() {
        // SAFETY: the program's own arguments, passed on.
        return unsafe { fcntl_slow(true, fd, cmd, arg) };
    }
    // SAFETY: the program's own arguments, passed on.
    unsafe { real::fcntl64(fd, cmd, arg) }
}
