//! Reads and writes: `read`, `recv`, `write`, `send`, `readv`, `writev`
//! and the fortified `__read_chk` and `__recv_chk`, served by the endpoint
//! on endpoint fds and answered `EINVAL` on control fds (rpmsg_ctrl has
//! neither read nor write).

use libc::{c_int, c_void, size_t, ssize_t};

use crate::fds::{self, Ept, Kind};
use crate::{ept, real};

/// What an rpmsg fd answers to a read or a write: `on_ept` on an endpoint
/// fd; `EINVAL` on a control fd, as vfs_read/vfs_write answer for
/// rpmsg_ctrl, which has neither. `None` for an fd that is not ours.
#[cold]
fn served(fd: c_int, on_ept: impl FnOnce(&Ept) -> ssize_t) -> Option<ssize_t> {
    match fds::get(fd)? {
        Kind::Ept(e) => Some(on_ept(&e)),
        Kind::Ctrl(_) => {
            crate::set_errno(libc::EINVAL);
            Some(-1)
        }
    }
}

/// Defines the interposed `$name`: a call on an fd of ours goes out of line
/// to `$slow`, which answers with `$ours` (an `Option`; `None` when the fd
/// turned out not to be ours); every other call goes straight to libc's,
/// keeping the common path small. `$guard` is an extra condition for the
/// rpmsg path (the fortified variants leave a size over the buffer to
/// libc's own check, which aborts the program as without the preload).
macro_rules! interpose {
    ($(#[$doc:meta])* $name:ident => $slow:ident / $real:ident
     ($fd:ident: c_int $(, $arg:ident: $ty:ty)*) if $guard:expr => $ours:expr) => {
        $(#[$doc])*
        #[cold]
        #[inline(never)]
        unsafe extern "C" fn $slow($fd: c_int $(, $arg: $ty)*) -> ssize_t {
            if let Some(r) = $ours {
                return r;
            }
            // SAFETY: the program's own arguments, passed on.
            unsafe { real::$real($fd $(, $arg)*) }
        }

        /// Interposed; see the module doc.
        ///
        /// # Safety
        /// As libc's: `buf` is valid for `n` bytes (`iov` for `n` iovecs, each
        /// valid for its length), writable for a read, readable for a write, and
        /// a fortified variant's `buflen` is `buf`'s size. An rpmsg fd's message
        /// is copied in or out within those bounds only.
        #[no_mangle]
        pub unsafe extern "C" fn $name($fd: c_int $(, $arg: $ty)*) -> ssize_t {
            if $guard && fds::is_ours($fd) {
                // SAFETY: the program's own arguments, passed on.
                return unsafe { $slow($fd $(, $arg)*) };
            }
            // SAFETY: the program's own arguments, passed on.
            unsafe { real::$real($fd $(, $arg)*) }
        }
    };
}

interpose! {
    /// `read` of an rpmsg fd.
    read => read_slow / read (fd: c_int, buf: *mut c_void, n: size_t) if true
        => served(fd, |e| {
            // SAFETY: the program's buffer, as it passed it to the call it made.
            unsafe { ept::read(fd, e, buf, n, 0) }
        })
}
interpose! {
    /// `recv` of an rpmsg fd.
    recv => recv_slow / recv (fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) if true
        => served(fd, |e| {
            // SAFETY: the program's buffer, as it passed it to the call it made.
            unsafe { ept::read(fd, e, buf, n, flags) }
        })
}
interpose! {
    /// `write` to an rpmsg fd.
    write => write_slow / write (fd: c_int, buf: *const c_void, n: size_t) if true
        => served(fd, |e| {
            // SAFETY: the program's buffer, as it passed it to the call it made.
            unsafe { ept::write(fd, e, buf, n, 0) }
        })
}
interpose! {
    /// `send` to an rpmsg fd.
    send => send_slow / send (fd: c_int, buf: *const c_void, n: size_t, flags: c_int) if true
        => served(fd, |e| {
            // SAFETY: the program's buffer, as it passed it to the call it made.
            unsafe { ept::write(fd, e, buf, n, flags) }
        })
}
interpose! {
    /// `readv` of an rpmsg fd.
    readv => readv_slow / readv (fd: c_int, iov: *const libc::iovec, n: c_int) if true
        => served(fd, |e| {
            // SAFETY: the program's iovecs, as it passed them to the call it made.
            unsafe { ept::readv(fd, e, iov, n) }
        })
}
interpose! {
    /// `writev` to an rpmsg fd.
    writev => writev_slow / writev (fd: c_int, iov: *const libc::iovec, n: c_int) if true
        => served(fd, |e| {
            // SAFETY: the program's iovecs, as it passed them to the call it made.
            unsafe { ept::writev(fd, e, iov, n) }
        })
}

// The fortified variants glibc calls under _FORTIFY_SOURCE when a size is
// known only at run time.
interpose! {
    /// `__read_chk` of an rpmsg fd.
    __read_chk => read_chk_slow / read_chk
        (fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) if n <= buflen
        => served(fd, |e| {
            // SAFETY: the program's buffer, as it passed it to the call it made.
            unsafe { ept::read(fd, e, buf, n, 0) }
        })
}
interpose! {
    /// `__recv_chk` of an rpmsg fd.
    __recv_chk => recv_chk_slow / recv_chk
        (fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) if n <= buflen
        => served(fd, |e| {
            // SAFETY: the program's buffer, as it passed it to the call it made.
            unsafe { ept::read(fd, e, buf, n, flags) }
        })
}
