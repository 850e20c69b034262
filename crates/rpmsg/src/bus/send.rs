//! Sending: a message's header and payload written straight into a free
//! buffer of the link (no message assembled on the side first), the kick
//! decided (or left to a [`super::KickHold`]), a full ring waited out; and
//! waiting until the peer has taken everything sent.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use iopath_sys::lock;

use super::state::{kick as kick_peer, notify_down, wait_for_buffer};
use super::{Bus, BusError};
use crate::link::{Link, Slot};
use crate::wire::{self, HDR_LEN};

/// What became of a send.
enum Sent {
    /// The message went to the peer.
    Yes,
    /// No buffer is free.
    NoBuffer,
    /// The peer's buffer holds only this many bytes (header included): a
    /// peer set up with smaller buffers than ours, as when sizes are
    /// fixed on each side and differ. The buffer is kept for the next send.
    Small(usize),
}

/// Sends one message given as its header and payload: both written into
/// a free buffer of `link`, which then goes to the peer.
fn send_parts(link: &mut dyn Link, hdr: &[u8], data: &[u8]) -> Result<Sent, crate::LinkError> {
    let Some(slot) = link.get_tx()? else {
        return Ok(Sent::NoBuffer);
    };
    let len = hdr.len() + data.len();
    if len > slot.cap {
        let cap = slot.cap;
        link.drop_tx(slot);
        return Ok(Sent::Small(cap));
    }
    let mem = link.memory();
    let written = mem
        .write(slot.addr, hdr)
        .and_then(|()| mem.write(slot.addr + hdr.len() as u64, data));
    if let Err(e) = written {
        link.drop_tx(slot);
        return Err(e.into());
    }
    link.put_tx(slot, len)?;
    Ok(Sent::Yes)
}

impl Bus {
    /// Sends `data` from `src` to `dst`. `wait`: `None` fails at once with
    /// [`BusError::WouldBlock`] when no buffer is free; `Some(t)` waits up
    /// to `t`.
    ///
    /// # Errors
    /// [`BusError::TooLarge`], [`BusError::WouldBlock`],
    /// [`BusError::Timeout`], [`BusError::LinkDown`].
    pub fn send_raw(
        &self,
        src: u32,
        dst: u32,
        data: &[u8],
        wait: Option<Duration>,
    ) -> Result<(), BusError> {
        if data.len() > self.max_payload() {
            return Err(BusError::TooLarge {
                len: data.len(),
                max: self.max_payload(),
            });
        }
        // The header and the payload go straight into the free buffer: no
        // message is assembled on the side first.
        let hdr = wire::Header {
            src,
            dst,
            reserved: 0,
            len: data.len() as u16,
            flags: 0,
        }
        .encode(self.shared.endian);
        let deadline = wait.map(|w| Instant::now() + w);
        let mut st = lock(&self.shared.state);
        loop {
            if let Some(r) = &st.down {
                return Err(BusError::LinkDown(r.clone()));
            }
            match send_parts(&mut *st.link, &hdr, data) {
                Ok(Sent::Yes) => {
                    st.stats.tx_msgs += 1;
                    let kick = st.kick_due();
                    drop(st);
                    if kick {
                        kick_peer(&self.shared)?;
                    }
                    return Ok(());
                }
                Ok(Sent::NoBuffer) => {}
                Ok(Sent::Small(cap)) => {
                    st.stats.tx_too_large += 1;
                    tracing::warn!(
                        target: "iopath_rpmsg",
                        "a message of {} bytes does not fit the peer's {cap}-byte buffer",
                        hdr.len() + data.len()
                    );
                    return Err(BusError::TooLarge {
                        len: data.len(),
                        max: cap.saturating_sub(HDR_LEN),
                    });
                }
                Err(e) => {
                    let reason = e.to_string();
                    st.down = Some(reason.clone());
                    drop(st);
                    notify_down(&self.shared);
                    return Err(BusError::LinkDown(reason));
                }
            }
            let Some(deadline) = deadline else {
                return Err(BusError::WouldBlock);
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(BusError::Timeout);
            }
            // Buffers come back with the peer's next kick (the bus thread
            // then signals); poll every millisecond in case it does not kick.
            st = wait_for_buffer(&self.shared, st, deadline - now);
        }
    }

