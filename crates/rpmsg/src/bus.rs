//! The rpmsg bus: endpoints with addresses, the name service, channels the
//! peer announced, and one service thread per link.
//!
//! ```text
//!  Endpoint::send ─► encode ─► Link::send ─► kick?
//!  service thread: Notifier::wait ─► Link::recv ─► wire::parse_message
//!      ├─ dst 53: NsMsg::parse ─► channels + bind/unbind endpoints
//!      ├─ dst = endpoint: queue (Endpoint::recv) or callback
//!      └─ otherwise: counted and dropped
//! ```
//!
//! Name-service rules follow OpenAMP (`rpmsg_virtio_ns_callback`): a CREATE
//! binds every unbound local endpoint of that name to the announced address
//! and records a channel; a DESTROY unbinds the endpoints bound to that
//! address (they see [`Event::Unbound`]) and removes the channel. A local
//! endpoint created with `announce` sends CREATE, and DESTROY when it goes.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;
use tracing::{debug, info, warn};

use crate::host::HostLink;
use crate::link::{self, Link, LinkError, Role, Slot};
use crate::notify::{Notifier, NotifyError};
use crate::remote::RemoteLink;
use crate::shm::SharedMem;
use crate::wire::{
    self, check_name, Endian, NsMsg, NsOp, WireError, ADDR_ANY, HDR_LEN, NS_ADDR,
    RESERVED_ADDRESSES, VIRTIO_RPMSG_F_NS,
};

/// Messages handled per service pass before notifications are sent.
const BATCH: usize = 64;
/// How long an idle, event-driven service thread sleeps between checks of
/// the status byte.
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// Why a bus operation failed.
#[derive(Debug, Error)]
pub enum BusError {
    /// The link is down (reason given).
    #[error("Link down: {0}")]
    LinkDown(String),
    /// No buffer free and the caller asked not to wait.
    #[error("No free buffer")]
    WouldBlock,
    /// No buffer became free in time, or nothing arrived in time.
    #[error("Timed out")]
    Timeout,
    /// The payload does not fit a buffer.
    #[error("Payload of {len} bytes is larger than {max}")]
    TooLarge {
        /// Payload length.
        len: usize,
        /// Largest payload.
        max: usize,
    },
    /// The endpoint has no destination yet.
    #[error("Endpoint {addr} is not bound to a remote address")]
    NotBound {
        /// The endpoint.
        addr: u32,
    },
    /// The source address is taken.
    #[error("Address {addr} is in use")]
    AddrInUse {
        /// The address.
        addr: u32,
    },
    /// A bad name.
    #[error("Bad endpoint name")]
    Name(#[from] WireError),
    /// The remote service this endpoint was bound to is gone.
    #[error("Remote service gone")]
    Unbound,
    /// The endpoint delivers to a callback, not a queue.
    #[error("Endpoint delivers to a callback")]
    CallbackEndpoint,
    /// Starting the link failed.
    #[error("Link setup failed")]
    Link(#[from] LinkError),
    /// The notifier failed while starting.
    #[error("Notification failed")]
    Notify(#[from] NotifyError),
}

/// Counters of what the bus did and refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Messages delivered to endpoints.
    pub rx_msgs: u64,
    /// Messages sent.
    pub tx_msgs: u64,
    /// Buffers the link refused (bad descriptor, length past the buffer).
    pub rx_refused: u64,
    /// Messages with a malformed header or name-service record.
    pub rx_malformed: u64,
    /// Messages for an address nobody listens on.
    pub rx_unknown_dst: u64,
    /// Name-service CREATE records received.
    pub ns_create: u64,
    /// Name-service DESTROY records received.
    pub ns_destroy: u64,
    /// Notifications sent to the peer.
    pub kicks: u64,
}

/// A service the peer announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Channel {
    /// Service name.
    pub name: String,
    /// The peer endpoint's address.
    pub addr: u32,
}

/// One received message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Sender address.
    pub src: u32,
    /// Our address.
    pub dst: u32,
    /// Payload.
    pub data: Vec<u8>,
}

/// What an endpoint receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message.
    Message(Message),
    /// The peer destroyed the service this endpoint was bound to.
    Unbound {
        /// The peer address that went away.
        addr: u32,
    },
    /// The link went down.
    LinkDown(String),
}

/// Options for a new endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointOptions {
    /// Name (announced with the name service, matched against the peer's
    /// announcements).
    pub name: String,
    /// Local address, or [`ADDR_ANY`] for the next free one from 1024.
    pub src: u32,
    /// Peer address, or [`ADDR_ANY`] to bind on the peer's announcement or
    /// first message.
    pub dst: u32,
    /// Send name-service CREATE now and DESTROY when the endpoint goes.
    pub announce: bool,
}

