//! The endpoint service: the user-space counterpart of `/dev/rpmsg_ctrlN`,
//! run by the bus owner behind its control socket.
//!
//! ```text
//!  accept thread: accept ─► add_client (into the event loop's epoll set)
//!
//!  event loop (epoll), run by the bus thread (a bus hook)
//!    the bus notifier's fds readable ─► the bus takes the kicks, passes the rings
//!    control connection readable ─► CREATE_EPT ─► legacy::create
//!                                   CREATE_EPT_FD ─► fdept::create
//!                                   STATS (answered at the end of the pass,
//!                                     after a look at the hang-ups),
//!                                   garbage (closed), ATTACH (own thread)
//!    listener readable ─► accept, greet (0 | -EBUSY)
//!    endpoint socket readable ─► one message, then up to 16 per recvmmsg,
//!        straight into free ring buffers (in_place), one kick per pass;
//!        ring full: into the service's own, Endpoint::try_send each, and
//!        what finds no buffer waits, the socket out of the set, retried
//!        before the next wait (the remote kicks when it gives a buffer
//!        back) and at least every 1 ms
//!    EOF: destroy (fd: last close or shutdown; node: shutdown)
//!    doomed (remote gone) ─► destroy
//!  same thread, ring pass: message ─► send on the endpoint's socket;
//!      unbound/link down ─► doom
//!  pump thread: only once the link is down (the bus thread is gone)
//! ```
//!
//! One thread reads the requests, the endpoints' messages and hang-ups and
//! the rings alike: a message from a client's socket to the ring, and one
//! from the ring to a client's socket, crosses no thread hand-off, and the
//! thread waits for all of it in one `epoll_wait` (the bus's notifier fds
//! are in the same set, see [`Bus::set_hook`]). A client that creates an
//! endpoint and closes it again wakes the service once per cycle, and the
//! close is usually seen in the same pass as the next request. Answers are
//! sent without waiting, so a client that does not read them cannot stall
//! the loop.
//!
//! Every endpoint is one bus endpoint (not announced, as rpmsg_char's are
//! not) plus one socket the service owns: for the fd way, its end of the
//! socketpair whose other end went to the client; for the legacy way, a
//! listening node `RUNDIR/rpmsgN` and, while open, the accepted
//! connection. Destroying removes all of it; the table and the runtime
//! directory go back to empty.
//!
//! On a polling bus the spinning bus thread takes the epoll work on
//! every pass, so a client's message reaches the ring without any wake-up.
//!
//! Message size: the largest payload is the buffer size negotiated
//! towards the peer less the 16-byte header (496 bytes without
//! negotiation, up to 65520 with 64 KiB buffers); each CREATE_EPT_FD
//! answer and node greeting names it. A write over it cannot fail in the
//! writer's `write(2)` by anything the service does after the fact. A unix
//! socket refuses (`EMSGSIZE`) a message over its send buffer less 32
//! bytes, the send buffer being twice what was asked and at least 4608
//! bytes; at 496 bytes the client's end gets that minimum (the kernel
//! refuses what exceeds 4576 bytes), with larger buffers room for a few
//! messages in flight and never less than the kernel's default
//! ([`fdept::client_sndbuf`]).
//! [`crate::ctrl::EptFd::send`] and the preload library refuse anything
//! over the payload with `EMSGSIZE` before it is sent. A raw client's
//! message between the payload and the kernel's limit still reaches the
//! service: it is not dropped silently but ends the endpoint (counted in
//! `oversize`, one warning), so the writer's next read or write fails
//! (`EPIPE`; a raw `read(2)` sees end of file) and poll reports a hang-up:
//! the loss is visible, as a protocol error, instead of a message that
//! vanished.

mod attach;
mod batch;
mod conn;
mod endpoints;
mod event_loop;
mod fdept;
mod forward;
mod in_place;
mod legacy;
mod limits;
mod server;
mod table;

pub use server::{CtrlOptions, CtrlServer};

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use foldhash::HashMap;
use iopath_sys::lock;
use rustix::event::epoll;
use rustix::event::{eventfd, EventfdFlags};
use rustix::net::Shutdown;

use self::batch::RecvBatch;
use self::event_loop::Hook;
use self::limits::{Client, Limits};
use self::table::{Counters, Table};
use crate::bus::{Bus, BusError};
use crate::ctrl::proto::{Request, ServiceStats};
use crate::ctrl::CtrlError;

/// Token of the wake-up eventfd in the epoll set.
const WAKE: u64 = u64::MAX;
/// Token of the bus notifier's fds (while the bus thread runs the [`Hook`]).
const NOTIFIER: u64 = u64::MAX - 1;
/// Token tag: the endpoint's data socket.
const TAG_SOCK: u64 = 0;
/// Token tag: a legacy node's listening socket.
const TAG_LISTENER: u64 = 1;
/// Token tag: a control connection (the token's id is the connection's).
const TAG_CTRL: u64 = 2;
/// Messages taken from one socket per wake-up, so one busy endpoint does
/// not starve the others.
const DRAIN: usize = 64;
/// How long a message waits for a free buffer on the bus before it is
/// dropped (counted).
const SEND_WAIT: Duration = Duration::from_secs(5);
/// How often the event loop retries messages waiting for a buffer.
const RETRY_EVERY: Duration = Duration::from_millis(1);
/// Full `epoll_wait`s taken before a deferred STATS answer at most, and
/// the events each takes.
const SETTLE_WAITS: usize = 16;
const SETTLE_EVENTS: usize = 64;

