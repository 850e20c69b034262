//! From a client's endpoint socket straight into the ring's buffers: free
//! tx buffers taken first, the kernel receiving each message into its
//! buffer's payload room, the batch sent with one kick decision. No copy
//! of the service's own; when the ring is full (or the link's memory
//! cannot be received into) the copying path in `forward` takes over and
//! makes the messages wait.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use rustix::event::epoll;
use rustix::net::Shutdown;

use super::{EptService, DRAIN};
use crate::bus::{BusError, EndpointRef};
use crate::shm::sock_rx::MAX_RANGES;
use crate::wire::{ADDR_ANY, HDR_LEN};

/// What ends a batch after its messages went.
enum End {
    /// The client's end of file.
    Eof,
    /// A message past the largest payload, this long.
    Oversize(usize),
}

impl EptService {
    /// Takes what the client wrote on endpoint `id`'s socket straight into
    /// ring buffers; returns false, having taken nothing it did not send,
    /// when the copying path must go on (no free buffer, the endpoint
    /// unbound, a link whose memory cannot be received into).
    pub(super) fn forward_in_place(
        &self,
        id: u64,
        sock: &OwnedFd,
        ep: &EndpointRef,
        legacy: bool,
        flags: epoll::EventFlags,
    ) -> bool {
        let dst = ep.dst();
        if dst == ADDR_ANY {
            return false;
        }
        let bus = ep.bus();
        let hup = flags.intersects(epoll::EventFlags::HUP | epoll::EventFlags::RDHUP);
        let max_payload = ep.max_payload();
        let mut slots = Vec::with_capacity(MAX_RANGES);
        let mut ranges = [(0u64, 0usize); MAX_RANGES];
        let mut full = [0usize; MAX_RANGES];
        let mut lens = [None; MAX_RANGES];
        // One message first, as the copying path does: a lone message costs
        // one recv(2).
        let mut max = 1;
        let mut taken = 0;
        while taken < DRAIN {
            if bus.take_slots(max, &mut slots).is_err() || slots.is_empty() {
                let _ = bus.send_slots(ep.addr(), dst, &mut slots, &[]);
                return false;
            }
            let n = slots.len();
            for (r, s) in ranges.iter_mut().zip(&slots) {
                *r = (s.addr + HDR_LEN as u64, (s.cap - HDR_LEN).min(max_payload));
            }
            let k = match bus.recv_slots(sock.as_fd(), &ranges[..n], &mut full) {
                Some(Ok(k)) => k,
                r => {
                    let _ = bus.send_slots(ep.addr(), dst, &mut slots, &[]);
                    return match r {
                        None => false,
                        Some(Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR)) => true,
                        Some(_) => {
                            self.end_of_file(id, legacy, sock, flags);
                            true
                        }
                    };
                }
            };
            let mut end = None;
            for i in 0..n {
                lens[i] = None;
                if i >= k || end.is_some() {
                    continue;
                }
                let f = full[i];
                if f == 0 && hup {
                    end = Some(End::Eof);
                } else if f > max_payload {
                    // Not dropped silently: the endpoint ends (see the
                    // module doc of the service).
                    end = Some(End::Oversize(f));
                } else if f > ranges[i].1 {
                    // The peer's buffer is smaller than the payload
                    // negotiated (sizes fixed on each side).
                    self.inner.n.too_large.fetch_add(1, Ordering::Relaxed);
                } else {
                    lens[i] = Some(f);
                }
            }
            match bus.send_slots(ep.addr(), dst, &mut slots, &lens[..n]) {
                Ok(sent) => {
                    self.inner.n.msgs.fetch_add(sent as u64, Ordering::Relaxed);
                }
                Err(BusError::LinkDown(_)) => {
                    let _ = rustix::net::shutdown(sock, Shutdown::Both);
                    self.inner.doom(id);
                    return true;
                }
                Err(_) => {}
            }
            match end {
                Some(End::Eof) => {
                    self.end_of_file(id, legacy, sock, flags);
                    return true;
                }
                Some(End::Oversize(f)) => {
                    self.oversize(ep, f);
                    self.destroy(id);
                    return true;
                }
                None => {}
            }
            if k < n {
                return true; // the socket is empty
            }
            taken += k;
            max = MAX_RANGES;
        }
        true
    }
}