impl EndpointOptions {
    /// An announced endpoint named `name`, any address, unbound.
    pub fn new(name: &str) -> Self {
        EndpointOptions {
            name: name.to_owned(),
            src: ADDR_ANY,
            dst: ADDR_ANY,
            announce: true,
        }
    }

    /// Sets the local address.
    pub fn src(mut self, src: u32) -> Self {
        self.src = src;
        self
    }

    /// Sets the peer address.
    pub fn dst(mut self, dst: u32) -> Self {
        self.dst = dst;
        self
    }

    /// Whether to announce.
    pub fn announce(mut self, announce: bool) -> Self {
        self.announce = announce;
        self
    }
}

type Callback = Box<dyn FnMut(&EndpointRef, Event) + Send>;

#[derive(Clone)]
enum Sink {
    Queue(mpsc::Sender<Event>),
    Callback(Arc<Mutex<Callback>>),
    /// Zero-copy endpoint: messages stay in their shared buffers.
    Held(mpsc::Sender<Held>),
}

/// What a zero-copy endpoint receives.
enum Held {
    Buf(RxBuffer),
    Unbound,
    LinkDown(String),
}

/// What the service thread hands to a sink.
enum Delivery {
    Ev(Event),
    Buf(RxBuffer),
}

struct EptSlot {
    name: String,
    dst: u32,
    announced: bool,
    sink: Sink,
}

struct State {
    link: Box<dyn Link>,
    endpoints: HashMap<u32, EptSlot>,
    channels: Vec<Channel>,
    next_addr: u32,
    stats: Stats,
    down: Option<String>,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Buffers came back: senders waiting for one (counted in
    /// `buf_waiters`) look again.
    cond: Condvar,
    /// Threads waiting on `cond`: the service thread signals only when
    /// there are some, so a quiet pass costs no system call and wakes no
    /// one.
    buf_waiters: AtomicUsize,
    /// The channels changed or the link went down ([`Bus::wait_channel`],
    /// [`Bus::wait_down`]).
    events: Condvar,
    notifier: Box<dyn Notifier>,
    endian: Endian,
    ns: bool,
    role: Role,
    buf_size: usize,
    /// The link's shared memory (zero-copy buffers read and write it).
    shm: SharedMem,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Extra work for a polling service thread (see [`Bus::set_poll_hook`]).
    poll_hook: Mutex<Option<PollHook>>,
}

type PollHook = Box<dyn FnMut() -> bool + Send>;

/// An rpmsg bus over one link. Cheap to clone; [`Bus::shutdown`] stops it.
#[derive(Clone)]
pub struct Bus {
    shared: Arc<Shared>,
}

impl fmt::Debug for Bus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bus")
            .field("role", &self.shared.role)
            .field("notifier", &self.shared.notifier.kind())
            .field("ns", &self.shared.ns)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Bus {
    /// Host role: takes the device in `shm` over (features limited to
    /// `features`), sets DRIVER_OK, kicks the remote and starts serving.
    ///
    /// # Errors
    /// [`BusError::Link`] if the table is refused or the rings do not fit.
    pub fn host(
        shm: SharedMem,
        notifier: Box<dyn Notifier>,
        features: u32,
    ) -> Result<Bus, BusError> {
        let link = HostLink::start(shm, features)?;
        let bus = Bus::start(Box::new(link), notifier);
        bus.shared.notifier.kick()?;
        Ok(bus)
    }

    /// Remote role: waits for DRIVER_OK (at most `timeout`), then serves.
    ///
    /// # Errors
    /// [`BusError::Link`] on timeout or a refused table.
    pub fn remote(
        shm: SharedMem,
        notifier: Box<dyn Notifier>,
        timeout: Option<Duration>,
    ) -> Result<Bus, BusError> {
        let link = RemoteLink::wait_ready(shm, &*notifier, timeout)?;
        Ok(Bus::start(Box::new(link), notifier))
    }

    /// Starts a bus over any link.
    pub fn start(link: Box<dyn Link>, notifier: Box<dyn Notifier>) -> Bus {
        let features = link.features();
        let shared = Arc::new(Shared {
            endian: Endian::for_features(false),
            ns: features & (1 << VIRTIO_RPMSG_F_NS) != 0,
            role: link.role(),
            buf_size: link.buf_size(),
            shm: link.shm().clone(),
            state: Mutex::new(State {
                link,
                endpoints: HashMap::new(),
                channels: Vec::new(),
                next_addr: RESERVED_ADDRESSES,
                stats: Stats::default(),
                down: None,
                stop: false,
            }),
            cond: Condvar::new(),
            buf_waiters: AtomicUsize::new(0),
            events: Condvar::new(),
            notifier,
            thread: Mutex::new(None),
            poll_hook: Mutex::new(None),
        });
        let s = Arc::clone(&shared);
        let h = std::thread::Builder::new()
            .name(format!("rpmsg-{}", shared.role))
            .spawn(move || service(s))
            .expect("spawn rpmsg service thread");
        *lock(&shared.thread) = Some(h);
        Bus { shared }
    }

    /// Host or remote.
    pub fn role(&self) -> Role {
        self.shared.role
    }

    /// Whether the name service was negotiated.
    pub fn has_ns(&self) -> bool {
        self.shared.ns
    }

    /// The negotiated feature word.
    pub fn features(&self) -> u32 {
        lock(&self.shared.state).link.features()
    }

    /// Whether the service thread polls the rings (no notifications).
    pub fn polls(&self) -> bool {
        self.shared.notifier.is_polling()
    }

    /// On a polling bus, runs `hook` on the service thread on every pass,
    /// outside the bus lock (it may send); it returns whether it found work,
    /// which keeps the thread spinning. Lets a user of the bus poll its own
    /// sources (e.g. client sockets) on the already spinning thread instead
    /// of a thread woken per event. Ignored on a bus that sleeps.
    pub fn set_poll_hook(&self, hook: impl FnMut() -> bool + Send + 'static) {
        *lock(&self.shared.poll_hook) = Some(Box::new(hook));
    }

    /// The notifier kind ("eventfd", "unix", "poll").
    pub fn notifier_kind(&self) -> &'static str {
        self.shared.notifier.kind()
    }

