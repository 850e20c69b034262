//! Adaptive polling: after work, look at the ring again for up to a window
//! before re-enabling notifications and sleeping on them, or never sleep.
//!
//! One mechanism for every side of a queue that waits: the blk driver's
//! queue (for used entries), `blk serve`'s queue threads (for available
//! entries and their own I/O) and the rpmsg bus (for its peer's answer).
//! A wait ([`Poller::wait`]) goes
//!
//! ```text
//!  ready? ──yes──► done
//!    │ no
//!  suppress notifications ─► ready? ... (spin, yield the CPU now and then)
//!    │ window over, or the peer holds this CPU
//!  re-enable notifications ─► ready? ──yes──► done   (the re-check)
//!    │ no
//!  sleep on the notification ─► ready? ...
//! ```
//!
//! The re-check after re-enabling is what keeps a notification from being
//! lost: the peer publishes its index and then reads the suppression
//! field; the waiter writes the suppression field and then reads the
//! index, each with a full barrier between (virtio 1.x §2.7.10,
//! §2.7.13.4). Whichever goes second sees the other's write, so either the
//! peer notifies or the re-check finds the entry.
//!
//! A poller must not starve a peer that runs on its CPU: every
//! [`Poller::SLICE`] of spinning it yields. A yield that comes back only
//! after a whole time slice means something on this CPU spun without
//! yielding (a peer that busy-waits); several of those close together turn
//! polling off for a while ([`HogGuard`]), and the waiter sleeps on
//! notifications instead.
//!
//! A poller told its peer's process ([`Poller::set_peer`]) also looks
//! where that peer may run. When both may run only on one and the same
//! CPU, spinning cannot bring the answer closer: the peer needs that very
//! CPU. The poller then only hands it over (a yield on every empty look),
//! and when a yield ran nothing else, the peer is not runnable and the
//! waiter re-enables notifications and sleeps at once. When the peer may
//! not run on any CPU this thread may, no yield can help it either: the
//! poller spins without yielding (the scheduler still preempts it for
//! other tasks), unless helpers of its own may need the CPU
//! ([`Polled::helpers_busy`]: a back end's io_uring workers).

use std::fmt;
use std::time::{Duration, Instant};

/// Most microseconds a poll window may last (`--poll-us`).
pub const MAX_WINDOW_US: u64 = 100_000;

/// The window used when none is given, in microseconds: long enough to
/// cover one 4 KiB round trip through a back end on another CPU (10 to
/// 30 us measured here), short enough that an idle queue stops spinning
/// at once as seen by a person.
pub const DEFAULT_WINDOW_US: u64 = 50;

/// How a waiter waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PollMode {
    /// Poll up to this long after work, then sleep on notifications
    /// (zero: sleep at once).
    Window(Duration),
    /// Poll and never sleep (a CPU given to the queue); except that a
    /// poller whose peer may run only on its own one CPU hands that CPU
    /// over and sleeps when nothing else runs (see [`Poller::set_peer`]).
    Busy,
}

impl Default for PollMode {
    fn default() -> Self {
        PollMode::Window(Duration::from_micros(DEFAULT_WINDOW_US))
    }
}

/// A poll window out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Poll window of {us} us is out of range (0 to {max} us)")]
pub struct WindowError {
    /// The window given.
    pub us: u64,
    /// The largest accepted.
    pub max: u64,
}

impl PollMode {
    /// Sleep at once: no polling.
    pub const SLEEP: PollMode = PollMode::Window(Duration::ZERO);

    /// A window of `us` microseconds (0: sleep at once).
    ///
    /// # Errors
    /// [`WindowError`] above [`MAX_WINDOW_US`].
    pub fn from_us(us: u64) -> Result<PollMode, WindowError> {
        if us > MAX_WINDOW_US {
            return Err(WindowError {
                us,
                max: MAX_WINDOW_US,
            });
        }
        Ok(PollMode::Window(Duration::from_micros(us)))
    }

    /// Whether a wait polls at all.
    pub fn polls(self) -> bool {
        self != PollMode::SLEEP
    }

