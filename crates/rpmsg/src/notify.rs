//! Notifications between host and remote, behind one trait.
//!
//! - [`EventfdNotifier`]: a pair of eventfds (one per direction), created by
//!   the listening side and passed to the connecting side over a unix socket
//!   with `SCM_RIGHTS`; the socket stays open so that a peer that exits is
//!   noticed (hang-up).
//! - [`UnixByteNotifier`]: one `0x01` byte per kick on a unix stream socket;
//!   the receiver drains what is pending and rescans both rings. This is
//!   what OpenAMP's Linux demo does (`/tmp/openamp.event.0`; the remote
//!   listens, the host connects).
//! - [`PollNotifier`]: no notification at all; both sides rescan the rings.
//!
//! Which side listens: the remote (it also writes the resource table, as in
//! OpenAMP's demo); the host connects, retrying while the remote starts up.

use std::fmt;
use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use thiserror::Error;

/// Why a notifier failed.
#[derive(Debug, Error)]
pub enum NotifyError {
    /// A system call failed.
    #[error("{op} failed")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The peer closed its end.
    #[error("Peer closed the notification channel")]
    PeerGone,
    /// The peer sent something that is not an eventfd pair.
    #[error("Bad eventfd handshake: {0}")]
    Handshake(&'static str),
    /// No peer came within the time allowed.
    #[error("No peer on {path} within {secs} s")]
    Timeout {
        /// Socket path.
        path: PathBuf,
        /// Seconds waited.
        secs: u64,
    },
    /// Another remote listens on the socket path.
    #[error("{} is in use by another server", path.display())]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// The socket path is taken by a file that is not a socket.
    #[error("{} exists and is not a socket", path.display())]
    NotSocket {
        /// The path.
        path: PathBuf,
    },
    /// A `--notify` value that is not `eventfd:PATH`, `unix:PATH` or `poll`.
    #[error("Unknown notifier {0:?} (expected eventfd:PATH, unix:PATH or poll)")]
    Spec(String),
}

fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> NotifyError {
    move |source| NotifyError::Io { op, source }
}

fn errno(op: &'static str) -> impl FnOnce(rustix::io::Errno) -> NotifyError {
    move |e| NotifyError::Io {
        op,
        source: e.into(),
    }
}

/// What woke a [`Notifier::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The peer kicked (or the notifier polls: rescan anyway).
    Kicked,
    /// The timeout passed.
    Timeout,
}

/// One direction out, one direction in: tell the peer there is work, wait
/// until the peer says so.
pub trait Notifier: Send + Sync + fmt::Debug {
    /// Tells the peer to rescan the rings.
    ///
    /// # Errors
    /// [`NotifyError::PeerGone`] once the peer has closed its end.
    fn kick(&self) -> Result<(), NotifyError>;

    /// Waits for a kick from the peer, at most `timeout`; consumes every
    /// pending kick.
    ///
    /// # Errors
    /// [`NotifyError::PeerGone`] once the peer has closed its end.
    fn wait(&self, timeout: Duration) -> Result<Wake, NotifyError>;

    /// Whether this notifier only polls (the caller should spin and back
    /// off itself rather than sleep for long).
    fn is_polling(&self) -> bool {
        false
    }

    /// The fds that turn readable when the peer kicks or goes away, for a
    /// caller that waits on them among fds of its own (an epoll set, so
    /// one thread serves the rings and its other sources alike). Once one
    /// is readable, [`Notifier::wait`] with a zero timeout consumes what is
    /// pending and reports a peer gone. Empty for a notifier that polls.
    fn wait_fds(&self) -> Vec<BorrowedFd<'_>> {
        Vec::new()
    }

    /// Short name for logs and reports.
    fn kind(&self) -> &'static str;
}

fn timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(d.subsec_nanos()),
    }
}