    /// Largest payload.
    pub fn max_payload(&self) -> usize {
        self.shared.buf_size - HDR_LEN
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        lock(&self.shared.state).stats
    }

    /// Services the peer has announced.
    pub fn channels(&self) -> Vec<Channel> {
        lock(&self.shared.state).channels.clone()
    }

    /// Why the link is down, if it is.
    pub fn down_reason(&self) -> Option<String> {
        lock(&self.shared.state).down.clone()
    }

    /// Waits until the peer announces `name`.
    ///
    /// # Errors
    /// [`BusError::Timeout`], [`BusError::LinkDown`].
    pub fn wait_channel(&self, name: &str, timeout: Duration) -> Result<Channel, BusError> {
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.shared.state);
        loop {
            if let Some(c) = st.channels.iter().find(|c| c.name == name) {
                return Ok(c.clone());
            }
            if let Some(r) = &st.down {
                return Err(BusError::LinkDown(r.clone()));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(BusError::Timeout);
            }
            st = self
                .shared
                .events
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Blocks until the link goes down or `timeout` passes; returns the
    /// reason if it went down.
    pub fn wait_down(&self, timeout: Option<Duration>) -> Option<String> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = lock(&self.shared.state);
        loop {
            if st.down.is_some() {
                return st.down.clone();
            }
            let wait = match deadline {
                Some(d) => d.checked_duration_since(Instant::now())?,
                None => Duration::from_secs(1),
            };
            st = self
                .shared
                .events
                .wait_timeout(st, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Creates an endpoint whose messages queue up for [`Endpoint::recv`].
    ///
    /// # Errors
    /// [`BusError::AddrInUse`], [`BusError::Name`], or a send error for the
    /// announcement.
    pub fn create(&self, opts: EndpointOptions) -> Result<Endpoint, BusError> {
        let (tx, rx) = mpsc::channel();
        let addr = self.register(&opts, Sink::Queue(tx))?;
        Ok(Endpoint {
            r: EndpointRef {
                bus: self.clone(),
                addr,
            },
            rx: Some(rx),
        })
    }

    /// Creates an endpoint whose events go to `cb`, called on the service
    /// thread (it may send, e.g. to echo).
    ///
    /// # Errors
    /// As [`Bus::create`].
    pub fn create_with_callback(
        &self,
        opts: EndpointOptions,
        cb: impl FnMut(&EndpointRef, Event) + Send + 'static,
    ) -> Result<Endpoint, BusError> {
        let cb: Callback = Box::new(cb);
        let addr = self.register(&opts, Sink::Callback(Arc::new(Mutex::new(cb))))?;
        Ok(Endpoint {
            r: EndpointRef {
                bus: self.clone(),
                addr,
            },
            rx: None,
        })
    }

    /// Creates a zero-copy endpoint: each message stays in the peer's
    /// shared buffer until the [`RxBuffer`] is dropped (which gives the
    /// buffer back). Holding many stalls the peer once its buffers run out.
    ///
    /// # Errors
    /// As [`Bus::create`].
    pub fn create_zero_copy(&self, opts: EndpointOptions) -> Result<ZeroCopyEndpoint, BusError> {
        let (tx, rx) = mpsc::channel();
        let addr = self.register(&opts, Sink::Held(tx))?;
        Ok(ZeroCopyEndpoint {
            r: EndpointRef {
                bus: self.clone(),
                addr,
            },
            rx,
        })
    }

    fn register(&self, opts: &EndpointOptions, sink: Sink) -> Result<u32, BusError> {
        let announce = opts.announce && self.shared.ns;
        if announce || !opts.name.is_empty() {
            check_name(&opts.name)?;
        }
        let addr = {
            let mut st = lock(&self.shared.state);
            if let Some(r) = &st.down {
                return Err(BusError::LinkDown(r.clone()));
            }
            let addr = if opts.src == ADDR_ANY {
                let mut a = st.next_addr;
                while st.endpoints.contains_key(&a) || a == NS_ADDR {
                    a = if a >= ADDR_ANY - 1 {
                        RESERVED_ADDRESSES
                    } else {
                        a + 1
                    };
                }
                st.next_addr = if a >= ADDR_ANY - 1 {
                    RESERVED_ADDRESSES
                } else {
                    a + 1
                };
                a
            } else {
                if st.endpoints.contains_key(&opts.src) || opts.src == NS_ADDR {
                    return Err(BusError::AddrInUse { addr: opts.src });
                }
                opts.src
            };
            // Bind at once if the peer already announced this name.
            let mut dst = opts.dst;
            if dst == ADDR_ANY {
                if let Some(c) = st.channels.iter().find(|c| c.name == opts.name) {
                    dst = c.addr;
                }
            }
            st.endpoints.insert(
                addr,
                EptSlot {
                    name: opts.name.clone(),
                    dst,
                    announced: announce,
                    sink,
                },
            );
            addr
        };
        if announce {
            let ns = NsMsg {
                name: opts.name.clone(),
                addr,
                op: NsOp::Create,
            };
            let rec = ns.encode(self.shared.endian)?;
            if let Err(e) = self.send_raw(addr, NS_ADDR, &rec, Some(Duration::from_secs(5))) {
                lock(&self.shared.state).endpoints.remove(&addr);
                return Err(e);
            }
        }
        debug!(target: "iopath_rpmsg", "{}: endpoint {:?} at {addr}", self.shared.role, opts.name);
        Ok(addr)
    }

    fn destroy(&self, addr: u32) {
        let slot = lock(&self.shared.state).endpoints.remove(&addr);
        if let Some(slot) = slot {
            if slot.announced {
                let ns = NsMsg {
                    name: slot.name.clone(),
                    addr,
                    op: NsOp::Destroy,
                };
                if let Ok(rec) = ns.encode(self.shared.endian) {
                    if let Err(e) = self.send_raw(addr, NS_ADDR, &rec, Some(Duration::from_secs(1)))
                    {
                        debug!(target: "iopath_rpmsg", "name-service destroy of {:?} not sent: {e}", slot.name);
                    }
                }
            }
        }
    }

    /// Sends `data` from `src` to `dst`. `wait`: `None` fails at once with
    /// [`BusError::WouldBlock`] when no buffer is free; `Some(t)` waits up
    /// to `t`.
    ///
    /// # Errors
    /// [`BusError::TooLarge`], [`BusError::WouldBlock`],
    /// [`BusError::Timeout`], [`BusError::LinkDown`].
    pub fn send_raw(
        &self,
        src: u32,
        dst: u32,
        data: &[u8],
        wait: Option<Duration>,
    ) -> Result<(), BusError> {
        let mut msg = Vec::with_capacity(HDR_LEN + data.len());
        wire::encode_message(
            src,
            dst,
            data,
            self.shared.buf_size,
            self.shared.endian,
            &mut msg,
        )
        .map_err(|_| BusError::TooLarge {
            len: data.len(),
            max: self.max_payload(),
        })?;
        let deadline = wait.map(|w| Instant::now() + w);
        let mut st = lock(&self.shared.state);
        loop {
            if let Some(r) = &st.down {
                return Err(BusError::LinkDown(r.clone()));
            }
            match st.link.send(&msg) {
                Ok(true) => {
                    st.stats.tx_msgs += 1;
                    let kick = st.link.take_kick();
                    if kick {
                        st.stats.kicks += 1;
                    }
                    drop(st);
                    if kick {
                        if let Err(e) = self.shared.notifier.kick() {
                            mark_down(&self.shared, format!("notify: {e}"));
                            return Err(BusError::LinkDown(e.to_string()));
                        }
                    }
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) => {
                    let reason = e.to_string();
                    st.down = Some(reason.clone());
                    drop(st);
                    notify_down(&self.shared);
                    return Err(BusError::LinkDown(reason));
                }
            }
            let Some(deadline) = deadline else {
                return Err(BusError::WouldBlock);
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(BusError::Timeout);
            }
            // Buffers come back with the peer's next kick (the service thread
            // then signals); poll every millisecond in case it does not kick.
            st = wait_for_buffer(&self.shared, st, deadline - now);
        }
    }

    /// Waits until the peer has taken every sent message (host role; the
    /// remote returns at once). Returns whether it did within `timeout`.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let mut st = lock(&self.shared.state);
                if st.down.is_some() {
                    return false;
                }
                match st.link.tx_in_flight() {
                    Ok(0) => return true,
                    Ok(_) => {}
                    Err(_) => return false,
                }
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Stops the service thread; the host resets the device status.
    /// Endpoints see [`Event::LinkDown`].
    pub fn shutdown(&self) {
        let eps: Vec<u32> = lock(&self.shared.state).endpoints.keys().copied().collect();
        for a in eps {
            self.destroy(a);
        }
        {
            let mut st = lock(&self.shared.state);
            st.stop = true;
            st.link.shutdown();
        }
        let _ = self.shared.notifier.kick();
        mark_down(&self.shared, "bus shut down".into());
        let h = lock(&self.shared.thread).take();
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

/// A non-owning handle to an endpoint (what callbacks get).
#[derive(Clone, Debug)]
pub struct EndpointRef {
    bus: Bus,
    addr: u32,
}

impl EndpointRef {
    /// Local address.
    pub fn addr(&self) -> u32 {
        self.addr
    }

    /// The bus.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// Current peer address ([`ADDR_ANY`] while unbound).
    pub fn dst(&self) -> u32 {
        lock(&self.bus.shared.state)
            .endpoints
            .get(&self.addr)
            .map_or(ADDR_ANY, |s| s.dst)
    }

    /// Sends to `dst`, waiting up to `wait` for a buffer (`None`: do not
    /// wait).
    ///
    /// # Errors
    /// As [`Bus::send_raw`].
    pub fn send_to(&self, dst: u32, data: &[u8], wait: Option<Duration>) -> Result<(), BusError> {
        self.bus.send_raw(self.addr, dst, data, wait)
    }

    /// Sends to the bound peer, waiting up to 5 s for a buffer.
    ///
    /// # Errors
    /// [`BusError::NotBound`] and as [`Bus::send_raw`].
    pub fn send(&self, data: &[u8]) -> Result<(), BusError> {
        self.send_timeout(data, Some(Duration::from_secs(5)))
    }

    /// Sends to the bound peer without waiting for a buffer.
    ///
    /// # Errors
    /// [`BusError::WouldBlock`] and as [`EndpointRef::send`].
    pub fn try_send(&self, data: &[u8]) -> Result<(), BusError> {
        self.send_timeout(data, None)
    }

    /// Sends to the bound peer, waiting up to `wait`.
    ///
    /// # Errors
    /// As [`EndpointRef::send`].
    pub fn send_timeout(&self, data: &[u8], wait: Option<Duration>) -> Result<(), BusError> {
        let dst = self.dst();
        if dst == ADDR_ANY {
            return Err(BusError::NotBound { addr: self.addr });
        }
        self.send_to(dst, data, wait)
    }
}

/// An endpoint; dropping it destroys it (with a name-service DESTROY if it
/// was announced).
#[derive(Debug)]
pub struct Endpoint {
    r: EndpointRef,
    rx: Option<mpsc::Receiver<Event>>,
}

impl std::ops::Deref for Endpoint {
    type Target = EndpointRef;
    fn deref(&self) -> &EndpointRef {
        &self.r
    }
}

impl Endpoint {
    /// Next event, waiting up to `timeout` (`None`: forever).
    ///
    /// # Errors
    /// [`BusError::Timeout`], [`BusError::CallbackEndpoint`].
    pub fn recv_event(&self, timeout: Option<Duration>) -> Result<Event, BusError> {
        let rx = self.rx.as_ref().ok_or(BusError::CallbackEndpoint)?;
        let ev = match timeout {
            None => rx.recv().map_err(|_| BusError::LinkDown("bus gone".into())),
            Some(t) => rx.recv_timeout(t).map_err(|e| match e {
                mpsc::RecvTimeoutError::Timeout => BusError::Timeout,
                mpsc::RecvTimeoutError::Disconnected => BusError::LinkDown("bus gone".into()),
            }),
        }?;
        Ok(ev)
    }

    /// Next message, waiting up to `timeout`.
    ///
    /// # Errors
    /// [`BusError::Unbound`] when the peer destroyed the service,
    /// [`BusError::LinkDown`], [`BusError::Timeout`].
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Message, BusError> {
        match self.recv_event(timeout)? {
            Event::Message(m) => Ok(m),
            Event::Unbound { .. } => Err(BusError::Unbound),
            Event::LinkDown(r) => Err(BusError::LinkDown(r)),
        }
    }

    /// The next message if one is queued.
    ///
    /// # Errors
    /// [`BusError::WouldBlock`] when none is, else as [`Endpoint::recv`].
    pub fn try_recv(&self) -> Result<Message, BusError> {
        let rx = self.rx.as_ref().ok_or(BusError::CallbackEndpoint)?;
        match rx.try_recv() {
            Ok(Event::Message(m)) => Ok(m),
            Ok(Event::Unbound { .. }) => Err(BusError::Unbound),
            Ok(Event::LinkDown(r)) => Err(BusError::LinkDown(r)),
            Err(mpsc::TryRecvError::Empty) => Err(BusError::WouldBlock),
            Err(mpsc::TryRecvError::Disconnected) => Err(BusError::LinkDown("bus gone".into())),
        }
    }

    /// A non-owning handle.
    pub fn handle(&self) -> EndpointRef {
        self.r.clone()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.r.bus.destroy(self.r.addr);
    }
}

/// A message still in the peer's shared buffer (zero-copy receive). The
/// buffer goes back to the peer when this is dropped. The bytes are shared
/// memory the peer could still write, so they are read out through
/// [`RxBuffer::read`], never lent as a slice.
pub struct RxBuffer {
    shared: Arc<Shared>,
    held: Option<link::Held>,
    src: u32,
    dst: u32,
    /// Device address of the payload.
    addr: u64,
    len: usize,
}

impl fmt::Debug for RxBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RxBuffer")
            .field("src", &self.src)
            .field("dst", &self.dst)
            .field("addr", &self.addr)
            .field("len", &self.len)
            .finish()
    }
}

impl RxBuffer {
    /// Sender address.
    pub fn src(&self) -> u32 {
        self.src
    }

    /// Our address.
    pub fn dst(&self) -> u32 {
        self.dst
    }

    /// Payload length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of the payload in the shared memory (its device address).
    pub fn shm_offset(&self) -> u64 {
        self.addr
    }

    /// Copies `dst.len()` payload bytes from `offset` straight out of the
    /// shared buffer.
    ///
    /// # Errors
    /// [`BusError::TooLarge`] if the range runs past the payload.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), BusError> {
        if offset.checked_add(dst.len()).is_none_or(|e| e > self.len) {
            return Err(BusError::TooLarge {
                len: offset.saturating_add(dst.len()),
                max: self.len,
            });
        }
        self.shared
            .shm
            .read(self.addr + offset as u64, dst)
            .map_err(|e| BusError::Link(e.into()))
    }

    /// The whole payload, copied.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // In range by construction (checked against the buffer when held).
        let _ = self.read(0, &mut v);
        v
    }
}

impl Drop for RxBuffer {
    fn drop(&mut self) {
        let Some(h) = self.held.take() else { return };
        let kick = {
            let mut st = lock(&self.shared.state);
            if st.down.is_some() {
                return;
            }
            release(&mut st, h);
            let k = st.link.take_kick();
            if k {
                st.stats.kicks += 1;
            }
            k
        };
        if kick {
            let _ = self.shared.notifier.kick();
        }
    }
}

/// A free shared buffer to build a message in place (zero-copy send): write
/// the payload with [`TxBuffer::write`], then [`TxBuffer::send`]. Dropped
/// unsent, the buffer is kept for the next send.
pub struct TxBuffer {
    ep: EndpointRef,
    slot: Option<Slot>,
}

impl fmt::Debug for TxBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxBuffer")
            .field("src", &self.ep.addr)
            .field("slot", &self.slot)
            .finish()
    }
}