    /// A short name for tables: `sleep`, `poll 50us`, `busy`.
    pub fn label(self) -> String {
        match self {
            PollMode::Busy => "busy".into(),
            PollMode::Window(w) if w.is_zero() => "sleep".into(),
            PollMode::Window(w) => format!("poll {}us", w.as_micros()),
        }
    }
}

impl fmt::Display for PollMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PollMode::Busy => f.write_str("poll, never sleep"),
            PollMode::Window(w) if w.is_zero() => f.write_str("sleep at once"),
            PollMode::Window(w) => write!(f, "poll {} us, then sleep", w.as_micros()),
        }
    }
}

/// What a waiter polls: one queue (or several sources) of a driver or a
/// device, with its notification suppression.
pub trait Polled {
    /// What looking at the ring can fail with.
    type Error;

    /// Looks once, without blocking, for whatever ends the wait (entries
    /// on the ring, a stop request, other work of the waiter's).
    ///
    /// # Errors
    /// The ring cannot be read.
    fn ready(&mut self) -> Result<bool, Self::Error>;

    /// Asks the peer not to notify (the waiter is polling).
    ///
    /// # Errors
    /// The suppression field cannot be written.
    fn suppress(&mut self) -> Result<(), Self::Error>;

    /// Asks the peer to notify again, then (after a full barrier) looks
    /// again as [`Polled::ready`] does: `true` when something came
    /// meanwhile, and the waiter must not sleep.
    ///
    /// # Errors
    /// The ring cannot be read or written.
    fn rearm(&mut self) -> Result<bool, Self::Error>;

    /// Whether work of the waiter's own is under way on other threads
    /// that may need this CPU (a back end's io_uring workers): then a
    /// poller yields now and then even when its peer runs elsewhere.
    fn helpers_busy(&self) -> bool {
        false
    }

    /// Sleeps until notified or until `timeout` (`None`: no limit) has
    /// passed. Whatever it returns, the waiter looks with
    /// [`Polled::ready`] next.
    ///
    /// # Errors
    /// The notification channel failed.
    fn sleep(&mut self, timeout: Option<Duration>) -> Result<(), Self::Error>;
}

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// [`Polled::ready`] (or [`Polled::rearm`]) found something.
    Ready,
    /// The timeout passed with nothing found.
    TimedOut,
}

/// The guard against a peer that spins on this CPU without giving it up:
/// a poller's yield then returns only when the peer's time slice ends
/// (milliseconds), and every round trip costs a slice. Yields that long,
/// several within a short time, turn polling off for a while, doubling each
/// time it is tried again and still fails. A single long yield is noise
/// (1 to 2 ms ones come now and then) and changes nothing.
#[derive(Debug, Clone)]
pub struct HogGuard {
    off_until: Option<Instant>,
    backoff: Duration,
    /// Hogged yields since `hogs_since`.
    hogs: u32,
    hogs_since: Instant,
}

impl Default for HogGuard {
    fn default() -> Self {
        HogGuard {
            off_until: None,
            backoff: Self::FIRST_BACKOFF,
            hogs: 0,
            hogs_since: Instant::now(),
        }
    }
}

impl HogGuard {
    /// A yield longer than this: something else held the CPU throughout.
    pub const HOGGED: Duration = Duration::from_millis(2);
    /// Hogged yields within [`HogGuard::HOG_SPAN`] that turn polling off.
    pub const HOGS: u32 = 3;
    /// See [`HogGuard::HOGS`].
    pub const HOG_SPAN: Duration = Duration::from_millis(100);
    /// How long polling stays off the first time.
    pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
    /// The longest it stays off.
    pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

    /// Whether polling is allowed at `now`.
    pub fn on(&mut self, now: Instant) -> bool {
        match self.off_until {
            Some(t) if now < t => false,
            Some(_) => {
                self.off_until = None;
                true
            }
            None => true,
        }
    }

    /// A yield took `took`, ending at `now`. Returns whether polling goes
    /// on.
    pub fn yielded(&mut self, took: Duration, now: Instant) -> bool {
        if took <= Self::HOGGED {
            return true;
        }
        if now.saturating_duration_since(self.hogs_since) > Self::HOG_SPAN {
            self.hogs = 0;
            self.hogs_since = now;
        }
        self.hogs += 1;
        if self.hogs < Self::HOGS {
            return true;
        }
        self.hogs = 0;
        self.off_until = Some(now + self.backoff);
        self.backoff = (self.backoff * 2).min(Self::MAX_BACKOFF);
        false
    }

