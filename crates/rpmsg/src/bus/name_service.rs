//! The name service (address 53): what a peer's CREATE and DESTROY do to
//! the channels and the endpoints, and the records our announced
//! endpoints send.

use std::time::Duration;

use tracing::{debug, info};

use super::state::{Delivery, Shared, Sink, State};
use super::{Bus, BusError, Channel, Event};
use crate::wire::{NsMsg, NsOp, ADDR_ANY, NS_ADDR};

pub(super) fn handle_ns(
    shared: &Shared,
    st: &mut State,
    m: NsMsg,
    out: &mut Vec<(u32, Sink, Delivery)>,
) {
    match m.op {
        NsOp::Create => {
            st.stats.ns_create += 1;
            info!(target: "iopath_rpmsg", "{}: peer announced {:?} at {}", shared.role, m.name, m.addr);
            st.channels
                .retain(|c| !(c.name == m.name && c.addr == m.addr));
            st.channels.push(Channel {
                name: m.name.clone(),
                addr: m.addr,
            });
            for slot in st.endpoints.values_mut() {
                if slot.name == m.name && slot.dst == ADDR_ANY {
                    slot.dst = m.addr;
                }
            }
        }
        NsOp::Destroy => {
            st.stats.ns_destroy += 1;
            info!(target: "iopath_rpmsg", "{}: peer destroyed {:?} at {}", shared.role, m.name, m.addr);
            st.channels
                .retain(|c| !(c.name == m.name && c.addr == m.addr));
            for (addr, slot) in st.endpoints.iter_mut() {
                if slot.dst == m.addr {
                    slot.dst = ADDR_ANY;
                    out.push((
                        *addr,
                        slot.sink.clone(),
                        Delivery::Ev(Event::Unbound { addr: m.addr }),
                    ));
                }
            }
        }
    }
}

impl Bus {
    /// Announces local endpoint `addr` as `name` (name-service CREATE).
    ///
    /// # Errors
    /// [`BusError::Name`] for a name the record cannot hold, or as
    /// [`Bus::send_raw`].
    pub(super) fn announce(&self, name: &str, addr: u32) -> Result<(), BusError> {
        let ns = NsMsg {
            name: name.to_owned(),
            addr,
            op: NsOp::Create,
        };
        let rec = ns.encode(self.shared.endian)?;
        self.send_raw(addr, NS_ADDR, &rec, Some(Duration::from_secs(5)))
    }

    /// Withdraws the announcement of local endpoint `addr` (name-service
    /// DESTROY); a record that cannot be sent is only logged: the endpoint
    /// is gone either way.
    pub(super) fn withdraw(&self, name: &str, addr: u32) {
        let ns = NsMsg {
            name: name.to_owned(),
            addr,
            op: NsOp::Destroy,
        };
        if let Ok(rec) = ns.encode(self.shared.endian) {
            if let Err(e) = self.send_raw(addr, NS_ADDR, &rec, Some(Duration::from_secs(1))) {
                debug!(target: "iopath_rpmsg", "name-service destroy of {name:?} not sent: {e}");
            }
        }
    }
}
