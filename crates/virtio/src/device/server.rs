//! The device side's connection loop: accepts a front end, takes the
//! messages the `vhost` crate cannot handle (`IOTLB_MSG`,
//! `SET_BACKEND_REQ_FD`, `SET_MEM_TABLE`) off the socket itself
//! ([`super::intercept`]), hands every other one to the request handler
//! ([`super::handler`]), and drops what the front end set up when it goes.

use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iopath_sys::{error_chain, lock};
use vhost::vhost_user::{BackendReqHandler, Error as VhostError};

use super::error::ServerError;
use super::handler::Handler;
use super::intercept::{handle_backend_req_fd, handle_iotlb, handle_mem_table};
use super::model::VirtioDevice;
use crate::vhost_wire::{
    Header, FRONTEND_IOTLB_MSG, FRONTEND_SET_BACKEND_REQ_FD, FRONTEND_SET_MEM_TABLE, HEADER_SIZE,
};

/// The log target of the per-front-end IOTLB summary, so that a program
/// can show it while keeping the rest at a quieter level.
pub const IOTLB_STATS_TARGET: &str = "iopath::iotlb";

/// How long a front end may take to send the rest of a message it has
/// started: the server serves one front end at a time, so one that sends
/// half a message and waits would keep every other one out. Idle time
/// between messages is not limited.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);

/// How a server presents its device to front ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerOptions {
    /// Offer `VIRTIO_F_ACCESS_PLATFORM` when the device does (the default).
    /// Negotiated, it makes every ring and buffer address an IOVA that the
    /// front end must map with `IOTLB_MSG`s. QEMU negotiates it only when
    /// the guest has a vIOMMU (`iommu_platform=on`) and drops it otherwise;
    /// Linux's `virtio_uml` (User-Mode Linux) accepts it without running an
    /// IOMMU, so a device offering it fails there: the guest's ring then
    /// goes through a DMA API that UML 6.1 lacks (the probe fails with
    /// `-ENOMEM`), and the device would wait for translations that never
    /// come. Set to `false` for such front ends: addresses are then guest
    /// physical addresses.
    pub access_platform: bool,
    /// The listening socket's permission bits, when the server is to
    /// refuse front ends of another user unless they let group or others
    /// in ([`iopath_sys::unix_socket::Peer::admitted`]); `None`: every front end
    /// that could connect is served. Each front end's pid and uid are
    /// logged either way.
    pub socket_mode: Option<u32>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            access_platform: true,
            socket_mode: None,
        }
    }
}

/// A vhost-user server for one device: serves one front end at a time and,
/// when it disconnects or breaks the protocol, drops everything it set up
/// and serves the next.
#[derive(Debug)]
pub struct VhostUserServer<D: VirtioDevice> {
    listener: UnixListener,
    device: Arc<D>,
    options: ServerOptions,
}

impl<D: VirtioDevice> VhostUserServer<D> {
    /// A server for `device` on a listening socket.
    pub fn new(listener: UnixListener, device: Arc<D>) -> Self {
        Self {
            listener,
            device,
            options: ServerOptions::default(),
        }
    }

    /// The same server with `options`.
    #[must_use]
    pub fn with_options(self, options: ServerOptions) -> Self {
        Self { options, ..self }
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
        let mode = self.options.socket_mode.unwrap_or(0o777);
        match iopath_sys::unix_socket::admit(&stream, mode) {
            Ok(peer) => tracing::info!("front end connected: {peer}"),
            Err(peer) => return Err(ServerError::PeerRefused { peer, mode }),
        }
        serve_connection_with(stream, Arc::clone(&self.device), self.options)
    }

    /// Serves front ends one after another, forever; a front end's error is
    /// logged and the next one is served.
    ///
    /// # Errors
    /// Only when accepting fails (the listener is broken).
    pub fn run(&self) -> Result<(), ServerError> {
        loop {
            // A panic while serving one front end (a bug) drops that front
            // end only: its handler's drop stops its queues, and the device
            // holds no state of the connection.
            let served = std::panic::catch_unwind(AssertUnwindSafe(|| self.serve_one()));
            match served {
                Ok(Ok(())) => tracing::info!("front end disconnected"),
                Ok(Err(e @ ServerError::Accept(_))) => return Err(e),
                Ok(Err(e)) => tracing::warn!("front end dropped: {}", error_chain(&e)),
                Err(_) => tracing::error!("front end dropped: serving it panicked"),
            }
        }
    }
}

