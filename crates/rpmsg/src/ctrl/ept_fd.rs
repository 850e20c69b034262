//! An endpoint as a client holds it ([`EptFd`]): an fd the service handed
//! over, an opened legacy node, or one inherited from a parent; rpmsg_char
//! semantics on top of its `SOCK_SEQPACKET` socket.

use std::io::IoSlice;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{RecvFlags, SendFlags, Shutdown, SocketFlags};

use super::client::{connect, errno_err, gone_is_pipe, retry_intr, wait_readable, ANSWER_TIMEOUT};
use super::proto::{self, EptInfo, OPEN_REPLY_LEN, OP_OPEN};
use super::{sys, CtrlError};
use crate::wire::MAX_PAYLOAD;

/// Makes `cmd` inherit endpoint fd `fd` (one that is not close-on-exec, as
/// [`EptFd::into_fd`] gives it): its number in `IOPATH_RPMSG_FD`, where
/// the command takes it with [`EptFd::inherited`], its addresses in
/// `IOPATH_RPMSG_SRC` and `IOPATH_RPMSG_DST`, and a legacy endpoint's node
/// in `IOPATH_RPMSG_NODE`.
pub fn hand_to_command<'c>(
    cmd: &'c mut std::process::Command,
    fd: BorrowedFd<'_>,
    info: &EptInfo,
    node: Option<&Path>,
) -> &'c mut std::process::Command {
    use std::os::fd::AsRawFd;
    cmd.env("IOPATH_RPMSG_FD", fd.as_raw_fd().to_string())
        .env("IOPATH_RPMSG_SRC", info.src.to_string())
        .env("IOPATH_RPMSG_DST", info.dst.to_string());
    if let Some(p) = node {
        cmd.env("IOPATH_RPMSG_NODE", p);
    }
    cmd
}

/// An endpoint as a client holds it: a `SOCK_SEQPACKET` fd with
/// rpmsg_char semantics (one message per read and write, at most the
/// negotiated payload, 496 bytes without negotiation). Plain `read(2)`/`write(2)` on [`EptFd::fd`] work too; this type
/// adds the three things they cannot give: `EMSGSIZE` for any write over
/// that payload (the kernel itself refuses only what exceeds the socket's send
/// buffer), `EPIPE` instead of end of file once the endpoint is gone, and
/// `POLLERR` with the hang-up ([`EptFd::poll`]; a plain `poll(2)` reports
/// only `POLLHUP`). The preload library gives unmodified programs the same.
#[derive(Debug)]
pub struct EptFd {
    pub(super) fd: OwnedFd,
    pub(super) info: EptInfo,
    /// An opened legacy node (closing it does not destroy the endpoint).
    pub(super) node: bool,
    /// Writes over this many bytes fail with `EMSGSIZE`.
    pub(super) max_payload: usize,
}

impl EptFd {
    /// Opens a legacy node (a path answered by [`CtrlClient::create_ept`](super::CtrlClient::create_ept)).
    /// `flags`: `O_NONBLOCK`, `O_CLOEXEC` as for `open(2)`.
    ///
    /// # Errors
    /// [`CtrlError::Refused`] with `EBUSY` while another open is active;
    /// [`CtrlError::Io`] (`ENOENT` once the node is destroyed).
    pub fn open_node(path: &Path, flags: u32) -> Result<Self, CtrlError> {
        let mut sf = SocketFlags::empty();
        if flags & libc::O_CLOEXEC as u32 != 0 {
            sf |= SocketFlags::CLOEXEC;
        }
        if flags & libc::O_NONBLOCK as u32 != 0 {
            sf |= SocketFlags::NONBLOCK;
        }
        let fd = connect(path, sf)?;
        if !wait_readable(fd.as_fd(), ANSWER_TIMEOUT)? {
            return Err(CtrlError::Protocol("no greeting from the node"));
        }
        let mut b = [0u8; OPEN_REPLY_LEN + 8];
        let (n, _) = retry_intr(|| rustix::net::recv(&fd, &mut b, RecvFlags::empty()))
            .map_err(sys("recv"))?;
        let (st, body) =
            proto::parse_reply(&b[..n], OP_OPEN, OPEN_REPLY_LEN).map_err(CtrlError::Protocol)?;
        if st != 0 {
            return Err(CtrlError::Refused { errno: -st });
        }
        Ok(EptFd {
            fd,
            info: EptInfo::new(""),
            node: true,
            max_payload: proto::parse_max_payload(body),
        })
    }

    /// Wraps an endpoint fd received some other way (inherited, passed over
    /// a socket).
    pub fn from_fd(fd: OwnedFd) -> Self {
        EptFd {
            fd,
            info: EptInfo::new(""),
            node: false,
            max_payload: MAX_PAYLOAD,
        }
    }

