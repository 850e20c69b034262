//! From a client's endpoint socket to the bus: messages taken in batches,
//! those that find no free bus buffer queued (the socket out of the epoll
//! set) and retried, oversized ones ending the endpoint, end of file
//! destroying or releasing it.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use iopath_sys::lock;
use rustix::event::epoll;
use rustix::net::Shutdown;
use tracing::{debug, warn};

use super::batch::{RecvBatch, BATCH};
use super::table::Kind;
use super::{legacy, EptService, Stalled, DRAIN, SEND_WAIT, TAG_SOCK};
use crate::bus::{BusError, EndpointRef};

impl EptService {
    /// Tries again every message waiting for a bus buffer; an endpoint
    /// whose message went gets its socket back in the epoll set. Returns
    /// whether any went.
    pub(super) fn retry_stalled(&self) -> bool {
        let ids: Vec<u64> = lock(&self.inner.stalled).keys().copied().collect();
        let mut any = false;
        for id in ids {
            let Some((sock, ep)) = ({
                let t = lock(&self.inner.table);
                t.epts
                    .get(&id)
                    .map(|e| (lock(&e.sink.sock).clone(), e.bus_ept.handle()))
            }) else {
                lock(&self.inner.stalled).remove(&id);
                continue;
            };
            let mut st = lock(&self.inner.stalled);
            let Some(waiting) = st.get_mut(&id) else {
                continue;
            };
            let gave_up = waiting.since.elapsed() >= SEND_WAIT;
            let mut link_down = false;
            while let Some(msg) = waiting.msgs.front() {
                match ep.try_send(msg) {
                    Err(BusError::WouldBlock) if !gave_up => break,
                    Ok(()) => {
                        self.inner.n.msgs.fetch_add(1, Ordering::Relaxed);
                        any = true;
                    }
                    Err(BusError::LinkDown(_)) => {
                        link_down = true;
                        break;
                    }
                    Err(e) => self.not_sent(&ep, &e),
                }
                waiting.msgs.pop_front();
            }
            if link_down {
                st.remove(&id);
                drop(st);
                self.inner.doom(id);
                continue;
            }
            if !waiting.msgs.is_empty() {
                continue;
            }
            let then_end = waiting.then_end;
            st.remove(&id);
            drop(st);
            if then_end {
                self.destroy(id);
                continue;
            }
            // Reading resumes: what the client wrote meanwhile (or its
            // close) is reported again.
            if let Some(sock) = sock {
                let _ = self.watch(id, &sock, TAG_SOCK);
            }
        }
        any
    }

    /// Takes what the client wrote on endpoint `id`'s socket to the bus.
    pub(super) fn forward(&self, id: u64, flags: epoll::EventFlags, batch: &mut RecvBatch) {
        let (sock, ep, legacy) = {
            let t = lock(&self.inner.table);
            let Some(e) = t.epts.get(&id) else { return };
            let Some(s) = lock(&e.sink.sock).clone() else {
                return;
            };
            (s, e.bus_ept.handle(), matches!(e.kind, Kind::Legacy { .. }))
        };
        if lock(&self.inner.stalled).contains_key(&id) {
            return;
        }
        if self.forward_in_place(id, &sock, &ep, legacy, flags) {
            return;
        }
        let hup = flags.intersects(epoll::EventFlags::HUP | epoll::EventFlags::RDHUP);
        // One message first: a lone message (a ping-pong) is taken as
        // cheaply as by recv(2), and only a socket that had one has more
        // asked for, up to a batch at a time.
        let mut max = 1;
        let mut taken = 0;
        while taken < DRAIN {
            let k = match batch.recv(sock.as_fd(), max) {
                Ok(k) => k,
                Err(rustix::io::Errno::AGAIN) => return,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return self.end_of_file(id, legacy, &sock, flags),
            };
            for i in 0..k {
                let (data, full) = batch.get(i);
                if full == 0 && hup {
                    return self.end_of_file(id, legacy, &sock, flags);
                }
                if full > ep.max_payload() {
                    // Not dropped silently: the endpoint ends, so the
                    // writer's next call fails (see the module doc).
                    self.oversize(&ep, full);
                    return self.destroy(id);
                }
                if !self.to_bus(id, &ep, &sock, data) {
                    // The rest of the batch, already off the socket,
                    // waits behind it.
                    self.stall_rest(id, &ep, batch, i + 1..k, hup);
                    return;
                }
            }
            if k < max {
                return; // the socket is empty
            }
            taken += k;
            max = BATCH;
        }
    }