impl TxBuffer {
    /// Payload bytes the buffer holds.
    pub fn capacity(&self) -> usize {
        self.slot
            .as_ref()
            .map_or(0, |s| (s.cap - HDR_LEN).min(usize::from(u16::MAX)))
    }

    /// Offset of the payload in the shared memory (its device address).
    pub fn shm_offset(&self) -> u64 {
        self.slot.as_ref().map_or(0, |s| s.addr + HDR_LEN as u64)
    }

    /// Writes payload bytes at `offset`, straight into the shared buffer.
    ///
    /// # Errors
    /// [`BusError::TooLarge`] past the capacity.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), BusError> {
        let cap = self.capacity();
        if offset.checked_add(data.len()).is_none_or(|e| e > cap) {
            return Err(BusError::TooLarge {
                len: offset.saturating_add(data.len()),
                max: cap,
            });
        }
        let addr = self.shm_offset() + offset as u64;
        self.ep
            .bus
            .shared
            .shm
            .write(addr, data)
            .map_err(|e| BusError::Link(e.into()))
    }

    /// Sends the first `len` payload bytes to the bound peer.
    ///
    /// # Errors
    /// [`BusError::NotBound`], [`BusError::TooLarge`],
    /// [`BusError::LinkDown`].
    pub fn send(self, len: usize) -> Result<(), BusError> {
        let dst = self.ep.dst();
        if dst == ADDR_ANY {
            return Err(BusError::NotBound { addr: self.ep.addr });
        }
        self.send_to(dst, len)
    }

    /// Sends the first `len` payload bytes to `dst`.
    ///
    /// # Errors
    /// [`BusError::TooLarge`], [`BusError::LinkDown`].
    pub fn send_to(mut self, dst: u32, len: usize) -> Result<(), BusError> {
        let cap = self.capacity();
        if len > cap {
            return Err(BusError::TooLarge { len, max: cap });
        }
        let shared = &self.ep.bus.shared;
        let hdr = wire::Header {
            src: self.ep.addr,
            dst,
            reserved: 0,
            len: len as u16,
            flags: 0,
        };
        let slot = self.slot.take().expect("slot until sent");
        if let Err(e) = shared.shm.write(slot.addr, &hdr.encode(shared.endian)) {
            lock(&shared.state).link.drop_tx(slot);
            return Err(BusError::Link(e.into()));
        }
        let kick = {
            let mut st = lock(&shared.state);
            if let Some(r) = &st.down {
                return Err(BusError::LinkDown(r.clone()));
            }
            if let Err(e) = st.link.put_tx(slot, HDR_LEN + len) {
                let r = e.to_string();
                st.down.get_or_insert(r.clone());
                return Err(BusError::LinkDown(r));
            }
            st.stats.tx_msgs += 1;
            let k = st.link.take_kick();
            if k {
                st.stats.kicks += 1;
            }
            k
        };
        if kick {
            if let Err(e) = shared.notifier.kick() {
                mark_down(shared, format!("notify: {e}"));
                return Err(BusError::LinkDown(e.to_string()));
            }
        }
        Ok(())
    }
}

