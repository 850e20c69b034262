//! fork(2) and the library's locks. A child starts with one thread and a
//! copy of the parent's memory, locks included: a lock some other thread
//! of the parent held at that moment would stay held in the child, and its
//! first `close` of an rpmsg fd (which takes the fd table's lock) would
//! hang. glibc runs `pthread_atfork` handlers around every `fork` (not
//! `vfork` or `posix_spawn`, whose children only exec); these take every
//! lock the library has before the fork and release them after, in the
//! parent and in the child ([pthread_atfork(3)]).
//!
//! Each lock they take is held only briefly, never while another lock or
//! the service is waited for, so taking them all cannot deadlock. The one
//! lock that is held across a request to the service (a control fd's
//! `ctrl_lock`) is not taken: a child whose fork found one held gets a
//! fresh control state for that fd instead ([`crate::fds::fork::child`]).
//!
//! [pthread_atfork(3)]: https://man7.org/linux/man-pages/man3/pthread_atfork.3.html

use std::cell::UnsafeCell;

/// Guards held from the prepare handler to the parent or child handler.
pub(crate) struct Held<G>(UnsafeCell<Option<G>>);

// SAFETY: only the fork handlers touch a `Held`, and glibc runs them one
// fork at a time (it holds its atfork lock from the prepare handlers to the
// parent or child handlers), all on the forking thread, which is also the
// child's one thread: a guard is taken and released on one thread.
unsafe impl<G> Sync for Held<G> {}

impl<G> Held<G> {
    /// Nothing held.
    pub(crate) const fn new() -> Self {
        Held(UnsafeCell::new(None))
    }

    /// Keeps `g` until [`Held::take`].
    ///
    /// # Safety
    /// Called only from a prepare handler (see the `Sync` impl).
    pub(crate) unsafe fn hold(&self, g: G) {
        // SAFETY: no other access at the same time, as the caller promises.
        unsafe { *self.0.get() = Some(g) };
    }

    /// What the prepare handler kept.
    ///
    /// # Safety
    /// Called only from a parent or child handler (see the `Sync` impl).
    pub(crate) unsafe fn take(&self) -> Option<G> {
        // SAFETY: as in `hold`.
        unsafe { (*self.0.get()).take() }
    }
}

extern "C" fn prepare() {
    crate::ops::fork::prepare();
    crate::fds::fork::prepare();
}

extern "C" fn parent() {
    crate::fds::fork::parent();
    crate::ops::fork::parent();
}

extern "C" fn child() {
    crate::fds::fork::child();
    crate::ops::fork::child();
}

/// Registers the handlers (once, from the library's constructor).
pub(crate) fn register() {
    // SAFETY: three functions with the C signature pthread_atfork wants,
    // which stay loaded as long as the process (a preload is never
    // unloaded).
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}