/// Polls `fds` for input; returns which are readable or hung up.
fn poll_in(fds: &[BorrowedFd<'_>], timeout: Duration) -> Result<Vec<PollFlags>, NotifyError> {
    let mut pfds: Vec<PollFd<'_>> = fds.iter().map(|f| PollFd::new(f, PollFlags::IN)).collect();
    let ts = timespec(timeout);
    match poll(&mut pfds, Some(&ts)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => {}
        Err(e) => return Err(errno("poll")(e)),
    }
    Ok(pfds.iter().map(|p| p.revents()).collect())
}

/// One `0x01` byte per kick on a unix stream socket (OpenAMP Linux demo).
#[derive(Debug)]
pub struct UnixByteNotifier {
    sock: UnixStream,
}

impl UnixByteNotifier {
    /// Wraps a connected socket.
    ///
    /// # Errors
    /// [`NotifyError::Io`] if it cannot be made non-blocking.
    pub fn new(sock: UnixStream) -> Result<Self, NotifyError> {
        sock.set_nonblocking(true).map_err(io("set_nonblocking"))?;
        Ok(UnixByteNotifier { sock })
    }
}

impl Notifier for UnixByteNotifier {
    fn kick(&self) -> Result<(), NotifyError> {
        match rustix::net::send(
            &self.sock,
            &[1u8],
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        ) {
            // A full socket means the peer has kicks pending already.
            Ok(_) | Err(rustix::io::Errno::AGAIN) => Ok(()),
            Err(rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET) => {
                Err(NotifyError::PeerGone)
            }
            Err(e) => Err(errno("send")(e)),
        }
    }

    fn wait(&self, timeout: Duration) -> Result<Wake, NotifyError> {
        let mut buf = [0u8; 64];
        let mut got = false;
        loop {
            match (&self.sock).read(&mut buf) {
                Ok(0) if got => break,
                Ok(0) => return Err(NotifyError::PeerGone),
                Ok(_) => got = true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Err(NotifyError::PeerGone)
                }
                Err(e) => return Err(io("read")(e)),
            }
        }
        if got {
            return Ok(Wake::Kicked);
        }
        let r = poll_in(&[self.sock.as_fd()], timeout)?;
        if r[0].is_empty() {
            return Ok(Wake::Timeout);
        }
        // Drain; a hang-up is a zero-byte read, reported only once the
        // kicks before it were seen (the peer's last messages count).
        loop {
            match (&self.sock).read(&mut buf) {
                Ok(0) if got => break,
                Ok(0) => return Err(NotifyError::PeerGone),
                Ok(_) => got = true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Err(NotifyError::PeerGone)
                }
                Err(e) => return Err(io("read")(e)),
            }
        }
        Ok(if got { Wake::Kicked } else { Wake::Timeout })
    }

    fn wait_fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.sock.as_fd()]
    }

    fn kind(&self) -> &'static str {
        "unix"
    }
}

/// Magic of the eventfd-pair handshake ("IOPE").
const EVENTFD_MAGIC: [u8; 4] = *b"IOPE";

/// A pair of eventfds, one per direction, plus the socket they came over
/// (kept to notice the peer leaving).
#[derive(Debug)]
pub struct EventfdNotifier {
    kick_fd: OwnedFd,
    wait_fd: OwnedFd,
    sock: UnixStream,
}

impl EventfdNotifier {
    /// Listening side: creates both eventfds, sends them over `sock`
    /// (`[to listener, to connector]`) and keeps its own ends.
    ///
    /// # Errors
    /// [`NotifyError::Io`] if `eventfd` or `sendmsg` fails.
    pub fn offer(sock: UnixStream) -> Result<Self, NotifyError> {
        let to_listener =
            eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(errno("eventfd"))?;
        let to_connector =
            eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(errno("eventfd"))?;
        let fds = [to_listener.as_fd(), to_connector.as_fd()];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut anc = SendAncillaryBuffer::new(&mut space);
        anc.push(SendAncillaryMessage::ScmRights(&fds));
        sendmsg(
            &sock,
            &[IoSlice::new(&EVENTFD_MAGIC)],
            &mut anc,
            SendFlags::NOSIGNAL,
        )
        .map_err(errno("sendmsg(SCM_RIGHTS)"))?;
        Ok(EventfdNotifier {
            kick_fd: to_connector,
            wait_fd: to_listener,
            sock,
        })
    }

