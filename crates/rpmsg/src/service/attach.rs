//! ATTACH on the server side: the control connection becomes an announced
//! endpoint bound to a channel the peer announced, on a thread of its own.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::net::{RecvFlags, SendFlags, Shutdown};
use tracing::{info, warn};

use super::errno_of;
use crate::bus::{Bus, BusError, EndpointOptions, Event};
use crate::ctrl::proto::{attach_reply, AttachRequest};
use crate::wire::ADDR_ANY;

/// ATTACH: the connection becomes the endpoint.
pub(super) fn attach(bus: Bus, c: Arc<OwnedFd>, packet: &[u8], cred: &str) {
    let n = packet.len();
    let max = bus.max_payload();
    let mut buf = vec![0u8; 4096.max(max + 1)];
    let req = match AttachRequest::parse(packet) {
        Ok(r) => r,
        Err(errno) => {
            warn!(target: "iopath_rpmsg", "control client ({cred}): refused request ({} bytes), errno {errno}", n);
            let _ = rustix::net::send(&c, &attach_reply(-errno, 0, 0), SendFlags::NOSIGNAL);
            return;
        }
    };
    let dst = if req.dst != ADDR_ANY {
        Ok(req.dst)
    } else {
        match wait_channel(&bus, &c, &req.name, req.timeout_ms) {
            Some(r) => r,
            None => {
                info!(target: "iopath_rpmsg", "control client ({cred}): gone while waiting for {:?}", req.name);
                return;
            }
        }
    };
    let ep = dst.and_then(|dst| {
        let w = Arc::clone(&c);
        bus.create_with_callback(
            EndpointOptions::new(&req.name).src(req.src).dst(dst),
            move |_, ev| match ev {
                Event::Message(m) => {
                    if let Err(e) = rustix::net::send(
                        &*w,
                        &m.data,
                        SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
                    ) {
                        warn!(target: "iopath_rpmsg", "control client: message from {} dropped: {e}", m.src);
                    }
                }
                Event::Unbound { .. } | Event::LinkDown(_) => {
                    let _ = rustix::net::shutdown(&*w, Shutdown::Both);
                }
            },
        )
    });
    let ep = match ep {
        Ok(ep) => ep,
        Err(e) => {
            warn!(target: "iopath_rpmsg", "control client ({cred}): attach to {:?} failed: {e}", req.name);
            let _ = rustix::net::send(&*c, &attach_reply(-errno_of(&e), 0, 0), SendFlags::NOSIGNAL);
            return;
        }
    };
    info!(target: "iopath_rpmsg", "control client ({cred}): endpoint {} -> {} ({:?})", ep.addr(), ep.dst(), req.name);
    if rustix::net::send(
        &*c,
        &attach_reply(0, ep.addr(), ep.dst()),
        SendFlags::NOSIGNAL,
    )
    .is_err()
    {
        return;
    }
    loop {
        let (n, full) = match rustix::net::recv(&*c, &mut buf[..], RecvFlags::TRUNC) {
            Ok(x) => x,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        };
        if full == 0 {
            break; // the client closed: dropping `ep` destroys the endpoint
        }
        if full > max {
            warn!(target: "iopath_rpmsg", "control client: {full}-byte message refused (max {max})");
            break;
        }
        if let Err(e) = ep.send(&buf[..n]) {
            warn!(target: "iopath_rpmsg", "control client: send failed: {e}");
            let _ = rustix::net::shutdown(&*c, Shutdown::Both);
            break;
        }
    }
}

/// Waits up to `timeout_ms` for the peer to announce `name`, in slices, so
/// a client that hangs up meanwhile ends the wait (and this thread) at
/// once instead of holding it for as long as it asked (up to 49 days).
/// `None`: the client is gone.
fn wait_channel(
    bus: &Bus,
    c: &OwnedFd,
    name: &str,
    timeout_ms: u32,
) -> Option<Result<u32, BusError>> {
    const SLICE: Duration = Duration::from_millis(100);
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match bus.wait_channel(name, left.min(SLICE)) {
            Err(BusError::Timeout) if left > SLICE => {}
            r => return Some(r.map(|ch| ch.addr)),
        }
        if hung_up(c) {
            return None;
        }
    }
}

/// Whether the client closed (or shut down) its end.
fn hung_up(c: &OwnedFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut p = [PollFd::new(c, PollFlags::RDHUP)];
    let zero = Timespec::default();
    poll(&mut p, Some(&zero)).is_ok()
        && p[0]
            .revents()
            .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
}
