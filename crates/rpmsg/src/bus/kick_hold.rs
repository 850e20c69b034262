//! Kicks held back while a batch of sends is published: the peer is
//! notified once for the whole batch, when the last hold goes, instead of
//! (with `EVENT_IDX`, whenever it sleeps) once per message.
//!
//! ```text
//!  hold_kicks ─► send, send, ... (each leaves the kick decision open)
//!  drop ─► the last hold: Link::take_kick once ─► Notifier::kick
//! ```

use std::fmt;
use std::sync::Arc;

use iopath_sys::lock;

use super::state::{kick as kick_peer, Shared};
use super::Bus;

/// While alive, sends on its bus publish their buffers but notify the
/// peer only when the last hold is dropped (see [`Bus::hold_kicks`]).
#[must_use = "the kick is held only while the hold lives"]
pub struct KickHold {
    shared: Arc<Shared>,
}

impl fmt::Debug for KickHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KickHold").finish_non_exhaustive()
    }
}

impl Bus {
    /// Holds the peer's notifications back until the returned hold (and
    /// every other one taken meanwhile) is dropped: a batch of sends then
    /// costs one kick. Sends made meanwhile by other threads wait for the
    /// same release, so a hold is for the span of one batch, not longer.
    pub fn hold_kicks(&self) -> KickHold {
        lock(&self.shared.state).kick_holds += 1;
        KickHold {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Drop for KickHold {
    fn drop(&mut self) {
        let kick = {
            let mut st = lock(&self.shared.state);
            st.kick_holds -= 1;
            st.down.is_none() && st.kick_due()
        };
        if kick {
            // A failed kick marks the link down; a drop has no one to
            // return the error to.
            let _ = kick_peer(&self.shared);
        }
    }
}