    /// The same endpoint, refusing writes over `max` bytes instead of 496
    /// (the service's [`CtrlClient::max_payload`](super::CtrlClient::max_payload) when buffer sizes were
    /// negotiated).
    #[must_use]
    pub fn with_max_payload(self, max: usize) -> Self {
        EptFd {
            max_payload: max,
            ..self
        }
    }

    /// Writes over this many bytes fail with `EMSGSIZE`.
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Takes over endpoint fd number `fd` inherited from the parent process
    /// (as `iopath rpmsg ept create ... -- CMD` hands it, its number in
    /// `IOPATH_RPMSG_FD`) and marks it close-on-exec.
    ///
    /// Only a number that came through `exec` is taken: it must not be
    /// stdio, must be an open socket, and must not be close-on-exec (an
    /// inherited fd cannot be; what this process opens itself, Rust's
    /// standard library and this crate included, is). So a number is taken
    /// once: the first take marks it close-on-exec.
    ///
    /// # Errors
    /// [`CtrlError::NotInherited`] for stdio, a non-socket or a
    /// close-on-exec fd; [`CtrlError::Io`] if `fstat(2)` or `fcntl(2)`
    /// fails (e.g. `EBADF`: no such fd).
    pub fn inherited(fd: RawFd) -> Result<Self, CtrlError> {
        use rustix::fs::FileType;
        use rustix::io::FdFlags;
        /// Check and take-over are one step for every thread.
        static TAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let not = |why| CtrlError::NotInherited { fd, why };
        if fd <= 2 {
            return Err(not("0, 1, 2 are stdio"));
        }
        let _taking = iopath_sys::lock(&TAKING);
        // SAFETY: only borrowed for the checks below, which do not close
        // it; fstat and F_GETFD on any number are harmless.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let st = rustix::fs::fstat(borrowed).map_err(sys("fstat"))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Socket {
            return Err(not("not a socket"));
        }
        let flags = rustix::io::fcntl_getfd(borrowed).map_err(sys("fcntl"))?;
        if flags.contains(FdFlags::CLOEXEC) {
            return Err(not(
                "close-on-exec: opened by this process, or taken already",
            ));
        }
        // SAFETY: the number is open (fstat said so) and came through exec
        // (it is not close-on-exec, as everything this process opens is);
        // under `TAKING`, this is the one take of it, which marks it
        // close-on-exec below so that no later call takes it again.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        rustix::io::fcntl_setfd(&owned, flags | FdFlags::CLOEXEC).map_err(sys("fcntl"))?;
        Ok(EptFd::from_fd(owned))
    }

    /// Wraps an opened legacy node received some other way: as
    /// [`EptFd::from_fd`], but [`EptFd::destroy`] destroys the node's
    /// endpoint as [`EptFd::open_node`]'s would.
    pub fn from_node_fd(fd: OwnedFd) -> Self {
        EptFd {
            fd,
            info: EptInfo::new(""),
            node: true,
            max_payload: MAX_PAYLOAD,
        }
    }

    /// What the service answered at creation: name, local and peer address
    /// (empty name and any addresses for an opened node or a wrapped fd).
    pub fn info(&self) -> &EptInfo {
        &self.info
    }

    /// The fd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Gives the fd up (e.g. to pass it on).
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Sends one message.
    ///
    /// # Errors
    /// `EMSGSIZE` over [`EptFd::max_payload`], `EPIPE` once the endpoint or the remote
    /// is gone, `EAGAIN` when non-blocking and full (as [`CtrlError::Io`]).
    pub fn send(&self, data: &[u8]) -> Result<(), CtrlError> {
        if data.len() > self.max_payload {
            return Err(errno_err("send", rustix::io::Errno::MSGSIZE));
        }
        let iov = [IoSlice::new(data)];
        loop {
            match rustix::net::sendmsg(&self.fd, &iov, &mut Default::default(), SendFlags::NOSIGNAL)
            {
                Ok(_) => return Ok(()),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(errno_err("send", gone_is_pipe(e))),
            }
        }
    }

    /// Receives one message into `buf` (a longer message is cut to `buf`,
    /// the rest dropped) and returns its length as received.
    ///
    /// # Errors
    /// `EPIPE` once the endpoint or the remote is gone, `EAGAIN` when
    /// non-blocking and nothing is queued.
    pub fn recv(&self, buf: &mut [u8]) -> Result<usize, CtrlError> {
        loop {
            match rustix::net::recv(&self.fd, &mut *buf, RecvFlags::empty()) {
                Ok((0, _)) if self.hung_up() => {
                    return Err(errno_err("recv", rustix::io::Errno::PIPE))
                }
                Ok((n, _)) => return Ok(n),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(errno_err("recv", gone_is_pipe(e))),
            }
        }
    }

    /// Waits up to `timeout` for a message; `Ok(None)` if none came.
    ///
    /// # Errors
    /// As [`EptFd::recv`].
    pub fn recv_timeout(
        &self,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<usize>, CtrlError> {
        if !wait_readable(self.fd.as_fd(), timeout)? {
            return Ok(None);
        }
        self.recv(buf).map(Some)
    }

    /// As [`EptFd::recv_timeout`], busy-polling: tries the socket without
    /// blocking and yields the core between tries, so an answer is taken
    /// with no wake-up (the writer need not interrupt a sleeping core).
    /// Spins a core while it waits; for latency-bound clients.
    ///
    /// # Errors
    /// As [`EptFd::recv`].
    pub fn recv_busy(&self, buf: &mut [u8], timeout: Duration) -> Result<Option<usize>, CtrlError> {
        let start = Instant::now();
        let mut tries = 0u32;
        let mut spin = crate::notify::PollSpin::new();
        loop {
            match rustix::net::recv(&self.fd, &mut *buf, RecvFlags::DONTWAIT) {
                Ok((0, _)) if self.hung_up() => {
                    return Err(errno_err("recv", rustix::io::Errno::PIPE))
                }
                Ok((n, _)) => return Ok(Some(n)),
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
                Err(e) => return Err(errno_err("recv", gone_is_pipe(e))),
            }
            tries = tries.wrapping_add(1);
            // The clock is read every 64 tries only: it costs as much as a try.
            if tries % 64 == 0 && start.elapsed() >= timeout {
                return Ok(None);
            }
            spin.idle();
        }
    }

    /// Polls the endpoint for `events`, waiting up to `timeout` (`None`:
    /// for ever), as rpmsg_char's poll answers: once the endpoint or the
    /// remote is gone, `POLLHUP | POLLERR` (with `POLLIN`: a read does not
    /// block, it fails with `EPIPE`). Empty flags on timeout.
    ///
    /// # Errors
    /// [`CtrlError::Io`] if `poll(2)` fails.
    pub fn poll(
        &self,
        events: PollFlags,
        timeout: Option<Duration>,
    ) -> Result<PollFlags, CtrlError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let left = deadline.map(|d| {
                let l = d.saturating_duration_since(Instant::now());
                Timespec {
                    tv_sec: l.as_secs() as i64,
                    tv_nsec: i64::from(l.subsec_nanos()),
                }
            });
            let mut p = [PollFd::new(&self.fd, events)];
            match poll(&mut p, left.as_ref()) {
                Ok(0) => return Ok(PollFlags::empty()),
                Ok(_) => {
                    let r = p[0].revents();
                    return Ok(if r.contains(PollFlags::HUP) {
                        r | PollFlags::ERR
                    } else {
                        r
                    });
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(errno_err("poll", e)),
            }
        }
    }

    /// Whether the service side is gone (poll reports a hang-up).
    pub fn hung_up(&self) -> bool {
        let mut p = [PollFd::new(&self.fd, PollFlags::IN | PollFlags::RDHUP)];
        matches!(poll(&mut p, Some(&Timespec::default())), Ok(1))
            && p[0]
                .revents()
                .intersects(PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR)
    }

    /// Destroys the endpoint (`RPMSG_DESTROY_EPT_IOCTL`), for every copy of
    /// the fd: they all read `EPIPE` from then on.
    ///
    /// An fd endpoint (and one wrapped by [`EptFd::from_fd`]) is shut down
    /// both ways; the service sees the hang-up and frees it. An opened
    /// legacy node has its writing side shut down, which the node's service
    /// takes as the destroy request (closing only releases the open); this
    /// waits for the service to confirm by hanging up, so the node is gone
    /// from its directory when it returns.
    ///
    /// # Errors
    /// [`CtrlError::Io`]; [`CtrlError::Protocol`] if the service does not
    /// confirm within 10 s.
    pub fn destroy(self) -> Result<(), CtrlError> {
        self.shut()
    }

    /// As [`EptFd::destroy`], keeping the fd open (it reads `EPIPE` from
    /// then on): `RPMSG_DESTROY_EPT_IOCTL` on an fd its program still holds.
    ///
    /// # Errors
    /// As [`EptFd::destroy`].
    pub fn shut(&self) -> Result<(), CtrlError> {
        let how = if self.node {
            Shutdown::Write
        } else {
            Shutdown::Both
        };
        match rustix::net::shutdown(&self.fd, how) {
            Ok(()) | Err(rustix::io::Errno::NOTCONN) => {}
            Err(e) => return Err(errno_err("shutdown", e)),
        }
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            // HUP once both directions are shut: for a node, ours (just
            // now) and the service's (its confirmation); for an fd
            // endpoint, at once (both were ours to shut).
            let left = deadline.saturating_duration_since(Instant::now());
            let ts = Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            let mut p = [PollFd::new(&self.fd, PollFlags::empty())];
            match poll(&mut p, Some(&ts)) {
                Ok(0) => {
                    return Err(CtrlError::Protocol(
                        "the service did not confirm the destroy",
                    ))
                }
                Ok(_) if p[0].revents().intersects(PollFlags::HUP | PollFlags::ERR) => {
                    return Ok(())
                }
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(errno_err("poll", e)),
            }
        }
    }
}

impl AsFd for EptFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
