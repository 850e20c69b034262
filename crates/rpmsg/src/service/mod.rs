//! The endpoint service: the user-space counterpart of `/dev/rpmsg_ctrlN`,
//! run by the bus owner behind its control socket.
//!
//! ```text
//!  accept thread: accept ─► add_client (into the event loop's epoll set)
//!
//!  event loop (epoll), run by the bus's service thread (a bus hook)
//!    the bus notifier's fds readable ─► the bus takes the kicks, passes the rings
//!    control connection readable ─► CREATE_EPT ─► legacy::create
//!                                   CREATE_EPT_FD ─► fdept::create
//!                                   STATS (answered at the end of the pass,
//!                                     after a look at the hang-ups),
//!                                   garbage (closed), ATTACH (own thread)
//!    listener readable ─► accept, greet (0 | -EBUSY)
//!    endpoint socket readable ─► one message, then up to 16 per recvmmsg ─►
//!        Endpoint::try_send (bus) each; no free buffer: the message and the
//!        rest of its batch wait, the socket out of the set, retried every 1 ms
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
//! On a polling bus the spinning service thread takes the epoll work on
//! every pass, so a client's message reaches the ring without any wake-up.
//!
//! Message size: a write over 496 bytes cannot fail in the writer's
//! `write(2)` by anything the service does after the fact. The client's
//! end gets the smallest send buffer the kernel allows, so the kernel
//! refuses (`EMSGSIZE`) what exceeds it (4576 bytes on Linux 6.18);
//! [`crate::ctrl::EptFd::send`] and the preload library refuse anything
//! over 496 with `EMSGSIZE` before it is sent. A raw client's message of
//! 497..=4576 bytes still reaches the service: it is not dropped silently
//! but ends the endpoint (counted in `oversize`, one warning), so the
//! writer's next read or write fails (`EPIPE`; a raw `read(2)` sees end of
//! file) and poll reports a hang-up: the loss is visible, as a protocol
//! error, instead of a message that vanished.

mod attach;
mod batch;
mod conn;
mod fdept;
mod legacy;
mod server;

pub use server::{CtrlOptions, CtrlServer};

use batch::{RecvBatch, BATCH};

use std::collections::BTreeSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use foldhash::HashMap;
use rustix::event::epoll;
use rustix::event::{eventfd, EventfdFlags};
use rustix::net::{SendFlags, Shutdown};
use tracing::{debug, warn};

use crate::bus::{
    Bus, BusError, Endpoint, EndpointOptions, EndpointRef, Event, HookRun, ServiceHook,
};
use crate::ctrl::proto::{EptInfo, Request, ServiceStats};
use crate::ctrl::CtrlError;
use crate::wire::MAX_PAYLOAD;

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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

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
}

#[derive(Default)]
struct Table {
    epts: HashMap<u64, Ept>,
    node_indices: BTreeSet<u32>,
    by_client: HashMap<u64, Vec<u64>>,
}

