//! Legacy creation (`RPMSG_CREATE_EPT_IOCTL`): the endpoint gets a node,
//! `RUNDIR/rpmsgN` (a listening `SOCK_SEQPACKET` socket, the lowest free
//! N), that a client must find and open; one open at a time, as
//! `/dev/rpmsgN` allows.
//!
//! Opening is `connect(2)` plus the node's greeting (status 0, or `-EBUSY`
//! while another connection has it open). Closing the connection releases
//! the open and leaves the endpoint; shutting its writing side down is the
//! destroy request (`RPMSG_DESTROY_EPT_IOCTL`): the node is unlinked and
//! the connection hung up.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use iopath_sys::lock;
use rustix::net::{SendFlags, SocketAddrUnix, SocketFlags, SocketType};
use tracing::debug;

use super::limits::Client;
use super::table::{Ept, Kind, Sink};
use super::{EptService, TAG_LISTENER, TAG_SOCK};
use crate::ctrl::proto::{
    create_ept_reply, reply_head, set_reply_max_payload, EptInfo, OPEN_REPLY_LEN, OP_OPEN,
};

/// Makes the endpoint and its node, answers the node's path on `c`.
pub(super) fn handle_create(svc: &EptService, client: Client, c: &OwnedFd, info: EptInfo) {
    let reply = match create(svc, client, &info) {
        Ok((out, path)) => create_ept_reply(0, &out, path.as_os_str().as_encoded_bytes()),
        Err(errno) => create_ept_reply(-errno, &info, b""),
    };
    super::conn::answer(c, &reply);
}

/// Node `index`'s file name, `rpmsgN`, as Linux names rpmsg_char's nodes.
fn node_name(index: u32) -> String {
    format!("rpmsg{index}")
}

/// Whether `name` is a node's file name ([`node_name`]).
pub(super) fn is_node_name(name: &str) -> bool {
    name.strip_prefix("rpmsg")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Nodes of other servers skipped before giving up (EADDRINUSE).
const MAX_FOREIGN_NODES: usize = 64;

fn create(svc: &EptService, client: Client, info: &EptInfo) -> Result<(EptInfo, PathBuf), i32> {
    // Two fds: the node's listener and, while open, its connection.
    svc.admit(client, 2)?;
    // The lowest free N, as Linux numbers rpmsg_char nodes; a node another
    // server listens on (a runtime directory shared by two hosts) is not
    // free, and is left alone.
    let mut taken = Vec::new();
    let (index, path, listener) = loop {
        let index = {
            let mut t = lock(&svc.inner.table);
            let mut i = 0;
            while t.node_indices.contains(&i) || taken.contains(&i) {
                i += 1;
            }
            t.node_indices.insert(i);
            i
        };
        let path = svc.inner.rundir.join(node_name(index));
        match bind(&path, svc.inner.node_mode) {
            Ok(l) => break (index, path, l),
            Err(e) => {
                lock(&svc.inner.table).node_indices.remove(&index);
                if e != libc::EADDRINUSE || taken.len() >= MAX_FOREIGN_NODES {
                    return Err(e);
                }
                taken.push(index);
            }
        }
    };
    let release_index = || {
        lock(&svc.inner.table).node_indices.remove(&index);
    };
    let sink = Arc::new(Sink::default());
    let id = svc.next_id();
    let bus_ept = match svc.bus_endpoint(id, info.clone(), &sink) {
        Ok(e) => e,
        Err(errno) => {
            let _ = std::fs::remove_file(&path);
            release_index();
            return Err(errno);
        }
    };
    let out = EptInfo {
        name: info.name.clone(),
        src: bus_ept.addr(),
        dst: bus_ept.dst(),
    };
    if let Err(errno) = svc.watch(id, &listener, TAG_LISTENER) {
        let _ = std::fs::remove_file(&path);
        release_index();
        return Err(errno);
    }
    svc.insert(
        id,
        Ept {
            bus_ept,
            sink,
            kind: Kind::Legacy {
                index,
                path: path.clone(),
                listener,
                owner: client.conn,
            },
            client,
        },
    );
    Ok((out, path))
}

fn bind(path: &std::path::Path, mode: u32) -> Result<OwnedFd, i32> {
    let fd = rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(|e| e.raw_os_error())?;
    // A stale node (its server died) is replaced; a live one is not ours.
    iopath_sys::unix_socket::claim(path, SocketType::SEQPACKET).map_err(|r| r.errno())?;
    let addr = SocketAddrUnix::new(path).map_err(|e| e.raw_os_error())?;
    rustix::net::bind(&fd, &addr).map_err(|e| e.raw_os_error())?;
    let done = rustix::fs::chmod(path, rustix::fs::Mode::from_raw_mode(mode))
        .and_then(|()| rustix::net::listen(&fd, 16));
    if let Err(e) = done {
        let _ = std::fs::remove_file(path);
        return Err(e.raw_os_error());
    }
    Ok(fd)
}

fn greeting(status: i32, max_payload: usize) -> Vec<u8> {
    let mut b = reply_head(OP_OPEN, status, OPEN_REPLY_LEN);
    set_reply_max_payload(&mut b, max_payload);
    b
}

/// Node `id` has connections waiting: the first one while the node is not
/// open gets it, every other one `EBUSY`.
pub(super) fn accept(svc: &EptService, id: u64) {
    loop {
        let (conn, sink) = {
            let t = lock(&svc.inner.table);
            let Some(e) = t.epts.get(&id) else { return };
            let Kind::Legacy { listener, .. } = &e.kind else {
                return;
            };
            match rustix::net::accept_with(listener, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK) {
                Ok(c) => (c, Arc::clone(&e.sink)),
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return,
            }
        };
        let mut slot = lock(&sink.sock);
        if slot.is_some() {
            drop(slot);
            debug!(target: "iopath_rpmsg", "node {id}: second open refused (EBUSY)");
            let _ = rustix::net::send(
                &conn,
                &greeting(-libc::EBUSY, svc.bus().max_payload()),
                SendFlags::NOSIGNAL,
            );
            continue;
        }
        if rustix::net::send(
            &conn,
            &greeting(0, svc.bus().max_payload()),
            SendFlags::NOSIGNAL,
        )
        .is_err()
        {
            continue;
        }
        let conn = Arc::new(conn);
        if svc.watch(id, &conn, TAG_SOCK).is_ok() {
            *slot = Some(conn);
        }
    }
}

/// The opener of node `id` closed it: the node may be opened again.
pub(super) fn release(svc: &EptService, id: u64, sock: &OwnedFd) {
    let t = lock(&svc.inner.table);
    let Some(e) = t.epts.get(&id) else { return };
    let mut slot = lock(&e.sink.sock);
    if slot.as_deref().is_some_and(|s| std::ptr::eq(s, sock)) {
        let _ = rustix::event::epoll::delete(&svc.inner.events.epoll, sock);
        *slot = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names() {
        assert_eq!(node_name(12), "rpmsg12");
        assert!(is_node_name(&node_name(0)));
        for other in ["rpmsg", "rpmsg1a", "rpmsg_ctrl0", "xrpmsg1", "notes"] {
            assert!(!is_node_name(other), "{other}");
        }
    }
}
