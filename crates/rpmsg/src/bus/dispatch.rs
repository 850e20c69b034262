//! The bus thread: takes what the peer filled off the link, dispatches
//! it (name service, endpoints, zero-copy holders), returns buffers, kicks
//! the peer, serves the bus owner's hook (its own sources, waited for in
//! the same call as the notifier), and tells every endpoint when the link
//! goes down.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iopath_sys::lock;
use tracing::{debug, warn};

use super::name_service::handle_ns;
use super::state::{mark_down, notify_down, Delivery, Shared, Sink, State, ZeroCopyEvent};
use super::{Bus, EndpointRef, Event, HookRun, InPlace, Message, RxBuffer};
use crate::link;
use crate::notify::{NotifyError, PollSpin};
use crate::wire::{self, NsMsg, WireError, ADDR_ANY, HDR_LEN, NS_ADDR};
use iopath_virtio::{PollMode, Poller};

/// Messages handled per service pass before notifications are sent.
const BATCH: usize = 64;
/// How long an idle, event-driven bus thread sleeps between checks of
/// the status byte.
const IDLE_WAIT: Duration = Duration::from_millis(50);

fn deliver(bus: &Bus, addr: u32, sink: Sink, d: Delivery) {
    match (sink, d) {
        (Sink::ZeroCopy(tx), Delivery::Buf(b)) => {
            // A receiver gone drops the buffer here: it goes back at once.
            let _ = tx.send(ZeroCopyEvent::Buf(b));
        }
        (Sink::ZeroCopy(tx), Delivery::Ev(Event::Unbound { .. })) => {
            let _ = tx.send(ZeroCopyEvent::Unbound);
        }
        (Sink::ZeroCopy(tx), Delivery::Ev(Event::LinkDown(r))) => {
            let _ = tx.send(ZeroCopyEvent::LinkDown(r));
        }
        (Sink::ZeroCopy(_) | Sink::InPlace(_), Delivery::Ev(Event::Message(_))) => {}
        (Sink::InPlace(cb), Delivery::Buf(b)) => {
            let r = EndpointRef {
                bus: bus.clone(),
                addr,
            };
            (lock(&cb))(&r, InPlace::Message(&b));
            // The buffer goes back to the peer here.
            drop(b);
        }
        (Sink::InPlace(cb), Delivery::Ev(ev)) => {
            let r = EndpointRef {
                bus: bus.clone(),
                addr,
            };
            (lock(&cb))(&r, InPlace::Event(ev));
        }
        (sink, Delivery::Buf(b)) => {
            // Not a zero-copy endpoint: copy out and give the buffer back.
            let m = Message {
                src: b.src,
                dst: b.dst,
                data: b.to_vec(),
            };
            drop(b);
            deliver(bus, addr, sink, Delivery::Ev(Event::Message(m)));
        }
        (Sink::Queue(tx), Delivery::Ev(ev)) => {
            let _ = tx.send(ev);
        }
        (Sink::Callback(cb), Delivery::Ev(ev)) => {
            let r = EndpointRef {
                bus: bus.clone(),
                addr,
            };
            (lock(&cb))(&r, ev);
        }
    }
}

/// Dispatches one buffer the peer filled. Name-service records and
/// messages for copying endpoints are copied out and the buffer goes back
/// at once; a zero-copy endpoint gets the buffer itself.
fn handle_held(
    shared: &Arc<Shared>,
    st: &mut State,
    h: link::Held,
    out: &mut Vec<(u32, Sink, Delivery)>,
) {
    let mut hb = [0u8; HDR_LEN];
    let parsed = if h.len < HDR_LEN {
        Err(WireError::Short { got: h.len })
    } else {
        shared
            .shm
            .read(h.addr, &mut hb)
            .map_err(|_| WireError::Short { got: 0 })
            .and_then(|()| wire::Header::decode(&hb, shared.endian))
            .and_then(|hdr| {
                let room = h.len - HDR_LEN;
                if usize::from(hdr.len) > room {
                    Err(WireError::LenPastBuffer {
                        len: usize::from(hdr.len),
                        room,
                    })
                } else {
                    Ok(hdr)
                }
            })
    };
    let hdr = match parsed {
        Ok(hdr) => hdr,
        Err(e) => {
            st.stats.rx_malformed += 1;
            warn!(target: "iopath_rpmsg", "{}: dropped malformed message: {e}", shared.role);
            release(st, h);
            return;
        }
    };
    let payload_addr = h.addr + HDR_LEN as u64;
    let len = usize::from(hdr.len);
    if hdr.dst == NS_ADDR && shared.ns {
        let mut rec = vec![0u8; len];
        let r = shared.shm.read(payload_addr, &mut rec);
        release(st, h);
        match r
            .map_err(|_| WireError::Short { got: 0 })
            .and_then(|()| NsMsg::parse(&rec, shared.endian))
        {
            Ok(m) => handle_ns(shared, st, m, out),
            Err(e) => {
                st.stats.rx_malformed += 1;
                warn!(target: "iopath_rpmsg", "{}: dropped name-service record from {}: {e}", shared.role, hdr.src);
            }
        }
        return;
    }
    let Some(slot) = st.endpoints.get_mut(&hdr.dst) else {
        st.stats.rx_unknown_dst += 1;
        debug!(target: "iopath_rpmsg", "{}: dropped message for unknown address {}", shared.role, hdr.dst);
        release(st, h);
        return;
    };
    if slot.dst == ADDR_ANY {
        // First message from the peer binds the endpoint (OpenAMP does so).
        slot.dst = hdr.src;
    }
    st.stats.rx_msgs += 1;
    let sink = slot.sink.clone();
    if let Sink::ZeroCopy(_) | Sink::InPlace(_) = sink {
        out.push((
            hdr.dst,
            sink,
            Delivery::Buf(RxBuffer {
                shared: Arc::clone(shared),
                held: Some(h),
                src: hdr.src,
                dst: hdr.dst,
                addr: payload_addr,
                len,
            }),
        ));
        return;
    }
    let mut data = vec![0u8; len];
    let r = shared.shm.read(payload_addr, &mut data);
    release(st, h);
    if r.is_ok() {
        out.push((
            hdr.dst,
            sink,
            Delivery::Ev(Event::Message(Message {
                src: hdr.src,
                dst: hdr.dst,
                data,
            })),
        ));
    }
}

