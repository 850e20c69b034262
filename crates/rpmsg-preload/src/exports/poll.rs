//! `poll`, `ppoll` and the fortified `__poll_chk` and `__ppoll_chk`: the
//! kernel's answer, with `POLLERR` added for endpoints that are gone.

use libc::{c_int, nfds_t, pollfd, size_t};

use crate::{ept, fds, real};

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
///
/// # Safety
/// As libc's: `fds_` points to `n` `pollfd`s the call may write (null
/// only with `n` 0), `ts` and `mask` are null or valid, and a fortified
/// variant's `fdslen` is the array's size; the entries of rpmsg fds are
/// read and written after the kernel's poll has written them.
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
///
/// # Safety
/// As libc's: `fds_` points to `n` `pollfd`s the call may write (null
/// only with `n` 0), `ts` and `mask` are null or valid, and a fortified
/// variant's `fdslen` is the array's size; the entries of rpmsg fds are
/// read and written after the kernel's poll has written them.
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
// The fortified variants: a size over the array goes to libc's own check
// (which aborts the program, as without the preload).

/// Interposed; see the module doc.
///
/// # Safety
/// As libc's: `fds_` points to `n` `pollfd`s the call may write (null
/// only with `n` 0), `ts` and `mask` are null or valid, and a fortified
/// variant's `fdslen` is the array's size; the entries of rpmsg fds are
/// read and written after the kernel's poll has written them.
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
///
/// # Safety
/// As libc's: `fds_` points to `n` `pollfd`s the call may write (null
/// only with `n` 0), `ts` and `mask` are null or valid, and a fortified
/// variant's `fdslen` is the array's size; the entries of rpmsg fds are
/// read and written after the kernel's poll has written them.
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