impl Drop for TxBuffer {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            lock(&self.ep.bus.shared.state).link.drop_tx(slot);
            self.ep.bus.shared.cond.notify_all();
        }
    }
}

impl EndpointRef {
    /// A free shared buffer to build the next message in (zero-copy send),
    /// waiting up to `wait` (`None`: do not wait).
    ///
    /// # Errors
    /// [`BusError::WouldBlock`], [`BusError::Timeout`],
    /// [`BusError::LinkDown`].
    pub fn alloc(&self, wait: Option<Duration>) -> Result<TxBuffer, BusError> {
        let shared = &self.bus.shared;
        let deadline = wait.map(|w| Instant::now() + w);
        let mut st = lock(&shared.state);
        loop {
            if let Some(r) = &st.down {
                return Err(BusError::LinkDown(r.clone()));
            }
            match st.link.get_tx() {
                Ok(Some(slot)) => {
                    return Ok(TxBuffer {
                        ep: self.clone(),
                        slot: Some(slot),
                    })
                }
                Ok(None) => {}
                Err(e) => {
                    let r = e.to_string();
                    st.down.get_or_insert(r.clone());
                    return Err(BusError::LinkDown(r));
                }
            }
            let Some(deadline) = deadline else {
                return Err(BusError::WouldBlock);
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(BusError::Timeout);
            }
            st = wait_for_buffer(shared, st, deadline - now);
        }
    }
}