    /// Connecting side: receives the pair sent by [`EventfdNotifier::offer`].
    ///
    /// # Errors
    /// [`NotifyError::Handshake`] if the peer sent anything else.
    pub fn accept(sock: UnixStream) -> Result<Self, NotifyError> {
        let mut msg = [0u8; 4];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut anc = RecvAncillaryBuffer::new(&mut space);
        let got = match recvmsg(
            &sock,
            &mut [IoSliceMut::new(&mut msg)],
            &mut anc,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            // The listener closed before it offered: a remote that was
            // dying when it was connected to (see NotifySpec::connect).
            Ok(r) if r.bytes == 0 => return Err(NotifyError::PeerGone),
            Err(rustix::io::Errno::CONNRESET) => return Err(NotifyError::PeerGone),
            r => r.map_err(errno("recvmsg(SCM_RIGHTS)"))?,
        };
        let mut fds = Vec::new();
        for m in anc.drain() {
            if let RecvAncillaryMessage::ScmRights(r) = m {
                fds.extend(r);
            }
        }
        if got.bytes != 4 || msg != EVENTFD_MAGIC {
            return Err(NotifyError::Handshake("not an iopath eventfd pair"));
        }
        if fds.len() != 2 {
            return Err(NotifyError::Handshake("expected two file descriptors"));
        }
        let to_connector = fds.pop().expect("two fds");
        let to_listener = fds.pop().expect("two fds");
        for fd in [&to_listener, &to_connector] {
            let st = rustix::fs::fstat(fd).map_err(errno("fstat"))?;
            // eventfds are anonymous inodes: neither regular files nor sockets.
            if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Socket {
                return Err(NotifyError::Handshake(
                    "a socket where an eventfd was expected",
                ));
            }
        }
        Ok(EventfdNotifier {
            kick_fd: to_listener,
            wait_fd: to_connector,
            sock,
        })
    }

    fn drain(&self) -> Result<bool, NotifyError> {
        let mut v = [0u8; 8];
        match rustix::io::read(&self.wait_fd, &mut v) {
            Ok(8) => Ok(true),
            Ok(_) => Ok(false),
            Err(rustix::io::Errno::AGAIN) => Ok(false),
            Err(e) => Err(errno("read(eventfd)")(e)),
        }
    }
}

impl Notifier for EventfdNotifier {
    fn kick(&self) -> Result<(), NotifyError> {
        match rustix::io::write(&self.kick_fd, &1u64.to_ne_bytes()) {
            Ok(_) | Err(rustix::io::Errno::AGAIN) => Ok(()),
            Err(e) => Err(errno("write(eventfd)")(e)),
        }
    }

    fn wait(&self, timeout: Duration) -> Result<Wake, NotifyError> {
        if self.drain()? {
            return Ok(Wake::Kicked);
        }
        let r = poll_in(&[self.wait_fd.as_fd(), self.sock.as_fd()], timeout)?;
        // A kick before a hang-up is reported first: the peer's last
        // messages are in the rings.
        if self.drain()? {
            return Ok(Wake::Kicked);
        }
        if !r[1].is_empty() {
            // The socket carries nothing after the handshake: readable
            // means end of file, i.e. the peer is gone.
            let mut b = [0u8; 16];
            if matches!((&self.sock).read(&mut b), Ok(0) | Err(_)) {
                return Err(NotifyError::PeerGone);
            }
        }
        Ok(Wake::Timeout)
    }

    fn wait_fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.wait_fd.as_fd(), self.sock.as_fd()]
    }

    fn kind(&self) -> &'static str {
        "eventfd"
    }
}

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

/// Busy-polling that shares its core well: spin, then yield, then spin.
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
pub struct PollSpin {
    window: Duration,
    until: Option<Instant>,
}

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
        PollSpin {
            window,
            until: None,
        }
    }

    /// The last poll found work: the next empty one yields at once.
    pub fn worked(&mut self) {
        self.until = None;
    }

    /// The last poll found nothing: yields the core, or goes on spinning
    /// while the window since the last yield lasts.
    pub fn idle(&mut self) {
        if self.until.is_some_and(|t| Instant::now() < t) {
            std::hint::spin_loop();
            return;
        }
        std::thread::yield_now();
        self.until = Some(Instant::now() + self.window);
    }
}

impl Default for PollSpin {
    fn default() -> PollSpin {
        PollSpin::new()
    }
}

/// How host and remote notify each other, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifySpec {
    /// `eventfd:PATH`: an eventfd pair handed over on the unix socket PATH.
    Eventfd(PathBuf),
    /// `unix:PATH`: one byte per kick on the unix socket PATH.
    Unix(PathBuf),
    /// `poll`: no notifications.
    Poll,
}

impl FromStr for NotifySpec {
    type Err = NotifyError;

    fn from_str(s: &str) -> Result<Self, NotifyError> {
        if s == "poll" {
            Ok(NotifySpec::Poll)
        } else if let Some(p) = s.strip_prefix("eventfd:").filter(|p| !p.is_empty()) {
            Ok(NotifySpec::Eventfd(p.into()))
        } else if let Some(p) = s.strip_prefix("unix:").filter(|p| !p.is_empty()) {
            Ok(NotifySpec::Unix(p.into()))
        } else {
            Err(NotifyError::Spec(s.to_owned()))
        }
    }
}

