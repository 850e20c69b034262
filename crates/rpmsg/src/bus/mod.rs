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
//!
//! This file is the [`Bus`] API (start, create, send, flush, shutdown);
//! `hook` the bus owner's sources the service thread serves too,
//! `endpoint` the endpoints, `zero_copy` the in-place buffers, `service` the
//! service thread, `name_service` what address 53 means, and `state` what
//! they share behind the bus lock.

mod endpoint;
mod error;
mod hook;
mod kick_hold;
mod name_service;
mod service;
mod state;
mod zero_copy;

pub use endpoint::{Endpoint, EndpointOptions, EndpointRef};
pub use error::BusError;
pub use hook::{HookRun, ServiceHook};
pub use kick_hold::KickHold;
pub use zero_copy::{InPlace, RxBuffer, TxBuffer, ZeroCopyEndpoint};

use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use foldhash::HashMap;
use tracing::debug;

use self::state::{
    lock, mark_down, notify_down, wait_for_buffer, Callback, EptSlot, Shared, Sink, State,
};
use crate::host::{HostLink, HostOptions};
use crate::link::{Link, Role};
use crate::notify::Notifier;
use crate::remote::RemoteLink;
use crate::shm::SharedMem;
use crate::wire::{
    self, check_name, Endian, ADDR_ANY, HDR_LEN, NS_ADDR, RESERVED_ADDRESSES, VIRTIO_RPMSG_F_NS,
};

/// What became of a send.
enum Sent {
    /// The message went to the peer.
    Yes,
    /// No buffer is free.
    NoBuffer,
    /// The peer's buffer holds only this many bytes (header included): a
    /// peer set up with smaller buffers than ours, as when sizes are
    /// fixed on each side and differ. The buffer is kept for the next send.
    Small(usize),
}

