//! What the bus API, the endpoints and the bus thread share: the
//! state behind the bus lock, where each endpoint's messages go, and the
//! wake-ups between them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use foldhash::HashMap;
use iopath_sys::lock;

use super::{BusError, BusHook, Channel, EndpointRef, Event, InPlace, RxBuffer, Stats};
use crate::link::{Link, LinkMemory};
use crate::notify::Notifier;
use crate::role::Role;
use crate::wire::Endian;

/// A callback endpoint's callback: one allocation with its lock, shared
/// with the bus thread, which calls it without the state lock.
pub(super) type Callback = Arc<Mutex<dyn FnMut(&EndpointRef, Event) + Send>>;

/// An in-place callback endpoint's callback (see
/// [`Bus::create_in_place`](super::Bus::create_in_place)).
pub(super) type InPlaceCallback = Arc<Mutex<dyn FnMut(&EndpointRef, InPlace<'_>) + Send>>;

#[derive(Clone)]
pub(super) enum Sink {
    Queue(mpsc::Sender<Event>),
    Callback(Callback),
    /// Zero-copy endpoint: messages stay in their shared buffers.
    ZeroCopy(mpsc::Sender<ZeroCopyEvent>),
    /// Zero-copy callback: each message read in its shared buffer by the
    /// callback, on the bus thread, then given back.
    InPlace(InPlaceCallback),
}

/// What a zero-copy endpoint receives.
pub(super) enum ZeroCopyEvent {
    Buf(RxBuffer),
    Unbound,
    LinkDown(String),
}

/// What the bus thread hands to a sink.
pub(super) enum Delivery {
    Ev(Event),
    Buf(RxBuffer),
}

pub(super) struct EptSlot {
    pub(super) name: String,
    pub(super) dst: u32,
    pub(super) announced: bool,
    pub(super) sink: Sink,
}

pub(super) struct State {
    pub(super) link: Box<dyn Link>,
    pub(super) endpoints: HashMap<u32, EptSlot>,
    pub(super) channels: Vec<Channel>,
    pub(super) next_addr: u32,
    pub(super) stats: Stats,
    pub(super) down: Option<String>,
    pub(super) stop: bool,
    /// Kick holds taken ([`Bus::hold_kicks`](super::Bus::hold_kicks)):
    /// while any is held, sends leave the kick to the last one released.
    pub(super) kick_holds: u32,
}

impl State {
    /// Whether the peer must be notified now for the work done since the
    /// last decision (counted); never while a kick hold is taken, whose
    /// release decides instead.
    pub(super) fn kick_due(&mut self) -> bool {
        if self.kick_holds > 0 {
            return false;
        }
        let k = self.link.take_kick();
        if k {
            self.stats.kicks += 1;
        }
        k
    }
}

pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    /// Buffers came back: senders waiting for one (counted in
    /// `buf_waiters`) look again.
    pub(super) cond: Condvar,
    /// Threads waiting on `cond`: the bus thread signals only when
    /// there are some, so a quiet pass costs no system call and wakes no
    /// one.
    pub(super) buf_waiters: AtomicUsize,
    /// The channels changed or the link went down ([`Bus::wait_channel`](super::Bus::wait_channel),
    /// [`Bus::wait_down`](super::Bus::wait_down)).
    pub(super) events: Condvar,
    pub(super) notifier: Box<dyn Notifier>,
    pub(super) endian: Endian,
    pub(super) ns: bool,
    pub(super) role: Role,
    pub(super) buf_size: usize,
    pub(super) rx_buf_size: usize,
    /// The link's memory (zero-copy buffers read and write it).
    pub(super) shm: Arc<dyn LinkMemory>,
    pub(super) thread: Mutex<Option<JoinHandle<()>>>,
    /// The bus owner's sources the bus thread serves too (see
    /// [`Bus::set_hook`](super::Bus::set_hook)).
    pub(super) hook: Mutex<Option<Box<dyn BusHook>>>,
}

/// Marks the link down; the bus thread tells the endpoints.
pub(super) fn mark_down(shared: &Shared, reason: String) {
    let mut st = lock(&shared.state);
    if st.down.is_none() {
        st.down = Some(reason);
    }
    drop(st);
    notify_down(shared);
}

/// Kicks the peer; a kick that fails marks the link down and is its
/// error.
pub(super) fn kick(shared: &Shared) -> Result<(), BusError> {
    shared.notifier.kick().map_err(|e| {
        mark_down(shared, format!("notify: {e}"));
        BusError::LinkDown(e.to_string())
    })
}

/// Wakes everyone waiting on the bus: the link is down.
pub(super) fn notify_down(shared: &Shared) {
    shared.cond.notify_all();
    shared.events.notify_all();
}

/// Waits (the state lock released meanwhile) until buffers may have come
/// back, at most `left` and 1 ms: the peer may return buffers without a
/// kick.
pub(super) fn wait_for_buffer<'a>(
    shared: &'a Shared,
    st: MutexGuard<'a, State>,
    left: Duration,
) -> MutexGuard<'a, State> {
    shared.buf_waiters.fetch_add(1, Ordering::SeqCst);
    let st = iopath_sys::wait_timeout(&shared.cond, st, left.min(Duration::from_millis(1))).0;
    shared.buf_waiters.fetch_sub(1, Ordering::SeqCst);
    st
}
