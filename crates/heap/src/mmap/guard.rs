//! The process-wide SIGBUS handler and its table of guarded mappings.
//!
//! Written by hand: no crate catches SIGBUS for a set of mappings. The
//! handler is installed once, on the first guarded mapping, and runs for
//! every SIGBUS in the process: inside a guarded mapping it repairs the page
//! and returns; anywhere else it puts the previous disposition back, so the
//! access faults again and gets what it would have got without us.
//!
//! A mapping stops being watched before it is unmapped, and an access that
//! can fault needs a live borrow of the owner, so the owner cannot be
//! dropped while the handler repairs one of its pages.

use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

use crate::{Error, Result};

/// Slots per chunk of the table. The first chunk is static; more are
/// allocated as mappings need them (a process with thousands of mapped
/// files), never freed, and linked so the handler can walk them with
/// atomic loads alone.
const CHUNK: usize = 1024;
/// Chunks at most: 65,536 watched mappings, the kernel's default
/// `vm.max_map_count` (a process cannot have more mappings anyway).
const MAX_CHUNKS: usize = 64;
/// `start` of a free slot.
pub(super) const FREE: usize = 0;
/// `start` of a slot being filled in.
const TAKEN: usize = usize::MAX;

#[derive(Debug)]
pub(super) struct Slot {
    pub(super) start: AtomicUsize,
    pub(super) end: AtomicUsize,
    /// A socket to shut down on a fault (our own duplicate), or -1.
    pub(super) conn: AtomicI32,
    pub(super) faulted: AtomicBool,
    /// The lowest page a SIGBUS was caught in ([`NO_FAULT`] before one).
    pub(super) first_fault: AtomicUsize,
}

/// `first_fault` of a slot that caught no SIGBUS.
pub(super) const NO_FAULT: usize = usize::MAX;

/// A free slot.
#[allow(clippy::declare_interior_mutable_const)]
const FREE_SLOT: Slot = Slot {
    start: AtomicUsize::new(FREE),
    end: AtomicUsize::new(0),
    conn: AtomicI32::new(-1),
    faulted: AtomicBool::new(false),
    first_fault: AtomicUsize::new(NO_FAULT),
};

/// A chunk of slots and the next chunk, once one was needed.
pub(super) struct Chunk {
    slots: [Slot; CHUNK],
    next: AtomicPtr<Chunk>,
}

static FIRST: Chunk = Chunk {
    slots: [FREE_SLOT; CHUNK],
    next: AtomicPtr::new(std::ptr::null_mut()),
};
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: Once = Once::new();
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Every chunk, the static one first: atomic loads only, so the handler
/// walks them too.
fn chunks() -> impl Iterator<Item = &'static Chunk> {
    std::iter::successors(Some(&FIRST), |c| {
        let next = c.next.load(Ordering::Acquire);
        // SAFETY: a non-null `next` is a chunk leaked by `grow`, never
        // freed: valid for the rest of the process.
        (!next.is_null()).then(|| unsafe { &*next })
    })
}

/// Links one more chunk after the last (or finds that another thread just
/// did); false once [`MAX_CHUNKS`] exist.
fn grow() -> bool {
    let mut count = 0;
    let mut last = &FIRST;
    for c in chunks() {
        count += 1;
        last = c;
    }
    if count >= MAX_CHUNKS {
        return false;
    }
    let new = Box::into_raw(Box::new(Chunk {
        slots: [FREE_SLOT; CHUNK],
        next: AtomicPtr::new(std::ptr::null_mut()),
    }));
    if last
        .next
        .compare_exchange(
            std::ptr::null_mut(),
            new,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // Another thread linked one first: use it.
        // SAFETY: `new` came from `Box::into_raw` just above and was
        // never shared.
        drop(unsafe { Box::from_raw(new) });
    }
    true
}