/// Sends one message given as its header and payload: both written into
/// a free buffer of `link`, which then goes to the peer.
fn send_parts(link: &mut dyn Link, hdr: &[u8], data: &[u8]) -> Result<Sent, crate::LinkError> {
    let Some(slot) = link.get_tx()? else {
        return Ok(Sent::NoBuffer);
    };
    let len = hdr.len() + data.len();
    if len > slot.cap {
        let cap = slot.cap;
        link.drop_tx(slot);
        return Ok(Sent::Small(cap));
    }
    let mem = link.memory();
    let written = mem
        .write(slot.addr, hdr)
        .and_then(|()| mem.write(slot.addr + hdr.len() as u64, data));
    if let Err(e) = written {
        link.drop_tx(slot);
        return Err(e.into());
    }
    link.put_tx(slot, len)?;
    Ok(Sent::Yes)
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
    /// Messages refused to their sender because the peer's buffer could
    /// not hold them (sizes fixed on each side, and the peer's smaller):
    /// [`BusError::TooLarge`], the link going on.
    pub tx_too_large: u64,
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
        let opts = HostOptions {
            features,
            ..HostOptions::default()
        };
        Self::host_with(shm, notifier, &opts)
    }

    /// As [`Bus::host`], with the buffer-size convention of `opts`.
    ///
    /// # Errors
    /// As [`Bus::host`]; also when the remote's buffer sizes are refused.
    pub fn host_with(
        shm: SharedMem,
        notifier: Box<dyn Notifier>,
        opts: &HostOptions,
    ) -> Result<Bus, BusError> {
        let link = HostLink::start_with(shm, opts)?;
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
        Self::remote_with(shm, notifier, timeout, None)
    }

    /// As [`Bus::remote`]; with `fixed`, the buffer sizes are these
    /// whatever the table offers ([`crate::Convention::Fixed`]).
    ///
    /// # Errors
    /// As [`Bus::remote`]; also for a size no buffer can have.
    pub fn remote_with(
        shm: SharedMem,
        notifier: Box<dyn Notifier>,
        timeout: Option<Duration>,
        fixed: Option<crate::BufSizes>,
    ) -> Result<Bus, BusError> {
        let link = RemoteLink::wait_ready_with(shm, &*notifier, timeout, fixed)?;
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
            rx_buf_size: link.rx_buf_size(),
            shm: Arc::clone(link.memory()),
            state: Mutex::new(State {
                link,
                endpoints: HashMap::default(),
                channels: Vec::new(),
                next_addr: RESERVED_ADDRESSES,
                stats: Stats::default(),
                down: None,
                stop: false,
                kick_holds: 0,
            }),
            cond: Condvar::new(),
            buf_waiters: AtomicUsize::new(0),
            events: Condvar::new(),
            notifier,
            thread: Mutex::new(None),
            hook: Mutex::new(None),
        });
        let s = Arc::clone(&shared);
        let h = std::thread::Builder::new()
            .name(format!("rpmsg-{}", shared.role))
            .spawn(move || service::run(s))
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

    /// Hands `hook` (the bus owner's own sources, e.g. client sockets) to
    /// the service thread, which then serves them beside the rings: on a
    /// bus that sleeps it waits on the hook's fds and the notifier's in one
    /// call ([`ServiceHook::run`]), on a polling bus it runs the hook on
    /// every pass. A message between a hook's source and the rings then
    /// crosses no thread hand-off. Replaces (and detaches) any hook set
    /// before.
    ///
    /// # Errors
    /// What [`ServiceHook::attach`] returns; the hook is not set then.
    pub fn set_hook(&self, mut hook: Box<dyn ServiceHook>) -> std::io::Result<()> {
        hook.attach(&self.shared.notifier.wait_fds())?;
        let old = lock(&self.shared.hook).replace(hook);
        if let Some(mut old) = old {
            old.detach(&self.shared.notifier.wait_fds());
        }
        Ok(())
    }

    /// The notifier kind ("eventfd", "unix", "poll").
    pub fn notifier_kind(&self) -> &'static str {
        self.shared.notifier.kind()
    }

    /// Largest payload this side can send (the negotiated buffer size of
    /// its direction, less the header).
    pub fn max_payload(&self) -> usize {
        self.shared.buf_size - HDR_LEN
    }

    /// Largest payload the peer can send here.
    pub fn max_rx_payload(&self) -> usize {
        self.shared.rx_buf_size - HDR_LEN
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
        let addr = self.register(opts, Sink::Queue(tx))?;
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
        let cb: Callback = Arc::new(Mutex::new(cb));
        let addr = self.register(opts, Sink::Callback(cb))?;
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
        let addr = self.register(opts, Sink::Held(tx))?;
        Ok(ZeroCopyEndpoint {
            r: EndpointRef {
                bus: self.clone(),
                addr,
            },
            rx,
        })
    }

    fn register(&self, opts: EndpointOptions, sink: Sink) -> Result<u32, BusError> {
        let announce = opts.announce && self.shared.ns;
        if announce || !opts.name.is_empty() {
            check_name(&opts.name)?;
        }
        let (addr, to_announce) = {
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
            debug!(target: "iopath_rpmsg", "{}: endpoint {:?} at {addr}", self.shared.role, opts.name);
            // The name moves into the slot; only an announcement needs it
            // once more.
            let (name, to_announce) = if announce {
                (opts.name.clone(), Some(opts.name))
            } else {
                (opts.name, None)
            };
            st.endpoints.insert(
                addr,
                EptSlot {
                    name,
                    dst,
                    announced: announce,
                    sink,
                },
            );
            (addr, to_announce)
        };
        if let Some(name) = to_announce {
            if let Err(e) = self.announce(&name, addr) {
                lock(&self.shared.state).endpoints.remove(&addr);
                return Err(e);
            }
        }
        Ok(addr)
    }

    pub(super) fn destroy(&self, addr: u32) {
        let slot = lock(&self.shared.state).endpoints.remove(&addr);
        if let Some(slot) = slot {
            if slot.announced {
                self.withdraw(&slot.name, addr);
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
        if data.len() > self.max_payload() {
            return Err(BusError::TooLarge {
                len: data.len(),
                max: self.max_payload(),
            });
        }
        // The header and the payload go straight into the free buffer: no
        // message is assembled on the side first.
        let hdr = wire::Header {
            src,
            dst,
            reserved: 0,
            len: data.len() as u16,
            flags: 0,
        }
        .encode(self.shared.endian);
        let deadline = wait.map(|w| Instant::now() + w);
        let mut st = lock(&self.shared.state);
        loop {
            if let Some(r) = &st.down {
                return Err(BusError::LinkDown(r.clone()));
            }
            match send_parts(&mut *st.link, &hdr, data) {
                Ok(Sent::Yes) => {
                    st.stats.tx_msgs += 1;
                    let kick = st.kick_due();
                    drop(st);
                    if kick {
                        if let Err(e) = self.shared.notifier.kick() {
                            mark_down(&self.shared, format!("notify: {e}"));
                            return Err(BusError::LinkDown(e.to_string()));
                        }
                    }
                    return Ok(());
                }
                Ok(Sent::NoBuffer) => {}
                Ok(Sent::Small(cap)) => {
                    st.stats.tx_too_large += 1;
                    tracing::warn!(
                        target: "iopath_rpmsg",
                        "a message of {} bytes does not fit the peer's {cap}-byte buffer",
                        hdr.len() + data.len()
                    );
                    return Err(BusError::TooLarge {
                        len: data.len(),
                        max: cap.saturating_sub(HDR_LEN),
                    });
                }
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