    /// A message the bus refused on `ep` for good (`e`): counted, as too
    /// large for the peer's buffers (sizes fixed on each side and the
    /// peer's smaller) or as dropped.
    fn not_sent(&self, ep: &EndpointRef, e: &BusError) {
        let n = &self.inner.n;
        let c = match e {
            BusError::TooLarge { .. } => &n.too_large,
            _ => &n.dropped,
        };
        c.fetch_add(1, Ordering::Relaxed);
        debug!(target: "iopath_rpmsg", "endpoint {}: message dropped: {e}", ep.addr());
    }

    /// One oversized message on `ep`: counted and logged.
    pub(super) fn oversize(&self, ep: &EndpointRef, full: usize) {
        self.inner.n.oversize.fetch_add(1, Ordering::Relaxed);
        warn!(target: "iopath_rpmsg", "endpoint {}: {full}-byte message (max {}): endpoint hung up", ep.addr(), ep.max_payload());
    }

    /// Queues messages `rest` of `batch` behind endpoint `id`'s stalled
    /// one, up to an end of file (reported again once the socket is
    /// watched again) or an oversized message (the endpoint then ends
    /// once the queue went).
    pub(super) fn stall_rest(
        &self,
        id: u64,
        ep: &EndpointRef,
        batch: &RecvBatch,
        rest: std::ops::Range<usize>,
        hup: bool,
    ) {
        let mut st = lock(&self.inner.stalled);
        let Some(waiting) = st.get_mut(&id) else {
            return;
        };
        for i in rest {
            let (data, full) = batch.get(i);
            if full == 0 && hup {
                return;
            }
            if full > ep.max_payload() {
                self.oversize(ep, full);
                waiting.then_end = true;
                return;
            }
            waiting.msgs.push_back(data.to_vec());
        }
    }

    /// Sends one message of endpoint `id`; returns false when it has to
    /// wait for a bus buffer (the socket then leaves the epoll set until
    /// [`EptService::retry_stalled`] sends it).
    pub(super) fn to_bus(&self, id: u64, ep: &EndpointRef, sock: &OwnedFd, data: &[u8]) -> bool {
        match ep.try_send(data) {
            Ok(()) => {
                self.inner.n.msgs.fetch_add(1, Ordering::Relaxed);
            }
            Err(BusError::WouldBlock) => {
                let _ = epoll::delete(&self.inner.events.epoll, sock);
                lock(&self.inner.stalled).insert(
                    id,
                    Stalled {
                        msgs: std::collections::VecDeque::from([data.to_vec()]),
                        then_end: false,
                        since: std::time::Instant::now(),
                    },
                );
                return false;
            }
            Err(BusError::LinkDown(r)) => {
                debug!(target: "iopath_rpmsg", "endpoint {}: link down ({r})", ep.addr());
                let _ = rustix::net::shutdown(sock, Shutdown::Both);
                self.inner.doom(id);
            }
            Err(e) => self.not_sent(ep, &e),
        }
        true
    }

    /// The client's side of endpoint `id` ended: the last copy of an fd
    /// endpoint closed (destroy), a legacy node's opener shut its writing
    /// side (destroy) or closed it (release the open).
    pub(super) fn end_of_file(
        &self,
        id: u64,
        legacy: bool,
        sock: &OwnedFd,
        flags: epoll::EventFlags,
    ) {
        let closed = flags.contains(epoll::EventFlags::HUP);
        if legacy && closed {
            legacy::release(self, id, sock);
        } else {
            self.destroy_as(id, closed && !legacy);
        }
    }
}
