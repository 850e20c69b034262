//! A control connection's packets: each request parsed and served, ATTACH
//! handed to its own thread, answers sent without waiting, garbage closed.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use iopath_sys::lock;
use rustix::event::epoll;
use rustix::net::{RecvFlags, SendFlags, Shutdown};
use tracing::{debug, info, warn};

use super::{attach::attach, sys, Conn, EptService, TAG_CTRL};
use crate::ctrl::proto::{self, attach_reply, OP_ATTACH};
use crate::ctrl::CtrlError;

/// Requests taken from one control connection per wake-up.
const CTRL_DRAIN: usize = 16;

/// What became of a control connection after one of its packets.
pub(crate) enum Next {
    /// Served; read on.
    Keep,
    /// Not a request at all (answered with the errno): close it.
    Garbage(i32),
    /// ATTACH: the connection now belongs to its endpoint's own thread.
    Attached,
    /// STATS: answered at the end of the pass (see
    /// [`EptService::defer_stats`]); the connection's next request waits
    /// for the next pass, so the answers keep their order.
    Deferred,
}

/// Serves one packet of control connection `conn` (socket `c`, peer
/// `peer`); called by the service's event loop.
pub(crate) fn on_packet(
    svc: &EptService,
    conn: u64,
    c: &Arc<OwnedFd>,
    peer: &str,
    packet: &[u8],
) -> Next {
    if proto::parse_header(packet) == Ok(OP_ATTACH) {
        // ATTACH waits for an announcement and then carries the endpoint's
        // traffic for as long as the connection lives: its own thread.
        let (bus, c, packet, peer) = (
            svc.bus().clone(),
            Arc::clone(c),
            packet.to_vec(),
            peer.to_owned(),
        );
        let answer_to = Arc::clone(&c);
        let spawned = std::thread::Builder::new()
            .name("rpmsg-attach".into())
            .spawn(move || attach(bus, c, &packet, &peer));
        if let Err(e) = spawned {
            warn!(target: "iopath_rpmsg", "control client {conn}: no thread for ATTACH: {e}");
            let _ = rustix::net::send(
                &*answer_to,
                &attach_reply(-libc::EAGAIN, 0, 0),
                SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
            );
        }
        return Next::Attached;
    }
    match proto::Request::parse(packet) {
        Ok(proto::Request::Stats) => {
            svc.defer_stats(c);
            Next::Deferred
        }
        Ok(req) => {
            svc.handle(conn, c, req);
            Next::Keep
        }
        Err(r) => {
            let op = proto::parse_header(packet).unwrap_or(0);
            answer(c, &proto::reply_head(op, -r.errno, 12));
            if r.garbage {
                Next::Garbage(r.errno)
            } else {
                Next::Keep
            }
        }
    }
}

/// Sends an answer without ever waiting, so a client cannot stall the
/// event loop every client shares. One that does not read its answers
/// (its queue full) is disconnected rather than silently skipped, which
/// would leave it waiting for an answer that never comes: it reads the
/// answers queued so far, then end of file, and the loop frees what it held.
pub(crate) fn answer(c: &OwnedFd, bytes: &[u8]) {
    if let Err(e) = rustix::net::send(c, bytes, SendFlags::NOSIGNAL | SendFlags::DONTWAIT) {
        not_answered(c, e);
    }
}

/// An answer could not be sent on `c`: hang the connection up.
pub(crate) fn not_answered(c: &OwnedFd, e: rustix::io::Errno) {
    if e == rustix::io::Errno::AGAIN {
        warn!(target: "iopath_rpmsg", "control client does not read its answers: disconnected");
    } else {
        debug!(target: "iopath_rpmsg", "control answer not sent: {e}");
    }
    let _ = rustix::net::shutdown(c, Shutdown::Both);
}