/// How long a sleeping bus keeps passing after it sent something
/// (`IOPATH_RPMSG_SPIN_US`, default 50 us; 0: sleep at once), on the
/// spine's poller: it yields the CPU on every pass, and its guard turns
/// spinning off for a while when a peer on the same CPU spins without
/// giving the CPU up (OpenAMP's Linux demo busy-waits), so that a round
/// trip does not cost a whole time slice.
fn spin_poller() -> Poller {
    let us = std::env::var("IOPATH_RPMSG_SPIN_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let mode = PollMode::Window(Duration::from_micros(us));
    Poller::with_slice(mode, Duration::ZERO)
}

/// Runs the hook, if there is one, waiting up to `timeout`; a hook that
/// says it is done is detached. No hook: `done`, so the caller waits on the
/// notifier itself.
fn run_hook(shared: &Shared, timeout: Duration) -> HookRun {
    let mut slot = lock(&shared.hook);
    let Some(h) = slot.as_mut() else {
        return HookRun {
            done: true,
            ..HookRun::default()
        };
    };
    let r = h.run(timeout);
    if r.done {
        if let Some(mut h) = slot.take() {
            h.detach(&shared.notifier.wait_fds());
        }
    }
    r
}

pub(super) fn release(st: &mut State, h: link::Held) {
    if let Err(e) = st.link.release_rx(h) {
        st.down.get_or_insert(e.to_string());
    }
}

/// The bus thread's body: runs until the bus stops or the link goes
/// down.
pub(super) fn run(shared: Arc<Shared>) {
    let bus = Bus {
        shared: Arc::clone(&shared),
    };
    let polling = shared.notifier.is_polling();
    let mut idle_since = Instant::now();
    let mut last_check = Instant::now();
    let mut out = Vec::new();
    let mut spin = spin_poller();
    let window = spin.window().unwrap_or(Duration::MAX);
    let mut last_tx = 0;
    let mut spin_until: Option<Instant> = None;
    let mut poll_spin = PollSpin::new();
    loop {
        let mut n = 0;
        let tx_now;
        let kick;
        let mut down = None;
        let ns_changed;
        {
            let mut st = lock(&shared.state);
            if st.stop || st.down.is_some() {
                break;
            }
            let ns_before = st.stats.ns_create + st.stats.ns_destroy;
            while n < BATCH {
                match st.link.hold_rx() {
                    Ok(None) => break,
                    Ok(Some(Err(reason))) => {
                        st.stats.rx_refused += 1;
                        warn!(target: "iopath_rpmsg", "{}: refused buffer: {reason}", shared.role);
                    }
                    Ok(Some(Ok(h))) => {
                        handle_held(&shared, &mut st, h, &mut out);
                        if let Some(r) = st.down.clone() {
                            down = Some(r);
                            break;
                        }
                    }
                    Err(e) => {
                        down = Some(e.to_string());
                        break;
                    }
                }
                n += 1;
            }
            if down.is_none() && last_check.elapsed() >= IDLE_WAIT {
                last_check = Instant::now();
                if let Err(e) = st.link.check() {
                    down = Some(e.to_string());
                }
            }
            // Under a kick hold the last release kicks, for this too.
            kick = down.is_none() && st.kick_due();
            ns_changed = st.stats.ns_create + st.stats.ns_destroy != ns_before;
            tx_now = st.stats.tx_msgs;
            // About to spin (see below): the peer need not notify meanwhile;
            // `arm` asks again before the thread sleeps.
            if !polling && tx_now != last_tx && down.is_none() && spin.may_poll(Instant::now()) {
                if let Err(e) = st.link.disarm() {
                    down = Some(e.to_string());
                }
            }
        }
        if kick {
            if let Err(e) = shared.notifier.kick() {
                down = Some(format!("notify: {e}"));
            }
        }
        for (addr, sink, ev) in out.drain(..) {
            deliver(&bus, addr, sink, ev);
        }
        // Only those who wait are told: a notify is a system call, and a
        // wake-up per message for nobody's sake doubles the echo latency.
        if shared.buf_waiters.load(Ordering::SeqCst) > 0 {
            shared.cond.notify_all();
        }
        if ns_changed {
            shared.events.notify_all();
        }
        if let Some(reason) = down {
            warn!(target: "iopath_rpmsg", "{}: link down: {reason}", shared.role);
            mark_down(&shared, reason);
            break;
        }
        if polling {
            // The hook runs on every pass, busy or not: a peer that keeps
            // the rings busy must not starve the hook's own sources.
            let hooked = run_hook(&shared, Duration::ZERO).worked;
            if n > 0 || hooked {
                idle_since = Instant::now();
                poll_spin.worked();
                continue;
            }
        } else if n > 0 {
            // Still busy: the hook's sources get a look every full batch,
            // so a peer that keeps the rings busy cannot starve them.
            if n == BATCH {
                run_hook(&shared, Duration::ZERO);
            }
            continue;
        }
        if !polling && (spin_until.is_some() || spin.may_poll(Instant::now())) {
            // Something went to the peer: its answer is likely on its way.
            // Pass over the rings a while longer (giving the CPU away
            // between passes) before sleeping, so that an answer that
            // comes meanwhile needs no wake-up of this thread; on a CPU of
            // its own the peer then needs no kick either (none is asked:
            // the rings were disarmed above).
            if tx_now != last_tx {
                last_tx = tx_now;
                spin_until = Instant::now().checked_add(window);
            }
            if spin_until.is_some_and(|t| Instant::now() < t) {
                if run_hook(&shared, Duration::ZERO).kicked {
                    if let Err(e) = shared.notifier.wait(Duration::ZERO) {
                        mark_down(&shared, format!("notify: {e}"));
                        break;
                    }
                }
                // One pass: yields, and says whether the guard lets
                // spinning go on.
                if spin.pass() {
                    continue;
                }
            }
            spin_until = None;
        }
        // A polling bus never sleeps on a kick, so it asks for none:
        // re-arming on every spin would write the rings' suppression
        // fields the peer reads, bouncing their cache lines between cores.
        let more = !polling && {
            let mut st = lock(&shared.state);
            match st.link.arm() {
                Ok(m) => m,
                Err(e) => {
                    st.down.get_or_insert(e.to_string());
                    break;
                }
            }
        };
        if more {
            continue;
        }
        let timeout = if polling {
            // Spin while traffic is recent, then back off to 1 ms.
            let idle = idle_since.elapsed();
            if idle < Duration::from_millis(2) {
                Duration::ZERO
            } else {
                (idle / 16).min(Duration::from_millis(1))
            }
        } else {
            IDLE_WAIT
        };
        // With a hook, one wait covers its sources and the notifier's fds;
        // the notifier then only takes the kicks it reported.
        let wait = if polling {
            if timeout.is_zero() {
                poll_spin.idle();
                continue;
            }
            timeout
        } else {
            match run_hook(&shared, timeout) {
                HookRun { kicked: true, .. } => Duration::ZERO,
                HookRun { done: true, .. } => timeout,
                _ => continue,
            }
        };
        match shared.notifier.wait(wait) {
            Ok(_) => {}
            Err(e) => {
                let reason = match e {
                    NotifyError::PeerGone => "peer closed the notification channel".to_owned(),
                    e => format!("notify: {e}"),
                };
                warn!(target: "iopath_rpmsg", "{}: link down: {reason}", shared.role);
                mark_down(&shared, reason);
                break;
            }
        }
    }
    // Whoever serves the hook's sources from now on must not see the
    // notifier's fds.
    if let Some(mut h) = lock(&shared.hook).take() {
        h.detach(&shared.notifier.wait_fds());
    }
    // Tell every endpoint, outside the lock (callbacks may call back in).
    let (reason, sinks): (String, Vec<(u32, Sink)>) = {
        let mut st = lock(&shared.state);
        let reason = st
            .down
            .get_or_insert_with(|| "bus shut down".into())
            .clone();
        let sinks = st
            .endpoints
            .iter()
            .map(|(a, s)| (*a, s.sink.clone()))
            .collect();
        (reason, sinks)
    };
    notify_down(&shared);
    for (addr, sink) in sinks {
        deliver(
            &bus,
            addr,
            sink,
            Delivery::Ev(Event::LinkDown(reason.clone())),
        );
    }
}
