//! The remote's outer loop: accept a host, announce the services, serve
//! them until the session ends, and wait for the next host after the link
//! went down.

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use super::{accept_host, AcceptError, Cleanup, Skipped};
use crate::notify::NotifyListener;
use crate::{AnnounceError, RemoteLink, RemoteServices, SessionEnd, SharedMem, ShmError, Stats};

/// What [`serve_hosts`] needs: where hosts come from, the device they
/// drive, and the services to announce to each.
#[derive(Debug)]
pub struct ServeHosts<'a> {
    /// The notify socket hosts connect to.
    pub listener: &'a NotifyListener,
    /// The shared memory holding the device.
    pub shm: &'a SharedMem,
    /// Give up on a host that has not set DRIVER_OK within this.
    pub ready_timeout: Option<Duration>,
    /// The services announced to each host.
    pub services: &'a RemoteServices,
    /// Serve one host only: its link going down is an error.
    pub once: bool,
    /// Buffer sizes used as given, negotiating nothing
    /// ([`crate::Convention::Fixed`]); `None`: as the table says.
    pub fixed: Option<crate::BufSizes>,
}

/// What happens while a remote serves hosts, in order.
#[derive(Debug)]
pub enum RemoteEvent<'a> {
    /// A connection was passed over; the wait goes on.
    Skipped(Skipped),
    /// A host set DRIVER_OK with these features; the services come next.
    HostReady {
        /// The negotiated feature bits.
        features: u32,
    },
    /// The host destroyed its endpoint `addr` on channel `name` (heard on
    /// the bus's service thread).
    EndpointDestroyed {
        /// The channel's name.
        name: &'a str,
        /// The host's endpoint address.
        addr: u32,
    },
    /// The session ended, before the services are destroyed.
    SessionEnded(&'a SessionEnd),
    /// The bus of the session that ended is stopped.
    Stats {
        /// Messages echoed in the session.
        echoed: u64,
        /// The bus's counters.
        stats: &'a Stats,
    },
    /// The device is reset after the host went away; the next host comes.
    HostGone {
        /// Why the link went down.
        reason: &'a str,
    },
}

/// Why a remote stopped serving hosts.
#[derive(Debug, Error)]
pub enum ServeHostsError {
    /// No host could be accepted.
    #[error(transparent)]
    Accept(AcceptError),
    /// A service could not be announced.
    #[error(transparent)]
    Announce(AnnounceError),
    /// The one host went away (with `once`).
    #[error("The host went away: {reason}")]
    HostGone {
        /// Why the link went down.
        reason: String,
    },
    /// The device could not be reset for the next host.
    #[error("Resetting the device failed")]
    Reset(#[source] ShmError),
}

/// Serves one host after another until a session ends on its own (the
/// host destroyed the channel, the echo limit, the shutdown word): then
/// returns `Ok`. Each bus is registered in `stop` while it runs;
/// `on_event` hears of each step (from the bus's service thread too).
///
/// # Errors
/// [`ServeHostsError`]; [`ServeHostsError::HostGone`] when the link to the
/// host went down and `cfg.once` is set.
pub fn serve_hosts(
    cfg: &ServeHosts<'_>,
    stop: &Cleanup,
    on_event: impl Fn(RemoteEvent<'_>) + Send + Sync + 'static,
) -> Result<(), ServeHostsError> {
    let on_event = Arc::new(on_event);
    loop {
        let bus = accept_host(cfg.listener, cfg.shm, cfg.ready_timeout, cfg.fixed, |s| {
            on_event(RemoteEvent::Skipped(s))
        })
        .map_err(ServeHostsError::Accept)?;
        let end = serve_session(&bus, cfg.services, stop, &on_event)
            .map_err(ServeHostsError::Announce)?;
        let SessionEnd::LinkDown(reason) = end else {
            return Ok(());
        };
        if cfg.once {
            return Err(ServeHostsError::HostGone { reason });
        }
        RemoteLink::reset_device(cfg.shm).map_err(ServeHostsError::Reset)?;
        on_event(RemoteEvent::HostGone { reason: &reason });
    }
}

/// One session on a ready bus, whatever carries it: announces the
/// services, serves them until the session ends, destroys them and stops
/// the bus, telling `on_event` of each step.
///
/// # Errors
/// [`AnnounceError`]; the bus is stopped then too.
pub(super) fn serve_session<F>(
    bus: &crate::Bus,
    services: &RemoteServices,
    stop: &Cleanup,
    on_event: &Arc<F>,
) -> Result<SessionEnd, AnnounceError>
where
    F: Fn(RemoteEvent<'_>) + Send + Sync + 'static,
{
    stop.set_bus(Some(bus.clone()));
    on_event(RemoteEvent::HostReady {
        features: bus.features(),
    });
    let heard = Arc::clone(on_event);
    let session = match services.announce(bus, move |name, addr| {
        heard(RemoteEvent::EndpointDestroyed { name, addr })
    }) {
        Ok(s) => s,
        Err(e) => {
            stop.set_bus(None);
            bus.shutdown();
            return Err(e);
        }
    };
    let end = session.wait();
    on_event(RemoteEvent::SessionEnded(&end));
    let echoed = session.close(&end);
    stop.set_bus(None);
    let stats = bus.stats();
    bus.shutdown();
    on_event(RemoteEvent::Stats {
        echoed,
        stats: &stats,
    });
    Ok(end)
}