/// The errno a bus error is answered with.
pub(crate) fn errno_of(e: &BusError) -> i32 {
    match e {
        BusError::Timeout => libc::ETIMEDOUT,
        BusError::AddrInUse { .. } => libc::EBUSY,
        BusError::Name(_) => libc::EINVAL,
        BusError::TooLarge { .. } => libc::EMSGSIZE,
        BusError::LinkDown(_) | BusError::Unbound => libc::EPIPE,
        _ => libc::EIO,
    }
}

/// Messages taken from an endpoint's socket (in one batch), waiting for a
/// bus buffer, oldest first.
struct Stalled {
    msgs: std::collections::VecDeque<Vec<u8>>,
    /// An oversized message came after them: the endpoint ends once they
    /// went.
    then_end: bool,
    since: std::time::Instant,
}

/// A control connection, read by the event loop.
struct Conn {
    fd: Arc<OwnedFd>,
    peer: String,
    /// The peer's uid, whose endpoints are bounded together.
    uid: u32,
}

/// The event loop's epoll set, its wake-up, and who runs its pass.
struct EventSet {
    epoll: OwnedFd,
    wake: OwnedFd,
    /// Held by whoever runs the event loop's pass: the pump thread, or on a
    /// polling bus its spinning thread until the link goes down and the
    /// fallback pump thread takes over.
    pass: Mutex<()>,
    /// [`EptService::stop`] was called: the pump ends.
    stopped: AtomicBool,
}

/// What the event loop does at the end of its pass.
#[derive(Default)]
struct Due {
    /// Endpoints to destroy: their channel or the link went, or their
    /// socket broke.
    doomed: Vec<u64>,
    /// Control connections whose STATS is answered then.
    stats: Vec<Arc<OwnedFd>>,
}

/// The endpoint service's state, by concern: how it was set up, the event
/// loop, the control connections, the endpoints and their messages
/// waiting for a bus buffer, the loop's deferred work, the spare
/// socketpairs, the totals.
struct Inner {
    bus: Bus,
    /// Where legacy nodes go.
    rundir: PathBuf,
    /// The mode of the nodes.
    node_mode: u32,
    /// The bounds on endpoints per client and per user.
    limits: Limits,
    events: EventSet,
    conns: Mutex<HashMap<u64, Conn>>,
    table: Mutex<Table>,
    /// The last table entry id given out (ids start at 1).
    next_id: AtomicU64,
    /// Endpoints whose next message waits for a free bus buffer (their
    /// sockets out of the epoll set meanwhile): the loop never blocks on a
    /// remote that keeps its buffers.
    stalled: Mutex<HashMap<u64, Stalled>>,
    due: Mutex<Due>,
    spares: Mutex<Vec<fdept::Spare>>,
    n: Counters,
}

impl Inner {
    /// Wakes the event loop.
    fn wake(&self) {
        let _ = rustix::io::write(&self.events.wake, &1u64.to_ne_bytes());
    }

    /// Dooms endpoint `id`: the event loop destroys it when it wakes.
    fn doom(&self, id: u64) {
        lock(&self.due).doomed.push(id);
        self.wake();
    }
}

/// The endpoint service of one bus. Cheap to clone.
#[derive(Clone)]
pub(crate) struct EptService {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EptService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EptService")
            .field("rundir", &self.inner.rundir)
            .finish()
    }
}

fn sys(op: &'static str) -> impl FnOnce(rustix::io::Errno) -> CtrlError {
    move |e| CtrlError::Io {
        op,
        source: e.into(),
    }
}