impl fmt::Display for NotifySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotifySpec::Eventfd(p) => write!(f, "eventfd:{}", p.display()),
            NotifySpec::Unix(p) => write!(f, "unix:{}", p.display()),
            NotifySpec::Poll => f.write_str("poll"),
        }
    }
}

/// A bound listening socket for the remote side; bind it before announcing
/// readiness so the host's connect cannot race the bind.
#[derive(Debug)]
pub struct NotifyListener {
    spec: NotifySpec,
    listener: Option<UnixListener>,
}

impl NotifySpec {
    /// Remote side, step 1: binds the socket (replacing a stale one).
    ///
    /// # Errors
    /// [`NotifyError::InUse`] if another remote listens there,
    /// [`NotifyError::NotSocket`] for another kind of file,
    /// [`NotifyError::Io`] if the socket cannot be bound.
    pub fn bind(&self) -> Result<NotifyListener, NotifyError> {
        let listener = match self {
            NotifySpec::Eventfd(p) | NotifySpec::Unix(p) => {
                use crate::claim::{claim, Refusal};
                claim(p, rustix::net::SocketType::STREAM).map_err(|r| match r {
                    Refusal::InUse => NotifyError::InUse { path: p.clone() },
                    Refusal::NotSocket => NotifyError::NotSocket { path: p.clone() },
                    Refusal::Io(op, source) => NotifyError::Io { op, source },
                })?;
                Some(UnixListener::bind(p).map_err(io("bind"))?)
            }
            NotifySpec::Poll => None,
        };
        Ok(NotifyListener {
            spec: self.clone(),
            listener,
        })
    }

    /// Host side: connects, retrying for up to `timeout` while the remote
    /// starts.
    ///
    /// # Errors
    /// [`NotifyError::Timeout`] if nobody listens in time, or a handshake
    /// error.
    pub fn connect(&self, timeout: Duration) -> Result<Box<dyn Notifier>, NotifyError> {
        let path = match self {
            NotifySpec::Poll => return Ok(Box::new(PollNotifier)),
            NotifySpec::Eventfd(p) | NotifySpec::Unix(p) => p,
        };
        let start = Instant::now();
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            let sock = connect_retry(path, left)?;
            return Ok(match self {
                NotifySpec::Eventfd(_) => match EventfdNotifier::accept(sock) {
                    Ok(n) => Box::new(n),
                    // A remote killed a moment ago closes its listener
                    // last: a connect in between is queued, then reset.
                    // The next remote is on its way; retry.
                    Err(NotifyError::PeerGone) if !left.is_zero() => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    Err(e) => return Err(e),
                },
                _ => Box::new(UnixByteNotifier::new(sock)?),
            });
        }
    }
}

impl NotifyListener {
    /// The socket path, if the notifier has one.
    pub fn path(&self) -> Option<&Path> {
        match &self.spec {
            NotifySpec::Eventfd(p) | NotifySpec::Unix(p) => Some(p),
            NotifySpec::Poll => None,
        }
    }

    /// Remote side, step 2: waits for the host to connect (no time limit).
    /// The listener stays bound, so a host that comes later (after this
    /// one went) can connect again, and a second remote is refused.
    ///
    /// # Errors
    /// [`NotifyError::Io`] if `accept` fails, a handshake error if the
    /// connection is not a host (e.g. another server's probe).
    pub fn accept(&self) -> Result<Box<dyn Notifier>, NotifyError> {
        let Some(l) = &self.listener else {
            return Ok(Box::new(PollNotifier));
        };
        let (sock, _) = l.accept().map_err(io("accept"))?;
        Ok(match self.spec {
            NotifySpec::Eventfd(_) => Box::new(EventfdNotifier::offer(sock)?),
            _ => Box::new(UnixByteNotifier::new(sock)?),
        })
    }
}