    /// Waits until the peer has taken every sent message (host role; the
    /// remote returns at once). Returns whether it did within `timeout`.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let mut st = lock(&self.shared.state);
                if st.down.is_some() {
                    return false;
                }
                match st.link.tx_in_flight() {
                    Ok(0) => return true,
                    Ok(_) => {}
                    Err(_) => return false,
                }
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Takes free buffers for up to `max` messages into `out` (none when
    /// every buffer is with the peer: the peer is then asked to kick when
    /// it gives one back). Give them back through [`Bus::send_slots`].
    ///
    /// # Errors
    /// [`BusError::LinkDown`].
    pub(crate) fn take_slots(&self, max: usize, out: &mut Vec<Slot>) -> Result<(), BusError> {
        let mut st = lock(&self.shared.state);
        if let Some(r) = &st.down {
            return Err(BusError::LinkDown(r.clone()));
        }
        while out.len() < max {
            match st.link.get_tx() {
                Ok(Some(s)) => out.push(s),
                Ok(None) => break,
                Err(e) => {
                    let r = e.to_string();
                    st.down.get_or_insert(r.clone());
                    drop(st);
                    notify_down(&self.shared);
                    return Err(BusError::LinkDown(r));
                }
            }
        }
        Ok(())
    }

    /// Receives messages from the socket `fd` straight into the payload
    /// room of `ranges` (taken with [`Bus::take_slots`]); see
    /// [`crate::LinkMemory::recv_from`]. `None` when the link's memory
    /// cannot be received into.
    pub(crate) fn recv_slots(
        &self,
        fd: BorrowedFd<'_>,
        ranges: &[(u64, usize)],
        full: &mut [usize],
    ) -> Option<rustix::io::Result<usize>> {
        self.shared.shm.recv_from(fd, ranges, full)
    }

    /// Sends slot `i` of `slots` from `src` to `dst` with a payload of
    /// `lens[i]` bytes already in place after its header's room, in order;
    /// gives back the slots with no length (or none given). One kick
    /// decision for all of them. Returns how many went.
    ///
    /// # Errors
    /// [`BusError::LinkDown`] (every slot given back or lost with the link).
    pub(crate) fn send_slots(
        &self,
        src: u32,
        dst: u32,
        slots: &mut Vec<Slot>,
        lens: &[Option<usize>],
    ) -> Result<usize, BusError> {
        let mut st = lock(&self.shared.state);
        let mut sent = 0;
        for (i, slot) in slots.drain(..).enumerate() {
            let len = lens.get(i).copied().flatten();
            let Some(len) = len.filter(|&l| st.down.is_none() && HDR_LEN + l <= slot.cap) else {
                st.link.drop_tx(slot);
                continue;
            };
            let hdr = wire::Header {
                src,
                dst,
                reserved: 0,
                len: len as u16,
                flags: 0,
            }
            .encode(self.shared.endian);
            if let Err(e) = self.shared.shm.write(slot.addr, &hdr) {
                st.link.drop_tx(slot);
                st.down.get_or_insert(e.to_string());
                continue;
            }
            if let Err(e) = st.link.put_tx(slot, HDR_LEN + len) {
                st.down.get_or_insert(e.to_string());
                continue;
            }
            st.stats.tx_msgs += 1;
            sent += 1;
        }
        if let Some(r) = st.down.clone() {
            drop(st);
            notify_down(&self.shared);
            return Err(BusError::LinkDown(r));
        }
        let kick = st.kick_due();
        drop(st);
        if kick {
            kick_peer(&self.shared)?;
        }
        Ok(sent)
    }
}