/// Closes a slot's socket duplicate (never from the handler).
pub(super) fn close(fd: i32) {
    if fd >= 0 {
        // SAFETY: `fd` is a duplicate this module made and owns; it was
        // just swapped out of its slot, so nothing else closes or uses it.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    }
}

/// Watches `start..start + len`, in a new chunk of slots when every slot
/// is taken. `None` when [`MAX_CHUNKS`] chunks are full or the handler
/// cannot be installed.
pub(super) fn watch(start: usize, len: usize) -> Option<SigbusGuard> {
    if !install() {
        return None;
    }
    let end = start.checked_add(len)?;
    loop {
        for s in chunks().flat_map(|c| c.slots.iter()) {
            if s.start
                .compare_exchange(FREE, TAKEN, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                s.conn.store(-1, Ordering::Release);
                s.faulted.store(false, Ordering::Release);
                s.first_fault.store(NO_FAULT, Ordering::Release);
                s.end.store(end, Ordering::Release);
                s.start.store(start, Ordering::Release);
                return Some(SigbusGuard { slot: s });
            }
        }
        if !grow() {
            return None;
        }
    }
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
        // SAFETY: `new.sa_mask` is a valid sigset to empty; `new` is a
        // fully initialised action and `old` a place for the previous one.
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

/// The SIGBUS handler. Everything it does is async-signal-safe; each
/// step says why. It allocates nothing, takes no lock, and leaves
/// `errno` as it found it.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // `__errno_location` only returns the thread's errno slot; saving
    // and restoring errno is what POSIX asks of a handler that makes
    // system calls.
    // SAFETY: the pointer is this thread's errno, valid for its life.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO
    // handler, and `si_addr` is the faulting address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    // Atomic loads: lock-free on every target Rust supports here, so
    // they cannot deadlock against the interrupted code.
    let page = PAGE.load(Ordering::Relaxed);
    // Walking the chunks is atomic loads of pointers to memory never
    // freed.
    for s in chunks().flat_map(|c| c.slots.iter()) {
        let start = s.start.load(Ordering::Acquire);
        if start == FREE || start == TAKEN || addr < start || addr >= s.end.load(Ordering::Acquire)
        {
            continue;
        }
        let at = addr & !(page - 1);
        // `mmap` is not in POSIX's list of async-signal-safe functions
        // but on Linux it is one system call (glibc's and musl's
        // wrappers keep no state and take no lock), which is what makes
        // a call safe in a handler.
        // SAFETY: `at` is a page inside a mapping this process made and
        // still holds (the slot is cleared before the mapping goes, and
        // the faulting access holds a borrow of its owner); replacing
        // that page with a private anonymous one changes nothing outside
        // it, and the faulting access then completes on zeros.
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
        // Atomic operations: as above (`fetch_min` on a usize is a
        // lock-free compare-and-swap loop).
        s.first_fault.fetch_min(at, Ordering::AcqRel);
        s.faulted.store(true, Ordering::Release);
        let conn = s.conn.load(Ordering::Acquire);
        if conn >= 0 {
            // `shutdown` is in POSIX's list of async-signal-safe
            // functions.
            // SAFETY: `conn` is our own duplicate of the peer's socket,
            // open while the slot is watched (it is closed only after it
            // has been swapped out of the slot).
            unsafe { libc::shutdown(conn, libc::SHUT_RDWR) };
        }
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
        return;
    }
    // Not a guarded mapping: hand the signal to whoever had it before.
    // `OnceLock::get` is one atomic load of a value set before the
    // handler was installed.
    if let Some(prev) = PREVIOUS.get() {
        let h = prev.sa_sigaction;
        if h == libc::SIG_DFL || h == libc::SIG_IGN {
            // Put the default back; the access faults again on return
            // and gets it. `sigaction` is in POSIX's list of
            // async-signal-safe functions.
            // SAFETY: `prev` is the action sigaction returned at install.
            unsafe { libc::sigaction(libc::SIGBUS, prev, std::ptr::null_mut()) };
        } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
            // A previous handler is itself meant to run in signal
            // context, with these very arguments.
            // SAFETY: with SA_SIGINFO, `sa_sigaction` is such a function.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(h) };
            f(sig, info, ctx);
        } else {
            // SAFETY: without SA_SIGINFO, `sa_sigaction` is `sa_handler`.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
            f(sig);
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The SIGBUS guard of one mapping; dropping it stops the watch.
///
/// [`crate::SharedMapping`] and [`crate::Buffer`] make one for their own mappings. For a
/// mapping someone else owns (e.g. a `vm-memory` `MmapRegion`),
/// [`SigbusGuard::watch`] guards it the same way: while the guard lives, a
/// SIGBUS inside the range replaces the faulting page with a private zero
/// page, marks the guard ([`SigbusGuard::peer_truncated`]) and shuts down
/// the socket given to [`SigbusGuard::shutdown_on_fault`].
#[derive(Debug)]
pub struct SigbusGuard {
    slot: &'static Slot,
}

impl SigbusGuard {
    /// Guards the `len` bytes mapped at `start`. `None` when 65,536
    /// mappings are guarded already or the SIGBUS handler cannot be
    /// installed.
    ///
    /// # Safety
    /// `start..start + len` must be a mapping of this process that stays
    /// mapped until the guard is dropped: on a SIGBUS inside it the handler
    /// maps a page over the faulting one (`MAP_FIXED`), which would clobber
    /// whatever reused the addresses if the range had been unmapped.
    pub unsafe fn watch(start: *const u8, len: usize) -> Option<Self> {
        watch(start as usize, len)
    }

    /// Whether a SIGBUS was caught in the range: the file under it shrank.
    pub fn peer_truncated(&self) -> bool {
        self.faulted()
    }

    pub(super) fn faulted(&self) -> bool {
        self.slot.faulted.load(Ordering::Acquire)
    }

    /// The address of the lowest page a SIGBUS was caught in, if any.
    pub(super) fn first_fault(&self) -> Option<usize> {
        let at = self.slot.first_fault.load(Ordering::Acquire);
        (at != NO_FAULT).then_some(at)
    }

    /// On a caught SIGBUS, also shut the socket `sock` down (for both
    /// directions). A duplicate of the descriptor is kept while the guard
    /// lives, so the number cannot be reused meanwhile.
    ///
    /// # Errors
    /// [`Error::Sys`] if the descriptor cannot be duplicated.
    pub fn shutdown_on_fault(&self, sock: BorrowedFd<'_>) -> Result<()> {
        let dup = rustix::io::fcntl_dupfd_cloexec(sock, 0).map_err(|e| Error::sys("dup", e))?;
        let raw = std::os::fd::IntoRawFd::into_raw_fd(dup);
        let old = self.slot.conn.swap(raw, Ordering::AcqRel);
        close(old);
        Ok(())
    }
}

impl Drop for SigbusGuard {
    fn drop(&mut self) {
        let s = self.slot;
        s.end.store(0, Ordering::Release);
        close(s.conn.swap(-1, Ordering::AcqRel));
        s.faulted.store(false, Ordering::Release);
        s.first_fault.store(NO_FAULT, Ordering::Release);
        s.start.store(FREE, Ordering::Release);
    }
}
