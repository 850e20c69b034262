//! fd creation (`RPMSG_CREATE_EPT_FD_IOCTL`): the endpoint is one end of a
//! `SOCK_SEQPACKET` socketpair, handed to the client over `SCM_RIGHTS`.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};

use iopath_sys::lock;
use rustix::net::{
    AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, Shutdown, SocketFlags,
    SocketType,
};

/// `O_ACCMODE`.
const O_ACCMODE: u32 = libc::O_ACCMODE as u32;

use super::limits::Client;
use super::table::{Ept, Kind, Sink};
use super::{EptService, TAG_SOCK};
use crate::ctrl::proto::{
    create_ept_fd_reply, set_ept_fd_reply_addrs, set_reply_max_payload, EptInfo, O_NONBLOCK,
    O_RDONLY, O_WRONLY,
};

/// Send buffer asked for the client's end, for payloads of up to
/// `max_payload` bytes (`None`: the kernel's default is left). The kernel
/// doubles what is asked (at least 4608 bytes, at most twice
/// `net.core.wmem_max`) and refuses (`EMSGSIZE`) a message over that less
/// 32 bytes ([unix(7)], `unix_dgram_sendmsg`); a writer blocks once its
/// unread messages fill it.
///
/// At 496 bytes: the minimum, so the kernel itself refuses what exceeds
/// 4576 bytes, as before buffer sizes were negotiated. Above: room for
/// [`IN_FLIGHT`] messages (each with the kernel's per-message overhead),
/// and never less than any unix socket gets (`net.core.wmem_default`,
/// 212,992 bytes here, what the raw `SOCK_SEQPACKET` stream has): a
/// writer streaming large messages keeps the service busy instead of
/// waking it (and being woken) every few messages. The kernel's limit is
/// then well past the payload, and what gets past the payload ends the
/// endpoint. `EptFd::send` and the preload library refuse it first with
/// `EMSGSIZE`.
///
/// [unix(7)]: https://man7.org/linux/man-pages/man7/unix.7.html
pub(crate) fn client_sndbuf(max_payload: usize) -> Option<usize> {
    if max_payload <= crate::wire::MAX_PAYLOAD {
        return Some(0);
    }
    let want = (IN_FLIGHT * (max_payload + SKB_OVERHEAD)).div_ceil(2);
    (2 * want > wmem_default()).then_some(want)
}

/// `net.core.wmem_default`: the send buffer a socket starts with (read
/// once: endpoint creation costs no file read).
fn wmem_default() -> usize {
    static WMEM: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *WMEM.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/net/core/wmem_default")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(212_992)
    })
}

/// Messages of the largest payload a client's send buffer holds, at least.
const IN_FLIGHT: usize = 8;
/// What the kernel counts per message beyond its bytes (the `sk_buff` and
/// its shared info), rounded up.
const SKB_OVERHEAD: usize = 1024;

/// Makes the endpoint and answers on `c`, the fd riding along.
pub(super) fn handle_create(
    svc: &EptService,
    client: Client,
    c: &OwnedFd,
    info: EptInfo,
    flags: u32,
) {
    // The answer carries the request's name back: written now, as the
    // name then moves into the bus endpoint.
    let mut reply = create_ept_fd_reply(0, &info, flags);
    match create(svc, client, info, flags) {
        Ok((src, dst, client)) => {
            set_ept_fd_reply_addrs(&mut reply, src, dst);
            set_reply_max_payload(&mut reply, svc.bus().max_payload());
            let fds = [client.as_fd()];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut anc = SendAncillaryBuffer::new(&mut space);
            anc.push(SendAncillaryMessage::ScmRights(&fds));
            if let Err(e) = rustix::net::sendmsg(
                c,
                &[IoSlice::new(&reply)],
                &mut anc,
                SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
            ) {
                // Dropping the client's end hangs the socketpair up, and
                // the event loop destroys the endpoint; a client that does
                // not read its answers is disconnected.
                super::conn::not_answered(c, e);
            }
            drop(client);
            refill(svc);
        }
        Err(errno) => {
            // A refusal carries no info.
            let refusal = create_ept_fd_reply(-errno, &EptInfo::new(""), flags);
            super::conn::answer(c, &refusal);
        }
    }
}