fn connect_retry(path: &Path, timeout: Duration) -> Result<UnixStream, NotifyError> {
    let start = Instant::now();
    let mut delay = Duration::from_millis(1);
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) =>
            {
                if start.elapsed() >= timeout {
                    return Err(NotifyError::Timeout {
                        path: path.to_owned(),
                        secs: timeout.as_secs(),
                    });
                }
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(io("connect")(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_poller_yields_after_work_and_spins_its_window_after_a_yield() {
        let mut p = PollSpin::with_window(Duration::from_secs(3600));
        // Nothing yet: the first empty poll yields and opens the window.
        assert!(p.until.is_none());
        p.idle();
        let opened = p.until.expect("a yield opens the window");
        assert!(opened > Instant::now() + Duration::from_secs(3500));
        // Within the window empty polls spin: the window stays as it was.
        p.idle();
        assert_eq!(p.until, Some(opened));
        // Work closes it: the next empty poll yields again, a new window.
        p.worked();
        assert!(p.until.is_none());
        p.idle();
        assert!(p.until.is_some_and(|t| t > opened));
        // A zero window yields on every empty poll.
        let mut z = PollSpin::with_window(Duration::ZERO);
        z.idle();
        let t = z.until.unwrap();
        z.idle();
        assert!(z.until.unwrap() > t);
    }

    /// Runs the shared behaviour checks against a connected pair.
    fn exercise(a: &dyn Notifier, b: &dyn Notifier) {
        assert_eq!(b.wait(Duration::from_millis(10)).unwrap(), Wake::Timeout);
        a.kick().unwrap();
        a.kick().unwrap();
        assert_eq!(b.wait(Duration::from_secs(5)).unwrap(), Wake::Kicked);
        // Both kicks were consumed by one wait.
        assert_eq!(b.wait(Duration::from_millis(10)).unwrap(), Wake::Timeout);
        b.kick().unwrap();
        assert_eq!(a.wait(Duration::from_secs(5)).unwrap(), Wake::Kicked);
        // Across threads.
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                a.kick().unwrap();
            });
            assert_eq!(b.wait(Duration::from_secs(5)).unwrap(), Wake::Kicked);
        });
    }

    fn pair(spec: NotifySpec) -> (Box<dyn Notifier>, Box<dyn Notifier>) {
        let l = spec.bind().unwrap();
        std::thread::scope(|s| {
            let h = s.spawn(|| spec.connect(Duration::from_secs(5)).unwrap());
            let remote = l.accept().unwrap();
            (remote, h.join().unwrap())
        })
    }

    #[test]
    fn unix_byte_and_eventfd() {
        let dir = tempfile::tempdir().unwrap();
        for spec in [
            NotifySpec::Unix(dir.path().join("u")),
            NotifySpec::Eventfd(dir.path().join("e")),
        ] {
            let (remote, host) = pair(spec.clone());
            exercise(&*remote, &*host);
            drop(remote);
            assert!(
                matches!(
                    host.wait(Duration::from_secs(5)),
                    Err(NotifyError::PeerGone)
                ),
                "{spec}"
            );
        }
    }

    #[test]
    fn poll_always_rescans() {
        let p = PollNotifier;
        p.kick().unwrap();
        assert_eq!(p.wait(Duration::ZERO).unwrap(), Wake::Kicked);
        assert!(p.is_polling());
    }

    #[test]
    fn spec_parsing() {
        assert_eq!("poll".parse::<NotifySpec>().unwrap(), NotifySpec::Poll);
        assert_eq!(
            "unix:/tmp/openamp.event.0".parse::<NotifySpec>().unwrap(),
            NotifySpec::Unix("/tmp/openamp.event.0".into())
        );
        assert_eq!(
            "eventfd:/x".parse::<NotifySpec>().unwrap().to_string(),
            "eventfd:/x"
        );
        assert!("unix:".parse::<NotifySpec>().is_err());
        assert!("tcp:1".parse::<NotifySpec>().is_err());
    }

    #[test]
    fn eventfd_handshake_refuses_garbage() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"nope").unwrap();
        assert!(matches!(
            EventfdNotifier::accept(b),
            Err(NotifyError::Handshake(_))
        ));
    }

    #[test]
    fn connect_retries_a_listener_that_closes_before_offering() {
        // The first connection is dropped unanswered, as by a remote that
        // was killed with the host's connect queued; the second is offered
        // a pair. The host must end up with the second, not an error.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ev");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let t = std::thread::spawn(move || {
            drop(l.accept().unwrap());
            let (s, _) = l.accept().unwrap();
            EventfdNotifier::offer(s).unwrap()
        });
        let host = NotifySpec::Eventfd(path)
            .connect(Duration::from_secs(5))
            .unwrap();
        let remote = t.join().unwrap();
        exercise(host.as_ref(), &remote);
    }

    #[test]
    fn connect_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let spec = NotifySpec::Unix(dir.path().join("none"));
        assert!(matches!(
            spec.connect(Duration::from_millis(30)),
            Err(NotifyError::Timeout { .. })
        ));
    }
}
