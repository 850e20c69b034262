use std::sync::atomic::{fence, AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;

use super::*;
use crate::queue::need_event;

#[test]
fn windows_in_range_are_accepted_and_named() {
    assert_eq!(PollMode::from_us(0).unwrap(), PollMode::SLEEP);
    assert!(!PollMode::SLEEP.polls());
    assert!(PollMode::Busy.polls());
    assert_eq!(
        PollMode::from_us(MAX_WINDOW_US).unwrap(),
        PollMode::Window(Duration::from_micros(MAX_WINDOW_US))
    );
    let e = PollMode::from_us(MAX_WINDOW_US + 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Poll window of 100001 us is out of range (0 to 100000 us)"
    );
    assert_eq!(PollMode::SLEEP.label(), "sleep");
    assert_eq!(PollMode::from_us(50).unwrap().label(), "poll 50us");
    assert_eq!(PollMode::Busy.label(), "busy");
    assert_eq!(
        PollMode::default(),
        PollMode::from_us(DEFAULT_WINDOW_US).unwrap()
    );
}

#[test]
fn a_hogged_yield_turns_polling_off_with_a_growing_backoff() {
    let ms = Duration::from_millis;
    let mut s = HogGuard::default();
    let t0 = Instant::now();
    assert!(s.on(t0));
    // Yields that come back at once keep it on.
    assert!(s.yielded(Duration::from_micros(3), t0));
    // Long yields far apart are noise.
    assert!(s.yielded(ms(4), t0));
    assert!(s.yielded(ms(4), t0 + ms(200)));
    assert!(s.yielded(ms(4), t0 + ms(400)));
    assert!(s.on(t0 + ms(400)));
    // Three within 100 ms are a peer holding the CPU for whole slices.
    assert!(s.yielded(ms(4), t0 + ms(600)));
    assert!(s.yielded(Duration::from_micros(3), t0 + ms(602)));
    assert!(s.yielded(ms(4), t0 + ms(604)));
    assert!(!s.yielded(ms(4), t0 + ms(608)));
    assert!(!s.on(t0 + ms(707)));
    assert!(s.on(t0 + ms(708)));
    // It fails again: off twice as long.
    let t1 = t0 + ms(710);
    assert!(s.yielded(ms(4), t1));
    assert!(s.yielded(ms(4), t1 + ms(4)));
    assert!(!s.yielded(ms(4), t1 + ms(8)));
    assert!(!s.on(t1 + ms(207)));
    assert!(s.on(t1 + ms(208)));
    for _ in 0..20 * HogGuard::HOGS {
        s.yielded(ms(4), t1 + ms(8));
    }
    assert_eq!(s.backoff(), HogGuard::MAX_BACKOFF);
}

#[test]
fn a_pass_yields_after_work_and_spins_its_slice_after_a_yield() {
    let mut p = Poller::with_slice(PollMode::Busy, Duration::from_secs(3600));
    // Nothing yet: the first empty pass yields and opens the slice.
    assert!(p.spin_until.is_none());
    assert!(p.pass());
    let opened = p.spin_until.expect("a yield opens the slice");
    assert!(opened > Instant::now() + Duration::from_secs(3500));
    // Within the slice empty passes spin: the slice stays as it was.
    assert!(p.pass());
    assert_eq!(p.spin_until, Some(opened));
    // Work closes it: the next empty pass yields again, a new slice.
    p.worked();
    assert!(p.spin_until.is_none());
    assert!(p.pass());
    assert!(p.spin_until.is_some_and(|t| t > opened));
    // A zero slice yields on every empty pass.
    let mut z = Poller::with_slice(PollMode::Busy, Duration::ZERO);
    z.pass();
    let t = z.spin_until.unwrap();
    z.pass();
    assert!(z.spin_until.unwrap() > t);
}

/// A ring that records what the poller did to it.
#[derive(Default)]
struct Script {
    /// `ready` answers, in order (then `false`).
    answers: Vec<bool>,
    calls: Vec<&'static str>,
    rearm_finds: bool,
}

impl Polled for Script {
    type Error = ();
    fn ready(&mut self) -> Result<bool, ()> {
        self.calls.push("ready");
        Ok(if self.answers.is_empty() {
            false
        } else {
            self.answers.remove(0)
        })
    }
    fn suppress(&mut self) -> Result<(), ()> {
        self.calls.push("suppress");
        Ok(())
    }
    fn rearm(&mut self) -> Result<bool, ()> {
        self.calls.push("rearm");
        Ok(std::mem::take(&mut self.rearm_finds))
    }
    fn sleep(&mut self, _: Option<Duration>) -> Result<(), ()> {
        self.calls.push("sleep");
        self.answers.push(true);
        Ok(())
    }
}

#[test]
fn a_sleeping_waiter_rearms_and_looks_again_before_sleeping() {
    let mut p = Poller::new(PollMode::SLEEP);
    let mut r = Script::default();
    assert_eq!(p.wait(&mut r, None), Ok(Waited::Ready));
    assert_eq!(r.calls, ["ready", "rearm", "sleep", "ready"]);
    // What the re-check finds ends the wait without sleeping.
    let mut r = Script {
        rearm_finds: true,
        ..Script::default()
    };
    assert_eq!(p.wait(&mut r, None), Ok(Waited::Ready));
    assert_eq!(r.calls, ["ready", "rearm"]);
}

#[test]
fn an_adaptive_waiter_suppresses_polls_then_sleeps_and_times_out() {
    // Found while polling: notifications are never re-enabled.
    let mut p = Poller::new(PollMode::Window(Duration::from_secs(3600)));
    let mut r = Script {
        answers: vec![false, false, false, true],
        ..Script::default()
    };
    assert_eq!(p.wait(&mut r, None), Ok(Waited::Ready));
    assert_eq!(r.calls, ["ready", "suppress", "ready", "ready", "ready"]);
    // Nothing within the window: re-arm, re-check, sleep.
    let mut p = Poller::new(PollMode::Window(Duration::from_millis(2)));
    let mut r = Script::default();
    let t = Instant::now();
    assert_eq!(p.wait(&mut r, None), Ok(Waited::Ready));
    assert!(t.elapsed() >= Duration::from_millis(2));
    let tail: Vec<_> = r.calls.iter().rev().take(3).rev().copied().collect();
    assert_eq!(tail, ["rearm", "sleep", "ready"]);
    // A timeout inside the window ends the wait, re-armed.
    struct Never(Vec<&'static str>);
    impl Polled for Never {
        type Error = ();
        fn ready(&mut self) -> Result<bool, ()> {
            Ok(false)
        }
        fn suppress(&mut self) -> Result<(), ()> {
            Ok(())
        }
        fn rearm(&mut self) -> Result<bool, ()> {
            self.0.push("rearm");
            Ok(false)
        }
        fn sleep(&mut self, t: Option<Duration>) -> Result<(), ()> {
            std::thread::sleep(t.expect("a timeout was given"));
            Ok(())
        }
    }
    let mut busy = Poller::new(PollMode::Busy);
    let mut n = Never(Vec::new());
    let t = Instant::now();
    assert_eq!(
        busy.wait(&mut n, Some(Duration::from_millis(3))),
        Ok(Waited::TimedOut)
    );
    assert!(t.elapsed() >= Duration::from_millis(3));
    assert_eq!(n.0, ["rearm"]);
}

/// One side of an `EVENT_IDX` ring in plain memory: the producer
/// publishes `idx` and reads `event`; the consumer writes `event` and reads
/// `idx`; notifications go through a real eventfd.
struct Shared {
    idx: AtomicU16,
    event: AtomicU16,
    kicks: AtomicU64,
    /// The last item the consumer took.
    taken: AtomicU16,
    efd: std::os::fd::OwnedFd,
}

struct Consumer {
    s: Arc<Shared>,
    seen: u16,
}

impl Polled for Consumer {
    type Error = std::io::Error;
    fn ready(&mut self) -> std::io::Result<bool> {
        Ok(self.s.idx.load(Ordering::Acquire) != self.seen)
    }
    fn suppress(&mut self) -> std::io::Result<()> {
        // An event index already passed: no notification until it wraps.
        self.s
            .event
            .store(self.seen.wrapping_sub(1), Ordering::Relaxed);
        Ok(())
    }
    fn rearm(&mut self) -> std::io::Result<bool> {
        self.s.event.store(self.seen, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.ready()
    }
    fn sleep(&mut self, timeout: Option<Duration>) -> std::io::Result<()> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let ts = timeout.map(|t| Timespec {
            tv_sec: t.as_secs() as _,
            tv_nsec: t.subsec_nanos().into(),
        });
        let mut fds = [PollFd::new(&self.s.efd, PollFlags::IN)];
        poll(&mut fds, ts.as_ref())?;
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.s.efd, &mut b);
        Ok(())
    }
}

/// Items are published one at a time at random moments while the consumer
/// goes from polling to sleeping and back, with windows of 0 to 3 us: most
/// items land around the re-enable. Each must be seen within the timeout;
/// a lost notification leaves one unseen and the wait times out.
#[test]
fn no_notification_is_lost_around_the_rearm() {
    lost_kick_race(false);
}

/// The same with the poller handing its CPU over instead of spinning (a
/// peer on its only CPU): it sleeps as soon as a yield runs nothing else.
#[test]
fn no_notification_is_lost_around_the_rearm_when_handing_over() {
    lost_kick_race(true);
}

/// A poller that takes its peer to share its only CPU (not rechecked).
fn sharing(mode: PollMode) -> Poller {
    let mut p = Poller::new(mode);
    p.peer = Some(PeerCpu {
        pid: rustix::process::getpid(),
        checked: Some(Instant::now() + Duration::from_secs(3600)),
        shared: true,
        apart: false,
    });
    assert!(p.shares_cpu_with_peer());
    p
}

#[test]
fn a_peer_pinned_to_this_threads_only_cpu_is_seen_and_rechecked() {
    use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
    let mine = sched_getaffinity(None).unwrap();
    let cpus: Vec<usize> = (0..CpuSet::MAX_CPU).filter(|&c| mine.is_set(c)).collect();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = rustix::process::Pid::from_child(&child);
    let mut one = CpuSet::new();
    one.set(cpus[0]);
    sched_setaffinity(None, &one).unwrap();
    sched_setaffinity(Some(pid), &one).unwrap();
    let mut p = Poller::new(PollMode::default());
    assert!(!p.shares_cpu_with_peer(), "no peer given");
    p.set_peer(Some(pid));
    let shared = p.shares_cpu_with_peer();
    let apart_when_shared = p.peer.as_ref().unwrap().apart;
    // The peer on another CPU (when there is one): apart.
    let apart = cpus.get(1).map(|&other| {
        let mut set = CpuSet::new();
        set.set(other);
        sched_setaffinity(Some(pid), &set).unwrap();
        p.peer.as_mut().unwrap().checked = None;
        let sh = p.shares_cpu_with_peer();
        (sh, p.peer.as_ref().unwrap().apart)
    });
    // The peer may run elsewhere too: the next check says so.
    sched_setaffinity(Some(pid), &mine).unwrap();
    p.peer.as_mut().unwrap().checked = None;
    let widened = p.shares_cpu_with_peer();
    // This thread may run elsewhere too.
    sched_setaffinity(None, &mine).unwrap();
    sched_setaffinity(Some(pid), &one).unwrap();
    p.peer.as_mut().unwrap().checked = None;
    let both_wide = p.shares_cpu_with_peer();
    // A peer that is gone shares nothing.
    child.kill().unwrap();
    child.wait().unwrap();
    sched_setaffinity(None, &one).unwrap();
    p.peer.as_mut().unwrap().checked = None;
    let gone = p.shares_cpu_with_peer();
    sched_setaffinity(None, &mine).unwrap();
    assert!(shared, "both pinned to CPU {}", cpus[0]);
    assert!(!apart_when_shared);
    if let Some(a) = apart {
        assert_eq!(a, (false, true), "the peer pinned to another CPU");
    }
    assert_eq!(widened, cpus.len() == 1);
    assert_eq!(both_wide, cpus.len() == 1);
    assert!(!gone);
}

#[test]
fn a_waiter_sharing_its_cpu_hands_it_over_instead_of_spinning() {
    // Nothing else runnable on this CPU (or a yield that ran another
    // task, then still nothing): the waiter ends polling early and sleeps,
    // long before its hour-long window.
    let mut p = sharing(PollMode::Window(Duration::from_secs(3600)));
    let mut r = Script::default();
    let t = Instant::now();
    assert_eq!(p.wait(&mut r, None), Ok(Waited::Ready));
    assert!(t.elapsed() < Duration::from_secs(60));
    let tail: Vec<_> = r.calls.iter().rev().take(3).rev().copied().collect();
    assert_eq!(tail, ["rearm", "sleep", "ready"]);
    assert_eq!(r.calls[..2], ["ready", "suppress"]);
}

fn lost_kick_race(shared: bool) {
    const ITEMS: u16 = 3_000;
    let efd = rustix::event::eventfd(0, rustix::event::EventfdFlags::NONBLOCK).unwrap();
    let s = Arc::new(Shared {
        idx: AtomicU16::new(0),
        event: AtomicU16::new(0),
        kicks: AtomicU64::new(0),
        taken: AtomicU16::new(0),
        efd,
    });
    let producer = {
        let s = Arc::clone(&s);
        std::thread::spawn(move || {
            let mut x = 0x9e37_79b9_u32;
            for i in 1..=ITEMS {
                // Wait until the consumer took the last one, then a
                // random short pause (xorshift), then publish.
                while s.taken.load(Ordering::Acquire) != i - 1 {
                    std::hint::spin_loop();
                }
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                for _ in 0..(x % 500) {
                    std::hint::spin_loop();
                }
                if x % 7 == 0 {
                    std::thread::yield_now();
                }
                let old = s.idx.load(Ordering::Relaxed);
                s.idx.store(i, Ordering::Release);
                fence(Ordering::SeqCst);
                if need_event(s.event.load(Ordering::Relaxed), i, old) {
                    s.kicks.fetch_add(1, Ordering::Relaxed);
                    rustix::io::write(&s.efd, &1u64.to_ne_bytes()).unwrap();
                }
            }
        })
    };
    let mut c = Consumer {
        s: Arc::clone(&s),
        seen: 0,
    };
    for i in 0..ITEMS {
        let mode = PollMode::Window(Duration::from_micros(u64::from(i % 4)));
        let mut p = if shared {
            sharing(mode)
        } else {
            Poller::new(mode)
        };
        let t = Instant::now();
        let got = p.wait(&mut c, Some(Duration::from_secs(5))).unwrap();
        // A lost notification shows as a sleep that lasts its whole
        // timeout (the look after it then finds the item).
        assert!(
            got == Waited::Ready && t.elapsed() < Duration::from_secs(2),
            "item {} seen after {:?}: a lost notification",
            i + 1,
            t.elapsed()
        );
        c.seen = c.s.idx.load(Ordering::Acquire);
        c.s.taken.store(c.seen, Ordering::Release);
    }
    producer.join().unwrap();
    assert_eq!(c.seen, ITEMS);
    // Both paths ran: some items were found by polling, some needed a kick.
    let kicks = s.kicks.load(Ordering::Relaxed);
    assert!(kicks > 0 && kicks < u64::from(ITEMS), "{kicks} kicks");
}

#[test]
fn a_poller_apart_from_its_peer_yields_only_while_its_helpers_work() {
    struct Idle {
        helpers: bool,
    }
    impl Polled for Idle {
        type Error = ();
        fn ready(&mut self) -> Result<bool, ()> {
            Ok(false)
        }
        fn helpers_busy(&self) -> bool {
            self.helpers
        }
        fn suppress(&mut self) -> Result<(), ()> {
            Ok(())
        }
        fn rearm(&mut self) -> Result<bool, ()> {
            Ok(false)
        }
        fn sleep(&mut self, t: Option<Duration>) -> Result<(), ()> {
            std::thread::sleep(t.unwrap_or_default());
            Ok(())
        }
    }
    for helpers in [false, true] {
        let mut p = Poller::new(PollMode::Busy);
        p.peer = Some(PeerCpu {
            pid: rustix::process::getpid(),
            checked: Some(Instant::now() + Duration::from_secs(3600)),
            shared: false,
            apart: true,
        });
        let got = p.wait(&mut Idle { helpers }, Some(Duration::from_millis(2)));
        assert_eq!(got, Ok(Waited::TimedOut));
        // A yield opens a spin slice; pure spinning never does.
        assert_eq!(p.spin_until.is_some(), helpers, "helpers busy: {helpers}");
    }
}
