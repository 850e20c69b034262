//! Zero-copy buffers: a received message read in place from the peer's
//! shared buffer, a message built in place in a free one, and the
//! endpoint that receives them.

use std::fmt;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use iopath_sys::lock;

use super::dispatch::release;
use super::state::{
    kick as kick_peer, wait_for_buffer, InPlaceCallback, Shared, Sink, ZeroCopyEvent,
};
use super::{Bus, BusError, Endpoint, EndpointOptions, EndpointRef, Event};
use crate::link::{self, Slot};
use crate::wire::{self, ADDR_ANY, HDR_LEN};

/// A message still in the peer's shared buffer (zero-copy receive). The
/// buffer goes back to the peer when this is dropped. The bytes are shared
/// memory the peer could still write, so they are read out through
/// [`RxBuffer::read`], never lent as a slice.
pub struct RxBuffer {
    pub(super) shared: Arc<Shared>,
    pub(super) held: Option<link::Held>,
    pub(super) src: u32,
    pub(super) dst: u32,
    /// Device address of the payload.
    pub(super) addr: u64,
    pub(super) len: usize,
}

impl fmt::Debug for RxBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RxBuffer")
            .field("src", &self.src)
            .field("dst", &self.dst)
            .field("addr", &self.addr)
            .field("len", &self.len)
            .finish()
    }
}

impl RxBuffer {
    /// Sender address.
    pub fn src(&self) -> u32 {
        self.src
    }

    /// Our address.
    pub fn dst(&self) -> u32 {
        self.dst
    }

    /// Payload length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of the payload in the shared memory (its device address).
    pub fn shm_offset(&self) -> u64 {
        self.addr
    }

    /// Copies `dst.len()` payload bytes from `offset` straight out of the
    /// shared buffer.
    ///
    /// # Errors
    /// [`BusError::TooLarge`] if the range runs past the payload.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), BusError> {
        if offset.checked_add(dst.len()).is_none_or(|e| e > self.len) {
            return Err(BusError::TooLarge {
                len: offset.saturating_add(dst.len()),
                max: self.len,
            });
        }
        self.shared
            .shm
            .read(self.addr + offset as u64, dst)
            .map_err(|e| BusError::Link(e.into()))
    }

    /// The whole payload, copied.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // In range by construction (checked against the buffer when held).
        let _ = self.read(0, &mut v);
        v
    }
}

impl Drop for RxBuffer {
    fn drop(&mut self) {
        let Some(h) = self.held.take() else { return };
        let kick = {
            let mut st = lock(&self.shared.state);
            if st.down.is_some() {
                return;
            }
            release(&mut st, h);
            st.kick_due()
        };
        if kick {
            let _ = self.shared.notifier.kick();
        }
    }
}

/// What an in-place callback endpoint is handed (see
/// [`Bus::create_in_place`]).
#[derive(Debug)]
pub enum InPlace<'a> {
    /// A message, still in the peer's shared buffer: read what is needed
    /// of it; the buffer goes back to the peer when the callback returns.
    Message(&'a RxBuffer),
    /// Anything else an endpoint hears of ([`Event::Unbound`],
    /// [`Event::LinkDown`]; never [`Event::Message`]).
    Event(Event),
}

impl Bus {
    /// Creates an endpoint whose messages go to `cb` in place: called on
    /// the bus thread with each message still in the peer's shared
    /// buffer ([`InPlace::Message`]), which goes back to the peer when the
    /// callback returns. Nothing is copied or allocated per message, which
    /// suits a service that reads little of what it gets (a sink counting
    /// messages, a header check). It may send, as [`Bus::create_with_callback`]'s may.
    ///
    /// # Errors
    /// As [`Bus::create`].
    pub fn create_in_place(
        &self,
        opts: EndpointOptions,
        cb: impl FnMut(&EndpointRef, InPlace<'_>) + Send + 'static,
    ) -> Result<Endpoint, BusError> {
        let cb: InPlaceCallback = Arc::new(Mutex::new(cb));
        let addr = self.register(opts, Sink::InPlace(cb))?;
        Ok(Endpoint {
            r: EndpointRef {
                bus: self.clone(),
                addr,
            },
            rx: None,
        })
    }
}

/// A free shared buffer to build a message in place (zero-copy send): write
/// the payload with [`TxBuffer::write`], then [`TxBuffer::send`]. Dropped
/// unsent, the buffer is kept for the next send.
pub struct TxBuffer {
    pub(super) ep: EndpointRef,
    pub(super) slot: Option<Slot>,
}

impl fmt::Debug for TxBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxBuffer")
            .field("src", &self.ep.addr)
            .field("slot", &self.slot)
            .finish()
    }
}

impl TxBuffer {
    /// Payload bytes the buffer holds.
    pub fn capacity(&self) -> usize {
        self.slot
            .as_ref()
            .map_or(0, |s| (s.cap - HDR_LEN).min(usize::from(u16::MAX)))
    }

    /// Offset of the payload in the shared memory (its device address).
    pub fn shm_offset(&self) -> u64 {
        self.slot.as_ref().map_or(0, |s| s.addr + HDR_LEN as u64)
    }