/// Socketpairs kept ready, so a request costs no socket creation.
pub(super) const SPARES: usize = 4;

/// A socketpair made ahead of a request, its service end already watched
/// by the pump under entry `id`.
pub(super) struct Spare {
    id: u64,
    ours: Arc<OwnedFd>,
    client: OwnedFd,
}

fn make_spare(svc: &EptService) -> Result<Spare, i32> {
    let (ours, client) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| e.raw_os_error())?;
    if let Some(sndbuf) = client_sndbuf(svc.bus().max_payload()) {
        rustix::net::sockopt::set_socket_send_buffer_size(&client, sndbuf)
            .map_err(|e| e.raw_os_error())?;
    }
    let id = svc.next_id();
    svc.watch(id, &ours, TAG_SOCK)?;
    Ok(Spare {
        id,
        ours: Arc::new(ours),
        client,
    })
}

/// Tops the spares up (after an answer went out, while the client reads it).
pub(super) fn refill(svc: &EptService) {
    let mut made = None;
    loop {
        {
            let mut spares = lock(&svc.inner.spares);
            spares.extend(made.take());
            if spares.len() >= SPARES {
                return;
            }
        }
        match make_spare(svc) {
            Ok(s) => made = Some(s),
            Err(_) => return,
        }
    }
}

/// Makes the endpoint; returns its addresses and the client's end.
fn create(
    svc: &EptService,
    client: Client,
    info: EptInfo,
    flags: u32,
) -> Result<(u32, u32, OwnedFd), i32> {
    svc.admit(client, Kind::Fd.fds())?;
    let spare = match lock(&svc.inner.spares).pop() {
        Some(s) => s,
        None => make_spare(svc)?,
    };
    let sink = Arc::new(Sink {
        sock: Mutex::new(Some(Arc::clone(&spare.ours))),
    });
    let bus_ept = match svc.bus_endpoint(spare.id, info, &sink) {
        Ok(e) => e,
        Err(errno) => {
            // A refused request leaves the spare as it was.
            lock(&svc.inner.spares).push(spare);
            return Err(errno);
        }
    };
    if flags & O_NONBLOCK != 0 {
        // O_NONBLOCK is a file status flag: it travels with the fd. (The
        // service never blocks on its own end either way.)
        rustix::fs::fcntl_setfl(&spare.client, rustix::fs::OFlags::NONBLOCK)
            .map_err(|e| e.raw_os_error())?;
    }
    // The access mode shuts the other direction of the client's end: a
    // write on a read-only endpoint (or a read on a write-only one) gets
    // EPIPE, where a kernel endpoint would give EBADF.
    match flags & O_ACCMODE {
        O_RDONLY => {
            // Our end is about to read end of file for good: first watch
            // for the client's close (a hang-up, always reported) only, so
            // the event loop never takes that end of file for a close and
            // destroys the endpoint; then shut it.
            rustix::event::epoll::modify(
                &svc.inner.events.epoll,
                &*spare.ours,
                rustix::event::epoll::EventData::new_u64(spare.id << 2 | TAG_SOCK),
                rustix::event::epoll::EventFlags::empty(),
            )
            .map_err(|e| e.raw_os_error())?;
            rustix::net::shutdown(&spare.client, Shutdown::Write).map_err(|e| e.raw_os_error())?;
        }
        O_WRONLY => {
            rustix::net::shutdown(&spare.client, Shutdown::Read).map_err(|e| e.raw_os_error())?;
        }
        _ => {}
    }
    let (src, dst) = (bus_ept.addr(), bus_ept.dst());
    svc.insert(
        spare.id,
        Ept {
            bus_ept,
            sink,
            kind: Kind::Fd,
            client,
        },
    );
    Ok((src, dst, spare.client))
}
