//! The bus owner's own sources, served by the bus thread beside
//! the rings, so that a message between such a source (a client's socket)
//! and the rings crosses no thread hand-off.
//!
//! ```text
//!  bus thread: pass over the rings ─► nothing left ─► arm
//!      ─► BusHook::run(timeout): one wait on the hook's fds and the
//!         notifier's ─► serves what the hook's fds report (it may send)
//!      ─► the notifier's fds were ready: Notifier::wait(0) takes the kicks
//! ```

use std::os::fd::BorrowedFd;
use std::time::Duration;

/// What one [`BusHook::run`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HookRun {
    /// The hook found work of its own.
    pub worked: bool,
    /// The notifier's fds are ready: the peer kicked or went away.
    pub kicked: bool,
    /// The hook is finished for good (its owner stopped): the bus detaches
    /// it and waits on the notifier alone from now on.
    pub done: bool,
}

/// Sources of the bus owner's that the bus thread serves too (see
/// [`Bus::set_hook`](super::Bus::set_hook)). It runs on the bus thread,
/// outside the bus lock, so it may send on the bus.
pub trait BusHook: Send {
    /// Takes the notifier's fds into the hook's wait (an epoll set), once,
    /// before the first [`BusHook::run`].
    ///
    /// # Errors
    /// When they cannot be added (the hook is not used then).
    fn attach(&mut self, notifier: &[BorrowedFd<'_>]) -> std::io::Result<()>;

    /// Serves what is ready, waiting up to `timeout` (zero: not at all) for
    /// the hook's sources or the notifier's fds, whichever comes first.
    fn run(&mut self, timeout: Duration) -> HookRun;

    /// Lets go of the notifier's fds (the hook is replaced, finished, or
    /// the bus thread ends): whoever waits on the hook's fds afterwards
    /// must not see the notifier's.
    fn detach(&mut self, notifier: &[BorrowedFd<'_>]);
}
