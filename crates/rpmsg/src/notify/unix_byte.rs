//! One `0x01` byte per kick on a unix stream socket, as OpenAMP's Linux
//! demo does; the receiver drains what is pending and rescans both rings.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rustix::net::SendFlags;

use super::{errno, io, poll_in, Notifier, NotifyError, Wake};

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

    /// Reads every kick byte pending, without waiting; whether there was
    /// any. A hang-up is a zero-byte read, reported only once the kicks
    /// before it were seen (the peer's last messages count).
    fn drain(&self) -> Result<bool, NotifyError> {
        let mut buf = [0u8; 64];
        let mut got = false;
        loop {
            match (&self.sock).read(&mut buf) {
                Ok(0) if got => return Ok(true),
                Ok(0) => return Err(NotifyError::PeerGone),
                Ok(_) => got = true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(got),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Err(NotifyError::PeerGone)
                }
                Err(e) => return Err(io("read")(e)),
            }
        }
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
        if self.drain()? {
            return Ok(Wake::Kicked);
        }
        let r = poll_in(&[self.sock.as_fd()], timeout)?;
        if r[0].is_empty() {
            return Ok(Wake::Timeout);
        }
        Ok(if self.drain()? {
            Wake::Kicked
        } else {
            Wake::Timeout
        })
    }

    fn wait_fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.sock.as_fd()]
    }

    fn kind(&self) -> &'static str {
        "unix"
    }
}
