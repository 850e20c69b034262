//! No notifications: both sides rescan the rings, and the poller that
//! shares its core well while it does.

use std::time::Duration;

use iopath_virtio::{PollMode, Poller};

use super::{Notifier, NotifyError, Wake};

/// No notifications: the peer rescans on its own.
#[derive(Debug, Default)]
pub struct PollNotifier;

impl Notifier for PollNotifier {
    fn kick(&self) -> Result<(), NotifyError> {
        Ok(())
    }

    fn wait(&self, timeout: Duration) -> Result<Wake, NotifyError> {
        if timeout.is_zero() {
            // Give the core away if anyone else wants it (the peer, a
            // woken client): on few cores a pure spin starves them.
            std::thread::yield_now();
        } else {
            std::thread::sleep(timeout);
        }
        Ok(Wake::Kicked)
    }

    fn is_polling(&self) -> bool {
        true
    }

    fn kind(&self) -> &'static str {
        "poll"
    }
}

/// Busy-polling that shares its core well: spin, then yield, then spin
/// (the spine's [`Poller`] in its never-sleeping mode, its slice the
/// window).
///
/// A poll that finds nothing right after work yields at once: the answer
/// to what was just sent may need this core (a peer polling beside us).
/// Once the yield returns, the others have had their turn and the answer
/// is likely on its way from another core, so the poller spins without
/// yielding for up to its window before yielding again. Yielding on every
/// empty poll instead makes two pollers on one core alternate every
/// 1.5 us (one context switch each way), and a message that lands just
/// after its poller gave the core away waits out a whole alternation.
#[derive(Debug)]
pub struct PollSpin(Poller);

impl PollSpin {
    /// The window from `IOPATH_RPMSG_POLL_SPIN_US` (default 10 us; 0:
    /// yield on every empty poll).
    pub fn new() -> PollSpin {
        // Read once: a poller is made per busy receive.
        static WINDOW: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
        let window = *WINDOW.get_or_init(|| {
            let us = std::env::var("IOPATH_RPMSG_POLL_SPIN_US")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(10);
            Duration::from_micros(us)
        });
        PollSpin::with_window(window)
    }

    /// A poller that spins up to `window` between yields.
    pub fn with_window(window: Duration) -> PollSpin {
        PollSpin(Poller::with_slice(PollMode::Busy, window))
    }

    /// The last poll found work: the next empty one yields at once.
    pub fn worked(&mut self) {
        self.0.worked();
    }

    /// The last poll found nothing: yields the core, or goes on spinning
    /// while the window since the last yield lasts.
    pub fn idle(&mut self) {
        // A busy poller never stops: what the guard says is not asked.
        let _ = self.0.pass();
    }
}

impl Default for PollSpin {
    fn default() -> PollSpin {
        PollSpin::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poller_spins_its_window_after_a_yield() {
        // An hour's window: after the first yield, empty polls only spin
        // (the spine's poller tests the slice itself).
        let mut p = PollSpin::with_window(Duration::from_secs(3600));
        p.idle();
        let t = std::time::Instant::now();
        for _ in 0..1000 {
            p.idle();
        }
        assert!(t.elapsed() < Duration::from_secs(1));
        p.worked();
        p.idle();
    }

    #[test]
    fn poll_always_rescans() {
        let p = PollNotifier;
        p.kick().unwrap();
        assert_eq!(p.wait(Duration::ZERO).unwrap(), Wake::Kicked);
        assert!(p.is_polling());
    }
}
