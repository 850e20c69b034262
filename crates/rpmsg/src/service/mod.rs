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
mod event_loop;
mod fdept;
mod forward;
mod in_place;
mod legacy;
mod limits;
mod server;

pub use server::{CtrlOptions, CtrlServer};

use batch::RecvBatch;
use event_loop::Hook;
use iopath_sys::lock;
use limits::{Client, Limits, Usage};

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use foldhash::HashMap;
use rustix::event::epoll;
use rustix::event::{eventfd, EventfdFlags};
use rustix::net::{SendFlags, Shutdown};
use tracing::debug;

use crate::bus::{Bus, BusError, Endpoint, EndpointOptions, Event};
use crate::ctrl::proto::{EptInfo, Request, ServiceStats};
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

/// Where the bus thread delivers an endpoint's messages.
#[derive(Debug, Default)]
struct Sink {
    sock: Mutex<Option<Arc<OwnedFd>>>,
}

enum Kind {
    Fd,
    Legacy {
        index: u32,
        path: PathBuf,
        listener: OwnedFd,
        owner: u64,
    },
}

struct Ept {
    bus_ept: Endpoint,
    sink: Arc<Sink>,
    kind: Kind,
    /// Who made it: counted against its connection and user.
    client: Client,
}

impl Kind {
    /// The service's fds an endpoint of this kind may hold: its socket, or
    /// a node's listener and its open connection.
    fn fds(&self) -> u64 {
        match self {
            Kind::Fd => 1,
            Kind::Legacy { .. } => 2,
        }
    }
}

#[derive(Default)]
struct Table {
    epts: HashMap<u64, Ept>,
    node_indices: BTreeSet<u32>,
    by_client: HashMap<u64, Vec<u64>>,
    usage: Usage,
}

#[derive(Default)]
struct Counters {
    created: AtomicU64,
    destroyed: AtomicU64,
    bad_clients: AtomicU64,
    oversize: AtomicU64,
    too_large: AtomicU64,
    dropped: AtomicU64,
    msgs: AtomicU64,
    clients: AtomicU32,
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

struct Inner {
    bus: Bus,
    /// Held by whoever runs the event loop's pass: the pump thread, or on a
    /// polling bus its spinning thread until the link goes down and the
    /// fallback pump thread takes over.
    pass: Mutex<()>,
    conns: Mutex<HashMap<u64, Conn>>,
    /// Endpoints whose next message waits for a free bus buffer (their
    /// sockets out of the epoll set meanwhile): the loop never blocks on a
    /// remote that keeps its buffers.
    stalled: Mutex<HashMap<u64, Stalled>>,
    epoll: OwnedFd,
    wake: OwnedFd,
    table: Mutex<Table>,
    /// The last table entry id given out (ids start at 1).
    next_id: AtomicU64,
    doomed: Mutex<Vec<u64>>,
    /// Control connections whose STATS is answered at the end of the pass.
    stats_due: Mutex<Vec<Arc<OwnedFd>>>,
    spares: Mutex<Vec<fdept::Spare>>,
    rundir: PathBuf,
    node_mode: u32,
    limits: Limits,
    n: Counters,
    /// [`EptService::stop`] was called: the pump ends.
    stopped: std::sync::atomic::AtomicBool,
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
            pass: Mutex::new(()),
            conns: Mutex::new(HashMap::default()),
            stalled: Mutex::new(HashMap::default()),
            epoll,
            wake,
            table: Mutex::new(Table::default()),
            next_id: AtomicU64::new(0),
            doomed: Mutex::new(Vec::new()),
            stats_due: Mutex::new(Vec::new()),
            spares: Mutex::new(Vec::new()),
            rundir: rundir.to_owned(),
            node_mode,
            limits,
            n: Counters::default(),
            stopped: std::sync::atomic::AtomicBool::new(false),
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
                    if s2.inner.stopped.load(Ordering::SeqCst) {
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
        lock(&self.inner.stats_due).push(Arc::clone(c));
    }

    /// The counters and what is held right now.
    pub(crate) fn stats(&self) -> ServiceStats {
        let t = lock(&self.inner.table);
        let mut s = ServiceStats {
            tx_payload: self.inner.bus.max_payload() as u32,
            rx_payload: self.inner.bus.max_rx_payload() as u32,
            ..ServiceStats::default()
        };
        for e in t.epts.values() {
            match e.kind {
                Kind::Fd => s.fd_endpoints += 1,
                Kind::Legacy { .. } => {
                    s.legacy_endpoints += 1;
                    if lock(&e.sink.sock).is_some() {
                        s.open_nodes += 1;
                    }
                }
            }
        }
        drop(t);
        let n = &self.inner.n;
        s.clients = n.clients.load(Ordering::Relaxed);
        s.created = n.created.load(Ordering::Relaxed);
        s.destroyed = n.destroyed.load(Ordering::Relaxed);
        s.bad_clients = n.bad_clients.load(Ordering::Relaxed);
        s.oversize = n.oversize.load(Ordering::Relaxed);
        s.dropped = n.dropped.load(Ordering::Relaxed);
        s.too_large = n.too_large.load(Ordering::Relaxed);
        s.msgs = n.msgs.load(Ordering::Relaxed);
        s
    }

