//! fd creation (`RPMSG_CREATE_EPT_FD_IOCTL`): the endpoint is one end of a
//! `SOCK_SEQPACKET` socketpair, handed to the client over `SCM_RIGHTS`.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};

use rustix::net::{
    AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use tracing::debug;

use super::{Ept, EptService, Kind, Sink, TAG_SOCK};
use crate::ctrl::proto::{create_ept_fd_reply, EptInfo};

/// Send buffer of the client's end: as small as the kernel allows, so that
/// the kernel itself refuses (`EMSGSIZE`) the largest writes; the service
/// drops what gets past it and is still over 496 bytes.
const CLIENT_SNDBUF: usize = 0;

/// Makes the endpoint and answers on `c`, the fd riding along.
pub(super) fn handle_create(svc: &EptService, c: &OwnedFd, info: EptInfo, flags: u32) {
    match create(svc, &info, flags) {
        Ok((info, client)) => {
            let reply = create_ept_fd_reply(0, &info, flags);
            let fds = [client.as_fd()];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut anc = SendAncillaryBuffer::new(&mut space);
            anc.push(SendAncillaryMessage::ScmRights(&fds));
            if let Err(e) =
                rustix::net::sendmsg(c, &[IoSlice::new(&reply)], &mut anc, SendFlags::NOSIGNAL)
            {
                // The client is gone: dropping its end hangs the socketpair
                // up, and the pump destroys the endpoint.
                debug!(target: "iopath_rpmsg", "CREATE_EPT_FD answer not sent: {e}");
            }
        }
        Err(errno) => {
            let _ = rustix::net::send(
                c,
                &create_ept_fd_reply(-errno, &info, flags),
                SendFlags::NOSIGNAL,
            );
        }
    }
}

fn create(svc: &EptService, info: &EptInfo, flags: u32) -> Result<(EptInfo, OwnedFd), i32> {
    let mut sf = SocketFlags::CLOEXEC;
    if flags & libc::O_NONBLOCK as u32 != 0 {
        // O_NONBLOCK is a file status flag: it travels with the fd. The
        // service's end is set too, but the service never blocks on it.
        sf |= SocketFlags::NONBLOCK;
    }
    let (ours, client) =
        rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, sf, None)
            .map_err(|e| e.raw_os_error())?;
    rustix::net::sockopt::set_socket_send_buffer_size(&client, CLIENT_SNDBUF)
        .map_err(|e| e.raw_os_error())?;
    let ours = Arc::new(ours);
    let sink = Arc::new(Sink {
        sock: Mutex::new(Some(Arc::clone(&ours))),
    });
    let id = svc.next_id();
    let bus_ept = svc.bus_endpoint(id, info, &sink)?;
    let out = EptInfo {
        name: info.name.clone(),
        src: bus_ept.addr(),
        dst: bus_ept.dst(),
    };
    svc.watch(id, &ours, TAG_SOCK)?;
    svc.insert(
        id,
        Ept {
            bus_ept,
            sink,
            kind: Kind::Fd,
        },
    );
    Ok((out, client))
}
