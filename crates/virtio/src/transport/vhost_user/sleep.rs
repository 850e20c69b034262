//! How a driver thread sleeps on a queue's call eventfd: on that fd alone,
//! with no timeout, while one thread per connection ([`SleepWatch`])
//! watches for what the sleeper no longer polls itself, and wakes it
//! through the same eventfd:
//!
//! - the back end hanging up (the main socket's `RDHUP`): every call
//!   eventfd is signalled, and sleepers then fail with `Closed`;
//! - a sleeper's deadline passing: its call eventfd is signalled (short
//!   sleeps, under [`WATCHED_FROM`], keep the kernel's timer).
//!
//! A poll of the call eventfd and the socket with a timeout cost the
//! driver about 1.3 us more CPU per sleep than a poll of the eventfd alone
//! (the socket's wait-queue entry and the timer, on every sleep), a
//! twentieth of a 4 KiB round trip with both sides sleeping.
//!
//! The watcher sleeps until the earliest deadline, or until woken. A
//! sleeper stores its deadline, then reads how long the watcher sleeps
//! ([`Shared::until`]) and wakes it only when its own deadline is earlier;
//! the watcher stores "forever" before it looks at the deadlines, so one
//! of the two always sees the other (sequentially consistent both sides).
//! A busy driver refreshes its deadline on every sleep and the watcher
//! wakes about once per timeout.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::error::VhostUserError;

/// No deadline (in [`Shared::deadlines`]) / sleep until woken (in
/// [`Shared::until`]).
const NONE: u64 = 0;
const FOREVER: u64 = u64::MAX;
/// Timeouts from this long are the watcher's; shorter ones (a coalesced
/// wait's) are the kernel's timer, as the watcher would be woken for each.
const WATCHED_FROM: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct Shared {
    origin: Instant,
    /// Per queue: when its sleeper's wait ends, in ns since `origin`.
    deadlines: Vec<AtomicU64>,
    /// When the watcher wakes next, in ns since `origin`.
    until: AtomicU64,
    closed: AtomicBool,
    quit: AtomicBool,
    /// Wakes the watcher (an earlier deadline, or quit).
    wake: EventFd,
    /// The queues' call eventfds (duplicates).
    calls: Vec<EventFd>,
}

impl Shared {
    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(FOREVER - 1)
    }
}