/// An endpoint whose messages stay in the peer's shared buffers
/// ([`Bus::create_zero_copy`]); dropping it destroys it.
#[derive(Debug)]
pub struct ZeroCopyEndpoint {
    r: EndpointRef,
    rx: mpsc::Receiver<Held>,
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Held::Buf(b) => b.fmt(f),
            Held::Unbound => f.write_str("Unbound"),
            Held::LinkDown(r) => write!(f, "LinkDown({r})"),
        }
    }
}

impl std::ops::Deref for ZeroCopyEndpoint {
    type Target = EndpointRef;
    fn deref(&self) -> &EndpointRef {
        &self.r
    }
}

impl ZeroCopyEndpoint {
    /// The next message, in its shared buffer, waiting up to `timeout`
    /// (`None`: forever).
    ///
    /// # Errors
    /// [`BusError::Timeout`], [`BusError::Unbound`], [`BusError::LinkDown`].
    pub fn recv(&self, timeout: Option<Duration>) -> Result<RxBuffer, BusError> {
        let h = match timeout {
            None => self
                .rx
                .recv()
                .map_err(|_| BusError::LinkDown("bus gone".into()))?,
            Some(t) => self.rx.recv_timeout(t).map_err(|e| match e {
                mpsc::RecvTimeoutError::Timeout => BusError::Timeout,
                mpsc::RecvTimeoutError::Disconnected => BusError::LinkDown("bus gone".into()),
            })?,
        };
        match h {
            Held::Buf(b) => Ok(b),
            Held::Unbound => Err(BusError::Unbound),
            Held::LinkDown(r) => Err(BusError::LinkDown(r)),
        }
    }

