//! The client side of the endpoint service: a control connection
//! ([`CtrlClient`]) that creates endpoints both ways and asks for the
//! counters, and the socket helpers it shares with [`EptFd`] (in
//! `ept_fd`), which uses the endpoints.

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendFlags, SocketAddrUnix, SocketFlags,
    SocketType,
};

use super::proto::{
    self, EptInfo, RequestRef, ServiceStats, CREATE_EPT_FD_REPLY_LEN, CREATE_EPT_REPLY_LEN,
    OP_CREATE_EPT, OP_CREATE_EPT_FD, OP_STATS, STATS_REPLY_LEN,
};
use super::{sys, CtrlError, EptFd};

/// How long a client waits for the service's answer.
pub(super) const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) fn errno_err(op: &'static str, e: rustix::io::Errno) -> CtrlError {
    CtrlError::Io {
        op,
        source: e.into(),
    }
}

pub(super) fn connect(path: &Path, flags: SocketFlags) -> Result<OwnedFd, CtrlError> {
    let fd = rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        SocketType::SEQPACKET,
        flags,
        None,
    )
    .map_err(sys("socket"))?;
    let addr = SocketAddrUnix::new(path).map_err(sys("socket path"))?;
    rustix::net::connect(&fd, &addr).map_err(sys("connect"))?;
    Ok(fd)
}

/// A socket whose service end closed with messages unread reports
/// `ECONNRESET` once; to an endpoint's user that is the endpoint gone.
pub(super) fn gone_is_pipe(e: rustix::io::Errno) -> rustix::io::Errno {
    if e == rustix::io::Errno::CONNRESET {
        rustix::io::Errno::PIPE
    } else {
        e
    }
}

/// Waits until `fd` is readable (or hung up), at most `timeout`; whether it
/// became so.
pub(super) fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> Result<bool, CtrlError> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ts = Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut p = [PollFd::new(&fd, PollFlags::IN)];
        match poll(&mut p, Some(&ts)) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(errno_err("poll", e)),
        }
    }
}

/// A connection to the endpoint service (the counterpart of an open
/// `/dev/rpmsg_ctrlN`). Requests on one connection are answered in order.
#[derive(Debug)]
pub struct CtrlClient {
    fd: OwnedFd,
    /// The service's largest endpoint payload, once asked.
    max_payload: std::sync::OnceLock<usize>,
}

