//! iopath-rpmsg-preload: an `LD_PRELOAD` library that gives unmodified
//! programs Linux's rpmsg_ctrl / rpmsg_char uAPI on iopath's endpoint
//! service (`iopath rpmsg host --ctrl PATH`), so that tools written for
//! `/dev/rpmsg_ctrlN` and `/dev/rpmsgN` run where the kernel has no rpmsg.
//!
//! ```text
//!  program ── open("/dev/rpmsg_ctrl0") ──► connection to IOPATH_RPMSG_CTRL
//!          ── ioctl(CREATE_EPT) ─────────► CREATE_EPT   (node RUNDIR/rpmsgN)
//!          ── open("/dev/rpmsgN") ───────► the node: connect + greeting
//!          ── ioctl(CREATE_EPT_FD) ──────► CREATE_EPT_FD (fd over SCM_RIGHTS)
//!          ── read/write/poll/ioctl ─────► rpmsg_char's errnos over the socket
//!  every other path and fd ─────────────► libc (a prefix compare, an atomic load)
//! ```
//!
//! Configured by `IOPATH_RPMSG_CTRL=<control socket>` (and
//! `IOPATH_RPMSG_RUNDIR` if the service puts its nodes elsewhere than the
//! socket path with `.d`). Without it every call goes to libc unchanged;
//! with the service down, `open("/dev/rpmsg_ctrl0")` fails with `ENOENT`
//! as on a machine without rpmsg. `iopath rpmsg exec` sets it up.
//!
//! Interposed: `open`, `open64`, `openat`, `openat64` and the fortified
//! `__open_2`, `__open64_2`, `__openat_2`, `__openat64_2` (absolute paths
//! under `/dev/rpmsg_ctrl*` and `/dev/rpmsg[0-9]*` only); `ioctl`,
//! `close`, `close_range`, `dup`, `dup2`, `dup3`, `fcntl`/`fcntl64`
//! (`F_DUPFD*`); and for endpoint fds `read`, `write`, `readv`, `writev`,
//! `send`, `recv`,
//! `poll`, `ppoll` and the fortified `__read_chk`, `__recv_chk`,
//! `__poll_chk`, `__ppoll_chk`.
//! What this does not cover, and how it differs from the kernel, is in the
//! README ("rpmsg for unmodified programs").
//!
//! In a process with no rpmsg fd open, an interposed call on any fd costs
//! one relaxed atomic load and a jump to libc's definition, looked up once
//! by the library's constructor (`real`); with some open, a load of the
//! fd's bit too (`fds`). The hot paths take no lock, touch no
//! thread-local and allocate nothing. Calls made for the program go to
//! libc's definitions through `real` or to the kernel through rustix,
//! never back into the interposer. fork(2) is safe at any moment: the
//! library's locks are taken around it (`fork`).
//!
//! Modules, each importing only those below it: `exports` (the symbols);
//! `ctrl` (opening the devices, control fds) and `ept` (endpoint fds);
//! `fds` (which fds are rpmsg fds); `fork` (the handlers the others
//! register); `uapi` (ioctl numbers, user copies), `path`, `real`.

// Test builds leave the exports out (they would interpose in the test
// binary itself), and with them the only callers of much of the rest.
#![cfg_attr(test, allow(dead_code))]

// The exports take variadic arguments (`open`'s `mode`, `ioctl`'s and
// `fcntl`'s `arg`) as fixed parameters: sound only where a variadic caller
// passes them as a fixed one, which `exports` relies on.
#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
compile_error!(
    "iopath-rpmsg-preload builds for x86_64 and aarch64 Linux only: its \
     exports take C's variadic arguments as fixed parameters, known sound \
     on those ABIs alone (src/exports/mod.rs)"
);

mod ctrl;
mod ept;
mod fds;
mod fork;
mod path;
mod real;
mod uapi;

#[cfg(not(test))]
mod exports;

use libc::c_int;

/// The calling thread's `errno`.
pub(crate) fn errno() -> c_int {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}
