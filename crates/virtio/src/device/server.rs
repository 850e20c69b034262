//! The device side's connection loop: accepts a front end, takes the
//! messages the `vhost` crate cannot handle (`IOTLB_MSG`,
//! `SET_BACKEND_REQ_FD`) off the socket itself, hands every other one to
//! the request handler ([`super::handler`]), and drops what the front end
//! set up when it goes.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex, MutexGuard};

use iopath_heap::error_chain;
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{BackendReqHandler, Error as VhostError};

use super::handler::Handler;
use super::iotlb::{IotlbMsg, IotlbMsgError, IOTLB_MSG_SIZE};
use super::VirtioDevice;
use crate::vhost_wire::{
    self, Header, FRONTEND_IOTLB_MSG, FRONTEND_SET_BACKEND_REQ_FD, HEADER_SIZE,
};

/// Longest an IOTLB change waits for device accesses that began before it.
const FENCE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Errors of the vhost-user server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Accepting a connection failed.
    #[error("Accepting a vhost-user connection failed")]
    Accept(#[source] io::Error),
    /// Reading or writing the connection failed.
    #[error("vhost-user socket I/O failed")]
    Socket(#[source] io::Error),
    /// The front end broke the protocol; the connection was closed.
    #[error("vhost-user protocol error, connection closed")]
    Protocol(#[source] VhostError),
    /// A malformed `IOTLB_MSG`.
    #[error("Malformed IOTLB_MSG with {len} payload bytes, connection closed")]
    MalformedIotlb {
        /// Request code.
        request: u32,
        /// Payload length announced in the header.
        len: u32,
    },
    /// A malformed message taken before the `vhost` crate sees it
    /// (`SET_BACKEND_REQ_FD` without exactly one unix stream socket, or
    /// before `BACKEND_REQ` was negotiated).
    #[error("Malformed vhost-user request {request} ({len} payload bytes), connection closed")]
    MalformedMessage {
        /// Request code.
        request: u32,
        /// Payload length announced in the header.
        len: u32,
    },
}

/// A vhost-user server for one device: serves one front end at a time and,
/// when it disconnects or breaks the protocol, drops everything it set up
/// and serves the next.
#[derive(Debug)]
pub struct VhostUserServer<D: VirtioDevice> {
    listener: UnixListener,
    device: Arc<D>,
}

impl<D: VirtioDevice> VhostUserServer<D> {
    /// A server for `device` on a listening socket.
    pub fn new(listener: UnixListener, device: Arc<D>) -> Self {
        Self { listener, device }
    }

    /// The device being served.
    pub fn device(&self) -> &Arc<D> {
        &self.device
    }

    /// Accepts one front end and serves it until it disconnects.
    ///
    /// # Errors
    /// [`ServerError::Accept`] when no connection could be accepted; the
    /// front end's own failures ([`ServerError::Protocol`], ...) after it
    /// has been dropped.
    pub fn serve_one(&self) -> Result<(), ServerError> {
        let (stream, _) = self.listener.accept().map_err(ServerError::Accept)?;
        serve_connection(stream, Arc::clone(&self.device))
    }

    /// Serves front ends one after another, forever; a front end's error is
    /// logged and the next one is served.
    ///
    /// # Errors
    /// Only when accepting fails (the listener is broken).
    pub fn run(&self) -> Result<(), ServerError> {
        loop {
            match self.serve_one() {
                Ok(()) => tracing::info!("front end disconnected"),
                Err(e @ ServerError::Accept(_)) => return Err(e),
                Err(e) => tracing::warn!("front end dropped: {}", error_chain(&e)),
            }
        }
    }
}

/// Serves one front end on `stream` until it disconnects or misbehaves.
///
/// # Errors
/// See [`VhostUserServer::serve_one`].
pub fn serve_connection<D: VirtioDevice>(
    stream: UnixStream,
    device: Arc<D>,
) -> Result<(), ServerError> {
    let mut side = stream.try_clone().map_err(ServerError::Socket)?;
    let handler = Arc::new(Mutex::new(Handler::new(device)));
    lock(&handler).conn = side.as_raw_fd();
    let mut requests = BackendReqHandler::from_stream(stream, Arc::clone(&handler));
    let result = loop {
        let mut hdr = [0u8; HEADER_SIZE];
        let peeked = rustix::net::recv(
            &side,
            &mut hdr,
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::WAITALL,
        );
        match peeked {
            Ok((0, _)) => break Ok(()),
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => break Err(ServerError::Socket(e.into())),
        }
        let hdr = Header::parse(&hdr);
        tracing::trace!("vhost-user request {} ({} bytes)", hdr.request, hdr.size);
        if hdr.request == FRONTEND_IOTLB_MSG {
            if let Err(e) = handle_iotlb(&mut side, hdr, &handler) {
                break Err(e);
            }
            continue;
        }
        if hdr.request == FRONTEND_SET_BACKEND_REQ_FD {
            if let Err(e) = handle_backend_req_fd(&mut side, hdr, &handler) {
                break Err(e);
            }
            continue;
        }
        match requests.handle_request() {
            Ok(()) => {}
            Err(VhostError::Disconnected) => break Ok(()),
            Err(VhostError::PartialMessage) => break Ok(()),
            Err(e) => break Err(ServerError::Protocol(e)),
        }
    };
    let truncated = {
        let mut h = lock(&handler);
        let truncated = h.memory_truncated();
        h.shutdown();
        truncated
    };
    if truncated {
        tracing::warn!("front end truncated the memory it shares (SIGBUS caught): disconnected");
    }
    result
}

/// Takes `SET_BACKEND_REQ_FD` off the socket: the `vhost` crate would wrap
/// the channel in its `Backend`, which cannot send IOTLB misses, so the
/// socket is kept here and handed to the IOMMU.
fn handle_backend_req_fd<D: VirtioDevice>(
    sock: &mut UnixStream,
    hdr: Header,
    handler: &Mutex<Handler<D>>,
) -> Result<(), ServerError> {
    use rustix::net::{
        recvmsg, sockopt, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags,
        SocketType,
    };
    use std::mem::MaybeUninit;
    let malformed = ServerError::MalformedMessage {
        request: FRONTEND_SET_BACKEND_REQ_FD,
        len: hdr.size,
    };
    let Ok(len) = hdr.check(64) else {
        return Err(malformed);
    };
    let mut buf = vec![0u8; HEADER_SIZE + len];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        &*sock,
        &mut [io::IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::WAITALL | RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| ServerError::Socket(e.into()))?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    if got.bytes != buf.len() || fds.len() != 1 {
        return Err(malformed);
    }
    let fd = fds.remove(0);
    let is_stream = matches!(sockopt::socket_type(&fd), Ok(SocketType::STREAM))
        && matches!(sockopt::socket_domain(&fd), Ok(AddressFamily::UNIX));
    let h = lock(handler);
    if !is_stream || h.acked_protocol & VhostUserProtocolFeatures::BACKEND_REQ.bits() == 0 {
        return Err(malformed);
    }
    let reply_ack = h.reply_ack();
    h.iommu()
        .set_miss_channel(Some(UnixStream::from(fd)), reply_ack);
    drop(h);
    if hdr.need_reply() && reply_ack {
        send_u64_reply(sock, FRONTEND_SET_BACKEND_REQ_FD, 0)?;
    }
    Ok(())
}

fn send_u64_reply(sock: &mut UnixStream, request: u32, value: u64) -> Result<(), ServerError> {
    sock.write_all(&vhost_wire::u64_reply(request, value))
        .map_err(ServerError::Socket)
}

/// Takes one `IOTLB_MSG` off the socket, applies it, and acknowledges it
/// when asked to.
fn handle_iotlb<D: VirtioDevice>(
    sock: &mut UnixStream,
    hdr: Header,
    handler: &Mutex<Handler<D>>,
) -> Result<(), ServerError> {
    let malformed = ServerError::MalformedIotlb {
        request: FRONTEND_IOTLB_MSG,
        len: hdr.size,
    };
    let Ok(len) = hdr.check(IOTLB_MSG_SIZE * 2) else {
        return Err(malformed);
    };
    let mut msg = vec![0u8; HEADER_SIZE + len];
    sock.read_exact(&mut msg).map_err(ServerError::Socket)?;
    let parsed = IotlbMsg::parse(&msg[HEADER_SIZE..]);
    // A payload of the wrong size is a framing error, not a bad mapping.
    if let Err(IotlbMsgError::BadSize { .. }) = parsed {
        return Err(malformed);
    }
    let ok = {
        let h = lock(handler);
        match parsed {
            Ok(m) if h.iotlb_enabled() => {
                // Removing or changing a translation (an update may replace
                // one too): accesses through the old one must be over before
                // the ack. Adding one waits for nothing.
                if h.iommu().apply(&m) && !h.fence.wait_older(FENCE_LIMIT) {
                    tracing::warn!("IOTLB change acknowledged with device accesses still running");
                }
                true
            }
            Ok(_) => {
                tracing::warn!("IOTLB_MSG without ACCESS_PLATFORM and IOTLB negotiated");
                false
            }
            Err(e) => {
                tracing::warn!("IOTLB_MSG refused: {e}");
                false
            }
        }
    };
    if hdr.need_reply() {
        send_u64_reply(sock, FRONTEND_IOTLB_MSG, u64::from(!ok))?;
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