/// The watcher of one connection's sleepers (see the module docs).
#[derive(Debug)]
pub(super) struct SleepWatch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl SleepWatch {
    /// Watches `sock` (a handle on the main socket) for the sleepers on
    /// `calls`.
    pub(super) fn spawn(sock: UnixStream, calls: &[&EventFd]) -> Result<Self, VhostUserError> {
        let io = |op| move |source| VhostUserError::Io { op, source };
        let shared = Arc::new(Shared {
            origin: Instant::now(),
            deadlines: calls.iter().map(|_| AtomicU64::new(NONE)).collect(),
            until: AtomicU64::new(FOREVER),
            closed: AtomicBool::new(false),
            quit: AtomicBool::new(false),
            wake: EventFd::new(EFD_NONBLOCK).map_err(io("eventfd (sleep watch)"))?,
            calls: calls
                .iter()
                .map(|c| c.try_clone())
                .collect::<std::io::Result<_>>()
                .map_err(io("dup of a call eventfd"))?,
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("vhost-user-sleep".into())
            .spawn(move || watch(&s, &sock))
            .map_err(io("spawn of the sleep watch"))?;
        Ok(SleepWatch {
            shared,
            thread: Some(thread),
        })
    }

    /// Sleeps on `call` (queue `index`'s call eventfd) until it is
    /// signalled (by the back end, or by the watcher at `timeout` or at a
    /// hang-up). Returns whether an interrupt came before the timeout; it
    /// is consumed when `consume` says so, else left for the caller to take
    /// (a stale signal then ends the sleep at once).
    ///
    /// # Errors
    /// [`crate::Error::Closed`] when the back end hung up and no interrupt
    /// is pending; a failed poll.
    pub(super) fn sleep(
        &self,
        index: usize,
        call: &EventFd,
        timeout: Option<Duration>,
        consume: bool,
    ) -> crate::Result<bool> {
        let s = &*self.shared;
        if s.closed.load(SeqCst) {
            return Err(crate::Error::Closed);
        }
        if timeout.is_some_and(|t| t.is_zero()) {
            return Ok(call.read().is_ok());
        }
        let take = |call: &EventFd| !consume || call.read().is_ok();
        // No read before the poll: a caller sleeps only after finding the
        // ring empty with interrupts enabled, so the count is almost always
        // zero here, and a stale one makes the poll return at once.
        if let Some(t) = timeout.filter(|t| *t < WATCHED_FROM) {
            return Ok(sleep_for(call, t)? && take(call));
        }
        let deadline = timeout.map(|t| {
            let t = u64::try_from(t.as_nanos()).unwrap_or(FOREVER);
            s.now().saturating_add(t).min(FOREVER - 1)
        });
        let slot = &s.deadlines[index];
        if let Some(d) = deadline {
            slot.store(d, SeqCst);
            if s.until.load(SeqCst) > d {
                let _ = s.wake.write(1);
            }
        }
        let got = loop {
            if let Err(e) = poll_call(call, None) {
                slot.store(NONE, SeqCst);
                return Err(e);
            }
            if take(call) {
                break true;
            }
            // Readable, but taken first (a stale wake-up): look again
            // unless the wait is over.
            if s.closed.load(SeqCst) || deadline.is_some_and(|d| s.now() >= d) {
                break false;
            }
        };
        slot.store(NONE, SeqCst);
        let in_time = deadline.is_none_or(|d| s.now() < d);
        match (got && in_time, s.closed.load(SeqCst)) {
            (true, _) => Ok(true),
            (false, true) => Err(crate::Error::Closed),
            (false, false) => Ok(false),
        }
    }
}

/// A short sleep on `call` with the kernel's timer (the watcher would be
/// woken for each one): whether it was signalled in time.
fn sleep_for(call: &EventFd, t: Duration) -> crate::Result<bool> {
    let ts = Timespec {
        tv_sec: 0,
        tv_nsec: i64::from(t.subsec_nanos()),
    };
    poll_call(call, Some(&ts))
}

/// Polls `call` alone until it is readable (`true`) or `timeout` passes
/// (`false`; `None`: no limit), through interruptions.
fn poll_call(call: &EventFd, timeout: Option<&Timespec>) -> crate::Result<bool> {
    // SAFETY: the eventfd is borrowed from the caller for this call.
    let fd = unsafe { BorrowedFd::borrow_raw(call.as_raw_fd()) };
    let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    loop {
        match poll(&mut fds, timeout) {
            Ok(n) => return Ok(n > 0),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                return Err(VhostUserError::Io {
                    op: "poll (call eventfd)",
                    source: e.into(),
                }
                .into())
            }
        }
    }
}

/// Marks the connection closed and wakes every sleeper.
fn hang_up(s: &Shared) {
    s.closed.store(true, SeqCst);
    for call in &s.calls {
        let _ = call.write(1);
    }
}

impl Drop for SleepWatch {
    fn drop(&mut self) {
        self.shared.quit.store(true, SeqCst);
        let _ = self.shared.wake.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The watcher's loop: wakes sleepers whose deadline passed, sleeps until
/// the earliest one left, and wakes every sleeper when `sock` hangs up.
fn watch(s: &Shared, sock: &UnixStream) {
    // SAFETY: the eventfd is owned by `s`, which outlives this function.
    let wake = unsafe { BorrowedFd::borrow_raw(s.wake.as_raw_fd()) };
    loop {
        if s.quit.load(SeqCst) {
            return;
        }
        s.until.store(FOREVER, SeqCst);
        let now = s.now();
        let mut next = FOREVER;
        for (d, call) in s.deadlines.iter().zip(&s.calls) {
            let v = d.load(SeqCst);
            if v == NONE {
                continue;
            }
            if v <= now {
                // Once per deadline: the sleeper stores a new one.
                if d.compare_exchange(v, NONE, SeqCst, SeqCst).is_ok() {
                    let _ = call.write(1);
                }
            } else {
                next = next.min(v);
            }
        }
        s.until.store(next, SeqCst);
        let timeout = (next != FOREVER).then(|| {
            let ns = next.saturating_sub(now);
            Timespec {
                tv_sec: (ns / 1_000_000_000) as i64,
                tv_nsec: (ns % 1_000_000_000) as i64,
            }
        });
        let mut fds = [
            // RDHUP only: replies to the control path make the socket
            // readable, but only a closed peer hangs it up.
            PollFd::new(sock, PollFlags::RDHUP),
            PollFd::from_borrowed_fd(wake, PollFlags::IN),
        ];
        match poll(&mut fds, timeout.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                // Sleepers would no longer be woken at their deadline:
                // fail them rather than let them hang.
                tracing::error!("vhost-user sleep watch: poll failed: {e}");
                hang_up(s);
                return;
            }
        }
        if !fds[0].revents().is_empty() {
            hang_up(s);
            return;
        }
        if !fds[1].revents().is_empty() {
            let _ = s.wake.read();
        }
    }
}
