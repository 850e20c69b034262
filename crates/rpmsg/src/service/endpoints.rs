//! An endpoint's life in the service: admitted against its owner's
//! bounds, given a bus endpoint that delivers into its socket, watched in
//! the epoll set, kept in the table, and destroyed with everything it
//! held.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use iopath_sys::lock;
use rustix::event::epoll;
use rustix::net::{SendFlags, Shutdown};
use tracing::debug;

use super::limits::Client;
use super::table::{Ept, Kind, Sink};
use super::{errno_of, EptService};
use crate::bus::{Endpoint, EndpointOptions, Event};
use crate::ctrl::proto::EptInfo;

impl EptService {
    /// Creates the bus endpoint for table entry `id` (its name moved into
    /// the bus), delivering into `sink`.
    pub(super) fn bus_endpoint(
        &self,
        id: u64,
        info: EptInfo,
        sink: &Arc<Sink>,
    ) -> Result<Endpoint, i32> {
        let sink = Arc::clone(sink);
        let inner = Arc::downgrade(&self.inner);
        self.inner
            .bus
            .create_with_callback(
                EndpointOptions {
                    name: info.name,
                    src: info.src,
                    dst: info.dst,
                    announce: false,
                },
                move |_, ev| {
                    let Some(inner) = inner.upgrade() else { return };
                    match ev {
                        Event::Message(m) => {
                            let sock = lock(&sink.sock).clone();
                            let sent = sock.is_some_and(|s| {
                                rustix::net::send(
                                    &*s,
                                    &m.data,
                                    SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
                                )
                                .is_ok()
                            });
                            let c = if sent {
                                &inner.n.msgs
                            } else {
                                &inner.n.dropped
                            };
                            c.fetch_add(1, Ordering::Relaxed);
                        }
                        Event::Unbound { .. } | Event::LinkDown(_) => {
                            if let Some(s) = lock(&sink.sock).as_ref() {
                                let _ = rustix::net::shutdown(&**s, Shutdown::Both);
                            }
                            inner.doom(id);
                        }
                    }
                },
            )
            .map_err(|e| errno_of(&e))
    }

    /// Adds `fd` (entry `id`'s socket of kind `tag`) to the epoll set.
    pub(super) fn watch(&self, id: u64, fd: &OwnedFd, tag: u64) -> Result<(), i32> {
        epoll::add(
            &self.inner.events.epoll,
            fd,
            epoll::EventData::new_u64(id << 2 | tag),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        )
        .map_err(|e| e.raw_os_error())
    }

    /// Whether `client` may make one more endpoint of `kind`'s cost (see
    /// [`limits`]); the errno it is refused with if not.
    pub(super) fn admit(&self, client: Client, fds: u64) -> Result<(), i32> {
        let conns = u64::from(self.inner.n.clients.load(Ordering::Relaxed));
        let r = lock(&self.inner.table)
            .usage
            .check(&self.inner.limits, client, fds, conns);
        if let Err(errno) = r {
            debug!(target: "iopath_rpmsg", "control client {} (uid {}): endpoint refused ({})",
                client.conn, client.uid, std::io::Error::from_raw_os_error(errno));
        }
        r
    }

    /// Adds a live endpoint (its socket already watched) to the table.
    pub(super) fn insert(&self, id: u64, ept: Ept) {
        let mut t = lock(&self.inner.table);
        t.insert(id, ept);
        // Counted under the table lock, so STATS is a consistent snapshot.
        self.inner.n.created.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Destroys entry `id`: out of the table and the epoll set, node
    /// unlinked, socket shut down both ways (every copy of the client's fd
    /// sees a hang-up), bus endpoint and address released.
    pub(super) fn destroy(&self, id: u64) {
        self.destroy_as(id, false);
    }

    /// As [`EptService::destroy`]; `peer_gone`: the client's end is closed,
    /// so nobody is left to hang up on and closing the socket drops its
    /// epoll registration by itself (two system calls fewer per cycle).
    pub(super) fn destroy_as(&self, id: u64, peer_gone: bool) {
        let ept = {
            let mut t = lock(&self.inner.table);
            let Some(ept) = t.remove(id) else {
                return;
            };
            self.inner.n.destroyed.fetch_add(1, Ordering::Relaxed);
            ept
        };
        if let Some(w) = lock(&self.inner.stalled).remove(&id) {
            self.inner
                .n
                .dropped
                .fetch_add(w.msgs.len() as u64, Ordering::Relaxed);
        }
        if let Kind::Legacy { path, listener, .. } = &ept.kind {
            let _ = epoll::delete(&self.inner.events.epoll, listener);
            let _ = std::fs::remove_file(path);
        }
        if let Some(s) = lock(&ept.sink.sock).take() {
            if !peer_gone {
                let _ = epoll::delete(&self.inner.events.epoll, &*s);
                let _ = rustix::net::shutdown(&*s, Shutdown::Both);
            }
        }
        debug!(target: "iopath_rpmsg", "endpoint {} destroyed", ept.bus_ept.addr());
        drop(ept);
    }
}
