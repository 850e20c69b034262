//! The remote on shared memory: its start-up (the file made or found, the
//! remote's role on it, the notify socket hosts connect to) and its outer
//! loop: accept a host, announce the channels, serve them until the
//! session ends, and wait for the next host after the link went down.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use super::{accept_host, AcceptError, Cleanup, Skipped};
use crate::notify::{NotifyError, NotifyListener, NotifySpec};
use crate::tools::channels::{AnnounceError, RemoteChannels, SessionEnd};
use crate::{RemoteLink, SharedMem, ShmError, ShmLayout, ShmOptions, ShmOwner, ShmRole, Stats};

/// Where a remote on shared memory finds its device and its hosts.
#[derive(Debug, Clone)]
pub struct RemoteShmConfig {
    /// The shared-memory file ([`crate::shm_path`] reads a bare name).
    pub shm: PathBuf,
    /// The mode of a file made here, and whether a file other users can
    /// write is taken.
    pub shm_opts: ShmOptions,
    /// Make (or truncate) the file with this layout and a fresh resource
    /// table; `None`: take the file there, whose table must parse.
    pub create: Option<ShmLayout>,
    /// The notify socket hosts connect to.
    pub notify: NotifySpec,
    /// Its mode, whatever the umask.
    pub notify_mode: u32,
}

/// Why a remote on shared memory could not start. Each variant is one step
/// of [`RemoteShm::start`].
#[derive(Debug, Error)]
pub enum RemoteStartError {
    /// The file could not be made.
    #[error("Creating the shared memory failed")]
    Create(#[source] ShmError),
    /// The file could not be opened.
    #[error("Opening the shared memory failed")]
    Open(#[source] ShmError),
    /// The file holds no resource table that parses.
    #[error("The resource table is refused")]
    Table(#[source] ShmError),
    /// Another remote holds the file, or the remote's role cannot be taken.
    #[error("Shared memory refused")]
    Owner(#[source] ShmError),
    /// The notify socket could not be bound.
    #[error("Binding the notify socket failed")]
    Bind(#[source] NotifyError),
}

/// A remote's shared memory, held in the remote's role, and the notify
/// socket hosts connect to.
#[derive(Debug)]
pub struct RemoteShm {
    /// The shared memory holding the device.
    pub shm: SharedMem,
    /// The notify socket, listening.
    pub listener: NotifyListener,
    /// The remote's role on a file it opened (one it made holds the role
    /// in [`SharedMem`] itself).
    _owner: Option<ShmOwner>,
}

impl RemoteShm {
    /// Makes the file (with `cfg.create`) or opens it, checks its table
    /// and takes the remote's role (a second remote, with or without
    /// `create`, is refused whatever its notify socket), then binds the
    /// notify socket, registered in `stop`. Bound once the table is
    /// written: a host that connects finds it. A file made here is removed
    /// again if the socket cannot be bound.
    ///
    /// # Errors
    /// [`RemoteStartError`], naming the step that failed.
    pub fn start(cfg: &RemoteShmConfig, stop: &Cleanup) -> Result<Self, RemoteStartError> {
        let mut made = None;
        let mut owner = None;
        let shm = match &cfg.create {
            Some(layout) => {
                if !cfg.shm.exists() {
                    made = Some(cfg.shm.clone());
                }
                SharedMem::create_with(&cfg.shm, layout, &cfg.shm_opts)
                    .map_err(RemoteStartError::Create)?
            }
            None => {
                let shm = SharedMem::open_with(&cfg.shm, &cfg.shm_opts)
                    .map_err(RemoteStartError::Open)?;
                shm.table(0).map_err(RemoteStartError::Table)?;
                let o = ShmOwner::claim(&cfg.shm, ShmRole::Remote)
                    .and_then(|o| o.attach().map(|()| o))
                    .map_err(RemoteStartError::Owner)?;
                owner = Some(o);
                shm
            }
        };
        let listener = match cfg.notify.bind_with_mode(cfg.notify_mode) {
            Ok(l) => l,
            Err(e) => {
                if let Some(p) = made {
                    drop(shm);
                    let _ = std::fs::remove_file(p);
                }
                return Err(RemoteStartError::Bind(e));
            }
        };
        if let Some(p) = listener.path() {
            stop.add_file(p);
        }
        Ok(RemoteShm {
            shm,
            listener,
            _owner: owner,
        })
    }
}

/// What [`serve_hosts`] needs: where hosts come from, the device they
/// drive, and the channels to announce to each.
#[derive(Debug)]
pub struct ServeHosts<'a> {
    /// The notify socket hosts connect to.
    pub listener: &'a NotifyListener,
    /// The shared memory holding the device.
    pub shm: &'a SharedMem,
    /// Give up on a host that has not set DRIVER_OK within this.
    pub ready_timeout: Option<Duration>,
    /// The channels announced to each host.
    pub channels: &'a RemoteChannels,
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
    /// A host set DRIVER_OK with these features; the channels come next.
    HostReady {
        /// The negotiated feature bits.
        features: u32,
    },
    /// The host destroyed its endpoint `addr` on channel `name` (heard on
    /// the bus thread).
    EndpointDestroyed {
        /// The channel's name.
        name: &'a str,
        /// The host's endpoint address.
        addr: u32,
    },
    /// The session ended, before the channels are destroyed.
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

/// What happened, in words: `host ready (features NS, EVENT_IDX)`, `host
/// gone (REASON)`, the bus's counters, ...
impl std::fmt::Display for RemoteEvent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoteEvent::Skipped(s) => write!(f, "{s}"),
            RemoteEvent::HostReady { features } => {
                write!(
                    f,
                    "host ready (features {})",
                    super::feature_names(*features)
                )
            }
            RemoteEvent::EndpointDestroyed { name, addr } => {
                write!(f, "host destroyed its endpoint {addr} on {name:?}")
            }
            RemoteEvent::SessionEnded(end) => write!(f, "{end}"),
            RemoteEvent::Stats { stats, .. } => write!(f, "{stats}"),
            RemoteEvent::HostGone { reason } => write!(f, "host gone ({reason})"),
        }
    }
}

/// Why a remote stopped serving hosts.
#[derive(Debug, Error)]
pub enum ServeHostsError {
    /// No host could be accepted.
    #[error(transparent)]
    Accept(AcceptError),
    /// A channel could not be announced.
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
/// `on_event` hears of each step (from the bus thread too).
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
        let end = serve_session(&bus, cfg.channels, stop, &on_event)
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
/// channels, serves them until the session ends, destroys them and stops
/// the bus, telling `on_event` of each step.
///
/// # Errors
/// [`AnnounceError`]; the bus is stopped then too.
pub(super) fn serve_session<F>(
    bus: &crate::Bus,
    channels: &RemoteChannels,
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
    let session = match channels.announce(bus, move |name, addr| {
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
