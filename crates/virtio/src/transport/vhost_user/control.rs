//! The control channel of the front end: the `vhost` crate's `Frontend`
//! and a second handle on the same socket for what it cannot send
//! (`IOTLB_MSG`), and the socket I/O helpers.

use std::io::{IoSlice, IoSliceMut};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};

use iopath_dma::{IotlbRecord, IotlbSink};
use vhost::vhost_user::Frontend;

use super::{Result, VhostUserError};
use crate::device::IotlbMsg;
use crate::vhost_wire::{self, Header, FRONTEND_IOTLB_MSG};

/// The control channel: the rust-vmm front end and a second handle on the
/// same socket for the requests it cannot send (`IOTLB_MSG`). Both are used
/// only with the mutex held, so replies never interleave.
pub(super) struct Control {
    pub(super) fe: Frontend,
    pub(super) raw: UnixStream,
    pub(super) reply_ack: bool,
    /// `ACCESS_PLATFORM` was acknowledged.
    pub(super) iotlb: bool,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("socket", &self.raw)
            .field("reply_ack", &self.reply_ack)
            .field("iotlb", &self.iotlb)
            .finish()
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked mid-request; the
    // socket state is then unknown, but using it yields errors, not UB.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Control {
    // Hand-written: the vhost crate's Frontend has no IOTLB_MSG request.
    pub(super) fn send_iotlb(&self, iotlb: &IotlbMsg) -> Result<()> {
        if !self.iotlb {
            return Err(VhostUserError::Unsupported {
                what: "IOTLB messages without ACCESS_PLATFORM",
            });
        }
        let payload = iotlb.to_wire();
        let header = Header::request(FRONTEND_IOTLB_MSG, payload.len(), self.reply_ack);
        write_all(
            &self.raw,
            &vhost_wire::message(header, &payload),
            "IOTLB_MSG send",
        )?;
        if self.reply_ack {
            let mut reply = [0u8; vhost_wire::U64_REPLY_SIZE];
            read_exact(&self.raw, &mut reply, "IOTLB_MSG reply")?;
            let status = vhost_wire::parse_u64_reply(FRONTEND_IOTLB_MSG, &reply).map_err(|_| {
                VhostUserError::BadReply {
                    request: "IOTLB_MSG",
                    why: "not a reply to IOTLB_MSG",
                }
            })?;
            if status != 0 {
                return Err(VhostUserError::BadReply {
                    request: "IOTLB_MSG",
                    why: "back end refused the entry",
                });
            }
        }
        Ok(())
    }
}

/// Forwards the IOMMU ops' IOTLB records to the back end as `IOTLB_MSG`.
/// With REPLY_ACK, `send` returns only once the back end acknowledged the
/// record, so an invalidated range is out of the device's reach by then.
#[derive(Debug, Clone)]
pub struct VhostUserIotlb {
    pub(super) ctl: Arc<Mutex<Control>>,
}

impl IotlbSink for VhostUserIotlb {
    fn send(&self, record: IotlbRecord) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let ctl = lock(&self.ctl);
        let msg = match record {
            IotlbRecord::Update {
                iova,
                size,
                uaddr,
                perm,
            } => IotlbMsg::Update {
                iova,
                size,
                uaddr,
                perm: perm.into(),
            },
            IotlbRecord::Invalidate { iova, size } => IotlbMsg::Invalidate { iova, size },
        };
        ctl.send_iotlb(&msg)?;
        Ok(())
    }
}

pub(super) fn write_all(sock: &UnixStream, mut buf: &[u8], op: &'static str) -> Result<()> {
    while !buf.is_empty() {
        match rustix::net::sendmsg(
            sock,
            &[IoSlice::new(buf)],
            &mut rustix::net::SendAncillaryBuffer::default(),
            rustix::net::SendFlags::NOSIGNAL,
        ) {
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(VhostUserError::Io {
                    op,
                    source: e.into(),
                })
            }
        }
    }
    Ok(())
}

pub(super) fn read_exact(sock: &UnixStream, buf: &mut [u8], op: &'static str) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match rustix::net::recvmsg(
            sock,
            &mut [IoSliceMut::new(&mut buf[got..])],
            &mut rustix::net::RecvAncillaryBuffer::default(),
            rustix::net::RecvFlags::empty(),
        ) {
            Ok(r) if r.bytes == 0 => {
                return Err(VhostUserError::Io {
                    op,
                    source: std::io::ErrorKind::UnexpectedEof.into(),
                })
            }
            Ok(r) => got += r.bytes,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(VhostUserError::Io {
                    op,
                    source: e.into(),
                })
            }
        }
    }
    Ok(())
}
