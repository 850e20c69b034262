//! The back-end request channel (`SET_BACKEND_REQ_FD`) of the front end.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::control::{read_exact, write_all};
use super::{Result, VhostUserError};
use crate::vhost_wire::{
    self, Header, RawIotlb, BACKEND_CONFIG_CHANGE, BACKEND_IOTLB_MSG, HEADER_SIZE, MAX_PAYLOAD,
};

/// The back-end request channel (`SET_BACKEND_REQ_FD`), served by a thread.
///
/// iopath's IOMMU ops send every IOTLB entry before the device can need it,
/// so a miss means the device touched an address the driver never mapped:
/// it is logged and left unresolved (the back end fails that request).
/// Config-change notices are logged. Replies, when asked for, say "not
/// handled" (non-zero) for misses and "ok" for the rest.
#[derive(Debug)]
pub(super) struct BackendChannel {
    sock: Arc<UnixStream>,
    thread: Option<JoinHandle<()>>,
}

impl BackendChannel {
    pub(super) fn spawn(sock: UnixStream) -> Result<Self> {
        let sock = Arc::new(sock);
        let s = Arc::clone(&sock);
        let thread = std::thread::Builder::new()
            .name("vhost-user-backend-req".into())
            .spawn(move || serve_backend_channel(&s))
            .map_err(|source| VhostUserError::Io {
                op: "spawn of the back-end channel thread",
                source,
            })?;
        Ok(BackendChannel {
            sock,
            thread: Some(thread),
        })
    }

    pub(super) fn stop(mut self) {
        let _ = rustix::net::shutdown(self.sock.as_fd(), rustix::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_backend_channel(sock: &UnixStream) {
    loop {
        let mut hdr = [0u8; HEADER_SIZE];
        if read_exact(sock, &mut hdr, "back-end channel read").is_err() {
            return;
        }
        let hdr = Header::parse(&hdr);
        // Refuse anything huge rather than allocate what a hostile peer
        // asks for.
        let size = match hdr.check(MAX_PAYLOAD) {
            Ok(size) => size,
            Err(e) => {
                tracing::warn!("back-end channel: {e}; closing");
                return;
            }
        };
        let mut body = vec![0u8; size];
        if read_exact(sock, &mut body, "back-end channel read").is_err() {
            return;
        }
        // Any fds the back end attached were received into the default
        // (empty) ancillary buffer and thus closed by the kernel.
        let handled = match (hdr.request, RawIotlb::decode(&body)) {
            (BACKEND_IOTLB_MSG, Some(miss)) => {
                tracing::warn!(
                    iova = format_args!("{:#x}", miss.iova),
                    perm = miss.perm,
                    kind = miss.kind,
                    "back end reports an IOTLB miss for an address never mapped"
                );
                false
            }
            (BACKEND_CONFIG_CHANGE, _) => {
                tracing::info!("back end reports a config change");
                true
            }
            (other, _) => {
                tracing::warn!(code = other, "back-end channel: unhandled request");
                false
            }
        };
        if hdr.need_reply() {
            let reply = vhost_wire::u64_reply(hdr.request, u64::from(!handled));
            if write_all(sock, &reply, "back-end channel reply").is_err() {
                return;
            }
        }
    }
}