#[derive(Default)]
struct Counters {
    created: AtomicU64,
    destroyed: AtomicU64,
    bad_clients: AtomicU64,
    oversize: AtomicU64,
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
    pub(crate) fn start(bus: Bus, rundir: &Path, node_mode: u32) -> Result<Self, CtrlError> {
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
        raise_fd_limit();
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
            n: Counters::default(),
            stopped: std::sync::atomic::AtomicBool::new(false),
        });
        let svc = EptService { inner };
        // The bus's service thread takes the event loop's work too: a
        // client's message reaches the ring, and the remote's answer the
        // client's socket, on one thread with no hand-off (with polling,
        // with no wake-up at all).
        svc.inner
            .bus
            .set_hook(Box::new(Hook {
                inner: Arc::downgrade(&svc.inner),
                batch: RecvBatch::new(),
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
        match req {
            Request::CreateEpt(info) => legacy::handle_create(self, conn, c, info),
            Request::CreateEptFd(info, flags) => fdept::handle_create(self, c, info, flags),
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
        let mut s = ServiceStats::default();
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

    /// Adds a live endpoint (its socket already watched) to the table.
    fn insert(&self, id: u64, ept: Ept) {
        let mut t = lock(&self.inner.table);
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

    fn pump(&self) {
        let mut buf = RecvBatch::new();
        loop {
            if self.inner.stopped.load(Ordering::SeqCst) {
                return;
            }
            let pass = lock(&self.inner.pass);
            let r = self.pump_once(None, &mut buf);
            drop(pass);
            if let Err(e) = r {
                warn!(target: "iopath_rpmsg", "endpoint service: epoll failed: {e}");
                return;
            }
        }
    }

    /// Handles what the epoll set reports, waiting for it up to `timeout`
    /// (`None`: until something comes; messages waiting for a bus buffer
    /// cut any wait to [`RETRY_EVERY`]); returns whether there was
    /// anything, and whether the bus notifier's fds (attached by the
    /// [`Hook`]) were among it.
    fn pump_once(
        &self,
        timeout: Option<Duration>,
        buf: &mut RecvBatch,
    ) -> Result<(bool, bool), rustix::io::Errno> {
        if self.inner.stopped.load(Ordering::SeqCst) {
            return Ok((false, false));
        }
        let mut space = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 64];
        let stalled = !lock(&self.inner.stalled).is_empty();
        let timeout = match (timeout, stalled) {
            (Some(t), true) => Some(t.min(RETRY_EVERY)),
            (None, true) => Some(RETRY_EVERY),
            (t, false) => t,
        };
        let ts = timeout.map(|t| rustix::event::Timespec {
            tv_sec: t.as_secs() as i64,
            tv_nsec: i64::from(t.subsec_nanos()),
        });
        let events = match epoll::wait(&self.inner.epoll, &mut space[..], ts.as_ref()) {
            Ok((events, _)) => events,
            Err(rustix::io::Errno::INTR) => return Ok((false, false)),
            Err(e) => return Err(e),
        };
        let worked = !events.is_empty();
        let mut kicked = self.dispatch(events, buf, true);
        if !lock(&self.inner.stats_due).is_empty() {
            kicked |= self.settle(buf)?;
            let due = std::mem::take(&mut *lock(&self.inner.stats_due));
            let answer = self.stats().encode();
            for c in due {
                conn::answer(&c, &answer);
            }
        }
        let retried = stalled && self.retry_stalled();
        Ok((worked || retried, kicked))
    }

    /// Handles one `epoll_wait`'s events (the control connections and
    /// legacy listeners only if `ctrl`); returns whether the bus notifier's
    /// fds were among them.
    ///
    /// The endpoints' sockets go first, the control connections and
    /// listeners after them: a hang-up reported with a request is destroyed
    /// before the request's answer puts an fd in flight, since closing a
    /// unix socket while one is in flight queues the kernel's unix garbage
    /// collector (about one cycle in 35 when the answers went first).
    fn dispatch(&self, events: &[epoll::Event], buf: &mut RecvBatch, ctrl: bool) -> bool {
        let mut kicked = false;
        let mut later = false;
        for ev in events {
            let token = ev.data.u64();
            if token == NOTIFIER {
                kicked = true;
                continue;
            }
            if token == WAKE {
                let mut b = [0u8; 8];
                let _ = rustix::io::read(&self.inner.wake, &mut b);
                let doomed = std::mem::take(&mut *lock(&self.inner.doomed));
                for id in doomed {
                    self.destroy(id);
                }
                continue;
            }
            let (id, tag) = (token >> 2, token & 3);
            match tag {
                TAG_LISTENER | TAG_CTRL => later = true,
                _ => self.forward(id, ev.flags, buf),
            }
        }
        // Level-triggered: without `ctrl` they are reported again by the
        // next wait.
        if later && ctrl {
            for ev in events {
                let token = ev.data.u64();
                if token == NOTIFIER || token == WAKE {
                    continue;
                }
                let (id, tag) = (token >> 2, token & 3);
                match tag {
                    TAG_LISTENER => legacy::accept(self, id),
                    TAG_CTRL => self.ctrl_readable(id, buf.scratch()),
                    _ => {}
                }
            }
        }
        kicked
    }

    /// Takes what the epoll set has ready, without waiting, up to
    /// [`SETTLE_WAITS`] full waits: the endpoints' messages and hang-ups
    /// (a deferred STATS answer then counts them); control connections
    /// wait for the next pass, so no answer overtakes the deferred ones.
    /// Returns whether the bus notifier's fds were among it.
    fn settle(&self, buf: &mut RecvBatch) -> Result<bool, rustix::io::Errno> {
        let mut space = [std::mem::MaybeUninit::<epoll::Event>::uninit(); SETTLE_EVENTS];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let mut kicked = false;
        for _ in 0..SETTLE_WAITS {
            let events = match epoll::wait(&self.inner.epoll, &mut space[..], Some(&zero)) {
                Ok((events, _)) => events,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e),
            };
            let full = events.len() == SETTLE_EVENTS;
            kicked |= self.dispatch(events, buf, false);
            if !full {
                break;
            }
        }
        Ok(kicked)
    }

    /// Tries again every message waiting for a bus buffer; an endpoint
    /// whose message went gets its socket back in the epoll set. Returns
    /// whether any went.
    fn retry_stalled(&self) -> bool {
        let ids: Vec<u64> = lock(&self.inner.stalled).keys().copied().collect();
        let mut any = false;
        for id in ids {
            let Some((sock, ep)) = ({
                let t = lock(&self.inner.table);
                t.epts
                    .get(&id)
                    .map(|e| (lock(&e.sink.sock).clone(), e.bus_ept.handle()))
            }) else {
                lock(&self.inner.stalled).remove(&id);
                continue;
            };
            let mut st = lock(&self.inner.stalled);
            let Some(waiting) = st.get_mut(&id) else {
                continue;
            };
            let gave_up = waiting.since.elapsed() >= SEND_WAIT;
            let mut link_down = false;
            while let Some(msg) = waiting.msgs.front() {
                match ep.try_send(msg) {
                    Err(BusError::WouldBlock) if !gave_up => break,
                    Ok(()) => {
                        self.inner.n.msgs.fetch_add(1, Ordering::Relaxed);
                        any = true;
                    }
                    Err(BusError::LinkDown(_)) => {
                        link_down = true;
                        break;
                    }
                    Err(e) => {
                        self.inner.n.dropped.fetch_add(1, Ordering::Relaxed);
                        debug!(target: "iopath_rpmsg", "endpoint {}: message dropped: {e}", ep.addr());
                    }
                }
                waiting.msgs.pop_front();
            }
            if link_down {
                st.remove(&id);
                drop(st);
                lock(&self.inner.doomed).push(id);
                let _ = rustix::io::write(&self.inner.wake, &1u64.to_ne_bytes());
                continue;
            }
            if !waiting.msgs.is_empty() {
                continue;
            }
            let then_end = waiting.then_end;
            st.remove(&id);
            drop(st);
            if then_end {
                self.destroy(id);
                continue;
            }
            // Reading resumes: what the client wrote meanwhile (or its
            // close) is reported again.
            if let Some(sock) = sock {
                let _ = self.watch(id, &sock, TAG_SOCK);
            }
        }
        any
    }

    /// Takes what the client wrote on endpoint `id`'s socket to the bus.
    fn forward(&self, id: u64, flags: epoll::EventFlags, batch: &mut RecvBatch) {
        let (sock, ep, legacy) = {
            let t = lock(&self.inner.table);
            let Some(e) = t.epts.get(&id) else { return };
            let Some(s) = lock(&e.sink.sock).clone() else {
                return;
            };
            (s, e.bus_ept.handle(), matches!(e.kind, Kind::Legacy { .. }))
        };
        if lock(&self.inner.stalled).contains_key(&id) {
            return;
        }
        let hup = flags.intersects(epoll::EventFlags::HUP | epoll::EventFlags::RDHUP);
        // One message first: a lone message (a ping-pong) is taken as
        // cheaply as by recv(2), and only a socket that had one has more
        // asked for, up to a batch at a time.
        let mut max = 1;
        let mut taken = 0;
        while taken < DRAIN {
            let k = match batch.recv(sock.as_fd(), max) {
                Ok(k) => k,
                Err(rustix::io::Errno::AGAIN) => return,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return self.end_of_file(id, legacy, &sock, flags),
            };
            for i in 0..k {
                let (data, full) = batch.get(i);
                if full == 0 && hup {
                    return self.end_of_file(id, legacy, &sock, flags);
                }
                if full > MAX_PAYLOAD {
                    // Not dropped silently: the endpoint ends, so the
                    // writer's next call fails (see the module doc).
                    self.oversize(&ep, full);
                    return self.destroy(id);
                }
                if !self.to_bus(id, &ep, &sock, data) {
                    // The rest of the batch, already off the socket,
                    // waits behind it.
                    self.stall_rest(id, &ep, batch, i + 1..k, hup);
                    return;
                }
            }
            if k < max {
                return; // the socket is empty
            }
            taken += k;
            max = BATCH;
        }
    }

    /// One oversized message on `ep`: counted and logged.
    fn oversize(&self, ep: &EndpointRef, full: usize) {
        self.inner.n.oversize.fetch_add(1, Ordering::Relaxed);
        warn!(target: "iopath_rpmsg", "endpoint {}: {full}-byte message (max {MAX_PAYLOAD}): endpoint hung up", ep.addr());
    }

    /// Queues messages `rest` of `batch` behind endpoint `id`'s stalled
    /// one, up to an end of file (reported again once the socket is
    /// watched again) or an oversized message (the endpoint then ends
    /// once the queue went).
    fn stall_rest(
        &self,
        id: u64,
        ep: &EndpointRef,
        batch: &RecvBatch,
        rest: std::ops::Range<usize>,
        hup: bool,
    ) {
        let mut st = lock(&self.inner.stalled);
        let Some(waiting) = st.get_mut(&id) else {
            return;
        };
        for i in rest {
            let (data, full) = batch.get(i);
            if full == 0 && hup {
                return;
            }
            if full > MAX_PAYLOAD {
                self.oversize(ep, full);
                waiting.then_end = true;
                return;
            }
            waiting.msgs.push_back(data.to_vec());
        }
    }

    /// Sends one message of endpoint `id`; returns false when it has to
    /// wait for a bus buffer (the socket then leaves the epoll set until
    /// [`EptService::retry_stalled`] sends it).
    fn to_bus(&self, id: u64, ep: &EndpointRef, sock: &OwnedFd, data: &[u8]) -> bool {
        match ep.try_send(data) {
            Ok(()) => {
                self.inner.n.msgs.fetch_add(1, Ordering::Relaxed);
            }
            Err(BusError::WouldBlock) => {
                let _ = epoll::delete(&self.inner.epoll, sock);
                lock(&self.inner.stalled).insert(
                    id,
                    Stalled {
                        msgs: std::collections::VecDeque::from([data.to_vec()]),
                        then_end: false,
                        since: std::time::Instant::now(),
                    },
                );
                return false;
            }
            Err(BusError::LinkDown(r)) => {
                debug!(target: "iopath_rpmsg", "endpoint {}: link down ({r})", ep.addr());
                let _ = rustix::net::shutdown(sock, Shutdown::Both);
                lock(&self.inner.doomed).push(id);
                let _ = rustix::io::write(&self.inner.wake, &1u64.to_ne_bytes());
            }
            Err(e) => {
                self.inner.n.dropped.fetch_add(1, Ordering::Relaxed);
                debug!(target: "iopath_rpmsg", "endpoint {}: message dropped: {e}", ep.addr());
            }
        }
        true
    }

    /// The client's side of endpoint `id` ended: the last copy of an fd
    /// endpoint closed (destroy), a legacy node's opener shut its writing
    /// side (destroy) or closed it (release the open).
    fn end_of_file(&self, id: u64, legacy: bool, sock: &OwnedFd, flags: epoll::EventFlags) {
        let closed = flags.contains(epoll::EventFlags::HUP);
        if legacy && closed {
            legacy::release(self, id, sock);
        } else {
            self.destroy_as(id, closed && !legacy);
        }
    }
}

/// The event loop, run by the bus's service thread (see [`Bus::set_hook`]).
struct Hook {
    inner: Weak<Inner>,
    batch: RecvBatch,
}

impl ServiceHook for Hook {
    fn attach(&mut self, notifier: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        let Some(inner) = self.inner.upgrade() else {
            return Ok(());
        };
        for fd in notifier {
            epoll::add(
                &inner.epoll,
                fd,
                epoll::EventData::new_u64(NOTIFIER),
                epoll::EventFlags::IN,
            )?;
        }
        Ok(())
    }

    fn run(&mut self, timeout: Duration) -> HookRun {
        let Some(inner) = self.inner.upgrade() else {
            return HookRun {
                done: true,
                ..HookRun::default()
            };
        };
        if inner.stopped.load(Ordering::SeqCst) {
            return HookRun {
                done: true,
                ..HookRun::default()
            };
        }
        // Held by the fallback pump once the link is down: the bus thread
        // is on its way out then.
        let Ok(_pass) = inner.pass.try_lock() else {
            return HookRun::default();
        };
        match (EptService {
            inner: Arc::clone(&inner),
        })
        .pump_once(Some(timeout), &mut self.batch)
        {
            Ok((worked, kicked)) => HookRun {
                worked,
                kicked,
                done: false,
            },
            Err(e) => {
                warn!(target: "iopath_rpmsg", "endpoint service: epoll failed: {e}");
                HookRun {
                    done: true,
                    ..HookRun::default()
                }
            }
        }
    }

    fn detach(&mut self, notifier: &[BorrowedFd<'_>]) {
        if let Some(inner) = self.inner.upgrade() {
            for fd in notifier {
                let _ = epoll::delete(&inner.epoll, fd);
            }
        }
    }
}

/// Raises the soft open-file limit to the hard one: every endpoint costs
/// the service one or two fds.
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut r = getrlimit(Resource::Nofile);
    if r.current < r.maximum {
        r.current = r.maximum;
        let _ = setrlimit(Resource::Nofile, r);
    }
}
