//! libc's own definitions of the functions this library interposes,
//! looked up with `dlsym(RTLD_NEXT, ...)` ([dlsym(3)]) once, by the
//! library's constructor (or at the first call, if another library's
//! constructor calls one before it ran), and cached.
//!
//! Every call the library makes on the program's behalf goes through
//! these (or through rustix, which makes system calls directly), never
//! through the interposed symbols, so nothing here can recurse into the
//! interposer. The lookup takes no lock: two threads racing on the first
//! call both store the same address.
//!
//! [dlsym(3)]: https://man7.org/linux/man-pages/man3/dlsym.3.html

use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_char, c_int, c_uint, c_ulong, c_void, nfds_t, pollfd, size_t, ssize_t};

/// The address of libc's `name` (NUL-terminated), or 0 if there is none.
fn lookup(name: &'static [u8]) -> usize {
    debug_assert_eq!(name.last(), Some(&0));
    // SAFETY: `name` is a NUL-terminated symbol name; RTLD_NEXT asks for
    // the next definition in load order after this library's: libc's.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) as usize }
}

/// No definition found (a libc without that symbol): `ENOSYS`.
#[cold]
fn missing() -> c_int {
    crate::set_errno(libc::ENOSYS);
    -1
}

/// Declares, for each entry, `pub(crate) unsafe fn NAME(args) -> ret`
/// calling libc's `SYM` through a cached address, and `resolve_all`.
///
/// The hot path of each is a load of its slot and an indirect jump: the
/// first-call lookup is out of line (`NAME::first`), so the caller's
/// registers need no saving around it.
macro_rules! reals {
    ($($(#[$doc:meta])* $name:ident = $sym:literal: fn($($arg:ident: $t:ty),*) -> $ret:ty $(, variadic $v:ident: $vt:ty)?;)*) => {
        $(
            $(#[$doc])*
            ///
            /// # Safety
            /// As the libc function: the arguments must be what it expects.
            #[inline(always)]
            pub(crate) unsafe fn $name($($arg: $t,)* $($v: $vt)?) -> $ret {
                let a = $name::SLOT.load(Ordering::Relaxed);
                if a == 0 {
                    // SAFETY: as the caller promises.
                    return unsafe { $name::first($($arg,)* $($v)?) };
                }
                reals!(@call a, ($($arg: $t),*) -> $ret $(, $v: $vt)?)
            }

            /// The cached address of libc's definition, and its lookup.
            pub(crate) mod $name {
                #[allow(unused_imports)]
                use super::*;

                /// libc's address; 0 until looked up (or if it has none).
                pub(super) static SLOT: AtomicUsize = AtomicUsize::new(0);

                /// Looks the symbol up and caches it.
                pub(super) fn resolve() -> usize {
                    let a = lookup(concat!($sym, "\0").as_bytes());
                    SLOT.store(a, Ordering::Relaxed);
                    a
                }

                /// A call made before the library's constructor ran (from
                /// another library's): looks the symbol up, then calls it.
                ///
                /// # Safety
                /// As the libc function.
                #[cold]
                #[inline(never)]
                pub(super) unsafe extern "C" fn first($($arg: $t,)* $($v: $vt)?) -> $ret {
                    let a = resolve();
                    if a == 0 {
                        return missing() as $ret;
                    }
                    reals!(@call a, ($($arg: $t),*) -> $ret $(, $v: $vt)?)
                }
            }
        )*

        /// Looks every symbol up (the library's constructor), so that no
        /// interposed call pays for a lookup. Two threads racing on a first
        /// call would both store the same address: no lock is needed.
        pub(crate) fn resolve_all() {
            $( $name::resolve(); )*
        }
    };
    (@call $a:ident, ($($arg:ident: $t:ty),*) -> $ret:ty) => {{
        // SAFETY: `$a` is libc's definition of the symbol, whose C type is
        // this one; the caller passes what it expects.
        let f: unsafe extern "C" fn($($t),*) -> $ret = unsafe { std::mem::transmute($a) };
        // SAFETY: the caller passes what the libc function expects.
        unsafe { f($($arg),*) }
    }};
    (@call $a:ident, ($($arg:ident: $t:ty),*) -> $ret:ty, $v:ident: $vt:ty) => {{
        // SAFETY: as above; the function is C-variadic and is called as
        // such, with its one optional argument.
        let f: unsafe extern "C" fn($($t,)* ...) -> $ret = unsafe { std::mem::transmute($a) };
        // SAFETY: the caller passes what the libc function expects.
        unsafe { f($($arg,)* $v) }
    }};
}

reals! {
    /// `open(2)`.
    open = "open": fn(path: *const c_char, flags: c_int) -> c_int, variadic mode: c_uint;
    /// `open64`.
    open64 = "open64": fn(path: *const c_char, flags: c_int) -> c_int, variadic mode: c_uint;
    /// `openat(2)`.
    openat = "openat": fn(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int, variadic mode: c_uint;
    /// `openat64`.
    openat64 = "openat64": fn(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int, variadic mode: c_uint;
    /// `__open_2` (what `_FORTIFY_SOURCE` turns `open` without a mode into).
    open_2 = "__open_2": fn(path: *const c_char, flags: c_int) -> c_int;
    /// `__open64_2`.
    open64_2 = "__open64_2": fn(path: *const c_char, flags: c_int) -> c_int;
    /// `__openat_2`.
    openat_2 = "__openat_2": fn(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    /// `__openat64_2`.
    openat64_2 = "__openat64_2": fn(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    /// `ioctl(2)`.
    ioctl = "ioctl": fn(fd: c_int, request: c_ulong) -> c_int, variadic arg: *mut c_void;
    /// `close(2)`.
    close = "close": fn(fd: c_int) -> c_int;
    /// `close_range(2)`.
    close_range = "close_range": fn(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    /// `read(2)`.
    read = "read": fn(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    /// `write(2)`.
    write = "write": fn(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    /// `readv(2)`.
    readv = "readv": fn(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t;
    /// `writev(2)`.
    writev = "writev": fn(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t;
    /// `sendmsg(2)`.
    sendmsg = "sendmsg": fn(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t;
    /// `send(2)`.
    send = "send": fn(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t;
    /// `recv(2)`.
    recv = "recv": fn(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t;
    /// `dup(2)`.
    dup = "dup": fn(fd: c_int) -> c_int;
    /// `dup2(2)`.
    dup2 = "dup2": fn(old: c_int, new: c_int) -> c_int;
    /// `dup3(2)`.
    dup3 = "dup3": fn(old: c_int, new: c_int, flags: c_int) -> c_int;
    /// `fcntl(2)`.
    fcntl = "fcntl": fn(fd: c_int, cmd: c_int) -> c_int, variadic arg: c_ulong;
    /// `fcntl64` (what glibc's headers call for `fcntl` with 64-bit offsets).
    fcntl64 = "fcntl64": fn(fd: c_int, cmd: c_int) -> c_int, variadic arg: c_ulong;
    /// `__read_chk` (`read` under `_FORTIFY_SOURCE` with a run-time size).
    read_chk = "__read_chk": fn(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t;
    /// `__recv_chk`.
    recv_chk = "__recv_chk": fn(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t;
    /// `__poll_chk`.
    poll_chk = "__poll_chk": fn(fds: *mut pollfd, n: nfds_t, timeout: c_int, fdslen: size_t) -> c_int;
    /// `__ppoll_chk`.
    ppoll_chk = "__ppoll_chk": fn(fds: *mut pollfd, n: nfds_t, ts: *const libc::timespec, mask: *const libc::sigset_t, fdslen: size_t) -> c_int;
    /// `poll(2)`.
    poll = "poll": fn(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int;
    /// `ppoll(2)`.
    ppoll = "ppoll": fn(fds: *mut pollfd, n: nfds_t, ts: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
}
