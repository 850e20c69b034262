//! The device side's connection loop: accepts a front end, takes the
//! messages the `vhost` crate cannot handle (`IOTLB_MSG`,
//! `SET_BACKEND_REQ_FD`, `SET_MEM_TABLE`) off the socket itself
//! ([`super::intercept`]), hands every other one to the request handler
//! ([`super::handler`]), and drops what the front end set up when it goes.

use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};

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
            match self.serve_one() {
                Ok(()) => tracing::info!("front end disconnected"),
                Err(e @ ServerError::Accept(_)) => return Err(e),
                Err(e) => tracing::warn!("front end dropped: {}", error_chain(&e)),
            }
        }
    }
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
        let truncated = h.memory_truncated();
        h.shutdown();
        truncated
    };
    if truncated {
        tracing::warn!("front end truncated the memory it shares (SIGBUS caught): disconnected");
    }
    result
}