    /// How long polling stays off the next time it is turned off.
    pub fn backoff(&self) -> Duration {
        self.backoff
    }
}

/// Where the peer process may run, checked against this thread now and
/// then ([`PeerCpu::RECHECK`]): affinities change (`taskset -p`).
#[derive(Debug, Clone)]
struct PeerCpu {
    pid: rustix::process::Pid,
    checked: Option<Instant>,
    shared: bool,
    /// No CPU this thread may run on is one the peer may.
    apart: bool,
}

impl PeerCpu {
    /// How often the affinities are looked at again.
    const RECHECK: Duration = Duration::from_millis(100);

    /// Whether this thread and the peer may both run only on the same one
    /// CPU (an error, e.g. a peer that exited, counts as no).
    fn shares_one_cpu(&mut self, now: Instant) -> bool {
        self.check(now);
        self.shared
    }

    /// Looks at both affinities again if the last look is old.
    fn check(&mut self, now: Instant) {
        if self
            .checked
            .is_some_and(|t| now.saturating_duration_since(t) < Self::RECHECK)
        {
            return;
        }
        self.checked = Some(now);
        let ours = rustix::thread::sched_getaffinity(None);
        let theirs = rustix::thread::sched_getaffinity(Some(self.pid));
        (self.shared, self.apart) = match (ours, theirs) {
            (Ok(a), Ok(b)) => (
                a.count() == 1 && a == b,
                (0..rustix::thread::CpuSet::MAX_CPU).all(|c| !(a.is_set(c) && b.is_set(c))),
            ),
            _ => (false, false),
        };
    }
}

/// Context switches of this thread that it did not ask for by sleeping
/// (`getrusage(RUSAGE_THREAD)`'s `ru_nivcsw`): a `sched_yield` that ran
/// another task adds one. `None` if the call fails.
/// [`getrusage(2)`](https://man7.org/linux/man-pages/man2/getrusage.2.html).
fn involuntary_switches() -> Option<i64> {
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage for the call.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return None;
    }
    Some(ru.ru_nivcsw)
}

/// Waits on a [`Polled`] ring the way its [`PollMode`] says, sharing the
/// CPU with a peer that needs it.
#[derive(Debug, Clone)]
pub struct Poller {
    mode: PollMode,
    slice: Duration,
    guard: HogGuard,
    /// End of the current spin slice (`None`: the next empty pass yields).
    spin_until: Option<Instant>,
    peer: Option<PeerCpu>,
}

impl Poller {
    /// Spinning between two yields while polling: short enough that a
    /// peer on this CPU waits little for it, long enough that a poller
    /// whose answer comes from another CPU makes few system calls.
    pub const SLICE: Duration = Duration::from_micros(5);

    /// Looks at the ring between two clock reads while spinning with the
    /// peer on another CPU: a look and a pause take tens of nanoseconds,
    /// so the window and the deadline are still kept to about a
    /// microsecond, while the answer is seen sooner after it lands.
    const LOOKS_PER_CLOCK: u32 = 16;

    /// A poller in `mode`, yielding every [`Poller::SLICE`].
    pub fn new(mode: PollMode) -> Poller {
        Poller::with_slice(mode, Self::SLICE)
    }

    /// A poller that spins up to `slice` between yields (zero: yields on
    /// every empty pass).
    pub fn with_slice(mode: PollMode, slice: Duration) -> Poller {
        Poller {
            mode,
            slice,
            guard: HogGuard::default(),
            spin_until: None,
            peer: None,
        }
    }

    /// Tells the poller which process answers it (`None`: unknown), so
    /// that it stops spinning while both may run only on one CPU.
    pub fn set_peer(&mut self, pid: Option<rustix::process::Pid>) {
        self.peer = pid.map(|pid| PeerCpu {
            pid,
            checked: None,
            shared: false,
            apart: false,
        });
    }

