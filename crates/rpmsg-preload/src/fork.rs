//! fork(2) and the library's locks. A child starts with one thread and a
//! copy of the parent's memory, locks included: a lock some other thread
//! of the parent held at that moment would stay held in the child, and its
//! first `close` of an rpmsg fd (which takes the fd table's lock) would
//! hang. glibc runs `pthread_atfork` handlers around every `fork` (not
//! `vfork` or `posix_spawn`, whose children only exec); the library's run
//! the [`Handlers`] each module with locks registers, which take every
//! lock it has before the fork and release them after, in the parent and
//! in the child ([pthread_atfork(3)]).
//!
//! Each lock they take is held only briefly, never while another lock or
//! the service is waited for, so taking them all cannot deadlock. The one
//! lock that is held across a request to the service (a control fd's
//! `ctrl_lock`) is not taken: a child whose fork found one held gets a
//! fresh control state for that fd instead (the fd table's child handler).
//!
//! This module knows none of the modules whose handlers it runs: they
//! register with it, so it imports none of them.
//!
//! [pthread_atfork(3)]: https://man7.org/linux/man-pages/man3/pthread_atfork.3.html

use std::cell::UnsafeCell;
use std::sync::OnceLock;

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

/// One module's fork handlers.
#[derive(Debug)]
pub(crate) struct Handlers {
    /// Before fork: takes the module's locks and keeps their guards (in a
    /// [`Held`]).
    pub(crate) prepare: fn(),
    /// After fork, in the parent: releases them.
    pub(crate) parent: fn(),
    /// After fork, in the child (its only thread): fixes up what a lock
    /// held by a thread of the parent left, and releases them.
    pub(crate) child: fn(),
}

/// The registered handlers, in lock order. Read by the fork handlers
/// with one atomic load (set once, before any fork).
static REGISTERED: OnceLock<&'static [&'static Handlers]> = OnceLock::new();

fn registered() -> &'static [&'static Handlers] {
    REGISTERED.get().copied().unwrap_or_default()
}

/// Which handler of each module runs.
#[derive(Debug, Clone, Copy)]
enum Stage {
    Prepare,
    Parent,
    Child,
}

/// Runs one stage of `list`'s handlers: `prepare` in lock order, `parent`
/// and `child` in the reverse order.
fn run(list: &[&Handlers], stage: Stage) {
    match stage {
        Stage::Prepare => list.iter().for_each(|h| (h.prepare)()),
        Stage::Parent => list.iter().rev().for_each(|h| (h.parent)()),
        Stage::Child => list.iter().rev().for_each(|h| (h.child)()),
    }
}

extern "C" fn prepare() {
    run(registered(), Stage::Prepare);
}

extern "C" fn parent() {
    run(registered(), Stage::Parent);
}

extern "C" fn child() {
    run(registered(), Stage::Child);
}

/// Registers the modules' handlers with `pthread_atfork` (once, from the
/// library's constructor; later calls do nothing). Before a fork every
/// `prepare` runs in the order given, which is the order their locks are
/// taken in; after it every `parent` or `child` runs in the reverse order.
pub(crate) fn register(handlers: &'static [&'static Handlers]) {
    if REGISTERED.set(handlers).is_err() {
        return;
    }
    // SAFETY: three functions with the C signature pthread_atfork wants,
    // which stay loaded as long as the process (a preload is never
    // unloaded).
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    static RAN: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

    fn note(what: &'static str) {
        RAN.lock().unwrap().push(what);
    }

    const A: Handlers = Handlers {
        prepare: || note("a.prepare"),
        parent: || note("a.parent"),
        child: || note("a.child"),
    };
    const B: Handlers = Handlers {
        prepare: || note("b.prepare"),
        parent: || note("b.parent"),
        child: || note("b.child"),
    };

    #[test]
    fn locks_are_taken_in_order_and_released_in_reverse() {
        let list: &[&Handlers] = &[&A, &B];
        run(list, Stage::Prepare);
        run(list, Stage::Parent);
        run(list, Stage::Prepare);
        run(list, Stage::Child);
        assert_eq!(
            *RAN.lock().unwrap(),
            [
                "a.prepare",
                "b.prepare",
                "b.parent",
                "a.parent",
                "a.prepare",
                "b.prepare",
                "b.child",
                "a.child"
            ]
        );
    }

    #[test]
    fn held_keeps_a_guard_until_taken() {
        let lock = Mutex::new(());
        let held = Held::new();
        // SAFETY: this test is the only user of `held`.
        unsafe { held.hold(lock.lock().unwrap()) };
        assert!(lock.try_lock().is_err());
        // SAFETY: as above.
        drop(unsafe { held.take() });
        assert!(lock.try_lock().is_ok());
        // SAFETY: as above.
        assert!(unsafe { held.take() }.is_none());
    }
}
