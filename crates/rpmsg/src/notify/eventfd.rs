//! A pair of eventfds, one per direction, created by the listening side and
//! passed to the connecting side over a unix socket with `SCM_RIGHTS`
//! (`eventfd(2)`, `unix(7)`); the socket stays open so that a peer that
//! exits is noticed (hang-up).

use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rustix::event::{eventfd, EventfdFlags};
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::{errno, poll_in, Notifier, NotifyError, Wake};

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn eventfd_handshake_refuses_garbage() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"nope").unwrap();
        assert!(matches!(
            EventfdNotifier::accept(b),
            Err(NotifyError::Handshake(_))
        ));
    }
}
