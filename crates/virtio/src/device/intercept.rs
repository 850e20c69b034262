//! The messages the connection loop ([`super::server`]) takes off the
//! socket before the `vhost` crate sees them, because that crate would
//! refuse or mishandle them:
//!
//! - `SET_BACKEND_REQ_FD`: the crate would wrap the channel in its
//!   `Backend`, which cannot send IOTLB misses; the socket goes to the
//!   IOMMU instead.
//! - `IOTLB_MSG`: the crate drops the connection on it.
//! - `SET_MEM_TABLE`: the crate wants a payload of exactly the announced
//!   regions; Linux's `virtio_uml` sends room for two with one in use
//!   ([`vhost_wire::decode_mem_table`]).
//!
//! Each is answered as the crate would: a `u64` reply when the front end
//! asked for one and `REPLY_ACK` is negotiated (0 success, 1 failure).

use std::fs::File;
use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use iopath_sys::lock;
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::VhostUserBackendReqHandlerMut;

use super::error::ServerError;
use super::handler::Handler;
use super::iotlb::{IotlbMsg, IotlbMsgError, IOTLB_MSG_SIZE};
use super::model::VirtioDevice;
use crate::vhost_wire::{
    self, Header, FRONTEND_IOTLB_MSG, FRONTEND_SET_BACKEND_REQ_FD, FRONTEND_SET_MEM_TABLE,
    HEADER_SIZE, MAX_MEM_TABLE_REGIONS, MAX_MEM_TABLE_SIZE,
};

/// Longest an IOTLB change waits for device accesses that began before it.
const FENCE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads one whole message (header and `len` payload bytes) with the fds
/// that came with it, at most `max_fds` of them (more are closed by the
/// kernel: `MSG_CTRUNC`, which is refused). Returns the payload.
fn recv_with_fds(
    sock: &UnixStream,
    len: usize,
    max_fds: usize,
    malformed: impl Fn() -> ServerError,
) -> Result<(Vec<u8>, Vec<OwnedFd>), ServerError> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut buf = vec![0u8; HEADER_SIZE + len];
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(max_fds))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        sock,
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
    if got.bytes != buf.len() || got.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(malformed());
    }
    buf.drain(..HEADER_SIZE);
    Ok((buf, fds))
}

/// Takes `SET_BACKEND_REQ_FD` off the socket and hands the channel to the
/// IOMMU (for IOTLB misses).
pub(super) fn handle_backend_req_fd<D: VirtioDevice>(
    sock: &mut UnixStream,
    hdr: Header,
    handler: &Mutex<Handler<D>>,
) -> Result<(), ServerError> {
    use rustix::net::{sockopt, AddressFamily, SocketType};
    let malformed = || ServerError::MalformedMessage {
        request: FRONTEND_SET_BACKEND_REQ_FD,
        len: hdr.size,
    };
    let Ok(len) = hdr.check(64) else {
        return Err(malformed());
    };
    let (_, mut fds) = recv_with_fds(sock, len, 4, malformed)?;
    if fds.len() != 1 {
        return Err(malformed());
    }
    let fd = fds.remove(0);
    let is_stream = matches!(sockopt::socket_type(&fd), Ok(SocketType::STREAM))
        && matches!(sockopt::socket_domain(&fd), Ok(AddressFamily::UNIX));
    let h = lock(handler);
    if !is_stream || h.acked_protocol & VhostUserProtocolFeatures::BACKEND_REQ.bits() == 0 {
        return Err(malformed());
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

/// Takes `SET_MEM_TABLE` off the socket, decodes it
/// ([`vhost_wire::decode_mem_table`]) and hands the regions to the
/// handler. A table the handler refuses (a region past the end of its
/// file, say) is answered with failure and closes the connection, as the
/// `vhost` crate does.
pub(super) fn handle_mem_table<D: VirtioDevice>(
    sock: &mut UnixStream,
    hdr: Header,
    handler: &Mutex<Handler<D>>,
) -> Result<(), ServerError> {
    let len = hdr.check(MAX_MEM_TABLE_SIZE).map_err(ServerError::Wire)?;
    let malformed = || ServerError::MalformedMessage {
        request: FRONTEND_SET_MEM_TABLE,
        len: hdr.size,
    };
    let (payload, fds) = recv_with_fds(sock, len, MAX_MEM_TABLE_REGIONS, malformed)?;
    let regions = vhost_wire::decode_mem_table(&payload).map_err(ServerError::Wire)?;
    if fds.len() != regions.len() {
        return Err(malformed());
    }
    let files = fds.into_iter().map(File::from).collect();
    let mut h = lock(handler);
    let result = h.set_mem_table(&regions, files, None);
    let reply_ack = h.reply_ack();
    drop(h);
    if hdr.need_reply() && reply_ack {
        send_u64_reply(sock, FRONTEND_SET_MEM_TABLE, u64::from(result.is_err()))?;
    }
    result.map(drop).map_err(ServerError::Protocol)
}

fn send_u64_reply(sock: &mut UnixStream, request: u32, value: u64) -> Result<(), ServerError> {
    sock.write_all(&vhost_wire::u64_reply(request, value))
        .map_err(ServerError::Socket)
}

/// Takes one `IOTLB_MSG` off the socket, applies it, and acknowledges it
/// when asked to.
pub(super) fn handle_iotlb<D: VirtioDevice>(
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

#[cfg(test)]
mod tests;
