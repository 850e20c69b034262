//! Surviving a front end that truncates the memory it shares.
//!
//! A front end that shares a plain file (tmpfs, hugetlbfs) or a memfd that
//! forbids sealing can shrink it under this back end's mapping; the next
//! access past the new end raises SIGBUS, which would kill the whole back
//! end. While a front end's region is [`watch`]ed, a SIGBUS inside it is
//! caught here: the faulting page is replaced by a private zero page (the
//! access completes, reading zeros and writing nowhere the front end or
//! anyone else sees) and that front end's connection is shut down, so the
//! back end drops it and serves the next one. A SIGBUS anywhere else gets
//! the disposition that was in place before (usually: the process dies, as
//! it would have).
//!
//! Written by hand: no crate catches SIGBUS for a set of mappings.

use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// Regions watched at once (one front end at a time has at most 509).
const SLOTS: usize = 1024;
/// `start` of a free slot.
const FREE: usize = 0;
/// `start` of a slot being filled in.
const TAKEN: usize = usize::MAX;

struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    conn: AtomicI32,
}

static WATCHED: [Slot; SLOTS] = [const {
    Slot {
        start: AtomicUsize::new(FREE),
        end: AtomicUsize::new(0),
        conn: AtomicI32::new(-1),
    }
}; SLOTS];
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: Once = Once::new();
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
static CAUGHT: AtomicBool = AtomicBool::new(false);

/// A watched region; dropping it stops the watch.
#[derive(Debug)]
pub(crate) struct Watch {
    slot: usize,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let s = &WATCHED[self.slot];
        s.end.store(0, Ordering::Release);
        s.conn.store(-1, Ordering::Release);
        s.start.store(FREE, Ordering::Release);
    }
}

/// Watches `len` bytes mapped at `start` for the front end on socket
/// `conn`. `None` when every slot is taken (the region is then mapped
/// unwatched, as before this module) or the handler cannot be installed.
pub(crate) fn watch(start: *const u8, len: usize, conn: RawFd) -> Option<Watch> {
    if !install() {
        return None;
    }
    let start = start as usize;
    let end = start.checked_add(len)?;
    for (i, s) in WATCHED.iter().enumerate() {
        if s.start
            .compare_exchange(FREE, TAKEN, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            s.conn.store(conn, Ordering::Release);
            s.end.store(end, Ordering::Release);
            s.start.store(start, Ordering::Release);
            return Some(Watch { slot: i });
        }
    }
    None
}

/// Whether a front end's SIGBUS was caught since the last call.
pub(crate) fn take_caught() -> bool {
    CAUGHT.swap(false, Ordering::AcqRel)
}

/// Installs the handler once; false if it could not be.
fn install() -> bool {
    INSTALL.call_once(|| {
        PAGE.store(rustix::param::page_size(), Ordering::Relaxed);
        // SAFETY: an all-zero `sigaction` is a valid value to fill in.
        let mut new: libc::sigaction = unsafe { MaybeUninit::zeroed().assume_init() };
        new.sa_sigaction = on_sigbus as *const () as usize;
        // SA_ONSTACK: run on the thread's alternate stack when it has one
        // (std gives every thread one for its stack-overflow handler).
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        let mut old = MaybeUninit::<libc::sigaction>::zeroed();
        // SAFETY: `new.sa_mask` is a valid sigset to empty; `new` is a fully
        // initialised action and `old` a place for the previous one.
        let installed = unsafe {
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(libc::SIGBUS, &new, old.as_mut_ptr())
        } == 0;
        if installed {
            // SAFETY: sigaction succeeded, so it wrote the previous action.
            let _ = PREVIOUS.set(unsafe { old.assume_init() });
        }
    });
    PREVIOUS.get().is_some()
}

/// The SIGBUS handler. Async-signal-safe: atomics, `mmap`, `shutdown` and
/// `sigaction` only.
extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler,
    // and `si_addr` is the faulting address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    let page = PAGE.load(Ordering::Relaxed);
    for s in &WATCHED {
        let start = s.start.load(Ordering::Acquire);
        if start == FREE || start == TAKEN || addr < start || addr >= s.end.load(Ordering::Acquire)
        {
            continue;
        }
        let at = addr & !(page - 1);
        // SAFETY: `at` is a page inside a mapping of the front end's file
        // that this process made and still holds (the slot is cleared
        // before the mapping goes); replacing that page with a private
        // anonymous one changes nothing outside it, and the faulting access
        // then completes on zeros.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            break;
        }
        CAUGHT.store(true, Ordering::Release);
        let conn = s.conn.load(Ordering::Acquire);
        if conn >= 0 {
            // SAFETY: shutting a socket down is async-signal-safe; `conn` is
            // the front end's connection, open while its regions are watched.
            unsafe { libc::shutdown(conn, libc::SHUT_RDWR) };
        }
        return;
    }
    // Not a front end's memory: put the previous disposition back; the
    // access faults again on return and gets it.
    if let Some(prev) = PREVIOUS.get() {
        // SAFETY: `prev` is the action sigaction returned at install.
        unsafe { libc::sigaction(libc::SIGBUS, prev, std::ptr::null_mut()) };
    }
}