    /// Creates the bus endpoint for table entry `id` (its name moved into
    /// the bus), delivering into `sink`.
    fn bus_endpoint(&self, id: u64, info: EptInfo, sink: &Arc<Sink>) -> Result<Endpoint, i32> {
        let sink = Arc::clone(sink);
        let inner = Arc::downgrade(&self.inner);
        self.inner
            .bus
            .create_with_callback(
                EndpointOptions {
                    name: info.name,
                    src: info.src,
                    dst: info.dst,
                    announce: false,
                },
                move |_, ev| {
                    let Some(inner) = inner.upgrade() else { return };
                    match ev {
                        Event::Message(m) => {
                            let sock = lock(&sink.sock).clone();
                            let sent = sock.is_some_and(|s| {
                                rustix::net::send(
                                    &*s,
                                    &m.data,
                                    SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
                                )
                                .is_ok()
                            });
                            let c = if sent {
                                &inner.n.msgs
                            } else {
                                &inner.n.dropped
                            };
                            c.fetch_add(1, Ordering::Relaxed);
                        }
                        Event::Unbound { .. } | Event::LinkDown(_) => {
                            if let Some(s) = lock(&sink.sock).as_ref() {
                                let _ = rustix::net::shutdown(&**s, Shutdown::Both);
                            }
                            lock(&inner.doomed).push(id);
                            let _ = rustix::io::write(&inner.wake, &1u64.to_ne_bytes());
                        }
                    }
                },
            )
            .map_err(|e| errno_of(&e))
    }

    /// Adds `fd` (entry `id`'s socket of kind `tag`) to the epoll set.
    fn watch(&self, id: u64, fd: &OwnedFd, tag: u64) -> Result<(), i32> {
        epoll::add(
            &self.inner.epoll,
            fd,
            epoll::EventData::new_u64(id << 2 | tag),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        )
        .map_err(|e| e.raw_os_error())
    }

    /// Whether `client` may make one more endpoint of `kind`'s cost (see
    /// [`limits`]); the errno it is refused with if not.
    fn admit(&self, client: Client, fds: u64) -> Result<(), i32> {
        let conns = u64::from(self.inner.n.clients.load(Ordering::Relaxed));
        let r = lock(&self.inner.table)
            .usage
            .check(&self.inner.limits, client, fds, conns);
        if let Err(errno) = r {
            debug!(target: "iopath_rpmsg", "control client {} (uid {}): endpoint refused ({})",
                client.conn, client.uid, std::io::Error::from_raw_os_error(errno));
        }
        r
    }

    /// Adds a live endpoint (its socket already watched) to the table.
    fn insert(&self, id: u64, ept: Ept) {
        let mut t = lock(&self.inner.table);
        t.usage.add(ept.client, ept.kind.fds());
        if let Kind::Legacy { owner, .. } = ept.kind {
            t.by_client.entry(owner).or_default().push(id);
        }
        t.epts.insert(id, ept);
        // Counted under the table lock, so STATS is a consistent snapshot.
        self.inner.n.created.fetch_add(1, Ordering::Relaxed);
    }

    fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Destroys entry `id`: out of the table and the epoll set, node
    /// unlinked, socket shut down both ways (every copy of the client's fd
    /// sees a hang-up), bus endpoint and address released.
    fn destroy(&self, id: u64) {
        self.destroy_as(id, false);
    }

    /// As [`EptService::destroy`]; `peer_gone`: the client's end is closed,
    /// so nobody is left to hang up on and closing the socket drops its
    /// epoll registration by itself (two system calls fewer per cycle).
    fn destroy_as(&self, id: u64, peer_gone: bool) {
        let ept = {
            let mut t = lock(&self.inner.table);
            let Some(ept) = t.epts.remove(&id) else {
                return;
            };
            self.inner.n.destroyed.fetch_add(1, Ordering::Relaxed);
            t.usage.remove(ept.client, ept.kind.fds());
            if let Kind::Legacy { index, owner, .. } = &ept.kind {
                t.node_indices.remove(index);
                if let Some(v) = t.by_client.get_mut(owner) {
                    v.retain(|&x| x != id);
                    if v.is_empty() {
                        t.by_client.remove(owner);
                    }
                }
            }
            ept
        };
        if let Some(w) = lock(&self.inner.stalled).remove(&id) {
            self.inner
                .n
                .dropped
                .fetch_add(w.msgs.len() as u64, Ordering::Relaxed);
        }
        if let Kind::Legacy { path, listener, .. } = &ept.kind {
            let _ = epoll::delete(&self.inner.epoll, listener);
            let _ = std::fs::remove_file(path);
        }
        if let Some(s) = lock(&ept.sink.sock).take() {
            if !peer_gone {
                let _ = epoll::delete(&self.inner.epoll, &*s);
                let _ = rustix::net::shutdown(&*s, Shutdown::Both);
            }
        }
        debug!(target: "iopath_rpmsg", "endpoint {} destroyed", ept.bus_ept.addr());
        drop(ept);
    }

    /// Ends the service: every control connection hung up, every endpoint
    /// destroyed, the pump thread gone.
    pub(crate) fn stop(&self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        let conns: Vec<(u64, Conn)> = lock(&self.inner.conns).drain().collect();
        for (conn, c) in conns {
            let _ = epoll::delete(&self.inner.epoll, &*c.fd);
            let _ = rustix::net::shutdown(&*c.fd, Shutdown::Both);
            self.client_closed(conn, false);
        }
        let ids: Vec<u64> = lock(&self.inner.table).epts.keys().copied().collect();
        for id in ids {
            self.destroy(id);
        }
        let _ = rustix::io::write(&self.inner.wake, &1u64.to_ne_bytes());
    }
}
