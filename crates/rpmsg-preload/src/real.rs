//! libc's own definitions of the functions this library interposes,
//! looked up once with `dlsym(RTLD_NEXT, ...)` ([dlsym(3)]) and cached.
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

/// The address of libc's `name` (NUL-terminated), cached in `slot`; 0 if
/// there is none.
#[inline(always)]
fn lookup(slot: &AtomicUsize, name: &'static [u8]) -> usize {
    let a = slot.load(Ordering::Relaxed);
    if a != 0 {
        return a;
    }
    debug_assert_eq!(name.last(), Some(&0));
    // SAFETY: `name` is a NUL-terminated symbol name; RTLD_NEXT asks for
    // the next definition in load order after this library's: libc's.
    let a = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
    slot.store(a, Ordering::Relaxed);
    a
}

/// No definition found (a libc without that symbol): `ENOSYS`.
#[cold]
fn missing() -> c_int {
    crate::set_errno(libc::ENOSYS);
    -1
}

/// Declares `pub(crate) unsafe fn NAME(args) -> ret` calling libc's `SYM`.
macro_rules! real {
    ($(#[$doc:meta])* $name:ident = $sym:literal: fn($($arg:ident: $t:ty),*) -> $ret:ty $(, variadic $v:ident: $vt:ty)?) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// As the libc function: the arguments must be what it expects.
        #[inline(always)]
        pub(crate) unsafe fn $name($($arg: $t,)* $($v: $vt)?) -> $ret {
            static SLOT: AtomicUsize = AtomicUsize::new(0);
            let a = lookup(&SLOT, concat!($sym, "\0").as_bytes());
            if a == 0 {
                return missing() as $ret;
            }
            real!(@call a, ($($arg: $t),*) -> $ret $(, $v: $vt)?)
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

real!(/// `open(2)`.
    open = "open": fn(path: *const c_char, flags: c_int) -> c_int, variadic mode: c_uint);
real!(/// `open64`.
    open64 = "open64": fn(path: *const c_char, flags: c_int) -> c_int, variadic mode: c_uint);
real!(/// `openat(2)`.
    openat = "openat": fn(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int, variadic mode: c_uint);
real!(/// `openat64`.
    openat64 = "openat64": fn(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int, variadic mode: c_uint);
real!(/// `__open_2` (what `_FORTIFY_SOURCE` turns `open` without a mode into).
    open_2 = "__open_2": fn(path: *const c_char, flags: c_int) -> c_int);
real!(/// `__open64_2`.
    open64_2 = "__open64_2": fn(path: *const c_char, flags: c_int) -> c_int);
real!(/// `__openat_2`.
    openat_2 = "__openat_2": fn(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int);
real!(/// `__openat64_2`.
    openat64_2 = "__openat64_2": fn(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int);
real!(/// `ioctl(2)`.
    ioctl = "ioctl": fn(fd: c_int, request: c_ulong) -> c_int, variadic arg: *mut c_void);
real!(/// `close(2)`.
    close = "close": fn(fd: c_int) -> c_int);
real!(/// `close_range(2)`.
    close_range = "close_range": fn(first: c_uint, last: c_uint, flags: c_int) -> c_int);
real!(/// `read(2)`.
    read = "read": fn(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t);
real!(/// `write(2)`.
    write = "write": fn(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t);
real!(/// `readv(2)`.
    readv = "readv": fn(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t);
real!(/// `writev(2)`.
    writev = "writev": fn(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t);
real!(/// `sendmsg(2)`.
    sendmsg = "sendmsg": fn(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t);
real!(/// `send(2)`.
    send = "send": fn(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t);
real!(/// `recv(2)`.
    recv = "recv": fn(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t);
real!(/// `dup(2)`.
    dup = "dup": fn(fd: c_int) -> c_int);
real!(/// `dup2(2)`.
    dup2 = "dup2": fn(old: c_int, new: c_int) -> c_int);
real!(/// `dup3(2)`.
    dup3 = "dup3": fn(old: c_int, new: c_int, flags: c_int) -> c_int);
real!(/// `fcntl(2)`.
    fcntl = "fcntl": fn(fd: c_int, cmd: c_int) -> c_int, variadic arg: c_ulong);
real!(/// `fcntl64` (what glibc's headers call for `fcntl` with 64-bit offsets).
    fcntl64 = "fcntl64": fn(fd: c_int, cmd: c_int) -> c_int, variadic arg: c_ulong);
real!(/// `__read_chk` (`read` under `_FORTIFY_SOURCE` with a run-time size).
    read_chk = "__read_chk": fn(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t);
real!(/// `__recv_chk`.
    recv_chk = "__recv_chk": fn(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t);
real!(/// `__poll_chk`.
    poll_chk = "__poll_chk": fn(fds: *mut pollfd, n: nfds_t, timeout: c_int, fdslen: size_t) -> c_int);
real!(/// `__ppoll_chk`.
    ppoll_chk = "__ppoll_chk": fn(fds: *mut pollfd, n: nfds_t, ts: *const libc::timespec, mask: *const libc::sigset_t, fdslen: size_t) -> c_int);
real!(/// `poll(2)`.
    poll = "poll": fn(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int);
real!(/// `ppoll(2)`.
    ppoll = "ppoll": fn(fds: *mut pollfd, n: nfds_t, ts: *const libc::timespec, mask: *const libc::sigset_t) -> c_int);