impl CtrlClient {
    /// Connects to the service's control socket at `path`.
    ///
    /// # Errors
    /// [`CtrlError::Io`] (`ENOENT`, `ECONNREFUSED`, `EACCES`, ...).
    pub fn connect(path: &Path) -> Result<Self, CtrlError> {
        let fd = connect(path, SocketFlags::CLOEXEC)?;
        // Answers are awaited in a plain blocking receive (no poll first:
        // one system call less per request); this bounds the wait.
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(ANSWER_TIMEOUT),
        )
        .map_err(sys("setsockopt(SO_RCVTIMEO)"))?;
        Ok(CtrlClient {
            fd,
            max_payload: std::sync::OnceLock::new(),
        })
    }

    /// Wraps a connection made some other way (e.g. by the preload
    /// library, whose program holds the fd). Answers are awaited with a
    /// blocking receive: the fd must not be non-blocking.
    pub fn from_fd(fd: OwnedFd) -> Self {
        CtrlClient {
            fd,
            max_payload: std::sync::OnceLock::new(),
        }
    }

    fn request(&self, req: RequestRef<'_>) -> Result<(), CtrlError> {
        let mut b = [0u8; proto::MAX_REQUEST_LEN];
        // A name of more than 32 bytes cannot be encoded at all.
        let n = req.encode_into(&mut b).ok_or(CtrlError::Refused {
            errno: libc::EINVAL,
        })?;
        retry_intr(|| rustix::net::send(&self.fd, &b[..n], SendFlags::NOSIGNAL))
            .map_err(sys("send"))?;
        Ok(())
    }

    /// Receives an answer into `buf`; with `fd`, the last fd riding along
    /// goes there (any other is closed).
    fn answer(
        &self,
        buf: &mut [u8],
        fd: Option<(&mut Option<OwnedFd>, RecvFlags)>,
    ) -> Result<usize, CtrlError> {
        let no_answer = |e: CtrlError| match &e {
            CtrlError::Io { source, .. } if source.kind() == std::io::ErrorKind::WouldBlock => {
                CtrlError::Protocol("no answer from the endpoint service")
            }
            _ => e,
        };
        let n = match fd {
            None => {
                retry_intr(|| rustix::net::recv(&self.fd, &mut *buf, RecvFlags::empty()))
                    .map_err(sys("recv"))
                    .map_err(no_answer)?
                    .0
            }
            Some((out, flags)) => {
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
                let mut anc = RecvAncillaryBuffer::new(&mut space);
                // An interrupted recvmsg took nothing, fds included: the
                // same buffers serve the retry.
                let got = retry_intr(|| {
                    rustix::net::recvmsg(
                        &self.fd,
                        &mut [IoSliceMut::new(&mut *buf)],
                        &mut anc,
                        flags,
                    )
                })
                .map_err(sys("recvmsg"))
                .map_err(no_answer)?;
                for m in anc.drain() {
                    if let RecvAncillaryMessage::ScmRights(r) = m {
                        for f in r {
                            *out = Some(f);
                        }
                    }
                }
                got.bytes
            }
        };
        if n == 0 {
            return Err(CtrlError::Protocol(
                "the endpoint service closed the connection",
            ));
        }
        Ok(n)
    }

    /// Legacy creation (`RPMSG_CREATE_EPT_IOCTL`): the service makes a node
    /// and answers its path; open it with [`EptFd::open_node`]. The
    /// endpoint lives until destroyed through the open node, or until this
    /// connection closes.
    ///
    /// # Errors
    /// [`CtrlError::Refused`] with `EBUSY` (src taken), `EINVAL` (name), ...
    pub fn create_ept(&self, info: &EptInfo) -> Result<(EptInfo, PathBuf), CtrlError> {
        self.request(RequestRef::CreateEpt(info))?;
        let mut b = [0u8; CREATE_EPT_REPLY_LEN + 16];
        let n = self.answer(&mut b, None)?;
        let (st, body) = proto::parse_reply(&b[..n], OP_CREATE_EPT, CREATE_EPT_REPLY_LEN)
            .map_err(CtrlError::Protocol)?;
        if st != 0 {
            return Err(CtrlError::Refused { errno: -st });
        }
        let (info, path) = proto::parse_create_ept_body(body).map_err(CtrlError::Protocol)?;
        Ok((info, PathBuf::from(path)))
    }

    /// fd creation (`RPMSG_CREATE_EPT_FD_IOCTL`): the endpoint itself comes
    /// back as an anonymous `SOCK_SEQPACKET` fd. `flags`: `O_RDWR` (or
    /// `O_RDONLY`/`O_WRONLY`), `O_NONBLOCK`, `O_CLOEXEC`; any other bit is
    /// `EINVAL`. Closing the last copy of the fd destroys the endpoint.
    ///
    /// # Errors
    /// [`CtrlError::Refused`] with `EBUSY`, `EINVAL`, ...
    pub fn create_ept_fd(&self, info: &EptInfo, flags: u32) -> Result<EptFd, CtrlError> {
        self.request(RequestRef::CreateEptFd(info, flags))?;
        let mut b = [0u8; CREATE_EPT_FD_REPLY_LEN + 16];
        let mut fd = None;
        let rflags = if flags & libc::O_CLOEXEC as u32 != 0 {
            RecvFlags::CMSG_CLOEXEC
        } else {
            RecvFlags::empty()
        };
        let n = self.answer(&mut b, Some((&mut fd, rflags)))?;
        let (st, body) = proto::parse_reply(&b[..n], OP_CREATE_EPT_FD, CREATE_EPT_FD_REPLY_LEN)
            .map_err(CtrlError::Protocol)?;
        if st != 0 {
            return Err(CtrlError::Refused { errno: -st });
        }
        let info = proto::parse_create_ept_fd_body(body).map_err(CtrlError::Protocol)?;
        let fd = fd.ok_or(CtrlError::Protocol("no fd with the CREATE_EPT_FD answer"))?;
        let max_payload = proto::parse_max_payload(body);
        Ok(EptFd {
            fd,
            info,
            node: false,
            max_payload,
        })
    }

    /// The largest payload an endpoint of this service can write: the
    /// buffer size negotiated towards the peer less the header (496
    /// without negotiation). Asked once per connection (a STATS request).
    ///
    /// # Errors
    /// As [`CtrlClient::stats`].
    pub fn max_payload(&self) -> Result<usize, CtrlError> {
        if let Some(&m) = self.max_payload.get() {
            return Ok(m);
        }
        let m = self.stats()?.tx_payload as usize;
        Ok(*self.max_payload.get_or_init(|| m))
    }

    /// The service's counters.
    ///
    /// # Errors
    /// [`CtrlError::Io`], [`CtrlError::Protocol`].
    pub fn stats(&self) -> Result<ServiceStats, CtrlError> {
        self.request(RequestRef::Stats)?;
        let mut b = [0u8; STATS_REPLY_LEN + 16];
        let n = self.answer(&mut b, None)?;
        let (st, body) =
            proto::parse_reply(&b[..n], OP_STATS, STATS_REPLY_LEN).map_err(CtrlError::Protocol)?;
        if st != 0 {
            return Err(CtrlError::Refused { errno: -st });
        }
        ServiceStats::parse(body).ok_or(CtrlError::Protocol("short STATS answer"))
    }

    /// Holds this connection, and with it the legacy endpoints it made,
    /// until `node` is gone (the endpoint destroyed through it): `true`;
    /// or until the service closes the connection: `false`.
    pub fn hold_until_gone(&self, node: &Path) -> bool {
        let ts = Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        };
        while node.exists() {
            let mut p = [PollFd::new(&self.fd, PollFlags::IN)];
            if matches!(poll(&mut p, Some(&ts)), Ok(1)) {
                return false;
            }
        }
        true
    }

    /// The connection.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Gives the connection up (e.g. to a program that holds it as its
    /// `/dev/rpmsg_ctrl0`).
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

/// Runs a system call again while a signal interrupts it (`EINTR`): a
/// program's signal handler, or a profiler's or fuzzer's timer, must not
/// turn into a failed control request.
pub(super) fn retry_intr<T>(
    mut call: impl FnMut() -> rustix::io::Result<T>,
) -> rustix::io::Result<T> {
    loop {
        match call() {
            Err(rustix::io::Errno::INTR) => {}
            r => return r,
        }
    }
}