    /// Writes payload bytes at `offset`, straight into the shared buffer.
    ///
    /// # Errors
    /// [`BusError::TooLarge`] past the capacity.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), BusError> {
        let cap = self.capacity();
        if offset.checked_add(data.len()).is_none_or(|e| e > cap) {
            return Err(BusError::TooLarge {
                len: offset.saturating_add(data.len()),
                max: cap,
            });
        }
        let addr = self.shm_offset() + offset as u64;
        self.ep
            .bus
            .shared
            .shm
            .write(addr, data)
            .map_err(|e| BusError::Link(e.into()))
    }

    /// Sends the first `len` payload bytes to the bound peer.
    ///
    /// # Errors
    /// [`BusError::NotBound`], [`BusError::TooLarge`],
    /// [`BusError::LinkDown`].
    pub fn send(self, len: usize) -> Result<(), BusError> {
        let dst = self.ep.dst();
        if dst == ADDR_ANY {
            return Err(BusError::NotBound { addr: self.ep.addr });
        }
        self.send_to(dst, len)
    }

    /// Sends the first `len` payload bytes to `dst`.
    ///
    /// # Errors
    /// [`BusError::TooLarge`], [`BusError::LinkDown`].
    pub fn send_to(mut self, dst: u32, len: usize) -> Result<(), BusError> {
        let cap = self.capacity();
        if len > cap {
            return Err(BusError::TooLarge { len, max: cap });
        }
        let shared = &self.ep.bus.shared;
        let hdr = wire::Header {
            src: self.ep.addr,
            dst,
            reserved: 0,
            len: len as u16,
            flags: 0,
        };
        let slot = self.slot.take().expect("slot until sent");
        if let Err(e) = shared.shm.write(slot.addr, &hdr.encode(shared.endian)) {
            lock(&shared.state).link.drop_tx(slot);
            return Err(BusError::Link(e.into()));
        }
        let kick = {
            let mut st = lock(&shared.state);
            if let Some(r) = &st.down {
                return Err(BusError::LinkDown(r.clone()));
            }
            if let Err(e) = st.link.put_tx(slot, HDR_LEN + len) {
                let r = e.to_string();
                st.down.get_or_insert(r.clone());
                return Err(BusError::LinkDown(r));
            }
            st.stats.tx_msgs += 1;
            st.kick_due()
        };
        if kick {
            kick_peer(shared)?;
        }
        Ok(())
    }
}

impl Drop for TxBuffer {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            lock(&self.ep.bus.shared.state).link.drop_tx(slot);
            self.ep.bus.shared.cond.notify_all();
        }
    }
}

impl EndpointRef {
    /// A free shared buffer to build the next message in (zero-copy send),
    /// waiting up to `wait` (`None`: do not wait).
    ///
    /// # Errors
    /// [`BusError::WouldBlock`], [`BusError::Timeout`],
    /// [`BusError::LinkDown`].
    pub fn alloc(&self, wait: Option<Duration>) -> Result<TxBuffer, BusError> {
        let shared = &self.bus.shared;
        let deadline = wait.map(|w| Instant::now() + w);
        let mut st = lock(&shared.state);
        loop {
            if let Some(r) = &st.down {
                return Err(BusError::LinkDown(r.clone()));
            }
            match st.link.get_tx() {
                Ok(Some(slot)) => {
                    return Ok(TxBuffer {
                        ep: self.clone(),
                        slot: Some(slot),
                    })
                }
                Ok(None) => {}
                Err(e) => {
                    let r = e.to_string();
                    st.down.get_or_insert(r.clone());
                    return Err(BusError::LinkDown(r));
                }
            }
            let Some(deadline) = deadline else {
                return Err(BusError::WouldBlock);
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(BusError::Timeout);
            }
            st = wait_for_buffer(shared, st, deadline - now);
        }
    }
}

/// An endpoint whose messages stay in the peer's shared buffers
/// ([`Bus::create_zero_copy`](super::Bus::create_zero_copy)); dropping it destroys it.
#[derive(Debug)]
pub struct ZeroCopyEndpoint {
    pub(super) r: EndpointRef,
    pub(super) rx: mpsc::Receiver<ZeroCopyEvent>,
}

impl fmt::Debug for ZeroCopyEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZeroCopyEvent::Buf(b) => b.fmt(f),
            ZeroCopyEvent::Unbound => f.write_str("Unbound"),
            ZeroCopyEvent::LinkDown(r) => write!(f, "LinkDown({r})"),
        }
    }
}

impl std::ops::Deref for ZeroCopyEndpoint {
    type Target = EndpointRef;
    fn deref(&self) -> &EndpointRef {
        &self.r
    }
}

impl ZeroCopyEndpoint {
    /// The next message, in its shared buffer, waiting up to `timeout`
    /// (`None`: forever).
    ///
    /// # Errors
    /// [`BusError::Timeout`], [`BusError::Unbound`], [`BusError::LinkDown`].
    pub fn recv(&self, timeout: Option<Duration>) -> Result<RxBuffer, BusError> {
        let h = match timeout {
            None => self
                .rx
                .recv()
                .map_err(|_| BusError::LinkDown("bus gone".into()))?,
            Some(t) => self.rx.recv_timeout(t).map_err(|e| match e {
                mpsc::RecvTimeoutError::Timeout => BusError::Timeout,
                mpsc::RecvTimeoutError::Disconnected => BusError::LinkDown("bus gone".into()),
            })?,
        };
        match h {
            ZeroCopyEvent::Buf(b) => Ok(b),
            ZeroCopyEvent::Unbound => Err(BusError::Unbound),
            ZeroCopyEvent::LinkDown(r) => Err(BusError::LinkDown(r)),
        }
    }

    /// A non-owning handle.
    pub fn handle(&self) -> EndpointRef {
        self.r.clone()
    }
}

impl Drop for ZeroCopyEndpoint {
    fn drop(&mut self) {
        self.r.bus.destroy(self.r.addr);
    }
}