    /// A non-owning handle.
    pub fn handle(&self) -> EndpointRef {
        self.r.clone()
    }
}

impl Drop for ZeroCopyEndpoint {
    fn drop(&mut self) {
        self.r.bus.destroy(self.r.addr);
    }
}

/// Marks the link down; the service thread tells the endpoints.
fn mark_down(shared: &Shared, reason: String) {
    let mut st = lock(&shared.state);
    if st.down.is_none() {
        st.down = Some(reason);
    }
    drop(st);
    notify_down(shared);
}

/// Wakes everyone waiting on the bus: the link is down.
fn notify_down(shared: &Shared) {
    shared.cond.notify_all();
    shared.events.notify_all();
}

/// Waits (the state lock released meanwhile) until buffers may have come
/// back, at most `left` and 1 ms: the peer may return buffers without a
/// kick.
fn wait_for_buffer<'a>(
    shared: &'a Shared,
    st: MutexGuard<'a, State>,
    left: Duration,
) -> MutexGuard<'a, State> {
    shared.buf_waiters.fetch_add(1, Ordering::SeqCst);
    let st = shared
        .cond
        .wait_timeout(st, left.min(Duration::from_millis(1)))
        .unwrap_or_else(|e| e.into_inner())
        .0;
    shared.buf_waiters.fetch_sub(1, Ordering::SeqCst);
    st
}