/// One log line for a control connection that went away.
pub(crate) fn log_gone(conn: u64, peer: &str, garbage: Option<(usize, i32)>, freed: usize) {
    match garbage {
        Some((n, errno)) => warn!(
            target: "iopath_rpmsg",
            "control client {conn} ({peer}): malformed request ({n} bytes, {}); connection closed, {freed} legacy endpoints freed",
            std::io::Error::from_raw_os_error(errno)
        ),
        None => info!(
            target: "iopath_rpmsg",
            "control client {conn} ({peer}) gone; {freed} legacy endpoints freed"
        ),
    }
}

impl EptService {
    /// A control connection came (`peer` names it in the log): the event
    /// loop reads its requests from now on, in the same pass as the
    /// endpoints' traffic and hang-ups, so a create-and-close cycle costs
    /// the service one wake-up, not one per thread involved.
    pub(crate) fn add_client(&self, conn: u64, fd: OwnedFd, peer: String) -> Result<(), CtrlError> {
        // Unknown credentials share one bucket, bounded like any user.
        let uid = rustix::net::sockopt::socket_peercred(&fd).map_or(u32::MAX, |c| c.uid.as_raw());
        let fd = Arc::new(fd);
        lock(&self.inner.conns).insert(
            conn,
            Conn {
                fd: Arc::clone(&fd),
                peer,
                uid,
            },
        );
        self.inner.n.clients.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = epoll::add(
            &self.inner.events.epoll,
            &*fd,
            epoll::EventData::new_u64(conn << 2 | TAG_CTRL),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        ) {
            lock(&self.inner.conns).remove(&conn);
            self.inner.n.clients.fetch_sub(1, Ordering::Relaxed);
            return Err(sys("epoll_ctl")(e));
        }
        Ok(())
    }

    /// Control connection `conn` has packets (or went away).
    pub(super) fn ctrl_readable(&self, conn: u64, buf: &mut [u8]) {
        let Some((fd, peer)) = lock(&self.inner.conns)
            .get(&conn)
            .map(|c| (Arc::clone(&c.fd), c.peer.clone()))
        else {
            return;
        };
        for _ in 0..CTRL_DRAIN {
            // `buf` holds any request; a longer packet is garbage, cut to
            // `buf` (and logged with its full length).
            let (n, full) =
                match rustix::net::recv(&*fd, &mut *buf, RecvFlags::DONTWAIT | RecvFlags::TRUNC) {
                    Ok((_, 0)) => return self.client_gone(conn, &peer, None),
                    Ok(got) => got,
                    Err(rustix::io::Errno::AGAIN) => return,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => return self.client_gone(conn, &peer, None),
                };
            match on_packet(self, conn, &fd, &peer, &buf[..n]) {
                Next::Keep => {}
                // Still readable: the level-triggered set reports it again.
                Next::Deferred => return,
                Next::Garbage(errno) => return self.client_gone(conn, &peer, Some((full, errno))),
                Next::Attached => {
                    // The attach thread owns the connection now; it holds
                    // no endpoint of this service.
                    let _ = epoll::delete(&self.inner.events.epoll, &*fd);
                    lock(&self.inner.conns).remove(&conn);
                    self.client_closed(conn, false);
                    return;
                }
            }
        }
    }

    /// Control connection `conn` ended (or spoke garbage): out of the loop,
    /// its legacy endpoints freed, one log line.
    fn client_gone(&self, conn: u64, peer: &str, garbage: Option<(usize, i32)>) {
        if let Some(c) = lock(&self.inner.conns).remove(&conn) {
            let _ = epoll::delete(&self.inner.events.epoll, &*c.fd);
        }
        let freed = self.client_closed(conn, garbage.is_some());
        log_gone(conn, peer, garbage, freed);
    }

    /// A control connection went: its legacy endpoints go with it (their
    /// creator can no longer destroy them). Returns how many.
    pub(super) fn client_closed(&self, conn: u64, garbage: bool) -> usize {
        self.inner.n.clients.fetch_sub(1, Ordering::Relaxed);
        if garbage {
            self.inner.n.bad_clients.fetch_add(1, Ordering::Relaxed);
        }
        let ids = lock(&self.inner.table)
            .by_client
            .remove(&conn)
            .unwrap_or_default();
        let n = ids.len();
        for id in ids {
            self.destroy(id);
        }
        n
    }
}
