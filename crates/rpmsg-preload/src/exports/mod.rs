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
//!
//! By what the calls act on: paths ([`open`]), fd numbers ([`fd`]:
//! `ioctl`, `close`, `dup`, `fcntl`), data ([`io`]: reads and writes) and
//! readiness ([`poll`]).

mod fd;
mod io;
mod open;
mod poll;

use crate::fork::Handlers;
use crate::{ctrl, fds, real};

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
