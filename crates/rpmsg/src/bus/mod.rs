//! The rpmsg bus: endpoints with addresses, the name service, channels the
//! peer announced, and one bus thread per link.
//!
//! ```text
//!  Endpoint::send ─► encode ─► Link::send ─► kick?
//!  bus thread: Notifier::wait ─► Link::recv ─► wire::parse_message
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
//! This file is the [`Bus`] API (start, its counters and channels, waits,
//! shutdown); `registry` creates and destroys endpoints, `send` sends and
//! flushes, `kick_hold` batches kicks, `hook` the bus owner's sources the
//! bus thread serves too, `endpoint` the endpoints, `zero_copy` the
//! in-place buffers, `dispatch` the bus thread, `name_service` what
//! address 53 means, and `state` what they share behind the bus lock.

mod dispatch;
mod endpoint;
mod error;
mod hook;
mod kick_hold;
mod name_service;
mod registry;
mod send;
mod state;
mod zero_copy;

pub use endpoint::{Endpoint, EndpointOptions, EndpointRef};
pub use error::BusError;
pub use hook::{BusHook, HookRun};
pub use kick_hold::KickHold;
pub use zero_copy::{InPlace, RxBuffer, TxBuffer, ZeroCopyEndpoint};

use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use foldhash::HashMap;
use iopath_sys::lock;

use self::state::{mark_down, Shared, State};
use crate::link::Link;
use crate::link::RemoteLink;
use crate::link::{HostLink, HostOptions};
use crate::notify::Notifier;
use crate::role::Role;
use crate::shm::SharedMem;
use crate::wire::{Endian, HDR_LEN, RESERVED_ADDRESSES, VIRTIO_RPMSG_F_NS};

/// Counters of what the bus did and refused (as JSON: the field names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
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

/// One line, as `iopath rpmsg` prints it: `rx N tx N refused N malformed N
/// unknown-dst N ns-create N ns-destroy N too-large N`.
impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rx {} tx {} refused {} malformed {} unknown-dst {} ns-create {} ns-destroy {} too-large {}",
            self.rx_msgs,
            self.tx_msgs,
            self.rx_refused,
            self.rx_malformed,
            self.rx_unknown_dst,
            self.ns_create,
            self.ns_destroy,
            self.tx_too_large
        )
    }
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
            .spawn(move || dispatch::run(s))
            .expect("spawn rpmsg bus thread");
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

    /// Whether the bus thread polls the rings (no notifications).
    pub fn polls(&self) -> bool {
        self.shared.notifier.is_polling()
    }

    /// Hands `hook` (the bus owner's own sources, e.g. client sockets) to
    /// the bus thread, which then serves them beside the rings: on a
    /// bus that sleeps it waits on the hook's fds and the notifier's in one
    /// call ([`BusHook::run`]), on a polling bus it runs the hook on
    /// every pass. A message between a hook's source and the rings then
    /// crosses no thread hand-off. Replaces (and detaches) any hook set
    /// before.
    ///
    /// # Errors
    /// What [`BusHook::attach`] returns; the hook is not set then.
    pub fn set_hook(&self, mut hook: Box<dyn BusHook>) -> std::io::Result<()> {
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
            st = iopath_sys::wait_timeout(&self.shared.events, st, deadline - now).0;
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
            st = iopath_sys::wait_timeout(&self.shared.events, st, wait).0;
        }
    }

    /// Stops the bus thread; the host resets the device status.
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