    /// Whether this thread and its peer may both run only on one and
    /// the same CPU (as last checked; rechecked every 100 ms). `false`
    /// without a peer.
    pub fn shares_cpu_with_peer(&mut self) -> bool {
        let now = Instant::now();
        self.peer.as_mut().is_some_and(|p| p.shares_one_cpu(now))
    }

    /// One empty pass on a CPU shared with the peer: yields it. Returns
    /// whether the yield ran another task (`false`: nothing else was
    /// runnable, the peer is asleep, and polling is over; a failed count
    /// says the same).
    fn hand_over(&mut self) -> bool {
        let before = involuntary_switches();
        std::thread::yield_now();
        let after = involuntary_switches();
        matches!((before, after), (Some(b), Some(a)) if a > b)
    }

    /// The mode.
    pub fn mode(&self) -> PollMode {
        self.mode
    }

    /// The window of an adaptive poller (`None`: it never sleeps).
    pub fn window(&self) -> Option<Duration> {
        match self.mode {
            PollMode::Window(w) => Some(w),
            PollMode::Busy => None,
        }
    }

    /// Whether a wait starting at `now` polls: the mode polls and the
    /// guard has not turned polling off.
    pub fn may_poll(&mut self, now: Instant) -> bool {
        self.mode.polls() && self.guard.on(now)
    }

    /// The last look found work: the next empty pass yields at once (the
    /// answer to what was just sent may need this CPU).
    pub fn worked(&mut self) {
        self.spin_until = None;
    }

    /// One empty pass: spins, or, once the slice is over, yields the CPU
    /// and starts a new slice. Returns whether polling goes on (`false`:
    /// the yield showed a peer holding this CPU, and the guard turned
    /// polling off).
    pub fn pass(&mut self) -> bool {
        if self.spin_until.is_some_and(|t| Instant::now() < t) {
            std::hint::spin_loop();
            return true;
        }
        let before = Instant::now();
        std::thread::yield_now();
        let after = Instant::now();
        self.spin_until = Some(after + self.slice);
        self.guard.yielded(after - before, after)
    }

    /// Waits until `ring` is ready or `timeout` (`None`: no limit) has
    /// passed: looks, polls for the window (never stopping when busy)
    /// with notifications suppressed, then re-enables them, looks again
    /// and sleeps.
    ///
    /// # Errors
    /// The ring's.
    pub fn wait<P: Polled + ?Sized>(
        &mut self,
        ring: &mut P,
        timeout: Option<Duration>,
    ) -> Result<Waited, P::Error> {
        // A look first: a wait that finds work at once reads no clock.
        if ring.ready()? {
            self.worked();
            return Ok(Waited::Ready);
        }
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        if self.may_poll(start) {
            let (shared, apart) = match self.peer.as_mut() {
                Some(p) => {
                    p.check(start);
                    (p.shared, p.apart)
                }
                None => (false, false),
            };
            ring.suppress()?;
            let until = self.window().map(|w| start + w);
            let mut looks = 0u32;
            loop {
                let (goes_on, spun) = if shared {
                    (self.hand_over(), false)
                } else if apart && !ring.helpers_busy() {
                    std::hint::spin_loop();
                    (true, true)
                } else {
                    (self.pass(), false)
                };
                if ring.ready()? {
                    self.worked();
                    return Ok(Waited::Ready);
                }
                // A clock read costs more than a look at the ring: a pure
                // spin reads it on every `LOOKS_PER_CLOCK`th look only.
                looks = looks.wrapping_add(1);
                if spun && looks % Self::LOOKS_PER_CLOCK != 0 {
                    continue;
                }
                let now = Instant::now();
                if !goes_on || until.is_some_and(|u| now >= u) || deadline.is_some_and(|d| now >= d)
                {
                    break;
                }
            }
        }
        loop {
            // Re-enable, then look again before sleeping (§2.7.10).
            if ring.rearm()? {
                self.worked();
                return Ok(Waited::Ready);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Ok(Waited::TimedOut);
            }
            ring.sleep(left)?;
            if ring.ready()? {
                self.worked();
                return Ok(Waited::Ready);
            }
        }
    }
}

#[cfg(test)]
mod tests;