fn deliver(bus: &Bus, addr: u32, sink: Sink, d: Delivery) {
    match (sink, d) {
        (Sink::Held(tx), Delivery::Buf(b)) => {
            // A receiver gone drops the buffer here: it goes back at once.
            let _ = tx.send(Held::Buf(b));
        }
        (Sink::Held(tx), Delivery::Ev(Event::Unbound { .. })) => {
            let _ = tx.send(Held::Unbound);
        }
        (Sink::Held(tx), Delivery::Ev(Event::LinkDown(r))) => {
            let _ = tx.send(Held::LinkDown(r));
        }
        (Sink::Held(_), Delivery::Ev(Event::Message(_))) => {}
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
    if let Sink::Held(_) = sink {
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

fn release(st: &mut State, h: link::Held) {
    if let Err(e) = st.link.release_rx(h) {
        st.down.get_or_insert(e.to_string());
    }
}

fn handle_ns(shared: &Shared, st: &mut State, m: NsMsg, out: &mut Vec<(u32, Sink, Delivery)>) {
    match m.op {
        NsOp::Create => {
            st.stats.ns_create += 1;
            info!(target: "iopath_rpmsg", "{}: peer announced {:?} at {}", shared.role, m.name, m.addr);
            st.channels
                .retain(|c| !(c.name == m.name && c.addr == m.addr));
            st.channels.push(Channel {
                name: m.name.clone(),
                addr: m.addr,
            });
            for slot in st.endpoints.values_mut() {
                if slot.name == m.name && slot.dst == ADDR_ANY {
                    slot.dst = m.addr;
                }
            }
        }
        NsOp::Destroy => {
            st.stats.ns_destroy += 1;
            info!(target: "iopath_rpmsg", "{}: peer destroyed {:?} at {}", shared.role, m.name, m.addr);
            st.channels
                .retain(|c| !(c.name == m.name && c.addr == m.addr));
            for (addr, slot) in st.endpoints.iter_mut() {
                if slot.dst == m.addr {
                    slot.dst = ADDR_ANY;
                    out.push((
                        *addr,
                        slot.sink.clone(),
                        Delivery::Ev(Event::Unbound { addr: m.addr }),
                    ));
                }
            }
        }
    }
}

fn service(shared: Arc<Shared>) {
    let bus = Bus {
        shared: Arc::clone(&shared),
    };
    let polling = shared.notifier.is_polling();
    let mut idle_since = Instant::now();
    let mut last_check = Instant::now();
    let mut out = Vec::new();
    loop {
        let mut n = 0;
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
            kick = down.is_none() && st.link.take_kick();
            if kick {
                st.stats.kicks += 1;
            }
            ns_changed = st.stats.ns_create + st.stats.ns_destroy != ns_before;
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
        // The hook runs on every pass, busy or not: a peer that keeps the
        // rings busy must not starve the hook's own sources.
        let hooked = polling && lock(&shared.poll_hook).as_mut().is_some_and(|h| h());
        if n > 0 || hooked {
            idle_since = Instant::now();
            continue;
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
        match shared.notifier.wait(timeout) {
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
