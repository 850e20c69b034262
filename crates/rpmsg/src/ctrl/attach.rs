//! The client side of ATTACH: a connection that becomes an endpoint bound
//! to a channel the peer announced.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use rustix::net::{RecvFlags, SendFlags, SocketAddrUnix};

use super::proto::{header, u32_at, AttachRequest, ATTACH_REPLY_LEN, OP_ATTACH};
use super::{seqpacket, sys, CtrlError};
use crate::wire::ADDR_ANY;

/// A client's endpoint on the owner's bus, reached through the control
/// socket: one packet per message.
#[derive(Debug)]
pub struct CtrlEndpoint {
    fd: OwnedFd,
    src: u32,
    dst: u32,
}

impl CtrlEndpoint {
    /// Connects to the owner at `path` and attaches to channel `name`
    /// (waiting up to `timeout` for the peer to announce it).
    ///
    /// # Errors
    /// [`CtrlError::Io`], [`CtrlError::Refused`] with the owner's errno,
    /// [`CtrlError::Protocol`].
    pub fn attach(path: &Path, name: &str, timeout: Duration) -> Result<Self, CtrlError> {
        let fd = seqpacket()?;
        let addr = SocketAddrUnix::new(path).map_err(sys("socket path"))?;
        rustix::net::connect(&fd, &addr).map_err(sys("connect"))?;
        let req = AttachRequest {
            name: name.to_owned(),
            src: ADDR_ANY,
            dst: ADDR_ANY,
            timeout_ms: timeout.as_millis().min(u128::from(u32::MAX)) as u32,
        };
        rustix::net::send(&fd, &req.encode()?, SendFlags::NOSIGNAL).map_err(sys("send"))?;
        let mut b = [0u8; 64];
        let (n, _) = rustix::net::recv(&fd, &mut b[..], RecvFlags::empty()).map_err(sys("recv"))?;
        if n != ATTACH_REPLY_LEN || b[..8] != header(OP_ATTACH) {
            return Err(CtrlError::Protocol("unexpected answer to ATTACH"));
        }
        let status = i32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if status != 0 {
            return Err(CtrlError::Refused { errno: -status });
        }
        Ok(CtrlEndpoint {
            fd,
            src: u32_at(&b, 12),
            dst: u32_at(&b, 16),
        })
    }

    /// Our address on the bus.
    pub fn src(&self) -> u32 {
        self.src
    }

    /// The peer's address.
    pub fn dst(&self) -> u32 {
        self.dst
    }

    /// The connection (a `SOCK_SEQPACKET` fd).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Sends one message.
    ///
    /// # Errors
    /// [`CtrlError::Io`] (`EPIPE` once the endpoint is gone).
    pub fn send(&self, data: &[u8]) -> Result<(), CtrlError> {
        rustix::net::send(&self.fd, data, SendFlags::NOSIGNAL).map_err(sys("send"))?;
        Ok(())
    }

    /// Receives one message into `buf`, waiting up to `timeout`; `Ok(None)`
    /// on timeout, `Ok(Some(0))` at end of file (the service is gone).
    ///
    /// # Errors
    /// [`CtrlError::Io`].
    pub fn recv(&self, buf: &mut [u8], timeout: Duration) -> Result<Option<usize>, CtrlError> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let mut p = [PollFd::new(&self.fd, PollFlags::IN)];
        let ts = Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        loop {
            match poll(&mut p, Some(&ts)) {
                Ok(0) => return Ok(None),
                Ok(_) => break,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(sys("poll")(e)),
            }
        }
        let (n, _) = rustix::net::recv(&self.fd, buf, RecvFlags::empty()).map_err(sys("recv"))?;
        Ok(Some(n))
    }
}
