//! Endpoints: their options, the non-owning handle callbacks get, and the
//! owning endpoint whose messages queue up.

use std::sync::mpsc;
use std::time::Duration;

use iopath_sys::lock;

use super::{Bus, BusError, Event, Message};
use crate::wire::ADDR_ANY;

/// Options for a new endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointOptions {
    /// Name (announced with the name service, matched against the peer's
    /// announcements).
    pub name: String,
    /// Local address, or [`ADDR_ANY`] for the next free one from 1024.
    pub src: u32,
    /// Peer address, or [`ADDR_ANY`] to bind on the peer's announcement or
    /// first message.
    pub dst: u32,
    /// Send name-service CREATE now and DESTROY when the endpoint goes.
    pub announce: bool,
}

impl EndpointOptions {
    /// An announced endpoint named `name`, any address, unbound.
    pub fn new(name: &str) -> Self {
        EndpointOptions {
            name: name.to_owned(),
            src: ADDR_ANY,
            dst: ADDR_ANY,
            announce: true,
        }
    }

    /// Sets the local address.
    pub fn src(mut self, src: u32) -> Self {
        self.src = src;
        self
    }

    /// Sets the peer address.
    pub fn dst(mut self, dst: u32) -> Self {
        self.dst = dst;
        self
    }

    /// Whether to announce.
    pub fn announce(mut self, announce: bool) -> Self {
        self.announce = announce;
        self
    }
}

/// A non-owning handle to an endpoint (what callbacks get).
#[derive(Clone, Debug)]
pub struct EndpointRef {
    pub(super) bus: Bus,
    pub(super) addr: u32,
}

impl EndpointRef {
    /// Local address.
    pub fn addr(&self) -> u32 {
        self.addr
    }

    /// The bus.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// Largest payload a send can carry (the negotiated buffer size of
    /// this side's direction, less the header).
    pub fn max_payload(&self) -> usize {
        self.bus.max_payload()
    }

    /// Current peer address ([`ADDR_ANY`] while unbound).
    pub fn dst(&self) -> u32 {
        lock(&self.bus.shared.state)
            .endpoints
            .get(&self.addr)
            .map_or(ADDR_ANY, |s| s.dst)
    }

    /// Sends to `dst`, waiting up to `wait` for a buffer (`None`: do not
    /// wait).
    ///
    /// # Errors
    /// As [`Bus::send_raw`].
    pub fn send_to(&self, dst: u32, data: &[u8], wait: Option<Duration>) -> Result<(), BusError> {
        self.bus.send_raw(self.addr, dst, data, wait)
    }

    /// Sends to the bound peer, waiting up to 5 s for a buffer.
    ///
    /// # Errors
    /// [`BusError::NotBound`] and as [`Bus::send_raw`].
    pub fn send(&self, data: &[u8]) -> Result<(), BusError> {
        self.send_timeout(data, Some(Duration::from_secs(5)))
    }

    /// Sends to the bound peer without waiting for a buffer.
    ///
    /// # Errors
    /// [`BusError::WouldBlock`] and as [`EndpointRef::send`].
    pub fn try_send(&self, data: &[u8]) -> Result<(), BusError> {
        self.send_timeout(data, None)
    }

    /// Sends to the bound peer, waiting up to `wait`.
    ///
    /// # Errors
    /// As [`EndpointRef::send`].
    pub fn send_timeout(&self, data: &[u8], wait: Option<Duration>) -> Result<(), BusError> {
        let dst = self.dst();
        if dst == ADDR_ANY {
            return Err(BusError::NotBound { addr: self.addr });
        }
        self.send_to(dst, data, wait)
    }
}

/// An endpoint; dropping it destroys it (with a name-service DESTROY if it
/// was announced).
#[derive(Debug)]
pub struct Endpoint {
    pub(super) r: EndpointRef,
    pub(super) rx: Option<mpsc::Receiver<Event>>,
}

impl std::ops::Deref for Endpoint {
    type Target = EndpointRef;
    fn deref(&self) -> &EndpointRef {
        &self.r
    }
}

impl Endpoint {
    /// Next event, waiting up to `timeout` (`None`: forever).
    ///
    /// # Errors
    /// [`BusError::Timeout`], [`BusError::CallbackEndpoint`].
    pub fn recv_event(&self, timeout: Option<Duration>) -> Result<Event, BusError> {
        let rx = self.rx.as_ref().ok_or(BusError::CallbackEndpoint)?;
        let ev = match timeout {
            None => rx.recv().map_err(|_| BusError::LinkDown("bus gone".into())),
            Some(t) => rx.recv_timeout(t).map_err(|e| match e {
                mpsc::RecvTimeoutError::Timeout => BusError::Timeout,
                mpsc::RecvTimeoutError::Disconnected => BusError::LinkDown("bus gone".into()),
            }),
        }?;
        Ok(ev)
    }

    /// Next message, waiting up to `timeout`.
    ///
    /// # Errors
    /// [`BusError::Unbound`] when the peer destroyed the service,
    /// [`BusError::LinkDown`], [`BusError::Timeout`].
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Message, BusError> {
        match self.recv_event(timeout)? {
            Event::Message(m) => Ok(m),
            Event::Unbound { .. } => Err(BusError::Unbound),
            Event::LinkDown(r) => Err(BusError::LinkDown(r)),
        }
    }

    /// The next message if one is queued.
    ///
    /// # Errors
    /// [`BusError::WouldBlock`] when none is, else as [`Endpoint::recv`].
    pub fn try_recv(&self) -> Result<Message, BusError> {
        let rx = self.rx.as_ref().ok_or(BusError::CallbackEndpoint)?;
        match rx.try_recv() {
            Ok(Event::Message(m)) => Ok(m),
            Ok(Event::Unbound { .. }) => Err(BusError::Unbound),
            Ok(Event::LinkDown(r)) => Err(BusError::LinkDown(r)),
            Err(mpsc::TryRecvError::Empty) => Err(BusError::WouldBlock),
            Err(mpsc::TryRecvError::Disconnected) => Err(BusError::LinkDown("bus gone".into())),
        }
    }

    /// A non-owning handle.
    pub fn handle(&self) -> EndpointRef {
        self.r.clone()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.r.bus.destroy(self.r.addr);
    }
}