impl EptService {
    /// Starts the pump thread; nodes go under `rundir` (created, mode 0700
    /// widened like `node_mode`), with mode `node_mode`.
    /// Each client holds at most `opts`' endpoints.
    pub(crate) fn start(bus: Bus, rundir: &Path, opts: &CtrlOptions) -> Result<Self, CtrlError> {
        let node_mode = opts.mode;
        std::fs::create_dir_all(rundir).map_err(|source| CtrlError::Io {
            op: "creating the runtime directory",
            source,
        })?;
        // Search (x) wherever the nodes are readable or writable.
        let mut dir_mode = 0o700 | node_mode;
        for shift in [0, 3] {
            if node_mode & (0o6 << shift) != 0 {
                dir_mode |= 0o1 << shift;
            }
        }
        rustix::fs::chmod(rundir, rustix::fs::Mode::from_raw_mode(dir_mode))
            .map_err(sys("chmod"))?;
        // Every endpoint costs the service one or two fds.
        iopath_sys::raise_fd_limit(None);
        let limits = Limits::new(
            opts.max_endpoints_per_client,
            opts.max_endpoints_per_uid,
            2 * fdept::SPARES as u64,
        );
        tracing::info!(
            target: "iopath_rpmsg",
            "endpoint service: at most {} endpoints per client, {} per user, {} fds in all",
            limits.per_client,
            limits.per_uid,
            limits.fd_budget
        );
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(sys("epoll_create"))?;
        let wake =
            eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(sys("eventfd"))?;
        epoll::add(
            &epoll,
            &wake,
            epoll::EventData::new_u64(WAKE),
            epoll::EventFlags::IN,
        )
        .map_err(sys("epoll_ctl"))?;
        let inner = Arc::new(Inner {
            bus,
            rundir: rundir.to_owned(),
            node_mode,
            limits,
            events: EventSet {
                epoll,
                wake,
                pass: Mutex::new(()),
                stopped: AtomicBool::new(false),
            },
            conns: Mutex::new(HashMap::default()),
            table: Mutex::new(Table::default()),
            next_id: AtomicU64::new(0),
            stalled: Mutex::new(HashMap::default()),
            due: Mutex::new(Due::default()),
            spares: Mutex::new(Vec::new()),
            n: Counters::default(),
        });
        let svc = EptService { inner };
        // The bus thread takes the event loop's work too: a
        // client's message reaches the ring, and the remote's answer the
        // client's socket, on one thread with no hand-off (with polling,
        // with no wake-up at all).
        svc.inner
            .bus
            .set_hook(Box::new(Hook {
                inner: Arc::downgrade(&svc.inner),
                batch: RecvBatch::new(svc.inner.bus.max_payload()),
            }))
            .map_err(|source| CtrlError::Io {
                op: "epoll_ctl",
                source,
            })?;
        // Once the link is down the bus thread stops and the hook with it:
        // a pump thread keeps serving the control connections (their
        // requests now fail with EPIPE) and the endpoints' hang-ups.
        let s2 = svc.clone();
        std::thread::Builder::new()
            .name("rpmsg-ept-pump".into())
            .spawn(move || {
                loop {
                    if s2.inner.events.stopped.load(Ordering::SeqCst) {
                        return;
                    }
                    if s2
                        .inner
                        .bus
                        .wait_down(Some(Duration::from_secs(1)))
                        .is_some()
                    {
                        break;
                    }
                }
                s2.pump();
            })
            .map_err(|source| CtrlError::Io {
                op: "spawn",
                source,
            })?;
        Ok(svc)
    }

    /// The runtime directory of the legacy nodes.
    pub(crate) fn rundir(&self) -> &Path {
        &self.inner.rundir
    }

    /// The bus the endpoints live on.
    pub(crate) fn bus(&self) -> &Bus {
        &self.inner.bus
    }

    /// Serves one parsed request on control connection `conn` (socket `c`).
    pub(crate) fn handle(&self, conn: u64, c: &OwnedFd, req: Request) {
        let uid = lock(&self.inner.conns)
            .get(&conn)
            .map_or(u32::MAX, |c| c.uid);
        let client = Client { conn, uid };
        match req {
            Request::CreateEpt(info) => legacy::handle_create(self, client, c, info),
            Request::CreateEptFd(info, flags) => fdept::handle_create(self, client, c, info, flags),
            Request::Stats => conn::answer(c, &self.stats().encode()),
        }
    }

    /// A STATS request on `c`: answered at the end of the event loop's
    /// pass, after one more look at the epoll set without waiting. A
    /// client's close of its endpoint fd queues the hang-up at once, so the
    /// answer counts every endpoint whose last fd was closed before the
    /// request was sent (a kernel endpoint is gone when its last close
    /// returns), where answering in turn would count them only after the
    /// rest of the connection's drain.
    pub(crate) fn defer_stats(&self, c: &Arc<OwnedFd>) {
        lock(&self.inner.due).stats.push(Arc::clone(c));
    }

    /// The counters and what is held right now.
    pub(crate) fn stats(&self) -> ServiceStats {
        let mut s = ServiceStats {
            tx_payload: self.inner.bus.max_payload() as u32,
            rx_payload: self.inner.bus.max_rx_payload() as u32,
            ..ServiceStats::default()
        };
        lock(&self.inner.table).count(&mut s);
        self.inner.n.count(&mut s);
        s
    }

    /// Ends the service: every control connection hung up, every endpoint
    /// destroyed, the pump thread gone.
    pub(crate) fn stop(&self) {
        self.inner.events.stopped.store(true, Ordering::SeqCst);
        let conns: Vec<(u64, Conn)> = lock(&self.inner.conns).drain().collect();
        for (conn, c) in conns {
            let _ = epoll::delete(&self.inner.events.epoll, &*c.fd);
            let _ = rustix::net::shutdown(&*c.fd, Shutdown::Both);
            self.client_closed(conn, false);
        }
        let ids: Vec<u64> = lock(&self.inner.table).epts.keys().copied().collect();
        for id in ids {
            self.destroy(id);
        }
        self.inner.wake();
    }
}
