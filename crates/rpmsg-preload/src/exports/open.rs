//! `open` and its variants: absolute paths under `/dev/rpmsg_ctrl*` and
//! `/dev/rpmsg[0-9]*` open rpmsg fds; any other path goes to libc, with a
//! stale entry for the fd number libc returns dropped. `open` and
//! `openat` take their optional `mode` as a fixed parameter ([`super`]
//! says why that is sound).

use libc::{c_char, c_int, c_uint};

use crate::{ctrl, fds, path, real};

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
        ///
        /// # Safety
        /// As libc's: `path` is null or a NUL-terminated string, a `dirfd` is an
        /// fd or `AT_FDCWD`, and `mode` is read only with `O_CREAT` or `O_TMPFILE`
        /// ([`super`] says why a fixed parameter is sound for the variadic one).
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