/// Peeks at the next message's header once the socket is readable:
/// true with the whole header in `hdr`, false when the front end closed.
/// A header that arrives in pieces gets [`MESSAGE_TIMEOUT`] to complete
/// (a peek does not wait for more than what is queued, so it looks
/// again every millisecond meanwhile).
///
/// # Errors
/// [`ServerError::Stalled`] when it does not complete in time,
/// [`ServerError::Socket`] when the socket fails.
fn peek_header(side: &UnixStream, hdr: &mut [u8; HEADER_SIZE]) -> Result<bool, ServerError> {
    use rustix::net::RecvFlags;
    let deadline = std::time::Instant::now() + MESSAGE_TIMEOUT;
    loop {
        match rustix::net::recv(side, &mut hdr[..], RecvFlags::PEEK | RecvFlags::DONTWAIT) {
            Ok((0, _)) => return Ok(false),
            Ok((n, _)) if n >= HEADER_SIZE => return Ok(true),
            Ok((n, _)) => {
                if std::time::Instant::now() >= deadline {
                    return Err(ServerError::Stalled {
                        got: n,
                        need: HEADER_SIZE,
                        timeout: MESSAGE_TIMEOUT,
                    });
                }
                if closed(side) {
                    return Ok(false);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            // A wake-up with nothing queued: wait again.
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {
                let mut idle = [rustix::event::PollFd::new(
                    side,
                    rustix::event::PollFlags::IN,
                )];
                match rustix::event::poll(&mut idle, None) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(ServerError::Socket(e.into())),
                }
            }
            Err(e) => return Err(ServerError::Socket(e.into())),
        }
    }
}

/// Whether the front end shut its side of the connection.
fn closed(side: &UnixStream) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fd = [PollFd::new(side, PollFlags::RDHUP)];
    let _ = poll(&mut fd, Some(&Timespec::default()));
    fd[0]
        .revents()
        .intersects(PollFlags::RDHUP | PollFlags::HUP)
}

/// Serves one front end on `stream` until it disconnects or misbehaves,
/// with the default [`ServerOptions`].
///
/// # Errors
/// See [`VhostUserServer::serve_one`].
pub fn serve_connection<D: VirtioDevice>(
    stream: UnixStream,
    device: Arc<D>,
) -> Result<(), ServerError> {
    serve_connection_with(stream, device, ServerOptions::default())
}

/// Serves one front end on `stream` until it disconnects or misbehaves.
///
/// # Errors
/// See [`VhostUserServer::serve_one`].
pub fn serve_connection_with<D: VirtioDevice>(
    stream: UnixStream,
    device: Arc<D>,
    options: ServerOptions,
) -> Result<(), ServerError> {
    let mut side = stream.try_clone().map_err(ServerError::Socket)?;
    let handler = Arc::new(Mutex::new(Handler::new(device, options)));
    {
        let mut h = lock(&handler);
        h.conn = side.as_raw_fd();
        h.peer = rustix::net::sockopt::socket_peercred(&side)
            .ok()
            .map(|c| c.pid);
    }
    let mut requests = BackendReqHandler::from_stream(stream, Arc::clone(&handler));
    // Every read of a message, here, in the intercepts and in the vhost
    // crate, gives up after MESSAGE_TIMEOUT; the wait for the next one
    // (peek_header's poll) does not.
    rustix::net::sockopt::set_socket_timeout(
        &side,
        rustix::net::sockopt::Timeout::Recv,
        Some(MESSAGE_TIMEOUT),
    )
    .map_err(|e| ServerError::Socket(e.into()))?;
    let result = loop {
        let mut hdr = [0u8; HEADER_SIZE];
        match peek_header(&side, &mut hdr) {
            Ok(true) => {}
            Ok(false) => break Ok(()),
            Err(e) => break Err(e),
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
        if hdr.request == FRONTEND_SET_MEM_TABLE {
            if let Err(e) = handle_mem_table(&mut side, hdr, &handler) {
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
        let iotlb = h.iommu().stats();
        if !iotlb.is_empty() {
            tracing::info!(target: IOTLB_STATS_TARGET, "front end's IOTLB: {iotlb}");
        }
        if let Some((acked, offered)) = h.left_at_access_platform() {
            tracing::warn!(
                "the front end left without starting a queue, having acknowledged \
                 VIRTIO_F_ACCESS_PLATFORM (features {acked:#x} of {offered:#x} offered): \
                 a front end that takes the offer without running an IOMMU (Linux's \
                 virtio_uml, whose probe then fails) cannot use this device; serve it \
                 without offering the feature (iopath blk serve --no-access-platform)"
            );
        }
        let truncated = h.memory_truncated();
        h.shutdown();
        truncated
    };
    if truncated {
        tracing::warn!("front end truncated the memory it shares (SIGBUS caught): disconnected");
    }
    result
}
