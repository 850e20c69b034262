//! Endpoints in and out of the bus's table: an address given or the next
//! free one from 1024, bound at once to a channel the peer announced under
//! the same name, announced (name-service CREATE) when asked, withdrawn
//! when destroyed; and where each endpoint's messages go.

use std::sync::{mpsc, Arc, Mutex};

use iopath_sys::lock;
use tracing::debug;

use super::state::{Callback, EptSlot, Sink};
use super::{Bus, BusError, Endpoint, EndpointOptions, EndpointRef, Event, ZeroCopyEndpoint};
use crate::wire::{check_name, ADDR_ANY, NS_ADDR, RESERVED_ADDRESSES};

impl Bus {
    /// Creates an endpoint whose messages queue up for [`Endpoint::recv`].
    ///
    /// # Errors
    /// [`BusError::AddrInUse`], [`BusError::Name`], or a send error for the
    /// announcement.
    pub fn create(&self, opts: EndpointOptions) -> Result<Endpoint, BusError> {
        let (tx, rx) = mpsc::channel();
        let addr = self.register(opts, Sink::Queue(tx))?;
        Ok(Endpoint {
            r: EndpointRef {
                bus: self.clone(),
                addr,
            },
            rx: Some(rx),
        })
    }

    /// Creates an endpoint whose events go to `cb`, called on the service
    /// thread (it may send, e.g. to echo).
    ///
    /// # Errors
    /// As [`Bus::create`].
    pub fn create_with_callback(
        &self,
        opts: EndpointOptions,
        cb: impl FnMut(&EndpointRef, Event) + Send + 'static,
    ) -> Result<Endpoint, BusError> {
        let cb: Callback = Arc::new(Mutex::new(cb));
        let addr = self.register(opts, Sink::Callback(cb))?;
        Ok(Endpoint {
            r: EndpointRef {
                bus: self.clone(),
                addr,
            },
            rx: None,
        })
    }

    /// Creates a zero-copy endpoint: each message stays in the peer's
    /// shared buffer until the [`RxBuffer`](super::RxBuffer) is dropped (which gives the
    /// buffer back). Holding many stalls the peer once its buffers run out.
    ///
    /// # Errors
    /// As [`Bus::create`].
    pub fn create_zero_copy(&self, opts: EndpointOptions) -> Result<ZeroCopyEndpoint, BusError> {
        let (tx, rx) = mpsc::channel();
        let addr = self.register(opts, Sink::ZeroCopy(tx))?;
        Ok(ZeroCopyEndpoint {
            r: EndpointRef {
                bus: self.clone(),
                addr,
            },
            rx,
        })
    }

    pub(super) fn register(&self, opts: EndpointOptions, sink: Sink) -> Result<u32, BusError> {
        let announce = opts.announce && self.shared.ns;
        if announce || !opts.name.is_empty() {
            check_name(&opts.name)?;
        }
        let (addr, to_announce) = {
            let mut st = lock(&self.shared.state);
            if let Some(r) = &st.down {
                return Err(BusError::LinkDown(r.clone()));
            }
            let addr = if opts.src == ADDR_ANY {
                let mut a = st.next_addr;
                while st.endpoints.contains_key(&a) || a == NS_ADDR {
                    a = if a >= ADDR_ANY - 1 {
                        RESERVED_ADDRESSES
                    } else {
                        a + 1
                    };
                }
                st.next_addr = if a >= ADDR_ANY - 1 {
                    RESERVED_ADDRESSES
                } else {
                    a + 1
                };
                a
            } else {
                if st.endpoints.contains_key(&opts.src) || opts.src == NS_ADDR {
                    return Err(BusError::AddrInUse { addr: opts.src });
                }
                opts.src
            };
            // Bind at once if the peer already announced this name.
            let mut dst = opts.dst;
            if dst == ADDR_ANY {
                if let Some(c) = st.channels.iter().find(|c| c.name == opts.name) {
                    dst = c.addr;
                }
            }
            debug!(target: "iopath_rpmsg", "{}: endpoint {:?} at {addr}", self.shared.role, opts.name);
            // The name moves into the slot; only an announcement needs it
            // once more.
            let (name, to_announce) = if announce {
                (opts.name.clone(), Some(opts.name))
            } else {
                (opts.name, None)
            };
            st.endpoints.insert(
                addr,
                EptSlot {
                    name,
                    dst,
                    announced: announce,
                    sink,
                },
            );
            (addr, to_announce)
        };
        if let Some(name) = to_announce {
            if let Err(e) = self.announce(&name, addr) {
                lock(&self.shared.state).endpoints.remove(&addr);
                return Err(e);
            }
        }
        Ok(addr)
    }

    pub(super) fn destroy(&self, addr: u32) {
        let slot = lock(&self.shared.state).endpoints.remove(&addr);
        if let Some(slot) = slot {
            if slot.announced {
                self.withdraw(&slot.name, addr);
            }
        }
    }
}
